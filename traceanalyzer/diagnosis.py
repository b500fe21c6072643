"""Findings grouped by root cause, their losses bounded by the time budget.

Each rule asks one question, so several rules find the same lost time: a device idle while
the host reads data is a launch gap (T001), a host-bound stretch (T004) and, when a
device-to-host copy came before, a waited-on copy (T006). Reported side by side they claim
that time three times and give three fixes. So once a run's rules have run, its findings are
diagnosed together (`diagnose`):

1. **Units.** A finding's `claims` names the part of its device's time budget (the
   `time_budget` view) its loss is time of. Findings that claim the same part of one device
   share a unit: the device's idle time (of any cause), its copy time of one direction
   (`copy:HtoD`, ...; `copy`: of any), and the compute or communication time of one kernel
   (by `item_name`). A finding with no device (T004: every GPU idle at once) sits in that
   part's unit on every device, which joins those units into one group.
2. **One headline per group.** Every other finding of the group is related evidence of it
   (`related_to`), claims no time of its own (`est_loss_ns` NULL; the rule's figure stays in
   `rule_loss_ns`) and takes the headline's severity (4.; where there is no loss to weigh, it
   lends the headline its own when worse). In an idle group the
   headline is a finding that names the cause the budget gives most of the idle time (sync,
   host, dependency, unknown), a rule that names its cause before the launch-gap rule, which
   covers them all, while its estimate is at least half (`HEADLINE_SHARE`) of the largest
   among those naming that cause (a sync's 74 us does not stand for 5 ms of launch-bound
   gaps), and of those one that says what the host did in the idle time (T004) before one that
   says what it waited on before it (T003, T006); elsewhere the most severe, among equals one that gives no reason of its own to be
   less (`severity_reason` in its evidence: B002 at a throughput roof) first, then the largest
   loss. A finding that
   abstained (`"cause": "unknown"` in its evidence: the trace cannot tell, see
   rules/_unknown.py) names `unknown`, whatever the budget's marks say.
3. **Losses bounded by the budget's steady state.** The budget here is the steady state's:
   the time budget less the time inside warm-up windows (`warmup_windows`: ranges named
   warm-up, first launches, module loads, early frees, JIT compilation, uploads before the
   first kernel, slow first steps), part by part. A loss over a busy part (compute,
   communication, copies) is first scaled by that part's share outside warm-up; idle losses
   are measured outside warm-up by the timeline rules themselves. A headline's loss that the
   whole budget would have allowed more of says what warm-up took ("(X more in warm-up, not
   counted)", evidence `loss_warmup_ns`). A headline's loss is at most the time of its part: the
   device's idle or copy time; a kernel's own time on the device and, summed over the
   device's kernels, its compute (or communication) time, each scaled down in proportion when
   they sum to more (kernels on concurrent streams overlap). A finding without a device is
   bounded on each of its devices. So per device, headline losses sum to no more than the
   span, and no nanosecond is claimed twice.

4. **Severity from the loss.** A headline's severity follows its bounded loss as a share of
   its device's steady span (warm-up left out; of the run's span, for a finding that claims no part; for a finding on no
   device, of its devices' shortest): **error** from `error_span_share` (10%), **warning**
   from `min_loss_span_share` (1%), **info** below; a loss under `min_loss_ns` (100 us) is
   info whatever its share. A warning is time worth a look, an error a tenth of the device's
   time or more. The rule's own severity stands where there is nothing to weigh: a finding
   without a loss estimate (peak memory, an out-of-memory), or a run without a timeline
   (Nsight Compute profiles a sample of launches: there is no span; its rules weigh a
   kernel's share of the profiled time themselves). A rule lowers it with a stated reason:
   `max_severity` for all its findings (the bottleneck and instruction rules' losses are what
   a faster kernel could save, an upper bound: at most a warning), or for one finding the
   severity it gives with a `severity_reason` in its evidence (a library kernel's low
   occupancy, by design). A headline that claims idle time of devices that ran one cold
   execution is at most info: mostly warm-up (steady span under `COLD_SPAN_SHARE`, 10%, of the
   span) with most of its kernel time in kernels its process ran once (compilation, loading
   and a first run: no steady state to judge; a benchmark that warms up repeats its kernels,
   and a program whose one kernel is its work is not mostly warm-up). A headline the cap
   lowered says so in its message, and so does a
   warning or error of its rule that the bands made info. Related findings take their
   headline's severity (their time is its), lowered by their own rule's cap. The bands are
   set like a rule's thresholds, under the name `floor` (`--threshold
   floor.error_span_share=0.2`, `[tool.traceanalyzer.thresholds.floor]`).

5. **Order.** Headlines by bounded loss, largest first; among equal losses, and for those
   without one (after all that have one), the most severe first. Each headline's related
   findings follow it. Every report keeps this order.

6. **Per step.** Where the run has steps (the `steps` view's most frequent name, warm-up
   steps and steps outside the GPUs' span left out), a headline's message and evidence
   (`loss_per_step_ns`, `loss_steps`) give its loss per step as well.

A finding that claims no part (`claims` NULL: a recompile's compile time, a straggler's lag,
peak memory) is a headline of its own, its loss bounded by the run's span. A run without a
timeline (Nsight Compute) has no budget: its findings are grouped by kernel, losses as the
rules gave them.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

import pyarrow as pa

from .fmt import loss_bound, ns, pct
from .rules.base import SEVERITIES, Threshold
from .rules import all_rules
from .rules.engine import Found, RuleOutcome, RunFound, Settings, findings_table, run_rules, write_run_found
from .store import Store
from .analyses.steps import PROFILER_STEP

if TYPE_CHECKING:
    import pandas as pd

# T001's causes as the budget names them (its `late_launch` is the budget's `host`).
_T001_CAUSE = {"sync": "sync", "late_launch": "host", "copy": "dependency", "dependency": "dependency",
               "unknown": "unknown"}
_PER_KERNEL = ("compute", "communication")
# In an idle group, a finding that names the main cause heads before the launch-gap rule when
# its estimate is at least this share of the largest estimate naming that cause.
HEADLINE_SHARE = 0.5
# A headline says what warm-up took of its loss when that is more than this share of it (a few
# microseconds of a kernel's first launch are not worth a note).
WARMUP_NOTE_SHARE = 0.01


# A device whose steady span is under this share of its span, with under half of its kernel
# time in kernels its process ran more than once, ran one cold execution (`_cold_devices`).
COLD_SPAN_SHARE = 0.1
COLD_REASON = ("the trace holds one cold execution of its work (warm-up takes most of the span, and most kernel time "
               "is in kernels run once): no steady state to judge; profile later iterations")
# Of a device's kernel time, the share in kernels its process ran more than once.
_REPEATED_SQL = """
SELECT sum(ns) FILTER (WHERE n > 1) / nullif(sum(ns), 0) FROM (
    SELECT pid, name, count(*) AS n, sum(end_ns - start_ns) AS ns FROM kernels
    WHERE run_id = $r AND device_id IS NOT DISTINCT FROM $d AND end_ns >= start_ns GROUP BY ALL)
