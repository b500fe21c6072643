"""What one read of an Nsight Systems export holds while its stages run (`ReadState`), the
API calls GPU rows look theirs up in (`CallLookup`), and what every stage shares: storing an
output table, finding StringIds values, handing memory back."""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import nsys_arrow as arrow
from .. import os_memory
from ..resources import connect_duckdb
from .base import CollectedTables, ParsedTrace, TableSink
from .nsys_enums import Enums
from .nsys_sources import Sources
from .nsys_sqlite import NsysFile, arrow_schema

# 0xFFFFFFFFFF000000 as a signed 64-bit integer: the process part of a serialized globalTid.
PROCESS_MASK = -16777216
PID = "(({g} >> 24) & 16777215)"  # pid = (globalTid >> 24) & 0xFFFFFF
TID = "({g} & 16777215)"


@dataclass(eq=False)
class ReadState:
    """One read of one export. The stages (`nsys.STAGES`) fill it in their order; a field
    says which stage sets it, and a stage reads only what an earlier one set."""

    f: NsysFile  # the export, open read-only
    sources: Sources  # its source tables: fetches in flight, streams, rows dropped, devices seen
    sink: TableSink | None  # the caller's (Store.ingest's RunWriter), or None
    out: TableSink  # where output tables go: the sink, or tables kept for the result
    duck: duckdb.DuckDBPyConnection  # an in-memory DuckDB for the joins done in SQL
    metadata: dict  # the run's metadata: every stage adds to it
    warnings: list[str] = field(default_factory=list)  # shown after the sources' drop warnings
    tables: dict[str, pa.Table] = field(default_factory=dict)  # outputs never streamed (devices)
    trace: ParsedTrace | None = None  # facts: format, host, versions (the result, once filled)
    enums: Enums | None = None  # enums: code -> word, as this schema version numbers them
    strings: dict[str, pa.Array] = field(default_factory=dict)  # strings: StringIds id, value, stripped, api
    calls: CallLookup | None = None  # api calls: looked up by GPU rows; closed by syncs
    node_calls: dict[tuple[int, int], int] = field(default_factory=dict)  # api calls: (thread, node creation) -> call_id
    graph_ops: list[pa.Table] = field(default_factory=list)  # kernels, copies, memsets: rows a graph ran
    nvtx_domains: dict[tuple[int, int], str] = field(default_factory=dict)  # ranges: (process, domain id) -> name

    @classmethod
    def open(cls, f: NsysFile, sink: TableSink | None) -> ReadState:
        sources = Sources(f)
        return cls(f=f, sources=sources, sink=sink, out=CollectedTables() if sink is None else sink,
                   duck=connect_duckdb(),  # TRACEANALYZER_MEMORY_LIMIT holds here too
                   metadata={"tables": sorted(f.tables), "source_rows": sources.rows,
                             "dropped_rows": sources.dropped})


def store(state: ReadState, name: str, table: pa.Table) -> None:
    """Keep an output table, each column in its schema type where the values allow
    (dictionary-encoded strings stay so; a value past the type is left for
    input_limits.check_tables to NULL, with a warning)."""
    schema = arrow_schema(name, table.column_names)
    columns = []
    for col, fld in zip(table.columns, schema):
        if col.type != fld.type and not pa.types.is_dictionary(col.type):
            try:
                col = col.cast(fld.type)
            except (pa.ArrowInvalid, OverflowError):
                pass
        columns.append(col)
    table = pa.Table.from_arrays(columns, names=table.column_names)
    del columns
    state.out.add(name, table)
    if state.sink is not None:  # the sink has it: what it held goes back before the next part
        table = None
        given_back(state)


def given_back(state: ReadState) -> None:
    """With a sink, hand freed memory back to the OS (Arrow's pool and malloc keep it
    otherwise; see os_memory.py): what one step freed is then there for the next, and for
    the store. Some 10 ms a time, once per part."""
    if state.sink is not None:
        os_memory.give_back()


def restart(state: ReadState, table: str, output: str) -> None:
    """A streamed table turned out not in order: drop what was stored of it, read it whole."""
    state.out.discard(output)
    state.sources.read_whole(table)


