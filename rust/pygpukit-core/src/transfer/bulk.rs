//! Bulk uploads of pageable host memory (model loading), staged on several threads at once.
//!
//! One thread's memcpy out of the page cache runs at about a sixth of the H2D DMA rate
//! (H200 host: 8.4 GB/s against 54.5), and the queue's staged path copies one chunk at a
//! time under the engine's lock (its memcpy split over threads spawned per chunk), so it
//! loaded at 14-16 GB/s whatever its chunk size or thread count. Here each of
//! `bulk_threads` workers owns `bulk_buffers` pinned buffers of `bulk_piece_bytes`: it
//! claims the next piece of the work, copies it into its next buffer (once that buffer's
//! last DMA has run, by the event recorded behind it) and issues the buffer's DMA on the
//! upload stream, while the other workers copy. Pieces of memory the driver knows as
//! page-locked are issued directly. The calling thread reports progress as pieces are
//! issued; the call returns once every piece is issued, with a Transfer that is done once
//! every DMA has run.
//!
//! The buffers are kept for the next bulk upload; one bulk upload runs at a time. Bulk
//! pieces are issued on the upload stream beside the queue's chunks: a request submitted
//! meanwhile is issued at the next piece boundary, behind at most the pieces in flight
//! (threads x buffers x piece bytes, 64 MiB by default).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::device::{CopyDevice, DeviceError, DeviceResult, StreamId};
use super::engine::{lock, Engine, Keep, Shared, Transfer};
use super::staging::{host_copy, Ring};

/// One upload of a bulk load: `nbytes` from host address `host` to device address
/// `device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkJob {
    pub device: u64,
    pub host: usize,
    pub nbytes: usize,
}

#[derive(Debug, Clone, Copy)]
struct Piece {
    device: u64,
    host: usize,
    len: usize,
    pinned: bool,
}

/// The jobs cut into pieces of at most `piece_bytes`, in order (a job's pieces land at
/// consecutive addresses).
fn split(jobs: &[BulkJob], piece_bytes: usize, pinned: &[bool]) -> Vec<Piece> {
    let mut out = Vec::new();
    for (job, &pinned) in jobs.iter().zip(pinned) {
        let mut at = 0;
        while at < job.nbytes {
            let len = (job.nbytes - at).min(piece_bytes);
            out.push(Piece {
                device: job.device + at as u64,
                host: job.host + at,
                len,
                pinned,
            });
            at += len;
        }
    }
    out
}

/// What the workers tell the calling thread.
#[derive(Default)]
struct Report {
    issued_bytes: usize,
    running: usize,
    error: Option<DeviceError>,
}

/// The workers' shared state for one bulk upload.
struct Work<'a, D: CopyDevice> {
    dev: &'a D,
    stream: StreamId,
    pieces: Vec<Piece>,
    next: AtomicUsize,
    failed: AtomicBool,
    report: Mutex<Report>,
    changed: Condvar,
}

impl<D: CopyDevice> Work<'_, D> {
    /// Claims and issues pieces until none is left or a worker failed.
    fn run(&self, ring: &mut Ring) {
        let r = self.issue_pieces(ring);
        let mut rep = lock(&self.report);
        if let Err(e) = r {
            self.failed.store(true, Ordering::SeqCst);
            rep.error.get_or_insert(e);
        }
        rep.running -= 1;
        self.changed.notify_all();
    }

    fn issue_pieces(&self, ring: &mut Ring) -> DeviceResult<()> {
        let dev = self.dev;
        while !self.failed.load(Ordering::SeqCst) {
            let i = self.next.fetch_add(1, Ordering::SeqCst);
            let Some(p) = self.pieces.get(i) else {
                return Ok(());
            };
            if p.pinned {
                // SAFETY: the caller's page-locked source, kept alive until the transfer is
                // done.
                unsafe {
                    dev.memcpy_htod_async(p.device, p.host as *const u8, p.len, self.stream)?
                };
            } else {
                let k = ring.take(dev)?;
                let chunk = ring.chunk(k);
                // SAFETY: take settled the buffer's last DMA; the caller's source is
                // readable for the call, and the buffer holds a whole piece.
                unsafe {
                    host_copy(chunk.ptr, p.host as *const u8, p.len, 1);
                    dev.memcpy_htod_async(p.device, chunk.ptr, p.len, self.stream)?;
                }
                dev.event_record(chunk.event, self.stream)?;
                chunk.pending = true;
            }
            lock(&self.report).issued_bytes += p.len;
            self.changed.notify_all();
        }
        Ok(())
    }
}

