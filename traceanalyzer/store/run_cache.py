"""A run's scope (`scoped_to_run`): the expensive views the rules share (`RUN_CACHED`) as
`this_run.<view>` (SCOPE), one run's rows under fixed names that the rules and the readers of one
run's numbers query. They are computed once per block from tables of the run's cache, built for
the block in the scope's in-memory database, or kept in the store file (a big run's kept cache,
`RunPolicy.keep_min_gpu_ops`); and results are kept beside a kept cache (`kept_rows`).

The store-wide views of the analysis library (`analyses.VIEWS`) are never redefined: the
scope's views are other views, in a database of their own, attached for the block."""

from __future__ import annotations

import functools
import hashlib
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import duckdb

from .. import analyses
from ..analyses import MACROS, TABLE_MACROS, VIEWS
from ..analyses.core import MIN_BIGINT
from ..analyses.launches import STREAM_OPS_CARRY, kernel_launches_sql, stream_ops_sql
from ..analyses.timeline import device_idle_gaps_sql, run_idle_gaps_sql
from ..analyses.warmup import warmup_windows_sql
from ..sql import sql_literal
from . import views
from .run_policy import DEFAULT_POLICY, RunPlan, RunPolicy

# The catalog a run's scope is attached under: its readers name its views `this_run.<view>`.
SCOPE = "this_run"

# The views the rules read that cost a sort of all GPU work each time, in dependency order
# (later ones are computed from the cached earlier ones). stream_ops is the per-stream order
# T001 and S002 both need; kernel_names hashes the long names once for it and S002.
# kernel_launches (S001) is a join of every kernel with its launch call rather than a sort.
# T002 alone reads kernel_busy_intervals, and T004 run_idle_gaps, but a big run keeps its
# cache (RunPolicy.keep_min_gpu_ops), and there work paid once is work no later pass pays.
RUN_CACHED = ("device_busy_intervals", "device_busy", "device_idle_gaps", "kernel_busy_intervals",
              "run_idle_gaps", "kernel_names", "stream_ops", "kernel_launches", "warmup_windows")

# How the cache computes each table: one run's rows ($1) without the run_id column, which the
# view over the table takes from the one-row `<prefix>scope` (a run id on every row would cost
# a string per row to sort and store). Each is made by the generator or macro text of the view's
# own query (the busy intervals: `device_islands`, `islands` per device; a view not listed here:
# its query filtered on the run), so a cached view and the store-wide one cannot disagree
# (tests/test_store.py compares them). The islands table also keeps each island's successors, so
# the idle gaps are the view's filter over it rather than another sort.
# `{cache}` is the prefix of the cached tables' names (see RunCache).
_RUN_CACHE_SQL = {
    "device_busy_intervals": "WITH run_activity AS (SELECT device_id, start_ns, end_ns FROM gpu_activity "
                             "WHERE run_id = $1) SELECT * FROM device_islands('run_activity')",
    "device_idle_gaps": device_idle_gaps_sql("SELECT * FROM {cache}device_busy_intervals", per_run=True),
    "kernel_busy_intervals": "WITH run_kernels AS (SELECT device_id, start_ns, end_ns FROM gpu_activity "
                             "WHERE run_id = $1 AND kind = 'kernel') "
                             "SELECT * EXCLUDE (next_start_ns, first_start_ns) FROM device_islands('run_kernels')",
    "run_idle_gaps": run_idle_gaps_sql(per_run=True),
    "stream_ops": stream_ops_sql(per_run=True, sliced=True),
    "kernel_launches": kernel_launches_sql(per_run=True, sliced=True),
    "warmup_windows": f"SELECT * EXCLUDE (run_id) FROM ({warmup_windows_sql('run_id = $1')})",
}
_RUN_CACHE_HIDDEN = {"device_busy_intervals": " EXCLUDE (next_start_ns, first_start_ns)"}
# Tables built in slices of start time (`RunPolicy.slice_gpu_ops`, where the memory this saves
# is measured), with the table that carries each slice's last rows into the next (or None).
_RUN_CACHE_SLICED = {"stream_ops": STREAM_OPS_CARRY, "kernel_launches": None}
# Not stored: views over the cached tables, a filter of the islands, cheaper to scan again
# than to hold (5 M kernels: 250 MB).
_RUN_CACHE_VIEWS = ("device_idle_gaps",)

