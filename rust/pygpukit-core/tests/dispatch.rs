//! The dispatch controller against the fake launcher and allocator.

use pygpukit_core::dispatch::{
    Controller, DispatchError, FakeAlloc, FakeLauncher, KernelLaunch, LaunchPlan, Param,
};

fn kernel(func: u64, params: Vec<Param>) -> KernelLaunch {
    KernelLaunch {
        func,
        ctx: 7,
        grid: [4, 1, 1],
        block: [256, 1, 1],
        shared_mem: 0,
        pdl: func.is_multiple_of(2),
        params,
    }
}

/// t0 = f(in0); out0 = g(t0, in1, 3.5f); with the error word as a constant.
fn two_kernel_plan() -> LaunchPlan {
    LaunchPlan::new(
        vec![
            kernel(
                11,
                vec![
                    Param::Temp {
                        index: 0,
                        offset: 0,
                    },
                    Param::Input {
                        index: 0,
                        offset: 16,
                    },
                    Param::Const(1024),
                ],
            ),
            kernel(
                12,
                vec![
                    Param::Output {
                        index: 0,
                        offset: 0,
                    },
                    Param::Temp {
                        index: 0,
                        offset: 0,
                    },
                    Param::Input {
                        index: 1,
                        offset: -4,
                    },
                    Param::Const(3.5f32.to_bits() as u64),
                    Param::Const(0xdead_0000),
                ],
            ),
        ],
        2,
        1,
        &[4096],
    )
    .unwrap()
}

#[test]
fn a_hit_substitutes_pointers_and_frees_temporaries() {
    let fake = FakeLauncher::new();
    let mut alloc = FakeAlloc::new(1 << 20);
    let mut c: Controller<u64, ()> = Controller::new(16, 64, 4);
    assert!(!c
        .run(&fake, &mut alloc, 5, &[0x100, 0x200], &[0x300], 9)
        .unwrap()); // a miss
    c.insert(5, two_kernel_plan(), ());
    assert!(c
        .run(&fake, &mut alloc, 5, &[0x100, 0x200], &[0x300], 9)
        .unwrap());
    let log = fake.take_log();
    assert_eq!(log.len(), 2);
    let t0 = log[0].params[0];
    assert_ne!(t0, 0);
    assert_eq!(log[0].params, vec![t0, 0x110, 1024]);
    assert_eq!(
        log[1].params,
        vec![0x300, t0, 0x1fc, 3.5f32.to_bits() as u64, 0xdead_0000]
    );
    assert_eq!(
        (log[0].func, log[0].stream, log[0].pdl, log[1].pdl),
        (11, 9, false, true)
    );
    assert_eq!(alloc.live_blocks(), 0); // the temporary went back after its last reader
    let st = c.stats();
    assert_eq!((st.hits, st.misses, st.launches, st.plans), (1, 1, 2, 1));
}

#[test]
fn wrong_counts_are_an_error_not_a_launch() {
    let fake = FakeLauncher::new();
    let mut alloc = FakeAlloc::new(1 << 20);
    let mut c: Controller<u64, ()> = Controller::new(4, 64, 4);
    c.insert(1, two_kernel_plan(), ());
    let e = c.run(&fake, &mut alloc, 1, &[1], &[2], 0).unwrap_err();
    assert!(matches!(e, DispatchError::BadCall(_)));
    assert!(fake.log().is_empty());
}

