"""Warm-up and one-time costs: their windows (`warmup_windows`), the time budget inside
them, and where an idle stretch's steady part begins (the macro `steady_start`)."""

from __future__ import annotations

from .budget import SEGMENTS, SWEEP_MACROS, budget_sweep
from .core import Macro, TableMacro, View, qualified
from .steps import PROFILER_STEP


# Warm-up and one-time costs (`warmup_windows`). Ranges named warm-up (NVTX, user annotations,
# PyTorch operators, Python functions):
WARMUP_NAME = r"(?i)warm[-_ ]?up"
# Host frames and calls that compile at run time (nvFuser, NVRTC, Inductor, JIT).
JIT_NAME = r"(?i)(compileFusion|nvrtc|hiprtc|compile_fx_inner|compile_inner|call_user_compiler|jit_compile)"
# Host calls that are one-time costs when they are a process's first of their name or come
# before the device's first kernel: lazy module and library loading, runtime compilation (a
# load or compile again later is a recompile, rule S001's), and frees, which create the context
# (`cudaFree(0)`) or release what set-up allocated.
ONE_TIME_CALL = r"(?i)^(cuModuleLoad|cuLibraryLoad|cudaGetFuncBySymbol|hipModuleLoad|nvrtc|hiprtc)"
EARLY_FREE = r"^(cuda|hip)Free$"
WARMUP_MIN_CALL_NS = 100_000  # a one-time call shorter than this is no warm-up worth a line
# A kernel's first launch is a one-time cost (module loading, the first call into a library)
# when its launch call takes this long and this many times the median of the kernel's later
# launch calls (of the run's launch calls, for a kernel launched once).
FIRST_LAUNCH_MIN_NS = 1_000_000
FIRST_LAUNCH_FACTOR = 10
# A library's first call readies it with a chain of set-up calls: driver entry points, module
# and library loads, context work (cuBLAS: cuGetProcAddress, cuInit, cudaFree, then a load per
# kernel it needs), each within this of the one before, the host's own work between them (the
# shared library's own loading, tens of ms for cuBLAS, makes no call). A kernel's first launch
# this soon after such a chain ends its set-up.
SETUP_CALL = r"(?i)^(cuInit|cuGetProcAddress|cudaGetDriverEntryPoint|hipGetProcAddress)"
SETUP_CHAIN_NS = 50_000_000
# Leading steps longer than this many times the median of the steps after the first are warm-up
# (at most half of them, of runs with 3 steps or more): step_stats' rule.
WARMUP_STEP_FACTOR = 1.5
# What each reason of warmup_windows says, in the order reports list them.
WARMUP_REASONS = ("range named warm-up", "first step", "uploads before the first kernel", "JIT compilation",
                  "lazy module loading", "library set-up before a first launch", "first launch", "cudaFree", "hipFree")


