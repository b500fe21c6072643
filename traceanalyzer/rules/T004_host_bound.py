"""T004 host-bound stretches: every GPU of the run idle while the host works on what it has not issued yet."""

from typing import Annotated, Optional

import msgspec

from ..analyses.place import HOW as PLACE_HOW
from ..analyses.steps import PROFILER_STEP
from ._unknown import idle_unknown
from .base import Rule, Threshold
from .evidence import Place, PlacedEvidence, TimeRange, doc

# The stretches are the gaps in the union of GPU work over all devices (analyses.timeline.run_idle_gaps:
# idle on every GPU, computed once per run and kept with a big run's cache). Of each, only its
# host part can be host-bound: up to where some device was given the work that ends its idle
# stretch (its launch call returned, as the time budget reads it: the macro `idle_issued_at`), less the
# time threads spent in blocking calls (waiting, not working: the budget's `sync`). After that
# the GPU had work and waited for something else (the budget's `dependency`); with no launch
# call known, nobody can tell (`unknown`). So a stretch's host time is at most the budget's
# `host` time of it on every device whose span holds it.
# Host work is the host activity outside blocking calls: framework ops, API calls, CPU ranges
# (NVTX, record_function) but ProfilerStep#N, which only says a step is running, not that the
# host works: a range around a step covers the time the host waits for the GPU too.
# What the host was doing in a stretch is the innermost of those events (shortest) with at
# least half of its host work (time outside blocking calls), else the one with most of it.

