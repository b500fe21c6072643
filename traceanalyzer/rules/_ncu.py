"""ncu helpers the bottleneck and instruction-level rules share: one wide row per profiled
launch, per-kernel aggregation, NVIDIA's SOL classification, the busiest memory unit and
device peaks."""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING

import numpy as np

from ..devices import gpu
from ..sql import sql_literal
from ..store import run_cache

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
    """NVIDIA's SOLBottleneck verdict from compute and memory % of peak: `latency` (both under
    `latency_bound_pct` and `throughput_bound_pct`), else `compute`/`memory` (one `balanced_pct`
    points ahead of the other) or `balanced` (close together). Where one is at or over
    `throughput_bound_pct` NVIDIA says "High Throughput" without a side: the higher one is the
    bound unless the two are close, when both are busy (a naive GEMM's 83% compute is L1's load
    instructions, with memory at 83% too)."""
    import pandas as pd

    c, m = compute_pct.fillna(0), memory_pct.fillna(0)
    hi = np.maximum(c, m)
    return pd.Series(np.select(
        [(hi < p["latency_bound_pct"]) & (hi < p["throughput_bound_pct"]), (c - m).abs() >= p["balanced_pct"]],
        ["latency", np.where(c >= m, "compute", "memory")],
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
            f"AND metric_id IN ({', '.join(sql_literal(m) for m in ids)}))")


def rule_results_exist(rule_name: str) -> str:
    """SQL condition: the run stores NVIDIA's results of this rule (kernel_rule_results)."""
    return (f"EXISTS (SELECT 1 FROM kernel_rule_results WHERE run_id = $run_id "
            f"AND rule_name = {sql_literal(rule_name)})")


# NVIDIA's MemoryCacheAccessPattern message at L1TEX ("The memory access pattern for global loads
# from L1TEX might not be optimal. On average, only 26.4 of the 32 bytes transmitted per sector are
# utilized by each thread."): bytes used per sector, for reports without the metric.
_SECTOR_USE_TEXT = re.compile(r"global (load|store)s (?:from|to) L1TEX might not be optimal\. On average, only "
                              r"([\d.]+) of the ([\d.]+) bytes transmitted per sector are utilized")
_SECTOR_USE_OP = {"load": "ld", "store": "st"}


def sector_use_metric(op: str) -> tuple[str, str]:
    """The metrics of bytes used per sector of global `op` ("ld", "st") and their ceiling (32): the
    full section set's form of `smsp__sass_average_data_bytes_per_sector_mem_global_op_*.pct`."""
    base = f"smsp__sass_average_data_bytes_per_sector_mem_global_op_{op}"
    return f"{base}.ratio", f"{base}.max_rate"


def sector_use_from_messages(store, run_id: str) -> pd.DataFrame:
    """Per launch (kernel_id), bytes used per sector and the sector size that NVIDIA's
    MemoryCacheAccessPattern messages quote for global loads and stores, under the metric ids
    `sector_use_metric` names; no rows when the run has none."""
    import pandas as pd

    rr = store.sql("""SELECT kernel_id, description FROM kernel_rule_results
                      WHERE run_id = $run_id AND rule_name = 'MemoryCacheAccessPattern'""", {"run_id": run_id}).df()
    rows: dict[int, dict[str, float]] = {}
    for kernel_id, text in zip(rr["kernel_id"], rr["description"]):
        m = _SECTOR_USE_TEXT.search(" ".join(str(text).split()))
        if m is not None:
            used, ceiling = sector_use_metric(_SECTOR_USE_OP[m.group(1)])
            rows.setdefault(int(kernel_id), {}).update({used: float(m.group(2)), ceiling: float(m.group(3))})
    return pd.DataFrame([{"kernel_id": k, **v} for k, v in rows.items()])


def fill_missing(df: pd.DataFrame, extra: pd.DataFrame, key: str = "kernel_id") -> pd.DataFrame:
    """`df` with the cells it lacks taken from `extra` (same key, same column names); its own
    values first."""
    if df.empty or extra.empty:
        return df
    out = df.merge(extra, on=key, how="left", suffixes=("", "_extra"))
    for c in extra.columns.drop(key):
        if c + "_extra" in out.columns:
            out[c] = out[c].fillna(out.pop(c + "_extra"))
    return out


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


# -- on a timeline run linked to an Nsight Compute run --------------------------------------

# The ncu metrics of a run's launches, long form (kernel_id, metric_id, value): its own, and on a
# timeline run those of the ncu launches linked to its kernels (`kernel_links`), under the id of
# the timeline launch each is. The launch groups (`_launches.py`) read them, so B001, B002 and
# T005 see ncu's measured occupancy on a linked timeline.
RUN_METRICS_SQL = """(
    SELECT kernel_id, metric_id, value FROM kernel_metrics WHERE run_id = $run_id
    UNION ALL
    SELECT l.kernel_id, m.metric_id, m.value FROM kernel_links l
    JOIN kernel_metrics m ON m.run_id = l.ncu_run_id AND m.kernel_id = l.ncu_kernel_id
    WHERE l.run_id = $run_id AND l.side = 'both' AND l.kernel_id IS NOT NULL
)"""

# Thresholds that choose a rule's hot kernels by their share of profiled time. On a linked
# timeline the share that counts is the timeline's: the rule runs on the ncu run without them,
# and they are applied to its findings afterwards.
_HOT_THRESHOLDS = {"min_time_share": 0.0, "warning_time_share": 0.0, "max_kernels_count": 1_000_000}

LINKED_HOW = (
    "On a timeline run (nsys, Kineto) linked to an Nsight Compute run (`traceanalyzer link`, or `check`/`scan` "
    "given both): the rule runs on the ncu run and each finding is moved to the timeline kernel its launches "
    "matched (`kernel_links`): it names that kernel and, where the timeline has them, the operator or range that "
    "launched it; `evidence.kernel_time_ns` is the time of the kernel's matched launch configurations in the "
    "timeline, `kernel_share` its share of the timeline's kernel time, and the estimated loss is the ncu "
    "finding's share of its kernel's profiled time (`loss_share`, over every launch ncu profiled of the "
    "kernel, configurations the timeline lacks included) applied to `kernel_time_ns`. The rule applies when it "
    "applies to any linked ncu run. "
    "`min_time_share`, `warning_time_share` and `max_kernels_count`, where the rule has them, apply to the "
    "timeline's shares. Kernels ncu profiled that the timeline lacks are left out (see the link).")


def linked(rule, *, project: bool = True):
    """`rule` (an ncu-based rule) also on a timeline run linked to an ncu run.

    `project`: the rule reads ncu runs only; on a linked timeline it runs on each linked ncu run
    and its findings are moved to the timeline's kernels (`LINKED_HOW`), replacing the rule's
    own findings on those kernels (B003's estimate from shapes). Without `project` the rule runs
    on the timeline itself, reading ncu's values through `RUN_METRICS_SQL` (B002), and its kernel
    findings on linked kernels get the timeline facts in their evidence."""
    import dataclasses

    own = rule.evaluate
    own_data = rule.applies_sql

    def evaluate(store, run_id: str, p: dict):
        ncu_runs = linked_ncu_runs(store, run_id)
        if not ncu_runs:
            return own(store, run_id, p)
        if not project:
            return _with_timeline(store, run_id, ncu_runs, own(store, run_id, p))
        import pandas as pd

        moved = [projected(store, run_id, n, own, p) for n in ncu_runs]
        moved = [m for m in moved if m is not None and not m.empty]
        # the rule's own findings too where the timeline carries its data (B003's estimate from shapes)
        mine = own(store, run_id, p) if store.sql(own_data, {"run_id": run_id}).fetchone()[0] else None
        if mine is not None and not mine.empty and moved:
            covered = set().union(*(set(m["item_name"]) for m in moved))
            mine = mine[~((mine["item_kind"] == "kernel") & mine["item_name"].isin(covered))]
        parts = [f for f in (mine, *moved) if f is not None and not f.empty]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    evaluate.linked = True
    if not project:
        return dataclasses.replace(rule, evaluate=evaluate)
    # the rule applies to a timeline when it applies to the timeline itself or to any linked ncu
    # run: its own check, correlated on each of them
    on_ncu = rule.applies_sql.strip().replace("$run_id", "linked_ncu_run.ncu_run_id")
    return dataclasses.replace(
        rule, evaluate=evaluate,
        applies_sql=f"""SELECT coalesce(({rule.applies_sql.strip()}), false) OR coalesce((
            SELECT bool_or(coalesce(({on_ncu}), false))
            FROM (SELECT DISTINCT l.ncu_run_id FROM kernel_links l JOIN runs r ON r.run_id = l.ncu_run_id
                  WHERE l.run_id = $run_id AND l.side = 'both') linked_ncu_run), false)""",
        how=f"{rule.how} {LINKED_HOW}")


def linked_ncu_runs(store, run_id: str) -> list[str]:
    """The ncu runs linked to `run_id` when it is a timeline run (else none); once per rules pass."""
    from ..link import linked_ncu_runs as runs

    return run_cache.memo_for(store.run_cache, run_id, "linked_ncu_runs", lambda: runs(store, run_id))


def linked_rule_ids() -> list[str]:
    """The rules that speak of a linked timeline's kernels: run again on a timeline run once it is linked."""
    from . import all_rules

    return [r.id for r in all_rules() if getattr(r.evaluate, "linked", False)]


_TIMELINE_CONFIGS_SQL = """
SELECT device_id, name, grid_x, grid_y, grid_z, block_x, block_y, block_z,
       count(*) AS launches, sum(end_ns - start_ns) AS ns,
       arg_min(kernel_id, (start_ns, kernel_id)) AS first_id, min(start_ns) AS start_ns,
       arg_min(end_ns, (start_ns, kernel_id)) AS end_ns, arg_min(stream_id, (start_ns, kernel_id)) AS stream_id
FROM kernels WHERE run_id = $run_id AND end_ns >= start_ns AND list_contains($names, name)
GROUP BY ALL
"""


def _timeline_facts(store, run_id: str, ncu_run_id: str):
    """The pair's matched links with each ncu launch's name, device and duration, and the
    timeline's time per matched configuration, and its kernel time in all."""
    links = store.sql(
        """SELECT l.ncu_kernel_id, coalesce(k.name, '?') AS ncu_name, k.device_id AS ncu_device_id,
                  k.duration_ns AS ncu_ns, l.device_id, l.name, l.grid_x, l.grid_y, l.grid_z,
                  l.block_x, l.block_y, l.block_z
           FROM kernel_links l JOIN kernel_durations k ON k.run_id = l.ncu_run_id AND k.kernel_id = l.ncu_kernel_id
           WHERE l.run_id = $run_id AND l.ncu_run_id = $ncu AND l.side = 'both'""",
        {"run_id": run_id, "ncu": ncu_run_id}).df()
    if links.empty:
        return links, links, None, None
    configs = store.sql(_TIMELINE_CONFIGS_SQL, {"run_id": run_id, "names": sorted(set(links["name"]))}).df()
    ncu_ns = store.sql("SELECT coalesce(name, '?') AS ncu_name, device_id AS ncu_device_id, sum(duration_ns) AS ns "
                       "FROM kernel_durations WHERE run_id = $r GROUP BY ALL", {"r": ncu_run_id}).df()
    total = store.sql("SELECT sum(end_ns - start_ns) FROM kernels WHERE run_id = $r AND end_ns >= start_ns",
                      {"r": run_id}).fetchone()[0]
    return links, configs, ncu_ns, total


_DIM_COLUMNS = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]


