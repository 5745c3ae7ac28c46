//! Bulk uploads against the lazy fake device: a buffer refilled before its DMA ran, a DMA
//! never waited for or a piece issued twice shows up as wrong bytes or a wrong issue list.

use std::sync::Arc;

use proptest::prelude::*;

use super::fake::{FakeDevice, POISON};
use super::*;

fn config(threads: usize, piece: usize, buffers: usize) -> Config {
    Config {
        chunk_bytes: 64,
        chunks: 2,
        slot_bytes: 16,
        slots: 3,
        copy_threads: 2,
        pinned_cache_bytes: 1024,
        bulk_threads: threads,
        bulk_piece_bytes: piece,
        bulk_buffers: buffers,
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) | 1)
        .collect()
}

/// Sources of these sizes, pinned (fake host allocations) where asked, each with its own
/// device allocation.
struct Case {
    jobs: Vec<BulkJob>,
    data: Vec<Vec<u8>>,
    pageable: Vec<Vec<u8>>,
    pinned: Vec<*mut u8>,
}

impl Case {
    fn new(dev: &FakeDevice, sizes: &[(usize, bool)], seed: u8) -> Self {
        let mut case = Case {
            jobs: Vec::new(),
            data: Vec::new(),
            pageable: Vec::new(),
            pinned: Vec::new(),
        };
        for (i, &(n, pinned)) in sizes.iter().enumerate() {
            let data = pattern(n, seed.wrapping_add(i as u8));
            let host = if pinned && n > 0 {
                let p = dev.host_alloc(n).unwrap();
                // SAFETY: p holds n bytes.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, n) };
                case.pinned.push(p);
                p as usize
            } else {
                case.pageable.push(data.clone());
                case.pageable.last().unwrap().as_ptr() as usize
            };
            case.jobs.push(BulkJob {
                device: dev.alloc(n, 0),
                host,
                nbytes: n,
            });
            case.data.push(data);
        }
        case
    }

    fn total(&self) -> usize {
        self.jobs.iter().map(|j| j.nbytes).sum()
    }

    fn free_pinned(&mut self, dev: &FakeDevice) {
        for p in self.pinned.drain(..) {
            // SAFETY: allocated by host_alloc in new.
            unsafe { dev.host_free(p) };
        }
    }
}

fn bulk(
    eng: &Engine<FakeDevice>,
    case: &Case,
    progress: &mut Vec<usize>,
) -> DeviceResult<Transfer<FakeDevice>> {
    // SAFETY: the case's sources outlive the transfers of every test.
    unsafe {
        eng.htod_bulk(&case.jobs, Some(0), Some(0), None, &mut |n| {
            progress.push(n)
        })
    }
}

#[test]
fn pageable_sources_may_be_reused_on_return_and_every_byte_lands() {
    let dev = FakeDevice::new();
    let eng = Engine::new(dev.clone(), config(3, 37, 2)).unwrap();
    let sizes = [
        (1, false),
        (0, false),
        (500, false),
        (37, false),
        (74, false),
        (1000, false),
    ];
    let mut case = Case::new(&dev, &sizes, 1);
    let mut progress = Vec::new();
    let t = bulk(&eng, &case, &mut progress).unwrap();
    for src in &mut case.pageable {
        src.fill(POISON); // the DMAs read the engine's buffers, not the sources
    }
    t.wait().unwrap();
    assert!(t.done().unwrap());
    for (job, data) in case.jobs.iter().zip(&case.data) {
        assert_eq!(&dev.peek(job.device, job.nbytes), data);
    }
    assert_eq!(progress.iter().sum::<usize>(), case.total());
    let s = eng.stats();
    assert_eq!(
        (s.bulk_bytes, s.staged_bytes, s.direct_bytes),
        (1612, 1612, 0)
    );
    assert_eq!(s.in_flight, 0);
    // At most three threads' two buffers each (how many a thread used depends on how
    // the threads raced for pieces).
    assert!(s.pinned_bytes > 0 && s.pinned_bytes <= 3 * 2 * 37);
}

