"""ncu launches -> `kernels` and `devices` rows.

Facts found in the real exports (and relied on here):

* ``Grid Size`` / ``Block Size`` identity columns are dimension tuples, grid in BLOCKS:
  a raw export has ``Grid Size`` ``(1, 64, 8)`` with ``launch__grid_size`` 512 and
  ``launch__thread_count`` 65 536 = 512 x 128; a details export has ``(1024, 1, 1)`` with
  Launch Statistics "Grid Size" 1,024 and "Threads" 262,144 = 1 024 x 256. So
  ``launch__grid_size`` is total blocks, not threads.
* 2019-2020 exports have no ``Grid Size``/``Block Size``/``Device``/``CC`` columns; their
  Launch Statistics give only totals, so grid/block dims stay NULL there (the totals are
  still in kernel_metrics as ``launch__grid_size`` / ``launch__block_size``).
* ``device__attribute_clock_rate`` is in kHz (1 965 000 on a B200 whose boost is 1.965
  GHz), with an empty unit cell, so it is scaled by 1 000 here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..devices.gpu import fill_device
from ..schema import DEVICES, arrow_schema
from .kineto_names import kernel_short_name as short_name
from .ncu_units import parse_dims, parse_ints

# kernels column -> the metric id that holds it (values already in base units).
LAUNCH_METRICS = {
    "registers_per_thread": "launch__registers_per_thread",
    "static_shared_mem_bytes": "launch__shared_mem_per_block_static",
    "dynamic_shared_mem_bytes": "launch__shared_mem_per_block_dynamic",
}
DIM_METRICS = {
    "grid": ("launch__grid_dim_x", "launch__grid_dim_y", "launch__grid_dim_z"),
    "block": ("launch__block_dim_x", "launch__block_dim_y", "launch__block_dim_z"),
}
# devices column -> device attribute metric id.
DEVICE_ATTRIBUTES = {
    "compute_major": "device__attribute_compute_capability_major",
    "compute_minor": "device__attribute_compute_capability_minor",
    "sm_count": "device__attribute_multiprocessor_count",
    "max_warps_per_sm": "device__attribute_max_warps_per_multiprocessor",
    "max_blocks_per_sm": "device__attribute_max_blocks_per_multiprocessor",
    "max_threads_per_block": "device__attribute_max_threads_per_block",
    "registers_per_sm": "device__attribute_max_registers_per_multiprocessor",
    "max_registers_per_block": "device__attribute_max_registers_per_block",
    "shared_mem_per_sm_bytes": "device__attribute_max_shared_memory_per_multiprocessor",
    "max_shared_mem_per_block_bytes": "device__attribute_max_shared_memory_per_block",
    "max_shared_mem_per_block_optin_bytes": "device__attribute_max_shared_memory_per_block_optin",
    "warp_size": "device__attribute_warp_size",
    "total_memory_bytes": "device__attribute_total_memory",
    "l2_cache_bytes": "device__attribute_l2_cache_size",
    "clock_hz": "device__attribute_clock_rate",
}
# Used when the device attribute is missing (details pages): "# SMs" of Launch Statistics.
DEVICE_FALLBACKS = {"sm_count": "launch__sm_count"}
CLOCK_RATE_HZ_PER_UNIT = 1000  # device__attribute_clock_rate is kHz
DISPLAY_NAME = "device__attribute_display_name"
DEVICE_COLUMNS = [c for c in DEVICES.column_names if c != "run_id"]
_DEVICE_SCHEMA = arrow_schema("devices", DEVICE_COLUMNS)


def _short_names(names: pa.Array) -> pa.Array:
    distinct = pc.unique(names)
    shorts = pa.array([None if n is None else short_name(n) for n in distinct.to_pylist()], pa.string())
    return shorts.take(pc.index_in(names, value_set=distinct))


def metric_for_kernels(metrics: pa.Table, metric_id: str, kernel_ids: pa.Array,
                       column: str = "value") -> pa.Array:
    """One metric's `column` aligned to `kernel_ids` (first row per kernel; NULL if absent)."""
    sel = metrics.filter(pc.equal(metrics["metric_id"], metric_id))
    if sel.num_rows == 0:
        return pa.nulls(len(kernel_ids), metrics.schema.field(column).type)
    return sel[column].combine_chunks().take(pc.index_in(kernel_ids, value_set=sel["kernel_id"]))


def _as_int(values: pa.Array) -> pa.Array:
    # inf, NaN or past int64 (a wrong unit, a corrupt cell) is no value, not a crash.
    usable = pc.and_(pc.is_finite(values), pc.less(pc.abs(values), 9.2e18))
    return pc.cast(pc.round(pc.if_else(usable, values, pa.scalar(None, values.type))), pa.int64())


def _column(ident: pa.Table, name: str) -> pa.Array | None:
    return ident[name].combine_chunks() if name in ident.column_names else None


def _dims(ident: pa.Table, metrics: pa.Table, kernel_ids: pa.Array, which: str) -> list[pa.Array]:
    col = _column(ident, "Grid Size" if which == "grid" else "Block Size")
    from_col = parse_dims(col) if col is not None else (pa.nulls(len(kernel_ids), pa.int64()),) * 3
    from_metrics = [_as_int(metric_for_kernels(metrics, m, kernel_ids)) for m in DIM_METRICS[which]]
    return [pc.coalesce(a, b) for a, b in zip(from_col, from_metrics)]


