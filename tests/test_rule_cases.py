"""The one generic runner for the test cases that sit beside each rule.

`traceanalyzer/rules/<ID>_<name>.cases.toml` holds a rule's cases:

    [[case]]
    name = "planted 12 us gap found, 3 us gap ignored"
    trace = "nsys/planted.sqlite"          # under fixtures/, or "shared:nsys/..." for a real trace
    params = { min_gap_ns = 5000 }          # optional threshold overrides
    count = 1                               # optional: number of findings (after `where`, if given)
    where = { item_kind = "stream" }        # optional filter for `count`
    [[case.expect]]                         # each must match exactly one finding
    where = { stream_id = 7 }
    equals = { severity = "error", "evidence.count" = 2, "evidence.worst.0.gap_ns" = 12000 }
    approx = { value = 0.12 }               # relative tolerance 1e-6 unless `rel` is given
    contains = { message = "late launch" }
    excludes = { hint = "register" }        # substrings that must not appear
    null = ["evidence.achieved"]            # fields that must be null

A cross-run rule (scope "runs") takes `traces = [...]` instead of `trace`; its findings get a
`trace` field (the trace they are about) that `where` can test.

Every finding of a case must decode into its rule's evidence type (`Rule.evidence`), unknown
keys forbidden: a key renamed in a rule's query without its type fails here.

A case runs its rule the way `check` does (`engine.run_rules`: the rule's data checked, the
views scoped to the run's cache) and reads the findings back from the store.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from traceanalyzer.rules import get_rule
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.rules.evidence import decode
from traceanalyzer.store import Store

from .conftest import FIXTURES, ROOT, shared_traces

RULES_DIR = ROOT / "traceanalyzer" / "rules"


# (rule id, case) of every case, in file order
CASES: list[tuple[str, dict]] = [(path.name.split("_", 1)[0], case) for path in sorted(RULES_DIR.glob("*.cases.toml"))
                                 for case in tomllib.loads(path.read_text())["case"]]


def _cases():
    out, numbered = [], {}
    for rule_id, case in CASES:
        i = numbered[rule_id] = numbered.get(rule_id, -1) + 1
        out.append(pytest.param(rule_id, case, id=f"{rule_id}-{i}-{case.get('name', '')[:40]}"))
    return out


def _params_key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def _passes(trace: str) -> list[dict[str, dict]]:
    """Rules passes that cover every per-run case on `trace`, as {rule id: params}: a pass
    takes one set of thresholds per rule, so a rule with cases of several gets several passes."""
    passes: list[dict[str, dict]] = []
    seen = set()
    for rule_id, case in CASES:
        params = case.get("params", {})
        if case.get("trace") != trace or (rule_id, _params_key(params)) in seen:
            continue
        seen.add((rule_id, _params_key(params)))
        room = next((p for p in passes if rule_id not in p), None)
        if room is None:
            passes.append(room := {})
        room[rule_id] = params
    return passes


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """`found(trace, rule_id, case)`: (errors, findings) of the rule on the trace with the case's
    thresholds. The first case on a trace ingests it and runs all its passes (`_passes`)."""
    stores: list[Store] = []
    results: dict[tuple[str, str, str], tuple[list[str], list[dict]]] = {}

    def found(trace: str, rule_id: str, case: dict) -> tuple[list[str], list[dict]]:
        if not any(k[0] == trace for k in results):
            store = Store(tmp_path_factory.mktemp("cases") / "s.duckdb")
            stores.append(store)
            run_ids = [store.ingest(_trace_path(trace)).run_id]
            for thresholds in _passes(trace):
                for rid, rows in _rules_pass(store, run_ids, thresholds).items():
                    results[(trace, rid, _params_key(thresholds[rid]))] = rows
        return results[(trace, rule_id, _params_key(case.get("params", {})))]

    yield found
    for store in stores:
        store.close()


def _field(row: dict, dotted: str):
    head, *rest = dotted.split(".")
    v = row[head]
    if head == "evidence" and isinstance(v, str):
        v = json.loads(v)
    for part in rest:
        v = v[int(part)] if isinstance(v, list) else v[part]
    return v


def _matches(row: dict, where: dict) -> bool:
    return all(_field(row, k) == v for k, v in where.items())


def test_every_rule_has_cases():
    from traceanalyzer.rules import all_rules

    have = {p.name.split("_", 1)[0] for p in RULES_DIR.glob("*.cases.toml")}
    assert {r.id for r in all_rules()} <= have


def test_loading_the_rules_does_not_import_pandas():
    """Rule modules import pandas where they use it: a rules pass imports it on a thread while its
    first queries run (engine.run_rules), and listing the rules stays cheap."""
    code = ("import sys; from traceanalyzer.rules import all_rules; assert len(all_rules()) >= 20; "
            "assert 'pandas' not in sys.modules, 'a rule module imports pandas at the top'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_pair_key_orders_like_the_pair():
    """rules.base.pair_key (one 128-bit integer for a pair of BIGINTs, ascending or with the second
    descending) sorts every pair as the tuple does, the extremes of BIGINT included."""
    import random

    import duckdb

    from traceanalyzer.rules.base import pair_key

    lo, hi = -(1 << 63), (1 << 63) - 1
    edges = [lo, lo + 1, -1, 0, 1, hi - 1, hi]
    rnd = random.Random(5)
    pairs = [(a, b) for a in edges for b in edges]
    pairs += [(rnd.choice(edges + [rnd.randint(lo, hi)]), rnd.randint(lo, hi)) for _ in range(500)]
    con = duckdb.connect()
    con.execute("CREATE TABLE p (a BIGINT, b BIGINT)")
    con.executemany("INSERT INTO p VALUES (?, ?)", pairs)
    for descending in (False, True):
        key = pair_key("a", "b", then_descending=descending)
        got = con.execute(f"SELECT a, b FROM p ORDER BY {key}, a, b").fetchall()
        assert got == sorted(pairs, key=lambda x: (x[0], -x[1] if descending else x[1]))
        assert con.execute(f"SELECT count(DISTINCT {key}) FROM p").fetchone()[0] == len(set(pairs))


def _trace_path(trace: str) -> Path:
    return shared_traces() / trace[len("shared:"):] if trace.startswith("shared:") else FIXTURES / trace


def _rules_pass(store: Store, run_ids: list[str],
                thresholds: dict[str, dict]) -> dict[str, tuple[list[str], list[dict]]]:
    """Rule id -> (errors, findings) of a rules pass over `run_ids` as `check` makes it
    (`run_rules`: each rule's data checked, the views scoped to each run's cache) with these
    rules and thresholds, the findings read back from the store."""
    outcomes = run_rules(store, run_ids, Settings(select=list(thresholds), thresholds=thresholds))
    rows = store.arrow("SELECT * FROM findings WHERE list_contains(?, run_id) ORDER BY ALL", [run_ids]).to_pylist()
    return {rule_id: ([f"{o.run_id}: {o.note}" for o in outcomes if o.rule_id == rule_id and o.status == "error"],
                      [r for r in rows if r["rule_id"] == rule_id])
            for rule_id in thresholds}


def _findings(rule, case, checked, tmp_path) -> list[dict]:
    if rule.scope == "runs":
        with Store(tmp_path / "runs.duckdb") as store:
            by_run = {store.ingest(_trace_path(t)).run_id: t for t in case["traces"]}
            errors, rows = _rules_pass(store, list(by_run), {rule.id: case.get("params", {})})[rule.id]
        for r in rows:
            r["trace"] = by_run[r["run_id"]]
    else:
        errors, rows = checked(case["trace"], rule.id, case)
    assert not errors, errors  # the pass only records a rule's error: here it fails the case
    return rows


@pytest.mark.parametrize("rule_id,case", _cases())
def test_case(rule_id, case, checked, tmp_path):
    rule = get_rule(rule_id)
    rows = _findings(rule, case, checked, tmp_path)
    for r in rows:  # each finding's evidence is what its rule declares, no key more (rules/evidence.py)
        decode(r["evidence"], rule.evidence)
    if "count" in case:
        hit = [r for r in rows if _matches(r, case.get("where", {}))]
        assert len(hit) == case["count"], [r["message"] for r in rows]
    for exp in case.get("expect", []):
        hit = [r for r in rows if _matches(r, exp.get("where", {}))]
        assert len(hit) == 1, f"{len(hit)} findings match {exp.get('where')}: {[r['message'] for r in rows]}"
        row = hit[0]
        for k, v in exp.get("equals", {}).items():
            assert _field(row, k) == v, (k, row["message"])
        for k, v in exp.get("approx", {}).items():
            assert math.isclose(_field(row, k), v, rel_tol=exp.get("rel", 1e-6)), (k, _field(row, k), v)
        for k, v in exp.get("contains", {}).items():
            assert v in _field(row, k), (k, _field(row, k))
        for k, v in exp.get("excludes", {}).items():
            assert v not in _field(row, k), (k, _field(row, k))
        for k in exp.get("null", []):  # an optional evidence field left out is null too
            try:
                value = _field(row, k)
            except KeyError:
                value = None
            assert value is None, (k, value)
