"""The source tables of one Nsight Systems export, as the nsys reader's stages ask for them.

`Sources.start` starts every fetch at once (`NsysFile.submit`, on a few threads, each table's
columns in SOURCES); a stage then waits for its own table: `get` keeps it for a later stage,
`take` (or `columns`) releases it, so a source is not kept once its output is built. The big
tables in STREAMED are read instead as a stream of parts of about CHUNK_ROWS rows (`parts`),
on a thread of their own, a few batches ahead, each part in start order and after the last:
every real export has them so. A table whose parts are not in order (or whose stream fails)
raises `ReadWhole`; the stage drops what it stored of it, calls `read_whole` and reads it
whole. Two streams read at once at most: the next starts when a stage takes the one before.

As rows arrive, `Sources` keeps what they say about the file: each table's row count
(`rows`, the run's `metadata.source_rows`), the rows the GPU time filter dropped (`dropped`,
`metadata.dropped_rows`, with `drop_warnings` saying why) and the device ids seen.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from . import nsys_arrow as arrow
from ..input_limits import MAX_ABS_TIME_NS
from .base import TraceError
from .nsys_sqlite import Col, NsysFile, StreamFailed, quote

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
GRAPH = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
GRAPH_NODES = "CUDA_GRAPH_NODE_EVENTS"
NVTX = "NVTX_EVENTS"
MEMORY = "CUDA_GPU_MEMORY_USAGE_EVENTS"
STRINGS = "StringIds"

I64, STR = pa.int64(), pa.string()
# Source columns fetched per table: alias -> (nsys column, Arrow type).
GPU_COMMON = {"start_ns": ("start", I64), "end_ns": ("end", I64), "device_id": ("deviceId", I64),
              "context_id": ("contextId", I64), "stream_id": ("streamId", I64),
              "correlation_id": ("correlationId", I64), "global_pid": ("globalPid", I64)}
SOURCES: dict[str, dict[str, tuple[str, pa.DataType]]] = {
    RUNTIME: {"start_ns": ("start", I64), "end_ns": ("end", I64), "global_tid": ("globalTid", I64),
              "correlation_id": ("correlationId", I64), "name_id": ("nameId", I64),
              "return_value": ("returnValue", I64), "event_class": ("eventClass", I64)},
    KERNEL: {**GPU_COMMON, "demangled_id": ("demangledName", I64), "short_id": ("shortName", I64),
             "mangled_id": ("mangledName", I64),
             **{f"{d}_{a}": (f"{d}{a.upper()}", I64) for d in ("grid", "block") for a in "xyz"},
             "registers_per_thread": ("registersPerThread", I64),
             "static_shared_mem_bytes": ("staticSharedMemory", I64),
             "dynamic_shared_mem_bytes": ("dynamicSharedMemory", I64),
             "local_mem_per_thread_bytes": ("localMemoryPerThread", I64), "graph_id": ("graphId", I64),
             "graph_node_id": ("graphNodeId", I64)},
    GRAPH: {**GPU_COMMON, "graph_id": ("graphId", I64)},
    MEMCPY: {**GPU_COMMON, "bytes": ("bytes", I64), "copy_kind": ("copyKind", I64),
             "src_kind": ("srcKind", I64), "dst_kind": ("dstKind", I64),
             "src_device_id": ("srcDeviceId", I64), "dst_device_id": ("dstDeviceId", I64),
             "graph_node_id": ("graphNodeId", I64)},
    MEMSET: {**GPU_COMMON, "bytes": ("bytes", I64), "value": ("value", I64), "mem_kind": ("memKind", I64),
             "graph_node_id": ("graphNodeId", I64)},
    SYNC: {**GPU_COMMON, "sync_type": ("syncType", I64)},
    NVTX: {"start_ns": ("start", I64), "end_ns": ("end", I64), "event_type": ("eventType", I64),
           "text": ("text", STR), "text_id": ("textId", I64), "global_tid": ("globalTid", I64),
           "domain_id": ("domainId", I64)},
    MEMORY: {"start_ns": ("start", I64), "global_pid": ("globalPid", I64), "device_id": ("deviceId", I64),
             "address": ("address", I64), "bytes": ("bytes", I64), "oper": ("memoryOperationType", I64)},
    GRAPH_NODES: {"start_ns": ("start", I64), "global_tid": ("globalTid", I64), "node_id": ("graphNodeId", I64),
                  "original_id": ("originalGraphNodeId", I64)},
}
STRING_COLUMNS = [Col("id", "id", I64), Col("value", "value", STR)]
# Columns every nsys schema from 2.9 (2022) to 3.25 (2026) writes in a table it has
# (../shared/docs/nsys-schema). Without one of REQUIRED the table's rows mean nothing (no
# times, no device, no name, no thread, a copy's size): no export nsys wrote, an input error,
# where reading on would store NULLs as if the trace had said so. Without one of EXPECTED
# something is unknown (launches unlinked, streams or kinds unknown): a warning. The other
# columns come and go between versions and are read where present.
REQUIRED: dict[str, tuple[str, ...]] = {
    KERNEL: ("start", "end", "deviceId"), MEMCPY: ("start", "end", "deviceId", "bytes"),
    MEMSET: ("start", "end", "deviceId", "bytes"), SYNC: ("start", "end"),
    RUNTIME: ("start", "end", "globalTid", "nameId"), NVTX: ("start", "eventType"), STRINGS: ("id", "value"),
}
EXPECTED: dict[str, tuple[str, ...]] = {
    KERNEL: ("streamId", "correlationId"), MEMCPY: ("streamId", "correlationId", "copyKind"),
    MEMSET: ("streamId", "correlationId"), RUNTIME: ("correlationId",), NVTX: ("end", "globalTid"),
}
# A kernel's name: one of these (both in every version).
KERNEL_NAMES = ("shortName", "demangledName")
# The tables whose names are StringIds ids: with one of them, the export must have StringIds.
NAMED = (KERNEL, RUNTIME, NVTX)
# Fetch order: the largest tables first, as the stages need them.
FETCH_ORDER = (RUNTIME, KERNEL, MEMCPY, GRAPH, SYNC, MEMSET, NVTX, MEMORY, GRAPH_NODES)
# Tables read as a stream of parts and built part by part (when the file has them in start
# order, as every real export seen so far does): each is never whole in memory, as source
# or as output. Runtime calls are out of order in real exports, so they are sorted whole;
# NVTX rows are in start order (a push is recorded when it is made).
STREAMED = (KERNEL, MEMCPY, NVTX)
CHUNK_ROWS = 1 << 19  # rows per part of an output table
STREAM_BATCHES_AHEAD = 4  # batches of FETCH_BATCH_ROWS a stream reads ahead
GPU_TABLES = {KERNEL: "kernels", MEMCPY: "copies", MEMSET: "memsets", SYNC: "syncs", GRAPH: "graph executions"}
# GPU rows whose times are usable: within ±2^62 ns (so differences fit int64) and not
# ending before they start. NULL is let through; never NULL itself.
SANE_GPU_TIMES = ("((start IS NULL OR start BETWEEN {m1} AND {m}) AND (\"end\" IS NULL OR \"end\" BETWEEN {m1} AND {m}) "
                  "AND (start IS NULL OR \"end\" IS NULL OR \"end\" >= start))").format(m=MAX_ABS_TIME_NS, m1=-MAX_ABS_TIME_NS)


class ReadWhole(Exception):
    """A streamed table that must be read whole after all (out of order, or the stream failed)."""


class Sources:
    """The source tables of one export: fetches in flight, streams, and what their rows told."""

    def __init__(self, f: NsysFile):
        self.f = f
        self.chunk_rows = CHUNK_ROWS  # rows per part, one size for the whole read
        self.rows: dict[str, int] = {}  # per table fetched, its rows in the file
        self.dropped: dict[str, int] = {}  # per timed GPU table, rows the time filter dropped
        self.drop_warnings: dict[str, list[str]] = {}  # per table: why they were dropped
        self.device_ids: set[int] = set()  # of every row read so far
        self.column_warnings: list[str] = []  # tables without EXPECTED columns (`check_columns`)
        self._filters: dict[str, str] = {}  # a table's own WHERE (NVTX: the event types read)
        # Per table: a fetch in flight (Pending, rows, timed), then its Arrow table, then None once taken.
        self._fetched: dict[str, object] = {}
        self._streams: dict[str, tuple] = {}  # STREAMED tables being read in parts: (stream or None, rows)

    # -- starting ------------------------------------------------------------------
    def start(self, filters: dict[str, str]) -> None:
        """Start every fetch (StringIds, then FETCH_ORDER); `filters`: a table's own WHERE.
        TraceError when a table lacks a column every nsys version writes (`REQUIRED`)."""
        self.column_warnings = check_columns(self.f)
        self._filters = filters
        if self.f.has(STRINGS):
            self._fetched[STRINGS] = (self.f.submit(STRING_COLUMNS, STRINGS, label=STRINGS), 0, False)
        else:
            self._fetched[STRINGS] = _empty(STRING_COLUMNS)
        for table in FETCH_ORDER:
            if not (table in STREAMED and self._open_stream(table)):
                self._submit(table)

    def _submit(self, table: str) -> None:
        """Start fetching a source table's columns (an empty table when the file lacks it)."""
        cols = self._columns(table)
        if not self.f.has(table):
            self._fetched[table] = _empty(cols)
            return
        total = self.rows[table] = self.f.count(table)
        timed, where = self._filter(table)
        split = self.chunk_rows if table == RUNTIME else 0  # the one big table read whole
        self._fetched[table] = (self.f.submit(cols, quote(table), where, label=table, split_rows=split), total, timed)

    def _columns(self, table: str) -> list[Col]:
        return [Col(alias, self.f.column(table, src), typ) for alias, (src, typ) in SOURCES[table].items()]

    def _filter(self, table: str) -> tuple[bool, str]:
        """Whether the table's rows are timed GPU work (some may be dropped), and its WHERE."""
        timed = table in GPU_TABLES and self.f.has(table, "start") and self.f.has(table, "end")
        if timed:
            return timed, f'NOT (start = 0 AND "end" = 0) AND {SANE_GPU_TIMES}'
        return timed, self._filters.get(table, "")

    def _open_stream(self, table: str) -> bool:
        """Start reading a STREAMED table in parts; False where it must be read whole (no
        ADBC, too few rows to matter, or, for kernels, whole-graph rows to merge in)."""
        if not self.f.has(table) or (table == KERNEL and self.f.count(GRAPH)):
            return False
        total = self.f.count(table)
        if total <= self.chunk_rows:
            return False
        if not (self._filter(table)[0] or table == NVTX) or self.f.backend != "adbc":
            return False
        self.rows[table] = total
        self._streams[table] = (None, total)  # started by _start_stream
        if not any(s for s, _ in self._streams.values()):  # the first starts now, the next after it
            self._start_stream(table)
        return True

    def _start_stream(self, table: str) -> None:
        stream, total = self._streams[table]
        if stream is None:
            stream = self.f.stream(self._columns(table), quote(table), self._filter(table)[1],
                                   label=table, batches_ahead=STREAM_BATCHES_AHEAD)
            self._streams[table] = (stream, total)

    # -- reading -------------------------------------------------------------------
    def streamed(self, table: str) -> bool:
        """Whether the table is (still) to be read in parts."""
        return table in self._streams

    def parts(self, table: str) -> Iterator[pa.Table]:
        """A streamed table's rows in parts of about `chunk_rows`, each in start order and
        after the last: raises ReadWhole where they are not (or the stream fails)."""
        self._start_stream(table)
        stream, total = self._streams.pop(table)
        if stream is None:  # no connection for it
            raise ReadWhole()
        for waiting in self._streams:  # the next streamed table starts reading now: two at most
            self._start_stream(waiting)
            break
        try:
            yield from self._in_order(self._batched(stream))
        except StreamFailed:
            raise ReadWhole() from None
        finally:
            stream.close()
        self._account(table, stream.rows, total, table in GPU_TABLES)

    def _batched(self, stream) -> Iterator[pa.Table]:
        """The stream's batches joined into parts of about `chunk_rows` rows."""
        batches, rows = [], 0
        for batch in stream.batches():
            batches.append(batch)
            rows += batch.num_rows
            if rows >= self.chunk_rows:
                yield pa.concat_tables(batches)
                batches, rows = [], 0
        if batches:
            yield pa.concat_tables(batches)

    def _in_order(self, parts: Iterator[pa.Table]) -> Iterator[pa.Table]:
        last = None
        for part in parts:
            start = arrow.array(part["start_ns"])
            if len(start):
                if start.null_count or arrow.order(start) is not None or (last is not None and start[0].as_py() < last):
                    raise ReadWhole()
                self._note_devices(part)
                last = start[-1].as_py()
            yield part

    def read_whole(self, table: str) -> None:
        """A streamed table turned out not in order: fetch it whole (after the caller has
        dropped what it stored of it)."""
        stream = self._streams.pop(table, (None, 0))[0]
        if stream is not None:
            stream.close()
        self._submit(table)

    def selected(self, table: str, aliases: list[str]) -> pa.Table:
        """Some columns of all a table's rows, the table left for its stage: a streamed
        table's are fetched apart, whole."""
        if table not in self._streams:
            return self.get(table).select(aliases)
        cols = [c for c in self._columns(table) if c.alias in aliases]
        return self.f.arrow(cols, quote(table), self._filter(table)[1], label=table)

    def has_whole(self, table: str) -> bool:
        """Whether a whole read of the table is there to take (fetched, not taken yet)."""
        return self._fetched.get(table) is not None

    def get(self, table: str) -> pa.Table:
        """A source table's rows in file order (waiting for its fetch), kept for a later stage."""
        item = self._fetched[table]
        if isinstance(item, pa.Table):
            return item
        if item is None:
            raise AssertionError(f"source {table} used twice")
        pending, total, timed = item
        data = pending.result()
        self._account(table, data.num_rows, total, timed)
        self._note_devices(data)
        self._fetched[table] = data
        return data

    def take(self, table: str) -> pa.Table:
        """The source table, released here: it is not kept once its output is built."""
        data = self.get(table)
        self._fetched[table] = None
        return data

    def columns(self, table: str) -> dict[str, pa.ChunkedArray]:
        """The source's columns, to be popped as they are used: each is freed as soon as
        its output column exists, so a source and its output never both stay whole."""
        data = self.take(table)
        return dict(zip(data.column_names, data.columns))

    # -- what the rows told --------------------------------------------------------
    def _account(self, table: str, rows: int, total: int, timed: bool) -> None:
        """Rows a timed GPU table lost to the filter: counted, with a warning saying why."""
        dropped = total - rows if timed else 0
        if not dropped:
            return
        self.dropped[table] = dropped
        # Rare, so the reasons are counted only here.
        insane = self.f.count(table, f"NOT {SANE_GPU_TIMES}")
        untimed = dropped - insane
        notes = self.drop_warnings.setdefault(table, [])
        if untimed:
            notes.append(f"dropped {untimed} {GPU_TABLES[table]} row(s) with start = end = 0 "
                         f"(not timed by CUPTI) from {table}")
        if insane:
            notes.append(f"dropped {insane} {GPU_TABLES[table]} row(s) that end before they "
                         f"start or lie beyond ±2^62 ns (corrupt times) from {table}")

    def _note_devices(self, data: pa.Table) -> None:
        if "device_id" in data.column_names:
            self.device_ids.update(v for v in pc.unique(data["device_id"]).to_pylist()
                                   if v is not None and -2**31 <= v <= 2**31 - 1)

    def warnings(self) -> list[str]:
        """The missing columns' warnings, then the drop warnings per table in SOURCES order."""
        return [*self.column_warnings, *(w for t in SOURCES for w in self.drop_warnings.get(t, []))]


