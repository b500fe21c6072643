"""Regenerate docs/schema.md and docs/rules/ from the code: `python -m traceanalyzer.gendocs [DOCS_DIR]`."""

from __future__ import annotations

import sys
from pathlib import Path

from . import diagnosis, kernel_library, schema
from .rules.docs import write_all
from . import analyses


INDUCTOR_INTRO = (
    "Of the `triton` kernels, TorchInductor's are told apart by name: the SQL macros `inductor_class(name)` and "
    "`inductor_ops(name)` (the operators the name says the kernel fused, in the name's order, its trailing "
    "index left out; `native_layer_norm` and the other multi-word ATen names kept whole) read "
    "`triton_<class>_fused_<ops>_<index>`; the `compiled_kernels` view gives every such kernel with them, "
    "its launcher's `cpu_ops.kernel_meta` and the compiled region and graph call it ran in.")


def generate(docs: Path) -> list[Path]:
    docs.mkdir(parents=True, exist_ok=True)
    libraries = ("## Kernel libraries\n\n" + kernel_library.__doc__.strip().split("\n\n", 1)[1].replace("\n", " ")
                 + "\n\n" + kernel_library.markdown()
                 + "\n\n### TorchInductor kernels\n\n" + INDUCTOR_INTRO + "\n\n" + kernel_library.inductor_markdown())
    (docs / "schema.md").write_text(schema.markdown() + "\n\n" + libraries + "\n\n" + analyses.markdown() + "\n")
    return [docs / "schema.md", *write_all(docs / "rules", _floor_markdown())]


def _floor_markdown() -> str:
    """The severity bands and the order of findings, from `diagnosis`: they apply to every rule's findings."""
    doc = diagnosis.__doc__
    bands = doc.split("4. **Severity from the loss.**", 1)[1].split("\n\n", 1)[0]
    order = doc.split("5. **Order.**", 1)[1].split("\n\n", 1)[0]
    lines = ["## Severity", "", " ".join(bands.split()), "", "| threshold | default | meaning |", "|---|---|---|"]
    lines += [f"| `floor.{t.name}` | {t.default} | {t.doc} |" for t in diagnosis.FLOORS]
    lines += ["", "## Order", "", " ".join(order.split())]
    return "\n".join(lines)


if __name__ == "__main__":
    for p in generate(Path(sys.argv[1] if len(sys.argv) > 1 else "docs")):
        print(p)
