"""A `Collector` (and the top-level keys after the array) as bytes, and back: how the
helper process of a split read hands its part to the main one (`kineto_split`).

Not pickle: nothing read from a pipe may run code. The format is a JSON header (counts,
samples, names, the columns' layout) and one Arrow IPC stream per collected part, each
length-prefixed. Columns come back with the types they left with (numpy arrays as numpy,
Arrow as Arrow, lists as lists), so the merged Collector builds the same tables.
"""

from __future__ import annotations

import json
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
from msgspec import Raw

from .kineto_collect import Collector

_LEN = 8  # bytes of each little-endian length prefix


class WireError(Exception):
    """The bytes are not what `dump` writes (a helper that died half-way, or other output)."""


def dump(collector: Collector, top: dict[str, Raw], out: BinaryIO) -> None:
    parts_meta: list[dict[str, Any]] = []
    batches: list[pa.RecordBatch] = []
    for role, r in collector.roles.items():
        for cat, parts in r.parts.items():
            for part in parts:
                meta, batch = _part(part)
                parts_meta.append({"role": role, "cat": cat, **meta})
                batches.append(batch)
    header = {
        "roles": {role: {"total": r.total, "missing": r.missing, "negative": r.negative,
                         "names": [[cat, names] for cat, names in r.names.items()]}
                  for role, r in collector.roles.items()},
        "cat_order": list(collector.cat_order),
        "counts": [[cat, n] for cat, n in collector._counts.items()],
        "n_events": collector.n_events, "first_ph": collector.first_ph, "ts_sample": collector.ts_sample,
        # Raw JSON text is bytes that msgspec did not UTF-8-check: latin-1 maps them 1:1.
        "top": [[key, bytes(raw).decode("latin-1")] for key, raw in top.items()],
        "parts": parts_meta,
    }
    _write(out, json.dumps(header).encode())
    for batch in batches:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        _write(out, sink.getvalue())


def load(src: BinaryIO, max_bytes: int) -> tuple[Collector, dict[str, Raw]]:
    """What `dump` wrote; WireError for anything else (no piece may claim over `max_bytes`)."""
    read = lambda: _read(src, max_bytes)  # noqa: E731
    try:
        header = json.loads(read())
        c = Collector()
        for role, h in header["roles"].items():
            r = c.roles[role]
            r.total, r.missing, r.negative = h["total"], h["missing"], h["negative"]
            r.names = {cat: names for cat, names in h["names"]}
        c.cat_order = dict.fromkeys(header["cat_order"])
        c._counts = {cat: n for cat, n in header["counts"]}
        c.n_events, c.first_ph, c.ts_sample = header["n_events"], header["first_ph"], header["ts_sample"]
        for meta in header["parts"]:
            batch = pa.ipc.open_stream(pa.py_buffer(read())).read_next_batch()
            c.roles[meta["role"]].parts.setdefault(meta["cat"], []).append(_unpart(meta, batch))
        top = {key: Raw(text.encode("latin-1")) for key, text in header["top"]}
    except (ValueError, KeyError, TypeError, pa.ArrowException) as e:
        raise WireError(str(e)) from None
    return c, top


def _part(part: dict[str, Any]) -> tuple[dict[str, Any], pa.RecordBatch]:
    """One part's columns: numpy and Arrow ones into a record batch, lists into the header."""
    layout, arrays, names, lists = [], [], [], {}
    for name, col in part.items():
        if isinstance(col, np.ndarray):
            layout.append([name, "numpy", col.dtype.str])
            arrays.append(pa.array(col))
        elif isinstance(col, pa.ChunkedArray):
            layout.append([name, "chunked"])
            arrays.append(col.combine_chunks())
        elif isinstance(col, pa.Array):
            layout.append([name, "arrow"])
            arrays.append(col)
        else:  # values no Arrow type holds (ints past int64, strings with lone surrogates)
            layout.append([name, "list"])
            lists[name] = list(col)
            continue
        names.append(name)
    return {"layout": layout, "lists": lists}, pa.RecordBatch.from_arrays(arrays, names=names)


def _unpart(meta: dict[str, Any], batch: pa.RecordBatch) -> dict[str, Any]:
    part: dict[str, Any] = {}
    for name, kind, *dtype in meta["layout"]:
        if kind == "list":
            part[name] = meta["lists"][name]
            continue
        col = batch.column(name)
        if kind == "numpy":
            part[name] = np.array(col.to_numpy(zero_copy_only=False), dtype=np.dtype(dtype[0]))
        elif kind == "chunked":
            part[name] = pa.chunked_array([col])
        else:
            part[name] = col
    return part


def _write(out: BinaryIO, data) -> None:
    out.write(len(data).to_bytes(_LEN, "little"))
    out.write(data)


def _read(src: BinaryIO, max_bytes: int) -> bytes:
    size = int.from_bytes(_exactly(src, _LEN), "little")
    if size > max_bytes:
        raise WireError(f"a piece of {size} bytes")
    return _exactly(src, size)


def _exactly(src: BinaryIO, n: int) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise WireError("ended early")
    return data
