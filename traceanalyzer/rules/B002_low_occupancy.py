"""B002 low occupancy: low theoretical occupancy (with its limiter), or achieved far below it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Optional

import msgspec

from ..fmt import kernel_label, nbytes, ns, pct
from ._code import HOW as LAUNCHER_HOW, name_launchers
from ._launches import configurations_by_kernel, int_or_none, launch_groups, launch_sized
from ._library import LOW_OCCUPANCY_BY_DESIGN, library_hint, library_of, not_collectives
from ._ncu import linked
from .base import UPPER_BOUND, Rule, Threshold
from .evidence import NcuEvidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

_LIMITER_HINT = {
    "registers": "cap registers (__launch_bounds__ / -maxrregcount) or reduce live values",
    "shared_mem": "use less shared memory per block (smaller tiles) or raise the carveout",
    "warps": "use smaller blocks so more fit per SM",
    "blocks": "use larger blocks: the per-SM block limit binds before warps do",
    "barriers": "use fewer named barriers per block",
}


# CUPTI's occupancy estimate (Kineto's `est. achieved occupancy %`) takes the 48 KB default
# shared-memory limit per block: a kernel that opts in to more reads 0, which says nothing.
CUPTI_SHARED_MEM_LIMIT_BYTES = 48 * 1024
# Blocks of at most this many warps meet the SM's resident-block limit (16-32) before its warp
# limit (48-64): freeing their binding resource leaves occupancy capped at that.
SMALL_BLOCK_WARPS = 2
# NVIDIA's line between throughput- and latency-bound (Speed Of Light at 60% of peak or more).
SOL_THROUGHPUT_BOUND = 0.6


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    g = launch_groups(store, run_id)
    if g.empty:
        return g
    g = g[g["theoretical"].notna()]
    g = not_collectives(g)  # T007's: a collective's launch is NCCL's
    by_kernel = configurations_by_kernel(g, lambda r: _configuration(r, p), p["min_time_share"])
    return name_launchers(store, run_id, pd.DataFrame([_finding(configs, p) for configs in by_kernel]))


def _kineto_estimate(r) -> tuple[float | None, str | None]:
    """Kineto's occupancy estimate as what it is: CUPTI's theoretical occupancy bounded by the grid."""
    est = r.kineto_achieved
    if est != est:
        return None, None
    if est == 0 and _shared_mem(r) > CUPTI_SHARED_MEM_LIMIT_BYTES:
        return None, (f"Kineto's occupancy estimate reads 0, which is unknown: CUPTI computes it with a 48 KB "
                      f"shared-memory limit and this kernel takes {_shared_mem(r) // 1024} KB per block")
    return est, f"Kineto's estimate (CUPTI's theoretical occupancy bounded by the grid, not a measurement): {pct(est)}"


def _carveout_hint(r) -> str:
    """The shared-memory limiter's fix; without raising the carveout where the launches ran with
    the SM's largest already (ncu's launch__shared_mem_config_size against the device's)."""
    config, most = r.shared_mem_config_bytes, r.shared_mem_per_sm_bytes
    if config == config and most == most and config >= most:  # (NaN: not measured)
        return (f"use less shared memory per block (smaller tiles): the carveout is already the SM's largest "
                f"({nbytes(most)})")
    return _LIMITER_HINT["shared_mem"]


def _shared_mem(r) -> int:
    return int((0 if r.static_shared_mem_bytes != r.static_shared_mem_bytes else r.static_shared_mem_bytes)
               + (0 if r.dynamic_shared_mem_bytes != r.dynamic_shared_mem_bytes else r.dynamic_shared_mem_bytes))


