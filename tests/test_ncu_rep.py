"""The Nsight Compute report reader (.ncu-rep): every real report, the paired CSV and text
report of the same programs, NVIDIA's rule results, the rules, the synthetic fixture's edge
cases and damaged reports."""

from __future__ import annotations

import csv
import importlib.util
import io
import re
import struct

import pytest

from traceanalyzer.batch.check import check_file
from traceanalyzer.ingest import TraceError, read_file
from traceanalyzer.ingest.detect import detect
from traceanalyzer.ingest.ncu_rep import rule_text, unit_of
from traceanalyzer.rules.engine import Settings

from .conftest import FIXTURES, shared_traces

SYNTHETIC = FIXTURES / "ncu-rep" / "synthetic.ncu-rep"
# Nsight Compute versions of the real reports (the "Nsight Compute Target" entry of each).
VERSIONS_SEEN = {"2023.1.0.0", "2024.1.1.0", "2024.2.1.0", "2025.1.0.0"}
NCU_RULES = ("B001", "B002", "B003", "B004", "I001", "I002", "I003", "I004", "I005", "T005")


def _gen():
    spec = importlib.util.spec_from_file_location("gen_ncu_rep", FIXTURES / "gen_ncu_rep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def real_reports():
    traces = shared_traces()
    rows = [ln.split("\t") for ln in (traces / "MANIFEST.tsv").read_text().splitlines()[1:]]
    return [traces / "ncu-rep" / r[1] for r in rows if r[0] == "ncu-rep"]


def _rows(trace, table, **where):
    return [r for r in trace.tables[table].to_pylist() if all(r[k] == v for k, v in where.items())]


# -- real reports ---------------------------------------------------------------------------

def test_every_real_report_reads_completely():
    reports = real_reports()
    assert len(reports) >= 12
    versions = set()
    for path in reports:
        assert detect(path) == "ncu-rep", path.name
        trace = read_file(path)
        assert trace.format == "ncu-rep" and trace.warnings == [], (path.name, trace.warnings)
        versions.add(trace.producer_version)
        kernels = trace.tables["kernels"].to_pylist()
        assert kernels and [k["kernel_id"] for k in kernels] == list(range(len(kernels)))
        for k in kernels:
            assert k["name"] and k["mangled_name"].startswith("_Z") and k["short_name"], path.name
            assert None not in (k["grid_x"], k["block_x"], k["registers_per_thread"], k["stream_id"],
                                k["static_shared_mem_bytes"], k["device_id"]), (path.name, k)
        metrics = trace.tables["kernel_metrics"]
        durations = [r for r in metrics.to_pylist() if r["metric_id"] == "gpu__time_duration.sum"]
        assert len(durations) == len(kernels) and all(r["value"] > 0 and r["unit"] == "ns" for r in durations)
        [device] = trace.tables["devices"].to_pylist()
        assert device["name"].startswith(("NVIDIA", "Tesla")) and device["compute_major"] >= 7 and device["sm_count"]
    assert versions == VERSIONS_SEEN


def test_launches_agree_with_the_csv_of_the_same_program():
    traces = shared_traces()
    rep = read_file(traces / "ncu-rep" / "CudaProgramming__profiling__profiles__readWriteOffset_ca.ncu-rep")
    text = (traces / "ncu" / "CudaProgramming__profiling__results__ncu_readWriteOffset_ca.csv").read_text()
    rows = list(csv.DictReader(io.StringIO(text[text.index('"ID"'):])))
    by_name = {r["Kernel Name"]: r for r in rows}
    shared = [k for k in rep.tables["kernels"].to_pylist() if k["name"] in by_name]
    assert [k["short_name"] for k in shared] == ["readOffset"]  # the CSV profiled readOffset only
    for k in shared:
        r = by_name[k["name"]]
        assert f"({k['grid_x']}, {k['grid_y']}, {k['grid_z']})" == r["Grid Size"] == "(32768, 1, 1)"
        assert f"({k['block_x']}, {k['block_y']}, {k['block_z']})" == r["Block Size"] == "(512, 1, 1)"
        assert (str(k["context_id"]), str(k["stream_id"]), str(k["device_id"])) == (r["Context"], r["Stream"], r["Device"])
    [device] = rep.tables["devices"].to_pylist()
    assert f"{device['compute_major']}.{device['compute_minor']}" == rows[0]["CC"]
    # The same kernel on the same GPU: durations of separate runs within 10 % of each other.
    csv_ns = [float(r["Metric Value"]) for r in rows if r["Metric Name"] == "gpu__time_duration.sum"]
    rep_ns = _rows(rep, "kernel_metrics", kernel_id=shared[0]["kernel_id"], metric_id="gpu__time_duration.sum")[0]
    assert min(csv_ns) * 0.9 < rep_ns["value"] < max(csv_ns) * 1.1


def test_launch_and_rule_results_agree_with_the_text_report_of_the_same_program():
    traces = shared_traces()
    rep = read_file(traces / "ncu-rep" / "cs599k__silu__triton__silu-pytorch.ncu-rep")
    text = (traces / "ncu-text" / "cs599k__silu__triton__silu-pytorch-ncu-report.txt").read_text()
    first = text[:text.index("Section: GPU and Memory Workload Distribution")]  # the text's first launch
    launch = re.search(r"\((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context (\d+), Stream (\d+), Device (\d+), "
                       r"CC (\d+)\.(\d+)", first).groups()
    [k] = rep.tables["kernels"].to_pylist()
    [d] = rep.tables["devices"].to_pylist()
    assert tuple(map(int, launch)) == (k["grid_x"], k["grid_y"], k["grid_z"], k["block_x"], k["block_y"], k["block_z"],
                                       k["context_id"], k["stream_id"], k["device_id"], d["compute_major"],
                                       d["compute_minor"])
    assert f"unnamed>::{k['short_name']}<float, 4, " in first  # the text prints names shortened
    assert int(re.search(r"Registers Per Thread\s+register/thread\s+(\d+)", first).group(1)) == k["registers_per_thread"]
    occupancy = _rows(rep, "kernel_metrics", section="Occupancy", metric_name="Theoretical Occupancy")[0]
    assert f"{occupancy['value']:.2f}" == re.search(r"Theoretical Occupancy\s+%\s+([\d.]+)", first).group(1)
    # NVIDIA's rule results: the same types, speed-ups and texts the console printed.
    rules = {r["rule_name"]: r for r in rep.tables["kernel_rule_results"].to_pylist()}
    tail = rules["LaunchConfiguration"]
    assert (tail["rule_type"], tail["speedup_type"], tail["estimated_speedup_pct"]) == ("OPT", "global", 50.0)
    assert "OPT   Est. Speedup: 50%" in first
    achieved = rules["AchievedOccupancy"]
    assert (achieved["speedup_type"], round(achieved["estimated_speedup_pct"], 2)) == ("local", 19.35)
    assert "OPT   Est. Local Speedup: 19.35%" in first
    assert rules["SOLBottleneck"]["description"].startswith("Compute is more heavily utilized than Memory: Look at "
                                                            "the Compute Workload Analysis section")


def test_rule_results_are_stored_and_every_ncu_rule_runs(store):
    ran = set()
    for path in real_reports():
        res = check_file(store, path, Settings())
        assert res.state != "failed", (path.name, res.error)
        status = dict(store.sql("SELECT rule_id, status FROM rule_runs WHERE run_id = ?", [res.run_id]).fetchall())
        assert not [r for r, s in status.items() if s == "error"], (path.name, status)
        ran |= {r for r in NCU_RULES if status.get(r) == "ran"}
    assert ran == set(NCU_RULES)
    kinds = store.sql("""SELECT rule_type, count(*), count(estimated_speedup_pct), count(DISTINCT run_id)
                         FROM kernel_rule_results GROUP BY rule_type ORDER BY rule_type""").fetchall()
    assert {k for k, *_ in kinds} == {"INF", "OPT", "WRN"}
    runs_with_rules = store.sql("SELECT count(DISTINCT run_id) FROM kernel_rule_results").fetchone()[0]
    assert runs_with_rules >= 7  # every 2024-2025 report and the 2023 one that ran rules
    leftover = store.sql("SELECT count(*) FROM kernel_rule_results WHERE description LIKE '%@section:%' "
                         "OR description LIKE '%@url:%' OR rule_name = '' OR section IS NULL").fetchone()[0]
    assert leftover == 0


def test_a_report_found_in_a_folder_is_read(tmp_path, store):
    from traceanalyzer.ingest import find_traces

    (tmp_path / "sub").mkdir()
    copy = tmp_path / "sub" / "r.ncu-rep"
    copy.write_bytes(SYNTHETIC.read_bytes())
    assert list(find_traces([tmp_path])) == [copy]
    assert check_file(store, copy, Settings()).format == "ncu-rep"


# -- the synthetic report ---------------------------------------------------------------------

def test_fixture_is_what_the_generator_writes(tmp_path):
    gen = _gen()
    assert gen.main(tmp_path / "s.ncu-rep").read_bytes() == SYNTHETIC.read_bytes()


def test_fixture_edge_cases_several_blocks_shared_strings_unknown_fields():
    planted = _gen().PLANTED
    trace = read_file(SYNTHETIC)
    assert trace.producer_version == planted["ncu_version"] and trace.host == planted["host"]
    kernels = trace.tables["kernels"].to_pylist()
    assert [(k["name"], (k["grid_x"], k["grid_y"], k["grid_z"]), (k["block_x"], k["block_y"], k["block_z"]),
             k["context_id"], k["stream_id"], k["registers_per_thread"], k["pid"]) for k in kernels] == \
        [(p["name"], p["grid"], p["block"], p["context"], p["stream"], p["registers"], planted["pid"])
         for p in planted["launches"]]
    # The second results block's launches name strings of the first block's table, and the one it adds.
    for k, p in zip(kernels, planted["launches"]):
        [d] = _rows(trace, "kernel_metrics", kernel_id=k["kernel_id"], metric_id="gpu__time_duration.sum")
        assert d["value"] == p["duration_ns"]
        [a] = _rows(trace, "kernel_metrics", kernel_id=k["kernel_id"], section="Occupancy")
        assert (a["metric_name"], a["value"], a["unit"]) == ("Achieved Occupancy", p["achieved_pct"], "%")
    launch, metric_id, value = planted["added_metric"]
    assert [r["value"] for r in _rows(trace, "kernel_metrics", metric_id=metric_id)] == [value]
    assert _rows(trace, "kernel_metrics", metric_id=metric_id)[0]["kernel_id"] == launch
    launch, metric_id, text = planted["instanced"]
    [inst] = _rows(trace, "kernel_metrics", metric_id=metric_id)
    assert (inst["kernel_id"], inst["raw_value"], inst["value"]) == (launch, text, None)
    # Unknown fields: the known ones are read, one warning names the others.
    assert len(trace.warnings) == 1
    assert all(f in trace.warnings[0] for f in planted["unknown_fields"]), trace.warnings
    [device] = trace.tables["devices"].to_pylist()
    assert (device["name"], device["sm_count"], device["clock_hz"]) == (
        planted["device"]["device__attribute_display_name"], 132, 1_980_000_000)
    rules = trace.tables["kernel_rule_results"].to_pylist()
    assert [(r["kernel_id"], r["rule_name"], r["rule_type"], r["speedup_type"], r["estimated_speedup_pct"],
             r["section"]) for r in rules] == [p[:6] for p in planted["rules"]]
    assert all(r["description"].startswith(p[6]) for r, p in zip(rules, planted["rules"]))


def test_fixture_runs_through_check(store):
    res = check_file(store, SYNTHETIC, Settings())
    assert res.state != "failed" and res.format == "ncu-rep"
    assert res.counts["kernels"] == 3 and res.counts["kernel_rule_results"] == 3
    fmt, version = store.sql("SELECT format, producer_version FROM runs WHERE run_id = ?", [res.run_id]).fetchone()
    assert (fmt, version) == ("ncu-rep", "2025.2.0.0")
    b002 = {name for (name,) in store.sql("SELECT item_name FROM findings WHERE run_id = ? AND rule_id = 'B002'",
                                           [res.run_id]).fetchall()}
    assert "void scale<float>(float *, int)" in b002  # achieved 48.5 % against a theoretical 100 %


# -- damaged reports ------------------------------------------------------------------------------

def _damaged(tmp_path, data: bytes):
    path = tmp_path / "bad.ncu-rep"
    path.write_bytes(data)
    with pytest.raises(TraceError) as e:
        read_file(path)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300
    return msg


def test_damaged_reports_are_one_line_errors(tmp_path, store):
    data = SYNTHETIC.read_bytes()
    assert "truncated" in _damaged(tmp_path, data[:-10])
    assert "no profiled kernel launch" in _damaged(tmp_path, data[:8 + struct.unpack_from("<I", data, 4)[0]])
    bad = bytearray(data)
    struct.pack_into("<I", bad, 8 + struct.unpack_from("<I", data, 4)[0], 1 << 30)
    assert "block header at byte" in _damaged(tmp_path, bytes(bad))
    junk = data[:8 + struct.unpack_from("<I", data, 4)[0]] + struct.pack("<I", 3) + b"\xff\xff\xff"
    assert "no valid protobuf message" in _damaged(tmp_path, junk)
    # Through check: a failed file whose error names it, and the store keeps nothing of it.
    path = tmp_path / "cut.ncu-rep"
    path.write_bytes(data[: len(data) // 2])
    res = check_file(store, path, Settings())
    assert res.state == "failed" and "ncu report truncated" in res.error and "\n" not in res.error
    assert str(path) in res.input_error.path or path.name in str(res.input_error.path)
    assert store.sql("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_newer_file_version_is_read_with_one_warning(tmp_path):
    data = bytearray(SYNTHETIC.read_bytes())
    assert data[8:10] == b"\x08\x07"  # FileHeader.Version = 7
    data[9] = 8
    path = tmp_path / "v8.ncu-rep"
    path.write_bytes(bytes(data))
    trace = read_file(path)
    assert trace.tables["kernels"].num_rows == 3
    assert sum("file version 8" in w for w in trace.warnings) == 1


# -- pieces ----------------------------------------------------------------------------------------

def test_rule_text_prints_links_as_the_console_does():
    raw = (b"See @section:LaunchStats:Launch Statistics@ and the "
           b"@url:Hardware Model:https://docs.nvidia.com/x#hw@ description.")
    assert rule_text(raw) == ("See Launch Statistics and the Hardware Model (https://docs.nvidia.com/x#hw) "
                              "description.")


@pytest.mark.parametrize("metric_id, unit", [
    ("gpu__time_duration.sum", "ns"), ("dram__bytes_read.sum", "byte"), ("dram__bytes_read.sum.per_second", "byte/s"),
    ("gpc__cycles_elapsed.avg.per_second", "Hz"), ("sm__cycles_active.avg", "cycle"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "%"), ("sm__maximum_warps_per_active_cycle_pct", "%"),
    ("launch__registers_per_thread", "register/thread"), ("launch__grid_size", None),
    ("sm__warps_active.avg.per_cycle_active", None), ("device__attribute_clock_rate", None),
    ("l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio", None),
])
def test_units_told_from_metric_ids(metric_id, unit):
    assert unit_of(metric_id) == unit
