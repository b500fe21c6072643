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
