"""Figures a reader can check (issue #52): the idle headline of a short run of many small gaps,
what bounds each estimated loss, where a finding's time is, one denominator per device, and
how runs are ranked. Real-trace figures are recomputed from the raw files."""

from __future__ import annotations

import gzip
import json

import pytest

from traceanalyzer.batch.check import check_file
from traceanalyzer.rules.engine import Settings
from traceanalyzer.store import Store

from .conftest import shared_traces

FALCONSAI_MI300 = "torch/TraceLens__mi300__Falconsai_nsfw_image_detection__1016002.json.gz"


def _raw_gaps(path, min_gap_us: float = 5.0) -> tuple[float, list[tuple[float, float]]]:
    """From the raw Kineto JSON: the GPU's span and its idle gaps over `min_gap_us` (the union
    of kernel, copy and memset intervals), in microseconds."""
    events = json.load(gzip.open(path))["traceEvents"]
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    union: list[list[float]] = []
    for s, e in gpu:
        if union and s <= union[-1][1]:
            union[-1][1] = max(union[-1][1], e)
        else:
            union.append([s, e])
    gaps = [(a[1], b[0]) for a, b in zip(union, union[1:]) if b[0] - a[1] > min_gap_us]
    return union[-1][1] - union[0][0], gaps


@pytest.fixture(scope="module")
def falconsai(tmp_path_factory):
    path = shared_traces() / FALCONSAI_MI300
    store = Store(tmp_path_factory.mktemp("falconsai") / "s.duckdb")
    res = check_file(store, path, Settings())
    rows = store.arrow("SELECT * FROM findings WHERE run_id = $r ORDER BY finding_no", {"r": res.run_id}).to_pylist()
    yield path, store, res.run_id, rows
    store.close()


def test_falconsai_mi300_the_headline_is_the_launch_bound_idle(falconsai):
    """The GPU is idle three quarters of its span in 127 gaps of 5-155 us (none reaches T004's
    100 us of host time) while the host launches one kernel at a time. The only warning was a
    367 us B003 and the idle group's headline a 73.8 us T003 (two syncs), with the launch gaps
    (T001, 5.14 ms) under it as info. The first headline is now the idle time, an error, its
    loss the raw trace's gap time."""
    path, store, run_id, rows = falconsai
    span_us, gaps = _raw_gaps(path)
    idle_us = sum(b - a for a, b in gaps)
    assert len(gaps) == 127 and 0.7 < idle_us / span_us < 0.8
    heads = [f for f in rows if f["related_to"] is None]
    first = heads[0]
    assert first["claims"].startswith("idle") and first["severity"] == "error", first["message"]
    assert abs(first["est_loss_ns"] / 1e3 - idle_us) < 0.01 * idle_us
    assert "late launch" in first["message"]
    related = {f["rule_id"] for f in rows if f["related_to"] == first["finding_no"]}
    assert "T003" in related


def test_falconsai_mi300_the_idle_headline_says_where_its_gaps_are(falconsai):
    """127 gaps spread over the run: no window holds half their time in a quarter of their
    extent, so the finding names them all, from the first gap's start to the last one's end."""
    path, store, run_id, rows = falconsai
    span_us, gaps = _raw_gaps(path)
    first = next(f for f in rows if f["related_to"] is None)
    origin = store.sql("SELECT start_ns FROM runs WHERE run_id = $r", {"r": run_id}).fetchone()[0]
    place = json.loads(first["evidence"])["place"]
    assert place["count"] == place["of"] == len(gaps)
    gpu0 = store.sql("SELECT min(start_ns) FROM gpu_activity WHERE run_id = $r", {"r": run_id}).fetchone()[0]
    raw0 = gaps[0][0]  # the raw trace's first gap's start, us
    events = json.load(gzip.open(path))["traceEvents"]
    first_kernel_us = min(e["ts"] for e in events if e.get("cat") == "kernel")
    assert abs((first["start_ns"] - gpu0) / 1e3 - (raw0 - first_kernel_us)) < 1
    assert abs((first["end_ns"] - first["start_ns"]) / 1e3 - (gaps[-1][1] - gaps[0][0])) < 1
    from traceanalyzer import fmt
    from traceanalyzer.rules import evidence_of
    assert fmt.place(first["start_ns"], first["end_ns"], origin,
                     evidence_of(first["rule_id"], first["evidence"]).place).startswith("127 gaps between ")


