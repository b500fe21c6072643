"""`traceanalyzer check PATH...`: ingest what is new, run the rules, report, gate."""

from typing import Annotated, List

import typer

from .common import (BaselineOpt, CaptureOpt, CheckVerboseOpt, ConfigOpt, DebugOpt, FailOpt, FormatOpt, IgnoreOpt, JsonOpt,
                     JunitOpt, MaxGrowthOpt, NoLinkOpt, OutputOpt, QuietOpt, SarifOpt, SelectOpt, StoreOpt, ThresholdOpt,
                     WriteBaselineOpt, FileLines, LinkLines, check_options, emit, err, note_not_traces, open_store,
                     report_targets)


def check(paths: Annotated[List[str], typer.Argument(metavar="PATH...", help="Trace files or folders (what is not stored yet is ingested), or stored runs: id, id prefix or file name.")],
          store: StoreOpt = None, fail_on: FailOpt = None, select: SelectOpt = None, ignore: IgnoreOpt = None,
          threshold: ThresholdOpt = None, config: ConfigOpt = None, format: FormatOpt = "text",
          output: OutputOpt = None, sarif: SarifOpt = None, junit: JunitOpt = None, json_file: JsonOpt = None,
          baseline: BaselineOpt = None, max_growth: MaxGrowthOpt = None,
          write_baseline: WriteBaselineOpt = None, quiet: QuietOpt = False, verbose: CheckVerboseOpt = False,
          debug: DebugOpt = False, no_link: NoLinkOpt = False, capture: CaptureOpt = None,
          show_vendor_rules: Annotated[bool, typer.Option(
              "--show-vendor-rules", help="List, per run, the results of NVIDIA's own rules (in Nsight Compute "
              "reports) that no finding matches.")] = False):
    """Ingest what is not stored yet, run the rules, and report the findings by run and
    severity. Exit 0 when the gate passes, 1 when a finding fails it (--fail-on, --baseline,
    --max-growth), 2 on a usage error, an input that could not be read or a rule that raised."""
    from ..batch.check import UsageError, run_check

    opts = check_options(paths, fail_on, select, ignore, threshold, config, baseline, max_growth, format)
    targets = report_targets(format, output, sarif, junit, json_file)
    opts.link = not no_link
    opts.captures = list(capture or [])
    try:
        with open_store(store) as st:
            # Progress lines go to stderr so that stdout holds only the report.
            lines, links = FileLines(debug, verbose, progress=err), LinkLines(err)
            result = run_check(st, opts, on_file=lines, on_link=links)
            lines.finish()
            links.finish()
    except UsageError as e:
        err.print(f"error: {e}", markup=False)
        raise typer.Exit(2)
    result.show_vendor_rules = show_vendor_rules
    note_not_traces(result.not_traces, verbose)
    emit(result, targets, write_baseline, quiet, verbose=verbose)


def register(app: typer.Typer) -> None:
    app.command()(check)
