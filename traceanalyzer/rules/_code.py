"""The code a finding is about: the operator or range that launched its kernel, or the one the
host was in when the GPU went idle, so that a message can say "(in aten::bmm)".

Kernel findings (B001-B003, I001-I005) go through `name_launchers`: per (device, kernel name),
the innermost PyTorch operator open on the launching thread when the launch call began, else
the innermost NVTX range or user annotation (the store's `launch_context`), names normalised
(`ranges.normalize_name`), the one that launched most of the kernel's time. For a Nsight
Compute run, whose launches are on no timeline, the innermost range ncu's `--nvtx` columns list
for each launch (the store's `launch_ranges`), weighted by the launch's duration metric.
Computed once per rules pass (the run cache's memo) and only when a rule has a kernel finding to
name. Runs without host frames name nothing: traces without NVTX or operators, and ncu exports
made without `--nvtx`.

Rules given as one query take `named(sql)` as their `evaluate`. Gap findings (T001) go through
`around_gaps`: the innermost operator (else range) open on the launching thread when the GPU
went idle (a profiler step never: it says nothing of what the host did); for a gap ended by an operation of a graph replay merged with its capture
(`graph_nodes`), the one open where the capture launched that operation's node (at replay the
host was in the graph launch). Kernel launch sites read a replayed kernel's frames the same way,
through `launch_context`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analyses.steps import PROFILER_STEP
from ..kernel_library import inductor_class, inductor_ops
from ..store import Store, launch_sweep, run_cache

if TYPE_CHECKING:
    import pandas as pd

# What a kernel rule's `how` says of it (rules/docs.py writes it into the rule's page).
HOW = ("Where the trace has PyTorch operators or NVTX ranges, the message ends in the one that launched "
       "most of the kernel's time, \"(in aten::bmm)\" (unless it names it already), and the evidence names it "
       "(`launched_by`, with `launched_by_share`, the share of the kernel's time launched there).")
# Below this share of a kernel's time, its top launcher is named as one of several.
MOSTLY = 0.5
LABEL_CHARS = 60  # NVTX texts can be long (DLProf writes a dict per range)
_SOURCES = ("range", "op")

HAS_FRAMES_SQL = """
SELECT EXISTS (SELECT 1 FROM cpu_ops WHERE run_id = $run_id)
    OR EXISTS (SELECT 1 FROM ranges WHERE run_id = $run_id AND kind IN ('nvtx', 'user_annotation') AND tid IS NOT NULL)
"""
HAS_LAUNCH_RANGES_SQL = "SELECT EXISTS (SELECT 1 FROM launch_ranges WHERE run_id = $run_id)"


def _sites_sql(kernels: str) -> str:
    """Per (device, kernel name), the label that launched most of its time, and that share of
    it, over `kernels`: a query of (device_id, name, ns, raw), `raw` the launcher's name or NULL."""
    return f"""
WITH kernels AS (
    {kernels}
), by_raw AS (  -- (kernel names run to hundreds of characters: the launches grouped once, first)
    SELECT device_id, name, raw, sum(ns) AS ns, count(*) AS launches FROM kernels GROUP BY ALL
), labels AS (
    SELECT raw, normalized_name(raw) AS label FROM (SELECT DISTINCT raw FROM by_raw WHERE raw IS NOT NULL)
), per_label AS (
    SELECT k.device_id, k.name, l.label, sum(k.ns) AS ns, sum(k.launches) AS launches
    FROM by_raw k JOIN labels l USING (raw) GROUP BY ALL
), totals AS (
    SELECT device_id, name, sum(ns) AS ns FROM by_raw GROUP BY ALL
)
SELECT p.device_id, p.name, p.label, p.ns / nullif(t.ns, 0) AS share
FROM per_label p JOIN totals t ON t.device_id IS NOT DISTINCT FROM p.device_id AND t.name = p.name
QUALIFY row_number() OVER (PARTITION BY p.device_id, p.name ORDER BY p.ns DESC, p.launches DESC, p.label) = 1
"""


# A timeline's kernels, each with the innermost operator (else range) open at its launch call
# (`Store.launch_frames`: the launch_context view's frames, by sorting instead of a window).
SITES_SQL = _sites_sql("""
    SELECT a.device_id, a.name, a.end_ns - a.start_ns AS ns, coalesce(o.name, r.name) AS raw
    FROM gpu_activity a
    LEFT JOIN _ta_launch_frames f ON f.kind = 'kernel' AND f.item_id = a.item_id
    LEFT JOIN (SELECT op_id, name FROM cpu_ops WHERE run_id = $run_id) o ON o.op_id = f.op_id
    LEFT JOIN (SELECT range_id, name FROM ranges WHERE run_id = $run_id) r ON r.range_id = f.range_id
    WHERE a.run_id = $run_id AND a.kind = 'kernel'""")

