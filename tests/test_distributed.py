"""gpk.distributed on the CPU: the collectives' shape rules, the four collectives across
simulated ranks (threads) against NumPy, lazily, eagerly and compiled, the passes not
fusing across a collective, and the errors (no communicator, mismatched ranks)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from passes_util import fused, ops

import pygpukit as gpk
import pygpukit.distributed as dist
from pygpukit.ir import dtypes
from pygpukit.ir import ops as irops
from pygpukit.ir.dtypes import DTypeRuleError
from pygpukit.ir.shapes import ShapeRuleError

F32 = dtypes.float32

# Simulated ranks are threads on the NumPy backend; a GPU runs one process per rank
# (tests/gpu/test_distributed_nccl.py).
pytestmark = pytest.mark.skipif(gpk.backend_name() != "cpu", reason="simulated ranks: CPU backend")


def test_shape_rules() -> None:
    x = ((3, 4, 6), F32)
    assert irops.infer("all_reduce", [x], {"op": "sum", "world_size": 4}) == ((3, 4, 6), F32)
    assert irops.infer("all_gather", [x], {"axis": 1, "world_size": 4}) == ((3, 16, 6), F32)
    assert irops.infer("reduce_scatter", [x], {"op": "max", "axis": 2, "world_size": 3}) == (
        (3, 4, 2),
        F32,
    )
    assert irops.infer("broadcast", [x], {"root": 3, "world_size": 4}) == ((3, 4, 6), F32)
    with pytest.raises(ShapeRuleError, match="does not split into 4"):
        irops.infer("reduce_scatter", [x], {"op": "sum", "axis": 2, "world_size": 4})
    with pytest.raises(ShapeRuleError, match="axis 3 out of range"):
        irops.infer("all_gather", [x], {"axis": 3, "world_size": 2})
    with pytest.raises(ShapeRuleError, match="root 4 is not a rank"):
        irops.infer("broadcast", [x], {"root": 4, "world_size": 4})
    with pytest.raises(ShapeRuleError, match="op must be one of"):
        irops.infer("all_reduce", [x], {"op": "mean", "world_size": 2})
    with pytest.raises(ShapeRuleError, match="world_size must be"):
        irops.infer("all_reduce", [x], {"op": "sum", "world_size": 0})
    with pytest.raises(DTypeRuleError, match="cannot reduce bool"):
        irops.infer("all_reduce", [((2,), dtypes.bool_)], {"op": "sum", "world_size": 2})
    with pytest.raises(DTypeRuleError, match="avg floats only"):
        irops.infer("all_reduce", [((2,), dtypes.int32)], {"op": "avg", "world_size": 2})
    # Gathering bools moves bytes: allowed.
    assert irops.infer("all_gather", [((2,), dtypes.bool_)], {"axis": 0, "world_size": 2}) == (
        (4,),
        dtypes.bool_,
    )


def _inputs(world: int, shape: tuple[int, ...], dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    if np.dtype(np_dtype).kind in "iu":
        return [rng.integers(-50, 50, shape).astype(np_dtype) for _ in range(world)]
    return [rng.uniform(-2, 2, shape).astype(np_dtype) for _ in range(world)]


def _reference(name: str, parts: list[np.ndarray], **kw: object) -> list[np.ndarray]:
    wide = [p.astype(np.float64) for p in parts]
    n = len(parts)
    if name == "all_reduce":
        red = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[str(kw["op"])]
        return [red(np.stack(wide), axis=0)] * n
    if name == "all_gather":
        return [np.concatenate(wide, axis=int(kw["axis"]))] * n  # type: ignore[call-overload]
    if name == "reduce_scatter":
        total = np.sum(np.stack(wide), axis=0)
        return np.split(total, n, axis=int(kw["axis"]))  # type: ignore[call-overload]
    return [wide[int(kw["root"])]] * n  # type: ignore[call-overload]


CASES = [
    ("all_reduce", {"op": "sum"}),
    ("all_reduce", {"op": "max"}),
    ("all_reduce", {"op": "min"}),
    ("all_reduce", {"op": "prod"}),
    ("all_gather", {"axis": 0}),
    ("all_gather", {"axis": 1}),
    ("reduce_scatter", {"axis": 0}),
    ("reduce_scatter", {"axis": 1}),
    ("broadcast", {"root": 1}),
]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize(("op", "kw"), CASES)
def test_collectives_match_numpy(op: str, kw: dict[str, object], dtype: str, world: int) -> None:
    kw = dict(kw)
    if op == "broadcast":
        kw["root"] = world - 1
    parts = _inputs(world, (6, 3 * world), dtype)

    def rank_fn(eager: bool) -> np.ndarray:
        x = gpk.from_numpy(parts[dist.rank()]) * 1  # a lazy value feeding the collective
        with gpk.eager(eager):
            y = getattr(dist, op)(x, **kw)
            return (y + 0).to_numpy()

    want = _reference(op, parts, **kw)
    tol = 3e-2 if dtype == "bfloat16" else 1e-6
    for eager in (False, True):
        got = dist.simulate(world, rank_fn, eager)
        for r in range(world):
            assert got[r].dtype == parts[0].dtype
            np.testing.assert_allclose(got[r].astype(np.float64), want[r], rtol=tol, atol=tol)


def test_every_rank_gets_identical_bits() -> None:
    parts = _inputs(4, (5, 7), "bfloat16")
    got = dist.simulate(4, lambda: dist.all_reduce(gpk.from_numpy(parts[dist.rank()])).to_numpy())
    for g in got[1:]:
        assert g.tobytes() == got[0].tobytes()


def test_compiled_collective() -> None:
    parts = _inputs(2, (4, 8), "float32")
    w = np.random.default_rng(1).uniform(-1, 1, (8, 8)).astype(np.float32)

    def rank_fn() -> list[np.ndarray]:
        # One compiled function per rank, as each rank's process has its own.
        @gpk.compile
        def step(x: gpk.GPUArray, w: gpk.GPUArray) -> gpk.GPUArray:
            return gpk.exp(dist.all_reduce(x @ w) * 0.5) + 1.0

        wa = gpk.from_numpy(w)
        return [step(gpk.from_numpy(parts[dist.rank()] * k), wa).to_numpy() for k in (1, 2)]

    got = dist.simulate(2, rank_fn)
    for k, scale in enumerate((1, 2)):
        total = sum(p.astype(np.float64) * scale for p in parts) @ w.astype(np.float64)
        want = np.exp(total * 0.5) + 1.0
        for r in range(2):
            np.testing.assert_allclose(got[r][k], want, rtol=1e-5)


def test_passes_do_not_fuse_across_a_collective() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (4, 8)).astype(np.float32), rng.uniform(1, 2, (8,)).astype(np.float32)

    def fn(x: gpk.GPUArray, g: gpk.GPUArray) -> gpk.GPUArray:
        h = dist.all_reduce(gpk.exp(x) * g)
        return gpk.tanh(h) * g + 1.0

    def rank_fn() -> list[str]:
        return ops(fused(fn, a, b))

    (graph_ops,) = dist.simulate(1, rank_fn)
    assert graph_ops == ["fused_elementwise", "all_reduce", "fused_elementwise"]


def test_errors() -> None:
    x = gpk.from_numpy(np.ones((2, 2), np.float32))
    with pytest.raises(gpk.errors.DistributedError, match="no communicator"):
        dist.all_reduce(x)

    def mismatched() -> None:
        y = x if dist.rank() == 0 else x.reshape(4)
        dist.all_reduce(y).to_numpy()

    with pytest.raises(gpk.errors.DistributedError, match="same collectives in the same order"):
        dist.simulate(2, mismatched)

    def one_fails() -> None:
        if dist.rank() == 1:
            raise KeyError("rank 1 broke")
        dist.all_reduce(x).to_numpy()

    with pytest.raises(KeyError, match="rank 1 broke"):
        dist.simulate(3, one_fails)
    with pytest.raises(gpk.errors.DistributedError, match="world_size must be an integer"):
        dist.simulate(0, one_fails)
    with pytest.raises(gpk.errors.AxisError, match="axis 2 is out of bounds"):
        dist.simulate(1, lambda: dist.all_gather(x, axis=2))


def test_init_on_cpu() -> None:
    assert (dist.rank(), dist.world_size(), dist.is_initialized()) == (0, 1, False)
    comm = dist.init(rank=0, world_size=1)
    try:
        assert dist.is_initialized() and comm.world_size == 1
        x = np.arange(6, dtype=np.float32)
        np.testing.assert_array_equal(dist.all_reduce(gpk.from_numpy(x)).to_numpy(), x)
        with pytest.raises(gpk.errors.DistributedError, match="already set up"):
            dist.init()
    finally:
        dist.destroy()
    assert not dist.is_initialized()
    with pytest.raises(gpk.errors.DistributedError, match="needs one GPU each"):
        dist.init(rank=0, world_size=2)


def test_nccl_unique_id_keeps_every_byte() -> None:
    """The id is 128 raw bytes, NULs included (a c_char field cut it at the first NUL)."""
    from pygpukit.distributed.nccl import UNIQUE_ID_BYTES, UniqueId

    raw = bytes(np.random.default_rng(3).integers(0, 256, UNIQUE_ID_BYTES, dtype=np.uint8))
    raw = raw[:5] + b"\0" + raw[6:]
    uid = UniqueId()
    uid.internal[:] = list(raw)
    assert bytes(bytearray(uid.internal)) == raw
