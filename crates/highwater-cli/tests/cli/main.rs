//! The `highwater` command over profiles, logs and files made for each test: every command, bad
//! and partial input, call sites, special files. Nothing here records in this process. One
//! binary for all of them: building and linking one per file was most of the suite's build time.

mod bad_input;
mod commands;
mod partial;
mod sites;
mod special_files;

use std::process::{Command, Output};

/// Runs the `highwater` command with `args` (backtraces on, should it ever panic).
fn highwater(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run highwater")
}

/// The standard output of a run that must succeed.
fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}, stderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("utf-8 output")
}
