//! The statistics snapshot.

use super::stats::{PartitionStats, SchedStats, TaskStats, TenantStats};
use super::{Scheduler, TaskState};

impl Scheduler {
    /// Snapshot; `now` (if given) evaluates token buckets at that time.
    pub fn stats(&self, now: Option<f64>) -> SchedStats {
        let tasks = self
            .tasks
            .values()
            .map(|t| {
                let s = TaskStats {
                    tenant: t.spec.tenant.clone(),
                    partition: t.spec.partition.clone(),
                    qos: t.spec.qos,
                    state: t.state,
                    reservation_bytes: t.spec.reservation_bytes,
                };
                (t.id, s)
            })
            .collect();
        let tenants = self
            .tenants
            .iter()
            .map(|(name, t)| {
                let s = TenantStats {
                    share: t.bucket.rate(),
                    tokens_ms: t.bucket.tokens_at(now.unwrap_or(f64::NEG_INFINITY)),
                    gpu_time_ms: t.gpu_time_ms,
                    live_tasks: t.live_tasks,
                    completed: t.completed,
                    failed: t.failed,
                    throttled_tasks: t.throttled_tasks,
                    held_tasks: t.held_tasks,
                    expected_ms: t.expected_ms(),
                    guaranteed_gap_ms: t.shortest_gap_ms(),
                };
                (name.clone(), s)
            })
            .collect();
        let partitions = self
            .partitions
            .values()
            .map(|p| {
                let s = PartitionStats {
                    memory_quota_bytes: p.memory_quota_bytes,
                    reserved_bytes: self.res.partition_reserved(&p.name),
                    bandwidth_share: p.bandwidth_share,
                    stream_priority: p.stream_priority,
                };
                (p.name.clone(), s)
            })
            .collect();
        let running = self
            .tasks
            .values()
            .filter(|t| t.state == TaskState::Running)
            .count();
        SchedStats {
            capacity_bytes: self.res.capacity,
            reserved_bytes: self.res.reserved,
            queue_length: self.queue.len(),
            waiting: self.waiting.len(),
            running,
            counts: self.counts.clone(),
            best_effort_duty: self.best_effort_duty(),
            best_effort_tokens_ms: self
                .best_effort
                .as_ref()
                .map(|b| b.tokens_at(now.unwrap_or(f64::NEG_INFINITY))),
            tasks,
            tenants,
            partitions,
        }
    }
}
