"""Device memory over time: the allocator's events with the memory allocated after each
(`memory_levels`)."""

from __future__ import annotations

from .core import View





DEFINES = (
    View(
        "memory_levels",
        "Per run and device (`device_type`, `device_id`), every allocator event with a time and a size, in "
        "time order (`seq`; `next_ts_ns` is the next event's time), with the memory allocated after it, "
        "`allocated_bytes`: the allocator's own total when every event of the device has one "
        "(`has_totals`), else the running sum of signed sizes lifted by `before_trace_bytes`, what frees "
        "show was allocated before the trace began (so it never goes below 0). `reserved_bytes`: the "
        "allocator's reserved total, when every event of the device has it. Peak memory is the highest "
        "`allocated_bytes` of a device (rule M001, the report's memory plot, `diff`).",
        """
        WITH running AS (
            SELECT run_id, device_type, device_id, event_id, ts_ns, bytes, address, pid, tid,
                   total_allocated_bytes, total_reserved_bytes,
                   row_number() OVER w AS seq, lead(ts_ns) OVER w AS next_ts_ns,
                   sum(bytes) OVER (w ROWS UNBOUNDED PRECEDING) AS cum_bytes
            FROM memory_events WHERE ts_ns IS NOT NULL AND bytes IS NOT NULL
            WINDOW w AS (PARTITION BY run_id, device_type, device_id ORDER BY ts_ns, event_id)
        ), per_device AS (
            SELECT run_id, device_type, device_id,
                   count(total_allocated_bytes) = count(*) AS has_totals,
                   count(total_reserved_bytes) = count(*) AS has_reserved,
                   -- the running sum starts at 0 with the trace; frees of older blocks drive it
                   -- below 0, which bounds what was there before
                   greatest(0, -min(cum_bytes)) AS sum_baseline,
                   arg_min(total_allocated_bytes - bytes, seq) AS totals_baseline
            FROM running GROUP BY run_id, device_type, device_id
        )
        SELECT r.* EXCLUDE (cum_bytes), d.has_totals,
               CASE WHEN d.has_totals THEN r.total_allocated_bytes ELSE r.cum_bytes + d.sum_baseline END AS allocated_bytes,
               CASE WHEN d.has_reserved THEN r.total_reserved_bytes END AS reserved_bytes,
               CASE WHEN d.has_totals THEN d.totals_baseline ELSE d.sum_baseline END AS before_trace_bytes
        FROM running r JOIN per_device d USING (run_id, device_type, device_id)
        """,
        reads=(),
    ),
)
