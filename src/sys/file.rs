//! The file calls std has no word for: a record lock that dies with its process, whether this
//! process may write a path, and a read that allocates nothing (for the allocator hook).

#![allow(clippy::disallowed_methods)]

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Takes a write lock on all of `file` without waiting: `Ok(false)` when another process holds
/// a lock on it. The lock is the process's (a POSIX record lock): the kernel drops it when the
/// process ends, however it ends, or when it closes any descriptor of the file.
pub(crate) fn lock_whole(file: &File) -> io::Result<bool> {
    // SAFETY: an all-zero `flock` is a valid value of the plain C struct; the fields that
    // matter are set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = 0;
    // To the end, however long the file grows.
    lock.l_len = 0;
    // SAFETY: the descriptor is open for the call's duration and `lock` is a valid `flock`.
    let result = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
    if result == 0 {
        return Ok(true);
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EACCES | libc::EAGAIN) => Ok(false),
        _ => Err(error),
    }
}

/// Whether this process may write `path` (a directory: create files in it), as
/// `access(W_OK)` says (which also says "no" on a read-only file system).
pub(crate) fn writable(path: &Path) -> bool {
    let Ok(name) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `name` is a valid NUL-terminated string.
    unsafe { libc::access(name.as_ptr(), libc::W_OK) == 0 }
}

/// Reads the file at `path` through `buffer`, with raw system calls and no allocation, handing
/// each chunk read to `chunk` until it returns `Some`: that value, or `None` at the end of the
/// file or on an error.
pub(crate) fn scan<T>(
    path: &CStr,
    buffer: &mut [u8],
    mut chunk: impl FnMut(&[u8]) -> Option<T>,
) -> Option<T> {
    // SAFETY: a NUL-terminated path; `open` allocates nothing and the descriptor is closed
    // below on every path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let found = loop {
        // SAFETY: `buffer` is writable for its length; `fd` is open.
        let read = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
        if read <= 0 {
            break None;
        }
        if let Some(found) = chunk(&buffer[..read as usize]) {
            break Some(found);
        }
    };
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_sees_the_whole_file_in_chunks_and_stops_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4];
        let none: Option<()> = scan(&name, &mut buffer, |chunk| {
            seen.extend_from_slice(chunk);
            None
        });
        assert_eq!((none, seen.as_slice()), (None, &b"0123456789"[..]));
        assert_eq!(scan(&name, &mut buffer, |chunk| Some(chunk[0])), Some(b'0'));
        assert_eq!(scan(c"/no/such/file", &mut buffer, |_| Some(())), None);
    }
}
