"""I001 warp-stall profile: which stall reason dominates a kernel's warp cycles (ncu data)."""

from typing import Annotated, Optional

from ..devices.stalls import PHRASES, REASONS, WITHOUT_LOCAL_MEMORY
from ..sql import sql_literal
from ._code import named
from ._ncu import linked
from .base import UPPER_BOUND, Rule, Threshold
from .evidence import NcuEvidence, doc


def _values_sql(rows) -> str:
    return ",\n        ".join("(" + ", ".join(sql_literal(x) for x in row) + ")" for row in rows)


# Kernels with stall metrics: the stall_profiles view's profile. Kernels without them but with
# NVIDIA's CPIStall verdicts: the verdict's reason and share ("represents about 72.6% of the total
# average of 32.9 cycles between issuing two instructions"), NVIDIA's own gate and estimate.
SQL = r"""
WITH reasons(reason, meaning, hint, meaning_no_local, hint_no_local) AS (VALUES
        __REASONS__
), phrases(reason, phrase) AS (VALUES
        __PHRASES__
), measured AS (
    SELECT device_id, first_id, name, short_name, launches, reason, share, next_reason, next_share, issue_active,
           headroom, est_loss_ns, 'stall metrics' AS source, family::VARCHAR AS family, profile, NULL::DOUBLE AS nvidia_speedup_pct
    FROM stall_profiles WHERE run_id = $run_id
), verdicts AS (
    SELECT r.kernel_id, p.reason, r.estimated_speedup_pct,
           TRY_CAST(regexp_extract(r.description, 'represents about ([0-9.]+)%', 1) AS DOUBLE) / 100 AS share
    FROM kernel_rule_results r JOIN phrases p ON strpos(r.description, p.phrase) > 0
    WHERE r.run_id = $run_id AND r.rule_name = 'CPIStall' AND r.description LIKE '%represents about%'
), by_name AS (  -- per kernel and reason, over the launches NVIDIA flagged for it
    SELECT k.name, any_value(coalesce(k.short_name, k.name)) AS short_name, min(k.kernel_id) AS first_id,
           any_value(k.device_id) AS device_id, count(DISTINCT k.kernel_id) AS launches, v.reason,
           avg(v.share) AS share, avg(v.estimated_speedup_pct) AS nvidia_speedup_pct,
           CAST(sum(k.duration_ns * v.estimated_speedup_pct / 100) AS BIGINT) AS est_loss_ns
    FROM verdicts v JOIN kernel_durations k ON k.run_id = $run_id AND k.kernel_id = v.kernel_id
    WHERE v.share IS NOT NULL AND coalesce(k.name, '?') NOT IN (SELECT name FROM measured)
    GROUP BY k.name, v.reason
), vendor AS (
    SELECT device_id, first_id, coalesce(name, '?') AS name, short_name, launches, reason, share,
           NULL::VARCHAR AS next_reason, NULL::DOUBLE AS next_share, NULL::DOUBLE AS issue_active, NULL::DOUBLE AS headroom, est_loss_ns, 'NVIDIA CPIStall rule' AS source, 'null' AS family,
           to_json(map_from_entries(list((reason, round(share, 4)) ORDER BY share DESC)
                                    OVER (PARTITION BY name))) AS profile, nvidia_speedup_pct
    FROM by_name QUALIFY row_number() OVER (PARTITION BY name ORDER BY share DESC, reason) = 1
), r AS (SELECT * FROM measured UNION ALL SELECT * FROM vendor
), local_ops AS (  -- local-memory instructions per kernel, where the report measured them
    SELECT k.name, sum(m.value) AS n FROM kernel_metrics m
    JOIN kernels k ON k.run_id = m.run_id AND k.kernel_id = m.kernel_id
    WHERE m.run_id = $run_id AND m.metric_id IN ('sass__inst_executed_local_loads', 'sass__inst_executed_local_stores',
                                                 'smsp__sass_inst_executed_op_local_ld.sum',
                                                 'smsp__sass_inst_executed_op_local_st.sum')
    GROUP BY k.name
), said AS (  -- a reason's words, those for no local-memory traffic where none was counted
    SELECT r.*, CASE WHEN l.n = 0 THEN coalesce(x.meaning_no_local, x.meaning) ELSE x.meaning END AS meaning,
           CASE WHEN l.n = 0 THEN coalesce(x.hint_no_local, x.hint) ELSE x.hint END AS hint
    FROM r LEFT JOIN reasons x USING (reason) LEFT JOIN local_ops l ON l.name = r.name
)
SELECT device_id, NULL::BIGINT AS stream_id, 'kernel' AS item_kind, first_id AS item_id, name AS item_name,
       NULL::BIGINT AS start_ns, NULL::BIGINT AS end_ns,
       share AS value, 'share' AS value_unit, $min_dominant_share AS threshold, est_loss_ns,
       -- at the DRAM roof the stalls are the symptom of the busy DRAM, not a cost of their own
       -- without durations (a stall-metrics-only report) there is no telling which kernels matter
       CASE WHEN reason = 'not_selected' OR headroom <= 1 - $roof_share OR est_loss_ns IS NULL THEN 'info' ELSE NULL END AS severity,
       printf('%s: %s of stall cycles are %s (%s)%s%s%s%s', short_name, fmt_pct(share), replace(reason, '_', ' '),
              coalesce(meaning, 'see Nsight Compute'),
              -- a runner-up within a tenth of the top share is as much the story
              CASE WHEN next_share >= 0.9 * share
                   THEN printf(', and %s close behind (%s)', replace(next_reason, '_', ' '), fmt_pct(next_share))
                   ELSE '' END,
              CASE WHEN launches > 1 THEN printf(', averaged over %d launches', launches) ELSE '' END,
              CASE WHEN source <> 'stall metrics' THEN ', from NVIDIA''s CPIStall verdict' ELSE '' END,
              CASE WHEN headroom <= 1 - $roof_share
                   THEN printf('; DRAM runs at %s of its peak, so the stalls wait on it and, for the same bytes, at '
                               || 'most %s of its time can be won', fmt_pct(1 - headroom), fmt_pct(headroom))
                   WHEN est_loss_ns IS NULL THEN '; the report has no kernel durations, so what the stalls cost is unknown'
                   ELSE '' END) AS message,
       coalesce(hint, 'Look at the stall reasons in the Nsight Compute source view.') AS hint,
       '{"reason": "' || reason || '", "launches": ' || launches || ', "issue_active": '
         || coalesce(CAST(issue_active AS VARCHAR), 'null') || ', "roof_headroom": '
         || coalesce(CAST(headroom AS VARCHAR), 'null') || ', "metric_family": ' || family
         || ', "source": "' || source || '", "nvidia_speedup_pct": '
         || coalesce(CAST(nvidia_speedup_pct AS VARCHAR), 'null') || ', "profile": ' || profile || '}' AS evidence
FROM said
WHERE share >= $min_dominant_share
  AND (issue_active IS NULL OR issue_active < $max_issue_active_ratio)
ORDER BY est_loss_ns DESC NULLS LAST, name
""".replace("__REASONS__", _values_sql((*row, *WITHOUT_LOCAL_MEMORY.get(row[0], (None, None))) for row in REASONS)).replace("__PHRASES__", _values_sql(PHRASES))

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class I001Evidence(NcuEvidence, kw_only=True, forbid_unknown_fields=True):
    reason: Annotated[str, doc("the dominant stall reason")]
    launches: Annotated[int, doc("launches")]
    issue_active: Annotated[Optional[float], doc("share of cycles with an instruction issued")]
    roof_headroom: Annotated[Optional[float], doc("1 - DRAM's throughput share of its peak, the most of its time a kernel moving the same bytes can win; null unmeasured")]
    metric_family: Annotated[Optional[int], doc("which stall metric family was read")]
    source: Annotated[str, doc("where the stall shares come from (metrics or NVIDIA's rule)")]
    nvidia_speedup_pct: Annotated[Optional[float], doc("NVIDIA's own estimated speedup, %")]
    profile: Annotated[dict[str, float], doc("share of stall cycles per reason")]


