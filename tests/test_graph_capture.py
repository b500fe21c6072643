"""Graph replays merged with their capture-phase trace (`store/capture_merge.py`,
`check --capture`): the matching on planted sequences, and on the real vLLM pairs in
../shared/traces/torch-graphs, every replayed kernel placed and its time attributed, checked
against the kernel time recomputed from the raw JSON."""

from __future__ import annotations

import gzip
import json

import pytest

from traceanalyzer import ranges
from traceanalyzer.batch.scan import scan
from traceanalyzer.rules import _code
from traceanalyzer.store import Store
from traceanalyzer.store.capture_merge import CaptureMismatch, capture_files, match
from traceanalyzer.summary import graph_replays

from .conftest import shared_traces


def _ops(*names):
    return [{"kind": "copy" if n == "copy" else "kernel", "name": None if n == "copy" else n} for n in names]


def _nodes(*names, named=True):
    return [{"kind": "copy" if n == "copy" else "kernel", "name": (n if named and n != "copy" else None)} for n in names]


# -- matching ------------------------------------------------------------------------------

def test_whole_graph_matches_by_name_and_order():
    (g, nodes, identical, how), = match([_ops("a", "b", "copy")], [_nodes("x"), _nodes("a", "b", "copy")])
    assert (g, nodes, identical, how) == (1, [0, 1, 2], 1, "order")


def test_identical_graphs_are_taken_in_capture_order():
    graphs = [_nodes("embed"), _nodes("a", "b"), _nodes("a", "b"), _nodes("a", "b"), _nodes("head")]
    replays = [_ops("embed"), _ops("a", "b"), _ops("a", "b"), _ops("a", "b"), _ops("head"),
               _ops("embed"), _ops("a", "b")]  # a second forward pass starts over
    assert [m[0] for m in match(replays, graphs)] == [0, 1, 2, 3, 4, 0, 1]
    assert [m[2] for m in match(replays, graphs)] == [1, 3, 3, 3, 1, 1, 3]


def test_a_differing_kernel_is_unplaced_never_guessed():
    (g, nodes, _, _), = match([_ops("a", "b", "c", "d")], [_nodes("a", "b", "X", "d")])
    assert g == 0 and nodes == [0, 1, None, 3]
    # half or less agreeing: the graph is not taken at all
    (g, nodes, _, _), = match([_ops("a", "b", "c", "d")], [_nodes("a", "X", "Y", "d")])
    assert g is None and nodes == [None] * 4
    (g, nodes, _, _), = match([_ops("a", "b")], [_nodes("a", "b", "c")])  # another length
    assert g is None and nodes == [None, None]


def test_a_graph_run_in_another_order_matches_by_occurrence():
    # captured a, b, a, c on two streams; the GPU ran the branches side by side: a, a, b, c
    (g, nodes, _, how), = match([_ops("a", "a", "b", "c")], [_nodes("a", "b", "a", "c")])
    assert (g, nodes, how) == (0, [0, 2, 1, 3], "occurrence")
    # without kernel names (CUDA) only kinds and order can be compared: positions it is
    (g, nodes, _, how), = match([_ops("a", "a", "b", "c")], [_nodes("a", "b", "a", "c", named=False)])
    assert (g, nodes, how) == (0, [0, 1, 2, 3], "order")
    (g, nodes, _, how), = match([_ops("a", "a", "b", "c")], [_nodes("a", "b", "b", "c")])
    assert (g, nodes, how) == (0, [0, None, 2, 3], "order")  # (a partial match by position)


def test_unnamed_capture_matches_by_kind_and_order():
    (g, nodes, _, how), = match([_ops("a", "copy")], [_nodes("k", "copy", named=False)])
    assert g == 0 and nodes == [0, 1] and how == "order"
    (g, _, _, _), = match([_ops("a", "copy")], [_nodes("copy", "k", named=False)])
    assert g is None


# -- the real vLLM pairs ---------------------------------------------------------------------

