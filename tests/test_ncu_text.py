"""Nsight Compute console text report reader: real reports, generated fixtures, bad input.

Expected launches and rule results are re-derived here from the files' lines with plain
regular expressions (or taken from the generator's PLANTED facts), never from the reader's
own helpers.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, shared_traces
from traceanalyzer.batch.check import check_file
from traceanalyzer.ingest import find_traces, read_file
from traceanalyzer.ingest.base import TraceError
from traceanalyzer.ingest.detect import detect
from traceanalyzer.rules.engine import Settings

TEXT_FIXTURES = FIXTURES / "ncu-text"
# Real text reports -> (launches, CC)
REAL = {
    "ncu-text/cs599k__silu__triton__silu-pytorch-ncu-report.txt": (10, "9.0"),
    "ncu/PolyFHE__artifact_evaluation__ncu__opt.csv": (12, "8.6"),
}


def _gen():
    spec = importlib.util.spec_from_file_location("gen_ncu_text", FIXTURES / "gen_ncu_text.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _gen()


def kernel_lines(path: Path) -> list[tuple[str, tuple, tuple, str]]:
    """(name, grid, block, cc) per kernel line, the way a person would read them."""
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r"^  (\S.*) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context \d+, Stream \d+, "
                     r"Device \d+, CC (\d+\.\d+)$", line)
        if m:
            g = tuple(map(int, m.groups()[1:7]))
            out.append((m[1], g[:3], g[3:], m[8]))
    return out


def rule_heads(path: Path) -> list[tuple[str, str | None]]:
    """(type, speedup text) of every rule result."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"^    (OPT|INF|WRN)   (.*)$", line)
        if m:
            sp = re.match(r"Est\. (?:Local )?Speedup: ([\d.]+)%", m[2].strip())
            out.append((m[1], sp[1] if sp else None))
    return out


def ran(store, run_id: str) -> dict[str, str]:
    return dict(store.sql("SELECT rule_id, status FROM rule_runs WHERE run_id = ?", [run_id]).fetchall())


# -- real reports ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rel", sorted(REAL))
def test_real_reports(rel, store):
    path = shared_traces() / rel
    launches, cc = REAL[rel]
    expected = kernel_lines(path)
    assert len(expected) == launches
    trace = read_file(path)
    assert trace.format == "ncu-text" and trace.producer_version == "text-2023"
    kernels = trace.tables["kernels"].to_pylist()
    got = [(k["name"], (k["grid_x"], k["grid_y"], k["grid_z"]), (k["block_x"], k["block_y"], k["block_z"]))
           for k in kernels]
    assert got == [e[:3] for e in expected]
    assert {e[3] for e in expected} == {cc}
    device = trace.tables["devices"].to_pylist()
    assert [(d["compute_major"], d["compute_minor"]) for d in device] == [tuple(map(int, cc.split(".")))]

    rules = trace.tables["kernel_rule_results"].to_pylist()
    heads = rule_heads(path)
    assert [r["rule_type"] for r in rules] == [h[0] for h in heads]
    assert [r["estimated_speedup_pct"] for r in rules] == [None if h[1] is None else float(h[1]) for h in heads]
    assert all(r["description"] and "  " not in r["description"] for r in rules)
    # No program output became a metric row.
    names = set(trace.tables["kernel_metrics"]["metric_name"].to_pylist())
    assert not any(n.startswith(("==PROF==", "Average time", "Elements", "Elapsed time", "Check passed")) for n in names)

    res = check_file(store, path, Settings())
    assert res.state == "stored", res.error
    statuses = ran(store, res.run_id)
    for rule in ("B001", "B002", "B004"):
        assert statuses[rule] == "ran"


