"""The HTML report, the Markdown summary and the Chrome-trace export.

Data tests compare what the report ships with values re-read from the trace files
(sqlite3 / json / csv here). Browser tests open the reports in headless Chromium over
the DevTools protocol (`--remote-debugging-pipe`, so no port and no extra package): no
console error, no exception, no network request, no dialog; screenshots of each plot
are checked pixel by pixel (Pillow). They skip where /usr/bin/chromium is missing,
except under CI, where they must run (.ci/run installs Debian's chromium).
"""

from __future__ import annotations

import base64
import csv
import gzip
import html as html_lib
import io
import json
import os
import pickle
import re
import select
import shutil
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from traceanalyzer import fmt
from traceanalyzer.batch.check import check_file
from traceanalyzer.cli import app
from traceanalyzer.ingest.base import ParsedTrace
from traceanalyzer.report import chrome_trace, html, html_charts, html_metrics, html_timeline, markdown
from traceanalyzer.report.model import CheckResult, load_result
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES, ROOT, shared_traces

CHROMIUM = Path("/usr/bin/chromium")
PLANTED_NSYS = FIXTURES / "nsys" / "planted.sqlite"
PLANTED_KINETO = FIXTURES / "kineto" / "planted.json"
NCU_FULL = FIXTURES / "ncu" / "details_full.csv"
NCU_STALLS = FIXTURES / "ncu" / "details_stalls.csv"
EVIL = ["<script>alert(1)</script>", "</script><script>alert(2)</script>", "<img src=x onerror=alert(3)>",
        "\"'><svg onload=alert(4)>&amp;", "line\u2028sep <!-- x"]
KERNEL_RGB = (0x3b, 0x6f, 0xd8)
HTOD_RGB = (0xe8, 0x87, 0x1e)
ERROR_RGB = (0xd6, 0x27, 0x28)
MEMORY_RGB = (0x6a, 0x3f, 0xb5)
# A fixed list: other fixture generators add files to fixtures/ over time.
FIXTURE_FILES = ["nsys/planted.sqlite", "nsys/clean.sqlite", "nsys/graph_memory.sqlite", "nsys/old_2_9_1.sqlite",
                 "kineto/planted.json", "kineto/clean.json.gz", "kineto/legacy_2021.json",
                 "ncu/details_full.csv", "ncu/details_stalls.csv", "ncu/raw_waves.csv"]
REAL = ["torch/hta__df_index_resolver__df_index_resolver.json.gz",
        "torch/TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz",
        "nsys/nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite",
        "nsys/CSC746CUDALab__report1.sqlite",
        "ncu/XPlacer__cfd__lassen__nsight_cfd_097K.log",
        "ncu/PolyFHE__profile__evalstall-stallreason-opt.csv"]

runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"}, catch_exceptions=False)


# The rules whose findings the report draws on (all rules cost too much time here).
RULES = Settings(select=["T001", "T002", "B001", "B002", "B003", "I001", "M001"])


def checked_store(path: Path, files: list[Path]) -> tuple[Store, list[str]]:
    st = Store(path)
    done = [check_file(st, f, None) for f in files]
    assert not [r for r in done if r.state == "failed"], [r.error for r in done]
    ids = list(dict.fromkeys(r.run_id for r in done))
    run_rules(st, ids, RULES)
    return st, ids


@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory):
    files = [FIXTURES / p for p in FIXTURE_FILES]
    st, ids = checked_store(tmp_path_factory.mktemp("fx") / "s.duckdb", files)
    yield st, dict(zip([f.name for f in files], ids))
    st.close()


def run_id_of(fixture_store, name: str) -> str:
    return fixture_store[1][name]


def decode_track(tr: dict) -> list[tuple[int, int, int, int]]:
    """(start, duration, kind, name index) of a timeline track, deltas undone."""
    out, at = [], 0
    for s, d, k, n in zip(tr["s"], tr["d"], tr["k"], tr["n"]):
        at += s
        out.append((at, d, k, n))
    return out


# -- timeline data -----------------------------------------------------------------------

def test_timeline_ships_every_operation_of_the_planted_nsys_trace(fixture_store):
    st, _ = fixture_store
    rid = run_id_of(fixture_store, "planted.sqlite")
    run = load_result(st, [rid])
    tl = html_timeline.timeline_data(st, rid, run.findings, run.runs[0]["start_ns"])
    con = sqlite3.connect(f"file:{PLANTED_NSYS}?mode=ro", uri=True)
    kinds = dict(con.execute("SELECT id, name FROM ENUM_CUDA_MEMCPY_OPER").fetchall())
    expected: dict[tuple, list] = {}
    for dev, stream, start, end, name in con.execute(
            "SELECT deviceId, streamId, start, end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN StringIds s ON s.id = k.demangledName"):
        expected.setdefault((dev, stream), []).append((start, end - start, "kernel", name))
    for dev, stream, start, end, kind in con.execute(
            "SELECT deviceId, streamId, start, end, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY"):
        label = {"CUDA_MEMCPY_KIND_HTOD": "HtoD copy", "CUDA_MEMCPY_KIND_DTOH": "DtoH copy"}.get(
            kinds[kind], "unified memory" if "UVM" in kinds[kind] else "other copy")
        expected.setdefault((dev, stream), []).append((start, end - start, label, None))
    first = min(s for ops in expected.values() for s, *_ in ops)
    assert not tl["sampled"] and tl["total_ops"] == sum(map(len, expected.values()))
    got = {}
    for tr in tl["tracks"]:
        got[(tr["device"], tr["stream"])] = sorted(
            (s, d, tl["kinds"][k], tl["names"][n] if tl["kinds"][k] == "kernel" else None) for s, d, k, n in decode_track(tr))
    assert got == {key: sorted((s - first, d, k, n) for s, d, k, n in ops) for key, ops in expected.items()}
    assert tl["origin"] == first - run.runs[0]["start_ns"]


def test_markers_are_the_findings_ranges_and_their_evidence_examples(fixture_store):
    st, _ = fixture_store
    rid = run_id_of(fixture_store, "planted.sqlite")
    res = load_result(st, [rid])
    tl = html_timeline.timeline_data(st, rid, res.findings, res.runs[0]["start_ns"])
    con = sqlite3.connect(f"file:{PLANTED_NSYS}?mode=ro", uri=True)
    first = min(r[0] for r in con.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
                                          "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_MEMCPY"))
    copies = {(s - first, e - first): stream for s, e, stream in con.execute(
        "SELECT start, end, streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY")}
    by_finding = {}
    for m in tl["markers"]:
        by_finding.setdefault(m["f"], []).append(m)
    for i, f in enumerate(res.findings):
        if f["start_ns"] is not None:
            main = [m for m in by_finding[i] if m["main"]]
            assert [(m["s"], m["e"]) for m in main] == [(f["start_ns"] - first, f["end_ns"] - first)]
    t002 = next(i for i, f in enumerate(res.findings) if f["rule_id"] == "T002" and f["evidence"].get("worst"))
    examples = [m for m in by_finding[t002] if not m["main"]]
    assert examples, "the exposed copies of the evidence are marked"
    for m in examples:  # each example is a copy of the trace, on that copy's stream
        assert copies[(m["s"], m["e"])] == m["st"]


