//! `highwater`: read memory profiles from the command line.
//!
//! `main` parses the arguments, calls [`cli::run`] and turns the outcome into an exit code:
//! 0 on success, 2 when a profile cannot be read (or the arguments are wrong), 1 when an output
//! cannot be written, 3 when `simulate` or `fit` finds that the run does not fit the device. Errors are one line on standard error.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

mod cli;
mod report;
mod watch;

/// The error and its causes on one line, each cause once (a cause whose text the message
/// already quotes is not repeated) and control characters blanked.
fn one_line(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !message.contains(&text) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&text);
        }
    }
    message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

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
            let _ = writeln!(std::io::stderr(), "highwater: error: {}", one_line(&error));
            ExitCode::from(cli::exit_code(&error))
        }
    }
}
