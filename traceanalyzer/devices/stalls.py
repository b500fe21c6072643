"""Warp stall reasons: what each means and what to try (rule I001 reads kernels' stall profiles
by them, the HTML report colours them in this order)."""

# What each stall reason means and what to try, from NVIDIA's CPIStall rule texts
# (formats.md 3.2). `selected` is the issuing state, not a stall, and is left out.
REASONS = [
    ("long_scoreboard", "waiting on L1TEX data: global, local, surface or texture memory",
     "Improve memory access: coalesce loads, raise cache hit rates, stage reused data in shared memory, and keep more loads in flight (more independent work per thread)."),
    ("short_scoreboard", "waiting on MIO results: shared memory, special math (MUFU) or dynamic branches",
     "Reduce shared-memory bank conflicts and MUFU use (fast-math intrinsics, precomputed tables)."),
    ("mio_throttle", "the MIO instruction queue is full: heavy shared-memory or special-math instruction pressure",
     "Use wider shared-memory accesses (vector loads), fewer shared-memory instructions, fewer special-math ops."),
    ("lg_throttle", "the local/global memory queue is full: too many memory instructions, often register spills",
     "Use vector loads/stores (float4), cut local-memory spills (fewer registers live, __launch_bounds__)."),
    ("barrier", "waiting at __syncthreads() for the slowest warps of the block",
     "Balance work across warps between barriers, use smaller blocks, or fewer barriers."),
    ("math_pipe_throttle", "a math pipe is oversubscribed",
     "Spread work across pipes (mix FP32/INT/tensor), or use lower-precision/tensor-core paths."),
    ("wait", "fixed-latency dependencies between instructions",
     "Increase instruction-level parallelism: unroll, interleave independent operations."),
    ("no_instruction", "the instruction cache missed, or the grid is too small to keep schedulers fed",
     "Shrink hot-loop code size (less unrolling), or launch enough blocks to fill the GPU."),
    ("not_selected", "warps were eligible but another was picked (plenty of parallelism)",
     "Not a problem by itself: the scheduler has more ready warps than it can issue."),
    ("dispatch_stall", "the dispatcher could not issue (pipeline conflicts)",
     "Usually rare: check for register bank or pipe conflicts in the SASS."),
    ("drain", "waiting for memory stores to drain at warp exit", "Reduce end-of-kernel stores or spread them out."),
    ("membar", "waiting on memory barriers (__threadfence)", "Use fewer or narrower-scope fences."),
    ("imc_miss", "constant-cache misses", "Keep constant data small and accessed uniformly across a warp."),
    ("tex_throttle", "the texture queue is full", "Reduce texture/surface instruction pressure or use global loads."),
    ("sleeping", "warps sleeping (nanosleep/yield)", "Check spin-wait loops."),
    ("branch_resolving", "waiting for branch targets to resolve", "Reduce divergent or indirect branches."),
    ("misc", "miscellaneous hardware reasons", "Look at the source view in Nsight Compute."),
    ("gmma", "waiting on warpgroup MMA (Hopper)", "Overlap WGMMA with loads (pipelining)."),
]


# What a reason means and what to try where the report counted local-memory instructions and
# found none: then the reason cannot be register spills (I001 reads these instead of REASONS').
WITHOUT_LOCAL_MEMORY = {
    "lg_throttle": ("the local/global memory queue is full: too many global memory instructions; no "
                    "local-memory instruction ran, so not register spills",
                    "Issue fewer, wider global memory instructions: vector loads/stores (float4), and reuse "
                    "loaded data from registers or shared memory (tiling) instead of loading it again."),
}

# How NVIDIA's CPIStall rule message names each reason ("... cycles being stalled waiting for
# sibling warps at a CTA barrier ..."), for reports that carry the rule's verdict but not the
# stall metrics. The long-scoreboard, LG-throttle, MIO-throttle, barrier and wait phrases are read
# from real reports; the others are recalled from the rule's texts.
PHRASES = [
    ("long_scoreboard", "scoreboard dependency on a L1TEX"),
    ("short_scoreboard", "scoreboard dependency on a MIO"),
    ("mio_throttle", "waiting for the MIO"),
    ("lg_throttle", "local and global (LG) memory operations"),
    ("tex_throttle", "queue for texture operations"),
    ("barrier", "sibling warps at a CTA barrier"),
    ("membar", "on a memory barrier"),
    ("wait", "fixed latency execution dependency"),
    ("math_pipe_throttle", "execution pipe to be available"),
    ("no_instruction", "instruction cache miss"),
    ("not_selected", "scheduler to select the warp"),
    ("drain", "after EXIT"),
    ("imc_miss", "immediate constant cache"),
    ("branch_resolving", "branch target to be computed"),
    ("dispatch_stall", "dispatch stall"),
    ("sleeping", "sleep state"),
    ("misc", "miscellaneous hardware reason"),
]
