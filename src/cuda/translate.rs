//! From one CUPTI callback record to what it means for memory: a pure function.
//!
//! CUPTI calls back twice per driver call, on entry and on exit, with the call's parameter
//! block. Allocations are read on exit (the pointer exists, the result is known); frees,
//! unmaps and releases on entry, before the memory can be handed to another thread, as the
//! allocator hook records a `dealloc` before freeing. [`translate`] reads the parameter block of
//! the calls below and nothing else; it takes no lock, allocates nothing and calls nothing.
//!
//! | call | site | becomes |
//! |---|---|---|
//! | `cuMemAlloc_v2`, `cuMemAllocPitch_v2` (pitch × height), `cuMemAllocManaged` | exit | [`Call::Alloc`] on the context's device |
//! | `cuMemAllocAsync`, `cuMemAllocFromPoolAsync` (and `_ptsz`) | exit | [`Call::Alloc`], stream-ordered (the pool's reserved bytes follow) |
//! | `cuMemFree_v2`, `cuMemFreeAsync` (and `_ptsz`) | entry | [`Call::Free`] |
//! | `cuMemAllocHost_v2`, `cuMemHostAlloc` / `cuMemFreeHost` | exit / entry | [`Call::Alloc`] / [`Call::Free`] of pinned host memory |
//! | `cuMemCreate` | exit | [`Call::Alloc`] of physical memory on the device its properties name, keyed by handle |
//! | `cuMemMap` / `cuMemUnmap` / `cuMemRelease` | exit / entry / entry | [`Call::Map`] / [`Call::Unmap`] / [`Call::Release`] |
//! | any allocation above that returns `CUDA_ERROR_OUT_OF_MEMORY` | exit | [`Call::OutOfMemory`] with the request |
//! | `cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize` | exit | [`Call::Synchronized`]: pools may have shrunk |
//!
//! A failed allocation for another reason is nothing: no memory changed hands.

use cudarc::cupti::sys::{
    cuMemAllocAsync_params_st, cuMemAllocAsync_ptsz_params_st, cuMemAllocFromPoolAsync_params_st,
    cuMemAllocFromPoolAsync_ptsz_params_st, cuMemAllocHost_v2_params_st,
    cuMemAllocManaged_params_st, cuMemAllocPitch_v2_params_st, cuMemAlloc_v2_params_st,
    cuMemCreate_params_st, cuMemFreeAsync_params_st, cuMemFreeAsync_ptsz_params_st,
    cuMemFreeHost_params_st, cuMemFree_v2_params_st, cuMemHostAlloc_params_st, cuMemMap_params_st,
    cuMemRelease_params_st, cuMemUnmap_params_st, CUpti_ApiCallbackSite, CUpti_CallbackData,
    CUpti_driver_api_trace_cbid as Cbid,
};
use cudarc::driver::sys::CUmemLocationType;

use crate::capture::raw::PHYSICAL_KEY;

/// The driver's result code for an allocation that did not fit.
pub(crate) const OUT_OF_MEMORY: u32 = 2;

/// The driver calls the callback is enabled for: every one [`translate`] reads.
pub(crate) const CALLBACKS: [Cbid; 21] = [
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemCreate,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemRelease,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemMap,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemUnmap,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz,
    Cbid::CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize,
];

/// The callback ids [`translate`] reads, as the `u32`s CUPTI passes.
mod id {
    use super::Cbid;

    pub(super) const CU_MEM_ALLOC_V2: u32 = Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2 as u32;
    pub(super) const CU_MEM_ALLOC_PITCH_V2: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2 as u32;
    pub(super) const CU_MEM_ALLOC_MANAGED: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged as u32;
    pub(super) const CU_MEM_FREE_V2: u32 = Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2 as u32;
    pub(super) const CU_MEM_ALLOC_ASYNC: u32 = Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync as u32;
    pub(super) const CU_MEM_ALLOC_ASYNC_PTSZ: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz as u32;
    pub(super) const CU_MEM_ALLOC_FROM_POOL_ASYNC: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync as u32;
    pub(super) const CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz as u32;
    pub(super) const CU_MEM_FREE_ASYNC: u32 = Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync as u32;
    pub(super) const CU_MEM_FREE_ASYNC_PTSZ: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz as u32;
    pub(super) const CU_MEM_ALLOC_HOST_V2: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2 as u32;
    pub(super) const CU_MEM_HOST_ALLOC: u32 = Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc as u32;
    pub(super) const CU_MEM_FREE_HOST: u32 = Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost as u32;
    pub(super) const CU_MEM_CREATE: u32 = Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemCreate as u32;
    pub(super) const CU_MEM_RELEASE: u32 = Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemRelease as u32;
    pub(super) const CU_MEM_MAP: u32 = Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemMap as u32;
    pub(super) const CU_MEM_UNMAP: u32 = Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemUnmap as u32;
    pub(super) const CU_CTX_SYNCHRONIZE: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize as u32;
    pub(super) const CU_STREAM_SYNCHRONIZE: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize as u32;
    pub(super) const CU_STREAM_SYNCHRONIZE_PTSZ: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz as u32;
    pub(super) const CU_EVENT_SYNCHRONIZE: u32 =
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize as u32;
}

