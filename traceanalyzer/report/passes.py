"""The four passes over each hot kernel of a timeline linked to Nsight Compute, in one place.

The method reads a kernel four ways: its structure (the operator or range that launched it, the
shapes it ran on, the unfused element-wise chain it is part of), its place in the timeline
(launches, the idle time around them), its bottleneck (roofline, limiter, occupancy as ncu
measured it) and its instructions (stalls, wasted sectors, bank conflicts). For a timeline run
linked to an ncu run (`link.py`) the report gathers them per kernel, the kernels the ncu run
profiled, hottest first: from the timeline's own rows, the linked ncu launches' metrics
(averaged over the launches matched) and the findings the rules stored on the kernel. The text
and HTML reports show them (`lines`); JSON carries them in `runs[].hot_kernels`.
"""

from __future__ import annotations

from .. import fmt
from ..link import linked_ncu_runs, stored_links
from ..rules import evidence_of
from ..rules._ncu import ACHIEVED, MEM_SOL, SM_SOL
from ..rules.evidence import KernelEvidence
from ..store import Store

TOP = 5
THEORETICAL = "sm__maximum_warps_per_active_cycle_pct"
WAVES = "launch__waves_per_multiprocessor"
ISSUE_ACTIVE = "smsp__issue_active.avg.per_cycle_active"
METRICS = {"sm_pct": SM_SOL, "memory_pct": MEM_SOL, "theoretical_pct": THEORETICAL, "achieved_pct": ACHIEVED,
           "waves": WAVES, "issue_active": ISSUE_ACTIVE}

# Per linked kernel: its time, launches, and the idle time of its device just before and after
# its launches (median over launches; an op is idle-preceded by the time since every earlier
# operation of the device ended).
_TIMELINE_SQL = """
WITH linked AS (
    SELECT DISTINCT device_id, name FROM kernel_links WHERE run_id = $r AND side = 'both'
), ops AS (
    SELECT device_id, kind, item_id, start_ns, end_ns,
           max(end_ns) OVER (PARTITION BY device_id ORDER BY start_ns, end_ns, item_id
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_end,
           lead(start_ns) OVER (PARTITION BY device_id ORDER BY start_ns, end_ns, item_id) AS next_start
    FROM gpu_activity WHERE run_id = $r
), k AS (
    SELECT k.device_id, k.name, k.kernel_id, k.start_ns, k.end_ns, k.external_id
    FROM kernels k JOIN linked l ON l.device_id IS NOT DISTINCT FROM k.device_id AND l.name = k.name
    WHERE k.run_id = $r AND k.end_ns >= k.start_ns
)
SELECT k.device_id, k.name, count(*) AS launches, sum(k.end_ns - k.start_ns) AS ns,
       median(k.end_ns - k.start_ns) AS median_ns,
       median(greatest(o.start_ns - o.before_end, 0)) AS idle_before_ns,
       median(greatest(o.next_start - o.end_ns, 0)) AS idle_after_ns,
       (SELECT sum(end_ns - start_ns) FROM kernels WHERE run_id = $r AND end_ns >= start_ns) AS total_ns
FROM k LEFT JOIN ops o ON o.kind = 'kernel' AND o.item_id = k.kernel_id
                      AND o.device_id IS NOT DISTINCT FROM k.device_id
GROUP BY ALL ORDER BY ns DESC, k.name LIMIT $top
"""

# The input shapes of the operators that launched the kernels (Kineto's `External id`).
_SHAPES_SQL = """
SELECT k.name, o.input_dims, count(*) AS calls FROM kernels k
JOIN cpu_ops o ON o.run_id = k.run_id AND o.external_id = k.external_id
WHERE k.run_id = $r AND list_contains($names, k.name) AND o.input_dims IS NOT NULL
GROUP BY ALL ORDER BY k.name, calls DESC, o.input_dims
"""

_METRICS_SQL = """
SELECT l.device_id, l.name, m.metric_id, avg(m.value) AS value, count(DISTINCT l.ncu_kernel_id) AS launches
FROM kernel_links l JOIN kernel_metrics m ON m.run_id = l.ncu_run_id AND m.kernel_id = l.ncu_kernel_id
WHERE l.run_id = $r AND l.side = 'both' AND list_contains($ids, m.metric_id) AND m.value IS NOT NULL
GROUP BY ALL
"""


