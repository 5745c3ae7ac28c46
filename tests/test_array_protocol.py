"""The NumPy array protocol: boolean masks, dtypes that equal NumPy's, the default-float
rule (docs/dtypes.md), NumPy functions staying on the device, .device, pickling and DLPack
export of bfloat16; against NumPy on random inputs, lazy, eager and compiled."""

from __future__ import annotations

import gc
import pickle

import ml_dtypes
import numpy as np
import pytest
from helpers import ALL, np_dtype, rand
from hypothesis import given, settings
from hypothesis import strategies as st

import pygpukit as gpk
from pygpukit import interop
from pygpukit.backends import get_backend

SETTINGS = settings(max_examples=25, deadline=None)


# ---- boolean masks -------------------------------------------------------------------------


@st.composite
def masked(draw: st.DrawFn) -> tuple[tuple[int, ...], int, str, int]:
    """A shape, how many leading dims the mask covers, a dtype and a seed."""
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=3)))
    k = draw(st.integers(1, len(shape)))
    return shape, k, draw(st.sampled_from(ALL)), draw(st.integers(0, 2**32 - 1))


def _mask(rng: np.random.Generator, shape: tuple[int, ...], p: float) -> np.ndarray:
    return rng.random(shape) < p


@given(case=masked(), p=st.sampled_from([0.0, 0.3, 0.7, 1.0]), as_gpu=st.booleans())
@SETTINGS
def test_mask_read_matches_numpy(case, p: float, as_gpu: bool) -> None:
    shape, k, dtype, seed = case
    rng = np.random.default_rng(seed)
    x = rand(rng, shape, dtype)
    m = _mask(rng, shape[:k], p)
    want = x[m]
    for eager in (False, True):
        with gpk.eager(eager):
            a = gpk.from_numpy(x)
            got = a[gpk.from_numpy(m) if as_gpu else m]
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_array_equal(got.to_numpy(), want)


def test_mask_from_a_lazy_comparison_and_a_view() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 9)).astype(np.float32)
    a = gpk.from_numpy(x)
    np.testing.assert_array_equal(a[a > 0.25].to_numpy(), x[x > 0.25])
    v = a[1:6:2, ::-1]  # a strided view, and its mask a strided view of a mask
    m = (a < 0)[1:6:2, ::-1]
    np.testing.assert_array_equal(v[m].to_numpy(), x[1:6:2, ::-1][(x < 0)[1:6:2, ::-1]])
    np.testing.assert_array_equal(a[[True, False, True, True, False, False, True]].to_numpy(),
                                  x[[True, False, True, True, False, False, True]])  # fmt: skip


@given(
    case=masked(),
    p=st.sampled_from([0.0, 0.4, 1.0]),
    kind=st.sampled_from(["scalar", "row", "rows"]),
)
@SETTINGS
def test_mask_assign_matches_numpy(case, p: float, kind: str) -> None:
    shape, k, dtype, seed = case
    rng = np.random.default_rng(seed)
    x = rand(rng, shape, dtype)
    m = _mask(rng, shape[:k], p)
    rest = shape[k:]
    if kind == "scalar":
        value: object = rand(rng, (), dtype).item()
    elif kind == "row":
        value = rand(rng, rest, dtype)
    else:
        value = rand(rng, (int(m.sum()),) + rest, dtype)
    want = x.copy()
    want[m] = value
    for eager in (False, True):
        with gpk.eager(eager):
            a = gpk.from_numpy(x)
            a[gpk.from_numpy(m)] = value
            assert a.dtype == want.dtype
            np.testing.assert_array_equal(a.to_numpy(), want)


def test_mask_assign_writes_through_a_view() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    a = gpk.from_numpy(x)
    v = a[2:5]
    v[v > 0] = -1.5
    want = x.copy()
    w = want[2:5]
    w[w > 0] = -1.5
    np.testing.assert_array_equal(a.to_numpy(), want)


def test_mask_assign_compiled_with_a_scalar_and_a_row() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    row = rng.standard_normal(8).astype(np.float32)

    @gpk.compile
    def clamp(a: gpk.GPUArray, r: gpk.GPUArray) -> gpk.GPUArray:
        a[a < -0.5] = -0.5
        b = a * 2.0
        b[b.max(axis=1) > 1.0] = r
        return b

    for _ in range(2):  # the second call replays
        x = rng.standard_normal((4, 8)).astype(np.float32)
        want = np.where(x < -0.5, -0.5, x).astype(np.float32) * 2
        want[want.max(axis=1) > 1.0] = row
        got = clamp(gpk.from_numpy(x), gpk.from_numpy(row))
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-6)


