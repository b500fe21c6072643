"""The `traceanalyzer` command: a thin layer over the library."""

from __future__ import annotations


import os
import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text


from . import fmt, summary
from .ingest import one_line
from .report import FORMATS
from .report.model import InputError
from .store import Store, StoreError, default_path

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  context_settings={"help_option_names": ["-h", "--help"]})
# Piped output (CI logs, files) has no terminal width; rich would wrap tables at 80 columns.
PIPED_WIDTH = 160


def _width(stream) -> int | None:
    return None if os.environ.get("COLUMNS") or (hasattr(stream, "isatty") and stream.isatty()) else PIPED_WIDTH


out = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


def _version(value: bool) -> None:
    if value:
        from . import __version__

        out.print(f"traceanalyzer {__version__}", markup=False)
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                                help="Print the version and exit.")] = False) -> None:
    """Offline analyzer of GPU profiling traces (Nsight Systems SQLite exports, Nsight Compute
    CSV exports, PyTorch/Kineto JSON).

    Exit codes, for every command: 0 done (the gate passed); 1 the gate failed (findings at
    --fail-on, a diff beyond --gate, a baselined finding grown beyond --max-growth); 2 a usage
    error, or an input that could not be read (everything readable is still processed).
    """


StoreOpt = Annotated[Optional[Path], typer.Option(
    "--store", envvar="TRACEANALYZER_STORE", show_envvar=True, metavar="PATH",
    help="The DuckDB store file to use \\[default: ./traceanalyzer.duckdb].")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the traceback of an internal error.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="List the files a folder walk passed over "
                                                                  "because they are no traces.")]


def _open(store: Path | None, read_only: bool = False) -> Store:
    try:
        return Store(store or default_path(), read_only=read_only)
    except StoreError as e:
        err.print(f"error: {e}", markup=False)
        raise typer.Exit(2)


def error_line(e: InputError, debug: bool = False) -> str:
    """The one stderr line for an input that could not be read."""
    # Names and messages come from files: one line, no terminal escapes, whatever they hold.
    line = f"error: {one_line(e.path, 4096, exact=True)}: {one_line(e.message)}"
    return line + (" (internal error; rerun with --debug)" if e.internal and not debug else "")


def print_input_error(e: InputError, debug: bool) -> None:
    err.print(error_line(e, debug), markup=False)
    if debug and e.detail:
        err.print(e.detail, markup=False)


def note_not_traces(not_traces: list, verbose: bool) -> None:
    """One note line for the files a folder walk passed over; each of them with --verbose."""
    if not not_traces:
        return
    if verbose:
        for path, why in not_traces:
            err.print(f"skipped: {one_line(str(path), 4096, exact=True)}: {one_line(why)}", markup=False)
    else:
        err.print(f"note: passed over {len(not_traces)} file(s) that are no traces (--verbose lists them)",
                  markup=False)


def ingest_files(st: Store, paths: List[str], debug: bool, skip_existing: bool = False,
                 progress: Console = out, verbose: bool = False):
    """`check.ingest_paths` with a line per file: stored ones to `progress`, errors to stderr."""
    from .check import ingest_paths

    def on_result(r) -> None:
        c = r.counts
        state = "skipped (already stored)" if r.skipped else ("replaced" if r.replaced else "ok")
        detail = "" if r.skipped else (f"kernels={c.get('kernels', 0)} copies={c.get('copies', 0)} "
                                       f"api_calls={c.get('api_calls', 0)} span={fmt.ns(r.span_ns)}")
        progress.print(f"{state:<8} {r.format:<12} {r.run_id}  {r.path}  {detail}".rstrip(), markup=False)
        for w in r.warnings:
            err.print(f"warning: {r.path}: {w}", markup=False)

    done = ingest_paths(st, paths, skip_existing=skip_existing, on_result=on_result,
                        on_error=lambda e: print_input_error(e, debug))
    note_not_traces(done.not_traces, verbose)
    return done


