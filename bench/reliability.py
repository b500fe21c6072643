"""Reliability figures for docs/reliability.md: hostile input, resource bombs, concurrent
writers, killed writers. Anyone can run it (it needs ../shared/traces):

    python bench/reliability.py                 # full run (~15 min on 2 cores), rewrites docs/reliability.md
    python bench/reliability.py --quick         # a smaller corpus and fewer kills, prints only

1. Fuzz corpus (fixtures/gen_hostile.py, every class, every seed trace): each case is
   ingested and judged (`gen_hostile.judge`: clean one-line error, or a complete run; never
   a crash, leftover rows or an incomplete run). Then the whole corpus goes through the real
   `traceanalyzer check` in one batch together with the untouched seed traces: one
   `error:` line per refused file, no traceback, every seed trace stored, every rule run on
   every stored run without a rule error, and no byte or mtime of any input changed.
2. Resource bombs, each in its own process with the default limits: time, peak RSS, outcome.
3. Concurrent writers: W processes of the real CLI ingesting distinct files into one store.
4. Kills: SIGKILL inside the transaction, during COMMIT, or at a random moment of a real
   CLI batch; after each the store must open with every earlier run intact and no half run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fixtures import gen_hostile as G  # noqa: E402
from traceanalyzer import input_limits as limits, schema  # noqa: E402
from traceanalyzer.store import Store, file_hash, run_id_for  # noqa: E402

DOC = ROOT / "docs" / "reliability.md"
FIXTURES = ROOT / "fixtures"
FAILURES = ("crash", "partial", "unexpected", "bad-message")
BIG = G.SHARED_TRACES / "nsys" / "Rodinia_Gaussian__report2.sqlite"
ENV = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}


def cli(*args, env=None, **kw) -> list[str]:
    return [sys.executable, "-m", "traceanalyzer.cli", *map(str, args)]


def rss_mb_children() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


# -- 1. fuzz corpus ----------------------------------------------------------------------------------

def _fuzz_task(args) -> dict:
    fmt, name, per_class, seed, out_dir = args
    out = Path(out_dir) / (name if fmt != "-" else "not-a-trace")
    out.mkdir(parents=True, exist_ok=True)
    judge_dir = Path(out_dir).parent / "judge"  # a file store: DuckDB spills instead of growing RSS
    judge_dir.mkdir(exist_ok=True)
    store = Store(judge_dir / f"{out.name}.duckdb")
    if fmt == "-":
        cases = list(G.generic_cases(random.Random(seed), per_class))
        for i, c in enumerate(cases, 1):
            c.name = f"{i:05d}_-_{c.cls}{G._suffix(c)}"
    else:
        cases = G.corpus(G.SHARED_TRACES, per_class, seed, sources={fmt: [name]}, generic=False)
    rows = []
    for c in cases:
        path = out / c.name
        path.write_bytes(c.data)
        o = G.judge(store, path, c)
        rows.append({"name": str(path), "cls": c.cls, "fmt": c.fmt, "source": c.source, "expect": c.expect,
                     "result": o.result, "message": o.message, "seconds": o.seconds, "warnings": o.warnings,
                     "detail": c.detail, "content_hash": file_hash(path)})
    store.close()
    return {"rows": rows, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def fuzz(per_class: int, seed: int, work: Path, jobs: int) -> dict:
    tasks = [("-", "-", per_class, seed, str(work))]
    tasks += [(fmt, name, per_class, seed, str(work)) for fmt, names in G.SOURCES.items() for name in names
              if (G.SHARED_TRACES / fmt / name).exists()]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(jobs) as pool:
        parts = pool.map(_fuzz_task, tasks, chunksize=1)
    rows = [r for p in parts for r in p["rows"]]
    judged_s = time.perf_counter() - t0

    # The same files, plus the untouched seed traces, through the real command in one batch.
    seeds = [G.SHARED_TRACES / fmt / n for fmt, names in G.SOURCES.items() for n in names
             if (G.SHARED_TRACES / fmt / n).exists()]
    before = _snapshot([Path(r["name"]) for r in rows] + seeds)
    db = work / "cli.duckdb"
    t0 = time.perf_counter()
    report = work.parent / "check.json"
    r = subprocess.run(cli("check", work, *seeds, "--store", db, "--format", "json", "-o", report,
                           "--fail-on", "never"), capture_output=True, text=True, env=ENV, cwd=work, timeout=7200)
    rule_status = Counter(o["status"] for run in json.loads(report.read_text())["runs"] for o in run["rules"])
    cli_s = time.perf_counter() - t0
    after = _snapshot([Path(r_["name"]) for r_ in rows] + seeds)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    per_file = Counter(m.group(1) for ln in errors if (m := re.match(r"error: (.+?): ", ln)))
    with Store(db, read_only=True) as s:
        stored = {x for (x,) in s.sql("SELECT content_hash FROM runs").fetchall()}
    judged_ok = {x["content_hash"] for x in rows if x["result"] == "ok"}  # as the store keys runs
    judged_err = {x["name"] for x in rows if x["result"] == "error"}
    return {
        "rows": rows, "judge_seconds": judged_s, "cli_seconds": cli_s,
        "peak_rss_mb": max(p["rss_mb"] for p in parts),
        "cli": {
            "exit": r.returncode, "error_lines": len(errors), "files_with_errors": len(per_file),
            "max_lines_per_file": max(per_file.values(), default=0),
            "tracebacks": r.stderr.count("Traceback"), "internal": r.stderr.count("internal error"),
            "refused_match_judge": judged_err == set(per_file) - {str(p) for p in seeds},
            "ok_cases_stored": len(judged_ok & stored), "ok_cases": len(judged_ok),
            "seeds_stored": sum(file_hash(p) in stored for p in seeds), "seeds": len(seeds),
            "inputs": len(before), "inputs_unchanged": sum(before[k] == after.get(k) for k in before),
            "rule_status": dict(rule_status),
        },
    }


def _snapshot(paths: list[Path]) -> dict[str, tuple]:
    return {str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in paths}


# -- 2. resource bombs ----------------------------------------------------------------------------------

BOMB_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from traceanalyzer.ingest import read_file, TraceError
t0 = time.perf_counter()
try:
    trace = read_file(Path(sys.argv[1]))
    rows = ", ".join(f"{k}={v.num_rows}" for k, v in trace.tables.items() if v.num_rows)
    out = "read: " + (rows or "no rows; " + "; ".join(trace.warnings[:1]))
except TraceError as e:
    out = "error: " + str(e)
# The reader's process plus its largest child (a helper of a Kineto read in parts): an upper
# bound, as the two overlap only in part.
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"seconds": time.perf_counter() - t0, "outcome": out, "rss_mb": rss / 1024}))
"""