def warmup_windows_sql(runs: str | None) -> str:
    """The warmup_windows view's query; with `runs` (a condition on `run_id`), those runs' only."""
    of_run = runs or "true"
    devices_of = """(EXISTS (SELECT 1 FROM device_pids p WHERE p.run_id = d.run_id AND p.pid = o.pid
                             AND p.device_id IS NOT DISTINCT FROM d.device_id)
                     OR NOT EXISTS (SELECT 1 FROM device_pids p WHERE p.run_id = d.run_id AND p.pid = o.pid))"""
    return f"""
        WITH devices AS (
            SELECT run_id, device_id, min(start_ns) AS first_ns, max(end_ns) AS last_ns,
                   min(start_ns) FILTER (WHERE kind = 'kernel') AS first_kernel_ns
            FROM gpu_activity WHERE {of_run} GROUP BY ALL
        ), device_pids AS (
            SELECT DISTINCT run_id, device_id, pid FROM gpu_activity WHERE {of_run} AND pid IS NOT NULL
        ), frames AS NOT MATERIALIZED (  -- (read once, by `named`: a 24 M-range run's frames held whole took 4 GB)
            SELECT run_id, name, pid, tid, start_ns, end_ns FROM ranges
            WHERE {of_run} AND kind IN ('nvtx', 'user_annotation') AND end_ns > start_ns
            UNION ALL
            SELECT run_id, name, pid, tid, start_ns, end_ns FROM cpu_ops WHERE {of_run} AND end_ns > start_ns
            UNION ALL
            SELECT run_id, name, pid, tid, start_ns, end_ns FROM python_functions WHERE {of_run} AND end_ns > start_ns
        ), frame_names AS (  -- names matched once each: the window keeps DuckDB from pushing the
            -- match below the DISTINCT, onto every frame (a filter on the run, its partition, goes through)
            SELECT run_id, name, CASE WHEN regexp_matches(name, '{WARMUP_NAME}') THEN 'range named warm-up'
                                      ELSE 'JIT compilation' END AS reason
            FROM (SELECT run_id, name, row_number() OVER (PARTITION BY run_id) AS barrier FROM (
                      SELECT DISTINCT run_id, name FROM ranges WHERE {of_run} AND kind IN ('nvtx', 'user_annotation')
                      UNION SELECT DISTINCT run_id, name FROM cpu_ops WHERE {of_run}
                      UNION SELECT DISTINCT run_id, name FROM python_functions WHERE {of_run}))
            WHERE regexp_matches(name, '{WARMUP_NAME}') OR regexp_matches(name, '{JIT_NAME}')
        ), named AS (
            SELECT row_number() OVER () AS fid, f.*, n.reason,
                   row_number() OVER (PARTITION BY f.run_id, f.pid, f.name ORDER BY f.start_ns, f.end_ns) AS nth
            FROM frames f JOIN frame_names n USING (run_id, name)
        ), launched AS (  -- per frame and device, the end of the GPU work launched inside it on its thread
            SELECT n.fid, a.device_id, max(a.end_ns) AS work_end_ns
            FROM named n
            JOIN api_calls c ON c.run_id = n.run_id AND c.pid IS NOT DISTINCT FROM n.pid AND c.tid IS NOT DISTINCT FROM n.tid
                            AND c.start_ns >= n.start_ns AND c.start_ns < n.end_ns
            JOIN gpu_activity a ON a.run_id = c.run_id AND a.launch_call_id = c.call_id
            GROUP BY ALL
        ), call_names AS (
            SELECT run_id, name,
                   CASE WHEN regexp_matches(name, '{EARLY_FREE}') THEN name
                        WHEN regexp_matches(name, '(?i)rtc') THEN 'JIT compilation' ELSE 'lazy module loading' END AS reason
            FROM (SELECT run_id, name, row_number() OVER (PARTITION BY run_id) AS barrier FROM (SELECT DISTINCT run_id, name FROM api_calls WHERE {of_run}))
            WHERE regexp_matches(name, '{EARLY_FREE}') OR regexp_matches(name, '{ONE_TIME_CALL}')
        ), one_time AS (
            SELECT c.run_id, c.pid, c.name, c.start_ns, c.end_ns, n.reason,
                   row_number() OVER (PARTITION BY c.run_id, c.pid, c.name ORDER BY c.start_ns, c.call_id) AS nth
            FROM api_calls c JOIN call_names n USING (run_id, name) WHERE c.end_ns >= c.start_ns
        ), launches AS (  -- kernel launch calls, one per call and kernel name (a graph launch replays
            -- what was launched before)
            SELECT DISTINCT l.run_id, l.device_id, l.pid, l.tid, l.name_key, l.call_id, l.call_start_ns, l.call_end_ns,
                   l.call_end_ns - l.call_start_ns AS ns
            FROM kernel_launches l
            WHERE {qualified(of_run, 'l')} AND l.call_end_ns >= l.call_start_ns
              AND NOT EXISTS (SELECT 1 FROM api_calls c WHERE c.run_id = l.run_id AND c.call_id = l.call_id
                                                          AND c.name ILIKE '%graph%')
        ), run_launch AS (
            SELECT run_id, median(ns) AS median_ns FROM launches GROUP BY ALL
        ), kernel_launch AS (  -- each kernel's first launch call per process, and its later ones' median
            SELECT run_id, device_id, pid, name_key,
                   arg_min(call_start_ns, (call_start_ns, call_id)) AS start_ns,
                   arg_min(call_end_ns, (call_start_ns, call_id)) AS end_ns,
                   arg_min(tid, (call_start_ns, call_id)) AS tid,
                   count(*) AS n
            FROM launches GROUP BY ALL
        ), first_launches AS (
            SELECT DISTINCT k.run_id, k.device_id, k.start_ns, k.end_ns,
                   CASE WHEN k.n > 1 THEN (SELECT median(l.ns) FROM launches l
                                           WHERE l.run_id = k.run_id AND l.device_id IS NOT DISTINCT FROM k.device_id
                                             AND l.pid IS NOT DISTINCT FROM k.pid AND l.name_key = k.name_key
                                             AND l.call_start_ns > k.start_ns)
                        ELSE r.median_ns END AS median_ns
            FROM kernel_launch k JOIN run_launch r USING (run_id)
            WHERE k.end_ns - k.start_ns >= {FIRST_LAUNCH_MIN_NS}
        ), setup_names AS (
            SELECT run_id, name FROM (SELECT run_id, name, row_number() OVER (PARTITION BY run_id) AS barrier
                                      FROM (SELECT DISTINCT run_id, name FROM api_calls WHERE {of_run}))
            WHERE regexp_matches(name, '{SETUP_CALL}') OR regexp_matches(name, '{ONE_TIME_CALL}')
               OR regexp_matches(name, '{EARLY_FREE}')
        ), setup AS (  -- set-up calls by known threads, chained while each starts within
            -- SETUP_CHAIN_NS of the latest end before it (`chain_ns`: the chain's first start;
            -- `loads`: whether it loads code or resolves entry points, not only frees memory)
            SELECT *, min(start_ns) OVER (PARTITION BY run_id, pid, tid, chain) AS chain_ns,
                   bool_or(NOT freed) OVER (PARTITION BY run_id, pid, tid, chain) AS loads
            FROM (SELECT *, sum(CASE WHEN start_ns - prev_reach <= {SETUP_CHAIN_NS} THEN 0 ELSE 1 END)
                                OVER (PARTITION BY run_id, pid, tid ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS chain
                  FROM (SELECT c.run_id, c.pid, c.tid, c.start_ns, c.end_ns, regexp_matches(c.name, '{EARLY_FREE}') AS freed,
                               max(c.end_ns) OVER (PARTITION BY c.run_id, c.pid, c.tid ORDER BY c.start_ns, c.end_ns
                                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_reach
                        FROM api_calls c SEMI JOIN setup_names n ON n.run_id = c.run_id AND n.name = c.name
                        WHERE {qualified(of_run, 'c')} AND c.end_ns >= c.start_ns AND c.pid IS NOT NULL
                          AND c.tid IS NOT NULL))
        ), thread_launches AS (  -- the kernel launch calls of the threads that made set-up calls
            SELECT l.run_id, l.pid, l.tid, l.call_start_ns, l.call_end_ns
            FROM launches l SEMI JOIN setup s ON s.run_id = l.run_id AND s.pid = l.pid AND s.tid = l.tid
        ), first_use AS (  -- a kernel's first launch in its process within SETUP_CHAIN_NS of a chain
            -- of set-up calls on its thread, no launch between: from the chain's start (or the
            -- thread's launch before it, if later) the host readied the code (a library's first
            -- call: its handles, lazy loading of its kernels), every load of it one-time
            SELECT f.run_id, f.device_id, greatest(f.chain_ns, coalesce(p.call_end_ns, f.chain_ns)) AS start_ns, f.end_ns
            FROM (SELECT k.run_id, k.device_id, k.pid, k.tid, k.start_ns AS call_start_ns, k.end_ns, s.chain_ns,
                         s.start_ns AS setup_start_ns
                  FROM kernel_launch k
                  ASOF JOIN setup s ON s.run_id = k.run_id AND s.pid = k.pid AND s.tid = k.tid AND s.end_ns <= k.start_ns
                  WHERE k.start_ns - s.end_ns <= {SETUP_CHAIN_NS} AND s.loads) f
            ASOF LEFT JOIN thread_launches p ON p.run_id = f.run_id AND p.pid = f.pid AND p.tid = f.tid
                                            AND p.call_start_ns < f.call_start_ns
            WHERE p.call_end_ns IS NULL OR p.call_end_ns <= f.setup_start_ns
        ), step_rows AS (
            SELECT run_id, start_ns, end_ns, end_ns - start_ns AS ns,
                   row_number() OVER w AS i, count(*) OVER (PARTITION BY run_id, pooled) AS n,
                   count(*) OVER (PARTITION BY run_id, pooled) = max(n_named) OVER (PARTITION BY run_id) AS top
            FROM (SELECT *, regexp_replace(name, '{PROFILER_STEP}', 'ProfilerStep#*') AS pooled,
                         count(*) OVER (PARTITION BY run_id, regexp_replace(name, '{PROFILER_STEP}', 'ProfilerStep#*'))
                           AS n_named
                  FROM steps WHERE {of_run})
            WINDOW w AS (PARTITION BY run_id, pooled ORDER BY start_ns, range_id)
        ), step_median AS (
            SELECT run_id, quantile_cont(ns, 0.5) AS later_ns FROM step_rows WHERE top AND i > 1 GROUP BY ALL
        ), warm_steps AS (  -- the leading steps far longer than the later ones' median
            SELECT * FROM (
                SELECT s.*, min(CASE WHEN s.ns <= {WARMUP_STEP_FACTOR} * m.later_ns THEN s.i END)
                              OVER (PARTITION BY s.run_id) AS first_steady
                FROM step_rows s JOIN step_median m USING (run_id) WHERE s.top AND s.n >= 3)
            WHERE i < coalesce(first_steady, n + 1) AND i <= n // 2
        ), windows AS (
            SELECT n.run_id, d.device_id, n.reason, n.name, n.start_ns, greatest(n.end_ns, coalesce(l.work_end_ns, n.end_ns)) AS end_ns
            FROM named n JOIN devices d USING (run_id)
            LEFT JOIN launched l ON l.fid = n.fid AND l.device_id IS NOT DISTINCT FROM d.device_id
            WHERE n.reason <> 'JIT compilation' OR n.nth = 1 OR n.start_ns < d.first_kernel_ns
            UNION ALL
            SELECT o.run_id, d.device_id, o.reason, o.name, o.start_ns, o.end_ns
            FROM one_time o JOIN devices d USING (run_id)
            WHERE o.end_ns - o.start_ns >= {WARMUP_MIN_CALL_NS}
              AND (o.nth = 1 OR o.start_ns < d.first_kernel_ns) AND {devices_of}
            UNION ALL
            SELECT run_id, device_id, 'first launch', NULL, start_ns, end_ns FROM first_launches
            WHERE end_ns - start_ns >= {FIRST_LAUNCH_FACTOR} * coalesce(median_ns, 0)
            UNION ALL
            SELECT run_id, device_id, 'library set-up before a first launch', NULL, start_ns, end_ns FROM first_use
            WHERE end_ns - start_ns >= {WARMUP_MIN_CALL_NS}
            UNION ALL
            SELECT d.run_id, d.device_id, 'uploads before the first kernel', NULL, d.first_ns,
                   least(d.first_kernel_ns, coalesce(f.first_step_ns, d.first_kernel_ns))
            FROM devices d LEFT JOIN (SELECT run_id, min(start_ns) AS first_step_ns FROM steps WHERE {of_run}
                                      GROUP BY ALL HAVING count(*) >= 2) f USING (run_id)
            WHERE d.first_kernel_ns > d.first_ns
              AND (d.first_ns < f.first_step_ns
                   OR EXISTS (SELECT 1 FROM named n WHERE n.run_id = d.run_id AND n.reason = 'range named warm-up'))
            UNION ALL
            SELECT s.run_id, d.device_id, 'first step', NULL, s.start_ns, s.end_ns
            FROM warm_steps s JOIN devices d USING (run_id)
        )
        SELECT w.run_id, w.device_id, w.reason, w.name,
               greatest(w.start_ns, d.first_ns) AS start_ns, least(w.end_ns, d.last_ns) AS end_ns
        FROM windows w JOIN devices d ON d.run_id = w.run_id AND d.device_id IS NOT DISTINCT FROM w.device_id
        WHERE least(w.end_ns, d.last_ns) > greatest(w.start_ns, d.first_ns)
        """


