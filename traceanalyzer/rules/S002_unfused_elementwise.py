"""S002 unfused element-wise chains: runs of short memory-bound kernels one fused kernel could do."""

from typing import Annotated

from ..kernel_library import INDUCTOR_MEMORY_BOUND
from ..analyses.place import HOW as PLACE_HOW
from .base import Rule, Threshold
from .evidence import Place, PlacedEvidence, StreamRange, doc

# Kernel names of element-wise, cast, normalisation and activation work (PyTorch's
# elementwise/vectorized/unrolled kernels and functors, copies, norms, softmax). TorchInductor's
# kernels are told by their class instead (`inductor_class`): its pointwise and reduction kernels
# are such work whatever operators their names list (`addmm`, `convolution`: an epilogue's).
ELEMENTWISE = (r"elementwise|functor|copy_kernel|cast|layer_?norm|rms_?norm|group_?norm|softmax|gelu|silu|"
               r"relu|sigmoid|tanh|dropout|act_and_mul|reduce_kernel")
COMPILED_CLASSES = "(" + ", ".join(f"'{c}'" for c in INDUCTOR_MEMORY_BOUND) + ")"
# Names that can contain those words but are compute-bound or communication kernels.
NOT_ELEMENTWISE = r"nccl|rccl|gemm|conv|cudnn|winograd|attention|attn|flash|fmha|cutlass|cublas|nvjet|xmma|mma|matmul"
# A full reduction writes far less than it reads: it may end a chain (fused as an epilogue) but
# nothing after it shares its intermediate.
REDUCTION = r"reduce_kernel"


def functor_label(column: str) -> str:
    """Without the launching operator, a PyTorch kernel is named by its functor or lambda's host
    function (`CUDAFunctor_add`, `MulFunctor`, `relu_kernel_cuda`), not the generic kernel name."""
    return (rf"list_filter(regexp_extract_all({column}, '[A-Za-z0-9_]*(?:Functor|_functor|_kernel_cuda|_kernel_impl"
            rf"|KernelImpl)[A-Za-z0-9_]*'), lambda x: x NOT IN ('BinaryFunctor', 'gpu_kernel_impl', "
            rf"'gpu_kernel_impl_nocast'))[1]")


# Where an intermediate's size comes from (named in the evidence).
BY_DIMS = "operator input dims"
BY_PROXY = "grid x block threads x 4 bytes (proxy)"

# Element sizes of the `Input type` strings PyTorch writes.
DTYPE_BYTES = """CASE t WHEN 'float' THEN 4 WHEN 'double' THEN 8 WHEN 'c10::Half' THEN 2
    WHEN 'c10::BFloat16' THEN 2 WHEN 'long int' THEN 8 WHEN 'int' THEN 4 WHEN 'short int' THEN 2
    WHEN 'bool' THEN 1 WHEN 'unsigned char' THEN 1 WHEN 'signed char' THEN 1
    WHEN 'c10::complex<float>' THEN 8 WHEN 'c10::complex<double>' THEN 16
    ELSE CASE WHEN t LIKE 'c10::Float8%' THEN 1 END END"""

