"""Broken and hostile input: every file ends in a clean one-line error or a complete run.

The fuzz corpus (`fixtures/gen_hostile.py`) is made at test time from the real traces in
../shared/traces; these tests run a fixed-seed sample of it (the whole corpus is
`bench/reliability.py`, whose figures are in docs/reliability.md). The other tests here
check the resource limits, that input files never change, that nothing in a trace is run
or opened, and that every report escapes trace-derived text.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceanalyzer import input_limits as limits
from traceanalyzer.ingest import TraceError, read_file
from traceanalyzer.store import Store

from .conftest import FIXTURES, ROOT, shared_traces

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from fixtures import gen_hostile as G  # noqa: E402

PLANTED = FIXTURES / "nsys" / "planted.sqlite"
# A few small real traces per format keep the sample fast (~25 s on 2 cores).
SAMPLE_SOURCES = {
    "nsys": ["DLProf__nsys_profile.sqlite", "DynamicViT__nsys_profile.sqlite"],
    "ncu": ["nsightful__copy_blocked.csv", "XPlacer__hotspot__lassen__nsight_hotspot_1024.log"],
    "ncu-rep": ["CudaProgramming__profiling__profiles__simpleAOS.ncu-rep"],
    "torch": ["hta__critical_path__cuda_event_sync__event_sync_trace.json.gz", "kineto__docs__before_fix_trace.json"],
    "torch-memory": ["cs336-a2-systems__memory_files__memory_ctx128_forward.pickle",
                     "hta__memory_analysis__memory_timeline.raw.gz"],
}
FAILURES = ("crash", "partial", "unexpected", "bad-message")


def _cli(*args, env=None):
    """The command, in this process (a traceback would surface as an exception here)."""
    from typer.testing import CliRunner

    from traceanalyzer.cli import app
    r = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200", **(env or {})},
                           catch_exceptions=False)
    r.returncode = r.exit_code
    return r


@pytest.fixture(scope="module")
def sample_cases():
    traces = shared_traces()
    # Multi-MB strings are slow to build and read; their limit has its own test below.
    return [c for c in G.corpus(traces, per_class=2, seed=7, sources=SAMPLE_SOURCES) if c.cls != "huge-strings"]


def test_fuzz_sample_every_case_ends_cleanly(sample_cases, tmp_path):
    store = Store(":memory:")
    outcomes, failures = Counter(), []
    for case in sample_cases:
        path = tmp_path / case.name
        path.write_bytes(case.data)
        o = G.judge(store, path, case)
        outcomes[(case.cls, o.result)] += 1
        if o.result in FAILURES:
            failures.append(f"{case.name} ({case.source}: {case.detail}): {o.result}: {o.message}")
        path.unlink()
    store.close()
    print(f"\n{len(sample_cases)} cases:", dict(sorted(outcomes.items())))
    assert not failures, "\n".join(failures)
    classes = {c.cls for c in sample_cases}
    assert len(sample_cases) >= 150 and len(classes) >= 18
    # Both ends happen: the corpus is neither all-refused nor all-accepted.
    assert sum(n for (_, r), n in outcomes.items() if r == "ok") >= 40
    assert sum(n for (_, r), n in outcomes.items() if r == "error") >= 40


def test_corpus_is_reproducible_from_its_seed():
    traces = shared_traces()
    src = {"torch": ["hta__trace_compare__base__base.json.gz"], "ncu": ["nsightful__copy_blocked.csv"]}

    def digest(seed):
        h = hashlib.sha256()
        for c in G.corpus(traces, per_class=2, seed=seed, sources=src):
            h.update(c.name.encode() + c.data)
        return h.hexdigest()
    assert digest(3) == digest(3) != digest(4)


def test_cli_batch_one_error_line_per_bad_file_and_the_rest_stored(sample_cases, tmp_path):
    """Through the real command: bad files each get exactly one `error: PATH: why` line (no
    traceback), and every good file of the same batch is stored."""
    traces = shared_traces()
    batch = tmp_path / "batch"
    batch.mkdir()
    picked = sample_cases[::4]
    for c in picked:
        (batch / c.name).write_bytes(c.data)
    good = [traces / "nsys" / "DLProf__nsys_profile.sqlite", traces / "ncu" / "nsightful__copy_blocked.csv",
            traces / "torch" / "hta__trace_compare__base__base.json.gz"]
    r = subprocess.run([sys.executable, "-m", "traceanalyzer.cli", "ingest", "--verbose", str(batch), *map(str, good),
                        "--store", str(tmp_path / "s.duckdb")], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    failed = int(re.search(r"(\d+) input\(s\) could not be read", r.stderr).group(1))
    assert len(errors) == failed
    refused = Counter(re.match(r"error: (.+?): ", ln).group(1) for ln in errors)
    assert all(n == 1 for n in refused.values()), refused
    assert all(Path(p).parent == batch for p in refused)  # the good files all went in
    # A bad file the folder walk found is an error, or passed over (one "skipped:" line) when
    # it is plainly something else: JSON without traceEvents, text that is no ncu CSV.
    passed_over = [re.match(r"skipped: (.+?): ", ln).group(1) for ln in r.stderr.splitlines()
                   if ln.startswith("skipped: ")]
    assert not set(passed_over) & set(refused) and len(set(passed_over)) == len(passed_over)
    for c in picked:
        if c.expect == "error":
            assert str(batch / c.name) in refused or str(batch / c.name) in passed_over, c.name
        elif c.expect == "ok":
            assert str(batch / c.name) not in passed_over, c.name
    with Store(tmp_path / "s.duckdb", read_only=True) as s:
        stored = {row[0] for row in s.sql("SELECT file_name FROM runs").fetchall()}
    assert {g.name for g in good} <= stored
    assert len(stored) + len(refused) + len(passed_over) >= len(picked)  # identical cases share one run
    for c in picked:
        if c.expect == "ok":
            assert c.name in stored, c.name


# -- resource bombs and limits ------------------------------------------------------------------

def _read_with(path: Path, **env) -> tuple[BaseException | None, float, int]:
    """read_file under env settings: (error or None, seconds, peak traced bytes)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        read_file(path)
        err = None
    except TraceError as e:
        err = e
    finally:
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return err, seconds, peak