# Kept caches are tables `_ta_kept_<run_id>_<view>` listed in this table with the version of
# the cache's definition they were built by and the run's `ingested_at`; a cache of another
# version or ingest is not read, and is built again (its old tables dropped) the next time the
# run's rules run on a writable store. The version covers the islands text the busy tables are made by.
KEPT_REGISTRY = "_ta_kept_cache"
CACHE_VERSION = hashlib.sha1(repr((RUN_CACHED, _RUN_CACHE_SQL, _RUN_CACHE_HIDDEN, _RUN_CACHE_VIEWS, _RUN_CACHE_SLICED,
                                   [VIEWS[n].sql for n in RUN_CACHED], TABLE_MACROS["device_islands"].sql)
                                  ).encode()).hexdigest()[:16]


_T = TypeVar("_T")


@dataclass
class RunCache:
    """A run's scope (`scoped_to_run`): the run, where the tables its views read are (`prefix`:
    `this_run._run_` in the scope's own database, or a kept cache's in the store file, `kept`;
    empty: none, the views filter the store-wide ones), whether this block has just built a kept
    cache (`built`: DuckDB holds all of it then), and the block's `memo` of other per-run results
    the rules share."""

    run_id: str
    prefix: str = ""
    built: bool = False
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False)
    _locks: dict[Any, threading.Lock] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def memo(self, key: Any, compute: Callable[[], _T]) -> _T:
        """`compute()`'s result for `key`, computed once in this block (for its run) whichever
        rule thread asks first; a thread asking meanwhile waits for it. A failed computation is
        not kept: the next caller tries again. Dropped at the end of the block."""
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._memo:
                self._memo[key] = compute()
            return self._memo[key]

    def forget(self) -> None:
        """Drop the memo (at the end of the block)."""
        with self._lock:
            self._memo.clear()
            self._locks.clear()

    @property
    def cached(self) -> bool:
        """Whether the views read tables of the run's cache, which every cursor of the database
        reads too (so its rules may run on several threads)."""
        return bool(self.prefix)

    @property
    def kept(self) -> bool:
        """Whether those tables are the run's kept cache in the store file."""
        return self.prefix == kept_prefix(self.run_id)


def memo_for(cache: RunCache | None, run_id: str, key: Any, compute: Callable[[], _T]) -> _T:
    """`compute()`, once per rules pass: kept in `cache`'s memo (a store's `run_cache`) when it is
    the scope of `run_id`, else computed at each call."""
    if cache is None or cache.run_id != run_id:
        return compute()
    return cache.memo(key, compute)


@contextmanager
def scoped_to_run(con: duckdb.DuckDBPyConnection, run_id: str, *, build: bool = True, keep: bool = False,
                  policy: RunPolicy = DEFAULT_POLICY) -> Iterator[RunCache]:
    """Within the block, `this_run.<view>` (SCOPE) for each view of RUN_CACHED: `run_id`'s rows of
    the store-wide view, with its columns, computed once.

    The rules of one run each read these views; materializing them first turns ~10
    recomputations (a window sort over every GPU operation each) into one. The views live in an
    in-memory database attached as SCOPE for the block, which every cursor of the database sees,
    and are defined once, when it opens: over the run's kept cache where it has a current one;
    else, with `build`, over tables built now, kept in the store when `keep` (a writable store)
    and `policy` says to keep the run's, else in the scope's database. Without a cache (`build`
    False: readers of a few numbers of one run, as summary and diff; or one that could not be
    built) they filter the store-wide views on the run: slower, same answers, and any error shows
    up in the readers. One scope is open at a time on a database. The RunCache yielded also holds
    the block's `memo` of other results the run's rules share."""
    views.install_on_demand(con)  # the cache's queries and the store-wide views read them
    try:
        con.execute(f"ATTACH ':memory:' AS {SCOPE} (READ_WRITE)")  # READ_WRITE: also on a read-only store
    except duckdb.BinderException:
        raise RuntimeError(f"a run's scope ({SCOPE}) is open on this database already") from None
    cache = RunCache(run_id)
    try:
        if kept_version(con, run_id) == CACHE_VERSION:
            cache.prefix = kept_prefix(run_id)
        elif build:
            plan = policy.plan(gpu_ops(con, run_id))
            if keep and plan.keep and _keep(con, run_id, plan):
                cache.prefix, cache.built = kept_prefix(run_id), True
            else:
                try:
                    _build(con, run_id, f"{SCOPE}._run_", plan)
                    cache.prefix = f"{SCOPE}._run_"
                except duckdb.Error:  # its tables so far go: the views filter the store-wide ones
                    con.execute(f"DETACH {SCOPE}")
                    con.execute(f"ATTACH ':memory:' AS {SCOPE} (READ_WRITE)")
        for name in RUN_CACHED:
            con.execute(f"CREATE VIEW {SCOPE}.{name} AS {_scoped_view(cache.prefix, run_id, name)}")
        yield cache
    finally:
        cache.forget()
        con.execute(f"DETACH {SCOPE}")


