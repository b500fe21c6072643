"""The time budget (views `time_budget`, `run_time_budget`): every nanosecond of a device's span
counted once, idle time by cause; planted to the nanosecond, and invariants on every real trace
against an independent sweep in Python."""

from __future__ import annotations

import bisect
import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from traceanalyzer.cli import app
from traceanalyzer.ingest.base import ParsedTrace
from traceanalyzer.analyses.budget import BLOCKING_CALL, COMM_PATTERN, IDLE_CAUSES
from traceanalyzer.store import Store, budget_rows
from traceanalyzer.store.run_policy import RunPolicy

from .conftest import FIXTURES, shared_traces

US = 1_000


def _trace(kernels=(), copies=(), memsets=(), calls=()) -> ParsedTrace:
    """kernels: (name, stream, start, end, call); copies/memsets: (stream, start, end, call);
    calls: (name, tid, start, end). Times in us; call is an index into `calls` or None."""
    tables = {}
    if kernels:
        tables["kernels"] = pa.table({
            "kernel_id": list(range(len(kernels))), "device_id": [0] * len(kernels),
            "name": [k[0] for k in kernels], "stream_id": [k[1] for k in kernels],
            "start_ns": [k[2] * US for k in kernels], "end_ns": [k[3] * US for k in kernels],
            "launch_call_id": [k[4] for k in kernels], "pid": [1] * len(kernels)})
    if copies:
        tables["copies"] = pa.table({
            "copy_id": list(range(len(copies))), "device_id": [0] * len(copies), "direction": ["HtoD"] * len(copies),
            "stream_id": [c[0] for c in copies], "start_ns": [c[1] * US for c in copies],
            "end_ns": [c[2] * US for c in copies], "launch_call_id": [c[3] for c in copies]})
    if memsets:
        tables["memsets"] = pa.table({
            "memset_id": list(range(len(memsets))), "device_id": [0] * len(memsets),
            "stream_id": [m[0] for m in memsets], "start_ns": [m[1] * US for m in memsets],
            "end_ns": [m[2] * US for m in memsets]})
    if calls:
        tables["api_calls"] = pa.table({
            "call_id": list(range(len(calls))), "name": [c[0] for c in calls], "pid": [1] * len(calls),
            "tid": [c[1] for c in calls], "start_ns": [c[2] * US for c in calls], "end_ns": [c[3] * US for c in calls]})
    return ParsedTrace(format="nsys-sqlite", tables=tables)


def _budget(store: Store, trace: ParsedTrace, name: str = "t") -> dict:
    run_id = store.write_run(trace, Path(f"/planted/{name}"), (name * 64)[:64], 1).run_id
    rows = store.sql("SELECT category, cause, ns, span_ns FROM run_time_budget(?)", [run_id]).fetchall()
    assert sorted(rows) == sorted(store.sql("SELECT category, cause, ns, span_ns FROM time_budget WHERE run_id = ?",
                                            [run_id]).fetchall())
    assert sorted(rows) == _in_windows(store, run_id, 1)  # each operation a window of its own
    return {(c if cause is None else f"idle:{cause}"): ns / US for c, cause, ns, _ in rows} | {"span": rows[0][3] / US}


def _in_windows(store: Store, run_id: str, ops: int) -> list[tuple]:
    """The run's budget as a big run's is computed: in windows of about `ops` operations."""
    rows = budget_rows.time_budget_rows(store.con, [run_id], policy=RunPolicy(budget_window_gpu_ops=ops))
    return sorted((r["category"], r["cause"], r["ns"], r["span_ns"]) for r in rows)


def test_overlap_between_streams_goes_to_the_part_of_highest_priority(store):
    # 0-10 compute; 5-20 an all-reduce (5-10 under compute); 15-30 a copy (15-20 under the
    # collective); 25-40 a memset (25-30 under the copy); 40-50 idle; 50-60 compute.
    b = _budget(store, _trace(
        kernels=[("gemm", 1, 0, 10, None), ("ncclDevKernel_AllReduce_Sum_f32", 2, 5, 20, None), ("gemm", 1, 50, 60, None)],
        copies=[(3, 15, 30, None)], memsets=[(4, 25, 40, None)]))
    assert b == {"compute": 20, "communication": 10, "copy": 10, "memset": 10, "idle:unknown": 10, "span": 60}


