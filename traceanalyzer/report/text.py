"""Terminal output of a check: per run, where the time went, the findings and the rules that
did not apply; then the input errors and the verdict.

Every line is wrapped to the console's width with a hanging indent, so that a finding reads
as one block at any width. Headline findings of one rule and severity on `GROUP_AT` or more
kernels print as one block, the largest first (`_weight`), `TOP_LISTED` of them unless
`verbose`. The grouping is presentation only: JSON and SARIF keep every finding.
"""

from __future__ import annotations

import math
from collections import Counter

from rich.console import Console
from rich.markup import escape as _markup_escape
from rich.text import Text

from .. import fmt
from ..rules import evidence_of
from ..rules.evidence import NcuTimedEvidence
from .budget import budget_line, no_budget_line, warmup_line, without_kernels_line
from .model import CheckResult, place_of
from .vendor import result_text, vendor_text

GROUP_AT = 5  # per-kernel headlines of one rule and severity that print as one block
TOP_LISTED = 3  # the members of such a block listed unless --verbose
INDENT = 8  # where a finding's text starts, and its hint, related and NVIDIA lines


def escape(text) -> str:
    """Trace text for a rich console: no markup, no terminal control characters."""
    return _markup_escape(fmt.printable(text))

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _line(console: Console, body: str, lead: str = "", indent: int = 0) -> None:
    """`lead` and `body` (rich markup) on one line, `indent` columns in, wrapped to the
    console's width: the continuation lines start under the body's first character."""
    first = Text(" " * indent) + (Text.from_markup(lead) + " " if lead else Text())
    hang = first.cell_len
    text = Text.from_markup(body)
    text.plain = fmt.glue_units(text.plain)  # (same length: the styles stay where they were)
    for i, piece in enumerate(text.wrap(console, max(20, console.width - hang), overflow="fold")):
        piece.plain = fmt.unglue(piece.plain)
        piece.rstrip()
        console.print((first if i == 0 else Text(" " * hang)) + piece, soft_wrap=True)


def _when(f: dict, run: dict) -> str:
    if f.get("start_ns") is None:
        return ""
    t0 = run.get("start_ns") or 0
    return fmt.place(f["start_ns"], f.get("end_ns"), t0, place_of(f))


def _baseline_note(result: CheckResult, f: dict) -> str:
    """Whether `f` is in the baseline and how much it grew (markup), or "" when it is new."""
    if result.is_new(f):
        return ""
    g = result.growth(f)
    grew = "" if g is None or g <= 0 else f", grew {'from nothing' if g == float('inf') else f'+{g:.0f}%'}"
    over = " beyond --max-growth" if result.grown(f) else ""
    return f"[dim](in baseline{escape(grew)}{over})[/]"


def _rule_error_line(o: dict, file_name: str | None = None) -> str:
    """A rule that raised on a run: red, as it fails the check (see CheckResult.rule_errors)."""
    where = f"{escape(file_name)}: " if file_name else ""
    return f"[bold red]rule error:[/] {where}[bold]{o['rule_id']}[/] {escape(o['note'] or '')}"


def _loss(f: dict) -> str:
    return f" · est. loss {fmt.ns(f['est_loss_ns'])}" if f.get("est_loss_ns") else ""


def _related_line(console: Console, result: CheckResult, r: dict, indent: int) -> None:
    own = f" [dim]({escape(fmt.related_estimate(r['rule_loss_ns'], r.get('claims')))})[/]" if r.get("rule_loss_ns") else ""
    note = _baseline_note(result, r)
    _line(console, f"[bold]{r['rule_id']}[/] {escape(r['message'])}{own}{' ' + note if note else ''}",
          "[dim]related:[/]", indent)


def unknown_cause(f: dict) -> list[str] | None:
    """What the trace lacks, for a finding that says its cause is unknown (rules/_unknown.py:
    evidence `"cause": "unknown"` with `"missing"`); None for the others."""
    ev = evidence_of(f["rule_id"], f.get("evidence"))
    if ev is not None and ev.cause == "unknown" and ev.missing:
        return [str(m) for m in ev.missing]
    return None


