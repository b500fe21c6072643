"""The one schema every reader fills and every rule reads.

Each table is declared once here as (column, DuckDB type, description). The DDL, the
Arrow schema a reader's output is checked against, and ``docs/schema.md`` are all
generated from these declarations, so they cannot drift apart.

Conventions: times are BIGINT nanoseconds on one clock per run (``*_ns``); sizes are
bytes (``*_bytes``); every row carries ``run_id``; ``*_id`` columns local to a run are
only unique together with ``run_id``.
"""

from __future__ import annotations

from dataclasses import dataclass


# Raised with each change a store needs a step for (`migrations.MIGRATIONS`); a new table or
# column needs none.
SCHEMA_VERSION = 5


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    doc: str


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


def _t(name: str, doc: str, *cols: tuple[str, str, str]) -> Table:
    return Table(name, doc, tuple(Column(*c) for c in cols))


RUN = ("run_id", "VARCHAR", "Run id: the first 16 hex digits of `runs.content_hash`.")

RUNS = _t(
    "runs",
    "One row per ingested trace file.",
    RUN,
    ("source_path", "VARCHAR", "Absolute path of the file when it was ingested."),
    ("file_name", "VARCHAR", "Base name of the source file."),
    ("format", "VARCHAR", "`nsys-sqlite`, `ncu-csv`, `ncu-text`, `ncu-rep`, `kineto-json`, `torch-memory-snapshot` or `torch-memory-timeline`."),
    ("content_hash", "VARCHAR", "XXH3-128 of the file's bytes (32 hex digits); SHA-256 (64) in a store keyed with SHA-256, which keeps using it."),
    ("file_size_bytes", "BIGINT", "Size of the source file."),
    ("producer", "VARCHAR", "Tool that wrote the file (`nsys`, `ncu`, `kineto`), as far as it can be told."),
    ("producer_version", "VARCHAR", "Tool version when the file says it (nsys product version, ncu dialect, Kineto schemaVersion)."),
    ("schema_version", "VARCHAR", "Export schema version (nsys `EXPORT_SCHEMA_VERSION`, ncu CSV dialect, `ncu-rep v7` for a report's file version, Kineto trace era)."),
    ("host", "VARCHAR", "Host name the trace was recorded on, when present."),
    ("start_ns", "BIGINT", "Earliest timestamp of any GPU or host event in the run (NULL when the run has no timeline, e.g. ncu)."),
    ("end_ns", "BIGINT", "Latest timestamp of any event in the run."),
    ("span_ns", "BIGINT", "`end_ns - start_ns`."),
    ("clock", "VARCHAR", "What the run's clock is: `nsys-session` (ns since capture start), `unix-epoch`, `kineto-relative`, `none`."),
    ("rank", "INTEGER", "Distributed rank when the trace says it (Kineto `distributedInfo.rank`)."),
    ("world_size", "INTEGER", "Distributed world size when the trace says it."),
    ("warnings", "VARCHAR[]", "Non-fatal problems found while reading (missing tables, dropped rows)."),
    ("metadata", "JSON", "Format-specific extras (capture options, Kineto metadata keys, ncu column layout)."),
    ("ingested_at", "TIMESTAMP", "When the run was stored (UTC)."),
)

DEVICES = _t(
    "devices",
    "One row per GPU (or accelerator) seen in a run, with the limits the rules need.",
    RUN,
    ("device_id", "INTEGER", "Device index as used by `device_id` in the activity tables."),
    ("name", "VARCHAR", "Product name (`NVIDIA H100 80GB HBM3`, `Tesla T4`, `AMD Instinct MI210`)."),
    ("vendor", "VARCHAR", "`nvidia`, `amd`, `meta` (MTIA) or NULL."),
    ("compute_major", "INTEGER", "Compute capability major (NVIDIA)."),
    ("compute_minor", "INTEGER", "Compute capability minor (NVIDIA)."),
    ("sm_count", "INTEGER", "Streaming multiprocessors (CUs on AMD)."),
    ("max_warps_per_sm", "INTEGER", "Maximum resident warps per SM."),
    ("max_blocks_per_sm", "INTEGER", "Maximum resident blocks per SM."),
    ("max_threads_per_block", "INTEGER", "Maximum threads per block."),
    ("registers_per_sm", "INTEGER", "32-bit registers per SM."),
    ("max_registers_per_block", "INTEGER", "32-bit registers per block."),
    ("shared_mem_per_sm_bytes", "BIGINT", "Shared memory per SM."),
    ("max_shared_mem_per_block_bytes", "BIGINT", "Default shared memory limit per block."),
    ("max_shared_mem_per_block_optin_bytes", "BIGINT", "Opt-in shared memory limit per block."),
    ("warp_size", "INTEGER", "Threads per warp (32 on NVIDIA, 64 on most AMD)."),
    ("total_memory_bytes", "BIGINT", "Device memory size."),
    ("l2_cache_bytes", "BIGINT", "L2 cache size."),
    ("memory_bandwidth_bytes_per_s", "DOUBLE", "Peak DRAM bandwidth."),
    ("clock_hz", "BIGINT", "SM clock."),
    ("limits_source", "VARCHAR", "Where the limits came from: `trace`, `trace+cc-table` (gaps filled from the built-in compute-capability and product tables), or `cc-table` (all from those tables)."),
)

