//! Claiming an output for the session's whole life, so no other live process replaces it.
//!
//! The claim is a POSIX record lock (`fcntl(F_SETLK)`, whole file, for writing) on a hidden
//! file beside the output, `.NAME.lock`. The kernel keeps such a lock exactly as long as the
//! process that took it, whatever ends the process (`exit`, a signal, `SIGKILL`), so a claim
//! is never stale; a forked child does not inherit it; and NFS carries these locks between
//! hosts (flock's emulation there is built on them), so ranks on different nodes writing to
//! one shared directory see each other's claims.
//!
//! Releasing unlinks the lock file and then drops the lock. A process that opened the file
//! just before the unlink may then lock a file that no longer has the name, so a claim checks,
//! once locked, that the name still leads to the file it locked, and tries again if not.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::naming::with_tag;

/// An output this process holds: no other process claiming it gets it until this is dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    /// The lock file, locked: the lock lasts as long as this descriptor is open.
    _file: File,
    /// Its path, unlinked on release.
    lock_path: PathBuf,
    /// The process that took the lock: only it may unlink the file (a forked child's copy of
    /// this value holds no lock).
    owner: u32,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if std::process::id() == self.owner {
            // Unlink while still holding the lock: whoever opened the old file then finds, once
            // it locks it, that the name has gone, and claims afresh.
            let _ = std::fs::remove_file(&self.lock_path);
        }
        // Closing the file drops the lock.
    }
}

/// The outcome of [`claim_output`].
#[derive(Debug)]
pub(crate) struct ClaimedOutput {
    /// The path this process writes: the one asked for, or one beside it.
    pub(crate) path: PathBuf,
    /// Its claim; `None` when none could be made (then nothing is guarded).
    pub(crate) claim: Option<Claim>,
    /// When the path asked for was taken: who held it ("pid 41 on node7", or what is known).
    pub(crate) taken_by: Option<String>,
    /// Why no claim could be made, when none could: the lock file cannot be created (a
    /// directory only root may write, sysfs) or the file system keeps no locks. The write itself
    /// may still work; nothing keeps another process off the name.
    pub(crate) unguarded: Option<String>,
}

/// Most names tried beside a taken one (`.pidN`, then `.pidN-2` … ).
const BESIDE_TRIES: u32 = 16;

/// Claims `path` for this process, or a name beside it when another live process holds it:
/// `p.json` → `p.pid4242.json` (`p.pid4242-2.json`, … should that be held too). `who` is
/// written into the lock file, for the message another process prints.
///
/// Missing directories of the path are created (the lock file lives beside the output).
///
/// # Errors
///
/// When every name tried is held by another live process.
pub(crate) fn claim_output(path: &Path, pid: u32, who: &str) -> io::Result<ClaimedOutput> {
    let taken_by = match try_claim(path, who) {
        Attempt::Mine(claim) => {
            return Ok(ClaimedOutput {
                path: path.to_path_buf(),
                claim: Some(claim),
                taken_by: None,
                unguarded: None,
            })
        }
        Attempt::Unguarded(why) => {
            return Ok(ClaimedOutput {
                path: path.to_path_buf(),
                claim: None,
                taken_by: None,
                unguarded: Some(why),
            })
        }
        Attempt::Held(holder) => holder,
    };
    for n in 1..=BESIDE_TRIES {
        let tag = if n == 1 {
            format!("pid{pid}")
        } else {
            format!("pid{pid}-{n}")
        };
        let beside = with_tag(path, &tag);
        let (claim, unguarded) = match try_claim(&beside, who) {
            Attempt::Held(_) => continue,
            Attempt::Mine(claim) => (Some(claim), None),
            Attempt::Unguarded(why) => (None, Some(why)),
        };
        return Ok(ClaimedOutput {
            path: beside,
            claim,
            taken_by: Some(taken_by),
            unguarded,
        });
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "{} and {BESIDE_TRIES} names beside it are being written by other live processes",
            path.display()
        ),
    ))
}

/// What one try at a name gave.
enum Attempt {
    /// Claimed.
    Mine(Claim),
    /// Held by another live process, described.
    Held(String),
    /// No claim can be made here, and why (the name is free as far as anyone can tell).
    Unguarded(String),
}

