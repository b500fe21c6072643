"""Read-only access to an Nsight Systems SQLite export, fetched into Arrow in batches.

The file is opened through a `file:...?mode=ro&immutable=1` URI: SQLite never writes it,
takes no locks and leaves no journal; `immutable` is safe because an export is finished.
Bulk queries go through the ADBC SQLite driver (`fetch_arrow_table`): on 1M kernel rows
`bench/bench_sqlite_read.py` measured it about 4x faster than `sqlite3` + `fetchmany`
(1.1 s against 4.5 s). The `sqlite3` path is the fallback when ADBC is not importable or
fails on a query. `submit` runs ADBC fetches on a small pool of threads, each with its own
connection (the driver releases the GIL): the reader fetches the next table while it
works on the last one; fallbacks and checks still run in the calling thread. A big table
may be fetched in parts, a rowid range per fetch thread, at once (`split_rows`). `stream` reads a table in
batches on a thread and connection of its own, a few batches ahead of its reader, for the
tables the nsys reader builds part by part. With one read CPU (`Resources.read_cpus` of 1:
scan's `--jobs 1`, or a worker of a scan that shares the cores) there are no such threads:
every fetch and batch is read in the calling thread when it is asked for.

ADBC infers a column's Arrow type from the first rows it sees and fails when a later
value has another type, so string expressions are wrapped in `COALESCE(expr, '')`
(never NULL, always text) and the empty strings are turned back into NULL afterwards.
"""

from __future__ import annotations

import queue
import re
import sqlite3
import threading
import urllib.parse
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .. import input_limits
from .. import schema as store_schema
from ..resources import Resources, usable_cpus
from .base import TraceError

try:  # optional: faster bulk reads
    import adbc_driver_manager
    import adbc_driver_sqlite.dbapi as adbc_sqlite
except ImportError:  # pragma: no cover - exercised only where ADBC is absent
    adbc_sqlite = None

SQLITE_MAGIC = b"SQLite format 3\x00"
# Table names after FROM / JOIN in the reader's own queries (quoted or bare).
_FROM = re.compile(r'\b(?:FROM|JOIN)\s+("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_]*)', re.IGNORECASE)
FETCH_BATCH_ROWS = 65536
BACKENDS = ("adbc", "sqlite3")
# Threads (and ADBC connections) fetching at once: two already use both cores of a laptop.
MAX_FETCH_THREADS = 3


def fetch_threads(resources: Resources) -> int:
    """Threads a file's fetches may run on: `resources.read_cpus` and the usable CPUs, at most
    MAX_FETCH_THREADS. One means no fetch thread at all (see the module docstring)."""
    return max(1, min(MAX_FETCH_THREADS, usable_cpus(), resources.read_cpus))

_ADBC_ERRORS: tuple[type[BaseException], ...] = (OSError, pa.ArrowException)
if adbc_sqlite is not None:
    _ADBC_ERRORS += (adbc_driver_manager.Error,)


