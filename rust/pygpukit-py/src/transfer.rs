//! `pygpukit._rust.TransferEngine`: the transfer engine of pygpukit-core over the native
//! module's copy C ABI (native/src/capi_copy.h), which the CUDA backend registers at import
//! with `register_copy_capi(_native.copy_capi())`. No CUDA header is needed here: the table
//! of function pointers is the whole interface.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex};

use pygpukit_core::transfer::{
    BulkJob, Config, Copy, CopyDevice, DeviceError, DeviceResult, Direction, Engine, EventId, Keep,
    Priority, StreamId, Transfer,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict};

use crate::errors;

const CAPSULE_NAME: &CStr = c"pygpukit._native.copy_capi";
/// PGK_COPY_CAPI_VERSION of the layout below.
const VERSION: u32 = 1;

/// Mirror of PgkCopyApi (native/src/capi_copy.h), field for field.
#[repr(C)]
pub struct CopyApi {
    version: u32,
    size: u32,
    stream_priority_range: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    stream_create: unsafe extern "C" fn(c_int, *mut u64) -> c_int,
    stream_destroy: unsafe extern "C" fn(u64),
    event_create: unsafe extern "C" fn(c_int, *mut u64) -> c_int,
    event_destroy: unsafe extern "C" fn(u64),
    event_record: unsafe extern "C" fn(u64, u64) -> c_int,
    event_query: unsafe extern "C" fn(u64) -> c_int,
    event_synchronize: unsafe extern "C" fn(u64) -> c_int,
    stream_wait_event: unsafe extern "C" fn(u64, u64) -> c_int,
    host_alloc: unsafe extern "C" fn(usize, *mut *mut c_void) -> c_int,
    host_free: unsafe extern "C" fn(*mut c_void),
    host_is_pinned: unsafe extern "C" fn(*const c_void) -> c_int,
    memcpy_htod_async: unsafe extern "C" fn(u64, *const c_void, usize, u64) -> c_int,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, u64, usize, u64) -> c_int,
    last_error: unsafe extern "C" fn(*mut c_char, usize) -> c_int,
}

const NOT_READY: c_int = 600;

/// The registered table; it is static data of the native module, which CPython never
/// unloads.
static API: Mutex<Option<&'static CopyApi>> = Mutex::new(None);

/// The device behind the C ABI table.
pub struct CApiDevice {
    api: &'static CopyApi,
}

impl CApiDevice {
    fn check(&self, call: &'static str, code: c_int) -> DeviceResult<()> {
        if code == 0 {
            return Ok(());
        }
        let mut buf = [0 as c_char; 512];
        // SAFETY: buf holds 512 bytes; last_error NUL-terminates within them.
        let last = unsafe { (self.api.last_error)(buf.as_mut_ptr(), buf.len()) };
        // SAFETY: NUL-terminated above.
        let message = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Err(DeviceError {
            call,
            code: if last != 0 { last } else { code },
            message,
        })
    }
}

impl CopyDevice for CApiDevice {
    fn priority_range(&self) -> DeviceResult<(i32, i32)> {
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: valid out pointers.
        let r = unsafe { (self.api.stream_priority_range)(&mut least, &mut greatest) };
        self.check("cuCtxGetStreamPriorityRange", r)?;
        Ok((least, greatest))
    }

    fn stream_create(&self, priority: i32) -> DeviceResult<StreamId> {
        let mut s = 0u64;
        // SAFETY: valid out pointer.
        let r = unsafe { (self.api.stream_create)(priority, &mut s) };
        self.check("cuStreamCreateWithPriority", r)?;
        Ok(s)
    }

    fn stream_destroy(&self, stream: StreamId) {
        // SAFETY: a stream this device created.
        unsafe { (self.api.stream_destroy)(stream) }
    }

    fn event_create(&self) -> DeviceResult<EventId> {
        let mut e = 0u64;
        // SAFETY: valid out pointer.
        let r = unsafe { (self.api.event_create)(0, &mut e) };
        self.check("cuEventCreate", r)?;
        Ok(e)
    }

    fn event_destroy(&self, event: EventId) {
        // SAFETY: an event this device created.
        unsafe { (self.api.event_destroy)(event) }
    }

    fn event_record(&self, event: EventId, stream: StreamId) -> DeviceResult<()> {
        // SAFETY: handles from this device (stream 0: the legacy default stream).
        self.check("cuEventRecord", unsafe {
            (self.api.event_record)(event, stream)
        })
    }

