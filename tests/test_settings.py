"""pygpukit.settings: each setting's environment variable and Python setter take effect
where the setting is used, and a value it cannot take is a clear SettingError."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import _native, runtime, settings
from pygpukit.backends.cuda import toolchain
from pygpukit.backends.cuda.kernels import loader
from pygpukit.errors import GPUKitError, SettingError

ROOT = Path(__file__).resolve().parents[1]
VARS = [settings.BACKEND, settings.EAGER, settings.DEBUG, settings.SKIP_PASSES, settings.PDL,
        settings.CACHE_DIR, settings.CACHE_MAX_BYTES, settings.CUBLASLT, settings.FP8_GEMM,
        settings.POISON,
        settings.KERNEL_DIR, settings.GIT_COMMIT, settings.COMPILE_CACHE_SIZE,
        settings.VALIDATE_PASSES]  # fmt: skip


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No setting from the environment or an earlier test; the set_* overrides undone."""
    for var in VARS:
        if var != settings.BACKEND:  # the backend of this process is chosen already
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(settings, "_overrides", {})
    settings.reload()
    yield
    monkeypatch.undo()  # (tests/conftest.py reads the kept settings again after each test)
    toolchain.configure_kernel_cache()  # hand the native cache the restored settings


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def _expect_setting_error(fn: Callable[[], object], match: str) -> None:
    with pytest.raises(SettingError, match=match) as info:
        fn()
    assert isinstance(info.value, GPUKitError) and isinstance(info.value, ValueError)


FLAGS = [
    (settings.EAGER, settings.eager, settings.set_eager, False),
    (settings.DEBUG, settings.debug, settings.set_debug, False),
    (settings.PDL, settings.pdl, settings.set_pdl, True),
    (settings.CUBLASLT, settings.cublaslt, None, True),
    (settings.FP8_GEMM, settings.fp8_gemm, None, True),
    (settings.POISON, settings.poison, None, False),
]


@pytest.mark.parametrize(("var", "get", "set_", "default"), FLAGS)
def test_flag_from_environment_and_setter(
    monkeypatch: pytest.MonkeyPatch, var: str, get: Callable[[], bool],
    set_: Callable[[bool | None], None] | None, default: bool,
) -> None:  # fmt: skip
    assert get() is default
    for raw, want in [("1", True), ("0", False), ("true", True), (" Off ", False), ("", default)]:
        monkeypatch.setenv(var, raw)
        settings.reload()  # PYGPUKIT_EAGER is kept from its first read
        assert get() is want, raw
    monkeypatch.setenv(var, "maybe")
    settings.reload()
    _expect_setting_error(get, f"{var}='maybe': expected 1 or 0")
    if set_ is None:
        return
    set_(not default)  # the setter wins over the environment, even a malformed one
    assert get() is (not default)
    monkeypatch.setenv(var, "1" if default else "0")
    settings.reload()
    set_(None)  # back to the environment
    assert get() is default
    _expect_setting_error(lambda: set_("yes"), "expected True, False or None")  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["env", "setter"])
def test_eager_runs_each_op_at_once(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, how: str
) -> None:
    a = rng.standard_normal((3, 5)).astype(np.float32)
    x = gpk.asarray(a)
    assert (x * 2.0)._node.realized is None  # lazy by default
    if how == "env":
        monkeypatch.setenv(settings.EAGER, "1")
        settings.reload()  # read at the first op: this process changed it since
    else:
        gpk.set_eager(True)
    y = gpk.exp(x * 2.0)
    assert y._node.realized is not None  # ran when recorded
    np.testing.assert_allclose(y.to_numpy(), np.exp(a.astype(np.float64) * 2.0), rtol=1e-5)
    with gpk.eager(False):  # a block still decides inside it
        assert (x + 1.0)._node.realized is None


@pytest.mark.parametrize("how", ["env", "setter"])
def test_debug_prints_each_realize(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    rng: np.random.Generator, how: str,
) -> None:  # fmt: skip
    a = rng.standard_normal((4, 6)).astype(np.float32)
    x = gpk.asarray(a)
    (x + 3.0).to_numpy()
    assert "realize:" not in caplog.text  # the table goes to the pygpukit logger
    if how == "env":
        monkeypatch.setenv(settings.DEBUG, "1")
        settings.reload()  # kept from its first read
    else:
        gpk.set_debug(True)
    out = (gpk.tanh(x) * 3.0).to_numpy()
    np.testing.assert_allclose(out, np.tanh(a.astype(np.float64)) * 3.0, rtol=1e-5, atol=1e-6)
    assert "realize: 1 steps" in caplog.text and "fused_elementwise" in caplog.text


