//! Scheduler core: admission of compiled-graph launches against node and
//! partition memory, their lifecycle, and pacing of tenants by measured GPU
//! time. Time is always passed in (milliseconds on the caller's clock), so
//! the same code runs against a real GPU or a simulated one.

mod admission;
mod dispatch;
mod error;
mod hasher;
mod pacing;
mod partition;
mod placement;
mod report;
mod reservations;
mod stats;
mod task;
mod tenant;

use std::collections::{BTreeMap, BTreeSet};

pub use error::SchedError;
pub use partition::Partition;
pub use stats::{Counters, PartitionStats, SchedStats, TaskStats, TenantStats};
pub use task::{Qos, TaskId, TaskSpec, TaskState};

use hasher::FastMap;
use pacing::Bucket;
use reservations::Reservations;
use task::{QueueKey, Task};
use tenant::Tenant;

pub const DEFAULT_PARTITION: &str = "default";
pub const DEFAULT_BURST_MS: f64 = 50.0;
/// Margin between the expected end of a best-effort launch and the next
/// expected Guaranteed arrival: covers jitter in both and the host's launch
/// latency (milliseconds).
pub const DEFAULT_GUARD_MS: f64 = 0.25;
/// Least silence after which a Guaranteed tenant counts as idle, however short
/// its gaps: a client stepping every 0.15 ms still pauses for 0.5 ms now and
/// then (a garbage collection, a descheduled thread), and a best-effort launch
/// released into such a pause delays its next step by a whole launch (seen on
/// the H200: two 1.8 ms GEMMs in 300 closed-loop steps).
pub const DEFAULT_MIN_IDLE_MS: f64 = 5.0;

/// Shares are fractions; sums of guaranteed shares may reach 1 up to rounding.
const SHARE_EPS: f64 = 1e-9;

#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    Admitted,
    Queued,
    Rejected(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Submitted {
    pub id: TaskId,
    pub admission: Admission,
    /// Other queued tasks admitted as a side effect: a new task can change
    /// which partition or node limit blocks the queue head, letting tasks
    /// behind it in.
    pub also_admitted: Vec<TaskId>,
}

/// The answer of pacing for one task at one time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    Start,
    /// `until`: when the tenant is next within its share; None when only
    /// another task starting or ending can release it.
    Wait {
        until: Option<f64>,
    },
}

pub struct Scheduler {
    burst_ms: f64,
    partitions: BTreeMap<String, Partition>,
    tasks: FastMap<TaskId, Task>,
    /// Tasks waiting for memory, in admission order.
    queue: BTreeSet<QueueKey>,
    /// Admitted tasks waiting to start, in the same order.
    waiting: BTreeSet<QueueKey>,
    res: Reservations,
    tenants: BTreeMap<String, Tenant>,
    next_id: TaskId,
    counts: Counters,
    /// Running tasks per QoS class (indexed by `Qos as usize`).
    running: [usize; 3],
    guard_ms: f64,
    min_idle_ms: f64,
    /// The best-effort duty limit: a bucket over the GPU time all
    /// best-effort launches take together (None: no limit).
    best_effort: Option<Bucket>,
}

fn check_time(now: f64) -> Result<(), SchedError> {
    if now.is_finite() {
        Ok(())
    } else {
        Err(SchedError::InvalidArgument(format!(
            "time must be finite, got {now}"
        )))
    }
}

fn check_share(what: &str, share: f64) -> Result<(), SchedError> {
    if (0.0..=1.0).contains(&share) {
        Ok(())
    } else {
        Err(SchedError::InvalidArgument(format!(
            "{what} must be in [0, 1], got {share}"
        )))
    }
}

impl Scheduler {
    /// `capacity_bytes` is the node's memory for reservations (the pool
    /// quota); a "default" partition spans all of it with the whole GPU.
    pub fn new(capacity_bytes: u64, burst_ms: f64) -> Result<Self, SchedError> {
        if !(burst_ms.is_finite() && burst_ms > 0.0) {
            return Err(SchedError::InvalidArgument(format!(
                "burst_ms must be positive, got {burst_ms}"
            )));
        }
        let mut s = Self {
            burst_ms,
            partitions: BTreeMap::new(),
            tasks: FastMap::default(),
            queue: BTreeSet::new(),
            waiting: BTreeSet::new(),
            res: Reservations::new(capacity_bytes),
            tenants: BTreeMap::new(),
            next_id: 1,
            counts: Counters::default(),
            running: [0; 3],
            guard_ms: DEFAULT_GUARD_MS,
            min_idle_ms: DEFAULT_MIN_IDLE_MS,
            best_effort: None,
        };
        s.add_partition(Partition {
            name: DEFAULT_PARTITION.into(),
            memory_quota_bytes: capacity_bytes,
            bandwidth_share: 1.0,
            stream_priority: 0,
        })?;
        Ok(s)
    }