def synthetic_kernels(store: Store, n: int, seed: int = 7) -> tuple[str, dict]:
    """A run of `n` kernels on two streams, written straight into the store."""
    rng = np.random.default_rng(seed)
    stream = np.arange(n) % 2
    dur = rng.integers(1_000, 9_000, n)
    start = (np.arange(n) // 2) * 10_000 + stream * 3_000 + 1_000_000
    kernels = pa.table({"kernel_id": np.arange(n), "device_id": np.zeros(n, np.int32), "stream_id": stream + 7,
                        "start_ns": start, "end_ns": start + dur,
                        "name": [f"kernel_{i % 50}" for i in range(n)]})
    trace = ParsedTrace(format="nsys-sqlite", producer="nsys", clock="nsys-session",
                        tables={"kernels": kernels, "devices": pa.table({"device_id": [0], "name": ["NVIDIA H100 80GB HBM3"]})})
    r = store.write_run(trace, Path(f"/synthetic/{n}_kernels.sqlite"), f"{n:016x}" + "0" * 48, 0)
    return r.run_id, {"start": start, "dur": dur, "stream": stream + 7}


def test_a_huge_run_ships_the_longest_operations_and_exact_bin_shading(tmp_path):
    n, cap = 150_000, 20_000
    with Store(tmp_path / "s.duckdb") as st:
        rid, k = synthetic_kernels(st, n)
        tl = html_timeline.timeline_data(st, rid, [], int(k["start"].min()), max_ops=cap, n_bins=1024)
        assert tl["sampled"] and tl["total_ops"] == n and tl["shown_ops"] == cap
        shipped = sorted(d for tr in tl["tracks"] for _, d, _, _ in decode_track(tr))
        assert shipped == sorted(k["dur"].tolist())[-cap:]  # the longest ones
        # Each bin's shade is the busy share of its stream in that bin, rounded up to 1/255.
        w, t0 = tl["bin_ns"], int(k["start"].min())
        for tr in tl["tracks"]:
            sel = k["stream"] == tr["stream"]
            busy = np.zeros(tl["n_bins"])
            for s, d in zip(k["start"][sel] - t0, k["dur"][sel]):
                b0, b1 = s // w, (s + d) // w
                for b in range(b0, min(b1, tl["n_bins"] - 1) + 1):
                    busy[b] += min(s + d, (b + 1) * w) - max(s, b * w)
            want = np.where(busy > 0, np.maximum(1, np.minimum(255, np.ceil(255 * busy / w))), 0)
            got = np.frombuffer(base64.b64decode(tr["bins"]["0"]), np.uint8)
            assert np.array_equal(got, want)
        page = html.render(st, load_result(st, [rid]), max_ops=cap)
        assert len(page.encode()) < 2_000_000


# -- roofline, stalls, memory ------------------------------------------------------------

def test_roofline_places_kernels_from_flop_counters_and_dram_bytes(tmp_path):
    # Two kernels: one by FP32 instruction counts, one by per-cycle FP64 counters.
    rows = [  # kernel_id, metric_id, value
        (0, "gpu__time_duration.sum", 2e6), (0, "dram__bytes.sum", 4e9),
        (0, "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum", 1e9),
        (0, "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum", 2e9),
        (0, "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum", 3e9),
        (1, "gpu__time_duration.sum", 1e6), (1, "dram__bytes_read.sum", 1e8), (1, "dram__bytes_write.sum", 5e7),
        (1, "smsp__cycles_elapsed.avg.per_second", 1.5e9),
        (1, "smsp__sass_thread_inst_executed_op_dfma_pred_on.sum.per_cycle_elapsed", 400.0),
    ]
    trace = ParsedTrace(format="ncu-csv", tables={
        "kernels": pa.table({"kernel_id": [0, 1], "device_id": [0, 0], "name": ["sgemm", "dgemm"]}),
        "devices": pa.table({"device_id": [0], "name": ["NVIDIA H100 80GB HBM3"],
                             "memory_bandwidth_bytes_per_s": [3.35e12]}),
        "kernel_metrics": pa.table({"kernel_id": [r[0] for r in rows], "metric_id": [r[1] for r in rows],
                                    "value": [r[2] for r in rows]})})
    with Store(tmp_path / "s.duckdb") as st:
        rid = st.write_run(trace, Path("/synthetic/roof.csv"), "ab" * 32, 0).run_id
        [rf] = html_metrics.roofline(st, rid, [])  # no B003 findings: the report's own query
    assert rf["mode"] == "absolute" and rf["bandwidth_bytes_per_s"] == 3.35e12
    pts = {p["kernel"]: p for p in rf["points"]}
    sgemm_flop = 1e9 + 2e9 + 2 * 3e9
    assert pts["sgemm"]["ai"] == pytest.approx(sgemm_flop / 4e9)
    assert pts["sgemm"]["flops_per_s"] == pytest.approx(sgemm_flop / 2e-3)
    dgemm_flop = 2 * 400.0 * 1.5e9 * 1e-3
    assert pts["dgemm"]["ai"] == pytest.approx(dgemm_flop / 1.5e8)
    assert pts["dgemm"]["flops_per_s"] == pytest.approx(dgemm_flop / 1e-3)
    assert {r["label"] for r in rf["roofs"]} >= {"FP32", "FP64"}


def _ncu_rows(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    return list(csv.DictReader(lines[start:]))


@pytest.mark.parametrize("source", ["B003", "metrics"])
def test_roofline_without_flop_counts_uses_speed_of_light_shares(fixture_store, source):
    st, _ = fixture_store
    rid = run_id_of(fixture_store, "details_full.csv")
    findings = load_result(st, [rid]).findings if source == "B003" else []
    [rf] = html_metrics.roofline(st, rid, findings)
    assert rf["source"] == source
    sol: dict[str, dict] = {}
    for r in _ncu_rows(NCU_FULL):
        if r["Metric Name"] in ("Compute (SM) Throughput", "Memory Throughput") and r["Metric Value"] not in ("", "n/a"):
            sol.setdefault(r["Kernel Name"], {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    assert rf["mode"] == "sol"
    got = {p["kernel"]: p for p in rf["points"]}
    assert len(got) == len([k for k, v in sol.items() if len(v) == 2])
    for name, p in got.items():
        full = name
        c, m = sol[full]["Compute (SM) Throughput"] / 100, sol[full]["Memory Throughput"] / 100
        assert (p["x"], p["y"]) == (pytest.approx(c / m), pytest.approx(c))


def test_roofline_without_b003_places_kernels_where_b003_does(fixture_store):
    """Both charts come from B003's roofline analysis: the kernels B003 reported sit at the same
    place when the report draws them without its findings."""
    st, _ = fixture_store
    rid = run_id_of(fixture_store, "details_full.csv")
    [by_rule] = html_metrics.roofline(st, rid, load_result(st, [rid]).findings)
    [by_analysis] = html_metrics.roofline(st, rid, [])
    placed = {p["kernel"]: (p["x"], p["y"], p["launches"]) for p in by_analysis["points"]}
    assert by_rule["points"] and by_analysis["kernels_total"] >= by_rule["kernels_total"]
    for p in by_rule["points"]:
        assert placed[p["kernel"]] == (p["x"], p["y"], p["launches"]), p["kernel"]


def test_stall_bars_cover_every_kernel_with_stall_metrics(fixture_store):
    st, _ = fixture_store
    rid = run_id_of(fixture_store, "details_stalls.csv")
    findings = load_result(st, [rid]).findings
    data = html_metrics.stalls(st, rid, findings)
    with_stalls = {r["Kernel Name"] for r in _ncu_rows(NCU_STALLS) if "stall" in r["Metric Name"].lower()}
    assert {k["kernel"] for k in data["kernels"]} == with_stalls
    assert {k["kernel"] for k in data["kernels"] if k["flagged"]} == {f["item_name"] for f in findings if f["rule_id"] == "I001"}
    for k in data["kernels"]:
        assert sum(k["profile"].values()) == pytest.approx(1, abs=1e-3)


def test_memory_curve_peak_is_the_allocators_peak(fixture_store):
    st, _ = fixture_store
    rid = run_id_of(fixture_store, "planted.json")
    run = load_result(st, [rid]).runs[0]
    mem = html_metrics.memory(st, rid, run["start_ns"])
    doc = json.loads(PLANTED_KINETO.read_text())
    events = [e for e in doc["traceEvents"] if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1]
    peak = max(events, key=lambda e: e["args"]["Total Allocated"])
    first_us = min(e["ts"] for e in doc["traceEvents"] if "ts" in e and e.get("ph") != "M")
    gpu = next(s for s in mem["series"] if s["device_type"] == "cuda")
    assert gpu["peak_bytes"] == peak["args"]["Total Allocated"] and gpu["events"] == len(events)
    assert gpu["peak_at_ns"] == pytest.approx((peak["ts"] - first_us) * 1000, abs=1000)
    assert max(c[2] for c in gpu["cols"]) == gpu["peak_bytes"]  # the curve reaches the peak it marks
    # with M001's finding the marker is M001's peak (the same one)
    with_m001 = html_metrics.memory(st, rid, run["start_ns"], load_result(st, [rid]).findings)
    gpu2 = next(s for s in with_m001["series"] if s["device_type"] == "cuda")
    assert gpu2.get("peak_source") == "M001" and (gpu2["peak_bytes"], gpu2["peak_at_ns"]) == (gpu["peak_bytes"], gpu["peak_at_ns"])


def test_memory_curve_is_a_step_plot(fixture_store):
    """The level holds from one allocator event to the next: every segment of the curve is
    horizontal or vertical, and between two columns with events it runs flat at the level the
    first one left."""
    st, _ = fixture_store
    rid = run_id_of(fixture_store, "planted.json")
    mem = html_metrics.memory(st, rid, load_result(st, [rid]).runs[0]["start_ns"])
    svg = html_charts.memory(mem)
    gpu = next(s for s in mem["series"] if s["device_type"] == "cuda")
    pts = re.findall(r'<polyline class="mem" points="([^"]+)"', svg)[mem["series"].index(gpu)].split()
    xy = [tuple(map(float, p.split(","))) for p in pts]
    assert len(xy) > 10
    for (x0, y0), (x1, y1) in zip(xy, xy[1:]):
        assert x0 == x1 or y0 == y1, ((x0, y0), (x1, y1))
    flats = [(a, b) for a, b in zip(xy, xy[1:]) if a[1] == b[1] and a[0] != b[0]]
    assert len(flats) >= len(gpu["cols"]) // 2  # the level carried across each stretch without events


SNAPSHOT_OOM = FIXTURES / "torch-memory" / "snapshot_oom.pickle"
TIMELINE_TRAIN = FIXTURES / "torch-memory" / "timeline_train.raw.json.gz"
FULLSTEP = "torch-memory/cs336-a2-systems__memory_files__memory_ctx128_fullstep.pickle"
CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail",
              "unknown")


class _NoClass(pickle.Unpickler):
    def find_class(self, module, name):
        raise AssertionError(f"{module}.{name}")


def snapshot_bytes_by_state(path: Path) -> dict[str, int]:
    """Block bytes by the map's colors, from the pickle: free blocks in a segment with a live
    block are stranded, those of a wholly free segment cached."""
    out: dict[str, int] = {}
    for seg in _NoClass(io.BytesIO(path.read_bytes())).load()["segments"]:
        used = any(b["state"] != "inactive" for b in seg["blocks"])
        for b in seg["blocks"]:
            kind = b["state"] if b["state"] != "inactive" else ("stranded" if used else "cached")
            out[kind] = out.get(kind, 0) + b["size"]
    return out


def rect_widths(svg: str) -> dict[str, float]:
    """Summed width of the filled rects of an SVG, by fill color."""
    out: dict[str, float] = {}
    for w, fill in re.findall(r'<rect x="[^"]+" y="[^"]+" width="([^"]+)" height="16" fill="([^"]+)"', svg):
        out[fill] = out.get(fill, 0) + float(w)
    return out


@pytest.mark.parametrize("source", ["fixture", "real"])
def test_segment_map_draws_each_block_at_its_size(tmp_path, source):
    path = SNAPSHOT_OOM if source == "fixture" else shared_traces() / FULLSTEP
    with Store(tmp_path / "s.duckdb") as st:
        rid = st.ingest(path).run_id
        [dev] = html_metrics.segment_map(st, rid)
    want = snapshot_bytes_by_state(path)
    svg = html_charts.segment_map(dev)
    got = rect_widths(svg)
    drawn = sum(got.values())
    assert {k: round(got[html_charts.SEGMENT_COLORS[k]] / drawn, 4) for k in want} == {
        k: round(n / sum(want.values()), 4) for k, n in want.items()}
    pixel = html_charts._row_bytes(dev["segments"]) / (html_charts.W - 24)  # bytes of a pixel
    wide = [x for x in dev["segments"] if x["bytes"] >= 1.5 * pixel]
    assert len(wide) > 0.9 * len(dev["segments"])
    assert len(re.findall(r'<rect class="seg" ', svg)) >= len(wide)  # each outlined (pieces of the split ones)
    rows = {float(y) for y in re.findall(r'<rect class="seg" x="[^"]+" y="([^"]+)"', svg)}
    assert 1 <= len(rows) <= html_charts.MAP_MAX_ROWS
    # the largest free block is outlined, as wide as its size
    i, j = dev["largest_free_at"]
    _, largest, state, _ = dev["segments"][i]["blocks"][j]
    assert state == "inactive" and largest == dev["largest_free"]
    marked = sum(float(w) for w in re.findall(r'<rect class="largest" x="[^"]+" y="[^"]+" width="([^"]+)"', svg))
    assert marked == pytest.approx(max(drawn * largest / sum(want.values()), 2), abs=0.05)
    if source == "fixture":  # the planted layout: 62 MiB the largest free block, 11 segments in 3 rows
        assert (largest, len(dev["segments"]), len(rows)) == (62 << 20, 11, 3)


def test_a_segment_map_of_many_tiny_blocks_stays_small():
    """Blocks narrower than a pixel, side by side and in one state, draw as one rect."""
    mib = 1 << 20
    segs = [{"address": i * 2 * mib, "bytes": 2 * mib, "stream": 0, "type": "small", "pool": "0,0", "expandable": False,
             "used": True, "blocks": [(j * 32 * 1024, 32 * 1024, "active_allocated", None) for j in range(63)]
             + [(63 * 32 * 1024, 32 * 1024, "inactive", None)]} for i in range(3000)]
    svg = html_charts.segment_map({"device_id": 0, "segments": segs, "reserved": 6000 * mib, "allocated": 5900 * mib,
                                   "largest_free_at": (0, 63), "largest_free": 32 * 1024})
    assert len(svg) < 1_500_000, len(svg)  # 192,000 blocks
    got = rect_widths(svg)
    drawn = sum(got.values())
    assert got[html_charts.SEGMENT_COLORS["stranded"]] / drawn == pytest.approx(1 / 64, rel=0.05)  # (widths to 0.01 px)


def timeline_levels(path: Path) -> tuple[int, int, dict[str, int], set[str]]:
    """A raw memory timeline's peak (the level after each time step), when (ns after the first
    time), the bytes of each category then, and the categories that ever held bytes."""
    rows = json.loads(gzip.decompress(path.read_bytes()))
    first = min(t for t, *_ in rows if t >= 0)
    held, best, ever = dict.fromkeys(CATEGORIES, 0), None, set()
    for t in sorted({max(t, first) for t, *_ in rows}):
        for u, _, n, c in rows:
            if max(u, first) == t:
                held[CATEGORIES[c]] += n
        ever |= {c for c, n in held.items() if n}
        if best is None or sum(held.values()) > best[0]:
            best = (sum(held.values()), t - first, {c: n for c, n in held.items() if n})
    return (*best, ever)


def test_memory_by_category_stacks_up_to_the_timelines_peak(tmp_path):
    with Store(tmp_path / "s.duckdb") as st:
        rid = st.ingest(TIMELINE_TRAIN).run_id
        [dev] = html_metrics.memory_categories(st, rid, None)
    peak, at, split, ever = timeline_levels(TIMELINE_TRAIN)
    assert (dev["peak_bytes"], dev["peak_at_ns"], dict(dev["peak_split"])) == (peak, at, split)
    totals = [sum(c) for c in dev["columns"] if c is not None]
    assert max(totals) == peak and len(dev["columns"]) == html_metrics.MEMORY_COLUMNS
    top = next(c for c in dev["columns"] if c is not None and sum(c) == peak)
    assert {n: v for n, v in zip(dev["categories"], top) if v} == split
    svg = html_charts.memory_categories(dev)
    bands = re.findall(r'<polygon class="band" points="[^"]+" fill="([^"]+)"', svg)
    assert bands == [html_charts.CATEGORY_COLORS[c] for c in CATEGORIES if c in ever]  # PyTorch's stacking order
    # every band's outline is a step: horizontal or vertical moves only
    for pts in re.findall(r'<polygon class="band" points="([^"]+)"', svg):
        xy = [tuple(map(float, p.split(","))) for p in pts.split()]
        assert all(a[0] == b[0] or a[1] == b[1] for a, b in zip(xy, xy[1:]))


def test_long_finding_ranges_are_marked_thin():
    t0, t1 = 1_000, 1_000 + 10**9
    gap = {"start_ns": t0, "end_ns": t0 + 10**8, "gap_ns": 10**8, "cause": "sync", "around": None}
    evidence = {"main_cause": "sync", "count": 1, "total_ns": 10**8, "median_ns": 1e8, "span_ns": 10**8,
                "total_of": "gaps", "cause_counts": {"sync": 1}, "cause_ns": {"sync": 10**8}, "worst": [gap],
                "warmup_ns": 0, "max_ns": 10**8, "device_idle_ns": 10**8, "around": None,
                "place": {"start_ns": t0, "end_ns": t0 + 10**8, "count": 1, "of": 1, "ns": 10**8, "total_ns": 10**8,
                          "what": "gaps"}}  # T001's evidence (its rule's type)
    fs = [{"severity": "warning", "start_ns": t0, "end_ns": t1, "device_id": 0, "stream_id": None, "evidence": None},
          {"rule_id": "T001", "severity": "error", "start_ns": t0 + 500, "end_ns": t0 + 500 + 10**6, "device_id": 0,
           "stream_id": 7, "evidence": evidence}]
    ms = html_timeline.markers(fs, t0, t1)
    assert [(m["f"], m["main"], m["long"]) for m in ms] == [(0, True, True), (1, True, False), (1, False, True)]


def many_runs(n: int) -> tuple[list[dict], CheckResult]:
    """The index's view of `n` runs with long file names, long messages and eight GPUs each."""
    rng = np.random.default_rng(5)
    runs, findings, pages = [], [], []
    for i in range(n):
        rid = f"{i:016x}"
        runs.append({"run_id": rid, "format": "kineto-json", "span_ns": int(rng.integers(10**6, 10**10)),
                     "file_name": f"TraceLens__h100__google_owlv2-large-patch14-ensemble__1016{i:03d}__"
                                  f"profile_trace_rank_{i % 8}_of_8.pt.trace.json.gz"})
        fs = [{"run_id": rid, "rule_id": rule, "severity": sev, "finding_no": k + 1, "related_to": None,
               "fingerprint": f"{rid}{k}", "est_loss_ns": None if i % 7 == 0 else int(rng.integers(1, 10**9)),
               "message": f"every GPU idle while the host worked: {k + 3} stretch(es) over 50 us, total 2.31 ms "
                          f"(median 180 us), in aten::_scaled_dot_product_flash_attention_for_cpu_{i}_{k}"}
              for k, (rule, sev) in enumerate((("T004", "error"), ("B002", "warning"), ("T002", "info")))]
        findings += fs
        pages.append({"run": runs[-1], "headlines": [(f, []) for f in fs], "devices": [(0, "NVIDIA H100 80GB HBM3")],
                      "busy": [{"device_id": d, "busy_share": 0.5 + d / 20} for d in range(8)]})
    return pages, CheckResult(runs, [], findings)


def test_index_is_sorted_by_estimated_loss():
    pages, res = many_runs(30)
    rows = re.findall(r'<tr><td class="name"><a class="clamp" href="#run-([0-9a-f]+)"', html._index(pages, res))
    losses = [html.run_loss(res, rid) for rid in rows]
    assert sorted(rows) == sorted(p["run"]["run_id"] for p in pages)
    assert losses == sorted(losses, reverse=True) and losses[0] > 0 and losses[-1] == 0


def test_index_ranks_runs_by_the_share_of_a_gpus_time_they_lose():
    """With time budgets the index ranks runs by the largest share of a device's span their
    headlines' measured losses take (B002's, what a faster kernel could save, only after them),
    not by the loss alone nor by their errors; runs without a budget (Nsight Compute) follow, by
    loss."""
    pages, res = many_runs(30)
    for i, p in enumerate(pages):
        if i % 3:  # every third run has no budget
            p["run"]["budget"] = [{"device_id": 0, "span_ns": p["run"]["span_ns"], "parts": []}]
    rows = re.findall(r'<tr><td class="name"><a class="clamp" href="#run-([0-9a-f]+)"', html._index(pages, res))
    runs = {p["run"]["run_id"]: p["run"] for p in pages}
    def lost(rid, upper):
        return sum(f["est_loss_ns"] or 0 for f in res.headlines(rid) if (f["rule_id"] == "B002") == upper)

    keys = [((lost(rid, False) / runs[rid]["span_ns"], lost(rid, True) / runs[rid]["span_ns"])
             if "budget" in runs[rid] and html.run_loss(res, rid) else None, html.run_loss(res, rid)) for rid in rows]
    timed = [k for k in keys if k[0] is not None]
    assert keys[:len(timed)] == timed and [s for s, _ in timed] == sorted((s for s, _ in timed), reverse=True)
    rest = [loss for _, loss in keys[len(timed):]]
    assert rest == sorted(rest, reverse=True)
    assert sorted(k[1] for k in timed) != [k[1] for k in timed][::-1]  # not the order of the losses alone
    index = html._index(pages, res)
    assert "% of a GPU's time; up to " in index and "% more if kernels ran faster (upper bounds)</div>" in index


def test_b004_hint_says_peak_unknown_rather_than_a_dash(tmp_path):
    path = shared_traces() / "ncu" / "nsightful__copy_blocked.csv"
    with Store(tmp_path / "s.duckdb") as st:
        rid = check_file(st, path, Settings(select=["B004"])).run_id
        res = load_result(st, [rid])
        [f] = [f for f in res.findings if f["rule_id"] == "B004"]
        assert "peak unknown" in f["hint"] and "-/s" not in f["hint"]
        assert "-/s" not in html.render(st, res)


# -- what the summary cards count ------------------------------------------------------

GEMMS = [f"sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize{tile}_stage3_warpsize{warps}_ffma_aligna4_alignc4_"
         f"execute_{what}kernel__5x_cublas" for tile, warps, what in
         [("64x256x8", "1x4x1", ""), ("64x256x8", "1x4x1", "split_k_"), ("128x128x8", "2x2x1", ""),
          ("128x128x8", "2x2x1", "split_k_"), ("32x32x8", "1x2x1", ""), ("32x32x8", "1x2x1", "split_k_")]]


def test_top_kernel_labels_keep_the_words_where_names_differ():
    """Six cuBLAS GEMMs, the same first 42 characters: the labels are the CLI's (`fmt.distinct_labels`),
    not six equal clipped starts."""
    rows = [{"kernel": n, "count": 1, "total_ns": 100 - i, "mean_ns": 1, "share": 0.1} for i, n in enumerate(GEMMS)]
    labels = [html_lib.unescape(t) for t in re.findall(r'text-anchor="end" class="lbl">([^<]*)<',
                                                        html_charts.top_kernels(rows))]
    assert labels == fmt.distinct_labels(GEMMS, html_charts.LABEL_CHARS)
    assert len(set(labels)) == len(GEMMS) and max(map(len, labels)) <= html_charts.LABEL_CHARS
    assert all("split" in lab for lab in labels[1::2]) and not any("split" in lab for lab in labels[::2])


def two_gpu_trace() -> ParsedTrace:
    """Two devices, each with the same 500 us of copies and two launches of two GEMMs (one base
    name), on a host named like a word."""
    def table(n_per_device: int, **cols) -> pa.Table:
        n = 2 * n_per_device
        return pa.table({"device_id": [0] * n_per_device + [1] * n_per_device, "stream_id": [7] * n, "pid": [1] * n,
                         **cols})
    starts = [0, 1000, 2000, 3000]
    kernels = table(4, kernel_id=list(range(8)), name=[GEMMS[0], GEMMS[0], GEMMS[2], GEMMS[2]] * 2,
                    short_name=["gemm"] * 8, start_ns=starts * 2, end_ns=[s + 500 for s in starts] * 2)
    copies = table(1, copy_id=[0, 1], start_ns=[5000, 5000], end_ns=[505_000, 505_000], direction=["HtoD"] * 2,
                   src_kind=["pinned"] * 2, dst_kind=["device"] * 2, bytes=[10**9] * 2)
    return ParsedTrace(format="nsys-sqlite", host="modal", tables={"kernels": kernels, "copies": copies})


def test_cards_say_what_they_count_and_over_how_many_devices(tmp_path):
    with Store(tmp_path / "s.duckdb") as st:
        rid = st.write_run(two_gpu_trace(), Path("/x/two_gpus.sqlite"), "7" * 64, 1).run_id
        page = html.render(st, load_result(st, [rid]))
    text = html_lib.unescape(re.sub(r"<[^>]+>", "|", page))
    # the same words as the summary's "N of M distinct names; K launches"
    assert "|kernel time||4 us||8 launches, 2 distinct names (1 base name), summed over 2 GPUs|" in text
    # 1 s of copies beside a 505 us span: summed, and each device's share
    assert "|copy time||1 ms||2 copies, 2 GB, summed over 2 GPUs: GPU 0 500 us, GPU 1 500 us|" in text
    assert " · host: modal" in text and "Top kernels by total time, by base name" in text


# -- escaping ----------------------------------------------------------------------------

def evil_trace(path: Path) -> Path:
    """A Kineto trace whose kernel names are markup; long gaps make T001 quote them."""
    events, ts = [], 1000.0
    for i, name in enumerate(EVIL * 2):
        dur = 400.0 if i == 0 else 20.0
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                       "args": {"device": 0, "stream": 7, "correlation": 100 + i, "grid": [1, 1, 1], "block": [32, 1, 1]}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": ts - 5, "dur": 3, "args": {"correlation": 100 + i}})
        ts += dur + 150.0
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_trace_strings_are_escaped_in_html_markdown_and_chrome_trace(tmp_path):
    src = evil_trace(tmp_path / "evil.json")
    with Store(tmp_path / "s.duckdb") as st:
        rid = st.ingest(src).run_id
        run_rules(st, [rid], RULES)
        res = load_result(st, [rid])
        assert any(e in json.dumps(f["evidence"]) for f in res.findings for e in EVIL[:1])
        page = html.render(st, res)
        md = markdown.render(st, res)
        counts = chrome_trace.export(st, rid, res.findings, tmp_path / "t.json")
    scripts = re.findall(r"<script\b[^>]*>", page)
    assert len(scripts) == page.count("</script>") == 2  # our code and one JSON block: none from the trace
    for name in EVIL:
        assert name not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    block = re.search(r'<script type="application/json" id="tl-[0-9a-f]+">(.*?)</script>', page, re.DOTALL).group(1)
    assert set(EVIL) <= set(json.loads(block)["names"])
    # Markdown: no raw tag but our own <details>/<summary>, no unescaped table pipe from a name.
    assert not re.findall(r"(?<!\\)<(?!/?(details|summary)>)", md)
    assert "\\<script\\>alert(1)" in md  # (the top-kernels line uses the short name)
    doc = json.loads((tmp_path / "t.json").read_text())
    kernels = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert sorted(kernels) == sorted(EVIL * 2) and counts["kernels"] == len(EVIL) * 2


# -- markdown ----------------------------------------------------------------------------

def test_markdown_summary_lists_runs_and_their_worst_findings(fixture_store):
    st, names = fixture_store
    ids = [names["planted.sqlite"], names["planted.json"], names["clean.sqlite"]]
    res = load_result(st, ids)
    md = markdown.render(st, res)
    table = {ln.split(" | ")[0][2:]: ln for ln in md.splitlines()[:20] if ln.startswith("| ") and "---" not in ln}
    for rid in ids:
        fname = next(r["file_name"] for r in res.runs if r["run_id"] == rid)
        n = {s: st.sql("SELECT count(*) FROM findings WHERE run_id = ? AND severity = ?", [rid, s]).fetchall()[0][0]
             for s in ("error", "warning", "info")}
        row = table[markdown.md(fname, 80)]
        assert f"| {n['error']} | {n['warning']} | {n['info']} |" in row
        assert f"### {markdown.md(fname)}" in md
    short = markdown.render(st, load_result(st, list(names.values())), max_chars=3000)
    assert len(short) <= 3000 and "Output shortened" in short


def test_a_headline_carries_its_related_findings_and_steps_get_bars(tmp_path):
    """Checked as `check` does (diagnosed): related findings fold inside their headline's card
    and in its Markdown row, never as cards of their own; a run with steps gets a bar per step."""
    st = Store(tmp_path / "s.duckdb")
    rid = check_file(st, FIXTURES / "nsys" / "timeline_sync.sqlite", Settings()).run_id
    res = load_result(st, [rid])
    related = [f for f in res.findings if f["related_to"] is not None]
    assert related and len(res.headlines()) + len(related) == len(res.findings)
    page = html.render(st, res)
    cards = re.findall(rf'<article class="finding[^"]*" id="f-{rid}-(\d+(?:-\d+)?)"', page)
    assert len([c for c in cards if "-" not in c]) == len(res.headlines())
    assert len([c for c in cards if "-" in c]) == len(related)
    assert page.count('<details class="related">') == len({f["related_to"] for f in related})
    steps = st.sql("SELECT count(*) FROM steps WHERE run_id = ?", [rid]).fetchone()[0]
    assert steps == 4 and f"per step: {steps} step(s)" in page
    md = markdown.render(st, res)
    for f in related:
        assert f"related: {markdown.md(f['rule_id'])} {markdown.md(f['message'], 160)}" in md
    st.close()


# -- chrome trace ------------------------------------------------------------------------

def test_export_trace_has_every_gpu_operation_and_a_marker_per_finding(fixture_store, tmp_path):
    st, _ = fixture_store
    rid = run_id_of(fixture_store, "planted.sqlite")
    findings = load_result(st, [rid]).findings
    chrome_trace.export(st, rid, findings, tmp_path / "t.json.gz")
    doc = json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))
    ev = doc["traceEvents"]
    con = sqlite3.connect(f"file:{PLANTED_NSYS}?mode=ro", uri=True)
    t0 = doc["otherData"]["origin_ns"]
    want_k = sorted((s - t0, e - s, stream) for s, e, stream in
                    con.execute("SELECT start, end, streamId FROM CUPTI_ACTIVITY_KIND_KERNEL"))
    got_k = sorted((round(e["ts"] * 1000), round(e["dur"] * 1000), e["tid"]) for e in ev if e.get("cat") == "kernel")
    assert got_k == want_k
    assert sum(e.get("cat") == "memcpy" for e in ev) == con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()[0]
    marks = [e for e in ev if e.get("cat") == chrome_trace.FINDING_CAT and e["ph"] == "i"]
    assert sorted(m["args"]["fingerprint"] for m in marks) == sorted(f["fingerprint"] for f in findings)
    gpu_pid = chrome_trace.GPU_PID_BASE
    for m, f in ((m, next(f for f in findings if f["fingerprint"] == m["args"]["fingerprint"])) for m in marks):
        assert m["pid"] == gpu_pid + f["device_id"]
        if f["stream_id"] is not None:
            assert m["tid"] == f["stream_id"]
        if f["start_ns"] is not None:
            assert round(m["ts"] * 1000) == f["start_ns"] - t0
    # async ranges pair up; GPU slices on one track never partly overlap (viewers need nesting)
    begins = {e["id"] for e in ev if e["ph"] == "b"}
    assert begins and begins == {e["id"] for e in ev if e["ph"] == "e"}
    assert {e["id"] for e in ev if e["ph"] == "s"} == {e["id"] for e in ev if e["ph"] == "f"}
    tracks: dict = {}
    for e in ev:
        if e["ph"] == "X" and e["pid"] >= gpu_pid:
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 or b1 <= a1
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"].endswith("_name")}
    assert names[(gpu_pid, None)].startswith("GPU 0: ") and names[(gpu_pid, 7)] == "stream 7"


def test_export_trace_cli(tmp_path):
    db = tmp_path / "s.duckdb"
    r = cli("export-trace", PLANTED_KINETO, "-o", tmp_path / "k.json", "--store", db)
    assert r.exit_code == 0, r.stderr
    doc = json.loads((tmp_path / "k.json").read_text())
    kernels = [e for e in json.loads(PLANTED_KINETO.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    assert sum(e.get("cat") == "kernel" for e in doc["traceEvents"]) == len(kernels)
    r = cli("export-trace", NCU_FULL, "-o", tmp_path / "n.json", "--store", db)
    assert r.exit_code == 2 and "has no timeline" in r.stderr and not (tmp_path / "n.json").exists()
    r = cli("export-trace", "no-such-run", "-o", tmp_path / "x.json", "--store", db)
    assert r.exit_code == 2 and "no-such-run" in r.stderr


# -- the command -------------------------------------------------------------------------

def test_report_cli_html_and_markdown(tmp_path):
    db = tmp_path / "s.duckdb"
    out = tmp_path / "r.html"
    r = cli("report", PLANTED_NSYS, PLANTED_KINETO, NCU_STALLS, "-o", out, "--store", db)
    assert r.exit_code == 0, r.stderr
    text = out.read_text()
    assert text.count('<section class="run"') == 3 and 'id="index"' in text
    r = cli("report", "planted.sqlite", "--markdown", "--store", db)  # a stored run, by file name
    assert r.exit_code == 0 and r.stdout.startswith("## traceanalyzer report") and "### planted.sqlite" in r.stdout
    r = cli("report", "nope.sqlite", "--store", db, "-o", tmp_path / "x.html")
    assert r.exit_code == 2 and "nope.sqlite" in r.stderr


def test_report_cli_without_runs_reports_every_stored_run(tmp_path):
    db = tmp_path / "s.duckdb"
    assert cli("ingest", PLANTED_NSYS, PLANTED_KINETO, NCU_STALLS, "--store", db).exit_code == 0
    out = tmp_path / "r.html"
    r = cli("report", "-o", out, "--store", db)
    assert r.exit_code == 0, r.stderr
    with Store(db, read_only=True) as st:
        ids = st.run_ids()
    text = out.read_text()
    assert len(ids) == 3 and text.count('<section class="run"') == 3
    assert all(f'data-run="{rid}"' in text for rid in ids) and "wrote" in r.stderr and "3 run(s)" in r.stderr


def test_report_of_a_stored_folder_says_so_in_one_line(tmp_path):
    """Files already stored and checked are one note, not a line each (--verbose lists them)."""
    db = tmp_path / "s.duckdb"
    folder = tmp_path / "runs"
    folder.mkdir()
    for f in (PLANTED_NSYS, PLANTED_KINETO, NCU_STALLS):
        shutil.copyfile(f, folder / f.name)
    first = cli("report", folder, "-o", tmp_path / "a.html", "--store", db)
    assert first.exit_code == 0 and first.stderr.count("ok ") == 3 and "already stored" not in first.stderr
    again = cli("report", folder, "-o", tmp_path / "b.html", "--store", db)
    assert again.exit_code == 0, again.stderr
    assert "skipped" not in again.stderr
    assert "note: 3 file(s) already stored, not read again (--verbose lists them)" in again.stderr
    listed = cli("report", folder, "-o", tmp_path / "c.html", "--store", db, "--verbose")
    assert listed.stderr.count("skipped (already stored)") == 3 and "note: 3 file(s)" not in listed.stderr


def _page_json(page: dict) -> str:
    return json.dumps(page, sort_keys=True, default=str)  # (NaN == NaN as text)


def test_pages_built_for_many_runs_at_once_are_each_runs_own_page(fixture_store, monkeypatch):
    """`render` computes the code trees and step budgets of every run in a few queries, and skips
    the queries of what a run has no rows of: each run's page is what every query of that run
    alone gives."""
    from traceanalyzer import ranges
    from traceanalyzer.report.budget import step_budgets_of, step_budgets_of_runs

    st, names = fixture_store
    ids = list(names.values())
    monkeypatch.setattr(ranges, "TREE_ROWS_PER_QUERY", 2000)  # several queries, and a run over the limit alone
    result = load_result(st, ids)
    has = html.run_contents(st, ids)
    code = html.code_trees(st, ids, has)
    steps = step_budgets_of_runs(st, ids)
    assert any(r for r in code.values()) and any(has[r] != frozenset(html.CONTENTS) for r in ids)
    for run in result.runs:
        rid = run["run_id"]
        alone = html.run_page(st, run, result, 60_000, shared={"code": None, "step_budgets": step_budgets_of(st, rid)})
        expected = None
        for by in ("op", "range", "module"):
            r = ranges.run_ranges(st, rid, by, html.CODE_DEPTH)
            if any(x["gpu_ns"] for x in r["ranges"]):
                expected = r
                break
        alone["code"] = expected
        batched = html.run_page(st, run, result, 60_000, has[rid], {"code": code[rid], "step_budgets": steps[rid]})
        assert _page_json(batched) == _page_json(alone), rid


def test_assets_ship_with_the_package():
    import tomllib
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["traceanalyzer"]
    pkg = ROOT / "traceanalyzer"
    shipped = {p for g in globs for p in pkg.glob(g)}
    assets = set((pkg / "report" / "assets").glob("*"))
    assert assets and assets <= shipped, f"add a glob for {sorted(a.name for a in assets - shipped)} to package-data"


# -- in the browser ----------------------------------------------------------------------

class Browser:
    """Headless Chromium driven over --remote-debugging-pipe (NUL-separated JSON on fds 3/4)."""

    def __init__(self, exe: Path):
        self.profile = tempfile.mkdtemp(prefix="ta-chromium-")
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()

        def child():  # copies first: a pipe end may already sit on fd 3 or 4
            a, b = os.dup(cmd_r), os.dup(res_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [str(exe), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars", "--mute-audio",
             f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"],
            close_fds=False, preexec_fn=child, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(res_w)
        self.w, self.r, self.buf, self.n, self.events = cmd_w, res_r, b"", 0, []

    def _read(self, timeout: float) -> dict:
        while b"\0" not in self.buf:
            if not select.select([self.r], [], [], timeout)[0]:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise EOFError("chromium exited")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        m = json.loads(msg)
        if m.get("method") == "Page.javascriptDialogOpening":  # record it, and do not hang on it
            self.send("Page.handleJavaScriptDialog", {"accept": True}, m.get("sessionId"))
        return m

    def send(self, method: str, params=None, session=None) -> int:
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        return self.n

    def call(self, method: str, params=None, session=None, timeout: float = 30) -> dict:
        i = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(max(0.01, deadline - time.monotonic()))
            if m.get("id") == i:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            if "method" in m:
                self.events.append(m)

    def open(self, path: Path, width: int = 1280) -> "Page":
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for m in ("Page.enable", "Runtime.enable", "Log.enable", "Network.enable"):
            self.call(m, session=sid)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=sid)
        page = Page(self, sid, target, path.resolve().as_uri())
        self.call("Page.navigate", {"url": page.url}, session=sid)
        page.wait("document.readyState === 'complete'")
        return page

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self.w)
        os.close(self.r)
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, browser: Browser, sid: str, target: str, url: str):
        self.b, self.sid, self.target, self.url = browser, sid, target, url

    def eval(self, expr: str):
        r = self.b.call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, self.sid)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr: str, timeout: float = 10):
        deadline = time.monotonic() + timeout
        while not self.eval(expr):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never satisfied {expr}")
            time.sleep(0.05)

    def go(self, fragment: str):
        self.eval(f"location.hash = {json.dumps(fragment)}")

    def problems(self) -> list[str]:
        """Console errors, exceptions, dialogs and any request but the page itself."""
        out = []
        for m in self.b.events:
            if m.get("sessionId") != self.sid:
                continue
            p, meth = m.get("params", {}), m["method"]
            if meth == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails'].get('text')} {p['exceptionDetails'].get('exception', {}).get('description')}")
            elif meth == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert", "warning"):
                out.append(f"console {p['type']}: {[a.get('value', a.get('description')) for a in p['args']]}")
            elif meth == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry']['text']}")
            elif meth == "Network.requestWillBeSent" and p["request"]["url"].split("#")[0] != self.url:
                out.append(f"request: {p['request']['url']}")
            elif meth == "Page.javascriptDialogOpening":
                out.append(f"dialog: {p['message']}")
        return out

    def shot(self, selector: str, index: int = 0):
        """A screenshot of one element, as an RGB array."""
        from PIL import Image
        import io

        rect = self.eval(f"""(() => {{ const e = document.querySelectorAll({json.dumps(selector)})[{index}];
            e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
            return [r.left + scrollX, r.top + scrollY, r.width, r.height]; }})()""")
        assert rect[2] > 50 and rect[3] > 20, f"{selector} is not laid out: {rect}"
        data = self.b.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
            "x": rect[0], "y": rect[1], "width": rect[2], "height": rect[3], "scale": 1}}, self.sid)["data"]
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")).astype(int)

    def close(self):
        self.b.call("Target.closeTarget", {"targetId": self.target})


