"""Batch scan: every trace under some paths, parsed and checked in parallel, stored by one writer.

How the work is split, and why:

* A worker (a process of a local pool, or a dask worker, see `distributed.py`) does all the
  per-file work: it hashes the file, skips it when the store already holds that content with
  findings for the current rules, parses it, and evaluates the per-run rules on a scratch
  in-memory DuckDB holding only that run. It returns the parsed tables and the findings
  (Arrow tables pickle cheaply). Rules, not parsing, dominate the cost of a small trace, so
  they must run in the workers for `--jobs` to pay.
* The main process is the only writer (DuckDB allows one per file): it stores each run and
  its findings as results arrive, so an interrupted scan keeps everything finished so far and
  a rerun does only what is left. Between two runs it lets go of the store when another
  process waits for it (`Store.let_in_waiting`), so `runs`, `query`, ... can read the store
  mid-scan: they see the runs committed so far, each with its per-run findings.
* Cross-run rules (scope "runs") need every run at once; they run in the main process after
  the files are stored, on the store itself.
* A big nsys export is the writer's own (WRITER_READS_MIN_BYTES): read as `Store.ingest` reads
  it, streamed into the store, and checked there, between two workers' results. A dask
  worker given one (the writer cannot see a cluster's files) does the same into a store file
  of its own, then hands the rows over (`_through_temp_store`).

Per-run rules give the same findings on a one-run scratch store as on the full store: they
only see `$run_id`, and the run row (file name, used in fingerprints) is the same.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import tempfile
import threading
import time
import traceback
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import os_memory, schema
from .ingest import ParsedTrace, find_traces, read_file, streams
from .ingest.base import read_cpus, usable_cpus
from .report.model import InputError
from .rules.engine import Settings, run_rules
from .store import DEFAULT_HASH, RuleResults, Store, file_hash, run_id_for

# Results waiting to be written, per worker: enough to keep workers busy while the writer
# stores one run, few enough that big traces do not pile up in memory.
IN_FLIGHT_PER_WORKER = 2
# A file at least this big, of a format whose reader streams its tables (nsys), is read by the
# writer itself with `Store.ingest`, its rules run on the store, instead of in a worker: a worker
# holds every table whole, copies them into its scratch store for the rules and hands them over
# once more, where the streamed read holds about one table part at a time, and the run keeps
# its rules' cache in the store (see views.KEEP_MIN_GPU_OPS) for later checks and reports.
WRITER_READS_MIN_BYTES = 256 << 20


def default_jobs() -> int:
    return usable_cpus()


@dataclass(frozen=True)
class JobPlan:
    """How `--jobs N` is spent: N cores in all, never more.

    Many files: N worker processes of one DuckDB thread and one read CPU each. Fewer files
    than N: one worker per file, each with its share of the cores. One worker: no pool, the work
    is done in this process, on all N cores (a single-file scan with the default N reads and
    checks its file with every CPU, as `traceanalyzer check` does). `--jobs 1` is serial: one
    process, one thread, one read CPU (no split Kineto read, no nsys fetch threads), which is
    what a batch job given one CPU needs.
    """

    workers: int  # worker processes (1: in this process, no pool)
    threads: int  # DuckDB threads per run's rules (and the store's, while the scan runs)
    read_cpus: int  # CPUs a worker may read one file with (`ingest.base.read_cpus`)

    @classmethod
    def for_scan(cls, jobs: int | None, n_files: int) -> JobPlan:
        cores = jobs or default_jobs()
        workers = max(1, min(cores, n_files))
        threads = max(1, cores // workers)
        return cls(workers, threads, threads)


# -- what a worker does ---------------------------------------------------------------

@dataclass
class WorkContext:
    """What every worker needs besides the path: shipped once per worker, not per file."""

    known_hashes: frozenset[str]  # content already stored with current findings: skip
    settings: Settings | None  # None: store runs without evaluating rules
    duckdb_threads: int | None = None  # for the scratch store (None: DuckDB's default)
    # CPUs one file may be read with (None: the reader's default; see `ingest.base.read_cpus`).
    # 1 where workers already share the cores.
    read_cpus: int | None = None
    hash_name: str = DEFAULT_HASH  # the store's content hash (`Store.hash_name`)
    # A file at least this big whose reader streams (nsys) is streamed into a temporary store
    # file in the worker (`_through_temp_store`) instead of being held whole (None: never).
    # Only a dask worker meets such files: a local scan leaves them to the writer.
    stream_min_bytes: int | None = None


@dataclass
class FileOutcome:
    """A worker's answer for one file. Exactly one of trace / skipped / error is set."""

    path: str  # absolute path as the worker saw it (the run's source_path)
    size_bytes: int = 0
    content_hash: str | None = None
    trace: object | None = None  # ParsedTrace
    findings: pa.Table | None = None  # per-run rules' findings (no run_id column)
    rule_runs: pa.Table | None = None  # their outcomes (no run_id column)
    rule_ids: list[str] = field(default_factory=list)  # the per-run rules evaluated
    skipped: bool = False
    error: str | None = None  # one line
    internal: bool = False  # the error is a bug in traceanalyzer, not a bad file
    detail: str | None = None  # traceback text of an internal error
    work_s: float = 0.0


