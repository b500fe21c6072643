"""Typed evidence (rules/evidence.py): each rule declares what its findings' evidence holds, and
what is stored fits it. The rule cases decode every finding they make (tests/test_rule_cases.py);
here the declarations themselves, the reader, and every finding of the real corpus."""

from __future__ import annotations

import json

import msgspec
import pytest

from traceanalyzer.rules import EvidenceMismatch, all_rules, evidence_of
from traceanalyzer.rules.evidence import Evidence, decode, fields


def _structs(kind: type, seen: set) -> set:
    """`kind` and every Struct its fields hold."""
    seen.add(kind)
    for f in msgspec.structs.fields(kind):
        for t in _types_in(f.type):
            if isinstance(t, type) and issubclass(t, msgspec.Struct) and t not in seen:
                _structs(t, seen)
    return seen


def _types_in(t) -> list:
    args = getattr(t, "__args__", None) or getattr(t, "__metadata__", None) and (t.__origin__,) or ()
    return [t] + [x for a in args for x in _types_in(a)]


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.id)
def test_every_rule_declares_its_evidence(rule):
    """A Struct per rule, forbidding unknown keys at every level, each field with a meaning."""
    assert rule.evidence is not None and issubclass(rule.evidence, Evidence), rule.id
    for kind in _structs(rule.evidence, set()):
        assert kind.__struct_config__.forbid_unknown_fields, kind.__name__
    for name, _, meaning in fields(rule.evidence):
        assert meaning, f"{rule.id}: evidence field {name} says nothing of what it is"


def test_a_renamed_key_fails_and_a_missing_optional_one_does_not():
    from traceanalyzer.rules import get_rule

    kind = get_rule("T001").evidence
    required = [f.encode_name for f in msgspec.structs.fields(kind) if f.required]
    assert "main_cause" in required
    good = {"main_cause": "sync", "count": 1, "total_ns": 5, "median_ns": 5.0, "span_ns": 5, "total_of": "gaps",
            "cause_counts": {"sync": 1}, "cause_ns": {"sync": 5}, "worst": [], "warmup_ns": 0,
            "place": {"start_ns": 0, "end_ns": 5, "count": 1, "of": 1, "ns": 5, "total_ns": 5, "what": "gaps"}}
    missing = set(required) - set(good)
    good.update({k: None for k in missing if k in ("max_ns", "device_idle_ns", "around")})
    ev = evidence_of("T001", json.dumps(good))
    assert ev.main_cause == "sync" and ev.place.what == "gaps" and ev.severity_reason is None
    renamed = dict(good)
    renamed["main_reason"] = renamed.pop("main_cause")
    with pytest.raises(EvidenceMismatch):
        evidence_of("T001", json.dumps(renamed))
    with pytest.raises(EvidenceMismatch):  # a key no type declares
        evidence_of("T001", json.dumps({**good, "extra": 1}))
    with pytest.raises(EvidenceMismatch):  # and so in a nested object
        evidence_of("T001", json.dumps({**good, "place": {**good["place"], "extra": 1}}))


def test_the_reader():
    """NaN (Python's json writes it for a missing float) reads as a float; a dict as the text does;
    no evidence and a rule this version lacks give None."""
    from traceanalyzer.rules import get_rule

    kind = get_rule("B001").evidence
    assert evidence_of("X999", '{"a": 1}') is None
    assert evidence_of("B001", None) is None and evidence_of("B001", "") is None
    one = {f.encode_name: (0 if "int" in str(f.type) else 0.5 if "float" in str(f.type) else
                           [] if "list" in str(f.type) else "x") for f in msgspec.structs.fields(kind) if f.required}
    text = json.dumps({**one, "sm_count": float("nan")})
    ev = decode(text, kind)
    assert ev.sm_count != ev.sm_count
    assert evidence_of("B001", json.loads(text)).launches == ev.launches


def test_every_real_finding_fits_its_rules_evidence(real_corpus):
    """Each finding stored for the real traces decodes into its rule's type, unknown keys forbidden."""
    rules = {r.id: r for r in all_rules()}
    rows = real_corpus.sql("SELECT rule_id, evidence FROM findings").fetchall()
    assert rows
    for rule_id, evidence in rows:
        decode(evidence, rules[rule_id].evidence)


def test_reports_import_no_rule_module():
    """Reports read evidence through the registry's types (rules.evidence_of), never a rule's module."""
    import re

    from .conftest import ROOT

    for path in sorted((ROOT / "traceanalyzer" / "report").glob("*.py")):
        found = re.findall(r"from \.\.rules\.([A-Z]\d{3}_\w+)|rules\.([A-Z]\d{3}_\w+)", path.read_text())
        assert not found, f"{path.name} imports a rule module: {found}"


def test_reports_read_the_typed_fields():
    """The report helpers that read evidence get what the rules wrote, by field: a field renamed in
    a Struct fails here (AttributeError), not as a blank line in a report."""
    from traceanalyzer import fmt
    from traceanalyzer.report.html_timeline import examples, markers
    from traceanalyzer.report.model import place_of
    from traceanalyzer.report.text import _duration, unknown_cause

    place = {"start_ns": 100, "end_ns": 900, "count": 3, "of": 4, "ns": 60, "total_ns": 80, "what": "gaps"}
    gap = {"start_ns": 100, "end_ns": 160, "gap_ns": 60, "cause": "sync", "around": None}
    t001 = {"main_cause": "sync", "count": 4, "total_ns": 80, "median_ns": 20.0, "span_ns": 800, "total_of": "gaps",
            "cause_counts": {"sync": 4}, "cause_ns": {"sync": 80}, "worst": [gap], "warmup_ns": 0, "place": place,
            "max_ns": 60, "device_idle_ns": 80, "around": None, "cause": "unknown", "missing": ["the CUDA API trace"]}
    f = {"rule_id": "T001", "evidence": t001, "start_ns": 100, "end_ns": 900, "severity": "warning",
         "device_id": 0, "stream_id": 7}
    assert fmt.place(100, 900, 0, place_of(f)).endswith("3 of the 4 gaps, 75.0% of their time")
    assert unknown_cause(f) == ["the CUDA API trace"]
    assert [(r.start_ns, r.end_ns) for r in examples(f)] == [(100, 900), (100, 160)]
    assert {(m["s"], m["e"], m["st"]) for m in markers([f], 0, 1000)} == {(100, 900, 7), (100, 160, 7)}
    assert _duration(f) == 0.0  # not a kernel's profiled time: T001 has none
    with pytest.raises(EvidenceMismatch):  # a key T001 does not declare
        unknown_cause({**f, "evidence": {**t001, "duration_ns": 5.0}})


def test_evidence_of_another_shape_is_a_warning_and_no_evidence_for_a_user():
    """Outside the tests (which make EvidenceMismatch an error), evidence that does not fit its
    rule's type, as a store written by another version holds, reads as none, with a warning."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert evidence_of("T001", json.dumps({"main_reason": "sync"})) is None
    assert [w.category for w in caught] == [EvidenceMismatch] and "T001" in str(caught[0].message)
