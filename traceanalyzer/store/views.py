"""Named, documented analyses over the store, installed as TEMP views on each connection.

Rules and reports build on these instead of re-deriving them; a user can query them
too (`traceanalyzer query "SELECT * FROM device_busy"`). TEMP views live in the
connection, not the file, so a store written by an older version gets the current ones.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import duckdb
import pyarrow as pa

from ..fmt import LOSS_BOUND
from ..kernel_library import SQL_MACROS as KERNEL_NAME_MACROS


def islands(source: str, successors: bool = False, per_run: bool = False) -> str:
    """Merge overlapping intervals of `source` per run and device into disjoint ones.

    An island starts at each interval that begins after every earlier one has ended, and
    ends where the next island starts minus the gap, i.e. at the latest end seen before
    that start (or the latest end of all, for the last island): two window passes, the
    second over island starts only, and no GROUP BY. `busy_before_ns` is the busy time
    before each island (a running total, so busy time in any window is a difference).
    With `successors`, each island also gets the next one's start and the device's first
    start (`next_start_ns`, `first_start_ns`): all device_idle_gaps needs, from the same pass.
    With `per_run`, `source` is one run's intervals without a run_id column, and so is the result."""
    extra = (", lead(start_ns) OVER w AS next_start_ns, first_value(start_ns) OVER w AS first_start_ns"
             if successors else "")
    run = "" if per_run else "run_id, "
    return f"""
        WITH ordered AS (
            SELECT {run}device_id, start_ns,
                   max(end_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max_end,
                   max(end_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS last_end
            FROM ({source})
            WINDOW w AS (PARTITION BY {run}device_id ORDER BY start_ns, end_ns)
        )
        -- An earlier island ends at the next one's prev_max_end, so the busy time before an
        -- island (sum of earlier ends minus earlier starts) comes out of the same window pass.
        SELECT {run}device_id, row_number() OVER w AS island, start_ns,
               coalesce(lead(prev_max_end) OVER w, last_end) AS end_ns,
               CAST(coalesce(sum(prev_max_end) OVER (w ROWS UNBOUNDED PRECEDING), 0)
                    - coalesce(sum(start_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                    AS BIGINT) AS busy_before_ns{extra}
        FROM ordered WHERE prev_max_end IS NULL OR start_ns > prev_max_end
        WINDOW w AS (PARTITION BY {run}device_id ORDER BY start_ns)
        """


def _in_slice(start: str) -> str:
    """The condition that `start` lies in the slice [$2, $3) of a sliced per-run query ($3 NULL:
    no end); NULL starts, which sort last, belong to the last slice ($4). Written so that DuckDB
    skips the row groups outside the slice by their zone maps."""
    return f"({start} >= $2 AND ({start} < $3 OR $3 IS NULL) OR {start} IS NULL AND $4)"


def _kernel_launches(per_run: bool = False, sliced: bool = False) -> str:
    """The kernel_launches view's query; with `per_run`, one run's ($1) rows without a run_id
    column, and with `sliced` too, those of the kernels starting in one slice (`_in_slice`)."""
    run = "" if per_run else "k.run_id, "
    where = "WHERE k.run_id = $1" if per_run else ""
    if sliced:
        where += f" AND {_in_slice('k.start_ns')}"
    return f"""
        SELECT {run}k.kernel_id, k.device_id, n.name_key, k.grid_x, k.grid_y, k.grid_z,
               k.block_x, k.block_y, k.block_z, a.call_id, a.pid, a.tid,
               a.start_ns AS call_start_ns, a.end_ns AS call_end_ns
        FROM kernels k JOIN api_calls a ON a.run_id = k.run_id AND a.call_id = k.launch_call_id
        LEFT JOIN kernel_names n ON n.run_id = k.run_id AND n.name = k.name {where}
        """


_STREAM_OPS_COLUMNS = ("device_id, stream_id, kind, item_id, start_ns, end_ns, pid, launch_call_id, name_key, "
                       "external_id, threads")
# The per-run cache's stream_ops continues each slice from the operation before it, per stream:
# a TEMP table of stream_ops rows (see _build_in_slices).
_STREAM_OPS_CARRY = "_ta_stream_ops_carry"


def _stream_ops(per_run: bool = False, sliced: bool = False) -> str:
    """The stream_ops view's query; with `per_run`, one run's ($1) rows without a run_id column.

    Unified-memory page migrations are left out: the driver moves pages when they are touched,
    they are not work a stream was given, so they neither make nor close a stream's gaps (they
    stay in gpu_activity, and so in the device's busy time).

    With `sliced` (and `per_run`), one slice of it: the operations starting in the slice
    (`_in_slice`), each stream going on from its last operation in earlier slices, which
    _STREAM_OPS_CARRY holds. That row takes part in the window (it is the first operation's
    predecessor, and numbers the stream on) and is left out of the result."""
    run = "" if per_run else "run_id, "
    where = "WHERE NOT a.unified_memory" + (" AND a.run_id = $1" if per_run else "")
    if sliced:
        where += f" AND {_in_slice('a.start_ns')}"
    ops = f"""SELECT a.*, n.name_key FROM gpu_activity a
              LEFT JOIN kernel_names n ON a.kind = 'kernel' AND n.run_id = a.run_id AND n.name = a.name {where}"""
    seq, reach, carried_out = "row_number() OVER w", "end_ns", ""
    if sliced:
        ops = f"""SELECT {_STREAM_OPS_COLUMNS}, end_ns AS reach_ns, NULL::BIGINT AS seq_before, false AS carried
                  FROM ({ops})
                  UNION ALL
                  SELECT {_STREAM_OPS_COLUMNS}, greatest(prev_max_end_ns, end_ns), seq - 1, true FROM {_STREAM_OPS_CARRY}"""
        seq, reach, carried_out = ("row_number() OVER w + coalesce(first_value(seq_before) OVER w, 0)", "reach_ns",
                                   "QUALIFY NOT carried")
    return f"""
        SELECT {run}{_STREAM_OPS_COLUMNS}, {seq} AS seq,
               max({reach}) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max_end_ns,
               lag(kind) OVER w AS prev_kind, lag(item_id) OVER w AS prev_id, lag(start_ns) OVER w AS prev_start_ns,
               lag(end_ns) OVER w AS prev_end_ns, lag(name_key) OVER w AS prev_name_key
        FROM ({ops})
        -- kind last: kernel, copy and memset ids may coincide, and the order must be total
        WINDOW w AS (PARTITION BY {run}device_id, stream_id ORDER BY start_ns, end_ns, item_id, kind)
        {carried_out}
        """


def _busy_intervals(kernels_only: bool = False, successors: bool = False, per_run: bool = False) -> str:
    """The device_busy_intervals view's query (with `kernels_only`, kernel_busy_intervals'):
    `islands` of the GPU activity; with `per_run`, one run's ($1) rows without a run_id column.
    `successors` as in `islands` (what device_idle_gaps reads)."""
    conditions = [*(["run_id = $1"] if per_run else []), *(["kind = 'kernel'"] if kernels_only else [])]
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    run = "" if per_run else "run_id, "
    return islands(f"SELECT {run}device_id, start_ns, end_ns FROM gpu_activity{where}",
                   successors=successors, per_run=per_run)


def _device_idle_gaps(islands_with_successors: str, per_run: bool = False) -> str:
    """The device_idle_gaps view's query: a filter over the islands of `_busy_intervals` with
    `successors` (the query, or a table holding its rows); with `per_run`, islands and result
    without a run_id column. Each island but a device's last ends a gap, up to the next one's start."""
    run = "" if per_run else "run_id, "
    return f"""
        SELECT {run}device_id, end_ns AS start_ns, next_start_ns AS end_ns, next_start_ns - end_ns AS gap_ns,
               -- idle time before = time since the first start, minus busy time, up to this gap
               end_ns - first_start_ns - (busy_before_ns + end_ns - start_ns) AS idle_before_ns
        FROM ({islands_with_successors}) WHERE next_start_ns IS NOT NULL
        """


def _run_idle_gaps(per_run: bool = False) -> str:
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


def next_busy_candidates(probes: str) -> str:
    """The busy intervals of $run_id (device_busy_intervals) among which the first one ending
    after each probe (`device_id`, `t` columns of the query `probes`) lies.

    An ASOF join for "the first busy interval ending after t" sorts its whole right side:
    millions of intervals for a few thousand probes. Intervals are numbered in time order,
    so their ends rise with the number; the answer lies in the first block of 64 whose last
    end is past t, and only the blocks some probe lands in are kept. Exact: the answer is
    among them, and every interval before it ends by t."""
    return f"""
        WITH blocks AS (
            SELECT device_id, (island - 1) // 64 AS block, max(end_ns) AS block_end
            FROM device_busy_intervals WHERE run_id = $run_id GROUP BY ALL
        ), hit AS (
            SELECT DISTINCT b.device_id, b.block
            FROM ({probes}) p ASOF JOIN blocks b ON b.device_id = p.device_id AND b.block_end > p.t
        )
        SELECT i.device_id, i.start_ns, i.end_ns FROM device_busy_intervals i
        SEMI JOIN hit h ON h.device_id = i.device_id AND h.block = (i.island - 1) // 64
        WHERE i.run_id = $run_id
        """


def issued_at(busy_starts: str) -> str:
    """When the work that ends an idle stretch was issued, as the time budget reads it: for each
    (`device_id`, `busy_start`) of the query `busy_starts` (a start of the device's busy
    intervals, after idle time), of the operations of $run_id starting then, the return of the
    launch call that started first (`issued_ns`; its start when it has no end). NULL where that
    operation has no launch call: whether the host was late is unknown. Before `issued_ns` the
    idle time is the budget's `host` (or `sync`, in a blocking call), after it `dependency`."""
    return f"""
        SELECT g.device_id, g.start_ns AS busy_start,
               arg_min(coalesce(c.end_ns, c.start_ns), coalesce(c.start_ns, {_MAX_BIGINT})) AS issued_ns
        FROM gpu_activity g
        SEMI JOIN ({busy_starts}) x ON x.device_id = g.device_id AND x.busy_start = g.start_ns
        LEFT JOIN api_calls c ON c.run_id = $run_id AND c.call_id = g.launch_call_id
        WHERE g.run_id = $run_id
        GROUP BY ALL
        """


def host_until(issued: str, start: str, end: str) -> str:
    """Where the host part of the idle time [`start`, `end`] ends, as SQL: the issue of the work
    that ends it (`issued_at`'s `issued_ns`), clamped to the interval (NULL: unknown)."""
    return f"least(greatest({issued}, {start}), {end})"


def covered_ns(probes: str, keys: tuple[str, ...], stretches: str, device: str = "device_id") -> str:
    """How much of each probe interval some stretch covers: columns `keys` + `covered_ns`.

    `probes`: a query with the columns `keys` (naming a probe), `device_id`, `start_ns` and
    `end_ns`. `stretches`: a query with `device_id`, `start_ns`, `end_ns` and `to_end_ns`
    (the stretches' total length up to each one's end), disjoint per device: islands from
    `islands()`, whose `to_end_ns` is `busy_before_ns + end_ns - start_ns`.

    Covered time in [a, b] is covered time up to b minus that up to a; up to t it is read
    from the last stretch starting by t. Both ends go through one ASOF join (one sort of the
    stretches), where an interval-overlap join is quadratic on long runs. A probe with no
    stretch on its device gets 0. `device` names the column that plays `device_id` in both
    (any key the stretches are disjoint per)."""
    key_list = ", ".join(f"p.{k}" for k in keys)
    cols = ", ".join(dict.fromkeys((*keys, device)))
    ends = f"SELECT {cols}, end_ns AS t, 1 AS sign FROM ({probes})"
    starts = f"SELECT {cols}, start_ns AS t, -1 AS sign FROM ({probes})"
    return f"""
        SELECT {key_list},
               CAST(sum(p.sign * coalesce(c.to_end_ns - c.end_ns + least(p.t, c.end_ns), 0)) AS BIGINT) AS covered_ns
        FROM ({ends} UNION ALL {starts}) p
        ASOF LEFT JOIN ({stretches}) c ON c.{device} = p.{device} AND c.start_ns <= p.t
        GROUP BY {key_list}
        """


# A Kineto profiler step's range name.
PROFILER_STEP = r"^ProfilerStep#\d+$"
# Nsight Compute's duration of a launch (its runs have no timeline).
NCU_DURATION = "gpu__time_duration.sum"

