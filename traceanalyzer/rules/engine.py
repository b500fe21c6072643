"""Run rules over stored runs and keep their findings in the store."""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import pyarrow as pa

from .. import interrupt, schema
from ..schema import arrow_schema
from ..store import Store, run_cache, utcnow, views
from ..store.run_policy import DEFAULT_POLICY, RunPolicy
from . import all_rules
from ._runtime_terms import in_run_terms
from .base import CLAIMS, FINDING_COLUMNS, SEVERITIES, Rule, RuleOutcome

if TYPE_CHECKING:  # imported where first used: commands that run no rule do not pay for it
    import pandas as pd

_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_INTEGER_COLUMNS = [c.name for c in schema.FINDINGS.columns if c.name in FINDING_COLUMNS and c.type in ("BIGINT", "INTEGER")]


@dataclass
class Settings:
    """Which rules run and with which thresholds (from the CLI and config files)."""

    select: list[str] = field(default_factory=list)  # rule ids or names; empty = all
    ignore: list[str] = field(default_factory=list)
    thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)  # rule id -> {name: value}
    # take a rule's stored outcome where it was computed from the same code, data and thresholds
    reuse: bool = True
    # how each run's pass is laid out by its size (threads, cache kept, memory): not what it finds
    policy: RunPolicy = DEFAULT_POLICY

    def rules(self) -> list[Rule]:
        from . import get_rule

        def ids(refs):
            out = set()
            for ref in refs:
                try:
                    out.add(get_rule(ref).id)
                except KeyError:
                    raise ValueError(f"unknown rule {ref!r} (see `traceanalyzer rules`)") from None
            return out

        chosen = ids(self.select) if self.select else {r.id for r in all_rules()}
        chosen -= ids(self.ignore)
        return [r for r in all_rules() if r.id in chosen]

    def params_for(self, rule: Rule) -> dict[str, Any]:
        return rule.params(self.thresholds.get(rule.id), self.thresholds)


def bind(sql: str, values: dict[str, Any]) -> dict[str, Any]:
    """Only the named parameters the query uses (DuckDB rejects extra ones)."""
    used = set(_PARAM.findall(sql))
    missing = used - set(values)
    if missing:
        raise ValueError(f"query uses undefined parameters {sorted(missing)}")
    return {k: values[k] for k in used}


def query(store: Store, sql: str, values: dict[str, Any]) -> pd.DataFrame:
    return store.sql(sql, bind(sql, values)).df()


def evaluate_rule(store: Store, rule: Rule, run_id: str, params: dict[str, Any]) -> pd.DataFrame:
    """The findings of one rule on one run, as a DataFrame with FINDING_COLUMNS."""
    values = {"run_id": run_id, **params}
    frames = []
    if rule.sql is not None:
        frames.append(query(store, rule.sql, values))
    if rule.evaluate is not None:
        frames.append(rule.evaluate(store, run_id, params))
    import pandas as pd
    frames = [f for f in frames if f is not None and not f.empty]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if rule.unknown is not None and not df.empty:
        df = rule.unknown(store, run_id, df)
    return _normalize(in_run_terms(store, run_id, df), rule, run_id, store)


