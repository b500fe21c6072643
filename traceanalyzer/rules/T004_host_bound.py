"""T004 host-bound stretches: every GPU of the run idle while the host is busy."""

from .base import Rule, Threshold

# The stretches are the gaps in the union of GPU work over all devices (views.run_idle_gaps:
# idle on every GPU, computed once per run and kept with a big run's cache). Host activity is
# any recorded host event: framework ops, CPU ranges (NVTX, record_function) and API calls.
# What the host was doing in a stretch is the innermost event (shortest) covering at least
# half of it; enclosing ranges such as ProfilerStep#N only win when nothing finer covers it.
SQL = r"""
WITH stretches AS (
    SELECT row_number() OVER (ORDER BY start_ns) AS sid, start_ns, end_ns, gap_ns
    FROM run_idle_gaps WHERE run_id = $run_id AND gap_ns >= $min_stretch_ns
), host AS (
    SELECT 'cpu_op' AS kind, op_id AS id, pid, tid, start_ns, end_ns FROM cpu_ops
    WHERE run_id = $run_id AND end_ns > start_ns
    UNION ALL
    SELECT 'range', range_id, pid, tid, start_ns, end_ns FROM ranges
    WHERE run_id = $run_id AND kind IN ('nvtx', 'user_annotation') AND end_ns > start_ns
    UNION ALL
    SELECT 'api_call', call_id, pid, tid, start_ns, end_ns FROM api_calls
    WHERE run_id = $run_id AND end_ns > start_ns
), -- Most host events (millions of API calls) fall in busy time. A cheap exact prefilter keeps
   -- those that may overlap a stretch: time is cut into buckets of width w (about 100k buckets
   -- over all stretches at most), and an event is kept if it spans more than two buckets or
   -- one of its end buckets holds part of a stretch. An overlap lies in a bucket of both.
   -- Both end buckets are looked up at once, by their sum (one hash probe per event, not two:
   -- 8 M API calls, 0.2 s): 2k for an event within bucket k, 2k + 1 for one that crosses from
   -- k into k + 1. So the sums to keep are 2k - 1, 2k and 2k + 1 for each bucket k that holds
   -- part of a stretch.
bucket AS (
    SELECT CAST(greatest(coalesce(sum(gap_ns), 0) // 100000, 1000) AS BIGINT) AS w FROM stretches
), idle_buckets AS (
    SELECT DISTINCT unnest(range(s.start_ns // b.w, s.end_ns // b.w + 1)) AS k FROM stretches s, bucket b
), near_keys AS (
    SELECT DISTINCT unnest([2 * k - 1, 2 * k, 2 * k + 1]) AS key FROM idle_buckets
), host_near AS (
    SELECT h.* FROM host h, bucket b
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
), inside AS (  -- host events clipped to the stretches they overlap
    SELECT s.sid, s.gap_ns, h.kind, h.id, h.end_ns - h.start_ns AS dur_ns,
           greatest(h.start_ns, s.start_ns) AS c_start, least(h.end_ns, s.end_ns) AS c_end
    FROM (SELECT *, unnest(range(first_sid, last_sid + 1)) AS sid FROM host_reach) h
    JOIN stretches s USING (sid)
), covered AS (  -- union of the clipped host events per stretch
    SELECT sid, sum(i_end - i_start) AS busy_ns FROM (
        SELECT sid, min(c_start) AS i_start, max(c_end) AS i_end FROM (
            SELECT *, sum(CASE WHEN prev_end IS NULL OR c_start > prev_end THEN 1 ELSE 0 END)
                      OVER (PARTITION BY sid ORDER BY c_start, c_end ROWS UNBOUNDED PRECEDING) AS isl
            FROM (SELECT sid, c_start, c_end,
                         max(c_end) OVER (PARTITION BY sid ORDER BY c_start, c_end
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
                  FROM inside))
        GROUP BY sid, isl)
    GROUP BY sid
), main_event AS (  -- innermost event covering half the stretch, else the one covering most
    SELECT sid, arg_min({'kind': kind, 'id': id}, (c_end - c_start < gap_ns / 2, dur_ns, -(c_end - c_start), kind, id)) AS e
    FROM inside GROUP BY sid
), main AS (  -- named only now: the names of millions of host events are never read
    SELECT m.sid, m.e.kind AS main_kind, m.e.id AS main_id,
           regexp_replace(coalesce(o.name, r.name, c.name), '([#\s_:.-])\d+$', '\1N') AS main_name
    FROM main_event m
    LEFT JOIN cpu_ops o ON m.e.kind = 'cpu_op' AND o.run_id = $run_id AND o.op_id = m.e.id
    LEFT JOIN ranges r ON m.e.kind = 'range' AND r.run_id = $run_id AND r.range_id = m.e.id
    LEFT JOIN api_calls c ON m.e.kind = 'api_call' AND c.run_id = $run_id AND c.call_id = m.e.id
), bound AS (
    SELECT s.*, c.busy_ns / s.gap_ns AS host_busy_share, m.main_kind, m.main_id, m.main_name
    FROM stretches s JOIN covered c USING (sid) JOIN main m USING (sid)
    WHERE c.busy_ns >= $min_host_busy_share * s.gap_ns
), idle_total AS (
    SELECT count(*) AS n_all, coalesce(sum(gap_ns), 0) AS all_ns FROM stretches
), top AS (
    SELECT to_json(list({'name': main_name, 'kind': main_kind, 'stretches': n, 'ns': ns}
                        ORDER BY ns DESC, main_name)[1:$max_examples]) AS top_json,
           arg_max(main_name, (ns, -n)) AS top_name
    FROM (SELECT main_name, main_kind, count(*) AS n, sum(gap_ns) AS ns FROM bound GROUP BY ALL)
), summary AS (
    SELECT count(*) AS n, sum(gap_ns) AS total_ns, max(gap_ns) AS max_ns, median(gap_ns) AS median_ns,
           arg_max(start_ns, (gap_ns, -start_ns)) AS worst_start, arg_max(end_ns, (gap_ns, -start_ns)) AS worst_end,
           to_json(arg_max({'start_ns': start_ns, 'end_ns': end_ns, 'gap_ns': gap_ns,
                            'host_busy_share': round(host_busy_share, 4), 'main': main_name,
                            'main_kind': main_kind, 'main_id': main_id},
                           (gap_ns, -start_ns), heap_size($max_examples))[1:$max_examples]) AS worst
    FROM bound
), run AS (
    SELECT span_ns FROM runs WHERE run_id = $run_id
)
SELECT NULL::INTEGER AS device_id, NULL::BIGINT AS stream_id, 'run' AS item_kind, NULL::BIGINT AS item_id,
       'host-bound stretches' AS item_name, worst_start AS start_ns, worst_end AS end_ns,
       total_ns / span_ns AS value, 'share' AS value_unit, $min_share AS threshold,
       total_ns AS est_loss_ns,
       CASE WHEN total_ns / span_ns >= $error_share THEN 'error' END AS severity,
       printf('every GPU idle while the host worked: %d stretch(es) of %s or more, %s in all (%s of the run''s '
              || 'wall time, longest %s); most of it in %s',
              n, fmt_ns($min_stretch_ns), fmt_ns(total_ns), fmt_pct(total_ns / span_ns), fmt_ns(max_ns),
              top_name) AS message,
       -- The advice follows what the host did most: waiting for data is not launch overhead.
       CASE WHEN top_name ILIKE '%DataLoader%'
            THEN 'The GPU waits for the next batch: load and preprocess data in background workers (DataLoader num_workers > 0, persistent_workers, prefetch_factor), pin_memory=True, and move preprocessing to the GPU.'
            ELSE 'The bottleneck is on the host, not in any kernel: look at what the host runs in the stretches listed in the evidence. Move that work off the loop or overlap it with GPU work (background threads or processes, prefetching), and cut Python overhead between launches (torch.compile, CUDA graphs).'
       END AS hint,
       '{"stretches": ' || n || ', "total_ns": ' || total_ns || ', "median_ns": ' || median_ns
         || ', "max_ns": ' || max_ns || ', "run_span_ns": ' || span_ns
         || ', "gpu_idle_stretches": ' || n_all || ', "gpu_idle_ns": ' || all_ns
         || ', "top_activity": ' || top_json || ', "worst": ' || worst || '}' AS evidence
FROM summary, top, run, idle_total
WHERE n > 0 AND total_ns >= $min_share * span_ns
"""

