"""The diagnosis (traceanalyzer/diagnosis.py): findings grouped by root cause, one headline
each, losses bounded by the time budget. Invariants over every real trace, the three real
cases the review of a run must get right, and planted runs where the grouping is known."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from traceanalyzer.batch.check import check_file
from traceanalyzer.diagnosis import diagnose_runs
from traceanalyzer.report.budget import budget_line, budget_of
from traceanalyzer.report.model import load_result
from traceanalyzer.rules.base import SEVERITIES
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES


@pytest.fixture
def real(real_corpus):
    """Every real trace, checked with every rule (tests/conftest.py)."""
    return real_corpus


def _findings(store: Store, run_id: str | None = None) -> list[dict]:
    where = "" if run_id is None else "WHERE run_id = $r"
    rows = store.arrow(f"SELECT * FROM findings {where} ORDER BY run_id, finding_no",
                       {"r": run_id} if run_id else None).to_pylist()
    for r in rows:
        r["evidence"] = json.loads(r["evidence"]) if r["evidence"] else None
    return rows


def _budget(store: Store) -> dict[tuple, int]:
    """(run, device, category) and (run, device, "span") -> ns."""
    out: dict[tuple, int] = defaultdict(int)
    for run_id, device, category, ns, span in store.sql(
            "SELECT run_id, device_id, category, ns, span_ns FROM time_budget").fetchall():
        out[(run_id, device, category)] += ns
        out[(run_id, device, "span")] = span
    return out


def _devices_of(f: dict, budget: dict) -> list:
    """The budget devices a finding's claim lies on: its own, or all of its run's."""
    if f["device_id"] is not None:
        return [f["device_id"]]
    return sorted({d for (r, d, k) in budget if r == f["run_id"] and k == "span"})


def _category(f: dict) -> str:
    return f["claims"].split(":")[0]


def test_every_real_finding_is_diagnosed(real):
    rows = _findings(real)
    assert len(rows) > 300
    by_run = defaultdict(dict)
    for f in rows:
        by_run[f["run_id"]][f["finding_no"]] = f
    for run_id, found in by_run.items():
        assert sorted(found) == list(range(1, len(found) + 1)), run_id  # numbered 1..n in each run
        for n, f in found.items():
            if f["related_to"] is None:
                continue
            head = found[f["related_to"]]
            assert head["related_to"] is None and head["finding_no"] < n, (run_id, n)
            assert f["est_loss_ns"] is None  # no second loss
            assert SEVERITIES.index(head["severity"]) >= SEVERITIES.index(f["severity"])
    # the rule's own estimate is kept, and a headline's loss is never more than it
    for f in rows:
        if f["related_to"] is None and f["est_loss_ns"] is not None:
            assert 0 <= f["est_loss_ns"] <= f["rule_loss_ns"], (f["rule_id"], f["message"])
    assert any(f["related_to"] is not None for f in rows)


def test_headline_losses_fit_the_budget_on_every_real_trace(real):
    """Per device: headline losses sum to no more than the span; those that claim a part of the
    budget sum to no more than that part; one headline per part of a device (idle, copy) and
    per kernel."""
    budget = _budget(real)
    spans = dict(real.sql("SELECT run_id, span_ns FROM runs").fetchall())
    claimed: dict[tuple, int] = defaultdict(int)
    heads: dict[tuple, list] = defaultdict(list)
    timed = 0
    for f in _findings(real):
        if f["related_to"] is not None:
            continue
        loss = f["est_loss_ns"] or 0
        if f["claims"] is None:
            assert loss <= spans[f["run_id"]], f["message"]
            continue
        for d in _devices_of(f, budget):
            if (f["run_id"], d, "span") not in budget:
                continue  # no timeline (Nsight Compute): nothing to bound by
            timed += 1
            cat = _category(f)
            claimed[(f["run_id"], d, "span")] += loss
            claimed[(f["run_id"], d, cat)] += loss
            key = (f["run_id"], d, cat, f["item_name"] if cat in ("compute", "communication") else None)
            heads[key].append(f["rule_id"])
    assert timed > 100
    for key, ns in claimed.items():
        assert ns <= budget[key], (key, ns, budget[key])
    assert not {k: v for k, v in heads.items() if len(v) > 1}


# T001's causes as the budget names them (diagnosis._T001_CAUSE).
_AS_BUDGET = {"sync": "sync", "late_launch": "host", "copy": "dependency", "dependency": "dependency",
              "unknown": "unknown"}


def _idle_budget(store: Store) -> dict[tuple, dict[str, int]]:
    """(run, device) -> the budget's idle time by cause."""
    out: dict[tuple, dict[str, int]] = defaultdict(dict)
    for run_id, device, cause, ns in store.sql(
            "SELECT run_id, device_id, cause, ns FROM time_budget WHERE category = 'idle'").fetchall():
        out[(run_id, device)][cause] = ns
    return out