    /// Adds a named partition. Its quota may not exceed the node's capacity,
    /// and the bandwidth shares of the named partitions may not sum above 1
    /// (the default partition spans the whole node and is not counted: it is
    /// what tasks that name no partition share).
    pub fn add_partition(&mut self, p: Partition) -> Result<(), SchedError> {
        check_share("bandwidth_share", p.bandwidth_share)?;
        if p.name.is_empty() || self.partitions.contains_key(&p.name) {
            return Err(SchedError::InvalidArgument(format!(
                "partition name {:?} is empty or taken",
                p.name
            )));
        }
        if p.memory_quota_bytes > self.res.capacity {
            return Err(SchedError::InvalidArgument(format!(
                "partition {:?}: memory quota of {} bytes exceeds the scheduler's memory ({} bytes)",
                p.name, p.memory_quota_bytes, self.res.capacity
            )));
        }
        let named: f64 = self
            .partitions
            .values()
            .filter(|q| q.name != DEFAULT_PARTITION)
            .map(|q| q.bandwidth_share)
            .sum();
        if p.name != DEFAULT_PARTITION && named + p.bandwidth_share > 1.0 + SHARE_EPS {
            return Err(SchedError::InvalidArgument(format!(
                "partition {:?}: bandwidth share {} would bring the partitions' shares to {:.3}, above 1",
                p.name,
                p.bandwidth_share,
                named + p.bandwidth_share
            )));
        }
        self.partitions.insert(p.name.clone(), p);
        Ok(())
    }

    /// Sets the margin kept between a best-effort launch's expected end and
    /// the next expected Guaranteed arrival.
    pub fn set_guard_ms(&mut self, guard_ms: f64) -> Result<(), SchedError> {
        if !(guard_ms.is_finite() && guard_ms >= 0.0) {
            return Err(SchedError::InvalidArgument(format!(
                "guard_ms must be finite and >= 0, got {guard_ms}"
            )));
        }
        self.guard_ms = guard_ms;
        Ok(())
    }

    pub fn guard_ms(&self) -> f64 {
        self.guard_ms
    }

    /// Sets the least silence after which a Guaranteed tenant is idle.
    pub fn set_min_idle_ms(&mut self, min_idle_ms: f64) -> Result<(), SchedError> {
        if !(min_idle_ms.is_finite() && min_idle_ms >= 0.0) {
            return Err(SchedError::InvalidArgument(format!(
                "min_idle_ms must be finite and >= 0, got {min_idle_ms}"
            )));
        }
        self.min_idle_ms = min_idle_ms;
        Ok(())
    }

    /// Limits the GPU time best-effort launches take together to `duty` of
    /// the GPU's time (a bucket of `duty * window_ms` milliseconds, refilled
    /// at `duty`, charged with each best-effort launch's measured time);
    /// `duty` 1 lifts the limit. Best effort is otherwise work-conserving: a
    /// flood of it runs back to back whenever no Guaranteed work needs the
    /// GPU, and the GPU's power then stays at its cap. A GPU held at its
    /// power cap runs at lower clocks, and after the flood is held it takes
    /// tens of milliseconds to clock up again: every Guaranteed step in that
    /// time is slower (seen on the H200: 1400-1500 MHz instead of 1980, a
    /// decode step 44 us instead of 34). Below 1 the GPU idles between
    /// best-effort launches, which keeps its average power, and so its
    /// clock, down for the Guaranteed work that arrives next.
    pub fn set_best_effort_duty(
        &mut self,
        duty: f64,
        window_ms: f64,
        now: f64,
    ) -> Result<(), SchedError> {
        check_time(now)?;
        if !(duty > 0.0 && duty <= 1.0) {
            return Err(SchedError::InvalidArgument(format!(
                "best_effort_duty must be in (0, 1], got {duty}"
            )));
        }
        if !(window_ms.is_finite() && window_ms > 0.0) {
            return Err(SchedError::InvalidArgument(format!(
                "duty_window_ms must be positive, got {window_ms}"
            )));
        }
        self.best_effort = (duty < 1.0).then(|| Bucket::new(duty, window_ms, now));
        Ok(())
    }

    pub fn best_effort_duty(&self) -> f64 {
        self.best_effort.as_ref().map_or(1.0, Bucket::rate)
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.res.capacity
    }