def warmup_budget_sql(runs: str, windows: str | None = None) -> str:
    """The time inside the warm-up windows (`warmup_windows`, merged per device) of the runs
    `runs` selects, by part of the time budget: run_id, device_id, category, cause, ns (parts
    with time only), as `step_budget_sql` clips the budget to steps. `windows` is a query giving
    those windows (run_id, device_id, start_ns, end_ns) where they are already computed."""
    # Only the operations around the windows are swept: from the last end at or before the
    # first window's start to the first start at or after the last window's end, per device.
    hull = f"""
        warm_windows AS MATERIALIZED (SELECT run_id, device_id, start_ns, end_ns FROM ({windows or warmup_windows_sql(runs)})),
        hull AS (SELECT w.run_id, w.device_id,
               coalesce((SELECT max(a.end_ns) FROM gpu_activity a WHERE a.run_id = w.run_id
                           AND a.device_id IS NOT DISTINCT FROM w.device_id AND a.end_ns <= w.lo), w.lo) AS lo,
               coalesce((SELECT min(a.start_ns) FROM gpu_activity a WHERE a.run_id = w.run_id
                           AND a.device_id IS NOT DISTINCT FROM w.device_id AND a.start_ns >= w.hi), w.hi) AS hi
        FROM (SELECT run_id, device_id, min(start_ns) AS lo, max(end_ns) AS hi FROM warm_windows GROUP BY ALL) w)"""
    return budget_sweep(runs, hull=hull) + SEGMENTS + """
        , windows AS (SELECT run_id, device_id, start_ns, end_ns FROM islands('warm_windows')
        ), clipped AS (
            SELECT g.run_id, g.device_id, g.category, g.cause,
                   least(g.end_ns, w.end_ns) - greatest(g.start_ns, w.start_ns) AS ns
            FROM segments g JOIN windows w
              ON w.run_id = g.run_id AND w.device_id IS NOT DISTINCT FROM g.device_id
             AND g.start_ns < w.end_ns AND g.end_ns > w.start_ns
        )
        SELECT run_id, device_id, category, cause, CAST(sum(ns) AS BIGINT) AS ns FROM clipped
        GROUP BY ALL HAVING sum(ns) > 0
        """


