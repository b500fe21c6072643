"""FLOPs and bytes of one PyTorch operator call, from the shapes Kineto recorded for it.

The formulas of rule B003's Kineto estimate (`FORMULAS` is their description in the rule's
doc). A call's arguments are read by position, as the operator's schema orders them:
`Input Dims` holds each argument's shape (`[]` for a scalar or a None), `Input type` its
type (`c10::BFloat16`, `Scalar`, `''` for None), `Concrete Inputs` the scalar arguments as
text (`'[1, 1]'`, `'True'`, `'0.125'`; `''` for tensors). `op_cost` gives a `Cost`, or the
reason the call cannot be estimated: a call whose shapes do not fit its schema, or whose
FLOPs depend on an argument the trace did not record, is not estimated rather than guessed.

Bytes are each operand read once and each output written once (a lower bound: real kernels
re-read tiles that do not stay in cache). FLOPs count multiply-adds as two.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

# `Input type` -> (bytes per element, the roof its matrix work runs on: gpu.GpuProduct.matmul_peak)
DTYPES = {
    "float": (4, "fp32"), "double": (8, "fp64"), "c10::Half": (2, "fp16"), "c10::BFloat16": (2, "bf16"),
    "c10::Float8_e4m3fn": (1, "fp8"), "c10::Float8_e5m2": (1, "fp8"),
    "c10::Float8_e4m3fnuz": (1, "fp8"), "c10::Float8_e5m2fnuz": (1, "fp8"),
}
# Integer tensor types as `Input type` names them.
_INT_TYPES = {"int", "long int", "short int", "signed char", "unsigned char", "bool"}
# c10::ScalarType codes (an `out_dtype` argument in Concrete Inputs) -> `Input type` name
SCALAR_TYPES = {5: "c10::Half", 6: "float", 7: "double", 15: "c10::BFloat16", 23: "c10::Float8_e5m2",
                24: "c10::Float8_e4m3fn", 25: "c10::Float8_e5m2fnuz", 26: "c10::Float8_e4m3fnuz"}


@dataclass(frozen=True)
class Cost:
    family: str  # "gemm", "attention" or "conv"
    flops: float
    bytes: float
    dtype: str  # the input type that picks the roof
    shape: str  # the operands, as findings show them
    counted: str  # what the FLOPs include, in words


class _NotEstimable(Exception):
    """The call's cost cannot be told from what the trace recorded (the message says why)."""