"""


# The severity bands, set like a rule's thresholds under this name (it began as a floor only).
FLOOR = "FLOOR"
FLOORS = (
    Threshold("error_span_share", 0.10, "A headline whose estimated loss is at least this share of its device's "
              "span (and at least `min_loss_ns`) is an error."),
    Threshold("min_loss_span_share", 0.01, "A headline whose estimated loss is at least this share of its device's "
              "span (and at least `min_loss_ns`) is a warning; under it, info."),
    Threshold("min_loss_ns", 100_000, "A headline whose estimated loss is under this is info, whatever its share "
              "of the span."),
)


def floor_params(overrides: dict | None = None) -> dict[str, float | int]:
    """The floor's values: defaults, with `overrides` ({name: value}); a ValueError for a bad one."""
    values = {t.name: t.default for t in FLOORS}
    for k, v in (overrides or {}).items():
        t = next((t for t in FLOORS if t.name == k), None)
        if t is None:
            raise ValueError(f"floor has no threshold {k!r} (known: {', '.join(t.name for t in FLOORS)})")
        values[k] = t.coerce(v, "floor")
    return values


def diagnose_runs(store: Store, run_ids: Iterable[str] | None = None,
                  settings: Settings | None = None) -> list[RuleOutcome]:
    """One rules pass over each run (`rules.engine.run_rules`), then the runs' diagnosis
    (`store_diagnosed`): for a command whose only pass is this one."""
    found = Found()
    outcomes = run_rules(store, run_ids, settings, into=found)
    store_diagnosed(store, found, settings)
    return outcomes


