"""`traceanalyzer diff BASE TEST`: kernels, end-to-end time, memory, findings, verdict, gate.

Every expected number is read from the trace files here (json, sqlite3, csv), not from the store.
"""

from __future__ import annotations

import csv
import functools
import gzip
import json
import math
import re
import sqlite3
import statistics
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceanalyzer.cli import app

from .conftest import FIXTURES, shared_traces
from .test_scan import nsys_span_ns

runner = CliRunner()
KINETO_CLEAN = FIXTURES / "kineto" / "clean.json.gz"
KINETO_PLANTED = FIXTURES / "kineto" / "planted.json"
NSYS_CLEAN = FIXTURES / "nsys" / "clean.sqlite"
NSYS_PLANTED = FIXTURES / "nsys" / "planted.sqlite"
NSYS_GRAPH_MEMORY = FIXTURES / "nsys" / "graph_memory.sqlite"


def diff(db, *args):
    return runner.invoke(app, ["diff", "--store", str(db), *map(str, args)], env={"COLUMNS": "200"},
                         catch_exceptions=False)


def diff_json(db, *args) -> tuple[int, dict]:
    r = diff(db, *args, "--json")
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    return r.exit_code, json.loads(r.stdout)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """One store for the module: each trace is read and checked once, then diffed by many tests."""
    return tmp_path_factory.mktemp("diff") / "s.duckdb"


# -- independent readings ------------------------------------------------------------------

