"""B003, B004, I002-I005 on real traces, with values re-derived here from the CSV / JSON,
plus the bottleneck fixtures' regeneration and planted answers."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import math
import re
from collections import defaultdict

import pytest

from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store

from .conftest import FIXTURES, SHARED_TRACES, shared_traces

MY_RULES = ("B003", "B004", "I002", "I003", "I004", "I005")
XP_CFD = "ncu/XPlacer__cfd__lassen__nsight_cfd_097K.log"
XP_GAUSS = "ncu/XPlacer__gaussian__nsight_gaussian_16.log"
XP_HOTSPOT = "ncu/XPlacer__hotspot__lassen__nsight_hotspot_1024.log"
NSIGHTFUL = "ncu/nsightful__copy_blocked.csv"
POLY_MEM = "ncu/PolyFHE__ckks_HMult__ncu-memory-evalkey-1.csv"
POLY_NTT = "ncu/PolyFHE__ckks_HMult__ncu-ntt12-A4090-1.csv"
POLY_STALL = "ncu/PolyFHE__profile__evalstall-stallreason-opt.csv"
B200_FLASH = "ncu/Roofline-Analysis__decodebench__torch_sdpa_flash__gqa_bf16_b64_ctx4k_p64.ncu.csv"
QWEN = "torch/TraceLens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("bottleneck") / "s.duckdb")
    runs: dict[str, str] = {}

    def run(path, rule: str) -> tuple[list[dict], str]:
        if path not in runs:
            runs[path] = store.ingest(path).run_id
        rid = runs[path]
        [outcome] = run_rules(store, [rid], Settings(select=[rule]))
        rows = store.arrow("SELECT * FROM findings WHERE run_id = ? AND rule_id = ?", [rid, rule]).to_pylist()
        for row in rows:
            row["evidence"] = json.loads(row["evidence"]) if row["evidence"] else None
        return rows, outcome.status

    def check(rel, rule):
        return run(shared_traces() / rel, rule)

    check.store = store  # the store the findings are in, for the values a test re-derives from it
    yield check
    store.close()


# -- reading ncu details CSVs here, independently of the reader ---------------------------

_TIME_NS = {"nsecond": 1, "ns": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}
_SI = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def details(rel_path: str) -> dict[str, dict]:
    """Per launch ID: name and {Metric Name: value in base units} from a details page."""
    text = (shared_traces() / rel_path).read_text(errors="replace")
    start = re.search(r'^"ID",', text, re.MULTILINE).start()
    out: dict[str, dict] = {}
    for r in csv.DictReader(text[start:].splitlines()):
        if not r.get("Metric Name") or r.get("Metric Value") in (None, "", "n/a"):
            continue
        try:
            v = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        unit = r["Metric Unit"]
        if unit in _TIME_NS:
            v *= _TIME_NS[unit]
        elif unit.endswith("byte") and unit[:-4] in _SI:
            v *= _SI[unit[:-4]]
        k = out.setdefault(r["ID"], {"name": r["Kernel Name"], "m": {}})
        k["m"][r["Metric Name"]] = v
    return out


def by_kernel(launches: dict, weight_label: str | None = "Duration") -> dict[str, dict]:
    """name -> {label: weighted mean over launches, "_dur": summed duration, "_n": launches}."""
    acc: dict[str, dict] = defaultdict(lambda: {"_w": defaultdict(float), "_s": defaultdict(float), "_dur": 0.0, "_n": 0})
    for k in launches.values():
        a = acc[k["name"]]
        w = k["m"].get(weight_label, 1.0) if weight_label else 1.0
        a["_dur"] += k["m"].get("Duration", 0.0)
        a["_n"] += 1
        for label, v in k["m"].items():
            a["_s"][label] += v * w
            a["_w"][label] += w
    return {n: {**{lab: a["_s"][lab] / a["_w"][lab] for lab in a["_s"]}, "_dur": a["_dur"], "_n": a["_n"]}
            for n, a in acc.items()}


def sol_verdict(sm: float, mem: float) -> str:
    """NVIDIA SOLBottleneck lines 80 / 60 / 10, written out again here; at or over 80, where NVIDIA
    names no side, the higher one unless the two are within 10 points (both busy)."""
    if max(sm, mem) < 60:
        return "latency"
    if abs(sm - mem) >= 10:
        return "compute" if sm >= mem else "memory"
    return "balanced"


# -- B003 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path,sm_label,mem_label", [
    (XP_CFD, "SM [%]", "Memory [%]"), (XP_GAUSS, "SM [%]", "Memory [%]"), (XP_HOTSPOT, "SM [%]", "Memory [%]"),
    (NSIGHTFUL, "Compute (SM) Throughput", "Memory Throughput"),
])
def test_b003_sol_classification_on_real_ncu(check, path, sm_label, mem_label):
    kernels = by_kernel(details(path))
    if path == NSIGHTFUL:  # "Memory Throughput" is % under Speed Of Light, byte/s under Memory Workload Analysis
        [k] = details(path).values()
        rows = list(csv.DictReader((shared_traces() / path).read_text().splitlines()))
        mem = next(float(r["Metric Value"]) for r in rows
                   if r["Section Name"] == "GPU Speed Of Light Throughput" and r["Metric Name"] == mem_label)
        kernels[k["name"]][mem_label] = mem
    total = sum(k["_dur"] for k in kernels.values())
    expected = {}
    for name, k in kernels.items():
        if k["_dur"] / total >= 0.01:
            sm, mem = k[sm_label], k[mem_label]
            expected[name] = (sol_verdict(sm, mem), max(sm, mem) / 100, k["_dur"], k["_dur"] / k["_n"])
    findings, status = check(path, "B003")
    assert status == "ran"
    got = {f["item_name"]: f for f in findings}
    assert set(got) == set(expected)
    for name, (bound, share, dur, per_launch) in expected.items():
        f = got[name]
        assert f["evidence"]["bound"] == bound and f["evidence"]["source"] == "sol"
        assert f["value"] == pytest.approx(share, rel=1e-9)
        if bound == "latency" and per_launch < 5_000:  # mostly the fixed cost of starting a kernel
            assert f["est_loss_ns"] is None and f["severity"] == "info"
        elif bound == "latency":
            assert f["est_loss_ns"] == round(dur * (1 - share / 0.8))
            assert f["severity"] == ("warning" if dur / total >= 0.05 else "info")
        else:
            assert f["est_loss_ns"] is None and f["severity"] == "info"


def test_b003_cfd_verdicts(check):
    findings, _ = check(XP_CFD, "B003")
    bound = {f["item_name"].split("(")[0].split()[-1]: f["evidence"]["bound"] for f in findings}
    # flux: SM 23% / memory 35%; time_step: memory 61% (DRAM); step_factor: 0.63 waves
    assert bound == {"cuda_compute_flux": "latency", "cuda_time_step": "memory", "cuda_compute_step_factor": "latency"}
    small = next(f for f in findings if "step_factor" in f["item_name"])
    assert "grid under one wave" in small["message"]


def _kineto_gemms(rel_path: str) -> list[dict]:
    """aten::mm/addmm/... calls with the kernels that carry their External id, from the JSON."""
    with gzip.open(shared_traces() / rel_path, "rt") as fh:
        trace = json.load(fh)
    ops, kernels = {}, defaultdict(list)
    for e in trace["traceEvents"]:
        args = e.get("args") or {}
        ext = args.get("External id")
        if e.get("cat") == "cpu_op" and e.get("name") in GEMM_OPS and ext is not None:
            ops[ext] = (e["name"], args.get("Input Dims"), args.get("Input type"))
        elif e.get("cat") == "kernel" and ext is not None:
            kernels[ext].append(e["dur"] * 1000)  # µs -> ns
    out = []
    for ext, (op, dims, types) in ops.items():
        if ext not in kernels:
            continue
        # by position: addmm/baddbmm(bias, mat1, mat2, ...), the others (mat1, mat2, ...)
        bias, a, b = (dims[0], dims[1], dims[2]) if op in ("aten::addmm", "aten::baddbmm") else ([], dims[0], dims[1])
        m, k, n = a[-2], a[-1], (b[-2] if op == "aten::linear" else b[-1])  # linear weights are [N, K]
        batch = math.prod(a[:-2])
        size = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4}[types[1 if bias else 0]]
        out.append({"op": op, "key": (op, json.dumps(a), json.dumps(b)), "dtype": types[1 if bias else 0],
                    "flops": 2 * batch * m * n * k + (batch * m * n if bias else 0), "ns": sum(kernels[ext]),
                    "bytes": (math.prod(a) + math.prod(b) + batch * m * n + (math.prod(bias) if bias else 0)) * size})
    return out, sum(d for ks in kernels.values() for d in ks)


def test_b003_kineto_gemm_estimates_h100(check):
    calls, _ = _kineto_gemms(QWEN)
    # "NVIDIA H100 80GB HBM3" (formats.md 5.3): 989.4 TFLOP/s dense BF16 tensor, 66.9 FP32, 3 350 GB/s
    peak = {"c10::BFloat16": 989.4e12, "float": 66.9e12}
    assert {c["dtype"] for c in calls} == set(peak)
    assert {c["op"] for c in calls} == {"aten::mm", "aten::addmm", "aten::bmm"}
    groups = defaultdict(lambda: {"flops": 0, "ns": 0, "bytes": 0, "n": 0})
    for c in calls:
        g = groups[c["key"]]
        g["peak"] = peak[c["dtype"]]
        g["flops"] += c["flops"]
        g["ns"] += c["ns"]
        g["bytes"] += c["bytes"]
        g["n"] += 1
    findings, status = check(QWEN, "B003")
    assert status == "ran" and findings
    assert all(f["evidence"]["estimate"] is True and f["evidence"]["source"] == "estimate" for f in findings)
    findings = [f for f in findings if f["evidence"]["family"] == "gemm"]  # attention: tests/test_b003_ops.py
    for f in findings:
        op, shape = f["evidence"]["op"], f["evidence"]["shape"].split(" + ")[0]
        a, b = [json.dumps([int(x) for x in s.strip("[]").split("x")]) for s in shape.split(" x ")]
        a, b = a.replace(" ", ""), b.replace(" ", "")
        g = next(v for (o, ga, gb), v in groups.items() if o == op and ga.replace(" ", "") == a and gb.replace(" ", "") == b)
        compute = g["flops"] / (g["ns"] / 1e9) / g["peak"]
        memory = g["bytes"] / (g["ns"] / 1e9) / 3350e9
        assert f["value"] == pytest.approx(max(compute, memory), rel=1e-6)
        assert f["evidence"]["calls"] == g["n"]
        # the side of the roof by intensity against the ridge; latency-bound only with a reason named
        side = "compute" if g["flops"] / g["bytes"] >= g["peak"] / 3350e9 else "memory"
        assert f["evidence"]["bound"] == side or (f["evidence"]["bound"] == "latency" and f["evidence"]["latency_reasons"])
    # the big MLP GEMMs run near the tensor roof, so the run has compute-bound GEMMs
    assert any(f["evidence"]["bound"] == "compute" for f in findings)


def _expected_sol(kernels: dict[str, dict]) -> dict[str, tuple[str, float]]:
    """name -> (verdict, share) of the kernels over 1% of the time, from duration-weighted SOL %."""
    total = sum(k["_dur"] for k in kernels.values())
    return {n: (sol_verdict(k["sm"], k["mem"]), max(k["sm"], k["mem"]) / 100)
            for n, k in kernels.items() if k["_dur"] / total >= 0.01}


def _check_sol_findings(findings: list[dict], expected: dict[str, tuple[str, float]]) -> None:
    got = {f["item_name"]: f for f in findings}
    assert set(got) == set(expected) and expected
    for name, (bound, share) in expected.items():
        assert got[name]["evidence"]["bound"] == bound and got[name]["evidence"]["source"] == "sol"
        assert got[name]["value"] == pytest.approx(share, rel=1e-9)


def test_b003_real_ncu_console_text(check):
    """B003 on a console text report: its verdicts from the Speed Of Light lines of the raw text."""
    rel = "ncu-text/cs599k__silu__triton__silu-pytorch-ncu-report.txt"
    launches, cur = [], None
    for line in (shared_traces() / rel).read_text().splitlines():
        if re.match(r"^  \S", line):  # a launch's header line: name (grid)x(block), Context ...
            cur = {"name": line.strip()}
            launches.append(cur)
        m = re.match(r"\s+(Memory Throughput|Compute \(SM\) Throughput|Duration)\s+(%|us)\s+([\d.,]+)$", line)
        if m and cur is not None:
            cur.setdefault(m.group(1), float(m.group(3).replace(",", "")))
    kernels: dict[str, dict] = defaultdict(lambda: {"_dur": 0.0, "sm": 0.0, "mem": 0.0})
    for launch in launches:
        k = kernels[re.sub(r" \(\d+, \d+, \d+\)x\(.*$", "", launch["name"])]
        d = launch["Duration"]
        k["_dur"] += d
        k["sm"] += launch["Compute (SM) Throughput"] * d
        k["mem"] += launch["Memory Throughput"] * d
    for k in kernels.values():
        k["sm"], k["mem"] = k["sm"] / k["_dur"], k["mem"] / k["_dur"]
    findings, status = check(rel, "B003")
    assert status == "ran" and len(findings) == 2
    expected = _expected_sol(kernels)
    # the report's names are NVIDIA's demangled ones cut short; match a finding by its start
    short = {next(n for n in expected if f["item_name"].startswith(n[:40])): f for f in findings}
    assert set(short) == set(expected)
    _check_sol_findings([{**f, "item_name": n} for n, f in short.items()], expected)


_REP_SOL_SQL = """
SELECT k.name, sum(k.duration_ns) AS dur,
       sum(m.sm * k.duration_ns) / sum(k.duration_ns) AS sm, sum(m.mem * k.duration_ns) / sum(k.duration_ns) AS mem
