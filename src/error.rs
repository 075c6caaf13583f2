//! [`Error`]: why a session could not start or finish.

use std::path::PathBuf;

use crate::export::ExportError;
use crate::profile::{Profile, ProfileError};

/// Why a [`Session`](crate::Session) could not start or finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An environment variable has a value highwater does not understand.
    #[error("invalid {var}={value:?}: expected {expected}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it may be.
        expected: &'static str,
    },
    /// A builder setting is out of range.
    #[error("invalid session setting {setting}: {reason}")]
    Setting {
        /// The setting.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Another session is recording in this process.
    #[error("a highwater session is already running in this process; finish it first")]
    AlreadyRunning,
    /// The collector thread could not be started.
    #[error("cannot start the highwater collector thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The collector thread ended without producing a profile.
    #[error("the highwater collector thread stopped without producing a profile")]
    CollectorLost,
    /// Writing a profile (a checkpoint on a signal) failed.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// Writing the HTML report next to the profile failed (the profile itself was written).
    #[error(transparent)]
    Export(#[from] ExportError),
    /// The session finished but its profile (or the report next to it) could not be written.
    /// The run is not lost: the profile is here, and a copy went to `fallback` if that worked.
    #[error("{source}; {}", fallback_note(.fallback))]
    Write {
        /// What went wrong writing the output (it names the file).
        source: ProfileError,
        /// The finished session's profile.
        profile: Box<Profile>,
        /// Where a copy of the profile was written instead (in the temporary directory), if it
        /// could be.
        fallback: Option<PathBuf>,
    },
    /// This session already ended (its profile was written when the process was signalled or
    /// exited); the value no longer refers to a running session.
    #[error("this highwater session has already ended")]
    Ended,
    /// This session was inherited by a forked child; it belongs to the parent, where it goes on
    /// recording. A child records with its own `Session::start`.
    #[error("this highwater session belongs to the parent process (inherited through fork)")]
    ForkedChild,
}

impl Error {
    /// The finished session's profile, when the error is a failed write ([`Error::Write`]).
    pub fn into_profile(self) -> Option<Profile> {
        match self {
            Error::Write { profile, .. } => Some(*profile),
            _ => None,
        }
    }
}

fn fallback_note(fallback: &Option<PathBuf>) -> String {
    match fallback {
        Some(path) => format!("a copy of the profile was written to {}", path.display()),
        None => "no copy of the profile could be written either".to_string(),
    }
}
