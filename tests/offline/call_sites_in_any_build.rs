//! Issue 35: the same call sites in any build. A probe program (`tests/fixtures/call_site_probe`)
//! whose three functions allocate known totals is built eight ways — with and without frame
//! pointers, in debug and release, with `debug = "line-tables-only"` and with full debug info —
//! and run with every allocation sampled. Each build's profile names the three functions by
//! their full paths, with file and line, and gives each exactly its bytes; a build without frame
//! pointers unwinds every stack by `.eh_frame`, and nothing tells the user to rebuild.
//!
//! The builds go to a temporary directory under `CARGO_TARGET_TMPDIR` (never the working tree),
//! one per frame-pointer setting, removed once that setting's four builds are checked: each
//! holds a copy of the library's dependencies, and CI's disk is not large. Dependencies are built
//! once per frame-pointer setting and profile (four times); the debug info setting only rebuilds
//! the probe itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use highwater::profile::{CallSite, Frame};
use highwater::Profile;

/// What each probe function allocates: (name, blocks, bytes each).
const PROBES: [(&str, u64, u64); 3] = [
    ("few_large", 6, 3 << 20),
    ("many_small", 20_000, 96),
    ("some_medium", 300, 12 << 10),
];

/// One way of building the probe.
#[derive(Debug, Clone, Copy)]
struct Build {
    release: bool,
    frame_pointers: bool,
    /// `line-tables-only` or `full`.
    debug: &'static str,
}

impl Build {
    fn name(&self) -> String {
        format!(
            "{} {} frame pointers, debug = {}",
            if self.release { "release" } else { "debug" },
            if self.frame_pointers {
                "with"
            } else {
                "without"
            },
            self.debug
        )
    }
}

