//! Many processes, one run (issue 33): every process's profile survives. Ranks from a
//! launcher's environment go into the names of the profile, the HTML report, the allocation log
//! and the checkpoints; processes told the same name write beside each other instead of over
//! each other; a killed writer's claim dies with it.
//!
//! Each case runs this test binary as several children (`HW_CHILD` names the case) that start a
//! session, wait until every child of the case has started (so all of them hold their outputs
//! at once), allocate a block of their own size and finish. Every wait has a watchdog.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use highwater::profile::Warning;
use highwater::{Profile, Session};
use highwater_testkit::child::is_child;

const WATCHDOG: Duration = Duration::from_secs(90);

/// Every launcher variable `rank::detect` reads: cleared in the children, so the machine the
/// tests run on (a Slurm step, say) cannot change what they see.
const LAUNCHER_VARS: [&str; 19] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "PMIX_NAMESPACE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_LOCALID",
    "SLURM_STEP_ID",
    "SLURM_JOB_ID",
    "HIGHWATER_RUN_ID",
    "HIGHWATER_OUT",
];

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

/// The child's part: start (with the builder's rank when `HW_BUILDER_RANK` says `r/n`), say so,
/// wait for the others, hold `index + 1` MiB, finish, and say where the profile went.
fn child() {
    let dir = PathBuf::from(var("HW_DIR"));
    let index: usize = var("HW_INDEX").parse().unwrap();
    let children: usize = var("HW_CHILDREN").parse().unwrap();
    let mut builder = Session::builder();
    if let Some((rank, world)) = var("HW_BUILDER_RANK").split_once('/') {
        builder = builder.rank(rank.parse().unwrap(), world.parse().unwrap());
    }
    let session = match builder.start() {
        Ok(session) => session,
        Err(error) => {
            std::fs::write(dir.join(format!("error.{index}")), error.to_string()).unwrap();
            return;
        }
    };
    let output = session.output().unwrap().to_path_buf();
    std::fs::write(dir.join(format!("started.{index}")), "").unwrap();
    let deadline = Instant::now() + WATCHDOG;
    while (0..children).any(|i| !dir.join(format!("started.{i}")).exists()) {
        assert!(
            Instant::now() < deadline,
            "the other children never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let held = {
        let _span = highwater::profile!("hold");
        std::hint::black_box(vec![1u8; (index + 1) << 20])
    };
    if var("HW_HANG") == "1" {
        // Killed by the parent, checkpoints written meanwhile.
        loop {
            std::thread::sleep(Duration::from_millis(10));
            std::hint::black_box(vec![0u8; 4096]);
        }
    }
    drop(held);
    session.finish().unwrap();
    std::fs::write(
        dir.join(format!("where.{index}")),
        output.to_string_lossy().as_bytes(),
    )
    .unwrap();
}

fn spawn(name: &str, dir: &Path, index: usize, children: usize, env: &[(&str, String)]) -> Child {
    let mut command = highwater_testkit::child::command(name);
    command
        .env("HW_DIR", dir)
        .env("HW_INDEX", index.to_string())
        .env("HW_CHILDREN", children.to_string())
        .env("HIGHWATER_CHECKPOINT", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for name in LAUNCHER_VARS {
        command.env_remove(name);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    command.spawn().expect("spawn a child")
}

/// Waits for `child`, killing it at the watchdog; its output (stderr piped).
fn finish(child: Child) -> Output {
    let id = child.id();
    let deadline = Instant::now() + WATCHDOG;
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if Instant::now() > deadline {
            // SAFETY: plain kill(2) of our own child by its id.
            unsafe { libc::kill(id as i32, libc::SIGKILL) };
            panic!("watchdog: child {id} did not end");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = waiter.join().unwrap();
    assert!(
        output.status.success(),
        "child {id} failed: {:?}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs `children` children of case `name`; each one's output, stderr and where its profile went.
fn run_children(
    name: &str,
    dir: &Path,
    children: usize,
    env: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Vec<(Output, PathBuf)> {
    let spawned: Vec<Child> = (0..children)
        .map(|i| spawn(name, dir, i, children, &env(i)))
        .collect();
    spawned
        .into_iter()
        .enumerate()
        .map(|(i, child)| {
            let output = finish(child);
            let error = dir.join(format!("error.{i}"));
            assert!(
                !error.exists(),
                "child {i}: {}",
                std::fs::read_to_string(&error).unwrap()
            );
            let written = std::fs::read_to_string(dir.join(format!("where.{i}"))).unwrap();
            (output, PathBuf::from(written))
        })
        .collect()
}

fn lock_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".lock"))
        .collect()
}

fn output_taken(profile: &Profile) -> Option<(&str, &str)> {
    profile.warnings.iter().find_map(|w| match w {
        Warning::OutputTaken {
            wanted, written, ..
        } => Some((wanted.as_str(), written.as_str())),
        _ => None,
    })
}

#[test]
fn four_processes_given_one_output_leave_four_profiles() {
    let name = "four_processes_given_one_output_leave_four_profiles";
    if is_child(name) {
        return child();
    }
    let dir = tempfile::tempdir().unwrap();
    let wanted = dir.path().join("p.json");
    let results = run_children(name, dir.path(), 4, |_| {
        vec![("HIGHWATER_OUT", wanted.to_string_lossy().into_owned())]
    });
    let mut paths: Vec<&PathBuf> = results.iter().map(|(_, path)| path).collect();
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), 4, "four names: {paths:?}");
    let mut plain = 0;
    let mut peaks = Vec::new();
    for (output, path) in &results {
        let profile = Profile::load(path).unwrap();
        assert!(profile.meta.rank.is_none(), "no launcher, no rank");
        peaks.push(profile.summary.peak_bytes);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if *path == wanted {
            plain += 1;
            assert!(output_taken(&profile).is_none());
            assert!(!stderr.contains("another live process"), "{stderr}");
        } else {
            let beside = wanted.with_file_name(format!("p.pid{}.json", profile.meta.pid));
            assert_eq!(*path, beside, "written beside, named by its process");
            let (asked, written) = output_taken(&profile).expect("the profile says so");
            assert_eq!(Path::new(asked), wanted);
            assert_eq!(Path::new(written), beside);
            assert!(
                stderr.contains("was being written by another live process"),
                "{stderr}"
            );
        }
    }
    assert_eq!(plain, 1, "one process got the name asked for");
    // Each child's own block is in its own profile: none was replaced by another's.
    peaks.sort_unstable();
    for (i, peak) in peaks.iter().enumerate() {
        assert!(*peak >= ((i + 1) << 20) as u64, "{peaks:?}");
    }
    assert!(lock_files(dir.path()).is_empty(), "claims are released");
}

#[test]
fn launcher_ranks_name_the_profile_the_report_and_the_log() {
    let name = "launcher_ranks_name_the_profile_the_report_and_the_log";
    if is_child(name) {
        return child();
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let log = dir.path().join("run.alloc");
    let results = run_children(name, dir.path(), 3, |i| {
        vec![
            ("HIGHWATER_OUT", out.to_string_lossy().into_owned()),
            ("HIGHWATER_ALLOC_LOG", log.to_string_lossy().into_owned()),
            ("HIGHWATER_HTML", "1".into()),
            ("RANK", i.to_string()),
            ("LOCAL_RANK", i.to_string()),
            ("WORLD_SIZE", "3".into()),
            ("TORCHELASTIC_RUN_ID", "job-42".into()),
        ]
    });
    let host = results
        .iter()
        .map(|(_, path)| Profile::load(path).unwrap().meta.host)
        .next()
        .unwrap();
    assert!(!host.is_empty());
    for (i, (output, path)) in results.iter().enumerate() {
        assert_eq!(*path, dir.path().join(format!("p.rank{i}.json")));
        let profile = Profile::load(path).unwrap();
        let meta = &profile.meta;
        assert_eq!(meta.rank, Some(i as u32));
        assert_eq!(meta.local_rank, Some(i as u32));
        assert_eq!(meta.world_size, Some(3));
        assert_eq!(meta.launcher.as_deref(), Some("torchrun"));
        assert_eq!(meta.run_id.as_deref(), Some("torchrun:job-42"));
        assert_eq!(meta.host, host);
        let own_log = dir.path().join(format!("run.rank{i}.alloc"));
        assert_eq!(meta.alloc_log.as_deref(), own_log.to_str());
        assert!(own_log.metadata().unwrap().len() > 0, "the log is written");
        assert!(dir.path().join(format!("p.rank{i}.html")).exists());
        assert!(output_taken(&profile).is_none());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("another live"), "{stderr}");
    }
    assert!(
        !out.exists() && !log.exists(),
        "no un-ranked name is written"
    );
    assert!(lock_files(dir.path()).is_empty());
}

#[test]
fn two_processes_told_the_same_rank_write_beside_each_other() {
    let name = "two_processes_told_the_same_rank_write_beside_each_other";
    if is_child(name) {
        return child();
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let results = run_children(name, dir.path(), 2, |_| {
        vec![
            ("HIGHWATER_OUT", out.to_string_lossy().into_owned()),
            ("PMI_RANK", "1".into()),
            ("PMI_SIZE", "2".into()),
        ]
    });
    let ranked = dir.path().join("p.rank1.json");
    let mut names: Vec<PathBuf> = results.iter().map(|(_, p)| p.clone()).collect();
    names.sort();
    let other = names
        .iter()
        .find(|p| **p != ranked)
        .expect("two names")
        .clone();
    assert!(names.contains(&ranked), "{names:?}");
    let beside = Profile::load(&other).unwrap();
    assert_eq!(
        other,
        dir.path()
            .join(format!("p.rank1.pid{}.json", beside.meta.pid))
    );
    assert_eq!(beside.meta.launcher.as_deref(), Some("pmi"));
    assert_eq!(output_taken(&beside).unwrap().0, ranked.to_str().unwrap());
}

#[test]
fn a_killed_writer_s_claim_dies_with_it_and_its_checkpoint_carries_the_rank() {
    let name = "a_killed_writer_s_claim_dies_with_it_and_its_checkpoint_carries_the_rank";
    if is_child(name) {
        return child();
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let env = |hang: &str| {
        vec![
            ("HIGHWATER_OUT", out.to_string_lossy().into_owned()),
            ("SLURM_PROCID", "2".to_string()),
            ("SLURM_NTASKS", "4".to_string()),
            ("SLURM_STEP_ID", "0".to_string()),
            ("SLURM_JOB_ID", "77".to_string()),
            ("HW_HANG", hang.to_string()),
            // spawn() turns checkpoints off; the hung child writes them often.
            (
                "HIGHWATER_CHECKPOINT",
                if hang == "1" { "0.05" } else { "0" }.to_string(),
            ),
        ]
    };
    let ranked = dir.path().join("p.rank2.json");
    let mut hung = spawn(name, dir.path(), 0, 1, &env("1"));
    drop(hung.stderr.take());
    let started = Instant::now();
    let checkpoint = loop {
        if let Ok(profile) = Profile::load(&ranked) {
            break profile;
        }
        assert!(hung.try_wait().unwrap().is_none(), "the child ended early");
        assert!(started.elapsed() < WATCHDOG, "watchdog: no checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(checkpoint.meta.partial);
    assert_eq!(checkpoint.meta.rank, Some(2));
    assert_eq!(checkpoint.meta.run_id.as_deref(), Some("slurm:77.0"));
    hung.kill().unwrap();
    assert_eq!(hung.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert_eq!(
        lock_files(dir.path()),
        [".p.rank2.json.lock"],
        "left by SIGKILL"
    );
    // The next writer of rank 2 is not kept off the name by a dead process.
    std::fs::remove_file(dir.path().join("started.0")).unwrap();
    let results = run_children(name, dir.path(), 1, |_| env("0"));
    assert_eq!(results[0].1, ranked);
    let last = Profile::load(&ranked).unwrap();
    assert!(!last.meta.partial && output_taken(&last).is_none());
    assert_ne!(last.meta.pid, checkpoint.meta.pid);
}

#[test]
fn placeholders_and_the_programs_own_rank_name_the_output() {
    let name = "placeholders_and_the_programs_own_rank_name_the_output";
    if is_child(name) {
        return child();
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("{host}/p-{rank}-of-{pid}.json");
    let results = run_children(name, dir.path(), 1, |_| {
        vec![
            ("HIGHWATER_OUT", out.to_string_lossy().into_owned()),
            ("HW_BUILDER_RANK", "2/3".into()),
            // The program's word wins over the launcher's.
            ("RANK", "0".into()),
            ("WORLD_SIZE", "8".into()),
        ]
    });
    let profile = Profile::load(&results[0].1).unwrap();
    let expected = dir
        .path()
        .join(&profile.meta.host)
        .join(format!("p-2-of-{}.json", profile.meta.pid));
    assert_eq!(results[0].1, expected);
    assert_eq!(profile.meta.rank, Some(2));
    assert_eq!(profile.meta.world_size, Some(3));
    assert_eq!(profile.meta.launcher.as_deref(), Some("builder"));
}

#[test]
fn a_wrong_rank_is_an_error_naming_the_variable() {
    let name = "a_wrong_rank_is_an_error_naming_the_variable";
    if is_child(name) {
        return child();
    }
    let dir = tempfile::tempdir().unwrap();
    let child = spawn(
        name,
        dir.path(),
        0,
        1,
        &[
            ("RANK", "4".into()),
            ("WORLD_SIZE", "4".into()),
            (
                "HIGHWATER_OUT",
                dir.path().join("p.json").to_string_lossy().into_owned(),
            ),
        ],
    );
    finish(child);
    let error = std::fs::read_to_string(dir.path().join("error.0")).unwrap();
    assert!(
        error.contains("RANK") && error.contains("below the world size"),
        "{error}"
    );
    assert!(!dir.path().join("p.json").exists() && !dir.path().join("p.rank4.json").exists());
}
