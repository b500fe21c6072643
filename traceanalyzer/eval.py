"""The labelled evaluation set: `python -m traceanalyzer.eval [--labels DIR] [--traces DIR] [--store S] [--json]`.

Each label (`tests/eval/labels/<kind>/<name>.toml`, format in tests/eval/README.md) says what an
expert reading one real trace of `../shared/traces/` would find in it: findings to expect
(`[[expect]]`, required or informational), time-budget shares (`[[budget]]`), findings that must
not appear (`[[must_not]]`), known gaps (`[[gap]]`, text only), and how each was derived from the
raw trace. This module checks every labelled trace the way `check` does (`batch.check.check_file`,
every per-run rule at default thresholds, into the store given with `--store` or a temporary
one), matches its findings and time budget against the label, prints a score per
label and overall, and exits 1 when a required expectation is unmet or a `must_not` is hit
(2: a label or the paths are unusable).

Matching, per label (the findings of every run its trace holds: a folder may hold several):
- an `[[expect]]` or `[[must_not]]` matches a finding when every selector given holds: `rule`
  (or `rules`, any of them) is its rule id; `claims` equals its claimed budget part;
  `headline = true` wants a headline (no `related_to`), `false` related evidence; `severity`
  (a name or a list) holds its severity; `loss_ms = [lo, hi]` bounds its estimated loss (the
  diagnosis's bounded `est_loss_ns`; a related finding has none, so it never matches one);
  `item` is a case-insensitive substring of its `item_name`; `device` is its device id.
- a `[[budget]]` holds when the part's time over the device's span lies within `share`: the part
  is a category of the `time_budget` view (`compute`, `communication`, `copy`, `memset`), an idle
  cause (`idle:host`, `idle:sync`, `idle:dependency`, `idle:unknown`) or `idle` (all idle).
- a label with `input_error = "text"` is for a file that is no usable profile: checking it must
  fail with an error whose message holds that text (case-insensitive); it is one required
  expectation. A labelled file that fails without it is an unmet required expectation.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .batch.check import check_file, up_to_date_hashes
from .ingest import find_traces
from .report.model import load_result
from .rules import all_rules
from .rules.base import CLAIMS
from .rules.engine import Settings
from .store import Store, file_hash, run_id_for
from .analyses.budget import BUDGET_CATEGORIES, IDLE_CAUSES

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LABELS = ROOT / "tests" / "eval" / "labels"
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"

KINDS = ("nsys", "ncu", "ncu-rep", "ncu-text", "torch", "torch-memory", "torch-graphs")
BUDGET_PARTS = (*BUDGET_CATEGORIES, "idle", *(f"idle:{c}" for c in IDLE_CAUSES))
SEVERITY_NAMES = ("info", "warning", "error")
_TOP_KEYS = {"trace", "summary", "derived", "input_error", "expect", "budget", "must_not", "gap"}
_SELECTORS = {"rule", "rules", "claims", "headline", "severity", "loss_ms", "item", "device"}
_EXPECT_KEYS = _SELECTORS | {"required", "why"}
_BUDGET_KEYS = {"part", "share", "device", "required", "why"}
_GAP_KEYS = {"what", "why"}


class LabelError(Exception):
    """A label file that cannot be used; the message is one line naming the file."""


@dataclass
class Label:
    path: Path
    name: str  # <kind>/<name>, the label's path under the labels folder without `.toml`
    trace: str
    summary: str
    derived: str
    input_error: str | None = None
    expect: list[dict] = field(default_factory=list)
    budget: list[dict] = field(default_factory=list)
    must_not: list[dict] = field(default_factory=list)
    gap: list[dict] = field(default_factory=list)


def _fail(path: Path, what: str):
    raise LabelError(f"{path}: {' '.join(what.split())}")


def _check_keys(path: Path, where: str, entry, allowed: set[str]) -> None:
    if not isinstance(entry, dict):
        _fail(path, f"{where} is not a table")
    unknown = sorted(set(entry) - allowed)
    if unknown:
        _fail(path, f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")


def _text(path: Path, where: str, value, *, required: bool = True) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or not value.strip():
        _fail(path, f"{where} must be a non-empty string")


def _bounds(path: Path, where: str, value) -> None:
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            or value[0] > value[1]):
        _fail(path, f"{where} must be [low, high] numbers with low <= high")


def _check_selectors(path: Path, where: str, entry: dict, rule_ids: set[str]) -> None:
    if "rule" not in entry and "rules" not in entry:
        _fail(path, f"{where}: give `rule` or `rules`")
    ids = [entry["rule"]] if "rule" in entry else entry["rules"]
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        _fail(path, f"{where}: `rule` must be a rule id, `rules` a non-empty list of them")
    for i in ids:
        if i not in rule_ids:
            _fail(path, f"{where}: unknown rule id {i!r}")
    if "claims" in entry and entry["claims"] not in CLAIMS:
        _fail(path, f"{where}: claims {entry['claims']!r} is no budget part a rule claims ({', '.join(CLAIMS)})")
    if "headline" in entry and not isinstance(entry["headline"], bool):
        _fail(path, f"{where}: headline must be true or false")
    if "severity" in entry:
        sev = entry["severity"] if isinstance(entry["severity"], list) else [entry["severity"]]
        if not sev or any(s not in SEVERITY_NAMES for s in sev):
            _fail(path, f"{where}: severity must be one of {', '.join(SEVERITY_NAMES)} or a list of them")
    if "loss_ms" in entry:
        _bounds(path, f"{where}: loss_ms", entry["loss_ms"])
    if "item" in entry:
        _text(path, f"{where}: item", entry["item"])
    if "device" in entry and (not isinstance(entry["device"], int) or isinstance(entry["device"], bool)):
        _fail(path, f"{where}: device must be an integer")


def load_label(path: Path, labels_dir: Path | None = None) -> Label:
    """One label file, validated; LabelError (one line, naming the file) when it is not usable."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        _fail(path, f"cannot read it ({e})")
    except tomllib.TOMLDecodeError as e:
        _fail(path, f"not valid TOML ({e})")
    _check_keys(path, "the label", doc, _TOP_KEYS)
    for key in ("trace", "summary", "derived"):
        _text(path, key, doc.get(key))
    _text(path, "input_error", doc.get("input_error"), required=False)
    kind = doc["trace"].split("/", 1)[0]
    if kind not in KINDS or "/" not in doc["trace"]:
        _fail(path, f"trace {doc['trace']!r} must be <kind>/<file> under the traces folder, "
                    f"kind one of {', '.join(KINDS)}")
    rule_ids = {r.id for r in all_rules()}
    sections = (("expect", _EXPECT_KEYS), ("must_not", _EXPECT_KEYS), ("budget", _BUDGET_KEYS), ("gap", _GAP_KEYS))
    for section, keys in sections:
        entries = doc.get(section, [])
        if not isinstance(entries, list):
            _fail(path, f"{section} must be an array of tables ([[{section}]])")
        for n, e in enumerate(entries, 1):
            where = f"[[{section}]] #{n}"
            _check_keys(path, where, e, keys)
            if section == "gap":
                _text(path, f"{where}: what", e.get("what"))
                continue
            _text(path, f"{where}: why", e.get("why"))
            if section != "must_not" and not isinstance(e.get("required"), bool):
                _fail(path, f"{where}: required must be true or false")
            if section == "must_not" and not isinstance(e.get("required", True), bool):
                _fail(path, f"{where}: required must be true or false")
            if section == "budget":
                if e.get("part") not in BUDGET_PARTS:
                    _fail(path, f"{where}: part {e.get('part')!r} is no budget part ({', '.join(BUDGET_PARTS)})")
                _bounds(path, f"{where}: share", e.get("share"))
                if "device" in e and (not isinstance(e["device"], int) or isinstance(e["device"], bool)):
                    _fail(path, f"{where}: device must be an integer")
            else:
                _check_selectors(path, where, e, rule_ids)
    if doc.get("input_error") and (doc.get("expect") or doc.get("budget")):
        _fail(path, "a label with input_error (no usable profile) has no [[expect]] or [[budget]]")
    if not doc.get("input_error") and not (doc.get("expect") or doc.get("budget") or doc.get("must_not")):
        _fail(path, "the label expects nothing: give [[expect]], [[budget]], [[must_not]] or input_error")
    name = path.with_suffix("").name
    if labels_dir is not None:
        try:
            name = path.relative_to(labels_dir).with_suffix("").as_posix()
        except ValueError:
            pass
    return Label(path, name, doc["trace"], doc["summary"], doc["derived"], doc.get("input_error"),
                 doc.get("expect", []), doc.get("budget", []), doc.get("must_not", []), doc.get("gap", []))


