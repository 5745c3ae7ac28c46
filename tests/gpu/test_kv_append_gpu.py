"""sdpa_append on the GPU: the compiled decode step (ropes, cache stores and attention in
the decode kernel's append mode) against float64 NumPy, over one split and many, both
rope layouts, left padding and batches; the composed path (float32) likewise; a bad
position is an index error that names the op."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kv_step import DecodeStep, StepCase

import pygpukit as gpk
from pygpukit.backends.cuda import compile_ahead
from pygpukit.backends.cuda.kernels import attention

pytestmark = pytest.mark.gpu

TOL = {"bfloat16": 3e-2, "float16": 4e-3, "float32": 1e-4}


def _close(out: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    out64, ref64 = out.astype(np.float64), np.asarray(ref, np.float64)
    err = np.linalg.norm(out64 - ref64) / max(np.linalg.norm(ref64), 1e-30)
    assert np.isfinite(out64).all() and err < TOL[dtype], f"relative error {err:.3g}"


CASES = [
    # one split (short cache), TinyLlama's heads
    StepCase(batch=1, heads=32, kv_heads=4, max_seq=128, head_dim=64, dtype="bfloat16"),
    # many splits (ctx 8192 at batch 1), Llama-style D=128, interleaved tables
    StepCase(
        batch=1,
        heads=32,
        kv_heads=4,
        max_seq=8192,
        head_dim=128,
        dtype="bfloat16",
        layout="interleaved",
    ),  # fmt: skip
    # batches with left padding, a group above 16 heads (two blocks per kv head), f16
    StepCase(batch=3, heads=64, kv_heads=2, max_seq=512, head_dim=128, dtype="float16"),
    # no rope on q or k: only the stores join the attention
    StepCase(
        batch=2, heads=8, kv_heads=8, max_seq=256, head_dim=64, dtype="bfloat16", layout="none"
    ),  # fmt: skip
    # float32: the composed path (ropes, stores, attention as separate kernels)
    StepCase(batch=2, heads=8, kv_heads=2, max_seq=64, head_dim=64, dtype="float32"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.dtype}-d{c.head_dim}-s{c.max_seq}-"
                                                     f"b{c.batch}-{c.layout}")  # fmt: skip
def test_compiled_decode_step(cuda: Any, rng: np.random.Generator, case: StepCase) -> None:
    step = DecodeStep(case, rng)
    s = case.max_seq
    for pos in (s // 2 + 3, s // 2 + 4, s - 1, 5):
        arrays, start = step.inputs(pos)
        out = step(arrays, pos, start)
        _close(out, step.reference(arrays, pos, start), case.dtype)
        _close(step.cache_k.to_numpy(), step.k_ref, case.dtype)
        _close(step.cache_v.to_numpy(), step.v_ref, case.dtype)
    assert "sdpa_append" in step.program_ops()
    assert step.fn.stats()["misses"] == 1
    replay = step.fn.stats()["entries"][0]["replay"]
    assert replay["captured"], replay


def test_many_splits_actually_split(cuda: Any) -> None:
    """The ctx-8192 case runs the multi-split path (the row is stored by one split)."""
    assert attention.decode_splits(1, 32, 4, 8192, "bfloat16") > 1


def test_bad_position_is_an_index_error(cuda: Any, rng: np.random.Generator) -> None:
    case = StepCase(batch=1, heads=8, kv_heads=2, max_seq=64, head_dim=64, dtype="bfloat16")
    step = DecodeStep(case, rng)
    arrays, start = step.inputs(3)
    _close(step(arrays, 3, start), step.reference(arrays, 3, start), case.dtype)
    before = step.cache_k.to_numpy()
    with pytest.raises(gpk.IndexError) as e:
        step(arrays, case.max_seq + 5, start)
    assert "sdpa_append" in str(e.value) and str(case.max_seq + 5) in str(e.value)
    np.testing.assert_array_equal(step.cache_k.to_numpy(), before)  # nothing was stored
    _close(step(arrays, 4, start), step.reference(arrays, 4, start), case.dtype)


def test_captured_step_loads_the_cache_before_the_wait(
    cuda: Any, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In append mode the caches are the step's own, so the captured decode kernel fills its
    stages before it waits on the kernel ahead (kv_early); the eager first run does not.
    Results stay right over replays whose length the graph computes (pos + 1)."""
    seen: list[bool] = []
    real = attention.decode

    def spy(*args: Any, **kwargs: Any) -> None:
        if not compile_ahead.is_collecting():  # the compile-ahead dry run launches nothing
            seen.append(bool(kwargs.get("kv_early")))
        real(*args, **kwargs)

    monkeypatch.setattr(attention, "decode", spy)
    case = StepCase(batch=2, heads=16, kv_heads=4, max_seq=1024, head_dim=128, dtype="bfloat16")
    step = DecodeStep(case, rng)
    for call, pos in enumerate((700, 701, 3, 1023)):
        seen.clear()
        arrays, start = step.inputs(pos)
        _close(step(arrays, pos, start), step.reference(arrays, pos, start), case.dtype)
        if call == 0:  # eager, then captured
            assert seen == [False, True]
    _close(step.cache_k.to_numpy(), step.k_ref, case.dtype)
