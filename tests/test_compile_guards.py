"""@gpk.compile soundness: Python scalars the function reads are guarded, captured NumPy
arrays are refused, freed arrays raise, the per-function cache is bounded, and a compiled
function called while tracing another is inlined."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
from passes_util import arr, close, f64

import pygpukit as gpk
from pygpukit import settings


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(17)


# A module global the compiled function below reads (a hyperparameter a user changes).
SCALE = 0.5


def _scaled(x):
    return x * SCALE + 1.0


def test_global_float_change_retraces(rng):
    global SCALE
    f = gpk.compile(_scaled)
    x = arr(rng, 3, 5)
    close(f(gpk.from_numpy(x)).to_numpy(), f64(x) * 0.5 + 1.0)
    close(f(gpk.from_numpy(x)).to_numpy(), f64(x) * 0.5 + 1.0)
    try:
        SCALE = 2.25
        close(f(gpk.from_numpy(x)).to_numpy(), f64(x) * 2.25 + 1.0)
        close(f(gpk.from_numpy(x)).to_numpy(), f64(x) * 2.25 + 1.0)
    finally:
        SCALE = 0.5
    st = f.stats()
    assert st["misses"] == 2
    assert st["reasons"][1] == "captured SCALE value 0.5 -> 2.25"


def test_closure_list_of_floats_change_retraces(rng):
    coefs = [0.25, -1.5]

    @gpk.compile
    def poly(x):
        return x * coefs[0] + x * x * coefs[1]

    x = arr(rng, 4, 6)
    for _ in range(2):
        close(poly(gpk.from_numpy(x)).to_numpy(), f64(x) * 0.25 + f64(x) ** 2 * -1.5)
    coefs[1] = 3.0
    close(poly(gpk.from_numpy(x)).to_numpy(), f64(x) * 0.25 + f64(x) ** 2 * 3.0)
    assert poly.stats()["reasons"][1] == "captured coefs[1] value -1.5 -> 3.0"
    coefs[1] = -1.5  # back to the first entry's value: a hit, not a trace
    close(poly(gpk.from_numpy(x)).to_numpy(), f64(x) * 0.25 + f64(x) ** 2 * -1.5)
    assert poly.stats()["misses"] == 2


def test_captured_object_attribute_change_retraces(rng):
    cfg = types.SimpleNamespace(eps=1e-3, w=gpk.from_numpy(arr(rng, 6)))

    @gpk.compile
    def norm(x):
        return x * gpk.rsqrt((x * x).mean(-1, keepdims=True) + cfg.eps) * cfg.w

    def ref(x, eps):
        return f64(x) / np.sqrt((f64(x) ** 2).mean(-1, keepdims=True) + eps) * f64(cfg.w)

    x = arr(rng, 2, 6)
    close(norm(gpk.from_numpy(x)).to_numpy(), ref(x, 1e-3))
    cfg.eps = 0.5
    close(norm(gpk.from_numpy(x)).to_numpy(), ref(x, 0.5))
    assert norm.stats()["reasons"][1] == "captured cfg.eps value 0.001 -> 0.5"


def test_attribute_of_an_object_argument_is_guarded(rng):
    class Layer:
        def __init__(self) -> None:
            self.alpha = 2.0

    @gpk.compile
    def f(x, layer):
        return x * layer.alpha

    layer = Layer()
    x = arr(rng, 3, 3)
    close(f(gpk.from_numpy(x), layer).to_numpy(), f64(x) * 2.0)
    layer.alpha = -0.75
    close(f(gpk.from_numpy(x), layer).to_numpy(), f64(x) * -0.75)


def test_int_attribute_read_in_python_control_flow_is_guarded(rng):
    opts = types.SimpleNamespace(repeats=2)

    @gpk.compile
    def f(x):
        for _ in range(opts.repeats):
            x = x * 1.5
        return x

    x = arr(rng, 5)
    close(f(gpk.from_numpy(x)).to_numpy(), f64(x) * 1.5**2)
    opts.repeats = 3
    close(f(gpk.from_numpy(x)).to_numpy(), f64(x) * 1.5**3)


def test_captured_numpy_array_is_refused(rng):
    table = arr(rng, 4)

    @gpk.compile
    def f(x):
        return x + table

    with pytest.raises(gpk.errors.TraceError, match=r"f: captured table is a NumPy array.*"
                       r"pass it as an argument"):  # fmt: skip
        f(gpk.from_numpy(arr(rng, 4)))


def test_numpy_array_in_a_captured_container_is_refused_when_the_graph_reads_it(rng):
    pairs = [
        (gpk.from_numpy(arr(rng, 4)), arr(rng, 4)),
        (gpk.from_numpy(arr(rng, 4)), arr(rng, 3, 4)),
    ]

    @gpk.compile
    def uses_host(x):
        return x + pairs[1][1].T  # the host array's values become a graph constant

    with pytest.raises(gpk.errors.TraceError, match=r"captured pairs\[1\]\[1\] is a NumPy"):
        uses_host(gpk.from_numpy(arr(rng, 4, 3)))

    @gpk.compile
    def keeps_a_reference(x):
        return x * pairs[0][0]  # pairs[0][1], a host reference copy, is not read

    x = arr(rng, 4)
    close(keeps_a_reference(gpk.from_numpy(x)).to_numpy(), f64(x) * f64(pairs[0][0]))


def test_numpy_array_argument_is_fine(rng):
    @gpk.compile
    def f(x, t):
        return x + t

    x, t = arr(rng, 4), arr(rng, 4)
    close(f(gpk.from_numpy(x), t).to_numpy(), f64(x) + f64(t))
    t[:] = arr(rng, 4)  # passed again: its new contents are read
    close(f(gpk.from_numpy(x), t).to_numpy(), f64(x) + f64(t))


# -- freed arrays ---------------------------------------------------------------------------


def test_freed_argument_raises(rng):
    @gpk.compile
    def f(a, b):
        return a * b

    a, b = gpk.from_numpy(arr(rng, 8)), gpk.from_numpy(arr(rng, 8))
    f(a, b)
    f(a, b)  # the guard's fast path from here on
    b.free()
    with pytest.raises(gpk.errors.FreedArrayError, match=r"f: arg 1 \(f32\[8\]\) was freed"):
        f(a, b)
    with pytest.raises(gpk.errors.FreedArrayError, match=r"arg 1"):
        f(a, b)  # and again, now on the full path

    @gpk.compile
    def g(a):
        return a + 1.0

    c = gpk.from_numpy(arr(rng, 8))
    c.free()
    with pytest.raises(gpk.errors.FreedArrayError, match=r"g: arg 0 \(f32\[8\]\) was freed"):
        g(c)  # the first call


def test_captured_weight_freed_raises(rng):
    w = gpk.from_numpy(arr(rng, 6, 6))

    @gpk.compile
    def f(x):
        return x @ w

    x = gpk.from_numpy(arr(rng, 2, 6))
    f(x)
    f(x)
    w.free()
    with pytest.raises(
        gpk.errors.FreedArrayError, match=r"f: captured w \(f32\[6, 6\]\) was freed"
    ):
        f(x)


def test_write_into_freed_captured_array_raises_before_running(rng):
    cache = gpk.from_numpy(arr(rng, 4, 8))

    @gpk.compile
    def step(row):
        cache[1] = row
        return row * 2.0

    row = gpk.from_numpy(arr(rng, 8))
    step(row)
    step(row)
    cache.free()
    neighbour_np = np.full((4, 8), 5.0, np.float32)
    neighbour = gpk.from_numpy(neighbour_np)  # likely the block cache had
    with pytest.raises(gpk.errors.FreedArrayError, match=r"step: captured cache"):
        step(row)
    np.testing.assert_array_equal(neighbour.to_numpy(), neighbour_np)


# -- the bounded cache ----------------------------------------------------------------------


def _in_use() -> int:
    return int(gpk.pool_stats()["in_use_bytes"])


def test_cache_is_bounded_and_evicted_memory_returns(rng):
    @gpk.compile(cache_size=3)
    def f(x):
        return (x * 2.0 + 1.0).sum(-1)

    def call(n):
        x = arr(rng, 2, n)
        close(f(gpk.from_numpy(x)).to_numpy(), (f64(x) * 2.0 + 1.0).sum(-1))

    call(8)
    base = _in_use()
    with pytest.warns(UserWarning, match=r"f: .*cache of 3 entries.*arg 0 shape \(2,8\) -> \(2,"):
        for n in range(9, 40):
            call(n * 64)
    assert len(f.stats()["entries"]) == 3
    assert f.stats()["evictions"] == 29
    grown = _in_use() - base
    # three entries' arenas at the largest shapes, not 31 of them
    assert grown <= 3 * 4 * 2 * 39 * 64 * 4, grown
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once
        for n in range(40, 44):
            call(n * 64)
    call(8)  # evicted long ago: traced again, and right
    assert f.stats()["misses"] == 37


def test_cache_size_default_comes_from_settings(rng, monkeypatch):
    monkeypatch.setenv(settings.COMPILE_CACHE_SIZE, "2")

    @gpk.compile
    def f(x):
        return x + 1.0

    with pytest.warns(UserWarning, match="cache of 2 entries"):
        for n in range(1, 5):
            f(gpk.from_numpy(arr(rng, n)))
    assert len(f.stats()["entries"]) == 2
    gpk.set_compile_cache_size(5)  # wins over the environment
    assert settings.compile_cache_size() == 5
    gpk.set_compile_cache_size(None)
    assert settings.compile_cache_size() == 2
    monkeypatch.delenv(settings.COMPILE_CACHE_SIZE)
    assert settings.compile_cache_size() == settings.DEFAULT_COMPILE_CACHE_SIZE
    with pytest.raises(gpk.errors.SettingError, match="set_compile_cache_size"):
        gpk.set_compile_cache_size(0)
    monkeypatch.setenv(settings.COMPILE_CACHE_SIZE, "many")
    with pytest.raises(gpk.errors.SettingError, match="PYGPUKIT_COMPILE_CACHE_SIZE='many'"):
        settings.compile_cache_size()
    with pytest.raises(ValueError, match="cache_size"):
        gpk.compile(lambda x: x, cache_size=0)


def test_evicted_captures_release_pool_memory(rng):
    w = gpk.from_numpy(arr(rng, 64, 64))

    @gpk.compile(cache_size=1)
    def f(x):
        return gpk.nn.gelu(x @ w) * 0.5

    f(gpk.from_numpy(arr(rng, 1, 64)))
    base = _in_use()
    for n in range(2, 30):
        x = arr(rng, n * 4, 64)
        y = f(gpk.from_numpy(x))
        del y
    assert len(f._cache) == 1
    # only the last entry's arena (and no dead arenas) stays in use
    assert _in_use() - base <= 2 * (29 * 4 * 64 * 4) * 4


# -- compiled inside compiled ---------------------------------------------------------------


def test_compiled_function_called_while_tracing_is_inlined(rng):
    w = gpk.from_numpy(arr(rng, 8, 8))

    @gpk.compile
    def inner(x, s):
        return gpk.nn.gelu(x @ w) * s

    @gpk.compile
    def bias():
        return w.sum(0)  # only captured arrays: would hit inner's cache, not trace

    @gpk.compile
    def outer(x):
        return inner(x, 0.5) + inner(x * 2.0, 1.5) + bias()

    x = arr(rng, 3, 8)
    inner(gpk.from_numpy(x), 0.5)  # inner is compiled and cached on its own too
    bias()

    def gelu(v):
        from passes_util import gelu64

        return gelu64(v, "none")

    ref = gelu(f64(x) @ f64(w)) * 0.5 + gelu(f64(x) * 2 @ f64(w)) * 1.5 + f64(w).sum(0)
    for _ in range(2):
        close(outer(gpk.from_numpy(x)).to_numpy(), ref)
    assert outer.stats()["misses"] == 1
    # the traced calls ran neither inner's nor bias's program
    assert inner.stats()["calls"] == 1 and bias.stats()["calls"] == 1
