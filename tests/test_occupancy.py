"""The occupancy calculator and the GPU tables, checked against the real traces.

Expected values come from the traces themselves, read here with json / csv / sqlite3:
Kineto's ``est. achieved occupancy %`` (and its 2026 ``occupancy`` struct), Nsight
Compute's ``Block Limit *`` / ``Theoretical Occupancy`` / ``Waves Per SM`` (details page,
raw page and the plain-text report), and nsys ``TARGET_INFO_GPU`` rows for the tables.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
import sqlite3
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tests.conftest import shared_traces
from traceanalyzer.devices.gpu import CC_LIMITS, cc_limits, fill_device, normalize_name, product
from traceanalyzer.devices.occupancy import occupancy, occupancy_table, waves

KiB = 1024


# ---------------------------------------------------------------------------------------
# Kineto: est. achieved occupancy %


def _described_devices(path: Path):
    """The trace's JSON when it describes its devices (`deviceProperties`), else None."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    return json.loads(raw) if b'"deviceProperties"' in raw else None


@pytest.fixture(scope="module")
def kineto_docs() -> list[tuple[Path, object]]:
    """The real PyTorch traces that describe their devices, read with the standard library."""
    docs = [(path, _described_devices(path)) for path in sorted((shared_traces() / "torch").iterdir())]
    return [(path, doc) for path, doc in docs if doc is not None]


@pytest.fixture(scope="module")
def kineto_kernels(kineto_docs) -> pd.DataFrame:
    """Every kernel event with launch args and an estimate, in a trace with deviceProperties,
    joined with its device's properties (as a ``devices`` row would hold them)."""
    rows = []
    for path, doc in kineto_docs:
        if not isinstance(doc, dict) or not doc.get("deviceProperties"):
            continue
        props = {p["id"]: p for p in doc["deviceProperties"]}
        for ev in doc.get("traceEvents", []):
            if not isinstance(ev, dict) or str(ev.get("cat", "")).lower() != "kernel":
                continue
            a = ev.get("args") or {}
            need = ("grid", "block", "registers per thread", "shared memory", "est. achieved occupancy %")
            p = props.get(a.get("device"))
            if p is None or any(k not in a for k in need) or "computeMajor" not in p:
                continue
            rows.append({
                "file": path.name,
                "grid_x": a["grid"][0], "grid_y": a["grid"][1], "grid_z": a["grid"][2],
                "block_x": a["block"][0], "block_y": a["block"][1], "block_z": a["block"][2],
                "registers_per_thread": a["registers per thread"],
                # Kineto writes static + dynamic as one number.
                "static_shared_mem_bytes": a["shared memory"], "dynamic_shared_mem_bytes": 0,
                "kineto_pct": a["est. achieved occupancy %"],
                "kineto_struct": a.get("occupancy"),
                "compute_major": p["computeMajor"], "compute_minor": p["computeMinor"],
                "sm_count": p["numSms"],
                "max_threads_per_sm": p["maxThreadsPerMultiprocessor"],
                "max_warps_per_sm": p["maxThreadsPerMultiprocessor"] // p["warpSize"],
                "warp_size": p["warpSize"],
                "registers_per_sm": p["regsPerMultiprocessor"],
                "max_registers_per_block": p["regsPerBlock"],
                "shared_mem_per_sm_bytes": p["sharedMemPerMultiprocessor"],
                "max_shared_mem_per_block_bytes": p["sharedMemPerBlock"],
                "max_shared_mem_per_block_optin_bytes": p["sharedMemPerBlockOptin"],
                "max_threads_per_block": p["maxThreadsPerBlock"],
            })
    return pd.DataFrame(rows)


def _kineto_estimate(blocks_per_sm: np.ndarray, df: pd.DataFrame, half_up: bool = True) -> np.ndarray:
    """Kineto's formula in its float32 arithmetic: min(calculator blocks, grid / numSms)
    x threads / maxThreadsPerMultiprocessor x 100, printed as (int)(0.5 + x) (half_up) or,
    for comparison, truncated."""
    f32 = np.float32
    grid = (df.grid_x * df.grid_y * df.grid_z).to_numpy(dtype=f32)
    threads = (df.block_x * df.block_y * df.block_z).to_numpy(dtype=f32)
    fill = grid / df.sm_count.to_numpy(dtype=f32)
    eff = np.minimum(blocks_per_sm.astype(f32), fill)
    occ = (eff * threads) / df.max_threads_per_sm.to_numpy(dtype=f32)
    return np.floor((0.5 if half_up else 0.0) + occ.astype(np.float64) * 100.0).astype(np.int64)


