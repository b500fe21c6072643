"""Memsets are linked to the API call that issued them, as kernels and copies are, and
unified-memory page migrations stay out of the per-stream order (T001's launch gaps).

Expected links are re-derived from the files (an SQL join on the nsys export, the JSON of a
Kineto trace), never from the reader's own lookups."""

from __future__ import annotations

import gzip
import json
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import pytest

from traceanalyzer.ingest import kineto, nsys
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES, shared_file

sys.path.insert(0, str(FIXTURES))
import gen_nsys  # noqa: E402

MEMSET, RUNTIME = "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME"
# CUPTI_ACTIVITY_KIND_MEMSET as the 3.25.0 dump in shared/docs/nsys-schema has it (the dumps
# gen_nsys.py writes from have no memset table).
MEMSET_DDL = """CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER)"""
T0, US = gen_nsys.T0, 1_000
MAIN_PID, OTHER_PID, COMPUTE, SIDE, UVM = 4242, 5151, 7, 9, 0
# Unified-memory migrations on stream 0 (start, end in us), none during other work, with
# device-idle time between them.
MIGRATIONS = [(30, 31), (70, 71), (80, 81)]


def _write_export(path: Path) -> None:
    """A kernel, a memset and a kernel on stream 7, each with its call; a memset of another
    process on stream 9 whose correlation id repeats the first memset's (only the process tells
    their calls apart); a memset with no call in the trace; migrations alone on stream 0."""
    ex = gen_nsys.Export(path, "3.24.14", "2026.1.1.204")
    ex.statements[MEMSET] = MEMSET_DDL
    gen_nsys.describe_gpu(ex, 0)
    p, q = gen_nsys.Process(ex, MAIN_PID), gen_nsys.Process(ex, OTHER_PID, tid=5152, first_correlation=101)
    at = lambda t: T0 + int(t * US)  # noqa: E731

    def memset(proc, corr, start, end, stream):
        ex.insert(MEMSET, start=at(start), end=at(end), deviceId=0, contextId=1, streamId=stream,
                  correlationId=corr, globalPid=proc.gpid, value=0, bytes=65_536, memKind=2)

    corr = p.call("cudaLaunchKernel_v7000", at(1), at(3))  # 100
    p.kernel(corr, at(10), at(20), "void first(float*)", grid=160, block=256, regs=32, stream=COMPUTE)
    # The stream idles from 20 us until the memset at 40 us; its call returned at 23 us.
    corr = p.call("cudaMemsetAsync_v3020", at(22), at(23))  # 101
    memset(p, corr, 40, 42, COMPUTE)
    corr = p.call("cudaLaunchKernel_v7000", at(24), at(25))  # 102
    p.kernel(corr, at(42.5), at(60), "void second(float*)", grid=160, block=256, regs=32, stream=COMPUTE)
    corr = q.call("cuMemsetD32Async", at(30), at(31), driver=True)  # 101 in the other process
    memset(q, corr, 50, 51, SIDE)
    memset(p, 999, 62, 63, COMPUTE)  # no call 999 anywhere
    for start, end in MIGRATIONS:  # no API call (correlation id 0), as in real exports
        ex.insert("CUPTI_ACTIVITY_KIND_MEMCPY", start=at(start), end=at(end), deviceId=0, contextId=0,
                  streamId=UVM, correlationId=0, globalPid=p.gpid, bytes=4096, copyKind=11, srcKind=7,
                  dstKind=7, migrationCause=2)
    ex.finish()


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("memsets") / "memsets.sqlite"
    _write_export(path)
    return path


def _t001(store: Store, run_id: str) -> list[dict]:
    run_rules(store, [run_id], Settings(select=["T001"]))
    rows = store.arrow("SELECT * FROM findings WHERE run_id = ? AND rule_id = 'T001'", [run_id]).to_pylist()
    for r in rows:
        r["evidence"] = json.loads(r["evidence"])
    return rows


def test_nsys_memsets_link_to_their_call_in_their_own_process(export):
    trace = nsys.read(export)
    calls = trace.tables["api_calls"].to_pylist()
    memsets = {m["start_ns"]: m for m in trace.tables["memsets"].to_pylist()}
    assert len(memsets) == 3
    expected = {at: (pid, tid, name) for at, pid, tid, name in (
        (T0 + 40 * US, MAIN_PID, MAIN_PID, "cudaMemsetAsync"), (T0 + 50 * US, OTHER_PID, 5152, "cuMemsetD32Async"))}
    for start, (pid, tid, name) in expected.items():
        m = memsets[start]
        call = calls[m["launch_call_id"]]
        assert call["call_id"] == m["launch_call_id"]
        assert (call["correlation_id"], call["pid"], call["tid"], call["name"]) == (m["correlation_id"], pid, tid, name)
        assert (m["tid"], m["api_name"], m["pid"]) == (tid, name, pid)
    orphan = memsets[T0 + 62 * US]
    assert (orphan["launch_call_id"], orphan["tid"], orphan["api_name"]) == (None, None, None)
    assert trace.metadata["memsets_with_api_call"] == 2


