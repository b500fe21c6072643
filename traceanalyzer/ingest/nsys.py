"""Nsight Systems SQLite export -> ParsedTrace (format `nsys-sqlite`, clock `nsys-session`).

How: every table and column is probed first (exports create tables lazily and columns
come and go between schema versions). The numeric columns of each activity table, plus
StringIds, are fetched into Arrow (`nsys_sqlite`); name lookups, joins and code-to-word
mappings then run in an in-memory DuckDB. The file is never written.

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
* `devices`: see `nsys_devices` (only devices used by activity rows, when there are any).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import nsys_enums
from .. import limits
from ..limits import MAX_ABS_TIME_NS
from .base import ParsedTrace, TraceError, as_path
from .nsys_devices import read_devices
from .nsys_sqlite import Col, NsysFile, arrow_schema, one_line, quote

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
             "local_mem_per_thread_bytes": ("localMemoryPerThread", I64), "graph_id": ("graphId", I64)},
    GRAPH: {**GPU_COMMON, "graph_id": ("graphId", I64)},
    MEMCPY: {**GPU_COMMON, "bytes": ("bytes", I64), "copy_kind": ("copyKind", I64),
             "src_kind": ("srcKind", I64), "dst_kind": ("dstKind", I64),
             "src_device_id": ("srcDeviceId", I64), "dst_device_id": ("dstDeviceId", I64)},
    MEMSET: {**GPU_COMMON, "bytes": ("bytes", I64), "value": ("value", I64), "mem_kind": ("memKind", I64)},
    SYNC: {**GPU_COMMON, "sync_type": ("syncType", I64)},
    NVTX: {"start_ns": ("start", I64), "end_ns": ("end", I64), "event_type": ("eventType", I64),
           "text": ("text", STR), "text_id": ("textId", I64), "global_tid": ("globalTid", I64),
           "domain_id": ("domainId", I64)},
    MEMORY: {"start_ns": ("start", I64), "global_pid": ("globalPid", I64), "device_id": ("deviceId", I64),
             "address": ("address", I64), "bytes": ("bytes", I64), "oper": ("memoryOperationType", I64)},
}
# Past this, a StringIds value could multiply into gigabytes by being named on every row.
LONG_STRING_BYTES = 64 * 1024
STRING_ID_COLUMNS = ("demangled_id", "short_id", "mangled_id", "name_id", "text_id")
GPU_TABLES = {KERNEL: "kernels", MEMCPY: "copies", MEMSET: "memsets", SYNC: "syncs", GRAPH: "graph executions"}
# GPU rows whose times are usable: within ±2^62 ns (so differences fit int64) and not
# ending before they start. NULL is let through as before; never NULL itself.
SANE_GPU_TIMES = ("((start IS NULL OR start BETWEEN {m1} AND {m}) AND (\"end\" IS NULL OR \"end\" BETWEEN {m1} AND {m}) "
                  "AND (start IS NULL OR \"end\" IS NULL OR \"end\" >= start))").format(m=MAX_ABS_TIME_NS, m1=-MAX_ABS_TIME_NS)


def read(path: str | Path, backend: str | None = None) -> ParsedTrace:
    """Read an nsys SQLite export. `backend` forces "adbc" or "sqlite3" (default: ADBC if importable)."""
    f = NsysFile(as_path(path), backend)
    try:
        return _Reader(f).read()
    except sqlite3.Error as e:
        raise TraceError(f"corrupt or truncated SQLite export ({one_line(e)})") from None
    except duckdb.Error as e:
        raise TraceError(f"export has rows that could not be processed ({one_line(e)})") from None
    finally:
        f.close()


class _Reader:
    def __init__(self, f: NsysFile):
        self.f = f
        self.duck = duckdb.connect()
        self.warnings: list[str] = []
        self.tables: dict[str, pa.Table] = {}
        self.longest_string_bytes = 0  # of StringIds, set by _load_strings
        self.metadata: dict = {"tables": sorted(f.tables), "source_rows": {}, "dropped_rows": {}}

    # -- orchestration -------------------------------------------------------------
    def read(self) -> ParsedTrace:
        try:
            self._require_nsys()
            trace = self._run_facts()
            self.enums = nsys_enums.load(self.f, trace.schema_version)
            self.metadata["enum_sources"] = self.enums.sources
            nvtx_types = ", ".join(str(int(k)) for k in self.enums.nvtx) or "NULL"
            for table in SOURCES:
                self._load(table, f"eventType IN ({nvtx_types})" if table == NVTX else "")
            self._load_strings()
            self._api_calls()
            self._kernels()
            self._copies()
            self._memsets()
            self._syncs()
            self._ranges()
            self._memory_events()
            self._devices()
            self._notes()
        finally:
            self.duck.close()
        trace.tables = self.tables
        trace.warnings = self.warnings
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
        if f.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
            epoch = f.rows("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
            self.metadata["session_start_utc_epoch_ns"] = epoch[0][0] if epoch else None
        return ParsedTrace(format=FORMAT, producer=PRODUCER, clock=CLOCK, host=host,
                           producer_version=meta.get("EXPORT_PRODUCT_VERSION") or None,
                           schema_version=meta.get("EXPORT_SCHEMA_VERSION") or None)

    # -- fetching ------------------------------------------------------------------
    def _load(self, table: str, where: str = "") -> None:
        """Fetch a source table's columns into DuckDB as `src_<table>` (empty when absent)."""
        spec = SOURCES[table]
        cols = [Col(alias, self.f.column(table, src), typ) for alias, (src, typ) in spec.items()]
        schema = pa.schema([(c.alias, c.type) for c in cols])
        if self.f.has(table):
            total = self.metadata["source_rows"][table] = self.f.count(table)
            timed = table in GPU_TABLES and self.f.has(table, "start") and self.f.has(table, "end")
            if timed:
                where = f'NOT (start = 0 AND "end" = 0) AND {SANE_GPU_TIMES}'
            elif table == NVTX and not self.f.has(table, "eventType"):
                where = ""
            data = self.f.arrow(cols, quote(table), where, label=table)
            dropped = total - data.num_rows if timed else 0
            if dropped:
                self.metadata["dropped_rows"][table] = dropped
                # Rare, so the reasons are counted only here.
                insane = self.f.count(table, f"NOT {SANE_GPU_TIMES}")
                untimed = dropped - insane
                if untimed:
                    self.warnings.append(f"dropped {untimed} {GPU_TABLES[table]} row(s) with start = end = 0 "
                                         f"(not timed by CUPTI) from {table}")
                if insane:
                    self.warnings.append(f"dropped {insane} {GPU_TABLES[table]} row(s) that end before they "
                                         f"start or lie beyond ±2^62 ns (corrupt times) from {table}")
        else:
            data = schema.empty_table()
        # File order, to break ties between rows that start at the same time.
        data = data.append_column("src_row", pa.array(np.arange(data.num_rows, dtype=np.int64)))
        self.duck.register(_src(table), data)

    def _load_strings(self) -> None:
        """All of StringIds, once; API-name clean-up then runs per distinct string, not per row.

        Fetching the whole table is cheaper than asking SQLite which ids are referenced
        (that scans every activity table again; see bench/bench_sqlite_read.py)."""
        cols = [Col("id", "id", I64), Col("value", "value", STR)]
        if self.f.has("StringIds", "id") and self.f.has("StringIds", "value"):
            data = self.f.arrow(cols, "StringIds", label="StringIds")
        else:
            data = pa.schema([(c.alias, c.type) for c in cols]).empty_table()
        self.longest_string_bytes = pc.max(pc.binary_length(data["value"])).as_py() or 0
        self.duck.register("string_ids", data)
        if self.longest_string_bytes > LONG_STRING_BYTES:
            self._check_expansion()
        self.duck.execute("""
            CREATE TEMP TABLE strings AS
            SELECT id, value, regexp_replace(value, '_v[0-9]+$', '') AS stripped,
                   CASE WHEN value LIKE 'cuda%' THEN 'runtime' WHEN value LIKE 'cu%' THEN 'driver' END AS api
            FROM string_ids""")

    def _emit(self, name: str, sql: str) -> pa.Table:
        table = self.duck.sql(sql).to_arrow_table()
        try:
            table = table.cast(arrow_schema(name, table.column_names))
        except (pa.ArrowInvalid, OverflowError):
            pass  # SQLite types nothing (a value past INTEGER): limits.check_tables NULLs it, with a warning
        self.tables[name] = table
        return table

    def _check_expansion(self) -> None:
        """A long string is stored once in StringIds but repeated on every row naming it:
        add up, over the id columns, the lengths the tables would hold, before any join."""
        refs = [f"SELECT n.len FROM {_src(t)} x JOIN string_lengths n ON n.id = x.{alias}"
                for t, spec in SOURCES.items() for alias in spec if alias in STRING_ID_COLUMNS]
        self.duck.execute("CREATE TEMP TABLE string_lengths AS SELECT id, strlen(value) AS len FROM string_ids")
        longest, total = self.duck.execute(
            f"SELECT COALESCE(max(len), 0), COALESCE(sum(len), 0) FROM ({' UNION ALL '.join(refs)})").fetchone()
        if longest > limits.get("MAX_STRING_BYTES"):
            raise limits.over("MAX_STRING_BYTES", f"a name of {longest:,} bytes")
        if total > limits.get("MAX_TEXT_BYTES"):
            raise limits.over("MAX_TEXT_BYTES", f"names repeated on every row would take {total:,} bytes of strings")

    # -- tables --------------------------------------------------------------------
    def _api_calls(self) -> None:
        g = "r.global_tid"
        self.duck.execute(f"""
            CREATE TEMP TABLE api AS
            SELECT row_number() OVER (ORDER BY r.start_ns, r.src_row) - 1 AS call_id,
                   COALESCE(s.api, CASE r.event_class WHEN 0 THEN 'runtime' WHEN 1 THEN 'driver' END) AS api,
                   s.stripped AS name, s.value AS raw_name,
                   {PID.format(g=g)} AS pid, {TID.format(g=g)} AS tid,
                   r.start_ns, r.end_ns, r.correlation_id, r.return_value,
                   {g} & {PROCESS_MASK} AS process
            FROM {_src(RUNTIME)} r LEFT JOIN strings s ON s.id = r.name_id""")
        # One call per (correlation id, process); min() only guards against duplicates.
        self.duck.execute("""
            CREATE TEMP TABLE calls AS
            SELECT correlation_id, process, min(call_id) AS call_id,
                   arg_min(tid, call_id) AS tid, arg_min(name, call_id) AS name
            FROM api WHERE correlation_id IS NOT NULL GROUP BY correlation_id, process""")
        self._emit("api_calls", """
            SELECT call_id, api, name, raw_name, pid, tid, start_ns, end_ns, correlation_id, return_value
            FROM api ORDER BY call_id""")

    @staticmethod
    def _call_join(alias: str) -> str:
        return (f"LEFT JOIN calls c ON c.correlation_id = {alias}.correlation_id "
                f"AND c.process = ({alias}.global_pid & {PROCESS_MASK})")

    def _kernels(self) -> None:
        config = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
                  "static_shared_mem_bytes", "dynamic_shared_mem_bytes", "local_mem_per_thread_bytes")
        common = "start_ns, end_ns, device_id, context_id, stream_id, correlation_id, global_pid, graph_id, src_row"
        kernels = self._emit("kernels", f"""
            WITH k AS (
                SELECT {common}, COALESCE(dn.value, sn.value) AS name, sn.value AS short_name,
                       mn.value AS mangled_name, {', '.join(config)}, 0 AS source
                FROM {_src(KERNEL)} k
                LEFT JOIN strings dn ON dn.id = k.demangled_id
                LEFT JOIN strings sn ON sn.id = k.short_id
                LEFT JOIN strings mn ON mn.id = k.mangled_id
                UNION ALL
                SELECT {common}, '[CUDA graph ' || COALESCE(CAST(graph_id AS VARCHAR), '?') || ']' AS name,
                       '[CUDA graph]' AS short_name, NULL AS mangled_name,
                       {', '.join(f'NULL AS {c}' for c in config)}, 1 AS source
                FROM {_src(GRAPH)}
            )
            SELECT row_number() OVER (ORDER BY k.start_ns, k.source, k.src_row) - 1 AS kernel_id,
                   k.device_id, k.context_id, k.stream_id, k.start_ns, k.end_ns,
                   k.name, k.short_name, k.mangled_name, {', '.join('k.' + c for c in config)},
                   k.correlation_id, {PID.format(g='k.global_pid')} AS pid, c.tid,
                   c.call_id AS launch_call_id, k.graph_id
            FROM k {self._call_join('k')}
            ORDER BY kernel_id""")
        n = kernels.num_rows
        launched = n - kernels.column("launch_call_id").null_count
        self.metadata["kernels_with_launch_call"] = launched
        if n and launched < n:
            self.warnings.append(f"{n - launched} of {n} kernel(s) have no launch call in the trace "
                                 "(time-sliced capture, or API tracing off)")
        graphs = self.metadata["source_rows"].get(GRAPH, 0)
        if graphs:
            self.warnings.append(f"{graphs} whole-graph execution(s) from {GRAPH} were added as opaque "
                                 "kernels named [CUDA graph N]: their kernels were not traced one by one "
                                 "(capture with --cuda-graph-trace=node for that)")

    def _copies(self) -> None:
        e = self.enums
        direction = nsys_enums.sql_case("m.copy_kind", {k: v[0] for k, v in e.copy_kind.items()}, "'unknown'")
        unified = nsys_enums.sql_case("m.copy_kind", {k: v[1] for k, v in e.copy_kind.items()}, "FALSE")
        copies = self._emit("copies", f"""
            SELECT row_number() OVER (ORDER BY m.start_ns, m.src_row) - 1 AS copy_id,
                   m.device_id, m.context_id, m.stream_id, m.start_ns, m.end_ns,
                   {direction} AS direction, {unified} AS unified_memory,
                   {nsys_enums.sql_case('m.src_kind', e.mem_kind, "'unknown'")} AS src_kind,
                   {nsys_enums.sql_case('m.dst_kind', e.mem_kind, "'unknown'")} AS dst_kind,
                   m.bytes, m.src_device_id, m.dst_device_id, m.correlation_id,
                   {PID.format(g='m.global_pid')} AS pid, c.tid, c.name AS api_name,
                   c.call_id AS launch_call_id
            FROM {_src(MEMCPY)} m {self._call_join('m')}
            ORDER BY copy_id""")
        self.metadata["copies_with_api_call"] = copies.num_rows - copies.column("launch_call_id").null_count

    def _memsets(self) -> None:
        self._emit("memsets", f"""
            SELECT row_number() OVER (ORDER BY m.start_ns, m.src_row) - 1 AS memset_id,
                   m.device_id, m.context_id, m.stream_id, m.start_ns, m.end_ns, m.bytes, m.value,
                   {nsys_enums.sql_case('m.mem_kind', self.enums.mem_kind, "'unknown'")} AS mem_kind,
                   m.correlation_id, {PID.format(g='m.global_pid')} AS pid
            FROM {_src(MEMSET)} m
            ORDER BY memset_id""")

    def _syncs(self) -> None:
        by_name = nsys_enums.sync_kind_by_name_sql("c.name")
        by_code = nsys_enums.sql_case("s.sync_type", self.enums.sync_codes)
        self.duck.execute(f"""
            CREATE TEMP TABLE sync AS
            SELECT s.*, c.call_id, c.tid, c.name AS api_name,
                   {by_name} AS kind_by_name, {by_code} AS kind_by_code
            FROM {_src(SYNC)} s {self._call_join('s')}""")
        self._emit("syncs", f"""
            SELECT row_number() OVER (ORDER BY start_ns, src_row) - 1 AS sync_id,
                   COALESCE(kind_by_name, kind_by_code, 'unknown') AS kind, api_name,
                   device_id, context_id,
                   CASE WHEN COALESCE(kind_by_name, kind_by_code) IN ('device', 'context')
                          OR stream_id = {NO_STREAM} THEN NULL ELSE stream_id END AS stream_id,
                   start_ns, end_ns, correlation_id, {PID.format(g='global_pid')} AS pid, tid,
                   call_id AS launch_call_id
            FROM sync ORDER BY sync_id""")
        by_code_n, unknown_n = self.duck.execute(
            "SELECT count(*) FILTER (kind_by_name IS NULL AND kind_by_code IS NOT NULL), "
            "count(*) FILTER (kind_by_name IS NULL AND kind_by_code IS NULL) FROM sync").fetchone()
        self.metadata["syncs_classified_by_code"] = by_code_n
        if unknown_n:
            self.warnings.append(f"{unknown_n} sync(s) have neither a known API call nor a usable "
                                 "syncType code: kind 'unknown'")

    def _ranges(self) -> None:
        kind = nsys_enums.sql_case("n.event_type", self.enums.nvtx)
        g = "n.global_tid"
        self.duck.execute(f"CREATE TEMP TABLE nvtx AS SELECT n.*, {kind} AS kind FROM {_src(NVTX)} n")
        self._emit("ranges", f"""
            WITH named AS (
                SELECT n.*, COALESCE(n.text, s.value) AS name, {g} & {PROCESS_MASK} AS process
                FROM nvtx n LEFT JOIN strings s ON s.id = n.text_id
                WHERE n.kind IS NOT NULL
            ), domains AS (  -- NvtxDomainCreate rows name a process's domain ids
                SELECT process, domain_id, min(name) AS domain FROM named
                WHERE kind = 'domain' GROUP BY process, domain_id
            )
            SELECT row_number() OVER (ORDER BY n.start_ns, n.src_row) - 1 AS range_id,
                   n.kind, n.name, d.domain, {PID.format(g=g)} AS pid, {TID.format(g=g)} AS tid,
                   n.start_ns, CASE WHEN n.kind = 'nvtx_mark' THEN n.start_ns ELSE n.end_ns END AS end_ns
            FROM named n
            LEFT JOIN domains d ON d.process = n.process AND d.domain_id = n.domain_id
            WHERE n.kind IN ('nvtx', 'nvtx_mark')
            ORDER BY range_id""")

    def _memory_events(self) -> None:
        oper = nsys_enums.sql_case("m.oper", self.enums.mem_oper)
        self._emit("memory_events", f"""
            SELECT row_number() OVER (ORDER BY m.start_ns, m.src_row) - 1 AS event_id,
                   m.start_ns AS ts_ns, 'cuda' AS device_type, m.device_id, m.address,
                   CASE WHEN {oper} = 'free' THEN -abs(m.bytes) ELSE m.bytes END AS bytes,
                   {PID.format(g='m.global_pid')} AS pid
            FROM {_src(MEMORY)} m
            ORDER BY event_id""")

    def _devices(self) -> None:
        used = " UNION ".join(f"SELECT device_id FROM {_src(t)}" for t in (KERNEL, MEMCPY, MEMSET, SYNC, GRAPH, MEMORY))
        used_ids = [r[0] for r in self.duck.execute(
            f"SELECT DISTINCT device_id FROM ({used}) WHERE device_id BETWEEN {-2**31} AND {2**31 - 1}").fetchall()]
        devices, meta = read_devices(self.f, used_ids, self.warnings)
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


def _src(table: str) -> str:
    return "src_" + table.lower()
