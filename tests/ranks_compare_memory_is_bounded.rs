//! Comparing ranks streams the profiles (issue 33): the heap `ranks::compare` needs is one
//! profile plus a row and a bounded curve per rank, however many ranks there are. Measured with
//! `highwater::measure` (exact bytes on the calling thread, so the compare runs on one worker).

use std::path::Path;

use highwater::profile::model::Category;
use highwater::profile::ranks::{compare, CompareOptions};
use highwater::profile::TimelinePoint;
use highwater::Profile;
use highwater_testkit::ranks::as_rank;
use highwater_testkit::sample::sample_profile;

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

/// What one rank may add: its row and its curve of at most `CURVE` points, with room to spare.
const PER_RANK: u64 = 24 << 10;
const CURVE: usize = 400;

/// The sample profile grown to the size of a long run's: a long curve and many span instances.
fn big_profile() -> Profile {
    let mut profile = sample_profile();
    let last = profile.timeline.last().unwrap().clone();
    for i in 1..=12_000u64 {
        profile.timeline.push({
            let mut timeline_point = TimelinePoint::default();
            timeline_point.timestamp_ns = last.timestamp_ns + i;
            timeline_point.device = "cpu".into();
            timeline_point.live_bytes = 1 << 20;
            timeline_point.by_category = [(Category::Other, 1 << 20)].into_iter().collect();
            timeline_point
        });
    }
    let event = profile.span_events[0].clone();
    profile.span_events.extend((0..8_000).map(|i| {
        let mut span_event = event.clone();
        span_event.start_ns = event.start_ns + i;
        span_event.duration_ns = 1;
        span_event
    }));
    profile
}

fn write_ranks(dir: &Path, ranks: u32, profile: &Profile) {
    for rank in 0..ranks {
        as_rank(profile.clone(), rank, ranks, "job", u64::from(rank) << 20)
            .write(dir.join(format!("p.rank{rank}.json")))
            .unwrap();
    }
}

#[test]
fn comparing_40_ranks_needs_one_profile_and_a_row_per_rank() {
    let profile = big_profile();
    let (few_dir, many_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_ranks(few_dir.path(), 8, &profile);
    write_ranks(many_dir.path(), 40, &profile);
    let file = few_dir.path().join("p.rank0.json");
    let size = std::fs::metadata(&file).unwrap().len();
    assert!(size > 2 << 20, "a profile of a real size: {size} bytes");
    drop(profile);

    let (loaded, one) = highwater::measure(|| Profile::load(&file).unwrap());
    drop(loaded);
    let options = CompareOptions::new().threads(1).curves(CURVE);
    let (few, m_few) = highwater::measure(|| compare(&[few_dir.path().into()], &options).unwrap());
    let (many, m_many) =
        highwater::measure(|| compare(&[many_dir.path().into()], &options).unwrap());
    assert_eq!((few.rows.len(), many.rows.len()), (8, 40));
    assert_eq!(many.imbalance.heaviest_rank, 39);

    // Streaming: never more than one profile at a time, plus what the rows keep.
    assert!(
        m_few.peak_bytes <= one.peak_bytes + 8 * PER_RANK,
        "8 ranks: peak {} > one profile {} + 8 rows",
        m_few.peak_bytes,
        one.peak_bytes
    );
    assert!(
        m_many.peak_bytes <= m_few.peak_bytes + 32 * PER_RANK,
        "40 ranks: peak {} grows past 32 more rows over 8 ranks' {}",
        m_many.peak_bytes,
        m_few.peak_bytes
    );
    // Holding every profile would need 40 of them.
    assert!(m_many.peak_bytes < 4 * one.peak_bytes);
}
