"""Kineto reader: real traces, the planted fixtures, bad input, and one store round trip.

Expected values are re-derived here from the JSON with `json`/`gzip` (floats parsed as
Decimal, so times are exact), never by calling the reader's own helpers.
"""

from __future__ import annotations

import gzip
import importlib
import json
import re
import subprocess
import sys
from collections import Counter
from decimal import ROUND_HALF_EVEN, Decimal
from functools import lru_cache
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, SHARED_TRACES
from traceanalyzer.ingest.base import TraceError, count
from traceanalyzer.ingest.kineto import read

KINETO_FIXTURES = FIXTURES / "kineto"
TORCH_FILES = sorted(p.name for p in (SHARED_TRACES / "torch").glob("*")) or ["(no shared traces)"]
# Traces with no GPU kernel activity at all (MTIA, CPU-only, CUPTI counter mode).
NO_KERNEL_FILES = [
    "hta__mtia_inference_trace__mtia_inference_rank_0.json.gz",
    "hta__cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta__rank_non_gpu__rank_non_gpu.json.gz",
    "hta__distributed_info_unavailable__distributed_info_not_found.json.gz",
    "hta__cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz",
]


def _gen():
    """fixtures/gen_kineto.py as a module (fixtures/ is not a package)."""
    if str(FIXTURES.parent) not in sys.path:
        sys.path.insert(0, str(FIXTURES.parent))
    return importlib.import_module("fixtures.gen_kineto")


# ---- independent derivation from the JSON ------------------------------------------------

def _load(path: Path):
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _ns(us, base: int) -> int:
    """Exact ns of a µs value: the decimal digits json read (repr round-trips them)."""
    return base + int((Decimal(repr(us)) * 1000).to_integral_value(ROUND_HALF_EVEN))


def _cat(e) -> str:
    return (e.get("cat") or "").lower()


@lru_cache(maxsize=None)
def _expected(path: Path) -> dict:
    """What the reader should produce, from the JSON alone (kept small: it is cached)."""
    doc = _load(path)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    top = doc if isinstance(doc, dict) else {}
    base = top.get("baseTimeNanoseconds", 0)
    complete: dict[str, list] = {}
    for e in events:
        if e.get("ph") == "X":
            complete.setdefault(_cat(e), []).append(e)
    # A 2021 trace's ProfilerStep#N is an `Operator` event: a step (a range), not an operator.
    legacy_steps = [e for e in complete.get("operator", []) if re.fullmatch(r"ProfilerStep#\d+", e["name"])]
    complete["operator"] = [e for e in complete.get("operator", []) if e not in legacy_steps]
    complete.setdefault("user_annotation", []).extend(legacy_steps)
    by = lambda *cats: [e for c in cats for e in complete.get(c, [])]  # noqa: E731
    kernels, calls = by("kernel"), by("cuda_runtime", "runtime", "cuda_driver")
    copies, memsets = by("gpu_memcpy", "memcpy"), by("gpu_memset", "memset")
    call_by_corr = {e["args"]["correlation"]: e for e in calls if "correlation" in e.get("args", {})}

    def copy_bytes(e):
        a = e["args"]
        if "bytes" in a:
            return a["bytes"]
        call = call_by_corr.get(a.get("correlation"))  # ROCm: size is on the hip call
        return int(call["args"]["size"]) if call and "size" in call["args"] else None

    memory = [e for e in events if e.get("name") == "[memory]"]
    props = top.get("deviceProperties", top.get("computeProperties")) or []
    dist = top.get("distributedInfo") or {}
    return {
        "counts": {
            "kernels": len(kernels), "api_calls": len(calls), "copies": len(copies),
            "memsets": len(memsets), "syncs": len(by("cuda_sync")),
            "cpu_ops": len(by("cpu_op", "operator")),
            "ranges": len(by("user_annotation", "gpu_user_annotation")),
            "memory_events": len(memory),
        },
        "rank_world": (dist.get("rank"), dist.get("world_size")),
        "kernel_times": sorted((_ns(e["ts"], base), _ns(e["ts"], base) + _ns(e["dur"], 0)) for e in kernels),
        "kernels_with_call": sum(1 for e in kernels if e["args"].get("correlation") in call_by_corr),
        "htod_bytes": sum(copy_bytes(e) or 0 for e in copies if e["name"].startswith("Memcpy HtoD")),
        "memory_bytes": sum(e["args"]["Bytes"] for e in memory),
        "props": {p["id"]: p for p in props},
        "gpu_devices": {e["pid"] for e in kernels + copies + memsets if isinstance(e["pid"], int)},
        "cpu_op_dims": [e["args"].get("Input Dims", e["args"].get("Input dims"))
                        for e in by("cpu_op", "operator")],
    }


