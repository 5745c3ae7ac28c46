//! Pure-Rust runtime core of PyGPUkit: memory pool, scheduler, dispatch controller and
//! transfer engine.
pub mod dispatch;
pub mod pool;
pub mod scheduler;
pub mod transfer;

pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
