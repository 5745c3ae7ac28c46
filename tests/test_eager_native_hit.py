"""The native eager hit (eager_ops.NATIVE, rust/pygpukit-py/src/eager.rs) without a GPU.

HostEagerCuda below is the CUDA backend's eager path over a host Rust pool: its values are
DeviceValues, its runs go through the real dispatch controller's Python side
(dispatch.NativeDispatch, EagerReplay) over `_rust.Dispatcher(fake=True)`, and its "device"
is the fake controller's launch log, run in order with NumPy at the logged addresses before
anything reads or writes host memory (as a stream runs before a synchronising copy). A hit
that launched the wrong kernel, or at the wrong addresses, reads back wrong: every result
is checked against float64 NumPy."""

from __future__ import annotations

import ctypes
import inspect
import math
from typing import Any

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import _rust, backends, eager_ops, errors, runtime
from pygpukit.backends.cuda import dispatch
from pygpukit.backends.cuda.value import DeviceValue
from pygpukit.backends.numpy_backend import backend as numpy_backend
from pygpukit.backends.numpy_backend.backend import HostValue, NumpyBackend
from pygpukit.ir import dtypes
from pygpukit.ir.source import resolve
from pygpukit.memory import Storage

HERE = "test_eager_native_hit.py"
FIRST = 100


