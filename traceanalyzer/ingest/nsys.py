"""Nsight Systems SQLite export -> ParsedTrace (format `nsys-sqlite`, clock `nsys-session`).

How: every table and column is probed first (exports create tables lazily and columns
come and go between schema versions). The numeric columns of each activity table, plus
StringIds, are fetched into Arrow (`nsys_sqlite`), all fetches started at once on a few
threads, each table worked on as soon as its own fetch is done. The two big GPU tables,
kernels and copies, are streamed instead: read in parts of CHUNK_ROWS on a thread of
their own, a few batches ahead, each part built and handed over before the next is read
(every real export has them in start order; one that is not is dropped and read again
whole). Runtime calls are sorted whole (real exports write them per thread) and handed
over in parts too. With a sink (`Store.ingest` passes its RunWriter) each part goes
straight into the store's transaction, so no output table is ever whole in memory: the
5 M-kernel export (bench/gen_big.py) peaked at 3.2-3.4 GB in ingest before and 1.42 GB
after, in about the same time (GPU rows find their API call through `CallIndex`, a binary
search, not a join per part; runtime calls are fetched as two halves on two threads). Names stay StringIds ids
until the end and become dictionary-encoded columns (each distinct string once, however
many rows name it); name clean-up and code-to-word mappings run once per distinct value.
Rows are put in (start, file order) with a stable sort (skipped when already in order),
GPU rows find their API call with a hash join on integers in an in-memory DuckDB, and
each source column is released as soon as its output exists. On the 625 k-kernel
export (bench/gen_big.py) this read is about 2x faster and the whole ingest peaks at
about a third of the memory of the earlier all-SQL version, which joined full strings
per row. The file is never written.

Choices a reader of the store should know:
* Row ids (`kernel_id`, `copy_id`, ...) follow (start, order in the file), from 0.
* GPU rows with start = end = 0 (CUPTI could not time them) are dropped and counted in
  `metadata.dropped_rows` and a warning.
* GPU work is tied to its API call on correlationId AND process
  (`activity.globalPid = runtime.globalTid & 0xFFFFFFFFFF000000`): correlation ids
  repeat across processes. That call gives `tid`, `launch_call_id`, `api_name`.
* Syncs are classified by their API call's name; the `syncType` code is used only when
  no call (or an unknown one) is found, because its numbering changed between versions.
* Whole-graph executions (`CUPTI_ACTIVITY_KIND_GRAPH_TRACE`, captured with
  `--cuda-graph-trace=graph`) hide the graph's kernels. Each becomes one `kernels` row
  named `[CUDA graph <graphId>]` with `graph_id` set and no launch configuration, so
  timeline rules see the GPU busy; a warning says how many there were.
* Per-node graph tracing (`--cuda-graph-trace=node`) writes each replayed kernel, copy and
  memset as a row of its own with the replay's `correlationId` (so its launch call is the
  `cudaGraphLaunch`), the instantiated node's `graphNodeId` (`graph_node_id`) and, from schema
  3.24, the kernel's `graphId`. Where the export has `CUDA_GRAPH_NODE_EVENTS` (node creations,
  and the clones `cudaGraphInstantiate` makes, with `originalGraphNodeId`), every operation a
  graph launch ran gets a `graph_nodes` row: its node followed back through its clones to the
  event that created it, on the capturing thread inside the captured call (`capture_call_id`),
  which places it (`at_ns`, `pid`, `tid`) where the run's own NVTX ranges were open at capture, as a merged
  Kineto capture does. A whole-graph row is unplaced (its nodes were not traced). What was
  placed is `metadata.graph_capture` (its `line`); the capture's graph trace mode
  (`CUDA_GRAPH_TRACE_OPTIONS:MODE` in `META_DATA_CAPTURE`: `Graph`, `Node`) is
  `metadata.cuda_graph_trace`.
* `devices`: see `nsys_devices` (only devices used by activity rows, when there are any).
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import nsys_arrow as arrow
from . import nsys_enums
from .. import input_limits, os_memory
from ..input_limits import MAX_ABS_TIME_NS
from ..resources import Resources, connect_duckdb
from .base import CollectedTables, ParsedTrace, TableSink, TraceError, as_path
from .nsys_devices import read_devices
from .nsys_sqlite import Col, NsysFile, StreamFailed, arrow_schema, one_line, quote

FORMAT = "nsys-sqlite"
PRODUCER = "nsys"
CLOCK = "nsys-session"

# 0xFFFFFFFFFF000000 as a signed 64-bit integer: the process part of a serialized globalTid.
PROCESS_MASK = -16777216
PID = "(({g} >> 24) & 16777215)"  # pid = (globalTid >> 24) & 0xFFFFFF
TID = "({g} & 16777215)"
NO_STREAM = 4294967295  # streamId of context/event syncs: (uint32)-1

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
GRAPH = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
GRAPH_NODES = "CUDA_GRAPH_NODE_EVENTS"
NVTX = "NVTX_EVENTS"
MEMORY = "CUDA_GPU_MEMORY_USAGE_EVENTS"
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
KEPT_META_KEYS = ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION", "EXPORT_PARAM_TIME_NORMALIZE",
                  "EXPORT_PARAM_TIME_SHIFT")

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
# Past this, a StringIds value could multiply into gigabytes by being named on every row.
LONG_STRING_BYTES = 64 * 1024
STRING_ID_COLUMNS = ("demangled_id", "short_id", "mangled_id", "name_id", "text_id")
# Fetch order: the largest tables first, as the steps below need them.
FETCH_ORDER = (RUNTIME, KERNEL, MEMCPY, GRAPH, SYNC, MEMSET, NVTX, MEMORY, GRAPH_NODES)
# Tables read as a stream of parts and built part by part (when the file has them in start
# order, as every real export seen so far does): each is never whole in memory, as source
# or as output. Runtime calls are out of order in real exports, so they are sorted whole;
# NVTX rows are in start order (a push is recorded when it is made), ranges grown with the kernels.
STREAMED = (KERNEL, MEMCPY, NVTX)
CHUNK_ROWS = 1 << 19  # rows per part of an output table
STREAM_BATCHES_AHEAD = 4  # batches of FETCH_BATCH_ROWS a stream reads ahead
GPU_TABLES = {KERNEL: "kernels", MEMCPY: "copies", MEMSET: "memsets", SYNC: "syncs", GRAPH: "graph executions"}
# GPU rows whose times are usable: within ±2^62 ns (so differences fit int64) and not
# ending before they start. NULL is let through as before; never NULL itself.
SANE_GPU_TIMES = ("((start IS NULL OR start BETWEEN {m1} AND {m}) AND (\"end\" IS NULL OR \"end\" BETWEEN {m1} AND {m}) "
                  "AND (start IS NULL OR \"end\" IS NULL OR \"end\" >= start))").format(m=MAX_ABS_TIME_NS, m1=-MAX_ABS_TIME_NS)


def read(path: str | Path, backend: str | None = None, sink: TableSink | None = None, *,
         resources: Resources | None = None) -> ParsedTrace:
    """Read an nsys SQLite export. `backend` forces "adbc" or "sqlite3" (default: ADBC if
    importable). With a `sink`, every table but `devices` goes there as it is built (and
    is not in the result's `tables`). Fetches run on `nsys_sqlite.fetch_threads(resources)`
    threads (default resources: `Resources.available()`)."""
    f = NsysFile(as_path(path), backend, resources)
    try:
        return _Reader(f, sink).read()
    except sqlite3.Error as e:
        raise TraceError(f"corrupt or truncated SQLite export ({one_line(e)})") from None
    except duckdb.Error as e:
        raise TraceError(f"export has rows that could not be processed ({one_line(e)})") from None
    finally:
        f.close()


class _Reader:
    def __init__(self, f: NsysFile, sink: TableSink | None = None):
        self.f = f
        self.duck = connect_duckdb()  # TRACEANALYZER_MEMORY_LIMIT holds here too
        self.warnings: list[str] = []
        self.sink = sink
        self.out: TableSink = CollectedTables() if sink is None else sink
        self.tables: dict[str, pa.Table] = {}  # what is not streamed: devices
        self.longest_string_bytes = 0  # of StringIds, set by _load_strings
        self.metadata: dict = {"tables": sorted(f.tables), "source_rows": {}, "dropped_rows": {}}
        self.strings: dict[str, pa.Array] = {}  # StringIds columns, plus per string: stripped, api
        # Source tables: a fetch in flight (tuple), then its Arrow table, then None once used.
        self.sources: dict[str, object] = {}
        self.streams: dict[str, tuple] = {}  # STREAMED tables being read in parts: (stream, total rows)
        self.drop_warnings: dict[str, list[str]] = {}  # per source table, shown first, in SOURCES order
        self.device_ids: set[int] = set()
        self.calls: pa.Table | None = None  # one row per api call, in call_id order (see _api_calls)
        self.call_index: arrow.CallIndex | None = None
        self.call_names: pa.Array = pa.array([], STR)  # dictionary of api_calls.name
        self.grouped_calls = False
        self.filters: dict[str, str] = {}  # a source table's own WHERE (NVTX: the event types read)
        self.nvtx_domains: dict[tuple[int, int], str] = {}  # (process, domain id) -> name, as created
        self.graph_ops: list[pa.Table] = []  # GPU rows of graph nodes or whole graphs (see _graph_nodes)
        self.node_calls: dict[tuple[int, int], int] = {}  # (thread, node creation) -> call_id (_capture_calls)

    # -- orchestration -------------------------------------------------------------
    def read(self) -> ParsedTrace:
        try:
            self._require_nsys()
            trace = self._run_facts()
            self.enums = nsys_enums.load(self.f, trace.schema_version)
            self.metadata["enum_sources"] = self.enums.sources
            nvtx_types = ", ".join(str(int(k)) for k in self.enums.nvtx) or "NULL"
            if self.f.has(NVTX, "eventType"):
                self.filters[NVTX] = f"eventType IN ({nvtx_types})"
            self._submit_strings()
            for table in FETCH_ORDER:  # all fetches start now; each step below waits for its own
                if not (table in STREAMED and self._open_stream(table)):
                    self._submit(table)
            self._load_strings()
            self._api_calls()
            self._given_back()  # the runtime source, before kernels are read
            self._kernels()
            self._copies()
            self._memsets()
            self._graph_nodes()
            self._syncs()
            self._ranges()
            self._memory_events()
            self._devices()
            self._notes()
        finally:
            self.duck.close()
        trace.tables = ({} if self.sink is not None else self.out.tables()) | self.tables
        trace.warnings = [w for t in SOURCES for w in self.drop_warnings.get(t, [])] + self.warnings
        trace.metadata = self.metadata
        return trace

    def _require_nsys(self) -> None:
        names = list(self.f.tables)
        if "StringIds" in names or any(n.startswith(("CUPTI_", "NVTX_", "TARGET_INFO_")) for n in names):
            return
        shown = ", ".join(names[:5]) + (f", ... ({len(names)} tables)" if len(names) > 5 else "")
        raise TraceError("SQLite file is not an Nsight Systems export (no StringIds, CUPTI_*, NVTX_* "
                         f"or TARGET_INFO_* tables; it has {shown or 'no tables'})")

    def _run_facts(self) -> ParsedTrace:
        f = self.f
        meta_table = next((t for t in META_TABLES if f.has(t, "name") and f.has(t, "value")), None)
        meta: dict[str, str] = {}
        if meta_table:
            meta = {k: v for k, v in f.rows(f"SELECT name, value FROM {meta_table}")
                    if k in KEPT_META_KEYS or str(k).startswith("DERIVED_")}
            self.metadata["export_meta_table"] = meta_table
            self.metadata["export_meta"] = meta
        else:
            # No metadata table: a 2021-era export. TARGET_INFO_CUDA_GPU (or a TARGET_INFO_GPU
            # keyed by deviceId) marks the layout that predates schema 2.9.
            legacy = f.has("TARGET_INFO_CUDA_GPU") or f.has("TARGET_INFO_GPU", "deviceId")
            self.metadata["schema_era"] = "pre-2.9 (TARGET_INFO_CUDA_GPU layout)" if legacy else "unversioned"
        host = None
        if f.has("TARGET_INFO_SYSTEM_ENV", "name") and f.has("TARGET_INFO_SYSTEM_ENV", "value"):
            hosts = f.rows("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1")
            host = hosts[0][0] if hosts and hosts[0][0] else None
        if f.has("META_DATA_CAPTURE", "name") and f.has("META_DATA_CAPTURE", "value"):
            # `Graph` (nsys's default: a replay is one row) or `Node` (--cuda-graph-trace=node).
            mode = f.rows("SELECT value FROM META_DATA_CAPTURE "
                          "WHERE name LIKE '%CUDA_GRAPH_TRACE_OPTIONS:MODE' LIMIT 1")
            if mode and mode[0][0]:
                self.metadata["cuda_graph_trace"] = mode[0][0]
        if f.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
            epoch = f.rows("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
            self.metadata["session_start_utc_epoch_ns"] = epoch[0][0] if epoch else None
        return ParsedTrace(format=FORMAT, producer=PRODUCER, clock=CLOCK, host=host,
                           producer_version=meta.get("EXPORT_PRODUCT_VERSION") or None,
                           schema_version=meta.get("EXPORT_SCHEMA_VERSION") or None)

    # -- fetching ------------------------------------------------------------------
    def _submit(self, table: str, where: str = "") -> None:
        """Start fetching a source table's columns (an empty table when the file lacks it)."""
        cols = self._source_columns(table)
        if not self.f.has(table):
            self.sources[table] = pa.schema([(c.alias, c.type) for c in cols]).empty_table()
            return
        total = self.metadata["source_rows"][table] = self.f.count(table)
        timed, where = self._source_filter(table, where)
        split = CHUNK_ROWS if table == RUNTIME else 0  # the one big table read whole
        self.sources[table] = (self.f.submit(cols, quote(table), where, label=table, split_rows=split), total, timed)

    def _source_columns(self, table: str) -> list[Col]:
        return [Col(alias, self.f.column(table, src), typ) for alias, (src, typ) in SOURCES[table].items()]

    def _source_filter(self, table: str, where: str) -> tuple[bool, str]:
        """Whether the table's rows are timed GPU work (some may be dropped), and its WHERE."""
        timed = table in GPU_TABLES and self.f.has(table, "start") and self.f.has(table, "end")
        if timed:
            where = f'NOT (start = 0 AND "end" = 0) AND {SANE_GPU_TIMES}'
        return timed, where or self.filters.get(table, "")

    def _open_stream(self, table: str) -> bool:
        """Start reading a STREAMED table in parts; False where it must be read whole (no
        ADBC, too few rows to matter, or, for kernels, whole-graph rows to merge in)."""
        if not self.f.has(table) or (table == KERNEL and self.f.count(GRAPH)):
            return False
        total = self.f.count(table)
        if total <= CHUNK_ROWS:
            return False
        if not (self._source_filter(table, "")[0] or table == NVTX) or self.f.backend != "adbc":
            return False
        self.metadata["source_rows"][table] = total
        self.streams[table] = (None, total)  # started by _start_stream
        if not any(s for s, _ in self.streams.values()):  # the first starts now, the next after it
            self._start_stream(table)
        return True

    def _start_stream(self, table: str) -> None:
        stream, total = self.streams[table]
        if stream is None:
            stream = self.f.stream(self._source_columns(table), quote(table), self._source_filter(table, "")[1],
                                   label=table, batches_ahead=STREAM_BATCHES_AHEAD)
            self.streams[table] = (stream, total)

    def _parts(self, table: str):
        """A streamed table's rows in parts of about CHUNK_ROWS, each in start order and
        after the last: raises _ReadWhole where they are not (or the stream fails)."""
        self._start_stream(table)
        stream, total = self.streams.pop(table)
        if stream is None:  # no connection for it
            raise _ReadWhole()
        for waiting in self.streams:  # the next streamed table starts reading now: two at most
            self._start_stream(waiting)
            break
        last = None
        try:
            batches, rows = [], 0
            for batch in stream.batches():
                batches.append(batch)
                rows += batch.num_rows
                if rows >= CHUNK_ROWS:
                    part, batches, rows = pa.concat_tables(batches), [], 0
                    last = self._in_order(part, last)
                    yield part
            if batches:
                part = pa.concat_tables(batches)
                self._in_order(part, last)
                yield part
        except StreamFailed:
            raise _ReadWhole() from None
        finally:
            stream.close()
        self._account(table, stream.rows, total, table in GPU_TABLES)

    def _in_order(self, part: pa.Table, last: int | None) -> int | None:
        start = arrow.array(part["start_ns"])
        if not len(start):
            return last
        if start.null_count or arrow.order(start) is not None or (last is not None and start[0].as_py() < last):
            raise _ReadWhole()
        self._note_devices(part)
        return start[-1].as_py()

    def _restart(self, table: str, output: str) -> None:
        """A streamed table turned out not in order: drop what was stored, read it whole."""
        stream = self.streams.pop(table, (None, 0))[0]
        if stream is not None:
            stream.close()
        self.out.discard(output)
        self._submit(table)

    def _source(self, table: str) -> pa.Table:
        """A source table's rows in file order (waiting for its fetch)."""
        item = self.sources[table]
        if isinstance(item, pa.Table):
            return item
        if item is None:
            raise AssertionError(f"source {table} used twice")
        pending, total, timed = item
        data = pending.result()
        self._account(table, data.num_rows, total, timed)
        self._note_devices(data)
        self.sources[table] = data
        return data

    def _account(self, table: str, rows: int, total: int, timed: bool) -> None:
        """Rows a timed GPU table lost to the filter: counted, with a warning saying why."""
        dropped = total - rows if timed else 0
        if dropped:
            self.metadata["dropped_rows"][table] = dropped
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

    def _take_source(self, table: str) -> pa.Table:
        """The source table, released here: it is not kept once its output is built."""
        data = self._source(table)
        self.sources[table] = None
        return data

    def _columns(self, table: str) -> dict[str, pa.ChunkedArray]:
        """The source's columns, to be popped as they are used: each is freed as soon as
        its output column exists, so a source and its output never both stay whole."""
        data = self._take_source(table)
        return dict(zip(data.column_names, data.columns))

    @contextmanager
    def _registered(self, table: str):
        """The source as DuckDB view `src_<table>`, with `src_row` (file order), for SQL steps."""
        data = self._take_source(table)
        data = data.append_column("src_row", pa.array(np.arange(data.num_rows, dtype=np.int64)))
        self.duck.register(_src(table), data)
        try:
            yield data
        finally:
            self.duck.unregister(_src(table))

    def _submit_strings(self) -> None:
        cols = [Col("id", "id", I64), Col("value", "value", STR)]
        if self.f.has("StringIds", "id") and self.f.has("StringIds", "value"):
            self.sources["StringIds"] = (self.f.submit(cols, "StringIds", label="StringIds"), 0, False)
        else:
            self.sources["StringIds"] = pa.schema([(c.alias, c.type) for c in cols]).empty_table()

    def _load_strings(self) -> None:
        """All of StringIds, once; names are worked out per distinct string, not per row,
        and reach the tables as dictionary-encoded columns (ids until then).

        Fetching the whole table is cheaper than asking SQLite which ids are referenced
        (that scans every activity table again; see bench/bench_sqlite_read.py)."""
        data = self._take_source("StringIds")
        self.longest_string_bytes = pc.max(pc.binary_length(data["value"])).as_py() or 0
        self.duck.register("string_ids", data)
        if self.longest_string_bytes > LONG_STRING_BYTES:
            self._check_expansion()
        strings = self.duck.sql("""
            SELECT id, value, regexp_replace(value, '_v[0-9]+$', '') AS stripped,
                   CAST(CASE WHEN value LIKE 'cuda%' THEN 0 WHEN value LIKE 'cu%' THEN 1 END AS TINYINT) AS api
            FROM string_ids""").to_arrow_table()
        self.duck.unregister("string_ids")
        self.duck.register("strings", strings)  # for NVTX text ids (_ranges)
        self.strings = {c: arrow.array(strings[c]) for c in strings.column_names}

    def _check_expansion(self) -> None:
        """A long string is stored once in StringIds but repeated on every row naming it:
        add up, over the id columns, the lengths the tables would hold, before any join."""
        refs, views = [], []
        for t, spec in SOURCES.items():
            ids = [alias for alias in spec if alias in STRING_ID_COLUMNS]
            if ids:
                views.append(_src(t))
                self.duck.register(_src(t), self._source(t).select(ids))
                refs += [f"SELECT n.len FROM {_src(t)} x JOIN string_lengths n ON n.id = x.{alias}" for alias in ids]
        try:
            self.duck.execute("CREATE TEMP TABLE string_lengths AS SELECT id, strlen(value) AS len FROM string_ids")
            longest, total = self.duck.execute(
                f"SELECT COALESCE(max(len), 0), COALESCE(sum(len), 0) FROM ({' UNION ALL '.join(refs)})").fetchall()[0]
        finally:
            for v in views:
                self.duck.unregister(v)
        if longest > input_limits.get("MAX_STRING_BYTES"):
            raise input_limits.over("MAX_STRING_BYTES", f"a name of {longest:,} bytes")
        if total > input_limits.get("MAX_TEXT_BYTES"):
            raise input_limits.over("MAX_TEXT_BYTES", f"names repeated on every row would take {total:,} bytes of strings")

    def _lookup(self, ids: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
        """StringIds ids per row -> (index per row into the distinct ids, each distinct id's
        row in `self.strings`, NULL when StringIds lacks it)."""
        encoded = pc.dictionary_encode(arrow.array(ids))
        return encoded.indices, pc.index_in(encoded.dictionary, self.strings["id"])

    def _emit(self, name: str, sql: str) -> None:
        self._store(name, self.duck.sql(sql).to_arrow_table())

    def _store(self, name: str, table: pa.Table) -> None:
        """Keep an output table, each column in its schema type where the values allow
        (dictionary-encoded strings stay so; a value past the type is left for
        input_limits.check_tables to NULL, with a warning)."""
        schema = arrow_schema(name, table.column_names)
        columns = []
        for col, field in zip(table.columns, schema):
            if col.type != field.type and not pa.types.is_dictionary(col.type):
                try:
                    col = col.cast(field.type)
                except (pa.ArrowInvalid, OverflowError):
                    pass
            columns.append(col)
        table = pa.Table.from_arrays(columns, names=table.column_names)
        del columns
        self.out.add(name, table)
        if self.sink is not None:  # the sink has it: what it held goes back before the next part
            table = None
            self._given_back()

    def _given_back(self) -> None:
        """With a sink, hand freed memory back to the OS (Arrow's pool and malloc keep it
        otherwise; see os_memory.py): what one step freed is then there for the next, and for
        the store. Some 10 ms a time, once per part."""
        if self.sink is not None:
            os_memory.give_back()

    # -- tables --------------------------------------------------------------------
    def _api_calls(self) -> None:
        r = self._columns(RUNTIME)
        n = len(r["start_ns"])
        order = arrow.order(r["start_ns"])
        col = lambda c: arrow.take(r.pop(c), order)  # noqa: E731
        g = col("global_tid")
        idx, pos = self._lookup(col("name_id"))
        s = self.strings
        name = arrow.dictionary(idx, pc.take(s["stripped"], pos))
        corr = col("correlation_id")
        # What GPU rows look up (see _link): the call is found on correlationId AND process,
        # through the CallIndex, or a join where it cannot be built. A tid fits 24 bits.
        process = pc.bit_wise_and(g, PROCESS_MASK)
        self._given_back()  # the source columns sorted so far
        self.call_index = arrow.CallIndex.build(corr, process)
        tid = pc.bit_wise_and(g, 16777215).cast(pa.int32())
        if self.call_index is None:
            self.calls = pa.table({"call_id": pa.array(np.arange(n, dtype=np.int64)), "correlation_id": corr,
                                   "process": process, "tid": tid, "name": name.indices})
            self.duck.register("api", self.calls)
        else:
            self.calls = pa.table({"tid": tid, "name": name.indices})
        del process, tid
        self.call_names = name.dictionary
        # The table itself is built and stored in parts, each source row taken once: it is
        # never whole in memory beside its source.
        rest = {}
        for c in list(r):
            rest[c] = arrow.array(r.pop(c))
            self._given_back()  # the source's batches, now copied
        api_by_string, raw_by_string = pc.take(s["api"], pos), pc.take(s["value"], pos)
        for lo in range(0, max(n, 1), CHUNK_ROWS):
            size = min(n, lo + CHUNK_ROWS) - lo
            rows = None if order is None else order[lo:lo + size]
            part = lambda c: rest[c].slice(lo, size) if rows is None else rest[c].take(rows)  # noqa: E731
            i = idx.slice(lo, size)
            # Runtime or driver: from the name, else from eventClass (0 runtime, 1 driver).
            event_class = part("event_class")
            by_class = pc.if_else(pc.equal(event_class, 0), pa.scalar(0, pa.int8()),
                                  pc.if_else(pc.equal(event_class, 1), pa.scalar(1, pa.int8()),
                                             pa.scalar(None, pa.int8())))
            api = pc.coalesce(pc.take(api_by_string, i), by_class)
            self._store("api_calls", pa.table({
                "call_id": pa.array(np.arange(lo, lo + size, dtype=np.int64)),
                "api": pa.DictionaryArray.from_arrays(api.cast(pa.int32()), pa.array(["runtime", "driver"])),
                "name": pa.DictionaryArray.from_arrays(name.indices.slice(lo, size), name.dictionary),
                "raw_name": arrow.dictionary(i, raw_by_string),
                "pid": pc.bit_wise_and(pc.shift_right(g.slice(lo, size), 24), 16777215),
                "tid": pc.bit_wise_and(g.slice(lo, size), 16777215),
                "start_ns": part("start_ns"), "end_ns": part("end_ns"),
                "correlation_id": corr.slice(lo, size), "return_value": part("return_value")}))
        self._capture_calls(g, arrow.take(rest["start_ns"], order), arrow.take(rest["end_ns"], order))

    def _capture_calls(self, global_tid: pa.Array, start: pa.Array, end: pa.Array) -> None:
        """Per node creation event (`CUDA_GRAPH_NODE_EVENTS` without an original: made while
        capturing), the call it was made in: on its thread, containing its start, the outermost
        (a runtime call holds the driver call it makes). Calls by start, as `call_id` counts them."""
        if not self.f.has(GRAPH_NODES):
            return
        ev = self._source(GRAPH_NODES)  # kept for _graph_nodes
        ev = ev.filter(pc.and_(pc.is_null(ev["original_id"]), pc.is_valid(ev["global_tid"])))
        if not ev.num_rows:
            return
        keep = pc.fill_null(pc.is_in(global_tid, pc.unique(ev["global_tid"])), False)
        self.duck.register("node_events", ev.select(["global_tid", "start_ns"]))
        self.duck.register("node_calls", pa.table({
            "call_id": pc.indices_nonzero(keep), "global_tid": global_tid.filter(keep),
            "start_ns": start.filter(keep), "end_ns": end.filter(keep)}))
        try:
            rows = self.duck.sql("""
                SELECT e.global_tid, e.start_ns, arg_min(c.call_id, (c.start_ns, c.call_id)) AS call_id
                FROM (SELECT DISTINCT global_tid, start_ns FROM node_events) e
                JOIN node_calls c ON c.global_tid = e.global_tid AND e.start_ns BETWEEN c.start_ns AND c.end_ns
                GROUP BY ALL""").fetchall()
        finally:
            self.duck.unregister("node_events")
            self.duck.unregister("node_calls")
        self.node_calls = {(g, t): c for g, t, c in rows}

    def _link(self, corr: pa.Array, global_pid: pa.Array) -> tuple[pa.Array, pa.Array, pa.DictionaryArray]:
        """For GPU rows (in output order): their API call's call_id, tid and name.

        One call per (correlation id, process); should a file hold several, the first
        (lowest call_id) is taken, with the first non-NULL tid and name, as a GROUP BY
        would. That grouping costs as much as the join, so it is done only when the plain
        join shows a row matching twice. Without repeats, the sorted CallIndex finds the
        same calls without a join (a big table's parts each look up every call)."""
        n = len(corr)
        if self.call_index is not None:
            i, rows = self.call_index.find(corr, pc.bit_wise_and(global_pid, PROCESS_MASK))
            rows = pa.array(rows)
            res = {"call_id": rows, "tid": pc.take(self.calls["tid"], rows), "name": pc.take(self.calls["name"], rows)}
            return self._linked(n, i, res)
        self.duck.register("act", pa.table({"i": np.arange(n, dtype=np.int64), "correlation_id": corr,
                                            "process": pc.bit_wise_and(global_pid, PROCESS_MASK)}))
        try:
            while True:
                calls = "calls" if self.grouped_calls else "api"
                res = self.duck.sql(f"""
                    SELECT a.i, c.call_id, c.tid, c.name FROM act a
                    JOIN {calls} c ON c.correlation_id = a.correlation_id AND c.process = a.process""").to_arrow_table()
                i = res["i"].to_numpy()
                hit = np.zeros(n, dtype=bool)
                hit[i] = True
                if self.grouped_calls or int(np.count_nonzero(hit)) == len(i):
                    break
                self.grouped_calls = True
                self.duck.execute("""
                    CREATE TEMP TABLE calls AS
                    SELECT correlation_id, process, min(call_id) AS call_id,
                           arg_min(tid, call_id) AS tid, arg_min(name, call_id) AS name
                    FROM api WHERE correlation_id IS NOT NULL GROUP BY correlation_id, process""")
        finally:
            self.duck.unregister("act")
        return self._linked(n, i, res)

    def _linked(self, n: int, i: np.ndarray, res) -> tuple[pa.Array, pa.Array, pa.DictionaryArray]:
        call_id, tid, name = (arrow.scatter(n, i, res[c]) for c in ("call_id", "tid", "name"))
        used = pc.drop_null(pc.unique(name))  # the names these rows use, of all api names
        return call_id, tid, pa.DictionaryArray.from_arrays(pc.index_in(name, used).cast(pa.int32()),
                                                            pc.take(self.call_names, used))

    def _kernels(self) -> None:
        k_rows = 0
        launched = 0
        if KERNEL in self.streams:
            try:
                graph = self._take_source(GRAPH)  # empty: a file with graph rows is read whole
                for part in self._parts(KERNEL):
                    n, hit = self._kernel_rows(dict(zip(part.column_names, part.columns)),
                                               dict(zip(graph.column_names, graph.columns)), k_rows)
                    k_rows, launched = k_rows + n, launched + hit
            except _ReadWhole:
                self._restart(KERNEL, "kernels")
                self.sources[GRAPH] = graph
                k_rows = launched = 0
        if not k_rows and self.sources.get(KERNEL) is not None:
            k_rows, launched = self._kernel_rows(self._columns(KERNEL), self._columns(GRAPH), 0)
        self.metadata["kernels_with_launch_call"] = launched
        if k_rows and launched < k_rows:
            self.warnings.append(f"{k_rows - launched} of {k_rows} kernel(s) have no launch call in the trace "
                                 "(time-sliced capture, or API tracing off)")
        graphs = self.metadata["source_rows"].get(GRAPH, 0)
        if graphs:
            self.warnings.append(f"{graphs} whole-graph execution(s) from {GRAPH} were added as opaque "
                                 "kernels named [CUDA graph N]: their kernels were not traced one by one "
                                 "(capture with --cuda-graph-trace=node for that)")

    def _kernel_rows(self, k: dict, gr: dict, first_id: int) -> tuple[int, int]:
        """Kernel rows (and whole-graph rows) from their source columns, stored with ids from
        `first_id`: (rows, rows with a launch call)."""
        config = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
                  "static_shared_mem_bytes", "dynamic_shared_mem_bytes", "local_mem_per_thread_bytes")
        nk, ng = len(k["start_ns"]), len(gr["start_ns"])
        # Kernel rows, then whole-graph rows: a stable sort on start keeps (start, source, file order).
        order = arrow.order(arrow.concat(k["start_ns"], gr["start_ns"]))

        def column(name: str) -> pa.Array:
            a = k.pop(name)
            b = gr.pop(name) if name in gr else pa.nulls(ng, a.type)
            return arrow.take(arrow.concat(a, b), order)

        # name = the demangled name when StringIds has it, else the short name.
        idx, pos = self._lookup(k["demangled_id"])
        demangled = pc.fill_null(pc.take(pc.is_valid(pc.take(self.strings["value"], pos)), idx), False)
        name_ids = pc.if_else(demangled, arrow.array(k["demangled_id"]), arrow.array(k["short_id"]))
        graph_names = pc.binary_join_element_wise(
            "[CUDA graph ", pc.fill_null(pc.cast(gr["graph_id"], STR), "?"), "]", "")
        names = {"name": self._names(name_ids, graph_names),
                 "short_name": self._names(k.pop("short_id"), pa.array(["[CUDA graph]"] * ng, STR)),
                 "mangled_name": self._names(k.pop("mangled_id"), pa.nulls(ng, STR))}
        del name_ids, demangled, k["demangled_id"]
        corr, gpid = column("correlation_id"), column("global_pid")
        launch_call_id, tid, _ = self._link(corr, gpid)
        n = nk + ng
        out = {"kernel_id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64))}
        out.update((c, column(c)) for c in ("device_id", "context_id", "stream_id", "start_ns", "end_ns"))
        out.update((c, arrow.take(names.pop(c), order)) for c in list(names))
        out.update((c, column(c)) for c in config)
        out.update(correlation_id=corr, pid=pc.bit_wise_and(pc.shift_right(gpid, 24), 16777215), tid=tid,
                   launch_call_id=launch_call_id, graph_id=column("graph_id"), graph_node_id=column("graph_node_id"))
        whole = arrow.take(pa.array(np.arange(n) >= nk), order)  # the whole-graph rows
        self._note_graph_ops("kernel", out["kernel_id"], launch_call_id, out["start_ns"], gpid,
                             out["graph_node_id"], whole)
        self._store("kernels", pa.table(out))
        return n, n - launch_call_id.null_count

    def _names(self, ids: pa.ChunkedArray, extra: pa.Array) -> pa.DictionaryArray:
        """Dictionary-encoded StringIds values of `ids`, followed by the strings `extra`."""
        idx, pos = self._lookup(ids)
        values = pc.take(self.strings["value"], pos)
        if len(extra):
            more = pc.dictionary_encode(arrow.array(extra))
            idx = pa.concat_arrays([idx, pc.add(more.indices, len(values)).cast(idx.type)])
            values = pa.concat_arrays([values, more.dictionary.cast(STR)])
        return arrow.dictionary(idx, values)

    def _copies(self) -> None:
        rows = linked = 0
        if MEMCPY in self.streams:
            try:
                for part in self._parts(MEMCPY):
                    n, hit = self._copy_rows(part, None, rows)
                    rows, linked = rows + n, linked + hit
            except _ReadWhole:
                self._restart(MEMCPY, "copies")
                rows = linked = 0
        if not rows and self.sources.get(MEMCPY) is not None:
            rows, linked = self._copy_rows(*self._sorted(MEMCPY), 0)
        self.metadata["copies_with_api_call"] = linked

    def _copy_rows(self, m: pa.Table, order: np.ndarray | None, first_id: int) -> tuple[int, int]:
        """Copy rows from their source rows (put in `order`), stored with ids from `first_id`:
        (rows, rows with an API call)."""
        e = self.enums
        col = lambda c: arrow.take(m[c], order)  # noqa: E731
        kind = col("copy_kind")
        corr, gpid = col("correlation_id"), col("global_pid")
        launch_call_id, tid, api_name = self._link(corr, gpid)
        ids, node = pa.array(np.arange(first_id, first_id + m.num_rows, dtype=np.int64)), col("graph_node_id")
        self._note_graph_ops("copy", ids, launch_call_id, col("start_ns"), gpid, node)
        self._store("copies", pa.table({
            "copy_id": ids,
            "device_id": col("device_id"), "context_id": col("context_id"), "stream_id": col("stream_id"),
            "start_ns": col("start_ns"), "end_ns": col("end_ns"),
            "direction": arrow.enum(kind, {k: v[0] for k, v in e.copy_kind.items()}, "unknown"),
            "unified_memory": arrow.enum(kind, {k: v[1] for k, v in e.copy_kind.items()}, False, pa.bool_()),
            "src_kind": arrow.enum(col("src_kind"), e.mem_kind, "unknown"),
            "dst_kind": arrow.enum(col("dst_kind"), e.mem_kind, "unknown"),
            "bytes": col("bytes"), "src_device_id": col("src_device_id"), "dst_device_id": col("dst_device_id"),
            "correlation_id": corr, "pid": pc.bit_wise_and(pc.shift_right(gpid, 24), 16777215), "tid": tid,
            "api_name": api_name, "launch_call_id": launch_call_id, "graph_node_id": node}))
        return m.num_rows, m.num_rows - launch_call_id.null_count

    def _sorted(self, table: str) -> tuple[pa.Table, np.ndarray | None]:
        data = self._take_source(table)
        return data, arrow.order(data["start_ns"])

    def _memsets(self) -> None:
        m, order = self._sorted(MEMSET)
        col = lambda c: arrow.take(m[c], order)  # noqa: E731
        corr, gpid = col("correlation_id"), col("global_pid")
        launch_call_id, tid, api_name = self._link(corr, gpid)
        ids, node = pa.array(np.arange(m.num_rows, dtype=np.int64)), col("graph_node_id")
        self._note_graph_ops("memset", ids, launch_call_id, col("start_ns"), gpid, node)
        self._store("memsets", pa.table({
            "memset_id": ids,
            "device_id": col("device_id"), "context_id": col("context_id"), "stream_id": col("stream_id"),
            "start_ns": col("start_ns"), "end_ns": col("end_ns"), "bytes": col("bytes"), "value": col("value"),
            "mem_kind": arrow.enum(col("mem_kind"), self.enums.mem_kind, "unknown"),
            "correlation_id": corr, "pid": pc.bit_wise_and(pc.shift_right(gpid, 24), 16777215), "tid": tid,
            "api_name": api_name, "launch_call_id": launch_call_id, "graph_node_id": node}))
        self.metadata["memsets_with_api_call"] = m.num_rows - launch_call_id.null_count

    def _note_graph_ops(self, kind: str, ids: pa.Array, launch_call_id: pa.Array, start: pa.Array,
                        global_pid: pa.Array, node_id: pa.Array, whole: pa.Array | None = None) -> None:
        """Keep, for `_graph_nodes`, the rows (of one part) a graph ran: those with a graph node
        id, and whole-graph rows. A few integers a row, and none for a run without graphs."""
        node_id = arrow.array(node_id)
        keep = pc.is_valid(node_id) if whole is None else pc.or_(pc.is_valid(node_id), whole)
        if not pc.any(keep).as_py():
            return
        n = len(node_id)
        self.graph_ops.append(pa.table({
            "kind": pa.array([kind] * n), "item_id": ids, "launch_call_id": launch_call_id,
            "start_ns": arrow.array(start), "process": pc.bit_wise_and(arrow.array(global_pid), PROCESS_MASK),
            "node_id": node_id, "whole": whole if whole is not None else pa.array(np.zeros(n, bool))}).filter(keep))

    def _graph_nodes(self) -> None:
        """`graph_nodes` from `CUDA_GRAPH_NODE_EVENTS`: per operation a graph launch ran, its
        node followed back through its clones (`originalGraphNodeId`) to the event that created
        it, whose thread and start place the operation. Written only where the export has the
        events (they are what ties a node to its code); `metadata.graph_capture` says what was
        placed."""
        events = self._take_source(GRAPH_NODES)
        if not self.graph_ops or not self.f.has(GRAPH_NODES):
            self.graph_ops = []
            return
        ops = pa.concat_tables(self.graph_ops)
        self.graph_ops = []
        # The first event per (process, node) by start: its creation, or the clone that made it.
        first: dict[tuple[int, int], tuple] = {}
        proc = pc.bit_wise_and(arrow.array(events["global_tid"]), PROCESS_MASK).to_pylist()
        for p, node, orig, start, g in sorted(
                zip(proc, *(events[c].to_pylist() for c in ("node_id", "original_id", "start_ns", "global_tid"))),
                key=lambda r: (r[3] is None, r[3] or 0)):
            if p is not None and node is not None:
                first.setdefault((p, node), (orig, start, g))
        roots = {"process": [], "node_id": [], "at_ns": [], "global_tid": [], "capture_call_id": []}
        self.duck.register("graph_ops", ops)
        nodes = self.duck.sql("SELECT DISTINCT process, node_id FROM graph_ops WHERE node_id IS NOT NULL").fetchall()
        self.duck.unregister("graph_ops")
        for p, node in nodes:
            key, seen = (p, node), set()
            while key in first and first[key][0] is not None and key not in seen:  # a clone: to its original
                seen.add(key)
                key = (p, first[key][0])
            # the creation: no original, a start, a thread (what places it)
            if key in first and first[key][0] is None and None not in first[key][1:]:
                at, g = first[key][1], first[key][2]
                for c, v in zip(roots, (p, node, at, g, self.node_calls.get((g, at)))):
                    roots[c].append(v)
        names = self.call_names.to_pylist()
        launches = [i for i, x in enumerate(names) if x is not None and "graphlaunch" in x.lower()]
        call_name = pc.fill_null(self.calls["name"], -1)
        self.duck.register("graph_ops", ops)
        self.duck.register("graph_roots", pa.table(roots, schema=pa.schema([(c, pa.int64()) for c in roots])))
        self.duck.register("graph_calls", pa.table({
            "call_id": pa.array(np.arange(len(call_name), dtype=np.int64)),
            "graph_launch": pc.is_in(call_name, pa.array(launches, call_name.type))}))
        try:
            rows = self.duck.sql(f"""
                SELECT o.kind, o.item_id, o.launch_call_id,
                       CAST(dense_rank() OVER (ORDER BY o.launch_call_id) - 1 AS INTEGER) AS replay,
                       CAST(row_number() OVER (PARTITION BY o.launch_call_id ORDER BY o.start_ns, o.kind, o.item_id) - 1
                            AS INTEGER) AS node,
                       NULL::VARCHAR AS capture_file, NULL::INTEGER AS capture_graph, NULL::VARCHAR AS captured_name,
                       r.at_ns IS NOT NULL AS placed,
                       CASE WHEN r.at_ns IS NOT NULL THEN 'graph node id' END AS how,
                       CASE WHEN r.at_ns IS NOT NULL THEN NULL
                            WHEN o.whole
                              THEN 'whole-graph execution (--cuda-graph-trace=graph): its nodes were not traced'
                            WHEN o.node_id IS NULL THEN 'no graphNodeId'
                            ELSE 'no creation event for its graph node in {GRAPH_NODES}' END AS reason,
                       {PID.format(g='r.global_tid')} AS pid, {TID.format(g='r.global_tid')} AS tid, r.at_ns,
                       NULL::BIGINT AS external_id, r.capture_call_id
                FROM graph_ops o JOIN graph_calls c ON c.call_id = o.launch_call_id AND c.graph_launch
                LEFT JOIN graph_roots r ON r.process = o.process AND r.node_id = o.node_id AND NOT o.whole
                ORDER BY o.launch_call_id, node""").to_arrow_table()
        finally:
            for v in ("graph_ops", "graph_roots", "graph_calls"):
                self.duck.unregister(v)
        if not rows.num_rows:
            return
        self._store("graph_nodes", rows)
        placed = pc.sum(rows["placed"]).as_py() or 0
        replays = len(pc.unique(rows["launch_call_id"]))
        unplaced: dict[str, int] = {}
        for why in pc.drop_null(rows["reason"]).to_pylist():
            unplaced[why] = unplaced.get(why, 0) + 1
        line = (f"graph nodes ({GRAPH_NODES}): {placed}/{rows.num_rows} replayed operations placed "
                f"({replays} graph launch{'es' if replays != 1 else ''})")
        if unplaced:
            line += "; unplaced: " + ", ".join(f"{n} {r}" for r, n in sorted(unplaced.items(), key=lambda x: -x[1]))
        self.metadata["graph_capture"] = {"source": GRAPH_NODES, "replays": replays, "operations": rows.num_rows,
                                          "placed": placed, "unplaced": unplaced, "line": line}

    def _syncs(self) -> None:
        s, order = self._sorted(SYNC)
        col = lambda c: arrow.take(s[c], order)  # noqa: E731
        corr, gpid = col("correlation_id"), col("global_pid")
        launch_call_id, tid, api_name = self._link(corr, gpid)
        if self.call_index is None and self.calls is not None:
            self.duck.unregister("api")
        self.calls = self.call_index = None  # the last lookup of calls
        self.duck.execute("DROP TABLE IF EXISTS calls")
        # The kind the call's name says, once per distinct name.
        names = api_name.dictionary
        self.duck.register("call_names", pa.table({"i": np.arange(len(names)), "name": names}))
        per_name = self.duck.sql(f"SELECT {nsys_enums.sync_kind_by_name_sql('name')} AS kind "
                                 "FROM call_names ORDER BY i").to_arrow_table()["kind"]
        self.duck.unregister("call_names")
        by_name = pc.take(arrow.array(per_name).cast(STR), api_name.indices)
        by_code = arrow.enum(col("sync_type"), self.enums.sync_codes, None).cast(STR)
        known = pc.coalesce(by_name, by_code)
        stream = col("stream_id")
        no_stream = pc.or_(pc.fill_null(pc.is_in(known, pa.array(["device", "context"])), False),
                           pc.fill_null(pc.equal(stream, NO_STREAM), False))
        self._store("syncs", pa.table({
            "sync_id": pa.array(np.arange(s.num_rows, dtype=np.int64)),
            "kind": pc.dictionary_encode(pc.coalesce(known, pa.scalar("unknown"))), "api_name": api_name,
            "device_id": col("device_id"), "context_id": col("context_id"),
            "stream_id": pc.if_else(no_stream, pa.scalar(None, stream.type), stream),
            "start_ns": col("start_ns"), "end_ns": col("end_ns"), "correlation_id": corr,
            "pid": pc.bit_wise_and(pc.shift_right(gpid, 24), 16777215), "tid": tid,
            "launch_call_id": launch_call_id}))
        name_missing = pc.is_null(by_name)
        self.metadata["syncs_classified_by_code"] = pc.sum(pc.and_(name_missing, pc.is_valid(by_code))).as_py() or 0
        unknown_n = pc.sum(pc.and_(name_missing, pc.is_null(by_code))).as_py() or 0
        if unknown_n:
            self.warnings.append(f"{unknown_n} sync(s) have neither a known API call nor a usable "
                                 "syncType code: kind 'unknown'")

    def _ranges(self) -> None:
        if NVTX in self.streams:
            try:
                emitted = 0
                for part in self._parts(NVTX):
                    emitted += self._range_rows(part, emitted)
                return
            except _ReadWhole:
                self._restart(NVTX, "ranges")
                self.nvtx_domains.clear()
        self._range_rows(self._take_source(NVTX), 0)

    def _range_rows(self, data: pa.Table, first_id: int) -> int:
        """Range rows from NVTX source rows (a part in start order, after the ones before, or
        the whole table), stored with ids from `first_id`: the rows stored. Worked out in
        Arrow, row for row: a part's 500 k rows through DuckDB (a join, a sort) took 7x as long."""
        event_type = arrow.array(data["event_type"])
        of_kind = lambda *kinds: pc.is_in(event_type, pa.array(  # noqa: E731
            [c for c, v in self.enums.nvtx.items() if v in kinds], pa.int64()))
        idx, pos = self._lookup(data["text_id"])
        name = pc.coalesce(arrow.array(data["text"]), pc.take(pc.take(self.strings["value"], pos), idx))
        process = pc.bit_wise_and(arrow.array(data["global_tid"]), PROCESS_MASK)
        domain_id = arrow.array(data["domain_id"])
        # NvtxDomainCreate rows name a process's domain ids; a domain is created before its ranges
        created = of_kind("domain")
        for p, d, n in zip(*(pc.filter(c, created).to_pylist() for c in (process, domain_id, name))):
            was = self.nvtx_domains.get((p, d))
            if n is not None and (was is None or n < was):  # the least name, as min() would
                self.nvtx_domains[(p, d)] = n
        is_mark = of_kind("nvtx_mark")
        keep = pc.indices_nonzero(of_kind("nvtx", "nvtx_mark"))
        order = arrow.order(pc.take(data["start_ns"], keep))
        if order is not None:
            keep = pc.take(keep, order)
        n = len(keep)
        at = lambda c: pc.take(arrow.array(c), keep)  # noqa: E731
        g, start = at(data["global_tid"]), at(data["start_ns"])
        self._store("ranges", pa.table({
            "range_id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
            "kind": arrow.enum(at(event_type), self.enums.nvtx, None),
            "name": at(name), "domain": self._domains(at(process), at(domain_id)),
            "pid": pc.bit_wise_and(pc.shift_right(g, 24), 16777215), "tid": pc.bit_wise_and(g, 16777215),
            "start_ns": start, "end_ns": pc.if_else(at(is_mark), start, at(data["end_ns"]))}))
        return n

    def _domains(self, process: pa.Array, domain_id: pa.Array) -> pa.DictionaryArray:
        """Per range row, the name of its process's domain, NULL where none was created."""
        known = sorted(self.nvtx_domains.items(), key=lambda kv: kv[0])
        names = pa.array([n for _, n in known], STR)
        if not known:
            return pa.DictionaryArray.from_arrays(pa.nulls(len(process), pa.int32()), names)
        self.duck.register("domains", pa.table({"process": pa.array([p for (p, _), _ in known], pa.int64()),
                                                "domain_id": pa.array([d for (_, d), _ in known], pa.int64()),
                                                "d": pa.array(range(len(known)), pa.int32())}))
        self.duck.register("keys", pa.table({"i": np.arange(len(process), dtype=np.int64), "process": process,
                                             "domain_id": domain_id}))
        try:
            hits = self.duck.sql("SELECT k.i, d.d FROM keys k JOIN domains d USING (process, domain_id)").to_arrow_table()
        finally:
            self.duck.unregister("keys")
            self.duck.unregister("domains")
        return pa.DictionaryArray.from_arrays(arrow.scatter(len(process), hits["i"].to_numpy(), hits["d"]), names)

    def _memory_events(self) -> None:
        oper = nsys_enums.sql_case("m.oper", self.enums.mem_oper)
        with self._registered(MEMORY):
            self._emit("memory_events", f"""
                SELECT row_number() OVER (ORDER BY m.start_ns, m.src_row) - 1 AS event_id,
                       m.start_ns AS ts_ns, 'cuda' AS device_type, m.device_id, m.address,
                       CASE WHEN {oper} = 'free' THEN -abs(m.bytes) ELSE m.bytes END AS bytes,
                       {PID.format(g='m.global_pid')} AS pid
                FROM {_src(MEMORY)} m
                ORDER BY event_id""")

    def _devices(self) -> None:
        devices, meta = read_devices(self.f, sorted(self.device_ids), self.warnings)
        self.tables["devices"] = devices
        self.metadata["devices"] = meta

    def _notes(self) -> None:
        f = self.f
        if not any(name.startswith("CUPTI_ACTIVITY_KIND_") for name in f.tables):
            self.warnings.append("no CUDA activity tables (CUPTI_ACTIVITY_KIND_*): the capture has no "
                                 "kernels, copies or CUDA API calls")
        elif not f.has(KERNEL) and not f.has(GRAPH):
            self.warnings.append(f"no kernel table ({KERNEL}): the capture recorded no kernels")
        if f.utf8_repaired:
            self.warnings.append("invalid UTF-8 replaced in " + ", ".join(sorted(f.utf8_repaired)))
        self.metadata["fetch_backend"] = f.backend
        if f.fallbacks:
            self.metadata["adbc_fallbacks"] = f.fallbacks


class _ReadWhole(Exception):
    """A streamed table that must be read whole after all (out of order, or the stream failed)."""


def _src(table: str) -> str:
    return "src_" + table.lower()
