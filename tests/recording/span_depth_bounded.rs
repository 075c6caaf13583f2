//! A profile stays bounded whatever the span depth: 10,000 nested spans (recursion, and guards
//! leaked with `mem::forget` in a loop) used to give a 605 MB profile. The span tree is stored
//! once by id, at most `MAX_SPAN_DEPTH` deep, and the profile says what it folded.

use std::hint::black_box;

use highwater::profile::{Warning, FOLDED_SPANS, MAX_SPAN_DEPTH};
use highwater::{Profile, Session};

use highwater_testkit::child::isolated;

const LIMIT: usize = 10 << 20;

fn recurse(depth: u32, kept: &mut Vec<Vec<u8>>) {
    let _span = highwater::profile!("level");
    kept.push(black_box(vec![0u8; 64]));
    if depth > 0 {
        recurse(depth - 1, kept);
    }
}

fn check(profile: &Profile, what: &str) {
    let size = profile.to_json().len();
    assert!(size <= LIMIT, "{what}: the profile is {size} bytes");
    assert!(
        profile.spans.len() <= MAX_SPAN_DEPTH as usize + 1,
        "{what}: {} span nodes",
        profile.spans.len()
    );
    assert!(
        profile.spans.iter().any(|s| s.name == FOLDED_SPANS),
        "{what}"
    );
    assert!(
        profile.warnings.iter().any(
            |w| matches!(w, Warning::SpansTooDeep { max_depth, .. } if *max_depth == MAX_SPAN_DEPTH)
        ),
        "{what}: the folding is not said: {:?}",
        profile.warnings
    );
    let deepest = profile.span_path(profile.spans.len() as u32 - 1);
    assert_eq!(
        deepest.split('/').count(),
        MAX_SPAN_DEPTH as usize + 1,
        "{what}"
    );
    // The profile it writes loads again.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep.json");
    profile.write(&path).unwrap();
    assert_eq!(&Profile::load(&path).unwrap(), profile);
    println!(
        "FIGURES {what}: {size} bytes, {} nodes",
        profile.spans.len()
    );
}

#[test]
fn ten_thousand_nested_spans_give_a_bounded_profile() {
    isolated("ten_thousand_nested_spans_give_a_bounded_profile", || {
        let handle = std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn(|| {
                let session = Session::builder().write_profile(false).start().unwrap();
                let mut kept = Vec::new();
                recurse(10_000, &mut kept);
                let profile = session.finish().unwrap();
                check(&profile, "recursion");
                let session = Session::builder().write_profile(false).start().unwrap();
                for _ in 0..10_000 {
                    std::mem::forget(highwater::profile!("leaked"));
                    kept.push(black_box(vec![0u8; 64]));
                }
                let profile = session.finish().unwrap();
                check(&profile, "leaked guards");
            })
            .unwrap();
        handle.join().unwrap();
    });
}
