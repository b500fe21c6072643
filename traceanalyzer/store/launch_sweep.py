"""The innermost host frame open at each GPU operation's launch, computed by sorting and binary
search in NumPy: the same answer as the `launch_context` view, in time linear in the frames
and launches after one sort per thread, and in memory bounded by one slice of a thread.

The view sweeps every thread's frame boundaries and launch points in one window over DuckDB's
sort; with tens of millions of NVTX ranges on one or two threads that window has one or two
partitions, runs on one core and cannot spill (an nsys export of 5 M kernels and 24 M ranges
ran out of a 1 GB cap). Here the same sweep is counted instead of walked, on each thread:

* the frames open just after a launch at `t` are those started at or before `t` less those
  ended at or before `t` (`open(t)`, one binary search in the sorted starts and one in the
  sorted ends; ends and starts at `t` come before the launch, as in the view's order);
* a frame's level is the count open just after its start, in the view's order (frames starting
  together: the longer first, then by id; frames ending at that time closed before it);
* the innermost frame at `t` is the last frame, in start order, of level `open(t)` to start at
  or before `t`, named only if it is still open at `t` (where frames overlap only in part, the
  one found may have closed: none is named, as in the view).

A thread's frames are taken in slices of time (`SLICE_FRAMES` a slice), each read once, by its
start: what a slice needs of the time before it is three numbers, one frame per level (the
starts and ends counted before it, and the last frame of each level to start) and the ends of
the frames still open (a few: the nesting at the slice's start), so a thread of any length fits
in the memory of a slice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..analyses import attribution

if TYPE_CHECKING:
    import duckdb

# Frames of a thread in one slice: ~2 M frames hold ~100 MB of NumPy arrays at once.
SLICE_FRAMES = 2_000_000
_I64 = np.int64


def probes_sql(kinds: tuple[str, ...]) -> str:
    """The launch points of run $run_id's GPU operations of `kinds` (attribution.launch_probes_sql):
    kind, item_id, pid, tid, at_ns."""
    listed = ", ".join(f"'{k}'" for k in kinds)
    return f"""
        SELECT kind, item_id, pid, tid, at_ns FROM ({attribution.launch_probes_sql("run_id = $run_id")})
        WHERE at_ns IS NOT NULL AND kind IN ({listed})"""


def innermost_frames(con: duckdb.DuckDBPyConnection, run_id: str, sources: tuple[str, ...],
                     kinds: tuple[str, ...] = ("kernel", "copy", "memset"),
                     slice_frames: int = SLICE_FRAMES) -> pa.Table:
    """Per GPU operation of run `run_id` of `kinds` with a launch point: `kind`, `item_id` and,
    for each of `sources` (attribution.FRAME_SOURCES), the innermost frame of that source open at the
    launch (`<column>_id` as in launch_context; NULL: none), as the `launch_context` view
    places it; a thread's frames taken about `slice_frames` at a time."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE _ta_sweep_probes AS {probes_sql(kinds)}", {"run_id": run_id})
    try:
        out = con.sql("SELECT kind, item_id FROM _ta_sweep_probes ORDER BY rowid").to_arrow_table()
        for source in sources:
            found = np.full(out.num_rows, -1, dtype=_I64)
            _sweep_source(con, run_id, source, found, slice_frames)
            column = pa.array(found, mask=found < 0)
            out = out.append_column(attribution.launch_context_column(source), column)
        return out
    finally:
        con.execute("DROP TABLE IF EXISTS _ta_sweep_probes")


