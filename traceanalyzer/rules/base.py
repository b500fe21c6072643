"""What a rule is: metadata, typed thresholds, and the query that yields its findings.

A rule module in this folder defines `RULE = Rule(...)`; the engine finds it by walking
the folder. Most rules are one SQL query over the store, with thresholds bound as named
parameters (`$min_gap_ns`) and the run as `$run_id`. A rule that needs Python (the
occupancy calculator) gives `evaluate` instead of, or after, its SQL.

A rule's query returns rows with any of the FINDING_COLUMNS below; the engine fills the
rest (run, rule id, default severity) and stores them in the `findings` table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from .. import schema

if TYPE_CHECKING:
    import pandas as pd

PHASES = ("structure", "timeline", "bottleneck", "instruction", "memory")
SEVERITIES = ("info", "warning", "error")

# What a rule's query may return: the `findings` table's columns (see schema.py).
FINDING_COLUMNS: tuple[str, ...] = tuple(schema.FINDINGS.column_names)


def pair_key(first: str, then: str, *, then_descending: bool = False) -> str:
    """SQL for the order of the pair (first, then), or (first, -then), of two never-NULL
    BIGINT expressions, as one 128-bit integer. arg_min/arg_max compare it far faster than
    the tuple (a struct): 5 M kernels, S001's grouping 0.39 -> 0.13 s."""
    low = f"9223372036854775807 - {then}::HUGEINT" if then_descending else f"{then}::HUGEINT + 9223372036854775808"
    return f"({first}::HUGEINT * 18446744073709551616 + ({low}))"


@dataclass(frozen=True)
class Threshold:
    name: str  # with its unit: min_gap_ns, min_share, max_waves
    default: float | int
    doc: str

    def coerce(self, raw: Any) -> float | int:
        if isinstance(self.default, bool):
            raise TypeError("boolean thresholds are not supported")
        try:
            v = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"threshold {self.name} needs a number, got {raw!r}") from None
        return int(v) if isinstance(self.default, int) and v.is_integer() else v


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    title: str
    phase: str
    severity: str
    what: str
    why: str
    how: str
    fix: str
    requires: str  # the data the rule needs, in words (shown when a run lacks it)
    applies_sql: str  # returns one row, one column: does this run carry the data? ($run_id)
    thresholds: tuple[Threshold, ...] = ()
    sql: Optional[str] = None
    evaluate: Optional[Callable[..., pd.DataFrame]] = None  # (store, run_id, params) -> findings
    references: tuple[str, ...] = ()
    formats: tuple[str, ...] = ("nsys-sqlite", "kineto-json", "ncu-csv")
    example: str = ""
    # "run": sql/evaluate see one run ($run_id). "runs": evaluate(store, run_ids, params) sees
    # every checked run that carries the data and returns findings with a run_id column.
    scope: str = "run"

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"{self.id}: unknown phase {self.phase!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.id}: unknown severity {self.severity!r}")
        if self.sql is None and self.evaluate is None:
            raise ValueError(f"{self.id}: a rule needs sql or evaluate")
        if self.scope not in ("run", "runs") or (self.scope == "runs" and (self.evaluate is None or self.sql)):
            raise ValueError(f"{self.id}: scope must be 'run', or 'runs' with evaluate and no sql")

    def params(self, overrides: dict[str, Any] | None = None) -> dict[str, float | int]:
        values = {t.name: t.default for t in self.thresholds}
        for k, v in (overrides or {}).items():
            t = next((t for t in self.thresholds if t.name == k), None)
            if t is None:
                known = ", ".join(values) or "none"
                raise ValueError(f"{self.id} has no threshold {k!r} (known: {known})")
            values[k] = t.coerce(v)
        return values


@dataclass
class RuleOutcome:
    rule_id: str
    run_id: str
    status: str  # ran | no-data | error
    findings: int = 0
    note: str = ""
    extra: dict = field(default_factory=dict)
