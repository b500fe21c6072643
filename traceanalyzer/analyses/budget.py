"""The time budget: where each device's span went (busy by category, idle by cause), for the
whole span (`time_budget`), a window of it, or each step; and the idle-time marks that the
rules read their gaps with, so that they agree with the budget (the macros `idle_issued_at`,
`idle_sync_until` and `blocked_at`; the table macro `issued_at`)."""

from __future__ import annotations

from .core import MAX_BIGINT, Macro, TableMacro, View, qualified


# Kernel names of collectives: NCCL/RCCL kernels and the usual custom all-reduce kernels.
COMM_PATTERN = (r"(?i)(nccl|rccl|multimem_all_reduce|cross_device_reduce|all_?reduce|all_?gather|"
                r"reduce_?scatter|all_?to_?all)")
# The blocking host calls: they return only when the GPU work they wait for is done.
BLOCKING_CALL = ("(name ILIKE '%synchronize%' OR ((name ILIKE '%memcpy%' OR name ILIKE '%memset%') "
                 "AND name NOT ILIKE '%async%'))")
# The time budget's categories, in the order of priority that resolves overlap between streams.
BUDGET_CATEGORIES = ("compute", "communication", "copy", "memset")
IDLE_CAUSES = ("sync", "host", "dependency", "unknown")


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


# The time a thread spent in blocking calls up to `t`, from its row of `blocking_calls` found by
# an ASOF join on `start_ns <= t` (its `blocked_ns` and `reach_ns`; NULL: none): the calls up to
# that row cover all of [start_ns, reach_ns] (they are merged into islands), so up to `t` the
# union lacks only what lies after `t`.
_BLOCKED_AT = "(t, blocked_ns, reach_ns) AS coalesce(blocked_ns - greatest(reach_ns - t, 0), 0)"
# Where an idle stretch [t0, t1] stops being host time (`idle_issued_at`), and up to where its
# launching thread's blocking calls count as `sync` (`idle_sync_until`).
# Issued: the return of the launch call (call_start, call_end), clamped to the stretch; after it
# the work was issued, and what it waited on was not the host. A blocking call the thread was in
# when the stretch began does not hold it: the thread entered that call after the launch, and
# work on a stream never waits for work issued after it (a synchronous copy on the legacy
# default stream holds later work only).
# Sync until: the blocking calls that count are the one in progress at t0 (reach: the latest end
# of those the thread started by t0; NULL: none) and those it entered before the launch call
# (the launch call itself, a synchronous copy, is the launch); of [t0, issued], the time in them
# is `sync` (`blocked_at` at sync-until minus at t0), the rest `host`. The time budget splits its
# idle stretches with these and rule T001 its gaps, so the two agree.
_IDLE_ISSUED_AT = "(t0, t1, call_start, call_end) AS least(greatest(coalesce(call_end, call_start), t0), t1)"
_IDLE_SYNC_UNTIL = ("(t0, t1, call_start, call_end, reach) AS least(greatest(coalesce(reach, t0), "
                    "coalesce(call_start, t0), t0), idle_issued_at(t0, t1, call_start, call_end))")


def time_budget_sql(runs: str | None = None, window: bool = False) -> str:
    """The time_budget view's query; with `runs` (a condition on `run_id`: the table macros'
    parameter), those runs' rows only, read from the tables by run (DuckDB does not push a run
    filter on the view down through the sweep's window). See `budget_sweep`."""
    return budget_sweep(runs, window) + f"""
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
# after `budget_sweep`'s).
SEGMENTS = """
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


