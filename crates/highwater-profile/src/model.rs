//! The vocabulary every stage shares: training steps, memory categories and devices.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The phase of a training step a span belongs to.
///
/// A span that carries a step gives heap allocations inside it a default category
/// (see [`Step::implied_category`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// The forward pass: allocations default to [`Category::Activation`].
    Forward,
    /// The backward pass: allocations default to [`Category::Gradient`].
    Backward,
    /// The optimizer update: allocations default to [`Category::Optimizer`].
    Optimizer,
}

impl Step {
    /// The category a heap allocation made inside this step takes when no span names one.
    pub const fn implied_category(self) -> Category {
        match self {
            Step::Forward => Category::Activation,
            Step::Backward => Category::Gradient,
            Step::Optimizer => Category::Optimizer,
        }
    }

    /// Lower-case name, as used in profiles and on the command line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Step::Forward => "forward",
            Step::Backward => "backward",
            Step::Optimizer => "optimizer",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so width and alignment (`{:<11}`) apply as they do to a string.
        f.pad(self.as_str())
    }
}

impl FromStr for Step {
    type Err = ParseLabelError;

    /// Parses a step's lower-case name, ignoring ASCII case (`"forward"`, `"Backward"`).
    fn from_str(text: &str) -> Result<Step, ParseLabelError> {
        [Step::Forward, Step::Backward, Step::Optimizer]
            .into_iter()
            .find(|step| step.as_str().eq_ignore_ascii_case(text))
            .ok_or_else(|| ParseLabelError {
                what: "step",
                value: text.to_string(),
                expected: "forward, backward or optimizer",
            })
    }
}

/// What a block of memory is for: the breakdown of the memory timeline.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Model weights.
    Parameter,
    /// Forward-pass intermediates (kept alive for backward).
    Activation,
    /// Gradients computed by backward.
    Gradient,
    /// Optimizer state (moments, master weights).
    Optimizer,
    /// Anything else.
    #[default]
    Other,
}

impl Category {
    /// Every category, in the order profiles list them.
    pub const ALL: [Category; 5] = [
        Category::Parameter,
        Category::Activation,
        Category::Gradient,
        Category::Optimizer,
        Category::Other,
    ];

    /// Number of categories (the length of per-category arrays).
    pub const COUNT: usize = 5;

    /// Lower-case name, as used as a key in profiles (`"activation"`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Activation => "activation",
            Category::Gradient => "gradient",
            Category::Optimizer => "optimizer",
            Category::Other => "other",
        }
    }

    /// Position in [`Category::ALL`]; stable, used to index per-category arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Inverse of [`Category::index`]; out-of-range values map to [`Category::Other`].
    pub const fn from_index(index: u8) -> Category {
        match index {
            0 => Category::Parameter,
            1 => Category::Activation,
            2 => Category::Gradient,
            3 => Category::Optimizer,
            _ => Category::Other,
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so width and alignment (`{:<11}`) apply as they do to a string.
        f.pad(self.as_str())
    }
}

impl FromStr for Category {
    type Err = ParseLabelError;

    /// Parses a category's lower-case name ([`Category::as_str`]), ignoring ASCII case.
    ///
    /// ```
    /// use highwater_profile::model::Category;
    /// assert_eq!("gradient".parse(), Ok(Category::Gradient));
    /// assert!("weights".parse::<Category>().is_err());
    /// ```
    fn from_str(text: &str) -> Result<Category, ParseLabelError> {
        Category::ALL
            .into_iter()
            .find(|category| category.as_str().eq_ignore_ascii_case(text))
            .ok_or_else(|| ParseLabelError {
                what: "category",
                value: text.to_string(),
                expected: "parameter, activation, gradient, optimizer or other",
            })
    }
}

/// A name that is not a [`Step`] or [`Category`] (from their `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}: expected {expected}")]
pub struct ParseLabelError {
    what: &'static str,
    value: String,
    expected: &'static str,
}

/// What a span says about the memory allocated inside it.
///
/// Built by `profile!` from nothing, a [`Step`] or a [`Category`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanLabel {
    /// A plain span: allocations inherit from the enclosing spans.
    #[default]
    Plain,
    /// A span marking a training step.
    Step(Step),
    /// A span naming the category of what it allocates.
    Category(Category),
}

