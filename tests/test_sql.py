"""One way to write a Python value into SQL text (`traceanalyzer.sql.sql_literal`)."""

from __future__ import annotations

import duckdb
import pytest

from traceanalyzer.sql import sql_literal

from .conftest import ROOT


@pytest.mark.parametrize("value", ["it's", "", "a''b", "x\\n'; DROP TABLE t; --", 3, -7, 2.5, True, False, None])
def test_a_literal_reads_back_as_its_value(value):
    assert duckdb.connect().execute(f"SELECT {sql_literal(value)}").fetchall() == [(value,)]


def test_no_module_quotes_sql_text_by_hand():
    hand = [p.relative_to(ROOT) for p in (ROOT / "traceanalyzer").rglob("*.py")
            if p.name != "sql.py" and """replace("'", "''")""" in p.read_text()]
    assert hand == [], f"quote with traceanalyzer.sql.sql_literal: {hand}"
