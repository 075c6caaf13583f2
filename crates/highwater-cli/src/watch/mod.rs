//! `highwater watch PROFILE`: a terminal view of a run that follows its profile as the session
//! rewrites it (checkpoints while it records, the final profile when it ends).
//!
//! [`follow`] reloads the file when it changes and tells whether its writer still runs,
//! [`view`] works the figures out of one profile, [`draw`] puts them on the screen; this module
//! owns the terminal and the refresh loop.

mod draw;
mod follow;
mod view;

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::DefaultTerminal;

use follow::{process_alive, Follower};
use view::{RunState, View};

/// Shows the run whose profile is at `path` until `q` (or Esc, or Ctrl-C) is pressed, reading
/// the file again every `refresh`.
pub(crate) fn run(path: &Path, refresh: Duration) -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        anyhow::bail!("highwater watch draws on a terminal; standard output is not one");
    }
    let mut terminal = ratatui::try_init().context("cannot set up the terminal")?;
    let shown = show(&mut terminal, path, refresh);
    let restored = ratatui::try_restore().context("cannot restore the terminal");
    shown.and(restored)
}

fn show(terminal: &mut DefaultTerminal, path: &Path, refresh: Duration) -> anyhow::Result<()> {
    let mut follower = Follower::new(path);
    loop {
        follower.poll();
        // Checked on every refresh, not only when the file changes: a dead run writes nothing.
        let view = follower.profile().map(|profile| {
            let state = RunState::of(profile, process_alive(profile.meta.pid));
            View::new(profile, state)
        });
        terminal
            .draw(|frame| {
                draw::screen(
                    frame,
                    &draw::Screen {
                        path,
                        view: view.as_ref(),
                        problem: follower.problem(),
                        refresh,
                    },
                );
            })
            .context("cannot draw on the terminal")?;
        if event::poll(refresh).context("cannot read the keyboard")? {
            if let Event::Key(key) = event::read().context("cannot read the keyboard")? {
                let ctrl_c =
                    key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
                let quit = matches!(key.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c;
                if key.kind == KeyEventKind::Press && quit {
                    return Ok(());
                }
            }
        }
    }
}
