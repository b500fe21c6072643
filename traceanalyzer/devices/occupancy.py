"""Theoretical occupancy: how many blocks of a kernel fit on one SM, and what binds.

A reimplementation of the logic of NVIDIA's ``cuda_occupancy.h`` (read, not copied):

* warps: ``floor(max_warps_per_sm / ceil(threads / 32))``; 0 when the block is too large;
* blocks: the CC's resident-block cap;
* registers: a warp gets ``ceil(regs * 32 / 256) * 256`` registers; the register file is
  split over 4 sub-partitions, so an SM holds ``floor(regs_per_sm / 4 / regs_per_warp) * 4``
  warps; 0 when the block exceeds the per-block register file (checked as the hardware
  does, with warps rounded up to a multiple of 4) or a thread uses more than 255;
  unlimited for 0 registers;
* shared memory: a block takes ``static + dynamic + reserved`` (1 KB on CC >= 8.0)
  rounded up to 128 B (256 B before 8.0); the SM offers the carveout (by default the
  largest, as ``cudaOccDeviceState``'s default preference does; a smaller requested
  carveout is raised to the next step when one block does not fit); 0 when the block
  exceeds the per-block limit (opt-in maximum by default; Kineto uses the 48 KB default
  limit, see ``opt_in_shared_mem``); unlimited for 0 bytes;
* barriers (CC >= 9.0, only when the barrier count is given): ``2 * block cap / barriers``,
  capped at the block cap as Nsight Compute reports it.

Every function works on many kernels at once with numpy; ``occupancy`` is the one-kernel
wrapper. Verified against Kineto's ``est. achieved occupancy %`` and Nsight Compute's
``Block Limit *`` / ``Theoretical Occupancy`` / ``Waves Per SM`` in real traces
(``tests/test_occupancy.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .gpu import CC_LIMITS, LIMIT_COLUMNS, CCLimits, effective_limits

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

UNLIMITED = 2**31 - 1  # cuda_occupancy.h reports an unused resource as INT_MAX

LIMIT_NAMES = ("blocks", "warps", "registers", "shared_mem", "barriers")


@dataclass(frozen=True)
class Occupancy:
    """Result for one kernel launch. Limits are blocks per SM; None = not limiting at all
    (the kernel uses none of that resource)."""

    blocks_per_sm: int
    limit_blocks: int
    limit_warps: int
    limit_registers: int | None
    limit_shared_mem: int | None
    limit_barriers: int | None
    limiter: str  # binding limit(s) joined by '+', e.g. 'registers' or 'warps+registers'
    warps_per_block: int
    active_warps_per_sm: int
    theoretical_occupancy: float  # 0..1
    shared_mem_per_block_bytes: int  # allocated: static + dynamic + reserved, rounded up
    shared_mem_config_bytes: int | None  # smallest carveout step holding blocks_per_sm blocks


def _ceil_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return -(-a // b)


def _round_up(a: np.ndarray, unit: np.ndarray) -> np.ndarray:
    return _ceil_div(a, unit) * unit


def _align_to_step(size: np.ndarray, cc_major: np.ndarray, cc_minor: np.ndarray) -> np.ndarray:
    """Smallest carveout step of each row's CC that is >= size (the largest if none is)."""
    out = size.copy()
    for (major, minor) in set(zip(cc_major.tolist(), cc_minor.tolist())):
        limits = CC_LIMITS.get((major, minor))
        if limits is None:
            continue
        rows = (cc_major == major) & (cc_minor == minor)
        steps = np.asarray(limits.carveout_steps_bytes, dtype=np.int64)
        idx = np.minimum(np.searchsorted(steps, size[rows], side="left"), len(steps) - 1)
        out[rows] = steps[idx]
    return out


