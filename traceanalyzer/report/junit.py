"""JUnit XML in Ant's format: a test suite per run, a test case per rule.

A rule fails its case when it has findings at or above --fail-on (new ones, with a
baseline); a rule that raised on the run is an errored case (`<error type="RuleError">`,
the exception in one line); the findings below the bar are listed in the suite's system-out
(Ant's format has no per-case output) so nothing is hidden, and what the reader met in the
trace (a missing table, dropped rows) in its system-err. A rule that does not apply to a
run (it lacks the data) is no case: most rules apply to one kind of trace, and a "skipped"
case for each would outnumber the real ones on every CI dashboard. The suite's
`rules_not_applicable` property names them.
"""

from __future__ import annotations

import datetime as _dt
import re
import socket
from xml.etree import ElementTree as ET

from .. import __version__, fmt
from ..rules import all_rules
from .model import CheckResult, severity_rank

# XML 1.0 cannot carry most control characters, and kernel names are arbitrary text.
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _x(s) -> str:
    return _BAD_XML.sub("?", "" if s is None else str(s))


def _input_errors(root: ET.Element, result: CheckResult, host: str) -> None:
    """A suite of the inputs that could not be read: one failed case per file, named after it,
    stamped with the time of this report (UTC, as the runs' suites are)."""
    now = _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds")
    suite = ET.SubElement(root, "testsuite", {
        "name": "traceanalyzer.inputs", "package": "traceanalyzer", "id": str(len(result.runs)),
        "timestamp": now, "hostname": host, "tests": str(len(result.errors)),
        "failures": str(len(result.errors)), "errors": "0", "skipped": "0", "time": "0"})
    ET.SubElement(suite, "properties")
    for e in result.errors:
        case = ET.SubElement(suite, "testcase", {"name": _x(e.path), "classname": "traceanalyzer.inputs",
                                                 "time": "0"})
        ET.SubElement(case, "failure", {"message": _x(f"could not be read: {e.message}"),
                                        "type": "InputError"}).text = _x(f"{e.path}: {e.message}")
    ET.SubElement(suite, "system-out").text = ""
    ET.SubElement(suite, "system-err").text = ""


def render(result: CheckResult, **_) -> str:
    rules = {r.id: r for r in all_rules()}
    root = ET.Element("testsuites")
    host = _x(socket.gethostname()) or "localhost"
    for i, run in enumerate(result.runs):
        mine_all = [o for o in result.outcomes if o["run_id"] == run["run_id"]]
        outcomes = [o for o in mine_all if o["status"] != "no-data"]
        findings = [f for f in result.findings if f["run_id"] == run["run_id"]]
        failing = {id(f) for f in result.failing()}
        suite = ET.SubElement(root, "testsuite", {
            "name": _x(f"traceanalyzer.{run['file_name']}"), "package": "traceanalyzer", "id": str(i),
            "timestamp": (run.get("ingested_at") or "1970-01-01T00:00:00")[:19], "hostname": host,
            "tests": str(len(outcomes)), "time": "0",
        })
        props = ET.SubElement(suite, "properties")
        for k in ("run_id", "format", "source_path", "producer_version"):
            ET.SubElement(props, "property", {"name": k, "value": _x(run.get(k))})
        ET.SubElement(props, "property", {"name": "traceanalyzer_version", "value": __version__})
        ET.SubElement(props, "property", {"name": "rules_not_applicable", "value": " ".join(
            o["rule_id"] for o in mine_all if o["status"] == "no-data")})
        n_fail = n_err = 0
        below_bar = []  # findings that do not fail the check, listed in the suite's output
        for o in outcomes:
            rule = rules.get(o["rule_id"])
            case = ET.SubElement(suite, "testcase", {
                "name": _x(f"{o['rule_id']} {rule.name if rule else ''}".strip()),
                "classname": _x(f"traceanalyzer.{run['file_name']}"), "time": "0"})
            mine = [f for f in findings if f["rule_id"] == o["rule_id"]]
            bad = [f for f in mine if id(f) in failing]
            if o["status"] == "error":
                n_err += 1
                ET.SubElement(case, "error", {"message": _x(o["note"]), "type": "RuleError"}).text = _x(o["note"])
            elif bad:
                n_fail += 1
                worst = max(bad, key=lambda f: severity_rank(f["severity"]))
                el = ET.SubElement(case, "failure", {
                    "message": _x(f"{len(bad)} finding(s) at or above {result.fail_on}: {worst['message']}{fmt.loss_note(worst.get('est_loss_ns'))}"),
                    "type": worst["severity"]})
                el.text = _x("\n".join(f"[{f['severity']}] {f['message']}{fmt.loss_note(f.get('est_loss_ns'))}\n  hint: {f['hint']}"
                                       + "".join(f"\n  related: {r['rule_id']} {r['message']}" for r in result.related(f))
                                       for f in bad))
            below_bar += [f"{f['rule_id']} [{f['severity']}] {f['message']}"
                          + ("" if f.get("related_to") is None else f" (related to finding {f['related_to']})")
                          for f in mine if id(f) not in failing]
        suite.set("failures", str(n_fail))
        suite.set("errors", str(n_err))
        suite.set("skipped", "0")
        ET.SubElement(suite, "system-out").text = _x("\n".join(below_bar))
        # what the reader met in the trace (a missing table, dropped rows)
        ET.SubElement(suite, "system-err").text = _x("\n".join(f"warning: {w}" for w in run.get("warnings") or []))
    if result.errors:
        _input_errors(root, result, host)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
