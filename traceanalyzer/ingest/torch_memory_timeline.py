"""PyTorch profiler memory timeline reader (format ``torch-memory-timeline``): what
``prof.export_memory_timeline(path)`` writes, gzipped when the path ends in ``.gz``.

Two layouts, told apart by their first row (both JSON, both for one device, which the file
does not name; the export's default is ``cuda:0``, so the rows get device 0):

* raw (a path ending ``raw.json.gz``): ``[[time_ns, action, bytes, category], ...]`` in
  time order, one row per change. ``time_ns`` is the profiler's clock (ns since the Unix
  epoch), -1 for a tensor that existed before profiling began (``PREEXISTING``); ``action``
  1-4 is ``torch.profiler._memory_profiler.Action``: preexisting, create, increment_version
  (written as two rows at one time: the bytes leave the old version's category, negative,
  and enter the new one's), destroy (negative bytes); ``category`` 0-7 indexes
  ``_CATEGORY_TO_INDEX``: parameter, optimizer_state, input, temporary, activation,
  gradient, autograd_detail, and 7 for none (stored as ``unknown``).
* plot (any other path): ``[times_us, sizes]``, one time per distinct time step
  (microseconds; the first also stands for the preexisting tensors) and for each the bytes
  held per category after it: ``[0, parameter, optimizer_state, ..., unknown]`` (PyTorch
  stacks the plot from the leading 0). Read as one row per category that changed at a
  step, its change in bytes, with no action.

Output: `memory_timeline` (preexisting rows at the first time of the file, as PyTorch's own
plot puts them) and `devices` (device 0).
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa

from .. import input_limits
from ..resources import Resources
from .base import ParsedTrace, TraceError, as_path

FORMAT = "torch-memory-timeline"
ACTIONS = {1: "preexisting", 2: "create", 3: "increment_version", 4: "destroy"}
CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail",
              "unknown")
# A raw row at the start: four integers.
_RAW_START = re.compile(rb"^\s*\[\s*\[\s*-?\d+\s*,\s*-?\d+\s*,\s*-?\d+\s*,\s*-?\d+\s*\]")


def read(path: str | Path, *, resources: Resources | None = None) -> ParsedTrace:
    """`resources` is accepted for the readers' one signature; a timeline is read on one CPU."""
    path = as_path(path)
    raw = path.read_bytes()
    input_limits.check_text_size(len(raw))
    text = input_limits.gunzip(raw) if raw[:2] == b"\x1f\x8b" else raw
    input_limits.check_text_size(len(text))
    layout = "raw" if _RAW_START.match(text) or text.strip() in (b"[]", b"") else "plot"
    try:
        with input_limits.json_depth():
            if layout == "raw":
                rows = msgspec.json.decode(text, type=list[tuple[int, int, int, int]])
            else:
                times, sizes = msgspec.json.decode(text, type=tuple[list[int], list[list[int]]])
    except RecursionError:
        raise input_limits.depth_error() from None
    except msgspec.ValidationError as e:
        what = ("rows of [time, action, bytes, category]" if layout == "raw"
                else "[times, sizes by category] (the plot layout)")
        raise TraceError(f"memory timeline is no list of {what}: {str(e)[:160]}") from None
    except msgspec.DecodeError as e:
        raise TraceError(f"memory timeline is not valid JSON ({str(e)[:160]})") from None
    table = _raw(rows) if layout == "raw" else _plot(times, sizes)
    if not table.num_rows:
        raise TraceError("memory timeline holds no rows")
    metadata = {"layout": layout, "rows": table.num_rows,
                "device": "not named by the file: export_memory_timeline's default is cuda:0"}
    return ParsedTrace(format=FORMAT, producer="pytorch-profiler", schema_version=layout, clock="unix-epoch",
                       metadata=metadata, tables={"memory_timeline": table,
                                                  "devices": pa.table({"device_id": pa.array([0], pa.int32())})})


def _ints(rows, what: str) -> np.ndarray:
    try:
        return np.array(rows, dtype=np.int64)
    except OverflowError:
        raise TraceError(f"memory timeline: a {what} does not fit 64 bits") from None


def _raw(rows: list[tuple[int, int, int, int]]) -> pa.Table:
    if not rows:
        return _table(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))
    a = _ints(rows, "value").reshape(-1, 4)
    t, action, nbytes, category = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    bad = np.flatnonzero((action < 1) | (action > 4))
    if bad.size:
        raise TraceError(f"memory timeline row {bad[0]}: action {action[bad[0]]} is none of 1-4 "
                         "(preexisting, create, increment_version, destroy)")
    bad = np.flatnonzero((category < 0) | (category >= len(CATEGORIES)))
    if bad.size:
        raise TraceError(f"memory timeline row {bad[0]}: category {category[bad[0]]} is none of 0-7 "
                         f"({', '.join(CATEGORIES)})")
    timed = t[t >= 0]
    t = np.where(t == -1, timed.min() if timed.size else 0, t)
    return _table(t, action, nbytes, category)


def _plot(times: list[int], sizes: list[list[int]]) -> pa.Table:
    if len(times) != len(sizes):
        raise TraceError(f"memory timeline (plot layout): {len(times):,} times but {len(sizes):,} size rows")
    if not sizes:
        return _raw([])
    width = len(CATEGORIES) + 1
    bad = next((i for i, s in enumerate(sizes) if len(s) != width), None)
    if bad is not None:
        raise TraceError(f"memory timeline (plot layout): size row {bad} holds {len(sizes[bad])} values, "
                         f"not {width} (0, then one per category)")
    t = _ints(times, "time")
    if np.abs(t).max() > input_limits.MAX_ABS_TIME_NS // 1000:
        raise TraceError("memory timeline (plot layout): a time beyond ±2^62 ns (corrupt)")
    levels = _ints(sizes, "size")[:, 1:]
    change = np.diff(levels, axis=0, prepend=np.zeros((1, levels.shape[1]), np.int64))
    step, category = np.nonzero(change)
    return _table(t[step] * 1000, None, change[step, category], category)


def _table(t: np.ndarray, action: np.ndarray | None, nbytes: np.ndarray, category: np.ndarray) -> pa.Table:
    n = len(t)
    names = pa.array(CATEGORIES, pa.string())
    return pa.table({
        "event_id": pa.array(np.arange(n, dtype=np.int64)),
        "ts_ns": pa.array(t, pa.int64()),
        "device_id": pa.array(np.zeros(n, np.int32)),
        "action": pa.array([None] * n, pa.string()) if action is None else
        pa.DictionaryArray.from_arrays(pa.array(action - 1, pa.int32()), pa.array(list(ACTIONS.values()))),
        "bytes": pa.array(nbytes, pa.int64()),
        "category": pa.DictionaryArray.from_arrays(pa.array(category, pa.int32()), names),
    })
