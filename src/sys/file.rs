//! The file calls std has no word for: a record lock that dies with its process, and whether
//! this process may write a path.

#![allow(clippy::disallowed_methods)]

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
