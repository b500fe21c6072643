"""`traceanalyzer summary`: kernel statistics as nsys's cuda_gpu_kern_sum gives them, by full or
base name, CUDA-graph executions apart, memsets, the json and csv formats, kernel names that
stay apart at any width, and device memory (snapshots, memory timelines, allocator events,
each re-derived here from the file). (The numbers against an independent query on every real nsys
export: tests/test_budget.py, which stores that corpus once.)"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import pickle
import re
from pathlib import Path

import pyarrow as pa
import pytest
from rich.console import Console
from typer.testing import CliRunner

from traceanalyzer import fmt
from traceanalyzer.cli import app
from traceanalyzer.report.runs_text import print_summary, summary_of
from traceanalyzer.fmt import distinct_labels
from traceanalyzer.ingest.base import ParsedTrace
from traceanalyzer.report.html_charts import si
from traceanalyzer.store import Store
from traceanalyzer.summary import graph_stats, kernel_stats

from .conftest import FIXTURES, shared_traces

US = 1_000
GEMM_256 = ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x256_32x3_nn_align4>"
            "(cutlass_80_tensorop_s1688gemm_128x256_32x3_nn_align4::Params)")
GEMM_128 = GEMM_256.replace("128x256", "128x128")
ADD_FLOAT = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)"
ADD_HALF = ADD_FLOAT.replace("<float>", "<c10::Half>")
# (name, short name, graph id, duration in us), launched one after the other on one stream
LAUNCHES = [(GEMM_256, "Kernel2", None, 10), (GEMM_256, "Kernel2", None, 60), (GEMM_256, "Kernel2", None, 20),
            (GEMM_128, "Kernel2", None, 30),
            (ADD_FLOAT, "vectorized_elementwise_kernel", None, 5), (ADD_FLOAT, "vectorized_elementwise_kernel", None, 5),
            (ADD_HALF, "vectorized_elementwise_kernel", None, 5),
            ("[CUDA graph 7]", "[CUDA graph]", 7, 100), ("[CUDA graph 7]", "[CUDA graph]", 7, 100)]


def _planted() -> ParsedTrace:
    starts = [sum(d for *_, d in LAUNCHES[:i]) * US + i * US for i in range(len(LAUNCHES))]
    n = len(LAUNCHES)
    kernels = pa.table({
        "kernel_id": list(range(n)), "device_id": [0] * n, "stream_id": [7] * n, "pid": [1] * n,
        "name": [k[0] for k in LAUNCHES], "short_name": [k[1] for k in LAUNCHES],
        "graph_id": pa.array([k[2] for k in LAUNCHES], pa.int64()),
        "start_ns": starts, "end_ns": [s + k[3] * US for s, k in zip(starts, LAUNCHES)]})
    end = starts[-1] + 200 * US
    memsets = pa.table({"memset_id": [0, 1], "device_id": [0, 0], "stream_id": [7, 7],
                        "start_ns": [end, end + 10 * US], "end_ns": [end + 2 * US, end + 12 * US],
                        "bytes": [4096, 4096], "mem_kind": ["device", "device"]})
    return ParsedTrace(format="nsys-sqlite", tables={"kernels": kernels, "memsets": memsets})


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A store holding the planted run: (store path, run id)."""
    db = tmp_path_factory.mktemp("summary") / "s.duckdb"
    with Store(db) as st:
        run_id = st.write_run(_planted(), Path("/planted/summary.sqlite"), "5" * 64, 1).run_id
    return db, run_id


def _rows(df) -> dict[str, dict]:
    return {r["name"]: r for r in df.to_dict("records")}


