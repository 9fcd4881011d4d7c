//! GitHub markdown of attn-diff's results, one renderer for the CLI's `--format markdown`
//! and the bot's reply. Everything a result holds is escaped where it lands: a cell cannot
//! break its table or open HTML, a code span or fenced block holds any text whatever
//! backticks it contains.

use crate::check_view::{self, Verdict};
use crate::{CheckSummary, FailureRecord};
use std::fmt::Write;

/// Code span holding `s` whatever backticks it contains.
pub fn code(s: &str) -> String {
    let longest = longest_run(s, '`');
    let ticks = "`".repeat(longest + 1);
    let pad = if s.starts_with('`') || s.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{ticks}{pad}{s}{pad}{ticks}")
}

fn longest_run(s: &str, c: char) -> usize {
    let (mut best, mut run) = (0, 0);
    for x in s.chars() {
        run = if x == c { run + 1 } else { 0 };
        best = best.max(run);
    }
    best
}

/// A fenced block holding `s` whatever fences it contains.
pub fn fenced(s: &str, lang: &str) -> String {
    let fence = "`".repeat(longest_run(s, '`').max(2) + 1);
    let nl = if s.ends_with('\n') { "" } else { "\n" };
    format!("{fence}{lang}\n{s}{nl}{fence}\n")
}

