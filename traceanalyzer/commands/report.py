"""`traceanalyzer report`: an HTML report (or a Markdown summary) of one or more runs.
No `from __future__ import annotations` here: typer reads the option types, which are
imported inside `register` (from the CLI module), at definition time.
"""


import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer

DEFAULT_HTML = Path("report.html")


def resolve_inputs(st, refs: list[str], debug: bool) -> tuple[list[str], list]:
    """Run ids for `refs`: files and folders are ingested when not stored yet, anything
    else must name a stored run (id, id prefix or file name). Returns (run ids, InputErrors)."""
    from ..cli import err, ingest_files, print_input_error
    from ..report.model import InputError
    from ..store import StoreError

    run_ids, errors = [], []
    for ref in refs:
        if Path(ref).exists():
            done = ingest_files(st, [ref], debug, skip_existing=True, progress=err)
            run_ids += [r.run_id for r in done.results]
            errors += done.errors
            continue
        try:
            run_ids.append(st.resolve_run(ref))
        except StoreError as e:
            error = InputError(ref, f"no such file, and {e}")
            print_input_error(error, debug)
            errors.append(error)
    return list(dict.fromkeys(run_ids)), errors


def ensure_findings(st, run_ids: list[str]) -> None:
    """Run the rules on the runs that were never checked (reports read findings), with the
    settings `check` would use (the config file's select, ignore and thresholds)."""
    from ..check import CheckOptions, UsageError, settings_from
    from ..cli import err
    from ..rules.engine import run_rules

    checked = {r[0] for r in st.sql("SELECT DISTINCT run_id FROM rule_runs WHERE list_contains(?, run_id)",
                                    [run_ids]).fetchall()}
    todo = [r for r in run_ids if r not in checked]
    if todo:
        try:
            settings, _ = settings_from(CheckOptions(paths=[]))
        except UsageError as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2)
        run_rules(st, todo, settings)


def register(app: typer.Typer) -> None:
    from ..cli import DebugOpt, StoreOpt, _open, err
    from ..report.html_timeline import MAX_OPS_DEFAULT

    @app.command("report")
    def report(paths: Annotated[List[str], typer.Argument(metavar="PATH_OR_RUN...", help="Trace files or folders (ingested and checked when not stored yet), or stored runs (ids, id prefixes or file names).")],
               output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="FILE", help="The file to write \\[default: report.html; with --markdown, standard output].")] = None,
               markdown: Annotated[bool, typer.Option("--markdown", help="Write a Markdown summary (CI job summaries, pull-request comments) instead of HTML.")] = False,
               title: Annotated[Optional[str], typer.Option("--title", metavar="TITLE", help="The report's title.")] = None,
               max_ops: Annotated[int, typer.Option("--max-timeline-ops", min=1000, metavar="N", help="The most GPU operations per run drawn one by one in the timeline; past that, the longest are drawn and the rest shade the tracks.")] = MAX_OPS_DEFAULT,
               store: StoreOpt = None, debug: DebugOpt = False):
        """Report runs as one self-contained HTML file (summary, findings, timeline, plots) or as Markdown."""
        from ..report.model import load_result

        with _open(store) as st:
            run_ids, errors = resolve_inputs(st, paths, debug)
            if not run_ids:
                err.print("error: nothing to report", markup=False)
                raise typer.Exit(2)
            ensure_findings(st, run_ids)
            result = load_result(st, run_ids, fail_on="never")
            result.errors += errors
            if markdown:
                from ..report.markdown import render as render_md
                text = render_md(st, result, title=title)
            else:
                from ..report.html import render as render_html
                text = render_html(st, result, title=title, max_ops=max_ops)
        if markdown and output is None:
            sys.stdout.write(text)
        else:
            dest = output or DEFAULT_HTML
            dest.write_text(text, encoding="utf-8")
            err.print(f"wrote {dest} ({len(result.runs)} run(s), {len(text.encode()) / 1e6:.2f} MB)", markup=False)
        if errors:
            raise typer.Exit(2)
