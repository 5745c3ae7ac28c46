//! Admission: whether a submitted task may ever run, and admitting queued
//! tasks in order as memory allows.

use super::hasher::{FastMap, FastSet};

use super::reservations::Fit;
use super::task::{QueueKey, Task};
use super::tenant::Tenant;
use super::{Admission, Qos, Scheduler, TaskId, TaskSpec, TaskState, SHARE_EPS};

impl Scheduler {
    /// Why a task can never be admitted as asked, if so.
    pub(super) fn refusal(&self, spec: &TaskSpec) -> Option<String> {
        let Some(part) = self.partitions.get(&spec.partition) else {
            return Some(format!("unknown partition {:?}", spec.partition));
        };
        if spec.reservation_bytes > part.memory_quota_bytes {
            return Some(format!(
                "reservation of {} bytes exceeds the quota of partition {:?} ({} bytes)",
                spec.reservation_bytes, part.name, part.memory_quota_bytes
            ));
        }
        if spec.reservation_bytes > self.res.capacity {
            return Some(format!(
                "reservation of {} bytes exceeds the node capacity ({} bytes)",
                spec.reservation_bytes, self.res.capacity
            ));
        }
        let share = part.bandwidth_share * spec.bandwidth_share;
        let tenant_guaranteed = self
            .tenants
            .get(&spec.tenant)
            .is_some_and(|t| t.guaranteed_live > 0);
        if spec.qos == Qos::Guaranteed || tenant_guaranteed {
            let others: f64 = self
                .tenants
                .iter()
                .filter(|(name, t)| t.guaranteed_live > 0 && **name != spec.tenant)
                .map(|(_, t)| t.bucket.rate())
                .sum();
            if others + share > 1.0 + SHARE_EPS {
                return Some(format!(
                    "guaranteed bandwidth would be overcommitted: tenant {:?} asks {share:.3} of the GPU, other guaranteed tenants hold {others:.3}",
                    spec.tenant
                ));
            }
        }
        None
    }

    pub(super) fn enqueue(
        &mut self,
        id: TaskId,
        spec: TaskSpec,
        now: f64,
    ) -> (Admission, Vec<TaskId>) {
        let share = self.partitions[&spec.partition].bandwidth_share * spec.bandwidth_share;
        let burst = self.burst_ms;
        let tenant = self
            .tenants
            .entry(spec.tenant.clone())
            .or_insert_with(|| Tenant::new(share, burst, now));
        tenant.bucket.set_rate(share, now);
        tenant.live_tasks += 1;
        if spec.qos == Qos::Guaranteed {
            tenant.guaranteed_live += 1;
            tenant.note_guaranteed_arrival(now, self.min_idle_ms);
        }
        let task = Task {
            id,
            spec,
            state: TaskState::Queued,
            throttled: false,
            held: false,
            duty_held: false,
            started_ms: None,
        };
        self.queue.insert(QueueKey::of(&task));
        let qos = task.spec.qos;
        self.tasks.insert(id, task);
        let mut others = self.pump();
        let admitted = others
            .iter()
            .position(|&a| a == id)
            .map(|i| others.remove(i));
        if admitted.is_some() {
            return (Admission::Admitted, others);
        }
        if qos != Qos::Guaranteed {
            return (Admission::Queued, others);
        }
        // Guaranteed work is admitted now or not at all: it never waits on
        // memory that best-effort work might hold indefinitely.
        let task = self.remove(id);
        let p = &self.partitions[&task.spec.partition];
        let reason = format!(
            "not enough free memory for a guaranteed reservation of {} bytes: node has {} free, partition {:?} has {} free",
            task.spec.reservation_bytes,
            self.res.capacity - self.res.reserved,
            p.name,
            p.memory_quota_bytes
                .saturating_sub(self.res.partition_reserved(&p.name))
        );
        (Admission::Rejected(reason), others)
    }

    /// Admits queued tasks in order while memory allows. A task blocked by
    /// node memory stops the walk (so large tasks are not starved by small
    /// ones behind them); one blocked by its partition only holds back the
    /// rest of that partition. Returns the ids admitted.
    pub(super) fn pump(&mut self) -> Vec<TaskId> {
        let mut blocked: FastSet<&str> = FastSet::default();
        let mut admit = Vec::new();
        let mut extra: FastMap<&str, u64> = FastMap::default();
        let mut node_extra = 0;
        for key in &self.queue {
            let spec = &self.tasks[&key.id].spec;
            let part = &self.partitions[&spec.partition];
            if blocked.contains(part.name.as_str()) {
                continue;
            }
            let pe = extra.entry(part.name.as_str()).or_default();
            let quota = part.memory_quota_bytes.saturating_sub(*pe);
            let node_free = self.res.capacity - self.res.reserved - node_extra;
            let fit = match self.res.fits(&part.name, quota, spec.reservation_bytes) {
                Fit::Yes if spec.reservation_bytes > node_free => Fit::NodeFull,
                f => f,
            };
            match fit {
                Fit::Yes => {
                    *pe += spec.reservation_bytes;
                    node_extra += spec.reservation_bytes;
                    admit.push(*key);
                }
                Fit::PartitionFull => {
                    blocked.insert(part.name.as_str());
                }
                Fit::NodeFull => break,
            }
        }
        for key in &admit {
            let task = self.tasks.get_mut(&key.id).expect("queued task");
            self.res
                .hold(key.id, &task.spec.partition, task.spec.reservation_bytes);
            task.state = TaskState::Admitted;
            self.queue.remove(key);
            self.waiting.insert(*key);
            self.counts.admitted += 1;
        }
        admit.iter().map(|k| k.id).collect()
    }
}