class _Call:
    """One call's arguments by position."""

    def __init__(self, dims: list, types: list, concrete: list | None):
        self.dims, self.types, self.concrete = dims, types, concrete

    def tensor(self, i: int, ndim: int | tuple[int, ...] | None = None, what: str = "operand") -> list[int]:
        """The shape of the tensor argument at `i` (of `ndim` dimensions when given)."""
        shape = self.optional(i)
        if shape is None:
            raise _NotEstimable(f"no tensor {what} at argument {i}")
        if ndim is not None and len(shape) not in ((ndim,) if isinstance(ndim, int) else ndim):
            raise _NotEstimable(f"{what} {_fmt(shape)} is not {ndim}-D")
        return shape

    def optional(self, i: int) -> list[int] | None:
        """The shape of an optional tensor argument, None when it is absent or None."""
        if i >= len(self.dims):
            return None
        d, t = self.dims[i], self.types[i] if i < len(self.types) else ""
        if not isinstance(d, list) or not all(isinstance(x, int) and x >= 0 for x in d):
            raise _NotEstimable(f"argument {i} is not a shape")
        if t in DTYPES:
            return d
        if d or t not in ("", "Scalar"):  # a tensor of a type the roofs do not cover (int8, bool)
            raise _NotEstimable(f"argument {i} has type {t!r}")
        return None

    def present(self, i: int) -> bool:
        """Whether argument `i` is a tensor of any type (an int tensor of sequence lengths too)."""
        if i >= len(self.dims):
            return False
        d, t = self.dims[i], self.types[i] if i < len(self.types) else ""
        return bool(d) or t in DTYPES or t in _INT_TYPES

    def nbytes(self, i: int) -> int:
        return math.prod(self.tensor(i)) * DTYPES[self.types[i]][0]

    def scalar(self, i: int, default=None):
        """A scalar argument from Concrete Inputs: bool, number or list; `default` when the
        trace has no Concrete Inputs at all or the argument is None."""
        if self.concrete is None:
            if default is None:
                raise _NotEstimable(f"argument {i} is needed and the trace has no Concrete Inputs")
            return default
        if i >= len(self.concrete):
            raise _NotEstimable(f"no argument {i} in Concrete Inputs")
        text = self.concrete[i]
        if not isinstance(text, str):
            raise _NotEstimable(f"Concrete Inputs argument {i} is not text")
        text = text.strip()
        if text in ("", "None"):
            if default is None:
                raise _NotEstimable(f"argument {i} is not recorded")
            return default
        if text in ("True", "False"):
            return text == "True"
        try:
            return json.loads(text)  # 1, 0.125, [1, 1]
        except ValueError:
            try:
                return float(text)  # '0.' (PyTorch prints floats that way)
            except ValueError:
                raise _NotEstimable(f"Concrete Inputs argument {i} = {text!r} is not a value") from None

    def flag(self, i: int, default: bool | None = None) -> bool:
        v = self.scalar(i, default)
        if not isinstance(v, bool):
            raise _NotEstimable(f"argument {i} = {v!r} is not a bool")
        return v

    def ints(self, i: int, n: int) -> list[int]:
        """A list argument of `n` ints (a single value repeated, as PyTorch broadcasts it)."""
        v = self.scalar(i)
        v = [v] if isinstance(v, int) and not isinstance(v, bool) else v
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise _NotEstimable(f"argument {i} = {v!r} is not a list of ints")
        if len(v) == 1:
            v = v * n
        if len(v) != n:
            raise _NotEstimable(f"argument {i} = {v} does not match {n} spatial dimensions")
        return v


def _fmt(shape: list[int]) -> str:
    return "[" + "x".join(map(str, shape)) + "]"


def _roof(call: _Call, *positions: int) -> str:
    """The input type of the operands at `positions`; they must share a roof."""
    types = [call.types[i] for i in positions]
    if len({DTYPES[t][1] for t in types}) > 1:
        raise _NotEstimable(f"inputs of different types ({', '.join(types)}): no one roof")
    return types[0]


# -- GEMM-like ----------------------------------------------------------------------------------

# op -> (mat1, mat2, bias, beta, out, kind): argument positions (None: the op has none). `kind`:
# "mm" 2-D x 2-D, "bmm" batched 3-D, "matmul" broadcasting, "linear" weight [N, K].
GEMMS = {
    "aten::mm": (0, 1, None, None, 2, "mm"),
    "aten::addmm": (1, 2, 0, 3, 5, "mm"),
    "aten::_addmm_activation": (1, 2, 0, 3, 6, "mm"),
    "aten::bmm": (0, 1, None, None, 2, "bmm"),
    "aten::baddbmm": (1, 2, 0, 3, 5, "bmm"),
    "aten::matmul": (0, 1, None, None, 2, "matmul"),
    "aten::linear": (0, 1, 2, None, 3, "linear"),
    "aten::_scaled_mm": (0, 1, 4, None, 8, "mm"),  # (mat1, mat2, scale_a, scale_b, bias, scale_result, out_dtype, ...)
}


