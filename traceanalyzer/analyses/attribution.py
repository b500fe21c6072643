"""Attribution to host frames: the frames a launch can sit in, with their nesting
(`host_frames`, `frame_steps`), and each GPU operation with its launch call and the innermost
frame of each source open at it (`launch_context`)."""

from __future__ import annotations

from ..sql import sql_literal
from .core import Macro, TableMacro, View, qualified


# Where host frames come from (host_frames' `source`): NVTX and user-annotation ranges, PyTorch
# operators, the `nn.Module` frames of the Python stack, and every Python frame.
FRAME_SOURCES = ("range", "op", "module", "python")
# The order of a thread's frame boundaries (`phase` 0: the end of a frame that began earlier,
# 1: a start, 2: the end of a zero-length frame): at one time, frames end before others start;
# frames starting together open outer (longer) first; frames ending together close inner first.
_BOUNDARY_ORDER = ("t, phase, CASE WHEN phase = 1 THEN -end_ns ELSE -start_ns END, "
                   "CASE WHEN phase = 1 THEN frame_id ELSE -frame_id END")
_FRAME_THREAD = "run_id, source, pid, tid"

# What is rewritten in a range or operator name before names are compared, in order, as
# (pattern, replacement): patterns RE2 (DuckDB) and Python's `re` read alike. The ids PyTorch's
# `emit_nvtx` adds to every range (`aten::to, op_id = 998949`, `seq = 12`, the input ops'
# ids), addresses (`object at 0x7f3a...`), step numbers (`ProfilerStep#12`) and numbers that stand
# alone as a word (`Residual 0`, `Step 0 to 10`: twice, since one pass skips the second of two
# adjacent numbers); numbers inside a word stay (`layer.12.attn`, `Linear_0`). NVIDIA's pyprof
# (DLProf) names each range with a Python dict printed as text: its call's module and op
# (`{'mod': 'Tensor', 'op': 'cuda', 'args': [...]}` -> `Tensor.cuda`), or the stack it was
# pushed from (`{'traceMarker': [...], 'funcStack': '/<module>/...::forward/flatten'}` -> `flatten`).
NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"^\{'mod': '([^']*)', 'op': '([^']*)'.*\}$", r"\1.\2"),
    (r"^\{'traceMarker': .*'funcStack': '[^']*/([^'/]+)'\}$", r"\1"),
    (r",?\s*\b(?:op_id|seq|input_op_ids|stashed seq)\s*=\s*(?:\[[^\]]*\]|-?\d+)", ""),
    (r"0[xX][0-9a-fA-F]+", "0x?"),
    (r"#\d+\b", "#N"),
    (r"(^|\s)\d+(\s|$)", r"\1N\2"),
    (r"(^|\s)\d+(\s|$)", r"\1N\2"),
)


def _normalized(expr: str) -> str:
    out = f"coalesce({expr}, '')"
    for pattern, replacement in NAME_PATTERNS:
        out = f"regexp_replace({out}, {sql_literal(pattern)}, {sql_literal(replacement)}, 'g')"
    return f"trim({out})"