FROM kernel_durations k JOIN (
    SELECT kernel_id, max(value) FILTER (metric_id = 'sm__throughput.avg.pct_of_peak_sustained_elapsed') AS sm,
           max(value) FILTER (metric_id = 'gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed') AS mem
    FROM kernel_metrics WHERE run_id = $run_id GROUP BY kernel_id) m USING (kernel_id)
WHERE k.run_id = $run_id AND m.sm IS NOT NULL AND m.mem IS NOT NULL GROUP BY k.name
"""


@pytest.mark.parametrize("name", sorted(p.name for p in (SHARED_TRACES / "ncu-rep").glob("*.ncu-rep"))
                         or ["(no ../shared)"])
def test_b003_real_ncu_rep(check, name):
    """B003 on every real .ncu-rep: the reports whose launches carry both Speed Of Light shares get
    NVIDIA's verdict per kernel (from the stored shares, weighted by duration); the others no data."""
    rel = f"ncu-rep/{name}"
    findings, status = check(rel, "B003")
    rid = check.store.sql("SELECT run_id FROM runs WHERE file_name = ?", [name]).fetchone()[0]
    rows = check.store.sql(_REP_SOL_SQL, {"run_id": rid}).fetchall()
    if not rows:
        assert (findings, status) == ([], "no-data")
        return
    assert status == "ran"
    _check_sol_findings(findings, _expected_sol({n: {"_dur": d, "sm": sm, "mem": mem} for n, d, sm, mem in rows}))


