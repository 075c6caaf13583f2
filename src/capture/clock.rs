//! Event timestamps: a cheap counter read on the hot path, converted to nanoseconds by the
//! collector.
//!
//! On x86-64 with an invariant TSC (constant rate, running in every power state) the counter is
//! `rdtsc`, about 20 cycles and no system call; the session calibrates it against [`Instant`].
//! Elsewhere it is `CLOCK_MONOTONIC` in nanoseconds, read through the vDSO.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Whether [`ticks`] reads the TSC; decided once, before any session records.
static USE_TSC: AtomicBool = AtomicBool::new(false);

/// The current counter reading. Never allocates, locks or fails.
#[inline(always)]
pub(crate) fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if USE_TSC.load(Ordering::Relaxed) {
        // SAFETY: `rdtsc` exists on every x86-64 CPU and has no preconditions.
        return unsafe { core::arch::x86_64::_rdtsc() };
    }
    monotonic_ns()
}

/// `CLOCK_MONOTONIC` in nanoseconds.
#[inline]
fn monotonic_ns() -> u64 {
    #[cfg(unix)]
    {
        crate::sys::clock::monotonic_ns()
    }
    #[cfg(not(unix))]
    {
        use std::sync::OnceLock;
        static BASE: OnceLock<Instant> = OnceLock::new();
        BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Whether this CPU has a TSC that ticks at a constant rate in every state.
fn invariant_tsc() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::__cpuid;
        // Leaf 0x8000_0000 reports the highest extended leaf; 0x8000_0007 is read only when it
        // exists. EDX bit 8 of it: invariant TSC.
        if __cpuid(0x8000_0000).eax < 0x8000_0007 {
            return false;
        }
        __cpuid(0x8000_0007).edx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Chooses the counter. Called before recording starts; the choice never changes afterwards
/// while a session runs. `HIGHWATER_CLOCK=monotonic` forces the portable clock.
pub(crate) fn init(force_monotonic: bool) -> &'static str {
    let tsc = !force_monotonic && invariant_tsc();
    USE_TSC.store(tsc, Ordering::Relaxed);
    if tsc {
        "tsc"
    } else {
        "monotonic"
    }
}

/// Converts counter readings to nanoseconds since a session's start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Calibration {
    /// The reading at the session start.
    origin: u64,
    /// Nanoseconds per tick in fixed point, with `fraction_bits` fraction bits: the collector
    /// converts the stamp of every event it applies (the merge orders raw readings), and an
    /// integer multiply is a few instructions where a float round trip is a few dozen.
    ns_per_tick: u64,
    /// As many as leave `ns_per_tick` below 2^63: for a counter of 1 GHz or more, 62, so that
    /// the rounding drifts by well under a nanosecond a day.
    fraction_bits: u32,
}

impl Calibration {
    /// Measures the counter's rate against [`Instant`] over `window`, starting now.
    pub(crate) fn measure(window: Duration) -> Calibration {
        let (ticks_0, instant_0) = (ticks(), Instant::now());
        if !USE_TSC.load(Ordering::Relaxed) {
            return Calibration {
                origin: ticks_0,
                ns_per_tick: 1,
                fraction_bits: 0,
            };
        }
        std::thread::sleep(window);
        let (ticks_1, elapsed) = (ticks(), instant_0.elapsed());
        let ticks = ticks_1.saturating_sub(ticks_0).max(1);
        Calibration::with_rate(ticks_0, elapsed.as_nanos() as f64 / ticks as f64)
    }

    /// Converts readings from `origin` on at `ns_per_tick` (positive, finite).
    pub(crate) fn with_rate(origin: u64, ns_per_tick: f64) -> Calibration {
        // The most fraction bits that keep the scaled rate below 2^63.
        let whole_bits = ns_per_tick.max(1.0).log2().ceil() as u32;
        let fraction_bits = 62u32.saturating_sub(whole_bits);
        let scaled = (ns_per_tick * 2f64.powi(fraction_bits as i32)).round();
        Calibration {
            origin,
            ns_per_tick: (scaled as u64).max(1),
            fraction_bits,
        }
    }

    /// The reading taken at the session start.
    #[cfg(test)]
    pub(crate) fn origin(self) -> u64 {
        self.origin
    }

