//! Per-tenant pacing state and accounting.

use super::pacing::Bucket;

#[derive(Clone, Debug)]
pub struct Tenant {
    pub bucket: Bucket,
    pub gpu_time_ms: f64,
    pub live_tasks: usize,
    /// Live Guaranteed tasks: while any exist the tenant's share counts
    /// against the guaranteed bandwidth of the node.
    pub guaranteed_live: usize,
    pub completed: u64,
    pub failed: u64,
    pub throttled_tasks: u64,
}

impl Tenant {
    pub fn new(share: f64, burst_ms: f64, now: f64) -> Self {
        Self {
            bucket: Bucket::new(share, burst_ms, now),
            gpu_time_ms: 0.0,
            live_tasks: 0,
            guaranteed_live: 0,
            completed: 0,
            failed: 0,
            throttled_tasks: 0,
        }
    }
}