impl SpanLabel {
    /// The label as one byte (for a recorder's fixed-size events); [`SpanLabel::from_byte`]
    /// reads it back.
    pub const fn to_byte(self) -> u8 {
        match self {
            SpanLabel::Plain => 0,
            SpanLabel::Step(Step::Forward) => 1,
            SpanLabel::Step(Step::Backward) => 2,
            SpanLabel::Step(Step::Optimizer) => 3,
            SpanLabel::Category(c) => 8 + c as u8,
        }
    }

    /// Inverse of [`SpanLabel::to_byte`]; unknown bytes decode as [`SpanLabel::Plain`].
    pub const fn from_byte(byte: u8) -> SpanLabel {
        match byte {
            1 => SpanLabel::Step(Step::Forward),
            2 => SpanLabel::Step(Step::Backward),
            3 => SpanLabel::Step(Step::Optimizer),
            8..=12 => SpanLabel::Category(Category::from_index(byte - 8)),
            _ => SpanLabel::Plain,
        }
    }
}

impl From<Step> for SpanLabel {
    fn from(step: Step) -> Self {
        SpanLabel::Step(step)
    }
}

impl From<Category> for SpanLabel {
    fn from(category: Category) -> Self {
        SpanLabel::Category(category)
    }
}

/// The category state a span passes to what runs inside it: the innermost category named by a
/// span, and the innermost step. This is the category rule: see [`CategoryScope::category`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CategoryScope {
    /// The innermost category a span named.
    pub named: Option<Category>,
    /// The innermost step a span marked.
    pub step: Option<Step>,
}

impl CategoryScope {
    /// The scope inside a child span with `label`.
    pub const fn enter(self, label: SpanLabel) -> CategoryScope {
        match label {
            SpanLabel::Plain => self,
            SpanLabel::Step(step) => CategoryScope {
                named: self.named,
                step: Some(step),
            },
            SpanLabel::Category(category) => CategoryScope {
                named: Some(category),
                step: self.step,
            },
        }
    }

    /// Category of a heap allocation made in this scope: the innermost named category, else
    /// the innermost step's implied category, else [`Category::Other`].
    pub const fn category(self) -> Category {
        match (self.named, self.step) {
            (Some(category), _) => category,
            (None, Some(step)) => step.implied_category(),
            (None, None) => Category::Other,
        }
    }
}

/// Who refused an allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomSource {
    /// The heap allocator [`Alloc`](https://docs.rs/highwater) wraps returned null.
    #[default]
    Heap,
    /// A [`PoolManager`](https://docs.rs/highwater) refused an admission.
    Pool,
    /// The device's driver refused a memory call (CUDA's `CUDA_ERROR_OUT_OF_MEMORY`).
    Driver,
}

impl OomSource {
    /// Decodes [`OomSource`]`as u8`; an unknown byte is [`OomSource::Heap`].
    pub const fn from_byte(byte: u8) -> OomSource {
        match byte {
            1 => OomSource::Pool,
            2 => OomSource::Driver,
            _ => OomSource::Heap,
        }
    }
}

/// The name of the frame-pointer walk, as [`Unwinder::FramePointers`] is written in profiles.
pub const FRAME_POINTERS_UNWINDER: &str = "frame-pointers";

/// Allocations of at least this many times the mean sampling interval `R` are always sampled:
/// the rule the recorder samples by and the analysis weighs samples by.
pub const ALWAYS_SAMPLED_MEANS: u64 = 4;

/// The probability that an allocation of `size` bytes was sampled with mean interval `mean`
/// bytes: `1 - e^(-size/mean)`, and 1 from [`ALWAYS_SAMPLED_MEANS`]` × mean` on (and for
/// `mean <= 1`, every allocation sampled).
pub fn sample_probability(size: u64, mean: u64) -> f64 {
    if mean <= 1 || size >= mean.saturating_mul(ALWAYS_SAMPLED_MEANS) {
        1.0
    } else {
        -(-(size as f64) / mean as f64).exp_m1()
    }
}

