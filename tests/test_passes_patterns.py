"""Pattern fusion: each pattern in each written form, checked against float64 NumPy, and
refused (with the reason and the user's line) where it must be."""

from __future__ import annotations

import math

import numpy as np
import pytest
from passes_util import (
    arr,
    close,
    f64,
    fused,
    gelu64,
    ops,
    report,
    rms64,
    rope64,
    run_lazy,
    run_unfused,
    sdpa64,
    softmax64,
)

import pygpukit as gpk


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def check(fn, inputs, ref, fused_op, dtype="float32", factor=1.0):
    g = fused(fn, *inputs)
    assert fused_op in ops(g), str(g)
    (out,) = run_lazy(fn, *inputs)
    close(out, ref, dtype, factor)
    (unf,) = run_unfused(fn, *inputs)
    close(out, unf, dtype, factor)
    return g


# -- linear -----------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["plain", "bias", "bias_left", "gelu_tanh", "gelu_erf", "3d"])
def test_linear_forms(rng, form):
    x = arr(rng, 2, 5, 16) if form == "3d" else arr(rng, 5, 16)
    w, b = arr(rng, 24, 16), arr(rng, 24)

    def f(x, w, b):
        if form == "plain":
            return x @ w.T
        if form == "bias_left":
            return b + x @ w.T
        y = x @ w.T + b
        if form.startswith("gelu"):
            return gpk.nn.gelu(y, approximate="tanh" if form == "gelu_tanh" else "none")
        return y

    y64 = f64(x) @ f64(w).T
    if form != "plain":
        y64 = y64 + f64(b)
    if form.startswith("gelu"):
        y64 = gelu64(y64, "tanh" if form == "gelu_tanh" else "none")
    g = check(f, (x, w, b), y64, "linear")
    assert ops(g) == ["linear"]
    node = g.nodes[-1]
    assert node.attrs["has_bias"] == (form != "plain")
    assert node.origin.startswith("fuse_linear from")
    assert report(g, "linear", "matched")[0]["loc"].startswith("test_passes_patterns.py:")


def test_linear_refuses_untransposed_weight_and_matrix_bias(rng):
    x, w, bm = arr(rng, 5, 16), arr(rng, 16, 24), arr(rng, 5, 24)

    def f(x, w, bm):
        return x @ w + bm

    g = fused(f, x, w, bm)
    assert "linear" not in ops(g)
    (miss,) = report(g, "linear", "missed")
    assert "not transposed" in miss["reason"]
    close(run_lazy(f, x, w, bm)[0], f64(x) @ f64(w) + f64(bm))

    w2 = arr(rng, 24, 16)

    def h(x, w2, bm):
        return x @ w2.T + bm

    g = fused(h, x, w2, bm)
    assert "linear" in ops(g)  # the GEMM alone still fuses ...
    assert any("bias of shape" in r["reason"] for r in report(g, "linear", "missed"))
    close(run_lazy(h, x, w2, bm)[0], f64(x) @ f64(w2).T + f64(bm))


# -- rms_norm ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "form",
    [
        "mul",
        "pow",
        "recip_sqrt",
        "div_sqrt",
        "no_gain",
        "gain_left",
        "upcast_before_gain",
        "upcast_after_gain",
    ],  # fmt: skip
)
def test_rms_norm_forms(rng, form):
    dtype = "bfloat16" if form.startswith("upcast") else "float32"
    x, g = arr(rng, 3, 4, 32, dtype=dtype), arr(rng, 32, dtype=dtype)
    eps = 1e-5

    def f(x, g):
        xf = x.astype("float32") if form.startswith("upcast") else x
        sq = xf**2 if form == "pow" else xf * xf
        ms = sq.mean(-1, keepdims=True) + eps
        if form == "recip_sqrt":
            y = xf * (1.0 / gpk.sqrt(ms))
        elif form == "div_sqrt":
            y = xf / gpk.sqrt(ms)
        else:
            y = xf * gpk.rsqrt(ms)
        if form == "no_gain":
            return y
        if form == "gain_left":
            return g * y
        if form == "upcast_before_gain":
            return y.astype(dtype) * g
        if form == "upcast_after_gain":
            return (y * g.astype("float32")).astype(dtype)
        return y * g

    ref = rms64(f64(x), 1.0 if form == "no_gain" else f64(g), eps)
    gr = check(f, (x, g), ref, "rms_norm", dtype, factor=2)
    assert ops(gr).count("rms_norm") == 1
    assert not [n for n in gr.nodes if n.op in ("mean", "rsqrt", "sqrt")]
    (m,) = report(gr, "rms_norm", "matched")
    assert m["loc"].startswith("test_passes_patterns.py:")


