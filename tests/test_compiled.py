"""TorchInductor's kernels: class and fused operators read from the name (`kernel_library`,
the same in Python and as SQL macros), and on the real traces, what the store and `summary` say
of them recomputed from the raw JSON."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter, defaultdict

import duckdb
import pytest

from traceanalyzer.kernel_library import (
    INDUCTOR_BY_ID, INDUCTOR_CLASSES, SQL_MACROS, classify, inductor_class, inductor_markdown, inductor_ops,
    inductor_phrase,
)

from .conftest import corpus_runs, shared_traces

# (name, class, fused operators): names as the real traces have them, the operators read by hand
REVIEWED = [
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "reduction", ["add", "mean", "mul", "pow", "rsqrt"]),
    ("triton_poi_fused__unsafe_view_mul_silu_2", "pointwise", ["_unsafe_view", "mul", "silu"]),
    ("triton_per_fused__to_copy_add_addmm_mean_mul_pow_rsqrt_transpose_view_8", "persistent_reduction",
     ["_to_copy", "add", "addmm", "mean", "mul", "pow", "rsqrt", "transpose", "view"]),
    ("triton_poi_fused__scaled_dot_product_flash_attention_cat_transpose_view_10", "pointwise",
     ["_scaled_dot_product_flash_attention", "cat", "transpose", "view"]),
    ("triton_red_fused__unsafe_view_add_addmm_mul_native_layer_norm_split_unsqueeze_19", "reduction",
     ["_unsafe_view", "add", "addmm", "mul", "native_layer_norm", "split", "unsqueeze"]),
    ("triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0", "pointwise",
     ["add", "bitwise_and", "bitwise_not", "bitwise_or", "ge", "lt", "mul", "sub"]),
    ("triton_poi_fused_constant_pad_nd_moe_forward_0", "pointwise", ["constant_pad_nd", "moe_forward"]),
    ("triton_poi_fused_0", "pointwise", []),  # a kernel whose nodes name no ATen operator
    ("triton_tem_fused_addmm_relu_1", "template", ["addmm", "relu"]),
    ("triton__0d1d2d3d4d5d6d7d8d9d10d11d12d13d14", "unnamed", None),  # PyTorch 2.0
    ("triton__0d1d23d", "unnamed", None),
    ("create_flashinfer_kv_indices_triton", None, None),  # a hand-written Triton kernel: not Inductor's
    ("_fwd_kernel", None, None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", None, None),
]


@pytest.mark.parametrize("name,cls,ops", REVIEWED, ids=[r[0][:40] for r in REVIEWED])
def test_reviewed_names_in_python_and_sql(name, cls, ops):
    assert (inductor_class(name), inductor_ops(name)) == (cls, ops)
    con = duckdb.connect()
    for macro, body in SQL_MACROS.items():
        con.execute(f"CREATE MACRO {macro}{body}")
    assert con.execute("SELECT inductor_class(?), inductor_ops(?)", [name, name]).fetchone() == (cls, ops)
    if cls is not None:
        assert classify(name) == "triton"
    phrase = inductor_phrase(name)
    assert (phrase is None) == (cls is None) and all(op in phrase for op in ops or [])


def test_every_class_is_documented():
    table = inductor_markdown()
    assert all(f"`{c}`" in table for c in INDUCTOR_BY_ID) and len(INDUCTOR_CLASSES) == len({c.prefix for c in INDUCTOR_CLASSES})


# ---- the real traces ---------------------------------------------------------------------

TRITON_TRACES = ("TraceLens__torch_compile_triton__trace.json.gz", "hta__triton_example__triton_example.json.gz")
GRAPH_CALL = re.compile(r"^## Call CompiledFxGraph (\S+) ##$")


def _raw(file_name: str) -> dict:
    """What the raw JSON says of its Inductor kernels, read without the reader: per kernel name its
    class (the name's second word), launches, GPU time (ns), and its launcher's (the `cpu_op` of
    the kernel's `External id`) record and the CompiledFxGraph annotations open on its thread."""
    events = json.load(gzip.open(shared_traces() / "torch" / file_name))["traceEvents"]
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    calls = [e for e in events if e.get("cat") == "user_annotation" and GRAPH_CALL.match(e.get("name", ""))]
    out: dict[str, dict] = defaultdict(lambda: {"count": 0, "ns": 0.0, "graphs": set()})
    for k in events:
        if k.get("cat") != "kernel" or not re.match(r"^triton_[a-z]{3}_", k.get("name", "")):
            continue
        r = out[k["name"]]
        r["class"] = k["name"].split("_")[1]
        r["count"] += 1
        r["ns"] += k["dur"] * 1000
        op = ops.get(k["args"].get("External id"))
        if op is not None:
            r["kernel_hash"] = op["args"].get("kernel_hash")
            r["kernel_kwargs"] = op["args"].get("kernel_kwargs")
            r["graphs"] |= {GRAPH_CALL.match(c["name"]).group(1) for c in calls if c["tid"] == op["tid"]
                            and c["ts"] <= op["ts"] <= c["ts"] + c["dur"]}
    return dict(out)


@pytest.mark.parametrize("file_name", TRITON_TRACES)
def test_compiled_kernels_on_the_real_triton_traces(real_corpus, file_name):
    """TraceLens's torch.compile trace: 4 Inductor kernels (2 reductions, 2 pointwise) launched in
    one CompiledFxGraph call, each launcher carrying Inductor's record; HTA's example: 1 pointwise
    kernel with `kernel_hash` and `kernel_file` but no block sizes. Counts, times, records and
    graphs as the raw file has them."""
    raw = _raw(file_name)
    assert raw, "the trace has Inductor kernels"
    run = real_corpus.resolve_run(file_name)
    from traceanalyzer.summary import compiled_kernels

    c = compiled_kernels(real_corpus, run)
    by_name = {r["name"]: r for r in c["kernels"]}
    assert set(by_name) == set(raw)
    prefix = {cl.prefix: cl.id for cl in INDUCTOR_CLASSES}
    for name, r in raw.items():
        s = by_name[name]
        assert s["kernel_class"] == prefix[r["class"]] and s["count"] == r["count"]
        assert s["total_ns"] == pytest.approx(r["ns"], abs=r["count"])
        assert s["kernel_hash"] == r.get("kernel_hash")
        assert s["config"] is None if r.get("kernel_kwargs") is None else s["config"].startswith(r["kernel_kwargs"])
        assert set(s["graphs"]) == r["graphs"]
    classes = Counter()
    for r in raw.values():
        classes[prefix[r["class"]]] += r["count"]
    assert {k["kernel_class"]: k["count"] for k in c["classes"]} == dict(classes)


def test_every_real_inductor_name_splits_into_its_sorted_operators(real_corpus):
    """Inductor joins the operators it fused sorted, with `_`: on every real kernel name the split
    gives them back in that order and joins back to the name (a multi-word ATen name cut in words,
    `native_layer_norm` as native, layer, norm, would break the order)."""
    names = [n for (n,) in real_corpus.sql("SELECT DISTINCT name FROM kernels WHERE inductor_class(name) "
                                           "NOT IN ('unnamed') ORDER BY name").fetchall()]
    assert len(names) >= 25  # TraceLens's torch.compile, HTA's example, xDiT SD3.5, the B200 trace
    for name in names:
        ops = inductor_ops(name)
        assert ops is not None, name
        middle = re.match(r"^triton_[a-z]{3}_fused_?(.*?)_?\d+$", name).group(1)
        assert "_".join(ops) == middle and ops == sorted(ops), name


def test_s002_reports_no_chain_of_one_compiled_graph_on_the_real_traces(real_corpus):
    """No S002 finding on a real Kineto trace is a chain of Inductor kernels from one graph call."""
    for run in corpus_runs(real_corpus, "kineto-json"):
        for (evidence,) in real_corpus.sql("SELECT evidence FROM findings WHERE run_id = ? AND rule_id = 'S002'",
                                           [run]).fetchall():
            e = json.loads(evidence)
            assert not (e["fusion"] == "across compiled graphs" and e["graph_calls"] <= 1)
            assert (e["compiled_kernels"] == 0) == (e["fusion"] == "eager")
