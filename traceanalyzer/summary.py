"""Per-run summary numbers: kernels, CUDA-graph executions, copies, memsets, GPU busy share,
device memory.

Kernel statistics are those of NVIDIA's `nsys stats --report cuda_gpu_kern_sum`: per kernel
name (the full, demangled name, or with `by="base"` the base name without template arguments,
nsys's `:base`), the count, total, average, median, min, max and sample standard deviation
(0 for a single launch, as nsys prints it) of the launches' times, and the share of the total
over all kernels. Rows come in nsys's order: total time down, then count, then name.

Whole-graph executions (nsys `--cuda-graph-trace=graph`: the store's `kernels` rows that
ingest names `[CUDA graph N]`, short name `[CUDA graph]`, with `graph_id` set) are no kernel:
nsys's kernel summary leaves them out, and so do the kernel rows and shares here; they have
rows of their own (`graph_stats`). Kernels traced one by one inside a graph are kernels.

The functions return plain rows (`run_summary`, a JSON-ready dict) or pandas DataFrames (for
the reports); presentation is the CLI's and the reports' job (`fmt.distinct_labels` shortens
kernel names for any of them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .store import Store, run_cache, views

if TYPE_CHECKING:  # the rules import the memory analyses: loading them stays without pandas
    import pandas as pd

# A whole-graph execution as ingest stores it (ingest/nsys.py); never a kernel's name.
GRAPH_EXECUTION = "(graph_id IS NOT NULL AND short_name = '[CUDA graph]')"

# What a kernel row is grouped by: nsys's default (demangled name) or its `:base` (short name).
GROUP_KEYS = {"name": "coalesce(name, short_name, '?')", "base": "coalesce(short_name, name, '?')"}

# Kernel time from `kernel_durations`: the timeline's, or for ncu (no timeline) the measured one.
STATS_SQL = """
WITH k AS (
    -- whole ns (ncu's measured durations can have fractions)
    SELECT {key} AS name, CAST(round(duration_ns) AS BIGINT) AS d
    FROM kernel_durations WHERE run_id = ? AND duration_ns IS NOT NULL AND {which}
), s AS (
    SELECT name, count(*) AS count, CAST(sum(d) AS BIGINT) AS total_ns, avg(d) AS avg_ns, median(d) AS median_ns,
           min(d) AS min_ns, max(d) AS max_ns, coalesce(stddev_samp(d), 0) AS stddev_ns
    FROM k GROUP BY name
)
SELECT *, total_ns / nullif(sum(total_ns) OVER (), 0) AS share
FROM s ORDER BY total_ns DESC, count, name
"""

COPIES_SQL = """
SELECT direction || CASE WHEN unified_memory THEN ' (unified memory)' ELSE '' END AS direction,
       coalesce(src_kind, '?') || ' -> ' || coalesce(dst_kind, '?') AS memory_kinds,
       count(*) AS count, CAST(sum(bytes) AS BIGINT) AS bytes, CAST(sum(end_ns - start_ns) AS BIGINT) AS total_ns,
       sum(bytes) / nullif(sum(end_ns - start_ns), 0) AS bandwidth_gb_per_s
FROM copies WHERE run_id = ?
GROUP BY ALL ORDER BY total_ns DESC NULLS LAST, direction, memory_kinds
"""

MEMSETS_SQL = """
SELECT coalesce(mem_kind, '?') AS memory_kind, count(*) AS count, CAST(sum(bytes) AS BIGINT) AS bytes,
       CAST(sum(end_ns - start_ns) AS BIGINT) AS total_ns,
       sum(bytes) / nullif(sum(end_ns - start_ns), 0) AS bandwidth_gb_per_s
FROM memsets WHERE run_id = ?
GROUP BY ALL ORDER BY total_ns DESC NULLS LAST, memory_kind
"""

# What the reports' totals say they count: distinct kernel names, full and base, and the devices
# that ran them (a total over several devices can exceed the run's span).
KERNEL_COUNTS_SQL = f"""
SELECT count(DISTINCT {GROUP_KEYS['name']}) AS names, count(DISTINCT {GROUP_KEYS['base']}) AS base_names,
       count(DISTINCT device_id) AS devices
FROM kernel_durations WHERE run_id = ? AND duration_ns IS NOT NULL AND NOT {GRAPH_EXECUTION}
"""

COPIES_BY_DEVICE_SQL = """
SELECT device_id, count(*) AS count, CAST(sum(bytes) AS BIGINT) AS bytes,
       CAST(sum(end_ns - start_ns) AS BIGINT) AS total_ns
FROM copies WHERE run_id = ? GROUP BY device_id ORDER BY device_id NULLS LAST
"""

BUSY_SQL = """
SELECT b.device_id, d.name AS device, CAST(b.busy_ns AS BIGINT) AS busy_ns, CAST(b.active_span_ns AS BIGINT) AS active_span_ns,
       b.busy_share,
       b.busy_ns / nullif(r.span_ns, 0) AS busy_share_of_run
FROM this_run.device_busy b JOIN runs r USING (run_id)
LEFT JOIN devices d ON d.run_id = b.run_id AND d.device_id = b.device_id
ORDER BY b.device_id
"""

# TorchInductor's kernels (the `compiled_kernels` view), per kernel name: its class and fused
# operators (from the name), what its launcher recorded, and the compiled graphs it ran in.
COMPILED_KERNELS_SQL = """
WITH c AS (
    SELECT *, CASE WHEN end_ns >= start_ns THEN end_ns - start_ns END AS ns FROM compiled_kernels WHERE run_id = $run_id
), all_kernels AS (
    SELECT sum(duration_ns) AS ns FROM kernel_durations WHERE run_id = $run_id AND NOT {graph}
)
SELECT c.name, any_value(c.kernel_class) AS kernel_class, any_value(c.fused_ops) AS fused_ops, count(*) AS count,
       CAST(sum(c.ns) AS BIGINT) AS total_ns, sum(c.ns) / nullif(any_value(a.ns), 0) AS share,
       list_sort(list_distinct(list(c.graph_hash))) AS graphs,
       list_sort(list_distinct(list(c.region_name))) AS regions,
       count(DISTINCT coalesce('graph ' || c.graph_range_id, 'region ' || c.region_op_id)) AS graph_calls,
       any_value(c.kernel_meta->>'kernel_file') AS kernel_file, any_value(c.kernel_meta->>'kernel_hash') AS kernel_hash,
       any_value(nullif(concat_ws(', ', c.kernel_meta->>'kernel_kwargs', 'num_warps=' || (c.kernel_meta->>'num_warps'),
                                  'num_stages=' || (c.kernel_meta->>'num_stages')), '')) AS config
FROM c, all_kernels a
GROUP BY c.name ORDER BY total_ns DESC NULLS LAST, count DESC, c.name
""".format(graph=GRAPH_EXECUTION)


def compiled_kernels(store: Store, run_id: str) -> dict | None:
    """The run's TorchInductor kernels, None without any: `kernels`, per kernel name (`name`,
    `kernel_class`, `fused_ops`, `count`, `total_ns`, `share` of all kernel time, the compiled
    `graphs` (CompiledFxGraph hashes) and `regions` it ran in, `graph_calls`, and from its launcher
    `kernel_file`, `kernel_hash`, `config`); `classes`, per class (`kernel_class`, `kernels`,
    `count`, `total_ns`, `share`); and over all of them `kernels_n`, `count`, `total_ns`,
    `share`, `graphs`, `regions`, `graph_calls`."""
    rows = store.arrow(COMPILED_KERNELS_SQL, {"run_id": run_id}).to_pylist()
    if not rows:
        return None
    classes: dict[str, dict] = {}
    for r in rows:
        c = classes.setdefault(r["kernel_class"], {"kernel_class": r["kernel_class"], "kernels": 0, "count": 0,
                                                    "total_ns": 0, "share": 0.0})
        c["kernels"] += 1
        c["count"] += r["count"]
        c["total_ns"] += r["total_ns"] or 0
        c["share"] += r["share"] or 0.0
    calls = store.sql("SELECT count(DISTINCT coalesce('graph ' || graph_range_id, 'region ' || region_op_id)) "
                      "FROM compiled_kernels WHERE run_id = $run_id", {"run_id": run_id}).fetchone()[0]
    return {"kernels": rows,
            "classes": sorted(classes.values(), key=lambda c: (-c["total_ns"], c["kernel_class"])),
            "kernels_n": len(rows), "count": sum(r["count"] for r in rows),
            "total_ns": sum(r["total_ns"] or 0 for r in rows), "share": sum(r["share"] or 0.0 for r in rows),
            "graphs": sorted({g for r in rows for g in r["graphs"] if g}),
            "regions": sorted({g for r in rows for g in r["regions"] if g}), "graph_calls": calls}


RUN_FIELDS = ("run_id", "file_name", "format", "producer", "producer_version", "host", "span_ns", "clock")

STORED_RUNS_SQL = """
SELECT r.run_id, r.format, r.file_name, r.producer_version, r.span_ns,
       (SELECT count(*) FROM kernels k WHERE k.run_id = r.run_id) AS kernels,
       (SELECT count(*) FROM copies c WHERE c.run_id = r.run_id) AS copies,
       (SELECT string_agg(DISTINCT name, ', ') FROM devices d WHERE d.run_id = r.run_id) AS gpus
