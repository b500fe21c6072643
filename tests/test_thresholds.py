"""Every threshold of every rule, at and past the edges of the values it allows.

Out-of-range values are refused with one line naming the rule, the threshold, the value and
the range; the edges are accepted, and every rule runs at them on the bundled fixtures.
Display thresholds (`max_examples`) shape only the evidence: at any allowed value a rule finds
what it finds at its defaults. The rules' `.cases.toml` check what the edges find.
"""

from __future__ import annotations

import json
import math
import tomllib

import pytest

from traceanalyzer.store import run_cache
from traceanalyzer.batch.check import CheckOptions, UsageError, settings_from
from traceanalyzer.rules import all_rules
from traceanalyzer.rules.engine import applies, evaluate_across, evaluate_rule
from traceanalyzer.store import Store

from .conftest import FIXTURES, ROOT

THRESHOLDS = [pytest.param(r, t, id=f"{r.id}.{t.name}") for r in all_rules() for t in r.thresholds]
TRACES = sorted(f"{d}/{p.name}" for d in ("nsys", "kineto", "ncu", "ncu-text", "ncu-rep", "torch-memory")
                for p in (FIXTURES / d).iterdir() if p.is_file())
# Every rule at its edges on these (every per-run rule applies to one of them at least: see
# test_the_edge_traces_cover_every_rule), old and new layouts of each format; all of TRACES
# take ~3 s a fixture, a minute and a half of the suite for little more.
EDGE_TRACES = ["nsys/planted.sqlite", "nsys/old_2_9_1.sqlite", "nsys/timeline_sync.sqlite",
               "nsys/structure_chains.sqlite", "nsys/structure_memory.sqlite", "kineto/planted.json",
               "kineto/legacy_2021.json", "kineto/structure_recompiles.json", "kineto/bottleneck_gemm.json",
               "kineto/timeline_item.json", "kineto/timeline_rank0.json", "ncu/details_full.csv",
               "ncu/bottleneck_memory.csv", "ncu/bottleneck_roofline_raw.csv",
               "ncu/bottleneck_source.csv", "ncu/details_stalls.csv", "ncu/raw_waves.csv",
               "torch-memory/snapshot_oom.pickle", "torch-memory/timeline_train.raw.json.gz"]
# Stands in for the top of a range with no upper bound (ratios, waves): rules must cope with it.
HUGE = 1e300


def edges(t) -> list[float]:
    return [t.lowest, t.highest if math.isfinite(t.highest) else HUGE]


def out_of_range(t) -> list:
    bad = [t.lowest - 1, math.nextafter(t.lowest, -math.inf), math.nan, math.inf, -math.inf, "abc", "", None, True]
    if math.isfinite(t.highest):
        bad += [math.nextafter(t.highest, math.inf), 2 * t.highest + 1]
    if t.unit.integer:
        bad.append(t.lowest + 0.5)
    return bad


def test_thresholds_cover_every_kind():
    """The edges below are tested on each kind of threshold: each kind is used by some rule."""
    kinds = {(t.display, t.unit.integer, math.isfinite(t.highest)) for r in all_rules() for t in r.thresholds}
    assert kinds >= {(True, True, True), (False, True, True), (False, False, True), (False, False, False)}


@pytest.mark.parametrize("rule,t", THRESHOLDS)
def test_out_of_range_values_are_refused(rule, t):
    for bad in out_of_range(t):
        with pytest.raises(ValueError) as e:
            rule.params({t.name: bad})
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{rule.id}.{t.name} must be {t.range_text(in_a_sentence=True)}, "
                                                  "not "), msg
        assert msg.endswith(repr(bad)), msg


@pytest.mark.parametrize("rule,t", THRESHOLDS)
def test_edges_are_accepted(rule, t):
    for v in edges(t):
        assert rule.params({t.name: v})[t.name] == v
        assert rule.params({t.name: repr(v)})[t.name] == v  # as text, from the command line
    assert rule.params()[t.name] == t.default


