//! The words every output uses for the same thing — the command-line reports, the HTML report,
//! the examples — so a reader meets one name and one explanation per figure.
//!
//! Units have one formatter too: [`highwater_profile::units`]' `format_bytes` and `format_duration_ns`
//! (binary units, `KiB`/`MiB`/`GiB`), which the HTML report's script mirrors and its browser
//! test compares against.

/// Where allocations made with no span open are attributed.
pub const OUTSIDE_SPANS: &str = "(outside spans)";

/// The label of [`Summary::autograd_retained_bytes`](highwater_profile::Summary::autograd_retained_bytes).
pub const KEPT_FOR_BACKWARD: &str = "Kept for backward";

/// What [`KEPT_FOR_BACKWARD`] measures.
pub const KEPT_FOR_BACKWARD_EXPLAINED: &str = "activation bytes still live when the first \
    backward span began: what autograd kept from the forward pass for the backward pass";

/// The label of the part of a category at the peak that outlived its span.
pub const STATE: &str = "State";

/// The label of [`Summary::peak_temporary_by_category`](highwater_profile::Summary::peak_temporary_by_category).
pub const TEMPORARY: &str = "Temporary";

/// What [`STATE`] and [`TEMPORARY`] split.
pub const STATE_VS_TEMPORARY_EXPLAINED: &str = "temporary: live at the peak but freed before \
    the span that allocated it exited (an update's scratch); state: outlived its span \
    (parameters, optimizer moments)";

/// The head of a span's residual, in every view (the value is
/// [`SpanMetrics::residual_per_call`](highwater_profile::SpanMetrics::residual_per_call)).
pub const RESIDUAL_HEAD: &str = "residual/call";

/// What a span's residual is: per call, in every view.
pub const RESIDUAL_EXPLAINED: &str = "Residual/call: bytes one call of the span allocated and \
    still held when it exited, averaged over its calls. A step that keeps nothing shows 0 B; \
    a forward pass whose activations wait for the backward pass shows their size; a step that \
    keeps a little more every call is leaking (see the change per iteration).";

/// What the per-iteration figure is (not a residual: the change of everything live).
pub const ITERATION_CHANGE_EXPLAINED: &str = "change: live bytes on all devices at an \
    iteration's end minus at the previous iteration's end";

/// What a span's peak is.
pub const SPAN_PEAK_EXPLAINED: &str =
    "Peak: the highest live bytes on the peak's device while the span was open.";

/// The head of the column naming the op whose output a row holds.
pub const OP_OUTPUT_HEAD: &str = "Output of op";

/// Why rows name an op: so `fc1.bias_add [128, 512] f32` is not read as a parameter.
pub const OP_OUTPUT_EXPLAINED: &str = "An op names the tensor it produced (its output), with \
    that tensor's shape; the category says what the bytes are (an op's output in the forward \
    pass is an activation, not the parameter it read).";

/// The header line of live-at-peak rows in the text reports.
pub const LIVE_AT_PEAK_HEADER: [&str; 7] = [
    "bytes",
    "category",
    "output of op",
    "shape",
    "dtype",
    "count",
    "span path",
];

/// What a call site's figures are, for every view of them.
pub const SITES_EXPLAINED: &str = "Call sites are the stacks that allocated, estimated from \
    allocations sampled by bytes: each figure is an estimate ± its standard error (an \
    allocation far larger than the sampling interval is all but always sampled, so the \
    tensors that make a peak are counted exactly).";
