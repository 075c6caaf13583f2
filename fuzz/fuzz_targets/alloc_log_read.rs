//! `AllocLog::read` on arbitrary file contents: an error naming the file or a log, never a
//! panic, a hang or an allocation sized by the input. The log reader takes a path (it streams
//! from the file), so each input goes through one scratch file per fuzzing process.
//!
//! CI runs the same property as a proptest: tests/offline/reliability_alloc_log_read.rs.

#![no_main]

use highwater::profile::alloc_log::AllocLog;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("highwater-fuzz-{}.alloc", std::process::id()));
    std::fs::write(&path, data).expect("write the scratch file");
    if let Ok(log) = AllocLog::read(&path) {
        // Every record names a device the log named first.
        assert!(log
            .records
            .iter()
            .all(|record| usize::from(record.device) < log.devices.len()));
    }
});
