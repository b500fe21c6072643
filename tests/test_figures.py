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
