//! The command's files are what a user expects of a Unix tool: `-o /dev/null` and
//! `-o /dev/stdout` work (the device is written, never replaced), and inputs that never end
//! (`/dev/zero`) or never start (a FIFO nobody writes, also when a profile's `meta.alloc_log`
//! names one) are refused with exit code 2 instead of eating memory or hanging.

// Tests drive the operating system directly; the library goes through its `sys` module.
#![allow(clippy::disallowed_methods)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// Runs `highwater args`, killing it (and failing) after 60 s.
fn highwater(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run highwater");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("highwater {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn mkfifo(path: &Path) {
    let name = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
}

#[test]
fn exports_to_dev_null_and_dev_stdout_write_through() {
    let profile = data("minimal.json");
    let profile = profile.to_str().unwrap();
    for format in ["html", "chrome"] {
        let output = highwater(&["export", profile, "-f", format, "-o", "/dev/null"]);
        assert!(output.status.success(), "{format}: {output:?}");
        let null = std::fs::metadata("/dev/null").unwrap();
        assert!(null.file_type().is_char_device(), "/dev/null was replaced");
    }
    let output = highwater(&["export", profile, "-f", "chrome", "-o", "/dev/stdout"]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("traceEvents"),
        "the trace went to stdout: {stdout}"
    );
}

#[test]
fn endless_and_empty_special_inputs_are_refused_not_read_forever() {
    let output = highwater(&["summary", "/dev/zero"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/dev/zero") && stderr.contains("limit"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.json");
    mkfifo(&fifo);
    let output = highwater(&["summary", fifo.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("fifo.json"), "{stderr}");

    // A profile whose allocation log is a FIFO nobody writes.
    let log = dir.path().join("run.alloc");
    mkfifo(&log);
    let text = std::fs::read_to_string(data("minimal.json")).unwrap();
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["meta"]["alloc_log"] = serde_json::Value::String(log.to_str().unwrap().into());
    let with_log = dir.path().join("with-log.json");
    std::fs::write(&with_log, value.to_string()).unwrap();
    let output = highwater(&["simulate", with_log.to_str().unwrap(), "--device", "tpu-v4"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("run.alloc"), "{stderr}");
}

#[test]
fn a_fifo_whose_writer_never_writes_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("f.json");
    mkfifo(&fifo);
    // A writer that opens the FIFO and never writes.
    let _writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let output = highwater(&["summary", fifo.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("f.json") && stderr.contains("FIFO"),
        "{stderr}"
    );
}

#[test]
fn links_planted_at_an_export_s_temporary_names_are_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let precious = dir.path().join("precious");
    std::fs::write(&precious, "the victim's data").unwrap();
    let out = dir.path().join("trace.json");
    // The command's pid is not known before it starts: plant links at every name the old
    // scheme (`.<name>.<pid>.tmp`) could use for the next pids.
    let base = std::process::id();
    for pid in base..base + 2000 {
        std::os::unix::fs::symlink(&precious, dir.path().join(format!(".trace.json.{pid}.tmp")))
            .unwrap();
    }
    let profile = data("minimal.json");
    let output = highwater(&[
        "export",
        profile.to_str().unwrap(),
        "-f",
        "chrome",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        std::fs::read_to_string(&precious).unwrap(),
        "the victim's data"
    );
    assert!(std::fs::symlink_metadata(&out).unwrap().is_file());
}
