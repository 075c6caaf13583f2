//! The allocation log: an opt-in record of every allocation and free, on every device, in the
//! merged order the analysis saw them — so a run can be replayed through a device pool
//! (`highwater simulate`) without re-running it.
//!
//! A profile is bounded (its curve is downsampled); the log is not: 27 bytes per event. Turn
//! it on with `highwater::SessionBuilder::alloc_log` or
//! `HIGHWATER_ALLOC_LOG=path`.
//!
//! # Format
//!
//! The 8-byte magic `HWALLOC1`, then records, little-endian:
//!
//! | tag | then |
//! |---|---|
//! | `0` alloc (`0x10 + 0x10 × category index` when the category is known) | device `u16`, timestamp ns `u64`, key (address or tensor id) `u64`, bytes `u64` |
//! | `1` free | device `u16`, timestamp ns `u64`, key `u64`, bytes `u64` |
//! | `2` device name | device `u16`, length `u16`, UTF-8 name; before the device's first use |
//! | `3 + 0x10 × (category index + 1)` category | device `u16`, timestamp ns `u64`, key `u64`, `0` `u64`: a live block was given this category (`mark_parameters` and the like) |
//!
//! A reader applies a category record to the block it names: [`AllocRecord::category`] is the
//! block's category as last set while it was live.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::model::Category;

/// The first eight bytes of a log.
pub const MAGIC: &[u8; 8] = b"HWALLOC1";

const ALLOC: u8 = 0;
const FREE: u8 = 1;
const DEVICE: u8 = 2;
const CATEGORY: u8 = 3;

/// Largest log [`AllocLog::read`] accepts (about 160 M records).
pub const MAX_LOG_BYTES: u64 = 4 << 30;

/// How far a record's timestamp may fall behind the newest one before it: the collector applies
/// a straggling event (a thread that read its clock but published late) after newer ones, by
/// microseconds in practice. A record a whole second older than one before it is not from a
/// session.
pub const MAX_TIMESTAMP_STEP_BACK_NS: u64 = 1_000_000_000;

/// Largest block a record may name: sizes stay representable as `i64`, as the exports need.
pub const MAX_RECORD_BYTES: u64 = i64::MAX as u64;

/// One entry of a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AllocRecord {
    /// Index into [`AllocLog::devices`].
    pub device: u16,
    /// ns since the session started.
    pub ts_ns: u64,
    /// Address (heap) or tensor id (device tensors).
    pub key: u64,
    /// Bytes.
    pub bytes: u64,
    /// Whether the block became live (else it died).
    pub alloc: bool,
    /// The block's category, when known: the one it became live with, or the last one a
    /// category record gave it while it was live.
    pub category: Option<Category>,
}

impl AllocRecord {
    /// A record of `bytes` at `key` on device `device` (an index into [`AllocLog::devices`]),
    /// `ts_ns` into the session: became live when `alloc`, else died.
    pub fn new(
        device: u16,
        ts_ns: u64,
        key: u64,
        bytes: u64,
        alloc: bool,
        category: Option<Category>,
    ) -> AllocRecord {
        AllocRecord {
            device,
            ts_ns,
            key,
            bytes,
            alloc,
            category,
        }
    }
}

/// A log read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocLog {
    /// Device names, by the index records use.
    pub devices: Vec<String>,
    /// Records in the order they were applied.
    pub records: Vec<AllocRecord>,
}

/// Why a log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AllocLogError {
    /// The file could not be read.
    #[error("cannot read allocation log {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The file is not an allocation log, or is cut short or corrupt.
    #[error("{path} is not a valid highwater allocation log: {detail}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was wrong, with the byte offset.
        detail: String,
    },
}

