//! Host/device transfers: a priority queue of copy requests issued chunk by chunk on one
//! upload and one download stream, a pinned staging pool, bulk uploads staged on several
//! threads at once (model loading), and handles that keep their host memory alive until
//! the copy has run. Written against the CopyDevice trait: the binding implements it with
//! the native module's C ABI, the tests with a fake device.

mod bulk;
mod device;
mod engine;
mod queue;
mod staging;

#[cfg(test)]
mod bulk_tests;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

pub use bulk::BulkJob;
pub use device::{CopyDevice, DeviceError, DeviceResult, EventId, StreamId};
pub use engine::{Config, Copy, Direction, Engine, Keep, Stats, Transfer};
pub use queue::Priority;
