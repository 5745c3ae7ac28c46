//! Pure-Rust runtime core of PyGPUkit: memory pool, scheduler and transfer engine.
pub mod pool;
pub mod scheduler;
pub mod transfer;

pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
