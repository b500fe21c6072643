"""Warm-up and one-time costs (`warmup_windows`, `run_warmup_budget`): set apart from the steady
state, in the budget's warm-up line, and left out of the losses. A planted run whose answers
are derived from its plan (fixtures/gen_timeline.py), and the alexnet benchmark whose warm-up
the issue named, recomputed from the raw JSON."""

from __future__ import annotations

import gzip
import json
import sqlite3
import sys

import pytest

from traceanalyzer.batch.check import check_file
from traceanalyzer.report.budget import budget_of, warmup_line
from traceanalyzer.rules.engine import Settings
from traceanalyzer.store import Store
from traceanalyzer.store.run_policy import RunPolicy

from .conftest import FIXTURES, shared_traces

sys.path.insert(0, str(FIXTURES))
import gen_timeline  # noqa: E402

PLANTED = gen_timeline.PLANTED["kineto/timeline_warmup.json"]


def _checked(tmp_path, path, settings: Settings | None = None) -> tuple[Store, str]:
    store = Store(tmp_path / "w.duckdb")
    check_file(store, path, settings or Settings())
    (run_id,) = store.sql("SELECT run_id FROM runs").fetchone()
    return store, run_id


def _findings(store: Store, run_id: str) -> list[dict]:
    rows = store.arrow("SELECT * FROM findings WHERE run_id = $r ORDER BY finding_no", {"r": run_id}).to_pylist()
    for r in rows:
        r["evidence"] = json.loads(r["evidence"]) if r["evidence"] else {}
    return rows


@pytest.fixture
def planted(tmp_path):
    store, run_id = _checked(tmp_path, FIXTURES / "kineto" / "timeline_warmup.json")
    yield store, run_id
    store.close()


def test_the_planted_windows_and_the_time_inside_them(planted):
    store, run_id = planted
    first = store.sql("SELECT min(start_ns) FROM gpu_activity WHERE run_id = $r", {"r": run_id}).fetchone()[0]
    origin = PLANTED["windows"]["uploads before the first kernel"]["start_ns"]  # the plan's first operation
    windows = {r: (s - first, e - first) for r, s, e in store.sql(
        "SELECT reason, start_ns, end_ns FROM run_warmup_windows($r)", {"r": run_id}).fetchall()}
    assert windows == {reason: (w["start_ns"] - origin, w["end_ns"] - origin)
                       for reason, w in PLANTED["windows"].items()}
    parts: dict[str, int] = {}
    for category, ns in store.sql("SELECT category, ns FROM run_warmup_budget($r)", {"r": run_id}).fetchall():
        parts[category] = parts.get(category, 0) + ns
    assert parts == PLANTED["warmup_parts"]
    [device] = budget_of(store, run_id)
    assert device["span_ns"] == PLANTED["span_ns"]
    assert device["warmup"]["ns"] == PLANTED["warmup_ns"]
    assert device["warmup"]["steady_span_ns"] == PLANTED["steady_span_ns"]
    # the budget's parts are the whole span's: steady + warm-up = the whole, part by part
    whole = {(p["category"], p["cause"]): p["ns"] for p in device["parts"]}
    for p in device["warmup"]["parts"]:
        assert 0 < p["ns"] <= whole[(p["category"], p["cause"])]
    steady_idle = sum(ns for (c, _), ns in whole.items() if c == "idle") - PLANTED["warmup_parts"]["idle"]
    assert steady_idle == PLANTED["steady_idle_ns"]
    line = warmup_line(device)
    assert line.startswith("warm-up: 25 ms of the span (") and "not counted in the findings; steady 7.9 ms" in line
    for reason in PLANTED["windows"]:
        assert reason in line


