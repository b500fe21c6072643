"""A rule's documentation, generated from its metadata.

`traceanalyzer rules ID` prints it and `docs/rules/ID.md` is written from it
(`python -m traceanalyzer.gendocs`), so the two never drift; a test checks the
committed pages match.
"""

from __future__ import annotations

from pathlib import Path

from . import all_rules
from .base import Rule


def rule_markdown(rule: Rule) -> str:
    lines = [
        f"# {rule.id} `{rule.name}`: {rule.title}",
        "",
        f"Phase: **{rule.phase}** · default severity: **{rule.severity}**"
        + (f" (at most **{rule.max_severity}**)" if rule.max_severity else "") + " · "
        f"claims: {f'**{rule.claims}** time of the budget' if rule.claims else 'no time of the budget'}"
        + (f" · NVIDIA's counterpart: {', '.join(f'`{n}`' for n, _ in rule.nvidia)}" if rule.nvidia else ""),
        "",
        "## What it detects", "", rule.what, "",
        "## Why it matters", "", rule.why, "",
        "## How it is computed", "", rule.how, "",
        "## Severity", "", _severity(rule), "",
        "## Thresholds", "",
    ]
    if rule.thresholds:
        lines += ["| name | default | allowed | meaning |", "|---|---|---|---|"]
        lines += [f"| `{t.name}` | {t.default} | {t.range_text()} | {t.doc}"
                  f"{' Evidence only: any value gives the same findings.' if t.display else ''} |"
                  for t in rule.thresholds]
        lines += ["", "Set them with `--threshold " f"{rule.id}.{rule.thresholds[0].name}=VALUE` or in "
                  "`[tool.traceanalyzer.thresholds." f"{rule.id}]` of `pyproject.toml` / "
                  "`[thresholds." f"{rule.id}]` of `traceanalyzer.toml`."]
    elif not rule.shared:
        lines.append("None.")
    if rule.shared:
        lines += ["", "It also reads " + ", ".join(f"`{ref}`" for ref in rule.shared) + ": those rules' "
                  "thresholds, one value for both, set there (`--threshold " f"{rule.shared[0]}=VALUE`)."]
    lines += ["", "## Data it needs", "", f"{rule.requires[0].upper()}{rule.requires[1:]}. "
              "A run without it is listed as `no-data` for this rule, not as clean.", "",
              "## How to fix", "", rule.fix, ""]
    if rule.example:
        lines += ["## Example", "", rule.example, ""]
    if rule.references:
        lines += ["## References", ""] + [f"- {r}" for r in rule.references] + [""]
    return "\n".join(lines)


def _severity(rule: Rule) -> str:
    text = ("On a timeline a headline's severity follows its estimated loss as a share of its device's span "
            "([bands](README.md#severity)); the rule's own severity (**" + rule.severity + "** unless it says "
            "otherwise) stands for a finding without a loss estimate and on a run without a timeline.")
    if rule.max_severity:
        text += f" It is at most **{rule.max_severity}**: {rule.severity_reason}."
    return text


def index_markdown(appendix: str = "") -> str:
    lines = ["# Rules", "", "Generated from the rules' metadata (`python -m traceanalyzer.gendocs`).", "",
             "| id | name | phase | severity | title |", "|---|---|---|---|---|"]
    lines += [f"| [{r.id}]({r.id}.md) | `{r.name}` | {r.phase} | {r.severity}"
              f"{f' (at most {r.max_severity})' if r.max_severity else ''} | {r.title} |" for r in all_rules()]
    return "\n".join(lines) + "\n" + (f"\n{appendix.strip()}\n" if appendix else "")


def write_all(folder: Path, appendix: str = "") -> list[Path]:
    """Every rule's page and the index (`appendix`: what the index says after the table)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for r in all_rules():
        p = folder / f"{r.id}.md"
        p.write_text(rule_markdown(r))
        written.append(p)
    (folder / "README.md").write_text(index_markdown(appendix))
    return written

