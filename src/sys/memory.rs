//! Anonymous memory mappings: storage that never comes from the global allocator (rings,
//! measurement tables), zeroed by the kernel.

#![allow(clippy::disallowed_methods)]

use std::ptr::NonNull;

/// Maps `bytes` zeroed, readable and writable bytes; `None` when the system refuses (or
/// `bytes` is zero).
pub(crate) fn map_zeroed(bytes: usize) -> Option<NonNull<u8>> {
    if bytes == 0 {
        return None;
    }
    // SAFETY: an anonymous private mapping with no address hint has no preconditions; the
    // result is checked against MAP_FAILED before use.
    let pointer = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if pointer == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(pointer.cast())
}

/// Gives back a mapping from [`map_zeroed`]. A failure leaves the mapping in place: harmless.
///
/// # Safety
///
/// `start` and `bytes` are those of one [`map_zeroed`] mapping, and nothing reads or writes it
/// any more.
pub(crate) unsafe fn unmap(start: NonNull<u8>, bytes: usize) {
    // SAFETY: the caller's contract: a whole mapping nobody uses.
    unsafe { libc::munmap(start.as_ptr().cast(), bytes) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_is_zeroed_writable_and_given_back() {
        let bytes = 3 * 4096 + 10;
        let start = map_zeroed(bytes).unwrap();
        // SAFETY: the mapping is `bytes` long, readable and writable, and only used here.
        let memory = unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), bytes) };
        assert!(memory.iter().all(|&byte| byte == 0));
        memory[bytes - 1] = 7;
        // SAFETY: the whole mapping, used no more.
        unsafe { unmap(start, bytes) };
        assert!(map_zeroed(0).is_none());
    }
}
