"""ncu helpers the bottleneck and instruction-level rules share: one wide row per profiled
launch, per-kernel aggregation, NVIDIA's SOL classification, the busiest memory unit and
device peaks."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import numpy as np

from ..devices import gpu

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

# -- ncu metrics, one wide row per launch ---------------------------------------------

SM_SOL = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM_SOL = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
ACHIEVED = "sm__warps_active.avg.pct_of_peak_sustained_active"  # achieved occupancy, % of peak warps
# The column of a launch's duration in `ncu_launches`: the kernel_durations view's, which for
# ncu is this metric.
DURATION = "gpu__time_duration.sum"
# The busiest memory unit behind the memory SOL (NVIDIA names it by the breakdown metric).
MEMORY_UNITS = {
    "DRAM": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
             "dram__throughput.avg.pct_of_peak_sustained_elapsed",
             "fbpa__throughput.avg.pct_of_peak_sustained_elapsed"),
    "L2": ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
    "L1/TEX": ("l1tex__throughput.avg.pct_of_peak_sustained_active",),
}


def ncu_launches(store, run_id: str, metric_ids=(), pattern: str | None = None) -> pd.DataFrame:
    """One row per profiled launch: kernel_id, device_id, name, short_name, library, its duration (column
    `DURATION`, from the kernel_durations view) and one float column per other metric id asked
    for (exact ids, or ids matching the regex `pattern`) that the run has. A row without a metric_id is matched by its Metric Name: ids without "__" (Source Counters'
    `memory_l2_theoretical_sectors_global`) are not recognized as ids by the reader."""
    long = store.sql(
        """SELECT kernel_id, metric_id, max(value) AS value
           FROM (SELECT kernel_id, coalesce(metric_id, metric_name) AS metric_id, value FROM kernel_metrics
                 WHERE run_id = $run_id AND value IS NOT NULL)
           WHERE list_contains($ids, metric_id) OR ($pattern <> '' AND regexp_matches(metric_id, $pattern))
           GROUP BY ALL""",
        {"run_id": run_id, "ids": list(metric_ids) or [""], "pattern": pattern or ""}).df()
    kernels = store.sql(
        "SELECT kernel_id, device_id, coalesce(name, '?') AS name, coalesce(short_name, name, '?') AS short_name, "
        f"library, duration_ns AS \"{DURATION}\" FROM kernel_durations WHERE run_id = $run_id", {"run_id": run_id}).df()
    if long.empty:
        return kernels.iloc[0:0]
    wide = long.pivot_table(index="kernel_id", columns="metric_id", values="value", aggfunc="max")
    wide.columns.name = None
    wide = wide.drop(columns=[DURATION], errors="ignore")  # the kernels' own column holds it
    out = kernels.merge(wide.reset_index(), on="kernel_id", how="inner")
    out["device_id"] = out["device_id"].astype("float64")
    return out


def col(df: pd.DataFrame, *candidates: str) -> pd.Series:
    """The first non-null of the candidate columns present, per row (NaN when none)."""
    import pandas as pd

    out = pd.Series(np.nan, index=df.index, dtype="float64")
    for c in candidates:
        if c in df.columns:
            out = out.fillna(df[c].astype("float64"))
    return out


def per_kernel(df: pd.DataFrame, sums=(), means=(), weight: str | None = None, firsts=()) -> pd.DataFrame:
    """Launches of one kernel (device, name) folded into one row.

    Counters in `sums` are added up (NaN when no launch has them); rates and percentages in
    `means` are averaged, weighted by `weight` (e.g. duration) where it is known and equal
    otherwise; `firsts` are taken from the first launch. Adds launches, first_id, duration_ns (sum)
    and time_share (of all profiled time)."""
    import pandas as pd

    d = df.copy()
    d["_dev"] = d["device_id"].fillna(-1)
    d["_dur"] = d[DURATION] if DURATION in d.columns else np.nan
    w = d[weight].where(d[weight] > 0) if weight and weight in d.columns else pd.Series(np.nan, index=d.index)
    d["_w"] = w.fillna(1.0) if w.isna().all() else w.fillna(w.mean())
    keys = ["_dev", "name"]
    g = d.groupby(keys, sort=False)
    out = g.agg(device_id=("device_id", "first"), short_name=("short_name", "first"), library=("library", "first"),
                first_id=("kernel_id", "min"), launches=("kernel_id", "count"))
    out["duration_ns"] = g["_dur"].sum(min_count=1)
    for c in firsts:
        out[c] = g[c].first() if c in d.columns else None
    for c in sums:
        out[c] = g[c].sum(min_count=1) if c in d.columns else np.nan
    for c in means:
        if c not in d.columns:
            out[c] = np.nan
            continue
        known = d[c].notna()
        num = (d[c].where(known, 0) * d["_w"]).groupby([d[k] for k in keys]).sum()
        den = d["_w"].where(known, 0).groupby([d[k] for k in keys]).sum()
        out[c] = (num / den.where(den > 0)).reindex(out.index)
    total = out["duration_ns"].sum(min_count=1)
    out["time_share"] = out["duration_ns"] / total if total and total > 0 else np.nan
    return out.reset_index().drop(columns=["_dev"])


def keep_hot(g: pd.DataFrame, min_time_share: float) -> pd.DataFrame:
    """Kernels at or above `min_time_share` of profiled time (all of them when durations are unknown)."""
    return g[g["time_share"].isna() | (g["time_share"] >= min_time_share)]


def classify(compute_pct: pd.Series, memory_pct: pd.Series, p: dict) -> pd.Series:
    """NVIDIA's SOLBottleneck verdict from compute and memory % of peak: `compute`/`memory`
    (one at or over `throughput_bound_pct`, or over `latency_bound_pct` and `balanced_pct` points
    ahead of the other), `balanced` (both over the latency line, close together) or `latency`."""
    import pandas as pd

    c, m = compute_pct.fillna(0), memory_pct.fillna(0)
    hi = np.maximum(c, m)
    return pd.Series(np.select(
        [hi >= p["throughput_bound_pct"], hi < p["latency_bound_pct"], (c - m).abs() >= p["balanced_pct"]],
        [np.where(c >= m, "compute", "memory"), "latency", np.where(c >= m, "compute", "memory")],
        "balanced"), index=compute_pct.index)


def busiest_memory_unit(df: pd.DataFrame) -> pd.Series:
    import pandas as pd

    units = pd.DataFrame({u: col(df, *ids) for u, ids in MEMORY_UNITS.items()})
    has = units.notna().any(axis=1)
    return units.fillna(-1).idxmax(axis=1).where(has)


def jsonable(v):
    """NaN -> None, numpy scalars -> Python, for evidence dicts."""
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v != v:
        return None
    return v


def as_int(x):
    return None if x is None or x != x else int(round(x))


# -- device peaks -----------------------------------------------------------------------

# FP32 lanes (results per clock per SM) by compute capability: CUDA C++ Programming Guide,
# "Arithmetic Instructions" throughput table (32-bit floating-point add, multiply, multiply-add).
FP32_LANES_PER_SM = {(6, 0): 64, (6, 1): 128, (6, 2): 128, (7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64,
                     (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}


def has_metrics(*id_groups) -> str:
    """A rule's applies check: the run has a value for at least one metric of each group."""
    return "SELECT " + " AND ".join(metrics_exist(ids) for ids in id_groups)


