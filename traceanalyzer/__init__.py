"""traceanalyzer: offline analysis of GPU profiling traces on DuckDB.

A small library first, a thin CLI on top::

    import traceanalyzer as ta
    with ta.open_store("runs.duckdb") as store:
        result = ta.check_file(store, "report.sqlite", ta.Settings())  # read, store, run the rules
        df = store.df("SELECT rule_id, severity, message FROM findings WHERE run_id = ?", [result.run_id])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .batch.check import FileResult, check_file
    from .ingest.base import ParsedTrace, TraceError
    from .resources import Resources
    from .rules.engine import Settings
    from .store import IngestResult, Store, StoreError

__version__ = "0.1.0"

# Imported on first use, so that a process needing one reader (a helper process of a Kineto
# read in parts, see ingest/kineto_parts.py) does not pay for DuckDB and pandas.
_LAZY = {"ParsedTrace": ".ingest.base", "TraceError": ".ingest.base", "IngestResult": ".store",
         "Store": ".store", "StoreError": ".store", "check_file": ".batch.check", "FileResult": ".batch.check",
         "Resources": ".resources", "Settings": ".rules.engine"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(path=None, *, read_only: bool = False) -> Store:
    """Open (or create) a store; path defaults to $TRACEANALYZER_STORE or ./traceanalyzer.duckdb."""
    from .store import Store

    return Store(path, read_only=read_only)


__all__ = ["open_store", "check_file", "FileResult", "Settings", "Resources", "Store", "StoreError", "IngestResult",
           "ParsedTrace", "TraceError", "__version__"]
