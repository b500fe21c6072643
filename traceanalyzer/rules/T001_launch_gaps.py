"""T001 launch gaps: idle time between consecutive GPU operations on a stream."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Optional

import msgspec

from ..analyses.place import HOW as PLACE_HOW
from ..fmt import ns as fmt_ns
from ._code import HAS_CPU_OPS_SQL, OUTSIDE_OPERATORS, around_gaps, device_key, phrase
from ._unknown import CAUSE_UNKNOWN, launch_gap_unknown
from .base import Rule, Threshold
from .evidence import Place, PlacedEvidence, TimeRange, doc

if TYPE_CHECKING:
    import pandas as pd

# A gap's causes, in the order its time is split in (the `how` text below says what each
# means; copy and dependency name the same last part). The same order breaks ties; SQL writes
# them out in it (tests/test_t001_causes.py checks that it does).
CAUSES = ("sync", "late_launch", "copy", "dependency", "unknown")

HINTS = {
    "sync": "A synchronizing call (a synchronize, or a synchronous copy or memset) sits between launches: drop "
            "it, or move it out of the loop and use events/stream ordering and asynchronous copies instead.",
    "late_launch": "The host submits work too slowly (CPU-bound launch): fuse small kernels, capture the loop "
                   "in a CUDA graph, or take other work off the launch thread (Python and framework dispatch; in "
                   "compiled code, allocations and copies made anew in every iteration).",
    "copy": "The stream waits on a copy: issue copies asynchronously from pinned memory on another stream and "
            "prefetch ahead of use.",
    "dependency": "Work was submitted in time but waited on another stream or event: check cross-stream "
                  "dependencies (cudaStreamWaitEvent) and stream priorities.",
    "unknown": "Look at the host timeline in the gaps listed in the evidence.",
}
# On a run that already replays CUDA/HIP graphs, "capture the loop in a CUDA graph" is no advice:
# the host's slowness lies between the replays.
REPLAYED_LATE_HINT = ("The host submits work too slowly between its graph replays (CPU-bound): capture more "
                      "of each step in one graph (fewer, larger replays, e.g. full rather than piecewise "
                      "capture), and take the Python/scheduler work between replays off the launch thread.")
# A device's only stream waited, with its work issued in time, for nothing but the launch itself.
LATENCY_HINT = ("The work was issued in time, and the rest of each gap is the launch latency (from a launch "
                "call's return to its kernel's start; this device ran one stream, so nothing else held it): "
                "fewer, larger kernels (fusion) cut the launches that pay it, and a CUDA/HIP graph shortens "
                "it where kernels are launched one by one.")
# ... on a run that replays graphs, where the gaps are the seams between replays and work launched
# one by one, and a replay's own start and end.
REPLAYED_LATENCY_HINT = ("The work was issued in time, and the rest of each gap is the GPU's own latency between "
                         "operations on this device's one stream, on a run that replays graphs: where a replay "
                         "meets kernels or copies launched one by one (piecewise capture, eager attention), "
                         "capturing more of each step in one graph (full rather than piecewise capture) removes "
                         "the seam; a replay's own start and end cost remains.")
REPLAYED_HINTS = {"late_launch": REPLAYED_LATE_HINT, "latency": REPLAYED_LATENCY_HINT}
REPLAYS_SQL = "SELECT EXISTS (SELECT 1 FROM api_calls c JOIN gpu_activity a ON a.run_id = c.run_id " \
              "AND a.launch_call_id = c.call_id WHERE c.run_id = $run_id AND c.name ILIKE '%graphlaunch%')"


# One CTE chain: per-stream gaps and device-idle stretches, where in each the host stopped
# waiting (their causes' times), how much of each cause's time the whole device was idle (the
# time really lost), then one finding per stream plus one per device for idle time across all
# streams.
SQL = r"""
WITH warm AS (  -- the warm-up windows per device
    SELECT * FROM run_warmup_merged('this_run.warmup_windows', false)
), stream_gaps AS (
    -- Operations in stream order come computed once per run for T001 and S002 (analyses.launches.stream_ops),
    -- read straight from the cache: sharing them as a CTE would copy every row again.
    -- Names are looked up only for the gaps the evidence lists. With each gap, the launch call
    -- of the operation that ends it, and that call's thread.
    SELECT o.device_id, o.stream_id, coalesce(o.device_id, -1) AS w_key, o.prev_max_end_ns AS t0, o.start_ns AS t1,
           o.kind AS next_kind, o.item_id AS next_id, o.prev_kind, o.prev_id, o.seq, a.start_ns AS call_start, a.end_ns AS call_end, a.pid, a.tid
    FROM this_run.stream_ops o LEFT JOIN api_calls a ON a.run_id = $run_id AND a.call_id = o.launch_call_id
    WHERE o.prev_max_end_ns IS NOT NULL AND o.start_ns - o.prev_max_end_ns > $min_gap_ns
), all_gaps AS (  -- each with where its steady part begins
    SELECT * EXCLUDE (w_key, t0, t1, steady_start_ns), t0 AS whole_start, t1 AS gap_end, steady_start_ns AS gap_start
    FROM steady_starts('stream_gaps', 'this_run.warmup_windows', false)
), gaps AS (  -- the gaps' steady parts (warm-up left out)
    SELECT * EXCLUDE (whole_start), gap_end - gap_start AS gap_ns FROM all_gaps
    WHERE gap_end - gap_start > $min_gap_ns
), warm_left AS (  -- per stream, the gap time left out as warm-up
    SELECT device_id, stream_id, sum(gap_end - whole_start) - coalesce(sum(gap_end - gap_start), 0) AS warmup_ns
    FROM all_gaps GROUP BY ALL
), stream_counts AS (  -- per device: its streams, and whether every operation has one
    SELECT device_id, count(DISTINCT stream_id) AS n_streams, count(stream_id) = count(*) AS all_on_streams
    FROM this_run.stream_ops WHERE device_id IS NOT NULL GROUP BY device_id
), one_stream AS (  -- devices whose every operation runs on one stream: there a gap is all device-idle
    SELECT device_id FROM stream_counts WHERE n_streams = 1 AND all_on_streams
), multi_stream_idle AS (
    SELECT device_id, coalesce(device_id, -1) AS w_key, start_ns AS t0, end_ns AS t1, gap_ns
    FROM this_run.device_idle_gaps
    WHERE gap_ns > $min_gap_ns AND device_id IN (SELECT device_id FROM stream_counts WHERE n_streams > 1)
), device_stretches AS (
    SELECT device_id, t1 AS end_ns, gap_ns AS whole_ns, steady_start_ns AS start_ns
    FROM steady_starts('multi_stream_idle', 'this_run.warmup_windows', false)
), stretches AS (
    -- Idle stretches of devices with several streams (with one, its stream's finding says it all),
    -- each read from the operation that ends it, as a stream gap is (device_gaps).
    -- Their steady parts (warm-up left out).
    SELECT device_id, start_ns, end_ns, end_ns - start_ns AS gap_ns FROM device_stretches
    WHERE end_ns - start_ns > $min_gap_ns
), stretch_ends AS (
    -- The operations that can start where a stretch ends: one whose stream worked before ends a
    -- gap of its stream at least as long as the stretch (so listed in gaps), else it is its
    -- stream's first. So no join over all operations and launch calls again.
    SELECT device_id, gap_end AS start_ns, next_kind AS kind, next_id AS item_id, pid, tid, call_start, call_end
    FROM gaps WHERE device_id IN (SELECT device_id FROM stretches)
    UNION ALL
    SELECT o.device_id, o.start_ns, o.kind, o.item_id, a.pid, a.tid, a.start_ns, a.end_ns
    FROM this_run.stream_ops o LEFT JOIN api_calls a ON a.run_id = $run_id AND a.call_id = o.launch_call_id
    WHERE o.prev_max_end_ns IS NULL AND o.device_id IN (SELECT device_id FROM stretches)
), device_gaps AS (  -- of the operations ending a stretch, the one whose launch call started first
    SELECT d.device_id, d.start_ns AS gap_start, d.end_ns AS gap_end, d.gap_ns,
           arg_min({'pid': o.pid, 'tid': o.tid, 'call_start': o.call_start, 'call_end': o.call_end},
                   (coalesce(o.call_start, 9223372036854775807), o.kind, o.item_id)) AS next_op
    FROM stretches d LEFT JOIN stretch_ends o ON o.device_id = d.device_id AND o.start_ns = d.end_ns
    GROUP BY d.device_id, d.start_ns, d.end_ns, d.gap_ns
), probes AS (  -- the gaps and stretches whose launching thread is known, where its blocking
    -- calls are read (on_device: a device-idle stretch, named by its start, unique per device)
    SELECT false AS on_device, device_id, stream_id, seq, pid, tid, gap_start, gap_end, call_start, call_end FROM gaps
    WHERE call_start IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL
    UNION ALL
    SELECT true, device_id, NULL, gap_start, next_op.pid, next_op.tid, gap_start, gap_end, next_op.call_start,
           next_op.call_end FROM device_gaps
    WHERE next_op.call_start IS NOT NULL AND next_op.pid IS NOT NULL AND next_op.tid IS NOT NULL
), blocking AS (
    -- Per thread, the latest end so far of its blocking calls and its time in them, as the time
    -- budget reads them (`run_thread_blocking`): ASOF joins (sync_hits) find the call a thread
    -- was in when a gap began and its time in blocking calls up to any point, in O(n log n);
    -- an interval-overlap join is quadratic on long runs.
    SELECT * FROM run_thread_blocking($run_id)
), reached AS (  -- an ASOF join sorts its probes, so they get only the columns it needs
    SELECT p.on_device, p.device_id, p.stream_id, p.seq, p.pid, p.tid, p.gap_start,
           idle_sync_until(p.gap_start, p.gap_end, p.call_start, p.call_end, b.reach_ns) AS sync_until,
           blocked_at(p.gap_start, b.blocked_ns, b.reach_ns) AS blocked_at_start
    FROM probes p ASOF LEFT JOIN blocking b ON b.pid = p.pid AND b.tid = p.tid AND b.start_ns <= p.gap_start
), sync_hits AS (  -- with the thread's time in blocking calls from the gap's start up to the launch
    SELECT p.on_device, p.device_id, p.stream_id, p.seq,
           blocked_at(p.sync_until, b.blocked_ns, b.reach_ns) - p.blocked_at_start AS sync_ns
    FROM reached p ASOF LEFT JOIN blocking b ON b.pid = p.pid AND b.tid = p.tid AND b.start_ns <= p.sync_until
), marks AS (  -- each gap with where the host stopped waiting in it, from the launch call of the
    -- operation that ends it and that thread's blocking calls: where the `sync` part ends (its
    -- time, `sh.sync_ns`, counted first in the gap), and where the work was issued
    SELECT g.*, g.call_start IS NOT NULL AS linked, g.gap_start + coalesce(sh.sync_ns, 0) AS sync_end,
           idle_issued_at(g.gap_start, g.gap_end, g.call_start, g.call_end) AS issued,
           g.device_id IN (SELECT device_id FROM one_stream) AS one_stream
    FROM gaps g
    LEFT JOIN sync_hits sh ON NOT sh.on_device AND sh.device_id IS NOT DISTINCT FROM g.device_id
                          AND sh.stream_id IS NOT DISTINCT FROM g.stream_id AND sh.seq = g.seq
), multi_marks AS (  -- the gaps of devices with several streams
    SELECT device_id, stream_id, seq, gap_start, gap_end, linked, sync_end, issued FROM marks
    WHERE device_id IS NOT NULL AND NOT one_stream
), copy_reach AS (
    -- Every timed copy of the device: one on the gap's own stream cannot overlap the gap
    -- (it is one of the stream's operations, so it ends by the gap's start or starts at
    -- or after its end), so "on another stream" needs no test here. Only stream gaps of
    -- devices with several streams are probed (copy_hits): no timed copy runs while a whole
    -- device is idle.
    SELECT device_id, start_ns, max(end_ns) OVER (PARTITION BY device_id ORDER BY start_ns) AS reach_ns
    FROM copies WHERE run_id = $run_id AND device_id IS NOT NULL AND start_ns IS NOT NULL AND end_ns >= start_ns
      AND device_id IN (SELECT device_id FROM multi_marks)
), copy_hits AS (  -- whether a copy ran in each gap's last part, after the work was issued ("the
    -- latest end among copies starting before the gap ends is past the issue"), with the part's
    -- bounds (segments reads them)
    SELECT g.device_id, g.stream_id, g.seq, g.issued, g.gap_end, coalesce(cr.reach_ns > g.issued, false) AS copy_hit
    FROM (SELECT device_id, stream_id, seq, issued, gap_end FROM multi_marks WHERE linked AND issued < gap_end) g
    ASOF LEFT JOIN copy_reach cr ON cr.device_id = g.device_id AND cr.start_ns < g.gap_end
), odd_copy_hits AS (  -- copies with end before start are not operations of any stream: tested
    -- directly (a join, not a correlated EXISTS per gap: there are almost never any)
    SELECT DISTINCT g.device_id, g.stream_id, g.seq
    FROM marks g JOIN copies c ON c.run_id = $run_id AND c.end_ns < c.start_ns AND c.device_id = g.device_id
                             AND c.stream_id IS DISTINCT FROM g.stream_id
                             AND c.start_ns < g.gap_end AND c.end_ns > g.issued
    WHERE g.linked
), copied AS (  -- each gap with whether a copy on another stream ran after its work was issued
    SELECT g.*, coalesce(ch.copy_hit, false) OR oc.seq IS NOT NULL AS copy_hit
    FROM marks g
    LEFT JOIN copy_hits ch ON ch.device_id = g.device_id AND ch.stream_id IS NOT DISTINCT FROM g.stream_id
                          AND ch.seq = g.seq
    LEFT JOIN odd_copy_hits oc ON oc.device_id = g.device_id AND oc.stream_id IS NOT DISTINCT FROM g.stream_id
                              AND oc.seq = g.seq
), split AS (  -- each gap's time per cause (CAUSES), split in time: `sync` up to sync_end, `late_launch`
    -- up to issued, the rest `copy` when a copy ran in it, else `dependency`; without a launch
    -- call (not linked), whether the host had issued the work is unknown: all `unknown`
    SELECT device_id, stream_id, gap_start, gap_end, gap_ns, prev_kind, prev_id, next_kind, next_id, one_stream,
           CASE WHEN linked THEN sync_end - gap_start END AS sync_ns,
           CASE WHEN linked THEN issued - sync_end END AS late_launch_ns,
           CASE WHEN linked AND copy_hit THEN gap_end - issued END AS copy_ns,
           CASE WHEN linked AND NOT copy_hit THEN gap_end - issued END AS dependency_ns,
           CASE WHEN NOT linked THEN gap_ns END AS unknown_ns
    FROM copied
), classified AS (  -- a gap's own cause: the one with the most of its time, the first in CAUSES
    -- among equals (greatest() skips the NULLs of causes that cannot apply)
    SELECT *, CASE greatest(sync_ns, late_launch_ns, copy_ns, dependency_ns, unknown_ns)
                   WHEN sync_ns THEN 'sync' WHEN late_launch_ns THEN 'late_launch' WHEN copy_ns THEN 'copy'
                   WHEN dependency_ns THEN 'dependency' ELSE 'unknown' END AS cause
    FROM split
), device_marks AS (
    SELECT g.device_id, g.gap_start, g.gap_end, g.gap_ns, g.call_start IS NOT NULL AS linked,
           g.gap_start + coalesce(sh.sync_ns, 0) AS sync_end,
           idle_issued_at(g.gap_start, g.gap_end, g.call_start, g.call_end) AS issued
    FROM (SELECT device_id, gap_start, gap_end, gap_ns, next_op.call_start, next_op.call_end FROM device_gaps) g
    LEFT JOIN sync_hits sh ON sh.on_device AND sh.device_id = g.device_id AND sh.seq = g.gap_start
), device_split AS (  -- as split (no timed copy runs while a whole device is idle)
    SELECT device_id, gap_start, gap_end, gap_ns,
           CASE WHEN linked THEN sync_end - gap_start END AS sync_ns,
           CASE WHEN linked THEN issued - sync_end END AS late_launch_ns,
           NULL::BIGINT AS copy_ns,
           CASE WHEN linked THEN gap_end - issued END AS dependency_ns,
           CASE WHEN NOT linked THEN gap_ns END AS unknown_ns
    FROM device_marks
), device_segments AS (  -- each cause's part of each device-idle stretch, as the device finding splits it
    SELECT * FROM (
        SELECT device_id,
               unnest(CASE WHEN linked THEN ['sync', 'late_launch', 'dependency'] ELSE ['unknown'] END) AS cause,
               unnest(CASE WHEN linked THEN [gap_start, sync_end, issued] ELSE [gap_start] END) AS start_ns,
               unnest(CASE WHEN linked THEN [sync_end, issued, gap_end] ELSE [gap_end] END) AS end_ns
        FROM device_marks)
    WHERE end_ns > start_ns
), cause_cum AS (  -- per device and cause (one key, `part`, for covered_ns: the segments of each
    -- are disjoint), the segments with their time up to each one's end
    SELECT device_id * 5 + list_position(['sync', 'late_launch', 'copy', 'dependency', 'unknown'], cause) AS part,
           start_ns, end_ns,
           sum(end_ns - start_ns) OVER (PARTITION BY device_id, cause ORDER BY start_ns ROWS UNBOUNDED PRECEDING) AS to_end_ns
    FROM device_segments
), stream_probes AS (  -- each gap of a multi-stream device, once per cause a device-idle stretch has
    -- (no timed copy runs while a whole device is idle: no `copy`)
    SELECT g.device_id, g.stream_id, c.cause,
           g.device_id * 5 + list_position(['sync', 'late_launch', 'copy', 'dependency', 'unknown'], c.cause) AS part,
           g.gap_start AS start_ns, g.gap_end AS end_ns
    FROM multi_marks g, (SELECT unnest(['sync', 'late_launch', 'dependency', 'unknown']) AS cause) c
), stream_idle AS (  -- per stream, the device-idle time in its gaps, by the cause the device's
    -- stretches give it (covered_ns sums over the probes of a key: one small group per cause)
    SELECT device_id, stream_id,
           coalesce(sum(covered_ns) FILTER (WHERE cause = 'sync'), 0) AS sync_idle,
           coalesce(sum(covered_ns) FILTER (WHERE cause = 'late_launch'), 0) AS late_launch_idle,
           coalesce(sum(covered_ns) FILTER (WHERE cause = 'copy'), 0) AS copy_idle,
           coalesce(sum(covered_ns) FILTER (WHERE cause = 'dependency'), 0) AS dependency_idle,
           coalesce(sum(covered_ns) FILTER (WHERE cause = 'unknown'), 0) AS unknown_idle
    FROM covered_ns('stream_probes', 'cause_cum', part) GROUP BY device_id, stream_id
), device_classified AS (  -- as classified
    SELECT *, CASE greatest(sync_ns, late_launch_ns, dependency_ns, unknown_ns)
                   WHEN sync_ns THEN 'sync' WHEN late_launch_ns THEN 'late_launch'
                   WHEN dependency_ns THEN 'dependency' ELSE 'unknown' END AS cause
    FROM device_split
), spans AS (  -- each device's span (the time budget's: first GPU operation to last) and its
    -- steady part, what the shares are of: the gaps' time inside warm-up windows is left out
    SELECT b.device_id, b.active_span_ns AS span_ns, b.active_span_ns - coalesce(w.warm_ns, 0) AS steady_ns
    FROM this_run.device_busy b
    LEFT JOIN (SELECT device_id, sum(end_ns - start_ns) AS warm_ns FROM warm GROUP BY ALL) w
      ON w.device_id = coalesce(b.device_id, -1)
), stream_gap_times AS (
    SELECT device_id, stream_id, gap_start AS start_ns, gap_end AS end_ns, gap_ns AS ns FROM classified
), stream_place AS (  -- where most of each stream's gap time is (analyses/place.py)
    SELECT * FROM majority_window('stream_gap_times')
), device_gap_times AS (
    SELECT device_id, gap_start AS start_ns, gap_end AS end_ns, gap_ns AS ns FROM device_classified
), device_place AS (
    SELECT * FROM majority_window('device_gap_times')
), per_stream_all AS (  -- one pass over the classified gaps per stream (read once, not kept): totals,
    -- time and gaps per cause, and the ones the evidence lists (the longest, the earliest among
    -- equals, from a bounded heap rather than a sort of all gaps)
    SELECT device_id, stream_id, count(*) AS n, sum(gap_ns) AS total_ns,
           median(gap_ns) AS median_ns, max(gap_ns) AS max_ns, coalesce(bool_and(one_stream), false) AS one_stream,
           coalesce(sum(sync_ns), 0) AS sync_ns, count(*) FILTER (WHERE cause = 'sync') AS sync_n,
           coalesce(sum(late_launch_ns), 0) AS late_launch_ns, count(*) FILTER (WHERE cause = 'late_launch') AS late_launch_n,
           coalesce(sum(copy_ns), 0) AS copy_ns, count(*) FILTER (WHERE cause = 'copy') AS copy_n,
           coalesce(sum(dependency_ns), 0) AS dependency_ns, count(*) FILTER (WHERE cause = 'dependency') AS dependency_n,
           coalesce(sum(unknown_ns), 0) AS unknown_ns, count(*) FILTER (WHERE cause = 'unknown') AS unknown_n,
           arg_max({'device_id': device_id, 'stream_id': stream_id, 'gap_start': gap_start,
                    'gap_end': gap_end, 'gap_ns': gap_ns, 'cause': cause, 'sync_ns': sync_ns, 'late_launch_ns': late_launch_ns, 'prev_kind': prev_kind,
                    'prev_id': prev_id, 'next_kind': next_kind, 'next_id': next_id},
                   (gap_ns, -gap_start), heap_size($max_examples)) AS top
    FROM classified GROUP BY device_id, stream_id
), stream_idle_by_cause AS (  -- per cause, the stream's device-idle time: with one stream a gap
    -- is device-idle throughout; with several, what its probes found (stream_idle); with no device
    -- known, none
    SELECT p.*,
           CASE WHEN one_stream THEN sync_ns ELSE coalesce(si.sync_idle, 0) END AS sync_idle_ns,
           CASE WHEN one_stream THEN late_launch_ns ELSE coalesce(si.late_launch_idle, 0) END AS late_launch_idle_ns,
           CASE WHEN one_stream THEN copy_ns ELSE coalesce(si.copy_idle, 0) END AS copy_idle_ns,
           CASE WHEN one_stream THEN dependency_ns ELSE coalesce(si.dependency_idle, 0) END AS dependency_idle_ns,
           CASE WHEN one_stream THEN unknown_ns ELSE coalesce(si.unknown_idle, 0) END AS unknown_idle_ns
    FROM per_stream_all p
    LEFT JOIN stream_idle si ON si.device_id = p.device_id AND si.stream_id IS NOT DISTINCT FROM p.stream_id
), per_stream_idle AS (  -- and in all
    SELECT *, sync_idle_ns + late_launch_idle_ns + copy_idle_ns + dependency_idle_ns + unknown_idle_ns AS lost_ns
    FROM stream_idle_by_cause
), listed AS (  -- the gaps the evidence lists
    SELECT unnest(top, recursive := true) FROM per_stream_all WHERE $max_examples >= 1
), listed_ops AS (  -- the operations around them, by id (a few rows: the scans skip to them)
    SELECT prev_kind AS kind, prev_id AS item_id FROM listed UNION SELECT next_kind, next_id FROM listed
), listed_names AS (
    SELECT 'kernel' AS kind, kernel_id AS item_id, name FROM kernels
    WHERE run_id = $run_id AND kernel_id IN (SELECT item_id FROM listed_ops WHERE kind = 'kernel')
    UNION ALL
    SELECT a.kind, a.item_id, a.name FROM gpu_activity a JOIN listed_ops o USING (kind, item_id)
    WHERE a.run_id = $run_id AND a.kind <> 'kernel'
), worst_gaps AS (
    SELECT t.device_id, t.stream_id,
           to_json(list({'start_ns': t.gap_start, 'end_ns': t.gap_end, 'gap_ns': t.gap_ns,
                         'cause': t.cause, 'sync_ns': t.sync_ns, 'late_launch_ns': t.late_launch_ns,
                         'before': p.name, 'after': a.name,
                         'after_kind': t.next_kind, 'after_id': t.next_id}
                        ORDER BY t.gap_ns DESC, t.gap_start)) AS worst
    FROM listed t
    LEFT JOIN listed_names p ON p.kind = t.prev_kind AND p.item_id = t.prev_id
    LEFT JOIN listed_names a ON a.kind = t.next_kind AND a.item_id = t.next_id
    GROUP BY t.device_id, t.stream_id
), per_stream AS (
    -- Per cause (CAUSES order) a struct whose fields' order makes a descending sort put the main
    -- cause first: most device-idle time, then gap time, gaps, the cause's priority (rank). Of the
    -- causes with time: the main one, and {cause: field} as JSON. A cause can have time but no
    -- gaps of its own (a short sync at the start of a long late launch): it is listed, with 0
    -- gaps. A stream's device-idle time takes its causes from the device's idle stretches, so a
    -- cause can have device-idle time and no gap time of the stream's own: it is the main one
    -- when it has the most device-idle time.
    SELECT p.* EXCLUDE (top), s.span_ns, s.steady_ns,
           [{'idle_ns': sync_idle_ns, 'ns': sync_ns, 'n': sync_n, 'rank': 5, 'cause': 'sync'},
            {'idle_ns': late_launch_idle_ns, 'ns': late_launch_ns, 'n': late_launch_n, 'rank': 4, 'cause': 'late_launch'},
            {'idle_ns': copy_idle_ns, 'ns': copy_ns, 'n': copy_n, 'rank': 3, 'cause': 'copy'},
            {'idle_ns': dependency_idle_ns, 'ns': dependency_ns, 'n': dependency_n, 'rank': 2, 'cause': 'dependency'},
            {'idle_ns': unknown_idle_ns, 'ns': unknown_ns, 'n': unknown_n, 'rank': 1, 'cause': 'unknown'}] AS per_cause,
           list_sort(list_filter(per_cause, lambda x: x.idle_ns > 0 OR x.ns > 0 OR x.n > 0), 'DESC')[1] AS main,
           main['cause'] AS main_cause, main['idle_ns'] AS main_idle_ns,
           to_json(map_from_entries(list_transform(list_filter(per_cause, lambda x: x.ns > 0 OR x.n > 0),
                                                   lambda x: (x.cause, x.ns)))) AS cause_ns,
           to_json(map_from_entries(list_transform(list_filter(per_cause, lambda x: x.idle_ns > 0),
                                                   lambda x: (x.cause, x.idle_ns)))) AS cause_idle_ns,
           to_json(map_from_entries(list_transform(list_filter(per_cause, lambda x: x.ns > 0 OR x.n > 0),
                                                   lambda x: (x.cause, x.n)))) AS cause_counts,
           coalesce(w.worst, '[]') AS worst, sp.w_start, sp.w_end, place_json(sp, 'gaps') AS place,
           coalesce(wl.warmup_ns, 0) AS warmup_ns
    FROM per_stream_idle p JOIN spans s USING (device_id)
    LEFT JOIN worst_gaps w USING (device_id, stream_id)  -- no gaps listed with max_examples = 0
    LEFT JOIN stream_place sp ON sp.device_id IS NOT DISTINCT FROM p.device_id
                             AND sp.stream_id IS NOT DISTINCT FROM p.stream_id
    LEFT JOIN warm_left wl ON wl.device_id IS NOT DISTINCT FROM p.device_id AND wl.stream_id IS NOT DISTINCT FROM p.stream_id
), per_device_all AS (
    SELECT d.device_id, count(*) AS n, sum(gap_ns) AS total_ns, median(gap_ns) AS median_ns,
           any_value(b.span_ns) AS span_ns, any_value(b.steady_ns) AS steady_ns, any_value(wd.warmup_ns) AS warmup_ns,
           coalesce(sum(sync_ns), 0) AS sync_ns, count(*) FILTER (WHERE cause = 'sync') AS sync_n,
           coalesce(sum(late_launch_ns), 0) AS late_launch_ns, count(*) FILTER (WHERE cause = 'late_launch') AS late_launch_n,
           coalesce(sum(copy_ns), 0) AS copy_ns, count(*) FILTER (WHERE cause = 'copy') AS copy_n,
           coalesce(sum(dependency_ns), 0) AS dependency_ns, count(*) FILTER (WHERE cause = 'dependency') AS dependency_n,
           coalesce(sum(unknown_ns), 0) AS unknown_ns, count(*) FILTER (WHERE cause = 'unknown') AS unknown_n,
           to_json(arg_max({'start_ns': d.gap_start, 'end_ns': d.gap_end, 'gap_ns': gap_ns, 'cause': cause,
                            'sync_ns': sync_ns, 'late_launch_ns': late_launch_ns},
                           (gap_ns, -d.gap_start), heap_size($max_examples))[1:$max_examples]) AS worst
    FROM device_classified d JOIN spans b ON b.device_id = d.device_id
    LEFT JOIN (SELECT device_id, sum(whole_ns - coalesce(end_ns - start_ns, 0)) AS warmup_ns FROM device_stretches
               GROUP BY ALL) wd
      ON wd.device_id = d.device_id
    GROUP BY d.device_id
), per_device AS (  -- a device-idle stretch is device-idle time through and through
    SELECT d.*,
           [{'idle_ns': sync_ns, 'ns': sync_ns, 'n': sync_n, 'rank': 5, 'cause': 'sync'},
            {'idle_ns': late_launch_ns, 'ns': late_launch_ns, 'n': late_launch_n, 'rank': 4, 'cause': 'late_launch'},
            {'idle_ns': copy_ns, 'ns': copy_ns, 'n': copy_n, 'rank': 3, 'cause': 'copy'},
            {'idle_ns': dependency_ns, 'ns': dependency_ns, 'n': dependency_n, 'rank': 2, 'cause': 'dependency'},
            {'idle_ns': unknown_ns, 'ns': unknown_ns, 'n': unknown_n, 'rank': 1, 'cause': 'unknown'}] AS per_cause,
           list_sort(list_filter(per_cause, lambda x: x.idle_ns > 0 OR x.ns > 0 OR x.n > 0), 'DESC')[1] AS main,
           main['cause'] AS main_cause, main['ns'] AS main_ns,
           to_json(map_from_entries(list_transform(list_filter(per_cause, lambda x: x.ns > 0 OR x.n > 0),
                                                   lambda x: (x.cause, x.ns)))) AS cause_ns,
           to_json(map_from_entries(list_transform(list_filter(per_cause, lambda x: x.ns > 0 OR x.n > 0),
                                                   lambda x: (x.cause, x.n)))) AS cause_counts,
           dp.w_start, dp.w_end, place_json(dp, 'device-idle gaps') AS place
    FROM per_device_all d LEFT JOIN device_place dp USING (device_id)
)
SELECT device_id, stream_id, 'stream' AS item_kind, stream_id AS item_id,
       'stream ' || stream_id AS item_name, w_start AS start_ns, w_end AS end_ns,
       lost_ns / nullif(steady_ns, 0) AS value, 'share' AS value_unit, $warning_share AS threshold,
       lost_ns AS est_loss_ns,
       -- Judged by the device-idle part: a side stream that waits while others work costs nothing.
       CASE WHEN lost_ns / nullif(steady_ns, 0) >= $error_share THEN 'error'
            WHEN lost_ns / nullif(steady_ns, 0) >= $warning_share THEN 'warning' ELSE 'info' END AS severity,
       printf('stream %d on device %d: %d gap(s) over %s, total %s (median %s), '
              || 'device idle in %s of it (%s of the device''s %sspan); mostly %s (%s of that)',
              stream_id, device_id, n, fmt_ns($min_gap_ns), fmt_ns(total_ns), fmt_ns(median_ns),
              fmt_ns(lost_ns), fmt_pct(lost_ns / nullif(steady_ns, 0)), steady_word(span_ns, steady_ns),
              -- On a device's only stream, work issued in time waits for no other stream: the time
              -- from a launch call's return to its kernel's start is the launch's own latency (as
              -- the time budget names it).
              CASE WHEN main_cause = 'dependency' AND one_stream THEN 'launch latency' ELSE replace(main_cause, '_', ' ') END,
              fmt_pct(main_idle_ns / lost_ns)) AS message,
       CASE WHEN main_cause = 'dependency' AND one_stream THEN 'latency' ELSE main_cause END AS hint,
       '{"count": ' || n || ', "total_ns": ' || total_ns || ', "total_of": "stream gaps", "median_ns": ' || median_ns
         || ', "max_ns": ' || max_ns || ', "span_ns": ' || span_ns || ', "steady_span_ns": ' || steady_ns
         || ', "device_idle_ns": ' || lost_ns
         || ', "main_cause": "' || main_cause || '", "cause_ns": ' || cause_ns || ', "cause_idle_ns": ' || cause_idle_ns
         || ', "cause_counts": ' || cause_counts || ', "place": ' || place || ', "warmup_ns": ' || warmup_ns || ', "worst": ' || worst || '}' AS evidence
