"""T006 copy hygiene: small copies that could be one, pageable device-to-host copies, and
device-to-host copies the host waits on (the `.item()` pattern), per step."""

from typing import Annotated, Optional

from ..analyses.place import HOW as PLACE_HOW
from ._unknown import idle_unknown
from .base import Rule, Threshold, pair_key
from .evidence import PlacedEvidence, StreamRange, doc

SQL = r"""
WITH cp AS NOT MATERIALIZED (  -- each part reads only the columns it needs (5 M kernels: 0.37 -> 0.32 s)
    SELECT copy_id, device_id, stream_id, start_ns, end_ns, end_ns - start_ns AS dur_ns, direction, bytes,
           src_kind, dst_kind, api_name, launch_call_id, pid, tid
    FROM copies
    WHERE run_id = $run_id AND start_ns IS NOT NULL AND end_ns >= start_ns AND NOT coalesce(unified_memory, false)
), rates AS (  -- the run's best rate on a large copy, per direction (bytes per ns)
    SELECT direction, max(bytes / dur_ns) FILTER (WHERE dst_kind IS DISTINCT FROM 'pageable'
                                                  AND src_kind IS DISTINCT FROM 'pageable') AS pinned_bytes_per_ns,
           max(bytes / dur_ns) AS bytes_per_ns
    FROM cp WHERE bytes >= 1048576 AND dur_ns > 0 GROUP BY direction
), steps AS (  -- iteration ranges (the `steps` view)
    SELECT range_id, name, start_ns, end_ns FROM steps WHERE run_id = $run_id
),
-- 1. small copies outside the back-to-back host-to-device batches T002 reports
h2d_runs AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR start_ns - prev_end > $max_batch_gap_ns OR NOT prev_small
                       THEN 1 ELSE 0 END)
              OVER (PARTITION BY device_id, stream_id ORDER BY start_ns ROWS UNBOUNDED PRECEDING) AS batch
    FROM (SELECT *, lag(end_ns) OVER w AS prev_end, lag(bytes < $small_copy_bytes) OVER w AS prev_small
          FROM cp WHERE direction = 'HtoD' WINDOW w AS (PARTITION BY device_id, stream_id ORDER BY start_ns))
    WHERE bytes < $small_copy_bytes
), t002_batched AS (
    SELECT copy_id FROM (SELECT copy_id, count(*) OVER (PARTITION BY device_id, stream_id, batch) AS n FROM h2d_runs)
    WHERE n >= $min_batch_count
), small AS (
    SELECT c.device_id, c.direction, count(*) AS n, sum(c.bytes) AS bytes, sum(c.dur_ns) AS dur_ns,
           count(DISTINCT c.stream_id) AS streams, min(c.copy_id) AS first_id,
           arg_max(c.copy_id, __LONGEST__) AS worst_id,
           arg_max(c.start_ns, __LONGEST__) AS worst_start,
           arg_max(c.end_ns, __LONGEST__) AS worst_end,
           (SELECT count(*) FROM steps) AS n_steps,
           any_value(coalesce(r.pinned_bytes_per_ns, r.bytes_per_ns)) AS best_rate,
           -- the longest first, by a bounded heap (a list ORDER BY sorts every copy)
           to_json(arg_max({'copy_id': c.copy_id, 'start_ns': c.start_ns, 'end_ns': c.end_ns, 'bytes': c.bytes,
                            'stream_id': c.stream_id}, __LONGEST__, heap_size($max_examples))[1:$max_examples]) AS worst
    FROM cp c LEFT JOIN rates r USING (direction)
    WHERE c.bytes < $small_copy_bytes AND c.copy_id NOT IN (SELECT copy_id FROM t002_batched)
    GROUP BY c.device_id, c.direction HAVING count(*) >= $min_small_count
),
-- 2. device-to-host copies into pageable memory
pageable AS (
    SELECT c.device_id, count(*) AS n, sum(c.bytes) AS bytes, sum(c.dur_ns) AS dur_ns,
           count(*) FILTER (WHERE c.api_name ILIKE '%async%') AS n_async,
           arg_max(c.copy_id, __LONGEST__) AS worst_id,
           arg_max(c.start_ns, __LONGEST__) AS worst_start,
           arg_max(c.end_ns, __LONGEST__) AS worst_end,
           -- time beyond what the run's best pinned device-to-host rate would take
           CAST(sum(CASE WHEN r.pinned_bytes_per_ns > 0 THEN greatest(c.dur_ns - c.bytes / r.pinned_bytes_per_ns, 0) END) AS BIGINT) AS extra_ns,
           to_json(arg_max({'copy_id': c.copy_id, 'start_ns': c.start_ns, 'end_ns': c.end_ns, 'bytes': c.bytes,
                            'api_name': c.api_name}, __LONGEST__, heap_size($max_examples))[1:$max_examples]) AS worst
    FROM cp c LEFT JOIN rates r USING (direction)
    WHERE c.direction = 'DtoH' AND c.dst_kind = 'pageable'
    GROUP BY c.device_id
),
-- 3. device-to-host copies the host waits for: a synchronous call, an async call that only
--    returned after the copy ended (pageable), or a sync call right after on the same thread
d2h AS (
    SELECT c.*, a.name AS call_name, a.start_ns AS call_start, a.end_ns AS call_end
    FROM cp c JOIN api_calls a ON a.run_id = $run_id AND a.call_id = c.launch_call_id
    WHERE c.direction = 'DtoH'
), sync_calls AS (
    SELECT name, pid, tid, start_ns, end_ns FROM api_calls
    WHERE run_id = $run_id AND name ILIKE '%synchronize%'
), waited AS (
    SELECT d.*, s.name AS next_sync_name, s.end_ns AS next_sync_end,
           CASE WHEN d.call_name NOT ILIKE '%async%' THEN 'synchronous call'
                WHEN d.call_end >= d.end_ns THEN 'blocking async call'
                WHEN s.start_ns - d.call_end <= $max_sync_delay_ns AND s.end_ns >= d.end_ns THEN 'sync after'
           END AS how_waited
    FROM d2h d ASOF LEFT JOIN sync_calls s
      ON s.pid IS NOT DISTINCT FROM d.pid AND s.tid IS NOT DISTINCT FROM d.tid AND s.start_ns >= d.call_end
), serial AS (
    SELECT *, CASE WHEN how_waited = 'sync after' THEN next_sync_end ELSE call_end END AS wait_end,
           CASE WHEN how_waited = 'sync after' THEN next_sync_name END AS sync_name
    FROM waited WHERE how_waited IS NOT NULL
), wait_ends AS (
    SELECT device_id, wait_end AS t FROM serial
), busy AS (  -- the busy intervals that can follow a wait (analyses.timeline.next_busy_candidates)
    SELECT * FROM next_busy_candidates('this_run.device_busy_intervals', 'wait_ends')
), next_busy AS (
    SELECT s.*, b.start_ns AS busy_start
    FROM serial s ASOF LEFT JOIN busy b ON b.device_id = s.device_id AND b.end_ns > s.wait_end
), late AS (  -- the busy starts after idle time
    SELECT device_id, busy_start FROM next_busy WHERE busy_start > wait_end
), issued AS (  -- when the work that ended the idle after a wait was issued (analyses.budget.issued_at)
    SELECT * FROM issued_at($run_id, 'late')
), serial_idle AS (
    -- GPU idle from the end of the wait to the device's next operation; of it, the part before
    -- that operation was issued (the budget's host idle: the host launched from an empty queue),
    -- counted once for waits back to back before the same next work, after the last of them
    SELECT *, least(wait_end - call_start, own_host_ns) AS hideable_ns
    FROM (SELECT n.*, greatest(n.busy_start - n.wait_end, 0) AS idle_after_ns,
                 CASE WHEN n.busy_start > n.wait_end
                           AND row_number() OVER (PARTITION BY n.device_id, n.busy_start
                                                  ORDER BY n.wait_end DESC, n.copy_id DESC) = 1
                      THEN coalesce(host_until(i.issued_ns, n.wait_end, n.busy_start) - n.wait_end, 0)
                      ELSE 0 END AS own_host_ns
          FROM next_busy n LEFT JOIN issued i ON i.device_id = n.device_id AND i.busy_start = n.busy_start)
), serial_step AS (
    SELECT s.*, st.range_id AS step_id
    FROM serial_idle s ASOF LEFT JOIN steps st ON st.start_ns <= s.call_start
), serial_dev AS (
    SELECT s.device_id, count(*) AS n, sum(s.bytes) AS bytes,
           -- no more idle can be hidden than the host spent waiting (an upper bound, as in T003)
           least(sum(s.wait_end - s.call_start), sum(s.own_host_ns)) AS loss_ns,
           coalesce(sum(s.idle_after_ns), 0) AS idle_ns, sum(s.own_host_ns) AS host_ns,
           sum(s.wait_end - s.call_start) AS wait_ns,
           (SELECT count(*) FROM steps) AS n_steps,
           count(*) FILTER (WHERE st.range_id IS NOT NULL AND s.call_start <= st.end_ns) AS n_in_steps,
           count(DISTINCT st.range_id) FILTER (WHERE s.call_start <= st.end_ns) AS steps_with,
           to_json(map_from_entries(list(DISTINCT (s.how_waited, n_how) ORDER BY (s.how_waited, n_how)))) AS how_counts,
           arg_max(s.copy_id, (coalesce(s.hideable_ns, 0), s.wait_end - s.call_start, -s.copy_id)) AS worst_id,
           arg_max(s.call_start, (coalesce(s.hideable_ns, 0), s.wait_end - s.call_start, -s.copy_id)) AS worst_start,
           arg_max(s.wait_end + coalesce(s.idle_after_ns, 0),
                   (coalesce(s.hideable_ns, 0), s.wait_end - s.call_start, -s.copy_id)) AS worst_end,
           to_json(list({'copy_id': s.copy_id, 'bytes': s.bytes, 'call': s.call_name, 'how': s.how_waited,
                         'sync_call': s.sync_name, 'call_start_ns': s.call_start, 'wait_end_ns': s.wait_end,
                         'idle_after_ns': s.idle_after_ns,
                         'step': CASE WHEN s.call_start <= st.end_ns THEN st.name END}
                        ORDER BY coalesce(s.hideable_ns, 0) DESC, s.copy_id)[1:$max_examples]) AS worst
    FROM (SELECT *, count(*) OVER (PARTITION BY device_id, how_waited) AS n_how FROM serial_step) s
    LEFT JOIN steps st ON st.range_id = s.step_id
    GROUP BY s.device_id
), per_step AS (
    SELECT device_id, max(k) AS max_per_step FROM (
        SELECT s.device_id, s.step_id, count(*) AS k FROM serial_step s JOIN steps st ON st.range_id = s.step_id
        WHERE s.call_start <= st.end_ns GROUP BY ALL) GROUP BY device_id
), spans AS (
    SELECT device_id, active_span_ns FROM this_run.device_busy
), waits AS (
    SELECT device_id, call_start AS start_ns, wait_end + coalesce(idle_after_ns, 0) AS end_ns,
           coalesce(hideable_ns, 0) AS ns FROM serial_idle
), wait_place AS (  -- where most of each device's hideable idle is (analyses/place.py)
    SELECT * FROM majority_window('waits')
)
SELECT s.device_id, NULL::BIGINT AS stream_id, 'copy' AS item_kind, s.worst_id AS item_id,
       'small ' || s.direction || ' copies' AS item_name, s.worst_start AS start_ns, s.worst_end AS end_ns,
       s.n AS value, 'copies' AS value_unit, $min_small_count AS threshold,
       CAST(greatest(s.dur_ns - coalesce(s.bytes / nullif(s.best_rate, 0), 0), 0) AS BIGINT) AS est_loss_ns,
       NULL AS severity,
       printf('device %d: %d %s copies under %s (%s in all) took %s%s; each pays a fixed setup cost',
              s.device_id, s.n, s.direction, fmt_bytes($small_copy_bytes), fmt_bytes(s.bytes), fmt_ns(s.dur_ns),
              CASE WHEN s.n_steps > 0 THEN printf(', %.1f per step', s.n / s.n_steps) ELSE '' END)
         || CASE WHEN s.best_rate > 0 THEN ''
                 ELSE '; no copy of 1 MB or more in this direction gives the rate one batched copy would get: est. at most their copy time' END AS message,
       CASE WHEN s.direction = 'DtoH'
            THEN 'Gather the values on the GPU (torch.stack/cat, one buffer) and copy them to the host once per step, into pinned memory.'
            ELSE 'Pack the small buffers into one contiguous (pinned, for host memory) buffer and copy once; for device-to-device copies, fuse them into the producing kernel or use a single batched copy.'
       END AS hint,
       '{"copies": ' || s.n || ', "direction": "' || s.direction || '", "bytes": ' || s.bytes
         || ', "copy_ns": ' || s.dur_ns || ', "streams": ' || s.streams || ', "steps": ' || s.n_steps
         || ', "best_bytes_per_ns": ' || coalesce(CAST(s.best_rate AS VARCHAR), 'null') || ', "worst": ' || s.worst || '}' AS evidence,
       'copy:' || s.direction AS claims
FROM small s
UNION ALL
SELECT p.device_id, NULL, 'copy', p.worst_id, 'pageable DtoH copies', p.worst_start, p.worst_end,
       p.n, 'copies', $min_pageable_count, p.extra_ns, NULL,
       printf('device %d: %d device-to-host copies (%s, %s) went to pageable host memory%s: the driver stages '
              || 'them through a pinned buffer and the call blocks the host until the copy is done',
              p.device_id, p.n, fmt_bytes(p.bytes), fmt_ns(p.dur_ns),
              CASE WHEN p.n_async > 0 THEN printf(', %d of them through an Async call that cannot be asynchronous', p.n_async)
                   ELSE '' END),
       CASE WHEN (SELECT pytorch FROM run_is_pytorch($run_id))
            THEN 'Copy into pinned host memory (tensor.to("cpu", non_blocking=True) into a pin_memory() buffer, cudaHostAlloc) so the copy can run asynchronously, and read it only after an event says it is done.'
            ELSE 'Copy into pinned host memory (cudaHostAlloc, cudaHostRegister) with cudaMemcpyAsync so the copy can run asynchronously, and read it only after an event says it is done.' END,
       '{"copies": ' || p.n || ', "bytes": ' || p.bytes || ', "copy_ns": ' || p.dur_ns
         || ', "async_calls": ' || p.n_async || ', "extra_ns": ' || coalesce(CAST(p.extra_ns AS VARCHAR), 'null')
         || ', "worst": ' || p.worst || '}',
       'copy:DtoH'
FROM pageable p WHERE p.n >= $min_pageable_count
UNION ALL
SELECT d.device_id, NULL, 'copy', d.worst_id, 'DtoH copies the host waits on', wp.w_start, wp.w_end,
       d.loss_ns / nullif(sp.active_span_ns, 0), 'share', $min_share, d.loss_ns,
       CASE WHEN d.loss_ns / nullif(sp.active_span_ns, 0) >= $error_share THEN 'error' END,
       printf('device %d: the host waited for %d device-to-host copies (%s waiting)%s; the GPU then sat idle %s, '
              || '%s of it until the host issued the next work, %s (%s of the device''s span) hideable '
              || 'had the host not waited',
              d.device_id, d.n, fmt_ns(d.wait_ns),
              CASE WHEN d.n_steps > 0 THEN printf(', %d in %d of %d steps (up to %d per step)', d.n_in_steps,
                                                  d.steps_with, d.n_steps, coalesce(ps.max_per_step, 0))
                   ELSE '' END,
              fmt_ns(d.idle_ns), fmt_ns(d.host_ns), fmt_ns(d.loss_ns), fmt_pct(d.loss_ns / nullif(sp.active_span_ns, 0))),
       CASE WHEN (SELECT pytorch FROM run_is_pytorch($run_id))
            THEN 'Each of these reads a GPU value on the host (.item(), .cpu(), .tolist(), printing or branching on a tensor) and drains the GPU queue: keep such values on the GPU, read them every N steps, or copy them non_blocking into pinned memory and read after an event.'
            ELSE 'Each of these reads a GPU result on the host and drains the GPU queue: keep such values on the GPU, read them every N iterations, or copy them with cudaMemcpyAsync into pinned memory and read them after an event.' END,
       '{"copies": ' || d.n || ', "bytes": ' || d.bytes || ', "wait_ns": ' || d.wait_ns || ', "idle_after_ns": ' || d.idle_ns
         || ', "host_idle_ns": ' || d.host_ns || ', "loss_ns": ' || d.loss_ns || ', "steps": ' || d.n_steps || ', "copies_in_steps": ' || d.n_in_steps
         || ', "steps_with_copies": ' || d.steps_with || ', "max_per_step": ' || coalesce(ps.max_per_step, 0)
         || ', "how": ' || d.how_counts || ', "place": ' || place_json(wp, 'waits') || ', "worst": ' || d.worst || '}',
       'idle:host'  -- the host waited, the GPU's queue drained: it then launched late
FROM serial_dev d LEFT JOIN spans sp USING (device_id) LEFT JOIN per_step ps USING (device_id)
LEFT JOIN wait_place wp USING (device_id)
WHERE d.loss_ns > $min_loss_ns AND d.loss_ns >= $min_share * sp.active_span_ns
ORDER BY 5, 1
"""
# The longest copy first, the lowest id among equals: (dur_ns, -copy_id) as one integer.
SQL = SQL.replace("__LONGEST__", pair_key("c.dur_ns", "c.copy_id", then_descending=True))

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class T006Example(StreamRange, kw_only=True, forbid_unknown_fields=True):
    copy_id: Annotated[int, doc("id of the copy")]
    start_ns: Annotated[Optional[int], doc("start, trace clock, where the example has a time range")] = None
    end_ns: Annotated[Optional[int], doc("end, trace clock, where the example has a time range")] = None
    bytes: Annotated[int, doc("bytes")]
    stream_id: Annotated[Optional[int], doc("stream")] = None
    call: Annotated[Optional[str], doc("the host call that issued the copy")] = None
    how: Annotated[Optional[str], doc("how the copy blocked the host")] = None
    sync_call: Annotated[Optional[str], doc("the synchronizing call after the copy")] = None
    call_start_ns: Annotated[Optional[int], doc("when the copy's call started")] = None
    wait_end_ns: Annotated[Optional[int], doc("when the wait for the copy ended")] = None
    idle_after_ns: Annotated[Optional[int], doc("GPU idle time after the call")] = None
    step: Annotated[Optional[str], doc("the step")] = None
    api_name: Annotated[Optional[str], doc("the CUDA API call that issued the copy")] = None


