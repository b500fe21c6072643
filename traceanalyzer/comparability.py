"""Can two runs be compared at all? What each ran on, and how it was captured.

Per run (`setup`): the GPUs it used (the devices its kernels and GPU operations ran on; all the
devices it lists when it has no GPU work; `device_ids` in id order), their product names and SM counts, the job's world
size and the run's rank, and its capture window: `time-sliced` when the file says it was cut
to a fixed window (an Nsight Systems export derived to a window: `DERIVED_WINDOW_NS` in its
export metadata), else `as recorded`.

`reasons` lists every fact both runs know and differ in. A fact one run does not carry is no
reason: two traces of one program often differ in what the profiler wrote down. But the GPU
model is what a reader assumes first, so `unknowns` says where a trace does not carry it (an
nsys export without TARGET_INFO_GPU): the comparison assumes the same hardware.

`roles` numbers a run's devices by role, the local GPU index: the used devices in id order
(0, 1, ...), then any other device the run's tables name. Two runs' devices are matched by
role, never by id: rank 3 of one job ran on device 3, rank 1 of another on device 1, and each
is its run's GPU 0.
"""

from __future__ import annotations

import json

from .store import Store

DEVICES_SQL = """
WITH used AS (
    SELECT DISTINCT device_id FROM kernels WHERE run_id = $run_id AND device_id IS NOT NULL
    UNION SELECT DISTINCT device_id FROM gpu_activity WHERE run_id = $run_id AND device_id IS NOT NULL
)
SELECT u.device_id, d.name, d.sm_count
FROM used u LEFT JOIN (SELECT * FROM devices WHERE run_id = $run_id) d USING (device_id)
UNION ALL
SELECT device_id, name, sm_count FROM devices
WHERE run_id = $run_id AND NOT EXISTS (SELECT 1 FROM used)
ORDER BY device_id
"""


def _window_ns(metadata) -> int | None:
    """The length of a declared capture window ("start-end" in ns), or None."""
    meta = json.loads(metadata) if isinstance(metadata, str) else (metadata or {})
    window = ((meta or {}).get("export_meta") or {}).get("DERIVED_WINDOW_NS")
    try:
        start, end = (int(x) for x in str(window).split("-"))
    except ValueError:
        return None
    return end - start if end > start else None


def setup(store: Store, run_id: str) -> dict:
    """What run `run_id` ran on and how it was captured (see the module docstring)."""
    run = store.arrow("SELECT rank, world_size, metadata FROM runs WHERE run_id = ?", [run_id]).to_pylist()[0]
    devices = store.arrow(DEVICES_SQL, {"run_id": run_id}).to_pylist()
    window = _window_ns(run["metadata"])
    names = [d["name"] for d in devices]
    sms = [d["sm_count"] for d in devices]
    return {"device_ids": [d["device_id"] for d in devices],
            "gpus": sorted(names) if devices and all(names) else None,
            "gpu_count": len(devices) or None,
            "sm_counts": sorted(sms) if devices and all(s is not None for s in sms) else None,
            "world_size": run["world_size"], "rank": run["rank"],
            "capture": "time-sliced" if window else "as recorded", "window_ns": window}


def _show(v) -> str:
    if isinstance(v, list):
        counts = {x: v.count(x) for x in v}
        return ", ".join(f"{n} x {x}" if n > 1 else str(x) for x, n in counts.items())
    return str(v)


FACTS = (("gpus", "GPU model"), ("gpu_count", "GPU count"), ("sm_counts", "SM count"),
         ("world_size", "world size"), ("rank", "rank"))


def unknowns(base: dict, test: dict) -> list[str]:
    """The GPU model where a run that used GPUs does not carry it: 'GPU model: in neither trace
    (the same hardware is assumed)', or '... not in the base trace (...)'; empty when both do."""
    missing = [role for role, s in (("base", base), ("test", test)) if s["gpu_count"] and s["gpus"] is None]
    if not missing:
        return []
    where = "in neither trace" if len(missing) == 2 else f"not in the {missing[0]} trace"
    return [f"GPU model: {where} (the same hardware is assumed)"]


def reasons(base: dict, test: dict) -> list[str]:
    """Why two `setup`s are not alike, one sentence each; empty when they are."""
    out = [f"{label}: base {_show(base[k])}, test {_show(test[k])}" for k, label in FACTS
           if base[k] is not None and test[k] is not None and base[k] != test[k]]
    if base["capture"] != test["capture"]:
        def window(s: dict) -> str:
            return f"time-sliced to {s['window_ns'] / 1e6:g} ms" if s["window_ns"] else "as recorded"
        out.append(f"capture window: base {window(base)}, test {window(test)}")
    return out


def roles(setup: dict, *others) -> dict:
    """Device id -> role (local GPU index) for a run: `setup["device_ids"]` in order, then the
    other device ids in `others` (iterables of ids; None is left out) in id order."""
    out = {d: i for i, d in enumerate(setup["device_ids"])}
    extra = sorted({d for ids in others for d in ids if d is not None and d == d and d not in out})
    for d in extra:
        out[d] = len(out)
    return out