@pytest.mark.parametrize("causes, calls, launched_by", [
    # the launching thread is in cudaDeviceSynchronize when the device goes idle at 10, until 12;
    # then the host until its launch call returns at 15; then the launch's own latency
    ({"sync": 2, "host": 3, "dependency": 5}, [("cudaDeviceSynchronize", 7, 8, 12), ("cudaLaunchKernel", 7, 14, 15)], 1),
    # a synchronous copy counts as blocking too
    ({"sync": 1, "host": 4, "dependency": 5}, [("cudaMemcpy", 7, 9, 11), ("cudaLaunchKernel", 7, 14, 15)], 1),
    # a blocking call past the end of the stretch: all of it is sync
    ({"sync": 10}, [("cudaStreamSynchronize", 7, 8, 25), ("cudaLaunchKernel", 7, 26, 27)], 1),
    # launched before the device went idle, then a synchronize or a synchronous copy: entered
    # after the launch, they hold none of the work; it waited on something else
    ({"dependency": 10}, [("cudaLaunchKernel", 7, 5, 6), ("cudaStreamSynchronize", 7, 8, 25)], 0),
    ({"dependency": 10}, [("cudaLaunchKernel", 7, 5, 6), ("cudaMemcpy", 7, 8, 25)], 0),
    # the launch call starts after the device went idle
    ({"host": 3, "dependency": 7}, [("cudaLaunchKernel", 7, 12, 13)], 0),
    # or had not returned when it did: the work was not issued in time
    ({"host": 1, "dependency": 9}, [("cudaLaunchKernel", 7, 8, 11)], 0),
    # a blocking call on another thread does not make it a sync
    ({"host": 5, "dependency": 5}, [("cudaDeviceSynchronize", 8, 8, 12), ("cudaLaunchKernel", 7, 14, 15)], 1),
    # launched before the device went idle: the work waited on something else
    ({"dependency": 10}, [("cudaLaunchKernel", 7, 5, 6)], 0),
    # no launch call linked
    ({"unknown": 10}, [], None),
])
def test_idle_time_is_split_by_what_the_launching_thread_did(store, causes, calls, launched_by):
    b = _budget(store, _trace(kernels=[("a", 1, 0, 10, None), ("b", 1, 20, 30, launched_by)], calls=calls))
    assert b == {"compute": 20, "communication": 0, "copy": 0, "memset": 0, "span": 30,
                 **{f"idle:{c}": ns for c, ns in causes.items()}}


def test_the_launch_that_came_first_names_the_cause(store):
    # two kernels start at 20: one launched in time (dependency), one late (host): the first launch counts
    b = _budget(store, _trace(kernels=[("a", 1, 0, 10, None), ("b", 1, 20, 30, 0), ("c", 2, 20, 25, 1)],
                              calls=[("cudaLaunchKernel", 7, 12, 13), ("cudaLaunchKernel", 7, 4, 5)]))
    assert b["idle:dependency"] == 10 and "idle:host" not in b  # (c's call returned at 5, before the idle)


def test_each_step_gets_the_parts_inside_its_window(store):
    # 0-10 compute, 10-20 idle (host 10-15: launched at 14-15; dependency 15-20), 20-30 compute;
    # ProfilerStep#1 is 5-15 and #2 15-40 (past the device's span: its span is 15-30).
    trace = _trace(kernels=[("a", 1, 0, 10, None), ("b", 1, 20, 30, 0)], calls=[("cudaLaunchKernel", 7, 14, 15)])
    trace.tables["ranges"] = pa.table({
        "range_id": [0, 1], "kind": ["user_annotation"] * 2, "name": ["ProfilerStep#1", "ProfilerStep#2"],
        "pid": [1, 1], "tid": [7, 7], "start_ns": [5 * US, 15 * US], "end_ns": [15 * US, 40 * US]})
    run_id = store.write_run(trace, Path("/planted/steps"), "s" * 64, 1).run_id
    rows = store.sql("SELECT step, category, cause, ns, span_ns FROM run_step_budget(?) ORDER BY ALL", [run_id]).fetchall()
    got = {(step, cat if cause is None else f"idle:{cause}"): (ns / US, span / US) for step, cat, cause, ns, span in rows}
    assert got == {("ProfilerStep#1", "compute"): (5, 10), ("ProfilerStep#1", "idle:host"): (5, 10),
                   ("ProfilerStep#2", "idle:dependency"): (5, 15), ("ProfilerStep#2", "compute"): (10, 15)}


