//! Memory pool: arenas from an `ArenaSource`, carved into 256-byte-granular
//! blocks, served best-fit from segregated free lists, coalesced on free,
//! bounded by an optional quota.
//!
//! Eviction (`eviction`) sits on top: when an allocation fails it moves the
//! least recently used unpinned tracked blocks to the host through a
//! `Copier` and retries; the pool itself never knows a block was tracked.

mod arena;
mod error;
mod eviction;
mod free_list;
mod size_class;
mod source;
mod stats;

use std::collections::BTreeMap;

pub use error::{OutOfMemory, PoolError};
pub use eviction::{Copier, EvictError, EvictionStats, Evictor, Forgotten, Handle};
pub use size_class::{block_size, GRANULE, LARGE_ARENA_ROUND};
pub use source::{ArenaSource, HostArenaSource};
pub use stats::PoolStats;

use arena::Arena;
use free_list::FreeLists;
use size_class::{round_down, round_up};
use stats::Counters;

pub const DEFAULT_ARENA_BYTES: u64 = 64 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Size of a regular arena (rounded up to GRANULE).
    pub arena_bytes: u64,
    /// Upper bound on the bytes of all arenas together; None = unlimited.
    pub quota_bytes: Option<u64>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            arena_bytes: DEFAULT_ARENA_BYTES,
            quota_bytes: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaInfo {
    pub base: u64,
    pub size: u64,
    pub used_bytes: u64,
}

enum GrowError {
    Source(String),
    Pool(PoolError),
}

pub struct Pool<S: ArenaSource> {
    cfg: PoolConfig,
    source: S,
    arenas: BTreeMap<u64, Arena>,
    free: FreeLists,
    c: Counters,
}

impl<S: ArenaSource> Pool<S> {
    pub fn new(cfg: PoolConfig, source: S) -> Self {
        let arena_bytes = round_up(cfg.arena_bytes.max(GRANULE), GRANULE)
            .unwrap_or(round_down(u64::MAX, GRANULE));
        Self {
            cfg: PoolConfig {
                arena_bytes,
                quota_bytes: cfg.quota_bytes,
            },
            source,
            arenas: BTreeMap::new(),
            free: FreeLists::default(),
            c: Counters::default(),
        }
    }

    pub fn config(&self) -> PoolConfig {
        self.cfg
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// Returns the address of a block of at least `nbytes` (a multiple of
    /// GRANULE, and GRANULE for a zero-byte request, so every live
    /// allocation has its own address).
    pub fn alloc(&mut self, nbytes: u64) -> Result<u64, PoolError> {
        let Some(size) = block_size(nbytes) else {
            return Err(self.oom(
                nbytes,
                None,
                "the request overflows the address space".into(),
            ));
        };
        if let Some(addr) = self.take_free(size) {
            return Ok(addr);
        }
        match self.grow(size) {
            Ok(()) => Ok(self
                .take_free(size)
                .expect("a freshly added arena holds the request")),
            Err(GrowError::Pool(e)) => Err(e),
            Err(GrowError::Source(cause)) => Err(self.oom(nbytes, Some(size), cause)),
        }
    }

    pub fn free(&mut self, addr: u64) -> Result<(), PoolError> {
        let arena = Self::arena_of_mut(&mut self.arenas, addr)?;
        let size = arena
            .release(&mut self.free, addr)
            .map_err(|why| PoolError::invalid(addr, why))?;
        self.c.on_free(size);
        Ok(())
    }

    /// Usable size of the live block at `addr` (the rounded block size).
    pub fn size_of(&self, addr: u64) -> Result<u64, PoolError> {
        let arena = self.arena_of(addr).ok_or(PoolError::InvalidAddress {
            addr,
            reason: "outside every arena",
        })?;
        match arena.block(addr) {
            Some(b) if b.used => Ok(b.size),
            Some(_) => Err(PoolError::invalid(addr, arena::BadFree::AlreadyFree)),
            None => Err(PoolError::invalid(addr, arena::BadFree::NotABlockStart)),
        }
    }

    /// Gives every fully free arena back to the source; returns the bytes released.
    pub fn release_cached(&mut self) -> u64 {
        let idle: Vec<u64> = self
            .arenas
            .values()
            .filter(|a| a.is_unused())
            .map(|a| a.base)
            .collect();
        let mut released = 0;
        for base in idle {
            let arena = self.arenas.remove(&base).expect("listed above");
            let size = arena.size;
            arena.retire(&mut self.free);
            self.source.free_arena(base, size);
            self.c.reserved_bytes -= size;
            released += size;
        }
        released
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            arenas: self.arenas.len(),
            reserved_bytes: self.c.reserved_bytes,
            in_use_bytes: self.c.in_use_bytes,
            peak_in_use_bytes: self.c.peak_in_use_bytes,
            live_blocks: self.c.live_blocks,
            free_blocks: self.free.len(),
            largest_free_block: self.free.largest(),
            alloc_count: self.c.alloc_count,
            free_count: self.c.free_count,
            quota_bytes: self.cfg.quota_bytes,
            oom_count: self.c.oom_count,
            arena_bytes: self.cfg.arena_bytes,
        }
    }

    pub fn arenas(&self) -> Vec<ArenaInfo> {
        self.arenas
            .values()
            .map(|a| ArenaInfo {
                base: a.base,
                size: a.size,
                used_bytes: a.used_bytes,
            })
            .collect()
    }

