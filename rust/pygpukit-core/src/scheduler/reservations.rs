//! Memory reservations held by admitted and running tasks, per node and per
//! partition. Each task holds at most one; releasing twice is an error.

use super::hasher::FastMap;
use super::task::TaskId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    Yes,
    NodeFull,
    PartitionFull,
}

#[derive(Default)]
pub struct Reservations {
    pub capacity: u64,
    pub reserved: u64,
    by_partition: FastMap<String, u64>,
    holders: FastMap<TaskId, (String, u64)>,
}

impl Reservations {
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }

    pub fn partition_reserved(&self, partition: &str) -> u64 {
        self.by_partition.get(partition).copied().unwrap_or(0)
    }

    pub fn fits(&self, partition: &str, quota: u64, bytes: u64) -> Fit {
        // The partition is checked first: a task its own partition holds back
        // must not block other partitions' tasks as a node-wide shortage would.
        if quota - self.partition_reserved(partition).min(quota) < bytes {
            Fit::PartitionFull
        } else if self.capacity - self.reserved < bytes {
            Fit::NodeFull
        } else {
            Fit::Yes
        }
    }

    /// Caller has checked `fits`; a second hold for one task is a bug.
    pub fn hold(&mut self, id: TaskId, partition: &str, bytes: u64) {
        let prev = self.holders.insert(id, (partition.to_string(), bytes));
        assert!(prev.is_none(), "task {id} reserved memory twice");
        self.reserved += bytes;
        *self.by_partition.entry(partition.to_string()).or_default() += bytes;
    }

    /// Returns the bytes released, or None if the task held nothing (so a
    /// second release cannot subtract again).
    pub fn release(&mut self, id: TaskId) -> Option<u64> {
        let (partition, bytes) = self.holders.remove(&id)?;
        self.reserved -= bytes;
        let p = self
            .by_partition
            .get_mut(&partition)
            .expect("held partition");
        *p -= bytes;
        Some(bytes)
    }

    pub fn held_by(&self, id: TaskId) -> Option<u64> {
        self.holders.get(&id).map(|&(_, b)| b)
    }

    pub fn holders(&self) -> usize {
        self.holders.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_and_release_once() {
        let mut r = Reservations::new(100);
        assert_eq!(r.fits("a", 50, 60), Fit::PartitionFull);
        assert_eq!(r.fits("a", 200, 101), Fit::NodeFull);
        assert_eq!(r.fits("a", 50, 101), Fit::PartitionFull);
        r.hold(1, "a", 40);
        r.hold(2, "b", 50);
        assert_eq!(r.fits("a", 50, 11), Fit::PartitionFull);
        assert_eq!(r.fits("c", 50, 11), Fit::NodeFull);
        assert_eq!(r.release(1), Some(40));
        assert_eq!(r.release(1), None);
        assert_eq!((r.reserved, r.partition_reserved("a")), (50, 0));
    }
}