def _stall_profiles() -> str:
    """The stall_profiles view's query (rule I001's analysis)."""
    reason = (r"'^smsp__(?:pcsamp_warps_issue_stalled_|warp_issue_stalled_|average_warps_issue_stalled_|"
              r"average_warp_latency_issue_stalled_)([a-z_]+?)(?:_per_warp_active\.pct|_per_issue_active\.ratio|"
              r"_not_issued|\.ratio|\.pct)?$'")
    return f"""
        WITH fam AS (
            SELECT run_id, kernel_id, metric_id, value, regexp_extract(metric_id, {reason}, 1) AS reason,
                   CASE WHEN metric_id LIKE 'smsp__average_warps_issue_stalled_%_per_issue_active.ratio' THEN 1
                        WHEN metric_id LIKE 'smsp__warp_issue_stalled_%_per_warp_active.pct' THEN 2
                        WHEN metric_id LIKE 'smsp__average_warp_latency_issue_stalled_%' THEN 3
                        WHEN metric_id LIKE 'smsp__pcsamp_warps_issue_stalled_%' AND metric_id NOT LIKE '%_not_issued' THEN 4
                   END AS family
            FROM kernel_metrics
            WHERE metric_id LIKE 'smsp__%stalled%' AND value IS NOT NULL AND value >= 0
        ), best AS (
            SELECT run_id, kernel_id, min(family) AS family FROM fam
            WHERE family IS NOT NULL AND reason <> '' GROUP BY run_id, kernel_id
        ), profile AS (
            SELECT f.run_id, f.kernel_id, f.reason, f.family, f.value,
                   f.value / nullif(sum(f.value) OVER (PARTITION BY f.run_id, f.kernel_id), 0) AS share
            FROM fam f JOIN best b USING (run_id, kernel_id, family)
            WHERE f.reason NOT IN ('selected')
        ), launches AS (
            SELECT k.run_id, k.kernel_id, coalesce(k.name, '?') AS name, coalesce(k.short_name, k.name, '?') AS short_name,
                   k.device_id, i.issue_active, k.duration_ns
            FROM kernel_durations k SEMI JOIN best b USING (run_id, kernel_id)
            LEFT JOIN (SELECT run_id, kernel_id, max(value) AS issue_active FROM kernel_metrics
                       WHERE metric_id = 'smsp__issue_active.avg.per_cycle_active' GROUP BY run_id, kernel_id) i
              USING (run_id, kernel_id)
        ), by_name AS (  -- the average profile over the launches of one kernel
            SELECT l.run_id, l.name, any_value(l.short_name) AS short_name, min(l.kernel_id) AS first_id,
                   any_value(l.device_id) AS device_id, count(DISTINCT l.kernel_id) AS launches,
                   p.reason, avg(p.share) AS share, avg(l.issue_active) AS issue_active,
                   sum(l.duration_ns) / count(*) * count(DISTINCT l.kernel_id) AS duration_ns,
                   any_value(p.family) AS family
            FROM profile p JOIN launches l USING (run_id, kernel_id)
            GROUP BY l.run_id, l.name, p.reason
        ), ranked AS (
            SELECT *, row_number() OVER (PARTITION BY run_id, name ORDER BY share DESC, reason) AS rk,
                   to_json(map_from_entries(list((reason, round(share, 4)) ORDER BY share DESC)
                                            OVER (PARTITION BY run_id, name))) AS profile
            FROM by_name
        )
        SELECT run_id, name, short_name, device_id, first_id, launches, reason, share, issue_active, duration_ns,
               family, profile, CAST(duration_ns * (1 - coalesce(issue_active, 0)) * share AS BIGINT) AS est_loss_ns
        FROM ranked WHERE rk = 1
        """


# Kernel names of collectives: NCCL/RCCL kernels and the usual custom all-reduce kernels.
COMM_PATTERN = (r"(?i)(nccl|rccl|multimem_all_reduce|cross_device_reduce|all_?reduce|all_?gather|"
                r"reduce_?scatter|all_?to_?all)")
# The blocking host calls: they return only when the GPU work they wait for is done.
BLOCKING_CALL = ("(name ILIKE '%synchronize%' OR ((name ILIKE '%memcpy%' OR name ILIKE '%memset%') "
                 "AND name NOT ILIKE '%async%'))")
# The time budget's categories, in the order of priority that resolves overlap between streams.
BUDGET_CATEGORIES = ("compute", "communication", "copy", "memset")
IDLE_CAUSES = ("sync", "host", "dependency", "unknown")
_MIN_BIGINT, _MAX_BIGINT = -(1 << 63), (1 << 63) - 1


def blocking_calls(where: str, keys: str) -> str:
    """The blocking calls (BLOCKING_CALL) of the api_calls `where` selects, per thread (`keys`,
    e.g. "run_id, pid, tid"), one row per start time: `start_ns`, `reach_ns` (the latest end so
    far) and `blocked_ns` (the time the thread spent in blocking calls up to `reach_ns`: their
    union, as calls can nest). What an idle stretch's `sync` part is read from (`blocked_at`)."""
    w = f"PARTITION BY {keys} ORDER BY start_ns"
    return f"""
        SELECT {keys}, start_ns, reach_ns,
               CAST(sum(greatest(end_ns - greatest(start_ns, coalesce(prev_reach_ns, start_ns)), 0))
                    OVER ({w} ROWS UNBOUNDED PRECEDING) AS BIGINT) AS blocked_ns
        FROM (SELECT *, max(end_ns) OVER ({w} ROWS UNBOUNDED PRECEDING) AS reach_ns,
                     max(end_ns) OVER ({w} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_reach_ns
              FROM (SELECT {keys}, start_ns, max(end_ns) AS end_ns FROM api_calls
                    WHERE {where} AND {BLOCKING_CALL} AND start_ns IS NOT NULL AND end_ns >= start_ns
                    GROUP BY ALL))
        """


def blocked_at(row: str, t: str) -> str:
    """The time a thread spent in blocking calls up to `t`, from `row`, its row of `blocking_calls`
    found by an ASOF join on `start_ns <= t` (NULL: none): the calls up to that row cover all of
    [`row`.start_ns, `row`.reach_ns] (they are merged into islands), so up to `t` the union lacks
    only what lies after `t`."""
    return f"coalesce({row}.blocked_ns - greatest({row}.reach_ns - {t}, 0), 0)"


def idle_marks(start: str, end: str, call_start: str, call_end: str, reach: str) -> tuple[str, str]:
    """Where an idle stretch [`start`, `end`] stops being host time, and up to where its
    launching thread's blocking calls count as `sync`, as SQL (`issued`, `sync_until`).

    `issued`: the return of the launch call (`call_start`, `call_end`) or of the blocking call the
    thread was in when the stretch began (`reach`: the latest end of those it started by `start`;
    NULL: none), whichever is later, clamped to the stretch; after it the work was issued.
    `sync_until`: the blocking calls that count are the one in progress at `start` and those the
    thread entered before the launch call (the launch call itself, a synchronous copy, is the
    launch); of [`start`, `issued`], the time in them is `sync` (`blocked_at` at `sync_until`
    minus at `start`), the rest `host`. The time budget splits its idle stretches with it and
    rule T001 its gaps, so the two agree."""
    issued = f"least(greatest(coalesce({call_end}, {call_start}), coalesce({reach}, {start}), {start}), {end})"
    sync_until = f"least(greatest(coalesce({reach}, {start}), coalesce({call_start}, {start}), {start}), {issued})"
    return issued, sync_until


def _time_budget(runs: str | None = None, window: bool = False) -> str:
    """The time_budget view's query; with `runs` (a condition on `run_id`: the table macros'
    parameter), those runs' rows only, read from the tables by run (DuckDB does not push a run
    filter on the view down through the sweep's window). See `_budget_sweep`."""
    return _budget_sweep(runs, window) + f"""
        , totals AS (
            SELECT run_id, device_id, category, sum(end_ns - start_ns) AS ns FROM stretches GROUP BY ALL
        ), caused AS (  -- each idle stretch split in time: waiting in a sync, then the host, then the work
            SELECT run_id, device_id, 'unknown' AS cause, end_ns - start_ns AS ns FROM marks WHERE NOT linked
            UNION ALL
            SELECT run_id, device_id, unnest(['sync', 'host', 'dependency']),
                   unnest([sync_end_ns - start_ns, issued_ns - sync_end_ns, end_ns - issued_ns])
            FROM marks WHERE linked
        ), spans AS (
            SELECT run_id, device_id, sum(ns) AS span_ns FROM totals GROUP BY ALL
        ), busy AS (  -- every busy category of every device, 0 where it has none
            SELECT s.run_id, s.device_id, c.category, NULL::VARCHAR AS cause, coalesce(t.ns, 0) AS ns
            FROM spans s CROSS JOIN (SELECT unnest({list(BUDGET_CATEGORIES)}) AS category) c
            LEFT JOIN totals t ON t.run_id = s.run_id AND t.device_id IS NOT DISTINCT FROM s.device_id
                              AND t.category = c.category
        )
        SELECT p.run_id, p.device_id, p.category, p.cause, CAST(p.ns AS BIGINT) AS ns, CAST(s.span_ns AS BIGINT) AS span_ns
        FROM (SELECT * FROM busy
              UNION ALL
              SELECT run_id, device_id, 'idle', cause, sum(ns) FROM caused GROUP BY ALL HAVING sum(ns) > 0) p
        JOIN spans s ON s.run_id = p.run_id AND s.device_id IS NOT DISTINCT FROM p.device_id
        """


# Every part of the budget as an interval: busy stretches, and idle ones split by cause (a CTE
# after `_budget_sweep`'s).
_SEGMENTS = """
        , segments AS (
            SELECT run_id, device_id, category, NULL::VARCHAR AS cause, start_ns, end_ns FROM stretches
            WHERE category <> 'idle'
            UNION ALL
            SELECT run_id, device_id, 'idle', 'unknown', start_ns, end_ns FROM marks WHERE NOT linked
            UNION ALL
            SELECT run_id, device_id, 'idle', unnest(['sync', 'host', 'dependency']),
                   unnest([start_ns, sync_end_ns, issued_ns]), unnest([sync_end_ns, issued_ns, end_ns])
            FROM marks WHERE linked
        )"""


def _step_budget(runs: str) -> str:
    """The time budget of each step (the `steps` view) of the runs `runs` selects: the parts of
    `_budget_sweep` clipped to the step's window, per device; a step's parts on a device sum to
    the part of the window inside the device's span (`span_ns`). Nested steps are each whole."""
    return _budget_sweep(runs) + _SEGMENTS + f"""
        , clipped AS (  -- (two inequalities: an IEJoin, not a nested loop)
            SELECT g.run_id, t.range_id AS step_id, t.name AS step, t.start_ns AS step_start_ns, g.device_id,
                   g.category, g.cause, least(g.end_ns, t.end_ns) - greatest(g.start_ns, t.start_ns) AS ns
            FROM segments g JOIN (SELECT * FROM steps WHERE {runs}) t
              ON t.run_id = g.run_id AND g.start_ns < t.end_ns AND g.end_ns > t.start_ns
        ), parts AS (
            SELECT run_id, step_id, step, step_start_ns, device_id, category, cause, sum(ns) AS ns
            FROM clipped GROUP BY ALL HAVING sum(ns) > 0
        )
        SELECT run_id, step_id, step, step_start_ns, device_id, category, cause, CAST(ns AS BIGINT) AS ns,
               CAST(sum(ns) OVER (PARTITION BY run_id, step_id, device_id) AS BIGINT) AS span_ns
        FROM parts
        """


# Warm-up and one-time costs (`warmup_windows`). Ranges named warm-up (NVTX, user annotations,
# PyTorch operators, Python functions):
WARMUP_NAME = r"(?i)warm[-_ ]?up"
# Host frames and calls that compile at run time (nvFuser, NVRTC, Inductor, JIT).
JIT_NAME = r"(?i)(compileFusion|nvrtc|hiprtc|compile_fx_inner|compile_inner|call_user_compiler|jit_compile)"
# Host calls that are one-time costs when they are a process's first of their name or come
# before the device's first kernel: lazy module and library loading, runtime compilation (a
# load or compile again later is a recompile, rule S001's), and frees, which create the context
# (`cudaFree(0)`) or release what set-up allocated.
ONE_TIME_CALL = r"(?i)^(cuModuleLoad|cuLibraryLoad|cudaGetFuncBySymbol|hipModuleLoad|nvrtc|hiprtc)"
EARLY_FREE = r"^(cuda|hip)Free$"
WARMUP_MIN_CALL_NS = 100_000  # a one-time call shorter than this is no warm-up worth a line
# A kernel's first launch is a one-time cost (module loading, the first call into a library)
# when its launch call takes this long and this many times the median of the kernel's later
# launch calls (of the run's launch calls, for a kernel launched once).
FIRST_LAUNCH_MIN_NS = 1_000_000
FIRST_LAUNCH_FACTOR = 10
# Leading steps longer than this many times the median of the steps after the first are warm-up
# (at most half of them, of runs with 3 steps or more): step_stats' rule.
WARMUP_STEP_FACTOR = 1.5
# What each reason of warmup_windows says, in the order reports list them.
WARMUP_REASONS = ("range named warm-up", "first step", "uploads before the first kernel", "JIT compilation",
                  "lazy module loading", "first launch", "cudaFree", "hipFree")


