//! Counters the pool keeps and the snapshot it reports.

use std::fmt;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub arenas: usize,
    pub reserved_bytes: u64,
    pub in_use_bytes: u64,
    pub peak_in_use_bytes: u64,
    pub live_blocks: usize,
    pub free_blocks: usize,
    pub largest_free_block: u64,
    pub alloc_count: u64,
    pub free_count: u64,
    pub quota_bytes: Option<u64>,
    pub oom_count: u64,
    pub arena_bytes: u64,
}

/// Running totals the pool updates on every operation; the snapshot adds
/// what is derived from the arenas and free lists.
#[derive(Default)]
pub struct Counters {
    pub reserved_bytes: u64,
    pub in_use_bytes: u64,
    pub peak_in_use_bytes: u64,
    pub live_blocks: usize,
    pub alloc_count: u64,
    pub free_count: u64,
    pub oom_count: u64,
}

impl Counters {
    pub fn on_alloc(&mut self, size: u64) {
        self.in_use_bytes += size;
        self.peak_in_use_bytes = self.peak_in_use_bytes.max(self.in_use_bytes);
        self.live_blocks += 1;
        self.alloc_count += 1;
    }

    pub fn on_free(&mut self, size: u64) {
        self.in_use_bytes -= size;
        self.live_blocks -= 1;
        self.free_count += 1;
    }
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quota = match self.quota_bytes {
            Some(q) => q.to_string(),
            None => "unlimited".into(),
        };
        write!(
            f,
            "in use {} bytes, reserved {} bytes in {} arenas, quota {}, largest free block {} bytes",
            self.in_use_bytes, self.reserved_bytes, self.arenas, quota, self.largest_free_block
        )
    }
}
