"""Details-page labels -> ncu metric ids, so rules can query one name whatever the page.

The details page keys rows by a section's display label ("Achieved Occupancy"); the raw
page and ``--metrics`` runs by metric id. The pairs below are read from the ``Label`` /
``Name`` entries of ncu's shipped ``*.section`` files (2025 set: SpeedOfLight,
LaunchStatistics, Occupancy, ComputeWorkloadAnalysis, MemoryWorkloadAnalysis,
WarpStateStatistics, InstructionStatistics, SourceCounters, WorkloadDistribution) and the
scheduler-statistics section. Labels from 2019-2020 sections ("SOL FB", "SM [%]") are in
``LEGACY`` and marked as recalled rather than read from a shipped file. The 2021-2022 Speed Of
Light header ("Compute (SM) [%]", "Memory [%]") is in ``SPEED_OF_LIGHT_2021``: the same two
labels name the same metrics in the throughput chart that 2023-2025 ``.ncu-rep`` reports embed.
``EXTRA_SECTIONS`` holds labels read from the (section, label, metric id) triples of the real
``.ncu-rep`` reports: the PM Sampling section, and custom sections a public project wrote.

A label is looked up by (section, label) first, because one label can mean two metrics:
"Memory Throughput" is a % of peak under Speed Of Light and bytes/s under Memory Workload
Analysis. Labels that mean one metric everywhere also resolve by label alone, which keeps
renamed sections ("GPU Speed Of Light" in 2020, "... Throughput" later) working.
A Metric Name that already is a metric id (``--metrics`` runs, section "Command line
profiler metrics") maps to itself.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

SPEED_OF_LIGHT = {
    "Compute (SM) Throughput": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "Duration": "gpu__time_duration.sum",
    "Memory Throughput": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "Elapsed Cycles": "gpc__cycles_elapsed.max",
    "L1/TEX Cache Throughput": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "SM Active Cycles": "sm__cycles_active.avg",
    "L2 Cache Throughput": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "SM Frequency": "gpc__cycles_elapsed.avg.per_second",
    "DRAM Throughput": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "DRAM Frequency": "dram__cycles_elapsed.avg.per_second",
}
# 2019-2020 Speed Of Light labels [recalled from the sections of that era, not re-read].
LEGACY = {
    "SM [%]": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "Memory [%]": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "SOL L2": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "SOL TEX": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "SOL L1/TEX Cache": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "SOL FB": "fbpa__throughput.avg.pct_of_peak_sustained_elapsed",
    "SOL DRAM": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "Memory Frequency": "dram__cycles_elapsed.avg.per_second",
    "L1 Hit Rate": "l1tex__t_sector_hit_rate.pct",
}
SPEED_OF_LIGHT_2021 = {
    "Compute (SM) [%]": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "Memory [%]": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
}
LAUNCH_STATISTICS = {
    "Grid Size": "launch__grid_size",
    "Block Size": "launch__block_size",
    "Function Cache Configuration": "launch__func_cache_config",
    "Cluster Size": "launch__cluster_size",
    "Preferred Cluster Size": "launch__preferred_cluster_size",
    "Cluster Scheduling Policy": "launch__cluster_scheduling_policy",
    "Registers Per Thread": "launch__registers_per_thread",
    "Static Shared Memory Per Block": "launch__shared_mem_per_block_static",
    "Dynamic Shared Memory Per Block": "launch__shared_mem_per_block_dynamic",
    "Driver Shared Memory Per Block": "launch__shared_mem_per_block_driver",
    "Shared Memory Configuration Size": "launch__shared_mem_config_size",
    "Threads": "launch__thread_count",
    "Waves Per SM": "launch__waves_per_multiprocessor",
    "Uses Green Context": "launch__uses_green_context",
    "Stack Size": "launch__stack_size",
    "# SMs": "launch__sm_count",
    "# TPCs": "launch__tpc_count",
    "Enabled TPC IDs": "launch__tpc_enabled",
}
OCCUPANCY = {
    "Theoretical Occupancy": "sm__maximum_warps_per_active_cycle_pct",
    "Theoretical Active Warps per SM": "sm__maximum_warps_avg_per_active_cycle",
    "Achieved Occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "Achieved Active Warps Per SM": "sm__warps_active.avg.per_cycle_active",
    "Block Limit Registers": "launch__occupancy_limit_registers",
    "Block Limit Shared Mem": "launch__occupancy_limit_shared_mem",
    "Block Limit Warps": "launch__occupancy_limit_warps",
    "Block Limit SM": "launch__occupancy_limit_blocks",
    "Block Limit Barriers": "launch__occupancy_limit_barriers",
    "Cluster Occupancy": "launch__occupancy_cluster_pct",
    "Overall GPU Occupancy": "launch__occupancy_cluster_gpu_pct",
    "Max Active Clusters": "launch__cluster_max_active",
    "Max Cluster Size": "launch__cluster_max_potential_size",
    "GPU Maximum Warps Per Scheduler": "smsp__warps_active.avg.peak_sustained",
    "Theoretical Warps Per Scheduler": "smsp__maximum_warps_avg_per_active_cycle",
}
SCHEDULER_STATISTICS = {
    "One or More Eligible": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "Issued Warp Per Scheduler": "smsp__issue_active.avg.per_cycle_active",
    "No Eligible": "smsp__issue_inst0.avg.pct_of_peak_sustained_active",
    "Active Warps Per Scheduler": "smsp__warps_active.avg.per_cycle_active",
    "Eligible Warps Per Scheduler": "smsp__warps_eligible.avg.per_cycle_active",
    "GPU Maximum Warps Per Scheduler": "smsp__warps_active.avg.peak_sustained",
    "Theoretical Warps Per Scheduler": "smsp__maximum_warps_avg_per_active_cycle",
    # 2019-2020 [recalled]
    "Instructions Per Active Issue Slot": "smsp__inst_issued_per_issue_active.ratio",
}
# Stall chart labels of the Warp State Statistics section (cycles per issued instruction).
_STALL_LABELS = {
    "Stall Drain": "drain", "Stall IMC Miss": "imc_miss", "Stall Barrier": "barrier",
    "Stall GMMA": "gmma", "Stall Branch Resolving": "branch_resolving",
    "Stall Membar": "membar", "Stall Short Scoreboard": "short_scoreboard",
    "Stall Sleeping": "sleeping", "Stall Wait": "wait", "Stall No Instruction": "no_instruction",
    "Stall Math Pipe Throttle": "math_pipe_throttle", "Stall Tex Throttle": "tex_throttle",
    "Stall LG Throttle": "lg_throttle", "Stall Dispatch Stall": "dispatch_stall",
    "Stall Misc": "misc", "Stall Not Selected": "not_selected", "Selected": "selected",
    "Stall Long Scoreboard": "long_scoreboard", "Stall MIO Throttle": "mio_throttle",
}
WARP_STATE_STATISTICS = {
    "Warp Cycles Per Issued Instruction": "smsp__average_warp_latency_per_inst_issued.ratio",
    "Warp Cycles Per Executed Instruction": "smsp__average_warps_active_per_inst_executed.ratio",
    "Avg. Active Threads Per Warp": "smsp__thread_inst_executed_per_inst_executed.ratio",
    "Avg. Not Predicated Off Threads Per Warp": "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio",
    "Issued Warp Per Scheduler": "smsp__issue_active.avg.per_cycle_active",
    # 2019-2020 [recalled; the older CPIStall rule divides stall cycles by it]
    "Warp Cycles Per Issue Active": "smsp__average_warps_active_per_issue_active.ratio",
    **{label: f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
       for label, reason in _STALL_LABELS.items()},
}
COMPUTE_WORKLOAD_ANALYSIS = {
    "Executed Ipc Elapsed": "sm__inst_executed.avg.per_cycle_elapsed",
    "Executed Ipc Active": "sm__inst_executed.avg.per_cycle_active",
    "Issued Ipc Active": "sm__inst_issued.avg.per_cycle_active",
    "SM Busy": "sm__instruction_throughput.avg.pct_of_peak_sustained_active",
    "Issue Slots Busy": "sm__inst_issued.avg.pct_of_peak_sustained_active",
    "Max. Issued Slots Busy": "sm__inst_issued.max.pct_of_peak_sustained_elapsed",
}
MEMORY_WORKLOAD_ANALYSIS = {
    "Memory Throughput": "dram__bytes.sum.per_second",
    "Mem Busy": "gpu__compute_memory_access_throughput.avg.pct_of_peak_sustained_elapsed",
    "Max Bandwidth": "gpu__compute_memory_request_throughput.avg.pct_of_peak_sustained_elapsed",
    "Mem Pipes Busy": "sm__memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "L1/TEX Hit Rate": "l1tex__t_sector_hit_rate.pct",
    "L2 Hit Rate": "lts__t_sector_hit_rate.pct",
    "L2 Persisting Size": "launch__persisting_l2_cache_size",
    "L2 Compression Input Sectors": "lts__gcomp_input_sectors.sum",
    "L2 Compression Success Rate": "lts__average_gcomp_input_sector_success_rate.pct",
    "L2 Compression Ratio": "lts__average_gcomp_output_sector_compression_achieved_rate.ratio",
}
INSTRUCTION_STATISTICS = {
    "Executed Instructions": "smsp__inst_executed.sum",
    "Avg. Executed Instructions Per Scheduler": "smsp__inst_executed.avg",
    "Issued Instructions": "smsp__inst_issued.sum",
    "Avg. Issued Instructions Per Scheduler": "smsp__inst_issued.avg",
}
SOURCE_COUNTERS = {
    "Branch Instructions": "smsp__inst_executed_op_branch.sum",
    "Branch Efficiency": "smsp__sass_average_branch_targets_threads_uniform.pct",
    "Branch Instructions Ratio": "derived__smsp__inst_executed_op_branch_pct",
    "Avg. Divergent Branches": "smsp__sass_branch_targets_threads_divergent.avg",
    "Executed Instructions": "smsp__inst_executed.sum",
    "Elapsed Cycles": "gpc__cycles_elapsed.max",
}
WORKLOAD_DISTRIBUTION = {
    "Average SM Active Cycles": "sm__cycles_active.avg",
    "Average L1 Active Cycles": "l1tex__cycles_active.avg",
    "Average L2 Active Cycles": "lts__cycles_active.avg",
    "Average SMSP Active Cycles": "smsp__cycles_active.avg",
    "Average DRAM Active Cycles": "dram__cycles_active.avg",
    "Total SM Elapsed Cycles": "sm__cycles_elapsed.sum",
    "Total L1 Elapsed Cycles": "l1tex__cycles_elapsed.sum",
    "Total L2 Elapsed Cycles": "lts__cycles_elapsed.sum",
    "Total SMSP Elapsed Cycles": "smsp__cycles_elapsed.sum",
    "Total DRAM Elapsed Cycles": "dram__cycles_elapsed.sum",
}

PM_SAMPLING = {
    "Maximum Buffer Size": "profiler__pmsampler_buffer_size_bytes",
    "Dropped Samples": "profiler__pmsampler_dropped_samples",
    "Maximum Sampling Interval": "profiler__pmsampler_interval_cycles",
    "# Pass Groups": "profiler__pmsampler_pass_groups",
}
# Custom sections of Lashi0812/CudaProgramming's own section files (2023 reports).
EXTRA_SECTIONS: dict[str, dict[str, str]] = {
    "PM Sampling": PM_SAMPLING,
    "Load Metrics": {
        "GLoad Throughput": "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum.per_second",
        "Load Efficiency": "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct",
        "Requested requests For GLoad": "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
        "sector/req": "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio",
    },
    "Store Metrics": {
        "GStore Throughput": "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum.per_second",
        "Store Efficiency": "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.pct",
        "Requested requests For GStore": "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
        "sector/req": "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_st.ratio",
    },
    "Shared Memory Analysis": {
        "# of warp inst exec:LoadDataShared(LDS)": "smsp__inst_executed_op_shared_ld.sum",
        "# of warp inst exec:StoreToShared(STS)": "smsp__inst_executed_op_shared_st.sum",
        "Data Bank Conflict from LDS": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "Data Bank Conflict from STS": "smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    },
}

# Section display names (every spelling seen) -> that section's label map.
BY_SECTION: dict[str, dict[str, str]] = {
    "GPU Speed Of Light Throughput": {**SPEED_OF_LIGHT, **SPEED_OF_LIGHT_2021},
    "GPU Speed Of Light": {**SPEED_OF_LIGHT, **LEGACY},
    "Launch Statistics": LAUNCH_STATISTICS,
    "Occupancy": OCCUPANCY,
    "Scheduler Statistics": SCHEDULER_STATISTICS,
    "Warp State Statistics": WARP_STATE_STATISTICS,
    "Compute Workload Analysis": COMPUTE_WORKLOAD_ANALYSIS,
    "Memory Workload Analysis": {**MEMORY_WORKLOAD_ANALYSIS, "L1 Hit Rate": LEGACY["L1 Hit Rate"]},
    "Instruction Statistics": INSTRUCTION_STATISTICS,
    "Source Counters": SOURCE_COUNTERS,
    "GPU and Memory Workload Distribution": WORKLOAD_DISTRIBUTION,
    **EXTRA_SECTIONS,
}


def _unambiguous() -> dict[str, str]:
    """Labels that mean the same metric in every section that has them."""
    seen: dict[str, set[str]] = {}
    for labels in BY_SECTION.values():
        for label, metric_id in labels.items():
            seen.setdefault(label, set()).add(metric_id)
    return {label: ids.pop() for label, ids in seen.items() if len(ids) == 1}


BY_LABEL: dict[str, str] = _unambiguous()

# A metric id: lower-case unit prefix, "__", then name characters (no spaces, no ':');
# or a derived/source-counter id without the "__" (`memory_l2_theoretical_sectors_global`),
# which is still all lower case with no spaces, unlike every details-page label.
METRIC_ID = re.compile(r"^[a-z][a-z0-9_]*__[A-Za-z0-9_.\[\]@-]+$|^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$")


def metric_id_for(section: str, label: str) -> str | None:
    if METRIC_ID.match(label):
        return label
    by_section = BY_SECTION.get(section)
    if by_section and label in by_section:
        return by_section[label]
    return BY_LABEL.get(label)


def metric_ids(sections: pa.Array, labels: pa.Array) -> pa.Array:
    """metric_id column for aligned (section, label) columns, resolved once per distinct pair."""
    keys = pc.binary_join_element_wise(sections, labels, "\x1f")
    distinct = pc.unique(keys)
    ids = [metric_id_for(*k.split("\x1f", 1)) for k in distinct.to_pylist()]
    return pa.array(ids, pa.string()).take(pc.index_in(keys, value_set=distinct))
