"""gpk.nn: the neural-network ops, each recorded as one fused node of the IR."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit import errors
from pygpukit.ir import shapes, user_location

from . import runtime
from .array import ArrayLike, GPUArray, unary
from .creation import asarray
from .quant import QuantizedWeight


def _arr(x: ArrayLike) -> GPUArray:
    return x if isinstance(x, GPUArray) else asarray(x)


def _like(p: ArrayLike, x: GPUArray) -> GPUArray:
    """Parameters take the input's dtype, so the kernel reads one type."""
    return _arr(p).astype(x.dtype)


def gelu(x: ArrayLike, approximate: str = "none") -> GPUArray:
    """GELU, elementwise, with torch's names for the two forms.

    Args:
        x: A float array.
        approximate: "none" for the exact form `x * Phi(x)` (with erf), "tanh" for the tanh
            approximation.

    Returns:
        A new array of x's dtype.

    Raises:
        ValueError: `approximate` is neither "none" nor "tanh".
    """
    if approximate not in ("none", "tanh"):
        raise errors.user_error(
            errors.GPUKitValueError,
            "gelu",
            f"approximate must be 'none' or 'tanh', got {approximate!r}",
        )
    return unary("gelu", x, approximate=approximate)


def silu(x: ArrayLike) -> GPUArray:
    """SiLU (swish): `x * sigmoid(x)`, elementwise.

    Args:
        x: A float array.

    Returns:
        A new array of x's dtype.

    Raises:
        DTypeError: `x` is not a float array.
    """
    return unary("silu", x)


def swiglu(gate: ArrayLike, up: ArrayLike) -> GPUArray:
    """SwiGLU: `silu(gate) * up`, one fused kernel (the gated MLP of Llama-style models).

    Args:
        gate: The gate projection.
        up: The up projection, of the same shape.

    Returns:
        A new array.

    Raises:
        ShapeError: The shapes differ.
    """
    g, u = _arr(gate), _arr(up)
    return GPUArray(runtime.record("swiglu", (g._node, u._node)))


def _axis(op: str, x: GPUArray, axis: int) -> int:
    try:
        return shapes.normalize_axis(axis, x.ndim)
    except shapes.AxisRuleError as e:
        raise errors.op_error(op, e, [(x.shape, x.dtype)], user_location()) from None


def softmax(x: ArrayLike, axis: int = -1) -> GPUArray:
    """Softmax along `axis`: `exp(x - max) / sum(exp(x - max))`, one fused kernel.

    Args:
        x: A float array.
        axis: The axis to normalise (negative counts from the end).

    Returns:
        A new array of x's shape and dtype.

    Raises:
        AxisError: The axis is out of range.
        DTypeError: `x` is not a float array.
    """
    xa = _arr(x)
    return GPUArray(runtime.record("softmax", (xa._node,), {"axis": _axis("softmax", xa, axis)}))


def log_softmax(x: ArrayLike, axis: int = -1) -> GPUArray:
    """Log of the softmax along `axis`, computed stably (`x - max - log(sum(exp(x - max)))`).

    Args:
        x: A float array.
        axis: The axis to normalise (negative counts from the end).

    Returns:
        A new array of x's shape and dtype.

    Raises:
        AxisError: The axis is out of range.
        DTypeError: `x` is not a float array.
    """
    xa = _arr(x)
    ax = _axis("log_softmax", xa, axis)
    return GPUArray(runtime.record("log_softmax", (xa._node,), {"axis": ax}))


def rms_norm(x: ArrayLike, weight: ArrayLike, eps: float = 1e-6) -> GPUArray:
    """RMS normalisation over the last axis: `x * rsqrt(mean(x**2, -1) + eps) * weight`.

    Accumulated in float32 whatever x's dtype; one fused kernel.

    Args:
        x: A float array [..., n].
        weight: The gain [n] (cast to x's dtype).
        eps: Added to the mean square.

    Returns:
        A new array of x's shape and dtype.

    Raises:
        ShapeError: `weight` does not match the last axis.
    """
    xa = _arr(x)
    return GPUArray(runtime.record("rms_norm", (xa._node, _like(weight, xa)._node),
                                   {"eps": float(eps)}))  # fmt: skip


def layer_norm(x: ArrayLike, weight: ArrayLike, bias: ArrayLike, eps: float = 1e-5) -> GPUArray:
    """Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) * weight + bias`.

    Args:
        x: A float array [..., n].
        weight: The gain [n] (cast to x's dtype).
        bias: The shift [n] (cast to x's dtype).
        eps: Added to the variance.

    Returns:
        A new array of x's shape and dtype.

    Raises:
        ShapeError: `weight` or `bias` does not match the last axis.
    """
    xa = _arr(x)
    ins = (xa._node, _like(weight, xa)._node, _like(bias, xa)._node)
    return GPUArray(runtime.record("layer_norm", ins, {"eps": float(eps)}))


