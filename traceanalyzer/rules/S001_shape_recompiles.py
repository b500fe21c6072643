"""S001 recompiles on shape changes: first calls per input shape far slower than later ones."""

from typing import Annotated

from .base import Rule, Threshold, pair_key
from .evidence import Evidence, TimeRange, doc

# Host-side calls that load or JIT-compile GPU code before a launch (CUDA driver/runtime, HIP).
LOAD_CALLS = ("cuModuleLoad", "cuLibraryLoad", "cuModuleGetFunction", "cuLibraryGetKernel", "cuLink",
              "cudaGetFuncBySymbol", "cudaLibraryLoad", "cudaLibraryGetKernel", "hipModuleLoad", "hipModuleGetFunction")
# Names starting with one of them: prefix tests read the string's inlined first bytes, far cheaper
# per call than a regex or a DISTINCT over millions of long names.
LOAD_TEST = " OR ".join(f"starts_with(name, '{p}')" for p in LOAD_CALLS)
# Annotated ranges (NVTX, Kineto user annotations) that are compilation or autotuning work.
# `compile[^d]`: compilation, not the execution of compiled code (`Call CompiledFxGraph`).
# Each pattern with a word every match of it contains: ILIKE tests on the words go first, as a
# case-insensitive regex over every NVTX range costs ~3x more (24 M ranges: 2.0 s against 0.6 s).
_COMPILE_PATTERNS = (("compile", r"compile[^d]|compile$"), ("nvrtc", "nvrtc"), ("autotun", "autotun"),
                     ("jit", r"\bjit\b"), ("dynamo_timed", "dynamo_timed"))
COMPILE_RANGES = "(?i)(" + "|".join(pattern for _, pattern in _COMPILE_PATTERNS) + ")"
COMPILE_WORDS = " OR ".join(f"name ILIKE '%{word}%'" for word, _ in _COMPILE_PATTERNS)

# "Instances" are the things that can be slow the first time a shape is seen:
#  - a framework operator call (cpu_ops), its shape being its `Input Dims`; a torch.compile
#    region `Torch-Compiled Region: F/C` counts as operator `... F` with the shape `compile id C`
#    (Dynamo gives every recompilation of frame F a new compile id);
#  - a kernel launch, its shape being its grid and block, its cost the launch call plus the
#    module loads / compile ranges on the same thread since that thread's previous launch.
# Per (operator or kernel, shape): the first call's cost against the median of the later
# calls. An operator or kernel with enough distinct shapes whose first calls are mostly slow
# is reported once; one whose slow first calls happen inside another reported one's (a
# kernel inside its operator, aten::addmm inside aten::linear) is folded into the outer one.
# Per (operator or kernel, shape): calls, the first call's fields, the median of the later calls.
# The never-NULL fields of the first call travel in one struct (one arg_min, not four);
# arg_min skips NULL values, so the nullable ones keep their own.
SHAPE_STATS = """count(*) AS calls,
           arg_min({'id': item_id, 'cost': cost_ns, 'start': start_ns, 'end': end_ns}, FIRST_KEY) AS first,
           arg_min(pid, FIRST_KEY) AS pid, arg_min(tid, FIRST_KEY) AS tid,
           arg_min(device_id, FIRST_KEY) AS device_id,
           list(cost_ns) AS costs""".replace("FIRST_KEY", pair_key("start_ns", "item_id"))
# The median of the later calls: of all costs less one equal to the first call's (the median
# depends on the values only, so the list need not be sorted by start, which cost most here).
SHAPE_COLUMNS = ("calls, first.id AS first_id, first.cost AS first_ns, first.start AS first_start, "
                 "first.end AS first_end, pid, tid, device_id, "
                 "list_aggregate(costs[:list_position(costs, first.cost) - 1] "
                 "|| costs[list_position(costs, first.cost) + 1:], 'median') AS later_ns")