def _config_key(r) -> tuple:
    return tuple(None if r[c] != r[c] or r[c] is None else int(r[c]) for c in ("device_id", *_DIM_COLUMNS))


def projected(store, run_id: str, ncu_run_id: str, evaluate, p: dict):
    """The findings of `evaluate` on the ncu run `ncu_run_id`, moved to the kernels of the timeline
    run `run_id` they are linked to (see `LINKED_HOW`); None when none is linked."""
    import pandas as pd

    from ..fmt import ns, pct
    from ._code import name_launchers

    # the same for every linked rule of the pass
    links, configs, ncu_ns, total = run_cache.memo_for(store.run_cache, run_id, ("linked_facts", ncu_run_id),
                                                       lambda: _timeline_facts(store, run_id, ncu_run_id))
    if links.empty:
        return None
    found = evaluate(store, ncu_run_id, {**p, **{k: v for k, v in _HOT_THRESHOLDS.items() if k in p}})
    if found is None or found.empty:
        return None
    by_config = {(r["name"], _config_key(r)): r for r in configs.to_dict("records")}
    profiled = {(r["ncu_name"], _int(r["ncu_device_id"])): r["ns"] for r in ncu_ns.to_dict("records")}
    rows = []
    for f in found.to_dict("records"):
        if f.get("item_kind") != "kernel":
            continue
        device = _int(f.get("device_id"))
        mine = links[(links["ncu_name"] == f["item_name"])
                     & (links["ncu_device_id"].map(_int) == device if device is not None else True)]
        if mine.empty:
            continue  # ncu profiled it, the timeline does not have it: listed in the link
        matched = {(r["name"], _config_key(r)) for r in mine.to_dict("records")}
        times = pd.DataFrame([by_config[k] for k in sorted(matched, key=str) if k in by_config])
        if times.empty:
            continue
        name = times.groupby("name")["ns"].sum().idxmax()  # one ncu name is one timeline kernel
        times = times[times["name"] == name]
        kernel_ns = int(times["ns"].sum())
        first = times.sort_values(["start_ns", "first_id"]).iloc[0]
        share = kernel_ns / total if total else None
        ncu_time = profiled.get((f["item_name"], device))
        rule_loss = f.get("est_loss_ns")
        fraction = (min(1.0, float(rule_loss) / ncu_time)
                    if _known(rule_loss) and _known(ncu_time) and ncu_time > 0 else None)
        loss = None if fraction is None else int(round(fraction * kernel_ns))
        launches = int(times["launches"].sum())
        row = dict(f)
        row.update(device_id=_int(first["device_id"]), stream_id=_int(first["stream_id"]),
                   item_id=int(first["first_id"]), item_name=name, start_ns=int(first["start_ns"]),
                   end_ns=int(first["end_ns"]), est_loss_ns=loss)
        row["message"] = (f"{f['message']}; in the timeline {ns(kernel_ns)} over {launches} launch(es), "
                          f"{pct(share)} of kernel time" + (f", est. {ns(loss)} end to end" if loss else ""))
        row["evidence"] = json.dumps(jsonable({
            **_evidence(f.get("evidence")), "timeline_run_id": run_id, "ncu_run_id": ncu_run_id,
            "ncu_item_id": _int(f.get("item_id")), "ncu_kernel_name": f["item_name"],
            "kernel_time_ns": kernel_ns, "kernel_share": share, "timeline_launches": launches,
            "ncu_time_ns": ncu_time, "loss_share": fraction,
            "ncu_est_loss_ns": rule_loss if _known(rule_loss) else None,
        }), sort_keys=True)
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return None
    shares = out["evidence"].map(lambda e: json.loads(e)["kernel_share"])
    if "min_time_share" in p:
        keep = shares.isna() | (shares >= p["min_time_share"])
        out, shares = out[keep], shares[keep]
    if "warning_time_share" in p:
        cold = (out["severity"] == "warning") & shares.notna() & (shares < p["warning_time_share"])
        out.loc[cold, "severity"] = "info"
    if "max_kernels_count" in p:
        times = out["evidence"].map(lambda e: json.loads(e)["kernel_time_ns"])
        hottest = times.groupby(out["item_name"]).max().nlargest(int(p["max_kernels_count"])).index
        out = out[out["item_name"].isin(hottest)]
    out = out.sort_values("est_loss_ns", ascending=False, na_position="last", kind="stable")
    return name_launchers(store, run_id, out.reset_index(drop=True))


