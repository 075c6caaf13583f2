//! The one writer and the one reader behind every file highwater writes or reads: profiles,
//! HTML reports, Chrome traces, PyTorch snapshots, allocation logs.
//!
//! # Writing
//!
//! A regular file (or a path that does not exist yet) is replaced atomically: a temporary
//! sibling is written, synced and renamed over it, so readers never see half a file and a
//! failed write leaves the old one. The temporary file has an unpredictable name and is created
//! exclusively (`O_CREAT | O_EXCL`, which never follows a link or opens a FIFO planted at that
//! name), so another user who can write the directory cannot redirect the write. Anything else
//! is written *through*, never replaced:
//!
//! - a device (`/dev/null`), a FIFO or a socket is opened without following links and written
//!   (a FIFO with no reader is an error at once, not a hang);
//! - a symlink owned by this user or by root is followed: its target is written (atomically
//!   when it is a regular file), and the link stays. A symlink owned by anyone else is refused:
//!   in a shared directory it may have been planted to make this process overwrite a file it
//!   did not mean to;
//! - a path that leads through `/proc/*/fd` or `/dev/fd` (`/dev/stdout`) names an open file of
//!   this process: it is appended to, as a shell's `>` redirect would be.
//!
//! # Reading
//!
//! Every read is bounded by the bytes actually read, not by what `metadata` claims (`/dev/zero`
//! has no length). A FIFO or a socket is refused, not read: a writer that never writes would
//! hang the reader.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Where a write to a path goes, once links are settled.
enum Destination {
    /// A regular file, or no file yet: replaced through an exclusive temporary sibling.
    Replace(PathBuf),
    /// A device, FIFO or socket: opened and written, never replaced. `append` for an open
    /// file of this process reached through `/proc/*/fd` or `/dev/fd`.
    Through { path: PathBuf, append: bool },
}

/// Settles where a write to `path` goes, as the [module docs](self) say.
fn destination(path: &Path) -> io::Result<Destination> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(_) => return Ok(Destination::Replace(path.to_path_buf())),
    };
    if !meta.file_type().is_symlink() {
        return Ok(if meta.is_file() || meta.is_dir() {
            // A directory fails at the rename, naming the cause.
            Destination::Replace(path.to_path_buf())
        } else {
            Destination::Through {
                path: path.to_path_buf(),
                append: false,
            }
        });
    }
    if leads_to_open_file(path) {
        return Ok(Destination::Through {
            path: path.to_path_buf(),
            append: true,
        });
    }
    let target = follow_owned_links(path)?;
    match fs::metadata(&target) {
        Ok(meta) if meta.is_dir() => Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            format!("the link leads to the directory {}", target.display()),
        )),
        Ok(meta) if !meta.is_file() => Ok(Destination::Through {
            path: target,
            append: false,
        }),
        // A regular file, or a dangling link's target, created as a plain file would be.
        _ => Ok(Destination::Replace(target)),
    }
}

/// Follows the chain of links at `path`'s last component to the path it ends at, refusing a
/// link that neither this user nor root owns (the rule Linux's `fs.protected_symlinks` applies
/// in sticky directories, applied everywhere): in a directory others can write, such a link may
/// have been planted to make this process overwrite a file it never meant to.
fn follow_owned_links(path: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut at = path.to_path_buf();
    // Linux follows at most 40 links; so do we.
    for _ in 0..40 {
        let meta = match fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => meta,
            _ => return Ok(at),
        };
        if meta.uid() != me && meta.uid() != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is a symbolic link owned by another user (uid {}); refusing to follow it",
                    at.display(),
                    meta.uid()
                ),
            ));
        }
        let next = fs::read_link(&at)?;
        at = match at.parent() {
            Some(dir) if next.is_relative() => dir.join(next),
            _ => next,
        };
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        "too many levels of symbolic links",
    ))
}

/// Whether [`write_file`] writes `path` through (a device, a FIFO, an open file of this
/// process such as `/dev/stdout`) rather than replacing it with a new file; the error is the
/// one a write would meet settling where it goes (a link another user owns, say).
pub fn writes_through(path: &Path) -> io::Result<bool> {
    Ok(matches!(destination(path)?, Destination::Through { .. }))
}

