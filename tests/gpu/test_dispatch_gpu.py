"""The Rust dispatch controller on the device: eager ops and cached lazy realizes replayed
from recorded launch plans give what the general path and float64 NumPy give, over ops,
dtypes, shapes and strided views; the plan cache stays bounded; errors keep naming the op
and the user's line; plans interleave with compiled graphs and to_numpy."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
import pygpukit.backends as backends
from pygpukit import _rust
from pygpukit.backends.cuda import dispatch

pytestmark = pytest.mark.gpu

SEED = int(os.environ.get("PGK_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
print(f"test_dispatch_gpu seed {SEED}")
CALLS = 4  # general, recorded, then native twice


@pytest.fixture(autouse=True)
def cuda() -> Iterator[Any]:
    b = backends.get_backend()
    if b.name != "cuda":
        pytest.skip("the CUDA backend is not active")
    saved = b.poison
    b.poison = False  # the controller is bypassed while outputs are poisoned
    yield b
    b.synchronize()
    b.poison = saved


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng([SEED, zlib.crc32(name.encode())])


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype.startswith("int"):
        return rng.integers(-50, 50, shape).astype(dtype)
    return (rng.standard_normal(shape) + 0.1).astype(dtype)


CASES: list[tuple[str, Callable[..., Any], Callable[..., Any], int]] = [
    ("add_scalar", lambda x: x + 1, lambda x: x + 1, 1),
    ("mul_add", lambda x, y: x * y + 0.5, lambda x, y: x * y + 0.5, 2),
    ("sub_neg", lambda x, y: -(x - y), lambda x, y: -(x - y), 2),
    ("exp_tanh", lambda x: gpk.tanh(gpk.exp(x * 0.1)), lambda x: np.tanh(np.exp(x * 0.1)), 1),
    ("where", lambda x, y: gpk.where(x > y, x, y), lambda x, y: np.where(x > y, x, y), 2),
    ("sum_axis", lambda x: gpk.sum(x, axis=-1), lambda x: np.sum(x, axis=-1), 1),
    ("max_all", lambda x: gpk.max(x), lambda x: np.max(x), 1),
    ("cast", lambda x: x.astype(gpk.float64) * 2, lambda x: x.astype(np.float64) * 2, 1),
]
LAYOUTS = {
    "contig": lambda a: a,
    "strided": lambda a: a[..., ::2],
    "transposed": lambda a: a.T,
}


def _ints_ok(name: str) -> bool:
    return name not in ("exp_tanh",)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_native_results_match_float64_numpy(cuda: Any, case: Any, dtype: str, layout: str,
                                            mode: str) -> None:  # fmt: skip
    name, fn, ref_fn, arity = case
    if dtype == "int32" and not _ints_ok(name):
        pytest.skip("float-only op")
    rng = _rng(f"{name}-{dtype}-{layout}-{mode}")
    before = dict(cuda.native.stats)
    view = LAYOUTS[layout]
    for _ in range(CALLS):  # fresh inputs each call: the plan reads this call's pointers
        hosts = [_random(rng, (6, 16), dtype) for _ in range(arity)]
        args = [view(gpk.from_numpy(h)) for h in hosts]
        ref = np.asarray(ref_fn(*[view(h.astype(np.float64)) for h in hosts]))
        if mode == "eager":
            with gpk.eager():
                out = fn(*args)
        else:
            out = fn(*args)
        got = out.to_numpy()
        assert got.shape == ref.shape
        tol = 1e-5 if got.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)
    assert cuda.native.stats["native_runs"] > before["native_runs"], cuda.native.stats


def test_eager_and_lazy_agree_through_the_native_path(cuda: Any) -> None:
    rng = _rng("agree")
    for _ in range(CALLS):
        h = _random(rng, (1024,), "float32")
        x = gpk.from_numpy(h)
        lazy = x
        for _ in range(16):
            lazy = lazy * 1.0001 + 0.5
        with gpk.eager():
            eager = x
            for _ in range(16):
                eager = eager * 1.0001 + 0.5
        a, b = lazy.to_numpy(), eager.to_numpy()
        ref = h.astype(np.float64)
        for _ in range(16):
            ref = ref * 1.0001 + 0.5
        np.testing.assert_allclose(a, ref, rtol=1e-5)
        np.testing.assert_allclose(b, ref, rtol=1e-5)


def test_ten_thousand_shapes_keep_the_plan_cache_bounded(
    cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctrl = _rust.Dispatcher(capacity=256)
    monkeypatch.setattr(cuda.native, "ctrl", ctrl)
    monkeypatch.setattr(dispatch, "_GENERAL_RUNS", 0)  # record on the first run
    x = gpk.from_numpy(np.arange(10_000 + 1, dtype=np.float32))
    for n in range(1, 10_001):
        y = (x[:n] * 2.0).realize()
    st = ctrl.stats()
    assert st["plans"] <= 256 and st["evicted"] >= 10_000 - 256 - 10, st
    assert len(ctrl) <= 256
    np.testing.assert_array_equal(y.to_numpy(), np.arange(10_000, dtype=np.float32) * 2)


def test_device_errors_still_name_the_op_and_the_line(cuda: Any) -> None:
    base = gpk.from_numpy(np.array([2, 3, 4], np.int32))
    for k in range(CALLS):
        e = gpk.from_numpy(np.array([1, -1 if k == CALLS - 1 else 2, 0], np.int32))
        with gpk.eager():
            out = base**e  # the line the error names
        if k < CALLS - 1:
            np.testing.assert_array_equal(out.to_numpy(), np.array([2, 9, 1]))
    assert cuda.native.stats["native_runs"] > 0
    with pytest.raises(gpk.GPUKitError, match="negative integer powers") as info:
        cuda.synchronize()
    assert "test_dispatch_gpu.py" in str(info.value)


def test_eager_fast_path_keeps_each_scalar_its_own_constant(cuda: Any) -> None:
    """Eager x * s over four scalars in turn, fresh strided x each call: each (op, layout,
    scalar) key runs its cached schedule (eager_ops.py) with its own device constant, and
    the later calls go through the controller."""
    from pygpukit import runtime

    runtime._SCHEDULE_CACHE.clear()  # and the eager cache
    rng = _rng("eager-scalars")
    before = cuda.native.stats["native_runs"]
    scalars = (0.5, -2.0, 3, True)
    for k in range(len(scalars) * CALLS):
        s = scalars[k % len(scalars)]
        h = _random(rng, (6, 16), "float32")
        with gpk.eager():
            x = gpk.from_numpy(h)[..., ::2]
            out = x * s
        ref = h[..., ::2].astype(np.float64) * float(s)
        np.testing.assert_allclose(out.to_numpy().astype(np.float64), ref, rtol=1e-6, atol=1e-6)
    assert len(runtime.EAGER_CACHE) == len(scalars)
    assert cuda.native.stats["native_runs"] > before


def test_zero_fills_are_written_on_every_call(cuda: Any) -> None:
    """A zero `full` is a memset, which the launch recorder does not see: its schedule is
    never replayed from a plan. Before, the third realize of a zero constant (here the
    False of maximum(y, False), after y | False and y + False) and every gpk.zeros after
    the second came back holding whatever the block held before (True, old bytes)."""
    from pygpukit import runtime

    runtime._SCHEDULE_CACHE.clear()
    rng = _rng("zero-fills")
    h = rng.random(257) < 0.5
    with gpk.eager():
        y = gpk.from_numpy(h)
        np.testing.assert_array_equal((y | False).to_numpy(), h)
        np.testing.assert_array_equal((y + False).to_numpy(), h)
        np.testing.assert_array_equal(gpk.maximum(y, False).to_numpy(), h)
        for dtype in ("int8", "float32", "bool"):
            for _ in range(CALLS):
                nonzero = (np.abs(_random(rng, (3, 5), "float32")) + 1).astype(dtype)
                junk = gpk.from_numpy(nonzero)
                del junk  # its block goes back to the pool
                np.testing.assert_array_equal(gpk.zeros((3, 5), dtype=dtype).to_numpy(), 0)


def test_an_eager_hit_is_one_controller_run(cuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once recorded, an eager op's hit runs its EagerReplay: one Dispatcher.run, neither
    CudaBackend.run nor the per-layout plan lookup; switched off, it takes the general path."""
    from pygpukit import runtime

    runtime._SCHEDULE_CACHE.clear()  # and the eager cache
    rng = _rng("eager-replay")
    h = _random(rng, (5, 40), "float32")
    ref = h[:, 1::3].astype(np.float64) * 0.75
    with gpk.eager():
        x = gpk.from_numpy(h)[:, 1::3]  # realized: a pending operand takes the general path
        for _ in range(CALLS):
            x * 0.75
    (entry,) = runtime.EAGER_CACHE.values()
    assert isinstance(entry.replay, dispatch.EagerReplay)

    def refused(*args: Any) -> Any:
        raise AssertionError("an eager hit left the replay")

    before = cuda.native.stats["native_runs"]
    with monkeypatch.context() as m:
        m.setattr(cuda, "run", refused)
        m.setattr(cuda.native, "run", refused)
        with gpk.eager():
            out = x * 0.75
    assert cuda.native.stats["native_runs"] == before + 1
    np.testing.assert_allclose(out.to_numpy().astype(np.float64), ref, rtol=1e-6)
    native = cuda.native
    cuda.native = None
    try:
        with gpk.eager():
            off = x * 0.75
    finally:
        cuda.native = native
    assert native.stats["native_runs"] == before + 1
    np.testing.assert_allclose(off.to_numpy().astype(np.float64), ref, rtol=1e-6)


