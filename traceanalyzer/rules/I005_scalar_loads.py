"""I005 scalar instead of vector loads: few bytes per thread per global load/store instruction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import numpy as np

from ..fmt import kernel_label, num, pct
from ._code import name_launchers
from ._ncu import (DURATION, MEM_SOL, col, fill_missing, kernel_finding, linked, metrics_exist, ncu_launches,
                   per_kernel, rule_results_exist, sector_use_from_messages, sector_use_metric)
from .base import Rule, Threshold
from .evidence import NcuTimedEvidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

ALL_INST = "smsp__inst_executed.sum"
THREADS_PER_INST = "smsp__thread_inst_executed_per_inst_executed.ratio"  # Avg. Active Threads Per Warp


def _ids(op: str) -> dict[str, tuple[str, ...]]:
    return {
        "data_bytes": (f"smsp__sass_data_bytes_mem_global_op_{op}.sum",),
        "used_pct": (f"smsp__sass_average_data_bytes_per_sector_mem_global_op_{op}.pct",),
        # bytes used per sector and its ceiling (32): the full section set's form of used_pct
        "used_bytes": (sector_use_metric(op)[0],),
        "sector_bytes": (sector_use_metric(op)[1],),
        "sectors": (f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum",),
        "inst": (f"smsp__sass_inst_executed_op_global_{op}.sum", f"smsp__inst_executed_op_global_{op}.sum"),
        "requests": (f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum",),
        "thread_inst": (f"smsp__sass_thread_inst_executed_op_global_{op}.sum",),
    }


OPS = {"ld": "loads", "st": "stores"}
# Distinct bytes per thread under this (a 4-byte word, less 10% for partly used sectors) say
# sub-word elements or shared addresses, not the access width.
SHARED_BELOW_BYTES = 3.6
_PER_SECTOR = ("used_pct", "used_bytes", "sector_bytes")
COUNTERS = sorted({m for op in OPS for k, ms in _ids(op).items() if k not in _PER_SECTOR for m in ms} | {ALL_INST})
RATIOS = sorted({m for op in OPS for k in _PER_SECTOR for m in _ids(op)[k]} | {THREADS_PER_INST, MEM_SOL})

def _widths(g: pd.DataFrame, op: str) -> pd.DataFrame:
    """Bytes per active thread per instruction, and how each input was obtained."""
    import pandas as pd

    m = _ids(op)
    sectors = col(g, *m["sectors"])
    data = col(g, *m["data_bytes"])
    data_from = np.where(data.notna(), "data bytes", None)
    used_pct = col(g, *m["used_pct"]).fillna(100 * col(g, *m["used_bytes"]) / col(g, *m["sector_bytes"]).where(
        lambda x: x > 0))
    from_sectors = used_pct / 100 * sectors * 32  # bytes used of the sectors fetched
    data_from = np.where(data.isna() & from_sectors.notna(), "sector bytes x used share", data_from)
    data = data.fillna(from_sectors)
    inst = col(g, *m["inst"])
    inst_from = np.where(inst.notna(), "instructions", None)
    requests = col(g, *m["requests"])  # one request per warp-level global instruction
    inst_from = np.where(inst.isna() & requests.notna(), "requests", inst_from)
    inst = inst.fillna(requests)
    threads = col(g, *m["thread_inst"]) / inst.where(inst > 0)
    threads_from = np.where(threads.notna(), f"thread-level {op} instructions", None)
    avg_active = col(g, THREADS_PER_INST)
    threads_from = np.where(threads.isna() & avg_active.notna(), "average active threads per warp (all instructions)",
                            threads_from)
    threads = threads.fillna(avg_active)
    threads_from = np.where(threads.isna(), "assumed 32 (full warps)", threads_from)
    threads = threads.fillna(32.0)
    width = data / (inst.where(inst > 0) * threads)
    return pd.DataFrame({"op": op, "bytes_per_thread": width, "instructions": inst, "data_bytes": data,
                         "threads_per_instruction": threads, "data_from": data_from, "instructions_from": inst_from,
                         "threads_from": threads_from}, index=g.index)


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    df = ncu_launches(store, run_id, [DURATION, *COUNTERS, *RATIOS])
    df = fill_missing(df, sector_use_from_messages(store, run_id))  # the file's own bytes per sector first
    if df.empty:
        return df
    g = per_kernel(df, sums=COUNTERS, means=RATIOS, weight=DURATION)
    g = g[g["time_share"].isna() | (g["time_share"] >= p["min_time_share"])]
    all_inst = col(g, ALL_INST)
    rows = []
    for op, what in OPS.items():
        w = _widths(g, op)
        inst_share = w["instructions"] / all_inst.where(all_inst > 0)
        # Loads that are a sliver of the instruction stream are not worth vectorizing.
        hit = (w["bytes_per_thread"] < p["min_access_bytes"]) & (inst_share.isna() | (inst_share >= p["min_inst_share"]))
        for idx in g.index[hit.fillna(False)]:
            r, x = g.loc[idx], w.loc[idx]
            width = float(x["bytes_per_thread"])
            label = kernel_label(r["name"], r["short_name"])
            of_all = f", {pct(inst_share[idx])} of all" if inst_share[idx] == inst_share[idx] else ""
            # Sectors count each byte once however many threads read it: under a word per thread,
            # the elements are 1-2 bytes wide or threads of a warp share addresses, and which of the
            # two the counters cannot tell.
            unclear = x["data_from"] == "sector bytes x used share" and width < SHARED_BELOW_BYTES
            # Instructions left if the same bytes moved in 16-byte (128-bit) accesses.
            saved = None if unclear else x["instructions"] * (1 - width / 16)
            evidence = {**{k: x[k] for k in w.columns}, "instruction_share": inst_share[idx],
                        "instructions_saved_at_16_bytes": saved, "access_width_known": not unclear,
                        "memory_sol_pct": r[MEM_SOL], "launches": int(r["launches"]), "duration_ns": r["duration_ns"]}
            if unclear:
                message = (f"{label}: global {what} fetch {width:.1f} distinct bytes per thread per instruction over "
                           f"{num(x['instructions'])} instructions{of_all}: 1-2 byte elements, or threads of a warp "
                           "reading the same addresses (broadcast); the sector counters cannot tell which")
                hint = ("If threads of a warp read the same value (a row of A in a naive GEMM), load it once into a "
                        "register or a shared-memory tile and reuse it; if the elements are 1-2 bytes, move several per "
                        "thread in 16-byte vectors (half2, char4, int4). The source view (ncu --import-source) shows "
                        "which load it is.")
            else:
                message = (f"{label}: global {what} move {width:.1f} bytes per thread per instruction "
                           f"({8 * width:.0f}-bit accesses on average) over {num(x['instructions'])} instructions"
                           f"{of_all}; 16-byte accesses would need {pct(width / 16)} of them")
                hint = ("Load and store through vector types (float4/int4, or float2 for 8-byte elements) with 16-byte "
                        "aligned pointers, or process several consecutive elements per thread; check the SASS for "
                        "LDG.E.128 instead of LDG.E.")
            rows.append(kernel_finding(r, evidence, value=width, value_unit="bytes", threshold=p["min_access_bytes"],
                                       message=message, hint=hint))
    return name_launchers(store, run_id, pd.DataFrame(rows))


_DATA = [m for op in OPS for k in ("data_bytes", "used_pct", "used_bytes") for m in _ids(op)[k]]
_INST = [m for op in OPS for k in ("inst", "requests") for m in _ids(op)[k]]

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class I005Evidence(NcuTimedEvidence, kw_only=True, forbid_unknown_fields=True):
    access_width_known: Annotated[bool, doc("whether the access width per instruction was measured (else assumed)")]
    bytes_per_thread: Annotated[float, doc("bytes each thread loads per instruction")]
    data_bytes: Annotated[float, doc("bytes loaded")]
    data_from: Annotated[str, doc("the metric the bytes come from")]
    instruction_share: Annotated[Optional[float], doc("share of load instructions that are scalar")]
    instructions: Annotated[float, doc("load instructions executed")]
    instructions_from: Annotated[str, doc("the metric the instructions come from")]
    instructions_saved_at_16_bytes: Annotated[Optional[float], doc("instructions saved with 16-byte loads")]
    launches: Annotated[int, doc("launches")]
    memory_sol_pct: Annotated[Optional[float], doc("memory Speed-of-Light throughput, % of peak")]
    op: Annotated[str, doc("the operator")]
    threads_from: Annotated[str, doc("the metric the threads come from")]
    threads_per_instruction: Annotated[float, doc("threads active per load instruction")]


RULE = linked(Rule(
    id="I005",
    evidence=I005Evidence,
    name="scalar-loads",
    title="Scalar instead of vector global loads and stores",
    phase="instruction",
    claims="compute",
    severity="info",
    what="Kernels whose global loads or stores move under `min_access_bytes` per thread per instruction: "
         "4-byte (or smaller) scalar accesses where 8- or 16-byte vector accesses would move the same bytes "
         "with a half or a quarter of the instructions.",
    why="Each load instruction occupies an issue slot and an LSU/L1 request; a bandwidth-hungry kernel issuing "
        "one 32-bit load per element needs four times the instructions of one using 128-bit loads, fills the "
        "load queues (lg_throttle stalls) and keeps fewer bytes in flight per warp.",
    how="Per kernel, counters summed over launches, loads and stores apart: bytes per thread per instruction = "
        "data bytes / (instructions x active threads per instruction). Data bytes: "
        "`smsp__sass_data_bytes_mem_global_op_{ld,st}.sum`, else used share of the sectors fetched "
        "(`smsp__sass_average_data_bytes_per_sector_mem_global_op_*.pct`, or the full section set's `.ratio` / "
        "`.max_rate`, or the bytes per sector NVIDIA's MemoryCacheAccessPattern message quotes for L1TEX) "
        "x 32 x `l1tex__t_sectors_..._op_*.sum`. "
        "Instructions: `smsp__sass_inst_executed_op_global_*.sum` (or `smsp__inst_executed_op_global_*.sum`), "
        "else requests `l1tex__t_requests_pipe_lsu_mem_global_op_*.sum` (assumed one per warp instruction). "
        "Active threads: thread-level `smsp__sass_thread_inst_executed_op_global_*.sum` / instructions, else "
        "Avg. Active Threads Per Warp over all instructions, else 32 (assumed); the evidence says which. "
        "When data bytes come from sectors, they count each byte once however many threads read it: under "
        "3.6 bytes per thread the finding says the elements are 1-2 bytes wide or threads share addresses "
        "(broadcast loads, as a naive GEMM's row of A), with no instruction estimate. "
        "Kernels whose global instructions are under `min_inst_share` of all executed instructions "
        "(`smsp__inst_executed.sum`, when present) are skipped. No time estimate: fewer instructions help only "
        "when issue or LSU throughput limits the kernel (see B004, I001 lg_throttle). "
        "Nsight Compute has no rule on the access width: its MemoryCacheAccessPattern asks how much of each "
        "sector the threads use, which is I002's question (4-byte loads of consecutive floats use whole sectors "
        "and are I005's alone).",
    fix="Use vector types (float4, int4, __half2 pairs) on 16-byte aligned data, or have each thread handle "
        "several consecutive elements.",
    requires="Nsight Compute global data-byte (or bytes-per-sector and sector) counters with global instruction "
             "or request counts",
    applies_sql=f"SELECT {metrics_exist(_INST)} AND ({metrics_exist(_DATA)} OR "
                f"{rule_results_exist('MemoryCacheAccessPattern')})",
    thresholds=(
        Threshold("min_access_bytes", 8, "Average bytes per thread per instruction under this are reported (8: 32-bit or smaller; 16 is the widest access).",
                  high=16),
        Threshold("min_inst_share", 0.02, "Skip when global load (store) instructions are under this share of all instructions."),
        Threshold("min_time_share", 0.01, "Kernels under this share of profiled time are skipped (when timed)."),
    ),
    evaluate=evaluate,
    references=(
        "NVIDIA Developer Blog: 'CUDA Pro Tip: Increase Performance with Vectorized Memory Access'",
        "Nsight Compute Kernel Profiling Guide: 'Memory Workload Analysis' (sectors, requests, data bytes)",
    ),
))
