"""CUDA graph replays in Nsight Systems exports (fixtures/gen_nsys_graphs.py): per-node tracing
(`--cuda-graph-trace=node`) links every replayed kernel and copy to its replay, and the node
creation events (`CUDA_GRAPH_NODE_EVENTS`) place it where its node was captured; whole-graph
tracing (`--cuda-graph-trace=graph`) is one opaque row per replay. The planted export gives the
same attribution as its Kineto twin (the same program as a replay and a capture-phase trace)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys

import pytest

from traceanalyzer import ranges
from traceanalyzer.rules import T001_launch_gaps as T001
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store
from traceanalyzer.summary import graph_replays

from .conftest import FIXTURES

sys.path.insert(0, str(FIXTURES))
import gen_nsys_graphs as gen  # noqa: E402

P = gen.PLANTED
NODES_FILE = FIXTURES / "nsys" / "graph_nodes.sqlite"
WHOLE_FILE = FIXTURES / "nsys" / "graph_whole.sqlite"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with Store(tmp_path_factory.mktemp("nsysgraphs") / "s.duckdb") as st:
        ids = {p.name: st.ingest(p).run_id for p in (NODES_FILE, WHOLE_FILE)}
        yield st, ids


def test_fixtures_regenerate_byte_identical(tmp_path):
    for new in gen.main(tmp_path):
        committed = FIXTURES / "nsys" / new.name
        if new.read_bytes() != committed.read_bytes():  # another SQLite library: the content must agree
            dump = lambda p: list(sqlite3.connect(p).iterdump())  # noqa: E731
            assert dump(new) == dump(committed), f"{new.name} is stale: run python fixtures/gen_nsys_graphs.py"


def test_every_replayed_operation_is_linked_to_its_replay(store):
    st, ids = store
    run = ids["graph_nodes.sqlite"]
    (g,) = graph_replays(st, run)
    assert (g["graph"], g["replays"], g["min_ops"], g["max_ops"], g["whole_graph"]) == (
        P["graph"], P["replays"], P["nodes"], P["nodes"], False)
    assert (g["kernels"], g["kernel_ns"]) == (P["replayed_kernels"], P["replayed_kernel_ns"])
    # The launch call is counted once per replay, never per kernel.
    assert (g["launch_ns"], g["avg_launch_ns"]) == (P["replays"] * P["launch_ns"], P["launch_ns"])
    assert (g["placed"], g["ops"]) == (P["ops"], P["ops"])
    # Each operation keeps its instantiated node's id; the replay's launch is its cudaGraphLaunch.
    rows = st.sql("""SELECT a.kind, count(*), count(DISTINCT n.graph_node_id), bool_and(c.name = 'cudaGraphLaunch')
                     FROM gpu_activity a JOIN api_calls c ON c.run_id = a.run_id AND c.call_id = a.launch_call_id
                     JOIN (SELECT run_id, 'kernel' AS kind, kernel_id AS id, graph_node_id FROM kernels UNION ALL
                           SELECT run_id, 'copy', copy_id, graph_node_id FROM copies) n
                       ON n.run_id = a.run_id AND n.kind = a.kind AND n.id = a.item_id
                     WHERE a.run_id = ? AND n.graph_node_id IS NOT NULL GROUP BY ALL ORDER BY 1""", [run]).fetchall()
    assert rows == [("copy", P["copies"], 1, True), ("kernel", P["replayed_kernels"], P["nodes"] - 1, True)]


def test_each_replayed_kernel_is_placed_where_its_node_was_captured(store):
    st, ids = store
    run = ids["graph_nodes.sqlite"]
    meta = json.loads(st.sql("SELECT metadata FROM runs WHERE run_id = ?", [run]).fetchone()[0])
    line = f"graph nodes (CUDA_GRAPH_NODE_EVENTS): {P['graph_nodes.sqlite']['line']} (3 graph launches)"
    assert meta["graph_capture"]["line"] == line
    assert meta["cuda_graph_trace"] == "Node"  # META_DATA_CAPTURE's CUDA_GRAPH_TRACE_OPTIONS:MODE
    # The innermost NVTX range open at its node's creation, per kernel: the planted program's.
    got = {}
    for name, ns in st.sql("""SELECT r.name, l.end_ns - l.start_ns FROM launch_context l
                              JOIN ranges r ON r.run_id = l.run_id AND r.range_id = l.range_id
                              JOIN graph_nodes g ON g.run_id = l.run_id AND g.kind = l.kind AND g.item_id = l.item_id
                              WHERE l.run_id = ? AND l.kind = 'kernel' AND g.placed""", [run]).fetchall():
        x = got.setdefault(name, {"kernels": 0, "gpu_ns": 0})
        x["kernels"] += 1
        x["gpu_ns"] += ns
    assert got == P["by_innermost_range"]
    # And the call that created its node: the captured launch or copy, each once per replay.
    calls = st.sql("""SELECT g.kind, c.name, count(*), count(DISTINCT c.call_id) FROM graph_nodes g
                      JOIN api_calls c ON c.run_id = g.run_id AND c.call_id = g.capture_call_id
                      WHERE g.run_id = ? AND g.at_ns BETWEEN c.start_ns AND c.end_ns GROUP BY ALL ORDER BY 1""",
                   [run]).fetchall()
    assert calls == [("copy", "cudaMemcpyAsync", P["copies"], 1),
                     ("kernel", "cudaLaunchKernel", P["replayed_kernels"], P["nodes"] - 1)]
    # `ranges`: the capture's ranges hold every replayed kernel once; the rest is the eager kernel.
    r = ranges.run_ranges(st, run, "range")
    top = {x["name"]: x for x in r["ranges"] if x["depth"] == 0}
    assert (top["graph_capture"]["kernels"], top["graph_capture"]["gpu_ns"]) == (P["replayed_kernels"],
                                                                                  P["replayed_kernel_ns"])
    assert sum(x["gpu_ns"] or 0 for x in top.values()) + r["outside_ns"] == r["kernel_ns"]


def test_whole_graph_replays_are_opaque_and_said_unplaced(store):
    st, ids = store
    run = ids["graph_whole.sqlite"]
    (g,) = graph_replays(st, run)
    assert (g["graph"], g["replays"], g["whole_graph"], g["placed"], g["ops"]) == (P["graph"], P["replays"], True, 0,
                                                                                 P["replays"])
    assert sorted(x for (x,) in st.sql("SELECT end_ns - start_ns FROM kernels WHERE run_id = ? AND graph_id = 5",
                                       [run]).fetchall()) == P["graph_whole.sqlite"]["replay_ns"]
    meta = json.loads(st.sql("SELECT metadata FROM runs WHERE run_id = ?", [run]).fetchone()[0])
    assert meta["cuda_graph_trace"] == "Graph" and meta["graph_capture"]["placed"] == 0
    (reason,) = st.sql("SELECT DISTINCT reason FROM graph_nodes WHERE run_id = ?", [run]).fetchall()
    assert reason[0].startswith("whole-graph execution (--cuda-graph-trace=graph)")
    # The whole replay is its graph launch's: inside `step N`, as launched.
    top = {x["name"]: x for x in ranges.run_ranges(st, run, "range")["ranges"] if x["depth"] == 0}
    assert top["step N"]["kernels"] == P["replays"] and not top["graph_capture"]["kernels"]


def test_a_node_without_its_creation_event_is_unplaced_not_guessed(tmp_path):
    path = tmp_path / "graph_nodes.sqlite"
    shutil.copy(NODES_FILE, path)
    with sqlite3.connect(path) as con:  # the captured attention node of layer.1, its clone kept
        con.execute("DELETE FROM CUDA_GRAPH_NODE_EVENTS WHERE graphNodeId = ?", (gen.CAPTURED_NODE_ID0 + 3,))
    with Store(tmp_path / "s.duckdb") as st:
        run = st.ingest(path).run_id
        rows = st.sql("SELECT placed, reason, count(*) FROM graph_nodes WHERE run_id = ? GROUP BY ALL ORDER BY 1",
                      [run]).fetchall()
        assert rows == [(False, "no creation event for its graph node in CUDA_GRAPH_NODE_EVENTS", P["replays"]),
                        (True, None, P["ops"] - P["replays"])]


# -- the Kineto twin -----------------------------------------------------------------------------

def _us(t_ns: int) -> float:
    return (gen.T0 + t_ns) / 1000


def _kineto_twin(tmp_path):
    """The planted program as PyTorch's profiler records it: the replay trace (steps, graph
    launches and the kernels and copies they ran) and the capture-phase trace (the same ranges
    as user annotations, the captured launch calls), on the nsys export's times."""
    plan, rep, cap, corr = gen.PLAN, [], [], 1

    def x(cat, name, s, e, pid=1, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": _us(s), "dur": (e - s) / 1000,
                "args": args}

    gpu = {"device": 0, "stream": gen.STREAM}
    for name, s, e in plan["ranges"]:
        (rep if name.startswith("step") else cap).append(x("user_annotation", name, s, e))
    for c in plan["calls"]:
        name = c["name"].rsplit("_v", 1)[0]
        if "kernel" in c:
            rep += [x("cuda_runtime", name, c["start"], c["end"], correlation=corr),
                    x("kernel", "init_weights", *c["kernel"], pid=0, tid=7, correlation=corr, **gpu)]
        elif "replay" in c:
            rep.append(x("cuda_runtime", name, c["start"], c["end"], correlation=corr))
            for op in plan["replays"][c["replay"]]["ops"]:
                if op["kind"] == "kernel":
                    rep.append(x("kernel", gen.KERNELS[op["key"]].split("(")[0].split()[-1], op["start"], op["end"],
                                 pid=0, tid=7, correlation=corr, **{"graph id": gen.GRAPH_ID}, **gpu))
                else:
                    rep.append(x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", op["start"], op["end"], pid=0, tid=7,
                                 correlation=corr, bytes=gen.COPY_BYTES, **gpu))
        elif "Instantiate" not in name:
            cap.append(x("cuda_runtime", name, c["start"], c["end"], correlation=corr))
        corr += 1
    (tmp_path / "replay.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": rep}))
    (tmp_path / "capture.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": cap}))
    return tmp_path / "replay.json", tmp_path / "capture.json"