    fn event_query(&self, event: EventId) -> DeviceResult<bool> {
        // SAFETY: an event this device created.
        let r = unsafe { (self.api.event_query)(event) };
        if r == NOT_READY {
            return Ok(false);
        }
        self.check("cuEventQuery", r)?;
        Ok(true)
    }

    fn event_synchronize(&self, event: EventId) -> DeviceResult<()> {
        // SAFETY: an event this device created.
        self.check("cuEventSynchronize", unsafe {
            (self.api.event_synchronize)(event)
        })
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> DeviceResult<()> {
        // SAFETY: handles from this device.
        self.check("cuStreamWaitEvent", unsafe {
            (self.api.stream_wait_event)(stream, event)
        })
    }

    fn host_alloc(&self, nbytes: usize) -> DeviceResult<*mut u8> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        let r = unsafe { (self.api.host_alloc)(nbytes, &mut p) };
        self.check("cuMemHostAlloc", r)?;
        Ok(p.cast())
    }

    unsafe fn host_free(&self, ptr: *mut u8) {
        (self.api.host_free)(ptr.cast())
    }

    fn host_is_pinned(&self, ptr: *const u8) -> bool {
        // SAFETY: a pointer attribute query reads nothing behind the pointer.
        unsafe { (self.api.host_is_pinned)(ptr.cast()) != 0 }
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        nbytes: usize,
        stream: StreamId,
    ) -> DeviceResult<()> {
        let r = (self.api.memcpy_htod_async)(dst, src.cast(), nbytes, stream);
        self.check("cuMemcpyHtoDAsync", r)
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: u64,
        nbytes: usize,
        stream: StreamId,
    ) -> DeviceResult<()> {
        let r = (self.api.memcpy_dtoh_async)(dst.cast(), src, nbytes, stream);
        self.check("cuMemcpyDtoHAsync", r)
    }
}

/// `pygpukit.errors.CUDAError` carrying the driver's code as `.code`.
fn cuda_error(py: Python<'_>, e: DeviceError) -> PyErr {
    let msg = e.to_string();
    let built = py
        .import("pygpukit.errors")
        .and_then(|m| m.getattr("CUDAError"))
        .and_then(|cls| cls.call1((msg.clone(),)));
    match built {
        Ok(exc) => {
            let _ = exc.setattr("code", e.code);
            let _ = exc.setattr("call", e.call);
            PyErr::from_value(exc)
        }
        Err(_) => PyRuntimeError::new_err(msg),
    }
}

/// Registers the native module's copy C ABI (`_native.copy_capi()`), checking its name,
/// version and size; registering the same table again is a no-op.
#[pyfunction]
pub fn register_copy_capi(capsule: &Bound<'_, PyAny>) -> PyResult<()> {
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("register_copy_capi expects _native.copy_capi()"))?;
    let ptr = capsule.pointer_checked(Some(CAPSULE_NAME))?;
    // SAFETY: the name check says this is a PgkCopyApi, whose first two fields are u32s.
    let api: &'static CopyApi = unsafe { ptr.cast::<CopyApi>().as_ref() };
    if api.version != VERSION || api.size as usize != std::mem::size_of::<CopyApi>() {
        return Err(PyRuntimeError::new_err(format!(
            "the native module's copy C ABI is version {} ({} bytes); this _rust expects \
             version {VERSION} ({} bytes): rebuild both from one checkout",
            api.version,
            api.size,
            std::mem::size_of::<CopyApi>()
        )));
    }
    *API.lock().unwrap_or_else(|e| e.into_inner()) = Some(api);
    Ok(())
}

