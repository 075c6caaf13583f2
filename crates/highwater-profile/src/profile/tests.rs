//! Profile files: round trips, errors that name the problem, writes that leave nothing half
//! done.

use std::fs;
use std::path::Path;

use super::*;

#[test]
fn write_then_load_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/p.json");
    let mut profile = Profile::empty();
    profile.summary.peak_bytes = 12 << 20;
    profile
        .summary
        .peak_by_category
        .insert(Category::Activation, 8 << 20);
    profile.write(&path).unwrap();
    assert_eq!(Profile::load(&path).unwrap(), profile);
    let leftovers: Vec<_> = fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers.len(),
        1,
        "temporary file left behind: {leftovers:?}"
    );
}

#[test]
fn load_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str); 4] = [
        ("empty.json", ""),
        ("truncated.json", "{\"schema\": \"highwater/2\", \"summ"),
        ("other.json", "{\"schema\": \"highwater/99\"}"),
        ("types.json", "{\"schema\": \"highwater/2\", \"meta\": 3}"),
    ];
    let expected = [
        "is empty",
        "not a valid",
        "schema \"highwater/99\"",
        "not a valid",
    ];
    for ((name, text), want) in cases.iter().zip(expected) {
        let path = dir.path().join(name);
        fs::write(&path, text).unwrap();
        let message = Profile::load(&path).unwrap_err().to_string();
        assert!(message.contains(want), "{name}: {message}");
        assert!(message.contains(name), "{name}: {message}");
    }
    let missing = Profile::load(dir.path().join("missing.json")).unwrap_err();
    assert!(matches!(missing, ProfileError::Read { .. }));
}

#[test]
fn a_profile_without_checkpoint_fields_is_a_final_one() {
    let mut value = serde_json::to_value(Profile::empty()).unwrap();
    let meta = value["meta"].as_object_mut().unwrap();
    for field in [
        "pid",
        "partial",
        "checkpoint_unix_ms",
        "host",
        "rank",
        "local_rank",
        "world_size",
        "launcher",
        "run_id",
    ] {
        assert!(meta.remove(field).is_some(), "{field} is written");
    }
    value["summary"]
        .as_object_mut()
        .unwrap()
        .remove("final_by_category");
    let text = serde_json::to_vec(&value).unwrap();
    let profile = Profile::from_json_bytes(&text, Path::new("old.json")).unwrap();
    assert!(!profile.meta.partial);
    assert_eq!(profile.meta.pid, 0);
    assert_eq!(profile.meta.checkpoint_unix_ms, None);
    assert_eq!(profile.meta.rank, None, "written before ranks: no rank");
    assert_eq!(profile.meta.world_size, None);
    assert!(profile.meta.host.is_empty() && profile.meta.run_id.is_none());
    assert!(profile.summary.final_by_category.is_empty());
}

#[test]
fn failed_write_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where the file should go makes the final rename fail.
    let path = dir.path().join("taken");
    fs::create_dir(&path).unwrap();
    fs::write(path.join("keep"), "x").unwrap();
    assert!(Profile::empty().write(&path).is_err());
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("taken")]);
}
