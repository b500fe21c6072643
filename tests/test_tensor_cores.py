"""B005 (tensor cores unused) on every real trace, against shares recomputed here from the raw
files with sqlite3 / json and a name test written apart from the rule's patterns."""

from __future__ import annotations

import gzip
import json
import math
import sqlite3
from collections import Counter

import pytest

from .conftest import shared_traces

# Every (trace, device) of ../shared/traces where FP32 SIMT GEMM/convolution kernels take at least
# 10% and 1 ms of the device's kernel time on a GPU with tensor cores, found by running _is_simt
# over every nsys and Kineto trace there: (share, compute capability told to the hint).
FIRES = {
    ("nsys/nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite", 0): (0.8652, "8.0"),
    ("nsys/nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite", 1): (0.8649, "8.0"),
    ("torch/hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz", 0): (0.4386, "8.0"),
    ("torch/hta__critical_path__simple_add__benchmark_result_493459_1694039959_trace.json.gz", 0): (0.4419, "8.0"),
    ("torch/hta__df_index_resolver__df_index_resolver.json.gz", 1): (0.4100, "7.0"),
    ("torch/hta__trace_diff__test__test.json.gz", 1): (0.2484, "7.0"),
    ("torch/kineto__tb_plugin__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz", 0): (0.6253, "7.0"),
    ("torch/kineto__tb_plugin__resnet50_num_workers_0__worker0.1623143566756.pt.trace.json.gz", 0): (0.6253, "7.0"),
    ("torch/kineto__tb_plugin__resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz", 0): (0.6269, "7.0"),
    ("torch/kineto__tb_plugin__resnet50_num_workers_4__worker0.1623213129365.pt.trace.json.gz", 0): (0.6265, "7.0"),
    ("torch/kineto__tb_plugin__resnet50_profiler_api_num_workers_0__worker0_2021-01.pt.trace.json.gz", 0): (0.6490, "7.0"),
}

# Traces whose GEMMs run on tensor cores (BF16/FP16/TF32 names), or whose FP32 SIMT GEMMs are a
# sliver of the time: B005 must say nothing.
QUIET = {
    "torch/TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz": "cutlass bf16 s1688/s16816, sm90 bf16",
    "torch/TraceLens__h100__Falconsai_nsfw_image_detection__1016002.json.gz": "cutlass bf16 tensorop, sm90 bf16",
    "torch/TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz": "sm90 bf16; one 4 us SIMT sgemm (0.01%)",
    "torch/TraceLens__b200__eager_trace.json.gz": "bmm_Bfloat16 / MxE4m3, nvjet",
    "torch/hta__negative_queue_length_values_check__rank0.json.gz": "A100 TF32 cutlass_80_tensorop_s1688gemm",
    "torch/hta__trace_diff__control__control.json.gz": "A100: ampere_sgemm only 2.4% of kernel time",
    "nsys/nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite": "H100 bf16 flash-attention and nvjet",
    "nsys/memfusion_artifact__report1.sqlite": "RTX 3090 sm80_xmma f16 tensor16x8x16 convolutions",
    "nsys/Fuser__64ee035__report1.sqlite": "H200 nvjet_hsh (FP16)",
    "nsys/DLProf__nsys_profile.sqlite": "RTX 2070 SUPER FP32 cuDNN, but 0.3 ms of kernels in all",
}


def _is_simt(name: str) -> bool:
    """FP32 GEMM/convolution math on CUDA cores, by plain substrings of the name."""
    n = name.lower()
    if any(t in n for t in ("tensorop", "tf32", "f16", "half", "s884", "s1688", "h884", "hmma")):
        return False
    if "winograd_nonfused" in n:  # the data transforms around cuDNN's Winograd GEMM
        return False
    # cuBLAS's own parameter types say "cublasGemm...": no sgemm
    return ("sgemm" in n.replace("cublasgemm", "") or "scudnn" in n or ("xmma" in n and "_ffma_" in n)
            or (("dgrad" in n or "wgrad" in n) and "<float" in n))


def _raw_kernels(rel: str) -> list[tuple[int, str, int]]:
    """(device, name, duration ns) of every kernel in the raw file."""
    path = shared_traces() / rel
    if rel.endswith(".sqlite"):
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        return con.execute("""SELECT k.deviceId, coalesce(s.value, ''), k."end" - k.start
                              FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds s ON s.id = k.demangledName""").fetchall()
    with (gzip.open(path, "rt") if rel.endswith(".gz") else open(path)) as f:
        events = json.load(f)["traceEvents"]
    # Kineto writes microseconds with three decimals: rounded to whole nanoseconds as the store does
    return [(e["args"]["device"], e["name"], round(e["dur"] * 1000)) for e in events
            if str(e.get("cat", "")).lower() == "kernel" and e.get("ph") == "X"]


