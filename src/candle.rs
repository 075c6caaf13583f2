//! [candle](https://github.com/huggingface/candle) integration: name the bytes of real
//! `candle_core::Tensor`s.
//!
//! # How candle memory reaches the profile
//!
//! A CPU tensor's storage is a `Vec<T>` allocated through the global allocator, so once
//! [`Alloc`](crate::Alloc) is installed and a [`Session`](crate::Session) records, the heap hook
//! already sees every tensor being created and dropped: its lifetime needs no extra call. What
//! the heap hook cannot know is what the bytes *are*. This module tells it, on top of
//! [the op hooks](crate::ops):
//!
//! - [`op`] runs a candle call as a recorded op: every heap allocation made while it runs is
//!   attributed to the op, and the output's storage is annotated with its shape and dtype, so
//!   live-at-peak rows read `matmul [128, 512] f32`.
//! - [`mark_parameters`] (a whole `VarMap`), [`mark_vars`] and [`set_category`] say outright
//!   that a tensor's storage holds parameters (or any other [`Category`]).
//! - [`TensorInfo`] reads what highwater records about a tensor: id, shape, dtype, device,
//!   bytes and the address of its CPU storage.
//!
//! Everything else comes from [`profile!`](crate::profile!) spans: storage allocated inside a
//! `Step::Forward` span is an activation, inside `Step::Backward` a gradient (candle's
//! `GradStore`), inside `Step::Optimizer` optimizer state. Build the model, the optimizer and
//! the data *after* the session starts: storage allocated before recording began was never seen
//! and appears nowhere.
//!
//! On CUDA (with the `cuda` feature, which records the driver's allocations), the storage of
//! an op's output is found by its device address among the device allocations this thread
//! recorded while the op ran: the newest one of the output's device and byte size. So device
//! rows read `matmul [128, 512] f32 cuda:0` too. A CUDA variable's storage cannot be found
//! after the fact: create the model inside a `Category::Parameter` span (its allocations then
//! take that category), as [`mark_parameters`] cannot mark them. Without the `cuda` feature,
//! [`op`] still attributes the host allocations made during the call, and device storage is
//! not recorded (highwater never invents lifetimes).
//!
//! # Examples
//!
//! ```
//! # fn main() -> candle_core::Result<()> {
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{VarBuilder, VarMap};
//! use highwater::Step;
//!
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//! let fc = candle_nn::linear(4, 3, vb.pp("fc"))?;
//! highwater::candle::mark_parameters(&varmap);
//!
//! let x = Tensor::ones((2, 4), DType::F32, &Device::Cpu)?;
//! let _fwd = highwater::profile!("forward", Step::Forward);
//! let w = fc.weight();
//! let y = highwater::candle::op("matmul", &[&x, w], || x.matmul(&w.t()?))?;
//! assert_eq!(y.dims(), &[2, 3]);
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::hash::{Hash, Hasher};

use candle_core::{CpuStorage, DeviceLocation, Storage, Tensor, TensorId, Var};
use candle_nn::VarMap;

use crate::capture;
use crate::model::Category;
use crate::ops;

/// What highwater records about one candle tensor.
///
/// # Examples
///
/// ```
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Tensor};
///
/// let t = Tensor::zeros((3, 5), DType::F32, &Device::Cpu)?;
/// let info = highwater::candle::TensorInfo::of(&t);
/// assert_eq!(info.shape, &[3, 5]);
/// assert_eq!(info.dtype, "f32");
/// assert_eq!(info.device, "cpu");
/// assert_eq!(info.bytes, 60);
/// assert!(info.storage.is_some());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo<'a> {
    /// candle's `TensorId` as a number (unique per tensor in the process).
    pub id: u64,
    /// Dimensions.
    pub shape: &'a [usize],
    /// Element type (`"f32"`, `"bf16"`, …).
    pub dtype: &'static str,
    /// `"cpu"`, `"cuda:N"` or `"metal:N"`.
    pub device: Cow<'static, str>,
    /// Bytes of the tensor's own elements (element count × element size). A view of a larger
    /// storage reports its own size, not the storage's.
    pub bytes: u64,
    /// Address of the CPU storage buffer: the key of the heap block the allocator hook saw.
    /// `None` off the CPU and for empty storage (which allocates nothing).
    pub storage: Option<u64>,
}

