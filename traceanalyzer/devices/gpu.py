"""GPU facts for offline use: per-compute-capability limits, a product table, name matching.

Two tables, used only where a trace does not say the value itself (``fill_device``):

* ``CC_LIMITS`` - architectural limits per compute capability, the inputs of the occupancy
  calculator. Sources: CUDA Programming Guide "Compute Capabilities" tables 30-32 (CC 7.5 -
  12.x, carveout steps included), the V100 whitepaper for 7.0, and the allocation rules of
  NVIDIA's ``cuda_occupancy.h`` (register unit 256 per warp, shared-memory unit 256 B before
  CC 8.0 and 128 B from it, 4 sub-partitions except GP100's 2, 1 KB driver-reserved shared
  memory per block from CC 8.0). Every value for 7.5/8.0/8.6/8.9/9.0 also matches real
  ``TARGET_INFO_GPU`` rows, and 10.0 matches a real ncu raw export (B200).
* ``PRODUCTS`` - per-product peaks (vendor "up to" numbers at boost clock, dense, no
  sparsity). Each entry carries its confidence ('V' verified against a real trace or a
  first-hand vendor table, 'P' probable, 'U' uncertain) and a source note; the matrix peaks
  by input type (FP8, TF32, FP32 and FP64 matrix units) have a source note of their own.
  Vendors print tensor peaks "with sparsity" on some sheets: those are halved here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

KiB = 1024
TB = 1e12
GB = 1e9


@dataclass(frozen=True)
class CCLimits:
    """Limits of one compute capability; sizes in bytes, counts per SM unless named."""

    major: int
    minor: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    shared_mem_per_sm_bytes: int  # largest carveout
    max_shared_mem_per_block_optin_bytes: int
    carveout_steps_bytes: tuple[int, ...]  # shared-memory sizes the L1/shared split can take
    reserved_shared_mem_per_block_bytes: int  # driver's share of every block (CC >= 8.0)
    shared_mem_alloc_unit_bytes: int  # a block's shared memory is rounded up to this
    sub_partitions: int = 4  # registers are split evenly over the SM's warp schedulers
    warp_alloc_granularity: int = 4  # warps/block rounded up to this for the per-block register check
    registers_per_sm: int = 64 * KiB
    max_registers_per_block: int = 64 * KiB
    max_registers_per_thread: int = 255
    register_alloc_unit: int = 256  # registers are given to a warp in units of this many
    max_shared_mem_per_block_bytes: int = 48 * KiB  # without the opt-in attribute
    max_threads_per_block: int = 1024
    warp_size: int = 32
    confidence: str = "V"

    @property
    def max_threads_per_sm(self) -> int:
        return self.max_warps_per_sm * self.warp_size

    @property
    def cc(self) -> tuple[int, int]:
        return (self.major, self.minor)


def _steps(*kib: int) -> tuple[int, ...]:
    return tuple(k * KiB for k in kib)


_STEPS_VOLTA = _steps(0, 8, 16, 32, 64, 96)
_STEPS_TURING = _steps(32, 64)
_STEPS_164 = _steps(0, 8, 16, 32, 64, 100, 132, 164)
_STEPS_100 = _steps(0, 8, 16, 32, 64, 100)
_STEPS_228 = _steps(0, 8, 16, 32, 64, 100, 132, 164, 196, 228)


def _pre_ampere(major, minor, warps, blocks, smem_kib, optin_kib, steps, **kw) -> CCLimits:
    return CCLimits(major, minor, warps, blocks, smem_kib * KiB, optin_kib * KiB, steps,
                    reserved_shared_mem_per_block_bytes=0, shared_mem_alloc_unit_bytes=256, **kw)


def _ampere_plus(major, minor, warps, blocks, smem_kib, steps, **kw) -> CCLimits:
    # From CC 8.0 the opt-in per-block maximum is the SM's shared memory less the 1 KB the
    # driver reserves per block (164 -> 163 KB, 100 -> 99, 228 -> 227).
    return CCLimits(major, minor, warps, blocks, smem_kib * KiB, (smem_kib - 1) * KiB, steps,
                    reserved_shared_mem_per_block_bytes=KiB, shared_mem_alloc_unit_bytes=128, **kw)


CC_LIMITS: dict[tuple[int, int], CCLimits] = {
    c.cc: c
    for c in (
        # Pascal: dedicated shared memory (no carveout); GP100 has 2 sub-partitions. [P, cuda_occupancy.h]
        _pre_ampere(6, 0, 64, 32, 64, 48, _steps(64), sub_partitions=2, warp_alloc_granularity=2, confidence="P"),
        _pre_ampere(6, 1, 64, 32, 96, 48, _steps(96), confidence="P"),
        _pre_ampere(6, 2, 64, 32, 64, 48, _steps(64), confidence="P"),
        # Volta (V100, Xavier): carveout 0..96 KB [V: Kineto V100 deviceProperties, XPlacer ncu logs].
        _pre_ampere(7, 0, 64, 32, 96, 96, _STEPS_VOLTA),
        _pre_ampere(7, 2, 64, 32, 96, 96, _STEPS_VOLTA, confidence="P"),
        # Turing: 32 or 64 KB only.
        _pre_ampere(7, 5, 32, 16, 64, 64, _STEPS_TURING),
        _ampere_plus(8, 0, 64, 32, 164, _STEPS_164),
        _ampere_plus(8, 6, 48, 16, 100, _STEPS_100),
        _ampere_plus(8, 7, 48, 16, 164, _STEPS_164),
        _ampere_plus(8, 9, 48, 24, 100, _STEPS_100),
        _ampere_plus(9, 0, 64, 32, 228, _STEPS_228),
        _ampere_plus(10, 0, 64, 32, 228, _STEPS_228),
        _ampere_plus(10, 3, 64, 32, 228, _STEPS_228, confidence="P"),
        # CC 11.0 (Thor; 10.1 before CUDA 13) and 12.x (RTX 50xx, DGX Spark): guide tables. [P]
        _ampere_plus(11, 0, 48, 24, 228, _STEPS_228, confidence="P"),
        _ampere_plus(12, 0, 48, 24, 100, _STEPS_100, confidence="P"),
        _ampere_plus(12, 1, 48, 24, 100, _STEPS_100, confidence="P"),
    )
}


def cc_limits(major: int | None, minor: int | None) -> CCLimits | None:
    """Limits of an NVIDIA compute capability, or None when the table does not know it."""
    if major is None or minor is None:
        return None
    return CC_LIMITS.get((int(major), int(minor)))


# ---------------------------------------------------------------------------------------
# Products


@dataclass(frozen=True)
class GpuProduct:
    """Headline numbers of one product; FLOP/s are dense peaks at boost clock."""

    key: str  # normalized name it is matched by (see ``normalize_name``)
    name: str
    vendor: str  # 'nvidia' or 'amd'
    cc: tuple[int, int] | None  # NVIDIA compute capability; None for AMD
    sm_count: int  # SMs (CUs on AMD)
    memory_bytes: int | None
    dram_bandwidth_bytes_per_s: float
    l2_cache_bytes: int | None
    fp32_flops_per_s: float | None
    fp16_tensor_flops_per_s: float | None  # FP16 in, FP32 accumulate where products differ
    bf16_tensor_flops_per_s: float | None
    fp64_flops_per_s: float | None
    confidence: str  # 'V', 'P' or 'U' (see module doc)
    source: str
    aliases: tuple[str, ...] = field(default=())
    # Dense matrix-unit peaks by input type; None where the product lacks the unit or the
    # number is not known to a source.
    fp8_tensor_flops_per_s: float | None = None
    tf32_tensor_flops_per_s: float | None = None
    fp32_matrix_flops_per_s: float | None = None  # AMD CDNA matrix cores at FP32 (NVIDIA: none)
    fp64_matrix_flops_per_s: float | None = None  # FP64 tensor / matrix cores
    peaks_source: str = ""  # where the four numbers above come from

    def matmul_peak(self, roof: str) -> tuple[float | None, str, str]:
        """(dense peak FLOP/s, unit, source) a matrix multiply with inputs of type `roof` ('fp8',
        'fp16', 'bf16', 'tf32', 'fp32', 'fp64') is judged against: the tensor (NVIDIA) or matrix
        (AMD) unit of that type; FP32 and FP64 on matrix units where the product has them, else
        on the vector units (CUDA cores). The peak is None where the product has no such unit."""
        unit = "matrix-core" if self.vendor == "amd" else "tensor-core"
        vector = "vector" if self.vendor == "amd" else "CUDA-core"
        if roof in ("fp32", "fp64"):
            matrix = self.fp32_matrix_flops_per_s if roof == "fp32" else self.fp64_matrix_flops_per_s
            if matrix:
                return matrix, f"{roof.upper()} {unit}", self.peaks_source
            if roof == "fp32":
                return self.fp32_flops_per_s, f"FP32 {vector}", self.source
            return self.fp64_flops_per_s, f"FP64 {vector}", self.source
        if roof in ("fp8", "tf32"):
            peak = self.fp8_tensor_flops_per_s if roof == "fp8" else self.tf32_tensor_flops_per_s
            return peak, f"{roof.upper()} {unit}", self.peaks_source
        peak = {"fp16": self.fp16_tensor_flops_per_s, "bf16": self.bf16_tensor_flops_per_s}.get(roof)
        return peak, f"{roof.upper()} {unit}", self.source


def _p(key, name, vendor, cc, sms, mem_gb, bw_gbs, l2_mib, fp32_tf, fp16_tf, bf16_tf, fp64_tf,
       conf, source, aliases=(), fp8=None, tf32=None, fp32_matrix=None, fp64_matrix=None,
       peaks_source="") -> GpuProduct:
    tf = lambda v: None if v is None else v * TB  # noqa: E731
    return GpuProduct(
        key=key, name=name, vendor=vendor, cc=cc, sm_count=sms,
        memory_bytes=None if mem_gb is None else int(mem_gb * 1024**3),
        dram_bandwidth_bytes_per_s=bw_gbs * GB,
        l2_cache_bytes=None if l2_mib is None else int(l2_mib * 1024**2),
        fp32_flops_per_s=tf(fp32_tf), fp16_tensor_flops_per_s=tf(fp16_tf),
        bf16_tensor_flops_per_s=tf(bf16_tf), fp64_flops_per_s=tf(fp64_tf),
        confidence=conf, source=source, aliases=tuple(aliases),
        fp8_tensor_flops_per_s=tf(fp8), tf32_tensor_flops_per_s=tf(tf32),
        fp32_matrix_flops_per_s=tf(fp32_matrix), fp64_matrix_flops_per_s=tf(fp64_matrix), peaks_source=peaks_source,
    )


# Sources: formats.md 5.3 [S16, S21-S28]; "R-nsys" = the real TARGET_INFO_GPU row of that
# product in shared/traces/nsys (SM count, memoryBandwidth, l2CacheSize); "R-kineto" =
# deviceProperties of a real Kineto trace; "R-ncu" = a real ncu raw export. Third-party
# spec pages found with the search tool are named where they supplied a number.
# Matrix peaks by input type (the `peaks_source` of the products that use them).
_A100_PEAKS = dict(tf32=156, fp64_matrix=19.5, peaks_source=(
    "TF32 156 and FP64 tensor 19.5 TF dense: NVIDIA A100 whitepaper table (formats.md 5.3 TF32 column [S22]; "
    "forums.developer.nvidia.com/t/218102 quotes the table)"))
_H100_SXM_PEAKS = dict(fp8=1978.9, tf32=494.7, fp64_matrix=66.9, peaks_source=(
    "glennklockwood.com/garden/processors/h100 theoretical table [S23]: FP8 1978.9, TF32 494.7, "
    "FP64 matrix 66.9 TF dense"))
_CDNA2_PEAKS_NOTE = ("ROCm docs 'AMD Instinct MI250 microarchitecture' peak table, FLOPS/clock/CU: vector FP32 128, "
                     "matrix FP32 256, matrix FP16/BF16 1024, matrix FP64 256; x CUs x 1.7 GHz; no FP8 or TF32 units")

_PRODUCTS: tuple[GpuProduct, ...] = (
    # --- Volta (CC 7.0) ---
    _p("v100 sxm2", "Tesla V100-SXM2", "nvidia", (7, 0), 80, 32, 900, 6, 15.7, 125, None, 7.8, "P",
       "formats.md 5.3 [S16,S21]; R-kineto V100-SXM2-32GB: 80 SMs", aliases=("v100",)),
    _p("v100 pcie", "Tesla V100-PCIE", "nvidia", (7, 0), 80, 32, 900, 6, 14.0, 112, None, 7.0, "P",
       "formats.md 5.3 (datasheet from memory)"),
    _p("v100 dgxs", "Tesla V100-DGXS", "nvidia", (7, 0), 80, 32, 900, 6, 15.7, 125, None, 7.8, "U",
       "DGX Station V100 assumed SXM2-class; R-kineto V100-DGXS-32GB: 80 SMs"),
    # --- Turing (CC 7.5) ---
    _p("t4", "Tesla T4", "nvidia", (7, 5), 40, 16, 320, 4, 8.1, 65, None, 0.25, "V",
       "R-nsys T4: 40 SMs, 320.064 GB/s, 4 MiB L2; 8.1 TF FP32 / 65 TF FP16 mixed: NVIDIA launch "
       "figures (geektopia.es, sysrqmts.com/en/gpus/nvidia/tesla/t4)"),
    _p("rtx 2070 super", "GeForce RTX 2070 SUPER", "nvidia", (7, 5), 40, 8, 448, 4, 9.06, 36.2, None, 0.28, "P",
       "R-nsys: 40 SMs, 448.064 GB/s, 4 MiB L2; FP32 = 2560 cores x 1.77 GHz x 2; tensor = 320 TCs x 64 FMA "
       "x 2 x 1.77 GHz halved for FP32 accumulate on GeForce [U]"),
    # --- Ampere (CC 8.0) ---
    _p("a100 sxm4 40gb", "A100-SXM4-40GB", "nvidia", (8, 0), 108, 40, 1555, 40, 19.5, 312, 312, 9.7, "V",
       "formats.md 5.3 [S22]; R-nsys: 108 SMs, 1.5552e12 B/s, 40 MiB L2", aliases=("a100",), **_A100_PEAKS),
    _p("a100 sxm4 80gb", "A100-SXM4-80GB", "nvidia", (8, 0), 108, 80, 2039, 40, 19.5, 312, 312, 9.7, "V",
       "formats.md 5.3 [S22]; R-kineto: 108 SMs", aliases=("a100 80gb sxm",), **_A100_PEAKS),
    _p("a100 pcie 40gb", "A100-PCIE-40GB", "nvidia", (8, 0), 108, 40, 1555, 40, 19.5, 312, 312, 9.7, "P",
       "A100 datasheet (same chip and HBM2 as the 40 GB SXM4)", **_A100_PEAKS),
    _p("a100 80gb pcie", "A100 80GB PCIe", "nvidia", (8, 0), 108, 80, 1935, 40, 19.5, 312, 312, 9.7, "P",
       "formats.md 5.3 (datasheet from memory)", aliases=("a100 pcie 80gb",), **_A100_PEAKS),
    _p("a100 pg509 200", "A100-PG509-200", "nvidia", (8, 0), 108, 40, 1555, 40, 19.5, 312, 312, 9.7, "U",
       "Meta/OEM A100 40 GB board; R-kineto: 108 SMs, 39.4 GiB; bandwidth assumed = A100 40 GB", **_A100_PEAKS),
    _p("a10", "A10", "nvidia", (8, 6), 72, 24, 600, 6, 31.2, 125, 125, 0.98, "P", "formats.md 5.3 [S26]",
       aliases=("a10g",), tf32=62.5, peaks_source="formats.md 5.3 TF32 column [S26]: 62.5 TF dense"),
    # --- Ampere GA10x (CC 8.6) ---
    _p("rtx 3060", "GeForce RTX 3060", "nvidia", (8, 6), 28, 12, 360, 2.25, 12.74, 25.5, 25.5, 0.2, "P",
       "R-nsys: 28 SMs, 360.048 GB/s, 2.25 MiB L2; 3584 cores x 1.777 GHz x 2 (pcpartdb.com); tensor = "
       "28 SM x 512 FMA x 2 x 1.777 GHz halved for FP32 accumulate on GeForce"),
    _p("rtx 3080", "GeForce RTX 3080", "nvidia", (8, 6), 68, 10, 760, 5, 29.77, 59.5, 59.5, 0.47, "P",
       "R-nsys TARGET_INFO_CUDA_GPU: 760.08 GB/s, 5 MiB L2; 68 SMs, 8704 cores, 29.8 TF (fudzilla.net, "
       "monsterpc-sg.com); tensor halved for FP32 accumulate"),
    _p("rtx 3090", "GeForce RTX 3090", "nvidia", (8, 6), 82, 24, 936, 6, 35.58, 71.0, 71.0, 0.56, "P",
       "R-nsys: 82 SMs, 936.096 GB/s, 6 MiB L2; 10496 cores x 1.695 GHz x 2 (fudzilla.net 35.7 TF)"),
    _p("rtx a2000 12gb", "RTX A2000 12GB", "nvidia", (8, 6), 26, 12, 288, 3, 7.99, 31.9, 31.9, 0.125, "P",
       "R-nsys: 26 SMs, 288.048 GB/s, 3 MiB L2; 7.987 TF FP32 (sysrqmts.com); tensor 63.9 TF sparse / 2",
       aliases=("rtx a2000",)),
    _p("rtx a5000", "RTX A5000", "nvidia", (8, 6), 64, 24, 768, 6, 27.8, 111.1, 111.1, 0.87, "P",
       "R-nsys: 64 SMs, 768.096 GB/s, 6 MiB L2; datasheet 27.8 TF FP32, 222.2 TF tensor sparse / 2"),
    # --- Ada (CC 8.9) ---
    _p("l4", "L4", "nvidia", (8, 9), 58, 24, 300, 48, 30.3, 121, 121, 0.49, "P", "formats.md 5.3 [S25]",
       fp8=242.5, tf32=60, peaks_source="TF32 60 TF dense: formats.md 5.3 [S25]; FP8 485 TF with sparsity, halved: "
       "NVIDIA L4 datasheet as quoted at grokipedia.com/page/NVIDIA_L4_vs_L40S"),
    _p("rtx 4060", "GeForce RTX 4060", "nvidia", (8, 9), 24, 8, 272, 24, 15.11, 30.23, 30.23, 0.24, "P",
       "R-nsys: 24 SMs, 272.032 GB/s, 24 MiB L2; 15.11 TF FP32, 30.23 TF FP16 tensor FP32-acc "
       "(fpsbench.com, hmc-tech.com)"),
    _p("rtx 4060 ti", "GeForce RTX 4060 Ti", "nvidia", (8, 9), 34, 8, 288, 32, 22.06, 44.1, 44.1, 0.34, "P",
       "R-nsys: 34 SMs, 288.032 GB/s, 32 MiB L2; 22.06 TF FP32 (thefpsreview.com, cputronic.com); tensor "
       "scaled from RTX 4060 by SMs x clock"),
    _p("rtx 4090", "GeForce RTX 4090", "nvidia", (8, 9), 128, 24, 1008, 72, 82.6, 165.2, 165.2, 1.29, "P",
       "formats.md 5.3 [S27]", tf32=82.6, peaks_source="formats.md 5.3 TF32 column [S27]: 82.6 TF dense"),
    # --- Hopper (CC 9.0) ---
    _p("h100 80gb hbm3", "H100 80GB HBM3 (SXM5)", "nvidia", (9, 0), 132, 80, 3350, 50, 66.9, 989.4, 989.4, 33.5, "V",
       "formats.md 5.3 [S23]; R-nsys: 132 SMs, 3.35232e12 B/s, 50 MiB L2",
       aliases=("h100 sxm5", "h100 sxm", "h100 sxm5 80gb"), **_H100_SXM_PEAKS),
    _p("h100 pcie", "H100 PCIe", "nvidia", (9, 0), 114, 80, 2039, 50, 51.2, 756, 756, 25.6, "P",
       "formats.md 5.3 [S24]; R-nsys: 114 SMs, 2.03904e12 B/s, 50 MiB L2", fp8=1513, tf32=378, fp64_matrix=51,
       peaks_source="TF32 378: formats.md 5.3; FP8 3026 with sparsity (halved) and FP64 tensor 51 TF: NVIDIA H100 "
       "PCIe datasheet table at archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html"),
    _p("h100 nvl", "H100 NVL", "nvidia", (9, 0), 132, 94, 3900, 50, 60.0, 835, 835, 30.0, "U",
       "datasheet from memory (per GPU of the NVL pair)"),
    _p("h100", "H100 (unspecified)", "nvidia", (9, 0), 132, 80, 3350, 50, 66.9, 989.4, 989.4, 33.5, "U",
       "bare 'NVIDIA H100' name (R-kineto: 132 SMs, 95 GiB): SXM5 figures assumed", **_H100_SXM_PEAKS),
    _p("h200", "H200", "nvidia", (9, 0), 132, 141, 4800, 60, 66.9, 989.4, 989.4, 33.5, "V",
       "formats.md 5.3 [S23,S24]; R-nsys: 132 SMs, 4.9167e12 B/s reported, 60 MiB L2", **_H100_SXM_PEAKS),
    # --- Blackwell (CC 10.0) ---
    _p("b200", "B200", "nvidia", (10, 0), 148, 180, 7700, None, 75.0, 2250, 2250, 37.0, "P",
       "NVIDIA's HGX B200 table, 'Individual Blackwell GPU Specifications' (quoted at "
       "zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html): 7.7 TB/s, FP32 75 TF, FP64 37 TF, "
       "FP16/BF16 tensor 4.5 PF with sparsity (halved); R-ncu/R-kineto: 148 SMs, 178 GiB",
       fp8=4500, tf32=1100, fp64_matrix=37.0, peaks_source=(
           "the same NVIDIA HGX B200 table: FP8 9 PF and TF32 2.2 PF with sparsity (halved), FP64 tensor 37 TF")),
    # --- AMD (per PyTorch device; an MI250(X) package is two devices) ---
    _p("instinct mi210", "AMD Instinct MI210", "amd", None, 104, 64, 1638.4, 8, 22.6, 181, 181, 22.6, "P",
       "anandtech.com MI210 launch table (104 CUs, 1.6 TB/s, 181 TF FP16 matrix); R-kineto: 104 CUs",
       aliases=("mi210",), fp32_matrix=45.3, fp64_matrix=45.3, peaks_source=_CDNA2_PEAKS_NOTE + " (104 CUs)"),
    _p("instinct mi250", "AMD Instinct MI250 (one GCD)", "amd", None, 104, 64, 1638.4, 8, 22.6, 181, 181, 22.6, "P",
       "anandtech.com: MI250 = 2 x 104 CUs, 3.2 TB/s, 362 TF FP16; halved per GCD", aliases=("mi250",),
       fp32_matrix=45.3, fp64_matrix=45.3, peaks_source=_CDNA2_PEAKS_NOTE + " (104 CUs per GCD; the table's "
       "MI250 OAM: matrix FP32 90.5 TF)"),
    _p("instinct mi250x", "AMD Instinct MI250X (one GCD)", "amd", None, 110, 64, 1638.4, 8, 23.9, 191.5, 191.5, 23.9, "P",
       "zexron.com: MI250X = 220 CUs, 3.2 TB/s, 383 TF FP16; halved per GCD", aliases=("mi250x",),
       fp32_matrix=47.9, fp64_matrix=47.9, peaks_source=_CDNA2_PEAKS_NOTE + " (110 CUs per GCD; zexron.com: "
       "MI250X matrix FP32/FP64 95.7 TF per package)"),
    _p("instinct mi300x", "AMD Instinct MI300X", "amd", None, 304, 192, 5300, 32, 163.4, 1307.4, 1307.4, 81.7, "P",
       "formats.md 5.3 [S28]", aliases=("mi300x",), fp8=2614.9, tf32=653.7, fp32_matrix=163.4, fp64_matrix=163.4,
       peaks_source="AMD CDNA 3 white paper Table 1, FLOPS/clock/CU: matrix FP32 256, TF32 1024, FP16/BF16 2048, "
       "FP8 4096, matrix FP64 256; x 304 CUs x 2.1 GHz; FP8 and BF16 also in AMD's MI300X datasheet "
       "(2614.9 / 1307.4 TF, quoted in github.com/alpharomercoma/MI300X-vs-H200 METHODOLOGY.md)"),
)

# Words that carry no product identity (vendor and brand prefixes).
_NOISE_WORDS = {"nvidia", "tesla", "geforce", "quadro", "amd", "radeon"}
# A key must not match a name where one of these follows it: "rtx 3060" is not "rtx 3060 ti".
_VARIANT_WORDS = {"ti", "super", "laptop", "mobile", "max", "maxq", "xt", "nvl", "x", "s"}


def normalize_name(name: str) -> str:
    """Lower case, '-' '_' '/' ',' as spaces, vendor/brand words dropped, spaces collapsed."""
    words = re.split(r"[\s\-_/,()]+", name.lower())
    return " ".join(w for w in words if w and w not in _NOISE_WORDS)


def _index() -> list[tuple[tuple[str, ...], GpuProduct]]:
    pairs = [(tuple(k.split()), p) for p in _PRODUCTS for k in (p.key, *p.aliases)]
    # Longest key first (in words, then characters) so "h100 pcie" wins over "h100".
    return sorted(pairs, key=lambda kp: (-len(kp[0]), -len(" ".join(kp[0]))))


_INDEX = _index()
PRODUCTS: dict[str, GpuProduct] = {p.key: p for p in _PRODUCTS}


def product(name: str | None) -> GpuProduct | None:
    """The product a device name refers to, or None. The key's words must appear
    contiguously in the name and not be followed by a variant word (Ti, SUPER, ...). A
    missing name (None, or NaN/NA from a pandas row of a NULL) is None."""
    if not isinstance(name, str) or not name:
        return None
    words = normalize_name(name).split()
    for key, prod in _INDEX:
        n = len(key)
        for i in range(len(words) - n + 1):
            if tuple(words[i:i + n]) == key:
                after = words[i + n] if i + n < len(words) else None
                if after not in _VARIANT_WORDS:
                    return prod
    return None


def vendor_of(name: str | None) -> str | None:
    if not isinstance(name, str) or not name:  # None, or NaN/NA for a NULL name
        return None
    n = name.lower()
    if any(w in n for w in ("amd", "radeon", "instinct")):
        return "amd"
    if any(w in n for w in ("nvidia", "tesla", "geforce", "quadro", "rtx", "titan")):
        return "nvidia"
    return None


# ---------------------------------------------------------------------------------------
# Filling a devices row

# devices column -> CCLimits attribute
LIMIT_COLUMNS: dict[str, str] = {
    "max_warps_per_sm": "max_warps_per_sm",
    "max_blocks_per_sm": "max_blocks_per_sm",
    "max_threads_per_block": "max_threads_per_block",
    "registers_per_sm": "registers_per_sm",
    "max_registers_per_block": "max_registers_per_block",
    "shared_mem_per_sm_bytes": "shared_mem_per_sm_bytes",
    "max_shared_mem_per_block_bytes": "max_shared_mem_per_block_bytes",
    "max_shared_mem_per_block_optin_bytes": "max_shared_mem_per_block_optin_bytes",
    "warp_size": "warp_size",
}
# devices column -> GpuProduct attribute
PRODUCT_COLUMNS: dict[str, str] = {
    "sm_count": "sm_count",
    "memory_bandwidth_bytes_per_s": "dram_bandwidth_bytes_per_s",
    "l2_cache_bytes": "l2_cache_bytes",
}
# The columns whose origin `limits_source` reports (any of them filled -> a table was used).
_SOURCED = (*LIMIT_COLUMNS, *PRODUCT_COLUMNS)


def _missing(v: Any) -> bool:
    """None, NaN or pandas.NA."""
    if v is None:
        return True
    try:
        return bool(v != v)
    except TypeError:  # pandas.NA refuses bool()
        return True


def fill_device(row: dict[str, Any]) -> dict[str, Any]:
    """A copy of a ``devices`` row with NULL limits filled from the built-in tables.

    Limits come from the compute-capability table (by ``compute_major/minor``, or by the
    product's CC when only the name is known); ``sm_count``, ``memory_bandwidth_bytes_per_s``
    and ``l2_cache_bytes`` from the product table. A value the trace gave is never replaced.
    AMD devices get no CC limits: their ``computeMajor`` (9 on MI210) is not an NVIDIA CC.
    ``limits_source`` says whether the limits are all the trace's, partly filled, or all filled.
    """
    out = dict(row)
    vendor = vendor_of(out.get("name")) if _missing(out.get("vendor")) else out.get("vendor")
    if vendor and _missing(out.get("vendor")):
        out["vendor"] = vendor
    prod = product(out.get("name"))
    if prod is not None and vendor and prod.vendor != vendor:
        prod = None

    from_trace = {c for c in _SOURCED if not _missing(out.get(c))}
    filled: set[str] = set()

    if prod is not None:
        for col, attr in PRODUCT_COLUMNS.items():
            value = getattr(prod, attr)
            if _missing(out.get(col)) and value is not None:
                out[col] = value
                filled.add(col)

    limits = None
    if vendor != "amd":
        major, minor = out.get("compute_major"), out.get("compute_minor")
        if _missing(major) and prod is not None and prod.cc is not None:
            major, minor = prod.cc
            out["compute_major"], out["compute_minor"] = major, minor
        limits = cc_limits(None if _missing(major) else major, None if _missing(minor) else minor)
    if limits is not None:
        for col, attr in LIMIT_COLUMNS.items():
            if _missing(out.get(col)):
                out[col] = getattr(limits, attr)
                filled.add(col)

    if filled:
        out["limits_source"] = "trace+cc-table" if from_trace else "cc-table"
    elif from_trace:
        out["limits_source"] = out.get("limits_source") or "trace"
    return out


def effective_limits(device: CCLimits | dict[str, Any]) -> CCLimits:
    """The limits the occupancy calculator uses for a device: a ``CCLimits`` as is, or a
    ``devices`` row whose trace values override its CC's table values. Raises ValueError
    for a non-NVIDIA device or a CC the table does not know."""
    if isinstance(device, CCLimits):
        return device
    vendor = vendor_of(device.get("name")) if _missing(device.get("vendor")) else device.get("vendor")
    if vendor not in (None, "nvidia"):
        raise ValueError(f"no occupancy limits for {vendor} device {device.get('name')!r}: the calculator is NVIDIA's")
    base = cc_limits(device.get("compute_major"), device.get("compute_minor"))
    overrides = {attr: int(device[col]) for col, attr in LIMIT_COLUMNS.items() if not _missing(device.get(col))}
    if base is None:
        raise ValueError(
            f"no occupancy limits for device {device.get('name')!r} "
            f"(compute capability {device.get('compute_major')}.{device.get('compute_minor')} not in the table)"
        )
    return replace(base, **overrides)
