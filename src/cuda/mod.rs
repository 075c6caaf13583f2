//! CUDA device memory, recorded through CUDA's profiling interface (CUPTI).
//!
//! At session start, when a CUDA driver and CUPTI load at run time, highwater subscribes to
//! CUPTI's callbacks on the driver API's memory calls (CUPTI allows one subscriber per process).
//! CUPTI runs the callback on the calling thread, inside the CUDA call, so each call is
//! recorded into that thread's ring like a heap event: it takes the thread's current span, op
//! and category. The callback follows the allocator hook's rules: no allocation through the
//! global allocator, no lock, bounded work (the driver functions it calls were looked up at
//! start).
//!
//! - Device allocations are blocks on `cuda:N` (the ordinal of the call's context, or of the
//!   device a physical allocation names), keyed by device address; pinned host memory is
//!   `cuda_pinned`. [`translate`] says which call becomes what.
//! - Physical memory of the virtual-memory API is a block from `cuMemCreate` until it is both
//!   released and unmapped (the collector's ledger tells when).
//! - Stream-ordered allocation keeps freed blocks in the driver's pool: after each
//!   stream-ordered call, and after each synchronisation once a device has used one, the
//!   pool's reserved bytes are read and recorded, so the profile has reserved beside allocated.
//! - Before a device's first recorded allocation, what the device already holds (`cuMemGetInfo`:
//!   the context's fixed overhead) and its total memory are recorded once.
//! - An allocation refused with `CUDA_ERROR_OUT_OF_MEMORY` is an out-of-memory event of the
//!   device, and the thread waits (boundedly) for the checkpoint that holds it, as a refused
//!   heap allocation does.
//!
//! What CUPTI cannot see: memory a library hands out from its own pool (PyTorch's caching
//! allocator, NCCL's buffers) is visible as the pool's allocations, not as tensors.
//!
//! Nothing of this stops a session from starting: without a driver, CUPTI or a device, or with
//! CUPTI taken by another profiler, [`start`] says why and the profile carries the warning.

mod translate;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicUsize, Ordering};

use cudarc::cupti::sys::{
    self as cupti, CUptiResult, CUpti_CallbackData, CUpti_CallbackDomain, CUpti_CallbackId,
    CUpti_SubscriberHandle,
};
use cudarc::driver::sys::{self as driver, CUmemPool_attribute, CUmemoryPool, CUresult};

use crate::capture::{self, names, raw::DeviceMemoryKind};
use crate::model::OomSource;
use crate::profile::NotRecordedReason;
use translate::{Call, PoolOf, Space};

/// Devices recorded; a call on a device of a higher ordinal is counted as lost.
const MAX_DEVICES: usize = 64;

/// Contexts whose device is remembered, so most calls need no CUPTI lookup.
const REMEMBERED_CONTEXTS: usize = 16;

/// The device ids (`capture::names`) of `cuda:0`, `cuda:1`, … interned at start (`0`: none).
static DEVICE_IDS: [AtomicU16; MAX_DEVICES] = [const { AtomicU16::new(0) }; MAX_DEVICES];

/// The device id of `cuda_pinned` (`0`: not interned).
static PINNED_ID: AtomicU16 = AtomicU16::new(0);

/// Whether a device's memory before its first recorded allocation was read this session.
static MEMORY_READ: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];

/// Whether a device served a stream-ordered allocation this session: its pool is read after
/// each synchronisation from then on.
static POOL_USED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];

/// Whether the pool functions exist in this driver (CUDA 11.2 and later).
static POOLS_READABLE: AtomicBool = AtomicBool::new(false);

/// Contexts seen and their device ordinals: `(context address, ordinal + 1)`, `0` free.
static CONTEXTS: [(AtomicUsize, AtomicU32); REMEMBERED_CONTEXTS] =
    [const { (AtomicUsize::new(0), AtomicU32::new(0)) }; REMEMBERED_CONTEXTS];

/// The CUPTI subscriber this process holds (`0`: none).
static SUBSCRIBER: AtomicUsize = AtomicUsize::new(0);

/// Why device memory is not recorded: the reason and what the system said.
pub(crate) type NotRecorded = (NotRecordedReason, String);

