"""Where a finding that adds up many intervals (gaps, copies, stretches, waits) is: the window
holding most of its time, not its single largest interval.

A finding's `start_ns`/`end_ns` name one window of the run, and the reports say "at X–Y into
the run" (the HTML timeline draws it). For a finding over many intervals that window is the
shortest run of consecutive intervals (in time order) holding at least half of their time
(`MAJORITY`), the earliest among equals, where it is at most `CONCENTRATED` of their extent
(first start to last end); else the time is spread over the run and the window is that whole
extent. The evidence's `place` says how many of the intervals and how much of their time the
window holds ("at 1.2 ms–3.4 ms into the run: 57 of the 127 gaps, 61% of their time"; spread:
"127 gaps between 0.5 ms and 7.5 ms").
"""

from __future__ import annotations

from .core import Macro, TableMacro

# The share of a finding's time its window holds at least.
MAJORITY = 0.5
# The window is named where it is at most this share of the intervals' extent (its time at
# least twice as dense as over the extent); else the whole extent is.
CONCENTRATED = 0.25


# Said in the `how` of each rule that places its findings so.
HOW = (" The finding's time range is where most of its time is: the shortest run of consecutive "
       "intervals holding at least half of it, where that is at most a quarter of their extent (first "
       "start to last end), else the whole extent; the evidence's `place` says how many of them and how "
       "much of their time it holds.")

# For each first interval an ASOF join on the running sum finds the first interval that
# completes the majority: O(n log n), where testing every pair is quadratic. The source's own
# columns are its keys; the macro's are p_ names, so no key (a chain's `n`) can shadow them.
_BY = "(p_w_end - p_w_start, p_w_start)"
_MAJORITY_WINDOW = f"""(src) AS TABLE
    WITH p_runs AS MATERIALIZED (
        SELECT *, row_number() OVER w AS p_i, sum(p_ns) OVER w AS p_cum, max(p_end) OVER w AS p_reach,
               sum(p_ns) OVER (PARTITION BY p_key) AS p_total, count(*) OVER (PARTITION BY p_key) AS p_n,
               min(p_start) OVER (PARTITION BY p_key) AS p_first, max(p_end) OVER (PARTITION BY p_key) AS p_last
        FROM (SELECT COLUMNS(* EXCLUDE (start_ns, end_ns, ns)), hash(0, *COLUMNS(* EXCLUDE (start_ns, end_ns, ns))) AS p_key,
                     start_ns AS p_start, end_ns AS p_end, ns AS p_ns FROM query_table(src))
        WINDOW w AS (PARTITION BY p_key ORDER BY p_start, p_end ROWS UNBOUNDED PRECEDING)
    ), p_best AS (  -- per key, the shortest run of intervals holding the majority
        SELECT COLUMNS(lambda c: c = 'p_key' OR NOT starts_with(c, 'p_')),
               arg_min(p_w_start, {_BY}) AS p_w_start, arg_min(p_w_end, {_BY}) AS p_w_end,
               arg_min(p_w_n, {_BY}) AS p_w_n, arg_min(p_w_ns, {_BY}) AS p_w_ns, any_value(p_n) AS p_n,
               any_value(p_total) AS p_total, any_value(p_first) AS p_first, any_value(p_last) AS p_last
        FROM (SELECT a.*, a.p_start AS p_w_start, b.p_reach AS p_w_end, b.p_i - a.p_i + 1 AS p_w_n,
                     b.p_cum - a.p_cum + a.p_ns AS p_w_ns
              FROM (SELECT *, p_cum - p_ns + {MAJORITY} * p_total AS p_need FROM p_runs) a
              ASOF JOIN p_runs b ON b.p_key = a.p_key AND a.p_need <= b.p_cum)
        GROUP BY ALL
    )
    SELECT * EXCLUDE (p_key, p_w_start, p_w_end, p_w_n, p_w_ns, p_n, p_total, p_first, p_last, p_dense),
           CASE WHEN p_dense THEN p_w_start ELSE p_first END AS w_start,
           CASE WHEN p_dense THEN p_w_end ELSE p_last END AS w_end,
           CASE WHEN p_dense THEN p_w_n ELSE p_n END AS w_n,
           CASE WHEN p_dense THEN p_w_ns ELSE p_total END AS w_ns, p_n AS w_of, p_total AS w_total_ns
    FROM (SELECT *, p_w_end - p_w_start <= {CONCENTRATED} * (p_last - p_first) AS p_dense FROM p_best)"""


DEFINES = (
    TableMacro(
        "majority_window",
        "Per key, where most of the time of a table's intervals is (`analyses/place.py`): the table "
        "(a CTE's name) has `start_ns`, `end_ns`, `ns` (the time each counts) and its keys (NULLs allowed; "
        "none: one window), and the result the keys with `w_start`, `w_end`, `w_n` (intervals in the "
        "window), `w_ns` (their time), `w_of` and `w_total_ns` (all of them): "
        f"the shortest run of consecutive intervals holding at least {MAJORITY:.0%} of their time where "
        f"that is at most {CONCENTRATED:.0%} of their extent, else the whole extent: "
        "`SELECT * FROM majority_window('gaps')`.",
        _MAJORITY_WINDOW,
    ),
    # The evidence's `place` from a row of majority_window (`w`); `what` names the intervals in
    # the plural ("gaps").
    Macro("place_json", "(w, what) AS json_object('start_ns', w.w_start, 'end_ns', w.w_end, 'count', w.w_n, "
          "'of', w.w_of, 'ns', CAST(w.w_ns AS BIGINT), 'total_ns', CAST(w.w_total_ns AS BIGINT), 'what', what)"),
)