class T006Evidence(PlacedEvidence, kw_only=True, forbid_unknown_fields=True):
    steps: Annotated[Optional[int], doc("steps in the run (iteration ranges)")] = None
    copies: Annotated[int, doc("copies counted")]
    direction: Annotated[Optional[str], doc("copy direction (HtoD, DtoH, DtoD, ...)")] = None
    bytes: Annotated[int, doc("bytes")]
    copy_ns: Annotated[Optional[int], doc("time of the copies")] = None
    streams: Annotated[Optional[int], doc("streams")] = None
    best_bytes_per_ns: Annotated[Optional[float], doc("the fastest copy rate seen for this kind of copy, bytes per ns")] = None
    worst: Annotated[list[T006Example], doc("the copies that cost most")]
    wait_ns: Annotated[Optional[int], doc("host time waiting on copies")] = None
    idle_after_ns: Annotated[Optional[int], doc("GPU idle time after the call")] = None
    host_idle_ns: Annotated[Optional[int], doc("host time blocked while the GPU was idle")] = None
    loss_ns: Annotated[Optional[int], doc("estimated loss")] = None
    copies_in_steps: Annotated[Optional[int], doc("copies inside steps")] = None
    steps_with_copies: Annotated[Optional[int], doc("steps with at least one copy")] = None
    max_per_step: Annotated[Optional[int], doc("most copies in one step")] = None
    how: Annotated[Optional[dict[str, int]], doc("copies per way they blocked the host")] = None
    async_calls: Annotated[Optional[int], doc("copies issued with an async call")] = None
    extra_ns: Annotated[Optional[int], doc("time pageable copies took beyond pinned ones' rate")] = None


