//! Headless Chromium for the tests that look at a page as a person would: find the browser,
//! run it on a file, read what it printed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The browser to drive, or `None` when browser tests are explicitly skipped.
pub fn browser() -> Option<String> {
    let mut candidates: Vec<String> = Vec::new();
    if let Ok(path) = std::env::var("HIGHWATER_CHROMIUM") {
        candidates.push(path);
    }
    candidates.extend(
        [
            "chromium",
            "chromium-browser",
            "google-chrome",
            "google-chrome-stable",
        ]
        .map(String::from),
    );
    for candidate in candidates {
        let works = Command::new(&candidate)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if works {
            return Some(candidate);
        }
    }
    if std::env::var("HIGHWATER_SKIP_BROWSER_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping browser test: HIGHWATER_SKIP_BROWSER_TESTS=1 and no Chromium found");
        return None;
    }
    panic!(
        "headless Chromium is needed to test the HTML report and none was found: install it \
         (`apt-get install -y chromium`; .ci/run does this) or set HIGHWATER_CHROMIUM to its \
         path; set HIGHWATER_SKIP_BROWSER_TESTS=1 to skip on purpose"
    );
}

/// Runs the browser headless on `page` with `extra` arguments; returns stdout.
pub fn run_browser(browser: &str, profile_dir: &Path, page: &Path, extra: &[&str]) -> String {
    let url = format!("file://{}", page.display());
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.display()))
        .args(extra)
        .arg(&url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the browser");
    // Read stdout on a thread so a large DOM cannot fill the pipe while we wait.
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).map(|_| text)
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "browser exited with {status}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("browser did not finish within 90 s on {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap().expect("browser output is UTF-8")
}