def store_diagnosed(store: Store, found: Found, settings: Settings | None = None) -> None:
    """The diagnosis, once per run after the passes a command ran (per-run, linked, cross-run):
    each run of `found` stored with what its passes found, diagnosed with its other rules'
    stored findings (`diagnose_run`). A run whose passes found nothing where those rules had
    stored nothing either (the cross-run pass on most runs) keeps its diagnosis as it is:
    diagnosing the same findings again gives the same rows; only the outcomes are written."""
    floors = floor_params((settings.thresholds if settings else {}).get(FLOOR))
    for run_id, run in found.runs.items():
        if run.findings() or store.sql("SELECT count(*) FROM findings WHERE run_id = ? AND list_contains(?, rule_id)",
                                       [run_id, list(run.rules)]).fetchone()[0]:
            diagnose_run(store, run_id, run, floors)
        else:
            write_run_found(store, run_id, run)


def diagnose_run(store: Store, run_id: str, run: RunFound | None = None, floors: dict | None = None) -> None:
    """Store every finding of `run_id` diagnosed (`diagnose`), in one transaction: those of
    `run` (what a command's passes found, not stored yet) with the stored ones of every other
    rule, which are written again with their outcomes as they were.

    Idempotent: diagnosing a run's stored findings again (no `run`) gives the same rows. A
    stored finding is diagnosed already; `diagnose` takes its rule's own figures back first
    (`_as_found`)."""
    import pandas as pd

    run = run or RunFound()
    kept = store.read_findings(run_id, [r.id for r in all_rules() if r.id not in run.rules])
    others = sorted(set(kept.rule_runs.column("rule_id").to_pylist()))
    statuses = run.statuses()
    statuses = pa.concat_tables([statuses, kept.rule_runs.select(statuses.column_names)])
    parts = [f for f in (kept.findings.to_pandas(), *run.findings()) if not f.empty]
    found = [diagnose(store, run_id, pd.concat(parts, ignore_index=True).assign(run_id=run_id), floors)] if parts else []
    store.write_findings(run_id, [*run.rules, *others], findings_table(found), statuses)


@dataclass
class _Facts:
    """What the diagnosis reads of one run besides its findings."""

    whole: dict[tuple, int]  # the time budget: (device, part) -> ns
    budget: dict[tuple, int]  # its steady state's (the time inside warm-up windows taken out)
    warm: dict[tuple, int]  # the time inside warm-up windows, by the same keys
    steps: int
    kernel_ns: dict
    span_ns: int | None
    cold: set = field(default_factory=set)  # devices that ran one cold execution (`_cold_devices`)


@dataclass
class _Verdict:
    """The diagnosis of a run's findings (each by its row index): the headlines' bounded losses
    and the related findings' headlines, each finding's severity and the notes it gains."""

    loss: dict[int, float | None] = field(default_factory=dict)  # per headline
    related: dict[int, int] = field(default_factory=dict)  # finding -> its headline
    lent: dict[int, str] = field(default_factory=dict)  # the worst severity of its group, where no band applies
    bounds: dict[int, str] = field(default_factory=dict)  # what lowered a headline's loss below its rule's, in words
    loss_warmup_ns: dict[int, float] = field(default_factory=dict)  # of a headline's loss bounded by the whole budget, warm-up's part
    severity: dict[int, str] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)  # on the bound and the severity band


def diagnose(store: Store, run_id: str, findings: pd.DataFrame, floors: dict | None = None) -> pd.DataFrame:
    """Every finding of `run_id`, with `finding_no`, `related_to`, `rule_loss_ns`, the bounded
    `est_loss_ns` and the group's severity set (see the module's docstring)."""
    floors = floor_params() if floors is None else floors
    df = _as_found(findings.reset_index(drop=True).copy())
    facts = _facts(store, run_id, df)
    rows = df.to_dict("records")
    # (a device the trace did not name is None: it sorts last)
    units = [_units(r, sorted({d for d, _ in facts.budget}, key=lambda d: (d is None, d or 0))) for r in rows]
    v = _Verdict(lent={i: r["severity"] for i, r in enumerate(rows)})
    for members in _groups(units):
        _headline(v, rows, units, members, facts)
    _share_parts(rows, units, v.loss, facts.budget, v.bounds)
    _severities(v, rows, units, facts, floors)
    return _written(df, rows, v, facts.steps)


