"""Readers, one module per format, each turning a file into the unified tables."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa

from .. import input_limits
from ..fmt import printable
from ..resources import Resources
from .base import ParsedTrace, TableSink, TraceError
from .detect import (KINETO, NCU, NCU_REP, NCU_TEXT, NSYS, TORCH_MEMORY_SNAPSHOT, TORCH_MEMORY_TIMELINE, detect,
                     not_a_trace)

_READER_MODULES = {NSYS: "nsys", NCU: "ncu", NCU_TEXT: "ncu_text", NCU_REP: "ncu_rep", KINETO: "kineto",
                   TORCH_MEMORY_SNAPSHOT: "torch_memory_snapshot", TORCH_MEMORY_TIMELINE: "torch_memory_timeline"}
# Readers that can hand their big tables to a TableSink as they build them.
_STREAMING = {NSYS}

# Files a folder walk picks up; an explicitly named file is always tried.
TRACE_SUFFIXES = (".sqlite", ".sqlite3", ".db", ".csv", ".log", ".txt", ".json", ".gz", ".ncu-rep", ".pickle", ".pkl")
# Vendor report files we cannot read, but can say what to do with.
_EXPORT_HINTS = {
    ".nsys-rep": "an Nsight Systems report: export it with `nsys export --type sqlite`",
    ".qdrep": "an Nsight Systems report: export it with `nsys export --type sqlite`",
}

_REPORTS_WITH_EXPORTS = (".nsys-rep", ".qdrep")

# Error text quotes files (SQLite schema text, JSON paths): keep it one short, inert line.
MAX_MESSAGE_CHARS = 300


def one_line(text: str, max_chars: int = MAX_MESSAGE_CHARS, exact: bool = False) -> str:
    """`text` safe to print as one terminal line: whitespace runs become one space (unless
    `exact`, for file names), control characters (newlines if `exact`, ANSI escapes, bidi
    overrides) are shown escaped (\\x1b), and it is clipped."""
    text = printable(text if exact else " ".join(text.split()))
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def read_file(path: Path, sink: TableSink | None = None, *, resources: Resources | None = None) -> ParsedTrace:
    """Detect the format of `path` from its content and run the matching reader.

    With a `sink`, a reader that can stream (nsys) hands it its big tables as they are
    built, unchecked: the sink runs `input_limits.TableChecks` on them. The result's `tables`
    hold the rest, checked. The reader uses the CPUs `resources` give it (default:
    `Resources.available()`). Raises TraceError (one line, without the file name) for
    anything unreadable.
    """
    try:
        return _read_file(path, sink, resources or Resources.available())
    except TraceError as e:
        raise TraceError(one_line(str(e))) from None


def streams(path: Path) -> bool:
    """Whether `path` is of a format whose reader hands its big tables to a sink as it builds
    them (see `read_file`); False for anything unreadable."""
    try:
        return path.suffix.lower() not in _EXPORT_HINTS and detect(path) in _STREAMING
    except (TraceError, OSError):
        return False


def _read_file(path: Path, sink: TableSink | None, resources: Resources) -> ParsedTrace:
    hint = _EXPORT_HINTS.get(path.suffix.lower())
    if hint:
        raise TraceError(hint)
    fmt = detect(path)
    if fmt in (KINETO, NCU, NCU_TEXT, TORCH_MEMORY_TIMELINE):  # text formats are parsed in memory
        input_limits.check_text_size(path.stat().st_size)
    reader = importlib.import_module(f"{__name__}.{_READER_MODULES[fmt]}")
    try:
        streamed = {"sink": sink} if sink is not None and fmt in _STREAMING else {}
        trace = _with_device_limits(reader.read(path, resources=resources, **streamed))
    except TraceError:
        raise
    except RecursionError:
        raise TraceError(f"{fmt}: structure nested too deeply") from None
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:  # a value no column type holds
        raise TraceError(f"{fmt}: a value does not fit its column ({str(e).splitlines()[0] if str(e) else ''})") from None
    except MemoryError:
        raise TraceError(f"{fmt}: ran out of memory while reading") from None
    # Whatever the reader: no table past the limits, no time that would overflow later.
    input_limits.check_tables(trace.tables, trace.warnings)
    return trace


def _with_device_limits(trace: ParsedTrace) -> ParsedTrace:
    """Fill device limits the trace lacks from the built-in GPU tables (never overriding it)."""
    devices = trace.tables.get("devices")
    if devices is not None and devices.num_rows:
        import pyarrow as pa

        from ..devices.gpu import fill_device

        rows = [fill_device(r) for r in devices.to_pylist()]
        names = list(dict.fromkeys(k for r in rows for k in r))
        # Every row gets every key: from_pylist takes its columns from the first row only.
        trace.tables["devices"] = pa.Table.from_pylist([{n: r.get(n) for n in names} for r in rows])
    return trace


def resolved(path: str | Path) -> Path:
    """`path` made absolute with its links followed, or as given made absolute where they
    cannot be (a symlink loop): the caller then reports the file, as for any it cannot read."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def find_traces(paths: Iterable[str | Path], not_traces: list | None = None) -> Iterator[Path]:
    """Expand files, folders (recursively, sorted) and globs into trace files.

    A file named as given is yielded even when it does not exist or is no trace, so that the
    caller reports it. A file found in a folder that is plainly no trace (`detect.not_a_trace`:
    a `config.json`, another tool's CSV) is passed over, and listed as (path, what it is) in
    `not_traces` when given. So is an Nsight Systems report with its SQLite export beside it.
    """
    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if not f.is_file() or f.name.startswith("."):
                    continue
                suffix = f.suffix.lower()
                if suffix in _REPORTS_WITH_EXPORTS and f.with_suffix(".sqlite").is_file():
                    why = f"an Nsight Systems report; its export {f.with_suffix('.sqlite').name} is read"
                elif suffix in TRACE_SUFFIXES:
                    why = not_a_trace(f)
                elif suffix in _EXPORT_HINTS:
                    why = None  # a report we cannot read: the reader's error says how to export it
                else:
                    continue
                if why is None:
                    yield f
                elif not_traces is not None:
                    not_traces.append((f, why))
        elif any(ch in str(p) for ch in "*?[") and not p.exists():
            yield from sorted(Path().glob(str(p))) if not p.is_absolute() else sorted(
                Path(p.anchor).glob(str(p.relative_to(p.anchor))))
        else:
            yield p


__all__ = ["read_file", "find_traces", "ParsedTrace", "TableSink", "TraceError", "detect"]
