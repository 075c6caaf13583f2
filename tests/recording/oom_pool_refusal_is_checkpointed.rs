//! Issue 17, item 2: a device pool that refuses an admission while a session records leaves an
//! OOM event per refusing device (request, largest free block, the pool's reserved bytes, the
//! span that asked) and a checkpoint holding it, written before `reserve` returns the error.

use std::time::Duration;

use highwater::device::{DeviceIndex, DeviceKind, PoolError, PoolManager, Strategy};
use highwater::profile::model::OomSource;
use highwater::{Profile, Session, Step};

use highwater_testkit::child::isolated;

const GIB: u64 = 1 << 30;

#[test]
fn a_refused_admission_is_checkpointed_with_the_pool_state() {
    isolated(
        "a_refused_admission_is_checkpointed_with_the_pool_state",
        || {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("run.json");
            // A generous bound: the checkpoint is read as soon as `reserve` returns, however busy
            // the machine is (the wait ends when it is on disk).
            let session = Session::builder()
                .output(&path)
                .oom_wait(Duration::from_secs(600))
                .start()
                .unwrap();
            let pools = PoolManager::builder()
                .kind(DeviceKind::TpuV4)
                .devices(2)
                .strategy(Strategy::BestFit)
                .build();
            let a = pools.reserve(&[(DeviceIndex(0), 4 * GIB)]).unwrap();
            let b = pools.reserve(&[(DeviceIndex(0), 8 * GIB)]).unwrap();
            let c = pools.reserve(&[(DeviceIndex(0), 4 * GIB)]).unwrap();
            pools.release(b).unwrap();
            // Free: 8 GiB between `a` and `c`, 16 GiB after `c`. 20 GiB would fit in total, not in
            // one block: a refusal by fragmentation.
            let refused = {
                let _step = highwater::profile!("train_step", Step::Forward);
                pools.reserve(&[(DeviceIndex(0), 20 * GIB)])
            };
            assert!(
                matches!(refused, Err(PoolError::Admission(_))),
                "{refused:?}"
            );
            let checkpoint = Profile::load(&path).unwrap();
            assert!(checkpoint.meta.partial);
            assert_eq!(checkpoint.summary.oom_count, 1);
            let oom = &checkpoint.oom_events[0];
            assert_eq!(
                (oom.source, oom.device.as_str(), oom.requested_bytes),
                (OomSource::Pool, "tpu:0", 20 * GIB)
            );
            assert_eq!(oom.largest_free_bytes, Some(16 * GIB));
            assert_eq!(
                (oom.pool_capacity_bytes, oom.pool_reserved_bytes),
                (Some(32 * GIB), Some(8 * GIB))
            );
            assert_eq!(oom.span_path, "train_step");

            // All or nothing over two devices: only the one that refused is an event.
            let refused = pools.reserve(&[(DeviceIndex(0), GIB), (DeviceIndex(1), 40 * GIB)]);
            assert!(refused.is_err());
            let profile = session.finish().unwrap();
            pools.release(a).unwrap();
            pools.release(c).unwrap();
            assert_eq!(profile.summary.oom_count, 2);
            let second = &profile.oom_events[1];
            assert_eq!(
                (
                    second.device.as_str(),
                    second.requested_bytes,
                    second.largest_free_bytes
                ),
                ("tpu:1", 40 * GIB, Some(32 * GIB))
            );
            assert_eq!(profile.oom_events[0], *oom);
            let tpu0 = profile
                .devices
                .iter()
                .find(|d| d.device == "tpu:0")
                .unwrap();
            assert_eq!(
                tpu0.peak_reserved_bytes,
                Some(16 * GIB),
                "a refusal reserves nothing"
            );
        },
    );
}
