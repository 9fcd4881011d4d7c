//! Rendering the mutants table: per mutant, whether the default budget and the upstream suite
//! alone kill it, and the shrunk case.

use attn_results::MutantsSummary;

fn rows(s: &MutantsSummary) -> Vec<Vec<String>> {
    s.rows
        .iter()
        .map(|r| {
            vec![
                r.mutant.clone(),
                if r.killed { "yes".into() } else { "NO".into() },
                r.cases_to_kill.map_or("-".into(), |n| n.to_string()),
                r.traces_to_kill.map_or("-".into(), |n| n.to_string()),
                r.pairs_to_kill.map_or("-".into(), |n| n.to_string()),
                format!("{:.1}", r.seconds),
                r.shrunk.as_ref().map_or("-".into(), |s| s.to_string()),
                if r.killed_by_upstream {
                    "yes".into()
                } else {
                    "no".into()
                },
                r.public_bug.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect()
}

const HEADER: [&str; 9] = [
    "mutant",
    "killed",
    "cases",
    "traces",
    "pairs",
    "seconds",
    "shrunk case",
    "upstream suite",
    "public bug",
];

fn kill_rate(s: &MutantsSummary) -> String {
    let n = s.rows.len();
    let k = s.rows.iter().filter(|r| r.killed).count();
    let u = s.rows.iter().filter(|r| r.killed_by_upstream).count();
    format!(
        "kill rate: attn-diff {k}/{n} ({:.0}%) with {} property cases and {} traces (cases: the first diverging property case, - when no single-step case did; traces: the first diverging trace, run only when no property case killed it); upstream suite alone {u}/{n} ({:.0}%) over {} cases",
        100.0 * k as f64 / n as f64,
        s.cases,
        s.traces,
        100.0 * u as f64 / n as f64,
        s.upstream_cases
    )
}

pub fn render_text(s: &MutantsSummary) -> String {
    format!(
        "{}{}\n",
        crate::render::table::text(&HEADER, &rows(s)),
        kill_rate(s)
    )
}

pub fn render_markdown(s: &MutantsSummary) -> String {
    format!(
        "{}\n{}\n",
        attn_results::markdown::table(&HEADER, &rows(s)),
        kill_rate(s)
    )
}