def _configuration(r, p: dict) -> dict | None:
    theo = r.theoretical
    measured = r.achieved if r.achieved_source == "ncu" else float("nan")  # only ncu measures it
    target = p["min_theoretical_share"]
    low_theo = theo < target
    # achieved is judged against what the grid lets the SMs hold: a grid of fewer blocks than
    # one wave puts at most ceil(blocks / SMs) on an SM (B001 says whether the grid is too small)
    ceiling = _grid_ceiling(r, theo)
    gap = measured == measured and ceiling - measured > p["max_achieved_gap_share"]
    if not (low_theo or gap):
        return None
    estimate, estimate_note = _kineto_estimate(r)
    limiters = [x for x in str(r.limiter).split("+") if x in _LIMITER_HINT] if r.limiter == r.limiter else []
    # Little's law for a latency-bound kernel: its throughput grows with the warps it keeps in
    # flight, so its time falls at most to theoretical / target (or achieved / theoretical).
    # A kernel near a throughput roof gains at most its headroom below that roof.
    if low_theo:
        share = 1 - theo / target
        what = f"theoretical occupancy {pct(theo)} limited by {' and '.join(limiters) or 'unknown'}"
        if gap:
            what += f", and achieved only {pct(measured)} (measured)"
    else:
        share = 1 - measured / ceiling
        what = f"achieved occupancy {pct(measured)} (measured) vs theoretical {pct(theo)}"
        if ceiling < theo:
            what += (f", {pct(ceiling)} with its grid of {int(r.grid_blocks)} block(s) on {int(r.sm_count)} SMs "
                     f"(at most {math.ceil(r.grid_blocks / r.sm_count)} an SM)")
    what += _lanes(r)
    sol = max((x for x in (r.sm_sol, r.memory_sol) if x == x), default=None)
    bound = "an upper bound, if it is latency-bound"
    if sol is not None:
        share = min(share, max(0.0, 1 - sol))
        bound = f"at most its headroom below its busiest roof ({pct(sol)})"
    else:  # a part of the SM measured alone says only that the SM is at least that busy
        sol = r.sm_sol_floor if r.sm_sol_floor == r.sm_sol_floor and r.sm_sol_floor >= SOL_THROUGHPUT_BOUND else None
    loss = None if r.total_ns != r.total_ns else int(r.total_ns * share)
    return {"row": r, "low_theo": low_theo, "gap": gap, "what": what, "limiters": limiters, "share": share,
            "loss": loss, "bound": bound, "sol": sol, "estimate": estimate, "estimate_note": estimate_note,
            "measured": None if measured != measured else measured}


def _grid_ceiling(r, theo: float) -> float:
    """The occupancy an SM can reach with the kernel's grid: `theo` scaled by the blocks the grid
    gives an SM (ceil(blocks / SMs)) over the blocks it could hold; `theo` when unknown or the
    grid fills a wave."""
    grid, sms, per_sm = r.grid_blocks, r.sm_count, r.blocks_per_sm
    if any(x != x or x <= 0 for x in (grid, sms, per_sm)):
        return theo
    return theo * min(1.0, math.ceil(grid / sms) / per_sm)


def _lanes(r) -> str:
    """A block that is not a whole number of warps leaves lanes of its last warp idle, which no
    occupancy figure counts: "; blocks of 16 threads fill 50.0% of their warps' lanes"."""
    threads, warp = r.threads_per_block, r.warp_size
    if threads != threads or warp != warp or warp <= 0 or threads <= 0 or threads % warp == 0:
        return ""
    return f"; blocks of {int(threads)} threads fill {pct(threads / (math.ceil(threads / warp) * warp))} of their warps' lanes"


