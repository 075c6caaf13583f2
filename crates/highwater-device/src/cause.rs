//! Why a request did not fit in a pool.

use std::fmt;

/// Why a device could not take its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShortfallCause {
    /// Fewer bytes are free than the rounded request.
    Capacity,
    /// Enough bytes are free, but no free block holds the rounded request.
    Fragmentation,
}

impl ShortfallCause {
    /// The cause for a rounded request that did not fit with `free` bytes free.
    pub fn of(rounded: u64, free: u64) -> Self {
        if free >= rounded {
            ShortfallCause::Fragmentation
        } else {
            ShortfallCause::Capacity
        }
    }
}

impl fmt::Display for ShortfallCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShortfallCause::Capacity => "capacity",
            ShortfallCause::Fragmentation => "fragmentation",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cause_is_fragmentation_only_when_free_bytes_cover_the_request() {
        assert_eq!(ShortfallCause::of(512, 512), ShortfallCause::Fragmentation);
        assert_eq!(ShortfallCause::of(512, 511), ShortfallCause::Capacity);
    }
}
