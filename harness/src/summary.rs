//! Rendering a check's summary: a text table for terminals, markdown for pull requests,
//! JSON for machines.

use crate::check::CheckSummary;
use std::fmt::Write;

fn fmt_err(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.2e}")
    }
}

fn unsupported(b: &crate::check::BackendSummary) -> String {
    b.unsupported.values().sum::<usize>().to_string()
}

/// Unsupported cases per backend and reason, most frequent first, for under the table.
fn unsupported_lines(s: &CheckSummary) -> Vec<String> {
    let mut lines = Vec::new();
    for b in &s.backends {
        let mut reasons: Vec<(&String, &usize)> = b.unsupported.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (r, n) in reasons {
            lines.push(format!("{}: {n} unsupported: {r}", b.backend));
        }
    }
    lines
}

/// Per-backend rows: name, cases, passed, failed, unsupported, worst abs, worst rel, time, cases/s.
fn backend_rows(s: &CheckSummary) -> Vec<Vec<String>> {
    s.backends
        .iter()
        .map(|b| {
            vec![
                b.backend.clone(),
                b.cases_run.to_string(),
                b.passed.to_string(),
                if b.failed == 0 {
                    "0".into()
                } else {
                    format!(
                        "{} ({})",
                        b.failed,
                        b.divergences
                            .iter()
                            .map(|(k, n)| format!("{n} {k}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
                unsupported(b),
                fmt_err(b.worst_abs_err),
                fmt_err(b.worst_rel_err),
                format!("{:.1}s", b.wall_seconds),
                format!("{:.0}", b.cases_per_second()),
            ]
        })
        .collect()
}

const BACKEND_HEADER: [&str; 9] = [
    "backend",
    "cases",
    "passed",
    "failed",
    "unsupported",
    "worst abs",
    "worst rel",
    "time",
    "cases/s",
];

fn upstream_rows(s: &CheckSummary) -> Vec<Vec<String>> {
    s.upstream
        .iter()
        .map(|u| {
            vec![
                u.backend.clone(),
                u.test.to_string(),
                u.spec.clone(),
                format!("{}/{}", u.heads.0, u.heads.1),
                fmt_err(u.max_abs_err),
                fmt_err(u.max_rel_err),
                u.status.clone(),
            ]
        })
        .collect()
}

const UPSTREAM_HEADER: [&str; 7] = [
    "backend", "test", "spec", "heads", "max abs", "max rel", "status",
];

fn headline(s: &CheckSummary) -> String {
    let shard = if s.shard.count > 1 {
        format!(", shard {}/{}", s.shard.index, s.shard.count)
    } else {
        String::new()
    };
    let verdict = if s.any_divergence() {
        "DIVERGENCE"
    } else {
        "all passed"
    };
    format!(
        "attn-diff check: {} property case(s){} seed {}{shard}, {} upstream case(s): {verdict}",
        s.cases,
        if s.deep { " (deep)" } else { "" },
        s.seed,
        s.upstream.len() / s.backends.len().max(1)
    )
}

pub fn render_text(s: &CheckSummary) -> String {
    let mut out = String::new();
    for b in &s.backends {
        for f in &b.failures {
            out.push_str(&f.text);
            out.push('\n');
        }
    }
    if !s.upstream.is_empty() {
        out.push_str(&crate::table::text(&UPSTREAM_HEADER, &upstream_rows(s)));
        out.push('\n');
    }
    let rows = backend_rows(s);
    out.push_str(&crate::table::text(&BACKEND_HEADER, &rows));
    for l in unsupported_lines(s) {
        let _ = writeln!(out, "  {l}");
    }
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

pub fn render_markdown(s: &CheckSummary) -> String {
    let mut out = format!("### {}\n\n", headline(s));
    let rows = backend_rows(s);
    out.push_str(&crate::table::markdown(&BACKEND_HEADER, &rows));
    let lines = unsupported_lines(s);
    if !lines.is_empty() {
        let _ = write!(
            out,
            "\n<details><summary>Unsupported cases by reason</summary>\n\n{}\n</details>\n",
            lines
                .iter()
                .map(|l| format!("- {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    if !s.upstream.is_empty() {
        out.push_str("\n<details><summary>Upstream suite</summary>\n\n");
        out.push_str(&crate::table::markdown(&UPSTREAM_HEADER, &upstream_rows(s)));
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
    serde_json::to_string_pretty(s)
        .unwrap_or_else(|e| format!("{{\"error\": \"cannot serialize summary: {e}\"}}"))
}
