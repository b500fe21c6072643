"""Batch scan: every trace under some paths, parsed and checked in parallel, stored by one writer.

How the work is split, and why:

* A worker (a process of a local pool, or a dask worker, see `distributed.py`) does all the
  per-file work (`worker.py`), as `check` does it (`check.check_file`), on a scratch in-memory store of its
  own: it hashes the file, skips it when the writer's store already holds that content with
  findings for the current rules, reads it, and evaluates the per-run rules. It hands back
  the run's rows and findings (`Store.read_run`, `read_findings`: Arrow tables pickle
  cheaply). Rules, not parsing, dominate the cost of a small trace, so they must run in the
  workers for `--jobs` to pay.
* The main process is the only writer (DuckDB allows one per file): it stores each run and
  its findings as results arrive, so an interrupted scan keeps everything finished so far and
  a rerun does only what is left. Between two runs it lets go of the store when another
  process waits for it (`Store.let_in_waiting`), so `runs`, `query`, ... can read the store
  mid-scan: they see the runs committed so far, each with its per-run findings.
* Cross-run rules (scope "runs") need every run at once; they run in the main process after
  the files are stored, on the store itself. So does linking a timeline to the Nsight Compute
  run beside it (`check.link_pairs`), and the linked rules run again on the timeline there;
  then each run those passes touched is diagnosed once (`_writer_passes`).
* A big nsys export is the writer's own (WRITER_READS_MIN_BYTES): the same `check_file`, on
  the writer's store (streamed into it), between two workers' results. A dask worker given
  one (the writer cannot see a cluster's files) checks it on a store file of its own
  instead of in memory, then hands the rows over.
* CPUs: `JobPlan` splits `--jobs` between the workers; each worker's store carries its share
  (`Store.resources`), which the read, DuckDB and the rules engine keep to.

Per-run rules give the same findings on a one-run scratch store as on the full store: they
only see `$run_id`, and the run row (file name, used in fingerprints) is the same.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import time
import traceback
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pandas as pd

from .. import interrupt, os_memory
from ..diagnosis import store_diagnosed
from ..ingest import find_traces, resolved
from ..resources import Resources
from ..rules.engine import Found, Settings, run_rules
from ..store import Store, capture_merge
from .check import FileResult, check_file, cross_run_settings, link_pairs, merge_captures, up_to_date_hashes
from .distributed import dask_outcomes
from .worker import FileOutcome, ScanError, WorkContext, big_streamed, file_size, process_file

# Results waiting to be written, per worker: enough to keep workers busy while the writer
# stores one run, few enough that big traces do not pile up in memory.
IN_FLIGHT_PER_WORKER = 2
# A file at least this big, of a format whose reader streams its tables (nsys), is read by the
# writer itself with `Store.ingest`, its rules run on the store, instead of in a worker: a worker
# holds every table whole, copies them into its scratch store for the rules and hands them over
# once more, where the streamed read holds about one table part at a time, and the run keeps
# its rules' cache in the store (see `RunPolicy.keep_min_gpu_ops`) for later checks and reports.
WRITER_READS_MIN_BYTES = 256 << 20


@dataclass(frozen=True)
class JobPlan:
    """How `--jobs N` is spent: N cores in all, never more.

    Many files: N worker processes of one CPU each (one DuckDB thread, one read CPU, one rule
    thread). Fewer files than N: one worker per file, each with its share of the cores. One
    worker: no pool, the work is done in this process, on all N cores (a single-file scan
    with the default N reads and checks its file with every CPU, as `traceanalyzer check`
    does). `--jobs 1` is serial: one process, one thread, one read CPU (no split Kineto read,
    no nsys fetch threads), which is what a batch job given one CPU needs.
    """

    workers: int  # worker processes (1: in this process, no pool)
    per_worker: Resources  # what each worker's store, reads and rules may use

    @classmethod
    def for_scan(cls, jobs: int | None, n_files: int, base: Resources | None = None) -> JobPlan:
        base = base or Resources.available()
        cores = jobs or base.cpus
        workers = max(1, min(cores, n_files))
        return cls(workers, replace(base, cpus=max(1, cores // workers)))


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# -- running workers locally ------------------------------------------------------------

_pool_ctx: WorkContext | None = None


def _init_pool_worker(ctx: WorkContext) -> None:
    global _pool_ctx
    # Ctrl-C in a terminal reaches every process of the scan. A worker leaves it to the
    # writer, which ends the workers (`local_outcomes`): else each would print the traceback
    # of its interrupted file, or, interrupted inside DuckDB, hand it back as failed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _pool_ctx = ctx


def _pool_task(path: str) -> FileOutcome:
    return process_file(path, _pool_ctx)


def _mp_context():
    # Not "fork": the parent holds a DuckDB connection whose threads may hold locks. The
    # forkserver starts clean once, imports the package once, then forks cheap workers.
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["traceanalyzer.batch.scan"])
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
        workers: list = []
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
                workers = list((pool._processes or {}).values())  # started as work is submitted
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                broken = False
                for fut in done:
                    f, alone = in_flight.pop(fut)
                    try:
                        result = fut.result()
                    except BrokenProcessPool:
                        broken = True
                        if alone:
                            yield FileOutcome.failed(f, WORKER_DIED)
                        else:
                            suspects.append(f)
                        continue
                    yield result
                if broken:
                    suspects.extend(f for f, alone in in_flight.values() if not alone)
                    for f, alone in in_flight.values():
                        if alone:  # a suspect whose future was not among `done` yet
                            yield FileOutcome.failed(f, WORKER_DIED)
                    in_flight.clear()
                    break
            clean_exit = not (pending or suspects)
        finally:
            # On an interruption do not wait for running files; their results are not needed,
            # and a big one may take minutes: its worker is ended. The pool starts workers as
            # work is submitted, so they are listed again here, before shutdown forgets them.
            workers = list((pool._processes or {}).values()) or workers
            pool.shutdown(wait=clean_exit, cancel_futures=True)
            if not clean_exit:
                for p in workers:
                    with contextlib.suppress(Exception):
                        p.terminate()


# -- the writer -------------------------------------------------------------------------

@dataclass
class ScanReport:
    files: list[FileResult] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)  # every run the scan covers, first-seen order
    elapsed_s: float = 0.0
    cross_rule_error: str | None = None
    not_traces: list = field(default_factory=list)  # (path, what it is): files the folder walk passed over
    links: list = field(default_factory=list)  # link.LinkResult of each timeline and ncu run linked
    link_errors: list = field(default_factory=list)  # InputError of each pair that could not be linked

    def count(self, state: str) -> int:
        return sum(1 for f in self.files if f.state == state)

    @property
    def failed(self) -> list[FileResult]:
        return [f for f in self.files if f.state == "failed"]


def scan(store: Store, paths: Iterable[str | Path], *, jobs: int | None = None,
         settings: Settings | None = None, scheduler: str | None = None,
         on_start: Callable[[list[str], int], None] | None = None,
         on_file: Callable[[FileResult], None] | None = None, link: bool = True,
         on_link: Callable | None = None) -> ScanReport:
    """Scan `paths` into `store` and run the rules (`settings`; default: all rules).

    `on_start(files, total_bytes)` is called once the files are known, `on_file(result)` after
    each file is handled (the CLI's progress bar). With `scheduler` (a dask scheduler address
    or scheduler file) the workers are a dask cluster's instead of local processes. With `link`,
    a timeline and an Nsight Compute run found side by side are linked once every file is
    stored (`check.link_pairs`; `on_link(result)` sees each).
    """
    with interrupt.watching():
        return _scan(store, paths, jobs, settings, scheduler, on_start, on_file, link, on_link)


def _scan(store: Store, paths, jobs, settings, scheduler, on_start, on_file, link, on_link) -> ScanReport:
    t0 = time.perf_counter()
    settings = settings if settings is not None else Settings()
    # Resolved like `Store.ingest` does, so `source_path` and run lookups by path agree.
    not_traces: list = []
    files = list(dict.fromkeys(str(resolved(f)) for f in find_traces(paths, not_traces)))
    # A capture-phase trace beside a graph replay is that replay's input, merged into its run
    # once every file is stored (`merge_captures`), not a run of its own.
    captures = {f: [str(c.resolve()) for c in capture_merge.capture_files(Path(f))] for f in files}
    captures = {f: c for f, c in captures.items() if c}
    captured = {c for cs in captures.values() for c in cs}
    files = [f for f in files if f not in captured]
    if not files:
        raise ScanError(f"no trace files under {' '.join(map(str, paths))}")
    if on_start:
        on_start(files, sum(file_size(f) for f in files))
    # Big streamed files are the writer's own (local scans only: a cluster's workers may see
    # files this process cannot). It reads one between two workers' results, so the workers
    # keep busy meanwhile.
    by_writer = deque(f for f in files if not scheduler and _read_by_writer(f))
    writers = set(by_writer)
    to_workers = [f for f in files if f not in writers]
    plan = JobPlan.for_scan(jobs, len(to_workers))
    ctx = WorkContext(frozenset(up_to_date_hashes(store, settings)), settings,
                      resources=Resources(1) if scheduler else plan.per_worker, hash_name=store.hash_name(),
                      stream_min_bytes=WRITER_READS_MIN_BYTES)
    if scheduler:
        outcomes = dask_outcomes(scheduler, files, ctx)
    else:
        outcomes = local_outcomes(to_workers, plan.workers, ctx)
    report = ScanReport(not_traces=not_traces)
    written: dict[str, str] = {}  # content hash -> path stored by this scan

    def handled(result: FileResult) -> None:
        report.files.append(result)
        # A failed file has a run id (its content hash) but no run: its rules never ran.
        if result.run_id and result.state != "failed" and result.run_id not in report.run_ids:
            report.run_ids.append(result.run_id)
        if on_file:
            on_file(result)
        # Between two runs (a run and its findings are committed together; a big file's
        # rules, run on the store, are done too): a reader waiting for the store gets it now.
        store.let_in_waiting()

    # The writer's own work (storing, big files' reads and rules, cross-run rules) keeps to
    # the cores asked for too.
    asked = Resources.available(jobs) if jobs and not scheduler else None

    def by_writer_next() -> FileResult:
        return check_file(store, by_writer.popleft(), settings, read_stored=True, up_to_date=ctx.up_to_date,
                          seen=written)

    with store.using(asked):
        with contextlib.closing(outcomes):
            for o in outcomes:
                result = _store_outcome(store, o, written)
                if o.trace is not None:  # stored: free its tables before the next file's work
                    freed, o.trace = o.trace.nbytes, None
                    os_memory.give_back(freed)
                handled(result)
                if by_writer:
                    handled(by_writer_next())
        while by_writer:
            handled(by_writer_next())
        _writer_passes(store, report, captures, settings, link, on_link)
    report.elapsed_s = time.perf_counter() - t0
    return report


def _writer_passes(store: Store, report: ScanReport, captures: dict, settings: Settings, link: bool,
                   on_link) -> None:
    """The passes over every run once all are stored (the per-run rules again where a capture
    was merged, the linked rules, the cross-run rules), then the diagnosis of each run they
    touched, once (`store_diagnosed`). A run's per-run findings were diagnosed as it was stored."""
    found = Found()
    if captures:
        merge_captures(store, report.files, {f: [Path(c) for c in cs] for f, cs in captures.items()}, settings,
                       found)
    if link:
        report.links, report.link_errors = link_pairs(store, report.files, settings, given_together=False,
                                                      on_link=on_link, found=found)
    cross = cross_run_settings(settings)
    if cross is not None and report.run_ids:
        try:
            run_rules(store, report.run_ids, cross, into=found)
        except Exception as e:  # the stored runs stay; say what failed
            interrupt.stop_if_interrupted(e)
            report.cross_rule_error = _one_line(e)
    store_diagnosed(store, found, settings)


