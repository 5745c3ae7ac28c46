"""The device error word: kernels record the first bad index (or negative integer power)
there, and the backend raises it, naming the op and the user's line, when it next syncs.
No kernel ever waits on the host for this."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit import _native
from pygpukit.errors import GPUKitValueError, IndexError_, describe_inputs

from .codegen.prelude import ERR_INDEX, ERR_KV_LEN, ERR_KV_START, ERR_NEG_POW

WORDS = 4  # code, tag, value, extent


class ErrorWord:
    def __init__(self, storage: Any) -> None:
        self.storage = storage  # a pool block of WORDS int64
        self.addr = storage.addr
        self._tags: dict[int, tuple[str, Any, Any]] = {}
        _native.memset(self.addr, 0, WORDS * 8)

    def tag(self, op: str, inputs: list[tuple[tuple[int, ...], Any]], loc: Any) -> int:
        """A number kernels write with their error, mapping back to the op and line."""
        t = len(self._tags) + 1
        self._tags[t] = (op, inputs, loc)
        return t

    def check(self) -> None:
        """Call after a synchronisation: raises the recorded error, if any, and clears it."""
        host = np.empty(WORDS, np.int64)
        _native.memcpy_dtoh(host, self.addr)
        if host[0] == 0:
            return
        _native.memset(self.addr, 0, WORDS * 8)
        code, tag, value, extent = (int(v) for v in host)
        op, inputs, loc = self._tags.get(tag, ("kernel", [], None))
        where = describe_inputs(inputs, loc)
        if code == ERR_INDEX:
            raise IndexError_(
                f"{op}: index {value} is out of bounds for axis with size {extent} {where}"
            )
        if code in (ERR_KV_LEN, ERR_KV_START):  # a ValueError, as the host check raises
            name = "kv_len" if code == ERR_KV_LEN else "kv_start"
            raise GPUKitValueError(
                f"{op}: {name} {value} is outside [0, {extent}] (the key length) {where}"
            )
        if code == ERR_NEG_POW:
            raise GPUKitValueError(
                f"{op}: Integers to negative integer powers are not allowed. {where}"
            )
        raise IndexError_(f"{op}: device error {code} {where}")