def frame_rows_sql(runs: str | None, sources: tuple[str, ...]) -> str:
    """The host frames of `sources` (of the runs `runs` selects), one row each: run_id, source,
    frame_id, name, pid, tid, start_ns, end_ns."""
    of_run = runs or "true"
    timed = "pid IS NOT NULL AND tid IS NOT NULL AND start_ns IS NOT NULL AND end_ns >= start_ns"
    branches = []
    if "range" in sources:  # a range never closed lasts to the end of the run (as nsys's projection reads it)
        branches.append(f"""
            SELECT * FROM (
                SELECT r.run_id, 'range' AS source, r.range_id AS frame_id, r.name, r.pid, r.tid, r.start_ns,
                       coalesce(r.end_ns, greatest(u.end_ns, r.start_ns)) AS end_ns
                FROM ranges r LEFT JOIN runs u ON u.run_id = r.run_id
                WHERE r.kind IN ('nvtx', 'user_annotation'))
            WHERE {of_run} AND {timed}""")
    if "op" in sources:
        branches.append(f"SELECT run_id, 'op' AS source, op_id AS frame_id, name, pid, tid, start_ns, end_ns FROM cpu_ops "
                        f"WHERE {of_run} AND {timed}")
    python = [x for x in ("module", "python") if x in sources]
    if python:  # an `nn.Module` frame is a frame of both
        kinds = f"CASE WHEN starts_with(name, 'nn.Module: ') THEN {python} ELSE {[x for x in python if x == 'python']} END"
        branches.append(f"SELECT * FROM (SELECT run_id, unnest({kinds}) AS source, function_id AS frame_id, name, pid, tid, "
                        "start_ns, end_ns "
                        f"FROM python_functions WHERE {of_run} AND {timed})")
    return " UNION ALL ".join(branches)


def host_frames_sql(runs: str | None = None, sources: tuple[str, ...] = FRAME_SOURCES) -> str:
    """The host_frames view's query; with `runs` (a condition on `run_id`), those runs' only.

    One sweep per thread and source over the frames' starts and ends in _BOUNDARY_ORDER: a
    frame's depth is the number of frames open when it starts (it excluded), and its parent the
    frame of one level less that started last before it (an ASOF join on the boundary's
    position). Exact when a thread's frames nest, as push/pop ranges and Kineto's events do; a
    start/end range that overlaps another only in part takes the depth of those open at its start.
    With `sources`, the frames of those sources only."""
    return f"""
        WITH frames AS (
            {frame_rows_sql(runs, sources)}
        ), boundaries AS (
            SELECT *, start_ns AS t, 1 AS phase FROM frames
            UNION ALL
            SELECT *, end_ns, CASE WHEN end_ns > start_ns THEN 0 ELSE 2 END FROM frames
        ), swept AS (
            SELECT {_FRAME_THREAD}, frame_id, name, start_ns, end_ns, phase, row_number() OVER w AS seq,
                   sum(CASE phase WHEN 1 THEN 1 ELSE -1 END) OVER (w ROWS UNBOUNDED PRECEDING) AS open
            FROM boundaries
            WINDOW w AS (PARTITION BY {_FRAME_THREAD} ORDER BY {_BOUNDARY_ORDER})
        ), opened AS MATERIALIZED (  -- (read twice: computed once)
            SELECT {_FRAME_THREAD}, frame_id, name, start_ns, end_ns, seq, open - 1 AS depth FROM swept WHERE phase = 1
        )
        SELECT f.run_id, f.source, f.frame_id, f.name, f.pid, f.tid, f.start_ns, f.end_ns, f.depth,
               p.frame_id AS parent_id
        FROM opened f ASOF LEFT JOIN opened p
          ON p.run_id = f.run_id AND p.source = f.source AND p.pid = f.pid AND p.tid = f.tid
         AND p.depth = f.depth - 1 AND p.seq < f.seq
        """


def frame_steps_sql(frames: str) -> str:
    """The frame_steps view's query over `frames` (a relation with host_frames' columns): per
    thread and source, at each time a frame starts or ends, the innermost frame open from then on:
    after a start the frame itself, after an end its parent; of several boundaries at one time,
    the last in _BOUNDARY_ORDER."""
    return f"""
        WITH frames AS MATERIALIZED (  -- (read twice: computed once)
            SELECT {_FRAME_THREAD}, frame_id, start_ns, end_ns, parent_id FROM {frames}
        ), boundaries AS (
            SELECT {_FRAME_THREAD}, frame_id, start_ns, end_ns, start_ns AS t, 1 AS phase, frame_id AS inside
            FROM frames
            UNION ALL
            SELECT {_FRAME_THREAD}, frame_id, start_ns, end_ns, end_ns, CASE WHEN end_ns > start_ns THEN 0 ELSE 2 END,
                   parent_id
            FROM frames
        )
        SELECT {_FRAME_THREAD}, t AS from_ns,
               arg_max(inside, ({_BOUNDARY_ORDER.replace('t, ', '', 1)})) AS frame_id
        FROM boundaries GROUP BY {_FRAME_THREAD}, t
        """