def per_run_settings(settings: Settings) -> Settings | None:
    """The per-run part of the rule selection; None when it selects nothing."""
    ids = [r.id for r in settings.rules() if r.scope == "run"]
    return Settings(select=ids, thresholds=settings.thresholds) if ids else None


def cross_run_settings(settings: Settings) -> Settings | None:
    ids = [r.id for r in settings.rules() if r.scope == "runs"]
    return Settings(select=ids, thresholds=settings.thresholds) if ids else None


_local = threading.local()  # one scratch store per worker thread (DuckDB connections are not shared)

# An in-memory DuckDB table never gives back the room of its deleted rows (nothing is ever
# checkpointed), so a scratch store grew by every run it had checked, and its rules scanned
# the dead rows too: 40 checks of a 124 KB Kineto trace (4.8 k rows) took it from 6 to 68 MB.
# A store that has held this many rows is replaced (a new one costs ~35 ms).
SCRATCH_MAX_ROWS = 200_000


def _scratch_store(threads: int | None) -> Store:
    st = getattr(_local, "store", None)
    if st is None:
        st = _local.store = Store(":memory:")
        _local.threads, _local.rows = None, 0
    if threads and threads != _local.threads:  # set per scan: an in-process one may follow another
        st.sql(f"SET threads = {int(threads)}")
        _local.threads = threads
    return st


def _scratch_used(rows: int) -> None:
    """Count `rows` as left in this thread's scratch store; past SCRATCH_MAX_ROWS close it, so
    that the next run gets a new one."""
    _local.rows += rows
    if _local.rows >= SCRATCH_MAX_ROWS:
        _local.store.close()
        _local.store = None


def process_file(path: str, ctx: WorkContext) -> FileOutcome:
    """Hash, skip-or-parse, and evaluate the per-run rules of one file. Never raises."""
    t0 = time.perf_counter()
    out = FileOutcome(path=path)
    try:
        p = Path(path)
        out.size_bytes = p.stat().st_size
        out.content_hash = file_hash(p, ctx.hash_name)
        if out.content_hash in ctx.known_hashes:
            out.skipped = True
            return out
        rules = per_run_settings(ctx.settings) if ctx.settings is not None else None
        with read_cpus(ctx.read_cpus):
            if ctx.stream_min_bytes is not None and out.size_bytes >= ctx.stream_min_bytes and streams(p):
                out.trace, out.findings, out.rule_runs, out.rule_ids = _through_temp_store(p, out, rules, ctx)
                return out
            trace = read_file(p)
        if rules is not None:
            out.findings, out.rule_runs, out.rule_ids = _evaluate(trace, out, rules, ctx.duckdb_threads)
        out.trace = trace
    except Exception as e:
        out.error, out.internal, out.detail = _failure(e)
    finally:
        out.work_s = time.perf_counter() - t0
    return out


def _evaluate(trace, out: FileOutcome, rules: Settings, threads: int | None):
    """Store the run in the scratch store, run the rules there, hand back their rows."""
    st = _scratch_store(threads)
    run_id = run_id_for(out.content_hash)
    try:
        st.write_run(trace, Path(out.path), out.content_hash, out.size_bytes)
        return _checked(st, run_id, rules)
    finally:
        st.delete_run(run_id)
        _scratch_used(sum(t.num_rows for t in trace.tables.values()))


