"""A rule that raises fails the check in every output; GPU activity carries the device the
trace describes (ROCm agent ids against HIP device indices); a device without a name is
unknown, never a crash. The zero-rule-error check over the whole real corpus is in
test_diagnosis.py (it shares that file's store of every real trace)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from rich.console import Console
from typer.testing import CliRunner

from traceanalyzer.batch.check import check_file
from traceanalyzer.cli import app
from traceanalyzer.devices import gpu
from traceanalyzer.ingest.kineto import read
from traceanalyzer.report.model import load_result
from traceanalyzer.report.text import print_result
from traceanalyzer.rules import engine
from traceanalyzer.rules.engine import Settings
from traceanalyzer.store import Store

from .conftest import FIXTURES

runner = CliRunner()
CLEAN = FIXTURES / "nsys" / "clean.sqlite"
BROKEN = "T001"  # the rule made to raise
SELECT = ("--select", "T001,T002,T003,S001")  # rules that run on CLEAN (and only these: others may be mid-change)


def run(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"}, catch_exceptions=False)


@pytest.fixture
def broken_rule(monkeypatch):
    """T001 raises on every run; the other rules evaluate as usual."""
    real = engine.evaluate_rule

    def evaluate(store, rule, run_id, params):
        if rule.id == BROKEN:
            raise RuntimeError("planted failure\nsecond line")
        return real(store, rule, run_id, params)

    monkeypatch.setattr(engine, "evaluate_rule", evaluate)


# ---- rule errors are failures -----------------------------------------------------------

def test_clean_trace_passes_without_the_planted_error(tmp_path):
    r = run("check", "--store", tmp_path / "s.duckdb", CLEAN, *SELECT, "--format", "json")
    assert r.exit_code == 0, r.stdout
    assert json.loads(r.stdout)["rule_errors"] == []


def test_rule_error_fails_check_in_json(tmp_path, broken_rule):
    r = run("check", "--store", tmp_path / "s.duckdb", CLEAN, *SELECT, "--format", "json")
    assert r.exit_code == 2, r.stdout
    doc = json.loads(r.stdout)
    assert doc["failed"] is True and doc["errors"] == []
    assert [(e["rule_id"], e["file_name"], e["message"]) for e in doc["rule_errors"]] == \
        [(BROKEN, "clean.sqlite", "RuntimeError: planted failure")]
    statuses = {o["rule_id"]: o["status"] for o in doc["runs"][0]["rules"]}
    assert statuses.pop(BROKEN) == "error"
    assert "ran" in statuses.values() and "error" not in statuses.values()  # the others still report


def test_rule_error_fails_check_in_sarif(tmp_path, broken_rule):
    r = run("check", "--store", tmp_path / "s.duckdb", CLEAN, *SELECT, "--format", "sarif")
    assert r.exit_code == 2
    [inv] = json.loads(r.stdout)["runs"][0]["invocations"]
    assert inv["executionSuccessful"] is False
    [note] = inv["toolExecutionNotifications"]
    assert note["level"] == "error" and note["descriptor"]["id"] == "rule-error"
    assert note["associatedRule"]["id"] == BROKEN and "RuntimeError: planted failure" in note["message"]["text"]
    assert note["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("clean.sqlite")


def test_rule_error_fails_check_in_junit(tmp_path, broken_rule):
    r = run("check", "--store", tmp_path / "s.duckdb", CLEAN, *SELECT, "--format", "junit")
    assert r.exit_code == 2
    [suite] = ET.fromstring(r.stdout).iter("testsuite")
    assert suite.get("errors") == "1"
    [case] = [c for c in suite.iter("testcase") if c.get("name").startswith(BROKEN)]
    [err] = case.findall("error")
    assert err.get("type") == "RuleError" and "planted failure" in err.get("message")


def test_rule_error_fails_check_in_text_in_red(tmp_path, broken_rule):
    r = run("check", "--store", tmp_path / "s.duckdb", CLEAN, *SELECT)
    assert r.exit_code == 2
    assert f"rule error: {BROKEN} RuntimeError: planted failure" in r.stdout
    assert "FAIL: 1 rule error(s)" in r.stdout and "OK" not in r.stdout
    # The line is red, not dim like the rules not applicable.
    with Store(tmp_path / "s.duckdb") as st:
        result = load_result(st, st.run_ids())
    console = Console(record=True, force_terminal=True, color_system="standard", width=200)
    print_result(result, console)
    [line] = [ln for ln in console.export_text(styles=True).splitlines() if "rule error:" in ln]
    assert line.startswith("\x1b[1;31mrule error:") and "\x1b[2m" not in line


def test_rule_error_fails_scan(tmp_path, broken_rule):
    # --jobs 1: the check runs in this process, where the rule is broken
    r = run("scan", "--store", tmp_path / "s.duckdb", CLEAN, *SELECT, "--jobs", "1")
    assert r.exit_code == 2, r.stdout
    assert f"rule error: clean.sqlite: {BROKEN} RuntimeError: planted failure" in r.stdout
    r = run("scan", "--store", tmp_path / "s2.duckdb", CLEAN, *SELECT, "--jobs", "1", "--format", "json")
    assert r.exit_code == 2 and [e["rule_id"] for e in json.loads(r.stdout)["rule_errors"]] == [BROKEN]


# ---- a device without a name ------------------------------------------------------------

@pytest.mark.parametrize("name", [None, float("nan"), ""])
def test_product_lookups_take_a_missing_name(name):
    assert gpu.product(name) is None and gpu.vendor_of(name) is None
    row = gpu.fill_device({"device_id": 2, "name": name, "vendor": float("nan"), "sm_count": None})
    assert row["sm_count"] is None


# ---- device identity in Kineto traces ---------------------------------------------------

def _props(device_id: int, name: str) -> dict:
    return {"id": device_id, "name": name, "numSms": 304, "warpSize": 64, "maxThreadsPerMultiprocessor": 2048,
            "maxSharedMemoryPerMultiProcessor": 65536, "totalGlobalMem": 206141652992}


def _kineto(path: Path, props: list[dict], kernel_devices: list[int], hip: bool = True, grid_x: int = 8) -> Path:
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": d, "tid": 0, "ts": 10.0 * i, "dur": 5.0,
               "args": {"device": d, "stream": 0, "correlation": i + 1, "grid": [grid_x, 1, 1],
                        "block": [256, 1, 1]}}
              for i, d in enumerate(kernel_devices)]
    events.append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": kernel_devices[0], "tid": 0,
                   "ts": 100.0, "dur": 1.0, "args": {"device": kernel_devices[0], "stream": 0, "correlation": 99,
                                                     "bytes": 64}})
    doc = {"traceEvents": events, "deviceProperties": props, "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    if hip:
        doc["roctracer_version"] = 4.1
    path.write_text(json.dumps(doc))
    return path


def _devices(trace, table: str) -> set:
    return set(trace.tables[table].column("device_id").to_pylist())


def test_rocm_agent_id_is_the_described_device(tmp_path):
    trace = read(_kineto(tmp_path / "t.json", [_props(0, "AMD Instinct MI300X")], [9, 9]))
    assert _devices(trace, "kernels") == _devices(trace, "memsets") == {0}
    [dev] = trace.tables["devices"].to_pylist()
    assert (dev["device_id"], dev["name"], dev["sm_count"]) == (0, "AMD Instinct MI300X", 304)
    assert trace.metadata["reader_notes"]["device_ids"] == {"9": 0} and trace.warnings == []


def test_rocm_activity_ids_pair_with_spare_descriptions_in_order(tmp_path):
    props = [_props(i, "AMD Instinct MI300X") for i in range(2)]
    trace = read(_kineto(tmp_path / "t.json", props, [3, 2, 3]))
    assert trace.tables["kernels"].column("device_id").to_pylist() == [1, 0, 1]
    assert trace.metadata["reader_notes"]["device_ids"] == {"2": 0, "3": 1}


def test_described_activity_devices_keep_their_ids(tmp_path):
    props = [_props(i, "AMD Instinct MI210") for i in range(4)]
    trace = read(_kineto(tmp_path / "t.json", props, [1, 1]))
    assert _devices(trace, "kernels") == {1} and "device_ids" not in trace.metadata["reader_notes"]


def test_device_left_undescribed_is_a_warning(tmp_path):
    # two activity devices, one description: the second stays unknown, and says so
    trace = read(_kineto(tmp_path / "t.json", [_props(0, "AMD Instinct MI300X")], [2, 5]))
    assert _devices(trace, "kernels") == {0, 5}
    [w] = trace.warnings
    assert "device(s) 5" in w and "unknown" in w
    devices = {d["device_id"]: d for d in trace.tables["devices"].to_pylist()}
    assert devices[5]["name"] is None and devices[0]["name"] == "AMD Instinct MI300X"


def test_nvidia_ids_are_not_remapped(tmp_path):
    trace = read(_kineto(tmp_path / "t.json", [_props(0, "NVIDIA H100 80GB HBM3")], [2], hip=False))
    assert _devices(trace, "kernels") == {2}
    assert any("device(s) 2" in w for w in trace.warnings)


def test_unknown_device_runs_every_rule_without_error(tmp_path):
    path = _kineto(tmp_path / "t.json", [_props(0, "AMD Instinct MI300X")], [2, 5])
    with Store(tmp_path / "s.duckdb") as st:
        res = check_file(st, path, Settings())
        assert res.state == "stored", res.error
        errors = st.sql("SELECT rule_id, note FROM rule_runs WHERE status = 'error'").fetchall()
    assert errors == []


def test_grid_times_block_past_int32_is_counted(tmp_path):
    # 2^23 blocks of 256 threads (a real SD-3.5 kernel): 2^31 threads, one past INT32
    names = ["vectorized_elementwise_kernel_add", "vectorized_elementwise_kernel_mul",
             "vectorized_elementwise_kernel_div"]
    path = _kineto(tmp_path / "t.json", [_props(0, "AMD Instinct MI300X")], [2, 2, 2], grid_x=1 << 23)
    doc = json.loads(path.read_text())
    for e, name in zip(doc["traceEvents"], names):
        e["name"] = name
    path.write_text(json.dumps(doc))
    with Store(tmp_path / "s.duckdb") as st:
        res = check_file(st, path, Settings(select=["S002", "B001", "B002"]))
        assert res.state == "stored", res.error
        assert st.sql("SELECT DISTINCT threads FROM gpu_activity WHERE kind = 'kernel'").fetchall() == [(1 << 31,)]
        assert st.sql("SELECT rule_id, note FROM rule_runs WHERE status = 'error'").fetchall() == []


# ---- the ROCm traces of the corpus ------------------------------------------------------

ROCM = ["TraceLens__mi300__Falconsai_nsfw_image_detection__1016002.json.gz",
        "TraceLens__mi300__gaunernst_bert-small-uncased__1016001.json.gz",
        "TraceLens__inference__xdit_sd_3.5__profile_trace_rank_0.json.gz",
        "TraceLens__inference__sglang_Qwen3-8B_prefilldecode.json.gz"]


@pytest.fixture
def rocm(real_corpus):
    """The ROCm traces are in the checked real corpus (tests/conftest.py)."""
    return real_corpus


@pytest.mark.parametrize("name", ROCM)
def test_b003_runs_on_rocm_traces_with_the_described_device(rocm, name):
    run_id = rocm.resolve_run(name)
    status = dict(rocm.sql("SELECT rule_id, status FROM rule_runs WHERE run_id = ?", [run_id]).fetchall())
    assert status["B003"] == status["S002"] == "ran"
    assert rocm.sql("SELECT DISTINCT device_id FROM kernels WHERE run_id = ?", [run_id]).fetchall() == [(0,)]
    mi300x = gpu.product("AMD Instinct MI300X")
    rows = rocm.sql("SELECT device_id, evidence FROM findings WHERE run_id = ? AND rule_id = 'B003'",
                    [run_id]).fetchall()
    assert rows
    for device_id, evidence in rows:
        ev = json.loads(evidence)
        assert device_id == 0 and math.isclose(ev["peak_bw"], mi300x.dram_bandwidth_bytes_per_s)
        assert "MI300X" in ev["peak_flops_source"]
