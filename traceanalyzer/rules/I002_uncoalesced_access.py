"""I002 uncoalesced global access: more sectors fetched than the threads' bytes need."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Optional

import numpy as np

from ..fmt import kernel_label, ns, num, pct
from ._code import name_launchers
from ._ncu import (DURATION, MEM_SOL, as_int, col, kernel_finding, linked, ncu_launches, per_kernel,
                   sector_use_from_messages, sector_use_metric)
from .base import UPPER_BOUND, Rule, Threshold
from .evidence import NcuTimedEvidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

OPS = {"ld": "loads", "st": "stores"}
L2_SECTORS = "memory_l2_theoretical_sectors_global"
L2_IDEAL = "memory_l2_theoretical_sectors_global_ideal"
L2_EXCESS = "derived__memory_l2_theoretical_sectors_global_excessive"
L2_CYCLES = {"sum": ("lts__cycles_active.sum", "lts__cycles_elapsed.sum"),
             "avg": ("lts__cycles_active.avg", "lts__cycles_elapsed.avg")}


def _ids(op: str) -> dict[str, str]:
    return {
        "sectors": f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum",
        "requests": f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum",
        "spr": f"l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_{op}.ratio",
        "data_bytes": f"smsp__sass_data_bytes_mem_global_op_{op}.sum",
        "bytes_per_sector_pct": f"smsp__sass_average_data_bytes_per_sector_mem_global_op_{op}.pct",
    }


COUNTERS = [m for op in OPS for k, m in _ids(op).items() if k in ("sectors", "requests", "data_bytes")]
COUNTERS += [L2_SECTORS, L2_IDEAL, L2_EXCESS, *L2_CYCLES["sum"]]
RATIOS = [m for op in OPS for k, m in _ids(op).items() if k in ("spr", "bytes_per_sector_pct")]
# bytes used per sector quoted by NVIDIA's MemoryCacheAccessPattern message, and the sector size
MESSAGE_RATIOS = {op: tuple(f"message_{m}" for m in sector_use_metric(op)) for op in OPS}
RATIOS += [m for op in OPS for m in (*sector_use_metric(op), *MESSAGE_RATIOS[op])]
RATIOS += [MEM_SOL, *L2_CYCLES["avg"], "rule_speedup_pct"]

# ncu's own UncoalescedGlobalAccess message (2023-2025 wording), kept in kernel_rule_results.
_RULE_TEXT = re.compile(r"total of (\d+) excessive sectors \(\d+% of the total (\d+) sectors\)")


def _rule_rows(store, run_id: str) -> pd.DataFrame:
    """Excess sectors from ncu's own rule messages, for files that have the message but not the metrics."""
    rr = store.sql("""SELECT kernel_id, description, estimated_speedup_pct AS rule_speedup_pct FROM kernel_rule_results
                      WHERE run_id = $run_id AND rule_name = 'UncoalescedGlobalAccess'""", {"run_id": run_id}).df()
    if rr.empty:
        return rr
    parts = rr["description"].str.extract(_RULE_TEXT).astype("float64")
    rr["rule_excess"], rr["rule_total"] = parts[0], parts[1]
    return rr.dropna(subset=["rule_excess"]).groupby("kernel_id", as_index=False).agg(
        rule_excess=("rule_excess", "sum"), rule_total=("rule_total", "sum"), rule_speedup_pct=("rule_speedup_pct", "max"))


