"""What the commands share: the consoles, the store, the options, the error lines, the
progress lines, and writing a check's report. Imports no other module of the
command line, so that every command module can import it."""

# No `from __future__ import annotations`: typer reads the option types below when a command
# module uses them in its signature.
import os
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, List, NoReturn, Optional

import typer
from rich.console import Console
from rich.text import Text

from .. import fmt
from ..ingest import one_line
from ..report import FORMATS
from ..report.model import InputError
from ..store import Store, StoreError, default_path

if TYPE_CHECKING:  # the library is imported where used: `traceanalyzer --help` stays quick
    from ..batch.check import CheckOptions, FileResult

# Piped output (CI logs, files) has no terminal width; rich would wrap tables at 80 columns.
PIPED_WIDTH = 160


def _width(stream) -> Optional[int]:
    return None if os.environ.get("COLUMNS") or (hasattr(stream, "isatty") and stream.isatty()) else PIPED_WIDTH


out = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


# -- the store --------------------------------------------------------------------------

StoreOpt = Annotated[Optional[Path], typer.Option(
    "--store", envvar="TRACEANALYZER_STORE", show_envvar=True, metavar="PATH",
    help="The DuckDB store file to use \\[default: ./traceanalyzer.duckdb].")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the traceback of an internal error.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="List the files a folder walk passed over "
                                                                  "because they are no traces.")]
CheckVerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", help="List the files a folder walk passed over because they are no traces, and each file "
                            "already stored (not read again); in the text report, every finding of a rule that "
                            "found many kernels, and what each rule not applicable needs.")]
ReportVerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", help="List the files a folder walk passed over because they are no traces, and each file "
                            "already stored (not read again).")]


def open_store(store: Optional[Path], read_only: bool = False) -> Store:
    """The store at `store` (default: ./traceanalyzer.duckdb); one that cannot be opened is
    an error line and exit 2."""
    try:
        return Store(store or default_path(), read_only=read_only)
    except StoreError as e:
        err.print(f"error: {e}", markup=False)
        raise typer.Exit(2)


# -- inputs: error lines, ingest progress, runs named on the command line ----------------

def check_choices(*choices: tuple[str, str, tuple]) -> None:
    """Each (option, value, allowed): exit 2 with a one-line error on a value not allowed."""
    for option, value, allowed in choices:
        if value not in allowed:
            err.print(f"error: {option} must be one of {', '.join(allowed)}, not {value!r}", markup=False)
            raise typer.Exit(2)


def resolve_runs(st: Store, refs: Optional[List[str]]) -> list[str]:
    """The run ids `refs` name (ids, id prefixes or file names), every run without any; exit 2
    with the store's one-line error on a ref it does not know."""
    try:
        return [st.resolve_run(r) for r in refs] if refs else st.run_ids()
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


_STATE_WORDS = {"stored": "ok", "updated": "replaced", "kept": "skipped (already stored)",
                "skipped": "skipped (already stored)", "duplicate": "skipped (duplicate)"}


def file_line(r: "FileResult", debug: bool, progress: Console = out) -> None:
    """The line for one file checked or ingested: to `progress`, or an error line to stderr."""
    if r.state == "failed":
        print_input_error(r.input_error, debug)
        return
    c = r.counts
    detail = (f"kernels={c.get('kernels', 0)} copies={c.get('copies', 0)} "
              f"api_calls={c.get('api_calls', 0)} span={fmt.ns(r.span_ns)}") if c else ""
    progress.print(f"{_STATE_WORDS[r.state]:<8} {r.format or '?':<12} {r.run_id}  {r.path}  {detail}".rstrip(),
                   markup=False)
    if r.capture:
        progress.print(f"         {r.capture}", markup=False)
    for w in r.warnings:
        err.print(f"warning: {r.path}: {w}", markup=False)


class FileLines:
    """`file_line` for each file of a batch (an `on_file`), except those already stored and not
    read again (`kept`, `skipped`): a rerun over the same folder would list every file again.
    They are counted, for one line at the end (`finish`), and each listed only with `verbose`."""

    def __init__(self, debug: bool, verbose: bool, progress: Console = out):
        self.debug, self.verbose, self.progress = debug, verbose, progress
        self.stored: list[str] = []
        self.warned = 0  # reader warnings of the runs checked again (kept when they were read)

    def __call__(self, r: "FileResult") -> None:
        if r.state in ("kept", "skipped") and not r.capture:
            self.stored.append(r.path)
            self.warned += len(r.warnings)
            if not self.verbose:
                return
        file_line(r, self.debug, self.progress)

    def finish(self) -> None:
        if self.stored and not self.verbose:
            what = "file(s)" if all(Path(p).is_file() for p in self.stored) else "input(s)"
            also = f" with the {self.warned} reader warning(s) they were stored with" if self.warned else ""
            err.print(f"note: {len(self.stored)} {what} already stored, not read again (--verbose lists them{also})",
                      markup=False)