impl AllocLog {
    /// Reads a log written by a session.
    ///
    /// # Errors
    ///
    /// [`AllocLogError`] naming the file when it cannot be read, lacks the magic, is larger
    /// than [`MAX_LOG_BYTES`], is cut in the middle of a record, uses a device before naming
    /// it, names a device twice, with an empty name or with control characters, has a record
    /// more than [`MAX_TIMESTAMP_STEP_BACK_NS`] older than one before it, or a size above
    /// [`MAX_RECORD_BYTES`].
    pub fn read(path: impl AsRef<Path>) -> Result<AllocLog, AllocLogError> {
        let path = path.as_ref();
        let read_error = |source| AllocLogError::Read {
            path: path.to_path_buf(),
            source,
        };
        let invalid = |offset: u64, detail: &str| AllocLogError::Invalid {
            path: path.to_path_buf(),
            detail: format!("{detail} at byte {offset}"),
        };
        // Bounded by the bytes read, not by `metadata` (a FIFO or `/dev/zero` has no length);
        // opening a FIFO with no writer does not wait.
        let file = crate::fileio::open_for_reading(path).map_err(read_error)?;
        let size = file.metadata().map_err(read_error)?.len();
        if size > MAX_LOG_BYTES {
            return Err(invalid(0, "file larger than the 4 GiB limit"));
        }
        let mut input = BufReader::new(file.take(MAX_LOG_BYTES + 1));
        let mut magic = [0u8; 8];
        if input.read_exact(&mut magic).is_err() || &magic != MAGIC {
            return Err(invalid(0, "missing the HWALLOC1 magic"));
        }
        let mut log = AllocLog::default();
        // (device, key) of each live block → the index of its alloc record, for category records.
        let mut live: std::collections::HashMap<(u16, u64), usize> = Default::default();
        let mut offset = 8u64;
        let mut newest_ts = 0u64;
        let mut tag = [0u8; 1];
        loop {
            if input.read(&mut tag).map_err(read_error)? == 0 {
                return Ok(log);
            }
            if offset >= MAX_LOG_BYTES {
                return Err(invalid(offset, "file larger than the 4 GiB limit"));
            }
            let (kind, category) = (tag[0] & 0x0F, tag[0] >> 4);
            match (kind, category) {
                (ALLOC, 0..=5) | (FREE, 0) | (CATEGORY, 1..=5) => {
                    let mut body = [0u8; 26];
                    input
                        .read_exact(&mut body)
                        .map_err(|_| invalid(offset, "record cut short"))?;
                    let device = u16::from_le_bytes([body[0], body[1]]);
                    if usize::from(device) >= log.devices.len() {
                        return Err(invalid(offset, "device used before it was named"));
                    }
                    let word = |at: usize| {
                        let mut bytes = [0u8; 8];
                        bytes.copy_from_slice(&body[at..at + 8]);
                        u64::from_le_bytes(bytes)
                    };
                    let (ts_ns, bytes, key) = (word(2), word(18), word(10));
                    if ts_ns.saturating_add(MAX_TIMESTAMP_STEP_BACK_NS) < newest_ts {
                        let detail = format!(
                            "record stamped {ts_ns} ns, {} ns before an earlier record: the log \
                             is not in time order",
                            newest_ts - ts_ns
                        );
                        return Err(invalid(offset, &detail));
                    }
                    newest_ts = newest_ts.max(ts_ns);
                    if bytes > MAX_RECORD_BYTES {
                        let detail = format!("record of {bytes} bytes, above i64::MAX");
                        return Err(invalid(offset, &detail));
                    }
                    let category = category.checked_sub(1).map(Category::from_index);
                    offset += 27;
                    if kind == CATEGORY {
                        if let Some(&index) = live.get(&(device, key)) {
                            log.records[index].category = category;
                        }
                        continue;
                    }
                    if kind == ALLOC {
                        live.insert((device, key), log.records.len());
                    } else {
                        live.remove(&(device, key));
                    }
                    log.records.push(AllocRecord {
                        device,
                        ts_ns,
                        key,
                        bytes,
                        alloc: kind == ALLOC,
                        category,
                    });
                }
                (DEVICE, 0) => {
                    let mut head = [0u8; 4];
                    input
                        .read_exact(&mut head)
                        .map_err(|_| invalid(offset, "device record cut short"))?;
                    let device = u16::from_le_bytes([head[0], head[1]]);
                    let len = usize::from(u16::from_le_bytes([head[2], head[3]]));
                    if usize::from(device) != log.devices.len() {
                        return Err(invalid(offset, "devices named out of order"));
                    }
                    let mut name = vec![0u8; len];
                    input
                        .read_exact(&mut name)
                        .map_err(|_| invalid(offset, "device name cut short"))?;
                    let name = String::from_utf8(name)
                        .map_err(|_| invalid(offset, "device name is not UTF-8"))?;
                    if name.is_empty() || name.chars().any(char::is_control) {
                        return Err(invalid(
                            offset,
                            "device name empty or with control characters",
                        ));
                    }
                    if log.devices.contains(&name) {
                        let detail = format!("device {name:?} named twice");
                        return Err(invalid(offset, &detail));
                    }
                    log.devices.push(name);
                    offset += 5 + len as u64;
                }
                _ => {
                    let detail = format!("unknown record tag {}", tag[0]);
                    return Err(invalid(offset, &detail));
                }
            }
        }
    }

    /// Whether the file at `path` starts with [`MAGIC`]: an allocation log rather than a
    /// profile. Does not block on a FIFO that has no writer (it is not a log).
    pub fn is_log(path: impl AsRef<Path>) -> bool {
        let mut head = [0u8; 8];
        crate::fileio::open_for_reading(path.as_ref())
            .and_then(|mut file| file.read_exact(&mut head))
            .is_ok()
            && &head == MAGIC
    }