def _ids(ident: pa.Table, metrics: pa.Table, kernel_ids: pa.Array, column: str, metric_id: str) -> pa.Array:
    col = _column(ident, column)
    from_col = parse_ints(col) if col is not None else pa.nulls(len(kernel_ids), pa.int64())
    return pc.coalesce(from_col, _as_int(metric_for_kernels(metrics, metric_id, kernel_ids)))


def device_ids(ident: pa.Table, metrics: pa.Table, kernel_ids: pa.Array) -> tuple[pa.Array, dict[int, str]]:
    """Per-launch device index, and names for devices that the Device column names.

    ``Device`` is usually an index ("0"); where it is a product name instead, the names are
    numbered in order of appearance and kept as the device name.
    """
    col = _column(ident, "Device")
    ids = _ids(ident, metrics, kernel_ids, "Device", "launch__device_id")
    names: dict[int, str] = {}
    if col is not None:
        named = pc.and_(pc.is_null(parse_ints(col)), pc.not_equal(col, ""))
        if pc.any(named).as_py():
            distinct = pc.unique(col.filter(named)).to_pylist()
            names = {i: n for i, n in enumerate(distinct)}
            index = pa.array(np.arange(len(distinct)), pa.int64()).take(pc.index_in(col, value_set=pa.array(distinct)))
            ids = pc.if_else(named, index, ids)
    return ids, names


def build_kernels(ident: pa.Table, metrics: pa.Table) -> pa.Table:
    """`kernels` rows from one identity row per launch plus the launch metrics."""
    kernel_ids = ident["kernel_id"].combine_chunks()
    names = _column(ident, "Kernel Name")
    grid, block = _dims(ident, metrics, kernel_ids, "grid"), _dims(ident, metrics, kernel_ids, "block")
    cols: dict[str, Any] = {
        "kernel_id": kernel_ids,
        "device_id": pc.cast(device_ids(ident, metrics, kernel_ids)[0], pa.int32()),
        "context_id": _ids(ident, metrics, kernel_ids, "Context", "launch__context_id"),
        "stream_id": _ids(ident, metrics, kernel_ids, "Stream", "launch__stream_id"),
        "name": names,
        "short_name": _short_names(names),
        "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2],
        "block_x": block[0], "block_y": block[1], "block_z": block[2],
        "pid": _ids(ident, metrics, kernel_ids, "Process ID", "launch__process_id"),
    }
    for column, metric_id in LAUNCH_METRICS.items():
        cols[column] = _as_int(metric_for_kernels(metrics, metric_id, kernel_ids))
    return pa.table(cols)


def _cc(text: str | None) -> tuple[int | None, int | None]:
    major, _, minor = (text or "").partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else (None, None)


def build_devices(ident: pa.Table, metrics: pa.Table) -> pa.Table:
    """One `devices` row per device index seen, from CC and any device__attribute_* metrics."""
    kernel_ids = ident["kernel_id"].combine_chunks()
    ids, names = device_ids(ident, metrics, kernel_ids)
    present = pc.is_valid(ids)
    if not pc.any(present).as_py():
        return _DEVICE_SCHEMA.empty_table()
    # The first launch on each device speaks for it (attributes are per device anyway).
    distinct, first = np.unique(ids.filter(present).to_numpy(), return_index=True)
    launch = kernel_ids.filter(present).take(pa.array(first))
    cc = _column(ident, "CC")
    cc_text = cc.filter(present).take(pa.array(first)).to_pylist() if cc is not None else [None] * len(distinct)
    attrs = {col: metric_for_kernels(metrics, mid, launch) for col, mid in DEVICE_ATTRIBUTES.items()}
    for col, mid in DEVICE_FALLBACKS.items():
        attrs[col] = pc.coalesce(attrs[col], metric_for_kernels(metrics, mid, launch))
    attrs = {col: values.to_pylist() for col, values in attrs.items()}
    display = metric_for_kernels(metrics, DISPLAY_NAME, launch, "raw_value").to_pylist()
    rows = []
    for i, device_id in enumerate(distinct.tolist()):
        row: dict[str, Any] = dict.fromkeys(DEVICE_COLUMNS)
        row.update(device_id=device_id, vendor="nvidia")
        row["compute_major"], row["compute_minor"] = _cc(cc_text[i])
        for col, values in attrs.items():
            if values[i] is not None and math.isfinite(values[i]):
                scale = CLOCK_RATE_HZ_PER_UNIT if col == "clock_hz" else 1
                value = int(round(values[i] * scale))
                bits = _DEVICE_SCHEMA.field(col).type.bit_width
                # A value past the column's type (a wrong unit, a corrupt cell) is unknown.
                row[col] = value if -(1 << (bits - 1)) <= value < (1 << (bits - 1)) else None
        row["name"] = display[i] or names.get(device_id)
        from_trace = any(row[k] is not None for k in DEVICE_ATTRIBUTES if not k.startswith("compute_"))
        row = fill_device(row)
        if from_trace and row.get("limits_source") is None:
            row["limits_source"] = "trace"
        rows.append({k: row.get(k) for k in DEVICE_COLUMNS})
    return pa.Table.from_pylist(rows, schema=_DEVICE_SCHEMA)