# Per source of host_frames: launch_context's column prefix, and the table and id of its names.
_CONTEXT_COLUMNS = {"range": ("range", "ranges", "range_id"), "op": ("op", "cpu_ops", "op_id"),
                    "module": ("module", "python_functions", "function_id"),
                    "python": ("function", "python_functions", "function_id")}


def launch_context_column(source: str) -> str:
    """The launch_context column holding the innermost frame of `source` (`op` -> `op_id`)."""
    return f"{_CONTEXT_COLUMNS[source][0]}_id"


def launch_probes_sql(runs: str | None = None) -> str:
    """Each GPU operation's launch point (of the runs `runs` selects): run_id, kind, item_id, the
    launching thread's pid and tid, its launch call's start and end and `at_ns`, the time it is
    placed at: for an operation of a graph replay merged with its capture (`graph_nodes`, placed),
    where the capture launched its node, on the copied frames' thread; else the call's start,
    else (a Kineto kernel with no call but an External id) the start of the operator of that id,
    on that operator's thread."""
    of_run = runs or "true"
    return f"""
        WITH ops AS (
            SELECT a.run_id, a.kind, a.item_id, a.launch_call_id, a.external_id
            FROM gpu_activity a WHERE {qualified(of_run, 'a')}
        ), op_of_external AS (  -- the operator a Kineto External id names (the first, should two share it)
            SELECT c.run_id, c.external_id, arg_min({{'pid': c.pid, 'tid': c.tid, 'start_ns': c.start_ns}}, c.op_id) AS op
            FROM cpu_ops c SEMI JOIN ops o ON o.launch_call_id IS NULL AND o.run_id = c.run_id
                                          AND o.external_id = c.external_id
            WHERE {qualified(of_run, 'c')} GROUP BY ALL
        )
        SELECT o.run_id, o.kind, o.item_id, coalesce(g.pid, c.pid, x.op.pid) AS pid,
               coalesce(g.tid, c.tid, x.op.tid) AS tid, c.start_ns AS call_start_ns, c.end_ns AS call_end_ns,
               coalesce(g.at_ns, c.start_ns, x.op.start_ns) AS at_ns
        FROM ops o
        LEFT JOIN (SELECT * FROM api_calls WHERE {of_run}) c ON c.run_id = o.run_id AND c.call_id = o.launch_call_id
        LEFT JOIN op_of_external x ON o.launch_call_id IS NULL AND x.run_id = o.run_id AND x.external_id = o.external_id
        LEFT JOIN (SELECT run_id, kind, item_id, pid, tid, at_ns FROM graph_nodes WHERE placed AND {of_run}) g
          ON g.run_id = o.run_id AND g.kind = o.kind AND g.item_id = o.item_id
        """


