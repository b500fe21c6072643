"""TRACEANALYZER_MEMORY_LIMIT holds on every DuckDB connection traceanalyzer opens: the store's
(commands, scan workers' scratch stores) and a reader's own (nsys)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

import traceanalyzer
from traceanalyzer import resources
from traceanalyzer.ingest import nsys
from traceanalyzer.resources import MEMORY_LIMIT_ENV, MemoryLimitError, connect_duckdb

PACKAGE = Path(traceanalyzer.__file__).resolve().parent
FIXTURES = PACKAGE.parent / "fixtures"
SETTING = "SELECT current_setting('memory_limit')"


def test_every_duckdb_connection_goes_through_connect_duckdb():
    """A new place that connects to DuckDB on its own would not get the limit."""
    calls = re.compile(r"\bduckdb\s*\.\s*connect\s*\(")
    found = [f"{p.relative_to(PACKAGE)}:{n}" for p in PACKAGE.rglob("*.py") if p.name != "resources.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if calls.search(line)]
    assert found == []


def test_connect_duckdb_sets_the_limit_and_names_a_bad_value(monkeypatch):
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1GB")
    with connect_duckdb() as con:
        assert con.execute(SETTING).fetchall()[0][0] == "953.6 MiB"
    monkeypatch.delenv(MEMORY_LIMIT_ENV)
    with connect_duckdb() as con:
        default = con.execute(SETTING).fetchall()[0][0]
    assert default != "953.6 MiB"
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "lots")
    with pytest.raises(MemoryLimitError, match="TRACEANALYZER_MEMORY_LIMIT='lots' is not a memory size"):
        connect_duckdb()


def test_the_nsys_readers_own_connection_is_limited(monkeypatch):
    seen = []

    def setting(state):
        seen.append(state.duck.execute(SETTING).fetchall()[0][0])

    monkeypatch.setattr(nsys, "STAGES", (("setting", setting), *nsys.STAGES))
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "512MiB")
    trace = nsys.read(FIXTURES / "nsys" / "planted.sqlite")
    assert seen == ["512.0 MiB"] and trace.tables


def test_a_scan_workers_store_is_limited(tmp_path, monkeypatch):
    """A scan worker checks its file on a scratch store of its own (`batch.worker.process_file`)."""
    from traceanalyzer.batch import worker
    from traceanalyzer.batch.worker import WorkContext, process_file
    from traceanalyzer.store import Store

    seen = []
    real_ingest = Store.ingest

    def ingest(self, path, **kw):
        seen.append(self.sql(SETTING).fetchall()[0][0])
        return real_ingest(self, path, **kw)

    monkeypatch.setattr(Store, "ingest", ingest)
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "700MiB")
    # a worker thread keeps its scratch store between files: an earlier test's, opened without
    # the limit, is not the one this test is about
    monkeypatch.setattr(worker._local, "store", None, raising=False)
    out = process_file(str(FIXTURES / "nsys" / "planted.sqlite"),
                       WorkContext(frozenset(), None, resources=resources.Resources(1)))
    assert out.result.error is None and seen == ["700.0 MiB"]


@pytest.mark.parametrize("env, kept, during", [(None, "488.2 MiB", "953.6 MiB"),
                                               ("700MiB", "700.0 MiB", "700.0 MiB")])
def test_a_big_runs_rules_pass_is_held_to_its_own_limit(tmp_path, monkeypatch, env, kept, during):
    """The rules pass of a run above `RunPolicy.parallel_max_gpu_ops`, its kept cache's build and
    the drops of cached blocks between rules included, runs under `RunPolicy.big_run_memory`
    (1GB) where TRACEANALYZER_MEMORY_LIMIT sets none, under that limit where it does; a run that
    keeps its cache but is not big, under `kept_run_memory` (512MB); the limit before the pass
    holds again after it, and a run too small to keep its cache is not held."""
    from traceanalyzer.rules import engine
    from traceanalyzer.rules.engine import run_rules
    from traceanalyzer.store import Store, run_cache
    from traceanalyzer.store.run_policy import RunPolicy

    if env is None:
        monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    else:
        monkeypatch.setenv(MEMORY_LIMIT_ENV, env)
    seen = {"build": [], "rules": []}
    real_build, real_evaluate = run_cache._build, engine.evaluate_rule

    def build(con, *a):
        seen["build"].append(con.execute(SETTING).fetchall()[0][0])
        return real_build(con, *a)

    def evaluate(st, *a, **k):
        seen["rules"].append(st.sql(SETTING).fetchall()[0][0])
        return real_evaluate(st, *a, **k)

    monkeypatch.setattr(run_cache, "_build", build)
    monkeypatch.setattr(engine, "evaluate_rule", evaluate)
    keep = RunPolicy(keep_min_gpu_ops=1)
    with Store(tmp_path / "s.duckdb") as st:
        st.ingest(FIXTURES / "nsys" / "planted.sqlite")
        before = st.sql(SETTING).fetchall()[0][0]
        run_rules(st, settings=engine.Settings(policy=RunPolicy()))  # a small run
        assert set(seen["build"] + seen["rules"]) == {before}
        seen["build"].clear(), seen["rules"].clear()
        run_rules(st, settings=engine.Settings(reuse=False, policy=keep))  # a kept run
        assert seen["build"] == [kept] and set(seen["rules"]) == {kept}
        assert st.sql(SETTING).fetchall()[0][0] == before
        seen["build"].clear(), seen["rules"].clear()
        drop_kept_caches(st)
        big = replace(keep, parallel_max_gpu_ops=0)  # every run is big
        run_rules(st, settings=engine.Settings(reuse=False, policy=big))
        assert seen["build"] == [during] and set(seen["rules"]) == {during} and len(seen["rules"]) > 1
        assert st.sql(SETTING).fetchall()[0][0] == before


def drop_kept_caches(st) -> None:
    from traceanalyzer.store import run_cache

    for (run_id,) in st.sql("SELECT run_id FROM runs").fetchall():
        run_cache.drop_kept(st.con, run_id)