RULE = linked(Rule(
    id="I001",
    evidence=I001Evidence,
    name="warp-stalls",
    title="Dominant warp-stall reason",
    phase="instruction",
    claims="compute",
    nvidia=(("CPIStall", r"represents about"),),
    severity="warning",
    max_severity="warning",
    severity_reason=UPPER_BOUND,
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
        "(1 - issue active) x share, when the duration and issue rate were collected, at most duration x "
        "(1 - DRAM's throughput share, `gpu__dram_throughput`): a kernel at the DRAM roof waits on DRAM, and no "
        "fewer stalls make it faster while it moves the same bytes; one whose DRAM reaches `roof_share` of its "
        "peak is info (a unit inside the SM near its peak is no such bound: fewer load instructions, by tiling, "
        "take load off it), as is one whose report has no duration. A kernel "
        "without stall metrics whose report carries NVIDIA's CPIStall verdicts (details CSV rule "
        "rows, console text report, `.ncu-rep`) takes the reason its message names and the share "
        "it quotes (that reason's cycles over all cycles between two issues, the `selected` cycle "
        "included, so slightly below the profile's share), averaged over the kernel's flagged "
        "launches; NVIDIA has applied its own issue-active gate, and the estimated loss is "
        "duration x NVIDIA's estimated speedup. LG throttle is not put down to register spills "
        "where the report counted local-memory instructions and found none.",
    fix="Follow the hint for the dominant reason; confirm in Nsight Compute's source view which "
        "instructions carry the stalls.",
    requires="Nsight Compute stall-reason metrics (e.g. `--section WarpStateStats` or "
             "`--metrics smsp__warp_issue_stalled_*`), or NVIDIA's CPIStall rule results",
    applies_sql="SELECT EXISTS (SELECT 1 FROM kernel_metrics WHERE run_id = $run_id "
                "AND metric_id LIKE 'smsp__%issue_stalled%') OR EXISTS (SELECT 1 FROM kernel_rule_results "
                "WHERE run_id = $run_id AND rule_name = 'CPIStall' AND description LIKE '%represents about%')",
    thresholds=(
        Threshold("min_dominant_share", 0.3, "Share of stall cycles the top reason needs (NVIDIA CPIStall: 0.3)."),
        Threshold("max_issue_active_ratio", 0.8, "Kernels issuing on at least this share of cycles are skipped (NVIDIA CPIStall: 0.8)."),
        Threshold("roof_share", 0.8, "A kernel whose DRAM throughput reaches this share of its peak is at the DRAM roof: its stalls are info (NVIDIA's SOL rules: 80%)."),
    ),
    evaluate=named(SQL),
    references=(
        "Nsight Compute Kernel Profiling Guide: 'Warp Scheduler States' and the WarpStateStats section rules (CPIStall)",
    ),
))
