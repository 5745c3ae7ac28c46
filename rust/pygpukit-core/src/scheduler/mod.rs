//! Scheduler core: admission of compiled-graph launches against node and
//! partition memory, their lifecycle, and pacing of tenants by measured GPU
//! time. Time is always passed in (milliseconds on the caller's clock), so
//! the same code runs against a real GPU or a simulated one.

mod error;
mod pacing;
mod partition;
mod reservations;
mod stats;
mod task;
mod tenant;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

pub use error::SchedError;
pub use partition::Partition;
pub use stats::{Counters, PartitionStats, SchedStats, TaskStats, TenantStats};
pub use task::{Qos, TaskId, TaskSpec, TaskState};

use reservations::{Fit, Reservations};
use task::{QueueKey, Task};
use tenant::Tenant;

pub const DEFAULT_PARTITION: &str = "default";
pub const DEFAULT_BURST_MS: f64 = 50.0;

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
    tasks: HashMap<TaskId, Task>,
    /// Tasks waiting for memory, in admission order.
    queue: BTreeSet<QueueKey>,
    /// Admitted tasks waiting to start, in the same order.
    waiting: BTreeSet<QueueKey>,
    res: Reservations,
    tenants: BTreeMap<String, Tenant>,
    next_id: TaskId,
    counts: Counters,
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
            tasks: HashMap::new(),
            queue: BTreeSet::new(),
            waiting: BTreeSet::new(),
            res: Reservations::new(capacity_bytes),
            tenants: BTreeMap::new(),
            next_id: 1,
            counts: Counters::default(),
        };
        s.add_partition(Partition {
            name: DEFAULT_PARTITION.into(),
            memory_quota_bytes: capacity_bytes,
            bandwidth_share: 1.0,
            stream_priority: 0,
        })?;
        Ok(s)
    }

    pub fn add_partition(&mut self, p: Partition) -> Result<(), SchedError> {
        check_share("bandwidth_share", p.bandwidth_share)?;
        if p.name.is_empty() || self.partitions.contains_key(&p.name) {
            return Err(SchedError::InvalidArgument(format!(
                "partition name {:?} is empty or taken",
                p.name
            )));
        }
        self.partitions.insert(p.name.clone(), p);
        Ok(())
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

    /// Why a task can never be admitted as asked, if so.
    fn refusal(&self, spec: &TaskSpec) -> Option<String> {
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

    fn enqueue(&mut self, id: TaskId, spec: TaskSpec, now: f64) -> (Admission, Vec<TaskId>) {
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
        }
        let task = Task {
            id,
            spec,
            state: TaskState::Queued,
            throttled: false,
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
    fn pump(&mut self) -> Vec<TaskId> {
        let mut blocked: HashSet<&str> = HashSet::new();
        let mut admit = Vec::new();
        let mut extra: HashMap<&str, u64> = HashMap::new();
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

    fn task(&self, id: TaskId) -> Result<&Task, SchedError> {
        self.tasks.get(&id).ok_or(if id > 0 && id < self.next_id {
            SchedError::Ended(id)
        } else {
            SchedError::UnknownTask(id)
        })
    }

    pub fn state(&self, id: TaskId) -> Result<TaskState, SchedError> {
        self.task(id).map(|t| t.state)
    }

    fn expect_state(
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

    /// Whether pacing lets an admitted task start at `now`. A tenant within
    /// its share may start, except that a waiting Guaranteed tenant within
    /// its share goes first. A tenant over its share only borrows time no
    /// one else is entitled to: it waits while another tenant within share
    /// has a task waiting, and BestEffort also waits while any Guaranteed or
    /// Burstable task of another tenant waits.
    pub fn pace(&self, id: TaskId, now: f64) -> Result<Pace, SchedError> {
        check_time(now)?;
        let task = self.expect_state(id, &[TaskState::Admitted], "pace")?;
        let bucket = &self.tenants[&task.spec.tenant].bucket;
        let mine = bucket.within_share(now);
        let contended = self.waiting.iter().any(|k| {
            let other = &self.tasks[&k.id].spec;
            if other.tenant == task.spec.tenant {
                return false;
            }
            let theirs = self.tenants[&other.tenant].bucket.within_share(now);
            if mine {
                theirs && other.qos == Qos::Guaranteed && task.spec.qos != Qos::Guaranteed
            } else {
                theirs || (task.spec.qos == Qos::BestEffort && other.qos != Qos::BestEffort)
            }
        });
        Ok(if !contended {
            Pace::Start
        } else if mine {
            Pace::Wait { until: None }
        } else {
            Pace::Wait {
                until: bucket.ready_at(now),
            }
        })
    }

    /// `pace`, counting the task as throttled the first time it is held back.
    pub fn may_start(&mut self, id: TaskId, now: f64) -> Result<bool, SchedError> {
        let pace = self.pace(id, now)?;
        if pace != Pace::Start {
            self.note_throttled(id);
        }
        Ok(pace == Pace::Start)
    }

    /// When the task may start: `now` if it may, the time its tenant is back
    /// within share, or None when that depends on other tasks only.
    pub fn next_start_time(&self, id: TaskId, now: f64) -> Result<Option<f64>, SchedError> {
        Ok(match self.pace(id, now)? {
            Pace::Start => Some(now),
            Pace::Wait { until } => until,
        })
    }

    fn note_throttled(&mut self, id: TaskId) {
        let task = self.tasks.get_mut(&id).expect("paced task");
        if !task.throttled {
            task.throttled = true;
            self.counts.throttled += 1;
            let tenant = self.tenants.get_mut(&task.spec.tenant).expect("tenant");
            tenant.throttled_tasks += 1;
        }
    }

    /// The admitted task to start next, if any may start: tasks within their
    /// tenant's share before borrowers, then by QoS, then the tenant least
    /// overdrawn relative to its share (weighted fairness), then admission order.
    pub fn pick_next(&self, now: f64) -> Result<Option<TaskId>, SchedError> {
        check_time(now)?;
        let mut best: Option<((bool, Qos, f64, QueueKey), TaskId)> = None;
        for key in &self.waiting {
            if self.pace(key.id, now)? != Pace::Start {
                continue;
            }
            let spec = &self.tasks[&key.id].spec;
            let bucket = &self.tenants[&spec.tenant].bucket;
            let credit = if bucket.rate() > 0.0 {
                bucket.tokens_at(now) / bucket.rate()
            } else {
                f64::NEG_INFINITY
            };
            let rank = (!bucket.within_share(now), spec.qos, -credit, *key);
            let better = match &best {
                None => true,
                Some((b, _)) => (rank.0, rank.1)
                    .cmp(&(b.0, b.1))
                    .then(rank.2.total_cmp(&b.2))
                    .then(rank.3.cmp(&b.3))
                    .is_lt(),
            };
            if better {
                best = Some((rank, key.id));
            }
        }
        Ok(best.map(|(_, id)| id))
    }

    /// Starts an admitted task if pacing allows; returns the stream priority
    /// of its partition.
    pub fn start(&mut self, id: TaskId, now: f64) -> Result<i32, SchedError> {
        let pace = self.pace(id, now)?;
        if let Pace::Wait { until } = pace {
            self.note_throttled(id);
            return Err(SchedError::Throttled { id, until });
        }
        let task = self.tasks.get_mut(&id).expect("paced task");
        self.waiting.remove(&QueueKey::of(task));
        task.state = TaskState::Running;
        task.started_ms = Some(now);
        self.counts.started += 1;
        Ok(self.partitions[&task.spec.partition].stream_priority)
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
    fn remove(&mut self, id: TaskId) -> Task {
        let task = self.tasks.remove(&id).expect("live task");
        let key = QueueKey::of(&task);
        self.queue.remove(&key);
        self.waiting.remove(&key);
        let held = self.res.release(id);
        debug_assert_eq!(held.is_some(), task.state != TaskState::Queued);
        let tenant = self.tenants.get_mut(&task.spec.tenant).expect("tenant");
        tenant.live_tasks -= 1;
        if task.spec.qos == Qos::Guaranteed {
            tenant.guaranteed_live -= 1;
        }
        task
    }

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
            tasks,
            tenants,
            partitions,
        }
    }

    /// Bytes reserved by task `id` (None if it holds no reservation).
    pub fn reservation_of(&self, id: TaskId) -> Option<u64> {
        self.res.held_by(id)
    }

    /// Queued tasks in the order they will be admitted.
    pub fn queue_order(&self) -> Vec<TaskId> {
        self.queue.iter().map(|k| k.id).collect()
    }

    /// Number of tasks holding a reservation (admitted or running).
    pub fn holders(&self) -> usize {
        self.res.holders()
    }
}
