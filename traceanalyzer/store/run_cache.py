"""The per-run cache of the analyses the rules share (`scoped_to_run`): the expensive views
(`RUN_CACHED`) materialised as tables of one run's rows, for the block of a rules pass on that
run, in a TEMP table, an attached in-memory database, or the store file (a big run's kept
cache, `RunPolicy.keep_min_gpu_ops`); and results kept beside a kept cache (`kept_rows`).

Within the block the views named in RUN_CACHED are redefined over those tables; outside it
they are the store-wide views of the analysis library again (`analyses.VIEWS`)."""

from __future__ import annotations

import functools
import hashlib
import itertools
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
from . import views
from .run_policy import DEFAULT_POLICY, RunPlan, RunPolicy


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
_cache_ids = itertools.count()

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
    """Where `scoped_to_run` keeps its tables (named `<prefix><view>`): `temp` (this
    connection's own), an in-memory database attached for the block, or the store file
    (`kept`); the last two are readable by every cursor of the same database
    (`use_run_cache`), so rules can run on several threads. Also the block's `memo` of
    other per-run results the rules share."""

    database: str
    cached: list[str] = field(default_factory=list)
    kept: bool = False
    prefix: str = ""
    built: bool = False  # kept tables this block has just written (DuckDB holds all of them then)
    run_id: str = ""
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
    def shared(self) -> bool:
        return self.database != "temp" and bool(self.cached)


@contextmanager
def scoped_to_run(con: duckdb.DuckDBPyConnection, run_id: str, shared: bool = False,
                  keep: bool = False, policy: RunPolicy = DEFAULT_POLICY) -> Iterator[RunCache]:
    """Within the block, the RUN_CACHED views hold only `run_id`'s rows, computed once.

    The rules of one run each filter these views on that run; materializing them first
    turns ~10 recomputations (a window sort over every GPU operation each) into one.
    Outside the block (reports, cross-run rules) the views are the store-wide ones again.
    If the cache cannot be built, the block runs on the store-wide views (slower, same
    answers), and any error shows up in the rules that read them.

    A cache kept in the store is used when its version is current; with `keep` (a writable
    store), the cache of a run `policy` says to keep is built into the store and kept.
    Otherwise it lives for the block: with `shared`, in an attached in-memory database
    (TEMP tables where that fails: a read-only store). The RunCache yielded also holds the
    block's `memo` of other results the run's rules share."""
    views.install_on_demand(con)  # the rules read them, and the cache points some at its tables
    if kept_version(con, run_id) == CACHE_VERSION:
        with _on_kept(con, run_id) as cache:
            yield cache
        return
    plan = policy.plan(gpu_ops(con, run_id))
    if keep and plan.keep and _keep(con, run_id, plan):
        with _on_kept(con, run_id) as cache:
            cache.built = True
            yield cache
        return
    cache = RunCache("temp", run_id=run_id)
    if shared:
        name = f"_ta_run_cache_{next(_cache_ids)}"
        try:
            con.execute(f"ATTACH ':memory:' AS {name}")
            cache.database = name
        except duckdb.Error:
            pass
    db = cache.database
    cache.prefix = f"{db}._run_"
    try:
        _build(con, run_id, cache, "TEMP " if db == "temp" else "", plan)  # DuckDB creates in temp only with TEMP
    except duckdb.Error:
        _restore(con, cache)
        cache.cached = []
    try:
        yield cache
    finally:
        cache.forget()
        _restore(con, cache)
        if db != "temp":
            con.execute(f"DETACH {db}")


@contextmanager
def kept_views(con: duckdb.DuckDBPyConnection, run_id: str) -> Iterator[bool]:
    """Within the block, the RUN_CACHED views read `run_id`'s kept cache when it has a current
    one (True); else they stay the store-wide views (False). Nothing is built: this is for
    readers of a few numbers of one run (summary, reports, diff), for whom a big run's
    `device_busy` would otherwise be a sort of every GPU operation (5 M kernels: ~1.9 s)."""
    if kept_version(con, run_id) != CACHE_VERSION:
        yield False
        return
    with _on_kept(con, run_id):
        yield True


@contextmanager
def _on_kept(con: duckdb.DuckDBPyConnection, run_id: str) -> Iterator[RunCache]:
    """The views pointed at `run_id`'s kept tables for the block (their version checked by the caller)."""
    cache = RunCache("main", list(RUN_CACHED), kept=True, prefix=kept_prefix(run_id), run_id=run_id)
    use_run_cache(con, cache)
    try:
        yield cache
    finally:
        cache.forget()
        _restore_views(con, cache)


