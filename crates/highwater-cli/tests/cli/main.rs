//! The `highwater` command over profiles, logs and files made for each test: every command, bad
//! and partial input, call sites, special files. Nothing here records in this process. One
//! binary for all of them: building and linking one per file was most of the suite's build time.

mod bad_input;
mod commands;
mod partial;
mod sites;
mod special_files;
