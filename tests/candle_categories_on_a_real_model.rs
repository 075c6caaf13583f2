//! On a small real candle model trained with AdamW, the bytes live at the peak come out as what
//! they are: parameters equal to the variables' storage (updated in place, so still parameters
//! after the optimizer ran), AdamW's two moments as optimizer state, activations attributed to
//! `forward` and gradients to `backward`; candle ops recorded with `highwater::candle::op` name
//! their output shape in the live-at-peak rows. At the peak, the optimizer's bytes split into
//! state (the moments, 2x the parameters) and the update's temporaries, and the call sites
//! (every allocation's stack recorded) name the code behind each, as `train_mlp` prints it.
#![cfg(feature = "candle")]

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{AdamW, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use highwater::{Category, Profile, Session, Step};

use highwater_testkit::peak_sites::{self as sites, places_holding, sites_holding, Part};

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

const WIDTHS: [usize; 3] = [64, 48, 10];
const BATCH: usize = 32;

struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            let w = layer.weight();
            let z = highwater::candle::op("matmul", &[&h, w], || h.matmul(&w.t()?))?;
            let b = layer.bias().expect("linear has a bias");
            h = highwater::candle::op("bias_add", &[&z, b], || z.broadcast_add(b))?;
            if i + 1 < self.layers.len() {
                h = highwater::candle::op("relu", &[&h], || h.relu())?;
            }
        }
        Ok(h)
    }
}

struct Trained {
    profile: Profile,
    /// Bytes of every variable's storage.
    var_bytes: u64,
    /// Whether each variable's storage address was the same after training as before.
    storage_kept: bool,
}

/// Trains for `steps` steps.
fn train(steps: usize) -> Trained {
    // Every allocation's stack: the sites' figures are exact, to compare with the summary's.
    let session = Session::builder()
        .write_profile(false)
        .sample_bytes(1)
        .start()
        .unwrap();
    let device = Device::Cpu;
    let x = Tensor::randn(0f32, 1f32, (BATCH, WIDTHS[0]), &device).unwrap();
    let labels = Tensor::randn(0f32, 1f32, (BATCH, WIDTHS[2]), &device)
        .unwrap()
        .argmax(D::Minus1)
        .unwrap();
    let varmap = VarMap::new();
    let model = {
        let _build = highwater::profile!("build_model");
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        let layers = (0..WIDTHS.len() - 1)
            .map(|i| candle_nn::linear(WIDTHS[i], WIDTHS[i + 1], vb.pp(format!("l{i}"))))
            .collect::<candle_core::Result<_>>()
            .unwrap();
        Mlp { layers }
    };
    highwater::candle::mark_parameters(&varmap);
    let var_bytes: u64 = varmap
        .all_vars()
        .iter()
        .map(|v| (v.elem_count() * v.dtype().size_in_bytes()) as u64)
        .sum();
    let addrs = |varmap: &VarMap| -> Vec<Option<u64>> {
        let mut vars = varmap
            .data()
            .lock()
            .unwrap()
            .clone()
            .into_iter()
            .collect::<Vec<_>>();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars.iter()
            .map(|(_, v)| highwater::candle::storage_addr(v.as_tensor()))
            .collect()
    };
    let before = addrs(&varmap);
    {
        // gemm keeps a per-thread packing buffer (L2-cache sized) from its first use on; let
        // it be allocated here, as what it is, rather than in the first backward.
        let _warmup = highwater::profile!("runtime_warmup", Category::Other);
        let loss = candle_nn::loss::cross_entropy(&model.forward(&x).unwrap(), &labels).unwrap();
        drop(loss.backward().unwrap());
    }
    let mut optimizer = {
        let _init = highwater::profile!("optimizer_init", Step::Optimizer);
        AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap()
    };
    for _ in 0..steps {
        let _step = highwater::profile!("train_step");
        let loss = {
            let _fwd = highwater::profile!("forward", Step::Forward);
            let logits = model.forward(&x).unwrap();
            candle_nn::loss::cross_entropy(&logits, &labels).unwrap()
        };
        let grads = {
            let _bwd = highwater::profile!("backward", Step::Backward);
            loss.backward().unwrap()
        };
        let _opt = highwater::profile!("optimizer", Step::Optimizer);
        optimizer.step(&grads).unwrap();
    }
    let profile = session.finish().unwrap();
    let storage_kept = addrs(&varmap) == before && before.iter().all(Option::is_some);
    drop((model, optimizer, varmap, x, labels));
    Trained {
        profile,
        var_bytes,
        storage_kept,
    }
}

