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

/// Longest part of an error message shown, in characters: a name from a hostile file can be
/// tens of kilobytes.
const MAX_MESSAGE_PART: usize = 400;

/// The error and its causes on one line, each cause once (a cause whose text the message
/// already quotes is not repeated), each cut to [`MAX_MESSAGE_PART`] characters, control
/// characters blanked and text-reordering characters spelled out.
fn one_line(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !message.contains(&text) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&cut(&text));
        }
    }
    let message: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    report::clean(&message).into_owned()
}

/// `text` cut to [`MAX_MESSAGE_PART`] characters, saying how much was left out.
fn cut(text: &str) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(MAX_MESSAGE_PART) {
        Some((at, _)) => format!("{}… ({} more bytes)", &text[..at], text.len() - at).into(),
        None => text.into(),
    }
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