class LinkLines:
    """`link_lines` for each timeline and Nsight Compute pair linked (an `on_link`) whose links
    are new or changed; a pair linked as before is counted, for one line at the end (`finish`)."""

    def __init__(self, console: Console = err, limit: Optional[int] = 3):
        self.console, self.limit, self.unchanged = console, limit, 0

    def __call__(self, result) -> None:
        if result.changed:
            link_lines(result, self.console, limit=self.limit)
        else:
            self.unchanged += 1

    def finish(self) -> None:
        if self.unchanged:
            err.print(f"note: {self.unchanged} timeline and Nsight Compute pair(s) linked as before", markup=False)


def link_lines(result, console: Console = err, names: Optional[dict] = None, limit: Optional[int] = 20) -> None:
    """The lines of a timeline and an Nsight Compute run linked (`link.describe`)."""
    from ..link import describe

    for line in describe(result, names, limit):  # kernel names come from files: shown as written
        console.print(fmt.printable(line), markup=False)


def settings_or_exit(opts: "CheckOptions"):
    """`check.settings_from(opts)`: (settings, fail_on), or a usage error line and exit 2."""
    from ..batch.check import UsageError, settings_from

    try:
        return settings_from(opts)
    except UsageError as e:
        err.print(f"error: {e}", markup=False)
        raise typer.Exit(2)


def open_for_runs(store: Optional[Path], refs: List[str], debug: bool, verbose: bool = False):
    """The store and `check.runs_for` of `refs` on it, with the rules `check` would run (the
    config file's select, ignore and thresholds), a line per file checked and per ref that
    names nothing (to stderr; the files already stored one line in all, `FileLines`). The store is opened read-only when nothing is to be written
    (every ref names a stored run with current findings): a report of those needs no write
    access, and shares the store with other readers. Returns (store, Checked)."""
    from ..batch.check import CheckOptions, needs_writing, runs_for

    settings, _ = settings_or_exit(CheckOptions(paths=[]))
    st = None
    if not any(Path(ref).exists() for ref in refs):
        st = open_store(store, read_only=True)
        try:
            if needs_writing(st, refs, settings):
                st.close()
                st = None
        except BaseException:
            st.close()
            raise
    st = st or open_store(store)
    try:
        lines = FileLines(debug, verbose, progress=err)
        done = runs_for(st, refs, settings, on_file=lines)
        lines.finish()
        return st, done
    except BaseException:
        st.close()
        raise


# -- the options `check` and `scan` share: the rules, the gate and the artifact -----------

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
OutputOpt = Annotated[Optional[List[str]], typer.Option(
    "--output", "-o", metavar="[FORMAT=]FILE",
    help=f"FORMAT=FILE: also write the report in FORMAT ({', '.join(FORMATS)}) to FILE (repeat for several; "
         "standard output keeps the --format report). FILE alone: write the --format report there instead of "
         "standard output.")]
SarifOpt = Annotated[Optional[Path], typer.Option(
    "--sarif", metavar="FILE", help="Also write the SARIF report to FILE (as -o sarif=FILE).")]
JunitOpt = Annotated[Optional[Path], typer.Option(
    "--junit", metavar="FILE", help="Also write the JUnit XML report to FILE (as -o junit=FILE).")]
JsonOpt = Annotated[Optional[Path], typer.Option(
    "--json", metavar="FILE", help="Also write the JSON report to FILE (as -o json=FILE).")]
BaselineOpt = Annotated[Optional[Path], typer.Option(
    "--baseline", metavar="FILE", help="A JSON report of an earlier check: only findings not in it fail the gate.")]
MaxGrowthOpt = Annotated[Optional[float], typer.Option(
    "--max-growth", metavar="PCT", help="With --baseline: a finding in it also fails the gate when its estimated "
                                        "loss (or value, when it has no loss) grew by more than PCT percent.")]
WriteBaselineOpt = Annotated[Optional[Path], typer.Option(
    "--write-baseline", metavar="FILE", help="Save this check's findings as a baseline file (a JSON report); the "
                                             "findings do not fail this run (exit 0 unless an input or a rule "
                                             "failed).")]
NoLinkOpt = Annotated[bool, typer.Option(
    "--no-link", help="Do not link a timeline (nsys, Kineto) to the Nsight Compute run of the same program given "
                      "with it (or, for scan, beside it: the same stem, or a folder's only pair).")]
