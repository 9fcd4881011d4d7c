//! `attn-diff check`: property cases, serving traces and upstream specs through backends
//! against the oracle; the summary rendered, failures' files written.

use super::outcome::Outcome;
use super::setup::{select_backends_with, usage};
use crate::cli::{CheckArgs, CheckFormat, GlobalArgs};
use crate::pipeline::check::run::run_check;
use crate::pipeline::check::{CheckOptions, Event};
use crate::pipeline::shrink::ShrinkBudget;
use crate::pipeline::upstream;
use crate::progress::Progress;
use crate::render::check::{render_json, render_markdown, render_text, Detail};

/// The failures folder must take files before the run starts: a run that finds a divergence
/// and cannot write its replay file would lose it, and print paths that do not exist.
fn check_writable(dir: &std::path::Path) -> anyhow::Result<()> {
    let name = dir.display();
    std::fs::create_dir_all(dir)
        .map_err(|e| usage(format!("--out {name}: cannot create it: {e}")))?;
    let probe = dir.join(format!(".attn-diff-probe-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .map_err(|e| usage(format!("--out {name}: cannot write there: {e}")))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Subjects run at once by default: one per core.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `--jobs N` uses N cores: N workers, each backend call on its caller alone, and an oracle
/// pool N threads wide.
pub fn use_cores(jobs: usize) {
    attn_backends::threads::set_caller_only(true);
    attn_reference::oracle::use_threads(jobs);
}

pub fn run(mut args: CheckArgs, global: GlobalArgs) -> anyhow::Result<Outcome> {
    // First: a signal from here on stops the run with its summary, never silently.
    crate::interrupt::install();
    check_writable(&args.out)?;
    let jobs = args.jobs.map_or_else(default_jobs, |n| n as usize);
    args.external.processes = jobs;
    use_cores(jobs);
    let mut up = if args.upstream {
        upstream::full_suite()
    } else if args.no_upstream {
        Vec::new()
    } else {
        upstream::small_suite()
    };
    if !args.specs.is_empty() {
        for c in upstream::cases_for_specs(&args.specs).map_err(usage)? {
            if !up.contains(&c) {
                up.push(c);
            }
        }
    }
    // A recording replaces drawn cases: its calls alone, on the engine and every backend.
    let recorded = match &args.recording {
        Some(dir) => {
            let r = crate::pipeline::recording::load(dir).map_err(|e| usage(e.to_string()))?;
            for (why, n) in r.left_out() {
                eprintln!("attn-diff: the engine left {n} calls out of the recording: {why}");
            }
            up.clear();
            r.calls
        }
        None => Vec::new(),
    };
    // An interrupt while an adapter starts (its handshake) fails the start: the run then
    // runs nothing and says so in its summary, like any interrupted run.
    let (mut backends, stopped_while_starting) =
        match select_backends_with(&args.backend, &args.external) {
            Ok(b) => (b, None),
            Err(e) if crate::interrupt::interrupted() => (Vec::new(), Some(e)),
            Err(e) => return Err(e),
        };
    for engine in crate::pipeline::recording::engine::EngineOutputs::of(&recorded) {
        backends.push(std::sync::Arc::new(engine));
    }
    let only = args
        .only
        .iter()
        .fold(attn_reference::Space::default(), |a, b| a.intersect(b));
    // A backend whose space is empty would run nothing: that is a usage error, not a pass.
    for b in &backends {
        let space = crate::pipeline::check::space_of(b.as_ref(), &only);
        if let Some(why) = space.emptiness() {
            return Err(usage(format!(
                "{} would run nothing: {why} once `--only {}` narrows what it declares ({})",
                b.name(),
                only.only_args().join(" --only "),
                attn_backends::declared_space(b.as_ref())
            )));
        }
    }
    let replaying = args.recording.is_some();
    let cases = match args.cases {
        _ if replaying => 0,
        Some(n) => n,
        None => CheckOptions::default_cases(),
    };
    let trace_count = if replaying { 0 } else { args.traces };
    let shard = args.shard;
    let owned = (0..cases as usize).filter(|&i| shard.owns(i)).count();
    let traces = (0..trace_count as usize).filter(|&i| shard.owns(i)).count();
    let pairs = args
        .pairs
        .unwrap_or_else(|| crate::pipeline::draw::pair::default_pairs(cases));
    let owned_pairs = (0..pairs as usize).filter(|&i| shard.owns(i)).count();
    let owned_calls = (0..recorded.len()).filter(|&i| shard.owns(i)).count();
    let progress = Progress::new(
        global.quiet,
        (owned + traces + owned_pairs + up.len() + owned_calls) as u64,
        "cases",
    );
    progress.phase("property cases");
    let bar = progress.handle();
    let on_event = Box::new(move |e: Event<'_>| match e {
        Event::PropertyCase => {
            bar.phase("property cases");
            bar.step();
        }
        Event::UpstreamCase => {
            bar.phase("upstream suite");
            bar.step();
        }
        Event::Trace => {
            bar.phase("traces");
            bar.step();
        }
        Event::InvariancePair => {
            bar.phase("invariance pairs");
            bar.step();
        }
        Event::RecordedCall => {
            bar.phase("recorded calls");
            bar.step();
        }
        Event::Shrinking { backend } => bar.phase(format!("shrinking {backend}")),
    });
    let mut run = run_check(CheckOptions {
        backends,
        cases,
        seed: args.seed,
        shard,
        deep: args.deep,
        long: args.long,
        traces: trace_count,
        pairs,
        hold: args.hold.clone().map(|h| h.0).unwrap_or_default(),
        trace_shapes: {
            let d = crate::pipeline::draw::trace::TraceShapes::default();
            crate::pipeline::draw::trace::TraceShapes {
                head_sizes: args.trace_head_sizes.map_or(d.head_sizes, |l| l.0),
                block_sizes: args.trace_block_sizes.map_or(d.block_sizes, |l| l.0),
            }
        },
        upstream: up,
        recorded,
        out_dir: args.out,
        shrink: match (args.no_shrink, args.shrink_time) {
            (true, _) => ShrinkBudget::NONE,
            // The person's time limit replaces the work limit.
            (false, Some(s)) => ShrinkBudget {
                max_work: u64::MAX,
                max_time: Some(
                    std::time::Duration::try_from_secs_f64(s.max(0.0))
                        .unwrap_or(std::time::Duration::MAX),
                ),
                ..ShrinkBudget::default()
            },
            (false, None) => ShrinkBudget::default(),
        },
        only,
        external_flags: args.external.external.clone(),
        requested_specs: args.specs.clone(),
        max_failures: if args.exit_first {
            Some(1)
        } else {
            args.max_failures
        },
        give_up_after: args.give_up_after,
        case_index: args.case_index,
        min_run: args.min_run,
        poison: !args.no_poison,
        write_as_found: true,
        jobs,
        on_event: Some(on_event),
        judge: args.judge,
    });
    progress.finish();
    if let Some(e) = &stopped_while_starting {
        let why = e.to_string();
        let first_line = why.lines().next().unwrap_or_default();
        run.summary.stopped = Some(format!(
            "interrupted while starting the backends ({first_line})"
        ));
    }
    run.write_artifacts();
    let detail = if global.verbose {
        Detail::Verbose
    } else {
        Detail::Summary
    };
    let shortfalls = run.summary.shortfalls(run.summary.min_run);
    let text = match args.format {
        CheckFormat::Text => render_text(&run.summary, detail),
        CheckFormat::Json => render_json(&run.summary),
        CheckFormat::Markdown => render_markdown(&run.summary),
        CheckFormat::Junit => crate::render::junit::render(&run.summary, &shortfalls),
    };
    println!("{text}");
    // Tested less than asked is not a pass: a machine-readable format still says so on stderr
    // (the text summary says it itself).
    if args.format != CheckFormat::Text {
        for s in &shortfalls {
            eprintln!("attn-diff: not tested: {s}");
        }
    }
    if let Some(why) = &run.summary.stopped {
        eprintln!("attn-diff: the run stopped early: {why}");
    }
    // The summary decides: a signal after the run's last item leaves a complete summary,
    // and the exit status says what that summary says.
    let interrupted = run
        .summary
        .stopped
        .as_deref()
        .is_some_and(|w| w.starts_with("interrupted"));
    Ok(if interrupted {
        Outcome::Interrupted
    } else {
        run.summary.passed().into()
    })
}
