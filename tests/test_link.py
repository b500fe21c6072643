"""An Nsight Compute run linked to the timeline (nsys, Kineto) of the same program: name
normalisation, matching launches, the stored links, the ncu-based rules on the timeline's
kernels, and the commands that link (check, scan, link). Facts from fixtures/gen_linked.py."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from traceanalyzer import link
from traceanalyzer.batch.check import CheckOptions, run_check
from traceanalyzer.cli import app
from traceanalyzer.report.json_report import render as render_json
from traceanalyzer.report.model import load_result
from traceanalyzer.store import Store

from .conftest import FIXTURES

LINKED = FIXTURES / "linked"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_linked", FIXTURES / "gen_linked.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
P = GEN.PLANTED
NSYS, KINETO, NCU = (LINKED / P["files"][k] for k in ("nsys", "kineto", "ncu"))


def test_fixtures_regenerate_byte_identical(tmp_path):
    for path in GEN.write_all(tmp_path):
        assert path.read_bytes() == (LINKED / path.name).read_bytes(), path.name


# -- names ------------------------------------------------------------------------------------

# One kernel as nsys 2024+ (NVIDIA's demangler), Kineto (the C++ ABI's) and an ncu of another
# version write it; the nsys spellings are those of the real nsys-ai H100 export.
SPELLINGS = [
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase &)"
     "::[lambda() (instance 2)]::operator ()() const::[lambda() (instance 2)]::operator ()() const::[lambda(float) "
     "(instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)",
     "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)::"
     "{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >"
     "(int, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}"
     "::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)"),
    ("void gemv2T_kernel_val<int, int, double, (int)128, (bool)0>(T13, T6, T6)",
     "void gemv2T_kernel_val<int, int, double, 128, false>(int, double const*, double*)"),
    ("void <unnamed>::k<float>(const float *, int)", "void (anonymous namespace)::k<float>(float const*, int)"),
]


@pytest.mark.parametrize("nvidia,abi", SPELLINGS)
def test_one_kernel_spelled_by_nvidia_and_the_abi_has_one_key(nvidia, abi):
    assert link.name_keys(nvidia)[1] == link.name_keys(abi)[1]


def test_different_kernels_keep_different_keys():
    keys = {link.name_keys(n)[1] for n in (
        "void k<(int)4>(float *)", "void k<(int)8>(float *)", "void k<float>(float *)",
        "void at::native::f<(int)4, at::native::[lambda(float) (instance 1)]>(int, T2)",
        "void at::native::f<(int)4, at::native::[lambda(float) (instance 2)]>(int, T2)")}
    assert len(keys) == 5
    assert link.name_keys("k(float *)")[0] != link.name_keys("k(double *)")[0]  # overloads, with parameters


def test_function_names_from_demangled_and_mangled_names():
    assert link.function_name(None, "_Z15bias_act_kernelPfPKfi") == "bias_act_kernel"
    assert link.function_name("_Z16gemm_tile_kernelIfLi128ELi8EEvPKT_S2_PS0_iii") == "gemm_tile_kernel"
    assert link.function_name(None, P["names"]["rsqrt"]["mangled"]) == "vectorized_elementwise_kernel"
    assert link.function_name("calculate_temp") == "calculate_temp"  # ncu --print-kernel-base function
    assert link.function_name(P["names"]["gemm"]["nsys"]) == "gemm_tile_kernel"


# -- matching ---------------------------------------------------------------------------------

def _config(name, grid, launches=1, first_id=0, *, block=(256, 1, 1), mangled=None, device=0):
    return {"device_id": device, "name": name, "mangled_name": mangled, **_dims(grid, block),
            "launches": launches, "first_id": first_id, "first_start_ns": first_id}


def _dims(grid, block):
    g = grid or (None, None, None)
    b = block or (None, None, None)
    return {"grid_x": g[0], "grid_y": g[1], "grid_z": g[2], "block_x": b[0], "block_y": b[1], "block_z": b[2]}


def _launch(kernel_id, name, grid, block=(256, 1, 1), device=0):
    return {"kernel_id": kernel_id, "device_id": device, "name": name, **_dims(grid, block)}


def _ncu(kernel_id, name, grid=None, block=None):
    return {"kernel_id": kernel_id, "name": name, **_dims(grid, block if grid else None)}


def test_launch_order_tells_configurations_apart_without_grid_and_block():
    # an old ncu export (no Grid Size / Block Size columns) of a kernel run in two configurations
    launches = [_launch(0, "k(float *)", (64, 1, 1)), _launch(1, "k(float *)", (8, 1, 1)),
                _launch(2, "k(float *)", (64, 1, 1)), _launch(3, "k(float *)", (8, 1, 1))]
    configs = [_config("k(float *)", (64, 1, 1), launches=2, first_id=0), _config("k(float *)", (8, 1, 1), 2, 1)]
    rows = link.match(configs, launches, [_ncu(10, "k(float*)"), _ncu(11, "k(float*)"), _ncu(12, "k(float*)"),
                                          _ncu(13, "k(float*)"), _ncu(14, "k(float*)")])
    by_id = {r["ncu_kernel_id"]: r for r in rows if r["ncu_kernel_id"] is not None}
    assert [by_id[i]["kernel_id"] for i in (10, 11, 12, 13)] == [0, 1, 2, 3]
    assert {by_id[i]["launch_match"] for i in (10, 11, 12, 13)} == {"launch order"}
    assert (by_id[11]["grid_x"], by_id[12]["grid_x"]) == (8, 64)  # the configuration of the launch matched
    assert by_id[14]["side"] == "ncu" and "to match in order" in by_id[14]["unmatched"]  # never guessed
    assert not [r for r in rows if r["side"] == "timeline"]


def test_grid_and_block_then_order_within_the_configuration():
    launches = [_launch(i, "k(float *)", (64 if i % 2 else 8, 1, 1)) for i in range(6)]
    configs = [_config("k(float *)", (8, 1, 1), 3, 0), _config("k(float *)", (64, 1, 1), 3, 1),
               _config("other(int)", (1, 1, 1), 1, 9)]
    ncu = [_ncu(0, "k(float *)", (64, 1, 1), (256, 1, 1)), _ncu(1, "k(float *)", (64, 1, 1), (256, 1, 1)),
           _ncu(2, "k(float *)", (32, 1, 1), (256, 1, 1))]
    rows = link.match(configs, launches, ncu)
    by_id = {r["ncu_kernel_id"]: r for r in rows if r["ncu_kernel_id"] is not None}
    assert (by_id[0]["kernel_id"], by_id[1]["kernel_id"]) == (1, 3)
    assert by_id[0]["launch_match"] == "grid and block" and by_id[0]["name_match"] == "name"
    assert by_id[2]["side"] == "ncu" and "not grid (32, 1, 1)" in by_id[2]["unmatched"]
    unprofiled = {(r["name"], r["grid_x"]) for r in rows if r["side"] == "timeline"}
    assert unprofiled == {("k(float *)", 8), ("other(int)", 1)}


def test_more_ncu_launches_than_the_timeline_has_keep_the_configuration_but_no_launch():
    rows = link.match([_config("k(float *)", (8, 1, 1), 1, 5)], [_launch(5, "k(float *)", (8, 1, 1))],
                      [_ncu(0, "k(float *)", (8, 1, 1), (256, 1, 1)), _ncu(1, "k(float *)", (8, 1, 1), (256, 1, 1))])
    assert [(r["side"], r["kernel_id"]) for r in rows] == [("both", 5), ("both", None)]


def test_names_match_by_mangled_name_and_by_a_unique_function_name_only():
    mangled = "_Z15bias_act_kernelPfPKfi"
    names = ["bias_act_kernel(float *, const float *, int)", "void scale<float>(float *)",
             "void scale<double>(double *)", "void ns::unique_kernel<(int)4>(T1 *)"]
    configs = [_config(n, (8, 1, 1), 1, i, mangled=mangled if i == 0 else None) for i, n in enumerate(names)]
    launches = [_launch(i, n, (8, 1, 1)) for i, n in enumerate(names)]
    rows = link.match(configs, launches, [_ncu(0, mangled), _ncu(1, "unique_kernel"), _ncu(2, "scale"),
                                          _ncu(3, "void scale<double>(double *)"), _ncu(4, "bias_act_kernel")])
    by_id = {r["ncu_kernel_id"]: r for r in rows if r["ncu_kernel_id"] is not None}
    assert by_id[0]["name_match"] == "mangled" and by_id[0]["kernel_id"] == 0
    assert by_id[1]["name_match"] == "function" and by_id[1]["kernel_id"] == 3  # ncu --print-kernel-base function
    assert by_id[2]["side"] == "ncu" and "2 timeline kernels" in by_id[2]["unmatched"]  # scale<float> or <double>?
    assert by_id[3]["name_match"] == "name" and by_id[3]["kernel_id"] == 2
    # no template, no parameters: the name; the timeline's one launch of it is ncu launch 0's already
    assert (by_id[4]["name_match"], by_id[4]["side"], by_id[4]["kernel_id"]) == ("name", "both", None)


# -- the fixtures linked ------------------------------------------------------------------------

@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "s.duckdb") as st:
        yield st


def _ingest(st, *paths):
    return [st.ingest(p).run_id for p in paths]


@pytest.mark.parametrize("timeline", [NSYS, KINETO], ids=["nsys", "kineto"])
def test_fixture_links_are_the_planted_ones(store, timeline):
    run_id, ncu_id = _ingest(store, timeline, NCU)
    res = link.link_runs(store, run_id, ncu_id)
    got = {r["ncu_kernel_id"]: r["kernel_id"] for r in res.rows if r["side"] == "both"}
    assert got == {i: k for i, k in P["links"].items() if k is not None}
    assert {r["name_match"] for r in res.matched} == {"name"}  # every ncu name spelled unlike the timeline's
    unmatched = {r["ncu_kernel_id"]: r["unmatched"] for r in res.ncu_unmatched}
    assert sorted(unmatched) == sorted(P["ncu_unmatched"])
    assert unmatched[0] == P["ncu_unmatched"][0]
    assert "not grid (512, 1, 1)" in unmatched[max(unmatched)]
    side = "kineto" if timeline == KINETO else "nsys"
    assert sorted(r["name"] for r in res.timeline_unmatched) == sorted(P["names"][k][side] for k in P["timeline_unmatched"])
    assert all("not profiled by ncu (4 launch(es)" in r["unmatched"] for r in res.timeline_unmatched)
    stored = link.stored_links(store, run_id)
    assert len(stored) == P["ncu_launches"] + len(P["timeline_unmatched"]) and {r["ncu_run_id"] for r in stored} == {ncu_id}
    again = link.link_runs(store, run_id, ncu_id)
    assert not again.changed and len(link.stored_links(store, run_id)) == len(stored)


def test_linking_refuses_two_timelines(store):
    a, b = _ingest(store, NSYS, KINETO)
    with pytest.raises(link.LinkError, match="Nsight Compute run"):
        link.link_runs(store, a, b)


def test_what_a_run_is_to_a_link_comes_from_its_data(store):
    files = {"timeline": [NSYS, KINETO], "ncu": [NCU, FIXTURES / "ncu-rep" / "synthetic.ncu-rep",
                                                FIXTURES / "ncu-text" / "text_2023.txt"],
             "neither": [FIXTURES / "torch-memory" / "snapshot_oom.pickle"]}
    ids = {role: _ingest(store, *paths) for role, paths in files.items()}
    roles = link.run_roles(store, [i for group in ids.values() for i in group] + ["not-stored"])
    assert roles == {i: role for role, group in ids.items() for i in group}
    with pytest.raises(link.LinkError, match="is neither"):
        link.link_runs(store, ids["neither"][0], ids["ncu"][1])


def test_replacing_the_timeline_run_drops_its_links(store):
    run_id, ncu_id = _ingest(store, NSYS, NCU)
    link.link_runs(store, run_id, ncu_id)
    store.delete_run(run_id)
    assert store.sql("SELECT count(*) FROM kernel_links").fetchone()[0] == 0


def test_pairs_side_by_side_and_given_together(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    runs = [(str(a / "step.sqlite"), "t1", "timeline"), (str(a / "step.pt.trace.json"), "t2", "timeline"),
            (str(a / "step.ncu.csv"), "n1", "ncu"), (str(a / "other.ncu-rep"), "n2", "ncu"),
            (str(b / "x.sqlite"), "t3", "timeline"), (str(b / "kernels.csv"), "n3", "ncu"),
            (str(b / "snapshot.pickle"), "m1", "neither")]
    assert sorted(link.pairs(runs)) == [("t1", "n1"), ("t2", "n1"), ("t3", "n3")]
    assert link.pairs([runs[4], runs[2]]) == []  # different folders, different stems
    assert link.pairs([runs[4], runs[2]], given_together=True) == [("t3", "n1")]


# -- the ncu rules on the linked timeline --------------------------------------------------------

def _findings(st, run_id, rule=None):
    rows = st.arrow("SELECT * FROM findings WHERE run_id = $r AND ($rule IS NULL OR rule_id = $rule) "
                    "ORDER BY finding_no", {"r": run_id, "rule": rule}).to_pylist()
    for r in rows:
        r["evidence"] = json.loads(r["evidence"]) if r["evidence"] else {}
    return rows


def _kernel(rows, key):
    return [r for r in rows if r["item_name"] in (P["names"][key]["nsys"], P["names"][key]["kineto"])]


@pytest.mark.parametrize("timeline", [NSYS, KINETO], ids=["nsys", "kineto"])
def test_check_given_both_puts_ncu_findings_on_the_timeline_kernels(store, timeline):
    result = run_check(store, CheckOptions(paths=[str(timeline), str(NCU)], fail_on="never"))
    assert not result.errors and not result.rule_errors()
    run_id = store.resolve_run(timeline.name)
    gemm = {r["rule_id"]: r for r in _kernel(_findings(store, run_id), "gemm")}
    assert {"B002", "B003", "B004", "I001", "I002"} <= set(gemm)
    b003 = gemm["B003"]
    ev = b003["evidence"]
    assert ev["timeline_run_id"] == run_id and ev["ncu_run_id"] == store.resolve_run(NCU.name)
    assert ev["kernel_time_ns"] == P["kernel_ns"]["gemm"]
    assert ev["kernel_share"] == pytest.approx(P["kernel_share"]["gemm"])
    assert ev["loss_share"] == pytest.approx(P["gemm_b003_fraction"])
    assert b003["rule_loss_ns"] == round(P["gemm_b003_fraction"] * P["kernel_ns"]["gemm"])
    assert ev["launched_by"] == "aten::mm" and "(in aten::mm)" in b003["message"]
    assert b003["item_id"] == P["links"][1] and b003["device_id"] == 0 and b003["claims"] == "compute"
    # one root cause per kernel, its loss bounded by the kernel's time in the timeline
    heads = [r for r in gemm.values() if r["related_to"] is None]
    assert len(heads) == 1 and heads[0]["est_loss_ns"] <= P["kernel_ns"]["gemm"]
    (i004,) = _kernel(_findings(store, run_id, "I004"), "transpose")
    assert i004["rule_loss_ns"] == pytest.approx(P["transpose_i004_fraction"] * P["kernel_ns"]["transpose"], abs=1)
    assert i004["evidence"]["launched_by"] == "my_ext::transpose"
    (i001,) = _kernel(_findings(store, run_id, "I001"), "transpose")
    assert i001["evidence"]["reason"] == "short_scoreboard"
    # ncu's kernels the timeline lacks get no finding on it
    assert not [r for r in _findings(store, run_id) if "warmup" in r["item_name"]]


def test_b002_reads_ncu_achieved_occupancy_on_a_linked_timeline(store):
    run_check(store, CheckOptions(paths=[str(NSYS), str(NCU)], fail_on="never"))
    run_id = store.resolve_run(NSYS.name)
    (bias,) = _kernel(_findings(store, run_id, "B002"), "bias")
    assert bias["evidence"]["achieved"] == pytest.approx(P["bias_small_achieved"])
    assert bias["evidence"]["achieved_source"] == "ncu"
    assert bias["evidence"]["kernel_time_ns"] == P["kernel_ns"]["bias"]


def test_a_rule_applies_when_any_linked_ncu_run_has_its_data(store, tmp_path):
    from traceanalyzer.rules.engine import applies
    from traceanalyzer.rules.I004_bank_conflicts import RULE as I004

    from traceanalyzer.store import file_hash, run_id_for

    # the same launches profiled again without the shared-memory metrics I004 reads, its run id
    # (a content hash) made to sort before the full run's, so that it is the first linked run
    lines = [line for line in NCU.read_text().splitlines(keepends=True) if "_mem_shared_op_" not in line]
    partial = tmp_path / "partial.ncu.csv"
    for blank in range(1000):
        partial.write_text("".join(lines) + "\n" * blank)
        if run_id_for(file_hash(partial)) < run_id_for(file_hash(NCU)):
            break
    run_id, partial_id, ncu_id = _ingest(store, NSYS, partial, NCU)
    assert partial_id < ncu_id and not applies(store, I004, partial_id)
    assert not applies(store, I004, run_id)
    link.link_runs(store, run_id, partial_id)
    assert not applies(store, I004, run_id)
    link.link_runs(store, run_id, ncu_id)
    assert applies(store, I004, run_id)


def test_without_the_link_the_timeline_has_no_ncu_findings(store):
    run_check(store, CheckOptions(paths=[str(NSYS), str(NCU)], fail_on="never", link=False))
    run_id = store.resolve_run(NSYS.name)
    rules = {r["rule_id"] for r in _findings(store, run_id)}
    assert not rules & {"B003", "B004", "I001", "I002", "I004"}
    assert not _kernel(_findings(store, run_id, "B002"), "bias")  # 100% theoretical; no measurement
    assert store.sql("SELECT count(*) FROM kernel_links").fetchone()[0] == 0


def test_json_report_carries_the_timeline_facts(store):
    run_check(store, CheckOptions(paths=[str(KINETO), str(NCU)], fail_on="never"))
    run_id = store.resolve_run(KINETO.name)
    doc = json.loads(render_json(load_result(store, [run_id])))
    linked = [f for f in doc["findings"] if f["rule_id"] in ("B003", "I001", "I002", "I004")]
    assert linked and all({"timeline_run_id", "kernel_time_ns", "kernel_share"} <= set(f["evidence"]) for f in linked)
    for f in linked:  # and at the top of the finding, as the report's readers look for them
        assert (f["timeline_run_id"], f["kernel_time_ns"], f["kernel_share"]) == (
            run_id, f["evidence"]["kernel_time_ns"], f["evidence"]["kernel_share"])
        assert 0 < f["kernel_share"] <= 1 and f["kernel_time_ns"] > 0
    assert all("timeline_run_id" not in f for f in doc["findings"] if f["rule_id"] not in
               ("B002", "B003", "B004", "I001", "I002", "I003", "I004", "I005"))


def test_scan_links_files_side_by_side_once(tmp_path):
    from traceanalyzer.batch.scan import scan

    folder = tmp_path / "program"
    folder.mkdir()
    for f in (NSYS, KINETO, NCU):
        shutil.copyfile(f, folder / f.name)
    with Store(tmp_path / "s.duckdb") as st:
        first = scan(st, [folder], jobs=1)
        assert sorted(len(r.matched) for r in first.links) == [10, 10]
        nsys_id = st.resolve_run(str(folder / NSYS.name))
        before = {(r["rule_id"], r["item_name"], r["rule_loss_ns"]) for r in _findings(st, nsys_id)}
        assert any(rule == "I004" for rule, _, _ in before)
        again = scan(st, [folder], jobs=1)
        assert {f.state for f in again.files} == {"skipped"} and not any(r.changed for r in again.links)
        assert {(r["rule_id"], r["item_name"], r["rule_loss_ns"]) for r in _findings(st, nsys_id)} == before


# -- commands -----------------------------------------------------------------------------------

runner = CliRunner()


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"}, catch_exceptions=False)


def test_link_command_lists_the_unmatched_and_runs_the_rules(tmp_path):
    db = tmp_path / "s.duckdb"
    assert _cli("ingest", NSYS, NCU, "--store", db).exit_code == 0
    res = _cli("link", NSYS.name, NCU.name, "--store", db)
    assert res.exit_code == 0, res.output
    assert "10 of 12 ncu launch(es) matched" in res.output
    assert "unmatched ncu launch: ID 0 warmup_kernel" in res.output and "unmatched timeline kernel:" in res.output
    with Store(db, read_only=True) as st:
        assert _findings(st, st.resolve_run(NSYS.name), "I004")
    doc = json.loads(_cli("link", NSYS.name, NCU.name, "--store", db, "--format", "json").output)
    assert len([r for r in doc["links"] if r["side"] == "both"]) == 10
    bad = runner.invoke(app, ["link", NSYS.name, NSYS.name, "--store", str(db)])
    assert bad.exit_code == 2 and "Nsight Compute run" in bad.output


def test_check_no_link(tmp_path):
    db = tmp_path / "s.duckdb"
    res = _cli("check", NSYS, NCU, "--store", db, "--no-link", "--fail-on", "never")
    assert res.exit_code == 0
    assert "linked " not in res.output
    res = _cli("check", NSYS, NCU, "--store", db, "--fail-on", "never")
    assert res.exit_code == 0 and "10 of 12 ncu launch(es) matched" in res.output


# -- reports: the four passes per hot kernel --------------------------------------------------------

def test_reports_show_the_four_passes_per_hot_kernel(store):
    from io import StringIO

    from rich.console import Console

    from traceanalyzer.report import html
    from traceanalyzer.report.text import print_result

    run_check(store, CheckOptions(paths=[str(NSYS), str(NCU)], fail_on="never"))
    run_id, ncu_id = store.resolve_run(NSYS.name), store.resolve_run(NCU.name)
    result = load_result(store, [run_id, ncu_id])
    runs = {r["run_id"]: r for r in result.runs}
    assert "hot_kernels" not in runs[ncu_id]
    hot = runs[run_id]["hot_kernels"]
    assert [k["name"] for k in hot] == [P["names"][k]["nsys"] for k in ("gemm", "transpose", "bias", "rsqrt")]
    gemm, transpose = hot[0], hot[1]
    assert gemm["structure"]["launched_by"] == "aten::mm"
    assert (gemm["timeline"]["launches"], gemm["timeline"]["ns"]) == (P["steps"], P["kernel_ns"]["gemm"])
    assert gemm["timeline"]["idle_before_ns"] == 500  # the planted 0.5 us between kernels
    b = gemm["bottleneck"]
    assert (b["theoretical_pct"], b["achieved_pct"], b["ncu_launches"]) == (25, P["gemm_achieved"] * 100, 2)
    assert (b["roofline"], b["limiter"], b["occupancy_limiter"]) == ("latency", "occupancy", "registers")
    assert gemm["instruction"]["stall"] == "long_scoreboard"
    assert gemm["instruction"]["excess_sector_share"] == pytest.approx(0.75)
    assert transpose["instruction"]["bank_conflict_share"] == pytest.approx(31 / 32)
    assert runs[run_id]["links"] == [{"ncu_run_id": ncu_id, "both": 10, "ncu": 2,
                                      "timeline": len(P["timeline_unmatched"])}]

    buf = StringIO()
    print_result(result, Console(file=buf, width=200, no_color=True))
    text = buf.getvalue()
    assert "Hot kernels, timeline and Nsight Compute together" in text
    assert "structure   aten::mm" in text and "32-way (I004)" in text
    page = html.render(store, result)
    assert "Hot kernels: timeline and Nsight Compute together" in page and "long scoreboard" in page
    assert json.loads(render_json(result))["runs"][[r["run_id"] for r in result.runs].index(run_id)]["hot_kernels"]


def test_the_structure_pass_names_the_unfused_chain_a_hot_kernel_is_in(store):
    from io import StringIO

    from rich.console import Console

    from traceanalyzer.report.text import print_result

    # Kineto's input shapes size the chain's intermediates (nsys has only a proxy, under the threshold)
    run_check(store, CheckOptions(paths=[str(KINETO), str(NCU)], fail_on="never"))
    run_id = store.resolve_run(KINETO.name)
    result = load_result(store, [run_id])
    hot = {k["name"]: k for k in result.runs[0]["hot_kernels"]}
    chain = hot[P["names"]["rsqrt"]["kineto"]]["structure"]["fusion_chain"]
    (s002,) = _findings(store, run_id, "S002")
    assert (chain["chains"], chain["kernels_per_chain"]) == (P["steps"], len(P["chain"]))
    assert chain["name"] == s002["item_name"] == " -> ".join(P["launched_by"][k] for k in P["chain"])
    assert (chain["finding_no"], chain["saving_ns"]) == (s002["finding_no"], s002["est_loss_ns"]) and chain["saving_ns"] > 0
    assert [k["structure"]["fusion_chain"] for n, k in hot.items() if n != P["names"]["rsqrt"]["kineto"]] == [None] * 3
    buf = StringIO()
    print_result(result, Console(file=buf, width=250, no_color=True))
    assert (f"in 4 unfused chain(s) of 3 element-wise kernels ({chain['name']}, #{chain['finding_no']} S002"
            in buf.getvalue())


def test_a_rescan_shows_only_new_links_and_stored_files_in_one_line(tmp_path):
    """Scanning or checking the same folder again prints no link block for a pair linked as
    before, and no line per file already stored: one note each."""
    db = tmp_path / "s.duckdb"
    folder = tmp_path / "program"
    folder.mkdir()
    for f in (NSYS, NCU):
        shutil.copyfile(f, folder / f.name)
    first = _cli("scan", folder, "--store", db, "--jobs", "1", "--fail-on", "never")
    assert first.exit_code == 0 and "10 of 12 ncu launch(es) matched" in first.output
    assert "linked as before" not in first.output
    again = _cli("scan", folder, "--store", db, "--jobs", "1", "--fail-on", "never")
    block = re.compile(r"^linked .+ <- ", re.M)  # a link block's first line
    assert block.search(first.output)
    assert again.exit_code == 0 and not block.search(again.output) and "unmatched ncu launch" not in again.output
    assert "note: 1 timeline and Nsight Compute pair(s) linked as before" in again.output
    checked = _cli("check", folder, "--store", db, "--fail-on", "never")
    assert checked.exit_code == 0 and "skipped (already stored)" not in checked.output
    assert "note: 2 file(s) already stored, not read again (--verbose lists them)" in checked.output
    assert not block.search(checked.output) and "linked as before" in checked.output
    listed = _cli("check", folder, "--store", db, "--fail-on", "never", "--verbose")
    assert listed.output.count("skipped (already stored)") == 2
