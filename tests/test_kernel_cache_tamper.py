"""The kernel cache against tampered entries and directories, and the jit key (no GPU needed).

Entries are bound to their key, only regular files of this user and of a bounded size are
read, and a directory another user owns or anybody can write to is refused.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import warnings
from pathlib import Path

import pytest

from pygpukit import _native
from pygpukit.backends.cuda import toolchain
from pygpukit.backends.cuda.header_deps import header_dependencies, option_include_dirs
from pygpukit.errors import CompileError
from pygpukit.jit import compile_jit_source

try:
    toolchain.load_nvrtc()
    NVRTC_REASON = ""
except CompileError as e:
    NVRTC_REASON = str(e)

pytestmark = pytest.mark.skipif(bool(NVRTC_REASON), reason=f"no NVRTC: {NVRTC_REASON}")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")

ARCH = "sm_90"
OTHER_UID = 54321
HEADER_BYTES = 80


def kernel_source(k: int) -> str:
    return (
        f'extern "C" __global__ void mul{k}(float* y, int n) {{\n'
        f"  int i = threadIdx.x;\n  if (i < n) y[i] *= {k}.5f;\n}}\n"
    )


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache" / "kernels"
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(d))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.delenv("PYGPUKIT_CACHE_MAX_BYTES", raising=False)
    _native.kernel_cache_clear_memory()
    _native.kernel_cache_reset_stats()
    return d


def key_of(source: str) -> str:
    return _native.kernel_cache_key(source, ARCH, [], toolchain.include_dirs())


def entry_path(cache_dir: Path, source: str) -> Path:
    return cache_dir / f"{key_of(source)}.cubin"


def stats() -> dict[str, int]:
    return dict(_native.kernel_cache_stats())


def compile_fresh(source: str) -> bytes:
    """Compiles with the memory layer emptied, so the disk entry is consulted."""
    _native.kernel_cache_clear_memory()
    return toolchain.compile_kernel(source, ARCH)


def uncached(source: str, options: tuple[str, ...] = (), name: str = "kernel.cu") -> bytes:
    """A reference compile that bypasses both cache layers."""
    include = toolchain.include_dirs()
    return bytes(_native.compile_cubin(source, ARCH, list(options), include, name, False))


def entry_bytes(key_hex: str, payload: bytes, magic: bytes = b"PGKCUBN2") -> bytes:
    """A self-consistent entry in the current format (or the old one, without the key)."""
    length = len(payload).to_bytes(8, "little")
    digest = hashlib.sha256(payload).digest()
    if magic == b"PGKCUBN1":
        return magic + length + digest + payload
    return magic + length + bytes.fromhex(key_hex) + digest + payload


def assert_replaced_by_a_good_entry(path: Path, source: str, cubin: bytes) -> None:
    assert path.is_file() and not path.is_symlink()
    assert path.read_bytes() == entry_bytes(key_of(source), cubin)
    compile_fresh(source)
    assert stats()["disk_hits"] >= 1


def test_entry_copied_onto_another_key_is_a_miss(cache_dir: Path) -> None:
    a, b = kernel_source(1), kernel_source(2)
    cubin_a = toolchain.compile_kernel(a, ARCH)
    cubin_b = toolchain.compile_kernel(b, ARCH)
    assert cubin_a != cubin_b
    path_a = entry_path(cache_dir, a)
    path_a.write_bytes(entry_path(cache_dir, b).read_bytes())
    assert compile_fresh(a) == cubin_a
    s = stats()
    assert s["corrupt"] == 1 and s["compiles"] == 3 and s["disk_hits"] == 0
    assert_replaced_by_a_good_entry(path_a, a, cubin_a)


@pytest.mark.parametrize("forged_format", ["old format", "another key"])
def test_self_consistent_forged_entry_is_a_miss(cache_dir: Path, forged_format: str) -> None:
    a = kernel_source(3)
    cubin_a = toolchain.compile_kernel(a, ARCH)
    foreign = toolchain.compile_kernel(kernel_source(4), ARCH)
    path = entry_path(cache_dir, a)
    if forged_format == "old format":
        path.write_bytes(entry_bytes("", foreign, magic=b"PGKCUBN1"))
    else:
        path.write_bytes(entry_bytes(hashlib.sha256(b"another key").hexdigest(), foreign))
    assert compile_fresh(a) == cubin_a
    assert stats()["corrupt"] == 1
    assert_replaced_by_a_good_entry(path, a, cubin_a)


def test_symlink_entry_is_not_followed(cache_dir: Path, tmp_path: Path) -> None:
    a = kernel_source(5)
    cubin_a = toolchain.compile_kernel(a, ARCH)
    foreign = toolchain.compile_kernel(kernel_source(6), ARCH)
    path = entry_path(cache_dir, a)
    # A perfectly valid entry for key a, but reached through a link to a file elsewhere.
    target = tmp_path / "elsewhere.cubin"
    target.write_bytes(entry_bytes(key_of(a), foreign))
    pristine = target.read_bytes()
    path.unlink()
    path.symlink_to(target)
    assert [key for key, _, _ in _native.kernel_cache_list()] == [key_of(kernel_source(6))]
    assert compile_fresh(a) == cubin_a
    assert stats()["corrupt"] == 1 and stats()["disk_hits"] == 0
    assert target.read_bytes() == pristine
    assert_replaced_by_a_good_entry(path, a, cubin_a)


def test_symlink_entry_is_removed_by_clear_without_its_target(
    cache_dir: Path, tmp_path: Path
) -> None:
    toolchain.compile_kernel(kernel_source(7), ARCH)
    target = tmp_path / "precious"
    target.write_bytes(b"not a cache entry")
    (cache_dir / ("0" * 64 + ".cubin")).symlink_to(target)
    assert _native.kernel_cache_clear() == 2
    assert list(cache_dir.iterdir()) == [] and target.read_bytes() == b"not a cache entry"


def test_fifo_entry_does_not_block(cache_dir: Path) -> None:
    a = kernel_source(8)
    cubin_a = toolchain.compile_kernel(a, ARCH)
    path = entry_path(cache_dir, a)
    path.unlink()
    os.mkfifo(path)
    result: list[bytes] = []
    worker = threading.Thread(target=lambda: result.append(compile_fresh(a)), daemon=True)
    worker.start()
    worker.join(timeout=120)
    if worker.is_alive():
        # Give the blocked reader an end of file, so the thread does not outlive the test.
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as e:
            assert e.errno in (errno.ENXIO, errno.ENOENT)
        pytest.fail("reading a FIFO entry blocked")
    assert result == [cubin_a]
    assert stats()["corrupt"] == 1
    assert_replaced_by_a_good_entry(path, a, cubin_a)


def test_huge_sparse_entry_is_refused_unread(cache_dir: Path) -> None:
    a = kernel_source(9)
    cubin_a = toolchain.compile_kernel(a, ARCH)
    path = entry_path(cache_dir, a)
    good = path.read_bytes()
    with path.open("r+b") as f:
        f.truncate(1 << 40)  # 1 TiB of holes after a valid entry
        f.seek(0)
        assert f.read(len(good)) == good
    assert path.stat().st_size == 1 << 40
    assert compile_fresh(a) == cubin_a
    assert stats()["corrupt"] == 1
    assert_replaced_by_a_good_entry(path, a, cubin_a)


@needs_root
def test_entry_owned_by_another_user_is_a_miss(cache_dir: Path) -> None:
    a = kernel_source(10)
    cubin_a = toolchain.compile_kernel(a, ARCH)
    path = entry_path(cache_dir, a)
    os.chown(path, OTHER_UID, OTHER_UID)
    assert compile_fresh(a) == cubin_a
    assert stats()["corrupt"] == 1
    assert path.stat().st_uid == os.geteuid()


def fallback_dir(tmp_path: Path) -> Path:
    return tmp_path / "tmp" / f"pygpukit-kernels-{os.geteuid()}"


def check_refused(cache_dir: Path, tmp_path: Path, reason: str) -> None:
    planted = entry_path(cache_dir, kernel_source(11))
    a = kernel_source(11)
    with pytest.warns(RuntimeWarning) as warned:
        cubin = toolchain.compile_kernel(a, ARCH)
    assert cubin == uncached(a)
    messages = [str(w.message) for w in warned]
    assert len(messages) == 1
    assert str(cache_dir) in messages[0] and reason in messages[0]
    assert str(fallback_dir(tmp_path)) in messages[0]
    # The entry went to the private fallback, and nothing of the planted one was read.
    assert planted.read_bytes() == b"planted"
    fallback_entry = fallback_dir(tmp_path) / planted.name
    assert fallback_entry.read_bytes() == entry_bytes(key_of(a), cubin)
    assert (fallback_dir(tmp_path).stat().st_mode & 0o777) == 0o700
    assert _native.kernel_cache_dir() == str(fallback_dir(tmp_path))
    # Said once: later compiles and queries stay silent.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_fresh(kernel_source(12))
        assert {k for k, _, _ in _native.kernel_cache_list()} == {
            key_of(a),
            key_of(kernel_source(12)),
        }
    assert stats()["disk_hits"] == 0 and stats()["writes"] == 2


def plant(cache_dir: Path) -> None:
    cache_dir.mkdir(parents=True)
    entry_path(cache_dir, kernel_source(11)).write_bytes(b"planted")


@needs_root
def test_directory_owned_by_another_user_is_refused(cache_dir: Path, tmp_path: Path) -> None:
    plant(cache_dir)
    os.chown(cache_dir, OTHER_UID, OTHER_UID)
    os.chmod(cache_dir, 0o755)
    check_refused(cache_dir, tmp_path, f"owned by uid {OTHER_UID}")
    assert (cache_dir.stat().st_uid, cache_dir.stat().st_mode & 0o777) == (OTHER_UID, 0o755)


def test_world_writable_directory_is_refused(cache_dir: Path, tmp_path: Path) -> None:
    plant(cache_dir)
    os.chmod(cache_dir, 0o777)
    check_refused(cache_dir, tmp_path, "world-writable")
    assert cache_dir.stat().st_mode & 0o777 == 0o777  # not silently "fixed"


@pytest.mark.parametrize("planted", ["world-writable", "symlink"])
def test_refused_fallback_leaves_the_memory_cache(
    cache_dir: Path, tmp_path: Path, planted: str
) -> None:
    cache_dir.mkdir(parents=True)
    os.chmod(cache_dir, 0o777)
    fallback = fallback_dir(tmp_path)
    fallback.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if planted == "symlink":
        fallback.symlink_to(elsewhere)  # a private directory of ours, reached by a planted link
    else:
        fallback.mkdir()
        os.chmod(fallback, 0o777)
    a = kernel_source(13)
    with pytest.warns(RuntimeWarning, match="in memory only"):
        cubin = toolchain.compile_kernel(a, ARCH)
    assert cubin == uncached(a)
    assert stats()["disk_errors"] >= 1 and stats()["writes"] == 0
    assert list(cache_dir.iterdir()) == [] and list(elsewhere.iterdir()) == []
    assert elsewhere.stat().st_mode & 0o777 == 0o700
    assert toolchain.compile_kernel(a, ARCH) == cubin and stats()["memory_hits"] == 1
    # Listing and clearing leave whatever the unusable directory holds alone.
    (elsewhere / ("1" * 64 + ".cubin")).write_bytes(b"not ours to delete")
    assert _native.kernel_cache_list() == [] and _native.kernel_cache_clear() == 0
    assert [p.name for p in elsewhere.iterdir()] == ["1" * 64 + ".cubin"]


JIT_SOURCE = r"""
#include "scale.h"
extern "C" __global__ void jit_scale(float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] *= PGK_TEST_SCALE;
}
"""


def write_headers(root: Path, scale: str) -> None:
    (root / "scale.h").write_text("#pragma once\n#include <inner/value.h>\n")
    (root / "inner").mkdir(exist_ok=True)
    (root / "inner" / "value.h").write_text(f"#define PGK_TEST_SCALE {scale}f\n")


def test_option_include_dirs_reads_every_spelling() -> None:
    options = ["-I/a", "--include-path=/b", "-I", "/c", "--include-path", "/d", "-DX=1"]
    assert option_include_dirs(options) == ["/a", "/b", "/c", "/d"]


def test_jit_key_covers_included_headers(cache_dir: Path, tmp_path: Path) -> None:
    inc = tmp_path / "include"
    inc.mkdir()
    write_headers(inc, "2.0")
    options = (f"-I{inc}", "-std=c++17")
    deps = header_dependencies(JIT_SOURCE, options, "jit_scale.cu")
    assert [d.split(" ")[0] for d in deps] == [str(inc / "scale.h"), str(inc / "inner/value.h")]
    assert deps[1].split(" ")[1] == hashlib.sha256(b"#define PGK_TEST_SCALE 2.0f\n").hexdigest()
    first = compile_jit_source(JIT_SOURCE, "jit_scale", options, ARCH)
    assert stats()["compiles"] == 1

    # Only the nested header changes: the source text and the options stay the same.
    write_headers(inc, "3.0")
    changed = header_dependencies(JIT_SOURCE, options, "jit_scale.cu")
    assert changed[0] == deps[0] and changed[1] != deps[1]

    def key(d: list[str]) -> str:
        return _native.kernel_cache_key(
            JIT_SOURCE, ARCH, list(options), toolchain.include_dirs(), "jit_scale.cu", d
        )

    assert key(changed) != key(deps)
    second = compile_jit_source(JIT_SOURCE, "jit_scale", options, ARCH)
    assert stats()["compiles"] == 2 and second != first
    assert second == uncached(JIT_SOURCE, options, "jit_scale.cu")

    write_headers(inc, "2.0")
    assert compile_jit_source(JIT_SOURCE, "jit_scale", options, ARCH) == first
    assert stats()["memory_hits"] == 1
    assert first == uncached(JIT_SOURCE, options, "jit_scale.cu")


def test_header_dependencies_skip_headers_outside_the_named_dirs(tmp_path: Path) -> None:
    source = '#include <cuda_fp16.h>\n#include "missing.h"\n'
    assert header_dependencies(source, [f"-I{tmp_path}"], "k.cu") == []
