"""Ctrl-C during `traceanalyzer scan`: a real scan process (and its workers: SIGINT goes to
the process group, as a terminal sends it) is interrupted at several points, DuckDB calls
included. It must exit 130 soon, with no traceback and no file reported as failed, leaving
only whole runs in the store; the same scan run again finishes the rest."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from traceanalyzer import interrupt
from traceanalyzer.resources import connect_duckdb
from traceanalyzer.rules import all_rules
from traceanalyzer.store import Store

from .conftest import ROOT
from .test_concurrency import _distinct_kineto

N_FILES = 10
# Far longer than any file of the scan takes: an interrupt that does not end it shows.
LONG_QUERY = "SELECT sum(a.range * b.range) FROM range(10000000) a, range(100000) b"

# Makes one DuckDB call of the scan long, and says when it starts ("IN-DUCKDB" on stdout):
# that is where SIGINT lands. Installed as the `sitecustomize` of the scan's processes, so the
# workers too run it; STALL_AT says where:
#   early: reading the store's current findings, before any file (scan.up_to_date_hashes)
#   worker: a worker checking the 4th file (t03_...), on its store
#   write: the writer's transaction of the 3rd run, before its row is written (store.writer.insert)
#   rules: a rule's query on the 3rd run (--jobs 1: the rules run in the scan's process)
STALL = r"""
import os
point = os.environ.get("STALL_AT")
if point:
    from pathlib import Path
    from traceanalyzer import store as S
    from traceanalyzer.store import writer as SW
    from traceanalyzer.batch import scan as B
    from traceanalyzer.batch import worker as W
    from traceanalyzer.rules import engine as E

    def stall(con):
        print("IN-DUCKDB", flush=True)
        con.execute(os.environ["STALL_QUERY"]).fetchall()

    if point == "early":
        real_hashes = B.up_to_date_hashes
        def hashes(store, settings):
            stall(store.con)
            return real_hashes(store, settings)
        B.up_to_date_hashes = hashes
    elif point == "worker":
        real_check = W.check_file
        def check(store, path, *args, **kwargs):
            if Path(path).name.startswith("t03"):
                stall(store.con)
            return real_check(store, path, *args, **kwargs)
        W.check_file = check
    elif point == "write":
        real_insert, runs = SW.insert, [0]
        def insert(con, name, tbl):
            if name == "runs":
                runs[0] += 1
                if runs[0] == 3:
                    stall(con)
            real_insert(con, name, tbl)
        SW.insert = insert
    elif point == "rules":
        real_rule, seen = E.evaluate_rule, set()
        def rule(st, r, run_id, params):
            seen.add(run_id)
            if len(seen) == 3 and r.id == "T001":
                stall(st.con)
            return real_rule(st, r, run_id, params)
        E.evaluate_rule = rule
"""


def _env(**extra) -> dict:
    return {**os.environ, "COLUMNS": "200", **extra}


def _whole_runs(db) -> tuple[int, int]:
    """(runs in the store, runs of them with an outcome of every per-run rule)."""
    per_run = [r.id for r in all_rules() if r.scope == "run"]
    with Store(db, read_only=True) as s:
        rows = s.sql("""SELECT r.run_id, (SELECT count(DISTINCT rule_id) FROM rule_runs o
                        WHERE o.run_id = r.run_id AND list_contains(?, o.rule_id)) FROM runs r""",
                     [per_run]).fetchall()
    return len(rows), sum(1 for _, n in rows if n == len(per_run))


def _as_from_a_terminal() -> None:
    """SIGINT handled and not blocked in the scan, as an interactive shell starts a command: a
    child inherits an ignored or blocked signal, and a suite started in the background by a
    script (`pytest &`: SIGINT ignored, as POSIX has it without job control) would leave the
    scan deaf to the SIGINT sent."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _interrupt(cmd: list[str], env: dict, wait_for: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run `cmd` in a process group of its own, send the group SIGINT once its output has a
    line starting with `wait_for`; the process and the seconds from SIGINT to its exit."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=_as_from_a_terminal)
    stream = p.stderr if wait_for.startswith("scan:") else p.stdout
    try:
        seen = []
        while True:
            line = stream.readline()
            seen.append(line)
            if not line or line.startswith(wait_for):
                break
        assert line, ("the scan ended before the point to interrupt it", seen, p.communicate(timeout=60))
        sent = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    other = "".join(seen)
    return subprocess.CompletedProcess(cmd, p.returncode, out + (other if stream is p.stdout else ""),
                                       err + (other if stream is p.stderr else "")), took


