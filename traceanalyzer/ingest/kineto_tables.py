"""Kineto columns -> schema tables (Arrow), once the whole file is read.

`TableBuilder` works on the columns `kineto_collect.Collector` kept (the time base may
come after the events): out-of-range times and unusable args are dropped and counted,
times become ns, GPU activities are linked to their launching API call through
`CorrelationIndex` (sorted arrays + searchsorted), and names are parsed once per
distinct name. Rows are in the order a whole-file decode gives them: by category in
order of first appearance (no category last), then file order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import chain, compress
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .kineto_arrow import CorrelationIndex, coalesce, dur_to_ns, int_or_none, make_table, take, us_to_ns
from .kineto_collect import COMPLETE_ROLES, MAX_TIME_US, MEMORY, Collector, Column
from .kineto_names import base_api_name, kernel_short_name, parse_memcpy_name, parse_memset_name, sync_kind


# -- whole columns ---------------------------------------------------------------------

def _concat(parts: list[dict[str, Any]], key: str) -> Column:
    cols = [p[key] for p in parts]
    if isinstance(cols[0], np.ndarray):
        return np.concatenate(cols)
    if any(isinstance(c, list) for c in cols):
        return list(chain.from_iterable(c if isinstance(c, list) else c.to_pylist() for c in cols))
    if len(cols) == 1:
        return cols[0]
    chunks = [a for c in cols for a in (c.chunks if isinstance(c, pa.ChunkedArray) else [c])]
    return pa.chunked_array(chunks, type=cols[0].type)


def _filter(col: Column, keep: np.ndarray | None) -> Column:
    if keep is None:
        return col
    if isinstance(col, np.ndarray):
        return col[keep]
    if isinstance(col, list):
        return list(compress(col, keep.tolist()))
    return col.filter(pa.array(keep))


def _pylist(col: Column) -> list:
    return col if isinstance(col, list) else col.to_pylist()


def _arrow(col: Column, typ: pa.DataType) -> pa.Array | pa.ChunkedArray:
    return pa.array(col, type=typ) if isinstance(col, list) else col


def _per_name(names: Column, fn) -> list:
    """fn applied once per distinct name (kernel names repeat thousands of times)."""
    names = _pylist(names)
    cache = {n: fn(n) for n in set(names)}
    return [cache[n] for n in names]


def _per_name_arrow(names: Column, fn) -> Column:
    """fn (str -> str) once per distinct name, as an Arrow column."""
    if isinstance(names, list):
        return _per_name(names, fn)
    if isinstance(names, pa.ChunkedArray):
        names = names.combine_chunks()
    enc = names.dictionary_encode()
    mapped = pa.array([fn(n) for n in enc.dictionary.to_pylist()], type=pa.string())
    return mapped.take(enc.indices)


def _where(has: np.ndarray, own: Column, other: Column) -> Column:
    """Row-wise: `own` where `has`, else `other`."""
    if isinstance(own, list) or isinstance(other, list):
        return [a if h else b for h, a, b in zip(has.tolist(), _pylist(own), _pylist(other))]
    return pc.if_else(pa.array(has), own, other)


def _coalesce(*cols: Column) -> Column:
    if any(isinstance(c, list) for c in cols):
        return coalesce(*(_pylist(c) for c in cols))
    return pc.coalesce(*cols)


@dataclass
class _Timed:
    cols: dict[str, Column]
    start_ns: np.ndarray
    end_ns: np.ndarray
    n: int


class TableBuilder:
    def __init__(self, collector: Collector, base_ns: int, warnings: Counter):
        self.c = collector
        self.base_ns = base_ns
        self.warnings = warnings
        self._calls: dict[str, Column] = {
            "call_id": pa.array([], pa.int64()), "pid": pa.array([], pa.int64()),
            "tid": pa.array([], pa.int64()), "name": pa.array([], pa.string()),
            "external_id": pa.array([], pa.int64()),
        }
        self._call_extra: dict[str, Column] = {}
        self._call_index = CorrelationIndex([])
        self.gpu_device_ids: set[int] = set()

    # -- shared steps -------------------------------------------------------------

    def _complete(self, role: str) -> _Timed:
        """The role's usable rows: ts, dur >= 0, a name, times in range, usable args."""
        r = self.c.roles[role]
        what = COMPLETE_ROLES[role][1]
        parts = self.c.role_parts(role)
        base_us = self.base_ns / 1000
        if parts:
            ts, dur = np.concatenate([p["ts"] for p in parts]), np.concatenate([p["dur"] for p in parts])
            ok = np.concatenate([p["ok"] for p in parts])
            with np.errstate(invalid="ignore", over="ignore"):
                in_range = (np.abs(ts + base_us) <= MAX_TIME_US) & ((ts + dur) + base_us <= MAX_TIME_US)
        else:
            ts = dur = np.zeros(0)
            ok = in_range = np.zeros(0, dtype=bool)
        absurd = int(np.count_nonzero(~in_range))
        unusable = int(np.count_nonzero(in_range & ~ok))
        if r.missing:
            self.warnings[f"{what} events without ts, dur or name skipped"] += r.missing
        if r.negative:
            self.warnings[f"{what} events with negative duration (end before start) skipped"] += r.negative
        if absurd:
            self.warnings[f"{what} events with out-of-range times skipped"] += absurd
        if unusable:
            self.warnings[f"{what} events with unusable args (wrong value type or out of range) skipped"] += unusable
        keep = in_range & ok
        n = int(np.count_nonzero(keep))
        mask = None if n == len(keep) else keep
        cols = {k: _filter(_concat(parts, k), mask) for k in parts[0] if k not in ("ts", "dur", "ok")} \
            if parts else {}
        ts, dur = ts[keep], dur[keep]
        start = us_to_ns(ts, self.base_ns)
        return _Timed(cols, start, start + dur_to_ns(dur), n)

    def _devices_seen(self, devices: Column) -> None:
        values = _pylist(devices) if isinstance(devices, list) else pc.unique(devices).to_pylist()
        self.gpu_device_ids.update(d for d in values if d is not None)

    def _call_columns(self, correlations: Column) -> tuple[np.ndarray, dict[str, Column]]:
        rows = self._call_index.rows_for(_pylist(correlations) if isinstance(correlations, list)
                                         else _fill(correlations))
        return rows, {k: take(_arrow(v, pa.int64() if k != "name" else pa.string()), rows)
                      for k, v in self._calls.items()}

    def _extra(self, rows: np.ndarray, key: str) -> Column:
        """A column of the linked call's args (ROCm keeps launch details there)."""
        col = self._call_extra.get(key)
        if col is None:
            return pa.nulls(len(rows), pa.int64())
        if isinstance(col, list):
            return [col[r] if r >= 0 else None for r in rows.tolist()]
        return take(col, rows)

    # -- tables ---------------------------------------------------------------------

    def api_calls(self) -> pa.Table | None:
        parts = [(self._complete("runtime"), "runtime"), (self._complete("driver"), "driver")]
        parts = [(t, kind) for t, kind in parts if t.n]
        n = sum(t.n for t, _ in parts)

        def cat(key: str) -> Column:
            return _concat([t.cols for t, _ in parts], key) if parts else []

        start = np.concatenate([t.start_ns for t, _ in parts]) if parts else np.zeros(0, np.int64)
        end = np.concatenate([t.end_ns for t, _ in parts]) if parts else np.zeros(0, np.int64)
        api = [kind for t, kind in parts for _ in range(t.n)]
        correlations = cat("correlation")
        self._call_index = CorrelationIndex(_pylist(correlations) if isinstance(correlations, list)
                                            else _fill(correlations) if n else [])
        if self._call_index.duplicated_ids:
            self.warnings["correlation ids shared by several API calls (first call used for links)"] += (
                self._call_index.duplicated_ids)
        if n == 0:
            return None
        raw_names = cat("name")
        names = _per_name_arrow(raw_names, base_api_name)
        pids, tids, external = cat("pid"), cat("tid"), cat("external")
        self._calls = {
            "call_id": pa.array(np.arange(n, dtype=np.int64)),
            "pid": _arrow(pids, pa.int64()), "tid": _arrow(tids, pa.int64()),
            "name": _arrow(names, pa.string()), "external_id": _arrow(external, pa.int64()),
        }
        self._call_extra = {k: cat(k) for k in ("smem", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
                                                "block_z")}
        self._call_extra["size"] = cat("size")
        self._call_extra["grid_has"] = cat("grid_has")
        self._call_extra["block_has"] = cat("block_has")
        return make_table("api_calls", {
            "call_id": self._calls["call_id"], "api": api, "name": names, "raw_name": raw_names,
            "pid": pids, "tid": tids, "start_ns": start, "end_ns": end,
            "correlation_id": correlations, "external_id": external,
        })

    def _dims(self, cols: dict[str, Column], rows: np.ndarray, which: str) -> dict[str, Column]:
        """grid/block: the kernel's own list if it has one (even a short one), else its call's."""
        call_has = self._call_extra.get(f"{which}_has")
        out = {}
        for axis in "xyz":
            own = cols[f"{which}_{axis}"]
            if call_has is None or not call_has.any():
                out[axis] = own
            else:
                out[axis] = _where(cols[f"{which}_has"], own, self._extra(rows, f"{which}_{axis}"))
        return out

    def kernels(self) -> pa.Table | None:
        t = self._complete("kernel")
        if not t.n:
            return None
        c = t.cols
        self._devices_seen(c["device"])
        correlations = c["correlation"]
        rows, call = self._call_columns(correlations)
        names = c["name"]
        grid, block = self._dims(c, rows, "grid"), self._dims(c, rows, "block")
        # A kernel without its own External id inherits its launch call's.
        cols = {
            "kernel_id": np.arange(t.n, dtype=np.int64),
            "device_id": c["device"],
            "context_id": c["context"],
            "stream_id": c["stream"],
            "start_ns": t.start_ns, "end_ns": t.end_ns,
            "name": names,
            "short_name": _per_name_arrow(names, kernel_short_name),
            "registers_per_thread": c["registers"],
            "static_shared_mem_bytes": _coalesce(c["smem"], self._extra(rows, "smem")),
            "correlation_id": correlations,
            "pid": call["pid"], "tid": call["tid"], "launch_call_id": call["call_id"],
            "external_id": _coalesce(c["external"], call["external_id"]),
            "graph_id": c["graph_id"],
            "blocks_per_sm": c["blocks_per_sm"],
            "est_achieved_occupancy_pct": c["occupancy"],
        }
        for axis in "xyz":
            cols[f"grid_{axis}"] = grid[axis]
            cols[f"block_{axis}"] = block[axis]
        return make_table("kernels", cols)

    def _sizes(self, own: Column, rows: np.ndarray) -> list:
        """Byte counts: the activity's own, else (ROCm) its hipMemcpy* call's `size`."""
        sizes = self._call_extra.get("size")
        call = [sizes[r] if r >= 0 else None for r in rows.tolist()] if sizes else [None] * len(rows)
        return coalesce(_pylist(own), int_or_none(call))

    def copies(self) -> pa.Table | None:
        t = self._complete("memcpy")
        if not t.n:
            return None
        c = t.cols
        self._devices_seen(c["device"])
        rows, call = self._call_columns(c["correlation"])
        kinds = _per_name(c["name"], parse_memcpy_name)
        return make_table("copies", {
            "copy_id": np.arange(t.n, dtype=np.int64),
            "device_id": c["device"], "context_id": c["context"], "stream_id": c["stream"],
            "start_ns": t.start_ns, "end_ns": t.end_ns,
            "direction": [k[0] for k in kinds],
            "unified_memory": [False] * t.n,  # Kineto has no UM migration records
            "src_kind": [k[1] for k in kinds], "dst_kind": [k[2] for k in kinds],
            "bytes": self._sizes(c["bytes"], rows),
            "src_device_id": c["from_device"], "dst_device_id": c["to_device"],
            "correlation_id": c["correlation"],
            "pid": call["pid"], "tid": call["tid"], "api_name": call["name"],
            "launch_call_id": call["call_id"],
        })

    def memsets(self) -> pa.Table | None:
        t = self._complete("memset")
        if not t.n:
            return None
        c = t.cols
        self._devices_seen(c["device"])
        rows, call = self._call_columns(c["correlation"])
        return make_table("memsets", {
            "memset_id": np.arange(t.n, dtype=np.int64),
            "device_id": c["device"], "context_id": c["context"], "stream_id": c["stream"],
            "start_ns": t.start_ns, "end_ns": t.end_ns,
            "bytes": self._sizes(c["bytes"], rows),
            "mem_kind": _per_name(c["name"], parse_memset_name),
            "correlation_id": c["correlation"],
            "pid": call["pid"], "tid": call["tid"], "api_name": call["name"],
            "launch_call_id": call["call_id"],
        })

    def syncs(self) -> pa.Table | None:
        t = self._complete("sync")
        if not t.n:
            return None
        c = t.cols
        self._devices_seen(c["device"])
        rows, call = self._call_columns(c["correlation"])
        api_names = call["name"].to_pylist()
        kinds = [sync_kind(api, rec) for api, rec in zip(api_names, _pylist(c["record_name"]))]
        streams = _pylist(c["stream"])
        return make_table("syncs", {
            "sync_id": np.arange(t.n, dtype=np.int64),
            "kind": kinds, "api_name": api_names,
            "device_id": c["device"], "context_id": c["context"],
            # Device/context syncs wait on no particular stream.
            "stream_id": [None if k in ("device", "context") else s for k, s in zip(kinds, streams)],
            "start_ns": t.start_ns, "end_ns": t.end_ns,
            "correlation_id": c["correlation"],
            "pid": call["pid"], "tid": call["tid"], "launch_call_id": call["call_id"],
        })

    def ranges(self) -> pa.Table | None:
        tc, tg = self._complete("user_annotation"), self._complete("gpu_user_annotation")
        n_cpu, n_gpu = tc.n, tg.n
        if n_cpu + n_gpu == 0:
            return None
        cc, cg = tc.cols, tg.cols
        if n_gpu:
            self._devices_seen(cg["device"])
        return make_table("ranges", {
            "range_id": np.arange(n_cpu + n_gpu, dtype=np.int64),
            "kind": ["user_annotation"] * n_cpu + ["gpu_user_annotation"] * n_gpu,
            "name": (_pylist(cc["name"]) if n_cpu else []) + (_pylist(cg["name"]) if n_gpu else []),
            "pid": (_pylist(cc["pid"]) if n_cpu else []) + [None] * n_gpu,
            "tid": (_pylist(cc["tid"]) if n_cpu else []) + [None] * n_gpu,
            "device_id": [None] * n_cpu + (_pylist(cg["device"]) if n_gpu else []),
            "stream_id": [None] * n_cpu + (_pylist(cg["stream"]) if n_gpu else []),
            "start_ns": np.concatenate([tc.start_ns, tg.start_ns]),
            "end_ns": np.concatenate([tc.end_ns, tg.end_ns]),
        })

    def cpu_ops(self) -> pa.Table | None:
        t = self._complete("cpu_op")
        if not t.n:
            return None
        c = t.cols
        return make_table("cpu_ops", {
            "op_id": np.arange(t.n, dtype=np.int64),
            "name": c["name"], "pid": c["pid"], "tid": c["tid"],
            "start_ns": t.start_ns, "end_ns": t.end_ns,
            "input_dims": c["input_dims"], "input_types": c["input_types"], "concrete_inputs": c["concrete_inputs"],
            "external_id": c["external"], "sequence_number": c["sequence_number"], "kernel_meta": c["kernel_meta"],
        })

    def python_functions(self) -> pa.Table | None:
        t = self._complete("python_function")
        if not t.n:
            return None
        c = t.cols
        return make_table("python_functions", {
            "function_id": np.arange(t.n, dtype=np.int64),
            "name": c["name"], "pid": c["pid"], "tid": c["tid"], "start_ns": t.start_ns, "end_ns": t.end_ns,
        })

    def memory_events(self) -> pa.Table | None:
        r = self.c.roles[MEMORY]
        parts = self.c.role_parts(MEMORY)
        base_us = self.base_ns / 1000
        if parts:
            ts = np.concatenate([p["ts"] for p in parts])
            ok = np.concatenate([p["ok"] for p in parts])
            with np.errstate(invalid="ignore", over="ignore"):
                in_range = np.abs(ts + base_us) <= MAX_TIME_US
        else:
            ts, ok, in_range = np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
        skipped = r.missing + int(np.count_nonzero(~in_range))
        if skipped:
            self.warnings["[memory] events without a usable ts skipped"] += skipped
        unusable = int(np.count_nonzero(in_range & ~ok))
        if unusable:
            self.warnings["[memory] events with unusable args (wrong value type or out of range) skipped"] += unusable
        keep = in_range & ok
        n = int(np.count_nonzero(keep))
        if not n:
            return None
        mask = None if n == len(keep) else keep
        cols = {k: _filter(_concat(parts, k), mask) for k in parts[0] if k not in ("ts", "ok")}
        return make_table("memory_events", {
            "event_id": np.arange(n, dtype=np.int64),
            "ts_ns": us_to_ns(ts[keep], self.base_ns),
            "device_type": cols["device_type"], "device_id": cols["device_id"],
            "address": cols["address"], "bytes": cols["bytes"],
            "total_allocated_bytes": cols["total_allocated"], "total_reserved_bytes": cols["total_reserved"],
            "pid": cols["pid"], "tid": cols["tid"],
        })


def _fill(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An int64 column as numpy with -1 for NULL (CorrelationIndex's "no id")."""
    return col.fill_null(-1).to_numpy()
