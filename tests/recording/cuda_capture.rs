//! CUDA device memory, recorded through CUPTI, on machines without a GPU: a stand-in driver and
//! CUPTI (`tests/support/cuda_stub.c`, built here with the system's C compiler and found
//! through `LD_LIBRARY_PATH`) take highwater's calls and deliver callback records to its
//! subscriber exactly as CUPTI would, on the calling thread, inside spans and ops. The session,
//! the callback, the collector and the profile are the real ones.
//!
//! Each test runs in its own child process, whose loader searches the stub's directory.

use std::ffi::c_void;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cudarc::cupti::sys::{
    cuMemAllocAsync_params_st, cuMemAllocHost_v2_params_st, cuMemAlloc_v2_params_st,
    cuMemCreate_params_st, cuMemFreeAsync_params_st, cuMemFree_v2_params_st, cuMemMap_params_st,
    cuMemRelease_params_st, cuMemUnmap_params_st, CUpti_ApiCallbackSite, CUpti_CallbackData,
    CUpti_driver_api_trace_cbid as Cbid,
};
use cudarc::driver::sys::{CUmemAllocationProp, CUmemLocationType};
use highwater::profile::model::OomSource;
use highwater::profile::{NotRecordedReason, Warning};
use highwater::{Category, Profile, Session, Step};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Builds the stub as `libcuda.so.1` and `libcupti.so` in `dir`.
fn build_stub(dir: &Path) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/cuda_stub.c");
    for name in ["libcuda.so.1", "libcupti.so"] {
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(dir.join(name))
            .arg(format!("-Wl,-soname,{name}"))
            .arg(&source)
            .status()
            .expect("run the C compiler (cc) to build the CUDA stub");
        assert!(status.success(), "building {name} failed");
    }
}

/// Runs test `name` in a child whose loader finds the stub first; fails with its output.
fn run_with_stub(name: &str, extra_env: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    build_stub(dir.path());
    let libs = dir.path().to_str().unwrap().to_string();
    let mut env = vec![("LD_LIBRARY_PATH", libs.as_str())];
    env.extend_from_slice(extra_env);
    let output =
        highwater_testkit::child::run_child(name, &env, highwater_testkit::child::WATCHDOG);
    assert!(
        output.status.success() && output.stdout.contains(&format!("child-ok {name}")),
        "{name} failed in its child process ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        output.stdout,
        output.stderr
    );
}

/// The stub's two libraries, as the child's loader found them (the same copies highwater
/// uses: they are opened by the same names).
struct Stub {
    driver: libloading::Library,
    cupti: libloading::Library,
}

impl Stub {
    fn open() -> Stub {
        // SAFETY: the stub's initialisers do nothing.
        unsafe {
            Stub {
                driver: libloading::Library::new("libcuda.so.1").unwrap(),
                cupti: libloading::Library::new("libcupti.so").unwrap(),
            }
        }
    }

    fn driver_set<A: Copy>(&self, setter: &str, value: A) {
        // SAFETY: the stub's setters take one value of the type the test passes.
        unsafe {
            let set = self
                .driver
                .get::<unsafe extern "C" fn(A)>(setter.as_bytes())
                .unwrap();
            set(value);
        }
    }

    fn set_memory(&self, free: u64, total: u64) {
        // SAFETY: `stub_set_memory(size_t, size_t)`.
        unsafe {
            let set = self
                .driver
                .get::<unsafe extern "C" fn(usize, usize)>(b"stub_set_memory")
                .unwrap();
            set(free as usize, total as usize);
        }
    }

    fn cupti_set(&self, setter: &str, value: i32) {
        // SAFETY: `stub_set_subscribe_result(int)`.
        unsafe {
            let set = self
                .cupti
                .get::<unsafe extern "C" fn(i32)>(setter.as_bytes())
                .unwrap();
            set(value);
        }
    }

