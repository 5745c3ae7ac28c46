use pygpukit_core::scheduler::{
    Admission, Pace, Partition, Qos, SchedError, Scheduler, TaskId, TaskSpec, TaskState,
};

const MIB: u64 = 1 << 20;

fn spec(tenant: &str, bytes: u64, qos: Qos) -> TaskSpec {
    TaskSpec {
        tenant: tenant.into(),
        reservation_bytes: bytes,
        qos,
        priority: 0,
        partition: "default".into(),
        bandwidth_share: 1.0,
        deadline_ms: None,
    }
}

fn share(mut s: TaskSpec, share: f64) -> TaskSpec {
    s.bandwidth_share = share;
    s
}

fn submit(s: &mut Scheduler, spec: TaskSpec) -> (TaskId, Admission) {
    let r = s.submit(spec, 0.0).unwrap();
    (r.id, r.admission)
}

#[test]
fn admission_queues_and_admits_in_qos_priority_fifo_order() {
    let mut s = Scheduler::new(100 * MIB, 50.0).unwrap();
    let (a, adm) = submit(&mut s, spec("a", 60 * MIB, Qos::Burstable));
    assert_eq!(adm, Admission::Admitted);
    let (b, adm) = submit(&mut s, spec("b", 50 * MIB, Qos::BestEffort));
    assert_eq!(adm, Admission::Queued);
    let mut hi = spec("c", 30 * MIB, Qos::Burstable);
    hi.priority = 5;
    let (c, _) = submit(&mut s, hi.clone());
    let (d, _) = submit(&mut s, spec("d", 10 * MIB, Qos::Burstable));
    // c (priority 5) fits in the 40 MiB left and goes ahead; d fits after it.
    assert_eq!(s.state(c), Ok(TaskState::Admitted));
    assert_eq!(s.state(d), Ok(TaskState::Admitted));
    assert_eq!(s.state(b), Ok(TaskState::Queued));
    assert_eq!(s.reserved_bytes(), 100 * MIB);
    s.start(a, 0.0).unwrap();
    assert_eq!(s.complete(a, 1.0, 1.0), Ok(vec![b]));
    assert_eq!(s.reserved_bytes(), 90 * MIB);
    let st = s.stats(None);
    assert_eq!(
        (st.counts.admitted, st.counts.queued, st.counts.rejected),
        (4, 1, 0)
    );
    assert_eq!(st.tasks[&b].reservation_bytes, 50 * MIB);
}

#[test]
fn node_blocked_head_is_not_starved_by_smaller_tasks() {
    let mut s = Scheduler::new(100 * MIB, 50.0).unwrap();
    let (a, _) = submit(&mut s, spec("a", 70 * MIB, Qos::Burstable));
    let (big, adm) = submit(&mut s, spec("b", 80 * MIB, Qos::Burstable));
    assert_eq!(adm, Admission::Queued);
    let (small, adm) = submit(&mut s, spec("c", 10 * MIB, Qos::Burstable));
    assert_eq!(
        adm,
        Admission::Queued,
        "would jump ahead of the blocked head"
    );
    s.cancel(a).unwrap();
    assert_eq!(s.state(big), Ok(TaskState::Admitted));
    assert_eq!(s.state(small), Ok(TaskState::Admitted));
}

#[test]
fn guaranteed_is_admitted_or_rejected_never_queued() {
    let mut s = Scheduler::new(100 * MIB, 50.0).unwrap();
    let (_, adm) = submit(&mut s, share(spec("g", 70 * MIB, Qos::Guaranteed), 0.5));
    assert_eq!(adm, Admission::Admitted);
    let (g2, adm) = submit(&mut s, share(spec("g2", 40 * MIB, Qos::Guaranteed), 0.5));
    let Admission::Rejected(reason) = adm else {
        panic!("expected rejection")
    };
    assert!(
        reason.contains("30 MiB free") || reason.contains("31457280 free"),
        "{reason}"
    );
    assert_eq!(s.state(g2), Err(SchedError::Ended(g2)));
    assert_eq!(s.reserved_bytes(), 70 * MIB);
    assert_eq!(s.stats(None).tenants["g2"].live_tasks, 0);
}

