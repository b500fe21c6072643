"""T002 unoverlapped host-to-device copies: copy time no kernel hides."""

from typing import Annotated, Optional

from ..analyses.place import HOW as PLACE_HOW
from ._unknown import idle_unknown
from .base import Rule, Threshold
from .evidence import PlacedEvidence, StreamRange, doc

SQL = r"""
WITH h2d AS (
    SELECT copy_id, device_id, stream_id, start_ns, end_ns, end_ns - start_ns AS dur_ns, bytes,
           src_kind, api_name, unified_memory
    FROM copies
    WHERE run_id = $run_id AND direction = 'HtoD' AND start_ns IS NOT NULL AND end_ns > start_ns
), explicit AS (
    SELECT * FROM h2d WHERE NOT coalesce(unified_memory, false)
), stream_facts AS (  -- per stream: its kernels, and whether its operations never overlap one another
    SELECT device_id, stream_id, count(*) FILTER (WHERE kind = 'kernel') AS kernels,
           coalesce(max(prev_max_end_ns - start_ns), 0) <= 0 AS disjoint
    FROM this_run.stream_ops GROUP BY device_id, stream_id
), lone_stream AS (  -- devices whose kernels all run on one stream whose operations never overlap: no
    -- kernel can run during a copy on that stream (a CUDA stream runs its work in order; traces rarely
    -- break this, and then the copies are probed)
    SELECT device_id, any_value(stream_id) AS stream_id FROM stream_facts WHERE kernels > 0
    GROUP BY device_id HAVING count(*) = 1 AND bool_and(disjoint)
), probed AS (  -- the copies some kernel may overlap
    SELECT copy_id, device_id, start_ns, end_ns FROM explicit e
    WHERE NOT EXISTS (SELECT 1 FROM lone_stream l WHERE l.device_id = e.device_id AND l.stream_id = e.stream_id)
), kernel_cum AS (  -- only the probed devices' kernel intervals (an ASOF join sorts its right side even
    -- for no probes), each with the kernel time up to its end
    SELECT device_id, start_ns, end_ns, busy_before_ns + end_ns - start_ns AS to_end_ns FROM this_run.kernel_busy_intervals
    WHERE device_id IS NOT NULL AND device_id IN (SELECT device_id FROM probed)
), covered AS (  -- time of each copy during which some kernel ran on its device (analyses.timeline)
    SELECT * FROM covered_ns('probed', 'kernel_cum', device_id)
), per_copy AS (
    SELECT e.*, dur_ns - coalesce(c.covered_ns, 0) AS exposed_ns,
           src_kind = 'pageable' AS pageable,
           api_name IS NOT NULL AND api_name NOT ILIKE '%async%' AS sync_call
    FROM explicit e LEFT JOIN covered c USING (copy_id)
), per_device AS (
    SELECT p.device_id, count(*) AS n, sum(dur_ns) AS dur_ns, sum(exposed_ns) AS exposed_ns,
           count(*) FILTER (WHERE exposed_ns > 0) AS n_exposed,
           count(*) FILTER (WHERE pageable) AS n_pageable, count(*) FILTER (WHERE src_kind <> 'unknown') AS n_src_known,
           coalesce(sum(exposed_ns) FILTER (WHERE pageable), 0) AS exposed_pageable_ns,
           count(*) FILTER (WHERE sync_call) AS n_sync,
           coalesce(sum(exposed_ns) FILTER (WHERE sync_call), 0) AS exposed_sync_ns,
           sum(bytes) AS bytes,
           -- the most exposed copy, the first among equals (one arg_max, so the fields agree)
           arg_max({'id': p.copy_id, 'start_ns': p.start_ns, 'end_ns': p.end_ns}, (exposed_ns, -p.copy_id)) AS worst_copy,
           -- the most exposed first, by a bounded heap (a list ORDER BY sorts every copy)
           to_json(arg_max({'copy_id': p.copy_id, 'stream_id': p.stream_id, 'start_ns': p.start_ns,
                            'end_ns': p.end_ns, 'bytes': p.bytes, 'exposed_ns': exposed_ns,
                            'src_kind': src_kind, 'api_name': api_name},
                           (exposed_ns, -p.copy_id), heap_size($max_examples))[1:$max_examples]) AS worst,
           any_value(b.active_span_ns) AS span_ns,
           -- Overlap can hide copy time behind kernels only: at most the device's kernel time.
           coalesce(any_value(k.kernel_ns), 0) AS kernel_ns
    FROM per_copy p LEFT JOIN this_run.device_busy b ON b.device_id = p.device_id
    LEFT JOIN (SELECT device_id, sum(end_ns - start_ns) AS kernel_ns FROM this_run.kernel_busy_intervals
               GROUP BY device_id) k ON k.device_id = p.device_id
    GROUP BY p.device_id
), exposed AS (
    SELECT device_id, start_ns, end_ns, exposed_ns AS ns FROM per_copy WHERE exposed_ns > 0
), host_link AS (  -- the host link a discrete NVIDIA GPU's generation comes with (integrated and
    -- C2C-linked parts aside: they share or bypass PCIe); the host may run it slower
    SELECT device_id,
           printf('a %s, compute capability %d.%d, has PCIe %s: x16 about %d GB/s', name, compute_major,
                  compute_minor, CASE WHEN compute_major < 8 THEN '3.0' WHEN compute_major < 9 THEN '4.0' ELSE '5.0' END,
                  CASE WHEN compute_major < 8 THEN 12 WHEN compute_major < 9 THEN 25 ELSE 50 END) AS link
    FROM devices
    WHERE run_id = $run_id AND vendor = 'nvidia' AND compute_major >= 3 AND compute_minor IS NOT NULL
      AND NOT regexp_matches(coalesce(name, ''), '(?i)(orin|xavier|jetson|tegra|thor|gh200|gb200|gb300|gb10)')
), copy_place AS (  -- where most of each device's exposed copy time is (analyses/place.py)
    SELECT * FROM majority_window('exposed')
), small AS (  -- runs of small copies back to back on one stream: candidates for one batched copy
    SELECT *, sum(CASE WHEN prev_end IS NULL OR start_ns - prev_end > $max_batch_gap_ns
                       OR NOT prev_small THEN 1 ELSE 0 END)
              OVER (PARTITION BY device_id, stream_id ORDER BY start_ns ROWS UNBOUNDED PRECEDING) AS batch
    FROM (SELECT *, lag(end_ns) OVER w AS prev_end, lag(bytes < $small_copy_bytes) OVER w AS prev_small
          FROM explicit WINDOW w AS (PARTITION BY device_id, stream_id ORDER BY start_ns))
    WHERE bytes < $small_copy_bytes
), batches AS (
    SELECT device_id, stream_id, batch, count(*) AS n, sum(bytes) AS bytes, sum(dur_ns) AS dur_ns,
           min(copy_id) AS first_id, min(start_ns) AS start_ns, max(end_ns) AS end_ns
    FROM small GROUP BY ALL HAVING count(*) >= $min_batch_count
), best_bw AS (  -- the run's best host-to-device rate on a large copy, bytes per ns
    SELECT max(bytes / dur_ns) AS bytes_per_ns FROM explicit WHERE bytes >= 1048576
), unified AS (
    SELECT device_id, count(*) AS n, sum(bytes) AS bytes, sum(dur_ns) AS dur_ns,
           min(start_ns) AS start_ns, max(end_ns) AS end_ns
    FROM h2d WHERE coalesce(unified_memory, false) GROUP BY device_id
)
SELECT device_id, NULL::BIGINT AS stream_id, 'copy' AS item_kind, worst_copy.id AS item_id,
       'host-to-device copies' AS item_name, cp.w_start AS start_ns, cp.w_end AS end_ns,
       exposed_ns / nullif(span_ns, 0) AS value, 'share' AS value_unit, $warning_share AS threshold,
       CAST(least(exposed_ns, kernel_ns) AS BIGINT) AS est_loss_ns,
       CASE WHEN exposed_ns / nullif(span_ns, 0) >= $error_share THEN 'error'
            WHEN exposed_ns / nullif(span_ns, 0) >= $warning_share THEN 'warning' ELSE 'info' END AS severity,
       printf('device %d: %s of host-to-device copy time (%d of %d copies, %s) ran with no kernel to hide it, '
              || '%s of the device''s span; %s, %d through synchronous calls',
              device_id, fmt_ns(exposed_ns), n_exposed, n, fmt_bytes(bytes),
              fmt_pct(exposed_ns / nullif(span_ns, 0)),
              -- (a trace that does not record the source memory's kind cannot say none was pageable)
              CASE WHEN n_src_known = 0 THEN 'their source memory (pageable or pinned) not in the trace'
                   ELSE printf('%d from pageable memory', n_pageable) END, n_sync)
         -- overlap hides copy time behind kernels only: the loss is at most their time
         || CASE WHEN kernel_ns < exposed_ns
                 THEN '; ' || fmt_loss_bound(kernel_ns, 'of kernel time on the device that could have hidden it')
                 ELSE '' END AS message,
       -- where the kernels could hide less than half of it, overlap is not the fix: the volume is
       CASE WHEN 2 * kernel_ns < exposed_ns THEN
              printf('Overlap cannot fix this: the copies took %s and the device''s kernels %s, all that could '
                     || 'hide them. Move fewer bytes: keep data and weights resident on the GPU across steps, copy '
                     || 'once and reuse, or copy a smaller dtype; and check the rate, %.1f GB/s over these copies, '
                     || 'against what the host link gives (%s)%s.',
                     fmt_ns(exposed_ns), fmt_ns(kernel_ns), bytes / nullif(dur_ns, 0),
                     coalesce(hl.link, 'PCIe 4.0 x16 about 25 GB/s, 5.0 about 50'),
                     CASE WHEN exposed_pageable_ns >= exposed_ns / 2
                          THEN '; most of it is from pageable host memory, which pinned buffers copy faster' ELSE '' END)
            WHEN exposed_pageable_ns >= exposed_ns / 2 THEN
              'Most exposed time is from pageable host memory, which cannot be copied asynchronously: allocate the buffers pinned (cudaHostAlloc / cudaHostRegister, or pin_memory=True in a PyTorch DataLoader).'
            WHEN exposed_sync_ns >= exposed_ns / 2 THEN
              'Most exposed time is from synchronous copy calls: use cudaMemcpyAsync on a non-default stream (tensor.to(device, non_blocking=True) from pinned memory) so the copy can overlap compute.'
            ELSE 'Issue the copies earlier on a separate stream so they overlap the preceding kernels (prefetch the next batch / double-buffer).'
       END AS hint,
       '{"copies": ' || n || ', "exposed_copies": ' || n_exposed || ', "copy_ns": ' || dur_ns
         || ', "exposed_ns": ' || exposed_ns || ', "bytes": ' || bytes || ', "pageable_copies": ' || CASE WHEN n_src_known = 0 THEN 'null' ELSE CAST(n_pageable AS VARCHAR) END
         || ', "pageable_exposed_ns": ' || exposed_pageable_ns || ', "sync_copies": ' || n_sync
         || ', "sync_exposed_ns": ' || exposed_sync_ns || ', "device_active_span_ns": ' || coalesce(span_ns, 0)
         || ', "kernel_ns": ' || kernel_ns || ', "place": ' || place_json(cp, 'exposed copies')
         || ', "worst": ' || worst || '}' AS evidence
FROM per_device LEFT JOIN copy_place cp USING (device_id) LEFT JOIN host_link hl USING (device_id)
WHERE exposed_ns > $min_exposed_ns
UNION ALL
SELECT b.device_id, b.stream_id, 'copy', first_id, 'small host-to-device copies', b.start_ns, b.end_ns,
       n, 'copies', $min_batch_count,
       -- where no large copy shows the rate one batched copy would get, at most the batch's copy time
       CAST(greatest(b.dur_ns - coalesce(b.bytes / nullif(w.bytes_per_ns, 0), 0), 0) AS BIGINT),
       'warning',
       printf('stream %d on device %d: %d host-to-device copies under %s in a row (%s in all) took %s',
              b.stream_id, b.device_id, n, fmt_bytes($small_copy_bytes), fmt_bytes(b.bytes), fmt_ns(b.dur_ns))
         || CASE WHEN w.bytes_per_ns > 0 THEN ''
                 ELSE '; no copy of 1 MB or more in the run gives the rate one batched copy would get: est. at most their copy time' END,
       'Gather the small buffers into one pinned staging buffer and copy once (or use cudaMemcpyBatchAsync); each copy pays a fixed launch and DMA setup cost.',
       '{"copies": ' || n || ', "bytes": ' || b.bytes || ', "copy_ns": ' || b.dur_ns
         || ', "best_bytes_per_ns": ' || coalesce(CAST(w.bytes_per_ns AS VARCHAR), 'null') || '}'
FROM batches b, best_bw w
UNION ALL
SELECT device_id, NULL, 'device', device_id, 'unified-memory migrations', start_ns, end_ns,
       dur_ns, 'ns', NULL, NULL, 'info',
       printf('device %d: %d unified-memory page migrations host-to-device (%s, %s); reported apart from explicit copies',
              device_id, n, fmt_bytes(bytes), fmt_ns(dur_ns)),
       'Page faults move managed memory on demand; prefetch with cudaMemPrefetchAsync or set cudaMemAdvise hints so migrations happen ahead of the kernels.',
       '{"migrations": ' || n || ', "bytes": ' || bytes || ', "migration_ns": ' || dur_ns || '}'
FROM unified
ORDER BY 3, 1, 2
"""

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class T002Example(StreamRange, kw_only=True, forbid_unknown_fields=True):
    copy_id: Annotated[int, doc("id of the copy")]
    stream_id: Annotated[int, doc("stream")]
    bytes: Annotated[int, doc("bytes")]
    exposed_ns: Annotated[int, doc("time with nothing running beside it")]
    src_kind: Annotated[Optional[str], doc("the source memory kind (pageable, pinned, device)")]
    api_name: Annotated[Optional[str], doc("the CUDA API call that issued the copy")]


