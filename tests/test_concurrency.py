"""Several processes writing one store, and processes killed mid-write.

DuckDB lets one process write a file at a time. These tests run real processes (the CLI,
or `python -c` children) against one store and then check, with a fresh connection,
that every run is either absent or complete (the same row counts as a clean,
single-process ingest of the same file) and that the runs stored before are untouched.
"""

from __future__ import annotations

import json
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
        notes = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("note:")]
        lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("note:")]
        assert len(lines) == 1 and "store is locked by another traceanalyzer process" in lines[0]
        assert len(notes) == 1 and "waiting for the store (another process is writing it)" in notes[0]
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
from traceanalyzer.store import writer as W
db, first, second, mode, delay = sys.argv[1:6]
st = S.Store(db)
if first != "-":
    st.ingest(first)
if mode == "in-transaction":      # after the run's kernels are inserted, before COMMIT
    real = W.insert
    def slow(con, name, tbl):
        real(con, name, tbl)
        if name == "kernels":
            print("IN-TXN", flush=True)
            time.sleep(120)
    W.insert = slow
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


# -- reading while a scan writes ------------------------------------------------------------

# A `traceanalyzer scan --jobs 1` whose writer lingers in each run's transaction (after the
# run's rows, before its findings and COMMIT), and at the third run waits there until a
# reader is waiting for the store (its `.waiting` file), then 1.5 s more: that reader waits
# at least that long, so its note is due, and it can only get in after the commit.
SLOW_SCAN_CHILD = r"""
import os, sys, time
from traceanalyzer import store as S
from traceanalyzer.store import writer as W
from traceanalyzer.cli import main
db = sys.argv[1]
real, n = W.replace_findings, [0]
def slow(con, run_id, results, run_is_new=False):
    if run_is_new:  # the scan's writer (a scratch store's rules write findings without it)
        n[0] += 1
        time.sleep(0.3)
        if n[0] == 3:
            print("IN-TXN", flush=True)
            for _ in range(1200):
                if os.path.exists(db + S.WAITING_SUFFIX):
                    break
                time.sleep(0.05)
            time.sleep(1.5)
    real(con, run_id, results, run_is_new=run_is_new)
W.replace_findings = slow
sys.argv = ["traceanalyzer", "scan", *sys.argv[2:], "--store", db, "--jobs", "1", "--fail-on", "never"]
main()
"""

# A reader that opens the store (waiting for it), prints what it sees, and holds it until the
# scan's writer waits for it (the writer says so in the `.waiting` file too), then 1.5 s more.
HOLDING_READER = r"""
import json, os, sys, time
from traceanalyzer import store as S
from traceanalyzer.store import writer as W
db, sql = sys.argv[1:3]
with S.Store(db, read_only=True) as st:
    print(json.dumps(st.sql(sql).fetchall()), flush=True)
    for _ in range(1200):
        if os.path.exists(db + S.WAITING_SUFFIX):
            break
        time.sleep(0.05)
    time.sleep(1.5)
"""

KINETO_SOURCES = [FIXTURES / "kineto" / n for n in ("planted.json", "legacy_2021.json", "timeline_rank0.json",
                                                    "structure_clean.json")]


def _distinct_kineto(folder: Path, n: int) -> list[Path]:
    """`n` Kineto traces with distinct bytes (an extra top-level key), so none is a duplicate."""
    folder.mkdir()
    out = []
    for i in range(n):
        src = KINETO_SOURCES[i % len(KINETO_SOURCES)]
        doc = json.loads(src.read_text())
        doc["traceanalyzerTestCopy"] = i
        dst = folder / f"t{i:02d}_{src.name}"
        dst.write_text(json.dumps(doc))
        out.append(dst)
    return out


def _per_run_sql() -> str:
    """Per run: its kernels, and its per-run rules' outcomes and findings (cross-run rules
    only write theirs when the scan ends)."""
    from traceanalyzer.rules import all_rules

    ids = ", ".join(f"'{r.id}'" for r in all_rules() if r.scope == "run")
    return f"""
        SELECT r.run_id,
               (SELECT count(*) FROM kernels k WHERE k.run_id = r.run_id) AS kernels,
               (SELECT count(*) FROM rule_runs o WHERE o.run_id = r.run_id AND o.rule_id IN ({ids})) AS outcomes,
               (SELECT count(*) FROM findings f WHERE f.run_id = r.run_id AND f.rule_id IN ({ids})) AS findings
        FROM runs r ORDER BY r.run_id"""