SQL = rf"""
WITH names AS MATERIALIZED (  -- the name patterns are matched once per distinct name, not per launch
    SELECT name_key, name,
           CASE WHEN inductor_class(name) IS NOT NULL THEN coalesce(inductor_class(name) IN {COMPILED_CLASSES}, false)
                ELSE regexp_matches(lower(name), '{ELEMENTWISE}') AND NOT regexp_matches(lower(name), '{NOT_ELEMENTWISE}')
           END AS ew_name,
           inductor_class(name) IS NOT NULL AS compiled,
           regexp_matches(lower(name), '{REDUCTION}') AS reduction, {functor_label('name')} AS functor
    FROM this_run.kernel_names
), acts AS NOT MATERIALIZED (  -- names travel as integer keys (analyses.kernels.kernel_names): cheaper to sort, group and compare
    -- Operations in stream order with the previous one's fields, computed once per run
    -- (analyses.launches.stream_ops): every operation takes part, so a GEMM or copy in between breaks a chain.
    -- Read twice, not held: once narrow to find the chains, once to pick out their kernels.
    SELECT o.device_id, o.stream_id, o.item_id, o.start_ns, o.end_ns, o.name_key, o.seq, o.external_id, o.threads,
           o.prev_end_ns AS prev_end,
           o.kind = 'kernel' AND o.end_ns - o.start_ns <= $max_kernel_ns AND coalesce(n.ew_name, false) AS ew,
           coalesce(n.reduction, false) AS reduction,
           o.prev_kind = 'kernel' AND o.prev_end_ns - o.prev_start_ns <= $max_kernel_ns
             AND coalesce(p.ew_name, false) AS prev_ew,
           coalesce(p.reduction, false) AS prev_reduction
    FROM this_run.stream_ops o
    LEFT JOIN names n ON n.name_key = o.name_key
    LEFT JOIN names p ON p.name_key = o.prev_name_key
), steps AS NOT MATERIALIZED (  -- whether each operation follows an element-wise kernel closely enough to
    -- continue its chain (if it is one itself)
    SELECT *, coalesce(prev_ew AND NOT prev_reduction AND start_ns - prev_end <= $max_gap_ns, false) AS follows
    FROM acts
), ew_ops AS NOT MATERIALIZED (  -- element-wise kernels, and whether each continues a chain from the one before
    SELECT * EXCLUDE (follows), follows AS continues FROM steps WHERE ew
), bounds AS (  -- where chains start and stop: the element-wise kernels that do not continue the operation
    -- before them (a chain starts there), and the operations right after an element-wise kernel that do
    -- not continue it (the chain before them stops). In a stream, from a chain's start to the next
    -- such operation, every operation continues the chain.
    SELECT device_id, stream_id, seq, coalesce(ew, false) AS ew FROM steps
    WHERE (coalesce(ew, false) OR coalesce(prev_ew, false)) AND NOT (coalesce(ew, false) AND follows)
), chain_ends AS (  -- a chain is named by its first kernel's `seq`; it lasts up to the next bound or the stream's
    -- end. The window sorts these bounds alone (5 M kernels: 1.8 M rows, not the 4 M element-wise kernels)
    SELECT b.device_id, b.stream_id, b.chain, coalesce(b.next_bound - 1, l.last_seq) AS last_seq
    FROM (SELECT device_id, stream_id, seq AS chain, ew,
                 lead(seq) OVER (PARTITION BY device_id, stream_id ORDER BY seq) AS next_bound FROM bounds) b
    LEFT JOIN (SELECT device_id, stream_id, max(seq) AS last_seq FROM this_run.stream_ops GROUP BY ALL) l
      ON l.device_id = b.device_id AND l.stream_id = b.stream_id
    WHERE b.ew AND coalesce(b.next_bound - 1, l.last_seq) - b.chain + 1 >= $min_chain_count
), member_seqs AS (  -- each kernel of a long chain, by position: its seq
    SELECT device_id, stream_id, chain, last_seq, unnest(range(chain, last_seq + 1)) AS seq FROM chain_ends
), chain_members AS (  -- their fields, from the second read (a hash join on the positions)
    SELECT o.device_id, o.stream_id, o.item_id, o.start_ns, o.end_ns, o.name_key, o.seq, o.external_id, o.threads,
           CASE WHEN o.continues THEN greatest(o.start_ns - o.prev_end, 0) ELSE 0 END AS gap_ns,
           m.chain, m.last_seq, o.seq = m.last_seq AS is_last
    FROM ew_ops o JOIN member_seqs m ON m.device_id = o.device_id AND m.stream_id = o.stream_id AND m.seq = o.seq
), compiled_members AS (  -- the chains' TorchInductor kernels, each with the compiled graph call that
    -- launched it (NULL where the trace does not say)
    SELECT m.device_id, m.stream_id, m.chain, m.external_id
    FROM chain_members m JOIN names n ON n.name_key = m.name_key AND n.compiled
), compiled_ids AS (
    SELECT DISTINCT $run_id AS run_id, external_id FROM compiled_members WHERE external_id IS NOT NULL
), compiled_calls AS (
    SELECT * FROM compiled_places('compiled_ids')
), compiled_chains AS (
    SELECT c.device_id, c.stream_id, c.chain, count(*) AS compiled,
           count(DISTINCT coalesce('graph ' || p.graph_range_id, 'region ' || p.region_op_id)) AS graph_calls
    FROM compiled_members c LEFT JOIN compiled_calls p ON p.external_id = c.external_id
    GROUP BY ALL
), launching_ops AS (  -- the operator that launched each kernel (Kineto `External id`)
    SELECT external_id, arg_min(name, op_id) AS op_name, arg_min(input_dims, op_id) AS dims,
           arg_min(input_types, op_id) AS types
    FROM cpu_ops
    WHERE run_id = $run_id AND external_id IN (SELECT external_id FROM chain_members)
    GROUP BY external_id
), op_inputs AS (  -- one row per input tensor
    SELECT external_id, op_name, unnest(json_transform(dims, '["JSON"]')) AS d,
           unnest(json_transform(types, '["VARCHAR"]')) AS t
    FROM launching_ops WHERE dims IS NOT NULL AND types IS NOT NULL
), op_bytes AS (  -- an element-wise output is as large as its largest input
    SELECT external_id, any_value(op_name) AS op_name,
           max(CASE WHEN json_array_length(d) = 0 THEN 1 ELSE list_product(json_transform(d, '["BIGINT"]')) END
               * ({DTYPE_BYTES})) AS bytes
    FROM op_inputs
    WHERE json_type(d) = 'ARRAY' AND (json_array_length(d) = 0 OR json_type(d, '$[0]') IN ('UBIGINT', 'BIGINT'))
    GROUP BY external_id
), sized AS (
    SELECT m.*, lo.op_name, lo.op_name IS NOT NULL AS linked,
           coalesce(ob.bytes, m.threads::BIGINT * 4) AS out_bytes,  -- BIGINT: a store's cached threads may be INTEGER
           ob.bytes IS NOT NULL AS sized_by_dims, ob.bytes IS NULL AND m.threads IS NOT NULL AS sized_by_proxy
    FROM chain_members m LEFT JOIN op_bytes ob USING (external_id) LEFT JOIN launching_ops lo USING (external_id)
), chain_totals AS (
    SELECT s.device_id, s.stream_id, s.chain, any_value(s.last_seq) AS last_seq, count(*) AS n,
           min(s.start_ns) AS start_ns, max(s.end_ns) AS end_ns, arg_min(s.item_id, s.start_ns) AS first_id,
           sum(s.end_ns - s.start_ns) AS kernel_ns, max(s.end_ns - s.start_ns) AS longest_ns, sum(s.gap_ns) AS gap_ns,
           sum(s.out_bytes) FILTER (WHERE NOT s.is_last) AS intermediate_bytes,
           -- which kernels in which order, as two independent 64-bit hashes summed over (position, name):
           -- chains group by these instead of a list of names per chain (5 M kernels: 0.4 s less); the
           -- lists are built for the few chains a finding shows (`shown`). Two different chains share
           -- both sums with a chance of about 2^-128.
           sum(hash(s.seq - s.chain, s.name_key)) AS sig_a, sum(hash(s.name_key, s.seq - s.chain, 'b')) AS sig_b,
           count(*) FILTER (WHERE s.linked) AS linked,
           -- which size sources the intermediates used, as flags (a DISTINCT list costs a hash table per chain)
           bool_or(s.sized_by_dims) FILTER (WHERE NOT s.is_last) AS by_dims,
           bool_or(s.sized_by_proxy) FILTER (WHERE NOT s.is_last) AS by_proxy,
           any_value(d.memory_bandwidth_bytes_per_s) AS bandwidth
    FROM sized s LEFT JOIN devices d ON d.run_id = $run_id AND d.device_id = s.device_id
    GROUP BY s.device_id, s.stream_id, s.chain
), chains AS (  -- a chain of TorchInductor kernels all from one compiled graph call (or from calls the trace
    -- does not record) is Inductor's fusion already: not reported
    SELECT t.* EXCLUDE (by_dims, by_proxy),
           CASE WHEN by_dims OR by_proxy THEN list_filter([CASE WHEN by_dims THEN '{BY_DIMS}' END,
                                                         CASE WHEN by_proxy THEN '{BY_PROXY}' END],
                                                        lambda x: x IS NOT NULL) END AS bytes_sources,
           coalesce(cc.compiled, 0) AS compiled, coalesce(cc.graph_calls, 0) AS graph_calls
    FROM chain_totals t
    LEFT JOIN compiled_chains cc ON cc.device_id = t.device_id AND cc.stream_id = t.stream_id AND cc.chain = t.chain
    WHERE NOT (coalesce(cc.compiled, 0) = t.n AND coalesce(cc.graph_calls, 0) <= 1)
), costed AS (  -- a fused kernel saves the gaps and the intermediates' DRAM round trips
    SELECT *, 2 * intermediate_bytes / bandwidth * 1e9 AS round_trip_ns,
           gap_ns + least(coalesce(2 * intermediate_bytes / bandwidth * 1e9, 0), kernel_ns - longest_ns) AS saving_ns
    FROM chains
), grouped AS (  -- chains with the same kernels, per device
    SELECT c.device_id, c.n, c.sig_a, c.sig_b,
           -- named after the chain whose kernels are best linked to their operators
           arg_min({{'stream_id': c.stream_id, 'chain': c.chain, 'last_seq': c.last_seq}},
                   (-c.linked, c.start_ns, c.stream_id)) AS named_by,
           count(*) AS chains, sum(c.n) AS kernels,
           any_value(c.compiled) AS compiled, max(c.graph_calls) AS graph_calls,
           -- doubles summed in one fixed order: a parallel sum() differs in the last digits run to run
           list_sum(list(c.saving_ns ORDER BY c.start_ns, c.stream_id)) AS saving_ns,
           sum(c.gap_ns) AS gap_ns, sum(c.kernel_ns) AS kernel_ns, sum(c.intermediate_bytes) AS intermediate_bytes,
           list_sum(list(c.round_trip_ns ORDER BY c.start_ns, c.stream_id)) AS round_trip_ns,
           any_value(c.bandwidth) AS bandwidth,
           list_sort(list_distinct(flatten(list(c.bytes_sources)))) AS bytes_sources,
           -- the chain saving most (the earliest, then lowest stream, among equals), its fields from
           -- one arg_max; then the chains the evidence lists, from a bounded heap (not a sorted list)
           arg_max({{'id': c.first_id, 'stream_id': c.stream_id, 'start_ns': c.start_ns, 'end_ns': c.end_ns}},
                   (c.saving_ns, -c.start_ns, -c.stream_id)) AS worst_chain,
           arg_max({{'stream_id': c.stream_id, 'start_ns': c.start_ns, 'end_ns': c.end_ns, 'chain': c.chain,
                    'last_seq': c.last_seq, 'gap_ns': c.gap_ns, 'kernel_ns': c.kernel_ns,
                    'intermediate_bytes': c.intermediate_bytes, 'saving_ns': c.saving_ns}},
                   (c.saving_ns, -c.start_ns, -c.stream_id), heap_size($max_examples))[1:$max_examples] AS worst
    FROM costed c GROUP BY c.device_id, c.n, c.sig_a, c.sig_b
), chain_savings AS (
    SELECT device_id, n, sig_a, sig_b, start_ns, end_ns, saving_ns AS ns FROM costed
), chain_place AS (  -- where most of each group's saving is (analyses/place.py)
    SELECT * FROM majority_window('chain_savings')
), reported AS (  -- the groups that save enough
    SELECT g.*, g.saving_ns / nullif(b.active_span_ns, 0) AS share
    FROM grouped g LEFT JOIN this_run.device_busy b ON b.device_id = g.device_id
    WHERE g.saving_ns / nullif(b.active_span_ns, 0) >= $min_saving_share
      AND g.saving_ns > 0  -- nothing to save, nothing to report (at a threshold of 0 too)
), shown AS (  -- the chains their findings show: the one that names each, and the worst ones
    SELECT device_id, named_by.stream_id, named_by.chain, named_by.last_seq FROM reported
    UNION
    SELECT device_id, w.stream_id, w.chain, w.last_seq FROM (SELECT device_id, unnest(worst) AS w FROM reported)
), shown_kernels AS (  -- their kernels' ids and name keys, in stream order
    SELECT s.device_id, s.stream_id, s.chain, list(o.item_id ORDER BY o.seq) AS kernel_ids,
           list(o.name_key ORDER BY o.seq) AS keys
    FROM (SELECT *, unnest(range(chain, last_seq + 1)) AS seq FROM shown) s
    JOIN this_run.stream_ops o ON o.device_id = s.device_id AND o.stream_id = s.stream_id AND o.seq = s.seq
    GROUP BY s.device_id, s.stream_id, s.chain
), worst_shown AS (  -- the evidence's chains, with their kernels
    SELECT w.device_id, w.n, w.sig_a, w.sig_b,
           to_json(list({{'stream_id': w.c.stream_id, 'start_ns': w.c.start_ns, 'end_ns': w.c.end_ns,
                         'kernel_ids': sk.kernel_ids, 'gap_ns': w.c.gap_ns, 'kernel_ns': w.c.kernel_ns,
                         'intermediate_bytes': w.c.intermediate_bytes, 'saving_ns': w.c.saving_ns}}
                        ORDER BY w.i)) AS worst
    FROM (SELECT device_id, n, sig_a, sig_b, unnest(worst) AS c, generate_subscripts(worst, 1) AS i FROM reported) w
    JOIN shown_kernels sk ON sk.device_id = w.device_id AND sk.stream_id = w.c.stream_id AND sk.chain = w.c.chain
    GROUP BY w.device_id, w.n, w.sig_a, w.sig_b
), named_members AS (  -- the kernels of the one chain that names each group, in order
    SELECT r.device_id, r.n, r.sig_a, r.sig_b, unnest(sk.kernel_ids) AS kernel_id, unnest(sk.keys) AS name_key,
           generate_subscripts(sk.kernel_ids, 1) AS i
    FROM reported r JOIN shown_kernels sk
      ON sk.device_id = r.device_id AND sk.stream_id = r.named_by.stream_id AND sk.chain = r.named_by.chain
), named AS (  -- names and labels from those kernels alone (their launching operator, else a functor or short name)
    SELECT m.device_id, m.n, m.sig_a, m.sig_b,
           list(kn.name ORDER BY m.i) AS names,
           list(coalesce(k.short_name, kn.name) ORDER BY m.i) AS short_names,
           list(coalesce(lo.op_name, kn.functor, k.short_name, kn.name) ORDER BY m.i) AS labels
    FROM named_members m
    JOIN names kn ON kn.name_key = m.name_key
    JOIN kernels k ON k.run_id = $run_id AND k.kernel_id = m.kernel_id
    LEFT JOIN (SELECT external_id, arg_min(name, op_id) AS op_name FROM cpu_ops
               WHERE run_id = $run_id AND external_id IN (SELECT k2.external_id FROM kernels k2 JOIN named_members n2
                                                          ON k2.run_id = $run_id AND k2.kernel_id = n2.kernel_id)
               GROUP BY external_id) lo ON lo.external_id = k.external_id
    GROUP BY m.device_id, m.n, m.sig_a, m.sig_b
), judged AS (
    SELECT r.* EXCLUDE (worst), coalesce(w.worst, '[]') AS worst, n.names, n.short_names, n.labels,
           CASE WHEN r.compiled = 0 THEN 'eager' WHEN r.compiled < r.n THEN 'partly compiled'
                ELSE 'across compiled graphs' END AS fusion,
           -- long chains are named by their ends
           CASE WHEN len(n.labels) <= 6 THEN array_to_string(n.labels, ' -> ')
                ELSE array_to_string(n.labels[1:3], ' -> ') || ' -> ... -> ' || array_to_string(n.labels[-2:], ' -> ')
           END AS chain_name,
           len(list_distinct(n.labels)) = 1 AS one_op  -- the same op on many tensors: horizontal fusion
    FROM reported r JOIN named n USING (device_id, n, sig_a, sig_b)
    LEFT JOIN worst_shown w USING (device_id, n, sig_a, sig_b)  -- no chains listed with max_examples = 0
)
SELECT device_id, worst_chain.stream_id AS stream_id, 'kernel' AS item_kind, worst_chain.id AS item_id,
       chain_name AS item_name, w_start AS start_ns, w_end AS end_ns,
       share AS value, 'share' AS value_unit, $min_saving_share AS threshold,
       CAST(round(saving_ns) AS BIGINT) AS est_loss_ns,
       -- the saving is the gaps between the kernels and the intermediates' traffic: mostly gaps,
       -- it is idle time of the device (the late launches T001 finds there), else compute time
       CASE WHEN 2 * gap_ns >= saving_ns THEN 'idle' ELSE 'compute' END AS claims,
       CASE WHEN share >= $warning_share THEN 'warning' ELSE 'info' END AS severity,
       printf('device %d: %d chain(s) of %d element-wise kernels (%s) run unfused%s, %s of kernel time with %s of gaps '
              || 'and %s of intermediates; fusing would save about %s (%s of the device''s span)',
              device_id, chains, len(names), chain_name,
              CASE fusion WHEN 'partly compiled' THEN printf(', %d of them TorchInductor''s', compiled)
                          WHEN 'across compiled graphs' THEN printf(', all TorchInductor''s but from %d compiled graph calls',
                                                                    graph_calls)
                          ELSE '' END,
              fmt_ns(kernel_ns), fmt_ns(gap_ns),
              fmt_bytes(intermediate_bytes), fmt_ns(saving_ns), fmt_pct(share)) AS message,
       CASE WHEN fusion = 'across compiled graphs' THEN
              'TorchInductor fused what each compiled graph held; these kernels come from different graphs (a graph '
              || 'break, or regions compiled apart), and fusion stops at a graph''s edge. Find the breaks '
              || '(TORCH_LOGS=graph_breaks, torch._dynamo.explain) and remove them (fullgraph=True makes one an error), '
              || 'or compile the enclosing module as one region.'
            WHEN fusion = 'partly compiled' THEN
              'Part of this chain is TorchInductor''s and part is not: the other kernels ran outside the compiled graph '
              || '(a graph break, or code torch.compile does not wrap), as ATen fallbacks Inductor did not lower, or as '
              || 'custom operators Inductor cannot fuse through. Find graph breaks (TORCH_LOGS=graph_breaks) and widen '
              || 'what is compiled, so that Inductor fuses the whole chain; a custom operator stays a fusion boundary.'
            WHEN one_op THEN
              'The same element-wise op runs once per tensor: use the multi-tensor (foreach) forms '
              || '(torch._foreach_*, fused/foreach optimizers, zero_grad(set_to_none=True)) so one launch covers '
              || 'all tensors, or torch.compile the loop.'
            ELSE
              'Fuse the chain into one kernel: torch.compile (Inductor generates one pointwise kernel per chain), '
              || 'a fused op (fused LayerNorm/RMSNorm, bias+activation epilogues, fused optimizers), or a hand-written '
              || 'or Triton kernel that reads the inputs once and writes only the final output.'
       END AS hint,
       '{{"chains": ' || chains || ', "kernels_per_chain": ' || len(names) || ', "kernels": ' || kernels
         || ', "kernel_names": ' || to_json(short_names) || ', "labels": ' || to_json(labels)
         || ', "fusion": ' || to_json(fusion) || ', "compiled_kernels": ' || compiled
         || ', "graph_calls": ' || graph_calls
         || ', "kernel_ns": ' || kernel_ns || ', "gap_ns": ' || gap_ns
         || ', "intermediate_bytes": ' || coalesce(CAST(intermediate_bytes AS BIGINT), 0)
         || ', "bytes_source": ' || to_json(bytes_sources)
         || ', "dram_bytes_per_s": ' || coalesce(bandwidth, 0)
         || ', "round_trip_ns": ' || coalesce(round(round_trip_ns), 0)
         || ', "saving_ns": ' || round(saving_ns) || ', "place": ' || place_json(chain_place, 'chains') || ', "worst": ' || worst || '}}' AS evidence
FROM judged LEFT JOIN chain_place USING (device_id, n, sig_a, sig_b)
ORDER BY saving_ns DESC, item_name
"""

# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class S002Example(StreamRange, kw_only=True, forbid_unknown_fields=True):
    stream_id: Annotated[int, doc("stream")]
    kernel_ids: Annotated[list[int], doc("ids of the chain's kernels")]
    gap_ns: Annotated[int, doc("time between the kernels")]
    kernel_ns: Annotated[int, doc("kernel time")]
    intermediate_bytes: Annotated[float, doc("bytes written and read back between the kernels")]
    saving_ns: Annotated[float, doc("estimated time fusing saves")]


class S002Evidence(PlacedEvidence, kw_only=True, forbid_unknown_fields=True):
    chains: Annotated[int, doc("unfused chains of this shape found")]
    kernels_per_chain: Annotated[int, doc("kernels in each chain")]
    kernels: Annotated[int, doc("kernels counted")]
    kernel_names: Annotated[list[str], doc("the chain's kernels' names")]
    labels: Annotated[list[str], doc("short names of the chain's kernels")]
    fusion: Annotated[str, doc("how the chain could be fused")]
    compiled_kernels: Annotated[int, doc("kernels of the chain generated by a compiler")]
    graph_calls: Annotated[int, doc("CUDA graph launches the chain ran in")]
    kernel_ns: Annotated[int, doc("kernel time")]
    gap_ns: Annotated[int, doc("time between the kernels")]
    intermediate_bytes: Annotated[int, doc("bytes written and read back between the kernels")]
    bytes_source: Annotated[list[str], doc("where the bytes moved were read from")]
    dram_bytes_per_s: Annotated[float, doc("the device's DRAM bandwidth, bytes per second")]
    round_trip_ns: Annotated[float, doc("time to write and read back the intermediate bytes at DRAM bandwidth")]
    saving_ns: Annotated[float, doc("estimated time fusing saves")]
    place: Annotated[Place, doc("where most of the intervals lie")]
    worst: Annotated[list[S002Example], doc("the chains that would save most")]


