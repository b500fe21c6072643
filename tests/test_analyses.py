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
    order = [*analyses.MACROS, *analyses.VIEWS, *analyses.TABLE_MACROS]
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
])
def test_a_read_that_cannot_be_installed_fails(definitions, error):
    with pytest.raises(ValueError, match=error):
        analyses.install_order(definitions)


def test_references_skip_comments_and_longer_names():
    sql = "SELECT * FROM run_steps s JOIN steps t USING (x) -- kernel_names\n WHERE p.kernel_names"
    assert analyses.references(sql, {"steps", "kernel_names", "run_steps"}) == {"steps", "run_steps"}
