"""A big plain Kineto file is read in parts, a process a part (ingest/kineto_parts.py). Wherever
the parts begin (an event boundary, or text inside a string or a nested object) and however
many there are, the result, or the error, must be the one-pass read's."""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
from pathlib import Path

import pytest

from traceanalyzer.ingest import kineto, kineto_parts, read_file
from traceanalyzer.ingest.base import TraceError
from traceanalyzer.ingest.kineto_collect import Collector
from traceanalyzer.resources import Resources, usable_cpus

from .test_kineto import _awkward_doc, _snapshot

CUT = re.compile(rb"\}\s*,\s*\{")


def _one_pass(path: Path):
    return kineto.read(path, resources=Resources(1))


def _read_in_parts(path: Path, monkeypatch, starts: list[int] | None = None) -> tuple[object, int]:
    """Read `path` in parts beginning at `starts` (default: where the reader would cut it,
    whatever its size); return the trace and how many helpers' parts were merged (0: it fell
    back to one pass)."""
    merges = []
    original = Collector.merge

    def counted(self, later):
        merges.append(later.n_events)
        return original(self, later)

    monkeypatch.setattr(Collector, "merge", counted)
    if starts is None:
        monkeypatch.setattr(kineto_parts, "MIN_PART_BYTES", 1)
        parts = 2
    else:
        bare = path.read_bytes().lstrip()[:1] == b"["
        monkeypatch.setattr(kineto_parts, "plan", lambda p, r: kineto_parts.Plan(starts, bare))
        parts = len(starts) + 1
    try:
        return kineto.read(path, resources=Resources(parts)), len(merges)
    finally:
        monkeypatch.undo()


def _offsets(raw: bytes) -> list[int]:
    """Where a text search for `}, {` would begin a part: true boundaries, and cuts inside
    strings or nested objects."""
    return [m.end() - 1 for m in CUT.finditer(raw)]


def _boundaries(raw: bytes) -> list[int]:
    return [o for o in _offsets(raw) if raw[o:o + 7] == b'{"ph": ']


def _write(tmp_path: Path, doc, name: str = "t.json") -> tuple[Path, bytes]:
    raw = json.dumps(doc).encode()
    path = tmp_path / name
    path.write_bytes(raw)
    return path, raw