/// The libraries' names as the system's loader knows them, the ones cudarc looks for too.
const DRIVER_LIBRARIES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];
const CUPTI_LIBRARIES: [&str; 5] = [
    "libcupti.so",
    "libcupti.so.13",
    "libcupti.so.12",
    "libcupti.so.11",
    "libcupti.so.1",
];

/// Subscribes to CUPTI's memory callbacks and gets every device's name ready, or says why
/// device memory cannot be recorded. Call it before the gate opens, off the hot path.
pub(crate) fn start() -> Result<(), NotRecorded> {
    if SUBSCRIBER.load(Ordering::SeqCst) != 0 {
        return Ok(());
    }
    let driver_lib =
        first_loadable(&DRIVER_LIBRARIES).map_err(|error| (NotRecordedReason::NoDriver, error))?;
    let cupti_lib = first_loadable(&CUPTI_LIBRARIES)
        .map_err(|error| (NotRecordedReason::NoProfilingLibrary, error))?;
    // SAFETY: the driver library is loaded; cuInit and cuDeviceGetCount take plain values
    // and an output integer.
    let devices = unsafe {
        match driver::cuInit(0) {
            CUresult::CUDA_SUCCESS => {}
            error => return Err((NotRecordedReason::NoDevice, format!("cuInit: {error:?}"))),
        }
        let mut count = 0;
        match driver::cuDeviceGetCount(&mut count) {
            CUresult::CUDA_SUCCESS if count > 0 => count as usize,
            CUresult::CUDA_SUCCESS => return Err((NotRecordedReason::NoDevice, String::new())),
            error => {
                return Err((
                    NotRecordedReason::NoDevice,
                    format!("cuDeviceGetCount: {error:?}"),
                ))
            }
        }
    };
    for (ordinal, id) in DEVICE_IDS.iter().enumerate().take(devices.min(MAX_DEVICES)) {
        id.store(names::device(&format!("cuda:{ordinal}")), Ordering::Relaxed);
    }
    PINNED_ID.store(names::device("cuda_pinned"), Ordering::Relaxed);
    for flag in MEMORY_READ.iter().chain(&POOL_USED) {
        flag.store(false, Ordering::Relaxed);
    }
    for (context, _) in &CONTEXTS {
        context.store(0, Ordering::Relaxed);
    }
    let pools = ["cuDeviceGetMemPool", "cuMemPoolGetAttribute"]
        .iter()
        .all(|symbol| has_symbol(&driver_lib, symbol));
    POOLS_READABLE.store(pools, Ordering::Relaxed);
    warm_up(pools);
    drop((driver_lib, cupti_lib));

    let mut subscriber: CUpti_SubscriberHandle = std::ptr::null_mut();
    // SAFETY: CUPTI is loaded; `on_callback` has the callback signature and needs no user
    // data.
    let subscribed =
        unsafe { cupti::cuptiSubscribe(&mut subscriber, Some(on_callback), std::ptr::null_mut()) };
    match subscribed {
        CUptiResult::CUPTI_SUCCESS => {}
        CUptiResult::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => {
            return Err((NotRecordedReason::ProfilerAttached, String::new()))
        }
        error => {
            return Err((
                NotRecordedReason::Refused,
                format!("cuptiSubscribe: {error:?}"),
            ))
        }
    }
    for cbid in translate::CALLBACKS {
        // SAFETY: `subscriber` was just handed out by CUPTI.
        let enabled = unsafe {
            cupti::cuptiEnableCallback(
                1,
                subscriber,
                CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API,
                cbid as CUpti_CallbackId,
            )
        };
        if enabled != CUptiResult::CUPTI_SUCCESS {
            // SAFETY: as above; nothing is recorded through it any more.
            unsafe { cupti::cuptiUnsubscribe(subscriber) };
            return Err((
                NotRecordedReason::Refused,
                format!("cuptiEnableCallback({cbid:?}): {enabled:?}"),
            ));
        }
    }
    SUBSCRIBER.store(subscriber as usize, Ordering::SeqCst);
    Ok(())
}

/// Gives the CUPTI subscription back, if this process holds one (the session stopped).
pub(crate) fn stop() {
    let subscriber = SUBSCRIBER.swap(0, Ordering::SeqCst);
    if subscriber != 0 {
        // SAFETY: the handle came from `cuptiSubscribe` and is given back once (the swap).
        unsafe { cupti::cuptiUnsubscribe(subscriber as CUpti_SubscriberHandle) };
    }
}

