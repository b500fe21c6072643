"""What the rules of one run share in a rules pass: the run cache's memo (run_cache.RunCache.memo),
which the rules reach through the store they are given (`Store.run_cache`)."""

from __future__ import annotations

import threading
import time

import pytest

from traceanalyzer.store import run_cache
from traceanalyzer.resources import Resources
from traceanalyzer.rules import _launches, engine
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store
from traceanalyzer.store.run_policy import RunPolicy

from .conftest import FIXTURES


def test_memo_computes_once_while_threads_wait_and_keeps_no_failure():
    cache = run_cache.RunCache("r")
    calls = []
    start = threading.Barrier(2)

    def slow():
        calls.append(1)
        time.sleep(0.2)  # the other thread asks meanwhile
        return object()

    got = []

    def ask():
        start.wait()
        got.append(cache.memo("k", slow))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and got[0] is got[1]

    def broken():
        raise ValueError("no")

    with pytest.raises(ValueError):
        cache.memo("other", broken)
    assert cache.memo("other", lambda: 7) == 7  # the failure was not kept
    cache.forget()
    assert cache.memo("k", lambda: 8) == 8


def test_launch_groups_are_computed_once_per_run_in_a_pass_on_two_threads(tmp_path, monkeypatch):
    """B001, B002 and T005 all read a run's launch groups: in a pass on two rule threads they are
    computed once per run, from a memo dropped with the run's cache; outside a pass each call computes."""
    computed: list[tuple[str, str, run_cache.RunCache | None]] = []
    real = _launches._launch_groups

    def counting(store, run_id):
        computed.append((run_id, threading.current_thread().name, store.run_cache))
        time.sleep(0.1)  # long enough for the other rule thread to ask meanwhile
        return real(store, run_id)

    monkeypatch.setattr(_launches, "_launch_groups", counting)
    with Store(tmp_path / "s.duckdb", resources=Resources(2)) as store:
        run_ids = [store.ingest(FIXTURES / f).run_id for f in ("kineto/bottleneck_gemm.json", "ncu/raw_waves.csv")]
        outcomes = run_rules(store, run_ids, Settings(select=["B001", "B002", "T005"],  # two threads on runs this small too
                                                       policy=RunPolicy(parallel_min_gpu_ops=0)))
        assert {o.status for o in outcomes} == {"ran"} and sum(o.findings for o in outcomes) > 0
        assert [r for r, _, _ in computed] == run_ids
        assert all(thread.startswith("rules") for _, thread, _ in computed)  # the two-thread path
        for _, _, cache in computed:  # dropped at the end of the run's pass
            assert cache is not None and cache.memo("launch_groups", lambda: "again") == "again"
        assert store.run_cache is None

        computed.clear()
        first = _launches.launch_groups(store, run_ids[0])
        assert first.equals(_launches.launch_groups(store, run_ids[0])) and len(computed) == 2


def test_findings_keep_every_nanosecond_whatever_type_a_rule_returns(tmp_path):
    """A Python rule's None/NaN start beside a SQL rule's integer one: the stored timestamps are
    exact (a float column would round them to 2^-53 of 1.7e18 ns, 256 ns)."""
    import pandas as pd
    import pyarrow as pa

    from traceanalyzer.rules import get_rule
    from traceanalyzer.rules.engine import _normalize
    from traceanalyzer.schema import arrow_schema

    st = Store(tmp_path / "s.duckdb")
    run_id = st.ingest(FIXTURES / "nsys" / "clean.sqlite").run_id
    t = 1739836029603000001
    python_rule = pd.DataFrame({"item_name": ["a", "b"], "start_ns": [float("nan"), None], "end_ns": [None, None],
                                "est_loss_ns": [None, 3.0]})
    sql_rule = pd.DataFrame({"item_name": ["c"], "start_ns": pd.array([t], dtype="Int64"),
                             "end_ns": pd.array([t + 2], dtype="Int64"), "est_loss_ns": pd.array([7], dtype="Int64")})
    frames = [_normalize(python_rule, get_rule("B001"), run_id, st), _normalize(sql_rule, get_rule("T001"), run_id, st)]
    columns = arrow_schema("findings")
    table = pa.Table.from_pandas(pd.concat(frames, ignore_index=True).reindex(columns=columns.names),
                                 schema=columns, preserve_index=False)
    assert table.column("start_ns").to_pylist() == [None, None, t]
    assert table.column("end_ns").to_pylist() == [None, None, t + 2]
    assert table.column("est_loss_ns").to_pylist() == [None, 3, 7]
    st.close()


