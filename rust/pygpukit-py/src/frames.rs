//! The user's location as recording keeps it, `(code, f_lasti)`, read from native code that
//! an array operator's method called (the native eager hit, eager.rs, and the native lazy
//! record, record.rs): one owner for how that frame is found.
//!
//! `Sites` keeps, per call site (code object and instruction offset) found to be the user's,
//! the location made there once: every record at that site shares one `where` tuple and
//! one `(where,)` trail of a node without inputs (pending.py's summary). Both are immutable
//! tuples nothing changes in place (`Node.loc` replaces a node's `where`, never edits it),
//! so sharing them is sharing a value. A site's entry holds its code object, so that
//! code's address stays its own while it is a key.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::{ffi, intern};
use pyo3::{PyTraverseError, PyVisit};

use crate::fx::FxBuild;

extern "C" {
    // CPython 3.9+ (every version the abi3 floor allows); outside the limited API's
    // declarations, as PyContextVar_Set is for block.rs. A new reference or null.
    fn PyFrame_GetBack(frame: *mut ffi::PyFrameObject) -> *mut ffi::PyFrameObject;
}

/// PyFrame_GetLasti: the frame's f_lasti without the attribute lookup and the int object.
type GetLasti = unsafe extern "C" fn(*mut ffi::PyFrameObject) -> c_int;

/// PyFrame_GetLasti where the running CPython has it (3.11+), found at run time: the abi3
/// floor (3.10) lacks it, and a link-time reference would stop the module loading there.
fn get_lasti() -> Option<GetLasti> {
    static FOUND: OnceLock<usize> = OnceLock::new();
    let f = *FOUND.get_or_init(|| symbol(c"PyFrame_GetLasti"));
    // SAFETY: a non-null address of PyFrame_GetLasti, whose C signature GetLasti is.
    (f != 0).then(|| unsafe { std::mem::transmute::<usize, GetLasti>(f) })
}

/// The address of a symbol the process has loaded (the interpreter's), or 0.
#[cfg(unix)]
fn symbol(name: &CStr) -> usize {
    extern "C" {
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }
    // RTLD_DEFAULT: every object loaded globally (the interpreter and libpython).
    #[cfg(target_vendor = "apple")]
    let default = -2isize as *mut c_void;
    #[cfg(not(target_vendor = "apple"))]
    let default = std::ptr::null_mut();
    // SAFETY: dlsym with a valid handle and a NUL-terminated name; null when absent.
    unsafe { dlsym(default, name.as_ptr()) as usize }
}

#[cfg(not(unix))]
fn symbol(_name: &CStr) -> usize {
    0
}

/// The frame native code looks at first for the user's location: with `skip` 1 (called by
/// an operator's Python method) the caller of the current frame, with `skip` 0 (called by a
/// native operator: no frame of its own) the current frame; its code and f_lasti.
pub(crate) struct Here<'py> {
    code: Bound<'py, PyAny>,
    lasti: c_int,
}

impl<'py> Here<'py> {
    /// The frame `skip` frames out, or None (no Python frame there).
    pub(crate) fn of(py: Python<'py>, skip: u8) -> PyResult<Option<Self>> {
        // SAFETY: PyEval_GetFrame returns a borrowed reference (the Python frame that
        // called this) or null.
        let f = unsafe { ffi::PyEval_GetFrame() };
        let frame = if f.is_null() {
            None
        } else if skip == 0 {
            // SAFETY: a borrowed, live frame object; made a new reference here.
            Some(unsafe { Bound::from_borrowed_ptr(py, f.cast()) })
        } else {
            // SAFETY: f is a live frame; PyFrame_GetBack returns a new reference or null
            // (the outermost frame, no exception set).
            unsafe { Bound::from_owned_ptr_or_opt(py, PyFrame_GetBack(f).cast()) }
        };
        let Some(frame) = frame else {
            return Ok(None);
        };
        // SAFETY: PyFrame_GetCode returns a new reference to the frame's code (never null).
        let code = unsafe {
            Bound::from_owned_ptr(py, ffi::PyFrame_GetCode(frame.as_ptr().cast()).cast())
        };
        let lasti = match get_lasti() {
            // SAFETY: a live frame object.
            Some(get) => unsafe { get(frame.as_ptr().cast()) },
            None => frame.getattr(intern!(py, "f_lasti"))?.extract()?,
        };
        Ok(Some(Self { code, lasti }))
    }

