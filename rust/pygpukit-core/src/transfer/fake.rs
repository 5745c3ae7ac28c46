//! A fake device for the engine's tests. Work queued on a stream runs only when something
//! forces it (an event synchronize, a wait of another stream that is being run, or
//! run_all), so a staging buffer refilled before its DMA ran, a missing event wait or host
//! memory freed under a copy all show up as wrong bytes. Freed host memory is overwritten
//! with POISON and kept, so a late read sees the poison instead of undefined behaviour.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::device::{CopyDevice, DeviceError, DeviceResult, EventId, StreamId};

pub const POISON: u8 = 0xEE;

enum Op {
    HtoD {
        dst: u64,
        src: usize,
        n: usize,
    },
    DtoH {
        dst: usize,
        src: u64,
        n: usize,
    },
    Wait {
        stream: StreamId,
        pos: u64,
    },
    Read {
        addr: u64,
        n: usize,
        out: Arc<Mutex<Vec<u8>>>,
    },
    Write {
        addr: u64,
        data: Vec<u8>,
    },
}

#[derive(Default)]
struct FakeStream {
    ops: VecDeque<Op>,
    queued: u64,
    executed: u64,
}

/// One issued copy, in issue order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub stream: StreamId,
    pub device: u64,
    pub nbytes: usize,
}

#[derive(Default)]
struct State {
    device: BTreeMap<u64, Vec<u8>>,
    next_device: u64,
    streams: HashMap<StreamId, FakeStream>,
    events: HashMap<EventId, Option<(StreamId, u64)>>,
    host: HashMap<usize, Box<[u8]>>,
    freed: Vec<Box<[u8]>>,
    next_handle: u64,
    issued: Vec<Issued>,
    fail_htod_at: Option<u64>,
}

#[derive(Default)]
pub struct FakeDevice {
    state: Mutex<State>,
}

impl State {
    fn device_slice(&mut self, addr: u64, n: usize) -> &mut [u8] {
        let (&base, mem) = self
            .device
            .range_mut(..=addr)
            .next_back()
            .expect("fake device: address below every allocation");
        let off = (addr - base) as usize;
        assert!(
            off + n <= mem.len(),
            "fake device: copy past the allocation"
        );
        &mut mem[off..off + n]
    }

    fn run(&mut self, stream: StreamId, upto: u64) {
        loop {
            let s = self.streams.get_mut(&stream).expect("fake: unknown stream");
            if s.executed >= upto {
                return;
            }
            let op = s.ops.pop_front().expect("fake: ran past the queue");
            s.executed += 1;
            match op {
                Op::HtoD { dst, src, n } => {
                    // SAFETY: the engine promises the source is readable until the copy runs;
                    // freed fake host memory is kept (poisoned), never unmapped.
                    let data = unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec();
                    self.device_slice(dst, n).copy_from_slice(&data);
                }
                Op::DtoH { dst, src, n } => {
                    let data = self.device_slice(src, n).to_vec();
                    // SAFETY: as above, for the destination.
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, n) };
                }
                Op::Wait { stream: other, pos } => self.run(other, pos),
                Op::Read { addr, n, out } => {
                    *out.lock().unwrap() = self.device_slice(addr, n).to_vec();
                }
                Op::Write { addr, data } => {
                    self.device_slice(addr, data.len()).copy_from_slice(&data);
                }
            }
        }
    }

    fn push(&mut self, stream: StreamId, op: Op) {
        let s = self.streams.get_mut(&stream).expect("fake: unknown stream");
        s.ops.push_back(op);
        s.queued += 1;
    }

    fn handle(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }
}

impl FakeDevice {
    pub fn new() -> Arc<Self> {
        let dev = Self::default();
        {
            let mut st = dev.state.lock().unwrap();
            st.streams.insert(0, FakeStream::default()); // the legacy default stream
            st.next_device = 1 << 32;
        }
        Arc::new(dev)
    }

    /// Device memory filled with `fill`.
    pub fn alloc(&self, n: usize, fill: u8) -> u64 {
        let mut st = self.state.lock().unwrap();
        let addr = st.next_device;
        st.next_device += (n as u64).max(1).next_multiple_of(1 << 20);
        st.device.insert(addr, vec![fill; n.max(1)]);
        addr
    }

    /// The device bytes now, without running anything.
    pub fn peek(&self, addr: u64, n: usize) -> Vec<u8> {
        self.state.lock().unwrap().device_slice(addr, n).to_vec()
    }

    /// A "kernel" on `stream` that snapshots device bytes when it runs.
    pub fn launch_read(&self, stream: StreamId, addr: u64, n: usize) -> Arc<Mutex<Vec<u8>>> {
        let out = Arc::new(Mutex::new(Vec::new()));
        let op = Op::Read {
            addr,
            n,
            out: out.clone(),
        };
        self.state.lock().unwrap().push(stream, op);
        out
    }

    /// A "kernel" on `stream` that writes device bytes when it runs.
    pub fn launch_write(&self, stream: StreamId, addr: u64, data: Vec<u8>) {
        self.state
            .lock()
            .unwrap()
            .push(stream, Op::Write { addr, data });
    }

