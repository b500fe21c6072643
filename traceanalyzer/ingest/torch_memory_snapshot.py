"""PyTorch CUDA memory snapshot reader (format ``torch-memory-snapshot``): the pickle that
``torch.cuda.memory._dump_snapshot("x.pickle")`` writes after ``_record_memory_history()``,
the file PyTorch's memory viz page opens.

What real snapshots hold (shared/traces/torch-memory): one dict of dicts, lists, tuples,
strings, ints, floats, bools and None, no class at all:

* ``segments``: one dict per segment (a ``cudaMalloc``'d range the caching allocator holds):
  ``device``, ``address``, ``total_size``, ``allocated_size``, ``active_size``,
  ``requested_size``, ``stream``, ``segment_type`` (``large``/``small``), ``segment_pool_id``
  (a 2-tuple; ``(0, 0)`` is the default pool), ``is_expandable``, ``frames`` (the stack that
  allocated it) and ``blocks``, in address order: ``address``, ``size``, ``requested_size``,
  ``state`` (``active_allocated``, ``active_pending_free``: freed but still used by a stream,
  ``inactive``: free) and ``frames`` (empty for a block allocated before the history was
  recorded). PyTorch 2.0 gives a block ``history`` (a list of ``{addr, real_size, frames}``)
  instead of ``frames``.
* ``device_traces``: per device index, the allocator's recorded history, oldest first (a ring
  buffer of the last ``max_entries`` actions): ``action`` (``alloc``, ``free_requested``,
  ``free_completed``, ``segment_alloc``, ``segment_free``, ``segment_map``,
  ``segment_unmap``, ``snapshot``, ``oom``), ``addr`` (for ``oom``: ``device_free`` instead,
  the bytes CUDA reported free), ``size`` (for ``oom``: the request that failed), ``stream``,
  ``time_us`` (microseconds since the Unix epoch; absent before 2.1) and ``frames``.
* Frames, innermost first: ``{"filename", "line", "name"}``; Python frames, and with
  ``stacks="all"`` C++ ones (file ``??`` or empty when unknown). Events and blocks share
  frame lists: the pickle stores each distinct frame once.
* ``allocator_settings`` (2.5 and later): ``PYTORCH_CUDA_ALLOC_CONF``, ``max_split_size``
  (-1: no limit), ``expandable_segments``, ``garbage_collection_threshold``,
  ``roundup_power2_divisions``, ...; ``external_annotations`` (not stored).

Safety: the file is unpickled by `_NoClasses`, whose ``find_class`` refuses every class, so
no opcode of the file can import or call anything (``GLOBAL``, ``STACK_GLOBAL``, ``INST``,
``OBJ``, ``EXT*``, and so ``REDUCE``/``NEWOBJ``/``BUILD`` of a class, all go through it). A
pickle that needs one is refused, naming it. The file is read whole (at most
``MAX_PICKLE_BYTES``) and unpickled from memory, so a length the file declares is never
allocated before the bytes are there. Segments, blocks and events must be distinct objects:
a pickle can name one object many times for a few bytes, and would multiply its rows.

Output: `memory_segments`, `memory_blocks`, `allocator_events`, `memory_frames` (each
distinct stack once, by ``stack_id``), `allocator_settings` and `devices` (one row per
device index, with no name: a snapshot does not record it).
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa

from .. import input_limits
from ..resources import Resources
from .base import ParsedTrace, TraceError, as_path

FORMAT = "torch-memory-snapshot"
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom")
_INT64 = 1 << 63
# time_us beyond this would make ts_ns overflow the ±2^62 ns bound every time column keeps.
_MAX_ABS_TIME_US = input_limits.MAX_ABS_TIME_NS // 1000


class _NeedsClass(Exception):
    pass


class _NoClasses(pickle.Unpickler):
    """An unpickler that builds only the built-in containers and scalars."""

    def find_class(self, module, name):
        raise _NeedsClass(f"the Python class {str(module)[:80]}.{str(name)[:80]}")

    def persistent_load(self, pid):
        raise _NeedsClass("an object it does not hold (a persistent id)")


def read(path: str | Path, *, resources: Resources | None = None) -> ParsedTrace:
    """`resources` is accepted for the readers' one signature; a snapshot is read on one CPU."""
    path = as_path(path)
    input_limits.check_pickle_size(path.stat().st_size)
    doc = unpickle(path.read_bytes())
    if isinstance(doc, list):  # torch.cuda.memory_snapshot() of PyTorch 1.x, pickled as it is: the segments
        doc = {"segments": doc}
    if not isinstance(doc, dict) or "segments" not in doc:
        raise TraceError(f"pickle holds {_kind(doc)} without `segments`: not a PyTorch memory snapshot "
                         "(torch.cuda.memory._dump_snapshot)")
    return _Builder().build(doc)


