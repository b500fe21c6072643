"""What a report shows: the runs checked, each rule's outcome, the findings, and the inputs
that could not be read."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..rules import evidence_of
from ..rules.base import SEVERITIES
from ..rules.evidence import PlacedEvidence
from ..store import Store
from ..summary import without_kernels
from .budget import budgets_of
from .passes import hot_kernels, link_summaries
from .vendor import unmatched, vendor_results, verdict


def severity_rank(sev: str) -> int:
    return SEVERITIES.index(sev)


def measured(f: dict) -> bool:
    """Whether a finding's estimated loss is time measured lost, not a what-if upper bound (the
    rules capped with `max_severity`: what a faster kernel could save) nor time whose cause the
    trace cannot tell (a finding that abstains, `rules/_unknown.py`: on a sampled or stripped
    trace it may not be idle at all)."""
    from ..rules import get_rule

    ev = evidence_of(f["rule_id"], f.get("evidence"))
    if ev is not None and ev.cause == "unknown":
        return False
    try:
        return get_rule(f["rule_id"]).max_severity is None
    except KeyError:  # a rule this version does not have
        return True


def place_of(f: dict):
    """Where most of a finding's intervals lie (its evidence's `place`, rules.evidence.Place);
    None for a finding of one interval."""
    ev = evidence_of(f["rule_id"], f.get("evidence"))
    return ev.place if isinstance(ev, PlacedEvidence) else None


def loss_shares(headlines: list[dict], devices: list[dict]) -> tuple[float | None, float | None]:
    """`loss_share` of the headlines whose loss is measured, and of those whose loss is an upper
    bound (`measured`)."""
    return (loss_share([f for f in headlines if measured(f)], devices),
            loss_share([f for f in headlines if not measured(f)], devices))


def loss_share(headlines: list[dict], devices: list[dict]) -> float | None:
    """How much of its time a run loses: per device of its time budget (`devices`, as
    `budget.budgets_of` gives them), the estimated losses of its headlines on that device (one
    on no device counts on each) over the device's span; the largest. No nanosecond is claimed
    twice on a device, so it is at most 1. None without a budget (Nsight Compute) or a loss."""
    shares = []
    for d in devices:
        if not d.get("span_ns"):
            continue
        lost = sum(f["est_loss_ns"] for f in headlines
                   if f.get("est_loss_ns") and f.get("device_id") in (None, d["device_id"]))
        if lost:
            shares.append(lost / d["span_ns"])
    return max(shares, default=None)


def run_order(share: float | None, loss_ns: float, counts: dict[str, int], name: str,
              upper_share: float | None = None) -> tuple:
    """Runs ranked by their headlines' losses: the largest share of a device's span that measured
    losses take first (`share`, `loss_shares`), then the share of what-if upper bounds
    (`upper_share`: a faster kernel's saving never outranks time measured lost), then, without a
    span, the largest loss; finding counts only break ties."""
    untimed = share is None and upper_share is None
    return (untimed, -(share or 0.0), -(upper_share or 0.0), -loss_ns, -counts["error"], -counts["warning"],
            -counts["info"], name)


@dataclass(frozen=True)
class InputError:
    """An input that could not be read: a file (or a run reference) and why, in one line."""

    path: str
    message: str
    internal: bool = False  # a bug in traceanalyzer, not a bad file
    detail: str | None = None  # the traceback of such a bug

    def as_dict(self) -> dict:
        return {"path": self.path, "message": self.message}

    @classmethod
    def of(cls, path, e: BaseException) -> InputError:
        """Why `path` could not be read, from the exception reading it raised; call it in the
        except block, where the traceback of a bug in traceanalyzer is."""
        import traceback

        from ..ingest import TraceError
        from ..store import StoreError

        if isinstance(e, FileNotFoundError):
            return cls(str(path), "no such file")
        if isinstance(e, OSError) and e.strerror:
            return cls(str(path), e.strerror)
        lines = str(e).strip().splitlines()
        text = " ".join(lines[0].split()) if lines else type(e).__name__
        if isinstance(e, (TraceError, StoreError, OSError)):
            return cls(str(path), text)
        return cls(str(path), text, internal=True, detail=traceback.format_exc())  # a reader or rule bug


def _rule_loss(f: dict):
    """The rule's own estimate: the same figure whether the diagnosis made the finding a
    headline (its loss bounded) or related (no loss), so baselines compare like with like."""
    return f["rule_loss_ns"] if f.get("rule_loss_ns") is not None else f.get("est_loss_ns")


def measure(findings: list[dict]) -> float | None:
    """How big a group of findings sharing a fingerprint is: their summed estimated loss (the
    rules' own), or the largest value when none has a loss (None when neither is known)."""
    losses = [_rule_loss(f) for f in findings if _rule_loss(f) is not None]
    if losses:
        return float(sum(losses))
    values = [f["value"] for f in findings if f.get("value") is not None]
    return float(max(values)) if values else None


@dataclass
class Baseline:
    """The findings of an earlier report, by fingerprint, with their measure (see `measure`):
    a finding in it does not fail a check unless, with `max_growth_pct`, it grew by more."""

    measures: dict[str, float | None]
    max_growth_pct: float | None = None

    @classmethod
    def from_findings(cls, findings: list[dict], max_growth_pct: float | None = None) -> Baseline:
        return cls({fp: measure(group) for fp, group in _by_fingerprint(findings).items()}, max_growth_pct)


def growth_pct(before: float | None, now: float | None) -> float | None:
    """Percent growth from `before` to `now`; None when either is unknown; inf from nothing."""
    if before is None or now is None:
        return None
    if before <= 0:
        return 0.0 if now <= 0 else float("inf")
    return (now - before) / before * 100.0


@dataclass
class CheckResult:
    runs: list[dict]  # runs rows (run_id, file_name, source_path, format, ...)
    outcomes: list[dict]  # rule_runs rows
    # findings rows, evidence decoded, plus file_name / source_path; per run in finding_no order
    # (each headline followed by its related findings)
    findings: list[dict]
    fail_on: str = "error"
    baseline: Baseline | None = None
    errors: list[InputError] = field(default_factory=list)  # inputs that could not be read
    not_traces: list[tuple[Path, str]] = field(default_factory=list)  # files a folder walk passed over
    show_vendor_rules: bool = False  # text: list NVIDIA's results no finding matches (`--show-vendor-rules`)
    _groups_cache: dict | None = field(default=None, init=False, repr=False, compare=False)
    _related_cache: dict | None = field(default=None, init=False, repr=False, compare=False)

    def is_new(self, f: dict) -> bool:
        return self.baseline is None or f["fingerprint"] not in self.baseline.measures

    def growth(self, f: dict) -> float | None:
        """With a baseline: how much the findings sharing `f`'s fingerprint grew (percent)."""
        if self.baseline is None or self.is_new(f):
            return None
        now = measure(self._groups().get(f["fingerprint"], [f]))
        return growth_pct(self.baseline.measures[f["fingerprint"]], now)

    def grown(self, f: dict) -> bool:
        """A baselined finding grown beyond --max-growth."""
        limit = self.baseline.max_growth_pct if self.baseline is not None else None
        g = self.growth(f) if limit is not None else None
        return g is not None and g > limit

    def counts_against(self, f: dict) -> bool:
        """Whether `f` may fail the check: no baseline, not in it, or grown beyond --max-growth."""
        return self.is_new(f) or self.grown(f)

    def headlines(self, run_id: str | None = None) -> list[dict]:
        """The findings that are not related evidence of another (`related_to` NULL), of one run
        or all: one per root cause, by estimated loss (the store's order)."""
        return [f for f in self.findings if f.get("related_to") is None and (run_id is None or f["run_id"] == run_id)]

    def related(self, headline: dict) -> list[dict]:
        """The findings that share `headline`'s root cause (in finding_no order)."""
        if self._related_cache is None:
            self._related_cache = {}
            for f in self.findings:
                if f.get("related_to") is not None:
                    self._related_cache.setdefault((f["run_id"], f["related_to"]), []).append(f)
        return self._related_cache.get((headline["run_id"], headline.get("finding_no")), [])

    def failing(self) -> list[dict]:
        """Headline findings at or above --fail-on that count (see `counts_against`): a root
        cause fails a check once, however many findings it explains."""
        if self.fail_on == "never":
            return []
        limit = severity_rank(self.fail_on)
        return [f for f in self.headlines() if severity_rank(f["severity"]) >= limit and self.counts_against(f)]

    def rule_errors(self) -> list[dict]:
        """The rule outcomes that raised (status 'error'), in run and rule order. A rule that
        raised found nothing, which must not read as clean: each fails the check as an
        unreadable input does, whatever --fail-on says."""
        return [o for o in self.outcomes if o["status"] == "error"]

    def failed(self) -> bool:
        """The gate: an input could not be read, a rule raised, or a finding fails the check."""
        return bool(self.errors) or bool(self.rule_errors()) or bool(self.failing())

    def exit_code(self) -> int:
        """0 clean, 1 a finding fails the gate, 2 an input could not be read or a rule raised
        (see the README)."""
        return 2 if self.errors or self.rule_errors() else 1 if self.failing() else 0

    def not_run(self, run_id: str) -> list[str]:
        """The rules with no outcome on `run_id` (not selected when it was checked)."""
        from ..rules import all_rules

        ran = {o["rule_id"] for o in self.outcomes if o["run_id"] == run_id}
        return [r.id for r in all_rules() if r.id not in ran]

    def counts(self, run_id: str | None = None) -> dict[str, int]:
        """Headline findings by severity (of one run or all)."""
        out = {s: 0 for s in SEVERITIES}
        for f in self.headlines(run_id):
            out[f["severity"]] += 1
        return out

    def _groups(self) -> dict[str, list[dict]]:
        if self._groups_cache is None:
            self._groups_cache = _by_fingerprint(self.findings)
        return self._groups_cache


def _by_fingerprint(findings: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for f in findings:
        groups.setdefault(f["fingerprint"], []).append(f)
    return groups


def load_result(store: Store, run_ids: list[str], fail_on: str = "error") -> CheckResult:
    ids = list(run_ids)
    runs = _rows(store, "SELECT * FROM runs WHERE list_contains(?, run_id) ORDER BY file_name, run_id", ids)
    outcomes = _rows(store, "SELECT * FROM rule_runs WHERE list_contains(?, run_id) ORDER BY run_id, rule_id", ids)
    findings = _rows(store, """
        SELECT f.*, r.file_name, r.source_path FROM findings f JOIN runs r USING (run_id)
        WHERE list_contains(?, f.run_id)
        ORDER BY r.file_name, f.run_id, f.finding_no NULLS LAST, f.est_loss_ns DESC NULLS LAST,
                 CASE f.severity WHEN 'error' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, f.rule_id, f.fingerprint""", ids)
    for r in findings:
        r["evidence"] = json.loads(r["evidence"]) if r.get("evidence") else None
    budgets = budgets_of(store, [r["run_id"] for r in runs])
    bare = without_kernels(store, [r["run_id"] for r in runs])
    nvidia = vendor_results(store, [r["run_id"] for r in runs])
    for f in findings:
        f["vendor"] = verdict(f, nvidia.get(f["run_id"]))
    for r in runs:
        r["budget"] = budgets[r["run_id"]]
        if r["run_id"] in bare:  # a timeline with no kernel: what it holds instead
            r["without_kernels"] = bare[r["run_id"]]
        r["vendor_unmatched"] = unmatched(nvidia.get(r["run_id"]), [f for f in findings if f["run_id"] == r["run_id"]])
        hot = hot_kernels(store, r["run_id"], [f for f in findings if f["run_id"] == r["run_id"]])
        if hot:  # a timeline linked to Nsight Compute (report/passes.py)
            r["hot_kernels"], r["links"] = hot, link_summaries(store, r["run_id"])
    return CheckResult(runs, outcomes, findings, fail_on)


def _rows(store: Store, sql: str, ids: list[str]) -> list[dict]:
    """Rows as plain Python dicts (None for NULL, ISO strings for timestamps)."""
    rows = store.arrow(sql, [ids]).to_pylist()
    for r in rows:
        for k, v in r.items():
            if hasattr(v, "isoformat"):
                r[k] = v.isoformat()
    return rows
