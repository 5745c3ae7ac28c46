//! Placement across devices: each device has its own scheduler core, and a
//! task is placed on a device whose core has room for it. The room is the
//! core's own answer, so admission stays the core's decision per device.

use super::{Scheduler, TaskState};

impl Scheduler {
    /// The largest reservation in `partition` that this core could admit now
    /// without overtaking anyone: the node's free memory and the partition's
    /// free quota, each less what queued tasks already wait for (they go
    /// first). None: no such partition.
    pub fn headroom(&self, partition: &str) -> Option<u64> {
        let part = self.partitions.get(partition)?;
        let mut node_queued: u64 = 0;
        let mut part_queued: u64 = 0;
        for t in self.tasks.values() {
            if t.state == TaskState::Queued {
                node_queued = node_queued.saturating_add(t.spec.reservation_bytes);
                if t.spec.partition == partition {
                    part_queued = part_queued.saturating_add(t.spec.reservation_bytes);
                }
            }
        }
        let node = (self.res.capacity - self.res.reserved).saturating_sub(node_queued);
        let part_free = part
            .memory_quota_bytes
            .saturating_sub(self.res.partition_reserved(partition))
            .saturating_sub(part_queued);
        Some(node.min(part_free))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Admission, Partition, Qos, TaskSpec, DEFAULT_PARTITION};
    use super::*;

    fn spec(bytes: u64, partition: &str) -> TaskSpec {
        TaskSpec {
            tenant: "t".into(),
            reservation_bytes: bytes,
            qos: Qos::Burstable,
            priority: 0,
            partition: partition.into(),
            bandwidth_share: 1.0,
            deadline_ms: None,
        }
    }

    #[test]
    fn headroom_is_free_memory_less_what_waits() {
        let mut s = Scheduler::new(1000, 50.0).unwrap();
        assert_eq!(s.headroom(DEFAULT_PARTITION), Some(1000));
        assert_eq!(s.headroom("nope"), None);
        let a = s.submit(spec(600, DEFAULT_PARTITION), 0.0).unwrap();
        assert!(matches!(a.admission, Admission::Admitted));
        assert_eq!(s.headroom(DEFAULT_PARTITION), Some(400));
        // 500 does not fit: it queues, and what it waits for is not room for others.
        let b = s.submit(spec(500, DEFAULT_PARTITION), 0.0).unwrap();
        assert!(matches!(b.admission, Admission::Queued));
        assert_eq!(s.headroom(DEFAULT_PARTITION), Some(0));
        // The first ends: the queued one is admitted, 500 stays free.
        let admitted = s.cancel(a.id).unwrap();
        assert_eq!(admitted, vec![b.id]);
        assert_eq!(s.headroom(DEFAULT_PARTITION), Some(500));
    }

    #[test]
    fn headroom_is_bounded_by_the_partition_quota() {
        let mut s = Scheduler::new(1000, 50.0).unwrap();
        s.add_partition(Partition {
            name: "small".into(),
            memory_quota_bytes: 300,
            bandwidth_share: 0.5,
            stream_priority: 0,
        })
        .unwrap();
        assert_eq!(s.headroom("small"), Some(300));
        let a = s.submit(spec(200, "small"), 0.0).unwrap();
        assert!(matches!(a.admission, Admission::Admitted));
        assert_eq!(s.headroom("small"), Some(100));
        assert_eq!(s.headroom(DEFAULT_PARTITION), Some(800));
    }
}
