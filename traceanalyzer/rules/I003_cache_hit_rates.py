"""I003 low cache hit rates: L1/TEX or L2 hit rates low on kernels that lean on memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import numpy as np

from ..fmt import kernel_label, nbytes, pct
from ._code import name_launchers
from ._ncu import DURATION, MEM_SOL, col, has_metrics, kernel_finding, linked, ncu_launches, per_kernel
from .base import Rule, Threshold
from .evidence import NcuTimedEvidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

L1_HIT, L2_HIT = "l1tex__t_sector_hit_rate.pct", "lts__t_sector_hit_rate.pct"
DRAM_RATE = "dram__bytes.sum.per_second"
DRAM_IDS = ("dram__bytes.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")
# Global-load sectors the SMs asked L1 for, and sectors read from DRAM: about equal when each
# byte is read once (a streaming kernel), where no cache can hit.
LOAD_SECTORS, DRAM_READ_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "dram__sectors_read.sum"
CACHES = {"L1/TEX": (L1_HIT, "max_l1_hit_pct"), "L2": (L2_HIT, "max_l2_hit_pct")}
_HINTS = {
    "L1/TEX": "If threads of a block re-read the same data, stage it in shared memory or reorder accesses so "
              "reuse happens while the line is still in L1; make sure loads can use L1 (no .cg / volatile).",
    "L2": "If data is re-read across blocks, tile the loop so a working set fits in L2 (block swizzling, "
          "smaller tiles, persisting L2 access policy window); if every byte is read once, the low rate is "
          "inherent: cut the bytes instead.",
}


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    df = ncu_launches(store, run_id, [DURATION, L1_HIT, L2_HIT, MEM_SOL, DRAM_RATE, *DRAM_IDS,
                                      LOAD_SECTORS, DRAM_READ_SECTORS])
    if df.empty:
        return df
    # ncu reports hit rates over 100% on tiny kernels (replay passes disagree): not usable.
    for hit, _ in CACHES.values():
        if hit in df.columns:
            df[hit] = df[hit].where(df[hit].between(0, 100))
    secs = col(df, DURATION) / 1e9
    df["dram_bytes"] = col(df, "dram__bytes.sum").fillna(col(df, "dram__bytes_read.sum")
                                                          + col(df, "dram__bytes_write.sum").fillna(0)) \
        .fillna(col(df, DRAM_RATE) * secs)
    # Weight of a launch in the kernel's average: its DRAM traffic, else its memory-busy time, else its time.
    df["_weight"] = df["dram_bytes"].fillna(col(df, MEM_SOL) / 100 * col(df, DURATION)).fillna(col(df, DURATION))
    df["_dram_read_sectors"] = col(df, DRAM_READ_SECTORS).fillna(col(df, "dram__bytes_read.sum") / 32)
    g = per_kernel(df, sums=["dram_bytes", LOAD_SECTORS, "_dram_read_sectors"], means=[L1_HIT, L2_HIT, MEM_SOL],
                   weight="_weight")
    # sectors loaded per sector read from DRAM: 1 when every byte is read once
    g["reuse"] = g[LOAD_SECTORS] / g["_dram_read_sectors"].where(g["_dram_read_sectors"] > 0)
    g = g[g["time_share"].isna() | (g["time_share"] >= p["min_time_share"])]
    total_dram = g["dram_bytes"].sum(min_count=1)
    g["dram_share"] = g["dram_bytes"] / total_dram if total_dram and total_dram > 0 else np.nan
    # Memory-heavy: memory SOL over the line when measured, else a large share of the run's DRAM traffic.
    heavy = np.where(g[MEM_SOL].notna(), g[MEM_SOL] >= p["min_memory_sol_pct"], g["dram_share"] >= p["min_dram_share"])
    # A kernel that reads each byte once has nothing for a cache to hit: its low rates are inherent.
    # (more DRAM reads than loads is no streaming: lines fetched again, evicted before use)
    ratio = p["max_streaming_reuse_ratio"]
    streaming = (g["reuse"] * ratio >= 1) & (g["reuse"] <= ratio)
    g = g[heavy & ~streaming]
    rows = []
    for cache, (hit_id, limit) in CACHES.items():
        low = g[g[hit_id] < p[limit]]
        for r in low.to_dict("records"):
            hit = r[hit_id] / 100
            mem = r[MEM_SOL]
            why = (f"memory at {mem:.0f}% of peak" if mem == mem else
                   f"{nbytes(r['dram_bytes'])} of DRAM traffic, {pct(r['dram_share'])} of the run's")
            severity = "warning" if mem == mem and mem >= p["warning_memory_sol_pct"] else "info"
            evidence = {"cache": cache, "hit_rate_pct": r[hit_id], "l1_hit_pct": r[L1_HIT], "l2_hit_pct": r[L2_HIT],
                        "memory_sol_pct": mem, "dram_bytes": r["dram_bytes"], "dram_share": r["dram_share"],
                        "reuse": None if r["reuse"] != r["reuse"] else r["reuse"],
                        "launches": int(r["launches"]), "duration_ns": r["duration_ns"], "time_share": r["time_share"],
                        "cold_cache_caveat": "ncu flushes caches before each replay pass by default "
                                             "(--cache-control all): hit rates are cold-cache"}
            rows.append(kernel_finding(
                r, evidence,
                value=hit, value_unit="share", threshold=p[limit] / 100,
                severity=severity,
                message=f"{kernel_label(r['name'], r['short_name'])}: {cache} hit rate {pct(hit)} on a memory-heavy kernel ({why})"
                        + (f", over {int(r['launches'])} launches" if r["launches"] > 1 else ""),
                hint=_HINTS[cache] + " ncu measured with cold caches by default: re-profile with "
                                     "--cache-control none before acting on a small gap.",
            ))
    out = pd.DataFrame(rows)
    if not out.empty:
        out = out.sort_values(["severity", "value"], ascending=[False, True], kind="stable")
    return name_launchers(store, run_id, out)


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class I003Evidence(NcuTimedEvidence, kw_only=True, forbid_unknown_fields=True):
    cache: Annotated[str, doc("the cache with the low hit rate (L1 or L2)")]
    cold_cache_caveat: Annotated[str, doc("why a low hit rate may come from ncu's cache flushing between replays")]
    dram_bytes: Annotated[float, doc("bytes moved to and from DRAM")]
    dram_share: Annotated[float, doc("share of the kernel's memory traffic that went to DRAM")]
    hit_rate_pct: Annotated[float, doc("the cache's hit rate, %")]
    l1_hit_pct: Annotated[float, doc("L1 hit rate, %")]
    l2_hit_pct: Annotated[float, doc("L2 hit rate, %")]
    launches: Annotated[int, doc("launches")]
    memory_sol_pct: Annotated[Optional[float], doc("memory Speed-of-Light throughput, % of peak")]
    reuse: Annotated[Optional[float], doc("global-load sectors requested from L1 per sector read from DRAM (1: each byte read once); null unmeasured")] = None
    time_share: Annotated[Optional[float], doc("share of the run's kernel time")]


RULE = linked(Rule(
    id="I003",
    evidence=I003Evidence,
    name="cache-hit-rates",
    title="Low L1/TEX or L2 hit rate on a memory-heavy kernel",
    phase="instruction",
    claims="compute",
    severity="info",
    what="Kernels that lean on memory (memory Speed Of Light high, or a large share of the run's DRAM traffic) "
         "whose L1/TEX or L2 sector hit rate is low.",
    why="Every miss goes one level further out: an L2 miss costs DRAM bandwidth, the scarcest resource on the "
        "chip. On a kernel that re-reads data, a low hit rate means the reuse is not being captured and the "
        "same bytes cross the DRAM bus again.",
    how="Per kernel, `l1tex__t_sector_hit_rate.pct` and `lts__t_sector_hit_rate.pct` (details labels L1/TEX "
        "Hit Rate, L2 Hit Rate) averaged over launches weighted by memory traffic (DRAM bytes: `dram__bytes.sum`, "
        "read + write, or rate x duration; else memory SOL x duration; else duration). Values outside 0-100% "
        "(ncu prints up to 230% on tiny kernels whose replay passes disagree) are dropped. A kernel is "
        "memory-heavy when its memory SOL reaches `min_memory_sol_pct`, or, without SOL, when it moves "
        "`min_dram_share` of the run's DRAM bytes. Each cache under its limit (`max_l1_hit_pct`, "
        "`max_l2_hit_pct`; NVIDIA has no threshold for this, these are heuristics) is one finding; warning "
        "when memory SOL reaches `warning_memory_sol_pct`, info otherwise. Caveat: ncu flushes all caches "
        "before each replay pass by default (`--cache-control all`), so the rates are cold-cache and understate "
        "what a kernel sees in a running application. A streaming kernel that reads each byte once has a low "
        "rate by nature: a kernel whose global-load sectors requested from L1 "
        "(`l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum`) are within a factor `max_streaming_reuse_ratio` of the "
        "sectors read from DRAM (`dram__sectors_read.sum`, or `dram__bytes_read.sum` / 32) is skipped. No time estimate: a hit rate alone does not say what the misses cost.",
    fix="Capture reuse: shared-memory tiling, loop reordering or block swizzling so a working set stays in "
        "L1/L2, L2 persistence windows; for read-once data, reduce the bytes instead.",
    requires="Nsight Compute hit rates (`l1tex__t_sector_hit_rate.pct`, `lts__t_sector_hit_rate.pct`, Memory "
             "Workload Analysis) with memory SOL or DRAM byte counters",
    applies_sql=has_metrics((L1_HIT, L2_HIT), (MEM_SOL, DRAM_RATE, *DRAM_IDS)),
    thresholds=(
        Threshold("max_l1_hit_pct", 20, "L1/TEX hit rates under this % are reported (heuristic)."),
        Threshold("max_l2_hit_pct", 50, "L2 hit rates under this % are reported (heuristic)."),
        Threshold("min_memory_sol_pct", 60, "Memory SOL % that makes a kernel memory-heavy (NVIDIA's latency line: 60)."),
        Threshold("warning_memory_sol_pct", 80, "Memory SOL % at which a low hit rate is a warning (memory-bound: 80)."),
        Threshold("min_dram_share", 0.05, "Without SOL: share of the run's DRAM bytes that makes a kernel memory-heavy."),
        Threshold("min_time_share", 0.01, "Kernels under this share of profiled time are skipped (when timed)."),
        Threshold("max_streaming_reuse_ratio", 1.1, "Kernels whose loaded sectors are within this factor of the sectors read from DRAM read each byte about once (streaming): skipped."),
    ),
    evaluate=evaluate,
    references=(
        "Nsight Compute Kernel Profiling Guide: 'Memory Workload Analysis', 'Cache Control'",
        "CUDA C++ Best Practices Guide: 'Shared Memory', 'L2 Cache' (access policy window)",
    ),
))