    fn subscribed(&self) -> bool {
        // SAFETY: `int stub_subscribed(void)`.
        unsafe {
            let get = self
                .cupti
                .get::<unsafe extern "C" fn() -> i32>(b"stub_subscribed")
                .unwrap();
            get() != 0
        }
    }

    /// Delivers the call `cbid` with parameter block `params`, on entry and on exit, the call
    /// returning `result`, in context `context` (the stub's contexts are `0x100 + ordinal`).
    fn call<T>(&self, cbid: Cbid, params: &mut T, result: u32, context: usize) {
        let mut code = result;
        for site in [
            CUpti_ApiCallbackSite::CUPTI_API_ENTER,
            CUpti_ApiCallbackSite::CUPTI_API_EXIT,
        ] {
            let record = CUpti_CallbackData {
                callbackSite: site,
                functionName: c"cuMem".as_ptr(),
                functionParams: (params as *mut T).cast::<c_void>(),
                functionReturnValue: (&mut code as *mut u32).cast(),
                symbolName: std::ptr::null(),
                context: context as _,
                contextUid: context as u32,
                correlationData: std::ptr::null_mut(),
                correlationId: 1,
            };
            // SAFETY: `int stub_deliver(uint32_t, const void *)` (looked up by a NUL-ended
            // name, which allocates nothing).
            let deliver = unsafe {
                self.cupti
                    .get::<unsafe extern "C" fn(u32, *const CUpti_CallbackData) -> i32>(
                        b"stub_deliver\0",
                    )
                    .unwrap()
            };
            let before = allocator_calls();
            // SAFETY: the record points at live locals for the duration of the call.
            let delivered = unsafe { deliver(cbid as u32, &record) };
            let during = allocator_calls() - before;
            assert_eq!(delivered, 1, "nobody subscribed");
            // The hot-path rule: the callback runs inside the CUDA call, and allocates nothing
            // through the global allocator (waiting for an out-of-memory checkpoint included).
            assert_eq!(during, 0, "the callback of {cbid:?} allocated");
        }
    }
}

/// Calls this thread made into the global allocator so far.
fn allocator_calls() -> u64 {
    highwater_testkit::counting::rows_of(highwater_testkit::counting::gettid())
        .map(|row| {
            row.started
                .iter()
                .map(|kind| kind.load(std::sync::atomic::Ordering::SeqCst))
                .sum::<u64>()
        })
        .sum()
}

const CUDA0: usize = 0x100;
const CUDA1: usize = 0x101;

fn alloc(stub: &Stub, bytes: u64, at: u64, result: u32) {
    let mut out = at;
    let mut params = cuMemAlloc_v2_params_st {
        dptr: &mut out,
        bytesize: bytes as usize,
    };
    stub.call(
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2,
        &mut params,
        result,
        CUDA0,
    );
}

fn alloc_async(stub: &Stub, bytes: u64, at: u64) {
    let mut out = at;
    let mut params = cuMemAllocAsync_params_st {
        dptr: &mut out,
        bytesize: bytes as usize,
        hStream: 1 as _,
    };
    stub.call(
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync,
        &mut params,
        0,
        CUDA0,
    );
}

fn device<'a>(profile: &'a Profile, name: &str) -> &'a highwater::profile::DeviceStats {
    profile
        .devices
        .iter()
        .find(|d| d.device == name)
        .unwrap_or_else(|| panic!("no {name} in {:#?}", profile.devices))
}

/// The profile's device-memory warning, if any.
fn not_recorded(profile: &Profile) -> Option<NotRecordedReason> {
    profile.warnings.iter().find_map(|warning| match warning {
        Warning::DeviceMemoryNotRecorded { reason, .. } => Some(*reason),
        _ => None,
    })
}

