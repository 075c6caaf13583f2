//! Following a profile file that its session rewrites (checkpoints, then the final profile).
//!
//! Sessions replace the file atomically (a sibling renamed over it), so a reader sees either the
//! old or the new document, never half of one. A change is told by the contents, not the
//! file's times: two checkpoints can land within the file system's timestamp granularity, and
//! the new file can reuse the old one's inode. The last profile that loaded is kept while the
//! file is missing or unreadable, so the screen never goes blank in the middle of a run.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};

use highwater_profile::Profile;
use highwater_profile::MAX_PROFILE_BYTES;

/// What identifies one version of the file: its length and a hash of its bytes.
type Version = (usize, u64);

fn version_of(bytes: &[u8]) -> Version {
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    (bytes.len(), hasher.finish())
}

/// The profile at a path, reloaded when the file changes.
#[derive(Debug)]
pub(crate) struct Follower {
    path: PathBuf,
    seen: Option<Version>,
    profile: Option<Profile>,
    /// Why the latest version could not be read, until one can.
    problem: Option<String>,
}

impl Follower {
    /// Follows `path`; nothing is read until [`Follower::poll`].
    pub(crate) fn new(path: &Path) -> Follower {
        Follower {
            path: path.to_path_buf(),
            seen: None,
            profile: None,
            problem: None,
        }
    }

    /// Reads the file again; `true` when what is shown changed (a new profile, or a new
    /// problem).
    pub(crate) fn poll(&mut self) -> bool {
        let bytes = match read_bounded(&self.path) {
            Ok(bytes) => bytes,
            Err(error) => {
                let problem = if error.kind() == io::ErrorKind::NotFound {
                    None
                } else {
                    Some(format!("cannot read {}: {error}", self.path.display()))
                };
                let changed = problem != self.problem || self.seen.is_some();
                self.problem = problem;
                self.seen = None;
                return changed;
            }
        };
        let version = version_of(&bytes);
        if self.seen == Some(version) {
            return false;
        }
        self.seen = Some(version);
        match Profile::from_json_bytes(&bytes, &self.path) {
            Ok(profile) => {
                self.profile = Some(profile);
                self.problem = None;
            }
            Err(error) => self.problem = Some(error.to_string()),
        }
        true
    }

    /// The last profile that loaded.
    pub(crate) fn profile(&self) -> Option<&Profile> {
        self.profile.as_ref()
    }

    /// Why the file as it is now cannot be shown, if it cannot.
    pub(crate) fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }
}

/// The file's bytes, refusing one larger than any profile (as [`Profile::load`] does).
fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let file = fs::File::open(path)?;
    io::Read::read_to_end(&mut io::Read::take(file, MAX_PROFILE_BYTES + 1), &mut bytes)?;
    if bytes.len() as u64 > MAX_PROFILE_BYTES {
        return Err(io::Error::other(format!(
            "larger than the {MAX_PROFILE_BYTES}-byte limit for a profile"
        )));
    }
    Ok(bytes)
}

/// Whether the process `pid` still runs on this machine; `None` when that cannot be told (no
/// pid recorded, or not Linux). A zombie (killed, not yet reaped) counts as gone.
pub(crate) fn process_alive(pid: u32) -> Option<bool> {
    if pid == 0 || !cfg!(target_os = "linux") {
        return None;
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may itself hold `)`.
        Ok(stat) => Some(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X"),
        ),
        Err(_) => Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use highwater_testkit::sample::sample_profile;

    #[test]
    fn follows_rewrites_and_keeps_the_last_good_profile() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        let mut follower = Follower::new(&path);
        assert!(!follower.poll(), "nothing there yet is no change");
        assert!(follower.profile().is_none() && follower.problem().is_none());

        let mut profile = sample_profile();
        profile.write(&path).unwrap();
        assert!(follower.poll());
        assert!(!follower.poll(), "an unchanged file is not read again");
        let peak = |follower: &Follower| follower.profile().map(|p| p.summary.peak_bytes);
        assert_eq!(peak(&follower), Some(profile.summary.peak_bytes));

        // Same length, same second: only the contents tell.
        profile.summary.peak_bytes += 1;
        profile.write(&path).unwrap();
        assert!(follower.poll());
        assert_eq!(peak(&follower), Some(profile.summary.peak_bytes));

        fs::write(&path, "{ not a profile").unwrap();
        assert!(follower.poll());
        assert!(follower.problem().unwrap().contains("not a valid"));
        let kept = peak(&follower);
        assert_eq!(
            kept,
            Some(profile.summary.peak_bytes),
            "the last good one stays"
        );
    }

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        if !cfg!(target_os = "linux") {
            assert_eq!(process_alive(std::process::id()), None);
            return;
        }
        assert_eq!(process_alive(std::process::id()), Some(true));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(process_alive(pid), Some(false));
        assert_eq!(process_alive(0), None);
    }
}