def test_real_polyfhe_values():
    trace = read_file(shared_traces() / "ncu" / "PolyFHE__artifact_evaluation__ncu__opt.csv")
    k0 = trace.tables["kernels"].to_pylist()[0]
    assert (k0["short_name"], k0["registers_per_thread"], k0["dynamic_shared_mem_bytes"]) == ("NTTPhase1", 68, 2050)
    assert (k0["pid"], k0["stream_id"], k0["context_id"]) == (807108, 7, 1)
    m = {r["metric_name"]: r for r in trace.tables["kernel_metrics"].to_pylist() if r["kernel_id"] == 0}
    assert m["Duration"]["value"] == pytest.approx(60.67e3) and m["Duration"]["metric_id"] == "gpu__time_duration.sum"
    assert m["SM Frequency"]["value"] == pytest.approx(709.97e6)  # cycle/usecond
    assert m["Theoretical Occupancy"]["metric_id"] == "sm__maximum_warps_per_active_cycle_pct"
    rules = [r for r in trace.tables["kernel_rule_results"].to_pylist() if r["kernel_id"] == 0]
    assert [(r["rule_name"], r["speedup_type"], r["estimated_speedup_pct"]) for r in rules] == [
        ("SOLBottleneck", None, None), ("LaunchConfiguration", "global", 50.0), ("TheoreticalOccupancy", "local", 66.67)]


def test_silu_pairs_with_its_ncu_rep():
    """The SiLU text report and .ncu-rep come from two runs of one program: the first launch's
    configuration and NVIDIA's rule results on it agree."""
    rep_path = shared_traces() / "ncu-rep" / "cs599k__silu__triton__silu-pytorch.ncu-rep"
    try:
        rep = read_file(rep_path)
    except TraceError as e:
        pytest.skip(f"no .ncu-rep reader here: {e}")
    text = read_file(shared_traces() / "ncu-text" / "cs599k__silu__triton__silu-pytorch-ncu-report.txt")
    cols = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
            "static_shared_mem_bytes", "dynamic_shared_mem_bytes", "stream_id", "context_id"]
    first = lambda t: {c: t.tables["kernels"].to_pylist()[0][c] for c in cols}  # noqa: E731
    assert first(text) == first(rep)
    key = lambda r: (r["rule_name"], r["rule_type"], r["description"])  # noqa: E731
    rep_rules = sorted(key(r) for r in rep.tables["kernel_rule_results"].to_pylist() if r["kernel_id"] == 0)
    text_rules = sorted(key(r) for r in text.tables["kernel_rule_results"].to_pylist() if r["kernel_id"] == 0)
    assert text_rules == rep_rules


# -- generated fixtures ---------------------------------------------------------------------------------

def test_fixtures_are_generated(tmp_path):
    for path in GEN.write(tmp_path):
        assert path.read_bytes() == (TEXT_FIXTURES / path.name).read_bytes(), f"regenerate {path.name}"


def test_2023_layout_against_planted():
    spec = GEN.PLANTED["text_2023.txt"]
    trace = read_file(TEXT_FIXTURES / "text_2023.txt")
    assert trace.producer_version == "text-2023" and trace.warnings == []
    kernels = trace.tables["kernels"].to_pylist()
    assert len(kernels) == len(spec["launches"])
    pids = {i: pid for pid, _, ids in spec["processes"] for i in ids}
    for i, (k, want) in enumerate(zip(kernels, spec["launches"])):
        assert k["name"] == want["name"] and k["pid"] == pids[i]
        assert (k["grid_x"], k["grid_y"], k["grid_z"]) == want["grid"]
        assert (k["block_x"], k["block_y"], k["block_z"]) == want["block"]
        assert (k["registers_per_thread"], k["static_shared_mem_bytes"], k["dynamic_shared_mem_bytes"]) == (
            want["regs"], want["static_smem"], want["dynamic_smem"])
    metrics = trace.tables["kernel_metrics"].to_pylist()
    duration = {r["kernel_id"]: r["value"] for r in metrics if r["metric_id"] == "gpu__time_duration.sum"}
    assert duration == pytest.approx({i: k["duration_ns"] for i, k in enumerate(spec["launches"])})
    waves = {r["kernel_id"]: r["value"] for r in metrics if r["metric_id"] == "launch__waves_per_multiprocessor"}
    assert waves == pytest.approx({i: k["waves"] for i, k in enumerate(spec["launches"])})
    assert not any("INFO" in r["metric_name"] or "Elements" in r["metric_name"] for r in metrics)
    assert trace.tables["devices"].to_pylist()[0]["sm_count"] == 132  # "# SMs"

    rules = trace.tables["kernel_rule_results"].to_pylist()
    want = [(i, s, name, kind, stype, pct, msg) for i, k in enumerate(spec["launches"])
            for s, name, kind, stype, pct, msg in k["rules"]]
    assert [(r["kernel_id"], r["section"], r["rule_name"], r["rule_type"], r["speedup_type"],
             r["estimated_speedup_pct"], r["description"]) for r in rules] == want


