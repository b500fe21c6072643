"""`scan --scheduler`: the per-file work on a dask cluster (here two worker processes on
loopback) gives the same store as a local scan."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceanalyzer import schema
from traceanalyzer.cli import app
from traceanalyzer.rules.engine import Settings
from traceanalyzer.batch.scan import scan
from traceanalyzer.batch.worker import ScanError
from traceanalyzer.store import Store

from .conftest import copy_fixtures
from .test_scan import expected_kernels, table_rows

try:
    import distributed
except ImportError:  # an optional dependency, but the test extra installs it: CI must run this
    if os.environ.get("CI"):
        raise
    pytest.skip("dask[distributed] not installed (pip install 'traceanalyzer[dask]')", allow_module_level=True)

SOURCES = ["nsys/planted.sqlite", "kineto/planted.json", "kineto/clean.json.gz", "ncu/details_stalls.csv"]
FAST = Settings(select=["T001", "T002", "B001"])
runner = CliRunner()


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(processes=True, n_workers=2, host="127.0.0.1", threads_per_worker=1,
                                  dashboard_address=None) as c:
        yield c


@pytest.fixture
def traces(tmp_path) -> Path:
    folder = copy_fixtures(tmp_path / "in", SOURCES)
    (folder / "broken.csv").write_text('"ID","Process ID","Process Name","Kernel Name"\n')  # no rows
    return folder


def test_cluster_scan_gives_the_same_store_as_a_local_scan(cluster, traces, tmp_path):
    with Store(tmp_path / "dask.duckdb") as st:
        on_dask = scan(st, [traces], settings=FAST, scheduler=cluster.scheduler_address)
    with Store(tmp_path / "local.duckdb") as st:
        local = scan(st, [traces], jobs=2, settings=FAST)

    def states(report):
        return sorted((Path(f.path).name, f.state, f.run_id, f.error) for f in report.files)

    assert states(on_dask) == states(local)
    assert [f.state for f in on_dask.files].count("stored") == len(SOURCES)
    assert [Path(f.path).name for f in on_dask.failed] == ["broken.csv"]
    for t in schema.TABLES:
        assert table_rows(tmp_path / "dask.duckdb", t.name) == table_rows(tmp_path / "local.duckdb", t.name), t.name
    # and the rows are the traces' own, not just equal to each other
    with Store(tmp_path / "dask.duckdb", read_only=True) as st:
        counts = st.sql("SELECT r.source_path, (SELECT count(*) FROM kernels k WHERE k.run_id = r.run_id) "
                        "FROM runs r").fetchall()
        checked = st.sql("SELECT count(DISTINCT run_id), count(DISTINCT rule_id) FROM rule_runs").fetchall()[0]
    for path, n in counts:
        assert n == expected_kernels(Path(path)), path
    assert checked == (len(SOURCES), len(FAST.select))


def test_big_nsys_exports_are_streamed_by_the_workers_with_the_same_store(cluster, traces, tmp_path, monkeypatch):
    """Big streamed files (here every nsys export: the bar set to 1 byte) are streamed into a
    store file by the dask worker (`worker._worker_store`), as the writer streams them in a
    local scan: the two stores are the same."""
    import traceanalyzer.batch.scan as scan_mod

    monkeypatch.setattr(scan_mod, "WRITER_READS_MIN_BYTES", 1)
    with Store(tmp_path / "dask.duckdb") as st:
        on_dask = scan(st, [traces], settings=FAST, scheduler=cluster.scheduler_address)
    with Store(tmp_path / "local.duckdb") as st:
        scan(st, [traces], jobs=2, settings=FAST)
    assert [f.state for f in on_dask.files].count("stored") == len(SOURCES)
    for t in schema.TABLES:
        assert table_rows(tmp_path / "dask.duckdb", t.name) == table_rows(tmp_path / "local.duckdb", t.name), t.name


def test_cli_scan_on_a_cluster_and_rescan_skips(cluster, traces, tmp_path):
    db = tmp_path / "s.duckdb"
    args = ["scan", "--store", db, "--scheduler", cluster.scheduler_address, "--select", "T001", traces]
    r = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"}, catch_exceptions=False)
    assert r.exit_code == 2  # the broken file
    assert f"error: {traces / 'broken.csv'}: " in r.stderr
    assert f"{len(SOURCES)} stored" in r.stdout
    r = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"}, catch_exceptions=False)
    assert f"0 stored, 0 updated, {len(SOURCES)} skipped" in r.stdout


def test_an_unreachable_scheduler_is_a_clear_error(traces, tmp_path, monkeypatch):
    import traceanalyzer.batch.distributed as dist

    monkeypatch.setattr(dist, "CONNECT_TIMEOUT_S", 2)
    with Store(tmp_path / "s.duckdb") as st, pytest.raises(ScanError, match="cannot reach the dask scheduler"):
        scan(st, [traces], settings=FAST, scheduler="tcp://127.0.0.1:9")
