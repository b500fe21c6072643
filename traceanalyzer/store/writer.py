"""Writing a run into the store: `RunWriter` (one run's tables, as a reader hands them
over, in one transaction) and the helpers that put rows in (`conform`, `insert`,
`replace_findings`, `delete_rows`). Part of the store: only `Store` (store/__init__.py)
hands out a RunWriter or calls these, so the store stays the one place that writes.

Tables are inserted as the reader hands them over: dictionary-encoded strings are not
expanded first, and run_id and absent columns are constants of the INSERT, not per-row
arrays.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from .. import input_limits, kernel_library, schema
from ..ingest.base import ParsedTrace
from . import run_cache

_TIME_COLUMNS = ("start_ns", "end_ns", "ts_ns")


class StoreError(Exception):
    """A store that cannot be opened or written (locked, not a DuckDB file, ...)."""


@dataclass
class IngestResult:
    path: Path
    run_id: str
    format: str
    counts: dict[str, int]
    span_ns: int | None
    warnings: list[str] = field(default_factory=list)
    replaced: bool = False
    content_hash: str | None = None


class RunWriter:
    """Writes one run's tables into the store as a reader hands them over (a TableSink, so
    a big table need not wait in memory for the others), in one transaction: begun at
    the first table, committed by `finish`, rolled back by `abort`. A run with the same
    id is replaced. Tables are checked (`input_limits.TableChecks`) part by part."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: Callable[[], str]):
        self.con = con
        self._ask_run_id = run_id
        self.run_id: str | None = None  # set, and the transaction begun, by the first table
        self.replaced = False
        self.nbytes = 0  # Arrow bytes written (freed by the reader once written)
        self._checks = input_limits.TableChecks()
        self._rows: dict[str, int] = {}
        self._spans: dict[str, tuple[int | None, int | None]] = {}
        self._open = False

    def _begin(self) -> None:
        if self.run_id is not None:
            return
        run_id = self._ask_run_id()
        self.con.execute("BEGIN TRANSACTION")
        self.run_id, self._open = run_id, True
        # fetchall: DuckDB 2 refuses a register() on a connection with a half-read result
        self.replaced = self.con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0] > 0
        # A run's rows are written in the transaction that writes its `runs` row, so a run
        # id without one has no rows to delete. (Each DELETE scans its table's run_id column:
        # 14 of them per new run, growing with the store, were most of a scan writer's work.)
        if self.replaced:
            delete_rows(self.con, run_id)

    def add(self, name: str, table: pa.Table, *, checked: bool = False) -> None:
        """Append `table`'s rows to `name` (checked here unless `checked` says read_file did)."""
        self._begin()
        if not checked:
            table = self._checks.check(name, table)
        table = conform(name, table, self.run_id)
        self._rows[name] = self._rows.get(name, 0) + table.num_rows
        lo, hi = _span([table])
        was = self._spans.get(name, (None, None))
        self._spans[name] = _span_union(was, (lo, hi))
        self.nbytes += table.nbytes
        if table.num_rows:
            try:
                insert(self.con, name, table)
            except duckdb.Error as e:  # the store's fault, not the trace's: a reader must not blame the file
                raise StoreError(f"could not store table {name}: {one_line_error(e)}") from None

    def discard(self, name: str) -> None:
        if self.run_id is None:
            return
        self.con.execute(f"DELETE FROM {schema.BY_NAME[name].name} WHERE run_id = ?", [self.run_id])
        self._checks.forget(name)
        self._rows.pop(name, None)
        self._spans.pop(name, None)

    def finish(self, trace: ParsedTrace, source: Path, content_hash: str, file_size_bytes: int,
               *, findings: RuleResults | None = None) -> IngestResult:
        """Write `trace.tables` (already checked), the run's row and any `findings`, and commit."""
        self._begin()
        trace.warnings.extend(self._checks.warnings())
        for name, tbl in trace.tables.items():
            self.add(name, tbl, checked=True)
        start, end = None, None
        for span in self._spans.values():
            start, end = _span_union((start, end), span)
        insert(self.con, "runs", _run_row(trace, self.run_id, source, content_hash, file_size_bytes, start, end))
        if findings is not None:
            # the run's rows were all deleted by _begin, or there were none
            replace_findings(self.con, self.run_id, findings, run_is_new=True)
        self.con.execute("COMMIT")
        self._open = False
        counts = {name: self._rows.get(name, 0) for name in schema.DATA_TABLES}
        span = None if start is None else end - start
        return IngestResult(source, self.run_id, trace.format, counts, span, list(trace.warnings), self.replaced,
                            content_hash=content_hash)

    def abort(self) -> None:
        """Roll back whatever was written (nothing of the run stays, an earlier copy included)."""
        if self._open:
            self._open = False
            self.con.execute("ROLLBACK")