def _read_by_writer(path: str) -> bool:
    return big_streamed(path, WRITER_READS_MIN_BYTES)


def _store_outcome(store: Store, o: FileOutcome, written: dict[str, str]) -> FileResult:
    """Store what a worker read (the run and its findings, one transaction), or take its
    answer as it is; the same bytes stored before by this scan make a duplicate."""
    res = o.result
    if res.state not in ("stored", "updated"):
        if res.state == "skipped":
            res.format = _stored_format(store, res.run_id)
        return res
    if res.content_hash in written:
        res.state, res.warnings = "duplicate", [f"same content as {written[res.content_hash]}"]
        return res
    try:
        stored = store.write_run(o.trace, Path(res.path), res.content_hash, res.size_bytes, findings=o.findings)
    except Exception as e:  # e.g. a reader's table that does not fit the schema
        interrupt.stop_if_interrupted(e)
        res.state, res.error, res.internal, res.detail = "failed", _one_line(e), True, traceback.format_exc()
        return res
    written[res.content_hash] = res.path
    res.state = "updated" if stored.replaced else "stored"
    return res


def _stored_format(store: Store, run_id: str) -> str | None:
    # fetchall: DuckDB 2 refuses new work on a connection with a half-read result
    rows = store.sql("SELECT format FROM runs WHERE run_id = ?", [run_id]).fetchall()
    return rows[0][0] if rows else None