KERNELS = _t(
    "kernels",
    "One row per kernel execution (nsys, Kineto) or per profiled launch (ncu, with NULL times).",
    RUN,
    ("kernel_id", "BIGINT", "Row id within the run (0-based; ncu: the `ID` column)."),
    ("device_id", "INTEGER", "Device index."),
    ("context_id", "BIGINT", "CUDA context id when known."),
    ("stream_id", "BIGINT", "Stream id."),
    ("start_ns", "BIGINT", "Start on the GPU (NULL for ncu)."),
    ("end_ns", "BIGINT", "End on the GPU (NULL for ncu; ncu duration is the metric `gpu__time_duration.sum`)."),
    ("name", "VARCHAR", "Full (demangled) kernel name."),
    ("short_name", "VARCHAR", "Base function name without template arguments or parameters."),
    ("mangled_name", "VARCHAR", "Mangled name when the trace has it."),
    ("library", "VARCHAR", "Where the kernel comes from, told from its name by the store: `cublas`, `cudnn`, `nccl`, "
     "`triton`, `aten`, ..., or `user` (see 'Kernel libraries' below)."),
    ("grid_x", "INTEGER", "Grid dimension x (blocks)."),
    ("grid_y", "INTEGER", "Grid dimension y."),
    ("grid_z", "INTEGER", "Grid dimension z."),
    ("block_x", "INTEGER", "Block dimension x (threads)."),
    ("block_y", "INTEGER", "Block dimension y."),
    ("block_z", "INTEGER", "Block dimension z."),
    ("registers_per_thread", "INTEGER", "Registers per thread."),
    ("static_shared_mem_bytes", "BIGINT", "Static shared memory per block."),
    ("dynamic_shared_mem_bytes", "BIGINT", "Dynamic shared memory per block."),
    ("local_mem_per_thread_bytes", "BIGINT", "Local memory per thread."),
    ("correlation_id", "BIGINT", "Correlation id linking the kernel to its launch call (unique per process)."),
    ("pid", "BIGINT", "Process id of the launching process."),
    ("tid", "BIGINT", "Thread id of the launching call, when the launch call was found."),
    ("launch_call_id", "BIGINT", "`api_calls.call_id` of the launch call, when found."),
    ("external_id", "BIGINT", "Kineto `External id` (links to the enclosing `cpu_ops` row)."),
    ("graph_id", "BIGINT", "CUDA graph id when launched from a graph."),
    ("graph_node_id", "BIGINT", "The graph node that ran it, when a graph replay did (nsys `graphNodeId`: the "
     "instantiated node, whose creation `graph_nodes` follows back to the captured one)."),
    ("blocks_per_sm", "DOUBLE", "Kineto `blocks per SM` (grid blocks / SM count) when present."),
    ("est_achieved_occupancy_pct", "DOUBLE", "Kineto `est. achieved occupancy %` when present."),
)

COPIES = _t(
    "copies",
    "One row per memory copy (including unified-memory migrations, flagged apart).",
    RUN,
    ("copy_id", "BIGINT", "Row id within the run."),
    ("device_id", "INTEGER", "Device that executed the copy."),
    ("context_id", "BIGINT", "CUDA context id."),
    ("stream_id", "BIGINT", "Stream id."),
    ("start_ns", "BIGINT", "Start on the GPU."),
    ("end_ns", "BIGINT", "End on the GPU."),
    ("direction", "VARCHAR", "`HtoD`, `DtoH`, `DtoD`, `HtoH`, `PtoP` or `unknown` (array copies map to the device side)."),
    ("unified_memory", "BOOLEAN", "True for unified-memory (managed) page migrations, which are not explicit copies."),
    ("src_kind", "VARCHAR", "Source memory kind: `pageable`, `pinned`, `device`, `array`, `managed`, `device_static`, `managed_static`, `unknown`."),
    ("dst_kind", "VARCHAR", "Destination memory kind (same values)."),
    ("bytes", "BIGINT", "Bytes copied."),
    ("src_device_id", "INTEGER", "Source device for peer copies."),
    ("dst_device_id", "INTEGER", "Destination device for peer copies."),
    ("correlation_id", "BIGINT", "Correlation id of the API call."),
    ("pid", "BIGINT", "Process id."),
    ("tid", "BIGINT", "Thread id of the API call, when found."),
    ("api_name", "VARCHAR", "Name of the API call that issued the copy (`cudaMemcpyAsync`), when found."),
    ("launch_call_id", "BIGINT", "`api_calls.call_id` of that call, when found."),
    ("graph_node_id", "BIGINT", "The graph node that ran it, when a graph replay did (nsys `graphNodeId`)."),
)

