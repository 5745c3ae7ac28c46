//! Pure-Rust runtime core of PyGPUkit: memory pool, scheduler and dispatch controller.
pub mod dispatch;
pub mod pool;
pub mod scheduler;

pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