SQL = rf"""
WITH launch AS (  -- kernels with their launch calls, joined once per run (analyses.launches.kernel_launches)
    SELECT kernel_id, device_id, name_key, grid_x, grid_y, grid_z, block_x, block_y, block_z,
           call_id, pid, tid, call_start_ns AS start_ns, call_end_ns AS end_ns
    FROM this_run.kernel_launches
    WHERE call_start_ns IS NOT NULL AND call_end_ns >= call_start_ns AND tid IS NOT NULL
), prep_all AS (  -- loads and compiles on a launching thread
    SELECT DISTINCT pid, tid, start_ns, end_ns FROM (
        SELECT pid, tid, start_ns, end_ns FROM api_calls
        WHERE run_id = $run_id AND ({LOAD_TEST}) AND end_ns >= start_ns
        UNION ALL
        SELECT pid, tid, start_ns, end_ns FROM ranges
        WHERE run_id = $run_id AND tid IS NOT NULL AND end_ns > start_ns
              AND ({COMPILE_WORDS}) AND regexp_matches(name, '{COMPILE_RANGES}'))
), prep AS (
    -- Counted once: not inside another load/compile (nested NVTX compile ranges), nor inside
    -- a launch call (a lazy load within cudaLaunchKernel is already in the call's time).
    SELECT p.* FROM prep_all p
    WHERE NOT EXISTS (SELECT 1 FROM prep_all q WHERE q.pid = p.pid AND q.tid = p.tid
                      AND q.start_ns <= p.start_ns AND q.end_ns >= p.end_ns
                      AND (q.start_ns < p.start_ns OR q.end_ns > p.end_ns))
      AND NOT EXISTS (SELECT 1 FROM launch l WHERE l.pid = p.pid AND l.tid = p.tid
                      AND l.start_ns < p.end_ns AND l.end_ns > p.start_ns)
), thread_events AS (
    SELECT pid, tid, start_ns, end_ns, call_id, start_ns AS sort_ns
    FROM (SELECT DISTINCT call_id, pid, tid, start_ns, end_ns FROM launch l
          -- a launch can only own a load/compile on its own thread: only those threads need ordering
          WHERE EXISTS (SELECT 1 FROM prep p WHERE p.pid IS NOT DISTINCT FROM l.pid AND p.tid = l.tid))
    UNION ALL  -- a load or compile is placed at its end: it must be over before the launch it serves
    SELECT p.pid, p.tid, p.start_ns, p.end_ns, NULL, p.end_ns FROM prep p
), prep_owner AS (  -- each load/compile belongs to the next launch call on its thread
    SELECT *, first_value(call_id IGNORE NULLS) OVER (
                  PARTITION BY pid, tid ORDER BY sort_ns, call_id NULLS FIRST
                  ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS owner
    FROM thread_events
), prep_per_call AS (
    SELECT owner AS call_id, sum(end_ns - start_ns) AS prep_ns, min(start_ns) AS prep_start
    FROM prep_owner WHERE call_id IS NULL AND owner IS NOT NULL GROUP BY owner
), instances AS (
    SELECT 'cpu_op' AS kind, op_id AS item_id, NULL::INTEGER AS device_id, pid, tid, start_ns, end_ns,
           end_ns - start_ns AS cost_ns,
           CASE WHEN is_region THEN regexp_extract(name, '^(.*)/\d+$', 1) ELSE name END AS group_key,
           CASE WHEN is_region THEN 'compile id ' || regexp_extract(name, '/(\d+)$', 1)
                ELSE regexp_replace(input_dims, '\s+', '', 'g') END AS shape
    FROM (SELECT *, regexp_matches(name, '^Torch-Compiled Region: .*/\d+$') AS is_region FROM cpu_ops
          WHERE run_id = $run_id AND end_ns >= start_ns)
    WHERE is_region OR input_dims IS NOT NULL
), launches AS (  -- a kernel's shape is its grid and block, kept as integers until grouped
    SELECT 'kernel' AS kind, l.kernel_id AS item_id, l.device_id, l.pid, l.tid,
           coalesce(least(p.prep_start, l.start_ns), l.start_ns) AS start_ns,
           l.end_ns, l.end_ns - l.start_ns + coalesce(p.prep_ns, 0) AS cost_ns, l.name_key,
           l.grid_x, coalesce(l.grid_y, 1) AS grid_y, coalesce(l.grid_z, 1) AS grid_z,
           l.block_x, coalesce(l.block_y, 1) AS block_y, coalesce(l.block_z, 1) AS block_z
    FROM launch l LEFT JOIN prep_per_call p USING (call_id)
    WHERE l.grid_x IS NOT NULL AND l.block_x IS NOT NULL
), kernel_shapes AS (  -- grouped by integers (name key, grid, block): cheaper than by text, printed below per shape
    SELECT kind, name_key, grid_x, grid_y, grid_z, block_x, block_y, block_z, {SHAPE_STATS}
    FROM launches GROUP BY kind, name_key, grid_x, grid_y, grid_z, block_x, block_y, block_z
), shapes AS (  -- per shape, the first call (by start) against the median of the later ones
    SELECT kind, group_key, shape, {SHAPE_COLUMNS}
    FROM (SELECT kind, group_key, shape, {SHAPE_STATS} FROM instances GROUP BY kind, group_key, shape)
    UNION ALL  -- the text is a one-to-one image of the integers, so the groups are the same
    SELECT kind, n.name AS group_key,
           printf('grid (%d,%d,%d) block (%d,%d,%d)', grid_x, grid_y, grid_z, block_x, block_y, block_z),
           {SHAPE_COLUMNS}
    FROM kernel_shapes s LEFT JOIN this_run.kernel_names n ON n.name_key = s.name_key
), judged AS (
    SELECT *, first_ns - later_ns AS excess_ns,
           calls > 1 AND first_ns >= $min_first_call_slowdown_ratio * later_ns
             AND first_ns - later_ns >= $min_first_call_excess_ns AS slow
    FROM shapes
), groups AS (
    SELECT kind, group_key, count(*) AS n_shapes, count(*) FILTER (WHERE calls > 1) AS n_repeated,
           count(*) FILTER (WHERE slow) AS n_slow, sum(calls) AS calls,
           coalesce(sum(excess_ns) FILTER (WHERE slow), 0) AS excess_ns
    FROM judged GROUP BY kind, group_key
    HAVING count(*) >= $min_distinct_shapes_count AND count(*) FILTER (WHERE slow) >= $min_slow_shapes_count
       AND count(*) FILTER (WHERE slow) >= $min_slow_shapes_share * count(*) FILTER (WHERE calls > 1)
), slow_first AS (  -- the slow first calls of the candidate groups
    SELECT j.* FROM judged j JOIN groups g USING (kind, group_key) WHERE j.slow
), nested AS (  -- a slow first call inside a longer slow first call of another candidate
    SELECT i.kind, i.group_key, i.shape, i.excess_ns, list(o.kind || ': ' || o.group_key ORDER BY o.first_end - o.first_start DESC, o.group_key)[1] AS outer_key
    FROM slow_first i JOIN slow_first o
      ON o.pid = i.pid AND o.tid = i.tid AND o.first_start <= i.first_start AND o.first_end >= i.first_end
     AND (o.kind, o.group_key) <> (i.kind, i.group_key)
     AND (o.first_end - o.first_start > i.first_end - i.first_start OR (o.kind = 'cpu_op' AND i.kind = 'kernel'))
    GROUP BY ALL
), folded AS (  -- groups whose slow first calls mostly sit inside another group's
    SELECT g.kind, g.group_key, arg_max(n.outer_key, (n.times, n.outer_key)) AS outer_key  -- most often; ties by name
    FROM groups g JOIN (SELECT *, count(*) OVER (PARTITION BY kind, group_key, outer_key) AS times FROM nested) n
      USING (kind, group_key)
    GROUP BY g.kind, g.group_key HAVING sum(n.excess_ns) >= 0.5 * any_value(g.excess_ns)
), reported AS (
    SELECT g.* FROM groups g ANTI JOIN folded f USING (kind, group_key)
), inner_names AS (
    SELECT outer_key, list(DISTINCT group_key ORDER BY group_key) AS inner FROM folded GROUP BY outer_key
), gaps AS (  -- the device idle stretches a slow first call overlaps (any device)
    SELECT DISTINCT g.device_id, g.start_ns, g.end_ns FROM this_run.device_idle_gaps g
    JOIN slow_first s ON g.start_ns < s.first_end AND g.end_ns > s.first_start
), gap_ends AS (
    SELECT device_id, end_ns AS busy_start FROM gaps
), issued AS (  -- when the work that ended each of them was issued (analyses.budget.issued_at)
    SELECT * FROM issued_at($run_id, 'gap_ends')
), waiting AS (  -- their part before that: the budget's host idle, the GPU waiting for the host
    SELECT g.device_id, g.start_ns, host_until(i.issued_ns, g.start_ns, g.end_ns) AS end_ns
    FROM gaps g JOIN issued i ON i.device_id = g.device_id AND i.busy_start = g.end_ns
    WHERE i.issued_ns > g.start_ns
), shape_idle AS (  -- per slow first call, the GPU time it kept waiting (on the device it kept most)
    SELECT kind, group_key, shape, max(ns) AS idle_ns FROM (
        SELECT s.kind, s.group_key, s.shape, w.device_id,
               sum(least(w.end_ns, s.first_end) - greatest(w.start_ns, s.first_start)) AS ns
        FROM slow_first s JOIN waiting w ON w.start_ns < s.first_end AND w.end_ns > s.first_start
        GROUP BY ALL)
    GROUP BY ALL
), claimed AS (  -- of each slow first call's excess, what the GPU waited for: the loss
    SELECT s.kind, s.group_key, sum(least(s.excess_ns, coalesce(i.idle_ns, 0))) AS loss_ns
    FROM slow_first s LEFT JOIN shape_idle i USING (kind, group_key, shape)
    GROUP BY ALL
), examples AS (
    SELECT s.kind, s.group_key,
           list(s.first_id ORDER BY s.excess_ns DESC, s.first_start, s.first_id)[1] AS worst_id,
           list(s.first_start ORDER BY s.excess_ns DESC, s.first_start, s.first_id)[1] AS worst_start,
           list(s.first_end ORDER BY s.excess_ns DESC, s.first_start, s.first_id)[1] AS worst_end,
           any_value(s.device_id) AS device_id,
           max(s.first_ns / nullif(s.later_ns, 0)) AS max_ratio,
           to_json(list({{'shape': s.shape, 'calls': s.calls, 'first_ns': s.first_ns, 'later_median_ns': s.later_ns,
                          'excess_ns': s.excess_ns, 'item_id': s.first_id, 'start_ns': s.first_start,
                          'end_ns': s.first_end}} ORDER BY s.excess_ns DESC, s.first_start, s.first_id)[1:$max_examples]) AS worst
    FROM slow_first s JOIN reported r USING (kind, group_key) GROUP BY s.kind, s.group_key
)
SELECT e.device_id, NULL::BIGINT AS stream_id, r.kind AS item_kind, e.worst_id AS item_id,
       r.group_key AS item_name, e.worst_start AS start_ns, e.worst_end AS end_ns,
       r.n_slow AS value, 'shapes' AS value_unit, $min_slow_shapes_count AS threshold,
       CAST(coalesce(c.loss_ns, 0) AS BIGINT) AS est_loss_ns,
       printf('%s: %d distinct %s, the first call of %d of them far slower than later calls (up to %.0fx); '
              || '%s spent on first calls; %s',
              CASE WHEN r.kind = 'kernel' THEN 'kernel ' || left(r.group_key, 80) ELSE r.group_key END,
              r.n_shapes, CASE WHEN r.group_key LIKE 'Torch-Compiled Region:%' THEN 'compiled variants'
                               WHEN r.kind = 'kernel' THEN 'launch configurations' ELSE 'input shapes' END,
              r.n_slow, coalesce(e.max_ratio, 0), fmt_ns(r.excess_ns),
              fmt_loss_bound(coalesce(c.loss_ns, 0), 'of it the GPU sat waiting for the host')) AS message,
       CASE WHEN r.group_key LIKE 'Torch-Compiled Region:%' THEN
              'Dynamo recompiles this frame for new shapes: mark the varying dimensions dynamic '
              || '(torch._dynamo.mark_dynamic(x, dim)) or use torch.compile(dynamic=True), and pad or bucket '
              || 'inputs to a few sizes (e.g. multiples of 64) so the compiled variants are reused.'
            WHEN r.kind = 'kernel' THEN
              'This kernel is loaded or JIT-compiled for each new launch configuration: bucket or pad the '
              || 'problem sizes so fewer variants are built, and warm up or cache the compiled modules ahead of time.'
            ELSE
              'Every new input shape pays a first-call cost (compilation, autotuning, library heuristics): '
              || 'pad or bucket shapes to a few sizes (e.g. multiples of 64 or powers of two), warm each bucket up '
              || 'before the timed region, and with torch.compile use dynamic=True or torch._dynamo.mark_dynamic.'
       END AS hint,
       '{{"distinct_shapes": ' || r.n_shapes || ', "repeated_shapes": ' || r.n_repeated
         || ', "slow_shapes": ' || r.n_slow || ', "calls": ' || r.calls
         || ', "first_call_excess_ns": ' || CAST(r.excess_ns AS BIGINT)
         || ', "gpu_waiting_ns": ' || CAST(coalesce(c.loss_ns, 0) AS BIGINT)
         || ', "inner": ' || to_json(coalesce(i.inner, []::VARCHAR[])) || ', "worst": ' || e.worst || '}}' AS evidence
FROM reported r JOIN examples e USING (kind, group_key)
LEFT JOIN claimed c USING (kind, group_key)
LEFT JOIN inner_names i ON i.outer_key = r.kind || ': ' || r.group_key
ORDER BY r.excess_ns DESC, r.group_key
"""

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class S001Example(TimeRange, kw_only=True, forbid_unknown_fields=True):
    shape: Annotated[str, doc("input shapes")]
    calls: Annotated[int, doc("calls counted")]
    first_ns: Annotated[int, doc("time of the shape's first call")]
    later_median_ns: Annotated[float, doc("median time of the shape's later calls")]
    excess_ns: Annotated[float, doc("time beyond the shortest possible")]
    item_id: Annotated[int, doc("id of the operation")]