def _col(trace, table: str, column: str) -> list:
    t = trace.tables.get(table)
    return [] if t is None else t.column(column).to_pylist()


def _table(trace, name):
    t = trace.tables.get(name)
    return [] if t is None else t.to_pylist()


# ---- real traces -------------------------------------------------------------------------

@pytest.mark.parametrize("name", TORCH_FILES)
def test_real_trace_reads_to_the_counts_and_devices_in_the_json(traces_dir, name):
    path = traces_dir / "torch" / name
    exp = _expected(path)
    trace = read(path)
    _devices_come_from_device_properties(trace, exp)
    assert trace.format == "kineto-json" and trace.producer == "kineto"
    assert {t: count(trace, t) for t in exp["counts"]} == exp["counts"]
    assert not [w for w in trace.warnings if "skipped" in w]
    starts, ends = _col(trace, "kernels", "start_ns"), _col(trace, "kernels", "end_ns")
    assert sorted(zip(starts, ends)) == exp["kernel_times"]
    assert sum(c is not None for c in _col(trace, "kernels", "launch_call_id")) == exp["kernels_with_call"]
    copies = zip(_col(trace, "copies", "bytes"), _col(trace, "copies", "direction"))
    htod = sum(b or 0 for b, d in copies if d == "HtoD")
    assert htod == exp["htod_bytes"]
    assert sum(_col(trace, "memory_events", "bytes")) == exp["memory_bytes"]
    # cpu_ops keep file order (Operator and cpu_op never share a file)
    assert [None if d is None else json.loads(d) for d in _col(trace, "cpu_ops", "input_dims")] == exp["cpu_op_dims"]
    assert trace.clock == "unix-epoch"  # every real file is epoch µs or has a base
    assert (trace.rank, trace.world_size) == exp["rank_world"]


def _devices_come_from_device_properties(trace, exp: dict) -> None:
    """The devices table: the trace's deviceProperties, and every GPU with activity."""
    devices = {d["device_id"]: d for d in _table(trace, "devices")}
    gpu = exp["gpu_devices"]
    if any("AMD" in str(p.get("name")) for p in exp["props"].values()):
        # ROCm activity on undescribed agent ids is the described devices without activity, in order
        unlisted, spare = sorted(gpu - exp["props"].keys()), sorted(exp["props"].keys() - gpu)
        gpu = (gpu - set(unlisted[:len(spare)])) | set(spare[:len(unlisted)])
    assert set(devices) == set(exp["props"]) | gpu
    for i, p in exp["props"].items():
        d = devices[i]
        assert d["name"] == p["name"]
        assert d["sm_count"] == p.get("numSms", p.get("multiProcessorCount"))
        threads = p.get("maxThreadsPerMultiprocessor", p.get("maxThreadsPerMultiProcessor"))
        if threads and "warpSize" in p:
            assert d["max_warps_per_sm"] == threads // p["warpSize"]
        if "totalGlobalMem" in p:
            assert d["total_memory_bytes"] == p["totalGlobalMem"]
    for i in gpu - set(exp["props"]):
        assert devices[i]["name"] is None


