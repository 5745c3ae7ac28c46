"""Every kernel template against a float64 NumPy reference on a real GPU.

Inputs are fresh random data each run (the seed is printed, so a failure can be replayed
with PGK_TEST_SEED); outputs are poisoned with NaN bytes (0xFF) before each launch so an
element the kernel forgets to write fails the check.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from pygpukit.backends.cuda.kernels import (
    activation,
    argmax_topk,
    attention,
    embedding,
    gemm_mma,
    gemv,
    layer_norm,
    matmul_simple,
    rms_norm,
    rope,
    softmax,
    variants,
)

pytestmark = pytest.mark.gpu

NP = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "int8": np.int8,
    "uint8": np.uint8,
    "int32": np.int32,
    "int64": np.int64,
}
TOL = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1e-2}
FLOATS = ("float32", "float16", "bfloat16", "float64")
HALFS = ("float32", "float16", "bfloat16")


class Dev:
    """A device buffer holding one array; freed by the `dev` fixture."""

    def __init__(self, nv: Any, nbytes: int) -> None:
        self.nv = nv
        self.nbytes = max(nbytes, 16)
        self.ptr: int = nv.mem_alloc(self.nbytes)

    def get(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(NP[dtype]).itemsize
        raw = np.empty(n, np.uint8)  # plain bytes: bf16 has no buffer-protocol format
        if n:
            self.nv.memcpy_dtoh(raw, self.ptr, None, n)
        return raw.view(NP[dtype]).reshape(shape)


@pytest.fixture
def dev() -> Iterator[Any]:
    from pygpukit import _native as nv

    bufs: list[Dev] = []

    class Alloc:
        @staticmethod
        def put(a: np.ndarray) -> Dev:
            a = np.ascontiguousarray(a)
            d = Dev(nv, a.nbytes)
            if a.nbytes:
                nv.memcpy_htod(d.ptr, a.reshape(-1).view(np.uint8), None, a.nbytes)
            bufs.append(d)
            return d

        @staticmethod
        def empty(shape: tuple[int, ...], dtype: str) -> Dev:
            n = int(np.prod(shape)) * np.dtype(NP[dtype]).itemsize
            d = Dev(nv, n)
            nv.memset(d.ptr, 0xFF, d.nbytes)  # NaN in every float format
            bufs.append(d)
            return d

        @staticmethod
        def sync() -> None:
            nv.synchronize()

    yield Alloc
    nv.synchronize()
    for b in bufs:
        nv.mem_free(b.ptr)


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> Any:
    return (rng.standard_normal(shape) * scale).astype(NP[dtype])


def f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def check(out: np.ndarray, ref: np.ndarray, dtype: str, tol: float | None = None,
          scale: np.ndarray | None = None) -> None:  # fmt: skip
    """Relative error in norm; `scale` (e.g. the input) sets the magnitude where the
    output cancels to far below its inputs, as GELU's left tail does."""
    o = f64(out)
    assert o.shape == ref.shape, (o.shape, ref.shape)
    assert np.isfinite(o).all(), (
        f"non-finite output (unwritten?) at {np.argwhere(~np.isfinite(o))[:5]}"
    )
    tol = TOL[dtype] if tol is None else tol
    denom = max(float(np.linalg.norm(ref)), 1e-30)
    if scale is not None:
        denom = max(denom, float(np.linalg.norm(scale)))
    err = np.linalg.norm(o - ref) / denom
    assert err < tol, f"relative error {err:.3g} >= {tol:.3g} ({dtype})"


