"""Which code the GPU time came from: per NVTX range, PyTorch operator or `nn.Module`, by name path.

Every GPU operation is linked to the host frames open on its launching thread when its launch
call began (the store's `launch_context` and `host_frames` views). Here those frames are
grouped by their path of names from the outermost frame of the same source down (`by`: `range`
for NVTX ranges and Kineto user annotations, `op` for PyTorch operators, `module` for the
`nn.Module` frames of the Python stack), names normalised (`normalize_name`), and per path:

* `instances`, `cpu_ns` (their time on the host, children included: nsys's "Total Range Time");
* `kernels` launched inside (children included) and `gpu_ns`, the sum of their durations;
* `gpu_ops` (kernels, copies and memsets) and `gpu_proj_ns`, each instance's projection onto the
  GPU summed: first GPU operation's start to last one's end, NVIDIA's `nvtx_gpu_proj_sum`
  "Total Proj Time" (children not subtracted; projections of instances can overlap, so the
  children's sum can exceed their parent's). nsys counts as "Range Instances" only the instances
  that enclosed GPU work; `instances` here counts every one;
* `self_cuda_memory_bytes`: the CUDA allocator events on the thread while an instance is the
  innermost frame, allocations less frees (torch.profiler's `self_cuda_memory_usage`), where the
  trace has them on a thread;
* `share`: `gpu_ns` as a share of the run's kernel time.

A kernel is launched inside at most one frame per depth of one source, so at every depth the
`gpu_ns` add up to at most the run's kernel time; what was launched outside every frame is the
run's `outside_ns`. Whole CUDA-graph executions are kernels here (the work the graph launch put
on the GPU).

A Nsight Compute run has no timeline: its ranges are those its `--nvtx` columns list per
profiled launch (the store's `launch_ranges`; `by` `range` only). A launch's path is its
launching thread's push/pop stack, else the start/end ranges ncu lists for it; `kernels` counts
the profiled launches inside and `gpu_ns` sums their duration metric (`gpu__time_duration.sum`).
ncu records no range instances, host times or projections: those fields are None.
"""

from __future__ import annotations

import re

from .analyses import attribution
from .store import Store, StoreError

# The sources `--by` names, as host_frames' `source`.
BY = {"range": "range", "op": "op", "module": "module"}
WHAT = {"range": "ranges", "op": "operators", "module": "modules"}

_COMPILED = tuple((re.compile(p), r) for p, r in attribution.NAME_PATTERNS)


def normalize_name(name: str | None) -> str:
    """`name` with per-instance parts rewritten (NAME_PATTERNS), stripped; "" for None."""
    out = name or ""
    for pattern, replacement in _COMPILED:
        out = pattern.sub(replacement, out)
    return out.strip()