def test_real_trace_values_checked_by_hand(traces_dir):
    """A few values read off the files directly."""
    t = read(traces_dir / "torch" / "TraceLens__h100__gaunernst_bert-small-uncased__1016001.json.gz")
    first = min(_table(t, "kernels"), key=lambda k: k["start_ns"])
    # "ts": 1419247333430.849, "dur": 3.136 with baseTimeNanoseconds 1751410836000000000
    assert first["start_ns"] == 1751410836000000000 + 1419247333430849
    assert first["end_ns"] - first["start_ns"] == 3136
    assert (first["grid_x"], first["block_x"], first["registers_per_thread"]) == (564, 128, 32)
    assert first["short_name"] == "indexSelectLargeIndex"
    dev = _table(t, "devices")[0]
    assert (dev["name"], dev["sm_count"], dev["vendor"], dev["compute_major"]) == (
        "NVIDIA H100 80GB HBM3", 132, "nvidia", 9)

    legacy = read(traces_dir / "torch"
                  / "kineto__tb_plugin__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz")
    k = next(r for r in _table(legacy, "kernels") if r["correlation_id"] == 34441)
    # {"tid": "stream 7", "ts": 1623142623531625, "dur": 2, "args": {"external id": 544, ...}}
    assert (k["stream_id"], k["start_ns"], k["end_ns"], k["external_id"]) == (
        7, 1623142623531625000, 1623142623531627000, 544)
    assert (k["pid"], k["tid"]) == (25738, 25738)  # from the Runtime call's pid and "25738"
    assert legacy.schema_version.startswith("legacy-categories")

    amd = read(traces_dir / "torch" / "hta__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    copy = _table(amd, "copies")[0]
    assert (copy["bytes"], copy["api_name"], copy["src_kind"]) == (2560, "hipMemcpyWithStream", "unknown")
    gemm = next(r for r in _table(amd, "kernels") if r["correlation_id"] == 121)
    assert (gemm["grid_x"], gemm["block_x"]) == (512, 256)  # from the hipExtModuleLaunchKernel args
    assert {d["vendor"] for d in _table(amd, "devices")} == {"amd"}
    assert {d["compute_major"] for d in _table(amd, "devices")} == {None}

    sync = read(traces_dir / "torch" / "hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz")
    kinds = Counter((s["kind"], s["api_name"]) for s in _table(sync, "syncs"))
    assert kinds == {("stream", "cudaStreamSynchronize"): 16, ("stream_wait_event", "cudaStreamWaitEvent"): 20,
                     ("device", "cudaDeviceSynchronize"): 5}


@pytest.mark.parametrize("name", NO_KERNEL_FILES)
def test_traces_without_gpu_kernels_read_with_zero_kernels(traces_dir, name):
    trace = read(traces_dir / "torch" / name)
    assert count(trace, "kernels") == 0 and count(trace, "copies") == 0
    assert count(trace, "cpu_ops") > 0


def test_mtia_trace_is_flagged_not_mapped(traces_dir):
    trace = read(traces_dir / "torch" / "hta__mtia_inference_trace__mtia_inference_rank_0.json.gz")
    assert any("MTIA" in w for w in trace.warnings)
    assert count(trace, "api_calls") == 0
    assert [(d["device_id"], d["name"], d["vendor"]) for d in _table(trace, "devices")] == [(17, "ARTEMIS", "meta")]
    assert trace.host == "twshared38393.01.cco6.facebook.com"


# ---- planted fixtures --------------------------------------------------------------------

@pytest.fixture(scope="module")
def planted_trace():
    return read(KINETO_FIXTURES / "planted.json")


def _busy_gaps(trace, device_id: int, min_gap_ns: int) -> list[tuple[int, int]]:
    intervals = sorted((r["start_ns"], r["end_ns"]) for t in ("kernels", "copies", "memsets")
                       for r in _table(trace, t) if r["device_id"] == device_id)
    gaps, busy = [], intervals[0][1]
    for start, end in intervals[1:]:
        if start - busy > min_gap_ns:
            gaps.append((busy, start))
        busy = max(busy, end)
    return gaps


def test_planted_counts_and_run_facts(planted_trace):
    P = _gen().PLANTED
    t = planted_trace
    assert {k: count(t, k) for k in P["counts"]} == P["counts"]
    assert (t.rank, t.world_size, t.host, t.clock) == (P["rank"], P["world_size"], P["host"], "unix-epoch")
    assert t.metadata["baseTimeNanoseconds"] == P["base_time_ns"] and t.warnings == []
    dev = {d["device_id"]: d for d in _table(t, "devices")}[P["device"]["device_id"]]
    for key in ("name", "sm_count", "max_warps_per_sm", "registers_per_sm", "shared_mem_per_sm_bytes",
                "max_shared_mem_per_block_optin_bytes"):
        assert dev[key] == P["device"][key], key
    assert (dev["compute_major"], dev["compute_minor"]) == tuple(P["device"]["compute"])


def test_planted_gaps_sync_and_late_launch(planted_trace):
    P, t = _gen().PLANTED, planted_trace
    gaps = _busy_gaps(t, P["device"]["device_id"], 1_000)
    assert gaps == [(g["start_ns"], g["end_ns"]) for g in P["gaps"]]
    stream = sorted((k["start_ns"], k["end_ns"]) for k in _table(t, "kernels") if k["stream_id"] == P["gap_stream_id"])
    small = [b[0] - a[1] for a, b in zip(stream, stream[1:]) if b[0] - a[1] <= 1_000]
    assert max(small) == P["max_unplanted_gap_ns"]

    calls = {c["call_id"]: c for c in _table(t, "api_calls")}
    (sync,) = _table(t, "syncs")
    s = P["sync_in_gap"]
    call = calls[sync["launch_call_id"]]
    assert (sync["kind"], sync["api_name"], sync["correlation_id"]) == (s["sync_kind"], s["api_name"], s["correlation"])
    assert (call["start_ns"], call["end_ns"]) == (s["start_ns"], s["end_ns"])
    gap = P["gaps"][s["gap_index"]]
    assert call["start_ns"] < gap["start_ns"] < call["end_ns"] < gap["end_ns"]

    late = P["late_launch"]
    k = next(k for k in _table(t, "kernels") if k["correlation_id"] == late["kernel_correlation"])
    launch = calls[k["launch_call_id"]]
    assert (launch["name"], launch["start_ns"], launch["end_ns"]) == (
        "cudaLaunchKernel", late["launch_start_ns"], late["launch_end_ns"])
    assert k["start_ns"] == late["kernel_start_ns"] and launch["start_ns"] > late["previous_kernel_end_ns"]


def test_planted_copies(planted_trace):
    P, t = _gen().PLANTED, planted_trace
    copies = {c["correlation_id"]: c for c in _table(t, "copies")}
    kernels = _table(t, "kernels")
    for key, kind in (("pinned_htod", "pinned"), ("pageable_htod", "pageable")):
        c, fact = copies[P[key]["correlation"]], P[key]
        assert (c["direction"], c["src_kind"], c["dst_kind"], c["bytes"]) == ("HtoD", kind, "device", fact["bytes"])
        assert (c["start_ns"], c["end_ns"], c["stream_id"]) == (fact["start_ns"], fact["end_ns"], fact["stream_id"])
        covered = sum(max(0, min(c["end_ns"], k["end_ns"]) - max(c["start_ns"], k["start_ns"])) for k in kernels)
        assert covered == fact["overlap_with_kernels_ns"]
        assert c["api_name"] == "cudaMemcpyAsync"
    small = [copies[i] for i in P["small_htod"]["correlations"]]
    assert len(small) == P["small_htod"]["count"] and {c["bytes"] for c in small} == {P["small_htod"]["bytes_each"]}
    htod = [c for c in copies.values() if c["direction"] == "HtoD"]
    assert (len(htod), sum(c["bytes"] for c in htod)) == (P["htod_count"], P["htod_bytes"])
    (memset,) = _table(t, "memsets")
    assert (memset["bytes"], memset["mem_kind"], memset["correlation_id"]) == (
        P["memset"]["bytes"], P["memset"]["mem_kind"], P["memset"]["correlation"])


def test_planted_kernel_launch_shapes(planted_trace):
    P, t = _gen().PLANTED, planted_trace
    by_corr = {k["correlation_id"]: k for k in _table(t, "kernels")}
    tail = by_corr[P["tail_kernel"]["correlation"]]
    sm_count = P["device"]["sm_count"]
    assert (tail["grid_x"], tail["block_x"], tail["registers_per_thread"]) == (950, 256, 32)
    assert tail["blocks_per_sm"] == pytest.approx(950 / sm_count, abs=1e-6)
    assert tail["est_achieved_occupancy_pct"] == P["tail_kernel"]["est_achieved_occupancy_pct"]
    assert tail["grid_x"] / (P["tail_kernel"]["active_blocks_per_sm"] * sm_count) == pytest.approx(1.1, abs=0.01)
    for corr in P["register_limited_kernel"]["correlations"]:
        k = by_corr[corr]
        assert (k["registers_per_thread"], k["est_achieved_occupancy_pct"]) == (128, 25)
        assert k["name"] == P["register_limited_kernel"]["name"] and k["short_name"] == "Kernel"
    assert {k["pid"] for k in by_corr.values()} == {4242}
    assert all(k["external_id"] is not None for k in by_corr.values())


def test_planted_cpu_ops_memory_and_steps(planted_trace):
    P, t = _gen().PLANTED, planted_trace
    mm = sorted((o for o in _table(t, "cpu_ops") if o["name"] == P["op_shapes"]["name"]), key=lambda o: o["start_ns"])
    assert len(mm) == P["op_shapes"]["calls"]
    shapes = [json.loads(o["input_dims"]) for o in mm]
    assert [s for s in P["op_shapes"]["distinct_shapes"]] == list({json.dumps(s): s for s in shapes}.values())
    assert [shapes.count(s) for s in P["op_shapes"]["distinct_shapes"]] == P["op_shapes"]["calls_per_shape"]
    seen = set()
    for o, s in zip(mm, shapes):
        first = json.dumps(s) not in seen
        seen.add(json.dumps(s))
        expected = P["op_shapes"]["first_call_cpu_dur_ns" if first else "later_call_cpu_dur_ns"]
        assert o["end_ns"] - o["start_ns"] == expected
    assert {o["input_types"] for o in mm} == {'["float", "float"]'}

    mem = _table(t, "memory_events")
    cuda = [m for m in mem if m["device_type"] == "cuda"]
    assert max(m["total_allocated_bytes"] for m in cuda) == P["memory"]["peak_allocated_bytes"]
    assert len(cuda) == P["memory"]["events"] and len(mem) - len(cuda) == P["memory"]["cpu_events"]
    assert {m["device_id"] for m in mem if m["device_type"] == "cpu"} == {-1}

    ranges = _table(t, "ranges")
    cpu_steps = [(r["name"], r["start_ns"], r["end_ns"]) for r in ranges if r["kind"] == "user_annotation"]
    assert cpu_steps == [(s["name"], s["cpu_start_ns"], s["cpu_end_ns"]) for s in P["profiler_steps"]]
    gpu = [r for r in ranges if r["kind"] == "gpu_user_annotation"]
    assert [r["name"] for r in gpu] == [s["name"] for s in P["profiler_steps"]]
    assert {(r["device_id"], r["stream_id"], r["pid"]) for r in gpu} == {(0, 7, None)}


def test_clean_fixture_has_none_of_the_problems():
    C = _gen().CLEAN
    t = read(KINETO_FIXTURES / "clean.json.gz")
    kernels, copies = _table(t, "kernels"), _table(t, "copies")
    assert (len(kernels), len(copies)) == (C["kernels"], C["copies"])
    assert _busy_gaps(t, 0, C["max_gap_ns"]) == []
    for c in copies:
        assert c["src_kind"] == "pinned"
        covered = sum(max(0, min(c["end_ns"], k["end_ns"]) - max(c["start_ns"], k["start_ns"])) for k in kernels)
        assert covered == c["end_ns"] - c["start_ns"]
    sm_count = _table(t, "devices")[0]["sm_count"]
    assert [k["grid_x"] / (8 * sm_count) for k in sorted(kernels, key=lambda k: k["start_ns"])] == C["waves"]
    assert count(t, "syncs") == 0 and count(t, "memsets") == 0


def test_legacy_fixture():
    L = _gen().LEGACY
    t = read(KINETO_FIXTURES / "legacy_2021.json")
    assert {k: count(t, k) for k in ("kernels", "copies", "memsets", "api_calls", "cpu_ops", "memory_events")} == {
        k: L[k] for k in ("kernels", "copies", "memsets", "api_calls", "cpu_ops", "memory_events")}
    assert t.schema_version == "legacy-categories/ts-int-us" and t.clock == "unix-epoch"
    first = min(_table(t, "copies") + _table(t, "kernels") + _table(t, "memsets"), key=lambda r: r["start_ns"])
    assert first["start_ns"] == L["first_gpu_ts_us"] * 1000 and first["stream_id"] == L["stream_id"]
    assert {o["tid"] for o in _table(t, "cpu_ops")} == {L["cpu_tid"]}
    assert all(k["external_id"] is not None and k["launch_call_id"] is not None for k in _table(t, "kernels"))
    devices = _table(t, "devices")
    assert [(d["device_id"], d["name"]) for d in devices] == [(0, None)]


def test_regeneration_is_byte_identical(tmp_path):
    gen = _gen()
    written = gen.write_all(tmp_path)
    assert written  # other generators (gen_structure, gen_timeline, ...) also write into fixtures/kineto
    for p in written:
        assert p.read_bytes() == (KINETO_FIXTURES / p.name).read_bytes(), p.name


# ---- bad input ---------------------------------------------------------------------------

GOOD = b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.5, "dur": 2.0}]}'
BAD_INPUTS = {
    "truncated_gzip": gzip.compress(GOOD * 1, mtime=0)[:-12],
    "truncated_json": GOOD[:40],
    "not_a_trace_object": b'{"foo": 1, "bar": [1, 2]}',
    "array_of_numbers": b"[1, 2, 3]",
    "objects_without_phase": b'[{"a": 1}, {"b": 2}]',
    "nested_100000_deep": b"[" * 100_000 + b"]" * 100_000,
    "nested_100000_deep_in_args": b'{"traceEvents": [{"ph": "X", "args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
    "nested_100000_deep_events": b'{"traceEvents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "ts_is_a_string": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "1", "dur": 1}]}',
    "trace_events_not_a_list": b'{"traceEvents": {"ph": "X"}}',
    "base_time_not_an_int": b'{"baseTimeNanoseconds": "soon", "traceEvents": []}',
    "empty_file": b"",
    "plain_text": b"hello world",
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_a_one_line_trace_error(tmp_path, case):
    path = tmp_path / f"{case}.json"
    path.write_bytes(BAD_INPUTS[case])
    with pytest.raises(TraceError) as err:
        read(path)
    msg = str(err.value)
    assert msg and "\n" not in msg and "Traceback" not in msg


def test_deep_nesting_does_not_crash_the_interpreter(tmp_path):
    """In a fresh interpreter: a C-level stack overflow would kill it, not raise."""
    path = tmp_path / "deep.json"
    path.write_bytes(b'{"traceEvents": [{"args": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}")
    code = ("from traceanalyzer.ingest.kineto import read\n"
            "from traceanalyzer.ingest.base import TraceError\n"
            f"try: read({str(path)!r})\nexcept TraceError as e: print('TraceError:', e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=FIXTURES.parent)
    assert out.returncode == 0 and out.stdout.startswith("TraceError:"), out.stderr[-500:]


def _events(*events: dict) -> bytes:
    return json.dumps({"traceEvents": list(events)}).encode()


def test_events_missing_keys_or_negative_durations_are_skipped_and_counted(tmp_path):
    k = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0, "dur": 1.0,
         "args": {"correlation": 5, "grid": [1, 1, 1]}}
    path = tmp_path / "t.json"
    path.write_bytes(_events(
        k,
        {key: v for key, v in k.items() if key != "ts"},          # no ts
        {**k, "dur": -3.0},                                       # ends before it starts
        {**k, "args": {"correlation": "five"}},                   # wrongly typed arg
        {**k, "args": None},                                      # args: null is just no args
        {**k, "args": {"correlation": 2**70}},                    # past int64
        {**k, "ts": 1e300},                                       # a time no clock reaches
        {"ph": "X", "cat": "cpu_op", "ts": 1.0, "dur": 1.0},      # cpu_op without a name
    ))
    t = read(path)
    assert count(t, "kernels") == 2 and count(t, "cpu_ops") == 0
    warned = " | ".join(t.warnings)
    for text in ("kernel events without ts, dur or name skipped: 1",
                 "kernel events with negative duration (end before start) skipped: 1",
                 "kernel events with unusable args (wrong value type or out of range) skipped: 2",
                 "kernel events with out-of-range times skipped: 1",
                 "cpu_op events without ts, dur or name skipped: 1"):
        assert text in warned


def test_gzip_is_detected_by_content_not_name(tmp_path):
    gz_named_json = tmp_path / "a.json"
    gz_named_json.write_bytes(gzip.compress(GOOD, mtime=0))
    json_named_gz = tmp_path / "b.json.gz"
    json_named_gz.write_bytes(GOOD)
    for p in (gz_named_json, json_named_gz):
        (k,) = _table(read(p), "kernels")
        assert (k["start_ns"], k["end_ns"], k["stream_id"], k["device_id"]) == (1500, 3500, 7, 0)


def test_bare_event_array_and_relative_clock(tmp_path):
    path = tmp_path / "bare.json"
    path.write_bytes(b'[{"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 3", "ts": 12, "dur": 3}]')
    t = read(path)
    (k,) = _table(t, "kernels")
    assert (k["start_ns"], k["end_ns"], k["stream_id"]) == (12_000, 15_000, 3)
    assert t.clock == "kineto-relative"


# ---- store round trip --------------------------------------------------------------------

def test_ingest_planted_into_a_store(store):
    P = _gen().PLANTED
    result = store.ingest(KINETO_FIXTURES / "planted.json")
    assert result.format == "kineto-json"
    assert {k: result.counts[k] for k in P["counts"]} == P["counts"]
    row = store.sql("SELECT clock, rank, world_size, host, producer FROM runs WHERE run_id = ?",
                    [result.run_id]).fetchone()
    assert row == ("unix-epoch", P["rank"], P["world_size"], P["host"], "kineto")
    gap = P["gaps"][0]
    n = store.sql("SELECT count(*) FROM kernels WHERE run_id = ? AND start_ns = ?",
                  [result.run_id, gap["end_ns"]]).fetchone()[0]
    assert n == 1
    sm = store.sql("SELECT sm_count FROM devices WHERE run_id = ? AND device_id = 0", [result.run_id]).fetchone()[0]
    assert sm == P["device"]["sm_count"]


def _rocm_memory_trace(path: Path) -> Path:
    """A ROCm build's allocator events (c10 device type HIP, 6) around one kernel, and a CPU one (0)."""
    k = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0, "dur": 100.0,
         "args": {"device": 0, "stream": 7, "correlation": 5}}
    mem = [{"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Device Type": dtype, "Device Id": did, "Addr": addr, "Bytes": nbytes,
                     "Total Allocated": total, "Total Reserved": 1 << 24}}
           for ts, dtype, did, addr, nbytes, total in [(5.0, 6, 0, 4096, 1 << 20, 1 << 20),
                                                      (20.0, 6, 0, 8192, 1 << 21, 3 << 20),
                                                      (30.0, 0, -1, 16, 64, 64),
                                                      (90.0, 6, 0, 8192, -(1 << 21), 1 << 20)]]
    path.write_bytes(_events(k, *mem))
    return path