def load_labels(labels_dir: Path) -> list[Label]:
    """Every `*.toml` under `labels_dir`, in path order; LabelError on the first unusable one,
    or on a second label of one trace."""
    labels_dir = Path(labels_dir)
    paths = sorted(labels_dir.rglob("*.toml"))
    if not paths:
        raise LabelError(f"{labels_dir}: no label files (*.toml)")
    labels, seen = [], {}
    for p in paths:
        lb = load_label(p, labels_dir)
        if lb.trace in seen:
            _fail(p, f"labels {lb.trace!r} again (first in {seen[lb.trace]})")
        seen[lb.trace] = p
        labels.append(lb)
    return labels


# -- matching ------------------------------------------------------------------------------

def matches(sel: dict, f: dict) -> bool:
    """Whether finding `f` (a findings row) meets every selector of `sel` (see the module doc)."""
    ids = [sel["rule"]] if "rule" in sel else sel.get("rules", [])
    if ids and f["rule_id"] not in ids:
        return False
    if "claims" in sel and f.get("claims") != sel["claims"]:
        return False
    if "headline" in sel and (f.get("related_to") is None) != sel["headline"]:
        return False
    if "severity" in sel:
        allowed = sel["severity"] if isinstance(sel["severity"], list) else [sel["severity"]]
        if f["severity"] not in allowed:
            return False
    if "loss_ms" in sel:
        loss = f.get("est_loss_ns")
        lo, hi = sel["loss_ms"]
        if loss is None or not lo <= loss / 1e6 <= hi:
            return False
    if "item" in sel and sel["item"].lower() not in (f.get("item_name") or "").lower():
        return False
    if "device" in sel and f.get("device_id") != sel["device"]:
        return False
    return True


