"""The store: one transaction per run, replace on re-ingest, views, rules bookkeeping."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from traceanalyzer import schema
from traceanalyzer.ingest.base import ParsedTrace
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store, StoreError
from traceanalyzer.store.run_policy import RunPlan, RunPolicy

from .conftest import FIXTURES

KEEP_ALL = RunPolicy(keep_min_gpu_ops=1)  # every run keeps its rules' cache in the store


def _trace(n_kernels: int = 3, gap_ns: int = 12_000) -> ParsedTrace:
    starts = [i * (1_000 + gap_ns) for i in range(n_kernels)]
    return ParsedTrace(format="nsys-sqlite", tables={
        "kernels": pa.table({
            "kernel_id": list(range(n_kernels)), "device_id": [0] * n_kernels, "stream_id": [7] * n_kernels,
            "start_ns": starts, "end_ns": [s + 1_000 for s in starts], "name": [f"k{i}" for i in range(n_kernels)],
        }),
        "copies": pa.table({"copy_id": [0], "device_id": [0], "stream_id": [8], "start_ns": [500],
                            "end_ns": [1_500], "direction": ["HtoD"], "bytes": [4096], "src_kind": ["pinned"]}),
    })


def test_schema_tables_exist_with_documented_columns(store):
    for t in schema.TABLES:
        cols = [r[0] for r in store.sql(f"DESCRIBE {t.name}").fetchall()]
        assert cols == t.column_names


def test_write_run_stores_rows_and_span(store):
    r = store.write_run(_trace(), Path("/x/a.sqlite"), "a" * 64, 123)
    assert r.run_id == "a" * 16 and r.counts["kernels"] == 3 and r.counts["copies"] == 1
    assert store.sql("SELECT start_ns, end_ns, span_ns, file_name FROM runs").fetchone() == (0, 27_000, 27_000, "a.sqlite")
    assert store.sql("SELECT count(*) FROM kernels WHERE run_id = ?", [r.run_id]).fetchone()[0] == 3


def test_same_content_replaces_the_run(store):
    store.write_run(_trace(3), Path("/x/a.sqlite"), "a" * 64, 1)
    r = store.write_run(_trace(5), Path("/x/a.sqlite"), "a" * 64, 1)
    assert r.replaced
    assert store.sql("SELECT count(*) FROM runs").fetchone()[0] == 1
    assert store.sql("SELECT count(*) FROM kernels").fetchone()[0] == 5


def test_failed_write_leaves_no_trace_and_keeps_earlier_runs(store, monkeypatch):
    store.write_run(_trace(), Path("/x/a.sqlite"), "a" * 64, 1)
    import traceanalyzer.store.writer as st

    real_insert = st.insert
    calls = {"n": 0}

    def failing_insert(con, name, tbl):
        calls["n"] += 1
        if name == "copies":  # fail after runs and kernels were inserted
            raise RuntimeError("disk full")
        real_insert(con, name, tbl)

    monkeypatch.setattr(st, "insert", failing_insert)
    with pytest.raises(RuntimeError):
        store.write_run(_trace(), Path("/x/b.sqlite"), "b" * 64, 1)
    assert calls["n"] >= 2
    assert store.sql("SELECT run_id FROM runs").fetchall() == [("a" * 16,)]
    assert store.sql("SELECT DISTINCT run_id FROM kernels").fetchall() == [("a" * 16,)]


class _Recording:
    """A connection that records the SQL it is given (and does it)."""

    def __init__(self, con):
        self.con, self.sql = con, []

    def execute(self, query, *args):
        self.sql.append(query)
        return self.con.execute(query, *args)

    def __getattr__(self, name):
        return getattr(self.con, name)


def _results(store, run_id):
    from traceanalyzer.store import RuleResults

    run_rules(store, [run_id], Settings(select=["T001", "T002"]))
    findings = store.arrow("SELECT * EXCLUDE (run_id) FROM findings WHERE run_id = ?", [run_id])
    rule_runs = store.arrow("SELECT * EXCLUDE (run_id) FROM rule_runs WHERE run_id = ?", [run_id])
    assert findings.num_rows > 0 and rule_runs.num_rows == 2
    return RuleResults(["T001", "T002"], findings, rule_runs)


def _finding_rows(store, run_id):
    return store.sql("SELECT * EXCLUDE (run_id) FROM findings WHERE run_id = ? ORDER BY ALL", [run_id]).fetchall()


def test_a_run_and_its_findings_are_written_together(store, monkeypatch):
    """write_run with findings (a scan's worker evaluated the rules) writes the run, its rows
    and its findings in one transaction: all of them or, when any part fails, none. A new
    run's write deletes nothing (it has no rows); a replaced run loses its old findings."""
    import traceanalyzer.store.writer as st

    a = store.write_run(_trace(), Path("/x/a"), "a" * 64, 1).run_id
    results = _results(store, a)
    recording = _Recording(store.con)
    monkeypatch.setattr(store, "con", recording)
    b = store.write_run(_trace(), Path("/x/b"), "b" * 64, 1, findings=results)
    assert not [q for q in recording.sql if q.lstrip().upper().startswith(("DELETE", "DROP"))]
    assert _finding_rows(store, b.run_id) == _finding_rows(store, a)
    assert store.sql("SELECT rule_id, status FROM rule_runs WHERE run_id = ? ORDER BY 1", [b.run_id]).fetchall() \
        == store.sql("SELECT rule_id, status FROM rule_runs WHERE run_id = ? ORDER BY 1", [a]).fetchall()

    # replaced: the run's earlier rows and findings go, even those of rules not given now
    run_rules(store, [b.run_id], Settings(select=["T003"]))
    recording.sql.clear()
    again = store.write_run(_trace(5), Path("/x/b"), "b" * 64, 1, findings=results)
    assert again.replaced and any(q.lstrip().upper().startswith("DELETE") for q in recording.sql)
    assert store.sql("SELECT DISTINCT rule_id FROM rule_runs WHERE run_id = ? ORDER BY 1", [b.run_id]).fetchall() \
        == [("T001",), ("T002",)]
    assert store.sql("SELECT count(*) FROM kernels WHERE run_id = ?", [b.run_id]).fetchone()[0] == 5

    # a failure while writing the findings leaves neither the run nor its rows
    real_insert = st.insert
    monkeypatch.setattr(st, "insert", lambda con, name, tbl: (_ for _ in ()).throw(RuntimeError("disk full"))
                        if name == "rule_runs" else real_insert(con, name, tbl))
    with pytest.raises(RuntimeError, match="disk full"):
        store.write_run(_trace(), Path("/x/c"), "c" * 64, 1, findings=results)
    for table in ("runs", "kernels", "copies", "findings", "rule_runs"):
        assert store.sql(f"SELECT count(*) FROM {table} WHERE run_id = ?", ["c" * 16]).fetchone()[0] == 0, table


def test_reader_columns_must_be_in_the_schema(store):
    bad = ParsedTrace(format="nsys-sqlite", tables={"kernels": pa.table({"kernel_id": [0], "bogus": [1]})})
    with pytest.raises(ValueError, match="bogus"):
        store.write_run(bad, Path("/x/c"), "c" * 64, 1)
    assert store.sql("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_busy_views(store):
    store.write_run(_trace(3, gap_ns=12_000), Path("/x/a"), "a" * 64, 1)
    busy = store.sql("SELECT busy_ns, active_span_ns FROM device_busy").fetchone()
    # kernels [0,1000] [13000,14000] [26000,27000] and a copy [500,1500]
    assert busy == (3_500, 27_000)
    gaps = store.sql("SELECT start_ns, end_ns FROM device_idle_gaps ORDER BY 1").fetchall()
    assert gaps == [(1_500, 13_000), (14_000, 26_000)]
    # running totals: busy time before each busy interval, idle time before each gap
    assert store.sql("SELECT start_ns, end_ns, busy_before_ns FROM device_busy_intervals ORDER BY 1").fetchall() \
        == [(0, 1_500, 0), (13_000, 14_000, 1_500), (26_000, 27_000, 2_500)]
    assert store.sql("SELECT idle_before_ns FROM device_idle_gaps ORDER BY start_ns").fetchall() == [(0,), (11_500,)]
    # run-wide gaps: idle on every device; a second device busy over [1400, 20000] leaves one
    assert store.sql("SELECT start_ns, end_ns, gap_ns FROM run_idle_gaps ORDER BY 1").fetchall() \
        == [(1_500, 13_000, 11_500), (14_000, 26_000, 12_000)]
    store.sql("INSERT INTO kernels (run_id, kernel_id, device_id, stream_id, start_ns, end_ns, name) "
              "SELECT run_id, 99, 1, 7, 1_400, 20_000, 'other device' FROM runs")
    assert store.sql("SELECT start_ns, end_ns, gap_ns FROM run_idle_gaps ORDER BY 1").fetchall() == [(20_000, 26_000, 6_000)]


def test_a_run_id_prefix_is_matched_literally(store):
    ids = [store.ingest(FIXTURES / f).run_id for f in ("nsys/planted.sqlite", "kineto/planted.json")]
    assert store.resolve_run(ids[0][:4]) == ids[0]
    assert store.resolve_run("planted.json") == ids[1]  # a file name
    for ref in ("%", "_", ids[0][:3] + "_", "_" * 16):  # LIKE's wildcards match nothing here
        with pytest.raises(StoreError, match="no run matches"):
            store.resolve_run(ref)


def test_rules_replace_their_findings_and_record_no_data(store):
    r = store.write_run(_trace(), Path("/x/a"), "a" * 64, 1)
    run_rules(store, [r.run_id], Settings(select=["T001"]))
    n1 = store.sql("SELECT count(*) FROM findings").fetchone()[0]
    run_rules(store, [r.run_id], Settings(select=["T001"]))
    assert store.sql("SELECT count(*) FROM findings").fetchone()[0] == n1 > 0
    empty = store.write_run(ParsedTrace(format="nsys-sqlite"), Path("/x/e"), "e" * 64, 1)
    outcomes = run_rules(store, [empty.run_id], Settings(select=["T001"]))
    assert [(o.status, o.findings) for o in outcomes] == [("no-data", 0)]
    assert store.sql("SELECT status FROM rule_runs WHERE run_id = ?", [empty.run_id]).fetchone()[0] == "no-data"


def test_reingest_drops_stale_findings(store):
    r = store.write_run(_trace(), Path("/x/a"), "a" * 64, 1)
    run_rules(store, [r.run_id], Settings(select=["T001"]))
    store.write_run(_trace(), Path("/x/a"), "a" * 64, 1)
    assert store.sql("SELECT count(*) FROM findings").fetchone()[0] == 0


def test_second_writer_waits_then_fails_clearly(tmp_path):
    path = tmp_path / "locked.duckdb"
    holder = duckdb.connect(str(path))  # another process would hold the same lock
    try:
        # DuckDB locks per process: simulate with a subprocess holding the file.
        import subprocess
        import sys
        import textwrap

        holder.close()
        code = textwrap.dedent(f"""
            import duckdb, time, sys
            c = duckdb.connect({str(path)!r}); print('held', flush=True); time.sleep(20)
        """)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(StoreError, match="locked by another"):
            Store(path, lock_timeout_s=0.5)
        p.kill()
        p.wait()
        Store(path).close()  # free again once the holder is gone
    finally:
        holder.close()


def test_not_a_store(tmp_path):
    p = tmp_path / "junk.duckdb"
    p.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="cannot open store"):
        Store(p)


def test_a_store_another_process_is_creating_is_waited_for(tmp_path):
    """A writer that opens the file while another is still writing DuckDB's headers finds
    it short: it tries again, and opens the store once the headers are there."""
    path = tmp_path / "s.duckdb"
    path.write_bytes(b"")
    made = tmp_path / "made.duckdb"
    Store(made).close()

    def finish():
        time.sleep(0.3)
        os.replace(made, path)

    t = threading.Thread(target=finish)
    t.start()
    try:
        Store(path).close()
    finally:
        t.join()
    short = tmp_path / "short.duckdb"  # short, and no DuckDB magic: no store, at once
    short.write_bytes(b"x")
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="cannot open store"):
        Store(short)
    assert time.monotonic() - t0 < 1


