"""An NVRTC newer than the driver is reported by `info` and by backend selection, not met
later as a kernel that fails to load."""

from __future__ import annotations

import json

import pytest

from pygpukit import _native
from pygpukit.backends import select_backend
from pygpukit.backends.cuda import toolchain
from pygpukit.cli import main
from pygpukit.errors import GPUKitError


@pytest.mark.parametrize(
    ("nvrtc", "driver", "fatal", "says"),
    [
        ((12, 4), 12040, False, ""),
        ((12, 2), 12080, False, ""),
        ((12, 8), 12040, False, "NVRTC 12.8 is newer than the driver (CUDA 12.4); it works"),
        ((13, 0), 12090, True, "NVRTC 13.0 is newer than the driver (CUDA 12.9): the kernels"),
        ((13, 5), 13000, False, "NVRTC 13.5 is newer than the driver (CUDA 13.0)"),
        ((12, 9), 13010, False, ""),
    ],
)
def test_compare_nvrtc_driver(nvrtc: tuple[int, int], driver: int, fatal: bool,
                              says: str) -> None:  # fmt: skip
    got_fatal, message = toolchain.compare_nvrtc_driver(nvrtc, driver)
    assert got_fatal is fatal
    assert message.startswith(says) if says else message == ""
    if fatal:
        assert f'pip install "pygpukit[cuda{driver // 1000}]"' in message


@pytest.fixture
def old_driver(monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """A fake SM90 device whose driver is one CUDA major older than the NVRTC here."""
    try:
        nvrtc = toolchain.nvrtc_version()
    except GPUKitError:
        pytest.skip("no NVRTC to compare")
    if nvrtc[0] < 12:
        pytest.skip("NVRTC older than CUDA 12")
    driver = (nvrtc[0] - 1) * 1000 + 40
    monkeypatch.setattr(_native, "driver_unavailable_reason", lambda: "")
    monkeypatch.setattr(_native, "driver_version", lambda: driver)
    monkeypatch.setattr(_native, "device_count", lambda: 0)
    monkeypatch.setattr(_native, "device_info", lambda d: {"compute_capability": (9, 0)})
    monkeypatch.delenv("PYGPUKIT_BACKEND", raising=False)
    return nvrtc


def test_backend_selection_names_a_newer_nvrtc(old_driver: tuple[int, int]) -> None:
    usable, why = toolchain.cuda_usable()
    assert usable is False
    major, minor = old_driver
    assert why.startswith(f"NVRTC {major}.{minor} is newer than the driver (CUDA {major - 1}.4)")
    assert select_backend() == ("cpu", why)


def test_info_reports_a_newer_nvrtc(old_driver: tuple[int, int],
                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    assert main(["info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["driver"] == f"CUDA {old_driver[0] - 1}.4"
    assert facts["backend"] == "cpu"
    report = facts["nvrtc_vs_driver"]
    assert report["fatal"] is True and report["message"] == toolchain.cuda_usable()[1]
    assert main(["info"]) == 0
    rows = [ln.split(None, 2) for ln in capsys.readouterr().out.splitlines()]
    assert ["vs", "driver", report["message"]] in rows


def test_info_without_driver_has_no_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    if not _native.driver_unavailable_reason():
        pytest.skip("a driver is present")
    assert main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nvrtc_vs_driver"] is None