def test_mask_read_while_tracing_says_why() -> None:
    @gpk.compile
    def positive(a: gpk.GPUArray) -> gpk.GPUArray:
        return a[a > 0]

    with pytest.raises(gpk.TraceError, match="depends on how many mask elements"):
        positive(gpk.from_numpy(np.random.default_rng(4).standard_normal(5).astype(np.float32)))


def test_mask_errors() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    a = gpk.from_numpy(x)
    with pytest.raises(IndexError) as e:
        x[np.ones(3, bool)]
    with pytest.raises(gpk.IndexError, match="along axis 0; size of axis is 4 but size of "
                       "corresponding boolean axis is 3"):  # fmt: skip
        a[np.ones(3, bool)]
    assert "boolean index did not match" in str(e.value)
    with pytest.raises(gpk.IndexError, match="along axis 1"):
        a[gpk.from_numpy(np.ones((4, 2), bool))] = 1.0
    with pytest.raises(gpk.IndexError, match="too many indices"):
        a[np.ones((4, 3, 1), bool)]
    m = np.array([True, False, True, True])
    with pytest.raises(gpk.ShapeError, match="cannot assign"):
        a[m] = np.ones((2, 3), np.float32)  # 3 selected rows
    with pytest.raises(ValueError):
        x[m] = np.ones((2, 3), np.float32)  # NumPy agrees
    with pytest.raises(gpk.ShapeError, match="could not broadcast"):
        a[m] = np.ones(2, np.float32)
    with pytest.raises(OverflowError):
        gpk.from_numpy(np.arange(4, dtype=np.int8))[m] = 300
    # A non-bool index array still follows the integer indexing rules.
    idx = np.array([0, 3, 1])
    np.testing.assert_array_equal(a[gpk.from_numpy(idx)].to_numpy(), x[idx])
    np.testing.assert_array_equal(a[idx.tolist()].to_numpy(), x[idx])


# ---- dtypes --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_dtype_equals_numpy(name: str) -> None:
    d = gpk.ir.dtypes.as_dtype(name)
    npd = np_dtype(name)
    assert d == npd and npd == d and d == npd.type and npd.type == d
    assert d == name and d == d.short and not d != name
    assert np.dtype(d) == npd and hash(d) == hash(npd)
    assert {npd: 1}[d] == 1 and {d: 2}[npd] == 2
    a = gpk.from_numpy(rand(np.random.default_rng(6), (2,), name))
    assert a.dtype == npd and np.dtype(a.dtype) == npd
    assert np.zeros(2, dtype=a.dtype).dtype == npd
    others = [o for o in ALL if o != name]
    assert all(d != np_dtype(o) and d != o for o in others)
    assert d != None and d != 3.5 and d != "no such dtype"  # noqa: E711


def test_dtype_constants() -> None:
    assert gpk.float32 == np.float32 and np.float32 == gpk.float32
    assert gpk.bfloat16 == ml_dtypes.bfloat16 and gpk.bfloat16 != np.float16
    assert gpk.bool == np.bool_ and gpk.int64 == "i64"
    assert len({gpk.float32, np.dtype(np.float32)}) == 1


# ---- the default-float rule (docs/dtypes.md) -------------------------------------------------


def test_integer_inputs_give_float32() -> None:
    rng = np.random.default_rng(7)
    xi = rng.integers(-50, 50, (3, 5)).astype(np.int64)
    a = gpk.from_numpy(xi)
    cases = [
        (a / 2, xi / 2),
        (a / gpk.clip(a.astype(gpk.int32), 1, None), xi / np.clip(xi, 1, None)),
        (a.mean(), xi.mean()),
        (a.mean(axis=0), xi.mean(axis=0)),
        (gpk.exp(a.astype(gpk.int8) / 10), np.exp(xi / 10)),
        (gpk.sqrt(gpk.abs(a)), np.sqrt(np.abs(xi))),
        (gpk.sigmoid(a.astype(gpk.bool)), 1 / (1 + np.exp(-(xi != 0).astype(np.float64)))),
        (a * 0.5, xi * 0.5),
        (a + gpk.ones(5), xi + 1.0),  # int64 + float32: NumPy float64
        (gpk.arange(4) / 2, np.arange(4) / 2),
    ]
    for got, ref in cases:
        assert got.dtype == np.float32, got.dtype
        np.testing.assert_allclose(got.to_numpy(), ref, rtol=2e-6, atol=1e-6)
    assert gpk.arange(10.0).dtype == np.float32 and gpk.arange(4).dtype == np.int64
    assert gpk.exp(gpk.from_numpy(xi.astype(np.int8))).dtype == np.float32  # NumPy: float16


