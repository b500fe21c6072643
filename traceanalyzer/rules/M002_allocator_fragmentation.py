"""M002 allocator fragmentation: free memory the caching allocator holds but cannot hand out
for a large request, from a memory snapshot, and which allocator setting would help."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import msgspec

from ..fmt import nbytes, pct
from . import _memory as mem
from .base import Rule, Threshold
from .evidence import Evidence, doc

if TYPE_CHECKING:
    import pandas as pd

MIB = 1 << 20
# PyTorch refuses max_split_size_mb at or under 20 (its large-buffer size).
_MIN_SPLIT_MB = 21

PINNING_SQL = """
SELECT b.stack_id, sum(b.bytes) AS bytes, count(DISTINCT b.segment_id) AS segments
FROM memory_blocks b JOIN memory_segments s ON s.run_id = b.run_id AND s.segment_id = b.segment_id
WHERE b.run_id = $run_id AND s.device_id = $device AND b.state = 'active_allocated'
  AND EXISTS (SELECT 1 FROM memory_blocks f WHERE f.run_id = b.run_id AND f.segment_id = b.segment_id
              AND f.state = 'inactive')
GROUP BY b.stack_id
"""


def _split_size_mb(st: dict) -> int | None:
    """A max_split_size_mb under the pinned segments' size and over the blocks pinning them
    (a power of two), or None when no such value exists."""
    seg, pin = st["pinned_segment_bytes"], st["pinning_block_bytes"] or 0
    if not seg:
        return None
    mb = 1 << max(int(seg // 2 // MIB).bit_length() - 1, 0)
    return mb if mb >= _MIN_SPLIT_MB and mb * MIB > pin else None


def _advice(st: dict, conf: dict) -> list[dict]:
    """Each allocator setting, whether it would help here, and why."""
    out = []
    expandable, max_split = conf.get("expandable_segments"), conf.get("max_split_size_bytes")
    spread = st["stranded_segments"] >= 2
    if expandable:
        out.append({"setting": "expandable_segments", "helps": False,
                    "why": "already on: segments already grow in place"})
    else:
        out.append({"setting": "expandable_segments", "helps": spread,
                    "why": (f"the free memory lies in {st['stranded_segments']} separate segments, each sized for an "
                            "earlier request and kept by the live tensors in it; with expandable segments each stream's "
                            "memory is one segment that grows and shrinks by pages, so freed space is not stranded "
                            "between segments and a large request is served from it")
                    if spread else "the free memory is not spread over several segments"})
    pinned = st["pinned_free"] >= 0.5 * st["stranded"] and st["pinned_segments"] > 0
    mb = _split_size_mb(st) if pinned else None
    if expandable:  # PyTorch's should_split ignores max_split_size for expandable segments
        out.append({"setting": "max_split_size_mb", "helps": False, "value_mb": None,
                    "why": "has no effect with expandable segments, which split blocks whatever it is"})
    elif max_split is not None:
        out.append({"setting": "max_split_size_mb", "helps": False, "value_mb": max_split // MIB,
                    "why": f"already set ({max_split // MIB} MB)"})
    else:
        out.append({"setting": "max_split_size_mb", "helps": mb is not None, "value_mb": mb,
                    "why": (f"{pct(st['pinned_free'] / st['stranded'])} of the stranded memory is in "
                            f"{st['pinned_segments']} segments (median {nbytes(st['pinned_segment_bytes'])}) kept by live "
                            f"blocks of a quarter of their size or less (the largest {nbytes(st['pinning_block_bytes'])}): "
                            f"with max_split_size_mb:{mb} blocks larger than {mb} MB are no longer split for small requests, "
                            "so large segments stay whole for large ones") if mb is not None else
                           ("the stranded memory is mostly not in large segments held by small blocks")})
    return out


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    conf = mem.settings(store, run_id)
    rows = []
    for st in mem.snapshot_state(store, run_id):
        reserved, stranded = st["reserved"] or 0, st["stranded"] or 0
        oom = st["failed_request"] is not None
        request = st["failed_request"] if oom else (st["largest_request"] or st["largest_live"])
        largest = st["largest_stranded"] or 0
        caused_oom = oom and stranded >= request > largest
        big_enough = (stranded > 0 and stranded >= p["min_fragmented_bytes"]  # some stranded, whatever the thresholds
                      and reserved > 0 and stranded / reserved >= p["min_fragmented_share"])
        if not (big_enough or caused_oom):
            continue
        advice = _advice(st, conf)
        helps = [a for a in advice if a["helps"]]
        fits = ""
        if request:
            what = f"the {nbytes(request)} allocation that failed" if oom else f"the largest request ({nbytes(request)})"
            fits = f"; {what} fits in none of them" if request > largest else f"; {what} still fits in one"
        cached = ""
        if st["cached"]:
            cached = (f"; {nbytes(st['cached'])} more is cached in {st['cached_segments']} wholly free segments "
                      "(released when the allocator needs room, or by torch.cuda.empty_cache())")
        message = (f"device {st['device_id']}: {nbytes(stranded)} ({pct(stranded / reserved) if reserved else '-'}) of the {nbytes(reserved)} "
                   f"reserved is free but stranded in {st['stranded_segments']} segments that also hold live tensors "
                   f"(largest free block {nbytes(largest)}){fits}{cached}")
        if caused_oom:
            message += ": fragmentation made the allocation fail"
        settings_text = []
        for a in helps:
            name = "expandable_segments:True" if a["setting"] == "expandable_segments" else f"max_split_size_mb:{a['value_mb']}"
            settings_text.append(f"{name} ({a['why']})")
        if settings_text:
            hint = ("Set PYTORCH_CUDA_ALLOC_CONF=" + settings_text[0]
                    + ("; or " + settings_text[1] if len(settings_text) > 1 else "") + ".")
        else:
            hint = ("No allocator setting is indicated (" + "; ".join(f"{a['setting']}: {a['why']}" for a in advice)
                    + "): free the tensors that keep these segments (evidence: `pinned_by`) earlier, or allocate "
                    "the large buffers first and reuse them.")
        pinning = store.sql(PINNING_SQL, {"run_id": run_id, "device": st["device_id"]}).fetchall()
        by_stack = mem.sites(store, run_id, [r[0] for r in pinning])
        pinned_by: dict[str, list[int]] = {}
        for stack_id, n, segments in pinning:
            label = by_stack[stack_id].text() if stack_id is not None else mem.NO_STACK
            acc = pinned_by.setdefault(label, [0, 0])
            acc[0] += int(n)
            acc[1] += int(segments)
        rows.append({
            "device_id": st["device_id"], "item_kind": "device", "item_id": st["device_id"],
            "item_name": "allocator fragmentation", "start_ns": None, "end_ns": None,
            "value": float(stranded), "value_unit": "bytes", "threshold": float(p["min_fragmented_bytes"]),
            "severity": "error" if caused_oom else "warning", "message": message, "hint": hint,
            "evidence": {
                "reserved_bytes": reserved, "allocated_bytes": st["allocated"],
                "reserved_unallocated_bytes": reserved - (st["allocated"] or 0), "pending_free_bytes": st["pending"],
                "free_bytes": st["free"], "largest_free_block_bytes": st["largest_free"],
                "stranded_bytes": stranded, "stranded_segments": st["stranded_segments"],
                "largest_stranded_block_bytes": largest, "cached_bytes": st["cached"] or 0,
                "cached_segments": st["cached_segments"], "segments": st["segments"],
                "request_bytes": request, "request": "failed (oom)" if oom else "largest in the history",
                "oom_event_id": st["oom_event"], "fragmentation_caused_oom": bool(caused_oom),
                "allocator_settings": conf, "advice": advice,
                "pinned_by": [{"site": k, "bytes": v[0], "segments": v[1]}
                              for k, v in sorted(pinned_by.items(), key=lambda kv: (-kv[1][0], kv[0]))][:p["max_examples"]],
            },
        })
    return pd.DataFrame(rows)


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class M002Advice(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    helps: Annotated[bool, doc("whether the setting would help here")]
    setting: Annotated[str, doc("the allocator setting")]
    why: Annotated[str, doc("why it helps or not")]
    value_mb: Annotated[Optional[int], doc("suggested value, MB")] = None


class M002AllocatorSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    alloc_conf: Annotated[str, doc("PYTORCH_CUDA_ALLOC_CONF as recorded")]
    expandable_segments: Annotated[bool, doc("whether expandable segments were on")]
    max_split_size_bytes: Annotated[Optional[int], doc("max_split_size_mb in bytes, null if unset")]


class M002PinnedBy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    bytes: Annotated[int, doc("bytes it holds there")]
    segments: Annotated[int, doc("segments it keeps")]
    site: Annotated[str, doc("the allocation site (user code)")]


class M002Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    advice: Annotated[list[M002Advice], doc("allocator settings to try, each with why and whether it helps here")]
    allocated_bytes: Annotated[int, doc("bytes allocated to live tensors")]
    allocator_settings: Annotated[M002AllocatorSettings, doc("the caching allocator's settings recorded in the snapshot")]
    cached_bytes: Annotated[int, doc("bytes reserved by the allocator but not allocated")]
    cached_segments: Annotated[int, doc("segments reserved but holding no allocation")]
    fragmentation_caused_oom: Annotated[bool, doc("whether the request would have fit in the free bytes if not fragmented")]
    free_bytes: Annotated[int, doc("bytes free inside reserved segments")]
    largest_free_block_bytes: Annotated[int, doc("the largest free block")]
    largest_stranded_block_bytes: Annotated[int, doc("the largest free block in a segment that cannot be released")]
    oom_event_id: Annotated[Optional[int], doc("the out-of-memory event, if any")]
    pending_free_bytes: Annotated[int, doc("bytes freed but waiting on a stream before reuse")]
    pinned_by: Annotated[list[M002PinnedBy], doc("the allocation sites that keep segments from being released")]
    request: Annotated[str, doc("which request is weighed: `failed (oom)` or `largest in the history`")]
    request_bytes: Annotated[int, doc("that request's bytes")]
    reserved_bytes: Annotated[int, doc("bytes reserved by the allocator")]
    reserved_unallocated_bytes: Annotated[int, doc("bytes reserved but not allocated")]
    segments: Annotated[int, doc("segments reserved")]
    stranded_bytes: Annotated[int, doc("free bytes in segments that cannot be released")]
    stranded_segments: Annotated[int, doc("segments that hold free bytes but cannot be released")]


RULE = Rule(
    id="M002",
    evidence=M002Evidence,
    name="allocator-fragmentation",
    title="Fragmented caching-allocator memory",
    phase="memory",
    severity="warning",
    what="Free memory PyTorch's caching allocator holds in segments that also hold live tensors, so it can "
         "neither hand it out for a larger request nor give it back, from a memory snapshot; whether "
         "`expandable_segments` or `max_split_size_mb` would help, and why.",
    why="The allocator carves each segment (one cudaMalloc) into blocks; a free block inside a segment that "
        "also holds a live tensor stays reserved, and a request larger than every such block needs a new "
        "segment. With enough of them a run fails out of memory with gigabytes free in total: the classic "
        "'tried to allocate 2 GiB; 3 GiB reserved but unallocated'.",
    how="At the snapshot, per device: the free (`inactive`) bytes in segments that also hold an allocated or "
        "pending-free block are stranded; free bytes of wholly free segments are only cached (the allocator "
        "releases them before it fails, and `torch.cuda.empty_cache()` does). The request compared is the "
        "last `oom`'s, else the largest `alloc` of the history, else the largest live block. Fires when the "
        "stranded bytes reach `min_fragmented_bytes` and `min_fragmented_share` of reserved memory; an error "
        "when the failed request was no larger than the stranded bytes but larger than every stranded block. "
        "`expandable_segments` is advised when the stranded memory lies in two or more segments; "
        "`max_split_size_mb` when at least half of it lies in segments kept by live blocks of a quarter of "
        "their size or less, with a power of two under half those segments' median size and over the largest "
        "such block (PyTorch requires more than 20); neither when the snapshot's `allocator_settings` show it "
        "set already, and `max_split_size_mb` not with expandable segments (which ignore it). `pinned_by` lists where the live blocks of those segments were allocated.",
    fix="`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (or the `max_split_size_mb` the finding names); "
        "free long-lived small tensors allocated between large ones earlier, or allocate large buffers once "
        "and reuse them.",
    requires="a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM memory_blocks WHERE run_id = $run_id)",
    thresholds=(
        Threshold("min_fragmented_bytes", 1 << 30, "Report when stranded free memory reaches this (1 GiB) ..."),
        Threshold("min_fragmented_share", 0.1, "... and this share of reserved memory."),
        Threshold("max_examples", 5, "How many allocation sites pinning stranded segments the evidence lists."),
    ),
    evaluate=evaluate,
    references=(
        "PyTorch, CUDA semantics: 'Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF' (expandable_segments, max_split_size_mb)",
        "PyTorch: 'Understanding CUDA Memory Usage' (torch.cuda.memory._record_memory_history, _dump_snapshot)",
    ),
)