def budget_share(devices: list[dict], part: str, device: int) -> float | None:
    """Part time over span on `device` of a run's budget (`report.budget.budget_of`), None when
    the run has no budget on that device."""
    for d in devices:
        if d["device_id"] == device and d["span_ns"]:
            if part == "idle":
                ns = sum(p["ns"] for p in d["parts"] if p["category"] == "idle")
            elif part.startswith("idle:"):
                ns = sum(p["ns"] for p in d["parts"] if p["category"] == "idle" and p["cause"] == part[5:])
            else:
                ns = sum(p["ns"] for p in d["parts"] if p["category"] == part)
            return ns / d["span_ns"]
    return None


def describe(sel: dict) -> str:
    """A short name for an expectation: its selectors."""
    if "part" in sel:
        lo, hi = sel["share"]
        return f"budget {sel['part']} {lo:.0%}-{hi:.0%}" + (f" dev {sel['device']}" if "device" in sel else "")
    ids = [sel["rule"]] if "rule" in sel else sel["rules"]
    bits = ["/".join(ids)]
    for k in ("claims", "item", "device"):
        if k in sel:
            bits.append(f"{k}={sel[k]}")
    if "severity" in sel:
        bits.append("sev=" + ",".join(sel["severity"] if isinstance(sel["severity"], list) else [sel["severity"]]))
    if "loss_ms" in sel:
        bits.append(f"loss {sel['loss_ms'][0]:g}-{sel['loss_ms'][1]:g} ms")
    if sel.get("headline") is not None:
        bits.append("headline" if sel["headline"] else "related")
    return " ".join(bits)


def _finding_line(f: dict) -> str:
    loss = f.get("est_loss_ns")
    return (f"{f['rule_id']} {f['severity']} claims={f.get('claims')} item={(f.get('item_name') or '')[:40]!r} "
            f"loss={'-' if loss is None else f'{loss / 1e6:.3g} ms'}{' related' if f.get('related_to') else ''}")


@dataclass
class Outcome:
    section: str  # expect, budget, must_not, input_error
    what: str  # `describe` of the entry
    required: bool
    ok: bool  # expect/budget/input_error: met; must_not: not hit
    why: str
    seen: str = ""  # what was there instead (or what hit)

    def as_dict(self) -> dict:
        return {"section": self.section, "what": self.what, "required": self.required, "ok": self.ok,
                "why": self.why, "seen": self.seen}


@dataclass
class Score:
    label: Label
    outcomes: list[Outcome] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)

    def _count(self, section: set[str], required: bool) -> tuple[int, int]:
        o = [x for x in self.outcomes if x.section in section and x.required == required]
        return sum(x.ok for x in o), len(o)

    @property
    def required(self) -> tuple[int, int]:
        return self._count({"expect", "budget", "input_error"}, True)

    @property
    def informational(self) -> tuple[int, int]:
        return self._count({"expect", "budget"}, False)

    @property
    def must_not_hits(self) -> int:
        return sum(not x.ok for x in self.outcomes if x.section == "must_not" and x.required)

    @property
    def informational_hits(self) -> int:
        return sum(not x.ok for x in self.outcomes if x.section == "must_not" and not x.required)

    def failures(self) -> list[Outcome]:
        return [x for x in self.outcomes if x.required and not x.ok]

    def as_dict(self) -> dict:
        return {"label": self.label.name, "trace": self.label.trace, "run_ids": self.run_ids,
                "required": list(self.required), "informational": list(self.informational),
                "must_not_hits": self.must_not_hits, "informational_must_not_hits": self.informational_hits,
                "gaps": [g["what"] for g in self.label.gap], "ok": not self.failures(),
                "outcomes": [o.as_dict() for o in self.outcomes]}


