//! The sample's call sites: deep hand-written stacks with inlined frames, sampled every
//! [`SAMPLE_BYTES`] with the capture's rule, shared among the live-at-peak rows.

use highwater_profile::{CallSite, Frame, PeakRow, Profile, SiteSampling, SiteShare, SpanMetrics};

use super::{GIB, ITERATIONS, LAYERS, MIB};
use highwater_profile::model::Category;

/// Mean bytes between samples in the sample's call sites.
const SAMPLE_BYTES: u64 = 512 << 10;

/// One frame of a hand-written stack: function (`None`: no symbol), file, line, inlined.
type FrameSpec = (Option<&'static str>, &'static str, u32, bool);

const REGISTRY: &str = "/home/ci/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f";

/// The allocation machinery every tensor's storage goes through: `Vec::with_capacity`'s
/// inlined frames, innermost first.
const ALLOC: [FrameSpec; 2] = [
    (
        Some("alloc::raw_vec::RawVecInner<A>::try_allocate_in"),
        "/rustc/17067e9ac6d7e98f18d4d9d4fd7a2b9f3e1c0a55/library/alloc/src/raw_vec/mod.rs",
        470,
        true,
    ),
    (
        Some("alloc::vec::Vec<T>::with_capacity"),
        "/rustc/17067e9ac6d7e98f18d4d9d4fd7a2b9f3e1c0a55/library/alloc/src/vec/mod.rs",
        480,
        true,
    ),
];

/// What runs `main`, outermost last.
const RUNTIME: [FrameSpec; 5] = [
    (
        Some("core::ops::function::FnOnce::call_once"),
        "/rustc/17067e9ac6d7e98f18d4d9d4fd7a2b9f3e1c0a55/library/core/src/ops/function.rs",
        250,
        false,
    ),
    (
        Some("std::rt::lang_start_internal"),
        "/rustc/17067e9ac6d7e98f18d4d9d4fd7a2b9f3e1c0a55/library/std/src/rt.rs",
        175,
        false,
    ),
    (Some("main"), "", 0, false),
    (Some("__libc_start_main"), "", 0, false),
    (Some("_start"), "", 0, false),
];

/// The training loop's frames, from the model call outwards.
const TRAIN_STEP: [FrameSpec; 2] = [
    (Some("train_gpt::train_step"), "src/train.rs", 120, false),
    (Some("train_gpt::main"), "src/main.rs", 44, false),
];

/// Candle's matmul down to the buffer.
const MATMUL: [FrameSpec; 3] = [
    (
        Some("candle_core::cpu_backend::MatMul::f"),
        "candle-core-0.11.0/src/cpu_backend/mod.rs",
        1340,
        false,
    ),
    (
        Some("candle_core::storage::Storage::matmul"),
        "candle-core-0.11.0/src/storage.rs",
        690,
        false,
    ),
    (
        Some("candle_core::tensor::Tensor::matmul"),
        "candle-core-0.11.0/src/tensor.rs",
        1210,
        false,
    ),
];

const UNARY: FrameSpec = (
    Some("candle_core::cpu_backend::utils::unary_map"),
    "candle-core-0.11.0/src/cpu_backend/utils.rs",
    20,
    false,
);

