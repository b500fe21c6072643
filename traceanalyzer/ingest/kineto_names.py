"""What Kineto encodes in names: kernel base names, memcpy/memset kinds, sync kinds."""

from __future__ import annotations

import re

_PAIRS = {")": "(", ">": "<", "]": "[", "}": "{"}
# Real kernel names are under 6 000 characters; past this one is not parsed (a hostile
# multi-MB name would take seconds per character scan).
MAX_PARSED_NAME_CHARS = 64 * 1024
_OPENERS = set(_PAIRS.values())


def _strip_suffix_group(s: str, close: str) -> str:
    """Drop a trailing balanced `(...)` or `<...>` group (nesting of any bracket kind)."""
    if not s.endswith(close):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        ch = s[i]
        if ch in _PAIRS:
            depth += 1
        elif ch in _OPENERS:
            depth -= 1
            if depth == 0:
                return s[:i].rstrip()
    return s  # unbalanced: leave it alone


def _split_top_level(s: str, sep: str) -> list[str]:
    """Split on `sep` only outside brackets (`(anonymous namespace)` holds a space)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        ch = s[i]
        if ch in _OPENERS:
            depth += 1
        elif ch in _PAIRS:
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(s[start:])
    return parts


def kernel_short_name(name: str) -> str:
    """`void at::native::vectorized_elementwise_kernel<4, F>(int, F)` ->
    `vectorized_elementwise_kernel`: no return type, namespace, template or params."""
    if len(name) > MAX_PARSED_NAME_CHARS:  # the scan is per character: junk is kept whole
        return name
    s = name.strip()
    if s.endswith(" const"):
        s = s[: -len(" const")]
    s = _strip_suffix_group(s, ")")
    s = _strip_suffix_group(s, ">")
    s = [p for p in _split_top_level(s, " ") if p][-1] if s else s
    s = _split_top_level(s, "::")[-1] if s else s
    return s or name


# `Memcpy HtoD (Pageable -> Device)`; kind and memory tokens from CUPTI's strings (§4.4).
_MEMCPY = re.compile(r"^Memcpy\s+(\w+)\s*(?:\((.+?)\s*->\s*(.+?)\))?\s*$")
_MEMSET = re.compile(r"^Memset\s*\((.+?)\)\s*$")
# Array copies count as the device side (schema: copies.direction).
_DIRECTIONS = {
    "htod": "HtoD", "dtoh": "DtoH", "dtod": "DtoD", "htoh": "HtoH", "ptop": "PtoP",
    "htoa": "HtoD", "atoh": "DtoH", "atoa": "DtoD", "atod": "DtoD", "dtoa": "DtoD",
}
_MEMORY_KINDS = {
    "pageable": "pageable", "pinned": "pinned", "device": "device", "array": "array",
    "managed": "managed", "device static": "device_static", "managed static": "managed_static",
    "unknown": "unknown",
    # ROCm writes `Host`: host memory, but whether pinned is not said.
    "host": "unknown",
}


def memory_kind(token: str | None) -> str | None:
    return None if token is None else _MEMORY_KINDS.get(token.strip().lower(), "unknown")


def parse_memcpy_name(name: str) -> tuple[str, str | None, str | None]:
    """(direction, src_kind, dst_kind) from a Kineto memcpy name."""
    m = _MEMCPY.match(name or "")
    if not m:
        return "unknown", None, None
    return _DIRECTIONS.get(m.group(1).lower(), "unknown"), memory_kind(m.group(2)), memory_kind(m.group(3))


def parse_memset_name(name: str) -> str | None:
    m = _MEMSET.match(name or "")
    return memory_kind(m.group(1)) if m else None


# The synchronising API decides the kind (schema: syncs.kind); the cuda_sync record's
# own name is the fallback when the call is not in the trace.
_SYNC_API_SUFFIXES = (
    ("devicesynchronize", "device"),
    ("ctxsynchronize", "context"),
    ("streamsynchronize", "stream"),
    ("eventsynchronize", "event"),
    ("streamwaitevent", "stream_wait_event"),
)
_SYNC_RECORD_KINDS = {
    "context sync": "context",
    "device sync": "device",
    "stream sync": "stream",
    "event sync": "event",
    "stream wait event": "stream_wait_event",
}
_VERSION_SUFFIX = re.compile(r"_v\d+$")


def base_api_name(name: str) -> str:
    return _VERSION_SUFFIX.sub("", name)


def sync_kind(api_name: str | None, record_name: str | None) -> str:
    if api_name:
        lowered = base_api_name(api_name).lower()
        for suffix, kind in _SYNC_API_SUFFIXES:
            if lowered.endswith(suffix):
                return kind
    return _SYNC_RECORD_KINDS.get((record_name or "").strip().lower(), "unknown")