def keep(name: str, img) -> None:
    """Save a screenshot as TA_SCREENSHOTS/name.png when that variable names a folder (to look at)."""
    folder = os.environ.get("TA_SCREENSHOTS")
    if folder:
        from PIL import Image

        Image.fromarray(img.astype(np.uint8)).save(Path(folder) / f"{name}.png")


def near(img, rgb, tol: int = 40) -> int:
    """Pixels within `tol` (max channel difference) of a color."""
    return int((np.abs(img - np.array(rgb)).max(axis=2) <= tol).sum())


def colorful(img) -> int:
    """Pixels that are clearly not gray (plot marks, not frames, grids or text)."""
    return int(((img.max(axis=2) - img.min(axis=2)) > 60).sum())


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing and CI is set: install Debian's chromium (see .ci/run)")
        pytest.skip(f"{CHROMIUM} not installed")
    try:
        import PIL  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("Pillow not installed")
    b = Browser(CHROMIUM)
    yield b
    b.close()


def run_sections(page: Page) -> list[str]:
    return page.eval("[...document.querySelectorAll('section.run')].map(s => s.id)")


def test_fixture_report_opens_clean_and_draws_every_plot(browser, fixture_store, tmp_path):
    st, names = fixture_store
    out = tmp_path / "fixtures.html"
    out.write_text(html.render(st, load_result(st, list(names.values()))))
    page = browser.open(out)
    try:
        assert page.eval("document.querySelector('#index').offsetHeight > 0")
        anchors = {name: f"run-{rid}" for name, rid in names.items()}
        for name, anchor in anchors.items():
            page.go(anchor)
            page.wait(f"document.getElementById('{anchor}').offsetHeight > 0")
            if page.eval(f"!!document.querySelector('#{anchor} .timeline')"):
                page.wait(f"+document.querySelector('#{anchor} .timeline').getAttribute('data-drawn') > 0")
                img = page.shot(f"#{anchor} .timeline canvas")
                assert near(img, KERNEL_RGB) + near(img, HTOD_RGB) > 30, f"{name}: no operations drawn"
        assert page.problems() == []

        planted = anchors["planted.sqlite"]
        page.go(planted)
        page.wait(f"document.getElementById('{planted}').offsetHeight > 0")
        img = page.shot(f"#{planted} .timeline canvas")
        assert near(img, KERNEL_RGB) > 100 and near(img, HTOD_RGB) > 50 and near(img, ERROR_RGB, 30) > 20
        img = page.shot(f"#{planted} svg.plot")  # top kernels
        assert near(img, KERNEL_RGB, 10) > 2000

        for name, check in (("details_full.csv", "roofline"), ("details_stalls.csv", "stalls"), ("planted.json", "memory")):
            anchor = anchors[name]
            page.go(anchor)
            page.wait(f"document.getElementById('{anchor}').offsetHeight > 0")
            label = {"roofline": "Roofline", "stalls": "Warp stall", "memory": "Memory of GPU"}[check]
            img = page.shot(f"#{anchor} svg.plot[aria-label^='{label}']")
            keep(f"fixture_{check}", img)
            if check == "roofline":
                assert colorful(img) > 200 and near(img, (0x44, 0x44, 0x44), 30) > 300  # kernels and the roof
            elif check == "stalls":
                hues = {tuple(c) for c in img.reshape(-1, 3)[(img.max(axis=2) - img.min(axis=2)).reshape(-1) > 60]}
                assert colorful(img) > 2000 and len(hues) >= 5
            else:
                assert near(img, MEMORY_RGB, 30) > 100 and near(img, ERROR_RGB, 30) > 20  # curve and peak
        assert page.problems() == []
    finally:
        page.close()


