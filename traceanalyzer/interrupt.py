"""Ctrl-C while DuckDB works.

Python runs its SIGINT handler in the main thread between two bytecodes; a main thread inside
a DuckDB query runs none until DuckDB looks (between two of its tasks: a long task, as a big
join is, kept a query going for minutes after Ctrl-C). And when DuckDB does look, it ends the
query with an ordinary error ("Query interrupted", a RuntimeError) and the KeyboardInterrupt
is gone: code that carries on past a file that failed or a rule that raised would take the
interrupt for that file's or rule's error and go on.

So, while `watching()`: SIGINT is noted here the moment it comes (Python writes the signal
number to a pipe from its C-level handler, `signal.set_wakeup_fd`, and a thread reading that
pipe notes it), and that thread interrupts every DuckDB connection made by
`resources.connect_duckdb` or `Store.cursor` (`interruptible`), which DuckDB honours within
a chunk of work, and again every REPEAT_S until the block ends (a query may start just
after the signal). The places that take an error for a file's or a rule's ask
`stop_if_interrupted()` first.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import weakref
from typing import Any, Iterator

REPEAT_S = 0.1
_hit = threading.Event()
_lock = threading.Lock()
_connections: weakref.WeakSet = weakref.WeakSet()  # DuckDB connections to interrupt on SIGINT


def interruptible(con: Any) -> Any:
    """Register the DuckDB connection `con` to be interrupted on SIGINT (while watching); `con`."""
    with _lock:
        _connections.add(con)
    return con


def interrupted() -> bool:
    """Whether SIGINT came during the current `watching` block."""
    return _hit.is_set()


def stop_if_interrupted(error: BaseException | None = None) -> None:
    """Raise KeyboardInterrupt if SIGINT came: call it before taking an error for a file's or
    a rule's, since after SIGINT it is the interrupt's."""
    if _hit.is_set():
        raise KeyboardInterrupt from error


def _interrupt_connections() -> None:
    with _lock:
        cons = list(_connections)
    for con in cons:
        with contextlib.suppress(Exception):  # closed meanwhile
            con.interrupt()


class _Watcher:
    """The thread that notes SIGINT as it comes, and interrupts DuckDB."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.w, False)
        self.thread = threading.Thread(target=self._run, name="sigint-watcher", daemon=True)
        self.stopping = False

    def start(self) -> bool:
        """False, and nothing started, when the wakeup fd is someone else's (an event loop) or
        a pipe cannot be one (Windows takes sockets only)."""
        try:
            previous = signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            self._close()
            return False
        if previous != -1:
            signal.set_wakeup_fd(previous)
            self._close()
            return False
        self.thread.start()
        return True

    def _run(self) -> None:
        while True:
            # After SIGINT, DuckDB is interrupted again every REPEAT_S until the block ends: a
            # query started just after the signal (between a check and its execute) would
            # otherwise run to its end.
            if _hit.is_set() and not select.select([self.r], [], [], REPEAT_S)[0]:
                _interrupt_connections()
                continue
            data = os.read(self.r, 64)
            if self.stopping or not data:
                return
            if signal.SIGINT in data:
                _hit.set()
                _interrupt_connections()

    def stop(self) -> None:
        signal.set_wakeup_fd(-1)
        self.stopping = True
        os.write(self.w, b"\0")
        self.thread.join()
        self._close()

    def _close(self) -> None:
        os.close(self.r)
        os.close(self.w)


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Note SIGINT for the block and interrupt DuckDB on it, and raise KeyboardInterrupt for
    any error the block raises after it. In the main thread only (signals reach no other),
    and not where SIGINT is ignored (a scan's worker process: the scan ends its workers)."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    # Not again inside a block that watches already (a scan's worker work done in the scan's
    # own process).
    installed = main and previous is not signal.SIG_IGN and not getattr(previous, "notes_sigint", False)
    watcher = None
    if installed:
        _hit.clear()

        def note(signum, frame):
            _hit.set()
            if callable(previous):
                previous(signum, frame)
            else:  # SIG_DFL, or a handler Python did not install
                raise KeyboardInterrupt

        note.notes_sigint = True
        signal.signal(signal.SIGINT, note)
        watcher = _Watcher()
        if not watcher.start():
            watcher = None
    try:
        yield
    except Exception as e:
        stop_if_interrupted(e)
        raise
    finally:
        if installed:
            signal.signal(signal.SIGINT, previous)
            if watcher is not None:
                watcher.stop()
            _hit.clear()  # what comes after (a notebook's next call) starts afresh