MEMSETS = _t(
    "memsets",
    "One row per GPU memset.",
    RUN,
    ("memset_id", "BIGINT", "Row id within the run."),
    ("device_id", "INTEGER", "Device index."),
    ("context_id", "BIGINT", "CUDA context id."),
    ("stream_id", "BIGINT", "Stream id."),
    ("start_ns", "BIGINT", "Start on the GPU."),
    ("end_ns", "BIGINT", "End on the GPU."),
    ("bytes", "BIGINT", "Bytes set."),
    ("value", "BIGINT", "Value written, when known."),
    ("mem_kind", "VARCHAR", "Memory kind (same values as `copies.src_kind`)."),
    ("correlation_id", "BIGINT", "Correlation id of the API call."),
    ("pid", "BIGINT", "Process id."),
    ("tid", "BIGINT", "Thread id of the API call, when found."),
    ("api_name", "VARCHAR", "Name of the API call that issued the memset (`cudaMemsetAsync`), when found."),
    ("launch_call_id", "BIGINT", "`api_calls.call_id` of that call, when found."),
    ("graph_node_id", "BIGINT", "The graph node that ran it, when a graph replay did (nsys `graphNodeId`)."),
)

API_CALLS = _t(
    "api_calls",
    "Host-side CUDA runtime and driver API calls (and their ROCm equivalents).",
    RUN,
    ("call_id", "BIGINT", "Row id within the run."),
    ("api", "VARCHAR", "`runtime` or `driver`."),
    ("name", "VARCHAR", "Call name without the `_vNNNN` version suffix (`cudaLaunchKernel`)."),
    ("raw_name", "VARCHAR", "Name as the trace writes it."),
    ("pid", "BIGINT", "Process id."),
    ("tid", "BIGINT", "Thread id."),
    ("start_ns", "BIGINT", "Call entry."),
    ("end_ns", "BIGINT", "Call return."),
    ("correlation_id", "BIGINT", "Correlation id (links to kernels/copies/memsets/syncs of the same pid)."),
    ("return_value", "BIGINT", "Return code when recorded."),
    ("external_id", "BIGINT", "Kineto `External id` of the enclosing CPU op."),
)

SYNCS = _t(
    "syncs",
    "Synchronizations: GPU-side sync records (nsys SYNCHRONIZATION, Kineto `cuda_sync`), classified by the API call's name.",
    RUN,
    ("sync_id", "BIGINT", "Row id within the run."),
    ("kind", "VARCHAR", "`device`, `context`, `stream`, `event`, `stream_wait_event` or `unknown`."),
    ("api_name", "VARCHAR", "The synchronizing call (`cudaDeviceSynchronize`), when found."),
    ("device_id", "INTEGER", "Device index."),
    ("context_id", "BIGINT", "CUDA context id."),
    ("stream_id", "BIGINT", "Stream synchronized with (NULL for device/context syncs)."),
    ("start_ns", "BIGINT", "Start of the sync record."),
    ("end_ns", "BIGINT", "End of the sync record."),
    ("correlation_id", "BIGINT", "Correlation id of the API call."),
    ("pid", "BIGINT", "Process id."),
    ("tid", "BIGINT", "Thread id of the API call, when found."),
    ("launch_call_id", "BIGINT", "`api_calls.call_id` of the API call, when found."),
)

RANGES = _t(
    "ranges",
    "Annotated time ranges: NVTX push/pop and start/end ranges, Kineto `user_annotation` and `gpu_user_annotation`.",
    RUN,
    ("range_id", "BIGINT", "Row id within the run."),
    ("kind", "VARCHAR", "`nvtx`, `nvtx_mark`, `user_annotation`, `gpu_user_annotation`."),
    ("name", "VARCHAR", "Range text."),
    ("domain", "VARCHAR", "NVTX domain or category when present."),
    ("pid", "BIGINT", "Process id (CPU ranges)."),
    ("tid", "BIGINT", "Thread id (CPU ranges)."),
    ("device_id", "INTEGER", "Device (GPU ranges)."),
    ("stream_id", "BIGINT", "Stream (GPU ranges)."),
    ("start_ns", "BIGINT", "Range start."),
    ("end_ns", "BIGINT", "Range end (equal to start for marks)."),
)

CPU_OPS = _t(
    "cpu_ops",
    "Framework operators on the host (Kineto `cpu_op` / legacy `Operator`), with input shapes when recorded.",
    RUN,
    ("op_id", "BIGINT", "Row id within the run."),
    ("name", "VARCHAR", "Operator name (`aten::mm`)."),
    ("pid", "BIGINT", "Process id."),
    ("tid", "BIGINT", "Thread id."),
    ("start_ns", "BIGINT", "Start."),
    ("end_ns", "BIGINT", "End."),
    ("input_dims", "VARCHAR", "JSON text of `Input Dims` when recorded."),
    ("input_types", "VARCHAR", "JSON text of `Input type` when recorded."),
    ("concrete_inputs", "VARCHAR", "JSON text of `Concrete Inputs` when recorded: scalar arguments as the trace "
     "writes them (`'[1, 1]'`, `'True'`, `''` for a tensor or None)."),
    ("external_id", "BIGINT", "`External id`."),
    ("sequence_number", "BIGINT", "Autograd `Sequence number`."),
    ("kernel_meta", "VARCHAR", "JSON text of what TorchInductor's launcher records on the operator that launches a "
     "compiled kernel (the operator is named after the kernel): `kernel_name`, `kernel_backend`, `kernel_file` (the "
     "generated source), `kernel_hash`, `kernel_kwargs` (block sizes: `XBLOCK=1024`), `num_warps`, `num_stages`, "
     "`grid`, those the trace wrote; NULL on other operators."),
)

