"""Folded linears on the GPU (passes/fold_into_linear.py): the tensor-core GEMV reading x
through an RMSNorm or SwiGLU prologue and adding the residual (M <= 16 rows), and the
composed path for the rest, against float64 NumPy on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import runtime

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]


def _silu(a: np.ndarray) -> np.ndarray:
    return a / (1 + np.exp(-a))


def _folded(x, w, res, pro, prologue, bias=None, activation="none"):
    ins = [x._node, w._node] + [a._node for a in (bias, res, pro) if a is not None]
    attrs = {"has_bias": bias is not None, "has_residual": res is not None,
             "prologue": prologue, "eps": 1e-5, "activation": activation}  # fmt: skip
    return gpk.GPUArray(runtime.record("linear", tuple(ins), attrs))


def _norm_chain(ws, gain):
    """x -> x + linear(rms_norm(x) * gain, w) for each w: folds into one GEMV a layer."""

    def chain(x):
        for w in ws:
            x32 = x.astype(gpk.float32)
            n = (x32 * gpk.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-5)).astype(x.dtype)
            x = x + gpk.nn.linear(n * gain, w)
        return x

    return chain


def _norm_chain_ref(x, ws, gain):
    """_norm_chain in float64 NumPy."""
    ref = x.to_numpy().astype(np.float64)
    g64 = gain.to_numpy().astype(np.float64)
    for w in ws:
        n = ref / np.sqrt((ref * ref).mean(-1, keepdims=True) + 1e-5) * g64
        ref = ref + n @ w.to_numpy().astype(np.float64).T
    return ref


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rows", [1, 4, 16, 40])
@pytest.mark.parametrize("prologue", ["none", "rms_norm", "swiglu"])
@pytest.mark.parametrize("residual", [False, True])
def test_folded_linear(dtype: str, rows: int, prologue: str, residual: bool) -> None:
    _check_folded(dtype, rows, prologue, residual, 1024)


@pytest.mark.parametrize(("rows", "k", "n"), [(1, 4608, 384), (3, 4096, 4096), (2, 2048, 5632)])
def test_folded_linear_each_geometry(rows: int, k: int, n: int) -> None:
    """Each default GEMV geometry (gemv.default_config: long rows over few or many outputs,
    short rows over many) with the RMSNorm prologue and the residual."""
    _check_folded("bfloat16", rows, "rms_norm", True, k, n)


@pytest.mark.parametrize(("k", "n"), [(5632, 2048), (2048, 2048), (2048, 2560)])
def test_folded_residual_one_row_geometry(k: int, n: int) -> None:
    """The batch-1 geometries of a projection with the residual only (gemv.default_config:
    the MLP down projection, the attention output projection, and a wider one)."""
    _check_folded("bfloat16", 1, "none", True, k, n)


def _check_folded(dtype: str, rows: int, prologue: str, residual: bool, k: int,
                  n: int = 384) -> None:  # fmt: skip
    if prologue == "none" and not residual:
        pytest.skip("a plain linear")
    rng = np.random.default_rng()

    def rnd(*shape: int, scale: float = 1.0) -> gpk.GPUArray:
        return gpk.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)

    x, w, b = rnd(rows, k), rnd(n, k, scale=k**-0.5), rnd(n)
    g = rnd(k) if prologue == "rms_norm" else rnd(rows, k) if prologue == "swiglu" else None
    r = rnd(rows, n) if residual else None
    y = _folded(x, w, r, g, prologue, bias=b, activation="silu").to_numpy()
    f = [a.to_numpy().astype(np.float64) if a is not None else None for a in (x, w, b, g, r)]
    x64, w64, b64, g64, r64 = f
    if prologue == "rms_norm":
        x64 = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * g64
    elif prologue == "swiglu":
        x64 = _silu(x64) * g64
    ref = _silu(x64 @ w64.T + b64)
    if residual:
        ref = ref + r64
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=3e-2, atol=3e-2 * scale)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rows", [1, 3, 8, 16])
@pytest.mark.parametrize("residual", [False, True])
def test_gated_linear(dtype: str, rows: int, residual: bool) -> None:
    """RMSNorm -> gate/up projection -> SwiGLU (+ residual) compiled: one GEMV writing
    silu(gate) * up up to the staged rows, the composed kernels beyond; float64 reference."""
    rng = np.random.default_rng()
    k, inter = 1024, 1536

    def rnd(*shape: int, scale: float = 1.0) -> gpk.GPUArray:
        return gpk.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)

    g, w, b = rnd(k), rnd(2 * inter, k, scale=k**-0.5), rnd(2 * inter)
    r = rnd(rows, inter)

    @gpk.compile
    def gated(h):
        h32 = h.astype(gpk.float32)
        n = (h32 * gpk.rsqrt((h32 * h32).mean(-1, keepdims=True) + 1e-5)).astype(h.dtype) * g
        gu = gpk.nn.linear(n, w, b)
        y = gpk.nn.silu(gu[..., :inter]) * gu[..., inter:]
        return y + r if residual else y

    h = rnd(rows, k)
    out = gated(h).to_numpy().astype(np.float64)
    h64, g64 = h.to_numpy().astype(np.float64), g.to_numpy().astype(np.float64)
    n64 = h64 / np.sqrt((h64 * h64).mean(-1, keepdims=True) + 1e-5) * g64
    gu64 = n64 @ w.to_numpy().astype(np.float64).T + b.to_numpy().astype(np.float64)
    ref = _silu(gu64[..., :inter]) * gu64[..., inter:]
    if residual:
        ref = ref + r.to_numpy().astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=3e-2, atol=3e-2 * float(np.abs(ref).max()))
    if rows <= 4:
        assert gated.stats()["entries"][0]["kernels"] == 1, gated.stats()["entries"][0]


def test_decode_block_compiles_to_fused_gemvs() -> None:
    """A transformer MLP block at batch 1, compiled: the graph holds two linears, and the
    result matches float64."""
    rng = np.random.default_rng()
    hdim, inter = 512, 1024

    def rnd(*shape: int, scale: float = 1.0) -> gpk.GPUArray:
        return gpk.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(
            "bfloat16"
        )

    g = rnd(hdim)
    wgu, wd = rnd(2 * inter, hdim, scale=hdim**-0.5), rnd(hdim, inter, scale=inter**-0.5)

    @gpk.compile
    def mlp(h):
        h32 = h.astype(gpk.float32)
        n = (h32 * gpk.rsqrt((h32 * h32).mean(-1, keepdims=True) + 1e-5)).astype(h.dtype) * g
        gu = gpk.nn.linear(n, wgu)
        return h + gpk.nn.linear(gpk.nn.silu(gu[..., :inter]) * gu[..., inter:], wd)

    h = rnd(1, 1, hdim)
    out = mlp(h).to_numpy().astype(np.float64)
    entry = mlp.stats()["entries"][0]
    assert entry["kernels"] == 2, entry
    h64, g64 = h.to_numpy().astype(np.float64), g.to_numpy().astype(np.float64)
    n64 = h64 / np.sqrt((h64 * h64).mean(-1, keepdims=True) + 1e-5) * g64
    gu64 = n64 @ wgu.to_numpy().astype(np.float64).T
    ref = h64 + (_silu(gu64[..., :inter]) * gu64[..., inter:]) @ wd.to_numpy().astype(np.float64).T
    np.testing.assert_allclose(out, ref, rtol=3e-2, atol=3e-2 * float(np.abs(ref).max()))


@pytest.mark.parametrize("pdl", ["1", "0"])
def test_dependent_gemv_chain(pdl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve GEMVs, each reading the one before (and the planner reusing their buffers):
    with programmatic dependent launch each starts early and waits on its predecessor, so
    a missing wait shows as wrong numbers here. Compiled (one CUDA graph) and lazy."""
    monkeypatch.setenv("PYGPUKIT_PDL", pdl)
    rng = np.random.default_rng()
    d = 512

    def rnd(*shape: int, scale: float = 1.0) -> gpk.GPUArray:
        return gpk.asarray((rng.standard_normal(shape) * scale).astype(np.float32)).astype(
            "bfloat16"
        )

    ws = [rnd(d, d, scale=d**-0.5) for _ in range(12)]
    gain = rnd(d)

    chain = _norm_chain(ws, gain)
    compiled = gpk.compile(chain)
    x = rnd(1, d)
    ref = _norm_chain_ref(x, ws, gain)
    tol = 5e-2 * float(np.abs(ref).max())
    for _ in range(3):  # the eager first call, then graph replays
        np.testing.assert_allclose(compiled(x).to_numpy().astype(np.float64), ref, atol=tol)
    np.testing.assert_allclose(chain(x).to_numpy().astype(np.float64), ref, atol=tol)