def test_freed_inputs_are_still_refused(cuda: Any) -> None:
    for _ in range(CALLS):
        x = gpk.from_numpy(np.ones(8, np.float32))
        with gpk.eager():
            (x + 1).to_numpy()
    x.free()
    with pytest.raises(gpk.FreedArrayError), gpk.eager():
        x + 1


def test_plans_interleave_with_compiled_graphs_and_to_numpy(cuda: Any) -> None:
    rng = _rng("interleave")
    f = gpk.compile(lambda a: gpk.tanh(a) * 2.0)
    for _ in range(CALLS + 2):
        h = _random(rng, (256,), "float32")
        x = gpk.from_numpy(h)
        with gpk.eager():
            y = x * 3.0 - 1.0
        z = f(y)
        w = (z + y).realize()
        ref = np.tanh(h * 3.0 - 1.0) * 2.0 + (h * 3.0 - 1.0)
        np.testing.assert_allclose(w.to_numpy(), ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(y.to_numpy(), h * 3.0 - 1.0, rtol=1e-6)
    assert cuda.native.stats["native_runs"] > 0


def test_an_eager_operator_hit_is_one_native_call(
    cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its key has a controller plan, an eager `x op y` / `x op scalar` is served by
    eager_ops.NATIVE (rust/pygpukit-py/src/eager.rs) with no Python hit, over contiguous
    and strided operands, and gives float64 NumPy's result; the user's line is its node's."""
    from pygpukit import eager_ops, runtime
    from pygpukit.ir.source import resolve

    runtime._SCHEDULE_CACHE.clear()  # and the eager cache and NATIVE
    rng = _rng("eager-native")
    hx, hy = _random(rng, (64, 48), "float32"), _random(rng, (64, 48), "float32")
    views: list[Any] = []  # the strided operands, made once (each slice is a run too)
    cases = [
        (lambda x, y: x + 1.0, lambda x, y: x + 1.0),
        (lambda x, y: 0.5 * y, lambda x, y: 0.5 * y),
        (lambda x, y: x * y, lambda x, y: x * y),
        (lambda x, y: views[0] - views[1], lambda x, y: x[:, ::3] - y[:, 1::3]),
    ]
    with gpk.eager():
        x, y = gpk.from_numpy(hx), gpk.from_numpy(hy)
        views += [x[:, ::3], y[:, 1::3]]
        for op, _ in cases:
            for _ in range(CALLS):
                op(x, y)
        assert len(eager_ops.NATIVE) == len(cases)
        before = cuda.native.stats["native_runs"]

        def refused(*args: Any) -> Any:
            raise AssertionError("a native eager hit took the Python hit")

        monkeypatch.setattr(eager_ops, "hit", refused)
        outs = [op(x, y) for op, _ in cases]
        line = outs[-1]._node.where
    assert cuda.native.stats["native_runs"] == before + len(cases)
    loc = resolve(line)
    assert loc is not None and loc.file.endswith("test_dispatch_gpu.py"), loc
    for out, (_, ref) in zip(outs, cases, strict=True):
        want = ref(hx.astype(np.float64), hy.astype(np.float64))
        np.testing.assert_allclose(out.to_numpy().astype(np.float64), want, rtol=1e-6, atol=1e-6)
