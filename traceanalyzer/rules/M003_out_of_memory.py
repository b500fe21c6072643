"""M003 out of memory: an allocation that failed in a memory snapshot's history, what it asked
for, what was free, and what held the memory at that moment."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import msgspec

from ..fmt import nbytes, ns
from . import _memory as mem
from .base import Rule, Threshold
from .evidence import AllocationSite, Evidence, doc

if TYPE_CHECKING:
    import pandas as pd

OOMS_SQL = """
SELECT device_id, count(*) AS ooms, arg_max(event_id, event_id) AS event_id
FROM allocator_events WHERE run_id = $run_id AND action = 'oom'
GROUP BY device_id ORDER BY device_id
"""


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    start = mem.run_start(store, run_id)
    rows = []
    for device, ooms, event_id in store.sql(OOMS_SQL, {"run_id": run_id}).fetchall():
        ts, request, device_free, stack_id = store.sql(
            "SELECT ts_ns, bytes, device_free_bytes, stack_id FROM allocator_events WHERE run_id = ? AND event_id = ?",
            [run_id, event_id]).fetchone()
        level = mem.level_at(store, run_id, event_id)
        allocated, reserved = level["allocated"], level["reserved"]
        cache_free = max(reserved - allocated, 0)
        ranked, before = mem.holders(store, run_id, device, event_id, allocated)
        requester = mem.sites(store, run_id, [stack_id]).get(stack_id) if stack_id is not None else None
        request = request or 0
        if cache_free >= request:
            cause, hint = ("fragmentation", (
                f"The allocator held {nbytes(cache_free)} reserved but unallocated, more than the request, in no "
                "block large enough: the memory is fragmented (see M002 for the setting that helps, usually "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)."))
        elif device_free is not None and device_free + cache_free >= request:
            cause, hint = ("device", (
                f"CUDA reported {nbytes(device_free)} free, yet a new segment for the request could not be had: "
                "check torch.cuda.set_per_process_memory_fraction, other processes on the device, and "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow instead of needing one free range)."))
        else:
            cause, hint = ("full", (
                "The device was full of live tensors: cut what the top sites hold at that moment (evidence: "
                "`holders`): activation checkpointing for activations, smaller micro-batches, bf16/fp16 "
                "(mixed precision), sharding parameters and optimizer state (FSDP/ZeRO), or free tensors "
                "earlier."))
        at = "" if ts is None or start is None else f" at +{ns(ts - start)}"
        where = f" from {requester.text()}" if requester else ""
        free = f", {nbytes(device_free)} free on the device" if device_free is not None else ""
        message = (f"device {device}: out of memory{at}: a {nbytes(request)} allocation{where} failed with "
                   f"{nbytes(allocated)} allocated and {nbytes(reserved)} reserved by PyTorch{free}; "
                   f"held most by {mem.holders_text(ranked, before, allocated)}")
        if ooms > 1:
            message += f" (the last of {ooms} OOMs)"
        rows.append({
            "device_id": device, "item_kind": "memory", "item_id": event_id, "item_name": "out of memory",
            "start_ns": ts, "end_ns": ts, "value": float(request), "value_unit": "bytes", "threshold": None,
            "severity": "error", "message": message, "hint": hint,
            "evidence": {
                "requested_bytes": request, "device_free_bytes": device_free, "allocated_bytes": allocated,
                "reserved_bytes": reserved, "reserved_unallocated_bytes": cache_free, "cause": cause,
                "ooms": ooms, "requested_by": None if requester is None else {
                    "site": requester.label, "user_frames": list(requester.user_frames[:6]),
                    "via": requester.via, "op": requester.op},
                "before_history_bytes": before,
                "holders": [mem.holder_evidence(h, allocated) for h in ranked[:p["max_examples"]]],
            },
        })
    return pd.DataFrame(rows)


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class M003RequestedBy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    op: Annotated[str, doc("the operator")]
    site: Annotated[str, doc("the allocation site (user code)")]
    user_frames: Annotated[list[str], doc("the user code's stack frames")]
    via: Annotated[Optional[str], doc("the library call the user code made")]


class M003Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    cause: Annotated[str, doc("why the request failed: `fragmentation`, `device` (CUDA had no memory) or `full`")]
    allocated_bytes: Annotated[int, doc("bytes allocated to live tensors")]
    before_history_bytes: Annotated[int, doc("bytes allocated before the recorded history began")]
    device_free_bytes: Annotated[Optional[int], doc("device memory free at the failure, as CUDA reported it")]
    holders: Annotated[list[AllocationSite], doc("who held the memory at the failure, largest first")]
    ooms: Annotated[int, doc("out-of-memory events")]
    requested_by: Annotated[Optional[M003RequestedBy], doc("the code that made the failed request")]
    requested_bytes: Annotated[int, doc("the failed request's bytes")]
    reserved_bytes: Annotated[int, doc("bytes reserved by the allocator")]
    reserved_unallocated_bytes: Annotated[int, doc("bytes reserved but not allocated")]


RULE = Rule(
    id="M003",
    evidence=M003Evidence,
    name="out-of-memory",
    title="Out-of-memory error in the allocator history",
    phase="memory",
    severity="error",
    what="An allocation that failed (`oom` in a memory snapshot's history): what was requested and from where, "
         "what was allocated, reserved and free at that moment, and which lines of code held the memory.",
    why="An OOM's message names the failing request, not what filled the device; the snapshot's history "
        "knows every allocation alive at that moment and the stack that made it.",
    how="Per device, the last `oom` event (the count of all of them is in the evidence). Allocated and "
        "reserved memory at that moment come from replaying the history back from the snapshot "
        "(allocated: `alloc` minus `free_requested`; what the history does not account for was allocated "
        "before it began). The allocations alive then are those whose address was neither freed nor reused "
        "since; they are grouped by site, the innermost frame of the user's own code (PyTorch and other "
        "library frames folded into the library call and ATen operator beside it). The cause is "
        "`fragmentation` when reserved-but-unallocated memory covered the request, `device` when CUDA "
        "reported enough free memory beside it, else `full`.",
    fix="Fragmentation: see M002 (usually `expandable_segments:True`). A full device: cut what the top sites "
        "hold (activation checkpointing, smaller micro-batches, mixed precision, FSDP/ZeRO).",
    requires="a PyTorch memory snapshot with its allocator history (torch.cuda.memory._record_memory_history)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM allocator_events WHERE run_id = $run_id)",
    thresholds=(
        Threshold("max_examples", 5, "How many sites holding memory at the OOM the evidence lists."),
    ),
    evaluate=evaluate,
    references=(
        "PyTorch: 'Understanding CUDA Memory Usage' (the oom action of the allocator history)",
        "PyTorch, CUDA semantics: 'Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF'",
    ),
)
