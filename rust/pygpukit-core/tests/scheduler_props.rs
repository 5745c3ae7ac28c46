use std::collections::BTreeMap;

use proptest::prelude::*;
use pygpukit_core::scheduler::{
    Admission, Pace, Partition, Qos, SchedError, Scheduler, TaskId, TaskSpec, TaskState,
};

const CAPACITY: u64 = 1000;
const PARTS: [(&str, u64); 3] = [("default", CAPACITY), ("p1", 400), ("p2", 700)];

#[derive(Clone, Debug)]
enum Op {
    Submit {
        tenant: u8,
        bytes: u64,
        qos: Qos,
        priority: i32,
        part: usize,
        share: f64,
    },
    Start(usize),
    Complete(usize, f64),
    Fail(usize, f64),
    Cancel(usize),
    MayStart(usize),
    PickAndStart,
    Advance(f64),
}

fn qos() -> impl Strategy<Value = Qos> {
    prop_oneof![
        Just(Qos::Guaranteed),
        Just(Qos::Burstable),
        Just(Qos::BestEffort)
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..4, 0u64..800, qos(), -2i32..3, 0usize..3, 0.0f64..=1.0).prop_map(
            |(tenant, bytes, qos, priority, part, share)| Op::Submit {
                tenant,
                bytes,
                qos,
                priority,
                part,
                share: share / 2.0,
            }
        ),
        3 => any::<usize>().prop_map(Op::Start),
        2 => (any::<usize>(), 0.0f64..20.0).prop_map(|(i, ms)| Op::Complete(i, ms)),
        1 => (any::<usize>(), 0.0f64..20.0).prop_map(|(i, ms)| Op::Fail(i, ms)),
        2 => any::<usize>().prop_map(Op::Cancel),
        1 => any::<usize>().prop_map(Op::MayStart),
        2 => Just(Op::PickAndStart),
        2 => (0.0f64..30.0).prop_map(Op::Advance),
    ]
}

/// The model: what each live task holds, as learned from the scheduler's answers.
struct Model {
    live: BTreeMap<TaskId, (TaskState, u64, usize)>,
    qos: BTreeMap<TaskId, Qos>,
    ended: Vec<TaskId>,
    /// Submissions admitted, queued, rejected; admissions from the queue.
    counts: [u64; 4],
}

impl Model {
    fn pick(&self, i: usize) -> Option<TaskId> {
        let ids: Vec<_> = self.live.keys().chain(self.ended.iter()).copied().collect();
        (!ids.is_empty()).then(|| ids[i % ids.len()])
    }

    fn admitted(&mut self, ids: &[TaskId]) -> Result<(), TestCaseError> {
        for id in ids {
            let t = self
                .live
                .get_mut(id)
                .expect("admitted a task the model lacks");
            prop_assert_eq!(t.0, TaskState::Queued, "task {} admitted twice", id);
            t.0 = TaskState::Admitted;
            self.counts[3] += 1;
        }
        Ok(())
    }

    /// A best-effort launch never starts next to Guaranteed work waiting or
    /// running, nor next to another best-effort launch: it could not be
    /// taken back from the GPU.
    fn check_start(&self, id: TaskId) -> Result<(), TestCaseError> {
        if self.qos[&id] != Qos::BestEffort {
            return Ok(());
        }
        for (other, (state, _, _)) in &self.live {
            let q = self.qos[other];
            if *other == id || *state == TaskState::Queued {
                continue;
            }
            prop_assert!(
                q != Qos::Guaranteed,
                "best effort {} started beside guaranteed {}",
                id,
                other
            );
            prop_assert!(
                !(q == Qos::BestEffort && *state == TaskState::Running),
                "best effort {} started beside running best effort {}",
                id,
                other
            );
        }
        Ok(())
    }

    fn end(&mut self, id: TaskId) {
        self.live.remove(&id);
        self.ended.push(id);
    }
}

