"""The data behind the HTML report's timeline: one track per device and stream.

The page draws the timeline itself (assets/report.js); this module decides what goes
into the file. Every GPU operation is shipped while a run has at most `max_ops` of
them, delta-encoded per track. Past that, the longest `max_ops` operations are shipped
one by one and every track also gets a busy-share per time bin (`n_bins` of them over
the run), so a trace with millions of kernels still draws every busy stretch in a file
of bounded size. Findings become markers: each finding's own time range, plus the time
ranges listed in its evidence (the worst gaps, the most exposed copies); a long range
is marked thin (`LONG_MARKER_SHARE`).
"""

from __future__ import annotations

import base64
import math
from typing import Any

from ..rules import evidence_of
from ..rules.evidence import StreamRange, ranges_in
from ..store import Store

MAX_OPS_DEFAULT = 60_000
N_BINS_DEFAULT = 2048
NAME_MAX_CHARS = 240
MAX_MARKERS = 3000
# A marker longer than this share of the timeline is drawn thin (a bracket, not a band): a
# finding about a whole run or a long stretch would otherwise tint every operation under it.
LONG_MARKER_SHARE = 0.02

# Kind codes shared with report.js (KINDS there): colors and legend follow this order.
KIND_CODES = ("kernel", "HtoD copy", "DtoH copy", "other copy", "memset", "unified memory")
_KIND_SQL = """CASE WHEN kind = 'kernel' THEN 0
    WHEN kind = 'memset' THEN 4
    WHEN name LIKE '%(unified)' THEN 5
    WHEN name LIKE 'Memcpy HtoD%' THEN 1
    WHEN name LIKE 'Memcpy DtoH%' THEN 2
    ELSE 3 END"""


def clip(s: Any, n: int = NAME_MAX_CHARS) -> str:
    s = "" if s is None else str(s)
    return s if len(s) <= n else s[: n - 1] + "…"


def timeline_data(store: Store, run_id: str, findings: list[dict], run_start_ns: int | None, *,
                  max_ops: int = MAX_OPS_DEFAULT, n_bins: int = N_BINS_DEFAULT) -> dict | None:
    """The timeline payload of one run (a JSON-able dict), or None when it has no timed GPU work."""
    t0, t1, total = store.sql(
        "SELECT min(start_ns), max(end_ns), count(*) FROM gpu_activity WHERE run_id = ?", [run_id]).fetchall()[0]
    if not total:
        return None
    span = max(int(t1 - t0), 1)
    tracks = store.sql("""
        SELECT device_id, stream_id, count(*) AS n, sum(end_ns - start_ns) AS busy_ns
        FROM gpu_activity WHERE run_id = ? GROUP BY ALL
        ORDER BY device_id NULLS LAST, stream_id NULLS LAST""", [run_id]).fetchall()
    index = {(d, s): i for i, (d, s, _, _) in enumerate(tracks)}
    sampled = total > max_ops
    ops = _ops(store, run_id, t0, max_ops if sampled else None)
    names: dict[str, int] = {}
    out_tracks = []
    for d, s, n, busy in tracks:
        out_tracks.append({"device": d, "stream": s, "count": int(n), "busy_ns": int(busy or 0),
                           "s": [], "d": [], "k": [], "n": [], "max_dur": 0})
    last_start = [0] * len(out_tracks)
    for dev, stream, start, dur, kind, name in ops:
        i = index[(dev, stream)]
        tr = out_tracks[i]
        tr["s"].append(int(start) - last_start[i])  # delta-encoded: small numbers, small file
        last_start[i] = int(start)
        tr["d"].append(int(dur))
        tr["k"].append(int(kind))
        tr["n"].append(names.setdefault(clip(name), len(names)))
        tr["max_dur"] = max(tr["max_dur"], int(dur))
    data: dict[str, Any] = {
        "t0": 0, "span": span,
        # Labels count from the run's start, like the text report's "at ... into the run".
        "origin": int(t0 - run_start_ns) if run_start_ns is not None else 0,
        "kinds": list(KIND_CODES), "names": list(names), "tracks": out_tracks,
        "total_ops": int(total), "shown_ops": len(ops), "sampled": sampled,
        "markers": markers(findings, t0, t1, _item_streams(store, run_id, findings)),
    }
    if sampled:
        bin_ns = max(1, math.ceil(span / n_bins))
        data["bin_ns"] = bin_ns
        data["n_bins"] = math.ceil(span / bin_ns)
        for i, per_kind in _bins(store, run_id, t0, bin_ns, data["n_bins"], index).items():
            out_tracks[i]["bins"] = per_kind
    return data