def _facts(store: Store, run_id: str, df: pd.DataFrame) -> _Facts:
    whole = _budget(store, run_id)
    warm, steps = _warmup(store, run_id)
    span_ns = store.sql("SELECT span_ns FROM runs WHERE run_id = $r", {"r": run_id}).fetchone()[0]
    budget = {k: ns - warm.get(k, 0) for k, ns in whole.items()}
    return _Facts(whole, budget, warm, steps, _kernel_ns(store, run_id, df), span_ns,
                  _cold_devices(store, run_id, whole, budget))


def _cold_devices(store: Store, run_id: str, whole: dict, budget: dict) -> set:
    """The devices that ran one cold execution: steady span under COLD_SPAN_SHARE of the span,
    and under half of their kernel time in kernels their process ran more than once."""
    steady, cold = _spans(budget), set()
    for device, span in _spans(whole).items():
        if span and steady.get(device, 0) < COLD_SPAN_SHARE * span:
            (repeated,) = store.sql(_REPEATED_SQL, {"r": run_id, "d": device}).fetchone()
            if repeated is not None and repeated < 0.5:
                cold.add(device)
    return cold


def _headline(v: _Verdict, rows: list[dict], units: list, members: list[int], facts: _Facts) -> None:
    """The headline of one group, the others related to it, and its loss bounded by the budget."""
    budget = facts.budget
    main = _main_idle_cause(units[members[0]], budget)  # the members share their devices
    naming = [_num(rows[i]["rule_loss_ns"]) for i in members if _names(rows[i], main)]
    head = min(members, key=lambda i: _headline_order(rows[i], main, max(naming, default=-1.0)))
    for i in members:
        if i != head:
            v.related[i] = head
            if SEVERITIES.index(rows[i]["severity"]) > SEVERITIES.index(v.lent[head]):
                v.lent[head] = rows[i]["severity"]
    v.loss[head], v.bounds[head] = _bounded(rows[head], units[head], budget, facts.kernel_ns, facts.span_ns,
                                            _steady_share(units[head], budget, facts.whole))
    if facts.warm and v.loss[head] is not None:
        left_out = _bounded(rows[head], units[head], facts.whole, facts.kernel_ns, facts.span_ns)[0] - v.loss[head]
        if left_out > WARMUP_NOTE_SHARE * (v.loss[head] + left_out):
            v.loss_warmup_ns[head] = left_out


def _severities(v: _Verdict, rows: list[dict], units: list, facts: _Facts, floors: dict) -> None:
    """Each headline's severity from its loss's band, lowered by its rule's cap, with the notes
    that say why; each related finding's from its headline's."""
    v.severity = {i: r["severity"] for i, r in enumerate(rows)}
    v.notes = {i: f"; {b}" for i, b in v.bounds.items() if b}
    spans = _spans(facts.budget)
    for i in v.loss:
        share = _share(rows[i], units[i], v.loss[i], spans, facts.span_ns)
        band = v.lent[i] if share is None else _band(v.loss[i], share, floors)
        cap, reason = _cap(rows[i])
        if _cold(rows[i], units[i], facts.cold):
            cap, reason = "info", COLD_REASON
        v.severity[i] = _lower(band, cap)
        if share is not None and v.severity[i] != band:
            v.notes[i] = v.notes.get(i, "") + f" ({v.severity[i]}, not {band}: {reason})"
        elif share is not None and band == "info" and rows[i]["severity"] != "info":
            v.notes[i] = v.notes.get(i, "") + _floor_note(share, floors)
    for i, head in v.related.items():
        if _share(rows[head], units[head], v.loss[head], spans, facts.span_ns) is not None:
            v.severity[i] = _lower(v.severity[head], _cap(rows[i])[0])  # its time is the headline's
        else:
            v.severity[i] = _lower(rows[i]["severity"], _cap(rows[i])[0])


def _cold(row: dict, units: list[tuple], cold: set) -> bool:
    """Whether a finding claims idle time of devices that all ran one cold execution."""
    devices = {d for d, category, _ in units if category == "idle"}
    return bool(devices) and devices <= cold and str(row["claims"] or "").startswith("idle")


def _numbers(rows: list[dict], v: _Verdict) -> dict[int, int]:
    """Each finding's `finding_no`: headlines by loss (then severity), each followed by its related findings."""
    order = sorted(v.loss, key=lambda i: (-(v.loss[i] if v.loss[i] is not None else -1),
                                          -SEVERITIES.index(v.severity[i]), rows[i]["rule_id"], i))
    numbered: list[int] = []
    for head in order:
        numbered.append(head)
        numbered += sorted((i for i, h in v.related.items() if h == head),
                           key=lambda i: (-SEVERITIES.index(v.severity[i]), -_num(rows[i]["rule_loss_ns"]),
                                          rows[i]["rule_id"], i))
    return {i: n + 1 for n, i in enumerate(numbered)}