def test_kineto_estimate_matches_calculator(kineto_kernels):
    df = kineto_kernels
    assert len(df) > 30_000, "the real Kineto traces should give >30k kernels with estimates"
    # Kineto calls the calculator with the default 48 KB per-block limit (no opt-in).
    occ = occupancy_table(df, opt_in_shared_mem=False)
    assert occ.blocks_per_sm.notna().all()
    ours = _kineto_estimate(occ.blocks_per_sm.to_numpy(dtype=np.int64), df)
    agree = ours == df.kineto_pct.to_numpy()
    # Only kernels whose grid fills more than the calculator's blocks/SM test the calculator.
    grid = (df.grid_x * df.grid_y * df.grid_z).to_numpy()
    binding = occ.blocks_per_sm.to_numpy(dtype=np.int64) < grid / df.sm_count.to_numpy()
    rate, rate_binding = agree.mean(), agree[binding].mean()
    bad = df.assign(ours=ours, blocks=occ.blocks_per_sm, limiter=occ.limiter)[~agree]
    print(f"\nKineto: {agree.sum()}/{len(df)} agree ({rate:.4%}); calculator-bound "
          f"{agree[binding].sum()}/{binding.sum()} ({rate_binding:.4%}); "
          f"limiters there: {occ.limiter[binding].value_counts().to_dict()}")
    assert binding.sum() > 10_000
    assert set(occ.limiter[binding]) >= {"warps", "registers", "shared_mem"}
    assert rate >= 0.99 and rate_binding >= 0.99, bad.head(20).to_string()
    # Kineto rounds half up ((int)(0.5 + x)); truncation would disagree on many kernels.
    truncated = _kineto_estimate(occ.blocks_per_sm.to_numpy(dtype=np.int64), df, half_up=False)
    assert (truncated != df.kineto_pct.to_numpy()).sum() > 1000


def test_kineto_scalar_path_agrees_with_vectorized(kineto_kernels):
    df = kineto_kernels
    keys = ["compute_major", "compute_minor", "block_x", "block_y", "block_z",
            "registers_per_thread", "static_shared_mem_bytes"]
    distinct = df.drop_duplicates(keys).reset_index(drop=True)
    table = occupancy_table(distinct, opt_in_shared_mem=False)
    for i, row in distinct.iterrows():
        one = occupancy(
            int(row.block_x * row.block_y * row.block_z), int(row.registers_per_thread),
            int(row.static_shared_mem_bytes), 0, row.to_dict(), opt_in_shared_mem=False,
        )
        assert one.blocks_per_sm == table.blocks_per_sm[i]
        assert one.limiter == table.limiter[i]
    assert len(distinct) > 100


def test_kineto_occupancy_struct(kineto_kernels):
    """Newer Kineto writes the calculator's whole result; every field must match."""
    df = kineto_kernels[kineto_kernels.kineto_struct.notna()].reset_index(drop=True)
    assert len(df) >= 1
    occ = occupancy_table(df, opt_in_shared_mem=False)
    int_max = 2**31 - 1
    names = {"WARPS": "warps", "REGS": "registers", "SMEM": "shared_mem", "BLOCKS": "blocks", "BARRIERS": "barriers"}
    def as_limit(v):
        return None if pd.isna(v) else int(v)

    for i, s in enumerate(df.kineto_struct):
        assert s["activeBlocksPerMultiprocessor"] == occ.blocks_per_sm[i]
        assert s["blockLimitBlocks"] == occ.limit_blocks[i]
        assert s["blockLimitWarps"] == occ.limit_warps[i]
        assert (None if s["blockLimitRegs"] == int_max else s["blockLimitRegs"]) == as_limit(occ.limit_registers[i])
        assert (None if s["blockLimitSharedMem"] == int_max else s["blockLimitSharedMem"]) == as_limit(occ.limit_shared_mem[i])
        assert s["allocatedSharedMemPerBlock"] == occ.shared_mem_per_block_bytes[i]
        expected = {names[t] for t in s["limitingFactors"].split("|")}
        assert expected == set(occ.limiter[i].split("+"))


# ---------------------------------------------------------------------------------------
# Nsight Compute: Block Limit *, Theoretical Occupancy, Waves Per SM

_SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}  # ncu uses decimal prefixes


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _bytes(value: str, unit: str) -> int:
    """ncu prints sizes with 3-4 significant digits ('2.05 Kbyte' for 2048 B): take the
    integer in the printed value's rounding interval divisible by the largest power of 2."""
    unit = unit.split("/")[0]
    x = _number(value) * _SCALE[unit]
    if _SCALE[unit] == 1:
        return int(x)
    half = 0.5 * _SCALE[unit] * 10 ** -(len(value.split(".")[1]) if "." in value else 0)
    candidates = range(int(np.ceil(x - half)), int(np.floor(x + half)) + 1)
    return max(candidates, key=lambda c: (c & -c) if c else 1 << 62)