def kineto_events(path: Path) -> list[dict]:
    """The trace's events, parsed once per file version (a real trace takes ~0.6 s; several tests
    read each); callers only read them."""
    st = path.stat()
    return _parsed_events(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _parsed_events(path: Path, mtime_ns: int, size: int) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def us_to_ns(x) -> int:
    """Exact: epoch microseconds times 1000 overflow a double's 53 bits."""
    return int(Decimal(str(x)) * 1000)


def kineto_in_capture(events: list[dict]) -> list[dict]:
    """The kernels launched inside the capture: all but those with no launch call in the trace
    that start before its first API call."""
    calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    linked = {e["args"]["correlation"] for e in calls if "correlation" in e.get("args", {})}
    first = min((us_to_ns(e["ts"]) for e in calls), default=None)
    return [e for e in events if e.get("cat") == "kernel"
            and not (e["args"].get("correlation") not in linked and first is not None and us_to_ns(e["ts"]) < first)]


def kineto_kernels(path: Path) -> dict[str, tuple[int, int]]:
    """Full kernel name (white space removed, as diff matches) -> (count, total ns), of the
    kernels launched inside the capture."""
    out = defaultdict(lambda: [0, 0])
    for e in kineto_in_capture(kineto_events(path)):
        k = re.sub(r"\s+", "", e["name"])
        out[k][0] += 1
        out[k][1] += us_to_ns(e["dur"])
    return {k: tuple(v) for k, v in out.items()}


def kineto_peak_cuda_bytes(path: Path) -> int:
    return max(e["args"]["Total Allocated"] for e in kineto_events(path)
               if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1)


def nsys_kernels(path: Path) -> dict[str, tuple[int, int]]:
    with sqlite3.connect(path) as con:
        rows = con.execute("""SELECT s.value, count(*), sum(k."end" - k.start)
                              FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName
                              GROUP BY s.value""").fetchall()
    return {re.sub(r"\s+", "", name): (n, total) for name, n, total in rows}


def by_key(doc: dict) -> dict[str, tuple]:
    return {re.sub(r"\s+", "", k["name"]): (k["base_count"], k["test_count"], k["base_total_ns"], k["test_total_ns"])
            for k in doc["kernels"]}


def expected_kernel_rows(base: dict, test: dict) -> dict[str, tuple]:
    return {k: (base.get(k, (None, None))[0], test.get(k, (None, None))[0],
                base.get(k, (None, None))[1], test.get(k, (None, None))[1]) for k in {*base, *test}}


# -- the real trace_compare pair from HolisticTraceAnalysis -------------------------------

def test_real_trace_compare_pair(db):
    root = shared_traces() / "torch"
    base, test = root / "hta__trace_compare__base__base.json.gz", root / "hta__trace_compare__test__test.json.gz"
    code, doc = diff_json(db, base, test, "--gate", "5")
    assert code == 0

    assert by_key(doc) == expected_kernel_rows(kineto_kernels(base), kineto_kernels(test))
    changed = [k for k in doc["kernels"] if k["count_delta"] != 0]
    assert len(changed) == 1 and "CUDAFunctor_add<int>" in changed[0]["name"] and changed[0]["count_delta"] == -1

    def span(events):
        return max(us_to_ns(e["ts"]) + us_to_ns(e["dur"]) for e in events) - min(us_to_ns(e["ts"]) for e in events)

    def steps(events):  # (2 steps: no warm-up step is set apart)
        return statistics.median(us_to_ns(e["dur"]) for e in events if re.fullmatch(r"ProfilerStep#\d+", e["name"])
                                 and e["cat"] == "user_annotation")

    be, te = kineto_events(base), kineto_events(test)
    metrics = {m["name"]: m for m in doc["metrics"]}
    assert (metrics["span"]["base"], metrics["span"]["test"]) == (span(be), span(te))
    assert doc["end_to_end"]["name"] == "median ProfilerStep#* (host)"
    assert (doc["end_to_end"]["base"], doc["end_to_end"]["test"]) == (steps(be), steps(te))
    kernel_total = metrics["kernel time (sum)"]
    assert kernel_total["base"] == sum(t for _, t in kineto_kernels(base).values())
    assert kernel_total["test"] == sum(t for _, t in kineto_kernels(test).values())

    ranges = {(r["side"], r["range"]): r for r in doc["ranges"]}
    nccl = ranges[("host", "nccl:all_reduce")]
    assert (nccl["base_count"], nccl["test_count"]) == tuple(
        sum(1 for e in ev if e["name"] == "nccl:all_reduce") for ev in (be, te))
    assert doc["peak_memory"]["base"] is None and doc["peak_memory"]["test"] is None  # no [memory] events
    assert doc["verdict"] == "NO CHANGE" and doc["comparable"] is True and doc["reasons"] == []
    # the kernel running when the profiler started is not a launch of either run
    assert doc["not_counted"] == {side: sum(1 for e in ev if e.get("cat") == "kernel") - len(kineto_in_capture(ev))
                                  for side, ev in (("base", be), ("test", te))} == {"base": 1, "test": 1}


# -- fixtures with planted problems --------------------------------------------------------

def test_kineto_clean_to_planted_regresses_time_and_memory_and_the_gate_fails(db):
    code, doc = diff_json(db, KINETO_CLEAN, KINETO_PLANTED, "--gate", "5")
    assert code == 1
    assert by_key(doc) == expected_kernel_rows(kineto_kernels(KINETO_CLEAN), kineto_kernels(KINETO_PLANTED))
    assert (doc["peak_memory"]["base"], doc["peak_memory"]["test"]) == (
        kineto_peak_cuda_bytes(KINETO_CLEAN), kineto_peak_cuda_bytes(KINETO_PLANTED))
    assert doc["end_to_end"]["name"] == "span"  # clean.json.gz has no ProfilerStep ranges
    failures = doc["gate"]["failures"]
    assert len(failures) == 2 and failures[0].startswith("end-to-end time") and failures[1].startswith("peak memory")
    assert doc["verdict"] == "REGRESSED"
    assert doc["findings"]["new"] and not doc["findings"]["fixed"]

    # the other way round every change is an improvement, and the text output says so
    r = diff(db, KINETO_PLANTED, KINETO_CLEAN, "--gate", "5")
    assert r.exit_code == 0, r.stdout
    assert "verdict: IMPROVED" in r.stdout and "gate 5%: pass" in r.stdout
    assert "Fixed findings" in r.stdout


def test_new_and_fixed_findings_ignore_the_file_name(db, tmp_path):
    """Fingerprints include the file name; the same problems in a renamed trace are neither new nor fixed."""
    renamed = tmp_path / "after_the_change.json"
    renamed.write_text(KINETO_PLANTED.read_text() + "\n")  # other bytes, other run id; same events
    code, doc = diff_json(db, KINETO_PLANTED, renamed)
    assert doc["base"]["run_id"] != doc["test"]["run_id"]
    assert doc["findings"]["new"] == [] and doc["findings"]["fixed"] == []
    assert doc["findings"]["unchanged"] > 0
    assert doc["verdict"] == "NO CHANGE"


def _nvtx_step_ns(path):
    """The median time of the NVTX ranges named `step`, straight from the export."""
    with sqlite3.connect(path) as con:
        return statistics.median(d for d, in con.execute(
            """SELECT n."end" - n.start FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
               WHERE coalesce(n.text, s.value) = 'step' AND n."end" IS NOT NULL"""))


def test_nsys_planted_vs_clean_with_an_nvtx_step(db):
    code, doc = diff_json(db, NSYS_PLANTED, NSYS_CLEAN, "--step", "step")
    assert by_key(doc) == expected_kernel_rows(nsys_kernels(NSYS_PLANTED), nsys_kernels(NSYS_CLEAN))
    metrics = {m["name"]: m for m in doc["metrics"]}
    assert (metrics["span"]["base"], metrics["span"]["test"]) == (nsys_span_ns(NSYS_PLANTED), nsys_span_ns(NSYS_CLEAN))

    assert doc["end_to_end"]["name"] == "median step (host)"
    assert (doc["end_to_end"]["base"], doc["end_to_end"]["test"]) == (_nvtx_step_ns(NSYS_PLANTED), _nvtx_step_ns(NSYS_CLEAN))
    assert doc["verdict"] == "IMPROVED" and doc["findings"]["fixed"] and not doc["findings"]["new"]
    r = diff(db, NSYS_PLANTED, NSYS_CLEAN, "--step", "no such range")
    assert r.exit_code == 2 and "no range of that name" in r.stderr


def test_nvtx_steps_are_the_step_time_without_step(db):
    """Without --step, diff's steps are the `steps` view's: here the NVTX ranges named `step`."""
    code, doc = diff_json(db, NSYS_PLANTED, NSYS_CLEAN)

    assert doc["end_to_end"]["name"] == "median step (host)"
    assert (doc["end_to_end"]["base"], doc["end_to_end"]["test"]) == (_nvtx_step_ns(NSYS_PLANTED), _nvtx_step_ns(NSYS_CLEAN))


def test_across_formats_memory_from_nsys_allocation_events(db):
    """nsys has no allocator totals: the peak is the running sum of signed allocation sizes."""
    with sqlite3.connect(NSYS_GRAPH_MEMORY) as con:
        events = con.execute("SELECT bytes, memoryOperationType FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                             "ORDER BY start").fetchall()
    level = peak = 0
    for nbytes, op in events:  # 0 = allocation, 1 = free
        level += nbytes if op == 0 else -nbytes
        peak = max(peak, level)
    code, doc = diff_json(db, NSYS_GRAPH_MEMORY, KINETO_PLANTED, "--gate", "10000", "--allow-different-hardware")
    assert not doc["comparable"] and doc["reasons"][0].startswith("GPU model: base NVIDIA H100")
    assert (doc["peak_memory"]["base"], doc["peak_memory"]["test"]) == (peak, kineto_peak_cuda_bytes(KINETO_PLANTED))
    assert doc["memory"][0]["base_source"] == "running sum of signed sizes"
    assert doc["memory"][0]["test_source"] == "allocator totals"
    assert (doc["base"]["format"], doc["test"]["format"]) == ("nsys-sqlite", "kineto-json")
    assert code == 0  # under a 10000% gate


def test_ncu_runs_compare_kernel_time_from_the_duration_metric(db):
    full, raw = FIXTURES / "ncu" / "details_full.csv", FIXTURES / "ncu" / "raw_waves.csv"
    scale = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}
    details = [r for r in csv.DictReader(full.read_text().splitlines()) if r["Metric Name"] == "Duration"]
    full_ns = sum(float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]] for r in details)
    lines = list(csv.reader(ln for ln in raw.read_text().splitlines() if not ln.startswith("==")))
    col = lines[0].index("gpu__time_duration.sum")
    raw_ns = sum(float(r[col]) * scale[lines[1][col]] for r in lines[2:])
    code, doc = diff_json(db, raw, full, "--gate", "1", "--allow-different-hardware")
    assert doc["reasons"] == ["SM count: base 132, test 108"]  # two GPUs of other sizes
    assert doc["end_to_end"]["name"] == "kernel time (sum)"
    assert doc["end_to_end"]["base"] == pytest.approx(raw_ns) and doc["end_to_end"]["test"] == pytest.approx(full_ns)
    assert code == 1 and doc["metrics"][0]["name"] == "span" and doc["metrics"][0]["base"] is None


def test_runs_by_id_and_bad_input(db, tmp_path):
    assert diff(db, KINETO_CLEAN, KINETO_PLANTED).exit_code == 0
    r = runner.invoke(app, ["query", "--store", str(db), "--csv", "SELECT run_id FROM runs WHERE source_path IN "
                            f"('{KINETO_CLEAN.resolve()}', '{KINETO_PLANTED.resolve()}') ORDER BY file_name"])
    clean_id, planted_id = r.stdout.split()[1:]
    r = diff(db, clean_id[:8], planted_id)  # id prefixes work, nothing is re-read
    assert r.exit_code == 0 and "verdict: REGRESSED" in r.stdout
    r = diff(db, "nope", planted_id)
    assert r.exit_code == 2 and "no run matches 'nope'" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    r = diff(db, bad, planted_id)
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {bad}: ") and "Traceback" not in r.stderr
    assert diff(db, clean_id, planted_id, "--by", "both").exit_code == 2


