"""@gpk.compile: cache keys and miss reasons, dynamic scalars, in-place KV updates,
TraceError, pytrees, methods and closures, static outputs, steady memory."""

from __future__ import annotations

import gc
import math
import tracemalloc
import warnings

import numpy as np
import pytest
from passes_util import arr, close, f64, gelu64, rms64

import pygpukit as gpk
from pygpukit.compile import StaleOutputError


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(99)


def test_compiled_block_matches_float64_and_fuses(rng):
    w, b, g = (gpk.from_numpy(a) for a in (arr(rng, 32, 16), arr(rng, 32), arr(rng, 32)))

    @gpk.compile
    def block(x):
        h = gpk.nn.gelu(x @ w.T + b)
        return h * gpk.rsqrt((h * h).mean(-1, keepdims=True) + 1e-6) * g

    for _ in range(3):
        x = arr(rng, 4, 16)
        y = block(gpk.from_numpy(x))
        h = gelu64(f64(x) @ f64(w).T + f64(b), "none")
        close(y.to_numpy(), rms64(h, f64(g), 1e-6))
    st = block.stats()
    assert (st["hits"], st["misses"]) == (2, 1) and st["reasons"] == ["first call"]
    (entry,) = st["entries"]
    assert entry["kernels"] == 2  # linear + rms_norm
    schedule = block._cache[next(iter(block._cache))].program.schedule
    assert {s.op for s in schedule.steps} == {"linear", "rms_norm"}
    assert schedule.info["arena_bytes"] <= schedule.info["naive_bytes"]


