//! `Profile::from_json_bytes` on arbitrary bytes: an error or a profile, never a panic, and a
//! profile that loads serialises into JSON that loads again.

#![no_main]

use std::path::Path;

use highwater::Profile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(profile) = Profile::from_json_bytes(data, Path::new("fuzz-input.json")) {
        let again = profile.to_json();
        assert!(
            Profile::from_json_bytes(again.as_bytes(), Path::new("again.json")).is_ok(),
            "a loaded profile did not reload"
        );
    }
});
