//! Tests of call-site attribution: sampling shares, frame trimming and the report's rows.

use super::*;

#[test]
fn the_probability_follows_the_capture_rule() {
    assert_eq!(sample_probability(7, 1), 1.0);
    assert_eq!(sample_probability(4096, 1024), 1.0);
    let p = sample_probability(1024, 1024);
    assert!((p - (1.0 - (-1.0f64).exp())).abs() < 1e-12);
    // Tiny allocations keep their precision (no 1 - (1 - x) cancellation).
    let tiny = sample_probability(1, 1 << 20);
    assert!((tiny * (1u64 << 20) as f64 - 1.0).abs() < 1e-6);
}

#[test]
fn allocator_frames_are_recognised() {
    for own in [
        "highwater::capture::hook::record_alloc",
        "<highwater::alloc::Alloc<A> as core::alloc::global::GlobalAlloc>::alloc",
        "__rust_alloc",
        "alloc::alloc::exchange_malloc",
        "<alloc::alloc::Global as core::alloc::Allocator>::allocate",
    ] {
        assert!(is_allocator_function(own), "{own}");
    }
    for user in [
        "alloc::raw_vec::RawVec<T,A>::grow_one",
        "my_crate::train",
        "highwater_example::main",
    ] {
        assert!(!is_allocator_function(user), "{user}");
    }
    let inlined_here = Frame {
        function: Some("record_alloc".into()),
        file: Some(format!("{RECORDER}capture/hook.rs")),
        ..Frame::default()
    };
    assert!(is_allocator_frame(&inlined_here, RECORDER));
    let inlined_std = Frame {
        function: Some("alloc_zeroed".into()),
        file: Some("/rustc/0123/library/alloc/src/alloc.rs".into()),
        ..Frame::default()
    };
    assert!(is_allocator_frame(&inlined_std, RECORDER));
    let raw_vec = Frame {
        function: Some("try_allocate_in<alloc::alloc::Global>".into()),
        file: Some("/rustc/0123/library/alloc/src/raw_vec/mod.rs".into()),
        ..Frame::default()
    };
    assert!(!is_allocator_frame(&raw_vec, RECORDER));
}

#[test]
fn an_inlined_closure_takes_the_path_of_the_function_around_it_in_its_file() {
    let frame = |name: &str, file: &str| Frame {
        function: Some(name.into()),
        file: Some(file.into()),
        ..Frame::default()
    };
    let mut frames = vec![
        frame("{closure#0}", "/src/tests/a.rs"),
        frame(
            "map<u8>",
            "/rustc/abc/library/core/src/iter/adapters/map.rs",
        ),
        frame("{closure#1}<u8>", "/src/other.rs"),
        frame("a::many_small_blocks", "/src/tests/a.rs"),
    ];
    qualify_closures(&mut frames);
    let names: Vec<_> = frames.iter().map(|f| f.function.clone().unwrap()).collect();
    assert_eq!(
        names,
        [
            "a::many_small_blocks::{closure#0}",
            "map<u8>",
            "{closure#1}<u8>",
            "a::many_small_blocks"
        ]
    );
}

#[test]
fn a_closure_whose_function_left_no_frame_takes_the_path_its_type_names() {
    let frame = |name: &str, file: &str| Frame {
        function: Some(name.into()),
        file: Some(file.into()),
        ..Frame::default()
    };
    let mut frames = vec![
        frame("{closure#0}", "/src/tests/a.rs"),
        frame(
            "fold<i32, a::many_small_blocks::{closure_env#0}, ()>",
            "/rustc/abc/library/core/src/iter/adapters/map.rs",
        ),
        frame("highwater::measure::measure", "/src/measure/mod.rs"),
    ];
    qualify_closures(&mut frames);
    assert_eq!(
        frames[0].function.as_deref(),
        Some("a::many_small_blocks::{closure#0}")
    );
}

/// Where the tests' recorder keeps its sources.
const RECORDER: &str = "/src/highwater/src/";

/// A resolver that names `pc` after a table, for the tests.
#[derive(Debug)]
struct Table(Vec<(u64, &'static [&'static str])>);

impl ResolveFrames for Table {
    fn resolve(&self, pcs: &[u64]) -> Vec<Vec<Frame>> {
        pcs.iter()
            .map(|&pc| {
                let names = self
                    .0
                    .iter()
                    .find(|(at, _)| *at == pc)
                    .map_or(&[][..], |(_, names)| names);
                names
                    .iter()
                    .enumerate()
                    .map(|(i, name)| Frame {
                        pc,
                        function: Some(name.to_string()),
                        file: None,
                        line: None,
                        inlined: i + 1 < names.len(),
                    })
                    .collect()
            })
            .collect()
    }

