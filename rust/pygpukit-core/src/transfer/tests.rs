//! The engine against the lazy fake device: round trips, ordering with compute streams,
//! sources dropped in flight, queue order, and a proptest of random request mixes.

use std::sync::Arc;

use proptest::prelude::*;

use super::fake::{FakeDevice, POISON};
use super::*;

fn small_config() -> Config {
    Config {
        chunk_bytes: 64,
        chunks: 2,
        slot_bytes: 16,
        slots: 3,
        copy_threads: 2,
        pinned_cache_bytes: 1024,
        bulk_threads: 2,
        bulk_piece_bytes: 32,
        bulk_buffers: 2,
    }
}

fn engine(dev: &Arc<FakeDevice>) -> Engine<FakeDevice> {
    Engine::new(dev.clone(), small_config()).unwrap()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

fn upload(dev: u64, src: &[u8], priority: Priority) -> Copy {
    Copy {
        direction: Direction::HostToDevice,
        device: dev,
        host: src.as_ptr() as usize,
        nbytes: src.len(),
        priority,
        after: Some(0),
        before: Some(0),
        deferred: false,
    }
}

fn download(dev: u64, dst: &mut [u8], deferred: bool) -> Copy {
    Copy {
        direction: Direction::DeviceToHost,
        device: dev,
        host: dst.as_mut_ptr() as usize,
        nbytes: dst.len(),
        priority: Priority::Normal,
        after: Some(0),
        before: None,
        deferred,
    }
}

#[test]
fn engine_and_transfers_cross_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Engine<FakeDevice>>();
    shareable::<Transfer<FakeDevice>>();
}

#[test]
fn staged_round_trip_of_many_sizes() {
    let dev = FakeDevice::new();
    let eng = engine(&dev);
    for n in [1usize, 15, 16, 17, 63, 64, 65, 200, 513] {
        let src = pattern(n, n as u8);
        let d = dev.alloc(n, 0);
        // SAFETY: src and back outlive the waits below.
        let t = unsafe { eng.submit(upload(d, &src, Priority::Normal), None) }.unwrap();
        let mut back = vec![0u8; n];
        let r = unsafe { eng.submit(download(d, &mut back, false), None) }.unwrap();
        assert!(r.done().unwrap() || r.wait().is_ok());
        t.wait().unwrap();
        assert_eq!(back, src, "{n} bytes");
    }
    let s = eng.stats();
    assert!(s.slot_copies > 0 && s.staged_bytes > 0 && s.direct_bytes == 0);
}

#[test]
fn chunk_buffers_are_not_refilled_before_their_dma_ran() {
    // The fake runs nothing until forced: refilling chunk 0 for the third chunk must first
    // wait for the first DMA, or the device gets the third chunk's bytes twice.
    let dev = FakeDevice::new();
    let eng = engine(&dev);
    let src = pattern(64 * 5 + 7, 3);
    let d = dev.alloc(src.len(), 0);
    let t = unsafe { eng.submit(upload(d, &src, Priority::Low), None) }.unwrap();
    t.wait().unwrap();
    assert_eq!(dev.peek(d, src.len()), src);
}

#[test]
fn uploads_are_ordered_before_compute_and_after_earlier_compute() {
    let dev = FakeDevice::new();
    let eng = engine(&dev);
    let old = pattern(100, 1);
    let new = pattern(100, 2);
    let d = dev.alloc(100, 0);
    dev.launch_write(0, d, old.clone());
    // A kernel queued before the upload reads the block's old bytes (the block was reused).
    let before = dev.launch_read(0, d, 100);
    let _t = unsafe { eng.submit(upload(d, &new, Priority::Normal), None) }.unwrap();
    let after = dev.launch_read(0, d, 100);
    dev.sync_stream(0); // runs the compute stream only; its wait pulls the upload in
    assert_eq!(*before.lock().unwrap(), old);
    assert_eq!(*after.lock().unwrap(), new);
}

#[test]
fn downloads_wait_for_the_compute_stream() {
    let dev = FakeDevice::new();
    let eng = engine(&dev);
    let d = dev.alloc(300, 0);
    let data = pattern(300, 9);
    dev.launch_write(0, d, data.clone()); // queued, not run
    let mut staged = vec![0u8; 300];
    let mut deferred = vec![0u8; 300];
    unsafe { eng.submit(download(d, &mut staged, false), None) }.unwrap();
    let t = unsafe { eng.submit(download(d, &mut deferred, true), None) }.unwrap();
    assert_eq!(staged, data);
    assert!(!t.done().unwrap(), "the fake ran nothing yet");
    t.wait().unwrap();
    assert_eq!(deferred, data);
}