def _named_idle(f: dict) -> dict[str, int]:
    """The device-idle time a finding gives each cause, in the budget's names: T001's per cause
    (a stream's device-idle part, a device's idle stretches), another idle rule's all to the
    cause it claims."""
    if f["rule_id"] == "T001":
        ev = f["evidence"]
        out: dict[str, int] = defaultdict(int)
        for cause, ns in (ev["cause_idle_ns"] if "cause_idle_ns" in ev else ev["cause_ns"]).items():
            out[_AS_BUDGET[cause]] += ns
        return dict(out)
    return {f["claims"].split(":", 1)[1]: f["rule_loss_ns"]} if ":" in f["claims"] else {}


def _device_parts(f: dict, idle: dict) -> list[dict[str, int]]:
    """The budget idle parts a finding's time lies in: its device's, or for a finding on no
    device (T004: every GPU idle at once), each of its run's devices'."""
    keys = [(f["run_id"], f["device_id"])] if f["device_id"] is not None else [k for k in idle if k[0] == f["run_id"]]
    return [idle[k] for k in keys if k in idle]


def test_t004_is_at_most_the_budgets_host_idle_on_every_real_trace(real):
    """T004's host time is each stretch's part before the work was issued, less blocking calls: the
    budget's `host` part of it on every device whose span holds it (the same marks, so no
    tolerance: to the nanosecond). Runs with several devices are bounded by the device with the
    most host time (a stretch outside a device's span is in none of its budget)."""
    idle = _idle_budget(real)
    found = [f for f in _findings(real) if f["rule_id"] == "T004"]
    assert len(found) >= 5
    for f in found:
        parts = _device_parts(f, idle)
        assert parts, f["message"]
        assert f["rule_loss_ns"] <= max(p.get("host", 0) for p in parts), (f["run_id"], f["message"], parts)


# The idle rules whose causes are read with the budget's own marks (views.idle_marks, and
# views.issued_at for the idle after a host wait).
_BUDGET_MARKED = ("T001", "T003", "T004", "T006")


def test_no_related_finding_names_a_cause_its_budget_does_not_hold_on_every_real_trace(real):
    """One story per root cause: a related finding of an idle headline gives each cause at most
    the idle time the budget gives it on that device (a T001 stream's device-idle time takes
    the causes of the device's idle stretches), so it never names a cause for nanoseconds the
    headline's budget part gives another. Exact (the same marks): no tolerance."""
    idle = _idle_budget(real)
    rows = _findings(real)
    heads = {(f["run_id"], f["finding_no"]): f for f in rows}
    checked, wrong = 0, []
    for f in rows:
        if f["related_to"] is None or f["rule_id"] not in _BUDGET_MARKED or not (f["claims"] or "").startswith("idle"):
            continue
        head = heads[(f["run_id"], f["related_to"])]
        assert (head["claims"] or "").startswith("idle"), (f["message"], head["message"])
        parts = _device_parts(f, idle)
        for cause, ns in _named_idle(f).items():
            held = max((p.get(cause, 0) for p in parts), default=0)
            if ns > held:
                wrong.append((f["rule_id"], f["run_id"], cause, ns, held, f["message"], head["message"]))
            checked += 1
    assert checked > 50
    assert not wrong, "\n".join(map(str, wrong))