def test_the_wait_for_a_creator_counts_from_the_files_last_change(tmp_path, monkeypatch):
    """A creator that stalls keeps the opener waiting as long as the file keeps changing
    (here: growing zeros, as a header being written), however long that takes in all; an
    empty file that stays empty is given up after CREATING_WAIT_S."""
    import traceanalyzer.store as S

    monkeypatch.setattr(S, "CREATING_WAIT_S", 0.6)
    path = tmp_path / "s.duckdb"
    path.write_bytes(b"")
    made = tmp_path / "made.duckdb"
    Store(made).close()

    def creator():
        for n in range(1, 6):
            time.sleep(0.3)
            path.write_bytes(b"\0" * 512 * n)
        os.replace(made, path)

    t = threading.Thread(target=creator)
    t0 = time.monotonic()
    t.start()
    try:
        with Store(path) as s:
            assert s.run_ids() == []
    finally:
        t.join()
    assert time.monotonic() - t0 >= 1.5
    empty = tmp_path / "empty.duckdb"
    empty.write_bytes(b"")
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="cannot open store"):
        Store(empty)
    assert 0.6 <= time.monotonic() - t0 < 5


def test_a_store_made_whole_right_after_a_failed_open_is_opened(tmp_path, monkeypatch):
    """The open fails on the empty file, and the creator puts the whole store in place before
    the opener looks at the file again: the file changed, so it is tried again."""
    import traceanalyzer.store as S

    path = tmp_path / "s.duckdb"
    path.write_bytes(b"")
    made = tmp_path / "made.duckdb"
    Store(made).close()
    real, tries = S.connect_duckdb, []

    def connect(*args, **kwargs):
        tries.append(path.stat().st_size)
        try:
            return real(*args, **kwargs)
        finally:
            if made.exists():
                os.replace(made, path)

    monkeypatch.setattr(S, "connect_duckdb", connect)
    with Store(path) as s:
        assert s.run_ids() == []
    assert tries[0] == 0 and tries[1] >= S.HEADER_BYTES
    whole = tmp_path / "whole.duckdb"  # a whole file that is no store fails at once, unchanged
    whole.write_bytes(b"x" * 2 * S.HEADER_BYTES)
    tries.clear()
    with pytest.raises(StoreError, match="cannot open store"):
        Store(whole)
    assert len(tries) == 1