#[test]
fn partition_limits_and_reasons() {
    let mut s = Scheduler::new(100 * MIB, 50.0).unwrap();
    s.add_partition(Partition {
        name: "small".into(),
        memory_quota_bytes: 20 * MIB,
        bandwidth_share: 0.5,
        stream_priority: -2,
    })
    .unwrap();
    assert!(s
        .add_partition(Partition {
            name: "small".into(),
            memory_quota_bytes: 1,
            bandwidth_share: 0.5,
            stream_priority: 0,
        })
        .is_err());
    let mut p = spec("t", 30 * MIB, Qos::Burstable);
    p.partition = "small".into();
    let (_, adm) = submit(&mut s, p.clone());
    assert!(matches!(adm, Admission::Rejected(r) if r.contains("quota of partition \"small\"")));
    p.reservation_bytes = 15 * MIB;
    let (x, adm) = submit(&mut s, p.clone());
    assert_eq!(adm, Admission::Admitted);
    let (y, adm) = submit(&mut s, p.clone());
    assert_eq!(
        adm,
        Admission::Queued,
        "partition full though the node has room"
    );
    // The partition-blocked task does not hold back another partition.
    let (z, adm) = submit(&mut s, spec("u", 50 * MIB, Qos::BestEffort));
    assert_eq!(adm, Admission::Admitted);
    assert_eq!(s.start(x, 0.0), Ok(-2));
    assert_eq!(s.complete(x, 2.0, 2.0), Ok(vec![y]));
    let st = s.stats(None);
    assert_eq!(st.partitions["small"].reserved_bytes, 15 * MIB);
    assert_eq!(st.tenants["t"].share, 0.5);
    let mut q = spec("v", 1, Qos::Burstable);
    q.partition = "nope".into();
    assert!(
        matches!(submit(&mut s, q).1, Admission::Rejected(r) if r.contains("unknown partition"))
    );
    let (_, adm) = submit(&mut s, spec("w", 101 * MIB, Qos::BestEffort));
    assert!(matches!(adm, Admission::Rejected(_)));
    s.cancel(z).unwrap();
}

#[test]
fn invalid_transitions_are_errors() {
    let mut s = Scheduler::new(10 * MIB, 50.0).unwrap();
    let (a, _) = submit(&mut s, spec("a", 8 * MIB, Qos::Burstable));
    let (b, _) = submit(&mut s, spec("b", 8 * MIB, Qos::Burstable));
    assert!(matches!(
        s.start(b, 0.0),
        Err(SchedError::InvalidTransition { .. })
    ));
    assert!(matches!(
        s.complete(a, 1.0, 0.0),
        Err(SchedError::InvalidTransition { .. })
    ));
    s.start(a, 0.0).unwrap();
    assert!(matches!(
        s.start(a, 0.0),
        Err(SchedError::InvalidTransition { .. })
    ));
    assert!(matches!(
        s.cancel(a),
        Err(SchedError::InvalidTransition { .. })
    ));
    assert!(matches!(
        s.complete(a, -1.0, 0.0),
        Err(SchedError::InvalidArgument(_))
    ));
    assert!(matches!(
        s.complete(a, 1.0, f64::NAN),
        Err(SchedError::InvalidArgument(_))
    ));
    assert_eq!(s.fail(a, 1.0, 1.0), Ok(vec![b]));
    assert_eq!(s.fail(a, 1.0, 1.0), Err(SchedError::Ended(a)));
    assert_eq!(s.cancel(999), Err(SchedError::UnknownTask(999)));
    assert!(s
        .submit(share(spec("c", 1, Qos::Burstable), 1.5), 0.0)
        .is_err());
    let st = s.stats(None);
    assert_eq!((st.counts.failed, st.tenants["a"].failed), (1, 1));
}

#[test]
fn guaranteed_bandwidth_is_not_overcommitted() {
    let mut s = Scheduler::new(100 * MIB, 50.0).unwrap();
    let (g1, adm) = submit(&mut s, share(spec("g1", MIB, Qos::Guaranteed), 0.6));
    assert_eq!(adm, Admission::Admitted);
    let (_, adm) = submit(&mut s, share(spec("g2", MIB, Qos::Guaranteed), 0.5));
    assert!(matches!(adm, Admission::Rejected(r) if r.contains("bandwidth")));
    // Burstable tenants may ask any share.
    let (_, adm) = submit(&mut s, share(spec("b", MIB, Qos::Burstable), 0.9));
    assert_eq!(adm, Admission::Admitted);
    s.cancel(g1).unwrap();
    let (_, adm) = submit(&mut s, share(spec("g2", MIB, Qos::Guaranteed), 0.5));
    assert_eq!(adm, Admission::Admitted);
}

#[test]
fn over_share_tenant_waits_for_one_within_share() {
    let mut s = Scheduler::new(100 * MIB, 10.0).unwrap();
    let (a, _) = submit(&mut s, share(spec("a", MIB, Qos::Burstable), 0.3));
    s.start(a, 0.0).unwrap();
    s.complete(a, 9.0, 9.0).unwrap(); // bucket: 3 + 0.3*9 (capped at 3) - 9 = -6
    let (a2, _) = submit(&mut s, share(spec("a", MIB, Qos::Burstable), 0.3));
    // Alone, an over-share tenant borrows the idle GPU.
    assert_eq!(s.pace(a2, 9.0), Ok(Pace::Start));
    let (b, _) = submit(&mut s, share(spec("b", MIB, Qos::Burstable), 0.7));
    match s.pace(a2, 9.0).unwrap() {
        Pace::Wait { until: Some(t) } => assert!((t - 29.0).abs() < 1e-6, "{t}"),
        p => panic!("{p:?}"),
    }
    assert_eq!(s.may_start(a2, 9.0), Ok(false));
    assert_eq!(s.may_start(a2, 10.0), Ok(false));
    assert!(matches!(
        s.start(a2, 10.0),
        Err(SchedError::Throttled { .. })
    ));
    assert_eq!(
        s.stats(None).tenants["a"].throttled_tasks,
        1,
        "counted once per task"
    );
    assert_eq!(s.pick_next(10.0), Ok(Some(b)));
    assert_eq!(s.next_start_time(a2, 29.0), Ok(Some(29.0)));
    assert_eq!(s.may_start(a2, 29.0), Ok(true));
}

