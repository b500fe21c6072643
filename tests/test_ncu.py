"""Nsight Compute CSV reader: real exports, planted fixtures, bad input, store round trip.

Expected counts and values are re-derived here with the csv module (and unit arithmetic
by hand), never by calling the reader's own helpers.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import math
from pathlib import Path

import pyarrow.compute as pc
import pytest

from traceanalyzer.ingest.base import TraceError
from traceanalyzer.ingest.ncu import read
from traceanalyzer.ingest.ncu_launches import short_name
from traceanalyzer.ingest.ncu_units import resolve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NCU_FIXTURES = FIXTURES / "ncu"

DETAILS_FILES = {  # file -> (dialect, lines before the header)
    "PolyFHE__ckks_HMult__ncu-memory-evalkey-1.csv": ("details-2023", 0),
    "PolyFHE__ckks_HMult__ncu-ntt12-A4090-1.csv": ("details-2023", 0),
    "PolyFHE__profile__evalstall-stallreason-opt.csv": ("details-2023", 0),
    "XPlacer__cfd__aws-v100__nsight_cfd_097K.log": ("details-2020", 11),
    "XPlacer__cfd__lassen__nsight_cfd_097K.log": ("details-2020", 11),
    "XPlacer__gaussian__nsight_gaussian_16.log": ("details-2020", 10),
    "XPlacer__hotspot__lassen__nsight_hotspot_1024.log": ("details-2020", 10),
    "nsightful__copy_blocked.csv": ("details-2025", 0),
}
RAW_FILES = [
    "Roofline-Analysis__decodebench__torch_sdpa_cudnn__mqa_bf16_b128_ctx4k_p64.ncu.csv",
    "Roofline-Analysis__decodebench__torch_sdpa_flash__gqa_bf16_b64_ctx4k_p64.ncu.csv",
]
NEGATIVE_FILES = {  # file -> words the one-line message must contain
    "PolyFHE__artifact_evaluation__ncu__opt.csv": ["ncu text report, not CSV", "ncu-text reader"],
    "Roofline-Analysis__decodebench__flashinfer_paged_decode__gqa_bf16_b128_ctx8k_p64.ncu.csv":
        ["no ncu CSV header", "==PROF==", "==ERROR== The application returned an error code (1)."],
    "Roofline-Analysis__decodebench__flashinfer_paged_decode__gqa_fp8_b64_ctx4k_p64.ncu.csv":
        ["no ncu CSV header", "==PROF==", "==ERROR=="],
}


def csv_part(path: Path) -> tuple[list[str], list[list[str]], int]:
    """(header, data rows, lines before the header) the way a person would cut the file."""
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID",'))
    rows = list(csv.reader(lines[start:]))
    return rows[0], [r for r in rows[1:] if r], start


def rows_where(table, **equal):
    mask = None
    for col, value in equal.items():
        m = pc.equal(table[col], value)
        mask = m if mask is None else pc.and_(mask, m)
    return table.filter(mask).to_pylist()


def metric(trace, kernel_id: int, metric_id: str, section: str | None = None) -> dict:
    found = rows_where(trace.tables["kernel_metrics"], kernel_id=kernel_id, metric_id=metric_id)
    if section is not None:
        found = [r for r in found if r["section"] == section]
    assert len(found) == 1, (kernel_id, metric_id, found)
    return found[0]


# -- real exports -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DETAILS_FILES))
def test_real_details_counts(traces_dir, name):
    path = traces_dir / "ncu" / name
    header, rows, before = csv_part(path)
    col = {c: i for i, c in enumerate(header)}
    ids = {r[col["ID"]] for r in rows}
    metric_rows = [r for r in rows if len(r) > col["Metric Value"] and r[col["Metric Name"]]]
    rule_rows = [r for r in rows if "Rule Name" in col and len(r) > col["Rule Name"] and r[col["Rule Name"]]]

    trace = read(path)
    dialect, lines_before = DETAILS_FILES[name]
    assert (trace.format, trace.producer, trace.producer_version, trace.clock) == ("ncu-csv", "ncu", dialect, "none")
    assert trace.metadata["lines_before_header"] == before == lines_before
    assert trace.metadata["header_columns"] == header
    assert trace.tables["kernels"].num_rows == len(ids)
    assert sorted(trace.tables["kernels"]["kernel_id"].to_pylist()) == sorted(int(i) for i in ids)
    assert trace.tables["kernel_metrics"].num_rows == len(metric_rows)
    assert trace.tables.get("kernel_rule_results", None) is None or \
        trace.tables["kernel_rule_results"].num_rows == len(rule_rows)
    assert trace.warnings == []
    kernels = trace.tables["kernels"]
    assert "start_ns" not in kernels.column_names  # ncu has no timeline: times stay NULL
    # Every metric row belongs to a kernel row.
    assert set(trace.tables["kernel_metrics"]["kernel_id"].to_pylist()) <= set(kernels["kernel_id"].to_pylist())
    # Kernel names come from the first row of each ID.
    first_name = {}
    for r in rows:
        first_name.setdefault(int(r[col["ID"]]), r[col["Kernel Name"]])
    assert dict(zip(kernels["kernel_id"].to_pylist(), kernels["name"].to_pylist())) == first_name


@pytest.mark.parametrize("name", RAW_FILES)
def test_real_raw_counts(traces_dir, name):
    path = traces_dir / "ncu" / name
    header, rows, before = csv_part(path)
    assert rows[0][0] == ""  # units row
    launches = [r for r in rows[1:] if r[0]]
    metric_columns = header[header.index("CC") + 1:]

    trace = read(path)
    assert trace.producer_version == "raw" and trace.metadata["lines_before_header"] == before == 2
    assert trace.tables["kernels"].num_rows == len(launches) == 16
    km = trace.tables["kernel_metrics"]
    assert km.num_rows == len(launches) * len(metric_columns)
    assert set(km["section"].to_pylist()) == {"raw"}
    assert pc.all(pc.equal(km["metric_name"], km["metric_id"])).as_py()
    # Spot-check the melt: one cell per (launch, column), raw text kept.
    units = dict(zip(header, rows[0]))
    for launch in (launches[0], launches[-1]):
        for column in ("gpu__time_duration.sum", "launch__grid_size", "device__attribute_display_name"):
            row = metric(trace, int(launch[0]), column)
            assert row["raw_value"] == launch[header.index(column)]
            assert row["raw_unit"] == units[column]


def test_roofline_raw_values(traces_dir):
    trace = read(traces_dir / "ncu" / RAW_FILES[1])
    km = trace.tables["kernel_metrics"]
    waves = rows_where(km, metric_id="launch__waves_per_multiprocessor")
    assert len(waves) == 16 and {w["value"] for w in waves} == {1.73}
    k0 = trace.tables["kernels"].to_pylist()[0]
    assert k0["short_name"] == "flash_fwd_kernel"
    assert (k0["grid_x"], k0["grid_y"], k0["grid_z"]) == (1, 64, 8)
    assert (k0["block_x"], k0["block_y"], k0["block_z"]) == (128, 1, 1)
    # Grid Size is in blocks: 1 * 64 * 8 = launch__grid_size; threads = blocks * 128.
    assert metric(trace, 0, "launch__grid_size")["value"] == 1 * 64 * 8
    assert metric(trace, 0, "launch__thread_count")["value"] == 512 * 128
    assert (k0["registers_per_thread"], k0["dynamic_shared_mem_bytes"], k0["pid"]) == (255, 65536, 233787)
    assert metric(trace, 0, "launch__occupancy_limit_registers")["value"] == 2
    assert metric(trace, 0, "gpu__time_duration.sum")["unit"] == "ns"
    name_cell = metric(trace, 0, "device__attribute_display_name")
    assert name_cell["value"] is None and name_cell["raw_value"] == "NVIDIA B200"
    (dev,) = trace.tables["devices"].to_pylist()
    assert dev["name"] == "NVIDIA B200" and (dev["compute_major"], dev["compute_minor"]) == (10, 0)
    assert dev["sm_count"] == 148 and dev["max_warps_per_sm"] == 64 and dev["registers_per_sm"] == 65536
    assert dev["clock_hz"] == 1_965_000 * 1000  # device__attribute_clock_rate is kHz
    assert dev["limits_source"].startswith("trace")


def test_thousands_separators_and_base_units(traces_dir):
    trace = read(traces_dir / "ncu" / "nsightful__copy_blocked.csv")
    sol = "GPU Speed Of Light Throughput"
    dram = metric(trace, 0, "dram__cycles_elapsed.avg.per_second")
    assert (dram["raw_value"], dram["raw_unit"]) == ("4,963,609,951.19", "hz")
    assert dram["value"] == pytest.approx(4_963_609_951.19) and dram["unit"] == "Hz"
    duration = metric(trace, 0, "gpu__time_duration.sum", sol)
    assert duration["value"] == 21_058_944 and duration["unit"] == "ns"
    assert metric(trace, 0, "dram__bytes.sum.per_second")["value"] == pytest.approx(196_456_177_859.63)
    assert metric(trace, 0, "dram__bytes.sum.per_second")["unit"] == "byte/s"
    # "Memory Throughput" is two different metrics depending on the section.
    assert metric(trace, 0, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed")["value"] == 61.84
    assert metric(trace, 0, "sm__warps_active.avg.pct_of_peak_sustained_active")["value"] == 96.26
    assert metric(trace, 0, "launch__occupancy_limit_warps")["value"] == 4
    assert metric(trace, 0, "launch__grid_size")["raw_value"] == "1,024"
    assert metric(trace, 0, "launch__grid_size")["value"] == 1024
    cache = metric(trace, 0, "launch__func_cache_config")
    assert cache["value"] is None and cache["raw_value"] == "CachePreferNone"
    rules = trace.tables["kernel_rule_results"].to_pylist()
    assert len(rules) == 11
    pipe = [r for r in rules if r["rule_name"] == "HighPipeUtilization"]
    assert pipe[0]["speedup_type"] == "local" and pipe[0]["estimated_speedup_pct"] == 98.86
    assert pipe[0]["section"] == "ComputeWorkloadAnalysis" and pipe[0]["rule_type"] == "OPT"
    sol_rule = [r for r in rules if r["rule_name"] == "SOLBottleneck"][0]
    assert sol_rule["speedup_type"] is None and sol_rule["estimated_speedup_pct"] is None
    (k,) = trace.tables["kernels"].to_pylist()
    assert k["short_name"] == "copy_blocked" and (k["grid_x"], k["block_x"]) == (1024, 256)
    (dev,) = trace.tables["devices"].to_pylist()
    assert (dev["compute_major"], dev["compute_minor"], dev["sm_count"]) == (7, 5, 40)


def test_scaled_units_2020_and_2023(traces_dir):
    aws = read(traces_dir / "ncu" / "XPlacer__cfd__aws-v100__nsight_cfd_097K.log")
    header, rows, _ = csv_part(traces_dir / "ncu" / "XPlacer__cfd__aws-v100__nsight_cfd_097K.log")
    row0 = {r[9]: (r[10], r[11]) for r in rows if r[0] == "0"}
    assert row0["Duration"] == ("nsecond", "8992")
    assert metric(aws, 0, "gpu__time_duration.sum")["value"] == 8992
    assert row0["Memory Frequency"][0] == "cycle/second"
    freq = metric(aws, 0, "dram__cycles_elapsed.avg.per_second")
    assert (freq["unit"], freq["value"]) == ("Hz", float(row0["Memory Frequency"][1]))
    assert metric(aws, 0, "launch__registers_per_thread")["value"] == float(row0["Registers Per Thread"][1])
    k0 = aws.tables["kernels"].to_pylist()[0]
    assert k0["registers_per_thread"] == int(row0["Registers Per Thread"][1])
    assert k0["grid_x"] is None and aws.tables["devices"].num_rows == 0  # 2020: totals only, no Device/CC
    assert aws.metadata["kernel_time_first"] == "2020-May-29 12:02:46"

    evalkey = read(traces_dir / "ncu" / "PolyFHE__ckks_HMult__ncu-memory-evalkey-1.csv")
    read_bytes = metric(evalkey, 0, "dram__bytes_read.sum")
    assert (read_bytes["raw_unit"], read_bytes["raw_value"]) == ("Mbyte", "283.14")
    assert read_bytes["value"] == pytest.approx(283.14 * 1e6) and read_bytes["unit"] == "byte"
    assert len(evalkey.metadata["nvtx_columns"]) == 2
    assert all(":" in c for c in evalkey.metadata["nvtx_columns"])
    assert evalkey.tables["kernels"].to_pylist()[0]["short_name"] == "MultKeyAccum_8"


@pytest.mark.parametrize("name", sorted(NEGATIVE_FILES))
def test_real_negative_files(traces_dir, name):
    with pytest.raises(TraceError) as err:
        read(traces_dir / "ncu" / name)
    message = str(err.value)
    assert "\n" not in message
    for words in NEGATIVE_FILES[name]:
        assert words in message


def test_unit_table():
    assert resolve("usecond") == ("ns", 1e3, True)
    assert resolve("msecond") == ("ns", 1e6, True)
    assert resolve("second") == ("ns", 1e9, True)
    assert resolve("cycle/nsecond") == ("Hz", 1e9, True)
    assert resolve("cycle/usecond") == ("Hz", 1e6, True)
    assert resolve("cycle/second") == ("Hz", 1.0, True)
    assert resolve("Ghz") == ("Hz", 1e9, True) and resolve("Mhz") == ("Hz", 1e6, True)
    assert resolve("Kbyte") == ("byte", 1e3, True) and resolve("Gbyte") == ("byte", 1e9, True)
    assert resolve("Kbyte/block") == ("byte/block", 1e3, True)
    assert resolve("Gbyte/second") == ("byte/s", 1e9, True)
    assert resolve("byte/s") == ("byte/s", 1.0, True)
    assert resolve("inst/cycle") == ("inst/cycle", 1.0, True)
    assert resolve("Kinst") == ("inst", 1e3, True)
    assert resolve("%") == ("%", 1.0, True) and resolve("") == (None, 1.0, True)
    assert resolve("furlong") == ("furlong", 1.0, False)


def test_short_names():
    cases = {
        "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>, 0>(Flash_fwd_params)": "flash_fwd_kernel",
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::AddFunctor<float>>"
        "(at::TensorIteratorBase&, const T1&)::{lambda(int)#1}>(int, T3)": "elementwise_kernel",
        "void at::native::(anonymous namespace)::softmax_warp_forward<float, float, 10>(float*, int)":
            "softmax_warp_forward",
        "copy_blocked[v1,cw51cXTL](Array<long long, 1, C, mutable, aligned>, long long)": "copy_blocked",
        "MultKeyAccum_8(Params *, int, int, unsigned long **)": "MultKeyAccum_8",
        "ampere_sgemm_128x64_nn": "ampere_sgemm_128x64_nn",
        "kernel(float*) const": "kernel",
        # a return type with template brackets of its own (vllm, in a B200 Kineto trace)
        "std::enable_if<!(false), void>::type vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>"
        "(c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, float, int, int)": "fused_add_rms_norm_kernel",
        # Nsight Compute's console report shortens names, leaving brackets unbalanced
        "void vectorized_elementwise_kernel<4, unnamed>::silu_kernel(TensorIteratorBase &)::[lambda() (instance 1)]"
        "::operator ()() lambda(float) (instance 1)], std::array<char *, 2>>(int, T2, T3)": "vectorized_elementwise_kernel",
        "void unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, void templates::normal_and_transform"
        "<float>(TensorIteratorBase &, T3, T4)::[lambda(int, float) (instance 1)]>(long, T3, T4)":
            "distribution_elementwise_grid_stride_kernel",
    }
    for name, expected in cases.items():
        assert short_name(name) == expected, name


# -- fixtures -----------------------------------------------------------------------------------

def load_generator():
    spec = importlib.util.spec_from_file_location("gen_ncu", FIXTURES / "gen_ncu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = load_generator()


def test_fixtures_regenerate_byte_identical(tmp_path):
    written = GEN.write_all(tmp_path)
    # Other generators (gen_bottleneck, gen_timeline, ...) write into fixtures/ncu too.
    assert sorted(p.name for p in written) == sorted(GEN.GENERATORS)
    for path in written:
        assert path.read_bytes() == (NCU_FIXTURES / path.name).read_bytes(), path.name


def check_kernel_identity(trace, planted: dict) -> None:
    kernels = {k["kernel_id"]: k for k in trace.tables["kernels"].to_pylist()}
    assert sorted(kernels) == sorted(planted)
    for kid, p in planted.items():
        k = kernels[kid]
        assert (k["name"], k["short_name"]) == (p["name"], p["short_name"])
        assert (k["grid_x"], k["grid_y"], k["grid_z"]) == p["grid"]
        assert (k["block_x"], k["block_y"], k["block_z"]) == p["block"]


def test_fixture_stalls():
    planted = GEN.PLANTED["details_stalls.csv"]
    trace = read(NCU_FIXTURES / "details_stalls.csv")
    assert trace.producer_version == planted["dialect"] and trace.warnings == []
    check_kernel_identity(trace, planted["kernels"])
    (dev,) = trace.tables["devices"].to_pylist()
    assert (dev["compute_major"], dev["compute_minor"]) == (8, 6)
    for kid, p in planted["kernels"].items():
        duration = metric(trace, kid, "gpu__time_duration.sum")
        assert duration["raw_unit"] == p["duration"][1] and duration["unit"] == "ns"
        scale = {"usecond": 1e3, "msecond": 1e6}[p["duration"][1]]
        assert duration["value"] == pytest.approx(float(p["duration"][0]) * scale) == p["duration_ns"]
        assert metric(trace, kid, "smsp__issue_active.avg.per_cycle_active")["value"] == p["issue_active"]
        latency = metric(trace, kid, "smsp__average_warp_latency_per_inst_issued.ratio")["value"]
        assert latency == p["warp_latency_cycles"]
        shares = {}
        for reason, pct in p["stall_pct"].items():
            got = metric(trace, kid, f"smsp__warp_issue_stalled_{reason}_per_warp_active.pct")
            assert got["unit"] == "%" and got["value"] == pytest.approx(pct)
            ratio = metric(trace, kid, f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio")["value"]
            assert ratio / latency == pytest.approx(pct / 100)
            shares[reason] = got["value"]
        assert math.isclose(sum(shares.values()), 100.0)
        top = max(shares, key=shares.get)
        if p["dominant_stall"]:
            assert top == p["dominant_stall"] and shares[top] > 50
        else:
            assert max(shares.values()) <= 10.0  # balanced: nothing stands out


def test_fixture_full_2025():
    planted = GEN.PLANTED["details_full.csv"]
    trace = read(NCU_FIXTURES / "details_full.csv")
    assert trace.producer_version == "details-2025" and trace.warnings == []
    check_kernel_identity(trace, planted["kernels"])
    # 2025 metric rows carry 16 fields under a 20-column header.
    lengths = {len(r) for r in csv.reader(io.StringIO((NCU_FIXTURES / "details_full.csv").read_text()))}
    assert lengths == {16, 20}
    kernels = {k["kernel_id"]: k for k in trace.tables["kernels"].to_pylist()}
    limit_ids = {"sm": "launch__occupancy_limit_blocks", "registers": "launch__occupancy_limit_registers",
                 "shared_mem": "launch__occupancy_limit_shared_mem", "warps": "launch__occupancy_limit_warps"}
    for kid, p in planted["kernels"].items():
        assert kernels[kid]["registers_per_thread"] == p["registers_per_thread"]
        assert kernels[kid]["static_shared_mem_bytes"] == p["static_smem_bytes"]
        assert metric(trace, kid, "gpu__time_duration.sum")["value"] == p["duration_ns"]
        assert metric(trace, kid, "launch__waves_per_multiprocessor")["value"] == p["waves_per_sm"]
        assert metric(trace, kid, "sm__maximum_warps_per_active_cycle_pct")["value"] == p["theoretical_occupancy_pct"]
        assert metric(trace, kid, "sm__warps_active.avg.pct_of_peak_sustained_active")["value"] == \
            p["achieved_occupancy_pct"]
        limits = {k: metric(trace, kid, mid)["value"] for k, mid in limit_ids.items()}
        assert limits == p["block_limits"]
        smallest = min(limits.values())
        binding = [k for k, v in limits.items() if v == smallest]
        if p["occupancy_limiter"]:
            assert binding == [p["occupancy_limiter"]]
        grid_blocks = math.prod(p["grid"])
        assert metric(trace, kid, "launch__grid_size")["value"] == grid_blocks
        assert metric(trace, kid, "launch__sm_count")["value"] == planted["device"]["sm_count"]
        rules = rows_where(trace.tables["kernel_rule_results"], kernel_id=kid)
        got = [(r["section"], r["rule_name"], r["rule_type"], r["speedup_type"], r["estimated_speedup_pct"])
               for r in rules]
        assert got == [tuple(r) for r in p["rules"]]
    raw_threads = metric(trace, 0, "launch__thread_count")["raw_value"]
    assert raw_threads == "524,288" and metric(trace, 0, "launch__thread_count")["value"] == 524288
    (dev,) = trace.tables["devices"].to_pylist()
    assert (dev["compute_major"], dev["compute_minor"], dev["sm_count"]) == (8, 0, 108)


def test_fixture_raw_waves():
    planted = GEN.PLANTED["raw_waves.csv"]
    trace = read(NCU_FIXTURES / "raw_waves.csv")
    assert trace.producer_version == "raw" and trace.warnings == []
    check_kernel_identity(trace, planted["kernels"])
    header, rows, _ = csv_part(NCU_FIXTURES / "raw_waves.csv")
    assert trace.tables["kernel_metrics"].num_rows == (len(rows) - 1) * (len(header) - header.index("CC") - 1)
    (dev,) = trace.tables["devices"].to_pylist()
    for key, value in planted["device"].items():
        assert dev[key] == value, key
    kernels = {k["kernel_id"]: k for k in trace.tables["kernels"].to_pylist()}
    for kid, p in planted["kernels"].items():
        assert kernels[kid]["static_shared_mem_bytes"] == p["static_smem_bytes"]
        assert kernels[kid]["registers_per_thread"] == p["registers_per_thread"]
        assert metric(trace, kid, "launch__waves_per_multiprocessor")["value"] == p["waves_per_sm"]
        duration = metric(trace, kid, "gpu__time_duration.sum")
        assert duration["raw_unit"] == "usecond" and duration["value"] == pytest.approx(p["duration_ns"])
        assert metric(trace, kid, "launch__occupancy_limit_registers")["value"] == p["block_limits"]["registers"]
        sm = metric(trace, kid, "sm__throughput.avg.pct_of_peak_sustained_elapsed")
        if p["sm_pct"] is None:
            assert sm["value"] is None and sm["raw_value"] == "n/a"
        else:
            assert sm["value"] == p["sm_pct"]
    static = metric(trace, 0, "launch__shared_mem_per_block_static")
    assert (static["raw_unit"], static["unit"], static["value"]) == ("Kbyte/block", "byte/block", 2050)


# -- bad input ----------------------------------------------------------------------------------

def one_line_error(path: Path) -> str:
    with pytest.raises(TraceError) as err:
        read(path)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_empty_and_foreign_files(tmp_path):
    (tmp_path / "empty.csv").write_bytes(b"")
    assert one_line_error(tmp_path / "empty.csv") == "empty file"
    (tmp_path / "other.csv").write_text("name,count,mean_ms\nmatmul,12,0.5\nsoftmax,3,0.1\n")
    assert one_line_error(tmp_path / "other.csv") == "CSV without ncu's ID/Kernel Name header"
    (tmp_path / "ids.csv").write_text('"ID","Value"\n"0","1"\n')
    assert one_line_error(tmp_path / "ids.csv") == "CSV without ncu's ID/Kernel Name header"
    (tmp_path / "notes.txt").write_text("just some notes\nnothing here\n")
    assert "not an ncu CSV" in one_line_error(tmp_path / "notes.txt")
    (tmp_path / "blob.csv").write_bytes(b"\x00\x01\x02" * 100)
    assert "binary" in one_line_error(tmp_path / "blob.csv")


def test_header_only(tmp_path):
    header = (NCU_FIXTURES / "details_stalls.csv").read_text().splitlines()[0]
    (tmp_path / "h.csv").write_text(header + "\n")
    assert "no kernel rows" in one_line_error(tmp_path / "h.csv")


def test_truncated_details_mid_row(tmp_path):
    text = (NCU_FIXTURES / "details_full.csv").read_text()
    cut_at = text.index("Block Limit Warps")  # inside a row of launch 0
    (tmp_path / "cut.csv").write_text(text[:cut_at])
    assert "ends mid-row" in one_line_error(tmp_path / "cut.csv")


def test_truncated_raw_mid_row(tmp_path):
    text = (NCU_FIXTURES / "raw_waves.csv").read_text()
    cut_at = text.rindex("NVIDIA H100")  # inside the last launch row
    (tmp_path / "cut.csv").write_text(text[:cut_at])
    assert "ends mid-row" in one_line_error(tmp_path / "cut.csv")


def test_garbage_rows_are_counted_not_fatal(tmp_path):
    lines = (NCU_FIXTURES / "details_stalls.csv").read_text().splitlines()
    garbage = ["this line is not ncu output", '"x","y"', "==PROF== Disconnected from process 41207"]
    (tmp_path / "g.csv").write_text("\n".join(lines[:5] + garbage + lines[5:]) + "\n")
    trace = read(tmp_path / "g.csv")
    assert trace.tables["kernel_metrics"].num_rows == len(lines) - 1
    assert any(w.startswith("2 rows skipped") for w in trace.warnings)
    assert trace.metadata["log_lines_after_header"] == 1


def test_windows_line_endings_and_bom(tmp_path):
    text = (NCU_FIXTURES / "details_full.csv").read_text()
    (tmp_path / "w.csv").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    trace = read(tmp_path / "w.csv")
    assert trace.warnings == [] and trace.tables["kernel_metrics"].num_rows == 90


def test_application_output_with_an_id_line_before_the_header(tmp_path):
    text = (NCU_FIXTURES / "details_stalls.csv").read_text()
    (tmp_path / "app.log").write_text("ID,value\n1,2\n==PROF== Connected to process 41207\n" + text)
    trace = read(tmp_path / "app.log")
    assert trace.metadata["lines_before_header"] == 3 and trace.tables["kernels"].num_rows == 3


def test_concatenated_exports_warn(tmp_path):
    text = (NCU_FIXTURES / "details_stalls.csv").read_text()
    second = text.replace("fused_elementwise_kernel", "another_kernel")  # its ID 1 is another kernel
    (tmp_path / "cat.csv").write_text(text + second)
    trace = read(tmp_path / "cat.csv")
    assert any(w.startswith("1 rows skipped") for w in trace.warnings)  # the second header line
    assert any(w.startswith("1 launch IDs name more than one kernel") for w in trace.warnings)
    assert trace.tables["kernels"].to_pylist()[1]["name"].startswith("fused_elementwise_kernel")


def test_rule_text_with_newlines_quotes_and_long_rows(tmp_path):
    text = (NCU_FIXTURES / "details_full.csv").read_text()
    old = "is limited by the number of required registers."
    text = text.replace(old, 'is limited by ""registers"".\nSecond line.')
    lines = text.splitlines(keepends=True)
    lines.insert(3, lines[2].rstrip("\n") + ',"extra","cells","beyond","the","header","!"\n')
    (tmp_path / "r.csv").write_text("".join(lines))
    trace = read(tmp_path / "r.csv")
    rule = rows_where(trace.tables["kernel_rule_results"], rule_name="TheoreticalOccupancy")[0]
    assert rule["description"].endswith('is limited by "registers".\nSecond line.')
    assert trace.tables["kernel_metrics"].num_rows == 90
    assert any(w.startswith("1 rows skipped") for w in trace.warnings)


def test_raw_nvtx_columns_are_not_metrics(tmp_path):
    rows = list(csv.reader(io.StringIO((NCU_FIXTURES / "raw_waves.csv").read_text())))
    nvtx = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
    at = rows[2].index("Host Name") + 1
    for i, row in enumerate(rows):
        if len(row) > 1:
            row.insert(at, nvtx if i == 2 else ("" if i == 3 else '51234  "<default domain>:step"'))
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(r for r in rows if len(r) > 1)
    (tmp_path / "nvtx.csv").write_text(buf.getvalue())
    trace = read(tmp_path / "nvtx.csv")
    assert trace.metadata["nvtx_columns"] == [nvtx]
    assert trace.tables["kernel_metrics"].num_rows == 3 * 29
    assert nvtx not in set(trace.tables["kernel_metrics"]["metric_name"].to_pylist())
    # an entry without the six payload fields: the domain, then the name
    assert [(r["kernel_id"], r["name"], r["tid"]) for r in trace.tables["launch_ranges"].to_pylist()] == \
        [(0, "step", 51234), (1, "step", 51234), (2, "step", 51234)]


# -- --nvtx columns -------------------------------------------------------------------------------

@pytest.mark.parametrize("cell, parsed", [
    ('69459  "<default domain>:compute:none:none:none:none:none:none" ',
     (69459, [("<default domain>", "compute")])),
    # nested: one quoted entry per level, outermost first; colons inside the range text stay
    ('7  "<default domain>:step:none:none:none:none:none:none" "model:aten::mm, op_id = 3:none:none:none:none:none:none"',
     (7, [("<default domain>", "step"), ("model", "aten::mm, op_id = 3")])),
    ("", (None, [])),
    ("  ", (None, [])),
    ('5  "<default domain>::none:none:none:none:none:none"', (5, [])),  # a range without text
])
def test_nvtx_cells_parse(cell, parsed):
    from traceanalyzer.ingest.ncu_nvtx import parse_cell

    assert parse_cell(cell) == parsed


def test_fixture_nvtx_lists_each_launch_stack():
    trace = read(NCU_FIXTURES / "details_nvtx.csv")
    assert trace.warnings == [] and len(trace.metadata["nvtx_columns"]) == 2
    check_kernel_identity(trace, GEN.PLANTED["details_stalls.csv"]["kernels"])
    stacks: dict[int, list] = {}
    for r in trace.tables["launch_ranges"].to_pylist():
        assert (r["kind"], r["domain"], r["tid"]) == ("push_pop", "<default domain>", int(GEN.NVTX_TID))
        stacks.setdefault(r["kernel_id"], []).append((r["depth"], r["name"]))
    assert {k: [n for _, n in sorted(v)] for k, v in stacks.items()} == GEN.PLANTED["details_nvtx.csv"]["ranges"]
    # the metrics are those of the same launches without --nvtx
    plain = read(NCU_FIXTURES / "details_stalls.csv")
    assert trace.tables["kernel_metrics"].equals(plain.tables["kernel_metrics"])


@pytest.mark.parametrize("name", ["PolyFHE__ckks_HMult__ncu-memory-evalkey-1.csv",
                                  "PolyFHE__ckks_HMult__ncu-ntt12-A4090-1.csv"])
def test_real_nvtx_columns(traces_dir, name):
    """PolyFHE's exports: every launch inside the push/pop range `compute`, on the process's
    main thread (its id is the process id); the start/end column empty."""
    trace = read(traces_dir / "ncu" / name)
    ranges = trace.tables["launch_ranges"].to_pylist()
    pids = {r["kernel_id"]: r for r in trace.tables["kernels"].to_pylist()}
    assert sorted(r["kernel_id"] for r in ranges) == sorted(pids)
    assert {(r["kind"], r["depth"], r["name"], r["domain"]) for r in ranges} == \
        {("push_pop", 0, "compute", "<default domain>")}
    assert all(r["tid"] == pids[r["kernel_id"]]["pid"] for r in ranges)


# -- store round trip -----------------------------------------------------------------------------

def test_store_ingest(store, traces_dir):
    result = store.ingest(NCU_FIXTURES / "details_full.csv")
    assert result.counts["kernels"] == 3 and result.counts["kernel_metrics"] == 90
    assert result.counts["kernel_rule_results"] == 2
    run = store.sql("SELECT format, producer, producer_version, clock, start_ns FROM runs").fetchall()
    assert run == [("ncu-csv", "ncu", "details-2025", "none", None)]
    limit = store.sql("""
        SELECT k.short_name, m.value FROM kernel_metrics m JOIN kernels k USING (run_id, kernel_id)
        WHERE m.metric_id = 'launch__occupancy_limit_registers' ORDER BY k.kernel_id""").fetchall()
    assert limit == [("regheavy_gemm_kernel", 2.0), ("tail_effect_kernel", 8.0), ("healthy_stream_kernel", 10.0)]
    store.ingest(traces_dir / "ncu" / RAW_FILES[1])
    assert store.sql("SELECT name, sm_count FROM devices WHERE name IS NOT NULL").fetchall() == [("NVIDIA B200", 148)]
    text = store.ingest(traces_dir / "ncu" / "PolyFHE__artifact_evaluation__ncu__opt.csv")
    assert text.counts["kernels"] == 12  # the text report inside the .csv name, read by ncu_text