def test_timeline_zooms_with_the_wheel_and_jumps_to_a_finding(browser, fixture_store, tmp_path):
    st, names = fixture_store
    rid = names["planted.sqlite"]
    out = tmp_path / "one.html"
    out.write_text(html.render(st, load_result(st, [rid])))
    page = browser.open(out)
    try:
        page.wait("+document.querySelector('.timeline').getAttribute('data-drawn') > 0")
        before = page.eval("document.querySelector('.timeline .status').textContent")
        img0 = page.shot(".timeline canvas")
        x, y = page.eval("(() => { const r = document.querySelector('.timeline canvas').getBoundingClientRect();"
                         " return [r.left + r.width * 0.6, r.top + r.height / 2]; })()")
        for _ in range(3):
            browser.call("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": x, "y": y, "deltaX": 0, "deltaY": -400},
                         page.sid)
        page.wait(f"document.querySelector('.timeline .status').textContent !== {json.dumps(before)}")
        assert not np.array_equal(img0, page.shot(".timeline canvas"))
        # "show in timeline" on the T001 stream finding: the view then spans its gap
        f = next(f for f in load_result(st, [rid]).findings if f["rule_id"] == "T001" and f["stream_id"] is not None)
        i = load_result(st, [rid]).findings.index(f)
        page.eval(f"document.querySelector('#f-{rid}-{i} button.zoom').click()")
        t0 = load_result(st, [rid]).runs[0]["start_ns"]
        lo, hi = page.eval("document.querySelector('.timeline .status').textContent.match(/view (.*) – (.*)/).slice(1)")
        to_ns = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}
        lo_ns, hi_ns = (float(v.split()[0]) * to_ns[v.split()[1]] for v in (lo, hi))
        assert lo_ns <= f["start_ns"] - t0 and hi_ns >= f["end_ns"] - t0
        assert hi_ns - lo_ns < 0.5 * (load_result(st, [rid]).runs[0]["span_ns"])
        assert page.problems() == []
    finally:
        page.close()