@pytest.mark.parametrize("path", [B200_FLASH, POLY_MEM, POLY_STALL, "nsys/Rodinia_Gaussian__report2.sqlite",
                                  "torch/hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"])
def test_b003_no_data(check, path):
    assert check(path, "B003") == ([], "no-data")


# -- B004 ------------------------------------------------------------------------------------

def _limiter(k: dict) -> tuple[str, str]:
    """The decision order of B004, written out again from the CSV values."""
    sm, mem = k["SM [%]"], k["Memory [%]"]
    if max(sm, mem) >= 60:
        return "throughput", sol_verdict(sm, mem)
    if k["Waves Per SM"] < 1:
        return "latency", "small_grid"
    if k["Theoretical Occupancy"] < 80:
        return "occupancy", "theoretical"
    if k["Theoretical Occupancy"] - k["Achieved Occupancy"] > 10:
        return "occupancy", "achieved"
    if k.get("Issued Warp Per Scheduler", 1) < 0.6:
        return "latency", "stalls"
    return "latency", "unclear"


@pytest.mark.parametrize("path", [XP_CFD, XP_GAUSS, XP_HOTSPOT])
def test_b004_real_ncu_limiters(check, path):
    kernels = by_kernel(details(path))
    total = sum(k["_dur"] for k in kernels.values())
    hot = {n: k for n, k in kernels.items() if k["_dur"] / total >= 0.05}
    findings, status = check(path, "B004")
    assert status == "ran"
    got = {f["item_name"]: f for f in findings}
    assert set(got) == set(hot)
    for name, k in hot.items():
        f = got[name]
        assert (f["evidence"]["limiter"], f["evidence"]["cause"]) == _limiter(k)
        assert f["value"] == pytest.approx(max(k["SM [%]"], k["Memory [%]"]) / 100, rel=1e-9)
        assert f["evidence"]["waves"] == pytest.approx(k["Waves Per SM"])
    if path == XP_CFD:
        flux = next(f for f in findings if "compute_flux" in f["item_name"])
        # 58 registers x 192 threads: 5 blocks by registers, under the 10 by warps
        assert flux["evidence"]["limiter"] == "occupancy" and flux["evidence"]["occupancy_limiter"] == "registers"
        assert "cap registers" in flux["hint"] and flux["severity"] == "warning"
    if path == XP_GAUSS:
        assert {f["evidence"]["cause"] for f in findings} == {"small_grid"}


