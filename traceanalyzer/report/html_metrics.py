"""Numbers behind the report's roofline, stall and memory plots.

Roofline: each kernel is placed where rule B003 put it (its evidence: compute and memory
% of peak, or FLOPs, DRAM bytes, intensity and the peaks it used). Runs that B003 did not
evaluate (an older store, the rule ignored) show every kernel of B003's roofline analysis
(`kernel_roofline`), the numbers the rule classifies. Stall profiles are the `stall_profiles` analysis that rule
I001 reports from, for every kernel with stall metrics, flagged or not. The memory curve is
the `memory_levels` analysis (M001's) over time, a few hundred columns wide, with the peak
M001 reports where it did; for a memory snapshot, its recorded history replayed
(`summary.HISTORY_LEVELS_SQL`, the levels M003 and M004 read). A memory timeline is stacked
by category from `summary.TIMELINE_STEPS_SQL`, its peak the one `summary.timeline_peaks` (and
rule M005) finds; a snapshot's segments and blocks are laid out for the segment map.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .. import summary
from ..fmt import _missing
# The categories of PyTorch's memory profiler, in the order its own plot stacks them.
from ..ingest.torch_memory_timeline import CATEGORIES as TIMELINE_CATEGORIES
from ..link import run_roles
from ..rules import evidence_of, get_rule
from ..store import Store

MAX_ROOFLINE_KERNELS = 40
MAX_STALL_KERNELS = 12
MEMORY_COLUMNS = 600

def _f(x) -> float | None:
    """A plain float, or None for NULL / NaN / pandas NA."""
    if _missing(x):
        return None
    x = float(x)
    return None if math.isnan(x) else x


FAMILY_LABEL = {"fp32": "FP32", "fp64": "FP64", "half": "FP16", "tensor": "tensor core"}


def roofline(store: Store, run_id: str, findings: list[dict]) -> list[dict]:
    """Roofline charts of a run (none, one, or an absolute and a normalized one).

    Absolute charts plot FLOP/s against FLOP per DRAM byte under the device's roofs.
    Normalized ones come from Speed-of-Light shares alone: x = compute share / memory share
    (1 is the ridge point) and y = compute share of peak, so the roof is min(1, x) on any GPU.
    The kernels are B003's findings; where the rule did not run, every kernel of B003's
    roofline analysis (`kernel_roofline`).
    """
    b003 = [(f.get("item_name") or "?", _roofline_numbers(evidence_of("B003", f["evidence"]))) for f in findings
            if f["rule_id"] == "B003" and f.get("evidence")]
    if b003:
        return _charts(b003, "B003")
    return _charts(_analysed_kernels(store, run_id), "metrics")


def _roofline_numbers(ev) -> dict:
    """What a chart reads of a B003 finding's evidence (its rule's type)."""
    return {"source": ev.source, "launches": ev.launches, "calls": ev.calls, "duration_ns": ev.duration_ns,
            "bound": ev.bound, "estimate": ev.estimate, "compute_pct": ev.compute_pct, "memory_pct": ev.memory_pct,
            "flops": ev.flops, "dram_bytes": ev.dram_bytes, "intensity": ev.intensity, "roof_family": ev.roof_family,
            "peak_flops": ev.peak_flops, "peak_bw": ev.peak_bw}


def _analysed_kernels(store: Store, run_id: str) -> list[tuple[str, dict]]:
    """(kernel, the same numbers) per kernel of B003's roofline analysis of a run with ncu metrics."""
    if run_roles(store, [run_id]).get(run_id) != "ncu":
        return []
    g = get_rule("B003").analysis(store, run_id)
    out = []
    for r in ([] if g.empty else g.to_dict("records")):
        fam = r.get("roof_family")
        fam = fam if isinstance(fam, str) else None
        out.append((r["name"], {
            "source": r["source"], "launches": r["launches"], "duration_ns": r["duration_ns"],
            "compute_pct": r["compute_pct"], "memory_pct": r["memory_pct"], "flops": r["flops"],
            "dram_bytes": r["dram_bytes"], "intensity": r["intensity"], "roof_family": fam,
            "peak_flops": r.get(f"peak_{fam}") if fam else None, "peak_bw": r["peak_bw"]}))
    return out


