//! Drawing one [`View`] on the terminal with ratatui.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use highwater_profile::units::{
    format_bytes, format_bytes_delta, format_count, format_duration_ns,
};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;

use super::view::{RunState, View};
use highwater_export::vocabulary as words;

/// What one frame shows besides the view.
pub(crate) struct Screen<'a> {
    pub(crate) path: &'a Path,
    /// `None` until a profile has loaded.
    pub(crate) view: Option<&'a View>,
    /// Why the file as it is now cannot be read, if it cannot.
    pub(crate) problem: Option<&'a str>,
    pub(crate) refresh: Duration,
}

/// Draws `screen` over the whole frame.
pub(crate) fn screen(frame: &mut Frame, screen: &Screen) {
    let [header, figures, body, footer] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(2),
    ])
    .areas(frame.area());
    let title = format!(" highwater watch {} ", screen.path.display());
    let state = screen.view.map_or(RunState::Waiting, |view| view.state);
    frame.render_widget(
        Paragraph::new(header_lines(screen.view, state))
            .block(Block::bordered().title(title.as_str())),
        header,
    );
    let Some(view) = screen.view else {
        footer_lines(frame, footer, screen);
        return;
    };
    frame.render_widget(Paragraph::new(figures_line(view)), figures);
    let [sparkline, categories, spans, ooms] = Layout::vertical([
        Constraint::Length(6),
        Constraint::Length(view.categories.len() as u16 + 3),
        // Borders, header, rows and the iteration line under them.
        Constraint::Length(view.top_spans.len() as u16 + 4),
        Constraint::Min(0),
    ])
    .areas(body);
    draw_sparkline(frame, sparkline, view);
    draw_categories(frame, categories, view);
    draw_spans(frame, spans, view);
    draw_ooms(frame, ooms, view);
    footer_lines(frame, footer, screen);
}

/// The refused allocations, when there were any: the latest ones in sentences.
fn draw_ooms(frame: &mut Frame, area: Rect, view: &View) {
    if view.oom_count == 0 {
        return;
    }
    let title = format!(
        " out of memory: {} allocation{} refused ",
        format_count(view.oom_count),
        if view.oom_count == 1 { "" } else { "s" }
    );
    let lines: Vec<Line<'static>> = view
        .ooms
        .iter()
        .map(|line| Line::from(format!(" {line}")))
        .collect();
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(ratatui::widgets::Wrap { trim: false })
            .style(Style::new().fg(Color::Red))
            .block(Block::bordered().title(title.as_str())),
        area,
    );
}

fn header_lines(view: Option<&View>, state: RunState) -> Vec<Line<'static>> {
    let state_style = match state {
        RunState::Running => Style::new().fg(Color::Green),
        RunState::Finished => Style::new().fg(Color::Cyan),
        RunState::Died => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        RunState::Waiting | RunState::Partial => Style::new().fg(Color::Yellow),
    };
    let state_span = Span::styled(format!("status: {}", state.label()), state_style);
    let Some(view) = view else {
        return vec![Line::from(state_span)];
    };
    let mut details = format!("  ·  {}", view.program);
    if view.pid != 0 {
        details.push_str(&format!(" (pid {})", view.pid));
    }
    details.push_str(&format!(
        "  ·  {} recorded",
        format_duration_ns(view.elapsed_ns)
    ));
    if let Some(age) = view.checkpoint_unix_ms.and_then(checkpoint_age) {
        details.push_str(&format!(
            "  ·  checkpoint {} ago",
            format_duration_ns(age.as_nanos().try_into().unwrap_or(u64::MAX))
        ));
    }
    vec![Line::from(vec![state_span, Span::raw(details)])]
}

/// How long ago a checkpoint taken at `unix_ms` was (`None` for a clock that went backwards).
fn checkpoint_age(unix_ms: u64) -> Option<Duration> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    now.checked_sub(Duration::from_millis(unix_ms))
}

fn figures_line(view: &View) -> Line<'static> {
    Line::from(format!(
        " live now: {}  ·  peak: {} on {}  ·  dropped events: {}",
        format_bytes(view.live_now),
        format_bytes(view.peak_bytes),
        if view.peak_device.is_empty() {
            "-"
        } else {
            &view.peak_device
        },
        format_count(view.dropped_events)
    ))
}

fn draw_sparkline(frame: &mut Frame, area: Rect, view: &View) {
    let block = Block::bordered().title(" live bytes, last minute ");
    let bars = view.recent(block.inner(area).width.into());
    let high = bars.iter().copied().max().unwrap_or(0);
    let title = format!(" live bytes, last minute (top {}) ", format_bytes(high));
    frame.render_widget(
        Sparkline::default()
            .block(Block::bordered().title(title))
            .data(&bars)
            .style(Style::new().fg(Color::Magenta)),
        area,
    );
}