@pytest.mark.parametrize("path", [B200_FLASH, POLY_MEM, POLY_STALL])
def test_b004_no_data_without_sol(check, path):
    assert check(path, "B004") == ([], "no-data")


# -- I002 ------------------------------------------------------------------------------------

def test_i002_nsightful_uncoalesced_from_ncu_rule_message(check):
    rows = list(csv.DictReader((shared_traces() / NSIGHTFUL).read_text().splitlines()))
    [rule] = [r for r in rows if r["Rule Name"] == "UncoalescedGlobalAccess"]
    excess, total = map(int, re.search(r"total of (\d+) excessive sectors \(\d+% of the total (\d+) sectors",
                                       rule["Rule Description"]).groups())
    duration = next(float(r["Metric Value"].replace(",", "")) for r in rows if r["Metric Name"] == "Duration")
    findings, status = check(NSIGHTFUL, "I002")
    assert status == "ran"
    [f] = findings
    assert f["value"] == pytest.approx(excess / total) and excess / total == 0.75
    assert f["evidence"]["method"] == "ncu UncoalescedGlobalAccess message"
    # ncu's own estimate (74.14%) is used, as the file lacks the L2 cycle counters it is made from
    assert f["est_loss_ns"] == round(duration * float(rule["Estimated Speedup"]) / 100)


