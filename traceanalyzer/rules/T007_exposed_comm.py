"""T007 communication overlap: collective kernels that run with no compute beside them."""

from typing import Annotated, Optional

import msgspec

# Kernel names of collectives (COMM_PATTERN): the ones the time budget counts as communication.
from ..analyses.budget import COMM_PATTERN
from ._unknown import idle_unknown
from .base import Rule, Threshold
from .evidence import Evidence, StreamRange, doc

SQL = r"""
WITH comm_keys AS (  -- the pattern is matched once per distinct name (analyses.kernels.kernel_names), not per launch
    SELECT name_key FROM this_run.kernel_names WHERE regexp_matches(name, '__COMM__')
), k AS (  -- the run's kernels as its cache holds them (analyses.launches.stream_ops), their names by key
    SELECT item_id AS kernel_id, device_id, stream_id, start_ns, end_ns,
           name_key IN (SELECT name_key FROM comm_keys) AS is_comm
    FROM this_run.stream_ops WHERE kind = 'kernel' AND end_ns > start_ns
), comm_kernels AS (
    SELECT kernel_id, device_id, start_ns, end_ns FROM k WHERE is_comm
), compute_kernels AS (
    SELECT device_id, start_ns, end_ns FROM k WHERE NOT is_comm
), comm_islands AS (  -- disjoint collective-busy intervals per device
    SELECT device_id, island, start_ns, end_ns, busy_before_ns FROM device_islands('comm_kernels')
), compute_cum AS (  -- disjoint compute-busy intervals, each with the compute time up to its end
    SELECT device_id, start_ns, end_ns, busy_before_ns + end_ns - start_ns AS to_end_ns FROM device_islands('compute_kernels')
), -- Compute time beside each collective island and each collective kernel: covered_ns (one ASOF
   -- join over running totals), where an interval-overlap join is quadratic on long multi-GPU runs.
overlap AS (  -- collective time with some compute kernel running on the same device
    SELECT device_id, sum(covered_ns) AS overlap_ns FROM covered_ns('comm_islands', 'compute_cum', device_id)
    GROUP BY device_id
), per_kernel AS (  -- the collectives, named only now
    SELECT k.*, coalesce(n.short_name, n.name) AS short_name, k.end_ns - k.start_ns - o.covered_ns AS exposed_ns
    FROM k JOIN covered_ns('comm_kernels', 'compute_cum', device_id) o USING (kernel_id)
    JOIN kernels n ON n.run_id = $run_id AND n.kernel_id = k.kernel_id
), by_name AS (
    SELECT device_id, to_json(list({'kernel': short_name, 'launches': n, 'ns': ns, 'exposed_ns': exposed}
                                   ORDER BY exposed DESC, short_name)[1:$max_examples]) AS names
    FROM (SELECT device_id, short_name, count(*) AS n, sum(end_ns - start_ns) AS ns, sum(exposed_ns) AS exposed
          FROM per_kernel GROUP BY ALL)
    GROUP BY device_id
), seq AS (  -- each collective's place among its device's launches of that kernel
    SELECT *, row_number() OVER (PARTITION BY device_id, short_name ORDER BY start_ns, kernel_id) AS i,
           count(*) OVER (PARTITION BY device_id, short_name) AS n_of_name
    FROM per_kernel
), matched AS (  -- kernels every device of the run launches equally often: their i-th launches
    -- on each device are one collective (the GPUs of one job in one trace)
    SELECT short_name FROM seq GROUP BY short_name
    HAVING count(DISTINCT device_id) > 1 AND min(n_of_name) = max(n_of_name)
       AND count(DISTINCT device_id) = (SELECT count(DISTINCT device_id) FROM comm_kernels)
), waits AS (  -- of each collective's exposed time, the part before the last device started it:
    -- waiting for the other GPUs to arrive, which no overlap hides
    SELECT device_id, least(exposed_ns, greatest(max(start_ns) OVER (PARTITION BY short_name, i) - start_ns, 0)) AS wait_ns
    FROM seq SEMI JOIN matched USING (short_name)
), wait_totals AS (
    SELECT device_id, sum(wait_ns) AS wait_ns FROM waits GROUP BY device_id
), shared_streams AS (  -- streams that run collectives and compute kernels both
    SELECT device_id, count(*) AS n FROM (SELECT device_id, stream_id FROM k GROUP BY ALL HAVING bool_or(is_comm) AND NOT bool_and(is_comm))
    GROUP BY device_id
), per_device AS (
    SELECT p.device_id, count(*) AS n, count(DISTINCT p.stream_id) AS streams,
           -- the most exposed kernel (the earliest, then lowest id, among equals), from one arg_max:
           -- three would each break a tie on their own
           arg_max({'id': p.kernel_id, 'start_ns': p.start_ns, 'end_ns': p.end_ns},
                   (p.exposed_ns, -p.start_ns, -p.kernel_id)) AS worst_kernel,
           to_json(list({'kernel_id': p.kernel_id, 'kernel': p.short_name, 'stream_id': p.stream_id,
                         'start_ns': p.start_ns, 'end_ns': p.end_ns, 'exposed_ns': p.exposed_ns}
                        ORDER BY p.exposed_ns DESC, p.start_ns, p.kernel_id)[1:$max_examples]) AS worst
    FROM per_kernel p GROUP BY p.device_id
), totals AS (
    SELECT i.device_id, sum(i.end_ns - i.start_ns) AS comm_ns, coalesce(any_value(o.overlap_ns), 0) AS overlap_ns
    FROM comm_islands i LEFT JOIN overlap o USING (device_id) GROUP BY i.device_id
), scored AS (
    SELECT d.*, t.comm_ns, t.comm_ns - t.overlap_ns AS exposed_ns, b.active_span_ns, n.names,
           r.rank, r.world_size, w.wait_ns, coalesce(ss.n, 0) = 0 AS own_streams
    FROM per_device d JOIN totals t USING (device_id) JOIN by_name n USING (device_id)
    JOIN this_run.device_busy b ON b.device_id = d.device_id
    JOIN runs r ON r.run_id = $run_id
    LEFT JOIN wait_totals w USING (device_id)
    LEFT JOIN shared_streams ss USING (device_id)
)
SELECT device_id, NULL::BIGINT AS stream_id, 'kernel' AS item_kind, worst_kernel.id AS item_id,
       'exposed communication' AS item_name, worst_kernel.start_ns AS start_ns, worst_kernel.end_ns AS end_ns,
       exposed_ns / active_span_ns AS value, 'share' AS value_unit, $min_share AS threshold,
       exposed_ns AS est_loss_ns,
       CASE WHEN exposed_ns / active_span_ns >= $error_share THEN 'error' END AS severity,
       printf('%sdevice %d: %s of %s collective kernel time (%d launches) ran with no compute kernel beside it: '
              || '%s exposed, %s of the device''s span',
              CASE WHEN rank IS NULL THEN '' ELSE printf('rank %d%s, ', rank,
                   CASE WHEN world_size IS NULL THEN '' ELSE '/' || world_size END) END,
              device_id, fmt_pct(exposed_ns / comm_ns), fmt_ns(comm_ns), n, fmt_ns(exposed_ns),
              fmt_pct(exposed_ns / active_span_ns))
         || CASE WHEN wait_ns > 0
                 THEN printf('; %s of it before the last of the run''s GPUs started the same collective (waiting for it)',
                             fmt_ns(wait_ns)) ELSE '' END AS message,
       CASE WHEN 2 * coalesce(wait_ns, 0) >= exposed_ns
            THEN 'Most of it is waiting for another GPU to reach the collective, which overlap cannot hide: the GPUs are unbalanced. Compare the work each does between collectives (the kernels before them, their inputs'' sizes, the host feeding each GPU) and even it out.'
            WHEN own_streams
            THEN 'The collectives already run on streams of their own: what is exposed had no compute ready beside it. Start them earlier (DDP gradient bucketing: a smaller bucket_cap_mb; FSDP: forward/backward prefetch), give the compute streams work to overlap, and if the compute streams sit idle waiting on the host, that is the idle findings'' time, not the network''s; check the other ranks (T008) for a straggler.'
            ELSE 'Overlap communication with computation: launch collectives asynchronously on their own stream as soon as their inputs are ready (DDP gradient bucketing: tune bucket_cap_mb; FSDP: forward/backward prefetch; async_op=True and wait late), and check the other ranks (T008) when the time is waiting for a straggler.'
       END AS hint,
       '{"collective_launches": ' || n || ', "collective_ns": ' || comm_ns || ', "exposed_ns": ' || exposed_ns
         || ', "active_span_ns": ' || active_span_ns || ', "streams": ' || streams
         || ', "own_streams": ' || own_streams || ', "wait_ns": ' || coalesce(CAST(wait_ns AS VARCHAR), 'null')
         || ', "rank": ' || coalesce(CAST(rank AS VARCHAR), 'null') || ', "world_size": '
         || coalesce(CAST(world_size AS VARCHAR), 'null') || ', "by_kernel": ' || names
         || ', "worst": ' || worst || '}' AS evidence
FROM scored
WHERE exposed_ns > $min_exposed_ns AND exposed_ns >= $min_share * active_span_ns
ORDER BY device_id
"""
SQL = SQL.replace("__COMM__", COMM_PATTERN)

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class T007KernelExposure(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    kernel: Annotated[str, doc("kernel name")]
    launches: Annotated[int, doc("launches")]
    ns: Annotated[int, doc("time")]
    exposed_ns: Annotated[int, doc("time with nothing running beside it")]


class T007Example(StreamRange, kw_only=True, forbid_unknown_fields=True):
    kernel_id: Annotated[int, doc("id of the kernel")]
    kernel: Annotated[str, doc("kernel name")]
    stream_id: Annotated[int, doc("stream")]
    exposed_ns: Annotated[int, doc("time with nothing running beside it")]


class T007Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    collective_launches: Annotated[int, doc("collective kernels launched")]
    collective_ns: Annotated[int, doc("time of the collective kernels")]
    exposed_ns: Annotated[int, doc("time with nothing running beside it")]
    active_span_ns: Annotated[int, doc("time from the device's first to its last GPU activity")]
    streams: Annotated[int, doc("streams")]
    own_streams: Annotated[Optional[bool], doc("whether no stream of the collectives runs compute kernels")] = None
    wait_ns: Annotated[Optional[int], doc("of the exposed time, the part before the last of the run's GPUs started the "
                                          "same collective (its i-th launch of that kernel on each device; NULL where the "
                                          "devices do not launch it equally often, or the run has one)")] = None
    rank: Annotated[Optional[int], doc("the rank")]
    world_size: Annotated[Optional[int], doc("ranks in the job")]
    by_kernel: Annotated[list[T007KernelExposure], doc("exposed time per collective kernel")]
    worst: Annotated[list[T007Example], doc("the collectives with the most exposed time")]


RULE = Rule(
    id="T007",
    evidence=T007Evidence,
    name="exposed-communication",
    title="Collective communication not overlapped with compute",
    phase="timeline",
    claims="communication",
    severity="warning",
    what="Per device (and rank, when the trace says it), the time collective kernels (NCCL/RCCL "
         "`ncclKernel_*`/`ncclDevKernel_*`, custom all-reduce kernels) run while no compute kernel runs "
         "on the same device: exposed communication.",
    why="A collective that runs alone stalls the step: the GPU only moves data. Data-parallel and "
        "sharded training hide most communication behind the backward pass or the next layer's "
        "compute; exposed communication is time that better bucketing, prefetching or stream use "
        "can win back, or time spent waiting for a slower rank.",
    how="Kernels whose name matches the collective pattern (nccl, rccl, all_reduce/allreduce, "
        "all_gather, reduce_scatter, all_to_all, multimem_all_reduce, cross_device_reduce) are "
        "merged into disjoint intervals per device, and so are all other kernels (compute; copies "
        "do not count as compute). Exposed time = collective time minus its overlap with compute. "
        "One finding per device when exposed time exceeds `min_exposed_ns` and `min_share` of the "
        "device's active span; an error from `error_share`. Where the run holds several GPUs of one "
        "job that launch a collective kernel equally often, the i-th launches on each are one collective, "
        "and a device's exposed time before the last of them started is waiting for the others "
        "(`wait_ns`): when it is half the exposed time or more, the hint is the GPUs' imbalance, which "
        "overlap cannot hide; where the collectives' streams run no compute (`own_streams`), it does "
        "not ask for a stream of their own. The estimated loss is the exposed time: "
        "an upper bound, since part of it may be waiting for other ranks (see T008) or have no "
        "independent compute to hide behind.",
    fix="Issue collectives asynchronously on a dedicated stream as early as their inputs allow "
        "(DDP bucketing, FSDP prefetch, overlapped tensor parallelism) and balance work across ranks.",
    requires="timed collective (NCCL/RCCL) kernels",
    # bool_or over the distinct names: a WHERE would be pushed below DISTINCT onto every launch
    applies_sql="SELECT coalesce(bool_or(regexp_matches(name, '" + COMM_PATTERN + "')), false) "
                "FROM (SELECT DISTINCT name FROM kernels WHERE run_id = $run_id AND start_ns IS NOT NULL)",
    thresholds=(
        Threshold("min_exposed_ns", 100000, "A device's exposed collective time must exceed this (100 us)."),
        Threshold("min_share", 0.05, "...and this share of the device's active span."),
        Threshold("error_share", 0.25, "Share that makes an error."),
        Threshold("max_examples", 5, "How many kernels and collective names the evidence lists."),
    ),
    sql=SQL,
    references=(
        "Nsight Systems recipe nccl_gpu_overlap_trace (compute vs nccl kernel overlap)",
        "Holistic Trace Analysis: comm/comp overlap",
        "PyTorch DDP: gradient bucketing and communication overlap",
    ),
    unknown=idle_unknown,  # on a sampled trace the compute beside a collective may be what it dropped
)
