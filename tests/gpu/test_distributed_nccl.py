"""gpk.distributed on one GPU: a world of one through NCCL. The four collectives against
NumPy, lazily, eagerly and inside @gpk.compile, where they are captured into the CUDA
graph (no fallback, no launches from Python on replay). Skipped when libnccl is absent."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gpk
import pygpukit.distributed as dist


@pytest.fixture
def world(cuda: Any) -> Iterator[Any]:
    from pygpukit.distributed import nccl

    try:
        nccl.load_nccl()
    except gpk.errors.DistributedError as e:
        pytest.skip(str(e))
    comm = dist.init(rank=0, world_size=1)
    try:
        yield comm
    finally:
        cuda.synchronize()
        dist.destroy()


CASES = [
    ("all_reduce", {"op": "sum"}),
    ("all_reduce", {"op": "max"}),
    ("all_gather", {"axis": 0}),
    ("all_gather", {"axis": 1}),
    ("reduce_scatter", {"axis": 0}),
    ("reduce_scatter", {"axis": 1}),
    ("broadcast", {"root": 0}),
]


def _host(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(3)
    if dtype == "int32":
        return rng.integers(-100, 100, shape).astype(np.int32)
    a = rng.uniform(-2, 2, shape)
    return a.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize(("op", "kw"), CASES)
def test_world_of_one(world: Any, op: str, kw: dict[str, Any], dtype: str) -> None:
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    x = _host(dtype, (6, 10))
    want = x.astype(np.float64)  # in a world of one every collective is the identity
    fn = getattr(dist, op)
    # A transposed (strided) input and an op after: the collective reads and feeds kernels.
    lazy = (fn(gpk.from_numpy(x.T.copy()).T, **kw) + 0).to_numpy()
    with gpk.eager():
        eager = (fn(gpk.from_numpy(x), **kw) * 1).to_numpy()

    @gpk.compile
    def step(a: gpk.GPUArray) -> gpk.GPUArray:
        return fn(a * 2, **kw) + 1

    compiled = [step(gpk.from_numpy(x)).to_numpy() for _ in range(4)]
    for got in (lazy, eager):
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got.astype(np.float64), want)
    for got in compiled:
        np.testing.assert_allclose(got.astype(np.float64), want * 2 + 1, rtol=1e-2)
    prog = next(iter(step._cache.values())).program
    caps = list(prog._captures.values())
    assert caps and all(rp.captured and rp.fallback is None for rp in caps)
    assert sum(rp.replays for rp in caps) >= 1


def test_nccl_is_loaded_from_the_wheel_or_the_system(world: Any) -> None:
    from pygpukit.distributed import nccl

    assert nccl.nccl_version() >= 20900  # stream capture needs 2.9
    assert world.handle != 0 and (dist.rank(), dist.world_size()) == (0, 1)