FROM runs r ORDER BY r.ingested_at, r.run_id
"""


def stored_runs(store: Store) -> pd.DataFrame:
    """Every run of the store, as stored (`traceanalyzer runs`): id, format, file, version,
    span, kernel and copy counts, GPU names."""
    return store.df(STORED_RUNS_SQL)


def _stats_sql(by: str, graphs: bool) -> str:
    if by not in GROUP_KEYS:
        raise ValueError(f"kernels are grouped by one of {', '.join(GROUP_KEYS)}, not {by!r}")
    # A graph execution keeps its own name ([CUDA graph N]) unless grouped by base.
    return STATS_SQL.format(key=GROUP_KEYS[by], which=GRAPH_EXECUTION if graphs else f"NOT {GRAPH_EXECUTION}")


def kernel_stats(store: Store, run_id: str, by: str = "name") -> pd.DataFrame:
    """Per kernel (grouped `by` "name" or "base"): name, count, total_ns, avg_ns, median_ns,
    min_ns, max_ns, stddev_ns, share (of all kernels' total); graph executions left out."""
    return store.df(_stats_sql(by, graphs=False), [run_id])


def graph_stats(store: Store, run_id: str, by: str = "name") -> pd.DataFrame:
    """The same per CUDA graph (whole-graph executions); share is of all graph executions' total."""
    return store.df(_stats_sql(by, graphs=True), [run_id])


def top_kernels(store: Store, run_id: str, limit: int = 15) -> pd.DataFrame:
    """The reports' top kernels by base name: kernel, count, total_ns, mean_ns, median_ns,
    min_ns, max_ns, stddev_ns, share (graph executions left out)."""
    df = kernel_stats(store, run_id, by="base").head(limit)
    return df.rename(columns={"name": "kernel", "avg_ns": "mean_ns"})


def kernel_counts(store: Store, run_id: str) -> dict:
    """Over the timed kernels (graph executions left out): `names` and `base_names` (distinct),
    `devices` (how many ran them)."""
    return store.arrow(KERNEL_COUNTS_SQL, [run_id]).to_pylist()[0]


def copies_by_device(store: Store, run_id: str) -> list[dict]:
    """Per device: device_id, count, bytes, total_ns of its copies."""
    return store.arrow(COPIES_BY_DEVICE_SQL, [run_id]).to_pylist()


def copies(store: Store, run_id: str) -> pd.DataFrame:
    return store.df(COPIES_SQL, [run_id])


def memsets(store: Store, run_id: str) -> pd.DataFrame:
    return store.df(MEMSETS_SQL, [run_id])


def busy(store: Store, run_id: str) -> pd.DataFrame:
    with run_cache.scoped_to_run(store.con, run_id, build=False):  # a big run's kept cache, when it has one
        return store.df(BUSY_SQL)


# What a run with no kernels holds instead (timeline formats: an Nsight Compute report has no
# API calls or operators, and its kernels are not on a timeline): its copies and memsets, its
# API calls (those that launch GPU work or copy, the first start and last end, the calls that
# took most time) and its host operators. NULL for a run with kernels.
WITHOUT_KERNELS_SQL = """
WITH bare AS (  -- (first: a run with kernels, whose calls may number millions, is read no further;
    -- its kernels grouped, not hashed one by one as NOT EXISTS would)
    SELECT run_id FROM runs
    WHERE list_contains($runs, run_id) AND clock IS DISTINCT FROM 'none'
      AND run_id NOT IN (SELECT DISTINCT run_id FROM kernels WHERE list_contains($runs, run_id))
), calls AS (
    SELECT run_id, name, count(*) AS n, sum(end_ns - start_ns) AS ns, min(start_ns) AS first_ns, max(end_ns) AS last_ns,
           count(*) FILTER (WHERE name ILIKE '%launch%' OR name ILIKE '%memcpy%') AS launches
    FROM api_calls WHERE run_id IN (SELECT run_id FROM bare) AND start_ns IS NOT NULL AND end_ns >= start_ns
    GROUP BY ALL
), per_run AS (
    SELECT run_id, CAST(sum(n) AS BIGINT) AS calls, CAST(sum(launches) AS BIGINT) AS launches,
           max(last_ns) - min(first_ns) AS calls_span_ns,
           list({'name': name, 'n': n, 'ns': CAST(ns AS BIGINT)} ORDER BY ns DESC, name)[1:3] AS top_calls
    FROM calls GROUP BY run_id
)
SELECT r.run_id, coalesce(p.calls, 0) AS calls, coalesce(p.launches, 0) AS launches, p.calls_span_ns, p.top_calls,
       (SELECT count(*) FROM copies c WHERE c.run_id = r.run_id) AS copies,
       (SELECT count(*) FROM memsets m WHERE m.run_id = r.run_id) AS memsets,
       (SELECT count(*) FROM cpu_ops o WHERE o.run_id = r.run_id) AS operators
FROM bare r LEFT JOIN per_run p USING (run_id)
"""


def without_kernels(store: Store, run_ids: list[str]) -> dict[str, dict]:
    """Of these runs, those with a timeline and no kernel, each with what it holds instead
    (WITHOUT_KERNELS_SQL): calls, launches, calls_span_ns, top_calls ({name, n, ns}, most time
    first), copies, memsets, operators."""
    rows = store.arrow(WITHOUT_KERNELS_SQL, {"runs": list(run_ids)}).to_pylist()
    return {r.pop("run_id"): r for r in rows}


# Per graph replayed (the `graph_replays` view): replays, operations per replay, time. The launch
# call is the host's cost of a whole replay: counted once per replay, never per kernel.
GRAPH_REPLAYS_SQL = """
SELECT graph, any_value(call_name) AS call_name, any_value(device_id) AS device_id, count(*) AS replays,
       min(ops) AS min_ops, max(ops) AS max_ops, CAST(sum(kernels) AS BIGINT) AS kernels,
       CAST(sum(kernel_ns) AS BIGINT) AS kernel_ns, CAST(sum(gpu_ns) AS BIGINT) AS gpu_ns,
       CAST(round(avg(end_ns - start_ns)) AS BIGINT) AS avg_replay_ns,
       CAST(sum(call_ns) AS BIGINT) AS launch_ns, CAST(round(avg(call_ns)) AS BIGINT) AS avg_launch_ns,
       CAST(sum(placed) AS BIGINT) AS placed, CAST(sum(merged) AS BIGINT) AS merged, CAST(sum(ops) AS BIGINT) AS ops,
       min(call_start_ns) AS first_ns,
       bool_and(whole_graph) AS whole_graph
FROM graph_replays WHERE run_id = ? GROUP BY graph ORDER BY kernel_ns DESC, first_ns
"""


def graph_replays(store: Store, run_id: str) -> list[dict]:
    """Per graph the run replayed (`graph_replays` view): `graph` (its id or digest), `replays`,
    operations per replay (`min_ops`, `max_ops`), `kernels` and `kernel_ns` in all, the mean
    replay time (first operation's start to last one's end), the launch calls' time in all and
    per replay, and, where a capture was merged, `placed` of `merged` operations."""
    return store.arrow(GRAPH_REPLAYS_SQL, [run_id]).to_pylist()


# -- inference phases ------------------------------------------------------------------------
#
# What servers annotate per forward step: SGLang's `step[DECODE bs=32]` / `step[EXTEND bs=15
# toks=15360]` ranges, and the `execute_<tokens>_context_<prefill requests>(...)_generation_<decode
# requests>(...)` ranges of vLLM's (and SGLang's) profiling annotations. A step of prefill
# requests only is `prefill`, of decode requests only `decode`, of both `mixed` (chunked prefill).
PHASE_PATTERN = r"^(step\[[A-Z]+[^\]]*\]|execute_\d+_context_\d+\(.*\)_generation_\d+\(.*\))$"
PHASE_WINDOWS_SQL = f"""
WITH w AS (
    SELECT range_id, name, pid, tid, start_ns, end_ns,
           regexp_extract(name, '^step\\[([A-Z]+)', 1) AS mode,
           TRY_CAST(regexp_extract(name, 'bs=(\\d+)', 1) AS BIGINT) AS bs,
           TRY_CAST(coalesce(nullif(regexp_extract(name, 'toks=(\\d+)', 1), ''),
                             nullif(regexp_extract(name, '^execute_(\\d+)_', 1), '')) AS BIGINT) AS tokens,
           TRY_CAST(regexp_extract(name, '_context_(\\d+)\\(', 1) AS BIGINT) AS ctx,
           TRY_CAST(regexp_extract(name, '_generation_(\\d+)\\(', 1) AS BIGINT) AS gen
    FROM ranges
    WHERE run_id = $run_id AND kind IN ('nvtx', 'user_annotation') AND end_ns > start_ns
      AND regexp_matches(name, '{PHASE_PATTERN}')
), outer_w AS (  -- a step annotated twice (SGLang writes both kinds) is one step: the outer one
    SELECT w.* FROM w WHERE NOT EXISTS (
        SELECT 1 FROM w o WHERE o.pid = w.pid AND o.tid = w.tid AND o.range_id <> w.range_id
           AND o.start_ns <= w.start_ns AND o.end_ns >= w.end_ns
           AND (o.start_ns < w.start_ns OR o.end_ns > w.end_ns OR o.range_id < w.range_id))
)
SELECT range_id, name, start_ns, end_ns,
       CASE WHEN mode IN ('EXTEND', 'PREFILL') THEN 'prefill' WHEN mode = 'DECODE' THEN 'decode'
            WHEN mode <> '' THEN lower(mode)
            WHEN ctx > 0 AND gen > 0 THEN 'mixed' WHEN ctx > 0 THEN 'prefill' WHEN gen > 0 THEN 'decode'
            ELSE 'idle' END AS phase,
       coalesce(bs, ctx + gen) AS requests,
       coalesce(tokens, CASE WHEN mode = 'DECODE' THEN bs END) AS tokens, pid, tid
FROM outer_w ORDER BY start_ns
"""
# The GPU work each window launched: operations whose launch call started in it, on its thread
# (a graph replay's work through its graph launch call).
PHASE_WORK_SQL = """
SELECT w.range_id, a.device_id, a.kind, a.name, a.start_ns, a.end_ns
FROM (SELECT unnest($ids::BIGINT[]) AS range_id, unnest($pids::BIGINT[]) AS pid, unnest($tids::BIGINT[]) AS tid,
             unnest($starts::BIGINT[]) AS start_ns, unnest($ends::BIGINT[]) AS end_ns) w
JOIN api_calls c ON c.run_id = $run_id AND c.pid = w.pid AND c.tid = w.tid
                AND c.start_ns >= w.start_ns AND c.start_ns < w.end_ns
JOIN gpu_activity a ON a.run_id = $run_id AND a.launch_call_id = c.call_id
"""
PHASE_BUDGET_MAX_WINDOWS = 200  # a window budget each: beyond that, the phases go without one
TOP_PHASE_KERNELS = 5


def phases(store: Store, run_id: str) -> list[dict]:
    """The run's inference steps by phase (`PHASE_WINDOWS_SQL`): per phase (`prefill`, `decode`,
    `mixed`, ...), `steps`, `requests` and `tokens` in all (where the annotation says them),
    `wall_ns` (the steps' host windows), the GPU work they launched (`kernels`, `kernel_ns`,
    `gpu_proj_ns`: each step's first operation's start to its last one's end, summed),
    `kernel_ns_per_token`, `budget` (per device, the time budget's parts within the steps' GPU
    windows, summed: `{"device_id", "span_ns", "parts"}`; None over PHASE_BUDGET_MAX_WINDOWS
    steps) and `top_kernels` (`name`, `count`, `total_ns`, `share` of the phase's kernel time)."""
    windows = store.arrow(PHASE_WINDOWS_SQL, {"run_id": run_id}).to_pylist()
    if not windows:
        return []
    work = store.arrow(PHASE_WORK_SQL, {
        "run_id": run_id, "ids": [w["range_id"] for w in windows], "pids": [w["pid"] for w in windows],
        "tids": [w["tid"] for w in windows], "starts": [w["start_ns"] for w in windows],
        "ends": [w["end_ns"] for w in windows]}).to_pylist()
    by_window: dict[int, list[dict]] = {}
    for op in work:
        by_window.setdefault(op["range_id"], []).append(op)
    out: dict[str, dict] = {}
    budgeted = len(windows) <= PHASE_BUDGET_MAX_WINDOWS
    for w in windows:
        ph = out.setdefault(w["phase"], {"phase": w["phase"], "steps": 0, "requests": 0, "tokens": 0, "wall_ns": 0,
                                         "kernels": 0, "kernel_ns": 0, "gpu_proj_ns": 0, "_kernels": {},
                                         "_budget": {} if budgeted else None, "examples": []})
        ops = by_window.get(w["range_id"], [])
        ph["steps"] += 1
        ph["requests"] += w["requests"] or 0
        ph["tokens"] += w["tokens"] or 0
        ph["wall_ns"] += w["end_ns"] - w["start_ns"]
        if len(ph["examples"]) < 3:
            ph["examples"].append(w["name"])
        for op in ops:
            if op["kind"] == "kernel":
                ph["kernels"] += 1
                ph["kernel_ns"] += op["end_ns"] - op["start_ns"]
                k = ph["_kernels"].setdefault(op["name"], [0, 0])
                k[0] += 1
                k[1] += op["end_ns"] - op["start_ns"]
        for device in {op["device_id"] for op in ops}:
            mine = [op for op in ops if op["device_id"] == device]
            lo, hi = min(op["start_ns"] for op in mine), max(op["end_ns"] for op in mine)
            ph["gpu_proj_ns"] += hi - lo
            if ph["_budget"] is not None:
                views.install_on_demand(store.con)
                rows = store.sql("SELECT category, cause, ns, span_ns FROM run_window_time_budget(?, ?, ?, ?)",
                                 [run_id, device, lo, hi]).fetchall()
                b = ph["_budget"].setdefault(device, {"device_id": device, "span_ns": 0, "parts": {}})
                b["span_ns"] += rows[0][3] if rows else 0
                for category, cause, ns, _ in rows:
                    b["parts"][(category, cause)] = b["parts"].get((category, cause), 0) + ns
    result = []
    for ph in out.values():
        kernels, budget = ph.pop("_kernels"), ph.pop("_budget")
        top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:TOP_PHASE_KERNELS]
        ph["top_kernels"] = [{"name": n, "count": c, "total_ns": t, "share": t / ph["kernel_ns"] if ph["kernel_ns"] else None}
                             for n, (c, t) in top]
        ph["kernel_ns_per_token"] = ph["kernel_ns"] / ph["tokens"] if ph["tokens"] else None
        ph["budget"] = None if budget is None else [
            {"device_id": b["device_id"], "span_ns": b["span_ns"],
             "parts": [{"category": c, "cause": k, "ns": ns} for (c, k), ns in b["parts"].items()]}
            for b in budget.values()]
        result.append(ph)
    return result


