//! Dispatch: which admitted task may start now, by tenant share and QoS.

use super::task::QueueKey;
use super::{check_time, Pace, Qos, SchedError, Scheduler, TaskId, TaskState};

impl Scheduler {
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

    pub(super) fn note_throttled(&mut self, id: TaskId) {
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
}
