"""The `devices` table from Kineto's `deviceProperties` (CUDA and ROCm key sets) or the
legacy `computeProperties`, plus a bare row for each device that has GPU events but no
properties; and the device ids of GPU activity reconciled with the described ones.

Device identity on ROCm (`device_map`): Kineto numbers `deviceProperties` by HIP device
index (0..n-1 over the visible devices), while roctracer's GPU activity (kernels, copies,
memsets: `args.device`, and the event's pid) carries the runtime's agent id, which counts
other agents first: on MI300X nodes one GPU described as device 0 runs kernels as device 2
or 9. The rule: when an AMD trace has GPU activity on device ids it describes none of, those
ids, in ascending order, are the described devices that have no activity of their own, in
ascending order (assumed: the runtime enumerates both in the same order; on the real traces
there is one of each). The activity tables then
carry the described id, so the rules read that device's limits; the mapping is kept in the
run's `reader_notes.device_ids`. An activity device that stays undescribed (more of them than
spare descriptions, or another vendor) keeps its id, with a bare `devices` row and a reader
warning naming it.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

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


def _described(props_list: Any) -> dict[int, dict[str, Any]]:
    """The property entries by their integer id (the others are warned about in `devices_table`)."""
    out = {}
    for props in props_list if isinstance(props_list, list) else []:
        device_id = props.get("id") if isinstance(props, dict) else None
        if isinstance(device_id, int) and not isinstance(device_id, bool):
            out[device_id] = props
    return out


def device_map(props_list: Any, gpu_device_ids: set[int], run_vendor: str | None) -> dict[int, int]:
    """Activity device id -> described device id, for AMD activity on undescribed ids (see the
    module's docstring); empty when every activity device is described or the rule does not apply."""
    described = _described(props_list)
    unlisted = sorted(gpu_device_ids - described.keys())
    if not unlisted or not described:
        return {}
    vendors = {vendor_of(p) for p in described.values()}
    if "amd" not in vendors and not (run_vendor == "amd" and vendors <= {None}):
        return {}
    spare = sorted(described.keys() - gpu_device_ids)
    return dict(zip(unlisted, spare))


# The activity tables' device columns that hold the activity's device numbering.
_DEVICE_COLUMNS = {"kernels": ("device_id",), "copies": ("device_id", "src_device_id", "dst_device_id"),
                   "memsets": ("device_id",), "syncs": ("device_id",), "ranges": ("device_id",)}


def remap_devices(tables: dict[str, pa.Table | None], mapping: dict[int, int]) -> None:
    """Rewrite the activity tables' device ids by `mapping` (in place of the dict's tables)."""
    if not mapping:
        return
    for name, columns in _DEVICE_COLUMNS.items():
        table = tables.get(name)
        if table is None:
            continue
        for column in columns:
            if column not in table.column_names:
                continue
            col = table[column]
            keys, values = pa.array(list(mapping), col.type), pa.array(list(mapping.values()), col.type)
            mapped = pc.coalesce(pc.take(values, pc.index_in(col, value_set=keys)), col)
            table = table.set_column(table.schema.get_field_index(column), table.schema.field(column), mapped)
        tables[name] = table


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
    unknown = sorted(gpu_device_ids - rows.keys())
    for device_id in unknown:
        rows[device_id] = {"name": None, "vendor": run_vendor, "limits_source": None}
    if unknown and isinstance(props_list, list) and props_list:
        # (A trace without any properties says nothing wrong: every device is unknown alike.)
        warnings.append(f"GPU activity on device(s) {', '.join(map(str, unknown))} that `deviceProperties` "
                        "does not describe: their name and limits are unknown, and rules that need them skip them")
    if not rows:
        return None, warnings
    ids = sorted(rows)
    columns = ["name", "vendor", *(c for c in _KEYS if c != "max_threads_per_sm"),
               "max_warps_per_sm", "limits_source"]
    table = {"device_id": ids}
    table.update({c: [rows[i].get(c) for i in ids] for c in columns})
    return make_table("devices", table), warnings