/// Waits, boundedly, for the output to hold a checkpoint that lists a refusal.
fn checkpoint_with_refusal(path: &Path) -> Profile {
    let deadline = Instant::now() + highwater_testkit::child::WATCHDOG;
    loop {
        if let Ok(profile) = highwater_testkit::counting::uncounted(|| Profile::load(path)) {
            if profile.meta.partial && !profile.oom_events.is_empty() {
                return profile;
            }
        }
        assert!(Instant::now() < deadline, "no checkpoint with the refusal");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const REPLAY: &str = "callbacks_replayed_through_the_stub_are_recorded_to_the_byte";

/// The calls of a short training step on two devices, delivered as CUPTI delivers them: the
/// device peak, the live-at-peak rows, the reserved curve, the context's overhead, pinned and
/// virtual memory, and the checkpoint an out-of-memory refusal writes, each to the byte.
#[test]
fn callbacks_replayed_through_the_stub_are_recorded_to_the_byte() {
    if !highwater_testkit::child::is_child(REPLAY) {
        return run_with_stub(REPLAY, &[]);
    }
    let stub = Stub::open();
    stub.set_memory(80 * GIB - 500 * MIB, 80 * GIB);
    stub.driver_set("stub_set_device_count", 2i32);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpu.json");
    let session = Session::builder()
        .output(&path)
        .checkpoint_every(Duration::ZERO)
        .start()
        .unwrap();
    assert!(stub.subscribed());

    {
        let _init = highwater::profile!("init", Category::Parameter);
        alloc(&stub, 64 * MIB, 0x7000_0000, 0);
    }
    {
        let _step = highwater::profile!("step");
        {
            let _forward = highwater::profile!("forward", Step::Forward);
            let op = highwater_testkit::counting::uncounted(|| highwater::ops::op("matmul"));
            stub.driver_set("stub_set_reserved", 256 * MIB);
            alloc_async(&stub, 128 * MIB, 0x7400_0000);
            // The output named by its device address, as `highwater::candle::op` does.
            let output = highwater::ops::Tensor {
                id: 1,
                shape: &[1024, 32768],
                dtype: "f32",
                device: "cuda:0",
                bytes: 128 * MIB,
            };
            highwater_testkit::counting::uncounted(|| op.output(&output, 0x7400_0000));
        }
        {
            let _backward = highwater::profile!("backward", Step::Backward);
            alloc_async(&stub, 32 * MIB, 0x7c00_0000);
            // The peak: 64 + 128 + 32 MiB. Then the activation goes, on another stream.
            let mut params = cuMemFreeAsync_params_st {
                dptr: 0x7400_0000,
                hStream: 2 as _,
            };
            stub.call(
                Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync,
                &mut params,
                0,
                CUDA0,
            );
        }
        // The pool gives memory back at a synchronisation.
        stub.driver_set("stub_set_reserved", 96 * MIB);
        stub.call(
            Cbid::CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize,
            &mut (),
            0,
            CUDA0,
        );
    }
    // Pinned host memory.
    let mut host = 0x7f00_0000usize as *mut c_void;
    let mut params = cuMemAllocHost_v2_params_st {
        pp: &mut host,
        bytesize: (8 * MIB) as usize,
    };
    stub.call(
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2,
        &mut params,
        0,
        CUDA0,
    );
    // Physical memory on cuda:1, mapped, released while mapped: freed at the unmap.
    // SAFETY: every field is an integer, a pointer or an enum whose zero is a variant.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    let mut handle = 0x42u64;
    let mut params = cuMemCreate_params_st {
        handle: &mut handle,
        size: (2 * MIB) as usize,
        prop: &prop,
        flags: 0,
    };
    stub.call(
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemCreate,
        &mut params,
        0,
        CUDA1,
    );
    let mut map = cuMemMap_params_st {
        ptr: 0x9_0000_0000,
        size: (2 * MIB) as usize,
        offset: 0,
        handle: 0x42,
        flags: 0,
    };
    stub.call(Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemMap, &mut map, 0, CUDA1);
    let mut release = cuMemRelease_params_st { handle: 0x42 };
    stub.call(
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemRelease,
        &mut release,
        0,
        CUDA1,
    );
    let mut unmap = cuMemUnmap_params_st {
        ptr: 0x9_0000_0000,
        size: (2 * MIB) as usize,
    };
    stub.call(
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemUnmap,
        &mut unmap,
        0,
        CUDA1,
    );
    // A free of an address never allocated changes nothing.
    let mut params = cuMemFree_v2_params_st { dptr: 0xdead_0000 };
    stub.call(
        Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
        &mut params,
        0,
        CUDA0,
    );
    // Asking for more than the device has.
    {
        let _step = highwater::profile!("grow", Step::Forward);
        alloc(&stub, 100 * GIB, 0, 2);
    }
    let checkpoint = checkpoint_with_refusal(&path);

    let profile = session.finish().unwrap();
    assert_eq!(not_recorded(&profile), None, "{:?}", profile.warnings);
    let cuda0 = device(&profile, "cuda:0");
    assert_eq!(cuda0.peak_bytes, 224 * MIB, "{cuda0:#?}");
    assert_eq!(
        cuda0.peak_by_category,
        [
            (Category::Parameter, 64 * MIB),
            (Category::Activation, 128 * MIB),
            (Category::Gradient, 32 * MIB),
        ]
        .into()
    );
    assert_eq!(cuda0.final_live_bytes, 96 * MIB);
    assert_eq!(cuda0.capacity_bytes, Some(80 * GIB));
    assert_eq!(cuda0.context_bytes, Some(500 * MIB));
    assert_eq!(
        (cuda0.reserved_peak_bytes, cuda0.reserved_final_bytes),
        (Some(256 * MIB), Some(96 * MIB))
    );
    let reserved: Vec<u64> = profile
        .reserved_timeline
        .iter()
        .filter(|p| p.device == "cuda:0")
        .map(|p| p.reserved_bytes)
        .collect();
    assert_eq!(reserved.first(), Some(&(256 * MIB)), "{reserved:?}");
    assert_eq!(reserved.last(), Some(&(96 * MIB)), "{reserved:?}");
    // The peak is cuda:0's (the largest device), and these were live at it.
    assert_eq!(profile.summary.peak_bytes, 224 * MIB);
    assert_eq!(profile.summary.peak_device, "cuda:0");
    let rows: Vec<_> = profile
        .peak_breakdown
        .iter()
        .filter(|row| row.device == "cuda:0")
        .map(|row| {
            (
                row.span_path.as_str(),
                row.op.as_deref(),
                row.shape.clone(),
                row.dtype.as_deref(),
                row.category,
                row.bytes,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (
                "step/forward",
                Some("matmul"),
                Some(vec![1024, 32768]),
                Some("f32"),
                Category::Activation,
                128 * MIB
            ),
            ("init", None, None, None, Category::Parameter, 64 * MIB),
            (
                "step/backward",
                None,
                None,
                None,
                Category::Gradient,
                32 * MIB
            ),
        ]
    );
    let pinned = device(&profile, "cuda_pinned");
    assert_eq!(
        (pinned.peak_bytes, pinned.final_live_bytes),
        (8 * MIB, 8 * MIB)
    );
    let cuda1 = device(&profile, "cuda:1");
    assert_eq!((cuda1.peak_bytes, cuda1.final_live_bytes), (2 * MIB, 0));
    assert_eq!(profile.summary.unknown_frees, 1);

    // The refusal, and the checkpoint it wrote at that moment.
    assert_eq!(profile.summary.oom_count, 1);
    let oom = &profile.oom_events[0];
    assert_eq!(
        (oom.source, oom.device.as_str(), oom.requested_bytes),
        (OomSource::Driver, "cuda:0", 100 * GIB)
    );
    assert_eq!(oom.span_path, "grow");
    assert_eq!(oom.live_bytes, 96 * MIB);
    assert_eq!(
        (oom.pool_capacity_bytes, oom.pool_reserved_bytes),
        (Some(80 * GIB), Some(96 * MIB))
    );
    let rows: Vec<(&str, Category, u64)> = oom
        .live
        .iter()
        .map(|row| (row.span_path.as_str(), row.category, row.bytes))
        .collect();
    assert_eq!(
        rows,
        [
            ("init", Category::Parameter, 64 * MIB),
            ("step/backward", Category::Gradient, 32 * MIB),
        ]
    );
    assert_eq!(checkpoint.oom_events, profile.oom_events);
    assert!(!stub.subscribed(), "the subscription was given back");
    println!("child-ok {REPLAY}");
}

/// Runs `body` in a child process with the stub set by `setup`, and checks the session starts
/// and its profile says why device memory was not recorded.
fn refused_with(name: &str, env: &[(&str, &str)], setup: fn(&Stub), expected: NotRecordedReason) {
    if !highwater_testkit::child::is_child(name) {
        return run_with_stub(name, env);
    }
    let stub = Stub::open();
    setup(&stub);
    let session = Session::builder().write_profile(false).start().unwrap();
    assert!(!stub.subscribed());
    let kept = std::hint::black_box(vec![0u8; 4096]);
    let profile = session.finish().unwrap();
    drop(kept);
    assert_eq!(
        not_recorded(&profile),
        Some(expected),
        "{:?}",
        profile.warnings
    );
    assert!(
        profile.summary.peak_bytes >= 4096,
        "the heap is still recorded"
    );
    println!("child-ok {name}");
}

#[test]
fn without_a_device_the_session_starts_and_says_so() {
    refused_with(
        "without_a_device_the_session_starts_and_says_so",
        &[],
        |stub| stub.driver_set("stub_set_init_result", 100i32),
        NotRecordedReason::NoDevice,
    );
}

#[test]
fn with_cupti_taken_by_another_profiler_the_session_starts_and_says_so() {
    refused_with(
        "with_cupti_taken_by_another_profiler_the_session_starts_and_says_so",
        &[],
        |stub| stub.cupti_set("stub_set_subscribe_result", 39),
        NotRecordedReason::ProfilerAttached,
    );
}

#[test]
fn turned_off_it_says_so_and_never_subscribes() {
    const NAME: &str = "turned_off_it_says_so_and_never_subscribes";
    refused_with(
        NAME,
        &[("HIGHWATER_CUDA", "off")],
        |_| {},
        NotRecordedReason::Disabled,
    );
}

/// Where the system's loader finds a CUDA driver (a machine with a GPU), the missing-library
/// path cannot be shown for real; it is here, on every machine without one, CI included.
#[test]
fn without_a_driver_library_the_session_starts_and_says_so() {
    const NAME: &str = "without_a_driver_library_the_session_starts_and_says_so";
    if highwater_testkit::child::is_child(NAME) {
        let session = Session::builder().write_profile(false).start().unwrap();
        let profile = session.finish().unwrap();
        assert_eq!(
            not_recorded(&profile),
            Some(NotRecordedReason::NoDriver),
            "{:?}",
            profile.warnings
        );
        let text = profile
            .warnings
            .iter()
            .map(ToString::to_string)
            .collect::<String>();
        assert!(
            text.contains("CUDA device memory was not recorded"),
            "{text}"
        );
        println!("child-ok {NAME}");
        return;
    }
    // SAFETY: probing for the system's driver; its initialisers have no preconditions.
    if unsafe { libloading::Library::new("libcuda.so.1") }.is_ok() {
        eprintln!("SKIPPED: this machine has a CUDA driver");
        return;
    }
    let empty = tempfile::tempdir().unwrap();
    let output = highwater_testkit::child::run_child(
        NAME,
        &[("LD_LIBRARY_PATH", empty.path().to_str().unwrap())],
        highwater_testkit::child::WATCHDOG,
    );
    assert!(
        output.status.success() && output.stdout.contains(&format!("child-ok {NAME}")),
        "{}\n{}",
        output.stdout,
        output.stderr
    );
}
