"""cuBLASLt host-side logic, no GPU needed: where the library is looked for, the plan-cache
key, operand layouts, and clear errors when the library is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import pygpukit as gpk
from pygpukit import _native
from pygpukit.backends.cuda import cublaslt, toolchain
from pygpukit.errors import CUDAError


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a shared library")
    return path


# -- discovery ------------------------------------------------------------------------------


def test_candidates_wheel_then_cuda_home_then_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = tmp_path / "site" / "nvidia"
    lib13 = _touch(wheel / "cu13/lib/libcublasLt.so.13")
    lib12 = _touch(wheel / "cublas/lib/libcublasLt.so.12")
    home = tmp_path / "cuda"
    home_lib = _touch(home / "lib64/libcublasLt.so.12.4")
    monkeypatch.setattr(toolchain, "nvidia_wheel_dirs", lambda: [wheel])
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.delenv("PYGPUKIT_CUBLASLT", raising=False)
    c = toolchain.cublaslt_candidates()
    assert c[:3] == [str(lib13), str(lib12), str(home_lib)]
    assert c[3:] == ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]
    assert toolchain.cublaslt_path() == str(lib13)


def test_candidates_without_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "nvidia_wheel_dirs", lambda: [])
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    monkeypatch.delenv("PYGPUKIT_CUBLASLT", raising=False)
    assert toolchain.cublaslt_candidates() == [
        "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"
    ]  # fmt: skip
    monkeypatch.setenv("PYGPUKIT_CUBLASLT", "0")
    assert toolchain.cublaslt_candidates() == []


def _skip_if_loaded() -> None:
    # Checked when the test runs: another test in this worker may have loaded it since
    # collection, and a loaded library stays loaded.
    if _native.cublaslt_loaded():
        pytest.skip("cuBLASLt is already loaded in this process")


def test_missing_library_is_a_clear_cuda_error(tmp_path: Path) -> None:
    _skip_if_loaded()
    bogus = _touch(tmp_path / "libcublasLt.so.13")
    with pytest.raises(CUDAError, match="pip install nvidia-cublas") as e:
        _native.cublaslt_load([str(tmp_path / "absent.so"), str(bogus)])
    assert e.value.call == "load libcublasLt"  # type: ignore[attr-defined]
    assert "absent.so" in str(e.value) and str(bogus) in str(e.value)
    with pytest.raises(CUDAError, match="no candidates"):
        _native.cublaslt_load([])
    # A real library without the entry points is named with what it lacks.
    libm = "libm.so.6" if sys.platform.startswith("linux") else None
    if libm:
        with pytest.raises(CUDAError, match="missing cublasLtCreate"):
            _native.cublaslt_load([libm])
    assert not _native.cublaslt_loaded()
    with pytest.raises(CUDAError, match="cuBLASLt is not loaded"):
        _native.cublaslt_plan(8, 8, 8, "float32", lda=8, ldb=8, ldd=8)
    with pytest.raises(CUDAError, match="not loaded"):
        _native.cublaslt_version()


def test_planner_falls_back_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    _skip_if_loaded()
    monkeypatch.setenv("PYGPUKIT_CUBLASLT", "0")
    monkeypatch.setattr(cublaslt, "_lt", {})
    reason = cublaslt.cublaslt_unavailable_reason()
    assert "cannot load cuBLASLt" in reason
    assert cublaslt._lt == {"reason": reason}  # tried once, remembered
    launch = cublaslt.lt_launcher(None, "float32", 8, 8, 8, (False, 8), (False, 8))  # type: ignore[arg-type]
    assert launch is None  # the NVRTC GEMM serves


def test_tuned_plans_take_no_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuned GEMM (TUNE_MIN_ROWS rows and more) is planned without a workspace (no memset
    node in a captured graph) unless cuBLASLt has no such algorithm; an untuned one (a
    decode step's) keeps the backend's workspace."""
    asked: list[int] = []
    refuse_bare = [False]

    def fake_plan(*args: object, workspace_bytes: int, **kw: object) -> object:
        asked.append(workspace_bytes)
        if workspace_bytes == 0 and refuse_bare[0]:
            raise CUDAError("no algorithm")
        return object()

    ws = 32 << 20
    monkeypatch.setattr(cublaslt, "cublaslt_unavailable_reason", lambda: "")
    monkeypatch.setattr(cublaslt, "_workspace", lambda ctx: (None, ws))
    monkeypatch.setattr(_native, "cublaslt_plan", fake_plan)
    rows = cublaslt.TUNE_MIN_ROWS

    def launcher(m: int, tune: bool = True) -> object:
        return cublaslt.lt_launcher(None, "bfloat16", m, 64, 64, (False, 64), (False, 64),  # type: ignore[arg-type]
                                    tune=tune)  # fmt: skip

    assert launcher(rows) is not None and asked == [0]
    asked.clear()
    assert launcher(rows - 1) is not None and asked == [ws]
    asked.clear()
    assert launcher(rows, tune=False) is not None and asked == [ws]
    asked.clear()
    refuse_bare[0] = True
    assert launcher(rows) is not None and asked == [0, ws]


# -- plan-cache key -------------------------------------------------------------------------

KEY = dict(lda=64, ldb=32, ldd=32)


