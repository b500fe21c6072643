"""The rules engine: find rules by walking this folder, run them per run, store findings.

Every module here except the engine's own (`base`, `engine`, names starting with `_`)
defines one `RULE`. Adding a rule is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil
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


__all__ = ["all_rules", "get_rule", "Rule", "Threshold", "RuleOutcome", "FINDING_COLUMNS"]