/// The probe's sources and manifest, laid out under `CARGO_TARGET_TMPDIR`.
fn probe_sources() -> PathBuf {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture = repository.join("tests/fixtures/call_site_probe");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("call_site_probe");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = std::fs::read_to_string(fixture.join("Cargo.toml.in"))
        .unwrap()
        .replace("@HIGHWATER@", &repository.display().to_string());
    let write_if_changed = |path: PathBuf, contents: &[u8]| {
        if std::fs::read(&path).ok().as_deref() != Some(contents) {
            std::fs::write(&path, contents).unwrap();
        }
    };
    write_if_changed(dir.join("Cargo.toml"), manifest.as_bytes());
    write_if_changed(
        dir.join("src/main.rs"),
        &std::fs::read(fixture.join("src/main.rs")).unwrap(),
    );
    // The repository's lock file: the same versions, resolved without the network.
    if !dir.join("Cargo.lock").exists() {
        std::fs::copy(repository.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    }
    dir
}

/// Builds the probe as `build` says into `target` and returns its binary.
fn build_probe(sources: &Path, target: &Path, build: Build) -> PathBuf {
    let profile = if build.release { "RELEASE" } else { "DEV" };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .arg("build")
        .arg("--offline")
        .arg("--quiet")
        .arg("--manifest-path")
        .arg(sources.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target)
        // Incremental state would double a debug build's footprint, for no rebuild to use it.
        .env("CARGO_INCREMENTAL", "0")
        .env(
            "RUSTFLAGS",
            format!(
                "-C force-frame-pointers={}",
                if build.frame_pointers { "yes" } else { "no" }
            ),
        )
        .env(format!("CARGO_PROFILE_{profile}_DEBUG"), build.debug)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS");
    if build.release {
        command.arg("--release");
    }
    let output = command.output().expect("cargo runs");
    assert!(
        output.status.success(),
        "building the probe ({}) failed:\n{}",
        build.name(),
        String::from_utf8_lossy(&output.stderr)
    );
    target
        .join(if build.release { "release" } else { "debug" })
        .join("call_site_probe")
}

/// Runs the probe and loads its profile.
fn run_probe(binary: &Path, build: Build) -> Profile {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probe.json");
    let output = Command::new(binary)
        .arg(&path)
        .env_remove("HIGHWATER_UNWINDER")
        .env_remove("HIGHWATER_SAMPLE_BYTES")
        .output()
        .expect("the probe runs");
    assert!(
        output.status.success(),
        "the probe ({}) failed:\n{}",
        build.name(),
        String::from_utf8_lossy(&output.stderr)
    );
    Profile::load(&path).unwrap()
}

/// The program's own frame a site reads first, as `highwater sites` lists it (the standard
/// library's allocation frames counted, not listed).
fn first_own_frame(site: &CallSite) -> Option<&Frame> {
    highwater_export::stacks::interesting(&site.frames)
        .frames
        .first()
}

/// Checks one build's profile; returns a line for the log.
fn check(profile: &Profile, build: Build) -> String {
    let name = build.name();
    let sampling = &profile.sampling;
    assert_eq!(sampling.mean_bytes, 1, "{name}");
    assert_eq!(sampling.stacks_without_hook, 0, "{name}: {sampling:?}");
    let by = |unwinder: &str| {
        sampling
            .samples_by_unwinder
            .get(unwinder)
            .copied()
            .unwrap_or(0)
    };
    if !build.frame_pointers {
        assert_eq!(by("eh-frame"), sampling.samples, "{name}: {sampling:?}");
    } else {
        assert!(by("frame-pointers") > 0, "{name}: {sampling:?}");
    }
    assert!(
        profile.warnings.is_empty(),
        "{name}: {:?}",
        profile.warnings
    );
    for (function, blocks, size) in PROBES {
        let full = format!("call_site_probe::{function}");
        let sites: Vec<&CallSite> = profile
            .sites
            .iter()
            .filter(|site| {
                first_own_frame(site).and_then(|f| f.function.as_deref()) == Some(full.as_str())
            })
            .collect();
        let bytes: u64 = sites.iter().map(|site| site.alloc_bytes).sum();
        let count: u64 = sites.iter().map(|site| site.alloc_count).sum();
        let frames: Vec<String> = profile
            .sites
            .iter()
            .take(6)
            .map(|site| {
                let names: Vec<&str> = site
                    .frames
                    .iter()
                    .take(8)
                    .map(|f| f.function.as_deref().unwrap_or("?"))
                    .collect();
                names.join(" < ")
            })
            .collect();
        assert_eq!(
            (bytes, count),
            (blocks * size, blocks),
            "{name}: {full}'s sites {sites:#?}\nlargest sites read:\n{}",
            frames.join("\n")
        );
        let own = first_own_frame(sites[0]).unwrap();
        assert!(
            own.file.as_deref().is_some_and(|f| f.ends_with("main.rs")) && own.line.is_some(),
            "{name}: {own:?}"
        );
        // Every Rust frame of the site (one with a source file) carries its function's path,
        // inlined ones included (the C library's and `main`'s symbols have none to carry).
        for frame in sites.iter().flat_map(|site| &site.frames) {
            if let (Some(function), Some(_)) = (&frame.function, &frame.file) {
                assert!(
                    function.contains("::"),
                    "{name}: a frame without its path: {frame:?}"
                );
            }
        }
    }
    format!(
        "{name}: {} samples ({} by frame pointers, {} by eh-frame), {} sites",
        sampling.samples,
        by("frame-pointers"),
        by("eh-frame"),
        profile.sites.len()
    )
}

#[test]
fn the_same_call_sites_with_or_without_frame_pointers_in_debug_and_release() {
    let sources = probe_sources();
    for frame_pointers in [false, true] {
        // Removed at the end of the iteration, or when a check fails.
        let target = tempfile::Builder::new()
            .prefix("call_site_probe-target-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        for release in [true, false] {
            for debug in ["line-tables-only", "full"] {
                let build = Build {
                    release,
                    frame_pointers,
                    debug,
                };
                let started = Instant::now();
                let binary = build_probe(&sources, target.path(), build);
                let built = started.elapsed();
                let profile = run_probe(&binary, build);
                let line = check(&profile, build);
                eprintln!("{line} (built in {built:.1?})");
            }
        }
    }
}