def _written(df: pd.DataFrame, rows: list[dict], v: _Verdict, steps: int) -> pd.DataFrame:
    """`df` with the verdict's columns, notes and evidence (`DIAGNOSIS_KEYS`), in `finding_no` order."""
    no = _numbers(rows, v)
    n = range(len(rows))
    df["finding_no"] = [no[i] for i in n]
    df["related_to"] = [no[v.related[i]] if i in v.related else None for i in n]
    df["est_loss_ns"] = [None if i in v.related or v.loss[i] is None else int(round(v.loss[i])) for i in n]
    df["related_to"], df["est_loss_ns"] = df["related_to"].astype("Int64"), df["est_loss_ns"].astype("Int64")
    df["severity"] = [v.severity[i] for i in n]
    extra: dict[int, dict] = {}
    own: dict[int, str] = defaultdict(str)  # the notes on warm-up and per step, after the floor's
    for i, left_out in v.loss_warmup_ns.items():
        own[i] += f" ({ns(left_out)} more in warm-up, not counted)"
        extra.setdefault(i, {})["loss_warmup_ns"] = int(round(left_out))
    for i in v.loss if steps > 1 else ():
        if v.loss[i]:
            own[i] += f" ({ns(v.loss[i] / steps)} lost per step over {steps} steps)"
            extra.setdefault(i, {}).update(loss_per_step_ns=int(round(v.loss[i] / steps)), loss_steps=steps)
    if v.notes:  # (a stored finding has its notes already: `_as_found`)
        df["message"] = [m + v.notes[i] if i in v.notes and v.notes[i] not in m else m
                         for i, m in enumerate(df["message"])]
    if own:
        df["message"] = [m + own[i] if i in own else m for i, m in enumerate(df["message"])]
    if extra:
        df["evidence"] = [_with(e, extra[i]) if i in extra else e for i, e in enumerate(df["evidence"])]
    return df.sort_values("finding_no", kind="stable").reset_index(drop=True)


def _as_found(df: pd.DataFrame) -> pd.DataFrame:
    """Findings as their rules gave them, as far as the store keeps that: a stored finding was
    diagnosed (the store holds no other), and a later command diagnoses it again with the
    findings of the rules it ran (`diagnose_run`). Its rule's own estimate is in
    `rule_loss_ns`, and the notes and evidence on warm-up and per step (`DIAGNOSIS_KEYS`, which
    no rule writes) are taken off its message and evidence, to be added again as they are now.
    The notes on what bounded its loss or lowered its severity stay, and `diagnose` adds none
    that the message holds; its severity stays the diagnosed one, which a band or cap applied
    again leaves as it is. The store keeps nothing else of what the rule said, so this stays as
    long as the store holds diagnosed findings only."""
    rule_loss = df["rule_loss_ns"] if "rule_loss_ns" in df else None
    df["rule_loss_ns"] = df["est_loss_ns"] if rule_loss is None else rule_loss.where(rule_loss.notna(), df["est_loss_ns"])
    df["message"] = [_OWN_NOTES.sub("", m) if isinstance(m, str) else m for m in df["message"]]
    df["evidence"] = [_without_own(e) for e in df["evidence"]]
    return df


def _without_own(evidence):
    """`evidence` (JSON text) without the diagnosis's keys; as it was where it has none."""
    if not isinstance(evidence, str) or not any(k in evidence for k in DIAGNOSIS_KEYS):
        return evidence
    data = json.loads(evidence)
    if not isinstance(data, dict) or not DIAGNOSIS_KEYS & data.keys():
        return evidence
    return json.dumps({k: v for k, v in data.items() if k not in DIAGNOSIS_KEYS})


def _budget(store: Store, run_id: str) -> dict[tuple, int]:
    """The run's time budget: (device, category) and (device, "idle:" + cause) -> ns."""
    out: dict[tuple, int] = {}
    for r in store.time_budget([run_id]):
        device, category, cause, ns = r["device_id"], r["category"], r["cause"], r["ns"]
        out[(device, category)] = out.get((device, category), 0) + ns
        if cause is not None:
            out[(device, f"idle:{cause}")] = ns
    return out