# -- the per-run table ------------------------------------------------------------------

RUN_TABLE_SQL = """
SELECT r.run_id, r.file_name, r.format, r.span_ns,
       (SELECT count(*) FROM kernels k WHERE k.run_id = r.run_id) AS kernels,
       (SELECT count(*) FROM findings f WHERE f.run_id = r.run_id AND f.related_to IS NULL AND f.severity = 'error') AS errors,
       (SELECT count(*) FROM findings f WHERE f.run_id = r.run_id AND f.related_to IS NULL AND f.severity = 'warning') AS warnings,
       (SELECT count(*) FROM findings f WHERE f.run_id = r.run_id AND f.related_to IS NULL AND f.severity = 'info') AS infos
FROM runs r WHERE list_contains($ids, r.run_id)
ORDER BY r.source_path, r.run_id
"""


def run_table(store: Store, run_ids: list[str], budgets: dict[str, list[dict]] | None = None) -> pd.DataFrame:
    """One row per run: id, file, format, span, kernels, headline findings by severity, their
    estimated loss, the largest share of a device's span their measured losses are (`loss_share`)
    and their upper bounds' (`upper_share`, see `model.loss_shares`); ranked by those (`run_order`),
    the run that loses the most of its time first. `budgets`: the
    runs' `budgets_of`, when the caller has them."""
    from ..report.budget import budgets_of
    from ..report.model import loss_shares, run_order

    df = store.df(RUN_TABLE_SQL, {"ids": list(run_ids)})
    budgets = budgets if budgets is not None else budgets_of(store, list(df["run_id"]))
    heads: dict[str, list[dict]] = {}
    for rid, rule, device, loss, evidence in store.sql(
            """SELECT run_id, rule_id, device_id, est_loss_ns, evidence FROM findings
               WHERE related_to IS NULL AND est_loss_ns > 0 AND list_contains($ids, run_id)""",
            {"ids": list(run_ids)}).fetchall():
        heads.setdefault(rid, []).append({"rule_id": rule, "device_id": device, "est_loss_ns": loss,
                                          "evidence": evidence})
    df["loss_ns"] = [sum(f["est_loss_ns"] for f in heads.get(r, [])) for r in df["run_id"]]
    shares = [loss_shares(heads.get(r, []), budgets.get(r, [])) for r in df["run_id"]]
    df["loss_share"] = [s for s, _ in shares]
    df["upper_share"] = [u for _, u in shares]
    keys = [run_order(s, r.loss_ns, {"error": r.errors, "warning": r.warnings, "info": r.infos}, i, u)
            for i, (r, (s, u)) in enumerate(zip(df.itertuples(), shares))]
    return df.iloc[sorted(range(len(df)), key=keys.__getitem__)].reset_index(drop=True)
