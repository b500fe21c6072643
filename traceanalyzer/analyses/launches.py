"""Launches and stream order: each kernel with the host call that launched it
(`kernel_launches`), every operation in its stream's order (`stream_ops`), and CUDA/HIP graph
replays (`graph_replays`). The per-run cache builds the first two in slices of start time
(`store.run_cache`); their generators give that form too."""

from __future__ import annotations

from .core import View


def _in_slice(start: str) -> str:
    """The condition that `start` lies in the slice [$2, $3) of a sliced per-run query ($3 NULL:
    no end); NULL starts, which sort last, belong to the last slice ($4). Written so that DuckDB
    skips the row groups outside the slice by their zone maps."""
    return f"({start} >= $2 AND ({start} < $3 OR $3 IS NULL) OR {start} IS NULL AND $4)"


def kernel_launches_sql(per_run: bool = False, sliced: bool = False) -> str:
    """The kernel_launches view's query; with `per_run`, one run's ($1) rows without a run_id
    column, and with `sliced` too, those of the kernels starting in one slice (`_in_slice`)."""
    run = "" if per_run else "k.run_id, "
    where = "WHERE k.run_id = $1" if per_run else ""
    if sliced:
        where += f" AND {_in_slice('k.start_ns')}"
    return f"""
        SELECT {run}k.kernel_id, k.device_id, n.name_key, k.grid_x, k.grid_y, k.grid_z,
               k.block_x, k.block_y, k.block_z, a.call_id, a.pid, a.tid,
               a.start_ns AS call_start_ns, a.end_ns AS call_end_ns
        FROM kernels k JOIN api_calls a ON a.run_id = k.run_id AND a.call_id = k.launch_call_id
        LEFT JOIN kernel_names n ON n.run_id = k.run_id AND n.name = k.name {where}
        """


_STREAM_OPS_COLUMNS = ("device_id, stream_id, kind, item_id, start_ns, end_ns, pid, launch_call_id, name_key, "
                       "external_id, threads")
# The per-run cache's stream_ops continues each slice from the operation before it, per stream:
# a TEMP table of stream_ops rows (see store.run_cache._build_in_slices).
STREAM_OPS_CARRY = "_ta_stream_ops_carry"


def stream_ops_sql(per_run: bool = False, sliced: bool = False) -> str:
    """The stream_ops view's query; with `per_run`, one run's ($1) rows without a run_id column.

    Unified-memory page migrations are left out: the driver moves pages when they are touched,
    they are not work a stream was given, so they neither make nor close a stream's gaps (they
    stay in gpu_activity, and so in the device's busy time).

    With `sliced` (and `per_run`), one slice of it: the operations starting in the slice
    (`_in_slice`), each stream going on from its last operation in earlier slices, which
    STREAM_OPS_CARRY holds. That row takes part in the window (it is the first operation's
    predecessor, and numbers the stream on) and is left out of the result."""
    run = "" if per_run else "run_id, "
    where = "WHERE NOT a.unified_memory" + (" AND a.run_id = $1" if per_run else "")
    if sliced:
        where += f" AND {_in_slice('a.start_ns')}"
    ops = f"""SELECT a.*, n.name_key FROM gpu_activity a
              LEFT JOIN kernel_names n ON a.kind = 'kernel' AND n.run_id = a.run_id AND n.name = a.name {where}"""
    seq, reach, carried_out = "row_number() OVER w", "end_ns", ""
    if sliced:
        ops = f"""SELECT {_STREAM_OPS_COLUMNS}, end_ns AS reach_ns, NULL::BIGINT AS seq_before, false AS carried
                  FROM ({ops})
                  UNION ALL
                  SELECT {_STREAM_OPS_COLUMNS}, greatest(prev_max_end_ns, end_ns), seq - 1, true FROM {STREAM_OPS_CARRY}"""
        seq, reach, carried_out = ("row_number() OVER w + coalesce(first_value(seq_before) OVER w, 0)", "reach_ns",
                                   "QUALIFY NOT carried")
    return f"""
        SELECT {run}{_STREAM_OPS_COLUMNS}, {seq} AS seq,
               max({reach}) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_max_end_ns,
               lag(kind) OVER w AS prev_kind, lag(item_id) OVER w AS prev_id, lag(start_ns) OVER w AS prev_start_ns,
               lag(end_ns) OVER w AS prev_end_ns, lag(name_key) OVER w AS prev_name_key
        FROM ({ops})
        -- kind last: kernel, copy and memset ids may coincide, and the order must be total
        WINDOW w AS (PARTITION BY {run}device_id, stream_id ORDER BY start_ns, end_ns, item_id, kind)
        {carried_out}
        """


