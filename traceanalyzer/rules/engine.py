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
from ..store import Store, run_cache
from ..store.writer import utcnow
from . import all_rules
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
    return _normalize(df, rule, run_id, store)


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


# Above this many GPU operations in a run, its rules run one at a time: they are DuckDB's
# work then, which already uses every core inside each query, and two big queries at once
# only add memory (5 M kernels: 3 % faster, 0.9 GB more at the peak).
PARALLEL_MAX_GPU_OPS = 1_000_000
# Below this many, too: each rule thread's cursor needs the views installed (~0.12 s of CPU,
# DuckDB parsing them), more than a second thread saves on a small run. A check's rules pass
# (CPU, one thread against two, 2 cores at load 6): 0.76 against 1.08 s on 11 operations,
# 0.93 against 1.39 s on 1,707, 1.30 against 1.65 s on 9,096 (`python bench/bench_rule_threads.py FILE...`).
PARALLEL_MIN_GPU_OPS = 20_000
# DuckDB's memory limit in the rules pass of a run above PARALLEL_MAX_GPU_OPS (its kept cache's
# build too), where TRACEANALYZER_MEMORY_LIMIT sets none (`Store.memory_held`). Rule after rule
# adds the blocks it reads to DuckDB's buffer pool, and the pass peaked at the sum (5 M kernels,
# a stored run's check: 1.89 GB, T004 alone ~1.1 GB of working memory); held to this, blocks
# are let go and the rest spills: 1.26 GB, for ~1 s of a ~10 s check.
BIG_RUN_MEMORY = "1GB"


# The pass that has just built a big run's kept cache (run_cache.KEEP_MIN_GPU_OPS) starts with all of
# it in DuckDB's buffer pool, and each rule adds what it reads: the pass's peak was the sum of
# those rather than one rule's working memory (5 M kernels: 1.6-1.75 GB). There the pool is cut
# to 256 MB before each rule (1.4 GB; the blocks are read again from the file: 0.5-1.2 s of a
# 14-15 s pass). Later passes read only what their rules need, and keep it.
DROP_BLOCKS_WHEN_BUILT = True


class _Cursors:
    """Cursors for a run's rule threads, their views installed on a thread of their own
    while this one builds the run's cache (~0.12 s of CPU a cursor, DuckDB parsing the views;
    a run under PARALLEL_MIN_GPU_OPS has its rules on one thread instead)."""

    def __init__(self, store: Store, n: int):
        self.stores = [store.cursor(set_up=False) for _ in range(n)]
        self._thread = threading.Thread(target=self._set_up, name="rules-cursors")
        self._error: BaseException | None = None
        self._thread.start()

    def _set_up(self) -> None:
        try:
            for st in self.stores:
                st.set_up()
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
def run_scope(store: Store, run_id: str) -> Iterator[run_cache.RunCache]:
    """One run's rules evaluated one by one (`evaluate_rule`) as a pass evaluates them: the views
    scoped to the run's cache, and the results the rules share (launch groups, linked ncu runs)
    computed once in the block (`RunCache.memo`)."""
    with run_cache.scoped_to_run(store.con, run_id) as cache, _in_pass([store], cache):
        yield cache


def _map_rules(store: Store, cache: run_cache.RunCache, rules: list[Rule], check, cursors: _Cursors | None) -> list:
    """`check(store, rule)` for every rule, in order; on the `cursors`, a thread each, when
    there are some and the run's cached views are readable from them (else on this one)."""
    if cursors is None or not cache.shared:
        results = []
        with _in_pass([store], cache):
            for r in rules:
                if cache.built and DROP_BLOCKS_WHEN_BUILT:
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
        for st in clones:
            run_cache.use_run_cache(st.con, cache)
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


# What a run's findings become before they are stored: (store, run_id, every finding of the
# run, this pass's and the stored ones of other rules) -> the findings to store. The
# diagnosis (traceanalyzer.diagnosis) is one; it lives a floor above, so it is passed in.
Diagnose = Callable[[Store, str, "pd.DataFrame"], "pd.DataFrame"]


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


