"""The ncu rules beside NVIDIA's own verdicts: on every real report that carries NVIDIA's rule
results, B001, B002 and I001 flag the same kernels NVIDIA's Tail Effect / Small Grid,
Achieved/Theoretical Occupancy and CPIStall rules flag; plus the vendor_rules fixture's
regeneration and the estimates the cases files cannot state (a finding without one)."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from traceanalyzer.ingest import TraceError
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES, shared_traces

# Our rule -> NVIDIA's (rule name, message pattern) that flags the same issue.
VENDOR = {
    "B001": [("LaunchConfiguration", r"wave|less than the GPU's"), ("SOLBottleneck", r"too small to fill")],
    "B002": [("AchievedOccupancy", r""), ("TheoreticalOccupancy", r""), ("Occupancy", r"achieved occupancy")],
    "I001": [("CPIStall", r"represents about")],
}


def _vendor_files():
    traces = shared_traces()
    return [p for folder in ("ncu", "ncu-text", "ncu-rep") for p in sorted((traces / folder).iterdir())
            if p.is_file()]


def _agreement(tmp_path):
    """Per rule: (kernels both flag or both leave, kernels compared), over files with NVIDIA's verdicts."""
    counts = {rule: [0, 0] for rule in VENDOR}
    for i, path in enumerate(_vendor_files()):
        with Store(tmp_path / f"s{i}.duckdb") as store:
            try:
                run = store.ingest(path).run_id
            except TraceError:
                continue
            verdicts = store.sql("SELECT k.name, r.rule_name, r.description FROM kernel_rule_results r "
                                 "JOIN kernels k USING (run_id, kernel_id) WHERE r.run_id = $r "
                                 "AND r.rule_type IN ('OPT', 'WRN')", {"r": run}).fetchall()
            if not verdicts:
                continue
            run_rules(store, [run], Settings(select=list(VENDOR)))
            names = {n for (n,) in store.sql("SELECT DISTINCT name FROM kernels WHERE run_id = $r", {"r": run}).fetchall()}
            ours = store.sql("SELECT rule_id, item_name FROM findings WHERE run_id = $r", {"r": run}).fetchall()
            for rule, patterns in VENDOR.items():
                theirs = {n for n, name, text in verdicts
                          if any(name == rn and re.search(pat, text or "") for rn, pat in patterns)}
                mine = {n for rid, n in ours if rid == rule}
                counts[rule][0] += sum((n in mine) == (n in theirs) for n in names)
                counts[rule][1] += len(names)
    return counts


def test_the_ncu_rules_agree_with_nvidia_on_the_real_reports(tmp_path):
    counts = _agreement(tmp_path)
    # 15 kernels (by name, per file) in the 14 real files with NVIDIA's verdicts; every one agrees
    for rule, (agree, total) in counts.items():
        assert total >= 15, (rule, counts)
        assert agree == total, (rule, counts)


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