/// Text for a table cell or a list line: no pipes, no newlines, no HTML.
pub fn cell(s: &str) -> String {
    s.replace('|', "\\|")
        .replace(['\n', '\r'], " ")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A GitHub table; every header and cell goes through [`cell`].
pub fn table<S: AsRef<str>>(header: &[S], rows: &[Vec<String>]) -> String {
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<String> = cells.map(cell).collect();
        format!("| {} |\n", cells.join(" | "))
    };
    let mut out = line(&mut header.iter().map(AsRef::as_ref));
    let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

/// A collapsed section: `summary` is escaped, `body` is markdown.
pub fn details(summary: &str, body: &str) -> String {
    format!(
        "\n<details><summary>{}</summary>\n\n{body}\n</details>\n",
        cell(summary)
    )
}

fn bullets(lines: &[String]) -> String {
    lines.iter().map(|l| format!("- {}\n", cell(l))).collect()
}

/// The backend table with its verdicts in bold where they are not good.
fn backend_table(s: &CheckSummary) -> String {
    let mut rows = check_view::backend_rows(s);
    for (row, b) in rows.iter_mut().zip(&s.backends) {
        if !Verdict::of(b).ok() {
            row[1] = format!("**{}**", row[1]);
        }
    }
    // The bold markers are ours, so the rows are escaped before they are added.
    let mut out = table(&check_view::BACKEND_HEADER, &[]);
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .map(
                |c| match c.strip_prefix("**").and_then(|c| c.strip_suffix("**")) {
                    Some(inner) => format!("**{}**", cell(inner)),
                    None => cell(c),
                },
            )
            .collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out
}

/// One failure, collapsed: its report in a fenced block, then `note` (markdown, e.g. where
/// its replay file is).
pub fn failure_section(f: &FailureRecord, note: &str) -> String {
    let summary = format!(
        "{}: {} on {} ({} seq, {} tokens, {} heads, head size {})",
        f.backend,
        f.kind,
        f.origin,
        f.size.sequences,
        f.size.tokens,
        f.size.heads,
        f.size.head_size
    );
    details(&summary, &format!("{}{note}", fenced(&f.text, "text")))
}

/// A check's body: the backend table, what reached each backend and why a run is less than a
/// pass, declined cases, coverage, the upstream suite and every minimal failing case (each
/// followed by `note_of(failure)`).
pub fn check_body(s: &CheckSummary, note_of: &dyn Fn(&FailureRecord) -> String) -> String {
    let mut out = backend_table(s);
    let mut lines: Vec<String> = check_view::upstream_line(s).into_iter().collect();
    lines.extend(check_view::traces_line(s));
    lines.extend(check_view::invariance_lines(s));
    lines.extend(check_view::aim_lines(s));
    lines.extend(check_view::trust_lines(s));
    lines.extend(check_view::figure_lines(s));
    if !lines.is_empty() {
        out.push('\n');
        out.push_str(&bullets(&lines));
    }
    let unsupported = check_view::unsupported_lines(s);
    if !unsupported.is_empty() {
        out.push_str(&details(
            "Unsupported cases by feature",
            &bullets(&unsupported),
        ));
    }
    if let Some(report) = &s.coverage {
        let names = check_view::backend_names(s);
        let header = |first: &[&str]| -> Vec<String> {
            first
                .iter()
                .map(|h| h.to_string())
                .chain(names.iter().cloned())
                .collect()
        };
        let buckets = format!(
            "{}\n{}",
            bullets(&crate::coverage::summary_lines(report, &names)),
            table(
                &header(&["dimension", "bucket"]),
                &crate::coverage::rows(report, &names)
            )
        );
        out.push_str(&details("Coverage: cases run per bucket", &buckets));
        let pairs = format!(
            "{}\n{}",
            bullets(&crate::pairs::pair_lines(report, &names)),
            table(&header(&["pair"]), &crate::pairs::pair_rows(report, &names))
        );
        out.push_str(&details(
            "Coverage: cases run per pair of features and shape classes",
            &pairs,
        ));
        out.push_str(&details(
            "Coverage: triples of shape classes",
            &bullets(&crate::triples::triple_lines(report, &names)),
        ));
    }
    if !s.upstream.is_empty() {
        out.push_str(&details(
            "Upstream suite",
            &table(
                &check_view::UPSTREAM_HEADER,
                &check_view::upstream_rows(s, false),
            ),
        ));
    }
    let failures: Vec<&FailureRecord> = s.backends.iter().flat_map(|b| &b.failures).collect();
    if !failures.is_empty() {
        out.push_str("\n#### Minimal failing cases\n");
        for f in failures {
            out.push_str(&failure_section(f, &note_of(f)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_spans_survive_backticks() {
        assert_eq!(code("a"), "`a`");
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("`x"), "`` `x ``");
        assert_eq!(fenced("```\nx", "text"), "````text\n```\nx\n````\n");
    }

    #[test]
    fn cells_cannot_break_the_table_or_inject_html() {
        assert_eq!(cell("a|b\n<img>"), "a\\|b &lt;img&gt;");
        let t = table(&["a|b", "c"], &[vec!["<x>".into(), "1\n2".into()]]);
        assert_eq!(t, "| a\\|b | c |\n|---|---|\n| &lt;x&gt; | 1 2 |\n");
    }

    #[test]
    fn a_failure_report_cannot_close_its_block_or_its_section() {
        let f = FailureRecord {
            environment: Default::default(),
            caveat: None,
            backend: "cpu".into(),
            origin: crate::Origin::Property { seed: 1, index: 0 },
            kind: crate::DivergenceKind::Mismatch,
            message: String::new(),
            size: crate::CaseSize {
                sequences: 1,
                tokens: 1,
                max_seq_len: 1,
                heads: 1,
                kv_heads: 1,
                head_size: 8,
            },
            replay: None,
            shrink: None,
            first: None,
            worst: None,
            hint: None,
            heatmap: None,
            hint_unshrunk: None,
            tolerance: None,
            judge: None,
            also: Vec::new(),
            external: None,
            class: None,
            text: "```\n</details><img src=x>\n````".into(),
        };
        let md = failure_section(&f, "");
        // The fence is longer than any run of backticks in the report.
        assert!(md.contains("\n`````text\n"), "{md}");
        assert_eq!(md.matches("</details>").count(), 2, "{md}");
        assert!(md.trim_end().ends_with("`````\n\n</details>"), "{md}");
    }
}