def _csv_rows(path: Path) -> list[list[str]]:
    lines = path.read_text(errors="replace").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    return list(csv.reader(lines[start:]))


def _details_launches(path: Path) -> list[dict]:
    """One dict per launch ID: label -> (unit, value) of the Launch Statistics and Occupancy rows."""
    rows = _csv_rows(path)
    head = rows[0]
    col = {name: i for i, name in enumerate(head)}
    launches: dict[str, dict] = defaultdict(dict)
    for r in rows[1:]:
        if len(r) <= col["Metric Value"] or r[col["Section Name"]] not in ("Launch Statistics", "Occupancy"):
            continue
        launches[r[col["ID"]]][r[col["Metric Name"]]] = (r[col["Metric Unit"]], r[col["Metric Value"]])
        if "CC" in col:
            launches[r[col["ID"]]]["CC"] = ("", r[col["CC"]])
    return list(launches.values())


def _text_launches(path: Path) -> list[dict]:
    """ncu's plain-text report: a kernel header line ('... Device 0, CC 8.6') then
    'Metric Name  Unit  Value' rows (unit may be absent)."""
    launches: list[dict] = []
    for line in path.read_text(errors="replace").splitlines():
        head = re.search(r"\), Context \d+, Stream \d+, Device \d+, CC (\d+\.\d+)\s*$", line)
        if head:
            launches.append({"CC": ("", head.group(1))})
            continue
        m = re.match(r"^ {4}(\S.*?\S)\s{2,}(?:(\S+)\s+)?(\S+)\s*$", line)
        if launches and m and not line.strip().startswith(("-", "Section", "Metric Name", "OPT", "WRN", "INF")):
            launches[-1][m.group(1)] = (m.group(2) or "", m.group(3))
    return [k for k in launches if "Block Limit SM" in k]


_DRIVER = "Driver Shared Memory Per Block"


def _from_labels(m: dict, cc: str | None, sm_count: int | None) -> dict:
    """A launch from details-page labels, in base units."""
    cc = m["CC"][1] if "CC" in m else cc
    launch = {
        "cc": tuple(int(x) for x in cc.split(".")),
        "threads": int(_number(m["Block Size"][1])),
        "grid": int(_number(m["Grid Size"][1])),
        "regs": int(_number(m["Registers Per Thread"][1])),
        "static": _bytes(m["Static Shared Memory Per Block"][1], m["Static Shared Memory Per Block"][0]),
        "dynamic": _bytes(m["Dynamic Shared Memory Per Block"][1], m["Dynamic Shared Memory Per Block"][0]),
        "config": _bytes(m["Shared Memory Configuration Size"][1], m["Shared Memory Configuration Size"][0]),
        "sm_count": int(_number(m["# SMs"][1])) if "# SMs" in m else sm_count,
        # Reports that name the driver's per-block share (ncu >= 2021) size the shared-memory
        # limit by the configured carveout; the 2020 logs by the largest carveout.
        "driver": _bytes(m[_DRIVER][1], m[_DRIVER][0]) if _DRIVER in m else None,
        "ncu_limit_blocks": int(_number(m["Block Limit SM"][1])),
        "ncu_limit_registers": int(_number(m["Block Limit Registers"][1])),
        "ncu_limit_shared_mem": int(_number(m["Block Limit Shared Mem"][1])),
        "ncu_limit_warps": int(_number(m["Block Limit Warps"][1])),
        "ncu_theoretical_pct": _number(m["Theoretical Occupancy"][1]),
        "ncu_active_warps": _number(m["Theoretical Active Warps per SM"][1]),
        "ncu_waves": _number(m["Waves Per SM"][1]),
    }
    return launch


