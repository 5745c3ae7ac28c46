"""fold_into_linear: an RMSNorm or SwiGLU feeding a linear and a residual add after it
become one `linear` node (prologue / epilogue), checked against float64 NumPy on fresh
random inputs in each written form, and refused where the fold would change the program."""

from __future__ import annotations

import numpy as np
import pytest
from passes_util import arr, close, f64, fused, ops, report, rms64, run_lazy, run_unfused

import pygpukit as gpk


def _silu64(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def _rms_norm(x, g):
    """The fp32-upcast RMSNorm as models write it (what fuse_rms_norm recognises)."""
    x32 = x.astype(gpk.float32)
    normed = x32 * gpk.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-5)
    return normed.astype(x.dtype) * g


def _linear_nodes(g):
    return [n for n in g.nodes if n.op == "linear"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transformer_block_folds_to_three_linears(dtype):
    """h = x + o(attn_norm(x)); out = h + down(silu(gate) * up) of mlp_norm(h): every norm,
    gate and residual add lands in a linear (the gate as the gate/up projection's SwiGLU
    epilogue, fuse_gated_linear)."""
    rng = np.random.default_rng()
    x = arr(rng, 2, 3, 32, dtype=dtype)
    g1, g2 = arr(rng, 32, dtype=dtype), arr(rng, 32, dtype=dtype)
    wo, wgu, wd = (
        arr(rng, 32, 32, dtype=dtype),
        arr(rng, 96, 32, dtype=dtype),
        arr(rng, 32, 48, dtype=dtype),
    )

    def block(x, g1, g2, wo, wgu, wd):
        h = x + gpk.nn.linear(_rms_norm(x, g1), wo)
        gu = gpk.nn.linear(_rms_norm(h, g2), wgu)
        return h + gpk.nn.linear(gpk.nn.silu(gu[..., :48]) * gu[..., 48:], wd)

    g = fused(block, x, g1, g2, wo, wgu, wd)
    lin = _linear_nodes(g)
    assert sorted(n.attrs.get("prologue", "none") for n in lin) == ["none", "rms_norm",
                                                                     "rms_norm"]  # fmt: skip
    assert [n.attrs.get("glu", "none") for n in lin].count("swiglu") == 1
    assert sum(bool(n.attrs.get("has_residual")) for n in lin) == 2
    assert not {"rms_norm", "swiglu", "add"} & set(ops(g)), ops(g)

    x64 = f64(x)
    h = x64 + rms64(x64, f64(g1), 1e-5) @ f64(wo).T
    gu = rms64(h, f64(g2), 1e-5) @ f64(wgu).T
    ref = h + (_silu64(gu[..., :48]) * gu[..., 48:]) @ f64(wd).T
    (out,) = run_lazy(block, x, g1, g2, wo, wgu, wd)
    close(out, ref, dtype, factor=4)
    (unf,) = run_unfused(block, x, g1, g2, wo, wgu, wd)
    close(out, unf, dtype, factor=4)


def test_linear_with_bias_and_gelu_keeps_them_before_the_residual():
    rng = np.random.default_rng()
    x, r = arr(rng, 5, 16), arr(rng, 5, 24)
    w, b = arr(rng, 24, 16), arr(rng, 24)

    def f(x, w, b, r):
        return r + gpk.nn.gelu(x @ w.T + b, approximate="tanh")

    g = fused(f, x, w, b, r)
    (lin,) = _linear_nodes(g)
    assert lin.attrs["has_bias"] and lin.attrs["has_residual"]
    assert lin.attrs["activation"] == "gelu_tanh" and ops(g) == ["linear"]
    y = f64(x) @ f64(w).T + f64(b)
    ref = f64(r) + 0.5 * y * (1 + np.tanh(0.7978845608028654 * (y + 0.044715 * y**3)))
    close(run_lazy(f, x, w, b, r)[0], ref)


def test_refusals_keep_the_program():
    """A norm with a second user stays a norm; a residual that broadcasts stays an add."""
    rng = np.random.default_rng()
    x, g1 = arr(rng, 4, 16), arr(rng, 16)
    w, row = arr(rng, 16, 16), arr(rng, 16)

    def f(x, g1, w, row):
        n = _rms_norm(x, g1)
        return gpk.nn.linear(n, w) + row, n * 2.0

    g = fused(f, x, g1, w, row)
    (lin,) = _linear_nodes(g)
    assert lin.attrs.get("prologue", "none") == "none" and not lin.attrs.get("has_residual")
    assert "rms_norm" in ops(g)
    missed = report(g, "linear_fold", "missed")
    assert missed and "is not the linear's" in missed[0]["reason"]
    n64 = rms64(f64(x), f64(g1), 1e-5)
    out, n2 = run_lazy(f, x, g1, w, row)
    close(out, n64 @ f64(w).T + f64(row))
    close(n2, n64 * 2)


def test_linear_shape_rule_names_the_residual():
    rng = np.random.default_rng()
    x, w, r = (gpk.from_numpy(arr(rng, *s)) for s in ((3, 8), (4, 8), (3, 5)))
    with pytest.raises(gpk.errors.ShapeError, match="residual"):
        from pygpukit import runtime

        runtime.record("linear", (x._node, w._node, r._node), {"has_residual": True})


def test_a_deep_residual_chain_folds():
    """Hundreds of residual layers (a 7B decode step is ~2000 nodes deep): the rewrite walks
    must not recurse per node, and the folded program still computes the chain."""
    rng = np.random.default_rng()
    x, g = arr(rng, 1, 8), arr(rng, 8)
    w = arr(rng, 8, 8) * np.float32(0.1)
    layers = 400

    def f(x, g, w):
        for _ in range(layers):
            x = x + gpk.nn.linear(_rms_norm(x, g), w)
        return x

    g_ = fused(f, x, g, w)
    assert ops(g_) == ["linear"] * layers
    x64, g64, w64 = f64(x), f64(g), f64(w)
    for _ in range(layers):
        x64 = x64 + rms64(x64, g64, 1e-5) @ w64.T
    close(run_lazy(f, x, g, w)[0], x64, factor=50)
