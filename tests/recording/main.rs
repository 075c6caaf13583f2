//! Tests of recording, each in a child process of this binary with a watchdog
//! ([`highwater_testkit::child`]): its own session, allocator and counters. The allocator counts,
//! independently of highwater, what it should have seen ([`highwater_testkit::counting`]), for
//! the tests that check exactness. One binary for all of them: building and linking one per file
//! was most of the test suite's build time.

// Tests drive the operating system directly; the library goes through its `sys` module.
#![allow(clippy::disallowed_methods)]

mod call_sites_by_sampling;
#[cfg(feature = "candle")]
mod candle_op_names_output_at_peak;
mod checkpoint_survives_sigkill;
mod chrome_trace_in_perfetto;
#[cfg(feature = "cuda")]
mod cuda_capture;
mod device_pools_in_session;
mod known_peak_pattern;
mod leak_no_warning_on_steady_loop;
mod leak_warning_on_growing_residual;
mod measure_during_a_session;
mod oom_pool_refusal_is_checkpointed;
mod op_attribution;
mod rank_outputs_never_clobber;
mod reliability_bounded_resources;
mod reliability_device_names;
mod reliability_internal_threads;
mod reliability_outputs;
mod reliability_profile_writes;
mod reliability_thread_churn;
mod security_planted_links;
mod session_lifecycle;
mod session_ownership;
mod signal_writes_profile;
mod span_before_start_names_its_allocations;
mod span_depth_bounded;
mod stress_process;
mod stress_threads;
mod torch_export_in_viewer;
#[cfg(feature = "tracing")]
mod tracing_spans_become_highwater_spans;
mod unattributed_drops;
mod workload_json_round_trip;
mod workload_rayon_sort;
mod workload_realloc_growth;
mod workload_syn_trees;
mod workload_threads_pass_maps;

/// Every test's allocator: highwater's hook between two counting wrappers.
#[global_allocator]
static GLOBAL: highwater_testkit::counting::TestAlloc = highwater_testkit::counting::test_alloc();
