"""Every command laid out at 80 and 200 columns: no line wider than the terminal, no number or
word cut, no header reduced to an ellipsis, the columns left out named, and --help in order."""

from __future__ import annotations

import re
import shutil

import pytest
from typer.testing import CliRunner

from traceanalyzer.cli import COMMANDS, app, common
from traceanalyzer.report.budget import budget_cell, budgets_of
from traceanalyzer.store import Store

from .conftest import FIXTURES

WIDTHS = (80, 200)
FILES = ["nsys/planted.sqlite", "nsys/graph_memory.sqlite", "nsys/window_before.sqlite", "nsys/window_after.sqlite",
         "kineto/timeline_busy.json.gz", "kineto/diff_a100_rank3.json", "kineto/diff_v100_rank1.json",
         "torch-memory/snapshot_oom.pickle", "torch-memory/timeline_train.json", "ncu/details_full.csv"]
# A real trace's name (../shared/traces/torch/): longer than 80 columns leave a file column.
LONG = "kineto__tb_plugin__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json"
PAIRS = [("window_before.sqlite", "window_after.sqlite"), ("diff_a100_rank3.json", "diff_v100_rank1.json")]
# A number standing as a word, with its unit where it has one: a number cut, or parted from its
# unit, is another token.
NUMBER = re.compile(r"(?<![^\s(#])[-+]?\d[\d,]*(?:\.\d+)?%?(?: (?:pp|ns|us|ms|s|B|KB|MB|GB|GB/s|/s))?(?![^\s,;)])")
# A header or number cut to a few characters and an ellipsis ('kerne…', '3.1…', '…'); a long
# name shortened with one is by design.
CUT = re.compile(r"(?:^|[│┃]|  ) ?\S{0,8}…(?: ?[│┃]|  |$)", re.M)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store file of the fixtures, checked, and a copy of one under a long name."""
    from traceanalyzer.batch.check import check_file
    from traceanalyzer.rules.engine import Settings

    folder = tmp_path_factory.mktemp("widths")
    shutil.copyfile(FIXTURES / "kineto" / "planted.json", folder / LONG)
    db = folder / "s.duckdb"
    with Store(db) as st:
        for path in [FIXTURES / rel for rel in FILES] + [folder / LONG]:
            check_file(st, path, Settings())
    return db


def render(monkeypatch, width: int, *args) -> str:
    """The command's standard output on a terminal `width` columns wide."""
    monkeypatch.setattr(common.out, "width", width)  # the CLI's console, made when first imported
    r = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": str(width)}, catch_exceptions=False)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    return r.stdout


def numbers(text: str) -> set[str]:
    return set(NUMBER.findall(text))


def _fits(text: str, width: int, args) -> None:
    for line in text.splitlines():
        if not line.startswith("verdict: "):  # diff's verdict is one line, as its log gets it
            assert len(line) <= width, (args, line)


def _views(db) -> list[tuple]:
    return [("runs",), ("summary",), ("rules",), ("rules", "T001"), ("ranges",), ("ranges", "--by", "op"),
            *(("diff", a, b) for a, b in PAIRS),
            ("check", *(f.split("/")[1] for f in FILES), LONG, "--fail-on", "never"),
            ("--help",), *((name, "--help") for name in COMMANDS)]


@pytest.mark.parametrize("width", WIDTHS)
def test_no_line_is_wider_than_the_terminal(monkeypatch, store, width):
    for args in _views(store):
        store_args = () if "--help" in args or args[0] == "rules" else ("--store", store)
        _fits(render(monkeypatch, width, *args, *store_args), width, args)


@pytest.mark.parametrize("command", ["runs", "summary", "diff"])
def test_numbers_at_80_columns_are_whole_and_no_cell_is_an_ellipsis(monkeypatch, store, command):
    """What 80 columns show of the tables is what 200 show: each number whole, with its unit on
    its line; only the columns named as left out are missing, and nothing is cut to '…'."""
    for args in ([(command, a, b) for a, b in PAIRS] if command == "diff" else [(command,)]):
        narrow, wide = (render(monkeypatch, w, *args, "--store", store) for w in WIDTHS)
        assert not CUT.search(narrow) and not CUT.search(wide), CUT.findall(narrow + wide)
        assert numbers(narrow) <= numbers(wide), numbers(narrow) - numbers(wide)
        assert "not shown at this width" not in wide
        if "not shown at this width" not in narrow:
            assert numbers(narrow) == numbers(wide), numbers(wide) - numbers(narrow)


def test_runs_keeps_ids_spans_and_kernel_counts_and_names_what_it_leaves_out(monkeypatch, store):
    text = render(monkeypatch, 80, "runs", "--store", store)
    assert "(not shown at this width: format, version, copies, GPUs)" in text
    header = text.splitlines()[0].split()
    assert header == ["run", "file", "span", "kernels"]
    with Store(store, read_only=True) as st:
        rows = st.sql("SELECT run_id, file_name FROM runs").fetchall()
    for rid, name in rows:
        row = next(i for i, ln in enumerate(text.splitlines()) if ln.startswith(rid))
        folded = "".join(ln[18:].split("  ")[0].strip() for ln in text.splitlines()[row:row + 3])
        assert folded.startswith(name), (name, folded)  # a long name folded, never cut


