"""A timeline with no kernel says what it holds instead (`summary.without_kernels`,
`report.budget.without_kernels_line`): a capture that ends in CUDA set-up, launches whose work
was not recorded, or host operators alone. Counts recomputed from the raw files."""

from __future__ import annotations

import gzip
import json
import sqlite3

import pytest

from traceanalyzer.report.budget import without_kernels_line
from traceanalyzer.report.model import load_result
from traceanalyzer.store import Store
from traceanalyzer.summary import run_summary, without_kernels

from .conftest import shared_traces

WEATHER = "nsys/WeatherBench2__report1.sqlite"
VQE = "nsys/tutorial_vqe__report1.sqlite"
CUPTI_PROFILER = "torch/hta__cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz"
CPU_ONLY = "torch/hta__rank_non_gpu__rank_non_gpu.json.gz"
WITH_KERNELS = "nsys/gpu4__report2.sqlite"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = shared_traces()
    store = Store(tmp_path_factory.mktemp("bare") / "s.duckdb")
    ids = {rel: store.ingest(root / rel).run_id for rel in (WEATHER, VQE, CUPTI_PROFILER, CPU_ONLY, WITH_KERNELS)}
    yield store, ids
    store.close()


def _runtime_calls(path) -> list[tuple[str, int]]:
    with sqlite3.connect(path) as con:
        return con.execute("SELECT s.value, r.end - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                           "JOIN StringIds s ON s.id = r.nameId").fetchall()


def test_a_capture_that_ends_in_set_up_says_so(runs):
    store, ids = runs
    raw = _runtime_calls(shared_traces() / WEATHER)
    facts = without_kernels(store, [ids[WEATHER]])[ids[WEATHER]]
    assert facts["calls"] == len(raw) == 23 and facts["launches"] == 0 and facts["memsets"] == 1
    longest = max(raw, key=lambda r: r[1])
    assert longest[0].startswith("cudaFree") and facts["top_calls"][0] == {"name": "cudaFree", "n": 1, "ns": longest[1]}
    line = without_kernels_line(facts)
    assert line.startswith("no kernel ran: the capture holds 23 API calls over 131 ms, none a launch or copy "
                           "(cudaFree 119 ms")
    assert "and 1 memset: it ends in the program's CUDA set-up" in line and "--delay" in line


def test_driver_calls_alone_are_set_up_too(runs):
    store, ids = runs
    raw = _runtime_calls(shared_traces() / VQE)
    facts = without_kernels(store, [ids[VQE]])[ids[VQE]]
    assert facts["calls"] == len(raw) == 11 and facts["launches"] == 0 and facts["memsets"] == 0
    assert "cuInit" in {c["name"] for c in facts["top_calls"]}
    assert without_kernels_line(facts).startswith("no kernel ran: the capture holds 11 API calls over 2.03 s")


def test_launches_without_their_work_say_it_was_not_recorded(runs):
    store, ids = runs
    with gzip.open(shared_traces() / CUPTI_PROFILER) as f:
        events = json.load(f)["traceEvents"]
    calls = [e["name"] for e in events if e.get("cat") == "cuda_runtime"]
    launches = [n for n in calls if "launch" in n.lower() or "memcpy" in n.lower()]
    facts = without_kernels(store, [ids[CUPTI_PROFILER]])[ids[CUPTI_PROFILER]]
    assert (facts["calls"], facts["launches"]) == (len(calls), len(launches)) == (1862, 94)
    line = without_kernels_line(facts)
    assert line.startswith("no kernel in the trace, though 94 of its 1,862 API calls") and "not recorded" in line


def test_host_operators_alone_mean_no_gpu_was_traced(runs):
    store, ids = runs
    with gzip.open(shared_traces() / CPU_ONLY) as f:
        ops = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op"]
    facts = without_kernels(store, [ids[CPU_ONLY]])[ids[CPU_ONLY]]
    assert facts["calls"] == 0 and facts["operators"] == len(ops) == 2424
    assert without_kernels_line(facts).startswith("no GPU work: the trace holds 2,424 host operators")


def test_runs_with_kernels_have_no_such_line_and_reports_carry_it(runs):
    store, ids = runs
    assert ids[WITH_KERNELS] not in without_kernels(store, list(ids.values()))
    result = load_result(store, list(ids.values()))
    by_id = {r["run_id"]: r for r in result.runs}
    assert "without_kernels" not in by_id[ids[WITH_KERNELS]]
    assert by_id[ids[WEATHER]]["without_kernels"]["calls"] == 23
    assert run_summary(store, ids[WEATHER])["without_kernels"]["calls"] == 23
    assert run_summary(store, ids[WITH_KERNELS])["without_kernels"] is None


def test_markdown_prints_the_line_whole(runs):
    """A run's lines in markdown are sentences, not table cells: not clipped (WeatherBench2's
    ends in the advice)."""
    from traceanalyzer.report import markdown

    store, ids = runs
    page = markdown.render(store, load_result(store, [ids[WEATHER]]))
    assert "or the program ran no GPU work; profile past the set-up (nsys --delay, or --capture-range=cudaProfilerApi " \
           "around the work to judge)" in page