def _reader_env() -> dict:
    env = _env()
    env.pop("TRACEANALYZER_LOCK_TIMEOUT_S", None)  # a reader's own default: no limit
    return env


def test_readers_get_in_while_a_scan_writes_and_never_see_half_a_run(tmp_path):
    files = _distinct_kineto(tmp_path / "traces", 10)
    db = tmp_path / "s.duckdb"
    sql = _per_run_sql()
    # The writer's lock timeout is short: its waits for readers must not be bound by it.
    scan = subprocess.Popen([sys.executable, "-c", SLOW_SCAN_CHILD, str(db), str(tmp_path / "traces")],
                            cwd=ROOT, env=_env(TRACEANALYZER_LOCK_TIMEOUT_S=0.5), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: list[list] = []  # what each reader saw: [run_id, kernels, outcomes, findings] rows
    try:
        assert scan.stdout.readline().strip() == "IN-TXN"
        # The first reader comes while run 3 is in its transaction: it waits, gets in between
        # run 3 and run 4, and holds the store while the writer wants it back.
        r = subprocess.run([sys.executable, "-c", HOLDING_READER, str(db), sql], cwd=ROOT, env=_reader_env(),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "waiting for the store (another process is writing it)" in r.stderr
        first = json.loads(r.stdout)
        assert 3 <= len(first) < len(files)  # 3 unless it took the reader over HANDOVER_S to get in
        seen.append(first)
        # Then readers in turn, the real commands, until the scan ends (a bounded number).
        # (`report` of a run the scan checked opens the store read-only.)
        commands = [["query", sql, "--json"], ["runs"], ["summary"], ["report", first[0][0], "--markdown"]]
        reads = 0
        for i in range(8):
            if scan.poll() is not None:
                break
            reads += 1
            cmd = commands[i % len(commands)]
            r = subprocess.run([sys.executable, "-m", "traceanalyzer.cli", *cmd, "--store", str(db)], cwd=ROOT,
                               env=_reader_env(), capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, (cmd, r.stderr)
            assert "locked" not in r.stderr and "Traceback" not in r.stderr, (cmd, r.stderr)
            if cmd[0] == "query":
                seen.append([list(row.values()) for row in json.loads(r.stdout)])
        out, err = scan.communicate(timeout=300)
    finally:
        if scan.poll() is None:
            scan.kill()
            scan.wait()
    assert scan.returncode == 0 and "Traceback" not in err and "locked" not in err, err
    assert "waiting for the store (another process is reading it)" in err  # the writer waited, and went on
    assert not db.with_name(db.name + ".waiting").exists()
    print(f"\nreaders during the scan: the first, then {reads} commands")
    with Store(db, read_only=True) as s:
        final = {row[0]: list(row) for row in s.sql(sql).fetchall()}
    assert len(final) == len(files)
    assert all(row[1] > 0 and row[2] > 0 for row in final.values())
    for rows in seen:  # every run a reader saw was whole: as it is once the scan is done
        for row in rows:
            assert list(row) == final[row[0]], (row, final[row[0]])


def test_a_writer_waits_for_readers_beyond_its_lock_timeout(tmp_path):
    db = tmp_path / "s.duckdb"
    Store(db).close()
    holder = subprocess.Popen([sys.executable, "-c", HOLDING_READER, str(db), "SELECT count(*) FROM runs"],
                              cwd=ROOT, env=_reader_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "[[0]]"
        # The reader holds the store until this writer waits for it, then 1.5 s more.
        with Store(db, lock_timeout_s=0.2) as s:
            assert s.run_ids() == []
        assert holder.wait(timeout=60) == 0
        assert not db.with_name(db.name + ".waiting").exists()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_released_store_opens_again_as_it_was(tmp_path, monkeypatch):
    import traceanalyzer.store as S

    db = tmp_path / "s.duckdb"
    with Store(db) as s:
        run_id = s.ingest(SMALL[7]).run_id
        s.set("threads", 1)
        s.release()
        s.release()  # twice: nothing more to do
        assert s.sql("SELECT current_setting('threads')").fetchall() == [(1,)]
        assert s.sql("SELECT count(*) FROM kernel_launches WHERE run_id = ?", [run_id]).fetchall()[0][0] > 0
        assert not s.let_in_waiting()  # nobody waits: the store stays open
        con = s.con
        monkeypatch.setattr(S, "HANDOVER_S", 0.1)
        waiting = db.with_name(db.name + S.WAITING_SUFFIX)
        waiting.touch()  # one that waited and was killed: let go once, and the sign is cleared
        assert s.let_in_waiting() and not waiting.exists()
        assert s.con is not con and s.run_ids() == [run_id]




# A child of the store-creation race, on a fresh store path each round. The conductor
# ("lead") starts a round once every opener is ready for it. Even rounds: the writers create
# the store at once (DuckDB makes the file, then takes its lock and writes the headers).
# Odd rounds: the lead creates it slowly: it leaves the file empty for a while, then puts a
# whole store in its place, as a creator descheduled mid-way would. Writers and readers open
# it meanwhile (readers once the file is there). An opener pauses a little after a failed
# open, as a loaded machine may pause it, so that the file often changes between the failed
# open and the look at the file that follows it.
OPEN_RACE_CHILD = r"""
import os, random, sys, time
from pathlib import Path
import traceanalyzer.store as S
folder, me, rounds, openers = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
real_connect = S.connect_duckdb
def connect(*args, **kwargs):
    try:
        return real_connect(*args, **kwargs)
    except Exception:
        time.sleep(random.uniform(0, 0.01))
        raise
S.connect_duckdb = connect
def wait_for(path):
    while not path.exists():
        time.sleep(0.0002)
if me == "lead":
    made = folder / "made.duckdb"
    S.Store(made).close()
failures = 0
for r in range(rounds):
    path, go = folder / f"s{r}.duckdb", folder / f"go{r}"
    try:
        if me == "lead":
            for o in openers:
                wait_for(folder / f"ready{r}.{o}")
            if r % 2:
                path.write_bytes(b"")
                time.sleep(random.uniform(0.002, 0.02))
                tmp = folder / "made.tmp"
                tmp.write_bytes(made.read_bytes())
                os.replace(tmp, path)
            else:
                go.touch()
            continue
        (folder / f"ready{r}.{me}").touch()
        reader = me.startswith("read")
        wait_for(path if reader or r % 2 else go)
        S.Store(path, read_only=reader).close()
    except Exception as e:
        failures += 1
        print(f"round {r}: {type(e).__name__}: {e}", flush=True)
print(f"FAILURES {failures}", flush=True)
"""


def test_many_processes_opening_a_store_being_created_all_get_in(tmp_path):
    """Writers and readers in several processes open a store while it is being created
    (`OPEN_RACE_CHILD`): every open gets in, and every store is whole after."""
    # (two creators meet for certain in test_a_store_created_by_two_processes_at_once_keeps_the_first_ones_file;
    # these rounds are opens and creations at once under load)
    rounds = 12
    openers = ["write1", "write2", "write3", "read1", "read2"]
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_RACE_CHILD, str(tmp_path), me, str(rounds), ",".join(openers)],
                              cwd=ROOT, env=_reader_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for me in ["lead", *openers]]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        results.append((p.returncode, out, err))
    failed = [line for _, out, _ in results for line in out.splitlines() if line.startswith("round ")]
    assert not failed, failed
    for code, out, err in results:
        assert code == 0 and out.rstrip().endswith("FAILURES 0"), (out, err)
    for r in range(rounds):
        with Store(tmp_path / f"s{r}.duckdb", read_only=True) as s:
            assert s.run_ids() == []


def test_a_store_created_by_two_processes_at_once_keeps_the_first_ones_file(tmp_path, monkeypatch):
    """A store appears at its path whole (`Store._create_whole`): a creator that finds another
    process got there first opens that one's store, and leaves no private file behind."""
    import traceanalyzer.store as S

    path = tmp_path / "s.duckdb"
    real_link = os.link

    def other_process_first(src, dst):
        # The other creator's store, with a run in it, lands between our schema and our link.
        monkeypatch.setattr(S.os, "link", real_link)
        with Store(path) as other:
            other.ingest(FIXTURES / "kineto" / "timeline_warmup.json")
        real_link(src, dst)

    monkeypatch.setattr(S.os, "link", other_process_first)
    with Store(path) as s:
        assert len(s.run_ids()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]
