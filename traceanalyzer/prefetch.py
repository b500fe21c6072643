"""Import the rules engine's modules on a second thread while DuckDB stores a run.

Storing a big run is mostly DuckDB's work (a third of a second for a 400 MB Kineto trace),
during which it lets go of the GIL, and the next thing done with a freshly stored run is
nearly always a rules pass, whose modules (pandas and the twenty rule files) take ~0.2 s to
import. Importing them meanwhile takes that time off the wall clock.

It is safe because Python's import system is: a thread that needs a module another thread
is importing waits for it, so nothing is imported twice or seen half-made. A failure here
is ignored; the same import fails again where the module is used, with its real error.
The thread is not a daemon, so the interpreter never shuts down in the middle of it.
"""

from __future__ import annotations

import sys
import threading

_started = False
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
        if "pandas" not in sys.modules:
            import pandas  # noqa: F401
        from .rules import all_rules

        all_rules()
    except Exception:  # reported where the modules are used
        pass
