//! Reading profile files back (feature `read`): bounded reads, the schema check, parsing and
//! the invariants every loaded profile must satisfy.

use std::fs;
use std::path::Path;

use serde::Deserialize;

use super::{Profile, ProfileError, MAX_PROFILE_BYTES, SCHEMA};
use crate::fileio::{self, ReadError};

#[cfg_attr(docsrs, doc(cfg(feature = "read")))]
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