@dataclass(frozen=True)
class Col:
    """One selected expression: output name, SQL over the source table, Arrow type."""

    alias: str
    expr: str
    type: pa.DataType


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def check_header(path: Path) -> None:
    """Reject files that are not SQLite, or whose header says they were cut short."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        raise TraceError(f"cannot open file ({one_line(e.strerror or e)})") from None
    if not head.startswith(SQLITE_MAGIC):
        raise TraceError("not an SQLite file (no 'SQLite format 3' header)")
    if len(head) < 100:
        raise TraceError(f"truncated SQLite file ({size} bytes, shorter than the 100-byte header)")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    page_count = int.from_bytes(head[28:32], "big")
    change_counter, valid_for = head[24:28], head[92:96]
    # The in-header page count is only trustworthy when written by the same change.
    if change_counter == valid_for and page_count and page_size * page_count > size:
        raise TraceError(
            f"truncated SQLite file: its header declares {page_size * page_count} bytes "
            f"({page_count} pages of {page_size}) but the file has {size}")


def _uri(path: Path) -> str:
    return "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro&immutable=1"


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


class NsysFile:
    """An open export: which tables and columns it has, and Arrow fetches over them, on
    `fetch_threads(resources)` threads (default resources: `Resources.available()`)."""

    def __init__(self, path: Path, backend: str | None = None, resources: Resources | None = None):
        if backend not in (None, *BACKENDS):
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        check_header(path)
        self.path = path
        self.uri = _uri(path)
        self.fallbacks = 0  # ADBC queries that had to be re-run through sqlite3
        self.utf8_repaired: set[str] = set()
        self.size = path.stat().st_size
        self._row_counts: dict[str, int] = {}
        self._con = None
        try:
            self._con = sqlite3.connect(self.uri, uri=True)
            # Ordinary tables only: a view or virtual table is SQL (or a module) chosen by
            # whoever wrote the file, and could run for ever; nsys exports have neither.
            names = [r[0] for r in self._con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND upper(ltrim(sql)) NOT LIKE 'CREATE VIRTUAL%' ORDER BY name")]
            self.tables: dict[str, list[str]] = {
                n: [r[1] for r in self._con.execute(f"PRAGMA table_info({quote(n)})")] for n in names}
        except sqlite3.Error as e:
            if self._con is not None:
                self._con.close()
            raise TraceError(f"unreadable SQLite file ({one_line(e)})") from None
        want_adbc = backend in (None, "adbc") and adbc_sqlite is not None
        if backend == "adbc" and adbc_sqlite is None:
            raise ValueError("backend 'adbc' requested but adbc_driver_sqlite is not importable")
        self._adbc = None
        if want_adbc:
            try:
                self._adbc = adbc_sqlite.connect(self.uri)
            except _ADBC_ERRORS:
                self.fallbacks += 1
        self.backend = "adbc" if self._adbc is not None else "sqlite3"
        self.threads = fetch_threads(resources or Resources.available())
        self._pool: ThreadPoolExecutor | None = None  # made by the first submit()
        self._idle: queue.SimpleQueue = queue.SimpleQueue()  # ADBC connections free for a fetch
        self._extra: list = []  # the pool's connections beyond self._adbc
        self._streams: list[Stream] = []

    # -- structure -------------------------------------------------------------------
    def has(self, table: str, column: str | None = None) -> bool:
        cols = self.tables.get(table)
        return cols is not None and (column is None or column in cols)

    def column(self, table: str, column: str, alias: str = "") -> str:
        """`alias.column` when the table has it, else SQL NULL: select by name, never assume."""
        if not self.has(table, column):
            return "NULL"
        return f"{alias}.{quote(column)}" if alias else quote(column)

    # -- small queries (metadata, enums, device tables) ------------------------------
    def rows(self, sql: str, params: Sequence = ()) -> list[tuple]:
        if not sql.lstrip().upper().startswith("SELECT COUNT(*) FROM (SELECT 1 FROM"):
            self._guard(sql)
        try:
            return self._con.execute(sql, params).fetchall()
        except sqlite3.OperationalError as e:
            if "decode" not in str(e).lower():
                raise
            self._con.text_factory = _lenient_text  # a non-UTF-8 string somewhere: replace it
            try:
                return self._con.execute(sql, params).fetchall()
            finally:
                self._con.text_factory = str

    def count(self, table: str, where: str = "") -> int:
        if not self.has(table):
            return 0
        total = self.checked_rows(table)
        if not where:
            return total
        return self.rows(f"SELECT COUNT(*) FROM {quote(table)} WHERE {where}")[0][0]

    def checked_rows(self, table: str) -> int:
        """Rows of `table`, counted at most up to what the file can hold and MAX_ROWS allow.

        COUNT(*) believes the b-tree: one whose pages point at the same child over and over
        makes a few KB "hold" 10^11 rows (and a full read never end). Counting through a
        LIMIT stops after the cap whatever the tree claims."""
        if table not in self._row_counts:
            physical = self.size // input_limits.SQLITE_MIN_ROW_BYTES + 16
            cap = min(input_limits.get("MAX_ROWS"), physical)
            n = self.rows(f"SELECT count(*) FROM (SELECT 1 FROM {quote(table)} LIMIT {cap + 1})")[0][0]
            if n > physical:
                raise TraceError(f"table {table} holds more rows than a file of {self.size:,} bytes can "
                                 "(corrupt b-tree that reuses its pages)")
            if n > cap:
                raise input_limits.over("MAX_ROWS", f"table {table}: more than {cap:,} rows")
            self._row_counts[table] = n
        return self._row_counts[table]

    def _guard(self, sql: str) -> None:
        """Count (bounded) every table a query reads before it runs."""
        for name in _FROM.findall(sql):
            name = name[1:-1].replace('""', '"') if name.startswith('"') else name
            if name in self.tables:
                self.checked_rows(name)

    # -- bulk queries ------------------------------------------------------------------
    def arrow(self, cols: Sequence[Col], from_sql: str, where: str = "", label: str = "") -> pa.Table:
        """`SELECT cols FROM from_sql [WHERE where]` as an Arrow table typed as `cols` say.

        `label` names the source in warnings (e.g. when invalid UTF-8 had to be replaced)."""
        label = label or from_sql.split()[0].strip('"')
        self._guard(f"FROM {from_sql}")
        schema = pa.schema([(c.alias, c.type) for c in cols])
        if self._adbc is not None:
            try:
                table = self._fetch_adbc(_select_sql(cols, from_sql, where, cast_ints=False))
                return self._conform(table, schema, label)
            except _ADBC_ERRORS:
                # A column whose values do not all have the declared type (SQLite does not
                # enforce types), whether ADBC failed on it or inferred another type.
                self.fallbacks += 1
        # Here values of an odd type are converted (REAL -> INTEGER) or NULLed (text in a number column).
        table = self._fetch_sqlite3(_select_sql(cols, from_sql, where, cast_ints=True), schema, label)
        return self._conform(table, schema, label)

    def submit(self, cols: Sequence[Col], from_sql: str, where: str = "", label: str = "",
               split_rows: int = 0) -> "Pending":
        """`arrow(...)` started now on a fetch thread; `.result()` gives the same table.

        A table (`from_sql` its quoted name) of more than `split_rows` rows is read in parts,
        one range of its rowids per fetch thread (`_parts`): SQLite decodes rows on one core
        per connection. The bounded row count (the guard) runs here, before any thread reads."""
        label = label or from_sql.split()[0].strip('"')
        self._guard(f"FROM {from_sql}")
        futures: list = []
        if self._adbc is not None:
            for part in self._parts(from_sql, where, split_rows):
                sql = _select_sql(cols, from_sql, part, cast_ints=False)
                if self.threads < 2:
                    futures.append(_Later(self._fetch_adbc, sql))
                    continue
                if self._pool is None:
                    self._start_pool()
                futures.append(self._pool.submit(self._fetch_pooled, sql))
        return Pending(self, futures, cols, from_sql, where, label)

    def _parts(self, from_sql: str, where: str, split_rows: int) -> list[str]:
        """`where` as one condition per part, in rowid order: one part per fetch thread, of
        equal rowid ranges (an export's rowids are dense), where the table has more than
        `split_rows` rows; else the one condition."""
        name = from_sql[1:-1].replace('""', '"') if from_sql.startswith('"') else from_sql
        n = self.threads
        if not split_rows or n < 2 or name not in self.tables or self.checked_rows(name) <= split_rows:
            return [where]
        low, high = self.rows(f"SELECT min(rowid), max(rowid) FROM {from_sql}")[0]
        if low is None or high - low < n:
            return [where]
        cuts = [low - 1, *(low + (high - low) * k // n for k in range(1, n)), high]
        both = f"({where}) AND " if where else ""
        return [f"{both}rowid > {a} AND rowid <= {b}" for a, b in zip(cuts, cuts[1:])]

    def stream(self, cols: Sequence[Col], from_sql: str, where: str = "", label: str = "",
               batches_ahead: int = 8) -> "Stream | None":
        """`arrow(...)` as batches of FETCH_BATCH_ROWS rows, read on a thread of its own at most
        `batches_ahead` batches ahead of the caller (so a big table is never whole in memory;
        with one read CPU, in the caller's thread as it asks for them). None without ADBC: the
        caller fetches the table whole instead."""
        if self._adbc is None:
            return None
        label = label or from_sql.split()[0].strip('"')
        self._guard(f"FROM {from_sql}")
        try:
            con = adbc_sqlite.connect(self.uri)
        except _ADBC_ERRORS:
            return None
        stream = Stream(self, con, _select_sql(cols, from_sql, where, cast_ints=False),
                        pa.schema([(c.alias, c.type) for c in cols]), label, batches_ahead if self.threads > 1 else 0)
        self._streams.append(stream)
        return stream

    def _start_pool(self) -> None:
        self._idle.put(self._adbc)
        for _ in range(self.threads - 1):
            try:
                con = adbc_sqlite.connect(self.uri)
            except _ADBC_ERRORS:
                break
            self._extra.append(con)
            self._idle.put(con)
        self._pool = ThreadPoolExecutor(1 + len(self._extra), thread_name_prefix="nsys-fetch")

    def _fetch_pooled(self, sql: str) -> pa.Table:
        con = self._idle.get()
        try:
            return self._fetch_adbc(sql, con)
        finally:
            self._idle.put(con)

    def _finish(self, futures: list[Future], cols: Sequence[Col], from_sql: str, where: str,
                label: str) -> pa.Table:
        schema = pa.schema([(c.alias, c.type) for c in cols])
        if futures:
            try:
                parts = [self._conform(f.result(), schema, label) for f in futures]
                return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            except _ADBC_ERRORS:
                self.fallbacks += 1  # as in arrow(): a value of another type somewhere
                wait([f for f in futures if isinstance(f, Future)])  # none still reading when sqlite3 starts
        table = self._fetch_sqlite3(_select_sql(cols, from_sql, where, cast_ints=True), schema, label)
        return self._conform(table, schema, label)

    def _fetch_adbc(self, sql: str, con=None) -> pa.Table:
        cur = (self._adbc if con is None else con).cursor()
        try:
            # Larger batches than the driver's 1024 rows: fewer chunks to stitch together later,
            # and column types inferred from more rows.
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(FETCH_BATCH_ROWS)})
            cur.execute(sql)
            return cur.fetch_arrow_table()
        finally:
            cur.close()

    def _fetch_sqlite3(self, sql: str, schema: pa.Schema, label: str) -> pa.Table:
        def batches(text_factory):
            self._con.text_factory = text_factory
            try:
                cur = self._con.execute(sql)
                while rows := cur.fetchmany(FETCH_BATCH_ROWS):
                    columns = list(zip(*rows))
                    yield pa.record_batch(
                        [pa.array(col, type=f.type) for col, f in zip(columns, schema)], schema=schema)
            finally:
                self._con.text_factory = str

        try:
            return pa.Table.from_batches(list(batches(str)), schema=schema)
        except sqlite3.OperationalError as e:
            if "decode" not in str(e).lower():
                raise
            self.utf8_repaired.add(label)
            return pa.Table.from_batches(list(batches(_lenient_text)), schema=schema)

    def _conform(self, table: pa.Table, schema: pa.Schema, label: str) -> pa.Table:
        arrays = []
        for field, col in zip(schema, table.columns):
            if col.type != field.type:
                col = col.cast(field.type)
            if pa.types.is_string(field.type):
                col = _valid_utf8(col, self.utf8_repaired, label)
                col = pc.if_else(pc.equal(col, ""), pa.scalar(None, pa.string()), col)
            arrays.append(col)
        return pa.Table.from_arrays(arrays, schema=schema)

    def close(self) -> None:
        for stream in self._streams:
            stream.close()
        self._streams = []
        if self._pool is not None:  # let fetches in flight end before their connections close
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for con in [self._adbc, *self._extra]:
            if con is not None:
                con.close()
        self._adbc, self._extra = None, []
        self._con.close()

    def __enter__(self) -> "NsysFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Later:
    """A fetch run when its result is asked for, in the asking thread (one read CPU: no pool)."""

    def __init__(self, fetch, sql: str):
        self._fetch, self._sql = fetch, sql

    def result(self) -> pa.Table:
        return self._fetch(self._sql)


class Pending:
    """A fetch started by `NsysFile.submit`."""

    def __init__(self, f: NsysFile, futures: list[Future], cols: Sequence[Col], from_sql: str, where: str,
                 label: str):
        self._f, self._args = f, (futures, cols, from_sql, where, label)

    def result(self) -> pa.Table:
        """The table, in the calling thread's hands: ADBC's result checked and typed, or the
        sqlite3 fallback run here (a sqlite3 connection stays in its own thread)."""
        args, self._args = self._args, None
        if args is None:
            raise RuntimeError("Pending.result() called twice")
        return self._f._finish(*args)


class StreamFailed(Exception):
    """A stream that could not be read to its end (a value of another type than the first
    batches', a read error): the caller reads the table whole instead."""


class Stream:
    """A table read in batches by `NsysFile.stream` with a connection of its own: on a thread
    of its own up to `batches_ahead` batches ahead of the caller, or (0) in the caller's
    thread as it asks for each batch."""

    _END = object()

    def __init__(self, f: NsysFile, con, sql: str, schema: pa.Schema, label: str, batches_ahead: int):
        self._f, self._con, self._schema, self._label = f, con, schema, label
        self._sql = sql
        self.rows = 0  # handed to the caller so far
        self._items: Iterator | None = None  # the caller's reading (no thread)
        self._thread: threading.Thread | None = None
        if batches_ahead > 0:
            self._queue: queue.Queue = queue.Queue(maxsize=batches_ahead)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._read, name="nsys-stream", daemon=True)
            self._thread.start()

    def _produce(self) -> Iterator:
        """The batches, then _END; or the exception that ended the read."""
        cur = None
        try:
            cur = self._con.cursor()
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(FETCH_BATCH_ROWS)})
            cur.execute(self._sql)
            yield from cur.fetch_record_batch()
            yield self._END
        except GeneratorExit:  # the reader stopped early
            raise
        except BaseException as e:  # handed to the caller, who reads the table whole instead
            yield e
        finally:
            if cur is not None:
                try:
                    cur.close()
                except _ADBC_ERRORS:
                    pass

    def _read(self) -> None:
        items = self._produce()
        try:
            for item in items:
                if not self._put(item):
                    return
        finally:
            items.close()  # the cursor, in this thread

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def batches(self) -> Iterator[pa.Table]:
        """The rows in file order, one table per batch, typed as the columns say (raises
        StreamFailed where the read fails)."""
        if self._thread is None:
            self._items = self._produce()
        while True:
            item = self._queue.get() if self._thread is not None else next(self._items)
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise StreamFailed(one_line(item)) from None
            try:
                table = self._f._conform(pa.Table.from_batches([item]), self._schema, self._label)
            except _ADBC_ERRORS as e:
                raise StreamFailed(one_line(e)) from None
            self.rows += table.num_rows
            yield table

    def close(self) -> None:
        """Stop reading (if not done) and close the connection."""
        if self._con is None:
            return
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                try:
                    self._queue.get(timeout=0.05)  # unblock a put
                except queue.Empty:
                    pass
            self._thread.join()
        elif self._items is not None:
            self._items.close()  # its cursor, before the connection
        self._con.close()
        self._con = None


