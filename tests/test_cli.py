"""The command line: ingest, runs, summary, query, rules, check and its report formats."""

from __future__ import annotations

import json
import os
import datetime as dt
import pkgutil
import shutil
from xml.etree import ElementTree as ET

import duckdb
import pytest
from typer.testing import CliRunner

import traceanalyzer.cli
from traceanalyzer import fmt
from traceanalyzer.cli import app
from traceanalyzer.report.budget import budget_of, busy_split
from traceanalyzer.store import Store

from .conftest import FIXTURES, shared_file

runner = CliRunner()
PLANTED = FIXTURES / "nsys" / "planted.sqlite"
CLEAN = FIXTURES / "nsys" / "clean.sqlite"
STALLS = FIXTURES / "ncu" / "details_stalls.csv"


def run(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250", **(env or {})}, catch_exceptions=False)


@pytest.fixture
def db(tmp_path):
    return tmp_path / "s.duckdb"


def test_ingest_reports_each_file_and_goes_on_after_a_bad_one(tmp_path, db):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    r = run("ingest", "--store", db, PLANTED, bad, STALLS)
    assert r.exit_code == 2
    assert f"error: {bad}:" in r.stderr and "\n" not in r.stderr.split(f"error: {bad}:")[1].strip().split("\n")[0] + "x"[:0]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("ok")]
    assert len(lines) == 2 and "nsys-sqlite" in lines[0] and "ncu-csv" in lines[1]
    r = run("runs", "--store", db)
    assert "planted.sqlite" in r.stdout and "details_stalls.csv" in r.stdout


def test_ingest_folder_recurses_and_reingest_replaces(db):
    r = run("ingest", "--store", db, FIXTURES)
    assert r.exit_code == 0, r.stderr
    n = sum(not line.startswith(" ") for line in r.stdout.splitlines())  # a line per file, and what it placed
    assert n >= 9
    r2 = run("ingest", "--store", db, FIXTURES)
    assert r2.stdout.count("replaced") == n
    q = run("query", "--store", db, "--json", "SELECT count(*) AS n FROM runs")
    assert json.loads(q.stdout) == [{"n": n}]


def test_missing_file_is_an_error_line(tmp_path, db):
    r = run("ingest", "--store", db, tmp_path / "nope.sqlite")
    assert r.exit_code == 2 and "no such file" in r.stderr


def test_summary_and_query(db):
    run("ingest", "--store", db, PLANTED)
    r = run("summary", "--store", db)
    assert r.exit_code == 0
    assert "Top kernels" in r.stdout and "GPU busy" in r.stdout and "HtoD" in r.stdout
    # busy split into the budget's exclusive parts, which sum to it
    with Store(db, read_only=True) as st:
        (rid,) = st.sql("SELECT run_id FROM runs").fetchone()
        busy_ns = st.sql("SELECT busy_ns FROM device_busy WHERE run_id = ?", [rid]).fetchone()[0]
        [device] = budget_of(st, rid)
    split = busy_split(device)
    assert sum(split.values()) == busy_ns and split["kernels"] and split["copies"]
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("│ 0 "))
    assert all(f" {fmt.ns(v)} " in row for v in split.values()), row
    r = run("query", "--store", db, "--csv", "SELECT direction, count(*) AS n FROM copies GROUP BY 1 ORDER BY 1")
    assert r.stdout.splitlines()[0] == "direction,n"
    r = run("query", "--store", db, "SELECT nonsense FROM nowhere")
    assert r.exit_code == 2 and "error:" in r.stderr
    r = run("query", "--store", db, "SELECT ['mul', 'silu'] AS ops, []::VARCHAR[] AS none_")
    assert r.exit_code == 0 and "['mul', 'silu']" in r.stdout and "[]" in r.stdout, r.stdout


def test_rules_list_and_explain():
    r = run("rules")
    assert all(i in r.stdout for i in ("T001", "T002", "B001", "B002", "I001"))
    r = run("rules", "launch-gaps")
    assert "min_gap_ns" in r.stdout and "Why it matters" in r.stdout
    assert run("rules", "NOPE").exit_code == 2