    /// Nanoseconds since the session start, or `None` for a reading from before it.
    pub(crate) fn to_ns(self, ticks: u64) -> Option<u64> {
        let since = ticks.checked_sub(self.origin)?;
        let ns = (u128::from(since) * u128::from(self.ns_per_tick)) >> self.fraction_bits;
        Some(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// The latest reading that converts to at most `ns`: as the conversion never decreases,
    /// readings up to it are at or before `ns` and later ones after it, so readings can be
    /// compared with a time in nanoseconds without converting each one.
    pub(crate) fn latest_ticks_within(self, ns: u64) -> u64 {
        // The most ticks `d` past the origin with `(d * ns_per_tick) >> fraction_bits <= ns`,
        // that is `d * ns_per_tick < (ns + 1) << fraction_bits` (at most 2^126: no overflow).
        if ns == u64::MAX {
            // Conversions saturate there: every reading is within.
            return u64::MAX;
        }
        let limit = (u128::from(ns) + 1) << self.fraction_bits;
        let since = limit.div_ceil(u128::from(self.ns_per_tick)) - 1;
        u64::try_from(since)
            .ok()
            .and_then(|since| self.origin.checked_add(since))
            .unwrap_or(u64::MAX)
    }

    /// Nanoseconds since the session start, now.
    pub(crate) fn now_ns(self) -> u64 {
        self.to_ns(ticks()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_reading_within_a_time_is_the_last_that_converts_to_it() {
        for calibration in [
            Calibration::with_rate(1_000, 0.37),
            Calibration::with_rate(5, 1.0),
            Calibration::with_rate(u64::MAX / 2, 3.3),
            Calibration::with_rate(0, 1e-3),
            // Near the counter's end: the latest reading saturates.
            Calibration::with_rate(u64::MAX - 10, 0.5),
            Calibration {
                origin: 7,
                ns_per_tick: 1,
                fraction_bits: 0,
            },
        ] {
            for ns in [0, 1, 2, 999, 1_000_000_007, u64::MAX / 3] {
                let latest = calibration.latest_ticks_within(ns);
                assert!(
                    calibration.to_ns(latest).unwrap_or(0) <= ns,
                    "{calibration:?} {ns}"
                );
                if let Some(next) = latest.checked_add(1) {
                    assert!(
                        calibration.to_ns(next).unwrap_or(0) > ns,
                        "{calibration:?} {ns}"
                    );
                }
                // Every reading before the origin is at the start, within any time.
                assert!(latest >= calibration.origin);
            }
            assert_eq!(calibration.latest_ticks_within(u64::MAX), u64::MAX);
        }
    }

    #[test]
    fn calibrated_clock_tracks_instant() {
        init(false);
        let calibration = Calibration::measure(Duration::from_millis(5));
        let start = Instant::now();
        let before = calibration.now_ns();
        std::thread::sleep(Duration::from_millis(20));
        let measured = calibration.now_ns() - before;
        let actual = start.elapsed().as_nanos() as u64;
        // Generous bounds: this checks the conversion, not the machine's timing.
        assert!(
            measured > actual / 2 && measured < actual * 2,
            "{measured} vs {actual}"
        );
        if let Some(before_start) = calibration.origin().checked_sub(1) {
            assert_eq!(calibration.to_ns(before_start), None);
        }
    }

    #[test]
    fn the_fixed_point_conversion_matches_exact_arithmetic() {
        // The monotonic clock counts nanoseconds: converted exactly.
        let monotonic = Calibration {
            origin: 1_000,
            ns_per_tick: 1,
            fraction_bits: 0,
        };
        assert_eq!(monotonic.to_ns(1_000), Some(0));
        assert_eq!(
            monotonic.to_ns(1_000 + 123_456_789_012),
            Some(123_456_789_012)
        );
        assert_eq!(monotonic.to_ns(999), None);
        // A 3 GHz counter, a day of ticks: within a nanosecond of the exact quotient.
        let tsc = Calibration::with_rate(0, 1.0 / 3.0);
        let day_ticks: u64 = 3 * 86_400 * 1_000_000_000;
        let exact = day_ticks / 3;
        let converted = tsc.to_ns(day_ticks).unwrap();
        assert!(converted.abs_diff(exact) <= 1, "{converted} vs {exact}");
        // Monotonic in the reading, and never wrapping for the largest one.
        assert!(tsc.to_ns(day_ticks + 3).unwrap() > converted);
        assert_eq!(
            Calibration::with_rate(0, 1.0).to_ns(1 << 40),
            Some(1 << 40),
            "a rate of one is exact"
        );
        let slow = Calibration::with_rate(0, 1e6);
        assert_eq!(slow.to_ns(7), Some(7_000_000));
        assert_eq!(slow.to_ns(u64::MAX), Some(u64::MAX));
    }
}