@pytest.mark.parametrize("width", WIDTHS)
def test_scan_table_keeps_the_budget_words_and_the_counts(monkeypatch, tmp_path, width):
    folder = tmp_path / "traces"
    folder.mkdir()
    for rel in ("nsys/planted.sqlite", "kineto/timeline_busy.json.gz", "torch-memory/snapshot_oom.pickle"):
        shutil.copyfile(FIXTURES / rel, folder / rel.split("/")[1])
    shutil.copyfile(FIXTURES / "kineto" / "planted.json", folder / LONG)
    db = tmp_path / "s.duckdb"
    text = render(monkeypatch, width, "scan", "--store", db, "--jobs", "1", "--fail-on", "never", folder)
    _fits(text, width, "scan")
    table = text.split("Scanned runs", 1)[1]
    words = set(table.split())
    with Store(db, read_only=True) as st:
        budgets = budgets_of(st, st.run_ids())
    for rid, budget in budgets.items():
        assert set(budget_cell(budget).split()) <= words, budget_cell(budget)  # no word broken
        assert rid in words
    assert len(budgets) == 4
    header = next(ln for ln in table.splitlines() if ln.startswith("run "))
    assert header.split()[-3:] == ["error", "warn", "info"] and "time budget" in header
    assert ("format" in header) == (width == 200) and "…" not in table
    assert ("(not shown at this width: format, kernels, span;" in text) == (width == 80)


@pytest.mark.parametrize("width", WIDTHS)
def test_check_header_keeps_the_run_id_and_the_counts(monkeypatch, store, width):
    text = render(monkeypatch, width, "check", "--store", store, "--fail-on", "never",
                  *(f.split("/")[1] for f in FILES), LONG)
    with Store(store, read_only=True) as st:
        ids = st.run_ids()
    headers = [ln for ln in text.splitlines() if re.match(r"^─+ ", ln)]
    assert len(headers) == len(ids)
    for rid in ids:
        line = next(ln for ln in headers if f"  {rid}  " in ln)
        assert re.search(r"  \d+ error, \d+ warning, \d+ info ─", line), line
    long = next(ln for ln in headers if "kineto__tb" in ln)
    assert (LONG in long) == (width == 200) and ("…" in long) == (width == 80)


def _description_lines(text: str) -> list[list[str]]:
    """The paragraphs of a --help's description (before its first panel), as their lines."""
    body = text.split("╭", 1)[0].splitlines()
    start = next(i for i, ln in enumerate(body) if ln.strip().startswith("Usage:")) + 1
    paragraphs, current = [], []
    for ln in body[start:] + [""]:
        if ln.strip():
            current.append(ln.strip())
        elif current:
            paragraphs.append(current)
            current = []
    return paragraphs


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_wrapped_evenly(monkeypatch, command, width):
    """Each line of a description is as full as the width lets it be: its paragraphs wrap as one."""
    text = render(monkeypatch, width, *([command] if command else []), "--help")
    for paragraph in _description_lines(text):
        for a, b in zip(paragraph, paragraph[1:]):
            assert len(a) + 1 + len(b.split()[0]) > width - 2, (a, b)


def test_help_lists_check_first_and_names_every_format(monkeypatch):
    text = " ".join(render(monkeypatch, 80, "--help").split())
    listed = re.findall(r"│ ([a-z-]+) ", render(monkeypatch, 80, "--help").split("Commands", 1)[1])
    assert listed[:3] == ["check", "scan", "summary"] and sorted(listed) == sorted(COMMANDS)
    for form in ("Nsight Systems SQLite exports", "Nsight Compute CSV exports", "console text reports",
                 ".ncu-rep reports", "PyTorch profiler (Kineto) JSON", "PyTorch memory snapshots",
                 "memory timelines"):
        assert form in text, form
    lines = [ln for ln in render(monkeypatch, 80, "--help").split("Commands", 1)[1].splitlines() if ln[:1] == "│"]
    assert [ln.split()[1] for ln in lines] == listed  # one line per command at 80 columns


@pytest.mark.parametrize("width", WIDTHS)
def test_check_findings_keep_each_number_with_its_unit(monkeypatch, store, width):
    """The findings' text wraps between words, never between a number and its unit."""
    text = render(monkeypatch, width, "check", "--store", store, "--fail-on", "never", "-v",
                  *(f.split("/")[1] for f in FILES), LONG)
    lines = text.splitlines()
    split = [(a, b) for a, b in zip(lines, lines[1:])
             if re.search(r"\d$", a) and re.match(r"\s*(ns|us|ms|s|B|KB|MB|GB|TB|pp)\b", b)]
    assert not split, split
    assert re.search(r"\d (us|ms|s)\b", text)