def test_gzip_bomb_stops_at_the_ratio_limit_with_bounded_memory(tmp_path):
    bomb = tmp_path / "bomb.json.gz"
    G.gzip_bomb(bomb, inflated_bytes=512 << 20)  # 512 MiB of JSON in ~0.5 MB
    assert bomb.stat().st_size < 1 << 20
    err, seconds, peak = _read_with(bomb)
    assert err is not None and "TRACEANALYZER_MAX_INFLATE_RATIO" in str(err)
    assert peak < 128 << 20  # stopped near the 64 MiB floor, not at 512 MiB
    # With the ratio raised, the byte cap still stops it.
    err, _, peak = _read_with(bomb, TRACEANALYZER_MAX_INFLATE_RATIO=100000, TRACEANALYZER_MAX_INFLATED_BYTES="32M")
    assert "TRACEANALYZER_MAX_INFLATED_BYTES" in str(err) and "over the limit of 32MiB" in str(err)
    assert peak < 96 << 20


def test_gzip_within_limits_is_read_whole(tmp_path):
    src = FIXTURES / "kineto" / "planted.json"
    raw = gzip.compress(src.read_bytes())
    two = tmp_path / "two_members.json.gz"  # multi-member gzip = one stream, as gzip -d says
    half = len(src.read_bytes()) // 2
    two.write_bytes(gzip.compress(src.read_bytes()[:half]) + gzip.compress(src.read_bytes()[half:]))
    one = tmp_path / "one.json.gz"
    one.write_bytes(raw)
    assert read_file(one).tables["kernels"].num_rows == read_file(two).tables["kernels"].num_rows > 0
    with pytest.raises(TraceError, match="trailing garbage"):
        (tmp_path / "junk.json.gz").write_bytes(raw + b"JUNK")
        read_file(tmp_path / "junk.json.gz")


def test_deep_json_is_refused_fast_and_the_depth_limit_can_be_raised(tmp_path):
    deep = tmp_path / "deep.json"
    G.deep_json(deep, 1_000_000)
    err, seconds, _ = _read_with(deep)
    assert "TRACEANALYZER_MAX_JSON_DEPTH" in str(err) and seconds < 5
    medium = tmp_path / "medium.json"
    G.deep_json(medium, 1000)  # over the default 256, fine under 2000
    assert "MAX_JSON_DEPTH" in str(_read_with(medium)[0])
    err, _, _ = _read_with(medium, TRACEANALYZER_MAX_JSON_DEPTH=2000)
    assert err is None or "MAX_JSON_DEPTH" not in str(err)


def test_sqlite_btree_reusing_pages_is_refused_without_reading_its_claimed_rows(tmp_path):
    bomb = tmp_path / "dag.sqlite"
    claimed = G.dag_sqlite(bomb, levels=2)
    con = sqlite3.connect(f"file:{bomb}?mode=ro&immutable=1", uri=True)
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == claimed > 10**10
    con.close()
    err, seconds, _ = _read_with(bomb)
    assert "holds more rows than a file" in str(err) and seconds < 10


def test_sqlite_view_is_not_run(tmp_path):
    bomb = tmp_path / "view.sqlite"
    G.view_sqlite(bomb, rows=10**9)
    t0 = time.perf_counter()
    trace = read_file(bomb)
    assert time.perf_counter() - t0 < 10
    assert trace.tables["kernels"].num_rows == 0
    assert any("no CUDA activity tables" in w or "no kernel table" in w for w in trace.warnings)


def test_an_empty_capture_says_the_profiler_logged_errors():
    """A real WSL capture with no CUDA tables: Nsight Systems logged CUPTI errors while collecting
    (DIAGNOSTIC_EVENT severity 3), so the capture may be empty for the profiler's sake, not the
    program's, and the warning says so."""
    path = shared_traces() / "nsys/benchmarking-n-profiling__report1.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    errors = [t for (t,) in con.execute("SELECT text FROM DIAGNOSTIC_EVENT WHERE severity = 3 ORDER BY timestamp")]
    con.close()
    assert errors and all("CUPTI_ERROR" in t for t in errors)
    [warning] = [w for w in read_file(path).warnings if "no CUDA activity tables" in w]
    assert "collection may have failed" in warning and all(t in warning for t in errors[:2])


