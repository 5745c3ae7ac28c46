"""The eager fast path (eager_ops.py) and recorded pending-subgraph summaries (pending.py).

An eager elementwise call whose key was seen runs its cached schedule without recording;
a lazy realize of one node whose summary was seen runs its schedule without walking the
graph. Both must give what today's path gives (the first call of a key, or a realize after
the caches are cleared), and float64 NumPy, and raise what it raises, at the user's line.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import RTOL, np_dtype, rand, to64

import pygpukit as gpk
from pygpukit import eager_ops, runtime

HERE = "test_eager_fast_path.py"


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(18)


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    runtime._SCHEDULE_CACHE.clear()  # and the eager and summary caches linked to it


def _records(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ops runtime.record is called for from now on (the fast paths call it never)."""
    seen: list[str] = []
    record = runtime.record

    def counting(op: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(op)
        return record(op, *args, **kwargs)

    monkeypatch.setattr(runtime, "record", counting)
    return seen


# ---- operands: a realised array of some layout, or a Python scalar -----------------------

Spec = tuple[Any, ...]


def _host(rng: np.random.Generator, spec: Spec, positive: bool) -> Any:
    if spec[0] == "scalar":
        return spec[1]
    _, shape, dtype, view = spec
    base = shape
    if view == "T":
        base = shape[::-1]
    elif view == "step":
        base = (shape[0] * 2, *shape[1:])
    return rand(rng, base, dtype, positive=positive)


def _device(h: Any, spec: Spec) -> Any:
    if spec[0] == "scalar":
        return h
    x = gpk.from_numpy(h)
    view = spec[3]
    if view == "T":
        return x.T
    if view == "step":
        return x[::2]
    return x


def _view_host(h: Any, spec: Spec) -> Any:
    if spec[0] == "scalar":
        return h
    if spec[3] == "T":
        return h.T
    if spec[3] == "step":
        return h[::2]
    return h


def _f64(h: Any) -> Any:
    return to64(h) if isinstance(h, np.ndarray) else h


def A(shape: tuple[int, ...], dtype: str = "float32", view: str = "") -> Spec:
    return ("array", shape, dtype, view)


def S(value: Any) -> Spec:
    return ("scalar", value)


BINARY: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "add": (operator.add, np.add), "sub": (operator.sub, np.subtract),
    "mul": (operator.mul, np.multiply), "div": (operator.truediv, np.divide),
    "pow": (operator.pow, np.power), "floor_divide": (operator.floordiv, np.floor_divide),
    "remainder": (operator.mod, np.remainder), "maximum": (gpk.maximum, np.maximum),
    "minimum": (gpk.minimum, np.minimum), "lt": (operator.lt, np.less),
    "eq": (operator.eq, np.equal), "ge": (operator.ge, np.greater_equal),
    "and": (operator.and_, np.logical_and), "xor": (operator.xor, np.logical_xor),
    "bitwise_or": (operator.or_, np.bitwise_or),
}  # fmt: skip

CASES = [
    ("add", A((33,)), S(0.5)),
    ("add", S(3), A((4, 5), "int32")),
    ("add", A((4, 5), "int8"), S(-7)),
    ("add", A((3, 1)), A((1, 5))),  # broadcasting
    ("add", A(()), S(2.5)),  # 0-d
    ("add", A(()), A((6,))),
    ("sub", A((5, 4), view="T"), S(-0.0)),  # a transposed view; -0.0 is not 0.0
    ("sub", S(0.0), A((5, 4), view="T")),
    ("mul", A((6, 3), view="step"), A((6, 3))),  # a strided view
    ("mul", A((7,), "int32"), S(2.5)),  # int array, float scalar: the default float
    ("mul", A((7,), "float16"), S(3)),
    ("mul", A((7,), "bool"), S(True)),
    ("div", A((8,), "int64"), S(4)),
    ("div", S(1.0), A((8,), "float64")),
    ("pow", A((9,), "float32"), S(2)),
    ("pow", A((9,), "int32"), A((9,), "int32")),
    ("floor_divide", A((10,), "int32"), S(3)),
    ("remainder", A((10,), "float32"), S(1.5)),
    ("maximum", A((3, 4)), S(float("nan"))),
    ("minimum", A((3, 4), "int8"), A((4,), "int8")),
    ("lt", A((12,), "int8"), S(300)),  # NumPy 2 compares out-of-range ints exactly
    ("lt", A((12,), "int32"), S(0.5)),
    ("eq", A((12,), "int32"), S(3)),
    ("ge", A((5, 5)), A((5, 5), view="T")),
    ("and", A((11,), "bool"), A((11,), "bool")),
    ("xor", A((11,), "bool"), S(True)),
    ("bitwise_or", A((11,), "int32"), S(6)),
]