/// Writes `contents` to `path` as the [module docs](self) say.
pub fn write_file(path: &Path, contents: &[u8]) -> io::Result<()> {
    match destination(path)? {
        Destination::Replace(path) => replace_atomically(&path, contents),
        Destination::Through { path, append } => {
            let mut file = open_through(&path, append)?;
            file.write_all(contents)?;
            file.flush()
        }
    }
}

/// Whether following the links from `path` passes through `/proc/<pid>/fd` or `/dev/fd`: the
/// path then names a file this process already has open (`/dev/stdout`), which writes append to.
pub fn leads_to_open_file(path: &Path) -> bool {
    let mut at = path.to_path_buf();
    // Linux follows at most 40 links; so do we.
    for _ in 0..40 {
        let Ok(next) = fs::read_link(&at) else {
            return false;
        };
        let next = match at.parent() {
            Some(dir) if next.is_relative() => dir.join(next),
            _ => next,
        };
        let mut parts = next.components().skip(1);
        let first = parts.next().map(|c| c.as_os_str().to_owned());
        let second = parts.next().map(|c| c.as_os_str().to_owned());
        let third = parts.next().map(|c| c.as_os_str().to_owned());
        let through_proc =
            first.as_deref() == Some("proc".as_ref()) && third.as_deref() == Some("fd".as_ref());
        let through_dev_fd =
            first.as_deref() == Some("dev".as_ref()) && second.as_deref() == Some("fd".as_ref());
        if through_proc || through_dev_fd {
            return true;
        }
        at = next;
    }
    false
}

/// Opens `path` (a device, FIFO or socket) for writing without replacing it. Never blocks
/// opening a FIFO: with no reader that is an error naming the cause. `append` is for an open
/// file of this process (`/dev/stdout`), the one case where the last component is a link meant
/// to be followed; otherwise a link swapped in since [`destination`] looked is not followed.
fn open_through(path: &Path, append: bool) -> io::Result<File> {
    let nofollow = if append { 0 } else { libc::O_NOFOLLOW };
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | nofollow)
        .open(path)
        .map_err(|error| {
            if error.raw_os_error() == Some(libc::ENXIO) {
                io::Error::new(error.kind(), "it is a FIFO that no process is reading")
            } else {
                error
            }
        })?;
    set_blocking(&file)?;
    Ok(file)
}

/// Opens `path` for a stream of writes (the allocation log). A regular file, or no file yet,
/// is replaced at once by a new empty file created exclusively beside it and renamed over it
/// (never truncated in place, so a link or a hard link planted there is replaced, not written
/// through); a device, FIFO or `/dev/stdout` is written through. Never blocks opening a FIFO:
/// with no reader that is an error naming the cause.
pub fn create_for_streaming(path: &Path) -> io::Result<File> {
    match destination(path)? {
        Destination::Replace(path) => {
            let temp = temp_beside(&path)?;
            let temp = temp.persist(&path).map_err(|persist| persist.error)?;
            Ok(temp)
        }
        Destination::Through { path, append } => open_through(&path, append),
    }
}

/// A new empty file in `path`'s directory (created, with missing parents, when needed), with
/// an unpredictable name, created exclusively and readable as a plain file would be (`0666`
/// less the umask).
fn temp_beside(path: &Path) -> io::Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir)?;
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(path.file_name().unwrap_or("highwater".as_ref()));
    prefix.push(".");
    tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(fs::Permissions::from_mode(0o666))
        .tempfile_in(&dir)
}

/// Writes `contents` to `path` through an exclusive temporary sibling and a rename. Missing
/// parent directories are created; on any failure the temporary file is removed and `path`
/// keeps what it held.
fn replace_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut temp = temp_beside(path)?;
    temp.write_all(contents)?;
    temp.as_file().sync_all()?;
    temp.persist(path).map_err(|persist| persist.error)?;
    Ok(())
}

/// Creates a new file in `dir` named `prefix`, random characters, then `suffix`, exclusively
/// (a name planted in a shared directory such as `/tmp` is never opened), writes `contents`,
/// and keeps it. Its path.
pub fn write_new_file_in(
    dir: &Path,
    prefix: &str,
    suffix: &str,
    contents: &[u8],
) -> io::Result<PathBuf> {
    let mut file = tempfile::Builder::new()
        .prefix(prefix)
        .suffix(suffix)
        .tempfile_in(dir)?;
    file.write_all(contents)?;
    file.as_file().sync_all()?;
    let (_, path) = file.keep().map_err(|keep| keep.error)?;
    Ok(path)
}