def _finding(configs: list[dict], p: dict) -> dict:
    worst = max(configs, key=lambda c: (-1 if c["loss"] is None else c["loss"], c["share"]))
    r = worst["row"]
    losses = [c["loss"] for c in configs if c["loss"] is not None]
    loss = sum(losses) if losses else None
    shares = [c["row"].time_share for c in configs if c["row"].time_share == c["row"].time_share]
    time_share = sum(shares) if shares else None
    throughput_bound = worst["sol"] is not None and worst["sol"] >= SOL_THROUGHPUT_BOUND
    launches = int(sum(c["row"].launches for c in configs))
    total_ns = sum(c["row"].total_ns for c in configs if c["row"].total_ns == c["row"].total_ns)
    # a launch of a few microseconds is mostly the fixed cost of starting a kernel, which more
    # resident warps do not shorten (no time at all, nothing to tell)
    short = launch_sized(total_ns or None, launches, p["short_kernel_ns"])
    if throughput_bound or short:  # occupancy is not what limits it: more of it wins nothing to estimate
        loss = None
    # Library GEMM, convolution and attention kernels keep few, large blocks resident by design
    # (big tiles, deep pipelines): low occupancy alone says nothing about them, a measurement does.
    by_design = library_of(r) in LOW_OCCUPANCY_BY_DESIGN and worst["sol"] is None
    sev = ("info" if throughput_bound or by_design or short or (time_share is not None and time_share < p["warning_time_share"])
           else "warning")
    # Info whatever its loss, for these two reasons (the diagnosis keeps it, see rules/base.py).
    reason = ("throughput-bound: occupancy is not what limits it" if throughput_bound else
              "a library kernel that runs few large blocks by design, and no measurement says it is slow"
              if by_design else None)
    message = f"{kernel_label(r.name, r.short_name)}: {worst['what']}"
    estimate = worst["estimate"]
    if worst["estimate_note"] and (estimate is None or estimate < r.theoretical - 0.005):
        message += f"; {worst['estimate_note']}"
    left_out = 0 if r.achieved_impossible != r.achieved_impossible else int(r.achieved_impossible)
    if left_out:
        message += (f" ({left_out} launch(es) reporting an impossible achieved occupancy, up to "
                    f"{pct(r.achieved_impossible_max)}, left out)")
    if throughput_bound:
        message += f"; at {pct(worst['sol'])} of its busiest roof it is throughput-bound, so occupancy is not what limits it"
    if by_design and worst["low_theo"]:
        message += ("; library GEMM, convolution and attention kernels run few large blocks by design, so "
                    "without a measurement (ncu's Speed Of Light) this is no sign of a problem")
    if short and not throughput_bound:
        message += f"; {short}"
    if len(configs) > 1:
        message += f" (the worst of {len(configs)} launch configurations)"
    if loss is not None:
        message += (f" ({pct(time_share)} of kernel time; est. up to {ns(loss)}, {worst['bound']})"
                    if time_share is not None else f" (est. up to {ns(loss)}, {worst['bound']})")
    hint = library_hint(library_of(r), "occupancy", r.name)
    if hint is None and worst["low_theo"]:
        hint = "; ".join(_carveout_hint(r) if x == "shared_mem" else _LIMITER_HINT[x]
                         for x in worst["limiters"]) or "Check the launch configuration."
        hint = hint[0].upper() + hint[1:] + "."
        warps = (r.threads_per_block / r.warp_size if r.threads_per_block == r.threads_per_block
                 and r.warp_size == r.warp_size and r.warp_size > 0 else None)
        if warps is not None and warps <= SMALL_BLOCK_WARPS and "blocks" not in worst["limiters"]:
            # freed of its limiter, a block of a warp or two meets the SM's block limit first
            hint += (f" With blocks of {int(r.threads_per_block)} threads, an SM's limit on resident blocks caps "
                     "occupancy next: larger blocks (more warps each) are the lasting fix.")
    elif hint is None:
        hint = ("Warps finish unevenly or blocks are scheduled poorly: balance work across warps and blocks, "
                "avoid a small last wave, and check for long-running warps.")
    # start/end stay floats (NaN when unknown): None would not mix with the SQL rules' nullable integers
    return {
        "device_id": r.device_id, "item_kind": "kernel", "item_id": r.first_id, "item_name": r.name,
        "start_ns": r.first_start_ns, "end_ns": r.first_end_ns,
        "value": r.theoretical if worst["low_theo"] else worst["measured"], "value_unit": "share",
        "threshold": (p["min_theoretical_share"] if worst["low_theo"]
                      else r.theoretical - p["max_achieved_gap_share"]),
        "est_loss_ns": loss, "severity": sev,
        "message": message,
        "hint": hint,
        "evidence": {"theoretical": r.theoretical, "achieved": worst["measured"],
                     "achieved_source": "ncu" if worst["measured"] is not None else None,
                     "kineto_estimate": worst["estimate"], "kineto_estimate_note": worst["estimate_note"],
                     "achieved_impossible_launches": left_out,
                     "achieved_impossible_max": None if not left_out else r.achieved_impossible_max,
                     "limiter": "+".join(worst["limiters"]) or (None if r.limiter != r.limiter else r.limiter),
                     "blocks_per_sm": r.blocks_per_sm, "threads_per_block": r.threads_per_block,
                     "registers_per_thread": r.registers_per_thread, "shared_mem_bytes": _shared_mem(r),
                     "loss_share": worst["share"], "loss_basis": worst["bound"],
                     "busiest_sol": worst["sol"], "library": library_of(r),
                     "launches": launches, "time_share": time_share,
                     "occupancy_source": r.source,
                     **({"severity_reason": reason} if reason else {}),
                     "configurations": [_config_evidence(c) for c in configs]},
    }


