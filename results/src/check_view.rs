//! A check summary as rows and lines for people: what the terminal table, the markdown
//! summary and the bot's reply all show, built once. Renderers only lay these out (and
//! escape them); nothing here is parsed back.

use crate::{BackendSummary, CheckSummary, UpstreamStatus};
use std::fmt::Write;

/// A backend's verdict: a real backend passes by agreeing with the oracle, a mutant by
/// diverging from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Diverged,
    /// No case or trace reached the backend (all declined): it was not tested.
    RanNothing,
    Caught,
    Survived,
}

impl Verdict {
    pub fn of(b: &BackendSummary) -> Verdict {
        match (b.backend.is_mutant(), b.failed() > 0) {
            (false, false) if b.reached() == 0 && b.pairs.reached() == 0 => Verdict::RanNothing,
            (false, false) => Verdict::Pass,
            (false, true) => Verdict::Diverged,
            (true, true) => Verdict::Caught,
            (true, false) => Verdict::Survived,
        }
    }

    pub fn ok(self) -> bool {
        matches!(self, Verdict::Pass | Verdict::Caught)
    }

    pub fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Diverged => "DIVERGED",
            Verdict::RanNothing => "RAN NOTHING (every case declined)",
            Verdict::Caught => "caught (mutant)",
            Verdict::Survived => "SURVIVED (mutant)",
        }
    }
}

/// An error for a cell: "1.23e-3", or "-" when nothing was compared.
pub fn err_cell(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2e}")
    } else {
        "-".into()
    }
}

pub const BACKEND_HEADER: [&str; 13] = [
    "backend",
    "verdict",
    "property",
    "upstream",
    "traces",
    "pairs",
    "passed",
    "failed",
    "declined",
    "worst abs",
    "worst rel",
    "time",
    "cases/s",
];

/// Per-backend rows; a backend that ran nothing shows "-" rather than rates or errors. The
/// columns add up: passed + failed + declined = property + upstream + traces + pairs.
pub fn backend_rows(s: &CheckSummary) -> Vec<Vec<String>> {
    s.backends
        .iter()
        .map(|b| {
            let mut t = b.total();
            t += b.pairs;
            let ran = t.sent > 0;
            let dash = || "-".to_string();
            vec![
                b.backend.name.clone(),
                Verdict::of(b).label().to_string(),
                b.property.sent.to_string(),
                b.upstream.sent.to_string(),
                b.traces.sent.to_string(),
                b.pairs.sent.to_string(),
                if ran { t.passed.to_string() } else { dash() },
                if ran { b.failed_by_kind() } else { dash() },
                if ran { t.declined.to_string() } else { dash() },
                err_cell(b.worst_abs_err),
                err_cell(b.worst_rel_err),
                if ran {
                    format!("{:.1}s", b.wall_seconds)
                } else {
                    dash()
                },
                b.cases_per_second()
                    .map_or_else(dash, |r| format!("{r:.0}")),
            ]
        })
        .collect()
}

pub const UPSTREAM_HEADER: [&str; 7] = [
    "backend", "test", "spec", "heads", "max abs", "max rel", "status",
];

/// The upstream suite's rows: all of them, or only those that diverged.
pub fn upstream_rows(s: &CheckSummary, only_diverged: bool) -> Vec<Vec<String>> {
    s.upstream
        .iter()
        .filter(|u| !only_diverged || matches!(u.status, UpstreamStatus::Diverged { .. }))
        .map(|u| {
            vec![
                u.backend.clone(),
                u.test.clone(),
                u.spec.clone(),
                format!("{}/{}", u.heads.0, u.heads.1),
                err_cell(u.max_abs_err),
                err_cell(u.max_rel_err),
                u.status.to_string(),
            ]
        })
        .collect()
}

/// Upstream cases per backend by outcome: "upstream suite: 58 case(s) per backend; cpu 58
/// passed; spyre-device 12 passed, 46 unsupported".
pub fn upstream_line(s: &CheckSummary) -> Option<String> {
    if s.upstream.is_empty() {
        return None;
    }
    let per_backend: Vec<String> = s
        .backends
        .iter()
        .map(|b| {
            let rows: Vec<_> = s
                .upstream
                .iter()
                .filter(|u| u.backend == b.backend.name)
                .collect();
            let count =
                |f: &dyn Fn(&UpstreamStatus) -> bool| rows.iter().filter(|u| f(&u.status)).count();
            let mut parts = vec![format!("{} passed", count(&|x| *x == UpstreamStatus::Pass))];
            let failed = count(&|x| matches!(x, UpstreamStatus::Diverged { .. }));
            if failed > 0 {
                parts.push(format!("{failed} FAILED"));
            }
            let declined = count(&|x| matches!(x, UpstreamStatus::Unsupported { .. }));
            if declined > 0 {
                parts.push(format!("{declined} unsupported"));
            }
            let outside = count(&|x| matches!(x, UpstreamStatus::NotDeclared { .. }));
            if outside > 0 {
                parts.push(format!("{outside} outside its space"));
            }
            format!("{} {}", b.backend.name, parts.join(", "))
        })
        .collect();
    Some(format!(
        "upstream suite: {} case(s) per backend; {}",
        s.upstream.len() / s.backends.len().max(1),
        per_backend.join("; ")
    ))
}

