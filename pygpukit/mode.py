"""Eager versus lazy execution."""

from __future__ import annotations

import contextlib
import contextvars

from . import _rust, settings

# None outside any gpk.eager() block: the process-wide setting decides. Made by the native
# module, whose blocks (EagerBlock) set and reset it; the array operators read it.
_eager: contextvars.ContextVar[bool | None] = _rust.EAGER_MODE


def is_eager() -> bool:
    """Whether ops run at once here.

    Returns:
        The innermost `gpk.eager()` block's choice, else the process setting
        (`gpk.set_eager` / `PYGPUKIT_EAGER`).
    """
    enabled = _eager.get()
    return settings.eager() if enabled is None else enabled


class eager(_rust.EagerBlock, contextlib.ContextDecorator):  # noqa: N801 - used as gpk.eager()
    """Run every op at once inside the block (no fusion), or record lazily with False.

    Blocks nest (the innermost wins) and are per thread and per asyncio task; one block
    object may be entered again inside itself. Construction, entry and exit are native
    (rust/pygpukit-py/src/block.rs): an eager op's block is on its hot path, and as Python
    methods they cost about as much as the op's native hit.

    Args:
        enabled: True for eager, False for lazy inside the block, None for the process
            setting (`gpk.set_eager` / `PYGPUKIT_EAGER`); anything else raises SettingError.
    """

    __slots__ = ()

    def _recreate_cm(self) -> eager:
        # As a decorator, each call (recursive or on another thread) gets its own block.
        return eager(self.enabled)
