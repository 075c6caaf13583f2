//! `highwater watch` as a person uses it: under tmux, beside a child process that rewrites its
//! profile (checkpoints, then the final profile or a SIGKILL), with the screen read through
//! `tmux capture-pane`.
//!
//! The child is this test binary run again on one of its ignored tests: `writer_child` writes
//! one hand-made checkpoint, says so with a marker file and waits for the parent's go-ahead
//! before the next, so each screen can be checked against the checkpoint it should show;
//! `training_child` records a real session (this binary's global allocator is highwater's)
//! that checkpoints every 200 ms while its live memory grows; `oom_child` records one whose
//! device pool refuses an admission and whose heap allocator refuses an allocation.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use highwater::device::{DeviceIndex, DeviceKind, PoolManager, Strategy};
use highwater::{Category, Profile, Session, Step};
use highwater_profile::model::OomSource;
use highwater_profile::units::{format_bytes, format_duration_ns};
use highwater_profile::OomEvent;
use highwater_testkit::sample::sample_profile;

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// A heap request no allocator can grant (an exbibyte, more than any address space) and that
/// Rust still passes to the allocator (it is below `isize::MAX`).
const HEAP_REFUSED: usize = 1 << 60;
/// Longest a screen or a marker is waited for (the view refreshes every 100 ms): a bound on a
/// wait that ends as soon as what it waits for happens, generous so a loaded machine passes.
const PATIENCE: Duration = Duration::from_secs(120);
/// Longest a child runs when nobody tells it to stop (a parent that died): past any wait of
/// the parent's, so a slow parent never finds its child gone.
const CHILD_LIMIT: Duration = Duration::from_secs(600);
const PROFILE_VAR: &str = "HIGHWATER_WATCH_TEST_PROFILE";
const CONTROL_VAR: &str = "HIGHWATER_WATCH_TEST_CONTROL";
/// Checkpoints the child writes before it waits to be told to finish (or is killed).
const CHECKPOINTS: u64 = 3;

/// The profile the child writes at `step`: figures that differ at every step.
fn profile_at(step: u64, partial: bool) -> Profile {
    let mut profile = sample_profile();
    profile.meta.pid = std::process::id();
    profile.meta.partial = partial;
    profile.meta.checkpoint_unix_ms = partial.then(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    });
    let live = step * 3 * MIB;
    let peak = step * 5 * MIB;
    profile.summary.final_live_bytes = live;
    profile.summary.final_by_category = [(Category::Activation, live)].into();
    profile.summary.peak_bytes = peak;
    profile.summary.peak_by_category = [
        (Category::Activation, peak - MIB),
        (Category::Parameter, MIB),
    ]
    .into();
    // Half the activations at this peak were the step's temporaries.
    profile.summary.peak_temporary_by_category = [(Category::Activation, (peak - MIB) / 2)].into();
    // What a loaded profile must satisfy: no device or single block above the peak.
    for device in &mut profile.devices {
        device.peak_bytes = peak;
        device.peak_by_category = profile.summary.peak_by_category.clone();
    }
    profile.largest_at_peak.retain(|live| live.bytes <= peak);
    profile.peak_window.retain(|point| point.live_bytes <= peak);
    profile.summary.duration_ns = step * 1_000_000_000;
    profile.iterations.truncate(step as usize);
    profile
}