def _warmup_windows(runs: str | None) -> str:
    """The warmup_windows view's query; with `runs` (a condition on `run_id`), those runs' only."""
    of_run = runs or "true"
    devices_of = """(EXISTS (SELECT 1 FROM device_pids p WHERE p.run_id = d.run_id AND p.pid = o.pid
                             AND p.device_id IS NOT DISTINCT FROM d.device_id)
                     OR NOT EXISTS (SELECT 1 FROM device_pids p WHERE p.run_id = d.run_id AND p.pid = o.pid))"""
    return f"""
        WITH devices AS (
            SELECT run_id, device_id, min(start_ns) AS first_ns, max(end_ns) AS last_ns,
                   min(start_ns) FILTER (WHERE kind = 'kernel') AS first_kernel_ns
            FROM gpu_activity WHERE {of_run} GROUP BY ALL
        ), device_pids AS (
            SELECT DISTINCT run_id, device_id, pid FROM gpu_activity WHERE {of_run} AND pid IS NOT NULL
        ), frames AS NOT MATERIALIZED (  -- (read once, by `named`: a 24 M-range run's frames held whole took 4 GB)
            SELECT run_id, name, pid, tid, start_ns, end_ns FROM ranges
            WHERE {of_run} AND kind IN ('nvtx', 'user_annotation') AND end_ns > start_ns
            UNION ALL
            SELECT run_id, name, pid, tid, start_ns, end_ns FROM cpu_ops WHERE {of_run} AND end_ns > start_ns
            UNION ALL
            SELECT run_id, name, pid, tid, start_ns, end_ns FROM python_functions WHERE {of_run} AND end_ns > start_ns
        ), frame_names AS (  -- names matched once each: the window keeps DuckDB from pushing the
            -- match below the DISTINCT, onto every frame (a filter on the run, its partition, goes through)
            SELECT run_id, name, CASE WHEN regexp_matches(name, '{WARMUP_NAME}') THEN 'range named warm-up'
                                      ELSE 'JIT compilation' END AS reason
            FROM (SELECT run_id, name, row_number() OVER (PARTITION BY run_id) AS barrier FROM (
                      SELECT DISTINCT run_id, name FROM ranges WHERE {of_run} AND kind IN ('nvtx', 'user_annotation')
                      UNION SELECT DISTINCT run_id, name FROM cpu_ops WHERE {of_run}
                      UNION SELECT DISTINCT run_id, name FROM python_functions WHERE {of_run}))
            WHERE regexp_matches(name, '{WARMUP_NAME}') OR regexp_matches(name, '{JIT_NAME}')
        ), named AS (
            SELECT row_number() OVER () AS fid, f.*, n.reason,
                   row_number() OVER (PARTITION BY f.run_id, f.pid, f.name ORDER BY f.start_ns, f.end_ns) AS nth
            FROM frames f JOIN frame_names n USING (run_id, name)
        ), launched AS (  -- per frame and device, the end of the GPU work launched inside it on its thread
            SELECT n.fid, a.device_id, max(a.end_ns) AS work_end_ns
            FROM named n
            JOIN api_calls c ON c.run_id = n.run_id AND c.pid IS NOT DISTINCT FROM n.pid AND c.tid IS NOT DISTINCT FROM n.tid
                            AND c.start_ns >= n.start_ns AND c.start_ns < n.end_ns
            JOIN gpu_activity a ON a.run_id = c.run_id AND a.launch_call_id = c.call_id
            GROUP BY ALL
        ), call_names AS (
            SELECT run_id, name,
                   CASE WHEN regexp_matches(name, '{EARLY_FREE}') THEN name
                        WHEN regexp_matches(name, '(?i)rtc') THEN 'JIT compilation' ELSE 'lazy module loading' END AS reason
            FROM (SELECT run_id, name, row_number() OVER (PARTITION BY run_id) AS barrier FROM (SELECT DISTINCT run_id, name FROM api_calls WHERE {of_run}))
            WHERE regexp_matches(name, '{EARLY_FREE}') OR regexp_matches(name, '{ONE_TIME_CALL}')
        ), one_time AS (
            SELECT c.run_id, c.pid, c.name, c.start_ns, c.end_ns, n.reason,
                   row_number() OVER (PARTITION BY c.run_id, c.pid, c.name ORDER BY c.start_ns, c.call_id) AS nth
            FROM api_calls c JOIN call_names n USING (run_id, name) WHERE c.end_ns >= c.start_ns
        ), launches AS (  -- kernel launch calls, one per call and kernel name (a graph launch replays
            -- what was launched before)
            SELECT DISTINCT l.run_id, l.device_id, l.pid, l.name_key, l.call_id, l.call_start_ns, l.call_end_ns,
                   l.call_end_ns - l.call_start_ns AS ns
            FROM kernel_launches l
            WHERE {_qualified(of_run, 'l')} AND l.call_end_ns >= l.call_start_ns
              AND NOT EXISTS (SELECT 1 FROM api_calls c WHERE c.run_id = l.run_id AND c.call_id = l.call_id
                                                          AND c.name ILIKE '%graph%')
        ), run_launch AS (
            SELECT run_id, median(ns) AS median_ns FROM launches GROUP BY ALL
        ), kernel_launch AS (  -- each kernel's first launch call per process, and its later ones' median
            SELECT run_id, device_id, pid, name_key,
                   arg_min(call_start_ns, (call_start_ns, call_id)) AS start_ns,
                   arg_min(call_end_ns, (call_start_ns, call_id)) AS end_ns,
                   count(*) AS n
            FROM launches GROUP BY ALL
        ), first_launches AS (
            SELECT DISTINCT k.run_id, k.device_id, k.start_ns, k.end_ns,
                   CASE WHEN k.n > 1 THEN (SELECT median(l.ns) FROM launches l
                                           WHERE l.run_id = k.run_id AND l.device_id IS NOT DISTINCT FROM k.device_id
                                             AND l.pid IS NOT DISTINCT FROM k.pid AND l.name_key = k.name_key
                                             AND l.call_start_ns > k.start_ns)
                        ELSE r.median_ns END AS median_ns
            FROM kernel_launch k JOIN run_launch r USING (run_id)
            WHERE k.end_ns - k.start_ns >= {FIRST_LAUNCH_MIN_NS}
        ), step_rows AS (
            SELECT run_id, start_ns, end_ns, end_ns - start_ns AS ns,
                   row_number() OVER w AS i, count(*) OVER (PARTITION BY run_id, pooled) AS n,
                   count(*) OVER (PARTITION BY run_id, pooled) = max(n_named) OVER (PARTITION BY run_id) AS top
            FROM (SELECT *, regexp_replace(name, '{PROFILER_STEP}', 'ProfilerStep#*') AS pooled,
                         count(*) OVER (PARTITION BY run_id, regexp_replace(name, '{PROFILER_STEP}', 'ProfilerStep#*'))
                           AS n_named
                  FROM steps WHERE {of_run})
            WINDOW w AS (PARTITION BY run_id, pooled ORDER BY start_ns, range_id)
        ), step_median AS (
            SELECT run_id, quantile_cont(ns, 0.5) AS later_ns FROM step_rows WHERE top AND i > 1 GROUP BY ALL
        ), warm_steps AS (  -- the leading steps far longer than the later ones' median
            SELECT * FROM (
                SELECT s.*, min(CASE WHEN s.ns <= {WARMUP_STEP_FACTOR} * m.later_ns THEN s.i END)
                              OVER (PARTITION BY s.run_id) AS first_steady
                FROM step_rows s JOIN step_median m USING (run_id) WHERE s.top AND s.n >= 3)
            WHERE i < coalesce(first_steady, n + 1) AND i <= n // 2
        ), windows AS (
            SELECT n.run_id, d.device_id, n.reason, n.name, n.start_ns, greatest(n.end_ns, coalesce(l.work_end_ns, n.end_ns)) AS end_ns
            FROM named n JOIN devices d USING (run_id)
            LEFT JOIN launched l ON l.fid = n.fid AND l.device_id IS NOT DISTINCT FROM d.device_id
            WHERE n.reason <> 'JIT compilation' OR n.nth = 1 OR n.start_ns < d.first_kernel_ns
            UNION ALL
            SELECT o.run_id, d.device_id, o.reason, o.name, o.start_ns, o.end_ns
            FROM one_time o JOIN devices d USING (run_id)
            WHERE o.end_ns - o.start_ns >= {WARMUP_MIN_CALL_NS}
              AND (o.nth = 1 OR o.start_ns < d.first_kernel_ns) AND {devices_of}
            UNION ALL
            SELECT run_id, device_id, 'first launch', NULL, start_ns, end_ns FROM first_launches
            WHERE end_ns - start_ns >= {FIRST_LAUNCH_FACTOR} * coalesce(median_ns, 0)
            UNION ALL
            SELECT d.run_id, d.device_id, 'uploads before the first kernel', NULL, d.first_ns,
                   least(d.first_kernel_ns, coalesce(f.first_step_ns, d.first_kernel_ns))
            FROM devices d LEFT JOIN (SELECT run_id, min(start_ns) AS first_step_ns FROM steps WHERE {of_run}
                                      GROUP BY ALL HAVING count(*) >= 2) f USING (run_id)
            WHERE d.first_kernel_ns > d.first_ns
              AND (d.first_ns < f.first_step_ns
                   OR EXISTS (SELECT 1 FROM named n WHERE n.run_id = d.run_id AND n.reason = 'range named warm-up'))
            UNION ALL
            SELECT s.run_id, d.device_id, 'first step', NULL, s.start_ns, s.end_ns
            FROM warm_steps s JOIN devices d USING (run_id)
        )
        SELECT w.run_id, w.device_id, w.reason, w.name,
               greatest(w.start_ns, d.first_ns) AS start_ns, least(w.end_ns, d.last_ns) AS end_ns
        FROM windows w JOIN devices d ON d.run_id = w.run_id AND d.device_id IS NOT DISTINCT FROM w.device_id
        WHERE least(w.end_ns, d.last_ns) > greatest(w.start_ns, d.first_ns)
        """


def _warmup_budget(runs: str, windows: str | None = None) -> str:
    """The time inside the warm-up windows (`warmup_windows`, merged per device) of the runs
    `runs` selects, by part of the time budget: run_id, device_id, category, cause, ns (parts
    with time only), as `_step_budget` clips the budget to steps. `windows` is a query giving
    those windows (run_id, device_id, start_ns, end_ns) where they are already computed."""
    # Only the operations around the windows are swept: from the last end at or before the
    # first window's start to the first start at or after the last window's end, per device.
    hull = f"""
        warm_windows AS MATERIALIZED (SELECT run_id, device_id, start_ns, end_ns FROM ({windows or _warmup_windows(runs)})),
        hull AS (SELECT w.run_id, w.device_id,
               coalesce((SELECT max(a.end_ns) FROM gpu_activity a WHERE a.run_id = w.run_id
                           AND a.device_id IS NOT DISTINCT FROM w.device_id AND a.end_ns <= w.lo), w.lo) AS lo,
               coalesce((SELECT min(a.start_ns) FROM gpu_activity a WHERE a.run_id = w.run_id
                           AND a.device_id IS NOT DISTINCT FROM w.device_id AND a.start_ns >= w.hi), w.hi) AS hi
        FROM (SELECT run_id, device_id, min(start_ns) AS lo, max(end_ns) AS hi FROM warm_windows GROUP BY ALL) w)"""
    return _budget_sweep(runs, hull=hull) + _SEGMENTS + f"""
        , windows AS ({islands("SELECT * FROM warm_windows")}
        ), clipped AS (
            SELECT g.run_id, g.device_id, g.category, g.cause,
                   least(g.end_ns, w.end_ns) - greatest(g.start_ns, w.start_ns) AS ns
            FROM segments g JOIN windows w
              ON w.run_id = g.run_id AND w.device_id IS NOT DISTINCT FROM g.device_id
             AND g.start_ns < w.end_ns AND g.end_ns > w.start_ns
        )
        SELECT run_id, device_id, category, cause, CAST(sum(ns) AS BIGINT) AS ns FROM clipped
        GROUP BY ALL HAVING sum(ns) > 0
        """


def warmup_merged(where: str, across_devices: bool = False) -> str:
    """The warm-up windows (`warmup_windows`) that `where` selects, merged into disjoint ones per
    run and device (`islands`: run_id, device_id, start_ns, end_ns), or, `across_devices`, over
    all devices of a run (device_id -1). A device_id NULL is -1, so that ASOF joins can match it."""
    device = "-1" if across_devices else "coalesce(device_id, -1)"
    return islands(f"SELECT run_id, {device} AS device_id, start_ns, end_ns FROM warmup_windows WHERE {where}")


def steady_start(start: str, end: str, w: str = "w", w0: str = "w0") -> str:
    """Where the steady part of an idle stretch [`start`, `end`], which ends at an operation's
    start, begins, as SQL: `start` moved later by the stretch's time inside warm-up windows,
    NULL when that is all of it. `w` and `w0` are the last merged warm-up windows
    (`warmup_merged`, with `busy_before_ns`: the window time before each) starting at or before
    `end` and `start` (ASOF joins; NULL: none). A stretch is read from the operation that ends
    it, so its steady part is kept as one piece reaching that operation, as long as the time
    outside the windows: exact where a window covers its start or its end (warm-up before
    the steady state, or work launched in warm-up), and for a window inside it, its time is
    taken from the stretch's first part (the `sync`, then `host` causes)."""
    inside = f"({_warm_before(end, w)} - {_warm_before(start, w0)})"
    return f"CASE WHEN {start} + {inside} < {end} THEN {start} + {inside} END"


def _warm_before(t: str, w: str) -> str:
    """The warm-up window time before `t`, from `w`, the last merged window starting at or before it."""
    return f"coalesce({w}.busy_before_ns + least(greatest({t} - {w}.start_ns, 0), {w}.end_ns - {w}.start_ns), 0)"


