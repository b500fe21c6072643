"""Machine-readable findings: one JSON document (also the baseline file's format)."""

from __future__ import annotations

import json
import math

from .. import __version__
from ..rules import evidence_of
from ..rules.evidence import NcuEvidence
from .model import CheckResult


def render(result: CheckResult, **_) -> str:
    doc = {
        "tool": {"name": "traceanalyzer", "version": __version__},
        "fail_on": result.fail_on,
        "failed": result.failed(),
        "counts": result.counts(),
        "runs": [{**r, "counts": result.counts(r["run_id"]),
                  "rules": [o for o in result.outcomes if o["run_id"] == r["run_id"]],
                  "rules_not_run": result.not_run(r["run_id"])}
                 for r in result.runs],
        "findings": [_finding(result, f) for f in result.findings],
        "errors": [e.as_dict() for e in result.errors],
        "rule_errors": rule_errors(result),
        "not_traces": [{"path": str(p), "what": why} for p, why in result.not_traces],
    }
    if result.baseline is not None:
        doc["baseline"] = {"max_growth_pct": result.baseline.max_growth_pct}
    return json.dumps(doc, indent=2, default=str) + "\n"


def rule_errors(result: CheckResult) -> list[dict]:
    """The rules that raised, one entry per (run, rule): `errors` keeps to unreadable inputs."""
    runs = {r["run_id"]: r for r in result.runs}
    return [{"run_id": o["run_id"], "file_name": runs.get(o["run_id"], {}).get("file_name"),
             "source_path": runs.get(o["run_id"], {}).get("source_path"),
             "rule_id": o["rule_id"], "message": o["note"]} for o in result.rule_errors()]


def _finding(result: CheckResult, f: dict) -> dict:
    out = {**f, "new": result.is_new(f)}
    ev = evidence_of(f["rule_id"], f.get("evidence"))
    # A finding an Nsight Compute rule made on a linked timeline's kernel (rules/_ncu.py `linked`)
    # says which timeline and how much of it the kernel is, beside its ncu evidence.
    if isinstance(ev, NcuEvidence) and ev.timeline_run_id is not None:
        out.update(timeline_run_id=ev.timeline_run_id, kernel_time_ns=ev.kernel_time_ns, kernel_share=ev.kernel_share)
    # Where the trace cannot tell the cause (rules/_unknown.py): one shape for every rule.
    if ev is not None and ev.cause == "unknown":
        out.update(cause="unknown", missing=list(ev.missing or []))
    if result.baseline is not None and not out["new"]:
        g = result.growth(f)
        out["growth_pct"] = None if g is None or math.isinf(g) else round(g, 3)
        out["grown"] = result.grown(f)
    return out