class T002Evidence(PlacedEvidence, kw_only=True, forbid_unknown_fields=True):
    copies: Annotated[Optional[int], doc("copies counted")] = None
    exposed_copies: Annotated[Optional[int], doc("copies with no kernel running beside them")] = None
    copy_ns: Annotated[Optional[int], doc("time of the copies")] = None
    exposed_ns: Annotated[Optional[int], doc("time with nothing running beside it")] = None
    bytes: Annotated[int, doc("bytes")]
    pageable_copies: Annotated[Optional[int], doc("copies from pageable memory (null: the trace does not record "
                                                  "the source memory's kind)")] = None
    pageable_exposed_ns: Annotated[Optional[int], doc("exposed time of copies from pageable memory")] = None
    sync_copies: Annotated[Optional[int], doc("synchronous copies")] = None
    sync_exposed_ns: Annotated[Optional[int], doc("exposed time of synchronous copies")] = None
    device_active_span_ns: Annotated[Optional[int], doc("time from the device's first to its last activity")] = None
    kernel_ns: Annotated[Optional[int], doc("kernel time")] = None
    worst: Annotated[Optional[list[T002Example]], doc("the copies with the most exposed time")] = None
    migrations: Annotated[Optional[int], doc("unified-memory migrations")] = None
    migration_ns: Annotated[Optional[int], doc("time of unified-memory migrations")] = None
    best_bytes_per_ns: Annotated[Optional[float], doc("the fastest copy rate seen for this kind of copy, bytes per ns")] = None


