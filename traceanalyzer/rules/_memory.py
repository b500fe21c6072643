"""What the memory-snapshot rules (M002-M004) share: the allocator's settings, the
allocations live at one moment of the recorded history, and allocation sites told from their
stacks.

The allocator's state at the snapshot (`snapshot_state`) and allocated and reserved memory
over the recorded history (`peaks`, `level_at`) are `summary`'s analyses, which `summary`
and `diff` show too (see its memory section: the history counts requested bytes and is
anchored at the snapshot); they are imported here under the names the rules use.

A site is the innermost frame of the user's own code (a `.py` file outside `site-packages`,
`dist-packages`, the Python library and `torch/`); the library call it made and the ATen
operator that allocated are kept beside it, so PyTorch's own frames fold into one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..fmt import nbytes, pct
from ..summary import history_level_at as level_at  # noqa: F401
from ..summary import history_peaks as peaks  # noqa: F401
from ..summary import snapshot_state  # noqa: F401

_LIBRARY_PATH = re.compile(r"/(?:site|dist)-packages/|/lib/python\d[\d.]*/|(?:^|/)torch/|^<")
_BACKWARD_NODE = re.compile(r"\btorch::autograd::(?:generated::)?(\w+)::apply\b")
_ATEN_OP = re.compile(r"\bat::_ops::(\w+)::(?:call|redispatch)\b")
# ATen operators that only make the memory another operator asked for.
_ALLOCATOR_OPS = re.compile(r"^(?:empty|empty_strided|empty_like|new_empty|new_empty_strided|resize_|empty_permuted|"
                            r"_empty_affine_quantized)$")
NO_STACK = "(no stack recorded)"


def frame_kind(filename: str | None) -> str:
    """`user`, `library` (a Python file of an installed package, the Python library or
    PyTorch) or `native` (C++ frames, and anything without a `.py` file)."""
    if not filename or not filename.endswith(".py"):
        return "native"
    return "library" if _LIBRARY_PATH.search(filename.replace("\\", "/")) else "user"


def _tail(filename: str, parts: int = 2) -> str:
    path = filename.replace("\\", "/")
    m = re.search(r"/(?:site|dist)-packages/(.+)$", path)
    if m:
        return m.group(1)
    return "/".join(path.split("/")[-parts:])


def _aten(name: str | None) -> str | None:
    m = _ATEN_OP.search(name or "")
    if not m:
        return None
    op = re.sub(r"_[A-Z]\w*$", "", m.group(1))  # the overload name (index_Tensor, add_Scalar)
    return None if _ALLOCATOR_OPS.match(op) else f"aten::{op}"


@dataclass(frozen=True)
class Site:
    """Where an allocation was made, as a person reads it."""

    label: str  # the innermost user frame "pkg/file.py:22 forward", or what stands in for it
    user_frames: tuple[str, ...]  # the user's frames, innermost first
    via: str | None  # the library call the user code made ("einops/einops.py:916 einsum")
    op: str | None  # the ATen operator that allocated ("aten::bmm")

    def text(self) -> str:
        how = " -> ".join(x for x in (self.via, self.op) if x)
        return f"{self.label} ({how})" if how else self.label


def site_of(frames: list[tuple[str | None, int | None, str | None]]) -> Site:
    """The site of one stack, frames innermost first as (filename, line, name)."""
    if not frames:
        return Site(NO_STACK, (), None, None)
    kinds = [frame_kind(f) for f, _, _ in frames]
    op = next((a for _, _, n in frames if (a := _aten(n))), None)
    user = [i for i, k in enumerate(kinds) if k == "user"]
    where = [f"{_tail(frames[i][0])}:{frames[i][1]} {frames[i][2]}" for i in user]
    if user:
        inner = user[0]
        lib = next((i for i in range(inner - 1, -1, -1) if kinds[i] == "library"), None)
        via = None if lib is None else f"{_tail(frames[lib][0])}:{frames[lib][1]} {frames[lib][2]}"
        return Site(where[0], tuple(where), via, op)
    lib = next((i for i, k in enumerate(kinds) if k == "library"), None)
    if lib is not None:
        f, line, name = frames[lib]
        return Site(f"{_tail(f)}:{line} {name} (no frame of your own code)", (), None, op)
    node = next((m.group(1) for _, _, n in frames if (m := _BACKWARD_NODE.search(n or ""))), None)
    if node:  # the autograd engine's thread runs backward without Python frames
        return Site(f"{node} in backward", (), None, op)
    return Site(f"{op or 'native code'} (no Python frame)", (), None, None)


def sites(store, run_id: str, stack_ids) -> dict[int, Site]:
    """stack id -> Site for the given stacks."""
    ids = sorted({int(s) for s in stack_ids if s is not None and s == s})
    frames: dict[int, list] = {s: [] for s in ids}
    if ids:
        for sid, filename, line, name in store.sql(
                "SELECT stack_id, filename, line, name FROM memory_frames WHERE run_id = ? AND list_contains(?, stack_id) "
                "ORDER BY stack_id, depth", [run_id, ids]).fetchall():
            frames[sid].append((filename, line, name))
    return {s: site_of(f) for s, f in frames.items()}


# -- the allocator's settings and the allocations live in its history ------------------------------

def settings(store, run_id: str) -> dict:
    """The snapshot's allocator settings ({} when it records none)."""
    row = store.sql("SELECT expandable_segments, max_split_size_bytes, alloc_conf FROM allocator_settings "
                    "WHERE run_id = ?", [run_id]).fetchone()
    return {} if row is None else {"expandable_segments": row[0], "max_split_size_bytes": row[1], "alloc_conf": row[2]}