def compute(
    threads_per_block: np.ndarray,
    registers_per_thread: np.ndarray,
    shared_mem_bytes: np.ndarray,
    dev: dict[str, np.ndarray],
    *,
    carveout_bytes: np.ndarray | None = None,
    barriers_per_block: np.ndarray | None = None,
    opt_in_shared_mem: bool = True,
) -> dict[str, np.ndarray]:
    """The calculator on int64 arrays (one element per launch). ``dev`` holds one array per
    ``CCLimits`` field (``major``, ``minor``, ``max_warps_per_sm``, ...). Returns arrays;
    unlimited limits are ``UNLIMITED``."""
    T = threads_per_block.astype(np.int64)
    R = registers_per_thread.astype(np.int64)
    S = shared_mem_bytes.astype(np.int64)
    warp_size = dev["warp_size"]
    W = np.maximum(_ceil_div(T, warp_size), 1)

    limit_warps = np.where(T > dev["max_threads_per_block"], 0, dev["max_warps_per_sm"] // W)
    limit_blocks = dev["max_blocks_per_sm"].astype(np.int64)

    regs_per_warp = _round_up(R * warp_size, dev["register_alloc_unit"])
    regs_hw_check = regs_per_warp * _round_up(W, dev["warp_alloc_granularity"])
    regs_fail = (
        (regs_hw_check > dev["max_registers_per_block"])
        | (regs_per_warp * W > dev["max_registers_per_block"])
        | (R > dev["max_registers_per_thread"])
    )
    safe_rpw = np.maximum(regs_per_warp, 1)
    warps_by_regs = (dev["registers_per_sm"] // dev["sub_partitions"]) // safe_rpw * dev["sub_partitions"]
    limit_registers = np.where(regs_fail, 0, np.where(regs_per_warp == 0, UNLIMITED, warps_by_regs // W))

    reserved = dev["reserved_shared_mem_per_block_bytes"]
    smem_alloc = _round_up(S + reserved, dev["shared_mem_alloc_unit_bytes"])
    block_cap = dev["max_shared_mem_per_block_optin_bytes" if opt_in_shared_mem else "max_shared_mem_per_block_bytes"]
    smem_fail = smem_alloc > block_cap + reserved
    volta_plus = dev["major"] >= 7
    if carveout_bytes is None:
        preference = dev["shared_mem_per_sm_bytes"]
    else:  # a requested carveout becomes the next step the hardware has (Volta+)
        preference = carveout_bytes.astype(np.int64)
        preference = np.where(volta_plus, _align_to_step(preference, dev["major"], dev["minor"]), preference)
    # A carveout too small for one block is raised to the step that holds it (Volta+).
    raised = _align_to_step(smem_alloc, dev["major"], dev["minor"])
    smem_per_sm = np.where(preference >= smem_alloc, preference,
                           np.where(volta_plus, raised, dev["shared_mem_per_sm_bytes"]))
    limit_smem = np.where(smem_fail, 0, np.where(smem_alloc == 0, UNLIMITED, smem_per_sm // np.maximum(smem_alloc, 1)))

    if barriers_per_block is None:
        limit_barriers = np.full_like(limit_blocks, UNLIMITED)
    else:
        bars = barriers_per_block.astype(np.int64)
        uses = (bars > 0) & (dev["major"] >= 9)
        raw = (2 * limit_blocks) // np.maximum(bars, 1)
        limit_barriers = np.where(uses, np.minimum(raw, limit_blocks), UNLIMITED)

    limits = np.stack([limit_blocks, limit_warps, limit_registers, limit_smem, limit_barriers])
    blocks = limits.min(axis=0)
    binding = limits == blocks
    if barriers_per_block is not None:
        # A barrier limit that only equals the block cap because it was capped does not bind.
        binding[4] &= (2 * limit_blocks) // np.maximum(barriers_per_block.astype(np.int64), 1) == blocks
    limiter_code = (binding * (1 << np.arange(len(LIMIT_NAMES)))[:, None]).sum(axis=0)

    config = _align_to_step(blocks * smem_alloc, dev["major"], dev["minor"])
    config = np.where(volta_plus, config, dev["shared_mem_per_sm_bytes"])
    return {
        "threads_per_block": T,
        "warps_per_block": W,
        "limit_blocks": limit_blocks,
        "limit_warps": limit_warps,
        "limit_registers": limit_registers,
        "limit_shared_mem": limit_smem,
        "limit_barriers": limit_barriers,
        "blocks_per_sm": blocks,
        "limiter_code": limiter_code,
        "active_warps_per_sm": blocks * W,
        "theoretical_occupancy": blocks * W / dev["max_warps_per_sm"],
        "shared_mem_per_block_bytes": smem_alloc,
        "shared_mem_config_bytes": config,
    }


_LIMITER_TEXT = np.array(
    ["+".join(n for i, n in enumerate(LIMIT_NAMES) if code >> i & 1) for code in range(1 << len(LIMIT_NAMES))],
    dtype=object,
)


def limiter_text(codes: np.ndarray) -> np.ndarray:
    """Bit codes from ``compute`` as text ('registers', 'warps+registers', ...)."""
    return _LIMITER_TEXT[codes]


def _int_fields(limits: CCLimits) -> dict[str, int]:
    """The numeric fields of a ``CCLimits`` (everything ``compute`` reads)."""
    skip = ("confidence", "carveout_steps_bytes")
    return {f: getattr(limits, f) for f in limits.__dataclass_fields__ if f not in skip}


def _limits_arrays(limits: CCLimits, n: int) -> dict[str, np.ndarray]:
    return {k: np.full(n, v, dtype=np.int64) for k, v in _int_fields(limits).items()}


def occupancy(
    threads_per_block: int,
    registers_per_thread: int,
    static_smem_bytes: int,
    dynamic_smem_bytes: int,
    limits: CCLimits | dict[str, Any],
    smem_carveout_bytes: int | None = None,
    *,
    barriers_per_block: int | None = None,
    opt_in_shared_mem: bool = True,
) -> Occupancy:
    """Theoretical occupancy of one launch on a device (``CCLimits`` or a ``devices`` row).

    ``smem_carveout_bytes``: the shared-memory carveout to assume (e.g. ncu's
    ``launch__shared_mem_config_size``); None = the largest, the calculator's default.
    ``opt_in_shared_mem=False`` caps a block at the 48 KB default instead of the opt-in
    maximum, as Kineto's estimate does (it then reports 0 blocks for such kernels).
    """
    lim = effective_limits(limits)
    one = lambda v: np.array([v], dtype=np.int64)  # noqa: E731
    r = compute(
        one(threads_per_block), one(registers_per_thread), one(static_smem_bytes + dynamic_smem_bytes),
        _limits_arrays(lim, 1),
        carveout_bytes=None if smem_carveout_bytes is None else one(smem_carveout_bytes),
        barriers_per_block=None if barriers_per_block is None else one(barriers_per_block),
        opt_in_shared_mem=opt_in_shared_mem,
    )
    v = {k: a[0].item() for k, a in r.items()}
    opt = lambda x: None if x >= UNLIMITED else int(x)  # noqa: E731
    return Occupancy(
        blocks_per_sm=int(v["blocks_per_sm"]),
        limit_blocks=int(v["limit_blocks"]),
        limit_warps=int(v["limit_warps"]),
        limit_registers=opt(v["limit_registers"]),
        limit_shared_mem=opt(v["limit_shared_mem"]),
        limit_barriers=opt(v["limit_barriers"]),
        limiter=str(limiter_text(np.array([v["limiter_code"]]))[0]),
        warps_per_block=int(v["warps_per_block"]),
        active_warps_per_sm=int(v["active_warps_per_sm"]),
        theoretical_occupancy=float(v["theoretical_occupancy"]),
        shared_mem_per_block_bytes=int(v["shared_mem_per_block_bytes"]),
        shared_mem_config_bytes=None if v["blocks_per_sm"] == 0 else int(v["shared_mem_config_bytes"]),
    )


def waves(grid_blocks: float, blocks_per_sm: float, sm_count: float) -> float | None:
    """Full-device waves: grid / (resident blocks per SM x SMs); None when nothing fits."""
    if not blocks_per_sm or not sm_count:
        return None
    return grid_blocks / (blocks_per_sm * sm_count)


# ---------------------------------------------------------------------------------------
# Many kernels at once


def _column(df: pd.DataFrame, name: str) -> pd.Series:
    import pandas as pd

    if name in df.columns:
        return pd.to_numeric(df[name], errors="coerce").astype("Float64")
    return pd.Series(pd.NA, index=df.index, dtype="Float64")


def _cc_table() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame([_int_fields(lim) for lim in CC_LIMITS.values()])


def _device_arrays(df: pd.DataFrame) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per-row limits: the row's device columns where given, else its CC's table values.
    Also returns a mask of rows whose limits are complete."""
    import pandas as pd

    major, minor = _column(df, "compute_major"), _column(df, "compute_minor")
    keys = pd.DataFrame({"major": major, "minor": minor}, index=df.index)
    table = _cc_table().astype("Float64")
    merged = keys.merge(table, on=["major", "minor"], how="left").set_index(df.index)
    dev: dict[str, pd.Series] = {}
    for field in table.columns:
        series = merged[field]
        column = next((c for c, a in LIMIT_COLUMNS.items() if a == field), None)
        if column is not None and column in df.columns:
            series = _column(df, column).fillna(series)  # the trace's value wins
        dev[field] = series
    dev["major"], dev["minor"] = major, minor
    # The calculator is NVIDIA's: an AMD device's "computeMajor 9" is not CC 9.0.
    ok = np.ones(len(df), dtype=bool)
    if "vendor" in df.columns:
        ok &= df["vendor"].isna().to_numpy(dtype=bool) | (df["vendor"] == "nvidia").fillna(False).to_numpy(dtype=bool)
    for s in dev.values():
        ok &= s.notna().to_numpy()
    # Unknown rows get harmless placeholders (1) so the arithmetic stays defined; they are masked.
    return {k: s.fillna(1).to_numpy(dtype=np.int64) for k, s in dev.items()}, ok


def occupancy_table(
    kernels: pd.DataFrame | pa.Table | pa.RecordBatchReader,
    *,
    opt_in_shared_mem: bool = True,
    carveout_column: str | None = None,
    barriers_column: str | None = None,
) -> pd.DataFrame:
    """Occupancy for every row of a kernels table joined with its device's limits.

    ``kernels`` is a DataFrame, an Arrow table or a DuckDB relation's ``.arrow()``. Reads the
    ``kernels`` columns (``block_x/y/z`` or ``threads_per_block``,
    ``registers_per_thread``, ``static_shared_mem_bytes``, ``dynamic_shared_mem_bytes``,
    ``grid_x/y/z`` for waves) and ``devices`` columns (``compute_major``, ``compute_minor``,
    ``sm_count``, ``vendor`` and any limit column; NULL limits come from the CC table;
    non-NVIDIA rows get no result). Returns a
    DataFrame on the input's index with ``threads_per_block``, ``warps_per_block``,
    ``limit_*``, ``blocks_per_sm``, ``limiter``, ``active_warps_per_sm``,
    ``theoretical_occupancy``, ``shared_mem_per_block_bytes``, ``shared_mem_config_bytes``
    and ``waves``; all NULL for rows whose device or launch facts are unknown.
    """
    import pandas as pd

    if isinstance(kernels, pa.RecordBatchReader):  # what a DuckDB relation's .arrow() gives
        kernels = kernels.read_all()
    df = kernels.to_pandas() if isinstance(kernels, pa.Table) else kernels
    n = len(df)

    if "threads_per_block" in df.columns:
        threads = _column(df, "threads_per_block")
    else:
        threads = _column(df, "block_x") * _column(df, "block_y").fillna(1) * _column(df, "block_z").fillna(1)
    regs = _column(df, "registers_per_thread")
    static, dynamic = _column(df, "static_shared_mem_bytes"), _column(df, "dynamic_shared_mem_bytes")
    smem = static.fillna(0) + dynamic.fillna(0)
    launch_known = (threads.notna() & (threads > 0) & regs.notna() & (static.notna() | dynamic.notna())).to_numpy(dtype=bool)

    dev, dev_known = _device_arrays(df)
    ok = launch_known & dev_known
    carveout = None
    if carveout_column is not None:
        c = _column(df, carveout_column)
        carveout = c.fillna(pd.Series(dev["shared_mem_per_sm_bytes"], index=df.index)).to_numpy(dtype=np.int64)
    bars = None if barriers_column is None else _column(df, barriers_column).fillna(0).to_numpy(dtype=np.int64)

    r = compute(
        threads.fillna(1).to_numpy(dtype=np.int64), regs.fillna(0).to_numpy(dtype=np.int64),
        smem.to_numpy(dtype=np.int64), dev,
        carveout_bytes=carveout, barriers_per_block=bars, opt_in_shared_mem=opt_in_shared_mem,
    )

    def ints(a: np.ndarray, unlimited_is_null: bool = False) -> pd.arrays.IntegerArray:
        mask = ~ok | (a >= UNLIMITED) if unlimited_is_null else ~ok
        return pd.arrays.IntegerArray(a.astype(np.int64), mask)

    out = pd.DataFrame(index=df.index)
    for name in ("threads_per_block", "warps_per_block", "limit_blocks", "limit_warps"):
        out[name] = ints(r[name])
    for name in ("limit_registers", "limit_shared_mem", "limit_barriers"):
        out[name] = ints(r[name], unlimited_is_null=True)
    out["blocks_per_sm"] = ints(r["blocks_per_sm"])
    out["limiter"] = pd.array(np.where(ok, limiter_text(r["limiter_code"]), None), dtype="string")
    out["active_warps_per_sm"] = ints(r["active_warps_per_sm"])
    out["theoretical_occupancy"] = pd.arrays.FloatingArray(r["theoretical_occupancy"].astype(np.float64), ~ok)
    out["shared_mem_per_block_bytes"] = ints(r["shared_mem_per_block_bytes"])
    config = pd.arrays.IntegerArray(r["shared_mem_config_bytes"], ~ok | (r["blocks_per_sm"] == 0))
    out["shared_mem_config_bytes"] = config

    grid = _column(df, "grid_x") * _column(df, "grid_y").fillna(1) * _column(df, "grid_z").fillna(1)
    sms = _column(df, "sm_count")
    denom = pd.Series(r["blocks_per_sm"], index=df.index).astype("Float64") * sms
    w = grid / denom.where(denom > 0)
    out["waves"] = w.where(pd.Series(ok, index=df.index), pd.NA)
    assert len(out) == n
    return out
