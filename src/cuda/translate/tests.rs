//! The translation on hand-built callback records, as CUPTI would deliver them: every call it
//! reads, on entry and on exit, succeeding, refused for want of memory, and failing otherwise.

use std::ffi::c_void;
use std::ptr;

use cudarc::cupti::sys::CUpti_ApiCallbackSite::{CUPTI_API_ENTER, CUPTI_API_EXIT};
use cudarc::driver::sys::{CUmemAllocationProp, CUmemLocationType, CUstream};

use super::*;

const OK: u32 = 0;
/// `CUDA_ERROR_INVALID_VALUE`: a failure that is not for want of memory.
const INVALID_VALUE: u32 = 1;

/// The record CUPTI passes for a call with parameter block `params` at `site`; on exit the
/// call returned `*result`.
fn record<T>(site: CUpti_ApiCallbackSite, params: &T, result: &mut u32) -> CUpti_CallbackData {
    CUpti_CallbackData {
        callbackSite: site,
        functionName: c"cuMem".as_ptr(),
        functionParams: params_of(params),
        functionReturnValue: (result as *mut u32).cast(),
        symbolName: ptr::null(),
        context: ptr::null_mut(),
        contextUid: 1,
        correlationData: ptr::null_mut(),
        correlationId: 7,
    }
}

/// What `cbid` with `params` means on entry and on exit, the call returning `result`.
fn both_sites<T>(cbid: u32, params: &T, result: u32) -> (Option<Call>, Option<Call>) {
    let mut code = result;
    let entry = record(CUPTI_API_ENTER, params, &mut code);
    let exit = record(CUPTI_API_EXIT, params, &mut code);
    // SAFETY: each record points at a parameter block of `cbid`'s type, whose output pointers
    // are valid, and at a result.
    unsafe { (translate(cbid, &entry), translate(cbid, &exit)) }
}

fn stream(id: usize) -> CUstream {
    id as CUstream
}

#[test]
fn classic_allocations_are_read_on_exit() {
    let mut out = 0xdead_0000u64;
    let params = cuMemAlloc_v2_params_st {
        dptr: &mut out,
        bytesize: 4096,
    };
    let (entry, exit) = both_sites(id::CU_MEM_ALLOC_V2, &params, OK);
    assert_eq!(entry, None);
    assert_eq!(
        exit,
        Some(Call::Alloc {
            space: Space::ContextDevice,
            key: 0xdead_0000,
            bytes: 4096,
            pool: PoolOf::None,
        })
    );

    let mut managed = 0x7000_0000u64;
    let params = cuMemAllocManaged_params_st {
        dptr: &mut managed,
        bytesize: 1 << 20,
        flags: 1,
    };
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_MANAGED, &params, OK).1,
        Some(Call::Alloc {
            space: Space::ContextDevice,
            key: 0x7000_0000,
            bytes: 1 << 20,
            pool: PoolOf::None,
        })
    );
}

#[test]
fn a_pitched_allocation_holds_pitch_times_height() {
    let mut out = 0x1000u64;
    let mut pitch = 512usize;
    let params = cuMemAllocPitch_v2_params_st {
        dptr: &mut out,
        pPitch: &mut pitch,
        WidthInBytes: 500,
        Height: 10,
        ElementSizeBytes: 4,
    };
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_PITCH_V2, &params, OK).1,
        Some(Call::Alloc {
            space: Space::ContextDevice,
            key: 0x1000,
            bytes: 5120,
            pool: PoolOf::None,
        })
    );
    // Refused: the request is the rows' width, the pitch never having been chosen.
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_PITCH_V2, &params, OUT_OF_MEMORY).1,
        Some(Call::OutOfMemory {
            space: Space::ContextDevice,
            requested: 5000,
        })
    );
}

#[test]
fn frees_are_read_on_entry_even_of_addresses_never_seen() {
    let params = cuMemFree_v2_params_st { dptr: 0xfeed };
    let (entry, exit) = both_sites(id::CU_MEM_FREE_V2, &params, OK);
    assert_eq!(
        entry,
        Some(Call::Free {
            space: Space::ContextDevice,
            key: 0xfeed,
            pool: PoolOf::None,
        })
    );
    assert_eq!(exit, None);
}