def _details(console: Console, result: CheckResult, f: dict, run: dict, indent: int) -> None:
    """What is said under a finding's line: the baseline note, when, the hint, NVIDIA's
    verdict, and the findings of other rules that saw the same root cause."""
    note = _baseline_note(result, f)
    if note:
        _line(console, note, indent=indent)
    where = _when(f, run)
    if where:
        _line(console, f"[dim]{escape(where)}[/]", indent=indent)
    missing = unknown_cause(f)
    if missing is not None:  # no fix to give: what the trace lacks instead
        _line(console, escape("the trace lacks " + "; and ".join(missing)), "[yellow]cause unknown:[/]", indent)
    elif f.get("hint"):
        _line(console, escape(f["hint"]), "[green]hint:[/]", indent)
    if f.get("vendor"):
        _line(console, f"[dim]NVIDIA: {escape(vendor_text(f['vendor']))}[/]", indent=indent)
    # The same root cause seen by other rules: evidence, not a second loss.
    for r in result.related(f):
        _related_line(console, result, r, indent)


def _finding(console: Console, result: CheckResult, f: dict, run: dict) -> None:
    _line(console, f"[bold]{f['rule_id']}[/] {escape(f['message'])}{_loss(f)}",
          f"[{_STYLE[f['severity']]}]{f['severity']:<7}[/]")
    _details(console, result, f, run, INDENT)


# -- many findings of one rule on different kernels: one block ----------------------------