@pytest.mark.parametrize("path", [XP_CFD, POLY_MEM, B200_FLASH])
def test_i002_no_data(check, path):
    assert check(path, "I002") == ([], "no-data")


# -- I003 ------------------------------------------------------------------------------------

def _dram_weighted(rel_path: str) -> dict[str, dict]:
    """Hit rates per kernel weighted by DRAM bytes (read + write), and its DRAM bytes."""
    acc = defaultdict(lambda: defaultdict(float))
    for k in details(rel_path).values():
        m = k["m"]
        w = m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]
        a = acc[k["name"]]
        a["bytes"] += w
        for label in ("l1tex__t_sector_hit_rate.pct", "lts__t_sector_hit_rate.pct"):
            a[label] += m[label] * w
    return {n: {"bytes": a["bytes"], "l1": a["l1tex__t_sector_hit_rate.pct"] / a["bytes"],
                "l2": a["lts__t_sector_hit_rate.pct"] / a["bytes"]} for n, a in acc.items()}


@pytest.mark.parametrize("path", [POLY_MEM, POLY_NTT])
def test_i003_polyfhe_hit_rates_weighted_by_dram_bytes(check, path):
    kernels = _dram_weighted(path)
    total = sum(k["bytes"] for k in kernels.values())
    expected = {}
    for name, k in kernels.items():
        if k["bytes"] / total >= 0.05:  # no SOL in these files: heavy by DRAM share
            if k["l1"] < 20:
                expected[(name, "L1/TEX")] = k["l1"] / 100
            if k["l2"] < 50:
                expected[(name, "L2")] = k["l2"] / 100
    findings, status = check(path, "I003")
    assert status == "ran"
    got = {(f["item_name"], f["evidence"]["cache"]): f for f in findings}
    assert set(got) == set(expected) and expected
    for key, hit in expected.items():
        assert got[key]["value"] == pytest.approx(hit, rel=1e-9)
        assert got[key]["severity"] == "info"  # no SOL: never a warning
        assert "cold-cache" in got[key]["evidence"]["cold_cache_caveat"]
    if path == POLY_NTT:  # NTTPhase2 moves 3x the bytes of Phase1 at a 26% L2 hit rate; Phase1 is at 60%
        assert {n.split("(")[0] for n, _ in got} == {"NTTPhase2_general"}