def _sweep_source(con, run_id: str, source: str, found: np.ndarray, slice_frames: int) -> None:
    """Fill `found` (one entry per probe, by the probes' rowid) with the innermost frame of
    `source` at each probe."""
    frames = f"""(SELECT pid, tid, frame_id, start_ns, end_ns FROM ({attribution.frame_rows_sql("run_id = $run_id", (source,))})
                  WHERE end_ns > start_ns)"""
    threads = con.execute(f"""
        SELECT pid, tid, count(*) AS n, min(start_ns), max(end_ns) FROM {frames} GROUP BY ALL
        """, {"run_id": run_id}).fetchall()
    for pid, tid, n, lo, hi in threads:
        _sweep_thread(con, run_id, frames, (pid, tid), -(-n // slice_frames), lo, hi, found)


def _sweep_thread(con, run_id: str, frames: str, thread: tuple, slices: int, lo: int, hi: int,
                  found: np.ndarray) -> None:
    """One thread's probes, in `slices` slices of equal time from `lo` to `hi`."""
    params = {"run_id": run_id, "pid": thread[0], "tid": thread[1]}
    rows, t = _columns(con, "SELECT rowid, at_ns FROM _ta_sweep_probes WHERE pid = $pid AND tid = $tid", params)
    if not len(t):
        return
    order = np.argsort(t, kind="stable")
    rows, t = rows[order], t[order]
    edges = [lo + (hi + 1 - lo) * k // slices for k in range(slices + 1)]
    carry = _Carry()
    still_open = np.empty(0, dtype=_I64)  # the ends of the frames started before the slice and open at its start
    for a, b in zip(edges, edges[1:]):
        # the frames that start in [a, b): a range of start times, which the store's row groups
        # (in start order) skip to; the frames ending in it started there or are still open
        s, e, ids = _columns(con, f"""SELECT start_ns, end_ns, frame_id FROM {frames}
                                      WHERE pid = $pid AND tid = $tid AND $a <= start_ns AND start_ns < $b""",
                             {**params, "a": a, "b": b})
        starts = _in_start_order(s, e, ids)
        ended = np.concatenate([still_open, e])
        # (a stable sort is a merge sort that finds the runs of NVTX's nearly sorted times)
        ends = np.sort(ended[ended < b], kind="stable")
        still_open = ended[ended >= b]
        if b == edges[-1]:  # probes past the last end see no frame open; those before `lo` none either
            b = None
        i, j = np.searchsorted(t, [a, b if b is not None else t[-1] + 1])
        _slice(starts, ends, (rows[i:j], t[i:j]), carry, found)


def _in_start_order(s: np.ndarray, e: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """Frames in the view's order: by start, frames starting together the longer first, then by
    id. Where no two start together, the start alone orders them: one stable sort of nearly
    sorted times instead of a three-key sort."""
    order = np.argsort(s, kind="stable")
    ordered = s[order]
    if len(ordered) > 1 and (ordered[1:] == ordered[:-1]).any():
        order = np.lexsort((ids, -e, s))
    return s[order], e[order], ids[order]


class _Carry:
    """What a slice needs of the thread's time before it."""

    def __init__(self) -> None:
        self.starts = 0  # frames started before the slice
        self.ends = 0    # frames ended before the slice
        self.last = {}   # level -> (start_ns, end_ns, frame_id) of the last frame of that level to start


def _slice(starts: tuple, ends: np.ndarray, probes: tuple, carry: _Carry, found: np.ndarray) -> None:
    s, e, ids = starts
    # each frame's level: the frames open just after its start (ends at its start time came first)
    level = carry.starts + np.arange(1, len(s) + 1, dtype=_I64) - (carry.ends + np.searchsorted(ends, s, "right"))
    # levels are small: as int32 the stable sort is a radix sort
    by_level = np.argsort(level.astype(np.int32), kind="stable")  # start order kept within a level
    levels = level[by_level]
    rows, t = probes
    if len(t):
        open_ = (carry.starts + np.searchsorted(s, t, "right")) - (carry.ends + np.searchsorted(ends, t, "right"))
        for lv in np.unique(open_[open_ > 0]).tolist():
            at = open_ == lv
            a, b = np.searchsorted(levels, [lv, lv + 1])
            members = by_level[a:b]
            i = np.searchsorted(s[members], t[at], "right") - 1
            inside = i >= 0
            frame = np.full(len(i), -1, dtype=_I64)
            end = np.full(len(i), np.iinfo(_I64).min, dtype=_I64)
            picked = members[i[inside]]
            frame[inside], end[inside] = ids[picked], e[picked]
            before = carry.last.get(lv)
            if before is not None:  # the last frame of that level started in an earlier slice
                frame[~inside], end[~inside] = before[2], before[1]
            found[rows[at]] = np.where(end > t[at], frame, -1)
    if len(levels):  # each level's last frame in start order: the last of its run in by_level
        last = np.flatnonzero(np.diff(levels, append=levels[-1] + 1))
        for v, k in zip(levels[last].tolist(), by_level[last].tolist()):
            carry.last[v] = (int(s[k]), int(e[k]), int(ids[k]))
    carry.starts += len(s)
    carry.ends += len(ends)


def _columns(con, sql: str, params: dict) -> tuple[np.ndarray, ...]:
    """The query's columns as NumPy int64 arrays."""
    used = {k: v for k, v in params.items() if f"${k}" in sql}
    table = con.sql(sql, params=used).to_arrow_table()
    return tuple(table.column(i).to_numpy().astype(_I64, copy=False) for i in range(table.num_columns))