FROM per_stream
WHERE lost_ns > 0  -- gaps while other streams kept the device busy cost nothing
UNION ALL
SELECT device_id, NULL, 'device', device_id, 'device ' || device_id, w_start, w_end,
       total_ns / nullif(steady_ns, 0), 'share', $warning_share, total_ns,
       CASE WHEN total_ns / nullif(steady_ns, 0) >= $error_share THEN 'error'
            WHEN total_ns / nullif(steady_ns, 0) >= $warning_share THEN 'warning' ELSE 'info' END,
       printf('device %d idle (no work on any stream) in %d gap(s) over %s, total %s (median %s, %s of its '
              || '%sspan); mostly %s (%s of it)',
              device_id, n, fmt_ns($min_gap_ns), fmt_ns(total_ns), fmt_ns(median_ns),
              fmt_pct(total_ns / nullif(steady_ns, 0)), steady_word(span_ns, steady_ns),
              replace(main_cause, '_', ' '), fmt_pct(main_ns / total_ns)),
       main_cause,
       '{"count": ' || n || ', "total_ns": ' || total_ns || ', "total_of": "device idle", "median_ns": ' || median_ns
         || ', "span_ns": ' || span_ns || ', "steady_span_ns": ' || steady_ns
         || ', "main_cause": "' || main_cause || '", "cause_ns": ' || cause_ns || ', "cause_counts": ' || cause_counts || ', "place": ' || place || ', "warmup_ns": ' || coalesce(warmup_ns, 0) || ', "worst": ' || worst || '}'
