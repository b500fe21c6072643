"""Batch scan (parallel parse + rules in workers, one writer, resumable) and the Parquet export.

Expected kernel counts and spans come from the source files themselves (sqlite3, json,
csv); expected findings from the plain, central `ingest` + `diagnose_runs` path.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from typer.testing import CliRunner

import traceanalyzer.batch.check as check_mod
import traceanalyzer.batch.scan as scan_mod
import traceanalyzer.batch.worker as worker_mod
from traceanalyzer import resources, schema
from traceanalyzer.cli import app
from traceanalyzer.ingest import find_traces, nsys_sqlite
from traceanalyzer.diagnosis import diagnose_runs
from traceanalyzer.rules.engine import Settings
from traceanalyzer.batch.scan import WORKER_DIED, JobPlan, local_outcomes, scan
from traceanalyzer.batch.worker import WorkContext
from traceanalyzer.resources import Resources
from traceanalyzer.store import Store

from .conftest import copy_fixtures

runner = CliRunner()
# A fixed set (the fixtures folder grows): every format, gz, and clean and planted traces.
SOURCES = ["nsys/planted.sqlite", "nsys/clean.sqlite", "kineto/planted.json", "kineto/clean.json.gz",
           "ncu/details_stalls.csv"]
# Where rules are not the point, two cheap ones keep the tests quick (all rules cost ~0.5 s a run).
FAST = Settings(select=["T001", "T002"])
FAST_OPTS = ("--select", "T001,T002")
# Columns that say when something was written, not what (`inputs` digests when the run was stored).
WHEN = {"runs": "ingested_at", "rule_runs": "evaluated_at, inputs"}


def run(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"}, catch_exceptions=False)


@pytest.fixture
def traces(tmp_path) -> Path:
    folder = copy_fixtures(tmp_path / "in", SOURCES)
    return folder


# -- independent readings of the source files --------------------------------------------

def _kineto_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def expected_kernels(path: Path) -> int:
    if path.suffix == ".sqlite":
        with sqlite3.connect(path) as con:
            return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    if path.suffix == ".csv":
        lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("==")]
        return len({row["ID"] for row in csv.DictReader(lines)})
    return sum(1 for e in _kineto_events(path) if e.get("cat") == "kernel")


def nsys_span_ns(path: Path) -> int:
    """First to last event over the CUPTI tables and NVTX ranges/marks (not domain creation)."""
    with sqlite3.connect(path) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        parts = [f"SELECT start, coalesce(\"end\", start) AS stop FROM {t}" for t in sorted(tables)
                 if t.startswith("CUPTI_ACTIVITY_KIND_")]
        if "NVTX_EVENTS" in tables:
            parts.append("SELECT start, coalesce(\"end\", start) FROM NVTX_EVENTS WHERE eventType IN (34, 59, 60)")
        lo, hi = con.execute(f"SELECT min(start), max(stop) FROM ({' UNION ALL '.join(parts)})").fetchone()
    return hi - lo


def table_rows(db: Path, table: str) -> list[tuple]:
    """A table's rows in a canonical order, without its write-time column."""
    with duckdb.connect(str(db), read_only=True) as con:
        exclude = f" EXCLUDE ({WHEN[table]})" if table in WHEN else ""
        return con.execute(f"SELECT *{exclude} FROM {table} ORDER BY ALL").fetchall()


# -- the command ---------------------------------------------------------------------------

