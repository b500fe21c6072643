"""Shared test set-up: where the real traces are, and a fresh store per test."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

# pytest-xdist gives its workers COLUMNS=80; the CLI's consoles take their width when imported
# (COLUMNS, else 160 for piped output), so every test process lays output out as one run does.
os.environ.pop("COLUMNS", None)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SHARED_TRACES = SHARED / "traces"
FIXTURES = ROOT / "fixtures"


def missing(what: Path | str) -> NoReturn:
    """Material a test needs is absent: a failure under CI (CI=1, CI=true), a skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing and CI is set: the tests that need it cannot run")
    pytest.skip(f"{what} not present")


def shared_traces() -> Path:
    """The real traces in ../shared/traces."""
    if not (SHARED_TRACES / "MANIFEST.tsv").exists():
        missing(SHARED_TRACES)
    return SHARED_TRACES


def shared_file(rel: str) -> Path:
    """A file under ../shared (schemas, docs)."""
    path = SHARED / rel
    if not path.exists():
        missing(path)
    return path


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