def _raw_launches(path: Path) -> list[dict]:
    rows = _csv_rows(path)
    head, body = rows[0], [r for r in rows[2:] if r and r[0]]  # rows[1] is the units row
    out = []
    for r in body:
        v = dict(zip(head, r))
        num = lambda k: _number(v[k])  # noqa: E731
        out.append({
            "cc": tuple(int(x) for x in v["CC"].split(".")),
            "threads": int(num("launch__block_size")), "grid": int(num("launch__grid_size")),
            "regs": int(num("launch__registers_per_thread")),
            "static": int(num("launch__shared_mem_per_block_static")),
            "dynamic": int(num("launch__shared_mem_per_block_dynamic")),
            "config": int(num("launch__shared_mem_config_size")),
            "sm_count": int(num("launch__sm_count")),
            "driver": int(num("launch__shared_mem_per_block_driver")),
            "allocated": int(num("launch__shared_mem_per_block_allocated")),
            "barriers": int(num("launch__barrier_count")),
            "device": {
                "compute_major": int(v["CC"].split(".")[0]), "compute_minor": int(v["CC"].split(".")[1]),
                "max_warps_per_sm": int(num("device__attribute_max_warps_per_multiprocessor")),
                "max_blocks_per_sm": int(num("device__attribute_max_blocks_per_multiprocessor")),
                "registers_per_sm": int(num("device__attribute_max_registers_per_multiprocessor")),
                "max_registers_per_block": int(num("device__attribute_max_registers_per_block")),
                "shared_mem_per_sm_bytes": int(num("device__attribute_max_shared_memory_per_multiprocessor")),
                "max_shared_mem_per_block_optin_bytes": int(num("device__attribute_max_shared_memory_per_block_optin")),
                "max_threads_per_block": int(num("device__attribute_max_threads_per_block")),
                "reserved": int(num("device__attribute_reserved_shared_memory_per_block")),
            },
            "ncu_limit_blocks": int(num("launch__occupancy_limit_blocks")),
            "ncu_limit_registers": int(num("launch__occupancy_limit_registers")),
            "ncu_limit_shared_mem": int(num("launch__occupancy_limit_shared_mem")),
            "ncu_limit_warps": int(num("launch__occupancy_limit_warps")),
            "ncu_limit_barriers": int(num("launch__occupancy_limit_barriers")),
            "ncu_theoretical_pct": num("sm__maximum_warps_per_active_cycle_pct"),
            "ncu_active_warps": num("sm__maximum_warps_avg_per_active_cycle"),
            "ncu_waves": num("launch__waves_per_multiprocessor"),
        })
    return out


# file -> (reader, CC when the file lacks it, SMs when the file lacks it)
NCU_FILES = {
    # B200 (CC 10.0, 148 SMs) raw pages: waves 1.73 / 0.86, register- and smem-bound.
    "Roofline-Analysis__decodebench__torch_sdpa_flash__gqa_bf16_b64_ctx4k_p64.ncu.csv": (_raw_launches, None, None),
    "Roofline-Analysis__decodebench__torch_sdpa_cudnn__mqa_bf16_b128_ctx4k_p64.ncu.csv": (_raw_launches, None, None),
    # 2020 nv-nsight-cu-cli logs on V100-SXM2-16GB (CC 7.0, 80 SMs); no CC / SM count in the file.
    "XPlacer__cfd__aws-v100__nsight_cfd_097K.log": (_details_launches, "7.0", 80),
    "XPlacer__cfd__lassen__nsight_cfd_097K.log": (_details_launches, "7.0", 80),
    "XPlacer__gaussian__nsight_gaussian_16.log": (_details_launches, "7.0", 80),
    "XPlacer__hotspot__lassen__nsight_hotspot_1024.log": (_details_launches, "7.0", 80),
    # 2025 details page on a T4 (CC 7.5, "# SMs" 40).
    "nsightful__copy_blocked.csv": (_details_launches, None, None),
    # Plain-text report despite the .csv name; CC 8.6 per its kernel lines. It does not name
    # the GPU or its SM count; all its launches' waves fit 48 SMs (RTX A4000 / 3070 Ti class).
    "PolyFHE__artifact_evaluation__ncu__opt.csv": (_text_launches, None, 48),
}


def _ncu_launches(name: str) -> list[dict]:
    reader, cc, sms = NCU_FILES[name]
    found = reader(shared_traces() / "ncu" / name)
    return found if reader is _raw_launches else [_from_labels(m, cc, sms) for m in found]


