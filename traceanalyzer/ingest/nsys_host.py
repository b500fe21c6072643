"""The nsys reader's stages for what the host recorded: the StringIds table (`strings`), the
runtime and driver calls (`api_calls`) and the NVTX ranges (`ranges`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import nsys_arrow as arrow
from .. import input_limits
from .nsys_sources import GRAPH_NODES, NVTX, RUNTIME, SOURCES, STR, STRINGS, ReadWhole
from .nsys_state import CallLookup, ReadState, given_back, lookup, pid_of, process_of, restart, store, view_name

# Past this, a StringIds value could multiply into gigabytes by being named on every row.
LONG_STRING_BYTES = 64 * 1024
STRING_ID_COLUMNS = ("demangled_id", "short_id", "mangled_id", "name_id", "text_id")


# -- strings -------------------------------------------------------------------------
def strings(state: ReadState) -> None:
    """All of StringIds, once; names are worked out per distinct string, not per row,
    and reach the tables as dictionary-encoded columns (ids until then).

    Fetching the whole table is cheaper than asking SQLite which ids are referenced
    (that scans every activity table again; see bench/bench_sqlite_read.py)."""
    data = state.sources.take(STRINGS)
    longest = pc.max(pc.binary_length(data["value"])).as_py() or 0
    state.duck.register("string_ids", data)
    if longest > LONG_STRING_BYTES:
        _check_expansion(state)
    table = state.duck.sql("""
        SELECT id, value, regexp_replace(value, '_v[0-9]+$', '') AS stripped,
               CAST(CASE WHEN value LIKE 'cuda%' THEN 0 WHEN value LIKE 'cu%' THEN 1 END AS TINYINT) AS api
        FROM string_ids""").to_arrow_table()
    state.duck.unregister("string_ids")
    state.strings = {c: arrow.array(table[c]) for c in table.column_names}


def _check_expansion(state: ReadState) -> None:
    """A long string is stored once in StringIds but repeated on every row naming it:
    add up, over the id columns, the lengths the tables would hold, before any join."""
    refs, views = [], []
    for t, spec in SOURCES.items():
        ids = [alias for alias in spec if alias in STRING_ID_COLUMNS]
        if ids:
            views.append(view_name(t))
            state.duck.register(view_name(t), state.sources.selected(t, ids))
            refs += [f"SELECT n.len FROM {view_name(t)} x JOIN string_lengths n ON n.id = x.{alias}" for alias in ids]
    try:
        state.duck.execute("CREATE TEMP TABLE string_lengths AS SELECT id, strlen(value) AS len FROM string_ids")
        longest, total = state.duck.execute(
            f"SELECT COALESCE(max(len), 0), COALESCE(sum(len), 0) FROM ({' UNION ALL '.join(refs)})").fetchall()[0]
    finally:
        for v in views:
            state.duck.unregister(v)
    if longest > input_limits.get("MAX_STRING_BYTES"):
        raise input_limits.over("MAX_STRING_BYTES", f"a name of {longest:,} bytes")
    if total > input_limits.get("MAX_TEXT_BYTES"):
        raise input_limits.over("MAX_TEXT_BYTES", f"names repeated on every row would take {total:,} bytes of strings")


# -- api calls -----------------------------------------------------------------------
class _SortedCalls(NamedTuple):
    """Runtime calls in start order: `order` puts a source column (in `rest`) in it."""

    order: np.ndarray | None
    rest: dict[str, pa.Array]
    global_tid: pa.Array
    corr: pa.Array
    name: pa.DictionaryArray
    idx: pa.Array  # per call, its index into the distinct name ids
    api: pa.Array  # per call: 0 runtime, 1 driver (int8)
    raw_by_string: pa.Array


def api_calls(state: ReadState) -> None:
    """`api_calls` in start order (`call_id`), the lookup GPU rows find their call in
    (`state.calls`), and the call each graph node was created in (`state.node_calls`)."""
    _api_calls(state)
    given_back(state)  # the runtime source, before kernels are read


def _api_calls(state: ReadState) -> None:
    r = state.sources.columns(RUNTIME)
    n, order = len(r["start_ns"]), arrow.order(r["start_ns"])
    col = lambda c: arrow.take(r.pop(c), order)  # noqa: E731
    g = col("global_tid")
    idx, pos = lookup(state, col("name_id"))
    name = arrow.dictionary(idx, pc.take(state.strings["stripped"], pos))
    # Runtime or driver: from the name, else from eventClass (0 runtime, 1 driver).
    by_class = arrow.take(_api_class(r.pop("event_class")), order)
    api = pc.coalesce(pc.take(pc.take(state.strings["api"], pos), idx), by_class)
    corr = col("correlation_id")
    given_back(state)  # the source columns sorted so far
    state.calls = CallLookup(state.duck, corr, g, name)
    # The table itself is built and stored in parts, each source row taken once: it is
    # never whole in memory beside its source.
    rest = {}
    for c in list(r):
        rest[c] = arrow.array(r.pop(c))
        given_back(state)  # the source's batches, now copied
    calls = _SortedCalls(order, rest, g, corr, name, idx, api, pc.take(state.strings["value"], pos))
    step = state.sources.chunk_rows
    for lo in range(0, max(n, 1), step):
        store(state, "api_calls", _calls_part(calls, lo, min(n, lo + step) - lo))
    _capture_calls(state, calls)


def _api_class(event_class: pa.ChunkedArray) -> pa.Array:
    """eventClass as int8: 0 runtime, 1 driver, NULL for any other code (8 bytes a row less
    to hold while the calls are stored)."""
    c = arrow.array(event_class)
    return pc.if_else(pc.is_in(c, pa.array([0, 1], c.type)), c.cast(pa.int8(), safe=False), pa.scalar(None, pa.int8()))


def _calls_part(c: _SortedCalls, lo: int, size: int) -> pa.Table:
    """Rows lo..lo+size of `api_calls`."""
    rows = None if c.order is None else c.order[lo:lo + size]
    part = lambda col: c.rest[col].slice(lo, size) if rows is None else c.rest[col].take(rows)  # noqa: E731
    g = c.global_tid.slice(lo, size)
    return pa.table({
        "call_id": pa.array(np.arange(lo, lo + size, dtype=np.int64)),
        "api": pa.DictionaryArray.from_arrays(c.api.slice(lo, size).cast(pa.int32()), pa.array(["runtime", "driver"])),
        "name": pa.DictionaryArray.from_arrays(c.name.indices.slice(lo, size), c.name.dictionary),
        "raw_name": arrow.dictionary(c.idx.slice(lo, size), c.raw_by_string),
        "pid": pid_of(g), "tid": pc.bit_wise_and(g, 16777215),
        "start_ns": part("start_ns"), "end_ns": part("end_ns"),
        "correlation_id": c.corr.slice(lo, size), "return_value": part("return_value")})


def _capture_calls(state: ReadState, calls: _SortedCalls) -> None:
    """Per node creation event (`CUDA_GRAPH_NODE_EVENTS` without an original: made while
    capturing), the call it was made in: on its thread, containing its start, the outermost
    (a runtime call holds the driver call it makes). Calls by start, as `call_id` counts them."""
    if not state.f.has(GRAPH_NODES):
        return
    ev = state.sources.get(GRAPH_NODES)  # kept for the graph nodes stage
    ev = ev.filter(pc.and_(pc.is_null(ev["original_id"]), pc.is_valid(ev["global_tid"])))
    if not ev.num_rows:
        return
    keep = pc.fill_null(pc.is_in(calls.global_tid, pc.unique(ev["global_tid"])), False)
    sorted_col = lambda c: arrow.take(calls.rest[c], calls.order).filter(keep)  # noqa: E731
    state.duck.register("node_events", ev.select(["global_tid", "start_ns"]))
    state.duck.register("node_calls", pa.table({
        "call_id": pc.indices_nonzero(keep), "global_tid": calls.global_tid.filter(keep),
        "start_ns": sorted_col("start_ns"), "end_ns": sorted_col("end_ns")}))
    try:
        rows = state.duck.sql("""
            SELECT e.global_tid, e.start_ns, arg_min(c.call_id, (c.start_ns, c.call_id)) AS call_id
            FROM (SELECT DISTINCT global_tid, start_ns FROM node_events) e
            JOIN node_calls c ON c.global_tid = e.global_tid AND e.start_ns BETWEEN c.start_ns AND c.end_ns
            GROUP BY ALL""").fetchall()
    finally:
        state.duck.unregister("node_events")
        state.duck.unregister("node_calls")
    state.node_calls = {(g, t): c for g, t, c in rows}


# -- ranges --------------------------------------------------------------------------
def ranges(state: ReadState) -> None:
    """`ranges` from NVTX pushes, pops, start/end pairs and marks, part by part where the
    table is streamed; the domains they were created in."""
    if state.sources.streamed(NVTX):
        try:
            emitted = 0
            for part in state.sources.parts(NVTX):
                emitted += _range_rows(state, part, emitted)
            return
        except ReadWhole:
            restart(state, NVTX, "ranges")
            state.nvtx_domains.clear()
    _range_rows(state, state.sources.take(NVTX), 0)


def _range_rows(state: ReadState, data: pa.Table, first_id: int) -> int:
    """Range rows from NVTX source rows (a part in start order, after the ones before, or
    the whole table), stored with ids from `first_id`: the rows stored. Worked out in
    Arrow, row for row: through DuckDB (a join and a sort per part) it is several times slower."""
    event_type = arrow.array(data["event_type"])
    of_kind = lambda *kinds: pc.is_in(event_type, pa.array(  # noqa: E731
        [c for c, v in state.enums.nvtx.items() if v in kinds], pa.int64()))
    idx, pos = lookup(state, data["text_id"])
    name = pc.coalesce(arrow.array(data["text"]), pc.take(pc.take(state.strings["value"], pos), idx))
    process = process_of(arrow.array(data["global_tid"]))
    domain_id = arrow.array(data["domain_id"])
    # NvtxDomainCreate rows name a process's domain ids; a domain is created before its ranges
    created = of_kind("domain")
    for p, d, n in zip(*(pc.filter(c, created).to_pylist() for c in (process, domain_id, name))):
        was = state.nvtx_domains.get((p, d))
        if n is not None and (was is None or n < was):  # the least name, as min() would
            state.nvtx_domains[(p, d)] = n
    is_mark = of_kind("nvtx_mark")
    keep = pc.indices_nonzero(of_kind("nvtx", "nvtx_mark"))
    order = arrow.order(pc.take(data["start_ns"], keep))
    if order is not None:
        keep = pc.take(keep, order)
    n = len(keep)
    at = lambda c: pc.take(arrow.array(c), keep)  # noqa: E731
    g, start = at(data["global_tid"]), at(data["start_ns"])
    store(state, "ranges", pa.table({
        "range_id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
        "kind": arrow.enum(at(event_type), state.enums.nvtx, None),
        "name": at(name), "domain": _domains(state, at(process), at(domain_id)),
        "pid": pid_of(g), "tid": pc.bit_wise_and(g, 16777215),
        "start_ns": start, "end_ns": pc.if_else(at(is_mark), start, at(data["end_ns"]))}))
    return n


def _domains(state: ReadState, process: pa.Array, domain_id: pa.Array) -> pa.DictionaryArray:
    """Per range row, the name of its process's domain, NULL where none was created."""
    known = sorted(state.nvtx_domains.items(), key=lambda kv: kv[0])
    names = pa.array([n for _, n in known], STR)
    if not known:
        return pa.DictionaryArray.from_arrays(pa.nulls(len(process), pa.int32()), names)
    state.duck.register("domains", pa.table({"process": pa.array([p for (p, _), _ in known], pa.int64()),
                                             "domain_id": pa.array([d for (_, d), _ in known], pa.int64()),
                                             "d": pa.array(range(len(known)), pa.int32())}))
    state.duck.register("keys", pa.table({"i": np.arange(len(process), dtype=np.int64), "process": process,
                                          "domain_id": domain_id}))
    try:
        hits = state.duck.sql("SELECT k.i, d.d FROM keys k JOIN domains d USING (process, domain_id)").to_arrow_table()
    finally:
        state.duck.unregister("keys")
        state.duck.unregister("domains")
    return pa.DictionaryArray.from_arrays(arrow.scatter(len(process), hits["i"].to_numpy(), hits["d"]), names)
