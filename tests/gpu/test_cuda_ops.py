"""Every front-end op on the CUDA backend against float64 NumPy and the NumPy backend.

Each case runs three ways -- CUDA lazy, CUDA eager, NumPy backend -- on fresh random
inputs (seed printed; PGK_TEST_SEED replays), with every output allocation poisoned
(0xFF bytes: NaN / -1) so an element a kernel forgets to write fails the check.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gpk
import pygpukit.backends as backends
from pygpukit import runtime

pytestmark = pytest.mark.gpu

FLOATS = ["float32", "float16", "bfloat16", "float64"]
INTS = ["int8", "uint8", "int32", "int64"]
ALL = FLOATS + INTS + ["bool"]
RTOL = {"float64": 1e-12, "float32": 3e-6, "float16": 2e-3, "bfloat16": 1.6e-2}
SEED = int(os.environ.get("PGK_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
print(f"test_cuda_ops seed {SEED}")


@pytest.fixture(autouse=True)
def cuda() -> Iterator[Any]:
    b = backends.get_backend()
    if b.name != "cuda":
        pytest.skip("the CUDA backend is not active")
    b.poison = True
    yield b
    b.synchronize()


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng([SEED, zlib.crc32(request.node.name.encode())])


@contextlib.contextmanager
def cpu_backend() -> Iterator[None]:
    from pygpukit.backends.numpy_backend import NumpyBackend

    saved = backends._backend
    backends._backend = _CPU[0] if _CPU else _CPU.append(NumpyBackend()) or _CPU[0]
    try:
        yield
    finally:
        backends._backend = saved


_CPU: list[Any] = []


def npd(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def rand(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    d: str,
    positive: bool = False,
) -> np.ndarray:
    if d == "bool":
        return rng.random(shape) < 0.5
    if d in INTS:
        lo = 1 if positive or d == "uint8" else -9
        return rng.integers(lo, 10, size=shape).astype(d)
    x = rng.uniform(0.1, 3.0, shape) if positive else rng.uniform(-3.0, 3.0, shape)
    return x.astype(npd(d))


def f64(a: Any) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def close(out: np.ndarray, ref: np.ndarray, d: str, factor: float = 1.0, what: str = "") -> None:
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    if d in RTOL:
        rtol = RTOL[d] * factor
        r = f64(ref)
        scale = max(1.0, float(np.nanmax(np.abs(r))) if r.size and np.isfinite(r).any() else 1.0)
        np.testing.assert_allclose(
            f64(out), r, rtol=rtol, atol=rtol * scale, equal_nan=True, err_msg=what
        )
    else:
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref), err_msg=what)


def three_ways(fn: Callable[..., gpk.GPUArray], *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """(CUDA lazy, CUDA eager, NumPy backend) results of fn on fresh uploads of arrays."""
    lazy = fn(*[gpk.asarray(a) for a in arrays]).to_numpy()
    with gpk.eager():
        out = fn(*[gpk.asarray(a) for a in arrays])
        assert out.is_realized
        eager = out.to_numpy()
    with cpu_backend():
        cpu = fn(*[gpk.asarray(a) for a in arrays]).to_numpy()
    return lazy, eager, cpu


def check(
    fn: Callable[..., gpk.GPUArray],
    ref: Callable[..., np.ndarray] | None,
    arrays: list[np.ndarray],
    d: str,
    factor: float = 4.0,
    ref_factor: float = 8.0,
) -> np.ndarray:
    lazy, eager, cpu = three_ways(fn, *arrays)
    close(lazy, cpu, d, factor, "cuda lazy vs numpy backend")
    close(eager, cpu, d, factor, "cuda eager vs numpy backend")
    close(lazy, eager, d, factor, "lazy vs eager")
    if ref is not None:
        r = ref(*[f64(a) if a.dtype.kind not in "biu" else a for a in arrays])
        if d in RTOL:
            close(lazy, np.asarray(r, np.float64), d, ref_factor, "cuda vs float64 reference")
        else:
            close(lazy, np.asarray(r).astype(lazy.dtype), d, 1, "cuda vs reference")
    return lazy


# -- elementwise ------------------------------------------------------------------------------

UNARY = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "erf": None,
    "abs": np.abs,
    "negative": np.negative,
}


@pytest.mark.parametrize("op", list(UNARY))
@pytest.mark.parametrize("d", FLOATS + ["int32", "int8"])
def test_unary(rng: np.random.Generator, op: str, d: str) -> None:
    pos = op in ("log", "sqrt", "rsqrt")
    x = rand(rng, (37, 129), d, positive=pos)
    # Integers give the default float, float32 (docs/dtypes.md: float64 only from float64);
    # the reference computes their math in float64 (NumPy's own would be float16 for int8).
    keeps = d in FLOATS or op in ("abs", "negative")
    out_d = d if keeps else "float32"
    f = UNARY[op]  # None: no NumPy function (erf); the backends are compared alone
    ref = f if keeps or f is None else (lambda a: f(np.asarray(a, np.float64)))
    check(lambda a: getattr(gpk, op)(a), ref, [x], out_d)


@pytest.mark.parametrize("d", FLOATS)
def test_activations(rng: np.random.Generator, d: str) -> None:
    x = rand(rng, (3, 1000), d)
    import math

    erf = np.vectorize(math.erf)
    check(lambda a: gpk.nn.gelu(a), lambda a: 0.5 * a * (1 + erf(a / math.sqrt(2))), [x], d)
    check(
        lambda a: gpk.nn.gelu(a, approximate="tanh"),
        lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))),
        [x],
        d,
    )
    check(lambda a: gpk.nn.silu(a), lambda a: a / (1 + np.exp(-a)), [x], d)


BINARY = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "power": np.power,
}


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("d", ALL)
def test_binary_broadcast(rng: np.random.Generator, op: str, d: str) -> None:
    if d == "bool" and op in ("subtract", "divide", "power"):
        pytest.skip("not defined for bool")
    a = rand(rng, (4, 1, 33), d, positive=op == "power")
    b = rand(rng, (7, 33), d, positive=op == "power")
    if op == "power" and d in INTS:
        b = rng.integers(0, 3, (7, 33)).astype(d)
    if op == "divide" and d in INTS:
        b = np.where(b == 0, 1, b).astype(d)
    out_d = "float32" if op == "divide" and d in INTS + ["bool"] else d  # docs/dtypes.md
    ref = BINARY[op] if d in FLOATS or op == "divide" else None
    check(lambda x, y: getattr(gpk, op)(x, y), ref, [a, b], out_d)


@pytest.mark.parametrize("d", ALL)
def test_comparisons_and_logic(rng: np.random.Generator, d: str) -> None:
    a, b = rand(rng, (5, 64), d), rand(rng, (64,), d)
    for f in (gpk.equal, gpk.not_equal, gpk.less, gpk.less_equal, gpk.greater, gpk.greater_equal):
        check(lambda x, y, f=f: f(x, y), None, [a, b], "bool")
    c = a.astype(bool)
    check(lambda x, y: (x & y) | ~x, lambda x, y: (x & y) | ~x, [c, b.astype(bool)], "bool")


def test_mixed_dtype_promotion(rng: np.random.Generator) -> None:
    a, b = rand(rng, (9, 17), "float16"), rand(rng, (17,), "int32")
    check(lambda x, y: x * y + 1.5, lambda x, y: x * y + 1.5, [a, b], "float32")
    c = rand(rng, (9, 17), "bfloat16")
    check(lambda x, y: x + y, lambda x, y: x + y, [a, c], "float32")


@pytest.mark.parametrize("src", ALL)
@pytest.mark.parametrize("dst", ALL)
def test_cast(rng: np.random.Generator, src: str, dst: str) -> None:
    x = rand(rng, (8, 65), src)
    if dst == "uint8" and src in FLOATS + ["int8", "int32", "int64"]:
        x = np.abs(x)  # negative floats to uint8 are undefined in C and NumPy alike
    check(lambda a: a.astype(dst), None, [x], dst)


@pytest.mark.parametrize("d", ALL)
def test_zero_fill_writes_every_element(d: str) -> None:
    """A fill with zeros (a memset, no kernel) writes each element of the poisoned
    allocation, lazy and eager; -0.0 (the fill kernel) keeps its sign bit."""
    lazy, eager, cpu = three_ways(lambda: gpk.zeros((3, 70), dtype=d))
    want = np.zeros((3, 70), npd(d))
    for got in (lazy, eager, cpu):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    if d in FLOATS:
        neg = gpk.full((5,), -0.0, dtype=d).to_numpy()
        assert np.signbit(f64(neg)).all() and (f64(neg) == 0).all()


@pytest.mark.parametrize("d", ALL)
def test_where_full_arange(rng: np.random.Generator, d: str) -> None:
    c = rand(rng, (6, 1), "bool")
    x, y = rand(rng, (6, 50), d), rand(rng, (50,), d)
    check(lambda cc, a, b: gpk.where(cc, a, b), np.where, [c, x, y], d)
    if d != "bool":
        lazy, eager, cpu = three_ways(
            lambda: gpk.full((3, 70), 7, dtype=d) + gpk.arange(70, dtype=d)
        )
        close(lazy, cpu, d)
        close(eager, cpu, d)
    lazy, _, cpu = three_ways(lambda: gpk.arange(0.5, 20.0, 0.75, dtype="float32"))
    close(lazy, cpu, "float32")


@pytest.mark.parametrize("d", ["float32", "float16", "int32", "bool"])
def test_strided_views_as_inputs(rng: np.random.Generator, d: str) -> None:
    x = rand(rng, (40, 30), d)
    y = rand(rng, (30, 40), d)
    check(lambda a, b: gpk.maximum(a.T[::2, 1:], b[::2, 1:]), None, [x, y], d)
    # A realised strided view as a leaf (its layout is part of the schedule key).
    xa, ya = gpk.asarray(x), gpk.asarray(y)
    v = xa.T[:, ::-3].realize()
    w = ya[:, ::-3].realize()
    out = gpk.maximum(v, w).to_numpy()
    np.testing.assert_array_equal(out, np.maximum(x.T[:, ::-3], y[:, ::-3]))


def test_vector_path_unaligned_and_tails(rng: np.random.Generator) -> None:
    for n in (1, 7, 8, 9, 1023, 4099):
        x = rand(rng, (n + 1,), "float16")
        check(lambda a: gpk.exp(a[1:]) * 2.0, lambda a: np.exp(a[1:]) * 2.0, [x], "float16")
        check(lambda a: a * 3.0, lambda a: a * 3.0, [x[:n]], "float16")


# -- reductions --------------------------------------------------------------------------------

RED = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "argmax"])
@pytest.mark.parametrize("d", ALL)
@pytest.mark.parametrize(
    "shape,axis,keep",
    [
        ((33, 517), 1, False),
        ((33, 517), 0, True),
        ((7, 9, 11), (0, 2), False),
        ((3000,), None, False),
        ((64, 4, 300), 1, True),
        ((2, 70000), -1, False),
    ],
)
def test_reductions(
    rng: np.random.Generator, op: str, d: str, shape: Any, axis: Any, keep: bool
) -> None:
    if op == "argmax" and isinstance(axis, tuple):
        pytest.skip("argmax takes one axis")
    if d == "bool" and op == "mean":
        pytest.skip("checked through the ints")
    x = rand(rng, shape, d)
    fn = lambda a: getattr(a, op)(axis=axis, keepdims=keep)  # noqa: E731
    if op == "argmax":
        out = check(fn, None, [x], "int64")
        ref = np.argmax(x, axis=axis, keepdims=keep) if not isinstance(axis, tuple) else None
        if ref is not None and d in INTS + ["bool"]:
            np.testing.assert_array_equal(out, ref)
        return
    out_d = {
        "sum": "int64" if d in INTS + ["bool"] else d,
        "mean": "float32" if d in INTS else d,  # docs/dtypes.md
    }.get(op, d)
    ref = lambda a: RED[op](a, axis=axis, keepdims=keep)  # noqa: E731
    n = x.size if axis is None else int(np.prod([shape[a] for a in np.atleast_1d(axis)]))
    check(fn, ref, [x], out_d, factor=4 + n / 100, ref_factor=8 + n / 50)


def test_reduction_nan_and_argmax_ties(rng: np.random.Generator) -> None:
    x = rand(rng, (5, 300), "float32")
    x[1, 17] = np.nan
    x[2, :] = 1.0
    check(lambda a: a.max(axis=1), None, [x], "float32")
    out = check(lambda a: a.argmax(axis=1), None, [x], "int64")
    assert out[1] == 17 and out[2] == 0


# -- movement, indexing ------------------------------------------------------------------------


@pytest.mark.parametrize("d", ["float32", "bfloat16", "int64", "bool", "uint8"])
def test_views_and_copies(rng: np.random.Generator, d: str) -> None:
    x = rand(rng, (4, 6, 10), d)
    check(lambda a: a.reshape(24, 10)[::3], lambda a: a.reshape(24, 10)[::3], [x], d)
    check(
        lambda a: a.transpose(2, 0, 1).reshape(-1),
        lambda a: a.transpose(2, 0, 1).reshape(-1),
        [x],
        d,
    )
    check(
        lambda a: gpk.broadcast_to(a[:, None, 2], (4, 5, 10)) + a[:, :5, None, 3] * 0, None, [x], d
    ) if d not in ("bool",) else None
    check(lambda a: a[1:4, ::-2, None, -1], lambda a: a[1:4, ::-2, None, -1], [x], d)
    check(lambda a: a.swapaxes(0, 2).copy(), lambda a: a.swapaxes(0, 2).copy(), [x], d)


@pytest.mark.parametrize("d", ["float32", "float16", "int32", "int8"])
def test_concat_stack_take(rng: np.random.Generator, d: str) -> None:
    a, b = rand(rng, (3, 5, 7), d), rand(rng, (3, 2, 7), d)
    check(
        lambda x, y: gpk.concatenate([x, y, x[:, :1]], axis=1),
        lambda x, y: np.concatenate([x, y, x[:, :1]], axis=1),
        [a, b],
        d,
    )
    check(lambda x: gpk.stack([x, x * 2], axis=-1), lambda x: np.stack([x, x * 2], -1), [a], d)
    idx = rng.integers(-5, 5, (4, 3)).astype(np.int32)
    check(lambda x, i: gpk.take(x, i, axis=1), lambda x, i: np.take(x, i, axis=1), [a, idx], d)
    emb = rand(rng, (50, 16), d)
    ids = rng.integers(0, 50, (2, 9)).astype(np.int64)
    check(lambda e, i: e[i], lambda e, i: e[i], [emb, ids], d)


def test_mixed_dtype_concat(rng: np.random.Generator) -> None:
    a, b = rand(rng, (3, 4), "float16"), rand(rng, (2, 4), "int32")
    check(
        lambda x, y: gpk.concatenate([x, y]), lambda x, y: np.concatenate([x, y]), [a, b], "float64"
    )


def test_take_out_of_range_raises_index_error(rng: np.random.Generator) -> None:
    x = gpk.asarray(rand(rng, (10, 4), "float32"))
    bad = gpk.asarray(np.array([1, 10, 2], np.int64))
    y = gpk.take(x, bad, axis=0)
    with pytest.raises(gpk.IndexError) as e:
        y.to_numpy()
    msg = str(e.value)
    assert "take" in msg and "10" in msg and "test_cuda_ops.py" in msg
    # The error word is cleared: the backend keeps working.
    np.testing.assert_array_equal(
        gpk.take(x, gpk.asarray(np.array([0, -1])), axis=0).to_numpy(), x.to_numpy()[[0, -1]]
    )


@pytest.mark.parametrize("d", ["float32", "float16", "bfloat16", "int32"])
def test_dynamic_index_and_kv_cache_store(rng: np.random.Generator, d: str) -> None:
    cache_np = rand(rng, (2, 16, 8), d)
    k_np = rand(rng, (2, 8), d)
    for pos in (0, 5, 15, -1):
        p = gpk.asarray(np.array(pos, np.int64))
        cache = gpk.asarray(cache_np)
        cache[:, p] = gpk.asarray(k_np)
        expect = cache_np.copy()
        expect[:, pos] = k_np
        np.testing.assert_array_equal(cache.to_numpy(), expect)
        np.testing.assert_array_equal(cache[:, p].to_numpy(), k_np)
        np.testing.assert_array_equal(gpk.asarray(cache_np)[1, p].to_numpy(), cache_np[1, pos])
    with gpk.eager():
        cache = gpk.asarray(cache_np)
        cache[:, gpk.asarray(np.array(3, np.int32))] = gpk.asarray(k_np)
    expect = cache_np.copy()
    expect[:, 3] = k_np
    np.testing.assert_array_equal(cache.to_numpy(), expect)
    cache = gpk.asarray(cache_np)
    cache[:, gpk.asarray(np.array(16, np.int64))] = gpk.asarray(k_np)
    with pytest.raises(gpk.IndexError):
        cache.to_numpy()


def test_static_setitem(rng: np.random.Generator) -> None:
    x_np = rand(rng, (6, 9), "float32")

    def fn(x: gpk.GPUArray) -> gpk.GPUArray:
        x[1:5:2, ::-3] = 7.5
        x[0] = x[5]
        return x

    def ref(x: np.ndarray) -> np.ndarray:
        x = x.copy()
        x[1:5:2, ::-3] = 7.5
        x[0] = x[5]
        return x

    check(fn, ref, [x_np], "float32")


# -- fused nodes (the generic fusion pass emits these) -----------------------------------------


def _fused(op: str, ins: list[gpk.GPUArray], **attrs: Any) -> gpk.GPUArray:
    return gpk.GPUArray(runtime.record(op, tuple(i.node for i in ins), attrs))


@pytest.mark.parametrize("d", FLOATS)
def test_fused_elementwise_and_reduce(rng: np.random.Generator, d: str) -> None:
    a, b = rand(rng, (8, 300), d), rand(rng, (300,), d)
    expr = (
        "mul",
        ("gelu", "tanh", ("add", ("in", 0), ("in", 1))),
        ("exp", ("neg", ("cast", "float32", ("in", 1)))),
    )
    fe = lambda x, y: _fused("fused_elementwise", [x, y], expr=expr, out_shape=(8, 300))  # noqa: E731
    # exp runs in float32 (the cast), so float32 tolerances hold even for float64 inputs.
    check(
        fe, None, [a, b], "float32" if d != "float64" else "float64", 1 if d != "float64" else 3e6
    )
    for red in ("sum", "mean", "max", "min", "argmax"):

        def fr(x: gpk.GPUArray, y: gpk.GPUArray, red: str = red) -> gpk.GPUArray:
            return _fused(
                "fused_reduce",
                [x, y],
                expr=("mul", ("in", 0), ("in", 1)),
                out_shape=(8, 300),
                reduce=red,
                axes=(1,),
                keepdims=red == "sum",
            )

        check(fr, None, [a, b], "int64" if red == "argmax" else d, factor=20)


# -- matmul and the fused nn ops ---------------------------------------------------------------


@pytest.mark.parametrize("d", ["float32", "float16", "bfloat16", "float64", "int32", "int8"])
def test_matmul(rng: np.random.Generator, d: str) -> None:
    a, b = rand(rng, (2, 3, 33, 40), d), rand(rng, (3, 40, 17), d)
    f = 40 if d in ("float16", "bfloat16") else 8
    check(lambda x, y: x @ y, (lambda x, y: x @ y) if d in FLOATS else None, [a, b], d, f, f)
    v = rand(rng, (40,), d)
    check(lambda x, y: x[0, 0] @ y, None, [a, v], d, f, f)
    w = rand(rng, (64, 96), d)
    x2 = rand(rng, (5, 32, 96), d)
    check(
        lambda x, ww: x @ ww.T, (lambda x, ww: x @ ww.T) if d in FLOATS else None, [x2, w], d, f, f
    )


@pytest.mark.parametrize("d", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("act", ["none", "gelu_tanh", "silu"])
def test_linear(rng: np.random.Generator, d: str, act: str) -> None:
    x, w, b = rand(rng, (3, 20, 64), d), rand(rng, (48, 64), d), rand(rng, (48,), d)
    f = 60 if d in ("float16", "bfloat16") else 8
    check(lambda xx, ww, bb: gpk.nn.linear(xx, ww, bb, activation=act), None, [x, w, b], d, f)


@pytest.mark.parametrize("d", ["float16", "bfloat16"])
@pytest.mark.parametrize("act", ["none", "gelu_tanh", "gelu_erf", "silu"])
@pytest.mark.parametrize("lead", [(1,), (4, 1), (2, 8), (16,)])
def test_linear_few_rows_gemv(rng: np.random.Generator, d: str, act: str, lead: tuple) -> None:
    """Decode-sized linear/matmul (1..16 rows): the tensor-core GEMV where it is routed
    (M <= 4 here, gemv.beats_gemm), bias and activation fused, else cuBLASLt; against a
    float64 reference."""
    x, w, b = rand(rng, lead + (264,), d), rand(rng, (72, 264), d), rand(rng, (72,), d)
    acts = {
        "none": lambda v: v,
        "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3))),
        "gelu_erf": lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / np.sqrt(2))),
        "silu": lambda v: v / (1 + np.exp(-v)),
    }
    check(
        lambda xx, ww, bb: gpk.nn.linear(xx, ww, bb, activation=act),
        lambda xx, ww, bb: acts[act](xx @ ww.T + bb),
        [x, w, b],
        d,
        8,
        8,
    )
    check(lambda xx, ww: gpk.nn.linear(xx, ww), lambda xx, ww: xx @ ww.T, [x, w], d, 8, 8)
    check(lambda xx, ww: xx @ ww.T, lambda xx, ww: xx @ ww.T, [x, w], d, 8, 8)
    check(lambda xx, ww: xx[0] @ ww.T, lambda xx, ww: xx[0] @ ww.T, [x, w], d, 8, 8)


@pytest.mark.parametrize("d", FLOATS)
def test_softmax_and_norms(rng: np.random.Generator, d: str) -> None:
    x = rand(rng, (4, 7, 300), d)
    w, b = rand(rng, (300,), d), rand(rng, (300,), d)

    def sm(a: np.ndarray, axis: int = -1) -> np.ndarray:
        e = np.exp(a - a.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    check(lambda a: gpk.nn.softmax(a), sm, [x], d, 8, 16)
    check(lambda a: gpk.nn.softmax(a, axis=1), lambda a: sm(a, 1), [x], d, 8, 16)
    check(lambda a: gpk.nn.log_softmax(a), lambda a: np.log(sm(a)), [x], d, 8, 16)
    check(lambda a: gpk.nn.softmax(a.swapaxes(0, 2)), lambda a: sm(a.swapaxes(0, 2)), [x], d, 8, 16)
    check(
        lambda a, ww: gpk.nn.rms_norm(a, ww),
        lambda a, ww: a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6) * ww,
        [x, w],
        d,
        8,
        16,
    )
    check(lambda a, ww, bb: gpk.nn.layer_norm(a, ww, bb), None, [x, w, b], d, 8)
    check(lambda a, ww: gpk.nn.swiglu(a, ww), None, [x, w], d, 8)
    check(lambda a: gpk.nn.swiglu(a, a[::-1]), None, [x], d, 8)


@pytest.mark.parametrize("d", FLOATS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope(rng: np.random.Generator, d: str, interleaved: bool) -> None:
    x = rand(rng, (2, 3, 10, 64), d)
    cos, sin = rand(rng, (10, 32), d), rand(rng, (10, 32), d)
    check(lambda a, c, s: gpk.nn.rope(a, c, s, interleaved=interleaved), None, [x, cos, sin], d, 8)
    # Per-batch tables (not the launcher's layout): the generated fallback.
    cb = rand(rng, (2, 1, 10, 32), d)
    check(lambda a, c, s: gpk.nn.rope(a, c, s, interleaved=interleaved), None, [x, cb, cb], d, 8)


@pytest.mark.parametrize("d", FLOATS)
@pytest.mark.parametrize(
    "hd,causal,kvh", [(64, True, 2), (64, False, 4), (40, True, 1), (128, True, 4)]
)
def test_sdpa(rng: np.random.Generator, d: str, hd: int, causal: bool, kvh: int) -> None:
    q = rand(rng, (2, 4, 9, hd), d)
    k, v = rand(rng, (2, kvh, 13, hd), d), rand(rng, (2, kvh, 13, hd), d)

    def ref(qq: np.ndarray, kk: np.ndarray, vv: np.ndarray) -> np.ndarray:
        g = qq.shape[1] // kk.shape[1]
        kk, vv = np.repeat(kk, g, 1), np.repeat(vv, g, 1)
        s = qq @ kk.swapaxes(-1, -2) * float(np.float32(1 / np.sqrt(hd)))
        if causal:
            sq, sk = s.shape[-2:]
            s = np.where(np.arange(sk)[None] > np.arange(sq)[:, None] + sk - sq, -np.inf, s)
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ vv

    f = 10 if d in ("float16", "bfloat16") else 50
    check(
        lambda a, b, c: gpk.nn.scaled_dot_product_attention(a, b, c, is_causal=causal),
        ref,
        [q, k, v],
        d,
        f,
        2 * f,
    )


# -- interop, jit, streams, memory -------------------------------------------------------------


def test_dlpack_torch_zero_copy(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    x = gpk.asarray(rand(rng, (5, 7), "float32")).realize()
    t = torch.from_dlpack(x)
    assert t.is_cuda and t.data_ptr() == x.__cuda_array_interface__["data"][0]
    np.testing.assert_array_equal(t.cpu().numpy(), x.to_numpy())
    src = torch.randn(6, 8, device="cuda", dtype=torch.bfloat16)
    g = gpk.from_dlpack(src)
    assert g.dtype == gpk.bfloat16
    gv = g.node.realized
    assert gv.ptr == src.data_ptr()
    np.testing.assert_array_equal(g.astype("float32").to_numpy(), src.float().cpu().numpy())
    tt = src.t()
    gt = gpk.asarray(tt)
    assert gt.node.realized.ptr == tt.data_ptr()
    np.testing.assert_array_equal((gt * 1).astype("float32").to_numpy(), tt.float().cpu().numpy())
    back = torch.from_dlpack(gpk.from_dlpack(src))
    assert back.data_ptr() == src.data_ptr()
    del src, g, back
    gc.collect()


def test_dlpack_and_cai_cupy(rng: np.random.Generator) -> None:
    cp = pytest.importorskip("cupy")
    x = gpk.asarray(rand(rng, (4, 9), "float16")).realize()
    c = cp.from_dlpack(x)
    assert c.data.ptr == x.__cuda_array_interface__["data"][0]
    c2 = cp.asarray(x)
    assert c2.data.ptr == c.data.ptr
    np.testing.assert_array_equal(cp.asnumpy(c), x.to_numpy())
    src = cp.arange(30, dtype=cp.int32).reshape(5, 6)[:, ::2]
    g = gpk.from_dlpack(src)
    assert g.node.realized.ptr == src.data.ptr
    np.testing.assert_array_equal((g + 1).to_numpy(), cp.asnumpy(src) + 1)


def test_jit_kernel(rng: np.random.Generator) -> None:
    src = r"""
    extern "C" __global__ void axpy(float* y, const float* x, float a, long long n) {
      long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
      if (i < n) y[i] = a * x[i] + y[i];
    }"""
    k = gpk.jit(src, "axpy")
    xn, yn = rand(rng, (1000,), "float32"), rand(rng, (1000,), "float32")
    x, y = gpk.asarray(xn), gpk.asarray(yn)
    k((4,), (256,), y, x, 2.5, 1000)
    np.testing.assert_allclose(y.to_numpy(), 2.5 * xn + yn, rtol=1e-6, atol=1e-5)
    s = gpk.Stream()
    k((4,), (256,), y, x, 1, 1000, stream=s)
    s.synchronize()
    np.testing.assert_allclose(y.to_numpy(), 3.5 * xn + yn, rtol=1e-6, atol=1e-5)
    with pytest.raises(gpk.DTypeError, match="axpy"):
        k((4,), (256,), y, x, 2.5)
    with pytest.raises(gpk.DTypeError, match="'a'"):
        k((4,), (256,), y, x, "2.5", 1000)
    with pytest.raises(gpk.DTypeError, match="'n'"):
        k((4,), (256,), y, x, 2.5, 1000.0)


def test_streams_and_events(rng: np.random.Generator) -> None:
    x = gpk.asarray(rand(rng, (1 << 20,), "float32"))
    start, end = gpk.Event(), gpk.Event()
    start.record()
    for _ in range(5):
        x = gpk.exp(x * 0.5).realize()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0
    gpk.synchronize()
    assert end.query()


def _pool_view(b: Any) -> tuple[int, ...]:
    s = b.pool_stats()
    return s["in_use_bytes"], s["live_blocks"]


def test_oom_raises_and_leaves_pool_whole(rng: np.random.Generator) -> None:
    from pygpukit.backends.cuda.backend import CudaBackend

    # A quota makes the limit exact, and eviction (which only helps requests that could fit)
    # leaves everything in place for a request larger than the quota.
    saved = backends._backend
    small = CudaBackend(arena_bytes=1 << 20, quota_bytes=16 << 20)
    backends._backend = small
    try:
        x = gpk.asarray(rand(rng, (256, 1024), "float32"))  # 1 MiB
        gc.collect()
        small.synchronize()
        before = _pool_view(small)
        with pytest.raises(gpk.OutOfMemoryError):
            gpk.empty((1 << 30,), "float32")
        assert _pool_view(small) == before
        huge = gpk.broadcast_to(x[:1], (1 << 16, 1024)) + 1.0  # 256 MiB > the quota
        with pytest.raises(gpk.OutOfMemoryError) as e:
            huge.realize()
        assert "add" in str(e.value) and "test_cuda_ops.py" in str(e.value), str(e.value)
        del e, huge
        gc.collect()
        assert _pool_view(small) == before
        np.testing.assert_allclose((x + 1).to_numpy(), x.to_numpy() + 1)
    finally:
        backends._backend = saved


def test_schedule_replay_reuses_plan(rng: np.random.Generator) -> None:
    from pygpukit.backends.cuda import compiler

    x = gpk.asarray(rand(rng, (64, 64), "float32"))
    for _ in range(3):
        y = (x * 2 + 1).sum(axis=1)
        y.realize()
    n = compiler.stats["compiled"]
    for _ in range(20):
        y = (x * 2 + 1).sum(axis=1)
        y.realize()
    assert compiler.stats["compiled"] == n
    close(y.to_numpy(), (x.to_numpy() * 2 + 1).sum(axis=1), "float32", 50)


def test_backend_selection_env() -> None:
    code = "import pygpukit as g; print(g.backend_name())"
    env = dict(os.environ)
    env.pop("PYGPUKIT_BACKEND", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "cuda", out.stderr
    env["PYGPUKIT_BACKEND"] = "cpu"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "cpu"


@pytest.mark.parametrize("d", ["float32", "float16"])
def test_sdpa_static_cache_masks(rng: np.random.Generator, d: str) -> None:
    q = rand(rng, (2, 4, 1, 64), d)
    k, v = rand(rng, (2, 2, 16, 64), d), rand(rng, (2, 2, 16, 64), d)
    kv_len = np.array(9, np.int64)
    kv_start = np.array([0, 3], np.int32)

    def fn(a: Any, b: Any, c: Any, n: Any, st: Any) -> gpk.GPUArray:
        return gpk.nn.scaled_dot_product_attention(a, b, c, is_causal=True, kv_len=n, kv_start=st)

    check(fn, None, [q, k, v, kv_len, kv_start], d, 20)
    # More queries than keys under a causal mask: rows that see no key give zeros.
    q2 = rand(rng, (1, 2, 20, 64), d)
    out = check(
        lambda a, b, c: gpk.nn.scaled_dot_product_attention(a, b, c, is_causal=True),
        None,
        [q2, k[:1], v[:1]],
        d,
        20,
    )
    assert np.all(np.asarray(out, np.float64)[:, :, :4] == 0)


def _decode_ref(qq: np.ndarray, kk: np.ndarray, vv: np.ndarray, n: Any, st: Any) -> np.ndarray:
    """float64 attention of one query row per head over keys [st[b], n); none: zeros."""
    g = qq.shape[1] // kk.shape[1]
    kk, vv = np.repeat(kk, g, 1), np.repeat(vv, g, 1)
    s = qq @ kk.swapaxes(-1, -2) * float(np.float32(1 / np.sqrt(qq.shape[-1])))
    key = np.arange(kk.shape[-2])
    mask = (key >= int(n))[None, None, None, :] | (key[None, :] < np.asarray(st)[:, None])[
        :, None, None, :
    ]
    s = np.where(mask, -np.inf, s)
    m = np.max(s, -1, keepdims=True)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - m)
        p = p / p.sum(-1, keepdims=True)
    return np.nan_to_num(p @ vv, nan=0.0)


@pytest.mark.parametrize("d", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("hd,h,kvh,causal", [(64, 8, 2, True), (128, 32, 4, False)])
def test_sdpa_decode_kernel_masks(
    rng: np.random.Generator, d: str, hd: int, h: int, kvh: int, causal: bool
) -> None:
    """A decode query (sq == 1) on the split-K decode kernel with random kv_len / kv_start
    over a cache far longer than the live context, against float64 and the NumPy backend."""
    b, cache = 3, 1024
    q = rand(rng, (b, h, 1, hd), d)
    k, v = rand(rng, (b, kvh, cache, hd), d), rand(rng, (b, kvh, cache, hd), d)

    def fn(a: Any, bb: Any, c: Any, n: Any, st: Any) -> gpk.GPUArray:
        return gpk.nn.scaled_dot_product_attention(a, bb, c, is_causal=causal, kv_len=n,
                                                   kv_start=st)  # fmt: skip

    f = 10 if d in ("float16", "bfloat16") else 50
    for idx in ("int64", "int32"):
        n = np.array(rng.integers(1, 200), idx)
        st = rng.integers(0, 60, b).astype(idx)
        check(fn, _decode_ref, [q, k, v, n, st], d, f, 2 * f)
    # No masks: the whole cache.
    check(
        lambda a, bb, c: gpk.nn.scaled_dot_product_attention(a, bb, c, is_causal=causal),
        lambda a, bb, c: _decode_ref(a, bb, c, cache, np.zeros(b, np.int64)),
        [q, k, v],
        d,
        f,
        2 * f,
    )


def test_sdpa_decode_compiled_replay(rng: np.random.Generator) -> None:
    """A compiled (graph-captured) decode step replayed with new kv_len / kv_start values
    each call, read from device memory by the kernel."""
    d, b, h, kvh, hd, cache = "bfloat16", 2, 8, 2, 128, 2048

    @gpk.compile
    def step(a: Any, bb: Any, c: Any, n: Any, st: Any) -> Any:
        return gpk.nn.scaled_dot_product_attention(a, bb, c, is_causal=True, kv_len=n,
                                                   kv_start=st)  # fmt: skip

    k, v = rand(rng, (b, kvh, cache, hd), d), rand(rng, (b, kvh, cache, hd), d)
    kg, vg = gpk.asarray(k), gpk.asarray(v)
    for n in (1, 37, 700, 2048, 5):
        q = rand(rng, (b, h, 1, hd), d)
        st = rng.integers(0, 30, b).astype(np.int32)
        got = step(gpk.asarray(q), kg, vg, gpk.scalar(n), gpk.asarray(st)).to_numpy()
        close(got, _decode_ref(f64(q), f64(k), f64(v), n, st), d, 20, f"kv_len={n}")


@pytest.mark.parametrize("cache,last_block_max", [(128, 0), (4096, 0), (4096, 256)])
def test_sdpa_decode_two_layers_replayed(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, cache: int, last_block_max: int
) -> None:
    """Two decode attentions in one compiled step (the second's query is the first's output,
    as consecutive layers), replayed with a changing device-scalar length and start: one
    split at cache 128 (no merge), many at 4096, merged by a second kernel or by each
    launch's last block (its step's counters, left zeroed, serve the next replay)."""
    from pygpukit.backends.cuda.kernels import attention

    monkeypatch.setattr(attention, "LAST_BLOCK_MERGE_MAX_SPLITS", last_block_max)
    d, b, h, kvh, hd = "bfloat16", 2, 32, 4, 128

    @gpk.compile
    def step(a: Any, k1: Any, v1: Any, k2: Any, v2: Any, n: Any, st: Any) -> Any:
        x = gpk.nn.scaled_dot_product_attention(a, k1, v1, is_causal=True, kv_len=n,
                                                kv_start=st)  # fmt: skip
        return gpk.nn.scaled_dot_product_attention(x, k2, v2, is_causal=True, kv_len=n,
                                                   kv_start=st)  # fmt: skip

    q = rand(rng, (b, h, 1, hd), d)
    kv = [rand(rng, (b, kvh, cache, hd), d) for _ in range(4)]
    qg, kvg = gpk.asarray(q), [gpk.asarray(x) for x in kv]
    for n in (cache, 1, cache // 2 + 3, 9, cache - 1, cache // 3):
        st = rng.integers(0, 8, b).astype(np.int32)
        got = step(qg, *kvg, gpk.scalar(n), gpk.asarray(st)).to_numpy()
        x = _decode_ref(f64(q), f64(kv[0]), f64(kv[1]), n, st)
        close(got, _decode_ref(x, f64(kv[2]), f64(kv[3]), n, st), d, 20, f"kv_len={n}")
    (entry,) = step._cache.values()
    caps = list(entry.program._captures.values())
    assert all(rp.captured for rp in caps) and sum(rp.replays for rp in caps) >= 3


def _compiled() -> Any:
    @gpk.compile
    def f(x: gpk.GPUArray, w: gpk.GPUArray, cache: gpk.GPUArray, pos: gpk.GPUArray) -> Any:
        h = gpk.nn.softmax(gpk.nn.gelu(x @ w.T + 1.0) * 0.5)
        cache[:, pos] = h[:, :4]
        return h.sum(-1), gpk.nn.rms_norm(h, w[0, :16])

    return f


def test_compiled_function_runs_on_cuda(rng: np.random.Generator) -> None:
    f_gpu, f_cpu = _compiled(), _compiled()  # one per backend: entries hold backend values
    cache_np = rand(rng, (8, 6, 4), "float32")
    cache_gpu = gpk.asarray(cache_np)
    with cpu_backend():
        cache_cpu = gpk.asarray(cache_np)
    for step in range(4):
        xn, wn = rand(rng, (8, 32), "float32"), rand(rng, (16, 32), "float32")
        got = f_gpu(gpk.asarray(xn), gpk.asarray(wn), cache_gpu, gpk.scalar(step))
        got = [g.to_numpy() for g in got]
        with cpu_backend():
            want = f_cpu(gpk.asarray(xn), gpk.asarray(wn), cache_cpu, gpk.scalar(step))
            want = [w.to_numpy() for w in want]
            cpu_cache = cache_cpu.to_numpy()
        for g, w in zip(got, want, strict=True):
            close(g, w, "float32", 50)
        close(cache_gpu.to_numpy(), cpu_cache, "float32", 50)


@pytest.mark.parametrize("d", ["bfloat16", "float32"])
def test_rms_norm_with_residual_add(rng: np.random.Generator, d: str) -> None:
    """rms_norm(x + r) written out (fp32 upcast) runs as one pgk_rms_norm_add launch: the
    sum rounded to d first, as the unfused add gives; a row view exercises the strides."""
    from pygpukit.passes import run_pipeline

    def f(a: gpk.GPUArray, res: gpk.GPUArray, ww: gpk.GPUArray) -> gpk.GPUArray:
        h = a + res
        h32 = h.astype("float32")
        return (h32 * gpk.rsqrt((h32 * h32).mean(-1, keepdims=True) + 1e-6)).astype(d) * ww

    def ref(a: np.ndarray, res: np.ndarray, ww: np.ndarray) -> np.ndarray:
        h = a + res
        return h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6) * ww

    for shape in ((3, 7, 4096), (5, 1000), (2, 64)):
        x, r, w = rand(rng, shape, d), rand(rng, shape, d), rand(rng, shape[-1:], d)
        out = f(gpk.asarray(x), gpk.asarray(r), gpk.asarray(w))
        g = run_pipeline(runtime.pending_graph([out.node], "rms_add"))
        assert [n.op for n in g.nodes if n.op != "input"] == ["rms_norm"], str(g)
        check(f, ref, [x, r, w], d, 4, 8)
    xs = rand(rng, (6, 2, 256), d)  # rows at a stride of 512 elements
    check(lambda a, res, ww: f(a[:, 0], res, ww), lambda a, res, ww: ref(a[:, 0], res, ww),
          [xs, rand(rng, (6, 256), d), rand(rng, (256,), d)], d, 4, 8)  # fmt: skip
