//! Pure-Rust runtime core of PyGPUkit: memory pool and scheduler.
pub mod pool;
pub mod scheduler;

pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