# The evidence keys `diagnose` adds to a headline's (`rules.evidence.Evidence` declares them).
DIAGNOSIS_KEYS = frozenset({"loss_warmup_ns", "loss_per_step_ns", "loss_steps"})
# The notes on warm-up and per-step losses that `diagnose` adds to a message.
_OWN_NOTES = re.compile(r" \([^()]* (more in warm-up, not counted|per step over \d+ steps)\)")


def _warmup(store: Store, run_id: str) -> tuple[dict[tuple, int], int]:
    """The run's time inside warm-up windows (`warmup_windows`), keyed as `_budget`, and its
    steady steps: the `steps` view's of its most frequent name (`ProfilerStep#N` pooled) that
    overlap the GPUs' span, less those the windows set apart as warm-up."""
    windows, parts = store.warmup([run_id])
    out: dict[tuple, int] = {}
    for r in parts:
        device, category, cause, part_ns = r["device_id"], r["category"], r["cause"], r["ns"]
        out[(device, category)] = out.get((device, category), 0) + part_ns
        if cause is not None:
            out[(device, f"idle:{cause}")] = part_ns
    # (a step outside the GPUs' span, as the profiler's last after all GPU work, did none of it)
    (steps,) = store.sql(f"""SELECT coalesce(max(n), 0) FROM (
        SELECT count(*) AS n FROM steps, (SELECT min(start_ns) AS lo, max(end_ns) AS hi FROM gpu_activity
                                          WHERE run_id = $r) g
        WHERE run_id = $r AND start_ns < g.hi AND end_ns > g.lo
        GROUP BY regexp_replace(name, '{PROFILER_STEP}', 'ProfilerStep#*'))""", {"r": run_id}).fetchone()
    warm_steps = {w["start_ns"] for w in windows if w["reason"] == "first step"}
    return out, steps - len(warm_steps)


def _with(evidence, extra: dict) -> str:
    """`evidence` (JSON text or None) with the keys of `extra` set."""
    data = json.loads(evidence) if isinstance(evidence, str) and evidence else {}
    if not isinstance(data, dict):
        data = {"evidence": data}
    return json.dumps({**data, **extra})


def _kernel_ns(store: Store, run_id: str, df: pd.DataFrame) -> dict[tuple, int]:
    """(device, kernel name) -> that kernel's time on the device, for the kernels findings name."""
    ids = [int(i) for i, k in zip(df["item_id"], df["item_kind"]) if k == "kernel" and i == i and i is not None]
    if not ids:
        return {}
    # the names first, then a filter on that short list: a semi join against every kernel's
    # name builds a table of millions of long names
    names = [n for (n,) in store.sql("SELECT DISTINCT name FROM kernels WHERE run_id = $r AND list_contains($ids, kernel_id)",
                                     {"r": run_id, "ids": ids}).fetchall()]
    return {(d, n): ns for d, n, ns in store.sql(
        """SELECT device_id, name, CAST(sum(end_ns - start_ns) AS BIGINT) FROM kernels
           WHERE run_id = $r AND end_ns >= start_ns AND list_contains($names, name)
           GROUP BY ALL""", {"r": run_id, "names": names}).fetchall()}


def _category(claims: str) -> str:
    return claims.split(":")[0]


def _units(row: dict, devices: list) -> list[tuple]:
    """The units a finding sits in: (device, category, kernel name, copy direction or None)."""
    claims = row["claims"]
    if not isinstance(claims, str):
        return [("finding", id(row), None)]  # claims no part: a unit of its own, on no device
    category = _category(claims)
    # kernels by name; copies by direction (`copy:DtoD`): small device copies are not the
    # host-to-device copies that went unhidden
    if category in _PER_KERNEL:
        name = row["item_name"]
    else:
        name = (claims.partition(":")[2] or None) if category == "copy" else None
    device = _device(row)
    on = [device] if device is not None or not devices else devices
    return [(d, category, name) for d in on]


def _device(row: dict):
    d = row["device_id"]
    return None if d is None or d != d else int(d)


def _groups(units: list[list[tuple]]) -> list[list[int]]:
    """Findings joined through the units they share (union-find over units)."""
    parent: dict = {}

    def root(u):
        while parent.setdefault(u, u) != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for us in units:
        for u in us[1:]:
            parent[root(u)] = root(us[0])
    members: dict = defaultdict(list)
    for i, us in enumerate(units):
        members[root(us[0])].append(i)
    return list(members.values())