/// A simulated GPU running one launch at a time. Every tenant always has one
/// admitted task; the caller starts whatever `pick_next` (or, with
/// `round_robin`, the first task that `start` accepts) allows. Returns each
/// tenant's GPU time.
fn simulate(
    tenants: &[(&str, Qos, f64)],
    durations: impl Fn(usize, u64) -> f64,
    total_ms: f64,
    round_robin: bool,
) -> Vec<f64> {
    let mut s = Scheduler::new(1 << 30, 20.0).unwrap();
    let mut pending: Vec<TaskId> = tenants
        .iter()
        .map(|&(t, q, sh)| s.submit(share(spec(t, MIB, q), sh), 0.0).unwrap().id)
        .collect();
    let mut now = 0.0;
    let mut step = 0u64;
    let mut rr = 0;
    while now < total_ms {
        step += 1;
        let chosen = if round_robin {
            (0..pending.len())
                .map(|k| (rr + k) % pending.len())
                .find(|&i| s.start(pending[i], now).is_ok())
        } else {
            s.pick_next(now).unwrap().map(|id| {
                let i = pending.iter().position(|&p| p == id).unwrap();
                s.start(id, now).unwrap();
                i
            })
        };
        let Some(i) = chosen else {
            let wake = pending
                .iter()
                .filter_map(|&id| s.next_start_time(id, now).unwrap())
                .fold(f64::INFINITY, f64::min);
            assert!(wake.is_finite() && wake > now, "stuck at {now}");
            now = wake;
            continue;
        };
        rr = i + 1;
        let d = durations(i, step);
        now += d;
        s.complete(pending[i], d, now).unwrap();
        let (t, q, sh) = tenants[i];
        pending[i] = s.submit(share(spec(t, MIB, q), sh), now).unwrap().id;
    }
    let st = s.stats(Some(now));
    tenants
        .iter()
        .map(|(t, _, _)| st.tenants[*t].gpu_time_ms)
        .collect()
}

fn fractions(v: &[f64]) -> Vec<f64> {
    let total: f64 = v.iter().sum();
    v.iter().map(|x| x / total).collect()
}

/// Pseudo-random launch times in [0.5, 4.5) ms, different per tenant.
fn jitter(i: usize, step: u64) -> f64 {
    let h = step
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .rotate_left(17);
    0.5 + (h % 4000) as f64 / 1000.0
}

#[test]
fn two_burstable_tenants_split_70_30() {
    for round_robin in [false, true] {
        let f = fractions(&simulate(
            &[("a", Qos::Burstable, 0.7), ("b", Qos::Burstable, 0.3)],
            jitter,
            20_000.0,
            round_robin,
        ));
        assert!(
            (f[0] - 0.7).abs() < 0.05,
            "round_robin={round_robin}: {f:?}"
        );
    }
}

#[test]
fn shares_hold_when_one_tenant_launches_longer_kernels() {
    let f = fractions(&simulate(
        &[("a", Qos::Burstable, 0.25), ("b", Qos::Burstable, 0.75)],
        |i, step| if i == 0 { 8.0 + jitter(i, step) } else { 0.5 },
        20_000.0,
        true,
    ));
    assert!((f[0] - 0.25).abs() < 0.05, "{f:?}");
}

#[test]
fn guaranteed_tenant_gets_its_share_against_greedy_burstables() {
    for round_robin in [false, true] {
        let f = fractions(&simulate(
            &[
                ("b1", Qos::Burstable, 1.0),
                ("b2", Qos::Burstable, 1.0),
                ("g", Qos::Guaranteed, 0.5),
            ],
            jitter,
            20_000.0,
            round_robin,
        ));
        assert!(f[2] >= 0.47, "round_robin={round_robin}: {f:?}");
        // Between tenants both within share, only pick_next promises fairness.
        if !round_robin {
            assert!((f[0] - f[1]).abs() < 0.05, "{f:?}");
        }
    }
}

