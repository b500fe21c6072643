"""The analysis library's declarations: each definition's `reads` are the names its SQL text
references, and the installation order follows from them (tests/test_store.py installs it)."""

from __future__ import annotations

import pytest

from traceanalyzer import analyses
from traceanalyzer.analyses.core import Macro, TableMacro, View

NAMES = {d.name for d in analyses.DECLARED}


@pytest.mark.parametrize("definition", analyses.DECLARED, ids=lambda d: d.name)
def test_declared_reads_are_the_names_the_sql_references(definition):
    assert set(definition.reads) == analyses.references(definition.sql, NAMES - {definition.name})
    assert len(set(definition.reads)) == len(definition.reads)


def test_each_definition_is_installed_after_what_it_reads():
    order = [d.name for d in (*analyses.EAGER, *analyses.ON_DEMAND)]
    assert sorted(order) == sorted(NAMES)
    for d in analyses.DECLARED:
        assert all(order.index(r) < order.index(d.name) for r in d.reads), d.name


def test_the_order_comes_from_the_reads_not_the_declaration():
    a, b = View("a", "", "SELECT * FROM b", reads=("b",)), View("b", "", "SELECT 1")
    assert [d.name for d in analyses.install_order((a, b))] == ["b", "a"]


@pytest.mark.parametrize("definitions, error", [
    ((View("a", "", "SELECT * FROM c", reads=("c",)),), "no analysis module defines"),
    ((View("a", "", "", reads=("b",)), View("b", "", "", reads=("a",))), "reads itself"),
    ((View("a", "", "", reads=("t",)), TableMacro("t", "", "() AS TABLE SELECT 1")), "created after it"),
    ((Macro("m", "() AS 1", reads=("v",)), View("v", "", "SELECT 1")), "created after it"),
    ((View("a", "", "", reads=("b",)), View("b", "", "SELECT 1", on_demand=True)), "created after it"),
])
def test_a_read_that_cannot_be_installed_fails(definitions, error):
    with pytest.raises(ValueError, match=error):
        analyses.install_order(definitions)


def test_references_skip_comments_and_longer_names():
    sql = "SELECT * FROM run_steps s JOIN steps t USING (x) -- kernel_names\n WHERE p.kernel_names"
    assert analyses.references(sql, {"steps", "kernel_names", "run_steps"}) == {"steps", "run_steps"}


def test_a_connection_gets_the_on_demand_views_at_its_first_use_of_one(tmp_path):
    """A store's connection has the eager views only; a query naming an on-demand view or a
    table macro installs them and runs; a run's scope is the database's: another cursor reads it,
    its own views as they were."""
    from traceanalyzer.store import Store, run_cache, views

    on_demand_views = [d.name for d in analyses.ON_DEMAND if isinstance(d, View)]
    assert {"time_budget", "warmup_windows", "launch_context"} <= set(on_demand_views)
    with Store(tmp_path / "s.duckdb") as st:
        def views_there() -> set[str]:
            return {n for (n,) in st.con.execute("SELECT view_name FROM duckdb_views() WHERE temporary").fetchall()}
        assert views_there().isdisjoint(on_demand_views) and "gpu_activity" in views_there()
        assert st.sql("SELECT count(*) FROM warmup_windows").fetchone() == (0,)
        assert set(on_demand_views) <= views_there()
        cursor = st.cursor()  # a new connection: again without them
        with run_cache.scoped_to_run(st.con, "no-such-run"):
            assert cursor.con.execute("SELECT count(*) FROM this_run.warmup_windows").fetchone() == (0,)
            assert "warmup_windows" not in {n for (n,) in cursor.con.execute(
                "SELECT view_name FROM duckdb_views() WHERE temporary").fetchall()}
        cursor.close()
    assert views.names_on_demand(Exception()) is False