def _scoped_view(prefix: str, run_id: str, name: str) -> str:
    """The query of `this_run.<name>`: the run's table at `prefix` with its run_id, or without a
    prefix the store-wide view (the connection's TEMP one) filtered on the run, its id written in
    (a view takes no parameter)."""
    if not prefix:
        return f"SELECT * FROM temp.main.{name} WHERE run_id = {sql_literal(run_id)}"
    return f"SELECT r.run_id, t.*{_RUN_CACHE_HIDDEN.get(name, '')} FROM {prefix}scope r, {_cached_table(prefix, name)} t"


def _cached_table(prefix: str, name: str) -> str:
    """The cached rows of `name` at `prefix`, without run_id: its table, or for a view of the cache its query."""
    return f"({_RUN_CACHE_SQL[name].replace('{cache}', prefix)})" if name in _RUN_CACHE_VIEWS else f"{prefix}{name}"


def _build(con: duckdb.DuckDBPyConnection, run_id: str, prefix: str, plan: RunPlan) -> None:
    """Create the cache's tables at `prefix`, the windowed ones in `plan.slices` slices. Later
    tables are computed from the earlier ones: a query reads each cached view it reads as a CTE
    of that name over the table."""
    con.execute(f"CREATE OR REPLACE TABLE {prefix}scope AS SELECT $1::VARCHAR AS run_id", [run_id])
    slices = None
    for name in RUN_CACHED:
        if name in _RUN_CACHE_VIEWS:
            continue
        sql = _RUN_CACHE_SQL.get(name, f"SELECT * EXCLUDE (run_id) FROM ({VIEWS[name].sql}) WHERE run_id = $1")
        reads = [r for r in VIEWS[name].reads if r in RUN_CACHED]
        if reads:
            sql = "WITH " + ", ".join(f"{r} AS NOT MATERIALIZED ({_scoped_view(prefix, run_id, r)})"
                                      for r in reads) + f" SELECT * FROM ({sql})"
        if name in _RUN_CACHE_SLICED:
            slices = slices or _slices(con, run_id, plan.slices)
            _build_in_slices(con, run_id, f"{prefix}{name}", name, sql, slices)
        else:
            con.execute(f"CREATE OR REPLACE TABLE {prefix}{name} AS {sql}", [run_id] if "$1" in sql else [])


def _slices(con: duckdb.DuckDBPyConnection, run_id: str, count: int) -> list[tuple[int, int | None]]:
    """`run_id`'s GPU operations cut by start time into about `count` slices of as many each, as
    (start, end) bounds for `analyses.launches._in_slice`: the first from the smallest BIGINT, the last open (None)."""
    bounds: list[int] = []
    if count > 1:  # approximate quantiles: slices need only be disjoint and in order, not equal
        (quantiles,) = con.execute("SELECT approx_quantile(start_ns, $2::FLOAT[]) FROM gpu_activity "
                                   "WHERE run_id = $1", [run_id, [i / count for i in range(1, count)]]).fetchone()
        bounds = sorted({b for b in quantiles or () if b is not None and b > MIN_BIGINT})
    edges = [MIN_BIGINT, *bounds, None]
    return list(zip(edges, edges[1:]))