def _charts(kernels: list[tuple[str, dict]], source: str) -> list[dict]:
    """The charts of (kernel, numbers) pairs: an absolute one for those placed by FLOPs and DRAM
    bytes, a normalized one for those placed by Speed-of-Light shares."""
    absolute, sol, roofs, bws = [], [], {}, []
    for kernel, ev in kernels:
        base = {"kernel": kernel, "launches": int(ev.get("launches") or ev.get("calls") or 1),
                "dur_ns": _f(ev.get("duration_ns")), "bound": ev.get("bound"), "estimate": bool(ev.get("estimate"))}
        flop, dram, dur = _f(ev.get("flops")), _f(ev.get("dram_bytes")), _f(ev.get("duration_ns"))
        if ev.get("source") != "sol" and flop and dram and dur and _f(ev.get("intensity")):
            absolute.append({**base, "ai": _f(ev["intensity"]), "flops_per_s": flop / (dur / 1e9),
                             "flop": flop, "dram_bytes": dram})
            fam = FAMILY_LABEL.get(ev.get("roof_family"), str(ev.get("roof_family") or "compute"))
            if _f(ev.get("peak_flops")):
                roofs[fam] = max(roofs.get(fam, 0), _f(ev["peak_flops"]))
            if _f(ev.get("peak_bw")):
                bws.append(_f(ev["peak_bw"]))
        elif _f(ev.get("compute_pct")) is not None and _f(ev.get("memory_pct")):
            c, m = _f(ev["compute_pct"]) / 100, _f(ev["memory_pct"]) / 100
            sol.append({**base, "sm_share": c, "mem_share": m, "x": c / m, "y": c})
    charts = []
    by_time = lambda p: -(p["dur_ns"] or 0)  # noqa: E731
    if absolute:
        absolute.sort(key=by_time)
        charts.append({"mode": "absolute", "source": source, "bandwidth_bytes_per_s": max(bws) if bws else None,
                       "roofs": [{"label": k, "flops_per_s": v} for k, v in sorted(roofs.items(), key=lambda kv: -kv[1])],
                       "points": absolute[:MAX_ROOFLINE_KERNELS], "kernels_total": len(absolute),
                       "estimate": any(p["estimate"] for p in absolute)})
    if sol:
        sol.sort(key=by_time)
        charts.append({"mode": "sol", "source": source, "points": sol[:MAX_ROOFLINE_KERNELS], "kernels_total": len(sol)})
    return charts


def stalls(store: Store, run_id: str, findings: list[dict]) -> dict | None:
    """Stall profiles of the kernels with stall metrics (the stall_profiles analysis, which rule
    I001 reports from), flagged or not; the kernels I001 flagged are marked."""
    rows = store.sql("SELECT name, profile, launches, est_loss_ns, reason, share FROM stall_profiles "
                     "WHERE run_id = ? AND share IS NOT NULL", [run_id]).fetchall()
    if not rows:
        return None
    flagged = {f["item_name"] for f in findings if f["rule_id"] == "I001"}
    kernels = [{"kernel": name, "profile": json.loads(profile) if profile else {}, "launches": launches,
                "est_loss_ns": _f(loss), "flagged": name in flagged, "top": reason, "top_share": _f(share)}
               for name, profile, launches, loss, reason, share in rows]
    kernels.sort(key=lambda x: (-(x["est_loss_ns"] or -1), -(x["top_share"] or 0), x["kernel"] or ""))
    return {"kernels": kernels[:MAX_STALL_KERNELS], "kernels_total": len(kernels)}


