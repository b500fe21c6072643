"""`traceanalyzer scan`: every trace under some paths, parsed in parallel, checked, summarized."""

import time
from typing import Annotated, List, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from ..report.scan_text import print_scan_table
from .common import (BaselineOpt, ConfigOpt, DebugOpt, FailOpt, FormatOpt, IgnoreOpt, JsonOpt, JunitOpt, MaxGrowthOpt,
                     NoLinkOpt, OutputOpt, QuietOpt, SarifOpt, SelectOpt, StoreOpt, ThresholdOpt, VerboseOpt,
                     WriteBaselineOpt, LinkLines, check_options, emit, err, note_not_traces, open_store,
                     print_input_error, report_targets)


def scan(paths: Annotated[List[str], typer.Argument(metavar="PATH...", help="Trace files, folders (searched recursively) or globs.")],
         store: StoreOpt = None,
         jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, metavar="N", help="The CPUs to use: N worker processes of one thread each (fewer, with more threads each, when there are fewer files); 1 is serial, in this process \\[default: every CPU].")] = None,
         scheduler: Annotated[Optional[str], typer.Option("--scheduler", metavar="ADDRESS", help="A Dask scheduler address (tcp://host:8786) or scheduler JSON file: parse and check on that cluster's workers (needs traceanalyzer\\[dask]).")] = None,
         fail_on: FailOpt = None, select: SelectOpt = None, ignore: IgnoreOpt = None,
         threshold: ThresholdOpt = None, config: ConfigOpt = None, format: FormatOpt = "text",
         output: OutputOpt = None, sarif: SarifOpt = None, junit: JunitOpt = None, json_file: JsonOpt = None,
         baseline: BaselineOpt = None, max_growth: MaxGrowthOpt = None,
         write_baseline: WriteBaselineOpt = None, quiet: QuietOpt = False, verbose: VerboseOpt = False,
         debug: DebugOpt = False, no_link: NoLinkOpt = False):
    """Find every trace under PATHS, parse and check them in parallel, store them, and
    report one line per run; with --format, the same report as `check`.

    Files already stored with the same content (and checked with the same rules) are
    skipped, so an interrupted scan run again does only what is left. A file that cannot
    be read is an error line, and the scan goes on. Exit codes as `check`: 0 when the gate
    passes, 1 when a finding fails it, 2 on a usage error, a file that could not be read or a
    rule that raised on a run.
    """
    from ..batch.check import UsageError, read_baseline, settings_from
    from ..report.model import InputError, load_result
    from ..batch.scan import scan as run_scan
    from ..batch.worker import ScanError
    from .. import interrupt

    opts = check_options(paths, fail_on, select, ignore, threshold, config, baseline, max_growth, format)
    targets = report_targets(format, output, sarif, junit, json_file)
    try:
        settings, fail_on = settings_from(opts)
        known = read_baseline(opts.baseline, opts.max_growth_pct) if opts.baseline else None
    except UsageError as e:
        err.print(f"error: {e}", markup=False)
        raise typer.Exit(2)
    if scheduler and jobs:
        err.print("note: --jobs is ignored with --scheduler (the cluster's workers do the work)", markup=False)
    # Ctrl-C: DuckDB's work is interrupted too, and the workers ended (`interrupt`); the runs
    # stored so far (each whole) stay.
    try:
        with interrupt.watching(), open_store(store) as st, _progress(err) as progress:
            task = None
            lines = PlainProgress(err) if not err.is_terminal else None

            def on_start(files, total_bytes):
                nonlocal task
                task = progress.add_task("scanning", total=total_bytes or None, files=f"0/{len(files)}",
                                         n_files=len(files), n_done=0)
                if lines:
                    lines.start(len(files), total_bytes)

            def on_file(r):
                t = progress.tasks[task]
                done = t.fields["n_done"] + 1
                progress.update(task, advance=r.size_bytes, n_done=done, files=f"{done}/{t.fields['n_files']}")
                _print_file_line(progress.console, r, debug)
                if lines:
                    lines.file_done(r.size_bytes)

            # A rescan links the pairs again: only new or changed links are shown.
            links = LinkLines(progress.console)
            try:
                report = run_scan(st, paths, jobs=jobs, settings=settings, scheduler=scheduler,
                                  on_start=on_start, on_file=on_file, link=not no_link, on_link=links)
            except ScanError as e:
                progress.stop()
                err.print(f"error: {e}", markup=False)
                raise typer.Exit(2)
            progress.stop()
            if lines:
                lines.finish()
            links.finish()
            note_not_traces(report.not_traces, verbose)
            for f in report.files:  # merged once every file was stored (`merge_captures`)
                if f.capture:
                    err.print(f"{f.path}: {f.capture}", markup=False)
                for w in f.warnings:
                    if w.startswith("capture "):
                        err.print(f"warning: {f.path}: {w}", markup=False)
            if report.cross_rule_error:
                err.print(f"error: cross-run rules failed: {report.cross_rule_error}", markup=False)
            result = load_result(st, report.run_ids, fail_on)
            result.baseline = known
            result.not_traces = list(report.not_traces)
            result.errors = [InputError(f.path, f.error or "failed", f.internal, f.detail) for f in report.failed]
            result.errors += report.link_errors
            table = _table(st, report)
    except KeyboardInterrupt:
        err.print("interrupted: the runs stored so far are kept; run the same scan again to finish", markup=False)
        raise typer.Exit(130)
    emit(result, targets, write_baseline, quiet, text_body=lambda console: print_scan_table(console, *table),
         failed_internally=report.cross_rule_error is not None)