def test_rocm_allocator_events_are_gpu_memory(tmp_path, store):
    from traceanalyzer.rules.engine import Settings, run_rules

    path = _rocm_memory_trace(tmp_path / "rocm.json")
    assert Counter(_col(read(path), "memory_events", "device_type")) == {"cuda": 3, "cpu": 1}
    run_id = store.ingest(path).run_id
    (oc,) = run_rules(store, [run_id], Settings(select=["M001"]))
    assert oc.status == "ran" and oc.findings == 1
    peak = store.sql("SELECT value FROM findings WHERE run_id = ? AND rule_id = 'M001'", [run_id]).fetchone()[0]
    assert peak == 3 << 20


def test_a_store_of_schema_3_calls_rocm_allocator_events_gpu_memory(tmp_path):
    import duckdb

    from traceanalyzer.store import Store, migrations

    path = tmp_path / "s.duckdb"
    with Store(path) as st:
        st.ingest(_rocm_memory_trace(tmp_path / "rocm.json"))
    with duckdb.connect(str(path)) as con:  # as the reader stored them before, in a store of version 3
        con.execute("UPDATE memory_events SET device_type = '6' WHERE device_type = 'cuda'")
        con.execute("UPDATE store_info SET value = '3' WHERE key = 'schema_version'")
    with Store(path) as st:
        assert migrations.version(st.con) == migrations.SCHEMA_VERSION
        rows = st.sql("SELECT device_type, count(*) FROM memory_events GROUP BY ALL ORDER BY ALL").fetchall()
        assert rows == [("cpu", 1), ("cuda", 3)]