def _last_schedule_ops() -> list[str]:
    return [s.op for s in list(runtime._SCHEDULE_CACHE.values())[-1].steps]


@pytest.mark.parametrize("how", ["env", "setter"])
def test_skip_passes_leaves_a_pass_out(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, how: str
) -> None:
    a = rng.standard_normal((5, 7)).astype(np.float32)
    ref = np.exp(a.astype(np.float64) * 2.0 + 1.0)

    def run() -> np.ndarray:
        return gpk.exp(gpk.asarray(a) * 2.0 + 1.0).to_numpy()

    # The last schedule built is this run's only if no earlier test built its structure
    # (a realize that finds it by its recorded summary builds nothing).
    runtime._SCHEDULE_CACHE.clear()
    np.testing.assert_allclose(run(), ref, rtol=1e-5)
    assert _last_schedule_ops() == ["fused_elementwise"]
    # The same structure again, now without the fusion: the cached schedule must not serve.
    if how == "env":
        monkeypatch.setenv(settings.SKIP_PASSES, " fuse_elementwise , ")
        settings.reload()  # kept from its first read
    else:
        gpk.set_skip_passes(["fuse_elementwise"])
    assert settings.skip_passes() == {"fuse_elementwise"}
    np.testing.assert_allclose(run(), ref, rtol=1e-5)
    assert [op for op in _last_schedule_ops() if op != "full"] == ["mul", "add", "exp"]


def test_validate_passes_follows_debug_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.ir import Graph, GraphError, Node
    from pygpukit.ir import dtypes as dt
    from pygpukit.passes.pipeline import run_pipeline

    x = Node("input", (), {"shape": (3,), "dtype": "float32", "idx": 0}, (3,), dt.float32, None)
    y = Node("exp", (x,), {}, (3,), dt.float32, None)
    graph = Graph([x], [y])

    def bad_pass(g: Graph) -> Graph:  # gives its node a shape the op rule disagrees with
        z = Node("exp", (x,), {}, (4,), dt.float32, None)
        return Graph([x], [z])

    assert not settings.validate_passes()  # neither set nor debugging: not validated
    assert run_pipeline(graph, [bad_pass]).outputs[0].shape == (4,)
    gpk.set_debug(True)
    assert settings.validate_passes()
    with pytest.raises(GraphError, match="op rule gives"):
        run_pipeline(graph, [bad_pass])
    gpk.set_debug(None)
    monkeypatch.setenv(settings.VALIDATE_PASSES, "yes")
    settings.reload()
    assert settings.validate_passes()
    with pytest.raises(GraphError, match="op rule gives"):
        run_pipeline(graph, [bad_pass])
    monkeypatch.setenv(settings.VALIDATE_PASSES, "maybe")
    settings.reload()
    with pytest.raises(SettingError, match="PYGPUKIT_VALIDATE_PASSES"):
        settings.validate_passes()


def test_skip_passes_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.passes.pipeline import default_passes

    monkeypatch.setenv(settings.SKIP_PASSES, "fuse_elementwise,no_such_pass")

    settings.reload()  # kept from its first read
    _expect_setting_error(default_passes, r"PYGPUKIT_SKIP_PASSES names no pass \['no_such_pass'\]")
    gpk.set_skip_passes(["nope"])
    _expect_setting_error(default_passes, r"gpk.set_skip_passes names no pass \['nope'\]")
    gpk.set_skip_passes([])  # an empty list runs every pass, whatever the environment says
    assert len(default_passes()) == len(__import__("pygpukit.passes").passes.PIPELINE)
    _expect_setting_error(lambda: gpk.set_skip_passes("fuse_gelu"), "a list of pass names")
    _expect_setting_error(lambda: gpk.set_skip_passes([""]), "expected pass names")


