"""B003's Kineto estimate: FLOPs and bytes of GEMM-like, attention and convolution calls from their
recorded shapes (rules/_op_cost.py), the roof of their inputs' type (devices/gpu.py), and verdicts
with evidence. Planted traces (fixtures/gen_roofline.py) carry hand-computed FLOPs and bytes; the
real traces are regression cases, their calls recomputed here from the JSON."""

from __future__ import annotations

import gzip
import json
import math
import sys
from collections import Counter, defaultdict

import pytest

from traceanalyzer.devices import gpu
from traceanalyzer.rules._op_cost import Cost, op_cost
from traceanalyzer.rules.B003_roofline import kineto_estimates
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES, corpus_runs, shared_traces
from .test_rule_errors import ROCM

sys.path.insert(0, str(FIXTURES))
import gen_roofline as GEN  # noqa: E402

J = json.dumps
BF16, F32 = "c10::BFloat16", "float"


def cost(op: str, args: list[tuple], concrete: bool = True) -> Cost | str:
    """op_cost of a call given as (dims, type, concrete text) per argument."""
    return op_cost(op, J([a[0] for a in args]), J([a[1] for a in args]),
                   J([a[2] for a in args]) if concrete else None)


def T(dims, dtype=BF16):
    return (list(dims), dtype, "")


def S(text):
    return ([], "Scalar", text)


NONE = ([], "", "")


# ---- the formulas, call by call ----------------------------------------------------------

def test_addmm_reads_its_arguments_by_position_with_and_without_out():
    args = [T([2432]), T([8192, 2432]), T([2432, 2432]), S("1"), S("1")]
    plain, with_out = cost("aten::addmm", args), cost("aten::addmm", [*args, T([8192, 2432])])
    flops = 2 * 8192 * 2432 * 2432 + 8192 * 2432  # the bias add counted
    nbytes = (2432 + 8192 * 2432 + 2432 * 2432 + 8192 * 2432) * 2
    assert (plain.flops, plain.bytes) == (with_out.flops, with_out.bytes) == (flops, nbytes)
    assert plain.shape == "[8192x2432] x [2432x2432] + [2432]"


def test_addmm_beta_zero_drops_the_bias_and_no_concrete_inputs_keeps_it():
    args = [T([64]), T([32, 64]), T([64, 64]), S("0"), S("1")]
    assert cost("aten::addmm", args).flops == 2 * 32 * 64 * 64
    assert cost("aten::addmm", args, concrete=False).flops == 2 * 32 * 64 * 64 + 32 * 64


def test_out_tensor_of_another_type_sets_the_output_bytes():
    c = cost("aten::mm", [T([16, 32]), T([32, 8]), T([16, 8], F32)])
    assert c.bytes == (16 * 32 + 32 * 8) * 2 + 16 * 8 * 4


@pytest.mark.parametrize("a,b,batch_m_n_k", [
    ([8, 512, 1024], [1024, 64], (8, 512, 64, 1024)),  # 3-D x 2-D: the batch broadcasts
    ([1, 64, 256, 64], [1, 64, 64, 256], (64, 256, 256, 64)),  # 4-D x 4-D (the SD-3.5 trace)
    ([2, 1, 10, 4], [3, 4, 5], (6, 10, 5, 4)),  # leading [2, 1] against [3]: 2 x 3
    ([7], [7, 3], (1, 1, 3, 7)),  # a vector on the left is a row
    ([5, 7], [7], (1, 5, 1, 7)),  # on the right a column
])
def test_matmul_broadcasts_like_torch(a, b, batch_m_n_k):
    batch, m, n, k = batch_m_n_k
    c = cost("aten::matmul", [T(a), T(b)])
    assert c.flops == 2 * batch * m * n * k
    assert c.bytes == (math.prod(a) + math.prod(b) + batch * m * n) * 2