PYTHON_FUNCTIONS = _t(
    "python_functions",
    "Python frames on the host (Kineto `python_function` events, recorded with `with_stack=True`): source "
    "lines (`model.py(42): forward`) and, with `with_modules`, `nn.Module: Name_N` frames.",
    RUN,
    ("function_id", "BIGINT", "Row id within the run."),
    ("name", "VARCHAR", "Frame as the trace names it."),
    ("pid", "BIGINT", "Process id."),
    ("tid", "BIGINT", "Thread id."),
    ("start_ns", "BIGINT", "Start."),
    ("end_ns", "BIGINT", "End."),
)

MEMORY_EVENTS = _t(
    "memory_events",
    "Allocator events: Kineto `[memory]` instants, nsys `CUDA_GPU_MEMORY_USAGE_EVENTS`.",
    RUN,
    ("event_id", "BIGINT", "Row id within the run."),
    ("ts_ns", "BIGINT", "When it happened."),
    ("device_type", "VARCHAR", "`cuda` (a GPU: CUDA, or HIP on ROCm, which PyTorch calls `cuda` too), `cpu` or the raw code."),
    ("device_id", "INTEGER", "Device index (-1 for CPU)."),
    ("address", "BIGINT", "Address allocated or freed."),
    ("bytes", "BIGINT", "Signed size: positive for an allocation, negative for a free."),
    ("total_allocated_bytes", "BIGINT", "Allocator total after the event, when the trace records it."),
    ("total_reserved_bytes", "BIGINT", "Allocator reserved total after the event, when recorded."),
    ("pid", "BIGINT", "Process id."),
    ("tid", "BIGINT", "Thread id."),
)

MEMORY_SEGMENTS = _t(
    "memory_segments",
    "PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`): one row per segment the caching allocator "
    "holds at the time of the snapshot (a range it reserved with `cudaMalloc`, cut into `memory_blocks`).",
    RUN,
    ("segment_id", "BIGINT", "Row id within the run (the snapshot's order)."),
    ("device_id", "INTEGER", "Device index."),
    ("address", "BIGINT", "Start address."),
    ("total_bytes", "BIGINT", "Size: memory reserved from the device."),
    ("allocated_bytes", "BIGINT", "Bytes of its blocks allocated to tensors (`active_allocated`)."),
    ("active_bytes", "BIGINT", "Allocated bytes plus those freed but still in use by a stream (`active_pending_free`)."),
    ("requested_bytes", "BIGINT", "Bytes the live allocations asked for, before rounding up to block sizes."),
    ("stream_id", "BIGINT", "CUDA stream the segment serves (0: the default stream)."),
    ("segment_type", "VARCHAR", "`large` or `small` (the pool of blocks of at most 1 MB)."),
    ("pool_id", "VARCHAR", "Memory pool as `a,b`: `0,0` is the default pool, others are private pools (CUDA graphs)."),
    ("is_expandable", "BOOLEAN", "Whether it is an expandable segment (`expandable_segments:True`), which grows in place."),
    ("stack_id", "BIGINT", "`memory_frames.stack_id` of the stack that allocated it, when recorded."),
)

MEMORY_BLOCKS = _t(
    "memory_blocks",
    "PyTorch memory snapshot: the blocks each segment is cut into, at the time of the snapshot, in address order.",
    RUN,
    ("block_id", "BIGINT", "Row id within the run."),
    ("segment_id", "BIGINT", "`memory_segments.segment_id` of its segment."),
    ("device_id", "INTEGER", "Device index."),
    ("address", "BIGINT", "Start address."),
    ("bytes", "BIGINT", "Size."),
    ("requested_bytes", "BIGINT", "Bytes the allocation asked for (free blocks: what the last one did)."),
    ("state", "VARCHAR", "`active_allocated` (a live tensor), `active_pending_free` (freed, still used by a stream) "
     "or `inactive` (free, kept by the allocator)."),
    ("stack_id", "BIGINT", "`memory_frames.stack_id` of the stack that allocated it; NULL for a block allocated "
     "before the history was recorded."),
)

