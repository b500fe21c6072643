"""The rules engine: find rules by walking this folder, run them per run, store findings.

Every module here except the engine's own (`base`, `engine`, names starting with `_`)
defines one `RULE`. Adding a rule is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from functools import lru_cache

from .base import PHASES, FINDING_COLUMNS, Rule, RuleOutcome, Threshold

_NOT_RULES = {"base", "engine", "config", "docs", "evidence"}


@lru_cache(maxsize=1)
def all_rules() -> tuple[Rule, ...]:
    rules = []
    for m in pkgutil.iter_modules(__path__):
        if m.name in _NOT_RULES or m.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{m.name}")
        rule = getattr(mod, "RULE", None)
        if not isinstance(rule, Rule):
            raise ImportError(f"rules/{m.name}.py defines no RULE")
        rules.append(rule)
    ids = [r.id for r in rules]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise ImportError(f"duplicate rule ids: {sorted(dupes)}")
    return tuple(sorted(rules, key=lambda r: (PHASES.index(r.phase), r.id)))


def get_rule(ref: str) -> Rule:
    """A rule by id (case-insensitive) or name."""
    for r in all_rules():
        if ref.upper() == r.id or ref.lower() == r.name:
            return r
    raise KeyError(ref)


def evidence_of(rule_id: str, evidence):
    """A finding's evidence (the stored JSON text, or that text decoded to a dict) as its rule's
    type (`Rule.evidence`, rules/evidence.py); None where there is none or the rule is not known
    to this version, and where it does not fit the type (a key the rule writes that its type
    does not declare, or evidence stored by another version): then an EvidenceMismatch warning
    says so, which the tests make an error, so that a renamed key fails a test while a report
    on a store of another version shows the rest of what it can."""
    import msgspec

    if evidence is None or evidence == "":
        return None
    try:
        kind = get_rule(rule_id).evidence
    except KeyError:
        return None
    if kind is None:
        return None
    try:
        if isinstance(evidence, (str, bytes)):
            return _decoded(evidence, kind)
        return msgspec.convert(evidence, type=kind)
    except msgspec.ValidationError as e:
        warnings.warn(EvidenceMismatch(f"{rule_id}'s evidence does not fit {kind.__name__}: {e}"), stacklevel=2)
        return None


class EvidenceMismatch(UserWarning):
    """A finding's evidence that does not fit its rule's type (`evidence_of`)."""


@lru_cache(maxsize=4096)
def _decoded(text: str | bytes, kind: type):
    """The diagnosis reads a finding's evidence more than once (its cap, its cause); readers
    do not change what they get."""
    from .evidence import decode

    return decode(text, kind)


__all__ = ["all_rules", "get_rule", "evidence_of", "EvidenceMismatch", "Rule", "Threshold", "RuleOutcome", "FINDING_COLUMNS"]
