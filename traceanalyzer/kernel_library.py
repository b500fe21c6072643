"""Which library a GPU kernel comes from, told from its name.

A kernel from cuBLAS, cuDNN or NCCL is code the user cannot recompile: advice to cap its
registers or resize its tiles cannot be followed, while its problem shape, dtype or algorithm
choice can change. The rules read this to say what applies.

Names come demangled (nsys, Kineto, ncu), mangled (`_ZN...`, some Kineto and ncu rows) or bare
(`ampere_sgemm_128x64_nn`, `triton_poi_fused_add_0`); each pattern is written to match every
form the real traces show. The class whose pattern matches first in the name wins (ties: the
one listed first): a kernel's own namespace and function come before its template arguments,
so `at::native::reduce_kernel<..., thrust::pair<...>>` is PyTorch's and
`fbgemm_gpu::...<c10::Half>` is FBGEMM's. A name that matches nothing is the user's own.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .sql import sql_literal


class Library(NamedTuple):
    id: str
    label: str
    pattern: str  # a Python (and RE2) regular expression, searched anywhere in the name
    examples: str


# The order breaks ties between matches at the same place: cuDNN before CUTLASS and cuBLAS (it
# ships CUTLASS- and xmma-built kernels: `cutlass_cudnn_train`), attention before the GEMM
# libraries its kernels instantiate.
LIBRARIES: tuple[Library, ...] = (
    Library("nccl", "NCCL / RCCL", r"(?i)nccl|rccl|msccl",
            "ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllGather_RING_LL"),
    # A TensorRT engine's tactics carry cuDNN- or cuBLAS-like names (`sm80_xmma_fprop_..._execute_kernel_trt`):
    # the `_trt` suffix, matched from the name's start, wins over them.
    Library("tensorrt", "TensorRT", r"(?i)^.*_trt$|^(void )?trt_|^(void )?genericReformat|nvinfer1::",
            "sm80_xmma_fprop_implicit_gemm_..._execute_kernel_trt, trt_ampere_h16816gemm_64x64_..., genericReformat::..."),
    Library("attention", "flash-attention / fused attention",
            r"(?i)flash|fmha|xformers|paged_?attention|^attn_(fwd|bwd)|_sdpa|sdpa_|cudnn_generated_fort_native_sdpa",
            "flash_fwd_kernel<...>, fmhaSm100aKernel_..., ck_tile::...FmhaBatchPrefill..."),
    Library("cudnn", "cuDNN / MIOpen",
            r"(?i)cutlass_cudnn|cudnn|scudnn|implicit_convolve|explicit_convolve|convolve_.*engine|winograd|(sm\d+)?_xmma_(fprop|dgrad|wgrad)|"
            r"flip_filter|miopen|^igemm_(fwd|bwd|wrw)_|^Im2d2Col|^SubTensorOp|^batched_transpose_|^naive_conv_|^MIOpen|gridwise_convolution|"
            r"^(void )?(bn_fw|bn_bw)_",
            "implicit_convolve_sgemm, volta_scudnn_128x64_relu_..., sm80_xmma_fprop_implicit_gemm_..., cask_cudnn::..."),
    Library("cufft", "cuFFT / rocFFT", r"(?i)^(void )?(fft\d|regular_fft|vector_fft|composite_fft)|cufft|rocfft|fft_rtc",
            "fft2d_r2c_32x32, regular_fft<...>, vector_fft<...>"),
    Library("curand", "cuRAND / rocRAND", r"(?i)curand|rocrand|generate_seed_pseudo",
            "curand::..., generate_seed_pseudo"),
    Library("cublas", "cuBLAS / cuBLASLt (rocBLAS, hipBLASLt)",
            r"(?i)cublas|nvjet|_xmma_gemm|(^|\s|::)(volta|turing|ampere|hopper|blackwell|maxwell|sm\d+)_[a-z0-9_]*gemm|"
            r"^(void )?(gemv2[NT]|gemvNSP|gemmSN|gemmk1|gemv|dot_kernel|scal_kernel|axpy_kernel|splitKreduce|gemm_kernel)|"
            r"internal::gemvx|^Cijk_|rocblas|hipblaslt|tensile|^(void )?(sgemm_largek|compute_gemm_pointers)",
            "ampere_sgemm_128x64_nn, sm90_xmma_gemm_..._cublas, nvjet_tst_..., Cijk_Alik_Bljk_..., gemv2T_kernel_val"),
    Library("cutlass", "CUTLASS / Composable Kernel",
            r"(?i)cutlass|(^|[^a-z])ck(_tile)?::|\dck(_tile)?\d|composable_kernel",
            "cutlass::Kernel<cutlass_80_tensorop_s1688gemm_...>, ck::tensor_operation::device::kernel_..."),
    # trtllm-gen's batched GEMMs (`bmm_<A dtype>_<B dtype>_..._t128x16x256..._sm100f`: MoE and FP4/FP8
    # GEMMs in TensorRT-LLM, vLLM and FlashInfer): TMA, warp-specialized, a few big blocks per SM.
    Library("trtllm_gemm", "TensorRT-LLM GEMM (trtllm-gen)", r"^bmm_[A-Za-z0-9]+_[A-Za-z0-9]+_",
            "bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_..._sm100f, bmm_Bfloat16_E4m3_Fp32_t128x8x256..."),
    Library("triton", "Triton (TorchInductor included)", r"^triton_|^triton__|_triton$|^triton\b",
            "triton_poi_fused_add_0, triton_red_fused_native_layer_norm_1, triton__0d1d2d"),
    Library("cub", "CUB / Thrust (hipCUB, rocPRIM)", r"(?i)(^|[^a-z])(cub|thrust|rocprim|hipcub)::|\d(cub|thrust|rocprim)\d|_kernel_agent",
            "cub::DeviceRadixSortOnesweepKernel<...>, thrust::cuda_cub::core::_kernel_agent<...>"),
    Library("aten", "PyTorch ATen native",
            r"(^|[^a-zA-Z_])(at|c10)::|\d(at|c10)\d(native|cuda|detail)|^(void )?cunn_|THCUNN|"
            r"^(void )?(\(anonymous namespace\)::|<unnamed>::)?(softmax_warp_(forward|backward)|cunn_SoftMax|indexSelect(Small|Large)Index|"
            r"kernelPointwiseApply|elementwise_kernel|vectorized_elementwise_kernel|unrolled_elementwise_kernel|reduce_kernel|"
            r"index_elementwise_kernel|RowwiseMoments|LayerNorm|GammaBeta|CatArrayBatchedCopy|multi_tensor_apply_kernel)",
            "at::native::vectorized_elementwise_kernel<...>, (anonymous namespace)::softmax_warp_forward<...>"),
    Library("other", "Another library or code generator (FBGEMM, Apex, Transformer Engine, vLLM, SGLang, AITER, "
            "FlashInfer, TensorRT-LLM, cuTENSOR, CuPy, nvFuser)",
            r"(?i)fbgemm|split_embedding_|bounds_check_indices|permute_pooled_embs|apex|transformer_engine|\bte::|vllm|"
            r"sgl_|sglang|aiter|flashinfer|tensorrt_llm|trtllm|moe::dev::|deepspeed|megatron|"
            r"cutensor|^cupy_|nvfuser",
            "fbgemm_gpu::..., vllm::fused_add_rms_norm_kernel, aiter::add_rmsnorm_quant_kernel"),
)
USER = Library("user", "The user's own", "", "any name no pattern above matches")
BY_ID = {lib.id: lib for lib in (*LIBRARIES, USER)}
# Kernels a user builds from source: advice about registers, tiles and launch bounds applies.
USER_BUILT = frozenset({"user", "triton"})

_COMPILED = tuple((lib.id, re.compile(lib.pattern)) for lib in LIBRARIES)


def classify(name: str | None, mangled: str | None = None) -> str | None:
    """The library id of a kernel name (mangled name tried too); None for no name or a placeholder
    such as nsys's `[CUDA graph]`."""
    if not name and not mangled:
        return None
    if name and name.startswith("[") and not mangled:
        return None
    for text in (name, mangled):
        if not text:
            continue
        best: tuple[int, int] | None = None  # (match position, class order)
        for order, (_, rx) in enumerate(_COMPILED):
            m = rx.search(text)
            if m and (best is None or (m.start(), order) < best):
                best = (m.start(), order)
        if best is not None:
            return _COMPILED[best[1]][0]
    return USER.id


