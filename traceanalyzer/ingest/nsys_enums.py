"""nsys integer codes -> the store's words, from the file's ENUM_* tables when it has them.

ENUM_* tables exist from schema 3.0 (nsys 2022.4) on; their *names* are read, so an id that
moved in some version would still map right. Older files get the hard-coded values of
formats.md 1.4, which every ENUM table seen so far agrees with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..sql import sql_literal
from .nsys_sqlite import NsysFile, quote

# copyKind -> (direction, unified_memory). Array copies count as the device side;
# 11-13 are unified-memory page migrations, not explicit copies.
COPY_KIND_FALLBACK: dict[int, tuple[str, bool]] = {
    0: ("unknown", False), 1: ("HtoD", False), 2: ("DtoH", False), 3: ("HtoD", False),
    4: ("DtoH", False), 5: ("DtoD", False), 6: ("DtoD", False), 7: ("DtoD", False),
    8: ("DtoD", False), 9: ("HtoH", False), 10: ("PtoP", False),
    11: ("HtoD", True), 12: ("DtoH", True), 13: ("DtoD", True),
}
_COPY_TOKENS = {
    "UNKNOWN": ("unknown", False), "HTOD": ("HtoD", False), "DTOH": ("DtoH", False),
    "HTOA": ("HtoD", False), "ATOH": ("DtoH", False), "ATOA": ("DtoD", False),
    "ATOD": ("DtoD", False), "DTOA": ("DtoD", False), "DTOD": ("DtoD", False),
    "HTOH": ("HtoH", False), "PTOP": ("PtoP", False),
    "UVM_HTOD": ("HtoD", True), "UVM_DTOH": ("DtoH", True), "UVM_DTOD": ("DtoD", True),
}

# nsys memory-kind numbering (NOT CUPTI's, where 0 is Unknown).
MEM_KINDS = ("pageable", "pinned", "device", "array", "managed", "device_static",
             "managed_static", "unknown")
MEM_KIND_FALLBACK: dict[int, str] = dict(enumerate(MEM_KINDS))

# NVTX_EVENTS.eventType -> what the row is. Completed ranges are 59/60 (70/71 for the
# NVTXT variants); marks 34/65; 75 names a domain.
NVTX_FALLBACK: dict[int, str] = {
    59: "nvtx", 60: "nvtx", 70: "nvtx", 71: "nvtx", 34: "nvtx_mark", 65: "nvtx_mark", 75: "domain"}
_NVTX_NAMES = {
    "NvtxPushPopRange": "nvtx", "NvtxStartEndRange": "nvtx", "NvtxtPushPopRange": "nvtx",
    "NvtxtStartEndRange": "nvtx", "NvtxMark": "nvtx_mark", "NvtxtMark": "nvtx_mark",
    "NvtxDomainCreate": "domain"}

MEM_OPER_FALLBACK: dict[int, str] = {0: "alloc", 1: "free"}

# Sync kinds from the API call's name (after `_vNNNN` and `_ptsz`/`_ptds` are stripped).
SYNC_BY_CALL: dict[str, str] = {
    "cudaDeviceSynchronize": "device", "cudaThreadSynchronize": "device",
    "cuCtxSynchronize": "context",
    "cudaStreamSynchronize": "stream", "cuStreamSynchronize": "stream",
    "cudaStreamQuery": "stream", "cuStreamQuery": "stream",
    "cudaEventSynchronize": "event", "cuEventSynchronize": "event",
    "cudaEventQuery": "event", "cuEventQuery": "event",
    "cudaStreamWaitEvent": "stream_wait_event", "cuStreamWaitEvent": "stream_wait_event",
}
# syncType codes are only a fallback: joined to their API calls, real files show the
# numbers moved between versions (NSYS_SQLITE_SCHEMA.md 3.5). Up to schema 3.1 (and in
# unversioned files) 1 was a context/device sync, 2 an event sync, 3 a stream sync (also
# used for cudaStreamWaitEvent). Later files agree with CUPTI's enum for 1, 3 and 4,
# while 2 meant a stream sync in 3.16-3.20 but a stream wait in 3.25: left unknown.
SYNC_CODES_OLD: dict[int, str] = {1: "context", 2: "event", 3: "stream"}
SYNC_CODES_NEW: dict[int, str] = {1: "event", 3: "stream", 4: "context"}


@dataclass(frozen=True)
class Enums:
    copy_kind: dict[int, tuple[str, bool]]
    mem_kind: dict[int, str]
    nvtx: dict[int, str]
    mem_oper: dict[int, str]
    sync_codes: dict[int, str]
    sources: dict[str, str]  # enum -> "ENUM_* table" or "built-in"


def _copy_from_name(name: str, label: str) -> tuple[str, bool] | None:
    token = name.upper().split("MEMCPY_KIND_", 1)[-1]
    return _COPY_TOKENS.get(token)


def _mem_kind_from_name(name: str, label: str) -> str | None:
    token = name.upper().split("MEMORY_KIND_", 1)[-1].lower()
    if token in MEM_KINDS:
        return token
    token = label.strip().lower().replace(" ", "_")
    return token if token in MEM_KINDS else None


def _nvtx_from_name(name: str, label: str) -> str | None:
    return _NVTX_NAMES.get(name) or _NVTX_NAMES.get(label)


def _mem_oper_from_name(name: str, label: str) -> str | None:
    text = (name + " " + label).upper()
    if "DEALLOC" in text:
        return "free"
    return "alloc" if "ALLOC" in text else None


def _read_enum(f: NsysFile, tables: tuple[str, ...], parse: Callable[[str, str], object],
               fallback: dict, sources: dict[str, str]) -> dict:
    table = next((t for t in tables if f.has(t, "id")), None)
    mapping = dict(fallback)
    sources[tables[0]] = "built-in"
    if table is None:
        return mapping
    name_col = f.column(table, "name")
    label_col = f.column(table, "label")
    parsed = {}
    for ident, name, label in f.rows(f"SELECT id, {name_col}, {label_col} FROM {quote(table)}"):
        value = parse(name or "", label or "")
        if value is not None and isinstance(ident, int):
            parsed[ident] = value
    if parsed:
        mapping.update(parsed)
        sources[tables[0]] = table
    return mapping


def schema_is_old(schema_version: str | None) -> bool:
    """True for files whose syncType codes follow the pre-3.2 numbering (or have no version)."""
    if not schema_version:
        return True
    try:
        major, minor = (int(x) for x in schema_version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < (3, 2)


def load(f: NsysFile, schema_version: str | None) -> Enums:
    sources: dict[str, str] = {}
    copy_kind = _read_enum(f, ("ENUM_CUDA_MEMCPY_OPER",), _copy_from_name, COPY_KIND_FALLBACK, sources)
    mem_kind = _read_enum(f, ("ENUM_CUDA_MEM_KIND",), _mem_kind_from_name, MEM_KIND_FALLBACK, sources)
    nvtx = _read_enum(f, ("ENUM_NSYS_EVENT_TYPE",), _nvtx_from_name, NVTX_FALLBACK, sources)
    mem_oper = _read_enum(f, ("ENUM_CUDA_DEV_MEM_EVENT_OPER",), _mem_oper_from_name,
                          MEM_OPER_FALLBACK, sources)
    sync_codes = SYNC_CODES_OLD if schema_is_old(schema_version) else SYNC_CODES_NEW
    sources["syncType"] = "pre-3.2 codes" if sync_codes is SYNC_CODES_OLD else "CUPTI codes 1/3/4"
    return Enums(copy_kind, mem_kind, nvtx, mem_oper, sync_codes, sources)


def sql_case(expr: str, mapping: dict[int, object], default: str = "NULL") -> str:
    """A DuckDB CASE turning the code `expr` into our word; NULL stays NULL, unknown codes
    become `default` (the values are this module's constants, not file content)."""
    whens = " ".join(f"WHEN {expr} = {int(k)} THEN {sql_literal(v)}" for k, v in sorted(mapping.items()))
    return f"(CASE WHEN {expr} IS NULL THEN NULL {whens} ELSE {default} END)"


def sync_kind_by_name_sql(call_name: str) -> str:
    """The sync kind the API call's name says, or NULL when the name is unknown or missing."""
    base = f"regexp_replace({call_name}, '_(ptsz|ptds)$', '')"
    whens = " ".join(f"WHEN {sql_literal(n)} THEN {sql_literal(k)}" for n, k in sorted(SYNC_BY_CALL.items()))
    return f"(CASE {base} {whens} END)"