class S001Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    distinct_shapes: Annotated[int, doc("distinct input shapes the operator ran with")]
    repeated_shapes: Annotated[int, doc("shapes that ran more than once")]
    slow_shapes: Annotated[int, doc("shapes whose first call was slow")]
    calls: Annotated[int, doc("calls counted")]
    first_call_excess_ns: Annotated[int, doc("extra time of each shape's first call over its later median")]
    gpu_waiting_ns: Annotated[int, doc("GPU idle time during the slow first calls")]
    inner: Annotated[list[str], doc("operators run inside the slow calls")]
    worst: Annotated[list[S001Example], doc("the shapes with the slowest first calls")]


RULE = Rule(
    id="S001",
    evidence=S001Evidence,
    name="shape-recompiles",
    title="Recompiles or re-tuning on shape changes",
    phase="structure",
    claims="idle:host",
    severity="warning",
    what="Operators, torch.compile regions and kernels that see many distinct input shapes (or "
         "launch configurations) where the first call for each new shape is far slower than "
         "later calls with the same shape: recompilation, autotuning, module loading or library "
         "heuristics paid again for every shape.",
    why="Compiled and tuned code is specialised to shapes. When shapes keep changing (variable "
        "sequence lengths, ragged batches, a last partial batch), every new shape triggers a "
        "Dynamo recompile, an Inductor/Triton autotune, a cuDNN benchmark run, a NVRTC compile or "
        "a module load, and the step that meets it stalls for milliseconds to seconds.",
    how="Framework operators (Kineto `cpu_ops`) are grouped by name and `Input Dims`; a "
        "`Torch-Compiled Region: F/C` counts as frame F with compile id C as its shape. Kernel "
        "launches are grouped by kernel name and grid/block, their cost being the launch call plus "
        "the module loads (`cuModuleLoad*`, `cuLibraryLoad*`, `cudaGetFuncBySymbol`, ...) and "
        "compile/autotune ranges on the same thread since its previous launch. For each shape seen "
        "more than once, the first call is slow when it takes at least `min_first_call_slowdown_ratio` "
        "times the median of the later calls and `min_first_call_excess_ns` more. An operator or "
        "kernel is reported when it has `min_distinct_shapes_count` shapes, at least "
        "`min_slow_shapes_count` slow ones, and slow ones make up `min_slow_shapes_share` of its "
        "repeated shapes. The first calls' extra host time (first call minus the later median, summed "
        "over slow shapes: `first_call_excess_ns`) costs the GPU only where it waited for it: the "
        "estimated loss is, per slow first call, the smaller of its extra time and the budget's host "
        "idle within it (device idle stretches up to the return of the launch of the work that ends "
        "them, `analyses.budget.issued_at`; on the device it kept waiting most), summed (`gpu_waiting_ns`). A group whose slow first calls mostly lie inside another reported group's "
        "(aten::addmm inside aten::linear, a launch inside its operator) is listed under that "
        "group's `inner` instead of reported twice. Shapes seen once cannot be judged and only count "
        "as distinct.",
    fix="Pad or bucket input shapes to a few sizes; mark varying dimensions dynamic "
        "(`torch.compile(dynamic=True)`, `torch._dynamo.mark_dynamic`); warm up every bucket before "
        "the measured loop; cache compiled kernels.",
    requires="framework operators with input shapes, torch.compile regions, or kernels with launch calls and grid sizes",
    applies_sql="SELECT EXISTS (SELECT 1 FROM cpu_ops WHERE run_id = $run_id AND (input_dims IS NOT NULL "
                "OR name LIKE 'Torch-Compiled Region:%')) OR EXISTS (SELECT 1 FROM kernels WHERE run_id = $run_id "
                "AND launch_call_id IS NOT NULL AND grid_x IS NOT NULL)",
    thresholds=(
        Threshold("min_distinct_shapes_count", 3, "An operator or kernel needs at least this many distinct shapes.", low=1),
        Threshold("min_slow_shapes_count", 2, "... and at least this many shapes whose first call was slow.", low=1),
        Threshold("min_slow_shapes_share", 0.5, "... and slow first calls in this share of its shapes seen more than once."),
        Threshold("min_first_call_slowdown_ratio", 5.0, "A first call is slow at this many times the median of later calls with its shape."),
        Threshold("min_first_call_excess_ns", 50000, "... and at least this much longer than that median (50 us)."),
        Threshold("max_examples", 5, "How many of the slowest first calls the evidence lists."),
    ),
    sql=SQL,
    references=(
        "PyTorch: torch.compiler troubleshooting, 'Recompilations' and dynamic shapes (mark_dynamic, dynamic=True)",
        "CUDA C++ Programming Guide: 'Lazy Loading' (CUDA_MODULE_LOADING), modules loaded at first launch",
    ),
)