    /// The index of device `name`, if the log has it.
    pub fn device(&self, name: &str) -> Option<u16> {
        self.devices
            .iter()
            .position(|d| d == name)
            .and_then(|i| u16::try_from(i).ok())
    }
}

/// Writes a log as a recorder applies events. I/O errors are kept and reported at the end,
/// so recording never stops because the log could not be written.
#[derive(Debug)]
pub struct AllocLogWriter {
    path: PathBuf,
    out: Option<BufWriter<File>>,
    /// Devices named so far, by the analysis' device id.
    named: Vec<bool>,
    /// Device id → the index records use.
    index: Vec<u16>,
    next_index: u16,
    error: Option<io::Error>,
}

impl AllocLogWriter {
    /// Starts a log at `path` (parent directories are created).
    pub fn create(path: &Path) -> AllocLogWriter {
        let opened = (|| {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            // Never waits on a FIFO without a reader (that would hang `Session::start`).
            let file = crate::fileio::create_for_streaming(path)?;
            let mut out = BufWriter::with_capacity(1 << 20, file);
            out.write_all(MAGIC)?;
            Ok(out)
        })();
        let (out, error) = match opened {
            Ok(out) => (Some(out), None),
            Err(error) => (None, Some(error)),
        };
        AllocLogWriter {
            path: path.to_path_buf(),
            out,
            named: Vec::new(),
            index: Vec::new(),
            next_index: 0,
            error,
        }
    }

