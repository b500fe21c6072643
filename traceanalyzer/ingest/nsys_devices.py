"""GPU rows for the `devices` table from an nsys export's TARGET_INFO_* tables.

Sources, newest first:
* `TARGET_INFO_GPU` with an `id` column (2021.3+): all limits; `memoryBandwidth` is
  bytes/s and `clockRate` Hz (checked against real A100/H200/T4 rows).
* `TARGET_INFO_CUDA_GPU` (2021.x): the same limits under other names, bandwidth in kB/s
  and clock in kHz; the `TARGET_INFO_GPU` of that era only has `deviceId` and `name`.
* `TARGET_INFO_CUDA_DEVICE` (2025.1+): maps the CUDA ordinal a process saw (`cudaId`,
  what activity rows call `deviceId`) to the GPU (`gpuId`); 2026.1 adds the SMs the
  process could use (`numMultiprocessors`, smaller under MIG/green contexts).

Which rows: a machine can list GPUs the program never touched (Rodinia lists 7), so when
activity rows name devices only those are kept (a used device the tables do not
describe gets a row with just its id, and a warning); a file without any GPU activity
keeps every listed GPU. Zeros are read as "not recorded" (old exports wrote 0 for
missing values).
"""

from __future__ import annotations

import pyarrow as pa

from .nsys_sqlite import NsysFile, arrow_schema, quote

# devices column -> (TARGET_INFO_GPU column, TARGET_INFO_CUDA_GPU column, legacy scale)
_LIMITS: dict[str, tuple[str, str, int]] = {
    "compute_major": ("computeMajor", "computeCapabilityMajor", 1),
    "compute_minor": ("computeMinor", "computeCapabilityMinor", 1),
    "sm_count": ("smCount", "numMultiprocessors", 1),
    "max_warps_per_sm": ("maxWarpsPerSm", "maxWarpsPerMultiprocessor", 1),
    "max_blocks_per_sm": ("maxBlocksPerSm", "maxBlocksPerMultiprocessor", 1),
    "max_threads_per_block": ("maxThreadsPerBlock", "maxThreadsPerBlock", 1),
    "registers_per_sm": ("maxRegistersPerSm", "maxRegistersPerMultiprocessor", 1),
    "max_registers_per_block": ("maxRegistersPerBlock", "maxRegistersPerBlock", 1),
    "shared_mem_per_sm_bytes": ("maxShmemPerSm", "maxSharedMemoryPerMultiprocessor", 1),
    "max_shared_mem_per_block_bytes": ("maxShmemPerBlock", "maxSharedMemoryPerBlock", 1),
    "max_shared_mem_per_block_optin_bytes": ("maxShmemPerBlockOptin", "", 1),
    "warp_size": ("threadsPerWarp", "numThreadsPerWarp", 1),
    "total_memory_bytes": ("totalMemory", "globalMemorySize", 1),
    "l2_cache_bytes": ("l2CacheSize", "l2CacheSize", 1),
    "memory_bandwidth_bytes_per_s": ("memoryBandwidth", "globalMemoryBandwidth", 1000),  # kB/s
    "clock_hz": ("clockRate", "coreClockRate", 1000),  # kHz
}

SCHEMA = arrow_schema("devices", ["device_id", "name", "vendor", *_LIMITS, "limits_source"])


def _select(f: NsysFile, table: str, id_col: str, cols: dict[str, str]) -> list[dict]:
    exprs = ", ".join(f"{f.column(table, src)} AS {quote(dst)}" for dst, src in cols.items())
    rows = f.rows(f"SELECT {quote(id_col)}, {exprs} FROM {quote(table)} ORDER BY {quote(id_col)}")
    return [{"id": r[0], **dict(zip(cols, r[1:]))} for r in rows]


def _clean(value, scale: int = 1, zero_ok: bool = False):
    """Old exports write 0 for "not recorded"; only a compute-capability minor can truly be 0."""
    if isinstance(value, (int, float)) and (value > 0 or (zero_ok and value == 0)):
        return value * scale
    return None