ALLOCATOR_EVENTS = _t(
    "allocator_events",
    "PyTorch memory snapshot: the allocator history it recorded (`_record_memory_history`, a ring buffer of the "
    "last actions), oldest first.",
    RUN,
    ("event_id", "BIGINT", "Row id within the run: the recorded order, device after device."),
    ("device_id", "INTEGER", "Device index."),
    ("ts_ns", "BIGINT", "When (the snapshot's `time_us` since the Unix epoch, in ns); NULL when not recorded."),
    ("action", "VARCHAR", "`alloc`, `free_requested` (the tensor was freed: allocated memory drops), "
     "`free_completed` (its block is free for reuse), `segment_alloc`, `segment_free`, `segment_map`, "
     "`segment_unmap`, `snapshot` or `oom` (an allocation failed)."),
    ("address", "BIGINT", "Address of the block or segment (NULL for `oom`)."),
    ("bytes", "BIGINT", "Size; for `oom` the request that failed."),
    ("stream_id", "BIGINT", "CUDA stream."),
    ("device_free_bytes", "BIGINT", "For `oom`: the device memory CUDA reported free."),
    ("stack_id", "BIGINT", "`memory_frames.stack_id` of the stack of the call, when recorded."),
)

MEMORY_FRAMES = _t(
    "memory_frames",
    "PyTorch memory snapshot: the distinct stacks of its blocks, segments and events, one row per frame.",
    RUN,
    ("stack_id", "BIGINT", "Stack id within the run (each distinct stack once)."),
    ("depth", "INTEGER", "Position in the stack, 0 for the innermost frame."),
    ("filename", "VARCHAR", "Source file (`??` or empty for a C++ frame without one)."),
    ("line", "BIGINT", "Line number (0 for C++ frames)."),
    ("name", "VARCHAR", "Function name (Python) or symbol (C++)."),
)

ALLOCATOR_SETTINGS = _t(
    "allocator_settings",
    "PyTorch memory snapshot: the caching allocator's settings when it was taken (`allocator_settings`, PyTorch 2.5 and later).",
    RUN,
    ("alloc_conf", "VARCHAR", "`PYTORCH_CUDA_ALLOC_CONF` as set."),
    ("expandable_segments", "BOOLEAN", "Whether segments grow in place (`expandable_segments:True`)."),
    ("max_split_size_bytes", "BIGINT", "Blocks larger than this are never split (`max_split_size_mb`); NULL: no limit."),
    ("garbage_collection_threshold", "DOUBLE", "`garbage_collection_threshold` (0: off)."),
    ("settings", "JSON", "Every setting the snapshot records, as written."),
)

MEMORY_TIMELINE = _t(
    "memory_timeline",
    "PyTorch profiler memory timeline (`prof.export_memory_timeline`): changes of device memory by category.",
    RUN,
    ("event_id", "BIGINT", "Row id within the run (the file's order, which is time order)."),
    ("ts_ns", "BIGINT", "When (profiler clock, ns since the Unix epoch); tensors that existed before profiling "
     "began are at the first time of the file."),
    ("device_id", "INTEGER", "Device (the file names none: 0, the export's default `cuda:0`)."),
    ("action", "VARCHAR", "`preexisting`, `create`, `increment_version` (memory moves to the category of the "
     "tensor's new version: two rows), `destroy`; NULL from the plot layout, which records levels only."),
    ("bytes", "BIGINT", "Signed change: positive when memory enters the category, negative when it leaves."),
    ("category", "VARCHAR", "`parameter`, `optimizer_state`, `input`, `temporary`, `activation`, `gradient`, "
     "`autograd_detail` or `unknown`, as PyTorch's memory profiler tells them."),
)

KERNEL_METRICS = _t(
    "kernel_metrics",
    "Nsight Compute: one row per profiled kernel launch and metric, values in base units.",
    RUN,
    ("kernel_id", "BIGINT", "The launch (`kernels.kernel_id`, i.e. ncu's `ID`)."),
    ("section", "VARCHAR", "ncu section (`GPU Speed Of Light Throughput`; `raw` for the raw page)."),
    ("metric_name", "VARCHAR", "Metric label (details page) or metric id (raw page)."),
    ("metric_id", "VARCHAR", "ncu metric id when known (raw page, or a details label the reader maps)."),
    ("unit", "VARCHAR", "Base unit after conversion (`byte`, `ns`, `%`, `cycle`, `byte/s`, `Hz`, ...)."),
    ("value", "DOUBLE", "Value in `unit`; NULL when not numeric."),
    ("raw_unit", "VARCHAR", "Unit as the file writes it."),
    ("raw_value", "VARCHAR", "Value as the file writes it."),
)

KERNEL_RULE_RESULTS = _t(
    "kernel_rule_results",
    "Nsight Compute's own rule results, kept so a user can compare: the rule rows of a 2023+ "
    "details-page CSV, the rule results stored in a `.ncu-rep` report and those a console text report "
    "prints (every ncu reader fills it).",
    RUN,
    ("kernel_id", "BIGINT", "The launch."),
    ("section", "VARCHAR", "ncu section."),
    ("rule_name", "VARCHAR", "ncu rule identifier (`TheoreticalOccupancy`); a text report does not print it: "
     "told from the message wording there, NULL when not recognised."),
    ("rule_type", "VARCHAR", "`OPT`, `WRN`, `INF`, ..."),
    ("description", "VARCHAR", "Rule text."),
    ("speedup_type", "VARCHAR", "`global` or `local`."),
    ("estimated_speedup_pct", "DOUBLE", "ncu's estimated speedup."),
)

