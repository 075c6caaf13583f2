//! [`Error`]: why a session could not start or finish.

use crate::export::ExportError;
use crate::profile::ProfileError;

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
    /// Writing the profile failed.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// Writing the HTML report next to the profile failed (the profile itself was written).
    #[error(transparent)]
    Export(#[from] ExportError),
}
