"""The unit the generators produce and the compiler caches."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KernelSource:
    text: str  # full CUDA C source, prelude included
    name: str  # the extern "C" kernel name
    fmt: str  # launch format: one char per parameter (P i I q f d)


def stable_hash(spec: Any) -> str:
    """A kernel-name suffix that is the same in every process (str hashes are salted), so
    the same spec gives the same source and hits the disk cache."""
    return hashlib.sha1(repr(spec).encode()).hexdigest()[:12]