def rope(x: ArrayLike, cos: ArrayLike, sin: ArrayLike, interleaved: bool = False) -> GPUArray:
    """Rotary position embedding of `x` [..., seq, head_dim].

    Args:
        x: The queries or keys [..., seq, head_dim].
        cos: The cosine table [seq, head_dim / 2] (cast to x's dtype).
        sin: The sine table [seq, head_dim / 2].
        interleaved: False rotates the two halves of each head (GPT-NeoX, Llama in Hugging
            Face); True rotates adjacent pairs (GPT-J, the original Llama).

    Returns:
        A new array of x's shape and dtype.

    Raises:
        ShapeError: The tables do not match x's sequence length or half its head size.
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
    """Attention: `softmax(q @ k.T * scale [+ masks]) @ v` over [..., heads, seq, dim].

    GQA: k and v may have fewer heads than q, dividing them. The causal mask is aligned so
    the last query sits at key kv_len - 1 (the bottom right when the cache is full), so a
    decode query sees the whole cache. A query that sees no key gets zeros; masked keys never
    reach the result, while NaN or inf in a visible element (or a NaN scale) propagates, as
    in a float64 reference. `window` is a sliding window (Mistral's rule): the query at
    key-aligned position p = i + kv_len - seq_q sees only keys j > p - window.

    Args:
        q: The queries [..., heads, seq_q, dim].
        k: The keys [..., kv_heads, seq, dim] (cast to q's dtype).
        v: The values [..., kv_heads, seq, dim].
        is_causal: Mask keys after each query's position.
        scale: The logits' scale; None is 1/sqrt(dim), and any float, 0.0 included, is used
            as given.
        kv_len: For a static KV cache, a 0-d integer array (read on the device) masking the
            unfilled tail: keys at kv_len and after are absent. In [0, seq].
        kv_start: Per batch row, integers masking left padding: keys before it are absent.
            In [0, seq].
        window: None, or an int >= 1: each query sees only its last `window` keys.

    Returns:
        A new array [..., heads, seq_q, dim] of q's dtype.

    Raises:
        ShapeError: Shapes that do not fit (heads not divisible, dims that differ).
        DTypeError: A scale that is not a number.
        ValueError: A host kv_len or kv_start outside [0, seq] (device values are checked
            where they are read).
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


def linear(x: ArrayLike, weight: ArrayLike | QuantizedWeight, bias: ArrayLike | None = None,
           activation: str = "none") -> GPUArray:  # fmt: skip
    """`x @ weight.T (+ bias) (+ activation)`: one fused GEMM with its epilogue.

    Args:
        x: The input [..., in].
        weight: The weight [out, in], as torch's `Linear` stores it (cast to x's dtype), or
            a `pygpukit.quant.QuantizedWeight`: the node then reads its packed arrays and
            stands for `x @ dequantize(weight).T`, in x's dtype.
        bias: The bias [out], or None.
        activation: "none", "gelu_tanh", "gelu_erf" or "silu", applied in the epilogue.

    Returns:
        A new array [..., out] of x's dtype.

    Raises:
        ValueError: An unknown activation.
        ShapeError: The inner dimensions differ, or the bias does not match.
    """
    if activation not in ("none", "gelu_tanh", "gelu_erf", "silu"):
        raise errors.user_error(
            errors.GPUKitValueError, "linear", f"unknown activation {activation!r}"
        )
    xa = _arr(x)
    attrs: dict[str, Any] = {"activation": activation, "has_bias": bias is not None}
    if isinstance(weight, QuantizedWeight):
        ws = [a._node for a in (weight.data, weight.scale, weight.zero) if a is not None]
        attrs["quant"] = weight.spec.attr
    else:
        ws = [_like(weight, xa)._node]
    ins = [xa._node, *ws]
    if bias is not None:
        ins.append(_like(bias, xa)._node)
    return GPUArray(runtime.record("linear", tuple(ins), attrs))


__all__ = [
    "gelu", "layer_norm", "linear", "log_softmax", "rms_norm", "rope",
    "scaled_dot_product_attention", "silu", "softmax", "swiglu",
]  # fmt: skip


def paged_attention(
    q: ArrayLike,
    k_pool: ArrayLike,
    v_pool: ArrayLike,
    block_table: ArrayLike,
    seq_lens: ArrayLike,
    scale: float | None = None,
    pieces: bool = True,
    *,
    cos: ArrayLike | None = None,
    sin: ArrayLike | None = None,
    interleaved: bool = False,
    decode_rows: int | None = None,
) -> GPUArray:
    """Causal attention over a paged KV cache (the `paged_sdpa` op).

    q [B, H, T, D]; k_pool/v_pool [num_blocks, KV, block, D]; block_table [B, max_blocks]
    integers (row b's position p is in block block_table[b, p // block], slot p % block);
    seq_lens [B] integers (row b has keys 0..seq_lens[b]-1, this step's included). Query t
    of row b sits at position seq_lens[b] - T + t and sees the keys up to it; a query at a
    negative position (padding) gets zeros. All are device arrays, so one graph serves any
    mix of sequences. `scale` None is 1/sqrt(D). `pieces` False says no two rows are
    consecutive tokens of one prompt (every row a decode row or padding): the result is
    the same, but the CUDA backend then launches no prompt-piece kernel beside the decode
    one (the serving engine's decode-only steps).

    With cos and sin [B, D / 2] (cast to q's dtype; one query a row, T = 1), q is attended
    as rope(q, cos, sin, interleaved) with row b's tables: the serving step's query
    rotation done by the attention as it reads q (on the CUDA backend's tensor-core path:
    one launch fewer a layer).

    `decode_rows` (with pieces) is a hint: how many rows at most are not tokens of a
    prompt piece (the serving engine's decode rows and prompts finished in one token). The
    CUDA backend's decode kernel then launches that many block rows, each taking every
    decode_rows-th row, instead of one a row; every row is attended either way.
    """
    op = "paged_attention"
    if scale is not None and not isinstance(scale, int | float | np.integer | np.floating):
        raise errors.DTypeError(f"{op}: scale must be a float or None, got {scale!r}{_where()}")
    qa = _arr(q)
    ins: tuple[Any, ...] = (qa._node, _arr(k_pool)._node, _arr(v_pool)._node,
                            _arr(block_table)._node, _arr(seq_lens)._node)  # fmt: skip
    if not isinstance(pieces, bool | np.bool_):
        raise errors.DTypeError(f"{op}: pieces must be a bool, got {pieces!r}{_where()}")
    attrs: dict[str, Any] = {"scale": None if scale is None else float(scale),
                             "pieces": bool(pieces)}  # fmt: skip
    if decode_rows is not None:
        if isinstance(decode_rows, bool) or not isinstance(decode_rows, int | np.integer):
            raise errors.DTypeError(f"{op}: decode_rows must be an int or None, got "
                                    f"{decode_rows!r}{_where()}")  # fmt: skip
        if decode_rows < 1:
            raise errors.GPUKitValueError(f"{op}: decode_rows must be at least 1, got "
                                          f"{decode_rows}{_where()}")  # fmt: skip
        attrs["decode_rows"] = int(decode_rows)
    if (cos is None) != (sin is None):
        raise errors.ShapeError(f"{op}: cos and sin go together{_where()}")
    if cos is not None and sin is not None:
        attrs["rope"] = "interleaved" if interleaved else "half"
        ins = (*ins, _like(cos, qa)._node, _like(sin, qa)._node)
    elif interleaved:
        raise errors.ShapeError(f"{op}: interleaved needs cos and sin{_where()}")
    return GPUArray(runtime.record("paged_sdpa", ins, attrs, op))


def paged_write(pool: GPUArray, new: ArrayLike, slots: ArrayLike, *,
                cos: ArrayLike | None = None, sin: ArrayLike | None = None,
                rope_heads: int | None = None, interleaved: bool = False) -> None:  # fmt: skip
    """Store new [T, KV, D] into pool [num_blocks, KV, block, D] at slots [T] (slot s is
    block s // block, offset s % block; a negative slot stores nothing), in place: `pool`
    holds the new rows afterwards, as after a slice assignment (the `paged_write` op).

    With cos and sin [T, D / 2] (cast to the pool's dtype), the first rope_heads heads of
    each row (default all) are stored as rope(new, cos, sin, interleaved) stores them: a
    step's keys rotated and stored with its values in one pass over a pool that holds both
    (keys as heads [0, rope_heads), values after them)."""
    from .array import _assign, _check_writable

    op = "paged_write"
    if not isinstance(pool, GPUArray):
        raise errors.DTypeError(f"paged_write: pool must be a GPUArray, got "
                                f"{type(pool).__name__}{_where()}")  # fmt: skip
    _check_writable(pool)
    ins: tuple[Any, ...] = (pool._node, _like(new, pool)._node, _arr(slots)._node)
    attrs: dict[str, Any] = {}
    if (cos is None) != (sin is None):
        raise errors.ShapeError(f"paged_write: cos and sin go together{_where()}")
    if cos is not None and sin is not None:
        heads = pool.shape[1] if rope_heads is None else rope_heads
        if not isinstance(heads, int | np.integer) or isinstance(heads, bool):
            raise errors.DTypeError(f"paged_write: rope_heads must be an int, got "
                                    f"{rope_heads!r}{_where()}")  # fmt: skip
        attrs = {"rope": "interleaved" if interleaved else "half", "rope_heads": int(heads)}
        ins = (*ins, _like(cos, pool)._node, _like(sin, pool)._node)
    elif rope_heads is not None or interleaved:
        raise errors.ShapeError(f"paged_write: rope_heads / interleaved need cos and sin"
                                f"{_where()}")  # fmt: skip
    _assign(pool, runtime.record("paged_write", ins, attrs, op))