def test_copy_claims_are_bounded_by_the_kernel_time_that_could_hide_them(real):
    for f in _findings(real):
        if f["rule_id"] == "T002" and f["related_to"] is None and f["est_loss_ns"]:
            assert f["est_loss_ns"] <= f["evidence"]["kernel_ns"], f["message"]


def test_warnings_and_errors_no_longer_claim_more_than_the_run(real):
    """The issue's count: in 24 of 63 timed runs the warnings and errors claimed more time than
    the run's wall time, up to 5x. Headlines of one device now fit its span."""
    spans = dict(real.sql("SELECT run_id, span_ns FROM runs WHERE span_ns > 0").fetchall())
    devices = dict(real.sql("SELECT run_id, count(DISTINCT device_id) FROM time_budget GROUP BY ALL").fetchall())
    over = defaultdict(int)
    for f in _findings(real):
        if f["related_to"] is None and f["severity"] != "info" and f["run_id"] in spans:
            over[f["run_id"]] += f["est_loss_ns"] or 0
    single = [r for r in over if devices.get(r) == 1]
    assert len(single) > 30
    assert [r for r in single if over[r] > spans[r]] == []


def _run(store: Store, name: str) -> str:
    return store.sql("SELECT run_id FROM runs WHERE file_name = $n", {"n": name}).fetchone()[0]


def _idle_headlines(store: Store, run_id: str) -> list[dict]:
    return [f for f in _findings(store, run_id) if f["related_to"] is None and (f["claims"] or "").startswith("idle")]


def test_power_iteration_one_headline_for_the_steps_copy_then_io(real):
    """T001, T006 and T004 each claimed the same ~655 ms, three errors for one cause. Each step
    reads values back (T006: the host waits, the queue drains) and then does its IO before it
    launches again (T004): the budget gives the 655 ms to the host, and both name the host, so
    whichever estimates more heads the group and the other two are its evidence."""
    rid = _run(real, "nsightful__power_iteration__baseline.sqlite")
    [head] = _idle_headlines(real, rid)
    assert head["rule_id"] in ("T004", "T006") and head["claims"] == "idle:host" and head["severity"] == "error"
    related = [f for f in _findings(real, rid) if f["related_to"] == head["finding_no"]]
    assert {"T001", "T004", "T006"} - {head["rule_id"]} <= {f["rule_id"] for f in related}
    idle = real.sql("SELECT sum(ns) FROM run_time_budget($r) WHERE category = 'idle'", {"r": rid}).fetchone()[0]
    assert head["est_loss_ns"] <= idle
    assert load_result(real, [rid]).counts()["error"] == 1


def test_resnet50_the_dataloader_headline_and_no_cuda_graph_hint(real):
    rid = _run(real, "kineto__tb_plugin__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz")
    [head] = _idle_headlines(real, rid)
    assert head["rule_id"] == "T004" and "DataLoader" in head["message"]
    assert "DataLoader" in head["hint"]
    for f in _findings(real, rid):
        if f["related_to"] is None:
            assert "CUDA graph" not in (f["hint"] or ""), f["message"]
    # the budget names the host's work in its host idle
    [device] = budget_of(real, rid)
    assert device["host_work"]["name"].startswith("enumerate(DataLoader)")
    host = next(p["ns"] for p in device["parts"] if p["cause"] == "host")
    assert 0 < device["host_work"]["ns"] <= host
    assert 'host 38% (29% in operator "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")' in budget_line(device)


def test_simple_add_the_headline_names_what_the_budget_says(real):
    """The budget says the idle is the host's (a 13 s stretch in which the host was not waiting
    in a blocking call when the device went idle), so the headline is a host finding."""
    rid = _run(real, "hta__critical_path__simple_add__benchmark_result_493459_1694039959_trace.json.gz")
    budget = dict(real.sql("SELECT cause, ns FROM run_time_budget($r) WHERE category = 'idle'", {"r": rid}).fetchall())
    assert max(budget, key=budget.get) == "host"
    [head] = _idle_headlines(real, rid)
    assert head["claims"] == "idle:host"
    assert "synchroniz" not in head["hint"].lower()