# ---------------------------------------------------------------- softmax


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 100), (4, 1000), (2, 8192), (3, 70001)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(
    dev: Any, rng: np.random.Generator, dtype: str, shape: tuple[int, int], log: bool
) -> None:
    rows, cols = shape
    x = rand(rng, shape, dtype, 3.0)
    xd, yd = dev.put(x), dev.empty(shape, dtype)
    softmax.softmax(xd.ptr, yd.ptr, rows, cols, dtype, log=log)
    xr = f64(x)
    z = xr - xr.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1, keepdims=True))
    ref = z - lse if log else np.exp(z - lse)
    check(yd.get(shape, dtype), ref, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_softmax_strided_rows(dev: Any, rng: np.random.Generator, dtype: str) -> None:
    rows, cols, stride = 6, 37, 50
    x = rand(rng, (rows, stride), dtype)
    xd, yd = dev.put(x), dev.empty((rows, stride), dtype)
    softmax.softmax(xd.ptr, yd.ptr, rows, cols, dtype, x_row_stride=stride, y_row_stride=stride)
    xr = f64(x)[:, :cols]
    e = np.exp(xr - xr.max(-1, keepdims=True))
    check(yd.get((rows, stride), dtype)[:, :cols], e / e.sum(-1, keepdims=True), dtype)


# ---------------------------------------------------------------- norms


@pytest.mark.parametrize("threads", [32, 128, 256, 512])
@pytest.mark.parametrize("cols", [8192, 3000])
def test_row_kernels_block_threads(
    dev: Any, rng: np.random.Generator, threads: int, cols: int
) -> None:
    """Every block size the launchers accept (register-cached and looping variants)."""
    dtype, rows = "bfloat16", 3
    x, w = rand(rng, (rows, cols), dtype), rand(rng, (cols,), dtype)
    xd, wd, yd, sd = (
        dev.put(x),
        dev.put(w),
        dev.empty((rows, cols), dtype),
        dev.empty((rows, cols), dtype),
    )
    rms_norm.rms_norm(xd.ptr, wd.ptr, yd.ptr, rows, cols, 1e-6, dtype, block_threads=threads)
    softmax.softmax(xd.ptr, sd.ptr, rows, cols, dtype, block_threads=threads)
    xr = f64(x)
    check(
        yd.get((rows, cols), dtype),
        xr / np.sqrt((xr**2).mean(-1, keepdims=True) + 1e-6) * f64(w),
        dtype,
    )
    e = np.exp(xr - xr.max(-1, keepdims=True))
    check(sd.get((rows, cols), dtype), e / e.sum(-1, keepdims=True), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cols", [1, 7, 128, 1000, 4096, 8192, 16384, 40000, 70001])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(
    dev: Any, rng: np.random.Generator, dtype: str, cols: int, residual: bool
) -> None:
    rows, eps = 5, 1e-6
    x, w = rand(rng, (rows, cols), dtype), rand(rng, (cols,), dtype)
    r = rand(rng, (rows, cols), dtype)
    xd, wd, rd = dev.put(x), dev.put(w), dev.put(r)
    yd, hd = dev.empty((rows, cols), dtype), dev.empty((rows, cols), dtype)
    rms_norm.rms_norm(
        xd.ptr,
        wd.ptr,
        yd.ptr,
        rows,
        cols,
        eps,
        dtype,
        residual=rd.ptr if residual else 0,
        h_out=hd.ptr if residual else 0,
    )
    h = (f64(x) + f64(r)).astype(NP[dtype]) if residual else x
    hr = f64(h)
    # The kernel takes eps as a float32 argument; with one column a row whose x^2 is near
    # eps sees that rounding (~1e-11 in float64), so the reference uses the same eps.
    e32 = float(np.float32(eps))
    ref = hr / np.sqrt((hr * hr).mean(-1, keepdims=True) + e32) * f64(w)
    check(yd.get((rows, cols), dtype), ref, dtype)
    if residual:
        check(hd.get((rows, cols), dtype), hr, dtype, 1e-7 if dtype == "float64" else TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cols", [8192, 3000, 70001])
def test_rms_norm_residual_without_outputs(
    dev: Any, rng: np.random.Generator, dtype: str, cols: int
) -> None:
    """The residual form with no weight and no h output (both pointers null)."""
    rows = 3
    x, r = rand(rng, (rows, cols), dtype), rand(rng, (rows, cols), dtype)
    xd, rd, yd = dev.put(x), dev.put(r), dev.empty((rows, cols), dtype)
    rms_norm.rms_norm(xd.ptr, 0, yd.ptr, rows, cols, 1e-6, dtype, residual=rd.ptr)
    hr = f64((f64(x) + f64(r)).astype(NP[dtype]))
    ref = hr / np.sqrt((hr * hr).mean(-1, keepdims=True) + 1e-6)
    check(yd.get((rows, cols), dtype), ref, dtype)


def test_rms_norm_f32_weight(dev: Any, rng: np.random.Generator) -> None:
    rows, cols = 3, 2048
    x, w = rand(rng, (rows, cols), "bfloat16"), rand(rng, (cols,), "float32")
    xd, wd, yd = dev.put(x), dev.put(w), dev.empty((rows, cols), "bfloat16")
    rms_norm.rms_norm(xd.ptr, wd.ptr, yd.ptr, rows, cols, 1e-5, "bfloat16", w_dtype="float32")
    xr = f64(x)
    check(
        yd.get((rows, cols), "bfloat16"),
        xr / np.sqrt((xr**2).mean(-1, keepdims=True) + 1e-5) * f64(w),
        "bfloat16",
    )


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cols", [1, 9, 768, 5000, 70001])
@pytest.mark.parametrize("bias", [False, True])
def test_layer_norm(dev: Any, rng: np.random.Generator, dtype: str, cols: int, bias: bool) -> None:
    rows, eps = 4, 1e-5
    x = (rand(rng, (rows, cols), dtype, 2.0).astype(np.float64) + 3.0).astype(NP[dtype])
    w, b = rand(rng, (cols,), dtype), rand(rng, (cols,), dtype)
    xd, wd, bd, yd = dev.put(x), dev.put(w), dev.put(b), dev.empty((rows, cols), dtype)
    layer_norm.layer_norm(xd.ptr, wd.ptr, bd.ptr if bias else 0, yd.ptr, rows, cols, eps, dtype)
    xr = f64(x)
    mu = xr.mean(-1, keepdims=True)
    ref = (xr - mu) / np.sqrt(((xr - mu) ** 2).mean(-1, keepdims=True) + eps) * f64(w)
    if bias:
        ref = ref + f64(b)
    tol = 1e-4 if (dtype == "float32" and cols > 60000) else None  # shifted one-pass variance
    check(yd.get((rows, cols), dtype), ref, dtype, tol)


# ---------------------------------------------------------------- rope


def rope_ref(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos0: int, interleaved: bool
) -> np.ndarray:
    xr = f64(x)
    s = xr.shape[-2]
    c, sn = f64(cos)[pos0 : pos0 + s], f64(sin)[pos0 : pos0 + s]
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
        out = np.empty_like(xr)
        out[..., 0::2] = x0 * c - x1 * sn
        out[..., 1::2] = x1 * c + x0 * sn
        return out
    half = xr.shape[-1] // 2
    x0, x1 = xr[..., :half], xr[..., half:]
    return np.concatenate([x0 * c - x1 * sn, x1 * c + x0 * sn], -1)


@pytest.mark.parametrize("dtype", HALFS)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 5, 64), (1, 2, 7, 128), (1, 1, 3, 6)])
def test_rope(
    dev: Any, rng: np.random.Generator, dtype: str, interleaved: bool, shape: tuple[int, ...]
) -> None:
    b, h, s, d = shape
    max_pos = 64
    pos0 = int(rng.integers(0, max_pos - s))
    ang = rng.uniform(0, 6.3, (max_pos, d // 2))
    cos, sin = np.cos(ang).astype(NP[dtype]), np.sin(ang).astype(NP[dtype])
    x = rand(rng, shape, dtype)
    xd, cd, sd, yd = dev.put(x), dev.put(cos), dev.put(sin), dev.empty(shape, dtype)
    pd = dev.put(np.array([pos0], np.int32))
    rope.rope(
        xd.ptr,
        yd.ptr,
        cd.ptr,
        sd.ptr,
        b,
        h,
        s,
        d,
        dtype,
        interleaved=interleaved,
        pos_offset=pd.ptr,
    )
    check(yd.get(shape, dtype), rope_ref(x, cos, sin, pos0, interleaved), dtype)


def test_rope_bshd_in_place(dev: Any, rng: np.random.Generator) -> None:
    """A [B, S, H, D] tensor rotated in place through strides, f32 tables for bf16 data."""
    b, s, h, d, dtype = 2, 9, 4, 128, "bfloat16"
    ang = rng.uniform(0, 6.3, (s, d // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    x = rand(rng, (b, s, h, d), dtype)
    xd, cd, sd = dev.put(x), dev.put(cos), dev.put(sin)
    st = (s * h * d, d, h * d)  # (batch, head, seq) strides of a [B, S, H, D] array
    rope.rope(
        xd.ptr,
        xd.ptr,
        cd.ptr,
        sd.ptr,
        b,
        h,
        s,
        d,
        dtype,
        cs_dtype="float32",
        x_strides=st,
        y_strides=st,
    )
    ref = rope_ref(x.transpose(0, 2, 1, 3), cos, sin, 0, False).transpose(0, 2, 1, 3)
    check(xd.get((b, s, h, d), dtype), ref, dtype)


# ---------------------------------------------------------------- activations


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kind", ["gelu_tanh", "gelu_erf", "silu"])
@pytest.mark.parametrize("n", [1, 7, 1000, 12345])
def test_unary(dev: Any, rng: np.random.Generator, dtype: str, kind: str, n: int) -> None:
    x = rand(rng, (n,), dtype, 3.0)
    xd, yd = dev.put(x), dev.empty((n,), dtype)
    activation.unary(kind, xd.ptr, yd.ptr, n, dtype)
    ref = {"gelu_tanh": _gelu_tanh, "gelu_erf": _gelu_erf, "silu": _silu}[kind](f64(x))
    # 0.5 x (1 + tanh(..)) cancels for x << 0: float32 is exact to eps * |x| there, not
    # to eps * |gelu(x)|; a lone element drawn in that tail made the plain check flaky.
    check(yd.get((n,), dtype), ref, dtype, scale=f64(x))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cols", [1, 13, 256, 2000])
def test_swiglu_fused_halves(dev: Any, rng: np.random.Generator, dtype: str, cols: int) -> None:
    rows = 7
    gu = rand(rng, (rows, 2 * cols), dtype, 2.0)
    gd, yd = dev.put(gu), dev.empty((rows, cols), dtype)
    isz = np.dtype(NP[dtype]).itemsize
    activation.swiglu(
        gd.ptr,
        gd.ptr + cols * isz,
        yd.ptr,
        rows,
        cols,
        dtype,
        gate_stride=2 * cols,
        up_stride=2 * cols,
    )
    g, u = f64(gu)[:, :cols], f64(gu)[:, cols:]
    check(yd.get((rows, cols), dtype), _silu(g) * u, dtype)


# ---------------------------------------------------------------- embedding


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64", "int8", "int64"])
@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
@pytest.mark.parametrize("dim", [1, 5, 64, 1000])
def test_embedding(dev: Any, rng: np.random.Generator, dtype: str, id_dtype: str, dim: int) -> None:
    vocab, n = 50, 37
    if dtype in ("int8", "int64"):
        table = rng.integers(-100, 100, (vocab, dim)).astype(NP[dtype])
    else:
        table = rand(rng, (vocab, dim), dtype)
    ids = rng.integers(-5, vocab + 5, n).astype(NP[id_dtype])
    ids[0], ids[1] = -(2**31) + 1, 2**31 - 1  # far out of range: must not fault
    td, idd, od = dev.put(table), dev.put(ids), dev.empty((n, dim), dtype)
    embedding.embedding(td.ptr, idd.ptr, od.ptr, n, dim, vocab, dtype, id_dtype=id_dtype)
    ok = (ids >= 0) & (ids < vocab)
    ref = np.zeros((n, dim), NP[dtype])
    ref[ok] = table[ids[ok]]
    out = od.get((n, dim), dtype)
    assert np.array_equal(out.view(np.uint8), ref.view(np.uint8))


# ---------------------------------------------------------------- argmax / top-k


@pytest.mark.parametrize("dtype", HALFS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (4, 1000), (2, 32000), (1, 128256)])
def test_argmax(dev: Any, rng: np.random.Generator, dtype: str, shape: tuple[int, int]) -> None:
    x = rand(rng, shape, dtype)
    x[..., -1] = x.max(-1)  # a tie with the first maximum: the lower index must win
    xd, od = dev.put(x), dev.empty((shape[0],), "int64")
    argmax_topk.argmax(xd.ptr, od.ptr, shape[0], shape[1], dtype)
    assert np.array_equal(od.get((shape[0],), "int64"), np.argmax(f64(x), -1))


@pytest.mark.parametrize("dtype", HALFS)
@pytest.mark.parametrize("start", [0, 1])
@pytest.mark.parametrize("where", ["tail", "body", "nan"])
def test_argmax_vector_rows(dev: Any, rng: np.random.Generator, dtype: str, start: int,
                            where: str) -> None:  # fmt: skip
    """Rows of 32003 in a padded stride (16-byte loads, then a scalar tail of 32003 % the
    vector), or starting one element in (unaligned: scalar loads): the maximum in the tail,
    in the vector part tied with a later copy, or a NaN (larger than every number)."""
    rows, cols = 5, 32003
    rs = 32016 + start  # start 1: rows one element off 16 bytes, and an odd stride
    buf = rand(rng, (start + rows * rs,), dtype)
    view = np.lib.stride_tricks.as_strided(buf[start:], (rows, cols), (rs * buf.itemsize,
                                                                       buf.itemsize))  # fmt: skip
    for r in range(rows):
        row = view[r]
        if where == "tail":
            row[cols - 1 - r] = row.max() + 1
        elif where == "body":
            at = int(rng.integers(0, cols - 100))
            row[at] = row[at + 7 + r] = row.max() + 1  # a tie: the lower index wins
        else:
            row[int(rng.integers(0, cols))] = np.nan
    xd, od = dev.put(buf), dev.empty((rows,), "int64")
    argmax_topk.argmax(xd.ptr + start * buf.itemsize, od.ptr, rows, cols, dtype, row_stride=rs)
    assert np.array_equal(od.get((rows,), "int64"), np.argmax(f64(view), -1))


@pytest.mark.parametrize("dtype", HALFS)
@pytest.mark.parametrize(
    "shape,k", [((1, 1), 1), ((3, 50), 5), ((2, 1000), 64), ((2, 32000), 40), ((1, 128256), 1)]
)
def test_topk(
    dev: Any, rng: np.random.Generator, dtype: str, shape: tuple[int, int], k: int
) -> None:
    rows, cols = shape
    x = rand(rng, shape, dtype)
    if cols > 10:
        x[:, 3] = x[:, 7] = x.max(-1)  # ties at the top: lower index first
    xd = dev.put(x)
    vd, idd = dev.empty((rows, k), dtype), dev.empty((rows, k), "int64")
    argmax_topk.topk(xd.ptr, vd.ptr, idd.ptr, rows, cols, k, dtype)
    xr = f64(x)
    for r in range(rows):
        order = np.lexsort((np.arange(cols), -xr[r]))[:k]
        assert np.array_equal(idd.get((rows, k), "int64")[r], order), f"row {r}"
        assert np.array_equal(f64(vd.get((rows, k), dtype)[r]), xr[r, order])


# ---------------------------------------------------------------- gemv / gemm


@pytest.mark.parametrize("dtype", HALFS)
@pytest.mark.parametrize(
    "m,n,k", [(1, 1, 1), (1, 1000, 1000), (1, 333, 777), (3, 256, 4096), (1, 5632, 2048)]
)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("unroll", [4, 8])
def test_gemv(
    dev: Any, rng: np.random.Generator, dtype: str, m: int, n: int, k: int, bias: bool, unroll: int
) -> None:
    x, w, b = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype), rand(rng, (n,), dtype)
    xd, wd, bd, yd = dev.put(x), dev.put(w), dev.put(b), dev.empty((m, n), dtype)
    gemv.gemv(xd.ptr, wd.ptr, yd.ptr, n, k, dtype, m=m, bias=bd.ptr if bias else 0, unroll=unroll)
    ref = f64(x) @ f64(w).T + (f64(b) if bias else 0.0)
    check(yd.get((m, n), dtype), ref, dtype, 1e-5 if dtype == "float32" else None)


_ACTS = {"none": lambda v: v, "gelu_tanh": _gelu_tanh, "gelu_erf": _gelu_erf, "silu": _silu}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize(
    "m,n,k",
    [(1, 1, 8), (1, 2560, 2048), (4, 333, 776), (16, 2048, 5632), (7, 40, 72), (17, 96, 264)],
)
@pytest.mark.parametrize("act", ["none", "gelu_tanh", "gelu_erf", "silu"])
def test_gemv_mma(
    dev: Any, rng: np.random.Generator, dtype: str, m: int, n: int, k: int, act: str
) -> None:
    """The tensor-core GEMV (float32: the warp-per-row fallback): 1..16 rows per launch
    tile (17 takes two), N and K tails, a row stride wider than K, bias + activation."""
    xs = k + 8
    x = rand(rng, (m, xs), dtype)
    w, b = rand(rng, (n, k), dtype), rand(rng, (n,), dtype)
    assert gemv.uses_mma(dtype, k, (xs, k), (0, 0)) == (dtype != "float32")
    xd, wd, bd, yd = dev.put(x), dev.put(w), dev.put(b), dev.empty((m, n), dtype)
    use_bias = act != "silu"
    gemv.gemv(xd.ptr, wd.ptr, yd.ptr, n, k, dtype, m=m, bias=bd.ptr if use_bias else 0,
              activation=act, x_stride=xs)  # fmt: skip
    pre = f64(x[:, :k]) @ f64(w).T + (f64(b) if use_bias else 0.0)
    check(yd.get((m, n), dtype), _ACTS[act](pre), dtype, scale=pre)


@pytest.mark.parametrize("config", variants.gemv_sweep())
def test_gemv_mma_configs(dev: Any, rng: np.random.Generator, config: Any) -> None:
    m, n, k, dtype = 5, 1000, 2056, "bfloat16"
    x, w = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype)
    xd, wd, yd = dev.put(x), dev.put(w), dev.empty((m, n), dtype)
    gemv.gemv(xd.ptr, wd.ptr, yd.ptr, n, k, dtype, m=m, config=config)
    check(yd.get((m, n), dtype), f64(x) @ f64(w).T, dtype)


@pytest.mark.parametrize("config", [(8, 1, 4, 3), (4, 2, 8, 2), (8, 3, 2, 4)])
@pytest.mark.parametrize("blocks_per_sm", [0, 1])
@pytest.mark.parametrize("w_early", [False, True])
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 11264, 2048), (3, 1000, 2056)])
def test_gemv_mma_persistent(dev: Any, rng: np.random.Generator, config: Any, blocks_per_sm: int,
                             w_early: bool, glu: bool, m: int, n: int, k: int) -> None:  # fmt: skip
    """The staged kernel over a persistent grid (one block per SM walking many tiles, N and
    K tails, odd tile counts with SwiGLU) and with W read before the predecessor wait, with
    the RMSNorm prologue, bias and residual."""
    dtype, eps = "bfloat16", 1e-5
    x, w = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype)
    gain, b = rand(rng, (k,), dtype), rand(rng, (n,), dtype)
    n_out = n // 2 if glu else n
    r = rand(rng, (m, n_out), dtype)
    xd, wd, gd, bd, rd = dev.put(x), dev.put(w), dev.put(gain), dev.put(b), dev.put(r)
    yd = dev.empty((m, n_out), dtype)
    gemv.gemv(xd.ptr, wd.ptr, yd.ptr, n, k, dtype, m=m, bias=bd.ptr, config=config,
              prologue="rms_norm", pro=gd.ptr, eps=eps, residual=rd.ptr, glu=glu,
              blocks_per_sm=blocks_per_sm, w_early=w_early)  # fmt: skip
    xf = f64(x)
    xn = xf / np.sqrt((xf**2).mean(-1, keepdims=True) + eps) * f64(gain)
    pre = xn @ f64(w).T + f64(b)
    out = _silu(pre[:, :n_out]) * pre[:, n_out:] if glu else pre
    check(yd.get((m, n_out), dtype), out + f64(r), dtype, scale=out)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,n,k", [(1, 1, 8), (130, 67, 72), (256, 384, 512), (77, 200, 1000)])
