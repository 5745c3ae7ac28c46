"""NVRTC compilation to CUBIN and the on-disk kernel cache (no GPU needed)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from pygpukit import _native
from pygpukit.backends import select_backend
from pygpukit.backends.cuda import toolchain
from pygpukit.cli import main as cli_main
from pygpukit.errors import CompileError, CUDAError, GPUKitError

try:
    toolchain.load_nvrtc()
    NVRTC_REASON = ""
except CompileError as e:
    NVRTC_REASON = str(e)

needs_nvrtc = pytest.mark.skipif(bool(NVRTC_REASON), reason=f"no NVRTC: {NVRTC_REASON}")

EM_CUDA = 190

HALF_SOURCE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" __global__ void scale_bf16(__nv_bfloat16* y, const __half* x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16(__half2float(x[i]) * s);
}
"""


def kernel_source(k: int) -> str:
    return (
        f'extern "C" __global__ void add{k}(float* y, int n) {{\n'
        f"  int i = threadIdx.x;\n  if (i < n) y[i] += {k}.0f;\n}}\n"
    )


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "xdg" / "kernels"
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(d))
    monkeypatch.delenv("PYGPUKIT_CACHE_MAX_BYTES", raising=False)
    _native.kernel_cache_clear_memory()
    _native.kernel_cache_reset_stats()
    return d


def entry_path(cache_dir: Path, source: str, arch: str = "sm_90") -> Path:
    key = _native.kernel_cache_key(source, arch, [], toolchain.include_dirs())
    return cache_dir / f"{key}.cubin"


def stats() -> dict[str, int]:
    return dict(_native.kernel_cache_stats())


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_half_kernel_compiles_to_elf_cubin(cache_dir: Path, arch: str) -> None:
    cubin = toolchain.compile_kernel(HALF_SOURCE, arch)
    assert cubin[:4] == b"\x7fELF"
    assert int.from_bytes(cubin[18:20], "little") == EM_CUDA
    assert b"scale_bf16" in cubin


@needs_nvrtc
def test_syntax_error_quotes_offending_line(cache_dir: Path) -> None:
    source = 'extern "C" __global__ void broken(float* y) {\n  y[0] = 1.0f\n  int k = ;\n}\n'
    with pytest.raises(CompileError) as info:
        toolchain.compile_kernel(source, "sm_90")
    message = str(info.value)
    assert isinstance(info.value, GPUKitError) and isinstance(info.value, RuntimeError)
    assert "kernel.cu(" in message and "error" in message
    assert "offending source lines" in message
    assert "     3 |   int k = ;" in message
    assert stats()["writes"] == 0 and not list(cache_dir.glob("*.cubin"))


@needs_nvrtc
def test_only_real_architectures(cache_dir: Path) -> None:
    with pytest.raises(CompileError, match="sm_90"):
        toolchain.compile_kernel(kernel_source(1), "compute_90")


@needs_nvrtc
def test_second_compile_hits_memory_then_disk(cache_dir: Path) -> None:
    first = toolchain.compile_kernel(kernel_source(1), "sm_90")
    assert stats()["compiles"] == 1 and stats()["writes"] == 1
    assert toolchain.compile_kernel(kernel_source(1), "sm_90") == first
    assert stats()["memory_hits"] == 1
    _native.kernel_cache_clear_memory()
    assert toolchain.compile_kernel(kernel_source(1), "sm_90") == first
    s = stats()
    assert s["disk_hits"] == 1 and s["compiles"] == 1 and s["corrupt"] == 0


@needs_nvrtc
def test_key_covers_source_options_and_arch() -> None:
    include = toolchain.include_dirs()
    base = _native.kernel_cache_key(kernel_source(1), "sm_90", [], include)
    assert base == _native.kernel_cache_key(kernel_source(1), "sm_90", [], include)
    assert len(base) == 64 and int(base, 16) >= 0
    others = {
        _native.kernel_cache_key(kernel_source(2), "sm_90", [], include),
        _native.kernel_cache_key(kernel_source(1), "sm_80", [], include),
        _native.kernel_cache_key(kernel_source(1), "sm_90", ["-DX=1"], include),
        _native.kernel_cache_key(kernel_source(1), "sm_90", [], []),
    }
    assert base not in others and len(others) == 4


@needs_nvrtc
def test_entry_header_holds_length_key_and_sha256(cache_dir: Path) -> None:
    cubin = toolchain.compile_kernel(HALF_SOURCE, "sm_90")
    path = entry_path(cache_dir, HALF_SOURCE)
    data = path.read_bytes()
    assert data[:8] == b"PGKCUBN2"
    assert int.from_bytes(data[8:16], "little") == len(cubin) == len(data) - 80
    assert data[16:48] == bytes.fromhex(path.name.removesuffix(".cubin"))
    # Checks the C++ SHA-256 against hashlib on a many-block input.
    assert data[48:80] == hashlib.sha256(cubin).digest()
    assert data[80:] == cubin


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flip_payload(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0x01])


def _flip_header(data: bytes) -> bytes:
    return data[:9] + bytes([data[9] ^ 0x40]) + data[10:]


@needs_nvrtc
@pytest.mark.parametrize("damage", [_truncate, _flip_payload, _flip_header, lambda d: b""])
def test_corrupt_entry_is_recompiled_and_rewritten(cache_dir: Path, damage) -> None:
    source = kernel_source(3)
    good = toolchain.compile_kernel(source, "sm_90")
    path = entry_path(cache_dir, source)
    pristine = path.read_bytes()
    path.write_bytes(damage(pristine))
    _native.kernel_cache_clear_memory()
    assert toolchain.compile_kernel(source, "sm_90") == good
    s = stats()
    assert s["corrupt"] == 1 and s["compiles"] == 2 and s["writes"] == 2
    assert path.read_bytes() == pristine
    _native.kernel_cache_clear_memory()
    toolchain.compile_kernel(source, "sm_90")
    assert stats()["disk_hits"] == 1