def test_string_limit_also_reads_dictionary_encoded_columns(monkeypatch):
    """Readers hand names over dictionary-encoded (nsys); the limit must see those strings too."""
    import pyarrow as pa

    tables = {"kernels": pa.table({"name": pa.array(["k" * 10, "x"]).dictionary_encode()})}
    limits.check_tables(tables, [])
    monkeypatch.setenv("TRACEANALYZER_MAX_STRING_BYTES", "8")
    with pytest.raises(TraceError, match="kernels.name: a string of 10 bytes"):
        limits.check_tables(tables, [])


def test_table_checks_add_up_the_parts_of_a_table(monkeypatch):
    """A table stored in parts (the nsys reader streams big ones) is held to MAX_ROWS as a
    whole, and each of its warnings comes once, with the count over all parts."""
    import pyarrow as pa

    part = pa.table({"start_ns": [5, 1, 2], "end_ns": [1, 2, 1], "grid_x": [1, 1 << 40, 2]})
    checks = limits.TableChecks()
    for _ in range(3):
        assert checks.check("kernels", part)["grid_x"].type == pa.int32()
    checks.check("copies", part.select(["start_ns", "end_ns"]))
    assert checks.warnings() == ["kernels.grid_x: 3 value(s) that int32 cannot hold set to NULL",
                                 "kernels: 6 row(s) end before they start (kept as written)",
                                 "copies: 2 row(s) end before they start (kept as written)"]
    checks.forget("kernels")  # its parts were discarded: counted again from nothing
    assert checks.warnings() == ["copies: 2 row(s) end before they start (kept as written)"]
    monkeypatch.setenv("TRACEANALYZER_MAX_ROWS", "5")
    checks.check("kernels", part)
    with pytest.raises(TraceError, match="TRACEANALYZER_MAX_ROWS.*kernels: 6 rows|kernels: 6 rows"):
        checks.check("kernels", part)


def test_row_string_and_text_limits_name_their_variable(tmp_path):
    traces = shared_traces()
    nsys = traces / "nsys" / "DLProf__nsys_profile.sqlite"
    err, _, _ = _read_with(nsys, TRACEANALYZER_MAX_ROWS=100)
    assert "TRACEANALYZER_MAX_ROWS" in str(err)
    long_csv = tmp_path / "long.csv"
    G.long_line_csv(long_csv, 3 << 20)
    err, _, _ = _read_with(long_csv, TRACEANALYZER_MAX_STRING_BYTES="1M")
    assert "TRACEANALYZER_MAX_STRING_BYTES" in str(err) and "kernels.name" in str(err)
    err, _, _ = _read_with(traces / "torch" / "kineto__docs__before_fix_trace.json", TRACEANALYZER_MAX_TEXT_BYTES="1K")
    assert "TRACEANALYZER_MAX_TEXT_BYTES" in str(err)
    amplified = tmp_path / "amplified.sqlite"  # 100 KB name on 200 kernel rows: 20 MB once joined
    G.amplified_sqlite(amplified, string_bytes=100_000, rows=200)
    err, _, peak = _read_with(amplified, TRACEANALYZER_MAX_TEXT_BYTES="8M")
    assert "TRACEANALYZER_MAX_TEXT_BYTES" in str(err) and "repeated on every row" in str(err)
    assert peak < 8 << 20
    assert read_file(amplified).tables["kernels"].num_rows == 200  # within the default limits
    err, _, _ = _read_with(nsys, TRACEANALYZER_MAX_ROWS="lots")
    assert "TRACEANALYZER_MAX_ROWS='lots' is not a positive whole number" in str(err)


