"""A Markdown summary for CI job summaries and pull-request comments.

GitHub-flavoured Markdown: one table of runs, ranked as the HTML index ranks them, then per run its summary line and its worst
findings (the rest folded into <details>). Text from traces is escaped with `md`, so a
kernel name cannot open an HTML tag, a link, or a table cell. The whole text is kept
under `max_chars` (a pull-request comment takes 65,536).
"""

from __future__ import annotations

import re

from .. import fmt, summary
from ..kernel_library import inductor_phrase
from ..store import Store
from .budget import budget_lines, no_budget_line, without_kernels_line
from .model import CheckResult, loss_shares, run_order

MAX_CHARS_DEFAULT = 60_000
TOP_FINDINGS = 10
MORE_FINDINGS = 40
# Everything that can start markup mid-line: emphasis, code, links, HTML, table cells,
# strikethrough, entities, math, mentions and issue references. (md() output never
# starts a line, so list and heading markers need no escape.)
_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#|~&$@!])")
_SPACE = re.compile(r"\s+")
_SEV_ICON = {"error": "🔴", "warning": "🟡", "info": "🔵"}


LINE_CHARS = 2000  # a run's budget and capture lines are whole sentences, not table cells


def md(s, limit: int = 200) -> str:
    """Inline text safe in a table cell: whitespace collapsed, Markdown/HTML punctuation
    backslash-escaped, clipped to `limit` characters."""
    s = _SPACE.sub(" ", "" if s is None else str(s)).strip()
    s = "".join(c if c.isprintable() else "\ufffd" for c in s)
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return _SPECIAL.sub(r"\\\1", s)


def _finding_row(f: dict, related: list[dict]) -> str:
    loss = fmt.ns(f["est_loss_ns"]) if f.get("est_loss_ns") else "-"
    also = "".join(f"<br>related: {md(r['rule_id'])} {md(r['message'], 160)}" for r in related)
    return (f"| {_SEV_ICON[f['severity']]} {f['severity']} | {md(f['rule_id'])} | {md(f['message'], 300)}{also} "
            f"| {md(loss)} | {md(f.get('hint'), 200) or '-'} |")


def _run_section(store: Store, result: CheckResult, run: dict, findings: list[dict], outcomes: list[dict],
                 not_run: list[str]) -> str:
    rid = run["run_id"]
    kernels = summary.top_kernels(store, rid, 3)
    parts = [f"### {md(run['file_name'])}", ""]
    facts = [f"run `{rid}`", md(run["format"])]
    if run.get("span_ns") is not None:
        facts.append(f"span {md(fmt.ns(run['span_ns']))}")
    parts.append(" · ".join(facts))
    # Where each device's time went, first (see report/budget.py).
    budget = run.get("budget") or []
    # (lines, not table cells: whole, however long)
    parts += [""] + ([f"- {md(line, LINE_CHARS)}" for d in budget for line in budget_lines(d)]
                     or [f"- {md(no_budget_line(run), LINE_CHARS)}"])
    if without_kernels_line(run.get("without_kernels")):
        parts.append(f"- {md(without_kernels_line(run['without_kernels']), LINE_CHARS)}")
    parts += [f"- reader warning: {md(w, LINE_CHARS)}" for w in run.get("warnings") or []]
    if len(kernels):
        parts += ["", "Top kernels: " + "; ".join(
            f"{md(k.kernel, 80)} {md(fmt.ns(k.total_ns))} ({md(fmt.pct(k.share))}"
            + (f", {md(inductor_phrase(k.kernel), 120)})" if inductor_phrase(k.kernel) else ")")
            for k in kernels.itertuples())]
    parts.append("")
    if not findings:
        parts.append("No findings.")
    else:
        head = ["| severity | rule | finding | est. loss | hint |", "|---|---|---|---|---|"]
        parts += head + [_finding_row(f, result.related(f)) for f in findings[:TOP_FINDINGS]]
        rest = findings[TOP_FINDINGS:TOP_FINDINGS + MORE_FINDINGS]
        if rest:
            parts += ["", f"<details><summary>{len(findings) - TOP_FINDINGS} more finding(s)</summary>", ""]
            parts += head + [_finding_row(f, result.related(f)) for f in rest]
            if len(findings) > TOP_FINDINGS + MORE_FINDINGS:
                parts += ["", f"… and {len(findings) - TOP_FINDINGS - MORE_FINDINGS} more (see the HTML report)."]
            parts += ["", "</details>"]
    skipped = [o for o in outcomes if o["status"] == "error"]
    if skipped:
        parts += ["", "**Rule errors** (the check fails): "
                  + "; ".join(f"{md(o['rule_id'])}: {md(o['note'], 120)}" for o in skipped)]
    if not_run:
        parts += ["", f"Not run (not selected when it was checked): {md(', '.join(not_run))}"]
    return "\n".join(parts) + "\n"


def ranked(result: CheckResult, run: dict) -> tuple:
    """A run's place in the table, as the HTML index and `scan` rank them (`model.run_order`)."""
    rid = run["run_id"]
    share, upper = loss_shares(result.headlines(rid), run.get("budget") or [])
    loss = sum(f.get("est_loss_ns") or 0 for f in result.headlines(rid))
    return run_order(share, loss, result.counts(rid), run["file_name"], upper)


def render(store: Store, result: CheckResult, *, title: str | None = None,
           max_chars: int = MAX_CHARS_DEFAULT) -> str:
    total = result.counts()
    out = [f"## {md(title or 'traceanalyzer report')}", "",
           f"{len(result.runs)} run(s): **{total['error']} error**, **{total['warning']} warning**, {total['info']} info.", ""]
    for e in result.errors:
        out.append(f"> input error: {md(e.path, 200)}: {md(e.message, 300)}")
    if result.errors:
        out.append("")
    by_run = {r["run_id"]: result.headlines(r["run_id"]) for r in result.runs}
    runs = sorted(result.runs, key=lambda r: ranked(result, r))
    out += ["| run | format | span | error | warning | info | worst finding |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        c = result.counts(r["run_id"])
        worst = by_run[r["run_id"]][0] if by_run[r["run_id"]] else None
        wtxt = f"{_SEV_ICON[worst['severity']]} {md(worst['rule_id'])} {md(worst['message'], 140)}" if worst else "-"
        out.append(f"| {md(r['file_name'], 80)} | {md(r['format'])} | {md(fmt.ns(r.get('span_ns')))} | {c['error']} "
                   f"| {c['warning']} | {c['info']} | {wtxt} |")
    out.append("")
    text = "\n".join(out) + "\n"
    note = "\n_Output shortened to fit: {n} run(s) not detailed; see the HTML report._\n"
    for i, r in enumerate(runs):
        outcomes = [o for o in result.outcomes if o["run_id"] == r["run_id"]]
        section = _run_section(store, result, r, by_run[r["run_id"]], outcomes, result.not_run(r["run_id"])) + "\n"
        if len(text) + len(section) + len(note) + 10 > max_chars:
            text += note.format(n=len(result.runs) - i)
            break
        text += section
    return text