def test_linear_weight_is_n_by_k_and_its_bias_is_added():
    c = cost("aten::linear", [T([4, 197, 768]), T([3072, 768]), T([3072])])
    assert c.flops == 2 * 788 * 3072 * 768 + 788 * 3072
    assert c.bytes == (4 * 197 * 768 + 3072 * 768 + 3072 + 788 * 3072) * 2


@pytest.mark.parametrize("op,args,reason", [
    # the args of several ops recorded as one linear (sampled HTA traces)
    ("aten::linear", [T([512, 2800], F32), T([512], F32), T([2048, 200], F32)], "inner dimensions differ"),
    ("aten::bmm", [T([4, 8, 16]), T([2, 16, 8])], "not batches of one size"),
    ("aten::mm", [T([4, 8], "long int"), T([8, 4], "long int")], "type 'long int'"),
    ("aten::mm", [T([4, 8]), T([8, 4], F32)], "different types"),
    ("aten::matmul", [T([2, 4, 8]), T([3, 8, 4])], "do not broadcast"),
])
def test_shapes_that_do_not_fit_are_not_estimated(op, args, reason):
    assert reason in cost(op, args)


def test_scaled_mm_fp8_reads_scales_and_out_dtype():
    fp8 = "c10::Float8_e4m3fn"
    args = [T([128, 256], fp8), T([256, 64], fp8), T([128, 1], F32), T([1, 64], F32), T([64]), NONE,
            ([], "ScalarType", "5"), S("False")]
    c = cost("aten::_scaled_mm", args)
    assert c.dtype == fp8 and c.flops == 2 * 128 * 64 * 256 + 128 * 64
    # inputs 1 byte, rowwise scales 4, the bias 2, a Half output (ScalarType 5) 2
    assert c.bytes == 128 * 256 + 256 * 64 + (128 + 64) * 4 + 64 * 2 + 128 * 64 * 2
    assert "out_dtype" in cost("aten::_scaled_mm", args, concrete=False)


def _bhsd(b, h, s, d):
    return T([b, h, s, d])


def test_sdpa_flops_bytes_and_causal_half():
    q = _bhsd(2, 8, 512, 64)
    full = cost("aten::scaled_dot_product_attention", [q, q, q, NONE, S("0."), S("False"), NONE, S("False")])
    causal = cost("aten::scaled_dot_product_attention", [q, q, q, NONE, S("0."), S("True"), NONE, S("False")])
    assert full.flops == 2 * 2 * 8 * 512 * 512 * (64 + 64) == 2 * causal.flops
    assert full.bytes == causal.bytes == 4 * (2 * 8 * 512 * 64) * 2


def test_gqa_heads_count_queries_in_flops_and_keys_in_bytes():
    q, kv = _bhsd(1, 32, 256, 128), _bhsd(1, 8, 256, 128)
    c = cost("aten::_scaled_dot_product_efficient_attention", [q, kv, kv, NONE, S("False"), S("0."), S("False")])
    assert c.flops == 2 * 32 * 256 * 256 * 256
    assert c.bytes == (32 * 256 * 128 * 2 + 2 * 8 * 256 * 128) * 2
    assert "do not fit" in cost("aten::_scaled_dot_product_efficient_attention",
                                [q, _bhsd(1, 5, 256, 128), _bhsd(1, 5, 256, 128), NONE, S("False"), S("0."), S("False")])


def test_efficient_attention_mask_type_and_variable_lengths():
    q = T([2, 128, 4, 64])  # [B, S, H, D]
    args = [q, q, q, NONE, NONE, NONE, S("128"), S("128"), S("0."), S("1"), S("False"), NONE, NONE, NONE]
    c = cost("aten::_efficient_attention_forward", args)
    assert c.flops == 2 * 2 * 4 * 128 * 128 * 128 / 2 and "causal" in c.shape
    varlen = list(args)
    varlen[4] = T([3], "int")
    assert "variable-length" in cost("aten::_efficient_attention_forward", varlen)


