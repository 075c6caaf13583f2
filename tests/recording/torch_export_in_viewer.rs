//! The torch export read the way PyTorch's memory viewer reads it: a real session with an
//! allocation log, exported with a window far shorter than the run, loaded by Python's `pickle`
//! and replayed as the viewer replays it (`tests/support/torch_snapshot_check.py`). The peak the
//! viewer would draw must be the device's real peak, whatever the window, and every category
//! must come across.
//!
//! Needs `python3` (CI machines have it); set `HIGHWATER_SKIP_PYTHON_TESTS=1` to skip on purpose.
//!
//! When PyTorch's viewer is at hand, the export is also rendered by the viewer's own code in
//! headless Chromium: set `HIGHWATER_TORCH_VIEWER_DIR` to a directory holding
//! `MemoryViz.js` (from PyTorch's `torch/utils/viz/`) and `d3.min.js` (d3 version 5, which the
//! viewer imports from a CDN). Neither file is part of this repository; without them that test
//! says so and passes.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use highwater::ops::{self, Tensor};
use highwater::profile::alloc_log::AllocLog;
use highwater::{Category, Profile, Session};
use highwater_export::torch;

use highwater_testkit::child::isolated;

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
    isolated(
        "the_viewer_shows_the_real_peak_of_every_device_whatever_the_window",
        || {
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
        },
    );
}

/// Standard base64 with padding, for the viewer's `add_local_files`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let word = chunk
            .iter()
            .enumerate()
            .fold(0u32, |w, (i, &b)| w | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(word >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The viewer's module made loadable from one file: its CDN imports become the d3 global, and
/// the functions the test calls are exported beside its own `add_local_files`.
fn viewer_module(source: &str) -> String {
    let body: String = source
        .lines()
        .filter(|line| !line.starts_with("import "))
        .map(|line| format!("{line}\n"))
        .collect();
    format!(
        "const d3 = window.d3;\nconst {{axisLeft, scaleLinear, zoom, zoomIdentity, brushX}} = window.d3;\n\
         {body}\nwindow.hwViewer = {{unpickle, annotate_snapshot, process_alloc_data, decode_base64, add_local_files}};\n"
    )
}

#[test]
fn pytorchs_own_viewer_renders_the_export_and_draws_the_real_peak() {
    isolated(
        "pytorchs_own_viewer_renders_the_export_and_draws_the_real_peak",
        || {
            let Some(dir) = std::env::var_os("HIGHWATER_TORCH_VIEWER_DIR") else {
                eprintln!(
                    "skipping the render in PyTorch's viewer: set HIGHWATER_TORCH_VIEWER_DIR to a \
             directory with PyTorch's MemoryViz.js and d3 v5's d3.min.js"
                );
                return;
            };
            let Some(chromium) = highwater_testkit::browser::browser() else {
                return;
            };
            let viewer = Path::new(&dir);
            let source =
                std::fs::read_to_string(viewer.join("MemoryViz.js")).expect("MemoryViz.js");
            let d3 = std::fs::read_to_string(viewer.join("d3.min.js")).expect("d3.min.js");
            let work = tempfile::tempdir().unwrap();
            let (profile, log) = record(work.path());
            for window in [100, usize::MAX] {
                let pickle = torch::render(&log, window);
                // The page the viewer builds for a dropped file, plus a report of what it computed:
                // each device's highest total, as its timeline draws it.
                let page = format!(
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body>\
             <pre id=\"hw-result\">not run</pre><script>{d3}</script>\
             <script type=\"module\">{module}\n\
             const out = document.getElementById('hw-result');\n\
             try {{\n\
               const b64 = '{b64}';\n\
               window.hwViewer.add_local_files([{{name: 'run.pickle', base64: b64}}], 'Active Memory Timeline');\n\
               const snapshot = window.hwViewer.unpickle(window.hwViewer.decode_base64(b64));\n\
               window.hwViewer.annotate_snapshot(snapshot);\n\
               const peaks = snapshot.device_traces.map((_, d) =>\n\
                 window.hwViewer.process_alloc_data(snapshot, d, false, 15000).max_size);\n\
               out.textContent = JSON.stringify({{peaks, categories: snapshot.categories,\n\
                 polygons: document.querySelectorAll('polygon').length}});\n\
             }} catch (e) {{ out.textContent = 'error: ' + e; }}\n\
             </script></body></html>",
            module = viewer_module(&source),
            b64 = base64(&pickle),
        );
                let path = work.path().join(format!("viewer-{window}.html"));
                std::fs::write(&path, page).unwrap();
                let dom = highwater_testkit::browser::run_browser(
                    &chromium,
                    &work.path().join("chromium-profile"),
                    &path,
                    &["--dump-dom", "--window-size=1400,900"],
                );
                let result = dom
                    .split("<pre id=\"hw-result\">")
                    .nth(1)
                    .and_then(|rest| rest.split("</pre>").next())
                    .expect("the result element")
                    .replace("&quot;", "\"");
                assert!(!result.starts_with("error"), "the viewer threw: {result}");
                let result: serde_json::Value = serde_json::from_str(&result)
                    .unwrap_or_else(|_| panic!("the viewer did not finish: {result}"));
                for stats in &profile.devices {
                    let index = usize::from(log.device(&stats.device).unwrap());
                    assert_eq!(
                        result["peaks"][index].as_u64(),
                        Some(stats.peak_bytes),
                        "window {window}: the viewer's peak on {}",
                        stats.device
                    );
                }
                let categories = result["categories"].to_string();
                for want in ["activation", "gradient", "unknown"] {
                    assert!(categories.contains(want), "{want} not in {categories}");
                }
                assert!(
                    result["polygons"].as_u64().unwrap() > 10,
                    "nothing drawn: {result}"
                );
                if let Some(keep) = std::env::var_os("HIGHWATER_SCREENSHOT_DIR") {
                    let shot = Path::new(&keep).join(format!("torch-viewer-{window}.png"));
                    highwater_testkit::browser::run_browser(
                        &chromium,
                        &work.path().join("chromium-profile"),
                        &path,
                        &[
                            &format!("--screenshot={}", shot.display()),
                            "--window-size=1400,900",
                        ],
                    );
                }
            }
        },
    );
}
