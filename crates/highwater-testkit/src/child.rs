//! Running a test in a child process of its own test binary, with a watchdog.
//!
//! [`isolated`] re-runs the calling test in a child process (`HW_CHILD` names it), so every test
//! has its own session, counters and allocator, and waits for it with a timeout: a deadlock
//! kills the child and fails the test with a clear message instead of hanging CI. Tests of one
//! binary may sit in modules: the child is asked for the test by its full path, which the test
//! harness gives the thread that runs it.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The test named `HW_CHILD`, when this process is a child started by [`isolated`].
pub fn is_child(name: &str) -> bool {
    std::env::var("HW_CHILD").as_deref() == Ok(name)
}

/// The full path of test `name` as the test harness knows it, which `--exact` selects: the name
/// of the thread running it (the harness names each test's thread by its path) when that ends
/// with `name`, as in a module of a test binary; else `name` itself.
pub fn test_path(name: &str) -> String {
    match std::thread::current().name() {
        Some(path) if path == name || path.ends_with(&format!("::{name}")) => path.to_string(),
        _ => name.to_string(),
    }
}

/// How a child process ended.
#[derive(Debug)]
pub struct ChildOutput {
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
    /// How long it ran.
    pub elapsed: Duration,
}

/// A command that runs test `name` of this binary alone, as a child (`HW_CHILD=name`), its
/// output shown.
pub fn command(name: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("test binary path"));
    command
        // `--include-ignored`: an ignored test the parent was asked to run runs in the child.
        .args([
            "--exact",
            &test_path(name),
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env("HW_CHILD", name);
    command
}

/// Runs test `name` of this binary in a child process with `HW_CHILD=name` and `env`, and waits
/// at most `limit`. On timeout the child is killed and the test fails with what it printed.
pub fn run_child(name: &str, env: &[(&str, &str)], limit: Duration) -> ChildOutput {
    let mut command = command(name);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let started = Instant::now();
    let mut child = command.spawn().expect("spawn the test binary as a child");
    let mut pipe_out = child.stdout.take().expect("child stdout");
    let mut pipe_err = child.stderr.take().expect("child stderr");
    let stdout = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = pipe_out.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    });
    let stderr = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = pipe_err.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let stdout = stdout.join().unwrap_or_default();
            let stderr = stderr.join().unwrap_or_default();
            panic!(
                "watchdog: {name} did not finish within {limit:?} (deadlock or hang); the child \
                 was killed.\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    ChildOutput {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
        elapsed: started.elapsed(),
    }
}

/// Generous limit for one stress test on a slow, shared 2-core machine in a debug build.
pub const WATCHDOG: Duration = Duration::from_secs(120);

/// Runs `body` as test `name` in its own child process under the [`WATCHDOG`]: in the child,
/// runs it; in the parent, waits for the child and fails with its output unless it passed.
pub fn isolated(name: &str, body: impl FnOnce()) {
    if is_child(name) {
        body();
        println!("child-ok {name}");
        return;
    }
    let output = run_child(name, &[], WATCHDOG);
    assert!(
        output.status.success() && output.stdout.contains(&format!("child-ok {name}")),
        "{name} failed in its child process ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        output.stdout,
        output.stderr
    );
    // What the child wants the parent's log to show: skipped checks and measured figures.
    for line in output.stderr.lines().filter(|l| l.starts_with("SKIPPED")) {
        eprintln!("{name}: {line}");
    }
    for line in output
        .stdout
        .lines()
        .filter_map(|l| l.split("FIGURES ").nth(1))
    {
        eprintln!("{name}: {line}");
    }
    eprintln!("{name}: {:.2?}", output.elapsed);
}
