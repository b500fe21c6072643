"""What a user can change about a kernel, by the library it comes from (`kernels.library`).

A library kernel's grid, block, registers and tiles are the library's: a hint to cap its
registers or resize its tiles cannot be followed. What the user controls is the call: the
problem shape and alignment, the dtype, the library's algorithm choice and workspace,
batching small calls, or another op or a fused implementation.
"""

from __future__ import annotations

import re

from ..kernel_library import BY_ID, inductor_class, is_library
from ..analyses.budget import COMM_PATTERN

_COMM = re.compile(COMM_PATTERN)

# Per library: what changes its launch (grid: how much parallel work it gets; occupancy: the
# per-block resources its chosen variant uses).
_HINTS = {
    "cublas": {
        "grid": "its grid follows the GEMM's shape and the tile cuBLAS picked: give it more work per call "
                "(batch small GEMMs into one bmm or grouped GEMM, fuse the projections that share an input), "
                "pad M, N and K to multiples of 8 (16-bit) or 16 (8-bit) so larger tensor-core tiles apply, or "
                "let cuBLASLt try other algorithms (a larger workspace; torch.compile mode='max-autotune')",
        "occupancy": "cuBLAS chose this variant for the shape and dtype: a 16-bit or TF32 dtype, aligned "
                     "dimensions, or a larger batch lets it pick another; cuBLASLt's heuristics take a workspace "
                     "size and preferences (torch.compile mode='max-autotune' searches them)",
    },
    "tensorrt": {
        "grid": "TensorRT picked this tactic for the shapes the engine was built for: build it for the shapes "
                "and batch it runs (the optimization profile's opt shapes), a larger batch, or let the builder "
                "time more tactics (a higher builder optimization level)",
        "occupancy": "the tactic TensorRT picked sets this: build the engine for the shapes it runs, with the "
                     "precisions it may use (FP16, INT8/FP8 where accuracy allows), or a higher builder "
                     "optimization level",
    },
    "cudnn": {
        "grid": "cuDNN sizes the grid from the convolution's shape and the algorithm it picked: let it search "
                "(torch.backends.cudnn.benchmark = True), use channels-last (NHWC) with a 16-bit dtype and "
                "channel counts that are multiples of 8, or a larger batch",
        "occupancy": "the algorithm cuDNN picked sets this: let it search (torch.backends.cudnn.benchmark = True), "
                     "use channels-last (NHWC) with a 16-bit dtype, or a larger batch",
    },
    "cutlass": {
        "grid": "a library-built CUTLASS/CK kernel: its grid follows the problem shape; batch small problems "
                "(grouped GEMM), pad dimensions to the kernel's alignment, or let the library autotune "
                "(torch.compile mode='max-autotune')",
        "occupancy": "a library-built CUTLASS/CK kernel: another dtype, alignment or problem size selects "
                     "another configuration; or let the library autotune (torch.compile mode='max-autotune')",
    },
    "trtllm_gemm": {
        "grid": "its grid follows the GEMM's shape (tokens per expert in a MoE layer) and the tile the runtime "
                "picked: more tokens per call (a larger batch, fewer and larger experts per rank), or let the "
                "runtime autotune its tactics (vLLM's and FlashInfer's autotuner, TensorRT-LLM's tactic profiling)",
        "occupancy": "the tile and stage count of the tactic the runtime picked set this (few large blocks by "
                     "design): another tactic through the autotuner, another dtype, or more tokens per call",
    },
    "attention": {
        "grid": "an attention kernel's grid is batch x heads x query blocks: with a small batch, few heads or "
                "short queries (decoding) use a split-KV / flash-decoding variant, batch requests together, or "
                "a newer flash-attention / SDPA backend",
        "occupancy": "a fused attention kernel's resources follow its head dimension and dtype: another SDPA "
                     "backend (flash, memory-efficient, cuDNN) or head size selects another variant",
    },
    "cufft": {
        "grid": "batch the transforms (one plan with batch > 1) and use sizes with small prime factors",
        "occupancy": "cuFFT's kernel follows the transform size: sizes with small prime factors, batched plans",
    },
    "curand": {
        "grid": "generate more numbers per call (one larger batch instead of many small ones)",
        "occupancy": "generate more numbers per call",
    },
    "cub": {
        "grid": "CUB/Thrust size the grid from the input: batch small calls (segmented algorithms) or fuse "
                "them into their neighbours",
        "occupancy": "CUB/Thrust pick the policy for the input: batch small calls (segmented algorithms)",
    },
    "aten": {
        "grid": "a PyTorch kernel's launch follows the tensor it works on: batch the small tensors (e.g. "
                "torch._foreach_* ops, fused optimizers), or fuse it with its neighbours (torch.compile)",
        "occupancy": "a PyTorch kernel's resources are fixed by the op: fuse it with its neighbours "
                     "(torch.compile) or use a fused implementation of the op",
    },
    "other": {
        "grid": "a library's kernel: give it more work per call (batch), change the problem shape, or use "
                "the library's other configurations",
        "occupancy": "a library's kernel: another dtype, shape or library configuration selects another variant",
    },
}


# Libraries whose GEMM, convolution and attention kernels run few large blocks by design (large
# tiles in shared memory and registers): low occupancy alone says nothing of them.
LOW_OCCUPANCY_BY_DESIGN = frozenset({"cublas", "cutlass", "cudnn", "attention", "tensorrt", "trtllm_gemm"})


def library_of(row) -> str | None:
    lib = getattr(row, "library", None)
    return lib if isinstance(lib, str) else None


def is_collective(row) -> bool:
    """A communication kernel (NCCL/RCCL or a custom all-reduce): T007 owns its time."""
    return library_of(row) == "nccl" or bool(_COMM.search(str(row.name)))


# A TorchInductor kernel is generated: its block sizes and warps are Inductor's heuristics' or autotuner's.
_INDUCTOR_HINTS = {
    "grid": "Inductor sized its blocks (XBLOCK, R0_BLOCK) by heuristics: let it autotune them (torch.compile "
            "mode='max-autotune' or torch._inductor.config.coordinate_descent_tuning = True); a grid that stays "
            "small means little data per call: batch more work into each call",
    "occupancy": "Inductor chose its block sizes and num_warps: let it autotune them (torch.compile "
                 "mode='max-autotune', or torch._inductor.config.coordinate_descent_tuning = True)",
}


def library_hint(lib: str | None, topic: str, name: str | None = None) -> str | None:
    """The hint for a kernel of library `lib` ("grid" or "occupancy"), None for the user's own;
    for a TorchInductor kernel (told from its `name`), Inductor's."""
    if isinstance(name, str) and inductor_class(name) is not None:
        return f"TorchInductor kernel: {_INDUCTOR_HINTS[topic]}."
    if not is_library(lib):
        return None
    text = _HINTS.get(lib, _HINTS["other"])[topic]
    if lib in _HINTS and lib != "other":
        return f"{BY_ID[lib].label.split(' / ')[0].split(' (')[0]} kernel: {text}."
    return text[0].upper() + text[1:] + "."


def not_collectives(g):
    """The launch groups that are not collectives."""
    return g[[not is_collective(r) for r in g.itertuples()]] if len(g) else g