LAUNCH_RANGES = _t(
    "launch_ranges",
    "Nsight Compute `--nvtx`: the NVTX ranges open around each profiled launch, as ncu lists them per "
    "launch (its launches are on no timeline, so they cannot be placed among `ranges` by time): one row per "
    "launch and range (`ingest/ncu_nvtx.py`).",
    RUN,
    ("kernel_id", "BIGINT", "The launch (`kernels.kernel_id`, ncu's `ID`)."),
    ("kind", "VARCHAR", "`push_pop` (the launching thread's push/pop stack) or `start_end` (a start/end range open then)."),
    ("depth", "INTEGER", "Place in ncu's list, 0 the outermost (for `push_pop`, the bottom of the stack)."),
    ("name", "VARCHAR", "Range text."),
    ("domain", "VARCHAR", "NVTX domain (`<default domain>` when the range named none)."),
    ("tid", "BIGINT", "The thread whose push/pop stack it is, as ncu prints it (`push_pop` rows)."),
)

KERNEL_LINKS = _t(
    "kernel_links",
    "Nsight Compute launches matched to the kernels of the timeline (nsys or Kineto) of the same program "
    "(`traceanalyzer link`, `check`/`scan` given both; `traceanalyzer/link.py`): one row per launch of the "
    "ncu run, matched or not, and one per launch configuration of the timeline that no ncu launch matched. "
    "Written by the store (`Store.write_links`), never guessed: a launch that matches nothing for sure is "
    "listed unmatched, with the reason.",
    ("run_id", "VARCHAR", "The timeline run (nsys or Kineto)."),
    ("ncu_run_id", "VARCHAR", "The Nsight Compute run."),
    ("side", "VARCHAR", "`both` (a matched ncu launch), `ncu` (an ncu launch no timeline kernel matched) or "
     "`timeline` (a timeline launch configuration no ncu launch matched)."),
    ("ncu_kernel_id", "BIGINT", "The ncu launch (`kernels.kernel_id` of the ncu run, ncu's `ID`); NULL on `timeline` rows."),
    ("ncu_name", "VARCHAR", "The kernel name as ncu printed it; NULL on `timeline` rows."),
    ("kernel_id", "BIGINT", "The timeline launch matched (`kernels.kernel_id` of the timeline run); on a `timeline` "
     "row the configuration's first launch; NULL when the configuration matched but the timeline has fewer "
     "launches of it than ncu profiled."),
    ("device_id", "INTEGER", "The timeline kernel's device (NULL on `ncu` rows)."),
    ("name", "VARCHAR", "The timeline kernel's name (`kernels.name` of the timeline run; NULL on `ncu` rows)."),
    ("grid_x", "INTEGER", "Grid x of the configuration (the timeline's; ncu's on `ncu` rows)."),
    ("grid_y", "INTEGER", "Grid y."),
    ("grid_z", "INTEGER", "Grid z."),
    ("block_x", "INTEGER", "Block x of the configuration."),
    ("block_y", "INTEGER", "Block y."),
    ("block_z", "INTEGER", "Block z."),
    ("name_match", "VARCHAR", "How the names matched: `mangled` (the same mangled name), `name` (the same name once "
     "normalised: spacing, `const`, casts and suffixes of template numbers, lambda and anonymous-namespace "
     "spellings, parameters left out) or `function` (the same function name, the only timeline kernel of that "
     "name); NULL when unmatched."),
    ("launch_match", "VARCHAR", "How the launch was told among the kernel's: `grid and block` (the same "
     "configuration, then the n-th ncu launch of it is the n-th timeline launch of it), `launch order` (ncu "
     "has no grid and block: the n-th ncu launch of the kernel is its n-th timeline launch) or `only "
     "configuration`; NULL when unmatched."),
    ("unmatched", "VARCHAR", "Why a row is unmatched (`side` `ncu` or `timeline`); NULL on `both` rows."),
)