def test_devices_pipes_and_symlink_loops_end_cleanly(tmp_path):
    """/dev/zero would hash for ever and a pipe blocks or reads once: both are refused by
    name; a folder whose symlink points back up is walked once."""
    folder = tmp_path / "traces"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "up").symlink_to("..")
    (folder / "zero.json").symlink_to("/dev/zero")
    os.mkfifo(folder / "fifo.json")
    shutil.copy(FIXTURES / "nsys" / "clean.sqlite", folder / "a" / "clean.sqlite")
    r = subprocess.run([sys.executable, "-m", "traceanalyzer.cli", "ingest", str(folder), str(folder / "zero.json"),
                        str(folder / "fifo.json"), "/dev/zero", "--store", str(tmp_path / "s.duckdb")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("not a regular file") == 3 and "3 input(s) could not be read" in r.stderr
    assert r.stdout.count("clean.sqlite") == 1


def test_error_lines_quote_file_text_inert_and_short(tmp_path):
    """Messages quote the file (an ncu log's ==ERROR== line here): terminal escapes are shown
    escaped, and the line is clipped; a file name with a newline stays on one line too."""
    log = tmp_path / "evil\nname.log"
    log.write_text("==PROF== Connected to process 1\n==ERROR== \x1b[2J\x1b[31mgotcha\u202e " + "x" * 5000 + "\n")
    r = _cli("ingest", log, "--store", tmp_path / "s.duckdb")
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(lines) == 1 and len(r.stderr.splitlines()) == 2
    assert "\x1b" not in r.stderr and "\u202e" not in r.stderr
    assert "evil\\nname.log" in lines[0] and "\\x1b[2J" in lines[0] and "\\u202e" in lines[0]
    assert len(lines[0]) < 600


def test_limits_are_documented():
    doc = (ROOT / "docs" / "reliability.md").read_text()
    for lim in limits.LIMITS.values():
        assert lim.env in doc, f"{lim.env} missing from docs/reliability.md"
        assert limits.show(lim.name, lim.default).split()[0] in doc
    assert "TRACEANALYZER_LOCK_TIMEOUT_S" in doc


# -- inputs never change; nothing in a trace is run or opened -----------------------------------

def _snapshot(folder: Path) -> dict[str, tuple]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(folder.iterdir())}


def test_inputs_are_never_changed(tmp_path):
    traces = shared_traces()
    inputs = tmp_path / "in"
    inputs.mkdir()
    for p in (traces / "nsys" / "DLProf__nsys_profile.sqlite", traces / "ncu" / "nsightful__copy_blocked.csv",
              traces / "torch" / "hta__trace_compare__base__base.json.gz", PLANTED):
        shutil.copy2(p, inputs / p.name)
    (inputs / "truncated.sqlite").write_bytes(PLANTED.read_bytes()[:5000])
    os.utime(inputs / "truncated.sqlite", ns=(1_000_000_000, 1_000_000_000))
    before = _snapshot(inputs)
    db = tmp_path / "s.duckdb"
    for args in (["scan", inputs, "--jobs", "1"], ["ingest", inputs], ["check", inputs, "--format", "json", "-o", tmp_path / "r.json"],
                 ["runs"], ["summary", "planted.sqlite"], ["query", "SELECT count(*) FROM kernels"],
                 ["report", inputs, "-o", tmp_path / "r.html"]):
        r = _cli(*args, "--store", db)
        assert "Traceback" not in r.stderr, (args, r.stderr)
        assert _snapshot(inputs) == before, f"`{args[0]}` changed an input file or its folder"


# The one pickle.load outside the snapshot reader: a Kineto read in parts takes back what its own
# helper process (our code, `python -m traceanalyzer.ingest.kineto_parts`) wrote to its stdout,
# an unnamed temporary file of this process that no other process can open; the trace's bytes
# reach it only as values the helper decoded with msgspec, never as pickle opcodes.
OWN_PICKLE = ("traceanalyzer/ingest/kineto_parts.py", "collector, top = pickle.load(self.out)")


def test_source_has_no_eval_exec_pickle_loading_or_shell():
    banned = re.compile(r"\b(?:eval|exec)\(|\bpickle\.loads?\(|\bmarshal\.|\bshelve\.|yaml\.load\(|"
                        r"os\.system\(|shell\s*=\s*True|__import__\(")
    hits = [(str(p.relative_to(ROOT)), i, line.strip()) for p in (ROOT / "traceanalyzer").rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if banned.search(line)]
    assert [(f, line) for f, _, line in hits] == [OWN_PICKLE], "\n".join(f"{f}:{i}: {line}" for f, i, line in hits)
    text = (ROOT / OWN_PICKLE[0]).read_text()
    assert "self.out = tempfile.TemporaryFile()" in text  # unnamed: only this process holds it


def test_the_only_unpickler_refuses_every_class():
    """Pickles from files are read in one place, by an unpickler whose find_class refuses every
    class (the other user reads its own helper's output, see OWN_PICKLE)."""
    users = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "traceanalyzer").rglob("*.py")
                   if re.search(r"\bUnpickler\b|\bimport pickle\b|\bfrom pickle\b", p.read_text()))
    assert users == [OWN_PICKLE[0], "traceanalyzer/ingest/torch_memory_snapshot.py"]
    from traceanalyzer.ingest.torch_memory_snapshot import _NoClasses
    with pytest.raises(Exception, match="os.system"):
        _NoClasses(__import__("io").BytesIO(b"")).find_class("os", "system")


def test_a_snapshot_pickle_that_would_run_a_command_is_refused_unrun(tmp_path):
    """GLOBAL os.system + REDUCE, the classic pickle exploit, inside a real-looking snapshot
    (and every other class-needing pickle of the corpus): one-line error naming the class, and
    the command never ran."""
    marker = tmp_path / "ran"
    command = f"touch {marker}".encode()
    exploit = (b"\x80\x04}(\x8c\x08segments](cos\nsystem\nX" + len(command).to_bytes(4, "little") + command
               + b"\x85Re\x8c\x0ddevice_traces]]au.")
    cases = {"exploit.pickle": exploit, **{f"c{i}.pickle": data for i, data in enumerate(G.CLASS_PICKLES.values())}}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(TraceError) as e:
            read_file(tmp_path / name)
        assert "\n" not in str(e.value)
        assert not marker.exists(), f"{name} ran its command"
    with pytest.raises(TraceError, match=r"needs the Python class os\.system and was refused"):
        read_file(tmp_path / "exploit.pickle")


