"""Numbers behind the report's roofline, stall and memory plots.

Roofline: each kernel is placed where rule B003 put it (its evidence: compute and memory
% of peak, or FLOPs, DRAM bytes, intensity and the peaks it used). Runs that B003 did not
evaluate (an older store, the rule ignored) show every kernel of B003's roofline analysis
(`kernel_roofline`), the numbers the rule classifies. Stall profiles are the `stall_profiles` analysis that rule
I001 reports from, for every kernel with stall metrics, flagged or not. The memory curve is
the `memory_levels` analysis (M001's) over time, a few hundred columns wide, with the peak
M001 reports where it did.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..fmt import _missing
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
    b003 = [(f.get("item_name") or "?", f["evidence"]) for f in findings
            if f["rule_id"] == "B003" and isinstance(f.get("evidence"), dict)]
    if b003:
        return _charts(b003, "B003")
    return _charts(_analysed_kernels(store, run_id), "metrics")


def _analysed_kernels(store: Store, run_id: str) -> list[tuple[str, dict]]:
    """(kernel, evidence-like numbers) per kernel of B003's roofline analysis of an ncu run."""
    from ..rules.B003_roofline import kernel_roofline

    fmt = store.sql("SELECT format FROM runs WHERE run_id = ?", [run_id]).fetchall()
    if not fmt or not fmt[0][0].startswith("ncu"):
        return []
    g = kernel_roofline(store, run_id)
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


# Allocated memory after each allocator event, per device: the `memory_levels` view (rule M001's).
_CURVE = """
WITH curve AS (
    SELECT device_type, device_id, ts_ns, event_id, has_totals AS recorded, allocated_bytes AS allocated,
           reserved_bytes AS reserved
    FROM memory_levels WHERE run_id = $run_id
)"""

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
       min(ts_ns) AS first_ns, max(ts_ns) AS last_ns
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
    for dtype, dev, recorded, n, peak, peak_ts, _, _ in peaks:
        series[(dtype, dev)] = {"device_type": dtype, "device_id": dev, "recorded": bool(recorded),
                                "events": int(n), "peak_bytes": _f(peak),
                                "peak_at_ns": int(peak_ts - origin), "cols": []}
    for dtype, dev, _, col, lo, hi, last, reserved in cols:
        series[(dtype, dev)]["cols"].append([int(col), _f(lo), _f(hi), _f(last), _f(reserved)])
    for f in findings:
        ev = f.get("evidence") if f["rule_id"] == "M001" else None
        s = series.get(("cuda", f.get("device_id")))
        if s and isinstance(ev, dict) and ev.get("peak_allocated_bytes") is not None \
                and ev.get("peak_allocated_start_ns") is not None:
            s.update(peak_bytes=_f(ev["peak_allocated_bytes"]), peak_at_ns=int(ev["peak_allocated_start_ns"] - origin),
                     peak_source="M001")
    return {"t0_ns": int(t0 - origin), "span_ns": int(max(t1 - t0, 1)), "columns": MEMORY_COLUMNS,
            "series": list(series.values())}