GRAPH_NODES = _t(
    "graph_nodes",
    "Graph replays tied to where their graphs were captured: one row per kernel, copy or memset a graph launch "
    "ran, placed or not. A placed operation is launched, for `launch_context` and everything that names code, "
    "where its node was captured. Two sources: a Kineto replay merged with the trace recorded while its graphs "
    "were captured (`check --capture`, `store/capture_merge.py`): the capture's frames open there are copied "
    "into the run (`cpu_ops`, `python_functions`, `ranges`, on the capture's thread and clock, moved to end "
    "before the run's first event when the two would overlap), and a kernel gets the `external_id` of the "
    "operator that launched it there; and an nsys export with `CUDA_GRAPH_NODE_EVENTS` (written by its "
    "reader): each replayed operation's `graphNodeId` is followed back through its clones "
    "(`originalGraphNodeId`) to the event that created the node, on the capturing thread inside the captured "
    "call, where the run's own NVTX ranges are open. Never guessed: an operation that is not matched is "
    "unplaced, with the reason.",
    RUN,
    ("kind", "VARCHAR", "`kernel`, `copy` or `memset` (`gpu_activity.kind`)."),
    ("item_id", "BIGINT", "Row id in its table (`kernels.kernel_id`, ...)."),
    ("launch_call_id", "BIGINT", "The graph launch that ran it (`api_calls.call_id` of `cudaGraphLaunch` / `hipGraphLaunch`)."),
    ("replay", "INTEGER", "The graph launch's number in the run (0-based, by launch start)."),
    ("node", "INTEGER", "The operation's position in its replay (0-based, by GPU start)."),
    ("capture_file", "VARCHAR", "Base name of the capture trace matched (NULL when unplaced and no graph matched, "
     "and for nsys, whose export holds its own node events)."),
    ("capture_graph", "INTEGER", "The stream capture of that file whose graph the replay ran (0-based, by start; "
     "NULL for nsys)."),
    ("captured_name", "VARCHAR", "The kernel the capture's launch call names (ROCm `args.kernel`); NULL when the "
     "capture names none (CUDA traces) and for copies and memsets."),
    ("placed", "BOOLEAN", "Whether the operation was matched to its node of the captured graph."),
    ("how", "VARCHAR", "How: `name and order` (the replay runs the captured graph's kernels, by name, in its order), "
     "`order` (the capture names no kernels: kinds and order agree), `name and occurrence (run in another order)` (the "
     "replay ran the graph's nodes in another order, as a graph captured on several streams does: the n-th operation "
     "of a kernel name is the n-th captured launch of it), with `, among N identical graphs` when N "
     "captured graphs hold the same operations (the replays take them in capture order); nsys: `graph node id` "
     "(the node's creation event, found by `graphNodeId` through its clones)."),
    ("reason", "VARCHAR", "Why an operation is unplaced: no captured graph of the replay's length, or the captured "
     "launch at its position names another kernel; nsys: no creation event for its node, no `graphNodeId`, or a "
     "whole-graph execution (`--cuda-graph-trace=graph`), whose nodes were not traced."),
    ("pid", "BIGINT", "Process of the captured launch call (of the copied frames; nsys: of the node's creation)."),
    ("tid", "BIGINT", "Thread of the captured launch call (nsys: that created the node)."),
    ("at_ns", "BIGINT", "Start of the captured launch call, on the copied frames' clock (nsys: the node's "
     "creation event, on the run's own clock): where `launch_context` places the operation."),
    ("external_id", "BIGINT", "The `external_id` given to the kernel: the copied operator that launched its node."),
    ("capture_call_id", "BIGINT", "nsys: the API call in which its node was created, on that thread "
     "(`api_calls.call_id`: the captured `cudaLaunchKernel`, `cudaMemcpyAsync`, ...; the outermost where calls "
     "nest); NULL for a Kineto merge, whose capture's calls are not in the run."),
)

FINDINGS = _t(
    "findings",
    "What the rules found: one row per finding, pointing back at rows of the source trace. Written by `check`/`scan`.",
    RUN,
    ("rule_id", "VARCHAR", "Stable rule code (`T001`); `traceanalyzer rules ID` explains it."),
    ("severity", "VARCHAR", "`info`, `warning` or `error`: from the estimated loss's share of the device's span (`diagnosis`, docs/rules/README.md#severity), else the rule's."),
    ("device_id", "INTEGER", "Device, when the finding is about one."),
    ("stream_id", "BIGINT", "Stream, when the finding is about one."),
    ("item_kind", "VARCHAR", "What `item_id` points at: `kernel`, `copy`, `memset`, `range`, `stream`, `device`, `run`."),
    ("item_id", "BIGINT", "Row id in the table named by `item_kind` (e.g. `kernels.kernel_id`)."),
    ("item_name", "VARCHAR", "Kernel name, copy description, range name."),
    ("start_ns", "BIGINT", "Start of the time range to look at (the worst example for aggregate findings)."),
    ("end_ns", "BIGINT", "End of that time range."),
    ("value", "DOUBLE", "The measured quantity the threshold applies to."),
    ("value_unit", "VARCHAR", "Unit of `value` and `threshold` (`ns`, `share`, `waves`, `pct`)."),
    ("threshold", "DOUBLE", "The threshold `value` was compared with."),
    ("est_loss_ns", "BIGINT", "Estimated time this costs the run: the rule's estimate (an upper bound unless the rule's doc says otherwise), bounded by the budget part it claims and shared with no other headline finding (`diagnosis`); NULL on related findings."),
    ("message", "VARCHAR", "One line: what is wrong, where, how much."),
    ("hint", "VARCHAR", "A concrete thing to try."),
    ("evidence", "JSON", "Details: counts, worst examples with time ranges, causes."),
    ("fingerprint", "VARCHAR", "Identity for baselines: the rule and what the finding is about (the run's rank, device, stream, item kind and name), never the file name, run id or a measured value (`rules.engine.fingerprint`)."),
    ("claims", "VARCHAR", "The part of the device's time budget (`time_budget`) the loss is time of: `compute` or `communication` (of the kernel named), `copy` or copies of one direction (`copy:HtoD`, `copy:DtoH`, `copy:DtoD`), `idle`, or idle of one cause (`idle:sync`, `idle:host`); NULL: none. Set by the rule."),
    ("finding_no", "INTEGER", "The finding's number in its run: headlines by estimated loss, largest first (then severity), each followed by its related findings (`diagnosis`)."),
    ("related_to", "INTEGER", "For a finding that shares its root cause (the same part of the budget, the same kernel) with a headline finding: that headline's `finding_no`; NULL on headlines. A related finding claims no time of its own (`est_loss_ns` NULL)."),
    ("rule_loss_ns", "BIGINT", "The rule's own estimate, before `diagnosis` bounded it by the budget (`est_loss_ns`)."),
)