/// The stack (innermost first) of the site behind each op of the sample's rows.
fn stack_of(op: Option<&str>) -> Vec<FrameSpec> {
    let block = (
        Some("train_gpt::model::Block::forward"),
        "src/model.rs",
        140,
        false,
    );
    let gpt = (
        Some("train_gpt::model::Gpt::forward"),
        "src/model.rs",
        201,
        false,
    );
    let mut frames: Vec<FrameSpec> = ALLOC.to_vec();
    let mut outer: Vec<FrameSpec> = TRAIN_STEP.to_vec();
    let middle: Vec<FrameSpec> = match op {
        Some("matmul") => {
            let mut v = MATMUL.to_vec();
            v.extend([
                (
                    Some("train_gpt::model::Attention::qkv"),
                    "src/model.rs",
                    61,
                    true,
                ),
                (
                    Some("train_gpt::model::Attention::forward"),
                    "src/model.rs",
                    88,
                    false,
                ),
                block,
                gpt,
            ]);
            v
        }
        Some("softmax") => vec![
            UNARY,
            (
                Some("candle_nn::ops::softmax_last_dim"),
                "candle-nn-0.11.0/src/ops.rs",
                240,
                false,
            ),
            (
                Some("train_gpt::model::Attention::forward"),
                "src/model.rs",
                95,
                false,
            ),
            block,
            gpt,
        ],
        Some("linear") => {
            let mut v = MATMUL.to_vec();
            v.extend([
                (
                    Some("candle_core::tensor::Tensor::broadcast_matmul"),
                    "candle-core-0.11.0/src/tensor.rs",
                    1260,
                    false,
                ),
                (
                    Some("<candle_nn::linear::Linear as candle_core::Module>::forward"),
                    "candle-nn-0.11.0/src/linear.rs",
                    50,
                    false,
                ),
                (
                    Some("train_gpt::model::Mlp::forward"),
                    "src/model.rs",
                    112,
                    false,
                ),
                (
                    Some("train_gpt::model::Block::forward"),
                    "src/model.rs",
                    143,
                    false,
                ),
                gpt,
            ]);
            v
        }
        Some("gelu") => vec![
            UNARY,
            (
                Some("candle_core::tensor::Tensor::gelu"),
                "candle-core-0.11.0/src/tensor.rs",
                560,
                false,
            ),
            (
                Some("train_gpt::model::Mlp::forward"),
                "src/model.rs",
                113,
                false,
            ),
            (
                Some("train_gpt::model::Block::forward"),
                "src/model.rs",
                143,
                false,
            ),
            gpt,
        ],
        Some("embedding") => vec![
            (
                Some("candle_core::cpu_backend::IndexSelect::f"),
                "candle-core-0.11.0/src/cpu_backend/mod.rs",
                610,
                false,
            ),
            (
                Some("candle_core::tensor::Tensor::index_select"),
                "candle-core-0.11.0/src/tensor.rs",
                1480,
                false,
            ),
            (
                Some("<candle_nn::embedding::Embedding as candle_core::Module>::forward"),
                "candle-nn-0.11.0/src/embedding.rs",
                30,
                false,
            ),
            (
                Some("train_gpt::model::Gpt::forward"),
                "src/model.rs",
                190,
                false,
            ),
        ],
        Some("randn") => {
            outer = vec![(Some("train_gpt::main"), "src/main.rs", 31, false)];
            vec![
                (
                    Some("candle_core::cpu_backend::CpuDevice::rand_normal"),
                    "candle-core-0.11.0/src/cpu_backend/mod.rs",
                    2900,
                    false,
                ),
                (
                    Some("candle_core::tensor::Tensor::randn"),
                    "candle-core-0.11.0/src/tensor.rs",
                    420,
                    false,
                ),
                (
                    Some("candle_nn::var_builder::VarBuilder::get_with_hints"),
                    "candle-nn-0.11.0/src/var_builder.rs",
                    200,
                    false,
                ),
                (
                    Some("train_gpt::model::Gpt::new"),
                    "src/model.rs",
                    170,
                    false,
                ),
            ]
        }
        Some(moment @ ("exp_avg" | "exp_avg_sq")) => vec![
            (
                Some("candle_core::tensor::Tensor::zeros_like"),
                "candle-core-0.11.0/src/tensor.rs",
                380,
                false,
            ),
            (
                Some("train_gpt::optim::AdamW::state_for"),
                "src/optim.rs",
                if moment == "exp_avg" { 58 } else { 59 },
                true,
            ),
            (
                Some("train_gpt::optim::AdamW::step"),
                "src/optim.rs",
                77,
                false,
            ),
        ],
        Some("mul") => vec![
            (
                Some("candle_core::cpu_backend::utils::binary_map"),
                "candle-core-0.11.0/src/cpu_backend/utils.rs",
                300,
                false,
            ),
            (
                Some("candle_core::tensor::Tensor::broadcast_mul"),
                "candle-core-0.11.0/src/tensor.rs",
                700,
                false,
            ),
            (
                Some("train_gpt::optim::AdamW::step"),
                "src/optim.rs",
                84,
                false,
            ),
        ],
        Some(_) => {
            let mut v = MATMUL.to_vec();
            v.push((
                Some("candle_core::backprop::<impl candle_core::tensor::Tensor>::backward"),
                "candle-core-0.11.0/src/backprop.rs",
                300,
                false,
            ));
            v
        }
        None => {
            // The data loader's thread, through a C library with no symbols.
            frames = vec![(
                Some("<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem"),
                "/rustc/17067e9ac6d7e98f18d4d9d4fd7a2b9f3e1c0a55/library/alloc/src/vec/spec_from_elem.rs",
                52,
                false,
            )];
            outer = vec![
                (
                    Some("std::sys::backtrace::__rust_begin_short_backtrace"),
                    "",
                    0,
                    false,
                ),
                (
                    Some("std::sys::pal::unix::thread::Thread::new::thread_start"),
                    "",
                    0,
                    false,
                ),
                (Some("start_thread"), "", 0, false),
                (None, "", 0, false),
            ];
            vec![
                (None, "", 0, false),
                (
                    Some("train_gpt::data::Loader::next_batch"),
                    "src/data.rs",
                    77,
                    false,
                ),
                (
                    Some("train_gpt::data::Loader::run"),
                    "src/data.rs",
                    40,
                    false,
                ),
            ]
        }
    };
    frames.extend(middle);
    frames.extend(outer);
    if op.is_some() {
        frames.extend(RUNTIME);
    }
    frames
}

