//! 8 MiB allocated in a forward span, then 4 MiB in a backward span: the profile must say the
//! peak is 12 MiB (plus only the runtime's own small allocations), 8 MiB of it activations and
//! 4 MiB gradients, with 8 MiB retained for autograd. The 8 MiB arrive through a zeroed
//! allocation grown by realloc, so resizes are neither lost nor double-counted.

use std::alloc::{alloc_zeroed, dealloc, realloc, Layout};
use std::hint::black_box;

use highwater::{Category, Session, Step};

use highwater_testkit::child::isolated;

const MIB: u64 = 1 << 20;
/// What the runtime may allocate on its own during the test (thread names, buffers).
const SLACK: u64 = 64 << 10;

#[test]
fn forward_then_backward_peaks_at_twelve_mib() {
    isolated("forward_then_backward_peaks_at_twelve_mib", || {
        let session = Session::builder().write_profile(false).start().unwrap();
        let small = Layout::from_size_align(4 * MIB as usize, 64).unwrap();
        let (activations, gradients) = {
            let activations = {
                let _fwd = highwater::profile!("forward", Step::Forward);
                // SAFETY: `small` has a non-zero size; the block is grown once and freed below
                // with the layout it then has.
                unsafe {
                    // `black_box`: an optimised build may otherwise elide allocations it can see
                    // are never read.
                    let block = black_box(alloc_zeroed(small));
                    assert!(!block.is_null());
                    let grown = black_box(realloc(block, small, 8 * MIB as usize));
                    assert!(!grown.is_null());
                    grown
                }
            };
            let gradients = {
                let _bwd = highwater::profile!("backward", Step::Backward);
                black_box(vec![1u8; 4 * MIB as usize])
            };
            (activations, gradients)
        };
        drop(gradients);
        // SAFETY: allocated above with this size and alignment.
        unsafe {
            dealloc(
                activations,
                Layout::from_size_align(8 * MIB as usize, 64).unwrap(),
            )
        };
        let profile = session.finish().unwrap();

        let summary = &profile.summary;
        assert!(
            (12 * MIB..12 * MIB + SLACK).contains(&summary.peak_bytes),
            "peak {} bytes",
            summary.peak_bytes
        );
        assert_eq!(summary.peak_device, "cpu");
        let at_peak = |category| {
            summary
                .peak_by_category
                .get(&category)
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(at_peak(Category::Activation), 8 * MIB);
        assert_eq!(at_peak(Category::Gradient), 4 * MIB);
        assert!(at_peak(Category::Other) < SLACK);
        assert_eq!(summary.autograd_retained_bytes, 8 * MIB);
        assert!(summary.realloc_count >= 1);
        assert!(summary.total_alloc_bytes >= 12 * MIB);
        assert!(summary.final_live_bytes < SLACK);

        let row = |path: &str| {
            profile
                .peak_breakdown
                .iter()
                .filter(|row| row.span_path == path)
                .map(|row| row.bytes)
                .sum::<u64>()
        };
        assert_eq!(row("forward"), 8 * MIB);
        assert_eq!(row("backward"), 4 * MIB);
        let largest: Vec<u64> = profile
            .largest_at_peak
            .iter()
            .map(|a| a.bytes)
            .take(2)
            .collect();
        assert_eq!(largest, vec![8 * MIB, 4 * MIB]);
        let span = |name: &str| profile.spans.iter().find(|s| s.name == name).unwrap();
        assert_eq!(span("forward").bytes_allocated, 8 * MIB);
        assert_eq!(span("forward").residual_bytes, 8 * MIB);
        assert_eq!(span("backward").residual_bytes, 4 * MIB);
        assert!(profile
            .timeline
            .iter()
            .any(|point| point.live_bytes == summary.peak_bytes
                && point.timestamp_ns == summary.peak_timestamp_ns));
    });
}
