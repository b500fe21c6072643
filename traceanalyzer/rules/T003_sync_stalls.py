"""T003 synchronization stalls: host calls that wait for the GPU, and the GPU idle after them."""

from typing import Annotated, Optional

from ._unknown import idle_unknown
from .base import Rule, Threshold
from .evidence import Evidence, TimeRange, doc

# Blocking host calls come from two places: API calls known to wait for the GPU (sync
# calls by name; copies and memsets made through non-Async calls) and sync records with no
# API call (Kineto `cuda_sync` rows without a runtime event, nsys rows whose call fell
# outside the capture). Each call's device is read from the record it produced; with none,
# every active device of the run is considered (the call waited on all of them).
SQL = r"""
WITH active AS (
    SELECT device_id, first_start_ns, last_end_ns FROM this_run.device_busy
), blocking AS (  -- API calls that wait for the GPU, by name
    SELECT call_id, name, pid, tid, start_ns, end_ns FROM api_calls
    WHERE run_id = $run_id AND end_ns >= start_ns
      AND (name ILIKE '%synchronize%' OR ((name ILIKE '%memcpy%' OR name ILIKE '%memset%') AND name NOT ILIKE '%async%'))
), linked AS (  -- the device each of those calls acted on, from the GPU records it produced
    -- (only their records are grouped: a run has far more async copies than blocking calls)
    SELECT launch_call_id AS call_id, min(device_id) AS device_id, count(DISTINCT device_id) AS n_dev,
           bool_or(direction = 'HtoD' AND bytes <= $max_early_return_htod_bytes) AS early_return
    FROM (SELECT launch_call_id, device_id, NULL AS direction, NULL::BIGINT AS bytes FROM syncs
          WHERE run_id = $run_id AND launch_call_id IS NOT NULL
          UNION ALL
          SELECT launch_call_id, device_id, direction, bytes FROM copies
          WHERE run_id = $run_id AND launch_call_id IS NOT NULL)
    WHERE launch_call_id IN (SELECT call_id FROM blocking)
    GROUP BY launch_call_id
), calls AS (
    SELECT a.call_id, NULL::BIGINT AS sync_id, a.name, a.pid, a.tid, a.start_ns, a.end_ns,
           CASE WHEN a.name ILIKE '%synchronize%' THEN 'sync'
                WHEN a.name ILIKE '%memcpy%' THEN 'copy' ELSE 'memset' END AS what,
           CASE WHEN l.n_dev = 1 THEN l.device_id END AS device_id
    FROM blocking a LEFT JOIN linked l USING (call_id)
    -- CUDA returns early from small pageable host-to-device copies: they do not block
    WHERE NOT coalesce(l.early_return, false)
    UNION ALL
    SELECT NULL, sync_id, coalesce(api_name, kind || ' sync record without an API call'), pid, tid,
           start_ns, end_ns, 'sync', device_id
    FROM syncs
    WHERE run_id = $run_id AND launch_call_id IS NULL AND end_ns >= start_ns
      AND kind IN ('device', 'context', 'stream', 'event', 'unknown')
      AND coalesce(api_name, '') NOT ILIKE '%query%'
), per_device AS (  -- one row per call and device it may have waited on
    SELECT c.* REPLACE (coalesce(c.device_id, (SELECT min(device_id) FROM active HAVING count(*) = 1)) AS device_id),
           d.device_id AS dev
    FROM calls c JOIN active d ON c.device_id IS NULL OR d.device_id = c.device_id
), call_ends AS (
    SELECT dev AS device_id, end_ns AS t FROM per_device
), busy AS (  -- the busy intervals that can follow a call (analyses.timeline.next_busy_candidates)
    SELECT * FROM next_busy_candidates('this_run.device_busy_intervals', 'call_ends')
), next_busy AS (  -- the first busy interval of that device ending after the call returned
    SELECT p.*, b.start_ns AS busy_start
    FROM per_device p ASOF LEFT JOIN busy b ON b.device_id = p.dev AND b.end_ns > p.end_ns
), after_calls AS (
    SELECT *, coalesce(dev, -1) AS w_key, end_ns AS t0, busy_start AS t1 FROM next_busy
), steady AS (  -- where the idle after each call begins to be steady (NULL: it ends in warm-up)
    SELECT * EXCLUDE (w_key, t0, t1, steady_start_ns), steady_start_ns AS steady_from
    FROM steady_starts('after_calls', 'this_run.warmup_windows', false)
), late AS (  -- the busy starts after idle time
    SELECT dev AS device_id, busy_start FROM next_busy WHERE busy_start > end_ns
), issued AS (  -- when the work that ended the idle after a call was issued (analyses.budget.issued_at)
    SELECT * FROM issued_at($run_id, 'late')
), per_call AS (
    -- GPU idle after the return: 0 when the device was still busy, NULL when no work followed;
    -- of it, the part before the next work was issued: the budget's host idle (after that, the
    -- work waited on something else, which the sync did not cause)
    SELECT n.call_id, n.sync_id, any_value(n.name) AS name, any_value(n.pid) AS pid, any_value(n.tid) AS tid,
           any_value(n.start_ns) AS start_ns, any_value(n.end_ns) AS end_ns, any_value(n.what) AS what,
           any_value(n.device_id) AS device_id,
           min(greatest(n.busy_start - n.end_ns, 0)) AS idle_after_ns,
           min(CASE WHEN n.busy_start > n.end_ns
                    THEN coalesce(greatest(host_until(i.issued_ns, n.end_ns, n.busy_start) - n.steady_from, 0), 0) END) AS host_after_ns,
           min(CASE WHEN n.busy_start > n.end_ns
                    THEN coalesce(host_until(i.issued_ns, n.end_ns, n.busy_start) - n.end_ns, 0) END) AS whole_host_after_ns,
           min(n.busy_start) AS next_gpu_start_ns
    FROM steady n LEFT JOIN issued i ON i.device_id = n.dev AND i.busy_start = n.busy_start
    GROUP BY n.call_id, n.sync_id
), costed AS (
    -- Calls of one thread back to back before the same next work wait out the same idle: it is
    -- counted after the last of them only.
    SELECT *, end_ns - start_ns AS blocked_ns,
           CASE WHEN row_number() OVER (PARTITION BY name, pid, tid, next_gpu_start_ns ORDER BY end_ns DESC,
                                                     call_id DESC, sync_id DESC) = 1
                THEN host_after_ns ELSE 0 END AS own_host_ns,
           CASE WHEN row_number() OVER (PARTITION BY name, pid, tid, next_gpu_start_ns ORDER BY end_ns DESC,
                                                     call_id DESC, sync_id DESC) = 1
                THEN coalesce(whole_host_after_ns - host_after_ns, 0) ELSE 0 END AS warm_host_ns,
           least(end_ns - start_ns, coalesce(host_after_ns, 0)) AS hideable_ns
    FROM per_call
), spans AS (
    SELECT min(first_start_ns) AS first_ns, max(last_end_ns) AS last_ns FROM active
), groups AS (
    SELECT name, pid, tid, any_value(what) AS what,
           CASE WHEN count(DISTINCT device_id) = 1 AND count(device_id) = count(*) THEN min(device_id) END AS device_id,
           count(*) AS n, sum(blocked_ns) AS blocked_ns, median(blocked_ns) AS median_blocked_ns,
           max(blocked_ns) AS max_blocked_ns,
           coalesce(sum(idle_after_ns), 0) AS idle_ns, count(*) FILTER (WHERE idle_after_ns > 0) AS n_idle,
           coalesce(sum(own_host_ns), 0) AS host_ns, coalesce(sum(warm_host_ns), 0) AS warmup_ns,
           -- Had the host not waited, the work it did before its next launches would have
           -- overlapped the GPU work it waited for: the idle it could hide is at most the waits.
           least(sum(blocked_ns), coalesce(sum(own_host_ns), 0)) AS loss_ns,
           arg_max(start_ns, (hideable_ns, blocked_ns, -start_ns)) AS worst_start,
           arg_max(greatest(end_ns, coalesce(next_gpu_start_ns, end_ns)), (hideable_ns, blocked_ns, -start_ns)) AS worst_end,
           to_json(list({'call_id': call_id, 'sync_id': sync_id, 'start_ns': start_ns, 'end_ns': end_ns,
                         'blocked_ns': blocked_ns, 'idle_after_ns': idle_after_ns,
                         'next_gpu_start_ns': next_gpu_start_ns}
                        ORDER BY hideable_ns DESC, blocked_ns DESC, start_ns)[1:$max_examples]) AS worst
    FROM costed GROUP BY name, pid, tid
), warm_ns AS (  -- per device (-1: the GPUs together), the span's time inside warm-up windows
    SELECT device_id, sum(end_ns - start_ns) AS ns FROM run_warmup_merged('this_run.warmup_windows', false) GROUP BY ALL
    UNION ALL
    SELECT -1, sum(end_ns - start_ns) FROM run_warmup_merged('this_run.warmup_windows', true)
), scored AS (  -- the span of the group's device (else the GPUs') and its steady part, what the
    -- share is of: the idle time inside warm-up windows is left out
    SELECT g.*, coalesce(b.active_span_ns, s.last_ns - s.first_ns) AS span_ns,
           coalesce(b.active_span_ns, s.last_ns - s.first_ns) - coalesce(w.ns, 0) AS steady_ns
    FROM groups g CROSS JOIN spans s
    LEFT JOIN this_run.device_busy b ON b.device_id = g.device_id
    LEFT JOIN warm_ns w ON w.device_id = coalesce(g.device_id, -1)
)
SELECT device_id, NULL::BIGINT AS stream_id,
       CASE WHEN device_id IS NULL THEN 'run' ELSE 'device' END AS item_kind,
       device_id AS item_id,
       name || CASE WHEN tid IS NULL THEN '' ELSE ' (thread ' || tid || ')' END AS item_name,
       worst_start AS start_ns, worst_end AS end_ns,
       loss_ns / nullif(steady_ns, 0) AS value, 'share' AS value_unit, $warning_share AS threshold,
       loss_ns AS est_loss_ns,
       CASE WHEN loss_ns / nullif(steady_ns, 0) >= $error_share THEN 'error'
            WHEN loss_ns / nullif(steady_ns, 0) >= $warning_share THEN 'warning' ELSE 'info' END AS severity,
       printf('%s%s: %d call(s) blocked the host %s (median %s, longest %s); the GPU sat idle %s after '
              || '%d of them, %s of it until the host issued the next work, %s (%s of %s) hideable had the '
              || 'host not waited',
              name, CASE WHEN tid IS NULL THEN '' ELSE ' on thread ' || tid END, n,
              fmt_ns(blocked_ns), fmt_ns(median_blocked_ns), fmt_ns(max_blocked_ns), fmt_ns(idle_ns), n_idle,
              fmt_ns(host_ns), fmt_ns(loss_ns), fmt_pct(loss_ns / nullif(steady_ns, 0)),
              CASE WHEN device_id IS NULL THEN 'the GPUs'' ' ELSE 'device ' || device_id || '''s ' END
                || steady_word(span_ns, steady_ns) || 'span') AS message,
       CASE WHEN what = 'sync' AND (SELECT pytorch FROM run_is_pytorch($run_id)) THEN 'Each synchronization drains the GPU queue, so the next launch starts from empty: remove syncs from the loop, or defer them (keep results on the GPU; avoid .item(), .cpu(), .tolist(), print(tensor) and torch.cuda.synchronize() per step; use events and cudaStreamWaitEvent for ordering).'
            WHEN what = 'sync' THEN 'Each synchronization drains the GPU queue, so the next launch starts from empty: work on one stream runs in order without it, so remove the synchronizations between dependent launches and synchronize once, where the host needs the results; use events and cudaStreamWaitEvent for ordering between streams.'
            WHEN what = 'copy' AND (SELECT pytorch FROM run_is_pytorch($run_id)) THEN 'Synchronous copies block the host until the GPU finishes everything before them: use cudaMemcpyAsync with pinned memory (tensor.to(..., non_blocking=True) from/to pinned buffers) and synchronize once, where the data is needed.'
            WHEN what = 'copy' THEN 'Synchronous copies block the host until the GPU finishes everything before them: use cudaMemcpyAsync on a non-default stream with pinned host buffers (cudaHostAlloc, cudaHostRegister) and synchronize once, where the data is needed.'
            WHEN (SELECT pytorch FROM run_is_pytorch($run_id)) THEN 'Use cudaMemsetAsync on the work stream (tensor.zero_() is already asynchronous) instead of the synchronous memset.'
            ELSE 'Use cudaMemsetAsync on the work stream instead of the synchronous memset.'
       END AS hint,
       '{"calls": ' || n || ', "kind": "' || what || '", "pid": ' || coalesce(CAST(pid AS VARCHAR), 'null')
         || ', "tid": ' || coalesce(CAST(tid AS VARCHAR), 'null')
         || ', "blocked_ns": ' || blocked_ns || ', "median_blocked_ns": ' || median_blocked_ns
         || ', "max_blocked_ns": ' || max_blocked_ns || ', "idle_after_ns": ' || idle_ns
         || ', "calls_followed_by_idle": ' || n_idle || ', "host_idle_ns": ' || host_ns || ', "warmup_ns": ' || warmup_ns
         || ', "loss_ns": ' || loss_ns || ', "span_ns": ' || span_ns || ', "steady_span_ns": ' || steady_ns
         || ', "worst": ' || worst || '}' AS evidence
FROM scored
WHERE loss_ns > $min_loss_ns AND loss_ns / nullif(steady_ns, 0) >= $min_share
ORDER BY loss_ns DESC, name, tid
"""

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class T003Example(TimeRange, kw_only=True, forbid_unknown_fields=True):
    call_id: Annotated[Optional[int], doc("id of the blocking call")]
    sync_id: Annotated[Optional[int], doc("id of the synchronizing call")]
    blocked_ns: Annotated[int, doc("time the host thread was blocked in the call")]
    idle_after_ns: Annotated[int, doc("GPU idle time after the call")]
    next_gpu_start_ns: Annotated[Optional[int], doc("when the GPU next started work")]