def _measure(g: pd.DataFrame, op: str, assumed_bytes: float) -> pd.DataFrame:
    """Excess share of sectors for one access kind, from the most direct data present."""
    import pandas as pd

    m = _ids(op)
    sectors, requests = col(g, m["sectors"]), col(g, m["requests"])
    spr = (sectors / requests.where(requests > 0)).fillna(col(g, m["spr"]))
    data = col(g, m["data_bytes"])
    used_pct = col(g, m["bytes_per_sector_pct"]).fillna(100 * data / (32 * sectors.where(sectors > 0)))
    used, ceiling = sector_use_metric(op)  # the full section set's form
    used_pct = used_pct.fillna(100 * col(g, used) / col(g, ceiling).where(lambda x: x > 0))
    quoted, quoted_ceiling = MESSAGE_RATIOS[op]  # else NVIDIA's words
    by_message = used_pct.isna() & col(g, quoted).notna()
    used_pct = used_pct.fillna(100 * col(g, quoted) / col(g, quoted_ceiling).where(lambda x: x > 0))
    # Ideal sectors per request: the bytes a request asks for, in 32-byte sectors (aligned access).
    ideal_spr = np.ceil(data / requests.where(requests > 0) / 32 - 1e-9)
    assumed = ideal_spr.isna()
    ideal_spr = ideal_spr.fillna(assumed_bytes)  # 32 threads x assumed bytes / 32-byte sectors
    by_used = (1 - used_pct / 100).clip(lower=0)
    by_spr = (1 - ideal_spr / spr).clip(lower=0)
    out = pd.DataFrame({
        "op": op, "excess_share": by_used.fillna(by_spr),
        "method": np.where(by_message & by_used.notna(), "ncu MemoryCacheAccessPattern message",
                           np.where(by_used.notna(), "bytes per sector",
                                    np.where(by_spr.notna(), "sectors per request", None))),
        "sectors_per_request": spr, "ideal_sectors_per_request": ideal_spr.where(by_spr.notna()),
        "ideal_assumed": assumed & by_used.isna(), "bytes_used_per_sector_pct": used_pct,
        "sectors": sectors, "requests": requests,
    }, index=g.index)
    return out


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    df = ncu_launches(store, run_id, [DURATION, *COUNTERS, *RATIOS])
    quoted = sector_use_from_messages(store, run_id)
    if not df.empty and not quoted.empty:
        df = df.merge(quoted.rename(columns=lambda c: c if c == "kernel_id" else f"message_{c}"),
                      on="kernel_id", how="left")
    rr = _rule_rows(store, run_id)
    if not rr.empty:
        df = store.sql("SELECT kernel_id, device_id, coalesce(name, '?') AS name, coalesce(short_name, name, '?') "
                       "AS short_name FROM kernels WHERE run_id = $run_id", {"run_id": run_id}).df() \
            .astype({"device_id": "float64"}).merge(df, how="left").merge(rr, on="kernel_id", how="left")
    if df.empty:
        return df
    g = per_kernel(df, sums=[*COUNTERS, "rule_excess", "rule_total"], means=RATIOS, weight=DURATION)
    g = g[g["time_share"].isna() | (g["time_share"] >= p["min_time_share"])]
    parts = []
    # Source Counters (per-instruction L2 sectors vs ideal, loads and stores together) first, as NVIDIA does.
    total, excess = col(g, L2_SECTORS), col(g, L2_EXCESS).fillna(col(g, L2_SECTORS) - col(g, L2_IDEAL))
    total, excess = total.fillna(g["rule_total"]), excess.fillna(g["rule_excess"])
    src = pd.DataFrame({"op": "global", "excess_share": (excess / total.where(total > 0)).clip(lower=0),
                        "method": np.where(col(g, L2_SECTORS).notna(), "L2 theoretical sectors",
                                           "ncu UncoalescedGlobalAccess message"),
                        "excess_sectors": excess, "total_sectors": total, "ideal_assumed": False}, index=g.index)
    parts.append(src[src["excess_share"].notna()])
    for op in OPS:
        m = _measure(g, op, p["assumed_access_bytes"])
        parts.append(m[m["excess_share"].notna() & ~m.index.isin(src.index[src["excess_share"].notna()])])
    found = pd.concat(parts)
    # No excess is no finding, at a threshold of 0 too.
    found = found[(found["excess_share"] > 0) & (found["excess_share"] >= p["min_excess_share"])]
    rows = []
    for idx, f in found.iterrows():
        r = g.loc[idx]
        share = float(f["excess_share"])
        one = g.loc[[idx]]
        l2_busy = next((b for b in (col(one, a).iloc[0] / col(one, e).iloc[0] for a, e in L2_CYCLES.values())
                        if b == b), np.nan)
        weight = l2_busy if l2_busy == l2_busy else r.get(MEM_SOL, np.nan) / 100
        gain = share * weight  # NVIDIA's estimate: excess share x L2 busy share
        if f["method"] == "ncu UncoalescedGlobalAccess message" and r.get("rule_speedup_pct") == r.get("rule_speedup_pct"):
            gain = r["rule_speedup_pct"] / 100  # ncu computed it with the counters the file lacks
        loss = as_int(r["duration_ns"] * gain) if r["duration_ns"] == r["duration_ns"] and gain == gain else None
        what = OPS.get(f["op"], "accesses")
        if f["method"] in ("L2 theoretical sectors", "ncu UncoalescedGlobalAccess message"):
            detail = f"{num(f['excess_sectors'])} of {num(f['total_sectors'])} L2 sectors are excess"
        elif f["method"] in ("bytes per sector", "ncu MemoryCacheAccessPattern message"):
            detail = f"only {f['bytes_used_per_sector_pct'] * 0.32:.1f} of every 32 bytes fetched are used"
        else:
            detail = (f"{f['sectors_per_request']:.1f} sectors per request where "
                      f"{f['ideal_sectors_per_request']:.0f} would do"
                      + (f" (assuming {p['assumed_access_bytes']:.0f}-byte accesses)" if f["ideal_assumed"] else ""))
        evidence = {k: f.get(k) for k in ("op", "method", "sectors_per_request", "ideal_sectors_per_request",
                                           "ideal_assumed", "bytes_used_per_sector_pct", "sectors", "requests",
                                           "excess_sectors", "total_sectors") if k in f.index}
        evidence.update(excess_share=share, launches=int(r["launches"]), duration_ns=r["duration_ns"],
                        l2_active_share=l2_busy, estimated_gain_share=gain)
        if f["ideal_assumed"]:  # info whatever its loss (the diagnosis keeps it, see rules/base.py)
            evidence["severity_reason"] = "the access width is assumed, not measured, so the waste may not be real"
        rows.append(kernel_finding(
            r, evidence,
            value=share, value_unit="share", threshold=p["min_excess_share"],
            est_loss_ns=loss, severity="info" if f["ideal_assumed"] else "warning",
            message=f"{kernel_label(r['name'], r['short_name'])}: uncoalesced global {what}: {detail}, {pct(share)} of the traffic wasted"
                    + (f", est. {ns(loss)}" if loss else ""),
            hint="Make consecutive threads touch consecutive addresses: index with threadIdx.x in the fastest-"
                 "varying dimension, transpose through shared memory, or switch to a structure-of-arrays layout."
                 + (" Collect smsp__sass_data_bytes_mem_global_op_ld.sum to know the access width."
                    if f["ideal_assumed"] else ""),
        ))
    return name_launchers(store, run_id, pd.DataFrame(rows))