def step_budget_sql(runs: str) -> str:
    """The time budget of each step (the `steps` view) of the runs `runs` selects: the parts of
    `budget_sweep` clipped to the step's window, per device; a step's parts on a device sum to
    the part of the window inside the device's span (`span_ns`). Nested steps are each whole."""
    return budget_sweep(runs) + SEGMENTS + f"""
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


def budget_sweep(runs: str | None, window: bool = False, hull: str | None = None) -> str:
    """The CTEs the time budgets share, up to `stretches` (each stretch of a device's span with
    its category) and `marks` (each idle stretch with where its `sync` and `host` parts end).

    One sweep over the start and end of every GPU operation per device, in time order, with a
    running count of the operations of each category in progress: each stretch between two
    consecutive event times is the category of highest priority in progress (compute >
    communication > copy > memset), or idle. So the parts partition the device's span (first
    start to last end) exactly. An idle stretch is read from the operation that ends it (of
    those starting then, the one whose launch call started first) and that call's thread, and
    split in time: up to the return of the launch call, the time the thread spent in blocking
    calls (`sync`, see `idle_sync_until`; counted first in the stretch) and the rest (`host`: not
    issued yet), then the rest (`dependency`: issued, the work waited); all `unknown` without a
    launch call.

    With `window`, the sweep of one device (`win_device_id`, a parameter of the table macro)
    within [`win_lo_ns`, `win_hi_ns`): the operations overlapping it clipped to it, and an
    event at `win_hi_ns` that ends the window's last stretch there. Windows that cut a
    device's span at starts of its operations have parts that sum to the whole sweep's, each
    idle stretch whole (it ends at an operation's start, never inside a window); see
    `time_budget_rows`.

    With `hull` (CTEs, the last named `hull`: run_id, device_id, lo, hi), only the operations of a device that
    reach into [lo, hi] are swept: its stretches inside [lo, hi] are the whole sweep's when lo
    is an operation's end (or before the first) and hi an operation's start (or after the last),
    as `warmup_budget_sql` sets them."""
    of_run = runs or "true"
    in_window, starts_in_window, clip_start, clip_end, bound = "true", "true", "a.start_ns", "a.end_ns", ""
    if window:
        device = "a.device_id IS NOT DISTINCT FROM win_device_id"
        in_window = f"{device} AND a.start_ns < win_hi_ns AND a.end_ns >= win_lo_ns"
        starts_in_window = f"{device} AND a.start_ns BETWEEN win_lo_ns AND win_hi_ns"  # what can end its stretches
        clip_start, clip_end = "greatest(a.start_ns, win_lo_ns)", "least(a.end_ns, win_hi_ns)"
        bound = f"UNION ALL SELECT rid, win_device_id, win_hi_ns, 0 WHERE win_hi_ns < {MAX_BIGINT}"
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
            WHERE {qualified(of_run, 'a')} AND {in_window}
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
                   idle_issued_at(i.start_ns, i.end_ns, i.call_start_ns, i.call_end_ns) AS issued_ns,
                   idle_sync_until(i.start_ns, i.end_ns, i.call_start_ns, i.call_end_ns, b.reach_ns) AS sync_until_ns,
                   blocked_at(i.start_ns, b.blocked_ns, b.reach_ns) AS blocked_ns
            FROM idle i ASOF LEFT JOIN blocking b
              ON b.run_id = i.run_id AND b.pid = i.pid AND b.tid = i.tid AND b.start_ns <= i.start_ns
        ), marks AS (  -- where in each idle stretch the `sync` part ends (its time counted first), then
            -- the `host` part (the launch)
            SELECT r.run_id, r.device_id, r.start_ns, r.end_ns, r.linked,
                   r.start_ns + blocked_at(r.sync_until_ns, b.blocked_ns, b.reach_ns) - r.blocked_ns AS sync_end_ns,
                   r.issued_ns
            FROM reached r ASOF LEFT JOIN blocking b
              ON b.run_id = r.run_id AND b.pid = r.pid AND b.tid = r.tid AND b.start_ns <= r.sync_until_ns
        )"""


# The macros the budget's sweep reads (`budget_sweep`): every view of it declares them.
SWEEP_MACROS = ("blocked_at", "idle_issued_at", "idle_sync_until")


DEFINES = (
    TableMacro(
        "run_thread_blocking",
        "One run's blocking calls per thread (`pid`, `tid`; calls without a thread left out), one row per "
        "start time: `start_ns`, `reach_ns` (the latest end so far) and `blocked_ns` (the thread's time in "
        "blocking calls up to `reach_ns`, their union), as the time budget reads them and `blocked_at` takes "
        "them: `run_thread_blocking('<run id>')`.",
        f"(rid) AS TABLE {blocking_calls('run_id = rid AND pid IS NOT NULL AND tid IS NOT NULL', 'pid, tid')}",
    ),
    TableMacro(
        "run_all_threads_blocking",
        "`run_thread_blocking` over all of one run's threads together (`run_id` instead of `pid`, `tid`): "
        "`run_all_threads_blocking('<run id>')`.",
        f"(rid) AS TABLE {blocking_calls('run_id = rid', 'run_id')}",
    ),
    TableMacro(
        "issued_at",
        "When the work that ends an idle stretch was issued, as the time budget reads it: for each "
        "(`device_id`, `busy_start`) of the table named (a CTE's name; a start of the device's busy intervals, "
        "after idle time), of the run's operations starting then, the return of the launch call that started "
        "first (`issued_ns`; its start when it has no end). NULL where that operation has no launch call: "
        "whether the host was late is unknown. Before `issued_ns` the idle time is the budget's `host` (or "
        "`sync`, in a blocking call), after it `dependency`: `issued_at('<run id>', 'busy_starts')`.",
        f"""(rid, busy_starts) AS TABLE
        SELECT g.device_id, g.start_ns AS busy_start,
               arg_min(coalesce(c.end_ns, c.start_ns), coalesce(c.start_ns, {MAX_BIGINT})) AS issued_ns
        FROM gpu_activity g
        SEMI JOIN query_table(busy_starts) x ON x.device_id = g.device_id AND x.busy_start = g.start_ns
        LEFT JOIN api_calls c ON c.run_id = rid AND c.call_id = g.launch_call_id
        WHERE g.run_id = rid
        GROUP BY ALL""",
        reads=("gpu_activity",),
    ),
    # Where the host part of the idle time [t0, t1] ends: the issue of the work that ends it
    # (`issued_at`'s `issued_ns`), clamped to the interval (NULL: unknown).
    Macro("host_until", "(issued, t0, t1) AS least(greatest(issued, t0), t1)"),
    Macro("blocked_at", _BLOCKED_AT),
    Macro("idle_issued_at", _IDLE_ISSUED_AT),
    Macro("idle_sync_until", _IDLE_SYNC_UNTIL, reads=("idle_issued_at",)),
    View(
        "time_budget",
        "Per run and device, where the device's span (first GPU operation's start to last one's end) "
        "went: every nanosecond counted once, as `compute` (kernels), `communication` (collective "
        "kernels: NCCL, RCCL, all-reduce), `copy`, `memset` (overlap between streams resolved in that "
        "order of priority) or `idle`; idle split by `cause`, from the operation that ends each idle "
        "stretch and its launch call: until the launch call returned (the work was not issued yet), "
        "`sync` (the time the launching thread spent in blocking calls, a synchronize or a synchronous "
        "copy, one it was in when the device went idle or entered before the launch call) and `host` (the "
        "rest); then `dependency` (the rest: issued, the work waited on something else: another "
        "stream, an event, the launch latency); all `unknown` without a launch call. `ns` per part; the parts of a device sum to `span_ns`.",
        time_budget_sql(),
        reads=("gpu_activity", "kernel_names", *SWEEP_MACROS),
        on_demand=True,
    ),
    # Views of some runs, computed from those runs' rows only (see `time_budget_sql`).
    TableMacro(
        "run_time_budget",
        "`time_budget` of one run, computed from its rows only: `SELECT * FROM run_time_budget('<run id>')`.",
        f"(rid) AS TABLE {time_budget_sql('run_id = rid')}",
        reads=("gpu_activity", "kernel_names", *SWEEP_MACROS),
    ),
    TableMacro(
        "run_window_time_budget",
        "`time_budget` of one device of one run within a window of time [lo, hi), "
        "cut at starts of the device's operations: the parts of consecutive windows "
        "add up to the device's whole budget (a big run's budget is computed so, one "
        "window of about a million operations at a time): "
        "`SELECT * FROM run_window_time_budget('<run id>', 0, 1000, 2000)`.",
        f"(rid, win_device_id, win_lo_ns, win_hi_ns) AS TABLE {time_budget_sql('run_id = rid', window=True)}",
        reads=("gpu_activity", "kernel_names", *SWEEP_MACROS),
    ),
    TableMacro(
        "runs_time_budget",
        "`time_budget` of the runs listed: `runs_time_budget(['<id>', ...])`.",
        f"(rids) AS TABLE {time_budget_sql('list_contains(rids, run_id)')}",
        reads=("gpu_activity", "kernel_names", *SWEEP_MACROS),
    ),
    TableMacro(
        "run_step_budget",
        "One run's time budget per step (the `steps` view) and device: `run_id`, `step_id` "
        "(`ranges.range_id`), `step` (its name), `step_start_ns`, `device_id`, `category`, `cause`, "
        "`ns` (parts with time only), and `span_ns`, the step's window inside the device's span, "
        "which its parts sum to.",
        f"(rid) AS TABLE {step_budget_sql('run_id = rid')}",
        reads=("gpu_activity", "kernel_names", "steps", *SWEEP_MACROS),
    ),
)
