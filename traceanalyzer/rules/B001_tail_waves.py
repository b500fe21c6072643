"""B001 tail waves: a partial last wave, or a grid too small to fill the GPU."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Optional, Union

import msgspec

from ..fmt import kernel_label, loss_bound, ns, pct
from ._code import HOW as LAUNCHER_HOW, name_launchers
from ._launches import configurations_by_kernel, int_or_none, launch_groups, launch_sized
from ._library import library_hint, library_of, not_collectives
from .base import UPPER_BOUND, Rule, Threshold
from .evidence import KernelEvidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    g = launch_groups(store, run_id)
    if g.empty:
        return g
    # 0 waves is a grid under 0.005 waves as ncu prints it: under-filled, not unknown
    g = g[g["waves"].notna() & (g["waves"] >= 0)]
    g = not_collectives(g)  # a collective's grid is its channel count (T007)
    by_kernel = configurations_by_kernel(g, lambda r: _configuration(r, p), p["min_time_share"])
    return name_launchers(store, run_id, pd.DataFrame([_finding(configs, p) for configs in by_kernel]))


def _configuration(r, p: dict) -> dict | None:
    """One launch configuration's tail or small grid, or None when it has neither."""
    per_wave = (f"{int(r.sm_count)} SMs x {int(r.blocks_per_sm)} blocks/SM = "
                f"{int(r.sm_count * r.blocks_per_sm)} blocks per wave"
                if r.sm_count == r.sm_count and r.blocks_per_sm == r.blocks_per_sm else "blocks per wave unknown")
    whole, partial = math.floor(r.waves), r.waves - math.floor(r.waves)
    severity = None
    if 1 <= whole <= p["max_full_waves"] and partial > 1e-6:
        kind = "tail"
        idle = (1 - partial) / (whole + 1)  # idle share of the last wave, as a share of the kernel
        what = (f"{r.waves:.2f} waves: {whole} full wave(s) then one {pct(partial)} full, so about "
                f"{pct(idle)} of the kernel's time leaves SMs idle in the tail")
    elif whole == 0 and r.waves < p["max_small_grid_waves"]:
        kind = "small grid"
        grid = f"grid of {int(r.grid_blocks)} blocks" if r.grid_blocks == r.grid_blocks else "grid"
        known = r.grid_blocks == r.grid_blocks and r.sm_count == r.sm_count
        # waves = blocks / (SMs x blocks per SM): a grid of at least a block per SM has
        # waves x blocks per SM >= 1, which ncu's printed waves say without the SM count
        if not known and r.grid_blocks == r.grid_blocks and r.blocks_per_sm == r.blocks_per_sm \
                and r.waves * r.blocks_per_sm >= 1:
            known = True
        if known and r.grid_blocks < r.sm_count:
            idle = (r.sm_count - r.grid_blocks) / r.sm_count  # NVIDIA's Small Grid estimate: idle SMs
            what = (f"{grid} on {int(r.sm_count)} SMs leaves {pct(idle)} of the SMs idle "
                    f"({_waves(r.waves)} of one wave: {per_wave}): the GPU is under-filled")
        else:  # no SM known idle: the shortfall is resident warps per SM, which B002 measures
            idle, severity = None, "info"
            fact = ("every SM gets a block, but fewer than fit: the SMs are under-filled (see B002 for the "
                    "occupancy)" if known else
                    "the SM count is unknown, so whether SMs sit idle cannot be told: the GPU may be under-filled")
            what = f"{grid} fills {_waves(r.waves)} of one wave ({per_wave}): {fact}"
    else:
        return None
    if idle is not None and whole >= 1 and idle < p["min_wasted_share"]:
        return None
    # A kernel already near its memory or compute roof loses little to idle SMs: the busy SMs
    # saturate the shared unit anyway. Only the headroom below the busier roof can be won.
    sol = max((x for x in (r.sm_sol, r.memory_sol) if x == x), default=None)
    headroom = None if sol is None else max(0.0, 1 - sol)
    wasted = None if idle is None else idle * (1 if headroom is None else headroom)
    if headroom is not None and idle is not None:
        what += f"; at {pct(sol)} of its busiest roof, {pct(wasted)} of its time can be won"
        if wasted < p["min_wasted_share"]:
            severity = "info"
    loss = None if r.total_ns != r.total_ns or wasted is None else int(r.total_ns * wasted)
    short = launch_sized(r.total_ns, r.launches, p["short_kernel_ns"])
    if short:
        # the estimate assumes the work scales with busy SMs; a launch this short is mostly the
        # fixed cost of starting a kernel, which more blocks do not shorten: no estimate
        what += f"; {short}, which more blocks do not shorten (no loss estimated)"
        loss, severity = None, "info"
    return {"row": r, "kind": kind, "what": what, "per_wave": per_wave, "whole": whole, "partial": partial,
            "idle": idle, "headroom": headroom, "sol": sol, "wasted": wasted, "loss": loss, "severity": severity}