#[test]
fn pinned_source_survives_being_dropped_in_flight() {
    struct Pinned {
        dev: Arc<FakeDevice>,
        ptr: *mut u8,
    }
    // SAFETY: the fake's memory is plain heap memory.
    unsafe impl Send for Pinned {}
    impl Drop for Pinned {
        fn drop(&mut self) {
            // SAFETY: allocated by host_alloc below.
            unsafe { self.dev.host_free(self.ptr) };
        }
    }
    let dev = FakeDevice::new();
    let eng = engine(&dev);
    let n = 200;
    let src = pattern(n, 5);
    let ptr = dev.host_alloc(n).unwrap();
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr, n) };
    let d = dev.alloc(n, 0);
    let copy = Copy {
        host: ptr as usize,
        ..upload(d, &src, Priority::Normal)
    };
    let keep: Keep = Box::new(Pinned {
        dev: dev.clone(),
        ptr,
    });
    let t = unsafe { eng.submit(copy, Some(keep)) }.unwrap();
    drop(t); // the handle goes first; the engine still holds the source
    assert_eq!(dev.live_host_allocations_containing(ptr), 1);
    dev.run_all();
    assert_eq!(dev.peek(d, n), src);
    eng.reap(); // now the copy has run, the source is released
    assert_eq!(dev.live_host_allocations_containing(ptr), 0);
    assert_eq!(eng.stats().direct_bytes, n as u64);
}

#[test]
fn freed_source_would_be_caught_by_the_fake() {
    // The check above means something: a pinned source freed before its DMA runs lands
    // as poison.
    let dev = FakeDevice::new();
    let eng = engine(&dev);
    let ptr = dev.host_alloc(32).unwrap();
    unsafe { std::ptr::write_bytes(ptr, 7, 32) };
    let d = dev.alloc(32, 0);
    let copy = Copy {
        direction: Direction::HostToDevice,
        device: d,
        host: ptr as usize,
        nbytes: 32,
        priority: Priority::Normal,
        after: None,
        before: None,
        deferred: false,
    };
    let _t = unsafe { eng.submit(copy, None) }.unwrap();
    unsafe { dev.host_free(ptr) };
    dev.run_all();
    assert_eq!(dev.peek(d, 32), vec![POISON; 32]);
}

#[test]
fn a_batch_is_issued_most_urgent_first() {
    let dev = FakeDevice::new();
    let eng = engine(&dev);
    let low = pattern(200, 1);
    let high = pattern(100, 2);
    let (dl, dh) = (dev.alloc(200, 0), dev.alloc(100, 0));
    let ts = unsafe {
        eng.submit_many(vec![
            (upload(dl, &low, Priority::Low), None),
            (upload(dh, &high, Priority::High), None),
        ])
    }
    .unwrap();
    let order: Vec<u64> = dev.issued().iter().map(|i| i.device).collect();
    assert_eq!(order, vec![dh, dh + 64, dl, dl + 64, dl + 128, dl + 192]);
    for t in &ts {
        t.wait().unwrap();
    }
    assert_eq!(dev.peek(dl, 200), low);
    assert_eq!(dev.peek(dh, 100), high);
}

#[test]
fn a_failed_copy_reports_the_device_error_and_the_engine_goes_on() {
    let dev = FakeDevice::new();
    let eng = engine(&dev);
    let src = pattern(200, 4);
    let d = dev.alloc(200, 0);
    dev.fail_upload_after(1);
    let err = unsafe { eng.submit(upload(d, &src, Priority::Normal), None) }
        .err()
        .unwrap();
    assert_eq!(err.code, 700);
    assert!(err.to_string().contains("illegal address"));
    let t = unsafe { eng.submit(upload(d, &src, Priority::Normal), None) }.unwrap();
    t.wait().unwrap();
    assert_eq!(dev.peek(d, 200), src);
}

#[test]
fn dropping_the_engine_finishes_deferred_downloads_and_frees_its_memory() {
    let dev = FakeDevice::new();
    let data = pattern(150, 8);
    let d = dev.alloc(150, 0);
    dev.launch_write(0, d, data.clone());
    let mut out = vec![0u8; 150];
    {
        let eng = engine(&dev);
        let t = unsafe { eng.submit(download(d, &mut out, true), None) }.unwrap();
        drop(t);
        assert!(dev.live_host_allocations() > 0);
    }
    assert_eq!(out, data);
    assert_eq!(dev.live_host_allocations(), 0);
}

