//! One arena: a contiguous range split into blocks that tile it exactly.

use std::collections::BTreeMap;

use super::free_list::FreeLists;
use super::size_class::GRANULE;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub size: u64,
    pub used: bool,
}

/// Why a free() was refused; the pool turns this into an error with the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadFree {
    AlreadyFree,
    NotABlockStart,
}

pub struct Arena {
    pub base: u64,
    pub size: u64,
    /// Keyed by start address; the blocks tile [base, base + size) with no gaps.
    blocks: BTreeMap<u64, Block>,
    pub used_bytes: u64,
}

impl Arena {
    /// A new arena is one free block, registered in `free`.
    pub fn new(base: u64, size: u64, free: &mut FreeLists) -> Self {
        let mut blocks = BTreeMap::new();
        blocks.insert(base, Block { size, used: false });
        free.insert(size, base);
        Self {
            base,
            size,
            blocks,
            used_bytes: 0,
        }
    }

    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.size
    }

    pub fn is_unused(&self) -> bool {
        self.used_bytes == 0
    }

    pub fn block(&self, addr: u64) -> Option<Block> {
        self.blocks.get(&addr).copied()
    }

    pub fn blocks(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        self.blocks.iter().map(|(&a, &b)| (a, b))
    }

    /// Takes `want` bytes from the free block at `addr` (already chosen by
    /// best-fit) and returns the remainder to the free lists.
    pub fn carve(&mut self, free: &mut FreeLists, addr: u64, want: u64) {
        let block = self.blocks.get_mut(&addr).expect("carve: not a block");
        debug_assert!(!block.used && block.size >= want && want.is_multiple_of(GRANULE));
        let have = block.size;
        free.remove(have, addr);
        *block = Block {
            size: want,
            used: true,
        };
        if have > want {
            let rest = Block {
                size: have - want,
                used: false,
            };
            self.blocks.insert(addr + want, rest);
            free.insert(rest.size, addr + want);
        }
        self.used_bytes += want;
    }

    /// Frees the block at `addr` and merges it with free neighbours, so an
    /// arena whose blocks are all free is always a single block.
    pub fn release(&mut self, free: &mut FreeLists, addr: u64) -> Result<u64, BadFree> {
        let block = match self.blocks.get(&addr) {
            None => return Err(BadFree::NotABlockStart),
            Some(b) if !b.used => return Err(BadFree::AlreadyFree),
            Some(&b) => b,
        };
        self.used_bytes -= block.size;
        let mut start = addr;
        let mut size = block.size;

        let next_addr = addr + size;
        if let Some(&next) = self.blocks.get(&next_addr) {
            if !next.used {
                free.remove(next.size, next_addr);
                self.blocks.remove(&next_addr);
                size += next.size;
            }
        }
        if let Some((&prev_addr, &prev)) = self.blocks.range(..addr).next_back() {
            if !prev.used {
                free.remove(prev.size, prev_addr);
                self.blocks.remove(&addr);
                start = prev_addr;
                size += prev.size;
            }
        }
        self.blocks.insert(start, Block { size, used: false });
        free.insert(size, start);
        Ok(block.size)
    }

    /// Takes a fully free arena out of the free lists before it is returned
    /// to its source.
    pub fn retire(self, free: &mut FreeLists) {
        debug_assert!(self.is_unused() && self.blocks.len() == 1);
        free.remove(self.size, self.base);
    }

    /// Checks tiling, alignment, coalescing, byte counts and free-list
    /// membership; returns (used bytes, free blocks) for pool-level checks.
    pub fn validate(&self, free: &FreeLists) -> Result<(u64, usize), String> {
        let mut cursor = self.base;
        let mut used = 0;
        let mut free_blocks = 0;
        let mut prev_free = false;
        for (&addr, b) in &self.blocks {
            if addr != cursor {
                return Err(format!(
                    "arena {:#x}: gap or overlap at {addr:#x}",
                    self.base
                ));
            }
            if addr % GRANULE != 0 || b.size % GRANULE != 0 || b.size == 0 {
                return Err(format!(
                    "arena {:#x}: misaligned block {addr:#x}",
                    self.base
                ));
            }
            if b.used {
                used += b.size;
                if free.contains(b.size, addr) {
                    return Err(format!("used block {addr:#x} is on a free list"));
                }
            } else {
                if prev_free {
                    return Err(format!("adjacent free blocks not coalesced at {addr:#x}"));
                }
                if !free.contains(b.size, addr) {
                    return Err(format!("free block {addr:#x} missing from free lists"));
                }
                free_blocks += 1;
            }
            prev_free = !b.used;
            cursor = addr + b.size;
        }
        if cursor != self.base + self.size {
            return Err(format!(
                "arena {:#x}: blocks do not reach the end",
                self.base
            ));
        }
        if used != self.used_bytes {
            return Err(format!("arena {:#x}: used_bytes out of sync", self.base));
        }
        Ok((used, free_blocks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carve_release_coalesces_both_sides() {
        let mut free = FreeLists::default();
        let mut a = Arena::new(0x1000_0000, 4096, &mut free);
        let base = a.base;
        for i in 0..4 {
            let (size, addr) = free.best_fit(1024).unwrap();
            assert_eq!((size, addr), (4096 - i * 1024, base + i * 1024));
            a.carve(&mut free, addr, 1024);
        }
        assert_eq!(free.len(), 0);
        assert_eq!(a.release(&mut free, base + 1024), Ok(1024));
        assert_eq!(a.release(&mut free, base + 3072), Ok(1024));
        assert_eq!(free.len(), 2);
        // Freeing the middle block merges with both free neighbours.
        assert_eq!(a.release(&mut free, base + 2048), Ok(1024));
        assert_eq!(free.len(), 1);
        assert_eq!(
            a.block(base + 1024),
            Some(Block {
                size: 3072,
                used: false
            })
        );
        assert_eq!(
            a.release(&mut free, base + 2048),
            Err(BadFree::NotABlockStart)
        );
        assert_eq!(a.release(&mut free, base + 1024), Err(BadFree::AlreadyFree));
        assert_eq!(a.release(&mut free, base), Ok(1024));
        assert!(a.is_unused());
        assert_eq!(a.validate(&free), Ok((0, 1)));
        a.retire(&mut free);
        assert_eq!(free.len(), 0);
    }
}