def _tree_sql(by: str, runs: str = "run_id = $run_id", memory: bool = True) -> str:
    """Per run and path node of `by`'s frames of the runs `runs` selects (a condition on
    `run_id`): its parent node, name, depth and numbers (see the module docstring), down to
    depth $max_depth - 1. Without `memory` (the runs have no CUDA allocator events on a
    thread) `self_cuda_memory_bytes` is NULL and the sweep that places the events is left out."""
    source = BY[by]
    column = attribution.launch_context_column(source)
    if memory:
        placed = f"""SELECT s.run_id, s.frame_id, sum(m.bytes) AS bytes
            FROM (SELECT run_id, pid, tid, ts_ns, bytes FROM memory_events
                  WHERE {runs} AND device_type = 'cuda' AND ts_ns IS NOT NULL AND bytes IS NOT NULL
                    AND pid IS NOT NULL AND tid IS NOT NULL) m
            ASOF JOIN steps s ON s.run_id = m.run_id AND s.pid = m.pid AND s.tid = m.tid AND s.from_ns <= m.ts_ns
            WHERE s.frame_id IS NOT NULL GROUP BY ALL"""
        steps = f"""), steps AS MATERIALIZED (
            {attribution.frame_steps_sql("frames")}"""
    else:
        placed, steps = "SELECT NULL::VARCHAR AS run_id, NULL::BIGINT AS frame_id, NULL::HUGEINT AS bytes LIMIT 0", ""
    return f"""
        WITH RECURSIVE frames AS MATERIALIZED (
            {attribution.host_frames_sql(runs, (source,))}
        {steps}
        ), context AS (
            {attribution.launch_context_sql(runs, (source,), names=False)}
        ), direct AS (  -- what was launched with each frame innermost
            SELECT run_id, {column} AS frame_id, count(*) FILTER (WHERE kind = 'kernel') AS kernels,
                   coalesce(sum(end_ns - start_ns) FILTER (WHERE kind = 'kernel'), 0) AS gpu_ns,
                   count(*) AS gpu_ops, min(start_ns) AS first_ns, max(end_ns) AS last_ns
            FROM context WHERE {column} IS NOT NULL GROUP BY ALL
        ), up AS (  -- each frame's direct numbers carried up to every frame around it
            SELECT d.*, f.parent_id AS next_id FROM direct d JOIN frames f USING (run_id, frame_id)
            UNION ALL
            SELECT f.run_id, f.frame_id, u.kernels, u.gpu_ns, u.gpu_ops, u.first_ns, u.last_ns, f.parent_id
            FROM up u JOIN frames f ON f.run_id = u.run_id AND f.frame_id = u.next_id
        ), inclusive AS (
            SELECT run_id, frame_id, sum(kernels) AS kernels, sum(gpu_ns) AS gpu_ns, sum(gpu_ops) AS gpu_ops,
                   min(first_ns) AS first_ns, max(last_ns) AS last_ns
            FROM up GROUP BY ALL
        ), memory AS (  -- CUDA allocator events, each to the frame innermost on its thread then
            {placed}
        ), keys AS (
            SELECT name, normalized_name(name) AS key FROM (SELECT DISTINCT coalesce(name, '') AS name FROM frames)
        ), nodes AS (  -- each frame's path of names as a node id: a hash of its parent's node and its name
            SELECT f.run_id, f.frame_id, hash(k.key) AS node, NULL::UBIGINT AS parent_node, k.key AS name, 0 AS depth
            FROM frames f JOIN keys k ON k.name = coalesce(f.name, '') WHERE f.parent_id IS NULL
            UNION ALL
            SELECT f.run_id, f.frame_id, hash(n.node, k.key), n.node, k.key, n.depth + 1
            FROM nodes n JOIN frames f ON f.run_id = n.run_id AND f.parent_id = n.frame_id
            JOIN keys k ON k.name = coalesce(f.name, '')
            WHERE n.depth + 1 < $max_depth
        )
        SELECT n.run_id, n.node, any_value(n.parent_node) AS parent_node, any_value(n.name) AS name,
               any_value(n.depth) AS depth, count(*) AS instances, CAST(sum(f.end_ns - f.start_ns) AS BIGINT) AS cpu_ns,
               CAST(coalesce(sum(i.kernels), 0) AS BIGINT) AS kernels, CAST(coalesce(sum(i.gpu_ns), 0) AS BIGINT) AS gpu_ns,
               CAST(coalesce(sum(i.gpu_ops), 0) AS BIGINT) AS gpu_ops,
               CAST(coalesce(sum(i.last_ns - i.first_ns), 0) AS BIGINT) AS gpu_proj_ns,
               CAST(sum(m.bytes) AS BIGINT) AS self_cuda_memory_bytes
        FROM nodes n JOIN frames f USING (run_id, frame_id)
        LEFT JOIN inclusive i USING (run_id, frame_id) LEFT JOIN memory m USING (run_id, frame_id)
        GROUP BY n.run_id, n.node
        """


NCU_TOTALS_SQL = """
SELECT count(*) AS kernels, CAST(sum(duration_ns) AS BIGINT) AS kernel_ns, false AS has_memory
FROM kernel_durations WHERE run_id = $run_id
"""