fn wait_for_file(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < CHILD_LIMIT,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Not a test of its own: the process [`run`] starts as the run being watched.
#[test]
#[ignore = "the child process of the watch tests"]
fn writer_child() {
    let profile = PathBuf::from(std::env::var(PROFILE_VAR).expect("run by the watch tests"));
    let control = PathBuf::from(std::env::var(CONTROL_VAR).expect("run by the watch tests"));
    for step in 1..=CHECKPOINTS {
        profile_at(step, true).write(&profile).unwrap();
        std::fs::write(control.join(format!("written-{step}")), "").unwrap();
        wait_for_file(&control.join(format!("next-{step}")));
    }
    profile_at(CHECKPOINTS + 1, false).write(&profile).unwrap();
}

/// A child's control directory, and its session checkpointing every 200 ms to the profile the
/// parent watches.
fn recorded_child() -> (PathBuf, Session) {
    let profile = PathBuf::from(std::env::var(PROFILE_VAR).expect("run by the watch tests"));
    let control = PathBuf::from(std::env::var(CONTROL_VAR).expect("run by the watch tests"));
    let session = Session::builder()
        .output(&profile)
        .checkpoint_every(Duration::from_millis(200))
        // The parent reads the checkpoint as soon as the refused call returns.
        .oom_wait(CHILD_LIMIT)
        .start()
        .unwrap();
    (control, session)
}

/// Not a test of its own: a training run, recorded, that keeps 1 MiB more every step until the
/// parent creates `stop`.
#[test]
#[ignore = "the child process of the watch tests"]
fn training_child() {
    let (control, session) = recorded_child();
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let deadline = Instant::now() + CHILD_LIMIT;
    while !control.join("stop").exists() && Instant::now() < deadline {
        let _step = highwater::profile!("step", Step::Forward);
        kept.push(std::hint::black_box(vec![1u8; MIB as usize]));
        std::thread::sleep(Duration::from_millis(40));
    }
    drop(kept);
    session.finish().unwrap();
}

/// Not a test of its own: a recorded run whose TPU pool refuses a 40 GiB admission (one step),
/// then whose heap allocator refuses [`HEAP_REFUSED`] bytes (the next step), each once the
/// parent has checked the screen before it (markers `refuse`, `next`); it finishes when the
/// parent creates `stop`.
#[test]
#[ignore = "the child process of the watch tests"]
fn oom_child() {
    let (control, session) = recorded_child();
    let pools = PoolManager::builder()
        .kind(DeviceKind::TpuV4)
        .devices(1)
        .strategy(Strategy::BestFit)
        .build();
    let weights = {
        let _init = highwater::profile!("init", Category::Parameter);
        pools.reserve(&[(DeviceIndex(0), 4 * GIB)]).unwrap()
    };
    let host = std::hint::black_box(vec![1u8; 2 * MIB as usize]);
    wait_for_file(&control.join("refuse"));
    {
        let _step = highwater::profile!("train_step", Step::Forward);
        let refused = pools.reserve(&[(DeviceIndex(0), 40 * GIB)]);
        assert!(refused.is_err(), "{refused:?}");
    }
    std::fs::write(control.join("pool-refused"), "").unwrap();
    wait_for_file(&control.join("next"));
    {
        let _step = highwater::profile!("train_step", Step::Backward);
        let mut buffer: Vec<u8> = Vec::new();
        let refused = buffer.try_reserve_exact(HEAP_REFUSED);
        assert!(refused.is_err(), "1 EiB was granted");
    }
    std::fs::write(control.join("heap-refused"), "").unwrap();
    wait_for_file(&control.join("stop"));
    pools.release(weights).unwrap();
    drop(host);
    session.finish().unwrap();
}

/// A tmux server of the test's own (its own socket), running `highwater watch`, and the child
/// writing the profile; both are ended when dropped.
struct Run {
    socket: String,
    /// The writer, once the view is up.
    child: Option<Child>,
    control: PathBuf,
    profile: PathBuf,
    _dir: tempfile::TempDir,
}

impl Run {
    fn start(name: &str, child_test: &str) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("highwater-profile.json");
        let control = dir.path().join("control");
        std::fs::create_dir(&control).unwrap();
        let socket = format!("highwater-watch-{name}-{}", std::process::id());
        let command = format!(
            "{} watch --refresh 0.1 {}",
            env!("CARGO_BIN_EXE_highwater"),
            profile.display()
        );
        let status = Command::new("tmux")
            .args(["-L", &socket, "new-session", "-d", "-x", "120", "-y", "45"])
            .arg(command)
            .env("TERM", "xterm-256color")
            .status()
            .expect("tmux must be installed to test highwater watch (apt-get install tmux)");
        assert!(status.success(), "tmux new-session failed: {status}");
        let mut run = Run {
            socket,
            child: None,
            control,
            profile,
            _dir: dir,
        };
        // The view starts before the run: it waits for the profile to appear.
        run.wait_for_screen(&["status: waiting for a profile".to_string()]);
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", child_test, "--ignored", "--quiet"])
            .env(PROFILE_VAR, &run.profile)
            .env(CONTROL_VAR, &run.control)
            .stdout(Stdio::null())
            .spawn()
            .expect("start the writer");
        run.child = Some(child);
        run
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the writer started")
    }

    fn tmux(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p"]).stdout).into_owned()
    }

    /// The screen once it shows every one of `wanted`.
    fn wait_for_screen(&self, wanted: &[String]) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if wanted.iter().all(|text| screen.contains(text.as_str())) {
                return screen;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the screen never showed {wanted:?}; it shows:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn marker(&self, name: &str) -> PathBuf {
        self.control.join(name)
    }

    /// Waits for the child to create marker `name`, failing at once if it ends first.
    fn wait_for_marker(&mut self, name: &str) {
        let marker = self.marker(name);
        let start = Instant::now();
        while !marker.exists() {
            if let Some(status) = self.child().try_wait().unwrap() {
                panic!("the child ended ({status}) before {name}");
            }
            assert!(start.elapsed() < PATIENCE, "{name} never appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Checks each checkpoint's figures on the screen, in turn.
    fn follow_checkpoints(&mut self) {
        let pid = self.child().id();
        let mut previous: Option<String> = None;
        for step in 1..=CHECKPOINTS {
            wait_for_file(&self.marker(&format!("written-{step}")));
            let on_disk = Profile::load(&self.profile).unwrap();
            assert_eq!(on_disk.summary.final_live_bytes, step * 3 * MIB);
            // Everything the screen must show in one wait: a capture mid-redraw is retried.
            let mut wanted = figures(&on_disk, "status: running");
            wanted.extend([format!("pid {pid}"), "checkpoint ".to_string()]);
            let screen = self.wait_for_screen(&wanted);
            if let Some(previous) = previous {
                assert_ne!(previous, screen, "the screen did not change at step {step}");
            }
            previous = Some(screen);
            std::fs::write(self.marker(&format!("next-{step}")), "").unwrap();
        }
    }

    /// Presses `q` and waits for the view (and so the tmux session) to end.
    fn quit(&self) {
        assert!(self.tmux(&["send-keys", "q"]).status.success());
        let start = Instant::now();
        while self.tmux(&["has-session"]).status.success() {
            assert!(start.elapsed() < PATIENCE, "q did not quit the view");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.tmux(&["kill-server"]);
    }
}

/// The lines the screen must show for `profile` in `status`.
fn figures(profile: &Profile, status: &str) -> Vec<String> {
    let summary = &profile.summary;
    let mut wanted = vec![
        status.to_string(),
        format!("live now: {}", format_bytes(summary.final_live_bytes)),
        format!(
            "peak: {} on {}",
            format_bytes(summary.peak_bytes),
            summary.peak_device
        ),
    ];
    if let Some(last) = profile.iterations.last() {
        wanted.push(format!("iteration {} ({}):", last.index, last.span));
    }
    wanted
}

#[test]
fn follows_checkpoints_then_says_the_run_finished() {
    let mut run = Run::start("finish", "writer_child");
    run.follow_checkpoints();
    // The last go-ahead lets the child write its final profile and exit.
    assert!(run.child().wait().unwrap().success(), "the writer failed");
    let last = Profile::load(&run.profile).unwrap();
    assert!(!last.meta.partial);
    let screen = run.wait_for_screen(&figures(&last, "status: finished"));
    assert!(!screen.contains("checkpoint "), "{screen}");
    // Still there after the run ended, until q.
    std::thread::sleep(Duration::from_millis(300));
    assert!(run.screen().contains("status: finished"));
    run.quit();
}

#[test]
fn says_the_run_died_when_its_writer_is_killed() {
    let mut run = Run::start("killed", "writer_child");
    wait_for_file(&run.marker("written-1"));
    std::fs::write(run.marker("next-1"), "").unwrap();
    wait_for_file(&run.marker("written-2"));
    let left = Profile::load(&run.profile).unwrap();
    run.wait_for_screen(&figures(&left, "status: running"));
    // SIGKILL, as the OOM killer or a scheduler would.
    run.child().kill().unwrap();
    run.child().wait().unwrap();
    let screen = run.wait_for_screen(&figures(&left, "status: died"));
    assert!(screen.contains("last checkpoint"), "{screen}");
    let after = Profile::load(&run.profile).unwrap();
    assert_eq!(after.summary, left.summary, "nothing rewrote it");
    run.quit();
}

#[test]
fn refuses_no_terminal_and_a_bad_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.json");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_highwater"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let piped = run(&["watch", path.to_str().unwrap()]);
    assert_eq!(piped.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(stderr.contains("not one"), "{stderr}");
    for refresh in ["0", "0.001", "soon", "NaN", "1e9"] {
        let flag = format!("--refresh={refresh}");
        let bad = run(&["watch", &flag, path.to_str().unwrap()]);
        assert_eq!(bad.status.code(), Some(2), "--refresh {refresh}");
        let stderr = String::from_utf8_lossy(&bad.stderr);
        assert!(stderr.contains("--refresh"), "{stderr}");
    }
}

/// The `live now:` figure on the screen, as shown.
fn live_now(screen: &str) -> Option<String> {
    let start = screen.find("live now: ")? + "live now: ".len();
    let rest = &screen[start..];
    Some(rest[..rest.find("  ")?].to_string())
}

#[test]
fn follows_a_recording_session_to_its_final_profile() {
    let mut run = Run::start("session", "training_child");
    let first = run.wait_for_screen(&["status: running".to_string()]);
    let first_live = live_now(&first).expect("live now on the screen");
    // Live memory grows by 1 MiB a step: the figure on the screen moves.
    let start = Instant::now();
    let moved = loop {
        let screen = run.screen();
        if live_now(&screen).is_some_and(|live| live != first_live)
            && screen.contains("status: running")
        {
            break screen;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "live now stayed {first_live}:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(moved.contains("step"), "the span is listed:\n{moved}");
    std::fs::write(run.marker("stop"), "").unwrap();
    assert!(
        run.child().wait().unwrap().success(),
        "the training child failed"
    );
    let last = Profile::load(&run.profile).unwrap();
    assert!(!last.meta.partial);
    let screen = run.wait_for_screen(&figures(&last, "status: finished"));
    let step = last.spans.iter().find(|s| s.name == "step").unwrap();
    assert!(
        screen.contains(&format_bytes(step.peak_bytes)),
        "the span's peak as the final profile has it:\n{screen}"
    );
    run.quit();
}

/// The text of the screen's out-of-memory box, its wrapped rows joined into one line.
fn oom_box(screen: &str) -> String {
    screen
        .lines()
        .skip_while(|line| !line.contains("out of memory:"))
        .skip(1)
        .take_while(|line| !line.trim_start().starts_with('└'))
        .map(|line| line.trim().trim_matches('│').trim())
        .collect::<Vec<_>>()
        .join(" ")
}

/// What the box must say of `oom`: when, who refused how much on which device, what was live
/// there then, and a pool's largest free block.
fn oom_facts(oom: &OomEvent) -> Vec<String> {
    let source = match oom.source {
        OomSource::Heap => "the heap allocator",
        OomSource::Pool => "the device pool",
        OomSource::Driver => "the device driver",
    };
    let mut facts = vec![
        format!(
            "at {}: {source} refused {} on {}",
            format_duration_ns(oom.timestamp_ns),
            format_bytes(oom.requested_bytes),
            oom.device
        ),
        format!("in {}", oom.span_path),
        format!(
            "live then: {} on {}",
            format_bytes(oom.live_bytes),
            oom.device
        ),
    ];
    if let Some(largest) = oom.largest_free_bytes {
        facts.push(format!("largest free block {}", format_bytes(largest)));
    }
    facts
}

/// Waits for the screen to show `status` and the box to count `oom_events`, and checks that
/// the box says what each of them says.
fn wait_for_oom_box(run: &Run, status: &str, oom_events: &[OomEvent]) {
    let count = oom_events.len();
    let title = format!(
        "out of memory: {count} allocation{} refused",
        if count == 1 { "" } else { "s" }
    );
    let facts: Vec<String> = oom_events.iter().flat_map(oom_facts).collect();
    // A capture can catch the view mid-redraw: wait until the box says everything (or the
    // patience runs out, and the last screen shows what it lacked).
    let start = Instant::now();
    loop {
        let screen = run.wait_for_screen(&[status.to_string(), title.clone()]);
        let text = oom_box(&screen);
        let missing: Vec<&String> = facts
            .iter()
            .filter(|f| !text.contains(f.as_str()))
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the box lacks {missing:?}:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn shows_each_refused_allocation_as_the_profile_records_it() {
    let mut run = Run::start("oom", "oom_child");
    let screen = run.wait_for_screen(&["status: running".to_string()]);
    assert!(
        !screen.contains("out of memory"),
        "before any refusal:\n{screen}"
    );
    std::fs::write(run.marker("refuse"), "").unwrap();

    // The pool refused: the checkpoint written before `reserve` returned has it.
    run.wait_for_marker("pool-refused");
    let first = Profile::load(&run.profile).unwrap();
    assert!(first.meta.partial);
    assert_eq!(first.summary.oom_count, 1);
    let pool = &first.oom_events[0];
    assert_eq!(
        (pool.source, pool.device.as_str(), pool.requested_bytes),
        (OomSource::Pool, "tpu:0", 40 * GIB)
    );
    assert_eq!(pool.largest_free_bytes, Some(28 * GIB));
    wait_for_oom_box(&run, "status: running", &first.oom_events);

    // Then the heap allocator.
    std::fs::write(run.marker("next"), "").unwrap();
    run.wait_for_marker("heap-refused");
    let second = Profile::load(&run.profile).unwrap();
    assert_eq!(second.summary.oom_count, 2);
    assert_eq!(
        second.oom_events[0], *pool,
        "the first refusal stays as it was"
    );
    let heap = &second.oom_events[1];
    assert_eq!(
        (heap.source, heap.device.as_str(), heap.requested_bytes),
        (OomSource::Heap, "cpu", HEAP_REFUSED as u64)
    );
    wait_for_oom_box(&run, "status: running", &second.oom_events);

    // The final profile has the same two, and the finished run's screen still shows them.
    std::fs::write(run.marker("stop"), "").unwrap();
    assert!(
        run.child().wait().unwrap().success(),
        "the OOM child failed"
    );
    let last = Profile::load(&run.profile).unwrap();
    assert!(!last.meta.partial);
    assert_eq!(last.oom_events, second.oom_events);
    wait_for_oom_box(&run, "status: finished", &last.oom_events);
    run.quit();
}
