"""Kernel launch configurations of a run with their occupancy, shared by the bottleneck rules.

Launches are grouped by (device, kernel, grid, block, registers, shared memory) in SQL, so
a million launches cost one occupancy computation per distinct configuration. ncu's own
values (waves, theoretical/achieved occupancy, block limits) are kept beside the
calculator's, and the rules prefer them: they are measured on the real device. On a timeline
run linked to an ncu run they are the linked launches' (`_ncu.RUN_METRICS_SQL`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..devices.occupancy import occupancy_table
from ..fmt import ns
from ..store import Store, run_cache
from ._ncu import RUN_METRICS_SQL

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

_NCU = {
    "waves_per_multiprocessor": "launch__waves_per_multiprocessor",
    "theoretical_pct": "sm__maximum_warps_per_active_cycle_pct",
    "achieved_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "sm_count": "launch__sm_count",
    "limit_blocks": "launch__occupancy_limit_blocks",
    "limit_registers": "launch__occupancy_limit_registers",
    "limit_shared_mem": "launch__occupancy_limit_shared_mem",
    "limit_warps": "launch__occupancy_limit_warps",
    "limit_barriers": "launch__occupancy_limit_barriers",
    "shared_mem_config": "launch__shared_mem_config_size",  # the carveout the launch ran with
    "sm_sol_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_sol_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    # parts of sm__throughput (the max of the SM's sub-throughputs), where a report has them alone
    "sm_instruction_pct": "sm__instruction_throughput.avg.pct_of_peak_sustained_elapsed",
    "tensor_pipe_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
}
# Achieved occupancy above theoretical cannot happen; some ncu versions print such values (up
# to 172%). Launches more than this many points above their theoretical (or above 100%) are
# left out of the achieved mean and counted apart.
ACHIEVED_SLACK_PCT = 1.0
_POSSIBLE = (f"ncu_achieved_pct <= least(coalesce(ncu_theoretical_pct, 100), 100) + {ACHIEVED_SLACK_PCT}")
_MEANS = {k: f"avg(ncu_{k})" for k in _NCU}
_MEANS["achieved_pct"] = f"avg(ncu_achieved_pct) FILTER (WHERE {_POSSIBLE})"
_PIVOT = ",\n           ".join(f"max(value) FILTER (WHERE metric_id = '{m}') AS ncu_{k}" for k, m in _NCU.items())

GROUPS_SQL = f"""
WITH m AS (
    SELECT kernel_id,
           {_PIVOT}
    FROM {RUN_METRICS_SQL} GROUP BY kernel_id
), k AS (  -- each kernel's time from kernel_durations (the timeline's, or ncu's measured one)
    SELECT k.*, m.* EXCLUDE (kernel_id),
           coalesce(k.grid_x::BIGINT * coalesce(k.grid_y, 1) * coalesce(k.grid_z, 1), m.ncu_grid_size) AS grid_blocks,
           coalesce(k.block_x * coalesce(k.block_y, 1) * coalesce(k.block_z, 1), m.ncu_block_size) AS threads_per_block
    FROM kernel_durations k LEFT JOIN m USING (kernel_id) WHERE k.run_id = $run_id
)
SELECT device_id, name, any_value(coalesce(short_name, name)) AS short_name, any_value(library) AS library,
       grid_blocks, threads_per_block, registers_per_thread,
       static_shared_mem_bytes, dynamic_shared_mem_bytes,
       count(*) AS launches, min(kernel_id) AS first_id,
       sum(duration_ns) AS total_ns, count(duration_ns) AS timed_launches,
       arg_min(start_ns, kernel_id) AS first_start_ns, arg_min(end_ns, kernel_id) AS first_end_ns,
       avg(est_achieved_occupancy_pct) AS kineto_achieved_pct,
       count(ncu_achieved_pct) FILTER (WHERE NOT ({_POSSIBLE})) AS ncu_achieved_impossible,
       max(ncu_achieved_pct) FILTER (WHERE NOT ({_POSSIBLE})) AS ncu_achieved_impossible_max_pct,
       {", ".join(f"{mean} AS ncu_{k}" for k, mean in _MEANS.items())}
FROM k
GROUP BY device_id, name, grid_blocks, threads_per_block, registers_per_thread,
         static_shared_mem_bytes, dynamic_shared_mem_bytes
-- one order whatever the threads did: the rules' findings come out in it
ORDER BY device_id NULLS LAST, name, grid_blocks NULLS LAST, threads_per_block NULLS LAST,
         registers_per_thread NULLS LAST, static_shared_mem_bytes NULLS LAST, dynamic_shared_mem_bytes NULLS LAST
