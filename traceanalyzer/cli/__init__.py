"""The `traceanalyzer` command: a thin layer over the library.

This module builds the typer `app` and registers the commands; each command lives in a
module of this package with a `register(app)`, and what they share is in `common.py`.
Command modules import `common` and the library, never this module."""

from typing import Annotated

import typer

from . import check, diff, export, export_trace, ingest, link, query, ranges, report, rules, runs, scan
from .common import out

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
    """Offline analyzer of GPU profiling traces (Nsight Systems SQLite exports, Nsight Compute
    CSV exports, PyTorch/Kineto JSON).

    Exit codes, for every command: 0 done (the gate passed); 1 the gate failed (findings at
    --fail-on, a diff beyond --gate, a baselined finding grown beyond --max-growth); 2 a usage
    error, an input that could not be read, or a rule that raised on a run (everything readable
    is still processed).
    """


# The order `--help` lists the commands in.
for _module in (ingest, runs, ranges, query, rules, check, link, diff, export, export_trace, report, scan):
    _module.register(app)


def main() -> None:
    app()
