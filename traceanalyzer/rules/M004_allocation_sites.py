"""M004 allocation sites at the peak: the lines of code whose allocations were alive when
allocated memory peaked in a memory snapshot's history."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated


from ..fmt import nbytes, ns
from . import _memory as mem
from .base import Rule, Threshold
from .evidence import AllocationSite, Evidence, doc

if TYPE_CHECKING:
    import pandas as pd


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    start = mem.run_start(store, run_id)
    rows = []
    for peak in mem.peaks(store, run_id):
        allocated = peak["allocated"]
        ranked, before = mem.holders(store, run_id, peak["device_id"], peak["event_id"], allocated)
        ts = peak["ts_ns"]
        at = "" if ts is None or start is None else f" at +{ns(ts - start)}"
        top = ranked[0] if ranked else None
        rows.append({
            "device_id": peak["device_id"], "item_kind": "memory", "item_id": peak["event_id"],
            "item_name": "allocation sites at the peak", "start_ns": ts,
            "end_ns": peak["next_ts"] if peak["next_ts"] is not None else ts,
            "value": float(allocated), "value_unit": "bytes", "threshold": None, "severity": "info",
            "message": (f"device {peak['device_id']}: allocated memory peaked at {nbytes(allocated)}{at} "
                        f"({nbytes(peak['reserved'])} reserved); held most by {mem.holders_text(ranked, before, allocated)}"),
            "hint": ("The lines listed made the tensors alive at the peak: free them earlier, recompute them "
                     "(activation checkpointing), make them smaller (micro-batches, bf16/fp16) or shard them "
                     "(FSDP/ZeRO)" + (f"; start with {top.site.label}." if top else ".")
                     + (" Most of the peak was allocated before the history was recorded (parameters and buffers, "
                        "usually): call torch.cuda.memory._record_memory_history() before the model is built to see "
                        "where." if before > (top.bytes if top else 0) else "")),
            "evidence": {
                "peak_allocated_bytes": allocated, "peak_reserved_bytes": peak["reserved"],
                "before_history_bytes": before, "history_events": peak["events"],
                "sites": [mem.holder_evidence(h, allocated) for h in ranked[:p["max_examples"]]],
                "sites_total": len(ranked),
            },
        })
    return pd.DataFrame(rows)


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class M004Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    before_history_bytes: Annotated[int, doc("bytes allocated before the recorded history began")]
    history_events: Annotated[int, doc("allocator events in the snapshot's history")]
    peak_allocated_bytes: Annotated[int, doc("peak allocated bytes")]
    peak_reserved_bytes: Annotated[int, doc("peak reserved bytes")]
    sites: Annotated[list[AllocationSite], doc("allocation sites by bytes held at the peak")]
    sites_total: Annotated[int, doc("allocation sites in all")]


RULE = Rule(
    id="M004",
    evidence=M004Evidence,
    name="allocation-sites",
    title="Allocation sites holding memory at the peak",
    phase="memory",
    severity="info",
    what="When allocated memory peaked in a memory snapshot's history, the lines of the user's own code whose "
         "allocations were alive, with the library call and ATen operator that made them.",
    why="To fit a bigger batch or stop an OOM, cut what is alive at the peak; the snapshot's stacks say "
        "which line of the model made each of those tensors.",
    how="Allocated memory after each event of the history, anchored at the snapshot (see M003); the peak is "
        "the first event reaching the highest level, within the recorded history (a ring buffer: an earlier "
        "peak may have fallen out of it). The allocations alive then (address neither freed nor reused since) "
        "are grouped by the innermost frame of the user's own code (a `.py` file outside site-packages, "
        "dist-packages, the Python library and `torch/`), most bytes first; memory the history does not "
        "account for was allocated before it began.",
    fix="Free, recompute (activation checkpointing), shrink (micro-batches, mixed precision) or shard "
        "(FSDP/ZeRO) what the top sites hold at the peak.",
    requires="a PyTorch memory snapshot with its allocator history (torch.cuda.memory._record_memory_history)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM allocator_events WHERE run_id = $run_id AND action = 'alloc')",
    thresholds=(
        Threshold("max_examples", 5, "How many sites the evidence lists."),
    ),
    evaluate=evaluate,
    references=(
        "PyTorch: 'Understanding CUDA Memory Usage' (memory snapshots, the active memory timeline)",
    ),
)
