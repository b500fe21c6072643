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

A cross-run rule (scope "runs") takes `traces = [...]` instead of `trace`; its findings get a
`trace` field (the trace they are about) that `where` can test.
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
from traceanalyzer.rules.engine import evaluate_across, evaluate_rule
from traceanalyzer.store import Store

from .conftest import FIXTURES, ROOT, shared_traces

RULES_DIR = ROOT / "traceanalyzer" / "rules"


def _cases():
    out = []
    for path in sorted(RULES_DIR.glob("*.cases.toml")):
        rule_id = path.name.split("_", 1)[0]
        for i, case in enumerate(tomllib.loads(path.read_text())["case"]):
            out.append(pytest.param(rule_id, case, id=f"{rule_id}-{i}-{case.get('name', '')[:40]}"))
    return out


_STORES: dict[str, tuple[Store, str]] = {}


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    def get(trace: str) -> tuple[Store, str]:
        if trace not in _STORES:
            store = Store(tmp_path_factory.mktemp("cases") / "s.duckdb")
            _STORES[trace] = (store, store.ingest(_trace_path(trace)).run_id)
        return _STORES[trace]
    yield get
    for store, _ in _STORES.values():
        store.close()
    _STORES.clear()


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


def _findings(rule, case, ingested, tmp_path) -> list[dict]:
    params = rule.params(case.get("params"))
    if rule.scope == "runs":
        with Store(tmp_path / "runs.duckdb") as store:
            by_run = {store.ingest(_trace_path(t)).run_id: t for t in case["traces"]}
            rows = evaluate_across(store, rule, list(by_run), params).to_dict("records")
        for r in rows:
            r["trace"] = by_run[r["run_id"]]
        return rows
    store, run_id = ingested(case["trace"])
    return evaluate_rule(store, rule, run_id, params).to_dict("records")


@pytest.mark.parametrize("rule_id,case", _cases())
def test_case(rule_id, case, ingested, tmp_path):
    rule = get_rule(rule_id)
    rows = _findings(rule, case, ingested, tmp_path)
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