@pytest.mark.parametrize("act", ["none", "gelu_tanh", "gelu_erf", "silu"])
def test_gemm_mma(
    dev: Any, rng: np.random.Generator, dtype: str, m: int, n: int, k: int, act: str
) -> None:
    a, b, bias = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype), rand(rng, (n,), dtype)
    ad, bd, biasd, cd = dev.put(a), dev.put(b), dev.put(bias), dev.empty((m, n), dtype)
    use_bias = act != "silu"
    gemm_mma.gemm(
        ad.ptr, bd.ptr, cd.ptr, m, n, k, dtype, bias=biasd.ptr if use_bias else 0, activation=act
    )
    pre = f64(a) @ f64(b).T + (f64(bias) if use_bias else 0.0)
    # GELU's left tail cancels to far below its input (1 + erf(x) in float32): with a 1x1
    # output one such element made the plain relative check fail (seen on an H200), so the
    # error is measured against the pre-activation scale as in test_unary.
    check(cd.get((m, n), dtype), _ACTS[act](pre), dtype, scale=pre)


def test_gemm_mma_batched_broadcast(dev: Any, rng: np.random.Generator) -> None:
    dtype, batch, m, n, k = "bfloat16", 3, 100, 136, 264
    a, b = rand(rng, (batch, m, k), dtype), rand(rng, (n, k), dtype)
    ad, bd, cd = dev.put(a), dev.put(b), dev.empty((batch, m, n), dtype)
    gemm_mma.gemm(
        ad.ptr, bd.ptr, cd.ptr, m, n, k, dtype, batch=batch, a_batch_stride=m * k, b_batch_stride=0
    )
    check(cd.get((batch, m, n), dtype), f64(a) @ f64(b).T, dtype)