def test_kernel_named_script_is_shown_as_text(browser, tmp_path):
    src = evil_trace(tmp_path / "evil.json")
    out = tmp_path / "evil.html"
    r = cli("report", src, "-o", out, "--store", tmp_path / "s.duckdb")
    assert r.exit_code == 0, r.stderr
    page = browser.open(out)
    try:
        page.wait("+document.querySelector('.timeline').getAttribute('data-drawn') > 0")
        text = page.eval("document.body.textContent")
        for name in EVIL[:4]:
            assert name in text
        assert page.eval("document.scripts.length") == 2
        assert page.eval("document.querySelectorAll('img, iframe, object, embed, svg svg').length") == 0
        assert page.eval("[...document.querySelectorAll('*')].some(e => [...e.attributes].some(a => a.name.startsWith('on')))") is False
        assert page.problems() == []
    finally:
        page.close()


def test_huge_run_report_draws_in_the_browser(browser, tmp_path):
    with Store(tmp_path / "s.duckdb") as st:
        rid, _ = synthetic_kernels(st, 120_000)
        out = tmp_path / "huge.html"
        out.write_text(html.render(st, load_result(st, [rid]), max_ops=10_000))
    page = browser.open(out)
    try:
        page.wait("+document.querySelector('.timeline').getAttribute('data-drawn') > 0")
        img = page.shot(".timeline canvas")
        cols = (np.abs(img - np.array(KERNEL_RGB)).max(axis=2) <= 120).any(axis=0)
        plot = cols[160:]  # right of the track labels
        assert plot.mean() > 0.9, "busy shading must cover the whole run"
        assert page.problems() == []
    finally:
        page.close()


