"""M001 peak memory and fragmentation: when device memory peaked, what held it, what was wasted."""

from typing import Annotated, Optional

import msgspec

from .base import Rule, Threshold
from .evidence import Evidence, doc

# Allocator-only operators: an allocation inside one is charged to the operator that called it.
ALLOCATOR_OPS = ("'aten::empty', 'aten::empty_strided', 'aten::empty_like', 'aten::new_empty', "
                 "'aten::new_empty_strided', 'aten::resize_', 'aten::empty_permuted'")


def _first_at_top(level: str) -> str:
    """Per device, the first event (lowest seq) at the highest `level`: two aggregates, not
    a window sort of every event."""
    return f"""SELECT l.* FROM level l JOIN (
        SELECT l.device_id, min(l.seq) AS seq
        FROM level l JOIN (SELECT device_id, max({level}) AS top FROM level GROUP BY device_id) m
          ON m.device_id = l.device_id AND l.{level} = m.top
        GROUP BY l.device_id) f USING (device_id, seq)"""


SQL = rf"""
WITH level AS (  -- allocated (and reserved) memory after each event, the `memory_levels` view
    SELECT event_id, ts_ns, device_id, address, bytes, pid, tid, seq, next_ts_ns AS next_ts, has_totals,
           before_trace_bytes, allocated_bytes AS allocated, reserved_bytes AS reserved
    FROM memory_levels WHERE run_id = $run_id AND device_type = 'cuda' AND device_id >= 0
), per_device AS (
    SELECT device_id, count(*) AS events, any_value(has_totals) AS has_totals,
           count(address) = count(*) AS has_addresses, any_value(before_trace_bytes) AS before_trace_bytes,
           min(ts_ns) AS first_ns, max(ts_ns) AS last_ns,
           -- reserved memory the same at every event: set before the trace, it never grew in it
           min(reserved) = max(reserved) AS reserved_flat
    FROM level GROUP BY device_id
), peak_alloc AS (
    {_first_at_top("allocated")}
), peak_res AS (
    {_first_at_top("reserved")}
), before_peak AS (
    SELECT l.device_id, l.seq, l.allocated FROM level l JOIN peak_alloc p ON p.device_id = l.device_id AND l.seq < p.seq
), trough AS (  -- the last low point before the peak (used when frees cannot be matched to allocations)
    SELECT b.device_id, max(b.seq) AS trough_seq
    FROM before_peak b JOIN (SELECT device_id, min(allocated) AS low FROM before_peak GROUP BY device_id) m
      ON m.device_id = b.device_id AND b.allocated = m.low
    GROUP BY b.device_id
), held_by_address AS (
    -- The allocations still live at the peak (not freed, nor reused, by then): those that are
    -- the last event at their address up to the peak. (A group-by, not a window sorting every
    -- event by address.)
    SELECT l.device_id, l.event_id, l.ts_ns, l.bytes, l.address, l.pid, l.tid
    FROM level l JOIN (
        SELECT l.device_id, max(l.seq) AS seq
        FROM level l JOIN per_device d USING (device_id) JOIN peak_alloc p USING (device_id)
        WHERE d.has_addresses AND l.seq <= p.seq
        GROUP BY l.device_id, l.address
    ) last_at_address USING (device_id, seq)
    WHERE l.bytes > 0
), address_mode AS (
    -- Addresses are only trusted when what they say is live fits under the peak (frees must
    -- name the addresses their allocations had); else fall back to the climb below.
    SELECT d.device_id, d.has_addresses AND coalesce(sum(h.bytes), 0)
             <= 1.01 * p.allocated AS by_address
    FROM per_device d JOIN peak_alloc p USING (device_id) LEFT JOIN held_by_address h USING (device_id)
    GROUP BY d.device_id, d.has_addresses, p.allocated
), held AS (
    SELECT h.* FROM held_by_address h JOIN address_mode m USING (device_id) WHERE m.by_address
    UNION ALL
    -- Without usable addresses: the allocations made on the climb from the last low point to the peak.
    SELECT l.device_id, l.event_id, l.ts_ns, l.bytes, l.address, l.pid, l.tid
    FROM level l JOIN address_mode m USING (device_id) JOIN peak_alloc p USING (device_id)
    LEFT JOIN trough t USING (device_id)
    WHERE NOT m.by_address AND l.bytes > 0 AND l.seq <= p.seq AND l.seq > coalesce(t.trough_seq, 0)
), charged AS (  -- the innermost enclosing operator on the allocating thread, past allocator-only ones
    -- The join is on time alone, a range join (sorted, or an IEJoin for many allocations), the
    -- thread tested after it: coalesce() keeps that test out of the join's keys, where a hash
    -- join on the thread would compare each allocation with every operator of its thread.
    SELECT h.event_id,
           coalesce(list(o.name ORDER BY o.start_ns DESC, o.end_ns, o.op_id DESC)
                        FILTER (WHERE o.name NOT IN ({ALLOCATOR_OPS}))[1],
                    list(o.name ORDER BY o.start_ns DESC, o.end_ns, o.op_id DESC)[1]) AS op
    FROM held h JOIN cpu_ops o ON o.start_ns <= h.ts_ns AND o.end_ns >= h.ts_ns
    WHERE o.run_id = $run_id AND coalesce(o.pid = h.pid AND o.tid = h.tid, false)
    GROUP BY h.event_id
), held_ops AS (
    SELECT h.*, coalesce(c.op, '(no operator)') AS op FROM held h LEFT JOIN charged c USING (event_id)
), top_ops AS (
    SELECT device_id, to_json(list({{'op': op, 'bytes': bytes, 'allocations': n}} ORDER BY bytes DESC, op)[1:$max_examples]) AS ops,
           list(op ORDER BY bytes DESC, op)[1] AS top_op, max(bytes) AS top_bytes
    FROM (SELECT device_id, op, sum(bytes) AS bytes, count(*) AS n FROM held_ops GROUP BY device_id, op)
    GROUP BY device_id
), top_blocks AS (
    SELECT device_id, sum(bytes) AS held_bytes, count(*) AS held_count,
           to_json(list({{'event_id': event_id, 'ts_ns': ts_ns, 'bytes': bytes, 'address': address, 'op': op}}
                        ORDER BY bytes DESC, event_id)[1:$max_examples]) AS blocks
    FROM held_ops GROUP BY device_id
), summary AS (
    SELECT d.device_id, d.events, d.has_totals, m.by_address, d.reserved_flat,
           d.before_trace_bytes,
           pa.event_id AS pa_id, pa.allocated AS peak_allocated, pa.ts_ns AS pa_start, coalesce(pa.next_ts, pa.ts_ns) AS pa_end,
           pr.event_id AS pr_id, pr.reserved AS peak_reserved, pr.allocated AS allocated_at_reserved_peak,
           pr.ts_ns AS pr_start, coalesce(pr.next_ts, pr.ts_ns) AS pr_end,
           dev.total_memory_bytes AS capacity, coalesce(t.held_bytes, 0) AS held_bytes, coalesce(t.held_count, 0) AS held_count,
           -- of the peak, what was allocated before the trace began (known only from addresses)
           CASE WHEN m.by_address THEN pa.allocated - coalesce(t.held_bytes, 0) END AS before_held_bytes,
           coalesce(t.blocks, '[]') AS blocks, coalesce(o.ops, '[]') AS ops, o.top_op, o.top_bytes,
           (SELECT start_ns FROM runs WHERE run_id = $run_id) AS run_start
    FROM per_device d JOIN address_mode m USING (device_id) JOIN peak_alloc pa USING (device_id)
    LEFT JOIN peak_res pr USING (device_id)
    LEFT JOIN devices dev ON dev.run_id = $run_id AND dev.device_id = d.device_id
    LEFT JOIN top_blocks t USING (device_id) LEFT JOIN top_ops o USING (device_id)
), described AS (
    SELECT *, greatest(peak_allocated, coalesce(peak_reserved, 0)) / nullif(capacity, 0) AS capacity_share,
           -- most of the peak allocated before the trace began: what holds it is not in the trace
           coalesce(2 * before_held_bytes >= peak_allocated, false) AS held_before,
           1 - peak_allocated / nullif(peak_reserved, 0) AS unused_share,
           '{{"peak_allocated_bytes": ' || peak_allocated || ', "peak_allocated_start_ns": ' || pa_start
             || ', "peak_allocated_end_ns": ' || pa_end
             || ', "peak_reserved_bytes": ' || coalesce(peak_reserved::VARCHAR, 'null')
             || ', "peak_reserved_start_ns": ' || coalesce(pr_start::VARCHAR, 'null')
             || ', "peak_reserved_end_ns": ' || coalesce(pr_end::VARCHAR, 'null')
             || ', "allocated_at_reserved_peak_bytes": ' || coalesce(allocated_at_reserved_peak::VARCHAR, 'null')
             || ', "device_memory_bytes": ' || coalesce(capacity::VARCHAR, 'null')
             || ', "events": ' || events || ', "before_trace_bytes": ' || before_trace_bytes
             || ', "held_from_before_trace_bytes": ' || coalesce(before_held_bytes::VARCHAR, 'null')
             || ', "totals": ' || to_json(CASE WHEN has_totals THEN 'allocator totals' ELSE 'running sum of signed sizes' END)
             || ', "attribution": ' || to_json(CASE WHEN by_address THEN 'live at the peak'
                                                    ELSE 'allocated since the last low point before the peak' END)
             || ', "attributed_bytes": ' || held_bytes || ', "attributed_allocations": ' || held_count
             || ', "top_ops": ' || ops || ', "largest": ' || blocks || '}}' AS evidence
    FROM summary
)
SELECT device_id, NULL::BIGINT AS stream_id, 'memory' AS item_kind, pa_id AS item_id,
       'peak allocated memory' AS item_name, pa_start AS start_ns, pa_end AS end_ns,
       peak_allocated AS value, 'bytes' AS value_unit,
       $warning_capacity_share * capacity AS threshold, NULL::BIGINT AS est_loss_ns,
       CASE WHEN capacity_share >= $warning_capacity_share AND NOT held_before THEN 'warning' ELSE 'info' END AS severity,
       printf('device %d: peak allocated %s at +%s%s%s; %s',
              device_id, fmt_bytes(peak_allocated), fmt_ns(pa_start - run_start),
              CASE WHEN peak_reserved IS NOT NULL AND reserved_flat
                   THEN printf(', reserved %s throughout the trace', fmt_bytes(peak_reserved))
                   WHEN peak_reserved IS NOT NULL
                   THEN printf(', peak reserved %s at +%s', fmt_bytes(peak_reserved), fmt_ns(pr_start - run_start))
                   ELSE '' END,
              CASE WHEN capacity IS NOT NULL THEN printf(' (%s of %s)', fmt_pct(capacity_share), fmt_bytes(capacity))
                   ELSE '' END
              -- a running sum counts from the trace's start: what was allocated before it and not
              -- freed in it (weights, optimizer state) is not in it
              || CASE WHEN NOT has_totals THEN ', counted from the trace''s start (no allocator totals: memory '
                                               || 'allocated before it and not freed in it is not counted)'
                      ELSE '' END,
              CASE WHEN top_op IS NULL THEN 'no allocation could be attributed'
                   ELSE printf('most %s by %s (%s)', CASE WHEN by_address THEN 'held at the peak'
                                                          ELSE 'allocated on the climb to it' END,
                               top_op, fmt_bytes(top_bytes)) END
              || CASE WHEN before_held_bytes > 0
                      THEN printf(', besides %s held from before the trace began', fmt_bytes(before_held_bytes))
                      ELSE '' END) AS message,
       CASE WHEN held_before THEN
              'Most of the peak was allocated before the trace began (model weights and optimizer state, or memory '
              || 'reserved up front such as an inference server''s KV cache): the trace cannot say what holds '
              || 'it. Record from the start (torch.cuda.memory._record_memory_history) to see; a deliberate '
              || 'preallocation is nothing to fix.'
            WHEN capacity_share >= $warning_capacity_share THEN
              'The device is close to full: free or reuse the largest tensors held at the peak (see evidence), use '
              || 'activation checkpointing, smaller micro-batches, lower-precision activations, or shard states (FSDP/ZeRO).'
            ELSE 'The operators holding most memory at the peak are listed in the evidence; they are where to cut if memory limits the batch size.'
       END AS hint,
       evidence
FROM described
UNION ALL
-- Reserved memory that never grew in the trace was cached before it (an earlier, higher peak):
-- the allocator cost nothing here, and without a snapshot its blocks' fragmentation is unknown.
SELECT device_id, NULL, 'memory', pr_id, 'reserved but unallocated memory', pr_start, pr_end,
       unused_share, 'share', $min_fragmentation_share, NULL, CASE WHEN reserved_flat THEN 'info' ELSE 'warning' END,
       CASE WHEN reserved_flat
            THEN printf('device %d: the caching allocator held %s reserved throughout the trace but at most %s was '
                        || 'allocated in it: %s (%s) cached from before the trace began (an earlier, higher peak: '
                        || 'warm-up, compilation); whether it is fragmented the trace cannot tell',
                        device_id, fmt_bytes(peak_reserved), fmt_bytes(peak_allocated),
                        fmt_bytes(peak_reserved - peak_allocated), fmt_pct(unused_share))
            ELSE printf('device %d: the caching allocator reserved %s at its peak but at most %s was allocated in the trace: '
                        || '%s (%s) reserved and not allocated at any time of it (fragmentation, or free blocks cached from '
                        || 'before); %s allocated at the reserved peak',
                        device_id, fmt_bytes(peak_reserved), fmt_bytes(peak_allocated), fmt_bytes(peak_reserved - peak_allocated),
                        fmt_pct(unused_share), fmt_bytes(allocated_at_reserved_peak)) END,
       CASE WHEN reserved_flat
            THEN 'Reserved memory did not grow in the trace, so the allocator cost nothing here; the cached blocks '
                 || 'matter only when something else needs the memory: torch.cuda.empty_cache() after the warm-up '
                 || 'returns them, and a memory snapshot (torch.cuda.memory._snapshot()) shows whether they are fragmented.'
            ELSE 'Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow instead of fragmenting), keep tensor '
                 || 'sizes steady between steps (pad or bucket varying shapes), and free large temporaries before the peak.' END,
       evidence
FROM described
WHERE unused_share >= $min_fragmentation_share AND peak_reserved - peak_allocated >= $min_fragmentation_bytes
  AND peak_reserved > peak_allocated  -- some of it never allocated, whatever the thresholds (0 too)
ORDER BY device_id, item_name
"""

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class M001TopOp(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: Annotated[str, doc("the operator")]
    bytes: Annotated[int, doc("bytes")]
    allocations: Annotated[int, doc("allocations counted")]


class M001Allocation(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    event_id: Annotated[int, doc("the allocator event")]
    ts_ns: Annotated[int, doc("when it was allocated")]
    bytes: Annotated[int, doc("bytes")]
    address: Annotated[Optional[int], doc("the block's device address")]
    op: Annotated[str, doc("the operator")]


class M001Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    peak_allocated_bytes: Annotated[int, doc("peak allocated bytes")]
    peak_allocated_start_ns: Annotated[int, doc("start of the peak allocated level")]
    peak_allocated_end_ns: Annotated[int, doc("end of the peak allocated level")]
    peak_reserved_bytes: Annotated[Optional[int], doc("peak reserved bytes")]
    peak_reserved_start_ns: Annotated[Optional[int], doc("start of the peak reserved level")]
    peak_reserved_end_ns: Annotated[Optional[int], doc("end of the peak reserved level")]
    allocated_at_reserved_peak_bytes: Annotated[Optional[int], doc("bytes allocated when reserved memory peaked")]
    device_memory_bytes: Annotated[Optional[int], doc("the device's memory")]
    events: Annotated[int, doc("allocator events read")]
    before_trace_bytes: Annotated[int, doc("bytes allocated before the trace began (with `totals` a running sum of signed sizes: at least this, what frees of older blocks show)")]
    held_from_before_trace_bytes: Annotated[Optional[int], doc("bytes at the peak allocated before the trace began")]
    totals: Annotated[str, doc("how the allocated totals were obtained")]
    attribution: Annotated[str, doc("how allocations were attributed to operators")]
    attributed_bytes: Annotated[int, doc("bytes at the peak attributed to an operator")]
    attributed_allocations: Annotated[int, doc("allocations at the peak attributed to an operator")]
    top_ops: Annotated[list[M001TopOp], doc("operators holding most bytes at the peak")]
    largest: Annotated[list[M001Allocation], doc("the largest live allocations at the peak")]


RULE = Rule(
    id="M001",
    evidence=M001Evidence,
    name="peak-memory",
    title="Peak device memory and fragmentation",
    phase="memory",
    severity="info",
    what="Per device: the peak of allocated memory and of reserved memory and when they happened, "
         "the operators that hold most of it at the peak, and reserved memory far above what was "
         "allocated at any time of the trace (allocator fragmentation, or blocks cached from before).",
    why="The peak decides whether a batch size fits and what to cut to fit a bigger one; the "
        "operators holding memory at that moment are where to cut. PyTorch's caching allocator "
        "keeps freed blocks reserved; when reserved memory runs far above allocated memory, the "
        "difference is fragmentation that can cause out-of-memory errors with memory to spare.",
    how="From the allocator events (Kineto `[memory]`, nsys `CUDA_GPU_MEMORY_USAGE_EVENTS`) of "
        "CUDA devices, ordered by time: allocated memory is the allocator's `Total Allocated` when "
        "the trace records it, else the running sum of the signed sizes, raised so it never goes "
        "below zero (blocks allocated before the trace and freed in it). The peak is the first "
        "event reaching the maximum; its time range lasts until the next event on the device. When "
        "events carry addresses, the allocations live at the peak are those not freed (or reused) "
        "by then; otherwise those made since the last low point before the peak. Each is charged "
        "to the innermost enclosing operator on its thread (Kineto `cpu_ops`), past allocator-only "
        "ones like `aten::empty`. A peak finding is made per device (a warning at "
        "`warning_capacity_share` of device memory, unless most of the peak was allocated before the trace "
        "began: what holds it is not in the trace, e.g. an inference server's preallocated KV cache); a fragmentation finding when 1 - peak "
        "allocated / peak reserved reaches `min_fragmentation_share` and the difference "
        "`min_fragmentation_bytes`.",
    fix="Free or shrink what is live at the peak (activation checkpointing, smaller micro-batches, "
        "sharding); against fragmentation set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` "
        "and keep tensor sizes steady.",
    requires="allocator events (Kineto `[memory]` with profile_memory=True, or nsys --cuda-memory-usage=true)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM memory_events WHERE run_id = $run_id AND device_type = 'cuda' "
                "AND device_id >= 0 AND bytes IS NOT NULL)",
    thresholds=(
        Threshold("warning_capacity_share", 0.9, "Peak memory at this share of the device's memory makes the peak finding a warning."),
        Threshold("min_fragmentation_share", 0.3, "Report when 1 - peak allocated / peak reserved reaches this share ..."),
        Threshold("min_fragmentation_bytes", 1 << 30, "... and peak reserved exceeds peak allocated by this much (1 GiB)."),
        Threshold("max_examples", 5, "How many operators and blocks the evidence lists."),
    ),
    sql=SQL,
    references=(
        "PyTorch: 'CUDA memory management' (caching allocator, memory_reserved vs memory_allocated, expandable_segments)",
        "PyTorch profiler: profile_memory=True ([memory] events with Total Allocated / Total Reserved)",
    ),
)
