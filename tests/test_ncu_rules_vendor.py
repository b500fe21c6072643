"""The ncu rules beside NVIDIA's own verdicts: on every real report that carries NVIDIA's rule
results, each rule with NVIDIA counterparts (`Rule.nvidia`) flags the kernels NVIDIA's rules flag,
and B004 names the side of the roof NVIDIA's SOLBottleneck names; plus the vendor_rules fixture's
regeneration and the estimates the cases files cannot state (a finding without one)."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from traceanalyzer.rules import all_rules
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES, corpus_runs

# Kernels (file, kernel name) where a rule and its NVIDIA counterpart disagree, and why (the
# same words are in the rule's docs): in the two SGEMM reports the threads of a warp read one word
# of A together, so few of each L1 sector's bytes are used per thread (MemoryCacheAccessPattern)
# although the Source Counters find no sector beyond the ideal (no UncoalescedGlobalAccess, no I002).
# simpleDivergence launches one block of 64 threads: an SM holds 2 of its 48 warps whatever the
# occupancy limits, and its achieved 4.2% is that ceiling (B002 judges achieved against what the
# grid allows; NVIDIA's AchievedOccupancy against the theoretical 100%).
KNOWN = {
    "I002": {("CudaCode__gemm__reps__naive.ncu-rep", None),
             ("CudaCode__gemm__reps__global_mem_coalesce.ncu-rep", None)},
    "B002": {("CudaProgramming__profiling__profiles__simpleDivergence.ncu-rep", None)},
}

# NVIDIA's SOLBottleneck message -> the side of the roof it names.
SOL_SIDE = [(r"greater than 80\.0%|more heavily utilized", "throughput"),
            (r"too small to fill|low compute throughput and memory bandwidth", "latency")]


def _vendor_runs(store) -> list[tuple[str, str]]:
    """(run id, file name) of the real ncu runs that carry NVIDIA's rule results."""
    ids = set(corpus_runs(store, "ncu-csv", "ncu-text", "ncu-rep"))
    rows = store.sql("""SELECT DISTINCT run_id, file_name FROM kernel_rule_results JOIN runs USING (run_id)
                        WHERE rule_type IN ('OPT', 'WRN') ORDER BY file_name""").fetchall()
    return [(r, f) for r, f in rows if r in ids]


def _nvidia(store, run: str, types=("OPT", "WRN")) -> list[tuple[str, str, str]]:
    """(kernel name, NVIDIA rule, message) of NVIDIA's results of these types (OPT and WRN flag
    an issue; INF states a fact, as SOLBottleneck's "greater than 80%")."""
    return store.sql("SELECT k.name, r.rule_name, r.description FROM kernel_rule_results r "
                     "JOIN kernels k USING (run_id, kernel_id) WHERE r.run_id = $r "
                     "AND r.rule_type IN (SELECT unnest($t))", {"r": run, "t": list(types)}).fetchall()


def _kernel_names(store, run: str) -> set[str]:
    return {n for (n,) in store.sql("SELECT DISTINCT name FROM kernels WHERE run_id = $r", {"r": run}).fetchall()}


def test_the_ncu_rules_flag_the_kernels_nvidia_flags_on_the_real_reports(real_corpus):
    """Per rule and kernel: both flag it or neither does, but for the KNOWN disagreements (a
    kernel NVIDIA alone flags is listed with None)."""
    runs = _vendor_runs(real_corpus)
    assert len(runs) >= 10
    rules = [r for r in all_rules() if r.nvidia and r.id != "B004"]
    assert {r.id for r in rules} >= {"B001", "B002", "I001", "I002", "I004"}
    for rule in rules:
        compared, disagree = 0, set()
        for run, file_name in runs:
            mine = {n for (n,) in real_corpus.sql("SELECT item_name FROM findings WHERE run_id = $r AND rule_id = $i",
                                                  {"r": run, "i": rule.id}).fetchall()}
            theirs = {n for n, name, text in _nvidia(real_corpus, run) if any(
                name == rn and re.search(pat, text or "") for rn, pat in rule.nvidia)}
            names = _kernel_names(real_corpus, run)
            compared += len(names)
            disagree |= {(file_name, n if n in mine else None) for n in names if (n in mine) != (n in theirs)}
        assert compared >= 15, rule.id
        assert disagree == KNOWN.get(rule.id, set()), rule.id