def test_scan_stores_every_trace_and_a_bad_file_is_one_error_line(traces, tmp_path):
    bad = traces / "broken.json"
    bad.write_text('{"traceEvents": [{"ph": "X", ')  # a truncated trace
    db = tmp_path / "s.duckdb"
    r = run("scan", "--store", db, "--jobs", "2", *FAST_OPTS, traces)
    assert r.exit_code == 2, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {bad}: ")
    assert "Traceback" not in r.stderr
    assert "5 stored, 0 updated, 0 skipped (already stored), 0 duplicate, 1 failed" in r.stdout

    with Store(db, read_only=True) as st:
        rows = st.sql("""SELECT r.source_path, r.run_id, r.span_ns,
                                (SELECT count(*) FROM kernels k WHERE k.run_id = r.run_id)
                         FROM runs r""").fetchall()
    assert sorted(Path(p).relative_to(traces).as_posix() for p, *_ in rows) == sorted(SOURCES)
    for path, run_id, span_ns, kernels in rows:
        assert kernels == expected_kernels(Path(path)), path
        if path.endswith(".sqlite"):
            assert span_ns == nsys_span_ns(Path(path)), path
        # the per-run table: run id, kernel count and span on one line
        line = next(ln for ln in r.stdout.splitlines() if run_id in ln)
        assert f" {kernels} " in line


def test_scan_findings_equal_the_central_engine(traces, tmp_path):
    """Per-run rules evaluated in the workers' scratch stores give the same rows as the engine
    run on the store itself."""
    with Store(tmp_path / "scan.duckdb") as st:
        report = scan(st, [traces], jobs=2)
    assert report.count("stored") == len(SOURCES) and not report.failed
    with Store(tmp_path / "central.duckdb") as st:
        ids = [st.ingest(f).run_id for f in find_traces([traces])]
        diagnose_runs(st, ids, Settings())
    for table in ("findings", "rule_runs"):
        scanned, central = table_rows(tmp_path / "scan.duckdb", table), table_rows(tmp_path / "central.duckdb", table)
        assert scanned == central, table
    assert len(table_rows(tmp_path / "scan.duckdb", "findings")) > 0  # planted traces do have findings


def test_rescan_skips_stored_content_and_redoes_runs_checked_with_other_thresholds(traces, tmp_path, monkeypatch):
    parsed = []
    import traceanalyzer.ingest as ingest_mod

    real_read = ingest_mod.read_file
    monkeypatch.setattr(ingest_mod, "read_file", lambda p, **kw: parsed.append(p.name) or real_read(p, **kw))
    with Store(tmp_path / "s.duckdb") as st:
        first = scan(st, [traces], jobs=1, settings=FAST)
        assert len(parsed) == len(SOURCES) and first.count("stored") == len(SOURCES)
        parsed.clear()
        again = scan(st, [traces], jobs=1, settings=FAST)
        assert parsed == [] and again.count("skipped") == len(SOURCES)
        assert sorted(again.run_ids) == sorted(first.run_ids)
        other = Settings(select=FAST.select, thresholds={"T001": {"min_gap_ns": 1_000}})
        redo = scan(st, [traces], jobs=1, settings=other)
        assert len(parsed) == len(SOURCES) and redo.count("updated") == len(SOURCES)
        params = st.sql("SELECT DISTINCT params::VARCHAR FROM rule_runs WHERE rule_id = 'T001'").fetchall()
    assert len(params) == 1 and json.loads(params[0][0])["min_gap_ns"] == 1_000


def test_interrupted_scan_resumes_with_only_the_files_left(traces, tmp_path, monkeypatch):
    all_files = {str(p.resolve()) for p in find_traces([traces])}
    handled = []

    def interrupt_after_two(result):
        handled.append(result.path)
        if len(handled) == 2:
            raise KeyboardInterrupt  # as Ctrl-C in the middle of a scan

    db = tmp_path / "s.duckdb"
    with Store(db) as st, pytest.raises(KeyboardInterrupt):
        scan(st, [traces], jobs=2, settings=FAST, on_file=interrupt_after_two)
    with duckdb.connect(str(db), read_only=True) as con:
        kept = {r[0] for r in con.execute("SELECT source_path FROM runs").fetchall()}
        checked = con.execute("SELECT count(DISTINCT run_id) FROM rule_runs").fetchone()[0]
    assert kept == set(handled) and checked == 2  # both finished runs were stored with their findings

    parsed = []
    import traceanalyzer.ingest as ingest_mod

    real_read = ingest_mod.read_file
    monkeypatch.setattr(ingest_mod, "read_file", lambda p, **kw: parsed.append(str(p)) or real_read(p, **kw))
    with Store(db) as st:
        rest = scan(st, [traces], jobs=1, settings=FAST)
    assert sorted(parsed) == sorted(all_files - kept)
    assert rest.count("skipped") == 2 and rest.count("stored") == len(SOURCES) - 2

    with Store(tmp_path / "whole.duckdb") as st:  # same result as one uninterrupted scan
        scan(st, [traces], jobs=1, settings=FAST)
    for table in ("runs", "kernels", "findings", "rule_runs"):
        assert table_rows(db, table) == table_rows(tmp_path / "whole.duckdb", table), table