#[test]
fn best_effort_gets_what_is_left() {
    let mut s = Scheduler::new(1 << 30, 20.0).unwrap();
    // "a" launches 3 ms every 10 ms; "be" always has work.
    let mut be = s
        .submit(share(spec("be", MIB, Qos::BestEffort), 0.0), 0.0)
        .unwrap()
        .id;
    let mut a_pending: Option<TaskId> = None;
    let (mut now, mut next_a, mut a_delay) = (0.0, 0.0, 0.0f64);
    while now < 10_000.0 {
        if a_pending.is_none() && now >= next_a {
            a_pending = Some(
                s.submit(share(spec("a", MIB, Qos::Burstable), 0.3), now)
                    .unwrap()
                    .id,
            );
        }
        if let Some(a) = a_pending {
            // With a's task waiting, best effort must not start.
            assert_eq!(s.may_start(be, now), Ok(false));
            s.start(a, now).unwrap();
            a_delay = a_delay.max(now - next_a);
            now += 3.0;
            s.complete(a, 3.0, now).unwrap();
            a_pending = None;
            next_a += 10.0;
        } else {
            s.start(be, now).unwrap();
            let d = 1.0f64.min(next_a - now).max(0.25);
            now += d;
            s.complete(be, d, now).unwrap();
            be = s
                .submit(share(spec("be", MIB, Qos::BestEffort), 0.0), now)
                .unwrap()
                .id;
        }
    }
    let st = s.stats(Some(now));
    let f = fractions(&[st.tenants["a"].gpu_time_ms, st.tenants["be"].gpu_time_ms]);
    assert!((f[0] - 0.3).abs() < 0.02, "{f:?}");
    assert!(a_delay <= 1.0, "a waited {a_delay} ms behind best effort");
}

fn run(s: &mut Scheduler, id: TaskId, start: f64, ms: f64) -> f64 {
    s.start(id, start).unwrap();
    s.complete(id, ms, start + ms).unwrap();
    start + ms
}

#[test]
fn best_effort_is_held_while_guaranteed_work_is_due() {
    let mut s = Scheduler::new(1 << 30, 20.0).unwrap();
    s.set_guard_ms(0.5).unwrap();
    // The best-effort tenant's launches take 3 ms (it learns that from one run).
    let be0 = s.submit(spec("be", MIB, Qos::BestEffort), 0.0).unwrap().id;
    run(&mut s, be0, 0.0, 3.0);
    // Guaranteed arrivals at 10 and 20: one gap of 10 ms.
    for t in [10.0, 20.0] {
        let g = s
            .submit(share(spec("g", MIB, Qos::Guaranteed), 0.3), t)
            .unwrap()
            .id;
        let be = s.submit(spec("be", MIB, Qos::BestEffort), t).unwrap().id;
        // A waiting Guaranteed task holds best effort back, then goes first.
        assert_eq!(s.pace(be, t), Ok(Pace::Wait { until: None }));
        assert_eq!(s.pick_next(t), Ok(Some(g)));
        s.start(g, t).unwrap();
        assert_eq!(
            s.pace(be, t + 0.1),
            Ok(Pace::Wait { until: None }),
            "g runs"
        );
        s.complete(g, 0.2, t + 0.2).unwrap();
        s.cancel(be).unwrap();
    }
    let be = s.submit(spec("be", MIB, Qos::BestEffort), 20.2).unwrap().id;
    // Next arrival expected at 30: a 3 ms launch plus 0.5 guard fits until 26.5.
    assert_eq!(s.pace(be, 26.5), Ok(Pace::Start));
    // Later it would still run at 30; held until g is idle (20 + 2 * 10).
    assert_eq!(s.pace(be, 26.6), Ok(Pace::Wait { until: Some(40.0) }));
    assert_eq!(s.next_wakeup(26.6), Ok(Some(40.0)));
    assert_eq!(s.pick_next(35.0), Ok(None));
    assert_eq!(s.pace(be, 40.0), Ok(Pace::Start));
    // pace only asks; next_wakeup (like may_start and start) counts the hold.
    assert_eq!(s.stats(None).counts.held_for_guaranteed, 1);
    assert_eq!(s.stats(None).tenants["be"].held_tasks, 1);
    // At most one best-effort launch in flight.
    s.start(be, 40.0).unwrap();
    let be2 = s
        .submit(spec("be2", MIB, Qos::BestEffort), 40.0)
        .unwrap()
        .id;
    assert_eq!(s.pace(be2, 40.0), Ok(Pace::Wait { until: None }));
    s.complete(be, 3.0, 43.0).unwrap();
    assert_eq!(s.pace(be2, 43.0), Ok(Pace::Start));
    // g comes back after its idle spell: that 32 ms gap is not a rate.
    let g = s
        .submit(share(spec("g", MIB, Qos::Guaranteed), 0.3), 52.0)
        .unwrap()
        .id;
    assert_eq!(s.stats(None).tenants["g"].guaranteed_gap_ms, Some(10.0));
    run(&mut s, g, 52.0, 0.2);
    assert_eq!(s.pace(be2, 52.2), Ok(Pace::Start));
    // be2 has never run, so its launches are taken as instant: held only
    // once the guard reaches the expected arrival at 62.
    assert_eq!(s.pace(be2, 61.5), Ok(Pace::Start));
    assert!(matches!(s.pace(be2, 61.6), Ok(Pace::Wait { .. })));
}