def test_attention_backward_counts_the_recompute_and_four_products():
    q = T([1, 256, 8, 64])
    lse = T([1, 8, 256], F32)
    args = [q, q, q, q, q, lse, NONE, NONE, S("256"), S("256"), S("0."), S("False"), T([], "long int"),
            T([], "long int"), S("0.125"), NONE, NONE]
    c = cost("aten::_flash_attention_backward", args)
    fwd = 2 * 8 * 256 * 256 * (64 + 64)
    assert c.flops == 2.5 * fwd  # equal head dims: (3 + 2) / 2
    assert c.bytes == 8 * (256 * 8 * 64) * 2  # q, k, v, out, dout read; dq, dk, dv written


@pytest.mark.parametrize("change,reason", [
    ({8: "True", 0: T([1, 1, 8, 64])}, "causal with 1 queries and 256 keys"),
    ({11: "128"}, "sliding-window"),
])
def test_attention_that_is_not_estimated(change, reason):
    q = T([1, 256, 8, 64])
    args = [q, q, q, NONE, NONE, S("256"), S("256"), S("0."), S("False"), S("False"), S("0.125"), NONE, NONE, NONE, NONE]
    for i, v in change.items():
        args[i] = S(v) if isinstance(v, str) else v
    assert reason in cost("aten::_flash_attention_forward", args)
    assert "no Concrete Inputs" in cost("aten::_flash_attention_forward", args, concrete=False)


def test_convolution_output_shape_groups_and_bias():
    # miopen_convolution(input, weight, bias, padding, stride, dilation, groups, ...)
    args = [T([2, 32, 33, 33]), T([64, 8, 3, 3]), T([64]), S("[2, 2]"), S("[2, 2]"), S("[2, 2]"), S("4"),
            S("False"), S("False")]
    c = cost("aten::miopen_convolution", args)
    out = (33 + 2 * 2 - 2 * (3 - 1) - 1) // 2 + 1  # 17
    outputs = 2 * 64 * out * out
    assert c.flops == 2 * outputs * 8 * 9 + outputs
    assert c.bytes == (2 * 32 * 33 * 33 + 64 * 8 * 9 + 64 + outputs) * 2
    assert "groups 4" in c.shape and "dil 2x2" in c.shape
    args[6] = S("3")  # 32 input channels are not 3 groups of 8
    assert "do not fit" in cost("aten::miopen_convolution", args)


def test_convolution_needs_concrete_inputs_and_skips_transposed():
    x, w = T([1, 3, 8, 8]), T([4, 3, 3, 3])
    conv = [x, w, NONE, S("[1, 1]"), S("[0, 0]"), S("[1, 1]"), S("False"), S("[0, 0]"), S("1")]
    assert cost("aten::convolution", conv).flops == 2 * (4 * 6 * 6) * 3 * 9
    assert "stride, padding" in cost("aten::convolution", conv, concrete=False)
    conv[6] = S("True")
    assert "transposed" in cost("aten::convolution", conv)


def test_unknown_ops_and_bad_json_are_reasons_not_errors():
    assert "no cost formula" in op_cost("aten::relu", "[[1]]", '["float"]', None)
    assert "not JSON" in op_cost("aten::mm", "[[1, 2]", '["float"]', None)
    assert op_cost("aten::mm", None, None, None) == "no Input Dims recorded"
    assert op_cost("aten::mm", float("nan"), None, None) == "no Input Dims recorded"  # a NULL through pandas


# ---- peaks by type ----------------------------------------------------------------------------

