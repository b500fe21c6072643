"""B005 tensor cores unused: FP32 GEMMs and convolutions on CUDA cores of a GPU that has tensor cores."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Optional

import msgspec

from ..devices import gpu
from ..fmt import kernel_label, loss_bound, ns, pct
from .base import Rule, Threshold
from .evidence import Evidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

# Library GEMM and convolution kernels whose math is FP32 FMA on the CUDA cores (SIMT), in the
# names cuBLAS, cuDNN and CUTLASS give them (matched on the lower-cased name):
#   sgemm     cuBLAS `ampere_sgemm_128x64_nn`, `volta_sgemm_*`, `maxwell_sgemm_*`, `sgemm_largek_*`;
#             CUTLASS `cutlass_80_simt_sgemm_*`; cuDNN `implicit_convolve_sgemm`, `explicit_convolve_sgemm`.
#             A tensor-core GEMM names its instruction shape instead (`s1688gemm`, `h884gemm`, `s16816gemm`).
#   scudnn    cuDNN `volta_scudnn_128x64_relu_*`, `cudnn_ampere_scudnn_*` (the tensor-core ones are
#             `*_s884cudnn_*`, `*_h1688cudnn_*`).
#   xmma ffma cuBLAS/cuDNN xmma kernels name their math instruction: `sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_*`
#             is FFMA; the tensor-core ones say `tensor16x8x8`, `hgmma64x128x8`, `tf32`.
#   <float>   cuDNN's template engines `cudnn::detail::dgrad_engine<float, ...>`, `wgrad_alg0_engine<float, ...>`.
# GEMVs (`gemv2T_kernel`, `gemmSN_*`, `gemmk1_*`) are left out: a matrix-vector product is bound by
# memory, which tensor cores do not make faster.
SIMT_FP32 = r"(^|[^a-z0-9])sgemm|(^|[^a-z0-9])scudnn|xmma.*[^a-z]ffma([^a-z]|$)|(dgrad|wgrad)[a-z0-9_]*(engine|alg[0-9_]*)<float"
# Names that say tensor cores or a 16-bit type: never counted, whatever else they contain.
TENSOR_OR_HALF = (r"tensorop|tensor[0-9]|[hi]?gmma|hmma|wmma|tf32|xf32|[a-z][0-9]{3,5}(gemm|cudnn)|bf16|fp16|f16|half|"
                  r"e4m3|e5m2|int8|i8i8|i8i32")
# Convolutions (the rest are GEMMs): cuDNN's kernels, and the names of convolution algorithms.
CONV = r"cudnn|convolve|fprop|dgrad|wgrad|winograd"
LIBRARIES = ("cublas", "cudnn", "cutlass")
# The message names the largest few kernels, each cut to a readable length.
MESSAGE_KERNELS = 3
MESSAGE_NAME_CHARS = 72

# The architecture a kernel was built for, from its name: the device runs at least that. Used
# where the trace does not give the device's compute capability.
_ARCH_TAG = re.compile(r"(?:^|[^a-z0-9])(?:sm_?(\d{2,3})_|cutlass_(\d{2,3})_|(volta|turing|ampere|ada|hopper|blackwell)_)")
_ARCH_CC = {"volta": 70, "turing": 75, "ampere": 80, "ada": 89, "hopper": 90, "blackwell": 100}

SQL = f"""
WITH simt_names AS MATERIALIZED (  -- the patterns matched once per distinct name
    SELECT name FROM this_run.kernel_names
    WHERE regexp_matches(lower(name), '{SIMT_FP32}')
      AND NOT regexp_matches(lower(name), '{TENSOR_OR_HALF}')
), timed AS (
    SELECT device_id, name, short_name, library, kernel_id, start_ns, end_ns, end_ns - start_ns AS dur
    FROM kernels WHERE run_id = $run_id AND start_ns IS NOT NULL AND end_ns >= start_ns
), per_device AS (
    SELECT device_id, sum(dur) AS kernel_ns FROM timed GROUP BY device_id
)
SELECT t.device_id, t.name, any_value(coalesce(t.short_name, t.name)) AS short_name,
       any_value(t.library) AS library, count(*) AS launches, sum(t.dur) AS total_ns,
       arg_min(t.kernel_id, t.start_ns) AS first_id, min(t.start_ns) AS first_start_ns,
       max(t.end_ns) AS last_end_ns, any_value(d.kernel_ns) AS device_kernel_ns,
       regexp_matches(lower(t.name), '{CONV}') AS conv