AUDIT_CHILD = r"""
import json, sys
opened = []
def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir", "sqlite3.connect", "shutil.copyfile", "os.chdir"):
        opened.append(str(args[0]) if args else "")
sys.addaudithook(hook)
from traceanalyzer.cli import app
for argv in json.loads(sys.argv[1]):
    try:
        app(argv, standalone_mode=False)
    except SystemExit:
        pass
    except Exception as e:
        print("EXC", type(e).__name__, e, file=sys.stderr)
print(json.dumps(opened))
"""


def test_paths_named_inside_traces_are_never_opened(tmp_path):
    """Traces full of paths (a Kineto `traceName`, python_function files, an nsys string,
    an ncu process name) pointing at a sentinel file: no command opens or lists it."""
    secret = tmp_path / "secret"
    secret.mkdir()
    sentinel = secret / "sentinel.txt"
    sentinel.write_text("do not read")
    inputs = tmp_path / "in"
    inputs.mkdir()
    doc = json.loads((FIXTURES / "kineto" / "planted.json").read_text())
    doc["traceName"] = str(sentinel)
    doc["deviceProperties"] = str(sentinel)
    doc["traceEvents"] += [
        {"ph": "X", "cat": "python_function", "name": f"{sentinel}(12): forward", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
         "args": {"Python id": 1, "Input Dims": [[str(sentinel)]]}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2,
         "args": {"Addr": str(sentinel), "Bytes": str(secret)}},
        {"ph": "X", "cat": "kernel", "name": str(sentinel), "pid": 0, "tid": 7, "ts": 3, "dur": 1,
         "args": {"device": 0, "stream": 7, "correlation": 99}}]
    (inputs / "paths.json").write_text(json.dumps(doc))
    shutil.copy(PLANTED, inputs / "paths.sqlite")
    con = sqlite3.connect(inputs / "paths.sqlite")
    con.execute("UPDATE StringIds SET value = ? WHERE id IN (9, 10)", [str(sentinel)])
    con.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'", [str(secret)])
    con.commit()
    con.close()
    csv_text = (FIXTURES / "ncu" / "details_stalls.csv").read_text()
    (inputs / "paths.csv").write_text(re.sub(r'^("\d+","\d+",)"[^"]*"', rf'\1"{sentinel}"', csv_text, flags=re.M))
    db = tmp_path / "s.duckdb"
    argv = [["ingest", str(inputs), "--store", str(db)],
            ["check", str(inputs), "--store", str(db), "--format", "sarif", "-o", str(tmp_path / "o.sarif")],
            ["summary", "--store", str(db)],
            ["report", str(inputs), "--store", str(db), "-o", str(tmp_path / "o.html")]]
    r = subprocess.run([sys.executable, "-c", AUDIT_CHILD, json.dumps(argv)], capture_output=True, text=True,
                       cwd=ROOT, timeout=180)
    opened = json.loads(r.stdout.strip().splitlines()[-1])
    assert any(p.endswith("paths.json") for p in opened)  # the hook saw the real reads
    with Store(db, read_only=True) as s:
        assert s.sql("SELECT count(*) FROM runs").fetchone()[0] == 3
        assert s.sql("SELECT count(*) FROM kernels WHERE name = ?", [str(sentinel)]).fetchone()[0] >= 2
    touched = [p for p in opened if str(secret) in p]
    assert not touched, touched


# -- SQL from trace strings and options; escaping in every output --------------------------------

HOSTILE = "x'; DROP TABLE runs; --<script>alert(1)</script>[bold]m[/] [/x] \x1b[31mred\u202e"
HOSTILE_FILE = "q'\"; DROP TABLE runs; --<script>[b]x[i].sqlite"


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    """planted.sqlite with two kernels renamed to HOSTILE, under HOSTILE_FILE, checked in
    every report format."""
    root = tmp_path_factory.mktemp("hostile")
    inputs, out = root / "in", root / "out"
    inputs.mkdir()
    out.mkdir()
    trace = inputs / HOSTILE_FILE
    shutil.copy(PLANTED, trace)
    con = sqlite3.connect(trace)
    short = dict(con.execute("SELECT value, id FROM StringIds").fetchall())
    for kernel, new in (("register_heavy", HOSTILE), ("tail_kernel", HOSTILE + "2")):
        con.execute("UPDATE StringIds SET value = ? WHERE id = ?", [new, short[kernel]])
        con.execute("UPDATE StringIds SET value = ? WHERE value LIKE ?", [f"void {new}(float*, int)", f"void {kernel}(%"])
    con.commit()
    con.close()
    db = out / "s.duckdb"
    results = {fmt: _cli("check", inputs, "--store", db, "--format", fmt, "-o", out / f"report.{fmt}",
                         "--fail-on", "never") for fmt in ("json", "sarif", "junit", "text")}
    results["html"] = _cli("report", inputs, "--store", db, "-o", out / "report.html")
    results["markdown"] = _cli("report", inputs, "--store", db, "--markdown", "-o", out / "report.md")
    return db, out, results


