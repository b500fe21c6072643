"""What an analysis module declares: its views, macros and table macros, each with the names
of the other definitions its SQL reads (`reads`), from which the installation order follows."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class View:
    """A view every connection has: `CREATE TEMP VIEW name AS sql`. An `on_demand` one is
    created at its connection's first use of one (`store.views.install_on_demand`), with the
    table macros: DuckDB binds a view when it is created, and the few big ones (warm-up
    windows, the time budget, attribution) cost more to bind than the rest together, on every
    connection, while most connections (a command, a test's store) never read them."""

    name: str
    doc: str
    sql: str
    reads: tuple[str, ...] = ()  # the views and macros `sql` reads (not the tables)
    on_demand: bool = False

    def create(self) -> str:
        return f"CREATE OR REPLACE TEMP VIEW {self.name} AS {self.sql}"


@dataclass(frozen=True)
class Macro:
    """A scalar macro every connection has; `sql` is its parameters and body, `(x) AS ...`."""

    name: str
    sql: str
    reads: tuple[str, ...] = ()

    def create(self) -> str:
        return f"CREATE OR REPLACE TEMP MACRO {self.name}{self.sql}"


@dataclass(frozen=True)
class TableMacro:
    """A view of some runs from their rows only (`(rid) AS TABLE ...`), or of tables a query names;
    created with the macros, or (`on_demand`) at its connection's first use of one (`views.install_on_demand`)."""

    name: str
    doc: str
    sql: str
    reads: tuple[str, ...] = ()
    on_demand: bool = True

    def create(self) -> str:
        return f"CREATE OR REPLACE TEMP MACRO {self.name}{self.sql}"


Definition = View | Macro | TableMacro

MIN_BIGINT, MAX_BIGINT = -(1 << 63), (1 << 63) - 1


def qualified(condition: str, alias: str) -> str:
    """A condition on `run_id` (a runs parameter of the generators) on `alias`'s run_id; a
    parameter named like it (`$run_id`) stays."""
    return re.sub(r"(?<![$\w.])run_id\b", f"{alias}.run_id", condition)