impl<'a> TensorInfo<'a> {
    /// Reads `tensor`'s metadata. Takes the storage's read lock for a moment; allocates only for
    /// the name of a non-CPU device.
    pub fn of(tensor: &'a Tensor) -> TensorInfo<'a> {
        let dtype = tensor.dtype();
        TensorInfo {
            id: tensor_id(tensor.id()),
            shape: tensor.dims(),
            dtype: dtype.as_str(),
            device: device_name(tensor.device().location()),
            bytes: (tensor.elem_count() as u64).saturating_mul(dtype.size_in_bytes() as u64),
            storage: storage_addr(tensor),
        }
    }

    /// The same, as the [`ops::Tensor`] the op hooks take.
    pub fn as_ops(&self) -> ops::Tensor<'_> {
        ops::Tensor {
            id: self.id,
            shape: self.shape,
            dtype: self.dtype,
            device: &self.device,
            bytes: self.bytes,
        }
    }
}

/// Runs `f`, a candle call producing one tensor, as an op named `name`.
///
/// Heap allocations made on this thread while `f` runs are attributed to the op (the output's
/// storage and any temporaries), and so are recorded device allocations. When `f` returns a CPU
/// tensor with storage of its own, that storage is annotated with the output's shape and dtype;
/// a CUDA tensor's storage is found among the device allocations recorded during the call (see
/// the [module docs](self)). When the output shares storage with
/// one of `inputs` — a view such as `reshape`, `t` or `narrow`, or an in-place op — nothing is
/// annotated, so the input keeps its own name.
///
/// Errors from `f` are returned unchanged; highwater adds none.
///
/// # Examples
///
/// ```
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Tensor};
///
/// let a = Tensor::ones((8, 16), DType::F32, &Device::Cpu)?;
/// let b = Tensor::ones((16, 4), DType::F32, &Device::Cpu)?;
/// let c = highwater::candle::op("matmul", &[&a, &b], || a.matmul(&b))?;
/// assert_eq!(c.dims(), &[8, 4]);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// Whatever `f` returns.
pub fn op<F>(name: &str, inputs: &[&Tensor], f: F) -> candle_core::Result<Tensor>
where
    F: FnOnce() -> candle_core::Result<Tensor>,
{
    let guard = ops::op(name);
    let device_allocs = capture::recent::count();
    let output = f()?;
    let info = TensorInfo::of(&output);
    if let Some(addr) = info.storage {
        let is_view = inputs.iter().any(|input| storage_addr(input) == Some(addr));
        if !is_view {
            guard.output(&info.as_ops(), addr);
        }
    } else if info.device != "cpu" && info.bytes > 0 {
        // A view allocates nothing on the device, so it finds nothing here either.
        let device = capture::names::device(&info.device);
        if let Some(addr) = capture::recent::newest_since(device_allocs, device, info.bytes) {
            guard.output(&info.as_ops(), addr);
        }
    }
    Ok(output)
}

/// Marks the storage of every variable in `varmap` as [`Category::Parameter`].
///
/// Call it once the variables exist (after the model is built) while a session records. Var
/// updates through `Var::set` (what candle-nn's optimizers do) copy into the same storage, so
/// the mark holds for the rest of the run; call it again after anything that replaces a
/// variable's storage.
///
/// # Examples
///
/// ```
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device};
/// use candle_nn::{VarBuilder, VarMap};
///
/// let varmap = VarMap::new();
/// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
/// let _layer = candle_nn::linear(16, 8, vb.pp("layer"))?;
/// highwater::candle::mark_parameters(&varmap);
/// # Ok(()) }
/// ```
pub fn mark_parameters(varmap: &VarMap) {
    mark_vars(&varmap.all_vars(), Category::Parameter);
}

/// Marks the storage of each of `vars` as `category`.
///
/// # Examples
///
/// ```
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Var};
/// use highwater::Category;
///
/// let ema = Var::zeros((4, 4), DType::F32, &Device::Cpu)?;
/// highwater::candle::mark_vars(&[ema], Category::Optimizer);
/// # Ok(()) }
/// ```
pub fn mark_vars(vars: &[Var], category: Category) {
    for var in vars {
        set_category(var.as_tensor(), category);
    }
}

/// Says that `tensor`'s storage holds `category` from now on. Does nothing off the CPU, for
/// empty storage, or when no session records.
///
/// # Examples
///
/// ```
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Tensor};
/// use highwater::Category;
///
/// let embeddings = Tensor::zeros((100, 8), DType::F32, &Device::Cpu)?;
/// highwater::candle::set_category(&embeddings, Category::Parameter);
/// # Ok(()) }
/// ```
pub fn set_category(tensor: &Tensor, category: Category) {
    if let Some(addr) = storage_addr(tensor) {
        ops::set_category("cpu", addr, category);
    }
}

