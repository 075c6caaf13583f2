//! Op hooks join the heap stream: bytes allocated inside a recorded op are attributed to it at
//! the peak, the output annotation adds shape and dtype, device tensors appear on their device,
//! and `set_category` moves live bytes between categories.

use highwater::ops::{self, Tensor};
use highwater::{Category, Session, Step};

use highwater_testkit::child::isolated;

const MIB: usize = 1 << 20;

#[test]
fn allocations_inside_an_op_name_it_at_the_peak() {
    isolated("allocations_inside_an_op_name_it_at_the_peak", || {
        let session = Session::builder().write_profile(false).start().unwrap();
        let (output, weights) = {
            let _fwd = highwater::profile!("forward", Step::Forward);
            let weights = vec![1.0f32; MIB / 4];
            ops::set_category("cpu", weights.as_ptr() as u64, Category::Parameter);
            let matmul = ops::op("matmul");
            let output = vec![0.5f32; 2 * MIB / 4];
            matmul.output(
                &Tensor {
                    id: 1,
                    shape: &[512, 256],
                    dtype: "f32",
                    device: "cpu",
                    bytes: (2 * MIB) as u64,
                },
                output.as_ptr() as u64,
            );
            let gpu = Tensor {
                id: 42,
                shape: &[1024, 1024],
                dtype: "bf16",
                device: "cuda:0",
                bytes: 2 * MIB as u64 * 4,
            };
            let conv = ops::op("conv2d");
            ops::tensor_alloc(&gpu, None);
            conv.output(&gpu, gpu.id);
            (output, weights)
        };
        let profile = session.finish().unwrap();
        drop((output, weights));

        let matmul: Vec<_> = profile
            .peak_breakdown
            .iter()
            .filter(|row| row.op.as_deref() == Some("matmul"))
            .collect();
        assert_eq!(matmul.len(), 1, "{:#?}", profile.peak_breakdown);
        assert_eq!(matmul[0].bytes, 2 * MIB as u64);
        assert_eq!(matmul[0].shape.as_deref(), Some(&[512u64, 256][..]));
        assert_eq!(matmul[0].dtype.as_deref(), Some("f32"));
        assert_eq!(matmul[0].span_path, "forward");
        assert_eq!(matmul[0].category, Category::Activation);

        let params: u64 = profile
            .peak_breakdown
            .iter()
            .filter(|row| row.category == Category::Parameter && row.device == "cpu")
            .map(|row| row.bytes)
            .sum();
        assert_eq!(
            params, MIB as u64,
            "set_category moved the weights to parameters"
        );

        let cuda = profile
            .devices
            .iter()
            .find(|d| d.device == "cuda:0")
            .expect("a cuda:0 device row");
        assert_eq!(cuda.peak_bytes, 8 * MIB as u64);
        assert_eq!(cuda.final_live_bytes, 8 * MIB as u64);
        let conv = profile
            .largest_at_peak
            .iter()
            .find(|a| a.device == "cuda:0")
            .expect("the device tensor is live at the peak");
        assert_eq!(conv.op.as_deref(), Some("conv2d"));
        assert_eq!(conv.category, Category::Activation);
    });
}

#[test]
fn hooks_do_nothing_without_a_session() {
    isolated("hooks_do_nothing_without_a_session", || {
        let t = Tensor {
            id: 1,
            shape: &[2],
            dtype: "f32",
            device: "tpu:0",
            bytes: 8,
        };
        let guard = ops::op("noop");
        ops::tensor_alloc(&t, Some(Category::Gradient));
        guard.output(&t, 1);
        ops::tensor_free("tpu:0", 1, 8);
    });
}
