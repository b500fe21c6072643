"""Tell a file's format from its content, not its name."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from .base import TraceError

NSYS = "nsys-sqlite"
NCU = "ncu-csv"
KINETO = "kineto-json"

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"


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
    """Return NSYS, NCU or KINETO, or raise TraceError saying what the file is instead."""
    head = _head(path)
    if not head:
        raise TraceError("empty file")
    if head.startswith(SQLITE_MAGIC):
        return NSYS
    text = _gunzip_head(head) if head.startswith(GZIP_MAGIC) else head
    stripped = text.lstrip(b"\xef\xbb\xbf \t\r\n")
    if stripped[:1] in (b"{", b"["):
        return KINETO
    sample = text[:64 * 1024].decode("utf-8", "replace")
    if '"ID","Process ID"' in sample or "==PROF==" in sample or '"Kernel Name"' in sample:
        return NCU
    if head.startswith(GZIP_MAGIC):
        raise TraceError("gzip file that does not hold a JSON trace")
    if b"\x00" in head[:4096]:
        raise TraceError("unrecognized binary file (not an nsys SQLite export, ncu CSV or Kineto JSON)")
    raise TraceError("unrecognized text file (not an nsys SQLite export, ncu CSV or Kineto JSON)")


__all__ = ["detect", "NSYS", "NCU", "KINETO", "gzip"]
