"""The GPU timeline: every operation as one interval table (`gpu_activity`), its union per
device as busy intervals (gaps and islands), the idle gaps between them, per device and per run,
and the table macros the rules read busy time with (`islands`, `covered_ns`, `next_busy_candidates`)."""

from __future__ import annotations

from .core import TableMacro, View


def device_idle_gaps_sql(islands_with_successors: str, per_run: bool = False) -> str:
    """The device_idle_gaps view's query: a filter over the `islands` of the GPU activity with
    their successors (the query, or a table holding its rows); with `per_run`, islands and result
    without a run_id column. Each island but a device's last ends a gap, up to the next one's start."""
    run = "" if per_run else "run_id, "
    return f"""
        SELECT {run}device_id, end_ns AS start_ns, next_start_ns AS end_ns, next_start_ns - end_ns AS gap_ns,
               -- idle time before = time since the first start, minus busy time, up to this gap
               end_ns - first_start_ns - (busy_before_ns + end_ns - start_ns) AS idle_before_ns
        FROM ({islands_with_successors}) WHERE next_start_ns IS NOT NULL
        """


def run_idle_gaps_sql(per_run: bool = False) -> str:
    """The run_idle_gaps view's query: one window over all GPU work of a run, every device
    together; with `per_run`, one run's ($1) rows without a run_id column."""
    run = "" if per_run else "run_id, "
    return f"""
        SELECT {run}prev_end_ns AS start_ns, start_ns AS end_ns, start_ns - prev_end_ns AS gap_ns
        FROM (SELECT {run}start_ns,
                     max(end_ns) OVER ({'' if per_run else 'PARTITION BY run_id '}ORDER BY start_ns, end_ns
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_ns
              FROM gpu_activity {'WHERE run_id = $1' if per_run else ''})
        WHERE start_ns > prev_end_ns
        """


# An island starts at each interval that begins after every earlier one has ended, and ends
# where the next island starts minus the gap, i.e. at the latest end seen before that start (or
# the latest end of all, for the last island): two window passes, the second over island starts
# only, and no GROUP BY. An earlier island ends at the next one's prev_max_end, so the busy time
# before an island (sum of earlier ends minus earlier starts) comes out of the same pass. DuckDB
# drops the windows nothing reads (the successors, for most callers). One text for two macros:
# a partition key the same on every row (a run id, or NULL) is still sorted on, so one run's
# rows are partitioned by device alone (5 M GPU operations: about 10% less time).
_ISLANDS = """(source) AS TABLE
        SELECT {key}, row_number() OVER w AS island, start_ns,
               coalesce(lead(prev_max_end) OVER w, last_end) AS end_ns,
               CAST(coalesce(sum(prev_max_end) OVER (w ROWS UNBOUNDED PRECEDING), 0)
                    - coalesce(sum(start_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                    AS BIGINT) AS busy_before_ns,
               lead(start_ns) OVER w AS next_start_ns, first_value(start_ns) OVER w AS first_start_ns
        FROM (SELECT {key}, start_ns,
                     max(end_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max_end,
                     max(end_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS last_end
              FROM query_table(source)
              WINDOW w AS (PARTITION BY {key} ORDER BY start_ns, end_ns))
        WHERE prev_max_end IS NULL OR start_ns > prev_max_end
        WINDOW w AS (PARTITION BY {key} ORDER BY start_ns)"""