#[test]
fn a_wakeup_for_best_effort_held_by_running_guaranteed_work_is_its_idle_time() {
    let mut s = Scheduler::new(1 << 30, 20.0).unwrap();
    let be0 = s.submit(spec("be", MIB, Qos::BestEffort), 0.0).unwrap().id;
    run(&mut s, be0, 0.0, 3.0);
    // Guaranteed steps every 10 ms: idle 2 gaps after the last arrival.
    for t in [10.0, 20.0] {
        let g = s
            .submit(share(spec("g", MIB, Qos::Guaranteed), 0.3), t)
            .unwrap()
            .id;
        run(&mut s, g, t, 0.2);
    }
    let g = s
        .submit(share(spec("g", MIB, Qos::Guaranteed), 0.3), 30.0)
        .unwrap()
        .id;
    let be = s.submit(spec("be", MIB, Qos::BestEffort), 30.0).unwrap().id;
    s.start(g, 30.0).unwrap();
    // While g runs, best effort waits for its end; with no new arrival, a
    // timed wake-up can find it free no earlier than g's idle time.
    assert_eq!(s.pace(be, 30.1), Ok(Pace::Wait { until: None }));
    assert_eq!(s.next_wakeup(30.1), Ok(Some(50.0)));
    // Each step moves it on (a sleeping dispatcher is not woken earlier).
    s.complete(g, 0.2, 30.2).unwrap();
    let g = s
        .submit(share(spec("g", MIB, Qos::Guaranteed), 0.3), 31.0)
        .unwrap()
        .id;
    s.start(g, 31.0).unwrap();
    assert_eq!(s.next_wakeup(31.0), Ok(Some(31.0 + 2.0 * 10.0)));
    // After its end the next arrival is forecast at 32 (the shortest gap),
    // before be's 3 ms launch would end: held until g is idle at 51.
    s.complete(g, 0.2, 31.2).unwrap();
    assert_eq!(s.next_wakeup(31.2), Ok(Some(51.0)));
    assert_eq!(s.pick_next(51.0), Ok(Some(be)));
    assert_eq!(s.stats(None).counts.held_for_guaranteed, 1);
}

/// A GPU that runs one launch at a time and cannot preempt it (a large GEMM
/// holds every SM to its end). Guaranteed tasks of `g_ms` arrive every
/// `period` ms until `g_until` (a period of 0: each one as the previous ends,
/// a closed loop, which pauses `pause.1` ms after every `pause.0`-th step);
/// best effort always has a `be_ms` task admitted. Returns the Guaranteed
/// waits (arrival to start) and the best-effort launches as (start, end).
#[allow(clippy::too_many_arguments)]
fn nonpreemptive(
    period: f64,
    g_ms: f64,
    be_ms: f64,
    g_until: f64,
    end: f64,
    pause: (usize, f64),
    min_idle_ms: f64,
) -> (Vec<f64>, Vec<(f64, f64)>) {
    let mut s = Scheduler::new(1 << 30, 20.0).unwrap();
    s.set_min_idle_ms(min_idle_ms).unwrap();
    let mut be = s.submit(spec("be", MIB, Qos::BestEffort), 0.0).unwrap().id;
    let (mut now, mut next_g) = (0.0f64, 1.0f64);
    let mut g: Option<(TaskId, f64)> = None;
    let (mut waits, mut bes) = (Vec::new(), Vec::new());
    while now < end {
        if g.is_none() && next_g <= now && next_g < g_until {
            g = Some((
                s.submit(share(spec("g", MIB, Qos::Guaranteed), 0.3), next_g)
                    .unwrap()
                    .id,
                next_g,
            ));
        }
        match s.pick_and_start(now).unwrap() {
            Some((id, _)) if Some(id) == g.map(|x| x.0) => {
                let (_, arrived) = g.take().unwrap();
                waits.push(now - arrived);
                now += g_ms;
                s.complete(id, g_ms, now).unwrap();
                next_g = if period > 0.0 {
                    arrived + period
                } else if waits.len() % pause.0 == 0 {
                    now + pause.1
                } else {
                    now
                };
            }
            Some((id, _)) => {
                assert_eq!(id, be);
                bes.push((now, now + be_ms));
                now += be_ms;
                s.complete(id, be_ms, now).unwrap();
                be = s.submit(spec("be", MIB, Qos::BestEffort), now).unwrap().id;
            }
            None => {
                let wake = s.next_wakeup(now).unwrap().unwrap_or(f64::INFINITY);
                let arrival = if g.is_none() && next_g < g_until {
                    next_g
                } else {
                    f64::INFINITY
                };
                now = wake.min(arrival).min(end).max(now + 1e-9);
            }
        }
    }
    (waits, bes)
}

