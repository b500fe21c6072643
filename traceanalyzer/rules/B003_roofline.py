"""B003 roofline: is each hot kernel memory-, compute- or latency-bound, and how near its roof?"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING

import numpy as np

from ..fmt import kernel_label, ns, pct
from ._code import HOW as LAUNCHER_HOW, name_launchers
from ._ncu import DURATION, MEMORY_UNITS, MEM_SOL, SM_SOL, as_int, busiest_memory_unit, classify, col, device_peaks, jsonable, kernel_finding, keep_hot, ncu_launches, per_kernel
from .base import Rule, Threshold

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
    return [_finding(r, p, estimate=False) for r in g.to_dict("records")]


def _roof_text(r: dict) -> str:
    if r["source"] == "sol":
        unit = f" ({r['memory_unit']} {r['memory_unit_pct']:.0f}%)" if r.get("memory_unit") == r.get("memory_unit") \
            and r.get("memory_unit") else ""
        return f"SOL: compute {r['compute_pct']:.0f}%, memory {r['memory_pct']:.0f}%{unit}"
    fam = FAMILY_LABEL.get(r.get("roof_family"), "compute")
    ai = r.get("intensity")
    ridge = r.get("ridge")
    side = ""
    if ai == ai and ai is not None and ridge == ridge and ridge is not None:
        side = f"; intensity {ai:.3g} FLOP/B {'<' if ai < ridge else '>='} ridge {ridge:.3g}"
    return (f"{'est. ' if r['source'] == 'estimate' else ''}{fam} {r['compute_pct']:.0f}% of peak, "
            f"DRAM {r['memory_pct']:.0f}% of peak{side}")


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


def _finding(r: dict, p: dict, estimate: bool) -> dict:
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
    if bound == "latency" and r["duration_ns"] == r["duration_ns"]:
        loss = round(r["duration_ns"] * (1 - share / target))  # time saved at the same work near the roof
    hot = r["time_share"] != r["time_share"] or r["time_share"] >= p["warning_time_share"]
    severity = "warning" if bound == "latency" and hot else "info"
    launches = int(r["launches"])
    msg = (f"{kernel_label(r['name'], r['short_name'])}: {'est. ' if estimate else ''}{what}, at {pct(share)} of the {roof} ({_roof_text(r)})"
           + (f"; {launches} launches, {ns(r['duration_ns'])}" if launches > 1 else
              f"; {ns(r['duration_ns'])}" if r["duration_ns"] == r["duration_ns"] else "")
           + (f", est. {ns(loss)} to gain" if loss else ""))
    evidence = {
        "bound": bound, "saturated": share >= p["throughput_bound_pct"] / 100, "source": r["source"], "estimate": estimate, "compute_pct": r["compute_pct"],
        "memory_pct": r["memory_pct"], "launches": launches, "duration_ns": r["duration_ns"],
        "time_share": r["time_share"],
    }
    for k in ("memory_unit", "memory_unit_pct", "launch__waves_per_multiprocessor", "roof_family", "flops",
              "dram_bytes", "intensity", "ridge", "roof_compute_pct", "roof_memory_pct", "peak_bw", "peak_bw_source",
              "op", "shape", "dtype", "calls", "assumptions"):
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
        hint=_HINTS[bound] + (" Estimated from shapes: confirm with Nsight Compute." if estimate else ""),
    )


# -- the Kineto estimate: GEMM FLOPs from operator input shapes ----------------------------

DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1,
               "c10::Float8_e5m2": 1, "int": 4, "long int": 8}
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")


def gemm_shape(op: str, dims: list) -> tuple[float, list[list[int]]] | None:
    """(FLOPs, operand shapes incl. the output) of one GEMM-family call; None when the dims do not fit."""
    try:
        mats = [d for d in dims if isinstance(d, list) and len(d) >= 2]
        if op in ("aten::addmm", "aten::baddbmm"):
            a, b = mats[-2], mats[-1]
        else:
            a, b = mats[0], mats[1]
        if op == "aten::linear":  # weight is [N, K]
            k, n = b[-1], b[-2]
        else:
            k, n = b[-2], b[-1]
        m = a[-2]
        batch = math.prod(a[:-2]) if len(a) > 2 else 1
        if a[-1] != k:
            return None
        out = [*a[:-2], m, n]
        return 2.0 * batch * m * n * k, [a, b, out]
    except (IndexError, TypeError):
        return None


def _kineto_rows(store, run_id: str, peaks: pd.DataFrame) -> pd.DataFrame:
    """GEMM calls grouped by operator, input dims and types and device (the few distinct shapes
    are parsed in Python, not the many calls), in order of each group's earliest call."""
    import pandas as pd

    ops = store.sql(
        f"""WITH calls AS (
                SELECT o.op_id, o.name AS op, o.input_dims, o.input_types,
                       min(k.kernel_id) AS first_kernel_id, sum(k.end_ns - k.start_ns) AS duration_ns,
                       min(k.start_ns) AS start_ns, max(k.end_ns) AS end_ns, any_value(k.device_id) AS device_id,
                       arg_max(k.name, (k.end_ns - k.start_ns, -k.kernel_id)) AS kernel,
                       arg_max(k.short_name, (k.end_ns - k.start_ns, -k.kernel_id)) AS short_name
                FROM cpu_ops o JOIN kernels k ON k.run_id = $run_id AND k.external_id = o.external_id
                WHERE o.run_id = $run_id AND o.name IN {GEMM_OPS} AND o.input_dims IS NOT NULL
                  AND k.start_ns IS NOT NULL AND k.end_ns > k.start_ns
                GROUP BY o.op_id, o.name, o.input_dims, o.input_types, o.external_id
            )
            SELECT op, input_dims, input_types, device_id, count(*) AS calls, sum(duration_ns) AS duration_ns,
                   -- the earliest call's kernel, ids and times
                   arg_min(kernel, (start_ns, op_id)) AS kernel, arg_min(short_name, (start_ns, op_id)) AS short_name,
                   arg_min(first_kernel_id, (start_ns, op_id)) AS first_id,
                   min(start_ns) AS start_ns, arg_min(end_ns, (start_ns, op_id)) AS end_ns
            FROM calls GROUP BY op, input_dims, input_types, device_id
            ORDER BY start_ns, arg_min(op_id, (start_ns, op_id))""", {"run_id": run_id}).df()
    if ops.empty:
        return ops
    rows = []
    for o in ops.to_dict("records"):  # one row per distinct call shape: shapes are nested JSON, not columnar
        dims, types = json.loads(o["input_dims"]), json.loads(o["input_types"] or "[]")
        shape = gemm_shape(o["op"], dims)
        dtype = next((t for t in types if t in DTYPE_BYTES), None)
        if shape is None or dtype is None:
            continue
        flops, mats = shape
        o.update(flops=flops * o["calls"], dram_bytes=float(sum(math.prod(m) for m in mats) * DTYPE_BYTES[dtype])
                 * o["calls"], dtype=dtype, shape=" x ".join("[" + "x".join(map(str, m)) + "]" for m in mats[:2]))
        rows.append(o)
    return pd.DataFrame(rows)