def _checked(st: Store, run_id: str, rules: Settings):
    """Run `rules` on `run_id` of `st`; their findings and outcomes (without the run_id
    column, which the writer's store sets) and the rules' ids."""
    run_rules(st, [run_id], rules)
    findings = st.arrow("SELECT * EXCLUDE (run_id) FROM findings WHERE run_id = $r", {"r": run_id})
    outcomes = st.arrow("SELECT * EXCLUDE (run_id) FROM rule_runs WHERE run_id = $r", {"r": run_id})
    return findings, outcomes, [r.id for r in rules.rules()]


def _through_temp_store(path: Path, out: FileOutcome, rules: Settings | None, ctx: WorkContext):
    """A big streamed file, done in a worker as the writer does it (`_ingest_by_writer`):
    streamed into a store file of its own, its rules run there, then its rows read back for
    the writer. Held whole instead, the 5 M-kernel export took 12.8 GB (reader, scratch copy
    and rules at once); this way the peak is the streamed read's, the rules' or the rows
    handed over, strings dictionary-encoded as a reader holds them (there: 1.8, 1.1, 2.7 GB)."""
    with tempfile.TemporaryDirectory(prefix="traceanalyzer-scan-") as tmp:
        with Store(Path(tmp) / "run.duckdb") as st:  # the content hash is given: no hash to agree on
            if ctx.duckdb_threads:
                st.sql(f"SET threads = {int(ctx.duckdb_threads)}")
            run_id = st.ingest(path, content_hash=out.content_hash).run_id
            checked = _checked(st, run_id, rules) if rules is not None else (None, None, [])
            trace = _stored_trace(st, run_id)
    os_memory.give_back()  # the store's and the plain strings' memory, before the rows are sent
    return (trace, *checked)


def _stored_trace(store: Store, run_id: str) -> ParsedTrace:
    """Run `run_id` of `store` as a reader's ParsedTrace: `Store.write_run` stores the same rows."""
    (fmt, producer, version, schema_version, host, clock, rank, world_size, warnings, metadata), = store.sql(
        "SELECT format, producer, producer_version, schema_version, host, clock, rank, world_size, warnings, "
        "metadata FROM runs WHERE run_id = $r", {"r": run_id}).fetchall()
    store.drop_cached_blocks()  # the rules' blocks: what is read now is another table each time
    tables = {}
    for name in schema.DATA_TABLES:
        # A batch at a time, its strings encoded before the next one is read: the plain
        # strings of a whole table are never held.
        reader = store.con.sql(f"SELECT * EXCLUDE (run_id) FROM {name} WHERE run_id = $r",
                               params={"r": run_id}).to_arrow_reader(EXTRACT_BATCH_ROWS)
        batches = [_dictionary_strings(b) for b in reader]
        if any(b.num_rows for b in batches):
            tables[name] = pa.Table.from_batches(batches)
    return ParsedTrace(format=fmt, producer=producer, producer_version=version, schema_version=schema_version,
                       host=host, clock=clock, rank=rank, world_size=world_size,
                       metadata=json.loads(metadata) if metadata else {}, tables=tables,
                       warnings=list(warnings or []))


EXTRACT_BATCH_ROWS = 1 << 20


def _dictionary_strings(batch: pa.RecordBatch) -> pa.RecordBatch:
    """String columns dictionary-encoded (kernel names repeat millions of times): what is
    sent to the writer is then about as big as the reader's own tables. The other columns
    are copied too: a batch exported by DuckDB is freed only when none of its columns is
    alive, and it holds the plain strings."""
    columns = [pc.dictionary_encode(c) if pa.types.is_string(c.type) or pa.types.is_large_string(c.type)
               else pa.concat_arrays([c]) for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _failure(e: Exception) -> tuple[str, bool, str | None]:
    """What one file's failed work reports (see `InputError.of`): (one-line error, whether it
    is a bug in traceanalyzer rather than a bad file, the traceback of such a bug)."""
    error = InputError.of("", e)
    return error.message, error.internal, error.detail


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# -- running workers locally ------------------------------------------------------------

_pool_ctx: WorkContext | None = None


def _init_pool_worker(ctx: WorkContext) -> None:
    global _pool_ctx
    _pool_ctx = ctx


def _pool_task(path: str) -> FileOutcome:
    return process_file(path, _pool_ctx)


def _mp_context():
    # Not "fork": the parent holds a DuckDB connection whose threads may hold locks. The
    # forkserver starts clean once, imports the package once, then forks cheap workers.
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["traceanalyzer.scan"])
        return ctx
    return mp.get_context("spawn")


