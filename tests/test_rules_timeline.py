"""Timeline rules T003-T008: fixture regeneration, and the rules on real traces against values
re-derived here from the files themselves (sqlite3 / json / csv), not from the store."""

from __future__ import annotations

import bisect
import csv
import functools
import gzip
import json
import math
import re
import sqlite3
import sys
from collections import defaultdict

import pytest

from traceanalyzer.rules import get_rule
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES, shared_traces

sys.path.insert(0, str(FIXTURES))
import gen_timeline  # noqa: E402


def test_fixtures_regenerate_byte_identical(tmp_path):
    if not gen_timeline.gn.SCHEMA_DIR.exists():
        pytest.skip(f"{gen_timeline.gn.SCHEMA_DIR} missing")
    written = gen_timeline.write_all(tmp_path)
    assert len(written) == len(gen_timeline.outputs())
    for new in written:
        rel = new.relative_to(tmp_path)
        assert new.read_bytes() == (FIXTURES / rel).read_bytes(), rel


def test_planted_facts_are_what_the_fixtures_hold():
    """The generator's reference numbers, re-read from the written nsys file."""
    facts = gen_timeline.PLANTED["nsys/timeline_sync.sqlite"]
    con = sqlite3.connect(f"file:{FIXTURES / 'nsys/timeline_sync.sqlite'}?mode=ro", uri=True)
    busy = gen_timeline.union(con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
                              "SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchall())
    assert busy[-1][1] - busy[0][0] == facts["active_span_ns"]
    n_small_d2d = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 8 AND bytes < 65536")
    assert n_small_d2d.fetchone()[0] == facts["T006"]["small_d2d"]["copies"]


# -- store and helpers ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def check(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("timeline") / "s.duckdb")

    def run(rel_path: str, rule: str, **thresholds) -> tuple[list[dict], str]:
        r = store.ingest(shared_traces() / rel_path)
        [outcome] = run_rules(store, [r.run_id], Settings(select=[rule], thresholds={rule: thresholds}))
        rows = store.arrow("SELECT * FROM findings WHERE run_id = ? AND rule_id = ?", [r.run_id, rule]).to_pylist()
        for row in rows:
            row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else None
        return rows, outcome.status

    run.store = store
    yield run
    store.close()


def _sqlite(rel_path: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{shared_traces() / rel_path}?mode=ro&immutable=1", uri=True)


def _idle_after(t: int, busy: list[tuple[int, int]], ends: list[int]) -> int | None:
    i = bisect.bisect_right(ends, t)
    return None if i == len(busy) else max(0, busy[i][0] - t)


def _host_after(waits: list[int], busy: list[tuple[int, int]], ends: list[int], issued: dict) -> int:
    """The GPU idle after each wait's end `t` up to the return of the launch call of the work
    that ends it (`issued`: busy start -> that call's end, None without a call), counted once
    per idle stretch, after the last wait in it: the budget's host idle after the waits."""
    last: dict[int, int] = {}
    for t in waits:
        i = bisect.bisect_right(ends, t)
        if i < len(busy) and busy[i][0] > t:
            last[i] = max(last.get(i, t), t)
    return sum(min(max(issued[busy[i][0]], t), busy[i][0]) - t for i, t in last.items() if issued[busy[i][0]] is not None)


def _first_launch(ops) -> dict:
    """start -> the end of the launch call that started first among the operations starting
    then (`ops`: (start, call start or None, call end or None)); None where the first has none."""
    out: dict = {}
    for start, call_start, call_end in sorted(ops, key=lambda o: (o[0], o[1] is None, o[1] or 0)):
        out.setdefault(start, call_end if call_start is not None else None)
    return out


def _nsys_issued(con) -> dict:
    calls = {c: (s, e) for _, s, e, c in _nsys_calls(con)}
    ops = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if con.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", [table]).fetchone()[0]:
            for start, corr in con.execute(f'SELECT start, correlationId FROM {table} WHERE NOT (start = 0 AND "end" = 0)'):
                ops.append((start, *calls.get(corr, (None, None))))
    return _first_launch(ops)


def _nsys_busy(con) -> list[tuple[int, int]]:
    ops = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if con.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", [table]).fetchone()[0]:
            ops += con.execute(f'SELECT start, "end" FROM {table} WHERE NOT (start = 0 AND "end" = 0)').fetchall()
    return gen_timeline.union(ops)


def _nsys_calls(con) -> list[tuple[str, int, int, int]]:
    """(name without _vNNNN, start, end, correlationId) of every runtime/driver call."""
    rows = con.execute("SELECT s.value, r.start, r.end, r.correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                       "JOIN StringIds s ON s.id = r.nameId").fetchall()
    return [(re.sub(r"_v\d+$", "", n), s, e, c) for n, s, e, c in rows]


@functools.lru_cache(maxsize=4)
def _kineto(rel_path: str) -> tuple[dict, list[dict]]:
    path = shared_traces() / rel_path
    raw = path.read_bytes()
    data = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    base = data.get("baseTimeNanoseconds", 0)
    events = []
    for e in data["traceEvents"]:
        if e.get("ph") == "X" and "ts" in e and "dur" in e:
            ts = float(e["ts"])
            whole = math.floor(ts)  # Kineto µs -> ns as formats.md 4.6 says: base + round(ts * 1000)
            start = base + whole * 1000 + round((ts - whole) * 1000)
            events.append({**e, "start": start, "end": start + round(float(e["dur"]) * 1000)})
    return data, events


def _steady(check, finding: dict, span: int, across: bool = False) -> int:
    """`span` less its time inside the run's merged warm-up windows (the finding's device's, or
    every device's with `across`): what a timeline rule's share is of. The windows are the store's
    (tests/test_warmup.py checks them); the span is recomputed from the raw file."""
    warm = check.store.sql("SELECT coalesce(sum(end_ns - start_ns), 0) FROM run_warmup_merged('warmup_windows', $a) "
                           "WHERE run_id = $r AND ($a OR device_id = coalesce($d, -1))",
                           {"r": finding["run_id"], "a": across, "d": finding["device_id"]}).fetchone()[0]
    assert finding["evidence"].get("steady_span_ns") == span - warm
    return span - warm


def _severity(share: float, warning: float, error: float) -> str:
    return "error" if share >= error else "warning" if share >= warning else "info"


# -- T003 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path,name", [("nsys/OpenACC_PolPuig__report12.sqlite", "cuStreamSynchronize"),
                                       ("nsys/Rodinia_Gaussian__report2.sqlite", "cudaThreadSynchronize")])
def test_t003_nsys_sync_loops(check, path, name):
    con = _sqlite(path)
    busy = _nsys_busy(con)
    ends = [e for _, e in busy]
    calls = [c for c in _nsys_calls(con) if c[0] == name]
    blocked = sum(e - s for _, s, e, _ in calls)
    idle = sum(_idle_after(e, busy, ends) or 0 for _, s, e, _ in calls)
    host = _host_after([e for _, _, e, _ in calls], busy, ends, _nsys_issued(con))
    span = busy[-1][1] - busy[0][0]
    loss = min(blocked, host)
    assert len(calls) > 1900

    findings, status = check(path, "T003")
    assert status == "ran"
    [f] = [f for f in findings if f["item_name"].startswith(name)]
    ev = f["evidence"]
    # the host idle inside warm-up windows (here a lazy module load) is kept apart in warmup_ns
    assert (ev["calls"], ev["blocked_ns"], ev["idle_after_ns"], ev["host_idle_ns"] + ev["warmup_ns"]) == (
        len(calls), blocked, idle, host)
    loss = min(blocked, host - ev["warmup_ns"])
    # the share is of the steady span: the warm-up windows' time is left out of it as of the idle
    assert ev["span_ns"] == span
    steady = _steady(check, f, span)
    assert f["est_loss_ns"] == loss and f["value"] == pytest.approx(loss / steady)
    assert f["severity"] == _severity(loss / steady, 0.05, 0.25)
    # every other blocking call hides less than 1% of the span: only this group is reported
    assert len(findings) == 1


def test_t003_kineto_stream_syncs(check):
    path = "torch/TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz"
    _, ev = _kineto(path)
    busy = gen_timeline.union((e["start"], e["end"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    ends = [e for _, e in busy]
    syncs = [e for e in ev if e.get("cat") == "cuda_runtime" and e["name"] == "cudaStreamSynchronize"]
    blocked = sum(e["end"] - e["start"] for e in syncs)
    idle = sum(_idle_after(e["end"], busy, ends) or 0 for e in syncs)
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    ops = [(e["start"], *((calls[c]["start"], calls[c]["end"]) if (c := e["args"].get("correlation")) in calls else (None, None)))
           for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    host = _host_after([e["end"] for e in syncs], busy, ends, _first_launch(ops))
    findings, _ = check(path, "T003")
    [f] = [f for f in findings if f["item_name"].startswith("cudaStreamSynchronize")]
    assert f["evidence"]["calls"] == len(syncs) == 80
    assert (f["evidence"]["blocked_ns"], f["evidence"]["idle_after_ns"], f["evidence"]["host_idle_ns"]) == (blocked, idle, host)
    assert f["est_loss_ns"] == min(blocked, host)
    assert f["value"] == pytest.approx(min(blocked, host) / _steady(check, f, busy[-1][1] - busy[0][0]))


def test_t003_quiet_and_no_data(check):
    # one device sync at the end of a benchmark, nothing queued after it: quiet
    assert check("nsys/CSC746CUDALab__report1.sqlite", "T003") == ([], "ran")
    assert check("torch/hta__cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", "T003") == ([], "no-data")


# -- T004 ----------------------------------------------------------------------------------

def _is_blocking(name: str) -> bool:
    """analyses.budget.BLOCKING_CALL: a synchronize, or a copy or memset call that is not Async."""
    n = name.lower()
    return "synchronize" in n or (("memcpy" in n or "memset" in n) and "async" not in n)


def _union_in(intervals, a, b) -> int:
    """The length of the union of `intervals` within [a, b]."""
    return sum(e - s for s, e in gen_timeline.union((max(s, a), min(e, b)) for s, e in intervals if s < b and e > a))


def _host_bound(ops, calls, host, min_ns=100_000):
    """Host-bound stretches of one device, re-derived: (start, end of the host part, host time,
    the activity named). `ops`: (start, end, call key or None) of its GPU operations; `calls`:
    {key: (name, start, end, tid)} of the API calls; `host`: (name, start, end, tid, kind) of the
    host events (ranges without ProfilerStep#N).

    A GPU-idle stretch's host part runs up to the return of the launch call of the operation
    ending it (the first launched of those starting then); its host time is that less the time
    any thread was in a blocking call. Its work: the host events outside blocking calls."""
    busy = gen_timeline.union((s, e) for s, e, _ in ops)
    at = defaultdict(list)
    for s, _, key in ops:
        at[s].append(key)
    waits = [(s, e) for name, s, e, _ in calls.values() if _is_blocking(name)]
    out = []
    for s0, e0 in ((a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] >= min_ns):
        linked = [calls[k] for k in at[e0] if k in calls]
        if not linked:
            continue
        _, c_start, c_end, _ = min(linked, key=lambda c: c[1])
        issued = min(max(c_end, s0), e0)
        host_ns = issued - s0 - _union_in(waits, s0, issued)
        if host_ns < min_ns or host_ns <= 0:
            continue
        near = [h for h in host if h[1] < issued and h[2] > s0]

        def work(a, b):
            return b - a - _union_in(waits, a, b)

        total = sum(work(a, b) for a, b in gen_timeline.union((max(h[1], s0), min(h[2], issued)) for h in near))
        mine = [(h, work(max(h[1], s0), min(h[2], issued))) for h in near]
        mine = [(h, w) for h, w in mine if w > 0]
        if not mine or total < 0.5 * host_ns:
            continue
        half = [(h, w) for h, w in mine if w >= total / 2]
        main, own = min(half, key=lambda x: x[0][2] - x[0][1]) if half else max(mine, key=lambda x: x[1])
        out.append((s0, issued, host_ns, re.sub(r"([#\s_:.-])\d+$", r"\1N", main[0]), min(own, host_ns)))
    return out


def _top(bound) -> str:
    """The activity with the most work of its own in the stretches it is the activity of."""
    by_name = defaultdict(int)
    for _, _, _, name, own in bound:
        by_name[name] += own
    return max(by_name, key=by_name.get)


def test_t004_nsys_power_iteration(check):
    path = "nsys/nsightful__power_iteration__baseline.sqlite"
    con = _sqlite(path)
    assert con.execute("SELECT count(DISTINCT deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == 1
    calls = {c: (re.sub(r"_v\d+$", "", n), s, e, t) for n, s, e, c, t in con.execute(
        "SELECT st.value, r.start, r.end, r.correlationId, r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "JOIN StringIds st ON st.id = r.nameId")}
    ops = con.execute("SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
                      "SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchall()
    if con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_MEMSET'").fetchone()[0]:
        ops += con.execute("SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchall()
    host = [(n, s, e, t, "call") for n, s, e, t in calls.values() if e > s]
    host += [(n, s, e, t, "range") for n, s, e, t in con.execute(
        """SELECT coalesce(n.text, s.value), n.start, n."end", n.globalTid FROM NVTX_EVENTS n
           LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (59, 60) AND n."end" > n.start""")]
    bound = _host_bound(ops, calls, host)
    # the share is of the GPU's span: its first operation to its last (one device)
    busy = _nsys_busy(con)
    span = busy[-1][1] - busy[0][0]
    findings, _ = check(path, "T004")
    [f] = findings
    total = sum(ns for _, _, ns, _, _ in bound)
    assert f["evidence"]["stretches"] == len(bound) > 40 and f["est_loss_ns"] == total
    assert f["evidence"]["top_activity"][0]["name"] == _top(bound) == "IO N"
    # the NVTX ranges "IO 0", "IO 10", ...: the message says what "IO N" is
    assert f["message"].endswith('most of it in range "IO N" (N: any number)')
    steady = _steady(check, f, span, across=True)
    assert f["value"] == pytest.approx(total / steady) and f["severity"] == _severity(total / steady, 0.05, 0.25)


def test_t004_kineto_dataloader(check):
    path = "torch/TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz"
    _, ev = _kineto(path)
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len({e["args"].get("device") for e in gpu}) == 1
    ops = [(e["start"], e["end"], e["args"].get("correlation")) for e in gpu]
    calls = {e["args"]["correlation"]: (e["name"], e["start"], e["end"], (e["pid"], e["tid"])) for e in ev
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    host = [(e["name"], e["start"], e["end"], (e["pid"], e["tid"]), "range" if e["cat"] == "user_annotation" else "op")
            for e in ev if e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
            and e["end"] > e["start"] and not re.match(r"ProfilerStep#\d+$", e["name"])]
    bound = _host_bound(ops, calls, host)
    findings, _ = check(path, "T004")
    [f] = findings
    assert f["evidence"]["stretches"] == len(bound) and f["est_loss_ns"] == sum(ns for _, _, ns, _, _ in bound)
    assert f["evidence"]["top_activity"][0]["name"] == _top(bound) == \
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def test_t004_quiet_and_no_data(check):
    path = "torch/TraceLens__mi210__gpu_only_trace__gpu_only_trace.json.gz"
    _, ev = _kineto(path)
    ops = [(e["start"], e["end"], e["args"].get("correlation")) for e in ev if e.get("cat") == "kernel"]
    calls = {e["args"]["correlation"]: (e["name"], e["start"], e["end"], e["tid"]) for e in ev
             if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    host = [(n, s, e, t, "call") for n, s, e, t in calls.values() if e > s]
    assert host and _host_bound(ops, calls, host) == []  # launch calls only, never covering an idle stretch
    assert check(path, "T004") == ([], "ran")
    assert check("nsys/DynamicViT__nsys_profile.sqlite", "T004") == ([], "no-data")


# -- T005 ----------------------------------------------------------------------------------

def test_t005_nsys_one_block_kernel_keeps_a_busy_gpu_nearly_empty(check):
    path = "nsys/hpc_assignment3__report3.sqlite"
    con = _sqlite(path)
    busy = _nsys_busy(con)  # (its span is the device's, copies included; the busy share is its kernels')
    sms = con.execute("SELECT smCount FROM TARGET_INFO_GPU").fetchone()[0]
    kernels = con.execute('SELECT "end" - start, gridX * gridY * gridZ FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall()
    fill = sum(d * min(1.0, g / sms) for d, g in kernels) / sum(d for d, _ in kernels)
    kernel_busy = gen_timeline.union(con.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall())
    busy_share = sum(e - s for s, e in kernel_busy) / (busy[-1][1] - busy[0][0])
    assert busy_share > 0.9 and fill < 0.05
    findings, _ = check(path, "T005")
    [f] = findings
    assert f["item_name"] == "busy, low estimated occupancy"
    assert f["evidence"]["busy_share"] == pytest.approx(busy_share)
    # With the compute capability known (H100 PCIe, CC 9.0) the occupancy calculator gives the
    # estimate; it can only be at or below the SM-fill bound, which ignores warps per SM.
    assert f["evidence"]["estimate_sources"] == ["calculator"] and "about" in f["message"]
    assert f["value"] <= fill and f["value"] < 0.01


def _ncu_rows(rel_path: str) -> list[dict]:
    lines = (shared_traces() / rel_path).read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    return list(csv.DictReader(lines[start:]))


def test_t005_ncu_speed_of_light(check):
    path = "ncu/XPlacer__gaussian__nsight_gaussian_16.log"
    scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6}
    per = defaultdict(dict)
    for r in _ncu_rows(path):
        value = float(r["Metric Value"].replace(",", ""))
        if r["Metric Name"] == "Duration":
            per[r["ID"]]["dur"] = value * scale[r["Metric Unit"]]
        elif r["Metric Name"] in ("SM [%]", "Memory [%]"):
            per[r["ID"]][r["Metric Name"]] = value
    sol = sum(k["dur"] * max(k["SM [%]"], k["Memory [%]"]) for k in per.values()) / sum(k["dur"] for k in per.values())
    findings, _ = check(path, "T005")
    [f] = findings
    assert f["value"] == pytest.approx(sol) and sol < 1
    assert f["evidence"]["launches"] == len(per) == 27 and f["evidence"]["launches_below"] == 27


def test_t005_quiet_and_no_data(check):
    copy = "ncu/nsightful__copy_blocked.csv"
    pct = {r["Metric Name"]: float(r["Metric Value"]) for r in csv.DictReader((shared_traces() / copy).read_text().splitlines())
           if r.get("Metric Unit") == "%"}
    assert max(pct["Memory Throughput"], pct["Compute (SM) Throughput"]) >= 60  # a memory-bound copy near its limit
    assert check(copy, "T005") == ([], "ran")
    assert check("ncu/PolyFHE__profile__evalstall-stallreason-opt.csv", "T005") == ([], "no-data")
    # power iteration: busy 63% of its span, under the 70% gate
    assert check("nsys/nsightful__power_iteration__baseline.sqlite", "T005") == ([], "ran")


# -- T006 ----------------------------------------------------------------------------------

def test_t006_nsys_power_iteration_reads_back_every_iteration(check):
    path = "nsys/nsightful__power_iteration__baseline.sqlite"
    con = _sqlite(path)
    busy = _nsys_busy(con)
    ends = [e for _, e in busy]
    calls = {c: (n, s, e) for n, s, e, c in _nsys_calls(con)}
    d2h = con.execute('SELECT correlationId, start, "end", bytes, dstKind FROM CUPTI_ACTIVITY_KIND_MEMCPY '
                      "WHERE copyKind = 2").fetchall()
    pageable = [r for r in d2h if r[4] == 0]
    waited = [(calls[c][1], calls[c][2]) for c, _, end, _, _ in d2h if calls[c][2] >= end]  # blocking calls
    assert len(waited) == len(d2h) == len(pageable) == 89
    wait = sum(e - s for s, e in waited)
    idle = sum(_idle_after(e, busy, ends) or 0 for _, e in waited)
    findings, _ = check(path, "T006")
    by = {f["item_name"]: f for f in findings}
    w = by["DtoH copies the host waits on"]
    assert (w["evidence"]["copies"], w["evidence"]["wait_ns"], w["evidence"]["idle_after_ns"]) == (89, wait, idle)
    assert w["est_loss_ns"] == min(wait, idle) and w["evidence"]["how"] == {"blocking async call": 89}
    assert w["severity"] == _severity(min(wait, idle) / (busy[-1][1] - busy[0][0]), 0.0, 0.25)
    assert by["pageable DtoH copies"]["value"] == 89
    assert by["pageable DtoH copies"]["evidence"]["bytes"] == sum(r[3] for r in pageable)
    assert by["small DtoH copies"]["value"] == sum(r[3] < 65536 for r in d2h)


def test_t006_reads_t002s_small_copy_and_batch_thresholds(check):
    """One setting for both rules: T002 owns small_copy_bytes and the batch thresholds, T006 reads them."""
    t002, t006 = get_rule("T002"), get_rule("T006")
    settings = Settings(thresholds={"T002": {"small_copy_bytes": "4096", "min_batch_count": 3}})
    for rule in (t002, t006):
        p = settings.params_for(rule)
        assert (p["small_copy_bytes"], p["min_batch_count"], p["max_batch_gap_ns"]) == (4096, 3, 100000)
    assert Settings().params_for(t006)["small_copy_bytes"] == 65536
    with pytest.raises(ValueError, match=r"T006 reads T002's threshold 'small_copy_bytes': set T002\.small_copy_bytes"):
        Settings(thresholds={"T006": {"small_copy_bytes": 1}}).params_for(t006)
    # through the engine: with T002's small_copy_bytes at 0 no copy is small for T006 either
    path = "nsys/nsightful__power_iteration__baseline.sqlite"
    r = check.store.ingest(shared_traces() / path)
    run_rules(check.store, [r.run_id], Settings(select=["T006"], thresholds={"T002": {"small_copy_bytes": 0}}))
    items = {i for (i,) in check.store.sql("SELECT item_name FROM findings WHERE run_id = ? AND rule_id = 'T006'",
                                           [r.run_id]).fetchall()}
    assert "pageable DtoH copies" in items and not any(i.startswith("small ") for i in items)
    assert "small DtoH copies" in {f["item_name"] for f in check(path, "T006")[0]}  # with the defaults


def test_t006_quiet_on_large_pinned_copies(check):
    # vectorAdd on streams: 400 KB pinned copies, no host waits on them
    assert check("nsys/gpu4__report2.sqlite", "T006") == ([], "ran")
    assert check("nsys/uvmTorch__report1.sqlite", "T006") == ([], "no-data")


# -- T007 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["torch/hta__timeline_analysis__sampled_rank-0.json.gz",
                                  "torch/hta__negative_queue_length_values_check__rank0.json.gz"])
def test_t007_exposed_nccl(check, path):
    data, ev = _kineto(path)
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    comm = gen_timeline.union((k["start"], k["end"]) for k in kernels if "nccl" in k["name"].lower())
    compute = gen_timeline.union((k["start"], k["end"]) for k in kernels if "nccl" not in k["name"].lower())
    busy = gen_timeline.union((e["start"], e["end"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    total = sum(e - s for s, e in comm)
    over = sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in comm for s2, e2 in compute)
    exposed, span = total - over, busy[-1][1] - busy[0][0]
    findings, _ = check(path, "T007")
    [f] = findings
    assert f["evidence"]["collective_ns"] == total and f["est_loss_ns"] == exposed
    assert f["evidence"]["rank"] == data["distributedInfo"]["rank"]
    assert f["value"] == pytest.approx(exposed / span)
    if "sampled" in path:  # a sampled trace (T010): the compute beside the collectives may be what it dropped
        assert f["evidence"]["cause"] == "unknown" and f["severity"] == "info"
    else:
        assert f["severity"] == _severity(exposed / span, 0.0, 0.25) and "cause" not in f["evidence"]


@pytest.mark.parametrize("layout, exposed_us", [
    ("one stream, in order", 10),           # the copy sits between two kernels: nothing hides it
    ("one stream, overlapping records", 5),  # a broken trace: the kernel's record overlaps the copy's
    ("copy on its own stream", 5),          # a kernel on another stream hides half of it
])
def test_t002_exposed_time_by_stream_layout(tmp_path, layout, exposed_us):
    """T002 skips the overlap lookup for copies on a device's only kernel stream when that
    stream's records never overlap (a stream runs its work in order); a trace whose records do
    overlap there, or a copy on another stream, is looked up."""
    def op(cat, name, stream, ts, dur, corr, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                "args": {"device": 0, "stream": stream, "correlation": corr, **args}}
    first_end = {"one stream, overlapping records": 25.0}.get(layout, 20.0)
    copy_stream = 8 if layout == "copy on its own stream" else 7
    copy_start = 15.0 if layout == "copy on its own stream" else 20.0
    path = tmp_path / "t002.json"
    path.write_text(json.dumps({"traceEvents": [
        op("kernel", "gemm_a", 7, 10.0, first_end - 10.0, 1),
        op("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", copy_stream, copy_start, 10.0, 2, bytes=1 << 20),
        op("kernel", "gemm_b", 7, 30.0, 10.0, 3)]}))
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(path).run_id
        run_rules(st, [run_id], Settings(select=["T002"]))
        [(evidence,)] = st.sql("SELECT evidence FROM findings WHERE rule_id = 'T002' "
                               "AND item_name = 'host-to-device copies'").fetchall()
    assert json.loads(evidence)["exposed_ns"] == exposed_us * 1000


def test_t007_worst_kernel_is_one_kernel_when_exposures_tie(tmp_path):
    """Two all-reduces start together and are exposed alike (600 us each: one is 1 ms long with
    400 us under a GEMM, the other 600 us long): the finding's kernel id, start and end are those
    of one kernel, the lower id, as are the evidence's first example's."""
    def kernel(name, stream, ts, dur, corr):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                "args": {"device": 0, "stream": stream, "correlation": corr}}
    path = tmp_path / "tie.json"
    path.write_text(json.dumps({"traceEvents": [
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 7, 10000.0, 1000.0, 1),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 8, 10000.0, 600.0, 2),
        kernel("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n", 9, 10600.0, 500.0, 3)]}))
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(path).run_id
        run_rules(st, [run_id], Settings(select=["T007"]))
        ids = dict(st.sql("SELECT stream_id, kernel_id FROM kernels WHERE stream_id IN (7, 8)").fetchall())
        spans = {k: (s, e) for k, s, e in st.sql("SELECT kernel_id, start_ns, end_ns FROM kernels").fetchall()}
        [(item_id, start, end, evidence)] = st.sql(
            "SELECT item_id, start_ns, end_ns, evidence FROM findings WHERE rule_id = 'T007'").fetchall()
    first = min(ids.values())
    assert item_id == first and (start, end) == spans[first]
    worst = json.loads(evidence)["worst"]
    assert [w["exposed_ns"] for w in worst] == [600_000, 600_000] and worst[0]["kernel_id"] == first


def test_t007_no_data_without_collectives(check):
    assert check("nsys/Rodinia_Gaussian__report2.sqlite", "T007") == ([], "no-data")


# -- T008 ----------------------------------------------------------------------------------

SAMPLED = ["torch/hta__timeline_analysis__sampled_rank-0.json.gz", "torch/hta__trace_filter__sampled_rank-1.json.gz"]


def _comm_per_step(rel_path: str) -> tuple[int, float, float]:
    """rank, NCCL kernel time per ProfilerStep (by launch call) and mean step duration."""
    data, ev = _kineto(rel_path)
    steps = sorted((e["start"], e["end"], e["name"]) for e in ev
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    launched = {e["args"]["correlation"]: e["start"] for e in ev
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    per_step = defaultdict(list)
    for k in ev:
        if k.get("cat") == "kernel" and "nccl" in k["name"].lower():
            t = launched.get(k["args"].get("correlation"), k["start"])
            step = next((n for s, e, n in steps if s <= t <= e), None)
            if step:
                per_step[step].append((k["start"], k["end"]))
    comm = sum(sum(e - s for s, e in gen_timeline.union(v)) for v in per_step.values()) / len(steps)
    return data["distributedInfo"]["rank"], comm, sum(e - s for s, e, _ in steps) / len(steps)


def test_t008_real_two_rank_job(check, monkeypatch):
    store = check.store
    ids = [store.ingest(shared_traces() / p).run_id for p in SAMPLED]
    ranks = {r: (c, s) for r, c, s in map(_comm_per_step, SAMPLED)}
    straggler = min(ranks, key=lambda r: ranks[r][0])
    lag = (ranks[0][0] + ranks[1][0]) / 2 - ranks[straggler][0]
    median_step = (ranks[0][1] + ranks[1][1]) / 2
    # at the default 5% the imbalance (under 1% of a step) is quiet
    assert lag / median_step < 0.05
    outcomes = run_rules(store, ids, Settings(select=["T008"]))
    assert [o.status for o in outcomes] == ["ran", "ran"] and sum(o.findings for o in outcomes) == 0
    outcomes = run_rules(store, ids, Settings(select=["T008"], thresholds={"T008": {"min_lag_share": 0.001}}))
    [f] = store.arrow("SELECT * FROM findings WHERE rule_id = 'T008' AND list_contains(?, run_id)", [ids]).to_pylist()
    ev = json.loads(f["evidence"])
    assert f["run_id"] == ids[straggler] and ev["straggler_rank"] == straggler == 1
    assert ev["lag_ns"] == pytest.approx(lag) and f["value"] == pytest.approx(lag / median_step)
    assert {r["rank"]: r["comm_ns"] for r in ev["ranks"]} == pytest.approx({r: c for r, (c, _) in ranks.items()})

    # Alone, a cross-run rule builds no per-run cache (scan's last pass over hundreds of runs),
    # and finds what it finds beside every per-run rule.
    from traceanalyzer.store import run_cache

    cached = []
    real_scope = run_cache.scoped_to_run

    def scope(con, run_id, *a, **k):
        cached.append(run_id)
        return real_scope(con, run_id, *a, **k)

    monkeypatch.setattr(run_cache, "scoped_to_run", scope)
    low = {"T008": {"min_lag_share": 0.001}}
    alone = run_rules(store, ids, Settings(select=["T008"], thresholds=low))
    assert cached == [] and [(o.status, o.findings) for o in alone] == [("ran", 0), ("ran", 1)]
    found = store.arrow("SELECT * FROM findings WHERE rule_id = 'T008'").to_pylist()
    every = run_rules(store, ids, Settings(thresholds=low))
    assert cached == ids
    assert [(o.status, o.findings) for o in every if o.rule_id == "T008"] == [("ran", 0), ("ran", 1)]
    assert store.arrow("SELECT * FROM findings WHERE rule_id = 'T008'").to_pylist() == found


def test_t008_no_data_for_single_rank_runs(check):
    # rank without a world size, and no rank at all
    assert check("torch/hta__critical_path__cuda_event_sync__event_sync_trace.json.gz", "T008") == ([], "no-data")
    assert check("nsys/Rodinia_Gaussian__report2.sqlite", "T008") == ([], "no-data")
    # one rank of a job of 128, checked alone: no other rank to compare it with
    assert check(SAMPLED[0], "T008") == ([], "no-data")


def test_t008_no_data_for_a_rank_whose_job_has_no_other_rank_given(tmp_path):
    """A run of a multi-rank job is judged only beside another rank of its job: alone, or beside
    ranks of another job, T008 has no data for it (not a clean "ran")."""
    job = [FIXTURES / "kineto" / f"timeline_rank{r}.json" for r in range(4)]
    lone = FIXTURES / "kineto" / "timeline_balanced_rank0.json"  # rank 0 of a job of 2
    with Store(tmp_path / "s.duckdb") as store:
        ids = [store.ingest(p).run_id for p in [*job, lone]]
        [alone] = run_rules(store, [ids[2]], Settings(select=["T008"]))
        assert (alone.status, alone.findings, alone.note) == ("no-data", 0, f"needs {get_rule('T008').requires}")
        outcomes = run_rules(store, ids, Settings(select=["T008"]))
        assert [(o.status, o.findings) for o in outcomes] == [("ran", 0), ("ran", 0), ("ran", 1), ("ran", 0),
                                                              ("no-data", 0)]


def test_t008_jobs_are_split_by_world_size_and_time():
    """Runs of one job share a world size and, on a wall clock, overlap in time; on per-capture
    clocks the file name (digits aside) decides."""
    import pandas as pd

    from traceanalyzer.rules.T008_straggler_rank import _jobs

    runs = pd.DataFrame([
        # job A: ranks 0-1 of world 2, overlapping
        ("a0", "job_rank0.json", 0, 2, "unix-epoch", 100, 200),
        ("a1", "job_rank1.json", 1, 2, "unix-epoch", 150, 260),
        # same world size an hour later: another job
        ("b0", "job_rank0.json", 0, 2, "unix-epoch", 10_000, 10_100),
        ("b1", "job_rank1.json", 1, 2, "unix-epoch", 10_050, 10_150),
        # world size 4, only one rank traced: no job
        ("c0", "big_rank0.json", 0, 4, "unix-epoch", 100, 200),
        # per-capture clocks: grouped by file name up to digits
        ("d0", "run_r0.json", 0, 2, "kineto-relative", 0, 50),
        ("d1", "run_r1.json", 1, 2, "kineto-relative", 0, 60),
    ], columns=["run_id", "file_name", "rank", "world_size", "clock", "run_start_ns", "run_end_ns"])
    jobs = sorted(sorted(j["run_id"]) for j in _jobs(runs))
    assert jobs == [["a0", "a1"], ["b0", "b1"], ["d0", "d1"]]


def test_t004_never_credits_an_activity_with_more_time_than_it_ran(real_corpus):
    """On every real trace, the time T004 gives a host activity (`top_activity[].ns`) is at most
    the time all events of that name ran: its own work in the stretches, not theirs (MI250 minitoy:
    aten::zeros_like ran 200 us in all and was credited the 308 us stretch it was the most of)."""
    rows = real_corpus.sql("SELECT run_id, evidence FROM findings WHERE rule_id = 'T004'").fetchall()
    assert rows
    for run_id, evidence in rows:
        for act in json.loads(evidence)["top_activity"]:
            table = {"cpu_op": "cpu_ops", "range": "ranges", "api_call": "api_calls"}[act["kind"]]
            (ran,) = real_corpus.sql(
                f"SELECT sum(end_ns - start_ns) FROM {table} WHERE run_id = $r AND end_ns > start_ns "
                r"AND regexp_replace(normalized_name(name), '([#\s_:.-])\d+$', '\1N') = $n",
                {"r": run_id, "n": act["name"]}).fetchone()
            assert act["ns"] <= ran, (run_id, act, ran)