def short_name(full: str) -> str:
    """The base function name: no return type, template arguments, parameters or namespaces."""
    name = re.sub(r"^void\s+", "", full)
    depth, out = 0, []
    for ch in name:  # drop everything inside <...> and (...), nested
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).split("::")[-1].strip()


def test_match_by_short_name_pools_template_instances(db):
    def pooled(path):
        out = defaultdict(lambda: [0, 0])
        for e in kineto_in_capture(kineto_events(path)):
            out[short_name(e["name"])][0] += 1
            out[short_name(e["name"])][1] += us_to_ns(e["dur"])
        return {k: tuple(v) for k, v in out.items()}

    root = shared_traces() / "torch"  # three instances of one template in the real pair
    base, test = root / "hta__trace_compare__base__base.json.gz", root / "hta__trace_compare__test__test.json.gz"
    for a, b in ((base, test), (KINETO_CLEAN, KINETO_PLANTED)):
        code, doc = diff_json(db, a, b, "--by", "short")
        got = {k["short_name"]: (k["base_count"], k["test_count"], k["base_total_ns"], k["test_total_ns"])
               for k in doc["kernels"]}
        assert got == expected_kernel_rows(pooled(a), pooled(b))
    assert len(diff_json(db, base, test, "--by", "short")[1]["kernels"]) == 1
    instances = {*kineto_kernels(base), *kineto_kernels(test)}  # of one template, launched in the captures
    assert len(instances) == 2 and len(diff_json(db, base, test)[1]["kernels"]) == len(instances)


# -- memory by category --------------------------------------------------------------------

TIMELINE_BASE = FIXTURES / "torch-memory" / "timeline_train.raw.json.gz"
TIMELINE_CHECKPOINTED = FIXTURES / "torch-memory" / "timeline_checkpointed.raw.json.gz"
CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail",
              "unknown")


def timeline_peak(path: Path) -> tuple[int, dict[str, int]]:
    """The peak of a raw memory timeline (the level after each time step; preexisting rows at
    the first time) and the bytes of each category then."""
    rows = json.loads(gzip.decompress(path.read_bytes()))
    first = min(t for t, *_ in rows if t >= 0)
    level, held, best = 0, dict.fromkeys(CATEGORIES, 0), None
    for t in sorted({first if t < 0 else t for t, *_ in rows}):
        for n, c in ((n, c) for u, _, n, c in rows if (first if u < 0 else u) == t):
            level += n
            held[CATEGORIES[c]] += n
        if best is None or level > best[0]:
            best = (level, {c: n for c, n in held.items() if n})
    return best


def test_peak_memory_by_category_between_two_timelines(db):
    """Activation checkpointing (the planted pair): the peak drops and moves to backward, and
    activations are what changed most."""
    (base_peak, base), (test_peak, test) = timeline_peak(TIMELINE_BASE), timeline_peak(TIMELINE_CHECKPOINTED)
    code, doc = diff_json(db, TIMELINE_BASE, TIMELINE_CHECKPOINTED)
    assert (doc["peak_memory"]["base"], doc["peak_memory"]["test"]) == (base_peak, test_peak)
    [dev] = doc["memory"]
    assert (dev["base_peak_bytes"], dev["test_peak_bytes"], dev["delta_bytes"]) == (base_peak, test_peak,
                                                                                      test_peak - base_peak)
    assert dev["base_source"] == dev["test_source"] == "memory timeline" and dev["base_peak_reserved_bytes"] is None
    got = {r["category"]: (r["base_bytes"], r["test_bytes"], r["delta_bytes"]) for r in doc["memory_categories"]}
    assert got == {c: (base.get(c, 0), test.get(c, 0), test.get(c, 0) - base.get(c, 0)) for c in {*base, *test}}
    assert doc["memory_categories"][0]["category"] == "activation"  # the largest change first
    assert (base_peak, test_peak) == (1426 << 20, 876 << 20)
    assert doc["memory_line"] == "peak memory -38.6% (activations -682 MB)"
    assert doc["verdict"] == "IMPROVED" and "peak memory 1.5 GB -> 919 MB (-38.6%), activations -682 MB" in doc["verdict_line"]

    r = diff(db, TIMELINE_CHECKPOINTED, TIMELINE_BASE, "--gate", "50")  # the other way: +62.8%, over the gate
    assert r.exit_code == 1
    assert "memory: peak memory +62.8% (activations +682 MB)" in r.stdout
    assert re.search(r"activation\s*│\s*157 MB\s*│\s*839 MB\s*│\s*\+682 MB\s*│\s*\+433\.3%", r.stdout), r.stdout
    assert "Kernels by time change" not in r.stdout  # neither run has kernels


def test_two_runs_without_memory_say_nothing_about_it(db):
    full, raw = FIXTURES / "ncu" / "details_full.csv", FIXTURES / "ncu" / "raw_waves.csv"
    _, doc = diff_json(db, raw, full)
    assert doc["memory"] == [] and doc["memory_categories"] == [] and doc["memory_line"] is None
    assert "memory" not in doc["verdict_line"]
    r = diff(db, raw, full)
    for said in ("memory:", "Peak memory", "peak allocated", "End-to-end time and memory", "peak memory"):
        assert said not in r.stdout, (said, r.stdout)
    assert "End-to-end time" in r.stdout


def test_memory_of_one_run_only_is_not_in_both(db):
    _, doc = diff_json(db, FIXTURES / "ncu" / "raw_waves.csv", TIMELINE_BASE)
    assert doc["memory_line"] == "peak memory: not in both runs" and "peak memory: not in both runs" in doc["verdict_line"]
    assert doc["memory_categories"] == []


def test_peak_reserved_per_device_where_the_allocator_records_it(db):
    def reserved(path):
        return max(e["args"]["Total Reserved"] for e in kineto_events(path)
                   if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1)

    _, doc = diff_json(db, KINETO_CLEAN, KINETO_PLANTED)
    [dev] = doc["memory"]
    assert (dev["base_peak_reserved_bytes"], dev["test_peak_reserved_bytes"]) == (reserved(KINETO_CLEAN),
                                                                                    reserved(KINETO_PLANTED))
    assert dev["delta_bytes"] == kineto_peak_cuda_bytes(KINETO_PLANTED) - kineto_peak_cuda_bytes(KINETO_CLEAN)
    assert doc["memory_categories"] == []  # Kineto's allocator events carry no categories
    change = 100 * dev["delta_bytes"] / dev["base_peak_bytes"]
    assert doc["memory_line"].startswith(f"peak memory {change:+.1f}% (")
    assert "base peak reserved" in diff(db, KINETO_CLEAN, KINETO_PLANTED).stdout


