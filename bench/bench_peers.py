"""Ours against the peers and the bare decode, side by side, 1x to 8x input (`python bench/bench_peers.py`).

For each input kind and size (inputs from `bench/gen_big.py`, under bench/data/):

  kineto   ours: Store.ingest + run_rules (every rule)      peer: HTA TraceAnalysis(trace_dir) load
           bare decode of the file: json / orjson / msgspec (generic), msgspec typed (the reader's
           first pass: 8 fields per event, args left raw)
  nsys     ours: Store.ingest + run_rules                    peer: nsys-ai `skill run gpu_idle_gaps`
           on a fresh copy (builds its Parquet cache, then finds gaps); warm: ours run_rules on the
           stored run vs nsys-ai's matching skills on the warm cache
           bare decode: sqlite3 fetchmany of the reader's columns (rows only), the same into Arrow
           (sqlite3 + fetchmany), and ADBC SQLite fetch_arrow_table

Every measurement is a fresh subprocess of this file (`--child TASK ...`), run by the
right interpreter (the peers live in their own virtual environments under
bench/data/venvs, created here with `python -m venv` + pip). A child reports the seconds
of its task (the tool's imports included, interpreter start-up not) and its peak RSS: VmHWM
of the child (a new address space after exec) or of any process it waited for, whichever
is larger. The parent adds the process wall time, and samples the resident memory of the
child and all its descendants together every 20 ms: when a tool overlaps processes (our
two-process read of a big Kineto file, HTA's per-rank pool) the peak is that sum. Results go to stdout, bench/data/peers.json and docs/performance.md.

    python bench/bench_peers.py                       # everything (~20 min on 2 cores)
    python bench/bench_peers.py --kinds kineto --scales 8 --no-peers
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
VENVS = DATA / "venvs"
LOGS = DATA / "logs"
DOC = ROOT / "docs" / "performance.md"
RESULT_MARK = "BENCH_RESULT "
TREE_SAMPLE_S = 0.02
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")

PEERS = {
    # HTA's PyPI name is now `traceinsight` (0.6.1); 0.5.0 under the old name is the release
    # the issue names. It needs pandas < 3.
    "hta": ["HolisticTraceAnalysis==0.5.0", "pandas<3"],
    # nsys-ai reads SQLite through DuckDB's sqlite_scanner; offline that needs this exact
    # DuckDB plus the extension's wheel, installed into DuckDB below. Without it nsys-ai
    # falls back to sqlite3 and writes indexes into the export (it is run on a copy anyway).
    "nsys-ai": ["nsys-ai==0.3.0", "duckdb==1.5.5", "duckdb-extension-sqlite-scanner==1.5.5"],
}
NSYS_AI_HOME = VENVS / "nsys-ai-home"  # HOME of nsys-ai runs: DuckDB's extension folder lives there
# HOME of the context runs without sqlite_scanner: nsys-ai then reads through sqlite3, as it
# does wherever the extension cannot be installed (offline, another DuckDB).
NSYS_AI_BARE_HOME = VENVS / "nsys-ai-home-bare"
NSYS_AI_FALLBACK = "nsys-ai, sqlite3 fallback: cache build + gaps"
# nsys-ai skills that match our rules on an nsys run (gaps, H2D copies, syncs, launch overhead).
NSYS_AI_WARM_SKILLS = ("gpu_idle_gaps", "memory_transfers", "sync_cost_analysis", "kernel_launch_overhead")
KINETO_DECODERS = ("json", "orjson", "msgspec", "msgspec-typed")
SQLITE_DECODERS = ("sqlite3-rows", "sqlite3-arrow", "adbc-arrow")
NSYS_BASE_KERNELS = 625_000  # 1x; 8x = 5 M kernels
CAPPED_MEMORY = "1GB"  # TRACEANALYZER_MEMORY_LIMIT of the capped nsys row
# Runs of each cell a target reads, at every size (the median run is shown): the machine
# is shared, and one run, ours or a peer's, can be slowed by a neighbour.
REPEAT = 3


# ======================================================================================
# Child side: runs inside the measured process, possibly under a peer's interpreter, so
# only the standard library is imported at module level.
# ======================================================================================
def _peak_rss_bytes() -> int:
    hwm = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return max(hwm, children)


def task_ours(path: str, store_path: str) -> dict:
    """Ingest one file into a new store and run every rule on it."""
    sys.path.insert(0, str(ROOT))
    from traceanalyzer.rules.engine import run_rules
    from traceanalyzer.store import Store

    Path(store_path).unlink(missing_ok=True)
    Path(store_path + ".wal").unlink(missing_ok=True)
    t0 = time.perf_counter()
    with Store(store_path) as store:
        res = store.ingest(path)
        t1 = time.perf_counter()
        outcomes = run_rules(store, [res.run_id])
    t2 = time.perf_counter()
    return {"ingest_s": t1 - t0, "rules_s": t2 - t1, "run_id": res.run_id, "rows": res.counts,
            "rule_status": {o.rule_id: [o.status, o.findings] for o in outcomes}}


def task_ours_rules(store_path: str, run_id: str) -> dict:
    """Every rule again on a run already in the store (the warm path)."""
    sys.path.insert(0, str(ROOT))
    from traceanalyzer.rules.engine import run_rules
    from traceanalyzer.store import Store

    with Store(store_path) as store:
        t0 = time.perf_counter()
        outcomes = run_rules(store, [run_id])
        return {"rules_s": time.perf_counter() - t0, "findings": sum(o.findings for o in outcomes)}


def task_table_sizes(store_path: str, run_id: str) -> dict:
    """Rows and Arrow bytes of each of the run's tables (not timed: for the memory bound)."""
    sys.path.insert(0, str(ROOT))
    from traceanalyzer import schema
    from traceanalyzer.store import Store

    import pyarrow as pa
    import pyarrow.compute as pc

    sizes = {}
    with Store(store_path, read_only=True) as store:
        for t in schema.DATA_TABLES:
            tbl = store.arrow(f"SELECT * EXCLUDE (run_id) FROM {t} WHERE run_id = '{run_id}'")
            if tbl.num_rows:
                # Strings dictionary-encoded, as the readers hold names: each distinct name
                # once (plain strings would count a 200-byte kernel name per launch).
                cols = [pc.dictionary_encode(c) if pa.types.is_string(c.type) else c for c in tbl.columns]
                sizes[t] = [tbl.num_rows, pa.table(cols, names=tbl.column_names).nbytes]
    return {"tables": sizes}


def task_hta(trace_dir: str) -> dict:
    import logging

    logging.disable(logging.WARNING)  # HTA logs every parse step at WARNING
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=trace_dir)
    seconds = time.perf_counter() - t0
    return {"load_s": seconds, "events": int(sum(len(analysis.t.get_trace(r)) for r in analysis.t.get_ranks()))}


def _nsys_ai(argv: list[str]) -> int:
    from nsys_ai.__main__ import main

    sys.argv = ["nsys-ai", *argv]
    try:
        main()
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return 0


def task_nsys_ai_cold(sqlite_path: str) -> dict:
    """Cache build + gap finding on a copy with no cache yet: what a first `skill run` costs."""
    rc = _nsys_ai(["skill", "run", "gpu_idle_gaps", sqlite_path])
    cache = Path(sqlite_path).with_suffix(".nsys-cache")
    return {"rc": rc, "cache_built": cache.is_dir(),
            "cache_bytes": sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) if cache.is_dir() else 0}


def task_nsys_ai_warm(sqlite_path: str) -> dict:
    rcs = {}
    per_skill = {}
    for skill in NSYS_AI_WARM_SKILLS:
        t = time.perf_counter()
        rcs[skill] = _nsys_ai(["skill", "run", skill, sqlite_path])
        per_skill[skill] = time.perf_counter() - t
    return {"rc": max(rcs.values()), "skills_s": per_skill}


def task_decode_json(method: str, path: str) -> dict:
    data = Path(path).read_bytes()
    if method == "json":
        n = len(json.loads(data)["traceEvents"])
    elif method == "orjson":
        import orjson

        n = len(orjson.loads(data)["traceEvents"])
    elif method == "msgspec":
        import msgspec

        n = len(msgspec.json.decode(data)["traceEvents"])
    elif method == "msgspec-typed":
        import msgspec

        sys.path.insert(0, str(ROOT))
        from traceanalyzer.ingest.kineto_events import Event

        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
        n = len(msgspec.json.decode(top["traceEvents"], type=list[Event]))
    else:
        raise SystemExit(f"unknown decoder {method}")
    return {"items": n}


