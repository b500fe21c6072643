"""M005 peak memory by category: what the peak of a PyTorch profiler memory timeline, or of a
Kineto trace's allocator events categorised from operator context, was made of (parameters,
optimizer state, activations, gradients, ...), the share of activations named."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import msgspec

from ..fmt import nbytes, ns, pct
from ..summary import TRAINING_CONTEXT_SQL, kineto_category_peaks, timeline_peaks
from .base import Rule, Threshold
from .evidence import Evidence, doc

if TYPE_CHECKING:
    import pandas as pd

# What to try, by the category that dominates the peak.
FIXES = {
    "activation": "activation checkpointing (torch.utils.checkpoint), smaller micro-batches (with gradient "
                  "accumulation), mixed precision (bf16/fp16 autocast)",
    "parameter": "lower-precision weights (bf16), or sharding them (FSDP/ZeRO-3)",
    "optimizer_state": "a lighter optimizer state (8-bit or factored optimizers, fused/foreach off for the peak), "
                       "or sharding it (FSDP/ZeRO-1)",
    "gradient": "freeing gradients as they are used (optimizer step in backward, zero_grad(set_to_none=True)), "
                "or sharding them (ZeRO-2)",
    "temporary": "fusing the operators that make short-lived tensors (torch.compile), in-place operations",
    "input": "smaller input batches, or keeping inputs on the host until needed",
    "autograd_detail": "these are the backward pass's own intermediates (gradients passed between operators): "
                       "smaller micro-batches, mixed precision",
    "unknown": "the profiler could not tell what these are: record with profile_memory=True, record_shapes=True "
               "and with_stack=True to name them",
}


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    start = store.sql("SELECT start_ns FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
    rows = []
    # a timeline: the level after each time step, as PyTorch's plot draws it; Kineto: after each event
    peaks = [(p, "memory timeline") for p in timeline_peaks(store, run_id)] + \
            [(p, "allocator events and operator context") for p in kineto_category_peaks(store, run_id)]
    for peak, source in peaks:
        device, ts, event_id, next_ts = peak["device_id"], peak["ts_ns"], peak["event_id"], peak["next_ts"]
        total, end_total, steps, split = peak["total"], peak["end_total"], peak["steps"], peak["categories"]
        share = {c: (b / total if total else None) for c, b in split}
        act_share = share.get("activation") or 0.0
        top = split[0][0] if split else None
        listed = ", ".join(f"{c.replace('_', ' ')} {nbytes(b)} ({pct(b / total) if total else '-'})" for c, b in split)
        at = "" if ts is None or start is None else f" at +{ns(ts - start)}"
        message = f"device {device}: memory peaked at {nbytes(total)}{at}: {listed}"
        named = act_share > 0 and act_share >= p["min_activation_share"]
        hint = []
        if named:
            message += f"; activations are {pct(act_share)} of it"
            hint.append(f"Activations are {pct(act_share)} of the peak: {FIXES['activation']}.")
        if top and not (named and top == "activation"):
            what = top.replace("_", " ")
            if top == "parameter" and source != "memory timeline":  # (what was there before the capture)
                what += (", allocated before the capture: weights, and gradients or optimizer state kept "
                         "from earlier steps")
            hint.append(f"The largest part is {what} ({pct(share[top])}): {FIXES.get(top, FIXES['unknown'])}.")
        rows.append({
            "device_id": device, "item_kind": "memory", "item_id": event_id, "item_name": "peak memory by category",
            "start_ns": ts, "end_ns": next_ts if next_ts is not None else ts, "value": float(total),
            "value_unit": "bytes", "threshold": None, "severity": "info",
            "message": message, "hint": " ".join(hint),
            "evidence": {"source": source, "peak_bytes": int(total), "end_bytes": int(end_total),
                         "time_steps": steps,
                         "activation_share": act_share, "largest_category": top,
                         "categories": [{"category": c, "bytes": b, "share": share[c]} for c, b in split]},
        })
    return pd.DataFrame(rows)


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class M005Category(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    bytes: Annotated[int, doc("bytes")]
    category: Annotated[str, doc("memory category (activation, parameter, gradient, ...)")]
    share: Annotated[float, doc("share of the total")]


class M005Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    activation_share: Annotated[float, doc("share of the peak held by activations")]
    categories: Annotated[list[M005Category], doc("bytes at the peak per memory category")]
    end_bytes: Annotated[int, doc("bytes held at the end of the timeline")]
    largest_category: Annotated[str, doc("the category holding most bytes at the peak")]
    peak_bytes: Annotated[int, doc("bytes at the peak")]
    source: Annotated[str, doc("the memory timeline the categories come from")]
    time_steps: Annotated[int, doc("time steps in the memory timeline")]


RULE = Rule(
    id="M005",
    evidence=M005Evidence,
    name="memory-categories",
    title="Peak memory by category",
    phase="memory",
    severity="info",
    what="The peak of a PyTorch profiler memory timeline, or of a Kineto trace's allocator events in a training "
         "step, and what it is made of: parameters, optimizer state, inputs, temporaries, activations, gradients, "
         "autograd detail, unknown; the share of activations named.",
    why="Parameters, activations and optimizer state call for different cuts: activations (usually the "
        "largest share in training) shrink with checkpointing, micro-batches and mixed precision; optimizer "
        "state and parameters with sharding and lighter optimizers.",
    how="From `memory_timeline` (`prof.export_memory_timeline`), per device: the level after each time step "
        "(as PyTorch's own plot draws it); the peak is the first step at the highest level, split by the "
        "categories PyTorch's memory profiler gave each tensor (`activation`: made in the forward pass from "
        "inputs and kept for backward; `autograd_detail`: made in the backward pass). From a Kineto trace "
        "(`[memory]` events with addresses, profile_memory=True) with a backward operator or an optimizer step: "
        "M001's peak, each allocation live then (paired with its free by address) categorised by where it was "
        "made and freed: per step (`ProfilerStep#N`, else the whole run) forward is until the first backward "
        "operator (`autograd::engine::evaluate_function`, `*backward*`, on any thread), backward until the last "
        "one ends; an optimizer step is an `Optimizer.step#`/`optimizer.step` range. Made and freed in the same "
        "stretch (one of these, or between steps): `temporary`; made in an optimizer step and alive after it: "
        "`optimizer_state`; made in backward and alive after it: `gradient`; made in forward and freed in the "
        "step's backward: `activation`; else `unknown`; what was allocated before the capture (`Total Allocated` "
        "before the first event, less what the trace frees of it): `parameter`. It cannot tell optimizer state "
        "or gradients kept from steps before the capture from parameters (all `parameter`), nor, with gradient "
        "accumulation, a later micro-batch's forward from backward. When activations reach "
        "`min_activation_share` of the peak the finding names their share and leads its hint with their fixes.",
    fix="Activations: activation checkpointing, smaller micro-batches, mixed precision. Optimizer state and "
        "parameters: FSDP/ZeRO sharding, 8-bit optimizers. Gradients: free them as they are applied.",
    requires="a PyTorch profiler memory timeline (prof.export_memory_timeline, profile_memory=True), or a Kineto "
             "trace of training steps with allocator events (profile_memory=True)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM memory_timeline WHERE run_id = $run_id) OR ("
                "EXISTS (SELECT 1 FROM memory_events WHERE run_id = $run_id AND device_type = 'cuda' "
                f"AND device_id >= 0 AND address IS NOT NULL) AND {TRAINING_CONTEXT_SQL})",
    thresholds=(
        Threshold("min_activation_share", 0.5, "Activations at this share of the peak are named, and their fixes lead the hint."),
    ),
    evaluate=evaluate,
    references=(
        "PyTorch: torch.profiler._memory_profiler (categories), profile.export_memory_timeline",
        "PyTorch blog: 'Understanding GPU Memory 1: Visualizing All Allocations over Time'",
    ),
)