FROM per_device  -- (stretches keeps only devices with several streams: with one, this would repeat the stream's)
ORDER BY item_kind DESC, device_id, stream_id
"""



LABEL_GAPS = 5
HOST_CALLS = 3  # how many API calls a finding with no code around its gaps names
MIN_HOST_CALLS_SHARE = 0.1  # ... when the first took at least this share of its device-idle late-launch time

# Where no operator or range was open around the gaps (compiled code: OpenACC, CUDA C++), what the
# launching threads' API calls took of each device's steady idle time: per device, each call name's
# time inside the idle gaps' steady parts (covered_ns: running totals, not an interval join). Runtime calls when the
# run has them (a runtime call holds the driver calls it makes), else driver calls.
HOST_CALLS_SQL = """
WITH threads AS (
    SELECT DISTINCT a.device_id, c.pid, c.tid FROM gpu_activity a
    JOIN api_calls c ON c.run_id = a.run_id AND c.call_id = a.launch_call_id
    WHERE a.run_id = $run_id AND a.device_id IN (SELECT unnest($devices))
), level AS (
    SELECT CASE WHEN bool_or(api = 'runtime') THEN 'runtime' ELSE 'driver' END AS api FROM api_calls WHERE run_id = $run_id
), probes AS (
    SELECT t.device_id, c.name, c.start_ns, c.end_ns FROM api_calls c JOIN threads t USING (pid, tid)
    WHERE c.run_id = $run_id AND c.end_ns > c.start_ns AND c.api IS NOT DISTINCT FROM (SELECT api FROM level)
), idle AS (
    SELECT device_id, coalesce(device_id, -1) AS w_key, start_ns AS t0, end_ns AS t1 FROM this_run.device_idle_gaps
    WHERE device_id IN (SELECT unnest($devices))
), steady AS (  -- the idle gaps' steady parts, as the findings count them (warm-up left out)
    SELECT device_id, t1 AS end_ns, steady_start_ns AS start_ns
    FROM steady_starts('idle', 'this_run.warmup_windows', false)
), stretches AS (
    SELECT device_id, start_ns, end_ns,
           sum(end_ns - start_ns) OVER (PARTITION BY device_id ORDER BY start_ns ROWS UNBOUNDED PRECEDING) AS to_end_ns
    FROM steady WHERE end_ns > start_ns
)
SELECT device_id, name, sum(covered_ns) AS ns FROM covered_ns('probes', 'stretches', device_id)
GROUP BY ALL HAVING sum(covered_ns) > 0 ORDER BY device_id, ns DESC, name
"""


def host_calls(store, run_id: str, devices: list[int]) -> dict[int, list[dict]]:
    """Per device of `devices`, the API calls (name, ns) that took most of its idle time on the
    threads that launch its work (HOST_CALLS_SQL): at most HOST_CALLS, each with at least a tenth
    of the first's time (a 2 us query beside 1.4 ms of launches says nothing)."""
    out: dict[int, list[dict]] = {}
    for device, name, ns in store.sql(HOST_CALLS_SQL, {"run_id": run_id, "devices": devices}).fetchall():
        calls = out.setdefault(device, [])
        if len(calls) < HOST_CALLS and (not calls or 10 * ns >= calls[0]["ns"]):
            calls.append({"name": name, "ns": int(ns)})
    return out


def _window(gap: dict) -> dict:
    """Where the code around a gap is read (`_code.around_gaps`): for a late launch its late-launch
    part (after its sync part, up to the work's issue), else its start, when the GPU went idle."""
    if gap["cause"] != "late_launch" or not gap.get("late_launch_ns"):
        return {}
    start = gap["start_ns"] + (gap.get("sync_ns") or 0)
    return {"from_ns": start, "to_ns": start + gap["late_launch_ns"]}


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    """The findings of SQL, each naming the code around its gaps (`_code.around_gaps`): every gap
    the evidence lists gets `around`, and the finding the one around most of their time."""
    from .engine import query  # here: the engine imports every rule module

    # The code around a finding's gaps is judged on the same worst gaps whatever the evidence
    # lists (`max_examples` only shapes the evidence): at least LABEL_GAPS are fetched.
    df = query(store, SQL, {"run_id": run_id, **p, "max_examples": max(p["max_examples"], LABEL_GAPS)})
    if df.empty:
        return df
    evidence = [json.loads(e) for e in df["evidence"]]
    # The query names the hint (the main cause, or `latency`); on a run that replays graphs, the
    # graph advice is about the replays
    hints = {**HINTS, "latency": LATENCY_HINT}
    if any(k in REPLAYED_HINTS for k in df["hint"]) and store.sql(REPLAYS_SQL, {"run_id": run_id}).fetchone()[0]:
        hints |= REPLAYED_HINTS
    df = df.assign(hint=[hints[k] for k in df["hint"]])
    found_on = [device_key(device) for device in df["device_id"]]
    gaps = [g for ev in evidence for g in ev["worst"]]
    devices = [d for ev, d in zip(evidence, found_on) for _ in ev["worst"]]
    # A late launch's code is what the host was in through its late-launch part: the work that kept
    # the GPU idle (power iteration: "IO N", not the "Copy N" it left as the gap began)
    windows = [_window(g) for g in gaps]
    labels = around_gaps(store, run_id, [{**g, "device_id": d, **w} for g, d, w in zip(gaps, devices, windows)])
    # With operators traced, a late launch that none covers happened outside them
    outside = any(w and label is None for w, label in zip(windows, labels)) and \
        store.sql(HAS_CPU_OPS_SQL, {"run_id": run_id}).fetchone()[0]
    for g, w, label in zip(gaps, windows, labels):
        g["around"] = OUTSIDE_OPERATORS if outside and w and label is None else label
    shares = []  # of the listed gaps' time, the part around the code the finding names
    for ev in evidence:
        by_label: dict[str, int] = {}
        for g in ev["worst"]:
            if g["around"] is not None:
                by_label[g["around"]] = by_label.get(g["around"], 0) + g["gap_ns"]
        ev["around"] = min(by_label, key=lambda k: (-by_label[k], k)) if by_label else None
        shares.append(by_label[ev["around"]] / sum(g["gap_ns"] for g in ev["worst"]) if by_label else None)
    # With no code around a late launch's gaps, the calls the host made in the idle time say what kept it
    unnamed = {d for ev, d in zip(evidence, found_on)
               if ev["around"] is None and ev["main_cause"] == "late_launch" and d is not None}
    calls = host_calls(store, run_id, sorted(unnamed)) if unnamed else {}
    messages = []
    for ev, message, device, share in zip(evidence, df["message"], found_on, shares):
        idle = ev.get("cause_idle_ns") or ev["cause_ns"]  # device-idle time per cause, as the calls are
        if ev["around"] is not None:
            message = f"{message} {phrase(ev['around'], share)}"
        elif calls.get(device) and calls[device][0]["ns"] >= MIN_HOST_CALLS_SHARE * idle.get("late_launch", 0):
            ev["host_calls"] = calls[device]
            message += " (the launching thread's calls in the device's idle time: " + ", ".join(
                f"{c['name']} {fmt_ns(c['ns'])}" for c in ev["host_calls"]) + ")"
        messages.append(message)
        ev["worst"] = ev["worst"][:p["max_examples"]]
    return df.assign(message=messages, evidence=[json.dumps(ev) for ev in evidence])


# SQL's words for a one-stream device's issued work that waited: nothing else can have held it,
# so the wait is the launch's own latency ...
LATENCY_WORDS, DEPENDENCY_WORDS = "mostly launch latency (", "mostly dependency ("


def _unknown(store, run_id: str, df: pd.DataFrame) -> pd.DataFrame:
    """`launch_gap_unknown`; a finding that abstains says the trace may lack what held the work,
    so not the launch latency: dependency."""
    df = launch_gap_unknown(store, run_id, df)
    abstained = [(json.loads(e) if isinstance(e, str) else e).get("cause") == CAUSE_UNKNOWN for e in df["evidence"]]
    return df.assign(message=[m.replace(LATENCY_WORDS, DEPENDENCY_WORDS) if a else m
                              for m, a in zip(df["message"], abstained)])


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class T001Example(TimeRange, kw_only=True, forbid_unknown_fields=True):
    gap_ns: Annotated[int, doc("time between the kernels")]
    cause: Annotated[str, doc("the gap's cause (late_launch, dependency, sync, copy, unknown)")]
    sync_ns: Annotated[Optional[int], doc("the gap's time in a blocking call, from its start (NULL: no launch call)")] = None
    late_launch_ns: Annotated[Optional[int], doc("then its time until the work was issued (NULL: no launch call)")] = None
    before: Annotated[Optional[str], doc("name of the operation before the gap")] = None
    after: Annotated[Optional[str], doc("name of the operation after the gap")] = None
    after_kind: Annotated[Optional[str], doc("kind of the operation after the gap (kernel, memcpy, ...)")] = None
    after_id: Annotated[Optional[int], doc("id of the operation after the gap")] = None
    around: Annotated[Optional[str], doc(
        "the code (operator or range) around the gap; for a late launch that no operator covers in a trace with "
        "operators, \"outside any operator\"")]


class T001HostCall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, doc("the API call's name")]
    ns: Annotated[int, doc("its calls' time inside the device's idle gaps")]