def _normalize(df: pd.DataFrame, rule: Rule, run_id: str, store: Store) -> pd.DataFrame:
    extra = set(df.columns) - set(FINDING_COLUMNS)
    if extra:
        raise ValueError(f"{rule.id} returned unknown columns {sorted(extra)}")
    df = df.reindex(columns=list(FINDING_COLUMNS))
    if df.empty:
        return df
    import pandas as pd

    # Whole numbers as nullable integers whatever a rule gave (None, NaN, float): a float column
    # meeting another rule's integer one would round every nanosecond timestamp to 2^-53.
    for name in _INTEGER_COLUMNS:
        if str(df[name].dtype) != "Int64":
            df[name] = pd.array([None if _missing(v) else int(v) for v in df[name]], dtype="Int64")
    df["run_id"] = run_id
    df["rule_id"] = rule.id
    df["severity"] = df["severity"].astype(object).where(df["severity"].notna(), rule.severity)
    bad = set(df["severity"]) - set(SEVERITIES)
    if bad:
        raise ValueError(f"{rule.id} returned unknown severities {sorted(bad)}")
    df["evidence"] = df["evidence"].map(_as_json)
    df["claims"] = df["claims"].astype(object).where(df["claims"].notna(), rule.claims)
    bad = set(df["claims"].dropna()) - set(CLAIMS)
    if bad:
        raise ValueError(f"{rule.id} returned unknown claims {sorted(bad)}")
    rank = store.sql("SELECT rank FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
    df["fingerprint"] = [fingerprint(rule.id, rank, r.device_id, r.stream_id, r.item_kind, r.item_name)
                         for r in df.itertuples()]
    return df


def _as_json(v) -> str | None:
    if v is None or (isinstance(v, float) and v != v):
        return None
    return v if isinstance(v, str) else json.dumps(v, default=_json_default, sort_keys=True)


def _json_default(o):
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def fingerprint(rule_id: str, rank, device_id, stream_id, item_kind, item_name) -> str:
    """A finding's identity for baselines: the rule and what the finding is about (the run's
    rank, device, stream, kernel full name, operator, range or copy kind), never the file
    name, run id or anything measured, so the same finding in a renamed or re-recorded trace
    matches in any store. Several findings of a run can share one (a kernel launched with
    several grid sizes); a baseline sums them."""
    parts = (rule_id, _as_int(rank), _as_int(device_id), _as_int(stream_id), item_kind, item_name)
    clean = ["" if _missing(p) else str(p) for p in parts]
    return hashlib.sha1("\x1f".join(clean).encode()).hexdigest()[:16]


def _missing(v) -> bool:
    try:
        return v is None or bool(v != v)  # None, NaN
    except TypeError:  # pandas.NA
        return True


def _as_int(v):
    """Ids as integers whatever column type carried them (pandas makes 3.0 of a nullable 3)."""
    return int(v) if isinstance(v, float) and v == v and v.is_integer() else v


def applies(store: Store, rule: Rule, run_id: str) -> bool:
    """Whether the run carries the data the rule needs (its `applies_sql`), whatever file it came from."""
    row = store.sql(rule.applies_sql, bind(rule.applies_sql, {"run_id": run_id})).fetchone()
    return bool(row and row[0])


def evaluate_across(store: Store, rule: Rule, run_ids: list[str], params: dict[str, Any]) -> pd.DataFrame:
    """A cross-run rule (scope "runs") on a set of runs: findings carry their own run_id."""
    import pandas as pd

    df = rule.evaluate(store, run_ids, params)
    if df is None or df.empty:
        return pd.DataFrame(columns=list(FINDING_COLUMNS))
    return pd.concat([_normalize(part.drop(columns=["run_id"]), rule, rid, store)
                      for rid, part in df.groupby("run_id", sort=True)], ignore_index=True)


def rule_threads(store: Store) -> int:
    """Threads a run's rules are spread over: the store's resources decide (`Resources.rule_threads`)."""
    return store.resources.rule_threads


class _Cursors:
    """Cursors for a run's rule threads, their views installed on a thread of their own
    while this one builds the run's cache (~0.12 s of CPU a cursor, DuckDB parsing the views;
    a run under `RunPolicy.parallel_min_gpu_ops` has its rules on one thread instead). The
    run's scope (`this_run.<view>`) is the database's: every cursor reads it as it is."""

    def __init__(self, store: Store, n: int):
        self.stores = [store.cursor(set_up=False) for _ in range(n)]
        self._thread = threading.Thread(target=self._set_up, name="rules-cursors")
        self._error: BaseException | None = None
        self._thread.start()

    def _set_up(self) -> None:
        try:
            for st in self.stores:
                st.set_up()
                views.install_on_demand(st.con)
        except BaseException as e:  # raised where the cursors are used
            self._error = e

    def ready(self) -> list[Store]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.stores

    def close(self) -> None:
        """Close the cursors (once; later calls do nothing)."""
        self._thread.join()
        stores, self.stores = self.stores, []
        for st in stores:
            st.close()


@contextmanager
def _in_pass(stores: list[Store], cache: run_cache.RunCache) -> Iterator[None]:
    """The `stores` in the run's pass for the block: rules reach its cache by `Store.run_cache`."""
    for st in stores:
        st.run_cache = cache
    try:
        yield
    finally:
        for st in stores:
            st.run_cache = None


@contextmanager
def run_scope(store: Store, run_id: str, policy: RunPolicy = DEFAULT_POLICY) -> Iterator[run_cache.RunCache]:
    """One run's rules evaluated one by one (`evaluate_rule`) as a pass evaluates them: the run's
    scope open (`this_run.<view>`), and the results the rules share (launch groups, linked ncu runs)
    computed once in the block (`RunCache.memo`)."""
    with run_cache.scoped_to_run(store.con, run_id, policy=policy) as cache, _in_pass([store], cache):
        yield cache


def _map_rules(store: Store, cache: run_cache.RunCache, rules: list[Rule], check, cursors: _Cursors | None,
               drop_blocks: bool) -> list:
    """`check(store, rule)` for every rule, in order; on the `cursors`, a thread each, when
    there are some and the run's scope reads a cache (else on this one, DuckDB's cached blocks
    dropped before each rule with `drop_blocks` where the cache was just built)."""
    if cursors is None or not cache.cached:
        results = []
        with _in_pass([store], cache):
            for r in rules:
                if cache.built and drop_blocks:
                    store.drop_cached_blocks()
                results.append(check(store, r))
        return results
    results: list = [None] * len(rules)
    todo = iter(range(len(rules)))  # next() on a shared iterator: each rule taken once
    lock = threading.Lock()
    stop = threading.Event()

    def worker(st: Store) -> None:
        while not stop.is_set():
            with lock:
                i = next(todo, None)
            if i is None:
                return
            results[i] = check(st, rules[i])

    try:
        clones = cursors.ready()
        with _in_pass(clones, cache), ThreadPoolExecutor(len(clones), thread_name_prefix="rules") as pool:
            try:
                for f in [pool.submit(worker, st) for st in clones]:
                    f.result()
            except BaseException:  # Ctrl-C, or a rule thread's error: the others stop now
                stop.set()
                for st in clones:
                    st.con.interrupt()
                raise
    finally:
        cursors.close()  # before the cache they read is dropped
    return results


@functools.cache
def code_digest() -> str:
    """A digest of the package's Python sources: any change of code gives another."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def inputs_digest(store: Store, run_id: str, thresholds: dict) -> str:
    """`rule_runs.inputs` of a pass over run `run_id` now: the code's digest, when the run was
    stored, its links to Nsight Compute runs (the one thing a per-run rule reads of other runs)
    and every threshold given (the diagnosis's too, which decides what is stored)."""
    stored, links = store.sql(
        "SELECT (SELECT CAST(ingested_at AS VARCHAR) FROM runs WHERE run_id = $r), "
        "(SELECT CAST(count(*) AS VARCHAR) || ':' || CAST(coalesce(sum(hash(ncu_run_id, side, kernel_id)), 0) AS VARCHAR) "
        " FROM kernel_links WHERE run_id = $r OR ncu_run_id = $r)", {"r": run_id}).fetchone()
    given = json.dumps(thresholds, sort_keys=True, default=str)
    return hashlib.sha1(f"{code_digest()}|{stored}|{links}|{given}".encode()).hexdigest()[:16]


def _stored_outcomes(store: Store, run_id: str, rules: list[Rule], inputs: str) -> dict[str, RuleOutcome]:
    """The per-run rules of `rules` whose stored outcome on the run was computed from `inputs`
    (which holds the thresholds) and ran or found no data: rule id -> that outcome."""
    per_run = {r.id for r in rules if r.scope == "run"}
    rows = store.sql("SELECT rule_id, status, findings, note FROM rule_runs "
                     "WHERE run_id = $r AND inputs = $i AND status IN ('ran', 'no-data')",
                     {"r": run_id, "i": inputs}).fetchall()
    return {rule_id: RuleOutcome(rule_id, run_id, status, findings or 0, note or "")
            for rule_id, status, findings, note in rows if rule_id in per_run}


def _error_note(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _import_pandas_meanwhile() -> None:
    """Start importing pandas on a thread of its own, unless it is imported already.

    The rules need it first for the first rule's result, which comes after the run's cache is
    built (DuckDB's work, which lets go of the GIL); importing it (~0.5 s) meanwhile takes
    ~0.4 s off every `check`: of the stored 8x owlv2 bench run, 3.26 s against 3.71 s
    (`bench/bench_peers.py --compare`, docs/performance.md). Python's import lock makes the
    rule threads that need pandas wait for this import rather than start another; a failure
    here is ignored, as the same import fails where pandas is used, with its real error."""
    if "pandas" not in sys.modules:
        threading.Thread(target=_import_quietly, args=("pandas",), name="pandas-import").start()


def _import_quietly(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception:  # reported where the module is used
        pass


@dataclass
class RunFound:
    """What a command's rule passes found on one run and did not store yet: per rule (in the
    order the passes gave them), its `rule_runs` row (without run_id) and its findings."""

    rules: dict[str, tuple[dict, pd.DataFrame | None]] = field(default_factory=dict)

    def add(self, rule_id: str, row: dict, df: pd.DataFrame | None) -> None:
        self.rules.pop(rule_id, None)  # a later pass's result replaces an earlier one's, and comes after
        self.rules[rule_id] = (row, df)

    def findings(self) -> list[pd.DataFrame]:
        return [df for _, df in self.rules.values() if df is not None and not df.empty]

    def statuses(self) -> pa.Table:
        return pa.Table.from_pylist([row for row, _ in self.rules.values()], schema=arrow_schema("rule_runs").remove(0))


@dataclass
class Found:
    """What a command's rule passes found, per run, kept until it is stored once: as the rules
    gave it (`write_found`) or diagnosed (`diagnosis.store_diagnosed`)."""

    runs: dict[str, RunFound] = field(default_factory=dict)

    def run(self, run_id: str) -> RunFound:
        return self.runs.setdefault(run_id, RunFound())


def findings_table(frames: list[pd.DataFrame]) -> pa.Table:
    """`frames` (FINDING_COLUMNS and the diagnosis's) as a table of the `findings` schema."""
    import pandas as pd

    columns = arrow_schema("findings")
    if not frames:
        return columns.empty_table()
    return pa.Table.from_pandas(pd.concat(frames, ignore_index=True).reindex(columns=columns.names),
                                schema=columns, preserve_index=False)


def write_found(store: Store, found: Found) -> None:
    """Store each run's outcomes and findings as the rules gave them (no diagnosis), replacing
    those rules' stored ones: what rule-level tests read."""
    for run_id, run in found.runs.items():
        write_run_found(store, run_id, run)


def write_run_found(store: Store, run_id: str, run: RunFound) -> None:
    """One run's outcomes and findings as its rules gave them, replacing those rules' stored ones."""
    store.write_findings(run_id, list(run.rules), findings_table(run.findings()), run.statuses())


@dataclass
class _Pass:
    """One rules pass over some runs: the rules, their thresholds, each run's inputs digest,
    the outcomes so far and, per cross-run rule, the runs that carry its data."""

    rules: list[Rule]
    policy: RunPolicy
    params: dict[str, dict[str, Any]]
    run_ids: list[str]
    inputs: dict[str, str]
    outcomes: dict[tuple[str, str], RuleOutcome] = field(default_factory=dict)
    frames: dict[tuple[str, str], pd.DataFrame] = field(default_factory=dict)  # (run, rule) -> its findings
    evaluated: dict[str, list[Rule]] = field(default_factory=dict)  # per run, the rules computed here
    across: dict[str, list[str]] = field(default_factory=dict)


def _plan(store: Store, run_ids: Iterable[str] | None, settings: Settings) -> _Pass:
    rules = settings.rules()
    run_ids = list(run_ids) if run_ids is not None else store.run_ids()
    return _Pass(rules, settings.policy, {r.id: settings.params_for(r) for r in rules}, run_ids,
                 {rid: inputs_digest(store, rid, settings.thresholds) for rid in run_ids},
                 across={r.id: [] for r in rules if r.scope == "runs"})


def _reused(store: Store, p: _Pass, run_id: str, found: RunFound | None) -> dict[str, RuleOutcome]:
    """The per-run rules whose outcome on the run was computed from the same inputs: this
    command's earlier pass's where it ran the rule, else the stored one (`_stored_outcomes`)."""
    mine = found.rules if found is not None else {}
    stored = _stored_outcomes(store, run_id, [r for r in p.rules if r.id not in mine], p.inputs[run_id])
    for r in p.rules:
        row = mine.get(r.id, ({},))[0]
        if r.scope == "run" and row.get("inputs") == p.inputs[run_id] and row.get("status") in ("ran", "no-data"):
            stored[r.id] = RuleOutcome(r.id, run_id, row["status"], row["findings"] or 0, row["note"] or "")
    return stored


def _checker(p: _Pass, run_id: str) -> Callable:
    """`check(store, rule)`: whether the run has the rule's data and, for a per-run rule, its
    findings: (outcome, findings or None); a rule's error is its outcome, not the pass's."""
    def check(st: Store, rule: Rule):
        oc = RuleOutcome(rule.id, run_id, "ran")
        df = None
        try:
            if not applies(st, rule, run_id):
                oc.status, oc.note = "no-data", f"needs {rule.requires}"
            elif rule.scope == "run":
                df = evaluate_rule(st, rule, run_id, p.params[rule.id])
                oc.findings = len(df)
        except Exception as e:  # one broken rule must not hide the others' findings
            interrupt.stop_if_interrupted(e)
            oc.status, oc.note, df = "error", _error_note(e), None
        return oc, df
    return check


def _rules_in_scope(store: Store, run_id: str, todo: list[Rule], check: Callable, policy: RunPolicy) -> list:
    """`check` for each rule of `todo` on one run, in its scope: the views the rules share
    computed once for the run (`run_cache.scoped_to_run`), the rules on threads or one at a
    time and DuckDB's memory held as `policy` says for the run's size."""
    threads = rule_threads(store)
    plan = policy.plan(run_cache.gpu_ops(store.con, run_id))
    cursors = _Cursors(store, threads) if threads > 1 and len(todo) > 1 and plan.parallel else None
    try:
        with store.memory_held(plan.memory), \
                run_cache.scoped_to_run(store.con, run_id, keep=store.keeps_caches, policy=policy) as cache:
            return _map_rules(store, cache, todo, check, cursors, policy.drop_blocks_when_built)
    finally:
        if cursors is not None:
            cursors.close()  # unused (a run read on this thread), or an error


def _run_pass(store: Store, p: _Pass, run_id: str, reused: dict[str, RuleOutcome]) -> None:
    """The pass over one run: the rules not `reused`, per-run rules evaluated and cross-run
    rules asked whether the run has their data."""
    p.outcomes.update({(run_id, rule_id): oc for rule_id, oc in reused.items()})
    todo = p.evaluated[run_id] = [r for r in p.rules if r.id not in reused]
    check = _checker(p, run_id)
    if any(r.scope == "run" for r in todo):
        results = _rules_in_scope(store, run_id, todo, check, p.policy)
    else:  # cross-run rules only (scan's last pass): each run is just asked if it has their data
        results = [check(store, rule) for rule in todo]
    for rule, (oc, df) in zip(todo, results):
        p.outcomes[(run_id, rule.id)] = oc
        if oc.status == "ran" and rule.scope == "runs":
            p.across[rule.id].append(run_id)
        elif df is not None and not df.empty:
            p.frames[(run_id, rule.id)] = df


def _cross_run(store: Store, p: _Pass, rule: Rule) -> None:
    """A cross-run rule on the runs that carry its data and that its `groups` put beside
    another (the others: no data); an error is the outcome of each of those runs."""
    runs = p.across[rule.id]
    try:
        if rule.groups is not None:
            grouped = {r for group in rule.groups(store, runs) for r in group}
            for run_id in runs:
                if run_id not in grouped:
                    p.outcomes[(run_id, rule.id)].status = "no-data"
                    p.outcomes[(run_id, rule.id)].note = f"needs {rule.requires}"
            runs = p.across[rule.id] = [r for r in runs if r in grouped]
            if not runs:
                return
        df = evaluate_across(store, rule, runs, p.params[rule.id])
        for run_id, part in df.groupby("run_id"):
            p.frames[(run_id, rule.id)] = part
            p.outcomes[(run_id, rule.id)].findings = len(part)
    except Exception as e:
        interrupt.stop_if_interrupted(e)
        for run_id in runs:
            p.outcomes[(run_id, rule.id)].status = "error"
            p.outcomes[(run_id, rule.id)].note = _error_note(e)


def _record(p: _Pass, found: Found) -> None:
    """The pass's outcomes and findings of the rules it computed, into `found`: per run, the
    per-run rules' first, then the cross-run rules'."""
    for run_id in p.run_ids:
        run = found.run(run_id)
        for rule in sorted(p.evaluated[run_id], key=lambda r: r.scope == "runs"):
            oc = p.outcomes[(run_id, rule.id)]
            row = {"rule_id": rule.id, "status": oc.status, "findings": oc.findings, "note": oc.note,
                   "params": json.dumps(p.params[rule.id], sort_keys=True), "evaluated_at": utcnow(),
                   "inputs": p.inputs[run_id]}
            run.add(rule.id, row, p.frames.get((run_id, rule.id)))


def run_rules(store: Store, run_ids: Iterable[str] | None = None,
              settings: Settings | None = None, *, into: Found | None = None) -> list[RuleOutcome]:
    """Evaluate the selected rules on each run: into `into` (what a command's passes found,
    stored once after the last, diagnosed: `diagnosis.store_diagnosed`), or without it stored
    now as the rules gave them (`write_found`), replacing those rules' stored findings.

    A per-run rule whose outcome on a run was computed from the same inputs (the code, the
    run's data and the thresholds, `inputs_digest`), by an earlier pass into `into` or stored,
    keeps it, findings and all, instead of being computed again (`Settings.reuse`).

    Per-run rules see one run at a time; cross-run rules (scope "runs", e.g. the straggler
    rank of a multi-rank job) see every run given here that carries their data and that their
    `groups` put beside another (the others: no data).
    """
    _import_pandas_meanwhile()
    settings = settings or Settings()
    p = _plan(store, run_ids, settings)
    found = Found() if into is None else into
    for run_id in p.run_ids:
        _run_pass(store, p, run_id, _reused(store, p, run_id, found.runs.get(run_id)) if settings.reuse else {})
    for rule in p.rules:
        if rule.scope == "runs" and p.across[rule.id]:
            _cross_run(store, p, rule)
    _record(p, found)
    if into is None:
        write_found(store, found)
    return [p.outcomes[(rid, r.id)] for rid in p.run_ids for r in p.rules]
