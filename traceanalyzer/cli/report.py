"""`traceanalyzer report`: an HTML report (or a Markdown summary) of one or more runs."""

import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from ..report.html_timeline import MAX_OPS_DEFAULT
from .common import (DebugOpt, ReportVerboseOpt, StoreOpt, check_choices, err, note_not_traces, open_for_runs,
                     open_store)

DEFAULT_HTML = Path("report.html")
REPORT_FORMATS = ("html", "markdown")


def report(paths: Annotated[Optional[List[str]], typer.Argument(metavar="PATH_OR_RUN...", help="Trace files or folders (ingested and checked when not stored yet), or stored runs (ids, id prefixes or file names) \\[default: every run].")] = None,
           output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="FILE", help="The file to write \\[default: report.html; markdown: standard output].")] = None,
           format: Annotated[str, typer.Option("--format", metavar="FORMAT", help="html (one self-contained file) or markdown (a summary for CI job summaries and pull-request comments).")] = "html",
           markdown: Annotated[bool, typer.Option("--markdown", hidden=True, help="As --format markdown.")] = False,
           title: Annotated[Optional[str], typer.Option("--title", metavar="TITLE", help="The report's title.")] = None,
           max_ops: Annotated[int, typer.Option("--max-timeline-ops", min=1000, metavar="N", help="The most GPU operations per run drawn one by one in the timeline; past that, the longest are drawn and the rest shade the tracks.")] = MAX_OPS_DEFAULT,
           store: StoreOpt = None, verbose: ReportVerboseOpt = False, debug: DebugOpt = False):
    """Report runs as one self-contained HTML file (summary, findings, timeline, plots) or as
    Markdown; without PATH_OR_RUN, every run in the store."""
    from ..report.model import load_result

    check_choices(("--format", format, REPORT_FORMATS))
    markdown = markdown or format == "markdown"
    if not paths:
        with open_store(store, read_only=True) as st:
            paths = st.run_ids()
    st, done = open_for_runs(store, paths, debug, verbose)
    run_ids, errors = done.run_ids, done.errors
    note_not_traces(done.not_traces, verbose)
    with st:
        if not run_ids:
            err.print("error: nothing to report", markup=False)
            raise typer.Exit(2)
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


def register(app: typer.Typer) -> None:
    app.command("report")(report)
