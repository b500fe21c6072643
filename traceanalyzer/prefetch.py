"""Import the rules engine's modules on a second thread while DuckDB stores a run.

Storing a big run is mostly DuckDB's work (a third of a second for a 400 MB Kineto trace),
during which it lets go of the GIL, and the next thing done with a freshly stored run is
nearly always a rules pass, whose modules (pandas and the twenty rule files) take ~0.2 s to
import. Importing them meanwhile takes that time off the wall clock.

It is safe because Python's import system is: a thread that needs a module another thread
is importing waits for it, so nothing is imported twice or seen half-made. A failure here
is ignored; the same import fails again where the module is used, with its real error.
The thread is not a daemon, so the interpreter never shuts down in the middle of it.

`pandas_deferred` keeps pyarrow from importing pandas in the middle of a Kineto read, where
the import would sit on the read's critical path; see there.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

_started = False
_pandas_started = False
_lock = threading.Lock()


def rules_engine() -> None:
    """Start importing pandas and every rule module, once per process."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
    threading.Thread(target=_import_rules, name="traceanalyzer-prefetch").start()


def _import_rules() -> None:
    try:
        _import_pandas()
        from .rules import all_rules

        all_rules()
    except Exception:  # reported where the modules are used
        pass


def _import_pandas() -> None:
    if "pandas" not in sys.modules:
        import pandas  # noqa: F401
    _rearm_pyarrow()


def _rearm_pyarrow() -> None:
    """Make pyarrow look for pandas again. It looks once, at its first conversion; if pandas
    was refused then (`pandas_deferred`), pyarrow takes pandas objects for plain sequences
    (a categorical Series becomes strings, not a dictionary array) until one of its pandas
    conversions imports pandas itself. This is such a conversion, on an empty table."""
    if "pyarrow" in sys.modules:
        import pyarrow as pa

        pa.table({"_": pa.array([], pa.int8())}).to_pandas()


class RefusePandas:
    """A meta path finder that refuses pandas to the thread that made it (a None in
    sys.modules would refuse it to every thread, and pyarrow's compiled import ignores it
    anyway). `pandas_deferred` puts one in for a block; the split read's helper process,
    which has no use for pandas, for good."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(self, name, path=None, target=None):
        if (name == "pandas" or name.startswith("pandas.")) and threading.get_ident() == self.thread:
            raise ImportError("pandas is not imported here (traceanalyzer.prefetch.RefusePandas)")
        return None


@contextlib.contextmanager
def pandas_deferred() -> Iterator[None]:
    """Within the block, pandas is not imported by this thread; at its end another thread
    imports it.

    pyarrow imports pandas, when it can, at a process's first `pa.array` (to check for
    pandas types): ~0.2 s. In a Kineto read that is the first chunk's collect, and in a
    split read (`kineto_split`) it lengthens this process's part, which the helper's part
    is sized against. No reader needs pandas. After the block the import shares the cores
    with the wait for the helper, the tables' build and the insert (DuckDB's work, without
    the GIL): 0.05 s less per 400 MB trace, median of 10 alternated ingests with rules
    (docs/performance.md). If this thread needs pandas after all within the block, that
    import fails: the readers are tested with pandas refused for good (the split read's
    helper refuses it). Other threads may import pandas meanwhile, but if pyarrow's one
    check fell in the block, their `pa.array` of a pandas object is a plain sequence's
    conversion until the import after the block re-arms it (`_rearm_pyarrow`).
    """
    global _pandas_started
    with _lock:
        if "pandas" in sys.modules or _started or _pandas_started:
            finder = None
        else:
            finder = RefusePandas()
            sys.meta_path.insert(0, finder)
    if finder is None:
        yield
        return
    try:
        yield
    finally:
        with _lock:
            sys.meta_path.remove(finder)
            start = not _pandas_started
            _pandas_started = True
        if start:
            threading.Thread(target=_quietly, args=(_import_pandas,), name="traceanalyzer-pandas").start()


def _quietly(fn) -> None:
    try:
        fn()
    except Exception:  # reported where pandas is used
        pass
