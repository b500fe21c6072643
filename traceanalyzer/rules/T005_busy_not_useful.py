"""T005 GPU busy versus useful: a device busy most of the time with work that uses little of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import msgspec
import numpy as np

from ..fmt import ns, pct
from ._launches import launch_groups
from ._library import LOW_OCCUPANCY_BY_DESIGN
from .base import Rule, Threshold
from .evidence import Evidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

# Per device, the share of its span with a kernel running (copies alone are T002's: a device busy
# with copies is not judged by its kernels) and kernel time split by kernel size (timeline runs
# only).
DEVICE_SQL = """
SELECT b.device_id, coalesce(kb.busy_ns, 0) / nullif(b.active_span_ns, 0) AS busy_share, coalesce(kb.busy_ns, 0) AS busy_ns,
       b.active_span_ns, b.first_start_ns, b.last_end_ns, k.kernel_ns, k.kernels, k.tiny_ns, k.tiny_kernels
FROM this_run.device_busy b
LEFT JOIN (SELECT device_id, sum(end_ns - start_ns) AS busy_ns FROM this_run.kernel_busy_intervals
           GROUP BY device_id) kb USING (device_id)
LEFT JOIN (SELECT device_id, sum(end_ns - start_ns) AS kernel_ns, count(*) AS kernels,
                  coalesce(sum(end_ns - start_ns) FILTER (WHERE end_ns - start_ns < $tiny_kernel_ns), 0) AS tiny_ns,
                  count(*) FILTER (WHERE end_ns - start_ns < $tiny_kernel_ns) AS tiny_kernels
           FROM kernels WHERE run_id = $run_id AND start_ns IS NOT NULL AND end_ns >= start_ns
           GROUP BY device_id) k USING (device_id)
ORDER BY b.device_id
"""

# Speed-of-light throughputs (% of peak): compute, then memory (DRAM when the combined one is missing).
SOL_METRICS = ("sm__throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed")

# Nsight Compute runs: each launch's duration and speed-of-light throughputs.
NCU_SQL = """
SELECT k.kernel_id, k.device_id, coalesce(k.short_name, k.name) AS name, k.duration_ns,
       max(m.value) FILTER (WHERE m.metric_id = 'sm__throughput.avg.pct_of_peak_sustained_elapsed') AS sm_pct,
       coalesce(max(m.value) FILTER (WHERE m.metric_id = 'gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed'),
                max(m.value) FILTER (WHERE m.metric_id IN ('gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed',
                                                           'dram__throughput.avg.pct_of_peak_sustained_elapsed'))) AS mem_pct
