"""The skinny GEMM (gemm_skinny.cuh: batched decode, 1-64 rows of x): every row-tile count,
K split over clusters or not, K not a multiple of a stage, N not a multiple of a tile,
strided and unaligned x and W, bias, each activation and the residual, against the float64
product rounded once to the output dtype; and the linears it is routed to, compiled and
captured, through the same check."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gpk

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
ACTS = {
    "none": lambda v: v,
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3))),
    "gelu_erf": lambda v: 0.5 * v * (1 + np.vectorize(__import__("math").erf)(v / np.sqrt(2))),
    "silu": lambda v: v / (1 + np.exp(-v)),
}


def _err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


def _tol(dtype: str) -> float:
    # One rounding to the output dtype: bf16's half-ulp is 2^-9 of a value, f16's 2^-12.
    return 4e-3 if dtype == "bfloat16" else 1e-3


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(1, 256, 512), (5, 2560, 2048), (16, 200, 520), (17, 1000, 4104), (33, 384, 5632),
     (48, 2048, 264), (64, 2560, 2048)],
)  # fmt: skip
@pytest.mark.parametrize("epilogue", ["plain", "bias_act", "residual"])
def test_gemm_against_float64(dev, rng, dtype, m, n, k, epilogue):
    from pygpukit.backends.cuda.kernels import gemm_skinny

    t = DTYPES[dtype]
    x = rng.standard_normal((m, k)).astype(t)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(t)
    b = rng.uniform(-1, 1, n).astype(t)
    r = rng.standard_normal((m, n)).astype(t)
    act = "gelu_tanh" if epilogue == "bias_act" else "none"
    y = dev.alloc(m * n * 2)
    gemm_skinny.gemm(dev.put(x), dev.put(w), y, m, n, k, dtype,
                     bias=dev.put(b) if epilogue == "bias_act" else 0, activation=act,
                     residual=dev.put(r) if epilogue == "residual" else 0)  # fmt: skip
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    if epilogue == "bias_act":
        ref = ACTS[act](ref + b.astype(np.float64))
    elif epilogue == "residual":
        ref = ref + r.astype(np.float64)
    assert _err(dev.get(y, (m, n), t), ref) <= _tol(dtype)


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("early", [False, True])
def test_strided_unaligned_and_each_activation(dev, rng, act, early):
    """x rows 24 elements apart past K, x and W 2 bytes off 16 (the element-load variant),
    a residual with its own row stride, y written with its own row stride."""
    from pygpukit.backends.cuda.kernels import gemm_skinny

    m, n, k, xs, ws, ys, rs = 20, 300, 1032, 1056, 1040, 320, 304
    x = rng.standard_normal((m, xs)).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((n, ws)) / np.sqrt(k)).astype(ml_dtypes.bfloat16)
    b = rng.uniform(-1, 1, n).astype(ml_dtypes.bfloat16)
    r = rng.standard_normal((m, rs)).astype(ml_dtypes.bfloat16)
    y = dev.alloc(m * ys * 2)
    gemm_skinny.gemm(dev.put(x, 2), dev.put(w, 2), y, m, n, k, "bfloat16", bias=dev.put(b),
                     activation=act, residual=dev.put(r), x_stride=xs, w_stride=ws,
                     y_stride=ys, residual_stride=rs, w_early=early)  # fmt: skip
    x64, w64 = x[:, :k].astype(np.float64), w[:, :k].astype(np.float64)
    ref = ACTS[act](x64 @ w64.T + b.astype(np.float64)) + r[:, :n].astype(np.float64)
    out = dev.get(y, (m, ys), ml_dtypes.bfloat16)
    assert _err(out[:, :n], ref) <= _tol("bfloat16")
    assert np.isnan(out[:, n:].astype(np.float32)).all()  # nothing written past N


def test_bad_geometry_is_an_error(dev):
    from pygpukit.backends.cuda.kernels import gemm_skinny
    from pygpukit.errors import ShapeError

    with pytest.raises(ShapeError, match="gemm_skinny"):
        gemm_skinny.gemm(dev.alloc(64), dev.alloc(64), dev.alloc(64), 65, 8, 64, "bfloat16")
    with pytest.raises(ShapeError, match="K % 8"):
        gemm_skinny.gemm(dev.alloc(64), dev.alloc(64), dev.alloc(64), 8, 8, 60, "bfloat16")


def _int8(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes over all 256 values and a float32 scale per row."""
    q = rng.integers(-128, 128, (n, k)).astype(np.int8)
    return q, (rng.uniform(0.5, 2.0, n) / (64 * np.sqrt(k))).astype(np.float32)


