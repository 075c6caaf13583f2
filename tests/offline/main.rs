//! Tests that record nothing in their own process: the analysis against a brute-force model,
//! the device pools, the exporters and the viewers that open them, reading profiles and
//! allocation logs, and the call sites of programs built for the test. One binary for all of
//! them: building and linking one per file was most of the test suite's build time.

mod analysis_matches_brute_force;
mod call_sites_in_any_build;
mod device_pools;
mod html_ranks_page;
mod html_render;
mod pprof_in_go_tool;
mod reliability_alloc_log_read;
mod reliability_profile_load;