FROM kernel_durations k JOIN kernel_metrics m ON m.run_id = $run_id AND m.kernel_id = k.kernel_id
WHERE k.run_id = $run_id
GROUP BY ALL
HAVING sm_pct IS NOT NULL OR mem_pct IS NOT NULL
ORDER BY k.kernel_id
"""


def _occupancy_estimates(store, run_id: str) -> pd.DataFrame:
    """Per launch configuration: an estimated achieved occupancy (0..1) and kernel time.

    Kineto's `est. achieved occupancy %` when the trace has it; otherwise the same quantity
    from the occupancy calculator: theoretical occupancy x min(1, waves), i.e. resident warps
    over the maximum, with a grid smaller than one wave filling only part of the SMs. When
    the calculator lacks the device's limits but the SM count is known, the share of SMs the
    grid can reach, min(1, blocks / SMs), stands in: an upper bound on occupancy.
    """
    g = launch_groups(store, run_id)
    if g.empty:
        return g
    g = g[g["total_ns"].notna() & (g["total_ns"] > 0)].copy()
    calc = g["theoretical"] * np.minimum(1.0, g["waves"])
    fill = np.minimum(1.0, g["grid_blocks"] / g["sm_count"].where(g["sm_count"] > 0))
    kineto = g["achieved"].where(g["achieved_source"] == "kineto-estimate")
    g["estimate"] = kineto.fillna(calc).fillna(fill)
    g["estimate_source"] = np.select([kineto.notna(), calc.notna(), fill.notna()],
                                     ["kineto", "calculator", "sm-fill"], default=None)
    g.loc[g["estimate"].isna(), "estimate_source"] = None
    return g


def _timeline(store, run_id: str, p: dict) -> list[dict]:
    devices = store.sql(DEVICE_SQL, {"run_id": run_id, "tiny_kernel_ns": p["tiny_kernel_ns"]}).df()
    groups = _occupancy_estimates(store, run_id)
    rows = []
    for d in devices.itertuples():
        if (not d.busy_share >= p["min_busy_share"] or not d.kernel_ns > 0
                or d.active_span_ns < p["min_active_span_ns"]):
            continue
        dev = groups[groups["device_id"] == d.device_id] if not groups.empty else groups
        known = dev[dev["estimate"].notna()] if not dev.empty else dev
        covered_ns = float(known["total_ns"].sum()) if not known.empty else 0.0
        coverage = covered_ns / d.kernel_ns
        tiny_share = d.tiny_ns / d.kernel_ns
        base = {"device_id": int(d.device_id), "item_kind": "device", "item_id": int(d.device_id),
                "start_ns": int(d.first_start_ns), "end_ns": int(d.last_end_ns)}
        facts = {"busy_share": d.busy_share, "busy_ns": int(d.busy_ns), "active_span_ns": int(d.active_span_ns),
                 "kernel_ns": int(d.kernel_ns), "kernels": int(d.kernels), "tiny_kernel_share": tiny_share,
                 "tiny_kernels": int(d.tiny_kernels), "estimate_coverage": coverage}
        busy = f"device {int(d.device_id)} runs kernels {pct(d.busy_share)} of its span"
        judged = False
        # Without any estimate there is nothing to judge by, whatever coverage is asked for.
        if covered_ns > 0 and coverage >= p["min_estimate_coverage_share"]:
            judged = True
            occ = float((known["estimate"] * known["total_ns"]).sum() / covered_ns)
            if occ < p["max_occupancy_share"]:
                known = known.assign(idle_ns=known["total_ns"] * (1 - known["estimate"]))
                worst = known.sort_values(["idle_ns", "first_id"], ascending=[False, True]).head(p["max_examples"])
                sources = sorted(set(known["estimate_source"].dropna()))
                # Most of the empty slots in library kernels that run few large blocks by design: an
                # estimate alone is no sign of a problem there (as B002 says of each of them).
                by_design = known["library"].isin(LOW_OCCUPANCY_BY_DESIGN)
                design_share = float(known.loc[by_design, "idle_ns"].sum() / known["idle_ns"].sum()) \
                    if known["idle_ns"].sum() > 0 else 0.0
                mostly_design = design_share >= 0.5
                rows.append({**base, "item_name": "busy, low estimated occupancy", "value": occ,
                             "value_unit": "share", "threshold": p["max_occupancy_share"],
                             "message": f"{busy}, but its kernels keep {'at most' if sources == ['sm-fill'] else 'about'} "
                                        f"{pct(occ)} of its warp slots occupied (time-weighted estimated occupancy from "
                                        f"{'/'.join(sources)}, over {ns(d.kernel_ns)} of kernels)"
                                        + (f"; {pct(design_share)} of the empty slots are in library GEMM, convolution "
                                           "and attention kernels, which run few large blocks by design: without a "
                                           "measurement this is no sign of waste" if mostly_design
                                           else ": busy is not efficient"),
                             "hint": ("Measure before changing anything: library kernels that run few large blocks "
                                      "can be near their throughput roof at low occupancy (ncu --section SpeedOfLight "
                                      "on the top kernels); see B002 for what each library lets you change."
                                      if mostly_design else
                                      "Most kernel time runs grids too small to fill the GPU or blocks the SMs can hold "
                                      "few of: give kernels more blocks (batch work, split-K, smaller tiles) and see "
                                      "B001/B002 for each kernel; confirm with ncu --section SpeedOfLight."),
                             **({"severity": "info"} if mostly_design else {}),
                             "evidence": {**facts, "estimated_occupancy": occ, "estimate": "time-weighted "
                                          "estimated achieved occupancy (resident warps / max, grid fill included)",
                                          "estimate_sources": sources, "library_share": design_share,
                                          **({"severity_reason": "most of the empty warp slots are in library kernels "
                                              "that run few large blocks by design, and no measurement says they are slow"}
                                             if mostly_design else {}),
                                          "worst": [{"kernel": r.short_name, "first_kernel_id": int(r.first_id),
                                                     "launches": int(r.launches), "kernel_ns": int(r.total_ns),
                                                     "estimated_occupancy": r.estimate,
                                                     "grid_blocks": _num(r.grid_blocks), "sm_count": _num(r.sm_count)}
                                                    for r in worst.itertuples()]}})
        if d.tiny_kernels > 0 and tiny_share >= p["min_tiny_share"]:
            judged = True
            rows.append({**base, "item_name": "busy with tiny kernels", "value": tiny_share, "value_unit": "share",
                         "threshold": p["min_tiny_share"],
                         "message": f"{busy}, but {pct(tiny_share)} of its kernel time is in {int(d.tiny_kernels)} "
                                    f"kernels shorter than {ns(p['tiny_kernel_ns'])}, whose ramp-up and drain "
                                    "dominate their run time: busy is not efficient",
                         "hint": "Fuse the small kernels (torch.compile, fused optimizers, CUTLASS epilogues), batch "
                                 "the work into fewer larger launches, or capture the sequence in a CUDA graph.",
                         "evidence": facts})
        if not judged:
            rows.append({**base, "item_name": "busy, efficiency unknown", "value": d.busy_share,
                         "value_unit": "share", "threshold": p["min_busy_share"], "severity": "info",
                         "message": f"{busy}; this trace cannot tell how much of that is useful: it has no throughput "
                                    f"counters, and no occupancy estimate (launch configuration or device limits "
                                    f"missing) for {pct(1 - coverage)} of kernel time",
                         "hint": "Busy is not efficient: profile the top kernels with Nsight Compute "
                                 "(ncu --section SpeedOfLight --section Occupancy) to see how close they get to peak.",
                         "evidence": facts})
    return rows


def _ncu(store, run_id: str, p: dict) -> list[dict]:
    k = store.sql(NCU_SQL, {"run_id": run_id}).df()
    if k.empty:
        return []
    k["sol_pct"] = k[["sm_pct", "mem_pct"]].max(axis=1)
    k["weight"] = k["duration_ns"].fillna(1.0)  # unweighted when durations were not collected
    rows = []
    for device, part in k.groupby(k["device_id"].fillna(-1), sort=True):
        sol = float((part["sol_pct"] * part["weight"]).sum() / part["weight"].sum())
        if sol >= p["max_sol_pct"]:
            continue
        low = part[part["sol_pct"] < p["max_sol_pct"]]
        part = part.assign(idle=part["weight"] * (100 - part["sol_pct"]))
        ranked = part.sort_values(["idle", "kernel_id"], ascending=[False, True])
        worst = ranked.head(p["max_examples"])
        dev = None if device == -1 else int(device)
        timed = bool(part["duration_ns"].notna().all())
        rows.append({
            "device_id": dev, "item_kind": "kernel", "item_id": int(ranked.iloc[0]["kernel_id"]),
            "item_name": "profiled kernels below peak", "value": sol, "value_unit": "pct",
            "threshold": p["max_sol_pct"],
            "message": f"profiled kernels{'' if dev is None else f' on device {dev}'} reach {sol:.1f}% of peak "
                       f"throughput ({'time-weighted ' if timed else ''}max of compute and memory speed of light, "
                       f"{len(part)} launches; {len(low)} below {p['max_sol_pct']:g}%): the profiled work uses "
                       "little of the GPU (how busy the GPU was with it, Nsight Compute's serialized replays cannot say)",
            # no timeline: the kernels' own findings (B003, B004) say the same of each, with their time
            "severity": "info",
            "hint": "Neither compute nor memory is near its limit, so latency dominates: expose more parallelism "
                    "(grid size, occupancy, independent instructions) and see the warp-stall and occupancy findings "
                    "for these kernels.",
            "evidence": {"sol_pct": sol, "launches": len(part), "launches_below": len(low),
                         "weighted_by": "duration" if timed else "launch",
                         "kernel_ns": float(part["duration_ns"].sum()) if timed else None,
                         "worst": [{"kernel_id": int(r.kernel_id), "kernel": r.name, "duration_ns": _num(r.duration_ns),
                                    "sm_pct": _num(r.sm_pct), "memory_pct": _num(r.mem_pct)}
                                   for r in worst.itertuples()]},
        })
    return rows


def _num(x):
    return None if x is None or x != x else float(x)


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(_timeline(store, run_id, p) + _ncu(store, run_id, p))


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class T005Example(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    estimated_occupancy: Annotated[Optional[float], doc("estimated achieved occupancy")] = None
    first_kernel_id: Annotated[Optional[int], doc("id of the kernel's first launch")] = None
    grid_blocks: Annotated[Optional[float], doc("blocks in the grid")] = None
    kernel: Annotated[str, doc("kernel name")]
    kernel_ns: Annotated[Optional[int], doc("kernel time")] = None
    launches: Annotated[Optional[int], doc("launches")] = None
    sm_count: Annotated[Optional[float], doc("SMs on the device")] = None
    duration_ns: Annotated[Optional[float], doc("kernel time (all launches)")] = None
    kernel_id: Annotated[Optional[int], doc("id of the kernel")] = None
    memory_pct: Annotated[Optional[float], doc("memory throughput, % of peak")] = None
    sm_pct: Annotated[Optional[float], doc("SM throughput, % of peak")] = None


class T005Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    active_span_ns: Annotated[Optional[int], doc("time from the device's first to its last GPU activity")] = None
    busy_ns: Annotated[Optional[int], doc("time with a kernel running")] = None
    busy_share: Annotated[Optional[float], doc("share of the active span with a kernel running")] = None
    estimate_coverage: Annotated[Optional[float], doc("share of kernel time with an occupancy estimate")] = None
    kernel_ns: Annotated[Optional[float], doc("the device's kernel time")]
    kernels: Annotated[Optional[int], doc("kernels counted")] = None
    tiny_kernel_share: Annotated[Optional[float], doc("share of kernel time in tiny kernels")] = None
    tiny_kernels: Annotated[Optional[int], doc("tiny kernels")] = None
    estimate: Annotated[Optional[str], doc("how the occupancy is averaged")] = None
    estimate_sources: Annotated[Optional[list[str]], doc("where the occupancy estimates come from")] = None
    estimated_occupancy: Annotated[Optional[float], doc("estimated achieved occupancy")] = None
    library_share: Annotated[Optional[float], doc("share of the empty warp slots in library GEMM, convolution and "
                                                  "attention kernels, which run few large blocks by design")] = None
    worst: Annotated[Optional[list[T005Example]], doc("the kernels that fill the GPU least")] = None
    launches: Annotated[Optional[int], doc("launches")] = None
    launches_below: Annotated[Optional[int], doc("launches below the throughput threshold")] = None
    sol_pct: Annotated[Optional[float], doc("the kernels' time-weighted Speed-of-Light throughput, % of peak")] = None
    weighted_by: Annotated[Optional[str], doc("what the average is weighted by")] = None


RULE = Rule(
    id="T005",
    evidence=T005Evidence,
    name="busy-not-useful",
    title="GPU busy, but not with useful work",
    phase="timeline",
    claims="compute",
    severity="warning",
    what="Devices running kernels most of their active span (`kernel_busy_intervals`) whose kernels use little "
         "of the GPU: low estimated occupancy or mostly tiny kernels on a timeline, low speed-of-light "
         "throughput in Nsight Compute data; and busy devices whose efficiency the trace cannot judge.",
    why="Utilization counts time with any kernel running, not how much of the GPU the kernel uses: a "
        "one-block kernel keeps a device 100 % busy on one SM. A high busy share hides this waste, "
        "and it is the common reason a 'fully utilized' GPU is still slow.",
    how="Timeline runs (nsys, Kineto): devices with a kernel running (the union of their kernels) at least "
        "`min_busy_share` of their active span (copies alone are T002's) and an active span of at least "
        "`min_active_span_ns` are judged by "
        "(a) the time-weighted estimated achieved occupancy of their kernels (Kineto's `est. achieved "
        "occupancy %` when present; otherwise the occupancy calculator's theoretical occupancy x "
        "min(1, waves), the same quantity: resident warps over the maximum, small grids counting as "
        "partial fill; without the device's limits, the SM fill min(1, blocks / SMs), an upper "
        "bound), reported below `max_occupancy_share` when launch data covers at least "
        "`min_estimate_coverage_share` of kernel time (info, with a hint to measure first, when half or more "
        "of the empty warp slots are in library GEMM, convolution and attention kernels, which run few "
        "large blocks by design: `library_share`); and (b) the share of kernel time in kernels "
        "shorter than `tiny_kernel_ns`, reported at `min_tiny_share`. Occupancy is an estimate of "
        "the GPU's resources in use, not of throughput. A busy device with neither kind of data "
        "gets an info finding saying so. Nsight Compute runs (no timeline, so no busy share): the "
        "launches' max(SM, memory) speed-of-light throughput, weighted by duration, is reported "
        "below `max_sol_pct` (NVIDIA SOLBottleneck's latency-bound threshold). No loss is estimated "
        "here: the per-kernel rules (B001, B002, I001) estimate it.",
    fix="Give kernels enough blocks and resident warps to fill the GPU, fuse tiny kernels, and "
        "profile the top kernels with Nsight Compute to see which limit they hit.",
    requires="timed kernels (busy share), or Nsight Compute speed-of-light metrics",
    applies_sql="SELECT EXISTS (SELECT 1 FROM gpu_activity WHERE run_id = $run_id) OR "
                "EXISTS (SELECT 1 FROM kernel_metrics WHERE run_id = $run_id AND metric_id IN ("
                + ", ".join(f"'{m}'" for m in SOL_METRICS) + "))",
    thresholds=(
        Threshold("min_busy_share", 0.7, "Devices running kernels at least this share of their active span are judged."),
        Threshold("min_active_span_ns", 1000000, "Devices active for less than this (first to last operation) are not judged (1 ms)."),
        Threshold("max_occupancy_share", 0.25, "Time-weighted estimated occupancy below this is reported."),
        Threshold("min_estimate_coverage_share", 0.5, "Share of kernel time that needs an occupancy estimate to judge by it."),
        Threshold("tiny_kernel_ns", 10000, "Kernels shorter than this count as tiny (10 us)."),
        Threshold("min_tiny_share", 0.5, "Share of kernel time in tiny kernels that is reported."),
        Threshold("max_sol_pct", 60.0, "Nsight Compute: time-weighted speed of light below this is reported (NVIDIA latency-bound threshold 60%)."),
        Threshold("max_examples", 5, "How many kernels the evidence lists."),
    ),
    evaluate=evaluate,
    references=(
        "Nsight Compute SpeedOfLight section rule SOLBottleneck (80 / 60 thresholds)",
        "Nsight Systems `nsys analyze` rule gpu_time_util (time utilization, not SM utilization)",
        "Kineto kernel args: 'est. achieved occupancy %'",
    ),
)