DEFINES = (
    View(
        "graph_replays",
        "Per run, each CUDA/HIP graph replay: a graph launch call (`cudaGraphLaunch`, `hipGraphLaunch`) and the "
        "kernels, copies and memsets it ran (those whose `launch_call_id` is the call), with `graph`, the graph it "
        "replayed: CUPTI's `graph_id` where the trace has it (`g<id>`), else a digest of the operations' kinds and "
        "names in order (`s<hex>`: replays of one graph run the same operations), and, where a capture was merged "
        "or an nsys export placed its nodes (`graph_nodes`), how many of its operations were placed; `whole_graph` "
        "when the replay is one opaque row "
        "(nsys `--cuda-graph-trace=graph`). The launch call's time (`call_ns`) is the "
        "host's cost of the replay, once for all its operations.",
        """
        SELECT c.run_id, c.call_id, any_value(c.name) AS call_name, any_value(c.pid) AS pid, any_value(c.tid) AS tid,
               any_value(c.start_ns) AS call_start_ns, any_value(c.end_ns) AS call_end_ns,
               any_value(c.end_ns - c.start_ns) AS call_ns,
               coalesce('g' || max(k.graph_id)::VARCHAR,
                        's' || substr(md5(string_agg(a.kind || ':' || coalesce(a.name, ''), chr(31)
                                                     ORDER BY a.start_ns, a.kind, a.item_id)), 1, 12)) AS graph,
               any_value(a.device_id) AS device_id, count(*) AS ops,
               count(*) FILTER (WHERE a.kind = 'kernel') AS kernels,
               count(*) FILTER (WHERE a.kind = 'copy') AS copies, count(*) FILTER (WHERE a.kind = 'memset') AS memsets,
               min(a.start_ns) AS start_ns, max(a.end_ns) AS end_ns,
               coalesce(sum(a.end_ns - a.start_ns) FILTER (WHERE a.kind = 'kernel'), 0) AS kernel_ns,
               sum(a.end_ns - a.start_ns) AS gpu_ns,
               count(g.item_id) FILTER (WHERE g.placed) AS placed, count(g.item_id) AS merged,
               -- nsys --cuda-graph-trace=graph: one opaque row for the whole replay (ingest/nsys.py)
               bool_or(k.graph_id IS NOT NULL AND k.short_name = '[CUDA graph]') AS whole_graph
        FROM api_calls c
        JOIN gpu_activity a ON a.run_id = c.run_id AND a.launch_call_id = c.call_id
        LEFT JOIN kernels k ON a.kind = 'kernel' AND k.run_id = a.run_id AND k.kernel_id = a.item_id
        LEFT JOIN graph_nodes g ON g.run_id = a.run_id AND g.kind = a.kind AND g.item_id = a.item_id
        WHERE c.name ILIKE '%graphlaunch%'
        GROUP BY c.run_id, c.call_id
        """,
        reads=("gpu_activity",),
        on_demand=True,
    ),
    View(
        "kernel_launches",
        "Every kernel with the host call that launched it (`api_calls` by `launch_call_id`): the "
        "kernel's device, `name_key` and grid and block, the call's id, pid, tid, start and end.",
        kernel_launches_sql(),
        reads=("kernel_names",),
    ),
    View(
        "stream_ops",
        "Every timed GPU operation a stream was given (unified-memory page migrations left out), in "
        "stream order (per run, device and stream, by start, end, id), with its position `seq`, a kernel's `name_key`, `external_id` and `threads`, the latest end of "
        "the stream's earlier operations (`prev_max_end_ns`) and the previous operation's kind, id, "
        "start, end and name key.",
        stream_ops_sql(),
        reads=("gpu_activity", "kernel_names"),
    ),
)