class _Function:
    """What the recorder sees of a launched kernel: its handle (FIRST + an index of
    HostEagerCuda.kernels; a plan takes no null function)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.context_handle = 1


def _at(addr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any) -> np.ndarray:
    """The array at `addr` of this layout (strides in elements), over host memory."""
    item = dtype.itemsize
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) if shape else 1
    raw = (ctypes.c_char * max(span * item, 1)).from_address(addr)
    flat = np.frombuffer(raw, dtype=dtype.np, count=span)  # type: ignore[call-overload]
    return np.lib.stride_tricks.as_strided(flat, shape, tuple(s * item for s in strides))


class HostEagerCuda(NumpyBackend):
    """The CUDA backend's run, eager_replay and layout keys over a host pool (see above)."""

    poison = False

    def __init__(self, recorder: list[Any]) -> None:
        super().__init__()
        self.stream = None
        self.err_addr = 0
        self.recorder = recorder
        self.kernels: list[tuple[Any, list[tuple[Any, ...]], tuple[Any, ...]]] = []
        self.native: Any = dispatch.NativeDispatch(self, _rust.Dispatcher(capacity=64, fake=True))  # type: ignore[arg-type]
        self.ctrl = self.native.ctrl
        self.device_runs = 0

    # The device: the fake controller's launches, in order.
    def sync(self) -> None:
        for func, _, _, _, _, _, params in self.ctrl.fake_log():
            step, ins, out = self.kernels[func - FIRST]
            arrays = [_at(p, *spec) for p, spec in zip(params[1:], ins, strict=False)]
            result = numpy_backend._run_step(step, arrays)
            _at(params[0], *out)[...] = result
            self.device_runs += 1

    # The CUDA backend's methods of the same names.
    def layout_key(self, value: DeviceValue) -> Any:  # type: ignore[override]
        return (value.strides, dispatch.align(value))

    def run(self, schedule: Any, inputs: Any) -> list[Any]:
        native = self.native
        if native is not None and not self.poison:
            out = native.run(schedule, inputs)
            if out is not None:
                return out
        return super().run(schedule, inputs)

    def eager_replay(self, schedule: Any, inputs: Any) -> Any:
        native = self.native
        if native is None or self.poison:
            return None
        return native.eager_replay(schedule, inputs)

    # Values: DeviceValues over the pool, read and written through HostValues.
    def _host(self, v: DeviceValue) -> HostValue:
        return HostValue(v.storage, _at(v.ptr, v.shape, v.strides, v.dtype))

    def _device(self, h: HostValue) -> DeviceValue:
        a, item = h.array, h.array.dtype.itemsize
        off = (a.__array_interface__["data"][0] - h.storage._addr) // item
        d = dtypes.as_dtype(a.dtype)
        return DeviceValue(h.storage, a.shape, tuple(s // item for s in a.strides), off, d)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        self.sync()
        storage = Storage(self.pool, math.prod(shape) * dtype.itemsize)
        strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        return DeviceValue(storage, tuple(shape), strides, 0, dtype)

    def _store(self, result: np.ndarray, step: Any, ins: list[HostValue]) -> HostValue:
        if step.op in numpy_backend.VIEW_OPS:
            for v in ins[:1]:
                if np.may_share_memory(result, v.array):
                    return HostValue(v.storage, result)
        out = NumpyBackend.empty(self, step.shape, step.dtype)
        out.array[...] = result
        return out

    def from_numpy(self, array: np.ndarray) -> Any:
        v = self.empty(array.shape, dtypes.as_dtype(array.dtype))
        self._host(v).array[...] = array
        return v

    def to_numpy(self, value: Any) -> np.ndarray:
        self.sync()
        return np.array(self._host(value).array, copy=True)

    def strides(self, value: Any) -> tuple[int, ...]:
        return tuple(s * value.dtype.itemsize for s in value.strides)

    def execute(self, step: Any, ins: list[Any], out: Any, inplace: bool,
                launch: Any = None) -> Any:  # fmt: skip
        self.sync()
        hosts = [self._host(v) for v in ins]
        res = super().execute(step, hosts, None if out is None else self._host(out), inplace,
                              launch)  # fmt: skip
        value = self._device(res)
        rec = self.recorder[0]
        if rec is not None and not any(value.storage is v.storage for v in ins):
            self.kernels.append((step, [(v.shape, v.strides, v.dtype) for v in ins],
                                 (value.shape, value.strides, value.dtype)))  # fmt: skip
            args = (value.ptr, *[v.ptr for v in ins])
            rec(_Function(FIRST + len(self.kernels) - 1), (1,), 1, "P" * len(args), args, 0, False)
        return value


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> HostEagerCuda:
    recorder: list[Any] = [None]
    monkeypatch.setattr(dispatch._native, "set_launch_recorder",
                        lambda fn: recorder.__setitem__(0, fn), raising=False)  # fmt: skip
    backend = HostEagerCuda(recorder)
    monkeypatch.setattr(backends, "_backend", backend)
    runtime._SCHEDULE_CACHE.clear()  # and the eager cache, and NATIVE
    yield backend
    runtime._SCHEDULE_CACHE.clear()


def _python_hits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the Python path's hits (eager_ops.hit) from now on."""
    seen: list[int] = []
    hit = eager_ops.hit

    def counting(*args: Any) -> Any:
        seen.append(1)
        return hit(*args)

    monkeypatch.setattr(eager_ops, "hit", counting)
    return seen


def _line() -> int:
    return inspect.currentframe().f_back.f_lineno  # type: ignore[union-attr]


def _f64(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


CASES = [
    ("x + 1.5", lambda x, y: x + 1.5, lambda x, y: x + 1.5),
    ("2.0 * x", lambda x, y: 2.0 * x, lambda x, y: 2.0 * x),
    ("x - y", lambda x, y: x - y, lambda x, y: x - y),
    ("x * y", lambda x, y: x * y, lambda x, y: x * y),
    ("x + x", lambda x, y: x + x, lambda x, y: x + x),
    ("x - y * -0.0", lambda x, y: x - y * -0.0, lambda x, y: x - y * -0.0),
    ("x[::2] * y[1::2]", lambda x, y: x[::2] * y[1::2], lambda x, y: x[::2] * y[1::2]),
]


@pytest.mark.parametrize("name,op,ref", CASES, ids=[c[0] for c in CASES])
def test_native_hits_match_float64(host: HostEagerCuda, monkeypatch: pytest.MonkeyPatch,
                                   name: str, op: Any, ref: Any) -> None:  # fmt: skip
    rng = np.random.default_rng(7)
    with gpk.eager():
        for k in range(8):
            hx = rng.standard_normal(64).astype(np.float32)
            hy = rng.standard_normal(64).astype(np.float32)
            x, y = gpk.from_numpy(hx), gpk.from_numpy(hy)
            if k == 4:  # learnt, planned, recorded and filed by now: natively from here on
                assert len(eager_ops.NATIVE) >= 1, name
                python = _python_hits(monkeypatch)
                runs = host.native.stats["native_runs"]
            out = op(x, y)
            np.testing.assert_allclose(_f64(out.to_numpy()), ref(_f64(hx), _f64(hy)),
                                       rtol=1e-6, atol=1e-6)  # fmt: skip
    assert python == [] and host.native.stats["native_runs"] - runs >= 4, name


def test_a_native_hit_builds_what_the_python_hit_builds(host: HostEagerCuda) -> None:
    rng = np.random.default_rng(8)
    hx = rng.standard_normal(32).astype(np.float32)
    with gpk.eager():
        x = gpk.from_numpy(hx)
        ys = [x * 3.0 for _ in range(4)]  # the last two natively
        line = _line() + 1
        y = x * 3.0
    py_node, node = ys[1]._node, y._node
    assert len(eager_ops.NATIVE) == 1 and host.native.stats["native_runs"] >= 2
    for field in ("op", "inputs", "attrs", "shape", "dtype", "origin", "sub", "_canon"):
        assert getattr(node, field) == getattr(py_node, field), field
    assert node.id > py_node.id and y._link is None and not y._readonly
    v = node.realized
    assert type(v) is DeviceValue and (v.shape, v.strides, v.offset) == ((32,), (1,), 0)
    assert v.storage.nbytes == 128 and v.storage is not x._node.realized.storage
    loc = resolve(node.where)
    assert loc is not None and loc.file.endswith(HERE) and loc.line == line, loc
    built, now = errors._LAST_RUN[0]  # type: ignore[misc]
    assert resolve(now[-1]).line == line  # type: ignore[union-attr]
    np.testing.assert_allclose(_f64(y.to_numpy()), _f64(hx) * 3.0, rtol=1e-6)


def test_errors_still_name_the_op_and_the_line(host: HostEagerCuda) -> None:
    rng = np.random.default_rng(9)
    with gpk.eager():
        a = gpk.from_numpy(rng.standard_normal(6).astype(np.float32))
        b = gpk.from_numpy(rng.standard_normal(6).astype(np.float32))
        c = gpk.from_numpy(rng.standard_normal(5).astype(np.float32))
        for _ in range(4):
            a + b
        assert len(eager_ops.NATIVE) == 1
        with pytest.raises(ValueError) as e:
            line = _line() + 1
            a + c
        assert isinstance(e.value, gpk.ShapeError) and f"{HERE}:{line}" in str(e.value)
        assert "add" in str(e.value)
        i = gpk.from_numpy(np.arange(1, 5, dtype=np.int8))
        for _ in range(4):
            i + 3
        with pytest.raises(OverflowError) as e:
            line = _line() + 1
            i + 300
        assert isinstance(e.value, gpk.GPUKitError) and f"{HERE}:{line}" in str(e.value)
        b.free()
        with pytest.raises(gpk.FreedArrayError) as e:
            line = _line() + 1
            a + b
        assert "freed" in str(e.value) and f"{HERE}:{line}" in str(e.value), str(e.value)


def test_a_declined_replay_takes_the_python_path_and_is_filed_again(
    host: HostEagerCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(10)
    hx = rng.standard_normal(16).astype(np.float32)
    with gpk.eager():
        x = gpk.from_numpy(hx)
        for _ in range(4):
            x - 0.25
        (entry,) = runtime.EAGER_CACHE.values()
        assert isinstance(entry.replay, dispatch.EagerReplay) and len(eager_ops.NATIVE) == 1
        native = host.native
        host.native = None  # the controller switched off: the general path
        try:
            python = _python_hits(monkeypatch)
            off = x - 0.25
        finally:
            host.native = native
        assert python == [1] and entry.replay is None and len(eager_ops.NATIVE) == 0
        for _ in range(3):
            y = x - 0.25
    assert len(eager_ops.NATIVE) == 1 and len(python) == 3
    for out in (off, y):
        np.testing.assert_allclose(_f64(out.to_numpy()), _f64(hx) - 0.25, rtol=1e-6)


def test_entries_leave_with_their_keys_and_on_a_settings_change(host: HostEagerCuda) -> None:
    rng = np.random.default_rng(11)
    hx = rng.standard_normal(8).astype(np.float32)
    with gpk.eager():
        x = gpk.from_numpy(hx)
        for _ in range(4):
            x + 2.0
            x * 2.0
        assert len(eager_ops.NATIVE) == 2
        gpk.set_debug(False)  # any setting: the key holds the skipped passes
        x + 2.0  # the Python hit: filed again
        assert len(eager_ops.NATIVE) == 1
        x * 2.0
        assert len(eager_ops.NATIVE) == 2
        runtime._SCHEDULE_CACHE.clear()
        assert len(eager_ops.NATIVE) == 0
        y = x + 2.0
    np.testing.assert_allclose(_f64(y.to_numpy()), _f64(hx) + 2.0, rtol=1e-6)
