"""Tell a file's format from its content, not its name."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path

from . import ncu_text
from .base import TraceError

NSYS = "nsys-sqlite"
NCU = "ncu-csv"
NCU_TEXT = "ncu-text"
NCU_REP = "ncu-rep"
KINETO = "kineto-json"
TORCH_MEMORY_SNAPSHOT = "torch-memory-snapshot"
TORCH_MEMORY_TIMELINE = "torch-memory-timeline"

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
NCU_REP_MAGIC = b"NVR\x00"
# PROTO opcode and protocol 2-5: how `pickle.dump` (so `torch.cuda.memory._dump_snapshot`) starts.
PICKLE_PROTOCOLS = (2, 3, 4, 5)


def _head(path: Path, n: int = 64 * 1024) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _gunzip_head(raw: bytes) -> bytes:
    # Decompress only the start: enough to sniff, bounded whatever the file inflates to.
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        return d.decompress(raw, 64 * 1024)
    except zlib.error as e:
        raise TraceError(f"corrupt gzip stream ({e})") from None


def detect(path: Path) -> str:
    """Return NSYS, NCU, NCU_TEXT, NCU_REP, KINETO, TORCH_MEMORY_SNAPSHOT or TORCH_MEMORY_TIMELINE, or
    raise TraceError saying what the file is instead."""
    head = _head(path)
    if not head:
        raise TraceError("empty file")
    if head.startswith(SQLITE_MAGIC):
        return NSYS
    if head.startswith(NCU_REP_MAGIC):
        return NCU_REP
    if head[:1] == b"\x80" and head[1:2] and head[1] in PICKLE_PROTOCOLS:
        return TORCH_MEMORY_SNAPSHOT
    text = _gunzip_head(head) if head.startswith(GZIP_MAGIC) else head
    stripped = text.lstrip(b"\xef\xbb\xbf \t\r\n")
    # A JSON array of arrays: export_memory_timeline's rows (Kineto's array form holds objects).
    if stripped[:1] == b"[" and stripped[1:].lstrip()[:1] == b"[":
        return TORCH_MEMORY_TIMELINE
    # `ncu -i report.ncu-rep` prints its text report from the first line on: "[pid] process@host".
    if stripped[:1] in (b"{", b"[") and not re.match(rb"\[\d+\] \S", stripped):
        return KINETO
    sample = ncu_text.decode(text[:64 * 1024])
    if '"ID","Process ID"' in sample or '"Kernel Name"' in sample:
        return NCU
    if ncu_text.TEXT_REPORT.search(sample) or ("==PROF==" in sample and ncu_text.TEXT_REPORT.search(
            ncu_text.decode(_head(path, TEXT_SNIFF_BYTES)))):  # program output can run long before the report
        return NCU_TEXT
    if "==PROF==" in sample:
        return NCU
    if head.startswith(GZIP_MAGIC):
        raise TraceError("gzip file that does not hold a JSON trace")
    if b"\x00" in head[:4096]:
        raise TraceError("unrecognized binary file (not an nsys SQLite export, ncu CSV or Kineto JSON)")
    raise TraceError("unrecognized text file (not an nsys SQLite export, ncu CSV or Kineto JSON)")


# How far into a file with ==PROF== lines detection looks for an ncu text report's first section.
TEXT_SNIFF_BYTES = 16 << 20

# How far into a JSON file a folder walk looks for `traceEvents` (Kineto writes it after the
# run's metadata, which is a few kB; every real trace in the corpus has it in the first 64 kB).
JSON_SNIFF_BYTES = 1 << 20


def not_a_trace(path: Path) -> str | None:
    """What `path` is instead of a trace, when a folder walk should pass over it (a JSON
    without `traceEvents`, a CSV that is no ncu export, an SQLite file that is no nsys
    export); None when it may be one, so that reading it reports what is wrong with it."""
    try:
        fmt = detect(path)
    except TraceError as e:  # other text, or a gzip of it, is something else; damaged bytes may be a trace
        text = str(e)
        return text if text.startswith(("unrecognized text file", "gzip file that does not hold")) else None
    except OSError:
        return None
    if fmt == KINETO:
        return None if _holds_trace_events(path) else "JSON without traceEvents"
    if fmt == NSYS:
        return None if _has_nsys_tables(path) else "SQLite file with no Nsight Systems tables"
    if fmt == TORCH_MEMORY_SNAPSHOT:
        # The snapshot's first key; any other pickle (a model, a dataset) is no trace.
        return None if b"segments" in _head(path, 4096) else "pickle that is no PyTorch memory snapshot"
    if fmt == TORCH_MEMORY_TIMELINE:
        return None if _timeline_start(path) else "JSON array of arrays that is no PyTorch memory timeline"
    return None


def _timeline_start(path: Path) -> bool:
    """Whether a JSON array of arrays starts as export_memory_timeline writes one: a row of four
    integers (raw), or a list of times (plot). Damaged bytes: yes, the reader says what is wrong."""
    raw = _head(path)
    try:
        text = _gunzip_head(raw) if raw.startswith(GZIP_MAGIC) else raw
    except TraceError:
        return True
    return bool(re.match(rb"\s*\[\s*\[\s*(?:-?\d+\s*,\s*){3}-?\d+\s*[],]", text)
                or re.match(rb"\s*\[\s*\[[-\d\s,]*\]\s*,\s*\[\s*\[", text))


def _holds_trace_events(path: Path) -> bool:
    """Whether a JSON file may be a Chrome trace: `traceEvents` near its start, or (the array
    form) a list of events. A small file that is no valid JSON may be a trace cut short: yes."""
    for n in (64 * 1024, JSON_SNIFF_BYTES):
        raw = _head(path, n)
        whole = len(raw) < n
        if raw.startswith(GZIP_MAGIC):
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                raw = d.decompress(raw, 16 * n if whole else n)
            except zlib.error:
                return True  # damaged: the reader says what is wrong
            whole = whole and d.eof
        if b'"traceEvents"' in raw or (raw.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"[" and b'"ph"' in raw):
            return True
        if whole:
            try:
                json.loads(raw)
            except ValueError:
                return True
            return False
    return False


def _has_nsys_tables(path: Path) -> bool:
    import sqlite3

    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        finally:
            con.close()
    except sqlite3.Error:
        return True  # a damaged export: the reader says what is wrong
    return "StringIds" in names or any(n.startswith(("CUPTI_", "NVTX_", "TARGET_INFO_")) for n in names)


__all__ = ["detect", "not_a_trace", "NSYS", "NCU", "NCU_TEXT", "NCU_REP", "KINETO", "TORCH_MEMORY_SNAPSHOT",
           "TORCH_MEMORY_TIMELINE", "gzip"]