def _described_gpus(f: NsysFile) -> dict[int, dict]:
    """GPU id -> its description, from whichever TARGET_INFO tables the file has."""
    gpus: dict[int, dict] = {}
    if f.has("TARGET_INFO_GPU", "id"):
        cols = {"name": "name", "copy_engines": "asyncEngines", **{dst: src for dst, (src, _, _) in _LIMITS.items()}}
        for r in _select(f, "TARGET_INFO_GPU", "id", cols):
            gpus[r["id"]] = {"name": r["name"] or None, "copy_engines": _clean(r["copy_engines"]),
                             **{c: _clean(r[c], zero_ok=c == "compute_minor") for c in _LIMITS}}
    elif f.has("TARGET_INFO_GPU", "deviceId"):
        for r in _select(f, "TARGET_INFO_GPU", "deviceId", {"name": "name"}):
            gpus[r["id"]] = {"name": r["name"] or None}
    if f.has("TARGET_INFO_CUDA_GPU", "deviceId"):
        cols = {"name": "name", **{dst: legacy for dst, (_, legacy, _) in _LIMITS.items() if legacy}}
        for r in _select(f, "TARGET_INFO_CUDA_GPU", "deviceId", cols):
            entry = gpus.setdefault(r["id"], {})
            entry["name"] = entry.get("name") or r["name"] or None
            for c, (_, legacy, scale) in _LIMITS.items():
                if legacy and entry.get(c) is None:
                    entry[c] = _clean(r[c], scale, zero_ok=c == "compute_minor")
    return gpus


def _cuda_ordinals(f: NsysFile, warnings: list[str]) -> dict[int, tuple[int, int | None]]:
    """cudaId -> (gpuId, SMs usable by the process) from TARGET_INFO_CUDA_DEVICE."""
    if not (f.has("TARGET_INFO_CUDA_DEVICE", "cudaId") and f.has("TARGET_INFO_CUDA_DEVICE", "gpuId")):
        return {}
    sms = f.column("TARGET_INFO_CUDA_DEVICE", "numMultiprocessors")
    pid = f.column("TARGET_INFO_CUDA_DEVICE", "pid")
    mapping: dict[int, tuple[int, int | None]] = {}
    for cuda_id, gpu_id, n_sm in f.rows(
            f"SELECT cudaId, gpuId, {sms} FROM TARGET_INFO_CUDA_DEVICE "
            f"WHERE gpuId IS NOT NULL ORDER BY {pid}, cudaId"):
        if cuda_id in mapping and mapping[cuda_id][0] != gpu_id:
            warnings.append(f"CUDA device {cuda_id} is a different GPU in different processes; "
                            f"using GPU {mapping[cuda_id][0]}")
            continue
        mapping.setdefault(cuda_id, (gpu_id, _clean(n_sm)))
    return mapping


def read_devices(f: NsysFile, used_ids: list[int], warnings: list[str]) -> tuple[pa.Table, dict]:
    gpus = _described_gpus(f)
    ordinals = _cuda_ordinals(f, warnings)
    if ordinals:
        candidates = {}
        for cuda_id, (gpu_id, n_sm) in ordinals.items():
            entry = dict(gpus.get(gpu_id, {}))
            if n_sm:
                entry["sm_count"] = n_sm
            candidates[cuda_id] = entry
    else:
        candidates = gpus
    ids = sorted(set(used_ids)) if used_ids else sorted(candidates)
    missing = [i for i in ids if not candidates.get(i)]
    if missing:
        warnings.append("no description (TARGET_INFO_GPU/TARGET_INFO_CUDA_GPU) for device(s) "
                        + ", ".join(map(str, missing)) + "; their limits are unknown")
    rows = []
    for i in ids:
        entry = candidates.get(i, {})
        has_limits = any(entry.get(c) is not None for c in _LIMITS)
        rows.append({"device_id": i, "name": entry.get("name"), "vendor": "nvidia",
                     **{c: entry.get(c) for c in _LIMITS},
                     "limits_source": "trace" if has_limits else None})
    # asyncEngines: the copy engines, which run copies of all streams (one engine: in issue order,
    # one at a time); metadata only, read by rule T009
    engines = {str(i): candidates[i]["copy_engines"] for i in ids if candidates.get(i, {}).get("copy_engines")}
    meta = {"gpus_listed": len(gpus), "devices_kept": len(rows),
            "cuda_ordinal_map": {str(k): v[0] for k, v in ordinals.items()} or None,
            **({"copy_engines": engines} if engines else {})}
    return pa.Table.from_pylist(rows, schema=SCHEMA), meta