# Per profiled launch of an ncu run with ranges: its path of (normalised) range names,
# outermost first, and its duration (NULL where the export has no duration metric).
NCU_PATHS_SQL = """
WITH listed AS (
    SELECT *, bool_or(kind = 'push_pop') OVER (PARTITION BY kernel_id) AS has_stack
    FROM launch_ranges WHERE run_id = $run_id
), paths AS (
    SELECT kernel_id, list(normalized_name(name) ORDER BY kind, depth) AS path
    FROM listed WHERE kind = 'push_pop' OR NOT has_stack GROUP BY kernel_id
)
SELECT p.path, CAST(k.duration_ns AS BIGINT) AS ns
FROM paths p JOIN kernel_durations k ON k.run_id = $run_id AND k.kernel_id = p.kernel_id
"""

HAS_LAUNCH_RANGES_SQL = "SELECT EXISTS (SELECT 1 FROM launch_ranges WHERE run_id = $run_id)"

TOTALS_SQL = """
SELECT count(*) AS kernels, CAST(coalesce(sum(end_ns - start_ns), 0) AS BIGINT) AS kernel_ns,
       (SELECT EXISTS (SELECT 1 FROM memory_events WHERE run_id = $run_id AND device_type = 'cuda'
                       AND tid IS NOT NULL AND bytes IS NOT NULL)) AS has_memory
FROM gpu_activity WHERE run_id = $run_id AND kind = 'kernel'
"""

# TOTALS_SQL (NCU_TOTALS_SQL for a run with launch ranges) of each run of $run_ids, with
# `from_launches` and `frames`, the run's host frames of the source $source (what the tree reads).
RUNS_TOTALS_SQL = """
WITH timed AS (
    SELECT run_id, count(*) AS kernels, CAST(sum(end_ns - start_ns) AS BIGINT) AS kernel_ns
    FROM gpu_activity WHERE list_contains($run_ids, run_id) AND kind = 'kernel' GROUP BY run_id
), profiled AS (
    SELECT run_id, count(*) AS kernels, CAST(sum(duration_ns) AS BIGINT) AS kernel_ns
    FROM kernel_durations WHERE list_contains($run_ids, run_id) GROUP BY run_id
), launches AS (
    SELECT DISTINCT run_id FROM launch_ranges WHERE list_contains($run_ids, run_id)
), memory AS (
    SELECT DISTINCT run_id FROM memory_events
    WHERE list_contains($run_ids, run_id) AND device_type = 'cuda' AND tid IS NOT NULL AND bytes IS NOT NULL
), frames AS (
    SELECT run_id, count(*) AS frames FROM cpu_ops WHERE $source = 'op' AND list_contains($run_ids, run_id) GROUP BY run_id
    UNION ALL
    SELECT run_id, count(*) FROM ranges WHERE $source = 'range' AND list_contains($run_ids, run_id) GROUP BY run_id
    UNION ALL
    SELECT run_id, count(*) FROM python_functions WHERE $source = 'module' AND list_contains($run_ids, run_id)
    GROUP BY run_id
)
SELECT r.run_id, r.file_name, r.format, l.run_id IS NOT NULL AS from_launches,
       CASE WHEN l.run_id IS NOT NULL THEN coalesce(p.kernels, 0) ELSE coalesce(t.kernels, 0) END AS kernels,
       CASE WHEN l.run_id IS NOT NULL THEN p.kernel_ns ELSE coalesce(t.kernel_ns, 0) END AS kernel_ns,
       l.run_id IS NULL AND m.run_id IS NOT NULL AS has_memory, coalesce(f.frames, 0) AS frames
FROM runs r LEFT JOIN timed t USING (run_id) LEFT JOIN profiled p USING (run_id) LEFT JOIN launches l USING (run_id)
LEFT JOIN memory m USING (run_id) LEFT JOIN frames f USING (run_id)
WHERE list_contains($run_ids, r.run_id)
"""

# Host frames and GPU operations one tree query takes on at most, over the runs it does at
# once: a query per run costs ~40 ms of planning alone, a query for every run of a big store at
# once would hold all their frames and launches together.
TREE_ROWS_PER_QUERY = 1_000_000