def test_matmul_peaks_by_input_type_and_vendor():
    h100, mi210, mi300x = (gpu.product(n) for n in ("NVIDIA H100 80GB HBM3", "AMD Instinct MI210",
                                                    "AMD Instinct MI300X"))
    assert h100.matmul_peak("fp8")[:2] == (1978.9e12, "FP8 tensor-core")
    assert h100.matmul_peak("tf32")[0] == 494.7e12 and h100.matmul_peak("fp32")[:2] == (h100.fp32_flops_per_s,
                                                                                        "FP32 CUDA-core")
    # MI200: FP32 GEMMs run on the matrix cores, at twice the vector rate
    assert mi210.matmul_peak("fp32")[:2] == (45.3e12, "FP32 matrix-core") and mi210.fp32_flops_per_s == 22.6e12
    assert mi210.matmul_peak("fp8")[0] is None and mi210.matmul_peak("tf32")[0] is None
    assert mi300x.matmul_peak("fp8")[0] == 2614.9e12 and mi300x.matmul_peak("bf16")[0] == 1307.4e12


def test_b200_matches_nvidias_hgx_table():
    b200 = gpu.product("NVIDIA B200")
    assert b200.dram_bandwidth_bytes_per_s == 7.7e12 and b200.fp32_flops_per_s == 75e12
    assert (b200.bf16_tensor_flops_per_s, b200.fp8_tensor_flops_per_s, b200.tf32_tensor_flops_per_s) == \
        (2250e12, 4500e12, 1100e12)


def test_every_matrix_peak_has_a_source():
    for p in gpu.PRODUCTS.values():
        if any((p.fp8_tensor_flops_per_s, p.tf32_tensor_flops_per_s, p.fp32_matrix_flops_per_s,
                p.fp64_matrix_flops_per_s)):
            assert len(p.peaks_source) > 20, p.name
        assert p.source, p.name


# ---- the planted traces ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Each planted file checked with B003 at min_time_share 0: {file: (store, run id)}."""
    st = Store(tmp_path_factory.mktemp("roofline") / "s.duckdb")
    runs = {}
    for name in GEN.PLANTED:
        rid = st.ingest(FIXTURES / "kineto" / name).run_id
        run_rules(st, [rid], Settings(select=["B003"], thresholds={"B003": {"min_time_share": 0}}))
        runs[name] = rid
    yield st, runs
    st.close()


def test_generator_writes_the_committed_fixtures(tmp_path):
    for path in GEN.write_all(tmp_path):
        committed = FIXTURES / path.relative_to(tmp_path)
        assert path.read_bytes() == committed.read_bytes(), f"{committed.name}: run python fixtures/gen_roofline.py"


def _planted_rows(st, rid, name):
    """label -> (planted facts, the kineto_estimates row of that call)."""
    est = kineto_estimates(st, rid)
    calls = {c.label: c for c in GEN.CALLS[name]()}
    out = {}
    for label, fact in GEN.PLANTED[name]["calls"].items():
        op = calls[label].op
        [row] = [r for r in est.to_dict("records") if r["op"] == op.name and json.loads(r["input_dims"]) == op.dims
                 and (json.loads(r["concrete_inputs"]) if isinstance(r["concrete_inputs"], str) else None)
                 == op.concrete and r["kernel"] == calls[label].kernel]
        out[label] = (fact, row)
    return out


@pytest.mark.parametrize("name", list(GEN.PLANTED))
def test_planted_flops_bytes_and_reasons(planted, name):
    st, runs = planted
    for label, (fact, row) in _planted_rows(st, runs[name], name).items():
        if "reason" in fact:
            assert fact["reason"] in row["reason"], label
            continue
        n = fact.get("calls", 1)
        assert row["reason"] is None or row["reason"] != row["reason"], (label, row["reason"])
        assert (row["calls"], row["flops"], row["dram_bytes"]) == (n, fact["flops"] * n, fact["bytes"] * n), label
        assert row["roof_family"] == fact["roof"], label


