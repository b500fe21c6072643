"""The analysis library (`traceanalyzer.analyses`) installed on a connection: its macros and
views as TEMP ones, in the order their declared reads give, and its table macros at first use."""

from __future__ import annotations

import weakref

import duckdb

from ..analyses import MACROS, TABLE_MACROS, VIEWS


# DuckDB picks a nested-loop plan for an ASOF join, and a piecewise merge join for a range
# join, when it *estimates* a side small; its estimates for the rules' CTEs are often ~10
# rows where there are millions, and those plans are quadratic (T006 and T004 took minutes
# on 2.5 M kernels). Zero thresholds keep the sort-based ASOF and IEJoin operators, which
# cost next to nothing extra on small runs.
PLANNER_SETTINGS = {"asof_loop_join_threshold": 0, "merge_join_threshold": 0}


def install(con: duckdb.DuckDBPyConnection) -> None:
    """The planner settings, macros and views on `con` (TEMP: a connection's own). The table
    macros come at their first use (`install_table_macros`): DuckDB parses and binds what is
    created, and they are two thirds of the SQL, which most connections never call."""
    for name, value in PLANNER_SETTINGS.items():
        con.execute(f"SET {name} = {value}")
    for definition in (*MACROS.values(), *VIEWS.values()):  # in the order their reads give
        con.execute(definition.create())


_with_table_macros: weakref.WeakSet = weakref.WeakSet()  # connections that have TABLE_MACROS


def install_table_macros(con: duckdb.DuckDBPyConnection) -> None:
    """TABLE_MACROS on `con`, once per connection."""
    if con in _with_table_macros:
        return
    for macro in TABLE_MACROS.values():
        con.execute(macro.create())
    _with_table_macros.add(con)


def names_table_macro(error: BaseException) -> bool:
    """Whether `error` is DuckDB's for a table macro not installed on the connection."""
    return isinstance(error, duckdb.CatalogException) and any(f"name {n} does not exist" in str(error)
                                                                for n in TABLE_MACROS)