@needs_nvrtc
def test_cache_directory_is_private(cache_dir: Path) -> None:
    toolchain.compile_kernel(kernel_source(1), "sm_90")
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(cache_dir.parent.stat().st_mode) == 0o700
    entry = next(cache_dir.glob("*.cubin"))
    assert stat.S_IMODE(entry.stat().st_mode) & 0o077 == 0


@needs_nvrtc
def test_existing_directory_is_made_private(cache_dir: Path) -> None:
    cache_dir.mkdir(parents=True, mode=0o755)
    os.chmod(cache_dir, 0o755)
    toolchain.compile_kernel(kernel_source(1), "sm_90")
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700


@needs_nvrtc
def test_xdg_cache_home_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYGPUKIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    toolchain.configure_kernel_cache()
    assert _native.kernel_cache_dir() == str(tmp_path / "pygpukit" / "kernels")


@needs_nvrtc
def test_lru_pruning_keeps_the_size_bound(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sources = [kernel_source(k) for k in range(4)]
    for k, source in enumerate(sources[:3]):
        toolchain.compile_kernel(source, "sm_90")
        # Explicit, well separated times: file timestamps are only jiffy-accurate.
        os.utime(entry_path(cache_dir, source), (1000.0 * (k + 1), 1000.0 * (k + 1)))
    sizes = [entry_path(cache_dir, s).stat().st_size for s in sources[:3]]
    limit = sum(sizes) + max(sizes) // 2
    monkeypatch.setenv("PYGPUKIT_CACHE_MAX_BYTES", str(limit))
    toolchain.configure_kernel_cache()
    assert _native.kernel_cache_max_bytes() == limit

    _native.kernel_cache_clear_memory()
    toolchain.compile_kernel(sources[0], "sm_90")  # a disk hit makes entry 0 the newest
    assert stats()["disk_hits"] == 1
    toolchain.compile_kernel(sources[3], "sm_90")

    kept = {p.name for p in cache_dir.glob("*.cubin")}
    expected = {entry_path(cache_dir, sources[k]).name for k in (0, 2, 3)}
    assert kept == expected
    assert sum(size for _, size, _ in _native.kernel_cache_list()) <= limit
    assert stats()["pruned"] == 1


@needs_nvrtc
def test_unwritable_cache_dir_still_compiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(blocker / "kernels"))
    _native.kernel_cache_clear_memory()
    _native.kernel_cache_reset_stats()
    assert toolchain.compile_kernel(kernel_source(5), "sm_90")[:4] == b"\x7fELF"
    assert stats()["disk_errors"] >= 1


@needs_nvrtc
def test_cache_ls_and_clear_cli(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toolchain.compile_kernel(kernel_source(1), "sm_90")
    toolchain.compile_kernel(kernel_source(2), "sm_90")
    (cache_dir / ".tmp-stale-1-0").write_bytes(b"partial")
    listed = _native.kernel_cache_list()
    assert len(listed) == 2
    for key, size, mtime in listed:
        assert (cache_dir / f"{key}.cubin").stat().st_size == size
        assert isinstance(mtime, float) and mtime > 0

    assert cli_main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert str(cache_dir) in out and "2 entries" in out
    assert all(key in out for key, _, _ in listed)

    assert cli_main(["cache", "clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert list(cache_dir.iterdir()) == []
    assert _native.kernel_cache_list() == []
    toolchain.compile_kernel(kernel_source(1), "sm_90")
    assert stats()["compiles"] == 3  # the memory layer was cleared too


def test_nvrtc_candidates_prefer_wheels_then_cuda_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "lib64"
    lib.mkdir()
    (lib / "libnvrtc.so.12").write_bytes(b"")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    candidates = toolchain.nvrtc_candidates()
    wheels = [c for c in candidates if "/nvidia/" in c]
    home = candidates.index(str(lib / "libnvrtc.so.12"))
    assert all(candidates.index(w) < home for w in wheels)
    assert candidates[-3:] == ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]


def test_select_backend_honours_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYGPUKIT_BACKEND", "cpu")
    assert select_backend() == ("cpu", "")
    monkeypatch.setenv("PYGPUKIT_BACKEND", "cuda")
    usable, why = toolchain.cuda_usable()
    assert select_backend() == ("cuda", why)
    monkeypatch.setenv("PYGPUKIT_BACKEND", "tpu")
    with pytest.raises(ValueError, match="tpu"):
        select_backend()
    monkeypatch.delenv("PYGPUKIT_BACKEND")
    assert select_backend() == ("cuda" if usable else "cpu", why)


def test_info_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PYGPUKIT_BACKEND", "cpu")
    assert cli_main(["info"]) == 0
    out = capsys.readouterr().out
    assert "NVRTC" in out and "cuBLASLt" in out
    assert out.splitlines()[-1].split() == ["backend", "cpu"]


def test_without_driver_calls_raise_cuda_error() -> None:
    if _native.driver_available():
        pytest.skip("a driver is present")
    assert _native.driver_unavailable_reason()
    with pytest.raises(CUDAError) as info:
        _native.mem_alloc(1024)
    assert getattr(info.value, "code", 0) != 0 and getattr(info.value, "call", "")
    with pytest.raises(CUDAError):
        _native.Stream()
    assert toolchain.cuda_usable()[0] is False
