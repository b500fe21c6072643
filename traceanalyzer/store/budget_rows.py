"""The time budget and the warm-up windows of some runs as rows (`time_budget_rows`,
`warmup_rows`): what the diagnosis and the reports read, from a big run's kept results where
it has them (`run_cache.kept_rows`), and a run of many operations' budget window by window."""

from __future__ import annotations

import functools

import duckdb
import pyarrow as pa

from ..analyses.core import MAX_BIGINT, MIN_BIGINT
from ..analyses.warmup import warmup_budget_sql
from . import run_cache, views
from .run_policy import DEFAULT_POLICY, RunPolicy

_BUDGET = "SELECT device_id, span_ns, category, cause, ns FROM run_time_budget($rid)"
_WINDOW_BUDGET = "SELECT device_id, category, cause, ns FROM run_window_time_budget($rid, $device_id, $lo_ns, $hi_ns)"


def time_budget_rows(con: duckdb.DuckDBPyConnection, run_ids: list[str], *, write: bool = False,
                     policy: RunPolicy = DEFAULT_POLICY) -> list[dict]:
    """`time_budget`'s rows of these runs (run_id, device_id, span_ns, category, cause, ns): a
    run with a kept cache's from its kept result (`kept_rows`), a run of more than
    `policy.budget_window_gpu_ops` operations computed in windows, the others' in one query."""
    views.install_on_demand(con)
    out, rest = [], []
    window = policy.budget_window_gpu_ops
    for run_id in run_ids:
        big = run_cache.gpu_ops(con, run_id) > window
        if big:
            compute = functools.partial(_budget_in_windows, con, run_id, window)
        else:
            compute = functools.partial(con.sql, _BUDGET, params={"rid": run_id})
        if run_cache.kept_version(con, run_id) == run_cache.CACHE_VERSION:
            out += [{"run_id": run_id, **r} for r in run_cache.kept_result_current(
                con, run_id, "time_budget", _WINDOW_BUDGET if big else _BUDGET, compute, write)]
        elif big:
            out += [{"run_id": run_id, **r} for r in run_cache.relation_rows(compute())]
        else:
            rest.append(run_id)
    if rest:
        out += run_cache.query_rows(con, "SELECT run_id, device_id, span_ns, category, cause, ns FROM runs_time_budget($rids::VARCHAR[])",
                     {"rids": rest})
    return out


_WARMUP_COLUMNS = "device_id, reason, name, start_ns, end_ns"
_WARMUP_ORDER = "device_id NULLS LAST, start_ns, reason, end_ns, name"
_WARMUP_WINDOWS = f"SELECT {_WARMUP_COLUMNS} FROM run_warmup_windows($rid) ORDER BY {_WARMUP_ORDER}"
_WARMUP_BUDGET = "SELECT device_id, category, cause, ns FROM run_warmup_budget($rid) ORDER BY ALL"


def warmup_rows(con: duckdb.DuckDBPyConnection, run_ids: list[str], *,
                write: bool = False) -> tuple[list[dict], list[dict]]:
    """The warm-up windows of these runs (`run_warmup_windows`: run_id, device_id, reason, name,
    start_ns, end_ns) and the time inside them by budget part (`run_warmup_budget`: run_id,
    device_id, category, cause, ns), the latter computed only for the runs that have windows.
    A run with a kept cache keeps both (`kept_result`): the diagnosis and every report read
    them, and on a big run each query takes seconds."""
    views.install_on_demand(con)
    windows: list[dict] = []
    parts: list[dict] = []
    for run_id in run_ids:
        if run_cache.kept_version(con, run_id) == run_cache.CACHE_VERSION:
            # the kept cache has the windows (RUN_CACHED): computing them again reads every
            # range, call and launch of the run (5 M kernels, 24 M ranges: ~7 s, 4.6 GB)
            table = f'"{run_cache.kept_prefix(run_id)}warmup_windows"'
            mine = run_cache.query_rows(con, f"SELECT {_WARMUP_COLUMNS} FROM {table} ORDER BY {_WARMUP_ORDER}")
            kept_windows = f"SELECT $rid AS run_id, device_id, start_ns, end_ns FROM {table}"
            sql = f"SELECT device_id, category, cause, ns FROM ({warmup_budget_sql('run_id = $rid', kept_windows)}) ORDER BY ALL"
            budget = functools.partial(run_cache.kept_result_current, con, run_id, "warmup_budget", sql,
                                       functools.partial(con.sql, sql, params={"rid": run_id}), write)
        else:
            mine = run_cache.query_rows(con, _WARMUP_WINDOWS, {"rid": run_id})
            budget = functools.partial(run_cache.query_rows, con, _WARMUP_BUDGET, {"rid": run_id})
        windows += [{"run_id": run_id, **r} for r in mine]
        if mine:
            parts += [{"run_id": run_id, **r} for r in budget()]
    return windows, parts


def _budget_in_windows(con: duckdb.DuckDBPyConnection, run_id: str, window: int) -> duckdb.DuckDBPyRelation:
    """`run_time_budget`'s rows of `run_id`, summed over windows of each device's time of
    about `window` operations, cut at starts of its operations (`quantile_disc`
    gives starts, not interpolations): the busy parts, and idle causes with time."""
    parts = []
    for device_id, n in con.execute("SELECT device_id, count(*) FROM gpu_activity WHERE run_id = $1 GROUP BY ALL "
                                    "ORDER BY ALL", [run_id]).fetchall():
        count, cuts = -(-n // window), []
        if count > 1:
            (cuts,) = con.execute("SELECT quantile_disc(start_ns, $q::DOUBLE[]) FROM gpu_activity WHERE run_id = $rid "
                                  "AND device_id IS NOT DISTINCT FROM $device_id",
                                  {"rid": run_id, "device_id": device_id, "q": [i / count for i in range(1, count)]}
                                  ).fetchall()[0]
        edges = [MIN_BIGINT, *sorted(set(cuts)), MAX_BIGINT]
        parts += [con.sql(_WINDOW_BUDGET, params={"rid": run_id, "device_id": device_id, "lo_ns": lo, "hi_ns": hi})
                  .to_arrow_table() for lo, hi in zip(edges, edges[1:])]
    if not parts:
        return con.sql(_BUDGET, params={"rid": run_id})  # no operation: the empty result, typed
    # A device's span is the sum of its parts (idle split by cause sums to idle).
    return con.from_arrow(pa.concat_tables(parts)).query("parts", """
        SELECT device_id, CAST(sum(sum(ns)) OVER (PARTITION BY device_id) AS BIGINT) AS span_ns, category, cause,
               CAST(sum(ns) AS BIGINT) AS ns
        FROM parts GROUP BY device_id, category, cause HAVING category <> 'idle' OR sum(ns) > 0""")
