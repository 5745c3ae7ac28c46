"""Recording, a cached lazy realize and an eager op free everything they make by reference
counting: a reference cycle per call (a recursive closure, say) leaves the garbage
collector running every few calls, which cost the host path a fifth of its time."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk


def _chain(x: Any) -> Any:
    y = x
    for _ in range(4):
        y = y * 1.0001 + 1
    return y.realize()


def _eager(x: Any) -> Any:
    with gpk.eager():
        return gpk.exp(x) * 2.0


@pytest.mark.parametrize("run", [_chain, _eager])
def test_calls_leave_no_reference_cycles(run: Callable[[Any], Any]) -> None:
    a = np.random.default_rng(3).standard_normal(256).astype(np.float32)
    x = gpk.from_numpy(a)
    for _ in range(20):  # the schedule, its plans and one-off types are made by now
        run(x)
    # Garbage found after n calls, with the collector off meanwhile. A cyclic object made
    # once per collector run (ctypes re-creates an array type it caches weakly), or left by
    # an earlier test's finalizer, does not grow with the calls; a cycle made per call adds
    # at least one object for each of the 50 more calls.
    found = []
    for n in (10, 60):
        for _ in range(5):  # finalizers of earlier tests' objects may leave more behind
            if not gc.collect():
                break
        gc.disable()
        try:
            for _ in range(n):
                out = run(x)
            found.append(gc.collect())
        finally:
            gc.enable()
    assert found[1] < found[0] + 50, f"cyclic objects per call: {(found[1] - found[0]) / 50}"
    want = np.exp(a.astype(np.float64)) * 2.0 if run is _eager else a.astype(np.float64)
    if run is _chain:
        for _ in range(4):
            want = want * np.float32(1.0001) + 1
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5)