@pytest.mark.parametrize("name", sorted(NCU_FILES))
def test_ncu_launch_limits(name, traces_dir):
    launches = _ncu_launches(name)
    assert launches, f"no launches with occupancy metrics in {name}"
    for k in launches:
        limits = cc_limits(*k["cc"])
        device = k.get("device") or {"compute_major": k["cc"][0], "compute_minor": k["cc"][1]}
        modern = k["driver"] is not None
        o = occupancy(k["threads"], k["regs"], k["static"], k["dynamic"], device,
                      smem_carveout_bytes=k["config"] if modern else None,
                      barriers_per_block=k.get("barriers"))
        ctx = f"{name}: {k}"
        assert o.limit_blocks == k["ncu_limit_blocks"], ctx
        assert o.limit_warps == k["ncu_limit_warps"], ctx
        assert o.limit_registers == k["ncu_limit_registers"], ctx
        # ncu shows a resource the kernel does not use (None here) as the block cap.
        cap = lambda v: o.limit_blocks if v is None else v  # noqa: E731
        assert cap(o.limit_shared_mem) == k["ncu_limit_shared_mem"], ctx
        if "ncu_limit_barriers" in k:
            assert cap(o.limit_barriers) == k["ncu_limit_barriers"], ctx
        assert abs(100 * o.theoretical_occupancy - k["ncu_theoretical_pct"]) <= 0.005 + 1e-9, ctx
        assert o.active_warps_per_sm == k["ncu_active_warps"], ctx
        w = waves(k["grid"], o.blocks_per_sm, k["sm_count"])
        assert abs(w - k["ncu_waves"]) <= 0.005 + 1e-9, ctx
        # The carveout the driver picked is the smallest step holding blocks_per_sm blocks.
        assert o.shared_mem_config_bytes == k["config"], ctx
        if modern:
            assert k["driver"] == limits.reserved_shared_mem_per_block_bytes, ctx
        if "allocated" in k:
            assert o.shared_mem_per_block_bytes == k["allocated"], ctx


def test_ncu_b200_waves_and_limiters(traces_dir):
    """The two B200 raw files: flash (255 regs, 64 KB dynamic smem) and cuDNN (168 regs,
    227 KB dynamic smem)."""
    flash = _ncu_launches("Roofline-Analysis__decodebench__torch_sdpa_flash__gqa_bf16_b64_ctx4k_p64.ncu.csv")
    cudnn = _ncu_launches("Roofline-Analysis__decodebench__torch_sdpa_cudnn__mqa_bf16_b128_ctx4k_p64.ncu.csv")
    assert len(flash) == 16 and len(cudnn) == 16
    f = occupancy(128, 255, 0, 65536, flash[0]["device"], smem_carveout_bytes=flash[0]["config"])
    c = occupancy(384, 168, 0, 232448, cudnn[0]["device"], smem_carveout_bytes=cudnn[0]["config"])
    assert (f.blocks_per_sm, f.limiter) == (2, "registers+shared_mem")
    assert (c.blocks_per_sm, c.limiter) == (1, "registers+shared_mem")
    assert round(waves(512, f.blocks_per_sm, 148), 2) == 1.73 == flash[0]["ncu_waves"]
    assert round(waves(128, c.blocks_per_sm, 148), 2) == 0.86 == cudnn[0]["ncu_waves"]
    # With the largest carveout the flash kernel's shared-memory limit is 3, not ncu's 2.
    assert occupancy(128, 255, 0, 65536, flash[0]["device"]).limit_shared_mem == 3


def test_ncu_vectorized_path(traces_dir):
    """occupancy_table over every ncu launch at once equals the one-kernel function."""
    rows = []
    for name in NCU_FILES:
        for k in _ncu_launches(name):
            modern = k["driver"] is not None
            rows.append({
                "block_x": k["threads"], "grid_x": k["grid"], "registers_per_thread": k["regs"],
                "static_shared_mem_bytes": k["static"], "dynamic_shared_mem_bytes": k["dynamic"],
                "compute_major": k["cc"][0], "compute_minor": k["cc"][1], "sm_count": k["sm_count"],
                "carveout": k["config"] if modern else None, "ncu_waves": k["ncu_waves"],
                "ncu_limit_registers": k["ncu_limit_registers"],
            })
    df = pd.DataFrame(rows)
    out = occupancy_table(pa.Table.from_pandas(df), carveout_column="carveout")
    assert (out.limit_registers.to_numpy() == df.ncu_limit_registers.to_numpy()).all()
    assert (np.abs(out.waves.to_numpy(dtype=float) - df.ncu_waves.to_numpy()) <= 0.005 + 1e-9).all()


# ---------------------------------------------------------------------------------------
# Worked examples and edge cases


def test_formats_worked_example_cc80():
    """formats.md 5.2: 256 threads, 106 regs on CC 8.0 -> registers limit 2, 25 %."""
    o = occupancy(256, 106, 0, 0, cc_limits(8, 0))
    assert (o.limit_registers, o.limit_warps, o.limit_blocks) == (2, 8, 32)
    assert o.blocks_per_sm == 2 and o.limiter == "registers"
    assert o.theoretical_occupancy == 0.25 and o.active_warps_per_sm == 16


