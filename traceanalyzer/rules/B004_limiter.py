"""B004 limiter: is a hot kernel limited by latency, throughput or occupancy, and how to confirm it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

from ..fmt import kernel_label, nbytes, pct
from ._launches import launch_sized
from ._library import library_hint
from ._ncu import (ACHIEVED, DURATION, MEM_SOL, MEMORY_UNITS, SM_SOL, busiest_memory_unit, classify,
                   device_peaks, kernel_finding, linked, ncu_launches, per_kernel)
from .base import Rule, Threshold
from .evidence import NcuTimedEvidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

WAVES = "launch__waves_per_multiprocessor"
THEORETICAL = "sm__maximum_warps_per_active_cycle_pct"
ISSUE_ACTIVE = "smsp__issue_active.avg.per_cycle_active"
ACTIVE_WARPS = "smsp__warps_active.avg.per_cycle_active"
ELIGIBLE_WARPS = "smsp__warps_eligible.avg.per_cycle_active"
DRAM_RATE = "dram__bytes.sum.per_second"
LIMITS = {k: f"launch__occupancy_limit_{k}" for k in ("registers", "shared_mem", "warps", "blocks", "barriers")}
MEANS = [SM_SOL, MEM_SOL, WAVES, THEORETICAL, ACHIEVED, ISSUE_ACTIVE, ACTIVE_WARPS, ELIGIBLE_WARPS, DRAM_RATE,
         *LIMITS.values(), *(m for ms in MEMORY_UNITS.values() for m in ms)]

_OCCUPANCY_LEVER = {
    "registers": "cap registers per thread (__launch_bounds__ or -maxrregcount)",
    "shared_mem": "use less shared memory per block (smaller tiles)",
    "warps": "use smaller blocks",
    "blocks": "use larger blocks (the per-SM block limit binds first)",
    "barriers": "use fewer named barriers per block",
}


def _limiter_names(r: dict) -> list[str]:
    limits = {k: r.get(m) for k, m in LIMITS.items() if r.get(m) == r.get(m) and r.get(m) is not None}
    low = min(limits.values()) if limits else None
    return [k for k, v in limits.items() if v == low]


def _library(r: dict) -> str | None:
    lib = r.get("library")
    return lib if isinstance(lib, str) else None  # NaN when the store has none


def _diagnose(r: dict, p: dict, peak_bw: float | None) -> tuple[str, str, str, str]:
    """(limiter, cause, what, experiment) for one kernel."""
    sm, mem = r[SM_SOL], r[MEM_SOL]
    bound = r["bound"]
    if bound != "latency":
        saturated = max(sm, mem) >= p["throughput_bound_pct"]
        level = "" if saturated else f" (not saturated: under {p['throughput_bound_pct']:.0f}%)"
        if bound == "compute":
            return ("throughput", "compute",
                    f"throughput-limited on compute: SM at {sm:.0f}% of peak{level}",
                    "Confirm: in Compute Workload Analysis the busiest pipe should be near its peak; cutting or "
                    "cheapening the instructions on that pipe (tensor cores, fast math, less index arithmetic) "
                    "should shorten the kernel about in proportion.")
        unit = r.get("memory_unit") if r.get("memory_unit") == r.get("memory_unit") else None
        dram = next((r.get(m) for m in MEMORY_UNITS["DRAM"] if r.get(m) == r.get(m) and r.get(m) is not None), None)
        if bound == "balanced" and unit == "L1/TEX" and dram is not None and dram < mem / 2:
            # the busy SM pipe and memory unit are one path: load/store instructions through L1,
            # with DRAM far below them (B003's "busy units move data inside the SM")
            return ("throughput", "balanced",
                    (f"throughput-limited on the load/store path (LSU and L1/TEX): SM {sm:.0f}%, memory {mem:.0f}% "
                     f"(L1/TEX the busiest unit), DRAM {dram:.0f}%{level}"),
                    ("Confirm: the load/store pipe and L1 are busy while DRAM is not: the kernel issues too many "
                     "load/store instructions for its work; reuse values from registers or shared memory (tiling) "
                     "and use wider loads, and the time should drop."))
        if bound == "balanced":
            return ("throughput", "balanced",
                    f"throughput-limited on compute and memory alike: SM {sm:.0f}%, memory {mem:.0f}%{level}",
                    "Confirm: both the busiest pipe and the busiest memory unit are high; only less work and fewer "
                    "bytes together help, so try fusion or a cheaper algorithm.")
        what = f"throughput-limited on memory{' (' + unit + ')' if unit else ''}: memory at {mem:.0f}% of peak{level}"
        if unit == "DRAM" or unit is None:
            rate = r.get(DRAM_RATE)
            have = (f" (measured {nbytes(rate)}/s" + (f" vs a peak of {nbytes(peak_bw)}/s" if peak_bw == peak_bw and peak_bw else ", peak unknown") + ")"
                    if rate == rate and rate is not None else "")
            exp = (f"Confirm: check achieved DRAM bandwidth against the device peak{have}; if it is close, only "
                   "moving fewer bytes (fusion, 16-bit storage, better reuse) will shorten the kernel.")
        else:
            exp = (f"Confirm: the {unit} cache is the busiest unit, not DRAM: look for redundant or uncoalesced "
                   "accesses (I002) and shared-memory bank conflicts (I004); fewer requests should cut the time.")
        return "throughput", "memory", what, exp
    waves, theo, ach, issue = r.get(WAVES), r.get(THEORETICAL), r.get(ACHIEVED), r.get(ISSUE_ACTIVE)
    sol = f"SM {sm:.0f}% and memory {mem:.0f}% of peak"
    if waves == waves and waves is not None and waves < p["max_small_grid_waves"]:
        lever = library_hint(_library(r), "grid", r.get("name")) or ("Launch more blocks (smaller tiles, split-K) or run independent "
                                                    "work concurrently.")
        per_sm = min((r.get(m) for m in LIMITS.values() if r.get(m) == r.get(m) and r.get(m) is not None), default=None)
        # waves x blocks an SM holds = blocks per SM: at 1 or more no SM is idle, the grid only
        # leaves each some of its slots empty
        filled = (f"{waves:.2f} waves give each SM about {waves * per_sm:.0f} of the {per_sm:.0f} blocks it can hold "
                  f"(no SM idle)" if per_sm and waves * per_sm >= 1 else f"{waves:.2f} waves")
        return ("latency", "small_grid",
                f"latency-limited by a small grid: {filled}, {sol}",
                "Confirm: double the problem size or batch; if the duration barely grows, the GPU was under-filled. "
                + lever)
    low_theo = theo == theo and theo is not None and theo < p["min_theoretical_occupancy_pct"]
    gap = (theo == theo and ach == ach and theo is not None and ach is not None
           and theo - ach > p["max_achieved_gap_pct"])
    if low_theo:
        names = _limiter_names(r)
        library = library_hint(_library(r), "occupancy", r.get("name"))
        if library:
            return ("occupancy", "theoretical",
                    f"occupancy-limited: theoretical occupancy {theo:.0f}% (limited by {' and '.join(names) or 'unknown'}), "
                    f"{sol}", f"Confirm by changing what selects the variant: {library}")
        lever = "; or ".join(_OCCUPANCY_LEVER[n] for n in names) or "change the launch configuration"
        return ("occupancy", "theoretical",
                f"occupancy-limited: theoretical occupancy {theo:.0f}% (limited by {' and '.join(names) or 'unknown'}), "
                f"{sol}",
                f"Confirm: raise occupancy ({lever}) and see whether the duration drops; if it does not, "
                "latency hiding was not the limit (look at the stall reasons, I001).")
    if gap:
        return ("occupancy", "achieved",
                f"occupancy-limited: achieved occupancy {ach:.0f}% of a possible {theo:.0f}%, {sol}",
                "Confirm: compare per-SM active warps (Workload Distribution) and the last wave (B001); if blocks "
                "finish unevenly, balance the work per block or use more, smaller blocks.")
    if issue == issue and issue is not None and issue < p["min_issue_active_ratio"]:
        return ("latency", "stalls",
                f"latency-limited by warp stalls: a scheduler issues on {pct(issue)} of cycles "
                f"with occupancy {ach:.0f}%, {sol}" if ach == ach and ach is not None else
                f"latency-limited by warp stalls: a scheduler issues on {pct(issue)} of cycles, {sol}",
                "Confirm: read the dominant stall reason (I001); more independent work per thread (unrolling, "
                "several loads in flight, cp.async prefetch) should raise the issue rate and cut the duration.")
    return ("latency", "unclear", f"latency-limited: {sol}, with no occupancy or issue-rate data to say why",
            "Confirm: collect the Occupancy, Scheduler Statistics and Warp State Statistics sections "
            "(ncu --section ...) to see whether warps are too few or stalled.")


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    ids = [DURATION, *MEANS]
    df = ncu_launches(store, run_id, ids)
    if df.empty:
        return df
    g = per_kernel(df, means=MEANS, weight=DURATION)
    g = g[g[SM_SOL].notna() & g[MEM_SOL].notna()]
    g = g[g["time_share"].isna() | (g["time_share"] >= p["min_time_share"])]
    g = g.sort_values(["duration_ns", "first_id"], ascending=[False, True], na_position="last")
    g = g.head(int(p["max_kernels_count"]))
    if g.empty:
        return g
    g = g.assign(bound=classify(g[SM_SOL], g[MEM_SOL], p), memory_unit=busiest_memory_unit(g))
    peaks = device_peaks(store, run_id).set_index("device_id")["bw"].to_dict()
    rows = []
    for r in g.to_dict("records"):
        limiter, cause, what, experiment = _diagnose(r, p, peaks.get(r["device_id"]))
        share = max(r[SM_SOL], r[MEM_SOL]) / 100
        hot = r["time_share"] != r["time_share"] or r["time_share"] >= p["warning_time_share"]
        launches = int(r["launches"])
        short = launch_sized(r["duration_ns"], launches, p["short_kernel_ns"]) if limiter != "throughput" else None
        evidence = {
            "limiter": limiter, "cause": cause, "bound": r["bound"], "sm_pct": r[SM_SOL], "memory_pct": r[MEM_SOL],
            "memory_unit": r["memory_unit"], "waves": r.get(WAVES), "theoretical_occupancy_pct": r.get(THEORETICAL),
            "achieved_occupancy_pct": r.get(ACHIEVED), "issue_active": r.get(ISSUE_ACTIVE),
            "active_warps_per_scheduler": r.get(ACTIVE_WARPS), "eligible_warps_per_scheduler": r.get(ELIGIBLE_WARPS),
            "occupancy_limiter": "+".join(_limiter_names(r)) or None, "dram_bytes_per_s": r.get(DRAM_RATE),
            "launches": launches, "duration_ns": r["duration_ns"], "time_share": r["time_share"],
            "experiment": experiment,
        }
        rows.append(kernel_finding(
            r, evidence,
            value=share, value_unit="share",
            threshold=(p["latency_bound_pct"] if limiter != "throughput" else p["throughput_bound_pct"]) / 100,
            severity="warning" if limiter != "throughput" and hot and not short else "info",
            message=f"{kernel_label(r['name'], r['short_name'])}: {what}"
                    + (f"; {pct(r['time_share'])} of profiled time" if r["time_share"] == r["time_share"] else "")
                    + (f" over {launches} launches" if launches > 1 else "")
                    + (f"; {short}" if short else ""),
            hint=experiment,
        ))
    return pd.DataFrame(rows)


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class B004Evidence(NcuTimedEvidence, kw_only=True, forbid_unknown_fields=True):
    cause: Annotated[str, doc("why it is so limited: compute, balanced, memory, small_grid, theoretical, achieved, stalls or unclear")]
    achieved_occupancy_pct: Annotated[Optional[float], doc("achieved occupancy, % of the SM's warp slots")]
    active_warps_per_scheduler: Annotated[Optional[float], doc("warps active per scheduler per cycle")]
    bound: Annotated[str, doc("what the kernel is bound by (memory, compute, balanced, latency)")]
    dram_bytes_per_s: Annotated[Optional[float], doc("the device's DRAM bandwidth, bytes per second")]
    eligible_warps_per_scheduler: Annotated[Optional[float], doc("warps eligible to issue per scheduler per cycle")]
    experiment: Annotated[str, doc("the ncu experiment the limiter comes from")]
    issue_active: Annotated[Optional[float], doc("share of cycles with an instruction issued")]
    launches: Annotated[int, doc("launches")]
    limiter: Annotated[str, doc("what limits the kernel")]
    memory_pct: Annotated[float, doc("memory throughput, % of peak")]
    memory_unit: Annotated[Optional[str], doc("the busiest memory unit")]
    occupancy_limiter: Annotated[Optional[str], doc("what limits occupancy (registers, shared memory, warps, blocks)")]
    sm_pct: Annotated[float, doc("SM throughput, % of peak")]
    theoretical_occupancy_pct: Annotated[Optional[float], doc("theoretical occupancy, %")]
    time_share: Annotated[float, doc("share of the run's kernel time")]
    waves: Annotated[Optional[float], doc("waves of blocks over the SMs")]


RULE = linked(Rule(
    id="B004",
    evidence=B004Evidence,
    name="limiter",
    title="Latency, throughput or occupancy: what limits a hot kernel, and how to confirm it",
    phase="bottleneck",
    claims="compute",
    nvidia=(("SOLBottleneck", r"more heavily utilized|throughput"),),
    severity="warning",
    what="For each of the hottest profiled kernels, which of three limits holds it back: a hardware unit "
         "running near its peak (throughput), too few warps resident (occupancy), or warps that wait "
         "(latency: a small grid or stalls), with the experiment that would confirm it.",
    why="The three call for opposite fixes: a throughput-bound kernel needs less work or fewer bytes, an "
        "occupancy-limited one a cheaper launch configuration, a latency-bound one more parallelism or fewer "
        "dependencies. Raising occupancy on a bandwidth-bound kernel, or vectorizing a stall-bound one, wastes "
        "the effort.",
    how="Launches of one kernel are folded together (percentages weighted by duration); kernels under "
        "`min_time_share` of profiled time are skipped and at most `max_kernels_count` of the longest are "
        "judged. Speed Of Light first (NVIDIA SOLBottleneck): compute or memory at or over "
        "`throughput_bound_pct` -> throughput-limited on the higher side (the busiest memory unit named); one "
        "side over `latency_bound_pct` -> throughput-limited but not saturated; either way balanced (both) "
        "where the two are within `balanced_pct` points (the load/store path when L1/TEX is the busiest memory "
        "unit and DRAM runs under half of it: one limit, the LSU pipe and L1, not two). Both under `latency_bound_pct`: waves under `max_small_grid_waves` -> small grid; theoretical "
        "occupancy under `min_theoretical_occupancy_pct` (with the binding `launch__occupancy_limit_*`) or "
        "achieved more than `max_achieved_gap_pct` points below it -> occupancy-limited; scheduler issue rate "
        "under `min_issue_active_ratio` -> stalls (NVIDIA IssueSlotUtilization); else unclear. Latency- and "
        "occupancy-limited kernels over `warning_time_share` are warnings, unless under `short_kernel_ns` a launch on average (mostly the fixed cost of starting a kernel); throughput-limited ones info. No "
        "time estimate here: B003 gives the time at stake for the same kernels. Beside NVIDIA's SOLBottleneck, "
        "on every real report kernel it judges, the side agrees: its 'greater than 80%' and 'more heavily "
        "utilized' messages are throughput, 'too small to fill' and 'low compute throughput and memory "
        "bandwidth' latency (occupancy-limited kernels included) (tests/test_ncu_rules_vendor.py).",
    fix="Follow the experiment in the hint; then the matching rule: B001 (small grid), B002 (occupancy), "
        "I001 (stalls), I002-I004 (memory traffic), B003 (roofline).",
    requires="Nsight Compute Speed Of Light percentages (`sm__throughput`, `gpu__compute_memory_throughput`); "
             "occupancy, launch and scheduler sections sharpen the verdict",
    applies_sql=f"""SELECT count(DISTINCT metric_id) = 2 FROM kernel_metrics WHERE run_id = $run_id
                    AND metric_id IN ('{SM_SOL}', '{MEM_SOL}') AND value IS NOT NULL""",
    thresholds=(
        Threshold("throughput_bound_pct", 80, "Compute or memory % of peak that makes a kernel throughput-bound (NVIDIA SOLBottleneck: 80)."),
        Threshold("latency_bound_pct", 60, "Both under this % of peak: latency family (NVIDIA SOLBottleneck: 60)."),
        Threshold("balanced_pct", 10, "Compute and memory within this many points are balanced (NVIDIA: 10)."),
        Threshold("max_small_grid_waves", 1.0, "Latency-bound kernels under this many waves are small-grid (NVIDIA: 1)."),
        Threshold("min_theoretical_occupancy_pct", 80, "Theoretical occupancy under this is the limit (NVIDIA TheoreticalOccupancy: 80)."),
        Threshold("max_achieved_gap_pct", 10, "Achieved more than this many points under theoretical is the limit (NVIDIA AchievedOccupancy: 10)."),
        Threshold("min_issue_active_ratio", 0.6, "Issue rate under this per scheduler cycle means stalls (NVIDIA IssueSlotUtilization: 0.6)."),
        Threshold("min_time_share", 0.05, "Kernels under this share of profiled time are not judged."),
        Threshold("max_kernels_count", 10, "At most this many of the longest kernels are judged.", low=1),
        Threshold("warning_time_share", 0.1, "Latency/occupancy-limited kernels at or over this share of time are warnings."),
        Threshold("short_kernel_ns", 5_000, "Kernels shorter than this a launch on average are mostly the fixed cost of starting a kernel: info."),
    ),
    evaluate=evaluate,
    references=(
        "Nsight Compute rules SOLBottleneck, TheoreticalOccupancy, AchievedOccupancy, IssueSlotUtilization",
        "Nsight Compute Kernel Profiling Guide: 'Speed Of Light', 'Occupancy', 'Scheduler Statistics'",
    ),
))
