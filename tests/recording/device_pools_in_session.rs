//! With a session running, device pool reservations and releases become pool events: the
//! profile's pool timeline and device rows show each device's reserved bytes, capacity and
//! fragmentation, with no observer set by the user.

use highwater::device::{DeviceIndex, DeviceKind, PoolManager, Strategy};
use highwater::Session;

use highwater_testkit::child::isolated;

const GIB: u64 = 1 << 30;

#[test]
fn pool_state_reaches_the_profile() {
    isolated("pool_state_reaches_the_profile", || {
        let session = Session::builder().write_profile(false).start().unwrap();
        let pools = PoolManager::builder()
            .kind(DeviceKind::TpuV4)
            .devices(2)
            .strategy(Strategy::BestFit)
            .build();
        let a = pools
            .reserve(&[(DeviceIndex(0), 4 * GIB), (DeviceIndex(1), 2 * GIB)])
            .unwrap();
        let b = pools.reserve(&[(DeviceIndex(0), 8 * GIB)]).unwrap();
        let c = pools.reserve(&[(DeviceIndex(0), 4 * GIB)]).unwrap();
        // Freeing the middle block leaves two free runs on tpu:0: fragmentation > 0.
        pools.release(b).unwrap();
        let profile = session.finish().unwrap();
        pools.release(a).unwrap();
        pools.release(c).unwrap();

        let device = |name: &str| {
            profile
                .devices
                .iter()
                .find(|d| d.device == name)
                .unwrap_or_else(|| panic!("no {name} row in {:#?}", profile.devices))
        };
        assert_eq!(device("tpu:0").capacity_bytes, Some(32 * GIB));
        assert_eq!(device("tpu:0").peak_reserved_bytes, Some(16 * GIB));
        assert_eq!(device("tpu:1").peak_reserved_bytes, Some(2 * GIB));
        // Free runs of 8 and 16 GiB: 1 - 16/24.
        let fragmentation = device("tpu:0").max_fragmentation.unwrap();
        assert!((fragmentation - 1.0 / 3.0).abs() < 1e-12, "{fragmentation}");
        let last_tpu0 = profile
            .pool_timeline
            .iter()
            .rfind(|p| p.device == "tpu:0")
            .expect("tpu:0 pool points");
        assert_eq!(last_tpu0.reserved_bytes, 8 * GIB);
        assert_eq!(last_tpu0.capacity_bytes, 32 * GIB);
    });
}
