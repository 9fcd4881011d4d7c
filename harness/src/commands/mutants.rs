//! `attn-diff mutants`: what the harness catches, and what the upstream suite alone misses.

use crate::cli::{GlobalArgs, MutantsArgs};
use crate::pipeline::check::CheckOptions;
use crate::pipeline::mutants::run_mutants;
use crate::pipeline::upstream;
use crate::progress::Progress;
use crate::render::mutants::{render_markdown, render_text};
use crate::render::Format;

pub fn run(args: MutantsArgs, global: GlobalArgs) -> anyhow::Result<bool> {
    let suite: Vec<_> = upstream::full_suite()
        .into_iter()
        .filter(|c| {
            args.upstream_all_heads || c.heads == (8, 2) || c.test == upstream::UpstreamTest::Cross
        })
        .collect();
    let total = attn_backends::mutants::CATALOGUE.len();
    let jobs = args
        .jobs
        .map_or_else(super::check::default_jobs, |n| n as usize);
    super::check::use_cores(jobs);
    let progress = Progress::new(global.quiet, total as u64, "mutants");
    let run = run_mutants(
        args.cases.unwrap_or_else(CheckOptions::default_cases),
        args.seed,
        &suite,
        jobs,
        args.out,
        &|name| {
            progress.phase(attn_results::BackendRef::mutant(name).to_string());
            progress.step();
        },
    );
    progress.phase("upstream suite");
    progress.finish();
    crate::artifacts::write_all(&run.artifacts);
    let text = match args.format {
        Format::Text => render_text(&run.summary),
        Format::Markdown => render_markdown(&run.summary),
        Format::Json => attn_results::to_json(&run.summary),
    };
    println!("{text}");
    Ok(run.summary.all_killed())
}