def hot_kernels(store: Store, run_id: str, findings: list[dict], top: int = TOP) -> list[dict]:
    """The `top` linked kernels of the timeline run `run_id` by time, each with its four passes;
    [] for a run without links. `findings`: the run's findings (evidence decoded)."""
    if not linked_ncu_runs(store, run_id):
        return []
    kernels = store.arrow(_TIMELINE_SQL, {"r": run_id, "top": top}).to_pylist()
    if not kernels:
        return []
    names = [k["name"] for k in kernels]
    shapes: dict[str, list] = {}
    for r in store.arrow(_SHAPES_SQL, {"r": run_id, "names": names}).to_pylist():
        shapes.setdefault(r["name"], []).append(r["input_dims"])
    chains = _chains(store, run_id, findings)
    measured: dict[tuple, dict] = {}
    for r in store.arrow(_METRICS_SQL, {"r": run_id, "ids": list(METRICS.values())}).to_pylist():
        m = measured.setdefault((r["device_id"], r["name"]), {"ncu_launches": 0})
        m[r["metric_id"]] = r["value"]
        m["ncu_launches"] = max(m["ncu_launches"], r["launches"])
    out = []
    for k in kernels:
        mine = [f for f in findings if f.get("item_kind") == "kernel" and f.get("item_name") == k["name"]
                and f.get("device_id") == k["device_id"]]
        by_rule = {}
        for f in mine:
            by_rule.setdefault(f["rule_id"], f)
        m = measured.get((k["device_id"], k["name"]), {})
        typed = [evidence_of(f["rule_id"], f.get("evidence")) for f in mine]
        launched_by = next((ev.launched_by for ev in typed if isinstance(ev, KernelEvidence) and ev.launched_by), None)
        roofline, limits, stalls, banks = (_typed(by_rule.get(r)) for r in ("B003", "B004", "I001", "I004"))
        out.append({
            "name": k["name"], "label": fmt.kernel_label(k["name"], _short(k["name"])), "device_id": k["device_id"],
            "structure": {"launched_by": launched_by, "shapes": shapes.get(k["name"], [])[:3],
                          "fusion_chain": chains.get((k["device_id"], k["name"]))},
            "timeline": {"launches": k["launches"], "ns": k["ns"], "median_ns": k["median_ns"],
                         "share": k["ns"] / k["total_ns"] if k["total_ns"] else None,
                         "idle_before_ns": k["idle_before_ns"], "idle_after_ns": k["idle_after_ns"]},
            "bottleneck": {**{key: m.get(mid) for key, mid in METRICS.items()}, "ncu_launches": m.get("ncu_launches", 0),
                           "roofline": roofline and roofline.bound,
                           "limiter": limits and limits.limiter,
                           "limit_cause": limits and limits.cause,
                           "occupancy_limiter": limits and limits.occupancy_limiter},
            "instruction": {"stall": stalls and stalls.reason,
                            "stall_share": by_rule["I001"]["value"] if "I001" in by_rule else None,
                            "excess_sector_share": by_rule["I002"]["value"] if "I002" in by_rule else None,
                            "bank_conflict_share": by_rule["I004"]["value"] if "I004" in by_rule else None,
                            "bank_conflict_ways": banks and banks.average_ways},
            "findings": [{"rule_id": f["rule_id"], "severity": f["severity"], "finding_no": f.get("finding_no"),
                          "loss_ns": f.get("rule_loss_ns") if f.get("rule_loss_ns") is not None else f.get("est_loss_ns")}
                         for f in mine],
        })
    return out


def _chains(store: Store, run_id: str, findings: list[dict]) -> dict[tuple, dict]:
    """(device, kernel name) -> the unfused element-wise chain (an S002 finding) the kernel is in.
    The chains of one finding have the same kernels in the same order, so the first one it lists
    names them all."""
    out: dict[tuple, dict] = {}
    for f in findings:
        ev = _typed(f) if f["rule_id"] == "S002" else None
        if ev is None or not ev.worst:
            continue
        chain = {"name": f["item_name"], "finding_no": f.get("finding_no"), "chains": ev.chains,
                 "kernels_per_chain": ev.kernels_per_chain, "saving_ns": f.get("est_loss_ns")}
        names = store.arrow("SELECT DISTINCT name FROM kernels WHERE run_id = $r AND list_contains($ids, kernel_id)",
                            {"r": run_id, "ids": ev.worst[0].kernel_ids}).column("name").to_pylist()
        for name in names:
            out.setdefault((f["device_id"], name), chain)
    return out


