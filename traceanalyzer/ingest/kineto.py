"""Reader for PyTorch profiler / Kineto Chrome-trace JSON (`.json`, `.json.gz`).

How the file is decoded, and why. `python bench/bench_json_decode.py` (a real H100 trace's
events replicated to 111 MB / 264 304 events; each decoder in its own process; best of 3
on a shared 2-core machine; peak = VmHWM added by the decode, the input bytes included,
module imports excluded):

    decoder                                          s    vs json   peak MB  peak/file
    json.loads                                     2.97     1.00      510      4.6
    orjson.loads                                   2.15     1.38      709      6.4
    msgspec.json.decode, untyped                   2.19     1.35      451      4.1
    msgspec typed, every event's args typed        0.39     7.6       278      2.5
    msgspec typed, args kept raw       (chosen)    0.42     7.0       235      2.1
    msgspec raw events, typed in chunks            0.64     4.6       343      3.1
    read() end to end, all Arrow tables built      1.00     3.0       320      2.9

(Other runs on the same file: json.loads 1.7-3.0 s, read() 1.0-1.2 s; the ranking holds and
peak memory repeats within a few MB.)

A generic decode builds a dict per event and per args object (python_function stacks,
`Input Strides`, `Concrete Inputs` ...) that the schema never uses; typed decoding into
`kineto_events.Event` skips those keys in C. Args stay `msgspec.Raw` slices of the
input and are decoded per category, in one batch, into Structs of just the fields that
category needs, so the events nobody reads (flows, python_function, metadata) never have
their args parsed at all. Typing every event's args in the first pass is a little faster
but puts all categories under one Struct: one odd value type anywhere (ROCm writes
`"stream": "0x0"` on runtime calls) would fail the whole file, where per-category
batches only lose the offending events. Keeping events raw and typing them in chunks
(to never materialise python_function events) was measured too: slower and no leaner.

Format facts used (docs/formats.md §4, checked against the files in shared/traces/torch):
times are µs, `ts` relative to `baseTimeNanoseconds` when that key exists (absolute ns =
base + round(ts*1000)), else absolute Unix-epoch µs; GPU events have pid = device and
tid = stream (`"stream 7"` before Aug 2021); categories change case and name across
eras, so they go through `kineto_events.CATEGORY_ROLES` lower-cased.
"""

from __future__ import annotations

from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
from msgspec import Raw

from .. import limits
from .base import ParsedTrace, TraceError, as_path
from .detect import GZIP_MAGIC, KINETO
from .kineto_devices import devices_table
from .kineto_events import MEMORY_EVENT_CATEGORY, MEMORY_EVENT_NAME, Event, role_of
from .kineto_tables import TableBuilder

# Top-level keys whose JSON text is longer than this stay out of runs.metadata.
MAX_METADATA_VALUE_BYTES = 16 * 1024
# ... and keys longer or values nested deeper than these.
MAX_METADATA_KEY_CHARS = 256
MAX_METADATA_DEPTH = 64
# Absolute Kineto timestamps are Unix-epoch µs: anything at or past 2001-09-09 is one.
MIN_EPOCH_US = 1e15
_RUN_FACT_KEYS = ("baseTimeNanoseconds", "distributedInfo", "deviceProperties", "computeProperties",
                  "schemaVersion", "host_name", "hostname")
LEGACY_CATEGORIES = {"Operator", "Runtime", "Kernel", "Memcpy", "Memset"}
SHARED_MEMORY_NOTE = (
    "Kineto's kernel arg `shared memory` is static + dynamic shared memory per block; it is "
    "stored in kernels.static_shared_mem_bytes and dynamic_shared_mem_bytes is NULL"
)


def read(path: str | Path) -> ParsedTrace:
    path = as_path(path)
    try:
        with limits.json_depth():  # msgspec counts nesting against the recursion limit
            top, events = _decode(_load(path))
        return _parse(top, events)
    except RecursionError:
        raise limits.depth_error() from None