/// Where a block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    /// The device of the context the call ran in.
    ContextDevice,
    /// The device of this ordinal (physical memory names its own).
    Device(u32),
    /// Page-locked host memory (`cuda_pinned`).
    Pinned,
}

/// Which memory pool served a stream-ordered allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolOf {
    /// Not stream-ordered.
    None,
    /// The device's current pool (`cuMemAllocAsync`).
    Current,
    /// This pool (`cuMemAllocFromPoolAsync`).
    Explicit(usize),
}

/// What one callback means for memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// `bytes` became live at `key` (an address, or a physical handle with [`PHYSICAL_KEY`]).
    Alloc {
        space: Space,
        key: u64,
        bytes: u64,
        pool: PoolOf,
    },
    /// The block at `key` is about to be freed.
    Free {
        space: Space,
        key: u64,
        pool: PoolOf,
    },
    /// The range at `va` now maps physical memory `handle`.
    Map { va: u64, handle: u64 },
    /// The mappings starting in `va .. va + size` are about to be unmapped.
    Unmap { va: u64, size: u64 },
    /// Physical memory `handle` is about to be released.
    Release { handle: u64 },
    /// An allocation of `requested` bytes failed for want of memory.
    OutOfMemory { space: Space, requested: u64 },
    /// The context, a stream or an event was synchronised: stream-ordered pools may have given
    /// memory back.
    Synchronized,
}