def unpickle(data: bytes) -> Any:
    """The object a pickle holds, built without any class; TraceError when it needs one or
    is damaged."""
    buffer = io.BytesIO(data)
    try:
        doc = _NoClasses(buffer).load()
    except _NeedsClass as e:
        raise TraceError(f"the pickle needs {e} and was refused, nothing of it run: a memory "
                         "snapshot holds only dicts, lists, strings and numbers") from None
    except MemoryError:  # the C unpickler allocates a declared BINBYTES8 length before reading it
        raise TraceError("pickle could not be loaded: out of memory (an object it declares is larger than memory, "
                         "or the machine is short of memory)") from None
    except EOFError:
        raise TraceError("pickle cut short (the file ends before its STOP opcode)") from None
    except Exception as e:  # noqa: BLE001 - damaged opcodes fail in many ways; no class can run
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceError(f"corrupt pickle ({text[:120]})") from None
    if buffer.tell() < len(data):
        raise TraceError(f"{len(data) - buffer.tell():,} bytes of trailing data after the pickle's end")
    return doc


def _kind(v: Any) -> str:
    return {dict: "a dict", list: "a list", tuple: "a tuple", str: "a string", bool: "a bool",
            int: "an integer", float: "a number"}.get(type(v), "a " + type(v).__name__)


def _int(v: Any, where: str, *, required: bool = False) -> int | None:
    if v is None:
        if required:
            raise TraceError(f"{where} is missing")
        return None
    if type(v) is not int:  # bool is an int to Python, never a size or an address
        raise TraceError(f"{where} is {_kind(v)}, not an integer")
    if not -_INT64 <= v < _INT64:
        raise TraceError(f"{where} = {v:.3g} does not fit 64 bits" if abs(v) < 1e300 else f"{where} does not fit 64 bits")
    return v


def _device(v: Any, where: str) -> int | None:
    d = _int(v, where)
    if d is not None and not 0 <= d < 1 << 16:
        raise TraceError(f"{where} = {d} is no device index")
    return d