def test_gpu_activity_carries_memset_calls_and_stream_ops_leaves_migrations_out(export, store):
    run_id = store.ingest(export).run_id
    activity = store.sql("""SELECT g.item_id, g.launch_call_id, m.launch_call_id FROM gpu_activity g
                            JOIN memsets m ON m.run_id = g.run_id AND m.memset_id = g.item_id
                            WHERE g.run_id = ? AND g.kind = 'memset' ORDER BY 1""", [run_id]).fetchall()
    assert [(a, b) for _, a, b in activity] == [(b, b) for _, _, b in activity]
    assert sum(b is not None for _, _, b in activity) == 2
    per_stream = dict(store.sql("SELECT stream_id, count(*) FROM gpu_activity WHERE run_id = ? GROUP BY 1",
                                [run_id]).fetchall())
    assert per_stream == {COMPUTE: 4, SIDE: 1, UVM: len(MIGRATIONS)}
    ops = dict(store.sql("SELECT stream_id, count(*) FROM stream_ops WHERE run_id = ? GROUP BY 1", [run_id]).fetchall())
    assert ops == {COMPUTE: 4, SIDE: 1}
    # The migrations still keep the device busy: kernels 10 + 17.5 us, memsets 2 + 1 us (the side
    # memset lies inside the second kernel), migrations 3 x 1 us.
    busy = store.sql("SELECT busy_ns FROM device_busy WHERE run_id = ?", [run_id]).fetchone()[0]
    assert busy == int((10 + 17.5 + 2 + 1 + 3) * US)


def test_t001_gap_before_a_linked_memset_has_a_cause_and_migrations_make_no_gaps(export, store):
    run_id = store.ingest(export).run_id
    findings = _t001(store, run_id)
    assert not [f for f in findings if f["stream_id"] == UVM]
    (compute,) = [f for f in findings if f["stream_id"] == COMPUTE]
    # The 20 us gap before the memset, whose call is found, is explained; the gap before the
    # memset without a call is too short to count.
    assert compute["evidence"]["count"] == 1
    (gap,) = compute["evidence"]["worst"]
    assert (gap["start_ns"], gap["end_ns"], gap["after_kind"]) == (T0 + 20 * US, T0 + 40 * US, "memset")
    assert gap["cause"] != "unknown"


def test_kineto_planted_memset_links_to_its_call():
    sys.path.insert(0, str(FIXTURES.parent))
    from fixtures.gen_kineto import PLANTED

    trace = kineto.read(FIXTURES / "kineto" / "planted.json")
    calls = trace.tables["api_calls"].to_pylist()
    (m,) = trace.tables["memsets"].to_pylist()
    assert m["correlation_id"] == PLANTED["memset"]["correlation"]
    call = calls[m["launch_call_id"]]
    assert (call["call_id"], call["correlation_id"], call["name"]) == (m["launch_call_id"], m["correlation_id"],
                                                                       "cudaMemsetAsync")
    assert (m["tid"], m["pid"], m["api_name"]) == (call["tid"], call["pid"], "cudaMemsetAsync")


# -- real traces --------------------------------------------------------------------------
NSYS_WITH_MEMSETS = ["DLProf__nsys_profile.sqlite", "Fuser__64ee035__report1.sqlite",
                     "OpenACC_PolPuig__report12.sqlite", "WeatherBench2__report1.sqlite",
                     "nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite"]
# Kineto traces with memsets: all calls present, some missing (Qwen: 73 of 241), memsets of a
# graph launch (negative_queue), and none at all (trace_compare: 6 memsets, no call of theirs).
KINETO_WITH_MEMSETS = ["TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                       "TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz",
                       "hta__negative_queue_length_values_check__rank0.json.gz",
                       "hta__trace_compare__base__base.json.gz",
                       "kineto__tb_plugin__resnet50_profiler_api_num_workers_0__worker0_2021-01.pt.trace.json.gz"]


def _real(kind: str, name: str) -> Path:
    return shared_file(f"traces/{kind}/{name}")