def test_shared_memory_limited():
    # CC 8.6: 48 KB static + 1 KB reserved = 50 176 B a block; 100 KB carveout holds 2.
    o = occupancy(128, 32, 48 * KiB, 0, cc_limits(8, 6))
    assert o.shared_mem_per_block_bytes == 49 * KiB
    assert (o.limit_shared_mem, o.blocks_per_sm, o.limiter) == (2, 2, "shared_mem")
    assert o.theoretical_occupancy == pytest.approx(8 / 48)
    # Granularity: 1 byte more takes another 128 B unit (CC >= 8), 256 B before 8.0.
    assert occupancy(128, 32, 1, 0, cc_limits(8, 0)).shared_mem_per_block_bytes == 1024 + 128
    assert occupancy(128, 32, 1, 0, cc_limits(7, 0)).shared_mem_per_block_bytes == 256


def test_block_count_limited():
    o = occupancy(32, 16, 0, 0, cc_limits(7, 5))  # 1-warp blocks on Turing: cap of 16 blocks
    assert (o.blocks_per_sm, o.limiter, o.limit_warps) == (16, "blocks", 32)
    assert o.theoretical_occupancy == 0.5


def test_zero_registers_and_zero_shared_memory():
    o = occupancy(64, 0, 0, 0, cc_limits(7, 0))
    assert o.limit_registers is None and o.limit_shared_mem is None
    assert (o.blocks_per_sm, o.limiter) == (32, "blocks+warps")
    # From CC 8.0 even a block without shared memory takes the 1 KB reservation.
    assert occupancy(64, 0, 0, 0, cc_limits(9, 0)).limit_shared_mem == 228


def test_launches_that_cannot_fit():
    assert occupancy(1025, 16, 0, 0, cc_limits(8, 0)).blocks_per_sm == 0
    too_many_regs = occupancy(1024, 255, 0, 0, cc_limits(8, 0))
    assert too_many_regs.limit_registers == 0 and too_many_regs.limiter == "registers"
    # 64 KB dynamic: over the 48 KB default limit, under the opt-in one.
    assert occupancy(128, 32, 0, 64 * KiB, cc_limits(9, 0), opt_in_shared_mem=False).blocks_per_sm == 0
    assert occupancy(128, 32, 0, 64 * KiB, cc_limits(9, 0)).limit_shared_mem == 3


def test_small_carveout_is_raised_to_fit_one_block():
    # 40 KB + 1 KB on a 32 KB carveout: the calculator raises it to the 64 KB step.
    assert occupancy(128, 32, 40 * KiB, 0, cc_limits(8, 0), smem_carveout_bytes=32 * KiB).limit_shared_mem == 1


def test_occupancy_table_from_duckdb():
    import duckdb

    con = duckdb.connect()
    rel = con.sql(
        "SELECT * FROM (VALUES (256, 1, 1, 106, 0, 0, 8, 0, 1000, 108), (128, 1, 1, 255, 0, 65536, 10, 0, 512, 148))"
        " t(block_x, block_y, block_z, registers_per_thread, static_shared_mem_bytes, dynamic_shared_mem_bytes,"
        " compute_major, compute_minor, grid_x, sm_count)"
    )
    out = occupancy_table(rel.arrow())
    assert out.blocks_per_sm.tolist() == [2, 2]
    assert out.limiter.tolist() == ["registers", "registers"]
    assert out.waves.round(2).tolist() == [4.63, 1.73]


def test_waves():
    assert waves(512, 2, 148) == pytest.approx(512 / 296)
    assert waves(10, 0, 80) is None


def test_occupancy_table_nulls_for_unknown_devices():
    df = pd.DataFrame({
        "block_x": [256, 256, None, 256], "registers_per_thread": [32, 32, 32, 32],
        "static_shared_mem_bytes": [0, 0, 0, 0], "dynamic_shared_mem_bytes": [0, 0, 0, 0],
        "compute_major": [8, None, 8, 9], "compute_minor": [0, None, 0, 0],
        "vendor": ["nvidia", None, None, "amd"],  # MI210 reports computeMajor 9
    })
    out = occupancy_table(df)
    assert out.blocks_per_sm.tolist()[0] == 8
    assert out.blocks_per_sm.isna().tolist() == [False, True, True, True]
    assert out.limiter.isna().tolist() == [False, True, True, True]
    with pytest.raises(ValueError, match="amd"):
        occupancy(256, 32, 0, 0, {"name": "AMD Instinct MI210", "compute_major": 9, "compute_minor": 0})
    with pytest.raises(ValueError, match="5.2"):
        occupancy(256, 32, 0, 0, {"compute_major": 5, "compute_minor": 2})


# ---------------------------------------------------------------------------------------
# Tables against the real traces


