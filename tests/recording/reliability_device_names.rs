//! Device names from op hooks (hardening issue, rows 8 and 9): names the allocation log's own
//! reader would refuse (empty, with line breaks or escapes, longer than a log record can hold)
//! are normalised where they enter, so the log reads back and `simulate` can replay it; and a
//! program naming more devices than the table keeps has them counted as one, and warned of,
//! instead of silently merged into a real device.

use highwater::ops::{self, Tensor};
use highwater::profile::alloc_log::AllocLog;
use highwater::profile::Warning;
use highwater::Session;

fn tensor(id: u64, device: &str, bytes: u64) -> Tensor<'_> {
    Tensor {
        id,
        shape: &[1],
        dtype: "f32",
        device,
        bytes,
    }
}

#[test]
fn hostile_device_names_reach_a_log_that_reads_back() {
    highwater_testkit::child::isolated("hostile_device_names_reach_a_log_that_reads_back", || {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("run.alloc");
        let session = Session::builder()
            .write_profile(false)
            .alloc_log(&log)
            .start()
            .unwrap();
        let long_a = format!("{}a", "x".repeat(70_000));
        let long_b = format!("{}b", "x".repeat(70_000));
        let names = ["", "cuda:0\n", "tpu\u{1b}[31m:1", &long_a, &long_b];
        for (id, name) in names.iter().enumerate() {
            ops::tensor_alloc(&tensor(id as u64, name, 1024), None);
        }
        let profile = session.finish().unwrap();
        let read = AllocLog::read(&log).expect("the log reads back");
        for device in &read.devices {
            assert!(!device.is_empty() && !device.chars().any(char::is_control));
            assert!(device.len() <= 256, "{} bytes", device.len());
        }
        let mut names: Vec<&str> = profile.devices.iter().map(|d| d.device.as_str()).collect();
        names.sort_unstable();
        assert!(names.contains(&"(unnamed device)"), "{names:?}");
        assert!(names.contains(&"cuda:0?"), "{names:?}");
        assert!(names.contains(&"tpu?[31m:1"), "{names:?}");
        // The two long names agree in their first 256 bytes: one device of 2 KiB.
        let long = profile
            .devices
            .iter()
            .find(|d| d.device.starts_with("xxxx"))
            .unwrap();
        assert_eq!(long.final_live_bytes, 2048);
    });
}

#[test]
fn devices_past_the_table_s_limit_are_counted_as_one_and_warned_of() {
    highwater_testkit::child::isolated(
        "devices_past_the_table_s_limit_are_counted_as_one_and_warned_of",
        || {
            let session = Session::builder().write_profile(false).start().unwrap();
            for id in 0..5000u64 {
                ops::tensor_alloc(&tensor(id, &format!("tpu:{id}"), 1000 + id), None);
            }
            let profile = session.finish().unwrap();
            let folded = profile
                .warnings
                .iter()
                .find_map(|w| match w {
                    Warning::DevicesFolded {
                        devices, shown_as, ..
                    } => Some((*devices, shown_as.clone())),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("no warning: {:?}", profile.warnings));
            // cpu and 4094 named devices are kept; the rest share the last id.
            assert_eq!(folded.0, 5000 - 4094);
            let device = |name: &str| profile.devices.iter().find(|d| d.device == name);
            assert_eq!(device("tpu:4093").unwrap().final_live_bytes, 1000 + 4093);
            assert!(
                device("tpu:4094").is_none(),
                "a folded device is not shown by name"
            );
            let rest: u64 = (4094..5000u64).map(|id| 1000 + id).sum();
            assert_eq!(device(&folded.1).unwrap().final_live_bytes, rest);
        },
    );
}
