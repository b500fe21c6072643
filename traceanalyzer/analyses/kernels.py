"""Kernels: their names as small keys (`kernel_names`), their durations with or without a
timeline (`kernel_durations`), TorchInductor kernels and where they were compiled
(`compiled_kernels`, `compiled_places`), and Nsight Compute's warp-stall profiles
(`stall_profiles`). The kernel-name macros come from `kernel_library`."""

from __future__ import annotations

from ..kernel_library import SQL_MACROS as KERNEL_NAME_MACROS
from .core import Macro, TableMacro, View


# Nsight Compute's duration of a launch (its runs have no timeline).
NCU_DURATION = "gpu__time_duration.sum"


# DRAM's throughput, % of its peak (ncu's names by version).
DRAM_SOL_METRICS = ("'gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed', "
                    "'dram__throughput.avg.pct_of_peak_sustained_elapsed'")


def _stall_profiles() -> str:
    """The stall_profiles view's query (rule I001's analysis)."""
    reason = (r"'^smsp__(?:pcsamp_warps_issue_stalled_|warp_issue_stalled_|average_warps_issue_stalled_|"
              r"average_warp_latency_issue_stalled_)([a-z_]+?)(?:_per_warp_active\.pct|_per_issue_active\.ratio|"
              r"_not_issued|\.ratio|\.pct)?$'")
    return f"""
        WITH fam AS (
            SELECT run_id, kernel_id, metric_id, value, regexp_extract(metric_id, {reason}, 1) AS reason,
                   CASE WHEN metric_id LIKE 'smsp__average_warps_issue_stalled_%_per_issue_active.ratio' THEN 1
                        WHEN metric_id LIKE 'smsp__warp_issue_stalled_%_per_warp_active.pct' THEN 2
                        WHEN metric_id LIKE 'smsp__average_warp_latency_issue_stalled_%' THEN 3
                        WHEN metric_id LIKE 'smsp__pcsamp_warps_issue_stalled_%' AND metric_id NOT LIKE '%_not_issued' THEN 4
                   END AS family
            FROM kernel_metrics
            WHERE metric_id LIKE 'smsp__%stalled%' AND value IS NOT NULL AND value >= 0
        ), best AS (
            SELECT run_id, kernel_id, min(family) AS family FROM fam
            WHERE family IS NOT NULL AND reason <> '' GROUP BY run_id, kernel_id
        ), profile AS (
            SELECT f.run_id, f.kernel_id, f.reason, f.family, f.value,
                   f.value / nullif(sum(f.value) OVER (PARTITION BY f.run_id, f.kernel_id), 0) AS share
            FROM fam f JOIN best b USING (run_id, kernel_id, family)
            WHERE f.reason NOT IN ('selected')
        ), launches AS (
            SELECT k.run_id, k.kernel_id, coalesce(k.name, '?') AS name, coalesce(k.short_name, k.name, '?') AS short_name,
                   k.device_id, i.issue_active, i.dram_pct, k.duration_ns
            FROM kernel_durations k SEMI JOIN best b USING (run_id, kernel_id)
            LEFT JOIN (SELECT run_id, kernel_id,
                              max(value) FILTER (WHERE metric_id = 'smsp__issue_active.avg.per_cycle_active') AS issue_active,
                              max(value) FILTER (WHERE metric_id IN ({DRAM_SOL_METRICS})) AS dram_pct
                       FROM kernel_metrics WHERE metric_id IN ('smsp__issue_active.avg.per_cycle_active', {DRAM_SOL_METRICS})
                       GROUP BY run_id, kernel_id) i
              USING (run_id, kernel_id)
        ), by_name AS (  -- the average profile over the launches of one kernel
            SELECT l.run_id, l.name, any_value(l.short_name) AS short_name, min(l.kernel_id) AS first_id,
                   any_value(l.device_id) AS device_id, count(DISTINCT l.kernel_id) AS launches,
                   p.reason, avg(p.share) AS share, avg(l.issue_active) AS issue_active,
                   avg(CASE WHEN l.dram_pct IS NOT NULL THEN least(greatest(1 - l.dram_pct / 100, 0), 1) END) AS headroom,
                   sum(l.duration_ns) / count(*) * count(DISTINCT l.kernel_id) AS duration_ns,
                   any_value(p.family) AS family
            FROM profile p JOIN launches l USING (run_id, kernel_id)
            GROUP BY l.run_id, l.name, p.reason
        ), ranked AS (
            SELECT *, row_number() OVER (PARTITION BY run_id, name ORDER BY share DESC, reason) AS rk,
                   lead(reason) OVER (PARTITION BY run_id, name ORDER BY share DESC, reason) AS next_reason,
                   lead(share) OVER (PARTITION BY run_id, name ORDER BY share DESC, reason) AS next_share,
                   to_json(map_from_entries(list((reason, round(share, 4)) ORDER BY share DESC)
                                            OVER (PARTITION BY run_id, name))) AS profile
            FROM by_name
        )
        -- A kernel at the DRAM roof waits on DRAM: its stalls are the symptom, and for the same bytes
        -- no fix makes it faster than the roof allows. (A unit inside the SM near its peak is no
        -- such bound: fewer instructions, e.g. tiling, take load off it.)
        SELECT run_id, name, short_name, device_id, first_id, launches, reason, share, next_reason, next_share,
               issue_active, headroom, duration_ns, family, profile,
               CAST(duration_ns * least((1 - coalesce(issue_active, 0)) * share, coalesce(headroom, 1)) AS BIGINT) AS est_loss_ns
        FROM ranked WHERE rk = 1
        """