@app.command()
def ingest(paths: Annotated[List[str], typer.Argument(metavar="PATH...", help="Trace files, or folders to search (recursively).")],
           store: StoreOpt = None, verbose: VerboseOpt = False, debug: DebugOpt = False):
    """Read trace files into the store, one transaction per file. A file that cannot be read
    is an error line, and the rest go on. Exit 0, or 2 when a file could not be read."""
    with _open(store) as st:
        done = ingest_files(st, paths, debug, verbose=verbose)
    if done.errors:
        err.print(f"{len(done.errors)} input(s) could not be read", markup=False)
        raise typer.Exit(2)


@app.command()
def runs(store: StoreOpt = None):
    """List stored runs."""
    with _open(store, read_only=True) as st:
        df = st.df("""
            SELECT r.run_id, r.format, r.file_name, r.producer_version, r.span_ns,
                   (SELECT count(*) FROM kernels k WHERE k.run_id = r.run_id) AS kernels,
                   (SELECT count(*) FROM copies c WHERE c.run_id = r.run_id) AS copies,
                   (SELECT string_agg(DISTINCT name, ', ') FROM devices d WHERE d.run_id = r.run_id) AS gpus
            FROM runs r ORDER BY r.ingested_at, r.run_id""")
    t = Table("run", "format", "file", "version", "span", "kernels", "copies", "GPUs")
    for r in df.itertuples():
        t.add_row(r.run_id, r.format, _t(r.file_name), _t(fmt.text(r.producer_version)), fmt.ns(r.span_ns),
                  fmt.num(r.kernels), fmt.num(r.copies), _t(fmt.text(r.gpus)))
    out.print(t)


@app.command("summary")
def summary_cmd(run: Annotated[Optional[List[str]], typer.Argument(metavar="RUN...", help="The runs to show (ids, id prefixes or file names) \\[default: every run].")] = None,
                store: StoreOpt = None,
                top: Annotated[int, typer.Option("--top", metavar="N", help="How many kernels to list.")] = 15):
    """Per run: top kernels, copies by direction and memory kind, GPU busy share per device."""
    with _open(store, read_only=True) as st:
        try:
            ids = [st.resolve_run(r) for r in run] if run else st.run_ids()
        except StoreError as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2)
        for rid in ids:
            _print_summary(st, rid, top)


def _print_summary(st: Store, rid: str, top: int) -> None:
    info = summary.run_info(st, rid)
    out.rule(Text(f"{rid}  {fmt.printable(info['file_name'])}  ({info['format']})"), style="bold")
    out.print(fmt.printable(f"span {fmt.ns(info['span_ns'])}   producer {fmt.text(info['producer'])} "
                            f"{fmt.text(info['producer_version'], '')}   host {fmt.text(info['host'])}"),
              markup=False)
    busy = summary.busy(st, rid)
    if not busy.empty:
        t = Table("device", "name", "busy", "active span", "busy share", "share of run", title="GPU busy")
        for r in busy.itertuples():
            t.add_row(str(r.device_id), _t(fmt.text(r.device)), fmt.ns(r.busy_ns), fmt.ns(r.active_span_ns),
                      fmt.pct(r.busy_share), fmt.pct(r.busy_share_of_run))
        out.print(t)
    k = summary.top_kernels(st, rid, top)
    if k.empty:
        out.print("no kernels in this run")
    else:
        t = Table("kernel", "count", "total", "mean", "median", "min", "max", "share", title="Top kernels by total time")
        for r in k.itertuples():
            t.add_row(_t(_clip(r.kernel)), fmt.num(r.count), fmt.ns(r.total_ns), fmt.ns(r.mean_ns),
                      fmt.ns(r.median_ns), fmt.ns(r.min_ns), fmt.ns(r.max_ns), fmt.pct(r.share))
        out.print(t)
    c = summary.copies(st, rid)
    if not c.empty:
        t = Table("direction", "memory", "count", "bytes", "time", "bandwidth", title="Copies")
        for r in c.itertuples():
            bw = "-" if fmt.text(r.bandwidth_gb_per_s) == "-" else f"{r.bandwidth_gb_per_s:.3g} GB/s"
            t.add_row(r.direction, r.memory_kinds, fmt.num(r.count), fmt.nbytes(r.bytes), fmt.ns(r.total_ns), bw)
        out.print(t)