@pytest.mark.parametrize("name", [n for n in GEN.PLANTED])
def test_planted_verdicts(planted, name):
    st, runs = planted
    dev = GEN.PLANTED[name]["device"]
    findings = [json.loads(e) | {"_value": v, "_loss": loss, "_severity": sev} for e, v, loss, sev in st.sql(
        "SELECT evidence, value, est_loss_ns, severity FROM findings WHERE run_id = ? AND rule_id = 'B003'",
        [runs[name]]).fetchall()]
    total_ns = st.sql("SELECT sum(end_ns - start_ns) FROM kernels WHERE run_id = ?", [runs[name]]).fetchone()[0]
    facts = {k: f for k, f in GEN.PLANTED[name]["calls"].items() if "reason" not in f}
    assert len(findings) == len(facts)
    for label, fact in facts.items():
        n = fact.get("calls", 1)
        [f] = [f for f in findings if f["flops"] == fact["flops"] * n and f["dram_bytes"] == fact["bytes"] * n
               and f["roof_family"] == fact["roof"]]
        secs = fact["ns"] * n / 1e9
        peak = dev[fact["roof"]]
        compute, memory = fact["flops"] * n / secs / peak, fact["bytes"] * n / secs / dev["bw"]
        share = max(compute, memory)
        side = "compute" if fact["flops"] / fact["bytes"] >= peak / dev["bw"] else "memory"
        assert f["_value"] == pytest.approx(share, rel=1e-9), label
        assert (f["bound"], f["side"]) == (fact["bound"], side) and f["peak_flops"] == pytest.approx(peak), label
        assert [r.split(":")[0] for r in f["latency_reasons"]] == list(fact.get("reasons", ())), label
        if fact["bound"] == "latency":  # the time saved at 80% of the roof: part of its kernel time
            assert f["_loss"] == round(fact["ns"] * n * (1 - share / 0.8)) and f["loss_of"] == "the op's kernel time"
            assert f["_severity"] == ("warning" if fact["ns"] * n / total_ns >= 0.05 else "info"), label
        else:
            assert f["_loss"] is None and f["_severity"] == "info", label


def test_wrappers_launching_a_kernel_of_their_own_are_not_counted_twice(planted):
    st, runs = planted
    est = kineto_estimates(st, runs["roofline_attention.json"])
    assert "aten::scaled_dot_product_attention" not in set(est["op"])
    assert "aten::_scaled_dot_product_flash_attention" not in set(est["op"])  # it launched the elementwise kernel
    own = st.sql("SELECT count(*) FROM kernels k JOIN cpu_ops o USING (run_id, external_id) WHERE k.run_id = ? AND "
                 "o.name = 'aten::_scaled_dot_product_flash_attention'", [runs["roofline_attention.json"]]).fetchone()
    assert own == (1,)
    gemm = kineto_estimates(st, runs["roofline_gemm.json"])
    assert "aten::linear" in set(gemm["op"])  # the garbled one launches its kernel itself
    assert set(gemm.loc[gemm["op"] == "aten::linear", "reason"].str.split(":").str[0]) == {"inner dimensions differ"}


# ---- the real traces ------------------------------------------------------------------------------

H100 = ["TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz",
        "TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
        "TraceLens__h100__Falconsai_nsfw_image_detection__1016002.json.gz"]


@pytest.fixture
def real(real_corpus):
    """The corpus store (tests/conftest.py): the ROCm traces and the H100 ones among them."""
    return real_corpus


def _family_counts(st, name):
    est = kineto_estimates(st, st.resolve_run(name))
    ok = est["reason"].isna()
    return ({f: int(c) for f, c in est[ok].groupby("family")["calls"].sum().items()},
            {f: int(c) for f, c in est.groupby("family")["calls"].sum().items()})


