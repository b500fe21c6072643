"""The analysis library (`traceanalyzer.analyses`) installed on a connection: its macros and
views as TEMP ones, in the order their declared reads give, and its on-demand views and table
macros at first use."""

from __future__ import annotations

import weakref

import duckdb

from ..analyses import EAGER, ON_DEMAND


# DuckDB picks a nested-loop plan for an ASOF join, and a piecewise merge join for a range
# join, when it *estimates* a side small; its estimates for the rules' CTEs are often ~10
# rows where there are millions, and those plans are quadratic (T006 and T004 took minutes
# on 2.5 M kernels). Zero thresholds keep the sort-based ASOF and IEJoin operators, which
# cost next to nothing extra on small runs.
PLANNER_SETTINGS = {"asof_loop_join_threshold": 0, "merge_join_threshold": 0}


def install(con: duckdb.DuckDBPyConnection) -> None:
    """The planner settings, macros and views on `con` (TEMP: a connection's own). The on-demand
    views and the table macros come at their first use (`install_on_demand`): DuckDB parses and
    binds what is created, and they are most of that work, which most connections never need
    (a new store's connection: 0.08 s of CPU with them, 0.03 s without)."""
    for name, value in PLANNER_SETTINGS.items():
        con.execute(f"SET {name} = {value}")
    for definition in EAGER:  # in the order their reads give
        con.execute(definition.create())


_on_demand: weakref.WeakSet = weakref.WeakSet()  # connections that have ON_DEMAND


def install_on_demand(con: duckdb.DuckDBPyConnection) -> None:
    """ON_DEMAND (the on-demand views and the table macros, in the order their reads give) on
    `con`, once per connection."""
    if con in _on_demand:
        return
    for definition in ON_DEMAND:
        con.execute(definition.create())
    _on_demand.add(con)


def names_on_demand(error: BaseException) -> bool:
    """Whether `error` is DuckDB's for an on-demand view or table macro not installed on the
    connection."""
    return isinstance(error, duckdb.CatalogException) and any(f"name {d.name} does not exist" in str(error)
                                                                for d in ON_DEMAND)
