"""Regenerate docs/schema.md and docs/rules/ from the code: `python -m traceanalyzer.gendocs [DOCS_DIR]`."""

from __future__ import annotations

import sys
from pathlib import Path

from . import schema
from .rules.docs import write_all
from .store import views


def generate(docs: Path) -> list[Path]:
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "schema.md").write_text(schema.markdown() + "\n\n" + views.markdown() + "\n")
    return [docs / "schema.md", *write_all(docs / "rules")]


if __name__ == "__main__":
    for p in generate(Path(sys.argv[1] if len(sys.argv) > 1 else "docs")):
        print(p)