def test_2023_rules_run(store):
    res = check_file(store, TEXT_FIXTURES / "text_2023.txt", Settings())
    assert res.state == "stored", res.error
    found = store.sql("SELECT rule_id, item_name FROM findings WHERE run_id = ?", [res.run_id]).fetchall()
    names = {n: [r for r, item in found if item.startswith(n)] for n in ("void tail_kernel", "regheavy_gemm", "healthy")}
    assert "B001" in names["void tail_kernel"]  # 1.10 waves
    assert "B002" in names["regheavy_gemm"]  # 25 % theoretical occupancy
    assert "I002" in names["regheavy_gemm"]  # from NVIDIA's UncoalescedGlobalAccess message alone
    assert not {"B001", "B002"} & set(names["healthy"])


def test_2022_layout_utf16():
    raw = (TEXT_FIXTURES / "text_2022_utf16.txt").read_bytes()
    assert raw.startswith(b"\xff\xfe") and b"\r\x00\n\x00" in raw
    spec = GEN.PLANTED["text_2022_utf16.txt"]
    trace = read_file(TEXT_FIXTURES / "text_2022_utf16.txt")
    assert trace.producer_version == "text-2020"
    kernels = trace.tables["kernels"].to_pylist()
    assert [k["name"] for k in kernels] == [k["name"] for k in spec["launches"]]
    assert [k["registers_per_thread"] for k in kernels] == [k["regs"] for k in spec["launches"]]
    assert all(k["grid_x"] is None for k in kernels)  # that layout does not print the dimensions
    metrics = trace.tables["kernel_metrics"].to_pylist()
    by = lambda mid: [r for r in metrics if r["metric_id"] == mid]  # noqa: E731
    assert [r["value"] for r in by("launch__thread_count")] == [10240.0, 10240.0]  # "10,240"
    assert [r["value"] for r in by("gpc__cycles_elapsed.max")] == [4412358.0] * 2
    assert [r["value"] for r in by("gpu__time_duration.sum")] == pytest.approx([k["duration_ns"] for k in spec["launches"]])
    long = by(GEN.LONG_LABEL)  # a label past its column keeps its value
    assert [(r["raw_unit"], r["value"]) for r in long] == [("", 12.5)] * 2
    rules = trace.tables["kernel_rule_results"].to_pylist()
    assert [(r["rule_name"], r["rule_type"], r["estimated_speedup_pct"], r["description"]) for r in rules] == [
        (name, kind, pct, msg) for k in spec["launches"] for _, name, kind, _, pct, msg in k["rules"]]


def test_summary_layout_refused(tmp_path):
    path = tmp_path / "text_summary.txt"
    path.write_text(GEN.summary_report())
    assert detect(path) == "ncu-text"  # starts with "[pid] process@host", not a JSON array
    with pytest.raises(TraceError, match=r"--print-summary") as err:
        read_file(path)
    assert "\n" not in str(err.value)


# -- bad input --------------------------------------------------------------------------------------

def _lines() -> list[str]:
    return (TEXT_FIXTURES / "text_2023.txt").read_text().splitlines(keepends=True)


