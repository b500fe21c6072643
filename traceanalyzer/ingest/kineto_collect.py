"""Kineto events -> columns, a chunk of events at a time (the first half of building tables).

`Collector.add` takes one chunk of decoded `Event`s (see `kineto_stream`): it buckets
them by category (Arrow dictionary-encode + a stable argsort, not a dict append per
event), drops the events of each role that lack what its table needs (counted), decodes
their args in one batch per category, and keeps only columns: numpy for times, Arrow
for the rest. Nothing of a chunk outlives it but those columns, so the events and the
file text are freed chunk by chunk. `kineto_tables.TableBuilder` turns the columns into
tables once the file is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any

import numpy as np
import pyarrow as pa

from .kineto_arrow import IdParser, coalesce, raw_json_text

PROFILER_STEP = re.compile(r"ProfilerStep#\d+$")
LEGACY_STEP_CATEGORIES = {"Operator"}
from .kineto_events import (
    KERNEL_META_FIELDS, MEMORY_EVENT_CATEGORY, MEMORY_EVENT_NAME, CallArgs, CopyArgs, CpuOpArgs, Event, KernelArgs,
    MemoryArgs, SyncArgs, decode_args, role_of,
)

# Beyond this a time (base included) is corrupt: past ±2^62 ns (Unix µs of year ~2116),
# where base + µs*1000 or a difference of two times would leave int64.
MAX_TIME_US = 4.6e15
# Kineto writes "no stream" as -1 or as its uint32 image.
_NO_STREAM = {-1, 0xFFFFFFFF}
# c10::DeviceType codes the schema names; others are kept as the raw code. ROCm builds of
# PyTorch write their GPUs' allocator events as HIP (6), devices PyTorch itself calls `cuda`.
_DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "cuda"}
# Roles whose events become rows: (args shape, name used in warnings).
COMPLETE_ROLES: dict[str, tuple[Any, str]] = {
    "runtime": (CallArgs, "runtime API"),
    "driver": (CallArgs, "driver API"),
    "kernel": (KernelArgs, "kernel"),
    "memcpy": (CopyArgs, "memcpy"),
    "memset": (CopyArgs, "memset"),
    "sync": (SyncArgs, "cuda_sync"),
    "user_annotation": (None, "user_annotation"),
    "gpu_user_annotation": (None, "gpu_user_annotation"),
    "cpu_op": (CpuOpArgs, "cpu_op"),
    # Frames only: their args (Python ids, which time nesting makes redundant) are never decoded.
    "python_function": (None, "python_function"),
}
MEMORY = "memory"
# Names of runtime/driver calls kept to tell the vendor (hip* vs cu*).
VENDOR_SAMPLE = 1000
PH_SAMPLE = 100_000
TS_SAMPLE = 10_000

Column = Any  # pa.Array / pa.ChunkedArray, or a list where a value fits no Arrow type


def _ints(values: list) -> Column:
    """int64 Arrow, or the list itself when a value does not fit (a tid of `"stream
    99999999999999999999"`): `make_table` then reports it as before."""
    try:
        return pa.array(values, type=pa.int64())
    except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError):
        return values


def _floats(values: list) -> pa.Array:
    return pa.array(values, type=pa.float64())


def _strings(values: list) -> Column:
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeError):
        return values


def _kernel_meta(args: list[CpuOpArgs]) -> pa.Array:
    """Per operator, the compiled-kernel launch metadata it carries as one JSON object's text
    (NULL for the operators, nearly all, that carry none): only the keys the trace wrote, their
    values as the trace wrote them. An operator counts when it says which kernel it launched
    (`kernel_name`, `kernel_hash` or `kernel_file`): a bare `grid` or `num_warps` is no such record."""
    out: list[str | None] = []
    for x in args:
        if not (len(x.kernel_name) or len(x.kernel_hash) or len(x.kernel_file)):
            out.append(None)
            continue
        parts = [b'"' + k.encode() + b'": ' + bytes(getattr(x, k)) for k in KERNEL_META_FIELDS if len(getattr(x, k))]
        out.append((b"{" + b", ".join(parts) + b"}").decode("utf-8", "replace"))
    return pa.array(out, type=pa.string())


def _dims(lists: list) -> dict[str, Any]:
    """grid/block lists as present-flags and three dims (a short list gives NULLs)."""
    return {
        "has": np.fromiter((v is not None for v in lists), dtype=bool, count=len(lists)),
        "x": _ints([v[0] if v is not None and len(v) > 0 else None for v in lists]),
        "y": _ints([v[1] if v is not None and len(v) > 1 else None for v in lists]),
        "z": _ints([v[2] if v is not None and len(v) > 2 else None for v in lists]),
    }


@dataclass
class _Role:
    """What is kept of one role's events, per category, per chunk."""

    parts: dict[str | None, list[dict[str, Any]]] = field(default_factory=dict)
    total: int = 0
    missing: int = 0
    negative: int = 0
    names: dict[str | None, list[str | None]] = field(default_factory=dict)  # first names, per category