class T001Evidence(PlacedEvidence, kw_only=True, forbid_unknown_fields=True):
    warmup_ns: Annotated[int, doc("gap time inside warm-up windows, left out of the totals")]
    count: Annotated[int, doc("gaps counted")]
    total_ns: Annotated[int, doc("total time")]
    total_of: Annotated[str, doc("what total_ns is the time of")]
    median_ns: Annotated[float, doc("median interval")]
    max_ns: Annotated[Optional[int], doc("the longest interval")] = None
    span_ns: Annotated[int, doc("the device's span (first GPU operation to last)")]
    steady_span_ns: Annotated[Optional[int], doc("the device's span less its time inside warm-up windows: what the shares are of")] = None
    device_idle_ns: Annotated[Optional[int], doc("time of the gaps with the whole device idle")] = None
    main_cause: Annotated[str, doc("the cause with the most gap time")]
    cause_ns: Annotated[dict[str, int], doc("gap time per cause")]
    cause_idle_ns: Annotated[Optional[dict[str, int]], doc("idle time per cause with the whole device idle")] = None
    cause_counts: Annotated[dict[str, int], doc("gaps per cause")]
    place: Annotated[Place, doc("where most of the intervals lie")]
    worst: Annotated[list[T001Example], doc("the longest gaps, with their neighbours and cause")]
    around: Annotated[Optional[str], doc("the code (operator or range) around most of the listed gaps' time, as "
                                          "`worst[].around` names it")]
    host_calls: Annotated[Optional[list[T001HostCall]], doc(
        "with no code around a late launch's gaps, the API calls of the threads launching the device's work that "
        "took most of its idle time outside warm-up")] = None


