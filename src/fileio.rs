//! The one writer and the one reader behind every file highwater writes or reads: profiles,
//! HTML reports, Chrome traces, PyTorch snapshots, allocation logs.
//!
//! # Writing
//!
//! A regular file (or a path that does not exist yet) is replaced atomically: a temporary
//! sibling is written, synced and renamed over it, so readers never see half a file and a
//! failed write leaves the old one. Anything else is written *through*, never replaced:
//!
//! - a device (`/dev/null`), a FIFO or a socket is opened and written (a FIFO with no reader is
//!   an error at once, not a hang);
//! - a symlink is followed: its target is written (atomically when it is a regular file), and
//!   the link stays;
//! - a path that leads through `/proc/*/fd` or `/dev/fd` (`/dev/stdout`) names an open file of
//!   this process: it is appended to, as a shell's `>` redirect would be.
//!
//! # Reading
//!
//! Every read is bounded by the bytes actually read, not by what `metadata` claims (a FIFO or
//! `/dev/zero` has no length). Opening never blocks on a FIFO without a writer: it reads as
//! empty.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Writes `contents` to `path` as the [module docs](self) say.
pub(crate) fn write_file(path: &Path, contents: &[u8]) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            if leads_to_open_file(path) {
                return write_through(path, contents, true);
            }
            match fs::canonicalize(path) {
                Ok(target) => match fs::metadata(&target) {
                    Ok(meta) if meta.is_file() => replace_atomically(&target, contents),
                    Ok(meta) if meta.is_dir() => Err(io::Error::new(
                        io::ErrorKind::IsADirectory,
                        format!("the link leads to the directory {}", target.display()),
                    )),
                    _ => write_through(&target, contents, false),
                },
                // A dangling link: create its target through it.
                Err(_) => write_through(path, contents, false),
            }
        }
        Ok(meta) if meta.is_file() || meta.is_dir() => replace_atomically(path, contents),
        Ok(_) => write_through(path, contents, false),
        Err(_) => replace_atomically(path, contents),
    }
}

/// Whether following the links from `path` passes through `/proc/<pid>/fd` or `/dev/fd`: the
/// path then names a file this process already has open (`/dev/stdout`).
fn leads_to_open_file(path: &Path) -> bool {
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

/// Opens `path` for writing without replacing it, and writes `contents`. Never blocks opening
/// a FIFO: with no reader that is an error naming the cause.
fn write_through(path: &Path, contents: &[u8], append: bool) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|error| {
            if error.raw_os_error() == Some(libc::ENXIO) {
                io::Error::new(error.kind(), "it is a FIFO that no process is reading")
            } else {
                error
            }
        })?;
    set_blocking(&file)?;
    file.write_all(contents)?;
    file.flush()
}

/// Opens `path` for a stream of writes (the allocation log): created or truncated when it is a
/// regular file, written through otherwise. Never blocks opening a FIFO: with no reader that
/// is an error naming the cause.
pub(crate) fn create_for_streaming(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|error| {
            if error.raw_os_error() == Some(libc::ENXIO) {
                io::Error::new(error.kind(), "it is a FIFO that no process is reading")
            } else {
                error
            }
        })?;
    set_blocking(&file)?;
    if file.metadata()?.is_file() {
        file.set_len(0)?;
    }
    Ok(file)
}

/// Writes `contents` to `path` through a temporary sibling and a rename. Missing parent
/// directories are created; on any failure the temporary file is removed and `path` keeps what
/// it held.
fn replace_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir)?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(path.file_name().unwrap_or("profile".as_ref()));
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = dir.join(temp_name);
    let result = (|| {
        let mut file = File::create(&temp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Why [`read_bounded`] returned no bytes.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// Opening or reading failed.
    Io(io::Error),
    /// More than the limit could be read; `read` bytes were (at least the limit plus one).
    TooLarge {
        /// Bytes read before stopping.
        read: u64,
    },
}

/// Opens `path` for reading without blocking on a FIFO that has no writer (it then reads as
/// empty); reads block as usual afterwards.
pub(crate) fn open_for_reading(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    set_blocking(&file)?;
    Ok(file)
}

/// Reads all of `path`, but never more than `limit` bytes.
pub(crate) fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
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
        // No writer: empty at once, no hang.
        assert_eq!(read_bounded(&fifo, 4096).unwrap(), Vec::<u8>::new());
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

    #[test]
    fn dev_stdout_style_links_are_recognised() {
        assert!(leads_to_open_file(Path::new("/dev/stdout")));
        assert!(!leads_to_open_file(Path::new("/dev/null")));
    }
}
