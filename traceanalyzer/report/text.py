"""Terminal output of a check: findings grouped by run and severity, then the verdict."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape as _markup_escape

from .. import fmt
from .budget import budget_line, no_budget_line
from .model import CheckResult
from .vendor import result_text, vendor_text


def escape(text) -> str:
    """Trace text for a rich console: no markup, no terminal control characters."""
    return _markup_escape(fmt.printable(text))

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _when(f: dict, run: dict) -> str:
    if f.get("start_ns") is None:
        return ""
    t0 = run.get("start_ns") or 0
    return f" at {fmt.ns(f['start_ns'] - t0)}–{fmt.ns(f['end_ns'] - t0)} into the run"


def _baseline_note(result: CheckResult, f: dict) -> str:
    if result.is_new(f):
        return ""
    g = result.growth(f)
    grew = "" if g is None or g <= 0 else f", grew {'from nothing' if g == float('inf') else f'+{g:.0f}%'}"
    over = " beyond --max-growth" if result.grown(f) else ""
    return f" [dim](in baseline{escape(grew)}{over})[/]"


def _rule_error_line(o: dict, file_name: str | None = None) -> str:
    """A rule that raised on a run: red, as it fails the check (see CheckResult.rule_errors)."""
    where = f"{escape(file_name)}: " if file_name else ""
    return f"[bold red]rule error:[/] {where}[bold]{o['rule_id']}[/] {escape(o['note'] or '')}"


def print_result(result: CheckResult, console: Console, show_info: bool = True, findings: bool = True) -> None:
    """The findings of each run (unless `findings` is False: a scan prints its table instead),
    the input errors, and the verdict."""
    for run in result.runs if findings else ():
        rid = run["run_id"]
        counts = result.counts(rid)
        console.rule(f"[bold]{escape(run['file_name'])}[/]  {rid}  ({run['format']})  "
                     f"{counts['error']} error, {counts['warning']} warning, {counts['info']} info")
        # First, which kind of slow this is: where each device's time went.
        for device in run.get("budget", []):
            console.print(f"[bold]{escape(budget_line(device))}[/]")
        if "budget" in run and not run["budget"]:
            console.print(f"[dim]{escape(no_budget_line(run))}[/]")
        for f in result.headlines(rid):
            if f["severity"] == "info" and not show_info:
                continue
            loss = f" · est. loss {fmt.ns(f['est_loss_ns'])}" if f.get("est_loss_ns") else ""
            console.print(f"[{_STYLE[f['severity']]}]{f['severity']:<7}[/] [bold]{f['rule_id']}[/] "
                          f"{escape(f['message'])}{loss}{_baseline_note(result, f)}")
            where = _when(f, run)
            if where:
                console.print(f"        [dim]{escape(where.strip())}[/]")
            if f.get("hint"):
                console.print(f"        [green]hint:[/] {escape(f['hint'])}")
            if f.get("vendor"):
                console.print(f"        [dim]NVIDIA: {escape(vendor_text(f['vendor']))}[/]")
            # The same root cause seen by other rules: evidence, not a second loss.
            for r in result.related(f):
                own = f" [dim](its estimate {fmt.ns(r['rule_loss_ns'])}, part of the above)[/]" if r.get("rule_loss_ns") else ""
                console.print(f"        [dim]related:[/] [bold]{r['rule_id']}[/] {escape(r['message'])}{own}"
                              f"{_baseline_note(result, r)}")
        theirs = run.get("vendor_unmatched") or []
        if theirs and result.show_vendor_rules:
            console.print(f"[bold]NVIDIA's results no rule of ours matches ({len(theirs)}):[/]")
            for v in theirs:
                console.print(f"  {escape(result_text(v))}")
        elif theirs:
            console.print(f"[dim]{len(theirs)} NVIDIA rule result(s) that no finding matches: --show-vendor-rules "
                          f"lists them[/]")
        for o in result.outcomes:
            if o["run_id"] == rid and o["status"] == "error":
                console.print(_rule_error_line(o))
            elif o["run_id"] == rid and o["status"] == "no-data":
                console.print(f"[dim]{o['rule_id']} not applicable: {escape(o['note'] or '')}[/]")
        not_run = result.not_run(rid)
        if not_run:
            console.print(f"[dim]not run (not selected): {', '.join(not_run)}[/]")
    if not findings:  # a scan's table has no per-run section: list them here
        files = {r["run_id"]: r["file_name"] for r in result.runs}
        for o in result.rule_errors():
            console.print(_rule_error_line(o, files.get(o["run_id"], o["run_id"])))
    for e in result.errors:
        console.print(f"[red]input error:[/] {escape(e.path)}: {escape(e.message)}")
    total = result.counts()
    failing = result.failing()
    rule_errors = result.rule_errors()
    problems = []
    if result.errors:
        problems.append(f"{len(result.errors)} input(s) could not be read")
    if rule_errors:
        problems.append(f"{len(rule_errors)} rule error(s) (a rule raised; its findings are missing)")
    if failing:
        problems.append(f"{len(failing)} finding(s) at or above '{result.fail_on}'")
    verdict = (f"[bold red]FAIL[/]: {'; '.join(problems)}" if problems
               else f"[bold green]OK[/]: nothing at or above '{result.fail_on}'")
    if result.baseline is not None:
        grown = "" if result.baseline.max_growth_pct is None else \
            f" unless grown by more than {result.baseline.max_growth_pct:g}%"
        verdict += f" (findings in the baseline do not count{grown})"
    related = len(result.findings) - len(result.headlines())
    under = f" ({related} related finding(s) under them)" if related else ""
    console.print(f"\n{len(result.runs)} run(s) checked: {total['error']} error, {total['warning']} warning, "
                  f"{total['info']} info{under}. {verdict}")