def test_real_traces_report_opens_clean(browser, real_corpus, tmp_path):
    st = real_corpus
    ids = [st.resolve_run(Path(rel).name) for rel in REAL]
    out = tmp_path / "real.html"
    out.write_text(html.render(st, load_result(st, ids)))
    assert out.stat().st_size < 5_000_000
    for rid, rel in zip(ids, REAL):  # each trace alone stays small too
        one = html.render(st, load_result(st, [rid]))
        assert len(one.encode()) < 5_000_000, rel
    page = browser.open(out)
    try:
        for anchor in run_sections(page):
            page.go(anchor)
            page.wait(f"document.getElementById('{anchor}').offsetHeight > 0")
            if page.eval(f"!!document.querySelector('#{anchor} .timeline')"):
                page.wait(f"+document.querySelector('#{anchor} .timeline').getAttribute('data-drawn') > 0")
                img = page.shot(f"#{anchor} .timeline canvas")
                assert colorful(img) > 200, anchor
            for i in range(page.eval(f"document.querySelectorAll('#{anchor} svg.plot').length")):
                assert colorful(page.shot(f"#{anchor} svg.plot", i)) > 50, (anchor, i)
        assert page.problems() == []
    finally:
        page.close()


def test_index_of_eighty_runs_stays_readable(browser, tmp_path):
    pages, res = many_runs(80)
    out = tmp_path / "index.html"
    out.write_text(html.page("80 runs", [html._index(pages, res)], multi=True))
    page = browser.open(out)
    try:
        page.wait("document.querySelector('#index').offsetHeight > 0")
        assert page.eval("document.documentElement.scrollWidth") <= 1280  # nothing pushes the page wider
        heights = page.eval("[...document.querySelectorAll('table.runs tbody tr')].map(r => r.offsetHeight)")
        assert len(heights) == 80 and max(heights) <= 80, max(heights)
        widths = page.eval("[...document.querySelectorAll('table.runs thead th')].map(c => c.offsetWidth)")
        assert widths[0] >= 220 and widths[-1] >= 300, widths  # names and findings keep their room
        # badges stay whole: one line box each, one text line high
        boxes = page.eval("[...document.querySelectorAll('table.runs .badge')].map(b => [b.getClientRects().length, "
                          "b.offsetHeight])")
        assert len(boxes) == 240 and all(n == 1 and h < 22 for n, h in boxes), boxes[:3]
        # the names wrap within their column, shown whole, so all different; the whole name is the title too
        names = page.eval("[...document.querySelectorAll('table.runs td.name a')].map(a => [a.title, a.textContent, "
                          "a.scrollHeight <= a.clientHeight + 1])")
        assert {t for t, _, _ in names} == {p["run"]["file_name"] for p in pages}
        assert len({shown for _, shown, _ in names}) == 80 and all(fits for _, _, fits in names)
        assert all(shown == t for t, shown, _ in names)
        order = page.eval("[...document.querySelectorAll('table.runs td.loss')].map(c => c.textContent)")
        assert order[-1] == "-" and order[0] != "-"
        img = page.shot("#index")
        keep("index_80_runs", img[:900])
        assert page.problems() == []
    finally:
        page.close()