def _named_cause(row: dict) -> str | None:
    """The idle cause a finding names: its claim's, or for the launch-gap rule its main cause."""
    from .rules import evidence_of

    claims = row["claims"]
    ev = evidence_of(row["rule_id"], row["evidence"])
    if ev is not None and ev.missing is not None and ev.cause == "unknown":
        return "unknown"  # it abstained: the trace cannot tell (rules/_unknown.py)
    if claims != "idle":
        return claims.split(":", 1)[1] if ":" in claims else None
    if ev is not None and row["rule_id"] == "T001":
        return _T001_CAUSE.get(ev.main_cause)
    return None


def _main_idle_cause(units: list[tuple], budget: dict) -> str | None:
    """The cause of most idle time on the devices of `units` (None without idle time)."""
    devices = {device for device, _, _ in units}
    idle: dict[str, int] = defaultdict(int)
    for (device, part), ns in budget.items():
        if device in devices and part.startswith("idle:"):
            idle[part[len("idle:"):]] += ns
    return max(idle, key=lambda c: (idle[c], c), default=None)


def _names(row: dict, main_idle_cause: str | None) -> bool:
    """Whether an idle finding names the cause the budget gives most of the idle time."""
    return isinstance(row["claims"], str) and _category(row["claims"]) == "idle" and _named_cause(row) == main_idle_cause


def _headline_order(row: dict, main_idle_cause: str | None, naming_loss: float = -1.0) -> tuple:
    """Sorts a group's findings: the headline first. `naming_loss`: the largest estimate of
    the group's findings that name the main idle cause."""
    by_loss = (-_num(row["rule_loss_ns"]), -SEVERITIES.index(row["severity"]), row["rule_id"])
    if not isinstance(row["claims"], str) or _category(row["claims"]) != "idle":
        # a kernel's warning before its info, however large the info's estimate; of the same
        # severity, a finding that gives its own reason to be no more (it names another limiter,
        # or assumes what it measures) after those that do not
        return (0, -SEVERITIES.index(row["severity"]), _own_reason(row), *by_loss)
    # A rule that names its cause heads before the launch-gap rule only while it explains at
    # least half of the time found for that cause: two syncs' 74 us must not stand for 5 ms of
    # launch-bound gaps (TraceLens mi300 Falconsai).
    small = _num(row["rule_loss_ns"]) < HEADLINE_SHARE * naming_loss
    return (not _names(row, main_idle_cause), small, row["claims"] == "idle", not _host_work(row), *by_loss)


def _host_work(row: dict) -> bool:
    """Whether a finding says what the host did in the idle time (T004's `top_activity`): of the
    idle findings that name the host, it heads before those saying what the host waited on before
    it (a copy, a sync): the wait emptied the queue, the work kept it empty (nsightful's power
    iteration: 654 ms after waited-on copies, 653 ms of it host work in ranges "IO N")."""
    from .rules import evidence_of

    ev = evidence_of(row["rule_id"], row["evidence"])
    return bool(getattr(ev, "top_activity", None))


def _own_reason(row: dict) -> bool:
    from .rules import evidence_of

    ev = evidence_of(row["rule_id"], row["evidence"])
    return bool(ev is not None and ev.severity_reason)


def _num(v) -> float:
    return -1.0 if v is None or v != v else float(v)


def _steady_share(units: list[tuple], budget: dict, whole: dict) -> float:
    """Of a busy part (compute, communication, copy) a finding claims, the share outside warm-up
    (the least of its devices'): its loss is taken to lie in the part as the part's time does.
    1 for idle time, which the timeline rules measure outside warm-up themselves (and the
    bound by the steady idle time catches the rest)."""
    shares = [budget.get((d, c), 0) / whole[(d, c)] for d, c, _ in units
              if c not in ("idle", "finding") and whole.get((d, c))]
    return min(shares, default=1.0)


# A budget part in words, after "est. loss at most the 42 ms of device 0's ..." (fmt.loss_bound).
_PART_WORDS = {"idle": "idle time", "copy": "copy time", "compute": "compute time",
               "communication": "communication time"}


