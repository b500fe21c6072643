"""S001, S002, S003 and M001 on real traces (values re-derived here with json/gzip), and the fixtures.

The re-derivations below read the source files directly and follow each rule's documented
method (its `how` text) in plain Python, without the store or the rule's SQL.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
import sys
from collections import defaultdict

import pytest

from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES, shared_traces

sys.path.insert(0, str(FIXTURES))
import gen_structure  # noqa: E402
import gen_timeline  # noqa: E402


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("structure") / "s.duckdb")

    def run(rel_path: str, rule: str) -> tuple[list[dict], str]:
        r = store.ingest(shared_traces() / rel_path)
        [outcome] = run_rules(store, [r.run_id], Settings(select=[rule]))
        rows = store.arrow("SELECT * FROM findings WHERE run_id = ? AND rule_id = ? ORDER BY est_loss_ns DESC NULLS LAST",
                           [r.run_id, rule]).to_pylist()
        for row in rows:
            row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else None
        return rows, outcome.status

    yield run
    store.close()


def _kineto(rel_path: str) -> tuple[list[dict], int]:
    path = shared_traces() / rel_path
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"], int(data.get("baseTimeNanoseconds", 0))


def _ns(us: float, base: int) -> int:
    whole = math.floor(us)
    return base + int(whole) * 1000 + round((us - whole) * 1000)


def _complete(events, base, cats):
    """(event, start_ns, end_ns) of the `X` events of these categories."""
    out = []
    for e in events:
        if e.get("ph") == "X" and (e.get("cat") or "").lower() in cats:
            start = _ns(e["ts"], base)
            out.append((e, start, start + round(e["dur"] * 1000)))
    return out


# -- fixtures ----------------------------------------------------------------------------

def test_fixtures_regenerate_byte_identical(tmp_path):
    written, _ = gen_structure.write_all(tmp_path)
    assert len(written) == 9
    for path in written:
        committed = FIXTURES / path.relative_to(tmp_path)
        assert committed.read_bytes() == path.read_bytes(), f"{committed} is stale: run python fixtures/gen_structure.py"


def test_planted_facts_are_what_the_fixtures_hold():
    """The facts the cases files rely on, re-read from the fixture files themselves."""
    events = json.loads((FIXTURES / "kineto/structure_memory.json").read_text())["traceEvents"]
    cuda = [e["args"] for e in events if e["name"] == "[memory]" and e["args"]["Device Type"] == 1]
    facts = gen_structure.PLANTED["kineto/structure_memory.json"]
    assert max(a["Total Allocated"] for a in cuda) == facts["peak_allocated_bytes"] == int(2.75 * (1 << 30))
    assert max(a["Total Reserved"] for a in cuda) == facts["peak_reserved_bytes"] == 6 << 30
    import sqlite3
    con = sqlite3.connect(f"file:{FIXTURES / 'nsys/structure_memory.sqlite'}?mode=ro", uri=True)
    rows = con.execute("SELECT bytes, memoryOperationType FROM CUDA_GPU_MEMORY_USAGE_EVENTS ORDER BY start").fetchall()
    running = [sum((b if op == 0 else -b) for b, op in rows[:i + 1]) for i in range(len(rows))]
    nsys_facts = gen_structure.PLANTED["nsys/structure_memory.sqlite"]
    assert max(running) - min(running) == nsys_facts["peak_allocated_bytes"] == 20 << 20
    assert -min(running) == nsys_facts["before_trace_bytes"]


# -- S001 --------------------------------------------------------------------------------

def _shape_groups(events, base):
    """Per (op, Input Dims): durations in call order, start/end of the first call, thread."""
    groups = defaultdict(list)
    for e, start, end in _complete(events, base, {"cpu_op", "operator"}):
        dims = (e.get("args") or {}).get("Input Dims")
        if dims is not None:
            groups[(e["name"], json.dumps(dims, separators=(",", ":")))].append((start, end, e["pid"], e["tid"]))
    return {k: sorted(v) for k, v in groups.items()}


def _expected_s001(groups, ratio=5.0, min_excess=50_000, min_shapes=3, min_slow=2, min_share=0.5):
    per_op = defaultdict(dict)
    for (name, shape), calls in groups.items():
        per_op[name][shape] = calls
    candidates = {}
    for name, shapes in per_op.items():
        slow, repeated = {}, 0
        for shape, calls in shapes.items():
            if len(calls) < 2:
                continue
            repeated += 1
            first = calls[0][1] - calls[0][0]
            later = statistics.median(c[1] - c[0] for c in calls[1:])
            if first >= ratio * later and first - later >= min_excess:
                slow[shape] = (first - later, calls[0])
        if len(shapes) >= min_shapes and len(slow) >= min_slow and len(slow) >= min_share * repeated:
            candidates[name] = slow
    return candidates


def test_s001_b200_first_linear_call_per_shape(check):
    """vLLM eager on B200: each new aten::linear shape's first call pays ~1.5-2.5 ms (cuBLAS
    heuristics), later calls 50-90 us; aten::addmm inside it is folded into aten::linear."""
    path = "torch/TraceLens__b200__eager_trace.json.gz"
    events, base = _kineto(path)
    candidates = _expected_s001(_shape_groups(events, base))
    assert set(candidates) == {"aten::linear", "aten::addmm"}
    # Every slow first addmm lies inside a slow first linear on the same thread.
    linear_firsts = [c for _, c in candidates["aten::linear"].values()]
    for _, (s, e, pid, tid) in candidates["aten::addmm"].values():
        assert any(ls <= s and le >= e and lp == pid and lt == tid for ls, le, lp, lt in linear_firsts)
    expected_excess = sum(x for x, _ in candidates["aten::linear"].values())

    findings, status = check(path, "S001")
    assert status == "ran"
    [f] = findings
    assert f["item_name"] == "aten::linear" and f["item_kind"] == "cpu_op"
    assert f["evidence"]["inner"] == ["aten::addmm"]
    assert f["value"] == len(candidates["aten::linear"]) == 3
    assert f["evidence"]["first_call_excess_ns"] == pytest.approx(expected_excess, abs=1)
    assert expected_excess > 5_000_000
    # The loss is the part of each first call's excess the GPU spent waiting for the host: at
    # most the device's idle time within the call (its host part, the budget's marks, is less).
    busy = gen_timeline.union((s, e) for _, s, e in _complete(events, base, {"kernel", "gpu_memcpy", "gpu_memset"}))
    idle_bound = sum(min(x, (e - s) - sum(max(0, min(e, be) - max(s, bs)) for bs, be in busy))
                     for x, (s, e, _, _) in candidates["aten::linear"].values())
    assert 0 < f["est_loss_ns"] == f["evidence"]["gpu_waiting_ns"] <= idle_bound
    worst_excess, (ws, we, _, _) = max(candidates["aten::linear"].values())
    assert (f["start_ns"], f["end_ns"]) == (ws, we)
    assert f["evidence"]["worst"][0]["excess_ns"] == pytest.approx(worst_excess)


def test_s001_quiet_when_few_shapes_are_slow(check):
    """A DLRM-like trace: aten::to sees 39 shapes but only 2 of 34 repeated ones start slow."""
    path = "torch/hta__negative_queue_length_values_check__rank0.json.gz"
    events, base = _kineto(path)
    groups = _shape_groups(events, base)
    assert _expected_s001(groups) == {}
    loose = _expected_s001(groups, min_share=0.0)
    assert "aten::to" in loose  # it is the share threshold that keeps it quiet
    assert check(path, "S001") == ([], "ran")


def test_s001_no_data_without_shapes_or_launches(check):
    for path in ("torch/hta__cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz",
                 "nsys/DynamicViT__nsys_profile.sqlite"):
        assert check(path, "S001") == ([], "no-data")


# -- S002 --------------------------------------------------------------------------------

# This test's own reading of "element-wise": PyTorch element-wise/functor kernels and
# reductions, short ones only; the Qwen trace's other kernels are GEMMs, flash attention,
# CatArrayBatchedCopy and index kernels.
_EW = re.compile(r"elementwise|Functor|reduce_kernel")
_NOT = re.compile(r"gemm|flash|xmma", re.I)
_DTYPE = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4, "bool": 1, "double": 8}


def _op_bytes(op: dict) -> int | None:
    args = op.get("args") or {}
    best = None
    for dims, t in zip(args.get("Input Dims") or [], args.get("Input type") or []):
        if t in _DTYPE and isinstance(dims, list) and all(isinstance(x, int) for x in dims):
            best = max(best or 0, math.prod(dims) * _DTYPE[t])
    return best


def test_s002_qwen_rmsnorm_and_rotary_chains(check):
    """HF Qwen1.5 on H100 in eager mode: RMSNorm (add, to(float), pow, mean | rsqrt, mul, to, mul)
    and rotary embedding run as chains of element-wise kernels."""
    path = "torch/TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    events, base = _kineto(path)
    bandwidth = 3.35e12  # H100 SXM5 80GB (formats.md 5.3); the trace has no bandwidth
    ops = {e["args"]["External id"]: e for e, _, _ in _complete(events, base, {"cpu_op"})
           if "External id" in (e.get("args") or {})}
    # A kernel names its operator by `External id`, or through its launch call (same correlation).
    launch_ext = {e["args"]["correlation"]: e["args"].get("External id")
                  for e, _, _ in _complete(events, base, {"cuda_runtime", "cuda_driver"}) if "correlation" in e["args"]}

    def out_bytes(kernel):
        a = kernel["args"]
        op = ops.get(a.get("External id", launch_ext.get(a.get("correlation"))))
        size = _op_bytes(op) if op else None
        if size is not None:
            return size, "operator input dims"
        return math.prod(a["grid"]) * math.prod(a["block"]) * 4, "grid x block threads x 4 bytes (proxy)"

    per_stream = defaultdict(list)
    for e, s, t in _complete(events, base, {"kernel", "gpu_memcpy", "gpu_memset"}):
        a = e["args"]
        ew = e["cat"] == "kernel" and bool(_EW.search(e["name"])) and not _NOT.search(e["name"]) and t - s <= 50_000
        per_stream[(a["device"], a["stream"])].append((s, t, e, ew))
    chains = []
    for items in per_stream.values():
        items.sort(key=lambda x: (x[0], x[1]))
        run = []
        for s, t, e, ew in items:
            if run and ew and s - run[-1][1] <= 100_000 and "reduce_kernel" not in run[-1][2]["name"]:
                run.append((s, t, e))
                continue
            if len(run) >= 3:
                chains.append(run)
            run = [(s, t, e)] if ew else []
        if len(run) >= 3:
            chains.append(run)
    signatures = defaultdict(lambda: [0, 0.0, 0, set()])
    for run in chains:
        gaps = sum(run[i][0] - run[i - 1][1] for i in range(1, len(run)))
        durs = [t - s for s, t, _ in run]
        sizes = [out_bytes(e) for _, _, e in run[:-1]]
        inter = sum(b for b, _ in sizes)
        saving = gaps + min(2 * inter / bandwidth * 1e9, sum(durs) - max(durs))
        sig = signatures[tuple(e["name"] for _, _, e in run)]
        sig[0] += 1
        sig[1] += saving
        sig[2] += inter
        sig[3] |= {source for _, source in sizes}
    kernels = [(s, t) for e, s, t in _complete(events, base, {"kernel", "gpu_memcpy", "gpu_memset"})]
    span = max(t for _, t in kernels) - min(s for s, _ in kernels)
    expected = sorted(((v[1], v[0], v[2], len(k), sorted(v[3])) for k, v in signatures.items()
                       if v[1] / span >= 0.01), reverse=True)
    assert len(expected) == 4

    findings, status = check(path, "S002")
    assert status == "ran"
    assert len(findings) == len(expected)
    for f, (saving, n, inter, length, sources) in zip(findings, expected):
        assert f["est_loss_ns"] == pytest.approx(saving, abs=2)
        assert f["evidence"]["chains"] == n and f["evidence"]["kernels_per_chain"] == length
        assert f["evidence"]["intermediate_bytes"] == inter
        assert f["evidence"]["bytes_source"] == sources
        assert f["value"] == pytest.approx(saving / span, rel=1e-6)
        assert f["severity"] == ("warning" if saving / span >= 0.05 else "info")
    assert findings[0]["item_name"] == "aten::add -> aten::copy_ -> aten::pow -> aten::mean"


def test_s002_quiet_and_no_data(check):
    # Rodinia Gaussian: 8190 Fan1/Fan2 kernels, none element-wise by name.
    assert check("nsys/Rodinia_Gaussian__report2.sqlite", "S002") == ([], "ran")
    assert check("nsys/DynamicViT__nsys_profile.sqlite", "S002") == ([], "no-data")


# -- M001 --------------------------------------------------------------------------------

_ALLOCATOR_OPS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                  "aten::new_empty_strided", "aten::resize_", "aten::empty_permuted"}


def _memory(events, base):
    """CUDA [memory] events in time order (file order among equal times)."""
    mem = [e for e in events if e.get("name") == "[memory]" and (e.get("args") or {}).get("Device Type") == 1]
    return sorted(((_ns(e["ts"], base), i, e) for i, e in enumerate(mem)), key=lambda x: (x[0], x[1]))


def _charge_all(allocations, ops):
    """For each (ts, pid, tid) allocation: the innermost enclosing operator on its thread, past
    allocator-only ones. A sweep in time order with a stack per thread (operators on a thread nest)."""
    marks = [(s, 0, -t, (p, th), name, t) for s, t, p, th, name in ops]
    marks += [(ts, 1, 0, (p, th), i, None) for i, (ts, p, th) in enumerate(allocations)]
    stacks, charged = defaultdict(list), [None] * len(allocations)
    for ts, kind, _, thread, what, end in sorted(marks, key=lambda m: m[:3]):
        stack = stacks[thread]
        while stack and stack[-1][1] < ts:
            stack.pop()
        if kind == 0:
            stack.append((what, end))
        else:
            real = [name for name, _ in stack if name not in _ALLOCATOR_OPS]
            charged[what] = real[-1] if real else stack[-1][0] if stack else "(no operator)"
    return charged


@pytest.mark.parametrize("path", [
    "torch/TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "torch/TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz",
    "torch/hta__df_index_resolver__df_index_resolver.json.gz",
])
def test_m001_peak_and_what_holds_it(check, path):
    events, base = _kineto(path)
    mem = _memory(events, base)
    alloc = [e["args"]["Total Allocated"] for _, _, e in mem]
    reserved = [e["args"]["Total Reserved"] for _, _, e in mem]
    k = alloc.index(max(alloc))
    peak_ts = mem[k][0]
    # Live at the peak: allocations up to it whose address was not freed or reused by then.
    live = {}
    for ts, _, e in mem[:k + 1]:
        a = e["args"]
        live.pop(a["Addr"], None)
        if a["Bytes"] > 0:
            live[a["Addr"]] = (ts, a["Bytes"], e["pid"], e["tid"])
    held = sum(b for _, b, _, _ in live.values())
    ops = [(s, t, e["pid"], e["tid"], e["name"]) for e, s, t in _complete(events, base, {"cpu_op"})]
    by_op, count = defaultdict(int), defaultdict(int)
    allocations = list(live.values())
    for (_, b, _, _), op in zip(allocations, _charge_all([(ts, p, t) for ts, _, p, t in allocations], ops)):
        by_op[op] += b
        count[op] += 1
    top_op = min(by_op, key=lambda o: (-by_op[o], o))  # most bytes; ties by name

    findings, status = check(path, "M001")
    assert status == "ran"
    peak = next(f for f in findings if f["item_name"] == "peak allocated memory")
    assert peak["value"] == max(alloc)
    assert peak["start_ns"] == peak_ts and peak["end_ns"] == mem[k + 1][0]
    ev = peak["evidence"]
    assert ev["peak_reserved_bytes"] == max(reserved)
    assert ev["attribution"] == "live at the peak" and ev["attributed_bytes"] == held
    assert ev["held_from_before_trace_bytes"] == max(alloc) - held > 0
    assert ev["top_ops"][0] == {"op": top_op, "bytes": by_op[top_op], "allocations": count[top_op]}
    unused = 1 - max(alloc) / max(reserved)
    frag = [f for f in findings if f["item_name"] == "reserved but unallocated memory"]
    if unused >= 0.3 and max(reserved) - max(alloc) >= 1 << 30:
        [f] = frag
        # reserved the same at every event: cached before the trace, it never grew in it
        flat = min(reserved) == max(reserved)
        assert f["value"] == pytest.approx(unused) and f["severity"] == ("info" if flat else "warning")
        assert ("throughout the trace" in f["message"]) == flat
        assert path.endswith("df_index_resolver.json.gz") and flat  # 12.8 GB reserved for 6.6 GB allocated
    else:
        assert frag == []


def test_m001_legacy_running_sum_without_totals(check):
    """2021 ResNet-50 trace: [memory] events carry only Bytes; the total is their running sum."""
    path = "torch/kineto__tb_plugin__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
    events, base = _kineto(path)
    mem = _memory(events, base)
    assert all("Total Allocated" not in e["args"] and "Addr" not in e["args"] for _, _, e in mem)
    running, cum = [], 0
    for _, _, e in mem:
        cum += e["args"]["Bytes"]
        running.append(cum)
    baseline = max(0, -min(running))
    allocated = [r + baseline for r in running]
    k = allocated.index(max(allocated))
    low = max(i for i in range(k) if allocated[i] == min(allocated[:k]))
    climbed = sum(e["args"]["Bytes"] for _, _, e in mem[low + 1:k + 1] if e["args"]["Bytes"] > 0)

    findings, status = check(path, "M001")
    assert status == "ran"
    [f] = findings  # no reserved totals: no fragmentation finding
    assert f["value"] == max(allocated) and f["start_ns"] == mem[k][0]
    assert f["evidence"]["totals"] == "running sum of signed sizes"
    assert f["evidence"]["before_trace_bytes"] == baseline
    assert f["evidence"]["attribution"] == "allocated since the last low point before the peak"
    assert f["evidence"]["attributed_bytes"] == climbed


def test_m001_planted_peak_is_charged_to_the_allocating_ops(check):
    """gen_kineto's planted trace allocates inside aten::copy_ (4 MiB), aten::mm (1 MiB) and
    aten::add (2 MiB, freed before the peak; then 8 MiB), and its frees name the addresses
    of the blocks they free: at the 13 MiB peak every live block is known by address."""
    findings, status = check(str(FIXTURES / "kineto" / "planted.json"), "M001")
    assert status == "ran"
    peak = next(f for f in findings if f["item_name"] == "peak allocated memory")
    ev = peak["evidence"]
    assert peak["value"] == 13 << 20 and ev["attribution"] == "live at the peak"
    assert ev["attributed_bytes"] == 13 << 20 and ev["held_from_before_trace_bytes"] == 0
    assert [(o["op"], o["bytes"], o["allocations"]) for o in ev["top_ops"]] == [
        ("aten::add", 8 << 20, 1), ("aten::copy_", 4 << 20, 1), ("aten::mm", 1 << 20, 1)]


def test_m001_no_data_without_memory_events(check):
    assert check("torch/TraceLens__b200__eager_trace.json.gz", "M001") == ([], "no-data")
    assert check("nsys/Rodinia_Gaussian__report2.sqlite", "M001") == ([], "no-data")


# -- S003 eager attention on real traces ------------------------------------------------------

MATMUL_OPS = {"aten::bmm", "aten::matmul", "aten::baddbmm", "aten::mm", "aten::addmm"}
SOFTMAX_OPS = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax"}
ELEMENT_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8}
# Kineto traces that compute attention: owlv2 eagerly over 5185 tokens (and its text encoder over 5);
# xDiT SD3.5 with flash attention and eager windows of 256 tokens; the others through SDPA's flash
# backend (H100, MI300X).
ATTENTION_TRACES = [
    "torch/TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz",
    "torch/TraceLens__inference__xdit_sd_3.5__profile_trace_rank_0.json.gz",
    "torch/TraceLens__h100__Falconsai_nsfw_image_detection__1016002.json.gz",
    "torch/TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "torch/TraceLens__mi300__gaunernst_bert-small-uncased__1016001.json.gz",
]


def _product(xs) -> int:
    return math.prod(xs) if xs else 1


def _eager_attention(rel_path: str, min_tokens: int = 512) -> dict:
    """S003 re-derived from the raw trace: per thread, each softmax over [.., Lq, Lk] (both >= min_tokens)
    between the matrix product that makes those scores and the next one that reads them; the
    kernels (by External id) of the operators from the first product's start to the second's end,
    less those of the products."""
    events, base = _kineto(rel_path)
    ops = _complete(events, base, {"cpu_op"})
    kernels = defaultdict(list)
    for e, start, end in _complete(events, base, {"kernel"}):
        kernels[e["args"].get("External id")].append((start, end, e["name"]))
    gpu = _complete(events, base, {"kernel", "gpu_memcpy", "gpu_memset"})
    span = max(t for _, _, t in gpu) - min(s for _, s, _ in gpu)
    kernel_ns = sum(t - s for k in kernels.values() for s, t, _ in k)
    threads = defaultdict(list)
    for e, s, t in ops:
        threads[(e["pid"], e["tid"])].append((s, t, e))
    pairs = {}
    for thread, lst in threads.items():
        mms = [(s, t, e) for s, t, e in lst if e["name"] in MATMUL_OPS]
        for s, t, e in sorted(lst, key=lambda x: (x[0], -x[1])):
            dims = (e["args"].get("Input Dims") or [[]])[0]
            if e["name"] not in SOFTMAX_OPS or len(dims) < 2 or min(dims[-2:]) < min_tokens:
                continue
            lq, lk, numel = dims[-2], dims[-1], _product(dims)
            before = [m for m in mms if m[1] <= s]
            after = [m for m in mms if m[0] >= t]
            if not before or not after:
                continue
            qk = max(before, key=lambda m: (m[1], -m[0]))  # the last to end; the outermost of those
            pv = min(after, key=lambda m: (m[0], -m[1]))  # the first to start; the outermost of those
            skip = 1 if qk[2]["name"] in ("aten::baddbmm", "aten::addmm") else 0
            a, b = qk[2]["args"]["Input Dims"][skip:skip + 2]
            pa = pv[2]["args"]["Input Dims"][0]
            if (a[-2], b[-1]) != (lq, lk) or max(_product(a[:-2]), _product(b[:-2])) * lq * lk != numel:
                continue
            if pa[-2:] != [lq, lk] or _product(pa) != numel:
                continue
            pairs.setdefault((qk[2]["args"]["External id"], pv[2]["args"]["External id"]),
                             (thread, qk, (s, t, e), pv))
    blocks = []
    for thread, qk, sm, pv in pairs.values():
        gemm = other = softmax = 0
        for s, t, e in threads[thread]:
            if not qk[0] <= s <= pv[1]:
                continue
            ns = sum(b - a for a, b, _ in kernels.get(e["args"].get("External id"), []))
            if qk[0] <= s <= qk[1] or pv[0] <= s <= pv[1]:
                gemm += ns
            else:
                other += ns
                softmax += ns if sm[0] <= s <= sm[1] else 0
        dims = sm[2]["args"]["Input Dims"][0]
        blocks.append({"tokens": dims[-1], "gemm_ns": gemm, "other_ns": other, "softmax_ns": softmax,
                       "bytes": _product(dims) * ELEMENT_BYTES[sm[2]["args"]["Input type"][0]]})
    blocks = [b for b in blocks if b["softmax_ns"] > 0]
    return {"blocks": blocks, "span_ns": span, "kernel_ns": kernel_ns,
            "other_ns": sum(b["other_ns"] for b in blocks), "softmax_ns": sum(b["softmax_ns"] for b in blocks),
            "gemm_ns": sum(b["gemm_ns"] for b in blocks), "bytes": sum(b["bytes"] for b in blocks)}


@pytest.mark.parametrize("path", ATTENTION_TRACES)
def test_s003_eager_attention_on_real_traces(real_corpus, path):
    """Found where the raw trace shows eager attention over long sequences, at its figures; quiet
    where attention runs fused (flash) or over short sequences."""
    file_name = path.split("/", 1)[1]
    (run_id,) = real_corpus.sql("SELECT run_id FROM runs WHERE file_name = ?", [file_name]).fetchone()
    (status,) = real_corpus.sql("SELECT status FROM rule_runs WHERE run_id = ? AND rule_id = 'S003'",
                                [run_id]).fetchone()
    assert status == "ran"
    rows = real_corpus.arrow("SELECT * FROM findings WHERE run_id = ? AND rule_id = 'S003'", [run_id]).to_pylist()
    want = _eager_attention(path)
    if not want["blocks"] or want["other_ns"] / want["span_ns"] < 0.05:
        assert rows == []
        return
    (f,) = rows
    ev = json.loads(f["evidence"])
    assert ev["blocks"] == len(want["blocks"])
    assert ev["query_tokens"] == ev["key_tokens"] == max(b["tokens"] for b in want["blocks"])
    # Kineto writes microseconds with 3 decimals: the store's ns and these agree to the ns.
    assert (f["rule_loss_ns"], ev["softmax_ns"], ev["gemm_ns"], ev["kernel_ns"]) == (
        want["other_ns"], want["softmax_ns"], want["gemm_ns"], want["kernel_ns"])
    assert f["value"] == pytest.approx(want["other_ns"] / want["span_ns"], rel=1e-9)
    bandwidth = 2 * want["bytes"] / want["softmax_ns"] * 1e9
    assert ev["softmax_bytes_per_s"] == pytest.approx(bandwidth, rel=1e-9)
    # severity by the diagnosis's bands on the loss's share of the device's span (10%: error)
    share = f["est_loss_ns"] / want["span_ns"]
    assert f["claims"] == "compute" and f["severity"] == ("error" if share >= 0.10 else "warning")


def test_s003_owlv2_figures():
    """The figures an expert reads off owlv2 (H100, 3.35 TB/s): 120 blocks over 5185 tokens whose
    softmax is about half the kernel time, a quarter of the span, at under a quarter of the DRAM
    bandwidth; the score matrix 16 heads x 5185 x 5185 x 2 bytes."""
    want = _eager_attention(ATTENTION_TRACES[0])
    assert {b["tokens"] for b in want["blocks"]} == {5185} and len(want["blocks"]) == 120
    assert want["bytes"] == 120 * 16 * 5185 * 5185 * 2
    assert want["softmax_ns"] == want["other_ns"]  # no scaling, masking or dropout kernels in between
    assert 0.47 < want["other_ns"] / want["kernel_ns"] < 0.48
    assert 0.24 < want["other_ns"] / want["span_ns"] < 0.25
    assert 0.23 < 2 * want["bytes"] / want["softmax_ns"] * 1e9 / 3.35e12 < 0.24


def test_s003_quiet_on_every_other_real_trace(real_corpus):
    """Of every real trace, only owlv2 computes attention eagerly over long sequences."""
    found = {name for (name,) in real_corpus.sql(
        "SELECT DISTINCT r.file_name FROM findings f JOIN runs r USING (run_id) WHERE f.rule_id = 'S003'").fetchall()}
    assert found == {ATTENTION_TRACES[0].split("/", 1)[1]}
