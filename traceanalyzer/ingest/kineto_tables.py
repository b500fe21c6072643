"""Kineto events of one role -> one schema table (Arrow), with the CPU<->GPU links.

Each builder takes the decoded `Event`s of its role, drops (and counts) the ones that
lack what the table needs, decodes their args in one batch, and builds columns with list
comprehensions and numpy; links to the launching API call go through
`CorrelationIndex` (sorted arrays + searchsorted), not per-row dict lookups.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .kineto_arrow import (
    CorrelationIndex, IdParser, coalesce, dur_to_ns, int_or_none, make_table, raw_json_text, take,
    us_to_ns,
)
from .kineto_events import (
    CallArgs, CopyArgs, CpuOpArgs, Event, KernelArgs, MemoryArgs, SyncArgs, decode_args,
)
from .kineto_names import (
    base_api_name, kernel_short_name, parse_memcpy_name, parse_memset_name, sync_kind,
)

# Beyond this a time (base included) is corrupt: past ±2^62 ns (Unix µs of year ~2116),
# where base + µs*1000 or a difference of two times would leave int64.
MAX_TIME_US = 4.6e15
# Kineto writes "no stream" as -1 or as its uint32 image.
_NO_STREAM = {-1, 0xFFFFFFFF}
# c10::DeviceType codes the schema names; others are kept as the raw code.
_DEVICE_TYPES = {0: "cpu", 1: "cuda"}


@dataclass
class _Timed:
    events: list[Event]
    args: list
    start_ns: np.ndarray
    end_ns: np.ndarray


def _dim(values: list[int] | None, i: int) -> int | None:
    return values[i] if values is not None and len(values) > i else None


def _per_name(names: list[str], fn) -> list:
    """fn applied once per distinct name (kernel names repeat thousands of times)."""
    cache = {n: fn(n) for n in set(names)}
    return [cache[n] for n in names]


class TableBuilder:
    def __init__(self, base_ns: int, warnings: Counter):
        self.base_ns = base_ns
        self.warnings = warnings
        self.ids = IdParser()
        self._calls: dict[str, pa.Array] = {
            "call_id": pa.array([], pa.int64()), "pid": pa.array([], pa.int64()),
            "tid": pa.array([], pa.int64()), "name": pa.array([], pa.string()),
            "external_id": pa.array([], pa.int64()),
        }
        self._call_index = CorrelationIndex([])
        self._call_args: list[CallArgs] = []
        self.gpu_device_ids: set[int] = set()

    # -- shared steps -------------------------------------------------------------

    def _complete(self, events: list[Event], shape, what: str) -> _Timed:
        """Complete (`X`) events with ts, dur >= 0, a name and usable args; times in ns."""
        usable: list[Event] = []
        missing = negative = absurd = 0
        base_us = self.base_ns / 1000
        for e in events:
            if e.ts is None or e.dur is None or e.name is None:
                missing += 1
            elif e.dur < 0:
                negative += 1
            elif not (abs(e.ts + base_us) <= MAX_TIME_US and e.ts + e.dur + base_us <= MAX_TIME_US):  # and inf
                absurd += 1
            else:
                usable.append(e)
        if missing:
            self.warnings[f"{what} events without ts, dur or name skipped"] += missing
        if negative:
            self.warnings[f"{what} events with negative duration (end before start) skipped"] += negative
        if absurd:
            self.warnings[f"{what} events with out-of-range times skipped"] += absurd
        args = decode_args(usable, shape, what, self.warnings) if shape else [None] * len(usable)
        if shape and any(x is None for x in args):
            kept = [i for i, x in enumerate(args) if x is not None]
            usable, args = [usable[i] for i in kept], [args[i] for i in kept]
        n = len(usable)
        ts = np.fromiter((e.ts for e in usable), dtype=np.float64, count=n)
        dur = np.fromiter((e.dur for e in usable), dtype=np.float64, count=n)
        start = us_to_ns(ts, self.base_ns)
        return _Timed(usable, args, start, start + dur_to_ns(dur))

    def _gpu_place(self, t: _Timed) -> tuple[list[int | None], list[int | None]]:
        """device and stream of GPU events: args first, else pid (device) / tid (stream)."""
        ids = self.ids
        devices = [a.device if a.device is not None else ids(e.pid) for e, a in zip(t.events, t.args)]
        streams = [a.stream if a.stream is not None else ids(e.tid) for e, a in zip(t.events, t.args)]
        self.gpu_device_ids.update(d for d in devices if d is not None)
        return devices, [None if s in _NO_STREAM else s for s in streams]

    def _call_columns(self, correlations: list[int | None]) -> tuple[np.ndarray, dict[str, pa.Array]]:
        rows = self._call_index.rows_for(correlations)
        return rows, {k: take(v, rows) for k, v in self._calls.items()}

    # -- tables ---------------------------------------------------------------------

    def api_calls(self, runtime: list[Event], driver: list[Event]) -> pa.Table | None:
        parts = [(self._complete(runtime, CallArgs, "runtime API"), "runtime"),
                 (self._complete(driver, CallArgs, "driver API"), "driver")]
        events = [e for t, _ in parts for e in t.events]
        args: list[CallArgs] = [a for t, _ in parts for a in t.args]
        api = [kind for t, kind in parts for _ in t.events]
        start = np.concatenate([t.start_ns for t, _ in parts])
        end = np.concatenate([t.end_ns for t, _ in parts])
        n = len(events)
        raw_names = [e.name for e in events]
        pids = [self.ids(e.pid) for e in events]
        tids = [self.ids(e.tid) for e in events]
        correlations = [a.correlation for a in args]
        external = coalesce([a.external_id for a in args], [a.external_id_legacy for a in args])
        self._call_index = CorrelationIndex(correlations)
        if self._call_index.duplicated_ids:
            self.warnings["correlation ids shared by several API calls (first call used for links)"] += (
                self._call_index.duplicated_ids)
        names = _per_name(raw_names, base_api_name)
        self._call_args = args
        self._calls = {
            "call_id": pa.array(np.arange(n, dtype=np.int64)),
            "pid": pa.array(pids, type=pa.int64()),
            "tid": pa.array(tids, type=pa.int64()),
            "name": pa.array(names, type=pa.string()),
            "external_id": pa.array(external, type=pa.int64()),
        }
        if n == 0:
            return None
        return make_table("api_calls", {
            "call_id": self._calls["call_id"], "api": api, "name": names, "raw_name": raw_names,
            "pid": pids, "tid": tids, "start_ns": start, "end_ns": end,
            "correlation_id": correlations, "external_id": external,
        })

    def _call_extra(self, rows: np.ndarray, attr: str) -> list:
        """An attribute of the linked call's args (ROCm keeps launch details there)."""
        args = self._call_args
        return [getattr(args[r], attr) if r >= 0 else None for r in rows.tolist()]

    def kernels(self, events: list[Event]) -> pa.Table | None:
        t = self._complete(events, KernelArgs, "kernel")
        if not t.events:
            return None
        a = t.args
        devices, streams = self._gpu_place(t)
        correlations = [x.correlation for x in a]
        rows, call = self._call_columns(correlations)
        names = [e.name for e in t.events]
        grid = coalesce([x.grid for x in a], self._call_extra(rows, "grid"))
        block = coalesce([x.block for x in a], self._call_extra(rows, "block"))
        smem = coalesce([x.shared_memory_bytes for x in a], self._call_extra(rows, "shared_memory_bytes"))
        # A kernel without its own External id inherits its launch call's.
        external = coalesce([x.external_id for x in a], [x.external_id_legacy for x in a],
                            call["external_id"].to_pylist())
        cols = {
            "kernel_id": np.arange(len(names), dtype=np.int64),
            "device_id": devices,
            "context_id": [x.context for x in a],
            "stream_id": streams,
            "start_ns": t.start_ns, "end_ns": t.end_ns,
            "name": names,
            "short_name": _per_name(names, kernel_short_name),
            "registers_per_thread": [x.registers_per_thread for x in a],
            "static_shared_mem_bytes": smem,
            "correlation_id": correlations,
            "pid": call["pid"], "tid": call["tid"], "launch_call_id": call["call_id"],
            "external_id": external,
            # CUPTI writes graph id 0 for kernels not launched from a graph.
            "graph_id": [x.graph_id or None for x in a],
            "blocks_per_sm": [x.blocks_per_sm for x in a],
            "est_achieved_occupancy_pct": coalesce([x.est_occupancy_pct for x in a],
                                                   [x.theoretical_occupancy_pct for x in a]),
        }
        for i, axis in enumerate("xyz"):
            cols[f"grid_{axis}"] = [_dim(g, i) for g in grid]
            cols[f"block_{axis}"] = [_dim(b, i) for b in block]
        return make_table("kernels", cols)

    def copies(self, events: list[Event]) -> pa.Table | None:
        t = self._complete(events, CopyArgs, "memcpy")
        if not t.events:
            return None
        a = t.args
        devices, streams = self._gpu_place(t)
        correlations = [x.correlation for x in a]
        rows, call = self._call_columns(correlations)
        names = [e.name for e in t.events]
        kinds = _per_name(names, parse_memcpy_name)
        # ROCm copies carry no byte count; their hipMemcpy* call has it as `size`.
        nbytes = coalesce([x.bytes for x in a], int_or_none(self._call_extra(rows, "size")))
        return make_table("copies", {
            "copy_id": np.arange(len(names), dtype=np.int64),
            "device_id": devices, "context_id": [x.context for x in a], "stream_id": streams,
            "start_ns": t.start_ns, "end_ns": t.end_ns,
            "direction": [k[0] for k in kinds],
            "unified_memory": [False] * len(names),  # Kineto has no UM migration records
            "src_kind": [k[1] for k in kinds], "dst_kind": [k[2] for k in kinds],
            "bytes": nbytes,
            "src_device_id": [x.from_device for x in a], "dst_device_id": [x.to_device for x in a],
            "correlation_id": correlations,
            "pid": call["pid"], "tid": call["tid"], "api_name": call["name"],
            "launch_call_id": call["call_id"],
        })

    def memsets(self, events: list[Event]) -> pa.Table | None:
        t = self._complete(events, CopyArgs, "memset")
        if not t.events:
            return None
        a = t.args
        devices, streams = self._gpu_place(t)
        correlations = [x.correlation for x in a]
        rows, call = self._call_columns(correlations)
        names = [e.name for e in t.events]
        return make_table("memsets", {
            "memset_id": np.arange(len(names), dtype=np.int64),
            "device_id": devices, "context_id": [x.context for x in a], "stream_id": streams,
            "start_ns": t.start_ns, "end_ns": t.end_ns,
            "bytes": coalesce([x.bytes for x in a], int_or_none(self._call_extra(rows, "size"))),
            "mem_kind": _per_name(names, parse_memset_name),
            "correlation_id": correlations, "pid": call["pid"],
        })

    def syncs(self, events: list[Event]) -> pa.Table | None:
        t = self._complete(events, SyncArgs, "cuda_sync")
        if not t.events:
            return None
        a = t.args
        devices, streams = self._gpu_place(t)
        correlations = [x.correlation for x in a]
        rows, call = self._call_columns(correlations)
        api_names = call["name"].to_pylist()
        record_names = [x.cuda_sync_kind or e.name for e, x in zip(t.events, a)]
        kinds = [sync_kind(api, rec) for api, rec in zip(api_names, record_names)]
        return make_table("syncs", {
            "sync_id": np.arange(len(kinds), dtype=np.int64),
            "kind": kinds, "api_name": api_names,
            "device_id": devices, "context_id": [x.context for x in a],
            # Device/context syncs wait on no particular stream.
            "stream_id": [None if k in ("device", "context") else s for k, s in zip(kinds, streams)],
            "start_ns": t.start_ns, "end_ns": t.end_ns,
            "correlation_id": correlations,
            "pid": call["pid"], "tid": call["tid"], "launch_call_id": call["call_id"],
        })

    def ranges(self, cpu: list[Event], gpu: list[Event]) -> pa.Table | None:
        tc = self._complete(cpu, None, "user_annotation")
        tg = self._complete(gpu, None, "gpu_user_annotation")
        n_cpu, n_gpu = len(tc.events), len(tg.events)
        if n_cpu + n_gpu == 0:
            return None
        ids = self.ids
        gpu_devices = [ids(e.pid) for e in tg.events]
        self.gpu_device_ids.update(d for d in gpu_devices if d is not None)
        return make_table("ranges", {
            "range_id": np.arange(n_cpu + n_gpu, dtype=np.int64),
            "kind": ["user_annotation"] * n_cpu + ["gpu_user_annotation"] * n_gpu,
            "name": [e.name for e in tc.events] + [e.name for e in tg.events],
            "pid": [ids(e.pid) for e in tc.events] + [None] * n_gpu,
            "tid": [ids(e.tid) for e in tc.events] + [None] * n_gpu,
            "device_id": [None] * n_cpu + gpu_devices,
            "stream_id": [None] * n_cpu + [ids(e.tid) for e in tg.events],
            "start_ns": np.concatenate([tc.start_ns, tg.start_ns]),
            "end_ns": np.concatenate([tc.end_ns, tg.end_ns]),
        })

    def cpu_ops(self, events: list[Event]) -> pa.Table | None:
        t = self._complete(events, CpuOpArgs, "cpu_op")
        if not t.events:
            return None
        a = t.args
        ids = self.ids
        return make_table("cpu_ops", {
            "op_id": np.arange(len(a), dtype=np.int64),
            "name": [e.name for e in t.events],
            "pid": [ids(e.pid) for e in t.events], "tid": [ids(e.tid) for e in t.events],
            "start_ns": t.start_ns, "end_ns": t.end_ns,
            "input_dims": raw_json_text([x.input_dims if len(x.input_dims) else x.input_dims_legacy for x in a]),
            "input_types": raw_json_text([x.input_types for x in a]),
            "external_id": coalesce([x.external_id for x in a], [x.external_id_legacy for x in a]),
            "sequence_number": [x.sequence_number for x in a],
        })

    def memory_events(self, events: list[Event]) -> pa.Table | None:
        base_us = self.base_ns / 1000
        usable = [e for e in events if e.ts is not None and abs(e.ts + base_us) <= MAX_TIME_US]
        if len(usable) < len(events):
            self.warnings["[memory] events without a usable ts skipped"] += len(events) - len(usable)
        args = decode_args(usable, MemoryArgs, "[memory]", self.warnings)
        pairs = [(e, x) for e, x in zip(usable, args) if x is not None]
        if not pairs:
            return None
        ts = np.fromiter((e.ts for e, _ in pairs), dtype=np.float64, count=len(pairs))
        ids = self.ids
        return make_table("memory_events", {
            "event_id": np.arange(len(pairs), dtype=np.int64),
            "ts_ns": us_to_ns(ts, self.base_ns),
            "device_type": [None if x.device_type is None else _DEVICE_TYPES.get(x.device_type, str(x.device_type))
                            for _, x in pairs],
            "device_id": [x.device_id for _, x in pairs],
            "address": [x.addr for _, x in pairs],
            "bytes": [x.bytes for _, x in pairs],
            "total_allocated_bytes": [x.total_allocated for _, x in pairs],
            "total_reserved_bytes": [x.total_reserved for _, x in pairs],
            "pid": [ids(e.pid) for e, _ in pairs], "tid": [ids(e.tid) for e, _ in pairs],
        })