RULE = Rule(
    id="T006",
    evidence=T006Evidence,
    name="copy-hygiene",
    title="Copy hygiene: small copies, pageable device-to-host copies, copies the host waits on",
    phase="timeline",
    severity="warning",
    what="Beyond T002 (host-to-device overlap and batches): many small copies in any direction that "
         "could be merged; device-to-host copies into pageable memory; and device-to-host copies the "
         "host waits for (the `.item()` / `.cpu()` pattern), counted per step when the trace has step "
         "ranges (ProfilerStep#N, else NVTX/annotations named like a step or iteration).",
    why="Every copy pays a fixed setup cost, so many tiny copies move little data slowly. A copy into "
        "pageable memory cannot be asynchronous: the driver stages it through a pinned buffer and the "
        "call blocks. A device-to-host copy the host waits for drains the GPU's queue, so every such "
        "read per step leaves the GPU idle until the host launches again.",
    how="Small copies: copies under `small_copy_bytes` (not unified memory), per device and direction, "
        "leaving out host-to-device copies in the back-to-back batches T002 reports (T002's "
        "`small_copy_bytes`, `max_batch_gap_ns` and `min_batch_count` set both rules); reported at "
        "`min_small_count`; estimated loss = their time minus their bytes at "
        "the run's best rate on a copy of 1 MB or more in that direction (with no such copy, at most their "
        "time, which the message says). Pageable: device-to-host copies whose "
        "destination is pageable, reported at `min_pageable_count`; estimated loss = their time "
        "beyond the run's best pinned device-to-host rate (NULL when the run has no large pinned "
        "copy). Waited-on copies: a device-to-host copy made by a non-Async call, by an Async call "
        "that returned only after the copy ended, or followed on the same thread by a "
        "`*Synchronize*` call starting within `max_sync_delay_ns` and ending after the copy; the wait "
        "runs from the copy call's start to the end of that call. The GPU idle after a wait is the "
        "time to the device's next operation; of it, the part before that operation's launch call "
        "returned is the budget's `host` idle (`analyses.budget.issued_at`), which these findings claim "
        "(counted once for waits back to back before the same next work). The estimated loss is "
        "min(total wait, that host idle), the idle the host could have hidden had it not waited (an "
        "upper bound; T003 counts the same sync calls by name). Reported when the loss exceeds `min_loss_ns` and `min_share` of the device's active "
        "span; an error from `error_share`." + PLACE_HOW,
    fix="Merge small copies into one buffer; use pinned host memory for device-to-host copies; keep "
        "values on the GPU and read them rarely, asynchronously, after an event.",
    requires="timed copies (device-to-host copies for the waiting check, with their API calls)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM copies WHERE run_id = $run_id AND start_ns IS NOT NULL)",
    thresholds=(
        Threshold("min_small_count", 20, "Small copies per device and direction that are reported.", low=1),
        Threshold("min_pageable_count", 1, "Pageable device-to-host copies per device that are reported.", low=1),
        Threshold("max_sync_delay_ns", 100000, "A sync call starting this soon after a device-to-host copy call waits for it (100 us)."),
        Threshold("min_loss_ns", 20000, "Waited-on copies are reported when their estimated loss exceeds this (20 us)..."),
        Threshold("min_share", 0.01, "...and this share of the device's active span."),
        Threshold("error_share", 0.25, "Share that makes the waited-on copies an error."),
        Threshold("max_examples", 5, "How many copies the evidence lists."),
    ),
    # What counts as small, and T002's batches: one setting for both rules.
    shared=("T002.small_copy_bytes", "T002.max_batch_gap_ns", "T002.min_batch_count"),
    sql=SQL,
    references=(
        "Nsight Systems `nsys analyze` rules cuda_memcpy_async (pageable memory) and cuda_memcpy_sync",
        "CUDA Runtime API: 'API synchronization behavior' (pageable memory makes Async copies synchronous)",
        "PyTorch performance tuning guide: 'Avoid unnecessary CPU-GPU synchronization'",
    ),
    unknown=idle_unknown,
)