def _tolerance(dtype: Any) -> float:
    return RTOL.get(dtype.name, 0.0)


@pytest.mark.parametrize(("op", "lhs", "rhs"), CASES, ids=lambda c: str(c))
def test_eager_fast_path_matches_todays_path_and_float64(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, op: str, lhs: Spec, rhs: Spec
) -> None:
    fn, ref_fn = BINARY[op]
    positive = op in ("pow", "floor_divide", "remainder", "div")

    def operands() -> tuple[Any, Any, Any, Any]:
        ha, hb = _host(rng, lhs, positive), _host(rng, rhs, positive)
        return ha, hb, _device(ha, lhs), _device(hb, rhs)

    with gpk.eager():
        _, _, a0, b0 = operands()
        first = fn(a0, b0)  # today's path; the key is learnt from it
        assert len(runtime.EAGER_CACHE) == 1
        ha, hb, a, b = operands()  # new values, the same layouts
        seen = _records(monkeypatch)
        fast = fn(a, b)
        assert seen == [] and fast.is_realized  # no recording: the cached schedule ran
        monkeypatch.undo()
        runtime._SCHEDULE_CACHE.clear()
        again = fn(a, b)  # today's path on the same operands
    lazy = fn(_device(ha, lhs), _device(hb, rhs))
    assert fast.dtype == again.dtype == lazy.dtype == first.dtype
    assert fast.shape == again.shape == lazy.shape
    np.testing.assert_array_equal(fast.to_numpy(), again.to_numpy())
    va, vb = _view_host(ha, lhs), _view_host(hb, rhs)
    with np.errstate(all="ignore"):
        ref = ref_fn(va, vb) if op == "bitwise_or" else ref_fn(_f64(va), _f64(vb))
    tol = _tolerance(fast.dtype)
    finite = np.abs(to64(ref))[np.isfinite(to64(ref))]
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    for out in (fast, lazy):
        np.testing.assert_allclose(to64(out.to_numpy()), to64(ref), rtol=tol, atol=tol * scale)


UNARY = [("exp", gpk.exp, np.exp, "float32"), ("log", gpk.log, np.log, "float16"),
         ("sqrt", gpk.sqrt, np.sqrt, "int32"), ("tanh", gpk.tanh, np.tanh, "bfloat16"),
         ("neg", operator.neg, np.negative, "int64"), ("abs", abs, np.abs, "float64"),
         ("sigmoid", gpk.sigmoid, lambda x: 1 / (1 + np.exp(-x)), "float32"),
         ("invert", operator.invert, np.invert, "bool")]  # fmt: skip