/// A made-up but stable program counter for a function and line, in the program's text.
fn pc_of(function: Option<&str>, line: u32) -> u64 {
    let hash = function
        .unwrap_or("?")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    0x5555_5540_0000 + (hash ^ u64::from(line)) % 0x40_0000
}

/// The frames of `specs`: inlined frames take the program counter of the frame they were
/// inlined into; registry paths are written out in full, as symbolisation finds them.
fn frames_of(specs: &[FrameSpec]) -> Vec<Frame> {
    let mut frames: Vec<Frame> = specs
        .iter()
        .map(|&(function, file, line, inlined)| {
            let mut frame = Frame::default();
            frame.pc = pc_of(function, line);
            frame.function = function.map(String::from);
            frame.file = (!file.is_empty()).then(|| {
                if file.starts_with("candle-") {
                    format!("{REGISTRY}/{file}")
                } else if file.starts_with("src/") {
                    format!("/work/train_gpt/{file}")
                } else {
                    file.to_string()
                }
            });
            frame.line = (line > 0).then_some(line);
            frame.inlined = inlined;
            frame
        })
        .collect();
    for i in (0..frames.len().saturating_sub(1)).rev() {
        if frames[i].inlined {
            frames[i].pc = frames[i + 1].pc;
        }
    }
    frames
}

/// Standard error of the estimated bytes of `count` allocations of `bytes` in all, each
/// sampled with probability `1 - e^(-s/R)` and weighted by its inverse.
fn standard_error(bytes: u64, count: u64) -> u64 {
    if count == 0 {
        return 0;
    }
    let size = bytes as f64 / count as f64;
    let p = 1.0 - (-size / SAMPLE_BYTES as f64).exp();
    (count as f64 * size * size * (1.0 - p) / p).sqrt().round() as u64
}

/// Expected samples among `count` allocations of `bytes` in all.
fn expected_samples(bytes: u64, count: u64) -> u64 {
    if count == 0 {
        return 0;
    }
    let size = bytes as f64 / count as f64;
    (count as f64 * (1.0 - (-size / SAMPLE_BYTES as f64).exp())).round() as u64
}