_APPLIES = f"""
SELECT (SELECT count(*) FROM kernel_metrics WHERE run_id = $run_id AND value IS NOT NULL AND (
          coalesce(metric_id, metric_name) IN ('{L2_SECTORS}', '{L2_EXCESS}')
          OR regexp_matches(metric_id, '^(l1tex__t_sectors_pipe_lsu_mem_global_op_(ld|st)\\.sum|'
                                       || 'l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_(ld|st)\\.ratio|'
                                       || 'smsp__sass_average_data_bytes_per_sector_mem_global_op_(ld|st)\\.pct)$'))) > 0
    OR (SELECT count(*) FROM kernel_rule_results WHERE run_id = $run_id
          AND rule_name IN ('UncoalescedGlobalAccess', 'MemoryCacheAccessPattern')) > 0
"""

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class I002Evidence(NcuTimedEvidence, kw_only=True, forbid_unknown_fields=True):
    bytes_used_per_sector_pct: Annotated[Optional[float], doc("bytes used of each 32-byte sector fetched, %")]
    estimated_gain_share: Annotated[Optional[float], doc("estimated share of the kernel's time saved by coalescing")]
    excess_sectors: Annotated[Optional[float], doc("sectors fetched beyond the ideal")]
    excess_share: Annotated[float, doc("share of sectors fetched beyond the ideal")]
    ideal_assumed: Annotated[bool, doc("whether the ideal sectors per request were assumed (no access width measured)")]
    ideal_sectors_per_request: Annotated[Optional[float], doc("sectors a fully coalesced request needs")]
    l2_active_share: Annotated[Optional[float], doc("share of cycles L2 was active")]
    launches: Annotated[int, doc("launches")]
    method: Annotated[str, doc("how the excess sectors were measured")]
    op: Annotated[str, doc("the operator")]
    requests: Annotated[Optional[float], doc("memory requests")]
    sectors: Annotated[Optional[float], doc("sectors fetched")]
    sectors_per_request: Annotated[Optional[float], doc("sectors fetched per request")]
    total_sectors: Annotated[Optional[float], doc("sectors fetched in all")]


