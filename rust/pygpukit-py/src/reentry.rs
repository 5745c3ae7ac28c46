//! Detects a thread re-entering an object whose lock it already holds (a
//! Python callback calling back into the pool), which would otherwise
//! deadlock on the std Mutex.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_TOKEN: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

fn me() -> u64 {
    THREAD_TOKEN.with(|t| *t)
}

#[derive(Default)]
pub struct Owner(AtomicU64);

pub struct OwnerGuard<'a>(&'a Owner);

impl Owner {
    pub fn is_mine(&self) -> bool {
        self.0.load(Ordering::Acquire) == me()
    }

    /// Call before locking: fails if this thread already holds the lock.
    pub fn check(&self, what: &str) -> PyResult<()> {
        if self.is_mine() {
            return Err(PyRuntimeError::new_err(format!(
                "{what} was called re-entrantly from inside one of its own callbacks"
            )));
        }
        Ok(())
    }

    /// Call once the lock is held; clears ownership when dropped.
    pub fn claim(&self) -> OwnerGuard<'_> {
        self.0.store(me(), Ordering::Release);
        OwnerGuard(self)
    }
}

impl Drop for OwnerGuard<'_> {
    fn drop(&mut self) {
        self.0 .0.store(0, Ordering::Release);
    }
}