# Where the steady part of an idle stretch [t0, t1], which ends at an operation's start, begins:
# t0 moved later by the stretch's time inside warm-up windows, NULL when that is all of it. `w`
# and `w0` are the last merged warm-up windows (`run_warmup_merged`, with `busy_before_ns`: the
# window time before each) starting at or before t1 and t0 (ASOF joins; NULL: none), given by
# their start, end and busy_before_ns. A stretch is read from the operation that ends it, so its
# steady part is kept as one piece reaching that operation, as long as the time outside the
# windows: exact where a window covers its start or its end (warm-up before the steady state, or
# work launched in warm-up), and for a window inside it, its time is taken from the stretch's
# first part (the `sync`, then `host` causes).
_WARM_BEFORE = "(t, w_start, w_end, w_before) AS coalesce(w_before + least(greatest(t - w_start, 0), w_end - w_start), 0)"
_STEADY_START = ("(t0, t1, w_start, w_end, w_before, w0_start, w0_end, w0_before) AS "
                 "CASE WHEN t0 + warm_before(t1, w_start, w_end, w_before) - warm_before(t0, w0_start, w0_end, w0_before) "
                 "< t1 THEN t0 + warm_before(t1, w_start, w_end, w_before) - warm_before(t0, w0_start, w0_end, w0_before) END")


