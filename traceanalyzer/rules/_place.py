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


def majority_window(source: str, keys: tuple[str, ...]) -> str:
    """SQL: per `keys` (columns of `source`, NULLs allowed), the window of `source`'s intervals
    (columns `start_ns`, `end_ns` and `ns`, the time each counts) holding at least MAJORITY of
    their time, or their whole extent (see the module's docstring): `w_start`, `w_end`, `w_n`
    (intervals in it), `w_ns` (their time), `w_of` and `w_total_ns` (all of them). For each
    first interval an ASOF join on the running sum finds the first interval that completes the
    majority: O(n log n), where testing every pair is quadratic."""
    k = ", ".join(keys)
    key = f"hash({k})" if keys else "0"
    first = ", ".join(f"any_value({c}) AS {c}" for c in keys)
    by = "(w_end - w_start, w_start)"
    return f"""
    SELECT {k + ', ' if keys else ''}
           CASE WHEN dense THEN w_start ELSE first_ns END AS w_start,
           CASE WHEN dense THEN w_end ELSE last_ns END AS w_end,
           CASE WHEN dense THEN w_n ELSE n END AS w_n,
           CASE WHEN dense THEN w_ns ELSE total_ns END AS w_ns, n AS w_of, total_ns AS w_total_ns
    FROM (SELECT *, w_end - w_start <= {CONCENTRATED} * (last_ns - first_ns) AS dense FROM (
    SELECT {first + ', ' if keys else ''}
           arg_min(w_start, {by}) AS w_start, arg_min(w_end, {by}) AS w_end, arg_min(w_n, {by}) AS w_n,
           arg_min(w_ns, {by}) AS w_ns, any_value(n) AS n, any_value(total_ns) AS total_ns,
           any_value(first_ns) AS first_ns, any_value(last_ns) AS last_ns
    FROM (
        SELECT a.*, a.start_ns AS w_start, b.reach_ns AS w_end, b.i - a.i + 1 AS w_n, b.cum_ns - a.cum_ns + a.ns AS w_ns
        FROM (SELECT *, cum_ns - ns + {MAJORITY} * total_ns AS need_ns FROM __place_runs) a
        ASOF JOIN __place_runs b ON b.place_key = a.place_key AND a.need_ns <= b.cum_ns
    )
    GROUP BY place_key))
    """.replace("__place_runs", f"""(
        SELECT *, {key} AS place_key,
               row_number() OVER w AS i, sum(ns) OVER w AS cum_ns, max(end_ns) OVER w AS reach_ns,
               sum(ns) OVER (PARTITION BY {key}) AS total_ns, count(*) OVER (PARTITION BY {key}) AS n,
               min(start_ns) OVER (PARTITION BY {key}) AS first_ns, max(end_ns) OVER (PARTITION BY {key}) AS last_ns
        FROM ({source})
        WINDOW w AS (PARTITION BY {key} ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING))""")


def place_json(what: str, alias: str = "") -> str:
    """SQL: the evidence's `place` object from majority_window's columns (of table `alias`):
    {"start_ns", "end_ns", "count", "of", "ns", "total_ns", "what"}; `what` names the intervals
    in the plural ("gaps")."""
    a = f"{alias}." if alias else ""
    return (f"""json_object('start_ns', {a}w_start, 'end_ns', {a}w_end, 'count', {a}w_n, 'of', {a}w_of, """
            f"""'ns', CAST({a}w_ns AS BIGINT), 'total_ns', CAST({a}w_total_ns AS BIGINT), 'what', '{what}')""")