def _t(s) -> Text:
    """A table cell holding trace text: shown as written (no rich markup), controls escaped."""
    return Text(fmt.printable(s))


def _clip(s: str, n: int = 80) -> str:
    s = fmt.text(s, "?")
    return s if len(s) <= n else s[: n - 1] + "…"


@app.command()
def query(sql: Annotated[str, typer.Argument(metavar="SQL", help="A query over the store's tables and views (see docs/schema.md).")],
          store: StoreOpt = None,
          csv: Annotated[bool, typer.Option("--csv", help="Write the result as CSV.")] = False,
          as_json: Annotated[bool, typer.Option("--json", help="Write the result as JSON (one array of objects).")] = False):
    """Run SQL against the store and print the result."""
    with _open(store, read_only=True) as st:
        try:
            df = st.df(sql)
        except Exception as e:  # duckdb errors: show the message, not a traceback
            err.print(f"error: {str(e).splitlines()[0]}", markup=False)
            raise typer.Exit(2)
    if csv:
        df.to_csv(sys.stdout, index=False)
    elif as_json:
        sys.stdout.write(df.to_json(orient="records", date_format="iso", default_handler=str) + "\n")
    else:
        t = Table(*map(str, df.columns))
        for row in df.itertuples(index=False):
            t.add_row(*(_t(fmt.text(v, "")) for v in row))
        out.print(t)


@app.command("rules")
def rules_cmd(rule: Annotated[Optional[str], typer.Argument(metavar="RULE", help="A rule id or name to explain.")] = None):
    """List the rules, or explain one (what, why, how it is computed, thresholds, how to fix)."""
    from .rules import all_rules, get_rule
    from .rules.docs import rule_markdown

    if rule:
        try:
            r = get_rule(rule)
        except KeyError:
            err.print(f"error: unknown rule {rule!r} (see `traceanalyzer rules`)", markup=False)
            raise typer.Exit(2)
        from rich.markdown import Markdown
        out.print(Markdown(rule_markdown(r)))
        return
    t = Table("id", "name", "phase", "severity", "title")
    for r in all_rules():
        t.add_row(r.id, r.name, r.phase, r.severity, r.title)
    out.print(t)


# Options `check` and `scan` share: the rules, the gate and the artifact.
FailOpt = Annotated[Optional[str], typer.Option(
    "--fail-on", metavar="SEVERITY",
    help="The lowest severity that fails the gate: info, warning, error or never "
         "\\[default: error, or fail-on from the config file].")]
SelectOpt = Annotated[Optional[List[str]], typer.Option(
    "--select", metavar="RULES", help="Run only these rules (ids or names; repeat or comma-separate).")]
IgnoreOpt = Annotated[Optional[List[str]], typer.Option(
    "--ignore", metavar="RULES", help="Skip these rules (ids or names; repeat or comma-separate).")]
ThresholdOpt = Annotated[Optional[List[str]], typer.Option(
    "--threshold", metavar="RULE.NAME=VALUE", help="Set a rule's threshold, e.g. T001.min_gap_ns=10000 (repeat).")]
ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", metavar="FILE", help="The pyproject.toml or traceanalyzer.toml to read "
                                     "\\[default: looked up from the current folder upwards].")]
FormatOpt = Annotated[str, typer.Option(
    "--format", metavar="FORMAT", help=f"The report's format: {', '.join(list(FORMATS)[:-1])} or {list(FORMATS)[-1]}.")]
OutputOpt = Annotated[Optional[Path], typer.Option(
    "--output", "-o", metavar="FILE", help="Write the report to this file instead of standard output.")]
BaselineOpt = Annotated[Optional[Path], typer.Option(
    "--baseline", metavar="FILE", help="A JSON report of an earlier check: only findings not in it fail the gate.")]