    pub fn reserved_bytes(&self) -> u64 {
        self.res.reserved
    }

    pub fn submit(&mut self, spec: TaskSpec, now: f64) -> Result<Submitted, SchedError> {
        check_time(now)?;
        check_share("bandwidth_share", spec.bandwidth_share)?;
        if let Some(d) = spec.deadline_ms {
            check_time(d)?;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.counts.submitted += 1;
        let (admission, also_admitted) = match self.refusal(&spec) {
            Some(reason) => (Admission::Rejected(reason), Vec::new()),
            None => self.enqueue(id, spec, now),
        };
        match admission {
            Admission::Admitted => {}
            Admission::Queued => self.counts.queued += 1,
            Admission::Rejected(_) => self.counts.rejected += 1,
        }
        Ok(Submitted {
            id,
            admission,
            also_admitted,
        })
    }

    pub(super) fn task(&self, id: TaskId) -> Result<&Task, SchedError> {
        self.tasks.get(&id).ok_or(if id > 0 && id < self.next_id {
            SchedError::Ended(id)
        } else {
            SchedError::UnknownTask(id)
        })
    }

    pub fn state(&self, id: TaskId) -> Result<TaskState, SchedError> {
        self.task(id).map(|t| t.state)
    }

    pub(super) fn expect_state(
        &self,
        id: TaskId,
        want: &[TaskState],
        action: &'static str,
    ) -> Result<&Task, SchedError> {
        let t = self.task(id)?;
        if want.contains(&t.state) {
            Ok(t)
        } else {
            Err(SchedError::InvalidTransition {
                id,
                from: t.state.name(),
                action,
            })
        }
    }

    /// Starts an admitted task if pacing allows; returns the stream priority
    /// of its partition.
    pub fn start(&mut self, id: TaskId, now: f64) -> Result<i32, SchedError> {
        if !self.may_start(id, now)? {
            let until = self.next_start_time(id, now)?;
            return Err(SchedError::Throttled { id, until });
        }
        Ok(self.begin(id, now))
    }

    /// Starts an admitted task pacing has just let start (`pick_next` chose it,
    /// with nothing changed since): `start` without asking pacing again.
    pub(super) fn begin(&mut self, id: TaskId, now: f64) -> i32 {
        let task = self.tasks.get_mut(&id).expect("paced task");
        self.waiting.remove(&QueueKey::of(task));
        task.state = TaskState::Running;
        task.started_ms = Some(now);
        self.running[task.spec.qos as usize] += 1;
        self.counts.started += 1;
        self.partitions[&task.spec.partition].stream_priority
    }

    /// Ends a running task, charging its tenant the measured GPU time;
    /// returns the tasks admitted from the queue with the freed memory.
    pub fn complete(
        &mut self,
        id: TaskId,
        gpu_ms: f64,
        now: f64,
    ) -> Result<Vec<TaskId>, SchedError> {
        self.finish(id, gpu_ms, now, true)
    }

    /// Like `complete` for a launch that failed; the time it used is charged too.
    pub fn fail(&mut self, id: TaskId, gpu_ms: f64, now: f64) -> Result<Vec<TaskId>, SchedError> {
        self.finish(id, gpu_ms, now, false)
    }

    fn finish(
        &mut self,
        id: TaskId,
        gpu_ms: f64,
        now: f64,
        ok: bool,
    ) -> Result<Vec<TaskId>, SchedError> {
        check_time(now)?;
        if !(gpu_ms.is_finite() && gpu_ms >= 0.0) {
            return Err(SchedError::InvalidArgument(format!(
                "gpu_ms must be finite and >= 0, got {gpu_ms}"
            )));
        }
        let action = if ok { "complete" } else { "fail" };
        self.expect_state(id, &[TaskState::Running], action)?;
        let task = self.remove(id);
        let tenant = self.tenants.get_mut(&task.spec.tenant).expect("tenant");
        tenant.bucket.charge(gpu_ms, now);
        tenant.gpu_time_ms += gpu_ms;
        tenant.note_duration(gpu_ms);
        if task.spec.qos == Qos::BestEffort {
            if let Some(b) = self.best_effort.as_mut() {
                b.charge(gpu_ms, now);
            }
        }
        if ok {
            tenant.completed += 1;
            self.counts.completed += 1;
        } else {
            tenant.failed += 1;
            self.counts.failed += 1;
        }
        Ok(self.pump())
    }

    /// Withdraws a queued or admitted task. A running launch cannot be
    /// withdrawn; it ends with complete or fail once its time is measured.
    pub fn cancel(&mut self, id: TaskId) -> Result<Vec<TaskId>, SchedError> {
        self.expect_state(id, &[TaskState::Queued, TaskState::Admitted], "cancel")?;
        self.remove(id);
        self.counts.cancelled += 1;
        Ok(self.pump())
    }

    /// Takes a task out of every structure and releases what it holds.
    pub(super) fn remove(&mut self, id: TaskId) -> Task {
        let task = self.tasks.remove(&id).expect("live task");
        let key = QueueKey::of(&task);
        self.queue.remove(&key);
        self.waiting.remove(&key);
        let held = self.res.release(id);
        debug_assert_eq!(held.is_some(), task.state != TaskState::Queued);
        if task.state == TaskState::Running {
            self.running[task.spec.qos as usize] -= 1;
        }
        let tenant = self.tenants.get_mut(&task.spec.tenant).expect("tenant");
        tenant.live_tasks -= 1;
        if task.spec.qos == Qos::Guaranteed {
            tenant.guaranteed_live -= 1;
        }
        task
    }

    /// Bytes reserved by task `id` (None if it holds no reservation).
    pub fn reservation_of(&self, id: TaskId) -> Option<u64> {
        self.res.held_by(id)
    }

    /// Queued tasks in the order they will be admitted.
    pub fn queue_order(&self) -> Vec<TaskId> {
        self.queue.iter().map(|k| k.id).collect()
    }

    /// Running tasks of one QoS class.
    pub fn running_of(&self, qos: Qos) -> usize {
        self.running[qos as usize]
    }

    /// Number of tasks holding a reservation (admitted or running).
    pub fn holders(&self) -> usize {
        self.res.holders()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(name: &str, memory_quota_bytes: u64, bandwidth_share: f64) -> Partition {
        Partition {
            name: name.into(),
            memory_quota_bytes,
            bandwidth_share,
            stream_priority: 0,
        }
    }

    fn invalid(r: Result<(), SchedError>, needle: &str) {
        match r {
            Err(SchedError::InvalidArgument(msg)) => {
                assert!(msg.contains(needle), "{msg:?} does not name {needle:?}")
            }
            other => panic!("expected InvalidArgument naming {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn partition_quota_above_capacity_is_refused() {
        let mut s = Scheduler::new(1000, 50.0).unwrap();
        invalid(
            s.add_partition(part("big", 1001, 0.5)),
            "memory quota of 1001 bytes",
        );
        s.add_partition(part("whole", 1000, 0.5)).unwrap();
        assert_eq!(s.stats(None).partitions.len(), 2);
    }

    #[test]
    fn partition_shares_summing_above_one_are_refused() {
        let mut s = Scheduler::new(1000, 50.0).unwrap();
        s.add_partition(part("a", 500, 0.7)).unwrap();
        invalid(s.add_partition(part("b", 500, 0.4)), "above 1");
        // Shares that reach 1 up to rounding are fine; the default partition is not counted.
        s.add_partition(part("b", 500, 0.1 + 0.2)).unwrap();
        invalid(s.add_partition(part("c", 1, 1e-6)), "\"c\"");
        assert!(!s.stats(None).partitions.contains_key("c"));
    }

    #[test]
    fn non_finite_and_out_of_range_arguments_are_refused() {
        assert!(Scheduler::new(1, f64::INFINITY).is_err());
        assert!(Scheduler::new(1, f64::NAN).is_err());
        let mut s = Scheduler::new(1000, 50.0).unwrap();
        invalid(s.add_partition(part("n", 1, f64::NAN)), "bandwidth_share");
        invalid(s.set_guard_ms(f64::INFINITY), "guard_ms");
        invalid(s.set_min_idle_ms(f64::NAN), "min_idle_ms");
        let spec = TaskSpec {
            tenant: "t".into(),
            reservation_bytes: 1,
            qos: Qos::Burstable,
            priority: 0,
            partition: DEFAULT_PARTITION.into(),
            bandwidth_share: 1.0,
            deadline_ms: None,
        };
        assert!(s.submit(spec.clone(), f64::INFINITY).is_err());
        let mut late = spec.clone();
        late.deadline_ms = Some(f64::INFINITY);
        assert!(s.submit(late, 0.0).is_err());
        let id = s.submit(spec, 0.0).unwrap().id;
        s.start(id, 0.0).unwrap();
        assert!(s.complete(id, f64::INFINITY, 1.0).is_err());
        assert!(s.complete(id, 1.0, f64::NAN).is_err());
        assert_eq!(s.complete(id, 1.0, 1.0), Ok(vec![]));
    }
}
