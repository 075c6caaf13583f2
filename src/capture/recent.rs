//! The device blocks this thread allocated last, so that an op hook can find its output's
//! device address among them.
//!
//! A framework's device tensor does not say where its memory is (candle keeps the pointer inside
//! its CUDA backend), but the driver call that allocated it was recorded on this thread, inside
//! the op. Each thread keeps its last few device allocations, numbered; an op notes the number
//! before it runs and afterwards asks for the newest allocation since then of the output's
//! device and size. Thread-local `Cell`s with `const` initialisation and no destructor: the
//! callback that notes an allocation never allocates, locks or registers anything.

// Read by the candle integration only.
#![cfg_attr(not(feature = "candle"), allow(dead_code))]

use std::cell::Cell;

/// Device allocations remembered per thread: an op's output is nearly always its last one.
const REMEMBERED: usize = 8;

/// One device allocation: its number on this thread, device id, key and bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Made {
    number: u64,
    device: u16,
    key: u64,
    bytes: u64,
}

thread_local! {
    /// The last [`REMEMBERED`] allocations, by number modulo their count.
    static RECENT: [Cell<Made>; REMEMBERED] = const {
        [const { Cell::new(Made { number: 0, device: 0, key: 0, bytes: 0 }) }; REMEMBERED]
    };
    /// Device allocations this thread made so far.
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

/// Notes that this thread allocated `bytes` on `device` at `key`.
pub(crate) fn note(device: u16, key: u64, bytes: u64) {
    let Ok(number) = COUNT.try_with(|count| {
        let number = count.get() + 1;
        count.set(number);
        number
    }) else {
        return;
    };
    let _ = RECENT.try_with(|recent| {
        recent[number as usize % REMEMBERED].set(Made {
            number,
            device,
            key,
            bytes,
        });
    });
}

/// Device allocations this thread made so far: what to pass to [`newest_since`] later.
pub(crate) fn count() -> u64 {
    COUNT.try_with(Cell::get).unwrap_or(0)
}

/// The key of the newest allocation of `bytes` on `device` this thread made after the first
/// `since`, if it is still remembered.
pub(crate) fn newest_since(since: u64, device: u16, bytes: u64) -> Option<u64> {
    RECENT
        .try_with(|recent| {
            let mut newest: Option<Made> = None;
            for made in recent.iter().map(Cell::get) {
                let matches = made.number > since && made.device == device && made.bytes == bytes;
                if matches && newest.is_none_or(|n| made.number > n.number) {
                    newest = Some(made);
                }
            }
            newest.map(|made| made.key)
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_match_since_the_mark_wins() {
        let before = count();
        note(3, 0x1000, 64);
        let mark = count();
        note(3, 0x2000, 128);
        note(4, 0x3000, 128);
        note(3, 0x4000, 128);
        note(3, 0x5000, 32);
        assert_eq!(newest_since(mark, 3, 128), Some(0x4000));
        assert_eq!(newest_since(mark, 4, 128), Some(0x3000));
        // Made before the mark: not the op's.
        assert_eq!(newest_since(mark, 3, 64), None);
        assert_eq!(newest_since(before, 3, 64), Some(0x1000));
        assert_eq!(newest_since(mark, 3, 256), None);
    }

    #[test]
    fn only_the_last_few_are_remembered() {
        let mark = count();
        note(1, 0xa, 8);
        for key in 0..REMEMBERED as u64 {
            note(2, key, 16);
        }
        assert_eq!(newest_since(mark, 1, 8), None, "pushed out");
        assert_eq!(newest_since(mark, 2, 16), Some(REMEMBERED as u64 - 1));
    }
}
