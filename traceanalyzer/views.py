"""Named, documented analyses over the store, installed as TEMP views on each connection.

Rules and reports build on these instead of re-deriving them; a user can query them
too (`traceanalyzer query "SELECT * FROM device_busy"`). TEMP views live in the
connection, not the file, so a store written by an older version gets the current ones.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import duckdb


def _islands(source: str) -> str:
    """Merge overlapping intervals of `source` per run and device into disjoint ones.

    An island starts at each interval that begins after every earlier one has ended, and
    ends where the next island starts minus the gap, i.e. at the latest end seen before
    that start (or the latest end of all, for the last island): two window passes, the
    second over island starts only, and no GROUP BY. `busy_before_ns` is the busy time
    before each island (a running total, so busy time in any window is a difference)."""
    return f"""
        WITH ordered AS (
            SELECT run_id, device_id, start_ns,
                   max(end_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max_end,
                   max(end_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS last_end
            FROM ({source})
            WINDOW w AS (PARTITION BY run_id, device_id ORDER BY start_ns, end_ns)
        )
        -- An earlier island ends at the next one's prev_max_end, so the busy time before an
        -- island (sum of earlier ends minus earlier starts) comes out of the same window pass.
        SELECT run_id, device_id, row_number() OVER w AS island, start_ns,
               coalesce(lead(prev_max_end) OVER w, last_end) AS end_ns,
               CAST(coalesce(sum(prev_max_end) OVER (w ROWS UNBOUNDED PRECEDING), 0)
                    - coalesce(sum(start_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                    AS BIGINT) AS busy_before_ns
        FROM ordered WHERE prev_max_end IS NULL OR start_ns > prev_max_end
        WINDOW w AS (PARTITION BY run_id, device_id ORDER BY start_ns)
        """


VIEWS: dict[str, tuple[str, str]] = {
    "gpu_activity": (
        "Every timed GPU operation (kernel, copy, memset) as one interval table, with the "
        "row id of its source table in `item_id`.",
        """
        SELECT run_id, device_id, stream_id, 'kernel' AS kind, kernel_id AS item_id,
               start_ns, end_ns, name, pid, correlation_id, launch_call_id
        FROM kernels WHERE start_ns IS NOT NULL AND end_ns >= start_ns
        UNION ALL
        SELECT run_id, device_id, stream_id, 'copy', copy_id, start_ns, end_ns,
               'Memcpy ' || direction || CASE WHEN unified_memory THEN ' (unified)' ELSE '' END,
               pid, correlation_id, launch_call_id
        FROM copies WHERE start_ns IS NOT NULL AND end_ns >= start_ns
        UNION ALL
        SELECT run_id, device_id, stream_id, 'memset', memset_id, start_ns, end_ns, 'Memset',
               pid, correlation_id, NULL
        FROM memsets WHERE start_ns IS NOT NULL AND end_ns >= start_ns
        """,
    ),
    "device_busy_intervals": (
        "Per run and device, the union of all GPU activity as disjoint busy intervals "
        "(gaps-and-islands over `gpu_activity`), with `busy_before_ns`, the busy time before each "
        "(busy time in any window = a difference of two such running totals, read by ASOF joins).",
        _islands("SELECT run_id, device_id, start_ns, end_ns FROM gpu_activity"),
    ),
    "kernel_busy_intervals": (
        "Per run and device, the union of kernel execution only (what copies can hide behind), "
        "with `busy_before_ns` as in `device_busy_intervals`.",
        _islands("SELECT run_id, device_id, start_ns, end_ns FROM gpu_activity WHERE kind = 'kernel'"),
    ),
    "device_busy": (
        "Per run and device: busy time (union of GPU activity), the device's active span "
        "(first to last GPU operation) and the busy share of that span.",
        """
        SELECT run_id, device_id,
               sum(end_ns - start_ns) AS busy_ns,
               min(start_ns) AS first_start_ns, max(end_ns) AS last_end_ns,
               max(end_ns) - min(start_ns) AS active_span_ns,
               sum(end_ns - start_ns) / nullif(max(end_ns) - min(start_ns), 0) AS busy_share
        FROM device_busy_intervals GROUP BY run_id, device_id
        """,
    ),
    "device_idle_gaps": (
        "Per run and device, the idle stretches between busy intervals (no work on any stream), "
        "with `idle_before_ns`, the idle time before each (from the device's first operation).",
        """
        SELECT run_id, device_id, end_ns AS start_ns, next_start AS end_ns, next_start - end_ns AS gap_ns,
               -- idle time before = time since the first start, minus busy time, up to this gap
               end_ns - first_start - (busy_before_ns + end_ns - start_ns) AS idle_before_ns
        FROM (SELECT run_id, device_id, start_ns, end_ns, busy_before_ns,
                     lead(start_ns) OVER w AS next_start, first_value(start_ns) OVER w AS first_start
              FROM device_busy_intervals
              WINDOW w AS (PARTITION BY run_id, device_id ORDER BY start_ns))
        WHERE next_start IS NOT NULL
        """,
    ),
    "steps": (
        "Per run, the iteration ranges: Kineto `ProfilerStep#N` when the run has them, else NVTX "
        "or user annotations named like a step or iteration (`step`, `iter`, `iteration` as a word).",
        """
        SELECT run_id, range_id, name, start_ns, end_ns FROM ranges r
        WHERE kind IN ('user_annotation', 'nvtx') AND end_ns > start_ns
          AND (name LIKE 'ProfilerStep#%'
               OR (regexp_matches(name, '(?i)(^|[^a-z])(step|iteration|iter)([^a-z]|$)')
                   AND NOT EXISTS (SELECT 1 FROM ranges p WHERE p.run_id = r.run_id
                                   AND p.name LIKE 'ProfilerStep#%')))
        """,
    ),
}

# Small formatting helpers so a rule's SQL can write its own one-line message.
MACROS: dict[str, str] = {
    "fmt_ns": """(x) AS CASE WHEN x IS NULL THEN '-'
        WHEN abs(x) >= 1e9 THEN printf('%.3g s', x / 1e9)
        WHEN abs(x) >= 1e6 THEN printf('%.3g ms', x / 1e6)
        WHEN abs(x) >= 1e3 THEN printf('%.3g us', x / 1e3)
        ELSE printf('%d ns', CAST(round(x) AS BIGINT)) END""",
    "fmt_bytes": """(x) AS CASE WHEN x IS NULL THEN '-'
        WHEN abs(x) >= 1e9 THEN printf('%.3g GB', x / 1e9)
        WHEN abs(x) >= 1e6 THEN printf('%.3g MB', x / 1e6)
        WHEN abs(x) >= 1e3 THEN printf('%.3g KB', x / 1e3)
        ELSE printf('%d B', CAST(x AS BIGINT)) END""",
    "fmt_pct": "(x) AS CASE WHEN x IS NULL THEN '-' ELSE printf('%.1f%%', 100 * x) END",
}


# DuckDB picks a nested-loop plan for an ASOF join, and a piecewise merge join for a range
# join, when it *estimates* a side small; its estimates for the rules' CTEs are often ~10
# rows where there are millions, and those plans are quadratic (T006 and T004 took minutes
# on 2.5 M kernels). Zero thresholds keep the sort-based ASOF and IEJoin operators, which
# cost next to nothing extra on small runs.
PLANNER_SETTINGS = {"asof_loop_join_threshold": 0, "merge_join_threshold": 0}


def install(con: duckdb.DuckDBPyConnection) -> None:
    for name, value in PLANNER_SETTINGS.items():
        con.execute(f"SET {name} = {value}")
    for name, body in MACROS.items():
        con.execute(f"CREATE OR REPLACE TEMP MACRO {name}{body}")
    for name, (_, sql) in VIEWS.items():
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {sql}")


# The views that several timeline rules read and that cost a sort of all GPU work each time,
# in dependency order (later ones are computed from the cached earlier ones). Views read by
# one rule only (kernel_busy_intervals: T002) are not worth caching: a filter on run_id
# reaches the table scan through their windows anyway.
RUN_CACHED = ("device_busy_intervals", "device_busy", "device_idle_gaps")


@contextmanager
def scoped_to_run(con: duckdb.DuckDBPyConnection, run_id: str) -> Iterator[None]:
    """Within the block, the RUN_CACHED views hold only `run_id`'s rows, computed once.

    The rules of one run each filter these views on that run; materializing them first
    turns ~10 recomputations (a window sort over every GPU operation each) into one.
    Outside the block (reports, cross-run rules) the views are the store-wide ones again.
    If the cache cannot be built, the block runs on the store-wide views (slower, same
    answers), and any error shows up in the rules that read them."""
    done: list[str] = []
    try:
        for name in RUN_CACHED:
            con.execute(f"CREATE OR REPLACE TEMP TABLE _run_{name} AS SELECT * FROM {name} WHERE run_id = ?",
                        [run_id])
            con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM _run_{name}")
            done.append(name)
    except duckdb.Error:
        _restore(con, done)
        done = []
    try:
        yield
    finally:
        _restore(con, done)


def _restore(con: duckdb.DuckDBPyConnection, cached: list[str]) -> None:
    for name in reversed(cached):
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {VIEWS[name][1]}")
    for name in cached:
        con.execute(f"DROP TABLE IF EXISTS _run_{name}")