/// What the callback record `data` of driver call `cbid` means for memory, if anything.
///
/// # Safety
///
/// `data` is the record CUPTI passed for `cbid` in the driver API domain: its
/// `functionParams` points to that call's parameter block, whose output pointers are valid
/// on exit, and on exit `functionReturnValue` points to the call's result.
pub(crate) unsafe fn translate(cbid: u32, data: &CUpti_CallbackData) -> Option<Call> {
    let exit = data.callbackSite == CUpti_ApiCallbackSite::CUPTI_API_EXIT;
    let params = data.functionParams;
    // SAFETY: on exit the result is valid (the caller's contract); it is only read then.
    let result = || unsafe { (data.functionReturnValue as *const u32).read() };
    let on_exit = |space: Space, requested: u64, out: &dyn Fn() -> u64, pool: PoolOf| {
        if !exit {
            return None;
        }
        match result() {
            0 => Some(Call::Alloc {
                space,
                key: out(),
                bytes: requested,
                pool,
            }),
            OUT_OF_MEMORY => Some(Call::OutOfMemory { space, requested }),
            _ => None,
        }
    };
    let on_entry = |call: Call| (!exit).then_some(call);
    let context = Space::ContextDevice;
    // SAFETY: every read below rests on the caller's contract: `params` points to the parameter block
    // of `cbid`, its input pointers are valid for the call, and on exit its output pointers
    // and the result are. Output pointers are read only on exit, and only when the call
    // succeeded.
    unsafe {
        match cbid {
            id::CU_MEM_ALLOC_V2 => {
                let p = &*(params as *const cuMemAlloc_v2_params_st);
                on_exit(context, p.bytesize as u64, &|| *p.dptr, PoolOf::None)
            }
            id::CU_MEM_ALLOC_PITCH_V2 => {
                let p = &*(params as *const cuMemAllocPitch_v2_params_st);
                // The pitch is known only on exit; a refusal asks for at least the rows' width.
                let requested = if exit && result() == 0 {
                    (*p.pPitch as u64).saturating_mul(p.Height as u64)
                } else {
                    (p.WidthInBytes as u64).saturating_mul(p.Height as u64)
                };
                on_exit(context, requested, &|| *p.dptr, PoolOf::None)
            }
            id::CU_MEM_ALLOC_MANAGED => {
                let p = &*(params as *const cuMemAllocManaged_params_st);
                on_exit(context, p.bytesize as u64, &|| *p.dptr, PoolOf::None)
            }
            id::CU_MEM_FREE_V2 => {
                let p = &*(params as *const cuMemFree_v2_params_st);
                on_entry(Call::Free {
                    space: context,
                    key: p.dptr,
                    pool: PoolOf::None,
                })
            }
            id::CU_MEM_ALLOC_ASYNC => {
                let p = &*(params as *const cuMemAllocAsync_params_st);
                on_exit(context, p.bytesize as u64, &|| *p.dptr, PoolOf::Current)
            }
            id::CU_MEM_ALLOC_ASYNC_PTSZ => {
                let p = &*(params as *const cuMemAllocAsync_ptsz_params_st);
                on_exit(context, p.bytesize as u64, &|| *p.dptr, PoolOf::Current)
            }
            id::CU_MEM_ALLOC_FROM_POOL_ASYNC => {
                let p = &*(params as *const cuMemAllocFromPoolAsync_params_st);
                let pool = PoolOf::Explicit(p.pool as usize);
                on_exit(context, p.bytesize as u64, &|| *p.dptr, pool)
            }
            id::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => {
                let p = &*(params as *const cuMemAllocFromPoolAsync_ptsz_params_st);
                let pool = PoolOf::Explicit(p.pool as usize);
                on_exit(context, p.bytesize as u64, &|| *p.dptr, pool)
            }
            id::CU_MEM_FREE_ASYNC => {
                let p = &*(params as *const cuMemFreeAsync_params_st);
                on_entry(Call::Free {
                    space: context,
                    key: p.dptr,
                    pool: PoolOf::Current,
                })
            }
            id::CU_MEM_FREE_ASYNC_PTSZ => {
                let p = &*(params as *const cuMemFreeAsync_ptsz_params_st);
                on_entry(Call::Free {
                    space: context,
                    key: p.dptr,
                    pool: PoolOf::Current,
                })
            }
            id::CU_MEM_ALLOC_HOST_V2 => {
                let p = &*(params as *const cuMemAllocHost_v2_params_st);
                let out = || *p.pp as u64;
                on_exit(Space::Pinned, p.bytesize as u64, &out, PoolOf::None)
            }
            id::CU_MEM_HOST_ALLOC => {
                let p = &*(params as *const cuMemHostAlloc_params_st);
                let out = || *p.pp as u64;
                on_exit(Space::Pinned, p.bytesize as u64, &out, PoolOf::None)
            }
            id::CU_MEM_FREE_HOST => {
                let p = &*(params as *const cuMemFreeHost_params_st);
                on_entry(Call::Free {
                    space: Space::Pinned,
                    key: p.p as u64,
                    pool: PoolOf::None,
                })
            }
            id::CU_MEM_CREATE => {
                let p = &*(params as *const cuMemCreate_params_st);
                // A null `prop` is refused by the driver before anything is allocated.
                let prop = p.prop.as_ref()?;
                let space = if prop.location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
                {
                    Space::Device(u32::try_from(prop.location.id).ok()?)
                } else {
                    Space::Pinned
                };
                let out = || *p.handle | PHYSICAL_KEY;
                on_exit(space, p.size as u64, &out, PoolOf::None)
            }
            id::CU_MEM_RELEASE => {
                let p = &*(params as *const cuMemRelease_params_st);
                on_entry(Call::Release { handle: p.handle })
            }
            id::CU_MEM_MAP => {
                let p = &*(params as *const cuMemMap_params_st);
                (exit && result() == 0).then_some(Call::Map {
                    va: p.ptr,
                    handle: p.handle,
                })
            }
            id::CU_MEM_UNMAP => {
                let p = &*(params as *const cuMemUnmap_params_st);
                on_entry(Call::Unmap {
                    va: p.ptr,
                    size: p.size as u64,
                })
            }
            id::CU_CTX_SYNCHRONIZE
            | id::CU_STREAM_SYNCHRONIZE
            | id::CU_STREAM_SYNCHRONIZE_PTSZ
            | id::CU_EVENT_SYNCHRONIZE => exit.then_some(Call::Synchronized),
            _ => None,
        }
    }
}

/// A parameter block's address, as CUPTI passes it.
#[cfg(test)]
fn params_of<T>(params: &T) -> *const std::ffi::c_void {
    (params as *const T).cast()
}

#[cfg(test)]
mod tests;
