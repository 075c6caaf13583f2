//! Checkpoints: the profile so far, written to the output path while the session records, so a
//! run killed with SIGKILL still leaves a readable profile (marked `meta.partial`).
//!
//! The collector builds each checkpoint between drains (the profile is bounded in size, so this
//! is bounded work) and hands it to a writer thread of its own, so serialising and syncing the
//! file never holds up draining, and so never holds up a user thread waiting on a full ring.
//! The hand-over is a one-slot channel: when the writer is still busy with the last checkpoint
//! the new one is skipped, not queued. The writer is joined before the session writes its final
//! profile, which replaces the last checkpoint.
//!
//! A refused allocation (see `capture::oom`) asks for a checkpoint at once, whether periodic
//! ones are on or not: the collector waits for the writer to take it ([`Checkpointer::write_now`])
//! and the writer tells the refused threads when it is on disk.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::Sender;

use crate::capture;
use crate::profile::{Profile, RunMeta, Warning};

/// How often a session writes a checkpoint unless told otherwise
/// ([`SessionBuilder::checkpoint_every`](crate::SessionBuilder::checkpoint_every),
/// `HIGHWATER_CHECKPOINT`): often enough that a killed run loses little, rarely enough that the
/// cost is noise (see `BENCHMARKS.md`).
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(10);

/// What the collector needs to write checkpoints.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointConfig {
    /// Time between checkpoints; `None`: only at a refused allocation.
    pub(crate) every: Option<Duration>,
    /// The session's output path.
    pub(crate) path: PathBuf,
    /// The run's `meta`, as the final profile will have it.
    pub(crate) meta: RunMeta,
}

/// The collector's side of checkpointing: when the next one is due, and the writer thread.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    every: Option<Duration>,
    meta: RunMeta,
    /// When the next periodic checkpoint is due (`None`: never).
    next_due: Option<Instant>,
    /// Checkpoints to write, each with the refusal ticket it answers, if any.
    to_writer: Option<Sender<(Profile, Option<u32>)>>,
    writer: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the writer thread. Call it before the recording gate opens, on the thread that
    /// starts the session: std allocates on a new thread before its closure can mark it
    /// internal.
    pub(crate) fn start(config: CheckpointConfig) -> std::io::Result<Checkpointer> {
        let (to_writer, from_collector) = crossbeam_channel::bounded::<(Profile, Option<u32>)>(1);
        let (ready, started) = crossbeam_channel::bounded(1);
        let path = config.path;
        let writer = std::thread::Builder::new()
            .name("highwater-checkpoint".into())
            .spawn(move || {
                capture::mark_internal_thread();
                let _ = ready.send(());
                for (profile, refusals) in from_collector {
                    // A failed checkpoint leaves the previous file as it was (the write is
                    // atomic); the next one, or the final profile, tries again.
                    let _ = profile.write(&path);
                    if let Some(ticket) = refusals {
                        capture::oom::written(ticket);
                    }
                }
            })?;
        started.recv().map_err(|_| {
            std::io::Error::other("the highwater checkpoint writer ended as it started")
        })?;
        Ok(Checkpointer {
            every: config.every,
            meta: config.meta,
            next_due: config.every.map(|every| Instant::now() + every),
            to_writer: Some(to_writer),
            writer: Some(writer),
        })
    }

    /// Whether a checkpoint should be taken now.
    pub(crate) fn due(&self) -> bool {
        self.next_due.is_some_and(|due| Instant::now() >= due)
    }

    /// Marks `profile` as a checkpoint of this run and hands it to the writer, unless the writer
    /// is still busy with the previous one; the next checkpoint is due one interval from now.
    pub(crate) fn offer(&mut self, profile: Profile) {
        let profile = self.mark(profile);
        if let Some(to_writer) = &self.to_writer {
            // Full: the writer is still on the last one; skipping keeps memory bounded and
            // the collector draining. Disconnected: the writer is gone; the final write stays.
            let _ = to_writer.try_send((profile, None));
        }
    }

    /// Hands `profile` to the writer as the checkpoint that answers refusal tickets up to
    /// `ticket`, waiting for the writer to finish the one before if need be (a refusal's
    /// checkpoint is never skipped). Without a writer the tickets are done at once.
    pub(crate) fn write_now(&mut self, profile: Profile, ticket: u32) {
        let profile = self.mark(profile);
        let sent = self
            .to_writer
            .as_ref()
            .is_some_and(|to_writer| to_writer.send((profile, Some(ticket))).is_ok());
        if !sent {
            capture::oom::written(ticket);
        }
    }

    /// `profile` marked as a checkpoint of this run, taken now; the next periodic one is due
    /// one interval from now.
    fn mark(&mut self, mut profile: Profile) -> Profile {
        self.next_due = self.every.map(|every| Instant::now() + every);
        let threads = profile.meta.threads;
        profile.meta = self.meta.clone();
        profile.meta.threads = threads;
        profile.meta.partial = true;
        profile.meta.checkpoint_unix_ms = Some(unix_ms_now());
        profile.warnings.push(Warning::Partial {
            recorded_ns: profile.summary.duration_ns,
        });
        profile
    }

    /// Waits for the checkpoint being written, if any, and ends the writer, so nothing it does
    /// can land after the final profile.
    pub(crate) fn finish(&mut self) {
        self.to_writer = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Milliseconds since the Unix epoch (0 for a clock set before it).
pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_millis() as u64)
        .unwrap_or(0)
}

/// Parses `HIGHWATER_CHECKPOINT`: seconds between checkpoints (fractions allowed), `0` for none.
/// `Some(None)` means off.
pub(crate) fn parse_interval(value: &str) -> Option<Option<Duration>> {
    let seconds: f64 = value.trim().parse().ok()?;
    if !(0.0..=86_400.0).contains(&seconds) {
        return None;
    }
    if seconds == 0.0 {
        return Some(None);
    }
    // Below a millisecond a checkpoint would be due on every drain.
    (seconds >= 0.001).then(|| Some(Duration::from_secs_f64(seconds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_values() {
        assert_eq!(parse_interval("0"), Some(None));
        assert_eq!(
            parse_interval(" 2.5 "),
            Some(Some(Duration::from_millis(2500)))
        );
        assert_eq!(parse_interval("30"), Some(Some(Duration::from_secs(30))));
        for bad in ["", "-1", "soon", "NaN", "inf", "1e9", "0.0000001"] {
            assert_eq!(parse_interval(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_checkpoint_is_partial_and_lands_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        let mut meta = RunMeta::default();
        meta.program = "train".into();
        meta.pid = 42;
        let mut checkpointer = Checkpointer::start(CheckpointConfig {
            every: Some(Duration::from_secs(3600)),
            path: path.clone(),
            meta,
        })
        .unwrap();
        assert!(!checkpointer.due());
        let mut profile = Profile::empty();
        profile.summary.peak_bytes = 123;
        profile.meta.threads = 2;
        checkpointer.offer(profile);
        checkpointer.finish();
        let written = Profile::load(&path).unwrap();
        assert!(written.meta.partial);
        assert!(written.meta.checkpoint_unix_ms.unwrap() > 0);
        assert_eq!(
            (
                written.meta.pid,
                written.meta.threads,
                written.summary.peak_bytes
            ),
            (42, 2, 123)
        );
        assert_eq!(written.meta.program, "train");
        assert!(written
            .warnings
            .iter()
            .any(|w| matches!(w, Warning::Partial { .. })));
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left");
    }
}