#[test]
fn periodic_guaranteed_work_never_waits_behind_best_effort() {
    // G: 0.2 ms every 5 ms; BE: 1.5 ms launches; guard 0.25 ms.
    let (waits, bes) = nonpreemptive(5.0, 0.2, 1.5, 1000.0, 1000.0, (1, 0.0), 5.0);
    assert_eq!(waits.len(), 200);
    // From the third arrival on, the gap is known and nothing is in the way.
    assert!(waits[2..].iter().all(|&w| w == 0.0), "{waits:?}");
    // Each 4.8 ms idle stretch fits three 1.5 ms launches ending >= 0.25 ms
    // before the next arrival: 3 * 1.5 / 5 = 90% of the GPU.
    let be_ms: f64 = bes.iter().map(|(a, b)| b - a).sum();
    assert!((be_ms / 1000.0 - 0.9).abs() < 0.02, "{be_ms}");
}

#[test]
fn closed_loop_guaranteed_work_starves_best_effort_only_while_active() {
    // Each G task arrives as the previous ends: the GPU is never free for 1.5 ms.
    let (waits, bes) = nonpreemptive(0.0, 0.2, 1.5, 100.0, 200.0, (usize::MAX, 0.0), 5.0);
    assert!(waits[2..].iter().all(|&w| w == 0.0), "{waits:?} {bes:?}");
    let last_g = 1.0 + waits.iter().sum::<f64>() + 0.2 * waits.len() as f64;
    let during: Vec<_> = bes
        .iter()
        .filter(|(a, _)| *a > 1.0 && *a < last_g)
        .collect();
    // Only the launch taken before g's rate was known (second arrival).
    assert!(during.len() <= 1, "{during:?}");
    // Once g is idle (5 ms of silence: the floor, above two 0.2 ms gaps) best
    // effort takes the whole GPU.
    let first_after = bes.iter().find(|(a, _)| *a >= last_g).unwrap().0;
    assert!(
        first_after - last_g <= 5.0 + 1e-6,
        "{first_after} vs {last_g}"
    );
    let after: f64 = bes
        .iter()
        .filter(|(a, _)| *a >= last_g)
        .map(|(a, b)| b - a)
        .sum();
    assert!(after >= 200.0 - first_after - 1.5, "{after}");
}

#[test]
fn a_pause_in_a_closed_loop_is_not_idleness() {
    // Every 20th step the client pauses 1 ms, five of its 0.2 ms gaps: without the
    // idle floor that reads as idle, a 1.5 ms launch goes in and the next step waits.
    let (waits, bes) = nonpreemptive(0.0, 0.2, 1.5, 100.0, 100.0, (20, 1.0), 0.0);
    let late = waits[2..].iter().filter(|&&w| w > 0.0).count();
    assert!(late >= 3 && bes.len() >= 4, "{late} {}", bes.len());
    let (waits, bes) = nonpreemptive(0.0, 0.2, 1.5, 100.0, 100.0, (20, 1.0), 5.0);
    assert!(waits[2..].iter().all(|&w| w == 0.0), "{waits:?}");
    assert!(bes.len() <= 2, "{bes:?}");
}

/// submit_and_start is submit followed by pick_and_start when that picks the
/// new task: the same decisions, counts and stream priority; otherwise it only
/// submits and the caller picks as usual.
#[test]
fn submit_and_start_is_submit_then_pick_and_start_of_the_new_task() {
    let mut fused = Scheduler::new(100 * MIB, 20.0).unwrap();
    let mut split = Scheduler::new(100 * MIB, 20.0).unwrap();
    for s in [&mut fused, &mut split] {
        s.add_partition(Partition {
            name: "hi".into(),
            memory_quota_bytes: 50 * MIB,
            bandwidth_share: 0.5,
            stream_priority: -3,
        })
        .unwrap();
    }
    let mut g = share(spec("g", 10 * MIB, Qos::Guaranteed), 0.3);
    g.partition = "hi".into();
    let be = spec("be", 10 * MIB, Qos::BestEffort);
    let big = spec("big", 200 * MIB, Qos::Burstable);
    let mut now = 0.0;
    let mut running: Vec<TaskId> = Vec::new();
    for (k, sp) in [g.clone(), be.clone(), g.clone(), big, be.clone(), g.clone()]
        .into_iter()
        .enumerate()
    {
        let (r, prio) = fused.submit_and_start(sp.clone(), now, k != 3).unwrap();
        let r2 = split.submit(sp, now).unwrap();
        assert_eq!(r, r2);
        let want = if k != 3 && r2.admission == Admission::Admitted {
            match split.pick_next(now).unwrap() {
                Some(id) if id == r2.id => split.pick_and_start(now).unwrap().map(|x| x.1),
                _ => None,
            }
        } else {
            None
        };
        assert_eq!(prio, want, "submission {k}");
        if prio.is_some() {
            running.push(r.id);
            assert_eq!(fused.state(r.id), Ok(TaskState::Running));
        }
        // The Guaranteed one runs first; best effort is held behind it.
        if k == 1 {
            assert_eq!(prio, None);
            assert_eq!(fused.state(r.id), Ok(TaskState::Admitted));
        }
        if k == 0 {
            assert_eq!(prio, Some(-3));
        }
        now += 0.5;
        if k % 2 == 1 {
            let id = running.remove(0);
            assert_eq!(
                fused.complete(id, 0.4, now).unwrap(),
                split.complete(id, 0.4, now).unwrap()
            );
        }
    }
    let (a, b) = (fused.stats(Some(now)), split.stats(Some(now)));
    assert_eq!(a.counts, b.counts);
    assert_eq!(a.tasks.len(), b.tasks.len());
    assert_eq!(fused.queue_order(), split.queue_order());
}

