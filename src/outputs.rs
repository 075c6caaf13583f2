//! Where a session's files go: resolved once when it starts, and checked before anything is
//! recorded, so that a run never discovers at its end that its profile cannot be written.
//!
//! - Paths are made absolute at start: a program that changes directory later still writes its
//!   checkpoints and its profile where it started (not a stale checkpoint there and the profile
//!   elsewhere).
//! - A regular file (or a path that does not exist yet) is replaced through a temporary file in
//!   its directory, so that directory must be writable. A device, a FIFO or `/dev/stdout` is
//!   written through: no checkpoints go there (they would follow each other in one stream), and
//!   no HTML report is written beside it.
//! - Two outputs of one session never name the same file.

use std::fs;
use std::path::{Path, PathBuf};

/// How an output will be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A regular file, replaced atomically (or created).
    Replaced,
    /// A device, FIFO, socket or open file of this process, written through.
    WrittenThrough,
}

/// An output path as the session will use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Output {
    /// Absolute: the directory the program ran in at start.
    pub(crate) path: PathBuf,
    pub(crate) kind: Kind,
}

/// Makes `path` absolute and checks it can take a file: not empty, not a directory; a regular
/// file (existing or not) needs a writable directory, anything else must itself be writable.
/// Says what is wrong, naming the path.
pub(crate) fn check(path: &Path) -> Result<Output, String> {
    let shown = path.display();
    if path.as_os_str().is_empty() {
        return Err("the output path is empty".into());
    }
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
        return Err(format!(
            "{shown} ends with `/`: it names a directory, not a file"
        ));
    }
    let path = std::path::absolute(path).map_err(|error| format!("{shown}: {error}"))?;
    if path.is_dir() {
        return Err(format!("{shown} is a directory"));
    }
    // The writer's own answer: a device, FIFO or open file is written through.
    if crate::fileio::writes_through(&path).map_err(|error| format!("{shown}: {error}"))? {
        return if crate::sys::file::writable(&path) {
            Ok(Output {
                path,
                kind: Kind::WrittenThrough,
            })
        } else {
            Err(format!("{shown} is not writable"))
        };
    }
    // A link leads to the file that is replaced (the writer writes the target, not the link);
    // a dangling link's target is created like a new file.
    let replaced = fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
    check_directory_of(&replaced)
        .map_err(|reason| format!("{shown} cannot be written: {reason}"))?;
    Ok(Output {
        path,
        kind: Kind::Replaced,
    })
}

/// Checks that the nearest existing ancestor of `file` is a writable directory (the temporary
/// file of an atomic replace, and any missing directories, are created there).
fn check_directory_of(file: &Path) -> Result<(), String> {
    let mut ancestor = file.parent();
    while let Some(dir) = ancestor {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        match fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => {
                return if crate::sys::file::writable(dir) {
                    Ok(())
                } else {
                    Err(format!("{} is not writable", dir.display()))
                };
            }
            Ok(_) => return Err(format!("{} is not a directory", dir.display())),
            Err(_) => ancestor = dir.parent(),
        }
    }
    Ok(())
}

/// A session's outputs, checked and resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outputs {
    /// The profile (absolute).
    pub(crate) output: PathBuf,
    /// Whether the HTML report is written beside it (asked for, and the output is a file).
    pub(crate) html: bool,
    /// The allocation log (absolute), if asked for.
    pub(crate) alloc_log: Option<PathBuf>,
    /// Whether checkpoints may be written to the output (it is replaced, not written through).
    pub(crate) checkpoints: bool,
}

/// Checks and resolves a session's outputs: the profile (when it is written), the HTML report
/// beside it, the allocation log. On failure, the setting at fault and why.
pub(crate) fn resolve(
    write: bool,
    output: &Path,
    html: bool,
    alloc_log: Option<&Path>,
) -> Result<Outputs, (&'static str, String)> {
    let (output, replaced) = if write {
        let checked = check(output).map_err(|reason| ("output", reason))?;
        (checked.path, checked.kind == Kind::Replaced)
    } else {
        (
            std::path::absolute(output).unwrap_or_else(|_| output.to_path_buf()),
            false,
        )
    };
    let html = html && replaced;
    let html_path = crate::export::html::path_beside(&output);
    if html {
        check(&html_path).map_err(|reason| ("html", reason))?;
    }
    let alloc_log = match alloc_log {
        Some(log) => {
            let log = check(log).map_err(|reason| ("alloc_log", reason))?.path;
            let clash = |other: &Path, what: &str| {
                (
                    "alloc_log",
                    format!(
                        "{} is also the {what}: one would overwrite the other",
                        other.display()
                    ),
                )
            };
            if write && same_file(&log, &output) {
                return Err(clash(&log, "profile output"));
            }
            if html && same_file(&log, &html_path) {
                return Err(clash(&log, "HTML report"));
            }
            Some(log)
        }
        None => None,
    };
    Ok(Outputs {
        output,
        html,
        alloc_log,
        checkpoints: replaced,
    })
}

/// Whether `a` and `b` name the same file: the same absolute path, or, when both exist, the
/// same file through links.
pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_outputs_are_refused_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let trailing = format!("{}/new/", dir.path().display());
        let cases: [(PathBuf, &str); 4] = [
            (PathBuf::new(), "empty"),
            (dir.path().to_path_buf(), "is a directory"),
            (PathBuf::from(&trailing), "ends with `/`"),
            (file.join("sub/p.json"), "is not a directory"),
        ];
        for (path, want) in cases {
            let message = check(&path).unwrap_err();
            assert!(message.contains(want), "{path:?}: {message}");
            assert!(message.contains(&*path.to_string_lossy()), "{message}");
        }
        assert!(check(&dir.path().join("a/b/p.json")).is_ok());
        assert!(check(&file).is_ok());
        assert!(check(Path::new("/dev/null")).is_ok());
        assert!(check(Path::new("p.json")).is_ok());
    }

    #[test]
    fn relative_paths_are_made_absolute_once() {
        let output = check(Path::new("some/dir/profile.json")).unwrap();
        assert!(output.path.is_absolute());
        assert!(output.path.ends_with("some/dir/profile.json"));
        assert_eq!(output.kind, Kind::Replaced);
    }

    #[test]
    fn devices_are_written_through_and_files_replaced() {
        assert_eq!(
            check(Path::new("/dev/null")).unwrap().kind,
            Kind::WrittenThrough
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.json");
        fs::write(&file, "old").unwrap();
        assert_eq!(check(&file).unwrap().kind, Kind::Replaced);
    }

    #[test]
    fn the_same_file_through_a_link_is_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.json");
        fs::write(&file, "x").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(same_file(&file, &link));
        assert!(!same_file(&file, &dir.path().join("other.json")));
    }
}