    /// Appends one alloc or free on device `device` (the analysis' id), naming the device
    /// first if needed.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        device: u16,
        device_name: impl FnOnce() -> String,
        alloc: bool,
        category: Option<Category>,
        ts_ns: u64,
        key: u64,
        bytes: u64,
    ) {
        let tag = match (alloc, category) {
            (true, Some(category)) => ALLOC | ((category.index() as u8 + 1) << 4),
            (true, None) => ALLOC,
            (false, _) => FREE,
        };
        self.write_record(tag, device, device_name, ts_ns, key, bytes);
    }

    /// Appends that the live block `key` on `device` now has `category`.
    pub fn set_category(
        &mut self,
        device: u16,
        device_name: impl FnOnce() -> String,
        category: Category,
        ts_ns: u64,
        key: u64,
    ) {
        let tag = CATEGORY | ((category.index() as u8 + 1) << 4);
        self.write_record(tag, device, device_name, ts_ns, key, 0);
    }

    fn write_record(
        &mut self,
        tag: u8,
        device: u16,
        device_name: impl FnOnce() -> String,
        ts_ns: u64,
        key: u64,
        bytes: u64,
    ) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        let slot = usize::from(device);
        if self.named.len() <= slot {
            self.named.resize(slot + 1, false);
            self.index.resize(slot + 1, 0);
        }
        let mut result = Ok(());
        if !self.named[slot] {
            let name = device_name();
            let name = &name.as_bytes()[..name.len().min(u16::MAX as usize)];
            self.named[slot] = true;
            self.index[slot] = self.next_index;
            self.next_index = self.next_index.saturating_add(1);
            result = (|| {
                out.write_all(&[DEVICE])?;
                out.write_all(&self.index[slot].to_le_bytes())?;
                out.write_all(&(name.len() as u16).to_le_bytes())?;
                out.write_all(name)
            })();
        }
        let result = result.and_then(|()| {
            let mut record = [0u8; 27];
            record[0] = tag;
            record[1..3].copy_from_slice(&self.index[slot].to_le_bytes());
            record[3..11].copy_from_slice(&ts_ns.to_le_bytes());
            record[11..19].copy_from_slice(&key.to_le_bytes());
            record[19..27].copy_from_slice(&bytes.to_le_bytes());
            out.write_all(&record)
        });
        if let Err(error) = result {
            self.error = Some(error);
            self.out = None;
        }
    }

    /// Flushes the log; the error, if writing failed at any point.
    pub fn finish(mut self) -> Result<PathBuf, (PathBuf, io::Error)> {
        if let Some(mut out) = self.out.take() {
            if let Err(error) = out.flush() {
                self.error = Some(error);
            }
        }
        match self.error {
            None => Ok(self.path),
            Some(error) => Err((self.path, error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_records_read_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/run.alloc");
        let mut log = AllocLogWriter::create(&path);
        let grad = Some(Category::Gradient);
        log.record(0, || "cpu".into(), true, None, 10, 0x1000, 64);
        log.record(3, || "cuda:0".into(), true, grad, 11, 7, 1 << 20);
        log.record(
            0,
            || unreachable!("named once"),
            false,
            None,
            12,
            0x1000,
            64,
        );
        log.record(
            3,
            || unreachable!("named once"),
            false,
            None,
            13,
            7,
            1 << 20,
        );
        assert_eq!(log.finish().unwrap(), path);
        let read = AllocLog::read(&path).unwrap();
        assert_eq!(read.devices, vec!["cpu".to_string(), "cuda:0".to_string()]);
        assert_eq!(read.device("cuda:0"), Some(1));
        let kinds: Vec<(u16, bool, u64)> = read
            .records
            .iter()
            .map(|r| (r.device, r.alloc, r.ts_ns))
            .collect();
        assert_eq!(
            kinds,
            vec![(0, true, 10), (1, true, 11), (0, false, 12), (1, false, 13)]
        );
    }

    #[test]
    fn a_category_record_recategorises_the_live_block_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.alloc");
        let mut log = AllocLogWriter::create(&path);
        let other = Some(Category::Other);
        log.record(0, || "cpu".into(), true, other, 10, 0x1000, 64);
        log.set_category(0, || unreachable!(), Category::Parameter, 11, 0x1000);
        // A block not live (freed, or never seen) is not changed by one.
        log.record(0, || unreachable!(), true, other, 12, 0x2000, 8);
        log.record(0, || unreachable!(), false, None, 13, 0x2000, 8);
        log.set_category(0, || unreachable!(), Category::Gradient, 14, 0x2000);
        log.set_category(0, || unreachable!(), Category::Gradient, 15, 0x3000);
        log.finish().unwrap();
        let read = AllocLog::read(&path).unwrap();
        let categories: Vec<Option<Category>> = read.records.iter().map(|r| r.category).collect();
        assert_eq!(categories, [Some(Category::Parameter), other, None]);
    }

    #[test]
    fn damaged_logs_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut unnamed = b"HWALLOC1\x00\x05\x00".to_vec();
        unnamed.extend([0u8; 24]);
        let cases: [(&str, &[u8], &str); 5] = [
            ("empty.alloc", b"", "magic"),
            ("foreign.alloc", b"{\"schema\":1}", "magic"),
            ("cut.alloc", b"HWALLOC1\x02\x00\x00\x03\x00cp", "cut short"),
            ("unnamed.alloc", &unnamed, "before it was named"),
            ("tag.alloc", b"HWALLOC1\x09", "unknown record tag 9"),
        ];
        for (name, bytes, want) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            let message = AllocLog::read(&path).unwrap_err().to_string();
            assert!(
                message.contains(want) && message.contains(name),
                "{message}"
            );
        }
    }

    /// A log of `records` on one device named `cpu`: `(ts_ns, bytes)` allocations.
    fn crafted(records: &[(u64, u64)]) -> Vec<u8> {
        let mut bytes = b"HWALLOC1\x02\x00\x00\x03\x00cpu".to_vec();
        for (i, &(ts, size)) in records.iter().enumerate() {
            bytes.push(ALLOC);
            bytes.extend(0u16.to_le_bytes());
            bytes.extend(ts.to_le_bytes());
            bytes.extend((i as u64).to_le_bytes());
            bytes.extend(size.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn crafted_logs_are_rejected_with_what_was_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let mut twice = b"HWALLOC1\x02\x00\x00\x03\x00cpu".to_vec();
        twice.extend(b"\x02\x01\x00\x03\x00cpu");
        let control = b"HWALLOC1\x02\x00\x00\x03\x00c\x1bp".to_vec();
        let cases: [(&str, Vec<u8>, &str); 5] = [
            (
                "backwards.alloc",
                crafted(&[(5_000_000_000, 64), (10, 64)]),
                "not in time order",
            ),
            ("huge.alloc", crafted(&[(1, 1 << 63)]), "above i64::MAX"),
            ("twice.alloc", twice, "named twice"),
            ("control.alloc", control, "control characters"),
            (
                "empty-name.alloc",
                b"HWALLOC1\x02\x00\x00\x00\x00".to_vec(),
                "empty",
            ),
        ];
        for (name, bytes, want) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            let message = AllocLog::read(&path).unwrap_err().to_string();
            assert!(
                message.contains(want) && message.contains(name),
                "{message}"
            );
        }
        // Stragglers a few milliseconds late, and the largest size, are fine.
        let path = dir.path().join("straggler.alloc");
        let ok = crafted(&[
            (20_000_000, 8),
            (15_000_000, 8),
            (30_000_000, i64::MAX as u64),
        ]);
        std::fs::write(&path, ok).unwrap();
        assert_eq!(AllocLog::read(&path).unwrap().records.len(), 3);
    }

    #[test]
    fn an_unwritable_log_reports_its_error_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let mut log = AllocLogWriter::create(&blocker.join("run.alloc"));
        log.record(0, || "cpu".into(), true, None, 1, 1, 1);
        assert!(log.finish().is_err());
    }
}
