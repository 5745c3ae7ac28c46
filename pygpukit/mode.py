"""Eager versus lazy execution."""

from __future__ import annotations

import contextlib
import contextvars

from . import settings

# None outside any gpk.eager() block: the process-wide setting decides.
_eager: contextvars.ContextVar[bool | None] = contextvars.ContextVar("pygpukit_eager", default=None)


def is_eager() -> bool:
    """Whether ops run at once here.

    Returns:
        The innermost `gpk.eager()` block's choice, else the process setting
        (`gpk.set_eager` / `PYGPUKIT_EAGER`).
    """
    enabled = _eager.get()
    return settings.eager() if enabled is None else enabled


class eager(contextlib.ContextDecorator):  # noqa: N801 - used as gpk.eager(), a function
    """Run every op at once inside the block (no fusion), or record lazily with False.

    Blocks nest (the innermost wins) and are per thread and per asyncio task. A class
    rather than a generator context manager: an eager op's block is on its hot path (a
    generator costs about a microsecond a block).

    Args:
        enabled: True for eager, False for lazy inside the block.
    """

    __slots__ = ("enabled", "_tokens")

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        # One token per entry not yet exited: the same object may be entered again inside.
        self._tokens: list[contextvars.Token[bool | None]] = []

    def __enter__(self) -> None:
        self._tokens.append(_eager.set(self.enabled))

    def __exit__(self, *exc: object) -> None:
        _eager.reset(self._tokens.pop())

    def _recreate_cm(self) -> eager:
        # As a decorator, each call (recursive or on another thread) gets its own block.
        return eager(self.enabled)