/// Call sites behind the live-at-peak `rows` (one site per op), plus the AdamW update's
/// temporaries, which are all freed before the peak; links each row to its site.
pub(super) fn call_sites(
    rows: &mut [PeakRow],
    spans: &[SpanMetrics],
) -> (Vec<CallSite>, SiteSampling) {
    let mut tree = Profile::default();
    tree.spans = spans.to_vec();
    let paths = tree.span_paths();
    // A row's span: its path's deepest node in the tree (`init/layer3` is counted in `init`).
    let span_of = |path: &str| -> Option<u32> {
        let mut path = path;
        loop {
            if path.is_empty() {
                return None;
            }
            if let Some(id) = paths.iter().position(|p| p == path) {
                return Some(id as u32);
            }
            path = path.rsplit_once('/').map_or("", |(head, _)| head);
        }
    };
    let unlisted_peak = 3 * MIB;
    let mut sites: Vec<(Option<String>, CallSite)> = Vec::new();
    for row in rows.iter() {
        let (mut peak, mut count) = (row.bytes, row.count);
        if row.op.is_none() {
            // Small blocks, sampled now and then: part of them in sites not listed.
            peak -= unlisted_peak;
            count -= 12;
        }
        let runs = match row.category {
            Category::Parameter | Category::Optimizer => 1,
            Category::Other => 20,
            _ => ITERATIONS,
        };
        let site = match sites.iter_mut().find(|(op, _)| *op == row.op) {
            Some((_, site)) => site,
            None => {
                let frames = frames_of(&stack_of(row.op.as_deref()));
                sites.push((row.op.clone(), {
                    let mut call_site = CallSite::default();
                    call_site.frames = frames;
                    call_site
                }));
                &mut sites.last_mut().unwrap().1
            }
        };
        let span = span_of(&row.span_path);
        let mut share = SiteShare::default();
        share.span = span;
        share.op = row.op.clone();
        share.category = row.category;
        share.peak_bytes = peak;
        share.peak_count = count;
        share.peak_temporary_bytes = 0;
        share.alloc_bytes = peak * runs;
        share.alloc_count = count * runs;
        match site
            .shares
            .iter_mut()
            .find(|s| (s.span, &s.op, s.category) == (span, &share.op, share.category))
        {
            Some(existing) => {
                existing.peak_bytes += share.peak_bytes;
                existing.peak_count += share.peak_count;
                existing.alloc_bytes += share.alloc_bytes;
                existing.alloc_count += share.alloc_count;
            }
            None => site.shares.push(share),
        }
        site.peak_bytes += peak;
        site.peak_count += count;
        site.peak_bytes_error =
            (site.peak_bytes_error.pow(2) + standard_error(peak, count).pow(2)).isqrt();
    }
    // The attention matmul also runs in the backward pass (recomputed), all freed by the
    // peak: seven listed backward shares and the eighth folded into the remainder.
    if let Some((_, site)) = sites
        .iter_mut()
        .find(|(op, _)| op.as_deref() == Some("matmul"))
    {
        let bytes = site.peak_bytes / 8;
        for layer in 0..LAYERS {
            let mut share = SiteShare::default();
            share.span = span_of(&format!("step/backward/layer{layer}"));
            share.op = Some("matmul".to_string());
            share.category = Category::Activation;
            share.peak_bytes = 0;
            share.peak_count = 0;
            share.peak_temporary_bytes = 0;
            share.alloc_bytes = bytes * ITERATIONS;
            share.alloc_count = 2 * ITERATIONS;
            if layer + 1 < LAYERS {
                site.shares.push(share);
            } else {
                site.shares.push({
                    let mut site_share = share;
                    site_share.span = None;
                    site_share.op = None;
                    site_share.category = Category::Other;
                    site_share
                });
            }
        }
    }
    // AdamW's update temporaries: allocated every step, none live at the peak.
    let update = 3 * GIB / 10;
    sites.push((Some("mul".to_string()), {
        let mut call_site = CallSite::default();
        call_site.frames = frames_of(&stack_of(Some("mul")));
        call_site.shares = vec![{
            let mut site_share = SiteShare::default();
            site_share.span = span_of("step/optimizer/adam");
            site_share.op = Some("mul".to_string());
            site_share.category = Category::Optimizer;
            site_share.peak_bytes = 0;
            site_share.peak_count = 0;
            site_share.peak_temporary_bytes = 0;
            site_share.alloc_bytes = update * ITERATIONS;
            site_share.alloc_count = 36 * ITERATIONS;
            site_share
        }];
        call_site
    }));
    let mut sites: Vec<CallSite> = sites.into_iter().map(|(_, site)| site).collect();
    for site in &mut sites {
        site.alloc_bytes = site.shares.iter().map(|s| s.alloc_bytes).sum();
        site.alloc_count = site.shares.iter().map(|s| s.alloc_count).sum();
        site.alloc_bytes_error = standard_error(site.alloc_bytes, site.alloc_count);
        site.samples = expected_samples(site.alloc_bytes, site.alloc_count);
        site.shares.sort_by_key(|s| std::cmp::Reverse(s.peak_bytes));
    }
    sites.sort_by_key(|s| std::cmp::Reverse(s.peak_bytes));
    for (id, site) in sites.iter_mut().enumerate() {
        site.id = id as u32;
    }
    for row in rows.iter_mut() {
        let stack = frames_of(&stack_of(row.op.as_deref()));
        if let Some(site) = sites.iter().find(|s| s.frames == stack) {
            row.top_sites = vec![site.id];
        }
    }
    let mut sampling = SiteSampling::default();
    sampling.mean_bytes = SAMPLE_BYTES;
    sampling.unwinder = "frame-pointers".to_string();
    sampling.samples = sites.iter().map(|s| s.samples).sum::<u64>() + 140;
    sampling.samples_by_unwinder = Default::default();
    sampling.truncated_stacks = 3;
    sampling.stacks_without_hook = 0;
    sampling.max_depth = sites
        .iter()
        .map(|s| s.frames.len() as u32)
        .max()
        .unwrap_or(0);
    sampling.distinct_sites = sites.len() as u64 + 37;
    sampling.unlisted_peak_bytes = unlisted_peak;
    sampling.unlisted_alloc_bytes = 20 * unlisted_peak;
    sampling.symbolize_ns = 48_000_000;
    (sites, sampling)
}