def _top_compiled(c: dict | None, top: int | None) -> dict | None:
    return c if c is None or top is None else {**c, "kernels": c["kernels"][:top]}


def run_summary(store: Store, run_id: str, by: str = "name", top: int | None = None) -> dict:
    """The run's summary as JSON-ready values: the run's fields, `by`, `busy` (per device),
    `kernels` (the `top` first rows of `kernel_stats`, all when None), `kernel_totals`
    (`names`, `count`, `total_ns` over every kernel), `graphs`, `graph_replays` (`graph_replays`),
    `compiled_kernels` (TorchInductor's kernels, `compiled_kernels`, the `top` first; None without), `copies`, `memsets` and
    `memory` (per device, see `memory`) and `steps` (the per-step time distribution,
    `step_stats.run_steps`; None without steps)."""
    from .step_stats import run_steps

    def rows(sql: str, params: list) -> list[dict]:
        return store.arrow(sql, params).to_pylist()

    info = rows(f"SELECT {', '.join(RUN_FIELDS)} FROM runs WHERE run_id = ?", [run_id])[0]
    kernels = rows(_stats_sql(by, graphs=False), [run_id])
    with run_cache.scoped_to_run(store.con, run_id, build=False):
        gpus = rows(BUSY_SQL, [])
    return {
        **info, "by": by, "busy": gpus,
        "kernels": kernels if top is None else kernels[:top],
        "kernel_totals": {"names": len(kernels), "count": sum(k["count"] for k in kernels),
                          "total_ns": sum(k["total_ns"] for k in kernels)},
        "graphs": [{k: v for k, v in g.items() if k != "share"} for g in rows(_stats_sql(by, graphs=True), [run_id])],
        "graph_replays": graph_replays(store, run_id),
        "phases": phases(store, run_id),
        "compiled_kernels": _top_compiled(compiled_kernels(store, run_id), top),
        "copies": rows(COPIES_SQL, [run_id]),
        "memsets": rows(MEMSETS_SQL, [run_id]),
        "memory": memory(store, run_id),
        "steps": run_steps(store, run_id),
        "without_kernels": without_kernels(store, [run_id]).get(run_id),
    }