def _budget_sweep(runs: str | None, window: bool = False, hull: str | None = None) -> str:
    """The CTEs the time budgets share, up to `stretches` (each stretch of a device's span with
    its category) and `marks` (each idle stretch with where its `sync` and `host` parts end).

    One sweep over the start and end of every GPU operation per device, in time order, with a
    running count of the operations of each category in progress: each stretch between two
    consecutive event times is the category of highest priority in progress (compute >
    communication > copy > memset), or idle. So the parts partition the device's span (first
    start to last end) exactly. An idle stretch is read from the operation that ends it (of
    those starting then, the one whose launch call started first) and that call's thread, and
    split in time: up to the return of the launch call (or of a blocking call the thread was in
    when the device went idle, if later), the time the thread spent in blocking calls (`sync`,
    see `idle_marks`; counted first in the stretch) and the rest (`host`: not issued yet), then
    the rest (`dependency`: issued, the work waited); all `unknown` without a launch call.

    With `window`, the sweep of one device (`win_device_id`, a parameter of the table macro)
    within [`win_lo_ns`, `win_hi_ns`): the operations overlapping it clipped to it, and an
    event at `win_hi_ns` that ends the window's last stretch there. Windows that cut a
    device's span at starts of its operations have parts that sum to the whole sweep's, each
    idle stretch whole (it ends at an operation's start, never inside a window); see
    `time_budget_rows`.

    With `hull` (CTEs, the last named `hull`: run_id, device_id, lo, hi), only the operations of a device that
    reach into [lo, hi] are swept: its stretches inside [lo, hi] are the whole sweep's when lo
    is an operation's end (or before the first) and hi an operation's start (or after the last),
    as `_warmup_budget` sets them."""
    of_run = runs or "true"
    in_window, starts_in_window, clip_start, clip_end, bound = "true", "true", "a.start_ns", "a.end_ns", ""
    if window:
        device = "a.device_id IS NOT DISTINCT FROM win_device_id"
        in_window = f"{device} AND a.start_ns < win_hi_ns AND a.end_ns >= win_lo_ns"
        starts_in_window = f"{device} AND a.start_ns BETWEEN win_lo_ns AND win_hi_ns"  # what can end its stretches
        clip_start, clip_end = "greatest(a.start_ns, win_lo_ns)", "least(a.end_ns, win_hi_ns)"
        bound = f"UNION ALL SELECT rid, win_device_id, win_hi_ns, 0 WHERE win_hi_ns < {_MAX_BIGINT}"
    issued, sync_until = idle_marks("i.start_ns", "i.end_ns", "i.call_start_ns", "i.call_end_ns", "b.reach_ns")
    # The four counts ride in one running sum, 15 bits each (far more operations than one device
    # runs at once): one window aggregate instead of four, for a fraction of the sweep's memory.
    category = " ".join(f"WHEN (counts >> {15 * i}) & 32767 > 0 THEN '{c}'" for i, c in enumerate(BUDGET_CATEGORIES))
    hull_cte, hull_join = "", ""
    if hull:
        hull_cte = f"{hull}, "
        hull_join = ("JOIN hull h ON h.run_id = a.run_id AND h.device_id IS NOT DISTINCT FROM a.device_id "
                     "AND a.end_ns >= h.lo AND a.start_ns <= h.hi")
    return f"""
        WITH {hull_cte}comm_names AS (  -- the pattern matched once per distinct name (kernel_names' window
            -- keeps DuckDB from pushing it below the DISTINCT, onto every launch)
            SELECT run_id, name FROM kernel_names WHERE {of_run} AND regexp_matches(name, '{COMM_PATTERN}')
        ), ops AS (
            SELECT a.run_id, a.device_id, {clip_start} AS start_ns, {clip_end} AS end_ns,
                   CASE a.kind WHEN 'kernel' THEN CASE WHEN c.name IS NULL THEN 1 ELSE 2 END
                               WHEN 'copy' THEN 3 ELSE 4 END AS rank
            FROM gpu_activity a LEFT JOIN comm_names c ON a.kind = 'kernel' AND c.run_id = a.run_id AND c.name = a.name
            {hull_join}
            WHERE {_qualified(of_run, 'a')} AND {in_window}
        ), events AS (  -- +1 at a start, -1 at an end, in the bits of the operation's category
            SELECT run_id, device_id, start_ns AS t, 1::BIGINT << (15 * (rank - 1)) AS d FROM ops
            UNION ALL
            SELECT run_id, device_id, end_ns, -(1::BIGINT << (15 * (rank - 1))) FROM ops
            {bound}
        ), swept AS (  -- (the default frame holds every event at the same time: each row sees all of them)
            SELECT run_id, device_id, t, lead(t) OVER w AS next_t, sum(d) OVER w AS counts
            FROM events
            WINDOW w AS (PARTITION BY run_id, device_id ORDER BY t)
        ), stretches AS MATERIALIZED (  -- (read twice: computed once)
            SELECT run_id, device_id, t AS start_ns, next_t AS end_ns,
                   CASE {category} ELSE 'idle' END AS category
            FROM swept WHERE next_t > t
        ), idle_next AS (  -- each idle stretch with the launch calls of the operations that end it
            SELECT i.run_id, i.device_id, i.start_ns, i.end_ns, c.start_ns AS call_start_ns, c.end_ns AS call_end_ns,
                   c.pid, c.tid
            FROM stretches i
            JOIN (SELECT * FROM gpu_activity a WHERE {of_run} AND {starts_in_window}) g
              ON g.run_id = i.run_id AND g.device_id IS NOT DISTINCT FROM i.device_id AND g.start_ns = i.end_ns
            LEFT JOIN (SELECT * FROM api_calls WHERE {of_run}) c ON c.run_id = g.run_id AND c.call_id = g.launch_call_id
            WHERE i.category = 'idle'
        ), idle AS (  -- one row per idle stretch: the launch that came first
            SELECT run_id, device_id, start_ns, end_ns, first.call_start_ns, first.call_end_ns, first.pid, first.tid
            FROM (SELECT run_id, device_id, start_ns, end_ns,
                         arg_min({{'call_start_ns': call_start_ns, 'call_end_ns': call_end_ns, 'pid': pid, 'tid': tid}},
                                 coalesce(call_start_ns, 9223372036854775807)) AS first
                  FROM idle_next GROUP BY ALL)
        ), blocking AS (  -- per thread, the latest end of its blocking calls so far, and its time in them
            {blocking_calls(of_run, "run_id, pid, tid")}
        ), reached AS (  -- each idle stretch with the blocking call its thread was in when it began
            SELECT i.run_id, i.device_id, i.start_ns, i.end_ns, i.call_start_ns IS NOT NULL AS linked, i.pid, i.tid,
                   {issued} AS issued_ns, {sync_until} AS sync_until_ns, {blocked_at("b", "i.start_ns")} AS blocked_ns
            FROM idle i ASOF LEFT JOIN blocking b
              ON b.run_id = i.run_id AND b.pid = i.pid AND b.tid = i.tid AND b.start_ns <= i.start_ns
        ), marks AS (  -- where in each idle stretch the `sync` part ends (its time counted first), then
            -- the `host` part (the launch)
            SELECT r.run_id, r.device_id, r.start_ns, r.end_ns, r.linked,
                   r.start_ns + {blocked_at("b", "r.sync_until_ns")} - r.blocked_ns AS sync_end_ns, r.issued_ns
            FROM reached r ASOF LEFT JOIN blocking b
              ON b.run_id = r.run_id AND b.pid = r.pid AND b.tid = r.tid AND b.start_ns <= r.sync_until_ns
        )"""


def _qualified(condition: str, alias: str) -> str:
    """A condition on `run_id` (a runs parameter of the generators) on `alias`'s run_id; a
    parameter named like it (`$run_id`) stays."""
    return re.sub(r"(?<![$\w.])run_id\b", f"{alias}.run_id", condition)


# Where host frames come from (host_frames' `source`): NVTX and user-annotation ranges, PyTorch
# operators, the `nn.Module` frames of the Python stack, and every Python frame.
FRAME_SOURCES = ("range", "op", "module", "python")
# The order of a thread's frame boundaries (`phase` 0: the end of a frame that began earlier,
# 1: a start, 2: the end of a zero-length frame): at one time, frames end before others start;
# frames starting together open outer (longer) first; frames ending together close inner first.
_BOUNDARY_ORDER = ("t, phase, CASE WHEN phase = 1 THEN -end_ns ELSE -start_ns END, "
                   "CASE WHEN phase = 1 THEN frame_id ELSE -frame_id END")
_FRAME_THREAD = "run_id, source, pid, tid"


def frame_rows_sql(runs: str | None, sources: tuple[str, ...]) -> str:
    """The host frames of `sources` (of the runs `runs` selects), one row each: run_id, source,
    frame_id, name, pid, tid, start_ns, end_ns."""
    of_run = runs or "true"
    timed = "pid IS NOT NULL AND tid IS NOT NULL AND start_ns IS NOT NULL AND end_ns >= start_ns"
    branches = []
    if "range" in sources:  # a range never closed lasts to the end of the run (as nsys's projection reads it)
        branches.append(f"""
            SELECT * FROM (
                SELECT r.run_id, 'range' AS source, r.range_id AS frame_id, r.name, r.pid, r.tid, r.start_ns,
                       coalesce(r.end_ns, greatest(u.end_ns, r.start_ns)) AS end_ns
                FROM ranges r LEFT JOIN runs u ON u.run_id = r.run_id
                WHERE r.kind IN ('nvtx', 'user_annotation'))
            WHERE {of_run} AND {timed}""")
    if "op" in sources:
        branches.append(f"SELECT run_id, 'op' AS source, op_id AS frame_id, name, pid, tid, start_ns, end_ns FROM cpu_ops "
                        f"WHERE {of_run} AND {timed}")
    python = [x for x in ("module", "python") if x in sources]
    if python:  # an `nn.Module` frame is a frame of both
        kinds = f"CASE WHEN starts_with(name, 'nn.Module: ') THEN {python} ELSE {[x for x in python if x == 'python']} END"
        branches.append(f"SELECT * FROM (SELECT run_id, unnest({kinds}) AS source, function_id AS frame_id, name, pid, tid, "
                        "start_ns, end_ns "
                        f"FROM python_functions WHERE {of_run} AND {timed})")
    return " UNION ALL ".join(branches)


def host_frames_sql(runs: str | None = None, sources: tuple[str, ...] = FRAME_SOURCES) -> str:
    """The host_frames view's query; with `runs` (a condition on `run_id`), those runs' only.

    One sweep per thread and source over the frames' starts and ends in _BOUNDARY_ORDER: a
    frame's depth is the number of frames open when it starts (it excluded), and its parent the
    frame of one level less that started last before it (an ASOF join on the boundary's
    position). Exact when a thread's frames nest, as push/pop ranges and Kineto's events do; a
    start/end range that overlaps another only in part takes the depth of those open at its start.
    With `sources`, the frames of those sources only."""
    return f"""
        WITH frames AS (
            {frame_rows_sql(runs, sources)}
        ), boundaries AS (
            SELECT *, start_ns AS t, 1 AS phase FROM frames
            UNION ALL
            SELECT *, end_ns, CASE WHEN end_ns > start_ns THEN 0 ELSE 2 END FROM frames
        ), swept AS (
            SELECT {_FRAME_THREAD}, frame_id, name, start_ns, end_ns, phase, row_number() OVER w AS seq,
                   sum(CASE phase WHEN 1 THEN 1 ELSE -1 END) OVER (w ROWS UNBOUNDED PRECEDING) AS open
            FROM boundaries
            WINDOW w AS (PARTITION BY {_FRAME_THREAD} ORDER BY {_BOUNDARY_ORDER})
        ), opened AS MATERIALIZED (  -- (read twice: computed once)
            SELECT {_FRAME_THREAD}, frame_id, name, start_ns, end_ns, seq, open - 1 AS depth FROM swept WHERE phase = 1
        )
        SELECT f.run_id, f.source, f.frame_id, f.name, f.pid, f.tid, f.start_ns, f.end_ns, f.depth,
               p.frame_id AS parent_id
        FROM opened f ASOF LEFT JOIN opened p
          ON p.run_id = f.run_id AND p.source = f.source AND p.pid = f.pid AND p.tid = f.tid
         AND p.depth = f.depth - 1 AND p.seq < f.seq
        """


def frame_steps_sql(frames: str) -> str:
    """The frame_steps view's query over `frames` (a relation with host_frames' columns): per
    thread and source, at each time a frame starts or ends, the innermost frame open from then on:
    after a start the frame itself, after an end its parent; of several boundaries at one time,
    the last in _BOUNDARY_ORDER."""
    return f"""
        WITH frames AS MATERIALIZED (  -- (read twice: computed once)
            SELECT {_FRAME_THREAD}, frame_id, start_ns, end_ns, parent_id FROM {frames}
        ), boundaries AS (
            SELECT {_FRAME_THREAD}, frame_id, start_ns, end_ns, start_ns AS t, 1 AS phase, frame_id AS inside
            FROM frames
            UNION ALL
            SELECT {_FRAME_THREAD}, frame_id, start_ns, end_ns, end_ns, CASE WHEN end_ns > start_ns THEN 0 ELSE 2 END,
                   parent_id
            FROM frames
        )
        SELECT {_FRAME_THREAD}, t AS from_ns,
               arg_max(inside, ({_BOUNDARY_ORDER.replace('t, ', '', 1)})) AS frame_id
        FROM boundaries GROUP BY {_FRAME_THREAD}, t
        """


# Per source of host_frames: launch_context's column prefix, and the table and id of its names.
_CONTEXT_COLUMNS = {"range": ("range", "ranges", "range_id"), "op": ("op", "cpu_ops", "op_id"),
                    "module": ("module", "python_functions", "function_id"),
                    "python": ("function", "python_functions", "function_id")}


def launch_context_column(source: str) -> str:
    """The launch_context column holding the innermost frame of `source` (`op` -> `op_id`)."""
    return f"{_CONTEXT_COLUMNS[source][0]}_id"