#[test]
fn a_failed_launch_or_allocation_leaves_no_temporary() {
    let fake = FakeLauncher::new();
    let mut c: Controller<u64, ()> = Controller::new(4, 64, 4);
    c.insert(1, two_kernel_plan(), ());
    let mut alloc = FakeAlloc::new(1 << 20);
    fake.fail_launch(1);
    let e = c.run(&fake, &mut alloc, 1, &[1, 2], &[3], 0).unwrap_err();
    assert!(
        matches!(
            e,
            DispatchError::Launch {
                kernel: 1,
                code: 700,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(alloc.live_blocks(), 0);
    let mut small = FakeAlloc::new(100); // the 4096-byte temporary does not fit
    let e = c.run(&fake, &mut small, 1, &[1, 2], &[3], 0).unwrap_err();
    assert_eq!(e, DispatchError::OutOfMemory { nbytes: 4096 });
    assert_eq!(small.live_blocks(), 0);
}

#[test]
fn temporaries_live_only_between_first_and_last_user() {
    // A chain t0 -> t1 -> t2 -> out: at most two temporaries are live at once.
    let n = 3;
    let mut launches = vec![kernel(
        1,
        vec![
            Param::Temp {
                index: 0,
                offset: 0,
            },
            Param::Input {
                index: 0,
                offset: 0,
            },
        ],
    )];
    for k in 1..n {
        launches.push(kernel(
            1,
            vec![
                Param::Temp {
                    index: k,
                    offset: 0,
                },
                Param::Temp {
                    index: k - 1,
                    offset: 0,
                },
            ],
        ));
    }
    launches.push(kernel(
        1,
        vec![
            Param::Output {
                index: 0,
                offset: 0,
            },
            Param::Temp {
                index: n - 1,
                offset: 0,
            },
        ],
    ));
    let plan = LaunchPlan::new(launches, 1, 1, &[1000, 1000, 1000]).unwrap();
    let fake = FakeLauncher::new();
    let mut alloc = FakeAlloc::new(1 << 20);
    let mut c: Controller<u64, ()> = Controller::new(4, 64, 4);
    c.insert(3, plan, ());
    assert!(c.run(&fake, &mut alloc, 3, &[0x10], &[0x20], 0).unwrap());
    assert_eq!(alloc.peak_live_bytes, 2000);
    assert_eq!(alloc.live_blocks(), 0);
}

#[test]
fn the_in_flight_bound_waits_for_the_oldest_marker() {
    let fake = FakeLauncher::new();
    let mut alloc = FakeAlloc::new(1 << 20);
    let mut c: Controller<u64, ()> = Controller::new(4, 2, 3); // a marker every 2 launches
    c.insert(
        1,
        LaunchPlan::new(vec![kernel(1, vec![])], 0, 0, &[]).unwrap(),
        (),
    );
    for _ in 0..20 {
        assert!(c.run(&fake, &mut alloc, 1, &[], &[], 0).unwrap());
        let st = c.stats().in_flight;
        assert!(st.markers <= 3);
        assert!(st.issued - st.completed <= c.inflight_bound(1));
    }
    let st = c.stats().in_flight;
    assert_eq!(st.issued, 20);
    assert!(st.waits > 0); // nothing completed on its own: the host had to wait
    fake.complete_all();
    c.drain(&fake).unwrap();
    assert_eq!(c.stats().in_flight.completed, 20);
    c.destroy_events(&fake);
    assert_eq!(fake.live_events(), 0);
}

#[test]
fn ten_thousand_shapes_keep_the_plan_count_capped() {
    let fake = FakeLauncher::new();
    let mut alloc = FakeAlloc::new(1 << 20);
    let mut c: Controller<u64, Vec<u8>> = Controller::new(256, 64, 4);
    for key in 0..10_000u64 {
        let p = LaunchPlan::new(
            vec![kernel(
                1,
                vec![
                    Param::Const(key),
                    Param::Input {
                        index: 0,
                        offset: 0,
                    },
                ],
            )],
            1,
            0,
            &[],
        )
        .unwrap();
        c.insert(key, p, vec![0; 64]);
        assert!(c.run(&fake, &mut alloc, key, &[8], &[], 0).unwrap());
        fake.take_log();
    }
    let st = c.stats();
    assert_eq!(st.plans, 256);
    assert_eq!(st.evicted, 10_000 - 256);
    assert!(c.contains(9_999) && !c.contains(0));
}
