"""The terminal report: wrapped lines with a hanging indent, one line for the rules not
applicable (each with --verbose, none with -q), and many findings of one rule on different
kernels printed as one block, the largest first, while JSON and SARIF keep every finding."""

from __future__ import annotations

import io
import json
import re

from rich.console import Console
from typer.testing import CliRunner

from traceanalyzer.cli import app
from traceanalyzer.report import render
from traceanalyzer.report.model import CheckResult
from traceanalyzer.report.text import GROUP_AT, INDENT, TOP_LISTED, blocks, print_result

from .conftest import shared_traces

RID = "0123456789abcdef"
POLYFHE = "ncu/PolyFHE__profile__evalstall-stallreason-opt.csv"


def finding(no: int, rule: str = "I001", kernel: str | None = None, severity: str = "warning", **kw) -> dict:
    f = {"run_id": RID, "rule_id": rule, "severity": severity, "finding_no": no, "related_to": None,
         "device_id": 0, "stream_id": None, "item_kind": "kernel" if kernel else None, "item_id": no,
         "item_name": kernel, "start_ns": None, "end_ns": None, "value": None, "value_unit": "share",
         "threshold": None, "est_loss_ns": None, "rule_loss_ns": None, "claims": "compute",
         "message": f"{kernel or 'device 0'}: a finding of {rule}", "hint": f"the hint of {rule}",
         "evidence": None, "fingerprint": f"fp{no:04d}", "vendor": None, "file_name": "t.csv", "source_path": "/t.csv"}
    f.update(kw)
    return f


def result_of(findings: list[dict], outcomes: list[dict] = ()) -> CheckResult:
    run = {"run_id": RID, "file_name": "t.csv", "format": "ncu-csv", "start_ns": None, "budget": []}
    return CheckResult([run], list(outcomes), findings)


def text(result: CheckResult, width: int = 100, **kw) -> str:
    buf = io.StringIO()
    print_result(result, Console(file=buf, width=width, no_color=True, highlight=False), **kw)
    return buf.getvalue()


def no_data(rule: str, note: str) -> dict:
    return {"run_id": RID, "rule_id": rule, "status": "no-data", "findings": 0, "note": note}


def test_rules_not_applicable_are_one_line_listed_with_verbose_hidden_with_quiet():
    outcomes = [no_data("B003", "needs Speed Of Light percentages"), no_data("M001", "needs allocator events"),
                {"run_id": RID, "rule_id": "T001", "status": "ran", "findings": 0, "note": ""}]
    res = result_of([], outcomes)
    plain = text(res)
    assert "2 rules not applicable (B003, M001; --verbose says what each needs)" in plain
    assert "needs allocator events" not in plain and "T001" not in plain
    verbose = text(res, verbose=True)
    assert "B003 not applicable: needs Speed Of Light percentages" in verbose
    assert "M001 not applicable: needs allocator events" in verbose and "rules not applicable (" not in verbose
    assert "not applicable" not in text(res, show_info=False)


def test_lines_wrap_to_the_width_with_a_hanging_indent():
    words = " ".join(f"word{i}" for i in range(60))
    res = result_of([finding(1, "T001", message=f"stream 7: {words}", hint=f"do {words}", est_loss_ns=5_000)])
    out = text(res, width=80)
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    start = next(i for i, ln in enumerate(lines) if ln.startswith("warning T001 stream 7: word0"))
    hint = next(i for i, ln in enumerate(lines) if ln.startswith(" " * INDENT + "hint: do word0"))
    body = lines[start + 1:hint]
    assert len(body) >= 4 and all(ln.startswith(" " * INDENT) and ln[INDENT] != " " for ln in body)
    # continuation lines of the hint start under its text, after "hint: "
    rest = [ln for ln in lines[hint + 1:] if ln.startswith(" " * (INDENT + 6)) and ln[INDENT + 6] != " "]
    assert len(rest) >= 3
    # nothing is lost to the wrapping
    flat = " ".join(" ".join(lines[start:hint]).split())
    assert flat == f"warning T001 stream 7: {words} · est. loss 5 us"


