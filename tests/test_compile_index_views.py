"""Integer-index views in compiled functions (issue 17): a 0-d or partial integer index
of an intermediate or of an argument reads the memory it names, on every call, as NumPy,
the lazy path and eager mode do."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import assert_close, rand, to64

import pygpukit as gpk

CASES: list[tuple[str, tuple[int, ...], Any]] = [
    ("float32", (3,), 0),
    ("float32", (3,), 2),
    ("float32", (3,), -1),
    ("float32", (4, 5), (1, 3)),
    ("float32", (4, 5), 2),
    ("float16", (2, 3, 4), (1, 0)),
    ("float64", (6,), 4),
    ("int32", (5, 2), (3, 1)),
    ("int64", (2, 2, 3), (1, 1, 2)),
]


def _body(op: str) -> Callable[[Any], Any]:
    if op == "scale":
        return lambda a: a * 3
    if op == "exp":
        return gpk.exp
    return lambda a: a


def _reference(op: str, x: np.ndarray, index: Any) -> np.ndarray:
    x64 = to64(x)
    y = {"scale": x64 * 3, "exp": np.exp(x64), "arg": x64}[op]
    return np.asarray(y[index])


@pytest.mark.parametrize("dtype,shape,index", CASES)
@pytest.mark.parametrize("op", ["scale", "exp", "arg"])
def test_compiled_integer_index_reads_its_element(op: str, dtype: str, shape: tuple[int, ...],
                                                  index: Any) -> None:  # fmt: skip
    if op == "exp" and dtype.startswith("int"):
        pytest.skip("exp of an integer array is a float op: covered by the float cases")
    rng = np.random.default_rng(zlib.crc32(f"{op}{dtype}{shape}{index}".encode()))
    body = _body(op)

    def fn(a: Any) -> Any:
        return body(a)[index]

    compiled = gpk.compile(fn)
    for _ in range(3):  # each call: new values, arena and argument addresses reused
        x = rand(rng, shape, dtype)
        ref = _reference(op, x, index)
        lazy = fn(gpk.from_numpy(x)).to_numpy()
        with gpk.eager():
            eager = fn(gpk.from_numpy(x)).to_numpy()
        got = compiled(gpk.from_numpy(x)).to_numpy()
        for out in (lazy, eager, got):
            assert out.shape == ref.shape
            assert_close(out, ref, dtype)


def test_compiled_index_of_one_argument_never_reads_another() -> None:
    rng = np.random.default_rng(5)

    @gpk.compile
    def first(x0: Any, x1: Any) -> Any:
        return x0[0], x1[1, 2]

    for _ in range(4):
        a, b = rand(rng, (3,), "float32"), rand(rng, (2, 4), "float32")
        y0, y1 = first(gpk.from_numpy(a), gpk.from_numpy(b))
        np.testing.assert_array_equal(y0.to_numpy(), a[0])
        np.testing.assert_array_equal(y1.to_numpy(), b[1, 2])


def test_compiled_integer_index_static_outputs() -> None:
    rng = np.random.default_rng(6)

    @gpk.compile(static_outputs=True)
    def pick(a: Any) -> Any:
        return (a * 2)[1, 0]

    for _ in range(3):
        x = rand(rng, (3, 2), "float32")
        np.testing.assert_allclose(pick(gpk.from_numpy(x)).to_numpy(), 2 * to64(x)[1, 0])