RUN_FIELDS = ("run_id", "file_name", "format")
# Row fields, in the order of the JSON and CSV outputs.
ROW_FIELDS = ("name", "path", "depth", "instances", "cpu_ns", "kernels", "gpu_ns", "gpu_proj_ns", "share",
              "gpu_ops", "self_cuda_memory_bytes")


def range_rows(store: Store, run_id: str, by: str = "range", depth: int | None = None) -> list[dict]:
    """Per path of `by`'s frames (`range`, `op` or `module`), down to `depth` levels (None: all),
    as rows with ROW_FIELDS, in tree order: each node after its parent, siblings by GPU time,
    then CPU time, then name. `path` is the list of names from the outermost frame down."""
    return run_ranges(store, run_id, by, depth)["ranges"]


def _from_launches(store: Store, run_id: str) -> bool:
    """Whether the run's ranges are ncu's per-launch lists (`launch_ranges`)."""
    return bool(store.sql(HAS_LAUNCH_RANGES_SQL, {"run_id": run_id}).fetchone()[0])


def _totals(store: Store, run_id: str) -> dict:
    sql = NCU_TOTALS_SQL if _from_launches(store, run_id) else TOTALS_SQL
    return store.arrow(sql, {"run_id": run_id}).to_pylist()[0]


def _launch_nodes(store: Store, run_id: str, max_depth: int) -> list[dict]:
    """The nodes `_tree_sql` gives, from an ncu run's per-launch range paths: per path prefix
    (down to `max_depth` levels), the launches inside it and their durations summed (None when
    none of them has one)."""
    nodes: dict[tuple, dict] = {}
    for launch in store.arrow(NCU_PATHS_SQL, {"run_id": run_id}).to_pylist():
        path = tuple(launch["path"])
        for depth in range(min(len(path), max_depth)):
            prefix = path[:depth + 1]
            n = nodes.get(prefix)
            if n is None:
                n = nodes[prefix] = {"node": prefix, "parent_node": prefix[:-1] or None, "name": prefix[-1],
                                     "depth": depth, "instances": None, "cpu_ns": None, "kernels": 0,
                                     "gpu_ns": None, "gpu_ops": 0, "gpu_proj_ns": None,
                                     "self_cuda_memory_bytes": None}
            n["kernels"] += 1
            n["gpu_ops"] += 1
            if launch["ns"] is not None:
                n["gpu_ns"] = (n["gpu_ns"] or 0) + launch["ns"]
    return list(nodes.values())


def _tree_nodes(store: Store, totals: dict[str, dict], by: str, max_depth: int) -> dict[str, list[dict]]:
    """The nodes of `_tree_sql` of each run of `totals` (`RUNS_TOTALS_SQL` rows by run), runs
    with and without memory events apart, a query for as many runs as TREE_ROWS_PER_QUERY takes."""
    out: dict[str, list[dict]] = {r: [] for r in totals}
    for memory in (False, True):
        # A run without frames of the source has no nodes; a bigger run than the limit is alone.
        runs = [t for t in totals.values() if t["frames"] and bool(t["has_memory"]) == memory]
        batch: list[str] = []
        rows = 0
        for t in runs + [None]:
            size = t["frames"] + t["kernels"] if t else 0
            if batch and (t is None or rows + size > TREE_ROWS_PER_QUERY):
                sql = _tree_sql(by, "list_contains($run_ids, run_id)", memory=memory)
                for n in store.arrow(sql, {"run_ids": batch, "max_depth": max_depth}).to_pylist():
                    out[n.pop("run_id")].append(n)
                batch, rows = [], 0
            if t is not None:
                batch.append(t["run_id"])
                rows += size
    return out


