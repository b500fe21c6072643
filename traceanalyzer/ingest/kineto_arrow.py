"""Small column helpers for the Kineto reader: schema-typed Arrow tables, Kineto time
conversion, tolerant id parsing, and correlation lookups done with numpy."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..schema import BY_NAME, arrow_type as arrow_type_of
from .base import TraceError

NS_PER_US = 1000


def make_table(name: str, columns: dict[str, Any]) -> pa.Table:
    """An Arrow table for schema table `name`, each column cast to the schema's type
    (so a reader bug shows up here, not as a silent type change in the store)."""
    spec = {c.name: c.type for c in BY_NAME[name].columns}
    arrays = {}
    for col, values in columns.items():
        arrow_type = arrow_type_of(spec[col])
        try:
            if isinstance(values, (pa.Array, pa.ChunkedArray)):
                arrays[col] = values.cast(arrow_type)
            else:
                arrays[col] = pa.array(values, type=arrow_type)
        except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
            # e.g. an id past int64: the file is wrong, not the reader.
            first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TraceError(f"{name}.{col}: value does not fit {spec[col]} ({first_line})") from None
    return pa.table(arrays)


def us_to_ns(us: np.ndarray, base_ns: int = 0) -> np.ndarray:
    """Kineto µs (int or float, absolute or relative) to int64 ns: base + round(us*1000).

    The whole and fractional µs are converted apart: `whole * 1000` stays exact in int64
    where `us * 1000` in float64 would not (absolute epoch µs times 1000 is ~1.7e18, past
    2**53), and `us - floor(us)` is exact in float64."""
    whole = np.floor(us)
    frac_ns = np.rint((us - whole) * NS_PER_US).astype(np.int64)
    return whole.astype(np.int64) * NS_PER_US + frac_ns + base_ns


def dur_to_ns(dur_us: np.ndarray) -> np.ndarray:
    return np.rint(dur_us * NS_PER_US).astype(np.int64)


_DIGITS = re.compile(r"-?\d+")


class IdParser:
    """pid/tid values as ints. Legacy traces write tids as strings: `"25738"` on CPU
    threads, `"stream 7"` on GPU lanes; pseudo-processes (`"Spans"`) have no number."""

    def __init__(self) -> None:
        self._cache: dict[str, int | None] = {}

    def __call__(self, value: int | str | None) -> int | None:
        if value is None or isinstance(value, int):
            return value
        try:
            return self._cache[value]
        except KeyError:
            m = _DIGITS.search(value)
            parsed = int(m.group()) if m else None
            self._cache[value] = parsed
            return parsed


def coalesce(*columns: Sequence[Any]) -> list[Any]:
    """Row-wise first non-None value."""
    out = list(columns[0])
    for col in columns[1:]:
        out = [a if a is not None else b for a, b in zip(out, col)]
    return out


def int_or_none(values: Iterable[Any]) -> list[int | None]:
    """Ints, with strings of digits parsed (ROCm writes sizes as `"2560"`)."""
    out: list[int | None] = []
    for v in values:
        if isinstance(v, bool):
            out.append(None)
        elif isinstance(v, int):
            out.append(v)
        elif isinstance(v, str) and v.strip().lstrip("-").isdigit():
            out.append(int(v))
        else:
            out.append(None)
    return out


class CorrelationIndex:
    """Find the API call of each GPU activity by correlation id, vectorised.

    Correlation ids are unique per process; GPU events do not say which process
    launched them, so a correlation id seen on two calls is ambiguous. The first call
    (lowest row) wins and the caller is told how many ids were duplicated."""

    def __init__(self, correlations: Sequence[int | None] | np.ndarray):
        corr = _ids_or_minus_one(correlations)
        rows = np.arange(len(corr), dtype=np.int64)
        keep = corr >= 0
        corr, rows = corr[keep], rows[keep]
        order = np.argsort(corr, kind="stable")
        self._keys, self._rows = corr[order], rows[order]
        first = np.ones(len(self._keys), dtype=bool)
        first[1:] = self._keys[1:] != self._keys[:-1]
        self.duplicated_ids = int(np.count_nonzero(~first))
        self._keys, self._rows = self._keys[first], self._rows[first]

    def rows_for(self, correlations: Sequence[int | None] | np.ndarray) -> np.ndarray:
        """Row of the matching call for each query, -1 where there is none."""
        q = _ids_or_minus_one(correlations)
        if len(self._keys) == 0 or len(q) == 0:
            return np.full(len(q), -1, dtype=np.int64)
        pos = np.clip(np.searchsorted(self._keys, q), 0, len(self._keys) - 1)
        hit = (self._keys[pos] == q) & (q >= 0)
        return np.where(hit, self._rows[pos], -1)


def _ids_or_minus_one(values: Sequence[int | None] | np.ndarray) -> np.ndarray:
    """int64 ids with -1 for None (a numpy array is taken as already filled)."""
    if isinstance(values, np.ndarray):
        return values.astype(np.int64, copy=False)
    return np.array([-1 if c is None else c for c in values], dtype=np.int64)


def raw_json_text(raws: Sequence[Any]) -> pa.Array:
    """msgspec.Raw slices as a string column (NULL where empty), built from one joined
    buffer plus offsets rather than one Python str per row."""
    n = len(raws)
    lengths = np.fromiter((len(r) for r in raws), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    validity = np.packbits(lengths > 0, bitorder="little")
    arr = pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(b"".join(raws)), pa.py_buffer(validity))
    try:
        arr.validate(full=True)  # Raw slices are not UTF-8 checked by msgspec
    except pa.ArrowInvalid:
        arr = pa.array([bytes(r).decode("utf-8", "replace") if len(r) else None for r in raws],
                       type=pa.large_string())
    return arr.cast(pa.string())


def take(column: pa.Array, rows: np.ndarray) -> pa.Array:
    """column[rows] with NULL where rows == -1."""
    if len(column) == 0:
        return pa.nulls(len(rows), type=column.type)
    return column.take(pa.array(rows, mask=rows < 0))