# -- memory --------------------------------------------------------------------------------
#
# Each memory source of a run reduced to the same numbers per device (`memory`), and the
# analyses behind them, which the memory rules (M001-M005), `diff` and the reports share:
#
# * allocator events (Kineto `[memory]`, nsys memory usage events): the `memory_levels` view;
#   the peak is its highest `allocated_bytes` on a CUDA device, first reached (M001's).
# * a memory snapshot: the allocator's state when it was taken (`snapshot_state`), and its
#   recorded history replayed (`HISTORY_LEVELS_SQL`). The history goes up at `alloc` and down at
#   `free_requested`, as `torch.cuda.memory_allocated()` does, but counts the bytes requested:
#   the history records those, not the rounded-up block sizes (at a snapshot blocks hold ~0.5%
#   more). It is a ring buffer that starts when recording started (or where older entries fell
#   off), so the level is anchored at its end: the bytes the snapshot's live blocks requested,
#   minus the history's net change, were allocated before the history began. Reserved memory
#   likewise, from `segment_alloc`/`segment_map` and `segment_free`/`segment_unmap`, anchored at
#   the snapshot's segments.
# * a memory timeline (`prof.export_memory_timeline`): the level after each time step, as
#   PyTorch's own plot draws it (`TIMELINE_STEPS_SQL`); the peak is the first step at the
#   highest level, split by category (`timeline_peaks`).

