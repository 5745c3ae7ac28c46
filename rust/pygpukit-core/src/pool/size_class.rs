//! Block granularity and the mapping from block sizes to free-list classes.

/// Every block starts and ends on this boundary, which also satisfies the
/// widest vector loads the kernels issue.
pub const GRANULE: u64 = 256;

/// Dedicated arenas for oversized requests are rounded to this, so that a
/// slightly larger request later can reuse the same arena.
pub const LARGE_ARENA_ROUND: u64 = 2 << 20;

/// Classes below this many granules are exact sizes; above it each power of
/// two is split into `SUB_CLASSES` classes.
const EXACT_UNITS: u64 = 8;
const SUB_BITS: u32 = 2;
const SUB_CLASSES: usize = 1 << SUB_BITS;

/// Enough classes for any size a u64 can hold.
pub const NUM_CLASSES: usize = EXACT_UNITS as usize + 61 * SUB_CLASSES;

/// Rounds `n` up to a multiple of `to` (a power of two); None on overflow.
pub fn round_up(n: u64, to: u64) -> Option<u64> {
    debug_assert!(to.is_power_of_two());
    n.checked_add(to - 1).map(|v| v & !(to - 1))
}

pub fn round_down(n: u64, to: u64) -> u64 {
    debug_assert!(to.is_power_of_two());
    n & !(to - 1)
}

/// The block size that serves a request. Zero-byte requests still get a
/// granule so that every live allocation has a distinct address.
pub fn block_size(request: u64) -> Option<u64> {
    round_up(request.max(1), GRANULE)
}

/// Class of a block size (a nonzero multiple of GRANULE). Classes are
/// monotone in size, so scanning classes upward visits sizes in order,
/// which is what makes best-fit a short walk.
pub fn class_of(size: u64) -> usize {
    debug_assert!(size >= GRANULE && size.is_multiple_of(GRANULE));
    let units = size / GRANULE;
    if units < EXACT_UNITS {
        return units as usize;
    }
    let log2 = 63 - units.leading_zeros();
    let sub = ((units >> (log2 - SUB_BITS)) as usize) & (SUB_CLASSES - 1);
    EXACT_UNITS as usize + (log2 as usize - 3) * SUB_CLASSES + sub
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotone_and_in_range() {
        let mut prev = 0;
        let mut size = GRANULE;
        while size < (1 << 40) {
            let c = class_of(size);
            assert!(c >= prev, "class of {size} went down");
            assert!(c < NUM_CLASSES);
            prev = c;
            size += GRANULE * (1 + size / (GRANULE * 16));
        }
        assert!(class_of(round_down(u64::MAX, GRANULE)) < NUM_CLASSES);
    }

    #[test]
    fn four_classes_per_power_of_two() {
        let g = GRANULE;
        assert_eq!(class_of(8 * g), 8);
        assert_eq!(class_of(9 * g), 8);
        assert_eq!(class_of(10 * g), 9);
        assert_eq!(class_of(15 * g), 11);
        assert_eq!(class_of(16 * g), 12);
    }

    #[test]
    fn block_sizes() {
        assert_eq!(block_size(0), Some(256));
        assert_eq!(block_size(1), Some(256));
        assert_eq!(block_size(256), Some(256));
        assert_eq!(block_size(257), Some(512));
        assert_eq!(block_size(u64::MAX), None);
    }
}