    /// Whether ir.source.LIBRARY_FILES (`library`) says `file` is the user's (False there;
    /// absent means not classified yet: user_frame's walk decides and fills it).
    fn users(library: &Py<PyDict>, file: &Bound<'_, PyAny>) -> bool {
        // SAFETY: a borrowed reference or null (absent, no exception set: the key is a
        // str, whose hash and comparison cannot fail; WithError skips saving and restoring
        // the exception state that PyDict_GetItem does).
        let internal = unsafe { ffi::PyDict_GetItemWithError(library.as_ptr(), file.as_ptr()) };
        // SAFETY: Py_False is the interpreter's False, never null.
        internal == unsafe { ffi::Py_False() }
    }
}

/// The user's location for the frame `here` (Here::of(py, skip)): `(code, f_lasti)` of
/// that frame when ir.source.LIBRARY_FILES (`library`) says its file is the user's (true
/// then: the site may be cached); else `user_frame(skip)`'s walk from there (called from
/// native code, user_frame's frame 1 is the current one).
pub(crate) fn locate<'py>(
    py: Python<'py>,
    library: &Py<PyDict>,
    user_frame: &Py<PyAny>,
    here: Option<&Here<'py>>,
    skip: u8,
) -> PyResult<(Bound<'py, PyAny>, bool)> {
    if let Some(h) = here {
        let file = h.code.getattr(intern!(py, "co_filename"))?;
        if Here::users(library, &file) {
            let lasti = h.lasti.into_pyobject(py)?;
            // SAFETY: PyTuple_Pack takes borrowed references (it increfs them) and returns
            // a new reference or null with an exception set.
            let where_ = unsafe {
                Bound::from_owned_ptr_or_err(
                    py,
                    ffi::PyTuple_Pack(2, h.code.as_ptr(), lasti.as_ptr()),
                )?
            };
            return Ok((where_, true));
        }
    }
    Ok((user_frame.bind(py).call1((skip,))?, false))
}

/// The user's location as `locate` finds it for the frame `skip` frames out.
pub(crate) fn user_location<'py>(
    py: Python<'py>,
    library: &Py<PyDict>,
    user_frame: &Py<PyAny>,
    skip: u8,
) -> PyResult<Bound<'py, PyAny>> {
    let here = Here::of(py, skip)?;
    Ok(locate(py, library, user_frame, here.as_ref(), skip)?.0)
}

/// A user's call site as recording keeps it: `where` and `(where,)`.
struct Site {
    where_: Py<PyAny>,
    own: Py<PyAny>,
}

/// The call sites found to be the user's (a record's lock guards them), at most
/// `MAX_SITES`, all made at one ir.source.LIBRARY_GENERATION: a site is the user's until
/// a library is registered, which bumps it (and clears LIBRARY_FILES).
#[derive(Default)]
pub(crate) struct Sites {
    map: HashMap<(usize, c_int), Site, FxBuild>,
    generation: Option<Py<PyAny>>,
}

/// Sites kept before the cache starts over (code made at run time, many call sites).
const MAX_SITES: usize = 4096;

impl Sites {
    /// `where` and `(where,)` of the site `here` if cached at generation `now`.
    pub(crate) fn get<'py>(
        &self,
        py: Python<'py>,
        here: &Here<'py>,
        now: Borrowed<'_, 'py, PyAny>,
    ) -> Option<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        if !self.generation.as_ref()?.is(&*now) {
            return None;
        }
        let site = self.map.get(&(here.code.as_ptr() as usize, here.lasti))?;
        Some((site.where_.bind(py).clone(), site.own.bind(py).clone()))
    }

    /// Keep the site `here`, found the user's at generation `now`: `where` and `(where,)`
    /// made there. What an outdated or full cache held comes back, to be dropped outside
    /// the lock.
    pub(crate) fn put<'py>(
        &mut self,
        here: &Here<'py>,
        now: Borrowed<'_, 'py, PyAny>,
        where_: &Bound<'py, PyAny>,
        own: &Bound<'py, PyAny>,
    ) -> Option<Sites> {
        let current = self.generation.as_ref().is_some_and(|g| g.is(&*now));
        let old = (!current || self.map.len() >= MAX_SITES).then(|| std::mem::take(self));
        self.generation = Some(now.to_owned().unbind());
        let site = Site {
            where_: where_.clone().unbind(),
            own: own.clone().unbind(),
        };
        self.map
            .insert((here.code.as_ptr() as usize, here.lasti), site);
        old
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for s in self.map.values() {
            visit.call(&s.where_)?;
            visit.call(&s.own)?;
        }
        if let Some(g) = &self.generation {
            visit.call(g)?;
        }
        Ok(())
    }
}