def _build(con: duckdb.DuckDBPyConnection, run_id: str, cache: RunCache, temp: str, plan: RunPlan) -> None:
    """Create the cache's tables at `cache.prefix`, pointing each view at its table as soon
    as it is made (later tables are computed from the earlier ones); the windowed ones in
    `plan.slices` slices."""
    con.execute(f"CREATE OR REPLACE {temp}TABLE {cache.prefix}scope AS SELECT $1::VARCHAR AS run_id", [run_id])
    slices = None
    for name in RUN_CACHED:
        if name in _RUN_CACHE_SLICED:
            slices = slices or _slices(con, run_id, plan.slices)
            _build_in_slices(con, run_id, f"{cache.prefix}{name}", temp, name, slices)
        elif name not in _RUN_CACHE_VIEWS:
            sql = _RUN_CACHE_SQL.get(name, f"SELECT * EXCLUDE (run_id) FROM {name} WHERE run_id = $1")
            con.execute(f"CREATE OR REPLACE {temp}TABLE {cache.prefix}{name} AS {sql}",
                        [run_id] if "$1" in sql else [])
        _use(con, cache.prefix, name)
        cache.cached.append(name)


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


def _build_in_slices(con: duckdb.DuckDBPyConnection, run_id: str, table: str, temp: str, name: str,
                     slices: list[tuple[int, int | None]]) -> None:
    """Create `table` from the sliced query of `name`, one slice at a time; where the slices
    go on from each other, each from the last row per stream of the slices before it."""
    sql, carry = _RUN_CACHE_SQL[name], _RUN_CACHE_SLICED[name]
    if carry:  # empty at first; its columns are the table's, so take them from the unsliced query
        con.execute(f"CREATE OR REPLACE TEMP TABLE {carry} AS SELECT * EXCLUDE (run_id) FROM ({VIEWS[name].sql}) LIMIT 0")
    try:
        for i, (start, end) in enumerate(slices):
            into = f"CREATE OR REPLACE {temp}TABLE {table} AS" if i == 0 else f"INSERT INTO {table}"
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
    cache = RunCache("main", kept=True, prefix=kept_prefix(run_id), run_id=run_id)
    try:
        con.execute("BEGIN TRANSACTION")
        drop_kept(con, run_id)
        if _registry_columns(con) not in ((), _REGISTRY_COLUMNS):  # an earlier layout: its rows are void
            con.execute(f"DROP TABLE {KEPT_REGISTRY}")
        con.execute(f"CREATE TABLE IF NOT EXISTS {KEPT_REGISTRY} (run_id VARCHAR, version VARCHAR, "
                    "ingested_at TIMESTAMP, built_at TIMESTAMP)")
        _build(con, run_id, cache, "", plan)
        con.execute(f"INSERT INTO {KEPT_REGISTRY} SELECT $1, $2, ingested_at, now()::TIMESTAMP FROM runs "
                    "WHERE run_id = $1", [run_id, CACHE_VERSION])
        con.execute("COMMIT")
        return True
    except duckdb.Error:
        con.execute("ROLLBACK")
        return False
    finally:
        _restore_views(con, cache)


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


def use_run_cache(con: duckdb.DuckDBPyConnection, cache: RunCache) -> None:
    """Point another cursor's views (see `install`) at a shared RunCache."""
    views.install_on_demand(con)  # first: created later, a view would be the store-wide one again
    for name in cache.cached:
        _use(con, cache.prefix, name)


def _use(con: duckdb.DuckDBPyConnection, prefix: str, name: str) -> None:
    hidden = _RUN_CACHE_HIDDEN.get(name, "")
    table = (f"({_RUN_CACHE_SQL[name].replace('{cache}', prefix)})" if name in _RUN_CACHE_VIEWS
             else f"{prefix}{name}")
    con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT r.run_id, t.*{hidden} "
                f"FROM {prefix}scope r, {table} t")


def _restore_views(con: duckdb.DuckDBPyConnection, cache: RunCache) -> None:
    for name in reversed(cache.cached):
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {VIEWS[name].sql}")


def _restore(con: duckdb.DuckDBPyConnection, cache: RunCache) -> None:
    _restore_views(con, cache)
    for name in reversed(cache.cached):  # views first: they read the tables
        if name not in _RUN_CACHE_VIEWS:
            con.execute(f"DROP TABLE IF EXISTS {cache.prefix}{name}")
    con.execute(f"DROP TABLE IF EXISTS {cache.prefix}scope")