    fn recorder_sources(&self) -> &str {
        RECORDER
    }
}

/// Issue 12: without frame pointers the walk starts from a register the hook never set:
/// stacks come out empty (release builds) or start elsewhere (debug builds, where the
/// register still holds an outer frame).
#[test]
fn stacks_that_do_not_start_at_the_hook_are_counted() {
    let mut sites = Sites::default();
    sites.set_sampling(1, "frame-pointers");
    sites.set_resolver(Box::new(Table(vec![
        (1, &["highwater::capture::hook::walk_for_sample"]),
        (2, &["user::make"]),
        (3, &["std::rt::lang_start"]),
    ])));
    let hooked = sites.intern_stack(&[1, 2, 3], false);
    let elsewhere = sites.intern_stack(&[2, 3], false);
    let empty = sites.intern_stack(&[], true);
    let unnamed = sites.intern_stack(&[9, 3], false);
    for (addr, stack) in [
        (1, hooked),
        (2, elsewhere),
        (3, empty),
        (4, empty),
        (5, unnamed),
    ] {
        sites.sampled(addr, 8, KEY, stack, addr);
    }
    let sampling = sites.report(|_| None).sampling;
    assert_eq!(sampling.samples, 5);
    assert_eq!(sampling.stacks_without_hook, 3);
}

/// Issue 35: a program whose dependencies have no debug info (highwater among them) names
/// the hook's frames from the symbol table only, without files: the standard library's
/// frames among them (a thread-local access instantiated in highwater) are told by name.
#[test]
fn frames_without_files_are_trimmed_by_name() {
    let mut sites = Sites::default();
    sites.set_sampling(1, "frame-pointers, eh-frame");
    sites.set_resolver(Box::new(Table(vec![
        (1, &["std::thread::local::LocalKey<T>::try_with"]),
        (2, &["highwater::capture::hook::walk_for_sample"]),
        (3, &["__rustc::__rust_alloc"]),
        (4, &["alloc::raw_vec::RawVecInner<A>::try_allocate_in"]),
        (5, &["probe::few_large"]),
    ])));
    let stack = sites.intern_stack(
        &[1, 2, 3, 4, 5],
        StackWalk {
            truncated: false,
            unwinder: Unwinder::EhFrame,
        },
    );
    sites.sampled(0x10, 8, KEY, stack, 0);
    let report = sites.report(|_| None);
    let names: Vec<_> = report.sites[0]
        .frames
        .iter()
        .map(|f| f.function.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "alloc::raw_vec::RawVecInner<A>::try_allocate_in",
            "probe::few_large"
        ]
    );
    assert_eq!(report.sampling.stacks_without_hook, 0);
    assert_eq!(
        report.sites[0].samples_by_unwinder,
        BTreeMap::from([("eh-frame".to_string(), 1)])
    );
    assert_eq!(
        report.sampling.samples_by_unwinder,
        BTreeMap::from([("eh-frame".to_string(), 1)])
    );
}

/// The same addresses walked by the two methods are two stacks, one site, whose samples
/// say which walked them.
#[test]
fn a_site_counts_its_samples_by_unwinder() {
    let mut sites = Sites::default();
    sites.set_sampling(1, "frame-pointers, eh-frame");
    let by_pointers = sites.intern_stack(&[1, 2], false);
    let by_tables = sites.intern_stack(
        &[1, 2],
        StackWalk {
            truncated: false,
            unwinder: Unwinder::EhFrame,
        },
    );
    assert_ne!(by_pointers, by_tables);
    sites.sampled(0x10, 8, KEY, by_pointers, 0);
    sites.sampled(0x20, 8, KEY, by_pointers, 1);
    sites.sampled(0x30, 8, KEY, by_tables, 2);
    let report = sites.report(|_| None);
    assert_eq!(report.sites.len(), 1);
    let expected = BTreeMap::from([
        ("eh-frame".to_string(), 1),
        ("frame-pointers".to_string(), 2),
    ]);
    assert_eq!(report.sites[0].samples_by_unwinder, expected);
    assert_eq!(report.sampling.samples_by_unwinder, expected);
    assert_eq!(report.sites[0].samples, 3);
}

const KEY: ShareKey = ShareKey {
    node: NONE,
    op: NONE,
    category: Category::Other,
};