def _tree_rows(nodes: list[dict], totals: dict) -> list[dict]:
    children: dict[int | None, list[dict]] = {}
    for n in nodes:
        children.setdefault(n["parent_node"], []).append(n)
    for kids in children.values():
        kids.sort(key=lambda n: (-(n["gpu_ns"] or 0), -(n["cpu_ns"] or 0), n["name"]))
    rows: list[dict] = []
    stack = [(n, [n["name"]]) for n in reversed(children.get(None, []))]
    while stack:
        n, path = stack.pop()
        rows.append({"name": n["name"], "path": path, "depth": n["depth"], "instances": n["instances"],
                     "cpu_ns": n["cpu_ns"], "kernels": n["kernels"], "gpu_ns": n["gpu_ns"],
                     "gpu_proj_ns": n["gpu_proj_ns"],
                     "share": n["gpu_ns"] / totals["kernel_ns"] if totals["kernel_ns"] and n["gpu_ns"] is not None else None,
                     "gpu_ops": n["gpu_ops"],
                     "self_cuda_memory_bytes": (n["self_cuda_memory_bytes"] or 0) if totals["has_memory"] else None})
        stack += [(c, path + [c["name"]]) for c in reversed(children.get(n["node"], []))]
    return rows


def run_ranges(store: Store, run_id: str, by: str = "range", depth: int | None = None) -> dict:
    """A run's `range_rows` as a JSON-ready dict: the run's fields, `by`, `kernels` and
    `kernel_ns` (all of the run's), `outside_ns` (the kernel time launched outside every frame
    of `by`) and `ranges`. StoreError when no run has that id."""
    return runs_ranges(store, [run_id], by, depth)[run_id]


def runs_ranges(store: Store, run_ids: list[str], by: str = "range", depth: int | None = None) -> dict[str, dict]:
    """`run_ranges` of each of `run_ids` (by run id), in a few queries for all of them."""
    if by not in BY:
        raise ValueError(f"ranges are grouped by one of {', '.join(BY)}, not {by!r}")
    max_depth = depth or 1 << 30
    totals = {t["run_id"]: t for t in store.arrow(RUNS_TOTALS_SQL, {"run_ids": list(run_ids), "source": by}).to_pylist()}
    missing = [r for r in run_ids if r not in totals]
    if missing:
        raise StoreError(f"no run {missing[0]!r}")
    launched = {r for r, t in totals.items() if t["from_launches"]}
    nodes = _tree_nodes(store, {r: t for r, t in totals.items() if r not in launched}, by, max_depth)
    for r in launched:
        nodes[r] = _launch_nodes(store, r, max_depth) if by == "range" else []
    out = {}
    for r in run_ids:
        t = totals[r]
        rows = _tree_rows(nodes[r], t)
        inside = sum(x["gpu_ns"] or 0 for x in rows if x["depth"] == 0)
        outside = None if t["kernel_ns"] is None else t["kernel_ns"] - inside
        out[r] = {**{k: t[k] for k in RUN_FIELDS}, "by": by, "kernels": t["kernels"], "kernel_ns": t["kernel_ns"],
                  "outside_ns": outside, "ranges": rows}
    return out


# -- per operator, as torch.profiler's key_averages() -------------------------------------