@pytest.mark.parametrize("dtype", list(NP))
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (65, 33, 70), (128, 64, 200)])
def test_matmul_simple(
    dev: Any, rng: np.random.Generator, dtype: str, m: int, n: int, k: int
) -> None:
    if dtype in FLOATS:
        a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
    else:
        info = np.iinfo(NP[dtype])
        lo, hi = max(info.min, -1000), min(info.max, 1000)
        a = rng.integers(lo, hi, (m, k)).astype(NP[dtype])
        b = rng.integers(lo, hi, (k, n)).astype(NP[dtype])
    ad, bd, cd = dev.put(a), dev.put(b), dev.empty((m, n), dtype)
    matmul_simple.matmul(ad.ptr, bd.ptr, cd.ptr, m, n, k, dtype)
    out = cd.get((m, n), dtype)
    if dtype in FLOATS:
        check(out, f64(a) @ f64(b), dtype, 1e-6 if dtype == "float32" else None)
    else:  # exact, with NumPy's wrap-around
        ref = (a.astype(np.int64) @ b.astype(np.int64)).astype(NP[dtype])
        assert np.array_equal(out, ref)


@pytest.mark.parametrize("dtype", ["float32", "int32", "bfloat16"])
def test_matmul_simple_broadcast_transposed(dev: Any, rng: np.random.Generator, dtype: str) -> None:
    """[2, 1, M, K] @ [1, 3, K, N] with B given as a transposed [N, K] view: no copies."""
    m, n, k = 19, 23, 31
    if dtype == "int32":
        a = rng.integers(-50, 50, (2, 1, m, k)).astype(np.int32)
        bt = rng.integers(-50, 50, (1, 3, n, k)).astype(np.int32)
    else:
        a, bt = rand(rng, (2, 1, m, k), dtype), rand(rng, (1, 3, n, k), dtype)
    ad, bd, cd = dev.put(a), dev.put(bt), dev.empty((2, 3, m, n), dtype)
    matmul_simple.matmul(
        ad.ptr,
        bd.ptr,
        cd.ptr,
        m,
        n,
        k,
        dtype,
        batch_shape=(2, 3),
        b_strides=(1, k),
        a_batch_strides=(m * k, 0),
        b_batch_strides=(0, n * k),
        c_batch_strides=(3 * m * n, m * n),
    )
    out = cd.get((2, 3, m, n), dtype)
    if dtype == "int32":
        assert np.array_equal(
            out, (a.astype(np.int64) @ bt.astype(np.int64).swapaxes(-1, -2)).astype(np.int32)
        )
    else:
        check(out, f64(a) @ f64(bt).swapaxes(-1, -2), dtype, 1e-6 if dtype == "float32" else None)


