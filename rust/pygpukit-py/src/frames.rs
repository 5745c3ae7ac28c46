//! The user's location as recording keeps it, `(code, f_lasti)`, read from native code that
//! an array operator's method called (the native eager hit, eager.rs, and the native lazy
//! record, record.rs): one owner for how that frame is found.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{ffi, intern};

extern "C" {
    // CPython 3.9+ (every version the abi3 floor allows); outside the limited API's
    // declarations, as PyContextVar_Set is for block.rs. A new reference or null.
    fn PyFrame_GetBack(frame: *mut ffi::PyFrameObject) -> *mut ffi::PyFrameObject;
}

/// The user's frame for native code called from Python: with `skip` 1 (called by an
/// operator's Python method) the caller of the current frame, with `skip` 0 (called by a
/// native operator: no frame of its own) the current frame; as `(code, f_lasti)` when
/// ir.source.LIBRARY_FILES (`library`) says its file is the user's, else `user_frame(skip)`'s
/// walk from there (called from native code, user_frame's frame 1 is the current one).
pub(crate) fn user_location<'py>(
    py: Python<'py>,
    library: &Py<PyDict>,
    user_frame: &Py<PyAny>,
    skip: u8,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: PyEval_GetFrame returns a borrowed reference (the Python frame that called
    // this) or null.
    let f = unsafe { ffi::PyEval_GetFrame() };
    let frame = if f.is_null() {
        None
    } else if skip == 0 {
        // SAFETY: a borrowed, live frame object; made a new reference here.
        Some(unsafe { Bound::from_borrowed_ptr(py, f.cast()) })
    } else {
        // SAFETY: f is a live frame; PyFrame_GetBack returns a new reference or null (the
        // outermost frame, no exception set).
        unsafe { Bound::from_owned_ptr_or_opt(py, PyFrame_GetBack(f).cast()) }
    };
    if let Some(frame) = frame {
        // SAFETY: PyFrame_GetCode returns a new reference to the frame's code (never null).
        let code = unsafe {
            Bound::from_owned_ptr(py, ffi::PyFrame_GetCode(frame.as_ptr().cast()).cast())
        };
        let file = code.getattr(intern!(py, "co_filename"))?;
        // SAFETY: a borrowed reference or null (absent, no exception set: the key is a
        // str, whose hash and comparison cannot fail).
        let internal = unsafe { ffi::PyDict_GetItem(library.as_ptr(), file.as_ptr()) };
        if internal == unsafe { ffi::Py_False() } {
            let lasti = frame.getattr(intern!(py, "f_lasti"))?;
            return Ok(PyTuple::new(py, [code, lasti])?.into_any());
        }
    }
    user_frame.bind(py).call1((skip,))
}