def test_hostile_names_are_stored_verbatim_and_nothing_is_dropped(hostile_store):
    db, _, results = hostile_store
    assert all(r.returncode == 0 for r in results.values()), {k: r.stderr for k, r in results.items()}
    with Store(db, read_only=True) as s:
        assert s.sql("SELECT file_name FROM runs").fetchall() == [(HOSTILE_FILE,)]
        assert s.sql("SELECT count(*) FROM kernels WHERE short_name = ?", [HOSTILE]).fetchone()[0] >= 1
        names = {t for (t,) in s.sql("SELECT table_name FROM information_schema.tables").fetchall()}
        assert {"runs", "kernels", "findings"} <= names
        assert s.sql("SELECT count(*) FROM findings WHERE item_name LIKE ?", ["%DROP TABLE runs%"]).fetchone()[0] >= 2


def test_json_and_sarif_carry_hostile_names_exactly(hostile_store):
    _, out, _ = hostile_store
    doc = json.loads((out / "report.json").read_text())
    assert any(f["item_name"] and HOSTILE in f["item_name"] for f in doc["findings"])
    sarif_text = (out / "report.sarif").read_text()
    sarif = json.loads(sarif_text)
    assert any(HOSTILE in (r["properties"].get("item_name") or "") for r in sarif["runs"][0]["results"])
    for text in ((out / "report.json").read_text(), sarif_text):
        assert "\x1b" not in text and "\u202e" not in text  # JSON escapes them (\u001b)


def test_junit_is_well_formed_xml_with_names_escaped(hostile_store):
    _, out, _ = hostile_store
    text = (out / "report.junit").read_text()
    assert "<script>" not in text and "\x1b" not in text
    root = ET.fromstring(text)
    messages = " ".join(el.get("message", "") + (el.text or "") for el in root.iter())
    assert "DROP TABLE runs; --<script>alert(1)</script>[bold]m[/]" in messages  # escaped, not lost
    assert any(HOSTILE_FILE in (el.get("name") or "") for el in root.iter("testsuite"))


def test_html_and_markdown_reports_escape_hostile_names(hostile_store):
    _, out, _ = hostile_store
    html = (out / "report.html").read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    md = (out / "report.md").read_text()
    assert "<script>alert(1)" not in md


def test_text_report_prints_markup_literally(hostile_store):
    _, out, _ = hostile_store
    text = (out / "report.text").read_text()
    assert "[bold]m[/] [/x]" in text  # shown as written, not interpreted as rich markup


def test_text_and_markdown_reports_neutralise_terminal_escapes(hostile_store):
    _, out, _ = hostile_store
    for name in ("report.text", "report.md"):
        text = (out / name).read_text()
        assert "\x1b" not in text and "\u202e" not in text, name


def test_summary_of_a_hostile_run_does_not_crash(hostile_store):
    db, _, _ = hostile_store
    r = _cli("summary", "--store", db)
    assert r.returncode == 0 and "Traceback" not in r.stderr


def test_sql_options_are_data_not_code(hostile_store):
    db, out, _ = hostile_store
    for args in (["summary", "x' OR '1'='1", "--store", db],
                 ["query", "DROP TABLE runs", "--store", db],
                 ["check", out / "nothing-here", "--store", db, "--threshold", "T001.min_gap_ns=1; DROP TABLE runs"],
                 ["check", out / "nothing-here", "--store", db, "--select", "T001'; DROP TABLE runs; --"]):
        r = _cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stdout, r.stderr)
    with Store(db, read_only=True) as s:
        assert s.sql("SELECT count(*) FROM runs").fetchone()[0] == 1


# -- property-based ------------------------------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                                  st.dictionaries(st.text(max_size=5), kids, max_size=3)),
                           max_leaves=8)
CATS = ["kernel", "Kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cuda_sync", "cpu_op",
        "user_annotation", "gpu_user_annotation", "cpu_instant_event", "python_function", "ac2g"]
