"""S003 eager attention: softmax between two matrix products over long sequences, where one fused
attention kernel would never write the score matrix to DRAM."""

from typing import Annotated

import msgspec

from .base import LARGEST, Rule, Threshold
from .evidence import Evidence, doc
from .S002_unfused_elementwise import DTYPE_BYTES

# Operators that multiply two matrices; baddbmm/addmm take the added tensor first.
MATMUL_OPS = ("aten::bmm", "aten::matmul", "aten::baddbmm", "aten::mm", "aten::addmm")
ADDED_FIRST = ("aten::baddbmm", "aten::addmm")
# aten::softmax launches through aten::_softmax; SDPA's math backend (PyTorch 2.5+) through _safe_softmax.
SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")
# The unfused path inside scaled_dot_product_attention (its math backend).
SDPA = r"scaled_dot_product"


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(f"'{n}'" for n in names)


def _matrix(i: int) -> str:
    """The i-th multiplied matrix's dims (0: the left one) of a matmul-family operator."""
    return (f"json_transform(CASE WHEN name IN ({_names(ADDED_FIRST)}) THEN json_extract(input_dims, '$[{i + 1}]') "
            f"ELSE json_extract(input_dims, '$[{i}]') END, '[\"BIGINT\"]')")


def _json_str(column: str, i: int) -> str:
    return f"CASE WHEN json_valid({column}) THEN json_extract_string({column}, '$[{i}]') END"