class _Stores:
    """Where the labelled traces' runs are: `store`, and (for what it lacks, when it is read-only,
    and for files expected to fail) a scratch store made on first need."""

    def __init__(self, store: Store, scratch: Store | None):
        self.store, self.scratch = store, scratch
        self._own: tempfile.TemporaryDirectory | None = None
        self.settings = Settings()
        self._fresh: dict[int, frozenset[str]] = {}

    def writable(self) -> Store:
        if not self.store.read_only:
            return self.store
        if self.scratch is None:
            self._own = tempfile.TemporaryDirectory(prefix="traceanalyzer-eval-")
            self.scratch = Store(Path(self._own.name) / "eval.duckdb")
        return self.scratch

    def fresh(self, st: Store) -> frozenset[str]:
        if id(st) not in self._fresh:
            self._fresh[id(st)] = frozenset(up_to_date_hashes(st, self.settings))
        return self._fresh[id(st)]

    def check(self, path: Path) -> tuple[Store, str | None, str | None]:
        """(store, run id, error) of one trace file, checked as `check` does: in a writable
        store, a stored run is not read again but its rules run again (the engine takes each
        rule's stored outcome when nothing it depends on changed); a read-only store's run is
        taken as it is when it was checked with every per-run rule, else the file is checked
        into the scratch store."""
        if self.store.read_only:
            for st in (self.store, self.scratch):
                if st is not None and (h := file_hash(path, st.hash_name())) in self.fresh(st):
                    return st, run_id_for(h), None
        st = self.writable()
        res = check_file(st, path, self.settings)
        return st, res.run_id, (res.error if res.state == "failed" else None)

    def close(self) -> None:
        if self._own is not None:
            if self.scratch is not None:
                self.scratch.close()
            self._own.cleanup()


def evaluate(labels: list[Label], traces: Path, store: Store, scratch: Store | None = None) -> list[Score]:
    """Score every label against its trace's runs: those in `store` (checked with every per-run
    rule), else checked now into `store`, or into `scratch` (made when needed) if `store` is
    read-only."""
    stores = _Stores(store, scratch)
    try:
        return [_evaluate_one(lb, Path(traces), stores) for lb in labels]
    finally:
        stores.close()


def _evaluate_one(lb: Label, traces: Path, stores: _Stores) -> Score:
    sc = Score(lb)
    target = traces / lb.trace
    files = sorted(find_traces([target])) if target.is_dir() else [target] if target.is_file() else []
    if not files:
        sc.outcomes.append(Outcome("input_error", "trace present", True, False, "the label's trace must exist",
                                   f"no trace at {target}"))
        return sc
    runs: list[tuple[Store, str]] = []
    errors: list[str] = []
    for f in files:
        st, run_id, error = stores.check(Path(f))
        if error:
            errors.append(f"{Path(f).name}: {error}")
        elif run_id:
            runs.append((st, run_id))
    sc.run_ids = [r for _, r in runs]
    if lb.input_error is not None:
        hit = any(lb.input_error.lower() in e.lower() for e in errors)
        sc.outcomes.append(Outcome("input_error", f"input error: {lb.input_error}", True, hit,
                                   "the file is no usable profile: checking it must say so",
                                   "; ".join(errors) or "it was read without error"))
    elif errors:
        sc.outcomes.append(Outcome("input_error", "trace readable", True, False, "the labelled trace must be read",
                                   "; ".join(errors)))
    findings, budgets = [], []
    for st, run_id in runs:
        result = load_result(st, [run_id])
        findings += result.findings
        budgets += [r["budget"] for r in result.runs]
    for e in lb.expect:
        hit = [f for f in findings if matches(e, f)]
        seen = (_finding_line(hit[0]) if hit
                else "; ".join(_finding_line(f) for f in _near(e, findings)) or "no such finding")
        sc.outcomes.append(Outcome("expect", describe(e), e["required"], bool(hit), e["why"], seen))
    for b in lb.budget:
        shares = [s for s in (budget_share(d, b["part"], b.get("device", 0)) for d in budgets) if s is not None]
        lo, hi = b["share"]
        ok = any(lo <= s <= hi for s in shares)
        seen = ", ".join(f"{s:.1%}" for s in shares) or "no budget on that device"
        sc.outcomes.append(Outcome("budget", describe(b), b["required"], ok, b["why"], seen))
    for m in lb.must_not:
        hit = [f for f in findings if matches(m, f)]
        sc.outcomes.append(Outcome("must_not", "not " + describe(m), m.get("required", True), not hit, m["why"],
                                   "; ".join(_finding_line(f) for f in hit[:3])))
    return sc