def launch_probes_sql(runs: str | None = None) -> str:
    """Each GPU operation's launch point (of the runs `runs` selects): run_id, kind, item_id, the
    launching thread's pid and tid, its launch call's start and end and `at_ns`, the time it is
    placed at: for an operation of a graph replay merged with its capture (`graph_nodes`, placed),
    where the capture launched its node, on the copied frames' thread; else the call's start,
    else (a Kineto kernel with no call but an External id) the start of the operator of that id,
    on that operator's thread."""
    of_run = runs or "true"
    return f"""
        WITH ops AS (
            SELECT a.run_id, a.kind, a.item_id, a.launch_call_id, a.external_id
            FROM gpu_activity a WHERE {_qualified(of_run, 'a')}
        ), op_of_external AS (  -- the operator a Kineto External id names (the first, should two share it)
            SELECT c.run_id, c.external_id, arg_min({{'pid': c.pid, 'tid': c.tid, 'start_ns': c.start_ns}}, c.op_id) AS op
            FROM cpu_ops c SEMI JOIN ops o ON o.launch_call_id IS NULL AND o.run_id = c.run_id
                                          AND o.external_id = c.external_id
            WHERE {_qualified(of_run, 'c')} GROUP BY ALL
        )
        SELECT o.run_id, o.kind, o.item_id, coalesce(g.pid, c.pid, x.op.pid) AS pid,
               coalesce(g.tid, c.tid, x.op.tid) AS tid, c.start_ns AS call_start_ns, c.end_ns AS call_end_ns,
               coalesce(g.at_ns, c.start_ns, x.op.start_ns) AS at_ns
        FROM ops o
        LEFT JOIN (SELECT * FROM api_calls WHERE {of_run}) c ON c.run_id = o.run_id AND c.call_id = o.launch_call_id
        LEFT JOIN op_of_external x ON o.launch_call_id IS NULL AND x.run_id = o.run_id AND x.external_id = o.external_id
        LEFT JOIN (SELECT run_id, kind, item_id, pid, tid, at_ns FROM graph_nodes WHERE placed AND {of_run}) g
          ON g.run_id = o.run_id AND g.kind = o.kind AND g.item_id = o.item_id
        """


def launch_context_sql(runs: str | None = None, sources: tuple[str, ...] = FRAME_SOURCES,
                       names: bool = True) -> str:
    """The launch_context view's query; with `runs` (a condition on `run_id`), those runs' only.

    Each GPU operation is placed at its launch call's start on the call's thread (a kernel with
    no call found but a Kineto External id: at the start of the operator with that id). Then one
    sweep per thread and source over the frames' starts and ends and these launch points
    together, in _BOUNDARY_ORDER with a launch after the boundaries at its time: the innermost
    frame open at a launch is the last frame to start at the launch's depth (the count of frames
    open) before it. With frames that nest, a frame that started later at that depth closed
    before the launch (it could not start while the innermost one was open). Where frames
    overlap only in part, the frame found may have closed already: then none is named.
    Zero-length frames contain no launch and are left out of the sweep.
    The sweep carries numbers only (a thread-and-source number, a launch's number, a frame's
    id): the operations' columns, kernel names of hundreds of characters among them, join on
    at the end, so the sort holds a few integers a row.
    With `sources`, those sources' columns only; without `names`, the frames' ids only."""
    of_run = runs or "true"
    columns, joins = [], []
    for source in sources:
        column, table, key = _CONTEXT_COLUMNS[source]
        columns.append(f"x.{column}_id")
        if names:
            joins.append(f"""
            LEFT JOIN (SELECT run_id, {key}, name FROM {table} WHERE {of_run}) n_{column}
              ON n_{column}.run_id = o.run_id AND n_{column}.{key} = x.{column}_id""")
            columns.append(f"n_{column}.name AS {column}_name")
    pivot = ", ".join(f"any_value(pl.frame_id) FILTER (WHERE h.source = '{source}') AS {_CONTEXT_COLUMNS[source][0]}_id"
                      for source in sources)
    return f"""
        WITH ops AS (
            SELECT a.run_id, a.kind, a.item_id, a.device_id, a.stream_id, a.start_ns, a.end_ns, a.name,
                   a.launch_call_id, a.external_id
            FROM gpu_activity a WHERE {_qualified(of_run, 'a')}
        ), probes AS MATERIALIZED (  -- each operation's launch point, numbered (read twice: computed once)
            SELECT *, row_number() OVER () AS probe FROM ({launch_probes_sql(runs)})
        ), frames AS (
            SELECT run_id, source, frame_id, pid, tid, start_ns, end_ns
            FROM ({frame_rows_sql(runs, sources)}) WHERE end_ns > start_ns
        ), threads AS MATERIALIZED (  -- each thread and source with frames, numbered once for all three readers
            SELECT {_FRAME_THREAD}, row_number() OVER () AS thread FROM (SELECT DISTINCT {_FRAME_THREAD} FROM frames)
        ), numbered AS MATERIALIZED (  -- (read twice: computed once)
            SELECT h.thread, f.frame_id, f.start_ns, f.end_ns FROM frames f JOIN threads h USING ({_FRAME_THREAD})
        ), points AS (  -- a boundary (phase 0: an end, 1: a start) or a launch (2), per thread and source
            SELECT thread, start_ns AS t, 1 AS phase, -end_ns AS tie, frame_id AS ord, frame_id AS ref, end_ns
            FROM numbered
            UNION ALL
            SELECT thread, end_ns, 0, -start_ns, -frame_id, NULL, NULL FROM numbered
            UNION ALL
            SELECT h.thread, p.at_ns, 2, 0, 0, p.probe, NULL
            FROM probes p JOIN threads h ON h.run_id = p.run_id AND h.pid = p.pid AND h.tid = p.tid
            WHERE p.at_ns IS NOT NULL
        ), swept AS (
            SELECT *, row_number() OVER w AS seq,
                   sum(CASE phase WHEN 1 THEN 1 WHEN 0 THEN -1 ELSE 0 END) OVER (w ROWS UNBOUNDED PRECEDING) AS open
            FROM points WINDOW w AS (PARTITION BY thread ORDER BY t, phase, tie, ord)
        ), starts AS (
            SELECT thread, open, seq, ref AS frame_id, end_ns FROM swept WHERE phase = 1
        ), placed AS (
            SELECT l.thread, l.ref AS probe, CASE WHEN s.end_ns > l.t THEN s.frame_id END AS frame_id
            FROM (SELECT * FROM swept WHERE phase = 2 AND open > 0) l
            ASOF JOIN starts s ON s.thread = l.thread AND s.open = l.open AND s.seq < l.seq
        ), innermost AS (
            SELECT pl.probe, {pivot} FROM placed pl JOIN threads h USING (thread) GROUP BY ALL
        )
        SELECT o.run_id, o.kind, o.item_id, o.device_id, o.stream_id, o.start_ns, o.end_ns, o.name, o.launch_call_id,
               p.pid, p.tid, p.call_start_ns, p.call_end_ns, {', '.join(columns)}
        FROM ops o
        JOIN probes p ON p.run_id = o.run_id AND p.kind = o.kind AND p.item_id = o.item_id
        LEFT JOIN innermost x ON x.probe = p.probe{''.join(joins)}
        """


# The compiled regions and graph calls a launch can sit in (compiled_places).
COMPILED_REGION_OPS = "(name LIKE 'Torch-Compiled Region%' OR name IN ('CompiledFunction', 'CompiledFunctionBackward'))"
COMPILED_GRAPH_CALL = r"^## Call CompiledFxGraph (\S+) ##$"


def compiled_places(ids: str) -> str:
    """For the (run_id, external_id) pairs `ids` selects, the operator that launched the kernels of
    that Kineto `External id` (the one holding Inductor's record, `kernel_meta`, else the latest to
    start) and the compiled region and graph call open on its thread when it began: run_id,
    external_id, op_id, kernel_meta, region_op_id, region_name, graph_range_id, graph_hash (the
    innermost of each)."""
    return f"""
    WITH ids AS MATERIALIZED ({ids}), launchers AS (
        SELECT o.run_id, o.external_id,
               arg_max({{'op_id': o.op_id, 'pid': o.pid, 'tid': o.tid, 'start_ns': o.start_ns,
                         'kernel_meta': o.kernel_meta}}, (o.kernel_meta IS NOT NULL, o.start_ns, o.op_id)) AS op
        FROM cpu_ops o SEMI JOIN ids e ON e.run_id = o.run_id AND e.external_id = o.external_id
        GROUP BY o.run_id, o.external_id
    ), regions AS (
        SELECT run_id, op_id AS id, name, pid, tid, start_ns, end_ns FROM cpu_ops
        WHERE run_id IN (SELECT run_id FROM ids) AND {COMPILED_REGION_OPS}
    ), graph_calls AS (
        SELECT run_id, range_id AS id, regexp_extract(name, '{COMPILED_GRAPH_CALL}', 1) AS hash, pid, tid, start_ns, end_ns
        FROM ranges WHERE kind = 'user_annotation' AND name LIKE '## Call CompiledFxGraph %'
          AND run_id IN (SELECT run_id FROM ids)
    ), placed AS (
        SELECT l.run_id, l.external_id, l.op,
               (SELECT arg_max({{'id': r.id, 'name': r.name}}, (r.start_ns, r.id)) FROM regions r
                WHERE r.run_id = l.run_id AND r.pid IS NOT DISTINCT FROM l.op.pid AND r.tid IS NOT DISTINCT FROM l.op.tid
                  AND r.start_ns <= l.op.start_ns AND r.end_ns >= l.op.start_ns) AS region,
               (SELECT arg_max({{'id': g.id, 'hash': g.hash}}, (g.start_ns, g.id)) FROM graph_calls g
                WHERE g.run_id = l.run_id AND g.pid IS NOT DISTINCT FROM l.op.pid AND g.tid IS NOT DISTINCT FROM l.op.tid
                  AND g.start_ns <= l.op.start_ns AND g.end_ns >= l.op.start_ns) AS graph
        FROM launchers l
    )
    SELECT run_id, external_id, op.op_id AS op_id, op.kernel_meta AS kernel_meta, region.id AS region_op_id,
           region.name AS region_name, graph.id AS graph_range_id, nullif(graph.hash, '') AS graph_hash
    FROM placed
    """