def test_the_planted_losses_are_the_steady_states_per_step_too(planted):
    store, run_id = planted
    found = _findings(store, run_id)
    t001 = [f for f in found if f["rule_id"] == "T001"]
    [stream] = [f for f in t001 if f["item_kind"] == "stream"]
    assert stream["rule_loss_ns"] == PLANTED["T001"]["loss_ns"]
    assert stream["evidence"]["warmup_ns"] == PLANTED["T001"]["warmup_ns"]
    [t004] = [f for f in found if f["rule_id"] == "T004"]
    assert t004["evidence"]["stretches"] == PLANTED["T004"]["stretches"]
    assert t004["rule_loss_ns"] == PLANTED["T004"]["total_ns"]
    assert t004["evidence"]["warmup_ns"] == PLANTED["T001"]["warmup_ns"]  # one device: the same idle
    # T004 heads the idle group (the budget gives the steady idle to the host); its loss is weighed
    # against the steady span: 4.72 ms of 7.9 ms, an error (of the whole 32.9 ms span: 14%)
    assert t004["related_to"] is None and stream["related_to"] == t004["finding_no"]
    assert t004["est_loss_ns"] == PLANTED["T004"]["total_ns"] and t004["severity"] == "error"
    steps = PLANTED["steps"]
    assert t004["evidence"]["loss_steps"] == steps
    assert t004["evidence"]["loss_per_step_ns"] == PLANTED["T004"]["total_ns"] // steps
    assert "(1.18 ms lost per step over 4 steps)" in t004["message"]
    assert "warm-up" not in t004["message"]  # nothing of warm-up was left to bound away


def test_no_window_without_warm_up(tmp_path):
    """A run with no warm-up: no windows, no warm-up line, the losses as before."""
    store, run_id = _checked(tmp_path, FIXTURES / "kineto" / "timeline_item.json")
    assert store.sql("SELECT count(*) FROM run_warmup_windows($r)", {"r": run_id}).fetchone()[0] == 0
    [device] = budget_of(store, run_id)
    assert "warmup" not in device and warmup_line(device) is None
    for f in _findings(store, run_id):
        assert "warm-up" not in f["message"] and "warmup_ns" not in f["evidence"] or f["evidence"]["warmup_ns"] == 0


# -- the alexnet benchmark (issue #52) --------------------------------------------------------

ALEXNET = "torch/hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"


