"""PyTorch memory snapshots and memory timelines: the readers against the real files (re-derived
here from the pickle and the JSON directly), the fixtures, bad input, and what the memory
rules tell apart that their cases do not show."""

from __future__ import annotations

import collections
import gzip
import importlib.util
import io
import json
import pickle
import sys

import pytest

from traceanalyzer.ingest import TraceError, find_traces, read_file
from traceanalyzer.ingest.detect import TORCH_MEMORY_SNAPSHOT, TORCH_MEMORY_TIMELINE, detect, not_a_trace
from traceanalyzer.rules import _memory as mem
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES, shared_traces

GEN = FIXTURES / "gen_torch_memory.py"
FORWARD = "torch-memory/cs336-a2-systems__memory_files__memory_ctx128_forward.pickle"
FULLSTEP = "torch-memory/cs336-a2-systems__memory_files__memory_ctx128_fullstep.pickle"
TIMELINE = "torch-memory/hta__memory_analysis__memory_timeline.raw.gz"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_torch_memory", GEN)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_torch_memory", mod)
    spec.loader.exec_module(mod)
    return mod


gen = _gen()


class _Plain(pickle.Unpickler):
    """This test's own reading of a snapshot, independent of the reader's."""

    def find_class(self, module, name):
        raise AssertionError(f"a real snapshot needs no class, this one asks for {module}.{name}")


def _load(rel: str) -> dict:
    return _Plain(io.BytesIO((shared_traces() / rel).read_bytes())).load()


def _rows(trace, table: str) -> list[dict]:
    return trace.tables[table].to_pylist()


# -- the real snapshots --------------------------------------------------------------------

@pytest.mark.parametrize("rel", [FORWARD, FULLSTEP])
def test_real_snapshots_need_no_class_and_read_whole(rel):
    raw = _load(rel)
    trace = read_file(shared_traces() / rel)
    assert trace.format == TORCH_MEMORY_SNAPSHOT and trace.clock == "unix-epoch" and not trace.warnings
    segs, blocks = _rows(trace, "memory_segments"), _rows(trace, "memory_blocks")
    raw_blocks = [b for s in raw["segments"] for b in s["blocks"]]
    assert len(segs) == len(raw["segments"]) and len(blocks) == len(raw_blocks)
    assert sum(s["total_bytes"] for s in segs) == sum(s["total_size"] for s in raw["segments"])
    assert [(b["address"], b["bytes"], b["requested_bytes"], b["state"]) for b in blocks] == \
        [(b["address"], b["size"], b["requested_size"], b["state"]) for b in raw_blocks]
    # blocks tile their segment
    by_seg = collections.defaultdict(int)
    for b in blocks:
        by_seg[b["segment_id"]] += b["bytes"]
    assert all(by_seg[s["segment_id"]] == s["total_bytes"] for s in segs)
    events, raw_events = _rows(trace, "allocator_events"), raw["device_traces"][0]
    assert [(e["action"], e["address"], e["bytes"], e["ts_ns"]) for e in events] == \
        [(e["action"], e["addr"], e["size"], e["time_us"] * 1000) for e in raw_events]
    # every event's stack_id gives back exactly its frames, innermost first
    frames = collections.defaultdict(list)
    for f in _rows(trace, "memory_frames"):
        frames[f["stack_id"]].append((f["depth"], f["filename"], f["line"], f["name"]))
    for e, r in zip(events[::97], raw_events[::97]):
        assert [x[1:] for x in sorted(frames[e["stack_id"]])] == [(f["filename"], f["line"], f["name"]) for f in r["frames"]]
    distinct = {tuple((f["filename"], f["line"], f["name"]) for f in e["frames"]) for e in raw_events if e["frames"]}
    assert set(map(tuple, ([x[1:] for x in sorted(v)] for v in frames.values()))) >= distinct
    [settings] = _rows(trace, "allocator_settings")
    assert settings["expandable_segments"] is False and settings["max_split_size_bytes"] is None  # -1: no limit
    assert json.loads(settings["settings"])["roundup_power2_divisions"]["1024"] == 0
    assert [d["device_id"] for d in _rows(trace, "devices")] == [0]


def test_the_full_step_is_the_issues_61_gb_reserved_and_54_9_gb_allocated():
    trace = read_file(shared_traces() / FULLSTEP)
    segs = _rows(trace, "memory_segments")
    assert sum(s["total_bytes"] for s in segs) == 61_111_009_280
    assert sum(s["allocated_bytes"] for s in segs) == 54_873_829_888
    assert sum(b["bytes"] for b in _rows(trace, "memory_blocks") if b["state"] == "active_allocated") == 54_873_829_888