RULE = linked(Rule(
    id="I002",
    evidence=I002Evidence,
    name="uncoalesced-access",
    title="Uncoalesced global memory access",
    phase="instruction",
    claims="compute",
    # MemoryCacheAccessPattern: the bytes of each sector the threads use, this rule's measure too
    nvidia=(("UncoalescedGlobalAccess", ""), ("MemoryCacheAccessPattern", r"for global (loads|stores)")),
    severity="warning",
    max_severity="warning",
    severity_reason=UPPER_BOUND,
    what="Kernels whose global loads or stores fetch more 32-byte sectors than the bytes their threads use: "
         "strided, misaligned or scattered accesses.",
    why="A warp's access is served in 32-byte sectors. When consecutive threads touch addresses far apart, "
        "each sector carries a few useful bytes and the rest of the memory bandwidth is wasted: a stride-2 "
        "float access halves effective bandwidth, a fully scattered one can waste 7/8 of it.",
    how="Per kernel (counters summed over launches), the most direct measure present: the Source Counters "
        "excess (`derived__memory_l2_theoretical_sectors_global_excessive` or `memory_l2_theoretical_sectors_global` "
        "- `_ideal`, over the total, as NVIDIA's UncoalescedGlobalAccess; or the excess quoted in that rule's "
        "message in the details page); else, for loads and stores apart, the used share of each fetched "
        "sector (`smsp__sass_average_data_bytes_per_sector_mem_global_op_*.pct`, or data bytes / (32 x "
        "`l1tex__t_sectors_pipe_lsu_mem_global_op_*.sum`), or the full section set's `.ratio` / `.max_rate`, or "
        "the bytes per sector NVIDIA's MemoryCacheAccessPattern message quotes for L1TEX); else sectors per request "
        "(`l1tex__t_sectors_...` / `l1tex__t_requests_...`, or the `.ratio`) against the ideal: the bytes a "
        "request asks for in 32-byte sectors, or, when the file lacks the data bytes, `assumed_access_bytes` "
        "per thread (4 sectors per request for 32-bit accesses; then the finding is info, since wide vector "
        "loads legitimately use more). Reported at `min_excess_share` of sectors wasted (NVIDIA reports any "
        "excess). Estimated loss: time x excess share x L2 busy share (`lts__cycles_active` / "
        "`lts__cycles_elapsed`, NVIDIA's estimate), or x the memory SOL share when those cycles are missing; "
        "when the excess comes from ncu's UncoalescedGlobalAccess message, ncu's own estimated speedup. "
        "NVIDIA's counterparts: UncoalescedGlobalAccess (the Source Counters excess) and MemoryCacheAccessPattern "
        "for global accesses (bytes used per sector). They flag the same kernels on the real reports but two "
        "SGEMMs, where a warp's threads read one word of A together: few bytes of each sector are used per "
        "thread, so MemoryCacheAccessPattern flags them, but no sector is fetched beyond the ideal, so "
        "neither UncoalescedGlobalAccess nor I002 does (I005 says broadcast loads; "
        "tests/test_ncu_rules_vendor.py).",
    fix="Coalesce: consecutive threads on consecutive addresses (threadIdx.x in the contiguous dimension), "
        "structure-of-arrays layouts, transposes through shared memory, aligned base addresses.",
    requires="Nsight Compute global-access sector counters (Memory Workload Analysis tables / Source Counters, "
             "e.g. `--metrics l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum`)",
    applies_sql=_APPLIES,
    thresholds=(
        Threshold("min_excess_share", 0.1, "Share of fetched sectors wasted that is reported (NVIDIA reports any excess)."),
        Threshold("assumed_access_bytes", 4, "Bytes per thread per access assumed when the file lacks data-byte counters (16: the widest access).",
                  low=1, high=16),
        Threshold("min_time_share", 0.01, "Kernels under this share of profiled time are skipped (when timed)."),
    ),
    evaluate=evaluate,
    references=(
        "Nsight Compute rules UncoalescedGlobalAccess and MemoryCacheAccessPattern",
        "CUDA C++ Best Practices Guide: 'Coalesced Access to Global Memory'",
    ),
))