def _bounded(row: dict, units: list[tuple], budget: dict, kernel_ns: dict, span_ns: int | None,
             share: float = 1.0) -> tuple[float | None, str]:
    """A headline's loss: the rule's (times `share`, its part outside warm-up), at most the time
    of the part it claims on each device (the run's span for a finding that claims no part);
    and, where that part lowered it, what bounds it in words (fmt.loss_bound), else ""."""
    own = row["rule_loss_ns"]
    if own is None or own != own:
        return None, ""
    own *= share
    caps: list[tuple[int, str]] = []  # (ns, what it is)
    if not isinstance(row["claims"], str):
        caps.append((span_ns, "of the run's span"))
    for device, category, name in units if isinstance(row["claims"], str) else ():
        part = budget.get((device, category))
        if part is not None:
            caps.append((part, f"of device {device}'s {_PART_WORDS.get(category, category)}"))
        if name is not None and (device, name) in kernel_ns:
            caps.append((kernel_ns[(device, name)], f"the kernel ran on device {device}"))
    caps = [c for c in caps if c[0] is not None]
    cap = min(caps, default=None)
    if cap is None or cap[0] >= own:
        return float(own), ""
    return float(cap[0]), loss_bound(*cap)


def _share_parts(rows: list[dict], units: list[list[tuple]], loss: dict, budget: dict, bounds: dict) -> None:
    """Kernel headlines (copy headlines: one per direction, and one of copies of any direction)
    of one device and category sum to at most its part: scaled down in proportion when they
    sum to more (`bounds` says so)."""
    heads = defaultdict(list)
    for i in loss:
        if loss[i] is not None and isinstance(rows[i]["claims"], str):
            for device, category, name in units[i]:
                if name is not None or category == "copy":
                    heads[(device, category)].append(i)
    for key, members in heads.items():
        part = budget.get(key)
        total = sum(loss[i] for i in members)
        if part is not None and total > part:
            for i in members:
                loss[i] *= part / total
                among = "its copy findings by direction" if key[1] == "copy" else "its kernels' findings"
                bounds[i] = loss_bound(part, f"of device {key[0]}'s {_PART_WORDS.get(key[1], key[1])}, "
                                             f"shared in proportion among {among}")


def _floor_note(share: float, floors: dict) -> str:
    """Why a warning or error of its rule is info: the floor its loss is under."""
    if share < floors["min_loss_span_share"]:
        return (f" (info: its estimated loss, {pct(share)} of the device's span, is under the severity floor of "
                f"{pct(floors['min_loss_span_share'])} of the span)")
    return f" (info: its estimated loss is under the severity floor of {ns(floors['min_loss_ns'])})"


def _spans(budget: dict) -> dict:
    """Each device's span: the sum of its budget's parts."""
    spans: dict = defaultdict(int)
    for (device, part), part_ns in budget.items():
        if not part.startswith("idle:"):
            spans[device] += part_ns
    return spans


def _share(row: dict, units: list[tuple], loss: float | None, spans: dict, span_ns: int | None) -> float | None:
    """A headline's loss as a share of its device's span (see the module's docstring); None
    without a loss or a span."""
    if loss is None:
        return None
    on = [spans[d] for d, _, _ in units if d in spans] if isinstance(row["claims"], str) else []
    span = min(on) if on else span_ns
    if on and not span:  # a device all warm-up: nothing of it is steady loss
        return 0.0 if not loss else 1.0
    return loss / span if span else None


def _band(loss: float, share: float, floors: dict) -> str:
    if loss < floors["min_loss_ns"] or share < floors["min_loss_span_share"]:
        return "info"
    return "error" if share >= floors["error_span_share"] else "warning"


def _cap(row: dict) -> tuple[str | None, str]:
    """The most severe a finding may be, and why: its rule's `max_severity`, or the severity it
    gave with a `severity_reason` in its evidence (the lower of the two)."""
    from .rules import get_rule

    try:
        rule = get_rule(row["rule_id"])
        cap, reason = rule.max_severity, rule.severity_reason
    except KeyError:  # a finding of a rule this version does not have
        cap, reason = None, ""
    from .rules import evidence_of

    ev = evidence_of(row["rule_id"], row["evidence"])
    if ev is not None and ev.severity_reason:
        own = ev.severity_reason
        if own and (cap is None or SEVERITIES.index(row["severity"]) < SEVERITIES.index(cap)):
            cap, reason = row["severity"], own
    return cap, reason


def _lower(severity: str, cap: str | None) -> str:
    return severity if cap is None or SEVERITIES.index(severity) <= SEVERITIES.index(cap) else cap
