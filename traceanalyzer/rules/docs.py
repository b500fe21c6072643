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
              "A run without it is listed as `no-data` for this rule, not as clean.", ""]
    lines += _evidence(rule)
    lines += ["## How to fix", "", rule.fix, ""]
    if rule.example:
        lines += ["## Example", "", rule.example, ""]
    if rule.references:
        lines += ["## References", ""] + [f"- {r}" for r in rule.references] + [""]
    return "\n".join(lines)


def _evidence(rule: Rule) -> list[str]:
    """The fields of its findings' evidence: its own in a table (nested objects' fields as
    `parent.child`, `[]` for each item of a list), then the keys shared steps may add."""
    from .evidence import fields, own_fields

    if rule.evidence is None:
        return []
    own = own_fields(rule.evidence)
    rows = fields(rule.evidence)
    top = lambda name: name.split(".")[0].split("[")[0].split("{")[0]  # noqa: E731
    lines = ["## Evidence", "", f"What each finding's `evidence` (JSON) holds, declared by `{rule.evidence.__name__}` "
             "in the rule's module and read by the reports through it (`rules.evidence_of`). A field whose type says "
             "\"or null\" may be null or left out.", "",
             "| field | type | meaning |", "|---|---|---|"]
    lines += [f"| `{n}` | {t} | {m} |" for n, t, m in rows if top(n) in own]
    shared = [(n, t, m) for n, t, m in rows if top(n) not in own and top(n) == n]
    if shared:
        lines += ["", "Besides, the [shared keys](README.md#evidence-keys-shared-by-rules) "
                  + ", ".join(f"`{n}`" for n, _, _ in shared) + "."]
    return lines + [""]


def _shared_keys() -> list[str]:
    """The keys of the shared bases (rules/evidence.py), each once, for the index page."""
    from . import evidence as e
    from .evidence import fields

    lines = ["## Evidence keys shared by rules", "", "Keys that steps shared by several rules add to a finding's "
             "evidence (rules/evidence.py); each rule's page says which of them its findings may carry.", "",
             "| key | type | meaning | added by |", "|---|---|---|---|"]
    seen: set[str] = set()
    base = {"severity_reason": "a rule lowering one finding's severity, abstention (rules/_unknown.py)",
            "cause": "abstention (rules/_unknown.py)", "missing": "abstention (rules/_unknown.py)"}
    for kind, by in ((e.Evidence, "the diagnosis (traceanalyzer/diagnosis.py)"),
                     (e.PlacedEvidence, "rules over many intervals (analyses/place.py)"),
                     (e.KernelEvidence, "kernel rules: the launching operator (rules/_code.py)"),
                     (e.NcuEvidence, "Nsight Compute rules on a linked timeline (rules/_ncu.py)"),
                     (e.NcuTimedEvidence, "Nsight Compute rules that time the kernel")):
        for n, t, m in fields(kind):
            if n not in seen:
                seen.add(n)
                lines.append(f"| `{n}` | {t} | {m} | {base.get(n, by)} |")
    return lines


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
    lines += [""] + _shared_keys()
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

