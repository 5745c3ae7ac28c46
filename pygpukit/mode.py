"""Eager versus lazy execution."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

_eager: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "pygpukit_eager", default=os.environ.get("PYGPUKIT_EAGER", "") not in ("", "0")
)


def is_eager() -> bool:
    return _eager.get()


@contextlib.contextmanager
def eager(enabled: bool = True) -> Iterator[None]:
    """Run every op at once (no fusion) inside this block: for debugging."""
    token = _eager.set(enabled)
    try:
        yield
    finally:
        _eager.reset(token)
