//! The transfer engine: copies between host and device memory on one upload and one
//! download stream, issued chunk by chunk from a priority queue, ordered with compute
//! through events, and tracked by handles that keep their host memory alive.
//!
//! Host memory: memory the driver knows as page-locked (a HostBuffer, torch's pinned
//! tensors, the engine's own buffers) is copied by DMA directly; pageable memory (NumPy
//! arrays, memory-mapped files) is staged through the engine's pinned chunks. The engine
//! never page-locks the caller's memory itself: registering costs about as much as the copy
//! and the memory may be freed or remapped by its owner at any time.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::device::{CopyDevice, DeviceResult, EventId, StreamId};
use super::queue::{Priority, Queue};
use super::staging::{host_copy, Held, PinnedCache, Ring};

/// Whatever must outlive the copy (the caller's array); dropped once the copy has run.
pub type Keep = Box<dyn Any + Send>;

#[derive(Debug, Clone)]
pub struct Config {
    /// Bytes per staging chunk and per issue step of the queue.
    pub chunk_bytes: usize,
    /// Staging chunks per direction.
    pub chunks: usize,
    /// Uploads of at most this many bytes use a slot instead of a chunk.
    pub slot_bytes: usize,
    pub slots: usize,
    /// Threads for the host memcpy of one staged chunk.
    pub copy_threads: usize,
    /// Pinned bytes kept for reuse by deferred downloads.
    pub pinned_cache_bytes: usize,
    /// Threads of a bulk upload (htod_bulk), each with `bulk_buffers` pinned buffers of
    /// `bulk_piece_bytes`.
    pub bulk_threads: usize,
    pub bulk_piece_bytes: usize,
    pub bulk_buffers: usize,
}

impl Default for Config {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            // 16 MiB x 4 threads: the fastest staged setting of the H200 sweep
            // (bench/results/h200-transfer.json, transfer_sweep rows).
            chunk_bytes: 16 << 20,
            chunks: 4,
            slot_bytes: 4096,
            slots: 64,
            copy_threads: cores.clamp(1, 4),
            pinned_cache_bytes: 256 << 20,
            // 8 threads x 2 x 4 MiB = 64 MiB pinned, as much as the staging ring. The H200
            // host's sweep of the Python-side stager this replaces (2.2 GB checkpoint, warm
            // page cache): 4 MiB pieces 35.3 GB/s, 8 MiB 34.4, 16 MiB 27.1; 4 threads
            // 24.5, 8 threads 35.3, 12 threads 37.0.
            bulk_threads: cores.clamp(1, 8),
            bulk_piece_bytes: 4 << 20,
            bulk_buffers: 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    HostToDevice,
    DeviceToHost,
}

/// One copy request.
#[derive(Debug, Clone)]
pub struct Copy {
    pub direction: Direction,
    pub device: u64,
    /// The host address (source or destination).
    pub host: usize,
    pub nbytes: usize,
    pub priority: Priority,
    /// Work queued on this stream before the request runs before the copy (the stream that
    /// last used the device memory).
    pub after: Option<StreamId>,
    /// Work queued on this stream after the request runs after the copy (the stream that
    /// reads what it uploads).
    pub before: Option<StreamId>,
    /// Device to pageable host memory: true lands in a pinned buffer of its own and is
    /// copied out when the copy is found finished (submit returns at once); false streams
    /// through the staging chunks and submit returns once the host holds the data.
    pub deferred: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub copies: u64,
    pub bytes: u64,
    pub chunks: u64,
    pub staged_bytes: u64,
    pub direct_bytes: u64,
    pub slot_copies: u64,
    pub in_flight: u64,
    /// Bytes uploaded by bulk uploads (htod_bulk), also counted in bytes and
    /// staged_bytes/direct_bytes.
    pub bulk_bytes: u64,
    /// Pinned bytes the engine holds: staging chunks, slots, bulk buffers and cached
    /// download buffers.
    pub pinned_bytes: u64,
}

struct Deferred {
    buf: usize,
    class: usize,
    dst: usize,
    len: usize,
}

#[derive(Default)]
pub(super) struct Progress {
    done: bool,
    pub(super) event: Option<EventId>,
    pub(super) keep: Option<Keep>,
    deferred: Option<Deferred>,
}