def _str(v: Any, where: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise TraceError(f"{where} is {_kind(v)}, not a string")
    return v


def _bool(v: Any, where: str) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    if type(v) is int and v in (0, 1):
        return bool(v)
    raise TraceError(f"{where} is {_kind(v)}, not true or false")


def _list(v: Any, where: str) -> list:
    if v is None:
        return []
    if not isinstance(v, (list, tuple)):
        raise TraceError(f"{where} is {_kind(v)}, not a list")
    return v


def _dict(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise TraceError(f"{where} is {_kind(v)}, not a dict")
    return v


class _Stacks:
    """Distinct stacks, each numbered once: by the frame list object first (events and
    blocks share lists), then by content."""

    def __init__(self):
        self.by_list: dict[int, int] = {}
        self.by_frames: dict[tuple, int] = {}
        self.frame_keys: dict[int, tuple] = {}
        self.rows: dict[str, list] = {"stack_id": [], "depth": [], "filename": [], "line": [], "name": []}

    def id_of(self, frames: Any, where: str) -> int | None:
        if frames is None:
            return None
        sid = self.by_list.get(id(frames))
        if sid is not None:
            return sid
        frames = _list(frames, where)
        if not frames:
            return None
        key = tuple(self._frame(f, f"{where}[{i}]") for i, f in enumerate(frames))
        sid = self.by_frames.get(key)
        if sid is None:
            sid = self.by_frames[key] = len(self.by_frames)
            for depth, (filename, line, name) in enumerate(key):
                for col, v in zip(self.rows, (sid, depth, filename, line, name)):
                    self.rows[col].append(v)
        self.by_list[id(frames)] = sid
        return sid

    def _frame(self, f: Any, where: str) -> tuple:
        key = self.frame_keys.get(id(f))
        if key is None:
            f = _dict(f, where)
            key = self.frame_keys[id(f)] = (_str(f.get("filename"), f"{where}.filename"),
                                            _int(f.get("line"), f"{where}.line"), _str(f.get("name"), f"{where}.name"))
        return key

    def table(self) -> pa.Table:
        r = self.rows
        return pa.table({"stack_id": pa.array(r["stack_id"], pa.int64()), "depth": pa.array(r["depth"], pa.int32()),
                         "filename": pa.array(r["filename"], pa.string()), "line": pa.array(r["line"], pa.int64()),
                         "name": pa.array(r["name"], pa.string())})


class _Builder:
    def __init__(self):
        self.stacks = _Stacks()
        self.seen: set[int] = set()  # ids of the segment, block and event dicts read
        self.warnings: list[str] = []
        self.layout = "frames"  # "history": PyTorch 2.0's blocks

    def _once(self, obj: dict, where: str) -> None:
        if id(obj) in self.seen:
            raise TraceError(f"{where} is the same object as an earlier entry: a snapshot never repeats one "
                             "(a pickle made to multiply its rows?)")
        self.seen.add(id(obj))

    def build(self, doc: dict) -> ParsedTrace:
        segments, blocks = self._segments(_list(doc.get("segments"), "segments"))
        events = self._events(_list(doc.get("device_traces"), "device_traces"))
        tables = {"memory_segments": segments, "memory_blocks": blocks, "allocator_events": events,
                  "memory_frames": self.stacks.table()}
        settings = self._settings(doc.get("allocator_settings"))
        if settings is not None:
            tables["allocator_settings"] = settings
        devices = sorted({d for d in segments.column("device_id").to_pylist() if d is not None}
                         | {d for d in events.column("device_id").to_pylist()})
        if devices:
            tables["devices"] = pa.table({"device_id": pa.array(devices, pa.int32())})
        if not events.num_rows:
            self.warnings.append("the snapshot holds no allocator history (record it with "
                                 "torch.cuda.memory._record_memory_history() before the code to look at)")
        states = blocks.column("state").to_pylist()
        unknown = sorted({s for s in states if s not in BLOCK_STATES})
        if unknown:
            self.warnings.append(f"block states not known to this reader, kept as written: {', '.join(map(repr, unknown[:5]))}")
        actions = sorted({a for a in events.column("action").to_pylist() if a not in ACTIONS})
        if actions:
            self.warnings.append(f"allocator actions not known to this reader, kept as written: {', '.join(map(repr, actions[:5]))}")
        timed = events.column("ts_ns").null_count < events.num_rows
        metadata = {"segments": segments.num_rows, "blocks": blocks.num_rows, "history_events": events.num_rows,
                    "stacks": len(self.stacks.by_frames), "top_level_keys": sorted(map(str, doc))[:20],
                    "external_annotations": len(doc["external_annotations"])
                    if isinstance(doc.get("external_annotations"), list) else None}
        return ParsedTrace(format=FORMAT, producer="pytorch", schema_version=self.layout,
                           clock="unix-epoch" if timed else "none", metadata=metadata, tables=tables,
                           warnings=self.warnings)

    def _segments(self, raw: list) -> tuple[pa.Table, pa.Table]:
        seg = {c: [] for c in ("segment_id", "device_id", "address", "total_bytes", "allocated_bytes", "active_bytes",
                               "requested_bytes", "stream_id", "segment_type", "pool_id", "is_expandable", "stack_id")}
        blk = {c: [] for c in ("block_id", "segment_id", "device_id", "address", "bytes", "requested_bytes", "state",
                               "stack_id")}
        for i, s in enumerate(raw):
            w = f"segments[{i}]"
            s = _dict(s, w)
            self._once(s, w)
            device = _device(s.get("device"), f"{w}.device")
            address = _int(s.get("address"), f"{w}.address", required=True)
            pool = s.get("segment_pool_id")
            pool_text = ",".join(str(_int(p, f"{w}.segment_pool_id")) for p in _list(pool, f"{w}.segment_pool_id")) \
                if pool is not None else None
            values = (i, device, address, _int(s.get("total_size"), f"{w}.total_size", required=True),
                      _int(s.get("allocated_size"), f"{w}.allocated_size"), _int(s.get("active_size"), f"{w}.active_size"),
                      _int(s.get("requested_size"), f"{w}.requested_size"), _int(s.get("stream"), f"{w}.stream"),
                      _str(s.get("segment_type"), f"{w}.segment_type"), pool_text,
                      _bool(s.get("is_expandable"), f"{w}.is_expandable"), self.stacks.id_of(s.get("frames"), f"{w}.frames"))
            for col, v in zip(seg, values):
                seg[col].append(v)
            next_address = address
            for j, b in enumerate(_list(s.get("blocks"), f"{w}.blocks")):
                wb = f"{w}.blocks[{j}]"
                b = _dict(b, wb)
                self._once(b, wb)
                size = _int(b.get("size"), f"{wb}.size", required=True)
                # Blocks tile their segment in order; PyTorch 2.0 names no block address.
                addr = _int(b.get("address"), f"{wb}.address")
                addr = next_address if addr is None else addr
                next_address = addr + size if -_INT64 <= addr + size < _INT64 else addr
                state = _str(b.get("state"), f"{wb}.state")
                frames = b.get("frames")
                if frames is None and b.get("history"):  # PyTorch 2.0: the allocations made in the block
                    self.layout = "history"
                    last = _list(b["history"], f"{wb}.history")[-1]
                    frames = _dict(last, f"{wb}.history[-1]").get("frames")
                values = (len(blk["block_id"]), i, device, addr, size, _int(b.get("requested_size"), f"{wb}.requested_size"),
                          state, self.stacks.id_of(frames, f"{wb}.frames"))
                for col, v in zip(blk, values):
                    blk[col].append(v)
        return (pa.table({c: pa.array(v, _TYPES[c]) for c, v in seg.items()}),
                pa.table({c: pa.array(v, _TYPES[c]) for c, v in blk.items()}))

    def _events(self, traces: list) -> pa.Table:
        ev = {c: [] for c in ("event_id", "device_id", "ts_ns", "action", "address", "bytes", "stream_id",
                              "device_free_bytes", "stack_id")}
        for device, trace in enumerate(traces):
            trace = _list(trace, f"device_traces[{device}]")
            if trace and device >= 1 << 16:
                raise TraceError(f"device_traces[{device}] is no device index")
            for i, e in enumerate(trace):
                w = f"device_traces[{device}][{i}]"
                e = _dict(e, w)
                self._once(e, w)
                action = _str(e.get("action"), f"{w}.action")
                if action is None:
                    raise TraceError(f"{w}.action is missing")
                t = _int(e.get("time_us"), f"{w}.time_us")
                if t is not None and abs(t) > _MAX_ABS_TIME_US:
                    raise TraceError(f"{w}.time_us = {t} is beyond ±2^62 ns (a corrupt time)")
                values = (len(ev["event_id"]), device, None if t is None else t * 1000, action,
                          _int(e.get("addr"), f"{w}.addr"), _int(e.get("size"), f"{w}.size"),
                          _int(e.get("stream"), f"{w}.stream"), _int(e.get("device_free"), f"{w}.device_free"),
                          self.stacks.id_of(e.get("frames"), f"{w}.frames"))
                for col, v in zip(ev, values):
                    ev[col].append(v)
        return pa.table({c: pa.array(v, _TYPES[c]) for c, v in ev.items()})

    def _settings(self, raw: Any) -> pa.Table | None:
        if raw is None:
            return None
        s = _dict(raw, "allocator_settings")
        max_split = _int(s.get("max_split_size"), "allocator_settings.max_split_size")
        gc = s.get("garbage_collection_threshold")
        if gc is not None and (isinstance(gc, bool) or not isinstance(gc, (int, float))):
            raise TraceError(f"allocator_settings.garbage_collection_threshold is {_kind(gc)}, not a number")
        conf = s.get("PYTORCH_CUDA_ALLOC_CONF", s.get("PYTORCH_HIP_ALLOC_CONF"))
        kept = {str(k): v for k, v in s.items() if _plain(v)}
        if len(kept) < len(s):
            self.warnings.append(f"{len(s) - len(kept)} allocator setting(s) of an unexpected shape not stored")
        return pa.table({
            "alloc_conf": pa.array([_str(conf, "allocator_settings.PYTORCH_CUDA_ALLOC_CONF")], pa.string()),
            "expandable_segments": pa.array([_bool(s.get("expandable_segments"), "allocator_settings.expandable_segments")],
                                            pa.bool_()),
            # -1 (SIZE_MAX as a signed number) is PyTorch's "no limit"
            "max_split_size_bytes": pa.array([None if max_split is None or max_split < 0 else max_split], pa.int64()),
            "garbage_collection_threshold": pa.array([None if gc is None else float(gc)], pa.float64()),
            "settings": pa.array([json.dumps(kept, sort_keys=True, allow_nan=False, default=str)], pa.string()),
        })


def _plain(v: Any, depth: int = 0) -> bool:
    """A setting JSON can hold as it is: a scalar, or a flat dict or list of them (roundup
    divisions); anything deeper is no setting PyTorch writes."""
    if v is None or isinstance(v, (bool, int, str)):
        return not isinstance(v, int) or isinstance(v, bool) or -_INT64 <= v < _INT64
    if isinstance(v, float):
        return v == v and abs(v) != float("inf")
    if depth == 0 and isinstance(v, dict):
        return len(v) <= 1000 and all(isinstance(k, str) and _plain(x, 1) for k, x in v.items())
    if depth == 0 and isinstance(v, (list, tuple)):
        return len(v) <= 1000 and all(_plain(x, 1) for x in v)
    return False


_TYPES = {
    "segment_id": pa.int64(), "block_id": pa.int64(), "event_id": pa.int64(), "device_id": pa.int32(),
    "address": pa.int64(), "total_bytes": pa.int64(), "allocated_bytes": pa.int64(), "active_bytes": pa.int64(),
    "requested_bytes": pa.int64(), "bytes": pa.int64(), "stream_id": pa.int64(), "segment_type": pa.string(),
    "pool_id": pa.string(), "is_expandable": pa.bool_(), "stack_id": pa.int64(), "state": pa.string(),
    "ts_ns": pa.int64(), "action": pa.string(), "device_free_bytes": pa.int64(),
}