def one_line_error(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def _span_union(a: tuple[int | None, int | None], b: tuple[int | None, int | None]) -> tuple[int | None, int | None]:
    if a[0] is None:
        return b
    if b[0] is None:
        return a
    return min(a[0], b[0]), max(a[1], b[1])


def delete_rows(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Every row of `run_id`, and the cache kept from them (in the caller's transaction)."""
    for t in schema.TABLES:
        con.execute(f"DELETE FROM {t.name} WHERE run_id = ?", [run_id])
    run_cache.drop_kept(con, run_id)


@dataclass
class RuleResults:
    """What some rules found on one run: `findings` and `rule_runs` rows without run_id."""

    rule_ids: list[str]  # the rules evaluated: their earlier findings and outcomes are replaced
    findings: pa.Table
    rule_runs: pa.Table


def replace_findings(con: duckdb.DuckDBPyConnection, run_id: str, results: RuleResults, *,
                      run_is_new: bool = False) -> None:
    """Replace the findings and outcomes of `results.rule_ids` on `run_id` (in the caller's
    transaction). `run_is_new`: the run has no rows yet (nothing to delete)."""
    findings = results.findings
    if "run_id" in findings.column_names:
        findings = findings.drop_columns(["run_id"])
    findings = conform("findings", findings, run_id)
    rule_runs = conform("rule_runs", results.rule_runs, run_id)
    if not run_is_new:
        for name in ("findings", "rule_runs"):
            con.execute(f"DELETE FROM {name} WHERE run_id = ? AND list_contains(?, rule_id)",
                        [run_id, results.rule_ids])
    if findings.num_rows:
        insert(con, "findings", findings)
    insert(con, "rule_runs", rule_runs)


_RUN_ID_KEY = b"traceanalyzer.run_id"


def conform(name: str, tbl: pa.Table, run_id: str) -> pa.Table:
    """A reader's table with the schema's types, in the schema's column order.

    Nothing is built per row that the insert can say once: `run_id` travels in the
    schema metadata and becomes a constant of the INSERT, and absent columns are left to
    their NULL default. Dictionary-encoded strings stay encoded (DuckDB reads them as
    VARCHAR without expanding them first)."""
    table = schema.BY_NAME.get(name)
    if table is None:
        raise ValueError(f"reader produced unknown table {name!r}")
    if name == "kernels" and "library" not in tbl.column_names and "name" in tbl.column_names:
        # told here, once per distinct name, so every reader's kernels get it the same way
        mangled = tbl.column("mangled_name") if "mangled_name" in tbl.column_names else None
        tbl = tbl.append_column("library", kernel_library.classify_arrow(tbl.column("name"), mangled))
    unknown = set(tbl.column_names) - set(table.column_names)
    if unknown:
        raise ValueError(f"reader produced unknown columns in {name}: {sorted(unknown)}")
    arrays, names = [], []
    for col in table.columns:
        if col.name == "run_id" or col.name not in tbl.column_names:
            continue
        typ = schema.arrow_type(col.type)
        data = tbl.column(col.name)
        if data.type != typ and not (pa.types.is_string(typ) and _is_string_dictionary(data.type)):
            data = data.cast(typ)
        arrays.append(data)
        names.append(col.name)
    out = pa.Table.from_arrays(arrays, names=names) if names else pa.table({}).slice(0, 0)
    if not names and tbl.num_rows:  # rows without any known column: keep their count
        out = pa.table({"_rows": pa.nulls(tbl.num_rows)})
    return out.replace_schema_metadata({_RUN_ID_KEY: run_id.encode()})


def _is_string_dictionary(typ: pa.DataType) -> bool:
    return pa.types.is_dictionary(typ) and (pa.types.is_string(typ.value_type) or pa.types.is_large_string(typ.value_type))


def _span(tables: Iterable[pa.Table]) -> tuple[int | None, int | None]:
    lo = hi = None
    for tbl in tables:
        for c in _TIME_COLUMNS:
            if c in tbl.column_names and tbl.num_rows:
                mm = pc.min_max(tbl.column(c))
                a, b = mm["min"].as_py(), mm["max"].as_py()
                if a is not None:
                    lo = a if lo is None else min(lo, a)
                    hi = b if hi is None else max(hi, b)
    return lo, hi


def _run_row(trace: ParsedTrace, run_id: str, source: Path, content_hash: str,
             size: int, start: int | None, end: int | None) -> pa.Table:
    row = {
        "run_id": run_id, "source_path": str(source), "file_name": source.name,
        "format": trace.format, "content_hash": content_hash, "file_size_bytes": size,
        "producer": trace.producer, "producer_version": trace.producer_version,
        "schema_version": trace.schema_version, "host": trace.host,
        "start_ns": start, "end_ns": end, "span_ns": None if start is None else end - start,
        "clock": trace.clock, "rank": trace.rank, "world_size": trace.world_size,
        "warnings": list(trace.warnings),
        "metadata": json.dumps(trace.metadata, default=str, sort_keys=True),
        "ingested_at": utcnow(),
    }
    return pa.Table.from_pylist([row], schema=schema.arrow_schema("runs"))


def utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def insert(con: duckdb.DuckDBPyConnection, name: str, tbl: pa.Table) -> None:
    """INSERT `tbl`'s columns by name; run_id from the table's metadata (see `conform`)
    when it is not a column; the schema's other columns get NULL."""
    meta = tbl.schema.metadata or {}
    cols = [c for c in tbl.column_names if c != "_rows"]
    select = [f'"{c}"' for c in cols]
    params: list = []
    if "run_id" not in cols and _RUN_ID_KEY in meta:
        cols, select, params = ["run_id", *cols], ["CAST(? AS VARCHAR)", *select], [meta[_RUN_ID_KEY].decode()]
    # Handed over as a stream of batches, each let go once read: DuckDB keeps what it was
    # given alive until the transaction ends, and a run writer's transaction spans all of
    # a big run's tables (a registered Table would stay in memory, whole, until COMMIT).
    con.register("_ta_incoming", pa.RecordBatchReader.from_batches(tbl.schema, _handed_over(tbl)))
    del tbl
    try:
        con.execute(f"INSERT INTO {name} ({', '.join(cols)}) SELECT {', '.join(select)} FROM _ta_incoming", params)
    except BaseException:
        # The transaction is aborted now: anything more run on it fails with "Current
        # transaction is aborted", which would hide this error.
        with contextlib.suppress(duckdb.Error):
            con.unregister("_ta_incoming")
        raise
    con.unregister("_ta_incoming")


def _handed_over(tbl: pa.Table) -> Iterable[pa.RecordBatch]:
    batches = tbl.to_batches()
    del tbl
    batches.reverse()
    while batches:
        yield batches.pop()