def _nsys_needed_columns(path: str) -> list[tuple[str, list[str]]]:
    """(table, columns) the reader fetches, for the tables and columns this export has."""
    import sqlite3

    sys.path.insert(0, str(ROOT))
    from traceanalyzer.ingest.nsys import SOURCES

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    out = [("StringIds", ["id", "value"])]
    for table, spec in SOURCES.items():
        if table in have:
            cols = {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}
            out.append((table, [src for src, _ in spec.values() if src in cols]))
    con.close()
    return out


def task_decode_sqlite(method: str, path: str) -> dict:
    import sqlite3

    needed = _nsys_needed_columns(path)
    rows = 0
    t0 = time.perf_counter()  # column discovery is not decoding
    if method in ("sqlite3-rows", "sqlite3-arrow"):
        import pyarrow as pa

        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        for table, cols in needed:
            cur = con.execute(f'SELECT {", ".join(chr(34) + c + chr(34) for c in cols)} FROM "{table}"')
            batches = []
            while chunk := cur.fetchmany(65536):
                rows += len(chunk)
                if method == "sqlite3-arrow":
                    batches.append(pa.RecordBatch.from_arrays(
                        [pa.array(list(col)) for col in zip(*chunk)], names=cols))
        con.close()
    elif method == "adbc-arrow":
        import adbc_driver_sqlite.dbapi as adbc

        with adbc.connect(f"file:{path}?mode=ro") as con:
            for table, cols in needed:
                with con.cursor() as cur:
                    cur.execute(f'SELECT {", ".join(chr(34) + c + chr(34) for c in cols)} FROM "{table}"')
                    rows += cur.fetch_arrow_table().num_rows
    else:
        raise SystemExit(f"unknown decoder {method}")
    return {"items": rows, "work_s_override": time.perf_counter() - t0}


TASKS = {
    "ours": task_ours, "ours-rules": task_ours_rules, "table-sizes": task_table_sizes, "hta": task_hta,
    "nsys-ai-cold": task_nsys_ai_cold, "nsys-ai-warm": task_nsys_ai_warm,
    "decode-json": task_decode_json, "decode-sqlite": task_decode_sqlite,
}


def child(task: str, args: list[str]) -> None:
    fn = TASKS[task]
    t0 = time.perf_counter()
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # peers print reports
        extra = fn(*args)
    seconds = extra.pop("work_s_override", None) or time.perf_counter() - t0
    print(RESULT_MARK + json.dumps({"work_s": seconds, "peak_bytes": _peak_rss_bytes(), **extra}))


# ======================================================================================
# Parent side.
# ======================================================================================
def measure(python: Path | str, task: str, *args, env: dict | None = None, label: str = "",
            timeout_s: float = 1800) -> dict:
    """Run one child; return its report plus the process wall time (or an `error`)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{label or task}.log".replace("/", "_")
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([str(python), str(Path(__file__).resolve()), "--child", task, *map(str, args)],
                                stdout=out, stderr=err, text=True, env={**os.environ, **(env or {})}, cwd=ROOT)
        tree_peak = 0
        while proc.poll() is None:  # the process and its children together (a helper process counts)
            tree_peak = max(tree_peak, _tree_rss_bytes(proc.pid))
            if time.perf_counter() - t0 > timeout_s:
                proc.kill()
                proc.wait()
                return {"error": f"timed out after {timeout_s:.0f} s", "wall_s": time.perf_counter() - t0}
            time.sleep(TREE_SAMPLE_S)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    log.write_text(stdout[-20000:] + "\n--- stderr ---\n" + stderr[-50000:])
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            r = json.loads(line[len(RESULT_MARK):])
            # Peak: the process's own high-water mark or its largest child's, or the sampled
            # sum over the process tree when processes overlap, whichever is larger.
            return {**r, "peak_bytes": max(r["peak_bytes"], tree_peak), "tree_peak_bytes": tree_peak, "wall_s": wall}
    tail = [ln for ln in stderr.strip().splitlines() if ln.strip()][-1:] or [f"exit {proc.returncode}"]
    return {"error": tail[0][:300], "wall_s": wall, "log": str(log.relative_to(ROOT))}


def _tree_rss_bytes(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants now (0 if it is gone)."""
    children = _children_of if Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists() \
        else _children_from_all(pid)
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children(p)
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE_BYTES
    return total


def _children_of(pid: int) -> list[int]:
    """`pid`'s child processes, from its threads' `children` files. This sampler runs every
    20 ms beside the measured tool; reading every process's stat instead took ~2 ms of a core
    per sample here, ~10% of the core a two-process tool (ours) also needs, against nothing
    taken from a one-process tool, which leaves that core idle."""
    found = []
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            found += map(int, f.read_text().split())
    return found


def _children_from_all(pid: int):
    """`_children_of` for kernels without the `children` files: every process's parent, read once."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return lambda p: children.get(p, [])


def ensure_venv(name: str) -> Path:
    """The peer's virtual environment (created once; rebuilt when its package list changes)."""
    venv = VENVS / name
    python = venv / "bin" / "python"
    marker = venv / "bench-packages.txt"
    wanted = "\n".join(PEERS[name])
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"creating {venv.relative_to(ROOT)}: pip install {' '.join(PEERS[name])}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / f"pip_{name}.log", "w") as log:
        pip = subprocess.run([str(python), "-m", "pip", "install", *PEERS[name]], stdout=log, stderr=log)
    if pip.returncode:
        raise SystemExit(f"pip could not install {PEERS[name]} (see {log.name} in {LOGS})")
    if name == "nsys-ai":
        install_sqlite_scanner(python)
    marker.write_text(wanted)
    return python


def install_sqlite_scanner(python: Path) -> None:
    """Copy the wheel's sqlite_scanner into DuckDB's extension folder under NSYS_AI_HOME."""
    NSYS_AI_HOME.mkdir(parents=True, exist_ok=True)
    code = ("import duckdb, pathlib, duckdb_extension_sqlite_scanner as m\n"
            "p = next(pathlib.Path(m.__file__).parent.glob('extensions/*/sqlite_scanner.duckdb_extension'))\n"
            "c = duckdb.connect(); c.execute(f\"INSTALL '{p}'\"); c.execute('LOAD sqlite_scanner')\n")
    subprocess.run([str(python), "-c", code], check=True, env={**os.environ, "HOME": str(NSYS_AI_HOME)})


def package_version(python: Path | str, dist: str) -> str:
    out = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem_kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                  if ln.startswith("MemTotal"))
    import duckdb
    import msgspec
    import pyarrow

    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gb": round(mem_kb / 2**20, 1),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "duckdb": duckdb.__version__, "pyarrow": pyarrow.__version__, "msgspec": msgspec.__version__,
            "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "load_avg_start": os.getloadavg()}