def link_summaries(store: Store, run_id: str) -> list[dict]:
    """Per ncu run linked to `run_id`: launches matched and unmatched on either side."""
    out: dict[str, dict] = {}
    for r in stored_links(store, run_id):
        s = out.setdefault(r["ncu_run_id"], {"ncu_run_id": r["ncu_run_id"], "both": 0, "ncu": 0, "timeline": 0})
        s[r["side"]] += 1
    return list(out.values())


def _short(name: str) -> str:
    from ..ingest.kineto_names import kernel_short_name

    return kernel_short_name(name)


def _typed(f: dict | None):
    """A finding's evidence as its rule's type (rules.evidence_of); None without a finding."""
    return evidence_of(f["rule_id"], f.get("evidence")) if f else None


def _pct(x) -> str:
    return "?" if x is None else f"{x:.0f}%"


def lines(k: dict) -> list[tuple[str, str]]:
    """(pass, text) for one hot kernel: what the text and HTML reports print."""
    s, t, b, i = k["structure"], k["timeline"], k["bottleneck"], k["instruction"]
    where = s["launched_by"] or "no operator or range recorded"
    if s["shapes"]:
        where += "; shapes " + ", ".join(s["shapes"])
    if chain := s.get("fusion_chain"):
        where += (f"; in {chain['chains']} unfused chain(s) of {chain['kernels_per_chain']} element-wise kernels "
                  f"({chain['name']}, #{chain['finding_no']} S002: fusing saves about {fmt.ns(chain['saving_ns'])})")
    timeline = (f"{t['launches']} launch(es), {fmt.ns(t['ns'])} ({fmt.pct(t['share'])} of kernel time), median "
                f"{fmt.ns(t['median_ns'])}; device idle {fmt.ns(t['idle_before_ns'])} before and "
                f"{fmt.ns(t['idle_after_ns'])} after (median)")
    parts = [f"SM {_pct(b['sm_pct'])}, memory {_pct(b['memory_pct'])} of peak"]
    if b["roofline"]:
        parts.append(f"{b['roofline']}-bound (B003)")
    if b["limiter"]:
        cause = f" ({b['limit_cause'].replace('_', ' ')})" if b["limit_cause"] else ""
        parts.append(f"{b['limiter']}-limited{cause} (B004)")
    occupancy = f"occupancy {_pct(b['theoretical_pct'])} theoretical, {_pct(b['achieved_pct'])} achieved"
    if b["occupancy_limiter"]:
        occupancy += f", limited by {b['occupancy_limiter']}"
    parts.append(occupancy)
    if b["waves"] is not None:
        parts.append(f"{b['waves']:.2f} waves")
    bottleneck = "; ".join(parts) + f" (ncu, {b['ncu_launches']} launch(es))"
    inst = [f"{i['stall'].replace('_', ' ')} {fmt.pct(i['stall_share'])} of stalls (I001)" if i["stall"]
            else "no dominant stall reason"]
    inst.append(f"{fmt.pct(i['excess_sector_share'])} of global sectors wasted (I002)"
                if i["excess_sector_share"] is not None else "sectors as needed")
    inst.append(f"{fmt.pct(i['bank_conflict_share'])} of shared wavefronts are bank conflicts"
                + (f", {i['bank_conflict_ways']:.0f}-way" if i["bank_conflict_ways"] else "") + " (I004)"
                if i["bank_conflict_share"] is not None else "no bank conflicts")
    if b["issue_active"] is not None:
        inst.append(f"issuing on {fmt.pct(b['issue_active'])} of cycles")
    found = ", ".join(f"#{f['finding_no']} {f['rule_id']}" + (f" {fmt.ns(f['loss_ns'])}" if f["loss_ns"] else "")
                      for f in sorted(k["findings"], key=lambda f: f["finding_no"] or 0))
    return [("structure", where), ("timeline", timeline), ("bottleneck", bottleneck),
            ("instruction", "; ".join(inst)), ("findings", found or "none")]
