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

/// The operator's caller as `(code, f_lasti)` when ir.source.LIBRARY_FILES (`library`)
/// says its file is the user's, else `user_frame(1)`'s walk from there (frame 1 of
/// user_frame, called from native code, is the operator's).
pub(crate) fn user_location<'py>(
    py: Python<'py>,
    library: &Py<PyDict>,
    user_frame: &Py<PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: PyEval_GetFrame returns a borrowed reference (the operator's frame, the
    // Python frame that called this) or null.
    let f = unsafe { ffi::PyEval_GetFrame() };
    if !f.is_null() {
        // SAFETY: f is a live frame; PyFrame_GetBack returns a new reference or null (the
        // outermost frame, no exception set).
        let back = unsafe { PyFrame_GetBack(f) };
        if !back.is_null() {
            // SAFETY: back is a new reference to a frame object; PyFrame_GetCode returns a
            // new reference to its code object (never null).
            let back = unsafe { Bound::from_owned_ptr(py, back.cast()) };
            let code = unsafe {
                Bound::from_owned_ptr(py, ffi::PyFrame_GetCode(back.as_ptr().cast()).cast())
            };
            let file = code.getattr(intern!(py, "co_filename"))?;
            // SAFETY: a borrowed reference or null (absent, no exception set: the key is a
            // str, whose hash and comparison cannot fail).
            let internal = unsafe { ffi::PyDict_GetItem(library.as_ptr(), file.as_ptr()) };
            if internal == unsafe { ffi::Py_False() } {
                let lasti = back.getattr(intern!(py, "f_lasti"))?;
                return Ok(PyTuple::new(py, [code, lasti])?.into_any());
            }
        }
    }
    user_frame.bind(py).call1((1,))
}
