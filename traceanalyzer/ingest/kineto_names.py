"""What names encode: kernel base names (Kineto's and Nsight Compute's), Kineto's memcpy/memset
kinds and sync kinds."""

from __future__ import annotations

import re

# Real kernel names are under 6 000 characters; longer ones are not parsed (a hostile
# multi-MB name would take seconds per character scan).
MAX_PARSED_NAME_CHARS = 64 * 1024
_CLOSERS = {")": "(", ">": "<", "]": "[", "}": "{"}
_OPENERS = set(_CLOSERS.values())


def kernel_short_name(name: str) -> str:
    """A kernel's base function name: no return type, namespaces, template arguments or parameters.
    The one short name of every reader whose format has none of its own (Kineto, Nsight Compute).

    ``void ns::flash_fwd_kernel<T<1>, 0>(Params)`` -> ``flash_fwd_kernel``;
    Numba's ``copy_blocked[v1,...](Array<...>)`` -> ``copy_blocked``;
    ``std::enable_if<...>::type vllm::rms_norm<float>(...)`` -> ``rms_norm``.
    Only trailing groups are cut, so a name that is no C++ name (``<b>x</b>``) keeps its text.
    """
    if len(name) > MAX_PARSED_NAME_CHARS:  # per-character scans: a hostile multi-MB name is kept whole
        return name
    if not _balanced(name):
        # Nsight Compute's console report shortens names and leaves their brackets unbalanced
        # (`void vectorized_elementwise_kernel<4, unnamed>::silu_kernel(...)::[lambda() ...`):
        # the first identifier that opens a template or parameter list is the function.
        m = _FIRST_CALLABLE.search(name)
        if m:
            return m.group(1).rsplit("::", 1)[-1]
    s = name.strip()
    for suffix in (" const", " volatile"):
        if s.endswith(suffix):
            s = s[: -len(suffix)].rstrip()
    if s.endswith(")"):  # the parameter list
        s = _strip_trailing_group(s)
    while s.endswith((">", "]")):  # template arguments, Numba's [signature]
        stripped = _strip_trailing_group(s)
        if stripped == s:
            break
        s = stripped
    return _last_word(s).rsplit("::", 1)[-1] or name


_FIRST_CALLABLE = re.compile(r"([A-Za-z_~][\w~]*(?:::[A-Za-z_~][\w~]*)*)\s*[<(\[]")


def _balanced(s: str) -> bool:
    """Whether every bracket of `s` closes in order."""
    stack = []
    for c in s:
        if c in _OPENERS:
            stack.append(c)
        elif c in _CLOSERS:
            if not stack or stack.pop() != _CLOSERS[c]:
                return False
    return not stack


def _strip_trailing_group(s: str) -> str:
    """`s` without its trailing balanced (...), <...> or [...] group (any brackets nested in it);
    unchanged when unbalanced."""
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] in _CLOSERS:
            depth += 1
        elif s[i] in _OPENERS:
            depth -= 1
            if depth == 0:
                return s[:i].rstrip() if i > 0 else s
    return s


def _last_word(s: str) -> str:
    """The last space-separated word outside brackets (the return type comes first)."""
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] in _CLOSERS:
            depth += 1
        elif s[i] in _OPENERS:
            depth -= 1
        elif s[i] == " " and depth == 0:
            return s[i + 1:]
    return s


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