def run_rules(store: Store, run_ids: Iterable[str] | None = None,
              settings: Settings | None = None, *, diagnose: Diagnose | None = None) -> list[RuleOutcome]:
    """Evaluate the selected rules on each run and replace their stored findings.

    A per-run rule whose stored outcome on a run was computed from the same inputs (the code,
    the run's data and the thresholds, `inputs_digest`) keeps it, findings and all, instead of
    being computed again (`Settings.reuse`).

    Per-run rules see one run at a time; cross-run rules (scope "runs", e.g. the straggler
    rank of a multi-rank job) see every run given here that carries their data and that their
    `groups` put beside another (the others: no data). `diagnose`:
    given every finding of a run (the stored ones of rules not run here too), what to store.
    """
    _import_pandas_meanwhile()
    settings = settings or Settings()
    rules = settings.rules()
    params = {r.id: settings.params_for(r) for r in rules}
    run_ids = list(run_ids) if run_ids is not None else store.run_ids()
    outcomes: dict[tuple[str, str], RuleOutcome] = {}
    frames: dict[str, list[pd.DataFrame]] = {rid: [] for rid in run_ids}

    applicable: dict[str, list[str]] = {r.id: [] for r in rules}
    threads = rule_threads(store)
    inputs = {rid: inputs_digest(store, rid, settings.thresholds) for rid in run_ids}
    evaluated: dict[str, list[Rule]] = {}  # per run, the rules computed in this pass
    for run_id in run_ids:
        reused = _stored_outcomes(store, run_id, rules, inputs[run_id]) if settings.reuse else {}
        outcomes.update({(run_id, rule_id): oc for rule_id, oc in reused.items()})
        todo = evaluated[run_id] = [r for r in rules if r.id not in reused]
        per_run = any(r.scope == "run" for r in todo)
        def check(st: Store, rule: Rule, run_id=run_id):
            oc = RuleOutcome(rule.id, run_id, "ran")
            df = None
            try:
                if not applies(st, rule, run_id):
                    oc.status, oc.note = "no-data", f"needs {rule.requires}"
                elif rule.scope == "run":
                    df = evaluate_rule(st, rule, run_id, params[rule.id])
                    oc.findings = len(df)
            except Exception as e:  # one broken rule must not hide the others' findings
                interrupt.stop_if_interrupted(e)
                oc.status, oc.note, df = "error", _error_note(e), None
            return oc, df

        if per_run:  # run by run, so the views the rules share are computed once per run (run_cache.scoped_to_run)
            ops = run_cache.gpu_ops(store.con, run_id)
            big = ops > PARALLEL_MAX_GPU_OPS  # its rules one at a time
            parallel = threads > 1 and len(todo) > 1 and PARALLEL_MIN_GPU_OPS <= ops <= PARALLEL_MAX_GPU_OPS
            cursors = _Cursors(store, threads) if parallel else None
            try:
                with store.memory_held(BIG_RUN_MEMORY if big else None), \
                        run_cache.scoped_to_run(store.con, run_id, shared=threads > 1, keep=store.keeps_caches) as cache:
                    results = _map_rules(store, cache, todo, check, cursors)
            finally:
                if cursors is not None:
                    cursors.close()  # unused (a run read on this thread), or an error
        else:  # cross-run rules only (scan's last pass): each run is just asked if it has their data
            results = [check(store, rule) for rule in todo]
        for rule, (oc, df) in zip(todo, results):
            outcomes[(run_id, rule.id)] = oc
            if oc.status == "ran" and rule.scope == "runs":
                applicable[rule.id].append(run_id)
            elif df is not None and not df.empty:
                frames[run_id].append(df)

    for rule in rules:  # cross-run rules, on every run that carries their data and has runs to compare with
        if rule.scope != "runs" or not applicable[rule.id]:
            continue
        try:
            if rule.groups is not None:
                grouped = {r for group in rule.groups(store, applicable[rule.id]) for r in group}
                for run_id in applicable[rule.id]:
                    if run_id not in grouped:
                        outcomes[(run_id, rule.id)].status = "no-data"
                        outcomes[(run_id, rule.id)].note = f"needs {rule.requires}"
                applicable[rule.id] = [r for r in applicable[rule.id] if r in grouped]
                if not applicable[rule.id]:
                    continue
            df = evaluate_across(store, rule, applicable[rule.id], params[rule.id])
            for run_id, part in df.groupby("run_id"):
                frames[run_id].append(part)
                outcomes[(run_id, rule.id)].findings = len(part)
        except Exception as e:
            interrupt.stop_if_interrupted(e)
            for run_id in applicable[rule.id]:
                outcomes[(run_id, rule.id)].status = "error"
                outcomes[(run_id, rule.id)].note = _error_note(e)

    import pandas as pd

    for run_id in run_ids:
        statuses = pa.Table.from_pylist(
            [{"rule_id": r.id, "status": outcomes[(run_id, r.id)].status,
              "findings": outcomes[(run_id, r.id)].findings, "note": outcomes[(run_id, r.id)].note,
              "params": json.dumps(params[r.id], sort_keys=True), "evaluated_at": utcnow(), "inputs": inputs[run_id]}
             for r in evaluated[run_id]],
            schema=arrow_schema("rule_runs").remove(0))
        rule_ids = [r.id for r in evaluated[run_id]]
        found = [f for f in frames[run_id] if not f.empty]
        # A pass whose rules found nothing where they had found nothing before (the cross-run
        # pass on most runs) leaves the run's diagnosis as it is: only their outcomes are written.
        if diagnose is not None and (found or store.sql(
                "SELECT count(*) FROM findings WHERE run_id = ? AND list_contains(?, rule_id)",
                [run_id, rule_ids]).fetchone()[0]):
            # The other rules' stored findings are diagnosed again with these, and rewritten
            # with their outcomes as they were.
            kept = store.read_findings(run_id, [r.id for r in all_rules() if r.id not in rule_ids])
            others = sorted(set(kept.rule_runs.column("rule_id").to_pylist()))
            statuses = pa.concat_tables([statuses, kept.rule_runs.select(statuses.column_names)])
            rule_ids += others
            parts = [f for f in (kept.findings.to_pandas(), *found) if not f.empty]
            found = [diagnose(store, run_id, pd.concat(parts, ignore_index=True).assign(run_id=run_id))] if parts else []
        columns = arrow_schema("findings")
        findings = (pa.Table.from_pandas(pd.concat(found, ignore_index=True).reindex(columns=columns.names),
                                         schema=columns, preserve_index=False)
                    if found else columns.empty_table())
        store.write_findings(run_id, rule_ids, findings, statuses)
    return [outcomes[(rid, r.id)] for rid in run_ids for r in rules]
