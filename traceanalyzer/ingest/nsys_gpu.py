"""The nsys reader's stages for GPU activity: `kernels` (whole-graph executions among them),
`copies`, `memsets`, `syncs` and `memory_events`. Rows are put in (start, file order) with a
stable sort (skipped when already in order) and find their API call through `state.calls`;
kernels, copies and memsets note the rows a graph ran for the graph nodes stage."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import nsys_arrow as arrow
from . import nsys_enums
from .nsys_sources import GRAPH, KERNEL, MEMCPY, MEMORY, MEMSET, STR, SYNC, ReadWhole
from .nsys_state import PID, ReadState, lookup, pid_of, process_of, restart, store, view_name

NO_STREAM = 4294967295  # streamId of context/event syncs: (uint32)-1
LAUNCH_CONFIG = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
                 "static_shared_mem_bytes", "dynamic_shared_mem_bytes", "local_mem_per_thread_bytes")


def _table_columns(data: pa.Table) -> dict[str, pa.ChunkedArray]:
    return dict(zip(data.column_names, data.columns))


def _sorted(state: ReadState, table: str) -> tuple[pa.Table, np.ndarray | None]:
    data = state.sources.take(table)
    return data, arrow.order(data["start_ns"])


# -- kernels -------------------------------------------------------------------------
def kernels(state: ReadState) -> None:
    """`kernels`, part by part where the table is streamed, with the whole-graph executions
    (a file with any is read whole) as kernels named `[CUDA graph N]`."""
    src = state.sources
    rows = launched = 0
    if src.streamed(KERNEL):
        try:
            graph = src.get(GRAPH)  # empty: a file with graph rows is read whole
            for part in src.parts(KERNEL):
                n, hit = _kernel_rows(state, _table_columns(part), _table_columns(graph), rows)
                rows, launched = rows + n, launched + hit
        except ReadWhole:
            restart(state, KERNEL, "kernels")
            rows = launched = 0
    if not rows and src.has_whole(KERNEL):
        rows, launched = _kernel_rows(state, src.columns(KERNEL), src.columns(GRAPH), 0)
    state.metadata["kernels_with_launch_call"] = launched
    if rows and launched < rows:
        state.warnings.append(f"{rows - launched} of {rows} kernel(s) have no launch call in the trace "
                              "(time-sliced capture, or API tracing off)")
    graphs = state.metadata["source_rows"].get(GRAPH, 0)
    if graphs:
        state.warnings.append(f"{graphs} whole-graph execution(s) from {GRAPH} were added as opaque "
                              "kernels named [CUDA graph N]: their kernels were not traced one by one "
                              "(capture with --cuda-graph-trace=node for that)")


def _kernel_rows(state: ReadState, k: dict, gr: dict, first_id: int) -> tuple[int, int]:
    """Kernel rows (and whole-graph rows) from their source columns, stored with ids from
    `first_id`: (rows, rows with a launch call)."""
    nk, ng = len(k["start_ns"]), len(gr["start_ns"])
    # Kernel rows, then whole-graph rows: a stable sort on start keeps (start, source, file order).
    order = arrow.order(arrow.concat(k["start_ns"], gr["start_ns"]))

    def column(name: str) -> pa.Array:
        a = k.pop(name)
        b = gr.pop(name) if name in gr else pa.nulls(ng, a.type)
        return arrow.take(arrow.concat(a, b), order)

    names = _kernel_names(state, k, gr)
    corr, gpid = column("correlation_id"), column("global_pid")
    launch_call_id, tid, _ = state.calls.link(corr, gpid)
    n = nk + ng
    out = {"kernel_id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64))}
    out.update((c, column(c)) for c in ("device_id", "context_id", "stream_id", "start_ns", "end_ns"))
    out.update((c, arrow.take(names.pop(c), order)) for c in list(names))
    out.update((c, column(c)) for c in LAUNCH_CONFIG)
    out.update(correlation_id=corr, pid=pid_of(gpid), tid=tid,
               launch_call_id=launch_call_id, graph_id=column("graph_id"), graph_node_id=column("graph_node_id"))
    whole = arrow.take(pa.array(np.arange(n) >= nk), order)  # the whole-graph rows
    _note_graph_ops(state, "kernel", out["kernel_id"], launch_call_id, out["start_ns"], gpid,
                    out["graph_node_id"], whole)
    store(state, "kernels", pa.table(out))
    return n, n - launch_call_id.null_count


def _kernel_names(state: ReadState, k: dict, gr: dict) -> dict[str, pa.DictionaryArray]:
    """name, short_name, mangled_name of the kernel rows then the whole-graph rows (in
    source order), their id columns popped from `k`. name: the demangled name when
    StringIds has it, else the short name."""
    ng = len(gr["start_ns"])
    idx, pos = lookup(state, k["demangled_id"])
    demangled = pc.fill_null(pc.take(pc.is_valid(pc.take(state.strings["value"], pos)), idx), False)
    name_ids = pc.if_else(demangled, arrow.array(k["demangled_id"]), arrow.array(k["short_id"]))
    graph_names = pc.binary_join_element_wise(
        "[CUDA graph ", pc.fill_null(pc.cast(gr["graph_id"], STR), "?"), "]", "")
    names = {"name": _names(state, name_ids, graph_names),
             "short_name": _names(state, k.pop("short_id"), pa.array(["[CUDA graph]"] * ng, STR)),
             "mangled_name": _names(state, k.pop("mangled_id"), pa.nulls(ng, STR))}
    del k["demangled_id"]
    return names


def _names(state: ReadState, ids: pa.ChunkedArray, extra: pa.Array) -> pa.DictionaryArray:
    """Dictionary-encoded StringIds values of `ids`, followed by the strings `extra`."""
    idx, pos = lookup(state, ids)
    values = pc.take(state.strings["value"], pos)
    if len(extra):
        more = pc.dictionary_encode(arrow.array(extra))
        idx = pa.concat_arrays([idx, pc.add(more.indices, len(values)).cast(idx.type)])
        values = pa.concat_arrays([values, more.dictionary.cast(STR)])
    return arrow.dictionary(idx, values)


def _note_graph_ops(state: ReadState, kind: str, ids: pa.Array, launch_call_id: pa.Array, start: pa.Array,
                    global_pid: pa.Array, node_id: pa.Array, whole: pa.Array | None = None) -> None:
    """Keep, for the graph nodes stage, the rows (of one part) a graph ran: those with a graph
    node id, and whole-graph rows. A few integers a row, and none for a run without graphs."""
    node_id = arrow.array(node_id)
    keep = pc.is_valid(node_id) if whole is None else pc.or_(pc.is_valid(node_id), whole)
    if not pc.any(keep).as_py():
        return
    n = len(node_id)
    state.graph_ops.append(pa.table({
        "kind": pa.array([kind] * n), "item_id": ids, "launch_call_id": launch_call_id,
        "start_ns": arrow.array(start), "process": process_of(arrow.array(global_pid)),
        "node_id": node_id, "whole": whole if whole is not None else pa.array(np.zeros(n, bool))}).filter(keep))


# -- copies, memsets -----------------------------------------------------------------
def copies(state: ReadState) -> None:
    """`copies`, part by part where the table is streamed."""
    src = state.sources
    rows = linked = 0
    if src.streamed(MEMCPY):
        try:
            for part in src.parts(MEMCPY):
                n, hit = _copy_rows(state, part, None, rows)
                rows, linked = rows + n, linked + hit
        except ReadWhole:
            restart(state, MEMCPY, "copies")
            rows = linked = 0
    if not rows and src.has_whole(MEMCPY):
        rows, linked = _copy_rows(state, *_sorted(state, MEMCPY), 0)
    state.metadata["copies_with_api_call"] = linked


def _copy_rows(state: ReadState, m: pa.Table, order: np.ndarray | None, first_id: int) -> tuple[int, int]:
    """Copy rows from their source rows (put in `order`), stored with ids from `first_id`:
    (rows, rows with an API call)."""
    e = state.enums
    col = lambda c: arrow.take(m[c], order)  # noqa: E731
    kind = col("copy_kind")
    corr, gpid = col("correlation_id"), col("global_pid")
    launch_call_id, tid, api_name = state.calls.link(corr, gpid)
    ids, node = pa.array(np.arange(first_id, first_id + m.num_rows, dtype=np.int64)), col("graph_node_id")
    _note_graph_ops(state, "copy", ids, launch_call_id, col("start_ns"), gpid, node)
    store(state, "copies", pa.table({
        "copy_id": ids,
        "device_id": col("device_id"), "context_id": col("context_id"), "stream_id": col("stream_id"),
        "start_ns": col("start_ns"), "end_ns": col("end_ns"),
        "direction": arrow.enum(kind, {k: v[0] for k, v in e.copy_kind.items()}, "unknown"),
        "unified_memory": arrow.enum(kind, {k: v[1] for k, v in e.copy_kind.items()}, False, pa.bool_()),
        "src_kind": arrow.enum(col("src_kind"), e.mem_kind, "unknown"),
        "dst_kind": arrow.enum(col("dst_kind"), e.mem_kind, "unknown"),
        "bytes": col("bytes"), "src_device_id": col("src_device_id"), "dst_device_id": col("dst_device_id"),
        "correlation_id": corr, "pid": pid_of(gpid), "tid": tid,
        "api_name": api_name, "launch_call_id": launch_call_id, "graph_node_id": node}))
    return m.num_rows, m.num_rows - launch_call_id.null_count


def memsets(state: ReadState) -> None:
    m, order = _sorted(state, MEMSET)
    col = lambda c: arrow.take(m[c], order)  # noqa: E731
    corr, gpid = col("correlation_id"), col("global_pid")
    launch_call_id, tid, api_name = state.calls.link(corr, gpid)
    ids, node = pa.array(np.arange(m.num_rows, dtype=np.int64)), col("graph_node_id")
    _note_graph_ops(state, "memset", ids, launch_call_id, col("start_ns"), gpid, node)
    store(state, "memsets", pa.table({
        "memset_id": ids,
        "device_id": col("device_id"), "context_id": col("context_id"), "stream_id": col("stream_id"),
        "start_ns": col("start_ns"), "end_ns": col("end_ns"), "bytes": col("bytes"), "value": col("value"),
        "mem_kind": arrow.enum(col("mem_kind"), state.enums.mem_kind, "unknown"),
        "correlation_id": corr, "pid": pid_of(gpid), "tid": tid,
        "api_name": api_name, "launch_call_id": launch_call_id, "graph_node_id": node}))
    state.metadata["memsets_with_api_call"] = m.num_rows - launch_call_id.null_count


# -- syncs ---------------------------------------------------------------------------
def syncs(state: ReadState) -> None:
    """`syncs`, each classified by its API call's name, by its `syncType` code where no
    known call is found (the codes were renumbered between versions). The last GPU table:
    the calls are released after it."""
    s, order = _sorted(state, SYNC)
    col = lambda c: arrow.take(s[c], order)  # noqa: E731
    corr, gpid = col("correlation_id"), col("global_pid")
    launch_call_id, tid, api_name = state.calls.link(corr, gpid)
    state.calls.close()
    state.calls = None
    by_name = _sync_kinds_by_name(state, api_name)
    by_code = arrow.enum(col("sync_type"), state.enums.sync_codes, None).cast(STR)
    known = pc.coalesce(by_name, by_code)
    stream = col("stream_id")
    no_stream = pc.or_(pc.fill_null(pc.is_in(known, pa.array(["device", "context"])), False),
                       pc.fill_null(pc.equal(stream, NO_STREAM), False))
    store(state, "syncs", pa.table({
        "sync_id": pa.array(np.arange(s.num_rows, dtype=np.int64)),
        "kind": pc.dictionary_encode(pc.coalesce(known, pa.scalar("unknown"))), "api_name": api_name,
        "device_id": col("device_id"), "context_id": col("context_id"),
        "stream_id": pc.if_else(no_stream, pa.scalar(None, stream.type), stream),
        "start_ns": col("start_ns"), "end_ns": col("end_ns"), "correlation_id": corr,
        "pid": pid_of(gpid), "tid": tid, "launch_call_id": launch_call_id}))
    name_missing = pc.is_null(by_name)
    state.metadata["syncs_classified_by_code"] = pc.sum(pc.and_(name_missing, pc.is_valid(by_code))).as_py() or 0
    unknown_n = pc.sum(pc.and_(name_missing, pc.is_null(by_code))).as_py() or 0
    if unknown_n:
        state.warnings.append(f"{unknown_n} sync(s) have neither a known API call nor a usable "
                              "syncType code: kind 'unknown'")


def _sync_kinds_by_name(state: ReadState, api_name: pa.DictionaryArray) -> pa.Array:
    """Per sync, the kind its call's name says (NULL for none), worked out once per distinct name."""
    names = api_name.dictionary
    state.duck.register("call_names", pa.table({"i": np.arange(len(names)), "name": names}))
    per_name = state.duck.sql(f"SELECT {nsys_enums.sync_kind_by_name_sql('name')} AS kind "
                              "FROM call_names ORDER BY i").to_arrow_table()["kind"]
    state.duck.unregister("call_names")
    return pc.take(arrow.array(per_name).cast(STR), api_name.indices)


# -- memory events -------------------------------------------------------------------
def memory_events(state: ReadState) -> None:
    """`memory_events` from the CUDA memory usage events: frees as negative bytes."""
    oper = nsys_enums.sql_case("m.oper", state.enums.mem_oper)
    data = state.sources.take(MEMORY)
    data = data.append_column("src_row", pa.array(np.arange(data.num_rows, dtype=np.int64)))
    state.duck.register(view_name(MEMORY), data)
    try:
        store(state, "memory_events", state.duck.sql(f"""
            SELECT row_number() OVER (ORDER BY m.start_ns, m.src_row) - 1 AS event_id,
                   m.start_ns AS ts_ns, 'cuda' AS device_type, m.device_id, m.address,
                   CASE WHEN {oper} = 'free' THEN -abs(m.bytes) ELSE m.bytes END AS bytes,
                   {PID.format(g='m.global_pid')} AS pid
            FROM {view_name(MEMORY)} m
            ORDER BY event_id""").to_arrow_table())
    finally:
        state.duck.unregister(view_name(MEMORY))
