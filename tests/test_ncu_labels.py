"""Every details-page label in the real Nsight Compute files maps to its metric id.

The details CSV and the console text report key rows by a section's display label; the
rules query metric ids (ingest/ncu_labels.py). A label missing from the map silently turns a
rule into no-data on every launch of that layout, so this test lists every (section, label)
pair of every real file and requires each to be mapped, or on IGNORED with the reason. The
`.ncu-rep` reports carry the label and the metric id side by side: there the map must give
the report's own id.
"""

from __future__ import annotations

import pytest

from traceanalyzer.ingest import TraceError, read_file
from traceanalyzer.ingest.ncu_labels import BY_SECTION, metric_id_for
from traceanalyzer.ingest.ncu_rep import RAW_SECTION

from .conftest import FIXTURES, shared_traces

# (section, label) pairs seen in real files that are deliberately left unmapped, with why.
IGNORED: dict[tuple[str, str], str] = {}
# Sections whose Metric Name is the metric id itself (`--metrics` runs).
ID_SECTIONS = {"Command line profiler metrics", RAW_SECTION}


def _labelled_files():
    traces = shared_traces()
    out = []
    for folder in ("ncu", "ncu-text"):
        out += sorted(p for p in (traces / folder).iterdir() if p.is_file() and p.name != "MANIFEST.tsv")
    return out


def _pairs(path):
    """(section, label, metric id) of every metric row of a file; None when it is not readable."""
    try:
        trace = read_file(path)
    except TraceError:
        return None  # the negative samples (no header, app errors): covered by test_ncu*.py
    return trace.format, {(r["section"], r["metric_name"], r["metric_id"])
                          for r in trace.tables["kernel_metrics"].to_pylist()}


def test_every_label_of_the_real_details_and_text_files_is_mapped():
    seen, unmapped = 0, []
    for path in _labelled_files():
        got = _pairs(path)
        if got is None:
            continue
        fmt, pairs = got
        for section, label, metric_id in pairs:
            if section in ID_SECTIONS or fmt == "ncu-csv" and metric_id == label:
                continue  # raw page or --metrics: the label is the id
            seen += 1
            if metric_id is None and (section, label) not in IGNORED:
                unmapped.append((path.name, section, label))
    assert seen > 100  # the corpus has details pages of 2020, 2023 and 2025 and text reports
    assert not unmapped, sorted(set(unmapped))


def test_the_map_gives_each_ncu_rep_report_its_own_metric_id():
    traces = shared_traces()
    wrong, seen = [], 0
    for path in sorted((traces / "ncu-rep").glob("*.ncu-rep")):
        for section, label, metric_id in _pairs(path)[1]:
            if section == RAW_SECTION:
                continue
            seen += 1
            if metric_id_for(section, label) != metric_id and (section, label) not in IGNORED:
                wrong.append((path.name, section, label, metric_id, metric_id_for(section, label)))
    assert seen > 100
    assert not wrong, sorted(set(wrong))


@pytest.mark.parametrize("section,label,metric_id", [
    # 2021-2022 Speed Of Light header (fixtures/ncu-text/text_2022_utf16.txt has it)
    ("GPU Speed Of Light Throughput", "Compute (SM) [%]", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("GPU Speed Of Light Throughput", "Memory [%]", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
    # one label, two metrics: the section decides
    ("Memory Workload Analysis", "Memory Throughput", "dram__bytes.sum.per_second"),
    ("GPU Speed Of Light Throughput", "Memory Throughput",
     "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
    ("Load Metrics", "sector/req", "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio"),
    ("Store Metrics", "sector/req", "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_st.ratio"),
])
def test_labels_resolve_by_section(section, label, metric_id):
    assert metric_id_for(section, label) == metric_id


def test_an_unknown_label_stays_unmapped():
    assert metric_id_for("GPU Speed Of Light Throughput", "Made Up Throughput") is None
    assert "Made Up Throughput" not in {lbl for labels in BY_SECTION.values() for lbl in labels}


def test_the_2022_text_layout_carries_the_speed_of_light_metrics():
    trace = read_file(FIXTURES / "ncu-text" / "text_2022_utf16.txt")
    ids = {r["metric_id"] for r in trace.tables["kernel_metrics"].to_pylist()}
    assert {"sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"} <= ids
