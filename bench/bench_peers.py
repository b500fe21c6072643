"""Ours against the peers, through the commands users run, 1x to 8x input (`python bench/bench_peers.py`).

For each input and size (inputs from `bench/gen_big.py`, under bench/data/):

  dense    Kineto, HTA's df_index_resolver trace repeated (155 k kernels, 339 k runtime calls at 8x)
  dense2   Kineto, HTA's trace_diff test trace repeated the same way (79 k kernels at 8x)
  kineto   Kineto, the owlv2 H100 trace repeated (mostly python_function stacks)
           ours: `traceanalyzer check FILE --store NEW`, then `check` again on that store (the
           rules on a stored run); peer: HTA's `TraceAnalysis(trace_dir=...)` in a fresh process
  nsys     an nsys export grown to 625 k-5 M kernels, NVTX with them
           ours: the same two commands, and the first with TRACEANALYZER_MEMORY_LIMIT=1GB; peer:
           `nsys-ai skill run gpu_idle_gaps` on a fresh copy (builds its Parquet cache, then finds
           gaps), then its four skills that match our rules, a command each, on the warm cache

With `--compare TREE` the two commands of ours also run from another checkout (before/after a
change, in the same rounds). Ours and the peer run in rounds (ours, the peer, ours, the peer,
...: `--repeat`), and the median run of each is shown, so that a burst of load on a shared host
slows one round of both rather than all the runs of one. As detail, one run of the library's
split (`Store.ingest`, then `run_rules`, imports not counted, `--child ours`), and bare decodes
of the file as context (json / msgspec into Python objects, msgspec typed as the reader's first
pass; for SQLite sqlite3 rows, sqlite3 into Arrow, ADBC into Arrow).

Every command is timed by `measure_command`: wall clock, and the peak memory of its whole
process tree (see there). Ours runs with its modules compiled and cached, as an installed
package has them (`bench_env`). The peers live in their own virtual environments under
bench/data/venvs, made here with `python -m venv` + pip. Results go to stdout,
bench/data/peers.json and docs/performance.md (with bench/performance_notes.md after the tables).

    python bench/bench_peers.py --kinds dense,kineto --scales 1,8
    python bench/bench_peers.py --kinds nsys --scales 1,8 --repeat 1
    python bench/bench_peers.py --kinds dense --scales 8 --compare ../before --no-peers
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
# nsys-ai skills that match our rules on an nsys run (gaps, H2D copies, syncs, launch overhead).
NSYS_AI_WARM_SKILLS = ("gpu_idle_gaps", "memory_transfers", "sync_cost_analysis", "kernel_launch_overhead")
KINETO_DECODERS = ("json", "msgspec", "msgspec-typed")
# Kineto inputs (bench/gen_big.py's `--input`) and their names in the doc.
KINETO_INPUTS = {"dense": "dense", "dense2": "trace_diff", "kineto": "owlv2"}
KINETO_TITLES = {"dense": "Kineto, dense (df_index_resolver)", "dense2": "Kineto, dense (trace_diff)",
                 "kineto": "Kineto, owlv2 (python_function stacks)"}
# The targets: a dense Kineto check against HTA's load (speed, share of its peak), the nsys
# check against nsys-ai's cache build, and the rules of a stored nsys run.
DENSE_SPEEDUP, DENSE_PEAK_SHARE = 5, 0.4
NSYS_SPEEDUP, NSYS_PEAK_BYTES, NSYS_STORED_S = 2, 1.5e9, 10
SQLITE_DECODERS = ("sqlite3-rows", "sqlite3-arrow", "adbc-arrow")
NSYS_BASE_KERNELS = 625_000  # 1x; 8x = 5 M kernels
CAPPED_MEMORY = "1GB"  # TRACEANALYZER_MEMORY_LIMIT of the capped nsys row
COMPARED = "ours at "  # the label of a row of another checkout (`--compare`): COMPARED + its folder's name
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


def task_decode_json(method: str, path: str) -> dict:
    data = Path(path).read_bytes()
    if method == "json":
        n = len(json.loads(data)["traceEvents"])
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
    from traceanalyzer.ingest.nsys_sources import SOURCES

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
    "ours": task_ours, "table-sizes": task_table_sizes, "hta": task_hta,
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
        full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
        proc = subprocess.Popen([str(python), str(Path(__file__).resolve()), "--child", task, *map(str, args)],
                                stdout=out, stderr=err, text=True, env=full_env, cwd=ROOT)
        tree_peak = _watch(proc, t0, timeout_s)
        if tree_peak is None:
            return {"error": f"timed out after {timeout_s:.0f} s", "wall_s": time.perf_counter() - t0}
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


def bench_env(**more) -> dict:
    """The environment changes of a measured command: compiled modules cached (under
    bench/data/pycache) as an installed package has them, whatever PYTHONDONTWRITEBYTECODE
    says here (compiling traceanalyzer's sources costs ~0.2 s a process), and `more`."""
    return {"PYTHONDONTWRITEBYTECODE": None, "PYTHONPYCACHEPREFIX": str(DATA / "pycache"), **more}


def measure_command(argv: list[str], *, env: dict | None = None, label: str = "", timeout_s: float = 1800,
                    cwd: Path = ROOT) -> dict:
    """Run a command as a user does (a fresh process, its stdout discarded; `env`: changes to
    this environment, None unsetting a variable); return its wall seconds, exit code and
    peak memory, or an `error`.

    Peak memory is of the whole process tree: the larger of (a) the resident memory of the
    process and all its descendants summed, sampled every 20 ms (what processes running at
    once hold together: our helpers of a Kineto read in parts, HTA's per-rank pool) and (b)
    the exact high-water mark of the largest single process of the tree (which a 20 ms sample
    can miss), as `/usr/bin/time` reports it. (b) alone, which is what `/usr/bin/time -v` or
    `getrusage(RUSAGE_CHILDREN)` give, is the largest process, not the tree. It is taken from
    `/usr/bin/time` rather than from this process's own `wait4`: a child's `ru_maxrss` starts
    from the memory of the process it was forked from, this 100-400 MB one, where `time`'s is
    a few MB."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{label or Path(argv[0]).name}.log".replace("/", "_")
    timer = shutil.which("time", path="/usr/bin")
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    with open(log, "w") as err, tempfile.NamedTemporaryFile("r") as maxrss:
        wrapped = [timer, "-q", "-f", "%M", "-o", maxrss.name, *argv] if timer else argv
        t0 = time.perf_counter()
        proc = subprocess.Popen(wrapped, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                                env=full_env, cwd=cwd)
        tree_peak = _watch(proc, t0, timeout_s)
        if tree_peak is None:
            return {"error": f"timed out after {timeout_s:.0f} s", "wall_s": time.perf_counter() - t0}
        wall = time.perf_counter() - t0
        text = maxrss.read().split()
    largest = int(text[-1]) * 1024 if text and text[-1].isdigit() else 0  # KiB
    rc = proc.returncode
    if rc not in (0, 1):  # 1: the gate failed (findings at --fail-on), a finished check
        tail = [ln for ln in log.read_text().splitlines() if ln.strip()][-1:] or [f"exit {rc}"]
        return {"error": tail[0][:300], "wall_s": wall, "rc": rc, "log": str(log)}
    return {"work_s": wall, "wall_s": wall, "rc": rc, "peak_bytes": max(tree_peak, largest),
            "tree_peak_bytes": tree_peak, "largest_process_bytes": largest}


def _watch(proc: subprocess.Popen, t0: float, timeout_s: float) -> int | None:
    """Wait for `proc`, sampling the resident memory of it and its children together (a helper
    process counts); their peak, or None once it ran past `timeout_s` (then it is killed)."""
    tree_peak = 0
    while proc.poll() is None:
        tree_peak = max(tree_peak, _tree_rss_bytes(proc.pid))
        if time.perf_counter() - t0 > timeout_s:
            proc.kill()
            proc.wait()
            return None
        time.sleep(TREE_SAMPLE_S)
    return tree_peak


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


def _store_path(kind: str, scale: int, tag: str = "") -> Path:
    (DATA / "stores").mkdir(parents=True, exist_ok=True)
    return DATA / "stores" / f"{kind}{tag}_{scale}x.duckdb"


def _fresh(store: Path) -> Path:
    for p in (store, Path(f"{store}.wal")):
        p.unlink(missing_ok=True)
    return store


def _cli(tree: Path | None = None) -> tuple[list[str], Path]:
    """The `traceanalyzer` command of this checkout (or of `tree`, another checkout's root),
    and the folder to run it in (outside this checkout for another, so that it imports its own)."""
    if tree is None:
        return [sys.executable, "-m", "traceanalyzer.cli"], ROOT
    return [sys.executable, "-m", "traceanalyzer.cli"], DATA


def _cli_env(tree: Path | None, **more) -> dict:
    return bench_env(**({"PYTHONPATH": str(tree)} if tree else {}), **more)


def _check_cell(kind: str, scale: int, path: Path, label: str = "ours", tree: Path | None = None,
                env: dict | None = None, stored: bool = True):
    """`traceanalyzer check FILE --store NEW`, then (with `stored`) `check` again on that
    store: the rules on a stored run, as a user runs it the second time."""
    tag = "" if tree is None and not env else f"_{label.replace(' ', '_').replace(',', '').replace('=', '')}"

    def run() -> list[tuple[str, dict]]:
        store = _fresh(_store_path(kind, scale, tag))
        argv, cwd = _cli(tree)
        e = _cli_env(tree, **(env or {}))
        cold = measure_command([*argv, "check", str(path), "--store", str(store)], env=e, cwd=cwd,
                               label=f"{label}_{kind}_{scale}x".replace(" ", "_"))
        rows = [(f"{label}: check (new store)", cold)]
        if stored and "error" not in cold:
            rows.append((f"{label}: check of the stored run", measure_command(
                [*argv, "check", str(path), "--store", str(store)], env=e, cwd=cwd,
                label=f"{label}_stored_{kind}_{scale}x".replace(" ", "_"))))
        return rows
    return run


def _library_split(kind: str, scale: int, path: Path) -> tuple[str, dict]:
    """The library's split of one check (one run, detail): Store.ingest, then run_rules."""
    store = _fresh(_store_path(kind, scale, "_library"))
    r = measure(sys.executable, "ours", path, store, env=bench_env(), label=f"library_{kind}_{scale}x")
    if "error" not in r:
        r["tables"] = measure(sys.executable, "table-sizes", store, r["run_id"], label="sizes").get("tables", {})
    _fresh(store)
    return "library: Store.ingest + run_rules", r


def _report(kind: str, scale: int, size: int, rows: list[tuple[str, dict]], results: list) -> None:
    for what, r in rows:
        print(f"  {what:<48} {_short(r)}", flush=True)
        results.append({"kind": kind, "scale": scale, "input_bytes": size, "what": what,
                        "load_after": round(os.getloadavg()[0], 1), "argv": _shown_argv(sys.argv[1:]), **r})


def _shown_argv(argv: list[str]) -> str:
    """The command that measured a row, as the doc shows it (without `--compare`, `--no-doc`)."""
    shown = [a for i, a in enumerate(argv) if a not in ("--compare", "--no-doc") and argv[i - 1:i] != ["--compare"]]
    return " ".join(["python bench/bench_peers.py", *shown])


def _announce(kind: str, scale: int, path: Path, t0: float) -> int:
    size = path.stat().st_size
    print(f"\n== {kind} {scale}x: {path.relative_to(ROOT)} {size / 1e6:.0f} MB "
          f"(ready in {time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
    return size


def _hta_cell(path: Path, scale: int, kind: str):
    def run() -> list[tuple[str, dict]]:
        python = ensure_venv("hta")
        return [(HTA_ROW, measure_command([str(python), str(Path(__file__).resolve()), "--child", "hta", str(path.parent)],
                                          env={"PYTHONDONTWRITEBYTECODE": None}, label=f"hta_{kind}_{scale}x"))]
    return run


def run_kineto(kind: str, scale: int, opts, results: list) -> None:
    from gen_big import kineto

    t = time.perf_counter()
    path = kineto(scale, KINETO_INPUTS[kind])
    size = _announce(kind, scale, path, t)
    cells = [_check_cell(kind, scale, path)]
    if opts.compare:
        cells.append(_check_cell(kind, scale, path, f"{COMPARED}{opts.compare.name}", tree=opts.compare))
    if opts.peers:
        cells.append(_hta_cell(path, scale, kind))
    rows = interleaved(opts.repeat, cells)
    rows.append(_library_split(kind, scale, path))
    for method in KINETO_DECODERS:  # context, one run each
        rows.append((f"decode: {method}", measure(sys.executable, "decode-json", method, path,
                                                  label=f"decode_{method}_{kind}_{scale}x")))
    _report(kind, scale, size, rows, results)


def run_nsys(kind: str, scale: int, opts, results: list) -> None:
    from gen_big import nsys

    t = time.perf_counter()
    path = nsys(NSYS_BASE_KERNELS * scale)
    size = _announce(kind, scale, path, t)
    cells = [_check_cell(kind, scale, path),
             # The same with DuckDB capped (rules spill instead of growing): the memory a user can ask for.
             _check_cell(kind, scale, path, f"ours, {CAPPED_MEMORY} cap", env={"TRACEANALYZER_MEMORY_LIMIT": CAPPED_MEMORY},
                         stored=False)]
    if opts.compare:
        cells.append(_check_cell(kind, scale, path, f"{COMPARED}{opts.compare.name}", tree=opts.compare))
    if opts.peers:
        cells.append(lambda: _nsys_ai_once(path, scale))
    rows = interleaved(opts.repeat, cells)
    rows.append(_library_split(kind, scale, path))
    for method in SQLITE_DECODERS:  # context, one run each
        rows.append((f"decode: {method}", measure(sys.executable, "decode-sqlite", method, path,
                                                  label=f"decode_{method}_{scale}x")))
    _report(kind, scale, size, rows, results)


def _nsys_ai_once(path: Path, scale: int) -> list[tuple[str, dict]]:
    """nsys-ai's first command on a fresh copy of the export (it builds its Parquet cache, then
    finds gaps), then its four skills that match our nsys rules, a command each, on the warm cache."""
    python = ensure_venv("nsys-ai")
    nsys_ai = str(python.parent / "nsys-ai")
    copy = DATA / "nsys-ai" / path.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(copy.with_suffix(".nsys-cache"), ignore_errors=True)
    shutil.copyfile(path, copy)  # nsys-ai may write into the export; never into ours
    env = {"HOME": str(NSYS_AI_HOME), "PYTHONDONTWRITEBYTECODE": None}
    try:
        cold = measure_command([nsys_ai, "skill", "run", "gpu_idle_gaps", str(copy)], env=env,
                               label=f"nsysai_cold_{scale}x")
        rows = [(NSYS_AI_COLD_ROW, cold)]
        if "error" not in cold:
            warm = [measure_command([nsys_ai, "skill", "run", skill, str(copy)], env=env, label=f"nsysai_{skill}_{scale}x")
                    for skill in NSYS_AI_WARM_SKILLS]
            bad = next((w for w in warm if "error" in w), None)
            rows.append((NSYS_AI_WARM_ROW, bad or {"work_s": sum(w["work_s"] for w in warm),
                                                   "wall_s": sum(w["wall_s"] for w in warm),
                                                   "peak_bytes": max(w["peak_bytes"] for w in warm)}))
    finally:
        copy.unlink(missing_ok=True)
        shutil.rmtree(copy.with_suffix(".nsys-cache"), ignore_errors=True)
    return rows


# -- report --------------------------------------------------------------------------------
HTA_ROW = "HTA: TraceAnalysis load (a fresh process)"
NSYS_AI_COLD_ROW = "nsys-ai: first skill (cache build + gaps)"
NSYS_AI_WARM_ROW = "nsys-ai: 4 skills on the warm cache (4 commands)"
CHECK_ROW = "ours: check (new store)"
STORED_ROW = "ours: check of the stored run"


def _get(results, kind, scale, what):
    return next((r for r in results if r["kind"] == kind and r["scale"] == scale and r["what"] == what
                 and "error" not in r), None)


def _fmt_cell(r: dict | None) -> str:
    return "—" if r is None else f"{r['work_s']:.2f} s / {r['peak_bytes'] / 1e6:,.0f} MB"


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def _compared_tree(row: dict) -> str | None:
    """The name of the other checkout a row measured (`--compare`); None for a row of this one."""
    what = row["what"]
    return what[len(COMPARED):].split(":")[0] if what.startswith(COMPARED) else None


def targets(results: list) -> list[str]:
    """The issue's targets, each at the largest size of its input measured."""
    lines = []
    for kind in ("dense", "dense2", "kineto"):
        scales = sorted({r["scale"] for r in results if r["kind"] == kind})
        if not scales:
            continue
        top = scales[-1]
        ours, hta = _get(results, kind, top, CHECK_ROW), _get(results, kind, top, HTA_ROW)
        if ours and hta:
            speed, mem = hta["work_s"] / ours["work_s"], ours["peak_bytes"] / hta["peak_bytes"]
            goal = kind != "kineto"  # the targets' inputs; the owlv2 trace is context
            name = KINETO_TITLES[kind]
            lines.append(f"| {name} {top}x: `check` ≥ {DENSE_SPEEDUP}x faster than HTA's load | {speed:.1f}x | "
                         f"{_verdict(speed >= DENSE_SPEEDUP) if goal else '(context)'} |")
            lines.append(f"| {name} {top}x: `check` ≤ {DENSE_PEAK_SHARE} of HTA's peak memory | {mem:.2f} of it | "
                         f"{_verdict(mem <= DENSE_PEAK_SHARE) if goal else '(context)'} |")
    scales = sorted({r["scale"] for r in results if r["kind"] == "nsys"})
    if scales:
        top, bottom = scales[-1], scales[0]
        ours, cold = _get(results, "nsys", top, CHECK_ROW), _get(results, "nsys", top, NSYS_AI_COLD_ROW)
        if ours and cold:
            speed, mem = cold["work_s"] / ours["work_s"], ours["peak_bytes"] / cold["peak_bytes"]
            lines.append(f"| nsys {top}x: `check` ≥ {NSYS_SPEEDUP}x faster than nsys-ai's cache build | {speed:.1f}x | "
                         f"{_verdict(speed >= NSYS_SPEEDUP)} |")
            lines.append(f"| nsys {top}x: `check` peak memory against nsys-ai's | {mem:.2f} of it | (context) |")
        if ours:
            gb = ours["peak_bytes"] / 1e9
            lines.append(f"| nsys {top}x: `check` peak ≤ {NSYS_PEAK_BYTES / 1e9:.1f} GB | {gb:.2f} GB | "
                         f"{_verdict(ours['peak_bytes'] <= NSYS_PEAK_BYTES)} |")
            stored = _get(results, "nsys", top, STORED_ROW)
            if stored:
                lines.append(f"| nsys {top}x: rules on the stored run ≤ {NSYS_STORED_S} s | {stored['work_s']:.2f} s | "
                             f"{_verdict(stored['work_s'] <= NSYS_STORED_S)} |")
            base = _get(results, "nsys", bottom, CHECK_ROW)
            if base and bottom != top:
                x = ours["peak_bytes"] / base["peak_bytes"]
                lines.append(f"| nsys {top}x: `check` peak ≤ 2x the {bottom}x peak | {x:.2f}x | {_verdict(x <= 2)} |")
        capped = _get(results, "nsys", top, f"ours, {CAPPED_MEMORY} cap: check (new store)")
        if capped and ours:
            lines.append(f"| nsys {top}x, TRACEANALYZER_MEMORY_LIMIT={CAPPED_MEMORY}: `check` peak | "
                         f"{capped['peak_bytes'] / 1e9:.2f} GB ({capped['work_s']:.1f} s) against "
                         f"{ours['peak_bytes'] / 1e9:.2f} GB uncapped | (context) |")
    for kind in ("dense", "dense2", "kineto", "nsys"):
        for scale in sorted({r["scale"] for r in results if r["kind"] == kind})[-1:]:
            now = _get(results, kind, scale, STORED_ROW)
            then = next((r for r in results if r["kind"] == kind and r["scale"] == scale and "error" not in r
                         and _compared_tree(r) and r["what"].endswith("check of the stored run")), None)
            if now and then:
                x = then["work_s"] / now["work_s"]
                lines.append(f"| {KINETO_TITLES.get(kind, 'nsys')} {scale}x: rules on a stored run ≥ 2x faster than "
                             f"{_compared_tree(then)} | {x:.2f}x ({then['work_s']:.2f} s → {now['work_s']:.2f} s) | "
                             f"{_verdict(x >= 2)} |")
    return lines


def write_doc(results: list, info: dict, argv: list[str], notes: str) -> None:
    """docs/performance.md: today's figures. Rows of another checkout (`--compare`) stay in
    bench/data/peers.json and on stdout; the doc has only the targets read from them."""
    goals = targets(results)
    compared = sorted({_compared_tree(r) for r in results} - {None})
    results = [r for r in results if not _compared_tree(r)]
    commands = list(dict.fromkeys(r.get("argv") or _shown_argv(argv) for r in results))
    out = ["# Performance", "",
           "Tables generated by `python bench/bench_peers.py` (rerun it rather than edit them); inputs "
           "grown from real traces by `bench/gen_big.py`.", "",
           f"Measured {info['date']} on {info['cpu']}, {info['cores']} cores, {info['ram_gb']} GB RAM, "
           f"{info['os']}; Python {info['python']}, DuckDB {info['duckdb']}, pyarrow {info['pyarrow']}, "
           f"msgspec {info['msgspec']}; peers: {info.get('peers', 'not run')}. Load average at start: "
           f"{', '.join(f'{x:.1f}' for x in info['load_avg_start'])}."
           + "".join(f" The {k} rows were measured {d} (kept with `--keep-others`)." for k, d in
                     sorted(info.get("kept", {}).items())), "",
           "**The machine is shared** (other jobs ran during these measurements): absolute seconds are "
           "noisy; ratios within one run are what counts. Each cell is a command run as a user runs it, in "
           "a fresh process: wall seconds (interpreter start-up included) / peak memory of its process "
           "tree (see *What is timed*); the cells of ours and the peers are the median of `--repeat` rounds "
           f"({REPEAT} unless the command says).", "",
           "Commands: " + "; ".join(f"`{c}`" for c in commands) + ".", "",
           "## Targets", "", "| target | measured | |", "|---|---|---|", *goals, ""]
    if compared:
        out += [f"A stored run's rules are timed against a checkout of {', '.join(compared)} in the same rounds "
                "(`--compare TREE`, TREE that checkout): the code before the scale work began.", ""]
    for kind in ("dense", "dense2", "kineto", "nsys"):
        rs = [r for r in results if r["kind"] == kind]
        if not rs:
            continue
        sizes = {r["scale"]: r["input_bytes"] for r in rs}
        whats = list(dict.fromkeys(r["what"] for r in rs))
        cols = sorted(sizes)
        out += [f"## {KINETO_TITLES.get(kind, 'nsys SQLite')}: time / peak memory", "",
                "| | " + " | ".join(f"{s}x ({sizes[s] / 1e6:,.0f} MB)" for s in cols) + " |",
                "|---|" + "---|" * len(cols)]
        for what in whats:
            cells = []
            for s in cols:
                r = next((x for x in rs if x["scale"] == s and x["what"] == what), None)
                cells.append("—" if r is None else (f"error: {r['error'][:60]}" if "error" in r else _fmt_cell(r)))
            out.append(f"| {what} | " + " | ".join(cells) + " |")
        loads = {x["scale"]: x["load_after"] for x in rs if "load_after" in x}
        if loads:
            out += ["", "Host load average (1 min) after each size's rounds: " + ", ".join(
                f"{s}x {loads[s]:.1f}" for s in sorted(loads)) + " (2 cores: above 2, other jobs shared them)."]
        lib = [x for x in rs if x["what"].startswith("library:") and "error" not in x]
        if lib:
            out += ["", "Library split (one run each, imports not counted): " + "; ".join(
                f"{x['scale']}x ingest {x['ingest_s']:.2f} s + rules {x['rules_s']:.2f} s" for x in lib) + "."]
            top = lib[-1]
            if top.get("tables"):
                out += ["", f"Tables at {top['scale']}x (rows, Arrow MB): " + ", ".join(
                    f"{t} {n:,} / {b / 1e6:,.0f}" for t, (n, b) in
                    sorted(top["tables"].items(), key=lambda kv: -kv[1][1])) + "."]
        out.append("")
    out += [notes.strip(), ""]
    DOC.write_text("\n".join(out))


NOTES_FILE = Path(__file__).with_name("performance_notes.md")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="dense,dense2,kineto,nsys", help="dense, dense2 (trace_diff), kineto (the owlv2 trace), nsys")
    ap.add_argument("--scales", default="1,2,4,8")
    ap.add_argument("--no-peers", action="store_true", help="skip HTA and nsys-ai")
    ap.add_argument("--compare", type=Path, metavar="TREE",
                    help="also time `check` of another checkout (the folder that holds its traceanalyzer/)")
    ap.add_argument("--no-doc", action="store_true", help=f"do not rewrite {DOC.relative_to(ROOT)}")
    ap.add_argument("--doc-only", action="store_true",
                    help="rewrite the doc from the last run's bench/data/peers.json, measuring nothing")
    ap.add_argument("--keep-others", action="store_true",
                    help="keep the saved results of the kinds not measured now (the doc says when each was measured)")
    ap.add_argument("--repeat", type=int, default=REPEAT,
                    help="rounds of the cells of ours and the peers; the median run is shown")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1:])
        return
    if a.doc_only:
        saved = json.loads((DATA / "peers.json").read_text())
        write_doc(saved["results"], saved["machine"], saved.get("argv", []), NOTES_FILE.read_text())
        print(f"wrote {DOC.relative_to(ROOT)}")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    a.peers = not a.no_peers
    a.compare = a.compare.resolve() if a.compare else None
    scales = [int(s) for s in a.scales.split(",")]
    info = machine()
    info["repeat"] = a.repeat
    if a.peers:
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
            (run_nsys if kind == "nsys" else run_kineto)(kind, scale, a, results)
            # Saved after every size, so that an interrupted run keeps what it measured.
            (DATA / "peers.json").write_text(json.dumps({"machine": info, "argv": sys.argv[1:],
                                                        "results": results}, indent=1, default=str))
    print("\n" + "\n".join(targets(results)))
    if not a.no_doc:
        write_doc(results, info, sys.argv[1:], NOTES_FILE.read_text())
        print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