def _err_rounded(out: np.ndarray, ref: np.ndarray, dtype: str) -> float:
    """The error against the float64 result rounded once to the output dtype, relative
    to its norm: the kernel's own error, not the output's rounding."""
    rounded = ref.astype(DTYPES[dtype]).astype(np.float64)
    return float(np.linalg.norm(out.astype(np.float64) - rounded) / np.linalg.norm(ref))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(
    ("m", "n", "k"), [(17, 1000, 4112), (24, 200, 528), (33, 384, 5632), (64, 2560, 2048)]
)
@pytest.mark.parametrize("epilogue", ["plain", "bias_act", "residual"])
def test_int8_weight_against_float64(dev, rng, dtype, m, n, k, epilogue):
    """W int8 with a scale per row (w8a16): against the float64 product with the
    dequantized weight, within 1e-3 of it past the output's own rounding."""
    from pygpukit.backends.cuda.kernels import gemm_skinny

    t = DTYPES[dtype]
    x = rng.standard_normal((m, k)).astype(t)
    q, sc = _int8(rng, n, k)
    b = rng.uniform(-1, 1, n).astype(t)
    r = rng.standard_normal((m, n)).astype(t)
    act = "gelu_tanh" if epilogue == "bias_act" else "none"
    y = dev.alloc(m * n * 2)
    gemm_skinny.gemm(dev.put(x), dev.put(q), y, m, n, k, dtype, scale=dev.put(sc),
                     bias=dev.put(b) if epilogue == "bias_act" else 0, activation=act,
                     residual=dev.put(r) if epilogue == "residual" else 0)  # fmt: skip
    ref = x.astype(np.float64) @ (q.astype(np.float64) * sc.astype(np.float64)[:, None]).T
    if epilogue == "bias_act":
        ref = ACTS[act](ref + b.astype(np.float64))
    elif epilogue == "residual":
        ref = ref + r.astype(np.float64)
    assert _err_rounded(dev.get(y, (m, n), t), ref, dtype) <= 1e-3


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("offset", [0, 4], ids=["aligned", "unaligned"])
def test_int8_weight_strided_and_unaligned(dev, rng, early, offset):
    """An int8 W with rows 1040 bytes apart past K, 4 bytes off 16 (the element-load
    variant) or aligned, x rows strided, y and the residual with their own strides."""
    from pygpukit.backends.cuda.kernels import gemm_skinny

    m, n, k, xs, ws, ys, rs = 40, 300, 1024, 1056, 1040, 320, 304
    x = rng.standard_normal((m, xs)).astype(ml_dtypes.bfloat16)
    q, sc = _int8(rng, n, ws)
    r = rng.standard_normal((m, rs)).astype(ml_dtypes.bfloat16)
    y = dev.alloc(m * ys * 2)
    gemm_skinny.gemm(dev.put(x), dev.put(q, offset), y, m, n, k, "bfloat16",
                     scale=dev.put(sc), residual=dev.put(r), x_stride=xs, w_stride=ws,
                     y_stride=ys, residual_stride=rs, w_early=early)  # fmt: skip
    w64 = q[:, :k].astype(np.float64) * sc.astype(np.float64)[:, None]
    ref = x[:, :k].astype(np.float64) @ w64.T + r[:, :n].astype(np.float64)
    out = dev.get(y, (m, ys), ml_dtypes.bfloat16)
    assert _err_rounded(out[:, :n], ref, "bfloat16") <= 1e-3
    assert np.isnan(out[:, n:].astype(np.float32)).all()  # nothing written past N


def test_int8_weight_needs_whole_16_byte_rows(dev):
    from pygpukit.backends.cuda.kernels import gemm_skinny
    from pygpukit.errors import ShapeError

    with pytest.raises(ShapeError, match="multiples of 16"):
        gemm_skinny.gemm(dev.alloc(64), dev.alloc(64), dev.alloc(64), 24, 8, 1032, "bfloat16",
                         scale=dev.alloc(64))  # fmt: skip


@pytest.mark.parametrize("form", ["plain", "bias_gelu", "residual", "prologue_residual"])
def test_routed_linears_compiled(monkeypatch, form):
    """A decode batch of 24 rows through gpk.nn.linear, compiled and captured (read-only
    weights: early loads): each form the passes leave reaches the skinny GEMM (the RMSNorm
    prologue as its own kernel first), within one rounding of the float64 result."""
    from pygpukit.backends.cuda.kernels import gemm_skinny

    calls: list[int] = []
    real = gemm_skinny.gemm

    def spy(*a: Any, **kw: Any) -> None:
        calls.append(a[3])
        real(*a, **kw)

    monkeypatch.setattr(gemm_skinny, "gemm", spy)
    rng = np.random.default_rng()
    m, d, n = 24, 1024, 2048
    x = rng.standard_normal((m, 1, d)).astype(ml_dtypes.bfloat16)
    h = rng.standard_normal((m, 1, n)).astype(ml_dtypes.bfloat16)
    g = rng.uniform(0.5, 1.5, d).astype(ml_dtypes.bfloat16)
    b = rng.uniform(-1, 1, n).astype(ml_dtypes.bfloat16)
    wn = (rng.standard_normal((n, d)) / np.sqrt(d)).astype(ml_dtypes.bfloat16)
    w = gpk.from_numpy(wn)
    w.readonly = True

    def fn(x, h, g, b):
        if form == "plain":
            return gpk.nn.linear(x, w)
        if form == "bias_gelu":
            return gpk.nn.gelu(gpk.nn.linear(x, w, b), approximate="tanh")
        if form == "residual":
            return h + gpk.nn.linear(x, w)
        return h + gpk.nn.linear(gpk.nn.rms_norm(x, g, eps=1e-5), w)

    f = gpk.compile(fn)
    args = [gpk.from_numpy(a) for a in (x, h, g, b)]
    for _ in range(3):  # traced, captured, replayed
        out = f(*args).to_numpy()
    assert m in calls
    x64, h64, b64 = (a.astype(np.float64) for a in (x, h, b))
    if form == "prologue_residual":
        # The RMSNorm kernel's bf16 output is the GEMM's x.
        ms = (x64 * x64).mean(-1, keepdims=True)
        x64 = x64 / np.sqrt(ms + 1e-5) * g.astype(np.float64)
        x64 = x64.astype(ml_dtypes.bfloat16).astype(np.float64)
    ref = x64 @ wn.astype(np.float64).T
    if form == "bias_gelu":
        ref = ACTS["gelu_tanh"](ref + b64)
    elif form != "plain":
        ref = h64 + ref
    assert _err(out, ref) <= _tol("bfloat16")
