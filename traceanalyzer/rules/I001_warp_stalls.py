"""I001 warp-stall profile: which stall reason dominates a kernel's warp cycles (ncu data)."""

from .base import Rule, Threshold

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


def _values_sql() -> str:
    esc = lambda s: s.replace("'", "''")  # noqa: E731
    return ",\n        ".join(f"('{r}', '{esc(m)}', '{esc(h)}')" for r, m, h in REASONS)


# The profiles are the stall_profiles view's; the rule reports the dominant reasons.
SQL = r"""
WITH reasons(reason, meaning, hint) AS (VALUES
        __REASONS__
)
SELECT device_id, NULL::BIGINT AS stream_id, 'kernel' AS item_kind, first_id AS item_id, name AS item_name,
       NULL::BIGINT AS start_ns, NULL::BIGINT AS end_ns,
       share AS value, 'share' AS value_unit, $min_dominant_share AS threshold, est_loss_ns,
       CASE WHEN r.reason = 'not_selected' THEN 'info' ELSE NULL END AS severity,
       printf('%s: %s of stall cycles are %s (%s)%s', short_name, fmt_pct(share), replace(r.reason, '_', ' '),
              coalesce(x.meaning, 'see Nsight Compute'),
              CASE WHEN launches > 1 THEN printf(', averaged over %d launches', launches) ELSE '' END) AS message,
       coalesce(x.hint, 'Look at the stall reasons in the Nsight Compute source view.') AS hint,
       '{"reason": "' || r.reason || '", "launches": ' || launches || ', "issue_active": '
         || coalesce(CAST(issue_active AS VARCHAR), 'null') || ', "metric_family": ' || family
         || ', "profile": ' || profile || '}' AS evidence
FROM stall_profiles r LEFT JOIN reasons x USING (reason)
WHERE r.run_id = $run_id AND share >= $min_dominant_share
  AND (issue_active IS NULL OR issue_active < $max_issue_active_ratio)
ORDER BY est_loss_ns DESC NULLS LAST, name
""".replace("__REASONS__", _values_sql())

RULE = Rule(
    id="I001",
    name="warp-stalls",
    title="Dominant warp-stall reason",
    phase="instruction",
    claims="compute",
    severity="warning",
    what="Kernels whose warp stall cycles are dominated by one reason (long scoreboard, barrier, "
         "MIO throttle, math pipe throttle...), from Nsight Compute stall metrics.",
    why="When warps cannot issue, the stall reason says what they wait for; a single dominant "
        "reason points at one fix (memory access pattern, synchronization, instruction mix) "
        "instead of guesswork.",
    how="The `stall_profiles` analysis: per profiled launch, the stall metrics of the most direct family present "
        "(`smsp__average_warps_issue_stalled_*_per_issue_active.ratio`, else "
        "`smsp__warp_issue_stalled_*_per_warp_active.pct`, else "
        "`smsp__average_warp_latency_issue_stalled_*`, else `smsp__pcsamp_warps_issue_stalled_*`) "
        "are normalized into a profile that sums to 1 (`selected`, the issuing state, left out) and "
        "averaged over the launches of a kernel. The top reason is reported when its share reaches "
        "`min_dominant_share`, unless the kernel already issues on at least `max_issue_active_ratio` "
        "of cycles (NVIDIA's CPIStall gate: stalls then cost little). Estimated loss: duration x "
        "(1 - issue active) x share, when the duration and issue rate were collected.",
    fix="Follow the hint for the dominant reason; confirm in Nsight Compute's source view which "
        "instructions carry the stalls.",
    requires="Nsight Compute stall-reason metrics (e.g. `--section WarpStateStats` or "
             "`--metrics smsp__warp_issue_stalled_*`)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM kernel_metrics WHERE run_id = $run_id "
                "AND metric_id LIKE 'smsp__%issue_stalled%')",
    thresholds=(
        Threshold("min_dominant_share", 0.3, "Share of stall cycles the top reason needs (NVIDIA CPIStall: 0.3)."),
        Threshold("max_issue_active_ratio", 0.8, "Kernels issuing on at least this share of cycles are skipped (NVIDIA CPIStall: 0.8)."),
    ),
    sql=SQL,
    formats=("ncu-csv", "ncu-text", "ncu-rep"),
    references=(
        "Nsight Compute Kernel Profiling Guide: 'Warp Scheduler States' and the WarpStateStats section rules (CPIStall)",
    ),
)