class T003Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    warmup_ns: Annotated[int, doc("blocked time inside warm-up windows, left out of the totals")]
    calls: Annotated[int, doc("calls counted")]
    kind: Annotated[str, doc("the kind of synchronizing call")]
    pid: Annotated[Optional[int], doc("host process")]
    tid: Annotated[Optional[int], doc("host thread")]
    blocked_ns: Annotated[int, doc("time the host thread was blocked in the call")]
    median_blocked_ns: Annotated[float, doc("median time blocked per call")]
    max_blocked_ns: Annotated[int, doc("longest time blocked in one call")]
    idle_after_ns: Annotated[int, doc("GPU idle time after the call")]
    calls_followed_by_idle: Annotated[int, doc("calls after which the GPU sat idle")]
    host_idle_ns: Annotated[int, doc("host time blocked while the GPU was idle")]
    loss_ns: Annotated[int, doc("estimated loss")]
    span_ns: Annotated[int, doc("the span of the device (or of the GPUs, first GPU operation to last)")]
    steady_span_ns: Annotated[Optional[int], doc("span_ns less its time inside warm-up windows: what the share is of")] = None
    worst: Annotated[list[T003Example], doc("the calls that left the GPU idle longest")]


RULE = Rule(
    id="T003",
    evidence=T003Evidence,
    name="sync-stalls",
    title="Synchronization stalls: host waits that leave the GPU idle",
    phase="timeline",
    claims="idle:host",
    severity="warning",
    what="Host calls that wait for the GPU (device, stream, event and context synchronizations, "
         "synchronous copies and memsets), grouped by call name and thread: how many, how long they "
         "blocked the host, and how long the GPU then sat idle before its next operation.",
    why="A synchronization drains the GPU's queue: when it returns, the host has to launch new work "
        "from an empty queue and the GPU waits for it. One sync per iteration (`.item()`, `.cpu()`, "
        "`torch.cuda.synchronize()`, printing a tensor, a synchronous `cudaMemcpy`) costs a launch "
        "latency or more every time, and keeps the host from running ahead.",
    how="Blocking calls are API calls named `*Synchronize*` (cudaDeviceSynchronize, "
        "cudaStreamSynchronize, cudaEventSynchronize, cuCtxSynchronize, ...), copies and memsets made "
        "through non-Async calls (host-to-device copies of at most `max_early_return_htod_bytes` are "
        "left out: CUDA returns from them early), and sync records that have no API call (using the "
        "record's times). A call's host blocked time is its duration. The GPU idle after a call is the "
        "time from its return to the start of the next GPU operation on the device it waited on (its "
        "sync/copy record's device; every active device when unknown, taking the earliest), zero "
        "when the device was still busy; calls with no GPU work after them count no idle. Of that idle, "
        "the part before the next work was issued (the return of its launch call, as the time budget "
        "reads an idle stretch: `analyses.budget.issued_at`) is the budget's `host` idle, which this rule claims: "
        "the sync drained the queue and the host then launched from empty; the rest the work waited "
        "on something else, which the sync did not cause. Idle inside warm-up windows of the device "
        "(`warmup_windows`) is left out (the macro `steady_start`; the host idle so left out is the "
        "evidence's `warmup_ns`). Calls of a thread back to back before the "
        "same next work count that idle once, after the last. Calls are grouped by name and thread. "
        "The estimated loss of a group is the smaller of its total blocked time and its host idle "
        "after: had the host not waited, the work it did before its next launches would have "
        "overlapped the GPU work it waited for, so no more idle than the waits can be hidden. It is "
        "an upper bound. The worst examples are ranked by "
        "min(blocked, idle after) per call. A group is "
        "reported when its loss exceeds `min_loss_ns` and `min_share` of the device's steady span "
        "(first to last GPU operation, all devices when the call's device is unknown, less its time "
        "inside warm-up windows: `steady_span_ns`), with severity by that share.",
    fix="Take synchronizations out of loops; keep values on the GPU until they are needed; use "
        "asynchronous copies into pinned memory and events for ordering.",
    requires="host API calls or sync records, and timed GPU operations",
    applies_sql="SELECT EXISTS (SELECT 1 FROM gpu_activity WHERE run_id = $run_id) AND "
                "(EXISTS (SELECT 1 FROM syncs WHERE run_id = $run_id) OR "
                "EXISTS (SELECT 1 FROM api_calls WHERE run_id = $run_id))",
    thresholds=(
        Threshold("min_loss_ns", 20000, "A group is reported when its estimated loss exceeds this (20 us)."),
        Threshold("min_share", 0.01, "...and when that loss is at least this share of the device's steady span."),
        Threshold("warning_share", 0.05, "Estimated loss as a share of the device's steady span that makes a warning (below: info)."),
        Threshold("error_share", 0.25, "Share that makes an error."),
        Threshold("max_early_return_htod_bytes", 65536, "Synchronous host-to-device copies up to this size return early and are not counted (CUDA semantics; nsys cuda_memcpy_sync)."),
        Threshold("max_examples", 5, "How many of the worst calls the evidence lists."),
    ),
    sql=SQL,
    references=(
        "Nsight Systems `nsys analyze` rules cuda_api_sync, cuda_memcpy_sync and cuda_memset_sync",
        "CUDA Runtime API: 'API synchronization behavior'",
        "PyTorch performance tuning guide: 'Avoid unnecessary CPU-GPU synchronization'",
    ),
    unknown=idle_unknown,
)