PAIRS = {"decode": "TraceLens__vllm_decode_full", "piecewise": "TraceLens__vllm_prefilldecode_piecewise"}


def _pair(name):
    folder = shared_traces() / "torch-graphs" / PAIRS[name]
    if not folder.is_dir():
        pytest.skip(f"{folder} not present")
    return folder / "graph_execution.json.gz", capture_files(folder / "graph_execution.json.gz")


def _raw_replays(path):
    """From the raw JSON: per graph launch call, its kernels' durations in ns (the reader's rounding)."""
    events = json.load(gzip.open(path))["traceEvents"]
    launches = {e["args"]["correlation"] for e in events
                if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", "")}
    per = {c: [] for c in launches}
    for e in events:
        if e.get("cat") == "kernel" and e["args"].get("correlation") in launches:
            per[e["args"]["correlation"]].append(e)
    return per


def _kernel_ns(events):
    return sum(round(e["ts"] * 1000 + e["dur"] * 1000) - round(e["ts"] * 1000) for e in events)


@pytest.mark.parametrize("name,placed,launches", [("decode", 421, 1), ("piecewise", 361, 25)])
def test_every_replayed_kernel_is_placed(tmp_path, name, placed, launches):
    replay, captures = _pair(name)
    raw = _raw_replays(replay)
    assert len(raw) == launches and sum(len(v) for v in raw.values()) == placed
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(replay).run_id
        res = st.merge_capture(run_id, captures)
        assert (res.ops, res.placed, res.replays) == (placed, placed, launches)
        assert res.line().startswith(f"capture {captures[0].name}: {placed}/{placed} replayed operations placed")
        # Each replayed kernel has the operator and module that launched its node, and their
        # time is the replays' kernel time recomputed from the JSON.
        n, ns, with_op, with_module = st.sql("""
            SELECT count(*), sum(l.end_ns - l.start_ns), count(l.op_id), count(l.module_id)
            FROM launch_context l JOIN graph_nodes g USING (run_id, kind, item_id)
            WHERE l.run_id = ? AND g.placed""", [run_id]).fetchall()[0]
        assert n == with_op == with_module == placed
        assert ns == sum(_kernel_ns(v) for v in raw.values())
        # Merging again replaces the merge: the same rows, no second copy of the frames.
        counts = st.sql("SELECT (SELECT count(*) FROM cpu_ops), (SELECT count(*) FROM python_functions), "
                        "(SELECT count(*) FROM graph_nodes), (SELECT count(external_id) FROM kernels)").fetchall()
        st.merge_capture(run_id, captures)
        assert st.sql("SELECT (SELECT count(*) FROM cpu_ops), (SELECT count(*) FROM python_functions), "
                      "(SELECT count(*) FROM graph_nodes), (SELECT count(external_id) FROM kernels)").fetchall() == counts
        g = graph_replays(st, run_id)
        assert sum(r["replays"] for r in g) == launches and sum(r["placed"] for r in g) == placed


def test_ranges_on_a_merged_replay_sum_to_its_kernel_time(tmp_path):
    replay, captures = _pair("decode")
    raw = _raw_replays(replay)
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(replay).run_id
        before = ranges.run_ranges(st, run_id, "op", 1)
        st.merge_capture(run_id, captures)
        for by in ("op", "module"):
            r = ranges.run_ranges(st, run_id, by, 1)
            # The top-level frames hold every kernel once: with what launched outside them, the run's kernel time.
            assert sum(x["gpu_ns"] or 0 for x in r["ranges"]) + r["outside_ns"] == r["kernel_ns"]
        # vLLM wraps the capture in the range capture_32_FULL: it holds the whole replay.
        top = {x["name"]: x for x in ranges.run_ranges(st, run_id, "range", 1)["ranges"]}
        assert top["capture_32_FULL"]["kernels"] == 421
        assert top["capture_32_FULL"]["gpu_ns"] == _kernel_ns(next(iter(raw.values())))
        after = ranges.run_ranges(st, run_id, "op", 1)
        # Unmerged, the replay's kernels were launched outside every operator.
        assert before["outside_ns"] >= _kernel_ns(next(iter(raw.values())))
        assert after["outside_ns"] < 0.01 * after["kernel_ns"]
        sites = _code._launch_sites(st, run_id)
        assert sites[(2, "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1")]["label"] == "vllm::moe_forward"


def test_a_capture_of_other_graphs_is_refused_and_writes_nothing(tmp_path):
    replay, _ = _pair("decode")
    _, other = _pair("piecewise")
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(replay).run_id
        counts = st.sql("SELECT (SELECT count(*) FROM cpu_ops), (SELECT count(*) FROM graph_nodes)").fetchall()
        with pytest.raises(CaptureMismatch, match=r"holds none of this run's graphs: the replays run 1 graph\(s\) "
                                                  r"of 421 operation\(s\), the capture holds 25 graph\(s\) of 4-15"):
            st.merge_capture(run_id, other)
        assert st.sql("SELECT (SELECT count(*) FROM cpu_ops), (SELECT count(*) FROM graph_nodes)").fetchall() == counts


def test_check_with_the_wrong_capture_is_a_one_line_input_error(tmp_path):
    from typer.testing import CliRunner

    from traceanalyzer.cli import app

    replay, _ = _pair("decode")
    _, other = _pair("piecewise")
    r = CliRunner().invoke(app, ["check", str(replay), "--capture", str(other[0]), "--store",
                                 str(tmp_path / "s.duckdb"), "--fail-on", "never"])
    assert r.exit_code == 2
    assert "holds none of this run's graphs" in r.output
    r = CliRunner().invoke(app, ["check", str(replay), "--capture", str(_pair("decode")[1][0]), "--store",
                                 str(tmp_path / "s.duckdb"), "--fail-on", "never"])
    assert r.exit_code == 0 and "421/421 replayed operations placed" in r.output


def test_scan_pairs_each_replay_with_the_capture_beside_it(tmp_path):
    folder = shared_traces() / "torch-graphs"
    if not folder.is_dir():
        pytest.skip(f"{folder} not present")
    with Store(tmp_path / "s.duckdb") as st:
        report = scan(st, [folder], jobs=1)
        assert len(report.run_ids) == 2  # the capture traces are no runs of their own
        lines = " | ".join(f.capture for f in report.files if f.capture)
        assert "421/421 replayed operations placed" in lines and "361/361 replayed operations placed" in lines
        assert st.sql("SELECT count(*) FILTER (WHERE placed), count(*) FROM graph_nodes").fetchall() == [(782, 782)]


def test_whole_graph_executions_are_replays_of_their_graph(tmp_path):
    from .conftest import FIXTURES

    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(FIXTURES / "nsys" / "graph_memory.sqlite").run_id
        (g,) = graph_replays(st, run_id)
        assert (g["graph"], g["replays"], g["whole_graph"], g["call_name"]) == ("g3", 2, True, "cudaGraphLaunch")
        assert g["kernel_ns"] == st.sql("SELECT sum(end_ns - start_ns) FROM kernels WHERE graph_id = 3").fetchall()[0][0]


# -- inference phases ------------------------------------------------------------------------

def _step_trace(path):
    """Two decode steps and a prefill step (SGLang's annotations), one kernel each launched in them."""
    events, corr = [], 1
    for i, (name, kernel, dur) in enumerate([("step[DECODE bs=4]", "decode_k", 10.0),
                                             ("step[EXTEND bs=2 toks=100]", "prefill_k", 50.0),
                                             ("step[DECODE bs=4]", "decode_k", 12.0)]):
        t0 = 1000.0 + 200.0 * i
        events += [{"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": t0, "dur": 100.0},
                   {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 5,
                    "dur": 3.0, "args": {"correlation": corr}},
                   {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": t0 + 10, "dur": dur,
                    "args": {"device": 0, "stream": 7, "correlation": corr}}]
        corr += 1
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_phases_apart_with_budget_and_top_kernels(tmp_path):
    from traceanalyzer.summary import phases

    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(_step_trace(tmp_path / "steps.json")).run_id
        got = {p["phase"]: p for p in phases(st, run_id)}
        assert set(got) == {"decode", "prefill"}
        d, p = got["decode"], got["prefill"]
        assert (d["steps"], d["requests"], d["tokens"], d["kernels"], d["kernel_ns"]) == (2, 8, 8, 2, 22_000)
        assert (p["steps"], p["requests"], p["tokens"], p["kernel_ns"], p["kernel_ns_per_token"]) == (1, 2, 100, 50_000, 500)
        assert d["top_kernels"][0]["name"] == "decode_k" and d["top_kernels"][0]["share"] == 1
        (b,) = d["budget"]
        assert b["span_ns"] == 22_000 and sum(x["ns"] for x in b["parts"]) == b["span_ns"]


@pytest.mark.parametrize("rel,phase,tokens", [
    ("torch-graphs/TraceLens__vllm_decode_full/graph_execution.json.gz", "decode", 32),
    ("torch-graphs/TraceLens__vllm_prefilldecode_piecewise/graph_execution.json.gz", "mixed", 8192),
    ("torch/TraceLens__inference__sglang_Qwen3-8B_prefilldecode.json.gz", "prefill", 15360)])
def test_phases_of_the_real_serving_traces(tmp_path, rel, phase, tokens):
    from traceanalyzer.summary import phases

    path = shared_traces() / rel
    if not path.exists():
        pytest.skip(f"{path} not present")
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(path).run_id
        (p,) = phases(st, run_id)
        assert (p["phase"], p["steps"], p["tokens"]) == (phase, 1, tokens)
        # every kernel of these traces is launched inside the step (a replay's through its graph launch)
        assert p["kernel_ns"] == st.sql("SELECT sum(end_ns - start_ns) FROM kernels WHERE run_id = ?",
                                        [run_id]).fetchall()[0][0]


def test_a_capture_that_is_no_capture_is_said_of_the_capture(tmp_path):
    from traceanalyzer.ingest import TraceError

    from .conftest import FIXTURES

    replay, _ = _pair("decode")
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(replay).run_id
        with pytest.raises(TraceError, match=r"^capture graph_memory.sqlite: a graph capture must be a PyTorch"):
            st.merge_capture(run_id, [FIXTURES / "nsys" / "graph_memory.sqlite"])
        with pytest.raises(TraceError, match=r"^capture planted.json: no stream capture"):
            st.merge_capture(run_id, [FIXTURES / "kineto" / "planted.json"])
        with pytest.raises(TraceError, match=r"^capture nothing.json: no such file"):
            st.merge_capture(run_id, [tmp_path / "nothing.json"])
        eager = st.ingest(FIXTURES / "kineto" / "planted.json").run_id
        with pytest.raises(CaptureMismatch, match="the run has no graph launch"):
            st.merge_capture(eager, _pair("decode")[1])


# -- a planted CUDA pair on one clock --------------------------------------------------------

def _planted_pair(tmp_path):
    """A CUDA capture (launch calls name no kernel) of two operators' kernels, and a replay of it
    twice, both traces on the same times: the copied frames must move out of the replay's way."""
    cap = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamBeginCapture", "pid": 1, "tid": 1, "ts": 100.0,
            "dur": 1.0, "args": {"correlation": 1}},
           {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 110.0, "dur": 20.0,
            "args": {"External id": 7}},
           {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 115.0, "dur": 5.0,
            "args": {"correlation": 2, "External id": 7}},
           {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 140.0, "dur": 20.0,
            "args": {"External id": 8}},
           {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 145.0, "dur": 5.0,
            "args": {"correlation": 3, "External id": 8}},
           {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamEndCapture", "pid": 1, "tid": 1, "ts": 170.0,
            "dur": 2.0, "args": {"correlation": 4}}]
    rep = []
    for i, t in enumerate((100.0, 300.0)):
        corr = 10 + i
        rep += [{"ph": "X", "cat": "cpu_op", "name": "replay_step", "pid": 1, "tid": 1, "ts": t - 5, "dur": 60.0,
                 "args": {"External id": 100 + i}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": t, "dur": 8.0,
                 "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": "add_kernel", "pid": 0, "tid": 7, "ts": t + 10, "dur": 4.0,
                 "args": {"device": 0, "stream": 7, "correlation": corr, "graph id": 3}},
                {"ph": "X", "cat": "kernel", "name": "mul_kernel", "pid": 0, "tid": 7, "ts": t + 20, "dur": 6.0,
                 "args": {"device": 0, "stream": 7, "correlation": corr, "graph id": 3}}]
    (tmp_path / "capture.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": cap}))
    (tmp_path / "replay.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": rep}))
    return tmp_path / "replay.json", tmp_path / "capture.json"


