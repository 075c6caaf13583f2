//! Another local user who can write the output's directory cannot make a session overwrite a
//! file it never meant to write. Links and FIFOs planted where highwater once put its
//! temporary files (`.<name>.<pid>.tmp` beside each output) are never followed or opened: the
//! profile, its checkpoints, the HTML report and the allocation log each land as a new regular
//! file, the planted links stay links, and their target keeps its contents.

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use highwater::{Session, Step};
use highwater_testkit::child::isolated;

/// The temporary names a write to `path` by this process once used, and those of the next
/// few process ids.
fn predictable_temp_names(path: &Path) -> Vec<PathBuf> {
    let name = path.file_name().unwrap().to_str().unwrap();
    let pid = std::process::id();
    (pid..pid + 16)
        .map(|pid| path.with_file_name(format!(".{name}.{pid}.tmp")))
        .collect()
}

fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
}

#[test]
fn links_and_fifos_planted_beside_every_output_are_never_followed() {
    isolated(
        "links_and_fifos_planted_beside_every_output_are_never_followed",
        || {
            let dir = tempfile::tempdir().unwrap();
            // Writable by everyone and not sticky: the setting the attack needs.
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
            let precious = dir.path().join("precious");
            fs::write(&precious, "the victim's data").unwrap();
            let output = dir.path().join("profile.json");
            let html = dir.path().join("profile.html");
            let log = dir.path().join("run.alloc");
            for (i, planted) in [&output, &html, &log]
                .into_iter()
                .flat_map(|path| predictable_temp_names(path))
                .enumerate()
            {
                if i % 2 == 0 {
                    std::os::unix::fs::symlink(&precious, &planted).unwrap();
                } else {
                    mkfifo(&planted);
                }
            }

            let session = Session::builder()
                .output(&output)
                .html(true)
                .alloc_log(&log)
                .checkpoint_every(Duration::from_millis(20))
                .start()
                .unwrap();
            let mut kept = Vec::new();
            for step in 0..20 {
                let _forward = highwater::profile!("forward", Step::Forward);
                kept.push(vec![step as u8; 4096]);
                // Long enough for checkpoints to be written through the same path.
                std::thread::sleep(Duration::from_millis(10));
            }
            drop(kept);
            session.finish().unwrap();

            assert_eq!(fs::read_to_string(&precious).unwrap(), "the victim's data");
            for written in [&output, &html, &log] {
                let meta = fs::symlink_metadata(written).unwrap();
                assert!(meta.is_file(), "{} is a regular file", written.display());
                assert!(meta.len() > 0, "{} was written", written.display());
            }
            highwater::Profile::load(&output).unwrap();
            for planted in predictable_temp_names(&output) {
                let kind = fs::symlink_metadata(&planted).unwrap().file_type();
                assert!(kind.is_symlink() || kind.is_fifo(), "{planted:?} untouched");
            }
        },
    );
}