def _select_sql(cols: Sequence[Col], from_sql: str, where: str, cast_ints: bool) -> str:
    def expr(c: Col) -> str:
        if pa.types.is_string(c.type):  # never NULL, for ADBC's type inference; '' -> NULL later
            return f"COALESCE(CAST({c.expr} AS TEXT), '')"
        if cast_ints and pa.types.is_integer(c.type):  # text or blob in a number column -> NULL
            return f"(CASE WHEN typeof({c.expr}) IN ('integer', 'real') THEN CAST({c.expr} AS INTEGER) END)"
        return c.expr

    exprs = ", ".join(f"{expr(c)} AS {quote(c.alias)}" for c in cols)
    return f"SELECT {exprs} FROM {from_sql}" + (f" WHERE {where}" if where else "")


def _valid_utf8(col: pa.ChunkedArray, repaired: set[str], name: str) -> pa.ChunkedArray:
    """ADBC hands SQLite text over unchecked; replace invalid UTF-8 rather than fail later."""
    try:
        col.validate(full=True)
        return col
    except pa.ArrowInvalid:
        repaired.add(name)
        values = col.cast(pa.binary()).to_pylist()  # rare broken files only
        return pa.chunked_array(
            [pa.array([None if v is None else v.decode("utf-8", "replace") for v in values], pa.string())])


def arrow_schema(table: str, columns: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow types of a store table's columns (all but run_id, or `columns`)."""
    return store_schema.arrow_schema(table, columns or [c for c in store_schema.BY_NAME[table].column_names
                                                        if c != "run_id"])


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