SQL = rf"""
WITH mm AS MATERIALIZED (  -- matrix products on the host (an aten::matmul and the aten::bmm inside it both)
    SELECT op_id, name, pid, tid, start_ns, end_ns, {_matrix(0)} AS a, {_matrix(1)} AS b
    FROM cpu_ops
    WHERE run_id = $run_id AND name IN ({_names(MATMUL_OPS)}) AND tid IS NOT NULL AND end_ns >= start_ns
      AND json_valid(input_dims)
), sm AS MATERIALIZED (  -- softmax over the last dim of a [.., Lq, Lk] tensor, both long
    SELECT op_id, name, pid, tid, start_ns, end_ns, d, d[-2] AS lq, d[-1] AS lk,
           CAST(list_product(d) AS HUGEINT) AS numel, t AS dtype, {DTYPE_BYTES} AS elt_bytes
    FROM (SELECT op_id, name, pid, tid, start_ns, end_ns,
                 json_transform(json_extract(input_dims, '$[0]'), '["BIGINT"]') AS d,
                 {_json_str('input_types', 0)} AS t, {_json_str('concrete_inputs', 1)} AS dim
          FROM cpu_ops
          WHERE run_id = $run_id AND name IN ({_names(SOFTMAX_OPS)}) AND tid IS NOT NULL AND end_ns >= start_ns
            AND json_valid(input_dims))
    WHERE len(d) >= 2 AND list_count(d) = len(d) AND list_min(d) > 0 AND list_product(d) <= {LARGEST}
      AND d[-2] >= $min_tokens_count AND d[-1] >= $min_tokens_count
      AND (dim IS NULL OR dim IN ('', '-1') OR dim = CAST(len(d) - 1 AS VARCHAR))
), before AS (  -- per thread, the last matrix product to end before each softmax starts (the outermost
    -- of those ending together)
    SELECT sm_id, last_value(mm_id IGNORE NULLS) OVER (
               PARTITION BY pid, tid ORDER BY t, k, start_ns DESC, id DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS qk_id
    FROM (SELECT pid, tid, end_ns AS t, 0 AS k, start_ns, op_id AS id, op_id AS mm_id, NULL AS sm_id FROM mm
          UNION ALL
          SELECT pid, tid, start_ns, 1, start_ns, op_id, NULL, op_id FROM sm)
    QUALIFY sm_id IS NOT NULL
), after AS (  -- and the first to start after it ends (the outermost of those starting together)
    SELECT sm_id, first_value(mm_id IGNORE NULLS) OVER (
               PARTITION BY pid, tid ORDER BY t, k, end_ns DESC, id
               ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS pv_id
    FROM (SELECT pid, tid, start_ns AS t, 1 AS k, end_ns, op_id AS id, op_id AS mm_id, NULL AS sm_id FROM mm
          UNION ALL
          SELECT pid, tid, end_ns, 0, end_ns, op_id, NULL, op_id FROM sm)
    QUALIFY sm_id IS NOT NULL
), chained AS (  -- Q.K^T makes the [.., Lq, Lk] scores the softmax reads; the next product reads its output
    SELECT s.*, qk.op_id AS qk_id, qk.start_ns AS qk_start, qk.end_ns AS qk_end,
           pv.op_id AS pv_id, pv.start_ns AS pv_start, pv.end_ns AS pv_end,
           qk.name || ' -> ' || s.name || ' -> ' || pv.name AS chain
    FROM sm s
    JOIN before ON before.sm_id = s.op_id
    JOIN after ON after.sm_id = s.op_id
    JOIN mm qk ON qk.op_id = before.qk_id
    JOIN mm pv ON pv.op_id = after.pv_id
    WHERE len(qk.a) >= 2 AND len(qk.b) >= 2 AND qk.a[-2] = s.lq AND qk.b[-1] = s.lk
      AND greatest(coalesce(list_product(list_slice(qk.a, 1, len(qk.a) - 2)), 1),
                   coalesce(list_product(list_slice(qk.b, 1, len(qk.b) - 2)), 1)) * s.lq * s.lk = s.numel
      AND len(pv.a) >= 2 AND pv.a[-2] = s.lq AND pv.a[-1] = s.lk AND list_product(pv.a) = s.numel
), blocks AS (  -- one block per pair of products: the outermost softmax between them (aten::softmax, not
    -- the aten::_softmax inside it)
    SELECT * FROM chained
    QUALIFY row_number() OVER (PARTITION BY qk_id, pv_id ORDER BY start_ns, end_ns DESC, op_id) = 1
), in_sdpa AS (  -- blocks that scaled_dot_product_attention ran unfused (its math backend)
    SELECT DISTINCT b.op_id FROM blocks b
    JOIN cpu_ops o ON o.run_id = $run_id AND o.pid = b.pid AND o.tid = b.tid
     AND o.start_ns <= b.qk_start AND o.end_ns >= b.pv_end
    WHERE regexp_matches(o.name, '{SDPA}')
), window_ops AS (  -- the operators from Q.K^T's start to the second product's end on the thread, each
    -- placed in the block whose Q.K^T started last before it
    SELECT b.op_id AS block, o.external_id,
           o.start_ns BETWEEN b.qk_start AND b.qk_end OR o.start_ns BETWEEN b.pv_start AND b.pv_end AS in_gemm,
           o.start_ns BETWEEN b.start_ns AND b.end_ns AS in_softmax
    FROM (SELECT pid, tid, start_ns, external_id FROM cpu_ops
          WHERE run_id = $run_id AND tid IS NOT NULL AND external_id IS NOT NULL) o
    ASOF JOIN blocks b ON b.pid = o.pid AND b.tid = o.tid AND o.start_ns >= b.qk_start
    WHERE o.start_ns <= b.pv_end
), block_kernels AS (  -- their kernels (Kineto `External id`), each once
    SELECT w.block, k.kernel_id, any_value(k.device_id) AS device_id, any_value(k.name) AS name,
           any_value(k.start_ns) AS start_ns, any_value(k.end_ns) AS end_ns,
           any_value(k.end_ns - k.start_ns) AS ns, bool_or(w.in_gemm) AS in_gemm,
           bool_or(w.in_softmax AND NOT w.in_gemm) AS in_softmax
    FROM window_ops w
    JOIN kernels k ON k.run_id = $run_id AND k.external_id = w.external_id AND k.end_ns >= k.start_ns
    GROUP BY w.block, k.kernel_id
), per_block AS (
    SELECT bk.block, arg_max(bk.device_id, bk.ns) AS device_id,
           sum(bk.ns) FILTER (WHERE bk.in_gemm) AS gemm_ns,
           sum(bk.ns) FILTER (WHERE bk.in_softmax) AS softmax_ns,
           sum(bk.ns) FILTER (WHERE NOT bk.in_gemm) AS other_ns,
           min(bk.start_ns) AS gpu_start, max(bk.end_ns) AS gpu_end,
           arg_max({{'id': bk.kernel_id, 'name': bk.name}}, (bk.ns, -bk.kernel_id)) FILTER (WHERE bk.in_softmax)
             AS softmax_kernel
    FROM block_kernels bk GROUP BY bk.block
), costed AS (  -- blocks whose softmax ran on the GPU, with the score matrix's size
    SELECT p.*, b.lq, b.lk, b.d, b.dtype, b.chain, b.op_id IN (SELECT op_id FROM in_sdpa) AS sdpa_math,
           b.numel * b.elt_bytes AS matrix_bytes
    FROM per_block p JOIN blocks b ON b.op_id = p.block
    WHERE p.softmax_ns > 0
), shapes AS (  -- the score matrices' shapes per device, most time first
    SELECT device_id, list({{'dims': d, 'dtype': dtype, 'blocks': n, 'softmax_ns': ns}}
                           ORDER BY ns DESC, n DESC, d::VARCHAR)[1:5] AS shapes
    FROM (SELECT device_id, d, dtype, count(*) AS n, sum(softmax_ns) AS ns FROM costed GROUP BY ALL)
    GROUP BY device_id
), kernel_time AS (
    SELECT device_id, sum(end_ns - start_ns) AS ns FROM kernels
    WHERE run_id = $run_id AND end_ns >= start_ns AND device_id IN (SELECT device_id FROM costed)
    GROUP BY device_id
), top_chains AS (  -- the operators of the blocks that took most time name the finding
    SELECT device_id, arg_max(chain, (ns, chain)) AS chain
    FROM (SELECT device_id, chain, sum(other_ns) AS ns FROM costed GROUP BY ALL) GROUP BY device_id
), per_device AS (
    SELECT c.device_id, count(*) AS blocks, min(c.lq) AS min_lq, max(c.lq) AS max_lq,
           min(c.lk) AS min_lk, max(c.lk) AS max_lk, min(c.matrix_bytes) AS min_matrix_bytes,
           max(c.matrix_bytes) AS max_matrix_bytes,
           sum(c.matrix_bytes) FILTER (WHERE c.matrix_bytes IS NOT NULL) AS matrix_bytes,
           sum(c.softmax_ns) FILTER (WHERE c.matrix_bytes IS NOT NULL) AS sized_softmax_ns,
           sum(c.gemm_ns) AS gemm_ns, sum(c.softmax_ns) AS softmax_ns, sum(c.other_ns) AS other_ns,
           count(*) FILTER (WHERE c.sdpa_math) AS sdpa_math_blocks,
           arg_max({{'id': c.softmax_kernel.id, 'chain': c.chain, 'start_ns': c.gpu_start, 'end_ns': c.gpu_end}},
                   (c.other_ns, -c.gpu_start)) FILTER (WHERE c.chain = t.chain) AS worst
    FROM costed c JOIN top_chains t USING (device_id) GROUP BY c.device_id
), judged AS (
    SELECT p.*, s.shapes, t.ns AS kernel_ns, d.memory_bandwidth_bytes_per_s AS bandwidth,
           p.other_ns / nullif(b.active_span_ns, 0) AS share,
           2 * p.matrix_bytes / nullif(p.sized_softmax_ns, 0) * 1e9 AS softmax_bytes_per_s,
           CASE WHEN p.min_lq = p.max_lq AND p.min_lk = p.max_lk AND p.max_lq = p.max_lk
                THEN printf('%,d tokens', p.max_lk)
                WHEN p.max_lq = p.max_lk THEN printf('up to %,d tokens', p.max_lk)
                ELSE printf('up to %,d queries x %,d keys', p.max_lq, p.max_lk) END AS tokens
    FROM per_device p
    JOIN shapes s USING (device_id)
    LEFT JOIN kernel_time t USING (device_id)
    LEFT JOIN this_run.device_busy b ON b.device_id = p.device_id
    LEFT JOIN devices d ON d.run_id = $run_id AND d.device_id = p.device_id
    WHERE p.other_ns / nullif(b.active_span_ns, 0) >= $min_share AND p.other_ns > 0
)
SELECT device_id, 'kernel' AS item_kind, worst.id AS item_id, 'eager attention: ' || worst.chain AS item_name,
       worst.start_ns AS start_ns, worst.end_ns AS end_ns,
       share AS value, 'share' AS value_unit, $min_share AS threshold, other_ns AS est_loss_ns,
       CASE WHEN share >= $warning_share THEN 'warning' ELSE 'info' END AS severity,
       printf('device %d: %d attention block(s) computed eagerly over %s (matrix product -> softmax -> matrix '
              || 'product), each writing a score matrix%s to DRAM and reading it back: the softmax and '
              || 'element-wise kernels between the products take %s, time a fused attention kernel would not '
              || 'spend (%s of kernel time, %s of the device''s span)%s',
              device_id, blocks, tokens,
              CASE WHEN max_matrix_bytes IS NULL THEN ''
                   ELSE ' of ' || CASE WHEN min_matrix_bytes = max_matrix_bytes THEN '' ELSE 'up to ' END
                        || fmt_bytes(max_matrix_bytes) END,
              fmt_ns(other_ns),
              fmt_pct(other_ns / nullif(kernel_ns, 0)), fmt_pct(share),
              CASE WHEN softmax_bytes_per_s IS NOT NULL AND bandwidth > 0
                   THEN printf('; the softmax moves %s/s, %s of the device''s DRAM bandwidth',
                               fmt_bytes(softmax_bytes_per_s), fmt_pct(softmax_bytes_per_s / bandwidth))
                   ELSE '' END)
         -- the products' time is the fused kernel's work too, done faster without the score matrix's
         -- round trip: said, not estimated (how much faster the trace cannot tell)
         || CASE WHEN gemm_ns > 0
                 THEN printf('; the matrix products around them take another %s (%s of kernel time), which the '
                             || 'fused kernel replaces too', fmt_ns(gemm_ns), fmt_pct(gemm_ns / nullif(kernel_ns, 0)))
                 ELSE '' END AS message,
       CASE WHEN sdpa_math_blocks < blocks THEN
              'Use a fused attention kernel: torch.nn.functional.scaled_dot_product_attention (flash or '
              || 'memory-efficient backend; Hugging Face: attn_implementation="sdpa" or "flash_attention_2"), '
              || 'FlashAttention, xformers, or torch.compile. It keeps the score matrix in on-chip tiles instead '
              || 'of writing ' || CASE WHEN max_matrix_bytes IS NULL THEN 'it'
                                       ELSE fmt_bytes(max_matrix_bytes) || ' per block' END || ' to DRAM and '
              || 'reading it back.'
              || CASE WHEN sdpa_math_blocks > 0 THEN ' ' ELSE '' END
            ELSE '' END
       || CASE WHEN sdpa_math_blocks > 0 THEN
              printf('%s scaled_dot_product_attention in its unfused math backend: make a fused backend '
                     || 'eligible (a 16-bit dtype, a supported head size, is_causal instead of an explicit '
                     || 'mask); torch.nn.attention.sdpa_kernel picks the backend, and one refused warns why.',
                     CASE WHEN sdpa_math_blocks = blocks THEN 'The blocks ran'
                          ELSE printf('%d of the blocks ran', sdpa_math_blocks) END)
            ELSE '' END AS hint,
       json_object('blocks', blocks, 'query_tokens', max_lq, 'key_tokens', max_lk, 'shapes', shapes,
                   'score_matrix_bytes', max_matrix_bytes, 'softmax_ns', softmax_ns,
                   'elementwise_ns', other_ns - softmax_ns, 'gemm_ns', gemm_ns, 'kernel_ns', kernel_ns,
                   'kernel_time_share', other_ns / nullif(kernel_ns, 0),
                   'softmax_bytes_per_s', round(softmax_bytes_per_s), 'dram_bytes_per_s', bandwidth,
                   'softmax_bandwidth_share', softmax_bytes_per_s / nullif(bandwidth, 0),
                   'sdpa_math_blocks', sdpa_math_blocks,
                   'loss_basis', 'the kernels between the two matrix products (softmax, scaling, masking, '
                                 || 'dropout); the products themselves are not counted') AS evidence
FROM judged
ORDER BY other_ns DESC, device_id
"""

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class S003Shape(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    dims: Annotated[list[int], doc("the shapes of the attention's inputs")]
    dtype: Annotated[str, doc("the input's data type")]
    blocks: Annotated[int, doc("attention blocks (matmul, softmax, matmul) found")]
    softmax_ns: Annotated[int, doc("time of the softmax kernels")]


class S003Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    blocks: Annotated[int, doc("attention blocks (matmul, softmax, matmul) found")]
    query_tokens: Annotated[int, doc("query sequence length")]
    key_tokens: Annotated[int, doc("key sequence length")]
    shapes: Annotated[list[S003Shape], doc("per input shape: blocks and softmax time")]
    score_matrix_bytes: Annotated[int, doc("bytes of the attention score matrix")]
    softmax_ns: Annotated[int, doc("time of the softmax kernels")]
    elementwise_ns: Annotated[int, doc("time of the element-wise kernels between the matmuls")]
    gemm_ns: Annotated[int, doc("time of matmul kernels")]
    kernel_ns: Annotated[int, doc("kernel time")]
    kernel_time_share: Annotated[float, doc("share of all kernel time")]
    softmax_bytes_per_s: Annotated[float, doc("the softmax kernels' bytes per second")]
    dram_bytes_per_s: Annotated[float, doc("the device's DRAM bandwidth, bytes per second")]
    softmax_bandwidth_share: Annotated[float, doc("the softmax's DRAM bandwidth share")]
    sdpa_math_blocks: Annotated[int, doc("blocks run by SDPA's math fallback")]
    loss_basis: Annotated[str, doc("what the estimated loss is computed from")]


RULE = Rule(
    id="S003",
    evidence=S003Evidence,
    name="eager-attention",
    title="Attention computed eagerly over long sequences",
    phase="structure",
    claims="compute",
    severity="info",
    what="Attention written out as operators, a matrix product for the scores (Q.K^T), a softmax "
         "over them and a second product with the values, over sequences long enough that the score "
         "matrix is large: work one fused attention kernel (FlashAttention, PyTorch's "
         "scaled_dot_product_attention) does without the matrix ever leaving the chip.",
    why="Eager attention materialises the [.., L, L] score matrix: the first product writes it to "
        "DRAM, the softmax (and any scaling, masking and dropout) reads and rewrites it, the second "
        "product reads it again. At thousands of tokens that matrix is hundreds of megabytes per "
        "layer, so the softmax is a memory-bound pass that can take as long as both products. A "
        "fused kernel computes the softmax tile by tile in on-chip memory and never stores the matrix.",
    how="On each host thread, a softmax operator (`aten::softmax`, `aten::_softmax`, "
        "`aten::_safe_softmax`) over the last dim of a tensor of at least 2 dims whose last two "
        "(Lq, Lk) are both at least `min_tokens_count` (Kineto `Input Dims`; `Concrete Inputs` "
        "when recorded must name the last dim) is an attention block when the last matrix product "
        "(`aten::bmm`, `matmul`, `baddbmm`, `mm`, `addmm`) to end before it produces exactly its "
        "scores (left matrix [.., Lq, d], right matrix [.., d, Lk], as many elements as the "
        "softmax reads) and the first to start after it reads them (left matrix [.., Lq, Lk] of "
        "that size). The block's kernels are those launched (Kineto `External id`) by the "
        "operators on that thread from the first product's start to the second's end; the kernels "
        "of the two products are left out and the others (the softmax, scaling, masking, dropout, "
        "casts) are what a fused kernel saves: the estimated loss (an upper bound: work beside "
        "the chain on that thread, such as computing a position bias, counts too). Per device, the blocks are "
        "reported together when that time reaches `min_share` of the device's active span; the "
        "finding is named by the operators of the blocks that took most of that time (`eager "
        "attention: aten::bmm -> aten::softmax -> aten::bmm`) and points at the softmax kernel of "
        "the costliest of them. The message gives the score "
        "matrix's size (elements x the `Input type`'s size) and the rate the softmax moves it at "
        "(read and written once: 2 x bytes / softmax kernel time) against the device's DRAM "
        "bandwidth. Fused attention (`scaled_dot_product_attention` with the flash or "
        "memory-efficient backend, FlashAttention, xformers) has no softmax operator and is never "
        "found; SDPA's math backend is, with a hint of its own. Only the forward pass is counted.",
    fix="Use scaled_dot_product_attention (flash or memory-efficient backend), FlashAttention, "
        "xformers, or torch.compile.",
    requires="PyTorch operators with input shapes (Kineto `Input Dims`, record_shapes=True) and "
             "timed kernels linked to them",
    applies_sql="""SELECT EXISTS (SELECT 1 FROM cpu_ops WHERE run_id = $run_id AND input_dims IS NOT NULL)
                      AND EXISTS (SELECT 1 FROM kernels WHERE run_id = $run_id AND start_ns IS NOT NULL
                                  AND external_id IS NOT NULL)""",
    thresholds=(
        Threshold("min_tokens_count", 512, "Sequences shorter than this (queries or keys) are not reported: "
                  "the score matrix stays small and fused kernels gain little."),
        Threshold("min_share", 0.05, "Report when the blocks' softmax and element-wise kernel time is at least "
                  "this share of the device's active span."),
        Threshold("warning_share", 0.1, "Share that makes a warning (below: info)."),
    ),
    sql=SQL,
    references=(
        "Dao et al., 'FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness' (NeurIPS 2022)",
        "PyTorch documentation: torch.nn.functional.scaled_dot_product_attention and torch.nn.attention.sdpa_kernel",
    ),
)
