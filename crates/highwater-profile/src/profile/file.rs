//! Writing profile files atomically, and the error that names the file.

use std::io;
use std::path::{Path, PathBuf};

use super::Profile;
use crate::fileio;

/// Why a profile could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// The file could not be opened or read.
    #[error("cannot read profile {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The file is empty.
    #[error("profile {path} is empty")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file is larger than any profile highwater writes.
    #[error("profile {path} is {size} bytes or more, over the {limit}-byte limit for a profile")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// [`MAX_PROFILE_BYTES`](super::MAX_PROFILE_BYTES).
        limit: u64,
    },
    /// The file is not a JSON profile of this schema.
    #[error("profile {path} is not a valid highwater profile: {detail}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong, with line and column.
        detail: String,
    },
    /// The file parses, but breaks a rule every profile satisfies
    /// ([`Profile::check_invariants`]).
    #[error("profile {path} is inconsistent: {detail}")]
    Inconsistent {
        /// The file.
        path: PathBuf,
        /// The broken rule.
        detail: String,
    },
    /// The file is a profile of another schema (see [`SCHEMA`](super::SCHEMA) for the
    /// compatibility rule).
    #[error("profile {path} has schema {found:?}; this highwater reads {expected:?} (the schema changes only when readers break: convert or re-record the profile with a matching highwater)")]
    Schema {
        /// The file.
        path: PathBuf,
        /// What the file says.
        found: String,
        /// [`SCHEMA`](super::SCHEMA).
        expected: &'static str,
    },
    /// Writing the profile failed; no partial file was left behind. (The other outputs fail
    /// with `highwater_export::ExportError`.)
    #[error("cannot write profile {path}: {source}")]
    Write {
        /// The destination.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
}

impl Profile {
    /// Serialises the profile as pretty JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Writes the profile as JSON to `path`, atomically: a temporary file in the same directory
    /// is written, synced and renamed over `path`. Missing parent directories are created.
    ///
    /// # Errors
    ///
    /// [`ProfileError::Write`] when any step fails; the temporary file is removed and `path`
    /// keeps whatever it held before.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), ProfileError> {
        let path = path.as_ref();
        fileio::write_file(path, self.to_json().as_bytes()).map_err(|source| ProfileError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}