# -- planted runs ---------------------------------------------------------------------------


def test_one_headline_per_kernel_and_its_loss_is_at_most_the_kernels_time(tmp_path):
    """A kernel found by several bottleneck rules is one headline; its loss is no more than the
    kernel's own time on the device."""
    store = Store(tmp_path / "s.duckdb")
    res = check_file(store, FIXTURES / "kineto" / "bottleneck_library.json", Settings())
    rows = _findings(store, res.run_id)
    by_kernel = defaultdict(list)
    for f in rows:
        if f["claims"] == "compute" and f["item_kind"] == "kernel":
            by_kernel[(f["device_id"], f["item_name"])].append(f)
    assert any(len(v) > 1 for v in by_kernel.values())
    for (device, name), group in by_kernel.items():
        heads = [f for f in group if f["related_to"] is None]
        assert len(heads) == 1, name
        ns = store.sql("SELECT sum(end_ns - start_ns) FROM kernels WHERE run_id = $r AND device_id = $d AND name = $n",
                       {"r": res.run_id, "d": device, "n": name}).fetchone()[0]
        assert heads[0]["est_loss_ns"] is None or heads[0]["est_loss_ns"] <= ns
        assert {f["related_to"] for f in group if f["related_to"] is not None} <= {heads[0]["finding_no"]}
    store.close()


def test_a_cross_run_pass_diagnoses_the_runs_stored_findings_again(tmp_path, monkeypatch):
    """A pass of some rules only (scan's cross-run pass) keeps the other rules' findings and
    outcomes, diagnosed together with its own; one that finds nothing new diagnoses nothing."""
    import traceanalyzer.diagnosis as diagnosis

    calls = []
    real_diagnose = diagnosis.diagnose
    monkeypatch.setattr(diagnosis, "diagnose", lambda *a, **k: calls.append(a[1]) or real_diagnose(*a, **k))
    store = Store(tmp_path / "s.duckdb")
    res = check_file(store, FIXTURES / "nsys" / "structure_recompiles.sqlite", Settings())
    before = {(f["rule_id"], f["fingerprint"], f["finding_no"], f["related_to"], f["est_loss_ns"])
              for f in _findings(store, res.run_id)}
    outcomes = {r[0] for r in store.sql("SELECT rule_id FROM rule_runs WHERE run_id = $r", {"r": res.run_id}).fetchall()}
    assert "T008" not in outcomes  # a cross-run rule: not run on one file
    diagnose_runs(store, [res.run_id], Settings(select=["T008"]))
    after = {(f["rule_id"], f["fingerprint"], f["finding_no"], f["related_to"], f["est_loss_ns"])
             for f in _findings(store, res.run_id)}
    assert after == before
    now = {r[0] for r in store.sql("SELECT rule_id FROM rule_runs WHERE run_id = $r", {"r": res.run_id}).fetchall()}
    assert now == outcomes | {"T008"}
    assert calls == [res.run_id]  # the file's own pass only: T008 found nothing
    store.close()


def test_the_rules_alone_leave_findings_undiagnosed(tmp_path):
    """`run_rules` without a diagnosis stores what the rules said: rule-level tests read that."""
    store = Store(tmp_path / "s.duckdb")
    res = check_file(store, FIXTURES / "nsys" / "structure_recompiles.sqlite", None)
    run_rules(store, [res.run_id], Settings())
    rows = _findings(store, res.run_id)
    assert rows and all(f["finding_no"] is None and f["related_to"] is None for f in rows)
    store.close()


