//! `attn-diff mutants`: every mutant of the catalogue through the property runner (default
//! budget) and through the ported upstream suite alone, side by side, so the table shows what
//! small random cases catch that fixed specs at 1e-2 do not.

use crate::check::{run_check, CheckOptions, Shard};
use crate::compare::Tolerance;
use crate::report::CaseSize;
use crate::runner::{evaluate, Outcome};
use crate::shrink::ShrinkBudget;
use crate::upstream::UpstreamCase;
use attn_backends::mutants::{mutant, CATALOGUE};
use attn_reference::reference_output;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Debug, Serialize)]
pub struct MutantRow {
    pub mutant: String,
    pub description: String,
    pub killed: bool,
    /// Property cases run up to the first divergence.
    pub cases_to_kill: Option<usize>,
    pub seconds: f64,
    pub shrunk: Option<CaseSize>,
    /// Killed by the upstream suite alone (its specs, its 1e-2 tolerance).
    pub killed_by_upstream: bool,
    /// The first upstream case that killed it.
    pub upstream_killer: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MutantsSummary {
    pub cases: u32,
    pub seed: u64,
    pub upstream_cases: usize,
    pub rows: Vec<MutantRow>,
}

impl MutantsSummary {
    pub fn all_killed(&self) -> bool {
        self.rows.iter().all(|r| r.killed)
    }
}

/// Run every mutant; `upstream` is the upstream suite to compare with (may be empty).
pub fn run_mutants(
    cases: u32,
    seed: u64,
    upstream: &[UpstreamCase],
    out_dir: PathBuf,
) -> MutantsSummary {
    let mut rows: Vec<MutantRow> = CATALOGUE
        .iter()
        .map(|info| {
            let backend = mutant(info.name).expect("catalogue names are known");
            let start = Instant::now();
            let summary = run_check(CheckOptions {
                backends: vec![backend],
                cases,
                seed,
                shard: Shard::ALL,
                deep: false,
                upstream: vec![],
                out_dir: out_dir.clone(),
                shrink: ShrinkBudget::default(),
                on_case: None,
            });
            let b = &summary.backends[0];
            MutantRow {
                mutant: format!("mutant:{}", info.name),
                description: info.description.to_string(),
                killed: b.failed > 0,
                cases_to_kill: b.first_divergence_at,
                seconds: start.elapsed().as_secs_f64(),
                shrunk: b.failures.first().map(|f| f.size.clone()),
                killed_by_upstream: false,
                upstream_killer: None,
            }
        })
        .collect();

    // The upstream suite: each case's oracle once, every mutant still alive against it.
    for uc in upstream {
        if rows.iter().all(|r| r.killed_by_upstream) {
            break;
        }
        let case = uc.build();
        let expected = reference_output(&case);
        for (info, row) in CATALOGUE.iter().zip(rows.iter_mut()) {
            if row.killed_by_upstream {
                continue;
            }
            let backend = mutant(info.name).expect("catalogue names are known");
            if let (Outcome::Diverged(_), _) =
                evaluate(backend.as_ref(), &case, &expected, Tolerance::upstream())
            {
                row.killed_by_upstream = true;
                row.upstream_killer = Some(uc.label());
            }
        }
    }
    MutantsSummary {
        cases,
        seed,
        upstream_cases: upstream.len(),
        rows,
    }
}

fn size(s: &Option<CaseSize>) -> String {
    s.as_ref().map_or("-".into(), |s| {
        format!(
            "{} seq, {} tok, len {}, {}/{} heads, d {}",
            s.sequences, s.tokens, s.max_seq_len, s.heads, s.kv_heads, s.head_size
        )
    })
}

fn rows(s: &MutantsSummary) -> Vec<Vec<String>> {
    s.rows
        .iter()
        .map(|r| {
            vec![
                r.mutant.clone(),
                if r.killed { "yes".into() } else { "NO".into() },
                r.cases_to_kill.map_or("-".into(), |n| n.to_string()),
                format!("{:.1}", r.seconds),
                size(&r.shrunk),
                if r.killed_by_upstream {
                    "yes".into()
                } else {
                    "no".into()
                },
            ]
        })
        .collect()
}

const HEADER: [&str; 6] = [
    "mutant",
    "killed",
    "cases",
    "seconds",
    "shrunk case",
    "upstream suite",
];

fn kill_rate(s: &MutantsSummary) -> String {
    let n = s.rows.len();
    let k = s.rows.iter().filter(|r| r.killed).count();
    let u = s.rows.iter().filter(|r| r.killed_by_upstream).count();
    format!(
        "kill rate: attn-diff {k}/{n} ({:.0}%) with {} property cases; upstream suite alone {u}/{n} ({:.0}%) over {} cases",
        100.0 * k as f64 / n as f64,
        s.cases,
        100.0 * u as f64 / n as f64,
        s.upstream_cases
    )
}

pub fn render_text(s: &MutantsSummary) -> String {
    format!(
        "{}{}\n",
        crate::table::text(&HEADER, &rows(s)),
        kill_rate(s)
    )
}

pub fn render_markdown(s: &MutantsSummary) -> String {
    format!(
        "{}\n{}\n",
        crate::table::markdown(&HEADER, &rows(s)),
        kill_rate(s)
    )
}