def test_rms_norm_refuses_tensor_eps(rng):
    x, e = arr(rng, 4, 32), arr(rng, 1, lo=1e-3, hi=1e-2)

    def f(x, e):
        return x * gpk.rsqrt((x * x).mean(-1, keepdims=True) + e)  # the eps line

    g = fused(f, x, e)
    assert "rms_norm" not in ops(g)
    (miss,) = report(g, "rms_norm", "missed")
    assert miss["reason"] == "eps is a tensor"
    from pygpukit.passes.patterns import format_report

    line = [s for s in format_report(g.report) if s.startswith("rms_norm")][0]
    assert line.startswith("rms_norm: missed at test_passes_patterns.py:")
    assert line.endswith(", eps is a tensor")
    close(run_lazy(f, x, e)[0], f64(x) / np.sqrt((f64(x) ** 2).mean(-1, keepdims=True) + f64(e)))


def test_rms_norm_refuses_gain_that_is_not_per_feature(rng):
    x, g = arr(rng, 4, 32), arr(rng, 4, 32)

    def f(x, g):
        return x * gpk.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g

    gr = fused(f, x, g)
    assert "rms_norm" not in ops(gr)
    assert "not per-feature" in report(gr, "rms_norm", "missed")[0]["reason"]
    close(run_lazy(f, x, g)[0], rms64(f64(x), f64(g), 1e-6))


def test_rms_norm_refuses_mean_over_other_axis(rng):
    x = arr(rng, 4, 32)

    def f(x):
        return x * gpk.rsqrt((x * x).mean(0, keepdims=True) + 1e-6)

    g = fused(f, x)
    assert "rms_norm" not in ops(g)
    assert "last axis" in report(g, "rms_norm", "missed")[0]["reason"]


def _rms_residual(form, dtype, eps):
    """rms_norm(x + r) written out (HF style: fp32 upcast, downcast before the gain)."""

    def f(x, r, g):
        h = r + x if form == "residual_left" else x + r
        hf = h if form == "plain" else h.astype("float32")
        y = hf * gpk.rsqrt((hf * hf).mean(-1, keepdims=True) + eps)
        return y.astype(h.dtype) * g

    return f