@pytest.mark.parametrize("name,estimated", [
    # SD-3.5 on MI300X: all 833 addmm (304 with out=), 241 flash attention, 39 miopen convolutions
    ("TraceLens__inference__xdit_sd_3.5__profile_trace_rank_0.json.gz", {"gemm": 3112, "attention": 241, "conv": 39}),
    ("TraceLens__mi300__Falconsai_nsfw_image_detection__1016002.json.gz", {"gemm": 73, "attention": 12, "conv": 1}),
    ("TraceLens__mi300__gaunernst_bert-small-uncased__1016001.json.gz", {"gemm": 26, "attention": 4}),
    ("TraceLens__inference__sglang_Qwen3-8B_prefilldecode.json.gz", {"gemm": 145}),
    ("TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz", {"gemm": 1505, "conv": 5}),
    ("TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", {"gemm": 169, "attention": 24}),
])
def test_real_traces_calls_estimated_per_family(real, name, estimated):
    done, seen = _family_counts(real, name)
    assert done == seen == estimated


def _addmm_calls(name):
    """addmm calls with their kernels' time, recomputed from the JSON by argument position."""
    with gzip.open(shared_traces() / "torch" / name, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    kernel_ns = defaultdict(int)
    for e in events:
        if e.get("cat") == "kernel" and (e.get("args") or {}).get("External id") is not None:
            kernel_ns[e["args"]["External id"]] += round(e["dur"] * 1000)
    out = []
    for e in events:
        a = e.get("args") or {}
        if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm" and a.get("External id") in kernel_ns:
            bias, (m, k), (_, n) = a["Input Dims"][0], a["Input Dims"][1], a["Input Dims"][2]
            out.append({"out": len(a["Input Dims"]) > 5, "flops": 2 * m * n * k + m * n,
                        "bytes": 2 * (math.prod(bias) + m * k + k * n + m * n)})
    return out


def test_sd35_addmm_out_calls_match_the_json(real):
    name = ROCM[2]
    calls = _addmm_calls(name)
    assert len(calls) == 833 and sum(c["out"] for c in calls) == 304
    est = kineto_estimates(real, real.resolve_run(name))
    addmm = est[est["op"] == "aten::addmm"]
    assert addmm["reason"].isna().all()
    assert addmm["flops"].sum() == sum(c["flops"] for c in calls)
    assert addmm["dram_bytes"].sum() == sum(c["bytes"] for c in calls)


def test_real_verdicts_have_evidence(real):
    # rule_loss_ns: the rule's own figure (the diagnosis relates findings on one kernel to a headline)
    rows = real.sql("SELECT evidence, rule_loss_ns FROM findings JOIN runs USING (run_id) WHERE rule_id = 'B003' "
                    "AND file_name IN (SELECT unnest($names))", {"names": [*ROCM, *H100]}).fetchall()
    assert rows
    bounds = Counter()
    for evidence, loss in rows:
        ev = json.loads(evidence)
        bounds[ev["bound"]] += 1
        assert ev["side"] == ("compute" if ev["intensity"] >= ev["ridge"] else "memory")
        if ev["bound"] == "latency":
            assert ev["latency_reasons"] and max(ev["compute_pct"], ev["memory_pct"]) < 60 and loss > 0
        else:
            assert ev["bound"] == ev["side"] and loss is None
    # most real GEMM-like time is on one side of the roof, not "latency-bound"
    assert bounds["compute"] + bounds["memory"] > 2 * bounds["latency"]


def test_real_corpus_kineto_estimates_hold_everywhere(real_corpus):
    """Every Kineto run of the corpus: estimates name their roof and its source, and a verdict of
    latency is never given without a reason."""
    for run_id in corpus_runs(real_corpus, "kineto-json"):
        for evidence, loss in real_corpus.sql("SELECT evidence, rule_loss_ns FROM findings WHERE run_id = ? AND "
                                              "rule_id = 'B003'", [run_id]).fetchall():
            ev = json.loads(evidence)
            assert ev["estimate"] is True and ev["flops"] > 0 and ev["dram_bytes"] > 0
            assert ev["peak_flops_source"] and ev["peak_bw_source"] and ev["roof_unit"]
            assert (ev["bound"] == "latency") == bool(ev["latency_reasons"])
            assert (loss is not None) == (ev["bound"] == "latency")
