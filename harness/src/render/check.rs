//! Rendering a check's summary: a text table for terminals, markdown for pull requests,
//! JSON for machines.

use crate::render::table;
use attn_results::check_view::{
    aim_lines, backend_names, backend_rows, figure_lines, invariance_lines, traces_line,
    trust_lines, unsupported_lines, upstream_line, upstream_rows, BACKEND_HEADER, UPSTREAM_HEADER,
};
use attn_results::CheckSummary;
use std::fmt::Write;

/// How much of the upstream suite a text summary shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// Only the upstream rows that diverged (the rest are counted in one summary line).
    Summary,
    /// Every upstream row (`-v`).
    Verbose,
}

fn headline(s: &CheckSummary) -> String {
    let shard = if s.shard.count > 1 {
        format!(", shard {}/{}", s.shard.index, s.shard.count)
    } else {
        String::new()
    };
    let verdict = s.verdict();
    // A run stopped early says what ran, not what was asked for.
    let ran = |asked: usize, sent: &dyn Fn(&attn_results::BackendSummary) -> usize| match &s.stopped
    {
        Some(_) => {
            let most = s.backends.iter().map(sent).max().unwrap_or(0);
            format!("{most} of {asked}")
        }
        None => asked.to_string(),
    };
    // A recording's calls, when the run judged one (the same calls reach every backend).
    let calls = s
        .backends
        .iter()
        .map(|b| b.recorded.sent)
        .max()
        .unwrap_or(0);
    let recorded = if calls > 0 {
        format!(", {calls} recorded call(s)")
    } else {
        String::new()
    };
    format!(
        "attn-diff check: {} property case(s){}{} seed {}{shard}, {} trace(s), {} invariance pair(s), {} upstream case(s){recorded}: {verdict}",
        ran(s.cases as usize, &|b| b.property.sent),
        if s.deep { " (deep)" } else { "" },
        if s.long { " (long)" } else { "" },
        s.seed,
        ran(s.traces as usize, &|b| b.traces.sent),
        ran(s.pairs as usize, &|b| b.pairs.sent),
        s.upstream.len() / s.backends.len().max(1)
    )
}

/// One line per backend with failures: how many distinct classes, and how many fell in each.
fn classes_text(s: &CheckSummary) -> String {
    let mut out = String::new();
    for b in s.backends.iter().filter(|b| !b.failures.is_empty()) {
        let counts: Vec<String> = b
            .failures
            .iter()
            .map(|f| f.class.as_ref().map_or(1, |c| c.count()).to_string())
            .collect();
        let _ = writeln!(
            out,
            "distinct failures: {} on {} ({} failure(s) in each, in report order)",
            b.failures.len(),
            b.backend.name,
            counts.join(", ")
        );
    }
    out
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
    for l in attn_results::triples::triple_lines(report, &names) {
        let _ = writeln!(out, "triples: {l}");
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
    let up = upstream_rows(s, detail == Detail::Summary);
    if !up.is_empty() {
        out.push_str(&table::text(&UPSTREAM_HEADER, &up));
        out.push('\n');
    }
    out.push_str(&table::text(&BACKEND_HEADER, &backend_rows(s)));
    out.push_str(&classes_text(s));
    for l in unsupported_lines(s) {
        let _ = writeln!(out, "  {l}");
    }
    if let Some(l) = upstream_line(s) {
        let _ = writeln!(out, "{l}");
    }
    if let Some(l) = traces_line(s) {
        let _ = writeln!(out, "{l}");
    }
    for l in invariance_lines(s) {
        let _ = writeln!(out, "{l}");
    }
    for l in aim_lines(s) {
        let _ = writeln!(out, "{l}");
    }
    for l in trust_lines(s) {
        let _ = writeln!(out, "{l}");
    }
    for l in figure_lines(s) {
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

/// Markdown for a pull request: the headline, then the body the bot's reply shows too.
pub fn render_markdown(s: &CheckSummary) -> String {
    let classes = classes_text(s);
    format!(
        "### {}\n\n{}{}",
        headline(s),
        if classes.is_empty() {
            String::new()
        } else {
            format!("{}\n", classes.replace('\n', "  \n"))
        },
        attn_results::markdown::check_body(s, &|_| String::new())
    )
}

pub fn render_json(s: &CheckSummary) -> String {
    attn_results::to_json(s)
}