def test_dictionary_strings_are_stored_as_plain_varchar(store):
    """Readers may hand over dictionary-encoded strings: stored as VARCHAR, same values;
    run_id and absent columns are filled by the INSERT."""
    names = pa.DictionaryArray.from_arrays(pa.array([1, 0, None, 1], pa.int32()), pa.array(["a", "b"]))
    trace = ParsedTrace(format="nsys-sqlite", tables={"kernels": pa.table({
        "kernel_id": [0, 1, 2, 3], "start_ns": [0, 10, 20, 30], "end_ns": [5, 15, 25, 35], "name": names})})
    r = store.write_run(trace, Path("/x/d"), "d" * 64, 1)
    assert r.counts["kernels"] == 4 and r.span_ns == 35
    assert store.sql("SELECT DISTINCT typeof(name), typeof(run_id) FROM kernels").fetchall() == [("VARCHAR", "VARCHAR")]
    assert store.sql("SELECT kernel_id, name, short_name, run_id FROM kernels ORDER BY kernel_id").fetchall() == [
        (0, "b", None, "d" * 16), (1, "a", None, "d" * 16), (2, None, None, "d" * 16), (3, "b", None, "d" * 16)]


def test_memory_limit_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEANALYZER_MEMORY_LIMIT", "1GB")
    with Store(tmp_path / "m.duckdb") as st:
        assert st.sql("SELECT current_setting('memory_limit')").fetchone()[0] == "953.6 MiB"
    monkeypatch.setenv("TRACEANALYZER_MEMORY_LIMIT", "lots")
    with pytest.raises(StoreError, match="TRACEANALYZER_MEMORY_LIMIT='lots' is not a memory size"):
        Store(tmp_path / "m.duckdb")


