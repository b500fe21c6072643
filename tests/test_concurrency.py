"""Several processes writing one store, and processes killed mid-write.

DuckDB lets one process write a file at a time. These tests run real processes (the CLI,
or `python -c` children) against one store and then check, with a fresh connection,
that every run is either absent or complete (the same row counts as a clean,
single-process ingest of the same file) and that the runs stored before are untouched.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from traceanalyzer import schema
from traceanalyzer.store import Store, StoreError, file_hash, run_id_for

from .conftest import FIXTURES, ROOT, shared_traces

SMALL = [FIXTURES / "nsys" / "planted.sqlite", FIXTURES / "nsys" / "clean.sqlite",
         FIXTURES / "nsys" / "old_2_9_1.sqlite", FIXTURES / "nsys" / "graph_memory.sqlite",
         FIXTURES / "ncu" / "details_full.csv", FIXTURES / "ncu" / "details_stalls.csv",
         FIXTURES / "ncu" / "raw_waves.csv", FIXTURES / "kineto" / "planted.json",
         FIXTURES / "kineto" / "clean.json.gz", FIXTURES / "kineto" / "legacy_2021.json"]
BIG = ("nsys", "Rodinia_Gaussian__report2.sqlite")  # ~30 000 rows: a commit that takes a while


def _env(**extra) -> dict:
    return {**os.environ, "COLUMNS": "200", **{k: str(v) for k, v in extra.items()}}


def counts(store: Store, run_id: str) -> dict[str, int]:
    return {t: store.sql(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
            for t in ("runs", *schema.DATA_TABLES)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Row counts per file from a clean single-process ingest."""
    traces = shared_traces()
    big = traces / BIG[0] / BIG[1]
    with Store(tmp_path_factory.mktemp("ref") / "ref.duckdb") as s:
        out = {}
        for p in [*SMALL, big]:
            out[p] = counts(s, s.ingest(p).run_id)
    return out


