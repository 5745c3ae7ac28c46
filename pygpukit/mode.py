"""Eager versus lazy execution."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from . import settings

# None outside any gpk.eager() block: the process-wide setting decides.
_eager: contextvars.ContextVar[bool | None] = contextvars.ContextVar("pygpukit_eager", default=None)


def is_eager() -> bool:
    """Whether ops run at once here: the innermost gpk.eager() block, else the setting
    (gpk.set_eager / PYGPUKIT_EAGER)."""
    enabled = _eager.get()
    return settings.eager() if enabled is None else enabled


@contextlib.contextmanager
def eager(enabled: bool = True) -> Iterator[None]:
    """Run every op at once (no fusion) inside this block: for debugging."""
    token = _eager.set(enabled)
    try:
        yield
    finally:
        _eager.reset(token)
