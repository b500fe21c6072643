"""What a rule is: metadata, typed thresholds, and the query that yields its findings.

A rule module in this folder defines `RULE = Rule(...)`; the engine finds it by walking
the folder. Most rules are one SQL query over the store, with thresholds bound as named
parameters (`$min_gap_ns`) and the run as `$run_id`. A rule that needs Python (the
occupancy calculator) gives `evaluate` instead of, or after, its SQL.

A rule's query returns rows with any of the FINDING_COLUMNS below; the engine fills the
rest (run, rule id, default severity) and stores them in the `findings` table.

Severity: on a timeline the diagnosis sets a headline's severity from its estimated loss's
share of its device's span (traceanalyzer.diagnosis); the rule's own severity stands where
there is no loss or no span. A rule lowers it with a stated reason: for all its findings with
`max_severity` and `severity_reason`, for one finding with the severity it returns and a
`severity_reason` in its evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from .. import schema

if TYPE_CHECKING:
    import pandas as pd

PHASES = ("structure", "timeline", "bottleneck", "instruction", "memory")
SEVERITIES = ("info", "warning", "error")

# Columns the diagnosis sets once every rule of a run has run (traceanalyzer.diagnosis).
DIAGNOSIS_COLUMNS = ("finding_no", "related_to", "rule_loss_ns")
# What a rule's query may return: the `findings` table's other columns (see schema.py).
FINDING_COLUMNS: tuple[str, ...] = tuple(c for c in schema.FINDINGS.column_names if c not in DIAGNOSIS_COLUMNS)
# The parts of a device's time budget a finding's loss can be time of (the `claims` column):
# idle of any cause, or of the one cause a rule names.
CLAIMS = ("compute", "communication", "copy", "copy:HtoD", "copy:DtoH", "copy:DtoD", "idle", "idle:sync", "idle:host")


def pair_key(first: str, then: str, *, then_descending: bool = False) -> str:
    """SQL for the order of the pair (first, then), or (first, -then), of two never-NULL
    BIGINT expressions, as one 128-bit integer. arg_min/arg_max compare it far faster than
    the tuple (a struct): 5 M kernels, S001's grouping 0.39 -> 0.13 s."""
    low = f"9223372036854775807 - {then}::HUGEINT" if then_descending else f"{then}::HUGEINT + 9223372036854775808"
    return f"({first}::HUGEINT * 18446744073709551616 + ({low}))"


# Why a rule whose loss is a faster kernel's saving is at most a warning (`Rule.max_severity`).
UPPER_BOUND = ("its estimated loss is what the kernel could save if it ran faster, an upper bound the fix may "
               "not reach, not time measured lost")

# Durations, sizes and counts stay below this, so a threshold added to a 64-bit nanosecond
# timestamp in a rule's SQL cannot overflow (10^18 ns is 31 years).
LARGEST = 10**18


@dataclass(frozen=True)
class Unit:
    """What a threshold's name ends in, and the values it allows (inclusive bounds; never NaN
    or infinite: `high` = inf means no upper bound)."""

    suffix: str
    low: float
    high: float
    symbol: str = ""  # written after values: "5000 ns", "0 to 100 %"
    integer: bool = False
    display: bool = False  # shapes only the evidence (how much it lists), never what is found


UNITS = {u.suffix: u for u in (
    Unit("ns", 0, LARGEST, "ns"),
    Unit("bytes", 0, LARGEST, "bytes"),
    Unit("share", 0, 1),
    Unit("pct", 0, 100, "%"),
    Unit("ratio", 0, math.inf),
    Unit("waves", 0, math.inf, "waves"),
    Unit("count", 0, LARGEST, integer=True),
    # How many examples the evidence lists: the list is bounded so the evidence stays readable.
    Unit("examples", 0, 1000, integer=True, display=True),
)}


def _num(x: float) -> str:
    return "1e18" if x == LARGEST else f"{x:g}"


