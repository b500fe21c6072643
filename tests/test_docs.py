"""Is it documented? The committed docs must be what the code generates."""

from __future__ import annotations

from traceanalyzer.gendocs import generate
from traceanalyzer.rules import all_rules

from .conftest import ROOT


def test_generated_docs_are_committed(tmp_path):
    for fresh in generate(tmp_path):
        committed = ROOT / "docs" / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} missing: run python -m traceanalyzer.gendocs"
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale: run python -m traceanalyzer.gendocs"


def test_every_rule_is_fully_described():
    for r in all_rules():
        assert r.id[0] in "STBIM" and r.id[1:].isdigit(), r.id
        for field in ("title", "what", "why", "how", "fix", "requires"):
            assert len(getattr(r, field)) > 10, (r.id, field)
        for t in r.thresholds:
            assert t.doc, (r.id, t.name)
            # a unit or a dimensionless kind in every threshold name
            assert t.name.endswith(("_ns", "_share", "_bytes", "_pct", "_waves", "_count", "_examples", "_ratio")), t.name


def test_readme_lists_every_rule():
    readme = (ROOT / "README.md").read_text()
    for r in all_rules():
        assert r.id in readme, f"README does not mention {r.id}"
