//! `highwater::candle::op` joins a real candle op to the heap stream: the op's output storage,
//! live at the peak, is reported under the op's name with the output's shape and dtype; a view
//! made through `op` does not rename the storage it shares.

use candle_core::{DType, Device, Tensor};
use highwater::{Category, Session, Step};

use highwater_testkit::child::isolated;

#[test]
fn candle_op_output_is_named_at_the_peak() {
    isolated("candle_op_output_is_named_at_the_peak", || {
        let session = Session::builder().write_profile(false).start().unwrap();
        let a = Tensor::ones((64, 32), DType::F32, &Device::Cpu).unwrap();
        let b = Tensor::ones((32, 128), DType::F32, &Device::Cpu).unwrap();
        let (product, view) = {
            let _fwd = highwater::profile!("forward", Step::Forward);
            let product = highwater::candle::op("matmul", &[&a, &b], || a.matmul(&b)).unwrap();
            let view = highwater::candle::op("reshape", &[&product], || product.reshape((128, 64)))
                .unwrap();
            (product, view)
        };
        let profile = session.finish().unwrap();

        let matmul: Vec<_> = profile
            .peak_breakdown
            .iter()
            .filter(|r| r.op.as_deref() == Some("matmul") && r.shape.is_some())
            .collect();
        assert_eq!(matmul.len(), 1, "{:#?}", profile.peak_breakdown);
        assert_eq!(matmul[0].shape.as_deref(), Some(&[64u64, 128][..]));
        assert_eq!(matmul[0].dtype.as_deref(), Some("f32"));
        assert_eq!(matmul[0].category, Category::Activation);
        assert_eq!(matmul[0].span_path, "forward");
        assert_eq!(matmul[0].bytes, 64 * 128 * 4);
        assert!(
            !profile
                .peak_breakdown
                .iter()
                .any(|r| r.op.as_deref() == Some("reshape") && r.shape.is_some()),
            "the view did not rename the matmul's storage: {:#?}",
            profile.peak_breakdown
        );
        drop((product, view, a, b));
    });
}