@pytest.mark.parametrize(
    "form,dtype",
    [("upcast", "float32"), ("upcast", "bfloat16"), ("plain", "float32"),
     ("residual_left", "bfloat16")],
)  # fmt: skip
def test_rms_norm_with_residual_add(rng, form, dtype):
    x, r, g = (arr(rng, 3, 4, 32, dtype=dtype), arr(rng, 3, 4, 32, dtype=dtype),
               arr(rng, 32, dtype=dtype))  # fmt: skip
    eps = 1e-5
    f = _rms_residual(form, dtype, eps)
    ref = rms64(f64(x) + f64(r), f64(g), eps)
    gr = check(f, (x, r, g), ref, "rms_norm", dtype, factor=2)
    assert ops(gr) == ["rms_norm"], str(gr)  # one node: no add left
    (node,) = [n for n in gr.nodes if n.op == "rms_norm"]
    assert node.attrs["has_residual"] is True and len(node.inputs) == 3
    assert node.inputs[2].dtype.name == dtype and node.inputs[2].shape == x.shape
    assert "add" in node.origin
    (m,) = report(gr, "rms_norm", "matched")
    assert m["loc"].startswith("test_passes_patterns.py:")
    assert not report(gr, "rms_norm", "missed")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rms_norm_residual_sum_used_elsewhere(rng, dtype):
    x, r, g = (arr(rng, 3, 4, 32, dtype=dtype), arr(rng, 3, 4, 32, dtype=dtype),
               arr(rng, 32, dtype=dtype))  # fmt: skip
    norm = _rms_residual("upcast", dtype, 1e-6)

    def f(x, r, g):
        return norm(x, r, g), x + r  # the sum goes on as the residual stream

    gr = fused(f, x, r, g)
    assert ops(gr).count("rms_norm") == 1 and "add" in ops(gr), str(gr)
    (node,) = [n for n in gr.nodes if n.op == "rms_norm"]
    assert len(node.inputs) == 2 and "has_residual" not in node.attrs
    (miss,) = report(gr, "rms_norm", "missed")
    assert miss["reason"] == "the sum x + r is used elsewhere (kept as its own add)"
    assert miss["loc"].startswith("test_passes_patterns.py:")
    assert len(report(gr, "rms_norm", "matched")) == 1
    y, h = run_lazy(f, x, r, g)
    h64 = f64(x) + f64(r)
    close(y, rms64(h64, f64(g), 1e-6), dtype, 2)
    close(h, h64, dtype)
    for a, b in zip((y, h), run_unfused(f, x, r, g), strict=True):
        close(a, b, dtype, 2)


def test_rms_norm_residual_refused_forms(rng):
    x, r, g, w = arr(rng, 4, 32), arr(rng, 32), arr(rng, 32), arr(rng, 32, 16)
    norm = _rms_residual("upcast", "float32", 1e-6)

    def bcast(x, r, g):
        return norm(x, r, g)  # r broadcasts over the rows

    gr = fused(bcast, x, r, g)
    assert sorted(ops(gr)) == ["add", "rms_norm"], str(gr)
    assert "broadcasts or promotes" in report(gr, "rms_norm", "missed")[0]["reason"]
    close(run_lazy(bcast, x, r, g)[0], rms64(f64(x) + f64(r), f64(g), 1e-6))

    xr = arr(rng, 4, 16)

    def after_linear(xr, w, x, g):
        return norm(gpk.nn.linear(xr, w), x, g)  # the add folds into the linear instead

    gr = fused(after_linear, xr, w, x, g)
    assert "fold into the linear" in report(gr, "rms_norm", "missed")[0]["reason"]
    (lin,) = [n for n in gr.nodes if n.op == "linear"]
    assert lin.attrs["has_residual"]
    ref = rms64(f64(xr) @ f64(w).T + f64(x), f64(g), 1e-6)
    close(run_lazy(after_linear, xr, w, x, g)[0], ref)


def test_rms_norm_residual_shape_rule():
    from pygpukit.ir import dtypes
    from pygpukit.ir import ops as irops
    from pygpukit.ir.shapes import ShapeRuleError

    f32, bf16 = dtypes.float32, dtypes.bfloat16
    x, g = ((4, 32), f32), ((32,), f32)
    attrs = {"eps": 1e-6, "has_residual": True}
    assert irops.infer("rms_norm", [x, g, x], attrs) == ((4, 32), f32)
    assert irops.infer("rms_norm", [x, g], {"eps": 1e-6}) == ((4, 32), f32)
    for bad in (((1, 32), f32), ((4, 32), bf16)):
        with pytest.raises(ShapeRuleError, match="rms_norm") as e:
            irops.infer("rms_norm", [x, g, bad], attrs)
        assert str(list(bad[0])) in str(e.value) and "[4, 32]" in str(e.value)
    with pytest.raises(ShapeRuleError, match="rms_norm takes 3 inputs"):
        irops.infer("rms_norm", [x, g], attrs)
    with pytest.raises(ShapeRuleError, match="rms_norm takes 2 inputs"):
        irops.infer("rms_norm", [x, g, x], {"eps": 1e-6})


