"""The five core rules on real traces, against values re-derived here with sqlite3 / csv."""

from __future__ import annotations

import bisect
import csv
import json
import sqlite3
from collections import defaultdict

import pytest

from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import shared_traces


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("real") / "s.duckdb")

    def run(rel_path: str, rule: str) -> tuple[list[dict], str]:
        r = store.ingest(shared_traces() / rel_path)
        [outcome] = run_rules(store, [r.run_id], Settings(select=[rule]))
        rows = store.arrow("SELECT * FROM findings WHERE run_id = ? AND rule_id = ?", [r.run_id, rule]).to_pylist()
        for row in rows:
            row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else None
        return rows, outcome.status

    yield run
    store.close()


def _sqlite(rel_path: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{shared_traces() / rel_path}?mode=ro&immutable=1", uri=True)


# -- T001 --------------------------------------------------------------------------------

def test_t001_rodinia_gaussian_gaps_after_each_device_sync(check):
    """8190 kernels, each launched after a cudaThreadSynchronize that waits for the one before:
    each gap is split in time (one launching thread here): up to the next launch's return, the
    time in blocking calls (the sync's wait after the device went idle, and any entered before
    the launch call) and the rest (late launch), then the rest (dependency)."""
    path = "nsys/Rodinia_Gaussian__report2.sqlite"
    con = _sqlite(path)
    assert con.execute("SELECT count(DISTINCT globalTid) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] == 1
    calls = {corr: (start, end) for start, end, corr in con.execute(
        "SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME")}
    ops = con.execute("""
        SELECT deviceId, streamId, start, end, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL
        UNION ALL SELECT deviceId, streamId, start, end, correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY
        ORDER BY 1, 2, 3, 4""").fetchall()
    # blocking calls (analyses.budget.BLOCKING_CALL): synchronizes, synchronous copies and memsets
    blocking = con.execute("""
        SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
        WHERE s.value LIKE '%synchronize%'
           OR ((s.value LIKE '%memcpy%' OR s.value LIKE '%memset%') AND s.value NOT LIKE '%async%')
        ORDER BY r.start""").fetchall()
    starts, reach = [s for s, _ in blocking], []
    for _, end in blocking:  # the latest end of the calls started so far
        reach.append(max(end, reach[-1]) if reach else end)

    def blocked(a, b) -> int:
        """Time in blocking calls within [a, b]."""
        i, pieces = bisect.bisect_right(starts, b) - 1, []
        while i >= 0 and reach[i] > a:
            pieces.append((max(blocking[i][0], a), min(blocking[i][1], b)))
            i -= 1
        total, last = 0, a
        for s, e in sorted(pieces):
            if e > last:
                total, last = total + e - max(s, last), e
        return total
    per_stream = defaultdict(list)
    for dev, stream, start, end, corr in ops:
        per_stream[(dev, stream)].append((start, end, calls.get(corr)))
    # warm-up (analyses.warmup.warmup_windows): the first kernel launch call, when it takes 1 ms or more
    # and 10x the median of the later ones (the module is loaded then); a gap's time inside it
    # is left out from the gap's start (analyses.warmup.steady_start)
    launch_calls = sorted(con.execute(
        "SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        "WHERE s.value LIKE 'cudaLaunch%'").fetchall())
    first, later = launch_calls[0], sorted(e - s for s, e in launch_calls[1:])
    warm = first if first[1] - first[0] >= 1_000_000 and first[1] - first[0] >= 10 * later[len(later) // 2] else None
    assert warm is not None  # this trace's first launch takes 2.1 ms

    def steady_from(a: int, b: int) -> int:
        return a + max(0, min(b, warm[1]) - max(a, warm[0]))

    expected = {}
    for key, items in per_stream.items():
        ns = dict.fromkeys(("sync", "late_launch", "dependency", "unknown"), 0)
        counts, n, in_sync, max_end = dict.fromkeys(ns, 0), 0, 0, None
        for start, end, call in items:
            if max_end is not None and start - steady_from(max_end, start) > 5000:
                g0, g1 = steady_from(max_end, start), start
                i = bisect.bisect_right(starts, g0) - 1
                waited = reach[i] if i >= 0 else g0
                issued = min(max(call[1], waited, g0), g1) if call else None
                sync = blocked(g0, min(max(waited, call[0], g0), issued)) if call else 0
                parts = ({"sync": sync, "late_launch": issued - g0 - sync, "dependency": g1 - issued}
                         if call else {"unknown": g1 - g0})
                for cause, part in parts.items():
                    ns[cause] += part
                counts[max(parts, key=lambda c: (parts[c], -list(ns).index(c)))] += 1
                n, in_sync = n + 1, in_sync + (waited > g0)
            max_end = end if max_end is None else max(max_end, end)
        shown = [c for c in ns if ns[c] or counts[c]]
        expected[key] = (n, {c: ns[c] for c in shown}, {c: counts[c] for c in shown}, in_sync,
                         max(e for _, e, _ in items) - items[0][0])

    findings, status = check(path, "T001")
    assert status == "ran"
    streams = {(f["device_id"], f["stream_id"]): f for f in findings if f["item_kind"] == "stream"}
    busiest = max(expected, key=lambda k: expected[k][0])
    n, cause_ns, cause_counts, in_sync, span = expected[busiest]
    assert n > 8000 and in_sync > n * 0.9  # nearly every gap begins in a cudaThreadSynchronize
    f = streams[busiest]
    total = sum(cause_ns.values())
    assert f["evidence"]["count"] == n and f["evidence"]["total_ns"] == total
    assert f["evidence"]["cause_ns"] == cause_ns and f["evidence"]["cause_counts"] == cause_counts
    assert cause_ns["sync"] > 0.1 * total  # each sync holds part of its gap, the next launch more
    assert f["evidence"]["main_cause"] == "late_launch" and "mostly late launch" in f["message"]
    # A single stream: every gap is device idle time. The kernels are long, so 68 ms of gaps
    # are a small share of the 2.9 s span less its warm-up (the first launch, clipped to the span):
    # info, by the 5% / 25% thresholds.
    first_start, last_end = min(s for s, _, _ in per_stream[busiest]), max(e for _, e, _ in per_stream[busiest])
    steady = span - max(0, min(warm[1], last_end) - max(warm[0], first_start))
    assert f["evidence"]["span_ns"] == span and f["evidence"]["steady_span_ns"] == steady
    assert f["est_loss_ns"] == total and f["value"] == pytest.approx(total / steady)
    assert f["severity"] == ("info" if total / steady < 0.05 else "warning" if total / steady < 0.25 else "error")
    assert f["evidence"]["worst"][0]["gap_ns"] == f["evidence"]["max_ns"]


def test_t001_quiet_without_gaps_and_no_data_without_gpu_work(check):
    findings, status = check("torch/hta__call_stack__backward_thread.json", "T001")
    assert status == "ran" and findings == []
    for path in ("nsys/DynamicViT__nsys_profile.sqlite", "nsys/benchmarking-n-profiling__report1.sqlite",
                 "torch/hta__cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"):
        assert check(path, "T001") == ([], "no-data")


# -- T002 --------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["nsys/DLProf__nsys_profile.sqlite", "nsys/DLProf__w_Relu__nsys_profile.sqlite"])
def test_t002_dlprof_pageable_copies_exposed(check, path):
    con = _sqlite(path)
    kernels = sorted(con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall())
    union = []
    for s, e in kernels:
        if union and s <= union[-1][1]:
            union[-1][1] = max(union[-1][1], e)
        else:
            union.append([s, e])
    copies = con.execute("SELECT start, end, srcKind FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1").fetchall()
    exposed_total, pageable = 0, 0
    for s, e, src in copies:
        covered = sum(max(0, min(e, ke) - max(s, ks)) for ks, ke in union)
        exposed_total += (e - s) - covered
        pageable += src == 0
    assert pageable > 0

    findings, _ = check(path, "T002")
    [agg] = [f for f in findings if f["item_name"] == "host-to-device copies"]
    assert agg["evidence"]["copies"] == len(copies)
    assert agg["evidence"]["pageable_copies"] == pageable
    assert agg["est_loss_ns"] == exposed_total
    assert "pageable" in agg["hint"]


def test_t002_unified_memory_is_not_a_copy(check):
    path = "nsys/vectoraddition__report1.sqlite"
    n_uvm = _sqlite(path).execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 11").fetchone()[0]
    findings, _ = check(path, "T002")
    uvm = [f for f in findings if f["item_name"] == "unified-memory migrations"]
    assert n_uvm > 0 and uvm and uvm[0]["evidence"]["migrations"] == n_uvm
    explicit = [f for f in findings if f["item_name"] == "host-to-device copies"]
    assert all(f["evidence"]["copies"] < n_uvm for f in explicit)


# -- B001 / B002 (ncu raw page, B200) ----------------------------------------------------

def _raw_rows(rel_path: str) -> list[dict]:
    lines = (shared_traces() / rel_path).read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    rows = list(csv.DictReader(lines[start:]))
    return [r for r in rows if r["ID"]]  # drop the units row


FLASH = "ncu/Roofline-Analysis__decodebench__torch_sdpa_flash__gqa_bf16_b64_ctx4k_p64.ncu.csv"
CUDNN = "ncu/Roofline-Analysis__decodebench__torch_sdpa_cudnn__mqa_bf16_b128_ctx4k_p64.ncu.csv"


@pytest.mark.parametrize("path,kind", [(FLASH, "tail"), (CUDNN, "small grid")])
def test_b001_roofline_waves(check, path, kind):
    rows = _raw_rows(path)
    waves = {float(r["launch__waves_per_multiprocessor"]) for r in rows}
    assert len(waves) == 1
    [w] = waves
    findings, _ = check(path, "B001")
    [f] = findings
    # waves from the launch, exact; ncu prints them to two decimals
    r = rows[0]
    per_sm = min(float(r[f"launch__occupancy_limit_{k}"]) for k in ("registers", "shared_mem", "warps", "blocks"))
    exact = float(r["launch__grid_size"].replace(",", "")) / (float(r["launch__sm_count"]) * per_sm)
    assert f["value"] == pytest.approx(exact) and f["value"] == pytest.approx(w, abs=0.005)
    if kind == "tail":
        assert w == pytest.approx(1.73)
        assert f["evidence"]["wasted_share"] == pytest.approx((1 - (exact - 1)) / 2)
        durations = sum(float(r["gpu__time_duration.sum"].replace(",", "")) for r in rows)
        assert "usecond" in _raw_units(path)["gpu__time_duration.sum"] or durations > 0
    else:
        assert w < 1 and "under-filled" in f["message"]


def _raw_units(rel_path: str) -> dict:
    lines = (shared_traces() / rel_path).read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    rows = list(csv.DictReader(lines[start:]))
    return next(r for r in rows if not r["ID"])


def test_b002_roofline_register_and_smem_limited(check):
    rows = _raw_rows(FLASH)
    theo = float(rows[0]["sm__maximum_warps_per_active_cycle_pct"]) / 100
    limits = {k: float(rows[0][f"launch__occupancy_limit_{k}"]) for k in ("registers", "shared_mem", "warps", "blocks")}
    low = min(limits.values())
    findings, _ = check(FLASH, "B002")
    [f] = findings
    assert f["value"] == pytest.approx(theo) and theo < 0.8
    assert set(f["evidence"]["limiter"].split("+")) == {k for k, v in limits.items() if v == low}


def test_b001_b002_quiet_on_a_healthy_ncu_kernel(check):
    path = "ncu/nsightful__copy_blocked.csv"
    text = (shared_traces() / path).read_text()
    vals = {r["Metric Name"]: r["Metric Value"] for r in csv.DictReader(text.splitlines()) if r.get("Metric Name")}
    waves = float(vals["Waves Per SM"])
    assert (1 - (waves % 1)) / (int(waves) + 1) < 0.1  # the tail wastes under 10%
    assert float(vals["Theoretical Occupancy"]) >= 80
    assert float(vals["Theoretical Occupancy"]) - float(vals["Achieved Occupancy"]) <= 10
    assert check(path, "B001")[0] == []
    assert check(path, "B002")[0] == []


# -- I001 --------------------------------------------------------------------------------

def test_i001_polyfhe_stall_profiles(check):
    path = "ncu/PolyFHE__profile__evalstall-stallreason-opt.csv"
    prefix, suffix = "smsp__warp_issue_stalled_", "_per_warp_active.pct"
    per_kernel: dict[str, dict[str, float]] = defaultdict(dict)
    names = {}
    for r in csv.DictReader((shared_traces() / path).read_text().splitlines()):
        m = r["Metric Name"]
        if m.startswith(prefix) and m.endswith(suffix):
            reason = m[len(prefix):-len(suffix)]
            if reason != "selected":
                per_kernel[r["ID"]][reason] = float(r["Metric Value"].replace(",", ""))
                names[r["ID"]] = r["Kernel Name"]
    expected = {}
    for kid, prof in per_kernel.items():
        top = max(prof, key=prof.get)
        share = prof[top] / sum(prof.values())
        if share >= 0.3:
            expected[names[kid]] = (top, share)
    findings, _ = check(path, "I001")
    got = {f["item_name"]: (f["evidence"]["reason"], f["value"]) for f in findings}
    assert set(got) == set(expected) and len(got) > 50
    for name, (reason, share) in expected.items():
        assert got[name][0] == reason and got[name][1] == pytest.approx(share, rel=1e-9)
    assert {r for r, _ in got.values()} >= {"long_scoreboard"}


def test_i001_no_data_without_stall_metrics(check):
    for path in (FLASH, "nsys/Rodinia_Gaussian__report2.sqlite", "torch/hta__trace_compare__base__base.json.gz"):
        assert check(path, "I001") == ([], "no-data")


def test_t002_loss_is_at_most_the_kernel_time_that_could_hide_the_copies(check):
    """nsys-ai's 2-GPU fixture: 921 ms of exposed copies per device, ~22 ms of kernels to hide
    them behind. Overlap could save the kernel time at most, so that is the estimated loss."""
    rows, status = check("nsys/nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite", "T002")
    copies = [f for f in rows if f["item_name"] == "host-to-device copies"]
    assert status == "ran" and len(copies) == 2
    for f in copies:
        ev = f["evidence"]
        assert f["est_loss_ns"] == ev["kernel_ns"] < ev["exposed_ns"] / 10