#[derive(Default)]
pub(super) struct Shared {
    pub(super) progress: Mutex<Progress>,
}

struct Job {
    copy: Copy,
    issued: usize,
    started: bool,
    pinned: bool,
    shared: Arc<Shared>,
}

pub(super) struct State {
    queue: Queue<Job>,
    up: Ring,
    slots: Ring,
    down: Ring,
    held: VecDeque<Held>,
    pinned: PinnedCache,
    pub(super) events: Vec<EventId>,
    pub(super) in_flight: Vec<Arc<Shared>>,
    finished: HashMap<u64, DeviceResult<Arc<Shared>>>,
    pub(super) stats: Stats,
    /// Bulk buffers allocated (as of the last bulk upload).
    pub(super) bulk_buffers: usize,
}

pub(super) struct Inner<D: CopyDevice> {
    pub(super) dev: Arc<D>,
    pub(super) config: Config,
    pub(super) h2d: StreamId,
    d2h: StreamId,
    pub(super) state: Mutex<State>,
    /// The bulk upload's buffers, one ring per thread; locked for a whole bulk upload.
    pub(super) bulk: Mutex<Vec<Ring>>,
}

/// The engine; cheap to share (an Arc inside).
pub struct Engine<D: CopyDevice> {
    pub(super) inner: Arc<Inner<D>>,
}

