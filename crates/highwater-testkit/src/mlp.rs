//! The MLP and data the training examples share: `train_mlp` runs it under highwater,
//! `train_mlp_dhat` under dhat, so both time the same steps.

use candle_core::{Device, Tensor, D};
use candle_nn::{Linear, VarBuilder};

/// Layer widths, input first.
pub const WIDTHS: [usize; 4] = [784, 512, 512, 10];
/// Samples per batch.
pub const BATCH: usize = 128;
/// Batches in the synthetic data set; steps cycle through them.
pub const BATCHES: usize = 8;
/// Op names per layer: matmul, bias add, activation.
pub const OPS: [[&str; 3]; 3] = [
    ["fc1.matmul", "fc1.bias_add", "fc1.relu"],
    ["fc2.matmul", "fc2.bias_add", "fc2.relu"],
    ["fc3.matmul", "fc3.bias_add", "fc3.relu"],
];

/// Three linear layers with ReLU between them.
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    /// The layers, their variables made through `vb`.
    pub fn new(vb: &VarBuilder) -> candle_core::Result<Mlp> {
        let layers = (0..WIDTHS.len() - 1)
            .map(|i| candle_nn::linear(WIDTHS[i], WIDTHS[i + 1], vb.pp(format!("fc{}", i + 1))))
            .collect::<candle_core::Result<_>>()?;
        Ok(Mlp { layers })
    }

    /// Logits, and the first hidden activation (what `--leak` keeps).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        let mut h = x.clone();
        let mut first_hidden = None;
        let last = self.layers.len() - 1;
        for (i, layer) in self.layers.iter().enumerate() {
            let [matmul, bias_add, relu] = OPS[i];
            let w = layer.weight();
            let z = highwater::candle::op(matmul, &[&h, w], || h.matmul(&w.t()?))?;
            h = match layer.bias() {
                Some(b) => highwater::candle::op(bias_add, &[&z, b], || z.broadcast_add(b))?,
                None => z,
            };
            if i < last {
                h = highwater::candle::op(relu, &[&h], || h.relu())?;
                first_hidden.get_or_insert_with(|| h.clone());
            }
        }
        let first_hidden = first_hidden.unwrap_or_else(|| h.clone());
        Ok((h, first_hidden))
    }
}

/// Inputs uniform in [-1, 1), labels from a fixed random linear "teacher", so the loss has
/// something to learn. Seeded, so every run trains on the same data.
pub fn synthetic_data(device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                // xorshift64*: plenty for synthetic data.
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let bits = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
                bits as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    };
    let (n, d, k) = (BATCHES * BATCH, WIDTHS[0], WIDTHS[3]);
    let x = Tensor::from_vec(uniform(n * d), (n, d), device)?;
    let teacher = Tensor::from_vec(uniform(d * k), (d, k), device)?;
    let labels = x.matmul(&teacher)?.argmax(D::Minus1)?;
    Ok((x, labels))
}