# The sweep's code is part of what the kept launch sites were computed from.
_SWEEP_SOURCE = Path(launch_sweep.__file__).read_text()

# Nsight Compute's launches, each with the innermost range ncu listed for it (`launch_ranges`):
# of the launching thread's push/pop stack, else of the start/end ranges; time from the
# duration metric (a launch without it counts as a launch, not as time).
NCU_SITES_SQL = _sites_sql("""
    SELECT k.device_id, coalesce(k.name, '?') AS name, coalesce(k.duration_ns, 0) AS ns, i.raw
    FROM kernel_durations k
    LEFT JOIN (SELECT kernel_id, arg_max(name, (kind = 'push_pop')::INTEGER * 1000000 + depth) AS raw
               FROM launch_ranges WHERE run_id = $run_id GROUP BY kernel_id) i USING (kernel_id)
    WHERE k.run_id = $run_id""")


def launch_sites(store: Store, run_id: str) -> dict[tuple[Any, str], dict]:
    """(device_id, kernel name) -> {"label", "share"}: the operator or range that launched most
    of the kernel's time there, and that share of it. Once per rules pass (the run cache's memo)."""
    return run_cache.memo_for(store.run_cache, run_id, "launch_sites", lambda: _launch_sites(store, run_id))


def _launch_sites(store: Store, run_id: str) -> dict[tuple[Any, str], dict]:
    if store.sql(HAS_LAUNCH_RANGES_SQL, {"run_id": run_id}).fetchone()[0]:
        rows = store.kept_rows(run_id, "launch_sites", NCU_SITES_SQL, {"run_id": run_id})
    elif store.sql(HAS_FRAMES_SQL, {"run_id": run_id}).fetchone()[0]:
        def compute():
            store.con.register("_ta_launch_frames", store.launch_frames(run_id, _SOURCES, ("kernel",)))
            return store.con.sql(SITES_SQL, params={"run_id": run_id})
        try:
            rows = store.kept_result(run_id, "launch_sites", SITES_SQL + _SWEEP_SOURCE, compute)
        finally:
            store.con.unregister("_ta_launch_frames")
    else:
        return {}
    return {(r["device_id"], r["name"]): {"label": r["label"], "share": r["share"]} for r in rows}


# What a late launch's gaps are said to be in where operators are traced and none covers them:
# the launching thread was outside every operator (Python or framework code between ops, or a wait
# of its own: the trace cannot tell which).
OUTSIDE_OPERATORS = "outside any operator"


def phrase(label: str, share: float | None = None) -> str:
    """The message's words for code: "(in aten::bmm)", "(in aten::bmm and elsewhere)",
    "(outside any operator)", "(partly outside any operator)"; a label longer than LABEL_CHARS
    cut (the evidence keeps it whole)."""
    partly = share is not None and share < MOSTLY
    if label == OUTSIDE_OPERATORS:
        return f"({'partly ' if partly else ''}{OUTSIDE_OPERATORS})"
    if len(label) > LABEL_CHARS:
        label = label[:LABEL_CHARS - 1] + "…"
    return f"(in {label}{' and elsewhere' if partly else ''})"


def name_launchers(store: Store, run_id: str, findings: pd.DataFrame) -> pd.DataFrame:
    """`findings` (a rule's, with FINDING_COLUMNS) with each kernel finding's launcher named: the
    message ends in `phrase` (unless it names it already), the evidence gets `launched_by` and
    `launched_by_share`."""
    if findings is None or findings.empty or "item_kind" not in findings or not (findings["item_kind"] == "kernel").any():
        return findings
    compiled = compiled_kernels(store, run_id, [r["item_name"] for _, r in findings.iterrows()
                                                if r.get("item_kind") == "kernel"])
    sites = launch_sites(store, run_id)
    if not sites and not compiled:
        return findings
    out = findings.copy()
    for i, r in out.iterrows():
        if r.get("item_kind") != "kernel":
            continue
        c = compiled.get(r.get("item_name"))
        if c is not None:
            out.at[i, "evidence"] = _with(out.at[i, "evidence"], compiled=c)
        site = sites.get((device_key(r.get("device_id")), r.get("item_name")))
        if site is None:
            continue
        label = site["label"]
        if c is not None and label == r.get("item_name") and c.get("regions"):
            # Inductor's launcher is named after its kernel: the code is the compiled region around it
            label = c["regions"][0]
        if label not in r["message"]:  # B003 names a PyTorch GEMM's operator already
            out.at[i, "message"] = f"{r['message']} {phrase(label, site['share'])}"
        out.at[i, "evidence"] = _with(out.at[i, "evidence"], launched_by=label, launched_by_share=site["share"])
    return out