def test_i003_xplacer_cfd_memory_heavy_kernel_only(check):
    kernels = details(XP_CFD)
    acc = defaultdict(lambda: defaultdict(float))
    for k in kernels.values():  # weight: DRAM bytes = Memory Throughput (byte/s) x Duration
        m = k["m"]
        w = m["Memory Throughput"] * m["Duration"] / 1e9
        a = acc[k["name"]]
        for label in ("L1 Hit Rate", "L2 Hit Rate", "Memory [%]"):
            a[label] += m[label] * w
        a["w"] += w
    expected = {}
    for name, a in acc.items():
        if a["Memory [%]"] / a["w"] >= 60:
            for cache, label, limit in (("L1/TEX", "L1 Hit Rate", 20), ("L2", "L2 Hit Rate", 50)):
                if a[label] / a["w"] < limit:
                    expected[(name, cache)] = a[label] / a["w"] / 100
    findings, _ = check(XP_CFD, "I003")
    got = {(f["item_name"], f["evidence"]["cache"]): f["value"] for f in findings}
    assert set(got) == set(expected) and len(expected) == 2  # cuda_time_step, both caches
    for key, v in expected.items():
        assert got[key] == pytest.approx(v, rel=1e-9)


def test_i003_nsightful_and_out_of_range_rates(check):
    findings, _ = check(NSIGHTFUL, "I003")
    assert {(f["evidence"]["cache"], round(f["value"], 6)) for f in findings} == {("L1/TEX", 0.0046), ("L2", 0.0458)}
    # gaussian: L2 hit rates up to 229.9% (tiny kernels) are dropped, and nothing there is memory-heavy
    rates = [k["m"]["L2 Hit Rate"] for k in details(XP_GAUSS).values()]
    assert max(rates) > 100
    assert check(XP_GAUSS, "I003") == ([], "ran")


@pytest.mark.parametrize("path", [B200_FLASH, POLY_STALL, "ncu/XPlacer__cfd__aws-v100__nsight_cfd_097K.log"])
def test_i003_no_data(check, path):
    assert check(path, "I003") == ([], "no-data")


# -- I004 / I005: no real export carries shared-memory or global-access width counters ----------

@pytest.mark.parametrize("rule", ["I004", "I005"])
@pytest.mark.parametrize("path", [XP_CFD, NSIGHTFUL, POLY_MEM, B200_FLASH])
def test_i004_i005_no_data_on_real_exports(check, rule, path):
    assert check(path, rule) == ([], "no-data")


# -- fixtures -------------------------------------------------------------------------------

