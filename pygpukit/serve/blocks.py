"""The KV-cache block allocator: which blocks of the pool are free, and who holds which."""

from __future__ import annotations

from pygpukit import errors


class BlockAllocator:
    """Fixed-size blocks 0..num_blocks-1 handed out and taken back whole.

    The scheduler admits a request only when its reservation (its blocks' bytes) fits, so
    allocate() failing means the reservations and the blocks disagree: a bug, reported."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise errors.GPUKitValueError(f"the KV cache needs >= 1 block, got {num_blocks}")
        self.num_blocks = num_blocks
        # Low ids first (a LIFO stack of the free ones), so a quiet server reuses warm blocks.
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise errors.OutOfMemoryError(
                f"KV cache: {n} blocks asked for, {len(self._free)} of {self.num_blocks} free"
            )
        out = [self._free.pop() for _ in range(n)]
        return out

    def release(self, blocks: list[int]) -> None:
        """Give blocks back (each exactly once)."""
        self._free.extend(reversed(blocks))
        if len(self._free) > self.num_blocks:
            raise errors.GPUKitError("KV cache: a block was released twice")


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold `tokens` positions."""
    return -(-tokens // block_size)