def test_the_command_line_refuses_a_value_out_of_range(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no config file found
    with pytest.raises(UsageError, match=r"^T001\.min_gap_ns must be from 0 to 1e18 ns, not -5$"):
        settings_from(CheckOptions(paths=[], select=["T001"], thresholds=["T001.min_gap_ns=-5"]))
    with pytest.raises(UsageError, match=r"^T001\.max_examples must be a whole number from 0 to 1000, not nan$"):
        settings_from(CheckOptions(paths=[], thresholds=["T001.max_examples=nan"]))
    settings, _ = settings_from(CheckOptions(paths=[], thresholds=["T001.max_examples=0", "T001.min_gap_ns=1e18"]))
    assert settings.thresholds == {"T001": {"max_examples": "0", "min_gap_ns": "1e18"}}


@pytest.fixture(scope="module")
def fixtures_store(tmp_path_factory):
    """Every bundled fixture in one store: (store, trace (as under fixtures/) -> run id)."""
    store = Store(tmp_path_factory.mktemp("edges") / "s.duckdb")
    runs = {}
    for trace in TRACES:
        runs[trace] = store.ingest(FIXTURES / trace).run_id
    yield store, runs
    store.close()


def _found(df) -> list[str]:
    """The findings without their evidence, comparable as a sorted list."""
    rows = df.drop(columns=["evidence"]).astype(str).to_dict("records")
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def test_the_edge_traces_cover_every_rule(fixtures_store):
    store, runs = fixtures_store
    assert set(EDGE_TRACES) <= set(TRACES)
    covered = {r.id for t in EDGE_TRACES for r in all_rules()
               if r.scope == "run" and applies(store, r, runs[t])}
    assert covered == {r.id for r in all_rules() if r.scope == "run"}


@pytest.mark.parametrize("trace", EDGE_TRACES)
def test_rules_run_at_their_edges_and_display_changes_no_finding(trace, fixtures_store):
    """On each fixture, every rule that applies runs with its detection thresholds all at their
    lowest (finding the most) and its display ones at their highest (listing the most), and the
    other way round; with a display threshold at 0 it finds what its defaults find."""
    store, runs = fixtures_store
    run_id = runs[trace]
    checked = 0
    with run_cache.scoped_to_run(store.con, run_id):
        for rule in all_rules():
            if rule.scope != "run" or not applies(store, rule, run_id):
                continue
            for side in (0, 1):
                evaluate_rule(store, rule, run_id, rule.params(
                    {t.name: edges(t)[1 - side if t.display else side] for t in rule.thresholds}))
            display = [t for t in rule.thresholds if t.display]
            if display:
                expected = _found(evaluate_rule(store, rule, run_id, rule.params()))
                for t in display:
                    got = _found(evaluate_rule(store, rule, run_id, rule.params({t.name: t.lowest})))
                    assert got == expected, f"{rule.id} with {t.name}={t.lowest} finds other things on {trace}"
            checked += 1
    assert checked > 0, f"no rule applies to {trace}"


def _case_traces(rule) -> list[list[str]]:
    """Bundled fixtures the rule's cases use, the first of each format (fixtures/nsys, kineto,
    ncu): one trace each, or a cross-run rule's set of traces."""
    path = next((ROOT / "traceanalyzer" / "rules").glob(f"{rule.id}_*.cases.toml"))
    by_format: dict[str, list[str]] = {}
    for case in tomllib.loads(path.read_text())["case"]:
        traces = case["traces"] if "traces" in case else [case["trace"]]
        if not any(t.startswith("shared:") for t in traces):
            by_format.setdefault(traces[0].split("/")[0], traces)
    return list(by_format.values())


@pytest.mark.parametrize("rule", [pytest.param(r, id=r.id) for r in all_rules()])
def test_each_threshold_alone_at_its_edges(rule, fixtures_store):
    """Each detection threshold at its lowest and highest, the others at their defaults, on a
    fixture of each format the rule's cases use (display thresholds: the test above)."""
    store, runs = fixtures_store
    sets = _case_traces(rule)
    assert sets, f"{rule.id}'s cases use no bundled fixture"
    detection = [t for t in rule.thresholds if not t.display]
    values = [{t.name: v} for t in detection for v in edges(t)]
    for traces in sets:
        if rule.scope == "runs":
            for changed in values:
                evaluate_across(store, rule, [runs[t] for t in traces], rule.params(changed))
            continue
        run_id = runs[traces[0]]
        if not applies(store, rule, run_id):
            continue
        with run_cache.scoped_to_run(store.con, run_id):
            for changed in values:
                evaluate_rule(store, rule, run_id, rule.params(changed))