fn check(s: &Scheduler, m: &Model) -> Result<(), TestCaseError> {
    let held = |part: Option<usize>| -> u64 {
        m.live
            .values()
            .filter(|(st, _, p)| *st != TaskState::Queued && part.is_none_or(|q| q == *p))
            .map(|(_, b, _)| b)
            .sum()
    };
    prop_assert_eq!(s.reserved_bytes(), held(None));
    prop_assert!(s.reserved_bytes() <= CAPACITY);
    let st = s.stats(None);
    for (i, (name, quota)) in PARTS.iter().enumerate() {
        let r = st.partitions[*name].reserved_bytes;
        prop_assert_eq!(r, held(Some(i)));
        prop_assert!(r <= *quota);
    }
    prop_assert_eq!(st.tasks.len(), m.live.len());
    for (id, (state, bytes, _)) in &m.live {
        prop_assert_eq!(s.state(*id).unwrap(), *state);
        let expect = (*state != TaskState::Queued).then_some(*bytes);
        prop_assert_eq!(s.reservation_of(*id), expect);
    }
    for id in &m.ended {
        prop_assert_eq!(s.state(*id), Err(SchedError::Ended(*id)));
        prop_assert_eq!(s.reservation_of(*id), None);
    }
    let c = &st.counts;
    prop_assert_eq!(
        (c.admitted, c.queued, c.rejected),
        (m.counts[0] + m.counts[3], m.counts[1], m.counts[2])
    );
    // Work conservation: the head of the queue does not fit, or pump would have admitted it.
    if let Some(&head) = s.queue_order().first() {
        let (_, bytes, part) = m.live[&head];
        let p = &st.partitions[PARTS[part].0];
        let fits_node = s.reserved_bytes() + bytes <= CAPACITY;
        let fits_part = p.reserved_bytes + bytes <= p.memory_quota_bytes;
        prop_assert!(!(fits_node && fits_part), "queued head {} fits", head);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn reservations_always_match_live_tasks(ops in prop::collection::vec(op(), 1..150)) {
        let mut s = Scheduler::new(CAPACITY, 25.0).unwrap();
        for (name, quota) in &PARTS[1..] {
            s.add_partition(Partition {
                name: name.to_string(),
                memory_quota_bytes: *quota,
                bandwidth_share: 0.5,
                stream_priority: -1,
            }).unwrap();
        }
        let mut m = Model { live: BTreeMap::new(), qos: BTreeMap::new(), ended: Vec::new(), counts: [0; 4] };
        let mut now = 0.0;
        for op in ops {
            let before = s.reserved_bytes();
            match op {
                Op::Submit { tenant, bytes, qos, priority, part, share } => {
                    let spec = TaskSpec {
                        tenant: format!("t{tenant}"),
                        reservation_bytes: bytes,
                        qos,
                        priority,
                        partition: PARTS[part].0.into(),
                        bandwidth_share: share,
                        deadline_ms: None,
                    };
                    let r = s.submit(spec, now).unwrap();
                    m.qos.insert(r.id, qos);
                    m.admitted(&r.also_admitted)?;
                    let gained: u64 = r.also_admitted.iter().map(|a| m.live[a].1).sum();
                    let before = before + gained;
                    match r.admission {
                        Admission::Admitted => {
                            m.counts[0] += 1;
                            m.live.insert(r.id, (TaskState::Admitted, bytes, part));
                            prop_assert_eq!(s.reserved_bytes(), before + bytes);
                        }
                        Admission::Queued => {
                            prop_assert!(qos != Qos::Guaranteed, "guaranteed work never queues");
                            m.counts[1] += 1;
                            m.live.insert(r.id, (TaskState::Queued, bytes, part));
                            prop_assert_eq!(s.reserved_bytes(), before);
                        }
                        Admission::Rejected(reason) => {
                            prop_assert!(!reason.is_empty());
                            m.counts[2] += 1;
                            let name = format!("t{tenant}");
                            let tenant_live = s.stats(None).tenants.get(&name).is_some_and(|t| t.live_tasks > 0);
                            prop_assert!(bytes > PARTS[part].1 || qos == Qos::Guaranteed || tenant_live);
                            m.ended.push(r.id);
                            prop_assert_eq!(s.reserved_bytes(), before);
                        }
                    }
                }
                Op::Start(i) | Op::MayStart(i) if m.pick(i).is_none() => {}
                Op::Start(i) => {
                    let id = m.pick(i).unwrap();
                    let state = m.live.get(&id).map(|t| t.0);
                    match s.start(id, now) {
                        Ok(_) => {
                            prop_assert_eq!(state, Some(TaskState::Admitted));
                            m.check_start(id)?;
                            m.live.get_mut(&id).unwrap().0 = TaskState::Running;
                        }
                        Err(SchedError::Throttled { .. }) => {
                            prop_assert_eq!(state, Some(TaskState::Admitted));
                        }
                        Err(_) => prop_assert_ne!(state, Some(TaskState::Admitted)),
                    }
                    prop_assert_eq!(s.reserved_bytes(), before);
                }
                Op::MayStart(i) => {
                    let id = m.pick(i).unwrap();
                    let admitted = m.live.get(&id).map(|t| t.0) == Some(TaskState::Admitted);
                    prop_assert_eq!(s.may_start(id, now).is_ok(), admitted);
                    if admitted {
                        let pace_ok = s.may_start(id, now).unwrap();
                        prop_assert_eq!(s.next_start_time(id, now).unwrap() == Some(now), pace_ok);
                    }
                }
                Op::PickAndStart => {
                    let admitted: Vec<TaskId> = m.live.iter()
                        .filter(|(_, t)| t.0 == TaskState::Admitted).map(|(id, _)| *id).collect();
                    let startable: Vec<TaskId> = admitted.iter().copied()
                        .filter(|&id| s.pace(id, now) == Ok(Pace::Start)).collect();
                    let picked = s.pick_next(now).unwrap();
                    // pick_next picks a task pace lets start, and one if any may.
                    prop_assert_eq!(picked.is_some(), !startable.is_empty());
                    if let Some(id) = picked {
                        prop_assert!(startable.contains(&id));
                        // Nothing startable outranks it on QoS among tasks within share.
                        let st = s.stats(Some(now));
                        let within = |t: TaskId| {
                            let ten = &st.tenants[&st.tasks[&t].tenant];
                            ten.share > 0.0 && ten.tokens_ms >= -1e-9
                        };
                        for &o in &startable {
                            if within(o) == within(id) {
                                prop_assert!(m.qos[&o] >= m.qos[&id], "{} outranks {}", o, id);
                            }
                            prop_assert!(within(id) || !within(o), "borrower {} before {}", id, o);
                        }
                    }
                    let r = s.pick_and_start(now).unwrap();
                    prop_assert_eq!(r.map(|x| x.0), picked);
                    if let Some((id, _)) = r {
                        m.check_start(id)?;
                        m.live.get_mut(&id).unwrap().0 = TaskState::Running;
                    }
                    if let Some(t) = s.next_wakeup(now).unwrap() {
                        prop_assert!(t > now);
                    }
                }
                Op::Complete(i, ms) | Op::Fail(i, ms) => {
                    let Some(id) = m.pick(i) else { continue };
                    let state = m.live.get(&id).map(|t| t.0);
                    let res = if matches!(op, Op::Complete(..)) { s.complete(id, ms, now) } else { s.fail(id, ms, now) };
                    match res {
                        Ok(admitted) => {
                            prop_assert_eq!(state, Some(TaskState::Running));
                            let bytes = m.live[&id].1;
                            m.end(id);
                            m.admitted(&admitted)?;
                            let gained: u64 = admitted.iter().map(|a| m.live[a].1).sum();
                            prop_assert_eq!(s.reserved_bytes(), before - bytes + gained);
                        }
                        Err(_) => {
                            prop_assert_ne!(state, Some(TaskState::Running));
                            prop_assert_eq!(s.reserved_bytes(), before);
                        }
                    }
                }
                Op::Cancel(i) => {
                    let Some(id) = m.pick(i) else { continue };
                    let state = m.live.get(&id).map(|t| t.0);
                    match s.cancel(id) {
                        Ok(admitted) => {
                            prop_assert!(matches!(state, Some(TaskState::Queued | TaskState::Admitted)));
                            m.end(id);
                            m.admitted(&admitted)?;
                        }
                        Err(_) => prop_assert!(matches!(state, None | Some(TaskState::Running))),
                    }
                }
                Op::Advance(dt) => now += dt,
            }
            check(&s, &m)?;
        }
        // End everything: running tasks complete, the rest are cancelled.
        let ids: Vec<_> = m.live.keys().copied().collect();
        for id in ids {
            if !m.live.contains_key(&id) {
                continue;
            }
            let admitted = match m.live[&id].0 {
                TaskState::Running => s.complete(id, 1.0, now).unwrap(),
                _ => s.cancel(id).unwrap(),
            };
            m.end(id);
            m.admitted(&admitted)?;
            check(&s, &m)?;
        }
        // Tasks admitted during the drain are ended too.
        while let Some((&id, _)) = m.live.iter().next() {
            let admitted = s.cancel(id).unwrap();
            m.end(id);
            m.admitted(&admitted)?;
        }
        check(&s, &m)?;
        let st = s.stats(None);
        prop_assert_eq!(s.reserved_bytes(), 0);
        prop_assert_eq!(s.holders(), 0);
        prop_assert_eq!((st.queue_length, st.waiting, st.running), (0, 0, 0));
        prop_assert!(st.tenants.values().all(|t| t.live_tasks == 0));
    }
}
