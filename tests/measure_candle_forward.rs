//! One forward pass of the candle MLP the examples train (784→512→512→10, f32), measured with
//! `highwater::measure`: the bytes it leaves live are the activations the layer shapes give,
//! batch × width × 4 bytes for each output autograd keeps, plus bookkeeping that does not
//! depend on the batch.
#![cfg(feature = "candle")]

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use highwater::Measurement;

use highwater_testkit::mlp;

use mlp::{Mlp, WIDTHS};

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

/// Bytes of the activations one forward pass keeps for backward: each layer's matmul and
/// bias-add outputs, and the ReLU output of every hidden layer (the weights are variables,
/// so each output holds its inputs), `batch` × width f32 values each.
fn activation_bytes(batch: usize) -> u64 {
    let layers = WIDTHS.len() - 1;
    let per_row: usize = WIDTHS[1..]
        .iter()
        .enumerate()
        .map(|(layer, &width)| {
            let outputs = if layer + 1 < layers { 3 } else { 2 };
            outputs * width * size_of::<f32>()
        })
        .sum();
    (batch * per_row) as u64
}

/// Measures the second forward pass at `batch` (the first fills gemm's per-thread buffers).
fn forward(batch: usize) -> Measurement {
    let device = Device::Cpu;
    let varmap = VarMap::new();
    let model = Mlp::new(&VarBuilder::from_varmap(&varmap, DType::F32, &device)).unwrap();
    let x = Tensor::randn(0f32, 1f32, (batch, WIDTHS[0]), &device).unwrap();
    drop(model.forward(&x).unwrap());
    let ((logits, _first_hidden), m) = highwater::measure(|| {
        let _fwd = highwater::profile!("forward", highwater::Step::Forward);
        model.forward(&x).unwrap()
    });
    assert_eq!(logits.dims(), [batch, WIDTHS[3]]);
    m
}

#[test]
fn one_forward_pass_leaves_the_activations_the_layer_shapes_give() {
    let small = forward(64);
    let full = forward(mlp::BATCH);
    assert_eq!(
        activation_bytes(mlp::BATCH),
        1_583_104,
        "128 × 4 × (3·512 + 3·512 + 2·10)"
    );

    // Exactly the activations scale with the batch: the difference between two batch sizes
    // is the activation bytes of the difference, to the byte.
    assert_eq!(
        full.leaked_bytes - small.leaked_bytes,
        activation_bytes(mlp::BATCH - 64),
        "{small:#?}\n{full:#?}"
    );
    // The rest is the tensors' bookkeeping (Arcs, shapes, strides, graph nodes): the same
    // blocks at any batch size, and small.
    let bookkeeping = full.leaked_bytes - activation_bytes(mlp::BATCH);
    assert_eq!(small.leaked_bytes - activation_bytes(64), bookkeeping);
    assert_eq!(small.leaked_blocks, full.leaked_blocks);
    assert!(bookkeeping < 16 * 1024, "bookkeeping {bookkeeping} bytes");
    eprintln!(
        "FIGURES batch {}: activations {} bytes, bookkeeping {bookkeeping} bytes in {} blocks, \
         peak {} bytes",
        mlp::BATCH,
        activation_bytes(mlp::BATCH),
        full.leaked_blocks,
        full.peak_bytes
    );

    // The peak holds every activation at once, plus the pass's short-lived temporaries.
    assert!(full.peak_bytes >= full.leaked_bytes);
    highwater::assert_peak_below!(full, activation_bytes(mlp::BATCH) + 64 * 1024);
    // It is all under the span the closure opened.
    assert_eq!(full.spans.len(), 1);
    assert_eq!(full.spans[0].path, "forward");
    assert_eq!(full.spans[0].leaked_bytes, full.leaked_bytes);

    // And the same pass measures the same again.
    assert_eq!(forward(mlp::BATCH), full);
}
