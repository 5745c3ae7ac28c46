//! Arena sources for the binding: host memory, or a pair of Python callables
//! (the C++ layer's cuMemAlloc/cuMemFree).

use pygpukit_core::pool::{ArenaSource, HostArenaSource};
use pyo3::prelude::*;

pub struct PySource {
    alloc: Py<PyAny>,
    free: Py<PyAny>,
    /// The exception from the last failed alloc callable, re-raised (or
    /// chained) by the binding when the allocation as a whole fails.
    pub alloc_error: Option<PyErr>,
    /// A free callable that raised; reported after the pool call returns.
    pub free_error: Option<PyErr>,
}

impl PySource {
    pub fn new(alloc: Py<PyAny>, free: Py<PyAny>) -> Self {
        Self {
            alloc,
            free,
            alloc_error: None,
            free_error: None,
        }
    }
}

impl ArenaSource for PySource {
    fn alloc_arena(&mut self, bytes: u64) -> Result<u64, String> {
        Python::attach(|py| {
            let got = self
                .alloc
                .call1(py, (bytes,))
                .and_then(|r| r.bind(py).extract::<u64>());
            got.map_err(|e| {
                let msg = format!("alloc_arena({bytes}) raised {e}");
                self.alloc_error = Some(e);
                msg
            })
        })
    }

    fn free_arena(&mut self, base: u64, bytes: u64) {
        // During interpreter shutdown there is no one left to give memory to.
        let res = Python::try_attach(|py| self.free.call1(py, (base, bytes)).map(drop));
        if let Some(Err(e)) = res {
            if self.free_error.is_none() {
                self.free_error = Some(e);
            }
        }
    }
}

impl Drop for PySource {
    fn drop(&mut self) {
        if let Some(e) = self.free_error.take() {
            Python::try_attach(|py| e.write_unraisable(py, None));
        }
    }
}

pub enum Source {
    Host(HostArenaSource),
    Py(PySource),
}

impl Source {
    pub fn take_alloc_error(&mut self) -> Option<PyErr> {
        match self {
            Source::Py(s) => s.alloc_error.take(),
            Source::Host(_) => None,
        }
    }

    pub fn take_free_error(&mut self) -> Option<PyErr> {
        match self {
            Source::Py(s) => s.free_error.take(),
            Source::Host(_) => None,
        }
    }
}

impl ArenaSource for Source {
    fn alloc_arena(&mut self, bytes: u64) -> Result<u64, String> {
        match self {
            Source::Host(s) => s.alloc_arena(bytes),
            Source::Py(s) => s.alloc_arena(bytes),
        }
    }

    fn free_arena(&mut self, base: u64, bytes: u64) {
        match self {
            Source::Host(s) => s.free_arena(base, bytes),
            Source::Py(s) => s.free_arena(base, bytes),
        }
    }
}