/// Traces per backend: "traces: 60 per backend (one cache across their steps); cpu 60
/// passed (612 steps), mutant:x 1 diverged after 3 traces".
pub fn traces_line(s: &CheckSummary) -> Option<String> {
    if s.traces == 0 {
        return None;
    }
    let per: Vec<String> = s
        .backends
        .iter()
        .map(|b| {
            let t = &b.traces;
            if t.failed > 0 {
                format!(
                    "{} {} diverged (first: trace {})",
                    b.backend.name,
                    t.failed,
                    b.first_failing_trace.unwrap_or(0)
                )
            } else if t.declined == t.sent && t.declined > 0 {
                format!("{} declined all {}", b.backend.name, t.sent)
            } else {
                format!(
                    "{} {} passed ({} steps)",
                    b.backend.name, t.passed, b.trace_steps
                )
            }
        })
        .collect();
    Some(format!(
        "traces: {} per backend (one cache across their steps); {}",
        s.backends.iter().map(|b| b.traces.sent).max().unwrap_or(0),
        per.join(", ")
    ))
}

/// Invariance pairs per backend, one line each: "invariance of cpu (bit for bit; declared
/// relations marked *): batch moved in 2 of 14 pairs (3 of 40 rows, up to 1 ulps), order*
/// held 10 of 10". A moved declared relation is a `variant` failure, an undeclared one is
/// measured drift.
pub fn invariance_lines(s: &CheckSummary) -> Vec<String> {
    s.backends
        .iter()
        .filter(|b| !b.invariance.is_empty())
        .map(|b| {
            let per: Vec<String> = b
                .invariance
                .iter()
                .map(|(relation, t)| {
                    let mark = if t.declared { "*" } else { "" };
                    format!("{relation}{mark} {}", t.words())
                })
                .collect();
            format!(
                "invariance of {} (bit for bit; declared relations marked *): {}",
                b.backend.name,
                per.join(", ")
            )
        })
        .collect()
}

/// Declined cases per backend, grouped by feature and reason.
pub fn unsupported_lines(s: &CheckSummary) -> Vec<String> {
    s.backends
        .iter()
        .flat_map(|b| {
            b.unsupported
                .iter()
                .map(move |g| format!("{}: {} unsupported: {g}", b.backend.name, g.cases))
        })
        .collect()
}

/// What each backend was aimed at and how much of it reached the backend: "aim: cpu draws
/// from everything: 619 of 619 reached it", with a warning when more than a tenth of what
/// was drawn was declined (its declared space misses what it declines).
pub fn aim_lines(s: &CheckSummary) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(only) = &s.only {
        out.push(format!("aim: --only {}", only.only_args().join(" --only ")));
    }
    for b in &s.backends {
        let space = b
            .space
            .as_ref()
            .map_or_else(|| "everything".to_string(), |sp| sp.to_string());
        let declined = b.unsupported_cases();
        let mut line = format!(
            "aim: {} draws from {space}: {} of {} case(s) and trace(s) reached it",
            b.backend.name,
            b.reached(),
            b.drawn()
        );
        if declined > 0 {
            let _ = write!(
                line,
                ", {declined} declined ({:.0}%)",
                100.0 * declined as f64 / b.drawn().max(1) as f64
            );
        }
        out.push(line);
        if b.declined_too_often() {
            out.push(format!(
                "warning: {} declined more than a tenth of what it was sent; declare what it \
                 cannot run in its space (capabilities) or aim with --only, so cases are drawn \
                 inside it",
                b.backend.name
            ));
        }
    }
    out
}

/// What makes the run less than a pass besides divergences: what was not tested, backends
/// no longer sent cases, an early stop.
pub fn trust_lines(s: &CheckSummary) -> Vec<String> {
    let mut out: Vec<String> = s
        .shortfalls(s.min_run)
        .iter()
        .map(|l| format!("NOT TESTED: {l}"))
        .collect();
    for b in &s.backends {
        if let Some(why) = &b.gave_up {
            out.push(format!("{}: {why}", b.backend.name));
        }
    }
    if let Some(why) = &s.stopped {
        out.push(format!(
            "STOPPED: {why}; the summary covers what ran until then"
        ));
    }
    out
}

/// Which policy judged, then each backend's error figures per dtype
/// ([`crate::figures`]): the numbers beside the verdict.
pub fn figure_lines(s: &CheckSummary) -> Vec<String> {
    let mut out = vec![format!(
        "judged by {}{}",
        s.judge,
        if s.upstream.is_empty() {
            ""
        } else {
            "; the upstream suite by vLLM's tolerance"
        }
    )];
    for b in &s.backends {
        for f in &b.figures {
            out.push(format!("{}: {}", b.backend.name, f.describe()));
        }
    }
    out
}

/// The backends' names, in the summary's order (the coverage tables' columns).
pub fn backend_names(s: &CheckSummary) -> Vec<String> {
    s.backends.iter().map(|b| b.backend.name.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackendId, BackendRole, Tally};

    #[test]
    fn a_mutant_is_known_by_its_role_not_its_name() {
        let with = |id: BackendId, failed: usize| {
            let mut b = BackendSummary::new(id);
            b.property = Tally {
                sent: 3,
                passed: 3 - failed,
                failed,
                declined: 0,
            };
            b
        };
        let mutant = BackendId::new("window-off-by-one", BackendRole::Mutant);
        assert_eq!(Verdict::of(&with(mutant.clone(), 1)), Verdict::Caught);
        assert_eq!(Verdict::of(&with(mutant, 0)), Verdict::Survived);
        // A backend that happens to be called `mutant:…` is judged as a real one.
        let named = BackendId::new("mutant:x", BackendRole::External);
        assert_eq!(Verdict::of(&with(named.clone(), 1)), Verdict::Diverged);
        assert_eq!(Verdict::of(&with(named.clone(), 0)), Verdict::Pass);
        let mut declined = with(named, 0);
        declined.property = Tally {
            sent: 3,
            declined: 3,
            ..Tally::default()
        };
        assert_eq!(Verdict::of(&declined), Verdict::RanNothing);
        assert!(!Verdict::RanNothing.ok() && Verdict::Caught.ok());
    }
}
