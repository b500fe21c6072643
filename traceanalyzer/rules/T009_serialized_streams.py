"""T009 serialized streams: work spread over streams that could overlap and never does."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import msgspec

from ..fmt import ns as fmt_ns, pct
from ..analyses.budget import COMM_PATTERN
from . import _unknown
from .base import Rule, Threshold
from .evidence import Evidence, StreamRange, doc

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

# Per device, each stream's operations (kernels, copies, memsets; unified-memory migrations
# and collectives aside: a collective's overlap with compute is T007's) and their time.
STREAMS_SQL = """
WITH comm AS (
    SELECT name_key FROM this_run.kernel_names WHERE regexp_matches(name, '__COMM__')
)
SELECT device_id, stream_id, count(*) AS ops, sum(end_ns - start_ns) AS busy_ns, min(start_ns) AS first_ns,
       max(end_ns) AS last_ns
FROM this_run.stream_ops WHERE end_ns > start_ns AND stream_id IS NOT NULL
  AND (kind <> 'kernel' OR name_key IS NULL OR name_key NOT IN (SELECT name_key FROM comm))
GROUP BY ALL
"""

# The union of the chosen streams' operations on one device (`$streams`): their time together.
UNION_SQL = """
WITH ops AS (SELECT device_id, start_ns, end_ns FROM this_run.stream_ops WHERE end_ns > start_ns
             AND device_id IS NOT DISTINCT FROM $device_id AND list_contains($streams, stream_id))
SELECT coalesce(sum(end_ns - start_ns), 0) FROM device_islands('ops')
"""

# Each operation of the chosen streams with when it was ready to run: issued (its launch call
# returned) and its stream's earlier work done; its resource (copy direction, a kernel's threads).
OPS_SQL = """
WITH comm AS (
    SELECT name_key FROM this_run.kernel_names WHERE regexp_matches(name, '__COMM__')
)
SELECT o.stream_id, o.kind, o.item_id, o.start_ns, o.end_ns, o.prev_max_end_ns, o.threads,
       c.direction, coalesce(a.end_ns, a.start_ns) AS issued_ns
FROM this_run.stream_ops o
LEFT JOIN copies c ON o.kind = 'copy' AND c.run_id = $run_id AND c.copy_id = o.item_id
LEFT JOIN api_calls a ON a.run_id = $run_id AND a.call_id = o.launch_call_id
WHERE o.device_id IS NOT DISTINCT FROM $device_id AND list_contains($streams, o.stream_id)
  AND o.end_ns > o.start_ns AND (o.kind <> 'kernel' OR o.name_key IS NULL OR o.name_key NOT IN (SELECT name_key FROM comm))
ORDER BY o.start_ns, o.end_ns, o.kind, o.item_id
"""

# The calls in a window that order streams on purpose (events) or synchronize the device
# implicitly (allocation, freeing, copies and memsets that are not Async).
CALLS_SQL = """
SELECT name, count(*) AS n FROM api_calls
WHERE run_id = $run_id AND start_ns >= $lo AND start_ns < $hi
  AND (name ILIKE '%StreamWaitEvent%' OR regexp_matches(name, '__IMPLICIT__'))
GROUP BY name ORDER BY n DESC, name
"""
IMPLICIT_SYNC = (r"^(cuda|hip)(Malloc|Free|MallocHost|FreeHost|HostAlloc|HostRegister|HostUnregister|"
                 r"DeviceSynchronize|StreamSynchronize|EventSynchronize|ThreadSynchronize)$|"
                 r"^(cuda|hip)(Memcpy|Memset)(2D|3D|ToSymbol|FromSymbol|Peer|WithStream)?$|^cu(MemAlloc|MemFree)")
DEFAULT_STREAM = 7  # the legacy default stream's id in nsys and PyTorch (Kineto) traces

DEVICE_SQL = "SELECT sm_count, max_warps_per_sm, warp_size FROM devices WHERE run_id = $run_id AND device_id IS NOT DISTINCT FROM $device_id"
ENGINES_SQL = "SELECT json_extract(metadata, '$.devices.copy_engines') FROM runs WHERE run_id = $run_id"


def _copy_engines(store, run_id: str, device_id) -> int | None:
    """The device's copy engines where the trace says (nsys TARGET_INFO_GPU.asyncEngines)."""
    raw = store.sql(ENGINES_SQL, {"run_id": run_id}).fetchone()[0]
    if not raw:
        return None
    engines = json.loads(raw) if isinstance(raw, str) else raw
    n = engines.get(str(device_id)) if isinstance(engines, dict) else None
    return int(n) if n else None