RULE = Rule(
    id="S002",
    evidence=S002Evidence,
    name="unfused-elementwise",
    title="Unfused element-wise kernel chains",
    phase="structure",
    claims="compute",
    severity="info",
    what="Runs of consecutive short element-wise kernels on a stream (adds, casts, activations, "
         "norms, softmax, copies) where each writes a tensor the next one reads back: work one "
         "fused kernel could do in a single pass.",
    why="Element-wise kernels do a few operations per byte, so their time is memory traffic and "
        "launch overhead. A chain of n of them writes and re-reads n-1 intermediate tensors through "
        "DRAM and pays n launches and the gaps between them; a fused kernel reads the inputs once, "
        "keeps intermediates in registers and launches once.",
    how="Kernels are element-wise when the name matches PyTorch's element-wise, cast, norm, "
        "activation and softmax kernels (not GEMM, convolution, attention or NCCL names), or is a "
        "TorchInductor pointwise or reduction kernel (`inductor_class`), and run at "
        "most `max_kernel_ns`. On each device and stream, operations are ordered by start; a chain "
        "is a run of at least `min_chain_count` element-wise kernels with no other operation in "
        "between and gaps of at most `max_gap_ns` (a full `reduce_kernel` may end a chain). Each "
        "intermediate's size is the launching operator's largest input (Kineto `Input Dims` x "
        "element size, linked by `External id`); without it, grid x block threads x 4 bytes is used "
        "as a proxy (stated in the evidence). The saving of a chain is its gaps plus the DRAM round "
        "trip of its intermediates (2 x bytes / the device's DRAM bandwidth), the latter capped at "
        "the chain's kernel time minus its longest kernel; a saving mostly of gaps is the device's idle "
        "time (`claims` = `idle`, the late launches T001 finds there, under which the diagnosis "
        "places it), else its compute time. Chains with the same kernels are reported "
        "together per device, when their saving reaches `min_saving_share` of the device's active "
        "span; it assumes each kernel consumes the previous one's output. TorchInductor's kernels are "
        "fusions already: a chain of them all launched in one call of one compiled graph (the "
        "`compiled_kernels` view: the `## Call CompiledFxGraph ##` annotation, else the `Torch-Compiled "
        "Region` operator, open at each launch), or whose calls the trace does not record, is not reported "
        "(Inductor's scheduler kept them apart; the launch gaps between them are T001's). A chain of "
        "Inductor kernels from two or more graph calls is reported as fusion stopped at a graph's edge "
        "(graph breaks, `evidence.fusion` = `across compiled graphs`); one mixing Inductor kernels with "
        "others as `partly compiled`; each with its own advice and `evidence.compiled_kernels` and "
        "`evidence.graph_calls`." + PLACE_HOW,
    fix="Use torch.compile or fused operators (fused norms, bias+activation epilogues, fused "
        "optimizers), or write one kernel for the chain. Where the chain is TorchInductor's already, "
        "remove the graph breaks between its graphs or compile the enclosing module as one region.",
    requires="timed kernels",
    applies_sql="SELECT EXISTS (SELECT 1 FROM kernels WHERE run_id = $run_id AND start_ns IS NOT NULL)",
    thresholds=(
        Threshold("max_kernel_ns", 50000, "Element-wise kernels longer than this (50 us) are not chained."),
        Threshold("max_gap_ns", 100000, "A gap longer than this between two kernels ends a chain."),
        Threshold("min_chain_count", 3, "Chains need at least this many kernels (a chain is two or more).", low=2),
        Threshold("min_saving_share", 0.01, "Report chains whose estimated saving is at least this share of the device's active span."),
        Threshold("warning_share", 0.05, "Saving share that makes a warning (below: info)."),
        Threshold("max_examples", 5, "How many chains the evidence lists."),
    ),
    sql=SQL,
    references=(
        "PyTorch Performance Tuning Guide: 'Fuse pointwise operations' (torch.compile / TorchInductor)",
        "NVIDIA Deep Learning Performance Guide: 'Memory-Limited Layers' (element-wise operations are memory-bound)",
    ),
)