SNAPSHOT_STATE_SQL = """
WITH seg AS (
    SELECT s.device_id, s.segment_id, s.total_bytes,
           count(*) FILTER (WHERE b.state IN ('active_allocated', 'active_pending_free')) > 0 AS used,
           coalesce(sum(b.bytes) FILTER (WHERE b.state = 'inactive'), 0) AS free_bytes,
           max(b.bytes) FILTER (WHERE b.state = 'inactive') AS largest_free,
           coalesce(sum(b.bytes) FILTER (WHERE b.state = 'active_allocated'), 0) AS allocated,
           coalesce(sum(b.bytes) FILTER (WHERE b.state = 'active_pending_free'), 0) AS pending,
           max(b.bytes) FILTER (WHERE b.state = 'active_allocated') AS largest_live
    FROM memory_segments s LEFT JOIN memory_blocks b ON b.run_id = s.run_id AND b.segment_id = s.segment_id
    WHERE s.run_id = $run_id
    GROUP BY ALL
), requests AS (
    SELECT device_id, max(bytes) FILTER (WHERE action = 'alloc') AS largest_request,
           arg_max(bytes, event_id) FILTER (WHERE action = 'oom') AS failed_request,
           max(event_id) FILTER (WHERE action = 'oom') AS oom_event,
           quantile_disc(bytes, 0.9) FILTER (WHERE action = 'alloc') AS p90_request
    FROM allocator_events WHERE run_id = $run_id GROUP BY device_id
)
SELECT s.device_id, count(*) AS segments, sum(total_bytes) AS reserved, sum(allocated) AS allocated,
       sum(pending) AS pending, sum(free_bytes) AS free, max(largest_free) AS largest_free,
       sum(total_bytes) FILTER (WHERE NOT used) AS cached, count(*) FILTER (WHERE NOT used) AS cached_segments,
       coalesce(sum(free_bytes) FILTER (WHERE used), 0) AS stranded,
       count(*) FILTER (WHERE used AND free_bytes > 0) AS stranded_segments,
       max(largest_free) FILTER (WHERE used) AS largest_stranded,
       max(largest_live) AS largest_live,
       -- segments held by live blocks a quarter of their size or less: the case max_split_size_mb is for
       count(*) FILTER (WHERE used AND free_bytes > 0 AND allocated + pending <= total_bytes / 4) AS pinned_segments,
       coalesce(sum(free_bytes) FILTER (WHERE used AND allocated + pending <= total_bytes / 4), 0) AS pinned_free,
       median(total_bytes) FILTER (WHERE used AND free_bytes > 0 AND allocated + pending <= total_bytes / 4) AS pinned_segment_bytes,
       max(largest_live) FILTER (WHERE used AND free_bytes > 0 AND allocated + pending <= total_bytes / 4) AS pinning_block_bytes,
       any_value(r.largest_request) AS largest_request, any_value(r.failed_request) AS failed_request,
       any_value(r.oom_event) AS oom_event, any_value(r.p90_request) AS p90_request
FROM seg s LEFT JOIN requests r USING (device_id)
GROUP BY s.device_id ORDER BY s.device_id
"""