@dataclass(frozen=True)
class Threshold:
    """A number that tunes a rule: its name ends in its unit (`min_gap_ns`, `min_share`,
    `max_examples`), which gives the values it allows; `low`/`high` narrow them where the
    unit's range includes values that make no sense for this threshold."""

    name: str
    default: float | int
    doc: str
    low: Optional[float] = None
    high: Optional[float] = None

    def __post_init__(self):
        if not isinstance(self.default, (int, float)) or isinstance(self.default, bool):
            raise TypeError(f"threshold {self.name}: the default must be a number")
        if self.name.rsplit("_", 1)[-1] not in UNITS:
            raise ValueError(f"threshold {self.name}: the name must end in a unit ({', '.join('_' + u for u in UNITS)})")
        if not self.unit.low <= self.lowest <= self.highest <= self.unit.high:
            raise ValueError(f"threshold {self.name}: low/high may only narrow the unit's range")
        if not self.lowest <= self.default <= self.highest:
            raise ValueError(f"threshold {self.name}: default {self.default} is outside {self.range_text()}")

    @property
    def unit(self) -> Unit:
        return UNITS[self.name.rsplit("_", 1)[-1]]

    @property
    def lowest(self) -> float:
        return self.unit.low if self.low is None else self.low

    @property
    def highest(self) -> float:
        return self.unit.high if self.high is None else self.high

    @property
    def display(self) -> bool:
        """Whether it only shapes the evidence: any allowed value gives the same findings."""
        return self.unit.display

    def range_text(self, in_a_sentence: bool = False) -> str:
        """The allowed values in words: "0 to 1", "0 to 1e18 ns", "whole number, 1 to 1e18", ">= 0";
        `in_a_sentence`: as said after "must be" ("from 0 to 1", "a whole number from 1 to 1e18")."""
        u = self.unit
        if math.isfinite(self.highest):
            span = f"{'from ' if in_a_sentence else ''}{_num(self.lowest)} to {_num(self.highest)}"
        else:
            span = f">= {_num(self.lowest)}"
        if u.integer:
            span = f"a whole number {span}" if in_a_sentence else f"whole number, {span}"
        return f"{span} {u.symbol}".rstrip()

    def coerce(self, raw: Any, owner: str = "") -> float | int:
        """`raw` (a number, or text from the command line) as this threshold's value; a
        ValueError naming `owner`.name, the value and the allowed range when it is not one."""
        label = f"{owner}.{self.name}" if owner else self.name
        try:
            v = float(raw)
            shown = raw.strip() if isinstance(raw, str) else repr(raw)  # text that reads as a number, unquoted
        except (TypeError, ValueError):
            v, shown = math.nan, repr(raw)
        what = f"{label} must be {self.range_text(in_a_sentence=True)}, not {shown}"
        if isinstance(raw, bool):
            raise ValueError(what)
        if not (math.isfinite(v) and self.lowest <= v <= self.highest) or (self.unit.integer and not v.is_integer()):
            raise ValueError(what)
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
    example: str = ""
    # "run": sql/evaluate see one run ($run_id). "runs": evaluate(store, run_ids, params) sees
    # every checked run that carries the data and returns findings with a run_id column.
    scope: str = "run"
    # With scope "runs": (store, run_ids) -> the sets of those runs the rule compares (the ranks
    # of one job); a run in none has nothing to be compared with, so no data for the rule.
    groups: Optional[Callable[..., list[list[str]]]] = None
    # Thresholds of other rules this one's query reads too, as "RULE.name": one value, owned and
    # set by that rule (`--threshold RULE.name`), bound here under its own name.
    shared: tuple[str, ...] = ()
    # The budget part (CLAIMS) its findings' losses are time of, unless a row sets `claims`;
    # None: time outside the budget, or no loss.
    claims: Optional[str] = None
    # NVIDIA's rules that flag the same issue in an Nsight Compute report: (rule identifier,
    # regular expression its message must match; "" matches any), so reports can show NVIDIA's
    # verdict beside each finding (report/vendor.py).
    nvidia: tuple[tuple[str, str], ...] = ()
    # The most severe its findings may be, whatever their loss, and why (shown in its doc and
    # in a finding the cap lowered): an estimate of what a faster kernel could save is an upper
    # bound, not time measured lost.
    max_severity: Optional[str] = None
    severity_reason: str = ""
    # (store, run_id, findings) -> findings: where the trace cannot tell the cause a finding
    # names, the finding says `cause: unknown` and what is missing instead (rules/_unknown.py).
    unknown: Optional[Callable[..., pd.DataFrame]] = None
    # What its findings' evidence holds (a rules.evidence.Evidence subclass): the JSON its query
    # writes, declared so that readers decode it by type and a renamed key fails a test.
    evidence: Optional[type] = None
    # (store, run_id) -> one row per item the rule examines, flagged or not, for reports that
    # chart them all (B003: every kernel's place on the roofline).
    analysis: Optional[Callable[..., pd.DataFrame]] = None

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"{self.id}: unknown phase {self.phase!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.id}: unknown severity {self.severity!r}")
        if self.max_severity is not None and (self.max_severity not in SEVERITIES or not self.severity_reason):
            raise ValueError(f"{self.id}: max_severity must be one of {', '.join(SEVERITIES)}, with a severity_reason")
        if self.sql is None and self.evaluate is None:
            raise ValueError(f"{self.id}: a rule needs sql or evaluate")
        if self.scope not in ("run", "runs") or (self.scope == "runs" and (self.evaluate is None or self.sql)):
            raise ValueError(f"{self.id}: scope must be 'run', or 'runs' with evaluate and no sql")
        if self.groups is not None and self.scope != "runs":
            raise ValueError(f"{self.id}: groups are for scope 'runs'")
        if self.claims is not None and self.claims not in CLAIMS:
            raise ValueError(f"{self.id}: claims must be one of {', '.join(CLAIMS)}")

    def params(self, overrides: dict[str, Any] | None = None,
               others: dict[str, dict[str, Any]] | None = None) -> dict[str, float | int]:
        """The thresholds' values: defaults, with `overrides` of this rule's own (or of a shared one,
        as "RULE.name"); shared ones from their owner's overrides in `others` (rule id -> values)."""
        from . import get_rule

        values = {t.name: t.default for t in self.thresholds}
        owners = {ref.split(".")[1]: ref.split(".")[0] for ref in self.shared}
        for name, owner in owners.items():
            values[name] = get_rule(owner).params((others or {}).get(owner))[name]
        for k, v in (overrides or {}).items():
            owner, _, name = k.rpartition(".")
            if owner and owners.get(name) == owner:
                values[name] = get_rule(owner).params({name: v})[name]
                continue
            t = next((t for t in self.thresholds if t.name == k), None)
            if t is None:
                if k in owners:
                    raise ValueError(f"{self.id} reads {owners[k]}'s threshold {k!r}: set {owners[k]}.{k}")
                known = ", ".join(t.name for t in self.thresholds) or "none"
                raise ValueError(f"{self.id} has no threshold {k!r} (known: {known})")
            values[k] = t.coerce(v, self.id)
        return values


@dataclass
class RuleOutcome:
    rule_id: str
    run_id: str
    status: str  # ran | no-data | error
    findings: int = 0
    note: str = ""
    extra: dict = field(default_factory=dict)