def test_truncated_report(tmp_path):
    lines = _lines()
    first_row = next(i for i, ln in enumerate(lines) if ln.startswith("    DRAM Frequency"))
    for cut in (first_row + 2, first_row):  # mid-table, and right under the header
        (tmp_path / "cut.txt").write_text("".join(lines[:cut]))
        with pytest.raises(TraceError, match="truncated"):
            read_file(tmp_path / "cut.txt")
    (tmp_path / "cut.txt").write_text("".join(lines[:first_row + 2]) + lines[first_row + 2][:9])
    with pytest.raises(TraceError, match="truncated"):
        read_file(tmp_path / "cut.txt")


def test_cut_between_sections_is_a_warning(tmp_path):
    lines = _lines()
    last = max(i for i, ln in enumerate(lines) if ln.startswith("    Section: Launch Statistics"))
    (tmp_path / "cut.txt").write_text("".join(lines[:last]))
    trace = read_file(tmp_path / "cut.txt")
    assert trace.tables["kernels"].num_rows == 3
    assert any("file truncated?" in w for w in trace.warnings)


def test_garbled_report(tmp_path):
    lines = [ln for ln in _lines() if ", Context 1, Stream 7" not in ln]  # kernel lines lost
    (tmp_path / "g.txt").write_text("".join(lines))
    with pytest.raises(TraceError, match="section before any kernel line"):
        read_file(tmp_path / "g.txt")
    lines = _lines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("    Elapsed Cycles"))
    (tmp_path / "blank.txt").write_text("".join(lines[:i] + ["\n"] + lines[i:]))
    with pytest.raises(TraceError, match="breaks off at line"):
        read_file(tmp_path / "blank.txt")


def test_report_from_ncu_import_and_crlf(tmp_path):
    """`ncu -i report.ncu-rep > out.txt` output has no program output before it."""
    lines = _lines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("[31440]"))
    (tmp_path / "imported.txt").write_bytes("".join(lines[start:]).replace("\n", "\r\n").encode())
    trace = read_file(tmp_path / "imported.txt")
    assert trace.tables["kernels"].num_rows == 3
    assert trace.metadata["other_lines"] == 0


def test_folder_scan_passes_over_other_text(tmp_path):
    (tmp_path / "notes.txt").write_text("Section: results\n    ---------\nsome notes\n")
    (tmp_path / "build.log").write_text("make: Nothing to be done for 'all'.\n  Context 1, Stream 7\n")
    (tmp_path / "requirements.txt").write_text("numpy\ntorch==2.3\n")
    (tmp_path / "report.txt").write_bytes((TEXT_FIXTURES / "text_2023.txt").read_bytes())
    skipped: list = []
    assert list(find_traces([tmp_path], skipped)) == [tmp_path / "report.txt"]
    assert sorted(p.name for p, _ in skipped) == ["build.log", "notes.txt", "requirements.txt"]


def test_rule_names_told_from_wording_agree_with_the_real_reports_identifiers(real_corpus):
    """The text report prints no rule identifier; the CSV exports and .ncu-rep reports print both.
    On every real rule row of those, the wording gives the identifier they pair it with, or none."""
    from traceanalyzer.ingest.ncu_text import RULE_NAMES, rule_name_of

    rows = real_corpus.sql("""SELECT rr.rule_name, rr.description FROM kernel_rule_results rr JOIN runs r USING (run_id)
                              WHERE r.format IN ('ncu-csv', 'ncu-rep') AND rr.description IS NOT NULL""").fetchall()
    told = [(name, rule_name_of(" ".join(text.split()))) for name, text in rows]
    assert [(name, got) for name, got in told if got is not None and got != name] == []
    confirmed = {got for _, got in told if got is not None}
    # every identifier the reader knows but WorkloadImbalance (no real report has it) is seen
    assert confirmed == {name for name, _ in RULE_NAMES} - {"WorkloadImbalance"}
    assert [name for name, got in told if got is None] == []  # and every real rule row is told
