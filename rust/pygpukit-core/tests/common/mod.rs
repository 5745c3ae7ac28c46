//! A fake arena source: hands out address ranges without memory, so tests can
//! use huge arenas and inject failures.
#![allow(dead_code)]

use std::collections::BTreeMap;

use pygpukit_core::pool::ArenaSource;

pub struct FakeSource {
    next: u64,
    pub live: BTreeMap<u64, u64>,
    /// Total bytes the "device" has; alloc_arena fails beyond it.
    pub capacity: u64,
    pub alloc_calls: usize,
    pub free_calls: usize,
    /// Returned instead of a fresh range on the next alloc (to test checks).
    pub next_base_override: Option<u64>,
    pub bad_frees: usize,
}

impl FakeSource {
    pub fn new() -> Self {
        Self::with_capacity(u64::MAX / 4)
    }

    pub fn with_capacity(capacity: u64) -> Self {
        Self {
            next: 0x7f00_0000_0000,
            live: BTreeMap::new(),
            capacity,
            alloc_calls: 0,
            free_calls: 0,
            next_base_override: None,
            bad_frees: 0,
        }
    }

    pub fn live_bytes(&self) -> u64 {
        self.live.values().sum()
    }
}

impl ArenaSource for FakeSource {
    fn alloc_arena(&mut self, bytes: u64) -> Result<u64, String> {
        self.alloc_calls += 1;
        if let Some(base) = self.next_base_override.take() {
            self.live.insert(base, bytes);
            return Ok(base);
        }
        if self.live_bytes() + bytes > self.capacity {
            return Err(format!("fake device has no room for {bytes} bytes"));
        }
        let base = self.next;
        // A gap between arenas so that adjacent arenas are never merged by mistake.
        self.next += bytes + 4096;
        self.live.insert(base, bytes);
        Ok(base)
    }

    fn free_arena(&mut self, base: u64, bytes: u64) {
        self.free_calls += 1;
        if self.live.remove(&base) != Some(bytes) {
            self.bad_frees += 1;
        }
    }
}