SQL = r"""
WITH warm AS (  -- the warm-up windows of every device together
    SELECT * FROM run_warmup_merged('this_run.warmup_windows', true)
), idle AS (
    SELECT -1 AS w_key, start_ns AS t0, end_ns AS t1 FROM this_run.run_idle_gaps
), steady AS (  -- each GPU-idle stretch's steady part (none: all warm-up)
    SELECT t0 AS idle_start, t1 AS end_ns, steady_start_ns AS start_ns
    FROM steady_starts('idle', 'this_run.warmup_windows', true)
), gpu_idle AS (
    SELECT row_number() OVER (ORDER BY start_ns) AS sid, start_ns, end_ns, end_ns - start_ns AS gap_ns
    FROM steady WHERE end_ns - start_ns >= $min_stretch_ns
), warm_total AS (  -- the GPU-idle time left out as warm-up
    SELECT coalesce(sum(end_ns - idle_start) - sum(end_ns - coalesce(start_ns, end_ns)), 0) AS warmup_ns FROM steady
), devices AS (
    SELECT DISTINCT coalesce(device_id, -1) AS dkey FROM this_run.device_idle_gaps
), device_stretch AS (  -- per stretch, each device's idle stretch that holds it (a device whose span
    -- does not hold it has none: none of its budget is idle then)
    SELECT i.sid, g.dkey, g.start_ns AS d_start, g.end_ns AS d_end
    FROM (SELECT * FROM gpu_idle, devices) i
    ASOF JOIN (SELECT coalesce(device_id, -1) AS dkey, start_ns, end_ns FROM this_run.device_idle_gaps) g
      ON g.dkey = i.dkey AND g.start_ns <= i.start_ns
    WHERE g.end_ns >= i.end_ns
), ending AS (  -- the operation that ends each device's idle stretch: of those starting then, the
    -- first launched (as the budget reads it)
    SELECT d.sid, d.dkey, d.d_start, d.d_end,
           arg_min({'call_start': c.start_ns, 'call_end': c.end_ns},
                   coalesce(c.start_ns, 9223372036854775807)) AS first
    FROM device_stretch d
    JOIN gpu_activity a ON a.run_id = $run_id AND coalesce(a.device_id, -1) = d.dkey AND a.start_ns = d.d_end
    LEFT JOIN api_calls c ON c.run_id = $run_id AND c.call_id = a.launch_call_id
    GROUP BY ALL
), issued AS (  -- per stretch and device, where the device's work was issued (the stretch's start
    -- when no launch call is known: the host's share cannot be told)
    SELECT sid, CASE WHEN first.call_start IS NULL THEN d_start
                     ELSE idle_issued_at(d_start, d_end, first.call_start, first.call_end) END AS issued_ns
    FROM ending
), host_end AS (  -- the host part of each stretch ends where the first device had its work
    SELECT s.sid, s.start_ns, s.gap_ns,
           greatest(least(coalesce(min(i.issued_ns), s.start_ns), s.end_ns), s.start_ns) AS end_ns
    FROM gpu_idle s LEFT JOIN issued i USING (sid) GROUP BY s.sid, s.start_ns, s.end_ns, s.gap_ns
), run_blocking AS (  -- every thread's blocking calls together: time some thread waited
    SELECT * FROM run_all_threads_blocking($run_id)
), host_start AS (
    SELECT h.*, blocked_at(h.start_ns, b.blocked_ns, b.reach_ns) AS blocked_before
    FROM host_end h ASOF LEFT JOIN run_blocking b ON b.start_ns <= h.start_ns
), stretches AS MATERIALIZED (  -- the host parts with at least min_stretch_ns of time outside
    -- blocking calls (read by several CTEs: computed once)
    SELECT * FROM (
        SELECT h.sid, h.start_ns, h.end_ns, h.end_ns - h.start_ns AS part_ns, h.gap_ns AS idle_ns,
               h.end_ns - h.start_ns - (blocked_at(h.end_ns, b.blocked_ns, b.reach_ns) - h.blocked_before) AS host_ns
        FROM host_start h ASOF LEFT JOIN run_blocking b ON b.start_ns <= h.end_ns)
    WHERE host_ns >= $min_stretch_ns AND host_ns > 0
), host_all AS (
    SELECT 'cpu_op' AS kind, op_id AS id, pid, tid, start_ns, end_ns FROM cpu_ops
    WHERE run_id = $run_id AND end_ns > start_ns
    UNION ALL
    SELECT 'range', range_id, pid, tid, start_ns, end_ns FROM ranges
    WHERE run_id = $run_id AND kind IN ('nvtx', 'user_annotation') AND end_ns > start_ns
      AND NOT (coalesce(name, '') LIKE 'ProfilerStep#%' AND regexp_matches(name, '__PROFILER_STEP__'))
    UNION ALL
    SELECT 'api_call', call_id, pid, tid, start_ns, end_ns FROM api_calls
    WHERE run_id = $run_id AND end_ns > start_ns
), -- Most host events (millions of API calls) fall in busy time. A cheap exact prefilter keeps
   -- those that may overlap a stretch: time is cut into buckets of width w (about 100k buckets
   -- over the GPU-idle stretches at most), and an event is kept if it spans more than two buckets or
   -- one of its end buckets holds part of a stretch. An overlap lies in a bucket of both.
   -- Both end buckets are looked up at once, by their sum (one hash probe per event, not two:
   -- 8 M API calls, 0.2 s): 2k for an event within bucket k, 2k + 1 for one that crosses from
   -- k into k + 1. So the sums to keep are 2k - 1, 2k and 2k + 1 for each bucket k that holds
   -- part of a stretch.
bucket AS (
    SELECT CAST(greatest(coalesce(sum(gap_ns), 0) // 100000, 1000) AS BIGINT) AS w FROM gpu_idle
), idle_buckets AS (
    SELECT DISTINCT unnest(range(s.start_ns // b.w, s.end_ns // b.w + 1)) AS k FROM stretches s, bucket b
), near_keys AS (
    SELECT DISTINCT unnest([2 * k - 1, 2 * k, 2 * k + 1]) AS key FROM idle_buckets
), host_near AS (
    SELECT h.* FROM host_all h, bucket b
    WHERE h.end_ns // b.w - h.start_ns // b.w > 1
       OR h.start_ns // b.w + h.end_ns // b.w IN (SELECT key FROM near_keys)
), -- Stretches are disjoint and numbered in time order, so the ones a host event overlaps are
   -- a run of numbers: from the first stretch ending after the event starts to the last one
   -- starting before it ends (two ASOF joins). An interval-overlap join is quadratic here.
host_reach AS (
    SELECT h.*, f.sid AS first_sid, l.sid AS last_sid
    FROM host_near h
    ASOF JOIN stretches f ON h.start_ns < f.end_ns
    ASOF JOIN stretches l ON h.end_ns > l.start_ns
    WHERE f.sid <= l.sid
), overlapping AS (  -- host events with the stretches they overlap
    SELECT h.*, s.start_ns AS s_start, s.end_ns AS s_end
    FROM (SELECT *, unnest(range(first_sid, last_sid + 1)) AS sid FROM host_reach) h
    JOIN stretches s USING (sid)
), clipped AS (  -- host events clipped to the stretches they overlap
    SELECT o.sid, o.kind, o.id, o.end_ns - o.start_ns AS dur_ns,
           greatest(o.start_ns, o.s_start) AS c_start, least(o.end_ns, o.s_end) AS c_end
    FROM overlapping o
), clipped_from AS (
    SELECT c.*, blocked_at(c.c_start, b.blocked_ns, b.reach_ns) AS blocked_before FROM clipped c
    ASOF LEFT JOIN run_blocking b ON b.start_ns <= c.c_start
), inside AS (  -- with each one's time outside blocking calls
    SELECT c.*, c.c_end - c.c_start - (blocked_at(c.c_end, b.blocked_ns, b.reach_ns) - c.blocked_before) AS work_ns
    FROM clipped_from c ASOF LEFT JOIN run_blocking b ON b.start_ns <= c.c_end
), islands AS (  -- the union of the clipped host events per stretch
    SELECT sid, min(c_start) AS i_start, max(c_end) AS i_end FROM (
        SELECT *, sum(CASE WHEN prev_end IS NULL OR c_start > prev_end THEN 1 ELSE 0 END)
                  OVER (PARTITION BY sid ORDER BY c_start, c_end ROWS UNBOUNDED PRECEDING) AS isl
        FROM (SELECT sid, c_start, c_end,
                     max(c_end) OVER (PARTITION BY sid ORDER BY c_start, c_end
                                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
              FROM inside))
    GROUP BY sid, isl
), islands_from AS (
    SELECT i.*, blocked_at(i.i_start, b.blocked_ns, b.reach_ns) AS blocked_before FROM islands i
    ASOF LEFT JOIN run_blocking b ON b.start_ns <= i.i_start
), covered AS (  -- per stretch, the host's work: the union less the time in blocking calls
    SELECT i.sid, sum(i.i_end - i.i_start - (blocked_at(i.i_end, b.blocked_ns, b.reach_ns) - i.blocked_before)) AS work_ns
    FROM islands_from i ASOF LEFT JOIN run_blocking b ON b.start_ns <= i.i_end
    GROUP BY i.sid
), main_event AS (  -- innermost event with half the stretch's work, else the one with most
    SELECT i.sid, arg_min({'kind': i.kind, 'id': i.id, 'work_ns': i.work_ns},
                          (i.work_ns < c.work_ns / 2, i.dur_ns, -i.work_ns, i.kind, i.id)) AS e
    FROM inside i JOIN covered c USING (sid) WHERE i.work_ns > 0 GROUP BY i.sid
), main AS (  -- named only now: the names of millions of host events are never read
    SELECT m.sid, m.e.kind AS main_kind, m.e.id AS main_id, m.e.work_ns AS main_work_ns,
           regexp_replace(normalized_name(coalesce(o.name, r.name, c.name)), '([#\s_:.-])\d+$', '\1N') AS main_name
    FROM main_event m
    LEFT JOIN cpu_ops o ON m.e.kind = 'cpu_op' AND o.run_id = $run_id AND o.op_id = m.e.id
    LEFT JOIN ranges r ON m.e.kind = 'range' AND r.run_id = $run_id AND r.range_id = m.e.id
    LEFT JOIN api_calls c ON m.e.kind = 'api_call' AND c.run_id = $run_id AND c.call_id = m.e.id
), bound AS (
    SELECT s.*, c.work_ns / s.host_ns AS host_busy_share, m.main_kind, m.main_id, m.main_name,
           least(m.main_work_ns, s.host_ns) AS main_ns  -- the activity's own work in the stretch
    FROM stretches s JOIN covered c USING (sid) JOIN main m USING (sid)
    WHERE c.work_ns >= $min_host_busy_share * s.host_ns
), idle_total AS (
    SELECT count(*) AS n_all, coalesce(sum(gap_ns), 0) AS all_ns FROM gpu_idle
), top AS (
    SELECT to_json(list({'name': main_name, 'kind': main_kind, 'stretches': n, 'ns': ns}
                        ORDER BY ns DESC, main_name)[1:$max_examples]) AS top_json,
           arg_max(main_name, (ns, -n, main_name)) AS top_name,
           arg_max(main_kind, (ns, -n, main_name)) AS top_kind,
           max(ns) AS top_ns
    FROM (SELECT main_name, main_kind, count(*) AS n, sum(main_ns) AS ns FROM bound GROUP BY ALL)
), summary AS (
    SELECT count(*) AS n, sum(host_ns) AS total_ns, max(host_ns) AS max_ns, median(host_ns) AS median_ns,
           to_json(arg_max({'start_ns': start_ns, 'end_ns': end_ns, 'host_ns': host_ns, 'gpu_idle_ns': idle_ns,
                            'host_busy_share': round(host_busy_share, 4), 'main': main_name,
                            'main_kind': main_kind, 'main_id': main_id},
                           (host_ns, -start_ns), heap_size($max_examples))[1:$max_examples]) AS worst
    FROM bound
), run AS (  -- the GPUs' span: first GPU operation on any device to the last (one device: its span),
    -- and its steady part, what the share is of: the stretches' time inside warm-up windows is left out
    SELECT max(last_end_ns) - min(first_start_ns) AS span_ns,
           max(last_end_ns) - min(first_start_ns) - (SELECT coalesce(sum(end_ns - start_ns), 0) FROM warm) AS steady_ns,
           count(*) AS n_devices
    FROM this_run.device_busy
), bound_host AS (
    SELECT start_ns, end_ns, host_ns AS ns FROM bound
), place AS (  -- where most of the host-bound time is (analyses/place.py)
    SELECT * FROM majority_window('bound_host')
)
SELECT NULL::INTEGER AS device_id, NULL::BIGINT AS stream_id, 'run' AS item_kind, NULL::BIGINT AS item_id,
       'host-bound stretches' AS item_name, w_start AS start_ns, w_end AS end_ns,
       total_ns / nullif(steady_ns, 0) AS value, 'share' AS value_unit, $min_share AS threshold,
       total_ns AS est_loss_ns,
       CASE WHEN total_ns / nullif(steady_ns, 0) >= $error_share THEN 'error' END AS severity,
       printf('every GPU idle while the host worked before issuing the work: %d stretch(es) of %s or more, %s in all '
              || '(%s of %s, longest %s); %s %s',
              n, fmt_ns($min_stretch_ns), fmt_ns(total_ns), fmt_pct(total_ns / nullif(steady_ns, 0)),
              CASE WHEN n_devices = 1 THEN 'the device''s ' ELSE 'the GPUs'' ' END || steady_word(span_ns, steady_ns) || 'span',
              fmt_ns(max_ns),
              -- "most of it" only where it is: else the largest part, with its share
              CASE WHEN 2 * top_ns >= total_ns THEN 'most of it in'
                   ELSE printf('its largest part (%s) in', fmt_pct(top_ns / total_ns)) END,
              -- what the name is, and that a trailing N stands for the numbers merged
              CASE top_kind WHEN 'cpu_op' THEN 'operator ' WHEN 'api_call' THEN 'API call ' ELSE 'range ' END
                || '"' || coalesce(top_name, '?') || '"'
                || CASE WHEN regexp_matches(coalesce(top_name, ''), '[#\s_:.-]N$') THEN ' (N: any number)' ELSE '' END) AS message,
       -- The advice follows what the host did most: waiting for data is not launch overhead.
       CASE WHEN top_name ILIKE '%DataLoader%'
            THEN 'The GPU waits for the next batch: load and preprocess data in background workers (DataLoader num_workers > 0, persistent_workers, prefetch_factor), pin_memory=True, and move preprocessing to the GPU.'
            WHEN compiled_code_name(top_name)
            THEN 'The host time is inside compiled code (TorchInductor''s generated calls): compiling did not remove the per-kernel launches; compile with mode="reduce-overhead" (CUDA/HIP graphs) so each call replays its kernels in one launch, and keep shapes static so the graphs are reused.'
            ELSE 'The bottleneck is on the host, not in any kernel: look at what the host runs in the stretches listed in the evidence. Move that work off the loop or overlap it with GPU work (background threads or processes, prefetching), and cut Python overhead between launches (torch.compile, CUDA graphs).'
       END AS hint,
       '{"stretches": ' || n || ', "total_ns": ' || total_ns || ', "median_ns": ' || median_ns
         || ', "max_ns": ' || max_ns || ', "gpu_span_ns": ' || span_ns || ', "steady_span_ns": ' || steady_ns
         || ', "gpu_idle_stretches": ' || n_all || ', "gpu_idle_ns": ' || all_ns || ', "warmup_ns": ' || warmup_ns
         || ', "top_activity": ' || top_json || ', "place": ' || place_json(place, 'stretches') || ', "worst": ' || worst || '}' AS evidence
FROM summary, top, run, idle_total, place, warm_total
WHERE n > 0 AND total_ns / nullif(steady_ns, 0) >= $min_share
"""
SQL = SQL.replace("__PROFILER_STEP__", PROFILER_STEP)

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class T004TopActivity(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, doc("name")]
    kind: Annotated[str, doc("the activity's kind (cpu_op, runtime call, range)")]
    stretches: Annotated[int, doc("idle stretches")]
    ns: Annotated[int, doc("its own work (outside blocking calls) in the stretches it is the activity of")]


