"""SARIF 2.1.0 (what GitHub code scanning reads): one result per finding.

A finding's location is the trace file (relative to the current folder when it lies
under it) plus a logical location naming the run, device, stream and item, so a
reader can find the rows in the trace.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import __version__, fmt
from ..ingest import resolved
from ..rules import all_rules
from .model import CheckResult

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _uri(source_path: str, base: Path) -> str:
    p = resolved(source_path)
    try:
        return p.relative_to(base.resolve()).as_posix()
    except ValueError:
        return p.as_uri()


def _notification(e, base: Path) -> dict:
    """An input that could not be read: its file and the reason."""
    return {"level": "error", "message": {"text": f"{e.path}: {e.message}"},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(e.path, base)}}}],
            "descriptor": {"id": "input-error"}}


def _reader_warning(run: dict, warning: str, base: Path) -> dict:
    """A problem the reader met in a trace it read (a missing table, dropped rows)."""
    return {"level": "warning", "message": {"text": f"{run['file_name']}: {warning}"},
            "descriptor": {"id": "reader-warning"}, "properties": {"run_id": run["run_id"]},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(run["source_path"], base)}}}]}


def _rule_notification(o: dict, run: dict | None, index: dict[str, int], base: Path) -> dict:
    """A rule that raised on a run: its rule, the trace file and the exception, in one line."""
    note = {"level": "error", "message": {"text": f"{o['rule_id']} raised on run {o['run_id']}: {o['note']}"},
            "descriptor": {"id": "rule-error"}, "properties": {"run_id": o["run_id"]}}
    if o["rule_id"] in index:
        note["associatedRule"] = {"id": o["rule_id"], "index": index[o["rule_id"]]}
    if run is not None and run.get("source_path"):
        note["locations"] = [{"physicalLocation": {"artifactLocation": {"uri": _uri(run["source_path"], base)}}}]
    return note


def _descriptor(rule) -> dict:
    # Default thresholds, those it reads from another rule too (`Rule.shared`: set as RULE.name).
    props = {"tags": ["performance", rule.phase], "thresholds": rule.params()}
    if rule.shared:
        props["sharedThresholds"] = list(rule.shared)
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.title},
        "fullDescription": {"text": rule.what},
        "help": {"text": f"{rule.why}\n\nHow to fix: {rule.fix}",
                 "markdown": f"{rule.why}\n\n**How to fix:** {rule.fix}"},
        "defaultConfiguration": {"level": _LEVEL[rule.severity]},
        "properties": props,
    }


def render(result: CheckResult, base: Path | None = None, **_) -> str:
    base = base or Path.cwd()
    rules = list(all_rules())
    index = {r.id: i for i, r in enumerate(rules)}
    runs = {r["run_id"]: r for r in result.runs}
    rule_errors = result.rule_errors()
    results = []
    for f in result.headlines():  # one result per root cause; what else saw it rides along
        where = "/".join(x for x in (
            f"run {f['run_id']}",
            None if f["device_id"] is None else f"device {f['device_id']}",
            None if f["stream_id"] is None else f"stream {f['stream_id']}",
            None if f["item_kind"] in (None, "stream", "device") else f"{f['item_kind']} {f['item_id']}",
        ) if x)
        props = {k: f[k] for k in ("run_id", "device_id", "stream_id", "item_kind", "item_id", "item_name",
                                   "start_ns", "end_ns", "value", "value_unit", "threshold", "est_loss_ns")
                 if f.get(k) is not None}
        props["new"] = result.is_new(f)
        if result.grown(f):
            props["grown_beyond_max_growth"] = True
        if f.get("evidence") is not None:
            props["evidence"] = f["evidence"]
        related = result.related(f)
        if related:
            props["related"] = [{"rule_id": r["rule_id"], "message": r["message"], "fingerprint": r["fingerprint"],
                                 "rule_loss_ns": r.get("rule_loss_ns")} for r in related]
        text = f["message"] + fmt.loss_note(f.get("est_loss_ns")) + (f" Hint: {f['hint']}" if f.get("hint") else "") + \
            "".join(f" Related: {r['rule_id']} {r['message']}" for r in related)
        results.append({
            "ruleId": f["rule_id"],
            "ruleIndex": index[f["rule_id"]],
            "level": _LEVEL[f["severity"]],
            "message": {"text": text},
            "locations": [{
                "physicalLocation": {"artifactLocation": {"uri": _uri(f["source_path"], base)}},
                "logicalLocations": [{"name": f.get("item_name") or where, "fullyQualifiedName": where,
                                      "kind": "object"}],
            }],
            "partialFingerprints": {"traceanalyzerFinding/v2": f["fingerprint"]},
            "properties": props,
        })
    doc = {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "traceanalyzer", "version": __version__,
                                "informationUri": "https://example.invalid/traceanalyzer/docs/rules",
                                "rules": [_descriptor(r) for r in rules]}},
            "artifacts": [{"location": {"uri": _uri(r["source_path"], base)}} for r in result.runs],
            "invocations": [{"executionSuccessful": not (result.errors or rule_errors),
                             "toolExecutionNotifications": [_notification(e, base) for e in result.errors]
                             + [_rule_notification(o, runs.get(o["run_id"]), index, base) for o in rule_errors]
                             + [_reader_warning(r, w, base) for r in result.runs for w in r.get("warnings") or []]}],
            "results": results,
        }],
    }
    return json.dumps(doc, indent=2, default=str) + "\n"