# Per Inductor kernel name of a run: what its launcher recorded and where it ran (compiled_kernels).
# The launcher record is the first launch's that has one, whole: kernels of one name compiled
# twice may carry two records, and fields taken from either would mix them.
COMPILED_SQL = """
WITH per_name AS (
    SELECT name, arg_min(kernel_meta, (start_ns, kernel_id)) FILTER (WHERE kernel_meta IS NOT NULL) AS meta,
           list_sort(list_distinct(list(graph_hash))) AS graphs, list_sort(list_distinct(list(region_name))) AS regions
    FROM compiled_kernels WHERE run_id = $run_id AND list_contains($names, name)
    GROUP BY name
)
SELECT name, meta->>'kernel_file' AS kernel_file, meta->>'kernel_hash' AS kernel_hash,
       meta->>'kernel_kwargs' AS kernel_kwargs, TRY_CAST(meta->>'num_warps' AS INTEGER) AS num_warps,
       TRY_CAST(meta->>'num_stages' AS INTEGER) AS num_stages, graphs, regions
FROM per_name
"""


def compiled_kernels(store: Store, run_id: str, names: list) -> dict[str, dict]:
    """Of `names`, the TorchInductor kernels', each with what a finding's evidence says of it
    (`compiled`): `generator`, `class`, `fused_ops` (from the name), and where the trace records
    them `kernel_file`, `kernel_hash`, `kernel_kwargs`, `num_warps`, `num_stages` (Inductor's
    launcher) and the compiled `graphs` (CompiledFxGraph hashes) and `regions` it ran in."""
    wanted = sorted({n for n in names if isinstance(n, str) and inductor_class(n) is not None})
    if not wanted:
        return {}
    rows = {r["name"]: r for r in store.arrow(COMPILED_SQL, {"run_id": run_id, "names": wanted}).to_pylist()} \
        if store.sql(HAS_CPU_OPS_SQL, {"run_id": run_id}).fetchone()[0] else {}
    out = {}
    for n in wanted:
        c = {"generator": "TorchInductor", "class": inductor_class(n), "fused_ops": inductor_ops(n)}
        r = rows.get(n, {})
        for k in ("kernel_file", "kernel_hash", "kernel_kwargs", "num_warps", "num_stages"):
            if r.get(k) is not None:
                c[k] = r[k]
        for k in ("graphs", "regions"):
            v = [x for x in r.get(k) or [] if x is not None]
            if v:
                c[k] = v
        out[n] = c
    return out


HAS_CPU_OPS_SQL = "SELECT EXISTS (SELECT 1 FROM cpu_ops WHERE run_id = $run_id)"


def device_key(device_id):
    """A DataFrame's device id as the sites' key (NaN and pandas NA: None)."""
    try:
        return None if device_id is None or device_id != device_id else int(device_id)
    except TypeError:  # pandas NA
        return None


def _with(evidence, **fields) -> dict | str:
    """The evidence with `fields` added: a dict as a dict (the engine writes it out), JSON text as
    JSON text."""
    if isinstance(evidence, str):
        return json.dumps({**json.loads(evidence), **fields}, sort_keys=True)
    return {**(evidence if isinstance(evidence, dict) else {}), **fields}


def named(sql: str):
    """An `evaluate` for a rule given as one SQL query: the query's findings through `name_launchers`."""
    def evaluate(store: Store, run_id: str, params: dict) -> pd.DataFrame:
        from .engine import query  # here: the engine imports every rule module

        return name_launchers(store, run_id, query(store, sql, {"run_id": run_id, **params}))
    return evaluate