def is_library(lib_id: str | None) -> bool:
    """A kernel the user cannot recompile (a vendor or framework library's)."""
    return lib_id is not None and lib_id not in USER_BUILT


def classify_arrow(names: pa.ChunkedArray | pa.Array, mangled: pa.ChunkedArray | pa.Array | None = None) -> pa.Array:
    """`classify` over a column, once per distinct (name, mangled name); dictionary-encoded.
    The pairs are told apart by their dictionary codes: the rows' strings are never copied
    (a part of 500 k long kernel names, decoded and joined per row, took 400 MB and 0.1 s)."""
    name_codes, name_values = _codes(names)
    if mangled is None:
        mangled_codes, mangled_values = np.zeros(len(name_codes), np.int64), [None]
    else:
        mangled_codes, mangled_values = _codes(mangled)
    width = len(mangled_values)
    pairs, per_row = np.unique(name_codes * width + mangled_codes, return_inverse=True)
    ids = [classify(name_values[int(p) // width], mangled_values[int(p) % width]) for p in pairs]
    libraries = sorted({i for i in ids if i is not None})
    code = {lib: n for n, lib in enumerate(libraries)}
    per_pair = pa.array([code.get(i) for i in ids], pa.int32())
    return pa.DictionaryArray.from_arrays(per_pair.take(pa.array(per_row.reshape(-1))), pa.array(libraries, pa.string()))


def _codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str | None]]:
    """Per row a code, and the values the codes stand for: code 0 for NULL."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col.cast(pa.string()))
    codes = pc.fill_null(pc.add(col.indices.cast(pa.int64()), 1), 0).to_numpy()
    return codes, [None, *col.dictionary.cast(pa.string()).to_pylist()]


def markdown() -> str:
    """The classes and their patterns, for docs/schema.md."""
    lines = ["| `library` | what | pattern (the earliest match in the name wins, then in the mangled name) | examples |",
             "|---|---|---|---|"]
    for lib in (*LIBRARIES, USER):
        pattern = f"`{lib.pattern}`".replace("|", "\\|") if lib.pattern else "(none)"
        lines.append(f"| `{lib.id}` | {lib.label} | {pattern} | {lib.examples} |")
    return "\n".join(lines)


# TorchInductor's generated Triton kernels. Inductor names each kernel
# `triton_<class>_fused_<ops>_<n>` (torch/_inductor/codegen/triton.py: the first three letters of
# the kernel's heuristics decorator, then the ATen operators it fused, sorted and joined by `_`,
# then its index in the compiled graph, which is no operator). PyTorch 2.0 named them
# `triton__<signature>` (`triton__0d1d2d`: Triton's argument specialisation), with no class.
class InductorClass(NamedTuple):
    prefix: str
    id: str
    label: str


INDUCTOR_CLASSES: tuple[InductorClass, ...] = (
    InductorClass("poi", "pointwise", "pointwise"),
    InductorClass("red", "reduction", "reduction"),
    InductorClass("per", "persistent_reduction", "persistent reduction (one block holds a whole row)"),
    InductorClass("tem", "template", "template (a GEMM or convolution with fused epilogue)"),
    InductorClass("for", "foreach", "foreach (one launch over many tensors)"),
    InductorClass("spl", "split_scan", "split scan"),
    InductorClass("unk", "unknown", "class not recorded"),
)
# PyTorch 2.0's names: an Inductor kernel whose class the name does not say.
INDUCTOR_UNNAMED = InductorClass("", "unnamed", "PyTorch 2.0 name, no class or operators (`triton__0d1d2d`)")
INDUCTOR_BY_ID = {c.id: c for c in (*INDUCTOR_CLASSES, INDUCTOR_UNNAMED)}
# The classes of kernels that read and write tensors in one pass, memory-bound as element-wise work is.
INDUCTOR_MEMORY_BOUND = ("pointwise", "reduction", "persistent_reduction")

_INDUCTOR_PREFIX = r"^triton_(" + "|".join(c.prefix for c in INDUCTOR_CLASSES) + r")_"
_INDUCTOR_UNNAMED = r"^triton__[0-9]+d[0-9dce]*$"
# The operators' part of a name: after `fused`, before the index.
_INDUCTOR_FUSED = r"^triton_[a-z]{3}_fused(?:_(.*))?_[0-9]+$"
# ATen (and a few custom) operators whose names hold `_`, so that `native_layer_norm` in a name is
# one operator and not three; any other operator is one word. Leading `_` (`_to_copy`) is matched
# apart. A longer name is tried before a shorter one it starts with.
MULTIWORD_OPS = (
    "to_copy", "unsafe_view", "unsafe_index", "unsafe_index_put", "native_layer_norm", "native_layer_norm_backward",
    "native_group_norm", "native_group_norm_backward", "native_batch_norm", "native_batch_norm_backward",
    "native_batch_norm_legit", "native_batch_norm_legit_functional", "native_batch_norm_legit_no_training",
    "layer_norm", "group_norm", "batch_norm", "rms_norm", "fused_rms_norm", "fused_add_rms_norm", "native_dropout",
    "native_dropout_backward", "log_softmax", "softmax_backward_data", "log_softmax_backward_data",
    "constant_pad_nd", "reflection_pad2d", "replication_pad2d", "bitwise_and", "bitwise_or", "bitwise_not",
    "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "logical_and", "logical_or", "logical_not",
    "logical_xor", "index_put", "index_select", "index_add", "index_copy", "index_fill", "scatter_add",
    "scatter_reduce", "select_scatter", "slice_scatter", "diagonal_scatter", "as_strided", "as_strided_scatter",
    "full_like", "zeros_like", "ones_like", "empty_like", "rand_like", "randn_like", "new_zeros", "new_ones",
    "new_empty", "new_full", "empty_strided", "split_with_sizes", "masked_fill", "masked_scatter", "clamp_min",
    "clamp_max", "var_mean", "threshold_backward", "gelu_backward", "silu_backward", "sigmoid_backward",
    "tanh_backward", "hardtanh_backward", "leaky_relu", "leaky_relu_backward", "elu_backward", "hardswish_backward",
    "hardsigmoid_backward", "mish_backward", "embedding_dense_backward", "nll_loss_forward", "nll_loss_backward",
    "nll_loss2d_forward", "nll_loss2d_backward", "binary_cross_entropy", "mse_loss", "mse_loss_backward",
    "scaled_dot_product_flash_attention", "scaled_dot_product_efficient_attention",
    "scaled_dot_product_cudnn_attention", "scaled_dot_product_attention", "avg_pool2d", "avg_pool2d_backward",
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "adaptive_avg_pool2d",
    "adaptive_avg_pool2d_backward", "upsample_nearest2d", "upsample_bilinear2d", "upsample_nearest2d_backward",
    "grid_sampler_2d", "convert_element_type", "lift_fresh_copy", "inductor_random", "inductor_seeds",
    "inductor_lookup_seed", "inductor_force_stride_order", "foreach_add", "foreach_mul", "foreach_div",
    "foreach_addcmul", "foreach_addcdiv", "foreach_sqrt", "foreach_lerp", "moe_forward", "silu_and_mul",
    "gelu_and_mul", "rotary_embedding", "unified_attention", "unified_attention_with_output", "all_reduce",
    "fused_moe", "fake_quantize_per_tensor_affine", "quantize_per_tensor", "dequantize_per_tensor",
)
_OP_WORDS = "|".join(sorted(MULTIWORD_OPS, key=lambda s: (-len(s), s)))
# One operator at a time (group 1), left to right: `_?` then a known name or one word, then `_` or the end.
INDUCTOR_OP = rf"(_?(?:{_OP_WORDS}|[A-Za-z0-9]+))(?:_|$)"

_PREFIX_RX, _UNNAMED_RX = re.compile(_INDUCTOR_PREFIX), re.compile(_INDUCTOR_UNNAMED)
_FUSED_RX, _OP_RX = re.compile(_INDUCTOR_FUSED), re.compile(INDUCTOR_OP)
_BY_PREFIX = {c.prefix: c.id for c in INDUCTOR_CLASSES}


def inductor_class(name: str | None) -> str | None:
    """The TorchInductor class of a kernel name (`pointwise`, `reduction`, ... or `unnamed`),
    None for any other kernel."""
    if not name:
        return None
    m = _PREFIX_RX.match(name)
    if m:
        return _BY_PREFIX[m.group(1)]
    return INDUCTOR_UNNAMED.id if _UNNAMED_RX.match(name) else None


def inductor_ops(name: str | None) -> list[str] | None:
    """The operators an Inductor kernel's name says it fused, in the name's order
    (`triton_poi_fused__to_copy_add_3` -> `['_to_copy', 'add']`); None when the name carries none."""
    m = _FUSED_RX.match(name or "")
    if not m:
        return None
    return _OP_RX.findall(m.group(1) or "")


def inductor_phrase(name: str | None) -> str | None:
    """A TorchInductor kernel in words, for reports: "TorchInductor reduction kernel fusing add,
    mean"; None for any other kernel."""
    cls = inductor_class(name)
    if cls is None:
        return None
    ops = inductor_ops(name)
    what = "kernel" if cls in ("unnamed", "unknown") else f"{cls.replace('_', ' ')} kernel"
    return f"TorchInductor {what}" + (f" fusing {', '.join(ops)}" if ops else "")


# The same as SQL macros (analyses/kernels.py declares them): `inductor_class(name)` and
# `inductor_ops(name)` (a VARCHAR[], NULL where the name carries none).
SQL_MACROS = {
    "inductor_class": "(name) AS CASE "
        + " ".join(f"WHEN starts_with(name, 'triton_{c.prefix}_') THEN '{c.id}'" for c in INDUCTOR_CLASSES)
        + f" WHEN regexp_matches(name, {sql_literal(_INDUCTOR_UNNAMED)}) THEN '{INDUCTOR_UNNAMED.id}' END",
    "inductor_ops": f"(name) AS CASE WHEN regexp_matches(name, {sql_literal(_INDUCTOR_FUSED)}) THEN "
        f"regexp_extract_all(regexp_extract(name, {sql_literal(_INDUCTOR_FUSED)}, 1), {sql_literal(INDUCTOR_OP)}, 1) END",
}


def inductor_markdown() -> str:
    """The Inductor kernel classes, for docs/schema.md."""
    lines = ["| name starts | `inductor_class` | what |", "|---|---|---|"]
    lines += [f"| `triton_{c.prefix}_` | `{c.id}` | {c.label} |" for c in INDUCTOR_CLASSES]
    lines.append(f"| `triton__` + signature | `{INDUCTOR_UNNAMED.id}` | {INDUCTOR_UNNAMED.label} |")
    return "\n".join(lines)
