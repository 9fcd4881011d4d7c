//! Progress of long commands on stderr: shown only on a terminal and without `-q`, whatever
//! `--format` writes to stdout, so a piped or CI run's output is the result alone.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `-q`: no progress and no notes on stderr, whatever the command.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
}

/// A one-line note of what attn-diff is waiting for ("starting adapter …"), on a terminal
/// only and not with `-q`, so a long wait is never silent and a piped run stays clean.
pub fn note(text: &str) {
    if !QUIET.load(std::sync::atomic::Ordering::Relaxed) && std::io::stderr().is_terminal() {
        eprintln!("attn-diff: {text}");
    }
}

/// A bar with a phase ("property cases", "shrinking cpu"), rate and ETA; does nothing when
/// hidden.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// `len` steps of `unit` (e.g. "cases"); hidden when `quiet` or stderr is not a terminal.
    pub fn new(quiet: bool, len: u64, unit: &str) -> Progress {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        // The bar takes what the terminal has left (indicatif measures it), the phase at most
        // 24 columns, rates with one decimal: a line fits an 80-column terminal.
        let template =
            format!("{{msg:24!}} {{wide_bar}} {{pos}}/{{len}} {unit} {{rate}} ETA {{eta}}");
        let style = ProgressStyle::with_template(&template)
            .expect("a valid template")
            .with_key(
                "rate",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.1}/s", s.per_sec());
                },
            );
        bar.set_style(style);
        Progress { bar: Some(bar) }
    }

    /// What is being done now.
    pub fn phase(&self, phase: impl Into<String>) {
        if let Some(b) = &self.bar {
            b.set_message(phase.into());
        }
    }

    pub fn step(&self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    /// Clear the bar before the result is printed.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    /// A handle for a callback that outlives this borrow.
    pub fn handle(&self) -> Progress {
        Progress {
            bar: self.bar.clone(),
        }
    }
}
