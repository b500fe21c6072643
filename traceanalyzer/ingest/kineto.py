"""Reader for PyTorch profiler / Kineto Chrome-trace JSON (`.json`, `.json.gz`).

How the file is decoded, and why. `python bench/bench_json_decode.py` (a real H100 trace's
events replicated to 111 MB / 264 304 events; each decoder in its own process; best of 3
on a shared 2-core machine; peak = VmHWM added by the decode, the input bytes included,
module imports excluded):

    decoder                                          s    vs json   peak MB  peak/file
    json.loads                                     2.98     1.00      510      4.6
    orjson.loads                                   2.98     1.00      687      6.2
    msgspec.json.decode, untyped                   2.95     1.01      451      4.1
    msgspec typed, every event's args typed        0.54     5.5       278      2.5
    msgspec typed, args kept raw, whole file       0.55     5.5       234      2.1
    msgspec raw events, typed in chunks            0.96     3.1       343      3.1
    msgspec typed, args raw, streamed  (chosen)    0.45     6.6        72      0.65
    read() end to end, all Arrow tables built      1.08     2.8       174      1.6

(The last three rows from a second run, next to msgspec typed/whole at 0.55 s again. On
the 404 MB bench file, `bench/gen_big.py kineto --copies 8`: read() 1.9 s of CPU and
310-340 MB peak RSS, imports included, where the whole-file decode took 3.3 s and 1,060 MB.)

A generic decode builds a dict per event and per args object (python_function stacks,
`Input Strides` ...) that the schema never uses; typed decoding into
`kineto_events.Event` skips those keys in C. The file is not read whole: `kineto_stream`
cuts `traceEvents` at event boundaries into ~4 MB chunks, each decoded on its own and
dropped once `kineto_collect.Collector` has kept the columns its tables need, so the peak
is the output columns plus one chunk, not the file (odd files fall back to the whole-file
decode, which keeps every error message and result exact). Args stay `msgspec.Raw`
slices of the chunk and are decoded per category, in one batch per chunk, into Structs of
just the fields that category needs, so the events whose args nobody reads (flows,
python_function, metadata) never have their args parsed at all. Typing every event's args in the first
pass reads the bench file ~15% slower (building args for the events no table reads costs
more than the second decode saves), and puts all categories under one
Struct: one odd value type anywhere (ROCm writes `"stream": "0x0"` on runtime calls) would
fail the whole chunk, where per-category batches only lose the offending events. A big plain
file is read in parts, a process a part, when the caller gives the read more than one CPU
(`kineto_parts`), with the same tables; docs/performance.md has what that saves.

Format facts used (docs/formats.md §4, checked against the files in shared/traces/torch):
times are µs, `ts` relative to `baseTimeNanoseconds` when that key exists (absolute ns =
base + round(ts*1000)), else absolute Unix-epoch µs; GPU events have pid = device and
tid = stream (`"stream 7"` before Aug 2021); categories change case and name across
eras, so they go through `kineto_events.CATEGORY_ROLES` lower-cased.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Raw

from .. import input_limits
from ..resources import Resources
from .base import ParsedTrace, TraceError, as_path
from .detect import GZIP_MAGIC, KINETO
from .kineto_devices import device_map, devices_table, remap_devices
from .kineto_events import Event
from .kineto_stream import EventStream, Unstreamable
from .kineto_collect import Collector
from . import kineto_parts
from .kineto_tables import TableBuilder

# Top-level keys whose JSON text is longer than this stay out of runs.metadata.
MAX_METADATA_VALUE_BYTES = 16 * 1024
# ... and keys longer or values nested deeper than these.
MAX_METADATA_KEY_CHARS = 256
MAX_METADATA_DEPTH = 64
# Absolute Kineto timestamps are Unix-epoch µs: anything at or past 2001-09-09 is one.
MIN_EPOCH_US = 1e15
# Events per Collector.add when a file is decoded whole (the fallback).
FALLBACK_CHUNK_EVENTS = 50_000
_RUN_FACT_KEYS = ("baseTimeNanoseconds", "distributedInfo", "deviceProperties", "computeProperties",
                  "schemaVersion", "host_name", "hostname")
LEGACY_CATEGORIES = {"Operator", "Runtime", "Kernel", "Memcpy", "Memset"}
SHARED_MEMORY_NOTE = (
    "Kineto's kernel arg `shared memory` is static + dynamic shared memory per block; it is "
    "stored in kernels.static_shared_mem_bytes and dynamic_shared_mem_bytes is NULL"
)


def read(path: str | Path, *, resources: Resources | None = None) -> ParsedTrace:
    """Streamed (`kineto_stream`), in parts on the read CPUs `resources` give (`kineto_parts`;
    default: `Resources.available()`); an odd file is decoded whole, which gives the exact
    error or result."""
    path = as_path(path)
    resources = resources or Resources.available()
    try:
        with input_limits.json_depth():  # msgspec counts nesting against the recursion limit
            plan = kineto_parts.plan(path, resources)
            readers = [lambda: kineto_parts.read(path, plan)] if plan is not None else []
            # A read in parts that fails is read again in one pass: the reference result (or error).
            for reader in readers + [lambda: _read_streamed(EventStream(path))]:
                try:
                    top, collector = reader()
                except Unstreamable:
                    continue  # (outside the except block the failed read's frames are freed)
                return _parse(top, collector)
            # The whole file at once.
            top, events = _decode(_unpack(_read(path)))
            collector = Collector()
            for i in range(0, len(events), FALLBACK_CHUNK_EVENTS):
                collector.add(events[i:i + FALLBACK_CHUNK_EVENTS])
            events.clear()
            return _parse(top, collector)
    except RecursionError:
        raise input_limits.depth_error() from None


def _read_streamed(stream: EventStream) -> tuple[dict[str, Raw], Collector]:
    collector = Collector()
    for events in stream:
        collector.add(events)
    return stream.top, collector


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise TraceError(f"cannot read file ({e.strerror})") from None


def _unpack(raw: bytes) -> bytes:
    if raw[:2] == GZIP_MAGIC:  # bounded: a small file may inflate a thousandfold
        raw = input_limits.gunzip(raw)
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
            with input_limits.json_depth(MAX_METADATA_DEPTH):
                meta[key] = msgspec.json.decode(raw)
        except RecursionError:
            omitted.append(key)
    return meta, omitted


def _typed(meta: dict[str, Any], key: str, kind: type, what: str) -> Any:
    value = meta.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise TraceError(f"`{key}` is {type(value).__name__}, expected {what}")
    return value


def _time_facts(sample: list[float], base_ns: int | None, legacy: bool) -> tuple[str, str]:
    """(clock, schema_version) from the first timestamps."""
    fractional = any(t != int(t) for t in sample)
    if base_ns is not None:
        clock, ts_kind = "unix-epoch", "ts-relative-to-base"
    elif sample and min(sample) >= MIN_EPOCH_US:
        clock, ts_kind = "unix-epoch", "ts-float-us" if fractional else "ts-int-us"
    else:
        clock, ts_kind = "kineto-relative", "ts-relative-us"
    return clock, f"{'legacy' if legacy else 'current'}-categories/{ts_kind}"


def _run_vendor(meta: dict[str, Any], c: Collector) -> str | None:
    """Vendor for devices the trace lists no properties for."""
    if c.roles["mtia"].total:
        return "meta"
    calls = [n or "" for n in c.call_names()]
    if "roctracer_version" in meta or "hip_runtime_version" in meta or any(n.startswith("hip") for n in calls):
        return "amd"
    if any(n.startswith("cu") for n in calls) or c.roles["kernel"].total:
        return "nvidia"
    return None


def _parse(top: dict[str, Raw], c: Collector) -> ParsedTrace:
    """Build the run from the top-level keys and the collected event columns."""
    if c.n_events and not c.any_ph:
        raise TraceError("no event has a `ph` phase: not a Chrome/Kineto trace")
    meta, omitted = _metadata(top)
    # Keys the run facts come from are decoded whatever their size (pg_config can be long).
    needed = {k: msgspec.json.decode(top[k]) if k in omitted else meta.get(k) for k in _RUN_FACT_KEYS}
    base_ns = _typed(needed, "baseTimeNanoseconds", int, "an integer (ns)")
    if base_ns is not None and abs(base_ns) > input_limits.MAX_ABS_TIME_NS:
        raise TraceError("`baseTimeNanoseconds` lies beyond ±2^62 ns (a corrupt time base)")
    dist = needed["distributedInfo"] if isinstance(needed["distributedInfo"], dict) else {}
    counts = c.counts
    legacy = bool(LEGACY_CATEGORIES & counts.keys())
    clock, era = _time_facts(c.ts_sample, base_ns, legacy)
    n_events = c.n_events

    warnings: Counter = Counter()
    b = TableBuilder(c, base_ns or 0, warnings)
    tables = {
        # api_calls first: the GPU tables link to it by correlation id.
        "api_calls": b.api_calls(),
        "kernels": b.kernels(),
        "copies": b.copies(),
        "memsets": b.memsets(),
        "syncs": b.syncs(),
        "ranges": b.ranges(),
        "cpu_ops": b.cpu_ops(),
        "python_functions": b.python_functions(),
        "memory_events": b.memory_events(),
    }
    props = needed["deviceProperties"] if "deviceProperties" in top else needed["computeProperties"]
    run_vendor = _run_vendor(meta, c)
    # ROCm activity carries agent ids, the properties HIP device indices (see kineto_devices).
    mapping = device_map(props, b.gpu_device_ids, run_vendor)
    remap_devices(tables, mapping)
    device_ids = {mapping.get(d, d) for d in b.gpu_device_ids}
    tables["devices"], device_warnings = devices_table(props, device_ids, run_vendor)

    out_warnings = [f"{msg}: {n}" for msg, n in warnings.items()] + device_warnings
    kept = sum(t.num_rows for name, t in tables.items() if t is not None and name != "devices")
    skipped = {msg: n for msg, n in warnings.items() if "skipped" in msg}
    if n_events and not kept and skipped:
        # every event the tables read was unusable: a run of nothing would pass any gate as OK
        reasons = dict.fromkeys(msg.split(" events ", 1)[-1].removesuffix(" skipped") for msg in skipped)
        raise TraceError(f"none of its {n_events} events could be used: {sum(skipped.values())} skipped, "
                         f"{'; '.join(reasons)}")
    if not n_events:
        out_warnings.append("trace has no events")
    n_mtia = c.roles["mtia"].total
    if n_mtia:
        out_warnings.append(f"MTIA events not mapped (the schema has no MTIA activity model): {n_mtia}")
    if not c.roles["kernel"].total and not n_mtia and counts.get("cuda_profiler_range"):
        out_warnings.append("CUPTI-profiler (counter) mode trace: no kernel activity recorded")

    meta["reader_notes"] = {
        "shared_memory": SHARED_MEMORY_NOTE,
        "event_counts_by_cat": counts,
        "omitted_large_keys": omitted,
        "time_base": "baseTimeNanoseconds + round(ts*1000)" if base_ns is not None else "round(ts*1000)",
    }
    if mapping:  # activity device id (the trace's pid) -> the deviceProperties id stored
        meta["reader_notes"]["device_ids"] = {str(k): v for k, v in sorted(mapping.items())}
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