WORKER_DIED = "the worker process died while reading this file (crash or out of memory)"


def local_outcomes(files: list[str], jobs: int, ctx: WorkContext,
                   task: Callable[[str], FileOutcome] = _pool_task) -> Iterator[FileOutcome]:
    """Outcomes in completion order. jobs=1 works in this process (no pool).

    A file that kills its worker breaks the whole pool; the files in flight then are rerun
    one at a time in a fresh pool, so the culprit is found and reported alone.
    """
    if jobs <= 1:
        for f in files:
            yield process_file(f, ctx)
        return
    pending, suspects = deque(files), deque()
    while pending or suspects:
        pool = ProcessPoolExecutor(jobs, mp_context=_mp_context(), initializer=_init_pool_worker,
                                   initargs=(ctx,))
        in_flight: dict = {}
        clean_exit = False
        try:
            while pending or suspects or in_flight:
                # Suspects of an earlier crash run alone (nothing else in flight, so a crash
                # is theirs); everything else keeps `jobs` workers busy.
                if suspects and not in_flight:
                    f = suspects.popleft()
                    in_flight[pool.submit(task, f)] = (f, True)
                suspect_running = any(alone for _, alone in in_flight.values())
                while not suspects and not suspect_running and pending \
                        and len(in_flight) < IN_FLIGHT_PER_WORKER * jobs:
                    f = pending.popleft()
                    in_flight[pool.submit(task, f)] = (f, False)
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                broken = False
                for fut in done:
                    f, alone = in_flight.pop(fut)
                    try:
                        result = fut.result()
                    except BrokenProcessPool:
                        broken = True
                        if alone:
                            yield FileOutcome(path=f, error=WORKER_DIED)
                        else:
                            suspects.append(f)
                        continue
                    yield result
                if broken:
                    suspects.extend(f for f, alone in in_flight.values() if not alone)
                    for f, alone in in_flight.values():
                        if alone:  # a suspect whose future was not among `done` yet
                            yield FileOutcome(path=f, error=WORKER_DIED)
                    in_flight.clear()
                    break
            clean_exit = not (pending or suspects)
        finally:
            # On an interruption do not wait for running files; their results are not needed.
            pool.shutdown(wait=clean_exit, cancel_futures=True)


# -- the writer -------------------------------------------------------------------------

@dataclass
class FileResult:
    """What happened to one file: stored, updated (replaced a stale run), skipped, duplicate, failed."""

    path: str
    state: str
    size_bytes: int = 0
    run_id: str | None = None
    format: str | None = None
    error: str | None = None
    internal: bool = False
    detail: str | None = None
    warnings: list[str] = field(default_factory=list)
    work_s: float = 0.0


@dataclass
class ScanReport:
    files: list[FileResult] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)  # every run the scan covers, first-seen order
    elapsed_s: float = 0.0
    cross_rule_error: str | None = None
    not_traces: list = field(default_factory=list)  # (path, what it is): files the folder walk passed over

    def count(self, state: str) -> int:
        return sum(1 for f in self.files if f.state == state)

    @property
    def failed(self) -> list[FileResult]:
        return [f for f in self.files if f.state == "failed"]


class ScanError(Exception):
    """The scan cannot start (no files, no dask, cannot reach the scheduler)."""


def up_to_date_hashes(store: Store, settings: Settings | None) -> set[str]:
    """Content hashes of stored runs that need no work: stored, and (with rules) holding an
    outcome of every selected per-run rule with the same thresholds."""
    rules = per_run_settings(settings) if settings is not None else None
    if rules is None:
        return {r[0] for r in store.sql("SELECT content_hash FROM runs").fetchall()}
    import json

    expected = [f"{r.id}\x1f{json.dumps(rules.params_for(r), sort_keys=True)}" for r in rules.rules()]
    rows = store.sql("""
        SELECT r.content_hash FROM runs r JOIN rule_runs o USING (run_id)
        WHERE list_contains($expected, o.rule_id || chr(31) || o.params::VARCHAR)
        GROUP BY r.content_hash HAVING count(DISTINCT o.rule_id) = $n""",
                     {"expected": expected, "n": len(expected)}).fetchall()
    return {r[0] for r in rows}


