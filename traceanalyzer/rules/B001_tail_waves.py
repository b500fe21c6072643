"""B001 tail waves: a partial last wave, or a grid too small to fill the GPU."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..fmt import ns, pct
from ._launches import int_or_none as _int, launch_groups
from .base import Rule, Threshold

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    g = launch_groups(store, run_id)
    if g.empty:
        return g
    g = g[g["waves"].notna() & (g["waves"] > 0)]
    if "time_share" in g:  # when durations are known, skip kernels that barely run
        g = g[g["time_share"].isna() | (g["time_share"] >= p["min_time_share"])]
    rows = []
    for r in g.itertuples():
        per_wave = (f"{int(r.sm_count)} SMs x {int(r.blocks_per_sm)} blocks/SM = "
                    f"{int(r.sm_count * r.blocks_per_sm)} blocks per wave"
                    if r.sm_count == r.sm_count and r.blocks_per_sm == r.blocks_per_sm else "blocks per wave unknown")
        whole, partial = math.floor(r.waves), r.waves - math.floor(r.waves)
        if whole >= 1 and partial > 1e-6:
            wasted = (1 - partial) / (whole + 1)  # idle share of the last wave, as a share of the kernel
            if wasted < p["min_wasted_share"]:
                continue
            what = (f"{r.waves:.2f} waves: {whole} full wave(s) then one {pct(partial)} full, so about "
                    f"{pct(wasted)} of the kernel's time leaves SMs idle in the tail")
            hint = (f"Make the grid a multiple of SMs x resident blocks per SM ({per_wave}): "
                    "resize the tiles, or use a persistent-thread/stream-K loop so the last wave is full.")
        elif whole == 0 and r.waves < p["max_small_grid_waves"]:
            wasted = 1 - r.waves
            grid = f"grid of {int(r.grid_blocks)} blocks" if r.grid_blocks == r.grid_blocks else "grid"
            what = f"{grid} fills {pct(r.waves)} of one wave ({per_wave}): the GPU is under-filled"
            hint = ("Expose more parallelism: smaller blocks or tiles (more of them), split-K, or batch this work "
                    "with other kernels / run it concurrently on another stream.")
        else:
            continue
        loss = None if r.total_ns != r.total_ns else int(r.total_ns * wasted)
        rows.append({
            "device_id": r.device_id, "item_kind": "kernel", "item_id": r.first_id, "item_name": r.name,
            "start_ns": _int(r.first_start_ns), "end_ns": _int(r.first_end_ns),
            "value": r.waves, "value_unit": "waves",
            "threshold": p["min_wasted_share"] if whole >= 1 else p["max_small_grid_waves"],
            "est_loss_ns": loss,
            "message": f"{r.short_name}: {what}"
                       + (f"; {int(r.launches)} launch(es), est. {ns(loss)} lost" if loss is not None else ""),
            "hint": hint,
            "evidence": {"waves": r.waves, "full_waves": whole, "last_wave_fill": partial,
                         "wasted_share": wasted, "grid_blocks": r.grid_blocks, "threads_per_block": r.threads_per_block,
                         "blocks_per_sm": r.blocks_per_sm, "sm_count": r.sm_count, "limiter": r.limiter,
                         "launches": r.launches, "total_ns": None if r.total_ns != r.total_ns else r.total_ns,
                         "time_share": None if r.time_share != r.time_share else r.time_share,
                         "waves_source": r.source},
        })
    return pd.DataFrame(rows)


RULE = Rule(
    id="B001",
    name="tail-waves",
    title="Partial last wave or under-filled GPU",
    phase="bottleneck",
    claims="compute",
    severity="warning",
    what="Kernels whose grid ends in a partial wave that leaves many SMs idle, and grids too "
         "small for one full wave.",
    why="A GPU runs a grid in waves of SMs x resident blocks per SM. When the last wave is only "
        "partly full, the idle SMs wait for it to finish: with 1.1 waves almost half the "
        "kernel's time runs at a tenth of the machine. A grid under one wave never uses the "
        "whole GPU.",
    how="Waves = grid blocks / (SMs x resident blocks per SM). Resident blocks come from ncu "
        "(`launch__occupancy_limit_*`, and ncu's own `launch__waves_per_multiprocessor` when "
        "present) or from the built-in occupancy calculator (block size, registers, shared "
        "memory, device limits from the trace or the compute-capability table). With w full "
        "waves and a last wave filled to f, the idle share of the kernel is (1 - f) / (w + 1); "
        "the estimated loss is that share x the kernel's time. Grids under `max_small_grid_waves` "
        "waves lose (1 - waves) x time at most. Launches are grouped by kernel and configuration; "
        "groups under `min_time_share` of the run's kernel time are skipped.",
    fix="Size grids to whole waves (tile size, blocks per SM), use persistent kernels or "
        "stream-K style scheduling, or run small kernels concurrently.",
    requires="kernel grid and block sizes with registers and shared memory per thread/block (or ncu launch metrics)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM kernels WHERE run_id = $run_id AND (grid_x IS NOT NULL OR kernel_id IN "
                "(SELECT kernel_id FROM kernel_metrics WHERE run_id = $run_id AND metric_id IN "
                "('launch__grid_size', 'launch__waves_per_multiprocessor'))))",
    thresholds=(
        Threshold("min_wasted_share", 0.1, "Idle share of the kernel in its partial last wave that is reported."),
        Threshold("max_small_grid_waves", 1.0, "Grids under this many waves are reported as under-filled."),
        Threshold("min_time_share", 0.01, "Kernels under this share of the run's kernel time are skipped (when timed)."),
    ),
    evaluate=evaluate,
    references=(
        "Nsight Compute LaunchStats rules 'Tail Effect' and SpeedOfLight 'Small Grid' (NVIDIA flags 1/(w+1) >= 20%)",
        "NVIDIA Deep Learning Performance Guide: 'Wave Quantization'",
    ),
)