def test_planted_cuda_pair_on_one_clock(tmp_path):
    replay, capture = _planted_pair(tmp_path)
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(replay).run_id
        before = ranges.run_ranges(st, run_id, "op")
        assert [r["name"] for r in before["ranges"]] == ["replay_step"]
        res = st.merge_capture(run_id, [capture])
        assert (res.placed, res.ops, res.replays) == (4, 4, 2)
        how = st.sql("SELECT DISTINCT how FROM graph_nodes").fetchall()
        assert how == [("order",)]  # CUDA names no kernel on its launch calls
        # the copied operators end before the run's first event, so they nest with nothing of it
        start = st.sql("SELECT start_ns FROM runs").fetchall()[0][0]
        assert st.sql("SELECT max(end_ns) FROM cpu_ops WHERE name LIKE 'aten::%'").fetchall()[0][0] < start
        by_op = {r["name"]: r for r in ranges.run_ranges(st, run_id, "op")["ranges"]}
        assert (by_op["aten::add"]["kernels"], by_op["aten::add"]["gpu_ns"]) == (2, 8_000)
        assert (by_op["aten::mul"]["kernels"], by_op["aten::mul"]["gpu_ns"]) == (2, 12_000)
        # the kernels carry their capture operator's External id (S002's and B003's shapes)
        assert st.sql("""SELECT k.name, o.name FROM kernels k JOIN cpu_ops o USING (run_id, external_id)
                         ORDER BY k.start_ns""").fetchall() == [("add_kernel", "aten::add"), ("mul_kernel", "aten::mul")] * 2
        (g,) = graph_replays(st, run_id)
        assert (g["graph"], g["replays"], g["min_ops"], g["placed"], g["launch_ns"]) == ("g3", 2, 2, 4, 16_000)


@pytest.mark.parametrize("name", ["decode", "piecewise"])
def test_a_merged_replay_is_not_taken_for_a_sampled_trace(tmp_path, name):
    """The operators a merge copies in carry the capture's External ids, far from the replay's
    own: T010 reads only the run's own, which the raw JSON numbers without a gap."""
    from traceanalyzer.diagnosis import diagnose_runs
    from traceanalyzer.rules.engine import Settings

    replay, captures = _pair(name)
    own = sorted({e["args"]["External id"] for e in json.load(gzip.open(replay))["traceEvents"]
                  if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})})
    assert own[-1] - own[0] + 1 == len(own)  # a complete window: no id skipped
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(replay).run_id
        st.merge_capture(run_id, captures)
        assert st.sql("SELECT count(DISTINCT external_id) FROM cpu_ops WHERE run_id = ?", [run_id]).fetchone()[0] > len(own)
        diagnose_runs(st, [run_id], Settings(select=["T010"]))
        assert st.sql("SELECT count(*) FROM findings WHERE run_id = ? AND rule_id = 'T010'", [run_id]).fetchone()[0] == 0