def _kineto_findings(store, run_id: str, p: dict) -> list[dict]:
    peaks = device_peaks(store, run_id)
    df = _kineto_rows(store, run_id, peaks)
    if df.empty or peaks.empty:
        return []
    df["device_id"] = df["device_id"].astype("float64")
    df = df.merge(peaks, on="device_id", how="inner")
    # The roof a call is judged against: tensor cores for 16-bit types, CUDA cores otherwise.
    fam = df["dtype"].map({"c10::BFloat16": "tensor_bf16", "c10::Half": "tensor", "double": "fp64"}).fillna("fp32")
    df["peak_flops"] = [r[f] for r, f in zip(df.to_dict("records"), fam)]
    df["roof_family"] = fam.map({"tensor_bf16": "tensor", "tensor": "tensor", "fp64": "fp64", "fp32": "fp32"})
    df = df[df["peak_flops"].notna() & df["bw"].notna()]
    if df.empty:
        return []
    total_ns = store.sql("SELECT sum(end_ns - start_ns) FROM kernels WHERE run_id = $run_id AND end_ns > start_ns",
                         {"run_id": run_id}).fetchone()[0]
    g = df.groupby(["op", "shape", "dtype", "device_id"], sort=False).agg(
        name=("kernel", "first"), short_name=("short_name", "first"),
        first_id=("first_id", "first"), start_ns=("start_ns", "first"), end_ns=("end_ns", "first"),
        calls=("calls", "sum"), duration_ns=("duration_ns", "sum"), flops=("flops", "sum"),
        dram_bytes=("dram_bytes", "sum"), peak_flops=("peak_flops", "first"), peak_bw=("bw", "first"),
        roof_family=("roof_family", "first"), peak_flops_source=("flops_source", "first"),
        peak_bw_source=("bw_source", "first")).reset_index()
    secs = g["duration_ns"] / 1e9
    g["compute_pct"] = 100 * g["flops"] / secs / g["peak_flops"]
    g["memory_pct"] = 100 * g["dram_bytes"] / secs / g["peak_bw"]
    g["intensity"] = g["flops"] / g["dram_bytes"]
    g["ridge"] = g["peak_flops"] / g["peak_bw"]
    g["time_share"] = g["duration_ns"] / total_ns if total_ns else np.nan
    g["launches"] = g["calls"]
    g["source"] = "estimate"
    g["bound"] = classify(g["compute_pct"], g["memory_pct"], p)
    g["short_name"] = g["op"] + " " + g["shape"] + " " + g["dtype"].str.replace("c10::", "") + " via " + g["short_name"]
    g["assumptions"] = ("FLOPs = 2*M*N*K from Input Dims; bytes = each operand read once and the output written "
                        "once (a lower bound); time = the op's kernels; roof = "
                        + g["roof_family"].map({"tensor": "16-bit tensor-core peak", "fp32": "FP32 CUDA-core peak "
                                                "(TF32 tensor cores would raise it)", "fp64": "FP64 peak"}))
    g = keep_hot(g, p["min_time_share"])
    out = []
    for r in g.to_dict("records"):
        f = _finding(r, p, estimate=True)
        ev = json.loads(f["evidence"])
        ev["peak_flops"], ev["peak_flops_source"] = r["peak_flops"], r["peak_flops_source"]
        f["evidence"] = json.dumps(jsonable(ev), sort_keys=True)
        out.append(f)
    return out


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    fmt = store.sql("SELECT format FROM runs WHERE run_id = $run_id", {"run_id": run_id}).fetchone()[0]
    rows = _ncu_findings(store, run_id, p) if fmt == "ncu-csv" else _kineto_findings(store, run_id, p)
    df = pd.DataFrame(rows)
    if not df.empty:
        df = df.sort_values(["est_loss_ns", "value"], ascending=[False, True], na_position="last", kind="stable")
    return name_launchers(store, run_id, df)