DEFINES = (
    TableMacro(
        "islands",
        "Intervals merged into disjoint ones per run and device: `islands('<table>')` names a table (a CTE or "
        "view) with `run_id`, `device_id`, `start_ns` and `end_ns`. Per island: `run_id`, `device_id`, `island` "
        "(from 1, in time order), `start_ns`, `end_ns`, `busy_before_ns` (the islands' time before it), "
        "`next_start_ns` (the next island's start) and `first_start_ns` (the device's first start).",
        _ISLANDS.format(key="run_id, device_id"),
        on_demand=False,
    ),
    TableMacro(
        "device_islands",
        "`islands` of one run's rows, per device, without `run_id`: `device_islands('<table>')`.",
        _ISLANDS.format(key="device_id"),
    ),
    View(
        "gpu_activity",
        "Every timed GPU operation (kernel, copy, memset) as one interval table, with the "
        "row id of its source table in `item_id` and its API call in `launch_call_id`; kernels also "
        "carry `external_id` and `threads` (grid x block threads), and `unified_memory` is true for "
        "copies that are unified-memory page migrations (false for all else).",
        """
        SELECT run_id, device_id, stream_id, 'kernel' AS kind, kernel_id AS item_id,
               start_ns, end_ns, name, pid, correlation_id, launch_call_id, external_id,
               -- BIGINT: the columns are INTEGER, and a grid of 2^23 blocks of 256 threads overflows it
               grid_x::BIGINT * coalesce(grid_y, 1) * coalesce(grid_z, 1)
                 * block_x * coalesce(block_y, 1) * coalesce(block_z, 1) AS threads,
               false AS unified_memory
        FROM kernels WHERE start_ns IS NOT NULL AND end_ns >= start_ns
        UNION ALL
        SELECT run_id, device_id, stream_id, 'copy', copy_id, start_ns, end_ns,
               'Memcpy ' || direction || CASE WHEN unified_memory THEN ' (unified)' ELSE '' END,
               pid, correlation_id, launch_call_id, NULL, NULL, coalesce(unified_memory, false)
        FROM copies WHERE start_ns IS NOT NULL AND end_ns >= start_ns
        UNION ALL
        SELECT run_id, device_id, stream_id, 'memset', memset_id, start_ns, end_ns, 'Memset',
               pid, correlation_id, launch_call_id, NULL, NULL, false
        FROM memsets WHERE start_ns IS NOT NULL AND end_ns >= start_ns
        """,
        reads=(),
    ),
    View(
        "device_busy_intervals",
        "Per run and device, the union of all GPU activity as disjoint busy intervals "
        "(gaps-and-islands over `gpu_activity`), with `busy_before_ns`, the busy time before each "
        "(busy time in any window = a difference of two such running totals, read by ASOF joins).",
        "SELECT * EXCLUDE (next_start_ns, first_start_ns) FROM islands('gpu_activity')",
        reads=("islands", "gpu_activity"),
    ),
    View(
        "kernel_busy_intervals",
        "Per run and device, the union of kernel execution only (what copies can hide behind), "
        "with `busy_before_ns` as in `device_busy_intervals`.",
        "WITH kernel_activity AS (SELECT * FROM gpu_activity WHERE kind = 'kernel') "
        "SELECT * EXCLUDE (next_start_ns, first_start_ns) FROM islands('kernel_activity')",
        reads=("islands", "gpu_activity"),
    ),
    View(
        "device_busy",
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
        reads=("device_busy_intervals",),
    ),
    View(
        "device_idle_gaps",
        "Per run and device, the idle stretches between busy intervals (no work on any stream), "
        "with `idle_before_ns`, the idle time before each (from the device's first operation).",
        device_idle_gaps_sql("SELECT * FROM islands('gpu_activity')"),
        reads=("islands", "gpu_activity"),
    ),
    View(
        "run_idle_gaps",
        "Per run, the stretches during which no GPU of the run had work: the gaps in the union of all "
        "GPU activity over every device, with `gap_ns` (before the first and after the last operation "
        "is not a gap).",
        run_idle_gaps_sql(),
        reads=("gpu_activity",),
    ),
    # An ASOF join for "the first busy interval ending after t" sorts its whole right side:
    # millions of intervals for a few thousand probes. Intervals are numbered in time order, so
    # their ends rise with the number; the answer lies in the first block of 64 whose last end is
    # past t, and only the blocks some probe lands in are kept. Exact: the answer is among them,
    # and every interval before it ends by t.
    TableMacro(
        "next_busy_candidates",
        "The busy intervals of one run (a table of its `device_busy_intervals` rows, as `this_run.device_busy_intervals`) "
        "among which the first one ending after each probe lies: `next_busy_candidates('this_run.device_busy_intervals', "
        "'probes')`, the probes a table (a CTE's name) with `device_id` and `t`; `device_id`, `start_ns`, `end_ns`.",
        """(intervals, probes) AS TABLE
        WITH blocks AS (
            SELECT device_id, (island - 1) // 64 AS block, max(end_ns) AS block_end
            FROM query_table(intervals) GROUP BY ALL
        ), hit AS (
            SELECT DISTINCT b.device_id, b.block
            FROM query_table(probes) p ASOF JOIN blocks b ON b.device_id = p.device_id AND b.block_end > p.t
        )
        SELECT i.device_id, i.start_ns, i.end_ns FROM query_table(intervals) i
        SEMI JOIN hit h ON h.device_id = i.device_id AND h.block = (i.island - 1) // 64""",
    ),
    # Covered time in [a, b] is covered time up to b minus that up to a; up to t it is read from
    # the last stretch starting by t. Both ends go through one ASOF join (one sort of the
    # stretches), where an interval-overlap join is quadratic on long runs. The key is substituted
    # as written; the stretches' columns are renamed so that in the join it names the probe's.
    TableMacro(
        "covered_ns",
        "How much of each probe interval some stretch covers: `covered_ns('probes', 'stretches', key)` names two "
        "tables (CTEs) and the column of both the stretches are disjoint per (e.g. `device_id`): the probes, with "
        "`start_ns`, `end_ns` and the columns that name a probe, and the stretches, with `start_ns`, `end_ns` and "
        "`to_end_ns` (their total length up to each one's end: for islands, `busy_before_ns + end_ns - start_ns`). "
        "One row per probe: its columns but the interval, and `covered_ns` (0 with no stretch of its key).",
        """(probes, stretches, key) AS TABLE
        SELECT p.* EXCLUDE (t, sign),
               CAST(sum(p.sign * coalesce(c.c_to_end - c.c_end + least(p.t, c.c_end), 0)) AS BIGINT) AS covered_ns
        FROM (SELECT * EXCLUDE (start_ns, end_ns), end_ns AS t, 1 AS sign FROM query_table(probes)
              UNION ALL
              SELECT * EXCLUDE (start_ns, end_ns), start_ns AS t, -1 AS sign FROM query_table(probes)) p
        ASOF LEFT JOIN (SELECT key AS c_key, start_ns AS c_start, end_ns AS c_end, to_end_ns AS c_to_end
                        FROM query_table(stretches)) c ON c.c_key = key AND c.c_start <= p.t
        GROUP BY ALL""",
    ),
)