# -- a stored outcome is taken where it was computed from the same inputs ----------------------

def _evaluated(monkeypatch) -> list[tuple[str, str]]:
    """(run id, rule id) of every rule evaluated from here on."""
    from traceanalyzer.rules import engine

    seen: list[tuple[str, str]] = []
    real = engine.evaluate_rule
    monkeypatch.setattr(engine, "evaluate_rule", lambda st, rule, run_id, p: seen.append((run_id, rule.id))
                        or real(st, rule, run_id, p))
    return seen


def _results(st: Store) -> tuple:
    return (st.sql("SELECT * FROM findings ORDER BY ALL").fetchall(),
            st.sql("SELECT * EXCLUDE (evaluated_at) FROM rule_runs ORDER BY ALL").fetchall())


def test_a_stored_outcome_is_reused_only_for_the_same_code_data_and_thresholds(tmp_path, monkeypatch):
    from traceanalyzer import link
    from traceanalyzer.rules import engine

    seen = _evaluated(monkeypatch)
    with Store(tmp_path / "s.duckdb") as st:
        nsys_id = st.ingest(FIXTURES / "linked" / "mlp_step.sqlite").run_id
        ncu_id = st.ingest(FIXTURES / "linked" / "mlp_step.ncu.csv").run_id
        run_rules(st, [nsys_id])
        first = _results(st)
        ran = {rule for _, rule in seen}
        assert {"T001", "B001"} <= ran
        seen.clear()
        outcomes = run_rules(st, [nsys_id])  # the same again: nothing computed, the same answer
        assert seen == [] and _results(st) == first
        assert {(o.rule_id, o.status) for o in outcomes} == set(
            st.sql("SELECT rule_id, status FROM rule_runs WHERE run_id = $1", [nsys_id]).fetchall())

        run_rules(st, [nsys_id], Settings(thresholds={"T001": {"min_gap_ns": 1}}))  # other thresholds
        assert {rule for _, rule in seen} == ran
        seen.clear()
        run_rules(st, [nsys_id], Settings(thresholds={"T001": {"min_gap_ns": 1}}))
        assert seen == []
        run_rules(st, [nsys_id], Settings(thresholds={"T001": {"min_gap_ns": 1}, "FLOOR": {"min_loss_ns": 1}}))
        assert {rule for _, rule in seen} == ran  # the diagnosis's floors decide what is stored too
        seen.clear()
        run_rules(st, [nsys_id], Settings(reuse=False))  # asked to compute: every rule that applies
        assert {rule for _, rule in seen} == ran
        seen.clear()
        monkeypatch.setattr(engine, "code_digest", lambda: "other code")
        run_rules(st, [nsys_id])
        assert {rule for _, rule in seen} == ran
        seen.clear()
        link.link_runs(st, nsys_id, ncu_id)  # the run's links changed: its kernel rules read them
        run_rules(st, [nsys_id])
        assert {rule for _, rule in seen} >= ran | {"B003", "I001"}  # the linked ncu run's metrics apply now
        seen.clear()
        st.ingest(FIXTURES / "linked" / "mlp_step.sqlite")  # stored again: its rows are new
        run_rules(st, [nsys_id])
        assert {rule for _, rule in seen} >= ran


def test_an_error_is_computed_again(tmp_path, monkeypatch):
    from traceanalyzer.rules import engine

    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(FIXTURES / "nsys" / "planted.sqlite").run_id
        real = engine.evaluate_rule

        def broken(store, rule, rid, p):
            if rule.id == "T001":
                raise RuntimeError("boom")
            return real(store, rule, rid, p)

        monkeypatch.setattr(engine, "evaluate_rule", broken)
        run_rules(st, [run_id])
        assert st.sql("SELECT status FROM rule_runs WHERE rule_id = 'T001'").fetchone()[0] == "error"
        monkeypatch.setattr(engine, "evaluate_rule", real)
        seen = _evaluated(monkeypatch)
        run_rules(st, [run_id])
        assert seen == [(run_id, "T001")]
        assert st.sql("SELECT status FROM rule_runs WHERE rule_id = 'T001'").fetchone()[0] == "ran"