AROUND_SQL = f"""
WITH gaps AS (
    SELECT unnest($key::BIGINT[]) AS key, unnest($device::INTEGER[]) AS device_id, unnest($kind::VARCHAR[]) AS kind,
           unnest($item::BIGINT[]) AS item_id, unnest($start::BIGINT[]) AS start_ns, unnest($end::BIGINT[]) AS end_ns,
           unnest($from::BIGINT[]) AS from_ns, unnest($to::BIGINT[]) AS to_ns
), threads AS (  -- the thread that launched the operation ending each gap (of several, the first launched),
    -- the gap's start and its window (none for an operation of a graph replay merged with its
    -- capture: the moment the capture launched its node stands for the start)
    SELECT g.key, arg_min(coalesce(n.at_ns, g.start_ns), c.start_ns) AS s,
           arg_min(CASE WHEN n.at_ns IS NULL THEN g.from_ns END, c.start_ns) AS a,
           arg_min(CASE WHEN n.at_ns IS NULL THEN g.to_ns END, c.start_ns) AS b,
           arg_min(coalesce(n.pid, c.pid), c.start_ns) AS pid, arg_min(coalesce(n.tid, c.tid), c.start_ns) AS tid
    FROM gaps g
    JOIN gpu_activity a ON a.run_id = $run_id AND a.device_id = g.device_id AND a.start_ns = g.end_ns
                       AND (g.kind IS NULL OR (a.kind = g.kind AND a.item_id = g.item_id))
    JOIN api_calls c ON c.run_id = $run_id AND c.call_id = a.launch_call_id
    LEFT JOIN graph_nodes n ON n.run_id = $run_id AND n.placed AND n.kind = a.kind AND n.item_id = a.item_id
    GROUP BY g.key
), frames AS (  -- open at the gap's start, or covering at least half of its window; a profiler
    -- step never (a step running says nothing of what the host did); a join on the thread: the
    -- gaps are few, and each frame is read once
    SELECT * FROM (
        SELECT p.key, f.source, f.name, f.start_ns,
               p.b > p.a AND f.start_ns < p.b AND (f.end_ns > p.a OR f.end_ns IS NULL)
                 AND 2 * (least(coalesce(f.end_ns, p.b), p.b) - greatest(f.start_ns, p.a)) >= p.b - p.a AS in_window,
               f.start_ns <= p.s AND (f.end_ns > p.s OR f.end_ns IS NULL) AS at_start
        FROM threads p JOIN (
            SELECT 'op' AS source, name, pid, tid, start_ns, end_ns FROM cpu_ops WHERE run_id = $run_id
            UNION ALL
            SELECT 'range', name, pid, tid, start_ns, end_ns FROM ranges
            WHERE run_id = $run_id AND kind IN ('nvtx', 'user_annotation')
        ) f ON f.pid = p.pid AND f.tid = p.tid AND f.start_ns < greatest(p.s + 1, coalesce(p.b, p.s))
           AND (f.end_ns > least(p.s, coalesce(p.a, p.s)) OR f.end_ns IS NULL)
        WHERE NOT regexp_matches(f.name, '{PROFILER_STEP}'))
    WHERE in_window OR at_start
), innermost AS (  -- the window's frames where it has some, else those open at the start; an
    -- operator before a range; of each, the one that started last
    SELECT key, name FROM frames
    QUALIFY row_number() OVER (PARTITION BY key ORDER BY in_window DESC, source = 'op' DESC, start_ns DESC, name) = 1
)
SELECT key, normalized_name(name) AS label FROM innermost
"""


def around_gaps(store: Store, run_id: str, gaps: list[dict]) -> list[str | None]:
    """For each GPU idle gap (`device_id`, `start_ns`, `end_ns`, and `after_kind`/`after_id`, the
    operation that ends it, when known): the code the host was in, on the thread that launched the
    operation ending the gap, when the GPU went idle (`start_ns`) or, where the gap gives a window
    (`from_ns`, `to_ns`), through at least half of it: the normalised name of the innermost operator
    so open, else of the innermost range (a profiler step never); None when none is known."""
    if not gaps or not store.sql(HAS_FRAMES_SQL, {"run_id": run_id}).fetchone()[0]:
        return [None] * len(gaps)
    rows = store.sql(AROUND_SQL, {
        "run_id": run_id, "key": list(range(len(gaps))), "device": [g["device_id"] for g in gaps],
        "kind": [g.get("after_kind") for g in gaps], "item": [g.get("after_id") for g in gaps],
        "start": [g["start_ns"] for g in gaps], "end": [g["end_ns"] for g in gaps],
        "from": [g.get("from_ns", g["start_ns"]) for g in gaps],
        "to": [g.get("to_ns", g.get("from_ns", g["start_ns"])) for g in gaps]}).fetchall()
    labels = dict(rows)
    return [labels.get(i) for i in range(len(gaps))]