def test_pdl_follows_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch flag every kernel gets (loader.pdl_enabled), on a stand-in SM 9.0 device."""
    monkeypatch.setattr(toolchain, "device_info", lambda: {"compute_capability": (9, 0)})
    loader._pdl.cache_clear()
    try:
        assert loader.pdl_enabled()
        monkeypatch.setenv(settings.PDL, "0")
        assert not loader.pdl_enabled()
        gpk.set_pdl(True)
        assert loader.pdl_enabled()
        gpk.set_pdl(False)
        assert not loader.pdl_enabled()
        monkeypatch.setattr(toolchain, "device_info", lambda: {"compute_capability": (8, 0)})
        loader._pdl.cache_clear()
        gpk.set_pdl(True)
        assert not loader.pdl_enabled()  # SM 8.x has no programmatic dependent launch
    finally:
        loader._pdl.cache_clear()


def test_cublaslt_off_gives_no_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    assert toolchain.cublaslt_candidates()  # the sonames at least
    monkeypatch.setenv(settings.CUBLASLT, "0")
    assert toolchain.cublaslt_candidates() == []
    monkeypatch.setenv(settings.CUBLASLT, "2")
    _expect_setting_error(toolchain.cublaslt_candidates, "PYGPUKIT_CUBLASLT='2'")


def test_kernel_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    default = loader.kernel_dir()
    assert (default / "common.cuh").is_file() and default != tmp_path
    (tmp_path / "common.cuh").write_text("// stand-in\n", encoding="ascii")
    monkeypatch.setenv(settings.KERNEL_DIR, str(tmp_path))
    assert loader.kernel_dir() == tmp_path


def test_git_commit_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.bench.timing import git_commit

    monkeypatch.setenv(settings.GIT_COMMIT, "0123abcd")
    assert git_commit() == "0123abcd"


@pytest.mark.parametrize("how", ["env", "setter"])
def test_cache_settings_reach_the_native_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str
) -> None:
    d = tmp_path / "kernels"
    if how == "env":
        monkeypatch.setenv(settings.CACHE_DIR, str(d))
        monkeypatch.setenv(settings.CACHE_MAX_BYTES, "12345")
    else:
        monkeypatch.setenv(settings.CACHE_DIR, str(tmp_path / "not_this"))
        gpk.set_cache_dir(d)
        gpk.set_cache_max_bytes(12345)
    toolchain.configure_kernel_cache()
    assert _native.kernel_cache_dir() == str(d)
    assert _native.kernel_cache_max_bytes() == 12345
    gpk.set_cache_dir(None)
    gpk.set_cache_max_bytes(None)
    monkeypatch.delenv(settings.CACHE_DIR, raising=False)
    monkeypatch.delenv(settings.CACHE_MAX_BYTES, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    toolchain.configure_kernel_cache()
    assert _native.kernel_cache_dir() == str(tmp_path / "xdg" / "pygpukit" / "kernels")
    assert _native.kernel_cache_max_bytes() == settings.DEFAULT_CACHE_MAX_BYTES == 256 << 20


def test_compiled_kernels_land_in_the_set_cache_dir(tmp_path: Path) -> None:
    try:
        toolchain.load_nvrtc()
    except GPUKitError as e:
        pytest.skip(f"no NVRTC: {e}")
    gpk.set_cache_dir(tmp_path / "kc")
    src = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] += 4.0f; }\n'
    _native.kernel_cache_clear_memory()
    assert toolchain.compile_kernel(src, "sm_80")[:4] == b"\x7fELF"
    assert len(list((tmp_path / "kc").glob("*.cubin"))) == 1


def test_cache_cli_follows_the_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pygpukit.cli import main as cli_main

    toolchain.configure_kernel_cache()  # the native cache holds the default now
    monkeypatch.setenv(settings.CACHE_DIR, str(tmp_path / "a"))
    monkeypatch.setenv(settings.CACHE_MAX_BYTES, "4096")
    assert cli_main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert f"cache dir: {tmp_path / 'a'}" in out and "(limit 4096)" in out
    gpk.set_cache_dir(tmp_path / "b")
    assert cli_main(["cache", "clear"]) == 0
    assert f"removed 0 entries from {tmp_path / 'b'}" in capsys.readouterr().out


def test_cache_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw in ("-1", "1e6", "lots"):
        monkeypatch.setenv(settings.CACHE_MAX_BYTES, raw)
        _expect_setting_error(settings.cache_max_bytes, f"PYGPUKIT_CACHE_MAX_BYTES='{raw}'")
        _expect_setting_error(toolchain.configure_kernel_cache, "PYGPUKIT_CACHE_MAX_BYTES")
    for n in (-1, 2.5, True, "10"):
        _expect_setting_error(lambda n=n: gpk.set_cache_max_bytes(n), "bytes >= 0")  # type: ignore[misc]
    _expect_setting_error(lambda: gpk.set_cache_dir(""), "a directory path")


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in VARS}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=full, timeout=120)  # fmt: skip


def test_backend_from_environment() -> None:
    out = _python("import pygpukit as gpk; print(gpk.backend_name())", PYGPUKIT_BACKEND=" CPU")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu"] and "no usable CUDA GPU" not in out.stderr
    out = _python("import pygpukit as gpk; gpk.zeros(3).to_numpy()", PYGPUKIT_BACKEND="tpu")
    assert out.returncode != 0
    assert "SettingError: PYGPUKIT_BACKEND='tpu': expected 'cpu' or 'cuda'" in out.stderr


def test_set_backend() -> None:
    code = """