def test_concurrent_cli_writers_all_wait_their_turn_and_lose_nothing(tmp_path, reference):
    db = tmp_path / "s.duckdb"
    groups = [SMALL[0:3], SMALL[3:6], SMALL[6:8], SMALL[8:10]]
    procs = [subprocess.Popen([sys.executable, "-m", "traceanalyzer.cli", "ingest", *map(str, g), "--store", str(db)],
                              cwd=ROOT, env=_env(TRACEANALYZER_LOCK_TIMEOUT_S=120),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for g in groups]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    for out, err, rc in results:
        assert rc == 0 and "Traceback" not in err, err
    with Store(db, read_only=True) as s:
        assert len(s.run_ids()) == len(SMALL)
        for p in SMALL:
            assert counts(s, run_id_for(file_hash(p))) == reference[p], p


def test_a_locked_store_fails_with_a_clear_message_and_a_retry_works(tmp_path, reference):
    db = tmp_path / "s.duckdb"
    Store(db).close()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from traceanalyzer.store import Store; s = Store(sys.argv[1]); "
        "print('held', flush=True); time.sleep(60)"), str(db)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "traceanalyzer.cli", "ingest", str(SMALL[0]), "--store", str(db)],
                           cwd=ROOT, env=_env(TRACEANALYZER_LOCK_TIMEOUT_S=1.5), capture_output=True, text=True,
                           timeout=60)
        waited = time.monotonic() - t0
        assert r.returncode == 2 and "Traceback" not in r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "store is locked by another traceanalyzer process" in lines[0]
        assert "waited 1.5 s" in lines[0] and "retry" in lines[0] and "TRACEANALYZER_LOCK_TIMEOUT_S" in lines[0]
        assert waited >= 1.5
        with pytest.raises(StoreError, match="locked"):
            Store(db, lock_timeout_s=0.2)
    finally:
        holder.kill()
        holder.wait()
    r = subprocess.run([sys.executable, "-m", "traceanalyzer.cli", "ingest", str(SMALL[0]), "--store", str(db)],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with Store(db, read_only=True) as s:
        assert counts(s, run_id_for(file_hash(SMALL[0]))) == reference[SMALL[0]]


def test_bad_lock_timeout_setting_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "traceanalyzer.cli", "ingest", str(SMALL[0]), "--store",
                        str(tmp_path / "s.duckdb")], cwd=ROOT, env=_env(TRACEANALYZER_LOCK_TIMEOUT_S="soon"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "TRACEANALYZER_LOCK_TIMEOUT_S='soon' is not a number" in r.stderr
    assert "Traceback" not in r.stderr


# A child that stores A, then starts storing B and is killed: `mode` says where.
KILL_CHILD = r"""
import os, signal, sys, threading, time
from traceanalyzer import store as S
db, first, second, mode, delay = sys.argv[1:6]
st = S.Store(db)
if first != "-":
    st.ingest(first)
if mode == "in-transaction":      # after the run's kernels are inserted, before COMMIT
    real = S._insert
    def slow(con, name, tbl):
        real(con, name, tbl)
        if name == "kernels":
            print("IN-TXN", flush=True)
            time.sleep(120)
    S._insert = slow
elif mode == "in-commit":         # SIGKILL from a timer while DuckDB commits
    class Killer:
        def __init__(self, con):
            self._con = con
        def __getattr__(self, name):
            return getattr(self._con, name)
        def execute(self, query, *args):
            if query == "COMMIT":
                threading.Timer(float(delay), os.kill, (os.getpid(), signal.SIGKILL)).start()
                print("COMMIT", flush=True)
            return self._con.execute(query, *args)
    st.con = Killer(st.con)
st.ingest(second)
print("DONE", flush=True)
time.sleep(120)
"""


def _run_kill_child(db: Path, first, second: Path, mode: str, delay: float = 0.0) -> str:
    p = subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(db), str(first), str(second), mode, str(delay)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        while True:
            line = p.stdout.readline().strip()
            seen.append(line)
            if line in ("IN-TXN", "DONE") or not line:
                break
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL, (seen, p.stderr.read())
    return seen[-1] if seen else ""


def test_sigkill_inside_the_transaction_leaves_no_half_run(tmp_path, reference):
    traces = shared_traces()
    big = traces / BIG[0] / BIG[1]
    db = tmp_path / "s.duckdb"
    assert _run_kill_child(db, SMALL[0], big, "in-transaction") == "IN-TXN"
    with Store(db) as s:  # opens (replaying or dropping the WAL) for writing
        assert s.run_ids() == [run_id_for(file_hash(SMALL[0]))]
        assert counts(s, run_id_for(file_hash(SMALL[0]))) == reference[SMALL[0]]
        assert set(counts(s, run_id_for(file_hash(big))).values()) == {0}
        s.ingest(big)  # and takes new runs afterwards
        assert counts(s, run_id_for(file_hash(big))) == reference[big]


def test_sigkill_during_commit_leaves_the_run_absent_or_complete(tmp_path, reference):
    traces = shared_traces()
    big = traces / BIG[0] / BIG[1]
    db = tmp_path / "s.duckdb"
    small_id, big_id = run_id_for(file_hash(SMALL[0])), run_id_for(file_hash(big))
    outcomes = []
    for i, delay in enumerate((0.0, 0.002, 0.01, 0.03, 0.08)):
        stored_before = bool(outcomes) and outcomes[-1] == "complete"  # then the child replaces it
        _run_kill_child(db, SMALL[0] if i == 0 else "-", big, "in-commit", delay)
        with Store(db) as s:
            assert counts(s, small_id) == reference[SMALL[0]]
            got = counts(s, big_id)
            assert got == reference[big] or (set(got.values()) == {0} and not stored_before), (delay, got)
            outcomes.append("complete" if got["runs"] else "absent")
    print("\nkilled during COMMIT, the run was:", outcomes)


def test_sigkill_of_the_cli_at_random_moments(tmp_path, reference):
    """The real command, unpatched, killed at several points of a three-file batch."""
    traces = shared_traces()
    big = traces / BIG[0] / BIG[1]
    files = [big, SMALL[7], SMALL[4]]
    db = tmp_path / "s.duckdb"
    stored: set[Path] = set()
    for delay in (0.4, 1.0, 1.8, 2.6):
        p = subprocess.Popen([sys.executable, "-m", "traceanalyzer.cli", "ingest", *map(str, files), "--store", str(db)],
                             cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        with Store(db) as s:
            for f in files:  # complete, or absent if it never was stored: a replaced run never vanishes
                got = counts(s, run_id_for(file_hash(f)))
                assert got == reference[f] or (set(got.values()) == {0} and f not in stored), (delay, f, got)
                if got["runs"]:
                    stored.add(f)


def test_killed_store_copy_still_opens(tmp_path, reference):
    """A store and its WAL copied while a writer sits inside a transaction (what a backup
    or a crash of the whole machine sees) opens with the earlier runs."""
    traces = shared_traces()
    big = traces / BIG[0] / BIG[1]
    db = tmp_path / "s.duckdb"
    p = subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(db), str(SMALL[1]), str(big), "in-transaction", "0"],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "IN-TXN"
        copy = tmp_path / "copy"
        copy.mkdir()
        for f in tmp_path.glob("s.duckdb*"):
            shutil.copy(f, copy / f.name)
    finally:
        p.kill()
        p.wait()
    with Store(copy / "s.duckdb") as s:
        assert s.run_ids() == [run_id_for(file_hash(SMALL[1]))]
        assert counts(s, s.run_ids()[0]) == reference[SMALL[1]]
