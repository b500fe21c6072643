"""What a report shows: the runs checked, each rule's outcome, and the findings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..rules.base import SEVERITIES
from ..store import Store


def severity_rank(sev: str) -> int:
    return SEVERITIES.index(sev)


@dataclass
class CheckResult:
    runs: list[dict]  # runs rows (run_id, file_name, source_path, format, ...)
    outcomes: list[dict]  # rule_runs rows
    findings: list[dict]  # findings rows, evidence decoded, plus file_name / source_path
    fail_on: str = "error"
    new_fingerprints: set[str] | None = None  # with a baseline: the findings not in it
    errors: list[str] = field(default_factory=list)  # input errors (files that failed to ingest)

    def is_new(self, f: dict) -> bool:
        return self.new_fingerprints is None or f["fingerprint"] in self.new_fingerprints

    def failing(self) -> list[dict]:
        """Findings at or above --fail-on that count (new ones, with a baseline)."""
        if self.fail_on == "never":
            return []
        limit = severity_rank(self.fail_on)
        return [f for f in self.findings if severity_rank(f["severity"]) >= limit and self.is_new(f)]

    def counts(self, run_id: str | None = None) -> dict[str, int]:
        out = {s: 0 for s in SEVERITIES}
        for f in self.findings:
            if run_id is None or f["run_id"] == run_id:
                out[f["severity"]] += 1
        return out


def load_result(store: Store, run_ids: list[str], fail_on: str = "error") -> CheckResult:
    ids = list(run_ids)
    runs = _rows(store, "SELECT * FROM runs WHERE list_contains(?, run_id) ORDER BY file_name, run_id", ids)
    outcomes = _rows(store, "SELECT * FROM rule_runs WHERE list_contains(?, run_id) ORDER BY run_id, rule_id", ids)
    findings = _rows(store, """
        SELECT f.*, r.file_name, r.source_path FROM findings f JOIN runs r USING (run_id)
        WHERE list_contains(?, f.run_id)
        ORDER BY r.file_name, f.run_id,
                 CASE f.severity WHEN 'error' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END,
                 f.est_loss_ns DESC NULLS LAST, f.rule_id, f.fingerprint""", ids)
    for r in findings:
        r["evidence"] = json.loads(r["evidence"]) if r.get("evidence") else None
    return CheckResult(runs, outcomes, findings, fail_on)


def _rows(store: Store, sql: str, ids: list[str]) -> list[dict]:
    """Rows as plain Python dicts (None for NULL, ISO strings for timestamps)."""
    rows = store.arrow(sql, [ids]).to_pylist()
    for r in rows:
        for k, v in r.items():
            if hasattr(v, "isoformat"):
                r[k] = v.isoformat()
    return rows
