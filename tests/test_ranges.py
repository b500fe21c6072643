"""Attribution of GPU work to the code that launched it (the `host_frames`, `frame_steps` and
`launch_context` views), `traceanalyzer ranges`, and findings that name their code."""

from __future__ import annotations

import csv
import io
import json
import re
import sys

import pytest
from typer.testing import CliRunner

from traceanalyzer.cli import app
from traceanalyzer.analyses import attribution
from traceanalyzer.ranges import normalize_name, range_rows, run_ops, run_ranges
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES, shared_traces

sys.path.insert(0, str(FIXTURES))
import gen_ranges  # noqa: E402

NSYS, KINETO = "nsys/ranges.sqlite", "kineto/ranges.json"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A store holding both planted fixtures: (store, {fixture: run id})."""
    st = Store(tmp_path_factory.mktemp("ranges") / "s.duckdb")
    ids = {rel: st.ingest(FIXTURES / rel).run_id for rel in (NSYS, KINETO)}
    yield st, ids
    st.close()


def test_fixtures_regenerate_byte_identical(tmp_path):
    if not gen_ranges.gn.SCHEMA_DIR.exists():
        pytest.skip(f"{gen_ranges.gn.SCHEMA_DIR} missing")
    for new in gen_ranges.write_all(tmp_path):
        rel = new.relative_to(tmp_path)
        assert new.read_bytes() == (FIXTURES / rel).read_bytes(), f"{rel} is stale: run python fixtures/gen_ranges.py"


def _by_path(rows: list[dict]) -> dict[str, dict]:
    return {" > ".join(r["path"]): r for r in rows}


@pytest.mark.parametrize("rel, by", [(NSYS, "range"), (KINETO, "op"), (KINETO, "module"), (KINETO, "range")])
def test_every_path_has_the_planted_numbers(planted, rel, by):
    st, ids = planted
    facts = gen_ranges.planted()[rel]
    r = run_ranges(st, ids[rel], by)
    assert (r["kernels"], r["kernel_ns"], r["outside_ns"]) == (facts["kernels"], facts["kernel_ns"], facts["outside_ns"])
    got = _by_path(r["ranges"])
    want = facts[f"by_{by}"]
    assert set(got) == set(want)
    memory = by != "range" or rel == KINETO  # the Kineto trace has allocator events on its thread
    for path, w in want.items():
        g = got[path]
        assert {k: g[k] for k in ("instances", "cpu_ns", "kernels", "gpu_ns", "gpu_ops", "gpu_proj_ns")} == {
            k: w[k] for k in ("instances", "cpu_ns", "kernels", "gpu_ns", "gpu_ops", "gpu_proj_ns")}, path
        assert g["share"] == pytest.approx(w["share"]) and g["depth"] == len(g["path"]) - 1
        assert g["self_cuda_memory_bytes"] == (w["self_bytes"] if memory and rel == KINETO else None), path


def test_the_nsys_tree_by_hand(planted):
    """The numbers of nsys/ranges.sqlite worked out by hand (gen_ranges' plan): the emit_nvtx ids
    and step numbers are gone from the names, the copy counts in the projection, the loader
    thread's range holds only its own thread's kernel."""
    st, ids = planted
    rows = range_rows(st, ids[NSYS], "range")
    assert [(r["depth"], r["name"]) for r in rows] == [
        (0, "step N"), (1, "layer.0"), (2, "aten::linear"), (3, "aten::mm"), (2, "aten::relu"), (1, "layer.1"),
        (0, "loader")]
    t = _by_path(rows)
    linear = t["step N > layer.0 > aten::linear"]
    # gemm 200 us, then the copy ends 270 us after the first start: 220 us per step
    assert (linear["kernels"], linear["gpu_ns"], linear["gpu_ops"], linear["gpu_proj_ns"]) == (2, 400_000, 4, 440_000)
    assert t["step N"]["gpu_proj_ns"] == 2 * 250_000 and t["step N > layer.1"]["kernels"] == 0
    assert (t["loader"]["instances"], t["loader"]["kernels"], t["loader"]["gpu_ns"]) == (1, 1, 10_000)
    assert [r["name"] for r in range_rows(st, ids[NSYS], "range", depth=1)] == ["step N", "loader"]


@pytest.mark.parametrize("by", ["range", "op", "module"])
def test_many_runs_at_once_give_each_runs_own_tree(planted, monkeypatch, by):
    """`runs_ranges` puts several runs in one query (a run over TREE_ROWS_PER_QUERY alone): each
    run's tree is the one the one-run query gives, self CUDA memory included."""
    from traceanalyzer import ranges

    st, ids = planted
    runs = list(ids.values())
    alone = {}
    for rid in runs:
        totals = ranges._totals(st, rid)
        nodes = st.arrow(ranges._tree_sql(by), {"run_id": rid, "max_depth": 1 << 30}).to_pylist()
        alone[rid] = ranges._tree_rows([{k: v for k, v in n.items() if k != "run_id"} for n in nodes], totals)
        assert alone[rid] or by != "range"
    for limit in (10**9, 1):
        monkeypatch.setattr(ranges, "TREE_ROWS_PER_QUERY", limit)
        got = ranges.runs_ranges(st, runs, by)
        assert {rid: got[rid]["ranges"] for rid in runs} == alone
    assert any(r["self_cuda_memory_bytes"] for rows in alone.values() for r in rows) or by != "op"


def test_launch_context_names_the_innermost_frames(planted):
    st, ids = planted
    rows = st.arrow("SELECT name, kind, pid, tid, range_name, op_name, module_name, function_name "
                    "FROM run_launch_context(?) ORDER BY start_ns", [ids[KINETO]]).to_pylist()
    assert [(r["name"][:12], r["op_name"], r["module_name"], r["function_name"], r["range_name"]) for r in rows] == [
        ("ampere_sgemm", "aten::addmm", "nn.Module: Linear_0", "nn.Module: Linear_0", "ProfilerStep#0"),
        ("void bmm_ker", "aten::bmm", "nn.Module: Net_0", "model.py(10): forward", "ProfilerStep#0"),
        ("ampere_sgemm", "aten::addmm", "nn.Module: Linear_0", "nn.Module: Linear_0", "ProfilerStep#1"),
        ("void bmm_ker", "aten::bmm", "nn.Module: Net_0", "model.py(10): forward", "ProfilerStep#1")]
    nsys = st.arrow("SELECT name, kind, tid, range_name FROM run_launch_context(?) ORDER BY start_ns",
                    [ids[NSYS]]).to_pylist()
    by_name = {(r["kind"], r["name"]): r for r in nsys}
    assert by_name[("kernel", gen_ranges.LOAD)]["range_name"] == "loader"  # its own thread's range
    assert by_name[("kernel", gen_ranges.TAIL_KERNEL)]["range_name"] is None  # launched outside every range
    copies = [r for r in nsys if r["kind"] == "copy"]
    assert [r["range_name"] for r in copies] == ["aten::linear, op_id = 1000", "aten::linear, op_id = 1010"]
    # the store-wide views agree with the per-run macros
    assert st.sql("SELECT count(*) FROM launch_context WHERE run_id = ?", [ids[NSYS]]).fetchone()[0] == len(nsys)
    assert (st.sql("SELECT count(*), max(depth) FROM host_frames WHERE run_id = ? AND source = 'range'", [ids[NSYS]])
            .fetchone() == (13, 3))


NAMES = {
    "aten::to, op_id = 998949": "aten::to",
    "aten::mm, seq = 12, op_id = 7, sizes = [[2, 3], [3, 4]]": "aten::mm, sizes = [[2, 3], [3, 4]]",
    "aten::add, input_op_ids = [3, 4], op_id = 9": "aten::add",
    "<built-in method embedding of type object at 0x7f3a9c2b1e40>": "<built-in method embedding of type object at 0x?>",
    "ProfilerStep#12": "ProfilerStep#N",
    "Compute & Residual 0": "Compute & Residual N",
    "Step 0 to 10": "Step N to N",
    "1 2 3": "N N N",
    "layer.12.attn": "layer.12.attn",
    "nn.Module: Linear_0": "nn.Module: Linear_0",
    # NVIDIA pyprof's (DLProf's) ranges, as a real DLProf export names them
    "{'mod': 'Tensor', 'op': 'cuda', 'args': [{'name': '', 'type': 'tensor', 'shape': (6,), 'dtype': 'float32'}]}":
        "Tensor.cuda",
    "{'mod': 'torch.nn.functional', 'op': 'conv2d', 'args': []}": "torch.nn.functional.conv2d",
    "{'traceMarker': ['dummy_network.py:34', 'dummy_network.py:22'], "
    "'funcStack': '/<module>/dummy_network::_call_impl/dummy_network::forward/flatten'}": "flatten",
    '{"model_config": {"emit_nvtx": true}}': '{"model_config": {"emit_nvtx": true}}',
    "": "",
}


def test_names_are_normalised_alike_in_python_and_sql():
    import duckdb

    for name, want in NAMES.items():
        assert normalize_name(name) == want, name
    con = duckdb.connect()
    macro = next(d for d in attribution.DEFINES if d.name == "normalized_name")
    con.execute(macro.create())
    got = dict(con.execute("SELECT name, normalized_name(name) FROM (SELECT unnest($n) AS name)",
                           {"n": list(NAMES)}).fetchall())
    assert got == NAMES
    assert normalize_name(None) == ""


@pytest.fixture(scope="module")
def planted_db(tmp_path_factory):
    """A store file holding both planted fixtures, closed for the command line: (path, ids)."""
    db = tmp_path_factory.mktemp("ranges-cli") / "s.duckdb"
    with Store(db) as st:
        ids = {rel: st.ingest(FIXTURES / rel).run_id for rel in (NSYS, KINETO)}
    return db, ids


def _cli(*args) -> str:
    r = CliRunner().invoke(app, ["ranges", *map(str, args)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return r.stdout


def test_cli_json_csv_and_text(planted_db):
    db, ids = planted_db
    [run] = json.loads(_cli(ids[KINETO], "--store", db, "--by", "op", "--format", "json"))
    assert run["by"] == "op" and run["kernel_ns"] == 800_000 and run["outside_ns"] == 0
    assert set(run["ranges"][0]) >= {"name", "path", "depth", "instances", "cpu_ns", "kernels", "gpu_ns",
                                      "gpu_proj_ns", "share"}
    assert run["ranges"][1]["path"] == ["aten::linear", "aten::addmm"]
    rows = list(csv.DictReader(io.StringIO(_cli(ids[NSYS], "--store", db, "--format", "csv"))))
    assert rows[3]["path"] == "step N > layer.0 > aten::linear > aten::mm" and rows[3]["gpu_ns"] == "400000"
    assert rows[0]["self_cuda_memory_bytes"] == ""  # no allocator events in the nsys fixture
    text = _cli(ids[NSYS], "--store", db)
    assert "      aten::mm " in text and "launched outside every range: 20 us of kernel time (4.3%)" in text
    assert "self CUDA mem" not in text and "self CUDA mem" in _cli(ids[KINETO], "--store", db, "--by", "module")
    assert "no operators in this run" in _cli(ids[NSYS], "--store", db, "--by", "op")
    assert len(json.loads(_cli("--store", db, "--format", "json"))) == 2  # every run by default
    for args in (["--by", "kernel"], ["--format", "xml"], ["--depth", "0"], ["nothing-like-it"]):
        r = CliRunner().invoke(app, ["ranges", "--store", str(db), *args])
        assert r.exit_code == 2 and "Traceback" not in r.output, args


def test_the_html_report_has_a_where_in_the_code_tree(planted_db, tmp_path):
    db, ids = planted_db
    out = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["report", ids[KINETO], "--store", str(db), "-o", str(out)])
    assert r.exit_code == 0, r.output
    html = out.read_text()
    section = html[html.index("<h3>Where in the code</h3>"):]
    section = section[:section.index("</table>")]
    assert "<td>aten::linear</td>" in section and "<td>&nbsp;&nbsp;&nbsp;&nbsp;aten::addmm</td>" in section
    assert "aten::item" not in section  # no GPU time launched there


def test_kernel_findings_name_their_launcher_and_gaps_the_code_around_them(planted):
    st, ids = planted
    run_rules(st, [ids[KINETO]], Settings(select=["B001", "T001"]))
    rows = st.arrow("SELECT rule_id, item_kind, message, evidence FROM findings WHERE run_id = ? ORDER BY rule_id",
                    [ids[KINETO]]).to_pylist()
    b001 = [r for r in rows if r["rule_id"] == "B001"]
    assert len(b001) == 1 and b001[0]["message"].endswith("(in aten::bmm)")
    assert json.loads(b001[0]["evidence"])["launched_by"] == "aten::bmm"
    [gaps] = [r for r in rows if r["rule_id"] == "T001" and r["item_kind"] == "stream"]
    ev = json.loads(gaps["evidence"])
    facts = gen_ranges.planted()[KINETO]["T001"]
    assert ev["around"] == facts["around"] and gaps["message"].endswith(f"(in {facts['around']})")
    assert [(g["gap_ns"], g["around"]) for g in ev["worst"]] == [
        (facts["gap_ns"], "aten::item"), (80_000, "aten::linear"), (80_000, "aten::linear")]


def test_launch_sites_are_computed_once_per_pass(planted, monkeypatch):
    from traceanalyzer.rules import _code

    st, ids = planted
    calls = []
    real = _code._launch_sites
    monkeypatch.setattr(_code, "_launch_sites", lambda s, r: calls.append(r) or real(s, r))
    run_rules(st, [ids[KINETO], ids[NSYS]], Settings(select=["B001", "B002", "B003"], reuse=False))
    assert sorted(calls) == sorted(ids.values())


def test_the_joins_are_sort_based(planted):
    """Per thread, frames are placed by window sweeps and ASOF joins, never an interval-overlap
    join (quadratic where one thread has millions of ranges and launches)."""
    from traceanalyzer.ranges import _tree_sql

    st, ids = planted
    for sql, params in (("SELECT * FROM run_launch_context($run_id)", {}), (_tree_sql("op"), {"max_depth": 9})):
        plan = "\n".join(r[1] for r in st.sql(f"EXPLAIN {sql}", {"run_id": ids[KINETO], **params}).fetchall()).upper()
        assert "ASOF" in plan
        assert not any(op in plan for op in ("NESTED_LOOP", "PIECEWISE", "IE_JOIN", "CROSS_PRODUCT", "BLOCKWISE_NL"))


# -- real traces --------------------------------------------------------------------------------

REAL = ["nsys/nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite",
        "torch/TraceLens__h100__gaunernst_bert-small-uncased__1016001.json.gz"]


def _real_store(tmp_path_factory, name: str, rels: list[str]):
    """A store of these real traces (paths under ../shared/traces), with their run ids by path."""
    traces = shared_traces()
    st = Store(tmp_path_factory.mktemp(name) / "s.duckdb")
    ids = {rel: st.ingest(traces / rel).run_id for rel in rels}
    yield st, ids
    st.close()


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    yield from _real_store(tmp_path_factory, "ranges-real", REAL)


# An independent projection of the top-level ranges named like `name%`: every GPU operation
# whose launch call lies inside a range on the same thread (nsys's nvtx_gpu_proj_trace: range
# start <= call start, call end <= range end), ranges inside another range left out, by a plain
# join of the tables.
PROJECTION_SQL = """
WITH ops AS (
    SELECT a.kind, a.start_ns, a.end_ns, c.pid, c.tid, c.start_ns AS cs, c.end_ns AS ce
    FROM gpu_activity a JOIN api_calls c ON c.run_id = a.run_id AND c.call_id = a.launch_call_id
    WHERE a.run_id = $run_id
), named AS (
    SELECT * FROM ranges r WHERE run_id = $run_id AND kind = 'nvtx' AND starts_with(name, $name)
      AND NOT EXISTS (SELECT 1 FROM ranges p WHERE p.run_id = r.run_id AND p.kind = 'nvtx' AND p.pid = r.pid
                      AND p.tid = r.tid AND p.range_id <> r.range_id AND p.start_ns <= r.start_ns AND r.end_ns <= p.end_ns)
), per_range AS (
    SELECT r.range_id, count(o.kind) FILTER (WHERE o.kind = 'kernel') AS kernels,
           coalesce(max(o.end_ns) - min(o.start_ns), 0) AS proj_ns, any_value(r.end_ns - r.start_ns) AS cpu_ns
    FROM named r LEFT JOIN ops o ON o.pid = r.pid AND o.tid = r.tid AND r.start_ns <= o.cs AND o.ce <= r.end_ns
    GROUP BY r.range_id
)
SELECT count(*), sum(kernels), sum(proj_ns), sum(cpu_ns) FROM per_range
"""


def test_real_nsys_projection_matches_a_plain_containment_join(real):
    st, ids = real
    rid = ids[REAL[0]]
    rows = _by_path(range_rows(st, rid, "range"))
    for name in ("aten::linear", "aten::mul", "aten::einsum"):
        instances, kernels, proj, cpu = st.sql(PROJECTION_SQL, {"run_id": rid, "name": name + ", op_id = "}).fetchone()
        r = rows[name]
        assert (r["instances"], r["kernels"], r["gpu_proj_ns"], r["cpu_ns"]) == (instances, kernels, proj, cpu), name
    assert rows["aten::linear"]["kernels"] > 100 and rows["aten::linear > aten::matmul > aten::mm"]["kernels"] > 100


@pytest.mark.parametrize("rel", REAL)
def test_real_traces_never_attribute_more_than_the_kernel_time_per_depth(real, rel):
    st, ids = real
    for by in ("range", "op", "module"):
        r = run_ranges(st, ids[rel], by)
        per_depth: dict[int, int] = {}
        for x in r["ranges"]:
            per_depth[x["depth"]] = per_depth.get(x["depth"], 0) + x["gpu_ns"]
        assert all(ns <= r["kernel_ns"] for ns in per_depth.values()), (by, per_depth, r["kernel_ns"])
        assert r["outside_ns"] >= 0 and (not r["ranges"] or r["outside_ns"] == r["kernel_ns"] - per_depth[0])
    # every kernel of the Kineto trace was launched inside an operator, and by a launch call
    if rel.startswith("torch"):
        assert run_ranges(st, ids[rel], "op")["outside_ns"] == 0


# Per GPU operation with a launch call, of each source, the innermost frame open on the call's
# thread at the call's start by a plain search over every frame: of the frames containing it
# (start <= t < end), the one that started last, of those starting together the shortest.
BRUTE_FORCE_SQL = """
WITH lc AS (SELECT run_id, kind, item_id, pid, tid, call_start_ns AS t FROM launch_context
            WHERE call_start_ns IS NOT NULL),
     ref AS (SELECT lc.run_id, lc.kind, lc.item_id, f.source,
                    arg_max(f.frame_id, (f.start_ns, -f.end_ns, f.frame_id)) AS frame_id
             FROM lc JOIN host_frames f ON f.run_id = lc.run_id AND f.pid = lc.pid AND f.tid = lc.tid
                                       AND f.start_ns <= lc.t AND f.end_ns > lc.t
             GROUP BY ALL)
SELECT run_id, kind, item_id, source, frame_id FROM ref
"""


def test_real_launch_context_equals_a_brute_force_search(real_corpus):
    """The innermost frame of each source open at each launch call's start, found by the view's
    sweep, equals a plain search over every frame of the thread, on every run of the corpus
    (nested operators that end together, and zero-length ones, included)."""
    got = {(r[0], r[1], r[2]): list(r[3:]) for r in real_corpus.sql(
        "SELECT run_id, kind, item_id, range_id, op_id, module_id, function_id FROM launch_context "
        "WHERE call_start_ns IS NOT NULL").fetchall()}
    want = {key: [None, None, None, None] for key in got}
    for run_id, kind, item, source, frame in real_corpus.sql(BRUTE_FORCE_SQL).fetchall():
        want[(run_id, kind, item)][("range", "op", "module", "python").index(source)] = frame
    assert got == want
    assert sum(any(v is not None for v in values) for values in got.values()) > 50_000


# -- Nsight Compute: the ranges its --nvtx columns list per launch -----------------------------

def test_ncu_ranges_from_the_nvtx_columns(tmp_path):
    """details_nvtx.csv: three launches in `train_step`, the two gather launches also inside
    `aten::index_select, op_id = N` (N differs per launch: one node once normalised); GPU time
    from the duration metric; ncu records no instances, host times or projections."""
    from traceanalyzer.ingest.ncu import read

    st = Store(tmp_path / "s.duckdb")
    rid = st.ingest(FIXTURES / "ncu" / "details_nvtx.csv").run_id
    durations = {r["kernel_id"]: r["value"] for r in read(FIXTURES / "ncu" / "details_nvtx.csv")
                 .tables["kernel_metrics"].to_pylist() if r["metric_id"] == "gpu__time_duration.sum"}
    r = run_ranges(st, rid, "range")
    total = sum(durations.values())
    assert (r["kernels"], r["kernel_ns"], r["outside_ns"]) == (3, total, 0)
    rows = {" > ".join(x["path"]): x for x in r["ranges"]}
    assert list(rows) == ["train_step", "train_step > aten::index_select"]
    assert (rows["train_step"]["kernels"], rows["train_step"]["gpu_ns"], rows["train_step"]["share"]) == (3, total, 1.0)
    inner = rows["train_step > aten::index_select"]
    assert (inner["kernels"], inner["gpu_ns"], inner["depth"]) == (2, durations[0] + durations[2], 1)
    assert all(x[f] is None for x in rows.values() for f in ("instances", "cpu_ns", "gpu_proj_ns"))
    assert [x["name"] for x in run_ranges(st, rid, "range", depth=1)["ranges"]] == ["train_step"]
    assert run_ranges(st, rid, "op")["ranges"] == []
    st.close()


def test_ncu_ranges_without_durations_say_no_time(traces_dir, tmp_path):
    """PolyFHE's export has memory metrics only: the launches are counted, no time is made up."""
    with Store(tmp_path / "s.duckdb") as st:
        rid = st.ingest(traces_dir / "ncu" / "PolyFHE__ckks_HMult__ncu-ntt12-A4090-1.csv").run_id
        r = run_ranges(st, rid, "range")
    assert (r["kernels"], r["kernel_ns"], r["outside_ns"]) == (14, None, None)
    [row] = r["ranges"]
    assert (row["name"], row["kernels"], row["gpu_ns"], row["share"]) == ("compute", 14, None, None)
    out = _cli(rid, "--store", tmp_path / "s.duckdb")
    assert "compute" in out and "launched outside" not in out


# -- per operator, as torch.profiler's key_averages() ------------------------------------------

def raw_key_averages(path) -> dict[str, dict]:
    """Per operator name (normalised), straight from a Kineto JSON: calls, host time, self host
    time (less the operators directly inside it on its thread), and the kernels' time launched
    by it directly (self) or through its children (total): each kernel to the innermost operator
    open on its launch call's thread at the call's start. `ProfilerStep#N` events (operators in
    2021 traces) are steps, not operators: left out."""
    import bisect
    import gzip
    import re
    from collections import defaultdict
    from decimal import Decimal

    def ns(x):
        return int(Decimal(str(x)) * 1000)

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ops = defaultdict(list)
    for e in events:
        if e.get("cat") in ("cpu_op", "Operator") and not re.fullmatch(r"ProfilerStep#\d+", e["name"]):
            ops[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), normalize_name(e["name"])))
    rows = defaultdict(lambda: dict.fromkeys(("calls", "self_cpu_ns", "cpu_ns", "self_gpu_ns", "gpu_ns"), 0))
    parent, starts = {}, {}
    for thread, frames in ops.items():
        frames.sort(key=lambda f: (f[0], -f[1]))
        stack = []
        for i, (start, end, name) in enumerate(frames):
            while stack and frames[stack[-1]][1] <= start:
                stack.pop()
            parent[(thread, i)] = (thread, stack[-1]) if stack else None
            rows[name]["calls"] += 1
            rows[name]["cpu_ns"] += end - start
            rows[name]["self_cpu_ns"] += end - start
            if stack:
                rows[frames[stack[-1]][2]]["self_cpu_ns"] -= end - start
            stack.append(i)
        starts[thread] = [f[0] for f in frames]
    calls = {e["args"]["correlation"]: e for e in events
             if e.get("cat") in ("cuda_runtime", "Runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    for k in (e for e in events if e.get("cat") in ("kernel", "Kernel")):
        call = calls[k["args"]["correlation"]]
        thread, t = (call["pid"], call["tid"]), ns(call["ts"])
        i = bisect.bisect_right(starts.get(thread, []), t) - 1
        node = (thread, i) if i >= 0 else None
        while node is not None and not ops[thread][node[1]][0] <= t < ops[thread][node[1]][1]:
            node = parent[node]
        if node is not None:
            rows[ops[thread][node[1]][2]]["self_gpu_ns"] += ns(k["dur"])
        while node is not None:
            rows[ops[thread][node[1]][2]]["gpu_ns"] += ns(k["dur"])
            node = parent[node]
    return dict(rows)


def _table(result: dict) -> dict[str, dict]:
    return {o["name"]: {k: o[k] for k in ("calls", "self_cpu_ns", "cpu_ns", "self_gpu_ns", "gpu_ns")}
            for o in result["operators"]}


def test_the_operator_table_of_the_planted_trace(planted):
    """aten::linear (10-290 us of each step) holds aten::addmm (20-200 us), which launched the
    200 us SGEMM: linear's self CPU is 2 x 100 us, its self GPU 0 and its GPU total 400 us."""
    st, ids = planted
    r = run_ops(st, ids[KINETO])
    got = _table(r)
    assert got == raw_key_averages(FIXTURES / KINETO)
    assert got["aten::linear"] == {"calls": 2, "self_cpu_ns": 200_000, "cpu_ns": 560_000, "self_gpu_ns": 0,
                                   "gpu_ns": 400_000}
    assert got["aten::addmm"]["self_gpu_ns"] == got["aten::bmm"]["self_gpu_ns"] == 400_000
    assert r["self_gpu_ns"] == r["kernel_ns"] == 800_000 and r["self_cpu_ns"] == sum(x["self_cpu_ns"] for x in got.values())
    assert [o["name"] for o in r["operators"]][:2] == ["aten::bmm", "aten::addmm"]  # equal self GPU: more self CPU first
    assert [o["name"] for o in run_ops(st, ids[KINETO], "self_cpu")["operators"]][0] == "aten::item"
    assert [o["name"] for o in run_ops(st, ids[KINETO], "name")["operators"]] == sorted(got)
    assert run_ops(st, ids[NSYS])["operators"] == []  # NVTX ranges named like operators are no operators


KEY_AVERAGES = ["torch/kineto__tb_plugin__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
                "torch/hta__trace_diff__control__control.json.gz"]


@pytest.fixture(scope="module")
def key_averages_store(tmp_path_factory):
    yield from _real_store(tmp_path_factory, "ops-real", KEY_AVERAGES)


@pytest.mark.parametrize("rel", KEY_AVERAGES)
def test_real_operator_tables_match_the_raw_trace(key_averages_store, rel):
    """A 2021 trace (`Operator` and `Runtime` events) and a 2024 one (`cpu_op`, `cuda_runtime`):
    every operator's calls, self and total CPU and GPU time as recomputed from the JSON."""
    st, ids = key_averages_store
    r = run_ops(st, ids[rel])
    assert _table(r) == raw_key_averages(shared_traces() / rel)
    assert sum(o["self_gpu_ns"] for o in r["operators"]) <= r["kernel_ns"]
    assert any(o["self_cpu_ns"] < o["cpu_ns"] for o in r["operators"])
    assert any(o["self_gpu_ns"] < o["gpu_ns"] for o in r["operators"])


@pytest.mark.parametrize("width", [80, 200])
def test_real_tables_keep_every_number_whole_at_80_and_200_columns(key_averages_store, width):
    from rich.console import Console

    from traceanalyzer import fmt
    from traceanalyzer.report.ranges_text import print_ops, print_ranges

    st, ids = key_averages_store
    rid = ids[KEY_AVERAGES[1]]
    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True, highlight=False)
    ops = run_ops(st, rid)
    ops["operators"] = ops["operators"][:20]
    print_ops(console, ops)
    tree = run_ranges(st, rid, "range")
    print_ranges(console, tree, 20)
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    lines = text.splitlines()
    for o in ops["operators"]:  # each operator's row (its name's first line) holds its numbers, whole
        row = next(ln for ln in lines if ln.split() and o["name"].startswith(ln.split()[0])
                   and len(ln.split()[0]) >= min(len(o["name"]), 12))
        cells = [fmt.ns(o["self_cpu_ns"]), fmt.ns(o["cpu_ns"]), fmt.ns(o["self_gpu_ns"]), fmt.ns(o["gpu_ns"]),
                 fmt.num(o["calls"])]
        assert re.search(r"\s+".join(re.escape(c) for c in cells) + r"$", row.replace(" " + fmt.pct(o["self_gpu_share"]), "")
                         .replace(" " + fmt.pct(o["self_cpu_share"]), "").rstrip()), row
    header = next(ln for ln in lines if ln.startswith("operator "))
    assert ("self CPU %" in header) == (width == 200)
    assert ("(not shown at this width: self CPU %, self GPU %;" in text) == (width == 80)
    for x in tree["ranges"][:20]:
        row = next(ln for ln in lines if ln.lstrip().startswith(x["name"][:12]) and fmt.pct(x["share"]) in ln)
        assert re.search(re.escape(fmt.ns(x["cpu_ns"])) + r"\s+" + re.escape(fmt.num(x["kernels"])) + r"\s+"
                         + re.escape(fmt.ns(x["gpu_ns"])), row), row
    assert "…" not in "".join(ln[30:] for ln in lines if "ms" in ln)


def test_cli_operator_table_sort_top_and_formats(planted_db):
    db, ids = planted_db
    text = _cli(ids[KINETO], "--store", db, "--by", "op", "--top", "2", "--sort", "self_cpu")
    assert "PyTorch operators by self CPU time" in text and "... and 2 more operators" in text
    names = [ln.split()[0] for ln in text.splitlines() if ln.startswith("aten::")]
    assert names == ["aten::item", "aten::bmm"]  # 540 us and 400 us of self CPU time
    rows = list(csv.DictReader(io.StringIO(_cli(ids[KINETO], "--store", db, "--by", "op", "--format", "csv"))))
    assert len(rows) == 4 and rows[0]["name"] == "aten::bmm" and rows[0]["self_gpu_ns"] == "400000"
    [run] = json.loads(_cli(ids[KINETO], "--store", db, "--by", "op", "--format", "json", "--top", "1"))
    assert len(run["operators"]) == len(run["ranges"]) == 1 and run["operators"][0]["name"] == "aten::bmm"
    for args in (["--by", "op", "--sort", "speed"], ["--sort", "calls"], ["--top", "-1"]):
        r = CliRunner().invoke(app, ["ranges", "--store", str(db), *args])
        assert r.exit_code == 2 and "Traceback" not in r.output, args
