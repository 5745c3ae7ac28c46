"""gpk.eager() blocks (pygpukit/mode.py over rust/pygpukit-py/src/block.rs): entry and exit
are native calls that set and reset the contextvar the array operators read, so a block
decides for its own thread and asyncio task only, restores what was there on exit (an
exception too), and a bad choice is a SettingError. Nesting, re-entering one object and
the decorator form are in tests/test_settings.py."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit import _rust, mode, settings
from pygpukit.errors import SettingError


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(818)


@pytest.fixture(autouse=True)
def lazy_by_default(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process setting is lazy, so only a block makes ops eager."""
    monkeypatch.setattr(settings, "_overrides", {})
    gpk.set_eager(False)
    yield
    monkeypatch.undo()
    settings.reload()


def _ran(x: gpk.GPUArray) -> bool:
    """Whether `x + 1.0` ran when recorded (eager) here."""
    return (x + 1.0)._node.realized is not None


def test_the_block_sets_the_variable_the_operators_read(rng: np.random.Generator) -> None:
    a = rng.standard_normal(16).astype(np.float32)
    x = gpk.asarray(a)
    assert mode._eager is _rust.EAGER_MODE
    assert mode._eager.get() is None and not _ran(x)
    with gpk.eager() as entered:
        assert entered is None
        assert mode._eager.get() is True and gpk.is_eager() and _ran(x)
        y = x * 3.0 - 0.5
        assert y._node.realized is not None
    assert mode._eager.get() is None and not _ran(x)
    np.testing.assert_allclose(y.to_numpy(), a.astype(np.float64) * 3.0 - 0.5, rtol=1e-6)


def test_the_choice_is_true_false_or_none() -> None:
    assert gpk.eager().enabled is True
    assert gpk.eager(False).enabled is False
    assert gpk.eager(enabled=True).enabled is True
    with gpk.eager(True):
        with gpk.eager(None):  # the process setting decides inside it
            assert not gpk.is_eager()
            gpk.set_eager(True)
            assert gpk.is_eager()
        assert gpk.is_eager()
    for bad in (1, "yes", np.float32(1.0)):
        with pytest.raises(SettingError, match=r"gpk.eager: expected True, False or None, got"):
            gpk.eager(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # SettingError is a ValueError
        gpk.eager(0)  # type: ignore[arg-type]


def test_an_exception_leaves_the_block_restored(rng: np.random.Generator) -> None:
    x = gpk.asarray(rng.standard_normal(8).astype(np.float32))
    block = gpk.eager(True)
    with pytest.raises(KeyError), block:
        with gpk.eager(False):
            raise KeyError("inner")
    assert mode._eager.get() is None and not _ran(x)
    with block:  # the object is usable again
        assert _ran(x)
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        block.__exit__(None, None, None)


def test_blocks_are_per_thread(rng: np.random.Generator) -> None:
    """A block in one thread does not change another thread's choice, while both are
    inside their blocks at the same time."""
    a = rng.standard_normal(32).astype(np.float32)
    x = gpk.asarray(a)
    inside = threading.Barrier(2)
    seen: dict[str, tuple[bool, bool]] = {}

    def worker(name: str, enabled: bool) -> None:
        with gpk.eager(enabled):
            inside.wait()
            seen[name] = (gpk.is_eager(), _ran(x))
            inside.wait()
        seen[name + " after"] = (gpk.is_eager(), _ran(x))

    threads = [threading.Thread(target=worker, args=("eager", True)),
               threading.Thread(target=worker, args=("lazy", False))]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"eager": (True, True), "lazy": (False, False),
                    "eager after": (False, False), "lazy after": (False, False)}  # fmt: skip
    np.testing.assert_allclose((x + 2.0).to_numpy(), a.astype(np.float64) + 2.0, rtol=1e-6)


def test_blocks_are_per_asyncio_task() -> None:
    """Two tasks interleaved at awaits inside their blocks each see their own choice."""

    async def task(enabled: bool, log: list[tuple[bool, bool]]) -> None:
        with gpk.eager(enabled):
            for _ in range(3):
                await asyncio.sleep(0)
                log.append((enabled, gpk.is_eager()))

    async def both() -> list[tuple[bool, bool]]:
        log: list[tuple[bool, bool]] = []
        await asyncio.gather(task(True, log), task(False, log))
        return log

    log = asyncio.run(both())
    assert sorted(log) == [(False, False)] * 3 + [(True, True)] * 3
    assert not gpk.is_eager()


def test_a_block_left_in_another_thread_raises() -> None:
    """A token belongs to the context that entered: leaving the block from another thread
    is contextvars' ValueError, and the entering thread's choice is untouched."""
    block = gpk.eager(True)
    errors: list[BaseException] = []

    def leave() -> None:
        try:
            block.__exit__(None, None, None)
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            errors.append(e)

    def enter_and_leave_elsewhere() -> bool:
        block.__enter__()
        t = threading.Thread(target=leave)
        t.start()
        t.join()
        return gpk.is_eager()

    # In a copy of this context: the spent token leaves the entry in place.
    assert contextvars.copy_context().run(enter_and_leave_elsewhere)
    assert [type(e) for e in errors] == [ValueError]
    assert not gpk.is_eager()


def test_the_decorator_wraps_and_runs_each_call_in_its_own_block(
    rng: np.random.Generator,
) -> None:
    a = rng.standard_normal(8).astype(np.float32)
    x = gpk.asarray(a)

    @gpk.eager()
    def scaled(v: gpk.GPUArray, k: float) -> gpk.GPUArray:
        """Docstring kept."""
        return v * k

    assert scaled.__name__ == "scaled" and scaled.__doc__ == "Docstring kept."
    results: list[bool] = []

    def call() -> None:
        results.append(scaled(x, 2.5)._node.realized is not None)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4 and not gpk.is_eager()
    np.testing.assert_allclose(scaled(x, 2.5).to_numpy(), a.astype(np.float64) * 2.5, rtol=1e-6)