def _gemm_dims(kind: str, a: list[int], b: list[int]) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a product of shapes `a` and `b`."""
    if kind == "mm":
        if len(a) != 2 or len(b) != 2:
            raise _NotEstimable(f"{_fmt(a)} x {_fmt(b)} are not 2-D matrices")
        (m, k), (k2, n), batch = a, b, 1
    elif kind == "bmm":
        if len(a) != 3 or len(b) != 3 or a[0] != b[0]:
            raise _NotEstimable(f"{_fmt(a)} x {_fmt(b)} are not batches of one size")
        (batch, m, k), (_, k2, n) = a, b
    elif kind == "linear":
        if not a or len(b) not in (1, 2):
            raise _NotEstimable(f"linear of {_fmt(a)} by weight {_fmt(b)}")
        k, k2 = a[-1], b[-1]
        n = b[0] if len(b) == 2 else 1
        m, batch = math.prod(a[:-1]), 1
    else:  # matmul: a 1-D operand is a row (left) or a column (right); leading dims broadcast
        if not a or not b:
            raise _NotEstimable("matmul of a 0-D tensor")
        a2 = [1, *a] if len(a) == 1 else a
        b2 = [*b, 1] if len(b) == 1 else b
        n_lead = max(len(a2), len(b2)) - 2
        lead_a = [1] * (n_lead - len(a2) + 2) + a2[:-2]
        lead_b = [1] * (n_lead - len(b2) + 2) + b2[:-2]
        if any(x != y and 1 not in (x, y) for x, y in zip(lead_a, lead_b)):
            raise _NotEstimable(f"{_fmt(a)} x {_fmt(b)} do not broadcast")
        (m, k), (k2, n) = a2[-2:], b2[-2:]
        batch = math.prod(max(x, y) for x, y in zip(lead_a, lead_b))
    if k != k2:
        raise _NotEstimable(f"inner dimensions differ: {_fmt(a)} x {_fmt(b)}")
    return batch, m, n, k


def _gemm(op: str, call: _Call) -> Cost:
    ia, ib, ibias, ibeta, iout, kind = GEMMS[op]
    a, b = call.tensor(ia, what="mat1"), call.tensor(ib, what="mat2")
    batch, m, n, k = _gemm_dims(kind, a, b)
    dtype = _roof(call, ia, ib)
    nbytes = call.nbytes(ia) + call.nbytes(ib)
    bias = None if ibias is None else call.optional(ibias)
    # addmm's C is read and added only when beta != 0 (1, the default, where Concrete Inputs are absent)
    if bias is not None and ibeta is not None and call.scalar(ibeta, default=1) == 0:
        bias = None
    if bias is not None:
        nbytes += call.nbytes(ibias)
    if op == "aten::_scaled_mm":  # the scales are operands too
        nbytes += sum(call.nbytes(i) for i in (2, 3, 5) if call.optional(i) is not None)
    out = call.optional(iout)
    if out is not None:
        out_type = call.types[iout]
    elif op == "aten::_scaled_mm":
        if call.concrete is None:
            raise _NotEstimable("no Concrete Inputs: the output type (out_dtype) is unknown")
        code = call.scalar(6, default=-1)
        out_type = call.types[ia] if code == -1 else SCALAR_TYPES.get(code)
        if out_type is None:
            raise _NotEstimable(f"out_dtype {code} is not a floating type")
    else:
        out_type = call.types[ia]
    nbytes += batch * m * n * DTYPES[out_type][0]
    flops = 2.0 * batch * m * n * k + (batch * m * n if bias is not None else 0)
    shape = f"{_fmt(a)} x {_fmt(b)}" + (f" + {_fmt(bias)}" if bias is not None else "")
    return Cost("gemm", flops, float(nbytes), dtype, shape,
                "2*M*N*K" + (" + M*N (bias add)" if bias is not None else ""))


# -- attention -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Attention:
    q: int  # position of query; key and value follow it
    layout: str  # "bhsd" ([batch, heads, seq, dim]) or "bshd"
    causal: int  # position of is_causal (a bool) or of custom_mask_type (an int, `mask_type`)
    mask: int | None = None  # position of an additive mask / bias tensor
    varlen: tuple[int, ...] = ()  # cum_seq_q / per-batch key lengths: a tensor there means varying lengths
    window: tuple[int, ...] = ()  # positions of sliding-window sizes (None or -1: no window)
    backward: bool = False
    mask_type: bool = False


ATTENTION = {
    "aten::scaled_dot_product_attention": _Attention(0, "bhsd", 5, mask=3),
    "aten::_scaled_dot_product_flash_attention": _Attention(0, "bhsd", 4),
    "aten::_scaled_dot_product_efficient_attention": _Attention(0, "bhsd", 6, mask=3),
    "aten::_scaled_dot_product_cudnn_attention": _Attention(0, "bhsd", 6, mask=3),
    "aten::_flash_attention_forward": _Attention(0, "bshd", 8, varlen=(3, 13), window=(11, 12)),
    "aten::_efficient_attention_forward": _Attention(0, "bshd", 9, mask=3, varlen=(4, 12), window=(13,),
                                                     mask_type=True),
    "aten::_scaled_dot_product_flash_attention_backward": _Attention(1, "bhsd", 11, backward=True),
    "aten::_scaled_dot_product_efficient_attention_backward": _Attention(1, "bhsd", 11, mask=4, backward=True),
    "aten::_scaled_dot_product_cudnn_attention_backward": _Attention(1, "bhsd", 14, mask=8, backward=True),
    "aten::_flash_attention_backward": _Attention(1, "bshd", 11, varlen=(6,), backward=True),
    "aten::_efficient_attention_backward": _Attention(1, "bshd", 14, mask=4, varlen=(6,), backward=True,
                                                      mask_type=True),
}


def _attention(op: str, call: _Call) -> Cost:
    spec = ATTENTION[op]
    if any(call.present(i) for i in spec.varlen):
        raise _NotEstimable("variable-length sequences: their lengths are not in the trace")
    if call.concrete is None:
        raise _NotEstimable("no Concrete Inputs: whether the mask is causal is unknown")
    q, k, v = (call.tensor(spec.q + i, 4, name) for i, name in enumerate(("query", "key", "value")))
    if spec.layout == "bshd":
        (b, sq, hq, d), (bk, sk, hk, dk), (bv, sv, hv, dv) = q, k, v
    else:
        (b, hq, sq, d), (bk, hk, sk, dk), (bv, hv, sv, dv) = q, k, v
    if not (b == bk == bv and sk == sv and hk == hv and d == dk) or hk == 0 or hq % hk:
        raise _NotEstimable(f"query {_fmt(q)}, key {_fmt(k)}, value {_fmt(v)} do not fit")
    for i in spec.window:
        if call.scalar(i, default=-1) not in (-1,):
            raise _NotEstimable("sliding-window attention: the window's work is not modelled")
    if spec.mask_type:
        mask_type = call.scalar(spec.causal)
        if mask_type not in (0, 1, 2):
            raise _NotEstimable(f"custom_mask_type {mask_type!r} is not 0, 1 or 2")
        causal = mask_type != 0
    else:
        causal = call.flag(spec.causal)
    if causal and sq != sk:
        raise _NotEstimable(f"causal with {sq} queries and {sk} keys: the mask's alignment is not in the trace")
    dtype = _roof(call, spec.q, spec.q + 1, spec.q + 2)
    size = DTYPES[dtype][0]
    qkv = sum(call.nbytes(spec.q + i) for i in range(3))
    out = b * hq * sq * dv * size
    mask = 0 if spec.mask is None or call.optional(spec.mask) is None else call.nbytes(spec.mask)
    pairs = b * hq * sq * sk * (0.5 if causal else 1.0)
    if spec.backward:  # recompute S = QK^T, then dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q
        flops = 2.0 * pairs * (3 * d + 2 * dv)
        nbytes = 2 * qkv + 2 * out + mask  # q, k, v, out, grad_out read; dq, dk, dv written
        counted = "2*B*Hq*Sq*Sk*(3*D + 2*Dv) (recomputed QK^T and four gradient products)"
    else:
        flops = 2.0 * pairs * (d + dv)
        nbytes = qkv + out + mask
        counted = "2*B*Hq*Sq*Sk*(D + Dv) (QK^T and PV)"
    if causal:
        counted += ", halved by the causal mask"
    shape = f"q {_fmt(q)} k {_fmt(k)} v {_fmt(v)}" + (" causal" if causal else "") + (" masked" if mask else "")
    return Cost("attention", flops, float(nbytes), dtype, shape, counted)


# -- convolution ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Conv:
    bias: int | None
    stride: int
    padding: int
    dilation: int
    groups: int
    transposed: int | None = None


CONVS = {
    **{f"aten::conv{n}d": _Conv(2, 3, 4, 5, 6) for n in (1, 2, 3)},
    "aten::convolution": _Conv(2, 3, 4, 5, 8, transposed=6),
    "aten::_convolution": _Conv(2, 3, 4, 5, 8, transposed=6),
    "aten::cudnn_convolution": _Conv(None, 3, 2, 4, 5),  # (input, weight, padding, stride, dilation, groups, ...)
    "aten::miopen_convolution": _Conv(2, 4, 3, 5, 6),  # (input, weight, bias, padding, stride, dilation, groups, ...)
}


def _conv(op: str, call: _Call) -> Cost:
    spec = CONVS[op]
    if call.concrete is None:
        raise _NotEstimable("no Concrete Inputs: stride, padding, dilation and groups are unknown")
    x = call.tensor(0, (3, 4, 5), "input")
    w = call.tensor(1, len(x), "weight")
    if spec.transposed is not None and call.flag(spec.transposed):
        raise _NotEstimable("transposed convolution")
    n_sp = len(x) - 2
    stride, padding, dilation = (call.ints(i, n_sp) for i in (spec.stride, spec.padding, spec.dilation))
    groups = call.scalar(spec.groups)
    if not isinstance(groups, int) or groups < 1 or x[1] != w[1] * groups or w[0] % groups:
        raise _NotEstimable(f"input {_fmt(x)}, weight {_fmt(w)} and groups {groups!r} do not fit")
    out_sp = [(i + 2 * p - d * (kk - 1) - 1) // s + 1
              for i, kk, s, p, d in zip(x[2:], w[2:], stride, padding, dilation)]
    if min(out_sp) < 1 or min(stride) < 1:
        raise _NotEstimable(f"no output for input {_fmt(x)} and weight {_fmt(w)}")
    out = [x[0], w[0], *out_sp]
    dtype = _roof(call, 0, 1)
    bias = None if spec.bias is None else call.optional(spec.bias)
    outputs = math.prod(out)
    flops = 2.0 * outputs * math.prod(w[1:]) + (outputs if bias is not None else 0)
    nbytes = call.nbytes(0) + call.nbytes(1) + outputs * DTYPES[dtype][0] + (call.nbytes(spec.bias) if bias else 0)
    shape = (f"{_fmt(x)} * {_fmt(w)} -> {_fmt(out)} stride {'x'.join(map(str, stride))} pad "
             f"{'x'.join(map(str, padding))}" + (f" dil {'x'.join(map(str, dilation))}" if max(dilation) > 1 else "")
             + (f" groups {groups}" if groups > 1 else "") + (f" + {_fmt(bias)}" if bias is not None else ""))
    counted = "2*N*Cout*prod(out)*(Cin/groups)*prod(kernel)" + (" + N*Cout*prod(out) (bias add)" if bias else "")
    return Cost("conv", flops, float(nbytes), dtype, shape, counted)


FAMILIES = {**{op: "gemm" for op in GEMMS}, **{op: "attention" for op in ATTENTION}, **{op: "conv" for op in CONVS}}
_COST = {"gemm": _gemm, "attention": _attention, "conv": _conv}


def op_cost(op: str, input_dims: str | None, input_types: str | None, concrete_inputs: str | None) -> Cost | str:
    """The Cost of one call of `op` from the JSON text of its `Input Dims`, `Input type` and
    `Concrete Inputs` (None where the trace has none), or why it cannot be estimated."""
    family = FAMILIES.get(op)
    if family is None:
        return f"{op} has no cost formula"
    # a NULL column reaches here as None, or as NaN from a pandas row
    input_dims, input_types, concrete_inputs = (x if isinstance(x, str) else None
                                                for x in (input_dims, input_types, concrete_inputs))
    if input_dims is None:
        return "no Input Dims recorded"
    try:
        dims, types = json.loads(input_dims), json.loads(input_types or "[]")
        concrete = None if concrete_inputs is None else json.loads(concrete_inputs)
    except ValueError:
        return "Input Dims, Input type or Concrete Inputs is not JSON"
    if not (isinstance(dims, list) and isinstance(types, list) and (concrete is None or isinstance(concrete, list))):
        return "Input Dims, Input type or Concrete Inputs is not a list"
    try:
        return _COST[family](op, _Call(dims, types, concrete))
    except _NotEstimable as e:
        return str(e)


FORMULAS = """\
The Kineto estimate reads each call's arguments by position, as the operator's schema orders them (`Input Dims`, `Input type`, `Concrete Inputs`); a call whose shapes do not fit, or whose work depends on an argument the trace did not record, is not estimated (never guessed). FLOPs count a multiply-add as 2; bytes are every operand read once and every output written once, each at its own type's size (a lower bound: tiles re-read from DRAM are not counted).

