//! Progress of long commands on stderr: shown only on a terminal and without `-q`, whatever
//! `--format` writes to stdout, so a piped or CI run's output is the result alone.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

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
        let template = format!(
            "{{msg:<28}} {{bar:30}} {{pos}}/{{len}} {unit} ({{per_sec}}, ETA {{eta}}, {{elapsed}})"
        );
        bar.set_style(ProgressStyle::with_template(&template).expect("a valid template"));
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