def test_many_findings_of_one_rule_on_kernels_print_as_one_block_largest_first():
    n = 12
    fs = [finding(i + 1, rule="I004", kernel=f"k{i}", value=0.3 + i / 100, threshold=0.3) for i in range(n)]
    fs[7]["est_loss_ns"] = 9_000  # a loss weighs most, then the kernel's time, then the value
    fs[2]["evidence"] = {"duration_ns": 50_000.0, "average_ways": 4.0, "bank_conflicts": 10.0, "conflict_share": 0.5,
                         "l1tex_throughput_pct": None, "launches": 1, "op": "load", "requests": 10.0,
                         "source": "counters", "wavefronts": 20.0}  # I004's evidence (its rule's type)
    fs.append(finding(n + 1, rule="B004", kernel="k5", related_to=6))  # related to k5 (finding_no 6)
    fs.append(finding(n + 2, rule="T002", message="device 0: copies"))  # not about a kernel
    res = result_of(fs)
    out = text(res, width=200)
    assert len(re.findall("^warning ", out, re.M)) == 2  # the block and T002
    assert re.search(rf"warning I004 Shared-memory bank conflicts: {n} kernels · est\. loss 9 us in all · "
                     rf"50 us of kernel time \(top {TOP_LISTED} listed, --verbose for all\)", out)
    listed = re.findall(r"^ {8}- (k\d+):", out, re.M)
    assert listed == ["k7", "k2", "k11"]  # loss, then duration, then furthest past the threshold
    assert f"… {n - TOP_LISTED} more kernel(s)" in out
    assert out.count("hint: the hint of I004") == 1 and "k5:" not in out
    assert "warning T002 device 0: copies" in out
    # --verbose lists every one, each with its own hint and related findings
    full = text(res, width=200, verbose=True)
    assert re.findall(r"^ {8}- (k\d+):", full, re.M)[:3] == ["k7", "k2", "k11"]
    assert len(re.findall(r"^ {8}- k\d+:", full, re.M)) == n
    assert full.count("hint: the hint of I004") == n and "related: B004 k5: a finding of B004" in full


def test_a_block_keeps_related_findings_readable_and_few_findings_stay_apart():
    fs = [finding(i + 1, kernel=f"k{i}", est_loss_ns=10_000 - i) for i in range(GROUP_AT)]
    fs += [finding(10, rule="B002", kernel="k0", related_to=1), finding(11, rule="B002", kernel="k0", related_to=1),
           finding(12, rule="I003", kernel="k0", related_to=1)]
    out = text(result_of(fs), width=200)
    lines = out.splitlines()
    k0 = next(i for i, ln in enumerate(lines) if ln.startswith(" " * INDENT + "- k0:"))
    assert lines[k0 + 1] == " " * (INDENT + 2) + "related: B002 ×2, I003 (the same root cause; --verbose shows them)"
    # one fewer: each finding on its own
    few = fs[:GROUP_AT - 1]
    assert [len(b) for b in blocks(few)] == [1] * (GROUP_AT - 1)
    assert len(re.findall("^warning I001 k", text(result_of(few), width=200), re.M)) == GROUP_AT - 1
    # a block is of one severity; -q hides a block of info findings with them
    mixed = [finding(i + 1, kernel=f"k{i}", severity="info") for i in range(GROUP_AT)]
    mixed.append(finding(GROUP_AT + 1, kernel="kw", severity="warning"))
    assert f"info    I001 Dominant warp-stall reason: {GROUP_AT} kernels" in text(result_of(mixed), width=200)
    quiet = text(result_of(mixed), width=200, show_info=False)
    assert "warning I001 kw:" in quiet and "k0" not in quiet


def test_polyfhe_stall_findings_are_one_block_in_text_and_every_finding_in_json(tmp_path):
    path = shared_traces() / POLYFHE
    runner = CliRunner()
    args = ["check", "--store", str(tmp_path / "s.duckdb"), "--select", "I001,B003,M001", "--fail-on", "never"]
    r = runner.invoke(app, args + [str(path)])
    assert r.exit_code == 0, r.output
    doc = json.loads(runner.invoke(app, args + ["--format", "json", str(path)]).stdout)
    i001 = [f for f in doc["findings"] if f["rule_id"] == "I001" and f["related_to"] is None]
    assert len(i001) > 50 and len({f["item_name"] for f in i001}) == len(i001)
    assert len({f["message"] for f in i001}) == len(i001)  # each keeps its own data
    sarif = json.loads(runner.invoke(app, args + ["--format", "sarif", str(path)]).stdout)
    assert len(sarif["runs"][0]["results"]) == len(doc["findings"])
    assert f"I001 Dominant warp-stall reason: {len(i001)} kernels" in r.stdout
    assert len(re.findall(r"^ {8}- ", r.stdout, re.M)) == TOP_LISTED
    assert "2 rules not applicable (B003, M001; --verbose says what each needs)" in r.stdout
    verbose = runner.invoke(app, args + ["-v", str(path)]).stdout
    assert len(re.findall(r"^ {8}- ", verbose, re.M)) == len(i001) and "M001 not applicable: needs" in verbose
    quiet = runner.invoke(app, args + ["-q", str(path)]).stdout
    assert "not applicable" not in quiet
    # the block is presentation only: the JSON report of the same result lists every finding
    assert len(json.loads(render(result_of([finding(i + 1, kernel=f"k{i}") for i in range(9)]), "json"))
               ["findings"]) == 9
