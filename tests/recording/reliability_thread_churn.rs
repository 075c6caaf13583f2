//! Hardening III, row 4: a program that starts short-lived threads one after another, by the
//! tens of thousands. Each claims a ring and retires it at exit; the collector frees retired
//! rings once drained. When threads came and went faster than the collector woke, the table
//! filled with retired rings and new threads dropped their events, in lossless mode. Now a
//! thread that finds the table full waits for a retired ring, and the profile stays bounded:
//! one capture row per thread up to `MAX_THREAD_ROWS`, the rest summed in the last row.

use highwater::profile::MAX_THREAD_ROWS;
use highwater::Session;

const THREADS: usize = 32_000;
const BATCH: usize = 16;

#[test]
fn thread_churn_loses_nothing_and_keeps_the_profile_bounded() {
    highwater_testkit::child::isolated(
        "thread_churn_loses_nothing_and_keeps_the_profile_bounded",
        || {
            // A small table, so that rings of exited threads fill it between the collector's
            // wakes: without waiting for them, new threads would drop their events.
            let session = Session::builder()
                .write_profile(false)
                .max_threads(2 * BATCH)
                .start()
                .unwrap();
            // A few at a time: retired rings pile up faster than the collector wakes.
            for batch in 0..THREADS / BATCH {
                let threads: Vec<_> = (0..BATCH)
                    .map(|i| {
                        std::thread::spawn(move || {
                            std::hint::black_box(vec![(batch + i) as u8; 64]);
                        })
                    })
                    .collect();
                for thread in threads {
                    thread.join().unwrap();
                }
            }
            let profile = session.finish().unwrap();
            assert_eq!(profile.summary.dropped_events, 0, "{:?}", profile.capture);
            assert_eq!(profile.capture.unattributed_dropped, 0);
            let rows = &profile.capture.threads;
            assert_eq!(rows.len(), MAX_THREAD_ROWS);
            let threads: u64 = rows.iter().map(|row| row.threads).sum();
            assert_eq!(threads, u64::from(profile.meta.threads));
            // Every spawned thread recorded (the main thread too).
            assert!(
                profile.meta.threads as usize > THREADS,
                "{}",
                profile.meta.threads
            );
            assert!(rows[..MAX_THREAD_ROWS - 1]
                .iter()
                .all(|row| row.threads == 1));
            // The thread rows stay a fixed few hundred KiB however many threads ran, and the
            // whole profile within the README's bound.
            let rows_json = serde_json::to_string(rows).unwrap();
            assert!(rows_json.len() < 256 << 10, "{} bytes", rows_json.len());
            let json = profile.to_json();
            assert!(json.len() < 10 << 20, "{} bytes", json.len());
        },
    );
}

/// More live threads than the session's limit: their events are dropped, and the profile says
/// which setting raises the limit.
#[test]
fn threads_past_the_limit_are_counted_and_the_warning_names_the_setting() {
    highwater_testkit::child::isolated(
        "threads_past_the_limit_are_counted_and_the_warning_names_the_setting",
        || {
            let session = Session::builder()
                .write_profile(false)
                .max_threads(4)
                .start()
                .unwrap();
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let barrier = barrier.clone();
                    std::thread::spawn(move || {
                        // All alive at once, each allocating.
                        barrier.wait();
                        std::hint::black_box(vec![i as u8; 4096]);
                        barrier.wait();
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            let profile = session.finish().unwrap();
            let (events, limit) = profile
                .warnings
                .iter()
                .find_map(|w| match w {
                    highwater::profile::Warning::ThreadLimit { events, limit } => {
                        Some((*events, *limit))
                    }
                    _ => None,
                })
                .unwrap_or_else(|| panic!("no thread-limit warning: {:?}", profile.warnings));
            assert_eq!(limit, 4);
            assert!(events > 0 && events <= profile.summary.dropped_events);
            let text = profile
                .warnings
                .iter()
                .map(ToString::to_string)
                .collect::<String>();
            assert!(text.contains("HIGHWATER_MAX_THREADS"), "{text}");
        },
    );
}