/// True once register_copy_capi has been called.
#[pyfunction]
pub fn copy_capi_registered() -> bool {
    API.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

fn priority(py: Python<'_>, name: &str) -> PyResult<Priority> {
    Priority::parse(name).ok_or_else(|| {
        errors::value_error(
            py,
            format!("transfer priority must be 'high', 'normal' or 'low', got '{name}'"),
        )
    })
}

/// Host/device copies on their own streams: see pygpukit-core's transfer module.
#[pyclass(frozen, name = "TransferEngine", module = "pygpukit._rust")]
pub struct PyTransferEngine {
    engine: Engine<CApiDevice>,
}

/// A copy in flight; keeps its host object alive until the copy has run.
#[pyclass(frozen, name = "Transfer", module = "pygpukit._rust")]
pub struct PyTransfer {
    inner: Transfer<CApiDevice>,
    #[pyo3(get)]
    nbytes: usize,
}

#[pymethods]
impl PyTransferEngine {
    /// Creates the upload and download streams on the current device (the copy C ABI must
    /// be registered first). chunk_bytes/chunks size the staging pool; copy_threads is the
    /// number of threads for the host memcpy of one staged chunk; bulk_threads,
    /// bulk_piece_bytes and bulk_buffers (per thread) size htod_bulk's staging.
    #[new]
    #[pyo3(signature = (chunk_bytes=None, chunks=None, copy_threads=None, bulk_threads=None,
                        bulk_piece_bytes=None, bulk_buffers=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        chunk_bytes: Option<usize>,
        chunks: Option<usize>,
        copy_threads: Option<usize>,
        bulk_threads: Option<usize>,
        bulk_piece_bytes: Option<usize>,
        bulk_buffers: Option<usize>,
    ) -> PyResult<Self> {
        let api = API
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ok_or_else(|| {
                PyRuntimeError::new_err(
                    "TransferEngine: no copy C ABI registered (call \
                 register_copy_capi(_native.copy_capi()) first)",
                )
            })?;
        let mut config = Config::default();
        if let Some(v) = chunk_bytes {
            if v == 0 {
                return Err(errors::value_error(
                    py,
                    "chunk_bytes must be positive".into(),
                ));
            }
            config.chunk_bytes = v;
        }
        if let Some(v) = chunks {
            config.chunks = v.max(1);
        }
        if let Some(v) = copy_threads {
            config.copy_threads = v.max(1);
        }
        if let Some(v) = bulk_piece_bytes {
            if v == 0 {
                return Err(errors::value_error(
                    py,
                    "bulk_piece_bytes must be positive".into(),
                ));
            }
            config.bulk_piece_bytes = v;
        }
        if let Some(v) = bulk_threads {
            config.bulk_threads = v.max(1);
        }
        if let Some(v) = bulk_buffers {
            config.bulk_buffers = v.max(1);
        }
        let dev = Arc::new(CApiDevice { api });
        let engine = py
            .detach(|| Engine::new(dev, config))
            .map_err(|e| cuda_error(py, e))?;
        Ok(Self { engine })
    }

    /// Copies nbytes from host address `src` to device address `dst`, after the work queued
    /// on `stream` and before the work queued on it later. `keep` (the source's owner) lives
    /// until the copy has run. A pageable source may be reused on return.
    #[pyo3(signature = (dst, src, nbytes, keep, priority="normal", stream=0))]
    #[allow(clippy::too_many_arguments)]
    fn htod(
        &self,
        py: Python<'_>,
        dst: u64,
        src: usize,
        nbytes: usize,
        keep: Py<PyAny>,
        priority: &str,
        stream: u64,
    ) -> PyResult<PyTransfer> {
        let copy = Copy {
            direction: Direction::HostToDevice,
            device: dst,
            host: src,
            nbytes,
            priority: self::priority(py, priority)?,
            after: Some(stream),
            before: Some(stream),
            deferred: false,
        };
        self.submit(py, copy, keep)
    }

    /// Copies nbytes from device address `src` to host address `dst`, after the work
    /// queued on `stream`. Unless `deferred`, a pageable destination holds the data on
    /// return; deferred copies land in an engine buffer and reach `dst` when the transfer
    /// is found done. `keep` (the destination's owner) lives until then.
    #[pyo3(signature = (dst, src, nbytes, keep, priority="normal", stream=0, deferred=false))]
    #[allow(clippy::too_many_arguments)]
    fn dtoh(
        &self,
        py: Python<'_>,
        dst: usize,
        src: u64,
        nbytes: usize,
        keep: Py<PyAny>,
        priority: &str,
        stream: u64,
        deferred: bool,
    ) -> PyResult<PyTransfer> {
        let copy = Copy {
            direction: Direction::DeviceToHost,
            device: src,
            host: dst,
            nbytes,
            priority: self::priority(py, priority)?,
            after: Some(stream),
            before: None,
            deferred,
        };
        self.submit(py, copy, keep)
    }

    /// Uploads every (device address, host address, nbytes) job (model loading), staged
    /// through the engine's bulk buffers on several threads at once, after the work queued
    /// on `stream` and before the work queued on it later. `keep` (the sources' owner)
    /// lives until every DMA has run. `progress(nbytes)`, if given, is called on this
    /// thread as pieces are issued; an exception it raises is raised once the upload has
    /// run. Returns once every piece is issued (pageable sources may then be reused), with
    /// a Transfer done once every DMA has run. The GIL is released meanwhile.
    #[pyo3(signature = (jobs, keep, stream=0, progress=None))]
    fn htod_bulk(
        &self,
        py: Python<'_>,
        jobs: Vec<(u64, usize, usize)>,
        keep: Py<PyAny>,
        stream: u64,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<PyTransfer> {
        let jobs: Vec<BulkJob> = jobs
            .into_iter()
            .map(|(device, host, nbytes)| BulkJob {
                device,
                host,
                nbytes,
            })
            .collect();
        let nbytes = jobs.iter().map(|j| j.nbytes).sum();
        let keep: Keep = Box::new(keep);
        let mut raised: Option<PyErr> = None;
        let mut report = |n: usize| {
            if let (Some(cb), None) = (&progress, &raised) {
                Python::attach(|py| {
                    if let Err(e) = cb.call1(py, (n,)) {
                        raised = Some(e);
                    }
                });
            }
        };
        // SAFETY: the host ranges belong to `keep` (the caller's arrays), which the engine
        // holds until every DMA has run.
        let inner = py
            .detach(|| unsafe {
                self.engine
                    .htod_bulk(&jobs, Some(stream), Some(stream), Some(keep), &mut report)
            })
            .map_err(|e| cuda_error(py, e))?;
        if let Some(e) = raised {
            // The caller may close the sources once this raises.
            py.detach(|| inner.wait()).map_err(|e| cuda_error(py, e))?;
            return Err(e);
        }
        Ok(PyTransfer { inner, nbytes })
    }

    /// The upload stream's handle (an int usable as a stream by _native).
    #[getter]
    fn h2d_stream(&self) -> u64 {
        self.engine.h2d_stream()
    }

    /// The download stream's handle.
    #[getter]
    fn d2h_stream(&self) -> u64 {
        self.engine.d2h_stream()
    }

    /// Counters: copies, bytes, chunks, staged_bytes, direct_bytes, slot_copies, in_flight,
    /// bulk_bytes, pinned_bytes, and the configuration (chunk_bytes, chunks, copy_threads,
    /// bulk_threads, bulk_piece_bytes, bulk_buffers).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.engine.stats();
        let c = self.engine.config();
        let d = PyDict::new(py);
        d.set_item("copies", s.copies)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("chunks", s.chunks)?;
        d.set_item("staged_bytes", s.staged_bytes)?;
        d.set_item("direct_bytes", s.direct_bytes)?;
        d.set_item("slot_copies", s.slot_copies)?;
        d.set_item("in_flight", s.in_flight)?;
        d.set_item("bulk_bytes", s.bulk_bytes)?;
        d.set_item("pinned_bytes", s.pinned_bytes)?;
        d.set_item("chunk_bytes", c.chunk_bytes)?;
        d.set_item("chunks_per_direction", c.chunks)?;
        d.set_item("copy_threads", c.copy_threads)?;
        d.set_item("bulk_threads", c.bulk_threads)?;
        d.set_item("bulk_piece_bytes", c.bulk_piece_bytes)?;
        d.set_item("bulk_buffers", c.bulk_buffers)?;
        Ok(d)
    }
}

