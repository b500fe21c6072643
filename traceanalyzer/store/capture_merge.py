"""A graph replay merged with the trace recorded while its graphs were captured.

A replay (`cudaGraphLaunch` / `hipGraphLaunch`) runs hundreds of kernels under one launch call,
with no operator, module or range recorded at replay time. The capture-phase trace
(`ingest.kineto_capture`) holds, per captured graph, its launches in order with the host frames
open at each. Here every operation of each replay is matched to a node of a captured graph:

* a replay's operations, by GPU start, are its nodes in order (one stream: the graph's order);
* the replay takes the captured graph with the same operations: the same kinds in the same
  order, and the same kernel names where the capture names them (ROCm); of several identical
  graphs (vLLM's piecewise graphs are one per layer, alike but for the layer), the first at or
  after the graph the previous replay took, in capture order, as servers replay them in the
  order they captured them;
* a replay that ran a graph's operations in another order (a graph captured on several streams
  runs its branches side by side) takes the graph with the same kinds and kernel names, as often
  each: the n-th operation of a name is the n-th captured launch of it;
* a replay no graph matches whole takes the graph of its length that agrees at the most
  positions, more than half of them: the operations that agree are placed, the others are
  unplaced with the reason; with no such graph none is placed. Nothing is placed by guess.

The capture's frames open at a placed operation's node are copied into the replay's run, on
the capture's thread and clock (moved to end before the run's first event where the two would
overlap, so that they never nest with the run's own frames), and `graph_nodes` places the
operation there: `launch_context`, `ranges` and the rules' launch sites then name the captured
code, as on an eager run. Kernels get the `external_id` of their copied operator (shapes for
S002 and B003). Merging again replaces an earlier merge.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..ingest.base import TraceError

if TYPE_CHECKING:
    import duckdb

    from ..ingest.kineto_capture import CaptureTrace

# The frames copied (source table, id column); ranges of these kinds, and no profiler steps
# (a copied step would be a step of the replay).
FRAME_TABLES = (("cpu_ops", "op_id"), ("python_functions", "function_id"), ("ranges", "range_id"))
_STEP = re.compile(r"^ProfilerStep#\d+$")
# A partial match needs more than this share of a replay's operations to agree with the graph.
MIN_AGREEING = 0.5
GRAPH_LAUNCH = "%graphlaunch%"
# Copied frames are moved to end this long before the run's first event (or the frames of the
# capture copied before them) where they would overlap.
SHIFT_MARGIN_NS = 1_000_000

REPLAY_OPS_SQL = """
SELECT c.call_id, c.start_ns AS call_start_ns, a.kind, a.item_id, a.name, a.start_ns
FROM gpu_activity a JOIN api_calls c ON c.run_id = a.run_id AND c.call_id = a.launch_call_id
WHERE a.run_id = $run_id AND c.run_id = $run_id AND c.name ILIKE '%graphlaunch%'
ORDER BY c.start_ns, c.call_id, a.start_ns, a.kind, a.item_id
"""


class CaptureMismatch(TraceError):
    """The capture holds none of the replay's graphs (a one-line message)."""


@dataclass
class MergeResult:
    run_id: str
    captures: list[str]
    replays: int = 0
    ops: int = 0
    placed: int = 0
    by_order: int = 0  # placed among several identical captured graphs
    unplaced: dict[str, int] = field(default_factory=dict)  # reason -> operations

    def line(self) -> str:
        """ "capture graph_capture.json.gz: 421/421 replayed operations placed (1 graph launch)" """
        names = ", ".join(self.captures)
        text = (f"capture {names}: {self.placed}/{self.ops} replayed operations placed "
                f"({self.replays} graph launch{'es' if self.replays != 1 else ''}")
        if self.by_order:
            text += f"; {self.by_order} by capture order among identical graphs"
        text += ")"
        if self.unplaced:
            text += "; unplaced: " + ", ".join(f"{n} {r}" for r, n in sorted(self.unplaced.items(), key=lambda x: -x[1]))
        return text


def _key(op: dict) -> tuple:
    return (op["kind"], op.get("name") if op["kind"] == "kernel" else None)


def _agrees(op: dict, node: dict) -> bool:
    return op["kind"] == node["kind"] and (node["name"] is None or op["kind"] != "kernel" or op["name"] == node["name"])


def _by_occurrence(ops: list[dict], nodes: list[dict]) -> list[int] | None:
    """The nodes of `ops` when the graph holds the same operations in another order (a graph
    captured on several streams runs its branches side by side): the n-th operation of a kind
    and kernel name is the n-th captured launch of it. None unless every kind and name occurs as
    often in both, and the capture names its kernels."""
    if len(ops) != len(nodes) or any(x["kind"] == "kernel" and x["name"] is None for x in nodes):
        return None
    queues: dict[tuple, list[int]] = {}
    for j, x in enumerate(nodes):
        queues.setdefault(_key(x), []).append(j)
    counts = {k: len(v) for k, v in queues.items()}
    for o in ops:
        counts[_key(o)] = counts.get(_key(o), 0) - 1
    if any(counts.values()):
        return None
    taken = {k: 0 for k in queues}
    out = []
    for o in ops:
        k = _key(o)
        out.append(queues[k][taken[k]])
        taken[k] += 1
    return out