#[test]
fn best_effort_duty_limit_idles_the_gpu_between_best_effort_launches() {
    let mut s = Scheduler::new(100 * MIB, 50.0).unwrap();
    assert!(s.set_best_effort_duty(0.0, 10.0, 0.0).is_err());
    assert!(s.set_best_effort_duty(1.5, 10.0, 0.0).is_err());
    assert!(s.set_best_effort_duty(0.5, f64::NAN, 0.0).is_err());
    assert_eq!(s.best_effort_duty(), 1.0, "refused settings leave no limit");
    // Half the GPU's time over 4 ms: a bucket of 2 ms, refilled at 0.5 ms per ms.
    s.set_best_effort_duty(0.5, 4.0, 0.0).unwrap();
    let be = |s: &mut Scheduler, t: f64| s.submit(spec("be", MIB, Qos::BestEffort), t).unwrap().id;
    let a = be(&mut s, 0.0);
    s.start(a, 0.0).unwrap();
    s.complete(a, 3.0, 3.0).unwrap(); // 2 ms of tokens (full) - 3 ms: -1 at t=3
    let b = be(&mut s, 3.0);
    assert_eq!(s.pace(b, 3.0), Ok(Pace::Wait { until: Some(5.0) }));
    assert_eq!(s.next_wakeup(3.0), Ok(Some(5.0)));
    // Burstable and Guaranteed work is not limited by it, and goes first.
    let c = s.submit(spec("c", MIB, Qos::Burstable), 3.0).unwrap().id;
    assert_eq!(s.pick_next(3.0), Ok(Some(c)));
    s.start(c, 3.0).unwrap();
    s.complete(c, 10.0, 4.0).unwrap();
    assert_eq!(s.pick_next(4.9), Ok(None));
    assert_eq!(s.pick_next(5.0), Ok(Some(b)));
    let st = s.stats(Some(5.0));
    assert_eq!(st.counts.held_for_duty, 1);
    assert_eq!(st.counts.held_for_guaranteed, 0);
    assert_eq!(st.best_effort_duty, 0.5);
    assert!(st.best_effort_tokens_ms.unwrap().abs() < 1e-9);
    // Lifted: best effort is work-conserving again.
    s.set_best_effort_duty(1.0, 4.0, 5.0).unwrap();
    assert_eq!(s.best_effort_duty(), 1.0);
    s.start(b, 5.0).unwrap();
    s.complete(b, 100.0, 105.0).unwrap();
    let d = be(&mut s, 105.0);
    assert_eq!(s.pace(d, 105.0), Ok(Pace::Start));
    assert_eq!(s.stats(None).best_effort_tokens_ms, None);
}