def _build_in_slices(con: duckdb.DuckDBPyConnection, run_id: str, table: str, name: str, sql: str,
                     slices: list[tuple[int, int | None]]) -> None:
    """Create `table` from `sql`, the sliced query of `name`, one slice at a time; where the slices
    go on from each other, each from the last row per stream of the slices before it."""
    carry = _RUN_CACHE_SLICED[name]
    if carry:  # empty at first; its columns are the table's, so take them from the unsliced query
        con.execute(f"CREATE OR REPLACE TEMP TABLE {carry} AS SELECT * EXCLUDE (run_id) FROM ({VIEWS[name].sql}) LIMIT 0")
    try:
        for i, (start, end) in enumerate(slices):
            into = f"CREATE OR REPLACE TABLE {table} AS" if i == 0 else f"INSERT INTO {table}"
            con.execute(f"{into} {sql}", [run_id, start, end, end is None])
            if carry and end is not None:  # each stream's last row so far (zone maps keep the scan to this slice)
                con.execute(f"CREATE OR REPLACE TEMP TABLE {carry} AS SELECT unnest(max_by(c, c.seq)) "
                            f"FROM (SELECT * FROM {carry} UNION ALL SELECT * FROM {table} WHERE start_ns >= $1) c "
                            "GROUP BY c.device_id, c.stream_id", [start])
    finally:
        if carry:
            con.execute(f"DROP TABLE IF EXISTS {carry}")


def kept_prefix(run_id: str) -> str:
    if not run_id.isalnum():  # run ids are hex digits; anything else is not a table name
        raise ValueError(f"run id {run_id!r} cannot name a table")
    return f"_ta_kept_{run_id}_"