# The compiled regions and graph calls a launch can sit in (compiled_places).
COMPILED_REGION_OPS = "(name LIKE 'Torch-Compiled Region%' OR name IN ('CompiledFunction', 'CompiledFunctionBackward'))"
COMPILED_GRAPH_CALL = r"^## Call CompiledFxGraph (\S+) ##$"


DEFINES = (
    TableMacro(
        "run_is_pytorch",
        "Whether one run is a PyTorch program's (`pytorch`, one row): its operators were traced (Kineto), or "
        "its kernels are ATen's (an Nsight Systems capture of one). Advice in PyTorch's terms (`.item()`, "
        "`non_blocking=True`) follows it; other programs get it in CUDA's: `run_is_pytorch('<run id>')`.",
        "(rid) AS TABLE SELECT EXISTS (SELECT 1 FROM cpu_ops WHERE run_id = rid) "
        "OR EXISTS (SELECT 1 FROM kernels WHERE run_id = rid AND name LIKE '%at::native%') AS pytorch",
    ),
    # Whether a frame's name is compiled code running: a compiled region's operator or a graph
    # call's annotation (what a host-bound finding's advice follows).
    Macro("compiled_code_name", f"(name) AS {COMPILED_REGION_OPS} OR regexp_matches(name, '{COMPILED_GRAPH_CALL}')"),
    TableMacro(
        "compiled_places",
        "For the (`run_id`, `external_id`) pairs of the table named (a CTE's name), the operator that launched "
        "the kernels of that Kineto `External id` (the one holding Inductor's record, `kernel_meta`, else the latest "
        "to start) and the compiled region and graph call open on its thread when it began: `run_id`, "
        "`external_id`, `op_id`, `kernel_meta`, `region_op_id`, `region_name`, `graph_range_id`, `graph_hash` (the "
        "innermost of each): `compiled_places('launches')`.",
        f"""(ids) AS TABLE
        WITH c_ids AS MATERIALIZED (SELECT * FROM query_table(ids)), launchers AS (
            SELECT o.run_id, o.external_id,
                   arg_max({{'op_id': o.op_id, 'pid': o.pid, 'tid': o.tid, 'start_ns': o.start_ns,
                             'kernel_meta': o.kernel_meta}}, (o.kernel_meta IS NOT NULL, o.start_ns, o.op_id)) AS op
            FROM cpu_ops o SEMI JOIN c_ids e ON e.run_id = o.run_id AND e.external_id = o.external_id
            GROUP BY o.run_id, o.external_id
        ), regions AS (
            SELECT run_id, op_id AS id, name, pid, tid, start_ns, end_ns FROM cpu_ops
            WHERE run_id IN (SELECT run_id FROM c_ids) AND {COMPILED_REGION_OPS}
        ), graph_calls AS (
            SELECT run_id, range_id AS id, regexp_extract(name, '{COMPILED_GRAPH_CALL}', 1) AS hash, pid, tid, start_ns, end_ns
            FROM ranges WHERE kind = 'user_annotation' AND name LIKE '## Call CompiledFxGraph %'
              AND run_id IN (SELECT run_id FROM c_ids)
        ), placed AS (
            SELECT l.run_id, l.external_id, l.op,
                   (SELECT arg_max({{'id': r.id, 'name': r.name}}, (r.start_ns, r.id)) FROM regions r
                    WHERE r.run_id = l.run_id AND r.pid IS NOT DISTINCT FROM l.op.pid AND r.tid IS NOT DISTINCT FROM l.op.tid
                      AND r.start_ns <= l.op.start_ns AND r.end_ns >= l.op.start_ns) AS region,
                   (SELECT arg_max({{'id': g.id, 'hash': g.hash}}, (g.start_ns, g.id)) FROM graph_calls g
                    WHERE g.run_id = l.run_id AND g.pid IS NOT DISTINCT FROM l.op.pid AND g.tid IS NOT DISTINCT FROM l.op.tid
                      AND g.start_ns <= l.op.start_ns AND g.end_ns >= l.op.start_ns) AS graph
            FROM launchers l
        )
        SELECT run_id, external_id, op.op_id AS op_id, op.kernel_meta AS kernel_meta, region.id AS region_op_id,
               region.name AS region_name, graph.id AS graph_range_id, nullif(graph.hash, '') AS graph_hash
        FROM placed""",
    ),
    View(
        "kernel_names",
        "Per run, each distinct kernel name with `name_key`, a small integer (in name order) that "
        "joins, sorts and groups far cheaper than the long demangled name.",
        """
        SELECT run_id, row_number() OVER (PARTITION BY run_id ORDER BY name) AS name_key, name
        FROM (SELECT DISTINCT run_id, name FROM kernels WHERE name IS NOT NULL)
        """,
        reads=(),
    ),
    View(
        "compiled_kernels",
        "Every execution of a TorchInductor kernel (a kernel whose name `inductor_class` gives a class): "
        "`kernel_id`, `device_id`, `stream_id`, `start_ns`, `end_ns`, `name`, `kernel_class` (`pointwise`, "
        "`reduction`, `persistent_reduction`, `template`, ...), `fused_ops` (the operators the name says it "
        "fused, `inductor_ops`), and where the trace records them: the operator that launched it (`op_id`, by "
        "Kineto `External id`; Inductor names it after the kernel) with its `kernel_meta`; the innermost "
        "compiled region open at that launch on its thread (`region_op_id`, `region_name`: an operator named "
        "`Torch-Compiled Region: F/C` (Dynamo frame F, compile C) or AOTAutograd's `CompiledFunction` / "
        "`CompiledFunctionBackward`); and the compiled graph's call (`graph_range_id`, `graph_hash`: the "
        "`## Call CompiledFxGraph <hash> ##` annotation). One call of a graph is one `graph_range_id` (else "
        "`region_op_id`): kernels of two calls were compiled apart.",
        """
        WITH names AS (
            SELECT run_id, name, inductor_class(name) AS kernel_class, inductor_ops(name) AS fused_ops
            FROM kernel_names WHERE inductor_class(name) IS NOT NULL
        ), ks AS (
            SELECT k.run_id, k.kernel_id, k.device_id, k.stream_id, k.start_ns, k.end_ns, k.name, n.kernel_class,
                   n.fused_ops, k.external_id
            FROM kernels k JOIN names n ON n.run_id = k.run_id AND n.name = k.name
        ), launched AS (
            SELECT DISTINCT run_id, external_id FROM ks WHERE external_id IS NOT NULL
        ), placed AS (
            SELECT * FROM compiled_places('launched')
        )
        SELECT k.run_id, k.kernel_id, k.device_id, k.stream_id, k.start_ns, k.end_ns, k.name, k.kernel_class,
               k.fused_ops, p.op_id, p.kernel_meta, p.region_op_id, p.region_name, p.graph_range_id, p.graph_hash
        FROM ks k LEFT JOIN placed p ON p.run_id = k.run_id AND p.external_id = k.external_id
        """,
        reads=("inductor_class", "inductor_ops", "kernel_names", "compiled_places"),
        on_demand=True,
    ),
    View(
        "kernel_durations",
        "Every kernel (all the columns of `kernels`) with `duration_ns`, its time on the GPU: end minus "
        "start on a timeline (nsys, Kineto); for Nsight Compute, which has no timeline, the launch's "
        f"`{NCU_DURATION}` metric. NULL when neither is known.",
        f"""
        SELECT k.*, CASE WHEN k.end_ns >= k.start_ns THEN k.end_ns - k.start_ns ELSE m.duration_ns END AS duration_ns
        FROM kernels k LEFT JOIN (SELECT run_id, kernel_id, max(value) AS duration_ns FROM kernel_metrics
                                  WHERE metric_id = '{NCU_DURATION}' GROUP BY run_id, kernel_id) m
          ON m.run_id = k.run_id AND m.kernel_id = k.kernel_id
        """,
        reads=(),
    ),
    View(
        "stall_profiles",
        "Per run and kernel (by name), the warp-stall profile from Nsight Compute's stall metrics: per "
        "launch the metrics of the most direct family it has (`family` 1-4: "
        "`smsp__average_warps_issue_stalled_*_per_issue_active.ratio`, "
        "`smsp__warp_issue_stalled_*_per_warp_active.pct`, `smsp__average_warp_latency_issue_stalled_*`, "
        "`smsp__pcsamp_warps_issue_stalled_*`) as shares summing to 1 (`selected`, the issuing state, left "
        "out), averaged over the kernel's launches (`profile`, JSON reason -> share); the top `reason` and "
        "its `share`, the runner-up's (`next_reason`, `next_share`); `issue_active` (issue slots busy per cycle), `headroom` (1 - DRAM's throughput share, "
        "`gpu__dram_throughput` or `dram__throughput` % of peak, averaged over launches; NULL unmeasured), "
        "`duration_ns` (of all launches), and `est_loss_ns` = duration x (1 - issue active) x share, at most "
        "duration x headroom (a kernel at the DRAM roof is no faster for fewer stalls while it moves the same bytes). Rule I001 reports the dominant ones.",
        _stall_profiles(),
        reads=("kernel_durations",),
        on_demand=True,
    ),
    # A TorchInductor kernel's class and fused operators, from its name (kernel_library.py).
    *(Macro(name, body) for name, body in KERNEL_NAME_MACROS.items()),
)
