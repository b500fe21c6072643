"""A big plain Kineto file is read in two processes (ingest/kineto_split.py). Whatever the
split point (an event boundary, or text inside a string or a nested object), the result,
or the error, must be the one-pass read's."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from traceanalyzer.ingest import kineto, kineto_split, read_file
from traceanalyzer.ingest.base import TraceError
from traceanalyzer.ingest.kineto_collect import Collector
from traceanalyzer.resources import READ_PROCESSES_ENV, Resources

from .test_kineto import _awkward_doc, _snapshot

two_cpus = pytest.mark.skipif(not kineto_split.allowed(Resources.available()),
                              reason="a split read needs two usable CPUs")

CUT = re.compile(rb"\}\s*,\s*\{")


def _one_pass(path: Path):
    return kineto.read(path, resources=Resources(1))


def _split_read(path: Path, monkeypatch, offset: int | None = None) -> tuple[object, int]:
    """Read `path` split at `offset` (default: where the reader would split it); return
    the trace and how many helper results were merged (0: it fell back to one pass)."""
    merges = []
    original = Collector.merge

    def counted(self, later):
        merges.append(later.n_events)
        return original(self, later)

    monkeypatch.setattr(Collector, "merge", counted)
    if offset is not None:
        bare = path.read_bytes().lstrip()[:1] == b"["
        monkeypatch.setattr(kineto_split, "split_point", lambda p, m: kineto_split.Split(offset, bare))
    try:
        return kineto.read(path, resources=Resources(2), split_min_bytes=0), len(merges)
    finally:
        monkeypatch.undo()


def _candidate_offsets(raw: bytes) -> list[int]:
    """Where a text search for `}, {` would put the split: true boundaries, and cuts
    inside strings or nested objects."""
    return [m.end() - 1 for m in CUT.finditer(raw)]


@two_cpus
def test_split_at_any_cut_gives_the_one_pass_result(tmp_path, monkeypatch):
    raw = json.dumps(_awkward_doc()).encode()
    path = tmp_path / "t.json"
    path.write_bytes(raw)
    whole = _snapshot(_one_pass(path))
    offsets = _candidate_offsets(raw)
    inside_string = [o for o in offsets if raw.rfind(b'"name": "step', 0, o) > raw.rfind(b'"ph"', 0, o)]
    nested = [o for o in offsets if raw[o:o + 6] in (b'{"x": ', b'{"y": ')]
    boundaries = [o for o in offsets if raw[o:o + 7] == b'{"ph": ']
    assert inside_string and nested and boundaries
    merged = 0
    for offset in (boundaries[:2] + boundaries[len(boundaries) // 2:][:1] + boundaries[-2:]
                   + inside_string[:2] + nested[:2] + nested[-1:]):
        trace, merges = _split_read(path, monkeypatch, offset)
        assert _snapshot(trace) == whole, offset
        merged += merges
    assert merged >= 5  # the true boundaries were split there, not read again in one pass


@two_cpus
def test_split_bare_array_and_keys_only_after_the_array(tmp_path, monkeypatch):
    doc = _awkward_doc()
    events = doc.pop("traceEvents")
    for name, raw in (("bare", json.dumps(events).encode()),
                      ("keys_after", json.dumps({"traceEvents": events, **doc}).encode())):
        path = tmp_path / f"{name}.json"
        path.write_bytes(raw)
        whole = _snapshot(_one_pass(path))
        offset = [o for o in _candidate_offsets(raw) if raw[o:o + 7] == b'{"ph": '][len(events) // 2]
        trace, merges = _split_read(path, monkeypatch, offset)
        assert _snapshot(trace) == whole and merges == 1, name


@two_cpus
def test_split_of_a_real_trace_at_the_default_point(traces_dir, monkeypatch):
    path = traces_dir / "torch" / "kineto__docs__before_fix_trace.json"
    point = kineto_split.split_point(path, 0)
    raw = path.read_bytes()
    assert point is not None and raw[point.offset:point.offset + 1] == b"{"
    trace, merges = _split_read(path, monkeypatch)
    assert merges == 1 and _snapshot(trace) == _snapshot(_one_pass(path))


@two_cpus
def test_a_bad_event_in_the_helpers_part_gives_the_one_pass_error(tmp_path, monkeypatch):
    doc = _awkward_doc()
    doc["traceEvents"][-5]["ts"] = "not a number"
    path = tmp_path / "t.json"
    raw = json.dumps(doc).encode()
    path.write_bytes(raw)
    with pytest.raises(TraceError) as one:
        _one_pass(path)
    with pytest.raises(TraceError) as split:
        _split_read(path, monkeypatch, len(raw) // 2 + CUT.search(raw, len(raw) // 2).end() - 1)
    assert str(split.value) == str(one.value) and "ts" in str(one.value)


@two_cpus
@pytest.mark.parametrize("how", ["crash", "garbage", "killed", "not started"])
def test_a_failed_helper_falls_back_to_one_pass(tmp_path, monkeypatch, how):
    raw = json.dumps(_awkward_doc()).encode()
    path = tmp_path / "t.json"
    path.write_bytes(raw)
    code = {"crash": "import os; os._exit(3)", "garbage": "import sys; sys.stdout.write('x' * 100)",
            "killed": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "not started": ""}[how]
    command = [str(tmp_path / "no-such-python")] if how == "not started" else [sys.executable, "-c", code]
    monkeypatch.setattr(kineto_split, "_command", lambda p, s: command)
    offset = [o for o in _candidate_offsets(raw) if raw[o:o + 7] == b'{"ph": '][100]
    import pandas  # noqa: F401  (else a read imports it on a thread, whose files come and go below)

    one_pass = _snapshot(_one_pass(path))  # (first: it also opens what a process opens once)
    fds = (lambda: set(os.listdir("/proc/self/fd"))) if os.path.isdir("/proc/self/fd") else set
    open_files = fds()
    trace, merges = _split_read(path, monkeypatch, offset)
    assert fds() <= open_files  # the helper's temporary file is closed
    assert merges == 0 and _snapshot(trace) == one_pass


@two_cpus
def test_a_kineto_read_leaves_pandas_to_after_the_read(tmp_path):
    """pyarrow imports pandas at a process's first `pa.array`, which would put ~0.2 s on the
    main part's critical path: no chunk is collected with pandas imported, and after the
    read pandas is imported on a thread and pyarrow's pandas conversions work (a categorical
    Series to a dictionary array, not strings). In a fresh process: pytest's has pandas."""
    import subprocess

    path = tmp_path / "t.json"
    path.write_bytes(json.dumps(_awkward_doc()).encode())
    script = """if True:
        import sys, threading
        from traceanalyzer.ingest import kineto
        from traceanalyzer.ingest.kineto_collect import Collector
        seen, merged, add, merge = [], [], Collector.add, Collector.merge
        Collector.add = lambda self, events: (add(self, events), seen.append("pandas" in sys.modules))[0]
        Collector.merge = lambda self, later: (merged.append(later.n_events), merge(self, later))[1]
        trace = kineto.read(sys.argv[1], split_min_bytes=0)
        assert seen and not any(seen), seen
        for t in threading.enumerate():
            if t.name == "traceanalyzer-pandas":
                t.join()
        assert "pandas" in sys.modules
        import pandas as pd, pyarrow as pa
        assert isinstance(pa.array(pd.Series(pd.Categorical(["a", "b"]))), pa.DictionaryArray)
        print(len(merged))
    """
    env = {**os.environ, "PYTHONPATH": str(Path(kineto_split.__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout) == 1  # a split read: the helper's part was merged


def test_split_point_only_for_big_plain_files(tmp_path):
    raw = json.dumps(_awkward_doc()).encode()
    plain, gz = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(raw)
    gz.write_bytes(__import__("gzip").compress(raw))
    assert kineto_split.split_point(plain) is None  # under MIN_SPLIT_BYTES
    assert kineto_split.split_point(gz, 0) is None
    point = kineto_split.split_point(plain, 0)
    assert point is not None and not point.bare_array and raw[point.offset - 1:point.offset + 1] in (b" {", b",{")


def test_split_can_be_turned_off(monkeypatch):
    two = len(os.sched_getaffinity(0)) >= 2
    monkeypatch.setenv(READ_PROCESSES_ENV, "1")
    assert not kineto_split.allowed(Resources.available())
    assert kineto_split.allowed(Resources(2)) == two
    monkeypatch.delenv(READ_PROCESSES_ENV)
    assert not kineto_split.allowed(Resources(1))
    assert not kineto_split.allowed(Resources(2, read_processes=1))
    assert kineto_split.allowed(Resources.available()) == two


@pytest.mark.parametrize("cpus, splits", [(1, False), (2, True)])
def test_read_file_splits_only_when_its_resources_allow(tmp_path, monkeypatch, cpus, splits):
    """`read_file` hands its resources to the Kineto reader: one CPU reads in one pass."""
    seen = []  # files a split point was looked for in (only where a split is allowed)
    original = kineto_split.split_point

    def spy(path, min_bytes):
        seen.append(path)
        return original(path, 0)  # (the test file is far under MIN_SPLIT_BYTES)

    monkeypatch.setattr(kineto_split, "split_point", spy)
    (tmp_path / "t.json").write_bytes(json.dumps(_awkward_doc()).encode())
    read_file(tmp_path / "t.json", resources=Resources(cpus))
    assert bool(seen) == (splits and len(os.sched_getaffinity(0)) >= 2)


def test_scan_workers_do_not_split(tmp_path):
    from traceanalyzer.batch.scan import WorkContext, process_file

    seen = []
    original = kineto_split.allowed

    def spy(*a):
        seen.append(original(*a))
        return seen[-1]

    raw = json.dumps(_awkward_doc()).encode()
    (tmp_path / "t.json").write_bytes(raw)
    kineto_split.allowed, saved = spy, kineto_split.allowed
    try:
        out = process_file(str(tmp_path / "t.json"), WorkContext(frozenset(), None, resources=Resources(1)))
    finally:
        kineto_split.allowed = saved
    assert out.result.error is None and seen == [False]


def test_the_helper_does_not_import_pandas(tmp_path):
    """pyarrow would import pandas on the helper's first `pa.array` (~0.3 s of its start);
    the helper refuses it and still sends its part."""
    import subprocess

    raw = json.dumps(_awkward_doc()).encode()
    path = tmp_path / "t.json"
    path.write_bytes(raw)
    offset = next(o for o in _candidate_offsets(raw) if raw[o:o + 7] == b'{"ph": ')
    cmd = kineto_split._command(path, kineto_split.Split(offset, False))
    env = {**os.environ, "PYTHONPATH": str(Path(kineto_split.__file__).resolve().parents[2])}
    r = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True, env=env)
    assert r.returncode == 0 and len(r.stdout) > 0
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.decode().splitlines() if "|" in ln]
    # (a refused import is listed too, as `pandas`: what is not there is any of its modules)
    assert "pyarrow" in imported and not any(m.startswith("pandas.") for m in imported)


