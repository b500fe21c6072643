"""B002 low occupancy: low theoretical occupancy (with its limiter), or achieved far below it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..fmt import ns, pct
from ._launches import launch_groups
from .base import Rule, Threshold

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

_LIMITER_HINT = {
    "registers": "cap registers (__launch_bounds__ / -maxrregcount) or reduce live values",
    "shared_mem": "use less shared memory per block (smaller tiles) or raise the carveout",
    "warps": "use smaller blocks so more fit per SM",
    "blocks": "use larger blocks: the per-SM block limit binds before warps do",
    "barriers": "use fewer named barriers per block",
}


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    g = launch_groups(store, run_id)
    if g.empty:
        return g
    g = g[g["theoretical"].notna() | g["achieved"].notna()]
    g = g[g["time_share"].isna() | (g["time_share"] >= p["min_time_share"])]
    rows = []
    for r in g.itertuples():
        theo, ach = r.theoretical, r.achieved
        low_theo = theo == theo and theo < p["min_theoretical_share"]
        gap = theo == theo and ach == ach and theo - ach > p["max_achieved_gap_share"]
        if not (low_theo or gap):
            continue
        limiters = [x for x in str(r.limiter).split("+") if x in _LIMITER_HINT] if r.limiter == r.limiter else []
        if low_theo:
            share = 1 - theo  # NVIDIA's local estimate for TheoreticalOccupancy
            what = f"theoretical occupancy {pct(theo)} limited by {' and '.join(limiters) or 'unknown'}"
            hint = "; ".join(_LIMITER_HINT[x] for x in limiters) or "Check the launch configuration."
            hint = hint[0].upper() + hint[1:] + "."
            if gap:
                what += f", and achieved only {pct(ach)}"
        else:
            share = (theo - ach) / theo  # NVIDIA's estimate for AchievedOccupancy
            what = f"achieved occupancy {pct(ach)} vs theoretical {pct(theo)}"
            hint = ("Warps finish unevenly or blocks are scheduled poorly: balance work across warps and blocks, "
                    "avoid a small last wave, and check for long-running warps.")
            if r.achieved_source == "kineto-estimate":
                hint = ("Kineto's estimate is capped by grid size: the grid is too small to fill every SM to the "
                        "theoretical occupancy; launch more blocks (see B001).")
        left_out = 0 if r.achieved_impossible != r.achieved_impossible else int(r.achieved_impossible)
        if left_out:
            what += (f" ({left_out} launch(es) reporting an impossible achieved occupancy, up to "
                     f"{pct(r.achieved_impossible_max)}, left out)")
        loss = None if r.total_ns != r.total_ns else int(r.total_ns * share)
        sev = "warning" if (r.time_share != r.time_share or r.time_share >= p["warning_time_share"]) else "info"
        # start/end stay floats (NaN when unknown): None would not mix with the SQL rules' nullable integers
        rows.append({
            "device_id": r.device_id, "item_kind": "kernel", "item_id": r.first_id, "item_name": r.name,
            "start_ns": r.first_start_ns, "end_ns": r.first_end_ns,
            "value": theo if low_theo else ach, "value_unit": "share",
            "threshold": p["min_theoretical_share"] if low_theo else theo - p["max_achieved_gap_share"],
            "est_loss_ns": loss, "severity": sev,
            "message": f"{r.short_name}: {what}"
                       + (f" ({pct(r.time_share)} of kernel time, est. {ns(loss)} at stake)" if loss is not None else ""),
            "hint": hint,
            "evidence": {"theoretical": theo, "achieved": None if ach != ach else ach,
                         "achieved_source": r.achieved_source,
                         "achieved_impossible_launches": left_out,
                         "achieved_impossible_max": None if not left_out else r.achieved_impossible_max,
                         "limiter": None if r.limiter != r.limiter else r.limiter,
                         "blocks_per_sm": r.blocks_per_sm, "threads_per_block": r.threads_per_block,
                         "registers_per_thread": r.registers_per_thread,
                         "shared_mem_bytes": (0 if r.static_shared_mem_bytes != r.static_shared_mem_bytes else r.static_shared_mem_bytes)
                         + (0 if r.dynamic_shared_mem_bytes != r.dynamic_shared_mem_bytes else r.dynamic_shared_mem_bytes),
                         "launches": r.launches, "time_share": None if r.time_share != r.time_share else r.time_share,
                         "occupancy_source": r.source},
        })
    return pd.DataFrame(rows)


RULE = Rule(
    id="B002",
    name="low-occupancy",
    title="Low occupancy",
    phase="bottleneck",
    claims="compute",
    nvidia=(("AchievedOccupancy", ""), ("TheoreticalOccupancy", ""), ("Occupancy", r"achieved occupancy")),
    severity="warning",
    what="Kernels whose theoretical occupancy is low (naming the limiter: registers, shared "
         "memory, warps, blocks) or whose achieved occupancy falls well below the theoretical.",
    why="Occupancy is how many warps an SM keeps resident to hide latency. Too few, and memory "
        "or pipeline latency shows up as idle issue slots; achieved far under theoretical means "
        "warps or blocks finish unevenly or the grid is too small.",
    how="Theoretical occupancy is ncu's `sm__maximum_warps_per_active_cycle_pct`, else the "
        "built-in calculator's; the limiter is the smallest of ncu's `launch__occupancy_limit_*` "
        "or the calculator's limits. Achieved is ncu's `sm__warps_active.avg.pct_of_peak_sustained_active`, "
        "averaged over the launches whose value is possible: a launch whose achieved exceeds its "
        "theoretical (or 100%) by more than a point (some ncu versions print up to 172%) is left out "
        "of the mean, and the finding says how many were; "
        "else Kineto's `est. achieved occupancy %` (an estimate capped by grid size). Fires when "
        "theoretical < `min_theoretical_share` (NVIDIA: 80%) or theoretical - achieved > "
        "`max_achieved_gap_share` (NVIDIA: 10 points). Estimated loss uses NVIDIA's estimates, "
        "(1 - theoretical) or (theoretical - achieved) / theoretical, times the kernel's time: an "
        "upper bound, since more occupancy helps only latency-bound kernels. Kernels under "
        "`warning_time_share` of kernel time are info.",
    fix="Reduce the limiting resource (registers via __launch_bounds__, shared memory per block, "
        "block size), or balance work so warps retire together.",
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
    ),
    evaluate=evaluate,
    references=(
        "Nsight Compute Occupancy section rules TheoreticalOccupancy and AchievedOccupancy",
        "CUDA C++ Best Practices Guide: 'Occupancy'",
    ),
)