def median_run(runs: list[dict]) -> dict:
    """The run with the median work time (the lower one of an even count), with every run's
    time in `runs_s`; the last error if none ran."""
    ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["work_s"])
    if not ok:
        return runs[-1]
    pick = dict(ok[(len(ok) - 1) // 2])
    if len(runs) > 1:
        pick["runs_s"] = [round(r["work_s"], 3) for r in ok]
    return pick


def repeated(reps: int, fn) -> dict:
    return median_run([fn() for _ in range(reps)])


def interleaved(reps: int, cells: list[Callable[[], list[tuple[str, dict]]]]) -> list[tuple[str, dict]]:
    """Rounds of one run of every cell, then each row's median run.

    A neighbour's burst on the shared host then slows one round, every tool's run in it,
    rather than all the runs of whichever tool was measured at that moment: the ratios the
    targets read compare runs made side by side. A cell may give several rows (a cold and a
    warm measurement of one tool)."""
    runs: dict[str, list[dict]] = {}
    for _ in range(reps):
        for cell in cells:
            for row, r in cell():
                runs.setdefault(row, []).append(r)
    return [(row, median_run(r)) for row, r in runs.items()]


def _short(r: dict) -> str:
    if "error" in r:
        return f"ERROR {r['error'][:80]}"
    return f"{r['work_s']:7.2f} s  {r['peak_bytes'] / 1e6:7.0f} MB"


def _store_path(kind: str, scale: int) -> Path:
    (DATA / "stores").mkdir(parents=True, exist_ok=True)
    return DATA / "stores" / f"{kind}_{scale}x.duckdb"


def _ours_cell(kind: str, scale: int, path: Path, store: Path):
    """Ours, one run: ingest + all rules into a fresh store, then the rules alone on it."""
    def run() -> list[tuple[str, dict]]:
        ours = measure(sys.executable, "ours", path, store, label=f"ours_{kind}_{scale}x")
        rows = [("ours: ingest + all rules", ours)]
        if "error" not in ours:
            rows.append(("ours: rules on stored run", measure(
                sys.executable, "ours-rules", store, ours["run_id"], label=f"ours_rules_{kind}_{scale}x")))
        return rows
    return run


def _table_sizes(rows: list[tuple[str, dict]], store: Path) -> None:
    """The stored tables' sizes, kept on the ingest row (for the memory bound)."""
    ours = dict(rows).get("ours: ingest + all rules")
    if ours and "error" not in ours and store.exists():
        ours["tables"] = measure(sys.executable, "table-sizes", store, ours["run_id"], label="sizes").get("tables", {})
    store.unlink(missing_ok=True)


def _report(kind: str, scale: int, size: int, rows: list[tuple[str, dict]], results: list) -> None:
    for what, r in rows:
        print(f"  {what:<32} {_short(r)}", flush=True)
        results.append({"kind": kind, "scale": scale, "input_bytes": size, "what": what, **r})


def _announce(kind: str, scale: int, path: Path, t0: float) -> int:
    size = path.stat().st_size
    print(f"\n== {kind} {scale}x: {path.relative_to(ROOT)} {size / 1e6:.0f} MB "
          f"(ready in {time.perf_counter() - t0:.0f} s)", flush=True)
    return size


def run_kineto(scale: int, peers: bool, results: list, reps: int = 1) -> None:
    from gen_big import kineto

    t = time.perf_counter()
    path = kineto(scale)
    size = _announce("kineto", scale, path, t)
    store = _store_path("kineto", scale)
    cells = [_ours_cell("kineto", scale, path, store)]
    if peers:
        cells.append(lambda: [("HTA: TraceAnalysis load", measure(
            ensure_venv("hta"), "hta", path.parent, label=f"hta_{scale}x"))])
    rows = interleaved(reps, cells)
    _table_sizes(rows, store)
    for method in KINETO_DECODERS:  # the typed decode is a target's baseline; the others are context
        rows.append((f"decode: {method}", repeated(reps if method == "msgspec-typed" else 1, lambda: measure(
            sys.executable, "decode-json", method, path, label=f"decode_{method}_{scale}x"))))
    _report("kineto", scale, size, rows, results)


def run_nsys(scale: int, peers: bool, results: list, reps: int = 1) -> None:
    from gen_big import nsys

    t = time.perf_counter()
    path = nsys(NSYS_BASE_KERNELS * scale)
    size = _announce("nsys", scale, path, t)
    store = _store_path("nsys", scale)
    cells = [_ours_cell("nsys", scale, path, store),
             # The same with DuckDB capped (rules spill instead of growing): the memory a user can ask for.
             lambda: [(f"ours: ingest + all rules, {CAPPED_MEMORY} cap", measure(
                 sys.executable, "ours", path, _store_path("nsys_capped", scale),
                 env={"TRACEANALYZER_MEMORY_LIMIT": CAPPED_MEMORY}, label=f"ours_capped_nsys_{scale}x"))]]
    if peers:
        def nsys_ai() -> list[tuple[str, dict]]:
            cold, warm = _nsys_ai_once(path, scale)
            return [("nsys-ai: cache build + gaps", cold)] + ([("nsys-ai: warm-cache skills", warm)] if warm else [])
        cells.append(nsys_ai)
    rows = interleaved(reps, cells)
    _table_sizes(rows, store)
    _store_path("nsys_capped", scale).unlink(missing_ok=True)
    if peers:
        rows.append((NSYS_AI_FALLBACK, _nsys_ai_once(path, scale, scanner=False)[0]))  # context: one run
    for method in SQLITE_DECODERS:  # ADBC's is the reader's baseline
        rows.append((f"decode: {method}", repeated(reps if method == "adbc-arrow" else 1, lambda: measure(
            sys.executable, "decode-sqlite", method, path, label=f"decode_{method}_{scale}x"))))
    _report("nsys", scale, size, rows, results)


def _nsys_ai_once(path: Path, scale: int, scanner: bool = True) -> tuple[dict, dict | None]:
    """nsys-ai's cold cache build on a fresh copy of the export, then its warm skills.
    Without `scanner`, only the cold build, with a HOME that lacks sqlite_scanner."""
    python = ensure_venv("nsys-ai")
    copy = DATA / "nsys-ai" / path.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(copy.with_suffix(".nsys-cache"), ignore_errors=True)
    shutil.copyfile(path, copy)  # nsys-ai may write into the export; never into ours
    home = NSYS_AI_HOME if scanner else NSYS_AI_BARE_HOME
    home.mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home)}
    tag = "" if scanner else "_fallback"
    try:
        cold = measure(python, "nsys-ai-cold", copy, env=env, label=f"nsysai_cold{tag}_{scale}x")
        warm = (None if "error" in cold or not scanner else
                measure(python, "nsys-ai-warm", copy, env=env, label=f"nsysai_warm_{scale}x"))
    finally:
        copy.unlink(missing_ok=True)
        shutil.rmtree(copy.with_suffix(".nsys-cache"), ignore_errors=True)
    return cold, warm


# -- report --------------------------------------------------------------------------------
def _get(results, kind, scale, what):
    return next((r for r in results if r["kind"] == kind and r["scale"] == scale and r["what"] == what
                 and "error" not in r), None)


def _fmt_cell(r: dict | None) -> str:
    return "—" if r is None else f"{r['work_s']:.2f} s / {r['peak_bytes'] / 1e6:,.0f} MB"