def _waves(w: float) -> str:
    if w == 0:  # ncu printed 0.00 and nothing else is known
        return "under 0.5%"
    return pct(w) if w >= 0.001 else f"{w * 100:.2g}%"


def _finding(configs: list[dict], p: dict) -> dict:
    """One finding per kernel: its worst configuration described, every one in the evidence."""
    worst = max(configs, key=lambda c: (-1 if c["loss"] is None else c["loss"], c["idle"] or 0))
    r = worst["row"]
    losses = [c["loss"] for c in configs if c["loss"] is not None]
    loss = sum(losses) if losses else None
    launches = int(sum(c["row"].launches for c in configs))
    severity = None if any(c["severity"] is None for c in configs) else "info"
    message = f"{kernel_label(r.name, r.short_name)}: {worst['what']}"
    if len(configs) > 1:
        message += f" (the worst of {len(configs)} launch configurations with a tail or small grid)"
    if loss is not None:
        message += f"; {launches} launch(es), est. {ns(loss)} lost"
        total = sum(c["row"].total_ns for c in configs if c["loss"] is not None)
        message += f"; {loss_bound(total, 'the kernel ran')}"
    else:
        message += f"; {launches} launch(es)"
    hint = library_hint(library_of(r), "grid", r.name)
    if hint is None and worst["kind"] == "tail":
        hint = (f"Make the grid a multiple of SMs x resident blocks per SM ({worst['per_wave']}): "
                "resize the tiles, or use a persistent-thread/stream-K loop so the last wave is full.")
    elif hint is None:
        hint = ("Expose more parallelism: smaller blocks or tiles (more of them), split-K, or batch this work "
                "with other kernels / run it concurrently on another stream.")
    total_ns = sum(c["row"].total_ns for c in configs if c["row"].total_ns == c["row"].total_ns)
    shares = [c["row"].time_share for c in configs if c["row"].time_share == c["row"].time_share]
    # start/end stay floats (NaN when unknown): None would not mix with the SQL rules' nullable integers
    return {
        "device_id": r.device_id, "item_kind": "kernel", "item_id": r.first_id, "item_name": r.name,
        "start_ns": r.first_start_ns, "end_ns": r.first_end_ns,
        "value": r.waves, "value_unit": "waves",
        "threshold": p["min_wasted_share"] if worst["whole"] >= 1 else p["max_small_grid_waves"],
        "est_loss_ns": loss, "severity": severity,
        "message": message,
        "hint": hint,
        "evidence": {"waves": r.waves, "full_waves": worst["whole"], "last_wave_fill": worst["partial"],
                     "idle_share": worst["idle"], "headroom_share": worst["headroom"],
                     "sm_sol": None if r.sm_sol != r.sm_sol else r.sm_sol,
                     "memory_sol": None if r.memory_sol != r.memory_sol else r.memory_sol,
                     "wasted_share": worst["wasted"], "grid_blocks": r.grid_blocks,
                     "threads_per_block": r.threads_per_block,
                     "blocks_per_sm": r.blocks_per_sm, "sm_count": r.sm_count, "limiter": r.limiter,
                     "launches": launches, "total_ns": total_ns if shares or total_ns else None,
                     "time_share": sum(shares) if shares else None,
                     "waves_source": r.waves_source, "occupancy_source": r.source,
                     "library": library_of(r),
                     "configurations": [_config_evidence(c) for c in configs]},
    }