def launch_context_sql(runs: str | None = None, sources: tuple[str, ...] = FRAME_SOURCES,
                       names: bool = True) -> str:
    """The launch_context view's query; with `runs` (a condition on `run_id`), those runs' only.

    Each GPU operation is placed at its launch call's start on the call's thread (a kernel with
    no call found but a Kineto External id: at the start of the operator with that id). Then one
    sweep per thread and source over the frames' starts and ends and these launch points
    together, in _BOUNDARY_ORDER with a launch after the boundaries at its time: the innermost
    frame open at a launch is the last frame to start at the launch's depth (the count of frames
    open) before it. With frames that nest, a frame that started later at that depth closed
    before the launch (it could not start while the innermost one was open). Where frames
    overlap only in part, the frame found may have closed already: then none is named.
    Zero-length frames contain no launch and are left out of the sweep.
    The sweep carries numbers only (a thread-and-source number, a launch's number, a frame's
    id): the operations' columns, kernel names of hundreds of characters among them, join on
    at the end, so the sort holds a few integers a row.
    With `sources`, those sources' columns only; without `names`, the frames' ids only."""
    of_run = runs or "true"
    columns, joins = [], []
    for source in sources:
        column, table, key = _CONTEXT_COLUMNS[source]
        columns.append(f"x.{column}_id")
        if names:
            joins.append(f"""
            LEFT JOIN (SELECT run_id, {key}, name FROM {table} WHERE {of_run}) n_{column}
              ON n_{column}.run_id = o.run_id AND n_{column}.{key} = x.{column}_id""")
            columns.append(f"n_{column}.name AS {column}_name")
    pivot = ", ".join(f"any_value(pl.frame_id) FILTER (WHERE h.source = '{source}') AS {_CONTEXT_COLUMNS[source][0]}_id"
                      for source in sources)
    return f"""
        WITH ops AS (
            SELECT a.run_id, a.kind, a.item_id, a.device_id, a.stream_id, a.start_ns, a.end_ns, a.name,
                   a.launch_call_id, a.external_id
            FROM gpu_activity a WHERE {qualified(of_run, 'a')}
        ), probes AS MATERIALIZED (  -- each operation's launch point, numbered (read twice: computed once)
            SELECT *, row_number() OVER () AS probe FROM ({launch_probes_sql(runs)})
        ), frames AS (
            SELECT run_id, source, frame_id, pid, tid, start_ns, end_ns
            FROM ({frame_rows_sql(runs, sources)}) WHERE end_ns > start_ns
        ), threads AS MATERIALIZED (  -- each thread and source with frames, numbered once for all three readers
            SELECT {_FRAME_THREAD}, row_number() OVER () AS thread FROM (SELECT DISTINCT {_FRAME_THREAD} FROM frames)
        ), numbered AS MATERIALIZED (  -- (read twice: computed once)
            SELECT h.thread, f.frame_id, f.start_ns, f.end_ns FROM frames f JOIN threads h USING ({_FRAME_THREAD})
        ), points AS (  -- a boundary (phase 0: an end, 1: a start) or a launch (2), per thread and source
            SELECT thread, start_ns AS t, 1 AS phase, -end_ns AS tie, frame_id AS ord, frame_id AS ref, end_ns
            FROM numbered
            UNION ALL
            SELECT thread, end_ns, 0, -start_ns, -frame_id, NULL, NULL FROM numbered
            UNION ALL
            SELECT h.thread, p.at_ns, 2, 0, 0, p.probe, NULL
            FROM probes p JOIN threads h ON h.run_id = p.run_id AND h.pid = p.pid AND h.tid = p.tid
            WHERE p.at_ns IS NOT NULL
        ), swept AS (
            SELECT *, row_number() OVER w AS seq,
                   sum(CASE phase WHEN 1 THEN 1 WHEN 0 THEN -1 ELSE 0 END) OVER (w ROWS UNBOUNDED PRECEDING) AS open
            FROM points WINDOW w AS (PARTITION BY thread ORDER BY t, phase, tie, ord)
        ), starts AS (
            SELECT thread, open, seq, ref AS frame_id, end_ns FROM swept WHERE phase = 1
        ), placed AS (
            SELECT l.thread, l.ref AS probe, CASE WHEN s.end_ns > l.t THEN s.frame_id END AS frame_id
            FROM (SELECT * FROM swept WHERE phase = 2 AND open > 0) l
            ASOF JOIN starts s ON s.thread = l.thread AND s.open = l.open AND s.seq < l.seq
        ), innermost AS (
            SELECT pl.probe, {pivot} FROM placed pl JOIN threads h USING (thread) GROUP BY ALL
        )
        SELECT o.run_id, o.kind, o.item_id, o.device_id, o.stream_id, o.start_ns, o.end_ns, o.name, o.launch_call_id,
               p.pid, p.tid, p.call_start_ns, p.call_end_ns, {', '.join(columns)}
        FROM ops o
        JOIN probes p ON p.run_id = o.run_id AND p.kind = o.kind AND p.item_id = o.item_id
        LEFT JOIN innermost x ON x.probe = p.probe{''.join(joins)}
        """