def targets(results: list, scales: list[int]) -> list[str]:
    """The issue's targets, checked at the largest size measured."""
    lines = []
    top = max(scales)

    def verdict(ok):
        return "**met**" if ok else "**missed**"

    ours = _get(results, "kineto", top, "ours: ingest + all rules")
    hta = _get(results, "kineto", top, "HTA: TraceAnalysis load")
    decodes = [r for r in results if r["kind"] == "kineto" and r["scale"] == top and r["what"].startswith("decode:")
               and "error" not in r]
    if ours and hta:
        speed, mem = hta["work_s"] / ours["work_s"], ours["peak_bytes"] / hta["peak_bytes"]
        lines.append(f"| Kineto {top}x: ≥ 10x faster than HTA's load | {speed:.1f}x | {verdict(speed >= 10)} |")
        lines.append(f"| Kineto {top}x: ≤ 1/3 of HTA's peak memory | {mem:.2f} of it | {verdict(mem <= 1 / 3)} |")
    if ours and decodes:
        best = min(decodes, key=lambda r: r["work_s"])
        generic = min((r for r in decodes if r["what"] != "decode: msgspec-typed"), key=lambda r: r["work_s"],
                      default=best)
        x = ours["work_s"] / best["work_s"]
        lines.append(f"| Kineto {top}x: within 2x of the fastest bare decode ({best['what'][8:]}) | "
                     f"{x:.1f}x its time | {verdict(x <= 2)} |")
        if generic is not best:
            lines.append(f"| (context) the fastest generic decode into Python objects ({generic['what'][8:]}) | "
                         f"ours takes {ours['work_s'] / generic['work_s']:.1f}x its time | |")
    ours = _get(results, "nsys", top, "ours: ingest + all rules")
    cold = _get(results, "nsys", top, "nsys-ai: cache build + gaps")
    if ours and cold:
        speed, mem = cold["work_s"] / ours["work_s"], ours["peak_bytes"] / cold["peak_bytes"]
        lines.append(f"| nsys {top}x: ≥ 5x faster than nsys-ai's cache build | {speed:.1f}x | {verdict(speed >= 5)} |")
        lines.append(f"| nsys {top}x: ≤ 1/4 of nsys-ai's peak memory | {mem:.2f} of it | {verdict(mem <= 0.25)} |")
        capped = _get(results, "nsys", top, f"ours: ingest + all rules, {CAPPED_MEMORY} cap")
        if capped:
            cm = capped["peak_bytes"] / cold["peak_bytes"]
            lines.append(f"| nsys {top}x, TRACEANALYZER_MEMORY_LIMIT={CAPPED_MEMORY}: ≤ 1/4 of nsys-ai's peak memory | "
                         f"{cm:.2f} of it ({cold['work_s'] / capped['work_s']:.1f}x its speed) | {verdict(cm <= 0.25)} |")
    fallback = _get(results, "nsys", top, NSYS_AI_FALLBACK)
    if ours and fallback:
        lines.append(f"| (context) nsys {top}x against nsys-ai reading through sqlite3 (no sqlite_scanner) | "
                     f"{fallback['work_s'] / ours['work_s']:.1f}x faster, {ours['peak_bytes'] / fallback['peak_bytes']:.2f} "
                     "of its peak memory | |")
    warm_ours = _get(results, "nsys", top, "ours: rules on stored run")
    warm_peer = _get(results, "nsys", top, "nsys-ai: warm-cache skills")
    if warm_ours and warm_peer:
        x = warm_ours["work_s"] / warm_peer["work_s"]
        lines.append(f"| nsys {top}x: rules on a stored run no slower than nsys-ai's warm skills | "
                     f"{x:.2f}x its time | {verdict(x <= 1)} |")
    a = _get(results, "nsys", top, "decode: adbc-arrow")
    s = _get(results, "nsys", top, "decode: sqlite3-arrow")
    if a and s:
        lines.append(f"| nsys {top}x: ADBC beats sqlite3 + fetchmany (reader uses ADBC) | "
                     f"{s['work_s'] / a['work_s']:.1f}x faster | {verdict(a['work_s'] < s['work_s'])} |")
    scan_jobs = DATA / "scan_jobs.json"  # from bench/bench_scan_jobs.py, if it was run
    if scan_jobs.exists():
        j = json.loads(scan_jobs.read_text())
        lines.append(f"| `scan --jobs 2` ≥ 1.7x faster than `--jobs 1` on {j['runs']} small runs "
                     f"(bench_scan_jobs.py, {j['measured']}, load {j['load_before']:.1f}) | "
                     f"{j['speedup']:.2f}x ({j['jobs1_s']:.0f} s → {j['jobs2_s']:.0f} s) | {verdict(j['speedup'] >= 1.7)} |")
    for kind in ("kineto", "nsys"):
        for what in ("ours: ingest + all rules", "ours: rules on stored run"):
            pts = [(sc, _get(results, kind, sc, what)) for sc in sorted(scales)]
            pts = [(sc, r) for sc, r in pts if r]
            if len(pts) < 2:
                continue
            # Worst step: a fixed cost can hide a quadratic part over the whole range.
            steps = [(b[1]["work_s"] / a[1]["work_s"]) / (b[0] / a[0]) for a, b in zip(pts, pts[1:])]
            (s0, r0), (s1, r1) = pts[0], pts[-1]
            lines.append(f"| {kind}, {what[6:]}: time linear in input ({s0}x→{s1}x) | grew "
                         f"{r1['work_s'] / r0['work_s']:.1f}x for {s1 / s0:.0f}x input; worst step "
                         f"{max(steps):.2f}x of linear | {verdict(max(steps) <= 1.25)} |")
        pts = [(sc, _get(results, kind, sc, "ours: ingest + all rules")) for sc in sorted(scales)]
        pts = [(sc, r) for sc, r in pts if r]
        if len(pts) >= 2:
            # Bounded by the largest table: from the smallest to the largest input, the peak
            # grows by at most twice what the largest table grows (the table, and its copy
            # into the store), whatever the file does. The fixed cost (interpreter, DuckDB,
            # pandas) is in both peaks and cancels out.
            (s0, r0), (s1, r1) = pts[0], pts[-1]
            big0, big1 = (max((v[1] for v in r.get("tables", {}).values()), default=0) for r in (r0, r1))
            if big0 and big1 > big0:
                grew = r1["peak_bytes"] - r0["peak_bytes"]
                lines.append(f"| {kind}, ingest + all rules: memory bounded by the largest table, not the file "
                             f"({s0}x→{s1}x: peak growth ≤ 2x the largest table's) | peak {r0['peak_bytes'] / 1e6:,.0f} → "
                             f"{r1['peak_bytes'] / 1e6:,.0f} MB: +{grew / 1e6:,.0f} MB for +{(big1 - big0) / 1e6:,.0f} MB "
                             f"of largest table ({grew / (big1 - big0):.1f}x) and +{(r1['input_bytes'] - r0['input_bytes']) / 1e6:,.0f} "
                             f"MB of file | {verdict(grew <= 2 * (big1 - big0))} |")
    return lines


def write_doc(results: list, info: dict, scales: list[int], argv: list[str], notes: str) -> None:
    out = ["# Performance", "",
           "Generated by `python bench/bench_peers.py` (do not edit the tables by hand; rerun it). "
           "Inputs are grown from real traces by `bench/gen_big.py` (see its docstring).", "",
           f"Measured {info['date']} on {info['cpu']}, {info['cores']} cores, {info['ram_gb']} GB RAM, "
           f"{info['os']}; Python {info['python']}, DuckDB {info['duckdb']}, pyarrow {info['pyarrow']}, "
           f"msgspec {info['msgspec']}; peers: {info.get('peers', 'not run')}. Load average at start: "
           f"{', '.join(f'{x:.1f}' for x in info['load_avg_start'])}."
           + "".join(f" The {k} rows are from an earlier run ({d}, `--keep-others`)." for k, d in
                     sorted(info.get("kept", {}).items())), "",
           "**The machine is shared** (other jobs ran during these measurements): absolute seconds are "
           "noisy; ratios within one run are what counts. Each cell is a run in a fresh process (the "
           "median of 3 for the cells a target reads, see *What is timed*): work seconds (the tool's imports included, interpreter start-up not) / peak resident memory "
           "of that process and its children together (sampled every 20 ms).", "",
           f"Command: `python bench/bench_peers.py {' '.join(argv)}`".rstrip() + "", "",
           "## Targets (largest size measured)", "", "| target | measured | |", "|---|---|---|",
           *targets(results, scales), ""]
    for kind, title in (("kineto", "Kineto JSON"), ("nsys", "nsys SQLite")):
        rs = [r for r in results if r["kind"] == kind]
        if not rs:
            continue
        sizes = {r["scale"]: r["input_bytes"] for r in rs}
        whats = list(dict.fromkeys(r["what"] for r in rs))
        cols = sorted(sizes)
        out += [f"## {title}: time / peak memory, 1x to 8x", "",
                "| | " + " | ".join(f"{s}x ({sizes[s] / 1e6:,.0f} MB)" for s in cols) + " |",
                "|---|" + "---|" * len(cols)]
        for what in whats:
            cells = []
            for s in cols:
                r = next((x for x in rs if x["scale"] == s and x["what"] == what), None)
                cells.append("—" if r is None else (f"error: {r['error'][:60]}" if "error" in r else _fmt_cell(r)))
            out.append(f"| {what} | " + " | ".join(cells) + " |")
        ours = [x for x in rs if x["what"] == "ours: ingest + all rules" and "error" not in x]
        if ours:
            out += ["", "Ours split: " + "; ".join(
                f"{x['scale']}x ingest {x['ingest_s']:.2f} s + rules {x['rules_s']:.2f} s" for x in ours) + "."]
            top = ours[-1]
            if top.get("tables"):
                out += ["", f"Tables at {top['scale']}x (rows, Arrow MB): " + ", ".join(
                    f"{t} {n:,} / {b / 1e6:,.0f}" for t, (n, b) in
                    sorted(top["tables"].items(), key=lambda kv: -kv[1][1])) + "."]
        out.append("")
    out += ["## Notes", "", notes.strip(), ""]
    DOC.write_text("\n".join(out))