event = st.fixed_dictionaries({}, optional={
    "ph": st.sampled_from(["X", "i", "s", "f", "M", "C"]) | json_values, "cat": st.sampled_from(CATS) | json_values,
    "name": st.sampled_from(["k", "[memory]", "cudaLaunchKernel", "Memcpy HtoD (Pageable -> Device)"]) | json_values,
    "pid": st.integers(-5, 2**40) | json_values, "tid": st.integers(-5, 2**40) | st.just("stream 7") | json_values,
    "ts": st.floats(-1e17, 1e17) | st.integers(-(2**70), 2**70) | json_values,
    "dur": st.floats(-1e3, 1e16) | st.integers(-5, 2**70) | json_values,
    "args": st.dictionaries(st.sampled_from(["correlation", "External id", "device", "stream", "grid", "block", "bytes",
                                             "Bytes", "Addr", "Device Id", "Input Dims", "shared memory"]),
                            json_values | st.integers(-(2**70), 2**70), max_size=5) | json_values,
})
trace_doc = st.fixed_dictionaries({"traceEvents": st.lists(event, max_size=12)}, optional={
    "baseTimeNanoseconds": st.integers(-(2**64), 2**64) | json_values,
    "deviceProperties": st.lists(st.dictionaries(st.sampled_from(["id", "name", "computeMajor", "numSms",
                                                                  "maxThreadsPerBlock", "regsPerMultiprocessor"]),
                                                 json_values | st.integers(-5, 2**40), max_size=6), max_size=2) | json_values,
    "distributedInfo": json_values, "schemaVersion": json_values})

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _read_then_store(path: Path) -> None:
    """read_file, then write the run: any exception other than TraceError fails the test."""
    try:
        trace = read_file(path)
    except TraceError as e:
        assert str(e).strip() and "\n" not in str(e)
        return
    with Store(":memory:") as s:
        s.write_run(trace, path, "0" * 64, path.stat().st_size)
        for table in ("kernels", "copies", "api_calls", "ranges", "cpu_ops"):
            bad = s.sql(f"SELECT count(*) FROM {table} WHERE end_ns < start_ns OR abs(start_ns) > ?",
                        [limits.MAX_ABS_TIME_NS]).fetchone()[0]
            assert bad == 0 or table in ("api_calls", "ranges", "cpu_ops"), table


@PROPERTY
@given(doc=trace_doc, gz=st.booleans())
def test_property_any_kineto_shaped_json_reads_or_fails_cleanly(doc, gz):
    raw = json.dumps(doc).encode()
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / ("t.json.gz" if gz else "t.json")
        p.write_bytes(gzip.compress(raw) if gz else raw)
        _read_then_store(p)


@PROPERTY
@given(prefix=st.sampled_from([b"", b"SQLite format 3\x00", b"\x1f\x8b\x08", b'{"traceEvents":', b"[", b"[[", b"\x80\x04",
                               b"\x80\x02}",
                               b'"ID","Process ID","Kernel Name"\n', b"\xef\xbb\xbf", b"NVR\x00",
                               b"NVR\x00\x02\x00\x00\x00\x08\x07"]),
       body=st.binary(max_size=3000))
def test_property_arbitrary_bytes_never_crash(prefix, body):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.bin"
        p.write_bytes(prefix + body)
        _read_then_store(p)


NCU_HEADER = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
              "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
cell = st.one_of(st.sampled_from(["0", "1", "-1", "7", "(128, 1, 1)", "8.0", "byte", "Kbyte", "%", "nan", "1e400",
                                  "1,024", "", "sm__warps_active.avg.pct_of_peak_sustained_active",
                                  "launch__registers_per_thread", "GPU Speed Of Light Throughput"]),
                 st.text(max_size=8))


@PROPERTY
@given(rows=st.lists(st.lists(cell, min_size=0, max_size=17), min_size=1, max_size=12))
def test_property_ncu_shaped_csv_reads_or_fails_cleanly(rows):
    import csv
    import io
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(NCU_HEADER)
    w.writerows(rows)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.csv"
        p.write_text(buf.getvalue())
        _read_then_store(p)


nsys_value = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=6),
                       st.binary(max_size=6))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(*[nsys_value] * 7), min_size=1, max_size=10))
def test_property_nsys_kernel_rows_of_any_type_read_or_fail_cleanly(rows):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.sqlite"
        con = sqlite3.connect(p)
        con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        con.execute("INSERT INTO StringIds VALUES (1, 'k')")
        con.execute('CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, "end", deviceId, streamId, correlationId, '
                    "demangledName, gridX)")
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        con.commit()
        con.close()
        _read_then_store(p)


@pytest.mark.parametrize("change, says", [
    ("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN deviceId TO deviceId_x",
     "CUPTI_ACTIVITY_KIND_KERNEL has no deviceId column"),
    ("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN start TO start_x", "CUPTI_ACTIVITY_KIND_KERNEL has no start column"),
    ("ALTER TABLE StringIds RENAME COLUMN value TO value_x", "StringIds has no value column"),
    ("ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY RENAME COLUMN bytes TO bytes_x", "CUPTI_ACTIVITY_KIND_MEMCPY has no bytes column"),
    ("DROP TABLE StringIds", "no StringIds table, which CUPTI_ACTIVITY_KIND_KERNEL names things by"),
])
def test_an_export_missing_a_column_every_nsys_writes_is_an_input_error(tmp_path, change, says):
    """A column every nsys schema writes (2.9 to 3.25) and without which the rows mean nothing
    (times, device, names): one error line naming the table and column, nothing stored, and the
    files after it in the batch checked and reported (it was stored with NULL devices, times or
    names, and crashed the diagnosis). One that only leaves something unknown
    is a warning, the file read (a copy's kind)."""
    bad = tmp_path / "bad.sqlite"
    shutil.copy(shared_traces() / "nsys" / "DLProf__nsys_profile.sqlite", bad)
    bad.chmod(0o644)
    with sqlite3.connect(bad) as con:
        con.execute(change)
    after = tmp_path / "after.sqlite"
    shutil.copy(PLANTED, after)
    store = tmp_path / "s.duckdb"
    r = _cli("check", bad, after, "--store", store)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"error: {bad}: {says}" in r.stderr and "Traceback" not in r.stdout + r.stderr
    assert "after.sqlite" in r.stdout  # reported
    with Store(store, read_only=True) as st:
        assert [n for (n,) in st.sql("SELECT file_name FROM runs").fetchall()] == ["after.sqlite"]


