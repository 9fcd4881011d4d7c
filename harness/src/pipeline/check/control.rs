//! When a check stops early, and which backends it stops sending cases to: `--max-failures`
//! distinct failures (`-x` is 1), an interrupt, and a backend that failed the same way (kind and message, its
//! numbers aside) `give_up_after` times in a row (an adapter that crashes on every case would
//! otherwise cost a restart per case), or that timed out on a third of what it was sent
//! (after at most [`TIMEOUTS_BEFORE_GIVING_UP`] timeouts: each costs the whole timeout).

use crate::pipeline::runner::Outcome;
use attn_results::DivergenceKind;

/// Timeouts after which a backend that timed out on a third of what it was sent gets no more
/// (fewer when `--give-up-after` is lower): an adapter that hangs on every second call costs
/// three timeouts and one bounded shrink, about four timeouts in all.
pub const TIMEOUTS_BEFORE_GIVING_UP: usize = 3;

pub struct RunControl {
    max_failures: Option<usize>,
    give_up_after: usize,
    failures: usize,
    /// Per backend: its last failure (kind and message) and how many in a row were alike.
    streaks: Vec<Option<(DivergenceKind, String, usize)>>,
    /// Per backend: cases and traces it answered (or failed to), and how many timed out.
    sent: Vec<usize>,
    timeouts: Vec<usize>,
    /// Per backend: why no more cases are sent to it.
    gave_up: Vec<Option<String>>,
    /// Why the run stopped early.
    pub stopped: Option<String>,
}

impl RunControl {
    pub fn new(backends: usize, max_failures: Option<usize>, give_up_after: usize) -> Self {
        RunControl {
            max_failures,
            give_up_after: give_up_after.max(1),
            failures: 0,
            streaks: vec![None; backends],
            sent: vec![0; backends],
            timeouts: vec![0; backends],
            gave_up: vec![None; backends],
            stopped: None,
        }
    }

    /// Whether to stop the run now: interrupted, or `--max-failures` reached.
    pub fn should_stop(&mut self) -> bool {
        if self.stopped.is_some() {
            return true;
        }
        if crate::interrupt::interrupted() {
            self.stopped = Some("interrupted".into());
        } else if let Some(m) = self.max_failures.filter(|&m| self.failures >= m) {
            self.stopped = Some(format!(
                "stopped after {m} distinct failure(s) (--max-failures)"
            ));
        }
        self.stopped.is_some()
    }

    /// The backends of `members` still sent cases.
    pub fn live(&self, members: &[usize]) -> Vec<usize> {
        members
            .iter()
            .copied()
            .filter(|&m| self.gave_up[m].is_none())
            .collect()
    }

    /// Why backend `i` gets no more cases, if it does not.
    pub fn gave_up(&self, i: usize) -> Option<&str> {
        self.gave_up[i].as_deref()
    }

    /// Note backend `i`'s outcome on one case or trace.
    pub fn note(&mut self, i: usize, outcome: &Outcome) {
        match outcome {
            Outcome::Diverged(d) => self.note_failure(i, d.kind, &d.message),
            _ => self.note_pass(i),
        }
    }

    /// Note a case or trace of backend `i` that passed or was declined.
    pub fn note_pass(&mut self, i: usize) {
        self.sent[i] += 1;
        self.streaks[i] = None;
    }

    /// Note a new class of failure: `--max-failures` counts classes, not the cases in them.
    pub fn note_class(&mut self) {
        self.failures += 1;
    }

    /// Note a failure of backend `i` (of a case or a trace).
    pub fn note_failure(&mut self, i: usize, kind: DivergenceKind, message: &str) {
        self.sent[i] += 1;
        if kind == DivergenceKind::Timeout {
            self.timeouts[i] += 1;
            // Timeouts that alternate with passes (or declines) never make a streak, yet each
            // costs the whole timeout: a third of what it is sent timing out is enough.
            let (t, n) = (self.timeouts[i], self.sent[i]);
            let enough = self.give_up_after.min(TIMEOUTS_BEFORE_GIVING_UP);
            if t >= enough && 3 * t >= n && self.gave_up[i].is_none() {
                self.gave_up[i] = Some(format!("no more cases sent after {t} of {n} timed out"));
            }
        }
        // A wrong value is news every time; an error that repeats word for word is not.
        if kind == DivergenceKind::Mismatch || kind == DivergenceKind::NonFinite {
            self.streaks[i] = None;
            return;
        }
        // The exception raised, numbers aside: "a batch of 3" and "a batch of 5" are the same
        // failure, and so are two tracebacks of one exception through other frames.
        let shape = crate::failure::exception::Exception::of(message).key;
        let n = match &self.streaks[i] {
            Some((k, m, n)) if *k == kind && *m == shape => n + 1,
            _ => 1,
        };
        self.streaks[i] = Some((kind, shape, n));
        if n >= self.give_up_after && self.gave_up[i].is_none() {
            let first_line = message.lines().next().unwrap_or("");
            self.gave_up[i] = Some(format!(
                "no more cases sent after {n} identical failures in a row ({kind}: {first_line})"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_alternating_with_passes_are_given_up_on() {
        let mut c = RunControl::new(1, None, 5);
        for _ in 0..2 {
            c.note_failure(0, DivergenceKind::Timeout, "no answer in 20 s");
            c.note_pass(0);
        }
        assert!(c.gave_up(0).is_none(), "2 timeouts are not enough");
        c.note_failure(0, DivergenceKind::Timeout, "no answer in 20 s");
        let why = c
            .gave_up(0)
            .expect("3 of 5 timed out, whatever give_up_after");
        assert!(why.contains("3 of 5 timed out"), "{why}");
        // Every third call hanging (one pass and one decline between) is as bad.
        let mut third = RunControl::new(1, None, 5);
        for _ in 0..3 {
            third.note_failure(0, DivergenceKind::Timeout, "no answer in 20 s");
            third.note_pass(0);
            third.note_pass(0);
        }
        assert!(third.gave_up(0).is_some(), "3 of 7 timed out");
        let mut rare = RunControl::new(1, None, 5);
        for _ in 0..3 {
            rare.note_failure(0, DivergenceKind::Timeout, "no answer in 20 s");
            for _ in 0..4 {
                rare.note_pass(0);
            }
        }
        assert!(rare.gave_up(0).is_none(), "3 of 15 is no large share");
        let mut quarter = RunControl::new(1, None, 5);
        for _ in 0..4 {
            for _ in 0..3 {
                quarter.note_pass(0);
            }
            quarter.note_failure(0, DivergenceKind::Timeout, "no answer in 20 s");
        }
        assert!(quarter.gave_up(0).is_none(), "4 of 16 is under a third");
    }
}
