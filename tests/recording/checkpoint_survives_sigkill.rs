//! Checkpoints: a session rewrites its profile every interval while it records, so a process
//! killed with SIGKILL leaves its last checkpoint as a valid profile marked `meta.partial`; the
//! final profile replaces the checkpoints; `HIGHWATER_CHECKPOINT=0` writes none.
//!
//! Each case runs this test binary as a child (`HW_CHILD`) that holds a known block live and
//! allocates in spans until it is killed or told to stop. Every wait has a timeout.

use std::hint::black_box;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use highwater::profile::Warning;
use highwater::{Profile, Session, Step};
use highwater_testkit::child::is_child;

/// A block the child keeps live from start to end, so every checkpoint must show it.
const HELD: usize = 8 << 20;

/// Allocates in spans while holding [`HELD`] bytes; stops when `stop` appears (or, as a
/// watchdog for a parent that died, well after any wait of the parent's), then finishes the
/// session.
fn allocate(session: Session, stop: &Path) {
    let held = {
        let _span = highwater::profile!("hold", Step::Forward);
        black_box(vec![7u8; HELD])
    };
    let deadline = Instant::now() + 5 * highwater_testkit::child::WATCHDOG;
    let mut round = 0usize;
    while !stop.exists() && Instant::now() < deadline {
        let _span = highwater::profile!("train_step", Step::Backward);
        black_box(vec![1u8; 4096 + round % 4096]);
        round += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(held);
    session.finish().unwrap();
}

fn start_child(name: &str, dir: &Path, env: &[(&str, &str)]) -> Child {
    let mut command = highwater_testkit::child::command(name);
    command
        .env("HW_DIR", dir)
        .env("HIGHWATER_OUT", dir.join("p.json"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    command.spawn().expect("spawn the child")
}

/// The profile at `path` once `accept` holds for it.
fn wait_for_profile(path: &Path, child: &mut Child, accept: impl Fn(&Profile) -> bool) -> Profile {
    let started = Instant::now();
    loop {
        // Written atomically: whenever the file is there, it loads.
        if path.exists() {
            let profile = Profile::load(path).expect("a checkpoint always loads");
            if accept(&profile) {
                return profile;
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child ended early: {status:?}");
        }
        if started.elapsed() > highwater_testkit::child::WATCHDOG {
            let _ = child.kill();
            panic!("watchdog: no such profile at {}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn child_dir() -> std::path::PathBuf {
    std::env::var_os("HW_DIR").unwrap().into()
}

#[test]
fn sigkill_leaves_the_last_checkpoint() {
    let name = "sigkill_leaves_the_last_checkpoint";
    if is_child(name) {
        let session = Session::builder()
            .checkpoint_every(Duration::from_millis(100))
            .start()
            .unwrap();
        allocate(session, &child_dir().join("stop"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.json");
    let mut child = start_child(name, dir.path(), &[]);
    let first = wait_for_profile(&path, &mut child, |p| {
        p.summary.final_live_bytes >= HELD as u64
    });
    // Checkpoints keep coming, each newer than the last.
    let first_time = first
        .meta
        .checkpoint_unix_ms
        .expect("a checkpoint has its time");
    let later = wait_for_profile(&path, &mut child, |p| {
        p.meta.checkpoint_unix_ms > Some(first_time)
            && p.summary.alloc_count > first.summary.alloc_count
    });
    assert!(later.summary.duration_ns > first.summary.duration_ns);

    child.kill().unwrap(); // SIGKILL: no handler, no exit hook, nothing runs.
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));

    let left = Profile::load(&path).expect("the last checkpoint loads");
    assert!(left.meta.partial, "a checkpoint says it is partial");
    assert!(left
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::Partial { .. })));
    assert_eq!(
        left.meta.pid,
        child.id(),
        "it names the process that wrote it"
    );
    assert!(left.meta.checkpoint_unix_ms >= later.meta.checkpoint_unix_ms);
    assert!(left.summary.peak_bytes >= HELD as u64);
    assert!(
        left.summary.final_live_bytes >= HELD as u64,
        "the held block is live"
    );
    for span in ["hold", "train_step"] {
        assert!(
            left.spans.iter().any(|s| s.name == span && s.calls > 0),
            "span {span} missing"
        );
    }
}

#[test]
fn the_final_profile_replaces_the_checkpoints() {
    let name = "the_final_profile_replaces_the_checkpoints";
    if is_child(name) {
        // The environment has the last word over the builder's hour.
        let session = Session::builder()
            .checkpoint_every(Duration::from_secs(3600))
            .start()
            .unwrap();
        allocate(session, &child_dir().join("stop"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.json");
    let mut child = start_child(name, dir.path(), &[("HIGHWATER_CHECKPOINT", "0.1")]);
    let checkpoint = wait_for_profile(&path, &mut child, |p| p.meta.partial);
    std::fs::write(dir.path().join("stop"), "").unwrap();
    assert!(child.wait().unwrap().success());
    let last = Profile::load(&path).unwrap();
    assert!(!last.meta.partial, "the final profile is not partial");
    assert!(!last
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::Partial { .. })));
    assert_eq!(last.meta.checkpoint_unix_ms, None);
    assert_eq!(last.meta.pid, checkpoint.meta.pid);
    assert!(last.summary.alloc_count >= checkpoint.summary.alloc_count);
    assert!(
        last.summary.final_live_bytes < HELD as u64,
        "the held block was freed"
    );
}

#[test]
fn highwater_checkpoint_0_writes_none() {
    let name = "highwater_checkpoint_0_writes_none";
    if is_child(name) {
        let session = Session::builder()
            .checkpoint_every(Duration::from_millis(50))
            .start()
            .unwrap();
        let dir = child_dir();
        // Record for a few intervals; then the parent checks nothing was written.
        std::thread::sleep(Duration::from_millis(400));
        std::fs::write(dir.join("recorded"), "").unwrap();
        allocate(session, &dir.join("stop"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.json");
    let mut child = start_child(name, dir.path(), &[("HIGHWATER_CHECKPOINT", "0")]);
    let started = Instant::now();
    while !dir.path().join("recorded").exists() {
        assert!(
            started.elapsed() < highwater_testkit::child::WATCHDOG,
            "watchdog"
        );
        assert!(child.try_wait().unwrap().is_none(), "the child ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !path.exists(),
        "a checkpoint was written with HIGHWATER_CHECKPOINT=0"
    );
    std::fs::write(dir.path().join("stop"), "").unwrap();
    assert!(child.wait().unwrap().success());
    assert!(!Profile::load(&path).unwrap().meta.partial);
}