def test_two_ncu_profiles_pair_a_renamed_kernel_in_launch_order(db):
    """The naive vs coalesced SGEMM reports: one kernel each, under two names. Paired, with each
    side's Speed Of Light and achieved occupancy; the stall finding both have is neither new
    nor fixed."""
    from traceanalyzer.store import Store

    reps = shared_traces() / "ncu-rep"
    naive, coalesced = reps / "CudaCode__gemm__reps__naive.ncu-rep", reps / "CudaCode__gemm__reps__global_mem_coalesce.ncu-rep"
    code, doc = diff_json(db, naive, coalesced)
    [k] = doc["kernels"]
    assert k["status"] == "paired" and k["name"].startswith("naive_gemm(")
    assert k["test_name"].startswith("sgemm_global_mem_coalesce(")
    with Store(db, read_only=True) as st:
        for side, path in (("base", naive), ("test", coalesced)):
            rid = st.sql("SELECT run_id FROM runs WHERE file_name = $f", {"f": path.name}).fetchall()[0][0]
            rows = st.sql("""SELECT d.value, s.value FROM kernel_metrics d JOIN kernel_metrics s USING (run_id, kernel_id)
                             WHERE run_id = $r AND d.metric_id = 'gpu__time_duration.sum'
                               AND s.metric_id = 'sm__throughput.avg.pct_of_peak_sustained_elapsed'""",
                          {"r": rid}).fetchall()
            assert k[f"{side}_count"] == len(rows) == 2
            assert k[f"{side}_total_ns"] == pytest.approx(sum(d for d, _ in rows), abs=1)
            assert k[f"{side}_sm_pct"] == pytest.approx(sum(d * s for d, s in rows) / sum(d for d, _ in rows))
    rules = lambda fs: {(f["rule_id"], f["item_name"].split("(")[0]) for f in fs}  # noqa: E731
    assert ("I001", "sgemm_global_mem_coalesce") not in rules(doc["findings"]["new"])
    assert ("I001", "naive_gemm") not in rules(doc["findings"]["fixed"])
    assert ("I003", "naive_gemm") in rules(doc["findings"]["fixed"])
    text = diff(db, naive, coalesced).stdout
    assert "naive_gemm -> sgemm_global_mem_coalesce" in text and "renamed kernels paired in launch order" in text
    assert "SM %" in text and "occupancy %" in text


def test_timelines_never_pair_renamed_kernels(db):
    _, doc = diff_json(db, NSYS_CLEAN, NSYS_PLANTED)
    assert {k["status"] for k in doc["kernels"]} <= {"both", "new", "gone"}
    assert any(k["status"] in ("new", "gone") for k in doc["kernels"])


# -- like with like: capture windows, hardware, steps ----------------------------------------