/// The one training run both tests read (a process runs one session at a time).
fn trained() -> &'static Trained {
    static TRAINED: std::sync::OnceLock<Trained> = std::sync::OnceLock::new();
    TRAINED.get_or_init(|| train(3))
}

fn at_peak(profile: &Profile, category: Category) -> u64 {
    profile
        .summary
        .peak_by_category
        .get(&category)
        .copied()
        .unwrap_or(0)
}

#[test]
fn parameters_optimizer_state_activations_and_gradients_at_the_peak() {
    let trained = trained();
    let (profile, var_bytes, storage_kept) =
        (&trained.profile, trained.var_bytes, trained.storage_kept);
    let context = format!(
        "var bytes {var_bytes}, at peak {:?}, temporary {:?}\n{:#?}",
        profile.summary.peak_by_category,
        profile.summary.peak_temporary_by_category,
        profile.peak_breakdown
    );
    let rows = |category: Category, span: &str| -> u64 {
        profile
            .peak_breakdown
            .iter()
            .filter(|r| r.category == category && r.span_path == span)
            .map(|r| r.bytes)
            .sum()
    };

    // `Var::set` (what AdamW's update calls) copies into the existing storage: the variables
    // never moved, and exactly their storage is parameter at the peak, from `build_model`.
    assert!(storage_kept, "a variable's storage was replaced");
    let params = at_peak(profile, Category::Parameter);
    assert_eq!(params, var_bytes, "parameters: {context}");
    assert_eq!(rows(Category::Parameter, "build_model"), var_bytes);

    // AdamW's state: two moments per variable, allocated when the optimizer is built, plus a
    // little bookkeeping (its Vec, the Vars' Arcs and locks).
    let state = rows(Category::Optimizer, "optimizer_init");
    assert!(
        state >= 2 * var_bytes && state <= 2 * var_bytes + 4096,
        "optimizer state: {context}"
    );
    // The peak falls inside the update, so the update's temporaries are optimizer bytes too.
    assert!(at_peak(profile, Category::Optimizer) >= state);

    // State vs temporary: what the update allocates it frees before its span exits, so the
    // optimizer bytes at the peak that outlived their span are exactly the moments (and that
    // bookkeeping): 2x the parameters. Nothing of the parameters is temporary.
    let temporary = |category: Category| -> u64 {
        profile
            .summary
            .peak_temporary_by_category
            .get(&category)
            .copied()
            .unwrap_or(0)
    };
    for (category, bytes) in &profile.summary.peak_temporary_by_category {
        assert!(
            *bytes <= at_peak(profile, *category),
            "{category}: {context}"
        );
    }
    let optimizer_state = at_peak(profile, Category::Optimizer) - temporary(Category::Optimizer);
    assert!(
        optimizer_state >= 2 * var_bytes && optimizer_state <= 2 * var_bytes + 4096,
        "optimizer state {optimizer_state}, temporaries {}: {context}",
        temporary(Category::Optimizer)
    );
    assert_eq!(
        optimizer_state, state,
        "state is what optimizer_init left: {context}"
    );
    assert!(
        temporary(Category::Optimizer) > 0,
        "no update temporaries: {context}"
    );
    assert_eq!(temporary(Category::Parameter), 0, "{context}");

    // Forward made activations, backward made gradients, each under its own span. At the peak
    // the gradient store holds at least one gradient per variable.
    let activations = rows(Category::Activation, "train_step/forward");
    let gradients = rows(Category::Gradient, "train_step/backward");
    assert!(activations > 0, "activations: {context}");
    assert!(gradients >= var_bytes, "gradients: {context}");
    assert_eq!(at_peak(profile, Category::Gradient), gradients);

    // The forward's matmul outputs are named with their shape and dtype.
    let matmul = profile
        .peak_breakdown
        .iter()
        .find(|r| r.op.as_deref() == Some("matmul") && r.shape.is_some())
        .unwrap_or_else(|| panic!("no named matmul row: {context}"));
    assert_eq!(matmul.span_path, "train_step/forward");
    assert_eq!(matmul.dtype.as_deref(), Some("f32"));
    let shapes: Vec<_> = profile
        .peak_breakdown
        .iter()
        .filter(|r| r.op.as_deref() == Some("matmul"))
        .filter_map(|r| r.shape.clone())
        .collect();
    assert!(
        shapes.contains(&vec![BATCH as u64, WIDTHS[1] as u64]),
        "matmul shapes {shapes:?}: {context}"
    );

    for span in [
        "train_step/forward",
        "train_step/backward",
        "train_step/optimizer",
    ] {
        let metrics = profile
            .spans
            .iter()
            .find(|s| profile.span_path(s.id) == span)
            .unwrap_or_else(|| panic!("span {span}: {context}"));
        assert_eq!(metrics.calls, 3);
        assert!(metrics.bytes_allocated > 0, "{span} allocated nothing");
    }
}