def _tree(st, run):
    keep = ("instances", "cpu_ns", "kernels", "gpu_ns", "gpu_ops")
    return {" > ".join(x["path"]): tuple(x[k] for k in keep) for x in ranges.run_ranges(st, run, "range")["ranges"]}


def test_the_nsys_export_attributes_as_its_kineto_twin(store, tmp_path):
    st, ids = store
    run = ids["graph_nodes.sqlite"]
    replay, capture = _kineto_twin(tmp_path)
    with Store(tmp_path / "k.duckdb") as kst:
        krun = kst.ingest(replay).run_id
        res = kst.merge_capture(krun, [capture])
        assert (res.placed, res.ops, res.replays) == (P["ops"], P["ops"], P["replays"])
        assert _tree(kst, krun) == _tree(st, run)
        keep = ("graph", "replays", "min_ops", "kernels", "kernel_ns", "launch_ns", "placed", "ops", "whole_graph")
        assert [{k: g[k] for k in keep} for g in graph_replays(kst, krun)] == \
               [{k: g[k] for k in keep} for g in graph_replays(st, run)]
        # Every replayed kernel has the same innermost range in both.
        sql = """SELECT a.name, r.name FROM launch_context l
                 JOIN gpu_activity a ON a.run_id = l.run_id AND a.kind = l.kind AND a.item_id = l.item_id
                 JOIN ranges r ON r.run_id = l.run_id AND r.range_id = l.range_id
                 WHERE l.run_id = ? AND l.kind = 'kernel' ORDER BY a.start_ns"""
        short = lambda rows: [(n.split("(")[0].split()[-1], r) for n, r in rows]  # noqa: E731
        assert short(kst.sql(sql, [krun]).fetchall()) == short(st.sql(sql, [run]).fetchall())
        # T001 sees the same replays: one launch call each, the gaps before them.
        twins = []
        for s, r in ((kst, krun), (st, run)):
            run_rules(s, [r], Settings(select=["T001"]))
            twins.append(s.sql("SELECT rule_id, message, est_loss_ns, hint FROM findings WHERE run_id = ? ORDER BY ALL",
                               [r]).fetchall())
        assert twins[0] == twins[1] and [t[0] for t in twins[0]] == ["T001"]
        # The host is late between replays: the advice is not to capture a graph, which it does.
        assert "late launch" in twins[0][0][1] and twins[0][0][3] == T001.REPLAYED_LATE_HINT


def test_check_says_what_the_reader_placed(tmp_path):
    from traceanalyzer.batch.check import check_file

    with Store(tmp_path / "s.duckdb") as st:
        res = check_file(st, NODES_FILE, None)
        assert res.state == "stored" and res.capture == (
            f"graph nodes (CUDA_GRAPH_NODE_EVENTS): {P['graph_nodes.sqlite']['line']} (3 graph launches)")
        assert check_file(st, NODES_FILE, None).state == "kept"  # a file not read again says nothing new