#[test]
fn stacks_that_differ_only_inside_the_allocator_are_one_site() {
    let mut sites = Sites::default();
    sites.set_sampling(1, "frame-pointers");
    sites.set_resolver(Box::new(Table(vec![
        (1, &["highwater::capture::hook::record_alloc"]),
        (2, &["__rust_realloc"]),
        (3, &["alloc::alloc::exchange_malloc", "user::make"]),
        (4, &["user::main"]),
    ])));
    let a = sites.intern_stack(&[1, 3, 4], false);
    let b = sites.intern_stack(&[2, 3, 4], true);
    assert_ne!(a, b);
    sites.sampled(0x10, 100, KEY, a, 0);
    sites.sampled(0x20, 50, KEY, b, 1);
    let report = sites.report(|_| None);
    assert_eq!(report.sites.len(), 1);
    let site = &report.sites[0];
    let names: Vec<_> = site
        .frames
        .iter()
        .map(|f| f.function.clone().unwrap())
        .collect();
    assert_eq!(names, ["user::make", "user::main"]);
    assert_eq!(
        (site.alloc_bytes, site.alloc_count, site.samples),
        (150, 2, 2)
    );
    assert_eq!(site.alloc_bytes_error, 0, "R = 1 is exact");
    assert_eq!(report.sampling.distinct_sites, 1);
    assert_eq!(report.sampling.truncated_stacks, 1);
    assert_eq!(report.sampling.max_depth, 3);
}

#[test]
fn blocks_live_at_the_peak_count_there_even_when_freed_or_recategorised_later() {
    let mut sites = Sites::default();
    sites.set_sampling(1, "frame-pointers");
    let a = sites.intern_stack(&[10], false);
    let b = sites.intern_stack(&[20], false);
    // The timeline marks a peak while applying the allocation, before its sample.
    sites.mark_peak(0);
    sites.sampled(0x1, 1000, KEY, a, 0);
    sites.mark_peak(1);
    // Allocated by the event that set the peak: it counts there too.
    sites.sampled(0x2, 500, KEY, b, 1);
    sites.ended(0x1);
    sites.recategorised(0x2, Category::Optimizer);
    sites.sampled(0x3, 7, KEY, b, 5);
    let report = sites.report(|_| None);
    let peak: Vec<(u64, u64)> = report
        .sites
        .iter()
        .map(|s| (s.frames[0].pc, s.peak_bytes))
        .collect();
    assert_eq!(peak, [(10, 1000), (20, 500)]);
    let b_site = &report.sites[1];
    assert_eq!(b_site.alloc_bytes, 507);
    assert_eq!(b_site.shares.len(), 1, "{:?}", b_site.shares);
    assert_eq!(b_site.shares[0].category, Category::Other);
    assert_eq!(report.top_sites.get(&KEY), Some(&vec![0, 1]));
    // A newer peak: the freed block was not live there, the two others were.
    sites.mark_peak(9);
    let report = sites.report(|_| None);
    let peak: u64 = report.sites.iter().map(|s| s.peak_bytes).sum();
    assert_eq!(peak, 507, "only the blocks still live at the newest peak");
}

#[test]
fn weights_undo_the_sampling_probability() {
    let mut sites = Sites::default();
    let mean = 1000;
    sites.set_sampling(mean, "frame-pointers");
    let stack = sites.intern_stack(&[1], false);
    sites.sampled(0x1, 100, KEY, stack, 0);
    sites.sampled(0x2, 5000, KEY, stack, 1);
    let report = sites.report(|_| None);
    let p = sample_probability(100, mean);
    let site = &report.sites[0];
    assert_eq!(site.alloc_bytes, (100.0 / p + 5000.0).round() as u64);
    assert_eq!(site.alloc_count, (1.0 / p + 1.0).round() as u64);
    let se = (100.0f64 * 100.0 * (1.0 - p) / (p * p)).sqrt();
    assert_eq!(site.alloc_bytes_error, se.round() as u64);
}

#[test]
fn shares_past_the_limit_fold_into_one() {
    let mut sites = Sites::default();
    sites.set_sampling(1, "frame-pointers");
    let stack = sites.intern_stack(&[1], false);
    for node in 0..(MAX_SITE_SHARES as u32 + 4) {
        let key = ShareKey { node, ..KEY };
        sites.sampled(u64::from(node), 10 + u64::from(node), key, stack, 0);
    }
    let report = sites.report(|_| None);
    let shares = &report.sites[0].shares;
    assert_eq!(shares.len(), MAX_SITE_SHARES);
    let last = shares.last().unwrap();
    assert_eq!((last.span, last.op.as_deref()), (None, None));
    let total: u64 = shares.iter().map(|s| s.alloc_bytes).sum();
    assert_eq!(total, report.sites[0].alloc_bytes);
}