def test_the_place_of_a_finding_is_the_window_holding_most_of_its_time():
    """majority_window: the shortest run of consecutive intervals holding half the time, where it
    is at most a quarter of their extent; else the whole extent. Per key, NULL keys included."""
    import duckdb

    from traceanalyzer.analyses.place import DEFINES

    con = duckdb.connect()
    for d in DEFINES:
        con.execute(d.create())
    # key 1: one 10 ns interval, then 10 of 1 ns spread over 100-119: the first holds half
    # key 2: evenly spread, no dense window; key NULL: a single interval
    rows = [(1, 0, 10, 10)] + [(1, 100 + 2 * i, 101 + 2 * i, 1) for i in range(10)]
    rows += [(2, 100 * i, 100 * i + 10, 10) for i in range(8)] + [(None, 5, 7, 2)]
    con.sql("CREATE TABLE t (k INTEGER, start_ns BIGINT, end_ns BIGINT, ns BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    got = {r[0]: r[1:] for r in con.sql("SELECT * FROM majority_window('t')").fetchall()}
    assert got[1] == (0, 10, 1, 10, 11, 20)
    assert got[2] == (0, 710, 8, 80, 8, 80)
    assert got[None] == (5, 7, 1, 2, 1, 2)


def test_place_in_words():
    from traceanalyzer import fmt

    import msgspec

    from traceanalyzer.rules.evidence import Place

    ev = {"start_ns": 1_200_000, "end_ns": 3_400_000, "count": 57, "of": 127, "ns": 61, "total_ns": 100, "what": "gaps"}
    p = msgspec.convert(ev, Place)
    assert fmt.place(1_200_000, 3_400_000, 0, p) == "at 1.2 ms–3.4 ms into the run: 57 of the 127 gaps, 61.0% of their time"
    assert fmt.place(500_000, 7_500_000, 0, msgspec.convert({**ev, "count": 127}, Place)) == \
        "127 gaps between 500 us and 7.5 ms into the run"
    assert fmt.place(500_000, 7_500_000, 0, None) == "at 500 us–7.5 ms into the run"


@pytest.fixture(scope="module")
def h100_2gpu(tmp_path_factory):
    path = shared_traces() / "nsys" / "nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite"
    store = Store(tmp_path_factory.mktemp("h100") / "s.duckdb")
    res = check_file(store, path, Settings())
    rows = store.arrow("SELECT * FROM findings WHERE run_id = $r ORDER BY finding_no", {"r": res.run_id}).to_pylist()
    yield path, store, res.run_id, rows
    store.close()


def test_t002_says_the_kernel_time_bounds_its_loss_and_where_its_copies_are(h100_2gpu):
    """The issue's T002: '921 ms of host-to-device copy time ... est. loss 22.4 ms' and 'at 709
    ms–860 ms', the largest copy. Recomputed from the raw export: each device's kernel time (the
    bound) and its copies' extent (spread over the run, so all of them are named)."""
    import sqlite3

    path, store, run_id, rows = h100_2gpu
    raw = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    kernel_ns = dict(raw.execute("SELECT deviceId, sum(\"end\" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1"))
    copies = {d: (n, a, b) for d, n, a, b in raw.execute(
        "SELECT deviceId, count(*), min(start), max(\"end\") FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1 GROUP BY 1")}
    t002 = [f for f in rows if f["rule_id"] == "T002" and f["item_name"] == "host-to-device copies"]
    assert len(t002) == 2
    for f in t002:
        d = f["device_id"]
        # kernels overlap little here: their union is within 1% of their sum; the diagnosis
        # leaves out the part of it in warm-up (the device's first launches), and says so
        warm = json.loads(f["evidence"]).get("loss_warmup_ns", 0)
        assert abs(f["est_loss_ns"] + warm - kernel_ns[d]) < 0.01 * kernel_ns[d]
        assert abs(f["rule_loss_ns"] - kernel_ns[d]) < 0.01 * kernel_ns[d]
        from traceanalyzer import fmt
        assert fmt.loss_bound(f["rule_loss_ns"], "of kernel time on the device that could have hidden it") in f["message"]
        place = json.loads(f["evidence"])["place"]
        n, first, last = copies[d]
        assert place["count"] == place["of"] == n
        assert (f["start_ns"], f["end_ns"]) == (first, last)


def test_a_headline_the_budget_bounds_says_so(h100_2gpu):
    """No real trace's rule claims more than its part (each bounds its own estimate), so a T002
    headline is given twice the device's span: the diagnosis lowers it to the device's copy time
    and its message says so, in the one phrasing of fmt.loss_bound; the related findings and
    the headlines it did not lower say nothing more. Diagnosing them again adds nothing."""
    import pandas as pd

    from traceanalyzer import fmt
    from traceanalyzer.diagnosis import diagnose

    path, store, run_id, rows = h100_2gpu
    df = pd.DataFrame(rows)
    i = df.index[(df["rule_id"] == "T002") & (df["device_id"] == 0) & df["related_to"].isna()][0]
    copy_ns = store.sql("SELECT sum(ns) FROM time_budget WHERE run_id = $r AND device_id = 0 AND category = 'copy'",
                        {"r": run_id}).fetchone()[0]
    # the steady state's copy time: the budget's less what lies in warm-up windows
    copy_ns -= sum(p["ns"] for p in store.warmup([run_id])[1] if p["device_id"] == 0 and p["category"] == "copy")
    df = df.drop(columns=["rule_loss_ns"])
    # alone on the device's copy time: headlines of other directions would share it (_share_parts)
    df = df[(df.index == i) | ~df["claims"].fillna("").str.startswith("copy") | (df["device_id"] != 0)]
    df.loc[i, "est_loss_ns"] = 2 * store.sql("SELECT span_ns FROM runs WHERE run_id = $r", {"r": run_id}).fetchone()[0]
    out = diagnose(store, run_id, df)
    head = out[out["fingerprint"] == df.loc[i, "fingerprint"]].iloc[0]
    assert head["est_loss_ns"] == copy_ns
    note = fmt.loss_bound(copy_ns, "of device 0's copy time")
    assert head["message"].endswith("; " + note) or ("; " + note + " (") in head["message"]  # then warm-up's note
    others = out[out["fingerprint"] != df.loc[i, "fingerprint"]]
    assert not others["message"].str.contains("est. loss at most the .* of device", regex=True).any()
    again = diagnose(store, run_id, out)
    assert again[again["fingerprint"] == df.loc[i, "fingerprint"]].iloc[0]["message"].count(note) == 1


def test_upper_bounds_rank_after_measured_losses():
    """hpc_assignment3: B001's 96% of the span is what a full grid could save (capped at a
    warning), its measured loss (T003) 2.5%; a run that measurably loses 10% ranks first."""
    from traceanalyzer.report.model import loss_shares, run_order

    devices = [{"device_id": 0, "span_ns": 1000}]
    hpc = [{"rule_id": "B001", "device_id": 0, "est_loss_ns": 960}, {"rule_id": "T003", "device_id": 0, "est_loss_ns": 25}]
    other = [{"rule_id": "T001", "device_id": 0, "est_loss_ns": 100}]
    assert loss_shares(hpc, devices) == (0.025, 0.96) and loss_shares(other, devices) == (0.1, None)
    counts = {"error": 0, "warning": 1, "info": 0}
    keys = {name: run_order(*(lambda s: (s[0], sum(f["est_loss_ns"] for f in heads), counts, name, s[1]))(
        loss_shares(heads, devices))) for name, heads in (("hpc", hpc), ("other", other))}
    assert sorted(keys, key=keys.get) == ["other", "hpc"]


def test_scan_ranks_an_abstaining_loss_after_measured_ones(tmp_path):
    """HTA's trace_compare base (6 kernels, 4 of 5 launches missing: sampled or stripped): T001's
    273 ms of 'idle' abstains (cause unknown, it may not be idle at all), so the run ranks after
    every run whose headlines measure a loss, its loss shown as a bound, and the column is named."""
    from traceanalyzer.batch.scan import run_table
    from traceanalyzer.report.scan_text import _loss

    stripped = shared_traces() / "torch" / "hta__trace_compare__base__base.json.gz"
    measured = shared_traces() / "torch" / "TraceLens__h100__gaunernst_bert-small-uncased__1016001.json.gz"
    with Store(tmp_path / "s.duckdb") as st:
        ids = [check_file(st, p, Settings()).run_id for p in (stripped, measured)]
        table = run_table(st, ids)
    assert list(table["run_id"]) == ids[::-1]
    row = table.set_index("run_id").loc[ids[0]]
    assert row["loss_share"] is None or row["loss_share"] != row["loss_share"]
    assert _loss(table[table["run_id"] == ids[0]].iloc[0]).startswith("≤")


def test_the_markdown_table_ranks_runs_by_loss(tmp_path):
    """The Markdown report's table and sections follow the HTML index's order: the run that
    loses the larger share of its span first, not the first file name."""
    from traceanalyzer.report import markdown
    from traceanalyzer.report.model import load_result

    from .conftest import FIXTURES

    with Store(tmp_path / "s.duckdb") as store:
        ids = [check_file(store, FIXTURES / rel, Settings()).run_id
               for rel in ("nsys/clean.sqlite", "kineto/timeline_item.json")]
        text = markdown.render(store, load_result(store, ids))
    table = [line for line in text.splitlines() if line.startswith(("| clean", "| timeline\\_item"))]
    assert [line.split(" | ")[0] for line in table] == ["| timeline\\_item.json", "| clean.sqlite"], table
    assert text.index("### timeline\\_item.json") < text.index("### clean.sqlite")


def test_one_denominator_per_device(falconsai, h100_2gpu):
    """A run's shares are of one figure per device, its span (first GPU operation to last, the
    budget's) or where it has warm-up its steady span, said once in the budget lines: no finding
    says 'active span', 'the stream's span' or 'wall time', and T001's share is its device-idle
    time over that span."""
    import re

    from traceanalyzer import fmt
    from traceanalyzer.report.budget import budget_line, budget_of

    for path, store, run_id, rows in (falconsai, h100_2gpu):
        spans = {d["device_id"]: d["span_ns"] for d in budget_of(store, run_id)}
        steady = {d["device_id"]: d["warmup"]["steady_span_ns"] for d in budget_of(store, run_id) if "warmup" in d}
        for d in budget_of(store, run_id):
            assert budget_line(d).startswith(f"GPU {d['device_id']} (span {fmt.ns(d['span_ns'])}): ")
        for f in rows:
            assert not re.search(r"active span|stream's span|wall time", f["message"]), f["message"]
            if f["rule_id"] == "T001" and f["item_kind"] == "stream":
                lost = json.loads(f["evidence"])["device_idle_ns"]
                device = f["device_id"]
                words = "steady span" if device in steady else "span"
                share = lost / steady.get(device, spans[device])
                assert f"({fmt.pct(share)} of the device's {words})" in f["message"]
    # the raw trace: Falconsai's span is its kernels' extent, 6.87 ms, not the run's 7.84 ms
    path, store, run_id, rows = falconsai
    span_us, _ = _raw_gaps(path)
    assert abs(spans_of(store, run_id)[0] / 1e3 - span_us) < 1


def spans_of(store, run_id):
    from traceanalyzer.report.budget import budget_of

    return {d["device_id"]: d["span_ns"] for d in budget_of(store, run_id)}


def test_issued_work_waiting_on_a_one_stream_device_is_launch_latency(falconsai, h100_2gpu, tmp_path):
    """The budget's `dependency` (work issued in time that waited) on a device whose every
    operation ran on one stream had nothing to wait for but the launch itself: the budget line
    says `launch latency` there (Falconsai on MI300X, and each GPU of nsys-ai's h100_2gpu: one
    stream each in the raw files), and `dependency` where the device ran several (hta's alexnet:
    streams 7 and 20)."""
    import sqlite3

    from traceanalyzer.report.budget import budget_line, budget_of

    path, store, run_id, _ = falconsai
    events = json.load(gzip.open(path))["traceEvents"]
    streams = {e["args"].get("stream") for e in events
               if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    assert len(streams) == 1
    [device] = budget_of(store, run_id)
    assert any(p["cause"] == "dependency" and p["ns"] > 0 for p in device["parts"])
    line = budget_line(device)
    assert "launch latency" in line and "dependency" not in line, line

    path, store, run_id, _ = h100_2gpu
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    per_device = dict(con.execute(
        "SELECT deviceId, count(DISTINCT streamId) FROM (SELECT deviceId, streamId FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "UNION ALL SELECT deviceId, streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL "
        "SELECT deviceId, streamId FROM CUPTI_ACTIVITY_KIND_MEMSET) GROUP BY 1").fetchall())
    assert per_device == {0: 1, 1: 1}
    assert all("launch latency" in budget_line(d) and "dependency" not in budget_line(d) for d in budget_of(store, run_id))

    alexnet = shared_traces() / "torch" / "hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
    with Store(tmp_path / "a.duckdb") as st:
        [device] = budget_of(st, check_file(st, alexnet, Settings()).run_id)
        assert "dependency" in budget_line(device) and "launch latency" not in budget_line(device)