NOTES = """
**Inputs** (`bench/gen_big.py`). Kineto: the real 56 MB H100 trace
`TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz` (132 k events, 4 330 kernels,
python_function stacks, memory events) repeated 1-8 times, each copy shifted in time and in every
linking id, written with PyTorch's 2-space indentation (whitespace is a third of a real trace's
bytes). nsys: the real 2-GPU H100 export `nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite` (schema
3.25.0, nsys-ai's own fixture): its CREATE TABLE text and rows copied, and the kernel, runtime,
memcpy, memset and sync tables repeated in SQL with shifted times and correlation ids; 1x = 625 k
kernels (1.05 M runtime calls), 8x = 5.0 M kernels (8.4 M runtime calls, 1.3 M copies). NVTX,
strings and devices are not repeated. `python bench/gen_big.py nsys --kernels 1000000` writes the
1 M-kernel export; the table uses powers of two from 625 k so that 8x is the 5 M target.

**What is timed.** Ours: `Store(path).ingest(file)` into a new DuckDB file (hashing, reading,
writing) plus `run_rules` with every rule, and again `run_rules` alone on the stored run (the warm
path). A run of 200 k GPU operations or more keeps its per-run cache (the islands, `stream_ops`, `kernel_launches`)
in the store from its first rules pass (`views.KEEP_MIN_GPU_OPS`), as nsys-ai keeps its Parquet
cache, and the warm pass reads it: the nsys runs here (0.8-6.3 M operations) do, the Kineto runs
(at most 41 k) do not. HTA: `TraceAnalysis(trace_dir=...)` (parse plus its per-rank preprocessing; nothing else).
nsys-ai: `nsys-ai skill run gpu_idle_gaps` on a fresh copy of the export (this builds its Parquet
cache first, as the first command on any profile does), then, with the cache warm, the four skills
that match our nsys rules (gpu_idle_gaps, memory_transfers, sync_cost_analysis,
kernel_launch_overhead) in one process. Bare decode: the whole file into Python objects (json,
orjson, msgspec), msgspec decoding only the 8 event fields the reader uses (args left raw: the
fastest decode found), and for SQLite the reader's columns of every activity table plus StringIds
as Python rows (sqlite3 + fetchmany), as Arrow built from those rows, and as Arrow from the ADBC
SQLite driver. Every cell a target reads (ours, HTA, nsys-ai, the typed and the ADBC decodes) is
run 3 times (`--repeat`) and the median run is shown, its time and its peak memory; all three
times are in `bench/data/peers.json` (`runs_s`). Ours and the peer run in rounds (ours, the peer,
ours, the peer, ...), so a burst of load on the shared host slows one round of both rather than
all the runs of one. The other decodes (context) are one run each.

**Peers, as installed here.** `HolisticTraceAnalysis==0.5.0` needs `pandas<3` (its current PyPI
name is `traceinsight`, 0.6.1; not used). `nsys-ai==0.3.0` reads SQLite through DuckDB's
`sqlite_scanner`; offline that only works with `duckdb==1.5.5` plus the
`duckdb-extension-sqlite-scanner==1.5.5` wheel, whose extension file this script `INSTALL`s into
DuckDB's extension folder under `bench/data/venvs/nsys-ai-home` (nsys-ai runs with that HOME).
Without it nsys-ai falls back to sqlite3 and writes indexes into the export, so it always gets a
copy. That fallback is measured once per size as context (`nsys-ai, sqlite3 fallback`, HOME
without the extension): it builds no cache and answers gaps from the export itself, slower and
leaner. Both live in their own virtual environments under `bench/data/venvs`, made by this script.

**How we got here.** The first measurement (2026-11-29, loaded machine) had nsys 8x at 214 s /
14.3 GB for ingest + rules, 303 s for rules alone, and Kineto 8x at 7.5 s / 1,156 MB. The next
(2026-11-30 01:17) had nsys 8x at 41.6 s / 6.7 GB (rules alone 29.4 s) and Kineto 8x at 4.08 s /
536 MB. Changes, each checked to store identical rows and findings on all real and fixture traces
(`bench/equivalence.py` for tables, a findings diff for rules):
* Quadratic joins removed. DuckDB runs "interval overlaps interval" as a piecewise-merge or
  inequality join; on long runs that is quadratic. T001, T002, T004 host-bound and T007
  exposed-communication now read "how much of [a, b] was busy/idle" as the difference of two
  running totals, each found by an ASOF join.
* Shared work done once per run: `views.scoped_to_run` materializes, for the run being checked,
  the busy/idle views and two more: `stream_ops` (every GPU operation in stream order with the
  previous one's fields: the sort T001 and S002 both needed) and `kernel_names` (an integer key
  per distinct kernel name). The cached tables carry no run_id column (a string per row to sort
  and store); idle gaps come out of the islands pass instead of another sort.
* Per rule at 5 M kernels (rules on the stored run, 20.5 s -> 12.2 s in one back-to-back
  comparison): T001 4.3 -> 1.2 s (one ASOF join per gap end, top gaps by bounded `arg_max`,
  device-wide work only on multi-stream devices), S001 2.4 -> 1.0 s (launches grouped by integer
  grid/block, the shape text printed once per group), T004 2.3 -> 0.8 s (calls that cannot touch
  an idle stretch dropped before its ASOF joins: 8.4 M -> 333 k), S002 3.3 -> 2.4 s, T002 2.9 ->
  2.0 s, T003/T006 (the "first busy interval after t" lookup prunes to blocks of 64 intervals
  before joining). Name patterns are matched once per distinct name; B003 parses GEMM shapes once
  per distinct shape; M001 finds peaks with aggregates instead of window sorts.
* Determinism: S002 sums doubles in a fixed order and T002 takes its worst copy from one
  `arg_max` with an id tie-break (both used to vary between runs in the last digits / the
  example copy).
* nsys ingest: fetches run on 2-3 threads (ADBC releases the GIL); names stay StringIds ids
  through the joins and become dictionary-encoded columns of only the strings used; rows are
  ordered in numpy; source columns are freed as outputs are built; the store inserts dictionary
  strings as they are, with run_id as a constant; the file is hashed while it is parsed.
* Kineto ingest: `traceEvents` is decoded in 4 MB chunks (`kineto_stream.py`; anything unusual
  falls back to the whole-file decode, which gives the exact old result or error), columns are
  kept per category with Arrow and numpy (`kineto_collect.py`), tables built once at the end
  (`kineto_tables.py`). A plain file of 64 MB or more is read by two processes
  (`kineto_split.py`): a helper interpreter reads from an event boundary 58% into the file and
  sends its columns back as JSON + Arrow IPC (`kineto_wire.py`); the main process proves the
  boundary by decoding its own last events up to it, and anything odd is read again in one pass.
  On the 404 MB file the read goes from ~1.95 s to ~1.4 s; the peak memory column is the whole
  process tree (the helper included), sampled every 20 ms.
* Later the same day (Kineto 8x ingest + rules 3.11 s -> 2.75 s, median of A/B runs): the content
  hash is XXH3-128 instead of SHA-256 (it ran on a thread beside the two reading processes and
  cost ~0.25 s at Kineto 8x, ~0.7 s of CPU at nsys 8x; a store begun with SHA-256 keeps it); the
  rules' modules and pandas are imported on a thread while DuckDB stores the run, as DuckDB lets
  go of the GIL (`traceanalyzer/prefetch.py`; the engine no longer imports pandas up front); and
  a run's rules are spread over two threads, two DuckDB cursors reading the per-run cache from an
  attached in-memory database, on runs of up to 1 M GPU operations (above that each query keeps
  both cores busy already, and two at once cost 0.9 GB more at 5 M kernels for 3%). Tried and
  dropped: decoding every event's args in the first pass into one struct of all args fields
  (reads 15% slower: building args for the python_function events that no table reads costs
  more than the second decode it saves).
* Memory between a run's steps (2026-11-30, `traceanalyzer/memory.py`): after storing the 5 M-kernel
  run the process held 2.4 GB with no Arrow data alive (Arrow's mimalloc pool and glibc's malloc
  both keep freed memory, which DuckDB's own allocator cannot reuse), and the rules then peaked
  at 5.6 GB. A big run's freed tables are now handed back (`release_unused()` on Arrow's pool,
  `malloc_trim`) before the rules, and the per-run cache keeps the idle gaps as a view over the
  cached islands instead of a copy (250 MB at 5 M kernels): 0.5 GB held after the store, 3.5 GB
  at the peak, the same findings. Tried and dropped: Arrow on the system allocator (the same
  memory, but fresh page faults for every large buffer), and compressing the cache (a
  CHECKPOINT of its in-memory database: -1.1 GB at the peak, +2.2 s).
* Kept per-run cache and bounded heaps (2026-11-30, fifth session). The first rules pass on a run
  of 200 k GPU operations or more builds the per-run cache into the store (`_ta_kept_<run_id>_*`
  tables, versioned with the cache's SQL and the run's ingest, dropped with the run), kernel islands
  and the run-wide idle gaps included (T002 and T004 each sorted every operation themselves);
  later passes, read-only ones too, read it. The evidence's
  worst-N lists come from bounded `arg_max(x, key, n)` heaps instead of a sorted list of every row
  per group (T001, T002, T004, T006, S002), and S002 names a chain by its first kernel's `seq`, so
  its long chains are a filter on last kernels rather than a group and a join back. At 5 M kernels,
  back to back: the warm pass 13.4 -> 6.5-7 s (T004 0.7 -> 0.3 s of that), the first pass (which now also writes the cache,
  ~+1 s) 14.9 -> 13.6 s, the rules' peak memory 3.4 -> 2.1 GB (the cache is on disk, not held);
  the store grows by 349 MB (55 bytes per GPU operation). The same findings and outcomes on every
  real and fixture trace, with the cache kept and not. Tried and dropped: the device and kernel
  islands in one window pass with FILTERed aggregates (slower: DuckDB evaluates each window
  expression on its own, and `lead(... IGNORE NULLS)` took 65 s on 0.8 M rows), and the rules of a
  big run on two threads again (no faster).
* The warm pass at 5 M kernels (2026-11-30, sixth session; A/B back to back 6.3-6.5 s -> 4.5-4.8 s
  of rules, findings identical on every real and fixture trace, kept and not): S001 reads the
  launches from `kernel_launches`, a new per-run cached view (every kernel with its launch call,
  joined once per run: 2.4 M of 5 M kernels against 8.4 M calls) and groups by name key, 0.9 ->
  0.4 s; S002 takes `threads` and `external_id` from `stream_ops` instead of a join of its chains
  with the kernels table, 1.8 -> 1.5 s; T001's ASOF joins sort narrow probes that are joined back by
  (device, stream, seq), copies with end before start are one join instead of a correlated EXISTS
  per gap (DuckDB decorrelated it into a join over every gap), and a device with one stream needs
  no copy lookup (every copy is then one of the gap's own stream's operations), 1.2 -> 0.7 s; T002
  probes only copies a kernel can overlap (not those on a device's only kernel stream whose
  records never overlap), 0.7 -> 0.22 s; T003 groups only the blocking calls' GPU records, 0.4 ->
  0.17 s; T006 reads copies once per part (its CTE not materialized), 0.37 -> 0.32 s; the twenty
  applies checks ask EXISTS instead of counting rows, 0.2 -> 0.04 s; and the
  rule modules no longer import pandas, which `run_rules` imports on a thread while its first
  queries run (loading the rules 0.19 -> 0.035 s). The first pass also builds `kernel_launches`
  (~+0.8 s, ~+40 MB in the store at 5 M kernels). Tried and dropped: one window over a single
  BIGINT key instead of S002's (device, stream) partitions (20% faster alone, lost in the rule),
  the two lookups of T004's prefilter as one key, and a big run's light rules on two threads.
* The nsys reader streams into the store (2026-11-30, seventh session; 5 M kernels, A/B back to
  back: ingest 3.2-3.4 GB -> 1.42 GB at its peak, 18.6-20.7 s -> 18.6-20.2 s; every table and
  finding identical on every real and fixture trace and on the 625 k-kernel export, read whole and
  in parts). `Store.ingest` hands the reader a `RunWriter` (a TableSink) that inserts each table,
  part by part, inside the run's one transaction (begun at the first part, once the file's hash
  gives the run id; a failure rolls all of it back). Kernels and copies are read from the file as
  an ADBC stream, a few batches ahead, and built in parts of 512 k rows (an export with them out of
  start order, or a stream that fails, drops what it stored of that table and reads it whole; no
  real export seen so far needs that); runtime calls are sorted whole but stored in parts. Two
  things were needed besides: DuckDB keeps an Arrow table registered for an INSERT alive until the
  transaction ends, so inserts hand it batches it lets go of; and GPU rows find their call with a
  binary search over the calls' sorted (process, correlation id) keys (`nsys_arrow.CallIndex`)
  instead of a hash join per part (10 parts of kernels each probing 8.4 M calls cost 3.0 s; 0.95 s
  now; the join stays for files that repeat a key). Runtime calls are fetched as two rowid halves
  on two threads, which pays for the parts. Freed memory is handed back between steps (Arrow's
  pool and malloc keep it otherwise; ~10 ms a time).
* The first rules pass in bounded memory (2026-11-30, eighth session; 5 M kernels, back to back:
  its peak 2.0-2.1 GB -> 1.3-1.45 GB, the same findings and outcomes on every real and fixture
  trace, with the cache kept and not, and the same kept tables at 5 M kernels). Three changes:
  `stream_ops` and `kernel_launches` are built into the cache in slices of ~1 M operations by
  start time (`views._build_in_slices`; each slice of `stream_ops` is its own window, going on
  from each stream's last row of the slices before, and the slice bounds are written so DuckDB
  skips other row groups by their zone maps): the two builds took 1.9 GB above the process at
  once, ~0.65 GB in slices, in the same time within the noise. S002's chain window carries only
  the keys (device, stream, seq, whether a kernel continues a chain) and the chains' kernels are
  picked out afterwards by position with a hash join: DuckDB's peak for the rule 1.28 -> 0.82 GB,
  at the same speed. And the pass that has just built a big run's kept cache cuts DuckDB's buffer
  pool to 256 MB before each rule (`Store.drop_cached_blocks`): it held every freshly written
  cache block and each rule's reads on top (1.6-1.75 GB -> 1.4 GB; 0.5-1.2 s of a 14-15 s pass
  to read blocks again from the file; later passes keep theirs). With these, a 1 GB cap
  (`TRACEANALYZER_MEMORY_LIMIT`) costs the first pass ~0.5 s instead of ~4 s. Tried and dropped:
  slices of 500 k (+1.2 s for 0.15 GB less), DuckDB's `operator_memory_limit`, its allocator flush
  thresholds, and emptying the pool once after the build only (1.56 GB). Also `scan` now reads an
  nsys export of 256 MB or more in its writer (streamed, as `ingest`) instead of a worker: at
  5 M kernels 121 s and 12.8 GB (process tree) -> 44 s and 1.4 GB (docs/scan.md).
* The warm pass again (2026-11-30, ninth session; 5 M kernels, each rule old against new in one
  process, 5 alternated runs each, medians; findings and outcomes identical on every real and
  fixture trace). S002 2.16 -> 1.52 s (CPU 4.1 -> 2.8 s): chains are found from their bounds (the
  element-wise kernels that start one and the operations right after one that stop it: 1.8 M rows
  instead of the 4 M element-wise kernels) with one `lead()` over those rows, and chains group by
  two 64-bit hashes of their kernels' (position, name key) instead of a list of names per chain;
  the kernel lists are built only for the few chains a finding shows. S001 0.42 -> 0.33 s: the
  first call per shape by one 128-bit integer key (start, id) instead of a tuple
  (`rules.base.pair_key`; its grouping 0.39 -> 0.13 s). T004 0.52 -> 0.45 s: its prefilter looks
  both end buckets of a host event up by their sum, one hash probe per event instead of two (the
  sixth session's one-key try did not pay; this one does). T006 0.50 -> 0.47 s (`pair_key`). T001
  0.99 -> 0.88 s (9 runs each): one aggregate per stream over the classified gaps gives the totals,
  the gaps per cause and the listed heap, so those 0.8 M rows are read once instead of being kept
  for three readers, and the streams' spans are joined after it instead of to every gap. The
  whole warm pass, alternated with the session's start (before the T001 change): 6.8-7.1 s ->
  6.0-6.3 s on a busy host.
  Tried and dropped: asking for the runs' formats without a list parameter (a Python list makes
  DuckDB wait for the pandas import on the other thread; without it the import shares the two
  cores with the first rule instead: no faster), S002's chain members by an ASOF join (slower
  than the hash join on positions), `pair_key` in T001 (2%, within the noise), and decoding each
  Kineto chunk in place instead of copying it between brackets (no faster).
* `scan --jobs 2` against `--jobs 1` on 200 small runs: 2.11x on 2026-12-01 at 03:39 (80.3 s -> 38.1 s, the
  thirteenth session's code, from 33 source traces); 2.08x at 02:34 (78.7 s -> 37.9 s, on
  the twelfth session's quieter host, after a run and its findings became one transaction and a new
  run's write stopped deleting its id from every table); 2.13x at 22:32 (89.1 s -> 41.9 s), with every change below;
  2.09x at 22:12 (100.9 s -> 48.2 s) before the scratch store was replaced (bench/bench_scan_jobs.py,
  quoted in the targets table). The eleventh session found the scan's writer (this process) using
  19.9 s of CPU at `--jobs 2` (200 runs, 56 s), a third process on two cores: the last pass, of
  the cross-run rules alone, built every run's per-run cache (views.scoped_to_run) just to ask
  each run whether it had their data. It no longer does (9.0 s of CPU; the wall 56 -> 42 s in
  that script). Before: 1.73x at 21:35 (102 s -> 59 s) and 1.74x at 21:40 for the tenth
  session's code (from 33 source traces, ../shared not being beside that checkout); 1.91x at
  19:28 (128 s -> 67 s) on a busier host. A worker's scratch store is now also replaced once it
  has held 200 k rows: an in-memory DuckDB table keeps its deleted rows, so it grew by every run
  it had checked (40 checks of a 124 KB trace: 6 -> 68 MB) and the rules scanned them. And with
  one read CPU (`--jobs 1`, or workers sharing the cores) the nsys reader fetches in its own
  thread, no fetch or stream threads. Since the tenth session `--jobs N`
  is the CPUs the scan uses: `--jobs 1` is serial (one process, one DuckDB thread, one read
  process), `--jobs 2` two one-thread workers; fewer files than N get workers with more threads
  each, and one worker works in the scan's own process on all N (docs/scan.md). Before, `--jobs
  1` ran its rules on two threads and kept ~1.3 cores busy: 64 s -> 42 s, 1.51x, and 1.48x on
  a busier host (1.94x at 00:53, before a run's rules had two threads). The 19:28 run met a host
  ~30% slower than that of 07:48 (`--jobs 2`, whose work did not change: 67 s against 51 s).

**Where we still miss, and why.** The runs above met a shared host (see the load averages).
Runs at 07:06-07:49 met a busier one: against quiet runs (05:16-05:38) ours was 30-45% slower
there and the single-process work (the typed decode, HTA) 0-25% slower, mostly in start-up and
file work (the Kineto read's helper process handed its half over 0.3-0.55 s late instead of
~0.15 s); alternated A/B runs of old and new code gave equal times, so that was the machine.
Ratios between two tools of the same round are what to read. The runs at 17:34-18:56 met a
busier host than those at 16:00-16:26: nsys-ai's cache build 28.2-31.9 s against 24.6 s, HTA
34.5-37.0 s against 27.3 s, the typed decode 1.76-1.82 s against 1.55 s.
* Kineto, 10x faster than HTA: **met** in the thirteenth session (2026-12-01), 10.2x at 03:13
  (2.53 s against 25.8 s; rounds 2.45, 2.53, 2.72 s against HTA's 25.4-26.3 s) and 10.3x at 03:24
  (2.64 s against 27.2 s; rounds 2.49-2.83 s), the typed decode 1.7x and 1.8x. A thin margin: a
  busier host has slowed ours more than HTA before. Two changes to the split read: (1) the helper
  hands its part over in an unnamed temporary file, not a pipe. Through the pipe (64 KiB and a
  process switch at a time) the 35 MB of the 8x trace took 0.18-0.2 s to read, all of it after
  this process had read its own part: the helper's result came 0.22-0.27 s after that part
  whatever the split point (0.54 to 0.68 tried), so it was the transfer, not the helper's speed.
  From the file: 0.03 s (the result 0.08-0.11 s, the helper's exit included). (2) pyarrow's
  pandas import (at the first `pa.array`, ~0.15-0.2 s) is kept out of the read
  (`prefetch.pandas_deferred`: refused to the reading thread only, imported on a thread once this
  process's part is read, and pyarrow's pandas check re-armed by converting an empty table): with
  the file, 10 alternated runs 2.445 -> 2.394 s median (the eleventh session tried it with the
  pipe: ~0.1 s net, nothing clear in alternated runs). Against the twelfth session's code, 8
  alternated runs each: 2.69 -> 2.59 s (pandas alone), 3.30 -> 3.01 s (both; a busier moment).
  The twelfth session's open question, why its rounds after the peers were slower: ours measured
  right after a 15 s sleep, a 1.8 GB process, a CPU-bound one or one touching 1.8 GB, three rounds
  of each: 2.55-3.55 s with no pattern. The host's noise, not the peers.
* Kineto, 10x faster than HTA (twelfth session, 2026-12-01, a fresh and quieter host): 8.8x at 02:29 (2.89 s
  against 25.5 s) and 8.9x at 00:06 (2.83 s against 25.2 s), with the typed decode 1.7x and 2.0x. The three
  rounds at 02:29 were 2.26, 2.89 and 3.06 s: the first round (10.6x its HTA run) came before any HTA
  or decode process, the later ones after those multi-GB processes. Ours run alone here: 2.32-2.46 s
  as bare children (`--child ours`), 2.43-2.69 s through `measure()` with or without the memory
  sampler. Not found why the rounds after the peers are slower; that is the next thing to look at.
  Changed in that session: the rule threads' cursors are set up while the run's cache is built
  (~20 ms), M001 finds what is live at the peak without a window sort (~20 ms at 8x); the rules
  pass 0.52 -> 0.47-0.49 s. Measured: DuckDB's optimizer and binder are about half of each
  rule's time at 8x (T006 37 ms, 10 of it execution), and dictionary-encoded strings, no
  compression, one DuckDB thread or no insertion order made the 0.2 s insert + 0.12 s commit no faster.
* Kineto, 10x faster than HTA: 8.2x at 21:14 (3.77 s against 31.1 s; ingest 2.69 s, rules 0.80 s;
  the eleventh session's start, no Kineto code changed since), 8.1x at 20:19 (3.60 s against 29.1 s; ingest 2.52 s, rules 0.87 s)
  with the split read's helper no longer importing pandas: pyarrow imported it on the helper's
  first `pa.array`, 0.22-0.33 s of its start (helper alone, 8 alternated runs: median 1.95 ->
  1.55 s; ingest + rules in 12 alternated fresh processes: 3.58 -> 3.42 s median; the tree's
  peak 511 -> 476 MB). This process still imports pandas on its own first `pa.array`, during
  its part of the read (GIL-bound, so no thread can hide it there). Refusing pandas to the
  reading thread and importing it on the prefetch thread during the insert instead (tried, not
  kept): the read ended ~0.3 s sooner, but the insert took 0.15-0.25 s longer (DuckDB's insert
  keeps both cores busy), ~0.1 s net in 5 paired runs and nothing clear in 10-12 alternated
  ones: not worth an import hook and pyarrow's private pandas shim. With the helper quicker,
  a split at 0.52 was no better than at 0.58 (12 alternated runs). A helper that takes over
  the end of the other's part when one is done first (tried, not kept): no gain in 6
  alternated reads (medians 1.83 against 1.88 s); the helper was 87-100% through the file
  when this process ended its part. 8.6x at 19:39 (3.34 s against 28.8 s) and 7.8x at 19:16 (4.12 s
  against 32.3 s), with no Kineto code changed since 16:26 (the tenth session's); the 19:39 run with
  the bench's memory sampler fixed: it read every process's stat every 20 ms, ~2 ms of a core a
  sample, ~10% of the second core that ours uses and a one-process tool leaves idle (now 0.26 ms).
  Ours at 19:39: ingest 2.37 s, rules 0.77 s. 8.0x at 18:14 (4.30 s against 34.5 s) and 8.7x at 17:58 (4.27 s
  against 37.0 s), on that busier host, which slowed ours more (~40%, the two-process read most:
  ingest 3.1 s against 2.2 s) than HTA (~30%); 9.1x at 16:26 (3.01 s against 27.3 s), 8.6x at
  13:40 (3.37 s against 29.0 s) and 9.0x at 11:16; 8.1x, 9.8x, 10.0x, 7.8x, 8.8x and 7.6x in runs earlier today (median
  of 3 each), ours 2.5-2.7 s on a quiet run against HTA's 25.7-26.4 s. On the line, and decided by
  the host's load: ours is two processes reading, then two rule threads, where HTA is one
  process. Where ours goes on a quiet run: imports ~0.2 s, the split read ~1.35 s (pandas's
  import, ~0.3 s, inside it), the store's insert and commit ~0.4 s (the rules' modules are
  imported meanwhile), tables ~0.1 s,
  rules ~0.5 s. The ninth session changed no Kineto code and only rules that take little time on
  a Kineto run: alternated runs of its start and its end on the 8x trace, 3.92-4.26 s against
  4.07-4.49 s (ingest, whose code did not change, varied most). Still to try: the helper
  interpreter takes ~0.35 s to start (pyarrow's import ~0.13 s of it) before it reads; a forked
  helper would start at once, but its pages shared with this process would count twice in the
  process tree's resident memory that the memory target reads.
  Measured and dropped in the eleventh session: (1) decoding the events of categories no table
  reads (python_function and ac2g: 60% of the 8x trace's 1.06 M events) into a tagged-union
  Struct with only `ph` and `ts` (what the reader samples from every event): the decode of a 100
  MB trace 0.168 -> 0.137 s (0.121 s with no fields), ~0.12 s of CPU at 8x over both processes,
  but a wrong-typed `pid` or `name` in such an event would then be accepted where the whole-file
  decode, the reference, refuses the file; an unknown category would send its chunk back to the
  plain decode. Not worth a second meaning of "a valid trace". (2) The ingest's commit without
  its checkpoint (~0.12 s), run on another cursor during the rules instead: no faster (the rules
  keep ~1.5 cores busy). (3) DuckDB's `read_json` over the file (`traceEvents` as a list of
  structs, args as JSON): 4.0 s for the 1x file, against ~0.7 s. (4) One query for the twenty
  rules' applies checks instead of twenty: no faster (DuckDB plans each subquery as before).
  Where a quiet 8x run went (21:0x): imports 0.24 s, the split read 1.85 s (this process's part;
  the helper's columns came 0.1 s later), the tables 0.13 s, storing 0.46 s (inserts 0.27 s,
  commit 0.13 s), the rules 0.61 s (cache 0.15-0.19 s, then two threads ~1.75 cores busy):
  3.5 s in that run, 2.65-2.76 s minutes earlier with the same code, on the same host.
* Within 2x of the bare typed decode: met, 1.7x at 03:13 and 1.8x at 03:24 (thirteenth session), 1.7x at 02:29 and 2.0x at 00:06
  (twelfth); 2.5x at 21:14, 2.3x at 20:19, 2.1x at 19:39 and 2.5x at 19:16 (missed), 2.4x at 18:14 and
  at 17:58, 1.9x at 16:26 (met),
  2.3x at 13:40, 1.9x at 11:16, 2.2x at 10:53 and 2.5x that morning (the decode is one process, and does no start-up or writing, so load
  slows it less than ours).
* nsys, 5x faster than nsys-ai's cache build: cannot be met on this machine class as written. At
  8x, nsys-ai with sqlite_scanner builds its cache in 23-27 s, so 5x is 4.6-5.4 s for reading,
  storing and every rule. Only fetching the columns we need with ADBC, the fastest reader measured
  here (sqlite3 is 2-5x slower; DuckDB's sqlite_scanner has no build for DuckDB 2.x, the wheels
  stop at 1.5.5), takes 10.3-11.5 s on one core: 5.2 s even if split perfectly over both cores,
  before anything is stored. Ours: ingest 17-21 s, then the first rules pass 13.6-16.4 s (~5 s of
  it building the cache that later passes read; 9.4 s of a 14.2 s first pass in a fresh process
  on a quiet host in the eleventh session: device_busy_intervals 2.4 s, kernel_busy_intervals
  1.35 s, run_idle_gaps 0.5 s, stream_ops 3.65 s, kernel_launches 1.1 s, each a sort of 5-6 M
  operations written to the file; with `preserve_insertion_order=false`, 9.2 s); 0.6x at 18:33 (44.1 s against 28.2 s) and 0.7x at
  17:34 (46.1 s against 31.9 s), on a busy host. The issue's own figure for nsys-ai (165 s,
  7.5 GB) is 7x slower than what nsys-ai does here; against 165 s ours (33-42 s) is 3.9-5x.
  nsys-ai without the extension (the context row) builds no cache and answers from the export:
  45-64 s, 2.4 GB at 8x.
* nsys rules on a stored run against nsys-ai's four warm skills: met at 18:33, 0.90x (6.13 s against
  6.85 s, with all of the ninth session's rule changes above), and at 17:34, 0.90x (6.73 s against
  7.52 s, before its T001 change), on a host that slowed both by 15-30% against 16:00; before
  those changes 1.00x at 16:00 (5.28 s against 5.26 s), 1.03x at 15:38, 1.13x
  at 13:23, 1.00x at 12:40 and 0.86x at 11:34. A busy host moves either tool by 10-20% between
  runs, so a 10% margin can still flip. Twenty rules against four queries on a prebuilt cache: the
  four rules that match those skills (T001-T004) take ~2 s with imports. What is left is DuckDB's
  own work on both cores (measured at 17:10-18:30 on the busier host): S002 ~1.5 s (the chains'
  members by a hash join on positions ~0.5 s, their per-chain aggregates ~0.45 s), T001 ~0.9 s,
  T006 ~0.45 s, T004 ~0.45 s, T005 ~0.45 s (kernels grouped by launch configuration, then the
  occupancy calculator per group), S001 ~0.33 s, imports and planning ~0.4 s.
* nsys memory, 1/4 of nsys-ai's: met by default since the eighth session, 0.23 at 18:33 and 17:34
  (1,460 MB against 6,437-6,443 MB), 0.22 at 16:00 (0.34 at 15:38 before that session's last two changes, 0.36
  that morning, 0.90 the day before). The peak is the reader's (~1.4 GB, streamed into the store),
  not the first rules pass. `TRACEANALYZER_MEMORY_LIMIT=1GB` gives the same peak here (45.1 s
  against 44.1 s uncapped at 18:33; ~0.5 s in A/B runs of the first pass).
* "Memory bounded by the largest table", read as: from 1x to 8x the peak grows by at most twice
  what the largest table grows (strings dictionary-encoded, as the readers hold them). nsys:
  +715 MB for +766 MB of kernels table at 18:33 (0.9x, as at 17:34 and 16:00; 1.9x at 15:38 and 2.04x at 13:23, when the
  first rules pass made the peak; 3.4x this morning when the reader held every table).
  Kineto: +123 MB for +12 MB at 03:24 and +145 MB at 03:13 (thirteenth session), +181 MB at 21:14, +158 MB at 20:19 (the helper without pandas), +202 MB at 19:39, +195 MB at 18:14.
  Where the peak is, sampled every 20 ms in the thirteenth session: at 8x this process alone
  while it stores the run (464 MB; while reading it held ~250 MB and the helper ~175 MB), at 4x
  the read (240 + 154 MB), at 1x the store (309 MB, one process). So the growth from 1x to 8x is
  the run's columns and tables (the collected columns hold strings per chunk, 82 MB at 8x for 34
  MB of tables) and DuckDB's copy of them during the insert, not the helper's interpreter as the
  earlier notes had it; at 2x-4x the helper makes the peak. Bounding it by the largest table
  would need a Kineto reader that stores tables in parts as it reads, as the nsys one does.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="kineto,nsys")
    ap.add_argument("--scales", default="1,2,4,8")
    ap.add_argument("--no-peers", action="store_true", help="skip HTA and nsys-ai")
    ap.add_argument("--no-doc", action="store_true", help=f"do not rewrite {DOC.relative_to(ROOT)}")
    ap.add_argument("--doc-only", action="store_true",
                    help="rewrite the doc from the last run's bench/data/peers.json, measuring nothing")
    ap.add_argument("--keep-others", action="store_true",
                    help="keep the saved results of the kinds not measured now (the doc says when each was measured)")
    ap.add_argument("--repeat", type=int, default=REPEAT,
                    help="runs of each cell a target reads; the median run is shown")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1:])
        return
    if a.doc_only:
        saved = json.loads((DATA / "peers.json").read_text())
        results = saved["results"]
        write_doc(results, saved["machine"], sorted({r["scale"] for r in results}), saved.get("argv", []), NOTES)
        print(f"wrote {DOC.relative_to(ROOT)}")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    scales = [int(s) for s in a.scales.split(",")]
    info = machine()
    if not a.no_peers:
        info["peers"] = (f"HolisticTraceAnalysis {package_version(ensure_venv('hta'), 'HolisticTraceAnalysis')}, "
                         f"nsys-ai {package_version(ensure_venv('nsys-ai'), 'nsys-ai')} "
                         f"(duckdb {package_version(ensure_venv('nsys-ai'), 'duckdb')} + sqlite_scanner)")
    kinds = a.kinds.split(",")
    results: list = []
    if a.keep_others and (DATA / "peers.json").exists():
        saved = json.loads((DATA / "peers.json").read_text())
        results = [r for r in saved["results"] if r["kind"] not in kinds]
        kept = {**saved["machine"].get("kept", {}),
                **{k: saved["machine"]["date"] for k in {r["kind"] for r in results}
                   if k not in saved["machine"].get("kept", {})}}
        info["kept"] = {k: d for k, d in kept.items() if k not in kinds}  # measured now: not kept
    for kind in kinds:
        for scale in scales:
            (run_kineto if kind == "kineto" else run_nsys)(scale, not a.no_peers, results, a.repeat)
            # Saved after every size, so that an interrupted run keeps what it measured.
            (DATA / "peers.json").write_text(json.dumps({"machine": info, "argv": sys.argv[1:],
                                                        "results": results}, indent=1, default=str))
    print("\n" + "\n".join(targets(results, scales)))
    if not a.no_doc:
        write_doc(results, info, scales, sys.argv[1:], NOTES)
        print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