def _config_evidence(c: dict) -> dict:
    r = c["row"]
    return {"grid_blocks": int_or_none(r.grid_blocks), "threads_per_block": int_or_none(r.threads_per_block),
            "registers_per_thread": int_or_none(r.registers_per_thread), "waves": r.waves, "kind": c["kind"],
            "launches": int(r.launches), "total_ns": int_or_none(r.total_ns), "wasted_share": c["wasted"],
            "est_loss_ns": c["loss"], "first_id": int_or_none(r.first_id)}


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class B001Configuration(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    est_loss_ns: Annotated[Optional[int], doc("estimated loss of this configuration")]
    first_id: Annotated[Optional[int], doc("id of the configuration's first launch")]
    grid_blocks: Annotated[Optional[int], doc("blocks in the grid")]
    kind: Annotated[str, doc("`tail` (a partly filled last wave) or `small` (a grid under one wave)")]
    launches: Annotated[int, doc("launches")]
    registers_per_thread: Annotated[Optional[int], doc("registers per thread")]
    threads_per_block: Annotated[Optional[int], doc("threads per block")]
    total_ns: Annotated[Optional[int], doc("the configuration's time, all its launches")]
    wasted_share: Annotated[Optional[float], doc("share of the kernel's SM time wasted in the last wave")]
    waves: Annotated[float, doc("waves of blocks over the SMs")]


class B001Evidence(KernelEvidence, kw_only=True, forbid_unknown_fields=True):
    blocks_per_sm: Annotated[float, doc("blocks resident per SM (occupancy calculator)")]
    configurations: Annotated[list[B001Configuration], doc("the kernel's launch configurations, worst first")]
    full_waves: Annotated[int, doc("whole waves of blocks")]
    grid_blocks: Annotated[float, doc("blocks in the grid")]
    headroom_share: Annotated[Optional[float], doc("share of the SMs' capacity left unused by the kernel's busiest unit")]
    idle_share: Annotated[Optional[float], doc("share of the SMs idle during the last wave")]
    last_wave_fill: Annotated[float, doc("share of the last wave's SM slots filled")]
    launches: Annotated[int, doc("launches")]
    library: Annotated[str, doc("the library the kernel comes from")]
    # NaN where the kernel's row names no limiter: the rule writes pandas' missing value as it is
    limiter: Annotated[Union[str, float], doc("what limits the blocks per SM (registers, shared memory, warps, blocks); NaN where unknown")]
    memory_sol: Annotated[Optional[float], doc("memory Speed-of-Light throughput, % of peak")]
    occupancy_source: Annotated[str, doc("where the occupancy figures come from")]
    sm_count: Annotated[float, doc("SMs on the device")]
    sm_sol: Annotated[Optional[float], doc("SM Speed-of-Light throughput, % of peak")]
    threads_per_block: Annotated[float, doc("threads per block")]
    time_share: Annotated[Optional[float], doc("share of the run's kernel time")]
    total_ns: Annotated[Optional[float], doc("the kernel's time, all launches")]
    wasted_share: Annotated[Optional[float], doc("share of the kernel's SM time wasted in the last wave")]
    waves: Annotated[float, doc("waves of blocks over the SMs")]
    waves_source: Annotated[str, doc("where the wave count comes from")]


RULE = Rule(
    id="B001",
    evidence=B001Evidence,
    name="tail-waves",
    title="Partial last wave or under-filled GPU",
    phase="bottleneck",
    claims="compute",
    nvidia=(("LaunchConfiguration", r"wave|less than the GPU's"), ("SOLBottleneck", r"too small to fill")),
    severity="warning",
    max_severity="warning",
    severity_reason=UPPER_BOUND,
    what="Kernels whose grid ends in a partial wave that leaves many SMs idle, and grids too "
         "small for one full wave.",
    why="A GPU runs a grid in waves of SMs x resident blocks per SM. When the last wave is only "
        "partly full, the idle SMs wait for it to finish: with 1.1 waves almost half the "
        "kernel's time runs at a tenth of the machine. A grid under one wave never uses the "
        "whole GPU.",
    how="Waves = grid blocks / (SMs x resident blocks per SM). Resident blocks come from ncu "
        "(`launch__occupancy_limit_*`) or from the built-in occupancy calculator (block size, "
        "registers, shared memory, device limits from the trace or the compute-capability table); "
        "ncu's printed `launch__waves_per_multiprocessor` (two decimals: 0.003 waves prints 0.00) "
        "only when the grid or the limits are unknown. Tail: with w full "
        "waves (1 <= w <= `max_full_waves`, NVIDIA's Tail Effect range: its bound 1 / (w + 1) "
        "reaches its 20% threshold only up to 4 full waves) and a last wave filled to f, the idle "
        "share is (1 - f) / (w + 1), tighter than NVIDIA's 1 / (w + 1), which ignores how full the "
        "last wave is. Small grid (under `max_small_grid_waves` waves): with fewer blocks than SMs "
        "the idle share is (SMs - blocks) / SMs, NVIDIA's Small Grid estimate (so 20 blocks on 68 "
        "SMs lose 70.6%, not 1 - waves); with a block on every SM no SM is idle, the shortfall is "
        "resident warps per SM (B002 measures it): an info finding without an estimate. Headroom: "
        "with ncu's Speed Of Light the idle share is scaled by 1 - max(compute SOL, memory SOL) "
        "(`sm__throughput`, `gpu__compute_memory_throughput` % of peak): a kernel at its memory or "
        "compute roof gains little from busier SMs. Without SOL (Nsight Systems, Kineto) the "
        "estimate is not scaled: an upper bound that assumes work scales with busy SMs. A tail "
        "is reported when its idle share reaches `min_wasted_share`, as info when the scaled share "
        "does not; the estimated loss is the scaled share x the kernel's time. Without an SM count "
        "(2019-2020 details pages) a grid under one wave is info without an estimate, and so is a "
        "configuration whose launches average under `short_kernel_ns`: mostly the fixed cost of starting "
        "a kernel, which no grid shortens. One finding per "
        "kernel: its launch configurations with a tail or small grid are listed in "
        "`evidence.configurations`, the worst described, their losses summed; kernels under "
        "`min_time_share` of the run's kernel time are skipped. Collectives (NCCL/RCCL, custom "
        "all-reduce kernels) are T007's: their grid is the channel count, not a tiling choice. For a "
        "library kernel (`kernels.library`: cuBLAS, cuDNN, ...) the hint names what the caller can "
        "change (shape, batching, dtype, algorithm choice), never tile sizes." + " " + LAUNCHER_HOW,
    fix="Size grids to whole waves (tile size, blocks per SM), use persistent kernels or "
        "stream-K style scheduling, or run small kernels concurrently.",
    requires="kernel grid and block sizes with registers and shared memory per thread/block (or ncu launch metrics)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM kernels WHERE run_id = $run_id AND (grid_x IS NOT NULL OR kernel_id IN "
                "(SELECT kernel_id FROM kernel_metrics WHERE run_id = $run_id AND metric_id IN "
                "('launch__grid_size', 'launch__waves_per_multiprocessor'))))",
    thresholds=(
        Threshold("min_wasted_share", 0.1, "Idle share of the kernel in its partial last wave that is reported (as info when, scaled by SOL headroom, it is under this)."),
        Threshold("max_full_waves", 4, "Tails after more full waves than this are not reported (NVIDIA's Tail Effect: 4)."),
        Threshold("max_small_grid_waves", 1.0, "Grids under this many waves are reported as under-filled."),
        Threshold("min_time_share", 0.01, "Kernels under this share of the run's kernel time are skipped (when timed)."),
        Threshold("short_kernel_ns", 5_000, "A configuration whose launches take less than this on average is info "
                  "without an estimate: such a launch is mostly the fixed cost of starting a kernel (a few "
                  "microseconds), which a bigger grid does not shorten, so the estimate (work scaling with busy "
                  "SMs) does not hold."),
    ),
    evaluate=evaluate,
    references=(
        "Nsight Compute LaunchConfiguration rule: 'Tail Effect' (1/(w+1) >= 20%) and 'Small Grid' ((SMs - grid) / SMs)",
        "Nsight Compute SOLBottleneck rule: 'Small Grid' (waves < 1)",
        "NVIDIA Deep Learning Performance Guide: 'Wave Quantization'",
    ),
)