def test_the_history_anchored_at_the_snapshot_finds_the_parameters_before_it(tmp_path):
    """Both real snapshots are the same model: what their histories do not account for is the
    same 13.6 GB (the parameters, as large as each AdamW state), and the full step peaks at
    54.8 GB of requested bytes, both re-derived here by replaying the pickle."""
    with Store(tmp_path / "s.duckdb") as store:
        for rel in (FORWARD, FULLSTEP):
            raw = _load(rel)
            live_requested = sum(b["requested_size"] for s in raw["segments"] for b in s["blocks"]
                                 if b["state"] == "active_allocated")
            level, top, changes = 0, 0, []
            for e in raw["device_traces"][0]:
                level += {"alloc": e["size"], "free_requested": -e["size"]}.get(e["action"], 0)
                changes.append(level)
            before = live_requested - level
            top = before + max(changes)
            run_id = store.ingest(shared_traces() / rel).run_id
            [peak] = mem.peaks(store, run_id)
            assert (peak["before_history"], peak["allocated"]) == (before, top)
            assert before == 13_628_553_216
    assert top == 54_802_667_524


# -- the real timeline ----------------------------------------------------------------------

def test_real_timeline_rows_and_categories():
    raw = json.loads(gzip.decompress((shared_traces() / TIMELINE).read_bytes()))
    trace = read_file(shared_traces() / TIMELINE)
    assert trace.format == TORCH_MEMORY_TIMELINE and trace.schema_version == "raw"
    rows = _rows(trace, "memory_timeline")
    assert len(rows) == len(raw) == 16845
    first = min(r[0] for r in raw if r[0] != -1)
    names = dict(enumerate(["parameter", "optimizer_state", "input", "temporary", "activation", "gradient",
                            "autograd_detail", "unknown"]))
    actions = {1: "preexisting", 2: "create", 3: "increment_version", 4: "destroy"}
    assert [(r["ts_ns"], r["action"], r["bytes"], r["category"]) for r in rows] == \
        [(first if t == -1 else t, actions[a], n, names[c]) for t, a, n, c in raw]
    assert {r["device_id"] for r in rows} == {0}