# -- rope -------------------------------------------------------------------------------


def _tables(rng, s, h):
    ang = rng.uniform(0, 6, size=(s, h))
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("form", ["hf_concat_tables", "hf_cos_of_concat", "halves", "interleaved",
                                  "neg_as_mul"])  # fmt: skip
def test_rope_forms(rng, form):
    x = arr(rng, 2, 3, 6, 8)
    c, s = _tables(rng, 6, 4)
    ang = np.arctan2(s, c).astype(np.float32)

    def f(x, c, s, ang):
        d = x.shape[-1]
        h = d // 2
        if form in ("hf_concat_tables", "neg_as_mul"):
            cf, sf = gpk.concatenate([c, c], -1), gpk.concatenate([s, s], -1)
        elif form == "hf_cos_of_concat":
            emb = gpk.concatenate([ang, ang], -1)
            cf, sf = gpk.cos(emb), gpk.sin(emb)
        if form.startswith("hf") or form == "neg_as_mul":
            x2 = x[..., h:] * -1.0 if form == "neg_as_mul" else -x[..., h:]
            rot = gpk.concatenate([x2, x[..., :h]], -1)
            return x * cf + rot * sf
        if form == "halves":
            x1, x2 = x[..., :h], x[..., h:]
            return gpk.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return gpk.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).reshape(x.shape)

    if form == "hf_cos_of_concat":
        c64, s64 = np.cos(f64(ang)), np.sin(f64(ang))
    else:
        c64, s64 = f64(c), f64(s)
    ref = rope64(f64(x), c64, s64, form == "interleaved")
    g = check(f, (x, c, s, ang), ref, "rope")
    node = [n for n in g.nodes if n.op == "rope"][0]
    assert node.attrs["layout"] == ("interleaved" if form == "interleaved" else "half")
    assert "concat" not in ops(g) and "mul" not in ops(g)


def test_rope_refuses_opaque_full_width_tables(rng):
    x = arr(rng, 2, 6, 8)
    cf, sf = arr(rng, 6, 8), arr(rng, 6, 8)

    def f(x, cf, sf):
        rot = gpk.concatenate([-x[..., 4:], x[..., :4]], -1)
        return x * cf + rot * sf

    g = fused(f, x, cf, sf)
    assert "rope" not in ops(g)
    assert "full-width" in report(g, "rope", "missed")[0]["reason"]
    x64 = f64(x)
    rot = np.concatenate([-x64[..., 4:], x64[..., :4]], -1)
    close(run_lazy(f, x, cf, sf)[0], x64 * f64(cf) + rot * f64(sf))


# -- swiglu, softmax ----------------------------------------------------------------------