def _number(x) -> float:
    """A finite float, or 0 for what is none (None, NaN, text)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else 0.0


def _duration(f: dict) -> float:
    ev = evidence_of(f["rule_id"], f.get("evidence"))
    return _number(ev.duration_ns) if isinstance(ev, NcuTimedEvidence) else 0.0


def _weight(f: dict) -> tuple:
    """How much a finding of a block weighs, largest first: its estimated loss, else its
    kernel's time (the rules' evidence `duration_ns`), else how far its value is past the
    rule's threshold (relative; one rule's findings all lie on the same side)."""
    value, threshold = _number(f.get("value")), _number(f.get("threshold"))
    past = abs(value - threshold) / abs(threshold) if threshold else 0.0
    return (-_number(f.get("est_loss_ns")), -_duration(f), -past)


def blocks(headlines: list[dict]) -> list[list[dict]]:
    """The headlines in their order, as blocks: one finding alone, or the findings of one rule
    and severity on `GROUP_AT` or more kernels, where the first of them stood, by `_weight`."""
    by_key: dict[tuple, list[dict]] = {}
    for f in headlines:
        if f.get("item_kind") == "kernel":
            by_key.setdefault((f["rule_id"], f["severity"]), []).append(f)
    grouped = {k: sorted(fs, key=_weight) for k, fs in by_key.items() if len(fs) >= GROUP_AT}
    out, placed = [], set()
    for f in headlines:
        key = (f["rule_id"], f["severity"]) if f.get("item_kind") == "kernel" else None
        if key not in grouped:
            out.append([f])
        elif key not in placed:
            placed.add(key)
            out.append(grouped[key])
    return out


def _block(console: Console, result: CheckResult, fs: list[dict], run: dict, titles: dict, verbose: bool) -> None:
    """One rule's findings on many kernels: a line for the lot, then the largest of them (all
    with `verbose`, each in full), then the hints they give."""
    head = fs[0]
    loss = sum(_number(f.get("est_loss_ns")) for f in fs)
    time = sum(_duration(f) for f in fs)
    parts = [f"{len(fs)} kernels"] + ([f"est. loss {fmt.ns(loss)} in all"] if loss else []) \
        + ([f"{fmt.ns(time)} of kernel time"] if time else [])
    listed = fs if verbose else fs[:TOP_LISTED]
    order = "largest first" if verbose else f"top {len(listed)} listed, --verbose for all"
    title = titles.get(head["rule_id"])
    _line(console, f"[bold]{head['rule_id']}[/] {escape(title + ': ' if title else '')}{' · '.join(parts)} "
                   f"[dim]({order})[/]", f"[{_STYLE[head['severity']]}]{head['severity']:<7}[/]")
    for f in listed:  # a dash and the finding, its own lines under its text
        _line(console, f"{escape(f['message'])}{_loss(f)}", "-", INDENT)
        if verbose:
            _details(console, result, f, run, INDENT + 2)
            continue
        note = _baseline_note(result, f)
        if note:
            _line(console, note, indent=INDENT + 2)
        related = Counter(r["rule_id"] for r in result.related(f))
        if related:
            ids = ", ".join(k if n == 1 else f"{k} ×{n}" for k, n in related.items())
            _line(console, f"[dim]related: {ids} (the same root cause; --verbose shows them)[/]", indent=INDENT + 2)
    if verbose:
        return
    rest = fs[len(listed):]
    if rest:
        more_loss = sum(_number(f.get("est_loss_ns")) for f in rest)
        _line(console, f"[dim]… {len(rest)} more kernel(s){f', est. loss {fmt.ns(more_loss)}' if more_loss else ''}[/]",
              indent=INDENT)
    hints = Counter(f["hint"] for f in fs if f.get("hint"))
    for i, (hint, n) in enumerate(hints.items()):  # in the order of the findings: the largest's first
        if i == TOP_LISTED:
            _line(console, f"[dim]… {len(hints) - i} other hint(s)[/]", indent=INDENT)
            break
        _line(console, ("" if len(hints) == 1 else f"[dim]{n} kernel(s):[/] ") + escape(hint), "[green]hint:[/]", INDENT)


# -- a timeline linked to Nsight Compute: each hot kernel's four passes ----------------------

def _hot_kernels(console: Console, run: dict) -> None:
    """Per hot kernel the ncu run profiled: structure, timeline, bottleneck and instruction level
    (report/passes.py), under one title line saying how the runs were linked."""
    from .passes import lines

    links = "; ".join(f"ncu run {s['ncu_run_id']}: {s['both']} launch(es) matched, {s['ncu']} ncu launch(es) and "
                      f"{s['timeline']} timeline configuration(s) unmatched" for s in run.get("links", []))
    _line(console, f"[bold]Hot kernels, timeline and Nsight Compute together[/] [dim]({escape(links)})[/]")
    for n, k in enumerate(run["hot_kernels"], 1):
        _line(console, f"[bold]{escape(k['label'])}[/]", f"{n}.", 2)
        for what, text in lines(k):
            _line(console, escape(text), f"[dim]{what:<11}[/]", 5)


# -- a run, and the whole check ------------------------------------------------------------

def _not_applicable(console: Console, result: CheckResult, rid: str, verbose: bool, quiet: bool) -> None:
    """The rules that had no data on the run: one line, or each with what it needs (`verbose`)."""
    skipped = [o for o in result.outcomes if o["run_id"] == rid and o["status"] == "no-data"]
    if not skipped:
        return
    if verbose:
        for o in skipped:
            _line(console, f"[dim]{escape(o['note'] or '')}[/]", f"[dim]{o['rule_id']} not applicable:[/]")
    elif not quiet:
        _line(console, f"[dim]{len(skipped)} rule{'s' if len(skipped) > 1 else ''} not applicable "
                       f"({', '.join(o['rule_id'] for o in skipped)}; --verbose says what each needs)[/]")


def _run_title(console: Console, run: dict, counts: dict) -> str:
    """A run's header line (rich markup): file, run id, format and its findings by severity. Where
    the console is too narrow, the format goes, then the middle of the file name: the run id and
    the counts stay whole."""
    tail = f"{counts['error']} error, {counts['warning']} warning, {counts['info']} info"
    name, rid, form = fmt.printable(run["file_name"]), run["run_id"], f"({run['format']})"
    room = console.width - 4  # a rule's line either side of its title, and a space each side
    parts = [rid, form, tail]
    if len(name) + sum(2 + len(p) for p in parts) > room:
        parts.remove(form)
    keep = room - sum(2 + len(p) for p in parts)
    if len(name) > keep >= 9:
        name = name[:(keep - 1) // 2] + "…" + name[len(name) - (keep - 1 - (keep - 1) // 2):]
    return f"[bold]{escape(name)}[/]  " + "  ".join(escape(p) for p in parts)


def print_result(result: CheckResult, console: Console, show_info: bool = True, findings: bool = True,
                 verbose: bool = False) -> None:
    """The findings of each run (unless `findings` is False: a scan prints its table instead),
    the input errors, and the verdict. `show_info` False (`-q`) hides info findings and the
    rules not applicable; `verbose` lists every finding of a block, and each rule not
    applicable with what it needs."""
    from ..rules import all_rules

    titles = {r.id: r.title for r in all_rules()}
    for run in result.runs if findings else ():
        rid = run["run_id"]
        console.rule(_run_title(console, run, result.counts(rid)))
        # First, which kind of slow this is: where each device's time went.
        for device in run.get("budget", []):
            _line(console, f"[bold]{escape(budget_line(device))}[/]")
            if warmup_line(device):
                _line(console, escape(warmup_line(device)))
        if "budget" in run and not run["budget"]:
            _line(console, f"[dim]{escape(no_budget_line(run))}[/]")
        if without_kernels_line(run.get("without_kernels")):
            _line(console, f"[bold]{escape(without_kernels_line(run['without_kernels']))}[/]")
        shown = [f for f in result.headlines(rid) if show_info or f["severity"] != "info"]
        for block in blocks(shown):
            if len(block) == 1:
                _finding(console, result, block[0], run)
            else:
                _block(console, result, block, run, titles, verbose)
        if run.get("hot_kernels"):
            _hot_kernels(console, run)
        theirs = run.get("vendor_unmatched") or []
        if theirs and result.show_vendor_rules:
            _line(console, f"[bold]NVIDIA's results no rule of ours matches ({len(theirs)}):[/]")
            for v in theirs:
                _line(console, escape(result_text(v)), indent=2)
        elif theirs:
            _line(console, f"[dim]{len(theirs)} NVIDIA rule result(s) that no finding matches: --show-vendor-rules "
                           f"lists them[/]")
        for o in result.outcomes:
            if o["run_id"] == rid and o["status"] == "error":
                _line(console, _rule_error_line(o))
        _not_applicable(console, result, rid, verbose, quiet=not show_info)
        not_run = result.not_run(rid)
        if not_run:
            _line(console, f"[dim]not run (not selected): {', '.join(not_run)}[/]")
    if not findings:  # a scan's table has no per-run section: list them here
        files = {r["run_id"]: r["file_name"] for r in result.runs}
        for o in result.rule_errors():
            _line(console, _rule_error_line(o, files.get(o["run_id"], o["run_id"])))
    for e in result.errors:
        _line(console, f"{escape(e.path)}: {escape(e.message)}", "[red]input error:[/]")
    console.print()
    _line(console, verdict_line(result))


def verdict_line(result: CheckResult) -> str:
    """The last line of a check's text report (rich markup): what was checked, and whether the
    gate passed and why not. A check that writes its report elsewhere prints it to the log."""
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
    if problems:
        verdict = f"[bold red]FAIL[/]: {'; '.join(problems)}"
    elif result.fail_on == "never":  # no severity fails: the findings were not gated
        verdict = "[bold green]OK[/]: findings not gated (--fail-on never)"
    else:
        verdict = f"[bold green]OK[/]: nothing at or above '{result.fail_on}'"
    if result.baseline is not None:
        grown = "" if result.baseline.max_growth_pct is None else \
            f" unless grown by more than {result.baseline.max_growth_pct:g}%"
        verdict += f" (findings in the baseline do not count{grown})"
    related = len(result.findings) - len(result.headlines())
    under = f" ({related} related finding(s) under them)" if related else ""
    return (f"{len(result.runs)} run(s) checked: {total['error']} error, {total['warning']} warning, "
            f"{total['info']} info{under}. {verdict}")