DEFINES = (
    View(
        "warmup_windows",
        "Per run and device, the windows of warm-up and one-time costs, each with its `reason` (and the "
        "call's or range's `name` where it has one), clipped to the device's span: `range named warm-up` "
        "(NVTX or user-annotation ranges, PyTorch operators or Python functions named `warm-up`, `warmup` "
        "or `warm_up`, extended on each device to the end of the GPU work launched inside them from their "
        "thread), `JIT compilation` (frames named like nvFuser's `compileFusion`, NVRTC, Inductor's "
        "`compile_fx_inner`, likewise extended, each a process's first of its name or one before the "
        "device's first kernel; and `nvrtc*`/`hiprtc*` calls), `lazy module loading` "
        "(`cuModuleLoad*`, `cuLibraryLoad*`, `cudaGetFuncBySymbol`, `hipModuleLoad*` calls), `cudaFree` or "
        "`hipFree`; each call a process's first of its name or one before the device's first kernel (a "
        "load again later is a recompile: rule S001), at least "
        f"{WARMUP_MIN_CALL_NS // 1000} us and on the devices of its process (every device where none has its "
        "process id); `first launch` (a kernel's first launch call per process that takes at least "
        f"{FIRST_LAUNCH_MIN_NS // 1_000_000} ms and {FIRST_LAUNCH_FACTOR}x the median of the kernel's later launch "
        "calls (of the run's launch calls, for a kernel launched once): "
        "module loading, a library's first call); `library set-up before a first launch` (a kernel's first launch "
        f"per process that comes at most {SETUP_CHAIN_NS // 1_000_000} ms after a chain of set-up calls on its thread, "
        f"each within {SETUP_CHAIN_NS // 1_000_000} ms of the one before (`cuGetProcAddress`, `cuInit`, `cudaGetDriverEntryPoint`, the loads above, "
        "`cudaFree`; at least one not a free), with no launch between: from the chain's start, or the "
        f"thread's launch before it if later, to the first launch's return, at least {WARMUP_MIN_CALL_NS // 1000} us: "
        "cuBLAS's first "
        "GEMM, every load of it one-time); `uploads before the first kernel` (a device's span up "
        "to its first kernel, when it begins with copies or memsets before the first of the run's steps (2 "
        "or more), or in a "
        "run with a range named warm-up: a run that repeats its work, whose uploads before it are set-up; "
        "in a program that runs once, its uploads are its work); `first step` (the "
        f"leading steps of the `steps` view longer than {WARMUP_STEP_FACTOR}x the median of the steps after "
        "the first, at most half of them, of runs with 3 steps or more, as `traceanalyzer summary` sets "
        "warm-up steps apart). Windows may overlap; `run_warmup_budget` merges them. The diagnosis "
        "weighs losses against the steady state (the span outside them), and the timeline rules that claim "
        "idle time leave their time out.",
        warmup_windows_sql(None),
        reads=("gpu_activity", "kernel_launches", "steps"),
        on_demand=True,
    ),
    TableMacro(
        "run_warmup_windows",
        "`warmup_windows` of one run, computed from its rows only: `run_warmup_windows('<run id>')`.",
        f"(rid) AS TABLE {warmup_windows_sql('run_id = rid')}",
        reads=("gpu_activity", "kernel_launches", "steps"),
    ),
    Macro("warm_before", _WARM_BEFORE),
    Macro("steady_start", _STEADY_START, reads=("warm_before",)),
    TableMacro(
        "run_warmup_merged",
        "One run's warm-up windows (a table of its `warmup_windows` rows, as `this_run.warmup_windows`) merged into "
        "disjoint ones per device (a `device_id` NULL as -1, so that ASOF joins match it), or with `across_devices` "
        "over all its devices (`device_id` -1): `run_id`, `device_id`, `island`, `start_ns`, `end_ns` and "
        "`busy_before_ns` (the window time before each), as `steady_start(t0, t1, ...)` reads them: "
        "`run_warmup_merged('this_run.warmup_windows', false)`.",
        """(windows, across_devices) AS TABLE
        WITH device_windows AS (SELECT run_id, CASE WHEN across_devices THEN -1 ELSE coalesce(device_id, -1) END AS device_id,
                                       start_ns, end_ns FROM query_table(windows))
        SELECT * EXCLUDE (next_start_ns, first_start_ns) FROM islands('device_windows')""",
        reads=("islands",),
    ),
    TableMacro(
        "steady_starts",
        "Where the steady part of each interval of a table begins: the rows of the table named (a CTE's "
        "name) with columns `w_key` (the device whose warm-up windows count, -1 for none or, with "
        "`across_devices`, for all), `t0` and `t1` (the interval), each with `steady_start_ns`, "
        "`steady_start(t0, t1, ...)` against the merged windows of the table `windows` "
        "(`run_warmup_merged`): `steady_starts('gaps', 'this_run.warmup_windows', false)`.",
        """(intervals, windows, across_devices) AS TABLE
        WITH warm AS MATERIALIZED (SELECT * FROM run_warmup_merged(windows, across_devices))
        SELECT r.*, steady_start(r.t0, r.t1, w.start_ns, w.end_ns, w.busy_before_ns,
                                 w0.start_ns, w0.end_ns, w0.busy_before_ns) AS steady_start_ns
        FROM query_table(intervals) r
        ASOF LEFT JOIN warm w ON w.device_id = r.w_key AND r.t1 >= w.start_ns
        ASOF LEFT JOIN warm w0 ON w0.device_id = r.w_key AND r.t0 >= w0.start_ns""",
        reads=("run_warmup_merged", "steady_start"),
    ),
    TableMacro(
        "run_warmup_budget",
        "One run's time inside its warm-up windows (`warmup_windows`, merged per device), by part of "
        "the time budget: `run_id`, `device_id`, `category`, `cause`, `ns` (parts with time only). "
        "The budget's parts less these are the steady state's.",
        f"(rid) AS TABLE {warmup_budget_sql('run_id = rid', 'SELECT rid AS run_id, * FROM run_warmup_windows(rid)')}",
        reads=("gpu_activity", "islands", "kernel_names", "run_warmup_windows", *SWEEP_MACROS),
    ),
)