/// The first of `names` the system's loader opens, or what it said about each.
fn first_loadable(names: &[&str]) -> Result<libloading::Library, String> {
    let mut errors = Vec::new();
    for name in names {
        // SAFETY: loading a CUDA library runs its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(*name) } {
            Ok(library) => return Ok(library),
            Err(error) => errors.push(format!("{name}: {error}")),
        }
    }
    Err(errors.join("; "))
}

/// Whether `library` exports `symbol`.
fn has_symbol(library: &libloading::Library, symbol: &str) -> bool {
    // SAFETY: the symbol is only looked up, never called through this pointer.
    unsafe { library.get::<*const c_void>(symbol.as_bytes()).is_ok() }
}

/// Calls once each function the callback calls, so that loading it (which allocates) happens
/// here and not inside a CUDA call. Their results are ignored: without a context they fail.
fn warm_up(pools: bool) {
    let (mut free, mut total, mut ordinal) = (0usize, 0usize, 0u32);
    // SAFETY: every pointer is to a local; a null context is refused, not dereferenced.
    unsafe {
        let _ = driver::cuMemGetInfo_v2(&mut free, &mut total);
        let _ = cupti::cuptiGetDeviceId(std::ptr::null_mut(), &mut ordinal);
        if pools {
            let mut pool: CUmemoryPool = std::ptr::null_mut();
            if driver::cuDeviceGetMemPool(&mut pool, 0) == CUresult::CUDA_SUCCESS {
                let mut bytes = 0u64;
                let _ = driver::cuMemPoolGetAttribute(
                    pool,
                    CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                    (&mut bytes as *mut u64).cast(),
                );
            }
        }
    }
}

/// CUPTI's callback: runs on the thread that made the driver call, inside it.
unsafe extern "C" fn on_callback(
    _userdata: *mut c_void,
    domain: CUpti_CallbackDomain,
    cbid: CUpti_CallbackId,
    data: *const c_void,
) {
    if domain != CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API
        || data.is_null()
        || !capture::recording()
    {
        return;
    }
    // SAFETY: in the driver API domain CUPTI passes a `CUpti_CallbackData` for `cbid`, the
    // callback ids it was enabled for are the ones `translate` reads, and the record is valid
    // for the duration of the callback.
    let data = unsafe { &*data.cast::<CUpti_CallbackData>() };
    // SAFETY: as above.
    let Some(call) = (unsafe { translate::translate(cbid, data) }) else {
        return;
    };
    let context = data.context as usize;
    match call {
        Call::Alloc {
            space,
            key,
            bytes,
            pool,
        } => {
            let Some((ordinal, device)) = resolve(space, context) else {
                return;
            };
            if let Some(ordinal) = ordinal {
                note_memory_before(ordinal, device);
            }
            capture::record_device_alloc_in_scope(device, key, bytes);
            note_pool(ordinal, device, pool);
        }
        Call::Free { space, key, pool } => {
            if let Some((ordinal, device)) = resolve(space, context) {
                capture::record_device_free(device, key, 0);
                note_pool(ordinal, device, pool);
            }
        }
        Call::Map { va, handle } => memory_event(DeviceMemoryKind::Map, context, va, handle),
        Call::Unmap { va, size } => memory_event(DeviceMemoryKind::Unmap, context, va, size),
        Call::Release { handle } => memory_event(DeviceMemoryKind::Release, context, handle, 0),
        Call::OutOfMemory { space, requested } => {
            if let Some((_, device)) = resolve(space, context) {
                capture::oom::refused(OomSource::Driver, || {
                    capture::record_oom(device, OomSource::Driver, requested, None)
                });
            }
        }
        Call::Synchronized => {
            if let Some((Some(ordinal), device)) = resolve(Space::ContextDevice, context) {
                if POOL_USED[ordinal as usize].load(Ordering::Relaxed) {
                    record_reserved(ordinal, device, PoolOf::Current);
                }
            }
        }
    }
}