@pytest.mark.parametrize("where", ["scope", "kept", "none"])
def test_a_runs_scope_matches_the_store_wide_views(store, traces_dir, where):
    """Every RUN_CACHED view in a run's scope (`this_run.<view>`, over tables built for the block in
    the scope's database, kept in the store, or none: the store-wide view filtered on the run) has
    the columns and rows of the store-wide view filtered on the run: one definition, whichever way
    it is computed. No store-wide view is redefined meanwhile, and the scope goes with the block."""
    from traceanalyzer.store import run_cache

    real = traces_dir / "nsys" / "nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite"  # 2 GPUs, 4.3 k operations
    for f in ("nsys/planted.sqlite", "kineto/planted.json", "nsys/timeline_sync.sqlite", "kineto/timeline_busy.json.gz"):
        store.ingest(FIXTURES / f)
    if real.exists():
        store.ingest(real)
    policy = KEEP_ALL if where == "kept" else RunPolicy()
    names = run_cache.RUN_CACHED
    definitions = "SELECT view_name, sql FROM duckdb_views() WHERE temporary ORDER BY ALL"

    def rows(name):  # (column names, rows)
        result = store.sql(f"SELECT * FROM {name} ORDER BY ALL")
        return [d[0] for d in result.description], result.fetchall()

    whole = {n: rows(n) for n in names}
    assert all(r for _, r in whole.values())
    store_wide = store.sql(definitions).fetchall()
    for run_id in store.run_ids():
        with run_cache.scoped_to_run(store.con, run_id, build=where != "none", keep=where == "kept",
                                     policy=policy) as cache:
            assert cache.cached == (where != "none") and cache.kept == (where == "kept")
            for n in names:
                columns, all_runs = whole[n]
                assert rows(f"this_run.{n}") == (columns, [r for r in all_runs if r[0] == run_id]), (n, run_id)
            assert store.sql(definitions).fetchall() == store_wide
    assert store.sql(definitions).fetchall() == store_wide
    assert not store.sql("SELECT 1 FROM duckdb_databases() WHERE database_name = 'this_run'").fetchall()


@pytest.mark.parametrize("layout", ["one thread", "two threads", "kept"])
def test_during_a_pass_the_store_wide_views_stay_and_the_scope_holds_the_run(store, monkeypatch, layout):
    """In a rules pass laid out by its policy (its cache built for the block and read on one thread
    or by two cursors, or kept in the store), every rule reads `this_run.device_busy` as the run's
    rows of `device_busy`, whose definition stays the store-wide one on every cursor."""
    from traceanalyzer.resources import Resources
    from traceanalyzer.rules import engine

    run_ids = [store.ingest(FIXTURES / f).run_id for f in ("nsys/planted.sqlite", "kineto/planted.json")]
    policy = {"one thread": RunPolicy(), "two threads": RunPolicy(parallel_min_gpu_ops=0), "kept": KEEP_ALL}[layout]
    store.use(Resources(2 if layout == "two threads" else 1))
    definition = "SELECT sql FROM duckdb_views() WHERE temporary AND view_name = 'device_busy'"
    store_wide = store.sql(definition).fetchall()
    busy = {r: store.sql("SELECT * FROM device_busy WHERE run_id = $1 ORDER BY ALL", [r]).fetchall() for r in run_ids}
    seen = []
    real = engine.evaluate_rule

    def evaluate(st, rule, run_id, params):  # a spy: what each rule's cursor sees
        seen.append((threading.current_thread().name.startswith("rules"), st.run_cache.kept,
                     st.sql(definition).fetchall() == store_wide,
                     st.sql("SELECT * FROM this_run.device_busy ORDER BY ALL").fetchall() == busy[run_id]))
        return real(st, rule, run_id, params)

    monkeypatch.setattr(engine, "evaluate_rule", evaluate)
    run_rules(store, settings=Settings(policy=policy))
    assert seen and {s[1:] for s in seen} == {(layout == "kept", True, True)}
    assert any(s[0] for s in seen) == (layout == "two threads")


def test_one_scope_at_a_time(store):
    """A second scope on the same database, from any cursor, is an error, and leaves the first open."""
    from traceanalyzer.store import run_cache

    run_id = store.ingest(FIXTURES / "nsys/planted.sqlite").run_id
    with run_cache.scoped_to_run(store.con, run_id):
        cursor = store.cursor()
        for con in (store.con, cursor.con):
            with pytest.raises(RuntimeError, match="open on this database already"), \
                    run_cache.scoped_to_run(con, run_id, build=False):
                pass
        assert cursor.sql("SELECT count(*) FROM this_run.device_busy").fetchone()[0] > 0
        cursor.close()


def test_a_store_cannot_be_named_as_the_scope(tmp_path):
    with pytest.raises(StoreError, match="cannot be named this_run"):
        Store(tmp_path / "This_Run.duckdb")