#[test]
fn stream_ordered_allocations_name_their_pool() {
    let mut out = 0x2000u64;
    let params = cuMemAllocAsync_params_st {
        dptr: &mut out,
        bytesize: 256,
        hStream: stream(3),
    };
    let alloc = Call::Alloc {
        space: Space::ContextDevice,
        key: 0x2000,
        bytes: 256,
        pool: PoolOf::Current,
    };
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_ASYNC, &params, OK),
        (None, Some(alloc))
    );
    let params = cuMemAllocAsync_ptsz_params_st {
        dptr: &mut out,
        bytesize: 256,
        hStream: stream(3),
    };
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_ASYNC_PTSZ, &params, OK).1,
        Some(alloc)
    );

    let pool = 0x5150 as cudarc::driver::sys::CUmemoryPool;
    let params = cuMemAllocFromPoolAsync_params_st {
        dptr: &mut out,
        bytesize: 1024,
        pool,
        hStream: stream(1),
    };
    let from_pool = Call::Alloc {
        space: Space::ContextDevice,
        key: 0x2000,
        bytes: 1024,
        pool: PoolOf::Explicit(0x5150),
    };
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_FROM_POOL_ASYNC, &params, OK).1,
        Some(from_pool)
    );
    let params = cuMemAllocFromPoolAsync_ptsz_params_st {
        dptr: &mut out,
        bytesize: 1024,
        pool,
        hStream: stream(1),
    };
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ, &params, OK).1,
        Some(from_pool)
    );
}

#[test]
fn an_async_free_on_another_stream_is_a_free_of_the_block() {
    // Allocated on stream 1, freed on stream 2: the block leaves the program's hands at the
    // call, whichever stream it is ordered on.
    let free = Call::Free {
        space: Space::ContextDevice,
        key: 0x2000,
        pool: PoolOf::Current,
    };
    let params = cuMemFreeAsync_params_st {
        dptr: 0x2000,
        hStream: stream(2),
    };
    assert_eq!(
        both_sites(id::CU_MEM_FREE_ASYNC, &params, OK),
        (Some(free), None)
    );
    let params = cuMemFreeAsync_ptsz_params_st {
        dptr: 0x2000,
        hStream: stream(2),
    };
    assert_eq!(
        both_sites(id::CU_MEM_FREE_ASYNC_PTSZ, &params, OK).0,
        Some(free)
    );
}

#[test]
fn pinned_host_memory_is_its_own_space() {
    let mut host: *mut c_void = 0x7f00_1000 as *mut c_void;
    let params = cuMemAllocHost_v2_params_st {
        pp: &mut host,
        bytesize: 8192,
    };
    let pinned = Call::Alloc {
        space: Space::Pinned,
        key: 0x7f00_1000,
        bytes: 8192,
        pool: PoolOf::None,
    };
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_HOST_V2, &params, OK).1,
        Some(pinned)
    );
    let params = cuMemHostAlloc_params_st {
        pp: &mut host,
        bytesize: 8192,
        Flags: 0,
    };
    assert_eq!(
        both_sites(id::CU_MEM_HOST_ALLOC, &params, OK).1,
        Some(pinned)
    );
    let params = cuMemFreeHost_params_st {
        p: 0x7f00_1000 as *mut c_void,
    };
    assert_eq!(
        both_sites(id::CU_MEM_FREE_HOST, &params, OK).0,
        Some(Call::Free {
            space: Space::Pinned,
            key: 0x7f00_1000,
            pool: PoolOf::None,
        })
    );
    assert_eq!(
        both_sites(
            id::CU_MEM_HOST_ALLOC,
            &params_host_alloc(&mut host),
            OUT_OF_MEMORY
        )
        .1,
        Some(Call::OutOfMemory {
            space: Space::Pinned,
            requested: 8192,
        })
    );
}

fn params_host_alloc(host: &mut *mut c_void) -> cuMemHostAlloc_params_st {
    cuMemHostAlloc_params_st {
        pp: host,
        bytesize: 8192,
        Flags: 0,
    }
}

/// Allocation properties naming a location.
fn properties(kind: CUmemLocationType, id: i32) -> CUmemAllocationProp {
    // SAFETY: every field of the C struct is an integer, a pointer or an enum whose zero value
    // is one of its variants.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.location.type_ = kind;
    prop.location.id = id;
    prop
}