/// A virtual-memory step on the context's device (the collector's ledger follows the handle
/// to the device that holds its memory).
fn memory_event(kind: DeviceMemoryKind, context: usize, a: u64, b: u64) {
    if let Some((_, device)) = resolve(Space::ContextDevice, context) {
        capture::record_device_memory(kind, device, a, b);
    }
}

/// The ordinal (for a device, not pinned memory) and the interned id of `space`, or `None`
/// when it cannot be told or was not interned.
fn resolve(space: Space, context: usize) -> Option<(Option<u32>, u16)> {
    let ordinal = match space {
        Space::Pinned => {
            let id = PINNED_ID.load(Ordering::Relaxed);
            return (id != 0).then_some((None, id));
        }
        Space::Device(ordinal) => ordinal,
        Space::ContextDevice => context_ordinal(context)?,
    };
    let id = DEVICE_IDS.get(ordinal as usize)?.load(Ordering::Relaxed);
    (id != 0).then_some((Some(ordinal), id))
}

/// The device ordinal of `context`, remembered after the first CUPTI lookup.
fn context_ordinal(context: usize) -> Option<u32> {
    if context == 0 {
        return None;
    }
    for (known, ordinal) in &CONTEXTS {
        if known.load(Ordering::Acquire) == context {
            return ordinal.load(Ordering::Relaxed).checked_sub(1);
        }
    }
    let mut ordinal = 0u32;
    // SAFETY: `context` is the live context of the current driver call; the function was
    // loaded at start.
    let found = unsafe { cupti::cuptiGetDeviceId(context as _, &mut ordinal) };
    if found != CUptiResult::CUPTI_SUCCESS {
        return None;
    }
    // Remember it in a free slot; with every slot taken, look it up again next time.
    for (known, slot) in &CONTEXTS {
        if known.load(Ordering::Relaxed) == 0 {
            slot.store(ordinal + 1, Ordering::Relaxed);
            if known
                .compare_exchange(0, context, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                break;
            }
        }
    }
    Some(ordinal)
}

/// Records, once per device and session, what the device held before this first allocation
/// and its total memory. The call's context is current, so the driver can say.
fn note_memory_before(ordinal: u32, device: u16) {
    let Some(read) = MEMORY_READ.get(ordinal as usize) else {
        return;
    };
    if read.swap(true, Ordering::Relaxed) {
        return;
    }
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: two output integers; the function was loaded at start.
    if unsafe { driver::cuMemGetInfo_v2(&mut free, &mut total) } == CUresult::CUDA_SUCCESS {
        let in_use = total.saturating_sub(free) as u64;
        capture::record_device_memory(DeviceMemoryKind::Memory, device, in_use, total as u64);
    }
}

/// After a stream-ordered call, records what its pool holds now.
fn note_pool(ordinal: Option<u32>, device: u16, pool: PoolOf) {
    let Some(ordinal) = ordinal else {
        return;
    };
    if pool == PoolOf::None {
        return;
    }
    if let Some(used) = POOL_USED.get(ordinal as usize) {
        used.store(true, Ordering::Relaxed);
    }
    record_reserved(ordinal, device, pool);
}

/// Reads the reserved bytes of the device's current pool (or of `pool`) and records them.
fn record_reserved(ordinal: u32, device: u16, pool: PoolOf) {
    if !POOLS_READABLE.load(Ordering::Relaxed) {
        return;
    }
    let pool = match pool {
        PoolOf::None => return,
        PoolOf::Explicit(pool) => pool as CUmemoryPool,
        PoolOf::Current => {
            let mut pool: CUmemoryPool = std::ptr::null_mut();
            // SAFETY: an output handle and a device ordinal; loaded at start.
            let found = unsafe { driver::cuDeviceGetMemPool(&mut pool, ordinal as i32) };
            if found != CUresult::CUDA_SUCCESS {
                return;
            }
            pool
        }
    };
    let mut bytes = 0u64;
    // SAFETY: `pool` is a live pool of this device; the attribute is a 64-bit integer.
    let read = unsafe {
        driver::cuMemPoolGetAttribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&mut bytes as *mut u64).cast(),
        )
    };
    if read == CUresult::CUDA_SUCCESS {
        capture::record_device_memory(DeviceMemoryKind::Reserved, device, bytes, 0);
    }
}
