"""traceanalyzer: offline analysis of GPU profiling traces on DuckDB.

A small library first, a thin CLI on top::

    import traceanalyzer as ta
    with ta.open_store("runs.duckdb") as store:
        store.ingest("report.sqlite")
        df = store.df("SELECT name, count(*) FROM kernels GROUP BY name")
"""

from .ingest.base import ParsedTrace, TraceError
from .store import IngestResult, Store, StoreError

__version__ = "0.1.0"


def open_store(path=None, *, read_only: bool = False) -> Store:
    """Open (or create) a store; path defaults to $TRACEANALYZER_STORE or ./traceanalyzer.duckdb."""
    return Store(path, read_only=read_only)


__all__ = ["open_store", "Store", "StoreError", "IngestResult", "ParsedTrace", "TraceError", "__version__"]