RULE_RUNS = _t(
    "rule_runs",
    "Which rules ran on which run, with which thresholds, and why a rule did not apply.",
    RUN,
    ("rule_id", "VARCHAR", "Rule code."),
    ("status", "VARCHAR", "`ran`, `no-data` (the run lacks what the rule needs) or `error`."),
    ("findings", "INTEGER", "Number of findings."),
    ("note", "VARCHAR", "For `no-data`/`error`: what is missing or what failed."),
    ("params", "JSON", "Thresholds used."),
    ("evaluated_at", "TIMESTAMP", "When (UTC)."),
    ("inputs", "VARCHAR", "A digest of what the outcome was computed from: the package's code, the run's data "
     "(its storing, its links to other runs) and every threshold given. A later pass with the same digest takes "
     "the stored outcome and findings instead of computing them again."),
)

TABLES: tuple[Table, ...] = (
    RUNS, DEVICES, KERNELS, COPIES, MEMSETS, API_CALLS, SYNCS, RANGES, CPU_OPS, PYTHON_FUNCTIONS,
    MEMORY_EVENTS, MEMORY_SEGMENTS, MEMORY_BLOCKS, ALLOCATOR_EVENTS, MEMORY_FRAMES, ALLOCATOR_SETTINGS,
    MEMORY_TIMELINE, KERNEL_METRICS, KERNEL_RULE_RESULTS, LAUNCH_RANGES, KERNEL_LINKS, GRAPH_NODES, FINDINGS, RULE_RUNS,
)
BY_NAME: dict[str, Table] = {t.name: t for t in TABLES}
# Tables a reader fills (not `runs`, written from the run info, nor the links between runs, nor
# the rules' tables).
DATA_TABLES: tuple[str, ...] = tuple(
    t.name for t in TABLES if t.name not in ("runs", "kernel_links", "findings", "rule_runs"))


def arrow_type(sql_type: str):
    """The Arrow type a reader gives a column of DuckDB type `sql_type` (the one map of the two)."""
    import pyarrow as pa  # here: the schema's declarations are read where pyarrow is not needed

    return {
        "VARCHAR": pa.string(), "JSON": pa.string(), "BIGINT": pa.int64(), "INTEGER": pa.int32(),
        "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_(), "VARCHAR[]": pa.list_(pa.string()),
        "TIMESTAMP": pa.timestamp("us"),
    }[sql_type]


def arrow_schema(table: str, columns=None):
    """The Arrow schema of a table's columns: `columns` (names), or all of them."""
    import pyarrow as pa

    types = {c.name: c.type for c in BY_NAME[table].columns}
    return pa.schema([(c, arrow_type(types[c])) for c in (columns or types)])


def ddl(table: Table) -> str:
    cols = ",\n  ".join(f"{c.name} {c.type}" for c in table.columns)
    return f"CREATE TABLE IF NOT EXISTS {table.name} (\n  {cols}\n)"


def markdown() -> str:
    """docs/schema.md, generated (tests check the committed file matches)."""
    out = [
        "# Store schema",
        "",
        "Generated from `traceanalyzer/schema.py` by `python -m traceanalyzer.gendocs`;",
        "a test fails when this file and the code disagree.",
        "",
        __doc__.strip().split("\n\n")[-1].replace("\n", " ").strip(),
        "",
        f"This is schema version {SCHEMA_VERSION}. A store records its version in the table "
        "`store_info` (`key` `schema_version`, `value`); a store made by an earlier release is "
        "brought up to date when it is opened, its runs kept: missing tables and columns are added "
        "(NULL in the runs stored before), and numbered steps rewrite what changed meaning "
        "(`traceanalyzer/store/migrations.py`). A store of a newer version is refused.",
        "",
    ]
    for t in TABLES:
        out += [f"## `{t.name}`", "", t.doc, "", "| column | type | meaning |", "|---|---|---|"]
        out += [f"| `{c.name}` | {c.type} | {c.doc} |" for c in t.columns]
        out.append("")
    return "\n".join(out)