#[test]
fn virtual_memory_management_is_create_map_unmap_release() {
    let prop = properties(CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, 1);
    let mut handle = 0x42u64;
    let params = cuMemCreate_params_st {
        handle: &mut handle,
        size: 2 << 20,
        prop: &prop,
        flags: 0,
    };
    assert_eq!(
        both_sites(id::CU_MEM_CREATE, &params, OK),
        (
            None,
            Some(Call::Alloc {
                space: Space::Device(1),
                key: 0x42 | PHYSICAL_KEY,
                bytes: 2 << 20,
                pool: PoolOf::None,
            })
        )
    );
    assert_eq!(
        both_sites(id::CU_MEM_CREATE, &params, OUT_OF_MEMORY).1,
        Some(Call::OutOfMemory {
            space: Space::Device(1),
            requested: 2 << 20,
        })
    );
    let host = properties(CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, 0);
    let params = cuMemCreate_params_st {
        handle: &mut handle,
        size: 4096,
        prop: &host,
        flags: 0,
    };
    assert!(matches!(
        both_sites(id::CU_MEM_CREATE, &params, OK).1,
        Some(Call::Alloc {
            space: Space::Pinned,
            ..
        })
    ));

    let map = cuMemMap_params_st {
        ptr: 0x7000_0000,
        size: 2 << 20,
        offset: 0,
        handle: 0x42,
        flags: 0,
    };
    assert_eq!(
        both_sites(id::CU_MEM_MAP, &map, OK),
        (
            None,
            Some(Call::Map {
                va: 0x7000_0000,
                handle: 0x42
            })
        )
    );
    // A refused map maps nothing.
    assert_eq!(both_sites(id::CU_MEM_MAP, &map, INVALID_VALUE).1, None);
    let unmap = cuMemUnmap_params_st {
        ptr: 0x7000_0000,
        size: 2 << 20,
    };
    assert_eq!(
        both_sites(id::CU_MEM_UNMAP, &unmap, OK),
        (
            Some(Call::Unmap {
                va: 0x7000_0000,
                size: 2 << 20
            }),
            None
        )
    );
    let release = cuMemRelease_params_st { handle: 0x42 };
    assert_eq!(
        both_sites(id::CU_MEM_RELEASE, &release, OK),
        (Some(Call::Release { handle: 0x42 }), None)
    );
}

#[test]
fn refusals_for_want_of_memory_become_out_of_memory_and_others_nothing() {
    let mut out = 0u64;
    let params = cuMemAlloc_v2_params_st {
        dptr: &mut out,
        bytesize: 80 << 30,
    };
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_V2, &params, OUT_OF_MEMORY),
        (
            None,
            Some(Call::OutOfMemory {
                space: Space::ContextDevice,
                requested: 80 << 30,
            })
        )
    );
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_V2, &params, INVALID_VALUE),
        (None, None)
    );
    let params = cuMemAllocAsync_params_st {
        dptr: &mut out,
        bytesize: 1 << 40,
        hStream: stream(0),
    };
    assert_eq!(
        both_sites(id::CU_MEM_ALLOC_ASYNC, &params, OUT_OF_MEMORY).1,
        Some(Call::OutOfMemory {
            space: Space::ContextDevice,
            requested: 1 << 40,
        })
    );
}

#[test]
fn synchronisation_is_noted_on_exit_and_other_calls_are_nothing() {
    let none = ();
    assert_eq!(
        both_sites(id::CU_CTX_SYNCHRONIZE, &none, OK),
        (None, Some(Call::Synchronized))
    );
    for cbid in [
        id::CU_STREAM_SYNCHRONIZE,
        id::CU_STREAM_SYNCHRONIZE_PTSZ,
        id::CU_EVENT_SYNCHRONIZE,
    ] {
        assert_eq!(both_sites(cbid, &none, OK).1, Some(Call::Synchronized));
    }
    // cuLaunchKernel, say: not a memory call.
    assert_eq!(both_sites(307, &none, OK), (None, None));
}

#[test]
fn every_enabled_callback_is_translated() {
    let ids = [
        id::CU_MEM_ALLOC_V2,
        id::CU_MEM_ALLOC_PITCH_V2,
        id::CU_MEM_ALLOC_MANAGED,
        id::CU_MEM_FREE_V2,
        id::CU_MEM_ALLOC_ASYNC,
        id::CU_MEM_ALLOC_ASYNC_PTSZ,
        id::CU_MEM_ALLOC_FROM_POOL_ASYNC,
        id::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
        id::CU_MEM_FREE_ASYNC,
        id::CU_MEM_FREE_ASYNC_PTSZ,
        id::CU_MEM_ALLOC_HOST_V2,
        id::CU_MEM_HOST_ALLOC,
        id::CU_MEM_FREE_HOST,
        id::CU_MEM_CREATE,
        id::CU_MEM_RELEASE,
        id::CU_MEM_MAP,
        id::CU_MEM_UNMAP,
        id::CU_CTX_SYNCHRONIZE,
        id::CU_STREAM_SYNCHRONIZE,
        id::CU_STREAM_SYNCHRONIZE_PTSZ,
        id::CU_EVENT_SYNCHRONIZE,
    ];
    let enabled: Vec<u32> = CALLBACKS.iter().map(|&cbid| cbid as u32).collect();
    assert_eq!(enabled, ids);
}