def test_float64_only_from_float64() -> None:
    rng = np.random.default_rng(8)
    x64 = rng.standard_normal(6)
    xi = rng.integers(-9, 9, 6).astype(np.int32)
    a64, ai = gpk.from_numpy(x64), gpk.from_numpy(xi)
    for got, ref in ((a64 + ai, x64 + xi), (ai / a64, xi / x64), (a64.mean(), x64.mean()),
                     (gpk.where(ai > 0, ai, a64), np.where(xi > 0, xi, x64))):  # fmt: skip
        assert got.dtype == np.float64
        np.testing.assert_allclose(got.to_numpy(), ref, rtol=1e-12)
    h = gpk.from_numpy(x64.astype(np.float16))
    assert (h + gpk.from_numpy(xi.astype(np.int8))).dtype == np.float16  # as NumPy


def test_integer_comparisons_with_floats_stay_exact() -> None:
    big = np.array([16777217, -16777217, 3], np.int64)  # not exact in float32
    a = gpk.from_numpy(big)
    np.testing.assert_array_equal((a > 16777216.0).to_numpy(), big > 16777216.0)
    np.testing.assert_array_equal((a == -16777217.0).to_numpy(), big == -16777217.0)


# ---- NumPy functions on GPUArrays ----------------------------------------------------------


def _gpu(x: np.ndarray) -> gpk.GPUArray:
    return gpk.from_numpy(x)


def test_numpy_functions_run_on_the_device() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y = rng.standard_normal((4, 6)).astype(np.float32)
    a, b = _gpu(x), _gpu(y)
    cases = [
        (np.exp(a), np.exp(x)),
        (np.add(a, b), x + y),
        (np.add(x, b), x + y),
        (y * a, y * x),  # ndarray on the left: still a GPUArray
        (np.sum(a, axis=0), x.sum(axis=0)),
        (np.mean(a, axis=1, keepdims=True), x.mean(axis=1, keepdims=True)),
        (np.max(a), x.max()),
        (np.concatenate([a, b]), np.concatenate([x, y])),
        (np.concatenate([a, y], axis=1), np.concatenate([x, y], axis=1)),
        (np.stack([a, b], axis=1), np.stack([x, y], axis=1)),
        (np.where(a > b, a, 0.0), np.where(x > y, x, 0.0)),
        (np.matmul(a, b.T), x @ y.T),
        (np.transpose(a), x.T),
        (np.reshape(a, (3, 8)), x.reshape(3, 8)),
        (np.maximum(a, 0.0), np.maximum(x, 0.0)),
        (np.absolute(a), np.abs(x)),
        (np.add.reduce(a), np.add.reduce(x)),
        (np.maximum.reduce(a, axis=1), np.maximum.reduce(x, axis=1)),
        (np.clip(a, -0.5, 0.5), np.clip(x, -0.5, 0.5)),
    ]
    for got, ref in cases:
        assert isinstance(got, gpk.GPUArray), type(got)
        np.testing.assert_allclose(got.to_numpy(), ref, rtol=2e-6, atol=1e-6)
    assert np.shape(a) == (4, 6) and np.ndim(a) == 2 and np.size(a) == 24
    out = gpk.zeros((4, 6))
    assert np.multiply(a, b, out=out) is out
    np.testing.assert_allclose(out.to_numpy(), x * y, rtol=2e-6)


def test_unsupported_numpy_functions_raise_and_never_copy() -> None:
    a = _gpu(np.random.default_rng(10).standard_normal(8).astype(np.float32))
    for call, name in ((lambda: np.fft.fft(a), "np.fft.fft"), (lambda: np.unwrap(a), "np.unwrap"),
                       (lambda: np.hypot(a, a), "np.hypot"),
                       (lambda: np.add.accumulate(a), "np.add.accumulate")):  # fmt: skip
        with pytest.raises(gpk.errors.UnsupportedFunctionError, match=name):
            call()
    with pytest.raises(TypeError, match="does not take these arguments"):
        np.sum(a, dtype=np.float64)
    host = np.asarray(a)  # explicit copies still work
    assert isinstance(host, np.ndarray) and host.shape == (8,)


# ---- .device, pickling, DLPack ---------------------------------------------------------------


