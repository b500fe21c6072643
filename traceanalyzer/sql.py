"""SQL text of Python values, for the few places that write a value into SQL text instead
of binding it: DuckDB's SET, COPY ... TO, and SQL generated from this package's constants
(CASE tables, VALUES lists, macro bodies). Values from a user or a file are bound, never
written in."""

from __future__ import annotations


def sql_literal(value: object) -> str:
    """`value` as a SQL literal: text quoted (a quote doubled), numbers as written, booleans
    TRUE or FALSE, None NULL."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"
