"""The `traceanalyzer` command: a thin layer over the library."""

from __future__ import annotations


import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text


from . import fmt, summary
from .ingest import TraceError, find_traces, one_line
from .store import Store, StoreError, default_path

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Offline analyzer of GPU profiling traces (nsys SQLite, ncu CSV, Kineto JSON).")
# Piped output (CI logs, files) has no terminal width; rich would wrap tables at 80 columns.
PIPED_WIDTH = 160


def _width(stream) -> int | None:
    return None if os.environ.get("COLUMNS") or (hasattr(stream, "isatty") and stream.isatty()) else PIPED_WIDTH


out = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))

StoreOpt = Annotated[Optional[Path], typer.Option(
    "--store", envvar="TRACEANALYZER_STORE", show_envvar=True,
    help="DuckDB store file \\[default: ./traceanalyzer.duckdb].")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")]


def _open(store: Path | None, read_only: bool = False) -> Store:
    try:
        return Store(store or default_path(), read_only=read_only)
    except StoreError as e:
        err.print(f"error: {e}", markup=False)
        raise typer.Exit(2)


def _error_line(path: Path, e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    # Names and messages come from files: one line, no terminal escapes, whatever they hold.
    return f"error: {one_line(str(path), 4096, exact=True)}: {one_line(msg)}"


def ingest_files(st: Store, paths: List[str], debug: bool, skip_existing: bool = False,
                 progress: Console = out) -> tuple[list, int]:
    """Ingest every trace under `paths`, printing one line per file to `progress`.
    Returns (results, failures)."""
    results, failed = [], 0
    files = list(find_traces(paths))
    if not files:
        err.print(f"error: no trace files under {' '.join(map(str, paths))}", markup=False)
        return results, 1
    for f in files:
        try:
            if not f.exists():
                raise TraceError("no such file")
            r = st.ingest(f, skip_existing=skip_existing)
        except (TraceError, StoreError, OSError) as e:
            failed += 1
            err.print(_error_line(f, e), markup=False)
            continue
        except Exception as e:  # a reader bug must not stop the batch
            failed += 1
            err.print(_error_line(f, e) + " (internal error; rerun with --debug)", markup=False)
            if debug:
                traceback.print_exc()
            continue
        results.append(r)
        c = r.counts
        state = "skipped (already stored)" if r.skipped else ("replaced" if r.replaced else "ok")
        detail = "" if r.skipped else (f"kernels={c.get('kernels', 0)} copies={c.get('copies', 0)} "
                                       f"api_calls={c.get('api_calls', 0)} span={fmt.ns(r.span_ns)}")
        progress.print(f"{state:<8} {r.format:<12} {r.run_id}  {f}  {detail}".rstrip(), markup=False)
        for w in r.warnings:
            err.print(f"warning: {f}: {w}", markup=False)
    return results, failed


@app.command()
def ingest(paths: Annotated[List[str], typer.Argument(help="Trace files or folders (recursive).")],
           store: StoreOpt = None, debug: DebugOpt = False):
    """Read trace files into the store (one transaction per file; bad files are reported, the rest go on)."""
    with _open(store) as st:
        _, failed = ingest_files(st, paths, debug)
    if failed:
        err.print(f"{failed} file(s) failed", markup=False)
        raise typer.Exit(1)


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
def summary_cmd(run: Annotated[Optional[List[str]], typer.Argument(help="Run ids (or prefixes, or file names); default all.")] = None,
                store: StoreOpt = None,
                top: Annotated[int, typer.Option(help="How many kernels to list.")] = 15):
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
def query(sql: Annotated[str, typer.Argument(help="SQL over the store's tables and views.")],
          store: StoreOpt = None,
          csv: Annotated[bool, typer.Option("--csv", help="Write CSV.")] = False,
          as_json: Annotated[bool, typer.Option("--json", help="Write JSON (one array of objects).")] = False):
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
def rules_cmd(rule: Annotated[Optional[str], typer.Argument(help="A rule id or name to explain.")] = None):
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


FailOn = typer.Option("--fail-on", help="Lowest severity that fails the check: info, warning, error or never "
                                      "\\[default: error, or fail-on from the config file].")


@app.command()
def check(paths: Annotated[List[str], typer.Argument(help="Trace files or folders; they are ingested if not stored yet.")],
          store: StoreOpt = None,
          fail_on: Annotated[Optional[str], FailOn] = None,
          select: Annotated[Optional[List[str]], typer.Option("--select", help="Only these rules (ids or names; repeat or comma-separate).")] = None,
          ignore: Annotated[Optional[List[str]], typer.Option("--ignore", help="Skip these rules.")] = None,
          threshold: Annotated[Optional[List[str]], typer.Option("--threshold", help="RULE.NAME=VALUE, e.g. T001.min_gap_ns=10000.")] = None,
          config: Annotated[Optional[Path], typer.Option("--config", help="pyproject.toml or traceanalyzer.toml to read \\[default: looked up from here upwards].")] = None,
          format: Annotated[str, typer.Option("--format", help="text, json, sarif or junit.")] = "text",
          output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report here instead of stdout.")] = None,
          baseline: Annotated[Optional[Path], typer.Option("--baseline", help="A JSON report from an earlier check: only findings not in it can fail.")] = None,
          write_baseline: Annotated[Optional[Path], typer.Option("--write-baseline", help="Save this check's findings as a baseline file (JSON report).")] = None,
          quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Text format: hide info findings.")] = False,
          debug: DebugOpt = False):
    """Ingest, run the rules, print findings; exit 0 clean, 1 a finding reaches --fail-on, 2 usage or input errors."""
    from .check import CheckOptions, UsageError, run_check

    opts = CheckOptions(paths=paths, fail_on=fail_on, select=_split(select), ignore=_split(ignore),
                        thresholds=threshold or [], config=config, baseline=baseline)
    try:
        if format not in ("text", "json", "sarif", "junit"):
            raise UsageError(f"--format must be text, json, sarif or junit, not {format!r}")
        with _open(store) as st:
            # Progress lines go to stderr so stdout holds only the report.
            result = run_check(st, opts, ingest=lambda s, p: ingest_files(s, p, debug, skip_existing=True,
                                                                         progress=err))
    except UsageError as e:
        err.print(f"error: {e}", markup=False)
        raise typer.Exit(2)
    if write_baseline:
        from .report import render
        write_baseline.write_text(render(result, "json"))
    if format == "text":
        from .report.text import print_result
        if output:
            with open(output, "w") as fh:
                print_result(result, Console(file=fh, width=120, no_color=True, highlight=False), show_info=not quiet)
        else:
            print_result(result, out, show_info=not quiet)
    else:
        from .report import render
        text = render(result, format)
        if output:
            output.write_text(text)
        else:
            sys.stdout.write(text)
    if result.errors:
        raise typer.Exit(2)
    raise typer.Exit(1 if result.failing() else 0)


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
