"""Nsight Systems SQLite export -> ParsedTrace (format `nsys-sqlite`, clock `nsys-session`).

`read` runs STAGES, in their order, over one `ReadState` (nsys_state.py): what the file is,
its source tables (nsys_sources.py), the StringIds values, the API calls GPU rows look up,
the device ids seen, the sink the tables go to. Each stage is a short function that reads
what the stages before it set and adds its output tables, metadata and warnings.

Every table and column is probed first (exports create tables lazily and columns come and
go between schema versions). The numeric columns of each activity table, plus StringIds
ids, are fetched into Arrow through ADBC (nsys_sqlite.py; sqlite3 where ADBC is missing or
fails), each stage waiting for its own table; kernels, copies and NVTX are read as streams
of parts and built part by part, and runtime calls are sorted whole (real exports write
them per thread) and stored in parts. With a sink (`Store.ingest` passes its RunWriter)
each part goes straight into the store's transaction, so no output table is ever whole in
memory, and freed memory is handed back to the OS between steps. Names stay StringIds ids
until the end and become dictionary-encoded columns (each distinct string once, however
many rows name it); name clean-up and code-to-word mappings run once per distinct value.
Rows are put in (start, file order) with a stable sort (skipped when already in order), GPU
rows find their API call by a binary search over the calls' sorted keys
(`nsys_arrow.CallIndex`; a join where a key repeats), and each source column is released as
soon as its output exists. docs/performance.md has the measurements that chose this. The
file is never written.

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
from pathlib import Path
from typing import Callable

import duckdb

from . import nsys_enums
from .base import ParsedTrace, TableSink, TraceError, as_path
from .nsys_devices import read_devices
from .nsys_gpu import copies, kernels, memory_events, memsets, syncs
from .nsys_graphs import graph_nodes
from .nsys_host import api_calls, ranges, strings
from .nsys_sources import GRAPH, KERNEL, NVTX
from .nsys_sqlite import NsysFile, one_line
from .nsys_state import ReadState
from ..resources import Resources

FORMAT = "nsys-sqlite"
PRODUCER = "nsys"
CLOCK = "nsys-session"
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
KEPT_META_KEYS = ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION", "EXPORT_PARAM_TIME_NORMALIZE",
                  "EXPORT_PARAM_TIME_SHIFT")


def read(path: str | Path, backend: str | None = None, sink: TableSink | None = None, *,
         resources: Resources | None = None) -> ParsedTrace:
    """Read an nsys SQLite export. `backend` forces "adbc" or "sqlite3" (default: ADBC if
    importable). With a `sink`, every table but `devices` goes there as it is built (and
    is not in the result's `tables`). Fetches run on `nsys_sqlite.fetch_threads(resources)`
    threads (default resources: `Resources.available()`)."""
    f = NsysFile(as_path(path), backend, resources)
    try:
        state = ReadState.open(f, sink)
        try:
            for _name, stage in STAGES:
                stage(state)
        finally:
            state.duck.close()
        return _result(state)
    except sqlite3.Error as e:
        raise TraceError(f"corrupt or truncated SQLite export ({one_line(e)})") from None
    except duckdb.Error as e:
        raise TraceError(f"export has rows that could not be processed ({one_line(e)})") from None
    finally:
        f.close()


def _result(state: ReadState) -> ParsedTrace:
    trace = state.trace
    trace.tables = ({} if state.sink is not None else state.out.tables()) | state.tables
    trace.warnings = state.sources.warnings() + state.warnings
    trace.metadata = state.metadata
    return trace


# -- stages on the file as a whole -----------------------------------------------------
def check_export(state: ReadState) -> None:
    names = list(state.f.tables)
    if "StringIds" in names or any(n.startswith(("CUPTI_", "NVTX_", "TARGET_INFO_")) for n in names):
        return
    shown = ", ".join(names[:5]) + (f", ... ({len(names)} tables)" if len(names) > 5 else "")
    raise TraceError("SQLite file is not an Nsight Systems export (no StringIds, CUPTI_*, NVTX_* "
                     f"or TARGET_INFO_* tables; it has {shown or 'no tables'})")


def facts(state: ReadState) -> None:
    """The run's facts (`state.trace`), and what the export says of its capture."""
    f, meta = state.f, _export_meta(state)
    host = None
    if f.has("TARGET_INFO_SYSTEM_ENV", "name") and f.has("TARGET_INFO_SYSTEM_ENV", "value"):
        hosts = f.rows("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1")
        host = hosts[0][0] if hosts and hosts[0][0] else None
    if f.has("META_DATA_CAPTURE", "name") and f.has("META_DATA_CAPTURE", "value"):
        # `Graph` (nsys's default: a replay is one row) or `Node` (--cuda-graph-trace=node).
        mode = f.rows("SELECT value FROM META_DATA_CAPTURE "
                      "WHERE name LIKE '%CUDA_GRAPH_TRACE_OPTIONS:MODE' LIMIT 1")
        if mode and mode[0][0]:
            state.metadata["cuda_graph_trace"] = mode[0][0]
    if f.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        epoch = f.rows("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
        state.metadata["session_start_utc_epoch_ns"] = epoch[0][0] if epoch else None
    state.trace = ParsedTrace(format=FORMAT, producer=PRODUCER, clock=CLOCK, host=host,
                              producer_version=meta.get("EXPORT_PRODUCT_VERSION") or None,
                              schema_version=meta.get("EXPORT_SCHEMA_VERSION") or None)


def _export_meta(state: ReadState) -> dict[str, str]:
    """The export's metadata table (the keys kept), or the era of an export without one."""
    f = state.f
    meta_table = next((t for t in META_TABLES if f.has(t, "name") and f.has(t, "value")), None)
    if not meta_table:
        # No metadata table: a 2021-era export. TARGET_INFO_CUDA_GPU (or a TARGET_INFO_GPU
        # keyed by deviceId) marks the layout that predates schema 2.9.
        legacy = f.has("TARGET_INFO_CUDA_GPU") or f.has("TARGET_INFO_GPU", "deviceId")
        state.metadata["schema_era"] = "pre-2.9 (TARGET_INFO_CUDA_GPU layout)" if legacy else "unversioned"
        return {}
    meta = {k: v for k, v in f.rows(f"SELECT name, value FROM {meta_table}")
            if k in KEPT_META_KEYS or str(k).startswith("DERIVED_")}
    state.metadata["export_meta_table"] = meta_table
    state.metadata["export_meta"] = meta
    return meta


def enums(state: ReadState) -> None:
    state.enums = nsys_enums.load(state.f, state.trace.schema_version)
    state.metadata["enum_sources"] = state.enums.sources


def fetch(state: ReadState) -> None:
    """Every source fetch starts now (NVTX: only the event types the enums know); each
    stage below waits for its own."""
    nvtx_types = ", ".join(str(int(k)) for k in state.enums.nvtx) or "NULL"
    filters = {NVTX: f"eventType IN ({nvtx_types})"} if state.f.has(NVTX, "eventType") else {}
    state.sources.start(filters)


def _profiler_errors(f) -> str:
    """The errors Nsight Systems logged while collecting (DIAGNOSTIC_EVENT, severity 3: a CUPTI
    failure, as under WSL), said beside an empty capture: it may be the profiler's, not the
    program's (at most two, each once)."""
    if not f.has("DIAGNOSTIC_EVENT", "severity"):
        return ""
    texts = list(dict.fromkeys(" ".join(str(t).split()) for (t,) in f.rows(
        "SELECT text FROM DIAGNOSTIC_EVENT WHERE severity = 3 ORDER BY timestamp")))
    return f"; the profiler logged errors, collection may have failed: {'; '.join(texts[:2])}" if texts else ""


def devices(state: ReadState) -> None:
    table, meta = read_devices(state.f, sorted(state.sources.device_ids), state.warnings)
    state.tables["devices"] = table
    state.metadata["devices"] = meta


def notes(state: ReadState) -> None:
    f = state.f
    if not any(name.startswith("CUPTI_ACTIVITY_KIND_") for name in f.tables):
        state.warnings.append("no CUDA activity tables (CUPTI_ACTIVITY_KIND_*): the capture has no "
                              "kernels, copies or CUDA API calls" + _profiler_errors(f))
    elif not f.has(KERNEL) and not f.has(GRAPH):
        state.warnings.append(f"no kernel table ({KERNEL}): the capture recorded no kernels" + _profiler_errors(f))
    if f.utf8_repaired:
        state.warnings.append("invalid UTF-8 replaced in " + ", ".join(sorted(f.utf8_repaired)))
    state.metadata["fetch_backend"] = f.backend
    if f.fallbacks:
        state.metadata["adbc_fallbacks"] = f.fallbacks


# The read, in order: each stage reads only what the ones before it set.
STAGES: tuple[tuple[str, Callable[[ReadState], None]], ...] = (
    ("export", check_export),  # the file is an Nsight Systems export, else TraceError
    ("facts", facts),  # host, versions, export metadata, session start, graph trace mode
    ("enums", enums),  # this schema version's code -> word mappings
    ("fetch", fetch),  # every source fetch starts (on a few threads; the big tables as streams)
    ("strings", strings),  # StringIds, checked against the input limits on what rows repeat
    ("api calls", api_calls),  # and the lookup GPU rows find their call in
    ("kernels", kernels),  # whole-graph executions among them
    ("copies", copies),
    ("memsets", memsets),
    ("graph nodes", graph_nodes),  # the operations graph launches ran, placed where captured
    ("syncs", syncs),  # the last stage that looks up calls
    ("ranges", ranges),  # from NVTX
    ("memory events", memory_events),
    ("devices", devices),  # the GPUs the activity rows used
    ("notes", notes),  # warnings on what the capture lacks; how the file was read
)