    /// Walks every structure and checks they agree; for tests and debugging.
    pub fn validate(&self) -> Result<(), String> {
        let (mut reserved, mut used, mut free_blocks, mut live) = (0, 0, 0, 0);
        let mut prev_end = 0;
        for arena in self.arenas.values() {
            if arena.base < prev_end {
                return Err(format!("arena {:#x} overlaps the previous one", arena.base));
            }
            prev_end = arena.base + arena.size;
            let (u, f) = arena.validate(&self.free)?;
            reserved += arena.size;
            used += u;
            free_blocks += f;
            live += arena.blocks().filter(|(_, b)| b.used).count();
        }
        let c = &self.c;
        if reserved != c.reserved_bytes || used != c.in_use_bytes || live != c.live_blocks {
            return Err("counters disagree with the arenas".into());
        }
        if free_blocks != self.free.len() {
            return Err("free lists hold blocks that no arena has".into());
        }
        if matches!(self.cfg.quota_bytes, Some(q) if reserved > q) {
            return Err("reserved bytes exceed the quota".into());
        }
        if c.alloc_count - c.free_count != c.live_blocks as u64 {
            return Err("alloc/free counts disagree with live blocks".into());
        }
        Ok(())
    }

    fn take_free(&mut self, size: u64) -> Option<u64> {
        let (_, addr) = self.free.best_fit(size)?;
        let arena = self
            .arenas
            .range_mut(..=addr)
            .next_back()
            .map(|(_, a)| a)
            .expect("free block outside every arena");
        arena.carve(&mut self.free, addr, size);
        self.c.on_alloc(size);
        Some(addr)
    }

    /// Adds an arena that holds `size`, releasing cached arenas first when
    /// the quota (or the source) has no room.
    fn grow(&mut self, size: u64) -> Result<(), GrowError> {
        let wanted = if size > self.cfg.arena_bytes {
            round_up(size, LARGE_ARENA_ROUND).unwrap_or(size)
        } else {
            self.cfg.arena_bytes
        };
        let bytes = match self.fit_quota(size, wanted) {
            Some(b) => b,
            None => {
                self.release_cached();
                match self.fit_quota(size, wanted) {
                    Some(b) => b,
                    None => return Err(GrowError::Source(self.quota_cause(size))),
                }
            }
        };
        match self.add_arena(bytes) {
            Err(GrowError::Source(first)) if self.release_cached() > 0 => {
                let bytes = self
                    .fit_quota(size, wanted)
                    .expect("releasing arenas only makes room");
                self.add_arena(bytes).map_err(|e| match e {
                    GrowError::Source(again) => GrowError::Source(format!(
                        "arena source failed: {first}; after releasing cached arenas: {again}"
                    )),
                    other => other,
                })
            }
            Err(GrowError::Source(msg)) => {
                Err(GrowError::Source(format!("arena source failed: {msg}")))
            }
            other => other,
        }
    }

    /// The arena size to request under the quota: the wanted size, or what
    /// room is left if that still holds the request; None if nothing fits.
    fn fit_quota(&self, size: u64, wanted: u64) -> Option<u64> {
        let Some(quota) = self.cfg.quota_bytes else {
            return Some(wanted);
        };
        let room = round_down(quota - self.c.reserved_bytes, GRANULE);
        if wanted <= room {
            Some(wanted)
        } else if size <= room {
            Some(room)
        } else {
            None
        }
    }

    fn quota_cause(&self, size: u64) -> String {
        let quota = self.cfg.quota_bytes.unwrap_or(u64::MAX);
        format!(
            "a new arena of at least {size} bytes would exceed the quota ({} of {quota} bytes reserved after releasing cached arenas)",
            self.c.reserved_bytes
        )
    }

    fn add_arena(&mut self, bytes: u64) -> Result<(), GrowError> {
        let base = self.source.alloc_arena(bytes).map_err(GrowError::Source)?;
        let end = base.checked_add(bytes);
        let reason = if base == 0 {
            Some("null base address")
        } else if base % GRANULE != 0 {
            Some("not 256-byte aligned")
        } else if end.is_none() {
            Some("range wraps around the address space")
        } else if self.overlaps(base, bytes) {
            Some("overlaps an arena the pool already holds")
        } else {
            None
        };
        if let Some(reason) = reason {
            self.source.free_arena(base, bytes);
            return Err(GrowError::Pool(PoolError::BadArena {
                base,
                bytes,
                reason,
            }));
        }
        self.arenas
            .insert(base, Arena::new(base, bytes, &mut self.free));
        self.c.reserved_bytes += bytes;
        Ok(())
    }

    fn overlaps(&self, base: u64, bytes: u64) -> bool {
        let end = base + bytes;
        self.arenas
            .range(..end)
            .next_back()
            .is_some_and(|(_, a)| a.base + a.size > base)
    }

    fn arena_of(&self, addr: u64) -> Option<&Arena> {
        self.arenas
            .range(..=addr)
            .next_back()
            .map(|(_, a)| a)
            .filter(|a| a.contains(addr))
    }

    fn arena_of_mut(arenas: &mut BTreeMap<u64, Arena>, addr: u64) -> Result<&mut Arena, PoolError> {
        arenas
            .range_mut(..=addr)
            .next_back()
            .map(|(_, a)| a)
            .filter(|a| a.contains(addr))
            .ok_or(PoolError::InvalidAddress {
                addr,
                reason: "outside every arena",
            })
    }

    fn oom(&mut self, requested: u64, block: Option<u64>, cause: String) -> PoolError {
        self.c.oom_count += 1;
        PoolError::OutOfMemory(Box::new(OutOfMemory {
            requested_bytes: requested,
            block_bytes: block,
            stats: self.stats(),
            cause,
        }))
    }
}

impl<S: ArenaSource> Drop for Pool<S> {
    /// Arenas go back to the source even if blocks are still live: whoever
    /// holds addresses must keep the pool alive as long as they use them.
    fn drop(&mut self) {
        for (base, arena) in std::mem::take(&mut self.arenas) {
            self.source.free_arena(base, arena.size);
        }
    }
}