@pytest.mark.parametrize("slices", [2, 40])
def test_tables_built_in_slices_match_the_store_wide_views(store, traces_dir, slices):
    """stream_ops and kernel_launches are built one slice of start time at a time
    (`RunPolicy.slice_gpu_ops`), each slice of stream_ops going on from the last operation per stream
    before it. Whatever the slices, the rows are those of the one query over the whole run:
    streams idle for whole slices, operations sharing a start, operations ending after later
    ones of their stream (the latest end so far is carried), kernels without a start (they
    belong to the last slice of kernel_launches; gpu_activity leaves them out)."""
    from traceanalyzer.store import run_cache

    real = traces_dir / "nsys" / "nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite"  # 2 GPUs, 4.3 k operations
    paths = [FIXTURES / "nsys/planted.sqlite", FIXTURES / "kineto/planted.json", *([real] if real.exists() else [])]
    for path in paths:
        store.ingest(path)
    store.sql("UPDATE kernels SET start_ns = NULL WHERE kernel_id % 97 = 5")
    store.sql("UPDATE kernels SET end_ns = end_ns + 2000000 WHERE kernel_id % 89 = 3")  # ends past the next ones'
    sliced = run_cache._RUN_CACHE_SLICED
    whole = {n: store.sql(f"SELECT * FROM {n} ORDER BY ALL").fetchall() for n in sliced}
    for run_id in store.run_ids():
        ops = run_cache.gpu_ops(store.con, run_id)
        policy = RunPolicy(slice_gpu_ops=-(-ops // slices))
        assert len(run_cache._slices(store.con, run_id, policy.plan(ops).slices)) >= slices // 2
        with run_cache.scoped_to_run(store.con, run_id, policy=policy):
            for n in sliced:
                rows = store.sql(f"SELECT * FROM this_run.{n} ORDER BY ALL").fetchall()
                assert rows and rows == [r for r in whole[n] if r[0] == run_id], (n, run_id)
    assert not store.sql("SELECT 1 FROM duckdb_tables() WHERE table_name = $1", [sliced["stream_ops"]]).fetchall()


def _stored_results(store):
    return (store.sql("SELECT * FROM findings ORDER BY ALL").fetchall(),
            store.sql("SELECT * EXCLUDE (evaluated_at, inputs) FROM rule_runs ORDER BY ALL").fetchall())


def _kept(store):
    from traceanalyzer.store import run_cache

    tables = {t for (t,) in store.sql("SELECT table_name FROM duckdb_tables() WHERE table_name LIKE '\\_ta\\_kept\\_%' "
                                      "ESCAPE '\\'").fetchall()}
    registry = dict(store.sql(f"SELECT run_id, version FROM {run_cache.KEPT_REGISTRY}").fetchall()) \
        if run_cache.KEPT_REGISTRY in tables else {}
    return registry, tables - {run_cache.KEPT_REGISTRY}


def _record_builds(monkeypatch) -> list[tuple[str, bool]]:
    """(run id, kept) of every per-run cache built from here on."""
    from traceanalyzer.store import run_cache

    built: list[tuple[str, bool]] = []
    real_build = run_cache._build
    monkeypatch.setattr(run_cache, "_build", lambda con, run_id, prefix, *a: built.append(
        (run_id, prefix == run_cache.kept_prefix(run_id))) or real_build(con, run_id, prefix, *a))
    return built


def test_big_runs_keep_their_cache_in_the_store(tmp_path, monkeypatch):
    """A run at or above `RunPolicy.keep_min_gpu_ops` keeps its per-run cache in the store file; later rule
    passes (this process or another, read-only too) use it instead of building one, and find
    exactly what a pass on a cache built for the block finds."""
    from traceanalyzer.store import run_cache

    built = _record_builds(monkeypatch)
    files = ("nsys/planted.sqlite", "kineto/planted.json", "nsys/graph_memory.sqlite")
    with Store(tmp_path / "block.duckdb") as st:  # the threshold out of reach: nothing kept
        for f in files:
            st.ingest(FIXTURES / f)
        run_rules(st)
        assert _kept(st) == ({}, set()) and [kept for _, kept in built] == [False] * 3
        reference = _stored_results(st)

    path = tmp_path / "kept.duckdb"
    with Store(path) as st:
        for f in files:
            st.ingest(FIXTURES / f)
        built.clear()
        run_rules(st, settings=Settings(policy=KEEP_ALL))
        registry, tables = _kept(st)
        assert sorted(built) == sorted((r, True) for r in st.run_ids())
        assert registry == {r: run_cache.CACHE_VERSION for r in st.run_ids()}
        assert {t for t in tables if "_result_" not in t} == {
            f"_ta_kept_{r}_{n}" for r in st.run_ids()
            for n in ("scope", *[n for n in run_cache.RUN_CACHED if n not in run_cache._RUN_CACHE_VIEWS])}
        # results kept beside the cache (run_cache.kept_rows): the launch sites where a kernel rule asked
        assert {t.split("_result_")[1].rsplit("_", 1)[0] for t in tables if "_result_" in t} <= {"launch_sites", "time_budget"}
        assert _stored_results(st) == reference
        built.clear()
        run_rules(st, settings=Settings(reuse=False, policy=KEEP_ALL))  # warm, computed again: nothing built
        assert built == [] and _stored_results(st) == reference
    with Store(path, read_only=True) as ro:
        for run_id in ro.run_ids():
            with run_cache.scoped_to_run(ro.con, run_id, keep=ro.keeps_caches) as cache:
                assert cache.kept and built == []
                assert ro.sql("SELECT count(*) FROM this_run.stream_ops WHERE run_id <> $1", [run_id]).fetchone()[0] == 0
    assert not Store(":memory:").keeps_caches and not ro.keeps_caches


def test_a_run_policy_decides_by_the_run_size_alone():
    """Each layout decision of a rules pass is the policy's, from the run's GPU operations, at
    the edges its fields name; another policy is another object, not another module constant."""
    p = RunPolicy()
    assert [p.plan(n).parallel for n in (19_999, 20_000, 1_000_000, 1_000_001)] == [False, True, True, False]
    assert [p.plan(n).memory for n in (99_999, 100_000, 1_000_000, 1_000_001)] == [None, "512MB", "512MB", "1GB"]
    assert [p.plan(n).keep for n in (99_999, 100_000)] == [False, True]
    assert [p.plan(n).slices for n in (0, 1, 1_000_000, 1_000_001, 6_300_000)] == [1, 1, 1, 2, 7]
    tiny = RunPolicy(keep_min_gpu_ops=1, slice_gpu_ops=10, parallel_min_gpu_ops=0, parallel_max_gpu_ops=5,
                     big_run_memory="2GB")
    assert tiny.plan(25) == RunPlan(gpu_ops=25, keep=True, slices=3, parallel=False, memory="2GB")
    assert p.plan(25) == RunPlan(gpu_ops=25, keep=False, slices=1, parallel=False, memory=None)


def test_the_pass_that_builds_a_kept_cache_drops_cached_blocks_before_each_rule(tmp_path, monkeypatch):
    """On the pass that has just built a run's kept cache, rules run one at a time with DuckDB's
    buffer pool cut down before each (`RunPolicy.drop_blocks_when_built`); later passes do not. The
    memory limit is what it was afterwards, and the findings are those of a pass that drops nothing."""

    drops = []
    real_drop = Store.drop_cached_blocks
    monkeypatch.setattr(Store, "drop_cached_blocks", lambda st, *a: drops.append(1) or real_drop(st, *a))
    monkeypatch.setenv("TRACEANALYZER_MEMORY_LIMIT", "3GB")
    results = []
    for drop in (False, True):
        # kept, and one rule at a time as on a big run
        settings = Settings(policy=RunPolicy(keep_min_gpu_ops=1, parallel_max_gpu_ops=0, drop_blocks_when_built=drop))
        with Store(tmp_path / f"d{drop}.duckdb") as st:
            st.ingest(FIXTURES / "nsys/planted.sqlite")
            drops.clear()
            run_rules(st, settings=settings)
            first = len(drops)
            assert st.sql("SELECT current_setting('memory_limit')").fetchone()[0] == "2.7 GiB"
            drops.clear()
            run_rules(st, settings=settings)  # warm: reads the kept cache, drops nothing
            assert drops == [] and first == (len(Settings().rules()) if drop else 0)
            results.append(_stored_results(st))
    assert results[0] == results[1]
    monkeypatch.delenv("TRACEANALYZER_MEMORY_LIMIT")
    with Store(tmp_path / "d.duckdb") as st:  # unset: DuckDB's default again after a drop
        default = st.sql("SELECT current_setting('memory_limit')").fetchone()[0]
        st.drop_cached_blocks()
        assert st.sql("SELECT current_setting('memory_limit')").fetchone()[0] == default


def test_summary_and_diff_read_a_kept_cache_and_build_none(tmp_path, monkeypatch):
    """summary.busy and diff's busy time read a run's current kept cache (here made to disagree
    with the run's rows, to see which is read), build nothing, and leave the views store-wide."""
    from traceanalyzer import diff, summary
    from traceanalyzer.store import run_cache

    built = _record_builds(monkeypatch)
    with Store(tmp_path / "s.duckdb") as st:
        run_id = st.ingest(FIXTURES / "nsys/planted.sqlite").run_id
        whole = st.sql("SELECT * FROM device_busy ORDER BY ALL").fetchall()
        assert list(summary.busy(st, run_id)["busy_ns"]) == [r[2] for r in whole]  # nothing kept: store-wide
        run_rules(st, [run_id], Settings(select=["T001"], policy=KEEP_ALL))
        assert built == [(run_id, True)]
        st.sql(f"UPDATE {run_cache.kept_prefix(run_id)}device_busy SET busy_ns = 7")
        assert set(summary.busy(st, run_id)["busy_ns"]) == {7}
        assert set(diff._side(st, run_id, "name", None)["busy"]["busy_ns"]) == {7}
        assert st.sql("SELECT * FROM device_busy ORDER BY ALL").fetchall() == whole  # store-wide again
        assert built == [(run_id, True)]


def test_a_kept_cache_goes_with_its_rows_and_its_version(tmp_path, monkeypatch):
    """Replacing or deleting a run drops its kept cache in the same transaction; a cache kept
    by another version of the cache's definition, or from an earlier ingest of the run, is not
    read, and is rebuilt where the store is writable."""
    from traceanalyzer.store import run_cache

    keep = Settings(policy=KEEP_ALL)
    path = tmp_path / "kept.duckdb"
    with Store(path) as st:
        first = st.ingest(FIXTURES / "nsys/planted.sqlite").run_id
        other = st.ingest(FIXTURES / "kineto/planted.json").run_id
        run_rules(st, settings=keep)
        reference = _stored_results(st)
        assert set(_kept(st)[0]) == {first, other}
        st.ingest(FIXTURES / "nsys/planted.sqlite")  # same content: the run is replaced
        registry, tables = _kept(st)
        assert set(registry) == {other} and not any(first in t for t in tables)
        run_rules(st, settings=keep)
        st.delete_run(other)
        registry, tables = _kept(st)
        assert set(registry) == {first} and not any(other in t for t in tables)
        st.ingest(FIXTURES / "kineto/planted.json")
        run_rules(st, settings=keep)
        assert _stored_results(st) == reference
        st.sql(f"UPDATE {run_cache.KEPT_REGISTRY} SET version = 'older' WHERE run_id = $1", [first])
        # `other` replaced by a traceanalyzer that knew nothing of kept caches: its rows are new
        st.sql("UPDATE runs SET ingested_at = ingested_at + INTERVAL 1 SECOND WHERE run_id = $1", [other])

    built = _record_builds(monkeypatch)
    with Store(path, read_only=True) as ro:  # cannot rebuild them: caches for the block
        run_ids = ro.run_ids()
        for run_id in run_ids:
            with run_cache.scoped_to_run(ro.con, run_id, keep=ro.keeps_caches, policy=KEEP_ALL) as cache:
                assert not cache.kept
        assert sorted(built) == sorted([(first, False), (other, False)])
    built.clear()
    with Store(path) as st:
        run_rules(st, settings=Settings(reuse=False, policy=KEEP_ALL))
        assert sorted(built) == sorted([(first, True), (other, True)])
        assert _kept(st)[0] == {r: run_cache.CACHE_VERSION for r in run_ids}
        assert _stored_results(st) == reference
        # a registry of an earlier layout (no ingested_at) is void, and replaced when a cache is built
        st.sql(f"DROP TABLE {run_cache.KEPT_REGISTRY}")
        st.sql(f"CREATE TABLE {run_cache.KEPT_REGISTRY} AS SELECT run_id, $1 AS version, now() AS built_at FROM runs",
               [run_cache.CACHE_VERSION])
        with run_cache.scoped_to_run(st.con, first, policy=KEEP_ALL) as cache:
            assert not cache.kept
        built.clear()
        run_rules(st, settings=Settings(reuse=False, policy=KEEP_ALL))
        assert sorted(built) == sorted([(first, True), (other, True)])
        assert _kept(st)[0] == {r: run_cache.CACHE_VERSION for r in run_ids}
        assert _stored_results(st) == reference


def test_rules_on_two_threads_find_what_one_thread_finds(store, monkeypatch):
    """A run's rules are spread over two cursors reading one shared cache (engine.rule_threads);
    the findings and outcomes are those of a one-thread pass, and no scope is left behind."""
    from traceanalyzer.resources import Resources
    from traceanalyzer.rules import engine

    for f in ("nsys/planted.sqlite", "kineto/planted.json", "nsys/graph_memory.sqlite"):
        store.ingest(FIXTURES / f)
    store.use(Resources(2))  # two rule threads whatever this machine has
    any_size = Settings(policy=RunPolicy(parallel_min_gpu_ops=0))  # and on runs this small

    threads = set()
    real = engine.evaluate_rule
    monkeypatch.setattr(engine, "evaluate_rule", lambda st, *a: threads.add(threading.current_thread().name)
                        or real(st, *a))
    two = run_rules(store, settings=any_size)
    assert any(t.startswith("rules") for t in threads)  # on the cursors' threads
    on_two = _stored_results(store)
    store.use(Resources(1))
    one = run_rules(store, settings=any_size)
    assert _stored_results(store) == on_two and [(o.rule_id, o.status, o.findings) for o in one] == \
        [(o.rule_id, o.status, o.findings) for o in two]
    assert sum(o.findings for o in one) > 0
    assert not store.sql("SELECT 1 FROM duckdb_databases() WHERE database_name = 'this_run'").fetchall()


# -- stores survive upgrades -----------------------------------------------------------------

# Made by the release before schema versions were recorded (schema 1): `traceanalyzer scan`
# of fixtures nsys/planted.sqlite, kineto/planted.json and ncu/details_stalls.csv, gzipped.
SCHEMA1_STORE = FIXTURES / "stores" / "schema1.duckdb.gz"


def _schema1_store(tmp_path) -> Path:
    import gzip

    path = tmp_path / "old.duckdb"
    path.write_bytes(gzip.decompress(SCHEMA1_STORE.read_bytes()))
    return path


def _counts(path: Path) -> tuple:
    with duckdb.connect(str(path), read_only=True) as con:
        return tuple(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                     for t in ("runs", "kernels", "findings", "rule_runs"))


def test_a_store_of_the_previous_release_upgrades_and_keeps_its_runs(tmp_path, capfd):
    from traceanalyzer.store import migrations
    from traceanalyzer.rules.engine import fingerprint

    path = _schema1_store(tmp_path)
    before = _counts(path)
    assert before[0] == 3 and before[2] > 10
    with duckdb.connect(str(path), read_only=True) as con:
        assert migrations.version(con) == 1
        old_prints = {r[0] for r in con.execute("SELECT fingerprint FROM findings").fetchall()}
    with Store(path) as st:
        err = capfd.readouterr().err
        assert "store upgraded (" in err and "schema 2: " in err
        assert migrations.version(st.con) == migrations.SCHEMA_VERSION
        rows = st.sql("""SELECT f.rule_id, r.rank, f.device_id, f.stream_id, f.item_kind, f.item_name, f.fingerprint
                         FROM findings f JOIN runs r USING (run_id)""").fetchall()
        # The migration's SQL computes what the rules engine computes for new findings.
        assert all(fingerprint(*r[:6]) == r[6] for r in rows) and not {r[6] for r in rows} & old_prints
        st.ingest(FIXTURES / "nsys" / "clean.sqlite")  # and the upgraded store takes new runs
        run_rules(st, st.run_ids(), Settings(select=["T001"]))
    after = _counts(path)
    assert after[0] == 4 and after[2] >= before[2]
    with Store(path) as st:  # up to date: opened again without a step
        assert "upgraded" not in capfd.readouterr().err


def test_a_store_of_schema_4_has_the_diagnosis_evidence_under_its_own_keys(tmp_path):
    """Schema 4 stored the diagnosis's warm-up and per-step figures as `warmup_ns` and `steps`,
    over a rule's own keys of those names; the upgrade moves them to `loss_warmup_ns` and
    `loss_steps`, and every finding's evidence decodes with its rule's type again."""
    import json

    from traceanalyzer.batch.check import check_file
    from traceanalyzer.rules import evidence_of
    from traceanalyzer.store import migrations

    path = tmp_path / "s.duckdb"
    with Store(path) as st:
        for f in ("kineto/timeline_warmup.json", "kineto/planted.json"):
            check_file(st, FIXTURES / f, Settings())
        now = dict(st.sql("SELECT rowid, evidence FROM findings").fetchall())
        old = {}
        for rowid, evidence in now.items():  # as schema 4 wrote them
            e = json.loads(evidence)
            if "loss_warmup_ns" in e:
                e["warmup_ns"] = e.pop("loss_warmup_ns")
            if "loss_steps" in e:
                e["steps"] = e.pop("loss_steps")
            old[rowid] = json.dumps(e)
        changed = [r for r in now if old[r] != now[r]]
        assert any("loss_warmup_ns" in now[r] for r in changed) and any("loss_steps" in now[r] for r in changed)
        for rowid in changed:
            st.sql("UPDATE findings SET evidence = $e WHERE rowid = $r", {"e": old[rowid], "r": rowid})
        st.sql("UPDATE store_info SET value = '4' WHERE key = 'schema_version'")
    with Store(path) as st:
        assert migrations.version(st.con) == migrations.SCHEMA_VERSION
        rows = st.sql("SELECT rowid, rule_id, evidence FROM findings").fetchall()
    for rowid, rule_id, evidence in rows:
        evidence_of(rule_id, evidence)  # decodes, or warns (an error in the tests)
        got, want = json.loads(evidence), json.loads(now[rowid])
        if rule_id in ("T001", "T003", "T004"):  # the rule's own warm-up figure was lost in schema 4
            got.pop("warmup_ns", None), want.pop("warmup_ns", None)
        assert got == want, rule_id


def test_reading_a_store_of_the_previous_release_upgrades_it_first(tmp_path):
    from traceanalyzer.store import migrations

    path = _schema1_store(tmp_path)
    with Store(path, read_only=True) as st:
        assert st.sql("SELECT count(*) FROM runs").fetchone()[0] == 3
        assert migrations.version(st.con) == migrations.SCHEMA_VERSION


def test_a_store_of_a_newer_release_is_refused_untouched(tmp_path):
    path = tmp_path / "new.duckdb"
    with Store(path) as st:
        st.sql("UPDATE store_info SET value = '99' WHERE key = 'schema_version'")
    size = path.stat().st_size
    for read_only in (False, True):
        with pytest.raises(StoreError, match="schema version 99, made by a newer traceanalyzer"):
            Store(path, read_only=read_only)
    assert path.stat().st_size == size


def test_a_column_the_store_lacks_is_added_and_its_runs_kept(tmp_path, capfd):
    path = tmp_path / "s.duckdb"
    with Store(path) as st:
        st.ingest(FIXTURES / "nsys" / "planted.sqlite")
        st.sql("ALTER TABLE kernels DROP COLUMN short_name")  # as a store made before that column
    with Store(path) as st:
        assert "added column kernels.short_name" in capfd.readouterr().err
        assert st.sql("SELECT count(*), count(short_name) FROM kernels").fetchone() == (9, 0)
        st.ingest(FIXTURES / "nsys" / "clean.sqlite")
        assert st.sql("SELECT count(*) FROM runs").fetchone()[0] == 2


def test_a_store_that_cannot_take_a_table_says_so_not_that_the_transaction_aborted(tmp_path):
    with Store(tmp_path / "s.duckdb") as st:
        st.sql("ALTER TABLE kernels DROP COLUMN short_name")
        for f in (FIXTURES / "nsys" / "planted.sqlite", FIXTURES / "kineto" / "planted.json"):
            with pytest.raises(StoreError, match=r"could not store table kernels: .*short_name") as e:
                st.ingest(f)
            assert "aborted" not in str(e.value)
        assert st.sql("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_migrations_are_numbered_up_to_the_schema_version():
    from traceanalyzer.store import migrations

    versions = [m.version for m in migrations.MIGRATIONS]
    assert versions == sorted(set(versions)) and versions[0] == 2
    assert versions[-1] == migrations.SCHEMA_VERSION == schema.SCHEMA_VERSION