/// Copies of at most this many bytes are issued holding the interpreter lock: issuing one
/// costs microseconds (a staging slot, a few driver calls), while letting go of the lock
/// hands it to any busy thread (a server's event loop) and queues for it again, up to the
/// interpreter's switch interval; a serving engine issues several per step.
const HOLD_LOCK_BYTES: usize = 4096;

impl PyTransferEngine {
    fn submit(&self, py: Python<'_>, copy: Copy, keep: Py<PyAny>) -> PyResult<PyTransfer> {
        let nbytes = copy.nbytes;
        let keep: Keep = Box::new(keep);
        // SAFETY: the host range belongs to `keep` (the caller's array), which the engine
        // holds until the copy has run.
        let inner = if nbytes <= HOLD_LOCK_BYTES {
            unsafe { self.engine.submit(copy, Some(keep)) }
        } else {
            py.detach(|| unsafe { self.engine.submit(copy, Some(keep)) })
        }
        .map_err(|e| cuda_error(py, e))?;
        Ok(PyTransfer { inner, nbytes })
    }
}

#[pymethods]
impl PyTransfer {
    /// True once the copy has run (a deferred download has reached its destination).
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        self.inner.done().map_err(|e| cuda_error(py, e))
    }

    /// Waits for this copy alone (the GIL is released meanwhile).
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.wait())
            .map_err(|e| cuda_error(py, e))
    }
}