def test_read_only_weights_load_before_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read-only weights in a captured graph are read before each GEMV waits on the kernel
    ahead (gemv's w_early): the chain is right, the capture asks for early loads, the
    eager run does not, and writable weights never get them."""
    from pygpukit.backends.cuda import compile_ahead
    from pygpukit.backends.cuda.kernels import gemv

    seen: list[bool] = []
    real = gemv.gemv

    def spy(*args, **kwargs):
        if not compile_ahead.is_collecting():  # the compile-ahead dry run launches nothing
            seen.append(bool(kwargs.get("w_early")))
        return real(*args, **kwargs)

    monkeypatch.setattr(gemv, "gemv", spy)
    rng = np.random.default_rng()
    d, layers = 1024, 6
    host = [(rng.standard_normal((d, d)) * d**-0.5).astype(np.float32) for _ in range(layers)]
    gain = gpk.asarray(rng.random(d).astype(np.float32) + 0.5).astype("bfloat16")

    def run(readonly: bool) -> None:
        ws = [gpk.asarray(w).astype("bfloat16") for w in host]
        for w in ws:
            w.readonly = readonly

        compiled = gpk.compile(_norm_chain(ws, gain))
        for call in range(4):  # the eager first call, the capture, then replays
            x = gpk.asarray(rng.standard_normal((1, d)).astype(np.float32)).astype("bfloat16")
            ref = _norm_chain_ref(x, ws, gain)
            seen.clear()
            out = compiled(x).to_numpy().astype(np.float64)
            np.testing.assert_allclose(out, ref, atol=5e-2 * float(np.abs(ref).max()))
            if call == 0:  # eager, then captured: early loads only inside the capture
                assert seen == [False] * layers + [readonly] * layers

    run(readonly=True)
    run(readonly=False)
