"""gpk.compile(share=...): functions of the same share key reuse one trace and its passes
for calls of the same structure, each binding its own captured arrays."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.compile import function


class Layer:
    """y = relu(x @ w + b) * scale: weights captured through self, a scalar as a value."""

    def __init__(self, w: np.ndarray, b: np.ndarray, scale: float) -> None:
        self.w, self.b, self.scale = gpk.asarray(w), gpk.asarray(b), scale
        self.step = gpk.compile(self.forward, share=("test_compile_share", "Layer"))

    def forward(self, x: gpk.GPUArray) -> gpk.GPUArray:
        return gpk.maximum(x @ self.w + self.b, 0.0) * self.scale


class OtherLayer(Layer):
    """Another class with the same captures: never served Layer's trace."""

    def forward(self, x: gpk.GPUArray) -> gpk.GPUArray:
        return gpk.maximum(x @ self.w - self.b, 0.0) * self.scale


def _ref(x: np.ndarray, w: np.ndarray, b: np.ndarray, scale: float, sign: float = 1.0):
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    return np.maximum(x64 @ w64 + sign * b64, 0.0) * scale


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(23)


@pytest.fixture(autouse=True)
def _no_shared_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(function, "_SHARED", {})


def _weights(rng: np.random.Generator, k: int = 8, n: int = 6):
    return (rng.standard_normal((k, n)).astype(np.float32),
            rng.standard_normal(n).astype(np.float32))  # fmt: skip


def test_second_instance_reuses_the_trace_with_its_own_weights(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    (w1, b1), (w2, b2) = _weights(rng), _weights(rng)
    first, second = Layer(w1, b1, 0.5), Layer(w2, b2, 0.5)
    np.testing.assert_allclose(first.step(gpk.asarray(x)).to_numpy(), _ref(x, w1, b1, 0.5),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(second.step(gpk.asarray(x)).to_numpy(), _ref(x, w2, b2, 0.5),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    s1, s2 = first.step.stats(), second.step.stats()
    assert s1["shared_hits"] == 0 and not s1["entries"][0]["shared"]
    assert s2["shared_hits"] == 1 and s2["entries"][0]["shared"]
    assert s2["entries"][0]["phases_ms"]["passes"] == 0.0
    # The first instance still runs on its own weights after the second bound its own.
    np.testing.assert_allclose(first.step(gpk.asarray(x)).to_numpy(), _ref(x, w1, b1, 0.5),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_different_structure_is_traced_again(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w, b = _weights(rng)
    base = Layer(w, b, 0.5)
    base.step(gpk.asarray(x))
    cases = [
        (Layer(w, b, 2.0), _ref(x, w, b, 2.0)),  # a captured scalar's value
        (OtherLayer(w, b, 0.5), _ref(x, w, b, 0.5, -1.0)),  # another class, other code
        (Layer(*_weights(rng, 8, 5), 0.5), None),  # a captured array's shape
    ]
    for layer, want in cases:
        got = layer.step(gpk.asarray(x)).to_numpy()
        if want is None:
            want = _ref(x, layer.w.to_numpy(), layer.b.to_numpy(), 0.5)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert layer.step.stats()["shared_hits"] == 0
    # Another argument shape is its own trace too.
    again = Layer(w, b, 0.5)
    x2 = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(again.step(gpk.asarray(x2)).to_numpy(), _ref(x2, w, b, 0.5),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    assert again.step.stats()["shared_hits"] == 0


def test_captured_views_are_not_shared(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w, b = _weights(rng, 8, 12)
    layers = []
    for lo in (0, 6):  # the same shapes, views at different offsets of one base
        layer = Layer(w[:, :6], b[:6], 1.0)
        layer.w = gpk.asarray(w)[:, lo : lo + 6]
        layers.append(layer)
    for layer, lo in zip(layers, (0, 6), strict=True):
        want = _ref(x, w[:, lo : lo + 6], b[:6], 1.0)
        np.testing.assert_allclose(layer.step(gpk.asarray(x)).to_numpy(), want, rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
        assert layer.step.stats()["shared_hits"] == 0


def test_share_must_be_hashable() -> None:
    with pytest.raises(gpk.GPUKitError, match="share must be hashable"):
        gpk.compile(lambda x: x, share=["not", "hashable"])
