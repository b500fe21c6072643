"""The launch sweep (`store/launch_sweep.py`) places every launch in the frame the
`launch_context` view names: on random threads of nested, partly overlapping, tied and
zero-length frames cut into slices of a few frames, and on every run of the real corpus."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from traceanalyzer.analyses import attribution
from traceanalyzer.store import Store, launch_sweep

SOURCES = ("range", "op")


def _frames(rng: random.Random, n: int, grid: int) -> list[tuple[int, int]]:
    """`n` frames on a coarse grid (ties are common): mostly nested stacks, some overlapping
    only in part, some of zero length."""
    out, stack, t = [], [], 0
    while len(out) < n:
        t += rng.choice((0, 0, 1, 2))
        if stack and rng.random() < 0.45:
            start = stack.pop()
            out.append((start, max(start, t)))
        elif rng.random() < 0.1:  # a frame that overlaps its neighbours only in part
            a = rng.randrange(0, grid)
            out.append((a, a + rng.randrange(0, 6)))
        else:
            stack.append(t)
    return out


def _trace(seed: int) -> dict:
    rng = random.Random(seed)
    events, corr = [], 0
    for tid in (1, 2):
        for cat, frames in (("user_annotation", _frames(rng, rng.randrange(1, 40), 40)),
                            ("cpu_op", _frames(rng, rng.randrange(0, 30), 40))):
            for i, (a, b) in enumerate(frames):
                events.append({"ph": "X", "cat": cat, "name": f"{cat}{i}", "pid": 1, "tid": tid, "ts": a, "dur": b - a})
        for _ in range(rng.randrange(1, 30)):
            corr += 1
            t = rng.randrange(0, 45)
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                           "ts": t, "dur": 1, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": f"k{corr % 3}", "pid": 0, "tid": 7, "ts": 100 + corr,
                           "dur": 1, "args": {"correlation": corr, "device": 0, "stream": 7}})
    return {"traceEvents": events}


def _compare(st_: Store, run_id: str, slice_frames: int) -> int:
    """The sweep's frames against the view's for every GPU operation of the run; the count named."""
    got = launch_sweep.innermost_frames(st_.con, run_id, SOURCES, slice_frames=slice_frames).to_pylist()
    got = {(r["kind"], r["item_id"]): (r["range_id"], r["op_id"]) for r in got}
    want = {(k, i): (r, o) for k, i, r, o in st_.sql(
        f"SELECT kind, item_id, range_id, op_id FROM ({attribution.launch_context_sql('run_id = $run_id', SOURCES, names=False)})",
        {"run_id": run_id}).fetchall()}
    # the sweep lists the operations with a launch point; the view every one (NULLs for the rest)
    assert {k: v for k, v in want.items() if k in got or v != (None, None)} == got
    return sum(v != (None, None) for v in got.values())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), slice_frames=st.sampled_from([1, 2, 3, 7, 1000]))
def test_the_sweep_places_launches_as_the_view_does(tmp_path, seed, slice_frames):
    path = tmp_path / f"t{seed}.json"
    path.write_text(json.dumps(_trace(seed)))
    with Store(tmp_path / f"s{seed}.duckdb") as st_:
        run_id = st_.ingest(path).run_id
        _compare(st_, run_id, slice_frames)


def test_the_sweep_names_frames_on_a_planted_stack(tmp_path):
    """One thread: A [0, 10) holds B [2, 5) and C [5, 9); launches at 1, 3, 5, 9 and 12 are in
    A, B, C, A and none (C ends at 9 before the launch at 9; A has closed by 12)."""
    events = [{"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 1, "ts": a, "dur": b - a}
              for n, a, b in (("A", 0, 10), ("B", 2, 5), ("C", 5, 9))]
    for corr, t in enumerate((1, 3, 5, 9, 12), 1):
        events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t,
                    "dur": 0.5, "args": {"correlation": corr}},
                   {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 20 + corr, "dur": 0.5,
                    "args": {"correlation": corr, "device": 0, "stream": 7}}]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    with Store(tmp_path / "s.duckdb") as st_:
        run_id = st_.ingest(path).run_id
        for slice_frames in (1, 2, 100):
            rows = launch_sweep.innermost_frames(st_.con, run_id, ("range",), ("kernel",), slice_frames).to_pylist()
            names = dict(st_.sql("SELECT range_id, name FROM ranges WHERE run_id = $r", {"r": run_id}).fetchall())
            starts = dict(st_.sql("SELECT kernel_id, start_ns FROM kernels WHERE run_id = $r", {"r": run_id}).fetchall())
            placed = [names.get(r["range_id"]) for r in sorted(rows, key=lambda r: starts[r["item_id"]])]
            assert placed == ["A", "B", "C", "A", None], slice_frames


@pytest.mark.parametrize("slice_frames", [launch_sweep.SLICE_FRAMES, 5_000])
def test_real_sweep_equals_the_view(real_corpus, slice_frames):
    """On every timeline run of the real corpus, in one slice a thread and in slices of 5 k frames."""
    runs = [r for (r,) in real_corpus.sql("SELECT DISTINCT run_id FROM gpu_activity").fetchall()]
    named = sum(_compare(real_corpus, run_id, slice_frames) for run_id in runs)
    assert len(runs) > 40 and named > 50_000