class PlainProgress:
    """Progress for a log nobody watches live (CI, SLURM): when stderr is no terminal, a
    plain line every tenth of the files, and at least every `every_s` seconds."""

    def __init__(self, console: Console, every_s: float = 15.0):
        self.console, self.every_s = console, every_s

    def start(self, n_files: int, total_bytes: int) -> None:
        self.n, self.total, self.done, self.bytes = n_files, total_bytes, 0, 0
        self.t0 = self.last = time.monotonic()
        self.step = max(1, -(-n_files // 10))

    def file_done(self, size_bytes: int) -> None:
        self.done += 1
        self.bytes += size_bytes
        now = time.monotonic()
        if self.done % self.step == 0 or now - self.last >= self.every_s or self.done == self.n:
            self._line(now)

    def finish(self) -> None:
        if self.done < self.n:
            self._line(time.monotonic())

    def _line(self, now: float) -> None:
        self.last = now
        elapsed = now - self.t0
        share = self.bytes / self.total if self.total else self.done / max(self.n, 1)
        # An ETA from the first seconds is noise (the first files are small or skipped).
        eta = f", ETA {_clock(elapsed / share - elapsed)}" if 0 < share < 1 and elapsed >= 5 else ""
        self.console.print(f"scan: {self.done}/{self.n} files, {self.bytes / 1e6:,.1f} of {self.total / 1e6:,.1f} MB, "
                           f"{_clock(elapsed)} elapsed{eta}", markup=False)


def _clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[files]} files"),
                    DownloadColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=console, transient=True, disable=not console.is_terminal)


def _print_file_line(console: Console, r, debug: bool) -> None:
    if r.state == "failed":  # the error line `check` prints (`console` is the CLI's stderr)
        print_input_error(r.input_error, debug)
    for w in r.warnings:
        console.print(f"warning: {r.path}: {w}", markup=False)


def _table(st, report):
    """What the per-run table shows, read while the store is open: (rows, report)."""
    from ..batch.scan import run_table
    from ..report.budget import budget_cell, budgets_of

    budgets = budgets_of(st, list(report.run_ids))
    df = run_table(st, report.run_ids, budgets)
    df["budget"] = [budget_cell(budgets[r]) for r in df["run_id"]]
    return df, report


def register(app: typer.Typer) -> None:
    app.command()(scan)
