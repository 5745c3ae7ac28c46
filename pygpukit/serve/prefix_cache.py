"""Prefix caching: full KV blocks found again by the tokens they hold.

A block is named by a digest of its tokens chained with the digest of the block before it,
so a name stands for every token from position 0 to the block's end: two sequences whose
prompts start with the same tokens find the same names, and a later request reuses the
blocks an earlier one computed instead of prefilling those tokens again (a chat's next
turn resends the conversation so far; many requests share a system prompt).

Blocks are counted by holders. A block whose last holder lets go stays cached while it has
a name, idle and evictable: allocate() takes free blocks first and then evicts idle ones,
least recently released first (a sequence releases its blocks tail first, so a prefix's
later blocks go before its earlier ones). Admission reserves every request's whole need
with the scheduler, and a shared block is counted in each holder's reservation, so the
blocks in use never exceed the reservations and allocate() always finds enough.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from pygpukit import errors

from .blocks import BlockAllocator


def block_names(tokens: Sequence[int], block_size: int, start: bytes = b"") -> list[bytes]:
    """The names of the full blocks of `tokens`: block j's is the digest of block j - 1's
    name (`start` for the first) and block j's token ids."""
    names = []
    prev = start
    ids = np.asarray(tokens, np.int64)
    for j in range(len(ids) // block_size):
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(ids[j * block_size : (j + 1) * block_size].tobytes())
        prev = h.digest()
        names.append(prev)
    return names


class PrefixCache:
    """The KV pool's blocks by holders and names, over a BlockAllocator."""

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator
        self._by_name: dict[bytes, int] = {}
        self._name_of: dict[int, bytes] = {}
        self._holders: dict[int, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # named, unheld; oldest first

    @property
    def free(self) -> int:
        """Blocks allocate() can hand out: free ones and idle cached ones."""
        return self.allocator.free + len(self._idle)

    @property
    def used(self) -> int:
        """Blocks some sequence holds."""
        return self.allocator.num_blocks - self.free

    @property
    def cached(self) -> int:
        """Named blocks (held or idle)."""
        return len(self._name_of)

    @property
    def idle(self) -> int:
        """Named blocks nobody holds (evictable)."""
        return len(self._idle)

    def allocate(self, n: int) -> list[int]:
        """n blocks, each held once: free blocks first, then idle cached ones evicted."""
        take = min(n, self.allocator.free)
        out = self.allocator.allocate(take)
        while len(out) < n:
            if not self._idle:
                self.allocator.release(out)  # nothing taken: the caller's reservation lied
                raise errors.OutOfMemoryError(
                    f"KV cache: {n} blocks asked for, {self.free} free or evictable of "
                    f"{self.allocator.num_blocks}"
                )
            b, _ = self._idle.popitem(last=False)
            del self._by_name[self._name_of.pop(b)]
            out.append(b)
        for b in out:
            self._holders[b] = 1
        return out

    def is_named(self, name: bytes) -> bool:
        """Whether a block of this name is cached."""
        return name in self._by_name

    def match(self, names: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest run of `names` from the first, each now held
        once more (an idle one leaves the eviction order)."""
        out = []
        for name in names:
            b = self._by_name.get(name)
            if b is None:
                break
            out.append(b)
        for b in out:
            self._holders[b] = self._holders.get(b, 0) + 1
            self._idle.pop(b, None)
        return out

    def name(self, block: int, name: bytes) -> None:
        """Name a held block whose KV is written (or its writes launched) for every
        position: later requests may find it. A name already cached keeps its block."""
        if name in self._by_name or block in self._name_of:
            return
        self._by_name[name] = block
        self._name_of[block] = name

    def release(self, blocks: Sequence[int]) -> None:
        """Let go of blocks (each held by the caller once), tail first: a block nobody
        holds any more stays cached and idle if named, else goes back to the pool."""
        free = []
        for b in reversed(blocks):
            if b not in self._holders:
                raise errors.GPUKitError(f"KV cache: block {b} released more than it was held")
            left = self._holders[b] - 1
            if left:
                self._holders[b] = left
                continue
            del self._holders[b]
            if b in self._name_of:
                self._idle[b] = None
            else:
                free.append(b)
        self.allocator.release(free[::-1])