def test_kernels_by_full_name_have_nsys_statistics_and_graphs_stay_out_of_the_shares(planted):
    db, run_id = planted
    with Store(db, read_only=True) as st:
        k, g = kernel_stats(st, run_id), graph_stats(st, run_id)
    # nsys's order: total time down, then count, then name
    assert list(k["name"]) == [GEMM_256, GEMM_128, ADD_FLOAT, ADD_HALF]
    gemm = _rows(k)[GEMM_256]
    assert {c: gemm[c] for c in ("count", "total_ns", "min_ns", "max_ns")} == {
        "count": 3, "total_ns": 90 * US, "min_ns": 10 * US, "max_ns": 60 * US}
    assert gemm["avg_ns"] == 30 * US and gemm["median_ns"] == 20 * US
    # sample standard deviation of 10, 20, 60 us: sqrt((20² + 10² + 30²) / 2)
    assert gemm["stddev_ns"] == pytest.approx(math.sqrt(700) * US)
    assert _rows(k)[GEMM_128]["stddev_ns"] == 0  # one launch: 0, as nsys prints it
    # shares of the kernels' 135 us, the graphs' 200 us nowhere in them
    assert gemm["share"] == pytest.approx(90 / 135) and k["share"].sum() == pytest.approx(1)
    assert g.to_dict("records") == [{"name": "[CUDA graph 7]", "count": 2, "total_ns": 200 * US, "avg_ns": 100 * US,
                                     "median_ns": 100 * US, "min_ns": 100 * US, "max_ns": 100 * US,
                                     "stddev_ns": 0, "share": 1.0}]


def test_by_base_pools_template_variants(planted):
    db, run_id = planted
    with Store(db, read_only=True) as st:
        rows = _rows(kernel_stats(st, run_id, by="base"))
    assert set(rows) == {"Kernel2", "vectorized_elementwise_kernel"}
    assert rows["Kernel2"]["count"] == 4 and rows["Kernel2"]["total_ns"] == 120 * US
    assert rows["Kernel2"]["median_ns"] == 25 * US  # of 10, 20, 30, 60
    assert rows["vectorized_elementwise_kernel"]["count"] == 3
    assert rows["Kernel2"]["share"] == pytest.approx(120 / 135)


