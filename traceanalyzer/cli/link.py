"""`traceanalyzer link TIMELINE_RUN NCU_RUN`: join an Nsight Compute run to the timeline of the
same program, and run the ncu-based rules on the timeline's kernels."""

import json
import sys
from typing import Annotated

import typer

from .common import StoreOpt, check_choices, err, link_lines, open_store, out, resolve_runs, settings_or_exit

LINK_FORMATS = ("text", "json")


def link(timeline: Annotated[str, typer.Argument(metavar="TIMELINE_RUN", help="The nsys or Kineto run (id, id prefix or file name).")],
         ncu: Annotated[str, typer.Argument(metavar="NCU_RUN", help="The Nsight Compute run of the same program.")],
         store: StoreOpt = None,
         format: Annotated[str, typer.Option("--format", metavar="FORMAT", help="text or json.")] = "text",
         all_unmatched: Annotated[bool, typer.Option("--all", help="List every unmatched launch, not the first 20 of each side.")] = False):
    """Match the Nsight Compute run's launches to the timeline run's kernels (by name, then grid
    and block, then launch order), store the links, and run the ncu-based rules (B002-B004,
    I001-I005) again on the timeline run, where their findings now name its kernels with their
    time in it. Lists what is unmatched on either side. `check` and `scan` link a timeline and an
    ncu file given together or side by side on their own (unless --no-link)."""
    from ..batch.check import CheckOptions, run_linked_rules
    from ..link import LinkError, link_runs

    check_choices(("--format", format, LINK_FORMATS))
    settings, _ = settings_or_exit(CheckOptions(paths=[]))
    with open_store(store) as st:
        run_id, ncu_id = resolve_runs(st, [timeline, ncu])
        try:
            result = link_runs(st, run_id, ncu_id)
        except LinkError as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2)
        names = dict(st.sql("SELECT run_id, file_name FROM runs WHERE list_contains(?, run_id)",
                            [[run_id, ncu_id]]).fetchall())
        run_linked_rules(st, [run_id], settings)  # as `check` does once it has linked a pair
    if format == "json":
        sys.stdout.write(json.dumps({"run_id": run_id, "ncu_run_id": ncu_id, "summary": result.summary(),
                                     "links": result.rows}, indent=2, default=str) + "\n")
    else:
        link_lines(result, out, names, limit=None if all_unmatched else 20)
    raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    app.command()(link)