def _findings(store, rel: str) -> list[dict]:
    file_name = rel.split("/", 1)[1]
    rows = store.sql("""SELECT f.device_id, f.value, f.severity, f.hint, f.evidence FROM findings f JOIN runs r USING (run_id)
                        WHERE f.rule_id = 'B005' AND r.file_name = $f ORDER BY f.device_id""", {"f": file_name}).fetchall()
    return [{"device_id": d, "value": v, "severity": s, "hint": h, "evidence": json.loads(e)} for d, v, s, h, e in rows]


def test_b005_fires_exactly_on_the_fp32_simt_traces(real_corpus):
    got = {(f"{fmt}/{name}", d) for fmt, name, d in real_corpus.sql(
        """SELECT CASE WHEN r.format = 'nsys-sqlite' THEN 'nsys' ELSE 'torch' END, r.file_name, f.device_id
           FROM findings f JOIN runs r USING (run_id) WHERE f.rule_id = 'B005'""").fetchall()}
    assert got == set(FIRES)


@pytest.mark.parametrize("rel", sorted({rel for rel, _ in FIRES}))
def test_b005_share_is_the_raw_traces(real_corpus, rel):
    total, simt = Counter(), Counter()
    for device, name, dur in _raw_kernels(rel):
        total[device] += dur
        if _is_simt(name):
            simt[device] += dur
    found = _findings(real_corpus, rel)
    assert [f["device_id"] for f in found] == sorted(d for r, d in FIRES if r == rel)
    for f in found:
        d = f["device_id"]
        share, cc = FIRES[(rel, d)]
        assert f["evidence"]["simt_ns"] == simt[d] and f["evidence"]["kernel_ns"] == total[d]
        assert math.isclose(f["value"], simt[d] / total[d], rel_tol=1e-9)
        assert round(f["value"], 4) == share
        assert f["evidence"]["compute_capability"] == cc
        if cc == "7.0":  # V100: no TF32 or BF16, FP16 autocast with a GradScaler
            assert f["evidence"]["tensor_dtypes"] == ["fp16"] and "GradScaler" in f["hint"] and "tf32" not in f["hint"]
        else:
            assert f["evidence"]["tensor_dtypes"] == ["tf32", "bf16"] and "allow_tf32" in f["hint"]


@pytest.mark.parametrize("rel", sorted(QUIET))
def test_b005_is_quiet_on_tensor_core_traces(real_corpus, rel):
    kernels = _raw_kernels(rel)
    assert kernels, rel  # the trace has kernels to judge
    assert not _findings(real_corpus, rel), QUIET[rel]


def _planted_b005(tmp_path, device: dict) -> list[dict]:
    """B005's findings on the planted V100 trace with its deviceProperties entry replaced."""
    from traceanalyzer.rules.engine import Settings, run_rules
    from traceanalyzer.store import Store

    from .conftest import FIXTURES

    doc = json.loads((FIXTURES / "kineto" / "bottleneck_tensorcores.json").read_text())
    doc["deviceProperties"] = [device]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    with Store(tmp_path / "s.duckdb") as store:
        run_id = store.ingest(path).run_id
        [outcome] = run_rules(store, [run_id], Settings(select=["B005"]))
        assert outcome.status == "ran", outcome.note
        rows = store.sql("SELECT evidence, message FROM findings WHERE rule_id = 'B005'").fetchall()
    return [{"evidence": json.loads(e), "message": m} for e, m in rows]


def test_b005_needs_tensor_cores(tmp_path):
    """The same FP32 GEMMs on a Pascal P100 (compute capability 6.0, no tensor cores): nothing to switch on."""
    p100 = {"id": 0, "name": "Tesla P100-SXM2-16GB", "computeMajor": 6, "computeMinor": 0, "numSms": 56,
            "totalGlobalMem": 17071734784, "maxThreadsPerBlock": 1024, "warpSize": 32}
    assert _planted_b005(tmp_path, p100) == []


def test_b005_tells_the_architecture_from_kernel_names_without_a_device_description(tmp_path):
    [f] = _planted_b005(tmp_path, {"id": 0})
    assert f["evidence"]["compute_capability"] == "7.0"
    assert f["evidence"]["compute_capability_source"] == "kernel names (at least)"
    assert "sm_70 or later, from its kernel names" in f["message"]