class T004Example(TimeRange, kw_only=True, forbid_unknown_fields=True):
    host_ns: Annotated[int, doc("host time in the stretch")]
    gpu_idle_ns: Annotated[int, doc("GPU idle time")]
    host_busy_share: Annotated[float, doc("share of the stretch the host thread was busy")]
    main: Annotated[str, doc("name of the host activity taking most of the stretch")]
    main_kind: Annotated[str, doc("kind of that activity")]
    main_id: Annotated[int, doc("id of that activity")]


class T004Evidence(PlacedEvidence, kw_only=True, forbid_unknown_fields=True):
    warmup_ns: Annotated[int, doc("idle time inside warm-up windows, left out of the totals")]
    stretches: Annotated[int, doc("idle stretches")]
    total_ns: Annotated[int, doc("total time")]
    median_ns: Annotated[float, doc("median interval")]
    max_ns: Annotated[int, doc("the longest interval")]
    gpu_span_ns: Annotated[int, doc("time from the first to the last GPU activity")]
    steady_span_ns: Annotated[Optional[int], doc("gpu_span_ns less its time inside warm-up windows: what the share is of")] = None
    gpu_idle_stretches: Annotated[int, doc("stretches with the GPU idle")]
    gpu_idle_ns: Annotated[int, doc("GPU idle time")]
    top_activity: Annotated[list[T004TopActivity], doc("host activities taking most of the stretches")]
    place: Annotated[Place, doc("where most of the intervals lie")]
    worst: Annotated[list[T004Example], doc("the longest GPU-idle stretches with the host busy")]


