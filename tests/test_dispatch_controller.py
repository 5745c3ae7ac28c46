"""The dispatch controller's Python side on the CPU: plans recorded from a run's launches
(pointer arguments resolved to inputs, output buffers and temporaries) and replayed through
`_rust.Dispatcher(fake=True)`, which logs what it would launch. The fake backend below
allocates from a host pool and launches by calling the recorder, as Function.launch does."""

from __future__ import annotations

import ctypes
import gc
import struct
from typing import Any

import numpy as np
import pytest

from pygpukit import _rust
from pygpukit.backends.cuda import dispatch
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.ir import dtypes
from pygpukit.memory import Storage, block, enable_eviction
from pygpukit.passes import Schedule, Step

F32 = dtypes.float32


class FakeFunction:
    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.context_handle = 77


class FakeBackend:
    """execute() allocates its result and 'launches' f(out, in..., n, alpha, err, tag)."""

    def __init__(self, recorder: list[Any]) -> None:
        self.pool = _rust.Pool()
        self.stream = None
        self.err_addr = 0xE0000
        self.recorder = recorder
        self.foreign = 0  # a pointer argument that is none of the run's blocks

    def new_launch(self, schedule: Schedule, inputs: Any) -> None:
        return None

    def execute(self, step: Step, ins: list[DeviceValue], out: Any, inplace: bool,
                launch: Any) -> DeviceValue:  # fmt: skip
        n = int(np.prod(step.shape))
        v = DeviceValue(block(self.pool, n * 4), step.shape, (1,) * len(step.shape), 0, F32)
        args = (v.ptr, *[x.ptr for x in ins], n, step.attrs["alpha"], self.err_addr, 5)
        fmt = "P" + "P" * len(ins) + "ifPi"
        if self.foreign:
            args, fmt = args + (self.foreign,), fmt + "P"
        rec = self.recorder[0]
        if rec is not None:
            rec(FakeFunction(100 + len(ins)), (n // 4 + 1,), 256, fmt, args, 0, True)
        return v


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> tuple[dispatch.NativeDispatch, FakeBackend]:
    recorder: list[Any] = [None]
    monkeypatch.setattr(dispatch._native, "set_launch_recorder",
                        lambda fn: recorder.__setitem__(0, fn), raising=False)  # fmt: skip
    backend = FakeBackend(recorder)
    return dispatch.NativeDispatch(backend, _rust.Dispatcher(capacity=8, fake=True)), backend  # type: ignore[arg-type]


def _step(
    op: str, ins: tuple[int, ...], out: int, alpha: float, frees: tuple[int, ...] = ()
) -> Step:
    return Step(op, {"alpha": alpha}, ins, out, (8,), F32, None, frees=frees)


def _inputs(pool: Any, k: int) -> list[DeviceValue]:
    return [DeviceValue(block(pool, 32), (8,), (1,), 0, F32) for _ in range(k)]


def _f32_bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def test_a_one_step_run_is_recorded_then_replayed_with_new_pointers(fake: Any) -> None:
    nd, backend = fake
    sched = Schedule([_step("add", (0, 1), 2, 0.5)], 3, [0, 1], [2], None)  # type: ignore[arg-type]
    a, b = _inputs(backend.pool, 2)
    assert nd.run(sched, [a, b]) is None  # the first run plans: the general path
    recorded = nd.run(sched, [a, b])  # the second is recorded while it runs
    assert recorded is not None and nd.stats["recorded"] == 1
    assert nd.ctrl.fake_log() == []  # recording launched through the backend, not the fake
    c, d = _inputs(backend.pool, 2)
    out = nd.run(sched, [c, d])
    assert out is not None and nd.stats["native_runs"] == 1
    (res,) = out
    assert (res.shape, res.strides, res.dtype) == ((8,), (1,), F32)
    assert res.storage is not recorded[0].storage
    (launch,) = nd.ctrl.fake_log()
    func, grid, blk, smem, pdl, stream, params = launch
    assert (func, grid, blk, smem, pdl, stream) == (102, [3, 1, 1], [256, 1, 1], 0, True, 0)
    assert params[:3] == [res.ptr, c.ptr, d.ptr]
    assert params[3] & 0xFFFFFFFF == 8 and params[4] & 0xFFFFFFFF == _f32_bits(0.5)
    assert params[5:] == [backend.err_addr, 5]


def test_temporaries_come_from_the_pool_and_go_back(fake: Any) -> None:
    nd, backend = fake
    # t = f(a, b); out = g(t, a): t is a temporary, freed after its last reader.
    sched = Schedule([_step("mul", (0, 1), 2, 1.0), _step("add", (2, 0), 3, 2.0, frees=(2,))],
                     4, [0, 1], [3], None)  # type: ignore[arg-type]  # fmt: skip
    a, b = _inputs(backend.pool, 2)
    nd.run(sched, [a, b])
    nd.run(sched, [a, b])
    live = backend.pool.stats()["live_blocks"]
    out = nd.run(sched, [b, a])  # swapped: the plan reads input 0 where `a` was
    assert out is not None
    first, second = nd.ctrl.fake_log()
    temp = first[6][0]
    assert temp not in (a.ptr, b.ptr, out[0].ptr)
    assert first[6][1:3] == [b.ptr, a.ptr]
    assert second[6][:3] == [out[0].ptr, temp, b.ptr]
    assert backend.pool.stats()["live_blocks"] == live + 1  # the output alone stays


def test_a_pointer_to_anything_else_keeps_the_general_path(fake: Any) -> None:
    nd, backend = fake
    backend.foreign = 0xABC000  # a workspace the plan could not reproduce
    sched = Schedule([_step("neg", (0,), 1, 1.0)], 2, [0], [1], None)  # type: ignore[arg-type]
    (a,) = _inputs(backend.pool, 1)
    for _ in range(4):
        assert nd.run(sched, [a]) is None or nd.stats["not_cacheable"] == 1
    assert nd.stats["not_cacheable"] == 1 and nd.stats["native_runs"] == 0
    assert nd.ctrl.fake_log() == []


def test_aliased_inputs_are_not_recorded(fake: Any) -> None:
    nd, backend = fake
    sched = Schedule([_step("add", (0, 1), 2, 0.5)], 3, [0, 1], [2], None)  # type: ignore[arg-type]
    (a,) = _inputs(backend.pool, 1)
    for _ in range(3):  # x + x: which input a pointer means is ambiguous
        assert nd.run(sched, [a, a]) is None
    assert nd.stats["recorded"] == 0 and nd.stats["not_cacheable"] == 0
    b, c = _inputs(backend.pool, 2)
    assert nd.run(sched, [b, c]) is not None  # the same layout with two blocks: recorded
    out = nd.run(sched, [c, b])
    assert out is not None and nd.ctrl.fake_log()[0][6][1:3] == [c.ptr, b.ptr]


def test_ops_outside_the_recordable_set_never_record(fake: Any) -> None:
    nd, backend = fake
    sched = Schedule([_step("matmul", (0, 1), 2, 1.0)], 3, [0, 1], [2], None)  # type: ignore[arg-type]
    a, b = _inputs(backend.pool, 2)
    for _ in range(3):
        assert nd.run(sched, [a, b]) is None
    assert sched.info["native_plans"] is False


def test_a_zero_fill_is_a_memset_and_never_records(fake: Any) -> None:
    # The recorder sees kernel launches only: a plan of a zero `full` (a memset) would
    # replay as an allocation with nothing written (gpk.zeros handing out old bytes).
    nd, backend = fake
    zero = Step("full", {"value": 0, "alpha": 1.0}, (), 0, (8,), F32, None)
    sched = Schedule([zero], 1, [], [0], None)  # type: ignore[arg-type]
    for _ in range(3):
        assert nd.run(sched, []) is None
    assert sched.info["native_plans"] is False and nd.eager_replay(sched, []) is False
    assert nd.stats["recorded"] == 0
    # A nonzero fill is a kernel, recorded as any other launch (and -0.0 is not zero bytes).
    for k, value in enumerate((1.5, -0.0)):
        fill = Step("full", {"value": value, "alpha": 1.0}, (), 0, (8,), F32, None)
        sched = Schedule([fill], 1, [], [0], None)  # type: ignore[arg-type]
        for _ in range(3):
            nd.run(sched, [])
        assert nd.stats["recorded"] == k + 1


def test_a_plan_dropped_by_the_controller_is_recorded_again(fake: Any) -> None:
    nd, backend = fake
    scheds = [Schedule([_step("add", (0, 1), 2, float(k))], 3, [0, 1], [2], None)  # type: ignore[arg-type]
              for k in range(12)]  # fmt: skip
    a, b = _inputs(backend.pool, 2)
    for s in scheds:  # 12 plans into a controller of 8
        nd.run(s, [a, b])
        nd.run(s, [a, b])
    assert len(nd.ctrl) == 8 and nd.ctrl.stats()["evicted"] == 4
    assert nd.run(scheds[0], [a, b]) is None  # gone from the controller: general path
    nd.run(scheds[0], [a, b])
    nd.run(scheds[0], [a, b])
    assert nd.stats["recorded"] == 13
    assert nd.run(scheds[0], [a, b]) is not None


def test_the_rust_dispatcher_checks_plans_and_calls() -> None:
    d = _rust.Dispatcher(capacity=4, fake=True)
    pool = _rust.Pool()
    with pytest.raises(ValueError, match="input 1 of 1"):
        d.insert(1, [(None, 1, 2, [1], [32], 0, False, [(1, 1, 0)])], 1, 0, [])
    d.insert(1, [(None, 1, 2, [1], [32], 0, False, [(1, 0, 4), (0, -1, 0)])], 1, 0, [])
    with pytest.raises(ValueError, match="takes 1 inputs"):
        d.run(1, [], [], 0, pool)
    d.fake_fail_launch(0)
    with pytest.raises(RuntimeError, match="700"):
        d.run(1, [0x1000], [], 0, pool)
    assert d.run(1, [0x1000], [], 0, pool)
    assert d.fake_log()[0][6] == [0x1004, (1 << 64) - 1]
    assert not d.run(2, [], [], 0, pool)
    assert d.stats()["misses"] == 1


def test_no_general_runs_records_the_first(fake: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    nd, backend = fake
    monkeypatch.setattr(dispatch, "_GENERAL_RUNS", 0)
    sched = Schedule([_step("add", (0, 1), 2, 0.5)], 3, [0, 1], [2], None)  # type: ignore[arg-type]
    a, b = _inputs(backend.pool, 2)
    assert nd.run(sched, [a, b]) is not None and nd.stats["recorded"] == 1
    assert nd.run(sched, [a, b]) is not None and nd.stats["native_runs"] == 1


def test_an_eager_replay_runs_the_plan_of_its_layouts(fake: Any) -> None:
    """dispatch.EagerReplay, what an eager op's hits call on CUDA (eager_ops.py): the plan
    recorded for the layouts, replayed with one Dispatcher.run over new pointers."""
    nd, backend = fake
    backend.native, backend.poison = nd, False
    sched = Schedule([_step("add", (0, 1), 2, 0.5)], 3, [0, 1], [2], None)  # type: ignore[arg-type]
    a, b = _inputs(backend.pool, 2)
    assert nd.eager_replay(sched, [a, b]) is None  # never run: nothing yet
    nd.run(sched, [a, b])
    assert nd.eager_replay(sched, [a, b]) is None  # planned, not recorded yet
    nd.run(sched, [a, b])
    replay = nd.eager_replay(sched, [a, b])
    assert isinstance(replay, dispatch.EagerReplay)
    c, d = _inputs(backend.pool, 2)
    res = replay([c, d])
    assert isinstance(res, DeviceValue) and nd.stats["native_runs"] == 1
    assert (res.shape, res.strides, res.offset, res.dtype) == ((8,), (1,), 0, F32)
    assert res.storage not in (c.storage, d.storage) and res.storage.nbytes == 32
    (launch,) = nd.ctrl.fake_log()
    assert launch[6][:3] == [res.ptr, c.ptr, d.ptr]
    assert launch[6][5:] == [backend.err_addr, 5]
    backend.poison = True  # outputs must be poisoned: the general path's alloc does it
    assert replay([c, d]) is None
    backend.poison, backend.native = False, None  # the controller switched off
    assert replay([c, d]) is None
    backend.native = nd
    assert replay([d, c]) is not None and nd.ctrl.fake_log()[-1][6][1:3] == [d.ptr, c.ptr]
    for k in range(8):  # eight other plans push this one out of a controller of 8
        other = Schedule([_step("add", (0, 1), 2, float(k))], 3, [0, 1], [2], None)  # type: ignore[arg-type]
        nd.run(other, [a, b])
        nd.run(other, [a, b])
    assert replay([c, d]) is None and nd.stats["native_runs"] == 2


def test_an_eager_replay_is_refused_where_no_plan_can_be(fake: Any) -> None:
    nd, backend = fake
    (a,) = _inputs(backend.pool, 1)
    mm = Schedule([_step("matmul", (0,), 1, 1.0)], 2, [0], [1], None)  # type: ignore[arg-type]
    nd.run(mm, [a])
    assert nd.eager_replay(mm, [a]) is False  # outside RECORDABLE_OPS
    two = Schedule([_step("neg", (0,), 1, 1.0), _step("neg", (0,), 2, 2.0)], 3, [0], [1, 2],
                   None)  # type: ignore[arg-type]  # fmt: skip
    for _ in range(3):
        nd.run(two, [a])
    assert nd.eager_replay(two, [a]) is False  # an eager op has one output
    backend.foreign = 0xABC000
    ws = Schedule([_step("neg", (0,), 1, 3.0)], 2, [0], [1], None)  # type: ignore[arg-type]
    for _ in range(3):
        nd.run(ws, [a])
    assert nd.stats["not_cacheable"] == 1 and nd.eager_replay(ws, [a]) is False


def _copy_out(addr: int, nbytes: int) -> bytes:
    return ctypes.string_at(addr, nbytes)


def _copy_in(host: bytes, addr: int) -> None:
    ctypes.memmove(addr, host, len(host))


def test_run_alloc_restores_inputs_and_declines_after_an_eviction(fake: Any) -> None:
    """Dispatcher.run_alloc, an eager hit's and a cached realize's one call: an evicted
    input is restored and launched at its address now; the output block is the pool's; an
    allocation that evicts makes the replay decline, launching nothing and leaving no block
    allocated. The layout key's alignment (dispatch.align, no pool call) is the address's."""
    nd, backend = fake
    pool = _rust.Pool(arena_bytes=1 << 20, quota_bytes=1 << 20)
    enable_eviction(pool, _copy_out, _copy_in)
    backend.pool = pool
    sched = Schedule([_step("add", (0, 1), 2, 0.5)], 3, [0, 1], [2], None)  # type: ignore[arg-type]
    a, b = _inputs(pool, 2)
    ctypes.memmove(a.storage.addr, b"pygpukit", 8)
    nd.run(sched, [a, b])
    nd.run(sched, [a, b])
    fillers = []
    while not a.storage.evicted:  # least recently used first: a goes before b
        fillers.append(Storage(pool, 64 << 10))
        b.storage.addr  # noqa: B018 - a read marks b used
    del fillers
    gc.collect()
    out = nd.run(sched, [a, b])
    assert out is not None and nd.stats["native_runs"] == 1
    assert not a.storage.evicted and ctypes.string_at(a.storage.addr, 8) == b"pygpukit"
    (launch,) = nd.ctrl.fake_log()
    assert launch[6][:3] == [out[0].ptr, a.ptr, b.ptr]
    for v in (a, b, out[0], DeviceValue(a.storage, (7,), (1,), 1, F32)):
        assert dispatch.align(v) == v.ptr & 15
    full = []
    while pool.stats()["in_use_bytes"] + 64 < 1 << 20:  # the next output must evict
        full.append(Storage(pool, min(64 << 10, (1 << 20) - pool.stats()["in_use_bytes"] - 64)))
    before = (pool.stats()["live_blocks"], pool.evictions)
    assert nd.run(sched, [a, b]) is None and nd.stats["fallbacks"] == 1
    assert nd.ctrl.fake_log() == []  # nothing launched (the log drains when read)
    evicted = pool.evictions - before[1]
    assert evicted > 0 and pool.stats()["live_blocks"] == before[0] - evicted