def test_check_json_carries_the_budget_of_each_device(tmp_path):
    r = CliRunner().invoke(app, ["check", "--store", str(tmp_path / "s.duckdb"), "--format", "json",
                                 "--fail-on", "never", str(FIXTURES / "nsys" / "planted.sqlite"),
                                 str(FIXTURES / "ncu" / "details_stalls.csv")])
    assert r.exit_code == 0, r.output
    runs = {run["format"]: run for run in json.loads(r.stdout)["runs"]}
    assert runs["ncu-csv"]["budget"] == []  # no timeline
    [device] = runs["nsys-sqlite"]["budget"]
    assert set(device) == {"device_id", "span_ns", "parts"} and device["device_id"] == 0
    assert all(set(p) == {"category", "cause", "ns"} for p in device["parts"])
    assert sum(p["ns"] for p in device["parts"]) == device["span_ns"] > 0
    assert {p["category"] for p in device["parts"]} >= {"compute", "communication", "copy", "memset"}
    assert all((p["cause"] is None) == (p["category"] != "idle") for p in device["parts"])
    text = CliRunner().invoke(app, ["check", "--store", str(tmp_path / "s.duckdb"), "--fail-on", "never",
                                    str(FIXTURES / "nsys" / "planted.sqlite")]).stdout
    assert re.search(r"GPU 0 \(span [0-9.]+ [mu]?s\): \d+% compute, \d+% copies, \d+% idle: [a-z]+ \d+%", text)


# -- every real trace -----------------------------------------------------------------------

@pytest.fixture
def real(real_corpus):
    """Every real trace, checked (tests/conftest.py)."""
    return real_corpus


# The Python sweep is for runs this size or smaller (the few bigger ones cost seconds each).
PYTHON_SWEEP_MAX_OPS = 25_000


def _python_budget(store: Store, run_id: str) -> dict:
    """The budget recomputed without the view's SQL: a sweep in Python over the operations."""
    comm = re.compile(COMM_PATTERN.removeprefix("(?i)"), re.I)
    ops = store.sql("""
        SELECT device_id, 'kernel', name, start_ns, end_ns, launch_call_id FROM kernels WHERE run_id = $r
          AND start_ns IS NOT NULL AND end_ns >= start_ns
        UNION ALL SELECT device_id, 'copy', NULL, start_ns, end_ns, launch_call_id FROM copies WHERE run_id = $r
          AND start_ns IS NOT NULL AND end_ns >= start_ns
        UNION ALL SELECT device_id, 'memset', NULL, start_ns, end_ns, NULL FROM memsets WHERE run_id = $r
          AND start_ns IS NOT NULL AND end_ns >= start_ns""", {"r": run_id}).fetchall()
    calls = {c: (pid, tid, s, e) for c, pid, tid, s, e in store.sql(
        "SELECT call_id, pid, tid, start_ns, end_ns FROM api_calls WHERE run_id = ?", [run_id]).fetchall()}
    blocking: dict = {}  # per thread: its blocking calls' starts, and the latest end up to each
    for pid, tid, s, e in sorted(store.sql(f"SELECT pid, tid, start_ns, end_ns FROM api_calls WHERE run_id = ? AND "
                                           f"{BLOCKING_CALL} AND start_ns IS NOT NULL AND end_ns >= start_ns",
                                           [run_id]).fetchall(), key=lambda c: c[2]):
        starts, reach, ends = blocking.setdefault((pid, tid), ([], [], []))
        starts.append(s)
        reach.append(max(e, reach[-1]) if reach else e)
        ends.append(e)

    def blocked_until(pid, tid, t) -> int:
        """When the thread's blocking call in progress at t returned (t: none in progress)."""
        starts, reach, _ = blocking.get((pid, tid), ([], [], []))
        i = bisect.bisect_right(starts, t)
        return max(reach[i - 1], t) if i > 0 else t

    def blocked_in(pid, tid, a, b) -> int:
        """How long the thread was in blocking calls within [a, b] (their union)."""
        starts, reach, ends = blocking.get((pid, tid), ([], [], []))
        pieces, i = [], bisect.bisect_right(starts, b) - 1
        while i >= 0 and reach[i] > a:  # earlier calls all ended by a
            if ends[i] > a:
                pieces.append((max(starts[i], a), min(ends[i], b)))
            i -= 1
        total, last = 0, a
        for s, e in sorted(pieces):
            if e > last:
                total += e - max(s, last)
                last = e
        return total

    links: dict = {}  # (device, start) -> launch calls of the operations starting then
    for d, s, call in store.sql("SELECT device_id, start_ns, launch_call_id FROM gpu_activity WHERE run_id = ?",
                                [run_id]).fetchall():
        links.setdefault((d, s), []).append(call)
    rank = {"copy": 3, "memset": 4}
    per_device: dict = {}
    for d, kind, name, s, e, _ in ops:
        r = rank.get(kind) or (2 if name and comm.search(name) else 1)
        per_device.setdefault(d, []).append((s, 1, r))
        per_device[d].append((e, -1, r))
    out = {}
    for d, events in per_device.items():
        events.sort()
        counts, parts, i = [0] * 5, {}, 0
        while i < len(events):
            t = events[i][0]
            while i < len(events) and events[i][0] == t:
                counts[events[i][2]] += events[i][1]
                i += 1
            if i == len(events):
                break
            nxt = events[i][0]
            cat = next((c for r, c in enumerate(("compute", "communication", "copy", "memset"), 1) if counts[r] > 0), None)
            if cat is None:  # idle from t to nxt: split by the first launch of what starts at nxt
                starts = [calls[c] for c in links.get((d, nxt), []) if c is not None and c in calls]
                first = min(starts, key=lambda x: x[2]) if starts else None
                if first is None:
                    pieces = {"idle:unknown": nxt - t}
                else:
                    # the thread's blocking calls up to the launch (one in progress at t, then
                    # those it entered before the launch call) until the work was issued (the
                    # launch call's return)
                    reached = min(blocked_until(first[0], first[1], t), nxt)
                    issued = min(max(first[3] if first[3] is not None else first[2], t), nxt)
                    sync = blocked_in(first[0], first[1], t, min(max(reached, first[2]), issued))
                    pieces = {"idle:sync": sync, "idle:host": issued - t - sync, "idle:dependency": nxt - issued}
                for k, v in pieces.items():
                    parts[k] = parts.get(k, 0) + v
                continue
            parts[cat] = parts.get(cat, 0) + nxt - t
        out[d] = parts
    return out