def kept_version(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    """The version of `run_id`'s kept cache; None when there is none, or when it was built
    from an earlier ingest of the run (a version of traceanalyzer that knew nothing of kept
    caches may have replaced the run without dropping them)."""
    if _registry_columns(con) != _REGISTRY_COLUMNS:  # none, or another layout: nothing is kept
        return None
    rows = con.execute(f"SELECT k.version, k.ingested_at IS NOT DISTINCT FROM r.ingested_at FROM {KEPT_REGISTRY} k "
                       "LEFT JOIN runs r USING (run_id) WHERE k.run_id = $1", [run_id]).fetchall()
    return rows[0][0] if rows and rows[0][1] else None


_REGISTRY_COLUMNS = ("run_id", "version", "ingested_at", "built_at")


def _registry_columns(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    return tuple(c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name = $1 ORDER BY column_index", [KEPT_REGISTRY]).fetchall())


def gpu_ops(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """`run_id`'s kernels, copies and memsets."""
    return con.execute("SELECT (SELECT count(*) FROM kernels WHERE run_id = $1) + (SELECT count(*) FROM copies "
                       "WHERE run_id = $1) + (SELECT count(*) FROM memsets WHERE run_id = $1)", [run_id]).fetchall()[0][0]


def _keep(con: duckdb.DuckDBPyConnection, run_id: str, plan: RunPlan) -> bool:
    """Build `run_id`'s cache into the store in one transaction, replacing any older one.
    False (and nothing written) when that fails."""
    try:
        con.execute("BEGIN TRANSACTION")
        drop_kept(con, run_id)
        if _registry_columns(con) not in ((), _REGISTRY_COLUMNS):  # an earlier layout: its rows are void
            con.execute(f"DROP TABLE {KEPT_REGISTRY}")
        con.execute(f"CREATE TABLE IF NOT EXISTS {KEPT_REGISTRY} (run_id VARCHAR, version VARCHAR, "
                    "ingested_at TIMESTAMP, built_at TIMESTAMP)")
        _build(con, run_id, kept_prefix(run_id), plan)
        con.execute(f"INSERT INTO {KEPT_REGISTRY} SELECT $1, $2, ingested_at, now()::TIMESTAMP FROM runs "
                    "WHERE run_id = $1", [run_id, CACHE_VERSION])
        con.execute("COMMIT")
        return True
    except duckdb.Error:
        con.execute("ROLLBACK")
        return False


def drop_kept(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Drop `run_id`'s kept cache, of any version (in the caller's transaction, if any)."""
    if not _registry_columns(con):
        return
    for table in _tables_named(con, kept_prefix(run_id)):
        con.execute(f'DROP TABLE "{table}"')
    con.execute(f"DELETE FROM {KEPT_REGISTRY} WHERE run_id = $1", [run_id])


def kept_rows(con: duckdb.DuckDBPyConnection, run_id: str, name: str, sql: str, params: dict | None = None,
              *, write: bool = False) -> list[dict]:
    """The rows of `sql`, a small result of one run (`params` its parameters), kept beside the
    run's kept cache (`RunPolicy.keep_min_gpu_ops`): read from the store when there; else computed and,
    with `write` (a writable store), stored there for the next pass (the launch sites and the
    time budget: work a check of a stored run would otherwise redo). Without a current kept
    cache, computed each time. The table's name carries a digest of the query and of every
    view's and macro's definition, so a result of another version is never read; replacing or
    dropping the run drops it with the cache."""
    return kept_result(con, run_id, name, sql, lambda: con.sql(sql, params=params), write=write)


def kept_result(con: duckdb.DuckDBPyConnection, run_id: str, name: str, key: str,
                compute: Callable[[], duckdb.DuckDBPyRelation], *, write: bool = False) -> list[dict]:
    """`kept_rows` of the relation `compute()` gives (`key`: the query or text that decides what
    it holds)."""
    if kept_version(con, run_id) != CACHE_VERSION:
        return relation_rows(compute())
    return kept_result_current(con, run_id, name, key, compute, write)


def kept_result_current(con: duckdb.DuckDBPyConnection, run_id: str, name: str, key: str,
                 compute: Callable[[], duckdb.DuckDBPyRelation], write: bool) -> list[dict]:
    """`kept_rows` of a run whose kept cache is current: the rows `compute` gives, kept under
    `name` and a digest of `key` (the query that computes them) and of this module's text (the
    macros and views the query reads are defined here)."""
    stem = f"{kept_prefix(run_id)}result_{name}_"
    table = stem + _result_digest(key + _module_digest())
    tables = _tables_named(con, stem)
    if table in tables:
        return query_rows(con, f'SELECT * FROM "{table}"')
    if write:
        try:
            for old in tables:  # of another version
                con.execute(f'DROP TABLE IF EXISTS "{old}"')
            compute().create(table)
            return query_rows(con, f'SELECT * FROM "{table}"')
        except duckdb.Error:  # a store another writer changed meanwhile: compute as without a cache
            pass
    return relation_rows(compute())


def relation_rows(rel: duckdb.DuckDBPyRelation) -> list[dict]:
    return [dict(zip(rel.columns, row)) for row in rel.fetchall()]


@functools.cache
def _module_digest() -> str:
    """A digest of the text of the analysis library and of this engine and its readers: what
    defines the macros and views a kept result's query reads, and how it is computed."""
    files = [*sorted(Path(analyses.__file__).parent.glob("*.py")), Path(__file__), Path(__file__).with_name("budget_rows.py")]
    return hashlib.sha1(b"".join(p.read_bytes() for p in files)).hexdigest()


def query_rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict | None = None) -> list[dict]:
    result = con.execute(sql, params) if params else con.execute(sql)
    names = [d[0] for d in result.description]
    return [dict(zip(names, row)) for row in result.fetchall()]


@functools.cache
def _result_digest(sql: str) -> str:
    return hashlib.sha1(repr((sql, VIEWS, MACROS, TABLE_MACROS)).encode()).hexdigest()[:16]


def _tables_named(con: duckdb.DuckDBPyConnection, prefix: str) -> list[str]:
    return [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                                      "AND schema_name = 'main' AND starts_with(table_name, $1)", [prefix]).fetchall()]