impl<D: CopyDevice> Clone for Engine<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// A copy in flight. The host memory it reads or writes is kept alive until the copy has
/// run even if this handle is dropped first (the engine keeps it).
pub struct Transfer<D: CopyDevice> {
    pub(super) inner: Arc<Inner<D>>,
    pub(super) shared: Arc<Shared>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while locked leaves plain data behind; the next user carries on.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<D: CopyDevice> Engine<D> {
    /// Creates the upload and download streams, both at the device's greatest priority:
    /// the copy engines run one stream's work in order, so urgency between requests comes
    /// from the queue, and the streams must not queue behind other work.
    pub fn new(dev: Arc<D>, config: Config) -> DeviceResult<Self> {
        let (_least, greatest) = dev.priority_range()?;
        let h2d = dev.stream_create(greatest)?;
        let d2h = match dev.stream_create(greatest) {
            Ok(s) => s,
            Err(e) => {
                dev.stream_destroy(h2d);
                return Err(e);
            }
        };
        let state = State {
            queue: Queue::default(),
            up: Ring::new(config.chunk_bytes, config.chunks),
            slots: Ring::new(config.slot_bytes, config.slots),
            down: Ring::new(config.chunk_bytes, config.chunks),
            held: VecDeque::new(),
            pinned: PinnedCache::new(config.pinned_cache_bytes),
            events: Vec::new(),
            in_flight: Vec::new(),
            finished: HashMap::new(),
            stats: Stats::default(),
            bulk_buffers: 0,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                dev,
                config,
                h2d,
                d2h,
                state: Mutex::new(state),
                bulk: Mutex::new(Vec::new()),
            }),
        })
    }

    pub fn h2d_stream(&self) -> StreamId {
        self.inner.h2d
    }

    pub fn d2h_stream(&self) -> StreamId {
        self.inner.d2h
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn stats(&self) -> Stats {
        let st = lock(&self.inner.state);
        let mut s = st.stats.clone();
        s.in_flight = st.in_flight.len() as u64;
        let c = &self.inner.config;
        s.pinned_bytes = ((st.up.allocated() + st.down.allocated()) * c.chunk_bytes
            + st.slots.allocated() * c.slot_bytes
            + st.bulk_buffers * c.bulk_piece_bytes
            + st.pinned.cached_bytes()) as u64;
        s
    }

    /// Queues one copy and issues queued work, most urgent first, until this copy is
    /// issued. See `submit_many`.
    ///
    /// # Safety
    /// As submit_many.
    pub unsafe fn submit(&self, copy: Copy, keep: Option<Keep>) -> DeviceResult<Transfer<D>> {
        let mut out = self.submit_many(vec![(copy, keep)])?;
        Ok(out.remove(0))
    }

    /// Queues the copies and issues queued work (other threads' too), most urgent first,
    /// until all of them are issued. On return a pageable source may be reused and a
    /// non-deferred pageable destination holds its data; pinned memory is read or written
    /// by the DMA until the transfer is done, and `keep` lives until then.
    ///
    /// # Safety
    /// Each host range is valid for its nbytes (readable for uploads, writable for
    /// downloads) until the transfer is done, which `keep` must guarantee if the caller
    /// does not wait.
    pub unsafe fn submit_many(
        &self,
        copies: Vec<(Copy, Option<Keep>)>,
    ) -> DeviceResult<Vec<Transfer<D>>> {
        let inner = &self.inner;
        inner.reap();
        let mut seqs = Vec::with_capacity(copies.len());
        {
            let mut st = lock(&inner.state);
            for (copy, keep) in copies {
                let shared = Arc::new(Shared::default());
                lock(&shared.progress).keep = keep;
                let priority = copy.priority;
                let job = Job {
                    copy,
                    issued: 0,
                    started: false,
                    pinned: false,
                    shared,
                };
                seqs.push(st.queue.push(priority, job));
            }
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut first_err = None;
        for seq in seqs {
            match inner.drive_until(seq) {
                Ok(shared) => out.push(Transfer {
                    inner: inner.clone(),
                    shared,
                }),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Ok(out),
            Some(e) => Err(e),
        }
    }

    /// Finishes every transfer whose copy has run (drops what it kept, copies out deferred
    /// downloads).
    pub fn reap(&self) {
        self.inner.reap();
    }
}

impl<D: CopyDevice> Transfer<D> {
    /// True once the copy has run (and a deferred download has reached its destination).
    pub fn done(&self) -> DeviceResult<bool> {
        let event = {
            let p = lock(&self.shared.progress);
            if p.done {
                return Ok(true);
            }
            p.event
        };
        match event {
            Some(e) if !self.inner.dev.event_query(e)? => Ok(false),
            _ => {
                self.inner.complete(&self.shared);
                Ok(true)
            }
        }
    }

    /// Waits for this copy alone.
    pub fn wait(&self) -> DeviceResult<()> {
        let event = {
            let p = lock(&self.shared.progress);
            if p.done {
                return Ok(());
            }
            p.event
        };
        if let Some(e) = event {
            self.inner.dev.event_synchronize(e)?;
        }
        self.inner.complete(&self.shared);
        Ok(())
    }
}

impl<D: CopyDevice> Inner<D> {
    fn stream(&self, direction: Direction) -> StreamId {
        match direction {
            Direction::HostToDevice => self.h2d,
            Direction::DeviceToHost => self.d2h,
        }
    }

    fn drive_until(&self, seq: u64) -> DeviceResult<Arc<Shared>> {
        loop {
            let mut st = lock(&self.state);
            if let Some(r) = st.finished.remove(&seq) {
                return r;
            }
            let Some((priority, s, mut job)) = st.queue.pop() else {
                // Issued by another thread, whose result is not ours to take: impossible,
                // every finished job goes to `finished`.
                unreachable!("copy {seq} is neither queued nor finished");
            };
            match self.step(&mut st, &mut job) {
                Ok(true) => {
                    let done = self.finish(&mut st, job);
                    st.finished.insert(s, done);
                }
                Ok(false) => st.queue.put_back(priority, s, job),
                Err(e) => {
                    self.abandon(&mut st, &job);
                    st.finished.insert(s, Err(e));
                }
            }
        }
    }

    /// A copy failed part way: its chunks already issued may still read or write its host
    /// memory, so they are waited for (best effort: the device may be unusable) before the
    /// job and what it keeps are dropped, and its held download chunks are forgotten.
    fn abandon(&self, st: &mut State, job: &Job) {
        let id = job_id(job);
        st.held.retain(|h| h.job != id);
        if let Ok(e) = self.take_event(st) {
            if self
                .dev
                .event_record(e, self.stream(job.copy.direction))
                .is_ok()
            {
                let _ = self.dev.event_synchronize(e);
            }
            st.events.push(e);
        }
        if let Some(d) = lock(&job.shared.progress).deferred.take() {
            st.pinned.give(&*self.dev, d.buf, d.class);
        }
    }

    pub(super) fn take_event(&self, st: &mut State) -> DeviceResult<EventId> {
        match st.events.pop() {
            Some(e) => Ok(e),
            None => self.dev.event_create(),
        }
    }

    /// Issues the next chunk of `job`; true when all of it is issued.
    fn step(&self, st: &mut State, job: &mut Job) -> DeviceResult<bool> {
        let dev = &*self.dev;
        let c = &job.copy;
        let stream = self.stream(c.direction);
        if !job.started {
            job.started = true;
            if let Some(after) = c.after {
                let e = self.take_event(st)?;
                let r = dev
                    .event_record(e, after)
                    .and_then(|_| dev.stream_wait_event(stream, e));
                // The wait captured the event's state; the event may be recorded again.
                st.events.push(e);
                r?;
            }
            job.pinned = c.nbytes > 0 && dev.host_is_pinned(c.host as *const u8);
            if c.direction == Direction::DeviceToHost && c.deferred && !job.pinned && c.nbytes > 0 {
                let (buf, class) = st.pinned.take(dev, c.nbytes)?;
                lock(&job.shared.progress).deferred = Some(Deferred {
                    buf,
                    class,
                    dst: c.host,
                    len: c.nbytes,
                });
            }
            st.stats.copies += 1;
            st.stats.bytes += c.nbytes as u64;
        }
        if job.issued >= c.nbytes {
            return Ok(true);
        }
        let off = job.issued;
        let len = (c.nbytes - off).min(self.config.chunk_bytes);
        let (host, device) = (c.host + off, c.device + off as u64);
        st.stats.chunks += 1;
        if job.pinned {
            st.stats.direct_bytes += len as u64;
            // SAFETY: the caller keeps pinned memory alive until the transfer is done.
            unsafe {
                match c.direction {
                    Direction::HostToDevice => {
                        dev.memcpy_htod_async(device, host as *const u8, len, stream)?
                    }
                    Direction::DeviceToHost => {
                        dev.memcpy_dtoh_async(host as *mut u8, device, len, stream)?
                    }
                }
            }
        } else {
            st.stats.staged_bytes += len as u64;
            match c.direction {
                Direction::HostToDevice => {
                    let ring = if c.nbytes <= self.config.slot_bytes {
                        st.stats.slot_copies += 1;
                        &mut st.slots
                    } else {
                        &mut st.up
                    };
                    let i = ring.take(dev)?;
                    let chunk = ring.chunk(i);
                    // SAFETY: the chunk's last DMA has run (take settles it); the caller's
                    // source is readable for the request.
                    unsafe {
                        host_copy(chunk.ptr, host as *const u8, len, self.config.copy_threads);
                        dev.memcpy_htod_async(device, chunk.ptr, len, stream)?;
                    }
                    dev.event_record(chunk.event, stream)?;
                    chunk.pending = true;
                }
                Direction::DeviceToHost if c.deferred => {
                    let p = lock(&job.shared.progress);
                    let buf = p.deferred.as_ref().map_or(0, |d| d.buf);
                    // SAFETY: the engine's own buffer, held by the transfer until done.
                    unsafe { dev.memcpy_dtoh_async((buf + off) as *mut u8, device, len, stream)? };
                }
                Direction::DeviceToHost => {
                    // The next chunk in turn is the oldest held one once all are held: its
                    // download is copied out first.
                    while st.held.len() >= self.config.chunks.max(1) {
                        self.drain_oldest(st)?;
                    }
                    let i = st.down.take(dev)?;
                    let chunk = st.down.chunk(i);
                    // SAFETY: the chunk is free (not held); it is the engine's memory.
                    unsafe { dev.memcpy_dtoh_async(chunk.ptr, device, len, stream)? };
                    dev.event_record(chunk.event, stream)?;
                    chunk.pending = true;
                    st.held.push_back(Held {
                        chunk: i,
                        dst: host,
                        len,
                        job: job_id(job),
                    });
                }
            }
        }
        job.issued += len;
        Ok(job.issued >= c.nbytes)
    }

    /// Copies the oldest held download chunk out to its destination.
    fn drain_oldest(&self, st: &mut State) -> DeviceResult<()> {
        let Some(h) = st.held.pop_front() else {
            return Ok(());
        };
        let chunk = st.down.chunk(h.chunk);
        chunk.settle(&*self.dev)?;
        // SAFETY: the DMA into the chunk has run; the destination is the caller's, valid
        // for the request.
        unsafe { host_copy(h.dst as *mut u8, chunk.ptr, h.len, self.config.copy_threads) };
        Ok(())
    }

    /// All of `job` is issued: copies out its held download chunks, records its completion
    /// event, makes `before` wait for it, and tracks it until the event passes.
    fn finish(&self, st: &mut State, job: Job) -> DeviceResult<Arc<Shared>> {
        let id = job_id(&job);
        while st.held.iter().any(|h| h.job == id) {
            self.drain_oldest(st)?;
        }
        let stream = self.stream(job.copy.direction);
        let e = self.take_event(st)?;
        if let Err(err) = self.dev.event_record(e, stream) {
            st.events.push(e);
            return Err(err);
        }
        if let Some(before) = job.copy.before {
            self.dev.stream_wait_event(before, e)?;
        }
        lock(&job.shared.progress).event = Some(e);
        st.in_flight.push(job.shared.clone());
        Ok(job.shared)
    }

    /// The copy behind `shared` has run: copies out a deferred download, then gives back
    /// its buffer and event and drops what it kept. Idempotent.
    fn complete(&self, shared: &Arc<Shared>) {
        let (event, keep, deferred) = {
            let mut p = lock(&shared.progress);
            if p.done {
                return;
            }
            // The copy-out runs under the progress lock and `done` is set after it: another
            // thread's done() or wait() (which take this lock) must not see the transfer
            // done while this one is still filling the destination (a reap() on one thread
            // had handed a half-written result to a poll on another).
            if let Some(d) = &p.deferred {
                // SAFETY: the DMA into the buffer has run; `keep` holds the destination.
                unsafe {
                    host_copy(
                        d.dst as *mut u8,
                        d.buf as *const u8,
                        d.len,
                        self.config.copy_threads,
                    )
                };
            }
            p.done = true;
            (p.event.take(), p.keep.take(), p.deferred.take())
        };
        {
            let mut st = lock(&self.state);
            if let Some(d) = deferred {
                st.pinned.give(&*self.dev, d.buf, d.class);
            }
            if let Some(e) = event {
                st.events.push(e);
            }
            st.in_flight.retain(|s| !Arc::ptr_eq(s, shared));
        }
        drop(keep);
    }

    pub(super) fn reap(&self) {
        let done: Vec<Arc<Shared>> = {
            let st = lock(&self.state);
            st.in_flight
                .iter()
                .filter(|s| {
                    let e = lock(&s.progress).event;
                    e.is_none_or(|e| self.dev.event_query(e).unwrap_or(false))
                })
                .cloned()
                .collect()
        };
        for s in done {
            self.complete(&s);
        }
    }
}

fn job_id(job: &Job) -> u64 {
    Arc::as_ptr(&job.shared) as u64
}

impl<D: CopyDevice> Drop for Inner<D> {
    fn drop(&mut self) {
        let dev = self.dev.clone();
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for s in std::mem::take(&mut st.in_flight) {
            let mut p = lock(&s.progress);
            if let Some(e) = p.event.take() {
                let _ = dev.event_synchronize(e);
                st.events.push(e);
            }
            if let Some(d) = p.deferred.take() {
                // SAFETY: synchronized above.
                unsafe { host_copy(d.dst as *mut u8, d.buf as *const u8, d.len, 1) };
                st.pinned.give(&*dev, d.buf, d.class);
            }
            p.done = true;
            p.keep = None;
        }
        st.up.release(&*dev);
        st.slots.release(&*dev);
        st.down.release(&*dev);
        st.pinned.release(&*dev);
        let bulk = self.bulk.get_mut().unwrap_or_else(|e| e.into_inner());
        for ring in bulk.iter_mut() {
            ring.release(&*dev);
        }
        for e in st.events.drain(..) {
            dev.event_destroy(e);
        }
        dev.stream_destroy(self.h2d);
        dev.stream_destroy(self.d2h);
    }
}