@pytest.mark.parametrize("name", NSYS_WITH_MEMSETS)
def test_real_nsys_memsets_link_as_the_sqlite_join_does(name):
    path = _real("nsys", name)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    joined = Counter(con.execute(f"""
        SELECT m.correlationId, (m.globalPid >> 24) & 16777215, r.globalTid & 16777215, s.value
        FROM {MEMSET} m
        JOIN {RUNTIME} r ON r.correlationId = m.correlationId AND m.globalPid = (r.globalTid & -16777216)
        JOIN StringIds s ON s.id = r.nameId
        WHERE NOT (m.start = 0 AND m."end" = 0)""").fetchall())
    n = con.execute(f'SELECT count(*) FROM {MEMSET} WHERE NOT (start = 0 AND "end" = 0)').fetchone()[0]
    con.close()
    trace = nsys.read(path)
    calls = trace.tables["api_calls"].to_pylist()
    memsets = trace.tables["memsets"].to_pylist()
    linked = [m for m in memsets if m["launch_call_id"] is not None]
    assert len(memsets) == n and len(linked) == sum(joined.values())
    got = Counter()
    for m in linked:
        call = calls[m["launch_call_id"]]
        assert (call["correlation_id"], call["pid"], call["tid"], call["name"]) == (
            m["correlation_id"], m["pid"], m["tid"], m["api_name"])
        assert "Memset" in call["name"]
        got[(m["correlation_id"], m["pid"], m["tid"], call["raw_name"])] += 1
    assert got == joined
    assert len(linked) >= 0.9 * len(memsets)  # every one of these traces records its API calls


def _kineto_events(path: Path) -> list[dict]:
    raw = path.read_bytes()
    data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return data["traceEvents"] if isinstance(data, dict) else data


@pytest.mark.parametrize("name", KINETO_WITH_MEMSETS)
def test_real_kineto_memsets_link_where_their_call_is_in_the_trace(name):
    path = _real("torch", name)
    events = _kineto_events(path)
    cat = lambda e: (e.get("cat") or "").lower()  # noqa: E731
    call_ids = {(e.get("args") or {}).get("correlation") for e in events
                if cat(e) in ("cuda_runtime", "runtime", "cuda_driver") and e.get("ph") == "X"}
    expected = [(e.get("args") or {}).get("correlation") in call_ids for e in events
                if cat(e) in ("gpu_memset", "memset") and e.get("ph") == "X"]
    trace = kineto.read(path)
    calls = trace.tables["api_calls"].to_pylist()
    memsets = trace.tables["memsets"].to_pylist()
    linked = [m for m in memsets if m["launch_call_id"] is not None]
    assert (len(memsets), len(linked)) == (len(expected), sum(expected))
    for m in linked:
        call = calls[m["launch_call_id"]]
        assert (call["correlation_id"], call["tid"], call["name"]) == (m["correlation_id"], m["tid"], m["api_name"])


UVM_ONLY = ["CSC746CUDALab__report1.sqlite", "vectoraddition__report1.sqlite"]


@pytest.mark.parametrize("name", UVM_ONLY)
def test_t001_finds_no_gaps_on_streams_of_unified_memory_migrations(name, store):
    """These A100 labs have one kernel on stream 7 and thousands of page migrations (copyKind
    11/12) on stream 0: stream 0 is not a stream the program gave work, so it has no launch gaps."""
    path = _real("nsys", name)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    migration_streams = {s for (s,) in con.execute(
        "SELECT DISTINCT streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind IN (11, 12, 13)")}
    other_streams = {s for (s,) in con.execute(
        "SELECT streamId FROM CUPTI_ACTIVITY_KIND_KERNEL UNION SELECT streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY "
        "WHERE copyKind NOT IN (11, 12, 13)")}
    migrations = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind IN (11, 12, 13)"
                             ).fetchone()[0]
    con.close()
    uvm_only = migration_streams - other_streams
    assert uvm_only and migrations > 1000
    run_id = store.ingest(path).run_id
    findings = _t001(store, run_id)
    assert not [f for f in findings if f["stream_id"] in uvm_only]
    assert not store.sql("SELECT 1 FROM stream_ops WHERE run_id = ? AND list_contains(?, stream_id)",
                         [run_id, sorted(uvm_only)]).fetchall()
    # They still count as device activity (the copy engines were busy).
    assert store.sql("SELECT count(*) FROM gpu_activity WHERE run_id = ? AND unified_memory",
                     [run_id]).fetchone()[0] == migrations


def test_a_store_without_the_memset_link_columns_gets_them_as_null(tmp_path):
    """A store written before memsets had their call: opening it adds the columns (NULL for the
    runs it holds), read-only or not, with no numbered migration step."""
    import duckdb

    from traceanalyzer.store import migrations

    path = tmp_path / "old.duckdb"
    with Store(path) as st:
        st.ingest(FIXTURES / "kineto" / "planted.json")
    with duckdb.connect(str(path)) as con:
        for c in ("tid", "api_name", "launch_call_id"):
            con.execute(f"ALTER TABLE memsets DROP COLUMN {c}")
        assert migrations.outdated(con) and migrations.version(con) == migrations.SCHEMA_VERSION
    with Store(path, read_only=True) as st:
        rows = st.sql("SELECT m.tid, m.api_name, m.launch_call_id, g.launch_call_id FROM memsets m "
                      "JOIN gpu_activity g ON g.kind = 'memset' AND g.item_id = m.memset_id").fetchall()
        assert rows == [(None, None, None, None)]
        assert migrations.version(st.con) == migrations.SCHEMA_VERSION
