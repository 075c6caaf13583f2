//! `highwater`: read memory profiles from the command line.
//!
//! `main` parses the arguments, calls [`cli::run`] and turns the outcome into an exit code:
//! 0 on success, 2 when a profile cannot be read (or the arguments are wrong), 1 when an output
//! cannot be written. Errors are one line on standard error.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

#[path = "../cli/mod.rs"]
mod cli;

fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        Err(error) => {
            // Help and version go to stdout with code 0; usage errors to stderr with code 2.
            let _ = error.print();
            return ExitCode::from(if error.use_stderr() {
                cli::EXIT_BAD_INPUT
            } else {
                0
            });
        }
    };
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let message: String = format!("{error:#}")
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            let _ = writeln!(std::io::stderr(), "highwater: error: {message}");
            ExitCode::from(cli::exit_code(&error))
        }
    }
}