def test_no_rule_raises_on_any_real_trace(real):
    """Every rule on every real trace ends 'ran' or 'no-data', never 'error' (which fails a
    check, see CheckResult.rule_errors)."""
    errors = real.sql("""SELECT r.file_name, o.rule_id, o.note FROM rule_runs o JOIN runs r USING (run_id)
                         WHERE o.status = 'error' ORDER BY ALL""").fetchall()
    kinds = {k for (k,) in real.sql("SELECT DISTINCT format FROM runs").fetchall()}
    assert {"nsys-sqlite", "kineto-json", "ncu-csv", "ncu-text", "ncu-rep", "torch-memory-snapshot"} <= kinds
    assert errors == []


def test_every_real_kernel_name_is_classified(real):
    """Every distinct kernel name of the real corpus gets a library, every class is met, and no
    more than a tenth of the names fall to `other` (each class's patterns are reviewed on a sample
    in tests/test_kernel_library.py; the corpus grows, so no count is fixed here)."""
    counts = dict(real.sql("""SELECT coalesce(library, 'NULL'), count(*) FROM (
                                  SELECT DISTINCT name, mangled_name, library FROM kernels JOIN runs USING (run_id)
                                  WHERE format IN ('nsys-sqlite', 'kineto-json', 'ncu-csv'))
                              GROUP BY ALL""").fetchall())
    assert "NULL" not in counts
    assert set(counts) == {"aten", "attention", "cub", "cublas", "cudnn", "cufft", "cutlass", "nccl", "other",
                           "triton", "user"}
    assert counts["other"] <= 0.1 * sum(counts.values()), counts


def test_occupancy_and_wave_findings_on_real_traces_are_actionable(real):
    """B001/B002 on every real trace: never on a collective, one finding per kernel, and no
    register or tile advice for a kernel the user cannot recompile."""
    rows = real.sql("""SELECT f.run_id, f.rule_id, f.item_name, f.hint, any_value(k.library) AS library
                       FROM findings f JOIN kernels k ON k.run_id = f.run_id AND k.kernel_id = f.item_id
                       WHERE f.rule_id IN ('B001', 'B002') GROUP BY ALL""").fetchall()
    assert rows
    assert not [r for r in rows if r[4] == "nccl"]
    per_kernel = Counter((r[0], r[1], r[2]) for r in rows)
    assert max(per_kernel.values()) == 1
    library = [r for r in rows if r[4] not in ("user", "triton")]
    assert library and not [r for r in library if "launch_bounds" in r[3] or "resize the tiles" in r[3]]


def test_the_severity_floor_makes_small_losses_info_and_is_set_like_a_threshold(tmp_path):
    """The library fixture's two tail-wave kernels in a 3.11 ms span: the cuBLAS GEMM's headline
    (B001, 437 us) and the user's kernel's (B002, 275 us, its B001 related). Under a floor of
    300 us and 20% of the span only the second group becomes info, its headline saying why."""
    trace = FIXTURES / "kineto" / "bottleneck_library.json"
    query = ("SELECT item_name, rule_id, severity, message, est_loss_ns, related_to FROM findings "
             "WHERE item_name IN ('my_tail_kernel(float*, int)', 'ampere_sgemm_128x64_nn') AND rule_id LIKE 'B00%'")
    with Store(tmp_path / "a.duckdb") as store:
        check_file(store, trace, Settings())
        default = {(r[0], r[1]): r[2] for r in store.sql(query).fetchall() if r[5] is None}
    with Store(tmp_path / "b.duckdb") as store:
        check_file(store, trace, Settings(thresholds={"FLOOR": {"min_loss_ns": 300_000, "min_loss_span_share": 0.2}}))
        rows = store.sql(query).fetchall()
    heads = {r[0]: r[1:5] for r in rows if r[5] is None}
    assert set(default.values()) == {"warning"}
    small, large = heads["my_tail_kernel(float*, int)"], heads["ampere_sgemm_128x64_nn"]
    assert small[1] == "info" and "severity floor" in small[2] and small[3] < 300_000
    assert large[1] == "warning" and large[3] >= 300_000
    related = [r for r in rows if r[5] is not None and r[0] == "my_tail_kernel(float*, int)"]
    assert related and all(r[2] == "info" for r in related)  # their time is the headline's
