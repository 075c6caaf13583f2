//! The torch export read the way PyTorch's memory viewer reads it: a real session with an
//! allocation log, exported with a window far shorter than the run, loaded by Python's `pickle`
//! and replayed as the viewer replays it (`tests/support/torch_snapshot_check.py`). The peak the
//! viewer would draw must be the device's real peak, whatever the window, and every category
//! must come across.
//!
//! Needs `python3` (CI machines have it); set `HIGHWATER_SKIP_PYTHON_TESTS=1` to skip on purpose.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use highwater::alloc_log::AllocLog;
use highwater::export::torch;
use highwater::ops::{self, Tensor};
use highwater::{Alloc, Category, Profile, Session};

#[global_allocator]
static ALLOC: Alloc = Alloc::system();

const MIB: u64 = 1 << 20;
const STEPS: u64 = 40;

fn tensor(id: u64, bytes: u64) -> Tensor<'static> {
    Tensor {
        id,
        shape: &[1],
        dtype: "f32",
        device: "cuda:0",
        bytes,
    }
}

/// Parameters (marked after they were allocated, as `mark_parameters` does), optimizer state,
/// then steps of activations and gradients that each keep one activation: a leak, so the peak
/// is in the last step and everything before the window stays live.
fn record(dir: &Path) -> (Profile, AllocLog) {
    let session = Session::builder()
        .output(dir.join("run.json"))
        .alloc_log(dir.join("run.alloc"))
        .start()
        .unwrap();
    let mut next_id = 1u64;
    let mut id = || {
        next_id += 1;
        next_id
    };
    for _ in 0..8 {
        let param = id();
        ops::tensor_alloc(&tensor(param, 4 * MIB), None);
        ops::set_category("cuda:0", param, Category::Parameter);
    }
    for _ in 0..4 {
        ops::tensor_alloc(&tensor(id(), 4 * MIB), Some(Category::Optimizer));
    }
    let mut heap_keep = Vec::new();
    for _ in 0..STEPS {
        let activations: Vec<u64> = (0..16).map(|_| id()).collect();
        for &a in &activations {
            ops::tensor_alloc(&tensor(a, MIB), Some(Category::Activation));
        }
        let gradients: Vec<u64> = (0..8).map(|_| id()).collect();
        for &g in &gradients {
            ops::tensor_alloc(&tensor(g, 2 * MIB), Some(Category::Gradient));
        }
        for &a in &activations[1..] {
            ops::tensor_free("cuda:0", a, MIB);
        }
        for &g in &gradients {
            ops::tensor_free("cuda:0", g, 2 * MIB);
        }
        heap_keep.push(vec![0u8; 64 * 1024]);
    }
    drop(heap_keep);
    let profile = session.finish().unwrap();
    let log = AllocLog::read(dir.join("run.alloc")).unwrap();
    (profile, log)
}

/// What the checker printed, by device name.
fn viewer_replay(snapshot: &Path) -> Option<BTreeMap<String, serde_json::Value>> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/torch_snapshot_check.py"
    );
    let output = match Command::new("python3").arg(script).arg(snapshot).output() {
        Ok(output) => output,
        Err(_) if std::env::var("HIGHWATER_SKIP_PYTHON_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping: HIGHWATER_SKIP_PYTHON_TESTS=1 and python3 does not run");
            return None;
        }
        Err(error) => panic!(
            "python3 is needed to check the torch export with Python's pickle ({error}); \
             install it or set HIGHWATER_SKIP_PYTHON_TESTS=1 to skip on purpose"
        ),
    };
    assert!(
        output.status.success(),
        "the viewer's invariants do not hold: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut devices = BTreeMap::new();
    for line in String::from_utf8(output.stdout).unwrap().lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        if let Some(name) = value["device"].as_str() {
            devices.insert(name.to_string(), value);
        }
    }
    Some(devices)
}

#[test]
fn the_viewer_shows_the_real_peak_of_every_device_whatever_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let (profile, log) = record(dir.path());
    let cuda = log.device("cuda:0").expect("the log names cuda:0");
    let cuda_records = log.records.iter().filter(|r| r.device == cuda).count();
    assert!(cuda_records > 1000, "{cuda_records} records");
    for window in [100, 1000, usize::MAX] {
        let path = dir.path().join(format!("run-{window}.pickle"));
        torch::write(&log, window, &path).unwrap();
        let Some(devices) = viewer_replay(&path) else {
            return;
        };
        for stats in &profile.devices {
            let replayed = &devices[&stats.device];
            assert_eq!(
                replayed["peak"].as_u64(),
                Some(stats.peak_bytes),
                "window {window}, {}: the viewer's peak is not the device's",
                stats.device
            );
        }
        let cuda = &devices["cuda:0"];
        if window == usize::MAX {
            assert_eq!(cuda["start"], 0, "an unwindowed trace starts empty");
            let categories: Vec<&str> = cuda["categories"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|c| c.as_str())
                .collect();
            for want in ["parameter", "optimizer", "activation", "gradient"] {
                assert!(categories.contains(&want), "{want} not in {categories:?}");
            }
        } else {
            // Parameters, optimizer state and the leak so far were live before the window.
            assert!(cuda["start"].as_u64().unwrap() >= 48 * MIB, "{cuda}");
            assert!(cuda["events"].as_u64().unwrap() <= 5 * window as u64 + 1);
        }
    }
    assert_eq!(
        profile.summary.peak_bytes,
        profile
            .devices
            .iter()
            .find(|d| d.device == profile.summary.peak_device)
            .unwrap()
            .peak_bytes
    );
}