VIEWS: dict[str, tuple[str, str]] = {
    "gpu_activity": (
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
    ),
    "graph_replays": (
        "Per run, each CUDA/HIP graph replay: a graph launch call (`cudaGraphLaunch`, `hipGraphLaunch`) and the "
        "kernels, copies and memsets it ran (those whose `launch_call_id` is the call), with `graph`, the graph it "
        "replayed: CUPTI's `graph_id` where the trace has it (`g<id>`), else a digest of the operations' kinds and "
        "names in order (`s<hex>`: replays of one graph run the same operations), and, where a capture was merged "
        "or an nsys export placed its nodes (`graph_nodes`), how many of its operations were placed; `whole_graph` "
        "when the replay is one opaque row "
        "(nsys `--cuda-graph-trace=graph`). The launch call's time (`call_ns`) is the "
        "host's cost of the replay, once for all its operations.",
        """
        SELECT c.run_id, c.call_id, any_value(c.name) AS call_name, any_value(c.pid) AS pid, any_value(c.tid) AS tid,
               any_value(c.start_ns) AS call_start_ns, any_value(c.end_ns) AS call_end_ns,
               any_value(c.end_ns - c.start_ns) AS call_ns,
               coalesce('g' || max(k.graph_id)::VARCHAR,
                        's' || substr(md5(string_agg(a.kind || ':' || coalesce(a.name, ''), chr(31)
                                                     ORDER BY a.start_ns, a.kind, a.item_id)), 1, 12)) AS graph,
               any_value(a.device_id) AS device_id, count(*) AS ops,
               count(*) FILTER (WHERE a.kind = 'kernel') AS kernels,
               count(*) FILTER (WHERE a.kind = 'copy') AS copies, count(*) FILTER (WHERE a.kind = 'memset') AS memsets,
               min(a.start_ns) AS start_ns, max(a.end_ns) AS end_ns,
               coalesce(sum(a.end_ns - a.start_ns) FILTER (WHERE a.kind = 'kernel'), 0) AS kernel_ns,
               sum(a.end_ns - a.start_ns) AS gpu_ns,
               count(g.item_id) FILTER (WHERE g.placed) AS placed, count(g.item_id) AS merged,
               -- nsys --cuda-graph-trace=graph: one opaque row for the whole replay (ingest/nsys.py)
               bool_or(k.graph_id IS NOT NULL AND k.short_name = '[CUDA graph]') AS whole_graph
        FROM api_calls c
        JOIN gpu_activity a ON a.run_id = c.run_id AND a.launch_call_id = c.call_id
        LEFT JOIN kernels k ON a.kind = 'kernel' AND k.run_id = a.run_id AND k.kernel_id = a.item_id
        LEFT JOIN graph_nodes g ON g.run_id = a.run_id AND g.kind = a.kind AND g.item_id = a.item_id
        WHERE c.name ILIKE '%graphlaunch%'
        GROUP BY c.run_id, c.call_id
        """,
    ),
    "device_busy_intervals": (
        "Per run and device, the union of all GPU activity as disjoint busy intervals "
        "(gaps-and-islands over `gpu_activity`), with `busy_before_ns`, the busy time before each "
        "(busy time in any window = a difference of two such running totals, read by ASOF joins).",
        _busy_intervals(),
    ),
    "kernel_busy_intervals": (
        "Per run and device, the union of kernel execution only (what copies can hide behind), "
        "with `busy_before_ns` as in `device_busy_intervals`.",
        _busy_intervals(kernels_only=True),
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
        _device_idle_gaps(_busy_intervals(successors=True)),
    ),
    "run_idle_gaps": (
        "Per run, the stretches during which no GPU of the run had work: the gaps in the union of all "
        "GPU activity over every device, with `gap_ns` (before the first and after the last operation "
        "is not a gap).",
        _run_idle_gaps(),
    ),
    "kernel_names": (
        "Per run, each distinct kernel name with `name_key`, a small integer (in name order) that "
        "joins, sorts and groups far cheaper than the long demangled name.",
        """
        SELECT run_id, row_number() OVER (PARTITION BY run_id ORDER BY name) AS name_key, name
        FROM (SELECT DISTINCT run_id, name FROM kernels WHERE name IS NOT NULL)
        """,
    ),
    "compiled_kernels": (
        "Every execution of a TorchInductor kernel (a kernel whose name `inductor_class` gives a class): "
        "`kernel_id`, `device_id`, `stream_id`, `start_ns`, `end_ns`, `name`, `kernel_class` (`pointwise`, "
        "`reduction`, `persistent_reduction`, `template`, ...), `fused_ops` (the operators the name says it "
        "fused, `inductor_ops`), and where the trace records them: the operator that launched it (`op_id`, by "
        "Kineto `External id`; Inductor names it after the kernel) with its `kernel_meta`; the innermost "
        "compiled region open at that launch on its thread (`region_op_id`, `region_name`: an operator named "
        "`Torch-Compiled Region: F/C` (Dynamo frame F, compile C) or AOTAutograd's `CompiledFunction` / "
        "`CompiledFunctionBackward`); and the compiled graph's call (`graph_range_id`, `graph_hash`: the "
        "`## Call CompiledFxGraph <hash> ##` annotation). One call of a graph is one `graph_range_id` (else "
        "`region_op_id`): kernels of two calls were compiled apart.",
        f"""
        WITH names AS (
            SELECT run_id, name, inductor_class(name) AS kernel_class, inductor_ops(name) AS fused_ops
            FROM kernel_names WHERE inductor_class(name) IS NOT NULL
        ), ks AS (
            SELECT k.run_id, k.kernel_id, k.device_id, k.stream_id, k.start_ns, k.end_ns, k.name, n.kernel_class,
                   n.fused_ops, k.external_id
            FROM kernels k JOIN names n ON n.run_id = k.run_id AND n.name = k.name
        ), placed AS (
            {compiled_places("SELECT DISTINCT run_id, external_id FROM ks WHERE external_id IS NOT NULL")}
        )
        SELECT k.run_id, k.kernel_id, k.device_id, k.stream_id, k.start_ns, k.end_ns, k.name, k.kernel_class,
               k.fused_ops, p.op_id, p.kernel_meta, p.region_op_id, p.region_name, p.graph_range_id, p.graph_hash
        FROM ks k LEFT JOIN placed p ON p.run_id = k.run_id AND p.external_id = k.external_id
        """,
    ),
    "kernel_launches": (
        "Every kernel with the host call that launched it (`api_calls` by `launch_call_id`): the "
        "kernel's device, `name_key` and grid and block, the call's id, pid, tid, start and end.",
        _kernel_launches(),
    ),
    "stream_ops": (
        "Every timed GPU operation a stream was given (unified-memory page migrations left out), in "
        "stream order (per run, device and stream, by start, end, id), with its position `seq`, a kernel's `name_key`, `external_id` and `threads`, the latest end of "
        "the stream's earlier operations (`prev_max_end_ns`) and the previous operation's kind, id, "
        "start, end and name key.",
        _stream_ops(),
    ),
    "steps": (
        "Per run, the iteration ranges on the host: Kineto `ProfilerStep#N` when the run has them, else "
        "NVTX or user annotations named like a step or iteration (`step`, `iter`, `iteration` as a word). "
        "The GPU-side copies Kineto also writes (`gpu_user_annotation`) are not steps of their own.",
        # Names are matched once each, not once per range (24 M NVTX ranges: 0.5 s, against 3-4 s);
        # an inner join and a window by run, not a semi join and a subquery, so that a filter
        # on the run reaches both scans of `ranges`.
        f"""
        WITH names AS (
            SELECT run_id, name, regexp_matches(name, '{PROFILER_STEP}') AS profiler_step,
                   regexp_matches(name, '(?i)(^|[^a-z])(step|iteration|iter)([^a-z]|$)') AS step_like
            FROM (SELECT DISTINCT run_id, name FROM ranges)
        ), step_names AS (  -- one (run, name) each
            SELECT run_id, name FROM (
                SELECT *, bool_or(profiler_step) OVER (PARTITION BY run_id) AS run_has_profiler_steps FROM names)
            WHERE profiler_step OR (step_like AND NOT run_has_profiler_steps)
        )
        SELECT r.run_id, r.range_id, r.name, r.start_ns, r.end_ns FROM ranges r
        JOIN step_names s ON s.run_id = r.run_id AND s.name = r.name
        WHERE r.kind IN ('user_annotation', 'nvtx') AND r.end_ns > r.start_ns
        """,
    ),
    "kernel_durations": (
        "Every kernel (all the columns of `kernels`) with `duration_ns`, its time on the GPU: end minus "
        "start on a timeline (nsys, Kineto); for Nsight Compute, which has no timeline, the launch's "
        f"`{NCU_DURATION}` metric. NULL when neither is known.",
        f"""
        SELECT k.*, CASE WHEN k.end_ns >= k.start_ns THEN k.end_ns - k.start_ns ELSE m.duration_ns END AS duration_ns
        FROM kernels k LEFT JOIN (SELECT run_id, kernel_id, max(value) AS duration_ns FROM kernel_metrics
                                  WHERE metric_id = '{NCU_DURATION}' GROUP BY run_id, kernel_id) m
          ON m.run_id = k.run_id AND m.kernel_id = k.kernel_id
        """,
    ),
    "memory_levels": (
        "Per run and device (`device_type`, `device_id`), every allocator event with a time and a size, in "
        "time order (`seq`; `next_ts_ns` is the next event's time), with the memory allocated after it, "
        "`allocated_bytes`: the allocator's own total when every event of the device has one "
        "(`has_totals`), else the running sum of signed sizes lifted by `before_trace_bytes`, what frees "
        "show was allocated before the trace began (so it never goes below 0). `reserved_bytes`: the "
        "allocator's reserved total, when every event of the device has it. Peak memory is the highest "
        "`allocated_bytes` of a device (rule M001, the report's memory plot, `diff`).",
        """
        WITH running AS (
            SELECT run_id, device_type, device_id, event_id, ts_ns, bytes, address, pid, tid,
                   total_allocated_bytes, total_reserved_bytes,
                   row_number() OVER w AS seq, lead(ts_ns) OVER w AS next_ts_ns,
                   sum(bytes) OVER (w ROWS UNBOUNDED PRECEDING) AS cum_bytes
            FROM memory_events WHERE ts_ns IS NOT NULL AND bytes IS NOT NULL
            WINDOW w AS (PARTITION BY run_id, device_type, device_id ORDER BY ts_ns, event_id)
        ), per_device AS (
            SELECT run_id, device_type, device_id,
                   count(total_allocated_bytes) = count(*) AS has_totals,
                   count(total_reserved_bytes) = count(*) AS has_reserved,
                   -- the running sum starts at 0 with the trace; frees of older blocks drive it
                   -- below 0, which bounds what was there before
                   greatest(0, -min(cum_bytes)) AS sum_baseline,
                   arg_min(total_allocated_bytes - bytes, seq) AS totals_baseline
            FROM running GROUP BY run_id, device_type, device_id
        )
        SELECT r.* EXCLUDE (cum_bytes), d.has_totals,
               CASE WHEN d.has_totals THEN r.total_allocated_bytes ELSE r.cum_bytes + d.sum_baseline END AS allocated_bytes,
               CASE WHEN d.has_reserved THEN r.total_reserved_bytes END AS reserved_bytes,
               CASE WHEN d.has_totals THEN d.totals_baseline ELSE d.sum_baseline END AS before_trace_bytes
        FROM running r JOIN per_device d USING (run_id, device_type, device_id)
        """,
    ),
    "time_budget": (
        "Per run and device, where the device's span (first GPU operation's start to last one's end) "
        "went: every nanosecond counted once, as `compute` (kernels), `communication` (collective "
        "kernels: NCCL, RCCL, all-reduce), `copy`, `memset` (overlap between streams resolved in that "
        "order of priority) or `idle`; idle split by `cause`, from the operation that ends each idle "
        "stretch and its launch call: until the launch call returned (the work was not issued yet), "
        "`sync` (the time the launching thread spent in blocking calls, a synchronize or a synchronous "
        "copy, one it was in when the device went idle or entered before the launch) and `host` (the "
        "rest); then `dependency` (the rest: issued, the work waited on something else: another "
        "stream, an event, the launch latency); all `unknown` without a launch call. `ns` per part; the parts of a device sum to `span_ns`.",
        _time_budget(),
    ),
    "warmup_windows": (
        "Per run and device, the windows of warm-up and one-time costs, each with its `reason` (and the "
        "call's or range's `name` where it has one), clipped to the device's span: `range named warm-up` "
        "(NVTX or user-annotation ranges, PyTorch operators or Python functions named `warm-up`, `warmup` "
        "or `warm_up`, extended on each device to the end of the GPU work launched inside them from their "
        "thread), `JIT compilation` (frames named like nvFuser's `compileFusion`, NVRTC, Inductor's "
        "`compile_fx_inner`, likewise extended, each a process's first of its name or one before the "
        "device's first kernel; and `nvrtc*`/`hiprtc*` calls), `lazy module loading` "
        "(`cuModuleLoad*`, `cuLibraryLoad*`, `cudaGetFuncBySymbol`, `hipModuleLoad*` calls), `cudaFree` or "
        "`hipFree`; each call a process's first of its name or one before the device's first kernel (a "
        "load again later is a recompile: rule S001), at least "
        f"{WARMUP_MIN_CALL_NS // 1000} us and on the devices of its process (every device where none has its "
        "process id); `first launch` (a kernel's first launch call per process that takes at least "
        f"{FIRST_LAUNCH_MIN_NS // 1_000_000} ms and {FIRST_LAUNCH_FACTOR}x the median of the kernel's later launch "
        "calls (of the run's launch calls, for a kernel launched once): "
        "module loading, a library's first call); `uploads before the first kernel` (a device's span up "
        "to its first kernel, when it begins with copies or memsets before the first of the run's steps (2 "
        "or more), or in a "
        "run with a range named warm-up: a run that repeats its work, whose uploads before it are set-up; "
        "in a program that runs once, its uploads are its work); `first step` (the "
        f"leading steps of the `steps` view longer than {WARMUP_STEP_FACTOR}x the median of the steps after "
        "the first, at most half of them, of runs with 3 steps or more, as `traceanalyzer summary` sets "
        "warm-up steps apart). Windows may overlap; `run_warmup_budget` merges them. The diagnosis "
        "weighs losses against the steady state (the span outside them), and the timeline rules that claim "
        "idle time leave their time out.",
        _warmup_windows(None),
    ),
    "host_frames": (
        "Every host frame a GPU operation's launch can sit in, per run and thread, by `source`: `range` (NVTX "
        "push/pop and start/end ranges, Kineto `user_annotation`; marks and GPU-side annotations left out; a range "
        "never closed lasts to the run's end), `op` (PyTorch operators, `cpu_ops`), `module` (the `nn.Module: ...` "
        "frames of the Python stack) and `python` (every Python frame, `python_functions`). `frame_id` is the "
        "row id in its table (`range_id`, `op_id`, `function_id`); `depth` counts the frames of the same source "
        "open on the thread when it starts (0: outermost) and `parent_id` is the innermost of them. Frames are "
        "taken to nest on a thread, as push/pop ranges and Kineto's events do. A start/end range is on the thread "
        "that started it (nsys's projection leaves out those ended on another thread; the store does not record "
        "the thread that ended one).",
        host_frames_sql(),
    ),
    "frame_steps": (
        "Per run, thread (`pid`, `tid`) and `source` of `host_frames`: from each `from_ns` on (until the next "
        "row's), the innermost frame open (`frame_id`, NULL: none). An ASOF join on `from_ns <= t` gives the "
        "frames around any host time `t`, e.g. an allocator event's.",
        frame_steps_sql("host_frames"),
    ),
    "launch_context": (
        "Every GPU operation of `gpu_activity` (kernels, copies, memsets) with the host call that launched it "
        "(`launch_call_id`, its thread `pid`/`tid`, `call_start_ns`, `call_end_ns`) and, of each source of "
        "`host_frames`, the innermost frame open on that thread when the call began: `range_id`/`range_name`, "
        "`op_id`/`op_name`, `module_id`/`module_name`, `function_id`/`function_name` (their enclosing frames "
        "through `host_frames.parent_id`). A frame open at the call's start contains the call, as nsys's "
        "`nvtx_gpu_proj_*` reports define it (they read runtime-API launches only; a kernel launched by a driver "
        "call, `cuLaunchKernel` as Triton does, is placed here too). A kernel without a launch call but with a "
        "Kineto `External id` is placed at the start of the operator of that id (HTA's link), on its thread.",
        launch_context_sql(),
    ),
    "stall_profiles": (
        "Per run and kernel (by name), the warp-stall profile from Nsight Compute's stall metrics: per "
        "launch the metrics of the most direct family it has (`family` 1-4: "
        "`smsp__average_warps_issue_stalled_*_per_issue_active.ratio`, "
        "`smsp__warp_issue_stalled_*_per_warp_active.pct`, `smsp__average_warp_latency_issue_stalled_*`, "
        "`smsp__pcsamp_warps_issue_stalled_*`) as shares summing to 1 (`selected`, the issuing state, left "
        "out), averaged over the kernel's launches (`profile`, JSON reason -> share); the top `reason` and "
        "its `share`; `issue_active` (issue slots busy per cycle), `duration_ns` (of all launches), and "
        "`est_loss_ns` = duration x (1 - issue active) x share. Rule I001 reports the dominant ones.",
        _stall_profiles(),
    ),
}