#[test]
fn uploads_are_ordered_with_the_callers_stream() {
    let dev = FakeDevice::new();
    let eng = Engine::new(dev.clone(), config(2, 16, 2)).unwrap();
    let case = Case::new(&dev, &[(100, false), (60, true)], 3);
    let old: Vec<Vec<u8>> = case.data.iter().map(|d| pattern(d.len(), 200)).collect();
    for (job, o) in case.jobs.iter().zip(&old) {
        dev.launch_write(0, job.device, o.clone());
    }
    // Kernels queued before the upload read the blocks' old bytes, those after the new.
    let before: Vec<_> = case
        .jobs
        .iter()
        .map(|j| dev.launch_read(0, j.device, j.nbytes))
        .collect();
    let _t = bulk(&eng, &case, &mut Vec::new()).unwrap();
    let after: Vec<_> = case
        .jobs
        .iter()
        .map(|j| dev.launch_read(0, j.device, j.nbytes))
        .collect();
    dev.sync_stream(0); // runs the compute stream only; its wait pulls the upload in
    for i in 0..2 {
        assert_eq!(*before[i].lock().unwrap(), old[i]);
        assert_eq!(*after[i].lock().unwrap(), case.data[i]);
    }
    let mut case = case;
    case.free_pinned(&dev);
}

#[test]
fn a_pinned_source_dropped_in_flight_is_kept_until_the_dmas_ran() {
    struct Pinned {
        dev: Arc<FakeDevice>,
        ptr: *mut u8,
    }
    // SAFETY: the fake's memory is plain heap memory.
    unsafe impl Send for Pinned {}
    impl Drop for Pinned {
        fn drop(&mut self) {
            // SAFETY: allocated by the case's host_alloc.
            unsafe { self.dev.host_free(self.ptr) };
        }
    }
    let dev = FakeDevice::new();
    let eng = Engine::new(dev.clone(), config(2, 32, 2)).unwrap();
    let mut case = Case::new(&dev, &[(200, true)], 5);
    let keep: Keep = Box::new(Pinned {
        dev: dev.clone(),
        ptr: case.pinned.pop().unwrap(),
    });
    let t = unsafe { eng.htod_bulk(&case.jobs, None, None, Some(keep), &mut |_| {}) }.unwrap();
    drop(t);
    dev.run_all();
    assert_eq!(dev.peek(case.jobs[0].device, 200), case.data[0]);
    eng.reap();
    assert_eq!(eng.stats().direct_bytes, 200);
    assert_eq!(dev.live_host_allocations(), 0); // the source went once its DMAs ran
}

#[test]
fn a_failed_dma_is_returned_after_the_issued_ones_ran_and_the_engine_goes_on() {
    for fail_at in [0u64, 3, 9] {
        let dev = FakeDevice::new();
        let eng = Engine::new(dev.clone(), config(3, 20, 2)).unwrap();
        let mut case = Case::new(&dev, &[(150, true), (100, false), (130, true)], 7);
        dev.fail_upload_after(fail_at);
        let err = bulk(&eng, &case, &mut Vec::new()).err().unwrap();
        assert_eq!(err.code, 700);
        // Free (poison) the pinned sources: the pieces issued before the failure have
        // already read them, so whatever landed is the source's bytes, never poison.
        case.free_pinned(&dev);
        dev.run_all();
        for (job, data) in case.jobs.iter().zip(&case.data) {
            let got = dev.peek(job.device, job.nbytes);
            for (g, w) in got.iter().zip(data) {
                assert!(
                    *g == 0 || g == w,
                    "fail_at {fail_at}: a late DMA read freed memory"
                );
            }
        }
        let ok = Case::new(&dev, &[(150, false), (100, false)], 8);
        let t = bulk(&eng, &ok, &mut Vec::new()).unwrap();
        t.wait().unwrap();
        for (job, data) in ok.jobs.iter().zip(&ok.data) {
            assert_eq!(&dev.peek(job.device, job.nbytes), data);
        }
    }
}

