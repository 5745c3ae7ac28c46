"""Eager versus lazy execution."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

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


@contextlib.contextmanager
def eager(enabled: bool = True) -> Iterator[None]:
    """Run every op at once inside the block (no fusion), or record lazily with False.

    Blocks nest (the innermost wins) and are per thread and per asyncio task.

    Args:
        enabled: True for eager, False for lazy inside the block.

    Yields:
        Nothing; the mode holds until the block ends.
    """
    token = _eager.set(enabled)
    try:
        yield
    finally:
        _eager.reset(token)