CaptureOpt = Annotated[Optional[List[Path]], typer.Option(
    "--capture", metavar="CAPTURE",
    help="A PyTorch profiler trace recorded while the CUDA/HIP graphs were captured (vLLM's and SGLang's "
         "graph_capture_rank_*.pt.trace.json.gz; repeat it for one per batch size): every kernel, copy and memset "
         "the graph launches of the traces given ran is placed where its node was captured, with that capture's "
         "operators, modules, Python frames and ranges, matched by its order in the graph and its kernel name. "
         "The line after the trace's says how many were placed.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="In the text report, hide info findings and the "
                                                                "line of rules not applicable.")]


def split_list(values: Optional[List[str]]) -> list[str]:
    """The items of a repeatable, comma-separated option (`--select A,B --select C`)."""
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def check_options(paths: List[str], fail_on, select, ignore, threshold, config, baseline, max_growth,
                  format: str):
    """The options of `check` and `scan` as the library's CheckOptions (usage errors exit 2)."""
    from ..batch.check import CheckOptions

    if format not in FORMATS:
        err.print(f"error: --format must be one of {', '.join(FORMATS)}, not {format!r}", markup=False)
        raise typer.Exit(2)
    return CheckOptions(paths=paths, fail_on=fail_on, select=split_list(select), ignore=split_list(ignore),
                        thresholds=threshold or [], config=config, baseline=baseline, max_growth_pct=max_growth)


@dataclass
class ReportTargets:
    """Where a check's reports go: `stdout`, the format written to standard output (None: none
    is), and `files`, (format, file) each."""

    stdout: Optional[str]
    files: list


def report_targets(format: str, output: Optional[List[str]], sarif: Optional[Path] = None,
                   junit: Optional[Path] = None, json_file: Optional[Path] = None) -> ReportTargets:
    """The reports `--format`, `-o` (repeatable: FORMAT=FILE, or FILE for the --format report),
    `--sarif`, `--junit` and `--json` ask for; a usage error line and exit 2 on a bad one."""
    targets = ReportTargets(format, [])
    for value in output or []:
        name, sep, rest = value.partition("=")
        if sep and name in FORMATS:
            if not rest:
                _usage_error(f"-o {value}: give a file after '='")
            targets.files.append((name, Path(rest)))
        elif sep and name.isalpha():
            _usage_error(f"-o {value}: the format must be one of {', '.join(FORMATS)}, not {name!r}")
        else:
            targets.files.append((format, Path(value)))
            targets.stdout = None
    for name, path in (("sarif", sarif), ("junit", junit), ("json", json_file)):
        if path is not None:
            targets.files.append((name, path))
    paths = [str(path.resolve()) for _, path in targets.files]
    for path in {p for p in paths if paths.count(p) > 1}:
        _usage_error(f"{path}: more than one report would be written to this file")
    return targets


def _usage_error(message: str) -> NoReturn:
    err.print(f"error: {message}", markup=False)
    raise typer.Exit(2)


def emit(result, targets: ReportTargets, write_baseline: Optional[Path], quiet: bool,
         text_body=None, failed_internally: bool = False, verbose: bool = False) -> None:
    """Write the reports of a check or scan (`targets`) and the baseline file if asked for,
    then exit with the result's code (2 at least when `failed_internally`; a gate failure is
    0 while recording a baseline). The log always ends with the verdict: the text report's
    last line, or, when standard output holds no text report, that line on stderr.
    `text_body(console)` prints what the text format shows before the verdict (default: the
    findings; `quiet` and `verbose` as `text.print_result` takes them)."""
    from ..report import render
    from ..report.text import print_result, verdict_line

    def text(console: Console) -> None:
        if text_body is None:
            print_result(result, console, show_info=not quiet, verbose=verbose)
        else:
            text_body(console)
            print_result(result, console, show_info=not quiet, findings=False)

    for fmt, path in targets.files:
        try:
            if fmt == "text":
                with open(path, "w") as fh:
                    text(Console(file=fh, width=120, no_color=True, highlight=False))
            else:
                path.write_text(render(result, fmt))
        except OSError as e:
            _usage_error(f"{path}: cannot write the {fmt} report: {e.strerror or e}")
        err.print(f"wrote {path} ({fmt})", markup=False)
    if targets.stdout == "text":
        text(out)
    elif targets.stdout is not None:
        sys.stdout.write(render(result, targets.stdout))
    if targets.stdout != "text":
        err.print(Text.from_markup(verdict_line(result)))
    code = max(result.exit_code(), 2 if failed_internally else 0)
    if write_baseline:
        write_baseline.write_text(render(result, "json"))
        if code == 1:  # the findings are what is being recorded, not a failure of this run
            code = 0
        err.print(f"baseline: wrote {len(result.findings)} finding(s) to {write_baseline}; they do not fail "
                  "this run", markup=False)
    raise typer.Exit(code)