def key(m: int = 16, n: int = 32, k: int = 64, d: str = "bfloat16", **kw: object) -> str:
    return _native.cublaslt_plan_key(m, n, k, d, **{**KEY, **kw})  # type: ignore[arg-type]


def test_key_identifies_the_problem() -> None:
    base = key()
    assert base == key() and "bfloat16 m16 n32 k64" in base
    # Every field that changes the GEMM changes the key.
    variants = [
        key(m=17), key(n=31, ldd=32, ldb=32), key(k=63), key(d="float16"), key(d="float32"),
        key(d="float32", tf32=True), key(lda=72), key(ldd=40), key(trans_b=True, ldb=64),
        key(epilogue="bias"), key(epilogue="gelu"), key(epilogue="gelu_bias"), key(align=8),
        key(workspace_bytes=1 << 20), key(device=1),
        key(batch=2, stride_a=1024, stride_b=2048, stride_d=512),
        key(batch=2, stride_a=0, stride_b=2048, stride_d=512), key(ldc=32), key(ldc=48),
    ]  # fmt: skip
    assert len(set(variants + [base])) == len(variants) + 1
    # Batch strides of a single matrix do not matter: equal problems share one plan.
    assert key(stride_a=5, stride_b=7, stride_d=9) == base


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(d="float64"), "dtype"),
        (dict(d="float16", tf32=True), "tf32"),
        (dict(m=0), "positive"),
        (dict(lda=63), "lda"),
        (dict(trans_a=True, lda=15), "lda"),
        (dict(ldb=31), "ldb"),
        (dict(ldd=31), "ldd"),
        (dict(epilogue="relu"), "epilogue"),
        (dict(align=3), "align"),
        (dict(d="float32", align=2), "align"),
        (dict(batch=2, stride_d=100), "overlap"),
        (dict(batch=2, stride_a=-1, stride_d=512), ">= 0"),
        (dict(m=1 << 31), "int32"),
        (dict(ldc=31), "ldc"),
        (dict(ldc=-1), "ldc"),
        (dict(ldc=32, batch=2, stride_d=512), "single matrix"),
        (dict(ldc=32, epilogue="gelu_bias"), "none or bias"),
    ],
)
def test_key_rejects_bad_problems(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        key(**kw)  # type: ignore[arg-type]


FP8 = dict(in_dtype="float8_e4m3", scale_a="vec128", scale_b="blk128x128", trans_b=True,
           lda=64, ldb=64)  # fmt: skip


def test_fp8_key_names_its_operands_and_scales() -> None:
    base = key(**FP8)  # type: ignore[arg-type]
    assert "in=e4m3 scales(vec128,blk128x128)" in base
    assert base != key(trans_b=True, ldb=64)  # the same GEMM in bf16
    rows = key(**{**FP8, "scale_a": "outer_vec", "scale_b": "outer_vec"})  # type: ignore[arg-type]
    assert rows != base and "scales(outer_vec,outer_vec)" in rows


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(in_dtype="float8_e5m2"), "in_dtype"),
        (dict(scale_a="blk128x128"), "scale_a blk128x128"),  # a block mode of B only
        (dict(scale_b="none"), "scale_b none"),
        (dict(scale_a="none"), "scale_a none"),
        (dict(trans_b=False, ldb=32), "trans_b"),
        (dict(trans_a=True, lda=64), "trans_b"),
        (dict(k=72, lda=72, ldb=72), "16s"),
        (dict(lda=72), "16s"),
        (dict(batch=2, stride_a=4096, stride_b=2048, stride_d=512), "single matrix"),
        (dict(d="float32", tf32=True), "tf32"),
        (dict(in_dtype=""), "FP8 operands only"),
    ],
)
def test_fp8_key_rejects_what_fp8_gemms_cannot_take(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        key(**{**FP8, **kw})  # type: ignore[arg-type]


# -- operand layouts, alignment, tf32 flag -------------------------------------------------


def test_operand_layouts() -> None:
    assert cublaslt.lt_operand(4, 8, 8, 1) == (False, 8)  # row-major
    assert cublaslt.lt_operand(4, 8, 16, 1) == (False, 16)  # padded rows
    assert cublaslt.lt_operand(4, 8, 1, 4) == (True, 4)  # a transposed view
    assert cublaslt.lt_operand(1, 8, 0, 1) == (False, 8)  # one row: any row stride
    assert cublaslt.lt_operand(4, 1, 1, 0) == (False, 1)  # one column
    assert cublaslt.lt_operand(4, 8, 16, 2) is None  # no unit stride: NVRTC path
    assert cublaslt.lt_operand(4, 8, 0, 1) is None  # broadcast rows overlap
    assert cublaslt.lt_operand(4, 8, -8, 1) is None
    assert cublaslt._align(256, 4096 + 16) == 16
    assert cublaslt._align(256, 4096 + 8) == 8
    assert cublaslt._align(2, 4) == 2


def test_set_tf32_flag() -> None:
    assert gpk.tf32_enabled() is False
    gpk.set_tf32(True)
    try:
        assert gpk.tf32_enabled() is True
    finally:
        gpk.set_tf32(False)
    assert gpk.tf32_enabled() is False