def test_timeline_ticks_stay_distinct_at_microsecond_zoom(browser, tmp_path):
    with Store(tmp_path / "s.duckdb") as st:
        rid, _ = synthetic_kernels(st, 40_000)  # 200 ms
        out = tmp_path / "zoom.html"
        out.write_text(html.render(st, load_result(st, [rid])))
    page = browser.open(out)
    try:
        page.wait("+document.querySelector('.timeline').getAttribute('data-drawn') > 0")
        x, y = page.eval("(() => { const r = document.querySelector('.timeline canvas').getBoundingClientRect();"
                         " return [r.left + r.width * 0.9, r.top + r.height / 2]; })()")
        to_ns = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}

        def view() -> tuple[float, float]:
            lo, hi = page.eval("document.querySelector('.timeline .status').textContent.match(/view (.*) – (.*)/)"
                               ".slice(1)")
            return tuple(float(v.split()[0]) * to_ns[v.split()[1]] for v in (lo, hi))

        for _ in range(40):
            if view()[1] - view()[0] < 20_000:
                break
            browser.call("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": x, "y": y, "deltaX": 0,
                                                      "deltaY": -400}, page.sid)
        lo, hi = view()
        assert hi - lo < 20_000 and lo > 150e6  # a few microseconds, late in the run
        ticks = page.eval("document.querySelector('.timeline').getAttribute('data-ticks')").split("|")
        assert len(ticks) >= 4 and len(set(ticks)) == len(ticks), ticks
        values = [float(t.split()[0]) * to_ns[t.split()[1]] for t in ticks]
        steps = {round(b - a, 3) for a, b in zip(values, values[1:])}
        assert len(steps) == 1 and lo <= values[0] and values[-1] <= hi, ticks
        keep("timeline_us_zoom", page.shot(".timeline canvas"))
        assert page.problems() == []
    finally:
        page.close()


