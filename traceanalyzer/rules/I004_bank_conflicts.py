"""I004 shared-memory bank conflicts: extra wavefronts for shared loads or stores."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Optional

from ..fmt import kernel_label, ns, num, pct
from ._code import name_launchers
from ._ncu import (DURATION, as_int, col, kernel_finding, linked, metrics_exist, ncu_launches, per_kernel,
                   rule_results_exist)
from .base import UPPER_BOUND, Rule, Threshold
from .evidence import NcuTimedEvidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

L1TEX_SOL = "l1tex__throughput.avg.pct_of_peak_sustained_active"
OPS = {
    "ld": {"what": "loads", "conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
           "wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
           "requests": ("smsp__sass_inst_executed_op_shared_ld.sum", "smsp__inst_executed_op_shared_ld.sum"),
           "extra_requests": "smsp__inst_executed_op_ldsm.sum"},
    "st": {"what": "stores", "conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
           "wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
           "requests": ("smsp__sass_inst_executed_op_shared_st.sum", "smsp__inst_executed_op_shared_st.sum"),
           "extra_requests": None},
}
COUNTERS = sorted({m for o in OPS.values() for m in (o["conflicts"], o["wavefronts"], *o["requests"],
                                                     o["extra_requests"]) if m})


# NVIDIA's SharedMemoryConflicts message (2023-2025 wording): "The memory access pattern for shared
# stores might not be optimal and causes on average a 4.1-way bank conflict across all 20971520
# shared store requests. This results in 52552692 bank conflicts, which represent 61.03% of the
# overall 86107124 wavefronts for shared stores."
_RULE_TEXT = re.compile(
    r"shared (load|store)s? might not be optimal and causes on average a [\d.]+\s*-?\s*way bank conflict "
    r"across all ([\d,]+) shared (?:load|store) requests\.\s*This results in ([\d,]+) bank conflicts,\s*"
    r"which represent [\d.]+% of the overall ([\d,]+) wavefronts")
_RULE_OP = {"load": "ld", "store": "st"}
FROM_RULE = "ncu SharedMemoryConflicts message"


def _rule_counters(store, run_id: str) -> pd.DataFrame:
    """Per launch, the request, conflict and wavefront counts NVIDIA's messages quote (one
    column per counter id), for reports that carry the verdict but not the counters."""
    import pandas as pd

    rr = store.sql("""SELECT kernel_id, description FROM kernel_rule_results
                      WHERE run_id = $run_id AND rule_name = 'SharedMemoryConflicts'""", {"run_id": run_id}).df()
    rows: dict[int, dict[str, float]] = {}
    for kernel_id, text in zip(rr["kernel_id"], rr["description"]):
        m = _RULE_TEXT.search(" ".join(str(text).split()))
        if m is None:
            continue
        op = OPS[_RULE_OP[m.group(1)]]
        requests, conflicts, wavefronts = (float(x.replace(",", "")) for x in m.group(2, 3, 4))
        rows.setdefault(int(kernel_id), {}).update(
            {op["requests"][0]: requests, op["conflicts"]: conflicts, op["wavefronts"]: wavefronts})
    return pd.DataFrame([{"kernel_id": k, **v} for k, v in rows.items()])


# DRAM's throughput, % of its peak (ncu's names by version)
DRAM_SOL = ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed")


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    df = ncu_launches(store, run_id, [DURATION, L1TEX_SOL, *DRAM_SOL, *COUNTERS])
    df["_dram_pct"] = col(df, *DRAM_SOL)
    own = [c for c in COUNTERS if c in df.columns]
    counted = set(df.loc[df[own].notna().any(axis=1), "name"]) if own else set()
    rule = _rule_counters(store, run_id)
    from_rule: set = set()
    if not rule.empty:  # the counters where the file has them, else the message's
        df = store.sql("SELECT kernel_id, device_id, coalesce(name, '?') AS name, coalesce(short_name, name, '?') "
                       "AS short_name FROM kernels WHERE run_id = $run_id", {"run_id": run_id}).df() \
            .astype({"device_id": "float64"}).merge(df, how="left")
        df = df.merge(rule, on="kernel_id", how="left", suffixes=("", "_rule"))
        for c in rule.columns.drop("kernel_id"):
            if c + "_rule" in df.columns:
                df[c] = df[c].fillna(df.pop(c + "_rule"))
        from_rule = set(df.loc[df["kernel_id"].isin(rule["kernel_id"]), "name"]) - counted
    if df.empty:
        return df
    g = per_kernel(df, sums=COUNTERS, means=[L1TEX_SOL, "_dram_pct"], weight=DURATION)
    g = g[g["time_share"].isna() | (g["time_share"] >= p["min_time_share"])]
    rows = []
    for op, m in OPS.items():
        conflicts, wavefronts = col(g, m["conflicts"]), col(g, m["wavefronts"])
        requests = col(g, *m["requests"])
        if m["extra_requests"]:
            requests = requests + col(g, m["extra_requests"]).fillna(0)  # ldmatrix reads shared memory too
        share = conflicts / wavefronts.where(wavefronts > 0)  # NVIDIA SharedMemoryConflicts
        ways = wavefronts / requests.where(requests > 0)
        hit = (share > 0) & (share >= p["min_conflict_share"])  # no conflicts, no finding (threshold 0 too)
        for idx in g.index[hit.fillna(False)]:
            r = g.loc[idx]
            s, w, l1 = float(share[idx]), ways[idx], r[L1TEX_SOL]
            # NVIDIA's GLOBAL estimate: conflict share x L1TEX throughput share; LOCAL (no time) without it.
            loss = as_int(r["duration_ns"] * s * l1 / 100) if r["duration_ns"] == r["duration_ns"] and l1 == l1 else None
            # a kernel near the DRAM roof is no faster than it allows, however its shared memory is read
            dram = r["_dram_pct"]
            if loss is not None and dram == dram:
                loss = min(loss, as_int(r["duration_ns"] * max(0.0, 1 - dram / 100)))
            evidence = {"op": op, "bank_conflicts": conflicts[idx], "wavefronts": wavefronts[idx],
                        "requests": requests[idx], "conflict_share": s, "average_ways": w,
                        "l1tex_throughput_pct": l1, "dram_throughput_pct": None if dram != dram else dram, "launches": int(r["launches"]), "duration_ns": r["duration_ns"],
                        "source": FROM_RULE if r["name"] in from_rule else "counters"}
            way_text = f"on average a {w:.1f}-way conflict, " if w == w else ""
            rows.append(kernel_finding(
                r, evidence,
                value=s, value_unit="share", threshold=p["min_conflict_share"],
                est_loss_ns=loss,
                message=f"{kernel_label(r['name'], r['short_name'])}: shared-memory {m['what']} with bank conflicts: {way_text}"
                        f"{num(conflicts[idx])} conflicts = {pct(s)} of {num(wavefronts[idx])} wavefronts"
                        + (f", est. {ns(loss)}" if loss else ""),
                hint="Pad shared arrays (e.g. [32][33] instead of [32][32]) or swizzle the index (XOR the column "
                     "with the row) so the 32 threads of a warp hit 32 different banks; for 8-byte elements "
                     "check the access width.",
            ))
    return name_launchers(store, run_id, pd.DataFrame(rows))


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class I004Evidence(NcuTimedEvidence, kw_only=True, forbid_unknown_fields=True):
    average_ways: Annotated[float, doc("average ways of a bank conflict (wavefronts per request)")]
    bank_conflicts: Annotated[float, doc("shared-memory bank conflicts counted")]
    conflict_share: Annotated[float, doc("share of shared-memory wavefronts that are bank conflicts")]
    l1tex_throughput_pct: Annotated[Optional[float], doc("L1TEX throughput, % of peak")]
    dram_throughput_pct: Annotated[Optional[float], doc("DRAM throughput, % of peak (its headroom bounds the estimate)")] = None
    launches: Annotated[int, doc("launches")]
    op: Annotated[str, doc("the operator")]
    requests: Annotated[float, doc("memory requests")]
    source: Annotated[str, doc("where the conflicts come from (counters or NVIDIA's rule)")]
    wavefronts: Annotated[float, doc("shared-memory wavefronts")]


RULE = linked(Rule(
    id="I004",
    evidence=I004Evidence,
    name="bank-conflicts",
    title="Shared-memory bank conflicts",
    phase="instruction",
    claims="compute",
    nvidia=(("SharedMemoryConflicts", ""),),
    severity="warning",
    max_severity="warning",
    severity_reason=UPPER_BOUND,
    what="Kernels whose shared-memory loads or stores need extra wavefronts because threads of a warp hit the "
         "same bank (NVIDIA's SharedMemoryConflicts rule).",
    why="Shared memory has 32 banks serving one 4-byte word each per cycle. When threads of a warp touch "
        "different words in the same bank, the access is split into several wavefronts and runs that many "
        "times slower: a 32-way conflict, as in a column read of a 32x32 tile, makes shared memory 32x slower.",
    how="Per kernel, counters summed over launches, loads and stores apart: conflict share = "
        "`l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}.sum` / "
        "`l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st}.sum`, reported at `min_conflict_share` (NVIDIA: "
        "10%); the average N-way = wavefronts / requests (`smsp__sass_inst_executed_op_shared_{ld,st}.sum`, plus "
        "`smsp__inst_executed_op_ldsm.sum` for loads). Estimated loss, NVIDIA's global estimate: time x "
        "conflict share x L1/TEX throughput share (`l1tex__throughput.avg.pct_of_peak_sustained_active`, "
        "the details page's L1/TEX Cache Throughput); none when that is missing; at most time x (1 - DRAM's "
        "throughput share, `gpu__dram_throughput`), since a kernel near the DRAM roof is no faster than it allows. A report without the "
        "counters but with NVIDIA's SharedMemoryConflicts verdicts takes the requests, conflicts and "
        "wavefronts its message quotes (the evidence's `source` says so).",
    fix="Pad or swizzle shared-memory arrays so a warp's accesses spread over all 32 banks; use ldmatrix/"
        "vectorized layouts made for it.",
    requires="Nsight Compute shared-memory bank-conflict and wavefront counters (Memory Workload Analysis tables, "
             "or `--metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,"
             "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,...`)",
    applies_sql=f"SELECT {metrics_exist((OPS['ld']['wavefronts'], OPS['st']['wavefronts']))} OR "
                f"{rule_results_exist('SharedMemoryConflicts')}",
    thresholds=(
        Threshold("min_conflict_share", 0.1, "Bank conflicts as a share of wavefronts that is reported (NVIDIA SharedMemoryConflicts: 10%)."),
        Threshold("min_time_share", 0.01, "Kernels under this share of profiled time are skipped (when timed)."),
    ),
    evaluate=evaluate,
    references=(
        "Nsight Compute rule SharedMemoryConflicts (MemoryWorkloadAnalysis_Tables)",
        "CUDA C++ Programming Guide: 'Shared Memory' (banks)",
    ),
))
