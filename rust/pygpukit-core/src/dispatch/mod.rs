//! Dispatch controller: cached launch plans replayed with one call from Python.
//!
//! A plan is what one run of a schedule (an eager op, or a lazy realize of a
//! cached schedule) launched, with every pointer parameter rewritten as "input
//! i + offset", "output buffer j + offset" or "temporary k + offset" and every
//! other parameter kept as constant bytes. The controller owns the plans (an
//! LRU keyed by a u64 structure key), allocates and frees the temporaries,
//! packs the parameters, launches through a `Launcher` (the C ABI table of the
//! native module in production, a fake in tests), and bounds the work queued
//! on each stream with completion markers (`InFlight`).

mod cache;
mod controller;
mod error;
mod fake;
mod inflight;
mod plan;

pub use cache::LruCache;
pub use controller::{Controller, ControllerStats, Launcher, TempAlloc};
pub use error::DispatchError;
pub use fake::{FakeAlloc, FakeLaunch, FakeLauncher};
pub use inflight::{InFlight, InFlightStats};
pub use plan::{KernelLaunch, LaunchPlan, Param, TempLife};