def test_on_every_real_trace_the_parts_partition_the_span_as_a_sweep_in_python_finds(real):
    runs = real.sql("SELECT run_id, file_name FROM runs ORDER BY file_name").fetchall()
    busy = {(r, d): (b, span) for r, d, b, span in real.sql(
        "SELECT run_id, device_id, busy_ns, active_span_ns FROM device_busy").fetchall()}
    kernel_busy = {(r, d): ns for r, d, ns in real.sql(
        "SELECT run_id, device_id, sum(end_ns - start_ns) FROM kernel_busy_intervals GROUP BY ALL").fetchall()}
    timed = swept = 0
    for run_id, name in runs:
        rows = real.sql("SELECT device_id, category, cause, ns, span_ns FROM run_time_budget(?)", [run_id]).fetchall()
        got: dict = {}
        for d, cat, cause, ns, span in rows:
            assert cat in ("compute", "communication", "copy", "memset", "idle"), name
            assert (cause is None) == (cat != "idle") and (cause is None or cause in IDLE_CAUSES), name
            assert ns >= 0, name
            got.setdefault(d, {"span": span})
            if ns:
                got[d][cat if cause is None else f"idle:{cause}"] = ns
        for d, parts in got.items():
            span = parts.pop("span")
            assert sum(parts.values()) == span == busy[(run_id, d)][1], (name, d)
            assert sum(v for k, v in parts.items() if not k.startswith("idle")) == busy[(run_id, d)][0], (name, d)
            assert parts.get("compute", 0) + parts.get("communication", 0) == kernel_busy.get((run_id, d), 0), (name, d)
        (ops,) = real.sql("SELECT count(*) FROM gpu_activity WHERE run_id = ?", [run_id]).fetchone()
        if ops <= PYTHON_SWEEP_MAX_OPS:
            assert got == {d: {k: v for k, v in p.items() if v} for d, p in _python_budget(real, run_id).items()}, name
            swept += 1
        timed += bool(got)
    assert swept >= 40
    assert timed >= 40  # the corpus's timed runs all have a budget


