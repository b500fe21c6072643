"""The analysis library: named, documented SQL over the store's tables, one module per family.

Each module declares what it defines (`DEFINES`: views, macros and table macros, each with the
names of the definitions its SQL reads) and holds the SQL generators and constants the rules
share. The store installs them on every connection (`store.views.install`): TEMP views live in
the connection, not the file, so a store written by an older version gets the current ones.
Rules and reports build on them instead of re-deriving them; a user can query them too
(`traceanalyzer query "SELECT * FROM device_busy"`).

The installation order follows from the declared reads (`install_order`); tests/test_analyses.py
checks that the reads declared are the names each SQL text references.
"""

from __future__ import annotations

import re

from . import attribution, budget, formatting, kernels, launches, memory, place, steps, timeline, warmup
from .core import Definition, Macro, TableMacro, View

# The families, in the order the documentation lists their views.
FAMILIES = (formatting, timeline, place, launches, kernels, steps, memory, budget, warmup, attribution)
DECLARED: tuple[Definition, ...] = tuple(d for family in FAMILIES for d in family.DEFINES)

# What a kind of definition may read: macros (and table macros not on demand) are created first, then
# views, and the on-demand views and table macros at a connection's first use of one, in read order.
_LATER = ("macro", "view", "on-demand view", "table macro")
_MAY_READ = {"macro": ("macro",), "view": ("macro", "view"), "on-demand view": _LATER, "table macro": _LATER}


def _kind(d: Definition) -> str:
    if isinstance(d, TableMacro):
        return "table macro" if d.on_demand else "macro"
    return "macro" if isinstance(d, Macro) else "on-demand view" if d.on_demand else "view"


def install_order(definitions: tuple[Definition, ...]) -> list[Definition]:
    """`definitions` ordered so that each comes after those it reads (depth first, in the
    order declared). A read of a name not defined, of a kind created later, or a cycle raises."""
    by_name = {d.name: d for d in definitions}
    if len(by_name) != len(definitions):
        raise ValueError("two definitions share a name")
    done: dict[str, Definition] = {}
    visiting: set[str] = set()

    def visit(d: Definition) -> None:
        if d.name in done:
            return
        if d.name in visiting:
            raise ValueError(f"{d.name} reads itself through {sorted(visiting)}")
        visiting.add(d.name)
        for name in d.reads:
            if name not in by_name:
                raise ValueError(f"{d.name} reads {name}, which no analysis module defines")
            if _kind(by_name[name]) not in _MAY_READ[_kind(d)]:
                raise ValueError(f"{d.name} ({_kind(d)}) reads {name}, a {_kind(by_name[name])}, "
                                 "which is created after it")
            visit(by_name[name])
        visiting.discard(d.name)
        done[d.name] = d

    for d in definitions:
        visit(d)
    return list(done.values())


def references(sql: str, names: set[str]) -> set[str]:
    """The names of `names` that `sql` references (as words; SQL comments left out)."""
    text = re.sub(r"--[^\n]*", "", sql)
    return {n for n in names if re.search(rf"(?<![\w.$]){re.escape(n)}(?!\w)", text)}


_ORDERED = install_order(DECLARED)
MACROS: dict[str, Macro] = {d.name: d for d in _ORDERED if isinstance(d, Macro)}
VIEWS: dict[str, View] = {d.name: d for d in _ORDERED if isinstance(d, View)}
TABLE_MACROS: dict[str, TableMacro] = {d.name: d for d in _ORDERED if isinstance(d, TableMacro)}
# What every connection gets, and what it gets at its first use of one, each in install order.
EAGER: tuple[Definition, ...] = tuple(d for d in _ORDERED if _kind(d) in ("macro", "view"))
ON_DEMAND: tuple[Definition, ...] = tuple(d for d in _ORDERED if _kind(d) in ("on-demand view", "table macro"))


def markdown() -> str:
    """The views and table macros section of docs/schema.md (gendocs), family by family."""
    out = ["## Views", "",
           "Every connection to a store has these views over the tables (`traceanalyzer/analyses/`).", "",
           "| view | what it holds |", "|---|---|"]
    out += [f"| `{d.name}` | {d.doc} |" for d in DECLARED if isinstance(d, View)]
    out += ["", "Table macros compute a view for some runs only, from their rows, or of the tables a query names:", "",
            "| macro | what it returns |", "|---|---|"]
    out += [f"| `{d.name}` | {d.doc} |" for d in DECLARED if isinstance(d, TableMacro)]
    return "\n".join(out)