def test_a_long_finding_is_a_thin_marker_not_a_band(browser, fixture_store, tmp_path):
    """A finding over the whole run changes the tracks by a thin line only, and shows in the
    findings row."""
    st, names = fixture_store
    rid = names["planted.sqlite"]
    t0, t1 = st.sql("SELECT min(start_ns), max(end_ns) FROM gpu_activity WHERE run_id = ?", [rid]).fetchone()
    shots = []
    for extra in (False, True):
        res = load_result(st, [rid])
        if extra:
            res.findings.append({**res.findings[0], "rule_id": "T005", "severity": "error", "finding_no": 999,
                                 "related_to": None, "start_ns": t0, "end_ns": t1, "device_id": 0, "stream_id": None,
                                 "item_kind": None, "item_id": None, "evidence": None, "fingerprint": "whole-run"})
        out = tmp_path / f"long{int(extra)}.html"
        out.write_text(html.render(st, res))
        page = browser.open(out)
        try:
            page.wait("+document.querySelector('.timeline').getAttribute('data-drawn') > 0")
            shots.append(page.shot(".timeline canvas"))
            assert page.problems() == []
        finally:
            page.close()
    before, after = shots
    keep("timeline_long_marker", after)
    header, tracks = slice(0, 22), slice(26, after.shape[0] - 28)  # report.js: HEADER_H 24, AXIS_H 26
    plot = slice(152, after.shape[1] - 2)  # right of the track labels (LABEL_W 150)
    changed = (np.abs(after[tracks, plot] - before[tracks, plot]).max(axis=2) > 8).mean()
    assert changed < 0.12, changed  # a 2-pixel line under each track, not a tint over them
    assert near(after[header, plot], ERROR_RGB, 40) > 0.8 * (plot.stop - plot.start)


def test_memory_plots_of_snapshots_and_a_timeline_stay_readable(browser, tmp_path):
    """The stacked categories of a timeline and the segment maps of a small snapshot and the
    real full-step one (1,010 segments): drawn in their colors, in rows a person can read."""
    with Store(tmp_path / "s.duckdb") as st:
        ids = [st.ingest(p).run_id for p in (TIMELINE_TRAIN, SNAPSHOT_OOM, shared_traces() / FULLSTEP)]
        out = tmp_path / "memory.html"
        out.write_text(html.render(st, load_result(st, ids)))
    page = browser.open(out)
    try:
        shots = {}
        for name, rid in zip(("timeline", "oom", "fullstep"), ids):
            page.go(f"run-{rid}")
            page.wait(f"document.getElementById('run-{rid}').offsetHeight > 0")
            label = "Memory by category" if name == "timeline" else "Segment map"
            shots[name] = page.shot(f"#run-{rid} svg.plot[aria-label^='{label}']")
            keep(f"memory_{name}", shots[name])
            if name == "fullstep":  # rows at least 16 px high on the page, the whole map on about one screen
                width, height = page.eval(f"(() => {{ const r = document.querySelector(\"#run-{rid} svg.plot[aria-label^='"
                                          f"Segment map']\").getBoundingClientRect(); return [r.width, r.height]; }})()")
                row_px = html_charts.MAP_ROW_H * width / html_charts.W
                assert width <= 1280 and row_px >= 16 and height < 1300, (width, height)
        assert page.eval("document.documentElement.scrollWidth") <= 1280

        def rgb(color: str) -> tuple[int, ...]:
            return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))

        colors = html_charts.CATEGORY_COLORS
        img = shots["timeline"]
        assert near(img, rgb(colors["activation"]), 12) > 3000 and near(img, rgb(colors["parameter"]), 12) > 3000
        assert near(img, rgb(colors["optimizer_state"]), 12) > 3000 and near(img, (0x1d, 0x23, 0x30), 30) > 30  # peak
        seg = html_charts.SEGMENT_COLORS
        for name in ("oom", "fullstep"):
            img = shots[name]
            assert near(img, rgb(seg["active_allocated"]), 12) > 5000, name
            assert near(img, rgb(seg["stranded"]), 12) > 300, name
            assert near(img, rgb(html_charts.LARGEST_FREE_COLOR), 30) > 40, name  # the largest free block marked
        assert page.problems() == []
    finally:
        page.close()


def test_a_timeline_marker_opens_its_own_findings_card(tmp_path):
    """Each finding on the timeline carries the id of its own card (`f-<run>-<i>` for a headline,
    `f-<run>-<i>-<k>` for a related finding folded inside it), and the card shows its message:
    on Rodinia's Gaussian elimination (related findings under T001's headline) every marked
    finding's card exists and is that finding's."""
    trace = shared_traces() / "nsys" / "Rodinia_Gaussian__report2.sqlite"
    out = tmp_path / "r.html"
    assert cli("check", trace, "--store", tmp_path / "s.duckdb").exit_code in (0, 1)
    assert cli("report", "--store", tmp_path / "s.duckdb", "-o", out).exit_code == 0
    page = out.read_text()
    (rid, block), = re.findall(r'<script type="application/json" id="tl-([0-9a-f]+)">(.*?)</script>', page, re.DOTALL)
    tl = json.loads(html_lib.unescape(block))
    marked = {m["f"] for m in tl["markers"]}
    assert marked
    related = 0
    for i in marked:
        f = tl["findings"][i]
        card = re.search(rf'<article class="finding[^"]*" id="f-{rid}-{re.escape(f["card"])}">.*?<p class="msg">(.*?)</p>',
                         page, re.DOTALL)
        assert card, f
        assert html_lib.unescape(card.group(1)).startswith(f["msg"].rstrip("…")[:200]), (f["card"], f["msg"])
        related += "-" in f["card"]
    assert related, "some marked findings are related ones, folded inside a headline"


def test_evidence_times_are_into_the_run_and_lengths_carry_units():
    """Evidence values named as times (`*_start_ns`, `*_end_ns`) show time into the run, as
    `start_ns` does (Falconsai's M001 peak: 1.82 ms, not 1,750,000,000 s); lengths under a bare
    `ns` key or inside a `*_ns` mapping ({cause: ns}) show a unit."""
    origin = 1_752_825_292_661_418_781
    assert ">1.82 ms<" in html._scalar("peak_allocated_start_ns", origin + 1_820_000, origin)
    assert ">562 ms<" in html._scalar("next_gpu_start_ns", 878_426_038, 316_177_721)
    assert ">66 ms<" in html._scalar("ns", 65_987_226, 0)
    table = html._ev_value("", {"cause_ns": {"sync": 13_091_201}, "cause_counts": {"sync": 4},
                               "host_calls": [{"name": "cudaLaunchKernel", "ns": 35_367_875}]}, "r", 0, False, 0)
    assert ">13.1 ms<" in table and ">35.4 ms<" in table and "<td>4</td>" in table


def test_bars_name_the_idle_cause_as_the_budget_line_does(tmp_path):
    """On a device that ran one stream the budget line says `launch latency` for the idle time
    its issued work waited; so do its bar and its per-step bars (Falconsai, one stream, with
    ProfilerSteps), never `dependency`."""
    trace = shared_traces() / "torch" / "TraceLens__h100__Falconsai_nsfw_image_detection__1016002.json.gz"
    out = tmp_path / "r.html"
    assert cli("check", trace, "--store", tmp_path / "s.duckdb").exit_code in (0, 1)
    assert cli("report", "--store", tmp_path / "s.duckdb", "-o", out).exit_code == 0
    page = out.read_text()
    line = re.search(r'<div class="line">(GPU [^<]*)</div>', page).group(1)
    assert "launch latency" in line and "dependency" not in line
    titles = re.findall(r"<title>([^<]*)</title>", page)
    steps = [t for t in titles if t.startswith("ProfilerStep#")]
    assert steps and any("launch latency" in t for t in titles)
    assert not [t for t in titles if "dependency:" in t]


def test_phase_lines_read_as_the_run_budget_line(tmp_path):
    """`summary`'s per-phase budget lines use the run's words (a one-stream device's `launch
    latency`) and order (busy parts by priority, idle by time), as the run's line does (vLLM
    full-graph decode, one stream on GPU 2)."""
    trace = shared_traces() / "torch-graphs" / "TraceLens__vllm_decode_full" / "graph_execution.json.gz"
    store = tmp_path / "s.duckdb"
    assert cli("check", trace, "--store", store).exit_code in (0, 1)
    out = cli("summary", "graph_execution.json.gz", "--store", store).stdout
    lines = [ln for ln in out.splitlines() if "GPU 2 (span" in ln]
    phases = [ln.split(": ", 1)[1] for ln in lines if ln.startswith(("decode:", "mixed:"))]
    assert phases and all("launch latency" in p and "dependency" not in p for p in phases)
    assert all(p.index("compute") < p.index("copies") for p in phases)