# ---- chunked decoding ------------------------------------------------------------------------

def _snapshot(t) -> tuple:
    """Everything a read gives, in a comparable form."""
    tables = {name: tbl.to_pydict() for name, tbl in sorted(t.tables.items())}
    return (t.schema_version, t.clock, t.host, t.rank, t.world_size, t.warnings,
            json.dumps(t.metadata, sort_keys=True, default=str), tables)


def _read_in_small_blocks(path: Path, monkeypatch, block: int):
    from traceanalyzer.ingest import kineto_stream
    monkeypatch.setattr(kineto_stream, "READ_BYTES", block)
    monkeypatch.setattr(kineto_stream, "CUT_WINDOW_BYTES", 4 * block)
    return read(path)


def _whole_file(path: Path, monkeypatch):
    """The reader with streaming turned off: what it does for any file it cannot stream."""
    from traceanalyzer.ingest import kineto, kineto_stream

    def refuse(self):
        raise kineto_stream.Unstreamable
        yield  # noqa: unreachable - a generator

    monkeypatch.setattr(kineto_stream.EventStream, "__iter__", refuse)
    try:
        return kineto.read(path)
    finally:
        monkeypatch.undo()


def _awkward_doc() -> dict:
    """Events whose text holds cuts that are not event boundaries, categories in mixed
    case (row order follows them), keys on both sides of the array, and skipped events."""
    k = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0, "dur": 1.0,
         "args": {"correlation": 1, "grid": [2, 1, 1]}}
    r = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 9.0, "dur": 0.5,
         "args": {"correlation": 1, "External id": 4}}
    events = []
    for i in range(400):
        events.append({**k, "ts": 10.0 + i, "args": {**k["args"], "correlation": i}})
        events.append({**r, "ts": 9.0 + i, "args": {**r["args"], "correlation": i}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "step {'a': 1}, {'b': 2}" if i % 7 == 0 else "aten::mm",
                       "pid": 1, "tid": 2, "ts": 8.0 + i, "dur": 3,
                       "args": {"Input Dims": [[1, 2]], "nested": [{"x": 1}, {"y": {"z": 2}}], "External id": i}})
        if i % 50 == 0:
            events.append({**k, "cat": "Kernel", "name": 'x"}, {"ph": "X"', "ts": 5.0 + i})
            events.append({**k, "ts": None})
            events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2, "ts": 8.5 + i,
                           "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512 if i % 100 else "bad"}})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "numSms": 132}],
            "traceEvents": events, "traceName": "t", "baseTimeNanoseconds": 1_700_000_000_000_000_000}


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("indent", [None, 2])
def test_chunked_read_equals_whole_file_read(tmp_path, monkeypatch, gz, indent):
    raw = json.dumps(_awkward_doc(), indent=indent).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    whole = _snapshot(_whole_file(path, monkeypatch))
    assert whole[-1]["kernels"]["kernel_id"]  # the document does give rows
    for block in (61, 997, 8 << 20):
        assert _snapshot(_read_in_small_blocks(path, monkeypatch, block)) == whole, block