LIVE_SQL = """
WITH ev AS (
    SELECT event_id, address, bytes, action, stack_id,
           lead(event_id) OVER (PARTITION BY address ORDER BY event_id) AS next_id
    FROM allocator_events
    WHERE run_id = $run_id AND device_id = $device AND action IN ('alloc', 'free_requested') AND event_id <= $at
)
SELECT stack_id, sum(bytes) AS bytes, count(*) AS allocations FROM ev
WHERE action = 'alloc' AND next_id IS NULL  -- neither freed nor its address reused by then
GROUP BY stack_id
"""


@dataclass
class Holder:
    site: Site
    bytes: int = 0
    allocations: int = 0
    ops: dict[str, int] = field(default_factory=dict)  # "via -> op" -> bytes


def holders(store, run_id: str, device: int, at_event: int, allocated: int) -> tuple[list[Holder], int]:
    """What held the memory allocated right after `at_event`, by site (most bytes first), and
    the bytes held from before the history (allocated minus what the history accounts for)."""
    rows = store.sql(LIVE_SQL, {"run_id": run_id, "device": device, "at": at_event}).fetchall()
    by_stack = sites(store, run_id, [r[0] for r in rows])
    groups: dict[str, Holder] = {}
    for stack_id, n, count in rows:
        site = by_stack.get(stack_id) if stack_id is not None else None
        site = site or Site(NO_STACK, (), None, None)
        h = groups.setdefault(site.label, Holder(site))
        h.bytes += int(n or 0)
        h.allocations += int(count)
        how = " -> ".join(x for x in (site.via, site.op) if x) or "-"
        h.ops[how] = h.ops.get(how, 0) + int(n or 0)
    live = sum(h.bytes for h in groups.values())
    ranked = sorted(groups.values(), key=lambda h: (-h.bytes, h.site.label))
    return ranked, max(int(allocated) - live, 0)


def holder_evidence(h: Holder, total: int) -> dict:
    return {"site": h.site.label, "bytes": h.bytes, "share": h.bytes / total if total else None,
            "allocations": h.allocations, "user_frames": list(h.site.user_frames[:6]),
            "via": sorted(h.ops.items(), key=lambda kv: (-kv[1], kv[0]))[0][0] if h.ops else None,
            "calls": [{"call": k, "bytes": v} for k, v in sorted(h.ops.items(), key=lambda kv: (-kv[1], kv[0]))[:3]]}


def holders_text(ranked: list[Holder], before: int, total: int, n: int = 3) -> str:
    """'a.py:3 f (aten::mm) 1.2 GB (40.0%), ...; 2 GB (9.1%) from before the recorded history'."""
    parts = []
    for h in ranked[:n]:
        top_call = max(h.ops.items(), key=lambda kv: (kv[1], kv[0]))[0] if h.ops else "-"
        label = h.site.label if top_call == "-" else f"{h.site.label} ({top_call})"
        parts.append(f"{label} {nbytes(h.bytes)} ({pct(h.bytes / total) if total else '-'})")
    text = ", ".join(parts) or "no recorded allocation"
    if before:
        text += f"; {nbytes(before)} ({pct(before / total) if total else '-'}) allocated before the recorded history began"
    return text


def run_start(store, run_id: str):
    return store.sql("SELECT start_ns FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