@pytest.mark.parametrize("form", ["silu", "sigmoid", "up_left"])
def test_swiglu_forms(rng, form):
    gt, up = arr(rng, 4, 16), arr(rng, 4, 16)

    def f(g, u):
        if form == "silu":
            return gpk.nn.silu(g) * u
        if form == "up_left":
            return u * gpk.nn.silu(g)
        return g * gpk.sigmoid(g) * u

    g64 = f64(gt)
    g = check(f, (gt, up), g64 / (1 + np.exp(-g64)) * f64(up), "swiglu")
    assert ops(g) == ["swiglu"]


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_written_out(rng, axis):
    x = arr(rng, 5, 7, lo=-6, hi=6)

    def f(x):
        e = gpk.exp(x - x.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    g = check(f, (x,), softmax64(f64(x), axis), "softmax")
    assert ops(g) == ["softmax"]


def test_softmax_refuses_without_max(rng):
    x = arr(rng, 5, 7)

    def f(x):
        e = gpk.exp(x)
        return e / e.sum(-1, keepdims=True)

    g = fused(f, x)
    assert "softmax" not in ops(g)
    assert "no max subtraction" in report(g, "softmax", "missed")[0]["reason"]
    close(run_lazy(f, x)[0], softmax64(f64(x)))


# -- sdpa -------------------------------------------------------------------------------


SDPA_FORMS = ["where_hide", "where_keep", "added_mask", "div_scale", "no_mask", "fp32_softmax",
              "decode_offset", "q_scaled"]  # fmt: skip


@pytest.mark.parametrize("form", SDPA_FORMS)
def test_sdpa_forms(rng, form):
    dtype = "bfloat16" if form == "fp32_softmax" else "float32"
    sq = 3 if form == "decode_offset" else 6
    q = arr(rng, 2, 3, sq, 8, dtype=dtype)
    k, v = arr(rng, 2, 3, 6, 8, dtype=dtype), arr(rng, 2, 3, 6, 8, dtype=dtype)
    scale = 1 / math.sqrt(8)

    def f(q, k, v):
        qn, kn = q.shape[-2], k.shape[-2]
        if form == "q_scaled":
            s = (q * scale) @ k.swapaxes(-1, -2)
        else:
            raw = q @ k.swapaxes(-1, -2)
            s = raw / math.sqrt(8) if form == "div_scale" else raw * scale
        col, row = gpk.arange(kn)[None, :], gpk.arange(qn)[:, None]
        if form == "where_keep":
            s = gpk.where(col <= row, s, -math.inf)
        elif form == "added_mask":
            s = s + gpk.where(col > row, gpk.full((), -math.inf), gpk.full((), 0.0))
        elif form == "decode_offset":
            s = gpk.where(col > row + (kn - qn), -math.inf, s)
        elif form != "no_mask":
            s = gpk.where(col > row, -math.inf, s)
        if form == "fp32_softmax":
            s = s.astype("float32")
        e = gpk.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        if form == "fp32_softmax":
            p = p.astype(dtype)
        return p @ v

    ref = sdpa64(f64(q), f64(k), f64(v), form != "no_mask", scale)
    g = check(f, (q, k, v), ref, "sdpa", dtype, factor=2)
    node = [n for n in g.nodes if n.op == "sdpa"][0]
    assert node.attrs["causal"] == (form != "no_mask")
    assert "softmax" not in ops(g) and "matmul" not in ops(g)


def test_sdpa_refuses_mask_array_and_wrong_diagonal(rng):
    q, k, v = (arr(rng, 1, 2, 5, 8) for _ in range(3))
    mask = np.where(np.triu(np.ones((5, 5)), 1) > 0, -np.inf, 0).astype(np.float32)

    def f(q, k, v, m):
        e = q @ k.swapaxes(-1, -2) * 0.25 + m
        p = gpk.exp(e - e.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ v

    g = fused(f, q, k, v, mask)
    assert "sdpa" not in ops(g) and "softmax" in ops(g)
    assert "cannot be proved causal" in report(g, "sdpa", "missed")[0]["reason"]
    close(run_lazy(f, q, k, v, mask)[0], sdpa64(f64(q), f64(k), f64(v), True, 0.25))

    def h(q, k, v):
        s = q @ k.swapaxes(-1, -2)
        s = gpk.where(gpk.arange(5)[None, :] >= gpk.arange(5)[:, None], -math.inf, s)
        p = gpk.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ v

    g = fused(h, q, k, v)
    assert "sdpa" not in ops(g)
    assert "not the causal mask" in report(g, "sdpa", "missed")[0]["reason"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sdpa_decode_over_static_cache(rng, dtype):
    """A decode step as the LLM model writes it: grouped-query heads folded into the rows,
    fp32 scores, and a mask from the device position and per-row left padding. It becomes
    one sdpa with kv_len = pos + 1 and kv_start = start, read on the device."""
    b, h, kvh, s, d = 3, 4, 2, 12, 8
    q = arr(rng, b, h, 1, d, dtype=dtype)
    k, v = arr(rng, b, kvh, s, d, dtype=dtype), arr(rng, b, kvh, s, d, dtype=dtype)
    pos_v, start_v = int(rng.integers(4, s)), rng.integers(0, 4, size=b)
    pos, start = np.array(pos_v, np.int64), start_v.astype(np.int64)

    def f(q, k, v, pos, start):
        g = h // kvh
        sc = (q.reshape(b, kvh, g, d) @ k.swapaxes(-1, -2)).astype(gpk.float32)
        sc = sc.reshape(b, kvh, g, 1, s) * (1.0 / math.sqrt(d))
        j = gpk.arange(s).reshape(1, s)
        visible = ((j <= pos) & (j >= start.reshape(-1, 1))).reshape(-1, 1, 1, 1, s)
        sc = gpk.where(visible, sc, -math.inf)
        p = gpk.nn.softmax(sc, axis=-1).astype(q.dtype).reshape(b, kvh, g, s)
        return (p @ v).reshape(b, h, 1, d)

    q64, k64, v64 = f64(q), np.repeat(f64(k), h // kvh, 1), np.repeat(f64(v), h // kvh, 1)
    sc = q64 @ np.swapaxes(k64, -1, -2) / math.sqrt(d)
    j = np.arange(s)
    hidden = (j[None, :] > pos_v) | (j[None, :] < start_v[:, None])  # [b, s]
    sc = np.where(hidden[:, None, None, :], -np.inf, sc)
    ref = softmax64(sc) @ v64
    g = check(f, (q, k, v, pos, start), ref, "sdpa", dtype, factor=2)
    (node,) = [n for n in g.nodes if n.op == "sdpa"]
    assert node.attrs["kv_len"] and node.attrs["kv_start"] and not node.attrs["causal"]
    assert "softmax" not in ops(g) and "matmul" not in ops(g)


def test_sdpa_refuses_an_unprovable_bound(rng):
    """A key bound that is not an arange compared with a device scalar (here a float
    array) is reported, and the unfused program still gives the right answer."""
    q, k, v = arr(rng, 1, 2, 1, 8), arr(rng, 1, 2, 6, 8), arr(rng, 1, 2, 6, 8)
    lim = rng.standard_normal(6).astype(np.float32)

    def f(q, k, v, lim):
        sc = q @ k.swapaxes(-1, -2) * 0.25
        sc = gpk.where(gpk.arange(6).reshape(1, 6) <= lim, sc, -math.inf)
        return gpk.nn.softmax(sc, axis=-1) @ v

    g = fused(f, q, k, v, lim)
    assert "sdpa" not in ops(g)
    assert "neither causal nor a bound" in report(g, "sdpa", "missed")[0]["reason"]
    sc = f64(q) @ np.swapaxes(f64(k), -1, -2) * 0.25
    sc = np.where(np.arange(6) <= lim.astype(np.float64), sc, -np.inf)
    close(run_lazy(f, q, k, v, lim)[0], softmax64(sc) @ f64(v))


# -- gelu written out, into the GEMM epilogue ----------------------------------------------


@pytest.mark.parametrize("form", ["erf", "erf_mul", "tanh", "tanh_cube_mul"])
def test_gelu_written_out_lands_in_linear(rng, form):
    x, w, b = arr(rng, 5, 16), arr(rng, 24, 16), arr(rng, 24)

    def f(x, w, b):
        y = x @ w.T + b
        if form == "erf":
            return 0.5 * y * (1 + gpk.erf(y / math.sqrt(2)))
        if form == "erf_mul":
            return y * 0.5 * (gpk.erf(y * math.sqrt(0.5)) + 1.0)
        cube = y**3 if form == "tanh" else y * (y * y)
        return 0.5 * y * (1.0 + gpk.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * cube)))

    approx = "tanh" if form.startswith("tanh") else "none"
    ref = gelu64(f64(x) @ f64(w).T + f64(b), approx)
    g = check(f, (x, w, b), ref, "linear")
    assert ops(g) == ["linear"]
    assert g.nodes[-1].attrs["activation"] == ("gelu_tanh" if approx == "tanh" else "gelu_erf")
    assert report(g, "gelu", "matched")
