//! Pool errors. Every misuse is reported; none is undefined behaviour.

use std::fmt;

use super::arena::BadFree;
use super::stats::PoolStats;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    pub requested_bytes: u64,
    /// The request rounded to the block granularity (None if it overflowed).
    pub block_bytes: Option<u64>,
    pub stats: PoolStats,
    /// Why no arena could be added: the quota, or the source's own message.
    pub cause: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolError {
    OutOfMemory(Box<OutOfMemory>),
    /// free() or size_of() of an address that is not a live allocation.
    InvalidAddress {
        addr: u64,
        reason: &'static str,
    },
    /// The arena source returned an unusable range; it has been given back.
    BadArena {
        base: u64,
        bytes: u64,
        reason: &'static str,
    },
}

impl PoolError {
    pub(crate) fn invalid(addr: u64, why: BadFree) -> Self {
        let reason = match why {
            BadFree::AlreadyFree => "already freed (double free)",
            BadFree::NotABlockStart => "not the start of an allocated block",
        };
        PoolError::InvalidAddress { addr, reason }
    }
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::OutOfMemory(o) => write!(
                f,
                "out of memory: requested {} bytes; {}; {}",
                o.requested_bytes, o.stats, o.cause
            ),
            PoolError::InvalidAddress { addr, reason } => {
                write!(
                    f,
                    "address {addr:#x} is not a live pool allocation: {reason}"
                )
            }
            PoolError::BadArena {
                base,
                bytes,
                reason,
            } => write!(
                f,
                "arena source returned {base:#x} for {bytes} bytes: {reason}"
            ),
        }
    }
}

impl std::error::Error for PoolError {}