/// Whether one of `site`'s frames is in a function whose name has every one of `parts`.
fn passes_through(site: &highwater::profile::CallSite, parts: &[&str]) -> bool {
    site.frames.iter().any(|frame| {
        frame
            .function
            .as_deref()
            .is_some_and(|name| parts.iter().all(|part| name.contains(part)))
    })
}

#[test]
fn the_optimizer_state_and_the_update_temporaries_each_have_a_named_call_site() {
    let profile = &trained().profile;
    let summary = &profile.summary;
    let optimizer = summary.peak_by_category[&Category::Optimizer];
    let temporary = summary.peak_temporary_by_category[&Category::Optimizer];
    let state_sites = sites_holding(profile, Category::Optimizer, Part::State);
    let temporary_sites = sites_holding(profile, Category::Optimizer, Part::Temporary);
    let context = format!(
        "optimizer {optimizer} at the peak, {temporary} temporary; sampling {:?}\n{:#?}",
        profile.sampling,
        profile.sites.iter().take(12).collect::<Vec<_>>()
    );
    let sum = |held: &[sites::SiteBytes]| held.iter().map(|h| h.bytes).sum::<u64>();
    // Every allocation sampled: the sites' split is the summary's, to the byte.
    assert_eq!(sum(&state_sites), optimizer - temporary, "{context}");
    assert_eq!(sum(&temporary_sites), temporary, "{context}");

    // The moments are made by AdamW::new, the temporaries by its step. Candle is built
    // without line tables, so its frames name their function only; the file:line is that of
    // this file's training loop, which called them. That is what the example prints for each.
    let state = state_sites.first().expect("a state site").site;
    let update = temporary_sites.first().expect("a temporary site").site;
    assert_ne!(state.id, update.id);
    assert!(passes_through(state, &["AdamW", "new"]), "{context}");
    assert!(passes_through(update, &["AdamW", "step"]), "{context}");
    let in_this_file = |named: &sites::Named| {
        named
            .location
            .as_deref()
            .is_some_and(|at| at.contains("candle_categories_on_a_real_model.rs:"))
    };
    for part in [Part::State, Part::Temporary] {
        let places = places_holding(profile, Category::Optimizer, part);
        let top = places
            .first()
            .unwrap_or_else(|| panic!("{part:?}: {context}"));
        // The place holding the most is AdamW's: `new` for the state, `step` for the
        // temporaries. (Not necessarily the place of the single largest site: several sites of
        // equal bytes, told apart by their addresses, can make another place larger.)
        let made_by = match part {
            Part::State => ["AdamW", "new"],
            Part::Temporary => ["AdamW", "step"],
        };
        assert!(
            top.sites.iter().any(|&id| profile
                .sites
                .iter()
                .any(|site| site.id == id && passes_through(site, &made_by))),
            "{part:?}: places {places:#?}"
        );
        let at = top.at.as_ref().expect("a site with frames");
        let function = &at.allocated_in.function;
        assert!(
            !function.starts_with("0x") && !function.starts_with("alloc::"),
            "{part:?} in {at}: {context}"
        );
        assert!(
            in_this_file(&at.allocated_in) || at.called_from.as_ref().is_some_and(in_this_file),
            "{part:?} in {at}: {context}"
        );
    }
}
