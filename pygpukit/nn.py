"""gpk.nn: the neural-network ops, each recorded as one fused node of the IR."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit import errors
from pygpukit.ir import shapes, user_location

from . import runtime
from .array import ArrayLike, GPUArray, unary
from .creation import asarray


def _arr(x: ArrayLike) -> GPUArray:
    return x if isinstance(x, GPUArray) else asarray(x)


def _like(p: ArrayLike, x: GPUArray) -> GPUArray:
    """Parameters take the input's dtype, so the kernel reads one type."""
    return _arr(p).astype(x.dtype)


def gelu(x: ArrayLike, approximate: str = "none") -> GPUArray:
    """GELU; approximate='tanh' is the tanh formula, 'none' the exact erf one (torch's names)."""
    if approximate not in ("none", "tanh"):
        raise errors.user_error(
            errors.GPUKitValueError,
            "gelu",
            f"approximate must be 'none' or 'tanh', got {approximate!r}",
        )
    return unary("gelu", x, approximate=approximate)


def silu(x: ArrayLike) -> GPUArray:
    return unary("silu", x)


def swiglu(gate: ArrayLike, up: ArrayLike) -> GPUArray:
    g, u = _arr(gate), _arr(up)
    return GPUArray(runtime.record("swiglu", (g._node, u._node)))


def _axis(op: str, x: GPUArray, axis: int) -> int:
    try:
        return shapes.normalize_axis(axis, x.ndim)
    except shapes.AxisRuleError as e:
        raise errors.op_error(op, e, [(x.shape, x.dtype)], user_location()) from None


def softmax(x: ArrayLike, axis: int = -1) -> GPUArray:
    xa = _arr(x)
    return GPUArray(runtime.record("softmax", (xa._node,), {"axis": _axis("softmax", xa, axis)}))


def log_softmax(x: ArrayLike, axis: int = -1) -> GPUArray:
    xa = _arr(x)
    ax = _axis("log_softmax", xa, axis)
    return GPUArray(runtime.record("log_softmax", (xa._node,), {"axis": ax}))


def rms_norm(x: ArrayLike, weight: ArrayLike, eps: float = 1e-6) -> GPUArray:
    """x * rsqrt(mean(x^2, -1) + eps) * weight, accumulated in float32."""
    xa = _arr(x)
    return GPUArray(runtime.record("rms_norm", (xa._node, _like(weight, xa)._node),
                                   {"eps": float(eps)}))  # fmt: skip


def layer_norm(x: ArrayLike, weight: ArrayLike, bias: ArrayLike, eps: float = 1e-5) -> GPUArray:
    xa = _arr(x)
    ins = (xa._node, _like(weight, xa)._node, _like(bias, xa)._node)
    return GPUArray(runtime.record("layer_norm", ins, {"eps": float(eps)}))


def rope(x: ArrayLike, cos: ArrayLike, sin: ArrayLike, interleaved: bool = False) -> GPUArray:
    """Rotary embedding of x [..., seq, head_dim] with cos/sin tables [seq, head_dim/2].

    interleaved=False rotates the two halves (GPT-NeoX, Llama in HF); True rotates
    adjacent pairs (GPT-J, the original Llama).
    """
    xa = _arr(x)
    layout = "interleaved" if interleaved else "half"
    ins = (xa._node, _like(cos, xa)._node, _like(sin, xa)._node)
    return GPUArray(runtime.record("rope", ins, {"layout": layout}))


def scaled_dot_product_attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    is_causal: bool = False,
    scale: float | None = None,
    kv_len: ArrayLike | None = None,
    kv_start: ArrayLike | None = None,
    window: int | None = None,
) -> GPUArray:
    """softmax(q k^T * scale [+ masks]) v over [..., heads, seq, dim].

    GQA: k and v may have fewer heads, dividing q's. For a static KV cache, `kv_len` (a 0-d
    integer array, read on the device) masks the unfilled tail, and `kv_start` ([batch]
    integers) masks left padding. The causal mask is aligned so the last query sits at key
    kv_len - 1 (the bottom right when the cache is full), so a decode query sees the cache.
    A query that sees no key gets zeros; masked keys never reach the result, while NaN or
    inf in a visible element (or a NaN scale) propagates as in a float64 reference.
    `scale=None` is 1/sqrt(dim); any float, 0.0 included, is used as given. kv_len must lie
    in [0, seq] and kv_start in [0, seq] (checked here for host values, on the device for
    device arrays). `window` (an int >= 1) is a sliding window (Mistral's rule): the query at
    key-aligned position p = i + kv_len - seq_q sees only keys j > p - window.
    """
    op = "scaled_dot_product_attention"
    if scale is not None and not isinstance(scale, int | float | np.integer | np.floating):
        raise errors.DTypeError(f"{op}: scale must be a float or None, got {scale!r}"
                                f"{_where()}")  # fmt: skip
    qa = _arr(q)
    attrs: dict[str, Any] = {
        "causal": bool(is_causal),
        "scale": None if scale is None else float(scale),
    }
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int | np.integer):
            raise errors.DTypeError(f"{op}: window must be an int or None, got {window!r}"
                                    f"{_where()}")  # fmt: skip
        if window < 1:
            raise errors.GPUKitValueError(f"{op}: window must be >= 1, got {window}{_where()}")
        attrs["window"] = int(window)
    ka = _like(k, qa)
    ins: tuple[Any, ...] = (qa._node, ka._node, _like(v, qa)._node)
    seq = ka.shape[-2] if ka.ndim >= 2 else 0
    if kv_len is not None:
        _check_lengths(op, "kv_len", kv_len, seq)
        attrs["kv_len"] = True
        ins += (_arr(kv_len)._node,)
    if kv_start is not None:
        _check_lengths(op, "kv_start", kv_start, seq)
        attrs["kv_start"] = True
        ins += (_arr(kv_start)._node,)
    return GPUArray(runtime.record("sdpa", ins, attrs, op))


def _where() -> str:
    loc = user_location()
    return f"\n  at {loc.full}" if loc else ""


def _check_lengths(op: str, name: str, value: ArrayLike, seq: int) -> None:
    """Host lengths are checked at once; a GPUArray's are checked where they are read."""
    if isinstance(value, GPUArray):
        return
    a = np.asarray(value)
    if a.dtype.kind not in "iu":
        raise errors.DTypeError(f"{op}: {name} must be integers, got {a.dtype}{_where()}")
    if a.size and not (0 <= a.min() and a.max() <= seq):
        raise errors.GPUKitValueError(
            f"{op}: {name} {a.tolist()} is outside [0, {seq}] (the key length){_where()}"
        )


def linear(x: ArrayLike, weight: ArrayLike, bias: ArrayLike | None = None,
           activation: str = "none") -> GPUArray:  # fmt: skip
    """x @ weight.T (+ bias) (+ activation in none|gelu_tanh|gelu_erf|silu), one fused GEMM."""
    if activation not in ("none", "gelu_tanh", "gelu_erf", "silu"):
        raise errors.user_error(
            errors.GPUKitValueError, "linear", f"unknown activation {activation!r}"
        )
    xa = _arr(x)
    ins = [xa._node, _like(weight, xa)._node]
    if bias is not None:
        ins.append(_like(bias, xa)._node)
    attrs = {"activation": activation, "has_bias": bias is not None}
    return GPUArray(runtime.record("linear", tuple(ins), attrs))


__all__ = [
    "gelu", "layer_norm", "linear", "log_softmax", "rms_norm", "rope",
    "scaled_dot_product_attention", "silu", "softmax", "swiglu",
]  # fmt: skip