"""


def launch_groups(store: Store, run_id: str) -> pd.DataFrame:
    """One row per launch configuration, with device limits, occupancy and waves.

    Columns added: `library` (`kernels.library`), `time_share` (of the run's kernel time, NULL without durations),
    `blocks_per_sm`, `theoretical`, `kineto_achieved` (Kineto's estimate, 0..1), `achieved` (0..1, the mean over launches whose achieved
    occupancy is possible: see ACHIEVED_SLACK_PCT), `achieved_impossible` (launches left out of
    that mean) and `achieved_impossible_max`, `sm_sol` and `memory_sol` (ncu's Speed Of Light
    shares, 0..1, NaN without ncu), `sm_sol_floor` (`sm_sol`, else a lower bound of it from the SM's parts a
    report measured: instruction throughput, tensor pipe), `limiter`, `waves` (grid blocks / (SMs x blocks per SM),
    else ncu's printed value) with `waves_source`, and `source` (`ncu` when ncu measured
    the occupancy values, else `calculator`). Callers get a copy.

    Several rules (B001, B002, T005) read the same groups: in the run's rules pass they are
    computed once, kept in the pass's run cache (`Store.run_cache`); elsewhere, each call computes.
    """
    return run_cache.memo_for(store.run_cache, run_id, "launch_groups", lambda: _launch_groups(store, run_id)).copy()


def _launch_groups(store: Store, run_id: str) -> pd.DataFrame:
    groups = store.sql(GROUPS_SQL, {"run_id": run_id}).df()
    if groups.empty:
        return groups
    devices = store.sql("SELECT * EXCLUDE (run_id, name) FROM devices WHERE run_id = ?", [run_id]).df()
    df = groups.merge(devices, on="device_id", how="left") if not devices.empty else groups
    if "sm_count" not in df.columns:
        df["sm_count"] = np.nan
    df["sm_count"] = df["sm_count"].fillna(df["ncu_sm_count"])
    occ = _plain(occupancy_table(df.assign(block_x=df["threads_per_block"], block_y=1, block_z=1,
                                           grid_x=df["grid_blocks"], grid_y=1, grid_z=1)))
    # Times since the epoch (~1.8e18 ns) are held as Python ints: float64 steps by 256 ns there.
    times = {c: df[c].astype(object).where(df[c].notna(), np.nan) for c in ("first_start_ns", "first_end_ns")}
    df = _plain(df).assign(**times)
    total = df["total_ns"].sum(min_count=1)
    out = df[["device_id", "name", "short_name", "library", "grid_blocks", "threads_per_block", "registers_per_thread",
              "static_shared_mem_bytes", "dynamic_shared_mem_bytes", "launches", "first_id", "total_ns",
              "first_start_ns", "first_end_ns", "sm_count"]].copy()
    out["warp_size"] = df["warp_size"] if "warp_size" in df.columns else np.nan
    out["time_share"] = df["total_ns"] / total if total and total > 0 else np.nan
    ncu_limits = df[[f"ncu_limit_{x}" for x in ("blocks", "registers", "shared_mem", "warps", "barriers")]]
    has_ncu = ncu_limits.notna().any(axis=1)
    out["blocks_per_sm"] = ncu_limits.min(axis=1).where(has_ncu, occ["blocks_per_sm"])
    shared = df["static_shared_mem_bytes"].fillna(0) + df["dynamic_shared_mem_bytes"].fillna(0)
    shared_known = df["static_shared_mem_bytes"].notna() | df["dynamic_shared_mem_bytes"].notna()
    out["limiter"] = np.where(has_ncu, _ncu_limiter(ncu_limits, (shared == 0) & shared_known),
                              occ["limiter"].astype(object))
    out["theoretical"] = (df["ncu_theoretical_pct"] / 100).fillna(occ["theoretical_occupancy"])
    out["achieved"] = (df["ncu_achieved_pct"] / 100).fillna(df["kineto_achieved_pct"] / 100)
    out["achieved_source"] = np.where(df["ncu_achieved_pct"].notna(), "ncu",
                                      np.where(df["kineto_achieved_pct"].notna(), "kineto-estimate", None))
    out["kineto_achieved"] = df["kineto_achieved_pct"] / 100
    out["achieved_impossible"] = df["ncu_achieved_impossible"]
    out["achieved_impossible_max"] = df["ncu_achieved_impossible_max_pct"] / 100
    out["sm_sol"] = df["ncu_sm_sol_pct"] / 100
    # sm__throughput is the busiest of the SM's sub-throughputs: where a report has only some of
    # them (a --metrics list), the busiest of those is a lower bound of it (`sm_sol_floor`)
    out["sm_sol_floor"] = out["sm_sol"].fillna(df[["ncu_sm_instruction_pct", "ncu_tensor_pipe_pct"]].max(axis=1) / 100)
    out["memory_sol"] = df["ncu_memory_sol_pct"] / 100
    # Waves from the launch whenever it is known: ncu prints two decimals (0.003 waves reads 0.00).
    calc_waves = df["grid_blocks"] / (out["blocks_per_sm"] * out["sm_count"]).where(lambda s: s > 0)
    out["waves"] = calc_waves.fillna(df["ncu_waves_per_multiprocessor"])
    out["waves_source"] = np.where(calc_waves.notna(), "grid / (SMs x blocks per SM)",
                                   np.where(df["ncu_waves_per_multiprocessor"].notna(), "ncu Waves Per SM", None))
    out["source"] = np.where(df["ncu_theoretical_pct"].notna() | has_ncu, "ncu", "calculator")
    # the shared-memory carveout the launches ran with (ncu), and the SM's largest
    out["shared_mem_config_bytes"] = df["ncu_shared_mem_config"]
    out["shared_mem_per_sm_bytes"] = df["shared_mem_per_sm_bytes"] if "shared_mem_per_sm_bytes" in df.columns else np.nan
    return _plain(out)


def configurations_by_kernel(g: pd.DataFrame, configure, min_time_share: float) -> list[list]:
    """Per kernel (device, name) of the launch groups `g`, what `configure(row)` made of each of its
    configurations (None: nothing), kernels under `min_time_share` of the run's kernel time (when
    timed) left out: the rules that give one finding per kernel build it from these."""
    if "time_share" in g and len(g):
        share = g.groupby(["device_id", "name"], dropna=False)["time_share"].transform("sum", min_count=1)
        g = g[share.isna() | (share >= min_time_share)]
    by_kernel: dict[tuple, list] = {}
    for r in g.itertuples():
        c = configure(r)
        if c is not None:
            by_kernel.setdefault((r.device_id, r.name), []).append(c)
    return list(by_kernel.values())


def launch_sized(total_ns, launches, short_kernel_ns: float) -> str | None:
    """'at 3.17 us a launch, mostly the fixed cost of starting a kernel' where a kernel's launches
    average under `short_kernel_ns`: more blocks, more resident warps or a nearer roof do not
    shorten that cost, so the bottleneck rules estimate no loss for it. None otherwise, or
    without a time (None or NaN)."""
    if total_ns is None or total_ns != total_ns or not launches:
        return None
    mean_ns = total_ns / launches
    return f"at {ns(mean_ns)} a launch, mostly the fixed cost of starting a kernel" if mean_ns < short_kernel_ns else None


def int_or_none(x):
    """A DataFrame cell as an int for a finding (None for NULL/NaN)."""
    return None if x is None or x != x else int(x)


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """Nullable pandas dtypes -> float64 / object with NaN, so rules can test `x == x`."""
    import pandas as pd

    df = df.copy()
    for c in df.columns:
        if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]):
            df[c] = df[c].to_numpy(dtype="float64", na_value=np.nan)
        elif isinstance(df[c].dtype, pd.api.extensions.ExtensionDtype):
            df[c] = df[c].astype(object).where(df[c].notna(), np.nan)
    return df


def _ncu_limiter(limits: pd.DataFrame, no_shared_mem: pd.Series) -> np.ndarray:
    """The limits that bind, among the resources the kernel uses. ncu prints the block cap as the
    limit of a resource a kernel does not use (a kernel without shared memory shows its shared
    memory limit equal to the block limit), and a barrier limit capped at the block cap: those
    bind only when nothing else does."""
    names = [c.removeprefix("ncu_limit_") for c in limits.columns]
    lowest = limits.min(axis=1)
    out = []
    for row, low, unused_smem in zip(limits.itertuples(index=False), lowest, no_shared_mem):
        if low != low:
            out.append(None)
            continue
        binding = [n for n, v in zip(names, row) if v == low]
        used = [n for n in binding if not (n == "shared_mem" and unused_smem) and n != "barriers"]
        out.append("+".join(used or binding))
    return np.array(out, dtype=object)