def _sql_format(template: str, *args: str) -> str:
    """A Python "{} ... {}" template as a SQL text expression of `args`."""
    parts = template.split("{}")
    assert len(parts) == len(args) + 1
    out = ["'" + parts[0].replace("'", "''") + "'"]
    for arg, part in zip(args, parts[1:]):
        out += [arg, "'" + part.replace("'", "''") + "'"]
    return "(" + " || ".join(out) + ")"


# Small helpers so a rule's SQL can write its own one-line message and evidence.
MACROS: dict[str, str] = {
    # As fmt.ns and fmt.nbytes: rounded to three significant digits before the unit is chosen
    # (999.95 us reads 1 ms), never in scientific notation (15,000 s).
    "fmt_sig3": "(x) AS CASE WHEN abs(x) >= 1000 THEN printf('%,.0f', x) ELSE printf('%.3g', x) END",
    "fmt_ns_rounded": """(x) AS CASE WHEN x IS NULL THEN '-'
        WHEN abs(x) >= 1e9 THEN fmt_sig3(x / 1e9) || ' s'
        WHEN abs(x) >= 1e6 THEN fmt_sig3(x / 1e6) || ' ms'
        WHEN abs(x) >= 1e3 THEN fmt_sig3(x / 1e3) || ' us'
        ELSE printf('%d ns', CAST(round(x) AS BIGINT)) END""",
    "fmt_ns": "(x) AS fmt_ns_rounded(CAST(printf('%.3g', CAST(x AS DOUBLE)) AS DOUBLE))",
    "fmt_bytes_rounded": """(x) AS CASE WHEN x IS NULL THEN '-'
        WHEN abs(x) >= 1e15 THEN fmt_sig3(x / 1e15) || ' PB'
        WHEN abs(x) >= 1e12 THEN fmt_sig3(x / 1e12) || ' TB'
        WHEN abs(x) >= 1e9 THEN fmt_sig3(x / 1e9) || ' GB'
        WHEN abs(x) >= 1e6 THEN fmt_sig3(x / 1e6) || ' MB'
        WHEN abs(x) >= 1e3 THEN fmt_sig3(x / 1e3) || ' KB'
        ELSE printf('%d B', CAST(x AS BIGINT)) END""",
    "fmt_bytes": "(x) AS fmt_bytes_rounded(CAST(printf('%.3g', CAST(x AS DOUBLE)) AS DOUBLE))",
    "fmt_pct": "(x) AS CASE WHEN x IS NULL THEN '-' ELSE printf('%.1f%%', 100 * x) END",
    # fmt.loss_bound: "est. loss at most the 22.4 ms of kernel time that could have hidden it"
    "fmt_loss_bound": "(x, what) AS " + _sql_format(LOSS_BOUND, "fmt_ns(x)", "what"),
    # How many rows a bounded `arg_max(x, key, n)` heap keeps for a list of at most n examples:
    # at least one (the heap needs n >= 1; slice the result with [1:n] for n < 1).
    "heap_size": "(n) AS CAST(greatest(floor(n), 1) AS BIGINT)",
    # A TorchInductor kernel's class and fused operators, from its name (kernel_library.py).
    **KERNEL_NAME_MACROS,
}

# Views of some runs, computed from those runs' rows only: `run_time_budget('<run id>')` and
# `runs_time_budget(['<id>', ...])` are `time_budget` filtered on the runs (see `_time_budget`);
# `run_step_budget('<run id>')` is one run's budget per step (see `_step_budget`).
# Created after the views they read.
TABLE_MACROS: dict[str, str] = {
    "run_time_budget": f"(rid) AS TABLE {_time_budget('run_id = rid')}",
    "run_window_time_budget": f"(rid, win_device_id, win_lo_ns, win_hi_ns) AS TABLE "
                              f"{_time_budget('run_id = rid', window=True)}",
    "runs_time_budget": f"(rids) AS TABLE {_time_budget('list_contains(rids, run_id)')}",
    "run_step_budget": f"(rid) AS TABLE {_step_budget('run_id = rid')}",
    "run_warmup_windows": f"(rid) AS TABLE {_warmup_windows('run_id = rid')}",
    "run_warmup_budget": f"(rid) AS TABLE {_warmup_budget('run_id = rid', 'SELECT rid AS run_id, * FROM run_warmup_windows(rid)')}",
    "run_host_frames": f"(rid) AS TABLE {host_frames_sql('run_id = rid')}",
    "run_frame_steps": f"(rid) AS TABLE {frame_steps_sql('run_host_frames(rid)')}",
    "run_launch_context": f"(rid) AS TABLE {launch_context_sql('run_id = rid')}",
}
TABLE_MACRO_DOCS: dict[str, str] = {
    "run_time_budget": "`time_budget` of one run, computed from its rows only: `SELECT * FROM run_time_budget('<run id>')`.",
    "run_window_time_budget": "`time_budget` of one device of one run within a window of time [lo, hi), "
                              "cut at starts of the device's operations: the parts of consecutive windows "
                              "add up to the device's whole budget (a big run's budget is computed so, one "
                              "window of about a million operations at a time): "
                              "`SELECT * FROM run_window_time_budget('<run id>', 0, 1000, 2000)`.",
    "runs_time_budget": "`time_budget` of the runs listed: `runs_time_budget(['<id>', ...])`.",
    "run_step_budget": "One run's time budget per step (the `steps` view) and device: `run_id`, `step_id` "
                       "(`ranges.range_id`), `step` (its name), `step_start_ns`, `device_id`, `category`, `cause`, "
                       "`ns` (parts with time only), and `span_ns`, the step's window inside the device's span, "
                       "which its parts sum to.",
    "run_warmup_windows": "`warmup_windows` of one run, computed from its rows only: `run_warmup_windows('<run id>')`.",
    "run_warmup_budget": "One run's time inside its warm-up windows (`warmup_windows`, merged per device), by part of "
                         "the time budget: `run_id`, `device_id`, `category`, `cause`, `ns` (parts with time only). "
                         "The budget's parts less these are the steady state's.",
    "run_host_frames": "`host_frames` of one run, computed from its rows only: `run_host_frames('<run id>')`.",
    "run_frame_steps": "`frame_steps` of one run: `run_frame_steps('<run id>')`.",
    "run_launch_context": "`launch_context` of one run: `run_launch_context('<run id>')`.",
}


def markdown() -> str:
    """The views and table macros section of docs/schema.md (gendocs)."""
    out = ["## Views", "",
           "Every connection to a store has these views over the tables (`traceanalyzer/store/views.py`).", "",
           "| view | what it holds |", "|---|---|"]
    out += [f"| `{name}` | {doc} |" for name, (doc, _) in VIEWS.items()]
    out += ["", "Table macros compute a view for some runs only, from their rows:", "",
            "| macro | what it returns |", "|---|---|"]
    out += [f"| `{name}` | {TABLE_MACRO_DOCS[name]} |" for name in TABLE_MACROS]
    return "\n".join(out)


# DuckDB picks a nested-loop plan for an ASOF join, and a piecewise merge join for a range
# join, when it *estimates* a side small; its estimates for the rules' CTEs are often ~10
# rows where there are millions, and those plans are quadratic (T006 and T004 took minutes
# on 2.5 M kernels). Zero thresholds keep the sort-based ASOF and IEJoin operators, which
# cost next to nothing extra on small runs.
PLANNER_SETTINGS = {"asof_loop_join_threshold": 0, "merge_join_threshold": 0}


def install(con: duckdb.DuckDBPyConnection) -> None:
    """The planner settings, macros and views on `con` (TEMP: a connection's own). The table
    macros come at their first use (`install_table_macros`): DuckDB parses and binds what is
    created, and they are two thirds of the SQL, which most connections never call."""
    for name, value in PLANNER_SETTINGS.items():
        con.execute(f"SET {name} = {value}")
    for name, body in MACROS.items():
        con.execute(f"CREATE OR REPLACE TEMP MACRO {name}{body}")
    for name, (_, sql) in VIEWS.items():
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {sql}")


_with_table_macros: weakref.WeakSet = weakref.WeakSet()  # connections that have TABLE_MACROS


def install_table_macros(con: duckdb.DuckDBPyConnection) -> None:
    """TABLE_MACROS on `con`, once per connection."""
    if con in _with_table_macros:
        return
    for name, body in TABLE_MACROS.items():
        con.execute(f"CREATE OR REPLACE TEMP MACRO {name}{body}")
    _with_table_macros.add(con)


def names_table_macro(error: BaseException) -> bool:
    """Whether `error` is DuckDB's for a table macro not installed on the connection."""
    return isinstance(error, duckdb.CatalogException) and any(f"name {n} does not exist" in str(error)
                                                                for n in TABLE_MACROS)


# The views the rules read that cost a sort of all GPU work each time, in dependency order
# (later ones are computed from the cached earlier ones). stream_ops is the per-stream order
# T001 and S002 both need; kernel_names hashes the long names once for it and S002.
# kernel_launches (S001) is a join of every kernel with its launch call rather than a sort.
# T002 alone reads kernel_busy_intervals, and T004 run_idle_gaps, but a big run keeps its
# cache (KEEP_MIN_GPU_OPS), and there work paid once is work no later pass pays.
RUN_CACHED = ("device_busy_intervals", "device_busy", "device_idle_gaps", "kernel_busy_intervals",
              "run_idle_gaps", "kernel_names", "stream_ops", "kernel_launches", "warmup_windows")

# How the cache computes each table: one run's rows ($1) without the run_id column, which the
# view over the table takes from the one-row `<prefix>scope` (a run id on every row would cost
# a string per row to sort and store). Each is made by the generator of the view's own query
# (a view not listed here: its query filtered on the run), so a cached view and the store-wide
# one cannot disagree (tests/test_store.py compares them). The islands table also keeps each
# island's successor, so the idle gaps are the view's filter over it rather than another sort.
# `{cache}` is the prefix of the cached tables' names (see RunCache).
_RUN_CACHE_SQL = {
    "device_busy_intervals": _busy_intervals(successors=True, per_run=True),
    "device_idle_gaps": _device_idle_gaps("SELECT * FROM {cache}device_busy_intervals", per_run=True),
    "kernel_busy_intervals": _busy_intervals(kernels_only=True, per_run=True),
    "run_idle_gaps": _run_idle_gaps(per_run=True),
    "stream_ops": _stream_ops(per_run=True, sliced=True),
    "kernel_launches": _kernel_launches(per_run=True, sliced=True),
    "warmup_windows": f"SELECT * EXCLUDE (run_id) FROM ({_warmup_windows('run_id = $1')})",
}
_RUN_CACHE_HIDDEN = {"device_busy_intervals": " EXCLUDE (next_start_ns, first_start_ns)"}
# Tables built in slices of start time of about SLICE_GPU_OPS operations each, with the table
# that carries each slice's last rows into the next (or None). A window holds all of its input
# while it computes, and a hash join its whole build side (here every kernel, with its name):
# on 5 M kernels (6.3 M operations) building both took 1.9 GB above what the process held
# before, and ~0.65 GB in slices of 1 M, in the same time within the noise (5.5-6.0 s against
# 5.6 s; slices of 500 k: 0.5 GB, +1.2 s, the fixed cost of each slice's query).
_RUN_CACHE_SLICED = {"stream_ops": _STREAM_OPS_CARRY, "kernel_launches": None}
SLICE_GPU_OPS = 1_000_000
# Not stored: views over the cached tables, a filter of the islands, cheaper to scan again
# than to hold (5 M kernels: 250 MB).
_RUN_CACHE_VIEWS = ("device_idle_gaps",)
_cache_ids = itertools.count()