def test_two_parts_at_any_cut_give_the_one_pass_result(tmp_path, monkeypatch):
    path, raw = _write(tmp_path, _awkward_doc())
    whole = _snapshot(_one_pass(path))
    offsets = _offsets(raw)
    inside_string = [o for o in offsets if raw.rfind(b'"name": "step', 0, o) > raw.rfind(b'"ph"', 0, o)]
    nested = [o for o in offsets if raw[o:o + 6] in (b'{"x": ', b'{"y": ')]
    boundaries = _boundaries(raw)
    assert inside_string and nested and boundaries
    merged = 0
    for offset in (boundaries[:2] + boundaries[len(boundaries) // 2:][:1] + boundaries[-2:]
                   + inside_string[:2] + nested[:2] + nested[-1:]):
        trace, merges = _read_in_parts(path, monkeypatch, [offset])
        assert _snapshot(trace) == whole, offset
        merged += merges
    assert merged == 5  # the true boundaries were read in two parts, the others again in one pass


def test_more_parts_than_two(tmp_path, monkeypatch):
    """Parts in the middle read from one boundary to the next; a wrong boundary anywhere
    (here the second) gives the one-pass result too."""
    path, raw = _write(tmp_path, _awkward_doc())
    whole = _snapshot(_one_pass(path))
    b = _boundaries(raw)
    starts = [b[len(b) // 4], b[len(b) // 2], b[3 * len(b) // 4]]
    trace, merges = _read_in_parts(path, monkeypatch, starts)
    assert merges == 3 and _snapshot(trace) == whole
    inside = next(o for o in _offsets(raw) if o > starts[1] and raw[o:o + 6] == b'{"y": ')
    trace, merges = _read_in_parts(path, monkeypatch, [starts[0], inside, starts[2]])
    assert merges == 0 and _snapshot(trace) == whole


def test_bare_array_and_keys_only_after_the_array(tmp_path, monkeypatch):
    doc = _awkward_doc()
    events = doc.pop("traceEvents")
    for name, content in (("bare", events), ("keys_after", {"traceEvents": events, **doc})):
        path, raw = _write(tmp_path, content, f"{name}.json")
        whole = _snapshot(_one_pass(path))
        trace, merges = _read_in_parts(path, monkeypatch, [_boundaries(raw)[len(events) // 2]])
        assert _snapshot(trace) == whole and merges == 1, name


@pytest.mark.skipif(usable_cpus() < 2, reason="a read in parts needs two usable CPUs")
def test_a_real_trace_in_the_planned_parts(traces_dir, monkeypatch):
    path = traces_dir / "torch" / "kineto__docs__before_fix_trace.json"
    monkeypatch.setattr(kineto_parts, "MIN_PART_BYTES", 1)
    plan = kineto_parts.plan(path, Resources(2))
    raw = path.read_bytes()
    assert plan is not None and len(plan.starts) == 1 and raw[plan.starts[0]:plan.starts[0] + 1] == b"{"
    monkeypatch.undo()
    trace, merges = _read_in_parts(path, monkeypatch)
    assert merges == 1 and _snapshot(trace) == _snapshot(_one_pass(path))


def test_a_bad_event_in_a_helpers_part_gives_the_one_pass_error(tmp_path, monkeypatch):
    doc = _awkward_doc()
    doc["traceEvents"][-5]["ts"] = "not a number"
    path, raw = _write(tmp_path, doc)
    with pytest.raises(TraceError) as one:
        _one_pass(path)
    with pytest.raises(TraceError) as parts:
        _read_in_parts(path, monkeypatch, [_boundaries(raw)[len(doc["traceEvents"]) // 2]])
    assert str(parts.value) == str(one.value) and "ts" in str(one.value)


@pytest.mark.parametrize("how", ["crash", "garbage", "killed", "not started"])
def test_a_failed_helper_falls_back_to_one_pass(tmp_path, monkeypatch, how):
    path, raw = _write(tmp_path, _awkward_doc())
    code = {"crash": "import os; os._exit(3)", "garbage": "import sys; sys.stdout.write('x' * 100)",
            "killed": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "not started": ""}[how]
    command = [str(tmp_path / "no-such-python")] if how == "not started" else [sys.executable, "-c", code]
    one_pass = _snapshot(_one_pass(path))  # (first: it also opens what a process opens once)
    fds = (lambda: set(os.listdir("/proc/self/fd"))) if os.path.isdir("/proc/self/fd") else set
    open_files = fds()
    monkeypatch.setattr(kineto_parts, "_command", lambda *a: command)
    trace, merges = _read_in_parts(path, monkeypatch, [_boundaries(raw)[100]])
    assert fds() <= open_files  # the helper's temporary file is closed
    assert merges == 0 and _snapshot(trace) == one_pass


def test_plan_cuts_big_plain_files_into_a_part_per_read_cpu(tmp_path, monkeypatch):
    path, raw = _write(tmp_path, _awkward_doc())
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(raw))
    cpus = usable_cpus()
    assert kineto_parts.plan(path, Resources(cpus)) is None  # under MIN_PART_BYTES a part
    monkeypatch.setattr(kineto_parts, "MIN_PART_BYTES", 1)
    assert kineto_parts.plan(gz, Resources(cpus)) is None
    assert kineto_parts.plan(path, Resources(1)) is None
    if cpus < 2:
        return
    plan = kineto_parts.plan(path, Resources(cpus))
    assert plan is not None and not plan.bare_array and len(plan.starts) == cpus - 1
    assert all(raw[s - 1:s + 1] in (b" {", b",{") for s in plan.starts)
    # This process's part is the longest: the helpers start later.
    bounds = [0, *plan.starts, len(raw)]
    sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    assert sizes[0] == max(sizes)
    monkeypatch.setattr(kineto_parts, "MIN_PART_BYTES", len(raw) // 2 + 1)  # room for one part only
    assert kineto_parts.plan(path, Resources(cpus)) is None


@pytest.mark.parametrize("cpus", [1, 2])
def test_read_file_reads_in_parts_only_with_more_than_one_read_cpu(tmp_path, monkeypatch, cpus):
    """`read_file` hands its resources to the Kineto reader: one CPU reads in one pass, as a
    scan worker of one CPU does."""
    from traceanalyzer.batch.worker import WorkContext, process_file

    plans = []
    original = kineto_parts.plan
    monkeypatch.setattr(kineto_parts, "plan", lambda p, r: plans.append(original(p, r)) or plans[-1])
    monkeypatch.setattr(kineto_parts, "MIN_PART_BYTES", 1)
    path, _ = _write(tmp_path, _awkward_doc())
    read_file(path, resources=Resources(cpus))
    out = process_file(str(path), WorkContext(frozenset(), None, resources=Resources(cpus)))
    assert out.result.error is None and len(plans) == 2
    assert all((p is not None) == (cpus > 1 and usable_cpus() > 1) for p in plans)