def _config_evidence(c: dict) -> dict:
    r = c["row"]
    return {"grid_blocks": int_or_none(r.grid_blocks), "threads_per_block": int_or_none(r.threads_per_block),
            "registers_per_thread": int_or_none(r.registers_per_thread), "shared_mem_bytes": _shared_mem(r),
            "theoretical": r.theoretical, "achieved": c["measured"], "launches": int(r.launches),
            "total_ns": int_or_none(r.total_ns), "loss_share": c["share"], "est_loss_ns": c["loss"],
            "first_id": int_or_none(r.first_id)}


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class B002Configuration(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    achieved: Annotated[Optional[float], doc("achieved occupancy, share of the SM's warp slots (measured by ncu)")]
    est_loss_ns: Annotated[int, doc("estimated loss of this configuration")]
    first_id: Annotated[Optional[int], doc("id of the configuration's first launch")]
    grid_blocks: Annotated[Optional[int], doc("blocks in the grid")]
    launches: Annotated[int, doc("launches")]
    loss_share: Annotated[float, doc("share of the configuration's time lost")]
    registers_per_thread: Annotated[Optional[int], doc("registers per thread")]
    shared_mem_bytes: Annotated[int, doc("shared memory per block")]
    theoretical: Annotated[float, doc("theoretical occupancy, share of the SM's warp slots")]
    threads_per_block: Annotated[Optional[int], doc("threads per block")]
    total_ns: Annotated[Optional[int], doc("the configuration's time, all its launches")]


class B002Evidence(NcuEvidence, kw_only=True, forbid_unknown_fields=True):
    achieved: Annotated[Optional[float], doc("achieved occupancy, share of the SM's warp slots (measured by ncu)")]
    achieved_impossible_launches: Annotated[int, doc("launches whose measured occupancy exceeded the theoretical one, left out")]
    achieved_impossible_max: Annotated[Optional[float], doc("the largest such impossible measured occupancy")]
    achieved_source: Annotated[Optional[str], doc("where the achieved occupancy comes from (`ncu`), null where not measured")]
    blocks_per_sm: Annotated[float, doc("blocks resident per SM (occupancy calculator)")]
    busiest_sol: Annotated[Optional[float], doc("the busiest unit's Speed-of-Light throughput, % of peak")]
    configurations: Annotated[list[B002Configuration], doc("the kernel's launch configurations, worst first")]
    kineto_estimate: Annotated[Optional[float], doc("the occupancy PyTorch's profiler estimated")]
    kineto_estimate_note: Annotated[Optional[str], doc("why the profiler's estimate is not used")]
    launches: Annotated[int, doc("launches")]
    library: Annotated[str, doc("the library the kernel comes from")]
    limiter: Annotated[Optional[str], doc("what limits the kernel")]
    loss_basis: Annotated[str, doc("what the estimated loss is computed from")]
    occupancy_source: Annotated[str, doc("where the occupancy figures come from")]
    registers_per_thread: Annotated[float, doc("registers per thread")]
    shared_mem_bytes: Annotated[int, doc("shared memory per block")]
    theoretical: Annotated[float, doc("theoretical occupancy, share of the SM's warp slots")]
    threads_per_block: Annotated[float, doc("threads per block")]
    time_share: Annotated[float, doc("share of the run's kernel time")]


RULE = linked(Rule(
    id="B002",
    evidence=B002Evidence,
    name="low-occupancy",
    title="Low occupancy",
    phase="bottleneck",
    claims="compute",
    nvidia=(("AchievedOccupancy", ""), ("TheoreticalOccupancy", ""), ("Occupancy", r"achieved occupancy")),
    severity="warning",
    max_severity="warning",
    severity_reason=UPPER_BOUND,
    what="Kernels whose theoretical occupancy is low (naming the limiter: registers, shared "
         "memory, warps, blocks) or whose achieved occupancy falls well below the theoretical.",
    why="Occupancy is how many warps an SM keeps resident to hide latency. Too few, and memory "
        "or pipeline latency shows up as idle issue slots; achieved far under theoretical means "
        "warps or blocks finish unevenly or the grid is too small.",
    how="Theoretical occupancy is ncu's `sm__maximum_warps_per_active_cycle_pct`, else the "
        "built-in calculator's. The limiter is the binding limit among the resources the kernel "
        "uses: the smallest of ncu's `launch__occupancy_limit_*` (ncu prints the block cap as the "
        "limit of a resource the kernel does not use, so shared memory is not named for a kernel "
        "without it) or the calculator's. Achieved occupancy only from a measurement: ncu's "
        "`sm__warps_active.avg.pct_of_peak_sustained_active`, averaged over the launches whose value "
        "is possible (a launch whose achieved exceeds its theoretical, or 100%, by more than a point "
        "is left out and counted). Kineto's `est. achieved occupancy %` is CUPTI's theoretical "
        "estimate bounded by the grid, no measurement: it is reported as such, and a 0 for a kernel "
        "with more than 48 KB of shared memory per block (CUPTI's default limit) as unknown. Fires "
        "when theoretical < `min_theoretical_share` (NVIDIA: 80%) or theoretical - achieved > "
        "`max_achieved_gap_share` (NVIDIA: 10 points). The estimated loss is an upper bound from "
        "Little's law: a latency-bound kernel's time falls at most in proportion to the warps it "
        "lacks, to theoretical / `min_theoretical_share` (or achieved / theoretical) of its time; "
        "with ncu's Speed Of Light it is at most the headroom below the busiest roof, and a kernel "
        "at 60% or more of a roof is throughput-bound: info without an estimate (occupancy is not what "
        "limits it). A cuBLAS, CUTLASS, cuDNN or attention "
        "kernel without Speed Of Light is info too: those keep few large blocks resident by design. One finding per kernel (its launch "
        "configurations in `evidence.configurations`, losses summed); kernels under "
        "`warning_time_share` of kernel time are info, under `min_time_share` skipped; kernels under `short_kernel_ns` a launch on average (mostly the fixed cost of starting a kernel) are info, with no loss estimated. Collectives "
        "are T007's; library kernels (`kernels.library`) get hints about the call, not registers. A "
        "block that is not a whole number of warps (the device's `warp_size`) is said to leave lanes "
        "of its warps idle, which no occupancy figure counts." + " " + LAUNCHER_HOW,
    fix="Reduce the limiting resource (registers via __launch_bounds__, shared memory per block, "
        "block size) in your own kernels; for a library's, change what selects its variant (dtype, "
        "shape, algorithm search); balance work so warps retire together.",
    requires="block size, registers and shared memory per kernel (or ncu occupancy metrics)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM kernels WHERE run_id = $run_id AND ((block_x IS NOT NULL AND "
                "registers_per_thread IS NOT NULL) OR est_achieved_occupancy_pct IS NOT NULL OR kernel_id IN "
                "(SELECT kernel_id FROM kernel_metrics WHERE run_id = $run_id AND metric_id IN "
                "('sm__maximum_warps_per_active_cycle_pct', 'sm__warps_active.avg.pct_of_peak_sustained_active', "
                "'launch__occupancy_limit_registers'))))",
    thresholds=(
        Threshold("min_theoretical_share", 0.8, "Theoretical occupancy under this is reported (NVIDIA: 80%)."),
        Threshold("max_achieved_gap_share", 0.1, "Achieved more than this below theoretical is reported (NVIDIA: 10 points)."),
        Threshold("min_time_share", 0.01, "Kernels under this share of the run's kernel time are skipped (when timed)."),
        Threshold("warning_time_share", 0.05, "Kernels under this share of kernel time are reported as info."),
        Threshold("short_kernel_ns", 5_000, "Kernels shorter than this a launch on average are mostly the fixed cost of starting a kernel: info, no loss estimated."),
    ),
    evaluate=evaluate,
    references=(
        "Nsight Compute Occupancy section rules TheoreticalOccupancy and AchievedOccupancy",
        "CUDA C++ Best Practices Guide: 'Occupancy'",
    ),
), project=False)