WINDOW_BEFORE, WINDOW_AFTER = FIXTURES / "nsys" / "window_before.sqlite", FIXTURES / "nsys" / "window_after.sqlite"
A100_RANK3, V100_RANK1 = FIXTURES / "kineto" / "diff_a100_rank3.json", FIXTURES / "kineto" / "diff_v100_rank1.json"
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def nsys_capture(path: Path) -> dict:
    """Straight from the export: the kernels launched inside the capture per name (those with
    no launch call that start before the first API call are not), how many were not, the
    busy time (union of GPU work) per device, and the NVTX range names."""
    with sqlite3.connect(path) as con:
        # correlation ids are per process: (process, id), the process in globalTid's upper bits
        calls = set(con.execute("SELECT globalTid >> 24, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"))
        first = con.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
        kernels = [(name, (pid, corr), start) for name, pid, corr, start in con.execute(
            """SELECT s.value, k.globalPid >> 24, k.correlationId, k.start
               FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName""")]
        tables = {t for t, in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        intervals = defaultdict(list)
        for t in GPU_TABLES:
            if t in tables:
                for dev, s, e in con.execute(f'SELECT deviceId, start, "end" FROM {t}'):
                    intervals[dev].append((s, e))
        names = [n for n, in con.execute("""SELECT coalesce(n.text, s.value) FROM NVTX_EVENTS n
                                            LEFT JOIN StringIds s ON s.id = n.textId""")]
    counted = Counter(re.sub(r"\s+", "", n) for n, corr, start in kernels if corr in calls or start >= first)
    busy = {dev: union_ns(ivs) for dev, ivs in intervals.items()}
    return {"launches": counted, "not_counted": len(kernels) - sum(counted.values()), "busy": busy, "names": names}


def union_ns(intervals) -> int:
    """The time covered by the union of (start, end) intervals."""
    total, reach = 0, None
    for s, e in sorted(intervals):
        if reach is None or s > reach:
            total, reach = total + e - s, e
        elif e > reach:
            total, reach = total + e - reach, e
    return total


def test_time_sliced_windows_compare_by_throughput_never_by_span(db):
    """Two equal 3 ms windows of a 2-GPU loop: the spans are equal, but fewer iterations fit in
    the second: the verdict is the launch rate of the kernels both have, and it regressed."""
    before, after = nsys_capture(WINDOW_BEFORE), nsys_capture(WINDOW_AFTER)
    spans = nsys_span_ns(WINDOW_BEFORE), nsys_span_ns(WINDOW_AFTER)
    assert spans[0] == spans[1]
    code, doc = diff_json(db, WINDOW_BEFORE, WINDOW_AFTER, "--gate", "5")
    assert doc["setup"]["base"]["capture"] == doc["setup"]["test"]["capture"] == "time-sliced"
    assert doc["comparable"] is True and doc["steps"] == {"base": None, "test": None}

    matched = before["launches"].keys() & after["launches"].keys()
    rate = [1e9 * sum(c["launches"][k] for k in matched) / span for c, span in zip((before, after), spans)]
    e2e = doc["end_to_end"]
    assert e2e["name"] == "matched kernel launches per second" and e2e["better"] == "higher"
    assert (e2e["base"], e2e["test"]) == pytest.approx(rate)
    assert e2e["delta_pct"] == pytest.approx(100 * (rate[1] - rate[0]) / rate[0]) and e2e["delta_pct"] < -10
    assert doc["verdict"] == "REGRESSED" and code == 1 and "13.3% worse" in doc["gate"]["failures"][0]

    # launches before the window are not counted
    assert {k["name"].replace(" ", ""): (k["base_count"], k["test_count"]) for k in doc["kernels"]} == {
        k: (before["launches"][k], after["launches"][k]) for k in matched}
    assert doc["not_counted"] == {"base": before["not_counted"], "test": after["not_counted"]} == {"base": 1, "test": 3}

    # busy time per device, never summed across devices
    assert {r["base_device_id"]: (r["base_busy_ns"], r["test_busy_ns"]) for r in doc["busy"]} == {
        d: (before["busy"][d], after["busy"][d]) for d in before["busy"]}
    assert all(r["base_device_id"] == r["test_device_id"] == r["gpu"] for r in doc["busy"])
    assert sum(before["busy"].values()) > spans[0]  # what a sum over devices would claim
    metrics = {m["name"]: m for m in doc["metrics"]}
    busiest = metrics["GPU busy, busiest device (union of its GPU work)"]
    assert (busiest["base"], busiest["test"]) == (max(before["busy"].values()), max(after["busy"].values()))
    idle = metrics["GPU idle share of the span, mean over devices"]
    assert idle["base"] == pytest.approx(statistics.mean(1 - b / spans[0] for b in before["busy"].values()))
    assert idle["test"] > idle["base"]

    # range names normalised: `aten::to, op_id = N, seq = M`, unique per instance, line up
    def normalised(names):
        return Counter(re.sub(r",\s*(op_id|seq)\s*=\s*\d+", "", n) for n in names)

    ranges = {r["range"]: (r["base_count"], r["test_count"]) for r in doc["ranges"]}
    nb, na = normalised(before["names"]), normalised(after["names"])
    assert len(set(before["names"])) == len(before["names"])  # every raw name unique
    assert ranges == {k: (nb[k], na[k]) for k in nb} and set(ranges) == {"aten::mm", "aten::to"}

    text = diff(db, WINDOW_BEFORE, WINDOW_AFTER).stdout
    assert "GPU busy per device" in text and "(verdict)" in text and "REGRESSED" in text
    assert "not counted (launched before the capture began): base 1 kernel(s), test 3 kernel(s)" in text


def kineto_steps(path: Path) -> list[int]:
    return [us_to_ns(e["dur"]) for e in kineto_events(path)
            if e.get("cat") == "user_annotation" and re.fullmatch(r"ProfilerStep#\d+", e["name"])]


def test_unlike_hardware_is_inconclusive_and_fails_the_gate_unless_allowed(db):
    """Rank 3 of 8 on an A100 vs rank 1 of 2 on a V100: not comparable. The verdict is
    INCONCLUSIVE with the reasons (never better or worse), and the gate fails on it (exit 1,
    the reasons on stderr) unless --allow-different-hardware."""
    doc = json.loads(Path(A100_RANK3).read_text()), json.loads(Path(V100_RANK1).read_text())
    (gpu_b,), (gpu_t,) = doc[0]["deviceProperties"], doc[1]["deviceProperties"]
    dist_b, dist_t = doc[0]["distributedInfo"], doc[1]["distributedInfo"]
    reasons = [f"GPU model: base {gpu_b['name']}, test {gpu_t['name']}",
               f"SM count: base {gpu_b['numSms']}, test {gpu_t['numSms']}",
               f"world size: base {dist_b['world_size']}, test {dist_t['world_size']}",
               f"rank: base {dist_b['rank']}, test {dist_t['rank']}"]
    r = diff(db, A100_RANK3, V100_RANK1, "--gate", "5")
    assert r.exit_code == 1, r.stdout + r.stderr
    assert "gate 5%: inconclusive: the runs are not alike (" + "; ".join(reasons) in r.stderr
    first = r.stdout.splitlines()
    assert first[0].startswith("INCONCLUSIVE") and first[1:5] == [f"  {x}" for x in reasons]
    assert "gate 5%: FAIL: inconclusive comparison" in r.stdout
    verdict = [ln for ln in r.stdout.splitlines() if ln.startswith("verdict: ")]
    assert verdict == [ln for ln in verdict if ln.startswith("verdict: INCONCLUSIVE: the runs are not alike (")]
    assert not re.search(r"REGRESSED|IMPROVED|NO CHANGE|MIXED", r.stdout)

    code, out = diff_json(db, A100_RANK3, V100_RANK1, "--gate", "5")
    assert code == 1 and out["comparable"] is False and out["reasons"] == reasons
    assert out["verdict"] == "INCONCLUSIVE" and "REGRESSED" not in json.dumps(out)
    assert out["gate"]["judged"] is False and out["gate"]["passed"] is False and out["gate"]["failures"] == []

    code, out = diff_json(db, A100_RANK3, V100_RANK1, "--gate", "5", "--allow-different-hardware")
    assert out["verdict"] == "INCONCLUSIVE"  # judged by the gate, still not alike
    assert code == 1 and out["gate"]["judged"] and out["gate"]["passed"] is False and out["gate"]["failures"]
    code, out = diff_json(db, A100_RANK3, V100_RANK1, "--gate", "1000", "--allow-different-hardware")
    assert code == 0 and out["gate"]["passed"] is True


def test_per_step_distribution_sets_warm_up_apart_and_flags_outliers(db):
    def expect(path):
        ns = kineto_steps(path)
        later = statistics.median(ns[1:])
        warm = 1 if ns[0] > 1.5 * later else 0
        steady = sorted(ns[warm:])
        pos = (len(steady) - 1) * 0.9
        p90 = steady[int(pos)] + (steady[min(int(pos) + 1, len(steady) - 1)] - steady[int(pos)]) * (pos - int(pos))
        med = statistics.median(steady)
        return {"steps": len(ns), "warmup_steps": warm, "median_ns": med, "p90_ns": pytest.approx(p90),
                "outliers": [{"index": i, "ns": d} for i, d in enumerate(ns) if i >= warm and (d > 1.5 * med or d * 1.5 < med)]}

    _, doc = diff_json(db, A100_RANK3, V100_RANK1, "--allow-different-hardware")
    for side, path in (("base", A100_RANK3), ("test", V100_RANK1)):
        got = doc["steps"][side]
        assert {k: got[k] for k in ("steps", "warmup_steps", "median_ns", "p90_ns", "outliers")} == expect(path)
    assert doc["steps"]["base"]["warmup_steps"] == 1 and doc["steps"]["test"]["outliers"][0]["index"] == 4
    e2e = doc["end_to_end"]
    assert e2e["name"] == "median ProfilerStep#* (host)"
    assert (e2e["base"], e2e["test"]) == (doc["steps"]["base"]["median_ns"], doc["steps"]["test"]["median_ns"])
    # time per step of each kernel
    [k] = doc["kernels"]
    assert k["base_per_step_ns"] == k["base_total_ns"] / len(kineto_steps(A100_RANK3))
    text = diff(db, A100_RANK3, V100_RANK1).stdout
    assert "Per-step time" in text and "#4 2.4 ms" in text


def test_step_range_names_the_step(db):
    _, by_step = diff_json(db, NSYS_PLANTED, NSYS_CLEAN, "--step", "step")
    _, by_range = diff_json(db, NSYS_PLANTED, NSYS_CLEAN, "--step-range", "step")
    assert by_range["end_to_end"] == by_step["end_to_end"]
    assert by_range["steps"]["base"]["median_ns"] == _nvtx_step_ns(NSYS_PLANTED)


def _steps_and_top_operators(path: Path) -> tuple[list, list]:
    """From the JSON alone, in ns: the ProfilerStep windows, and the operators not inside another
    operator of their thread (a 2021 trace's `Operator` category holds its steps too)."""
    events = [e for e in kineto_events(path) if e.get("ph") == "X"]
    step = lambda e: re.fullmatch(r"ProfilerStep#\d+", e["name"]) is not None  # noqa: E731
    steps = sorted((e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000) for e in events
                   if step(e) and e.get("cat") in ("user_annotation", "Operator"))
    ops = sorted(((e["pid"], e["tid"]), e["ts"] * 1000, -e["dur"] * 1000) for e in events
                 if e.get("cat") in ("cpu_op", "Operator") and not step(e))
    top, reach = [], {}
    for thread, start, neg_dur in ops:
        if thread not in reach or start >= reach[thread]:
            top.append((start, start - neg_dur))
        reach[thread] = max(reach.get(thread, start), start - neg_dur)
    return steps, top


def _host_operator_ns(path: Path, warmup: int) -> float:
    steps, top = _steps_and_top_operators(path)
    steady = steps[warmup:]
    return sum(e - s for s, e in top if any(a <= s < b for a, b in steady)) / len(steady)


def test_the_budget_per_step_and_the_host_operators_compare_like_with_like(db):
    """Per steady step: each device's budget parts sum to the step's window inside the device's
    span, compute is the kernel time inside it; the host time in top-level operators and every
    operator's calls match the JSON. V100's steps are longer by host idle alone."""
    _, doc = diff_json(db, A100_RANK3, V100_RANK1, "--allow-different-hardware")
    metrics = {m["name"]: m for m in doc["metrics"]}
    host = metrics["host operator time per step (mean, top-level operators)"]
    for side, path in (("base", A100_RANK3), ("test", V100_RANK1)):
        events = [e for e in kineto_events(path) if e.get("ph") == "X"]
        steps, _ = _steps_and_top_operators(path)
        steady = steps[doc["steps"][side]["warmup_steps"]:]
        kernels = [(e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000) for e in events if e["cat"] == "kernel"]
        first, last = min(k[0] for k in kernels), max(k[1] for k in kernels)
        window = sum(max(0, min(e, last) - max(s, first)) for s, e in steady) / len(steady)
        compute = sum(max(0, min(e, ke) - max(s, ks)) for s, e in steady for ks, ke in kernels) / len(steady)
        parts = {(r["category"], r["cause"]): r[f"{side}_per_step_ns"] for r in doc["step_budget"]}
        assert sum(parts.values()) == pytest.approx(window)
        assert parts[("compute", None)] == pytest.approx(compute)
        assert host[side] == pytest.approx(_host_operator_ns(path, doc["steps"][side]["warmup_steps"]))
        calls = Counter(e["name"] for e in events if e["cat"] == "cpu_op")
        assert {o["operator"]: o[f"{side}_count"] for o in doc["operators"]} == calls
    grew = {(r["category"], r["cause"]): r["delta_ns"] for r in doc["step_budget"] if r["delta_ns"]}
    assert list(grew) == [("idle", "host")] and grew[("idle", "host")] > 0
    assert host["delta_pct"] > 10 and doc["operators"][0]["operator"] == "DataLoader"
    text = diff(db, A100_RANK3, V100_RANK1).stdout
    assert "Time budget per step" in text and "idle: host" in text and "PyTorch operators by host-time change" in text


@pytest.mark.parametrize("name", ["kineto__tb_plugin__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
                                  "hta__nccl_parser_config__nccl_data.json.gz"])
def test_host_operator_time_per_step_on_real_traces(real_corpus, name):
    """Nested operators (2021 `Operator` events whose steps are operators too, and 2024
    `cpu_op`s) counted once, at the top of their thread."""
    from traceanalyzer import step_stats

    run = real_corpus.resolve_run(name)
    dist = step_stats.run_steps(real_corpus, run)
    assert dist is not None and dist["steps"] >= 3
    expect = _host_operator_ns(shared_traces() / "torch" / name, dist["warmup_steps"])
    assert step_stats.host_operator_ns(real_corpus, run) == pytest.approx(expect, rel=1e-9)


# -- summary --------------------------------------------------------------------------------

def test_summary_carries_the_step_distribution(db):
    diff_json(db, A100_RANK3, V100_RANK1)  # both stored
    r = runner.invoke(app, ["summary", "--store", str(db), "--format", "json", A100_RANK3.name])
    [s] = json.loads(r.stdout)
    ns = kineto_steps(A100_RANK3)
    assert s["steps"]["steps"] == len(ns) and s["steps"]["median_ns"] == statistics.median(ns[1:])
    assert s["steps"]["warmup_ns"] == ns[:1]
    text = runner.invoke(app, ["summary", "--store", str(db), A100_RANK3.name], env={"COLUMNS": "200"}).stdout
    assert f"steps {len(ns)} (ProfilerStep#*): median" in text and "1 warm-up set apart" in text


# -- real pairs: a regression, hardware not alike, repeat runs, a real improvement ----------

def _torch(name: str) -> Path:
    return shared_traces() / "torch" / name


MFU_BEFORE, MFU_AFTER = "nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite", "nsys-ai__tests__fixtures__mfu_2gpu_after.sqlite"
RESNET = "kineto__tb_plugin__resnet50_num_workers_{}__worker0.{}.pt.trace.json.gz"
WORKERS_0 = (RESNET.format(0, 1623143089861), RESNET.format(0, 1623143566756))
WORKERS_4 = (RESNET.format(4, 1623212756351), RESNET.format(4, 1623213129365))


def _block_period_ms(path: Path) -> float:
    """The median time from one transformer block's forward to the next's, on each thread, from
    the `FSDP::pre_forward (blocks.N...)` NVTX ranges: one iteration's pace."""
    with sqlite3.connect(path) as con:
        rows = con.execute("""SELECT coalesce(n.text, s.value), n.start, n.globalTid FROM NVTX_EVENTS n
                              LEFT JOIN StringIds s ON s.id = n.textId""").fetchall()
    starts = defaultdict(list)
    for name, start, tid in rows:
        m = re.match(r"FSDP::pre_forward \(blocks\.(\d+)\.", name or "")
        if m:
            starts[tid].append((start, int(m.group(1))))
    gaps = [(b[0] - a[0]) / 1e6 for v in starts.values() for a, b in zip(sorted(v), sorted(v)[1:]) if b[1] == a[1] + 1]
    return statistics.median(gaps)


def _nsys_span(path: Path) -> int:
    """First to last event over the CUPTI activity tables that have times, and NVTX ranges/marks."""
    with sqlite3.connect(path) as con:
        tables = [t for t, in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                  if t.startswith("CUPTI_ACTIVITY_KIND_") or t == "NVTX_EVENTS"]
        timed = [t for t in tables if "start" in {c[1] for c in con.execute(f"PRAGMA table_info({t})")}]
        parts = [f'SELECT start, coalesce("end", start) AS stop FROM {t}'
                 + (" WHERE eventType IN (34, 59, 60)" if t == "NVTX_EVENTS" else "") for t in timed]
        lo, hi = con.execute(f"SELECT min(start), max(stop) FROM ({' UNION ALL '.join(parts)})").fetchone()
    return hi - lo


def test_real_mfu_pair_the_slower_iterations_are_a_regression(db):
    """Two 0.3 s time-sliced windows of a 2-GPU FSDP run before and after a change: each block's
    forward comes about 17% later after it (16.7 -> 19.5 ms, from the NVTX ranges), so fewer
    launches fit the window: REGRESSED by the launch rate, and the gate fails."""
    before, after = shared_traces() / "nsys" / MFU_BEFORE, shared_traces() / "nsys" / MFU_AFTER
    assert _block_period_ms(after) > 1.1 * _block_period_ms(before)
    code, doc = diff_json(db, before, after, "--gate", "5")
    assert doc["comparable"] is True and doc["setup"]["base"]["capture"] == doc["setup"]["test"]["capture"] == "time-sliced"
    b, a = nsys_capture(before), nsys_capture(after)
    matched = b["launches"].keys() & a["launches"].keys()
    rate = [1e9 * sum(c["launches"][k] for k in matched) / _nsys_span(p) for c, p in ((b, before), (a, after))]
    e2e = doc["end_to_end"]
    assert e2e["name"] == "matched kernel launches per second" and (e2e["base"], e2e["test"]) == pytest.approx(rate)
    assert e2e["delta_pct"] < -5 and doc["verdict"] == "REGRESSED" and code == 1
    assert {(r["gpu"], r["base_device_id"], r["test_device_id"]) for r in doc["busy"]} == {(0, 0, 0), (1, 1, 1)}
    # an idle share's change is in percentage points
    idle = next(m for m in doc["metrics"] if m["unit"] == "share")
    assert idle["delta_pp"] == pytest.approx(100 * (idle["test"] - idle["base"]))
    text = diff(db, before, after).stdout
    row = next(ln for ln in text.splitlines() if "GPU idle share" in ln)
    assert f"+{idle['delta_pp']:.1f} pp" in row and f"+{idle['delta_pp']:.1f}%" not in row
    # Copies, from the raw MEMCPY rows (1,020 -> 904 copies, 8.05 -> 7.20 GB): fewer fit the window too.
    copied = []
    for path in (before, after):
        with sqlite3.connect(path) as con:
            copied.append(con.execute("SELECT sum(\"end\" - start), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone())
    metric = {m["name"]: m for m in doc["metrics"]}
    assert (metric["copy time (sum)"]["base"], metric["copy time (sum)"]["test"]) == (copied[0][0], copied[1][0])
    assert (metric["bytes copied"]["base"], metric["bytes copied"]["test"]) == (copied[0][1], copied[1][1])
    # A window's kernel total falls with the work that fitted: the verdict gives time per launch,
    # and the kernel slowed most (the NCCL send/recv: every other kernel's launches take as long)
    assert "kernel time per launch (matched kernels)" in doc["verdict_line"]
    assert "most in ncclDevKernel_SendRecv" in doc["verdict_line"] and not re.search(r"; kernel time \d", doc["verdict_line"])


def test_real_a100_vs_v100_is_inconclusive_and_devices_pair_by_role(db):
    """HTA's trace_diff pair: rank 3 of 8 on an A100 (device 3) against rank 1 of 2 on a V100
    (device 1). INCONCLUSIVE with the four reasons; the busy table pairs device 3 with device 1
    (each run's GPU 0), busy time as the union of each device's GPU work in the JSON; findings
    are matched across the two device ids."""
    from traceanalyzer.store import Store

    base, test = _torch("hta__trace_diff__control__control.json.gz"), _torch("hta__trace_diff__test__test.json.gz")
    raw = []
    for path in (base, test):
        with gzip.open(path, "rt") as f:
            raw.append(json.load(f))
    db_, dt = raw[0]["distributedInfo"], raw[1]["distributedInfo"]
    gb = next(p for p in raw[0]["deviceProperties"] if p["id"] == 3)  # the device its kernels ran on (below)
    gt = next(p for p in raw[1]["deviceProperties"] if p["id"] == 1)
    code, doc = diff_json(db, base, test, "--gate", "5")
    assert code == 1 and doc["verdict"] == "INCONCLUSIVE" and doc["comparable"] is False
    assert doc["reasons"] == [f"GPU model: base {gb['name']}, test {gt['name']}",
                              f"SM count: base {gb['numSms']}, test {gt['numSms']}",
                              f"world size: base {db_['world_size']}, test {dt['world_size']}",
                              f"rank: base {db_['rank']}, test {dt['rank']}"]
    assert doc["gate"]["passed"] is False and doc["gate"]["judged"] is False

    def busy(events):
        per = defaultdict(list)
        for e in events:
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X":
                per[e["args"]["device"]].append((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])))
        (device, ivs), = per.items()
        return device, union_ns(ivs)

    (db_dev, b_busy), (dt_dev, t_busy) = busy(raw[0]["traceEvents"]), busy(raw[1]["traceEvents"])
    assert (db_dev, dt_dev) == (3, 1)
    assert [(r["gpu"], r["base_device_id"], r["test_device_id"], r["base_busy_ns"], r["test_busy_ns"])
            for r in doc["busy"]] == [(0, 3, 1, b_busy, t_busy)]
    assert {(r["gpu"], r["base_device_id"], r["test_device_id"]) for r in doc["step_budget"]} == {(0, 3, 1)}

    with Store(db, read_only=True) as st:  # one GPU each: a finding is the same whatever its device id
        keys = []
        for path in (base, test):
            rows = st.sql("""SELECT rule_id, device_id, stream_id, item_kind, item_name FROM findings
                             WHERE run_id = (SELECT run_id FROM runs WHERE file_name = $f)""",
                          {"f": path.name}).fetchall()
            keys.append(Counter(r[:1] + r[2:] for r in rows))
            assert {r[1] for r in rows} <= {None, (3, 1)[len(keys) - 1]}
    assert doc["findings"]["unchanged"] == sum((keys[0] & keys[1]).values()) > 0

    text = diff(db, base, test).stdout
    assert "verdict: INCONCLUSIVE: the runs are not alike" in text and "REGRESSED" not in text
    assert re.search(r"│ 3 -> 1 +│ +\d", text)


def _resnet_steps(name: str) -> tuple[float, int]:
    """(median of the steady steps in ns, warm-up steps) from the ProfilerStep#N events: leading
    steps over 1.5 times the median of the steps after the first are warm-up (at most half)."""
    ns = [us_to_ns(e["dur"]) for e in kineto_events(_torch(name))
          if e.get("ph") == "X" and re.fullmatch(r"ProfilerStep#\d+", e.get("name", ""))]
    later, warm = statistics.median(ns[1:]), 0
    while warm < len(ns) // 2 and ns[warm] > 1.5 * later:
        warm += 1
    return statistics.median(ns[warm:]), warm


def test_real_repeat_runs_with_4_workers_are_no_change(db):
    """The same config twice: median step 127 -> 125 ms (-1.2%, more than the 1% noise), but
    each run's steps spread over 116-207 ms (a worker stalls now and then): within that spread,
    NO CHANGE, and the gate passes."""
    a, b = WORKERS_4
    code, doc = diff_json(db, _torch(a), _torch(b), "--gate", "5")
    e2e = doc["end_to_end"]
    assert (e2e["base"], e2e["test"]) == (_resnet_steps(a)[0], _resnet_steps(b)[0])
    assert abs(e2e["delta_pct"]) > 1 and e2e["p_value"] > 0.05
    assert doc["verdict"] == "NO CHANGE" and code == 0 and doc["comparable"] is True
    assert "within the step-to-step spread" in doc["verdict_line"]


def test_real_repeat_runs_with_no_workers_differ_in_data_loading(db):
    """The same config twice, recorded 8 minutes apart, do differ: loading the data in the main
    thread took 69 ms a step in the first run and 45 ms in the second (the
    `_SingleProcessDataLoaderIter.__next__` ranges), so every step of the second run (149-159
    ms) is shorter than every step of the first (164-181 ms), while the GPU work is the same
    (kernel time within 1%). diff says what the traces hold: 13.5% faster, not noise."""
    a, b = WORKERS_0
    code, doc = diff_json(db, _torch(a), _torch(b))
    e2e = doc["end_to_end"]
    assert (e2e["base"], e2e["test"]) == (_resnet_steps(a)[0], _resnet_steps(b)[0])
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    per_step = [sum(us_to_ns(e["dur"]) for e in kineto_events(_torch(n)) if e.get("name") == loader) / 6
                for n in (a, b)]
    row = next(r for r in doc["operators"] if r["operator"] == loader)
    assert (row["base_per_step_ns"], row["test_per_step_ns"]) == pytest.approx(per_step)
    assert per_step[1] < 0.7 * per_step[0]
    kernel = next(m for m in doc["metrics"] if m["name"] == "kernel time (sum)")
    assert abs(kernel["delta_pct"]) < 1
    # six steps against six, each of the second run's shorter: no test of so few says more than 2 / 924
    assert doc["verdict"] == "IMPROVED" and e2e["p_value"] == pytest.approx(2 / math.comb(12, 6))
    assert "per step, most change in idle: host" in doc["verdict_line"]


def test_the_step_test_says_no_more_than_its_steps_can():
    """median_test_p: at least 2 / C(n_a + n_b, n_a), the p-value of the most extreme order."""
    from traceanalyzer.diff import median_test_p

    assert median_test_p([100.0] * 5 + [101.0], [50.0, 50.5, 51.0, 50.2, 50.1, 50.3]) == pytest.approx(2 / 924)
    assert median_test_p([1.0, 2, 3, 4, 5], [1.0, 2, 3, 4, 5]) == 1.0
    assert median_test_p([1.0, 2, 3, 4], [5.0, 6, 7, 8, 9]) is None  # under MIN_STEPS


@pytest.mark.parametrize("base", WORKERS_0)
@pytest.mark.parametrize("test", WORKERS_4)
def test_real_dataloader_workers_0_to_4_is_an_improvement(db, base, test):
    """DataLoader workers 0 -> 4: the main thread no longer loads the data (45-69 ms a step ->
    under 5 ms), the median step drops 17-29%: IMPROVED, whichever repeat run of each."""
    code, doc = diff_json(db, _torch(base), _torch(test), "--gate", "5")
    e2e = doc["end_to_end"]
    (mb, _), (mt, _) = _resnet_steps(base), _resnet_steps(test)
    assert (e2e["base"], e2e["test"]) == (mb, mt) and mt < 0.85 * mb
    assert doc["verdict"] == "IMPROVED" and code == 0 and doc["comparable"] is True
    loader = {r["operator"]: r for r in doc["operators"] if r["operator"].startswith("enumerate(DataLoader)")}
    assert loader["enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"]["test_per_step_ns"] < 5e6
    assert loader["enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"]["base_per_step_ns"] > 40e6


def test_a_gpu_model_no_trace_carries_is_said_to_be_assumed(db):
    """nsys-ai's mfu pair has no TARGET_INFO_GPU: not a reason to call the runs unlike, but the
    verdict says the same hardware is assumed; HTA's trace_diff pair names its GPUs (and differs:
    A100 against V100, a reason), so nothing is assumed there."""
    root = shared_traces() / "nsys"
    before, after = root / "nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite", root / "nsys-ai__tests__fixtures__mfu_2gpu_after.sqlite"
    for f in (before, after):
        with sqlite3.connect(f) as con:
            assert not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'TARGET_INFO_GPU'").fetchall()
    _, doc = diff_json(db, before, after)
    assert doc["comparable"] is True and doc["setup"]["base"]["gpus"] is None and doc["setup"]["test"]["gpus"] is None
    assert doc["unknowns"] == ["GPU model: in neither trace (the same hardware is assumed)"]
    assert doc["verdict_line"].endswith("; GPU model: in neither trace (the same hardware is assumed)")
    torch = shared_traces() / "torch"
    _, doc = diff_json(db, torch / "hta__trace_diff__control__control.json.gz", torch / "hta__trace_diff__test__test.json.gz")
    assert doc["unknowns"] == [] and any(r.startswith("GPU model") for r in doc["reasons"])
