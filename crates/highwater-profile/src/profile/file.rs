//! Reading and writing profile files: bounded reads, the schema check, atomic writes, and
//! the error that names the file.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Profile, MAX_PROFILE_BYTES, SCHEMA};
use crate::fileio::{self, ReadError};

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
        /// [`MAX_PROFILE_BYTES`].
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
    /// The file is a profile of another schema (see [`SCHEMA`] for the compatibility rule).
    #[error("profile {path} has schema {found:?}; this highwater reads {expected:?} (the schema changes only when readers break: convert or re-record the profile with a matching highwater)")]
    Schema {
        /// The file.
        path: PathBuf,
        /// What the file says.
        found: String,
        /// [`SCHEMA`].
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
    /// Reads a profile written by [`Profile::write`].
    ///
    /// # Errors
    ///
    /// [`ProfileError`] naming the file when it cannot be read, is empty, too large, not JSON,
    /// malformed (wrong types, missing fields, nesting deeper than serde_json's limit) or of
    /// another schema.
    pub fn load(path: impl AsRef<Path>) -> Result<Profile, ProfileError> {
        let path = path.as_ref();
        let bytes = read_profile_bytes(path)?;
        Profile::from_json_bytes(&bytes, path)
    }

    /// Parses a profile from JSON bytes; `path` only names the source in errors.
    ///
    /// # Errors
    ///
    /// As [`Profile::load`], except for the I/O cases.
    pub fn from_json_bytes(bytes: &[u8], path: &Path) -> Result<Profile, ProfileError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ProfileError::Empty {
                path: path.to_path_buf(),
            });
        }
        check_schema(bytes, path)?;
        let profile: Profile =
            serde_json::from_slice(bytes).map_err(|error| ProfileError::Parse {
                path: path.to_path_buf(),
                detail: error.to_string(),
            })?;
        profile
            .check_invariants()
            .map_err(|detail| ProfileError::Inconsistent {
                path: path.to_path_buf(),
                detail,
            })?;
        Ok(profile)
    }

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

/// A profile file's bytes, bounded by [`MAX_PROFILE_BYTES`]; errors name the file.
pub(crate) fn read_profile_bytes(path: &Path) -> Result<Vec<u8>, ProfileError> {
    let read_error = |source| ProfileError::Read {
        path: path.to_path_buf(),
        source,
    };
    // A regular file says its size: refuse an oversized one before reading it. Anything
    // else (a FIFO, `/dev/zero`) is bounded by the bytes actually read.
    let too_large = |size| ProfileError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit: MAX_PROFILE_BYTES,
    };
    match fs::metadata(path) {
        Ok(meta) if meta.is_file() && meta.len() > MAX_PROFILE_BYTES => {
            return Err(too_large(meta.len()))
        }
        Ok(_) => {}
        Err(source) => return Err(read_error(source)),
    }
    let bytes = match fileio::read_bounded(path, MAX_PROFILE_BYTES) {
        Ok(bytes) => bytes,
        Err(ReadError::Io(source)) => return Err(read_error(source)),
        Err(ReadError::TooLarge { read }) => return Err(too_large(read)),
    };
    Ok(bytes)
}

/// Refuses a document of another schema, naming both (checked before the whole document is
/// parsed, so an old or foreign file gets the clearer error).
pub(crate) fn check_schema(bytes: &[u8], path: &Path) -> Result<(), ProfileError> {
    #[derive(Deserialize)]
    struct SchemaOnly {
        schema: Option<String>,
    }
    if let Ok(SchemaOnly {
        schema: Some(found),
    }) = serde_json::from_slice::<SchemaOnly>(bytes)
    {
        if found != SCHEMA {
            return Err(ProfileError::Schema {
                path: path.to_path_buf(),
                found,
                expected: SCHEMA,
            });
        }
    }
    Ok(())
}