def test_miss_reasons_and_warning(rng):
    @gpk.compile
    def f(x, n, mode="a"):
        return x * n

    f(gpk.from_numpy(arr(rng, 1, 7)), 2)
    f(gpk.from_numpy(arr(rng, 1, 8)), 2)
    f(gpk.from_numpy(arr(rng, 1, 8).astype(np.float16)), 2)
    with pytest.warns(UserWarning, match=r"traced 4 times; reasons: arg 0 shape"):
        f(gpk.from_numpy(arr(rng, 1, 8).astype(np.float16)), 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(gpk.from_numpy(arr(rng, 1, 8).astype(np.float16)), 3, mode="b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        f(gpk.from_numpy(arr(rng, 1, 9).astype(np.float16)), 3, mode="b")
    st = f.stats()
    assert st["reasons"][:5] == [
        "first call",
        "arg 0 shape (1,7) -> (1,8)",
        "arg 0 dtype f32 -> f16",
        "arg 1 value 2 -> 3",
        "kwarg mode new: value 'b'",
    ]
    assert st["misses"] == 6 and st["hits"] == 0
    f(gpk.from_numpy(arr(rng, 1, 8)), 2)
    assert f.stats()["hits"] == 1


def test_captured_array_identity_is_part_of_the_key(rng):
    class Layer:
        def __init__(self, w):
            self.w = w

        @gpk.compile
        def __call__(self, x):
            return x @ self.w

    a = Layer(gpk.from_numpy(arr(rng, 4, 4)))
    x = gpk.from_numpy(arr(rng, 2, 4))
    close(a(x).to_numpy(), f64(x) @ f64(a.w))
    a.w = gpk.from_numpy(arr(rng, 4, 4))  # a new array: re-trace, with the reason
    close(a(x).to_numpy(), f64(x) @ f64(a.w))
    st = Layer.__call__.stats()
    assert st["misses"] == 2 and "captured" in st["reasons"][1]
    # Referenced, not copied: writing the captured array changes the next result.
    a.w[0, 0] = 100.0
    close(a(x).to_numpy(), f64(x) @ f64(a.w))


def test_dynamic_scalar_does_not_retrace(rng):
    table = gpk.from_numpy(arr(rng, 10, 4))

    @gpk.compile
    def row(i, scale):
        return table[i] * scale

    for i in range(10):
        out = row(gpk.scalar(i), gpk.scalar(0.5))
        close(out.to_numpy(), f64(table)[i] * 0.5)
    assert row.stats()["misses"] == 1 and row.stats()["hits"] == 9


def test_kv_cache_update_in_place(rng):
    cache = gpk.zeros((2, 16, 4)).realize()
    before_addr = cache.node.realized.storage.addr

    @gpk.compile
    def step(k, pos):
        cache[:, pos] = k
        return cache.sum(1)

    ref = np.zeros((2, 16, 4))
    for pos in range(5):
        k = arr(rng, 2, 4)
        out = step(gpk.from_numpy(k), gpk.scalar(pos))
        ref[:, pos] = f64(k)
        close(out.to_numpy(), ref.sum(1))
        close(cache.to_numpy(), ref)  # the user's array sees the new data
    assert step.stats()["misses"] == 1
    assert cache.node.realized.storage.addr == before_addr
    prog = step._cache[next(iter(step._cache))].program
    assert prog.plan.inplace and not prog.plan.writeback  # written in place, no copy back


def test_kv_update_with_later_read_of_old_value_copies_back(rng):
    buf = gpk.from_numpy(arr(rng, 3, 4))

    @gpk.compile
    def f(v, i):
        old = buf * 1.5
        buf[i] = v
        return old + buf  # reads the old value and the new one

    b0 = f64(buf).copy()
    v = arr(rng, 4)
    out = f(gpk.from_numpy(v), gpk.scalar(1))
    b1 = b0.copy()
    b1[1] = f64(v)
    close(out.to_numpy(), b0 * 1.5 + b1)
    close(buf.to_numpy(), b1)


def test_trace_error_on_branching(rng):
    @gpk.compile
    def f(x):
        if x.sum() > 0:  # the offending line
            return x
        return -x

    with pytest.raises(gpk.TraceError, match=r"test_compile\.py:\d+"):
        f(gpk.from_numpy(arr(rng, 3)))
    for conv in (float, int, bool):

        @gpk.compile
        def g(x, conv=conv):
            return x * conv(x.sum())

        with pytest.raises(gpk.TraceError):
            g(gpk.from_numpy(arr(rng, 1)))

    @gpk.compile
    def h(x):
        x.to_numpy()
        return x

    with pytest.raises(gpk.TraceError):
        h(gpk.from_numpy(arr(rng, 2)))


def test_pytrees_nested_functions_and_closures(rng):
    scale = gpk.from_numpy(arr(rng, 4))

    def inner(a, b):
        return a * scale + b

    @gpk.compile
    def f(params, xs):
        out = {"sum": inner(params["a"], params["b"][0]), "list": [x * 2.0 for x in xs]}
        return out, (xs[0] - 1.0,)

    pa, pb, x0, x1 = (arr(rng, 4) for _ in range(4))
    out, (t,) = f({"a": gpk.from_numpy(pa), "b": (gpk.from_numpy(pb),)},
                  [gpk.from_numpy(x0), gpk.from_numpy(x1)])  # fmt: skip
    close(out["sum"].to_numpy(), f64(pa) * f64(scale) + f64(pb))
    close(out["list"][1].to_numpy(), f64(x1) * 2)
    close(t.to_numpy(), f64(x0) - 1)
    assert isinstance(out["list"], list)


def test_outputs_are_fresh_unless_static(rng):
    @gpk.compile
    def f(x):
        return x * 2.0

    a = f(gpk.from_numpy(np.ones(3, np.float32)))
    b = f(gpk.from_numpy(np.full(3, 2.0, np.float32)))
    close(a.to_numpy(), np.full(3, 2.0))  # not overwritten by the second call
    close(b.to_numpy(), np.full(3, 4.0))

    s = gpk.compile(lambda x: x + 1.0, static_outputs=True)
    y1 = s(gpk.from_numpy(np.zeros(3, np.float32)))
    close(y1.to_numpy(), np.ones(3))
    s(gpk.from_numpy(np.ones(3, np.float32)))
    with pytest.raises(StaleOutputError, match="static_outputs=True"):
        y1.to_numpy()
    with pytest.raises(gpk.FreedArrayError):
        (y1 * 2).to_numpy()


def test_argument_mutation_writes_back(rng):
    @gpk.compile
    def f(x):
        x[0] = 7.0
        return x.sum()

    a = gpk.from_numpy(np.zeros(3, np.float32))
    close(f(a).to_numpy(), 7.0)
    close(a.to_numpy(), [7.0, 0.0, 0.0])


def test_ten_thousand_calls_keep_memory_flat(rng):
    w = gpk.from_numpy(arr(rng, 8, 8))

    @gpk.compile
    def f(x, pos):
        return gpk.tanh(x @ w) * pos

    x = gpk.from_numpy(arr(rng, 2, 8))
    pos = gpk.scalar(1.0)
    for _ in range(100):
        f(x, pos)
    gc.collect()
    pool0 = gpk.pool_stats()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    for _ in range(10_000):
        y = f(x, pos)
    del y
    gc.collect()
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    assert grown < 64 * 1024, grown
    pool1 = gpk.pool_stats()
    used = [k for k in pool0 if "in_use" in k or "used" in k]
    assert used, pool0
    for k in used:
        assert pool1[k] == pool0[k], (k, pool0[k], pool1[k])
    assert f.stats()["misses"] == 1 and math.isclose(f.stats()["hits"], 10_099)