def scan(store: Store, paths: Iterable[str | Path], *, jobs: int | None = None,
         settings: Settings | None = None, scheduler: str | None = None,
         on_start: Callable[[list[str], int], None] | None = None,
         on_file: Callable[[FileResult], None] | None = None) -> ScanReport:
    """Scan `paths` into `store` and run the rules (`settings`; default: all rules).

    `on_start(files, total_bytes)` is called once the files are known, `on_file(result)` after
    each file is handled (the CLI's progress bar). With `scheduler` (a dask scheduler address
    or scheduler file) the workers are a dask cluster's instead of local processes.
    """
    t0 = time.perf_counter()
    settings = settings if settings is not None else Settings()
    # Resolved like `Store.ingest` does, so `source_path` and run lookups by path agree.
    not_traces: list = []
    files = list(dict.fromkeys(str(Path(f).resolve()) for f in find_traces(paths, not_traces)))
    if not files:
        raise ScanError(f"no trace files under {' '.join(map(str, paths))}")
    if on_start:
        on_start(files, sum(_size(f) for f in files))
    # Big streamed files are the writer's own (local scans only: a cluster's workers may see
    # files this process cannot). It reads one between two workers' results, so the workers
    # keep busy meanwhile.
    by_writer = deque(f for f in files if not scheduler and _read_by_writer(f))
    writers = set(by_writer)
    to_workers = [f for f in files if f not in writers]
    plan = JobPlan.for_scan(jobs, len(to_workers))
    ctx = WorkContext(frozenset(up_to_date_hashes(store, settings)), settings,
                      duckdb_threads=1 if scheduler else plan.threads,
                      read_cpus=1 if scheduler else plan.read_cpus, hash_name=store.hash_name(),
                      stream_min_bytes=WRITER_READS_MIN_BYTES)
    if scheduler:
        from .distributed import dask_outcomes

        outcomes = dask_outcomes(scheduler, files, ctx)
    else:
        outcomes = local_outcomes(to_workers, plan.workers, ctx)
    report = ScanReport(not_traces=not_traces)
    written: dict[str, str] = {}  # content hash -> path stored by this scan

    def handled(result: FileResult) -> None:
        report.files.append(result)
        if result.run_id and result.run_id not in report.run_ids:
            report.run_ids.append(result.run_id)
        if on_file:
            on_file(result)
        # Between two runs (a run and its findings are committed together; a big file's
        # rules, run on the store, are done too): a reader waiting for the store gets it now.
        store.let_in_waiting()

    # The writer's own work (storing, big files' reads and rules, cross-run rules) keeps to
    # the cores asked for too.
    asked = None if scheduler or not jobs else jobs
    with _store_threads(store, asked), read_cpus(asked):
        with contextlib.closing(outcomes):
            for o in outcomes:
                result = _store_outcome(store, o, written)
                if o.trace is not None:  # stored: free its tables before the next file's work
                    freed, o.trace = o.trace.nbytes, None
                    os_memory.give_back(freed)
                handled(result)
                if by_writer:
                    handled(_ingest_by_writer(store, by_writer.popleft(), ctx, written))
        while by_writer:
            handled(_ingest_by_writer(store, by_writer.popleft(), ctx, written))
        cross = cross_run_settings(settings)
        if cross is not None and report.run_ids:
            try:
                run_rules(store, report.run_ids, cross)
            except Exception as e:  # the stored runs stay; say what failed
                report.cross_rule_error = _one_line(e)
    report.elapsed_s = time.perf_counter() - t0
    return report


@contextlib.contextmanager
def _store_threads(store: Store, threads: int | None) -> Iterator[None]:
    """Within the block the store's connection uses `threads` DuckDB threads (None: unchanged),
    also once opened again (`Store.set`)."""
    if not threads:
        yield
        return
    before = store.sql("SELECT current_setting('threads')").fetchall()[0][0]
    store.set("threads", int(threads))
    try:
        yield
    finally:
        store.set("threads", int(before))


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _read_by_writer(path: str) -> bool:
    return _size(path) >= WRITER_READS_MIN_BYTES and streams(Path(path))