DEFINES = (
    # A frame's name with its per-instance parts rewritten (NAME_PATTERNS), as names are compared
    # and shown: `ranges.normalize_name` in SQL.
    Macro("normalized_name", f"(name) AS {_normalized('name')}"),
    View(
        "host_frames",
        "Every host frame a GPU operation's launch can sit in, per run and thread, by `source`: `range` (NVTX "
        "push/pop and start/end ranges, Kineto `user_annotation`; marks and GPU-side annotations left out; a range "
        "never closed lasts to the run's end), `op` (PyTorch operators, `cpu_ops`), `module` (the `nn.Module: ...` "
        "frames of the Python stack) and `python` (every Python frame, `python_functions`). `frame_id` is the "
        "row id in its table (`range_id`, `op_id`, `function_id`); `depth` counts the frames of the same source "
        "open on the thread when it starts (0: outermost) and `parent_id` is the innermost of them. Frames are "
        "taken to nest on a thread, as push/pop ranges and Kineto's events do. A start/end range is on the thread "
        "that started it (nsys's projection leaves out those ended on another thread; the store does not record "
        "the thread that ended one).",
        host_frames_sql(),
        reads=(),
        on_demand=True,
    ),
    View(
        "frame_steps",
        "Per run, thread (`pid`, `tid`) and `source` of `host_frames`: from each `from_ns` on (until the next "
        "row's), the innermost frame open (`frame_id`, NULL: none). An ASOF join on `from_ns <= t` gives the "
        "frames around any host time `t`, e.g. an allocator event's.",
        frame_steps_sql("host_frames"),
        reads=("host_frames",),
        on_demand=True,
    ),
    View(
        "launch_context",
        "Every GPU operation of `gpu_activity` (kernels, copies, memsets) with the host call that launched it "
        "(`launch_call_id`, its thread `pid`/`tid`, `call_start_ns`, `call_end_ns`) and, of each source of "
        "`host_frames`, the innermost frame open on that thread when the call began: `range_id`/`range_name`, "
        "`op_id`/`op_name`, `module_id`/`module_name`, `function_id`/`function_name` (their enclosing frames "
        "through `host_frames.parent_id`). A frame open at the call's start contains the call, as nsys's "
        "`nvtx_gpu_proj_*` reports define it (they read runtime-API launches only; a kernel launched by a driver "
        "call, `cuLaunchKernel` as Triton does, is placed here too). A kernel without a launch call but with a "
        "Kineto `External id` is placed at the start of the operator of that id (HTA's link), on its thread.",
        launch_context_sql(),
        reads=("gpu_activity",),
        on_demand=True,
    ),
    TableMacro(
        "run_host_frames",
        "`host_frames` of one run, computed from its rows only: `run_host_frames('<run id>')`.",
        f"(rid) AS TABLE {host_frames_sql('run_id = rid')}",
        reads=(),
    ),
    TableMacro(
        "run_frame_steps",
        "`frame_steps` of one run: `run_frame_steps('<run id>')`.",
        f"(rid) AS TABLE {frame_steps_sql('run_host_frames(rid)')}",
        reads=("run_host_frames",),
    ),
    TableMacro(
        "run_launch_context",
        "`launch_context` of one run: `run_launch_context('<run id>')`.",
        f"(rid) AS TABLE {launch_context_sql('run_id = rid')}",
        reads=("gpu_activity",),
    ),
)
