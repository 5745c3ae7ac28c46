"""Random programs (hypothesis) give the same numbers compiled, lazy, eager and in float64
NumPy: every pass and the planned executor are exercised on shapes users do not think of."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from passes_util import close, f64

import pygpukit as gpk


def _sig(x, np_mod):
    return 1 / (1 + np_mod.exp(-x))


UNARY = {
    "tanh": (gpk.tanh, np.tanh),
    "sin": (gpk.sin, np.sin),
    "exp_tanh": (lambda a: gpk.exp(gpk.tanh(a)), lambda a: np.exp(np.tanh(a))),
    "neg": (lambda a: -a, lambda a: -a),
    "sigmoid": (gpk.sigmoid, lambda a: _sig(a, np)),
    "sqrt1": (lambda a: gpk.sqrt(gpk.abs(a) + 1.0), lambda a: np.sqrt(np.abs(a) + 1.0)),
    "silu": (gpk.nn.silu, lambda a: a * _sig(a, np)),
    "sum": (lambda a: a.sum(-1, keepdims=True), lambda a: a.sum(-1, keepdims=True)),
    "mean": (lambda a: a.mean(-1, keepdims=True), lambda a: a.mean(-1, keepdims=True)),
    "max": (lambda a: a.max(-1, keepdims=True), lambda a: a.max(-1, keepdims=True)),
    "scale": (lambda a: a * 0.5 + 0.25, lambda a: a * 0.5 + 0.25),
    "reshape": (lambda a: a.reshape(-1).reshape(a.shape), lambda a: a),
}
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / (gpk.abs(b) + 1.0), lambda a, b: a / (np.abs(b) + 1.0)),
    "maximum": (gpk.maximum, np.maximum),
    "where": (lambda a, b: gpk.where(a > b, a, b * 2.0), lambda a, b: np.where(a > b, a, b * 2)),
}

SHAPES = [(3, 4), (3, 1), (4,), (1, 4)]

step = st.one_of(
    st.tuples(st.just("u"), st.sampled_from(sorted(UNARY)), st.integers(0, 50)),
    st.tuples(
        st.just("b"), st.sampled_from(sorted(BINARY)), st.integers(0, 50), st.integers(0, 50)
    ),
)


def run(program, inputs, use_gpk):
    vals = list(inputs)
    for s in program:
        if s[0] == "u":
            fn = UNARY[s[1]][0 if use_gpk else 1]
            vals.append(fn(vals[s[2] % len(vals)]))
        else:
            fn = BINARY[s[1]][0 if use_gpk else 1]
            vals.append(fn(vals[s[2] % len(vals)], vals[s[3] % len(vals)]))
    # Two results: the last value and one from the middle (a value also used inside).
    return vals[-1], vals[len(vals) // 2]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(step, min_size=1, max_size=10), seed=st.integers(0, 2**16))
def test_random_programs_agree(program, seed):
    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(-2, 2, size=s).astype(np.float32) for s in SHAPES]
    ref = run(program, [f64(a) for a in inputs], use_gpk=False)

    lazy = [o.to_numpy() for o in run(program, [gpk.from_numpy(a) for a in inputs], True)]
    with gpk.eager():
        eager = [o.to_numpy() for o in run(program, [gpk.from_numpy(a) for a in inputs], True)]
    compiled_fn = gpk.compile(lambda *xs: run(program, xs, True))
    compiled = [o.to_numpy() for o in compiled_fn(*[gpk.from_numpy(a) for a in inputs])]
    again = [o.to_numpy() for o in compiled_fn(*[gpk.from_numpy(a) for a in inputs])]

    for r, a, b, c, d in zip(ref, lazy, eager, compiled, again, strict=True):
        assert a.shape == r.shape == c.shape
        close(a, r, factor=10)
        close(b, r, factor=10)
        close(c, r, factor=10)
        close(c, a)
        np.testing.assert_array_equal(c, d)
    assert compiled_fn.stats()["hits"] == 1