/// Address of `tensor`'s CPU storage buffer (the heap block the allocator hook recorded), or
/// `None` off the CPU and for empty storage.
///
/// Tensors that share storage (views, clones, a `Var` and its tensor) have the same address.
///
/// # Examples
///
/// ```
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Tensor};
///
/// let t = Tensor::ones((4, 6), DType::F32, &Device::Cpu)?;
/// let view = t.reshape((6, 4))?;
/// assert!(highwater::candle::storage_addr(&t).is_some());
/// assert_eq!(highwater::candle::storage_addr(&t), highwater::candle::storage_addr(&view));
/// # Ok(()) }
/// ```
pub fn storage_addr(tensor: &Tensor) -> Option<u64> {
    let (storage, _layout) = tensor.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => cpu_buffer(cpu),
        _ => None,
    }
}

/// Start of the `Vec` behind a CPU storage; `None` when it holds nothing (no heap block).
fn cpu_buffer(storage: &CpuStorage) -> Option<u64> {
    fn start<T>(data: &[T]) -> Option<u64> {
        (!data.is_empty() && std::mem::size_of::<T>() > 0).then_some(data.as_ptr() as u64)
    }
    match storage {
        CpuStorage::U8(v) => start(v),
        CpuStorage::U32(v) => start(v),
        CpuStorage::I16(v) => start(v),
        CpuStorage::I32(v) => start(v),
        CpuStorage::I64(v) => start(v),
        CpuStorage::BF16(v) => start(v),
        CpuStorage::F16(v) => start(v),
        CpuStorage::F32(v) => start(v),
        CpuStorage::F64(v) => start(v),
        CpuStorage::F8E4M3(v) => start(v),
        CpuStorage::F6E2M3(v) => start(v),
        CpuStorage::F6E3M2(v) => start(v),
        CpuStorage::F4(v) => start(v),
        CpuStorage::F8E8M0(v) => start(v),
    }
}

fn device_name(location: DeviceLocation) -> Cow<'static, str> {
    match location {
        DeviceLocation::Cpu => Cow::Borrowed("cpu"),
        DeviceLocation::Cuda { gpu_id } => Cow::Owned(format!("cuda:{gpu_id}")),
        DeviceLocation::Metal { gpu_id } => Cow::Owned(format!("metal:{gpu_id}")),
    }
}

/// candle's `TensorId` keeps its counter private; its derived `Hash` writes exactly that one
/// `usize`, which this hasher keeps.
fn tensor_id(id: TensorId) -> u64 {
    #[derive(Default)]
    struct Capture(u64);
    impl Hasher for Capture {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for &byte in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(byte);
            }
        }
        fn write_usize(&mut self, value: usize) {
            self.0 = value as u64;
        }
    }
    let mut capture = Capture::default();
    id.hash(&mut capture);
    capture.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn info_reads_shape_dtype_bytes_and_storage() {
        let t = Tensor::zeros((2, 3, 4), DType::BF16, &Device::Cpu).unwrap();
        let info = TensorInfo::of(&t);
        assert_eq!(info.shape, &[2, 3, 4]);
        assert_eq!(info.dtype, "bf16");
        assert_eq!(info.bytes, 48);
        assert_eq!(info.as_ops().device, "cpu");
        assert_eq!(info.storage, storage_addr(&t));
    }

    #[test]
    fn tensor_ids_are_distinct_small_counters() {
        let a = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        let b = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        let (ia, ib) = (TensorInfo::of(&a).id, TensorInfo::of(&b).id);
        assert_ne!(ia, ib);
        assert!(ia > 0 && ia < 1 << 40, "{ia}");
        assert_eq!(
            TensorInfo::of(&a.clone()).id,
            ia,
            "a clone is the same tensor"
        );
    }

    #[test]
    fn views_share_storage_and_new_outputs_do_not() {
        let a = Tensor::ones((4, 4), DType::F32, &Device::Cpu).unwrap();
        let view = op("t", &[&a], || a.t()).unwrap();
        assert_eq!(storage_addr(&view), storage_addr(&a));
        let sum = op("add", &[&a], || &a + &a).unwrap();
        assert_ne!(storage_addr(&sum), storage_addr(&a));
    }

    #[test]
    fn empty_storage_has_no_address() {
        let empty = Tensor::zeros((0, 3), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(storage_addr(&empty), None);
    }
}