def _ops(store: Store, run_id: str, t0: int, limit: int | None) -> list[tuple]:
    """(device, stream, start - t0, duration, kind code, name), sorted by track and start;
    with a limit, the longest operations only."""
    pick = "" if limit is None else f"ORDER BY end_ns - start_ns DESC, start_ns LIMIT {int(limit)}"
    return store.sql(f"""
        WITH a AS (SELECT * FROM gpu_activity WHERE run_id = ? {pick})
        SELECT device_id, stream_id, start_ns - ? AS s, end_ns - start_ns AS d, {_KIND_SQL} AS k, name
        FROM a ORDER BY device_id NULLS LAST, stream_id NULLS LAST, s, d""", [run_id, t0]).fetchall()


def _bins(store: Store, run_id: str, t0: int, bin_ns: int, n_bins: int,
          index: dict) -> dict[int, dict[str, str]]:
    """Per track and kind, the busy share of each time bin as base64 bytes (0-255; any
    activity at all is at least 1 so that nothing disappears)."""
    rows = store.sql(f"""
        WITH a AS (
            SELECT device_id, stream_id, {_KIND_SQL} AS k, start_ns - $t0 AS s, end_ns - $t0 AS e
            FROM gpu_activity WHERE run_id = $run_id
        ), b AS (
            SELECT device_id, stream_id, k, s, e, unnest(range(s // $w, e // $w + 1)) AS bin FROM a
        )
        SELECT device_id, stream_id, k, bin,
               sum(least(e, (bin + 1) * $w) - greatest(s, bin * $w)) AS busy_ns
        FROM b WHERE bin < $n GROUP BY ALL""",
        {"t0": t0, "run_id": run_id, "w": bin_ns, "n": n_bins}).fetchall()
    out: dict[int, dict[str, bytearray]] = {}
    for dev, stream, k, b, busy in rows:
        if busy <= 0:
            continue
        per_kind = out.setdefault(index[(dev, stream)], {})
        arr = per_kind.setdefault(str(k), bytearray(n_bins))
        arr[int(b)] = max(1, min(255, math.ceil(255 * busy / bin_ns)))
    return {i: {k: base64.b64encode(bytes(v)).decode() for k, v in kinds.items()} for i, kinds in out.items()}


def _item_streams(store: Store, run_id: str, findings: list[dict]) -> dict[tuple[str, int], int]:
    """The stream of each kernel, copy or memset a finding names without naming its stream,
    so its marker lands on that item's track rather than on the whole device."""
    wanted = [(f["item_kind"], int(f["item_id"])) for f in findings
              if f.get("stream_id") is None and f.get("item_kind") in ("kernel", "copy", "memset")
              and f.get("item_id") is not None]
    if not wanted:
        return {}
    rows = store.sql("""
        SELECT kind, item_id, stream_id FROM gpu_activity
        WHERE run_id = ? AND list_contains(?, kind || ':' || item_id)""",
        [run_id, [f"{k}:{i}" for k, i in wanted]]).fetchall()
    return {(k, int(i)): int(s) for k, i, s in rows if s is not None}


def examples(f: dict) -> list:
    """The examples with a time range a finding's evidence lists (`worst`, `place`), as its
    rule's types (rules.evidence.TimeRange)."""
    return ranges_in(evidence_of(f.get("rule_id"), f.get("evidence")))


def markers(findings: list[dict], t0: int, t1: int,
            item_streams: dict[tuple[str, int], int] | None = None) -> list[dict]:
    """One marker per time range a finding points at, relative to the timeline's start:
    `f` the finding's index in the run's list, `s`/`e` the range, `dev`/`st` the track
    (None: every track of the device / of the run), `sev` its severity, `main` whether it
    is the finding's own range rather than an example from its evidence, `long` whether it
    spans more than `LONG_MARKER_SHARE` of the timeline (drawn thin)."""
    out, seen = [], set()
    longest = LONG_MARKER_SHARE * max(t1 - t0, 1)
    item_streams = item_streams or {}
    for i, f in enumerate(findings):
        cands = []
        stream = f.get("stream_id")
        if stream is None and f.get("item_id") is not None:
            stream = item_streams.get((f.get("item_kind"), int(f["item_id"])))
        if f.get("start_ns") is not None:
            end = f.get("end_ns") if f.get("end_ns") is not None else f["start_ns"]
            cands.append((f["start_ns"], end, stream, True))
        for r in examples(f):
            on = r.stream_id if isinstance(r, StreamRange) and r.stream_id is not None else stream
            cands.append((r.start_ns, r.end_ns, on, False))
        for s, e, st, main in cands:
            if e < t0 or s > t1:
                continue
            key = (i, s, e, st)
            if key in seen:
                continue
            seen.add(key)
            out.append({"f": i, "s": int(s - t0), "e": int(max(e, s) - t0), "dev": f.get("device_id"),
                        "st": None if st is None else int(st), "sev": f["severity"], "main": main,
                        "long": e - s > longest})
    # Keep each finding's own range first, then examples, within the cap.
    out.sort(key=lambda m: (not m["main"], m["f"], m["s"]))
    return out[:MAX_MARKERS]
