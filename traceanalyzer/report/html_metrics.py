"""Numbers behind the report's roofline, stall and memory plots.

Roofline: each kernel is placed where rule B003 put it (its evidence: compute and memory
% of peak, or FLOPs, DRAM bytes, intensity and the peaks it used). Runs that B003 did not
evaluate (an older store, the rule ignored) fall back to one small query over the Nsight
Compute metrics (`ROOFLINE_SQL`). Stall profiles are the I001 rule's own: its query is
run with its thresholds opened up, so every kernel with stall metrics gets the profile
I001 computes, flagged or not. The memory curve is the allocator total over time from
`memory_events`, a few hundred columns wide, with the peak M001 reports where it did.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .. import gpu
from ..fmt import _missing
from ..store import Store

MAX_ROOFLINE_KERNELS = 40
MAX_STALL_KERNELS = 12
MEMORY_COLUMNS = 600

_FLOP_OPS = r"^sm(sp)?__sass_thread_inst_executed_op_([dfh])(add|mul|fma)_pred_on\.sum(\.per_cycle_elapsed)?$"

# Per launch: duration, DRAM bytes, FLOPs by precision and the two Speed-of-Light shares.
# FLOPs = add + mul + 2 x fma (FP16: 2 / 2 / 4, packed half2), as Nsight Compute's
# roofline section counts them (formats.md 3.3); per-cycle counters are scaled by the
# SM clock and the duration.
ROOFLINE_SQL = rf"""
WITH m AS (
    SELECT kernel_id, metric_id, value FROM kernel_metrics
    WHERE run_id = $run_id AND value IS NOT NULL
), launch AS (
    SELECT kernel_id,
        max(value) FILTER (WHERE metric_id = 'gpu__time_duration.sum') AS dur_ns,
        coalesce(max(value) FILTER (WHERE metric_id = 'dram__bytes.sum'),
                 max(value) FILTER (WHERE metric_id = 'dram__bytes_read.sum')
                   + max(value) FILTER (WHERE metric_id = 'dram__bytes_write.sum')) AS dram_bytes,
        max(value) FILTER (WHERE metric_id = 'dram__bytes.sum.per_second') AS dram_bytes_per_s,
        coalesce(max(value) FILTER (WHERE metric_id = 'smsp__cycles_elapsed.avg.per_second'),
                 max(value) FILTER (WHERE metric_id = 'sm__cycles_elapsed.avg.per_second'),
                 max(value) FILTER (WHERE metric_id = 'gpc__cycles_elapsed.avg.per_second')) AS clock_hz,
        max(value) FILTER (WHERE metric_id = 'sm__throughput.avg.pct_of_peak_sustained_elapsed') AS sm_pct,
        coalesce(max(value) FILTER (WHERE metric_id = 'gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed'),
                 max(value) FILTER (WHERE metric_id = 'gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed'),
                 max(value) FILTER (WHERE metric_id = 'dram__throughput.avg.pct_of_peak_sustained_elapsed')) AS mem_pct
    FROM m GROUP BY kernel_id
), ops AS (  -- FP instruction counts, per-cycle ones turned into counts
    SELECT m.kernel_id, regexp_extract(metric_id, '{_FLOP_OPS}', 2) AS prec,
           regexp_extract(metric_id, '{_FLOP_OPS}', 3) AS op,
           CASE WHEN regexp_extract(metric_id, '{_FLOP_OPS}', 4) = '' THEN value
                ELSE value * l.clock_hz * l.dur_ns / 1e9 END AS n
    FROM m JOIN launch l USING (kernel_id)
    WHERE regexp_matches(metric_id, '{_FLOP_OPS}')
), flops AS (  -- one counter per precision and op (the .sum wins over its per-cycle twin)
    SELECT kernel_id, prec,
           sum(max_n * CASE WHEN prec = 'h' THEN (CASE op WHEN 'fma' THEN 4 ELSE 2 END)
                            ELSE (CASE op WHEN 'fma' THEN 2 ELSE 1 END) END) AS flop
    FROM (SELECT kernel_id, prec, op, max(n) AS max_n FROM ops WHERE n IS NOT NULL GROUP BY ALL)
    GROUP BY ALL
), per_launch AS (
    SELECT k.kernel_id, coalesce(k.name, k.short_name, '?') AS kernel, k.device_id, l.dur_ns,
           coalesce(l.dram_bytes, l.dram_bytes_per_s * l.dur_ns / 1e9) AS dram_bytes,
           (SELECT sum(flop) FROM flops f WHERE f.kernel_id = k.kernel_id) AS flop,
           (SELECT sum(flop) FROM flops f WHERE f.kernel_id = k.kernel_id AND prec = 'f') AS flop_fp32,
           (SELECT sum(flop) FROM flops f WHERE f.kernel_id = k.kernel_id AND prec = 'd') AS flop_fp64,
           (SELECT sum(flop) FROM flops f WHERE f.kernel_id = k.kernel_id AND prec = 'h') AS flop_fp16,
           l.sm_pct, l.mem_pct
    FROM kernels k JOIN launch l USING (kernel_id) WHERE k.run_id = $run_id
)
SELECT kernel, any_value(device_id) AS device_id, count(*) AS launches, min(kernel_id) AS first_id,
       sum(dur_ns) AS dur_ns, sum(dram_bytes) AS dram_bytes, sum(flop) AS flop,
       sum(flop_fp32) AS flop_fp32, sum(flop_fp64) AS flop_fp64, sum(flop_fp16) AS flop_fp16,
       -- time-weighted when durations are known
       coalesce(sum(sm_pct * dur_ns) / nullif(sum(dur_ns) FILTER (WHERE sm_pct IS NOT NULL), 0), avg(sm_pct)) AS sm_pct,
       coalesce(sum(mem_pct * dur_ns) / nullif(sum(dur_ns) FILTER (WHERE mem_pct IS NOT NULL), 0), avg(mem_pct)) AS mem_pct,
       count(flop) = count(*) AND count(dram_bytes) = count(*) AND count(dur_ns) = count(*) AS absolute_ok
