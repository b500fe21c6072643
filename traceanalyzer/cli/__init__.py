"""The `traceanalyzer` command: a thin layer over the library.

This module builds the typer `app` and registers the commands; each command lives in a
module of this package with a `register(app)`, and what they share is in `common.py`.
Command modules import `common` and the library, never this module."""

import inspect
import warnings
from typing import Annotated

import duckdb
import typer

from ..rules import EvidenceMismatch
from . import check, diff, export, export_trace, ingest, link, query, ranges, report, rules, runs, scan
from .common import err, out

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  context_settings={"help_option_names": ["-h", "--help"]})


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        out.print(f"traceanalyzer {__version__}", markup=False)
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                                help="Print the version and exit.")] = False) -> None:
    """Offline analyzer of GPU profiling traces: reads Nsight Systems SQLite exports, Nsight
    Compute CSV exports, console text reports and .ncu-rep reports, PyTorch profiler (Kineto)
    JSON traces, PyTorch memory snapshots and memory timelines into one DuckDB store, and says
    where the time went and why. Start with `check PATH...`.

    Exit codes, for every command: 0 done (the gate passed); 1 the gate failed (findings at
    --fail-on, a diff beyond --gate, a baselined finding grown beyond --max-growth); 2 a usage
    error, an input that could not be read, or a rule that raised on a run (everything readable
    is still processed).
    """


# The order `--help` lists the commands in, and the line it gives each (their own --help says
# the rest): one line at 80 columns.
COMMANDS = {
    "check": "Ingest what is new, run the rules, report findings, gate.",
    "scan": "Check every trace under folders in parallel; a line per run.",
    "summary": "Per run: time budget, GPU busy, kernels, copies, memory.",
    "runs": "List the stored runs.",
    "ranges": "GPU time per NVTX range, PyTorch operator or nn.Module.",
    "diff": "Compare two runs: what got faster or slower, and a verdict.",
    "report": "Report runs as one self-contained HTML file or as Markdown.",
    "rules": "List the rules, or explain one.",
    "ingest": "Read trace files into the store, without checking them.",
    "link": "Link a timeline run to its Nsight Compute run.",
    "query": "Run SQL against the store.",
    "export": "Write the store as a Parquet dataset.",
    "export-trace": "Write a run as a Chrome trace, a marker per finding.",
}


def _unwrap(doc: str) -> str:
    """A docstring as paragraphs of one line each, which --help wraps to the terminal's width
    (rich keeps a docstring's own line breaks, which at another width leave ragged lines)."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


def _name(info) -> str:
    return info.name or info.callback.__name__.replace("_", "-")


for _module in (check, diff, export, export_trace, ingest, link, query, ranges, report, rules, runs, scan):
    _module.register(app)
app.registered_commands.sort(key=lambda info: list(COMMANDS).index(_name(info)))
for _info in app.registered_commands:
    _info.help, _info.short_help = _unwrap(_info.help or _info.callback.__doc__ or ""), COMMANDS[_name(_info)]
_main.__doc__ = _unwrap(_main.__doc__)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning of ours (a stored finding whose evidence does not fit its rule's type) as one
    line, not Python's file:line and source line; others as Python shows them."""
    if issubclass(category, EvidenceMismatch):
        err.print(f"warning: {message}", markup=False)
    else:
        _show_python_warning(message, category, filename, lineno, file, line)


_show_python_warning = warnings.showwarning


def main() -> None:
    warnings.showwarning = _warning_line
    try:
        app()
    except duckdb.IOException as e:  # a store DuckDB opened but cannot read: damaged or cut short
        err.print(f"error: {' '.join(str(e).split())}: the store file is damaged or truncated "
                  "(restore it from a copy, or check into a new store)", markup=False)
        raise SystemExit(2) from None
