//! Op and tensor hooks: name what the bytes are.
//!
//! The allocator hook sees sizes and addresses; these hooks say what they are. They write into
//! the same event stream, from any thread, and are cheap: names, shapes and devices are interned
//! once (a short lock, outside the allocator) and events carry their ids.
//!
//! - [`op`] marks an op while it runs: heap allocations made until the [`OpGuard`] ends are
//!   attributed to it, so live-at-peak rows name the op. [`OpGuard::output`] then names the
//!   output block with its shape and dtype.
//! - [`tensor_alloc`] and [`tensor_free`] record memory the heap hook cannot see: device tensors
//!   (`cuda:0`, `tpu:3`, …), keyed by tensor id.
//! - [`set_category`] says outright what a live block is, for example that a tensor's storage
//!   holds parameters.
//!
//! CPU tensors need none of the alloc/free calls: their storage lifetimes come from the
//! allocator hook. Everything here does nothing when no session records.
//!
//! # Examples
//!
//! ```
//! use highwater::ops::{self, Tensor};
//! use highwater::Category;
//!
//! // A device tensor: 1 MiB of activations on cuda:0.
//! let t = Tensor { id: 7, shape: &[512, 512], dtype: "f32", device: "cuda:0", bytes: 1 << 20 };
//! {
//!     let matmul = ops::op("matmul");
//!     ops::tensor_alloc(&t, None);
//!     matmul.output(&t, t.id);
//! }
//! ops::set_category("cuda:0", t.id, Category::Activation);
//! ops::tensor_free("cuda:0", t.id, t.bytes);
//! ```

use std::marker::PhantomData;

use crate::capture::{self, names};
use crate::model::Category;

/// What an op hook knows about a tensor.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    /// A stable id for the tensor (candle's `TensorId`, a counter, …).
    pub id: u64,
    /// Dimensions.
    pub shape: &'a [usize],
    /// Element type name (`"f32"`, `"bf16"`, …).
    pub dtype: &'a str,
    /// Device name: `"cpu"` for host memory, else e.g. `"cuda:0"`, `"tpu:3"`.
    pub device: &'a str,
    /// Bytes of storage.
    pub bytes: u64,
}

/// An op being recorded on this thread; ends when dropped.
///
/// Heap allocations made on this thread while the guard lives are attributed to the op. A guard
/// belongs to the session that was recording when it began: dropped (or given an output) in a
/// later session, it does nothing, so it cannot end that session's op.
#[must_use = "the op ends as soon as the guard is dropped"]
#[derive(Debug)]
pub struct OpGuard {
    name: u32,
    /// The gate opening (session) the op began in: a guard outliving it must not end an op of
    /// a later one.
    epoch: u32,
    /// Ops nest per thread, like spans.
    _not_send: PhantomData<*const ()>,
}

/// Starts recording an op named `name` on this thread.
pub fn op(name: &str) -> OpGuard {
    let epoch = capture::gate::epoch();
    let name = if capture::recording() {
        let id = names::name(name);
        capture::record_op_begin(id);
        id
    } else {
        u32::MAX
    };
    OpGuard {
        name,
        epoch,
        _not_send: PhantomData,
    }
}

impl OpGuard {
    /// Names the op's output and ends the op. `key` identifies the output's block: the address
    /// of its storage for a CPU tensor (the allocation the heap hook saw), its device address for
    /// a CUDA tensor whose allocation the driver's callback recorded (the `cuda` feature), its
    /// tensor id for a device tensor recorded with [`tensor_alloc`].
    pub fn output(self, tensor: &Tensor<'_>, key: u64) {
        if self.in_its_session() {
            capture::record_annotation(
                names::device(tensor.device),
                key,
                self.name,
                names::shape(tensor.shape),
                Some(names::name(tensor.dtype)),
            );
        }
    }
}

impl OpGuard {
    /// Whether the op was recorded and its session is still the one recording.
    fn in_its_session(&self) -> bool {
        self.name != u32::MAX && capture::recording() && capture::gate::epoch() == self.epoch
    }
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        if self.in_its_session() {
            capture::record_op_end();
        }
    }
}

/// Records a tensor's storage becoming live on a device the heap hook cannot see, keyed by
/// its id. Its category is `category`, else the one the open spans give.
pub fn tensor_alloc(tensor: &Tensor<'_>, category: Option<Category>) {
    if !capture::recording() {
        return;
    }
    let category = category.unwrap_or_else(capture::scope_category);
    capture::record_device_alloc(
        names::device(tensor.device),
        tensor.id,
        tensor.bytes,
        category as u8,
    );
}

/// Records the death of a tensor recorded with [`tensor_alloc`].
pub fn tensor_free(device: &str, id: u64, bytes: u64) {
    if capture::recording() {
        capture::record_device_free(names::device(device), id, bytes);
    }
}

/// Says that the live block `key` on `device` (a storage address on `"cpu"`, a tensor id
/// elsewhere) holds `category` from now on.
pub fn set_category(device: &str, key: u64, category: Category) {
    if capture::recording() {
        capture::record_set_category(names::device(device), key, category as u8);
    }
}