def _union(spans):
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _overlap(a, b) -> int:
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def _raw_alexnet() -> dict:
    """From the raw JSON alone: the GPU's busy time, and its warm-up as the issue describes it
    (the ranges named warmup, the 6 s cudaFree, the 3.1 s first launch, the uploads before the
    first kernel), in ns from the trace's own microseconds."""
    trace = json.load(gzip.open(shared_traces() / ALEXNET))
    ns = lambda us: round(us * 1000)  # noqa: E731
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    gpu = [(ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    first_kernel = min(ns(e["ts"]) for e in events if e.get("cat") == "kernel")
    busy = _union(gpu)
    first, last = busy[0][0], busy[-1][1]
    ranges = [(ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in events
              if e.get("cat") == "user_annotation" and "|warmup|" in e["name"]]
    frees = sorted((ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in events if e["name"] == "cudaFree")
    launches = [(ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in events if e["name"] == "cudaLaunchKernel"]
    slow_launch = max(launches, key=lambda c: c[1] - c[0])
    warm = _union([(first, first_kernel), frees[0], slow_launch, *ranges])
    warm = [(max(s, first), min(e, last)) for s, e in warm if e > first and s < last]
    idle = [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] > a[1]]
    return {"span": last - first, "warm": warm, "warm_ns": sum(e - s for s, e in warm),
            "idle_ns": sum(e - s for s, e in idle), "warm_idle_ns": _overlap(idle, warm),
            "free_ns": frees[0][1] - frees[0][0], "slow_launch_ns": slow_launch[1] - slow_launch[0]}


def test_alexnet_warm_up_is_set_apart_and_no_warning_claims_it(tmp_path):
    raw = _raw_alexnet()
    # the figures: 12.76 s of the 12.85 s of idle lie in warm-up (6 s cudaFree, 3.1 s first launch)
    assert raw["free_ns"] > 6e9 and raw["slow_launch_ns"] > 3e9
    assert raw["warm_idle_ns"] > 12.7e9 and raw["idle_ns"] - raw["warm_idle_ns"] < 0.1e9
    store, run_id = _checked(tmp_path, shared_traces() / ALEXNET)
    reasons = {r for (r,) in store.sql("SELECT DISTINCT reason FROM run_warmup_windows($r)", {"r": run_id}).fetchall()}
    assert {"range named warm-up", "cudaFree", "first launch", "uploads before the first kernel"} <= reasons
    [device] = budget_of(store, run_id)
    assert device["span_ns"] == raw["span"] and device["warmup"]["ns"] == raw["warm_ns"]
    warm_idle = sum(p["ns"] for p in device["warmup"]["parts"] if p["category"] == "idle")
    assert warm_idle == raw["warm_idle_ns"]
    steady_idle = raw["idle_ns"] - raw["warm_idle_ns"]
    found = _findings(store, run_id)
    claiming = [f for f in found if (f["claims"] or "").startswith("idle") and f["rule_id"] in ("T001", "T004")]
    assert claiming
    for f in claiming:  # the rules' own figures: steady idle only, the rest in warmup_ns
        assert f["rule_loss_ns"] <= steady_idle, f["message"]
        assert f["evidence"]["warmup_ns"] > 11e9, f["message"]  # stream 20 began in warm-up: 11.9 s
    for f in found:
        if f["related_to"] is None and f["severity"] != "info" and (f["claims"] or "").startswith("idle"):
            assert f["est_loss_ns"] <= steady_idle, f["message"]


def test_diagnosed_again_the_notes_are_not_repeated(planted):
    """A pass of some rules diagnoses the stored findings again with its own: the warm-up and
    per-step notes are each given once, as the first diagnosis gave them."""
    from traceanalyzer.diagnosis import diagnose_runs

    store, run_id = planted
    before = {(f["rule_id"], f["fingerprint"]): (f["message"], f["evidence"]) for f in _findings(store, run_id)}
    assert any("per step over 4 steps" in m for m, _ in before.values())
    diagnose_runs(store, [run_id], Settings(select=["T001"]))
    after = {(f["rule_id"], f["fingerprint"]): (f["message"], f["evidence"]) for f in _findings(store, run_id)}
    assert after == before
    for message, _ in after.values():
        assert message.count("per step over") <= 1 and message.count("in warm-up, not counted") <= 1


def test_a_first_step_far_slower_than_the_others_is_warm_up(store):
    """Leading steps longer than 1.5x the median of the later ones (at most half of them) are
    warm-up, as `summary` sets them apart; a first step like the others is not."""
    import pyarrow as pa
    from pathlib import Path

    from traceanalyzer.ingest.base import ParsedTrace

    def run(step_us: list[int], name: str) -> str:
        starts = [sum(step_us[:i]) for i in range(len(step_us))]
        kernels = pa.table({
            "kernel_id": list(range(len(step_us))), "device_id": [0] * len(step_us), "name": ["k"] * len(step_us),
            "stream_id": [7] * len(step_us), "start_ns": [s * 1000 for s in starts],
            "end_ns": [(s + 10) * 1000 for s in starts], "pid": [1] * len(step_us)})
        ranges = pa.table({
            "range_id": list(range(len(step_us))), "kind": ["user_annotation"] * len(step_us),
            "name": [f"ProfilerStep#{i}" for i in range(len(step_us))], "pid": [1] * len(step_us),
            "tid": [1] * len(step_us), "start_ns": [s * 1000 for s in starts],
            "end_ns": [(s + d) * 1000 for s, d in zip(starts, step_us)]})
        trace = ParsedTrace(format="kineto-json", tables={"kernels": kernels, "ranges": ranges})
        return store.write_run(trace, Path(f"/planted/{name}"), (name * 64)[:64], 1).run_id

    slow = run([900, 100, 110, 100, 105, 100], "a")
    rows = store.sql("SELECT reason, start_ns, end_ns FROM run_warmup_windows($r)", {"r": slow}).fetchall()
    assert rows == [("first step", 0, 900_000)]
    even = run([140, 100, 110, 100, 105, 100], "b")  # 140 us < 1.5 x 102.5 us: a step like the others
    assert store.sql("SELECT count(*) FROM run_warmup_windows($r)", {"r": even}).fetchone()[0] == 0


def test_a_run_that_keeps_its_cache_keeps_its_warm_up(tmp_path, monkeypatch):
    """A big run keeps its warm-up rows with its cache (the diagnosis and every report read them):
    the windows are the cache's own table, the time inside them a kept result; read back, they
    are the rows computed; another definition of the views is not read back."""
    from traceanalyzer.store import run_cache

    keep = Settings(policy=RunPolicy(keep_min_gpu_ops=1))
    store, run_id = _checked(tmp_path, FIXTURES / "kineto" / "timeline_warmup.json", keep)
    kept = store.warmup([run_id])
    stems = [t for (t,) in store.sql("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE '%result_warmup%'")
             .fetchall()]
    assert len(stems) == 1  # the time inside the windows
    monkeypatch.setattr(run_cache, "kept_version", lambda con, run_id: None)  # as a run without a kept cache
    assert store.warmup([run_id]) == kept and kept[0] and kept[1]
    monkeypatch.undo()
    monkeypatch.setattr(run_cache, "_module_digest", lambda: "another")
    assert store.warmup([run_id]) == kept  # computed again, and the same
    store.close()


FUSER = "nsys/Fuser__64ee035__report1.sqlite"


def test_a_librarys_set_up_before_its_first_launch_is_one_window(tmp_path):
    """Fuser 64ee035: between nvFuser's kernel launch and cuBLAS's first GEMM the launching thread
    readies cuBLAS (838 cuGetProcAddress, cuInit, cudaFree, 15 cuLibraryLoadData a few ms apart):
    one window from the launch before to the GEMM's launch return, recomputed from the raw rows;
    none of the 66 ms is then a late launch."""
    con = sqlite3.connect(shared_traces() / FUSER)
    calls = con.execute("""SELECT r.start, r."end", s.value, r.correlationId IN (SELECT correlationId FROM
                               CUPTI_ACTIVITY_KIND_KERNEL) FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                           JOIN StringIds s ON s.id = r.nameId ORDER BY r.start""").fetchall()
    (gemm_corr,) = con.execute("""SELECT k.correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
                                  ON s.id = k.shortName WHERE s.value LIKE 'nvjet%'""").fetchone()
    (gemm_start,) = con.execute("SELECT start FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = ?",
                                [gemm_corr]).fetchone()
    launch = next(c for c in calls if c[0] == gemm_start and c[3])
    before = max((c for c in calls if c[3] and c[0] < gemm_start), key=lambda c: c[0])
    between = [c[2] for c in calls if before[1] <= c[0] < gemm_start]
    assert sum(n.startswith("cuLibraryLoadData") for n in between) == 15
    assert sum(n.startswith("cuGetProcAddress") for n in between) == 838
    assert launch[1] - before[1] > 66e6
    store, run_id = _checked(tmp_path, shared_traces() / FUSER)
    windows = store.sql("""SELECT start_ns, end_ns FROM run_warmup_windows($r)
                           WHERE reason = 'library set-up before a first launch' ORDER BY start_ns""",
                        {"r": run_id}).fetchall()
    assert (before[1], launch[1]) in windows
    found = _findings(store, run_id)
    t001 = [f for f in found if f["rule_id"] == "T001"]
    assert all(f["rule_loss_ns"] < 5e6 for f in t001), [f["message"] for f in t001]
    # What is left is a first run too: the fusion, its GEMM and most kernel time ran once, and
    # warm-up takes all but ~2 ms of the span. No idle finding is more than info.
    kernels = con.execute("""SELECT s.value, count(*), sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                             JOIN StringIds s ON s.id = k.demangledName GROUP BY 1""").fetchall()
    assert sum(ns for _, n, ns in kernels if n > 1) < 0.5 * sum(ns for _, _, ns in kernels)
    [device] = budget_of(store, run_id)
    assert device["warmup"]["steady_span_ns"] < 0.1 * device["span_ns"]
    idle = [f for f in found if (f["claims"] or "").startswith("idle")]
    assert idle and all(f["severity"] == "info" for f in idle), [(f["severity"], f["message"]) for f in idle]
    assert all("one cold execution" in f["message"] for f in idle if f["related_to"] is None)