MaxGrowthOpt = Annotated[Optional[float], typer.Option(
    "--max-growth", metavar="PCT", help="With --baseline: a finding in it also fails the gate when its estimated "
                                        "loss (or value, when it has no loss) grew by more than PCT percent.")]
WriteBaselineOpt = Annotated[Optional[Path], typer.Option(
    "--write-baseline", metavar="FILE", help="Save this check's findings as a baseline file (a JSON report).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="In the text report, hide info findings.")]


def check_options(paths: List[str], fail_on, select, ignore, threshold, config, baseline, max_growth,
                  format: str):
    """The options of `check` and `scan` as the library's CheckOptions (usage errors exit 2)."""
    from .check import CheckOptions

    if format not in FORMATS:
        err.print(f"error: --format must be one of {', '.join(FORMATS)}, not {format!r}", markup=False)
        raise typer.Exit(2)
    return CheckOptions(paths=paths, fail_on=fail_on, select=_split(select), ignore=_split(ignore),
                        thresholds=threshold or [], config=config, baseline=baseline, max_growth_pct=max_growth)


def emit(result, format: str, output: Optional[Path], write_baseline: Optional[Path], quiet: bool,
         text_body=None, failed_internally: bool = False) -> None:
    """Write the report of a check or scan in `format` to `output` (or stdout), the baseline
    file if asked for, then exit with the result's code (2 at least when `failed_internally`).
    `text_body(console)` prints what the text format shows before the verdict (default: the
    findings)."""
    from .report import render
    from .report.text import print_result

    if write_baseline:
        write_baseline.write_text(render(result, "json"))
    if format == "text":
        def body(console: Console) -> None:
            if text_body is None:
                print_result(result, console, show_info=not quiet)
            else:
                text_body(console)
                print_result(result, console, show_info=not quiet, findings=False)
        if output:
            with open(output, "w") as fh:
                body(Console(file=fh, width=120, no_color=True, highlight=False))
        else:
            body(out)
    else:
        text = render(result, format)
        if output:
            output.write_text(text)
        else:
            sys.stdout.write(text)
    raise typer.Exit(max(result.exit_code(), 2 if failed_internally else 0))


@app.command()
def check(paths: Annotated[List[str], typer.Argument(metavar="PATH...", help="Trace files or folders; what is not stored yet is ingested.")],
          store: StoreOpt = None, fail_on: FailOpt = None, select: SelectOpt = None, ignore: IgnoreOpt = None,
          threshold: ThresholdOpt = None, config: ConfigOpt = None, format: FormatOpt = "text",
          output: OutputOpt = None, baseline: BaselineOpt = None, max_growth: MaxGrowthOpt = None,
          write_baseline: WriteBaselineOpt = None, quiet: QuietOpt = False, verbose: VerboseOpt = False,
          debug: DebugOpt = False):
    """Ingest what is not stored yet, run the rules, and report the findings by run and
    severity. Exit 0 when the gate passes, 1 when a finding fails it (--fail-on, --baseline,
    --max-growth), 2 on a usage error or an input that could not be read."""
    from .check import UsageError, run_check

    opts = check_options(paths, fail_on, select, ignore, threshold, config, baseline, max_growth, format)
    try:
        with _open(store) as st:
            # Progress lines go to stderr so that stdout holds only the report.
            result = run_check(st, opts, ingest=lambda s, p: ingest_files(s, p, debug, skip_existing=True,
                                                                         progress=err, verbose=verbose))
    except UsageError as e:
        err.print(f"error: {e}", markup=False)
        raise typer.Exit(2)
    emit(result, format, output, write_baseline, quiet)


def _split(values: Optional[List[str]]) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


# Commands that live in their own modules (traceanalyzer/commands/NAME.py, each with
# `register(app)`), found by walking that folder, so the CLI stays a thin index.
def _register_commands() -> None:
    import importlib
    import pkgutil

    from . import commands

    for m in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not m.name.startswith("_"):
            importlib.import_module(f"{commands.__name__}.{m.name}").register(app)


_register_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