    /// Runs everything queued on `stream` (and what it waits for).
    pub fn sync_stream(&self, stream: StreamId) {
        let mut st = self.state.lock().unwrap();
        let upto = st.streams[&stream].queued;
        st.run(stream, upto);
    }

    pub fn run_all(&self) {
        let ids: Vec<StreamId> = self.state.lock().unwrap().streams.keys().copied().collect();
        for s in ids {
            self.sync_stream(s);
        }
    }

    pub fn issued(&self) -> Vec<Issued> {
        self.state.lock().unwrap().issued.clone()
    }

    pub fn live_host_allocations(&self) -> usize {
        self.state.lock().unwrap().host.len()
    }

    /// The n-th upload issued from now on fails (n = 0: the next one).
    pub fn fail_upload_after(&self, n: u64) {
        self.state.lock().unwrap().fail_htod_at = Some(n);
    }

    fn check(&self, e: EventId) -> DeviceResult<Option<(StreamId, u64)>> {
        let st = self.state.lock().unwrap();
        match st.events.get(&e) {
            Some(r) => Ok(*r),
            None => Err(DeviceError {
                call: "event",
                code: 400,
                message: format!("fake: unknown event {e}"),
            }),
        }
    }
}

impl CopyDevice for FakeDevice {
    fn priority_range(&self) -> DeviceResult<(i32, i32)> {
        Ok((0, -5))
    }

    fn stream_create(&self, _priority: i32) -> DeviceResult<StreamId> {
        let mut st = self.state.lock().unwrap();
        let h = st.handle();
        st.streams.insert(h, FakeStream::default());
        Ok(h)
    }

    fn stream_destroy(&self, stream: StreamId) {
        let mut st = self.state.lock().unwrap();
        let upto = st.streams[&stream].queued;
        st.run(stream, upto);
        st.streams.remove(&stream);
    }

    fn event_create(&self) -> DeviceResult<EventId> {
        let mut st = self.state.lock().unwrap();
        let h = st.handle();
        st.events.insert(h, None);
        Ok(h)
    }

    fn event_destroy(&self, event: EventId) {
        self.state.lock().unwrap().events.remove(&event);
    }

    fn event_record(&self, event: EventId, stream: StreamId) -> DeviceResult<()> {
        let mut st = self.state.lock().unwrap();
        let pos = st.streams[&stream].queued;
        st.events.insert(event, Some((stream, pos)));
        Ok(())
    }

    fn event_query(&self, event: EventId) -> DeviceResult<bool> {
        Ok(match self.check(event)? {
            None => true,
            Some((s, pos)) => self.state.lock().unwrap().streams[&s].executed >= pos,
        })
    }

    fn event_synchronize(&self, event: EventId) -> DeviceResult<()> {
        if let Some((s, pos)) = self.check(event)? {
            self.state.lock().unwrap().run(s, pos);
        }
        Ok(())
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        if let Some((s, pos)) = self.check(event)? {
            self.state
                .lock()
                .unwrap()
                .push(stream, Op::Wait { stream: s, pos });
        }
        Ok(())
    }

    fn host_alloc(&self, nbytes: usize) -> DeviceResult<*mut u8> {
        let mut buf = vec![0u8; nbytes.max(1)].into_boxed_slice();
        let p = buf.as_mut_ptr();
        self.state.lock().unwrap().host.insert(p as usize, buf);
        Ok(p)
    }

    unsafe fn host_free(&self, ptr: *mut u8) {
        let mut st = self.state.lock().unwrap();
        let mut buf = st
            .host
            .remove(&(ptr as usize))
            .expect("fake: free of unknown pointer");
        buf.fill(POISON);
        st.freed.push(buf);
    }

    fn host_is_pinned(&self, ptr: *const u8) -> bool {
        let p = ptr as usize;
        let st = self.state.lock().unwrap();
        st.host
            .iter()
            .any(|(&base, buf)| p >= base && p < base + buf.len())
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        nbytes: usize,
        stream: StreamId,
    ) -> DeviceResult<()> {
        let mut st = self.state.lock().unwrap();
        if let Some(n) = st.fail_htod_at {
            if n == 0 {
                st.fail_htod_at = None;
                return Err(DeviceError {
                    call: "cuMemcpyHtoDAsync",
                    code: 700,
                    message: "fake: an illegal address".into(),
                });
            }
            st.fail_htod_at = Some(n - 1);
        }
        st.issued.push(Issued {
            stream,
            device: dst,
            nbytes,
        });
        let op = Op::HtoD {
            dst,
            src: src as usize,
            n: nbytes,
        };
        st.push(stream, op);
        Ok(())
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: u64,
        nbytes: usize,
        stream: StreamId,
    ) -> DeviceResult<()> {
        let mut st = self.state.lock().unwrap();
        st.issued.push(Issued {
            stream,
            device: src,
            nbytes,
        });
        let op = Op::DtoH {
            dst: dst as usize,
            src,
            n: nbytes,
        };
        st.push(stream, op);
        Ok(())
    }
}

impl FakeDevice {
    /// 1 when `ptr` is a live host allocation, else 0.
    pub fn live_host_allocations_containing(&self, ptr: *mut u8) -> usize {
        usize::from(
            self.state
                .lock()
                .unwrap()
                .host
                .contains_key(&(ptr as usize)),
        )
    }
}