def _nsys_gpus() -> list[dict]:
    rows = []
    for path in sorted((shared_traces() / "nsys").glob("*.sqlite")):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            cols = [r[1] for r in con.execute("PRAGMA table_info(TARGET_INFO_GPU)")]
            if "computeMajor" not in cols:
                continue
            rows += [dict(zip(cols, r)) for r in con.execute("SELECT * FROM TARGET_INFO_GPU")]
        finally:
            con.close()
    return rows


def test_cc_table_matches_nsys_devices(traces_dir):
    gpus = _nsys_gpus()
    seen = set()
    for g in gpus:
        lim = cc_limits(g["computeMajor"], g["computeMinor"])
        assert lim is not None, g["name"]
        assert (lim.max_warps_per_sm, lim.max_blocks_per_sm) == (g["maxWarpsPerSm"], g["maxBlocksPerSm"]), g["name"]
        assert lim.shared_mem_per_sm_bytes == g["maxShmemPerSm"], g["name"]
        assert lim.max_shared_mem_per_block_optin_bytes == g["maxShmemPerBlockOptin"], g["name"]
        assert lim.max_shared_mem_per_block_bytes == g["maxShmemPerBlock"], g["name"]
        assert lim.registers_per_sm == g["maxRegistersPerSm"], g["name"]
        assert lim.max_registers_per_block == g["maxRegistersPerBlock"], g["name"]
        seen.add((g["computeMajor"], g["computeMinor"]))
    assert seen >= {(7, 5), (8, 0), (8, 6), (8, 9), (9, 0)}


def test_product_table_matches_nsys_devices(traces_dir):
    for g in _nsys_gpus():
        p = product(g["name"])
        assert p is not None, g["name"]
        assert p.sm_count == g["smCount"], g["name"]
        assert p.cc == (g["computeMajor"], g["computeMinor"]), g["name"]
        assert p.l2_cache_bytes == g["l2CacheSize"], g["name"]
        # nsys reports the H200's bandwidth as 4.917e12 B/s against the datasheet's 4.8e12.
        assert p.dram_bandwidth_bytes_per_s == pytest.approx(g["memoryBandwidth"], rel=0.03), g["name"]


def test_tables_match_kineto_devices(kineto_kernels, kineto_docs):
    devices = kineto_kernels.drop_duplicates(["file", "compute_major", "compute_minor"])
    for _, d in devices.iterrows():
        lim = cc_limits(d.compute_major, d.compute_minor)
        assert lim.max_warps_per_sm == d.max_warps_per_sm
        assert lim.shared_mem_per_sm_bytes == d.shared_mem_per_sm_bytes
        assert lim.max_shared_mem_per_block_optin_bytes == d.max_shared_mem_per_block_optin_bytes
    for _, doc in kineto_docs:
        for p in doc.get("deviceProperties", []) if isinstance(doc, dict) else []:
            prod = product(p["name"])
            if prod is not None and "numSms" in p:
                assert prod.sm_count == p["numSms"], p["name"]


def test_cc_10_limits_match_ncu_b200_attributes(traces_dir):
    k = _ncu_launches("Roofline-Analysis__decodebench__torch_sdpa_flash__gqa_bf16_b64_ctx4k_p64.ncu.csv")[0]
    lim, dev = cc_limits(10, 0), k["device"]
    assert (lim.max_warps_per_sm, lim.max_blocks_per_sm) == (dev["max_warps_per_sm"], dev["max_blocks_per_sm"])
    assert lim.shared_mem_per_sm_bytes == dev["shared_mem_per_sm_bytes"]
    assert lim.max_shared_mem_per_block_optin_bytes == dev["max_shared_mem_per_block_optin_bytes"]
    assert lim.reserved_shared_mem_per_block_bytes == dev["reserved"]
    assert product("NVIDIA B200").sm_count == k["sm_count"]


def test_carveout_steps_end_at_the_sm_maximum():
    for lim in CC_LIMITS.values():
        assert lim.carveout_steps_bytes[-1] == lim.shared_mem_per_sm_bytes
        assert list(lim.carveout_steps_bytes) == sorted(lim.carveout_steps_bytes)


# ---------------------------------------------------------------------------------------
# Name matching and fill_device