RULE = Rule(
    id="T002",
    evidence=T002Evidence,
    name="unoverlapped-h2d",
    title="Host-to-device copies not hidden behind compute",
    phase="timeline",
    claims="copy:HtoD",
    severity="warning",
    what="Host-to-device copy time during which no kernel ran on the same device; among those "
         "copies, the ones from pageable memory and the ones made through synchronous calls; runs "
         "of many small copies that could be one; unified-memory migrations, reported apart.",
    why="While a copy runs with nothing else on the GPU, the device waits for data. A copy from "
        "pageable memory is staged through a pinned bounce buffer by the driver and cannot run "
        "asynchronously; a synchronous call blocks the host too; many small copies each pay a "
        "fixed setup cost that one large copy pays once.",
    how="For each explicit HtoD copy (not unified memory), the exposed time is its duration minus "
        "its overlap with the union of kernel intervals on its device (`kernel_busy_intervals`). "
        "One finding per device sums it, with its share of the device's active span deciding the "
        "severity; its estimated loss is the part of it kernels could hide, at most the device's "
        "kernel time (`kernel_ns` in the evidence): overlap hides a copy behind compute, and no more. Small copies (< `small_copy_bytes`) on one stream with at most `max_batch_gap_ns` "
        "between them form a batch; a batch of `min_batch_count` or more is reported, its cost "
        "estimated as its copy time minus the bytes at the run's best rate on a copy of 1 MB or more (with no "
        "such copy, at most the batch's copy time, which the message says). Where the kernel "
        "time bounds a device's loss, its message says so." + PLACE_HOW,
    fix="Pin host buffers; use cudaMemcpyAsync on a separate stream and issue copies ahead of use "
        "(double buffering, DataLoader pin_memory + non_blocking); merge small copies; prefetch "
        "managed memory. Where the device's kernels could hide less than half of the exposed time, "
        "overlap cannot: move fewer bytes (keep data resident, copy once, a smaller dtype) and check "
        "the copies' rate against the host link's (the hint gives it).",
    requires="timed host-to-device copies",
    applies_sql="SELECT EXISTS (SELECT 1 FROM copies WHERE run_id = $run_id AND direction = 'HtoD' "
                "AND start_ns IS NOT NULL)",
    thresholds=(
        Threshold("min_exposed_ns", 0, "A device's exposed copy time must exceed this to be reported."),
        Threshold("warning_share", 0.05, "Exposed copy time as a share of the device's active span that makes a warning."),
        Threshold("error_share", 0.25, "Share that makes an error."),
        Threshold("small_copy_bytes", 65536, "Copies under this size count as small (in T006 too)."),
        Threshold("max_batch_gap_ns", 100000, "Small copies at most this far apart belong to one batch (T006 leaves batches to T002)."),
        Threshold("min_batch_count", 10, "Batches of at least this many small copies are reported (a batch is two or more; T006 leaves them to T002).", low=2),
        Threshold("max_examples", 5, "How many of the most exposed copies the evidence lists."),
    ),
    sql=SQL,
    references=(
        "Nsight Systems `nsys analyze` rules cuda_memcpy_async (pageable memory) and cuda_memcpy_sync",
        "CUDA C++ Best Practices Guide: 'Pinned Memory' and 'Asynchronous and Overlapping Transfers with Computation'",
    ),
    unknown=idle_unknown,  # on a sampled trace the kernels that hid a copy may be what it dropped
)
