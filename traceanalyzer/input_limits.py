"""Limits on what one input file can make traceanalyzer do.

Traces come from other people's machines, so every file is untrusted. A few cheap checks
keep a hostile or broken file from taking unbounded memory or time: a gzip that inflates
a thousandfold, JSON nested thousands deep, an SQLite whose b-tree points at the same
pages over and over so that a few KB "hold" billions of rows, strings of gigabytes.
A file over a limit is refused with a one-line error that names the limit; the defaults
sit far above every real trace we have (docs/reliability.md) and each can be raised with
an environment variable, e.g. `TRACEANALYZER_MAX_ROWS=2000000000`.

Values are read when a file is read (not at import), so a test or a long-lived process
can change them. Byte sizes accept K/M/G/T suffixes (powers of 1024): `8G`, `512M`.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from .ingest.base import TraceError

ENV_PREFIX = "TRACEANALYZER_"


@dataclass(frozen=True)
class Limit:
    name: str  # the env var is ENV_PREFIX + name
    default: int
    unit: str
    doc: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name


GIB = 1 << 30
MIB = 1 << 20
LIMITS: dict[str, Limit] = {lim.name: lim for lim in (
    Limit("MAX_TEXT_BYTES", 2 * GIB, "bytes",
          "Largest JSON or CSV file read (CSV, and JSON of an odd layout, are parsed whole, peak 3x "
          "to 10x the text; Kineto `traceEvents` is decoded in chunks), and the most string bytes one table of an nsys export may expand to (a long "
          "name stored once but named on every row)."),
    Limit("MAX_PICKLE_BYTES", 512 * MIB, "bytes",
          "Largest PyTorch memory snapshot (pickle) read: it is unpickled whole, into Python objects of "
          "about 5x its size (real snapshots), up to ~40x for one made to be costly (empty dicts, 2 bytes each)."),
    Limit("MAX_INFLATED_BYTES", 2 * GIB, "bytes",
          "Most bytes a gzipped trace may inflate to; inflation stops there."),
    Limit("MAX_INFLATE_RATIO", 200, "x",
          "Most a gzipped trace may grow, as inflated/compressed size (real Kineto traces: "
          "7x to 31x). Checked once the output passes 64 MiB, so small files never trip it."),
    Limit("MAX_JSON_DEPTH", 256, "levels",
          "Deepest nesting of JSON arrays/objects (real Kineto traces: 4 to 7)."),
    Limit("MAX_ROWS", 200_000_000, "rows",
          "Most rows read from one table of a trace, or stored in one table for one run."),
    Limit("MAX_STRING_BYTES", 16 * MIB, "bytes",
          "Longest string stored (kernel name, range name, ...); real traces: under 300 KB."),
)}
# Inflation below this size is never judged by ratio.
RATIO_FLOOR_BYTES = 64 * MIB
# A row of an SQLite table takes at least this many bytes of its file (2-byte cell
# pointer, payload size, rowid, record header); more rows than size/this is a corrupt
# b-tree that reuses pages, whatever COUNT(*) says.
SQLITE_MIN_ROW_BYTES = 4

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_VALUE = re.compile(r"^\s*(\d[\d_]*)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def get(name: str) -> int:
    """The current value of limit `name` (env var, else the default)."""
    lim = LIMITS[name]
    text = os.environ.get(lim.env)
    if text is None or not text.strip():
        return lim.default
    m = _VALUE.match(text)
    value = int(m.group(1).replace("_", "")) * _SUFFIX[m.group(2).upper()] if m else 0
    if value <= 0:
        raise TraceError(f"{lim.env}={text!r} is not a positive whole number (a size may end in K, M, G or T)")
    return value


def show(name: str, value: int | None = None) -> str:
    value = get(name) if value is None else value
    if LIMITS[name].unit == "bytes":
        for suffix in ("T", "G", "M", "K"):
            if value >= _SUFFIX[suffix] and value % _SUFFIX[suffix] == 0:
                return f"{value // _SUFFIX[suffix]}{suffix}iB"
        return f"{value} bytes"
    return f"{value:,} {LIMITS[name].unit}"


def over(name: str, what: str) -> TraceError:
    """The error for a file over limit `name`: `what` says by how much, the end says how to allow it."""
    return TraceError(f"{what}, over the limit of {show(name)} (set {LIMITS[name].env} to raise it)")


def check_text_size(size_bytes: int) -> None:
    if size_bytes > get("MAX_TEXT_BYTES"):
        raise over("MAX_TEXT_BYTES", f"text file of {size_bytes:,} bytes")


def check_pickle_size(size_bytes: int) -> None:
    if size_bytes > get("MAX_PICKLE_BYTES"):
        raise over("MAX_PICKLE_BYTES", f"pickle of {size_bytes:,} bytes")


class InflateGuard:
    """Counts gzip output and stops inflation at MAX_INFLATED_BYTES or MAX_INFLATE_RATIO."""

    def __init__(self, compressed_bytes: int):
        self.compressed_bytes = max(compressed_bytes, 1)
        self.max_bytes = get("MAX_INFLATED_BYTES")
        self.max_ratio = get("MAX_INFLATE_RATIO")
        self.total = 0

    def room(self) -> int:
        """Bytes that may still be produced before the next check must fail."""
        by_ratio = max(self.max_ratio * self.compressed_bytes, RATIO_FLOOR_BYTES)
        return max(min(self.max_bytes, by_ratio) - self.total, 0) + 1

    def add(self, n: int) -> None:
        self.total += n
        if self.total > self.max_bytes:
            raise over("MAX_INFLATED_BYTES", f"gzip inflates to more than {self.max_bytes:,} bytes")
        if self.total > RATIO_FLOOR_BYTES and self.total > self.max_ratio * self.compressed_bytes:
            raise over("MAX_INFLATE_RATIO",
                       f"gzip of {self.compressed_bytes:,} bytes inflates more than "
                       f"{self.max_ratio}x (a decompression bomb?)")


def gunzip(raw: bytes, chunk_bytes: int = 16 * MIB) -> bytes:
    """Inflate a gzip file (all its members) within the inflation limits.

    Raises TraceError for a corrupt or truncated stream (zlib checks each member's CRC
    and length) and for output past the limits, having inflated at most ~`chunk_bytes`
    past them."""
    import zlib

    guard = InflateGuard(len(raw))
    out: list[bytes] = []
    data = raw
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            while data:
                piece = d.decompress(data, min(chunk_bytes, guard.room()))
                guard.add(len(piece))
                out.append(piece)
                data = d.unconsumed_tail
            while not d.eof:  # input consumed, output may be pending
                piece = d.decompress(b"", min(chunk_bytes, guard.room()))
                if not piece:
                    break
                guard.add(len(piece))
                out.append(piece)
        except zlib.error as e:
            raise TraceError(f"corrupt gzip stream ({e})") from None
        if not d.eof:
            raise TraceError("truncated gzip file (compressed data ends early)")
        data = d.unused_data.lstrip(b"\x00")  # gzip allows zero padding after a member
        if not data:
            return b"".join(out)
        if data[:2] != b"\x1f\x8b":
            raise TraceError("trailing garbage after the gzip stream")


def _stack_depth() -> int:
    f, n = sys._getframe(), 0
    while f is not None:
        n += 1
        f = f.f_back
    return n


@contextmanager
def json_depth(levels: int | None = None) -> Iterator[int]:
    """Let JSON decoding (msgspec, json) nest about `levels` deep (default MAX_JSON_DEPTH)
    and no deeper: both count nesting against Python's recursion limit, which is set to
    the current stack depth plus `levels` for the duration. Decoders raise RecursionError
    past it; `depth_error` turns that into the file's error."""
    levels = get("MAX_JSON_DEPTH") if levels is None else levels
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(_stack_depth() + levels + 8)
    try:
        yield levels
    finally:
        sys.setrecursionlimit(old)


