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
            "FlashInfer, TensorRT(-LLM), cuTENSOR, CuPy, nvFuser)",
            r"(?i)fbgemm|split_embedding_|bounds_check_indices|permute_pooled_embs|apex|transformer_engine|\bte::|vllm|"
            r"sgl_|sglang|aiter|flashinfer|tensorrt|trtllm|moe::dev::|genericReformat|^trt_|_trt$|deepspeed|megatron|"
            r"cutensor|^cupy_|nvfuser|^bmm_[A-Za-z0-9]+_[A-Za-z0-9]+_",
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