@pytest.mark.parametrize("name,key", [
    ("NVIDIA A100-SXM4-40GB", "a100 sxm4 40gb"),
    ("NVIDIA A100-PG509-200", "a100 pg509 200"),
    ("NVIDIA GeForce RTX 4060 Ti", "rtx 4060 ti"),
    ("NVIDIA GeForce RTX 4060", "rtx 4060"),
    ("NVIDIA GeForce RTX 3060 Ti", None),  # not an RTX 3060
    ("NVIDIA H100 PCIe", "h100 pcie"),
    ("NVIDIA H100 80GB HBM3", "h100 80gb hbm3"),
    ("NVIDIA H100", "h100"),
    ("Tesla V100-SXM2-32GB", "v100 sxm2"),
    ("Tesla V100-PCIE-16GB", "v100 pcie"),
    ("Tesla T4", "t4"),
    ("AMD Instinct MI210", "instinct mi210"),
    ("AMD Radeon Graphics", None),
    ("", None),
])
def test_product_matching(name, key):
    p = product(name)
    assert (p.key if p else None) == key
    assert normalize_name("NVIDIA GeForce RTX 4060 Ti") == "rtx 4060 ti"


def _row(**kw):
    base = {c: None for c in (
        "name", "vendor", "compute_major", "compute_minor", "sm_count", "max_warps_per_sm",
        "max_blocks_per_sm", "max_threads_per_block", "registers_per_sm", "max_registers_per_block",
        "shared_mem_per_sm_bytes", "max_shared_mem_per_block_bytes", "max_shared_mem_per_block_optin_bytes",
        "warp_size", "total_memory_bytes", "l2_cache_bytes", "memory_bandwidth_bytes_per_s", "clock_hz",
        "limits_source")}
    base.update(kw)
    return base


def test_fill_device_keeps_trace_values():
    full = _row(name="NVIDIA H200", vendor="nvidia", compute_major=9, compute_minor=0, sm_count=132,
                max_warps_per_sm=64, max_blocks_per_sm=32, max_threads_per_block=1024, registers_per_sm=65536,
                max_registers_per_block=65536, shared_mem_per_sm_bytes=233472,
                max_shared_mem_per_block_bytes=49152, max_shared_mem_per_block_optin_bytes=232448,
                warp_size=32, l2_cache_bytes=62914560, memory_bandwidth_bytes_per_s=4.916736e12)
    out = fill_device(full)
    assert out == {**full, "limits_source": "trace"}


def test_fill_device_fills_gaps_only():
    # A Kineto-like row: no max blocks, an odd trace value that must survive.
    row = _row(name="NVIDIA A100-PG509-200", compute_major=8, compute_minor=0, sm_count=107,
               max_warps_per_sm=64, registers_per_sm=65536, shared_mem_per_sm_bytes=167936)
    out = fill_device(row)
    assert out["limits_source"] == "trace+cc-table"
    assert out["sm_count"] == 107  # the trace's, not the table's 108
    assert out["max_blocks_per_sm"] == 32 and out["max_shared_mem_per_block_optin_bytes"] == 166912
    assert out["memory_bandwidth_bytes_per_s"] == pytest.approx(1.555e12)
    assert out["vendor"] == "nvidia"
    assert row["max_blocks_per_sm"] is None  # the input is not modified


def test_fill_device_by_cc_or_name_only():
    by_cc = fill_device(_row(compute_major=8, compute_minor=6))
    assert by_cc["limits_source"] == "cc-table"
    assert (by_cc["max_warps_per_sm"], by_cc["max_blocks_per_sm"], by_cc["shared_mem_per_sm_bytes"]) == (48, 16, 102400)
    by_name = fill_device(_row(name="Tesla T4"))
    assert (by_name["compute_major"], by_name["compute_minor"]) == (7, 5)
    assert (by_name["sm_count"], by_name["max_warps_per_sm"], by_name["max_blocks_per_sm"]) == (40, 32, 16)
    assert by_name["limits_source"] == "cc-table"


def test_fill_device_leaves_amd_limits_alone():
    # MI210's Kineto deviceProperties say computeMajor 9: not an NVIDIA CC 9.0.
    row = _row(name="AMD Instinct MI210", compute_major=9, compute_minor=0, warp_size=64,
               max_threads_per_block=1024, sm_count=104)
    out = fill_device(row)
    assert out["vendor"] == "amd"
    assert out["max_blocks_per_sm"] is None and out["shared_mem_per_sm_bytes"] is None
    assert out["memory_bandwidth_bytes_per_s"] == pytest.approx(1.6384e12)
    assert out["limits_source"] == "trace+cc-table"
    unknown = fill_device(_row(name="AMD Radeon Graphics", compute_major=9, compute_minor=0, sm_count=104))
    assert unknown["limits_source"] == "trace" and unknown["max_warps_per_sm"] is None


def test_fill_device_treats_pandas_na_as_missing():
    row = _row(compute_major=9, compute_minor=0, max_blocks_per_sm=pd.NA, sm_count=float("nan"), name="NVIDIA H200")
    out = fill_device(row)
    assert out["max_blocks_per_sm"] == 32 and out["sm_count"] == 132