def metrics_exist(ids) -> str:
    """SQL condition: the run has a value for at least one of the metric ids."""
    return (f"EXISTS (SELECT 1 FROM kernel_metrics WHERE run_id = $run_id AND value IS NOT NULL "
            f"AND metric_id IN ({', '.join(_sql_text(m) for m in ids)}))")


def rule_results_exist(rule_name: str) -> str:
    """SQL condition: the run stores NVIDIA's results of this rule (kernel_rule_results)."""
    return (f"EXISTS (SELECT 1 FROM kernel_rule_results WHERE run_id = $run_id "
            f"AND rule_name = {_sql_text(rule_name)})")


def _sql_text(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def kernel_finding(r, evidence: dict, **fields) -> dict:
    """A finding row on the kernel group `r` (its device, first launch and full name), with
    `fields` (value, message, hint, ...) and `evidence` as sorted JSON."""
    return {"device_id": as_int(r["device_id"]), "item_kind": "kernel", "item_id": int(r["first_id"]),
            "item_name": r["name"], **fields, "evidence": json.dumps(jsonable(evidence), sort_keys=True)}


def device_peaks(store, run_id: str) -> pd.DataFrame:
    """Per device: DRAM bandwidth and FLOP/s peaks (fp32, fp64, half, tensor) with their sources.

    Order: the devices table (trace values; gaps filled from the product table by name) for
    bandwidth; the product table by name for FLOP/s (vendor dense peaks at boost clock); else
    FP32 = SMs x FP32 lanes per SM (by CC) x 2 x SM clock when the trace has all three.
    Half (non-tensor) is assumed 2 x FP32 (packed half2)."""
    import pandas as pd

    dev = store.sql("SELECT * FROM devices WHERE run_id = $run_id", {"run_id": run_id}).df()
    rows = []
    for d in dev.to_dict("records"):
        prod = gpu.product(d.get("name"))
        r = {"device_id": float(d["device_id"]), "device_name": d.get("name"),
             "bw": d.get("memory_bandwidth_bytes_per_s"), "bw_source": None,
             "fp32": None, "fp64": None, "tensor": None, "tensor_bf16": None, "flops_source": None}
        if r["bw"] is not None and r["bw"] == r["bw"]:
            from_table = prod is not None and math.isclose(r["bw"], prod.dram_bandwidth_bytes_per_s)
            r["bw_source"] = f"product table: {prod.name} ({prod.source})" if from_table else "trace"
        else:
            r["bw"] = None
        if prod is not None and prod.fp32_flops_per_s:
            r.update(fp32=prod.fp32_flops_per_s, fp64=prod.fp64_flops_per_s, tensor=prod.fp16_tensor_flops_per_s,
                     tensor_bf16=prod.bf16_tensor_flops_per_s or prod.fp16_tensor_flops_per_s,
                     flops_source=f"product table: {prod.name} [{prod.confidence}] ({prod.source})")
        else:
            lanes = FP32_LANES_PER_SM.get((as_int(d.get("compute_major")), as_int(d.get("compute_minor"))))
            sms, clock = d.get("sm_count"), d.get("clock_hz")
            if lanes and sms == sms and sms and clock == clock and clock:
                r["fp32"] = float(sms) * lanes * 2 * float(clock)
                r["flops_source"] = f"{int(sms)} SMs x {lanes} FP32 lanes x 2 x {float(clock) / 1e9:.3g} GHz"
        r["half"] = None if r["fp32"] is None else 2 * r["fp32"]
        rows.append(r)
    cols = ["device_id", "device_name", "bw", "bw_source", "fp32", "fp64", "half", "tensor", "tensor_bf16",
            "flops_source"]
    return pd.DataFrame(rows, columns=cols).astype({c: "float64" for c in
                                                    ("device_id", "bw", "fp32", "fp64", "half", "tensor", "tensor_bf16")})
