//! How a command ended: what `main` turns into the exit status.

/// How a command ended, as its exit status says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything agreed (exit 0).
    Passed,
    /// A divergence, or less tested than asked (exit 1).
    Failed,
    /// Stopped by a signal before it finished; its summary says so (exit 130).
    Interrupted,
}

impl From<bool> for Outcome {
    fn from(passed: bool) -> Self {
        if passed {
            Outcome::Passed
        } else {
            Outcome::Failed
        }
    }
}