def _ingest_by_writer(store: Store, path: str, ctx: WorkContext, written: dict[str, str]) -> FileResult:
    """What a worker and `_store_outcome` do for one file, done here: hash, skip or store
    (streamed, `Store.ingest`), then the per-run rules on the store. Never raises."""
    t0 = time.perf_counter()
    result = FileResult(path=path, state="failed", size_bytes=_size(path))
    try:
        content_hash = file_hash(Path(path), ctx.hash_name)
        if content_hash in ctx.known_hashes or content_hash in written:
            run_id = run_id_for(content_hash)
            result.run_id, result.format = run_id, _stored_format(store, run_id)
            if content_hash in ctx.known_hashes:
                result.state = "skipped"
            else:
                _duplicate(result, written[content_hash])
        else:
            stored = store.ingest(path, content_hash=content_hash)
            written[content_hash] = path
            result.state = "updated" if stored.replaced else "stored"
            result.run_id, result.format, result.warnings = stored.run_id, stored.format, list(stored.warnings)
            rules = per_run_settings(ctx.settings) if ctx.settings is not None else None
            if rules is not None:
                run_rules(store, [stored.run_id], rules)
    except Exception as e:
        result.state = "failed"
        result.error, result.internal, result.detail = _failure(e)
    result.work_s = time.perf_counter() - t0
    return result


def _stored_format(store: Store, run_id: str) -> str | None:
    # fetchall: DuckDB 2 refuses new work on a connection with a half-read result
    rows = store.sql("SELECT format FROM runs WHERE run_id = ?", [run_id]).fetchall()
    return rows[0][0] if rows else None


def _duplicate(result: FileResult, first_path: str) -> None:
    result.state, result.warnings = "duplicate", [f"same content as {first_path}"]


def _store_outcome(store: Store, o: FileOutcome, written: dict[str, str]) -> FileResult:
    res = FileResult(path=o.path, state="failed", size_bytes=o.size_bytes, error=o.error,
                     internal=o.internal, detail=o.detail, work_s=o.work_s)
    if o.error is not None:
        return res
    run_id = run_id_for(o.content_hash)
    if o.skipped:
        res.state, res.run_id, res.format = "skipped", run_id, _stored_format(store, run_id)
        return res
    if o.content_hash in written:  # same bytes under another name, already stored by this scan
        res.run_id, res.format = run_id, o.trace.format
        _duplicate(res, written[o.content_hash])
        return res
    try:
        results = RuleResults(o.rule_ids, o.findings, o.rule_runs) if o.rule_ids else None
        stored = store.write_run(o.trace, Path(o.path), o.content_hash, o.size_bytes, findings=results)
    except Exception as e:  # e.g. a reader's table that does not fit the schema
        res.error, res.internal, res.detail = _one_line(e), True, traceback.format_exc()
        return res
    written[o.content_hash] = o.path
    res.state = "updated" if stored.replaced else "stored"
    res.run_id, res.format, res.warnings = run_id, o.trace.format, list(o.trace.warnings)
    return res


# -- the per-run table ------------------------------------------------------------------

RUN_TABLE_SQL = """
SELECT r.run_id, r.file_name, r.format, r.span_ns,
       (SELECT count(*) FROM kernels k WHERE k.run_id = r.run_id) AS kernels,
       (SELECT count(*) FROM findings f WHERE f.run_id = r.run_id AND f.severity = 'error') AS errors,
       (SELECT count(*) FROM findings f WHERE f.run_id = r.run_id AND f.severity = 'warning') AS warnings,
       (SELECT count(*) FROM findings f WHERE f.run_id = r.run_id AND f.severity = 'info') AS infos
FROM runs r WHERE list_contains($ids, r.run_id)
ORDER BY r.source_path, r.run_id
"""


def run_table(store: Store, run_ids: list[str]) -> pd.DataFrame:
    """One row per run: id, file, format, span, kernels, findings by severity."""
    return store.df(RUN_TABLE_SQL, {"ids": list(run_ids)})