# Allocated memory after each allocator event, per device: the `memory_levels` view (rule M001's),
# or a snapshot's history replayed (its events without a time, PyTorch 2.0's, left out).
_CURVE = """
WITH curve AS (
    SELECT device_type, device_id, ts_ns, event_id, has_totals AS recorded, allocated_bytes AS allocated,
           reserved_bytes AS reserved, false AS history
    FROM memory_levels WHERE run_id = $run_id
    UNION ALL
    SELECT 'cuda', device_id, ts_ns, event_id, true, allocated, reserved, true
    FROM ({history}) WHERE ts_ns IS NOT NULL
)""".replace("{history}", summary.HISTORY_LEVELS_SQL)

MEMORY_SQL = _CURVE + """, bounds AS (SELECT min(ts_ns) AS t0, greatest(max(ts_ns) - min(ts_ns), 1) AS span FROM curve)
SELECT device_type, device_id, any_value(recorded) AS recorded,
       least(CAST(floor((ts_ns - t0) * $cols / span) AS BIGINT), $cols - 1) AS col,
       min(allocated) AS lo, max(allocated) AS hi, arg_max(allocated, (ts_ns, event_id)) AS last,
       max(reserved) AS reserved
FROM curve, bounds GROUP BY ALL ORDER BY device_type, device_id, col
"""

PEAK_SQL = _CURVE + """
SELECT device_type, device_id, any_value(recorded) AS recorded, count(*) AS events,
       max(allocated) AS peak_bytes, arg_min(ts_ns, (-allocated, ts_ns, event_id)) AS peak_ts_ns,
       min(ts_ns) AS first_ns, max(ts_ns) AS last_ns, bool_or(history) AS history
FROM curve GROUP BY ALL ORDER BY device_type DESC, device_id
"""


def memory(store: Store, run_id: str, run_start_ns: int | None, findings: list[dict] = ()) -> dict | None:
    """Allocated bytes over time per device, min/max per column, with each device's peak:
    the one rule M001 reports for that GPU where it did, else the curve's first maximum."""
    peaks = store.sql(PEAK_SQL, {"run_id": run_id}).fetchall()
    if not peaks:
        return None
    cols = store.sql(MEMORY_SQL, {"run_id": run_id, "cols": MEMORY_COLUMNS}).fetchall()
    t0 = min(p[6] for p in peaks)
    t1 = max(p[7] for p in peaks)
    origin = run_start_ns if run_start_ns is not None else t0
    series: dict[tuple, dict[str, Any]] = {}
    for dtype, dev, recorded, n, peak, peak_ts, _, _, history in peaks:
        series[(dtype, dev)] = {"device_type": dtype, "device_id": dev, "recorded": bool(recorded),
                                "history": bool(history), "events": int(n), "peak_bytes": _f(peak),
                                "peak_at_ns": int(peak_ts - origin), "cols": []}
    for dtype, dev, _, col, lo, hi, last, reserved in cols:
        series[(dtype, dev)]["cols"].append([int(col), _f(lo), _f(hi), _f(last), _f(reserved)])
    for f in findings:
        ev = evidence_of("M001", f.get("evidence")) if f["rule_id"] == "M001" else None
        s = series.get(("cuda", f.get("device_id")))
        if s and ev is not None and ev.peak_allocated_bytes is not None and ev.peak_allocated_start_ns is not None:
            s.update(peak_bytes=_f(ev.peak_allocated_bytes), peak_at_ns=int(ev.peak_allocated_start_ns - origin),
                     peak_source="M001")
    return {"t0_ns": int(t0 - origin), "span_ns": int(max(t1 - t0, 1)), "columns": MEMORY_COLUMNS,
            "series": list(series.values())}


# -- memory by category (a memory timeline) ----------------------------------------------------