def match(replays: list[list[dict]], graphs: list[list[dict]]) -> list[tuple[int | None, list[int | None], int, str]]:
    """Per replay (its operations, each with `kind` and `name`, in GPU order), the captured graph
    it ran (an index into `graphs`, each a list of nodes with `kind` and `name`, None when the
    capture names no kernel) or None; per operation its node's index in that graph (None:
    unplaced); how many graphs hold the same operations as it does; and how the nodes were told
    (`order`, or `occurrence` when the replay ran them in another order). See the module docstring."""
    out = []
    cursor = 0
    n = len(graphs)

    def first(candidates: list[int]) -> int:
        return min(candidates, key=lambda g: (g - cursor) % n)

    for ops in replays:
        whole = [g for g in range(n) if len(graphs[g]) == len(ops)
                 and all(_agrees(o, x) for o, x in zip(ops, graphs[g]))]
        if whole:
            g = first(whole)
            out.append((g, list(range(len(ops))), len(whole), "order"))
            cursor = g + 1
            continue
        reordered = {g: m for g in range(n) if (m := _by_occurrence(ops, graphs[g])) is not None}
        if reordered:
            g = first(list(reordered))
            out.append((g, reordered[g], len(reordered), "occurrence"))
            cursor = g + 1
            continue
        best, best_n = None, 0
        for k in range(n):
            g = (cursor + k) % n
            if len(graphs[g]) != len(ops):
                continue
            agree = sum(_agrees(o, x) for o, x in zip(ops, graphs[g]))
            if agree > best_n:
                best, best_n = g, agree
        if best is not None and best_n > MIN_AGREEING * len(ops):
            out.append((best, [i if _agrees(o, x) else None for i, (o, x) in enumerate(zip(ops, graphs[best]))],
                        1, "order"))
            cursor = best + 1
        else:
            out.append((None, [None] * len(ops), 0, "order"))
    return out


def _replays(con: duckdb.DuckDBPyConnection, run_id: str) -> list[list[dict]]:
    rows = con.execute(REPLAY_OPS_SQL, {"run_id": run_id}).fetchall()
    replays: list[list[dict]] = []
    last = object()
    for call_id, _, kind, item_id, name, start_ns in rows:
        if call_id != last:
            replays.append([])
            last = call_id
        replays[-1].append({"call_id": call_id, "kind": kind, "item_id": item_id, "name": name, "start_ns": start_ns})
    return replays


def _describe(ops: list[list[dict]]) -> str:
    sizes = sorted({len(x) for x in ops})
    size = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return f"{len(ops)} graph(s) of {size} operation(s)"


def plan_merge(con: duckdb.DuckDBPyConnection, run_id: str, captures: list[CaptureTrace]) -> tuple[list[dict], MergeResult, list]:
    """The `graph_nodes` rows of run `run_id` merged with `captures`, the result, and per
    capture the nodes placed (capture index, node) for copying its frames. Raises
    CaptureMismatch when the run has no graph replay, or the captures match none of it."""
    from ..ingest.kineto_capture import captured_nodes

    res = MergeResult(run_id, [c.path.name for c in captures])
    replays = _replays(con, run_id)
    if not replays:
        raise CaptureMismatch("the run has no graph launch (cudaGraphLaunch / hipGraphLaunch) with GPU work under it")
    graphs, owner = [], []  # every captured graph, and (capture index, graph index in its file)
    for ci, cap in enumerate(captures):
        for gi, nodes in enumerate(captured_nodes(cap)):
            graphs.append(nodes)
            owner.append((ci, gi))
    if not graphs:
        raise CaptureMismatch(f"capture {', '.join(res.captures)}: no stream capture (cudaStreamBeginCapture / "
                              "hipStreamBeginCapture ... EndCapture) with launches in it")
    matched = match(replays, graphs)
    res.replays = len(replays)
    rows, placed_nodes = [], []
    for r, (ops, (g, nodes, identical, told)) in enumerate(zip(replays, matched)):
        ci, gi = owner[g] if g is not None else (None, None)
        named = g is not None and any(x["name"] is not None for x in graphs[g])
        for i, op in enumerate(ops):
            ok = nodes[i] is not None
            node = graphs[g][nodes[i] if ok else i] if g is not None else None
            how = reason = None
            if ok:
                how = {"order": "name and order" if named else "order",
                       "occurrence": "name and occurrence (run in another order)"}[told]
                if identical > 1:
                    how += f", among {identical} identical graphs"
                    res.by_order += 1
                placed_nodes.append((ci, node))
            elif g is None:
                reason = "no captured graph of the replay's operations"
            else:
                reason = "the captured launch at its position names another kernel"
            res.ops += 1
            res.placed += ok
            if reason:
                res.unplaced[reason] = res.unplaced.get(reason, 0) + 1
            rows.append({"kind": op["kind"], "item_id": op["item_id"], "launch_call_id": op["call_id"], "replay": r,
                         "node": nodes[i] if ok else i, "capture_file": captures[ci].path.name if ci is not None else None,
                         "capture_graph": gi, "captured_name": node["name"] if node else None, "placed": ok,
                         "how": how, "reason": reason, "pid": node["pid"] if ok else None,
                         "tid": node["tid"] if ok else None, "at_ns": node["at_ns"] if ok else None,
                         "external_id": node["external_id"] if ok and op["kind"] == "kernel" else None,
                         "_capture": ci})
    if not res.placed:
        raise CaptureMismatch(f"{', '.join(res.captures)} holds none of this run's graphs: the replays run "
                              f"{_describe(replays)}, the capture holds {_describe(graphs)}"
                              + (" with other kernels" if any(len(g) in {len(x) for x in replays} for g in graphs) else ""))
    return rows, res, placed_nodes