impl<D: CopyDevice> Engine<D> {
    /// Uploads every job on the upload stream, staged through the engine's bulk buffers on
    /// `bulk_threads` threads at once (pageable sources) or by DMA directly (page-locked
    /// ones), after the work queued on `after` and before the work queued on `before`
    /// later. `progress(nbytes)` is called on the calling thread with the bytes issued
    /// since its last call. Returns once every piece is issued: a pageable source may then
    /// be reused; the Transfer is done once every DMA has run and holds `keep` until then.
    /// On an error the pieces already issued are waited for before it is returned.
    ///
    /// # Safety
    /// Each job's host range is readable for its nbytes until this returns, and a
    /// page-locked one until the transfer is done, which `keep` must guarantee if the
    /// caller does not wait.
    pub unsafe fn htod_bulk(
        &self,
        jobs: &[BulkJob],
        after: Option<StreamId>,
        before: Option<StreamId>,
        keep: Option<Keep>,
        progress: &mut dyn FnMut(usize),
    ) -> DeviceResult<Transfer<D>> {
        let inner = &*self.inner;
        let dev = &*inner.dev;
        let c = &inner.config;
        inner.reap();
        let pinned: Vec<bool> = jobs
            .iter()
            .map(|j| j.nbytes > 0 && dev.host_is_pinned(j.host as *const u8))
            .collect();
        let pieces = split(jobs, c.bulk_piece_bytes.max(1), &pinned);
        let staged_bytes: usize = pieces.iter().filter(|p| !p.pinned).map(|p| p.len).sum();
        let total: usize = pieces.iter().map(|p| p.len).sum();
        // One bulk upload at a time: the buffers are shared.
        let mut rings = lock(&inner.bulk);
        let workers = c.bulk_threads.max(1).min(pieces.len());
        while rings.len() < workers {
            rings.push(Ring::new(c.bulk_piece_bytes.max(1), c.bulk_buffers.max(1)));
        }
        if let Some(after) = after {
            let mut st = lock(&inner.state);
            let e = inner.take_event(&mut st)?;
            let r = dev
                .event_record(e, after)
                .and_then(|_| dev.stream_wait_event(inner.h2d, e));
            // The wait captured the event's state; the event may be recorded again.
            st.events.push(e);
            r?;
        }
        let work = Work {
            dev,
            stream: inner.h2d,
            pieces,
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            report: Mutex::new(Report {
                running: workers,
                ..Report::default()
            }),
            changed: Condvar::new(),
        };
        let error = std::thread::scope(|scope| {
            for (k, ring) in rings.iter_mut().take(workers).enumerate() {
                let work = &work;
                std::thread::Builder::new()
                    .name(format!("pygpukit-bulk-{k}"))
                    .spawn_scoped(scope, move || work.run(ring))
                    .expect("spawning a bulk upload thread");
            }
            let mut reported = 0;
            loop {
                let mut rep = lock(&work.report);
                while rep.issued_bytes == reported && rep.running > 0 {
                    rep = work.changed.wait(rep).unwrap_or_else(|e| e.into_inner());
                }
                let (issued, running) = (rep.issued_bytes, rep.running);
                if running == 0 {
                    let error = rep.error.take();
                    drop(rep);
                    if issued > reported {
                        progress(issued - reported);
                    }
                    return error;
                }
                drop(rep);
                progress(issued - reported);
                reported = issued;
            }
        });
        let allocated: usize = rings.iter().map(Ring::allocated).sum();
        drop(rings);
        let mut st = lock(&inner.state);
        st.bulk_buffers = allocated;
        if let Some(e) = error {
            // Direct pieces already issued read the caller's memory, which `keep` may free
            // once this returns: wait for them (best effort: the device may be unusable).
            if let Ok(ev) = inner.take_event(&mut st) {
                if dev.event_record(ev, inner.h2d).is_ok() {
                    let _ = dev.event_synchronize(ev);
                }
                st.events.push(ev);
            }
            return Err(e);
        }
        st.stats.copies += 1;
        st.stats.bytes += total as u64;
        st.stats.chunks += work.pieces.len() as u64;
        st.stats.staged_bytes += staged_bytes as u64;
        st.stats.direct_bytes += (total - staged_bytes) as u64;
        st.stats.bulk_bytes += total as u64;
        let e = inner.take_event(&mut st)?;
        if let Err(err) = dev.event_record(e, inner.h2d) {
            st.events.push(e);
            return Err(err);
        }
        if let Some(before) = before {
            dev.stream_wait_event(before, e)?;
        }
        let shared = Arc::new(Shared::default());
        {
            let mut p = lock(&shared.progress);
            p.event = Some(e);
            p.keep = keep;
        }
        st.in_flight.push(shared.clone());
        Ok(Transfer {
            inner: self.inner.clone(),
            shared,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_cuts_each_job_at_piece_boundaries() {
        let jobs = [
            BulkJob {
                device: 100,
                host: 1000,
                nbytes: 10,
            },
            BulkJob {
                device: 500,
                host: 3000,
                nbytes: 0,
            },
            BulkJob {
                device: 900,
                host: 5000,
                nbytes: 4,
            },
        ];
        let p = split(&jobs, 4, &[false, false, true]);
        let got: Vec<(u64, usize, usize, bool)> = p
            .iter()
            .map(|p| (p.device, p.host, p.len, p.pinned))
            .collect();
        assert_eq!(
            got,
            vec![
                (100, 1000, 4, false),
                (104, 1004, 4, false),
                (108, 1008, 2, false),
                (900, 5000, 4, true),
            ]
        );
    }
}