@pytest.mark.parametrize(("name", "fn", "ref_fn", "dtype"), UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("view", ["", "T"])
def test_eager_unary_fast_path(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, name: str,
                               fn: Any, ref_fn: Any, dtype: str, view: str) -> None:  # fmt: skip
    spec = A((4, 6), dtype, view)
    with gpk.eager():
        fn(_device(_host(rng, spec, True), spec))
        h = _host(rng, spec, True)
        x = _device(h, spec)
        seen = _records(monkeypatch)
        fast = fn(x)
        assert seen == []
        monkeypatch.undo()
        runtime._SCHEDULE_CACHE.clear()
        again = fn(x)
    np.testing.assert_array_equal(fast.to_numpy(), again.to_numpy())
    assert fast.dtype == again.dtype
    ref = ref_fn(h.T if view else h) if dtype == "bool" else ref_fn(to64(h.T if view else h))
    tol = _tolerance(fast.dtype)
    np.testing.assert_allclose(to64(fast.to_numpy()), to64(ref), rtol=tol, atol=tol * 30)


def test_same_array_twice_is_its_own_key(rng: np.random.Generator) -> None:
    """x + x and x + y have operands of one layout: which operands are one array is in the
    key, or x + y would run as x + x."""
    hx, hy = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    with gpk.eager():
        x, y = gpk.from_numpy(hx), gpk.from_numpy(hy)
        for _ in range(2):
            np.testing.assert_allclose(to64((x + x).to_numpy()), to64(hx) * 2, rtol=1e-6)
            np.testing.assert_allclose(to64((x + y).to_numpy()), to64(hx) + to64(hy), rtol=1e-6)
            np.testing.assert_allclose(to64((y - x).to_numpy()), to64(hy) - to64(hx), rtol=1e-6)


def test_scalar_values_are_in_the_key(rng: np.random.Generator) -> None:
    """Each scalar is a constant of its cached schedule: another value is another key (0.0
    and -0.0 too, and 1, 1.0 and True, which compare equal)."""
    h = np.concatenate([rng.standard_normal(7), [0.0]]).astype(np.float32)
    with gpk.eager():
        x = gpk.from_numpy(h)
        for v in (1.0, 2.0, -0.0, 0.0, 1, True, 2.0, float("inf"), -0.0, 1.0, 0.0):
            out = (x * v).to_numpy()
            with np.errstate(invalid="ignore"):  # inf * 0
                ref = h * np.float32(v)
            np.testing.assert_array_equal(out, ref)
            num = ~np.isnan(ref)  # a NaN's sign is not specified (x86 makes -nan, CUDA nan)
            np.testing.assert_array_equal(np.signbit(out[num]), np.signbit(ref[num]))


# ---- errors --------------------------------------------------------------------------------


def _line() -> int:
    return inspect.currentframe().f_back.f_lineno  # type: ignore[union-attr]


def test_shape_errors_on_first_and_later_calls_name_the_line(rng: np.random.Generator) -> None:
    with gpk.eager():
        a = gpk.from_numpy(rng.standard_normal(3).astype(np.float32))
        b = gpk.from_numpy(rng.standard_normal(3).astype(np.float32))
        c = gpk.from_numpy(rng.standard_normal(4).astype(np.float32))
        for _ in range(2):
            with pytest.raises(gpk.ShapeError) as e:
                line = _line() + 1
                a + c
            assert f"{HERE}:{line}" in str(e.value) and "add" in str(e.value), str(e.value)
        a + b  # learnt for f32[3] + f32[3]
        a + b
        with pytest.raises(ValueError) as e:  # the cached op with a bad shape: a new key
            line = _line() + 1
            a + c
        assert isinstance(e.value, gpk.ShapeError) and f"{HERE}:{line}" in str(e.value)


def test_scalar_overflow_raises_on_every_call() -> None:
    with gpk.eager():
        x = gpk.from_numpy(np.arange(1, 5, dtype=np.int8))
        x + 3
        for _ in range(2):
            with pytest.raises(OverflowError) as e:
                line = _line() + 1
                x + 300
            assert isinstance(e.value, gpk.GPUKitError) and f"{HERE}:{line}" in str(e.value)


def test_run_error_of_a_cached_call_names_its_own_line(rng: np.random.Generator) -> None:
    """A cached schedule built at one line and run from another: an error of the run names
    the line that ran it."""
    x = gpk.from_numpy(rng.integers(2, 9, 6).astype(np.int32))
    p = gpk.from_numpy(rng.integers(0, 4, 6).astype(np.int32))
    n = gpk.from_numpy(np.array([1, -2, 3, 1, 2, 3], np.int32))
    with gpk.eager():
        np.testing.assert_array_equal((x**p).to_numpy(), x.to_numpy() ** p.to_numpy())
        np.testing.assert_array_equal((x**p).to_numpy(), x.to_numpy() ** p.to_numpy())
        hits = runtime.stats["schedule_hits"]
        with pytest.raises(ValueError) as e:
            line = _line() + 1
            (x**n).to_numpy()  # a device reports at the next sync: make it this line's
        assert runtime.stats["schedule_hits"] == hits + 1  # the cached schedule ran
    assert isinstance(e.value, gpk.GPUKitError) and "pow" in str(e.value)
    assert f"{HERE}:{line}" in str(e.value), str(e.value)


def test_freed_operands_raise(rng: np.random.Generator) -> None:
    with gpk.eager():
        x = gpk.from_numpy(rng.standard_normal(5).astype(np.float32))
        x * 2.0
        x * 2.0
        y = gpk.from_numpy(rng.standard_normal(5).astype(np.float32))
        y.free()
        with pytest.raises(gpk.FreedArrayError) as e:
            line = _line() + 1
            y * 2.0
        assert "freed" in str(e.value) and f"{HERE}:{line}" in str(e.value), str(e.value)
        np.testing.assert_allclose((x * 2.0).to_numpy(), x.to_numpy() * 2.0)


def test_eager_cache_is_bounded() -> None:
    """10,000 distinct shapes: the cache keeps the latest LIMIT keys (the others are
    learnt again if they come back)."""
    with gpk.eager():
        for k in range(1, 10_001):
            x = gpk.from_numpy(np.full(k, 0.25, np.float32))
            y = x + 1.0
            assert len(runtime.EAGER_CACHE) <= eager_ops.LIMIT
        np.testing.assert_array_equal(y.to_numpy(), np.full(10_000, 1.25, np.float32))
    assert len(runtime.EAGER_CACHE) == eager_ops.LIMIT


class _Replays:
    """backend.eager_replay for the NumPy backend, as the CUDA backend answers it: None
    until `ready`, then a replay running the schedule (counted) that declines (None) while
    `declining`; the CUDA replay itself is tested in test_dispatch_controller.py."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.asked = 0
        self.ran = 0
        self.ready = False
        self.declining = False

    def __call__(self, schedule: Any, inputs: Any) -> Any:
        self.asked += 1
        if not self.ready:
            return None

        def replay(ins: Any) -> Any:
            if self.declining:
                return None
            self.ran += 1
            (value,) = self.backend.run(schedule, ins)
            return value

        return replay


def test_eager_hits_take_the_backends_replay(monkeypatch: pytest.MonkeyPatch,
                                             rng: np.random.Generator) -> None:  # fmt: skip
    """A hit asks backend.eager_replay after each backend.run until it has a replay, then
    calls that alone; a replay that declines sends the hit to backend.run and is asked for
    again."""
    backend = gpk.backends.get_backend()
    replays = _Replays(backend)
    monkeypatch.setattr(backend, "eager_replay", replays, raising=False)
    runs: list[int] = []
    run = backend.run
    monkeypatch.setattr(backend, "run", lambda s, ins: runs.append(1) or run(s, ins))
    h = rng.standard_normal(12).astype(np.float32)
    ref = to64(h) * 1.5 - 0.25
    with gpk.eager():
        x = gpk.from_numpy(h)
        x * 1.5  # learnt: today's path (two realizes: the scalar, then the op)
        assert replays.asked == 0
        runs.clear()
        for _ in range(2):  # hits with no replay yet: backend.run, then ask
            x * 1.5
        assert (replays.asked, replays.ran, len(runs)) == (2, 0, 2)
        replays.ready = True
        x * 1.5
        assert (replays.asked, replays.ran, len(runs)) == (3, 0, 3)
        y = x * 1.5
        assert (replays.asked, replays.ran, len(runs)) == (3, 1, 4)  # the replay's own run
        np.testing.assert_allclose(to64((y - 0.25).to_numpy()), ref, rtol=1e-6)
        runs.clear()
        replays.declining = True
        z = x * 1.5  # declined: backend.run; the replay is dropped
        assert (replays.asked, replays.ran, len(runs)) == (3, 1, 1) and z.shape == (12,)
        replays.declining = False
        x * 1.5  # backend.run, then asked again
        assert (replays.asked, replays.ran, len(runs)) == (4, 1, 2)
        z = x * 1.5
        assert (replays.asked, replays.ran, len(runs)) == (4, 2, 3)
        np.testing.assert_allclose(to64((z - 0.25).to_numpy()), ref, rtol=1e-6)
        asked, ran = replays.asked, replays.ran
        for _ in range(3):  # x + x: a schedule of one input, so replayed like any other
            twice = x + x
        assert (replays.asked, replays.ran) == (asked + 1, ran + 1)
        np.testing.assert_allclose(to64(twice.to_numpy()), to64(h) * 2, rtol=1e-6)


# ---- lazy: realizes found by the recorded summary -------------------------------------------


def _realize_by_summary(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts realizes that walked the graph (runtime.toposort)."""
    walks: list[int] = []
    toposort = runtime.toposort

    def counting(*args: Any, **kwargs: Any) -> Any:
        walks.append(1)
        return toposort(*args, **kwargs)

    monkeypatch.setattr(runtime, "toposort", counting)
    return walks


def _silu_chain(x: Any, w: Any) -> Any:
    h = x * w + 0.5  # h is read three times below: a graph that shares a pending node
    y = h * gpk.sigmoid(h) - h * 0.25
    return (y * y).sum(axis=-1)


def test_lazy_summary_realize_matches_the_walk(monkeypatch: pytest.MonkeyPatch,
                                               rng: np.random.Generator) -> None:  # fmt: skip
    def ref(hx: np.ndarray, hw: np.ndarray) -> np.ndarray:
        h = to64(hx) * to64(hw) + 0.5
        y = h / (1 + np.exp(-h)) - h * 0.25
        return np.asarray((y * y).sum(axis=-1))

    walks = _realize_by_summary(monkeypatch)
    for k in range(4):
        hx = rng.standard_normal((3, 8)).astype(np.float32)
        hw = rng.standard_normal((8,)).astype(np.float32)
        x, w = gpk.from_numpy(hx), gpk.from_numpy(hw)
        # Both orders of the leaves: the key says which leaf each input reads.
        out = _silu_chain(x, w) if k % 2 == 0 else _silu_chain(w, x)
        np.testing.assert_allclose(to64(out.to_numpy()), ref(hx, hw), rtol=1e-5, atol=1e-5)
    assert len(walks) == 2  # one walk per order; the later realizes found the summary


def test_leaf_identity_is_in_the_summary_key(rng: np.random.Generator) -> None:
    """Graphs alike but for which leaves are one array: each realize reads its own."""
    ha, hb = (rng.standard_normal(9).astype(np.float32) for _ in range(2))
    a64, b64 = to64(ha), to64(hb)
    cases = [(lambda a, b: (a * 2.0) - (a * 3.0), -a64),
             (lambda a, b: (a * 2.0) - (b * 3.0), 2 * a64 - 3 * b64),
             (lambda a, b: (b * 2.0) - (a * 3.0), 2 * b64 - 3 * a64),
             (lambda a, b: (a - b) * 2.0, (a64 - b64) * 2),
             (lambda a, b: (a - a) * 2.0 + b, b64),
             (lambda a, b: (b - a) * 2.0, (b64 - a64) * 2),
             (lambda a, b: (a * 2.0 - b) + a * 4.0, 6 * a64 - b64),
             (lambda a, b: (a * 2.0 - b) + b * 4.0, 2 * a64 + 3 * b64)]  # fmt: skip
    for _ in range(2):
        for fn, ref in cases:
            out = fn(gpk.from_numpy(ha), gpk.from_numpy(hb)).to_numpy()
            np.testing.assert_allclose(to64(out), ref, rtol=1e-6, atol=1e-6)


def test_many_recorded_then_each_realized(monkeypatch: pytest.MonkeyPatch,
                                          rng: np.random.Generator) -> None:  # fmt: skip
    hs = [rng.standard_normal(10).astype(np.float32) for _ in range(20)]
    outs = [(gpk.from_numpy(h) + 1.0) * 3.0 for h in hs]
    walks = _realize_by_summary(monkeypatch)
    for h, o in zip(hs, outs, strict=True):
        np.testing.assert_allclose(to64(o.to_numpy()), (to64(h) + 1.0) * 3.0, rtol=1e-6)
    assert len(walks) == 1


def test_summary_of_a_node_whose_input_was_realized_since(rng: np.random.Generator) -> None:
    """z's summary included y; y realized alone since: z's graph now stops at y's value."""
    h = rng.standard_normal(6).astype(np.float32)
    for _ in range(3):
        x = gpk.from_numpy(h)
        y = x * 2.0 + 1.0
        z = y - 3.0
        w = y * y
        np.testing.assert_allclose(to64(y.to_numpy()), to64(h) * 2 + 1, rtol=1e-6)
        np.testing.assert_allclose(to64(z.to_numpy()), to64(h) * 2 - 2, rtol=1e-6)
        np.testing.assert_allclose(to64(w.to_numpy()), (to64(h) * 2 + 1) ** 2, rtol=1e-5)


def test_freed_leaf_and_freed_pending_node_raise(rng: np.random.Generator) -> None:
    h = rng.standard_normal(6).astype(np.float32)
    for _ in range(2):
        x = gpk.from_numpy(h)
        (x + 1.0).to_numpy()
    x = gpk.from_numpy(h)
    y = x + 1.0
    x.free()
    with pytest.raises(gpk.FreedArrayError) as e:
        y.to_numpy()
    assert "add" in str(e.value) and "freed" in str(e.value)
    for _ in range(2):
        x = gpk.from_numpy(h)
        ((x + 1.0) * 2.0).to_numpy()
    x = gpk.from_numpy(h)
    y = x + 1.0
    z = y * 2.0
    y.free()  # a pending node inside z's summary
    with pytest.raises(gpk.FreedArrayError):
        z.to_numpy()


def test_summary_errors_name_the_line_of_the_failing_realize(rng: np.random.Generator) -> None:
    x = gpk.from_numpy(rng.integers(2, 9, 6).astype(np.int32))
    p = gpk.from_numpy(rng.integers(0, 4, 6).astype(np.int32))
    for _ in range(2):
        (x**p + 1).to_numpy()
    n = gpk.from_numpy(np.array([1, -2, 3, 1, 2, 3], np.int32))
    y = x**n + 1
    line = _line() - 1
    with pytest.raises(ValueError) as e:
        y.to_numpy()
    assert f"{HERE}:{line}" in str(e.value), str(e.value)


def test_eager_lazy_and_compiled_interleaved(rng: np.random.Generator) -> None:
    @gpk.compile
    def step(x: gpk.GPUArray, w: gpk.GPUArray) -> gpk.GPUArray:
        return gpk.tanh(x * w + 0.5) * 2.0

    hw = rng.standard_normal(16).astype(np.float32)
    w = gpk.from_numpy(hw)
    for _ in range(4):
        h = rng.standard_normal(16).astype(np.float32)
        x = gpk.from_numpy(h)
        with gpk.eager():
            e = (x + 1.0) * w
        lazy = gpk.exp(e * 0.1) - x
        c = step(lazy, w)
        with gpk.eager():
            d = c - 0.5
        e64 = (to64(h) + 1.0) * to64(hw)
        l64 = np.exp(e64 * 0.1) - to64(h)
        np.testing.assert_allclose(to64(e.to_numpy()), e64, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(to64(lazy.to_numpy()), l64, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(to64(d.to_numpy()), np.tanh(l64 * to64(hw) + 0.5) * 2 - 0.5,
                                   rtol=1e-5, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "int32", "float16"])
def test_lazy_scalar_records_match_the_rules(rng: np.random.Generator, dtype: str) -> None:
    """The lazy array-scalar record (a spec learnt from the first record) gives the nodes
    the op rules give: dtype, shape, value."""
    h = rand(rng, (3, 4), dtype)
    for _ in range(2):
        x = gpk.from_numpy(h)
        outs = [x + 2, 2.5 * x, x - True, x < 1.5, 3 - x]
        refs = [to64(h) + 2, 2.5 * to64(h), to64(h) - 1, to64(h) < 1.5, 3 - to64(h)]
        want = [np.add(h, 2).dtype, None, np.subtract(h, True).dtype, np.bool_, None]
        for o, r, d in zip(outs, refs, want, strict=True):
            if d is not None:
                assert np_dtype(o.dtype.name) == d
            np.testing.assert_allclose(to64(o.to_numpy()), to64(r), rtol=RTOL.get(dtype, 0) * 4,
                                       atol=RTOL.get(dtype, 0) * 20)  # fmt: skip