def bombs(work: Path, scale: float) -> list[dict]:
    out = []
    for b in [*G.bombs(scale), G.Bomb("many_events.json", "JSON with 3 million small kernel events (a legal, "
                                      "large file, for scale)", "", lambda p: G.many_events_json(p, int(3e6 * scale)),
                                      "-")]:
        path = work / b.name
        b.write(path)
        r = subprocess.run([sys.executable, "-c", BOMB_CHILD, str(path)], capture_output=True, text=True, env=ENV,
                           timeout=1800)
        res = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {
            "seconds": None, "rss_mb": None, "outcome": f"CRASHED rc={r.returncode}: {r.stderr[-300:]}"}
        out.append({"name": b.name, "what": b.what, "size": path.stat().st_size, "claimed": b.claimed,
                    "expect": b.expect, **res})
        path.unlink()
    return out


# -- 3. concurrent writers --------------------------------------------------------------------------------

SMALL = [FIXTURES / "nsys" / "planted.sqlite", FIXTURES / "nsys" / "clean.sqlite",
         FIXTURES / "ncu" / "details_full.csv", FIXTURES / "kineto" / "planted.json"]


def _variants(work: Path, n: int) -> list[Path]:
    """n distinct files (different bytes, same trace): a seed file plus trailing whitespace/zeros."""
    out = []
    for i in range(n):
        src = SMALL[i % len(SMALL)]
        pad = (b"\n" * (i + 1)) if src.suffix in (".json", ".csv") else b"\x00" * (i + 1)
        p = work / f"v{i:03d}{src.suffix}"
        p.write_bytes(src.read_bytes() + pad)
        out.append(p)
    return out


