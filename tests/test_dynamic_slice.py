"""gpk.dynamic_slice: a slice of static length whose start is a 0-d array read on the
device (a prefill chunk written into a static KV cache). Reads and stores against NumPy,
lazy, eager and compiled (one trace serving every start), and the errors."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.ir.printer import format_graph


def _mode(mode: str) -> contextlib.AbstractContextManager[None]:
    return gpk.eager() if mode == "eager" else contextlib.nullcontext()


@pytest.mark.parametrize("mode", ["lazy", "eager"])
@pytest.mark.parametrize("start", [0, 3, 7, -1, -8])
def test_read_and_store(mode, start):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 10, 4)).astype(np.float32)
    v = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)
    s = start % 8  # 8 possible starts of a length-3 slice in 10: negatives count from the end
    with _mode(mode):
        x = gpk.from_numpy(a.copy())
        pos = gpk.scalar(start)
        got = x[:, :, gpk.dynamic_slice(pos, 3)]
        np.testing.assert_array_equal(got.to_numpy(), a[:, :, s : s + 3])
        x[:, :, gpk.dynamic_slice(pos, 3)] = gpk.from_numpy(v)
        want = a.copy()
        want[:, :, s : s + 3] = v
        np.testing.assert_array_equal(x.to_numpy(), want)
        # the read made before the store is a copy, as NumPy's array index
        np.testing.assert_array_equal(got.to_numpy(), a[:, :, s : s + 3])


def test_compiled_store_one_trace():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 6)).astype(np.float32)
    cache = gpk.from_numpy(a.copy())

    def write(v: gpk.GPUArray, pos: gpk.GPUArray) -> gpk.GPUArray:
        cache[gpk.dynamic_slice(pos, 2)] = v
        return cache[gpk.dynamic_slice(pos, 2)].sum(axis=-1)

    step = gpk.compile(write)
    want = a.astype(np.float64)
    for pos in (0, 3, 1, 3):
        v = rng.standard_normal((2, 6)).astype(np.float32)
        got = step(gpk.from_numpy(v), gpk.scalar(pos)).to_numpy()
        want[pos : pos + 2] = v
        np.testing.assert_allclose(got, v.astype(np.float64).sum(-1), rtol=1e-5)
        np.testing.assert_allclose(cache.to_numpy(), want, rtol=0)
    assert step.stats()["misses"] == 1


@pytest.mark.parametrize("compiled", [False, True])
def test_start_out_of_range(compiled):
    x = gpk.from_numpy(np.arange(10, dtype=np.float32))

    def read(pos: gpk.GPUArray) -> gpk.GPUArray:
        return x[gpk.dynamic_slice(pos, 4)] + 1.0

    fn = gpk.compile(read) if compiled else read
    for bad in (7, 100, -8):
        with pytest.raises(gpk.GPUKitError, match="out of bounds") as e:
            fn(gpk.scalar(bad)).to_numpy()
        assert isinstance(e.value, IndexError)


def test_bad_arguments():
    x = gpk.from_numpy(np.zeros((4, 5), np.float32))
    pos = gpk.scalar(0)
    with pytest.raises(gpk.GPUKitError, match="does not fit axis 1 with size 5") as e:
        x[:, gpk.dynamic_slice(pos, 6)]
    assert isinstance(e.value, IndexError)
    for length in (-1, 2.0, True):
        with pytest.raises(gpk.GPUKitError, match="length must be an integer >= 0") as e:
            gpk.dynamic_slice(pos, length)
        assert isinstance(e.value, ValueError)
    for start in (gpk.from_numpy(np.zeros(2, np.int64)), gpk.scalar(1.5), "1"):
        with pytest.raises(gpk.GPUKitError, match="start must be a 0-d integer") as e:
            gpk.dynamic_slice(start, 2)
        assert isinstance(e.value, IndexError)


def test_int_start_is_a_plain_slice():
    assert gpk.dynamic_slice(3, 4) == slice(3, 7)


def test_graph_text():
    x = gpk.from_numpy(np.zeros((4, 5), np.float32))
    y = x[:, gpk.dynamic_slice(gpk.scalar(1), 2)] * 2.0
    text = format_graph(gpk.runtime.pending_graph([y.node]))
    assert "f32[4,2] = in0[0:4, in1:in1+2]" in text
