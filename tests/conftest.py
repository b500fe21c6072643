"""Shared test set-up: where the real traces are, and a fresh store per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"
FIXTURES = ROOT / "fixtures"


def shared_traces() -> Path:
    """The real traces in ../shared/traces. Missing is a failure in CI, a skip elsewhere."""
    if not (SHARED_TRACES / "MANIFEST.tsv").exists():
        if os.environ.get("CI"):
            pytest.fail(f"{SHARED_TRACES} is missing and CI is set: the real-trace tests cannot run")
        pytest.skip(f"{SHARED_TRACES} not present")
    return SHARED_TRACES


def copy_fixtures(folder: Path, rel_paths: list[str]) -> Path:
    """Copies of bundled fixtures under `folder`, keeping their kind sub-folders (for scan tests)."""
    import shutil

    for rel in rel_paths:
        dst = folder / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(FIXTURES / rel, dst)
    return folder


@pytest.fixture
def traces_dir() -> Path:
    return shared_traces()


@pytest.fixture
def store(tmp_path):
    from traceanalyzer.store import Store

    s = Store(tmp_path / "t.duckdb")
    yield s
    s.close()