def _cli(*args) -> str:
    r = CliRunner().invoke(app, ["summary", *map(str, args)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return r.stdout


def test_json_rows_memsets_and_graphs(planted):
    db, run_id = planted
    [run] = json.loads(_cli("--store", db, "--format", "json"))
    assert run["run_id"] == run_id and run["by"] == "name"
    assert [k["name"] for k in run["kernels"]] == [GEMM_256, GEMM_128, ADD_FLOAT, ADD_HALF]
    assert set(run["kernels"][0]) == {"name", "count", "total_ns", "avg_ns", "median_ns", "min_ns", "max_ns",
                                      "stddev_ns", "share"}
    assert run["kernel_totals"] == {"names": 4, "count": 7, "total_ns": 135 * US}
    assert [(g["name"], g["count"]) for g in run["graphs"]] == [("[CUDA graph 7]", 2)]
    assert run["memsets"] == [{"memory_kind": "device", "count": 2, "bytes": 8192, "total_ns": 4 * US,
                               "bandwidth_gb_per_s": 8192 / (4 * US)}]
    [device] = run["busy"]
    assert device["memsets_ns"] == 4 * US and device["kernels_ns"] == 335 * US  # graphs keep the GPU busy
    assert run["budget"][0]["device_id"] == 0
    top = json.loads(_cli("--store", db, "--format", "json", "--top", "1", "--by", "base"))[0]
    assert [k["name"] for k in top["kernels"]] == ["Kernel2"] and top["kernel_totals"]["names"] == 2


def test_csv_has_a_row_per_kernel_and_graph_with_its_run(planted):
    db, run_id = planted
    rows = list(csv.DictReader(io.StringIO(_cli("--store", db, "--format", "csv"))))
    assert [(r["run_id"], r["kind"], r["name"]) for r in rows] == [
        (run_id, "kernel", GEMM_256), (run_id, "kernel", GEMM_128), (run_id, "kernel", ADD_FLOAT),
        (run_id, "kernel", ADD_HALF), (run_id, "cuda_graph", "[CUDA graph 7]")]
    assert rows[0]["total_ns"] == str(90 * US) and rows[-1]["share"] == ""


def test_text_says_what_each_number_counts(planted):
    db, run_id = planted
    out = _cli("--store", db, run_id)
    assert "span: " in out and "host: -" in out  # a label, then its value: "host modal" read as one label
    assert "Top kernels by total time (4 of 4 distinct names; 7 launches, 135 us)" in out
    base = _cli("--store", db, run_id, "--by", "base")
    assert "(2 of 2 distinct base names; 7 launches, 135 us)" in base
    assert "2.05 GB/s" in out  # the memsets: 8,192 B in 4 us


def test_totals_over_several_gpus_say_so(tmp_path):
    """Kernel and memset totals beside the run's span: over two GPUs they can exceed it."""
    trace = _planted()
    for name in ("kernels", "memsets"):
        t = trace.tables[name]
        trace.tables[name] = t.set_column(t.schema.get_field_index("device_id"), "device_id",
                                          pa.array([i % 2 for i in range(t.num_rows)], pa.int32()))
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.write_run(trace, Path("/planted/two.sqlite"), "6" * 64, 1).run_id
    out = _cli("--store", tmp_path / "s.duckdb", run_id)
    assert "(4 of 4 distinct names; 7 launches, 135 us over 2 GPUs)" in out and "Memsets over 2 GPUs" in out


def test_numbers_never_read_in_scientific_notation():
    # a DtoD copy at 1,510 GB/s printed "1.51e+03 GB/s", a 18 B copy "0.00229 GB/s"
    assert [fmt.bandwidth(x) for x in (1510.4, 27.7, 0.00229, 0.933, None)] == [
        "1.51 TB/s", "27.7 GB/s", "2.29 MB/s", "933 MB/s", "-"]
    assert [fmt.nbytes(x) for x in (1.51e12, 2.5e15, 999.96e9, 18)] == ["1.51 TB", "2.5 PB", "1 TB", "18 B"]
    assert [fmt.ns(x) for x in (1.5e13, 999.96e3, 1234)] == ["15,000 s", "1 ms", "1.23 us"]
    assert [fmt.num(x) for x in (1510.4, 0.0000123, 3.14159, 12)] == ["1,510", "0.0000123", "3.14", "12"]
    assert [si(x, "FLOP/s") for x in (999.96e9, 3e18, 1e-8)] == ["1 TFLOP/s", "3,000 PFLOP/s", "0.00000001 FLOP/s"]


def test_the_rules_sql_formats_numbers_as_fmt_does():
    """Rule messages are written in SQL (analyses.MACROS fmt_ns, fmt_bytes): the same text as fmt's."""
    import duckdb

    from traceanalyzer import analyses

    con = duckdb.connect()
    for macro in analyses.MACROS.values():
        con.execute(macro.create())
    for x in (None, 0, 3, 999.4, 999.96e3, 1234, 2.5e5, -4200.0, 123456789, 1.51e12, 1.5e13, 10**18):
        assert con.execute("SELECT fmt_ns($x), fmt_bytes($x)", {"x": x}).fetchall()[0] == (fmt.ns(x), fmt.nbytes(x)), x


def test_bad_options_are_usage_errors(planted):
    db, _ = planted
    for args in (["--format", "xml"], ["--by", "mangled"]):
        r = CliRunner().invoke(app, ["summary", "--store", str(db), *args])
        assert r.exit_code == 2 and "must be one of" in r.stderr


@pytest.mark.parametrize("width", [80, 200])
def test_two_gemms_with_a_long_common_prefix_print_apart(planted, width):
    db, run_id = planted
    with Store(db, read_only=True) as st:
        s = summary_of(st, run_id, "name", 15)
    buf = io.StringIO()
    print_summary(Console(file=buf, width=width, highlight=False), s)
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    lines_256 = [ln for ln in text.splitlines() if "128x256" in ln]
    lines_128 = [ln for ln in text.splitlines() if "128x128" in ln]
    assert len(lines_256) == 1 and len(lines_128) == 1, text
    assert "Memsets" in text and "[CUDA graph 7]" in text


NAMES = [GEMM_256, GEMM_128, ADD_FLOAT, ADD_HALF,
         "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
         "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_split_k_kernel__5x_cublas",
         "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
         "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
         "short", "short_but_longer"]


def test_labels_fit_and_stay_apart_at_every_width():
    for width in range(8, 160):
        labels = distinct_labels(NAMES, width)
        assert len(set(labels)) == len(NAMES), (width, labels)
        # a label is the name, or fits; names that fit are kept whole
        assert all(lab == n or len(lab) <= width for lab, n in zip(labels, NAMES)), width
        assert all(lab == n for lab, n in zip(labels, NAMES) if len(n) <= width)


def test_a_label_keeps_the_word_where_two_names_differ():
    a, b = distinct_labels([GEMM_256, GEMM_128], 40)
    assert "128x256" in a and "128x128" in b and a.startswith("void cutlass::") and "…" in a
    split, plain = distinct_labels(NAMES[5:3:-1], 50)
    assert "split" in split and "split" not in plain


# -- memory ----------------------------------------------------------------------------------

MEMORY_FIXTURES = {"snapshot": FIXTURES / "torch-memory" / "snapshot_oom.pickle",
                   "timeline": FIXTURES / "torch-memory" / "timeline_train.raw.json.gz",
                   "kineto": FIXTURES / "kineto" / "planted.json"}
CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail",
              "unknown")


class _NoClass(pickle.Unpickler):
    def find_class(self, module, name):
        raise AssertionError(f"{module}.{name}")


def snapshot_numbers(path: Path) -> dict:
    """Reserved, allocated (block bytes) and the largest free block at the snapshot, and the peak
    of its history replayed in requested bytes, anchored at the snapshot's live blocks."""
    raw = _NoClass(io.BytesIO(path.read_bytes())).load()
    blocks = [b for s in raw["segments"] for b in s["blocks"]]
    level, levels = 0, []
    for e in raw["device_traces"][0]:
        level += {"alloc": e["size"], "free_requested": -e["size"]}.get(e["action"], 0)
        levels.append(level)
    before = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated") - level
    return {"reserved_bytes": sum(s["total_size"] for s in raw["segments"]),
            "allocated_bytes": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
            "largest_free_block_bytes": max(b["size"] for b in blocks if b["state"] == "inactive"),
            "peak_allocated_bytes": before + max(levels)}


def timeline_peak(path: Path) -> tuple[int, dict[str, int]]:
    """The peak of a raw memory timeline, the level after each time step (preexisting rows at
    the first time), and the bytes of each category then."""
    rows = json.loads(gzip.decompress(path.read_bytes()))
    first = min(t for t, *_ in rows if t >= 0)
    by_time: dict[int, list] = {}
    for t, _, n, c in rows:
        by_time.setdefault(first if t < 0 else t, []).append((n, c))
    level, held, best = 0, dict.fromkeys(CATEGORIES, 0), (None, None)
    for t in sorted(by_time):
        for n, c in by_time[t]:
            level += n
            held[CATEGORIES[c]] += n
        if best[0] is None or level > best[0]:
            best = (level, dict(held))
    return best[0], {c: n for c, n in best[1].items() if n}


@pytest.fixture(scope="module")
def memory_runs(tmp_path_factory):
    """The memory fixtures in one store, checked by `summary --format json`: name -> its run."""
    db = tmp_path_factory.mktemp("memory") / "s.duckdb"
    with Store(db) as st:
        ids = {name: st.ingest(path).run_id for name, path in MEMORY_FIXTURES.items()}
    runs = {r["run_id"]: r for r in json.loads(_cli("--store", db, "--format", "json"))}
    return db, {name: runs[rid] for name, rid in ids.items()}


def test_memory_of_a_snapshot_at_the_snapshot_and_over_its_history(memory_runs):
    _, runs = memory_runs
    [dev] = runs["snapshot"]["memory"]
    want = snapshot_numbers(MEMORY_FIXTURES["snapshot"])
    assert {k: dev[k] for k in want} == want
    assert (dev["device_id"], dev["source"], dev["categories"]) == (0, "memory snapshot", None)
    # the planted facts: 2050 MiB reserved, 62 MiB the largest free block, the peak 1 GiB of
    # parameters from before the history plus what it allocated and kept
    assert (want["reserved_bytes"], want["largest_free_block_bytes"]) == (2050 << 20, 62 << 20)


def test_memory_of_a_timeline_is_its_peak_by_category(memory_runs):
    _, runs = memory_runs
    [dev] = runs["timeline"]["memory"]
    peak, held = timeline_peak(MEMORY_FIXTURES["timeline"])
    assert peak == 1426 << 20 and held["activation"] == 800 << 20  # the planted peak
    assert dev["peak_allocated_bytes"] == peak and dev["source"] == "memory timeline"
    assert [(c["category"], c["bytes"]) for c in dev["categories"]] == sorted(held.items(), key=lambda kv: -kv[1])
    assert sum(c["share"] for c in dev["categories"]) == pytest.approx(1)
    assert dev["reserved_bytes"] is dev["allocated_bytes"] is dev["largest_free_block_bytes"] is None


def test_memory_of_kineto_allocator_events_is_m001s_peak(memory_runs):
    _, runs = memory_runs
    events = [e["args"] for e in json.loads(MEMORY_FIXTURES["kineto"].read_text())["traceEvents"]
              if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1]
    [dev] = runs["kineto"]["memory"]
    assert dev["peak_allocated_bytes"] == max(a["Total Allocated"] for a in events)
    assert dev["peak_reserved_bytes"] == max(a["Total Reserved"] for a in events)
    assert dev["source"] == "allocator totals" and dev["reserved_bytes"] is None and dev["categories"] is None


def test_memory_tables_in_text_and_none_without_memory(memory_runs, planted):
    db, runs = memory_runs
    text = _cli("--store", db, runs["timeline"]["run_id"], runs["snapshot"]["run_id"])
    assert "Memory (memory timeline)" in text and "Memory (memory snapshot)" in text
    assert "at its peak (1.5 GB), by category" in text
    assert re.search(r"activation\s*│\s*839 MB\s*│\s*56\.1%", text), text
    assert re.search(r"│ 0\s*│\s*2\.15 GB\s*│\s*1\.63 GB\s*│\s*65 MB\s*│", text), text  # reserved, allocated, largest free
    no_memory_db, _ = planted
    assert "Memory" not in _cli("--store", no_memory_db)
    assert json.loads(_cli("--store", no_memory_db, "--format", "json"))[0]["memory"] == []


def test_the_real_full_step_snapshot_summary():
    """The issue's numbers: 61.1 GB reserved and 54.9 GB allocated at the snapshot."""
    path = shared_traces() / "torch-memory" / "cs336-a2-systems__memory_files__memory_ctx128_fullstep.pickle"
    with Store(":memory:") as st:
        run_id = st.ingest(path).run_id
        [dev] = summary_of(st, run_id, "name", 1)["memory"]
    want = snapshot_numbers(path)
    assert {k: dev[k] for k in want} == want
    assert (dev["reserved_bytes"], dev["allocated_bytes"]) == (61_111_009_280, 54_873_829_888)


def test_a_findings_window_is_never_zero_width():
    """Two ends that read the same at three digits give the start and the length instead."""
    assert fmt.window(717_000_000, 780_000_000) == "at 717 ms–780 ms"
    assert fmt.window(122_000_000, 122_045_200) == "at 122 ms for 45.2 us"
    assert fmt.window(1_000_000_500, 1_000_900_000, origin_ns=1_000_000_000) == "at 500 ns–900 us"
    assert fmt.window(5, 5) == fmt.window(5, None) == "at 5 ns"
    # a finding's place: "into the run" follows the time, not the length
    assert fmt.place(122_000_000, 122_045_200) == "at 122 ms into the run, for 45.2 us"
    assert fmt.place(717_000_000, 780_000_000) == "at 717 ms–780 ms into the run"


def test_graph_replays_in_json_and_per_replay_in_the_table(tmp_path):
    """vLLM's piecewise replays (23 of one graph, 15 operations each): `summary --format json`
    gives the graph's totals as integers (DuckDB's sums are decimals), and the text table, whose
    title says its times are per replay, shows the kernel time per replay (6.24 ms, not the
    23 replays' 144 ms)."""
    trace = shared_traces() / "torch-graphs" / "TraceLens__vllm_prefilldecode_piecewise" / "graph_execution.json.gz"
    store = tmp_path / "s.duckdb"
    runner = CliRunner()
    assert runner.invoke(app, ["check", str(trace), "--store", str(store)]).exit_code in (0, 1)
    r = runner.invoke(app, ["summary", "graph_execution.json.gz", "--store", str(store), "--format", "json"])
    assert r.exit_code == 0, r.stdout
    doc = json.loads(r.stdout)
    (run,) = doc if isinstance(doc, list) else [doc]
    top = run["graph_replays"][0]
    assert (top["replays"], top["min_ops"], top["kernels"]) == (23, 15, 345)
    assert all(isinstance(top[k], int) for k in ("kernels", "kernel_ns", "gpu_ns", "launch_ns", "ops"))
    text = runner.invoke(app, ["summary", "graph_execution.json.gz", "--store", str(store)],
                         env={"COLUMNS": "200"}).stdout
    assert "times per replay" in text
    row = next(line for line in text.splitlines() if top["graph"] in line)
    assert fmt.ns(top["kernel_ns"] / 23) in row and fmt.ns(top["kernel_ns"]) not in row