def _near(sel: dict, findings: list[dict]) -> list[dict]:
    """The findings of the expectation's rules, to say what was there instead (at most 3)."""
    ids = [sel["rule"]] if "rule" in sel else sel.get("rules", [])
    return [f for f in findings if f["rule_id"] in ids][:3]


# -- output --------------------------------------------------------------------------------

def _frac(t: tuple[int, int]) -> str:
    return f"{t[0]}/{t[1]}" if t[1] else "-"


def totals(scores: list[Score]) -> dict:
    req = (sum(s.required[0] for s in scores), sum(s.required[1] for s in scores))
    info = (sum(s.informational[0] for s in scores), sum(s.informational[1] for s in scores))
    return {"labels": len(scores), "required": list(req), "informational": list(info),
            "must_not_hits": sum(s.must_not_hits for s in scores),
            "informational_must_not_hits": sum(s.informational_hits for s in scores),
            "must_not": sum(1 for s in scores for o in s.outcomes if o.section == "must_not" and o.required),
            "gaps": sum(len(s.label.gap) for s in scores),
            "failed_labels": sum(1 for s in scores if s.failures()),
            "ok": all(not s.failures() for s in scores)}


def table(scores: list[Score], width: int = 80) -> str:
    """The score per label and overall, then each failure (an unmet required expectation, a
    must_not hit), in `width` columns."""
    name_w = width - 1 - 35  # the columns after the name take 35
    lines = [f"{'label':<{name_w}}  {'required':>8}  {'must_not':>8}  {'inform.':>7}", "-" * (width - 1)]
    for s in scores:
        verdict = "ok" if not s.failures() else "FAIL"
        lines.append(f"{_fit(s.label.name, name_w):<{name_w}}  {_frac(s.required):>8}  {s.must_not_hits:>8}  "
                     f"{_frac(s.informational):>7}  {verdict}")
    t = totals(scores)
    lines.append("-" * (width - 1))
    pct = f" ({t['required'][0] / t['required'][1]:.1%})" if t["required"][1] else ""
    lines += _wrap(f"{t['labels']} labels: required {t['required'][0]}/{t['required'][1]} met{pct}, "
                   f"{t['must_not_hits']} must_not hit(s) of {t['must_not']}, informational "
                   f"{t['informational'][0]}/{t['informational'][1]} met and {t['informational_must_not_hits']} "
                   f"informational must_not hit(s), {t['gaps']} known gap(s)", width, indent="")
    lines.append("PASS" if t["ok"] else f"FAIL: {t['failed_labels']} label(s) with an unmet required "
                 "expectation or a must_not hit")
    for s in scores:
        for o in s.failures():
            lines += _wrap(f"{s.label.name}: {'hit' if o.section == 'must_not' else 'unmet'}: {o.what}; "
                           f"seen: {o.seen or '-'}", width)
    return "\n".join(lines)


def _fit(text: str, width: int) -> str:
    """`text` in `width` characters, its middle elided (the kind and the name's end tell labels apart)."""
    if len(text) <= width:
        return text
    keep = width - 1
    return text[:keep // 2] + "…" + text[len(text) - (keep - keep // 2):]


def _wrap(text: str, width: int, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, width - 1, initial_indent=indent, subsequent_indent=indent + "    ") or [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traceanalyzer.eval",
                                 description="Score traceanalyzer against the labelled evaluation set.")
    ap.add_argument("--labels", type=Path, default=DEFAULT_LABELS, help="folder of label files (default: %(default)s)")
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="the traces folder (default: %(default)s)")
    ap.add_argument("--store", type=Path, help="a store to reuse and fill (default: a temporary one)")
    ap.add_argument("--json", action="store_true", help="print the scores as JSON")
    args = ap.parse_args(argv)
    try:
        labels = load_labels(args.labels)
    except LabelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.traces.is_dir():
        print(f"error: {args.traces}: no traces folder (give --traces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="traceanalyzer-eval-") as tmp:
        with Store(args.store or Path(tmp) / "eval.duckdb") as store:
            scores = evaluate(labels, args.traces, store)
    if args.json:
        print(json.dumps({"totals": totals(scores), "labels": [s.as_dict() for s in scores]}, indent=1))
    else:
        print(table(scores))
    return 0 if totals(scores)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