RULE = Rule(
    id="T001",
    evidence=T001Evidence,
    name="launch-gaps",
    title="Idle gaps between GPU operations",
    phase="timeline",
    claims="idle",
    severity="warning",
    what="Idle gaps longer than `min_gap_ns` between consecutive kernels, copies and memsets on "
         "each stream, and stretches where no stream of a device has work.",
    why="A GPU that waits between operations does nothing useful: with thousands of small "
        "kernels, a few microseconds per launch add up to a large share of the run. The cause "
        "is almost always on the host: a synchronizing call between launches, a launch thread "
        "that cannot keep up, or a copy the stream waits for.",
    how="Operations are ordered per device and stream; a gap is the time from the latest end "
        "so far to the next start, less its time inside warm-up windows of its device "
        "(`warmup_windows`; see the macro `steady_start`: the gap's start moves later by that time; the "
        "gap time so left out is the evidence's `warmup_ns`). Each gap's time is split in time between causes, read from the "
        "launch call of the operation that ends it and that call's thread, as the time budget "
        "(`time_budget`) splits an idle stretch: until the launch call returned the host had not issued "
        "the work (a blocking call the thread entered after the launch holds none of it); of that "
        "time, the time the thread spent in blocking calls (a synchronize, or a synchronous copy or "
        "memset: one in progress when the gap began or entered before the launch call, however late "
        "in the gap) is `sync`, the rest `late_launch` (the budget's `host`: a CPU-bound launch); "
        "the rest of the gap is `copy` when a copy on another stream of the device ran in it, else "
        "`dependency` (issued, the work waited: another stream, an event, the launch latency; on a "
        "device's only stream, the latency, which its hint then names); all "
        "`unknown` when no launch call is linked. A gap's sync time is counted first in it. The "
        "estimated loss is the part of the gaps during which the whole device was idle; severity is "
        "by that loss as a share of the device's steady span (first GPU operation to last, the time budget's, less its "
        "time inside warm-up windows: the gaps leave that time out too), and a stream whose "
        "gaps were all covered by other streams' work is not reported. A device-wide finding reports "
        "idle stretches across all streams when a device has several, each stretch split the same "
        "way from the operation that ends it (of those starting then, the first launched). On such "
        "a device a stream's device-idle time is the part of its gaps inside those stretches (over "
        "`min_gap_ns`), with the causes the stretches give it: the device was idle for the reason "
        "its own next operation gives, whatever the stream waited for. With every "
        "gap counted (`min_gap_ns` = 0), the time per cause of a one-stream device's stream, or of a "
        "device-wide finding, is the budget's idle split of the device (unified-memory page "
        "migrations aside: streams leave them out). The evidence gives time per cause (`cause_ns`, "
        "summing to `total_ns`: gap time for a stream, device-idle time for a device), a stream's "
        "device-idle time per cause (`cause_idle_ns`, summing to `device_idle_ns`) and gaps per cause "
        "(`cause_counts`: each gap under the cause with the most of its time, the earlier in the "
        "order above among equals; a cause can have time and no gaps); the main cause, which the "
        "message and hint follow, is the one with the most device-idle time (ties: most gap time, "
        "most gaps, then the order above). Each gap listed names the code the host was in when the GPU "
        "went idle (`around`): the innermost PyTorch operator, else NVTX range or user annotation, open at "
        "the gap's start on the thread that launched the operation ending it, or for a late launch the "
        "innermost one covering at least half of its late-launch part (from the end of its sync part to the "
        "work's issue), where one does (a profiler step is never named: it says nothing of what the host did): the work that kept the GPU waiting, not what "
        "the host was leaving when it went idle; in a trace with PyTorch operators, a late launch that none "
        "covers so, nor is open at its start, is \"outside any operator\" (Python or framework code between ops, or "
        "a wait of the thread's own: the trace cannot tell); the finding names the one around most of the listed gaps' time; where none is (compiled code) and the main cause is a late "
        "launch, the finding names the API calls of the threads launching the device's work that took most of "
        "its idle time outside warm-up, where the first took at least a tenth of the finding's device-idle late-launch "
        "time (`host_calls`: runtime calls where the run has them, else driver calls)." + PLACE_HOW,
    fix="Remove synchronizations between launches; batch small kernels or capture them in a "
        "CUDA graph; keep the launch thread free of other work; overlap copies on other streams.",
    requires="timed GPU operations (kernels, copies or memsets with start and end times)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM gpu_activity WHERE run_id = $run_id)",
    thresholds=(
        Threshold("min_gap_ns", 5000, "Gaps at or below this are ignored (5 us, by design)."),
        Threshold("warning_share", 0.05, "Device-idle gap time as a share of the device's steady span that makes a warning (below: info)."),
        Threshold("error_share", 0.25, "Device-idle gap time as a share of the device's steady span that makes an error."),
        Threshold("max_examples", 5, "How many of the worst gaps the evidence lists."),
    ),
    evaluate=evaluate,
    references=(
        "Nsight Systems `nsys analyze` rule gpu_gaps (default 500 ms; this rule looks at launch-scale gaps)",
        "CUDA C++ Best Practices Guide: 'Asynchronous and Overlapping Transfers with Computation'",
    ),
    unknown=_unknown,
)