# ---------------------------------------------------------------- attention


def attn_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float) -> np.ndarray:
    qr, kr, vr = f64(q), f64(k), f64(v)
    h, kvh = qr.shape[1], kr.shape[1]
    kr = np.repeat(kr, h // kvh, axis=1)
    vr = np.repeat(vr, h // kvh, axis=1)
    s = qr @ kr.swapaxes(-1, -2) * scale
    sq, sk = s.shape[-2], s.shape[-1]
    if causal:
        mask = np.arange(sk)[None, :] > np.arange(sq)[:, None] + (sk - sq)
        s = np.where(mask, -np.inf, s)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ vr


@pytest.mark.parametrize("dtype", HALFS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    "sq,sk,causal", [(37, 37, True), (5, 50, True), (33, 70, False), (1, 1, True)]
)
def test_attention_prefill(
    dev: Any, rng: np.random.Generator, dtype: str, d: int, sq: int, sk: int, causal: bool
) -> None:
    b, h, kvh = 2, 4, 2
    q, k, v = (
        rand(rng, (b, h, sq, d), dtype),
        rand(rng, (b, kvh, sk, d), dtype),
        rand(rng, (b, kvh, sk, d), dtype),
    )
    qd, kd, vd, od = dev.put(q), dev.put(k), dev.put(v), dev.empty((b, h, sq, d), dtype)
    scale = d**-0.5
    attention.prefill(
        qd.ptr, kd.ptr, vd.ptr, od.ptr, b, h, kvh, sq, sk, d, dtype, scale=scale, causal=causal
    )
    check(
        od.get((b, h, sq, d), dtype),
        attn_ref(q, k, v, causal, scale),
        dtype,
        2e-5 if dtype == "float32" else None,
    )


# The two ways several splits merge: the last split block (given counters), a second kernel.
MERGES = ("last_block", "kernel")


class _Counters:
    """Zeroed arrival counters for last-block merges, or none (ptr 0: the merge kernel)."""

    def __init__(self, dev: Any, b: int, h: int, kvh: int, merge: str = "last_block") -> None:
        self.dev = dev
        self.n = attention.decode_counters(b, h, kvh)
        self.buf = dev.put(np.zeros(self.n, np.uint32)) if merge == "last_block" else None
        self.ptr = self.buf.ptr if self.buf is not None else 0

    def assert_zero(self) -> None:
        """Every launch must leave its counters at 0 for the next launch or graph replay."""
        if self.buf is not None:
            self.dev.sync()
            assert np.all(self.buf.get((self.n,), "int32") == 0)


def _decode_bufs(
    dev: Any, b: int, h: int, kvh: int, d: int, splits: int, merge: str = "last_block"
) -> tuple[int, _Counters]:
    """(workspace pointer, counters) for a decode launch with `splits`."""
    ws = dev.empty((attention.decode_workspace_bytes(b, h, splits, d) // 4,), "float32")
    return ws.ptr, _Counters(dev, b, h, kvh, merge)


@pytest.mark.parametrize("dtype", HALFS)
@pytest.mark.parametrize("h,kvh,d", [(8, 2, 128), (4, 4, 64), (32, 1, 128), (12, 3, 64)])
def test_attention_decode_ctx_from_device(
    dev: Any, rng: np.random.Generator, dtype: str, h: int, kvh: int, d: int
) -> None:
    """One launch configuration (fixed splits) serves every context length: only the int32
    in device memory changes, as it would between replays of a captured graph."""
    b, max_seq = 2, 300
    q = rand(rng, (b, h, d), dtype)
    kc, vc = rand(rng, (b, kvh, max_seq, d), dtype), rand(rng, (b, kvh, max_seq, d), dtype)
    qd, kd, vd, od = dev.put(q), dev.put(kc), dev.put(vc), dev.empty((b, h, d), dtype)
    splits = attention.decode_splits(b, h, kvh, max_seq, dtype)
    ws, ctr = _decode_bufs(dev, b, h, kvh, d, splits)
    from pygpukit import _native as nv

    ctx = dev.put(np.array([0], np.int32))
    for n in (1, 63, 64, 65, 257, 300):
        nv.memcpy_htod(ctx.ptr, np.array([n], np.int32), None, 4)
        nv.memset(od.ptr, 0xFF, od.nbytes)
        attention.decode(qd.ptr, kd.ptr, vd.ptr, ctx.ptr, od.ptr, ws, b, h, kvh, max_seq, d,
                         dtype, splits=splits, counters=ctr.ptr)  # fmt: skip
        ref = attn_ref(q[:, :, None], kc[:, :, :n], vc[:, :, :n], False, d**-0.5)[:, :, 0]
        check(od.get((b, h, d), dtype), ref, dtype, 2e-5 if dtype == "float32" else None)
    ctr.assert_zero()


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("max_seq", [128, 512, 4096])
def test_attention_decode_graph_replay(
    dev: Any, rng: np.random.Generator, max_seq: int, merge: str, early: bool
) -> None:
    """Capture three decode launches in one CUDA graph (as consecutive layers would be, each
    a programmatic dependent of the one before), two of them sharing one set of arrival
    counters, then replay it for changing context lengths: every replay finds the counters
    zeroed again. max_seq 128 runs one split (no merge), the others several. early: the
    caches are written before the graph, so each launch fills its stages before the wait
    (kv_early)."""
    from pygpukit import _native as nv

    dtype, b, h, kvh, d, n_launch = "bfloat16", 1, 32, 4, 128, 3
    splits = attention.decode_splits(b, h, kvh, max_seq, dtype)
    assert (splits == 1) == (max_seq == 128)
    qs = [rand(rng, (b, h, d), dtype) for _ in range(n_launch)]
    kcs = [rand(rng, (b, kvh, max_seq, d), dtype) for _ in range(n_launch)]
    vcs = [rand(rng, (b, kvh, max_seq, d), dtype) for _ in range(n_launch)]
    qd, kd, vd = ([dev.put(x) for x in xs] for xs in (qs, kcs, vcs))
    od = [dev.empty((b, h, d), dtype) for _ in range(n_launch)]
    bufs = [_decode_bufs(dev, b, h, kvh, d, splits, merge) for _ in range(2)]
    use = [bufs[0], bufs[0], bufs[1]]
    ctx = dev.put(np.array([1], np.int32))
    start = dev.put(np.array([0], np.int32))
    stream = nv.Stream()

    def step() -> None:
        for i in range(n_launch):
            attention.decode(qd[i].ptr, kd[i].ptr, vd[i].ptr, ctx.ptr, od[i].ptr, use[i][0], b,
                             h, kvh, max_seq, d, dtype, splits=splits, counters=use[i][1].ptr,
                             kv_start=start.ptr, kv_early=early, stream=stream)  # fmt: skip

    step()  # compile and load outside the capture
    stream.synchronize()
    stream.begin_capture()
    step()
    graph = stream.end_capture().instantiate()
    for rep, n in enumerate((5, max_seq // 3, max_seq - 1, max_seq, 77 % max_seq + 1)):
        lo = rep % 3 * 2  # a left-padding start in some replays
        nv.memcpy_htod(ctx.ptr, np.array([n], np.int32), None, 4)
        nv.memcpy_htod(start.ptr, np.array([lo], np.int32), None, 4)
        for o in od:
            nv.memset(o.ptr, 0xFF, o.nbytes)
        graph.launch(stream)
        stream.synchronize()
        for i in range(n_launch):
            ref = _masked_decode_ref(qs[i], kcs[i], vcs[i], np.array([min(lo, n)]), n, d**-0.5)
            check(od[i].get((b, h, d), dtype), ref, dtype)
        for _, ctr in bufs:
            ctr.assert_zero()


@pytest.mark.parametrize("max_seq", [128, 4096])
def test_attention_decode_early_guess_rechecked(
    dev: Any, rng: np.random.Generator, max_seq: int
) -> None:
    """kv_early reads the live length before the programmatic-launch wait as a guess. Here
    the kernel just ahead in the graph (an argmax, itself a programmatic dependent) writes
    that length, so the guess is taken while it may still be the previous replay's: the
    kernel must check it after the wait and refill its stages for the range it finds."""
    from pygpukit import _native as nv

    dtype, b, h, kvh, d = "bfloat16", 1, 32, 4, 128
    splits = attention.decode_splits(b, h, kvh, max_seq, dtype)
    q = rand(rng, (b, h, d), dtype)
    kc, vc = rand(rng, (b, kvh, max_seq, d), dtype), rand(rng, (b, kvh, max_seq, d), dtype)
    qd, kd, vd, od = dev.put(q), dev.put(kc), dev.put(vc), dev.empty((b, h, d), dtype)
    ws, ctr = _decode_bufs(dev, b, h, kvh, d, splits, "kernel")
    scores = dev.empty((max_seq,), "float32")
    length = dev.put(np.array([max_seq], np.int64))  # argmax writes an int64
    stream = nv.Stream()

    def step() -> None:
        argmax_topk.argmax(scores.ptr, length.ptr, 1, max_seq, "float32", stream=stream)
        attention.decode(qd.ptr, kd.ptr, vd.ptr, length.ptr, od.ptr, ws, b, h, kvh, max_seq, d,
                         dtype, splits=splits, counters=ctr.ptr, kv_early=True,
                         stream=stream)  # fmt: skip

    nv.memcpy_htod(scores.ptr, rng.standard_normal(max_seq).astype(np.float32), None,
                   4 * max_seq)  # fmt: skip
    step()  # compile and load outside the capture
    stream.synchronize()
    stream.begin_capture()
    step()
    graph = stream.end_capture().instantiate()
    for n in (max_seq - 1, 3, max_seq // 2 + 5, 40, max_seq - 7):
        row = rng.standard_normal(max_seq).astype(np.float32)
        row[n] = 100.0  # the argmax, so the length this replay attends over
        nv.memcpy_htod(scores.ptr, row, None, 4 * max_seq)
        nv.memset(od.ptr, 0xFF, od.nbytes)
        graph.launch(stream)
        stream.synchronize()
        ref = attn_ref(q[:, :, None], kc[:, :, :n], vc[:, :, :n], False, d**-0.5)[:, :, 0]
        check(od.get((b, h, d), dtype), ref, dtype)


def _masked_decode_ref(
    q: np.ndarray, kc: np.ndarray, vc: np.ndarray, lo: np.ndarray, hi: int, scale: float
) -> np.ndarray:
    """float64 decode attention where batch b sees keys [lo[b], hi); none visible: zeros."""
    out = np.zeros(q.shape, np.float64)
    for b in range(q.shape[0]):
        if lo[b] < hi:
            out[b] = attn_ref(
                q[b : b + 1, :, None], kc[b : b + 1, :, lo[b] : hi], vc[b : b + 1, :, lo[b] : hi],
                False, scale,
            )[0, :, 0]  # fmt: skip
    return out


@pytest.mark.parametrize("dtype", HALFS)
@pytest.mark.parametrize("idx", ["int32", "int64"])
@pytest.mark.parametrize("blocks_per_sm", [1, 2, 3])
def test_attention_decode_kv_start_and_len(
    dev: Any, rng: np.random.Generator, dtype: str, idx: str, blocks_per_sm: int
) -> None:
    """Left padding (kv_start per batch row) and the live length, both read from device
    memory (int32 or int64), on a cache much longer than the live context; starts past
    the length give zeros."""
    b, h, kvh, d, max_seq = 3, 8, 2, 128, 2048
    q = rand(rng, (b, h, d), dtype)
    kc, vc = rand(rng, (b, kvh, max_seq, d), dtype), rand(rng, (b, kvh, max_seq, d), dtype)
    qd, kd, vd, od = dev.put(q), dev.put(kc), dev.put(vc), dev.empty((b, h, d), dtype)
    splits = attention.decode_splits(b, h, kvh, max_seq, dtype, blocks_per_sm=blocks_per_sm)
    stages = attention.decode_stages(dtype, d, blocks_per_sm)
    ws, ctr = _decode_bufs(dev, b, h, kvh, d, splits)
    from pygpukit import _native as nv

    n_d, st_d = dev.put(np.zeros((), idx)), dev.put(np.zeros((b,), idx))
    cases = [(int(rng.integers(1, max_seq + 1)), rng.integers(0, 40, b)) for _ in range(3)]
    cases += [(5, np.array([0, 4, 9])), (max_seq, np.array([0, 1, 2000])), (0, np.zeros(b))]
    for n, starts in cases:
        nn = np.array([n], idx)
        nv.memcpy_htod(n_d.ptr, nn.view(np.uint8), None, nn.nbytes)
        st = np.asarray(starts, idx)
        nv.memcpy_htod(st_d.ptr, st.view(np.uint8), None, st.nbytes)
        nv.memset(od.ptr, 0xFF, od.nbytes)
        attention.decode(qd.ptr, kd.ptr, vd.ptr, n_d.ptr, od.ptr, ws, b, h, kvh, max_seq, d,
                         dtype, splits=splits, stages=stages, kv_start=st_d.ptr,
                         kv_start_dtype=idx, counters=ctr.ptr)  # fmt: skip
        lo = np.minimum(st.astype(np.int64), n)
        ref = _masked_decode_ref(q, kc, vc, lo, n, d**-0.5)
        out = od.get((b, h, d), dtype)
        if n == 0:
            assert np.all(f64(out) == 0.0)
            continue
        check(out, ref, dtype, 2e-5 if dtype == "float32" else None)
    ctr.assert_zero()


@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("dtype", HALFS)
@pytest.mark.parametrize("splits", [1, 2, 7, 37, 256])
def test_attention_decode_many_splits(
    dev: Any, rng: np.random.Generator, dtype: str, splits: int, merge: str
) -> None:
    """Split counts off the merge's pipeline depth, splits that get no keys (a whole-cache
    launch with no length pointer, 256 splits of 1000 keys), and the same launch repeated
    with one set of counters on fresh inputs."""
    b, h, kvh, d, max_seq = 2, 4, 4, 64, 1000
    kc, vc = rand(rng, (b, kvh, max_seq, d), dtype), rand(rng, (b, kvh, max_seq, d), dtype)
    kd, vd, od = dev.put(kc), dev.put(vc), dev.empty((b, h, d), dtype)
    ws, ctr = _decode_bufs(dev, b, h, kvh, d, splits, merge)
    for _ in range(3):
        q = rand(rng, (b, h, d), dtype)
        qd = dev.put(q)
        attention.decode(qd.ptr, kd.ptr, vd.ptr, 0, od.ptr, ws, b, h, kvh, max_seq, d, dtype,
                         splits=splits, counters=ctr.ptr)  # fmt: skip
        ref = attn_ref(q[:, :, None], kc, vc, False, d**-0.5)[:, :, 0]
        check(od.get((b, h, d), dtype), ref, dtype, 2e-5 if dtype == "float32" else None)
    ctr.assert_zero()


@pytest.mark.parametrize("dtype", HALFS)
@pytest.mark.parametrize("splits,merge", [(1, "none"), (5, "last_block"), (5, "kernel")])
def test_attention_decode_one_vs_many_splits(
    dev: Any, rng: np.random.Generator, dtype: str, splits: int, merge: str
) -> None:
    """The TinyLlama head layout (32 query heads over 4 kv heads) with left padding and
    different live lengths: one split normalises in the split kernel (no workspace, no
    counters), several merge in the last block or in the merge kernel."""
    b, h, kvh, d, max_seq = 2, 32, 4, 128, 256
    q = rand(rng, (b, h, d), dtype)
    kc, vc = rand(rng, (b, kvh, max_seq, d), dtype), rand(rng, (b, kvh, max_seq, d), dtype)
    qd, kd, vd, od = dev.put(q), dev.put(kc), dev.put(vc), dev.empty((b, h, d), dtype)
    from pygpukit import _native as nv

    if splits == 1:
        ws, ctr = 0, _Counters(dev, b, h, kvh, "none")
    else:
        ws, ctr = _decode_bufs(dev, b, h, kvh, d, splits, merge)
    n_d, st_d = dev.put(np.zeros(1, np.int32)), dev.put(np.zeros(b, np.int32))
    for n, starts in ((256, (3, 0)), (100, (0, 17)), (31, (30, 5)), (40, (40, 2))):
        nv.memcpy_htod(n_d.ptr, np.array([n], np.int32), None, 4)
        nv.memcpy_htod(st_d.ptr, np.array(starts, np.int32), None, 4 * b)
        nv.memset(od.ptr, 0xFF, od.nbytes)
        attention.decode(qd.ptr, kd.ptr, vd.ptr, n_d.ptr, od.ptr, ws, b, h, kvh, max_seq, d,
                         dtype, splits=splits, counters=ctr.ptr,
                         kv_start=st_d.ptr)  # fmt: skip
        ref = _masked_decode_ref(q, kc, vc, np.array(starts), n, d**-0.5)
        check(od.get((b, h, d), dtype), ref, dtype, 2e-5 if dtype == "float32" else None)
    if ctr is not None:
        ctr.assert_zero()


def test_attention_decode_needs_workspace() -> None:
    """Several splits without a (16-byte aligned) workspace, or with misaligned counters:
    a clear error before any launch."""
    from pygpukit.errors import ShapeError

    args = (16, 16, 16, 0, 16)
    with pytest.raises(ShapeError, match=r"attention_decode: splits=4 needs .* workspace"):
        attention.decode(*args, 0, 1, 8, 2, 512, 128, "bfloat16", splits=4)
    with pytest.raises(ShapeError, match=r"attention_decode: splits=4 needs .* workspace"):
        attention.decode(*args, 8, 1, 8, 2, 512, 128, "bfloat16", splits=4)
    with pytest.raises(ShapeError, match=r"attention_decode: splits=4 needs .* counters"):
        attention.decode(*args, 16, 1, 8, 2, 512, 128, "bfloat16", splits=4, counters=18)