def depth_error() -> TraceError:
    return over("MAX_JSON_DEPTH", "JSON nested too deeply")


# Times past this (146 years from the clock's zero either way) are corrupt, and keeping
# every time within it keeps every difference of two times inside int64. Not a setting.
MAX_ABS_TIME_NS = (1 << 62) - 1
TIME_COLUMNS = ("start_ns", "end_ns", "ts_ns")


def check_tables(tables: dict, warnings: list[str]) -> None:
    """Checks every reader's output gets before it is stored, vectorised over Arrow:
    rows per table and string lengths within the limits, times within ±2^62 ns (raise
    TraceError), and rows that end before they start counted (a warning)."""
    checks = TableChecks()
    for name, table in list(tables.items()):
        tables[name] = checks.check(name, table)
    warnings.extend(checks.warnings())


class TableChecks:
    """`check_tables` for tables that may arrive in parts (a reader streaming into the
    store): rows add up per table against MAX_ROWS, and each warning is given once per
    table, with the count over all its parts, when `warnings()` is asked."""

    def __init__(self):
        self._rows: dict[str, int] = {}
        self._notes: dict[str, dict[str, int]] = {}  # table -> warning text with {n} -> count

    def check(self, name: str, table):
        """`table` (a whole table or its next part) checked, its integer columns in the
        schema's types (values they cannot hold NULLed)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        rows = self._rows[name] = self._rows.get(name, 0) + table.num_rows
        if rows > get("MAX_ROWS"):
            raise over("MAX_ROWS", f"{name}: {rows:,} rows")
        notes = self._notes.setdefault(name, {})
        if not table.num_rows:
            return table

        def note(text: str, n: int) -> None:
            notes[text] = notes.get(text, 0) + n

        table = _fit_numbers(name, table, note)
        max_string = get("MAX_STRING_BYTES")
        for col_name in table.column_names:
            col = table.column(col_name)
            is_dict = pa.types.is_dictionary(col.type)
            values = col.type.value_type if is_dict else col.type
            if pa.types.is_string(values) or pa.types.is_large_string(values):
                # a dictionary column's strings are its dictionaries' (each stored once)
                parts = [c.dictionary for c in col.chunks] if is_dict else [col]
                longest = max((pc.max(pc.binary_length(p)).as_py() or 0 for p in parts), default=0)
                if longest > max_string:
                    raise over("MAX_STRING_BYTES", f"{name}.{col_name}: a string of {longest:,} bytes")
            elif col_name in TIME_COLUMNS and pa.types.is_integer(col.type):
                col = col.cast(pa.int64())
                bad = pc.sum(pc.or_(pc.greater(col, MAX_ABS_TIME_NS), pc.less(col, -MAX_ABS_TIME_NS))).as_py()
                if bad:
                    raise TraceError(f"{name}.{col_name}: {bad:,} time(s) beyond ±2^62 ns (corrupt timestamps)")
        if "start_ns" in table.column_names and "end_ns" in table.column_names:
            backwards = pc.sum(pc.less(table.column("end_ns"), table.column("start_ns"))).as_py()
            if backwards:
                note(f"{name}: {{n}} row(s) end before they start (kept as written)", backwards)
        return table

    def forget(self, name: str) -> None:
        """Drop what was counted for `name` (its parts so far were discarded)."""
        self._rows.pop(name, None)
        self._notes.pop(name, None)

    def warnings(self) -> list[str]:
        return [text.format(n=f"{n:,}") for notes in self._notes.values() for text, n in notes.items()]


def _fit_numbers(name: str, table, note):
    """Give integer columns the schema's type; a value it cannot hold (a grid size of 1e12 in
    an INTEGER column, inf, 1.5) becomes NULL with a warning instead of failing the store.
    Likewise inf and NaN in DOUBLE columns (`1e400` in an ncu CSV): no rule can use them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from . import schema

    spec = {c.name: c.type for c in schema.BY_NAME[name].columns} if name in schema.BY_NAME else {}
    for i, col_name in enumerate(table.column_names):
        col = table.column(i)
        if spec.get(col_name) == "DOUBLE" and pa.types.is_floating(col.type):
            finite = pc.fill_null(pc.is_finite(col), True)
            bad = len(col) - (pc.sum(finite).as_py() or 0)
            if bad:
                note(f"{name}.{col_name}: {{n}} value(s) that are not finite numbers set to NULL", bad)
                table = table.set_column(i, col_name, pc.if_else(finite, col, pa.scalar(None, col.type)))
            continue
        target = {"BIGINT": pa.int64(), "INTEGER": pa.int32()}.get(spec.get(col_name, ""))
        if target is None or col.type == target or not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
            continue
        try:
            fitted = col.cast(target)
        except (pa.ArrowInvalid, OverflowError):
            lo, hi = -(1 << (target.bit_width - 1)), (1 << (target.bit_width - 1)) - 1
            if pa.types.is_integer(col.type):
                ok = pc.and_(pc.greater_equal(col, lo), pc.less_equal(col, hi))
            else:  # floats: finite whole numbers within range (the bounds as floats are close enough)
                ok = pc.and_(pc.and_(pc.is_finite(col), pc.equal(pc.floor(col), col)),
                             pc.and_(pc.greater_equal(col, float(lo)), pc.less(col, float(hi))))
            ok = pc.fill_null(ok, False)
            bad = pc.sum(pc.and_(pc.invert(ok), pc.is_valid(col))).as_py() or 0
            fitted = pc.if_else(ok, col, pa.scalar(None, col.type)).cast(target)
            note(f"{name}.{col_name}: {{n}} value(s) that {target} cannot hold set to NULL", bad)
        table = table.set_column(i, col_name, fitted)
    return table


__all__ = ["LIMITS", "Limit", "get", "show", "over", "check_text_size", "check_pickle_size", "gunzip", "json_depth",
           "depth_error", "InflateGuard", "SQLITE_MIN_ROW_BYTES", "check_tables", "TableChecks", "MAX_ABS_TIME_NS"]
