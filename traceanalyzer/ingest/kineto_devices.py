"""The `devices` table from Kineto's `deviceProperties` (CUDA and ROCm key sets) or the
legacy `computeProperties`, plus a bare row for each device that has GPU events but no
properties."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from .kineto_arrow import make_table

# Keys per device column; the first one present wins. Legacy `computeProperties` spells
# some of them differently (major/minor, maxThreadsPerMultiProcessor, multiProcessorCount).
_KEYS = {
    "compute_major": ("computeMajor", "major"),
    "compute_minor": ("computeMinor", "minor"),
    "sm_count": ("numSms", "multiProcessorCount"),
    "max_threads_per_sm": ("maxThreadsPerMultiprocessor", "maxThreadsPerMultiProcessor"),
    "warp_size": ("warpSize",),
    "max_threads_per_block": ("maxThreadsPerBlock",),
    "registers_per_sm": ("regsPerMultiprocessor",),
    "max_registers_per_block": ("regsPerBlock",),
    # ROCm writes only the per-CU LDS size, under its own key.
    "shared_mem_per_sm_bytes": ("sharedMemPerMultiprocessor", "maxSharedMemoryPerMultiProcessor"),
    "max_shared_mem_per_block_bytes": ("sharedMemPerBlock",),
    "max_shared_mem_per_block_optin_bytes": ("sharedMemPerBlockOptin",),
    "total_memory_bytes": ("totalGlobalMem",),
}
_AMD_NAME_TOKENS = ("amd", "radeon", "instinct")
_NVIDIA_NAME_TOKENS = ("nvidia", "tesla", "geforce", "quadro", "titan")
_MTIA_KEYS = {"runtimeMajorVersion", "runtimeMinorVersion", "maxGridHeight", "maxGridWidth"}


def _int(props: dict[str, Any], column: str) -> int | None:
    for key in _KEYS[column]:
        v = props.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def vendor_of(props: dict[str, Any]) -> str | None:
    """From the product name, else from which keys Kineto wrote (each backend has its own
    DeviceProperties code)."""
    keys = set(props)
    name = str(props.get("name") or "").lower()
    if keys & _MTIA_KEYS and "warpSize" not in keys:
        return "meta"
    if any(t in name for t in _AMD_NAME_TOKENS):
        return "amd"
    if any(t in name for t in _NVIDIA_NAME_TOKENS):
        return "nvidia"
    if "maxSharedMemoryPerMultiProcessor" in keys:
        return "amd"
    if keys & {"regsPerMultiprocessor", "sharedMemPerBlockOptin", "computeMajor", "major"}:
        return "nvidia"
    return None


def _row(props: dict[str, Any]) -> dict[str, Any]:
    vendor = vendor_of(props)
    row = {column: _int(props, column) for column in _KEYS}
    threads_per_sm, warp = row.pop("max_threads_per_sm"), row["warp_size"]
    row["max_warps_per_sm"] = threads_per_sm // warp if threads_per_sm and warp else None
    if vendor == "amd":
        # ROCm's computeMajor/Minor are the gfx arch (9.0 = gfx90a), not a CUDA compute
        # capability: left NULL so no CC table reads an MI250 as a Hopper.
        row["compute_major"] = row["compute_minor"] = None
    name = props.get("name")
    row.update(name=name if isinstance(name, str) else None, vendor=vendor, limits_source="trace")
    return row


def devices_table(props_list: Any, gpu_device_ids: set[int],
                  run_vendor: str | None) -> tuple[pa.Table | None, list[str]]:
    """Rows from the property list, then bare rows for unlisted devices with events."""
    warnings: list[str] = []
    rows: dict[int, dict[str, Any]] = {}
    for props in props_list if isinstance(props_list, list) else []:
        device_id = props.get("id") if isinstance(props, dict) else None
        if not isinstance(device_id, int) or isinstance(device_id, bool):
            warnings.append("deviceProperties entry without an integer id ignored")
            continue
        rows[device_id] = _row(props)
    for device_id in sorted(gpu_device_ids - rows.keys()):
        rows[device_id] = {"name": None, "vendor": run_vendor, "limits_source": None}
    if not rows:
        return None, warnings
    ids = sorted(rows)
    columns = ["name", "vendor", *(c for c in _KEYS if c != "max_threads_per_sm"),
               "max_warps_per_sm", "limits_source"]
    table = {"device_id": ids}
    table.update({c: [rows[i].get(c) for i in ids] for c in columns})
    return make_table("devices", table), warnings