_APPLIES = f"""
SELECT (SELECT count(DISTINCT metric_id) FROM kernel_metrics WHERE run_id = $run_id
          AND metric_id IN ('{SM_SOL}', '{MEM_SOL}')) = 2
    OR ((SELECT count(*) FROM kernel_metrics WHERE run_id = $run_id AND value IS NOT NULL
          AND regexp_matches(metric_id, '^s(m|msp)__sass_thread_inst_executed_op_[dfh](add|mul|fma)_pred_on|^sm__ops_path_tensor_')) > 0
        AND (SELECT count(*) FROM kernel_metrics WHERE run_id = $run_id AND value IS NOT NULL
          AND metric_id IN ('dram__bytes.sum', 'dram__bytes_read.sum', 'dram__bytes.sum.per_second')) > 0
        AND (SELECT count(*) FROM kernel_metrics WHERE run_id = $run_id AND metric_id = '{DURATION}') > 0)
    OR ((SELECT count(*) FROM cpu_ops o JOIN kernels k ON k.run_id = $run_id AND k.external_id = o.external_id
         WHERE o.run_id = $run_id AND o.name IN {GEMM_OPS} AND o.input_dims IS NOT NULL) > 0
        AND (SELECT count(*) FROM devices WHERE run_id = $run_id AND memory_bandwidth_bytes_per_s IS NOT NULL) > 0)
"""

RULE = Rule(
    id="B003",
    name="roofline",
    title="Roofline: memory-, compute- or latency-bound, and the share of the roof reached",
    phase="bottleneck",
    claims="compute",
    severity="warning",
    what="Per hot kernel, which roof limits it (memory, compute, both, or neither: latency-bound) and what "
         "share of that roof it reaches. From Nsight Compute Speed Of Light percentages, or from FLOP and "
         "DRAM-byte counters against the device's peaks; for PyTorch traces, an estimate for GEMMs from "
         "operator input shapes.",
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
        "the evidence. NVIDIA's SOLBottleneck thresholds classify: one side >= `throughput_bound_pct` -> "
        "bound by it; both < `latency_bound_pct` -> latency-bound; in between, bound by the higher side "
        "unless within `balanced_pct` points (balanced). The share reported is the higher side. For Kineto "
        "traces, aten::mm/addmm/bmm/baddbmm/matmul/linear calls give FLOPs = 2*M*N*K and a minimum of bytes "
        "(operands and output once) over the time of the kernels they launched, against the 16-bit tensor "
        "peak for half/bfloat16 and the FP32 peak for float: flagged as an estimate. Estimated loss, for "
        "latency-bound kernels only: time x (1 - share / (`throughput_bound_pct`/100)), the time saved if "
        "the same work ran at the throughput-bound level. Severity is warning for latency-bound kernels over "
        "`warning_time_share` of profiled time, info otherwise." + " " + LAUNCHER_HOW,
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
    ),
    evaluate=evaluate,
    formats=("ncu-csv", "ncu-text", "ncu-rep", "kineto-json"),
    references=(
        "Nsight Compute rules SOLBottleneck (80/60/10) and SOLFPRoofline; Kernel Profiling Guide 'Roofline Charts'",
        "Williams, Waterman, Patterson: 'Roofline: an insightful visual performance model' (CACM 2009)",
    ),
)