def test_wire_round_trip_keeps_every_column_kind():
    """numpy, Arrow, chunked Arrow and plain-list columns (values no Arrow type holds) come
    back with their types and values; the counts, samples and keys too."""
    import io

    import numpy as np
    import pyarrow as pa
    from msgspec import Raw

    from traceanalyzer.ingest import kineto_wire

    c = Collector()
    r = c.roles["runtime"]
    r.total, r.missing, r.negative = 5, 1, 1
    r.names = {"cuda_runtime": ["cudaLaunchKernel", None]}
    r.parts["cuda_runtime"] = [{
        "ts": np.array([1.5, 2.5, 3.5]), "ok": np.array([True, False, True]),
        "name": pa.array(["a", None, "c"]), "pid": pa.chunked_array([pa.array([1, 2, 3], pa.int64())]),
        "size": [1, "0x10", None], "tid": [2**70, -(2**70), None], "odd": ["\ud800", "x", None],
    }]
    c.cat_order = {"cuda_runtime": None, "kernel": None}
    c._counts = {"cuda_runtime": 5, None: 2}
    c.n_events, c.first_ph, c.ts_sample = 7, 3, [0.1, float("nan"), 1e300]
    top = {"deviceProperties": Raw(b'[{"id": 0}]'), "odd": Raw(b'"\xff\xfe"')}
    buf = io.BytesIO()
    kineto_wire.dump(c, top, buf)
    raw = buf.getvalue()
    back, top_back = kineto_wire.load(io.BytesIO(raw), len(raw))
    part = back.roles["runtime"].parts["cuda_runtime"][0]
    assert part["ts"].dtype == np.float64 and part["ts"].tolist() == [1.5, 2.5, 3.5] and part["ts"].flags.writeable
    assert part["ok"].dtype == bool and part["ok"].tolist() == [True, False, True]
    assert part["name"].equals(pa.array(["a", None, "c"]))
    assert isinstance(part["pid"], pa.ChunkedArray) and part["pid"].to_pylist() == [1, 2, 3]
    assert part["size"] == [1, "0x10", None] and part["tid"] == [2**70, -(2**70), None]
    assert part["odd"] == ["\ud800", "x", None]
    assert (back.roles["runtime"].total, back.roles["runtime"].names) == (5, r.names)
    assert back.cat_order == c.cat_order and back._counts == c._counts
    assert (back.n_events, back.first_ph, back.ts_sample[0], back.ts_sample[2]) == (7, 3, 0.1, 1e300)
    assert {k: bytes(v) for k, v in top_back.items()} == {k: bytes(v) for k, v in top.items()}
    for cut in (0, 5, len(raw) // 2, len(raw) - 1):  # a helper that died half-way
        with pytest.raises(kineto_wire.WireError):
            kineto_wire.load(io.BytesIO(raw[:cut]), len(raw))
    with pytest.raises(kineto_wire.WireError):  # a length past the bound
        kineto_wire.load(io.BytesIO(raw), 10)