def test_device() -> None:
    a = gpk.ones(3)
    dev = a.device
    assert isinstance(dev, gpk.Device)
    if get_backend().name == "cuda":
        assert repr(dev) == f"<Device cuda:{dev.id}>" and dev == gpk.Device(dev.id)
    else:
        assert repr(dev) == "<Device cpu>" and dev == gpk.Device("cpu")
    assert repr(gpk.Device(0)) == "<Device cuda:0>" and gpk.Device("cuda:1").id == 1
    assert gpk.Device(2) == gpk.Device("cuda:2") and len({gpk.Device(0), gpk.Device(0)}) == 1
    assert pickle.loads(pickle.dumps(gpk.Device(1))) == gpk.Device(1)
    with pytest.raises(gpk.errors.GPUKitValueError):
        gpk.Device(-1)
    with pytest.raises(gpk.errors.GPUKitValueError):
        gpk.Device("tpu")
    with pytest.raises(gpk.DTypeError):
        gpk.Device(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ALL)
def test_pickle_round_trip(name: str) -> None:
    x = rand(np.random.default_rng(11), (3, 4), name)
    a = gpk.from_numpy(x)
    pending = a.T * 1 if name != "bool" else ~a.T  # a lazy result realises first
    for arr, want in ((a, x), (pending, x.T * 1 if name != "bool" else ~x.T), (a[1, 2], x[1, 2])):
        back = pickle.loads(pickle.dumps(arr))
        assert isinstance(back, gpk.GPUArray) and back.dtype == want.dtype
        assert back.shape == want.shape
        np.testing.assert_array_equal(back.to_numpy(), want)


def test_pickle_of_a_freed_array_raises() -> None:
    a = gpk.ones((2, 2))
    a.free()
    with pytest.raises(gpk.FreedArrayError, match="pickle"):
        pickle.dumps(a)


def test_numpy_from_dlpack_of_bfloat16_says_why() -> None:
    """NumPy has no DLPack code for bfloat16 and raises; the capsule's destructor used to be
    Python run with that exception pending, which lost it (SystemError)."""
    x = np.random.default_rng(12).standard_normal(5).astype(ml_dtypes.bfloat16)
    a = gpk.from_numpy(x)
    storage = get_backend().storage(a.node.realized)
    # NumPy refuses the dtype (host memory) or the device (CUDA) first
    with pytest.raises((RuntimeError, BufferError), match="Unsupported (dtype|device)") as e:
        np.from_dlpack(a)
    assert not isinstance(e.value, SystemError)
    del e
    gc.collect()
    assert not interop._exports and storage.pins == 0  # the unconsumed export was released
    if get_backend().name == "cpu":  # host memory: NumPy takes the other dtypes zero-copy
        y = np.random.default_rng(13).standard_normal(5).astype(np.float32)
        np.testing.assert_array_equal(np.from_dlpack(gpk.from_numpy(y)), y)
    cap = a.__dlpack__()  # never consumed: the destructor calls our deleter
    assert interop._exports
    del cap
    assert not interop._exports and storage.pins == 0


def test_mask_kernels_plan_and_compile_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The positions and ranks kernels (codegen/mask.py) compile with NVRTC for sm_80 and
    sm_90 and their planners give the IR's shapes, without a GPU."""
    pytest.importorskip("nvidia")
    import cuda_fakes

    from pygpukit import runtime
    from pygpukit.backends.cuda.context import contiguous
    from pygpukit.backends.cuda.plan import plan_step
    from pygpukit.backends.cuda.value import DeviceValue
    from pygpukit.ir import toposort
    from pygpukit.passes import lower, run_pipeline

    rng = np.random.default_rng(14)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    m = np.array([True, False, True, True, False, True])
    outs = [gpk.from_numpy(x)[m]]
    a = gpk.from_numpy(x)
    a[m] = rng.standard_normal((int(m.sum()), 5)).astype(np.float32)
    outs.append(a)
    for arch in ("sm_80", "sm_90"):
        cuda_fakes.install(monkeypatch, arch)
        for out in outs:
            order = toposort([out.node], is_leaf=lambda n: n.realized is not None)
            graph, leaves = runtime._graph_of(order, [out.node])
            sched = lower(run_pipeline(graph))
            env: list = [None] * sched.n_slots
            for s, n in zip(sched.input_slots, leaves, strict=True):
                mem = cuda_fakes.FakeStorage(max(1, int(np.prod(n.shape))) * n.dtype.itemsize)
                env[s] = DeviceValue(mem, n.shape, contiguous(n.shape), 0, n.dtype)  # type: ignore[arg-type]
            ops = []
            for step in sched.steps:
                ins = [env[i] for i in step.ins]
                env[step.out] = plan_step(cuda_fakes.FakeCtx(), step, ins)(ins)  # type: ignore[arg-type]
                assert env[step.out].shape == step.shape, step.op
                ops.append(step.op)
            assert ("flatnonzero" if out is outs[0] else "mask_rank") in ops
