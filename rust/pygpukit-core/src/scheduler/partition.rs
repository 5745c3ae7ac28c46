//! Partitions: named slices of the node with their own memory quota,
//! bandwidth share and stream priority.

#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    pub name: String,
    pub memory_quota_bytes: u64,
    /// Fraction of the GPU's time this partition's tenants share, in [0, 1].
    pub bandwidth_share: f64,
    /// CUDA stream priority for its launches (lower is more urgent, as in CUDA).
    pub stream_priority: i32,
}