fn draw_categories(frame: &mut Frame, area: Rect, view: &View) {
    let rows = view.categories.iter().map(|row| {
        Row::new(vec![
            row.category.to_string(),
            row.now.map_or_else(|| "-".to_string(), format_bytes),
            format_bytes(row.at_peak),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(14),
            Constraint::Length(14),
            Constraint::Length(14),
        ],
    )
    .header(
        Row::new(["category", "now", "at peak"]).style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title(" by category "));
    frame.render_widget(table, area);
}

fn draw_spans(frame: &mut Frame, area: Rect, view: &View) {
    let [table_area, iteration_area] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(area);
    let rows = view.top_spans.iter().map(|span| {
        Row::new(vec![
            span.path.clone(),
            format_bytes(span.peak_bytes),
            format_bytes(span.residual_per_call),
            format_count(span.calls),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Min(20),
            Constraint::Length(12),
            Constraint::Length(14),
            Constraint::Length(10),
        ],
    )
    .header(
        Row::new(["span", "peak", words::RESIDUAL_HEAD, "calls"])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title(" top spans by peak "));
    frame.render_widget(table, table_area);
    let iteration = match &view.iteration {
        Some(it) => format!(
            " iteration {} ({}): {} live at its end, change {}",
            it.index,
            it.span,
            format_bytes(it.live_bytes),
            format_bytes_delta(it.delta_bytes)
        ),
        None => " no iteration has ended yet".to_string(),
    };
    frame.render_widget(Paragraph::new(iteration), iteration_area);
}

fn footer_lines(frame: &mut Frame, area: Rect, screen: &Screen) {
    let mut lines = Vec::new();
    if let Some(problem) = screen.problem {
        lines.push(Line::styled(
            format!(" {problem}"),
            Style::new().fg(Color::Red),
        ));
    }
    lines.push(Line::from(format!(
        " q quits · refreshes every {}",
        format_duration_ns(screen.refresh.as_nanos().try_into().unwrap_or(u64::MAX))
    )));
    frame.render_widget(Paragraph::new(lines), area);
}

#[cfg(test)]
mod tests {
    use super::*;
    use highwater_testkit::sample::sample_profile;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn rendered(screen_of: &Screen, width: u16, height: u16) -> String {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|frame| screen(frame, screen_of)).unwrap();
        let buffer = terminal.backend().buffer();
        let mut text = String::new();
        for y in 0..height {
            for x in 0..width {
                text.push_str(buffer[(x, y)].symbol());
            }
            text.push('\n');
        }
        text
    }

    #[test]
    fn shows_the_profiles_figures_and_state() {
        let mut profile = sample_profile();
        profile.meta.partial = true;
        profile.meta.pid = 77;
        let view = View::new(&profile, RunState::Died);
        let text = rendered(
            &Screen {
                path: Path::new("run.json"),
                view: Some(&view),
                problem: None,
                refresh: Duration::from_millis(500),
            },
            110,
            40,
        );
        assert!(text.contains("status: died"), "{text}");
        assert!(text.contains("pid 77"), "{text}");
        let live = format!(
            "live now: {}",
            format_bytes(profile.summary.final_live_bytes)
        );
        assert!(text.contains(&live), "{text}");
        let peak = format!("peak: {} on", format_bytes(profile.summary.peak_bytes));
        assert!(text.contains(&peak), "{text}");
        assert!(text.contains(&view.top_spans[0].path), "{text}");
        let last = profile.iterations.last().unwrap();
        assert!(
            text.contains(&format!("iteration {} (", last.index)),
            "{text}"
        );
        assert!(text.contains("q quits"), "{text}");
    }

    #[test]
    fn shows_the_refusals_of_a_run_that_ran_out_of_memory() {
        let profile = crate::report::with_a_refusal();
        let view = View::new(&profile, RunState::Died);
        let screen_of = Screen {
            path: Path::new("run.json"),
            view: Some(&view),
            problem: None,
            refresh: Duration::from_millis(500),
        };
        let text = rendered(&screen_of, 140, 44);
        assert!(
            text.contains("out of memory: 3 allocations refused"),
            "{text}"
        );
        assert!(
            text.contains("the device pool refused 20.0 GiB on tpu:0 in step/forward"),
            "{text}"
        );
        let calm = View::new(
            &highwater_testkit::sample::sample_profile(),
            RunState::Running,
        );
        let text = rendered(
            &Screen {
                view: Some(&calm),
                ..screen_of
            },
            140,
            44,
        );
        assert!(!text.contains("out of memory"), "{text}");
    }

    #[test]
    fn waits_for_a_profile_and_shows_a_problem() {
        let text = rendered(
            &Screen {
                path: Path::new("run.json"),
                view: None,
                problem: Some("profile run.json is empty"),
                refresh: Duration::from_secs(1),
            },
            80,
            12,
        );
        assert!(text.contains("status: waiting for a profile"), "{text}");
        assert!(text.contains("profile run.json is empty"), "{text}");
    }
}
