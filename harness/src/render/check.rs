//! Rendering a check's summary: a text table for terminals, markdown for pull requests,
//! JSON for machines.

use crate::render::table;
use attn_results::{CheckSummary, UpstreamStatus};
use std::fmt::Write;

/// How much of the upstream suite a text summary shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// Only the upstream rows that diverged (the rest are counted in one summary line).
    Summary,
    /// Every upstream row (`-v`).
    Verbose,
}

fn fmt_err(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2e}")
    } else {
        "-".into()
    }
}

/// Declined cases per backend, grouped by feature and reason, for under the table.
fn unsupported_lines(s: &CheckSummary) -> Vec<String> {
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
fn aim_lines(s: &CheckSummary) -> Vec<String> {
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
fn trust_lines(s: &CheckSummary) -> Vec<String> {
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

/// Per-backend rows; a backend that ran nothing shows "-" rather than rates or errors. The
/// columns add up: passed + failed + declined = property + upstream + traces.
fn backend_rows(s: &CheckSummary) -> Vec<Vec<String>> {
    s.backends
        .iter()
        .map(|b| {
            let t = b.total();
            let ran = t.sent > 0;
            let dash = || "-".to_string();
            vec![
                b.backend.name.clone(),
                b.property.sent.to_string(),
                b.upstream.sent.to_string(),
                b.traces.sent.to_string(),
                if ran { t.passed.to_string() } else { dash() },
                if ran { b.failed_by_kind() } else { dash() },
                if ran { t.declined.to_string() } else { dash() },
                fmt_err(b.worst_abs_err),
                fmt_err(b.worst_rel_err),
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

const BACKEND_HEADER: [&str; 11] = [
    "backend",
    "property",
    "upstream",
    "traces",
    "passed",
    "failed",
    "declined",
    "worst abs",
    "worst rel",
    "time",
    "cases/s",
];

fn upstream_rows(s: &CheckSummary, detail: Detail) -> Vec<Vec<String>> {
    s.upstream
        .iter()
        .filter(|u| {
            detail == Detail::Verbose || matches!(u.status, UpstreamStatus::Diverged { .. })
        })
        .map(|u| {
            vec![
                u.backend.clone(),
                u.test.clone(),
                u.spec.clone(),
                format!("{}/{}", u.heads.0, u.heads.1),
                fmt_err(u.max_abs_err),
                fmt_err(u.max_rel_err),
                u.status.to_string(),
            ]
        })
        .collect()
}

const UPSTREAM_HEADER: [&str; 7] = [
    "backend", "test", "spec", "heads", "max abs", "max rel", "status",
];

/// Upstream cases per backend by outcome: "upstream suite: 58 case(s) per backend; cpu 58
/// passed; spyre-device 12 passed, 46 unsupported".
fn upstream_line(s: &CheckSummary) -> Option<String> {
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

fn headline(s: &CheckSummary) -> String {
    let shard = if s.shard.count > 1 {
        format!(", shard {}/{}", s.shard.index, s.shard.count)
    } else {
        String::new()
    };
    let verdict = s.verdict();
    format!(
        "attn-diff check: {} property case(s){}{} seed {}{shard}, {} trace(s), {} upstream case(s): {verdict}",
        s.cases,
        if s.deep { " (deep)" } else { "" },
        if s.long { " (long)" } else { "" },
        s.seed,
        s.traces,
        s.upstream.len() / s.backends.len().max(1)
    )
}

fn backend_names(s: &CheckSummary) -> Vec<String> {
    s.backends.iter().map(|b| b.backend.name.clone()).collect()
}

fn coverage_header(s: &CheckSummary) -> Vec<&str> {
    let mut h = vec!["dimension", "bucket"];
    h.extend(s.backends.iter().map(|b| b.backend.name.as_str()));
    h
}

/// Coverage: the full table with `-v`, else one line per backend.
fn coverage_text(s: &CheckSummary, detail: Detail) -> String {
    let Some(report) = &s.coverage else {
        return String::new();
    };
    let names = backend_names(s);
    let mut out = String::new();
    if detail == Detail::Verbose {
        out.push_str(&table::text(
            &coverage_header(s),
            &attn_results::coverage::rows(report, &names),
        ));
    }
    for l in attn_results::coverage::summary_lines(report, &names) {
        let _ = writeln!(out, "coverage: {l}");
    }
    if detail == Detail::Verbose {
        out.push_str(&table::text(
            &pairs_header(s),
            &attn_results::coverage::pair_rows(report, &names),
        ));
    }
    for l in attn_results::coverage::pair_lines(report, &names) {
        let _ = writeln!(out, "pairs: {l}");
    }
    out
}

fn pairs_header(s: &CheckSummary) -> Vec<&str> {
    let mut h = vec!["pair"];
    h.extend(s.backends.iter().map(|b| b.backend.name.as_str()));
    h
}

pub fn render_text(s: &CheckSummary, detail: Detail) -> String {
    let mut out = String::new();
    for b in &s.backends {
        for f in &b.failures {
            out.push_str(&f.text);
            out.push('\n');
        }
    }
    let up = upstream_rows(s, detail);
    if !up.is_empty() {
        out.push_str(&table::text(&UPSTREAM_HEADER, &up));
        out.push('\n');
    }
    out.push_str(&table::text(&BACKEND_HEADER, &backend_rows(s)));
    for l in unsupported_lines(s) {
        let _ = writeln!(out, "  {l}");
    }
    if let Some(l) = upstream_line(s) {
        let _ = writeln!(out, "{l}");
    }
    if let Some(l) = traces_line(s) {
        let _ = writeln!(out, "{l}");
    }
    for l in aim_lines(s) {
        let _ = writeln!(out, "{l}");
    }
    for l in trust_lines(s) {
        let _ = writeln!(out, "{l}");
    }
    out.push_str(&coverage_text(s, detail));
    let shared: usize = s.backends.first().map_or(0, |b| b.shared_block_cases);
    let _ = writeln!(
        out,
        "oracle: {:.1}s; property cases with shared (prefix) blocks: {shared} per backend",
        s.oracle_seconds
    );
    out.push_str(&headline(s));
    out.push('\n');
    out
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

pub fn render_markdown(s: &CheckSummary) -> String {
    let mut out = format!("### {}\n\n", headline(s));
    out.push_str(&table::markdown(&BACKEND_HEADER, &backend_rows(s)));
    if let Some(l) = traces_line(s) {
        let _ = writeln!(out, "\n{l}");
    }
    out.push('\n');
    for l in aim_lines(s).into_iter().chain(trust_lines(s)) {
        let _ = writeln!(out, "- {l}");
    }
    let lines = unsupported_lines(s);
    if !lines.is_empty() {
        let _ = write!(
            out,
            "\n<details><summary>Unsupported cases by feature</summary>\n\n{}\n</details>\n",
            lines
                .iter()
                .map(|l| format!("- {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    if let Some(report) = &s.coverage {
        let names = backend_names(s);
        out.push_str("\n<details><summary>Coverage: cases run per bucket</summary>\n\n");
        for l in attn_results::coverage::summary_lines(report, &names) {
            let _ = writeln!(out, "- {l}");
        }
        out.push('\n');
        out.push_str(&table::markdown(
            &coverage_header(s),
            &attn_results::coverage::rows(report, &names),
        ));
        out.push_str("\n</details>\n");
        out.push_str("\n<details><summary>Coverage: cases run per pair of features and shape classes</summary>\n\n");
        for l in attn_results::coverage::pair_lines(report, &names) {
            let _ = writeln!(out, "- {l}");
        }
        out.push('\n');
        out.push_str(&table::markdown(
            &pairs_header(s),
            &attn_results::coverage::pair_rows(report, &names),
        ));
        out.push_str("\n</details>\n");
    }
    if !s.upstream.is_empty() {
        out.push_str("\n<details><summary>Upstream suite</summary>\n\n");
        out.push_str(&table::markdown(
            &UPSTREAM_HEADER,
            &upstream_rows(s, Detail::Verbose),
        ));
        out.push_str("\n</details>\n");
    }
    for b in &s.backends {
        for f in &b.failures {
            let _ = write!(
                out,
                "\n<details><summary>{}: {} on {} ({} seq, {} tokens, {} heads, head size {})</summary>\n\n```text\n{}```\n</details>\n",
                f.backend, f.kind, f.origin, f.size.sequences, f.size.tokens, f.size.heads, f.size.head_size, f.text
            );
        }
    }
    out
}

pub fn render_json(s: &CheckSummary) -> String {
    attn_results::to_json(s)
}