/// Why [`read_bounded`] returned no bytes.
#[derive(Debug)]
pub enum ReadError {
    /// Opening or reading failed.
    Io(io::Error),
    /// More than the limit could be read; `read` bytes were (at least the limit plus one).
    TooLarge {
        /// Bytes read before stopping.
        read: u64,
    },
}

/// Opens `path` for reading. A FIFO or a socket is refused (a writer that never writes would
/// hang the read); opening one never blocks either way.
pub fn open_for_reading(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::FileTypeExt;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_fifo() || kind.is_socket() {
        let what = if kind.is_fifo() { "a FIFO" } else { "a socket" };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {what}, not a regular file"),
        ));
    }
    set_blocking(&file)?;
    Ok(file)
}

/// Reads all of `path`, but never more than `limit` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let file = open_for_reading(path).map_err(ReadError::Io)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    let read = bytes.len() as u64;
    if read > limit {
        return Err(ReadError::TooLarge { read });
    }
    Ok(bytes)
}

/// Clears `O_NONBLOCK`, set only so that opening a FIFO does not wait.
// This crate's file calls live here, as the library's live in its `sys`.
#[allow(clippy::disallowed_methods)]
fn set_blocking(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is open for as long as `file` lives; F_GETFL/F_SETFL only read and set
    // status flags.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    fn mkfifo(path: &Path) {
        let name = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn dev_null_is_written_through_not_replaced() {
        write_file(Path::new("/dev/null"), b"{}").unwrap();
        let meta = fs::metadata("/dev/null").unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(meta.file_type().is_char_device(), "/dev/null was replaced");
    }

    #[test]
    fn a_symlink_s_target_is_written_and_the_link_stays() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.json");
        fs::write(&target, "old").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_file(&link, b"new").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(&target).unwrap(), "new");
        let names = fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(names, 2, "no temporary file left");
    }

    #[test]
    fn a_fifo_is_written_through_to_its_reader_and_without_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        mkfifo(&fifo);
        let error = write_file(&fifo, b"x").unwrap_err();
        assert!(error.to_string().contains("FIFO"), "{error}");
        let reader = {
            let fifo = fifo.clone();
            // A reader that waits for the writer, as `cat fifo` does.
            std::thread::spawn(move || fs::read(&fifo).ok())
        };
        // The reader may not have opened yet: retry while nobody reads.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while write_file(&fifo, b"through the pipe").is_err() {
            assert!(std::time::Instant::now() < deadline, "no reader appeared");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            reader.join().unwrap().as_deref(),
            Some(&b"through the pipe"[..])
        );
        use std::os::unix::fs::FileTypeExt;
        assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }

    #[test]
    fn reads_are_bounded_by_bytes_read() {
        match read_bounded(Path::new("/dev/zero"), 4096) {
            Err(ReadError::TooLarge { read }) => assert_eq!(read, 4097),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        mkfifo(&fifo);
        // No writer: refused at once, no hang.
        assert!(matches!(read_bounded(&fifo, 4096), Err(ReadError::Io(_))));
    }

    #[test]
    fn streaming_to_a_fifo_without_a_reader_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("log");
        mkfifo(&fifo);
        let error = create_for_streaming(&fifo).unwrap_err();
        assert!(error.to_string().contains("FIFO"), "{error}");
        let file = dir.path().join("file");
        fs::write(&file, "old contents").unwrap();
        create_for_streaming(&file).unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"", "a regular file is truncated");
    }

    /// The names the temporary file of a write to `path` had before writes used exclusive,
    /// unpredictable names: `.<name>.<pid>.tmp`, for this process and the next few.
    fn predictable_temp_names(path: &Path) -> Vec<PathBuf> {
        let name = path.file_name().unwrap().to_str().unwrap();
        let pid = std::process::id();
        (pid..pid + 8)
            .map(|pid| path.with_file_name(format!(".{name}.{pid}.tmp")))
            .collect()
    }

    /// Runs `write` on another thread and fails if it has not returned within a minute.
    fn within_a_minute<T: Send + 'static>(write: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(write()).unwrap());
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the write hung")
    }

    #[test]
    fn links_planted_at_temporary_names_are_never_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // Not sticky, writable by all: anyone may plant names here.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let precious = dir.path().join("precious");
        fs::write(&precious, "the victim's data").unwrap();
        let output = dir.path().join("profile.json");
        for planted in predictable_temp_names(&output) {
            std::os::unix::fs::symlink(&precious, planted).unwrap();
        }
        write_file(&output, b"the profile").unwrap();
        assert_eq!(fs::read_to_string(&precious).unwrap(), "the victim's data");
        let meta = fs::symlink_metadata(&output).unwrap();
        assert!(meta.is_file(), "the output is a regular file, not a link");
        assert_eq!(fs::read_to_string(&output).unwrap(), "the profile");

        // The allocation log's stream likewise.
        let log = dir.path().join("run.alloc");
        for planted in predictable_temp_names(&log) {
            std::os::unix::fs::symlink(&precious, planted).unwrap();
        }
        let mut stream = create_for_streaming(&log).unwrap();
        stream.write_all(b"log").unwrap();
        assert_eq!(fs::read_to_string(&precious).unwrap(), "the victim's data");
        assert_eq!(fs::read_to_string(&log).unwrap(), "log");
    }

    #[test]
    fn fifos_planted_at_temporary_names_neither_hang_nor_fail_a_write() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("profile.json");
        for planted in predictable_temp_names(&output) {
            mkfifo(&planted);
        }
        let written = output.clone();
        within_a_minute(move || write_file(&written, b"the profile")).unwrap();
        assert_eq!(fs::read_to_string(&output).unwrap(), "the profile");
    }

    #[test]
    fn a_file_hard_linked_at_a_streamed_output_is_replaced_not_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("precious");
        fs::write(&precious, "the victim's data").unwrap();
        let log = dir.path().join("run.alloc");
        fs::hard_link(&precious, &log).unwrap();
        create_for_streaming(&log).unwrap();
        assert_eq!(fs::read_to_string(&precious).unwrap(), "the victim's data");
        assert_eq!(fs::read(&log).unwrap(), b"");
    }

    #[test]
    fn a_link_another_user_owns_is_not_followed() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // Only root can give a link to another user; as anyone else the rule is exercised
            // by the links this user owns, which the other tests follow.
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("precious");
        fs::write(&precious, "the victim's data").unwrap();
        let output = dir.path().join("profile.json");
        std::os::unix::fs::symlink(&precious, &output).unwrap();
        let name = CString::new(output.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; lchown changes the link, not its target.
        assert_eq!(unsafe { libc::lchown(name.as_ptr(), 65534, 65534) }, 0);
        let error = write_file(&output, b"the profile").unwrap_err();
        assert!(
            error.to_string().contains("owned by another user"),
            "{error}"
        );
        assert!(create_for_streaming(&output).is_err());
        assert_eq!(fs::read_to_string(&precious).unwrap(), "the victim's data");
    }

    #[test]
    fn a_fifo_with_a_silent_writer_is_refused_for_reading() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("profile.json");
        mkfifo(&fifo);
        // A writer that opens the FIFO and never writes.
        let _writer = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        let read = within_a_minute(move || read_bounded(&fifo, 4096).map(|_| ()));
        match read {
            Err(ReadError::Io(error)) => assert!(error.to_string().contains("FIFO"), "{error}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn new_files_in_a_shared_directory_take_fresh_names() {
        let dir = tempfile::tempdir().unwrap();
        let first = write_new_file_in(dir.path(), "copy-", ".json", b"one").unwrap();
        let second = write_new_file_in(dir.path(), "copy-", ".json", b"two").unwrap();
        assert_ne!(first, second);
        assert_eq!(fs::read_to_string(first).unwrap(), "one");
        assert_eq!(fs::read_to_string(second).unwrap(), "two");
    }

    #[test]
    fn dev_stdout_style_links_are_recognised() {
        assert!(leads_to_open_file(Path::new("/dev/stdout")));
        assert!(!leads_to_open_file(Path::new("/dev/null")));
    }
}
