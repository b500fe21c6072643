"""NVIDIA's own verdicts beside ours (report/vendor.py): on every real Nsight Compute file that
carries NVIDIA's rule results, each finding of a rule with a counterpart says whether NVIDIA
flagged the same kernel for the same issue, and `check --show-vendor-rules` lists the rest."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from traceanalyzer.cli import app
from traceanalyzer.report.model import load_result
from traceanalyzer.rules import get_rule

from .conftest import corpus_runs, shared_file

NAIVE = "traces/ncu-rep/CudaCode__gemm__reps__naive.ncu-rep"


@pytest.fixture(scope="module")
def checked(real_corpus):
    """Every real Nsight Compute profile (CSV, console text, report), checked (tests/conftest.py)."""
    ids = corpus_runs(real_corpus, "ncu-csv", "ncu-text", "ncu-rep")
    return real_corpus, load_result(real_corpus, ids)


def test_each_finding_with_a_counterpart_carries_nvidias_verdict(checked):
    store, result = checked
    told = Counter()
    for f in result.findings:
        v = f["vendor"]
        has_results = bool(store.sql("SELECT count(*) FROM kernel_rule_results WHERE run_id = ? "
                                     "AND rule_type IN ('OPT', 'WRN')", [f["run_id"]]).fetchone()[0])
        if not (has_results and get_rule(f["rule_id"]).nvidia and f["item_kind"] == "kernel"):
            assert v is None, f["message"]
            continue
        assert v is not None, f["message"]
        told[(f["rule_id"], v["flagged"])] += 1
        if v["flagged"]:  # the result named is one of the rule's counterparts
            assert v["rule"] in {name for name, _ in get_rule(f["rule_id"]).nvidia}
    # B001, B002 and I001 flag the kernels NVIDIA flags (tests/test_ncu_rules_vendor.py): every one agrees
    for rule in ("B001", "B002", "I001"):
        assert told[(rule, True)] > 0 and told[(rule, False)] == 0, told


def test_nvidias_results_no_finding_matches_are_listed_once(checked):
    _, result = checked
    for run in result.runs:
        keys = [(v["kernel"], v["rule"], v["type"], v["message"]) for v in run["vendor_unmatched"]]
        assert len(keys) == len(set(keys))
        assert all(v["type"] in ("OPT", "WRN") for v in run["vendor_unmatched"])
    assert sum(len(r["vendor_unmatched"]) for r in result.runs) > 0


def test_check_shows_them_on_request_and_in_json(tmp_path):
    path = shared_file(NAIVE)
    runner = CliRunner()
    db = tmp_path / "s.duckdb"
    plain = runner.invoke(app, ["check", "--store", str(db), str(path)], env={"COLUMNS": "250"})
    assert "NVIDIA: flagged too (CPIStall OPT" in plain.stdout
    assert "NVIDIA rule result(s) that no finding matches: --show-vendor-rules lists them" in plain.stdout
    shown = runner.invoke(app, ["check", "--store", str(db), "--show-vendor-rules", str(path)], env={"COLUMNS": "250"})
    assert "NVIDIA's results no rule of ours matches" in shown.stdout and "IssueSlotUtilization" in shown.stdout
    doc = json.loads(runner.invoke(app, ["check", "--store", str(db), "--format", "json", str(path)]).stdout)
    assert any((f["vendor"] or {}).get("rule") == "CPIStall" for f in doc["findings"])
    assert any(v["rule"] == "IssueSlotUtilization" for v in doc["runs"][0]["vendor_unmatched"])