HISTORY_LEVELS_SQL = """
WITH anchor AS (  -- allocated and reserved bytes at the snapshot, per device
    SELECT s.device_id, sum(s.total_bytes) AS reserved,
           (SELECT coalesce(sum(coalesce(requested_bytes, bytes)), 0) FROM memory_blocks b WHERE b.run_id = $run_id
              AND b.device_id = s.device_id AND b.state = 'active_allocated') AS allocated
    FROM memory_segments s WHERE s.run_id = $run_id GROUP BY s.device_id
), steps AS (
    SELECT event_id, device_id, ts_ns, action, bytes, stack_id,
           sum(CASE action WHEN 'alloc' THEN bytes WHEN 'free_requested' THEN -bytes ELSE 0 END)
               OVER w AS allocated_change,
           sum(CASE WHEN action IN ('segment_alloc', 'segment_map') THEN bytes
                    WHEN action IN ('segment_free', 'segment_unmap') THEN -bytes ELSE 0 END) OVER w AS reserved_change
    FROM allocator_events WHERE run_id = $run_id
    WINDOW w AS (PARTITION BY device_id ORDER BY event_id ROWS UNBOUNDED PRECEDING)
), ends AS (
    SELECT device_id, arg_max(allocated_change, event_id) AS allocated_change,
           arg_max(reserved_change, event_id) AS reserved_change FROM steps GROUP BY device_id
)
SELECT s.event_id, s.device_id, s.ts_ns, s.action, s.bytes, s.stack_id,
       coalesce(a.allocated, 0) - e.allocated_change AS before_history,
       coalesce(a.allocated, 0) - e.allocated_change + s.allocated_change AS allocated,
       coalesce(a.reserved, 0) - e.reserved_change + s.reserved_change AS reserved,
       lead(s.ts_ns) OVER (PARTITION BY s.device_id ORDER BY s.event_id) AS next_ts
FROM steps s JOIN ends e USING (device_id) LEFT JOIN anchor a USING (device_id)
"""

# Per device and time step of a memory timeline: the change of each category.
TIMELINE_STEPS_SQL = """
SELECT device_id, ts_ns, category, sum(bytes) AS change, max(event_id) AS event_id
FROM memory_timeline WHERE run_id = $run_id GROUP BY ALL
"""

_TIMELINE_PEAK_SQL = f"""
WITH steps AS (
    SELECT device_id, ts_ns, max(event_id) AS event_id, sum(change) AS change FROM ({TIMELINE_STEPS_SQL}) GROUP BY ALL
), levels AS (
    SELECT *, sum(change) OVER (PARTITION BY device_id ORDER BY ts_ns ROWS UNBOUNDED PRECEDING) AS total,
           lead(ts_ns) OVER (PARTITION BY device_id ORDER BY ts_ns) AS next_ts
    FROM steps
), peak AS (
    SELECT device_id, arg_min(ts_ns, ts_ns) FILTER (WHERE total = top) AS ts_ns,
           arg_min(event_id, ts_ns) FILTER (WHERE total = top) AS event_id,
           arg_min(next_ts, ts_ns) FILTER (WHERE total = top) AS next_ts, any_value(top) AS total,
           arg_max(total, ts_ns) AS end_total, count(*) AS steps
    FROM (SELECT *, max(total) OVER (PARTITION BY device_id) AS top FROM levels) GROUP BY device_id
)
SELECT p.device_id, p.ts_ns, p.event_id, p.next_ts, p.total, p.end_total, p.steps, t.category, sum(t.bytes) AS bytes
FROM peak p JOIN memory_timeline t ON t.run_id = $run_id AND t.device_id = p.device_id AND t.ts_ns <= p.ts_ns
GROUP BY ALL ORDER BY p.device_id, bytes DESC, t.category
"""

_ALLOCATOR_PEAK_SQL = """
SELECT device_id, count(*) AS events, any_value(has_totals) AS has_totals,
       max(allocated_bytes) AS peak_allocated, max(reserved_bytes) AS peak_reserved,
       arg_min(ts_ns, (-allocated_bytes, seq)) AS peak_ts_ns
FROM memory_levels WHERE run_id = $run_id AND device_type = 'cuda' AND device_id >= 0
GROUP BY device_id ORDER BY device_id
"""


