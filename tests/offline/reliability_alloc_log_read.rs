//! Bad input for `AllocLog::read` is an error naming the file, never a panic or a hang: random
//! bytes, truncations, byte flips and splices of a valid log. The same property is fuzzed by
//! `fuzz/fuzz_targets/alloc_log_read.rs` where a nightly toolchain and cargo-fuzz exist.

use std::path::Path;

use highwater::profile::alloc_log::{AllocLog, MAGIC};
use proptest::prelude::*;

/// A valid log: `cpu` and `cuda:0` named, then `records` allocs and frees on both.
fn valid_log(records: u64) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    for (device, name) in ["cpu", "cuda:0"].iter().enumerate() {
        bytes.push(2);
        bytes.extend_from_slice(&(device as u16).to_le_bytes());
        bytes.extend_from_slice(&(name.len() as u16).to_le_bytes());
        bytes.extend_from_slice(name.as_bytes());
    }
    for i in 0..records {
        let (tag, key) = if i % 2 == 0 {
            (0x10 + 0x10 * (i % 5) as u8, i)
        } else {
            (1, i - 1)
        };
        bytes.push(tag);
        bytes.extend_from_slice(&((i % 2) as u16).to_le_bytes());
        bytes.extend_from_slice(&(i * 10).to_le_bytes());
        bytes.extend_from_slice(&key.to_le_bytes());
        bytes.extend_from_slice(&(4096 + i).to_le_bytes());
    }
    bytes
}

/// The property: `read` returns (no panic); an error names the file; a log names every device
/// its records use.
fn reads_or_errs(dir: &Path, bytes: &[u8]) -> Result<AllocLog, String> {
    let path = dir.join("input.alloc");
    std::fs::write(&path, bytes).unwrap();
    match AllocLog::read(&path) {
        Ok(log) => {
            assert!(log
                .records
                .iter()
                .all(|record| usize::from(record.device) < log.devices.len()));
            Ok(log)
        }
        Err(error) => {
            let message = error.to_string();
            assert!(message.contains("input.alloc"), "{message}");
            Err(message)
        }
    }
}

#[test]
fn the_valid_log_reads() {
    let dir = tempfile::tempdir().unwrap();
    let log = reads_or_errs(dir.path(), &valid_log(40)).unwrap();
    assert_eq!(log.devices, ["cpu", "cuda:0"]);
    assert_eq!(log.records.len(), 40);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512), magic in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let mut input = if magic { MAGIC.to_vec() } else { Vec::new() };
        input.extend_from_slice(&bytes);
        let _ = reads_or_errs(dir.path(), &input);
    }

    #[test]
    fn truncated_logs_are_errors_or_shorter_logs(cut in 0.0..1.0f64) {
        let dir = tempfile::tempdir().unwrap();
        let log = valid_log(20);
        let end = (log.len() as f64 * cut) as usize;
        if let Ok(read) = reads_or_errs(dir.path(), &log[..end]) {
            prop_assert!(read.records.len() < 20);
        }
    }

    #[test]
    fn flipped_and_spliced_bytes_never_panic(
        flips in prop::collection::vec((0.0..1.0f64, any::<u8>()), 1..12),
        splice in prop::collection::vec(any::<u8>(), 0..32),
        at in 0.0..1.0f64,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut log = valid_log(20);
        let len = log.len();
        for (at, byte) in flips {
            log[((len as f64 * at) as usize).min(len - 1)] = byte;
        }
        let start = (log.len() as f64 * at) as usize;
        log.splice(start..start, splice);
        let _ = reads_or_errs(dir.path(), &log);
    }
}
