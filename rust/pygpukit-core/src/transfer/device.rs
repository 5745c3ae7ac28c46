//! The device primitives the engine is written against. The real implementation is the
//! C ABI table of the native module (pygpukit-py's transfer.rs); tests use a fake device
//! that runs each stream's work lazily, so a staging buffer reused too early or a missing
//! event wait shows up as wrong data.

use std::fmt;

/// A stream handle; 0 is the legacy default stream.
pub type StreamId = u64;
/// An event handle.
pub type EventId = u64;

/// A failed device call: the call, the driver's code and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceError {
    pub call: &'static str,
    pub code: i32,
    pub message: String,
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{} failed with code {}", self.call, self.code)
        } else {
            f.write_str(&self.message)
        }
    }
}

impl std::error::Error for DeviceError {}

pub type DeviceResult<T> = Result<T, DeviceError>;

/// Streams, events, pinned host memory and asynchronous copies of one device.
pub trait CopyDevice: Send + Sync {
    /// (least, greatest) stream priority; greatest is numerically smallest.
    fn priority_range(&self) -> DeviceResult<(i32, i32)>;
    /// A stream that is not implicitly ordered with the legacy default stream.
    fn stream_create(&self, priority: i32) -> DeviceResult<StreamId>;
    fn stream_destroy(&self, stream: StreamId);
    fn event_create(&self) -> DeviceResult<EventId>;
    fn event_destroy(&self, event: EventId);
    fn event_record(&self, event: EventId, stream: StreamId) -> DeviceResult<()>;
    /// True once the work recorded by `event` has finished.
    fn event_query(&self, event: EventId) -> DeviceResult<bool>;
    fn event_synchronize(&self, event: EventId) -> DeviceResult<()>;
    /// Later work on `stream` waits for the work `event` recorded at the time of the call.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> DeviceResult<()>;
    fn host_alloc(&self, nbytes: usize) -> DeviceResult<*mut u8>;
    /// # Safety
    /// `ptr` came from host_alloc and no copy in flight uses it.
    unsafe fn host_free(&self, ptr: *mut u8);
    /// True when `ptr` lies in page-locked memory the device can read by DMA.
    fn host_is_pinned(&self, ptr: *const u8) -> bool;
    /// # Safety
    /// `src` stays readable for `nbytes` until the copy has run on `stream`.
    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        nbytes: usize,
        stream: StreamId,
    ) -> DeviceResult<()>;
    /// # Safety
    /// `dst` stays writable for `nbytes` until the copy has run on `stream`.
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: u64,
        nbytes: usize,
        stream: StreamId,
    ) -> DeviceResult<()>;
}