#[test]
fn a_deferred_download_is_not_done_before_its_copy_out_ends() {
    // Another thread's reap() may complete a deferred download (copy it out of the engine's
    // buffer) while its owner polls done(): done() must not say true until the bytes are
    // all in place. A large download makes the copy-out long; the reaper gets a head start.
    let dev = FakeDevice::new();
    let n = 16 << 20;
    let data = pattern(n, 5);
    let d = dev.alloc(n, 0);
    dev.launch_write(0, d, data.clone());
    let cfg = Config {
        copy_threads: 1,
        ..small_config()
    };
    let eng = Arc::new(Engine::new(dev.clone(), cfg).unwrap());
    let mut out = vec![0u8; n];
    // SAFETY: `out` outlives the transfer (done() is true before it is read).
    let t = unsafe { eng.submit(download(d, &mut out, true), None) }.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reaper = {
        let (eng, stop) = (eng.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                eng.reap();
            }
        })
    };
    dev.run_all(); // the DMA has run: the next reap() takes the copy-out
    std::thread::sleep(std::time::Duration::from_millis(2));
    while !t.done().unwrap() {}
    let ok = out == data;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    reaper.join().unwrap();
    assert!(
        ok,
        "done() returned before the copy-out had filled the destination"
    );
}

#[derive(Debug, Clone)]
struct Req {
    upload: bool,
    n: usize,
    priority: Priority,
    pinned: bool,
    deferred: bool,
}

fn req() -> impl Strategy<Value = Req> {
    (
        any::<bool>(),
        0usize..300,
        0u8..3,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(upload, n, p, pinned, deferred)| Req {
            upload,
            n,
            priority: [Priority::Low, Priority::Normal, Priority::High][p as usize],
            pinned,
            deferred,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random batches of uploads and downloads, staged or pinned, through a small staging
    /// pool on the lazy device: every byte arrives, the issue order follows the queue
    /// (priority, then arrival), the staging pool never grows past its configured chunks,
    /// and after the waits nothing is in flight.
    #[test]
    fn random_batches_round_trip_in_queue_order(reqs in proptest::collection::vec(req(), 1..12)) {
        let dev = FakeDevice::new();
        let eng = engine(&dev);
        let mut hosts: Vec<Vec<u8>> = Vec::new();
        let mut pinned: Vec<*mut u8> = Vec::new();
        let mut devs = Vec::new();
        let mut copies = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let data = pattern(r.n, i as u8);
            let d = dev.alloc(r.n, 0);
            if !r.upload {
                dev.launch_write(0, d, data.clone());
            }
            let host = if r.upload { data.clone() } else { vec![0u8; r.n] };
            let addr = if r.pinned && r.n > 0 {
                let p = dev.host_alloc(r.n).unwrap();
                unsafe { std::ptr::copy_nonoverlapping(host.as_ptr(), p, r.n) };
                pinned.push(p);
                p as usize
            } else {
                hosts.push(host);
                hosts.last().unwrap().as_ptr() as usize
            };
            devs.push((d, data, addr));
            copies.push((Copy {
                direction: if r.upload { Direction::HostToDevice } else { Direction::DeviceToHost },
                device: d,
                host: addr,
                nbytes: r.n,
                priority: r.priority,
                after: Some(0),
                before: Some(0),
                deferred: r.deferred,
            }, None));
        }
        let ts = unsafe { eng.submit_many(copies) }.unwrap();
        // Issue order: the requests' first chunks appear in queue order.
        let mut expected: Vec<usize> = (0..reqs.len()).filter(|&i| reqs[i].n > 0).collect();
        expected.sort_by_key(|&i| (std::cmp::Reverse(reqs[i].priority), i));
        let mut seen = Vec::new();
        for is in dev.issued() {
            let i = devs.iter().position(|(d, _, _)| is.device >= *d && is.device < d + 300).unwrap();
            if seen.last() != Some(&i) {
                seen.push(i);
            }
        }
        prop_assert_eq!(seen, expected);
        for t in &ts {
            t.wait().unwrap();
            prop_assert!(t.done().unwrap());
        }
        for (i, (d, data, addr)) in devs.iter().enumerate() {
            if reqs[i].upload {
                prop_assert_eq!(&dev.peek(*d, data.len()), data);
            } else {
                let got = unsafe { std::slice::from_raw_parts(*addr as *const u8, data.len()) };
                prop_assert_eq!(got, &data[..]);
            }
        }
        let s = eng.stats();
        prop_assert_eq!(s.in_flight, 0);
        prop_assert_eq!(s.copies, reqs.len() as u64);
        prop_assert_eq!(s.staged_bytes + s.direct_bytes, reqs.iter().map(|r| r.n as u64).sum::<u64>());
        for p in pinned {
            unsafe { dev.host_free(p) };
        }
        drop(ts);
        drop(eng);
        prop_assert_eq!(dev.live_host_allocations(), 0);
    }
}
