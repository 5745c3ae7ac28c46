"""The transfer engine's Python glue without a GPU: the copy C ABI reaches the Rust
extension as a capsule, and a missing driver is a clean CUDAError, not a crash. The
engine itself is tested by cargo (fake device) and tests/gpu/test_transfer_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import _native, _rust
from pygpukit.errors import CUDAError


def test_copy_capi_is_a_named_capsule_registered_by_the_cuda_backend() -> None:
    import pygpukit.backends.cuda.transfers  # noqa: F401  (registers at import)

    capsule = _native.copy_capi()
    assert type(capsule).__name__ == "PyCapsule"
    assert "pygpukit._native.copy_capi" in repr(capsule)
    assert _rust.copy_capi_registered()
    _rust.register_copy_capi(capsule)  # the same table again: accepted
    assert _rust.copy_capi_registered()


@pytest.mark.parametrize("bad", [object(), 3, b"capsule"])
def test_register_rejects_what_is_not_the_copy_capsule(bad: object) -> None:
    with pytest.raises(TypeError, match="copy_capi"):
        _rust.register_copy_capi(bad)


@pytest.mark.skipif(_native.driver_available(), reason="checks the no-driver path")
def test_engine_without_a_driver_raises_cuda_error_with_the_drivers_reason() -> None:
    import pygpukit.backends.cuda.transfers as transfers

    with pytest.raises(CUDAError) as e:
        _rust.TransferEngine()
    assert _native.driver_unavailable_reason().split(":")[0] in str(e.value)
    assert e.value.code == -1  # type: ignore[attr-defined]
    with pytest.raises(CUDAError):
        transfers.engine()


def test_stream_ids() -> None:
    from pygpukit.backends.cuda.transfers import stream_id

    class FakeStream:
        handle = 0x7F00

    assert stream_id(None) == 0
    assert stream_id(12345) == 12345
    assert stream_id(FakeStream()) == 0x7F00


def test_upload_and_download_refuse_non_contiguous_arrays() -> None:
    from pygpukit.backends.cuda import transfers

    a = np.random.default_rng().standard_normal((4, 6))
    with pytest.raises(ValueError, match="C-contiguous"):
        transfers.upload(1 << 20, a[:, ::2], None)
    ro = np.random.default_rng().standard_normal(8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        transfers.download(ro, 1 << 20, None)
    with pytest.raises(ValueError, match="C-contiguous"):
        transfers.upload_staged([(1 << 20, a[:2].copy()), (1 << 21, a[:, ::2])], None)


@pytest.mark.parametrize("arg", ["chunk_bytes", "bulk_piece_bytes"])
def test_engine_refuses_empty_pieces(arg: str) -> None:
    import pygpukit.backends.cuda.transfers  # noqa: F401  (registers the copy C ABI)

    with pytest.raises(ValueError, match=f"{arg} must be positive"):
        _rust.TransferEngine(**{arg: 0})


def test_load_numpy_matches_from_numpy() -> None:
    """The loader's low-priority path gives the same array (NumPy backend: plain copies)."""
    from pygpukit.creation import load_numpy

    rng = np.random.default_rng()
    a = rng.standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_array_equal(load_numpy(a).to_numpy(), a)
    t = np.asfortranarray(rng.standard_normal((3, 4)))
    np.testing.assert_array_equal(load_numpy(t).to_numpy(), t)
    assert load_numpy(a).dtype == gpk.from_numpy(a).dtype


def test_load_numpy_rows_lands_each_part_in_its_rows() -> None:
    """A fused weight's parts (views of a memory map, a strided slice among them) uploaded
    into one array equal their float64 concatenation; parts that cannot be rows of one
    array are a ShapeError naming them."""
    import ml_dtypes

    from pygpukit.creation import load_numpy_rows

    rng = np.random.default_rng()
    big = rng.standard_normal((9, 12))
    parts = [big[:4, :6], big[4:5, :6], big[5:, 6:]]  # the last two: rows of other tensors
    for dt in (np.float32, ml_dtypes.bfloat16):
        got = load_numpy_rows([p.astype(dt) for p in parts])
        want = np.concatenate(parts).astype(dt).astype(np.float64)
        assert got.shape == (9, 6) and got.dtype.np == np.dtype(dt)
        np.testing.assert_array_equal(got.to_numpy().astype(np.float64), want)
    with pytest.raises(gpk.ShapeError, match=r"load_numpy_rows.*float32\[2, 3\].*float32\[2, 4\]"):
        load_numpy_rows([np.ones((2, 3), np.float32), np.ones((2, 4), np.float32)])
    with pytest.raises(gpk.ShapeError, match="share a dtype"):
        load_numpy_rows([np.ones((2, 3), np.float32), np.ones((2, 3), np.float16)])


def test_load_numpy_groups_lands_each_group_in_one_array() -> None:
    """A bulk load's groups (one part, several parts of one fused weight, a strided view,
    an empty part) equal their float64 concatenation; the progress callback counts every
    byte; parts that cannot be rows of one array are a ShapeError naming them."""
    import ml_dtypes

    from pygpukit.creation import load_numpy_groups

    rng = np.random.default_rng()
    big = rng.standard_normal((9, 12))
    groups = [[big[:4, :6]], [big[:2], big[2:3], big[3:, :][:0], big[5:]], [big[::2, ::3]],
              [big[0]]]  # fmt: skip
    for dt in (np.float32, ml_dtypes.bfloat16):
        cast = [[p.astype(dt) for p in g] for g in groups]
        seen: list[int] = []
        got = load_numpy_groups(cast, progress=seen.append)
        assert sum(seen) == sum(p.nbytes for g in cast for p in g)
        for g, arr in zip(cast, got, strict=True):
            want = np.concatenate(g) if len(g) > 1 else g[0]
            assert arr.shape == want.shape and arr.dtype.np == np.dtype(dt)
            np.testing.assert_array_equal(arr.to_numpy().astype(np.float64),
                                          want.astype(np.float64))  # fmt: skip
    bad = r"load_numpy_groups.*float32\[2, 3\].*float32\[2, 4\]"
    with pytest.raises(gpk.ShapeError, match=bad):
        load_numpy_groups([[np.ones((2, 3), np.float32), np.ones((2, 4), np.float32)]])