def copied_frames(capture: CaptureTrace, points: list[dict]) -> dict[str, pa.Table]:
    """The frames of `capture` open at any of `points` (dicts with pid, tid, at_ns) on the
    point's thread: a frame contains a point when it starts at or before it and ends after it
    (as `launch_context` places launches)."""
    by_thread: dict[tuple, np.ndarray] = {}
    for p in points:
        by_thread.setdefault((p["pid"], p["tid"]), []).append(p["at_ns"])
    by_thread = {k: np.unique(np.array(v, dtype=np.int64)) for k, v in by_thread.items()}
    out = {}
    for table, _ in FRAME_TABLES:
        tbl = capture.tables.get(table)
        if tbl is None or not tbl.num_rows:
            continue
        pids, tids = tbl.column("pid").to_pylist(), tbl.column("tid").to_pylist()
        starts = tbl.column("start_ns").to_pylist()
        ends = tbl.column("end_ns").to_pylist()
        names = tbl.column("name").to_pylist()
        kinds = tbl.column("kind").to_pylist() if table == "ranges" else None
        keep = np.zeros(tbl.num_rows, dtype=bool)
        for i in range(tbl.num_rows):
            ts = by_thread.get((pids[i], tids[i]))
            if ts is None or starts[i] is None or ends[i] is None or ends[i] <= starts[i]:
                continue
            if kinds is not None and (kinds[i] not in ("nvtx", "user_annotation") or _STEP.match(names[i] or "")):
                continue
            j = np.searchsorted(ts, starts[i], side="left")
            keep[i] = j < len(ts) and ts[j] < ends[i]
        if keep.any():
            out[table] = tbl.filter(pa.array(keep))
    return out


def _max(con: duckdb.DuckDBPyConnection, table: str, column: str, run_id: str) -> int:
    return con.execute(f"SELECT coalesce(max({column}), -1) FROM {table} WHERE run_id = ?", [run_id]).fetchall()[0][0]