| ops | FLOPs | bytes |
|---|---|---|
| `aten::mm` (mat1, mat2[, out]), `bmm`, `matmul` (broadcast leading dims), `linear` (input [..., K], weight [N, K], bias) | 2 x batch x M x N x K, + batch x M x N for a bias (`linear`'s bias, `addmm`'s `self`) | mat1 + mat2 + bias + output (`out=` tensor's type when given) |
| `aten::addmm` / `_addmm_activation` (bias, mat1, mat2, beta, alpha[, out]), `baddbmm` | as above; the bias is neither read nor added when `beta` is 0 in Concrete Inputs (1 where the trace has none) | as above |
| `aten::_scaled_mm` (FP8: mat1, mat2, scale_a, scale_b, bias, scale_result, out_dtype) | as above | + the scales; output at `out_dtype` (the input type when None) |
| `aten::scaled_dot_product_attention`, `_scaled_dot_product_{flash,efficient,cudnn}_attention` ([B, H, S, D]), `_flash_attention_forward`, `_efficient_attention_forward` ([B, S, H, D]) | 2 x B x Hq x Sq x Sk x (D + Dv): QK^T and PV, softmax not counted; x 1/2 when `is_causal` (or `custom_mask_type` 1/2) is set, which needs Concrete Inputs and Sq = Sk | q + k + v (GQA: k and v with their own Hk heads) + output + a mask / bias tensor |
| their `_backward` ops | 2 x B x Hq x Sq x Sk x (3 x D + 2 x Dv): QK^T recomputed, dV, dP, dQ, dK; causal halves it likewise | q, k, v, out, grad_out read; dq, dk, dv written |
| `aten::cudnn_convolution` / `miopen_convolution` / `convolution` / `_convolution` / `conv1d-3d` (input [N, Cin, ...], weight [Cout, Cin/groups, ...]) | out_i = floor((in_i + 2 x pad_i - dil_i x (k_i - 1) - 1) / stride_i) + 1; 2 x N x Cout x prod(out) x Cin/groups x prod(k), + N x Cout x prod(out) for a bias; stride, padding, dilation and groups from Concrete Inputs (a trace without them: not estimated); transposed convolutions are not estimated | input + weight + bias + output |

Variable-length (packed) attention batches and sliding-window attention are not estimated; the alpha/beta scaling of `addmm` and the softmax of attention are not counted. Each kernel counts once, under the operator whose External id it carries (the innermost one open when it was launched). An operator of this table that encloses another one of them which launched kernels (`linear` around `addmm`, `scaled_dot_product_attention` around `_flash_attention_forward`) is a wrapper: it is skipped, with any kernel it launched itself, so no work is counted twice.
"""