def _with_timeline(store, run_id: str, ncu_runs: list[str], found):
    """A rule's own findings on a linked timeline, those on linked kernels with the timeline facts
    (`timeline_run_id`, `ncu_run_ids`, `kernel_time_ns`, `kernel_share`) in their evidence."""
    if found is None or found.empty or "item_kind" not in found:
        return found
    names = [n for (n,) in store.sql(
        "SELECT DISTINCT name FROM kernel_links WHERE run_id = ? AND side = 'both' AND list_contains(?, ncu_run_id)",
        [run_id, ncu_runs]).fetchall()]
    wanted = sorted(set(found.loc[found["item_kind"] == "kernel", "item_name"]) & set(names))
    if not wanted:
        return found
    times = {(_int(d), n): (t, s) for d, n, t, s in store.sql(
        """SELECT device_id, name, sum(end_ns - start_ns), sum(end_ns - start_ns) / (SELECT sum(end_ns - start_ns)
               FROM kernels WHERE run_id = $r AND end_ns >= start_ns)
           FROM kernels WHERE run_id = $r AND end_ns >= start_ns AND list_contains($n, name) GROUP BY ALL""",
        {"r": run_id, "n": wanted}).fetchall()}
    out = found.copy()
    for i, r in out.iterrows():
        t = times.get((_int(r.get("device_id")), r.get("item_name"))) if r.get("item_kind") == "kernel" else None
        if t is not None:
            out.at[i, "evidence"] = json.dumps(jsonable({
                **_evidence(r.get("evidence")), "timeline_run_id": run_id, "ncu_run_ids": ncu_runs,
                "kernel_time_ns": t[0], "kernel_share": t[1]}), sort_keys=True, default=str)
    return out


def _evidence(e) -> dict:
    if isinstance(e, str):
        return json.loads(e)
    return dict(e) if isinstance(e, dict) else {}


def _known(x) -> bool:
    return x is not None and x == x


def _int(x):
    """A DataFrame cell as an int (None for NULL, NaN, pandas NA)."""
    try:
        return None if x is None or x != x else int(x)
    except TypeError:  # pandas NA
        return None
