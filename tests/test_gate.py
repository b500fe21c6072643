"""The CI gate: one exit-code convention, input errors in every artifact, baselines that
survive renamed and re-recorded traces, `scan` as a gate, and help a stranger can read."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from typer.testing import CliRunner

from traceanalyzer import __version__
from traceanalyzer.fmt import ns as fmt_ns
from traceanalyzer.rules import all_rules
from traceanalyzer.cli import app

from .conftest import FIXTURES, shared_file

runner = CliRunner()
KINETO = FIXTURES / "kineto" / "planted.json"
PLANTED = FIXTURES / "nsys" / "planted.sqlite"
CLEAN = FIXTURES / "nsys" / "clean.sqlite"


def run(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"}, catch_exceptions=False)


def _trace(src: Path, dest: Path, *, shift_us: float = 0.0, stretch: float = 1.0) -> Path:
    """`src` re-recorded: every time shifted by `shift_us`, every time and duration scaled
    by `stretch` about the first event (other bytes, so another run)."""
    doc = json.loads(src.read_text())
    t0 = min(e["ts"] for e in doc["traceEvents"] if "ts" in e)
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = t0 + (e["ts"] - t0) * stretch + shift_us
        if "dur" in e:
            e["dur"] = e["dur"] * stretch
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(doc))
    return dest


@pytest.fixture
def bad(tmp_path) -> Path:
    p = tmp_path / "cut.json"
    p.write_text('{"traceEvents": [{"ph": "X", "name": "k", ')
    return p


# -- one exit-code convention ------------------------------------------------------------

@pytest.mark.parametrize("command", ["ingest", "check", "scan", "report"])
def test_an_unreadable_input_exits_2_in_every_command(tmp_path, bad, command):
    extra = {"check": ["--fail-on", "never"], "scan": ["--jobs", "1", "--fail-on", "never"],
             "report": ["-o", tmp_path / "r.html"]}.get(command, [])
    r = run(command, "--store", tmp_path / "s.duckdb", *extra, CLEAN, bad)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert f"error: {bad}: " in r.stderr
    if command in ("check", "scan"):  # what was readable is still checked and reported
        assert "clean.sqlite" in r.stdout


def test_diff_with_an_unreadable_input_exits_2(tmp_path, bad):
    r = run("diff", "--store", tmp_path / "s.duckdb", CLEAN, bad)
    assert r.exit_code == 2 and "error:" in r.stderr


DIFF_A100, DIFF_V100 = FIXTURES / "kineto" / "diff_a100_rank3.json", FIXTURES / "kineto" / "diff_v100_rank1.json"


def test_diff_keeps_exit_2_for_bad_input_and_fails_the_gate_on_an_inconclusive_comparison(tmp_path):
    """Exit 2: input or usage. Exit 1: the gate, which fails on what it cannot judge (runs not
    alike, no end-to-end time in both), the reasons on stderr."""
    store = tmp_path / "s.duckdb"
    r = run("diff", "--store", store, "--format", "xml", CLEAN, PLANTED)
    assert r.exit_code == 2 and "--format must be text or json" in r.stderr
    r = run("diff", "--store", store, "--gate", "5", DIFF_A100, DIFF_V100)
    assert r.exit_code == 1 and "gate 5%: FAIL: inconclusive comparison" in r.stdout, r.stdout + r.stderr
    assert re.search(r"gate 5%: inconclusive: the runs are not alike \(GPU model: base .*A100.*, test .*V100", r.stderr)
    assert run("diff", "--store", store, "--gate", "1000", "--allow-different-hardware", DIFF_A100,
               DIFF_V100).exit_code == 0
    assert run("diff", "--store", store, DIFF_A100, DIFF_V100).exit_code == 0  # no gate: nothing fails
    ncu, timeline = FIXTURES / "ncu" / "raw_waves.csv", FIXTURES / "torch-memory" / "timeline_train.raw.json.gz"
    r = run("diff", "--store", store, "--gate", "5", ncu, timeline)
    assert r.exit_code == 1 and "inconclusive: no end-to-end time in both runs" in r.stderr, r.stdout + r.stderr


def test_diff_writes_the_comparison_to_a_file_and_the_verdict_to_the_log(tmp_path):
    store = tmp_path / "s.duckdb"
    slower = _trace(KINETO, tmp_path / "slower.json", stretch=1.5)
    out = tmp_path / "diff.json"
    r = run("diff", "--store", store, "--format", "json", "-o", out, "--gate", "5", KINETO, slower)
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "REGRESSED" and doc["gate"]["pct"] == 5 and doc["gate"]["failures"]
    assert r.exit_code == 1 and r.stdout.splitlines() == [f"verdict: {doc['verdict_line']}",
                                                          "gate 5%: FAIL: " + "; ".join(doc["gate"]["failures"])]
    text = tmp_path / "diff.txt"
    r = run("diff", "--store", store, "-o", text, KINETO, slower)
    assert r.exit_code == 0 and r.stdout == f"verdict: {doc['verdict_line']}\n"
    assert "End-to-end time" in text.read_text() and f"verdict: {doc['verdict_line']}" in text.read_text()
    r = run("diff", "--store", store, "-o", tmp_path / "no such folder" / "x.txt", KINETO, slower)
    assert r.exit_code == 2 and "cannot write" in r.stderr


@pytest.mark.parametrize("args", [("check", "--format", "xml"), ("scan", "--fail-on", "sometimes"),
                                  ("check", "--max-growth", "10"), ("scan", "--threshold", "T001.nope=1")])
def test_a_usage_error_exits_2(tmp_path, args):
    r = run(*args, "--store", tmp_path / "s.duckdb", CLEAN)
    assert r.exit_code == 2 and "error:" in r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("command", ["check", "scan"])
def test_the_gate_exits_1_on_findings_and_0_when_they_do_not_reach_it(tmp_path, command):
    jobs = ["--jobs", "1"] if command == "scan" else []
    r = run(command, "--store", tmp_path / "s.duckdb", *jobs, "--fail-on", "warning", PLANTED)
    assert r.exit_code == 1 and "FAIL" in r.stdout, r.stdout + r.stderr
    r = run(command, "--store", tmp_path / "s.duckdb", *jobs, "--fail-on", "never", PLANTED)
    assert r.exit_code == 0 and "OK" in r.stdout, r.stdout + r.stderr


# -- input errors in every artifact --------------------------------------------------------

@pytest.mark.parametrize("command", ["check", "scan"])
def test_input_errors_are_in_every_artifact(tmp_path, bad, command):
    jobs = ["--jobs", "1"] if command == "scan" else []

    def artifact(fmt: str) -> str:
        out = tmp_path / f"out.{fmt}"
        r = run(command, "--store", tmp_path / "s.duckdb", *jobs, "--fail-on", "never", "--format", fmt,
                "-o", out, CLEAN, bad)
        assert r.exit_code == 2, r.stdout + r.stderr
        return out.read_text()

    doc = json.loads(artifact("json"))
    assert doc["failed"] is True
    assert [e["path"] for e in doc["errors"]] == [str(bad)] and "invalid JSON" in doc["errors"][0]["message"]

    sarif = json.loads(artifact("sarif"))
    inv = sarif["runs"][0]["invocations"][0]
    assert inv["executionSuccessful"] is False
    (note,) = inv["toolExecutionNotifications"]
    assert note["level"] == "error" and "invalid JSON" in note["message"]["text"]
    assert note["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("cut.json")

    root = ET.fromstring(artifact("junit"))
    failed = [c for c in root.iter("testcase") if c.find("failure") is not None and c.get("name") == str(bad)]
    assert len(failed) == 1 and "invalid JSON" in failed[0].find("failure").get("message")

    text = artifact("text")
    assert "OK" not in text and "FAIL: 1 input(s) could not be read" in text and str(bad) in text


def test_the_sarif_of_an_input_error_validates(tmp_path, bad):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(shared_file("schemas/sarif-schema-2.1.0.json").read_text())
    out = tmp_path / "f.sarif"
    run("check", "--store", tmp_path / "s.duckdb", "--format", "sarif", "-o", out, PLANTED, bad)
    errors = sorted(jsonschema.Draft4Validator(schema).iter_errors(json.loads(out.read_text())), key=str)
    assert not errors, errors[0]


def test_the_junit_of_an_input_error_validates(tmp_path, bad):
    xmlschema = pytest.importorskip("xmlschema")
    out = tmp_path / "f.xml"
    run("check", "--store", tmp_path / "s.duckdb", "--format", "junit", "-o", out, PLANTED, bad)
    xmlschema.XMLSchema(str(shared_file("schemas/junit.xsd"))).validate(str(out))


def test_every_artifact_counts_a_root_cause_once(tmp_path):
    """timeline_sync's idle is seen by several rules: one headline error carries it. JSON lists
    every finding (related ones point at their headline), SARIF has a result per headline with
    the related ones in it, the gate counts headlines, and the SARIF still validates."""
    sync = FIXTURES / "nsys" / "timeline_sync.sqlite"
    out = {}
    for fmt in ("json", "sarif", "junit"):
        out[fmt] = tmp_path / f"r.{fmt}"
        r = run("check", "--store", tmp_path / "s.duckdb", "--format", fmt, "-o", out[fmt], sync)
        assert r.exit_code == 1
    doc = json.loads(out["json"].read_text())
    heads = [f for f in doc["findings"] if f["related_to"] is None]
    related = [f for f in doc["findings"] if f["related_to"] is not None]
    assert related and {f["related_to"] for f in related} <= {f["finding_no"] for f in heads}
    assert all(f["est_loss_ns"] is None for f in related) and any(f["rule_loss_ns"] for f in related)
    assert doc["counts"] == {s: sum(f["severity"] == s for f in heads) for s in ("info", "warning", "error")}
    sarif = json.loads(out["sarif"].read_text())
    results = sarif["runs"][0]["results"]
    assert len(results) == len(heads)
    assert sum(len(r["properties"].get("related", [])) for r in results) == len(related)
    failures = ET.parse(out["junit"]).getroot().iter("failure")
    assert sum(1 for _ in failures) == len({f["rule_id"] for f in heads if f["severity"] == "error"})
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(shared_file("schemas/sarif-schema-2.1.0.json").read_text())
    assert not list(jsonschema.Draft4Validator(schema).iter_errors(sarif))


# -- baselines that survive CI --------------------------------------------------------------

def _baseline(tmp_path) -> Path:
    first = _trace(KINETO, tmp_path / "job1" / "worker0.1733011200123.pt.trace.json")
    base = tmp_path / "baseline.json"
    r = run("check", "--store", tmp_path / "job1.duckdb", "--fail-on", "never", "--write-baseline", base, first)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert len(json.loads(base.read_text())["findings"]) >= 5
    return base


def test_a_baseline_matches_a_renamed_rerecorded_trace_in_a_fresh_store(tmp_path):
    base = _baseline(tmp_path)
    # The next CI job: another recording (times shifted), another name, a new store.
    second = _trace(KINETO, tmp_path / "job2" / "worker0.1733097600456.pt.trace.json", shift_us=86_400e6)
    out = tmp_path / "job2.json"
    r = run("check", "--store", tmp_path / "job2.duckdb", "--fail-on", "info", "--baseline", base,
            "--format", "json", "-o", out, second)
    assert r.exit_code == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["findings"] and not any(f["new"] for f in doc["findings"])
    # Without the baseline the same findings fail the gate: the match is what passed it.
    assert run("check", "--store", tmp_path / "job2.duckdb", "--fail-on", "info", second).exit_code == 1


def test_max_growth_fails_a_baselined_finding_that_grew(tmp_path):
    base = _baseline(tmp_path)
    grown = _trace(KINETO, tmp_path / "job2" / "worker0.1733097600456.pt.trace.json", stretch=2.5)
    store = tmp_path / "job2.duckdb"
    # B005 reports FP32 GEMM time from 1 ms: the planted 0.84 ms, stretched, is a new finding, not growth
    common = ("check", "--store", store, "--fail-on", "warning", "--baseline", base, "--ignore", "B005")
    assert run(*common, grown).exit_code == 0  # in the baseline, growth not asked about
    assert run(*common, "--max-growth", "1e9", grown).exit_code == 0  # nothing grew that much
    out = tmp_path / "grown.json"
    r = run(*common, "--max-growth", "50", "--format", "json", "-o", out, grown)
    assert r.exit_code == 1, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    baselined = [f for f in doc["findings"] if not f["new"]]
    assert len(baselined) == len(doc["findings"])
    for f in baselined:  # grown exactly when the loss grew by more than 50%
        assert f["grown"] == (f["growth_pct"] is not None and f["growth_pct"] > 50), f
    # Copy time and first-call time scale with the trace: +150%.
    t002 = [f for f in baselined if f["rule_id"] == "T002"]
    assert t002 and all(f["grown"] and f["growth_pct"] == pytest.approx(150, abs=0.5) for f in t002)
    text = run(*common, "--max-growth", "50", grown).stdout
    assert "grew +150% beyond --max-growth" in text


def test_a_fingerprint_names_what_the_finding_is_about_not_the_file(tmp_path):
    a = _trace(KINETO, tmp_path / "a.json")
    b = _trace(KINETO, tmp_path / "b.json", shift_us=5e6)
    outs = []
    for p in (a, b):
        out = tmp_path / f"{p.stem}.out.json"
        run("check", "--store", tmp_path / "s.duckdb", "--fail-on", "never", "--format", "json", "-o", out, p)
        outs.append(sorted(f["fingerprint"] for f in json.loads(out.read_text())["findings"]))
    assert outs[0] == outs[1] and len(set(outs[0])) >= 5


# -- scan is a gate too ---------------------------------------------------------------------

def test_scan_writes_the_same_report_as_check(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for f in (PLANTED, CLEAN, KINETO):
        shutil.copy(f, folder)
    docs = {}
    for command in ("check", "scan"):
        out = tmp_path / f"{command}.json"
        r = run(command, "--store", tmp_path / f"{command}.duckdb", "--fail-on", "warning", "--format", "json",
                "-o", out, folder)
        assert r.exit_code == 1, r.stdout + r.stderr
        docs[command] = json.loads(out.read_text())
    keys = [sorted((f["file_name"], f["rule_id"], f["fingerprint"], f["est_loss_ns"] or 0) for f in d["findings"])
            for d in docs.values()]
    assert keys[0] == keys[1] and docs["scan"]["counts"] == docs["check"]["counts"]


def test_scan_prints_plain_progress_lines_to_a_log(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for i, f in enumerate((PLANTED, CLEAN, KINETO)):
        shutil.copy(f, folder / f"{i}_{f.name}")
    r = run("scan", "--store", tmp_path / "s.duckdb", "--jobs", "1", "--fail-on", "never", folder)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("scan: ")]
    assert lines and lines[-1].startswith("scan: 3/3 files, "), r.stderr
    assert all(re.fullmatch(r"scan: \d/3 files, [\d.,]+ of [\d.,]+ MB, \d+:\d\d:\d\d elapsed(, ETA .*)?", ln)
               for ln in lines), lines


# -- what a folder scan passes over ---------------------------------------------------------

def test_a_folder_scan_passes_over_what_is_no_trace(tmp_path):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(KINETO, folder)
    (folder / "config.json").write_text('{"lr": 0.1}')
    (folder / "sub" / "expected.json").write_text('{"findings": []}')
    (folder / "results.csv").write_text("step,loss\n1,0.5\n")
    r = run("scan", "--store", tmp_path / "s.duckdb", "--jobs", "1", "--fail-on", "never", folder)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "note: passed over 3 file(s) that are no traces (--verbose lists them)" in r.stderr
    assert "error:" not in r.stderr
    r = run("scan", "--store", tmp_path / "s.duckdb", "--fail-on", "never", "--verbose", folder)
    listed = sorted(ln.split(": ")[1] for ln in r.stderr.splitlines() if ln.startswith("skipped: "))
    assert listed == sorted(str(folder / n) for n in ("config.json", "results.csv", "sub/expected.json"))
    # Named on the command line, the same file is an error.
    r = run("check", "--store", tmp_path / "s.duckdb", folder / "config.json")
    assert r.exit_code == 2 and f"error: {folder / 'config.json'}: " in r.stderr


def test_a_folder_scan_reads_the_export_not_the_nsys_report_beside_it(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(CLEAN, folder / "report1.sqlite")
    (folder / "report1.nsys-rep").write_bytes(b"\x00binary report")
    (folder / "lonely.nsys-rep").write_bytes(b"\x00binary report")
    r = run("scan", "--store", tmp_path / "s.duckdb", "--jobs", "1", "--fail-on", "never", "-v", folder)
    assert r.exit_code == 2  # the report with no export is an input error with the way to export it
    assert f"error: {folder / 'lonely.nsys-rep'}: an Nsight Systems report: export it" in r.stderr
    assert f"skipped: {folder / 'report1.nsys-rep'}: " in r.stderr


# -- help a stranger can read ---------------------------------------------------------------

def test_version_and_short_help():
    r = run("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"traceanalyzer {__version__}"
    assert run("-h").exit_code == 0 and "check" in run("-h").stdout
    assert run("check", "-h").exit_code == 0


def _commands() -> list[str]:
    return sorted(c.name or c.callback.__name__ for c in app.registered_commands)


@pytest.mark.parametrize("command", _commands())
def test_help_shows_plain_metavars_and_sentences(command):
    r = run(command, "--help")
    assert r.exit_code == 0
    assert not re.search(r"<(bool|str|int|float|path|list\[str\])>|\[default: None\]", r.stdout), r.stdout
    assert "Where to write ." not in r.stdout
    for line in r.stdout.splitlines():  # an option that takes a value names it, not its Python type
        if re.match(r"\W*--[a-z]", line):
            assert not re.search(r"\s(TEXT|INTEGER|FLOAT|BOOLEAN)(\s|$)", line), line


def test_report_says_which_rules_did_not_run(tmp_path):
    store = tmp_path / "s.duckdb"
    assert run("check", "--store", store, "--select", "T001", "--fail-on", "never", PLANTED).exit_code == 0
    md = run("report", "--store", store, "--markdown", PLANTED).stdout
    assert "Not run (not selected when it was checked): " in md and "B001" in md and "T002" in md
    assert run("report", "--store", store, "-o", tmp_path / "r.html", PLANTED).exit_code == 0
    html = (tmp_path / "r.html").read_text()
    others = len(all_rules()) - 1  # every rule but T001
    assert re.search(rf"{others} rule\(s\) not run on this trace \(not selected when it was checked\): S001, S002, S003, T002, ",
                     html)
    text = run("check", "--store", store, "--select", "T001", "--fail-on", "never", PLANTED).stdout
    assert "not run (not selected): " in text


def test_the_formats_are_one_registry_that_help_and_validation_read(tmp_path):
    from traceanalyzer.report import FORMATS

    for command in ("check", "scan"):
        help_text = " ".join(run(command, "--help").stdout.split())
        names = list(FORMATS)
        assert f"The report's format: {', '.join(names[:-1])} or {names[-1]}." in help_text, help_text
    for name in FORMATS:
        out = tmp_path / f"out.{name}"
        r = run("check", "--store", tmp_path / "s.duckdb", "--fail-on", "never", "--format", name, "-o", out, CLEAN)
        assert r.exit_code == 0 and out.stat().st_size > 0, (name, r.stdout + r.stderr)


def test_reader_warnings_and_losses_reach_every_artifact(tmp_path):
    """What the reader met in a trace (WeatherBench2: no kernel table) is in SARIF (a warning
    notification on the file), JUnit (the run's suite's system-err) and markdown, as in JSON
    and HTML; a finding's estimated loss is in the SARIF message and the JUnit failure, as in
    the terminal (Rodinia's B002: est. loss 1.63 s)."""
    from .conftest import shared_traces

    weather = shared_traces() / "nsys" / "WeatherBench2__report1.sqlite"
    rodinia = shared_traces() / "nsys" / "Rodinia_Gaussian__report2.sqlite"
    store = tmp_path / "s.duckdb"

    def artifact(fmt: str) -> str:
        out = tmp_path / f"out.{fmt}"
        r = run("check", "--store", store, "--fail-on", "warning", "--format", fmt, "-o", out, weather, rodinia)
        assert r.exit_code == 1, r.stdout + r.stderr
        return out.read_text()

    warning = "no kernel table (CUPTI_ACTIVITY_KIND_KERNEL): the capture recorded no kernels"
    doc = json.loads(artifact("json"))
    b002 = next(f for f in doc["findings"] if f["rule_id"] == "B002" and f["related_to"] is None and f["est_loss_ns"])
    loss = f"est. loss {fmt_ns(b002['est_loss_ns'])}"
    sarif = json.loads(artifact("sarif"))
    notes = [n for n in sarif["runs"][0]["invocations"][0]["toolExecutionNotifications"]
             if n["descriptor"]["id"] == "reader-warning"]
    assert [n["level"] for n in notes] == ["warning"] and warning in notes[0]["message"]["text"]
    assert notes[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("WeatherBench2__report1.sqlite")
    (result,) = [x for x in sarif["runs"][0]["results"] if x["partialFingerprints"]["traceanalyzerFinding/v2"] == b002["fingerprint"]]
    assert loss in result["message"]["text"]
    root = ET.fromstring(artifact("junit"))
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert suites["traceanalyzer.WeatherBench2__report1.sqlite"].find("system-err").text == f"warning: {warning}"
    failures = [c.find("failure") for c in suites["traceanalyzer.Rodinia_Gaussian__report2.sqlite"].iter("testcase")
                if c.find("failure") is not None]
    assert any(loss in (f.text or "") for f in failures)
    md = run("report", "--markdown", "--store", store)
    assert md.exit_code == 0 and f"reader warning: {warning}" in md.stdout.replace("\\", "")
