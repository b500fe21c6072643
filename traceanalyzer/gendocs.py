"""Regenerate docs/schema.md and docs/rules/ from the code: `python -m traceanalyzer.gendocs [DOCS_DIR]`."""

from __future__ import annotations

import sys
from pathlib import Path

from . import diagnosis, kernel_library, schema
from .rules.docs import write_all
from .store import views


def generate(docs: Path) -> list[Path]:
    docs.mkdir(parents=True, exist_ok=True)
    libraries = ("## Kernel libraries\n\n" + kernel_library.__doc__.strip().split("\n\n", 1)[1].replace("\n", " ")
                 + "\n\n" + kernel_library.markdown())
    (docs / "schema.md").write_text(schema.markdown() + "\n\n" + libraries + "\n\n" + views.markdown() + "\n")
    return [docs / "schema.md", *write_all(docs / "rules", _floor_markdown())]


def _floor_markdown() -> str:
    """The severity floor, from `diagnosis`: it applies to every rule's findings."""
    text = diagnosis.__doc__.split("4. **A severity floor.**", 1)[1].split("\n\n", 1)[0]
    lines = ["## Severity floor", "", " ".join(text.split()), "", "| threshold | default | meaning |", "|---|---|---|"]
    lines += [f"| `floor.{t.name}` | {t.default} | {t.doc} |" for t in diagnosis.FLOORS]
    return "\n".join(lines)


if __name__ == "__main__":
    for p in generate(Path(sys.argv[1] if len(sys.argv) > 1 else "docs")):
        print(p)