def lookup(state: ReadState, ids: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """StringIds ids per row -> (index per row into the distinct ids, each distinct id's
    row in `state.strings`, NULL when StringIds lacks it)."""
    encoded = pc.dictionary_encode(arrow.array(ids))
    return encoded.indices, pc.index_in(encoded.dictionary, state.strings["id"])


def process_of(global_id: pa.Array) -> pa.Array:
    """The process part of a globalTid or globalPid, to match rows of one process."""
    return pc.bit_wise_and(global_id, PROCESS_MASK)


def pid_of(global_id: pa.Array) -> pa.Array:
    return pc.bit_wise_and(pc.shift_right(global_id, 24), 16777215)


def view_name(table: str) -> str:
    """The DuckDB view a source table is registered as."""
    return "src_" + table.lower()


class CallLookup:
    """The API calls (in call_id order) GPU rows find theirs in, on correlationId AND
    process (correlation ids repeat across processes): through a sorted `CallIndex`, or a
    join in the reader's DuckDB where the index cannot be built. A tid fits 24 bits."""

    def __init__(self, duck: duckdb.DuckDBPyConnection, corr: pa.Array, global_tid: pa.Array,
                 name: pa.DictionaryArray):
        self.duck = duck
        process = process_of(global_tid)
        self.index = arrow.CallIndex.build(corr, process)
        tid = pc.bit_wise_and(global_tid, 16777215).cast(pa.int32())
        if self.index is None:
            self.table = pa.table({"call_id": pa.array(np.arange(len(corr), dtype=np.int64)), "correlation_id": corr,
                                   "process": process, "tid": tid, "name": name.indices})
            self.duck.register("api", self.table)
        else:
            self.table = pa.table({"tid": tid, "name": name.indices})
        self.names = name.dictionary  # dictionary of api_calls.name; `table["name"]` indexes it
        self.grouped = False  # whether the join goes to the calls grouped per key

    def link(self, corr: pa.Array, global_pid: pa.Array) -> tuple[pa.Array, pa.Array, pa.DictionaryArray]:
        """For GPU rows (in output order): their API call's call_id, tid and name.

        One call per (correlation id, process); should a file hold several, the first
        (lowest call_id) is taken, with the first non-NULL tid and name, as a GROUP BY
        would. That grouping costs as much as the join, so it is done only when the plain
        join shows a row matching twice. Without repeats, the sorted CallIndex finds the
        same calls without a join (a big table's parts each look up every call)."""
        n = len(corr)
        if self.index is not None:
            i, rows = self.index.find(corr, process_of(global_pid))
            rows = pa.array(rows)
            res = {"call_id": rows, "tid": pc.take(self.table["tid"], rows), "name": pc.take(self.table["name"], rows)}
            return self._linked(n, i, res)
        return self._linked(n, *self._joined(n, corr, global_pid))

    def _joined(self, n: int, corr: pa.Array, global_pid: pa.Array) -> tuple[np.ndarray, pa.Table]:
        self.duck.register("act", pa.table({"i": np.arange(n, dtype=np.int64), "correlation_id": corr,
                                            "process": process_of(global_pid)}))
        try:
            while True:
                calls = "calls" if self.grouped else "api"
                res = self.duck.sql(f"""
                    SELECT a.i, c.call_id, c.tid, c.name FROM act a
                    JOIN {calls} c ON c.correlation_id = a.correlation_id AND c.process = a.process""").to_arrow_table()
                i = res["i"].to_numpy()
                hit = np.zeros(n, dtype=bool)
                hit[i] = True
                if self.grouped or int(np.count_nonzero(hit)) == len(i):
                    return i, res
                self.grouped = True
                self.duck.execute("""
                    CREATE TEMP TABLE calls AS
                    SELECT correlation_id, process, min(call_id) AS call_id,
                           arg_min(tid, call_id) AS tid, arg_min(name, call_id) AS name
                    FROM api WHERE correlation_id IS NOT NULL GROUP BY correlation_id, process""")
        finally:
            self.duck.unregister("act")

    def _linked(self, n: int, i: np.ndarray, res) -> tuple[pa.Array, pa.Array, pa.DictionaryArray]:
        call_id, tid, name = (arrow.scatter(n, i, res[c]) for c in ("call_id", "tid", "name"))
        used = pc.drop_null(pc.unique(name))  # the names these rows use, of all api names
        return call_id, tid, pa.DictionaryArray.from_arrays(pc.index_in(name, used).cast(pa.int32()),
                                                            pc.take(self.names, used))

    def close(self) -> None:
        """Release the calls (after the last GPU table is linked)."""
        if self.index is None:
            self.duck.unregister("api")
        self.duck.execute("DROP TABLE IF EXISTS calls")
