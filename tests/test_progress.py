"""pygpukit.progress: a line on a terminal only once work takes more than a moment, a
record on the `pygpukit` logger always; NVRTC compiles go through it."""

from __future__ import annotations

import io
import logging
import sys
import time

import pytest

from pygpukit import progress


class Terminal(io.StringIO):
    """A stderr that says it is a TTY."""

    def isatty(self) -> bool:
        return True


def use_terminal(monkeypatch: pytest.MonkeyPatch) -> Terminal:
    """sys.stderr becomes a Terminal (in the test body: pytest's capture resets sys.stderr
    between a fixture's setup and the test)."""
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    return term


def test_bar_on_a_terminal_after_the_delay(monkeypatch, caplog):
    tty = use_terminal(monkeypatch)
    monkeypatch.setattr(progress, "DELAY", 3600.0)
    caplog.set_level(logging.INFO, logger="pygpukit")
    quick = progress.ProgressBar(4_000_000)
    quick.update(4_000_000)
    quick.finish()
    assert tty.getvalue() == ""  # quick work draws nothing
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == ["loading: 4.0 MB"]

    monkeypatch.setattr(progress, "DELAY", 0.0)
    bar = progress.ProgressBar(4_000_000, label="reading")
    bar.update(1_000_000)
    bar.update(3_000_000)
    bar.finish()
    frames = tty.getvalue().split("\r")[1:]
    assert len(frames) == 2 and frames[-1].endswith("\n")
    assert frames[0].startswith("reading [" + "#" * 7 + " " * 23 + "]      1.0/4.0 MB")
    assert frames[1].startswith("reading [" + "#" * 30 + "]      4.0/4.0 MB")


def test_bar_off_a_terminal_only_logs(monkeypatch, caplog):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setattr(progress, "DELAY", 0.0)
    caplog.set_level(logging.INFO, logger="pygpukit")
    bar = progress.ProgressBar(2_000_000)
    bar.update(2_000_000)
    bar.finish()
    assert sys.stderr.getvalue() == ""
    assert caplog.records[-1].getMessage().startswith("loading: 2.0 MB in ")
    forced = progress.ProgressBar(2_000_000, show=True)  # llm.load(progress=True)
    forced.update(2_000_000)
    forced.finish()
    assert sys.stderr.getvalue().startswith("\rloading [")


def test_quiet_logger_hides_the_terminal_line(monkeypatch):
    tty = use_terminal(monkeypatch)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    logger = logging.getLogger("pygpukit")
    old = logger.level
    logger.setLevel(logging.ERROR)  # pygpukit -q
    try:
        assert not progress.on_terminal()
        bar = progress.ProgressBar(10)
        bar.update(10)
        bar.finish()
        with progress.slow_step("waiting"):
            time.sleep(0.05)
    finally:
        logger.setLevel(old)
    assert tty.getvalue() == ""
    assert progress.on_terminal()


def test_slow_step_draws_then_erases(monkeypatch, caplog):
    tty = use_terminal(monkeypatch)
    monkeypatch.setattr(progress, "DELAY", 0.01)
    caplog.set_level(logging.DEBUG, logger="pygpukit")
    with progress.slow_step("compiling k.cu for sm_90"):
        deadline = time.monotonic() + 30
        while "compiling" not in tty.getvalue():  # the timer thread draws it
            assert time.monotonic() < deadline
            time.sleep(0.01)
    text = "compiling k.cu for sm_90 ..."
    assert tty.getvalue() == "\r" + text + "\r" + " " * len(text) + "\r"
    (record,) = caplog.records
    assert record.getMessage().startswith("compiling k.cu for sm_90: ")
    assert record.levelno == logging.INFO  # it took longer than DELAY


def test_quick_step_is_silent(monkeypatch, caplog):
    tty = use_terminal(monkeypatch)
    monkeypatch.setattr(progress, "DELAY", 3600.0)
    caplog.set_level(logging.DEBUG, logger="pygpukit")
    with progress.slow_step("compiling k.cu for sm_90"):
        pass
    assert tty.getvalue() == ""
    (record,) = caplog.records
    assert record.levelno == logging.DEBUG


def test_step_logs_even_when_it_raises(caplog):
    caplog.set_level(logging.DEBUG, logger="pygpukit")
    with pytest.raises(ZeroDivisionError), progress.slow_step("dividing"):
        _ = 1 / 0
    assert caplog.records[-1].getMessage().startswith("dividing: ")


def test_nvrtc_compile_goes_through_slow_step(tmp_path, monkeypatch, caplog):
    from pygpukit import _native
    from pygpukit.backends.cuda import toolchain
    from pygpukit.errors import CompileError

    try:
        toolchain.load_nvrtc()
    except CompileError as e:
        pytest.skip(f"no NVRTC: {e}")
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path))
    _native.kernel_cache_clear_memory()
    caplog.set_level(logging.DEBUG, logger="pygpukit")
    src = 'extern "C" __global__ void probe(float* y) { y[threadIdx.x] *= 3.0f; }\n'
    cubin = toolchain.compile_kernel(src, "sm_80", (), "probe.cu")
    assert cubin[:4] == b"\x7fELF"
    msgs = [r.getMessage() for r in caplog.records if r.name == "pygpukit.progress"]
    assert len(msgs) == 1 and msgs[0].startswith("compiling probe.cu for sm_80: ")