def undo(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Remove an earlier merge of run `run_id` (in the caller's transaction): its copied frames
    (the ids from those `runs.metadata.graph_capture` notes on), the kernels' external ids it
    set, its `graph_nodes`."""
    meta = _metadata(con, run_id)
    note = meta.get("graph_capture")
    if note:
        for table, key in FRAME_TABLES:
            first = note.get("first_ids", {}).get(table)
            if first is not None:
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND {key} >= ?", [run_id, first])
        con.execute("""UPDATE kernels k SET external_id = NULL FROM graph_nodes g
                       WHERE k.run_id = $r AND g.run_id = $r AND g.kind = 'kernel' AND g.item_id = k.kernel_id
                         AND g.external_id IS NOT NULL AND k.external_id = g.external_id""", {"r": run_id})
    con.execute("DELETE FROM graph_nodes WHERE run_id = ?", [run_id])


def _metadata(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    rows = con.execute("SELECT metadata FROM runs WHERE run_id = ?", [run_id]).fetchall()
    if not rows:
        raise CaptureMismatch(f"no run {run_id!r}")
    return json.loads(rows[0][0]) if rows[0][0] else {}


def write(con: duckdb.DuckDBPyConnection, run_id: str, captures: list[CaptureTrace], insert,
          hashes: list[str] | None = None) -> MergeResult:
    """Merge `captures` into run `run_id` (in the caller's transaction; `insert(name, table)`
    appends Arrow rows to a store table): `graph_nodes`, the copied frames, the kernels'
    external ids, and `runs.metadata.graph_capture` (with the captures' `hashes`, and the
    result's `line`)."""
    undo(con, run_id)
    rows, res, placed = plan_merge(con, run_id, captures)
    run_start = con.execute("SELECT start_ns FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
    next_id = {t: _max(con, t, k, run_id) + 1 for t, k in FRAME_TABLES}
    first_ids = dict(next_id)
    ext_offset = 1 + max(_max(con, "cpu_ops", "external_id", run_id), _max(con, "kernels", "external_id", run_id),
                         _max(con, "api_calls", "external_id", run_id))
    bound = run_start
    shifts = {}
    for ci, cap in enumerate(captures):
        points = [n for c, n in placed if c == ci]
        if not points:
            continue
        frames = copied_frames(cap, points)
        times = [p["at_ns"] for p in points]
        for t in frames.values():
            times += [x for x in t.column("start_ns").to_pylist() + t.column("end_ns").to_pylist() if x is not None]
        lo, hi = min(times), max(times)
        shift = 0 if bound is None or hi < bound - SHIFT_MARGIN_NS else bound - SHIFT_MARGIN_NS - hi
        shifts[ci] = shift
        bound = lo + shift if bound is None else min(bound, lo + shift)
        for table, key in FRAME_TABLES:
            tbl = frames.get(table)
            if tbl is None:
                continue
            n = tbl.num_rows
            tbl = tbl.set_column(tbl.schema.get_field_index(key), key,
                                 pa.array(np.arange(next_id[table], next_id[table] + n, dtype=np.int64)))
            next_id[table] += n
            for col in ("start_ns", "end_ns"):
                tbl = tbl.set_column(tbl.schema.get_field_index(col), col,
                                     pa.array([None if x is None else x + shift for x in tbl.column(col).to_pylist()],
                                              pa.int64()))
            if table == "cpu_ops" and "external_id" in tbl.column_names:
                tbl = tbl.set_column(tbl.schema.get_field_index("external_id"), "external_id",
                                     pa.array([None if x is None else x + ext_offset
                                               for x in tbl.column("external_id").to_pylist()], pa.int64()))
            insert(table, tbl)
    copied_ext = {x for (x,) in con.execute("SELECT external_id FROM cpu_ops WHERE run_id = ? AND op_id >= ? "
                                            "AND external_id IS NOT NULL", [run_id, first_ids["cpu_ops"]]).fetchall()}
    for r in rows:
        ci = r.pop("_capture")
        if r["placed"]:
            r["at_ns"] = r["at_ns"] + shifts.get(ci, 0)
        ext = r["external_id"]
        r["external_id"] = ext + ext_offset if ext is not None and ext + ext_offset in copied_ext else None
    insert("graph_nodes", pa.Table.from_pylist(rows))
    con.execute("""UPDATE kernels k SET external_id = g.external_id FROM graph_nodes g
                   WHERE k.run_id = $r AND g.run_id = $r AND g.kind = 'kernel' AND g.item_id = k.kernel_id
                     AND g.external_id IS NOT NULL AND k.external_id IS NULL""", {"r": run_id})
    meta = _metadata(con, run_id)
    meta["graph_capture"] = {"captures": res.captures, "replays": res.replays, "operations": res.ops,
                             "placed": res.placed, "by_order": res.by_order, "unplaced": res.unplaced,
                             "shift_ns": {captures[ci].path.name: v for ci, v in shifts.items()},
                             "first_ids": first_ids, "hashes": hashes, "line": res.line()}
    con.execute("UPDATE runs SET metadata = ?, ingested_at = now()::TIMESTAMP WHERE run_id = ?",
                [json.dumps(meta), run_id])
    return res


def capture_files(replay: Path) -> list[Path]:
    """The capture-phase traces that a replay's files say belong to it: those an
    `execution_details.json` in a `capture_traces/` folder beside the replay lists (TraceLens's
    layout, as vLLM's and SGLang's profiling scripts write it), else the Kineto traces in that
    folder whose name starts with `graph_capture`."""
    folder = replay.parent / "capture_traces"
    if not folder.is_dir() or replay.parent == folder:
        return []
    details = folder / "execution_details.json"
    found: list[Path] = []
    if details.is_file():
        try:
            entries = json.loads(details.read_text())
        except (OSError, ValueError):
            entries = []
        for e in entries if isinstance(entries, list) else []:
            name = e.get("file") if isinstance(e, dict) else None
            if isinstance(name, str) and Path(name).name == name and (folder / name).is_file():
                found.append(folder / name)
    if not found:
        found = sorted(p for p in folder.iterdir() if p.is_file() and p.name.startswith("graph_capture")
                       and p.name.endswith((".json", ".json.gz")))
    return found