@pytest.mark.parametrize("point, jobs", [("early", "2"), ("reading", "2"), ("worker", "2"), ("write", "2"),
                                         ("rules", "1")])
def test_ctrl_c_ends_a_scan_at_once_and_keeps_only_whole_runs(tmp_path, point, jobs):
    _distinct_kineto(tmp_path / "traces", N_FILES)
    folder, db = str(tmp_path / "traces"), str(tmp_path / "s.duckdb")
    cmd = [sys.executable, "-m", "traceanalyzer.cli", "scan", folder, "--store", db, "--jobs", jobs,
           "--fail-on", "never"]
    if point == "reading":  # no stall: workers busy reading and checking files
        env, wait_for = _env(), "scan: "  # the first progress line (a tenth of the files done)
    else:
        hooks = tmp_path / "hooks"
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(STALL)
        path = os.pathsep.join([str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])])
        env, wait_for = _env(STALL_AT=point, STALL_QUERY=LONG_QUERY, PYTHONPATH=path), "IN-DUCKDB"
    r, took = _interrupt(cmd, env, wait_for)
    print(f"\n{point}: exit {r.returncode} {took:.2f} s after SIGINT")
    assert r.returncode == 130, (r.stdout, r.stderr)
    assert "interrupted: the runs stored so far are kept" in r.stderr
    for bad in ("Traceback", "Query interrupted", "error:", "KeyboardInterrupt", "rollback"):
        assert bad not in r.stderr and bad not in r.stdout, (bad, r.stderr)
    # The stalled query alone runs for minutes: the scan stopped in it, and did no more files
    # (the aim is 2 s; the bound leaves room for a loaded machine).
    assert took < 10, took
    stored, whole = _whole_runs(db)
    assert stored == whole < N_FILES, (stored, whole)
    if point in ("write", "rules"):
        assert stored == 2  # the runs before the one interrupted
    # The same scan again stores every file the first left, and skips only the whole ones.
    again = subprocess.run([sys.executable, "-m", "traceanalyzer.cli", "scan", folder, "--store", db,
                            "--jobs", "2", "--fail-on", "never"], cwd=ROOT, env=_env(), capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    counts = re.search(r"(\d+) files in [\d.]+ s: (\d+) stored, (\d+) updated, (\d+) skipped \(already stored\), "
                       r"(\d+) duplicate, (\d+) failed", again.stdout)
    assert counts, again.stdout
    assert [int(n) for n in counts.groups()] == [N_FILES, N_FILES - stored, 0, stored, 0, 0]
    assert _whole_runs(db) == (N_FILES, N_FILES)


def test_sigint_stops_a_duckdb_query_and_is_taken_for_no_ordinary_error():
    """DuckDB alone may not look at SIGINT for the whole of a long task, and turns it into a
    RuntimeError when it does: while watching, the query is interrupted at once, and the
    error an except block catches is turned back into the interrupt."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's here")
    con = connect_duckdb()
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    taken = []
    with pytest.raises(KeyboardInterrupt):
        with interrupt.watching():
            timer.start()
            try:  # about 1e10 rows: far longer than the timer
                con.execute("SELECT sum(a.range * b.range) FROM range(1000000) a, range(10000) b").fetchall()
            except Exception as e:  # as a scan's handler of a file's error
                interrupt.stop_if_interrupted(e)
                taken.append(e)
    timer.join()
    assert not taken
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not interrupt.interrupted()
    assert con.execute("SELECT 42").fetchall() == [(42,)]  # the connection still works
