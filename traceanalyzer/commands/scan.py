"""`traceanalyzer scan`: every trace under some paths, parsed in parallel, checked, summarized."""

# No `from __future__ import annotations`: typer reads the option types defined in register().
from pathlib import Path
from typing import Annotated, List, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich import box
from rich.table import Column, Table


def register(app: typer.Typer) -> None:
    from ..cli import DebugOpt, StoreOpt

    @app.command()
    def scan(paths: Annotated[List[str], typer.Argument(help="Trace files, folders (recursive) or globs.")],
             store: StoreOpt = None,
             jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, help="CPUs to use: N worker processes of one thread each (fewer, with more threads each, when there are fewer files); 1 is serial, in this process \\[default: every CPU].")] = None,
             scheduler: Annotated[Optional[str], typer.Option("--scheduler", help="Dask scheduler address (tcp://host:8786) or scheduler JSON file: parse and check on that cluster's workers (needs traceanalyzer\\[dask]).")] = None,
             select: Annotated[Optional[List[str]], typer.Option("--select", help="Only these rules (ids or names).")] = None,
             ignore: Annotated[Optional[List[str]], typer.Option("--ignore", help="Skip these rules.")] = None,
             threshold: Annotated[Optional[List[str]], typer.Option("--threshold", help="RULE.NAME=VALUE.")] = None,
             config: Annotated[Optional[Path], typer.Option("--config", help="pyproject.toml or traceanalyzer.toml to read.")] = None,
             debug: DebugOpt = False):
        """Find every trace under PATHS, parse and check them in parallel, store them, print one line per run.

        Files already stored with the same content (and checked with the same rules) are
        skipped, so an interrupted scan run again does only what is left. A file that cannot
        be read is an error line; the scan goes on. Exit 0, or 1 when some file failed.
        """
        from ..check import CheckOptions, UsageError, settings_from
        from ..cli import _open, _split, err, out
        from ..scan import ScanError, scan as run_scan

        try:
            settings, _ = settings_from(CheckOptions(paths=paths, select=_split(select), ignore=_split(ignore),
                                                     thresholds=threshold or [], config=config))
        except UsageError as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2)
        if scheduler and jobs:
            err.print("note: --jobs is ignored with --scheduler (the cluster's workers do the work)", markup=False)
        with _open(store) as st, _progress(err) as progress:
            task = None

            def on_start(files, total_bytes):
                nonlocal task
                task = progress.add_task("scanning", total=total_bytes or None, files=f"0/{len(files)}",
                                         n_files=len(files), n_done=0)

            def on_file(r):
                t = progress.tasks[task]
                done = t.fields["n_done"] + 1
                progress.update(task, advance=r.size_bytes, n_done=done, files=f"{done}/{t.fields['n_files']}")
                _print_file_line(progress.console, r, debug)

            try:
                report = run_scan(st, paths, jobs=jobs, settings=settings, scheduler=scheduler,
                                  on_start=on_start, on_file=on_file)
            except ScanError as e:
                progress.stop()
                err.print(f"error: {e}", markup=False)
                raise typer.Exit(2)
            except KeyboardInterrupt:
                progress.stop()
                err.print("interrupted: the runs stored so far are kept; run the same scan again to finish",
                          markup=False)
                raise typer.Exit(130)
            progress.stop()
            _print_table(out, st, report)
        if report.cross_rule_error:
            err.print(f"error: cross-run rules failed: {report.cross_rule_error}", markup=False)
        raise typer.Exit(1 if report.failed or report.cross_rule_error else 0)


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[files]} files"),
                    DownloadColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=console, transient=True, disable=not console.is_terminal)


def _print_file_line(console: Console, r, debug: bool) -> None:
    if r.state == "failed":
        note = " (internal error; rerun with --debug)" if r.internal and not debug else ""
        console.print(f"error: {r.path}: {r.error}{note}", markup=False)
        if debug and r.detail:
            console.print(r.detail, markup=False)
    for w in r.warnings:
        console.print(f"warning: {r.path}: {w}", markup=False)


def _print_table(console: Console, st, report) -> None:
    from .. import fmt
    from ..scan import run_table

    df = run_table(st, report.run_ids)
    t = Table(Column("run", no_wrap=True), Column("file", overflow="fold", min_width=16), Column("format"),
              *(Column(h, justify="right", no_wrap=True) for h in ("kernels", "span", "error", "warn", "info")),
              title="Scanned runs", show_footer=True, box=box.SIMPLE_HEAD, collapse_padding=True)
    for r in df.itertuples():
        t.add_row(r.run_id, r.file_name, r.format, fmt.num(r.kernels), fmt.ns(r.span_ns),
                  fmt.num(r.errors), fmt.num(r.warnings), fmt.num(r.infos))
    t.columns[0].footer = f"{len(df)} runs"
    t.columns[3].footer = fmt.num(int(df["kernels"].sum()))
    for i, col in ((5, "errors"), (6, "warnings"), (7, "infos")):
        t.columns[i].footer = fmt.num(int(df[col].sum()))
    console.print(t)
    stored, updated, skipped = report.count("stored"), report.count("updated"), report.count("skipped")
    dupes, failed = report.count("duplicate"), len(report.failed)
    console.print(f"{len(report.files)} files in {report.elapsed_s:.1f} s: {stored} stored, {updated} updated, "
                  f"{skipped} skipped (already stored), {dupes} duplicate, {failed} failed", markup=False)