def test_an_export_missing_a_column_that_leaves_a_value_unknown_is_read_with_a_warning(tmp_path):
    bad = tmp_path / "bad.sqlite"
    shutil.copy(shared_traces() / "nsys" / "DLProf__nsys_profile.sqlite", bad)
    bad.chmod(0o644)
    with sqlite3.connect(bad) as con:
        con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY RENAME COLUMN copyKind TO copyKind_x")
    r = _cli("check", bad, "--store", tmp_path / "s.duckdb")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert (f"warning: {bad}: CUPTI_ACTIVITY_KIND_MEMCPY has no copyKind column (every nsys version writes it): "
            "read as unknown") in r.stderr


def test_the_fuzz_corpus_and_the_reader_agree_on_the_columns_an_export_needs():
    from traceanalyzer.ingest.nsys_sources import REQUIRED

    assert {t: set(c) for t, c in REQUIRED.items()} == G.REQUIRED_COLUMNS


def test_a_symlink_loop_named_on_the_command_line_is_one_error_line(tmp_path):
    """A link that leads nowhere (a loop) named as an input: one error line, the rest of the
    batch read, in check, scan and ingest."""
    good = tmp_path / "good.sqlite"
    shutil.copy(PLANTED, good)
    loop = tmp_path / "loop.sqlite"
    loop.symlink_to(loop.name)
    for command in ("check", "scan", "ingest"):
        store = tmp_path / f"{command}.duckdb"
        r = _cli(command, loop, good, "--store", store)
        assert r.returncode == 2, (command, r.stdout + r.stderr)
        assert "a symbolic link that leads to no file (a loop, or a missing target)" in r.stderr, command
        with Store(store, read_only=True) as st:
            assert st.sql("SELECT count(*) FROM runs").fetchall() == [(1,)], command


def test_a_store_that_is_no_store_is_refused_untouched(tmp_path):
    """An nsys export given as the store: refused by name, never opened (DuckDB would attach it
    as an SQLite database); a store cut short: one error line, exit 2, no traceback."""
    export = tmp_path / "trace.sqlite"
    shutil.copy(PLANTED, export)
    before = export.read_bytes()
    r = _cli("check", PLANTED, "--store", export)
    assert r.returncode == 2 and "an SQLite file (an Nsight Systems export?), not a traceanalyzer store" in r.stderr
    assert export.read_bytes() == before
    store = tmp_path / "s.duckdb"
    assert _cli("check", PLANTED, shared_traces() / "nsys" / "DLProf__nsys_profile.sqlite", "--store", store).returncode in (0, 1)
    cut = tmp_path / "cut.duckdb"
    data = store.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    for args in (["runs"], ["check", PLANTED]):
        p = subprocess.run([sys.executable, "-m", "traceanalyzer.cli", *map(str, args), "--store", str(cut)],
                           capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (args, p.stderr[-2000:])
        assert "the store file is damaged or truncated" in p.stderr, args


def test_a_kineto_trace_whose_every_event_is_unusable_is_an_input_error(tmp_path):
    """Every event skipped (no ts): an input error saying so, not a run of nothing that any gate
    passes as OK."""
    src = shared_traces() / "torch" / "TraceLens__torch_compile_triton__trace.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = None
    bad = tmp_path / "nullts.json"
    bad.write_text(json.dumps(doc))
    r = _cli("check", bad, PLANTED, "--store", tmp_path / "s.duckdb")
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(rf"error: {re.escape(str(bad))}: none of its \d+ events could be used: \d+ skipped, "
                     r"without ts, dur or name", r.stderr), r.stderr
    assert "planted.sqlite" in r.stdout


def test_a_stored_finding_whose_evidence_does_not_fit_is_one_warning_line(tmp_path):
    """Evidence a rule's type does not declare (a store written by another version, or a bug)
    is said in one `warning:` line, not as Python's file:line warning with its source line."""
    store = tmp_path / "s.duckdb"
    assert _cli("check", PLANTED, "--store", store).returncode in (0, 1)
    with Store(store) as st:
        st.con.execute("""UPDATE findings SET evidence = json_merge_patch(evidence, '{"not_a_field": 1}')
                          WHERE finding_no = (SELECT min(finding_no) FROM findings WHERE evidence IS NOT NULL)""")
    p = subprocess.run([sys.executable, "-m", "traceanalyzer.cli", "check", str(PLANTED), "--store", str(store)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert p.returncode in (0, 1), p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "does not fit" in ln]
    assert lines and all(ln.startswith("warning: ") for ln in lines), p.stderr
    assert "EvidenceMismatch" not in p.stderr and "warnings.warn" not in p.stderr