def _ops_sql() -> str:
    """Per operator name (normalised) of run $run_id: calls, host time (`cpu_ns`) and self host
    time (less the time of the operators directly inside it on its thread), the kernels launched
    inside it (children included: `kernels`, `gpu_ns`) and directly by it (`self_gpu_ns`)."""
    column = attribution.launch_context_column("op")
    return f"""
        WITH RECURSIVE frames AS MATERIALIZED (
            {attribution.host_frames_sql("run_id = $run_id", ("op",))}
        ), context AS (
            {attribution.launch_context_sql("run_id = $run_id", ("op",), names=False)}
        ), direct AS (  -- the kernels launched with each operator innermost
            SELECT {column} AS frame_id, count(*) AS kernels, sum(end_ns - start_ns) AS gpu_ns
            FROM context WHERE {column} IS NOT NULL AND kind = 'kernel' GROUP BY ALL
        ), up AS (  -- carried up to every operator around it
            SELECT d.frame_id, d.kernels, d.gpu_ns, f.parent_id AS next_id FROM direct d JOIN frames f USING (frame_id)
            UNION ALL
            SELECT f.frame_id, u.kernels, u.gpu_ns, f.parent_id FROM up u JOIN frames f ON f.frame_id = u.next_id
        ), inclusive AS (
            SELECT frame_id, sum(kernels) AS kernels, sum(gpu_ns) AS gpu_ns FROM up GROUP BY ALL
        ), children AS (
            SELECT parent_id AS frame_id, sum(end_ns - start_ns) AS child_ns
            FROM frames WHERE parent_id IS NOT NULL GROUP BY ALL
        )
        SELECT normalized_name(f.name) AS name, count(*) AS calls,
               CAST(sum(f.end_ns - f.start_ns - coalesce(c.child_ns, 0)) AS BIGINT) AS self_cpu_ns,
               CAST(sum(f.end_ns - f.start_ns) AS BIGINT) AS cpu_ns,
               CAST(coalesce(sum(d.gpu_ns), 0) AS BIGINT) AS self_gpu_ns,
               CAST(coalesce(sum(i.gpu_ns), 0) AS BIGINT) AS gpu_ns,
               CAST(coalesce(sum(i.kernels), 0) AS BIGINT) AS kernels
        FROM frames f LEFT JOIN children c USING (frame_id) LEFT JOIN direct d USING (frame_id)
        LEFT JOIN inclusive i USING (frame_id)
        GROUP BY ALL
        """


# `--sort` keys of the operator table: the row field each sorts by, largest first ("name": A-Z).
OP_SORT = {"self_cpu": "self_cpu_ns", "cpu": "cpu_ns", "self_gpu": "self_gpu_ns", "gpu": "gpu_ns",
           "calls": "calls", "name": "name"}
OP_FIELDS = ("name", "calls", "self_cpu_ns", "self_cpu_share", "cpu_ns", "self_gpu_ns", "self_gpu_share", "gpu_ns",
             "kernels")


def run_ops(store: Store, run_id: str, sort: str = "self_gpu") -> dict:
    """A run's PyTorch operators as torch.profiler's `key_averages().table()`: per operator
    name (normalised), OP_FIELDS, sorted by `sort` (OP_SORT; ties by self GPU, self CPU, then
    name). Self CPU is the operator's own host time, its child operators' (on its thread) left
    out, as torch's `self_cpu_time_total`; self GPU the kernels it launched itself, not through
    a child operator (torch's `self_device_time_total`). `self_cpu_share` and `self_gpu_share`
    are shares of the run's summed self times (`self_cpu_ns`, `self_gpu_ns`); nested operators
    each count their own calls and totals, as in torch's table."""
    if sort not in OP_SORT:
        raise ValueError(f"--sort must be one of {', '.join(OP_SORT)}, not {sort!r}")
    info = store.arrow(f"SELECT {', '.join(RUN_FIELDS)} FROM runs WHERE run_id = ?", [run_id]).to_pylist()[0]
    totals = _totals(store, run_id)
    rows = [] if _from_launches(store, run_id) else store.arrow(_ops_sql(), {"run_id": run_id}).to_pylist()
    self_cpu = sum(r["self_cpu_ns"] for r in rows)
    self_gpu = sum(r["self_gpu_ns"] for r in rows)
    for r in rows:
        r["self_cpu_share"] = r["self_cpu_ns"] / self_cpu if self_cpu else None
        r["self_gpu_share"] = r["self_gpu_ns"] / self_gpu if self_gpu else None
    key = OP_SORT[sort]
    rows.sort(key=lambda r: (-r["self_gpu_ns"], -r["self_cpu_ns"], r["name"]))
    rows.sort(key=lambda r: r[key] if key == "name" else -r[key])
    return {**info, "by": "op", "sort": sort, "kernels": totals["kernels"], "kernel_ns": totals["kernel_ns"],
            "self_cpu_ns": self_cpu, "self_gpu_ns": self_gpu,
            "operators": [{k: r[k] for k in OP_FIELDS} for r in rows]}