class Collector:
    """Takes chunks of events; keeps per-role columns (see the module docstring)."""

    def __init__(self) -> None:
        self.ids = IdParser()
        self.roles: dict[str, _Role] = {r: _Role() for r in (*COMPLETE_ROLES, "mtia", MEMORY)}
        self.cat_order: dict[str, None] = {}  # categories by first appearance (None always last)
        self._counts: dict[str | None, int] = {}
        self.n_events = 0
        self.first_ph: int | None = None  # index of the first event with a `ph`, if among the first PH_SAMPLE
        self.ts_sample: list[float] = []

    @property
    def any_ph(self) -> bool:
        return self.first_ph is not None

    def add(self, events: list[Event]) -> None:
        if not events:
            return
        if self.first_ph is None and self.n_events < PH_SAMPLE:
            i = next((i for i, e in enumerate(islice(events, PH_SAMPLE - self.n_events)) if e.ph is not None), None)
            if i is not None:
                self.first_ph = self.n_events + i
        if len(self.ts_sample) < TS_SAMPLE:
            self.ts_sample += islice((e.ts for e in events if e.ts is not None), TS_SAMPLE - len(self.ts_sample))
        self.n_events += len(events)

        cats = pa.array([e.cat for e in events], type=pa.string()).dictionary_encode()
        names = cats.dictionary.to_pylist() + [None]
        codes = cats.indices.fill_null(len(names) - 1).to_numpy(zero_copy_only=False)
        order = np.argsort(codes, kind="stable")
        bounds = np.cumsum(np.bincount(codes, minlength=len(names))).tolist()
        start = 0
        for cat, end in zip(names, bounds):
            if end == start:
                continue
            if cat is not None:
                self.cat_order.setdefault(cat)
            self._counts[cat] = self._counts.get(cat, 0) + (end - start)
            role = role_of(cat)
            if role is not None or cat is None or cat.lower() == MEMORY_EVENT_CATEGORY:
                members = [events[i] for i in order[start:end].tolist()]
                if role is None:
                    members = [e for e in members if e.name == MEMORY_EVENT_NAME]
                    if members:
                        self._stage_memory(cat, members)
                elif role == "mtia":
                    self.roles[role].total += len(members)
                elif role == "cpu_op" and cat in LEGACY_STEP_CATEGORIES:
                    # 2021 traces record ProfilerStep#N as an operator, later ones as a user
                    # annotation: a step either way, never an operator.
                    steps = [e for e in members if e.name and PROFILER_STEP.match(e.name)]
                    if steps:
                        self._stage("user_annotation", cat, steps)
                        members = [e for e in members if not (e.name and PROFILER_STEP.match(e.name))]
                    self._stage(role, cat, members)
                else:
                    self._stage(role, cat, members)
            start = end

    # -- per chunk ----------------------------------------------------------------------

    def _stage(self, role: str, cat: str, events: list[Event]) -> None:
        r = self.roles[role]
        r.total += len(events)
        if role in ("runtime", "driver"):
            head = r.names.setdefault(cat, [])
            if len(head) < VENDOR_SAMPLE:
                head += [e.name for e in islice(events, VENDOR_SAMPLE - len(head))]
        usable: list[Event] = []
        for e in events:
            if e.ts is None or e.dur is None or e.name is None:
                r.missing += 1
            elif e.dur < 0:
                r.negative += 1
            else:
                usable.append(e)
        if not usable:
            return
        shape = COMPLETE_ROLES[role][0]
        n = len(usable)
        part: dict[str, Any] = {
            "ts": np.fromiter((e.ts for e in usable), dtype=np.float64, count=n),
            "dur": np.fromiter((e.dur for e in usable), dtype=np.float64, count=n),
        }
        if shape is None:
            part["ok"] = np.ones(n, dtype=bool)
            args: list = []
        else:
            args = decode_args(usable, shape)
            part["ok"] = np.fromiter((x is not None for x in args), dtype=bool, count=n)
            if not part["ok"].all():
                blank = shape()
                args = [blank if x is None else x for x in args]
        part.update(getattr(self, f"_cols_{role}")(usable, args))
        r.parts.setdefault(cat, []).append(part)

    def _gpu_place(self, events: list[Event], a: list) -> dict[str, Column]:
        ids = self.ids
        devices = [x.device if x.device is not None else ids(e.pid) for e, x in zip(events, a)]
        streams = [x.stream if x.stream is not None else ids(e.tid) for e, x in zip(events, a)]
        return {"device": _ints(devices), "stream": _ints([None if s in _NO_STREAM else s for s in streams]),
                "context": _ints([x.context for x in a]), "correlation": _ints([x.correlation for x in a])}

    def _pid_tid(self, events: list[Event]) -> dict[str, Column]:
        pids = [e.pid for e in events]
        tids = [e.tid for e in events]
        try:  # the usual case: ints already
            return {"pid": pa.array(pids, type=pa.int64()), "tid": pa.array(tids, type=pa.int64())}
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            ids = self.ids
            return {"pid": _ints([ids(v) for v in pids]), "tid": _ints([ids(v) for v in tids])}

    def _cols_calls(self, events: list[Event], a: list[CallArgs]) -> dict[str, Any]:
        cols = {"name": _strings([e.name for e in events]), **self._pid_tid(events),
                "correlation": _ints([x.correlation for x in a]),
                "external": _ints(coalesce([x.external_id for x in a], [x.external_id_legacy for x in a])),
                "smem": _ints([x.shared_memory_bytes for x in a]),
                "size": [x.size for x in a]}
        cols.update({f"grid_{k}": v for k, v in _dims([x.grid for x in a]).items()})
        cols.update({f"block_{k}": v for k, v in _dims([x.block for x in a]).items()})
        return cols

    _cols_runtime = _cols_calls
    _cols_driver = _cols_calls

    def _cols_kernel(self, events: list[Event], a: list[KernelArgs]) -> dict[str, Any]:
        cols = {"name": _strings([e.name for e in events]), **self._gpu_place(events, a),
                "registers": _ints([x.registers_per_thread for x in a]),
                "smem": _ints([x.shared_memory_bytes for x in a]),
                "external": _ints(coalesce([x.external_id for x in a], [x.external_id_legacy for x in a])),
                # CUPTI writes graph id 0 for kernels not launched from a graph.
                "graph_id": _ints([x.graph_id or None for x in a]),
                "blocks_per_sm": _floats([x.blocks_per_sm for x in a]),
                "occupancy": _floats(coalesce([x.est_occupancy_pct for x in a],
                                              [x.theoretical_occupancy_pct for x in a]))}
        cols.update({f"grid_{k}": v for k, v in _dims([x.grid for x in a]).items()})
        cols.update({f"block_{k}": v for k, v in _dims([x.block for x in a]).items()})
        return cols

    def _cols_memcpy(self, events: list[Event], a: list[CopyArgs]) -> dict[str, Any]:
        return {"name": _strings([e.name for e in events]), **self._gpu_place(events, a),
                "bytes": _ints([x.bytes for x in a]),
                "from_device": _ints([x.from_device for x in a]), "to_device": _ints([x.to_device for x in a])}

    def _cols_memset(self, events: list[Event], a: list[CopyArgs]) -> dict[str, Any]:
        return {"name": _strings([e.name for e in events]), **self._gpu_place(events, a),
                "bytes": _ints([x.bytes for x in a])}

    def _cols_sync(self, events: list[Event], a: list[SyncArgs]) -> dict[str, Any]:
        return {**self._gpu_place(events, a),
                "record_name": _strings([x.cuda_sync_kind or e.name for e, x in zip(events, a)])}

    def _cols_user_annotation(self, events: list[Event], a: list) -> dict[str, Any]:
        return {"name": _strings([e.name for e in events]), **self._pid_tid(events)}

    _cols_python_function = _cols_user_annotation

    def _cols_gpu_user_annotation(self, events: list[Event], a: list) -> dict[str, Any]:
        ids = self.ids
        return {"name": _strings([e.name for e in events]), "device": _ints([ids(e.pid) for e in events]),
                "stream": _ints([ids(e.tid) for e in events])}

    def _cols_cpu_op(self, events: list[Event], a: list[CpuOpArgs]) -> dict[str, Any]:
        return {"name": _strings([e.name for e in events]), **self._pid_tid(events),
                "input_dims": raw_json_text([x.input_dims if len(x.input_dims) else x.input_dims_legacy
                                             for x in a]),
                "input_types": raw_json_text([x.input_types for x in a]),
                "concrete_inputs": raw_json_text([x.concrete_inputs for x in a]),
                "external": _ints(coalesce([x.external_id for x in a], [x.external_id_legacy for x in a])),
                "sequence_number": _ints([x.sequence_number for x in a]),
                "kernel_meta": _kernel_meta(a)}

    def _stage_memory(self, cat: str | None, events: list[Event]) -> None:
        r = self.roles[MEMORY]
        r.total += len(events)
        usable = [e for e in events if e.ts is not None]
        r.missing += len(events) - len(usable)
        if not usable:
            return
        n = len(usable)
        args = decode_args(usable, MemoryArgs)
        ok = np.fromiter((x is not None for x in args), dtype=bool, count=n)
        if not ok.all():
            blank = MemoryArgs()
            args = [blank if x is None else x for x in args]
        r.parts.setdefault(cat, []).append({
            "ts": np.fromiter((e.ts for e in usable), dtype=np.float64, count=n), "ok": ok,
            "device_type": _strings([None if x.device_type is None
                                     else _DEVICE_TYPES.get(x.device_type, str(x.device_type)) for x in args]),
            "device_id": _ints([x.device_id for x in args]),
            "address": _ints([x.addr for x in args]),
            "bytes": _ints([x.bytes for x in args]),
            "total_allocated": _ints([x.total_allocated for x in args]),
            "total_reserved": _ints([x.total_reserved for x in args]),
            **self._pid_tid(usable),
        })

    def merge(self, later: Collector) -> None:
        """Append what `later` collected from the events that follow this one's in the
        file (the second part of a split read): the result is what one Collector would
        hold after reading both parts in order."""
        for role, r in later.roles.items():
            mine = self.roles[role]
            mine.total += r.total
            mine.missing += r.missing
            mine.negative += r.negative
            for cat, parts in r.parts.items():
                mine.parts.setdefault(cat, []).extend(parts)
            for cat, names in r.names.items():
                head = mine.names.setdefault(cat, [])
                head += names[:max(0, VENDOR_SAMPLE - len(head))]
        for cat in later.cat_order:
            self.cat_order.setdefault(cat)
        for cat, n in later._counts.items():
            self._counts[cat] = self._counts.get(cat, 0) + n
        if self.first_ph is None and later.first_ph is not None and self.n_events + later.first_ph < PH_SAMPLE:
            self.first_ph = self.n_events + later.first_ph
        self.ts_sample += later.ts_sample[:max(0, TS_SAMPLE - len(self.ts_sample))]
        self.n_events += later.n_events

    # -- after the last chunk ----------------------------------------------------------

    @property
    def counts(self) -> dict[str, int]:
        """Events per category, by first appearance, no category (`"None"`) last."""
        out: dict[str, int] = {}
        for cat in chain(self.cat_order, [None]):
            if cat in self._counts:
                out[str(cat)] = out.get(str(cat), 0) + self._counts[cat]
        return out

    def role_parts(self, role: str) -> list[dict[str, Any]]:
        """The role's chunks in row order: category by first appearance (None last), then file."""
        parts = self.roles[role].parts
        return [p for cat in chain(self.cat_order, [None]) for p in parts.get(cat, [])]

    def call_names(self) -> list[str | None]:
        """Names of the first runtime then driver events (all of them, usable or not)."""
        out: list[str | None] = []
        for role in ("runtime", "driver"):
            names = self.roles[role].names
            out += [n for cat in chain(self.cat_order, [None]) for n in names.get(cat, [])]
        return out[:VENDOR_SAMPLE] if len(out) > VENDOR_SAMPLE else out
