"""B003 roofline: is each hot kernel memory-, compute- or latency-bound, and how near its roof?"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Optional

import numpy as np

from ..devices import gpu
from ..fmt import kernel_label, loss_bound, ns, pct
from ._code import HOW as LAUNCHER_HOW, name_launchers
from ._launches import launch_sized
from ._ncu import (DURATION, MEMORY_UNITS, MEM_SOL, SM_SOL, as_int, busiest_memory_unit, classify, col,
                   device_peaks, keep_hot, kernel_finding, linked, ncu_launches, per_kernel)
from ._op_cost import DTYPES, FAMILIES, FORMULAS, op_cost
from .base import UPPER_BOUND, Rule, Threshold
from .evidence import NcuTimedEvidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

# -- FLOPs and DRAM bytes from ncu counters --------------------------------------------

# FLOPs per thread instruction: NVIDIA's roofline sections count fadd + fmul + 2 x ffma; half
# instructions are packed (HADD2/HMUL2/HFMA2), 2 and 4 FLOPs (formats.md 3.2). Peaks use the
# same factor, so the share of the roof does not depend on it.
FP_OPS = {"fp32": {"fadd": 1, "fmul": 1, "ffma": 2}, "fp64": {"dadd": 1, "dmul": 1, "dfma": 2},
          "half": {"hadd": 2, "hmul": 2, "hfma": 4}}
PEAK_OP = {"fp32": ("ffma", 2), "fp64": ("dfma", 2), "half": ("hfma", 4)}
_INST = r"s(?:m|msp)__sass_thread_inst_executed_op_(?:[fdh](?:add|mul|fma))_pred_on\.sum(?:\.per_cycle_elapsed|\.peak_sustained)?"
_TENSOR = r"sm__ops_path_tensor_[a-z0-9_]+\.sum(?:\.peak_sustained)?"
ROOFLINE_PATTERN = rf"^(?:{_INST}|{_TENSOR})$"
ROOFLINE_IDS = (DURATION, "dram__bytes.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
                "dram__bytes.sum.per_second", "dram__bytes.sum.peak_sustained", "dram__cycles_elapsed.avg.per_second",
                "smsp__cycles_elapsed.avg", "smsp__cycles_elapsed.avg.per_second", "sm__cycles_elapsed.avg.per_second",
                "gpc__cycles_elapsed.avg.per_second")


def _op_count(df: pd.DataFrame, op: str, seconds: pd.Series, hz: pd.Series) -> pd.Series:
    total = col(df, f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum",
                f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum")
    per_cycle = col(df, f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum.per_cycle_elapsed")
    cycles = col(df, "smsp__cycles_elapsed.avg").fillna(hz * seconds)
    return total.fillna(per_cycle * cycles)


def _tensor_metrics(columns) -> list[str]:
    """Tensor op counters without double counting: drop a metric when a more general one
    (its id is a prefix) is present (`..._src_fp16.sum` covers `..._src_fp16_dst_fp32.sum`)."""
    found = [c for c in columns if re.fullmatch(r"sm__ops_path_tensor_[a-z0-9_]+\.sum", c)]
    stems = [c[:-4] for c in found]
    return [c for c, s in zip(found, stems) if not any(o != s and s.startswith(o + "_") for o in stems)]


def roofline_inputs(df: pd.DataFrame, peaks: pd.DataFrame) -> pd.DataFrame:
    """Per launch: FLOPs per family, DRAM bytes, and the peaks to compare them with (ncu's own
    peaks at the measured clock when collected, else the device's)."""
    import pandas as pd

    out = pd.DataFrame(index=df.index)
    seconds = col(df, DURATION) / 1e9
    hz = col(df, "smsp__cycles_elapsed.avg.per_second", "sm__cycles_elapsed.avg.per_second",
             "gpc__cycles_elapsed.avg.per_second")
    sm_hz = col(df, "sm__cycles_elapsed.avg.per_second", "gpc__cycles_elapsed.avg.per_second")
    dev = df[["device_id"]].merge(peaks, on="device_id", how="left").set_index(df.index) if not peaks.empty \
        else pd.DataFrame(index=df.index, columns=["bw", "fp32", "fp64", "half", "tensor", "bw_source", "flops_source"])
    for fam, ops in FP_OPS.items():
        counts = pd.DataFrame({op: _op_count(df, op, seconds, hz) * k for op, k in ops.items()})
        out[f"flops_{fam}"] = counts.sum(axis=1, min_count=1)  # n/a ops count as none, all n/a as unknown
        op, k = PEAK_OP[fam]
        ncu_peak = col(df, f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum.peak_sustained") * k * sm_hz
        out[f"peak_{fam}"] = ncu_peak.fillna(dev[fam].astype("float64"))
        out[f"peak_{fam}_source"] = np.where(ncu_peak.notna(), "ncu peak_sustained x SM clock",
                                             dev["flops_source"].astype(object))
    tensor = _tensor_metrics(df.columns)
    out["flops_tensor"] = df[tensor].sum(axis=1, min_count=1) if tensor else np.nan
    tpeak = df[[c + ".peak_sustained" for c in tensor if c + ".peak_sustained" in df.columns]]
    ncu_tpeak = tpeak.max(axis=1) * sm_hz if not tpeak.empty else pd.Series(np.nan, index=df.index)
    out["peak_tensor"] = ncu_tpeak.fillna(dev["tensor"].astype("float64"))
    out["peak_tensor_source"] = np.where(ncu_tpeak.notna(), "ncu peak_sustained x SM clock",
                                         dev["flops_source"].astype(object))
    read_write = col(df, "dram__bytes_read.sum") + col(df, "dram__bytes_write.sum")
    out["dram_bytes"] = col(df, "dram__bytes.sum").fillna(read_write).fillna(
        col(df, "dram__bytes.sum.per_second") * seconds)
    ncu_bw = col(df, "dram__bytes.sum.peak_sustained") * col(df, "dram__cycles_elapsed.avg.per_second")
    out["peak_bw"] = ncu_bw.fillna(dev["bw"].astype("float64"))
    out["peak_bw_source"] = np.where(ncu_bw.notna(), "ncu dram__bytes.sum.peak_sustained x DRAM clock",
                                     dev["bw_source"].astype(object))
    return out


FAMILY_LABEL = {"fp32": "FP32", "fp64": "FP64", "half": "FP16 (non-tensor)", "tensor": "tensor-core"}


def roofline_shares(g: pd.DataFrame) -> pd.DataFrame:
    """compute_pct / memory_pct (% of the roofs) from summed FLOPs and bytes per kernel.
    The compute side is the precision family nearest its own peak."""
    import pandas as pd

    secs = g["duration_ns"] / 1e9
    fam_pct = pd.DataFrame({f: 100 * g[f"flops_{f}"] / secs / g[f"peak_{f}"] for f in FAMILY_LABEL})
    has_flops = fam_pct.notna().any(axis=1)
    g = g.assign(
        roof_family=fam_pct.fillna(-1).idxmax(axis=1).where(has_flops),
        roof_compute_pct=fam_pct.max(axis=1),
        roof_memory_pct=100 * g["dram_bytes"] / secs / g["peak_bw"],
    )
    fam_flops = pd.Series([g.at[i, f"flops_{f}"] if f == f else np.nan for i, f in g["roof_family"].items()],
                          index=g.index, dtype="float64")
    fam_peak = pd.Series([g.at[i, f"peak_{f}"] if f == f else np.nan for i, f in g["roof_family"].items()],
                         index=g.index, dtype="float64")
    g["intensity"] = fam_flops / g["dram_bytes"].where(g["dram_bytes"] > 0)
    g["ridge"] = fam_peak / g["peak_bw"]
    g["flops"] = fam_flops
    return g


# -- the ncu part of the rule -------------------------------------------------------------

def kernel_roofline(store, run_id: str) -> pd.DataFrame:
    """The roofline analysis of an Nsight Compute run: one row per kernel (launches folded) that has
    Speed-of-Light shares or FLOPs and DRAM bytes, with its `time_share` of profiled time, FLOPs
    and peaks per precision family, `roof_family`, `flops` (of that family), `dram_bytes`,
    `intensity`, `ridge`, and the `source` of its `compute_pct` / `memory_pct` (% of peak):
    "sol" (ncu's Speed of Light) or "roofline" (the counters against the peaks). Rule B003
    classifies the hot ones; the HTML report draws them where B003 did not run."""
    import pandas as pd

    ids = (SM_SOL, MEM_SOL, "launch__waves_per_multiprocessor", *ROOFLINE_IDS,
           *(m for ms in MEMORY_UNITS.values() for m in ms))
    df = ncu_launches(store, run_id, ids, ROOFLINE_PATTERN)
    if df.empty:
        return df
    peaks = device_peaks(store, run_id)
    rf = roofline_inputs(df, peaks)
    df = pd.concat([df, rf], axis=1)
    df["memory_unit_pct"] = pd.DataFrame({u: col(df, *m) for u, m in MEMORY_UNITS.items()}).max(axis=1)
    flops_cols = [f"flops_{f}" for f in FAMILY_LABEL]
    peak_cols = [f"peak_{f}" for f in FAMILY_LABEL] + ["peak_bw"]
    g = per_kernel(df, sums=[*flops_cols, "dram_bytes"],
                   means=[SM_SOL, MEM_SOL, "launch__waves_per_multiprocessor", "memory_unit_pct", *peak_cols,
                          *(m for ms in MEMORY_UNITS.values() for m in ms)],
                   weight=DURATION, firsts=[c for c in rf.columns if c.endswith("_source")])
    g["memory_unit"] = busiest_memory_unit(g)
    g = roofline_shares(g)
    has_sol = g[SM_SOL].notna() & g[MEM_SOL].notna()
    has_roof = g["roof_compute_pct"].notna() & g["roof_memory_pct"].notna()
    g = g[has_sol | has_roof].copy()
    g["source"] = np.where(has_sol[has_sol | has_roof], "sol", "roofline")
    g["compute_pct"] = np.where(g["source"] == "sol", g[SM_SOL], g["roof_compute_pct"])
    g["memory_pct"] = np.where(g["source"] == "sol", g[MEM_SOL], g["roof_memory_pct"])
    return g


def _ncu_findings(store, run_id: str, p: dict) -> list[dict]:
    g = kernel_roofline(store, run_id)
    if g.empty:
        return []
    g = keep_hot(g, p["min_time_share"])
    if g.empty:
        return []
    g["bound"] = classify(g["compute_pct"], g["memory_pct"], p)
    return [_finding(r, p) for r in g.to_dict("records")]


def _roof_text(r: dict) -> str:
    if r["source"] == "sol":
        unit = f" ({r['memory_unit']} {r['memory_unit_pct']:.0f}%)" if r.get("memory_unit") == r.get("memory_unit") \
            and r.get("memory_unit") else ""
        return f"SOL: compute {r['compute_pct']:.0f}%, memory {r['memory_pct']:.0f}%{unit}{_counters_text(r)}"
    fam = FAMILY_LABEL.get(r.get("roof_family"), "compute")
    ai = r.get("intensity")
    ridge = r.get("ridge")
    side = ""
    if ai == ai and ai is not None and ridge == ridge and ridge is not None:
        side = f"; intensity {ai:.3g} FLOP/B {'<' if ai < ridge else '>='} ridge {ridge:.3g}"
    return f"{fam} {r['compute_pct']:.0f}% of peak, DRAM {r['memory_pct']:.0f}% of peak{side}"


def _counters(r: dict) -> tuple[float, float] | None:
    """The roofline's shares from the FLOP and DRAM byte counters (% of peak), where the report has them."""
    c, m = r.get("roof_compute_pct"), r.get("roof_memory_pct")
    return None if c is None or m is None or c != c or m != m else (c, m)


def _busy_inside(r: dict) -> bool:
    """Speed of Light's busy units are moving data inside the chip: both counter shares are under
    half the busier SOL share (its SM throughput is the busiest pipe, often load/store; its memory
    L1 or L2), so neither arithmetic nor DRAM is what keeps them busy."""
    counters = _counters(r)
    return r["source"] == "sol" and counters is not None and max(counters) < max(r["compute_pct"], r["memory_pct"]) / 2


def _counters_text(r: dict) -> str:
    counters = _counters(r)
    if counters is None:
        return ""
    text = f"; counters: {FAMILY_LABEL.get(r.get('roof_family'), 'compute')} {counters[0]:.0f}% of peak, DRAM {counters[1]:.0f}%"
    return text + (": the busy units move data inside the SM and caches, not arithmetic or DRAM traffic"
                   if _busy_inside(r) else "")


_INSIDE_HINT = ("The units Speed of Light finds busy are not doing arithmetic or reaching DRAM: the kernel "
                "issues too many load/store instructions for its FLOPs. Load each value once and reuse it from "
                "registers or shared memory (tiling), and use wider loads (float4); I001 and I005 say more.")

_HINTS = {
    "memory": "Near the memory roof: only moving fewer bytes helps (fuse with neighbours, lower precision, "
              "reuse data from shared memory or L2); check I002/I003 for wasted traffic.",
    "compute": "Near the compute roof: do less work or cheaper work (tensor cores, lower precision, "
               "algebraic simplification); check pipe utilization in Compute Workload Analysis.",
    "balanced": "Compute and memory are both busy: gains need less work and fewer bytes at once; "
                "look at the hottest pipe and the memory unit named in the evidence.",
    "latency": "Far from both roofs: the kernel waits rather than works. See B004 for whether occupancy, "
               "grid size or stalls limit it (I001 for the stall reasons).",
}


def _finding(r: dict, p: dict) -> dict:
    share = max(r["compute_pct"], r["memory_pct"]) / 100
    bound = r["bound"]
    small_grid = bound == "latency" and r.get("launch__waves_per_multiprocessor", np.nan) < 1
    below = "" if share >= p["throughput_bound_pct"] / 100 else ", below saturation"
    what = {"memory": f"memory-bound{below}", "compute": f"compute-bound{below}",
            "balanced": "balanced (compute and memory both busy)",
            "latency": "latency-bound" + (" (grid under one wave)" if small_grid else "")}[bound]
    roof = {"memory": "memory roof", "compute": "compute roof", "balanced": "roofs",
            "latency": "nearest roof"}[bound]
    target = p["throughput_bound_pct"] / 100
    loss = None
    launches = int(r["launches"])
    # a launch of a few microseconds is mostly the fixed cost of starting a kernel, which no roof
    # measures: nearer the roof it would not be much shorter
    short = launch_sized(r["duration_ns"], launches, p["launch_cost_ns"]) if bound == "latency" else None
    if bound == "latency" and r["duration_ns"] == r["duration_ns"] and not short:
        loss = round(r["duration_ns"] * (1 - share / target))  # time saved at the same work near the roof
    hot = r["time_share"] != r["time_share"] or r["time_share"] >= p["warning_time_share"]
    severity = "warning" if bound == "latency" and hot and not short else "info"
    msg = (f"{kernel_label(r['name'], r['short_name'])}: {what}, at {pct(share)} of the {roof} ({_roof_text(r)})"
           + (f"; {launches} launches, {ns(r['duration_ns'])}" if launches > 1 else
              f"; {ns(r['duration_ns'])}" if r["duration_ns"] == r["duration_ns"] else "")
           + (f", est. {ns(loss)} to gain; {loss_bound(r['duration_ns'], 'the kernel ran')}" if loss else "")
           + (f"; {short} (no loss estimated)" if short else ""))
    evidence = {
        "bound": bound, "saturated": share >= p["throughput_bound_pct"] / 100, "source": r["source"], "estimate": False, "compute_pct": r["compute_pct"],
        "memory_pct": r["memory_pct"], "launches": launches, "duration_ns": r["duration_ns"],
        "time_share": r["time_share"],
    }
    for k in ("memory_unit", "memory_unit_pct", "launch__waves_per_multiprocessor", "roof_family", "flops",
              "dram_bytes", "intensity", "ridge", "roof_compute_pct", "roof_memory_pct", "peak_bw", "peak_bw_source"):
        if k in r:
            evidence[k.replace("launch__waves_per_multiprocessor", "waves")] = r[k]
    fam = r.get("roof_family")
    if fam == fam and fam:
        evidence["peak_flops"] = r.get(f"peak_{fam}")
        evidence["peak_flops_source"] = r.get(f"peak_{fam}_source")
    return kernel_finding(
        r, evidence,
        start_ns=as_int(r.get("start_ns")), end_ns=as_int(r.get("end_ns")),
        value=share, value_unit="share",
        threshold=p["latency_bound_pct"] / 100 if bound == "latency" else target,
        est_loss_ns=loss, severity=severity, message=msg,
        hint=_INSIDE_HINT if _busy_inside(r) else _HINTS[bound],
    )


# -- the Kineto estimate: FLOPs and bytes from operator shapes (formulas: _op_cost) --------------

# The calls of the operators _op_cost models, each with the kernels that carry its External id:
# a kernel counts once, under the innermost operator open when it was launched. An operator that
# encloses another one of them with kernels (on its thread, within its span) is a wrapper and is
# left out. Calls are grouped by shape (the few distinct shapes are parsed in Python, not the
# many calls), in order of each group's earliest call.
_CALLS_SQL = f"""
WITH ops AS (
    SELECT op_id, name, pid, tid, start_ns, end_ns, input_dims, input_types, concrete_inputs, external_id
    FROM cpu_ops WHERE run_id = $run_id AND name IN {tuple(FAMILIES)} AND external_id IS NOT NULL
), calls AS (
    SELECT o.op_id, any_value(o.name) AS op, any_value(o.pid) AS pid, any_value(o.tid) AS tid,
           any_value(o.start_ns) AS op_start_ns, any_value(o.end_ns) AS op_end_ns,
           any_value(o.input_dims) AS input_dims, any_value(o.input_types) AS input_types,
           any_value(o.concrete_inputs) AS concrete_inputs,
           count(*) AS kernels, sum(k.end_ns - k.start_ns) AS duration_ns,
           min(k.start_ns) AS start_ns, max(k.end_ns) AS end_ns, any_value(k.device_id) AS device_id,
           min(k.kernel_id) AS first_kernel_id,
           arg_max(k.name, (k.end_ns - k.start_ns, -k.kernel_id)) AS kernel,
           arg_max(k.short_name, (k.end_ns - k.start_ns, -k.kernel_id)) AS short_name,
           max(CAST(k.grid_x AS BIGINT) * coalesce(k.grid_y, 1) * coalesce(k.grid_z, 1)) AS max_blocks,
           -- Kineto writes 0 where CUPTI's calculator failed (over 48 KB of shared memory): unknown
           avg(nullif(k.est_achieved_occupancy_pct, 0)) AS occupancy_pct,
           bool_or(regexp_matches(k.name, 'tf32|xf32', 'i')) AS tf32
    FROM ops o JOIN kernels k ON k.run_id = $run_id AND k.external_id = o.external_id
    WHERE k.start_ns IS NOT NULL AND k.end_ns > k.start_ns
    GROUP BY o.op_id
), innermost AS (
    -- operators on one thread nest: a call encloses another iff the next call on its thread (by
    -- start, the outer first on a tie) starts before it ends. A window, not an interval join.
    SELECT * FROM (
        SELECT *, lead(op_start_ns) OVER (PARTITION BY pid, tid ORDER BY op_start_ns, op_end_ns DESC, op_id)
                  AS next_start_ns
        FROM calls)
    WHERE next_start_ns IS NULL OR next_start_ns >= op_end_ns
)
SELECT op, input_dims, input_types, concrete_inputs, device_id, tf32, count(*) AS calls,
       sum(kernels) AS kernels, sum(duration_ns) AS duration_ns, max(max_blocks) AS max_blocks,
       avg(occupancy_pct) AS occupancy_pct,
       -- the earliest call's kernel, ids and times
       arg_min(kernel, (start_ns, op_id)) AS kernel, arg_min(short_name, (start_ns, op_id)) AS short_name,
       arg_min(first_kernel_id, (start_ns, op_id)) AS first_id,
       min(start_ns) AS start_ns, arg_min(end_ns, (start_ns, op_id)) AS end_ns
FROM innermost GROUP BY op, input_dims, input_types, concrete_inputs, device_id, tf32
ORDER BY min(start_ns), arg_min(op_id, (start_ns, op_id))
"""


def _device_roofs(store, run_id: str) -> dict:
    """Per device id: its peaks row (device_peaks), product, SM count and vendor."""
    peaks = device_peaks(store, run_id)
    devices = {d["device_id"]: d for d in store.sql(
        "SELECT device_id, name, vendor, sm_count FROM devices WHERE run_id = $run_id", {"run_id": run_id}).df()
        .to_dict("records")}
    out = {}
    for r in peaks.to_dict("records"):
        d = devices.get(r["device_id"], {})
        vendor = d.get("vendor") if isinstance(d.get("vendor"), str) else gpu.vendor_of(d.get("name"))
        out[r["device_id"]] = {**r, "product": gpu.product(r["device_name"]), "sm_count": d.get("sm_count"),
                               "vendor": vendor}
    return out


def _roof(dev: dict, dtype: str, tf32: bool) -> tuple[str, float | None, str, str | None]:
    """(roof, peak FLOP/s, unit, source) for matrix work on inputs of `dtype`: FP32 inputs run on
    TF32 tensor cores where the kernel's name says so (cuBLAS/cuDNN `tf32`, hipBLASLt `xf32`)."""
    roof = DTYPES[dtype][1]
    if roof == "fp32" and tf32:
        roof = "tf32"
    prod = dev["product"]
    if prod is not None:
        peak, unit, source = prod.matmul_peak(roof)
        return roof, peak, unit, f"product table: {prod.name} [{prod.confidence}] ({source})"
    if roof == "fp32":  # no product: SMs x FP32 lanes x clock, where the trace gives them
        return roof, dev["fp32"], "FP32 CUDA-core", dev["flops_source"]
    return roof, None, roof.upper(), None


def kineto_estimates(store, run_id: str) -> pd.DataFrame:
    """Every (innermost) call of the operators `_op_cost` models, one row per distinct shape and
    device: `op`, `family`, `calls`, `kernels`, `duration_ns` (its kernels' time), launch facts,
    and either the estimate (`flops`, `dram_bytes`, `dtype`, `shape`, `counted`, `roof_family`,
    `peak_flops`, `roof_unit`, `peak_bw` and their sources, all over every call) or the `reason`
    it is not estimated (no formula fits the shapes, or no peak is known for its type)."""
    import pandas as pd

    ops = store.sql(_CALLS_SQL, {"run_id": run_id}).df()
    if ops.empty:
        return ops
    devices = _device_roofs(store, run_id)
    rows = []
    for o in ops.to_dict("records"):
        o["family"] = FAMILIES[o["op"]]
        cost = op_cost(o["op"], o["input_dims"], o["input_types"], o["concrete_inputs"])
        dev = devices.get(float(o["device_id"])) if pd.notna(o["device_id"]) else None
        if isinstance(cost, str):
            o["reason"] = cost
        elif dev is None or dev["bw"] is None or dev["bw"] != dev["bw"]:
            o["reason"] = "no memory bandwidth known for the device"
        else:
            roof, peak, unit, source = _roof(dev, cost.dtype, bool(o["tf32"]))
            if peak is None or peak != peak:
                name = dev["device_name"] if isinstance(dev["device_name"], str) else "the device"
                o["reason"] = f"no {unit} peak known for {name}"
            else:
                n = o["calls"]
                o.update(reason=None, flops=cost.flops * n, dram_bytes=cost.bytes * n, dtype=cost.dtype,
                         shape=cost.shape, counted=cost.counted, roof_family=roof, roof_unit=unit,
                         peak_flops=peak, peak_flops_source=source, peak_bw=dev["bw"],
                         peak_bw_source=dev["bw_source"], sm_count=dev["sm_count"], vendor=dev["vendor"])
        rows.append(o)
    return pd.DataFrame(rows)


def _latency_reasons(r: dict, p: dict) -> list[str]:
    """What the store shows that keeps a call far from its roof, in words (none: no evidence)."""
    reasons = []
    blocks, sms = r["max_blocks"], r["sm_count"]
    # A grid of B blocks keeps at most B of the S SMs busy: a reason when that alone keeps the call
    # under the latency line. ROCm traces give some grids in work-items: no block count to compare.
    if (r["vendor"] != "amd" and blocks == blocks and blocks is not None and sms == sms and sms
            and blocks < sms * p["latency_bound_pct"] / 100):
        reasons.append(f"small grid: at most {int(blocks)} blocks for {int(sms)} SMs")
    occupancy = r["occupancy_pct"]
    if occupancy == occupancy and occupancy is not None and occupancy < p["low_occupancy_pct"]:
        reasons.append(f"low occupancy: Kineto's estimate {occupancy:.0f}%")
    if r["mean_kernel_ns"] < p["short_kernel_ns"]:
        per_call = r["kernels"] / r["calls"]
        reasons.append(f"short kernels: {ns(r['mean_kernel_ns'])} on average"
                       + (f", {per_call:.3g} launches per call" if per_call > 1 else ""))
    return reasons


_KINETO_HINTS = {
    "memory": "On the memory side of the roof: at this intensity only fewer bytes help (fuse it with its "
              "neighbours, lower precision, larger tiles that reuse operands).",
    "compute": "On the compute side of the roof: less or cheaper math helps (lower precision on tensor/matrix "
               "cores, a better-tuned kernel for this shape).",
    "unknown": "The estimate does not fit what ran: profile the kernel with Nsight Compute, which measures its "
               "FLOPs, bytes and bound.",
    "latency": "Far from its roof for a reason the trace shows: give the GPU more work per launch (batch or fuse "
               "the small calls, CUDA graphs or torch.compile for launch overhead, split-K or smaller tiles for "
               "small grids); B001/B002 show the launch configuration.",
}


def _kineto_finding(r: dict, p: dict) -> dict:
    share = max(r["compute_pct"], r["memory_pct"]) / 100
    target = p["throughput_bound_pct"] / 100
    bound, side = r["bound"], r["side"]
    saturated = share >= target and bound != "unknown"
    roof = f"{r['roof_unit']} roof" if side == "compute" else "memory roof"
    if bound == "latency":
        what = f"est. latency-bound ({'; '.join(r['latency_reasons'])})"
    elif bound == "unknown":
        what = (f"est. above the {roof}, which no kernel can be, so not judged: the shapes' work at {r['dtype']} "
                "exceeds the device's peak in the kernels' time (they may run another precision, such as TF32, "
                "or the call may record other shapes than it ran)")
    else:
        what = f"est. {side} side of the roof" + ("" if saturated else ", below saturation")
    # the time saved were the same FLOPs and bytes done at the throughput-bound share of the roof:
    # part of the op's own kernel time
    loss = round(r["duration_ns"] * (1 - share / target)) if bound == "latency" and share < target else None
    hot = r["time_share"] != r["time_share"] or r["time_share"] >= p["warning_time_share"]
    calls = int(r["calls"])
    msg = (f"{kernel_label(r['name'], r['short_name'])}: {what}, at {pct(share)} of the {roof} "
           f"(intensity {r['intensity']:.3g} FLOP/B {'<' if side == 'memory' else '>='} ridge {r['ridge']:.3g}; "
           f"{r['roof_unit']} {r['compute_pct']:.0f}% of peak, DRAM {r['memory_pct']:.0f}% of peak); "
           + (f"{calls} calls, " if calls > 1 else "") + ns(r["duration_ns"])
           + (f", est. {ns(loss)} of that to gain; {loss_bound(r['duration_ns'], 'its kernels ran')}" if loss else ""))
    evidence = {
        "bound": bound, "side": side, "saturated": saturated, "source": "estimate", "estimate": True,
        "latency_reasons": r["latency_reasons"], "launches": int(r["kernels"]),
        "loss_of": "the op's kernel time" if loss else None,
        **{k: r[k] for k in ("compute_pct", "memory_pct", "duration_ns", "time_share", "op", "family", "shape",
                             "dtype", "calls", "kernels", "counted", "roof_family", "roof_unit", "flops",
                             "dram_bytes", "intensity", "ridge", "peak_flops", "peak_flops_source", "peak_bw",
                             "peak_bw_source", "mean_kernel_ns", "max_blocks", "sm_count", "occupancy_pct")},
        "assumptions": "FLOPs from the operator's shapes (formulas in the rule's doc); bytes = each operand read "
                       "and each output written once (a lower bound); time = the kernels the call launched; "
                       "dense vendor peaks at boost clock",
    }
    return kernel_finding(
        r, evidence, start_ns=as_int(r.get("start_ns")), end_ns=as_int(r.get("end_ns")),
        value=share, value_unit="share", threshold=p["latency_bound_pct"] / 100 if bound == "latency" else target,
        est_loss_ns=loss, severity="warning" if bound == "latency" and hot else "info", message=msg,
        hint=_KINETO_HINTS[bound] + ("" if bound == "unknown" else " Estimated from shapes: confirm with Nsight Compute."),
    )


def _kineto_findings(store, run_id: str, p: dict) -> list[dict]:
    est = kineto_estimates(store, run_id)
    if est.empty or "flops" not in est:
        return []
    df = est[est["reason"].isna()]
    total_ns = store.sql("SELECT sum(end_ns - start_ns) FROM kernels WHERE run_id = $run_id AND end_ns > start_ns",
                         {"run_id": run_id}).fetchone()[0]
    firsts = ("family", "counted", "roof_unit", "peak_flops", "peak_flops_source", "peak_bw", "peak_bw_source",
              "sm_count", "vendor")
    g = df.groupby(["op", "shape", "dtype", "roof_family", "device_id"], sort=False).agg(
        name=("kernel", "first"), short_name=("short_name", "first"), first_id=("first_id", "first"),
        start_ns=("start_ns", "first"), end_ns=("end_ns", "first"), calls=("calls", "sum"),
        kernels=("kernels", "sum"), duration_ns=("duration_ns", "sum"), flops=("flops", "sum"),
        dram_bytes=("dram_bytes", "sum"), max_blocks=("max_blocks", "max"), occupancy_pct=("occupancy_pct", "mean"),
        **{c: (c, "first") for c in firsts}).reset_index()
    secs = g["duration_ns"] / 1e9
    g["compute_pct"] = 100 * g["flops"] / secs / g["peak_flops"]
    g["memory_pct"] = 100 * g["dram_bytes"] / secs / g["peak_bw"]
    g["intensity"] = g["flops"] / g["dram_bytes"]
    g["ridge"] = g["peak_flops"] / g["peak_bw"]
    g["side"] = np.where(g["intensity"] < g["ridge"], "memory", "compute")
    g["mean_kernel_ns"] = g["duration_ns"] / g["kernels"]
    g["time_share"] = g["duration_ns"] / total_ns if total_ns else np.nan
    g["launches"] = g["kernels"]
    g["short_name"] = (g["op"] + " " + g["shape"] + " " + g["dtype"].str.replace("c10::", "") + " via "
                       + g["short_name"])
    g = keep_hot(g, p["min_time_share"])
    out = []
    for r in g.to_dict("records"):
        top = max(r["compute_pct"], r["memory_pct"])
        below = top < p["latency_bound_pct"]
        r["latency_reasons"] = _latency_reasons(r, p) if below else []
        # The roofs are the vendor's dense peaks at boost clock: over them, the shapes' FLOPs or
        # bytes cannot have run in the kernels' time, and the estimate says nothing of what ran.
        r["bound"] = "unknown" if top > 100 else "latency" if r["latency_reasons"] else r["side"]
        out.append(_kineto_finding(r, p))
    return out


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    # measured ncu values when the run has them, whatever file they came from; else the estimate
    # from operator shapes
    measured = store.sql(_NCU_APPLIES, {"run_id": run_id}).fetchone()[0]
    rows = _ncu_findings(store, run_id, p) if measured else _kineto_findings(store, run_id, p)
    df = pd.DataFrame(rows)
    if not df.empty:
        df = df.sort_values(["est_loss_ns", "value"], ascending=[False, True], na_position="last", kind="stable")
    return name_launchers(store, run_id, df)


# The ncu metrics the rule reads: Speed Of Light shares, or FLOP counters with DRAM bytes and
# durations.
_NCU_APPLIES = f"""
SELECT (EXISTS (SELECT 1 FROM kernel_metrics WHERE run_id = $run_id AND metric_id = '{SM_SOL}')
        AND EXISTS (SELECT 1 FROM kernel_metrics WHERE run_id = $run_id AND metric_id = '{MEM_SOL}'))
    OR (EXISTS (SELECT 1 FROM kernel_metrics WHERE run_id = $run_id AND value IS NOT NULL
          AND regexp_matches(metric_id, '^s(m|msp)__sass_thread_inst_executed_op_[dfh](add|mul|fma)_pred_on|^sm__ops_path_tensor_'))
        AND EXISTS (SELECT 1 FROM kernel_metrics WHERE run_id = $run_id AND value IS NOT NULL
          AND metric_id IN ('dram__bytes.sum', 'dram__bytes_read.sum', 'dram__bytes.sum.per_second'))
        AND EXISTS (SELECT 1 FROM kernel_metrics WHERE run_id = $run_id AND metric_id = '{DURATION}'))
"""
# What the estimate reads: operator shapes linked to kernels, and the device's bandwidth.
_SHAPES_APPLIES = f"""
SELECT EXISTS (SELECT 1 FROM cpu_ops o JOIN kernels k ON k.run_id = $run_id AND k.external_id = o.external_id
               WHERE o.run_id = $run_id AND o.name IN {tuple(FAMILIES)} AND o.input_dims IS NOT NULL)
    AND EXISTS (SELECT 1 FROM devices WHERE run_id = $run_id AND memory_bandwidth_bytes_per_s IS NOT NULL)
"""
_APPLIES = f"SELECT ({_NCU_APPLIES.strip()}) OR ({_SHAPES_APPLIES.strip()})"

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class B003Evidence(NcuTimedEvidence, kw_only=True, forbid_unknown_fields=True):
    bound: Annotated[str, doc("what the kernel is bound by (memory, compute, balanced, latency; unknown: an "
                              "estimate above the roof, which says nothing of what ran)")]
    compute_pct: Annotated[float, doc("compute throughput, % of peak")]
    dram_bytes: Annotated[Optional[float], doc("bytes moved to and from DRAM")]
    estimate: Annotated[bool, doc("whether (or how) the figures are estimated rather than measured")]
    flops: Annotated[Optional[float], doc("floating-point operations")]
    intensity: Annotated[Optional[float], doc("arithmetic intensity, FLOPs per DRAM byte")]
    launches: Annotated[int, doc("launches")]
    memory_pct: Annotated[float, doc("memory throughput, % of peak")]
    memory_unit: Annotated[Optional[str], doc("the busiest memory unit")] = None
    memory_unit_pct: Annotated[Optional[float], doc("that unit's throughput, % of peak")] = None
    peak_bw: Annotated[Optional[float], doc("peak DRAM bandwidth, bytes per second")]
    peak_bw_source: Annotated[Optional[str], doc("where the peak bandwidth comes from")]
    ridge: Annotated[Optional[float], doc("the roofline's ridge point, FLOPs per byte")]
    roof_compute_pct: Annotated[Optional[float], doc("FLOP/s as % of the compute roof")] = None
    roof_family: Annotated[Optional[str], doc("the compute roof used (fp32, fp64, half, tensor)")]
    roof_memory_pct: Annotated[Optional[float], doc("bandwidth as % of the memory roof")] = None
    saturated: Annotated[bool, doc("whether the busier side is past the throughput-bound threshold")]
    source: Annotated[str, doc("`sol` (Speed-of-Light shares), `roofline` (FLOPs and bytes) or `estimate` (operator shapes)")]
    time_share: Annotated[float, doc("share of the run's kernel time")]
    waves: Annotated[Optional[float], doc("waves of blocks over the SMs")] = None
    peak_flops: Annotated[Optional[float], doc("peak FLOP/s of the roof used")] = None
    peak_flops_source: Annotated[Optional[str], doc("where the peak FLOP/s come from")] = None
    assumptions: Annotated[Optional[str], doc("how FLOPs and bytes were estimated")] = None
    calls: Annotated[Optional[int], doc("calls counted")] = None
    counted: Annotated[Optional[str], doc("what the FLOP count includes")] = None
    dtype: Annotated[Optional[str], doc("the input's data type")] = None
    family: Annotated[Optional[str], doc("the kind of operator (matmul, conv, attention, ...)")] = None
    kernels: Annotated[Optional[float], doc("kernels the operator's calls ran")] = None
    latency_reasons: Annotated[Optional[list[str]], doc("why the operator is far from both roofs")] = None
    loss_of: Annotated[Optional[str], doc("what the loss is part of")] = None
    max_blocks: Annotated[Optional[int], doc("largest grid, in blocks")] = None
    mean_kernel_ns: Annotated[Optional[float], doc("mean kernel time per call")] = None
    occupancy_pct: Annotated[Optional[float], doc("achieved occupancy, %")] = None
    op: Annotated[Optional[str], doc("the operator")] = None
    roof_unit: Annotated[Optional[str], doc("the roof's unit (tensor cores or SIMT)")] = None
    shape: Annotated[Optional[str], doc("input shapes")] = None
    side: Annotated[Optional[str], doc("which side of the ridge the operator is on")] = None
    sm_count: Annotated[Optional[float], doc("SMs on the device")] = None


RULE = linked(Rule(
    id="B003",
    evidence=B003Evidence,
    analysis=kernel_roofline,
    name="roofline",
    title="Roofline: memory-, compute- or latency-bound, and the share of the roof reached",
    phase="bottleneck",
    claims="compute",
    severity="warning",
    max_severity="warning",
    severity_reason=UPPER_BOUND,
    what="Per hot kernel, which roof limits it (memory, compute, both, or neither: latency-bound) and what "
         "share of that roof it reaches. From Nsight Compute Speed Of Light percentages, or from FLOP and "
         "DRAM-byte counters against the device's peaks; for PyTorch traces, an estimate for GEMM-like "
         "operators, attention and convolutions from their recorded shapes, against the peak of their "
         "inputs' type.",
    why="A kernel at 90% of the memory roof can only get faster by moving fewer bytes; one at 20% of both "
        "roofs is waiting, not working, and tuning its math or its memory traffic will not help. Knowing "
        "which case applies decides what to try next.",
    how="Launches of one kernel are folded together (counters summed, percentages weighted by duration). "
        "Compute and memory are each given as % of peak: with ncu's Speed Of Light section, "
        "`sm__throughput` and `gpu__compute_memory_throughput` (memory includes L1 and L2, and the busiest "
        "unit is named); otherwise FLOPs (fadd + fmul + 2 x ffma, likewise FP64; half counted packed, 2/2/4; "
        "`sm__ops_path_tensor_*` ops) and DRAM bytes (`dram__bytes.sum`, read + write, or rate x duration) "
        "over the duration, against ncu's own `peak_sustained` x clock when collected (the clock ncu locked), "
        "else the device's peaks (trace values, then the product table by name, then SMs x FP32 lanes x "
        "clock). The compute side is the precision family nearest its peak; intensity and ridge point are in "
        "the evidence. With Speed Of Light, the counters' shares are given beside it where the report has them "
        "(`roof_compute_pct`, `roof_memory_pct`); both under half the busier SOL share means the busy units "
        "move data inside the SM and caches (SM throughput is its busiest pipe, often load/store), which the "
        "message and hint say. NVIDIA's SOLBottleneck thresholds classify: both < `latency_bound_pct` (and "
        "`throughput_bound_pct`) -> latency-bound; else bound by the higher side, unless the two are within "
        "`balanced_pct` points (balanced: both busy), at or over `throughput_bound_pct` too, where NVIDIA "
        "says \"High Throughput\" and names no side. The share reported is the higher side. Estimated "
        "loss, for latency-bound kernels only: time x (1 - share / (`throughput_bound_pct`/100)), the time saved "
        "if the same work ran at the throughput-bound level (part of the kernel's own time), none for kernels under "
        "`launch_cost_ns` a launch on average (mostly the fixed cost of starting a kernel, which no roof measures). "
        "Severity is warning for latency-bound kernels over `warning_time_share` of profiled time and not that "
        "short, info otherwise.\n\n"
        "**PyTorch (Kineto) traces: an estimate from operator shapes.** GEMM-like operators, attention and "
        "convolutions get FLOPs and bytes from their recorded shapes (table below), over the time of the kernels "
        "they launched, grouped by operator, shape, type and device. The roof is that of the inputs' type on the "
        "device (the product table's dense peaks at boost clock, each with its source): FP8, FP16 and BF16 on "
        "tensor (NVIDIA) or matrix (AMD) cores; FP32 on TF32 tensor cores where a kernel's name says `tf32` or "
        "`xf32`, else on AMD's FP32 matrix cores (MI200, MI300) or NVIDIA's CUDA cores; FP64 on FP64 "
        "tensor/matrix cores where the product has them. A call whose type has no known peak on its device is "
        "not estimated. The side of the roof comes from the intensity (FLOPs / bytes) against the ridge point "
        "(peak FLOP/s / bandwidth): below it the memory side, at or above it the compute side; the share "
        "reported is that roof's (the higher of the two % of peak), saturated at `throughput_bound_pct`. A call "
        "under `latency_bound_pct` of its roof is latency-bound only with a reason the store shows: a small grid "
        "(its largest kernel has so few blocks that they keep under `latency_bound_pct` of the device's SMs busy; "
        "not on AMD, whose traces give some grids in work-items), low occupancy (Kineto's "
        "`est. achieved occupancy %` under `low_occupancy_pct`; a 0 is read as unknown) or short kernels (under `short_kernel_ns` on average; launches per call named). "
        "Otherwise it is reported on its side of the roof, below saturation, as information with no loss. "
        "Latency-bound calls get the loss above (part of the op's kernel time, `evidence.loss_of`) and are "
        "warnings over `warning_time_share`. The evidence has FLOPs, bytes, intensity, ridge, peaks and their "
        "sources, what the FLOPs count (`counted`) and the latency reasons found.\n\n" + FORMULAS + "\n" + LAUNCHER_HOW,
    fix="Memory-bound: fewer bytes (fusion, lower precision, better reuse and coalescing). Compute-bound: less "
        "or cheaper math (tensor cores). Latency-bound: more parallelism and fewer stalls (see B004, B001, "
        "B002, I001).",
    requires="Nsight Compute Speed Of Light percentages, or FP instruction/tensor counters with DRAM bytes and "
             "duration, or PyTorch operator input shapes linked to kernels",
    applies_sql=_APPLIES,
    thresholds=(
        Threshold("throughput_bound_pct", 80, "A side at or above this % of peak is the bound (NVIDIA SOLBottleneck: 80)."),
        Threshold("latency_bound_pct", 60, "Both sides under this % of peak: latency-bound (NVIDIA SOLBottleneck: 60)."),
        Threshold("balanced_pct", 10, "Sides within this many points are balanced (NVIDIA SOLBottleneck: 10)."),
        Threshold("min_time_share", 0.01, "Kernels under this share of profiled kernel time are skipped (when timed)."),
        Threshold("warning_time_share", 0.05, "Latency-bound kernels at or over this share of time are warnings, others info."),
        Threshold("launch_cost_ns", 5_000, "Measured kernels shorter than this a launch on average are mostly the fixed "
                  "cost of starting a kernel: no loss is estimated for them."),
        Threshold("short_kernel_ns", 10_000, "Kineto estimate: kernels shorter than this on average are a latency "
                  "reason (launch and ramp-up dominate)."),
        Threshold("low_occupancy_pct", 10, "Kineto estimate: Kineto's estimated achieved occupancy under this % "
                  "is a latency reason (tensor-core kernels run at 10-20% by design)."),
    ),
    evaluate=evaluate,
    references=(
        "Nsight Compute rules SOLBottleneck (80/60/10) and SOLFPRoofline; Kernel Profiling Guide 'Roofline Charts'",
        "Williams, Waterman, Patterson: 'Roofline: an insightful visual performance model' (CACM 2009)",
    ),
))
