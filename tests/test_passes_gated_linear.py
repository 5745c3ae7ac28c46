"""fuse_gated_linear: a gate/up projection whose two halves feed SwiGLU becomes one linear
with glu="swiglu", checked against float64 NumPy on fresh random inputs in each written
form, and refused where its halves are not the projection's two halves or live on."""

from __future__ import annotations

import numpy as np
import pytest
from passes_util import arr, close, f64, fused, ops, report, run_lazy

import pygpukit as gpk
from pygpukit.ir import dtypes
from pygpukit.ir import ops as irops
from pygpukit.ir.shapes import ShapeRuleError


def _silu64(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def _gated(g):
    return [n for n in g.nodes if n.op == "linear" and n.attrs.get("glu") == "swiglu"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("form", ["silu", "sigmoid", "bias"])
def test_gate_up_projection_takes_its_swiglu(dtype, form):
    rng = np.random.default_rng()
    inter = 24
    x, w, b = (
        arr(rng, 2, 3, 16, dtype=dtype),
        arr(rng, 2 * inter, 16, dtype=dtype),
        arr(rng, 2 * inter, dtype=dtype),
    )

    def mlp(x, w, b):
        gu = gpk.nn.linear(x, w, b if form == "bias" else None)
        g, u = gu[..., :inter], gu[..., inter:]
        if form == "sigmoid":
            return g * gpk.sigmoid(g) * u
        return gpk.nn.silu(g) * u

    g = fused(mlp, x, w, b)
    assert len(_gated(g)) == 1 and "swiglu" not in ops(g) and "index" not in ops(g), ops(g)
    assert report(g, "gated_linear", "matched")
    gu = f64(x) @ f64(w).T + (f64(b) if form == "bias" else 0.0)
    ref = _silu64(gu[..., :inter]) * gu[..., inter:]
    (out,) = run_lazy(mlp, x, w, b)
    assert out.shape == ref.shape
    close(out, ref, dtype, factor=4)


def test_residual_and_norm_fold_around_the_gated_projection():
    """h + gated(rms_norm(h)) -> one linear with the RMSNorm prologue, the SwiGLU and the
    residual (fold_into_linear runs after)."""
    rng = np.random.default_rng()
    x, gain, w = arr(rng, 1, 32), arr(rng, 32), arr(rng, 64, 32)

    def block(x, gain, w):
        x32 = x.astype(gpk.float32)
        n = (x32 * gpk.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-5)) * gain
        gu = gpk.nn.linear(n, w)
        return x + gpk.nn.silu(gu[..., :32]) * gu[..., 32:]

    g = fused(block, x, gain, w)
    (lin,) = _gated(g)
    assert lin.attrs.get("prologue") == "rms_norm" and lin.attrs.get("has_residual"), lin.attrs
    x64 = f64(x)
    n64 = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * f64(gain)
    gu = n64 @ f64(w).T
    (out,) = run_lazy(block, x, gain, w)
    close(out, x64 + _silu64(gu[..., :32]) * gu[..., 32:], "float32", factor=4)


def test_uneven_split_is_refused_with_a_reason():
    rng = np.random.default_rng()
    x, w = arr(rng, 2, 16), arr(rng, 40, 16)

    def mlp(x, w):
        gu = gpk.nn.linear(x, w)
        return gpk.nn.silu(gu[..., :16]) * gu[..., 16:32]

    g = fused(mlp, x, w)
    assert not _gated(g)
    missed = report(g, "gated_linear", "missed")
    assert missed and "not the two halves" in missed[0]["reason"]
    gu = f64(x) @ f64(w).T
    (out,) = run_lazy(mlp, x, w)
    close(out, _silu64(gu[..., :16]) * gu[..., 16:32])


def test_a_half_used_elsewhere_keeps_the_projection():
    rng = np.random.default_rng()
    x, w = arr(rng, 2, 16), arr(rng, 32, 16)

    def mlp(x, w):
        gu = gpk.nn.linear(x, w)
        g = gu[..., :16]
        return gpk.nn.silu(g) * gu[..., 16:], g

    g = fused(mlp, x, w)
    assert not _gated(g)
    assert "another user" in report(g, "gated_linear", "missed")[0]["reason"]
    gu = f64(x) @ f64(w).T
    out, gate = run_lazy(mlp, x, w)
    close(out, _silu64(gu[..., :16]) * gu[..., 16:])
    close(gate, gu[..., :16])


def test_gated_linear_shape_rule():
    f32 = dtypes.as_dtype("float32")
    shape, _ = irops.infer("linear", [((3, 8), f32), ((10, 8), f32)], {"glu": "swiglu"})
    assert shape == (3, 5)
    with pytest.raises(ShapeRuleError, match="even width"):
        irops.infer("linear", [((3, 8), f32), ((9, 8), f32)], {"glu": "swiglu"})
    with pytest.raises(ShapeRuleError, match="no activation"):
        irops.infer("linear", [((3, 8), f32), ((10, 8), f32)],
                    {"glu": "swiglu", "activation": "gelu_tanh"})  # fmt: skip
