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


# The folders of ../shared/traces that `real_corpus` checks: every real trace there is.
CORPUS_FOLDERS = ("nsys", "torch", "ncu", "ncu-text", "ncu-rep", "torch-memory")


@pytest.fixture(scope="session")
def real_corpus(tmp_path_factory):
    """Every real trace in ../shared/traces checked with every rule at default thresholds, in one
    store built once per test process and opened read-only, so that no test changes what the next
    one reads. The tests that use it run in one process (see pytest_collection_modifyitems). The
    few real files that are no profile (an ncu log of a failed application) are not stored."""
    from traceanalyzer.batch.check import check_file
    from traceanalyzer.ingest import find_traces
    from traceanalyzer.rules.engine import Settings
    from traceanalyzer.store import Store

    traces = shared_traces()
    path = tmp_path_factory.mktemp("corpus") / "corpus.duckdb"
    with Store(path) as st:
        for f in find_traces([traces / folder for folder in CORPUS_FOLDERS]):
            check_file(st, f, Settings())
    store = Store(path, read_only=True)
    yield store
    store.close()


def corpus_runs(store, *formats: str) -> list[str]:
    """The corpus store's run ids of these formats (`nsys-sqlite`, `kineto-json`, ...), by file name."""
    return [r for (r,) in store.sql("SELECT run_id FROM runs WHERE format IN (SELECT unnest($f)) "
                                    "ORDER BY file_name", {"f": list(formats)}).fetchall()]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    # One process builds the corpus store and runs every test that reads it (pytest-xdist's
    # `--dist loadgroup`), instead of each process building its own.
    # Likewise the tests that share a module's fixture (a store checked once for the module):
    # spread over two processes, each would build it.
    for item in items:
        if "real_corpus" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("corpus"))
        elif _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    # The corpus group first: pytest-xdist hands out work in this order, and the longest unit
    # handed out last would leave the other process idle at the end.
    items.sort(key=lambda item: "real_corpus" not in getattr(item, "fixturenames", ()))


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) or {}
    return any(getattr(fds[-1], "scope", None) in ("module", "class") for fds in defs.values() if fds)


def pytest_collection_finish(session):
    # A pytest-xdist that could not group them lets every process build the corpus store: slower,
    # and nothing else would say so.
    if getattr(session.config.option, "loadgroup", False) and any(
            "real_corpus" in getattr(item, "fixturenames", ()) and not item.nodeid.endswith("@corpus")
            for item in session.items):
        raise pytest.UsageError("pytest-xdist did not group the real-corpus tests (--dist loadgroup): "
                                "install the versions pyproject.toml's test extra names")


@pytest.fixture
def store(tmp_path):
    from traceanalyzer.store import Store

    s = Store(tmp_path / "t.duckdb")
    yield s
    s.close()