# A run with at least this many GPU operations keeps its cache in the store file, so later
# rule passes on it skip the sorts (5 M kernels: ~5 s of a ~13-18 s pass, for ~350 MB on
# disk; the dense Kineto trace 8x, 180 k operations: a stored run's check 4.0 s -> 2.3 s for
# 15 MB, the first check +0.1 s). Below it, the cache costs a few hundred ms to build (21 k
# operations: 0.2 s of a 1.2 s check) and is not worth the disk.
KEEP_MIN_GPU_OPS = 100_000
# Kept caches are tables `_ta_kept_<run_id>_<view>` listed in this table with the version of
# the cache's definition they were built by and the run's `ingested_at`; a cache of another
# version or ingest is not read, and is built again (its old tables dropped) the next time the
# run's rules run on a writable store.
KEPT_REGISTRY = "_ta_kept_cache"
CACHE_VERSION = hashlib.sha1(repr((RUN_CACHED, _RUN_CACHE_SQL, _RUN_CACHE_HIDDEN, _RUN_CACHE_VIEWS, _RUN_CACHE_SLICED,
                                   [VIEWS[n][1] for n in RUN_CACHED])).encode()).hexdigest()[:16]


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
                  keep: bool = False) -> Iterator[RunCache]:
    """Within the block, the RUN_CACHED views hold only `run_id`'s rows, computed once.

    The rules of one run each filter these views on that run; materializing them first
    turns ~10 recomputations (a window sort over every GPU operation each) into one.
    Outside the block (reports, cross-run rules) the views are the store-wide ones again.
    If the cache cannot be built, the block runs on the store-wide views (slower, same
    answers), and any error shows up in the rules that read them.

    A cache kept in the store (`KEEP_MIN_GPU_OPS`) is used when its version is current;
    with `keep` (a writable store), a big run's cache is built into the store and kept.
    Otherwise it lives for the block: with `shared`, in an attached in-memory database
    (TEMP tables where that fails: a read-only store). The RunCache yielded also holds the
    block's `memo` of other results the run's rules share."""
    current = _kept_version(con, run_id) == CACHE_VERSION
    built = not current and keep and gpu_ops(con, run_id) >= KEEP_MIN_GPU_OPS and _keep(con, run_id)
    if current or built:
        with _on_kept(con, run_id) as cache:
            cache.built = built
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
        _build(con, run_id, cache, "TEMP " if db == "temp" else "")  # DuckDB creates in temp only with TEMP
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
    if _kept_version(con, run_id) != CACHE_VERSION:
        yield False
        return
    with _on_kept(con, run_id):
        yield True


@contextmanager
def _on_kept(con: duckdb.DuckDBPyConnection, run_id: str) -> Iterator[RunCache]:
    """The views pointed at `run_id`'s kept tables for the block (their version checked by the caller)."""
    cache = RunCache("main", list(RUN_CACHED), kept=True, prefix=_kept_prefix(run_id), run_id=run_id)
    use_run_cache(con, cache)
    try:
        yield cache
    finally:
        cache.forget()
        _restore_views(con, cache)


def _build(con: duckdb.DuckDBPyConnection, run_id: str, cache: RunCache, temp: str) -> None:
    """Create the cache's tables at `cache.prefix`, pointing each view at its table as soon
    as it is made (later tables are computed from the earlier ones)."""
    con.execute(f"CREATE OR REPLACE {temp}TABLE {cache.prefix}scope AS SELECT $1::VARCHAR AS run_id", [run_id])
    slices = None
    for name in RUN_CACHED:
        if name in _RUN_CACHE_SLICED:
            slices = slices or _slices(con, run_id)
            _build_in_slices(con, run_id, f"{cache.prefix}{name}", temp, name, slices)
        elif name not in _RUN_CACHE_VIEWS:
            sql = _RUN_CACHE_SQL.get(name, f"SELECT * EXCLUDE (run_id) FROM {name} WHERE run_id = $1")
            con.execute(f"CREATE OR REPLACE {temp}TABLE {cache.prefix}{name} AS {sql}",
                        [run_id] if "$1" in sql else [])
        _use(con, cache.prefix, name)
        cache.cached.append(name)


def _slices(con: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple[int, int | None]]:
    """`run_id`'s GPU operations cut by start time into slices of about SLICE_GPU_OPS each, as
    (start, end) bounds for `_in_slice`: the first from the smallest BIGINT, the last open (None)."""
    count = -(-gpu_ops(con, run_id) // SLICE_GPU_OPS)
    bounds: list[int] = []
    if count > 1:  # approximate quantiles: slices need only be disjoint and in order, not equal
        (quantiles,) = con.execute("SELECT approx_quantile(start_ns, $2::FLOAT[]) FROM gpu_activity "
                                   "WHERE run_id = $1", [run_id, [i / count for i in range(1, count)]]).fetchone()
        bounds = sorted({b for b in quantiles or () if b is not None and b > _MIN_BIGINT})
    edges = [_MIN_BIGINT, *bounds, None]
    return list(zip(edges, edges[1:]))


def _build_in_slices(con: duckdb.DuckDBPyConnection, run_id: str, table: str, temp: str, name: str,
                     slices: list[tuple[int, int | None]]) -> None:
    """Create `table` from the sliced query of `name`, one slice at a time; where the slices
    go on from each other, each from the last row per stream of the slices before it."""
    sql, carry = _RUN_CACHE_SQL[name], _RUN_CACHE_SLICED[name]
    if carry:  # empty at first; its columns are the table's, so take them from the unsliced query
        con.execute(f"CREATE OR REPLACE TEMP TABLE {carry} AS SELECT * EXCLUDE (run_id) FROM ({VIEWS[name][1]}) LIMIT 0")
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


def _kept_prefix(run_id: str) -> str:
    if not run_id.isalnum():  # run ids are hex digits; anything else is not a table name
        raise ValueError(f"run id {run_id!r} cannot name a table")
    return f"_ta_kept_{run_id}_"


def _kept_version(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
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


def _keep(con: duckdb.DuckDBPyConnection, run_id: str) -> bool:
    """Build `run_id`'s cache into the store in one transaction, replacing any older one.
    False (and nothing written) when that fails."""
    cache = RunCache("main", kept=True, prefix=_kept_prefix(run_id), run_id=run_id)
    try:
        con.execute("BEGIN TRANSACTION")
        drop_kept(con, run_id)
        if _registry_columns(con) not in ((), _REGISTRY_COLUMNS):  # an earlier layout: its rows are void
            con.execute(f"DROP TABLE {KEPT_REGISTRY}")
        con.execute(f"CREATE TABLE IF NOT EXISTS {KEPT_REGISTRY} (run_id VARCHAR, version VARCHAR, "
                    "ingested_at TIMESTAMP, built_at TIMESTAMP)")
        _build(con, run_id, cache, "")
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
    for table in _tables_named(con, _kept_prefix(run_id)):
        con.execute(f'DROP TABLE "{table}"')
    con.execute(f"DELETE FROM {KEPT_REGISTRY} WHERE run_id = $1", [run_id])


def kept_rows(con: duckdb.DuckDBPyConnection, run_id: str, name: str, sql: str, params: dict | None = None,
              *, write: bool = False) -> list[dict]:
    """The rows of `sql`, a small result of one run (`params` its parameters), kept beside the
    run's kept cache (`KEEP_MIN_GPU_OPS`): read from the store when there; else computed and,
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
    if _kept_version(con, run_id) != CACHE_VERSION:
        return _relation_rows(compute())
    return _kept_result(con, run_id, name, key, compute, write)


def _kept_result(con: duckdb.DuckDBPyConnection, run_id: str, name: str, key: str,
                 compute: Callable[[], duckdb.DuckDBPyRelation], write: bool) -> list[dict]:
    """`kept_rows` of a run whose kept cache is current: the rows `compute` gives, kept under
    `name` and a digest of `key` (the query that computes them) and of this module's text (the
    macros and views the query reads are defined here)."""
    stem = f"{_kept_prefix(run_id)}result_{name}_"
    table = stem + _result_digest(key + _module_digest())
    tables = _tables_named(con, stem)
    if table in tables:
        return _rows(con, f'SELECT * FROM "{table}"')
    if write:
        try:
            for old in tables:  # of another version
                con.execute(f'DROP TABLE IF EXISTS "{old}"')
            compute().create(table)
            return _rows(con, f'SELECT * FROM "{table}"')
        except duckdb.Error:  # a store another writer changed meanwhile: compute as without a cache
            pass
    return _relation_rows(compute())


# A run with more GPU operations than this has its time budget computed one window of about
# this many operations at a time (`run_window_time_budget`): the sweep holds every event of
# what it sweeps, and the whole of 5 M kernels' (6.3 M operations) took 4.4 GB for 13.8 s,
# against 0.95 GB for 14.1 s in windows of 1 M (the same rows).
BUDGET_WINDOW_GPU_OPS = SLICE_GPU_OPS
_BUDGET = "SELECT device_id, span_ns, category, cause, ns FROM run_time_budget($rid)"
_WINDOW_BUDGET = "SELECT device_id, category, cause, ns FROM run_window_time_budget($rid, $device_id, $lo_ns, $hi_ns)"


def time_budget_rows(con: duckdb.DuckDBPyConnection, run_ids: list[str], *, write: bool = False) -> list[dict]:
    """`time_budget`'s rows of these runs (run_id, device_id, span_ns, category, cause, ns): a
    run with a kept cache's from its kept result (`kept_rows`), a run of more than
    BUDGET_WINDOW_GPU_OPS operations computed in windows, the others' in one query."""
    install_table_macros(con)
    out, rest = [], []
    for run_id in run_ids:
        big = gpu_ops(con, run_id) > BUDGET_WINDOW_GPU_OPS
        if big:
            compute = functools.partial(_budget_in_windows, con, run_id)
        else:
            compute = functools.partial(con.sql, _BUDGET, params={"rid": run_id})
        if _kept_version(con, run_id) == CACHE_VERSION:
            out += [{"run_id": run_id, **r} for r in _kept_result(
                con, run_id, "time_budget", _WINDOW_BUDGET if big else _BUDGET, compute, write)]
        elif big:
            out += [{"run_id": run_id, **r} for r in _relation_rows(compute())]
        else:
            rest.append(run_id)
    if rest:
        out += _rows(con, "SELECT run_id, device_id, span_ns, category, cause, ns FROM runs_time_budget($rids::VARCHAR[])",
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
    install_table_macros(con)
    windows: list[dict] = []
    parts: list[dict] = []
    for run_id in run_ids:
        if _kept_version(con, run_id) == CACHE_VERSION:
            # the kept cache has the windows (RUN_CACHED): computing them again reads every
            # range, call and launch of the run (5 M kernels, 24 M ranges: ~7 s, 4.6 GB)
            table = f'"{_kept_prefix(run_id)}warmup_windows"'
            mine = _rows(con, f"SELECT {_WARMUP_COLUMNS} FROM {table} ORDER BY {_WARMUP_ORDER}")
            kept_windows = f"SELECT $rid AS run_id, device_id, start_ns, end_ns FROM {table}"
            sql = f"SELECT device_id, category, cause, ns FROM ({_warmup_budget('run_id = $rid', kept_windows)}) ORDER BY ALL"
            budget = functools.partial(_kept_result, con, run_id, "warmup_budget", sql,
                                       functools.partial(con.sql, sql, params={"rid": run_id}), write)
        else:
            mine = _rows(con, _WARMUP_WINDOWS, {"rid": run_id})
            budget = functools.partial(_rows, con, _WARMUP_BUDGET, {"rid": run_id})
        windows += [{"run_id": run_id, **r} for r in mine]
        if mine:
            parts += [{"run_id": run_id, **r} for r in budget()]
    return windows, parts


def _budget_in_windows(con: duckdb.DuckDBPyConnection, run_id: str) -> duckdb.DuckDBPyRelation:
    """`run_time_budget`'s rows of `run_id`, summed over windows of each device's time of
    about BUDGET_WINDOW_GPU_OPS operations, cut at starts of its operations (`quantile_disc`
    gives starts, not interpolations): the busy parts, and idle causes with time."""
    parts = []
    for device_id, n in con.execute("SELECT device_id, count(*) FROM gpu_activity WHERE run_id = $1 GROUP BY ALL "
                                    "ORDER BY ALL", [run_id]).fetchall():
        count, cuts = -(-n // BUDGET_WINDOW_GPU_OPS), []
        if count > 1:
            (cuts,) = con.execute("SELECT quantile_disc(start_ns, $q::DOUBLE[]) FROM gpu_activity WHERE run_id = $rid "
                                  "AND device_id IS NOT DISTINCT FROM $device_id",
                                  {"rid": run_id, "device_id": device_id, "q": [i / count for i in range(1, count)]}
                                  ).fetchall()[0]
        edges = [_MIN_BIGINT, *sorted(set(cuts)), _MAX_BIGINT]
        parts += [con.sql(_WINDOW_BUDGET, params={"rid": run_id, "device_id": device_id, "lo_ns": lo, "hi_ns": hi})
                  .to_arrow_table() for lo, hi in zip(edges, edges[1:])]
    if not parts:
        return con.sql(_BUDGET, params={"rid": run_id})  # no operation: the empty result, typed
    # A device's span is the sum of its parts (idle split by cause sums to idle).
    return con.from_arrow(pa.concat_tables(parts)).query("parts", """
        SELECT device_id, CAST(sum(sum(ns)) OVER (PARTITION BY device_id) AS BIGINT) AS span_ns, category, cause,
               CAST(sum(ns) AS BIGINT) AS ns
        FROM parts GROUP BY device_id, category, cause HAVING category <> 'idle' OR sum(ns) > 0""")


def _relation_rows(rel: duckdb.DuckDBPyRelation) -> list[dict]:
    return [dict(zip(rel.columns, row)) for row in rel.fetchall()]


@functools.cache
def _module_digest() -> str:
    return hashlib.sha1(Path(__file__).read_bytes()).hexdigest()


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict | None = None) -> list[dict]:
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
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {VIEWS[name][1]}")


def _restore(con: duckdb.DuckDBPyConnection, cache: RunCache) -> None:
    _restore_views(con, cache)
    for name in reversed(cache.cached):  # views first: they read the tables
        if name not in _RUN_CACHE_VIEWS:
            con.execute(f"DROP TABLE IF EXISTS {cache.prefix}{name}")
    con.execute(f"DROP TABLE IF EXISTS {cache.prefix}scope")
