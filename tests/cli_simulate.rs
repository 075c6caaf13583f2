//! `highwater simulate` replays a recorded allocation log through a device pool: a pattern that
//! fits on a 24 GB L4 runs out of memory on a 16 GiB TPU v5e through fragmentation (the free
//! bytes would cover the request, no block does), at the time the log says.

use std::path::Path;
use std::process::Command;

use highwater::ops::{self, Tensor};
use highwater::{Alloc, Session};

#[global_allocator]
static ALLOC: Alloc = Alloc::system();

const GIB: u64 = 1 << 30;

fn tensor(id: u64, gib: u64) -> Tensor<'static> {
    Tensor {
        id,
        shape: &[1],
        dtype: "f32",
        device: "cuda:0",
        bytes: gib * GIB,
    }
}

/// One session at a time per process: the tests take turns recording.
static RECORDING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Records 6 + 6 + 4 GiB, frees the first and the last, then asks for 8 GiB.
fn record(dir: &Path) -> std::path::PathBuf {
    let _turn = RECORDING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let profile = dir.join("run.json");
    let session = Session::builder()
        .output(&profile)
        .alloc_log(dir.join("run.alloc"))
        .start()
        .unwrap();
    for (id, gib) in [(1, 6), (2, 6), (3, 4)] {
        ops::tensor_alloc(&tensor(id, gib), None);
    }
    ops::tensor_free("cuda:0", 1, 6 * GIB);
    ops::tensor_free("cuda:0", 3, 4 * GIB);
    ops::tensor_alloc(&tensor(4, 8), None);
    session.finish().unwrap();
    profile
}

fn highwater(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn simulate_reports_fit_and_fragmentation_failures() {
    let dir = tempfile::tempdir().unwrap();
    let profile = record(dir.path());
    let profile = profile.to_str().unwrap();

    let fits = highwater(&["simulate", profile, "--device", "l4", "--stream", "cuda:0"]);
    assert!(fits.status.success(), "{fits:?}");
    let text = String::from_utf8_lossy(&fits.stdout);
    assert!(text.contains("best-fit: fits"), "{text}");

    let tight = highwater(&["simulate", profile, "--device", "tpu-v5e", "--json"]);
    assert!(tight.status.success(), "{tight:?}");
    let report: serde_json::Value = serde_json::from_slice(&tight.stdout).unwrap();
    assert_eq!(
        report["stream"], "cuda:0",
        "the peak device is the default stream"
    );
    assert_eq!(report["capacity_bytes"], 16 * GIB);
    assert_eq!(report["report"]["fits"], false);
    let failure = &report["report"]["first_failure"];
    assert_eq!(failure["request_bytes"], 8 * GIB);
    assert_eq!(failure["free_bytes"], 10 * GIB);
    assert_eq!(failure["cause"], "fragmentation");
    assert_eq!(report["strategies"].as_array().unwrap().len(), 6);

    let text = highwater(&["simulate", profile, "--device", "tpu-v5e"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("OUT OF MEMORY") && text.contains("fragmentation"),
        "{text}"
    );
    assert!(
        text.contains("adaptive") && text.contains("buddy"),
        "{text}"
    );
}

#[test]
fn simulate_rejects_what_it_cannot_replay() {
    let dir = tempfile::tempdir().unwrap();
    let profile = record(dir.path());
    let profile = profile.to_str().unwrap();
    let bare = dir.path().join("bare.json");
    highwater::Profile::empty().write(&bare).unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["simulate", bare.to_str().unwrap(), "--device", "l4"],
            "no allocation log",
        ),
        (
            &["simulate", profile, "--device", "l4", "--stream", "tpu:9"],
            "no device \"tpu:9\"",
        ),
        (&["simulate", profile, "--device", "tpu-v9"], "tpu-v9"),
        (
            &["simulate", profile, "--device", "l4", "--limit", "lots"],
            "lots",
        ),
    ];
    for (args, want) in cases {
        let output = highwater(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