#[test]
fn buffers_are_kept_for_later_bulk_uploads_and_allocated_as_needed() {
    let dev = FakeDevice::new();
    let eng = Engine::new(dev.clone(), config(4, 64, 2)).unwrap();
    let one = Case::new(&dev, &[(50, false)], 1);
    bulk(&eng, &one, &mut Vec::new()).unwrap().wait().unwrap();
    assert_eq!(dev.live_host_allocations(), 1); // one piece: one buffer of one thread
    let mut held = 1;
    for seed in 2..6 {
        let case = Case::new(&dev, &[(1000, false), (333, false)], seed);
        bulk(&eng, &case, &mut Vec::new()).unwrap().wait().unwrap();
        for (job, data) in case.jobs.iter().zip(&case.data) {
            assert_eq!(&dev.peek(job.device, job.nbytes), data);
        }
        // Kept (never fewer than before), never more than four threads' two.
        let now = dev.live_host_allocations();
        assert!(now >= held && now <= 8, "{held} then {now} buffers");
        held = now;
    }
    assert_eq!(eng.stats().pinned_bytes, held as u64 * 64);
    drop(eng);
    assert_eq!(dev.live_host_allocations(), 0);
}

#[test]
fn concurrent_bulk_uploads_take_turns() {
    let dev = FakeDevice::new();
    let eng = Engine::new(dev.clone(), config(3, 24, 2)).unwrap();
    let cases: Vec<Case> = (0..4)
        .map(|k| {
            Case::new(
                &dev,
                &[(700 + k * 13, false), (90, false), (5, false)],
                k as u8,
            )
        })
        .collect();
    std::thread::scope(|s| {
        for case in &cases {
            let (eng, jobs) = (eng.clone(), &case.jobs);
            s.spawn(move || {
                // SAFETY: the sources outlive the scope.
                let t = unsafe { eng.htod_bulk(jobs, Some(0), Some(0), None, &mut |_| {}) };
                t.unwrap().wait().unwrap();
            });
        }
    });
    for case in &cases {
        for (job, data) in case.jobs.iter().zip(&case.data) {
            assert_eq!(&dev.peek(job.device, job.nbytes), data);
        }
    }
    assert_eq!(eng.stats().copies, 4);
}

fn job_sizes() -> impl Strategy<Value = Vec<(usize, bool)>> {
    proptest::collection::vec((0usize..300, proptest::bool::weighted(0.25)), 0..10)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random jobs (pageable or pinned, empty ones among them) through random thread,
    /// piece and buffer counts on the lazy device: the issued DMAs cover every job's
    /// device range exactly once, every byte arrives, progress adds up to the total, the
    /// pinned buffers never exceed threads x buffers, and once waited nothing is in flight.
    #[test]
    fn every_byte_lands_once(sizes in job_sizes(), threads in 1usize..6, piece in 1usize..80,
                             buffers in 1usize..4) {
        let dev = FakeDevice::new();
        let eng = Engine::new(dev.clone(), config(threads, piece, buffers)).unwrap();
        let mut case = Case::new(&dev, &sizes, threads as u8);
        let mut progress = Vec::new();
        let t = bulk(&eng, &case, &mut progress).unwrap();
        prop_assert!(dev.live_host_allocations() <= case.pinned.len() + threads * buffers);
        t.wait().unwrap();
        let mut issued: Vec<(u64, usize)> = dev
            .issued()
            .iter()
            .filter(|i| i.stream == eng.h2d_stream())
            .map(|i| (i.device, i.nbytes))
            .collect();
        issued.sort();
        let mut want = Vec::new();
        for job in &case.jobs {
            let mut at = 0;
            while at < job.nbytes {
                let len = (job.nbytes - at).min(piece);
                want.push((job.device + at as u64, len));
                at += len;
            }
        }
        want.sort();
        prop_assert_eq!(issued, want);
        for (job, data) in case.jobs.iter().zip(&case.data) {
            prop_assert_eq!(&dev.peek(job.device, job.nbytes), data);
        }
        prop_assert_eq!(progress.iter().sum::<usize>(), case.total());
        prop_assert!(progress.iter().all(|&n| n > 0));
        let s = eng.stats();
        prop_assert_eq!(s.in_flight, 0);
        prop_assert_eq!(s.bulk_bytes, case.total() as u64);
        case.free_pinned(&dev);
        drop(t);
        drop(eng);
        prop_assert_eq!(dev.live_host_allocations(), 0);
    }
}