def test_check_exit_codes(db):
    dirty = run("check", "--store", db, PLANTED)
    assert dirty.exit_code == 1, dirty.stdout
    assert "T002" in dirty.stdout and "FAIL" in dirty.stdout
    assert run("check", "--store", db, PLANTED, "--fail-on", "never").exit_code == 0
    clean = run("check", "--store", db, CLEAN)
    assert clean.exit_code == 0, clean.stdout
    assert run("check", "--store", db, PLANTED, "--select", "NOPE").exit_code == 2
    assert run("check", "--store", db, PLANTED, "--threshold", "T001.bogus_ns=1").exit_code == 2
    assert run("check", "--store", db, PLANTED, "--format", "yaml").exit_code == 2


def test_check_input_error_exits_2_but_reports_the_rest(tmp_path, db):
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [')
    r = run("check", "--store", db, PLANTED, bad, "--format", "json")
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert [x["file_name"] for x in doc["runs"]] == ["planted.sqlite"] and doc["errors"]


def test_select_threshold_and_config_file(tmp_path, db, monkeypatch):
    r = run("check", "--store", db, PLANTED, "--select", "T001", "--format", "json", "--fail-on", "never")
    assert {f["rule_id"] for f in json.loads(r.stdout)["findings"]} == {"T001"}
    # A huge gap threshold silences T001.
    r = run("check", "--store", db, PLANTED, "--select", "T001", "--threshold", "T001.min_gap_ns=1e9",
            "--format", "json")
    assert json.loads(r.stdout)["findings"] == []
    (tmp_path / "traceanalyzer.toml").write_text('select = ["T001"]\nfail-on = "info"\n'
                                                 '[thresholds.launch-gaps]\nmin_gap_ns = 1000000000\n')
    monkeypatch.chdir(tmp_path)
    r = run("check", "--store", db, PLANTED, "--format", "json")
    doc = json.loads(r.stdout)
    assert doc["fail_on"] == "info" and doc["findings"] == [] and r.exit_code == 0
    assert {o["rule_id"] for o in doc["runs"][0]["rules"]} == {"T001"}


def test_baseline_fails_only_on_new_findings(tmp_path, db):
    base = tmp_path / "baseline.json"
    # Recording a baseline is no gate: its findings are what it records (exit 0, not 1).
    r = run("check", "--store", db, PLANTED, "--write-baseline", base)
    assert r.exit_code == 0 and f"baseline: wrote 7 finding(s) to {base}" in r.stderr, r.stderr
    assert len(json.loads(base.read_text())["findings"]) == 7
    assert run("check", "--store", db, PLANTED, "--baseline", base).exit_code == 0
    # A different trace brings findings the baseline does not have.
    assert run("check", "--store", db, PLANTED, STALLS, "--baseline", base, "--fail-on", "warning").exit_code == 1
    (tmp_path / "junk.json").write_text("[]")
    assert run("check", "--store", db, PLANTED, "--baseline", tmp_path / "junk.json").exit_code == 2


def _sarif_validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = shared_file("schemas/sarif-schema-2.1.0.json")
    schema = json.loads(schema_path.read_text())
    return jsonschema.Draft4Validator(schema)


def test_sarif_validates_against_the_official_schema(tmp_path, db):
    out = tmp_path / "f.sarif"
    r = run("check", "--store", db, PLANTED, STALLS, FIXTURES / "kineto" / "planted.json",
            "--format", "sarif", "-o", out)
    assert r.exit_code == 1
    doc = json.loads(out.read_text())
    errors = sorted(_sarif_validator().iter_errors(doc), key=str)
    assert not errors, errors[0]
    results = doc["runs"][0]["results"]
    assert results and {x["ruleId"] for x in results} >= {"T001", "T002", "I001"}
    assert all(x["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for x in results)
    # a rule's descriptor lists the thresholds it reads, those it shares with another rule too
    descriptors = {d["id"]: d["properties"] for d in doc["runs"][0]["tool"]["driver"]["rules"]}
    t006 = descriptors["T006"]
    assert t006["sharedThresholds"] and all(ref.startswith("T002.") for ref in t006["sharedThresholds"])
    for ref in t006["sharedThresholds"]:
        name = ref.split(".")[1]
        assert t006["thresholds"][name] == descriptors["T002"]["thresholds"][name]


def test_junit_validates_against_ant_schema(tmp_path, db):
    xmlschema = pytest.importorskip("xmlschema")
    xsd = shared_file("schemas/junit.xsd")
    out = tmp_path / "f.xml"
    # A kernel name with XML-hostile characters must still give a valid document.
    weird = tmp_path / "weird.sqlite"
    shutil.copy(PLANTED, weird)
    r = run("check", "--store", db, weird, STALLS, "--format", "junit", "-o", out)
    assert r.exit_code == 1
    xmlschema.XMLSchema(str(xsd)).validate(str(out))
    text = out.read_text()
    assert "<failure" in text
    # A rule that does not apply is no case: the suite's property names it instead.
    root = ET.parse(out).getroot()
    for suite in root.iter("testsuite"):
        assert suite.get("skipped") == "0" and suite.find("testcase/skipped") is None
        props = {p.get("name"): p.get("value") for p in suite.iter("property")}
        cases = {c.get("name").split()[0] for c in suite.iter("testcase")}
        assert int(suite.get("tests")) == len(cases) and not cases & set(props["rules_not_applicable"].split())


def test_one_check_writes_the_text_log_and_every_artifact(tmp_path, db):
    """What a CI job asks of one run: the text report in the log, and SARIF, JUnit and JSON
    files (`--sarif`, `--junit`, `--json`, or `-o FORMAT=FILE`, repeatable)."""
    missing = tmp_path / "gone.sqlite"
    f = {name: tmp_path / f"r.{name}" for name in ("sarif", "junit", "json", "text", "json2")}
    r = run("check", "--store", db, PLANTED, missing, "--sarif", f["sarif"], "--junit", f["junit"],
            "-o", f"json={f['json']}", "-o", f"text={f['text']}", "--json", f["json2"])
    assert r.exit_code == 2  # the missing input
    assert "hint:" in r.stdout and "FAIL: 1 input(s) could not be read" in r.stdout  # the log: the text report
    for name, path in f.items():
        assert f"wrote {path} ({name.rstrip('2')})" in r.stderr
    sarif = json.loads(f["sarif"].read_text())
    assert sarif["runs"][0]["results"] and not list(_sarif_validator().iter_errors(sarif))
    doc = json.loads(f["json"].read_text())
    assert doc == json.loads(f["json2"].read_text()) and len(doc["findings"]) == 7
    assert "FAIL: 1 input(s) could not be read" in f["text"].read_text()
    suites = {s.get("name"): s for s in ET.parse(f["junit"]).getroot().iter("testsuite")}
    # The suite of the inputs that could not be read is stamped now, not 1970-01-01.
    stamp = dt.datetime.fromisoformat(suites["traceanalyzer.inputs"].get("timestamp"))
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    assert abs((now - stamp).total_seconds()) < 3600
    assert suites["traceanalyzer.inputs"].find("testcase").get("name") == str(missing)


def test_the_verdict_is_in_the_log_wherever_the_report_goes(tmp_path, db):
    # the two kernel findings lose under 100 us each: info (the severity floor)
    verdict = "1 run(s) checked: 1 error, 0 warning, 3 info (3 related finding(s) under them). FAIL: 1 finding(s)"
    r = run("check", "--store", db, PLANTED, "--format", "sarif", "-o", tmp_path / "f.sarif")
    assert r.exit_code == 1 and r.stdout == "" and verdict in r.stderr.splitlines()[-1]
    r = run("check", "--store", db, PLANTED, "--format", "json")  # standard output: the JSON alone
    assert r.exit_code == 1 and json.loads(r.stdout)["findings"] and verdict in r.stderr
    r = run("check", "--store", db, PLANTED, "--fail-on", "never", "--format", "junit", "-o", tmp_path / "f.xml")
    assert r.exit_code == 0 and r.stderr.splitlines()[-1].endswith("OK: findings not gated (--fail-on never)")
    r = run("check", "--store", db, PLANTED, "--sarif", tmp_path / "g.sarif")  # the text report holds it
    assert r.exit_code == 1 and verdict in r.stdout and verdict not in r.stderr


def test_report_options_that_cannot_work_are_usage_errors(tmp_path, db):
    r = run("check", "--store", db, PLANTED, "-o", f"html={tmp_path / 'r.html'}")
    assert r.exit_code == 2 and "the format must be one of text, json, sarif, junit, not 'html'" in r.stderr
    r = run("check", "--store", db, PLANTED, "--sarif", tmp_path / "r.x", "-o", f"json={tmp_path / 'r.x'}")
    assert r.exit_code == 2 and "more than one report would be written to this file" in r.stderr
    r = run("check", "--store", db, PLANTED, "--json", tmp_path / "no" / "such" / "folder.json")
    assert r.exit_code == 2 and "cannot write the json report" in r.stderr and "Traceback" not in r.stderr
    assert not db.exists() or run("runs", "--store", db).exit_code == 0


def test_text_report_to_file_has_no_color_codes(tmp_path, db):
    out = tmp_path / "report.txt"
    run("check", "--store", db, PLANTED, "-o", out)
    text = out.read_text()
    assert "\x1b[" not in text and "T002" in text and "hint:" in text


def test_every_command_module_is_registered():
    modules = {f"traceanalyzer.cli.{m.name}" for m in pkgutil.iter_modules(traceanalyzer.cli.__path__)
               if not m.name.startswith("_") and m.name != "common"}
    assert {c.callback.__module__ for c in app.registered_commands} == modules


def _run_ids(db) -> list[str]:
    return [r["run_id"] for r in json.loads(run("query", "--store", db, "--json", "SELECT run_id FROM runs").stdout)]


def test_report_of_checked_runs_needs_no_write_access(db):
    assert run("check", "--store", db, PLANTED, "--fail-on", "never").exit_code == 0
    (rid,) = _run_ids(db)
    os.chmod(db, 0o444)
    # While this process holds the store read-only, DuckDB refuses it a writable connection:
    # the report fails unless it opens the store read-only (chmod alone does not stop root).
    with duckdb.connect(str(db), read_only=True):
        r = run("report", "--store", db, "--format", "markdown", rid)
        assert r.exit_code == 0, r.stderr
        assert "### planted.sqlite" in r.stdout
        assert run("report", "--store", db, "--markdown", rid).stdout == r.stdout  # the older spelling
        bad = run("report", "--store", db, "--format", "pdf", rid)
        assert bad.exit_code == 2 and "--format must be one of html, markdown, not 'pdf'" in bad.stderr
        assert run("ingest", "--store", db, CLEAN).exit_code == 2  # the hold does stop a writer


def test_report_of_a_run_never_checked_runs_its_rules(db):
    assert run("ingest", "--store", db, PLANTED).exit_code == 0
    (rid,) = _run_ids(db)
    r = run("report", "--store", db, "--markdown", rid)
    assert r.exit_code == 0, r.stderr
    q = run("query", "--store", db, "--json", "SELECT count(*) AS n FROM rule_runs")
    assert json.loads(q.stdout)[0]["n"] > 0


def test_check_takes_a_stored_run_by_id_prefix_or_file_name(db):
    assert run("ingest", "--store", db, PLANTED).exit_code == 0
    (rid,) = _run_ids(db)
    r = run("check", "--store", db, "--format", "json", "--fail-on", "never", rid[:6])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["run_id"] for x in doc["runs"]] == [rid] and any(f["rule_id"] == "T002" for f in doc["findings"])
    assert run("check", "--store", db, "--fail-on", "never", PLANTED.name).exit_code == 0
    missing = run("check", "--store", db, "nope")
    assert missing.exit_code == 2 and "nope: no such file, and no run matches 'nope'" in missing.stderr


def test_check_refuses_an_unknown_or_bad_severity_floor(tmp_path):
    trace = str(FIXTURES / "kineto" / "bottleneck_library.json")
    store = str(tmp_path / "s.duckdb")
    bad = runner.invoke(app, ["check", trace, "--store", store, "--threshold", "floor.min_loss_ns=-1"])
    assert bad.exit_code == 2 and "floor.min_loss_ns must be" in bad.output
    unknown = runner.invoke(app, ["check", trace, "--store", store, "--threshold", "floor.bogus=1"])
    assert unknown.exit_code == 2 and "floor has no threshold 'bogus'" in unknown.output