def _dicts(store: Store, sql: str, params) -> list[dict]:
    cur = store.sql(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def snapshot_state(store: Store, run_id: str) -> list[dict]:
    """Per device, at a memory snapshot: segments, reserved, allocated, pending-free and free
    bytes, the largest free block, and how the free bytes lie (`SNAPSHOT_STATE_SQL`: free in
    wholly free segments is `cached`, free beside live tensors `stranded`), with the history's
    largest, failed (`oom`) and 90th-percentile requests."""
    return _dicts(store, SNAPSHOT_STATE_SQL, {"run_id": run_id})


def history_peaks(store: Store, run_id: str) -> list[dict]:
    """Per device, the first event of a snapshot's history at which allocated memory peaked:
    `event_id`, `allocated`, `reserved` (then), `ts_ns`, `next_ts`, `before_history`, `events`,
    and `peak_reserved`, the highest reserved level of the history."""
    return _dicts(store, f"""WITH l AS ({HISTORY_LEVELS_SQL})
        SELECT device_id, arg_min(event_id, event_id) FILTER (WHERE allocated = top) AS event_id,
               any_value(top) AS allocated, arg_min(reserved, event_id) FILTER (WHERE allocated = top) AS reserved,
               arg_min(ts_ns, event_id) FILTER (WHERE allocated = top) AS ts_ns,
               arg_min(next_ts, event_id) FILTER (WHERE allocated = top) AS next_ts,
               any_value(before_history) AS before_history, count(*) AS events, max(reserved) AS peak_reserved
        FROM (SELECT *, max(allocated) OVER (PARTITION BY device_id) AS top FROM l)
        GROUP BY device_id ORDER BY device_id""", {"run_id": run_id})


def history_level_at(store: Store, run_id: str, event_id: int) -> dict:
    """Allocated and reserved bytes right after one event of a snapshot's history."""
    [row] = _dicts(store, f"SELECT allocated, reserved, before_history, ts_ns, next_ts FROM ({HISTORY_LEVELS_SQL}) "
                          "WHERE event_id = $e", {"run_id": run_id, "e": event_id})
    return row


def timeline_peaks(store: Store, run_id: str) -> list[dict]:
    """Per device of a memory timeline, its peak: `ts_ns` and `event_id` of the first time step
    at the highest level, `next_ts` (the next step's time), `total`, `end_total` (the level
    after the last step), `steps`, and `categories`, the (category, bytes) it held then, most
    bytes first (categories holding nothing left out)."""
    out: dict[int, dict] = {}
    for device, ts, event_id, next_ts, total, end_total, steps, category, nbytes in store.sql(
            _TIMELINE_PEAK_SQL, {"run_id": run_id}).fetchall():
        d = out.setdefault(device, {"device_id": device, "ts_ns": ts, "event_id": event_id, "next_ts": next_ts,
                                    "total": int(total), "end_total": int(end_total), "steps": steps,
                                    "categories": []})
        if nbytes:
            d["categories"].append((category, int(nbytes)))
    return list(out.values())


# Kineto allocator events categorised from operator context (`kineto_category_peaks`). Each
# allocation (an event with positive bytes and an address) ends at the next event at its address
# on its device, normally its free (as M001 pairs them). The timeline is cut into stretches: per
# step (`steps`, optimizer steps left out; else the whole run as one), `forward` (from the step's
# start to the first backward operator's start), `backward` (to the last backward operator's end;
# backward operators are the autograd engine's `autograd::engine::evaluate_function` frames and
# operators named `*backward*`, on whatever thread runs them), `after_backward` (to the step's
# end) and `between` (after the step, until the next); each optimizer step (`Optimizer.step#...`
# and `optimizer.step...` ranges or operators, overlapping ones merged) is a stretch of its own,
# whatever step it is in. An allocation is
# * `temporary` when it ends in the stretch that made it (within one operator, or within forward,
#   backward or the optimizer step);
# * else `optimizer_state` when made in an optimizer step (still alive when it ends);
# * else `gradient` when made in backward (alive at its end);
# * else `activation` when made in forward and freed in the same step's backward;
# * else `unknown` (made between steps, freed after the step, kept past the capture, ...).
# What the addresses do not account for at the peak was allocated before the capture and is
# counted as `parameter` (`Total Allocated` before the first event, less what the trace frees of
# it). What this cannot tell: optimizer state and gradients kept from the steps before the capture
# count as parameters; with gradient accumulation, the micro-batches after the first one's backward
# count as backward; a forward tensor kept past its step's backward (a cache, the loss) is unknown.
# Categories are only given for runs with a backward operator or an optimizer step, and only
# where the addresses hold no more than the peak (within 1%; else frees do not name their blocks).
# Backward operators: the autograd engine's frames and the operators named for backward.
BACKWARD_OPS = "(starts_with(name, 'autograd::engine::evaluate_function') OR name ILIKE '%backward%')"
# Optimizer steps: torch.optim's `Optimizer.step#Adam.step` frames and user ranges `optimizer.step...`.
OPTIMIZER_STEP = "(lower(name) LIKE 'optimizer.step%')"
# A run has the operator context the categories need: a backward operator or an optimizer step.
TRAINING_CONTEXT_SQL = f"""(EXISTS (SELECT 1 FROM cpu_ops WHERE run_id = $run_id AND {BACKWARD_OPS})
    OR EXISTS (SELECT 1 FROM ranges WHERE run_id = $run_id AND kind IN ('user_annotation', 'nvtx') AND {OPTIMIZER_STEP})
    OR EXISTS (SELECT 1 FROM cpu_ops WHERE run_id = $run_id AND {OPTIMIZER_STEP}))"""

_KINETO_PEAK_SQL = f"""
WITH ev AS (
    SELECT device_id, event_id, seq, ts_ns, next_ts_ns, bytes, address, allocated_bytes
    FROM memory_levels WHERE run_id = $run_id AND device_type = 'cuda' AND device_id >= 0 AND {TRAINING_CONTEXT_SQL}
), own_steps AS (  -- (`steps` takes an `Optimizer.step#...` range for a step when there is no ProfilerStep)
    SELECT range_id AS step_id, start_ns, end_ns FROM steps WHERE run_id = $run_id AND NOT {OPTIMIZER_STEP}
), windows AS (  -- the steps, or the whole run as one
    SELECT * FROM own_steps
    UNION ALL
    SELECT -1, -4611686018427387904, 4611686018427387904 WHERE NOT EXISTS (SELECT 1 FROM own_steps)
), backward AS (  -- per step, from the first backward operator's start to the last one's end
    SELECT w.step_id, min(o.start_ns) AS bw_start, max(o.end_ns) AS bw_end
    FROM (SELECT start_ns, end_ns FROM cpu_ops WHERE run_id = $run_id AND {BACKWARD_OPS}) o
    ASOF JOIN windows w ON o.start_ns >= w.start_ns
    WHERE o.start_ns <= w.end_ns GROUP BY w.step_id
), steps_bw AS (
    SELECT w.*, b.bw_start, b.bw_end FROM windows w LEFT JOIN backward b USING (step_id)
), opt_frames AS (
    SELECT start_ns, end_ns FROM ranges
    WHERE run_id = $run_id AND kind IN ('user_annotation', 'nvtx') AND end_ns > start_ns AND {OPTIMIZER_STEP}
    UNION
    SELECT start_ns, end_ns FROM cpu_ops WHERE run_id = $run_id AND end_ns > start_ns AND {OPTIMIZER_STEP}
), opt AS (  -- optimizer steps, frames that overlap (nested ones) merged
    SELECT island AS opt_id, min(start_ns) AS start_ns, max(end_ns) AS end_ns FROM (
        SELECT *, sum(new::INT) OVER (ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island FROM (
            SELECT *, start_ns > coalesce(max(end_ns) OVER (ORDER BY start_ns, end_ns
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), start_ns - 1) AS new
            FROM opt_frames))
    GROUP BY island
), placed AS (  -- each event's phase: a part of the timeline, the key of one stretch of it
    SELECT e.*, CASE WHEN e.ts_ns <= o.end_ns THEN 'optimizer'
                     WHEN s.step_id IS NULL OR e.ts_ns > s.end_ns THEN 'between'
                     WHEN e.ts_ns >= s.bw_start AND e.ts_ns <= s.bw_end THEN 'backward'
                     WHEN s.bw_start IS NULL OR e.ts_ns < s.bw_start THEN 'forward'
                     ELSE 'after_backward' END AS phase,
           coalesce(s.step_id, -2) AS step_id, o.opt_id
    FROM ev e ASOF LEFT JOIN steps_bw s ON e.ts_ns >= s.start_ns ASOF LEFT JOIN opt o ON e.ts_ns >= o.start_ns
), keyed AS (
    SELECT *, CASE phase WHEN 'optimizer' THEN 'o' || opt_id ELSE phase || step_id END AS stretch FROM placed
), paired AS (  -- an allocation ends at the next event at its address (its free)
    SELECT *, lead(seq) OVER a AS end_seq, lead(stretch) OVER a AS end_stretch, lead(phase) OVER a AS end_phase,
           lead(step_id) OVER a AS end_step
    FROM keyed WINDOW a AS (PARTITION BY device_id, address ORDER BY seq)
), allocations AS (
    SELECT device_id, seq, end_seq, bytes,
           CASE WHEN stretch = end_stretch THEN 'temporary'
                WHEN phase = 'optimizer' THEN 'optimizer_state'
                WHEN phase = 'backward' THEN 'gradient'
                WHEN phase = 'forward' AND end_phase = 'backward' AND end_step = step_id THEN 'activation'
                ELSE 'unknown' END AS category
    FROM paired WHERE bytes > 0 AND address IS NOT NULL
), peak AS (  -- the first event at the highest level, as M001 finds it
    SELECT device_id, arg_min(seq, seq) FILTER (WHERE allocated_bytes = top) AS seq,
           arg_min(event_id, seq) FILTER (WHERE allocated_bytes = top) AS event_id,
           arg_min(ts_ns, seq) FILTER (WHERE allocated_bytes = top) AS ts_ns,
           arg_min(next_ts_ns, seq) FILTER (WHERE allocated_bytes = top) AS next_ts,
           any_value(top) AS total, arg_max(allocated_bytes, seq) AS end_total, count(*) AS events,
           count(address) = count(*) AS has_addresses
    FROM (SELECT *, max(allocated_bytes) OVER (PARTITION BY device_id) AS top FROM ev) GROUP BY device_id
), held AS (  -- per category, the allocations live at the peak
    SELECT p.device_id, a.category, sum(a.bytes) AS bytes
    FROM peak p JOIN allocations a ON a.device_id = p.device_id AND a.seq <= p.seq AND coalesce(a.end_seq > p.seq, true)
    GROUP BY ALL
), checked AS (  -- addresses are trusted when what they hold fits under the peak (as M001 does)
    SELECT p.*, coalesce(sum(h.bytes), 0) AS tracked FROM peak p LEFT JOIN held h USING (device_id)
    WHERE p.has_addresses GROUP BY ALL HAVING coalesce(sum(h.bytes), 0) <= 1.01 * p.total
)
SELECT c.device_id, c.ts_ns, c.event_id, c.next_ts, c.total, c.end_total, c.events, h.category, h.bytes
FROM checked c JOIN held h USING (device_id)
UNION ALL  -- what the addresses do not account for was allocated before the capture
SELECT device_id, ts_ns, event_id, next_ts, total, end_total, events, 'parameter', total - tracked
FROM checked WHERE total > tracked
ORDER BY device_id, bytes DESC, category
"""


def kineto_category_peaks(store: Store, run_id: str) -> list[dict]:
    """Per CUDA device of a Kineto trace with operator context, the peak of allocated memory
    (M001's: the first event at the highest level) split by the categories above, in the shape
    of `timeline_peaks` (`steps` there is the number of allocator events here)."""
    out: dict[int, dict] = {}
    for device, ts, event_id, next_ts, total, end_total, events, category, nbytes in store.sql(
            _KINETO_PEAK_SQL, {"run_id": run_id}).fetchall():
        d = out.setdefault(device, {"device_id": device, "ts_ns": ts, "event_id": event_id, "next_ts": next_ts,
                                    "total": int(total), "end_total": int(end_total), "steps": events,
                                    "categories": []})
        if nbytes:
            d["categories"].append((category, int(nbytes)))
    return list(out.values())


MEMORY_FIELDS = ("device_id", "source", "reserved_bytes", "allocated_bytes", "largest_free_block_bytes",
                 "peak_allocated_bytes", "peak_reserved_bytes", "peak_ts_ns", "categories")
# What each source's numbers are, as `memory` names it.
SNAPSHOT, TIMELINE = "memory snapshot", "memory timeline"
ALLOCATOR_TOTALS, SIGNED_SIZES = "allocator totals", "running sum of signed sizes"


def memory(store: Store, run_id: str) -> list[dict]:
    """Per device, the run's memory as far as its data tells (None where it does not): the
    fields of MEMORY_FIELDS.

    `reserved_bytes`, `allocated_bytes` (block bytes) and `largest_free_block_bytes` are a
    snapshot's, at the time it was taken. `peak_allocated_bytes` is the highest allocated
    level: over a snapshot's recorded history (requested bytes, see above; None without a
    history), of a timeline, or of the allocator events (M001's peak); `peak_reserved_bytes`
    the highest reserved level where the data records it; `peak_ts_ns` when the allocated
    peak was first reached. A
    timeline, or a Kineto trace with operator context (`kineto_category_peaks`), gives
    `categories` at its peak: `{"category", "bytes", "share"}`, most bytes first.
    `source` says where the numbers come from: a memory snapshot, a memory timeline, or the
    allocator events' totals or running sum of signed sizes."""
    rows: dict[int, dict] = {}

    def row(device: int, source: str) -> dict:
        return rows.setdefault(device, {**dict.fromkeys(MEMORY_FIELDS), "device_id": device, "source": source})

    for st in snapshot_state(store, run_id):
        row(st["device_id"], SNAPSHOT).update(
            reserved_bytes=_int(st["reserved"]), allocated_bytes=_int(st["allocated"]),
            largest_free_block_bytes=_int(st["largest_free"]))
    for p in history_peaks(store, run_id):  # (the history ends at the snapshot's levels: the peaks are at least those)
        row(p["device_id"], SNAPSHOT).update(peak_allocated_bytes=_int(p["allocated"]), peak_ts_ns=p["ts_ns"],
                                             peak_reserved_bytes=_int(p["peak_reserved"]))
    for p in timeline_peaks(store, run_id):
        row(p["device_id"], TIMELINE).update(
            peak_allocated_bytes=p["total"], peak_ts_ns=p["ts_ns"],
            categories=_shares(p))
    for p in _dicts(store, _ALLOCATOR_PEAK_SQL, {"run_id": run_id}):
        row(p["device_id"], ALLOCATOR_TOTALS if p["has_totals"] else SIGNED_SIZES).update(
            peak_allocated_bytes=_int(p["peak_allocated"]), peak_reserved_bytes=_int(p["peak_reserved"]),
            peak_ts_ns=p["peak_ts_ns"])
    for p in kineto_category_peaks(store, run_id):  # (the same peak as the allocator events')
        row(p["device_id"], ALLOCATOR_TOTALS).update(categories=_shares(p))
    return [rows[d] for d in sorted(rows)]


def _shares(peak: dict) -> list[dict]:
    return [{"category": c, "bytes": b, "share": b / peak["total"] if peak["total"] else None}
            for c, b in peak["categories"]]


def _int(x) -> int | None:
    return None if x is None or x != x else int(x)