def writers(work: Path, n_writers: int, files_each: int, lock_timeout_s: float) -> dict:
    folder = work / f"writers_{lock_timeout_s:g}"
    folder.mkdir()
    files = _variants(folder, n_writers * files_each)
    db = folder / "s.duckdb"
    script = (
        "import subprocess, sys, time\n"
        "args = sys.argv[1:]; tries = 0\n"
        "while True:\n"
        "    tries += 1\n"
        "    r = subprocess.run(args, capture_output=True, text=True)\n"
        "    locked = 'store is locked' in r.stderr\n"
        "    if r.returncode == 0 or not locked or tries > 50: break\n"
        "    time.sleep(0.2)\n"
        "print(tries, r.returncode, int('Traceback' in r.stderr), int(locked), flush=True)\n")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", script, *cli("ingest", *files[i::n_writers], "--store", db)],
                              stdout=subprocess.PIPE, text=True,
                              env={**ENV, "TRACEANALYZER_LOCK_TIMEOUT_S": str(lock_timeout_s)})
             for i in range(n_writers)]
    outs = [p.communicate(timeout=1800)[0].split() for p in procs]
    seconds = time.perf_counter() - t0
    with Store(db, read_only=True) as s:
        complete = sum(_counts(s, run_id_for(file_hash(f)))["runs"] == 1 for f in files)
    return {"writers": n_writers, "files": len(files), "lock_timeout_s": lock_timeout_s, "seconds": seconds,
            "stored": complete, "lost": len(files) - complete, "attempts": sum(int(o[0]) for o in outs),
            "lock_refusals": sum(int(o[0]) - 1 for o in outs), "failed": sum(int(o[1]) != 0 for o in outs),
            "tracebacks": sum(int(o[2]) for o in outs)}


# -- 4. kills ---------------------------------------------------------------------------------------------

