//! What a task is: one launch of a compiled graph, and the state it is in.

use std::cmp::Ordering;

pub type TaskId = u64;

/// Quality of service, declared best first: the derived order is the
/// admission and borrowing order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    pub fn name(self) -> &'static str {
        match self {
            Qos::Guaranteed => "guaranteed",
            Qos::Burstable => "burstable",
            Qos::BestEffort => "best_effort",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        // The scheduler passes the canonical names on every submission: matched
        // without the two allocations the normalising below makes.
        match s {
            "guaranteed" => return Some(Qos::Guaranteed),
            "burstable" => return Some(Qos::Burstable),
            "best_effort" => return Some(Qos::BestEffort),
            _ => {}
        }
        match s.to_ascii_lowercase().replace(['-', ' '], "_").as_str() {
            "guaranteed" => Some(Qos::Guaranteed),
            "burstable" => Some(Qos::Burstable),
            "best_effort" | "besteffort" => Some(Qos::BestEffort),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TaskSpec {
    pub tenant: String,
    /// Bytes the launch needs (its planned arena), held from admission to end.
    pub reservation_bytes: u64,
    pub qos: Qos,
    /// Higher runs first within a QoS class.
    pub priority: i32,
    pub partition: String,
    /// The tenant's fraction of its partition's GPU time, in [0, 1].
    pub bandwidth_share: f64,
    /// Absolute time (ms, the caller's clock); earlier deadlines go first
    /// among tasks of equal QoS and priority.
    pub deadline_ms: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Waiting for memory.
    Queued,
    /// Holds its reservation; waiting to start (pacing decides when).
    Admitted,
    Running,
}

impl TaskState {
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Admitted => "admitted",
            TaskState::Running => "running",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Task {
    pub id: TaskId,
    pub spec: TaskSpec,
    pub state: TaskState,
    /// Set once pacing has held this task back, so throttles count tasks,
    /// not polls.
    pub throttled: bool,
    /// Likewise for holds that keep best-effort work off the GPU for
    /// Guaranteed work.
    pub held: bool,
    /// Likewise for holds by the best-effort duty limit.
    pub duty_held: bool,
    pub started_ms: Option<f64>,
}

/// Admission order: QoS, then priority (high first), then deadline (earliest
/// first, none last), then submission order.
#[derive(Clone, Copy, Debug)]
pub struct QueueKey {
    pub qos: Qos,
    pub priority: i32,
    pub deadline_ms: Option<f64>,
    pub id: TaskId,
}

impl QueueKey {
    pub fn of(t: &Task) -> Self {
        Self {
            qos: t.spec.qos,
            priority: t.spec.priority,
            deadline_ms: t.spec.deadline_ms,
            id: t.id,
        }
    }
}

impl Ord for QueueKey {
    fn cmp(&self, other: &Self) -> Ordering {
        let deadline = match (self.deadline_ms, other.deadline_ms) {
            (Some(a), Some(b)) => a.total_cmp(&b),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        };
        self.qos
            .cmp(&other.qos)
            .then(other.priority.cmp(&self.priority))
            .then(deadline)
            .then(self.id.cmp(&other.id))
    }
}

impl PartialOrd for QueueKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for QueueKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for QueueKey {}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(qos: Qos, priority: i32, deadline_ms: Option<f64>, id: TaskId) -> QueueKey {
        QueueKey {
            qos,
            priority,
            deadline_ms,
            id,
        }
    }

    #[test]
    fn order_is_qos_priority_deadline_fifo() {
        let mut keys = [
            key(Qos::BestEffort, 9, Some(1.0), 1),
            key(Qos::Burstable, 0, None, 2),
            key(Qos::Burstable, 0, Some(5.0), 3),
            key(Qos::Burstable, 3, None, 4),
            key(Qos::Guaranteed, -5, None, 5),
            key(Qos::Burstable, 0, None, 0),
        ];
        keys.sort();
        let ids: Vec<_> = keys.iter().map(|k| k.id).collect();
        assert_eq!(ids, [5, 4, 3, 0, 2, 1]);
    }

    #[test]
    fn qos_names_round_trip() {
        for q in [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort] {
            assert_eq!(Qos::parse(q.name()), Some(q));
        }
        assert_eq!(Qos::parse("Best-Effort"), Some(Qos::BestEffort));
        assert_eq!(Qos::parse("gold"), None);
    }
}