FROM per_launch GROUP BY kernel
ORDER BY dur_ns DESC NULLS LAST, kernel
"""


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
    """
    b003 = [f for f in findings if f["rule_id"] == "B003" and isinstance(f.get("evidence"), dict)]
    if b003:
        return _roofline_from_b003(b003)
    chart = _roofline_from_metrics(store, run_id)
    return [chart] if chart else []


def _roofline_from_b003(findings: list[dict]) -> list[dict]:
    absolute, sol, roofs, bws = [], [], {}, []
    for f in findings:
        ev = f["evidence"]
        base = {"kernel": f.get("item_name") or "?", "launches": int(ev.get("launches") or ev.get("calls") or 1),
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
        charts.append({"mode": "absolute", "source": "B003", "bandwidth_bytes_per_s": max(bws) if bws else None,
                       "roofs": [{"label": k, "flops_per_s": v} for k, v in sorted(roofs.items(), key=lambda kv: -kv[1])],
                       "points": absolute[:MAX_ROOFLINE_KERNELS], "kernels_total": len(absolute),
                       "estimate": any(p["estimate"] for p in absolute)})
    if sol:
        sol.sort(key=by_time)
        charts.append({"mode": "sol", "source": "B003", "points": sol[:MAX_ROOFLINE_KERNELS], "kernels_total": len(sol)})
    return charts


def _roofline_from_metrics(store: Store, run_id: str) -> dict | None:
    rows = store.sql(ROOFLINE_SQL, {"run_id": run_id}).fetchall()
    cols = [d[0] for d in store.con.description]
    kernels = [dict(zip(cols, r)) for r in rows]
    absolute = [k for k in kernels if k["absolute_ok"] and _f(k["flop"]) and _f(k["dram_bytes"]) and _f(k["dur_ns"])]
    if absolute:
        dev = next(iter(store.sql("SELECT name, memory_bandwidth_bytes_per_s FROM devices WHERE run_id = ? "
                                  "ORDER BY device_id LIMIT 1", [run_id]).fetchall()), None)
        prod = gpu.product(dev[0]) if dev else None
        bw = _f(dev[1]) if dev and dev[1] is not None else (prod.dram_bandwidth_bytes_per_s if prod else None)
        roofs = []
        if prod:
            for label, v in (("FP32", prod.fp32_flops_per_s), ("FP64", prod.fp64_flops_per_s),
                             ("FP16 tensor", prod.fp16_tensor_flops_per_s)):
                if v:
                    roofs.append({"label": label, "flops_per_s": v})
        points = [{
            "kernel": k["kernel"], "launches": int(k["launches"]), "dur_ns": _f(k["dur_ns"]),
            "ai": _f(k["flop"]) / _f(k["dram_bytes"]),
            "flops_per_s": _f(k["flop"]) / (_f(k["dur_ns"]) / 1e9),
            "flop": _f(k["flop"]), "dram_bytes": _f(k["dram_bytes"]),
        } for k in absolute[:MAX_ROOFLINE_KERNELS]]
        return {"mode": "absolute", "source": "metrics", "device": dev[0] if dev else None,
                "product": prod.name if prod else None, "bandwidth_bytes_per_s": bw,
                "roofs": roofs, "points": points, "kernels_total": len(kernels)}
    sol = [k for k in kernels if _f(k["sm_pct"]) is not None and _f(k["mem_pct"])]
    if not sol:
        return None
    points = []
    for k in sol[:MAX_ROOFLINE_KERNELS]:
        c, m = _f(k["sm_pct"]) / 100, _f(k["mem_pct"]) / 100
        points.append({"kernel": k["kernel"], "launches": int(k["launches"]), "dur_ns": _f(k["dur_ns"]),
                       "sm_share": c, "mem_share": m, "x": c / m, "y": c})
    return {"mode": "sol", "source": "metrics", "points": points, "kernels_total": len(sol)}


def stalls(store: Store, run_id: str, fmt: str, findings: list[dict]) -> dict | None:
    """Stall profiles of the kernels with stall metrics, from the I001 rule's query run with
    no cut-off (so unflagged kernels show too); the kernels I001 flagged are marked."""
    from ..rules import get_rule
    from ..rules.engine import applies, evaluate_rule

    try:
        rule = get_rule("I001")
    except KeyError:
        return None
    try:
        if not applies(store, rule, run_id, fmt):
            return None
        df = evaluate_rule(store, rule, run_id, rule.params({"min_dominant_share": 0, "max_issue_active_ratio": 1e300}))
    finally:
        # The engine reads single rows with fetchone(), which leaves DuckDB 2.x's connection
        # holding an unfinished result that makes the next relation query (Store.arrow) fail.
        store.sql("SELECT 1").fetchall()
    if df.empty:
        return None
    flagged = {f["item_name"] for f in findings if f["rule_id"] == "I001"}
    rows = []
    for r in df.itertuples():
        ev = json.loads(r.evidence) if isinstance(r.evidence, str) else (r.evidence or {})
        rows.append({"kernel": r.item_name, "profile": ev.get("profile") or {}, "launches": ev.get("launches"),
                     "est_loss_ns": _f(r.est_loss_ns), "flagged": r.item_name in flagged,
                     "top": ev.get("reason"), "top_share": _f(r.value)})
    rows.sort(key=lambda x: (-(x["est_loss_ns"] or -1), -(x["top_share"] or 0), x["kernel"] or ""))
    return {"kernels": rows[:MAX_STALL_KERNELS], "kernels_total": len(rows)}


# The allocator's own total when every event of a device has it; else the running sum of
# signed sizes, lifted (as M001 does) so that it never goes below zero: frees of blocks
# allocated before the trace began bound what was there already.
_CURVE = """
WITH ev AS (
    SELECT device_type, device_id, ts_ns, event_id, bytes, total_allocated_bytes, total_reserved_bytes,
           count(*) FILTER (WHERE total_allocated_bytes IS NULL) OVER (PARTITION BY device_type, device_id) = 0 AS recorded
    FROM memory_events WHERE run_id = $run_id AND ts_ns IS NOT NULL
), summed AS (
    SELECT *, CASE WHEN recorded THEN total_allocated_bytes
                   ELSE sum(coalesce(bytes, 0)) OVER (PARTITION BY device_type, device_id ORDER BY ts_ns, event_id
                                                      ROWS UNBOUNDED PRECEDING) END AS level
    FROM ev
), curve AS (
    SELECT *, total_reserved_bytes AS reserved,
           level + CASE WHEN recorded THEN 0
                        ELSE greatest(0, -min(level) OVER (PARTITION BY device_type, device_id)) END AS allocated
    FROM summed
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
