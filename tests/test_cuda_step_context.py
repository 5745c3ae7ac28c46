"""The CUDA planners' StepContext without a GPU (kernels compiled by NVRTC, launches
checked by tests/cuda_fakes.py): the output slot and the Launch handed to its call()
decide where a launcher writes, which stream its kernels go to, whether it counts as
captured, and which scratch blocks a recording keeps; nothing of a call outlives it."""

from __future__ import annotations

from typing import Any

import cuda_fakes
import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import runtime
from pygpukit.backends.cuda.context import Launch, StepContext, capturing, contiguous
from pygpukit.backends.cuda.plan import plan_step
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.ir import toposort
from pygpukit.passes import lower, run_pipeline

pytest.importorskip("nvidia")


class FakeAllocator(cuda_fakes.FakeCtx):
    """What a StepContext asks of CudaBackend: allocation (with the launch), error word."""

    def __init__(self) -> None:
        super().__init__()
        self.stream = "legacy stream"
        self.what: list[str] = []

    def alloc(self, shape: tuple[int, ...], dtype: Any, what: str,
              launch: Launch | None = None) -> DeviceValue:  # fmt: skip
        v = super().alloc(shape, dtype, what)
        self.what.append(what)
        if launch is not None and launch.keep is not None:
            launch.keep.append(v.storage)  # type: ignore[arg-type]
        return v


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The stream of every kernel launch."""
    cuda_fakes.install(monkeypatch, "sm_90")
    seen: list[Any] = []
    real = cuda_fakes.FakeFunction.launch

    def launch(self: Any, grid: Any, block: Any, fmt: str, args: Any, shared_mem: int = 0,
               stream: Any = None, pdl: bool = False) -> None:  # fmt: skip
        seen.append(stream)
        real(self, grid, block, fmt, args, shared_mem, stream, pdl)

    monkeypatch.setattr(cuda_fakes.FakeFunction, "launch", launch)
    return seen


def _steps(out: gpk.GPUArray) -> tuple[Any, list[DeviceValue]]:
    pending = [out.node]
    order = toposort(pending, is_leaf=lambda n: n.realized is not None)
    graph, leaves = runtime._graph_of(order, pending)
    sched = lower(run_pipeline(graph))
    env: list[Any] = [None] * sched.n_slots
    for s, n in zip(sched.input_slots, leaves, strict=True):
        st = cuda_fakes.FakeStorage(max(1, int(np.prod(n.shape))) * n.dtype.itemsize)
        env[s] = DeviceValue(st, n.shape, contiguous(n.shape), 0, n.dtype)  # type: ignore[arg-type]
    return sched, env


def _graph() -> gpk.GPUArray:
    rng = np.random.default_rng(3)
    x = gpk.asarray(rng.standard_normal((8, 32)).astype(np.float32))
    w = gpk.asarray(rng.standard_normal((16, 32)).astype(np.float32))
    h = gpk.nn.softmax(x @ w.T * 0.5)
    return gpk.exp(h).sum(-1) + 1.0


@pytest.mark.parametrize("capture", [False, True])
def test_call_hands_slot_and_launch_to_the_launcher(streams: list[Any], capture: bool) -> None:
    backend = FakeAllocator()
    sched, env = _steps(_graph())
    launch = Launch("capture stream" if capture else "legacy stream", [] if capture else None)
    for step in sched.steps:
        ins = [env[i] for i in step.ins]
        ctx = StepContext(backend, step, launch)
        run = plan_step(ctx, step, ins)  # type: ignore[arg-type]
        ctx.launch = None
        arena = cuda_fakes.FakeStorage(1 << 20)
        slot = DeviceValue(arena, step.shape, contiguous(step.shape), 64, step.dtype)  # type: ignore[arg-type]
        before = len(streams)
        got = ctx.call(run, ins, slot, launch)
        # The result is the slot handed in, or memory of its own the executor copies.
        assert got.shape == step.shape and (got.storage is not arena or got.offset == 64)
        assert streams[before:] and set(streams[before:]) == {launch.stream}, step.op
        assert (ctx.out, ctx.launch) == (None, None)  # nothing of the call stays behind
        assert capturing(ctx) is False and ctx.stream == backend.stream
        env[step.out] = ctx.call(run, ins, None, launch)  # no slot: it allocates
    # Scratch allocated while recording is kept with the graph; none outside a recording.
    assert (len(launch.keep or []) > 0) == capture
    assert backend.what and all(" at " in w for w in backend.what)  # the step's location


def test_capturing_follows_the_launch(streams: list[Any]) -> None:
    backend = FakeAllocator()
    ctx = StepContext(backend, None)
    x = backend.alloc((4,), gpk.float32, "x")
    seen: list[tuple[bool, Any]] = []

    def run(ins: list[DeviceValue]) -> DeviceValue:
        seen.append((capturing(ctx), ctx.stream))
        return ins[0]

    for launch in (Launch("s"), Launch("c", keep=[]), None):
        ctx.call(run, [x], None, launch)
    assert seen == [(False, "s"), (True, "c"), (False, "legacy stream")]


class _CountingPool:
    """A pool of distinct addresses that records frees."""

    def __init__(self) -> None:
        self.next, self.freed = 1 << 20, []  # type: list[int]

    def alloc_storage(self, nbytes: int) -> tuple[int, None]:
        self.next += 1 << 20
        return self.next, None

    def free(self, addr: int) -> None:
        self.freed.append(addr)


def test_a_recording_hands_a_dead_values_block_to_a_later_value() -> None:
    from pygpukit.memory import Storage

    pool = _CountingPool()
    launch = Launch("capture stream", keep=[])

    def new(n: int) -> Storage:
        return Storage(pool, n)

    a = launch.recorded_block(1000, new)
    at = a.addr
    b = launch.recorded_block(1000, new)
    assert b.addr != at  # a is alive: another block
    del a
    c = launch.recorded_block(800, new)
    assert c.addr == at and c.nbytes == 800  # a's block (no more than twice the request)
    c.pin()  # a pin holds the block itself
    assert c.pins == 1 and launch.keep is not None and launch.keep[0].pins == 1
    c.unpin()
    del b
    d = launch.recorded_block(300, new)  # b's 1000 bytes are over twice 300: a new block
    e = launch.recorded_block(1000, new)  # b's block
    assert d.addr not in (at, e.addr)
    assert len(launch.keep or []) == 3 and len({s.addr for s in launch.keep or []}) == 3
    # The graph holds its blocks: no view's death frees one, and a block outlives its views.
    del c, d, e
    assert pool.freed == [] and len(launch.spare) == 3
    held = list(launch.keep or [])
    launch.keep = None
    del launch
    assert pool.freed == []
    del held
    assert len(pool.freed) == 3
