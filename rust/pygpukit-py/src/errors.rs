//! Raising the Python-side error classes of pygpukit.errors from Rust.

use pyo3::exceptions::{PyMemoryError, PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Builds an instance of `pygpukit.errors.<name>`; the class is looked up at
/// raise time so that the binding never holds a stale class across reloads.
/// Falls back to `fallback` when pygpukit.errors cannot be imported, so an
/// error is never lost behind an ImportError.
fn project_error(
    py: Python<'_>,
    name: &str,
    msg: String,
    fallback: fn(String) -> PyErr,
    attrs: &[(&str, Bound<'_, PyAny>)],
) -> PyErr {
    let built = py
        .import("pygpukit.errors")
        .and_then(|m| m.getattr(name))
        .and_then(|cls| cls.call1((msg.clone(),)));
    match built {
        Ok(exc) => {
            for (k, v) in attrs {
                // The message already carries the facts; attributes are a convenience.
                let _ = exc.setattr(*k, v);
            }
            PyErr::from_value(exc)
        }
        Err(_) => fallback(msg),
    }
}

pub fn out_of_memory(
    py: Python<'_>,
    msg: String,
    stats: Bound<'_, PyDict>,
    requested: u64,
) -> PyErr {
    let Ok(requested) = requested.into_pyobject(py);
    let attrs = [
        ("stats", stats.into_any()),
        ("requested_bytes", requested.into_any()),
    ];
    project_error(py, "OutOfMemoryError", msg, PyMemoryError::new_err, &attrs)
}

/// `pygpukit.errors.GPUKitValueError`: an argument out of its domain.
pub fn value_error(py: Python<'_>, msg: String) -> PyErr {
    project_error(py, "GPUKitValueError", msg, PyValueError::new_err, &[])
}

/// `pygpukit.errors.GPUKitOverflowError`: an integer past what the argument holds.
pub fn overflow_error(py: Python<'_>, msg: String) -> PyErr {
    project_error(
        py,
        "GPUKitOverflowError",
        msg,
        PyOverflowError::new_err,
        &[],
    )
}

/// `pygpukit.errors.SettingError`: a setting (or a block's choice) it cannot take.
pub fn setting_error(py: Python<'_>, msg: String) -> PyErr {
    project_error(py, "SettingError", msg, PyValueError::new_err, &[])
}