def memory_categories(store: Store, run_id: str, run_start_ns: int | None) -> list[dict]:
    """Per device of a memory timeline, the bytes of each category over time in `columns`
    columns: in each column the time step holding the most memory (so the peak shows whole),
    a column without steps holding the level the last one left. With the peak of
    `summary.timeline_peaks` and its split."""
    import numpy as np

    peaks = {p["device_id"]: p for p in summary.timeline_peaks(store, run_id)}
    if not peaks:
        return []
    rows = store.sql(f"SELECT device_id, ts_ns, category, change FROM ({summary.TIMELINE_STEPS_SQL}) "
                     "ORDER BY device_id, ts_ns", {"run_id": run_id}).fetchall()
    out = []
    for device, peak in sorted(peaks.items()):
        mine = [r for r in rows if r[0] == device]
        names = [c for c in TIMELINE_CATEGORIES if any(r[2] == c for r in mine)]
        times = sorted({r[1] for r in mine})
        at = {t: i for i, t in enumerate(times)}
        change = np.zeros((len(times), len(names)))
        for _, t, c, n in mine:
            change[at[t], names.index(c)] += n
        levels = np.cumsum(change, axis=0)  # after each time step, per category
        t0, t1 = times[0], times[-1]
        span = max(t1 - t0, 1)
        col = np.minimum(((np.array(times) - t0) * MEMORY_COLUMNS // span).astype(int), MEMORY_COLUMNS - 1)
        total = levels.sum(axis=1)
        shown, last = [], None
        for c in range(MEMORY_COLUMNS):
            idx = np.flatnonzero(col == c)
            if idx.size:
                shown.append(levels[idx[np.argmax(total[idx])]].tolist())  # argmax: the first at the highest
                last = levels[idx[-1]].tolist()
            else:
                shown.append(last)
        origin = run_start_ns if run_start_ns is not None else t0
        out.append({"device_id": device, "categories": names, "columns": shown, "t0_ns": int(t0 - origin),
                    "span_ns": int(span), "peak_bytes": peak["total"], "peak_at_ns": int(peak["ts_ns"] - origin),
                    "peak_split": peak["categories"], "steps": len(times)})
    return out


# -- segment map (a memory snapshot) -----------------------------------------------------------

SEGMENTS_SQL = """
SELECT s.device_id, s.segment_id, s.address, s.total_bytes, s.stream_id, s.segment_type, s.pool_id, s.is_expandable,
       list((b.address - s.address, b.bytes, b.state, b.requested_bytes) ORDER BY b.address, b.block_id)
         FILTER (WHERE b.block_id IS NOT NULL) AS blocks
FROM memory_segments s LEFT JOIN memory_blocks b ON b.run_id = s.run_id AND b.segment_id = s.segment_id
WHERE s.run_id = $run_id
GROUP BY ALL ORDER BY s.device_id, s.address, s.segment_id
"""


def segment_map(store: Store, run_id: str) -> list[dict]:
    """Per device of a snapshot, its segments in address order, each with its blocks (offset in
    the segment, bytes, state, requested bytes), the state's numbers (`summary.snapshot_state`)
    and where the largest free block is (segment and block index, the first of that size)."""
    state = {st["device_id"]: st for st in summary.snapshot_state(store, run_id)}
    devices: dict[int, dict] = {}
    for device, _, address, total, stream, kind, pool, expandable, blocks in store.sql(
            SEGMENTS_SQL, {"run_id": run_id}).fetchall():
        st = state.get(device, {})
        d = devices.setdefault(device, {"device_id": device, "segments": [], "largest_free_at": None,
                                        **{k: _f(st.get(k)) for k in ("reserved", "allocated", "pending", "free",
                                                                       "largest_free", "stranded", "cached")}})
        blocks = [(int(o), int(n), state_, _f(r)) for o, n, state_, r in (blocks or [])]
        d["segments"].append({"address": address, "bytes": int(total), "stream": stream, "type": kind, "pool": pool,
                              "expandable": bool(expandable), "blocks": blocks,
                              "used": any(b[2] != "inactive" for b in blocks)})
        if d["largest_free_at"] is None and d["largest_free"]:
            j = next((j for j, b in enumerate(blocks) if b[2] == "inactive" and b[1] == d["largest_free"]), None)
            if j is not None:
                d["largest_free_at"] = (len(d["segments"]) - 1, j)
    return [devices[k] for k in sorted(devices)]