FROM timed t JOIN simt_names USING (name) JOIN per_device d USING (device_id)
WHERE t.library IN {LIBRARIES}
GROUP BY t.device_id, t.name
ORDER BY t.device_id, total_ns DESC, t.name
"""

DEVICES_SQL = """
SELECT device_id, name, vendor, compute_major, compute_minor FROM devices WHERE run_id = $run_id
"""

# The highest architecture tag among a device's kernel names (only for devices the trace gives no
# compute capability for).
TAGGED_SQL = f"""
WITH tagged AS MATERIALIZED (
    SELECT name FROM this_run.kernel_names
    WHERE regexp_matches(lower(name), '{_ARCH_TAG.pattern}')
)
SELECT DISTINCT k.device_id, k.name FROM kernels k JOIN tagged USING (name)
WHERE k.run_id = $run_id AND list_contains($devices, k.device_id)
"""


def arch_of(name: str) -> int | None:
    """The compute capability (major x 10 + minor) a kernel name says it was built for."""
    tags = []
    for sm, cutlass, family in _ARCH_TAG.findall(name.lower()):
        tags.append(int(sm or cutlass) if (sm or cutlass) else _ARCH_CC[family])
    return max(tags, default=None)


def _capabilities(store, run_id: str, device_ids: list[int]) -> dict[int, dict]:
    """Per device: its compute capability (x 10), where it comes from, its name and product."""
    rows = {int(r.device_id): r for r in store.sql(DEVICES_SQL, {"run_id": run_id}).df().itertuples()}
    out: dict[int, dict] = {}
    unknown = []
    for d in device_ids:
        r = rows.get(d)
        name = r.name if r is not None and isinstance(r.name, str) else None
        info = {"name": name, "product": gpu.product(name),
                "vendor": r.vendor if r is not None and _known(r.vendor) else None}
        if r is not None and _known(r.compute_major):
            minor = int(r.compute_minor) if _known(r.compute_minor) else 0
            info.update(cc=int(r.compute_major) * 10 + minor, cc_source="device")
        elif info["product"] is not None and info["product"].cc is not None:
            major, minor = info["product"].cc
            info.update(cc=major * 10 + minor, cc_source="product table")
        else:
            info.update(cc=None, cc_source=None)
            unknown.append(d)
        out[d] = info
    if unknown:
        tagged = store.sql(TAGGED_SQL, {"run_id": run_id, "devices": unknown}).fetchall()
        for d, name in tagged:
            cc = arch_of(name)
            if cc is not None and (out[d]["cc"] is None or cc > out[d]["cc"]):
                out[d].update(cc=cc, cc_source="kernel names (at least)")
    return out


def _known(x) -> bool:
    import pandas as pd

    return x is not None and not pd.isna(x)


def _speedup(info: dict, p: dict) -> tuple[float, str]:
    """The assumed speedup of these kernels on tensor cores, and what it rests on: the threshold,
    capped by the product's own ratio of tensor-core to FP32 CUDA-core peak where the table has it
    (GeForce cards halve tensor throughput with FP32 accumulate: an RTX 4090's TF32 peak is its
    FP32 peak)."""
    s = float(p["assumed_speedup_ratio"])
    basis = f"assumed {s:g}x (threshold assumed_speedup_ratio)"
    prod = info["product"]
    if prod is None or not prod.fp32_flops_per_s:
        return s, basis
    peaks = ([prod.tf32_tensor_flops_per_s, prod.bf16_tensor_flops_per_s, prod.fp16_tensor_flops_per_s]
             if info["cc"] >= 80 else [prod.fp16_tensor_flops_per_s])
    best = max((x for x in peaks if x), default=None)
    if best is None:
        return s, basis
    ratio = best / prod.fp32_flops_per_s
    if ratio < s:
        return max(ratio, 1.0), (f"{prod.name}'s tensor-core peak is {ratio:.2g}x its FP32 CUDA-core peak "
                                 f"(product table), under the assumed {s:g}x")
    return s, basis + f"; {prod.name}'s tensor-core peak is {ratio:.2g}x its FP32 peak"


def _hint(cc: int, gemm: bool, conv: bool) -> str:
    if cc >= 80:
        parts = []
        if gemm:
            parts.append("for the GEMMs set torch.backends.cuda.matmul.allow_tf32 = True (or "
                         "torch.set_float32_matmul_precision('high')): FP32 matmuls then run on TF32 tensor cores")
        if conv:
            parts.append("for the convolutions keep torch.backends.cudnn.allow_tf32 = True (PyTorch's default: check "
                         "nothing turns it off) and set torch.backends.cudnn.benchmark = True so cuDNN can pick a "
                         "tensor-core algorithm")
        text = "; ".join(parts)
        return (text[0].upper() + text[1:] + ". Or run the model under torch.autocast('cuda', dtype=torch.bfloat16) "
                "(tensor cores at twice TF32's rate). TF32 keeps FP32's range with a 10-bit mantissa: check the "
                "accuracy you need.")
    return ("This GPU has FP16 tensor cores but no TF32 or BF16 ones: run the model under "
            "torch.autocast('cuda', dtype=torch.float16), with torch.cuda.amp.GradScaler when training, and keep "
            "the matrix dimensions (and channel counts) multiples of 8.")


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    k = store.sql(SQL, {"run_id": run_id}).df()
    if k.empty:
        return pd.DataFrame()
    caps = _capabilities(store, run_id, sorted({int(d) for d in k["device_id"].dropna()}))
    rows = []
    for device, part in k.groupby("device_id", sort=True):
        info = caps[int(device)]
        # Tensor cores came with Volta (7.0); AMD's matrix cores are not judged here.
        if info["cc"] is None or info["cc"] < 70 or info["vendor"] == "amd":
            continue
        simt_ns = float(part["total_ns"].sum())
        kernel_ns = float(part["device_kernel_ns"].iloc[0])
        share = simt_ns / kernel_ns if kernel_ns > 0 else 0.0
        if share < p["min_share"] or simt_ns < p["min_kernel_ns"] or simt_ns <= 0:
            continue
        speedup, basis = _speedup(info, p)
        loss = simt_ns * (1 - 1 / speedup)
        conv_ns = float(part.loc[part["conv"], "total_ns"].sum())
        gemm_ns = simt_ns - conv_ns
        cc = info["cc"]
        dtypes = ["tf32", "bf16"] if cc >= 80 else ["fp16"]
        listed = part.head(int(p["max_examples"]))
        named = ", ".join(f"{_short(kernel_label(r.name, r.short_name))} {pct(r.total_ns / kernel_ns)}"
                          for r in part.head(MESSAGE_KERNELS).itertuples())
        more = len(part) - min(len(part), MESSAGE_KERNELS)
        arch = (f"sm_{cc} or later, from its kernel names" if info["cc_source"] == "kernel names (at least)"
                else f"sm_{cc}")
        device_text = f"device {int(device)} ({info['name'] + ', ' if info['name'] else ''}{arch})"
        message = (f"{device_text}: {pct(share)} of kernel time ({ns(simt_ns)} of {ns(kernel_ns)}) is FP32 "
                   f"{_what(gemm_ns, conv_ns)} on CUDA cores (SIMT), not on the tensor cores this GPU has"
                   + (f": {named}" if named else "") + (f" and {more} more" if more > 0 else "")
                   + f"; on {'TF32/BF16' if cc >= 80 else 'FP16'} tensor cores an estimated {ns(loss)} less "
                   f"(at an assumed {speedup:.2g}x speedup); {loss_bound(simt_ns, 'those kernels ran')}")
        rows.append({
            # a finding over several kernels is the device's: named by a kernel, the diagnosis would
            # bound its loss by that one kernel's time
            "device_id": int(device), "item_kind": "device", "item_id": int(device),
            "item_name": "FP32 SIMT GEMM/convolution kernels",
            "start_ns": int(part["first_start_ns"].min()), "end_ns": int(part["last_end_ns"].max()),
            "value": share, "value_unit": "share", "threshold": p["min_share"],
            "est_loss_ns": int(round(loss)),
            "severity": "warning" if share >= p["warning_share"] else "info",
            "message": message,
            "hint": _hint(cc, gemm_ns > 0, conv_ns > 0),
            "evidence": {"share": share, "simt_ns": int(simt_ns), "kernel_ns": int(kernel_ns),
                         "gemm_ns": int(gemm_ns), "conv_ns": int(conv_ns),
                         "compute_capability": f"{cc // 10}.{cc % 10}", "compute_capability_source": info["cc_source"],
                         "device_name": info["name"], "tensor_dtypes": dtypes,
                         "speedup": speedup, "speedup_basis": basis,
                         "estimate": "simt_ns x (1 - 1 / speedup)",
                         "kernel_names": len(part),
                         "kernels": [{"name": kernel_label(r.name, r.short_name), "full_name": r.name,
                                      "library": r.library, "kind": "conv" if r.conv else "gemm",
                                      "launches": int(r.launches), "total_ns": int(r.total_ns),
                                      "share": r.total_ns / kernel_ns, "first_kernel_id": int(r.first_id)}
                                     for r in listed.itertuples()]},
        })
    return pd.DataFrame(rows)


def _short(label: str) -> str:
    """An xmma kernel's name runs to 120 characters: its start (architecture, types, layout, tile)
    says which it is; the evidence keeps the whole name."""
    return label if len(label) <= MESSAGE_NAME_CHARS else label[:MESSAGE_NAME_CHARS - 3] + "..."


def _what(gemm_ns: float, conv_ns: float) -> str:
    if gemm_ns > 0 and conv_ns > 0:
        return "GEMMs and convolutions"
    return "convolutions" if conv_ns > 0 else "GEMMs"


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class B005Kernel(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    first_kernel_id: Annotated[int, doc("id of the kernel's first launch")]
    full_name: Annotated[str, doc("the kernel's full name")]
    kind: Annotated[str, doc("`gemm` or `conv`")]
    launches: Annotated[int, doc("launches")]
    library: Annotated[str, doc("the library the kernel comes from")]
    name: Annotated[str, doc("name")]
    share: Annotated[float, doc("its share of the device's kernel time")]
    total_ns: Annotated[int, doc("its time, all launches")]


class B005Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    compute_capability: Annotated[str, doc("the device's compute capability")]
    compute_capability_source: Annotated[str, doc("where the compute capability was read from")]
    conv_ns: Annotated[int, doc("time of convolution kernels not on tensor cores")]
    device_name: Annotated[Optional[str], doc("the device's name")]
    estimate: Annotated[str, doc("how the loss is estimated (a formula)")]
    gemm_ns: Annotated[int, doc("time of matmul kernels")]
    kernel_names: Annotated[int, doc("distinct kernel names")]
    kernel_ns: Annotated[int, doc("the device's kernel time")]
    kernels: Annotated[list[B005Kernel], doc("the matmul and convolution kernels not on tensor cores, longest first")]
    share: Annotated[float, doc("share of kernel time in matmul and convolution kernels off the tensor cores")]
    simt_ns: Annotated[int, doc("time of matmul/conv kernels on SIMT units")]
    speedup: Annotated[float, doc("estimated speedup on tensor cores")]
    speedup_basis: Annotated[str, doc("what the speedup estimate rests on")]
    tensor_dtypes: Annotated[list[str], doc("data types of the operators' tensors")]


RULE = Rule(
    id="B005",
    evidence=B005Evidence,
    name="tensor-cores-unused",
    title="FP32 GEMMs and convolutions on CUDA cores, tensor cores unused",
    phase="bottleneck",
    claims="compute",
    severity="warning",
    max_severity="warning",
    severity_reason="its estimated loss assumes a speedup on tensor cores (assumed_speedup_ratio): "
                    "a what-if saving, not time measured lost",
    what="Devices with tensor cores (NVIDIA Volta and later) that spend a large share of their kernel time "
         "in library GEMM and convolution kernels doing FP32 math on the CUDA cores (SIMT): `ampere_sgemm_*`, "
         "`volta_scudnn_*`, `implicit_convolve_sgemm`, `sm80_xmma_gemm_..._ffma_*`.",
    why="A tensor core multiplies small matrix tiles per instruction: an A100 does 156 TFLOP/s in TF32 and "
        "312 in BF16 against 19.5 in FP32 on its CUDA cores, an H100 SXM 495 / 989 against 67, a V100 125 in "
        "FP16 against 15.7. FP32 tensors run on the CUDA cores unless TF32 is allowed (PyTorch leaves it off "
        "for matmuls by default since 1.12, on for cuDNN convolutions) or the model runs in a 16-bit type, so an FP32 model can leave most of the GPU's "
        "matrix throughput unused while its GEMMs take most of the time.",
    how="Kernels count when `kernels.library` is cuBLAS, cuDNN or CUTLASS and the lower-cased name matches "
        f"`{SIMT_FP32}` (cuBLAS/CUTLASS/cuDNN FP32 SIMT GEMMs, cuDNN's single-precision `scudnn` kernels, xmma "
        "kernels whose math instruction is `ffma`, cuDNN's `<float>` gradient engines) and not "
        f"`{TENSOR_OR_HALF}` (tensor-core instruction shapes, TF32, 16-bit and 8-bit types). Matrix-vector "
        "kernels (gemv, gemmSN, gemmk1) are memory-bound and left out, as are the data transforms of cuDNN's "
        "non-fused Winograd (`winogradWgradData4x4<float, float>`): not matrix math. A device has tensor cores when its "
        "compute capability (the `devices` table, else the product table by name, else the highest "
        "architecture named by its kernels: `sm80_`, `ampere_`, `cutlass_80_`, a lower bound) is 7.0 or more; "
        "AMD devices are not judged. Per device, the share is these kernels' time over all kernel time; it "
        "is reported at `min_share` and at least `min_kernel_ns`, as a warning from `warning_share`. The "
        "estimated loss is their time x (1 - 1 / s), s being `assumed_speedup_ratio` capped by the product's "
        "tensor-core to FP32 CUDA-core peak ratio where the product table has both (TF32/BF16/FP16 from "
        "compute capability 8.0, FP16 below): an estimate, since a GEMM's real speedup depends on its shape "
        "and on how memory-bound it is. The hint names the switch by compute capability: TF32 "
        "(`torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`) or BF16 autocast from "
        "8.0, FP16 autocast with a GradScaler on 7.x.",
    fix="Allow TF32 for FP32 matmuls and convolutions (torch.set_float32_matmul_precision('high')), or run "
        "under torch.autocast with bfloat16 (float16 with a GradScaler on Volta and Turing).",
    requires="timed kernels with names, and the device's compute capability (or kernel names that tell the architecture)",
    applies_sql="SELECT EXISTS (SELECT 1 FROM kernels WHERE run_id = $run_id AND start_ns IS NOT NULL "
                "AND library IN ('cublas', 'cudnn', 'cutlass'))",
    thresholds=(
        Threshold("min_share", 0.1, "Report a device whose FP32 SIMT GEMM/convolution kernels take at least this share of its kernel time."),
        Threshold("min_kernel_ns", 1000000, "Report a device only when these kernels take at least this much time (1 ms): less is not worth a dtype change."),
        Threshold("warning_share", 0.3, "Share that makes a warning (below: info)."),
        Threshold("assumed_speedup_ratio", 2.0, "How much faster these kernels are assumed to run on tensor cores (capped by the product's tensor-core to FP32 peak ratio).", low=1),
        Threshold("max_examples", 5, "How many kernels the evidence lists (the message names the largest three)."),
    ),
    evaluate=evaluate,
    references=(
        "NVIDIA Deep Learning Performance Guide: 'Tensor Core Requirements' and 'Matrix Multiplication Background'",
        "PyTorch docs: 'TensorFloat-32 (TF32) on Ampere (and later) devices' (torch.backends.cuda.matmul.allow_tf32, "
        "torch.backends.cudnn.allow_tf32, torch.set_float32_matmul_precision)",
        "PyTorch docs: 'Automatic Mixed Precision' (torch.autocast, torch.cuda.amp.GradScaler)",
        "NVIDIA A100 / H100 / V100 whitepapers: FP32, TF32 and FP16/BF16 tensor-core peaks (devices/gpu.py)",
    ),
)
