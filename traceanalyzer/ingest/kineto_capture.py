"""A capture-phase trace: the PyTorch profiler trace recorded while CUDA/HIP graphs were captured
(vLLM's and SGLang's `graph_capture_rank_*.pt.trace.json.gz`), read for what a replay of those
graphs lacks: the launches recorded into each graph, in order, with the host frames open at
each (operators, `nn.Module` and Python frames, ranges).

A graph is the work issued on the capturing thread between a `cudaStreamBeginCapture` (or
`hipStreamBeginCapture`) call and the matching `...EndCapture` call on that thread: every kernel
launch, copy and memset call there becomes a node, in the order of the calls. ROCm traces name
the kernel on each launch call (`args.kernel`); the reader's `api_calls` table keeps no such
column, so those names come from a second, light pass over the file (`launch_names`). CUDA
traces name none: their launches are told apart by kind (kernel, copy, memset) and order only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
from msgspec import Struct

from ..resources import Resources
from .base import ParsedTrace, TraceError
from .detect import KINETO, detect
from .kineto_events import Int, decode_args, role_of
from .kineto_stream import EventStream, Unstreamable

# A call's name (version suffix dropped) that starts or ends a stream capture.
BEGIN = ("cudaStreamBeginCapture", "hipStreamBeginCapture", "cuStreamBeginCapture")
END = ("cudaStreamEndCapture", "hipStreamEndCapture", "cuStreamEndCapture")


def node_kind(call_name: str) -> str | None:
    """The graph node a call made while capturing becomes: `kernel`, `copy`, `memset`, or None
    (the call adds no node: attribute queries, event records, capture info)."""
    n = call_name.lower()
    if "graphlaunch" in n:  # a graph launched inside a capture is a child graph: not told apart here
        return None
    if "launch" in n and "host" not in n:  # cudaLaunchKernel, cuLaunchKernel, hip(Ext)ModuleLaunchKernel
        return "kernel"
    if "memcpy" in n:
        return "copy"
    if "memset" in n:
        return "memset"
    return None


class _CallArgs(Struct, gc=False):
    kernel: str | None = None
    correlation: Int | None = None


@dataclass
class CaptureTrace:
    """A capture-phase trace: `trace` as the Kineto reader reads it, and `launch_names`:
    (pid, correlation) of a launch call -> the kernel it names, where the trace says it."""

    path: Path
    trace: ParsedTrace
    launch_names: dict[tuple, str] = field(default_factory=dict)

    @property
    def tables(self) -> dict[str, pa.Table]:
        return self.trace.tables


def read_capture(path: Path, *, resources: Resources | None = None) -> CaptureTrace:
    """Read a capture-phase trace; TraceError (one line) for a file that is no Kineto trace."""
    from . import read_file  # the package imports its readers lazily

    path = Path(path)
    if detect(path) != KINETO:
        raise TraceError("a graph capture must be a PyTorch profiler (Kineto JSON) trace")
    trace = read_file(path, resources=resources)
    return CaptureTrace(path, trace, _launch_names(path))


def _launch_names(path: Path) -> dict[tuple, str]:
    names: dict[tuple, str] = {}
    try:
        stream = EventStream(path)
        for events in stream:
            calls = [e for e in events if role_of(e.cat) in ("runtime", "driver") and e.name
                     and node_kind(e.name) == "kernel"]
            for e, a in zip(calls, decode_args(calls, _CallArgs)):
                if a is not None and a.kernel and a.correlation is not None:
                    names[(e.pid, a.correlation)] = a.kernel
    except (Unstreamable, msgspec.DecodeError):
        return {}  # names unknown: nodes are matched by kind and order
    return names


def capture_windows(calls: pa.Table) -> list[dict]:
    """The stream captures in `calls` (a capture trace's `api_calls`), in order of their start:
    per capture `pid`, `tid`, `begin_ns` (its begin call's return) and `end_ns` (its end call's
    entry). A begin call pairs with the next end call on its thread."""
    if calls is None or not calls.num_rows:
        return []
    names = calls.column("name").to_pylist()
    pids, tids = calls.column("pid").to_pylist(), calls.column("tid").to_pylist()
    starts, ends = calls.column("start_ns").to_pylist(), calls.column("end_ns").to_pylist()
    order = sorted(range(len(names)), key=lambda i: (starts[i] is None, starts[i] or 0, i))
    open_: dict[tuple, int] = {}
    windows = []
    for i in order:
        name = names[i] or ""
        key = (pids[i], tids[i])
        if name.startswith(BEGIN):
            open_[key] = i
        elif name.startswith(END) and key in open_:
            b = open_.pop(key)
            windows.append({"pid": pids[b], "tid": tids[b], "begin_ns": ends[b] if ends[b] is not None else starts[b],
                            "end_ns": starts[i]})
    windows.sort(key=lambda w: w["begin_ns"])
    return windows


def captured_nodes(capture: CaptureTrace) -> list[list[dict]]:
    """Per stream capture (`capture_windows`), the launches recorded into its graph in call
    order: each `kind`, `name` (the kernel the call names; None when the trace names none, and
    for copies and memsets), `call_id`, `external_id`, `pid`, `tid` and `at_ns` (the call's
    start: where its host frames are)."""
    calls = capture.tables.get("api_calls")
    windows = capture_windows(calls)
    if not windows:
        return []
    cols = {c: calls.column(c).to_pylist() for c in ("call_id", "name", "pid", "tid", "start_ns", "correlation_id",
                                                     "external_id")}
    starts = np.array([s if s is not None else -1 for s in cols["start_ns"]], dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    sorted_starts = starts[order]
    out = []
    for w in windows:
        lo = np.searchsorted(sorted_starts, w["begin_ns"], side="left")
        hi = np.searchsorted(sorted_starts, w["end_ns"], side="left")
        nodes = []
        for i in order[lo:hi]:
            if cols["pid"][i] != w["pid"] or cols["tid"][i] != w["tid"]:
                continue
            kind = node_kind(cols["name"][i] or "")
            if kind is None:
                continue
            name = capture.launch_names.get((cols["pid"][i], cols["correlation_id"][i])) if kind == "kernel" else None
            nodes.append({"kind": kind, "name": name, "call_id": cols["call_id"][i],
                          "external_id": cols["external_id"][i], "pid": cols["pid"][i], "tid": cols["tid"][i],
                          "at_ns": int(starts[i])})
        out.append(nodes)
    return out