def test_chunked_read_of_real_traces_equals_whole_file_read(traces_dir, monkeypatch):
    for name in ("hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz",
                 "hta__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                 "kineto__docs__before_fix_trace.json"):
        path = traces_dir / "torch" / name
        whole = _snapshot(_whole_file(path, monkeypatch))
        assert _snapshot(_read_in_small_blocks(path, monkeypatch, 4096)) == whole, name


ODD_BUT_VALID = {
    "duplicate_key_last_wins": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "dur": 1}],'
                               b' "traceEvents": [{"ph": "X", "cat": "kernel", "name": "b", "ts": 1, "dur": 1}]}',
    "key_text_inside_a_string": b'{"a": "\\"traceEvents\\": [", "traceEvents": [{"ph": "X", "cat": "kernel",'
                                b' "name": "k", "ts": 1, "dur": 1}]}',
    "multi_member_gzip": None,
    "bom_and_whitespace": b'\xef\xbb\xbf \n {"traceEvents" : [ ] , "baseTimeNanoseconds": 5 }\n',
}


@pytest.mark.parametrize("case", sorted(ODD_BUT_VALID))
def test_odd_but_valid_json_reads_as_if_decoded_whole(tmp_path, monkeypatch, case):
    path = tmp_path / "t.json"
    doc = ODD_BUT_VALID[case]
    if doc is None:
        raw = json.dumps(_awkward_doc()).encode()
        path.write_bytes(gzip.compress(raw[:len(raw) // 3]) + gzip.compress(raw[len(raw) // 3:]) + b"\0" * 8)
    else:
        path.write_bytes(doc)
    whole = _snapshot(_whole_file(path, monkeypatch))
    for block in (7, 4096):
        assert _snapshot(_read_in_small_blocks(path, monkeypatch, block)) == whole


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gives_the_whole_file_error_when_streamed(tmp_path, monkeypatch, case):
    path = tmp_path / f"{case}.json"
    path.write_bytes(BAD_INPUTS[case])
    errors = []
    for reader in (lambda: _whole_file(path, monkeypatch), lambda: _read_in_small_blocks(path, monkeypatch, 16)):
        with pytest.raises(TraceError) as err:
            reader()
        errors.append(str(err.value))
        monkeypatch.undo()
    assert errors[0] == errors[1]