/// `.NAME.lock` beside `path`.
fn lock_path(path: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(path.file_name().unwrap_or("highwater".as_ref()));
    name.push(".lock");
    path.with_file_name(name)
}

fn try_claim(path: &Path, who: &str) -> Attempt {
    let lock = lock_path(path);
    let unguarded = |error: io::Error| {
        Attempt::Unguarded(format!(
            "its lock file {} cannot be made: {error}",
            lock.display()
        ))
    };
    if let Some(dir) = lock.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        if let Err(error) = std::fs::create_dir_all(dir) {
            return unguarded(error);
        }
    }
    // A name whose lock file keeps vanishing under us is being claimed and released in a loop
    // by others; a few tries settle it.
    for _ in 0..8 {
        let mut file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            // Never follow a link planted at the lock's name, never block on a FIFO there.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .mode(0o644)
            .open(&lock)
        {
            Ok(file) => file,
            // Another user's lock file (or a link planted there): not ours to take.
            Err(error) if std::fs::symlink_metadata(&lock).is_ok() => {
                return Attempt::Held(format!(
                    "its lock file {} cannot be opened: {error}",
                    lock.display()
                ));
            }
            Err(error) => return unguarded(error),
        };
        match file.metadata() {
            Ok(meta) if meta.is_file() => {}
            _ => return Attempt::Held(format!("{} is not a regular file", lock.display())),
        }
        match crate::sys::file::lock_whole(&file) {
            Ok(true) => {}
            Ok(false) => return Attempt::Held(holder(&mut file)),
            // No locks on this file system (ENOLCK), or none for this file: write as before.
            Err(error) => {
                drop(file);
                let _ = std::fs::remove_file(&lock);
                return Attempt::Unguarded(format!("{} cannot be locked: {error}", lock.display()));
            }
        }
        let still_named = match (file.metadata(), std::fs::symlink_metadata(&lock)) {
            (Ok(held), Ok(now)) => now.dev() == held.dev() && now.ino() == held.ino(),
            _ => false,
        };
        if !still_named {
            continue;
        }
        // Who holds it, for the message of whoever finds it held; the claim stands without.
        let _ = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(who.as_bytes()));
        return Attempt::Mine(Claim {
            _file: file,
            lock_path: lock,
            owner: std::process::id(),
        });
    }
    Attempt::Held(format!(
        "its lock file {} was replaced again and again",
        lock.display()
    ))
}

/// What the holder wrote into its lock file (at most a line), or a plain description.
fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.rewind();
    let _ = file.take(200).read_to_string(&mut text);
    let line = text.lines().next().unwrap_or("").trim();
    if line.is_empty() {
        "a process that has not said who it is".to_string()
    } else {
        line.chars().filter(|c| !c.is_control()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_name_is_claimed_and_released_without_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        let claimed = claim_output(&path, 42, "pid 42 on here").unwrap();
        assert_eq!(claimed.path, path);
        assert!(claimed.taken_by.is_none());
        let lock = dir.path().join(".p.json.lock");
        assert_eq!(std::fs::read_to_string(&lock).unwrap(), "pid 42 on here");
        drop(claimed);
        assert!(!lock.exists(), "released claims leave nothing behind");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_name_claimed_in_this_process_can_be_claimed_again_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/p.json");
        for _ in 0..3 {
            let claimed = claim_output(&path, 42, "me").unwrap();
            assert_eq!(claimed.path, path, "missing directories are made");
        }
    }

    #[test]
    fn where_no_lock_file_can_be_made_the_name_is_kept_unguarded() {
        // sysfs lets nobody, root included, create a file.
        let path = Path::new("/sys/highwater-claim-test.json");
        let claimed = claim_output(path, 7, "me").unwrap();
        assert_eq!(claimed.path, path);
        assert!(claimed.claim.is_none() && claimed.taken_by.is_none());
        assert!(claimed.unguarded.unwrap().contains("cannot be made"));
    }

    #[test]
    fn a_link_planted_at_the_lock_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(".p.json.lock")).unwrap();
        let claimed = claim_output(&dir.path().join("p.json"), 7, "me").unwrap();
        assert_eq!(claimed.path, dir.path().join("p.pid7.json"));
        assert!(claimed.taken_by.unwrap().contains("cannot be opened"));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    }
}
