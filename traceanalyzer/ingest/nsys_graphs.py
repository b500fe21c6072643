"""The nsys reader's `graph_nodes` stage: per operation a CUDA graph launch ran (the rows the
GPU stages noted in `state.graph_ops`), the node it ran, followed back through its clones
(`originalGraphNodeId`) to the `CUDA_GRAPH_NODE_EVENTS` event that created it, whose thread
and start place the operation, and the call it was captured in (`state.node_calls`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import nsys_arrow as arrow
from .nsys_sources import GRAPH_NODES
from .nsys_state import PID, TID, ReadState, process_of, store

ROOT_COLUMNS = ("process", "node_id", "at_ns", "global_tid", "capture_call_id")


def graph_nodes(state: ReadState) -> None:
    """`graph_nodes`, written only where the export has the node events (they are what ties
    a node to its code); `metadata.graph_capture` says what was placed."""
    events = state.sources.take(GRAPH_NODES)
    ops, state.graph_ops = state.graph_ops, []
    if not ops or not state.f.has(GRAPH_NODES):
        return
    ops = pa.concat_tables(ops)
    roots = _roots(state, ops, _first_events(events))
    del events
    rows = _replayed(state, ops, roots)
    if not rows.num_rows:
        return
    store(state, "graph_nodes", rows)
    state.metadata["graph_capture"] = _placed(rows)


def _first_events(events: pa.Table) -> dict[tuple[int, int], tuple]:
    """The first event per (process, node) by start: its creation, or the clone that made
    it: (original node id, start, globalTid)."""
    first: dict[tuple[int, int], tuple] = {}
    proc = process_of(arrow.array(events["global_tid"])).to_pylist()
    for p, node, orig, start, g in sorted(
            zip(proc, *(events[c].to_pylist() for c in ("node_id", "original_id", "start_ns", "global_tid"))),
            key=lambda r: (r[3] is None, r[3] or 0)):
        if p is not None and node is not None:
            first.setdefault((p, node), (orig, start, g))
    return first


def _roots(state: ReadState, ops: pa.Table, first: dict[tuple[int, int], tuple]) -> pa.Table:
    """Per (process, node) the operations ran, where its creation places it: `at_ns`, its
    `global_tid` and the call it was captured in. Nodes with no creation event are left out."""
    roots: dict[str, list] = {c: [] for c in ROOT_COLUMNS}
    state.duck.register("graph_ops", ops)
    nodes = state.duck.sql("SELECT DISTINCT process, node_id FROM graph_ops WHERE node_id IS NOT NULL").fetchall()
    state.duck.unregister("graph_ops")
    for p, node in nodes:
        key, seen = (p, node), set()
        while key in first and first[key][0] is not None and key not in seen:  # a clone: to its original
            seen.add(key)
            key = (p, first[key][0])
        # the creation: no original, a start, a thread (what places it)
        if key in first and first[key][0] is None and None not in first[key][1:]:
            at, g = first[key][1], first[key][2]
            for c, v in zip(ROOT_COLUMNS, (p, node, at, g, state.node_calls.get((g, at)))):
                roots[c].append(v)
    return pa.table(roots, schema=pa.schema([(c, pa.int64()) for c in ROOT_COLUMNS]))


def _graph_launches(state: ReadState) -> pa.Table:
    """Per API call (`call_id`), whether it launched a graph (`graphlaunch` in its name)."""
    names = state.calls.names.to_pylist()
    launches = [i for i, x in enumerate(names) if x is not None and "graphlaunch" in x.lower()]
    call_name = pc.fill_null(state.calls.table["name"], -1)
    return pa.table({"call_id": pa.array(np.arange(len(call_name), dtype=np.int64)),
                     "graph_launch": pc.is_in(call_name, pa.array(launches, call_name.type))})


def _replayed(state: ReadState, ops: pa.Table, roots: pa.Table) -> pa.Table:
    """The `graph_nodes` rows: the operations of each graph launch in start order (`node`),
    placed where their node's root is known, else with the reason they are not."""
    state.duck.register("graph_ops", ops)
    state.duck.register("graph_roots", roots)
    state.duck.register("graph_calls", _graph_launches(state))
    try:
        return state.duck.sql(f"""
            SELECT o.kind, o.item_id, o.launch_call_id,
                   CAST(dense_rank() OVER (ORDER BY o.launch_call_id) - 1 AS INTEGER) AS replay,
                   CAST(row_number() OVER (PARTITION BY o.launch_call_id ORDER BY o.start_ns, o.kind, o.item_id) - 1
                        AS INTEGER) AS node,
                   NULL::VARCHAR AS capture_file, NULL::INTEGER AS capture_graph, NULL::VARCHAR AS captured_name,
                   r.at_ns IS NOT NULL AS placed,
                   CASE WHEN r.at_ns IS NOT NULL THEN 'graph node id' END AS how,
                   CASE WHEN r.at_ns IS NOT NULL THEN NULL
                        WHEN o.whole
                          THEN 'whole-graph execution (--cuda-graph-trace=graph): its nodes were not traced'
                        WHEN o.node_id IS NULL THEN 'no graphNodeId'
                        ELSE 'no creation event for its graph node in {GRAPH_NODES}' END AS reason,
                   {PID.format(g='r.global_tid')} AS pid, {TID.format(g='r.global_tid')} AS tid, r.at_ns,
                   NULL::BIGINT AS external_id, r.capture_call_id
            FROM graph_ops o JOIN graph_calls c ON c.call_id = o.launch_call_id AND c.graph_launch
            LEFT JOIN graph_roots r ON r.process = o.process AND r.node_id = o.node_id AND NOT o.whole
            ORDER BY o.launch_call_id, node""").to_arrow_table()
    finally:
        for v in ("graph_ops", "graph_roots", "graph_calls"):
            state.duck.unregister(v)


def _placed(rows: pa.Table) -> dict:
    """`metadata.graph_capture`: how many operations were placed, and why the others were not."""
    placed = pc.sum(rows["placed"]).as_py() or 0
    replays = len(pc.unique(rows["launch_call_id"]))
    unplaced: dict[str, int] = {}
    for why in pc.drop_null(rows["reason"]).to_pylist():
        unplaced[why] = unplaced.get(why, 0) + 1
    line = (f"graph nodes ({GRAPH_NODES}): {placed}/{rows.num_rows} replayed operations placed "
            f"({replays} graph launch{'es' if replays != 1 else ''})")
    if unplaced:
        line += "; unplaced: " + ", ".join(f"{n} {r}" for r, n in sorted(unplaced.items(), key=lambda x: -x[1]))
    return {"source": GRAPH_NODES, "replays": replays, "operations": rows.num_rows,
            "placed": placed, "unplaced": unplaced, "line": line}
