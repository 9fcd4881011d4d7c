//! `attn-diff mutants`: every mutant of the catalogue through the property runner (default
//! budget) and through the ported upstream suite alone, side by side, so the table shows what
//! small random cases catch that fixed specs at 1e-2 do not. A mutant's check stops at its
//! first kill: the table asks how soon the budget kills it and what that kill shrinks to, and
//! running the rest of the budget on a dead mutant is most of the cost (a minute or more each).

use crate::artifacts::Artifact;
use crate::pipeline::check::drive::map_ordered;
use crate::pipeline::check::run::run_check;
use crate::pipeline::check::CheckOptions;
use crate::pipeline::runner::{evaluate, Outcome};
use crate::pipeline::upstream::UpstreamCase;
use attn_backends::mutants::{mutant, CATALOGUE};
use attn_reference::reference_output;
use attn_results::compare::Tolerance;
pub use attn_results::{MutantRow, MutantsSummary};
use std::path::PathBuf;
use std::time::Instant;

/// The mutants table and the files of each kill (replay files, heat maps), not yet written.
pub struct MutantsRun {
    pub summary: MutantsSummary,
    pub artifacts: Vec<Artifact>,
}

/// Run every mutant, `jobs` at once; `upstream` is the upstream suite to compare with (may
/// be empty); `on_mutant` is told each mutant's name as it starts (for a progress display).
/// The table does not depend on `jobs`: each mutant's check is its own.
pub fn run_mutants(
    cases: u32,
    seed: u64,
    upstream: &[UpstreamCase],
    jobs: usize,
    out_dir: PathBuf,
    on_mutant: &(dyn Fn(&str) + Sync),
) -> MutantsRun {
    let checked = map_ordered(jobs, CATALOGUE, &|info| {
        on_mutant(info.name);
        let backend = mutant(info.name).expect("catalogue names are known");
        let start = Instant::now();
        let run = run_check(CheckOptions {
            seed,
            max_failures: Some(1),
            ..CheckOptions::new(vec![backend], cases, out_dir.clone())
        });
        let b = &run.summary.backends[0];
        let row = MutantRow {
            mutant: attn_results::BackendRef::mutant(info.name).to_string(),
            description: info.description.to_string(),
            trace_only: info.trace_only,
            public_bug: info.public_bug.map(str::to_string),
            killed: b.failed() > 0,
            // Cases run in index order, unsharded: the first failing index + 1. Traces run
            // only when no property case killed it.
            cases_to_kill: b.first_failing_case.map(|i| i + 1),
            traces_to_kill: b.first_failing_trace.map(|i| i + 1),
            pairs_to_kill: b.first_failing_pair.map(|i| i + 1),
            seconds: start.elapsed().as_secs_f64(),
            shrunk: b.failures.first().map(|f| f.size.clone()),
            hint: b.failures.first().and_then(|f| f.hint.clone()),
            killed_by_upstream: false,
            upstream_killer: None,
        };
        (row, run.artifacts)
    });
    let mut artifacts = Vec::new();
    let mut rows = Vec::with_capacity(checked.len());
    for (row, files) in checked {
        rows.push(row);
        artifacts.extend(files);
    }

    // The upstream suite: each case's oracle once, every mutant still alive against it.
    for uc in upstream {
        let alive: Vec<usize> = (0..rows.len())
            .filter(|&i| !rows[i].killed_by_upstream)
            .collect();
        if alive.is_empty() {
            break;
        }
        let case = uc.build();
        let expected = reference_output(&case);
        let killed = map_ordered(jobs, &alive, &|&i| {
            let backend = mutant(CATALOGUE[i].name).expect("catalogue names are known");
            matches!(
                evaluate(backend.as_ref(), &case, &expected, Tolerance::upstream()).0,
                Outcome::Diverged(_)
            )
        });
        for (&i, killed) in alive.iter().zip(killed) {
            if killed {
                rows[i].killed_by_upstream = true;
                rows[i].upstream_killer = Some(uc.label());
            }
        }
    }
    MutantsRun {
        summary: MutantsSummary {
            schema_version: attn_results::SCHEMA_VERSION,
            cases,
            traces: crate::pipeline::draw::trace::DEFAULT_TRACES,
            seed,
            upstream_cases: upstream.len(),
            rows,
        },
        artifacts,
    }
}