def check_columns(f: NsysFile) -> list[str]:
    """TraceError naming the first table of the file that lacks a REQUIRED column (a kernel
    table both name columns), or StringIds missing where a table names things by its ids; else
    a warning per table that lacks EXPECTED columns."""
    def absent(table: str, columns: tuple[str, ...]) -> list[str]:
        return [c for c in columns if f.has(table) and not f.has(table, c)]

    def listed(columns: list[str], joint: str = ", ") -> str:
        return f"{joint.join(columns)} column{'s' if len(columns) > 1 else ''}"

    for table, columns in REQUIRED.items():
        missing = absent(table, columns)
        if table == KERNEL and len(absent(KERNEL, KERNEL_NAMES)) == len(KERNEL_NAMES):
            missing.append(" or ".join(KERNEL_NAMES))
        if missing:
            raise TraceError(f"{table} has no {listed(missing)} (every nsys version writes it: a modified or "
                             "unsupported export)")
    named = [t for t in NAMED if f.has(t)]
    if named and not f.has(STRINGS):
        raise TraceError(f"no {STRINGS} table, which {named[0]} names things by: a modified or unsupported export")
    return [f"{table} has no {listed(missing)} (every nsys version writes it): read as unknown"
            for table, columns in EXPECTED.items() if (missing := absent(table, columns))]


def _empty(cols: list[Col]) -> pa.Table:
    return pa.schema([(c.alias, c.type) for c in cols]).empty_table()