def _load(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(f"cannot read file ({e.strerror})") from None
    if raw[:2] == GZIP_MAGIC:  # bounded: a small file may inflate a thousandfold
        raw = limits.gunzip(raw)
    return raw.removeprefix(b"\xef\xbb\xbf")


def _decode(data: bytes) -> tuple[dict[str, Raw], list[Event]]:
    """Top-level keys as raw JSON slices, and the typed events."""
    first = data.lstrip()[:1]
    if first not in (b"{", b"["):
        raise TraceError("not a JSON object or array, so not a Kineto trace")
    where = "$"
    try:
        if first == b"[":  # bare array of events
            return {}, msgspec.json.decode(data, type=list[Event])
        top = msgspec.json.decode(data, type=dict[str, Raw])
        if "traceEvents" not in top:
            raise TraceError("JSON object without a `traceEvents` array: not a Kineto trace")
        where = "$.traceEvents"
        return top, msgspec.json.decode(top["traceEvents"], type=list[Event])
    except msgspec.ValidationError as e:  # a DecodeError subclass: test it first
        msg = str(e).replace("`$", f"`{where}", 1) if "`$" in str(e) else f"{e} - at `{where}`"
        raise TraceError(f"not a Kineto trace: {msg}") from None
    except msgspec.DecodeError as e:
        raise TraceError(f"invalid JSON ({e})") from None


def _metadata(top: dict[str, Raw]) -> tuple[dict[str, Any], list[str]]:
    meta, omitted = {}, []
    for key, raw in top.items():
        if key == "traceEvents":
            continue
        if len(key) > MAX_METADATA_KEY_CHARS:  # junk, and it would be stored as a name
            omitted.append(f"<{len(key)}-character key>")
            continue
        if len(raw) > MAX_METADATA_VALUE_BYTES:
            omitted.append(key)
            continue
        try:  # the store writes metadata as JSON: keep deep values out like big ones
            with limits.json_depth(MAX_METADATA_DEPTH):
                meta[key] = msgspec.json.decode(raw)
        except RecursionError:
            omitted.append(key)
    return meta, omitted


def _typed(meta: dict[str, Any], key: str, kind: type, what: str) -> Any:
    value = meta.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise TraceError(f"`{key}` is {type(value).__name__}, expected {what}")
    return value


def _group(events: list[Event]) -> tuple[dict[str, list[Event]], list[Event], dict[str, int]]:
    """Split events by role; memory instants are found by name (their `cat` is
    `cpu_instant_event` now and absent in 2021 traces).

    Grouping is done on the category column with Arrow/numpy (dictionary-encode, stable
    argsort, split) rather than a dict append per event: 0.21 s -> 0.06 s on the bench's
    111 MB file."""
    cats = pa.array([e.cat for e in events], type=pa.string()).dictionary_encode()
    names = cats.dictionary.to_pylist() + [None]
    codes = cats.indices.fill_null(len(names) - 1).to_numpy()
    order = np.argsort(codes, kind="stable")
    bounds = np.cumsum(np.bincount(codes, minlength=len(names)))
    groups: dict[str, list[Event]] = {}
    memory: list[Event] = []
    counts: dict[str, int] = {}
    start = 0
    for cat, end in zip(names, bounds.tolist()):
        if end == start:
            continue
        members = [events[i] for i in order[start:end].tolist()]
        counts[str(cat)] = counts.get(str(cat), 0) + len(members)
        role = role_of(cat)
        if role is not None:
            groups.setdefault(role, []).extend(members)
        elif cat is None or cat.lower() == MEMORY_EVENT_CATEGORY:
            memory += [e for e in members if e.name == MEMORY_EVENT_NAME]
        start = end
    return groups, memory, counts


def _time_facts(events: list[Event], base_ns: int | None, legacy: bool) -> tuple[str, str]:
    """(clock, schema_version) from a sample of timestamps."""
    sample = [t for t in islice((e.ts for e in events if e.ts is not None), 10_000)]
    fractional = any(t != int(t) for t in sample)
    if base_ns is not None:
        clock, ts_kind = "unix-epoch", "ts-relative-to-base"
    elif sample and min(sample) >= MIN_EPOCH_US:
        clock, ts_kind = "unix-epoch", "ts-float-us" if fractional else "ts-int-us"
    else:
        clock, ts_kind = "kineto-relative", "ts-relative-us"
    return clock, f"{'legacy' if legacy else 'current'}-categories/{ts_kind}"


def _run_vendor(meta: dict[str, Any], groups: dict[str, list[Event]]) -> str | None:
    """Vendor for devices the trace lists no properties for."""
    if groups.get("mtia"):
        return "meta"
    calls = list(islice((e.name or "" for e in groups.get("runtime", []) + groups.get("driver", [])), 1000))
    if "roctracer_version" in meta or "hip_runtime_version" in meta or any(n.startswith("hip") for n in calls):
        return "amd"
    if any(n.startswith("cu") for n in calls) or groups.get("kernel"):
        return "nvidia"
    return None


def _parse(top: dict[str, Raw], events: list[Event]) -> ParsedTrace:
    """Build the run. Consumes `events`: the list is cleared once grouped, so the events
    no table uses (flows, python_function, metadata) are freed before tables are built."""
    if events and not any(e.ph is not None for e in islice(events, 100_000)):
        raise TraceError("no event has a `ph` phase: not a Chrome/Kineto trace")
    meta, omitted = _metadata(top)
    # Keys the run facts come from are decoded whatever their size (pg_config can be long).
    needed = {k: msgspec.json.decode(top[k]) if k in omitted else meta.get(k) for k in _RUN_FACT_KEYS}
    base_ns = _typed(needed, "baseTimeNanoseconds", int, "an integer (ns)")
    if base_ns is not None and abs(base_ns) > limits.MAX_ABS_TIME_NS:
        raise TraceError("`baseTimeNanoseconds` lies beyond ±2^62 ns (a corrupt time base)")
    dist = needed["distributedInfo"] if isinstance(needed["distributedInfo"], dict) else {}
    groups, memory, counts = _group(events)
    legacy = bool(LEGACY_CATEGORIES & counts.keys())
    clock, era = _time_facts(events, base_ns, legacy)
    n_events = len(events)
    events.clear()

    warnings: Counter = Counter()
    b = TableBuilder(base_ns or 0, warnings)
    tables = {
        # api_calls first: the GPU tables link to it by correlation id.
        "api_calls": b.api_calls(groups.get("runtime", []), groups.get("driver", [])),
        "kernels": b.kernels(groups.get("kernel", [])),
        "copies": b.copies(groups.get("memcpy", [])),
        "memsets": b.memsets(groups.get("memset", [])),
        "syncs": b.syncs(groups.get("sync", [])),
        "ranges": b.ranges(groups.get("user_annotation", []), groups.get("gpu_user_annotation", [])),
        "cpu_ops": b.cpu_ops(groups.get("cpu_op", [])),
        "memory_events": b.memory_events(memory),
    }
    props = needed["deviceProperties"] if "deviceProperties" in top else needed["computeProperties"]
    tables["devices"], device_warnings = devices_table(props, b.gpu_device_ids, _run_vendor(meta, groups))

    out_warnings = [f"{msg}: {n}" for msg, n in warnings.items()] + device_warnings
    if not n_events:
        out_warnings.append("trace has no events")
    if groups.get("mtia"):
        out_warnings.append(
            f"MTIA events not mapped (the schema has no MTIA activity model): {len(groups['mtia'])}")
    if "kernel" not in groups and not groups.get("mtia") and counts.get("cuda_profiler_range"):
        out_warnings.append("CUPTI-profiler (counter) mode trace: no kernel activity recorded")

    meta["reader_notes"] = {
        "shared_memory": SHARED_MEMORY_NOTE,
        "event_counts_by_cat": counts,
        "omitted_large_keys": omitted,
        "time_base": "baseTimeNanoseconds + round(ts*1000)" if base_ns is not None else "round(ts*1000)",
    }
    version = needed["schemaVersion"]
    host = needed["host_name"] if needed["host_name"] is not None else needed["hostname"]
    rank, world = dist.get("rank"), dist.get("world_size")
    return ParsedTrace(
        format=KINETO,
        producer="kineto",
        producer_version=None if version is None else str(version),
        schema_version=era,
        host=host if isinstance(host, str) else None,
        clock=clock,
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        world_size=world if isinstance(world, int) and not isinstance(world, bool) else None,
        metadata=meta,
        tables={name: t for name, t in tables.items() if t is not None},
        warnings=out_warnings,
    )