/// The name of unwinding by call-frame information, as [`Unwinder::EhFrame`] is written in
/// profiles.
pub const EH_FRAME_UNWINDER: &str = "eh-frame";

/// [`SiteSampling::unwinder`](crate::SiteSampling::unwinder) where stacks are walked by frame
/// pointers where that works and unwound by call-frame information where it does not.
pub const FRAME_POINTERS_THEN_EH_FRAME: &str = "frame-pointers, eh-frame";

/// How one sampled stack was walked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unwinder {
    /// By frame pointers: two loads per frame, where every frame keeps one (the fast path).
    #[default]
    FramePointers,
    /// By the binary's call-frame information (`.eh_frame`): any build, a table lookup per
    /// frame.
    EhFrame,
}

impl Unwinder {
    /// Its name in profiles ([`FRAME_POINTERS_UNWINDER`], [`EH_FRAME_UNWINDER`]).
    pub const fn as_str(self) -> &'static str {
        match self {
            Unwinder::FramePointers => FRAME_POINTERS_UNWINDER,
            Unwinder::EhFrame => EH_FRAME_UNWINDER,
        }
    }
}

impl fmt::Display for Unwinder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one sampled stack was walked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StackWalk {
    /// The walk stopped before the stack's first frame (at the depth limit, or at a frame it
    /// could not follow).
    pub truncated: bool,
    /// The method that walked it.
    pub unwinder: Unwinder,
}

impl From<bool> for StackWalk {
    /// A walk by frame pointers, cut (`true`) or not: what every stack was before other
    /// unwinders.
    fn from(truncated: bool) -> StackWalk {
        StackWalk {
            truncated,
            unwinder: Unwinder::FramePointers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_category_wins_over_any_step() {
        let scope = CategoryScope::default()
            .enter(SpanLabel::Category(Category::Parameter))
            .enter(SpanLabel::Step(Step::Forward));
        assert_eq!(scope.category(), Category::Parameter);
    }

    #[test]
    fn innermost_step_implies_category() {
        let scope = CategoryScope::default()
            .enter(SpanLabel::Step(Step::Forward))
            .enter(SpanLabel::Plain)
            .enter(SpanLabel::Step(Step::Backward));
        assert_eq!(scope.category(), Category::Gradient);
        assert_eq!(CategoryScope::default().category(), Category::Other);
    }

    #[test]
    fn names_parse_back_ignoring_case() {
        for category in Category::ALL {
            assert_eq!(category.as_str().parse(), Ok(category));
            assert_eq!(category.as_str().to_uppercase().parse(), Ok(category));
        }
        for step in [Step::Forward, Step::Backward, Step::Optimizer] {
            assert_eq!(step.as_str().parse(), Ok(step));
        }
        let error = "weights".parse::<Category>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "unknown category \"weights\": expected parameter, activation, gradient, optimizer or other"
        );
        assert!("sideways".parse::<Step>().is_err());
    }

    #[test]
    fn names_display_padded_like_strings() {
        assert_eq!(format!("{:<10}|", Category::Gradient), "gradient  |");
        assert_eq!(format!("{:>9}", Step::Forward), "  forward");
    }

    #[test]
    fn category_maps_serialise_with_lower_case_keys() {
        let map: std::collections::BTreeMap<Category, u64> =
            [(Category::Activation, 3), (Category::Other, 1)].into();
        let json = serde_json::to_string(&map).unwrap();
        assert_eq!(json, r#"{"activation":3,"other":1}"#);
        assert_eq!(
            serde_json::from_str::<std::collections::BTreeMap<Category, u64>>(&json).unwrap(),
            map
        );
    }

    #[test]
    fn label_bytes_round_trip() {
        let labels = [
            SpanLabel::Plain,
            SpanLabel::Step(Step::Forward),
            SpanLabel::Step(Step::Backward),
            SpanLabel::Step(Step::Optimizer),
        ]
        .into_iter()
        .chain(Category::ALL.into_iter().map(SpanLabel::Category));
        for label in labels {
            assert_eq!(SpanLabel::from_byte(label.to_byte()), label);
        }
    }
}