def test_b004_names_the_side_of_the_roof_nvidia_names(real_corpus):
    """Where NVIDIA's SOLBottleneck gives a verdict, B004's bound is the same side: throughput
    (compute or memory near its peak) or latency (a small grid, few warps, stalls)."""
    compared = 0
    for run, _ in _vendor_runs(real_corpus):
        sides: dict[str, set] = {}
        for name, rule, text in _nvidia(real_corpus, run, ("OPT", "WRN", "INF")):
            side = next((s for pat, s in SOL_SIDE if rule == "SOLBottleneck" and re.search(pat, text or "")), None)
            if side:
                sides.setdefault(name, set()).add(side)
        for name, evidence in real_corpus.sql("SELECT item_name, evidence FROM findings WHERE run_id = $r "
                                              "AND rule_id = 'B004'", {"r": run}).fetchall():
            if name in sides:
                bound = json.loads(evidence)["bound"]
                assert sides[name] == {"latency" if bound == "latency" else "throughput"}, (run, name)
                compared += 1
    assert compared >= 15


def test_i005_does_not_call_shared_addresses_narrow_accesses(real_corpus):
    """The naive GEMM reads a row of A that every thread of a warp shares: 2.1 distinct bytes per
    thread per load, which sectors cannot tell from 2-byte elements; no vectorizing estimate."""
    run = real_corpus.resolve_run("CudaCode__gemm__reps__naive.ncu-rep")
    [(message, evidence)] = real_corpus.sql("SELECT message, evidence FROM findings WHERE run_id = $r "
                                            "AND rule_id = 'I005'", {"r": run}).fetchall()
    ev = json.loads(evidence)
    assert ev["bytes_per_thread"] == pytest.approx(2.06, abs=0.01)
    assert ev["access_width_known"] is False and ev["instructions_saved_at_16_bytes"] is None
    assert "broadcast" in message and "bit accesses" not in message
    run = real_corpus.resolve_run("CudaCode__stage1__reps__vec_add.ncu-rep")
    for (evidence,) in real_corpus.sql("SELECT evidence FROM findings WHERE run_id = $r AND rule_id = 'I005'",
                                       {"r": run}).fetchall():
        assert json.loads(evidence)["access_width_known"] is True  # 4.0 bytes: 32-bit accesses


def _gen():
    spec = importlib.util.spec_from_file_location("gen_ncu_vendor", FIXTURES / "gen_ncu_vendor.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vendor_fixture_regenerates_byte_identical(tmp_path):
    gen = _gen()
    for path in gen.write_all(tmp_path):
        assert path.read_bytes() == (FIXTURES / "ncu" / path.name).read_bytes(), f"regenerate {path.name}"


def _findings(tmp_path, trace, rule):
    with Store(tmp_path / "f.duckdb") as store:
        run = store.ingest(trace).run_id
        run_rules(store, [run], Settings(select=[rule]))
        return store.arrow("SELECT * FROM findings WHERE run_id = ? ORDER BY item_id", [run]).to_pylist()


def test_a_grid_with_a_block_on_every_sm_has_no_small_grid_estimate(tmp_path):
    rows = _findings(tmp_path, FIXTURES / "ncu" / "raw_waves.csv", "B001")
    small = [r for r in rows if json.loads(r["evidence"])["full_waves"] == 0]
    assert len(small) == 1 and small[0]["est_loss_ns"] is None and small[0]["severity"] == "info"
    tail = [r for r in rows if json.loads(r["evidence"])["full_waves"] == 1]
    assert len(tail) == 1 and tail[0]["est_loss_ns"] > 0


def test_the_impossible_achieved_launch_is_out_of_the_mean(tmp_path):
    gen = _gen()
    planted = [k for k in gen.PLANTED["kernels"] if k["name"].startswith("occupancy_kernel")]
    assert len(planted) == 3
    rows = _findings(tmp_path, FIXTURES / "ncu" / "vendor_rules.csv", "B002")
    assert [r["value"] for r in rows] == [pytest.approx(gen.PLANTED["achieved_mean"])]
    # with the 172% launch averaged in, the mean would be 100.7%: no gap, no finding
    assert json.loads(rows[0]["evidence"])["achieved_impossible_launches"] == 1


def test_without_an_sm_count_a_small_grid_is_info_without_an_estimate(tmp_path):
    """The 2022 text layout has Waves Per SM 0.10 and the memory SOL, but no SM count."""
    rows = _findings(tmp_path, FIXTURES / "ncu-text" / "text_2022_utf16.txt", "B001")
    assert len(rows) == 2
    for r in rows:
        ev = json.loads(r["evidence"])
        assert (r["severity"], r["est_loss_ns"], ev["idle_share"]) == ("info", None, None)
        assert ev["memory_sol"] == pytest.approx(0.7617)  # the 2021-22 "Memory [%]" label, mapped
        assert "SM count is unknown" in r["message"]