RULE = Rule(
    id="T004",
    name="host-bound",
    title="Host-bound stretches: every GPU idle while the host works",
    phase="timeline",
    claims="idle:host",
    severity="warning",
    what="Stretches of at least `min_stretch_ns` during which no GPU of the run has any work while "
         "the host is busy (framework ops, NVTX or record_function ranges, API calls), with their "
         "share of the run's wall time and what the host was doing in them.",
    why="When every GPU waits and the host is working, the bottleneck is not in any kernel: data "
        "loading, preprocessing, Python overhead or host-side bookkeeping decide the run's speed, "
        "and optimizing kernels gains nothing until the host keeps the GPUs fed.",
    how="GPU operations of all devices are merged into busy intervals; the gaps between them of at "
        "least `min_stretch_ns` are GPU-idle stretches (time before the first and after the last "
        "GPU operation is not counted). A stretch is host-bound when recorded host events cover at "
        "least `min_host_busy_share` of it. The host activity of a stretch is the innermost event "
        "(shortest) covering at least half of it (enclosing ranges such as `ProfilerStep#N` win "
        "only when nothing finer does; `#N` suffixes are merged), else the event covering most of "
        "it. The finding's value is the host-bound time as a share of the run's span (wall time); "
        "it is reported at `min_share` and becomes an error at `error_share`. The estimated loss is "
        "the host-bound time itself (an upper bound: the GPU could have worked through all of it).",
    fix="Move data loading and preprocessing off the training thread (DataLoader workers, pinned "
        "memory, prefetching), do preprocessing on the GPU, reduce per-step Python work "
        "(torch.compile, CUDA graphs), avoid host-side bookkeeping between launches.",
    requires="timed GPU operations and host events (framework ops, CPU ranges or API calls)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM gpu_activity WHERE run_id = $run_id) AND "
                "(EXISTS (SELECT 1 FROM cpu_ops WHERE run_id = $run_id) OR "
                "EXISTS (SELECT 1 FROM api_calls WHERE run_id = $run_id) OR "
                "EXISTS (SELECT 1 FROM ranges WHERE run_id = $run_id AND kind IN ('nvtx', 'user_annotation')))",
    thresholds=(
        Threshold("min_stretch_ns", 100000, "GPU-idle stretches shorter than this are left to T001 (100 us)."),
        Threshold("min_host_busy_share", 0.5, "Share of a stretch that host events must cover for it to count as host-bound."),
        Threshold("min_share", 0.05, "Host-bound time as a share of the run's wall time that is reported."),
        Threshold("error_share", 0.25, "Share that makes an error."),
        Threshold("max_examples", 5, "How many stretches and activities the evidence lists."),
    ),
    sql=SQL,
    references=(
        "Nsight Systems `nsys analyze` rules gpu_gaps and gpu_time_util",
        "PyTorch performance tuning guide: 'Enable async data loading and augmentation'",
        "Holistic Trace Analysis: idle time breakdown (host wait)",
    ),
)
