"""Arrow column helpers of the nsys reader: ordering, dictionary encoding, code-to-word
mapping and scattering, each vectorised (worked out per distinct value where it can)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

STR = pa.string()


def array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def concat(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array) -> pa.Array:
    if not len(b):
        return array(a)
    return pa.concat_arrays([array(a), array(b).cast(a.type)])


def order(start: pa.ChunkedArray | pa.Array) -> np.ndarray | None:
    """Row order by (start, file order), as ORDER BY start_ns, src_row (NULLs last); None
    when the rows are in that order already (the usual case for kernels)."""
    start = array(start)
    if start.null_count:
        return pc.array_sort_indices(start, null_placement="at_end").to_numpy()  # a stable sort
    a = start.to_numpy()
    if len(a) < 2 or bool(np.all(a[1:] >= a[:-1])):
        return None
    return np.argsort(a, kind="stable")


def take(col: pa.ChunkedArray | pa.Array, order: np.ndarray | None) -> pa.Array:
    col = array(col)
    return col if order is None else col.take(order)


def dictionary(indices: pa.Array, values: pa.Array) -> pa.DictionaryArray:
    """Rows `values[indices]` as a dictionary array whose dictionary holds each distinct
    non-NULL value once (a NULL value or index gives a NULL row)."""
    distinct = pc.unique(pc.drop_null(values))
    codes = pc.take(pc.index_in(values, distinct), indices)
    return pa.DictionaryArray.from_arrays(codes.cast(pa.int32()), distinct.cast(STR))


def enum(codes: pa.Array, mapping: dict, default: object, typ: pa.DataType = STR) -> pa.Array:
    """nsys_enums.sql_case in Arrow, worked out once per distinct code: NULL stays NULL,
    an unknown code becomes `default`. Strings come back dictionary-encoded."""
    encoded = pc.dictionary_encode(array(codes))
    values = pa.array([mapping.get(c, default) for c in encoded.dictionary.to_pylist()], typ)
    if typ == STR:
        return dictionary(encoded.indices, values)
    return pc.take(values, encoded.indices)


def scatter(n: int, rows: np.ndarray, values: pa.ChunkedArray) -> pa.Array:
    """An array of n NULLs with `values` placed at `rows`."""
    values = array(values)
    out = np.zeros(n, dtype=values.type.to_pandas_dtype())
    out[rows] = pc.fill_null(values, 0).to_numpy()
    valid = np.zeros(n, dtype=bool)
    valid[rows] = pc.is_valid(values).to_numpy(zero_copy_only=False)
    return pa.array(out, mask=~valid)


class CallIndex:
    """The API calls' (correlation id, process) pairs, sorted once, so that GPU rows find
    their call part by part with a binary search instead of a hash join over every call.

    A pair is one int64: the process's code among the few distinct processes in the high
    32 bits, the correlation id's offset from the smallest in the low 32. `build` gives
    None where that does not fit, or where a pair repeats (the first call must then be
    chosen, which the reader's grouped join does)."""

    def __init__(self, processes: pa.Array, low: int, high: int, keys: np.ndarray, rows: np.ndarray):
        self.processes, self.low, self.high, self.keys, self.rows = processes, low, high, keys, rows

    @classmethod
    def build(cls, corr: pa.Array, process: pa.Array) -> "CallIndex | None":
        corr, process = array(corr), array(process)
        valid = None
        if corr.null_count or process.null_count:  # rare: only calls with both can be found
            valid = pc.and_(pc.is_valid(corr), pc.is_valid(process))
            corr, process = pc.filter(corr, valid), pc.filter(process, valid)
        if not len(corr):
            return cls(pa.array([], process.type), 0, 0, np.empty(0, np.int64), np.empty(0, np.int32))
        bounds = pc.min_max(corr)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        processes = pc.unique(process)
        if high - low >= 1 << 32 or len(processes) >= 1 << 31:
            return None
        keys = cls._keys(pc.index_in(process, processes).to_numpy(), corr.to_numpy(), low)
        order = np.argsort(keys, kind="stable")  # calls are near key order already: cheap
        keys = keys[order]
        if len(keys) > 1 and bool(np.any(keys[1:] == keys[:-1])):
            return None
        if valid is not None:  # back to positions among all calls
            order = np.flatnonzero(valid.to_numpy(zero_copy_only=False))[order]
        return cls(processes, low, high, keys, order.astype(np.int32) if len(order) < 1 << 31 else order)

    @staticmethod
    def _keys(codes: np.ndarray, corr: np.ndarray, low: int) -> np.ndarray:
        """code << 32 | (corr - low), built in place (8 bytes a row, no temporaries)."""
        keys = codes.astype(np.int64)
        keys <<= 32
        keys += corr  # corr - low < 2^32, so adding is OR-ing
        keys -= low
        return keys

    def find(self, corr: pa.Array, process: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(GPU rows that have a call, the row of each one's call)."""
        corr, process = array(corr), array(process)
        code = pc.index_in(process, self.processes)
        ok = pc.and_(pc.is_valid(code), pc.and_(pc.greater_equal(corr, self.low), pc.less_equal(corr, self.high)))
        rows = np.flatnonzero(pc.fill_null(ok, False).to_numpy(zero_copy_only=False))
        if not len(rows) or not len(self.keys):
            return rows[:0], rows[:0]
        keys = self._keys(pc.fill_null(code, 0).to_numpy()[rows], pc.fill_null(corr, 0).to_numpy()[rows], self.low)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        hit = self.keys[at] == keys
        return rows[hit], self.rows[at[hit]]