import numpy as np
import pygpukit as gpk
from pygpukit import settings
for bad in ("tpu", 3):
    try:
        gpk.set_backend(bad)
    except gpk.SettingError as e:
        print("bad:", e)
settings.prefer_backend("cpu")  # PYGPUKIT_BACKEND=cuda was asked for: it stays
print("kept:", settings.backend())
gpk.set_backend("cpu")
a = np.arange(6, dtype=np.float32).reshape(2, 3)
print("ran:", gpk.backend_name(), float((gpk.asarray(a) * 2.0).sum().to_numpy()))
gpk.set_backend("cpu")  # the running one: nothing to change
try:
    gpk.set_backend("cuda")
except gpk.SettingError as e:
    print("late:", e)
"""
    out = _python(code, PYGPUKIT_BACKEND="cuda")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "bad: set_backend: expected 'cpu' or 'cuda', got 'tpu'"
    assert lines[1] == "bad: set_backend: expected 'cpu' or 'cuda', got 3"
    assert lines[2] == "kept: cuda"
    assert lines[3] == f"ran: cpu {float(np.arange(6).sum() * 2.0)}"
    assert lines[4].startswith("late: set_backend('cuda'): the cpu backend is already in use")
    assert "no usable CUDA GPU" not in out.stderr  # the setter chose: no auto fallback


def test_set_backend_cuda_without_a_gpu_is_a_clear_error() -> None:
    if toolchain.cuda_usable()[0]:
        pytest.skip("a usable GPU is present")
    out = _python("import pygpukit as gpk; gpk.set_backend('cuda'); gpk.zeros(2).to_numpy()")
    assert out.returncode != 0
    assert "CUDAError: the cuda backend was asked for" in out.stderr
    assert "but CUDA is not usable" in out.stderr


def test_prefer_backend_when_nothing_was_asked_for() -> None:
    code = (
        "from pygpukit import settings; settings.prefer_backend('cpu'); print(settings.backend())"
    )
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu"]


def test_eager_blocks_nest_reenter_and_decorate(rng: np.random.Generator) -> None:
    """gpk.eager() blocks nest (the innermost wins, the outer comes back on exit), one
    block object entered again inside itself restores each level, and as a decorator each
    call (recursive ones too) runs in its own block."""
    a = rng.standard_normal(8).astype(np.float32)
    x = gpk.asarray(a)
    outer = gpk.is_eager()
    block = gpk.eager(True)
    with block:
        assert (x + 1.0)._node.realized is not None
        with gpk.eager(False):
            assert (x + 1.0)._node.realized is None
            with block:
                assert gpk.is_eager()
            assert not gpk.is_eager()
        assert gpk.is_eager()
    assert gpk.is_eager() == outer

    @gpk.eager(True)
    def depth(n: int) -> list[bool]:
        inner = depth(n - 1) if n else []
        with gpk.eager(False):
            pass
        return [gpk.is_eager(), *inner]

    with gpk.eager(False):
        assert depth(3) == [True] * 4
        assert not gpk.is_eager()
    np.testing.assert_allclose((x * 2.0).to_numpy(), a.astype(np.float64) * 2.0, rtol=1e-6)