def _capacity(store, run_id: str, device_id) -> int | None:
    """Threads the device holds at once: a kernel with as many fills it (one full wave)."""
    row = store.sql(DEVICE_SQL, {"run_id": run_id, "device_id": device_id}).fetchone()
    if row is None or any(v is None for v in row):
        return None
    return int(row[0]) * int(row[1]) * int(row[2])


def _resources(ops: pd.DataFrame, engines: int | None, capacity: int | None) -> pd.Series:
    """What each operation runs on: kernels that fill the GPU share the SMs ('kernel'), a kernel
    that does not could run beside anything ('' : its own); copies by direction, all one
    'copy' on a GPU with one copy engine; memsets apart."""
    import numpy as np

    kind, direction = ops["kind"].to_numpy(), ops["direction"].fillna("").to_numpy()
    threads = ops["threads"].astype("float64").to_numpy()
    fills = np.ones(len(ops), dtype=bool) if capacity is None else ~(threads < capacity)  # NaN: unknown, fills
    copy = np.where((engines == 1) & np.isin(direction, ["HtoD", "DtoH"]), "copy", direction)
    return np.where(kind == "kernel", np.where(fills, "kernel", ""), np.where(kind == "copy", copy, "memset"))


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Disjoint islands (start, end) of the intervals, and the busy time before each."""
    import numpy as np

    if len(starts) == 0:
        return np.array([], dtype=np.int64), np.array([], dtype=np.int64), np.array([], dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    island_s = s[idx]
    island_e = np.append(reach[idx[1:] - 1], reach[-1]) if len(idx) > 1 else reach[-1:]
    before = np.concatenate([[0], np.cumsum(island_e - island_s)[:-1]])
    return island_s, island_e, before


def _covered_until(t: np.ndarray, isl) -> np.ndarray:
    """Busy time of the islands up to each time in `t`."""
    import numpy as np

    s, e, before = isl
    if len(s) == 0:
        return np.zeros(len(t), dtype=np.int64)
    i = np.searchsorted(s, t, side="right") - 1
    ok = i >= 0
    j = np.where(ok, i, 0)
    return np.where(ok, before[j] + np.minimum(t, e[j]) - s[j], 0)


def _hideable(ops: pd.DataFrame, resources: np.ndarray) -> np.ndarray:
    """Per operation: the part of its wait (ready to start) during which only work on other
    resources ran, at most its own time: what could have run beside that work."""
    import numpy as np

    start, end = ops["start_ns"].to_numpy("int64"), ops["end_ns"].to_numpy("int64")
    ready = np.maximum(ops["issued_ns"].fillna(np.iinfo("int64").max).to_numpy("int64"),
                       ops["prev_max_end_ns"].fillna(np.iinfo("int64").min).to_numpy("int64"))
    waits = ready < start
    out = np.zeros(len(ops), dtype=np.int64)
    if not waits.any():
        return out
    everything = _union(start, end)
    lo, hi = ready[waits], start[waits]
    covered = _covered_until(hi, everything) - _covered_until(lo, everything)
    same = np.zeros(len(lo), dtype=np.int64)
    res_w = resources[waits]
    for r in set(res_w) - {""}:
        isl = _union(start[resources == r], end[resources == r])
        m = res_w == r
        same[m] = _covered_until(hi[m], isl) - _covered_until(lo[m], isl)
    out[waits] = np.minimum(np.maximum(covered - same, 0), (end - start)[waits])
    return out


def _bound(ops: pd.DataFrame, resources: np.ndarray, union_ns: int) -> tuple[int, int]:
    """The least time the work could take however it overlapped (its longest stream; each
    resource's total, kernels that do not fill the GPU aside), and the union's excess over it."""
    busy = (ops["end_ns"] - ops["start_ns"]).to_numpy("int64")
    floor = int(ops.assign(d=busy).groupby("stream_id")["d"].sum().max())
    for r in set(resources) - {""}:
        floor = max(floor, int(busy[resources == r].sum()))
    return floor, max(union_ns - floor, 0)


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    if _unknown.gaps(store, run_id)["missing"]:
        return pd.DataFrame()  # sampled or stripped (T010): the work that overlapped may be what it dropped
    streams = store.sql(STREAMS_SQL.replace("__COMM__", COMM_PATTERN)).df()
    rows = []
    for device_id, per in streams.groupby("device_id", dropna=False, sort=True):
        device_id = None if pd.isna(device_id) else int(device_id)
        total = int(per["busy_ns"].sum())
        chosen = per[per["busy_ns"] >= p["min_stream_share"] * total].sort_values(["busy_ns", "stream_id"],
                                                                                    ascending=[False, True])
        if len(chosen) < 2:
            continue  # one stream does (nearly) all the work: nothing to overlap
        ids = [int(s) for s in chosen["stream_id"]]
        union_ns = store.sql(UNION_SQL, {"device_id": device_id, "streams": ids}).fetchone()[0]
        stream_ns = int(chosen["busy_ns"].sum())
        shorter_ns = stream_ns - int(chosen["busy_ns"].max())
        overlap_ns = max(stream_ns - int(union_ns), 0)
        if overlap_ns > p["max_overlap_share"] * shorter_ns:
            continue  # they do run together
        row = _device_finding(store, run_id, device_id, chosen, ids, int(union_ns), shorter_ns, overlap_ns, total, p)
        if row is not None:
            rows.append(row)
    return pd.DataFrame(rows)


def _device_finding(store, run_id, device_id, chosen, ids, union_ns, shorter_ns, overlap_ns, total, p) -> dict | None:
    import numpy as np

    ops = store.sql(OPS_SQL.replace("__COMM__", COMM_PATTERN),
                    {"run_id": run_id, "device_id": device_id, "streams": ids}).df()
    engines = _copy_engines(store, run_id, device_id)
    capacity = _capacity(store, run_id, device_id)
    resources = _resources(ops, engines, capacity)
    hideable = _hideable(ops, resources)
    floor_ns, excess_ns = _bound(ops, resources, union_ns)
    loss = int(min(int(hideable.sum()), excess_ns))
    waited = hideable > 0
    lo, hi = int(ops["start_ns"].min()), int(ops["end_ns"].max())
    issued = ops["issued_ns"].dropna()
    # the calls between the first and the last launch: what could order the streams' work
    calls = store.sql(CALLS_SQL.replace("__IMPLICIT__", IMPLICIT_SYNC),
                      {"run_id": run_id, "lo": int(issued.min()) if len(issued) else lo,
                       "hi": int(issued.max()) if len(issued) else hi}).fetchall()
    event_waits = sum(n for name, n in calls if "streamwaitevent" in name.lower())
    implicit = [(name, int(n)) for name, n in calls if "streamwaitevent" not in name.lower()]
    if event_waits >= p["max_event_waits_share"] * max(int(waited.sum()), 1):
        return None  # the program orders the streams itself, through events
    if loss < p["min_loss_ns"]:
        return None  # nothing worth overlapping (copies on one engine, kernels that fill the GPU)
    kernel_share = float(hideable[ops["kind"].to_numpy() == "kernel"].sum()) / max(int(hideable.sum()), 1)
    reasons, hints = _reasons(ids, implicit, engines, ops, resources, capacity)
    worst = int(np.argmax(hideable))
    examples = ops.assign(hideable_ns=hideable)[waited].sort_values(["hideable_ns", "start_ns"], ascending=[False, True])
    stream_list = ", ".join(str(s) for s in sorted(ids))
    message = (f"device {device_id}: {len(ids)} streams ({stream_list}) each with {pct(p['min_stream_share'])} or more of "
               f"its work never ran together ({fmt_ns(overlap_ns)} side by side, {pct(overlap_ns / shorter_ns if shorter_ns else 0)} "
               f"of the {fmt_ns(shorter_ns)} the shorter streams ran), though {int(waited.sum())} operation(s) were ready "
               f"while another stream's work ran on other units; at most {fmt_ns(loss)} could have run beside it "
               f"(an upper bound: the work cannot take less than {fmt_ns(floor_ns)})" + (f"; {'; '.join(reasons)}" if reasons else ""))
    return {
        "device_id": device_id, "stream_id": int(ops["stream_id"].iloc[worst]), "item_kind": str(ops["kind"].iloc[worst]),
        "item_id": int(ops["item_id"].iloc[worst]), "item_name": "serialized streams",
        "start_ns": lo, "end_ns": hi, "value": overlap_ns / shorter_ns if shorter_ns else 0.0, "value_unit": "share",
        "threshold": p["max_overlap_share"], "est_loss_ns": loss,
        "claims": "compute" if kernel_share >= 0.5 else "copy",
        "message": message, "hint": " ".join(hints),
        "evidence": {
            "streams": [{"stream_id": int(r.stream_id), "ops": int(r.ops), "busy_ns": int(r.busy_ns),
                         "share": float(r.busy_ns) / total} for r in chosen.itertuples()],
            "union_ns": union_ns, "overlap_ns": overlap_ns, "shorter_streams_ns": shorter_ns,
            "waiting_ops": int(waited.sum()), "hideable_ns": int(hideable.sum()), "floor_ns": floor_ns,
            "excess_ns": excess_ns, "copy_engines": engines, "gpu_threads": capacity,
            "kernels_filling_gpu_share": _filling_share(ops, resources),
            "implicit_sync_calls": [{"call": n, "count": c} for n, c in implicit[:p["max_examples"]]],
            "event_waits": event_waits, "reasons": reasons,
            "worst": [{"stream_id": int(r.stream_id), "kind": r.kind, "item_id": int(r.item_id), "start_ns": int(r.start_ns),
                       "end_ns": int(r.end_ns), "hideable_ns": int(r.hideable_ns)}
                      for r in examples.head(int(p["max_examples"])).itertuples()],
        },
    }


def _filling_share(ops, resources) -> float | None:
    kernels = ops["kind"].to_numpy() == "kernel"
    if not kernels.any():
        return None
    d = (ops["end_ns"] - ops["start_ns"]).to_numpy("int64")
    return float(d[kernels & (resources == "kernel")].sum()) / float(d[kernels].sum())


def _reasons(ids, implicit, engines, ops, resources, capacity) -> tuple[list[str], list[str]]:
    """What the trace shows that orders the streams, and what to try for each."""
    reasons, hints = [], []
    if DEFAULT_STREAM in ids:
        reasons.append(f"stream {DEFAULT_STREAM} is the legacy default stream, which waits for and blocks every blocking stream")
        hints.append("Issue the work on created streams, not the legacy default stream: create them with "
                     "cudaStreamNonBlocking, or build with --default-stream per-thread.")
    if implicit:
        listed = ", ".join(f"{n} x{c}" for n, c in implicit[:3])
        reasons.append(f"calls that synchronize the device ran between the launches ({listed})")
        hints.append("Allocate and free outside the loop (cudaMallocAsync or a caching allocator) and copy with "
                     "cudaMemcpyAsync from pinned memory: cudaMalloc, cudaFree and copies that are not Async "
                     "synchronize the device.")
    kinds = set(ops["kind"])
    if engines == 1 and "copy" in kinds:
        reasons.append("the GPU has one copy engine (asyncEngines 1 in the trace): copies of all streams run one at a "
                       "time, in issue order")
        hints.append("With one copy engine, a stream's device-to-host copy that waits for its kernel holds up the "
                     "next stream's host-to-device copies: issue breadth-first (all host-to-device copies, then all "
                     "kernels, then all device-to-host copies) so that kernels run while copies go.")
    filling = _filling_share(ops, resources)
    if filling is not None and filling >= 0.9 and capacity is not None:
        reasons.append(f"{pct(filling)} of the kernel time is kernels that fill the GPU, which cannot run side by side")
    if not hints:
        hints.append("Find what orders the streams: events (cudaStreamWaitEvent), the legacy default stream, "
                     "implicit synchronization (cudaMalloc, cudaFree, copies that are not Async) or the issue "
                     "order; then let independent work run on its own stream.")
    return reasons, hints


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class T009ImplicitSyncCall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    call: Annotated[str, doc("the call")]
    count: Annotated[int, doc("how often it was called")]


class T009Stream(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    busy_ns: Annotated[int, doc("time the stream was busy")]
    ops: Annotated[int, doc("operations")]
    share: Annotated[float, doc("its share of the streams' busy time")]
    stream_id: Annotated[int, doc("stream")]


class T009Example(StreamRange, kw_only=True, forbid_unknown_fields=True):
    hideable_ns: Annotated[int, doc("time that could overlap with other streams")]
    item_id: Annotated[int, doc("id of the operation")]
    kind: Annotated[str, doc("the operation's kind (kernel, memcpy, ...)")]
    stream_id: Annotated[int, doc("stream")]


class T009Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    copy_engines: Annotated[int, doc("copy engines of the device")]
    event_waits: Annotated[int, doc("cross-stream event waits")]
    excess_ns: Annotated[int, doc("time beyond the shortest possible")]
    floor_ns: Annotated[int, doc("the shortest the work could take on its streams (the longest stream's busy time)")]
    gpu_threads: Annotated[int, doc("threads the GPU runs at once")]
    hideable_ns: Annotated[int, doc("time that could overlap with other streams")]
    implicit_sync_calls: Annotated[list[T009ImplicitSyncCall], doc("calls that synchronize streams implicitly")]
    kernels_filling_gpu_share: Annotated[float, doc("share of kernel time in kernels that fill the GPU alone")]
    overlap_ns: Annotated[int, doc("time streams overlapped")]
    reasons: Annotated[list[str], doc("why the streams ran serialized")]
    shorter_streams_ns: Annotated[int, doc("busy time of the streams other than the longest")]
    streams: Annotated[list[T009Stream], doc("streams")]
    union_ns: Annotated[int, doc("time any of the streams was busy")]
    waiting_ops: Annotated[int, doc("operations waiting on another stream")]
    worst: Annotated[list[T009Example], doc("the operations that could overlap most")]


RULE = Rule(
    id="T009",
    evidence=T009Evidence,
    name="serialized-streams",
    title="Streams that could overlap and never do",
    phase="timeline",
    severity="warning",
    claims="compute",
    what="Devices whose work is spread over two or more streams, each with a meaningful share, that never (or "
         "almost never) run at the same time although their work was ready at once: what could have run beside "
         "the other streams' work, an upper bound, and what the trace shows orders them (the legacy default "
         "stream, calls that synchronize the device, one copy engine, kernels that fill the GPU).",
    why="Streams exist so that independent work overlaps: copies under kernels, small kernels beside each "
        "other. Streams that run one after another give none of that, and the reason is usually one line: work "
        "on the legacy default stream, which waits for and blocks the other blocking streams, or depth-first issue "
        "on a GPU with one copy engine. Calls that synchronize the device between launches (cudaMalloc, copies "
        "that are not Async) order streams too, though mostly with the host waiting (T003) rather than work "
        "ready and waiting on the GPU.",
    how="Per device, each stream's operations (kernels, copies, memsets; unified-memory migrations and "
        "collectives aside: a collective's overlap is T007's). Streams with at least `min_stream_share` of the "
        "device's operation time are chosen; with two or more, their time side by side (their summed time "
        "minus their union) must be at most `max_overlap_share` of the time of all but the longest. Each "
        "operation is ready when its launch call returned and its stream's earlier work was done; of the time "
        "it then waited, the part during which only work on other units ran (another copy direction, a kernel "
        "beside a copy; a kernel that does not fill the GPU beside anything) is what it could have overlapped, "
        "at most its own time. The estimated loss is the sum, at most the union's excess over the least time the "
        "work could take (its longest stream, each unit's total: copies of one direction, or all copies on a GPU "
        "with one copy engine (nsys `asyncEngines`), kernels that fill the GPU (threads >= SMs x warps per SM x "
        "warp size)). No finding where the program orders the streams itself (cudaStreamWaitEvent calls in the "
        "window, at least `max_event_waits_share` per waiting operation), the loss is under `min_loss_ns`, or the "
        "trace is sampled or stripped (T010). "
        "The message names what the trace shows: stream 7 (the legacy default stream in nsys and PyTorch "
        "traces) among them, synchronizing calls (cudaMalloc, cudaFree, copies and memsets that are not Async, "
        "synchronize calls) in the window, one copy engine, kernels that fill the GPU.",
    fix="Issue independent work on non-default streams created with cudaStreamNonBlocking; keep allocation and "
        "synchronous copies out of the loop; on a GPU with one copy engine, issue breadth-first.",
    requires="timed GPU operations on two or more streams",
    applies_sql="SELECT count(DISTINCT stream_id) >= 2 FROM gpu_activity WHERE run_id = $run_id",
    thresholds=(
        Threshold("min_stream_share", 0.1, "A stream takes part with at least this share of its device's operation time."),
        Threshold("max_overlap_share", 0.05, "The chosen streams count as never overlapping when their time side by "
                  "side is at most this share of the time of all but the longest."),
        Threshold("max_event_waits_share", 0.5, "No finding when the window holds at least this many "
                  "cudaStreamWaitEvent calls per waiting operation: the program orders the streams itself."),
        Threshold("min_loss_ns", 100000, "The estimated loss must be at least this (100 us)."),
        Threshold("max_examples", 5, "How many waiting operations and synchronizing calls the evidence lists."),
    ),
    evaluate=evaluate,
    max_severity="warning",
    severity_reason=("its estimated loss is an upper bound: the streams could have overlapped only where nothing the "
                     "trace does not show orders them, not time measured lost"),
    references=(
        "CUDA C++ Programming Guide: Asynchronous Concurrent Execution, Implicit Synchronization, Default Stream",
        "CUDA sample simpleStreams / 'How to Overlap Data Transfers in CUDA C/C++' (NVIDIA blog)",
    ),
)