def _crash_on_clean_sqlite(path: str):
    """A worker task that dies like a segfaulting reader would, on one file."""
    if path.endswith("clean.sqlite"):
        os._exit(3)
    return scan_mod._pool_task(path)


def test_a_file_that_kills_its_worker_is_reported_and_the_rest_are_stored(traces):
    files = [str(p.resolve()) for p in find_traces([traces])]
    ctx = WorkContext(frozenset(), None)
    outcomes = list(local_outcomes(files, 2, ctx, task=_crash_on_clean_sqlite))
    assert sorted(o.result.path for o in outcomes) == sorted(files)
    errors = {Path(o.result.path).name: o.result.error for o in outcomes if o.result.error}
    assert errors == {"clean.sqlite": WORKER_DIED}
    assert all(o.trace is not None for o in outcomes if not o.result.error)


def test_same_content_under_two_names_is_stored_once(traces, tmp_path):
    shutil.copyfile(traces / "kineto" / "planted.json", traces / "kineto" / "planted_copy.json")
    with Store(tmp_path / "s.duckdb") as st:
        report = scan(st, [traces], jobs=1, settings=FAST)
        n_runs = st.sql("SELECT count(*) FROM runs").fetchall()[0][0]
    assert report.count("duplicate") == 1 and n_runs == len(SOURCES)
    dup = next(f for f in report.files if f.state == "duplicate")
    assert "same content as" in dup.warnings[0]