#[test]
fn submit_start_now_starts_a_guaranteed_task_or_changes_nothing() {
    let mut s = Scheduler::new(100 * MIB, 50.0).unwrap();
    // Nothing else: started now, counted as submit_and_start counts it.
    let g = spec("g", 10 * MIB, Qos::Guaranteed);
    let (a, _) = s.submit_start_now(g.clone(), 0.0).unwrap().unwrap();
    assert_eq!(s.state(a), Ok(TaskState::Running));
    // Best effort waiting next to a running Guaranteed task: held, and the next
    // Guaranteed step still starts now, even with its tenant over its share.
    let (be, adm) = submit(&mut s, spec("be", 20 * MIB, Qos::BestEffort));
    assert_eq!(adm, Admission::Admitted);
    s.complete(a, 500.0, 1.0).unwrap(); // far over its share
    let (b, _) = s.submit_start_now(g.clone(), 1.0).unwrap().unwrap();
    assert_eq!(s.state(b), Ok(TaskState::Running));
    assert_eq!(s.state(be), Ok(TaskState::Admitted));
    let before = s.stats(None).counts;
    // Refused (bigger than the node), queued behind memory, or a Burstable task
    // waiting: None, nothing counted, nothing reserved.
    assert_eq!(
        s.submit_start_now(spec("g", 200 * MIB, Qos::Guaranteed), 2.0),
        Ok(None)
    );
    assert_eq!(
        s.submit_start_now(spec("g", 80 * MIB, Qos::Guaranteed), 2.0),
        Ok(None)
    );
    assert_eq!(
        s.submit_start_now(spec("b", 1, Qos::Burstable), 2.0),
        Ok(None)
    );
    let (w, _) = submit(&mut s, spec("w", 1, Qos::Burstable));
    assert_eq!(s.state(w), Ok(TaskState::Admitted));
    let reserved = s.reserved_bytes();
    assert_eq!(s.submit_start_now(g.clone(), 2.0), Ok(None));
    assert_eq!(s.reserved_bytes(), reserved);
    let after = s.stats(None).counts;
    assert_eq!(after.submitted, before.submitted + 1); // w alone
    assert_eq!(after.started, before.started);
    // A task queued for memory: None as well.
    s.cancel(w).unwrap();
    let (q, adm) = submit(&mut s, spec("q", 90 * MIB, Qos::Burstable));
    assert_eq!(
        (s.state(q), adm),
        (Ok(TaskState::Queued), Admission::Queued)
    );
    assert_eq!(s.submit_start_now(g, 2.0), Ok(None));
    assert_eq!(s.reserved_bytes(), 30 * MIB);
}

/// A Guaranteed step beside waiting best-effort work, two ways: the native
/// step's calls (`submit_start_now`; at its end `complete` and
/// `ready_or_wakeup`) and the general ones (`submit_and_start`; `complete`,
/// `pick_next` and `next_wakeup`). Same decisions, same counters.
#[test]
fn the_native_steps_calls_decide_and_count_as_the_general_ones() {
    let mut fast = Scheduler::new(100 * MIB, 50.0).unwrap();
    let mut slow = Scheduler::new(100 * MIB, 50.0).unwrap();
    for s in [&mut fast, &mut slow] {
        s.set_min_idle_ms(3.0).unwrap();
        s.set_best_effort_duty(0.4, 10.0, 0.0).unwrap();
        for (t, mib) in [("be1", 5), ("be2", 7), ("be1", 3)] {
            let (_, adm) = submit(s, spec(t, mib * MIB, Qos::BestEffort));
            assert_eq!(adm, Admission::Admitted);
        }
    }
    let g = share(spec("g", 10 * MIB, Qos::Guaranteed), 0.3);
    let mut now = 0.0;
    let mut readies = 0;
    // Closed-loop steps, then gaps that let the forecast lapse (best effort may start).
    for (k, gap) in [0.1, 0.12, 0.09, 0.1, 0.11, 0.1, 5.0, 0.1, 9.0]
        .iter()
        .enumerate()
    {
        let (a, pa) = fast.submit_start_now(g.clone(), now).unwrap().unwrap();
        let (sb, pb) = slow.submit_and_start(g.clone(), now, true).unwrap();
        assert_eq!((a, Some(pa)), (sb.id, pb), "step {k}");
        now += 0.04;
        fast.complete(a, 0.04, now).unwrap();
        slow.complete(sb.id, 0.04, now).unwrap();
        let (ready, wake) = fast.ready_or_wakeup(now).unwrap();
        let picked = slow.pick_next(now).unwrap();
        assert_eq!(ready, picked.is_some(), "step {k}");
        if !ready {
            assert_eq!(wake, slow.next_wakeup(now).unwrap(), "step {k}");
        }
        readies += usize::from(ready);
        assert_eq!(fast.stats(Some(now)), slow.stats(Some(now)), "step {k}");
        now += gap;
        if ready {
            // Start what may start (both alike), so the next step finds only best effort.
            while let Some((id, _)) = fast.pick_and_start(now).unwrap() {
                assert_eq!(slow.pick_and_start(now).unwrap().map(|p| p.0), Some(id));
                fast.complete(id, 1.0, now + 1.0).unwrap();
                slow.complete(id, 1.0, now + 1.0).unwrap();
                now += 1.0;
                let (_, adm) = submit(&mut fast, spec("be1", MIB, Qos::BestEffort));
                assert_eq!(submit(&mut slow, spec("be1", MIB, Qos::BestEffort)).1, adm);
            }
            assert_eq!(slow.pick_and_start(now).unwrap(), None);
        }
    }
    assert!(readies > 0, "the gaps let best effort start");
    let st = fast.stats(Some(now));
    assert!(st.counts.held_for_guaranteed >= 3, "{:?}", st.counts);
    assert_eq!(st, slow.stats(Some(now)));
}
