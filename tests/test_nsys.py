"""The Nsight Systems SQLite reader against every real export, the generated fixtures and bad files.

Expected values are computed here with plain sqlite3 queries (or from the fixture
generator's PLANTED/CLEAN/OLD facts), never by calling the reader's own helpers.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from traceanalyzer.ingest import nsys, nsys_sources
from traceanalyzer.ingest.base import TraceError

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
sys.path.insert(0, str(FIXTURES))
import gen_nsys  # noqa: E402

NSYS_DIR = ROOT.parent / "shared" / "traces" / "nsys"
REAL_FILES = sorted(p.name for p in NSYS_DIR.glob("*.sqlite")) or ["(no shared traces)"]
KERNEL, MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME, SYNC, NVTX = "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS"
TIMED = 'NOT (start = 0 AND "end" = 0)'
BACKENDS = ["adbc", "sqlite3"]
try:
    import adbc_driver_sqlite  # noqa: F401
except ImportError:  # pragma: no cover
    BACKENDS = ["sqlite3"]


# -- independent sqlite3 helpers ---------------------------------------------------------
def open_ro(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    return con


def tables_of(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def columns_of(con, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def count(con, table: str, where: str = "") -> int:
    if table not in tables_of(con):
        return 0
    return con.execute(f"SELECT COUNT(*) FROM {table}" + (f" WHERE {where}" if where else "")).fetchone()[0]


def real(traces_dir: Path, name: str) -> Path:
    path = traces_dir / "nsys" / name
    if not path.exists():
        pytest.skip(f"{path} missing")
    return path


def rows(trace, table: str) -> list[dict]:
    return trace.tables[table].to_pylist()


def file_state(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns


def stream_gaps(ops: list[dict]) -> list[tuple[int, int, int]]:
    """(gap_ns, gap_start, gap_end) between consecutive operations of one stream."""
    ops = sorted(ops, key=lambda o: (o["start_ns"], o["end_ns"]))
    out, busy_until = [], None
    for o in ops:
        if busy_until is not None and o["start_ns"] > busy_until:
            out.append((o["start_ns"] - busy_until, busy_until, o["start_ns"]))
        busy_until = o["end_ns"] if busy_until is None else max(busy_until, o["end_ns"])
    return out


def overlap_ns(a: dict, others: list[dict]) -> int:
    """Length of `a` covered by the union of `others` (the fixtures never overlap those)."""
    return sum(max(0, min(a["end_ns"], o["end_ns"]) - max(a["start_ns"], o["start_ns"])) for o in others)


def occupancy(dev: dict, threads: int, regs: int, smem: int = 0) -> tuple[int, float]:
    """formats.md 5.2 (CC 7.x, no reserved shared memory): blocks/SM and theoretical occupancy."""
    warps = math.ceil(threads / dev["warp_size"])
    limits = [dev["max_warps_per_sm"] // warps, dev["max_blocks_per_sm"]]
    if regs:
        regs_per_warp = math.ceil(regs * 32 / 256) * 256
        per_partition = (dev["registers_per_sm"] // 4) // regs_per_warp
        limits.append(per_partition * 4 // warps)
    if smem:
        limits.append(dev["shared_mem_per_sm_bytes"] // smem)
    blocks = min(limits)
    return blocks, blocks * warps / dev["max_warps_per_sm"]


# -- every real export --------------------------------------------------------------------
@pytest.mark.parametrize("name", REAL_FILES)
def test_real_export_counts_match_sqlite(traces_dir, name):
    path = real(traces_dir, name)
    trace = nsys.read(path)
    con = open_ro(path)
    have = tables_of(con)
    assert (trace.format, trace.producer, trace.clock) == ("nsys-sqlite", "nsys", "nsys-session")

    kernels = count(con, KERNEL, TIMED)
    assert trace.tables["kernels"].num_rows == kernels
    assert trace.tables["copies"].num_rows == count(con, MEMCPY, TIMED)
    assert trace.tables["memsets"].num_rows == count(con, MEMSET, TIMED)
    assert trace.tables["syncs"].num_rows == count(con, SYNC, TIMED)
    assert trace.tables["api_calls"].num_rows == count(con, RUNTIME)
    # Completed NVTX ranges (59 push/pop, 60 start/end) and marks (34); 75 only names domains.
    assert trace.tables["ranges"].num_rows == count(con, NVTX, "eventType IN (34, 59, 60)")

    copies = trace.tables["copies"]
    explicit_htod = pc.and_(pc.equal(copies["direction"], "HtoD"), pc.invert(copies["unified_memory"]))
    htod_bytes = pc.sum(pc.filter(copies["bytes"], explicit_htod)).as_py() or 0
    # copyKind 1 = Host-to-Device, 3 = Host-to-Array (counted as HtoD: arrays are device memory)
    expect = con.execute(f"SELECT COALESCE(SUM(bytes), 0) FROM {MEMCPY} WHERE copyKind IN (1, 3) AND {TIMED}"
                         ).fetchone()[0] if MEMCPY in have else 0
    assert htod_bytes == expect
    unified = pc.sum(copies["unified_memory"].cast(pa.int64())).as_py() or 0
    assert unified == count(con, MEMCPY, f"copyKind IN (11, 12, 13) AND {TIMED}")
    src_kinds = Counter(copies["src_kind"].to_pylist())
    assert src_kinds.get("pageable", 0) == count(con, MEMCPY, f"srcKind = 0 AND {TIMED}")
    assert src_kinds.get("pinned", 0) == count(con, MEMCPY, f"srcKind = 1 AND {TIMED}")

    meta = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in have), None)
    versions = dict(con.execute(f"SELECT name, value FROM {meta}").fetchall()) if meta else {}
    assert trace.producer_version == versions.get("EXPORT_PRODUCT_VERSION")
    assert trace.schema_version == versions.get("EXPORT_SCHEMA_VERSION")
    hosts = (con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchall()
             if "TARGET_INFO_SYSTEM_ENV" in have else [])
    assert trace.host == (hosts[0][0] if hosts else None)

    if kernels == 0:
        assert any("kernel" in w for w in trace.warnings), trace.warnings
    assert all("\n" not in w for w in trace.warnings)


@pytest.mark.parametrize("name", REAL_FILES)
def test_real_export_devices_match_target_info(traces_dir, name):
    path = real(traces_dir, name)
    devices = rows(nsys.read(path), "devices")
    con = open_ro(path)
    have = tables_of(con)
    used = set()
    for t in (KERNEL, MEMCPY, MEMSET, SYNC):
        if t in have:
            used |= {r[0] for r in con.execute(f"SELECT DISTINCT deviceId FROM {t} WHERE {TIMED}")}
    names = {}
    if "TARGET_INFO_GPU" in have:
        id_col = "id" if "id" in columns_of(con, "TARGET_INFO_GPU") else "deviceId"
        names = dict(con.execute(f"SELECT {id_col}, name FROM TARGET_INFO_GPU").fetchall())
    ordinal = {}
    if "TARGET_INFO_CUDA_DEVICE" in have:
        ordinal = dict(con.execute("SELECT cudaId, gpuId FROM TARGET_INFO_CUDA_DEVICE").fetchall())
    expected_ids = used or ({c for c in ordinal} if ordinal else set(names))
    assert {d["device_id"] for d in devices} == expected_ids
    for d in devices:
        gpu = ordinal.get(d["device_id"], d["device_id"])
        assert d["name"] == names.get(gpu)
        assert d["vendor"] == "nvidia"
        assert d["limits_source"] == ("trace" if gpu in names else None)


def test_real_device_units(traces_dir):
    """memoryBandwidth is bytes/s and clockRate Hz; legacy TARGET_INFO_CUDA_GPU is kB/s and kHz."""
    t4 = rows(nsys.read(real(traces_dir, "gpu4__report.sqlite")), "devices")[0]
    assert (t4["name"], t4["sm_count"], t4["compute_major"], t4["compute_minor"]) == ("Tesla T4", 40, 7, 5)
    assert (t4["max_warps_per_sm"], t4["max_blocks_per_sm"], t4["registers_per_sm"]) == (32, 16, 65536)
    assert t4["memory_bandwidth_bytes_per_s"] == 320_064_000_000 and t4["clock_hz"] == 1_590_000_000
    legacy = rows(nsys.read(real(traces_dir, "OpenACC_PolPuig__report12.sqlite")), "devices")[0]
    con = open_ro(real(traces_dir, "OpenACC_PolPuig__report12.sqlite"))
    bw_kb, clock_khz, sms = con.execute(
        "SELECT globalMemoryBandwidth, coreClockRate, numMultiprocessors FROM TARGET_INFO_CUDA_GPU").fetchone()
    assert legacy["name"] == "NVIDIA GeForce RTX 3080"
    assert legacy["memory_bandwidth_bytes_per_s"] == bw_kb * 1000 and legacy["clock_hz"] == clock_khz * 1000
    assert legacy["sm_count"] == sms and legacy["compute_major"] == 8


LAUNCH_JOIN_FILES = ["nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite", "Fuser__df8f397__report2.sqlite",
                     "OpenACC_PolPuig__report12.sqlite", "nsightful__power_iteration__baseline.sqlite",
                     "memfusion_artifact__report1.sqlite"]


@pytest.mark.parametrize("name", LAUNCH_JOIN_FILES)
def test_kernel_launch_join_matches_sqlite(traces_dir, name):
    path = real(traces_dir, name)
    trace = nsys.read(path)
    con = open_ro(path)
    joined = con.execute(f"""
        SELECT k.correlationId, (k.globalPid >> 24) & 16777215, r.globalTid & 16777215, s.value
        FROM {KERNEL} k JOIN {RUNTIME} r
          ON r.correlationId = k.correlationId AND k.globalPid = (r.globalTid & -16777216)
        JOIN StringIds s ON s.id = r.nameId
        WHERE NOT (k.start = 0 AND k."end" = 0)""").fetchall()
    kernels = rows(trace, "kernels")
    launched = [k for k in kernels if k["launch_call_id"] is not None]
    assert len(kernels) == count(con, KERNEL, TIMED)  # the join never fans out
    assert len(launched) == len(joined)
    assert Counter((k["correlation_id"], k["pid"], k["tid"]) for k in launched) == \
        Counter((c, p, t) for c, p, t, _ in joined)
    calls = trace.tables["api_calls"].to_pylist()
    for k in launched:
        call = calls[k["launch_call_id"]]
        assert call["call_id"] == k["launch_call_id"]
        assert (call["correlation_id"], call["pid"], call["tid"]) == (k["correlation_id"], k["pid"], k["tid"])
        assert "Launch" in call["name"] and not call["name"].endswith(("_v7000", "_v11060"))


def test_correlation_ids_repeat_across_processes(traces_dir):
    """nsys-ai has two processes: a correlationId-only join would pair kernels with wrong calls."""
    path = real(traces_dir, "nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite")
    con = open_ro(path)
    naive = con.execute(f"SELECT COUNT(*) FROM {KERNEL} k JOIN {RUNTIME} r USING (correlationId)").fetchone()[0]
    proper = con.execute(f"SELECT COUNT(*) FROM {KERNEL} k JOIN {RUNTIME} r ON r.correlationId = k.correlationId "
                         "AND k.globalPid = (r.globalTid & -16777216)").fetchone()[0]
    assert naive > proper  # the data really has colliding ids
    trace = nsys.read(path)
    assert trace.metadata["kernels_with_launch_call"] == proper
    assert any("no launch call" in w for w in trace.warnings)


SYNC_NAME_KINDS = {"cudaDeviceSynchronize": "device", "cudaThreadSynchronize": "device",
                   "cudaStreamSynchronize": "stream", "cuStreamSynchronize": "stream",
                   "cudaEventSynchronize": "event", "cudaEventQuery": "event",
                   "cudaStreamWaitEvent": "stream_wait_event"}


@pytest.mark.parametrize("name", REAL_FILES)
def test_sync_kinds_follow_the_api_call_name(traces_dir, name):
    path = real(traces_dir, name)
    con = open_ro(path)
    if SYNC not in tables_of(con):
        pytest.skip("no SYNCHRONIZATION table")
    expected = Counter()
    for (raw,) in con.execute(f"""
            SELECT s2.value FROM {SYNC} s LEFT JOIN {RUNTIME} r
              ON r.correlationId = s.correlationId AND s.globalPid = (r.globalTid & -16777216)
            LEFT JOIN StringIds s2 ON s2.id = r.nameId WHERE NOT (s.start = 0 AND s."end" = 0)"""):
        if raw is not None:
            base = raw.rsplit("_v", 1)[0] if raw.rsplit("_v", 1)[-1].isdigit() else raw
            expected[(base, SYNC_NAME_KINDS[base])] += 1
    got = Counter((s["api_name"], s["kind"]) for s in rows(nsys.read(path), "syncs") if s["api_name"])
    assert got == expected


def test_rodinia_syncs_are_device_syncs(traces_dir):
    path = real(traces_dir, "Rodinia_Gaussian__report2.sqlite")
    con = open_ro(path)
    names = con.execute(f"""SELECT s2.value, COUNT(*) FROM {SYNC} s JOIN {RUNTIME} r
        ON r.correlationId = s.correlationId AND s.globalPid = (r.globalTid & -16777216)
        JOIN StringIds s2 ON s2.id = r.nameId GROUP BY 1""").fetchall()
    assert names == [("cudaThreadSynchronize_v3020", 8190)]
    syncs = rows(nsys.read(path), "syncs")
    assert len(syncs) == 8190
    assert {(s["kind"], s["api_name"], s["stream_id"]) for s in syncs} == {("device", "cudaThreadSynchronize", None)}
    assert all(s["launch_call_id"] is not None and s["tid"] is not None for s in syncs)


def test_uvm_migrations_are_not_plain_copies(traces_dir):
    path = real(traces_dir, "CSC746CUDALab__report1.sqlite")
    con = open_ro(path)
    kinds = dict(con.execute(f"SELECT copyKind, COUNT(*) FROM {MEMCPY} GROUP BY 1").fetchall())
    copies = rows(nsys.read(path), "copies")
    assert Counter((c["direction"], c["unified_memory"]) for c in copies) == \
        {("HtoD", True): kinds[11], ("DtoH", True): kinds[12]}
    assert all(c["launch_call_id"] is None and c["src_kind"] == "unknown" for c in copies)


def test_nvtx_names_from_text_or_string_ids(traces_dir):
    """nsightful registers its NVTX strings (textId) in the CCCL domain; DLProf writes inline text."""
    path = real(traces_dir, "nsightful__power_iteration__baseline.sqlite")
    con = open_ro(path)
    expected = Counter(con.execute(f"""SELECT s.value FROM {NVTX} n JOIN StringIds s ON s.id = n.textId
                                       WHERE n.eventType = 59""").fetchall())
    ranges = rows(nsys.read(path), "ranges")
    assert Counter((r["name"],) for r in ranges) == expected
    domain_ids = dict(con.execute(f"SELECT domainId, text FROM {NVTX} WHERE eventType = 75").fetchall())
    per_domain = Counter(con.execute(f"SELECT domainId FROM {NVTX} WHERE eventType = 59").fetchall())
    assert Counter(r["domain"] for r in ranges) == {domain_ids.get(d): n for (d,), n in per_domain.items()}
    dl = rows(nsys.read(real(traces_dir, "DLProf__nsys_profile.sqlite")), "ranges")
    assert len(dl) == 82 and all(r["name"] and r["kind"] == "nvtx" and r["end_ns"] >= r["start_ns"] for r in dl)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reading_never_changes_the_file(traces_dir, tmp_path, backend):
    original = real(traces_dir, "Rodinia_Gaussian__report2.sqlite")
    before = file_state(original)
    nsys.read(original, backend=backend)
    assert file_state(original) == before
    # In a writable folder: no journal/WAL/SHM files appear, bytes and mtime stay.
    copy = tmp_path / "copy.sqlite"
    shutil.copy2(original, copy)
    before = (file_state(copy), sorted(os.listdir(tmp_path)))
    nsys.read(copy, backend=backend)
    assert (file_state(copy), sorted(os.listdir(tmp_path))) == before


def test_backends_give_identical_tables(traces_dir):
    if len(BACKENDS) < 2:
        pytest.skip("ADBC not importable")
    path = real(traces_dir, "nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite")
    a, b = nsys.read(path, backend="adbc"), nsys.read(path, backend="sqlite3")
    assert a.tables.keys() == b.tables.keys()
    for name in a.tables:
        assert a.tables[name].equals(b.tables[name]), name
    assert a.metadata["fetch_backend"] == "adbc" and b.metadata["fetch_backend"] == "sqlite3"


# -- generated fixtures ---------------------------------------------------------------------
def fixture(name: str) -> Path:
    return FIXTURES / "nsys" / name


def test_planted_counts_and_device():
    P = gen_nsys.PLANTED
    trace = nsys.read(fixture(P["file"]))
    assert {t: trace.tables[t].num_rows for t in P["counts"]} == P["counts"]
    assert trace.warnings == []
    (dev,) = rows(trace, "devices")
    assert (dev["device_id"], dev["name"], dev["sm_count"]) == (P["device_id"], P["device_name"], P["sm_count"])
    assert (dev["compute_major"], dev["compute_minor"]) == P["compute_capability"]
    assert (dev["max_warps_per_sm"], dev["max_blocks_per_sm"], dev["registers_per_sm"],
            dev["shared_mem_per_sm_bytes"]) == (P["max_warps_per_sm"], P["max_blocks_per_sm"],
                                                P["registers_per_sm"], P["shared_mem_per_sm_bytes"])
    assert dev["limits_source"] == "trace"
    assert (trace.schema_version, trace.producer_version, trace.host) == ("3.24.14", "2026.1.1.204", "planted-host")


def test_planted_stream_gaps():
    P = gen_nsys.PLANTED
    trace = nsys.read(fixture(P["file"]))
    stream = P["compute_stream"]
    ops = [o for t in ("kernels", "copies", "memsets") for o in rows(trace, t) if o["stream_id"] == stream]
    gaps = stream_gaps(ops)
    big = [(g, s, e) for g, s, e in gaps if g > 1_000]
    late, sync = P["late_launch_gap"], P["sync_gap"]
    assert big == [(late["gap_ns"], late["start_ns"], late["end_ns"]),
                   (sync["gap_ns"], sync["start_ns"], sync["end_ns"])]
    assert max(g for g, _, _ in gaps if g <= 1_000) == P["max_other_gap_ns"]
    # Nothing else ran on the device during either gap.
    others = [o for t in ("kernels", "copies") for o in rows(trace, t)]
    for g in (late, sync):
        assert overlap_ns({"start_ns": g["start_ns"], "end_ns": g["end_ns"]}, others) == 0


def test_planted_launches_and_sync():
    P = gen_nsys.PLANTED
    trace = nsys.read(fixture(P["file"]))
    calls = rows(trace, "api_calls")
    kernels = rows(trace, "kernels")
    for k, spec in zip(kernels, P["kernels"]):
        assert (k["kernel_id"], k["short_name"], k["start_ns"], k["end_ns"]) == \
            (spec["kernel_id"], spec["short_name"], spec["start_ns"], spec["end_ns"])
        call = calls[k["launch_call_id"]]
        assert call["name"] == "cudaLaunchKernel" and call["raw_name"] == "cudaLaunchKernel_v7000"
        assert (call["pid"], call["tid"], call["correlation_id"]) == (P["pid"], P["tid"], k["correlation_id"])
        assert call["end_ns"] <= k["start_ns"]
    late = P["late_launch_gap"]
    (late_kernel,) = [k for k in kernels if k["short_name"] == late["kernel"]]
    call = calls[late_kernel["launch_call_id"]]
    assert call["start_ns"] == late["launch_start_ns"] and late["start_ns"] < call["start_ns"] < late["end_ns"]
    (sync,) = rows(trace, "syncs")
    gap = P["sync_gap"]
    assert (sync["kind"], sync["api_name"], sync["stream_id"]) == ("device", gap["api_name"], None)
    sync_call = calls[sync["launch_call_id"]]
    assert (sync_call["start_ns"], sync_call["end_ns"]) == (gap["call_start_ns"], gap["call_end_ns"])
    assert sync_call["start_ns"] < gap["end_ns"] and sync_call["end_ns"] > gap["start_ns"]


def test_planted_copies():
    P = gen_nsys.PLANTED
    trace = nsys.read(fixture(P["file"]))
    copies, kernels = rows(trace, "copies"), rows(trace, "kernels")
    ids = P["copy_ids"]
    small = [copies[i] for i in ids["small"]]
    assert len(small) == P["small_copies"]["count"]
    assert {(c["bytes"], c["direction"], c["src_kind"], c["dst_kind"], c["stream_id"], c["api_name"]) for c in small} \
        == {(P["small_copies"]["bytes"], "HtoD", "pinned", "device", P["copy_stream"], "cudaMemcpyAsync")}
    assert all(overlap_ns(c, kernels) == 0 for c in small)
    (half,) = [copies[i] for i in ids["half_covered"]]
    spec = P["half_covered_copy"]
    assert (half["bytes"], half["src_kind"], half["end_ns"] - half["start_ns"]) == \
        (spec["bytes"], spec["src_kind"], spec["duration_ns"])
    assert overlap_ns(half, [k for k in kernels if k["stream_id"] != half["stream_id"]]) == spec["covered_ns"]
    (pageable,) = [copies[i] for i in ids["pageable"]]
    assert (pageable["src_kind"], pageable["api_name"], pageable["stream_id"], pageable["bytes"]) == \
        ("pageable", P["pageable_copy"]["api_name"], P["pageable_copy"]["stream"], P["pageable_copy"]["bytes"])
    (uvm,) = [copies[i] for i in ids["unified"]]
    assert (uvm["unified_memory"], uvm["direction"], uvm["bytes"], uvm["launch_call_id"]) == \
        (True, "HtoD", P["unified_copy"]["bytes"], None)
    explicit = sum(c["bytes"] for c in copies if c["direction"] == "HtoD" and not c["unified_memory"])
    assert explicit == P["htod_bytes_explicit"]
    # The generator wrote what PLANTED says (checked straight in the file).
    con = open_ro(fixture(P["file"]))
    assert con.execute(f"SELECT SUM(bytes) FROM {MEMCPY} WHERE copyKind = 1").fetchone()[0] == explicit


def test_planted_launch_configurations_give_the_documented_waves():
    P = gen_nsys.PLANTED
    trace = nsys.read(fixture(P["file"]))
    (dev,) = rows(trace, "devices")
    by_name = {k["short_name"]: k for k in rows(trace, "kernels")}
    for spec in (P["tail_kernel"], P["register_limited_kernel"]):
        k = by_name[spec["name"]]
        assert (k["grid_x"], k["block_x"], k["registers_per_thread"]) == (spec["grid"], spec["block"], spec["regs"])
        blocks, occ = occupancy(dev, k["block_x"] * k["block_y"] * k["block_z"], k["registers_per_thread"])
        assert blocks == spec["blocks_per_sm"] and occ == spec["theoretical_occupancy"]
        assert k["grid_x"] / (blocks * dev["sm_count"]) == pytest.approx(spec["waves"])
    normal = [k for k in by_name.values() if k["short_name"] not in ("tail_kernel", "register_heavy")]
    for k in normal:
        blocks, occ = occupancy(dev, k["block_x"], k["registers_per_thread"])
        assert occ == 1.0 and k["grid_x"] / (blocks * dev["sm_count"]) == P["normal_kernel"]["waves"]


def test_planted_nvtx():
    P = gen_nsys.PLANTED
    ranges = rows(nsys.read(fixture(P["file"])), "ranges")
    assert [r["name"] for r in ranges if r["kind"] == "nvtx"] == P["nvtx"]["ranges"]
    marks = [r for r in ranges if r["kind"] == "nvtx_mark"]
    assert [m["name"] for m in marks] == P["nvtx"]["marks"] and marks[0]["start_ns"] == marks[0]["end_ns"]
    name, domain = P["nvtx"]["domain_range"]
    assert {r["name"]: r["domain"] for r in ranges}[name] == domain
    assert {(r["pid"], r["tid"]) for r in ranges} == {(P["pid"], P["tid"])}


def test_clean_fixture_has_nothing_to_flag():
    C = gen_nsys.CLEAN
    trace = nsys.read(fixture(C["file"]))
    assert {t: trace.tables[t].num_rows for t in C["counts"]} == C["counts"]
    kernels, copies = rows(trace, "kernels"), rows(trace, "copies")
    for stream in {o["stream_id"] for o in kernels + copies}:
        gaps = stream_gaps([o for o in kernels + copies if o["stream_id"] == stream])
        assert all(g <= C["max_gap_ns"] for g, _, _ in gaps)
    assert all(overlap_ns(c, kernels) == c["end_ns"] - c["start_ns"] for c in copies)
    assert {c["src_kind"] for c in copies} == {"pinned"}
    (dev,) = rows(trace, "devices")
    for k in kernels:
        blocks, occ = occupancy(dev, k["block_x"], k["registers_per_thread"])
        assert occ == C["theoretical_occupancy"] and k["grid_x"] / (blocks * dev["sm_count"]) == C["waves"]


def test_old_layout_fixture():
    O = gen_nsys.OLD
    trace = nsys.read(fixture(O["file"]))
    assert {t: trace.tables[t].num_rows for t in O["counts"]} == O["counts"]
    assert (trace.schema_version, trace.host) == ("2.9.1", O["host"])
    assert trace.metadata["dropped_rows"] == {KERNEL: O["zero_time_kernels"]}
    assert any("start = end = 0" in w for w in trace.warnings)
    assert {e: s for e, s in trace.metadata["enum_sources"].items() if e.startswith("ENUM")} == \
        dict.fromkeys(("ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "ENUM_NSYS_EVENT_TYPE",
                       "ENUM_CUDA_DEV_MEM_EVENT_OPER"), "built-in")
    # Correlation ids collide across the two processes; each kernel finds its own process's call.
    calls = rows(trace, "api_calls")
    for k in rows(trace, "kernels"):
        call = calls[k["launch_call_id"]]
        assert k["tid"] == O["kernel_tids"][k["short_name"]] == call["tid"] and call["pid"] == k["pid"]
        assert call["name"] in ("cudaLaunchKernel", "cuLaunchKernel")
        assert call["api"] == ("driver" if call["name"].startswith("cuL") else "runtime")
    assert Counter((s["api_name"], s["kind"]) for s in rows(trace, "syncs")) == Counter(O["sync_kinds"].items())
    assert trace.metadata["syncs_classified_by_code"] == 1
    assert trace.metadata["devices"]["gpus_listed"] == O["gpus_listed"]
    copies = rows(trace, "copies")
    assert [(c["direction"], c["unified_memory"], c["src_kind"]) for c in copies] == \
        [("HtoD", False, "pageable"), ("DtoH", True, "unknown")]


def test_graph_executions_and_memory_events():
    G = gen_nsys.GRAPH_MEMORY
    trace = nsys.read(fixture(G["file"]))
    assert {t: trace.tables[t].num_rows for t in ("kernels", "api_calls", "memory_events", "devices")} == \
        {t: G["counts"][t] for t in ("kernels", "api_calls", "memory_events", "devices")}
    graphs = [k for k in rows(trace, "kernels") if k["graph_id"] is not None]
    assert len(graphs) == G["counts"]["graph_kernels"]
    assert {(k["name"], k["graph_id"], k["grid_x"]) for k in graphs} == \
        {(f"[CUDA graph {G['graph_id']}]", G["graph_id"], None)}
    calls = rows(trace, "api_calls")
    assert {calls[k["launch_call_id"]]["name"] for k in graphs} == {"cudaGraphLaunch"}
    assert any("CUDA graph" in w for w in trace.warnings)
    events = rows(trace, "memory_events")
    assert [e["bytes"] for e in events] == G["memory_bytes"]
    assert {(e["device_type"], e["pid"]) for e in events} == {("cuda", G["pid"])}
    (dev,) = rows(trace, "devices")  # CUDA device 0 of the process is GPU 1
    assert (dev["device_id"], dev["name"], dev["sm_count"]) == (0, G["device_name"], G["sm_count_for_process"])


def test_fixtures_regenerate_byte_identical(tmp_path):
    if not gen_nsys.SCHEMA_DIR.exists():
        pytest.skip(f"{gen_nsys.SCHEMA_DIR} missing")
    written = gen_nsys.main(tmp_path)
    # Other generators (gen_structure, gen_timeline, ...) also write into fixtures/nsys.
    assert {p.name for p in written} <= {p.name for p in (FIXTURES / "nsys").glob("*.sqlite")}
    total = 0
    for new in written:
        committed = FIXTURES / "nsys" / new.name
        total += committed.stat().st_size
        if new.read_bytes() != committed.read_bytes():
            # Another SQLite library may lay pages out differently; the content must still agree.
            lib = sqlite3.sqlite_version_info
            writer = int.from_bytes(committed.read_bytes()[96:100], "big")
            assert writer != lib[0] * 1_000_000 + lib[1] * 1000 + lib[2], f"{new.name} differs"
            dump = lambda p: list(sqlite3.connect(p).iterdump())  # noqa: E731
            assert dump(new) == dump(committed), new.name
    assert total < 400_000


def edited_planted(tmp_path: Path, name: str, *statements: str) -> Path:
    """A copy of planted.sqlite with `statements` run on it."""
    path = tmp_path / name
    shutil.copy(fixture("planted.sqlite"), path)
    con = sqlite3.connect(path)
    for sql in statements:
        con.execute(sql)
    con.commit()
    con.close()
    return path


def test_missing_tables_and_columns_are_probed(tmp_path):
    path = edited_planted(tmp_path, "thin.sqlite", f"DROP TABLE {RUNTIME}", f"ALTER TABLE {KERNEL} DROP COLUMN mangledName",
                          f"ALTER TABLE {MEMCPY} DROP COLUMN srcKind", "DROP TABLE ENUM_CUDA_MEMCPY_OPER")
    trace = nsys.read(path)
    kernels, copies = trace.tables["kernels"], trace.tables["copies"]
    assert kernels.num_rows == 9 and trace.tables["api_calls"].num_rows == 0
    assert kernels["mangled_name"].null_count == 9 and kernels["launch_call_id"].null_count == 9
    assert copies["src_kind"].null_count == copies.num_rows
    assert set(copies["dst_kind"].to_pylist()) == {"device", "unknown"}
    assert trace.metadata["enum_sources"]["ENUM_CUDA_MEMCPY_OPER"] == "built-in"
    assert Counter(copies["direction"].to_pylist()) == {"HtoD": 23}
    assert any("9 of 9 kernel(s) have no launch call" in w for w in trace.warnings)


# -- bad files ------------------------------------------------------------------------------
def assert_trace_error(path: Path, *words: str) -> str:
    with pytest.raises(TraceError) as err:
        nsys.read(path)
    msg = str(err.value)
    assert msg and "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_truncated_export(traces_dir, tmp_path):
    data = real(traces_dir, "gpu4__report2.sqlite").read_bytes()
    half = tmp_path / "half.sqlite"
    half.write_bytes(data[: len(data) // 2])
    assert_trace_error(half, "truncated")
    header_only = tmp_path / "header.sqlite"
    header_only.write_bytes(data[:60])
    assert_trace_error(header_only, "truncated")


def test_corrupt_pages(tmp_path):
    data = bytearray(fixture("planted.sqlite").read_bytes())
    data[4096:len(data)] = bytes((i * 37 + 11) % 251 for i in range(len(data) - 4096))
    bad = tmp_path / "corrupt.sqlite"
    bad.write_bytes(bytes(data))
    assert_trace_error(bad, "SQLite")


def test_random_bytes_with_sqlite_magic(tmp_path):
    bad = tmp_path / "random.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + bytes((i * 91 + 7) % 256 for i in range(8192)))
    assert_trace_error(bad, "SQLite")


def test_sqlite_that_is_not_an_nsys_export(tmp_path):
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.execute("CREATE TABLE orders (id INTEGER)")
    con.commit()
    con.close()
    assert_trace_error(other, "not an Nsight Systems export", "orders, users")
    empty = tmp_path / "empty.sqlite"
    con = sqlite3.connect(empty)
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    assert_trace_error(empty, "not an Nsight Systems export")


@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_utf8_is_replaced(tmp_path, backend):
    path = tmp_path / "utf8.sqlite"
    shutil.copy(fixture("planted.sqlite"), path)
    con = sqlite3.connect(path)
    con.execute("UPDATE StringIds SET value = CAST(X'7461696CFF5F6B65726E656C' AS TEXT) WHERE value = 'tail_kernel'")
    con.commit()
    con.close()
    trace = nsys.read(path, backend=backend)
    names = set(trace.tables["kernels"]["short_name"].to_pylist())
    assert "tail\ufffd_kernel" in names
    assert any("UTF-8" in w for w in trace.warnings)


def test_odd_value_types_fall_back_to_sqlite3(tmp_path):
    """SQLite columns are untyped: a text value in an INTEGER column must not break the read."""
    if "adbc" not in BACKENDS:
        pytest.skip("ADBC not importable")
    path = edited_planted(tmp_path, "odd.sqlite",
                          f"UPDATE {KERNEL} SET gridY = 'n/a', registersPerThread = 32.0 WHERE rowid = 5")
    trace = nsys.read(path, backend="adbc")  # row 5 is kernel 4 (rows are in start order)
    assert trace.tables["kernels"]["grid_y"].to_pylist() == [1, 1, 1, 1, None, 1, 1, 1, 1]
    assert trace.tables["kernels"]["registers_per_thread"][4].as_py() == 32
    assert trace.metadata["adbc_fallbacks"] >= 1


# -- end to end -----------------------------------------------------------------------------
def test_ingest_into_store(traces_dir, tmp_path):
    store_mod = pytest.importorskip("traceanalyzer.store")
    path = real(traces_dir, "nsightful__power_iteration__baseline.sqlite")
    con = open_ro(path)
    with store_mod.Store(tmp_path / "t.duckdb") as store:
        result = store.ingest(path)
        counts = dict(store.sql("""
            SELECT 'kernels', count(*) FROM kernels WHERE run_id = $r UNION ALL
            SELECT 'copies', count(*) FROM copies WHERE run_id = $r UNION ALL
            SELECT 'api_calls', count(*) FROM api_calls WHERE run_id = $r UNION ALL
            SELECT 'launched', count(launch_call_id) FROM kernels WHERE run_id = $r""",
                                {"r": result.run_id}).fetchall())
        run = store.sql("SELECT format, schema_version, clock FROM runs WHERE run_id = ?", [result.run_id]).fetchone()
        stream_sync = store.sql("SELECT count(*) FROM syncs WHERE run_id = ? AND kind = 'stream'",
                                [result.run_id]).fetchone()[0]
    assert counts == {"kernels": count(con, KERNEL), "copies": count(con, MEMCPY), "api_calls": count(con, RUNTIME),
                      "launched": count(con, KERNEL)}
    assert run == ("nsys-sqlite", "3.20.2", "nsys-session")
    assert stream_sync == con.execute(f"""SELECT COUNT(*) FROM {SYNC} s JOIN {RUNTIME} r
        ON r.correlationId = s.correlationId JOIN StringIds n ON n.id = r.nameId
        WHERE n.value LIKE 'cudaStreamSynchronize%'""").fetchone()[0]


def test_compute_capability_minor_zero_is_kept(traces_dir):
    """computeMinor 0 (A100, H100, H200) is a real value, not 'not recorded'."""
    path = traces_dir / "nsys" / "CSC746CUDALab__report1.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    expected = con.execute("SELECT computeMajor, computeMinor FROM TARGET_INFO_GPU WHERE id = 0").fetchone()
    devices = nsys.read(path).tables["devices"].to_pylist()
    assert expected == (8, 0)
    assert [(d["compute_major"], d["compute_minor"]) for d in devices if d["device_id"] == 0] == [expected]


def test_names_are_dictionary_encoded_with_only_the_strings_used():
    trace = nsys.read(fixture("planted.sqlite"))
    for table, cols in {"kernels": ("name", "short_name", "mangled_name"), "api_calls": ("name", "raw_name"),
                        "copies": ("api_name",)}.items():
        for c in cols:
            col = trace.tables[table].column(c).combine_chunks()
            assert pa.types.is_dictionary(col.type), (table, c)
            used = {v for v in col.to_pylist() if v is not None}
            assert sorted(col.dictionary.to_pylist()) == sorted(used), (table, c)


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicate_correlation_ids_link_to_the_first_call(tmp_path, backend):
    """Calls repeating a (correlationId, process) pair: GPU rows keep the earliest call,
    exactly as before the duplicates (the grouped lookup, taken only when needed)."""
    before = nsys.read(fixture("planted.sqlite"), backend=backend)
    path = tmp_path / "dup.sqlite"
    shutil.copy(fixture("planted.sqlite"), path)
    con = sqlite3.connect(path)
    late = con.execute(f'SELECT max("end") + 1000 FROM {RUNTIME}').fetchone()[0]
    con.execute(f'INSERT INTO {RUNTIME} (start, "end", eventClass, globalTid, correlationId, nameId, returnValue) '
                f'SELECT start + {late}, "end" + {late}, eventClass, globalTid + 1, correlationId, nameId, 1 '
                f"FROM {RUNTIME}")
    con.commit()
    con.close()
    after = nsys.read(path, backend=backend)
    assert after.tables["api_calls"].num_rows == 2 * before.tables["api_calls"].num_rows
    for table in ("kernels", "copies", "syncs"):
        for c in ("launch_call_id", "tid"):
            assert after.tables[table][c].equals(before.tables[table][c]), (table, c)
        assert after.tables[table].num_rows == before.tables[table].num_rows


def test_unsorted_rows_get_ids_in_start_order(tmp_path):
    """Rows written out of time order (nsys flushes per-thread buffers) get ids by start."""
    path = tmp_path / "reversed.sqlite"
    shutil.copy(fixture("planted.sqlite"), path)
    con = sqlite3.connect(path)
    for table in (RUNTIME, KERNEL):
        con.execute(f"CREATE TABLE tmp AS SELECT * FROM {table} ORDER BY start DESC")
        con.execute(f"DELETE FROM {table}")
        con.execute(f"INSERT INTO {table} SELECT * FROM tmp")
        con.execute("DROP TABLE tmp")
    con.commit()
    con.close()
    trace = nsys.read(path)
    for table, id_col in (("kernels", "kernel_id"), ("api_calls", "call_id")):
        t = trace.tables[table]
        starts = t["start_ns"].to_pylist()
        assert starts == sorted(starts) and t[id_col].to_pylist() == list(range(t.num_rows))
    kernels = trace.tables["kernels"]
    assert kernels["launch_call_id"].null_count < kernels.num_rows
    calls = trace.tables["api_calls"]
    launch = dict(zip(calls["call_id"].to_pylist(), calls["correlation_id"].to_pylist()))
    for call, corr in zip(kernels["launch_call_id"].to_pylist(), kernels["correlation_id"].to_pylist()):
        assert call is None or launch[call] == corr


# -- big tables read and stored in parts ------------------------------------------------------
@pytest.fixture
def small_parts(monkeypatch):
    """Kernels, copies and NVTX ranges streamed in parts of two rows (batches of one), as a 5 M-kernel
    export is in parts of CHUNK_ROWS: every part boundary and restart is exercised."""
    if "adbc" not in BACKENDS:
        pytest.skip("parts are streamed through ADBC")
    from traceanalyzer.ingest import nsys_sqlite

    monkeypatch.setattr(nsys_sources, "CHUNK_ROWS", 2)
    monkeypatch.setattr(nsys_sqlite, "FETCH_BATCH_ROWS", 1)


def real_parts(monkeypatch) -> None:
    """Parts for a real export (3.4 k kernels, 16.8 k NVTX ranges): several per table, not
    thousands (a part costs a few DuckDB statements)."""
    from traceanalyzer.ingest import nsys_sqlite

    monkeypatch.setattr(nsys_sources, "CHUNK_ROWS", 1000)
    monkeypatch.setattr(nsys_sqlite, "FETCH_BATCH_ROWS", 100)


def plain(trace) -> dict:
    """Tables as Python values (parts have dictionaries of their own; the values are what counts)."""
    return {name: t.to_pylist() for name, t in trace.tables.items()}


def reordered(tmp_path: Path, table: str) -> Path:
    # Rows out of start order from the fifth on: the first two parts are in order (and stored).
    return edited_planted(tmp_path, "reordered.sqlite",
                          f"CREATE TABLE tmp AS SELECT * FROM {table} "
                          "ORDER BY rowid > 4, CASE WHEN rowid > 4 THEN -start ELSE start END",
                          f"DELETE FROM {table}", f"INSERT INTO {table} SELECT * FROM tmp", "DROP TABLE tmp")


@pytest.mark.parametrize("name", ["planted.sqlite", "h100_2gpu"])
def test_parts_give_the_tables_of_one_read(traces_dir, name, monkeypatch, small_parts):
    path = fixture(name) if name.endswith(".sqlite") else real(traces_dir, "nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite")
    if not name.endswith(".sqlite"):
        real_parts(monkeypatch)
    parts = nsys.read(path)
    assert parts.tables["kernels"]["kernel_id"].num_chunks > 1  # it was read in parts
    assert parts.tables["ranges"]["range_id"].num_chunks > 1
    monkeypatch.setattr(nsys_sources, "CHUNK_ROWS", 1 << 30)
    whole = nsys.read(path)
    assert plain(parts) == plain(whole)
    assert (parts.metadata, parts.warnings) == (whole.metadata, whole.warnings)


@pytest.mark.parametrize("name", ["planted.sqlite", "h100_2gpu", "odd"])
def test_one_read_cpu_reads_in_the_calling_thread_with_the_same_tables(traces_dir, tmp_path, name, monkeypatch,
                                                                          small_parts):
    """With one read CPU (`Resources(1)`: scan --jobs 1, or workers that share the cores) no
    fetch or stream thread starts; the tables are those of a threaded read, a stream that
    fails (odd: a text value where ADBC typed the column from the first row) included.
    `read_file` hands its resources to the reader."""
    from types import SimpleNamespace

    from traceanalyzer.ingest import nsys_sqlite, read_file
    from traceanalyzer.resources import Resources

    if name == "odd":
        path = edited_planted(tmp_path, "odd.sqlite", f"UPDATE {KERNEL} SET gridY = 'n/a' WHERE rowid = 5")
    else:
        path = fixture(name) if name.endswith(".sqlite") else real(traces_dir, "nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite")
    if name == "h100_2gpu":
        real_parts(monkeypatch)
    threaded = nsys.read(path, resources=Resources(2))

    def refuse(*a, **k):
        raise AssertionError("a thread was started with one read CPU")

    monkeypatch.setattr(nsys_sqlite, "ThreadPoolExecutor", refuse)
    monkeypatch.setattr(nsys_sqlite, "threading", SimpleNamespace(Thread=refuse, Event=refuse))
    assert nsys_sqlite.fetch_threads(Resources(1)) == 1
    alone = nsys.read(path, resources=Resources(1))
    if name == "planted.sqlite":  # `read_file` hands the reader its resources (no thread either)
        assert read_file(path, resources=Resources(1)).tables["kernels"].equals(alone.tables["kernels"])
    if name == "odd":  # the stream failed, and the table was read whole
        assert alone.metadata["adbc_fallbacks"] >= 1
    else:
        assert alone.tables["kernels"]["kernel_id"].num_chunks > 1  # streamed in parts
    assert plain(alone) == plain(threaded)
    assert (alone.metadata, alone.warnings) == (threaded.metadata, threaded.warnings)


@pytest.mark.parametrize("table", [KERNEL, MEMCPY, "NVTX_EVENTS"])
def test_parts_out_of_order_are_read_again_whole(tmp_path, table, small_parts):
    path = reordered(tmp_path, table)

    class Recorder:
        def __init__(self):
            self.parts, self.discarded = {}, []

        def add(self, name, t):
            self.parts.setdefault(name, []).append(t)

        def discard(self, name):
            self.discarded.append(name)
            self.parts.pop(name, None)

    sink = Recorder()
    nsys.read(path, sink=sink)
    output, id_col = {KERNEL: ("kernels", "kernel_id"), MEMCPY: ("copies", "copy_id"),
                      "NVTX_EVENTS": ("ranges", "range_id")}[table]
    assert output in sink.discarded  # (planted.sqlite's last copy is out of order already)
    got = pa.concat_tables(sink.parts[output])
    starts = got["start_ns"].to_pylist()
    assert starts == sorted(starts) and got[id_col].to_pylist() == list(range(got.num_rows))
    # The rows of the untouched file, each once.
    ids = [c for c in got.column_names if c.endswith("_id") and c != "device_id"]
    want = nsys.read(fixture("planted.sqlite")).tables[output]
    assert sorted(map(str, got.drop_columns(ids).to_pylist())) == sorted(map(str, want.drop_columns(ids).to_pylist()))


def test_a_stream_that_fails_falls_back_to_a_whole_read(tmp_path, small_parts):
    # ADBC typed the column from the first row
    path = edited_planted(tmp_path, "odd.sqlite", f"UPDATE {KERNEL} SET gridY = 'n/a' WHERE rowid = 5")
    trace = nsys.read(path)
    assert trace.tables["kernels"]["grid_y"].to_pylist() == [1, 1, 1, 1, None, 1, 1, 1, 1]
    assert trace.tables["kernels"]["kernel_id"].to_pylist() == list(range(9))
    assert trace.metadata["adbc_fallbacks"] >= 1


def test_a_streamed_table_is_held_to_the_text_limit(tmp_path, monkeypatch, small_parts):
    """A long name on every row of a table read in parts adds up as on a whole read (the
    check fetches the streamed table's name ids apart)."""
    import gen_hostile

    path = tmp_path / "amplified.sqlite"  # 100 KB name on 200 kernel rows: 20 MB once joined
    gen_hostile.amplified_sqlite(path, string_bytes=100_000, rows=200)
    monkeypatch.setenv("TRACEANALYZER_MAX_TEXT_BYTES", "8M")
    with pytest.raises(TraceError, match="repeated on every row.*TRACEANALYZER_MAX_TEXT_BYTES"):
        nsys.read(path)
    monkeypatch.delenv("TRACEANALYZER_MAX_TEXT_BYTES")
    kernels = nsys.read(path).tables["kernels"]
    assert kernels.num_rows == 200 and kernels["kernel_id"].num_chunks > 1  # it was read in parts


def test_streamed_ingest_that_fails_leaves_the_store_as_it_was(tmp_path, monkeypatch, small_parts):
    """Kernels and copies are written as they are read: a failure later rolls all of it back,
    and an earlier copy of the same run stays."""
    from traceanalyzer.store import Store

    path = fixture("planted.sqlite")
    with Store(tmp_path / "s.duckdb") as st:
        first = st.ingest(path)
        before = {t: st.sql(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("kernels", "copies", "api_calls", "runs")}

        def broken(state):
            raise TraceError("planted failure after the big tables")

        monkeypatch.setattr(nsys, "STAGES", tuple((n, broken if n == "syncs" else f) for n, f in nsys.STAGES))
        with pytest.raises(TraceError, match="planted failure"):
            st.ingest(path)
        after = {t: st.sql(f"SELECT count(*) FROM {t}").fetchone()[0] for t in before}
        assert after == before
        monkeypatch.undo()
        again = st.ingest(path)  # no transaction was left open
        assert again.replaced and again.run_id == first.run_id and again.counts == first.counts
        assert st.sql("SELECT count(*) FROM kernels").fetchone()[0] == before["kernels"]


@pytest.mark.parametrize("name", ["nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite", "Rodinia_Gaussian__report2.sqlite",
                                  "nsightful__power_iteration__baseline.sqlite"])
def test_call_index_links_as_the_join_does(traces_dir, name, monkeypatch):
    """GPU rows find their call by binary search over sorted (process, correlation id)
    keys; the hash join it replaces must give the same links."""
    from traceanalyzer.ingest import nsys_arrow

    path = real(traces_dir, name)
    indexed = nsys.read(path)
    assert nsys_arrow.CallIndex.build(*(pa.array(x) for x in ([1, 2], [0, 0]))) is not None
    monkeypatch.setattr(nsys_arrow.CallIndex, "build", classmethod(lambda cls, corr, process: None))
    joined = nsys.read(path)
    assert plain(indexed) == plain(joined)
    assert indexed.tables["kernels"]["launch_call_id"].null_count < max(1, indexed.tables["kernels"].num_rows)


def test_call_index_refuses_what_it_cannot_key():
    from traceanalyzer.ingest.nsys_arrow import CallIndex

    assert CallIndex.build(pa.array([1, 1]), pa.array([7, 7])) is None  # a repeated pair: the join decides
    assert CallIndex.build(pa.array([0, 1 << 40]), pa.array([7, 7])) is None  # ids too far apart
    index = CallIndex.build(pa.array([5, None, 5, 9]), pa.array([7, 7, 8, 7]))
    rows, calls = index.find(pa.array([9, 5, 5, 6, None, 5]), pa.array([7, 8, 9, 7, 7, 7]))
    assert list(zip(rows, calls)) == [(0, 3), (1, 2), (5, 0)]


@pytest.mark.parametrize("threads", [2, 3])
def test_runtime_read_in_one_part_per_fetch_thread(tmp_path, monkeypatch, small_parts, threads):
    """A big table is fetched as one rowid range per fetch thread: the parts hold every row
    once, in rowid order, and the reader's tables are a whole read's."""
    from traceanalyzer.ingest import nsys_sqlite

    path = FIXTURES / "nsys" / "planted.sqlite"
    monkeypatch.setattr(nsys_sqlite, "fetch_threads", lambda resources: threads)
    with nsys_sqlite.NsysFile(path) as f:
        parts = f._parts(f'"{RUNTIME}"', "", split_rows=1)
        assert len(parts) == threads
        ids = [r for part in parts for (r,) in f.rows(f"SELECT rowid FROM {RUNTIME} WHERE {part} ORDER BY rowid")]
        assert ids == [r for (r,) in f.rows(f"SELECT rowid FROM {RUNTIME} ORDER BY rowid")]
    in_parts = nsys.read(path)
    monkeypatch.setattr(nsys_sources, "CHUNK_ROWS", 1 << 30)
    assert plain(in_parts) == plain(nsys.read(path))


def test_runtime_read_in_parts_falls_back_as_a_whole(tmp_path, monkeypatch, small_parts):
    """Runtime calls are fetched in rowid ranges on the fetch threads; a value of another type
    in the last part sends the whole table to sqlite3, as a whole read would."""
    path = edited_planted(tmp_path, "odd_runtime.sqlite",
                          f"UPDATE {RUNTIME} SET returnValue = 'oops' WHERE rowid = (SELECT max(rowid) FROM {RUNTIME})")
    halves = nsys.read(path)
    assert halves.metadata["adbc_fallbacks"] >= 1
    monkeypatch.setattr(nsys_sources, "CHUNK_ROWS", 1 << 30)
    whole = nsys.read(path)
    assert plain(halves) == plain(whole)
    assert halves.tables["api_calls"]["return_value"].null_count == 1


def test_store_drops_the_parts_of_a_table_read_again(tmp_path, small_parts):
    """The store's writer deletes, inside the run's transaction, what it stored of a table
    the reader starts again: the run holds each kernel once, with ids in start order."""
    from traceanalyzer.store import Store

    path = reordered(tmp_path, KERNEL)
    with Store(tmp_path / "s.duckdb") as st:
        result = st.ingest(path)
        rows = st.sql("SELECT kernel_id, start_ns FROM kernels WHERE run_id = ? ORDER BY kernel_id",
                      [result.run_id]).fetchall()
    assert result.counts["kernels"] == len(rows) == 9
    assert [r[0] for r in rows] == list(range(9)) and [r[1] for r in rows] == sorted(r[1] for r in rows)
    assert sorted(r[1] for r in rows) == sorted(nsys.read(fixture("planted.sqlite")).tables["kernels"]["start_ns"].to_pylist())
