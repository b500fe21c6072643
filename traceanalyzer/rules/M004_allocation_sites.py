"""M004 allocation sites at the peak: the lines of code whose allocations were alive when
allocated memory peaked in a memory snapshot's history."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional


from ..fmt import nbytes, ns, pct
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
        optimizer = sum(h.bytes for h in ranked if _in_optimizer(h.site))
        rows.append({
            "device_id": peak["device_id"], "item_kind": "memory", "item_id": peak["event_id"],
            "item_name": "allocation sites at the peak", "start_ns": ts,
            "end_ns": peak["next_ts"] if peak["next_ts"] is not None else ts,
            "value": float(allocated), "value_unit": "bytes", "threshold": None, "severity": "info",
            # the history's sizes are those asked for; the allocator rounds them up into blocks
            # (torch.cuda.memory_allocated counts the blocks), and reserved memory is whole segments
            "message": (f"device {peak['device_id']}: allocated memory peaked at {nbytes(allocated)} in requested "
                        f"sizes{at} ({nbytes(peak['reserved'])} reserved); held most by "
                        f"{mem.holders_text(ranked, before, allocated)}"),
            "hint": (_optimizer_hint(optimizer, allocated) if optimizer >= p["min_optimizer_share"] * allocated else
                     "The lines listed made the tensors alive at the peak: free them earlier, recompute them "
                     "(activation checkpointing), make them smaller (micro-batches, bf16/fp16) or shard them "
                     "(FSDP/ZeRO)" + (f"; start with {top.site.label}." if top else ".")
                     + (" Most of the peak was allocated before the history was recorded (parameters and buffers, "
                        "usually): call torch.cuda.memory._record_memory_history() before the model is built to see "
                        "where." if before > (top.bytes if top else 0) else "")),
            "evidence": {
                "peak_allocated_bytes": allocated, "peak_reserved_bytes": peak["reserved"],
                "before_history_bytes": before, "history_events": peak["events"],
                "sites": [mem.holder_evidence(h, allocated) for h in ranked[:p["max_examples"]]],
                "sites_total": len(ranked), "optimizer_bytes": optimizer,
            },
        })
    return pd.DataFrame(rows)


def _in_optimizer(site: mem.Site) -> bool:
    """Whether an allocation was made in an optimizer's code (a frame in a file or module named
    like `optim`: torch/optim/adamw.py, the user's optimizers.py): its state, made at its first step."""
    return any("optim" in f.split(":", 1)[0].lower() for f in (site.label, *site.user_frames, site.via or ""))


def _optimizer_hint(optimizer: int, allocated: int) -> str:
    return (f"{nbytes(optimizer)} of the peak ({pct(optimizer / allocated)}) is optimizer state made in its step "
            "(Adam and AdamW keep two moments per parameter: 8 bytes per fp32 parameter, besides the parameters and "
            "their gradients): activation checkpointing and micro-batches do not touch it. An 8-bit or factored "
            "optimizer (bitsandbytes' 8-bit AdamW, Adafactor), 16-bit states, or sharding the states across GPUs "
            "(ZeRO, FSDP) do.")


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class M004Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    before_history_bytes: Annotated[int, doc("bytes allocated before the recorded history began")]
    history_events: Annotated[int, doc("allocator events in the snapshot's history")]
    peak_allocated_bytes: Annotated[int, doc("peak allocated bytes, in the sizes requested (the history's; the allocator's blocks, rounded up, come to a little more)")]
    peak_reserved_bytes: Annotated[int, doc("peak reserved bytes")]
    sites: Annotated[list[AllocationSite], doc("allocation sites by bytes held at the peak")]
    sites_total: Annotated[int, doc("allocation sites in all")]
    optimizer_bytes: Annotated[Optional[int], doc("of the peak, bytes allocated in an optimizer's code (its state)")] = None


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
        "account for was allocated before it began. Where `min_optimizer_share` of the peak was allocated in "
        "an optimizer's code (a frame in a file named like `optim`: its state, `optimizer_bytes`), the hint is "
        "about optimizer state, which checkpointing does not touch.",
    fix="Free, recompute (activation checkpointing), shrink (micro-batches, mixed precision) or shard "
        "(FSDP/ZeRO) what the top sites hold at the peak.",
    requires="a PyTorch memory snapshot with its allocator history (torch.cuda.memory._record_memory_history)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM allocator_events WHERE run_id = $run_id AND action = 'alloc')",
    thresholds=(
        Threshold("max_examples", 5, "How many sites the evidence lists."),
        Threshold("min_optimizer_share", 0.25, "Share of the peak allocated in an optimizer's code from which the "
                  "hint is about optimizer state (activation checkpointing does not touch it)."),
    ),
    evaluate=evaluate,
    references=(
        "PyTorch: 'Understanding CUDA Memory Usage' (memory snapshots, the active memory timeline)",
    ),
)