def test_on_every_real_trace_the_budget_in_windows_is_the_whole_sweeps(real):
    """A big run's budget is summed over windows of each device's time (`run_window_time_budget`):
    in about four windows a device, every real run of 1,000 operations or more has the whole
    sweep's rows (a window costs ~50 ms to plan; the planted cases cut at every operation)."""
    windowed = 0
    for run_id, ops in real.sql("SELECT run_id, count(*) FROM gpu_activity GROUP BY ALL HAVING count(*) >= 1000 "
                                "ORDER BY ALL").fetchall():
        rows = sorted((d if d is not None else -1, c, cause or "", ns, span) for d, c, cause, ns, span in real.sql(
            "SELECT device_id, category, cause, ns, span_ns FROM run_time_budget(?)", [run_id]).fetchall())
        got = budget_rows.time_budget_rows(real.con, [run_id], policy=RunPolicy(budget_window_gpu_ops=ops // 4))
        assert sorted((r["device_id"] if r["device_id"] is not None else -1, r["category"], r["cause"] or "", r["ns"],
                       r["span_ns"]) for r in got) == rows, run_id
        windowed += 1
    assert windowed >= 15


def test_on_every_real_trace_with_steps_each_steps_parts_fill_its_window(real):
    """Per step and device, the parts sum to the step's window inside the device's span; over
    disjoint steps, each part sums to no more than the run's."""
    with_steps = 0
    for (run_id,) in real.sql("SELECT DISTINCT run_id FROM steps").fetchall():
        rows = real.sql("SELECT step_id, device_id, category, cause, ns, span_ns FROM run_step_budget(?)",
                        [run_id]).fetchall()
        windows = dict(((r, d), (s, e)) for r, d, s, e in real.sql(
            "SELECT range_id, NULL, start_ns, end_ns FROM steps WHERE run_id = ?", [run_id]).fetchall())
        spans = {d: (s, e) for d, s, e in real.sql(
            "SELECT device_id, first_start_ns, last_end_ns FROM device_busy WHERE run_id = ?", [run_id]).fetchall()}
        per: dict = {}
        for step, d, cat, cause, ns, span in rows:
            per.setdefault((step, d), [0, span])[0] += ns
        for (step, d), (total, span) in per.items():
            s, e = windows[(step, None)]
            first, last = spans[d]
            assert total == span == min(e, last) - max(s, first), (run_id, step, d)
        starts = sorted(windows.values())
        if all(a[1] <= b[0] for a, b in zip(starts, starts[1:])):  # disjoint steps
            whole = {(d, c, k): ns for d, c, k, ns in real.sql(
                "SELECT device_id, category, cause, ns FROM run_time_budget(?)", [run_id]).fetchall()}
            summed: dict = {}
            for _, d, cat, cause, ns, _ in rows:
                summed[(d, cat, cause)] = summed.get((d, cat, cause), 0) + ns
            assert all(ns <= whole[k] for k, ns in summed.items()), run_id
        with_steps += bool(rows)
    assert with_steps >= 5


# `summary`'s kernel statistics as nsys's cuda_gpu_kern_sum defines them, straight from the
# export: per name (demangled, or with :base the short name), the count, total, average,
# median (the middle launch, or the mean of the two middle ones), min, max, sample variance
# (0 for one launch) and share of all kernels' time, ordered by total down, count, name.
NSYS_KERN_SUM = """
WITH k AS (
    SELECT {name} AS name, k."end" - k.start AS dur
    FROM CUPTI_ACTIVITY_KIND_KERNEL k
    LEFT JOIN StringIds dn ON dn.id = k.demangledName
    LEFT JOIN StringIds sn ON sn.id = k.shortName
), w AS (
    SELECT name, dur, row_number() OVER (PARTITION BY name ORDER BY dur) AS rn,
           count(*) OVER (PARTITION BY name) AS n, avg(dur) OVER (PARTITION BY name) AS mean
    FROM k
)
SELECT name, n, sum(dur) AS total, min(dur), max(dur), mean,
       avg(CASE WHEN rn IN ((n + 1) / 2, (n + 2) / 2) THEN dur END) AS median,
       sum((dur - mean) * (dur - mean)) / max(n - 1, 1) AS variance
FROM w GROUP BY name ORDER BY total DESC, n, name
"""


def test_on_every_real_nsys_export_summary_gives_the_numbers_of_nsys_kernel_summary(real):
    import math
    import sqlite3

    from traceanalyzer.summary import kernel_stats

    with_kernels = 0
    for f in sorted((shared_traces() / "nsys").glob("*.sqlite")):
        (run_id,) = real.sql("SELECT run_id FROM runs WHERE file_name = ?", [f.name]).fetchone()
        con = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        try:
            has_kernels = con.execute("SELECT 1 FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'").fetchone()
            for by, name in (("name", "coalesce(dn.value, sn.value)"), ("base", "coalesce(sn.value, dn.value)")):
                ours = kernel_stats(real, run_id, by=by).to_dict("records")
                theirs = con.execute(NSYS_KERN_SUM.format(name=name)).fetchall() if has_kernels else []
                assert [(o["name"], o["count"], o["total_ns"], o["min_ns"], o["max_ns"]) for o in ours] == \
                    [r[:5] for r in theirs], (f.name, by)
                grand = sum(r[2] for r in theirs)
                for o, (_, _, total, _, _, mean, median, variance) in zip(ours, theirs):
                    assert o["avg_ns"] == pytest.approx(mean, rel=1e-12), (f.name, o["name"])
                    assert o["median_ns"] == pytest.approx(median, rel=1e-12), (f.name, o["name"])
                    assert o["stddev_ns"] == pytest.approx(math.sqrt(variance), rel=1e-9, abs=1e-6), (f.name, o["name"])
                    assert o["share"] == pytest.approx(total / grand, rel=1e-12), (f.name, o["name"])
        finally:
            con.close()
        with_kernels += bool(has_kernels)
    assert with_kernels >= 10


def test_a_scan_table_gives_each_run_its_budget_in_a_cell(tmp_path):
    from traceanalyzer.report.budget import budget_cell

    two = [{"device_id": 0, "span_ns": 100, "parts": [{"category": "compute", "cause": None, "ns": 100}]},
           {"device_id": 1, "span_ns": 200, "parts": [
               {"category": "compute", "cause": None, "ns": 50}, {"category": "copy", "cause": None, "ns": 90},
               {"category": "idle", "cause": "host", "ns": 40}, {"category": "idle", "cause": "sync", "ns": 20}]}]
    assert budget_cell(two) == "45% copies · 30% idle, host"  # the device with the longest span
    assert budget_cell([]) == "-"
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "planted.sqlite").write_bytes((FIXTURES / "nsys" / "planted.sqlite").read_bytes())
    r = CliRunner().invoke(app, ["scan", "--store", str(tmp_path / "s.duckdb"), "--fail-on", "never", str(folder)],
                           env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert re.search(r"\d+% compute · \d+% idle, (sync|host|dependency|unknown)", r.stdout)


def test_a_run_without_a_budget_says_why_from_its_times(tmp_path):
    from traceanalyzer.report.budget import no_budget_line

    with Store(tmp_path / "s.duckdb") as st:
        ids = [st.ingest(FIXTURES / f).run_id for f in ("ncu-rep/synthetic.ncu-rep", "ncu-text/text_2023.txt")]
        runs = st.arrow("SELECT * FROM runs WHERE list_contains(?, run_id)", [ids]).to_pylist()
    for run in runs:  # no event times, whichever file the ncu values came from
        assert no_budget_line({**run, "format": "?"}).startswith("no timeline:")
        assert "Nsight Compute" in no_budget_line(run)
    assert no_budget_line({"span_ns": 0}) == "no timed GPU operations: no time budget"
    # an nsys capture that recorded nothing timed (a real export holds only StringIds and
    # ThreadNames) is not a kernel replay: its run has a session clock and no span
    empty = no_budget_line({"span_ns": None, "clock": "nsys-session"})
    assert empty.startswith("no timeline: the capture recorded no timed events") and "Nsight Compute" not in empty


def test_the_host_work_in_the_budget_says_what_its_name_is():
    """T004's main host activity, named with its kind: "(36% in IO N)" read as a label."""
    from traceanalyzer.report.budget import budget_line

    device = {"device_id": 0, "span_ns": 100, "parts": [{"category": "compute", "cause": None, "ns": 60},
                                                         {"category": "idle", "cause": "host", "ns": 40}]}
    for kind, word in (("range", "range"), ("cpu_op", "operator"), ("api_call", "API call")):
        line = budget_line({**device, "host_work": {"name": "IO N", "kind": kind, "ns": 36}})
        assert line.endswith(f'idle: host 40% (36% in {word} "IO N")'), line