def test_big_streamed_files_are_read_by_the_writer_with_the_same_result(traces, tmp_path, monkeypatch):
    """nsys exports of WRITER_READS_MIN_BYTES or more are read by the writer itself (streamed,
    `Store.ingest`), not by a worker: the same rows and findings; skipped when scanned again; a
    copy under another name is a duplicate; a truncated one is one error line, and the rest goes on."""
    with Store(tmp_path / "workers.duckdb") as st:  # every file through the workers
        scan(st, [traces], jobs=2, settings=FAST)

    nsys = traces / "nsys"
    shutil.copyfile(nsys / "planted.sqlite", nsys / "planted_copy.sqlite")
    data = (nsys / "clean.sqlite").read_bytes()
    (nsys / "truncated.sqlite").write_bytes(data[:len(data) // 2])
    monkeypatch.setattr(scan_mod, "WRITER_READS_MIN_BYTES", 1)
    by_workers = []  # the files read by a worker (jobs=1: in this process)
    real_process = scan_mod.process_file

    def worker(path, ctx):
        out = real_process(path, ctx)
        if out.result.state == "stored":
            by_workers.append(Path(path).name)
        return out

    monkeypatch.setattr(scan_mod, "process_file", worker)
    db = tmp_path / "writer.duckdb"
    with Store(db) as st:
        report = scan(st, [traces], jobs=1, settings=FAST)
        states = {Path(f.path).name: f.state for f in report.files}
        assert sorted(by_workers) == sorted(Path(f).name for f in SOURCES if not f.endswith(".sqlite"))
        assert states["planted.sqlite"] == "stored" and states["planted_copy.sqlite"] == "duplicate"
        assert states["truncated.sqlite"] == "failed" and report.count("stored") == len(SOURCES)
        bad = next(f for f in report.files if f.state == "failed")
        assert "truncated SQLite file" in bad.error and not bad.internal
        by_workers.clear()
        again = scan(st, [traces], jobs=1, settings=FAST)
        assert by_workers == [] and again.count("skipped") == len(SOURCES) + 1  # the copy too: same content
    for table in ("runs", "kernels", "copies", "api_calls", "findings", "rule_runs"):
        assert table_rows(db, table) == table_rows(tmp_path / "workers.duckdb", table), table


def test_a_big_streamed_file_in_a_worker_goes_through_a_store_file_with_the_same_result(traces, tmp_path, monkeypatch):
    """A worker given an nsys export of `stream_min_bytes` or more (a dask worker: local scans
    leave those to the writer) streams it into a store file of its own and runs the rules
    there: the writer then stores exactly what a file held whole gives, and the file is gone."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    through = []
    real = worker_mod._worker_store
    monkeypatch.setattr(worker_mod, "_worker_store", lambda ctx, big: through.append(big) or real(ctx, big))
    files = [str(p.resolve()) for p in find_traces([traces])]
    for name, min_bytes in (("whole", None), ("streamed", 1)):
        through.clear()
        ctx = WorkContext(frozenset(), Settings(), stream_min_bytes=min_bytes)
        with Store(tmp_path / f"{name}.duckdb") as st:
            for f in files:
                o = worker_mod.process_file(f, ctx)
                assert o.result.error is None, o.result.error
                assert scan_mod._store_outcome(st, o, {}).state == "stored"
        if min_bytes is None:
            assert not any(through)
    # only the formats whose reader streams
    assert sorted(Path(f).name for f, big in zip(files, through) if big) == ["clean.sqlite", "planted.sqlite"]
    assert list(scratch.iterdir()) == []
    for t in schema.TABLES:
        assert table_rows(tmp_path / "streamed.duckdb", t.name) == table_rows(tmp_path / "whole.duckdb", t.name), t.name
    assert len(table_rows(tmp_path / "streamed.duckdb", "findings")) > 0


def test_jobs_are_cores_in_all(monkeypatch):
    """`--jobs N` spends N cores: one-thread workers for many files, fewer workers with more
    threads each for fewer files, and no pool at all for one worker."""
    monkeypatch.setattr(resources, "usable_cpus", lambda: 4)

    def plan(jobs, files):
        p = JobPlan.for_scan(jobs, files)
        return p.workers, p.per_worker.duckdb_threads, p.per_worker.read_cpus

    assert plan(1, 200) == (1, 1, 1)  # serial: one process, one thread, one read CPU
    assert plan(2, 200) == (2, 1, 1)
    assert plan(None, 200) == (4, 1, 1)
    assert plan(None, 1) == (1, 4, 4)  # one file: this process, every core (a split read, fetch threads)
    assert plan(4, 2) == (2, 2, 2)
    assert plan(4, 3) == (3, 1, 1)
    assert plan(None, 0) == (1, 4, 4)  # only the writer's files


def test_serial_scan_uses_one_thread_in_this_process_and_a_single_file_every_core(traces, tmp_path, monkeypatch):
    seen = []  # (process, DuckDB threads) of every rules pass
    real_diagnose_runs = check_mod.diagnose_runs

    def recording(store, *a, **k):
        seen.append((os.getpid(), store.sql("SELECT current_setting('threads')").fetchall()[0][0]))
        return real_diagnose_runs(store, *a, **k)

    monkeypatch.setattr(check_mod, "diagnose_runs", recording)
    monkeypatch.setattr(scan_mod, "WRITER_READS_MIN_BYTES", 1)  # the nsys files: the writer's own
    fetch_threads = []  # of every nsys file read (1: no fetch or stream thread)
    real_init = nsys_sqlite.NsysFile.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        fetch_threads.append(self.threads)

    monkeypatch.setattr(nsys_sqlite.NsysFile, "__init__", init)
    with Store(tmp_path / "s.duckdb") as st:
        st.use(Resources(3))
        report = scan(st, [traces], jobs=1, settings=FAST)
        assert report.count("stored") == len(SOURCES) and not report.failed
        # workers' scratch stores and the writer's store alike; the store's own setting is back after
        assert seen == [(os.getpid(), 1)] * len(SOURCES)
        assert fetch_threads and set(fetch_threads) == {1}
        assert st.sql("SELECT current_setting('threads')").fetchall()[0][0] == 3
        assert st.resources == Resources(3)

    seen.clear()
    monkeypatch.setattr(resources, "usable_cpus", lambda: 2)
    with Store(tmp_path / "one.duckdb") as st:
        scan(st, [traces / "kineto" / "planted.json"], settings=FAST)
    assert seen == [(os.getpid(), 2)]


def test_a_worker_replaces_its_scratch_store_before_dead_rows_pile_up(traces, monkeypatch):
    """An in-memory DuckDB table keeps its deleted rows: a worker's scratch store is replaced
    once it has held SCRATCH_MAX_ROWS rows, and which store checked a file changes nothing."""
    from traceanalyzer.batch.worker import process_file

    path = str(traces / "nsys" / "planted.sqlite")
    ctx = WorkContext(frozenset(), FAST, resources=Resources(1))
    monkeypatch.setattr(worker_mod._local, "store", None, raising=False)
    first = process_file(path, ctx)
    rows = sum(t.num_rows for t in first.trace.tables.values())
    monkeypatch.setattr(worker_mod, "SCRATCH_MAX_ROWS", 2 * rows)
    monkeypatch.setattr(worker_mod._local, "store", None, raising=False)
    stores, outs = [], []
    for _ in range(4):
        outs.append(process_file(path, ctx))
        stores.append(worker_mod._local.store)
    assert stores[0] is not None and stores[1] is None and stores[2] is not None and stores[3] is None
    assert stores[0] is not stores[2] and stores[0].con is not stores[2].con
    want = (first.findings.findings.to_pylist(), first.findings.rule_runs.drop_columns(["evaluated_at", "inputs"]).to_pylist())
    for o in outs:
        assert o.result.error is None
        assert (o.findings.findings.to_pylist(), o.findings.rule_runs.drop_columns(["evaluated_at", "inputs"]).to_pylist()) == want


def test_glob_and_missing_path(traces, tmp_path):
    db = tmp_path / "s.duckdb"
    r = run("scan", "--store", db, "--jobs", "1", *FAST_OPTS, f"{traces}/*/*.sqlite", tmp_path / "nope.sqlite")
    assert r.exit_code == 2
    assert f"error: {tmp_path / 'nope.sqlite'}: no such file" in r.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        names = sorted(r[0] for r in con.execute("SELECT file_name FROM runs").fetchall())
    assert names == ["clean.sqlite", "planted.sqlite"]
    r = run("scan", "--store", db, tmp_path / "empty_dir_that_does_not_exist" / "*.json")
    assert r.exit_code == 2 and "no trace files" in r.stderr


# -- Parquet export ------------------------------------------------------------------------

def test_export_is_a_hive_partitioned_dataset_engines_read_as_it_is(traces, tmp_path):
    db, out = tmp_path / "s.duckdb", tmp_path / "dataset"
    assert run("scan", "--store", db, "--jobs", "1", *FAST_OPTS, "--fail-on", "never", traces).exit_code == 0
    r = run("export", "--store", db, "--parquet", out)
    assert r.exit_code == 0, r.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        run_ids = sorted(r[0] for r in con.execute("SELECT run_id FROM runs").fetchall())
        stored = {t.name: con.execute(f"SELECT count(*) FROM {t.name}").fetchone()[0] for t in schema.TABLES}
        kernels_by_file = dict(con.execute("SELECT source_path, run_id FROM runs").fetchall())

    part = ds.partitioning(pa.schema([("run_id", pa.string())]), flavor="hive")
    for t in schema.TABLES:
        folder = out / t.name
        assert folder.is_dir(), t.name
        if stored[t.name] == 0:
            assert not any(folder.iterdir())
            continue
        table = ds.dataset(folder, format="parquet", partitioning=part).to_table()
        assert table.num_rows == stored[t.name], t.name
        assert sorted(table.column_names) == sorted(t.column_names), t.name
    assert sorted(p.name for p in (out / "runs").iterdir()) == [f"run_id={i}" for i in run_ids]

    # kernels per run, read back by DuckDB as a plain Parquet dataset, match the source files
    with duckdb.connect() as con:
        counts = dict(con.execute(f"""
            SELECT run_id, count(*) FROM read_parquet('{out}/kernels/*/*.parquet', hive_partitioning = true,
                                                       hive_types = {{'run_id': VARCHAR}})
            GROUP BY run_id""").fetchall())
        runs = con.execute(f"SELECT typeof(ingested_at), typeof(metadata) FROM read_parquet('{out}/runs/*/*.parquet') LIMIT 1").fetchone()
    for path, run_id in kernels_by_file.items():
        assert counts.get(run_id, 0) == expected_kernels(Path(path))
    assert runs == ("TIMESTAMP WITH TIME ZONE", "VARCHAR")  # portable types, not DuckDB's JSON
    manifest = json.loads((out / "_traceanalyzer.json").read_text())
    assert {k: v["rows"] for k, v in manifest["tables"].items()} == stored

    # re-exporting one run replaces the dataset; a folder that is not an export is refused
    assert run("export", "--store", db, "--parquet", out, "--run", run_ids[0]).exit_code == 0
    assert [p.name for p in (out / "runs").iterdir()] == [f"run_id={run_ids[0]}"]
    r = run("export", "--store", db, "--parquet", traces)
    assert r.exit_code == 2 and "not an earlier traceanalyzer export" in r.stderr


def test_a_store_begun_with_sha256_keeps_it_and_still_recognizes_its_runs(traces, tmp_path, monkeypatch):
    """Runs are keyed by XXH3-128 now; a store that holds SHA-256 runs (written before the
    change) keeps hashing with SHA-256, so a rescan skips them instead of storing copies."""
    from traceanalyzer.ingest import read_file
    from traceanalyzer.store import file_hash

    with Store(tmp_path / "new.duckdb") as st:
        assert st.hash_name() == "xxh3_128"
        res = st.ingest(traces / "nsys/clean.sqlite")
        assert st.sql("SELECT content_hash FROM runs").fetchone()[0] == file_hash(traces / "nsys/clean.sqlite")
        assert len(file_hash(traces / "nsys/clean.sqlite")) == 32 and res.run_id == file_hash(traces / "nsys/clean.sqlite")[:16]
    with Store(tmp_path / "old.duckdb") as st:
        first = traces / "nsys/clean.sqlite"
        legacy = st.write_run(read_file(first), first.resolve(), file_hash(first, "sha256"), first.stat().st_size)
        diagnose_runs(st, [legacy.run_id], FAST)
        assert st.hash_name() == "sha256"
        assert check_mod.check_file(st, first, None).state == "kept"
        parsed = []
        import traceanalyzer.ingest as ingest_mod

        real_read = ingest_mod.read_file
        monkeypatch.setattr(ingest_mod, "read_file", lambda p, **kw: parsed.append(p.name) or real_read(p, **kw))
        report = scan(st, [traces], jobs=1, settings=FAST)
        assert report.count("skipped") == 1 and "clean.sqlite" not in parsed
        hashes = [h for (h,) in st.sql("SELECT content_hash FROM runs").fetchall()]
    assert len(hashes) == len(SOURCES) and {len(h) for h in hashes} == {64}