def test_the_plot_layout_reads_as_the_raw_one():
    """timeline_train.json is the plot of timeline_train.raw.json.gz: per category, the levels
    after each time step agree."""
    def levels(trace):
        out, acc = {}, collections.Counter()
        for r in _rows(trace, "memory_timeline"):
            acc[r["category"]] += r["bytes"]
            out[r["ts_ns"] // 1000] = {k: v for k, v in acc.items() if v}
        return out
    raw = read_file(FIXTURES / "torch-memory" / "timeline_train.raw.json.gz")
    plot = read_file(FIXTURES / "torch-memory" / "timeline_train.json")
    assert plot.schema_version == "plot" and {r["action"] for r in _rows(plot, "memory_timeline")} == {None}
    a, b = levels(raw), levels(plot)
    assert set(b) <= set(a) and all(a[t] == b[t] for t in b)
    assert a[max(a)] == b[max(b)]


# -- fixtures -----------------------------------------------------------------------------------

def test_fixtures_are_current(tmp_path):
    for path in gen.write(tmp_path):
        committed = FIXTURES / "torch-memory" / path.name
        assert committed.read_bytes() == path.read_bytes(), f"{committed} is stale: run python fixtures/gen_torch_memory.py"


def test_fixture_facts_as_read():
    facts = gen.PLANTED["torch-memory/snapshot_oom.pickle"]
    t = read_file(FIXTURES / "torch-memory" / "snapshot_oom.pickle")
    segs, blocks = _rows(t, "memory_segments"), _rows(t, "memory_blocks")
    assert (len(segs), len(blocks), len(_rows(t, "allocator_events"))) == (facts["segments"], facts["blocks"], facts["events"])
    assert sum(s["total_bytes"] for s in segs) == facts["reserved"]
    assert sum(b["bytes"] for b in blocks if b["state"] == "active_allocated") == facts["allocated"]
    [oom] = [e for e in _rows(t, "allocator_events") if e["action"] == "oom"]
    assert (oom["bytes"], oom["device_free_bytes"], oom["address"]) == (facts["request"], facts["device_free"], None)
    assert [s["segment_type"] for s in segs].count("small") == 1 and {s["pool_id"] for s in segs} == {"0,0"}


def test_pytorch_2_0_snapshot_layout(tmp_path):
    """Blocks with `history` instead of `frames` and no address, no time_us, no settings."""
    p = tmp_path / "old.pickle"
    p.write_bytes(pickle.dumps(gen.snapshot_v2_0(), protocol=2))
    t = read_file(p)
    assert t.schema_version == "history" and t.clock == "none" and "allocator_settings" not in t.tables
    blocks = _rows(t, "memory_blocks")
    assert [b["address"] for b in blocks] == [gen.BASE, gen.BASE + 20 * gen.MIB]  # tiled from the segment's start
    assert blocks[0]["stack_id"] == 0 and blocks[1]["stack_id"] is None
    assert _rows(t, "allocator_events")[0]["ts_ns"] is None


def test_a_pytorch_1_snapshot_is_the_list_of_segments(tmp_path):
    p = tmp_path / "v1.pickle"
    p.write_bytes(pickle.dumps(gen.snapshot_v2_0()["segments"], protocol=2))
    t = read_file(p)
    assert len(_rows(t, "memory_segments")) == 1 and not _rows(t, "allocator_events")
    assert any("no allocator history" in w for w in t.warnings)


# -- detection and folder walks ------------------------------------------------------------------

def test_detection_and_what_a_folder_walk_passes_over(tmp_path):
    (tmp_path / "model.pkl").write_bytes(pickle.dumps({"weights": [1.0, 2.0]}, protocol=4))
    (tmp_path / "pairs.json").write_bytes(b'[["a", "b"], ["c", "d"]]')
    (tmp_path / "snap.pickle").write_bytes((FIXTURES / "torch-memory" / "snapshot_clean.pickle").read_bytes())
    (tmp_path / "tl.json").write_bytes((FIXTURES / "torch-memory" / "timeline_train.json").read_bytes())
    assert detect(tmp_path / "snap.pickle") == TORCH_MEMORY_SNAPSHOT
    assert detect(tmp_path / "tl.json") == TORCH_MEMORY_TIMELINE
    assert not_a_trace(tmp_path / "model.pkl") == "pickle that is no PyTorch memory snapshot"
    assert not_a_trace(tmp_path / "pairs.json") == "JSON array of arrays that is no PyTorch memory timeline"
    skipped: list = []
    found = sorted(p.name for p in find_traces([tmp_path], skipped))
    assert found == ["snap.pickle", "tl.json"] and sorted(p.name for p, _ in skipped) == ["model.pkl", "pairs.json"]
    with pytest.raises(TraceError, match="without `segments`"):
        read_file(tmp_path / "model.pkl")


# -- bad input ----------------------------------------------------------------------------------

def _snapshot_with(tmp_path, change) -> str:
    doc = gen.snapshot_clean()
    change(doc)
    p = tmp_path / "bad.pickle"
    p.write_bytes(pickle.dumps(doc, protocol=4))
    with pytest.raises(TraceError) as e:
        read_file(p)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_wrong_types_name_where_they_are(tmp_path):
    def block(key, value):
        return lambda d: d["segments"][0]["blocks"][1].__setitem__(key, value)
    assert _snapshot_with(tmp_path, block("size", "40")) == "segments[0].blocks[1].size is a string, not an integer"
    assert _snapshot_with(tmp_path, block("size", True)) == "segments[0].blocks[1].size is a bool, not an integer"
    assert _snapshot_with(tmp_path, block("size", 1 << 64)) == "segments[0].blocks[1].size = 1.84e+19 does not fit 64 bits"
    assert _snapshot_with(tmp_path, block("size", None)) == "segments[0].blocks[1].size is missing"
    bad_frame = [{"filename": "a.py", "line": 1.5, "name": "f"}]
    assert _snapshot_with(tmp_path, lambda d: d["device_traces"][0][2].__setitem__("frames", bad_frame)) == \
        "device_traces[0][2].frames[0].line is a number, not an integer"
    assert _snapshot_with(tmp_path, lambda d: d["segments"][0].__setitem__("device", 1 << 20)) == \
        "segments[0].device = 1048576 is no device index"
    assert "allocator_settings.expandable_segments" in _snapshot_with(
        tmp_path, lambda d: d["allocator_settings"].__setitem__("expandable_segments", "yes"))


def test_a_repeated_object_is_refused_before_its_rows_are_built(tmp_path):
    """A pickle names one object again in two bytes (BINGET): 10^5 references to one event
    would otherwise become 10^5 rows."""
    msg = _snapshot_with(tmp_path, lambda d: d["device_traces"][0].extend([d["device_traces"][0][0]] * 100_000))
    assert msg.startswith("device_traces[0][9] is the same object as an earlier entry")


def test_pickle_size_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEANALYZER_MAX_PICKLE_BYTES", "1K")
    with pytest.raises(TraceError, match=r"pickle of 2,7\d\d bytes, over the limit of 1KiB \(set TRACEANALYZER_MAX_PICKLE_BYTES"):
        read_file(FIXTURES / "torch-memory" / "snapshot_clean.pickle")


@pytest.mark.parametrize("data,message", [
    (b"[[1, 2, 3, 4], [5, 6, 7]]", "memory timeline is no list of rows of [time, action, bytes, category]: "
                                   "Expected `array` of length 4 - at `$[1]`"),
    (b"[[1, 5, 3, 4]]", "memory timeline row 0: action 5 is none of 1-4"),
    (b"[[1, 2, 3, 8]]", "memory timeline row 0: category 8 is none of 0-7"),
    (b"[[1, 2, 3, 4], [1, 2, 99999999999999999999, 4]]", "memory timeline: a value does not fit 64 bits"),
    (b"[[1, 2, 3], [[0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 1]]]", "3 times but 2 size rows"),
    (b"[[1, 2], [[0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 1]]]", "size row 1 holds 2 values, not 9"),
    (b"[[1, 2, 3, 4]", "memory timeline is not valid JSON"),
])
def test_bad_timelines_are_one_line_errors(tmp_path, data, message):
    p = tmp_path / "t.json"
    p.write_bytes(data)
    with pytest.raises(TraceError) as e:
        read_file(p)
    assert message in str(e.value) and "\n" not in str(e.value)


# -- the rules: sites, and what an OOM is blamed on ----------------------------------------------

@pytest.mark.parametrize("frames,label,via,op", [
    ([("??", 0, "at::_ops::bmm::call(at::Tensor const&)"), ("/x/site-packages/einops/einops.py", 916, "einsum"),
      ("/home/u/m.py", 22, "forward"), ("/home/u/run.py", 1, "<module>")],
     "u/m.py:22 forward", "einops/einops.py:916 einsum", "aten::bmm"),
    ([("??", 0, "at::_ops::empty_strided::call()"), ("??", 0, "at::_ops::index_Tensor::call()"),
      ("??", 0, "torch::autograd::generated::IndexBackward0::apply(std::vector<at::Tensor>&&)")],
     "IndexBackward0 in backward", None, "aten::index"),
    ([("/usr/lib/python3.11/threading.py", 10, "run")], "python3.11/threading.py:10 run (no frame of your own code)", None, None),
    ([("??", 0, "at::_ops::empty::call()")], "native code (no Python frame)", None, None),
    ([], mem.NO_STACK, None, None),
])
def test_sites_fold_library_and_native_frames(frames, label, via, op):
    site = mem.site_of(frames)
    assert (site.label, site.via, site.op) == (label, via, op)


def test_frame_kinds():
    assert mem.frame_kind("/home/u/proj/model.py") == "user"
    assert mem.frame_kind("/home/u/pytorch/torch/nn/modules/linear.py") == "library"  # a source checkout of torch
    assert mem.frame_kind("C:\\venv\\Lib\\site-packages\\einops\\einops.py") == "library"
    assert mem.frame_kind("RegisterCUDA.cpp") == mem.frame_kind("??") == mem.frame_kind("") == "native"


@pytest.mark.parametrize("request_mib,device_free_mib,cause", [(128, 100, "fragmentation"), (1024, 10, "full"),
                                                              (1024, 4096, "device")])
def test_an_oom_is_blamed_on_fragmentation_a_full_device_or_the_device(tmp_path, request_mib, device_free_mib, cause):
    doc = gen.snapshot_oom()
    oom = doc["device_traces"][0][-1]
    oom["size"], oom["device_free"] = request_mib * gen.MIB, device_free_mib * gen.MIB
    p = tmp_path / "oom.pickle"
    p.write_bytes(pickle.dumps(doc, protocol=4))
    with Store(tmp_path / "s.duckdb") as store:
        run_id = store.ingest(p).run_id
        run_rules(store, [run_id], Settings(select=["M002", "M003"]))
        found = {r[0]: (r[1], json.loads(r[2])) for r in store.sql(
            "SELECT rule_id, severity, evidence FROM findings WHERE run_id = ?", [run_id]).fetchall()}
    assert found["M003"][1]["cause"] == cause
    # 497.5 MiB stranded is under M002's thresholds: it reports it only when it is what failed the request
    assert (found["M002"][0] if "M002" in found else None) == ("error" if cause == "fragmentation" else None)


def test_the_memory_rules_run_only_on_their_formats(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        snap = store.ingest(FIXTURES / "torch-memory" / "snapshot_oom.pickle").run_id
        line = store.ingest(FIXTURES / "torch-memory" / "timeline_train.raw.json.gz").run_id
        outcomes = {(o.run_id, o.rule_id): o.status for o in
                    run_rules(store, [snap, line], Settings(select=["M001", "M002", "M003", "M004", "M005"]))}
    assert [outcomes[(snap, r)] for r in ("M001", "M002", "M003", "M004", "M005")] == \
        ["no-data", "ran", "ran", "ran", "no-data"]
    assert [outcomes[(line, r)] for r in ("M001", "M002", "M003", "M004", "M005")] == \
        ["no-data", "no-data", "no-data", "no-data", "ran"]


# -- Kineto allocator events categorised from operator context -----------------------------------

def _kineto_peak(tmp_path, trace: dict) -> list[dict]:
    """summary.memory of a Kineto trace written from `trace`."""
    from traceanalyzer import summary

    p = tmp_path / "step.json"
    p.write_text(json.dumps(trace))
    with Store(":memory:") as st:
        return summary.memory(st, st.ingest(p).run_id)


def _mib(dev: dict) -> dict[str, float]:
    return {c["category"]: c["bytes"] / gen.MIB for c in dev["categories"]}


def test_kineto_categories_at_a_peak_in_backward(tmp_path):
    [dev] = _kineto_peak(tmp_path, gen.kineto_train_step())
    # by hand: 316 before the capture - 16 freed = 300; forward kept 100 + 100 + 400 (freed in
    # backward) and the 1 loss (never freed); backward made g1 150 and b1 80 (freed in backward)
    assert dev["peak_allocated_bytes"] == 1131 * gen.MIB and dev["source"] == "allocator totals"
    assert _mib(dev) == {"activation": 600, "parameter": 300, "gradient": 150, "temporary": 80, "unknown": 1}
    assert [c["category"] for c in dev["categories"]] == ["activation", "parameter", "gradient", "temporary", "unknown"]
    assert sum(c["share"] for c in dev["categories"]) == pytest.approx(1)
    facts = gen.PLANTED["torch-memory/kineto_train_step.json"]
    assert {k: v * gen.MIB for k, v in _mib(dev).items()} == {k: v for k, v in facts.items() if k != "peak"}


def test_kineto_categories_at_a_peak_in_the_optimizer_step(tmp_path):
    [dev] = _kineto_peak(tmp_path, gen.kineto_train_step(state=400 * gen.MIB))
    # after backward 601 (300 + the loss + g1 + g2), then Adam's 400 + 400 and the 50 temporary in a
    # reused block: 1451, the activations all freed
    assert dev["peak_allocated_bytes"] == 1451 * gen.MIB
    assert _mib(dev) == {"optimizer_state": 800, "parameter": 300, "gradient": 300, "temporary": 50, "unknown": 1}


def test_kineto_categories_without_steps_take_the_run_as_one(tmp_path):
    trace = gen.kineto_train_step()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    [dev] = _kineto_peak(tmp_path, trace)
    assert _mib(dev) == {"activation": 600, "parameter": 300, "gradient": 150, "temporary": 80, "unknown": 1}


def test_kineto_categories_need_addresses_and_a_training_step(tmp_path):
    no_addresses = gen.kineto_train_step()
    for e in no_addresses["traceEvents"]:
        e.get("args", {}).pop("Addr", None)
    inference = gen.kineto_train_step()
    inference["traceEvents"] = [e for e in inference["traceEvents"]
                                if "Backward" not in e["name"] and "Optimizer" not in e["name"]]
    for trace in (no_addresses, inference):
        [dev] = _kineto_peak(tmp_path, trace)
        assert dev["categories"] is None and dev["peak_allocated_bytes"] == 1131 * gen.MIB
    # addresses holding more than the peak (here totals that count half of each block) are not trusted
    halved = gen.kineto_train_step()
    for e in halved["traceEvents"]:
        if "Total Allocated" in e.get("args", {}):
            e["args"]["Total Allocated"] //= 2
    [dev] = _kineto_peak(tmp_path, halved)
    assert dev["categories"] is None and dev["peak_allocated_bytes"] == 1131 * gen.MIB // 2
