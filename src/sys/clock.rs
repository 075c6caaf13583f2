//! The monotonic clock: a vDSO call, no allocation, no lock, callable from signal handlers.

#![allow(clippy::disallowed_methods)]

/// The monotonic clock, in nanoseconds since an arbitrary start (boot on Linux).
pub(crate) fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; CLOCK_MONOTONIC exists on every system the
    // crate builds for.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clock_never_goes_back() {
        let first = super::monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = super::monotonic_ns();
        assert!(second >= first + 1_000_000, "{first} then {second}");
    }
}
