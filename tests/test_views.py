"""Views and movement: reshape, transpose, expand, slicing, None, concat, stack, take, setitem."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ALL, lazy_and_eager, rand
from hypothesis import given, settings
from hypothesis import strategies as st

import pygpukit as gpk

SETTINGS = settings(max_examples=40, deadline=None)


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple),
       seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(ALL), data=st.data())  # fmt: skip
@SETTINGS
def test_reshape_transpose_expand(shape, seed: int, dtype: str, data) -> None:
    x = rand(np.random.default_rng(seed), shape, dtype)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    new = (-1,) + shape[1:] if len(shape) > 1 else (-1,)
    fns = {
        "reshape": (lambda a: a.reshape(new), lambda a: a.reshape(new)),
        "T": (lambda a: a.T, lambda a: a.T),
        "transpose": (lambda a: a.transpose(perm), lambda a: a.transpose(perm)),
        "expand": (lambda a: gpk.broadcast_to(a, (2,) + shape),
                   lambda a: np.broadcast_to(a, (2,) + shape)),
        "chain": (lambda a: a.transpose(perm).reshape(-1)[::2],
                  lambda a: a.transpose(perm).reshape(-1)[::2]),
    }  # fmt: skip
    for fn, ref in fns.values():
        lazy, eager = lazy_and_eager(fn, x)
        np.testing.assert_array_equal(lazy, ref(x))
        np.testing.assert_array_equal(eager, ref(x))


@pytest.mark.parametrize("base", ["root", "transposed"])
def test_broadcast_to_its_own_shape_then_reshape(base: str) -> None:
    """broadcast_to onto the array's own shape is a view with the array's layout: reshaping
    it (here a transposed view, which must copy, and a root, which stays a view) gives
    NumPy's values instead of failing on the view's layout."""
    x = rand(np.random.default_rng(3), (3, 4), "float32")

    def fn(a):
        a = a.T if base == "transposed" else a
        return gpk.broadcast_to(a, a.shape).reshape(-1)

    def ref(a):
        a = a.T if base == "transposed" else a
        return np.broadcast_to(a, a.shape).reshape(-1)

    lazy, eager = lazy_and_eager(fn, x)
    np.testing.assert_array_equal(lazy, ref(x))
    np.testing.assert_array_equal(eager, ref(x))


def _slice(draw: st.DrawFn, n: int) -> slice:
    start = draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))
    stop = draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))
    step = draw(st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0)))
    return slice(start, stop, step)


@st.composite
def basic_index(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple:
    out: list = []
    for n in shape:
        kind = draw(st.sampled_from(["slice", "int", "none_then_slice", "full"]))
        if kind == "slice":
            out.append(_slice(draw, n))
        elif kind == "int":
            out.append(draw(st.integers(-n, n - 1)))
        elif kind == "none_then_slice":
            out += [None, _slice(draw, n)]
        else:
            out.append(slice(None))
    if draw(st.booleans()) and len(out) > 1:
        out = [Ellipsis] + out[len(out) // 2 :] if None not in out[: len(out) // 2] else out
    return tuple(out)


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
       seed=st.integers(0, 2**32 - 1), data=st.data())  # fmt: skip
@SETTINGS
def test_basic_indexing(shape, seed: int, data) -> None:
    x = rand(np.random.default_rng(seed), shape, "float32")
    idx = data.draw(basic_index(shape))
    lazy, eager = lazy_and_eager(lambda a: a[idx], x)
    np.testing.assert_array_equal(lazy, x[idx])
    np.testing.assert_array_equal(eager, x[idx])


@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       seed=st.integers(0, 2**32 - 1), data=st.data(), n=st.integers(1, 3))  # fmt: skip
@SETTINGS
def test_concatenate_and_stack(shape, seed: int, data, n: int) -> None:
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    xs = []
    for _ in range(n):
        s = list(shape)
        s[axis] = data.draw(st.integers(1, 3))
        xs.append(rand(rng, tuple(s), "float32"))
    lazy, eager = lazy_and_eager(lambda *a: gpk.concatenate(a, axis=axis), *xs)
    np.testing.assert_array_equal(lazy, np.concatenate(xs, axis=axis))
    np.testing.assert_array_equal(eager, lazy)
    same = [rand(rng, shape, "float16") for _ in range(n)]
    sax = data.draw(st.integers(-len(shape) - 1, len(shape)))
    lazy, eager = lazy_and_eager(lambda *a: gpk.stack(a, axis=sax), *same)
    np.testing.assert_array_equal(lazy, np.stack(same, axis=sax))


@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
def test_take_embedding_lookup(idx_dtype: str) -> None:
    rng = np.random.default_rng()
    table = rand(rng, (50, 8), "bfloat16")
    ids = rng.integers(-50, 50, size=(3, 7)).astype(idx_dtype)
    lazy, eager = lazy_and_eager(lambda t, i: gpk.take(t, i, axis=0), table, ids)
    np.testing.assert_array_equal(lazy, np.take(table, ids, axis=0))
    np.testing.assert_array_equal(eager, lazy)
    np.testing.assert_array_equal(gpk.from_numpy(table)[gpk.from_numpy(ids)].to_numpy(), table[ids])
    x = rand(rng, (4, 5, 6), "float32")
    i1 = rng.integers(0, 5, size=(3,))
    np.testing.assert_array_equal(gpk.take(gpk.from_numpy(x), gpk.from_numpy(i1), axis=1)
                                  .to_numpy(), np.take(x, i1, axis=1))  # fmt: skip
    np.testing.assert_array_equal(gpk.take(gpk.from_numpy(x), gpk.from_numpy(i1)).to_numpy(),
                                  np.take(x, i1))  # fmt: skip


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
       seed=st.integers(0, 2**32 - 1), data=st.data())  # fmt: skip
@SETTINGS
def test_setitem_static(shape, seed: int, data) -> None:
    rng = np.random.default_rng(seed)
    x = rand(rng, shape, "float32")
    idx = tuple(i for i in data.draw(basic_index(shape)) if i is not None)
    region = x[idx].shape
    v = rand(rng, region[data.draw(st.integers(0, len(region))) :], "float32")
    ref = x.copy()
    ref[idx] = v
    for eager in (False, True):
        with gpk.eager(eager):
            g = gpk.from_numpy(x)
            g[idx] = gpk.from_numpy(v)
            np.testing.assert_array_equal(g.to_numpy(), ref)
    g = gpk.from_numpy(x)
    g[idx] = 1.5
    ref2 = x.copy()
    ref2[idx] = 1.5
    np.testing.assert_array_equal(g.to_numpy(), ref2)


def test_setitem_dynamic_index_kv_cache() -> None:
    rng = np.random.default_rng()
    cache = rand(rng, (2, 8, 3, 4), "bfloat16")
    ref = cache.copy()
    g = gpk.from_numpy(cache)
    for pos in rng.permutation(8)[:4]:
        k = rand(rng, (2, 3, 4), "bfloat16")
        p = gpk.asarray(np.array(pos, dtype=np.int32))
        g[:, p] = gpk.from_numpy(k)
        ref[:, pos] = k
        np.testing.assert_array_equal(g[:, p].to_numpy(), ref[:, pos])
    np.testing.assert_array_equal(g.to_numpy(), ref)
    neg = gpk.asarray(np.array(-1))
    np.testing.assert_array_equal(g[1, neg].to_numpy(), ref[1, -1])


def test_views_share_and_strides() -> None:
    x = gpk.from_numpy(rand(np.random.default_rng(), (3, 4), "float32"))
    t = x.T.realize()
    assert t.strides == (4, 16)
    assert x.strides == (16, 4)
    assert gpk.pool_stats()["in_use_bytes"] >= 48
