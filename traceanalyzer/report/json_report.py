"""Machine-readable findings: one JSON document."""

from __future__ import annotations

import json

from .. import __version__
from .model import CheckResult


def render(result: CheckResult, **_) -> str:
    doc = {
        "tool": {"name": "traceanalyzer", "version": __version__},
        "fail_on": result.fail_on,
        "failed": bool(result.failing()),
        "counts": result.counts(),
        "runs": [{**r, "counts": result.counts(r["run_id"]),
                  "rules": [o for o in result.outcomes if o["run_id"] == r["run_id"]]}
                 for r in result.runs],
        "findings": [{**f, "new": result.is_new(f)} for f in result.findings],
        "errors": result.errors,
    }
    return json.dumps(doc, indent=2, default=str) + "\n"