def _counts(store: Store, run_id: str) -> dict[str, int]:
    return {t: store.sql(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
            for t in ("runs", *schema.DATA_TABLES)}


def kills(work: Path, n: int, seed: int) -> dict:
    from tests.test_concurrency import KILL_CHILD  # the same child the tests use

    rng = random.Random(seed)
    folder = work / "kills"
    folder.mkdir()
    db = folder / "s.duckdb"
    earlier = _variants(folder, 3)
    ref_db = folder / "ref.duckdb"
    with Store(ref_db) as s:
        reference = {f: _counts(s, s.ingest(f).run_id) for f in [*earlier, BIG]}
    with Store(db) as s:
        for f in earlier:
            s.ingest(f)
    modes, outcomes, problems = Counter(), Counter(), []
    survived = 0
    stored_before = False  # whether BIG's run was in the store when the killed process started
    for i in range(n):
        mode = ("in-transaction", "in-commit", "cli")[i % 3]
        delay = rng.uniform(0, 0.1) if mode == "in-commit" else rng.uniform(0.3, 2.0)
        if mode == "cli":
            p = subprocess.Popen(cli("ingest", BIG, "--store", db), env=ENV, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            time.sleep(delay)
        else:
            p = subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(db), "-", str(BIG), mode, str(delay)],
                                 env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            while p.stdout.readline().strip() not in ("IN-TXN", "DONE", ""):
                pass
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()
        killed = p.returncode == -signal.SIGKILL
        modes[mode] += killed
        try:
            with Store(db) as s:
                bad = [f.name for f in earlier if _counts(s, run_id_for(file_hash(f))) != reference[f]]
                got = _counts(s, run_id_for(file_hash(BIG)))
                state = "complete" if got == reference[BIG] else "absent" if set(got.values()) == {0} else "HALF"
                was_stored = stored_before
                if state == "absent" and was_stored:
                    state = "LOST"  # a replace that was killed must leave the old copy
                stored_before = state == "complete"
                if stored_before and rng.random() < 0.5:  # half the kills then start from an empty slot
                    s.delete_run(run_id_for(file_hash(BIG)))
                    stored_before = False
            survived += 1
            outcomes[(mode, f"{'replace' if was_stored else 'insert'}: {state}")] += 1
            if bad or state in ("HALF", "LOST"):
                problems.append(f"kill {i} ({mode}): earlier runs damaged {bad}, new run {state}")
        except Exception as e:  # noqa: BLE001 - a store that does not open is the failure counted
            problems.append(f"kill {i} ({mode}): store does not open: {e}")
    return {"kills": n, "killed_by_mode": dict(modes), "survived": survived,
            "outcomes": {f"{m}, {s}": c for (m, s), c in sorted(outcomes.items())}, "problems": problems,
            "earlier_runs": len(earlier)}


# -- the document ---------------------------------------------------------------------------------------------

def render(f: dict, bombs_: list[dict], conc: list[dict], k: dict, args, seconds: float) -> str:
    rows = f["rows"]
    by_class: dict[tuple, Counter] = defaultdict(Counter)
    for r in rows:
        by_class[(r["fmt"], r["cls"])][r["result"]] += 1
    results = Counter(r["result"] for r in rows)
    failures = [r for r in rows if r["result"] in FAILURES]
    secs = [r["seconds"] for r in rows]
    slow = max(rows, key=lambda r: r["seconds"])
    c = f["cli"]
    lines = [
        "# Reliability: hostile input, resource bombs, concurrent writers, kills",
        "",
        "Generated by `python bench/reliability.py` (do not edit by hand; rerun it). "
        f"Corpus seed {args.seed}, {args.per_class} cases per class and seed trace; "
        f"run took {seconds / 60:.1f} min on {os.cpu_count()} CPU(s).",
        "",
        "Traces come from other people's machines, so every file is untrusted. What is promised:",
        "",
        "- A file ends in **one of two ways**: a complete run in the store, or one line "
        "`error: PATH: what is wrong` (no traceback unless `--debug`). Nothing of a refused file "
        "stays in the store; the other files of the batch are stored.",
        "- **Bounded** memory and time whatever a file claims: the limits below stop gzip bombs, "
        "deep JSON, SQLite files whose b-tree reuses pages, huge strings.",
        "- **One writer at a time**: other processes wait for the store's lock (30 s by default, "
        "`TRACEANALYZER_LOCK_TIMEOUT_S`), then fail with a message that says to retry. "
        "A process killed mid-ingest leaves a store that opens, earlier runs intact, no half run.",
        "- **Inputs are never changed** (opened read-only; SQLite with `mode=ro&immutable=1`).",
        "- **No code from data**: no eval, and pickles (PyTorch memory snapshots) only through an "
        "unpickler that refuses every class; SQLite views and virtual tables in a trace are "
        "ignored (only ordinary tables are read); SQL takes trace strings and options as "
        "parameters or quoted identifiers; paths inside traces are never opened; reports escape "
        "trace text (JSON/SARIF by JSON encoding, JUnit/HTML by XML/HTML escaping, Markdown and "
        "the terminal by escaping their markup).",
        "",
        "## Limits",
        "",
        "Each limit is an environment variable; the defaults sit far above every real trace in "
        "`../shared/traces`. A file over a limit is refused with a message naming the variable. "
        "Sizes take K/M/G/T suffixes (powers of 1024).",
        "",
        "| variable | default | what it bounds |",
        "|---|---|---|",
    ]
    for lim in limits.LIMITS.values():
        lines.append(f"| `{lim.env}` | {limits.show(lim.name, lim.default)} | {lim.doc} |")
    lines += [
        "| `TRACEANALYZER_LOCK_TIMEOUT_S` | 30 | Seconds to wait for another process's lock on the store. |",
        "| `TRACEANALYZER_MEMORY_LIMIT` | DuckDB's (80% of RAM); 1GB in the rules pass of a run of over 1 M GPU operations | Memory each DuckDB connection may hold (the store's, and the nsys reader's own) for sorts, joins and cached blocks (DuckDB's syntax: `2GB`, `40%`); past it, rules spill to a temp folder next to the store instead of growing. Set, it holds everywhere, a big run's rules pass too. |",
        "",
        "Fixed bounds (not settings): times beyond ±2^62 ns (146 years from the clock's zero) are "
        "corrupt (GPU rows with them, or ending before they start, are dropped with a warning; "
        "elsewhere the file is refused), so every difference of two times fits int64; an SQLite "
        f"table cannot hold more than one row per {limits.SQLITE_MIN_ROW_BYTES} bytes of its file.",
        "",
        "## 1. Fuzz corpus",
        "",
        "`fixtures/gen_hostile.py` damages the real traces in `../shared/traces` "
        f"({sum(len(v) for v in G.SOURCES.values())} seed traces: "
        + ", ".join(f"{len(v)} {k}" for k, v in G.SOURCES.items()) +
        ") and adds files that are no trace at all. Each case says what a correct tool must do: "
        "`error` (e.g. a JSON or gzip cut short), `ok` (e.g. a dropped optional table, NULLs, "
        "rows that end before they start) or `any`.",
        "",
        f"**{len(rows)} cases: {results['ok']} stored complete, {results['error']} refused with a "
        f"one-line error, {len(failures)} failures** (crash, leftover rows, incomplete run, "
        "wrong outcome, or a bad message).",
        "",
        "| format | class | cases | stored | refused | failures |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (fmt, cls), cnt in sorted(by_class.items()):
        bad = sum(cnt[x] for x in FAILURES)
        lines.append(f"| {fmt} | {cls} | {sum(cnt.values())} | {cnt['ok']} | {cnt['error']} | {bad} |")
    lines += [
        "",
        f"Per case: median {statistics.median(secs) * 1000:.0f} ms, max {max(secs):.1f} s "
        f"(`{Path(slow['name']).name}`: {slow['detail']}); peak RSS of a judging worker "
        f"(one seed trace's cases, each stored in the worker's store) {f['peak_rss_mb']:.0f} MB.",
        "",
        "Then the whole corpus and the untouched seed traces went through `traceanalyzer check` "
        f"(ingest, then every rule on every stored run) as one batch ({f['cli_seconds']:.0f} s):",
        "",
        f"- {c['error_lines']} `error:` lines for {c['files_with_errors']} files (at most "
        f"{c['max_lines_per_file']} per file), {c['tracebacks']} tracebacks, {c['internal']} internal errors; "
        f"the refused files are exactly the ones judged refused above: {'yes' if c['refused_match_judge'] else 'NO'}.",
        f"- {c['ok_cases_stored']} of {c['ok_cases']} cases judged complete are in the store, and "
        f"{c['seeds_stored']} of {c['seeds']} seed traces of the same batch.",
        f"- Inputs unchanged (SHA-256 and mtime, before and after): {c['inputs_unchanged']} of {c['inputs']}.",
        "- Rules on the stored runs: " + ", ".join(f"{n} {st}" for st, n in sorted(c["rule_status"].items()))
        + " (`error` would be a rule that failed on a run; `no-data`: the run lacks what the rule needs).",
        "",
        "What the refusals say, most common first:",
        "",
    ]
    msgs = Counter(re.sub(r"\d[\d,.]*", "N", r["message"])[:140] for r in rows if r["result"] == "error")
    lines += [f"- {n} x `{m}`" for m, n in msgs.most_common(12)]
    if failures:
        lines += ["", "Failures:", ""] + [f"- `{Path(r['name']).name}` ({r['source']}, {r['detail']}): "
                                          f"{r['result']}: {r['message']}" for r in failures[:50]]
    lines += [
        "",
        "## 2. Resource bombs",
        "",
        "Each read in its own process with the default limits. Peak RSS is that process's plus its "
        "largest child's (a helper process of a Kineto read in parts): an upper bound.",
        "",
        "| file | size on disk | what it would take | time | peak RSS | outcome |",
        "|---|---:|---|---:|---:|---|",
    ]
    for b in bombs_:
        t = "-" if b["seconds"] is None else f"{b['seconds']:.2f} s"
        rss = "-" if b["rss_mb"] is None else f"{b['rss_mb']:.0f} MB"
        lines.append(f"| {b['what']} | {b['size'] / 1024:,.0f} KB | {b['claimed']} | {t} | {rss} | "
                     f"{b['outcome'][:160].replace('|', '/')} |")
    lines += [
        "",
        "## 3. Concurrent writers",
        "",
        "Writers are real `traceanalyzer ingest` processes started together on one store, each "
        "with its own distinct files; a writer refused with the lock message retries after 0.2 s.",
        "",
        "| writers | files | lock timeout | runs stored | runs lost | lock refusals (retried) | failed writers | tracebacks | wall time |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in conc:
        lines.append(f"| {w['writers']} | {w['files']} | {w['lock_timeout_s']:g} s | {w['stored']} | {w['lost']} | "
                     f"{w['lock_refusals']} | {w['failed']} | {w['tracebacks']} | {w['seconds']:.0f} s |")
    lines += [
        "",
        "## 4. Kills",
        "",
        f"A store holding {k['earlier_runs']} runs; then, {k['kills']} times, a process ingesting "
        f"`{BIG.name}` (~30 000 rows) was killed with SIGKILL: inside the transaction (after its "
        "kernels were inserted), during COMMIT (a timer fired 0-100 ms into it), or at a random "
        "moment 0.3-2 s into a real CLI run. Half the time the run was already stored, so the "
        "killed process was replacing it. After each kill the store was opened for writing: the "
        "run must be complete (the old copy or the new one) or, when it was not stored before, "
        "absent; never partly there, never lost.",
        "",
        f"- Kills: {sum(k['killed_by_mode'].values())} ({', '.join(f'{m}: {n}' for m, n in k['killed_by_mode'].items())}); "
        f"store opened afterwards: {k['survived']} of {k['kills']}.",
        "- The killed run afterwards (mode, insert or replace: state): "
        + "; ".join(f"{m}: {n}" for m, n in k["outcomes"].items()) + ".",
        f"- Earlier runs lost or damaged, half runs found: {len(k['problems'])}.",
    ] + [f"  - {p}" for p in k["problems"]] + [
        "",
        "## Known limits of these guarantees",
        "",
        "- A CSV cut exactly at a line end is a shorter, valid CSV: it is stored as such (a cut "
        "inside a row is refused).",
        "- Byte flips inside SQLite data pages or JSON strings can change values without breaking "
        "the format; such a file is stored with the changed values (nothing can tell).",
        "- A gzip stops inflating at min(`MAX_INFLATED_BYTES`, `MAX_INFLATE_RATIO` x its size, but "
        "at least 64 MiB): a bomb of 8 MB may still take ~1.6 GB before it is refused (see above).",
        "- Peak memory of a legal Kineto trace is its tables plus one 4 MB chunk of text (`traceEvents` "
        "is decoded in chunks; a big plain file by two processes, each holding its part): up to 4.9x "
        "its JSON text for the 3-million-tiny-event row above (both processes' peaks added), 1.3x for a "
        "real 404 MB trace (docs/performance.md); a file with an odd layout is decoded whole, up to "
        "~10x. `MAX_TEXT_BYTES` bounds both.",
        "",
        "## Reproduce",
        "",
        "```sh",
        "python bench/reliability.py                       # this file",
        "python fixtures/gen_hostile.py /tmp/corpus        # the corpus alone, with CASES.tsv",
        "python -m pytest tests/test_hostile.py tests/test_concurrency.py   # the fixed-seed sample",
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 4))
    ap.add_argument("--quick", action="store_true", help="small corpus, small bombs, 6 kills; print, do not write the doc")
    args = ap.parse_args(argv)
    if args.quick:
        args.per_class, args.kills = 2, 6
    if not (G.SHARED_TRACES / "MANIFEST.tsv").exists():
        raise SystemExit(f"{G.SHARED_TRACES} is missing: the corpus is made from the real traces")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ta-reliability-") as tmp:
        work = Path(tmp)
        (work / "corpus").mkdir()
        print("fuzz corpus ...", flush=True)
        f = fuzz(args.per_class, args.seed, work / "corpus", args.jobs)
        print(f"  {len(f['rows'])} cases", Counter(r["result"] for r in f["rows"]), f["cli"], flush=True)
        shutil.rmtree(work / "corpus")
        print("bombs ...", flush=True)
        b = bombs(work, 0.05 if args.quick else 1.0)
        for x in b:
            print(f"  {x['name']}: {x['seconds']} s, {x['rss_mb']} MB, {x['outcome'][:100]}", flush=True)
        print("concurrent writers ...", flush=True)
        conc = [writers(work, 8, 4, 30.0), writers(work, 8, 4, 0.5)]
        print("  ", conc, flush=True)
        print("kills ...", flush=True)
        k = kills(work, args.kills, args.seed)
        print("  ", {x: y for x, y in k.items()}, flush=True)
    doc = render(f, b, conc, k, args, time.perf_counter() - t0)
    if args.quick:
        print(doc)
    else:
        DOC.write_text(doc)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main(sys.argv[1:])
