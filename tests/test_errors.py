"""Every error path: the right gpk class, the builtin it subclasses, the op, types and line."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gpk

HERE = "test_errors.py:"


def arr(*shape: int, dtype: str = "float32") -> gpk.GPUArray:
    return gpk.from_numpy(np.random.default_rng().standard_normal(shape).astype(dtype))


def check(exc: pytest.ExceptionInfo, *words: str) -> None:
    msg = str(exc.value)
    assert isinstance(exc.value, gpk.GPUKitError)
    for w in words:
        assert w in msg, (w, msg)
    assert HERE in msg, msg  # points at the user's line, not at pygpukit internals


@pytest.mark.parametrize("eager", [False, True])
def test_shape_mismatch(eager: bool) -> None:
    with gpk.eager(eager):
        with pytest.raises(ValueError) as e:
            arr(2, 3) + arr(4)
        assert isinstance(e.value, gpk.ShapeError)
        check(e, "add", "f32[2, 3]", "f32[4]", "broadcast")
        with pytest.raises(gpk.ShapeError) as e:
            arr(2, 3) @ arr(4, 5)
        check(e, "matmul", "inner dimensions")
        with pytest.raises(gpk.ShapeError) as e:
            arr(2, 3).reshape(4, 2)
        check(e, "reshape", "(2, 3)")
        with pytest.raises(gpk.ShapeError) as e:
            gpk.concatenate([arr(2, 3), arr(3, 2)], axis=0)
        check(e, "concat")
        with pytest.raises(gpk.ShapeError) as e:
            gpk.nn.rms_norm(arr(2, 8), arr(7))
        check(e, "rms_norm", "last dim 8")
        with pytest.raises(gpk.ShapeError) as e:
            g = arr(4, 4)
            g[1:3] = arr(3, 4)
        check(e, "setitem", "broadcast")


def test_bad_axis() -> None:
    with pytest.raises(gpk.ShapeError) as e:
        arr(2, 3).sum(axis=2)
    check(e, "sum", "axis 2 is out of bounds")
    with pytest.raises(gpk.ShapeError) as e:
        arr(2, 3).transpose(0, 0)
    check(e, "transpose")  # the function the user called
    with pytest.raises(gpk.ShapeError) as e:
        gpk.nn.softmax(arr(2, 3), axis=-3)
    check(e, "softmax")
    with pytest.raises(gpk.ShapeError):
        arr(2, 3).mean(axis=(0, 0))


def test_unsupported_dtype() -> None:
    with pytest.raises(TypeError) as e:
        gpk.from_numpy(np.zeros(3, dtype=np.complex64) + 1j)
    assert isinstance(e.value, gpk.DTypeError)
    with pytest.raises(gpk.DTypeError) as e:
        arr(3).astype("complex128")
    with pytest.raises(gpk.DTypeError) as e:
        gpk.where(arr(3), arr(3), arr(3))
    check(e, "where", "condition must be bool")
    with pytest.raises(gpk.DTypeError) as e:
        gpk.nn.softmax(gpk.arange(4))
    check(e, "softmax", "floating-point")
    with pytest.raises(gpk.DTypeError) as e:
        gpk.take(arr(4, 2), arr(2))
    check(e, "take", "integers")


@pytest.mark.parametrize("eager", [False, True])
def test_out_of_range_index(eager: bool) -> None:
    with gpk.eager(eager):
        with pytest.raises(IndexError) as e:
            arr(3, 4)[3]
        check(e, "index", "out of bounds")
        with pytest.raises(IndexError) as e:
            arr(3, 4)[0, 0, 0]
        check(e, "too many indices")
        ids = gpk.asarray(np.array([0, 7]))
        with pytest.raises(IndexError) as e:
            gpk.take(arr(5, 2), ids, axis=0).to_numpy()
        check(e, "take", "index 7 is out of bounds")
        pos = gpk.asarray(np.array(9))
        with pytest.raises(IndexError) as e:
            cache = arr(2, 4, 3)
            cache[:, pos] = arr(2, 3)
            cache.to_numpy()
        check(e, "setitem", "out of bounds")


def _plus_one_at(x: gpk.GPUArray, i: gpk.GPUArray) -> gpk.GPUArray:
    return x[i] + 1  # the line the cached schedule is first built from


def test_cached_schedule_errors_name_the_line_of_the_failing_call() -> None:
    """A lazy schedule is cached by structure; an error in a later run that reused it from
    another line names that line, not the one the schedule was first built from."""
    import inspect

    a = gpk.asarray(np.random.default_rng(0).normal(size=5))
    np.testing.assert_allclose(_plus_one_at(a, gpk.asarray(np.array(1))).to_numpy(),
                               a.to_numpy()[1] + 1)  # fmt: skip
    hits = gpk.runtime.stats["schedule_hits"]
    with pytest.raises(IndexError) as e:
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        (a[gpk.asarray(np.array(7))] + 1).to_numpy()
    assert gpk.runtime.stats["schedule_hits"] == hits + 1  # the cached schedule was reused
    assert f"test_errors.py:{line}" in str(e.value), str(e.value)


def test_use_after_free() -> None:
    x = arr(4, 4)
    y = x + 1
    x.free()
    with pytest.raises(RuntimeError) as e:
        y.to_numpy()
    assert isinstance(e.value, gpk.FreedArrayError)
    check(e, "add", "freed")
    with pytest.raises(gpk.FreedArrayError):
        x.to_numpy()


def test_errors_do_not_leak_pool_memory() -> None:
    before = gpk.pool_stats()["in_use_bytes"]
    for _ in range(20):
        with pytest.raises(IndexError):
            gpk.take(arr(64, 64), gpk.asarray(np.array([99])), axis=0).to_numpy()
        with pytest.raises(gpk.ShapeError):
            arr(8, 8) + arr(3)
    import gc

    gc.collect()
    assert gpk.pool_stats()["in_use_bytes"] <= before


def test_out_of_memory_is_clean() -> None:
    from pygpukit.backends.numpy_backend import NumpyBackend

    small = NumpyBackend(arena_bytes=1 << 20, quota_bytes=1 << 20)
    v = small.empty((1000,), gpk.float32)
    stats = small.pool_stats()
    with pytest.raises(MemoryError) as e:
        small.empty((1 << 20,), gpk.float32)
    assert isinstance(e.value, gpk.OutOfMemoryError)
    after = small.pool_stats()
    assert after["in_use_bytes"] == stats["in_use_bytes"]
    v.array[...] = 3.0  # the pool is whole: earlier blocks still usable
    w = small.empty((1000,), gpk.float32)
    assert w.storage.addr != v.storage.addr


def test_error_classes_subclass_builtins() -> None:
    assert issubclass(gpk.ShapeError, ValueError)
    assert issubclass(gpk.DTypeError, TypeError)
    assert issubclass(gpk.IndexError, IndexError)
    assert issubclass(gpk.OutOfMemoryError, MemoryError)
    for cls in (gpk.CompileError, gpk.CUDAError, gpk.TraceError, gpk.AdmissionRejected):
        assert issubclass(cls, gpk.GPUKitError)