def _generator():
    spec = importlib.util.spec_from_file_location("gen_bottleneck", FIXTURES / "gen_bottleneck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def test_fixtures_regenerate_byte_identical(tmp_path):
    for path in GEN.write_all(tmp_path):
        committed = FIXTURES / path.relative_to(tmp_path)
        assert path.read_bytes() == committed.read_bytes(), committed.name


@pytest.fixture(scope="module")
def fixture_findings(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("fx") / "s.duckdb")
    out = {}
    for rel in ("ncu/bottleneck_sol.csv", "ncu/bottleneck_memory.csv", "ncu/bottleneck_source.csv",
                "ncu/bottleneck_roofline.csv", "ncu/bottleneck_roofline_raw.csv", "kineto/bottleneck_gemm.json"):
        rid = store.ingest(FIXTURES / rel).run_id
        run_rules(store, [rid], Settings(select=list(MY_RULES)))
        rows = store.arrow("SELECT * FROM findings WHERE run_id = ?", [rid]).to_pylist()
        for r in rows:
            r["evidence"] = json.loads(r["evidence"])
            r["short"] = re.sub(r"^void ", "", r["item_name"]).split("(")[0].split("<")[0]
        out[rel.split("/")[1]] = rows
    yield out
    store.close()


def test_planted_sol_answers(fixture_findings):
    P = GEN.PLANTED["bottleneck_sol.csv"]
    rows = fixture_findings["bottleneck_sol.csv"]
    b003 = {r["short"]: r["evidence"]["bound"] for r in rows if r["rule_id"] == "B003"}
    b004 = {r["short"]: (r["evidence"]["limiter"], r["evidence"]["cause"]) for r in rows if r["rule_id"] == "B004"}
    assert b003 == P["b003"] and b004 == P["b004"]
    assert P["skipped"] not in b003
    reg = next(r for r in rows if r["rule_id"] == "B003" and r["short"] == "regheavy_stencil_kernel")
    assert reg["evidence"]["compute_pct"] == pytest.approx(P["regheavy_weighted_sm_pct"])
    assert reg["evidence"]["memory_pct"] == pytest.approx(P["regheavy_weighted_mem_pct"])
    i003 = sorted((r["short"], r["evidence"]["cache"], round(r["value"], 9)) for r in rows if r["rule_id"] == "I003")
    assert i003 == sorted((n, c, round(v, 9)) for n, c, v in P["i003"])


@pytest.mark.parametrize("name", ["bottleneck_roofline.csv", "bottleneck_roofline_raw.csv"])
def test_planted_roofline_answers(fixture_findings, name):
    P = GEN.PLANTED[name]
    rows = {r["short"]: r for r in fixture_findings[name] if r["rule_id"] == "B003"}
    kernels = {k: v for k, v in P.items() if isinstance(v, dict)}
    assert set(rows) == set(kernels)
    for kernel, fact in kernels.items():
        r = rows[kernel]
        fam = r["evidence"]["roof_family"]
        peak = P.get(f"peak_{fam}", P.get("peak_fp32"))
        compute = fact["flops"] / (fact["ns"] / 1e9) / peak
        memory = fact["bytes"] / (fact["ns"] / 1e9) / P["peak_bw"]
        assert r["evidence"]["bound"] == fact["bound"]
        assert r["value"] == pytest.approx(max(compute, memory), rel=1e-9)


def test_planted_memory_answers(fixture_findings):
    P = GEN.PLANTED["bottleneck_memory.csv"]
    rows = fixture_findings["bottleneck_memory.csv"]

    def got(rule, key):
        return sorted((r["short"], r["evidence"][key], round(r["value"], 9)) for r in rows if r["rule_id"] == rule)

    assert got("I002", "op") == sorted((n, o, round(v, 9)) for n, o, v in P["i002"])
    assert got("I003", "cache") == sorted((n, c, round(v, 9)) for n, c, v in P["i003"])
    assert got("I004", "op") == sorted((n, o, round(v, 9)) for n, o, v, _ in P["i004"])
    assert got("I005", "op") == sorted((n, o, round(v, 9)) for n, o, v in P["i005"])
    ways = {r["short"]: r["evidence"]["average_ways"] for r in rows if r["rule_id"] == "I004"}
    assert ways == {n: pytest.approx(w) for n, _, _, w in P["i004"]}
    src = fixture_findings["bottleneck_source.csv"]
    assert [(r["short"], r["evidence"]["op"], r["value"]) for r in src if r["rule_id"] == "I002"] == \
        [tuple(x) for x in GEN.PLANTED["bottleneck_source.csv"]["i002"]]


def test_planted_kineto_estimates(fixture_findings):
    P = GEN.PLANTED["bottleneck_gemm.json"]
    rows = {r["evidence"]["op"].split("::")[1]: r for r in fixture_findings["bottleneck_gemm.json"]
            if r["rule_id"] == "B003"}
    assert set(rows) == {"mm", "addmm", "bmm"}
    for op, r in rows.items():
        f = P[op]
        secs = f["ns"] / 1e9
        assert r["value"] == pytest.approx(max(f["flops"] / secs / f["peak"], f["bytes"] / secs / P["bw"]), rel=1e-9)
        assert r["evidence"]["dram_bytes"] == f["bytes"] and r["evidence"]["time_share"] == f["ns"] / P["total_ns"]


def test_b002_carveout_advice_only_below_the_largest():
    """B002's shared-memory fix raises the carveout only where the launches ran below the SM's
    largest (ncu's launch__shared_mem_config_size against the device's shared memory per SM)."""
    from types import SimpleNamespace

    from traceanalyzer.rules.B002_low_occupancy import _LIMITER_HINT, _carveout_hint

    nan = float("nan")
    assert _carveout_hint(SimpleNamespace(shared_mem_config_bytes=65536.0, shared_mem_per_sm_bytes=102400.0)) \
        == _LIMITER_HINT["shared_mem"]
    assert _carveout_hint(SimpleNamespace(shared_mem_config_bytes=nan, shared_mem_per_sm_bytes=102400.0)) \
        == _LIMITER_HINT["shared_mem"]  # a timeline: the driver's carveout is unknown
    at_most = _carveout_hint(SimpleNamespace(shared_mem_config_bytes=102400.0, shared_mem_per_sm_bytes=102400.0))
    assert "raise the carveout" not in at_most and "already the SM's largest" in at_most