RULE = Rule(
    id="T004",
    evidence=T004Evidence,
    name="host-bound",
    title="Host-bound stretches: every GPU idle while the host works",
    phase="timeline",
    claims="idle:host",
    severity="warning",
    what="Stretches during which no GPU of the run has any work while the host works on what it "
         "has not issued yet (framework ops, NVTX or record_function ranges, API calls): their host "
         "time (outside blocking calls, up to the launch of the work that ends them), its share of "
         "the GPUs' span, and what the host was doing.",
    why="When every GPU waits and the host is working, the bottleneck is not in any kernel: data "
        "loading, preprocessing, Python overhead or host-side bookkeeping decide the run's speed, "
        "and optimizing kernels gains nothing until the host keeps the GPUs fed.",
    how="GPU operations of all devices are merged into busy intervals; the gaps between them of at "
        "least `min_stretch_ns` are GPU-idle stretches (time before the first and after the last "
        "GPU operation is not counted), less their time inside warm-up windows of any device "
        "(`warmup_windows`; see the macro `steady_start`: a stretch's start moves later by that time; the "
        "GPU-idle time so left out is the evidence's `warmup_ns`). Of each stretch only its host part counts: up to where the "
        "first device was given the work that ends its idle stretch (the return of that work's "
        "launch call, or of a blocking call its thread was in when the device went idle, as the "
        "time budget reads it; none where no launch call is known, or where no device's span holds "
        "the stretch), less the time any thread spent in blocking calls (a synchronize, a synchronous "
        "copy or memset: waiting, not working). That is the stretch's host time; per device it is "
        "at most the budget's `idle:host` time of the stretch. A stretch is host-bound when its host "
        "time is at least `min_stretch_ns` and the host's work covers at least `min_host_busy_share` "
        "of it. The host's work is the recorded host activity outside blocking calls: framework ops, "
        "API calls, and NVTX or record_function ranges but `ProfilerStep#N` (a step is running, "
        "which says nothing of what the host does). "
        "The host activity of a stretch is the innermost event (shortest) with at least half of its "
        "work, else the event with most of it (`#N` suffixes are merged); the message names the activity "
        "with the most time of its own in the stretches it is the activity of (`top_activity[].ns`: its "
        "work there, not the stretches' whole host time). The finding's value is the "
        "host time of the host-bound stretches as a share of the GPUs' span (first GPU operation on any "
        "device to the last: with one device, its span in the time budget; `gpu_span_ns`) less its time "
        "inside warm-up windows (`steady_span_ns`, the span the message names steady); it is "
        "reported at `min_share` and becomes an error at `error_share`. The estimated loss is that "
        "host time (an upper bound: the GPU could have worked through all of it). The evidence lists "
        "the stretches with the most host time (`host_ns`, the GPU-idle stretch's `gpu_idle_ns`)." + PLACE_HOW,
    fix="Move data loading and preprocessing off the training thread (DataLoader workers, pinned "
        "memory, prefetching), do preprocessing on the GPU, reduce per-step Python work "
        "(torch.compile, CUDA graphs), avoid host-side bookkeeping between launches.",
    requires="timed GPU operations and host events (framework ops, CPU ranges or API calls)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM gpu_activity WHERE run_id = $run_id) AND "
                "(EXISTS (SELECT 1 FROM cpu_ops WHERE run_id = $run_id) OR "
                "EXISTS (SELECT 1 FROM api_calls WHERE run_id = $run_id) OR "
                "EXISTS (SELECT 1 FROM ranges WHERE run_id = $run_id AND kind IN ('nvtx', 'user_annotation')))",
    thresholds=(
        Threshold("min_stretch_ns", 100000, "Stretches with less host time than this are left to T001 (100 us)."),
        Threshold("min_host_busy_share", 0.5, "Share of a stretch's host time that the host's work must cover for it to count as host-bound."),
        Threshold("min_share", 0.05, "Host-bound time as a share of the GPUs' steady span that is reported."),
        Threshold("error_share", 0.25, "Share that makes an error."),
        Threshold("max_examples", 5, "How many stretches and activities the evidence lists."),
    ),
    sql=SQL,
    references=(
        "Nsight Systems `nsys analyze` rules gpu_gaps and gpu_time_util",
        "PyTorch performance tuning guide: 'Enable async data loading and augmentation'",
        "Holistic Trace Analysis: idle time breakdown (host wait)",
    ),
    unknown=idle_unknown,
)
