"""`traceanalyzer rules [RULE]`: the rules, or one rule explained."""

from typing import Annotated, Optional

import typer

from ..report.terminal import rules_table
from .common import err, out


def rules(rule: Annotated[Optional[str], typer.Argument(metavar="RULE", help="A rule id or name to explain.")] = None):
    """List the rules, or explain one (what, why, how it is computed, thresholds, how to fix)."""
    from ..rules import all_rules, get_rule
    from ..rules.docs import rule_markdown

    if rule:
        try:
            r = get_rule(rule)
        except KeyError:
            err.print(f"error: unknown rule {rule!r} (see `traceanalyzer rules`)", markup=False)
            raise typer.Exit(2)
        from rich.markdown import Markdown
        out.print(Markdown(rule_markdown(r)), soft_wrap=False)
        return
    out.print(rules_table(out, all_rules()))


def register(app: typer.Typer) -> None:
    app.command()(rules)
