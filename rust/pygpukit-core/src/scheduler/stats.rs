//! What the scheduler reports.

use std::collections::BTreeMap;

use super::task::{Qos, TaskId, TaskState};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub submitted: u64,
    pub admitted: u64,
    pub queued: u64,
    pub rejected: u64,
    pub started: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub throttled: u64,
    /// Best-effort tasks held back for Guaranteed work, each counted once.
    pub held_for_guaranteed: u64,
    /// Best-effort tasks held back by the best-effort duty limit, each counted once.
    pub held_for_duty: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TenantStats {
    pub share: f64,
    pub tokens_ms: f64,
    pub gpu_time_ms: f64,
    pub live_tasks: usize,
    pub completed: u64,
    pub failed: u64,
    pub throttled_tasks: u64,
    pub held_tasks: u64,
    /// Longest recent launch (what best-effort holds assume it takes).
    pub expected_ms: Option<f64>,
    /// Shortest recent gap between Guaranteed submissions.
    pub guaranteed_gap_ms: Option<f64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TaskStats {
    pub tenant: String,
    pub partition: String,
    pub qos: Qos,
    pub state: TaskState,
    pub reservation_bytes: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PartitionStats {
    pub memory_quota_bytes: u64,
    pub reserved_bytes: u64,
    pub bandwidth_share: f64,
    pub stream_priority: i32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SchedStats {
    pub capacity_bytes: u64,
    pub reserved_bytes: u64,
    pub queue_length: usize,
    /// Admitted tasks not yet started.
    pub waiting: usize,
    pub running: usize,
    pub counts: Counters,
    /// The best-effort duty limit (1.0: none) and its bucket's tokens (ms).
    pub best_effort_duty: f64,
    pub best_effort_tokens_ms: Option<f64>,
    pub tasks: BTreeMap<TaskId, TaskStats>,
    pub tenants: BTreeMap<String, TenantStats>,
    pub partitions: BTreeMap<String, PartitionStats>,
}
