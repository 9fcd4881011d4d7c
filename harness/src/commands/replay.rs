//! `attn-diff replay FILE`: one saved case through backends again.

use super::{load_case, select_backends_with};
use crate::cli::ReplayArgs;
use crate::pipeline::trace::{evaluate_trace, JudgedTrace, TraceOutcome};
use crate::render::trace_report::trace_failure_record;
use crate::replay::replay_case;
use crate::runner::Outcome;
use attn_reference::Trace;
use std::path::Path;

/// A JSON file whose top level has `steps` (read only up to the size limit of cases).
fn is_trace_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "json")
        && std::fs::metadata(path)
            .is_ok_and(|m| m.is_file() && m.len() <= attn_reference::MAX_CASE_FILE_BYTES)
        && std::fs::read_to_string(path).is_ok_and(|t| Trace::looks_like_trace(&t))
}

/// A trace file through every backend, one cache across its steps.
fn run_trace(args: ReplayArgs) -> anyhow::Result<bool> {
    let name = args.file.display().to_string();
    let trace = Trace::load(&args.file).map_err(|e| super::usage(format!("{name}: {e}")))?;
    let backends = select_backends_with(&args.backend, &args.external)?;
    let judged = JudgedTrace::new(trace);
    let mut ok = true;
    for b in &backends {
        match evaluate_trace(b.as_ref(), &judged).0 {
            TraceOutcome::Pass {
                max_abs_err,
                max_rel_err,
            } => println!(
                "{}: pass, {} steps (max abs {max_abs_err:.2e}, max rel {max_rel_err:.2e})",
                b.name(),
                judged.steps.len()
            ),
            TraceOutcome::Unsupported(why) => println!("{}: unsupported ({why})", b.name()),
            TraceOutcome::Diverged { step, divergence } => {
                ok = false;
                let r = trace_failure_record(
                    b.name(),
                    &name,
                    &judged,
                    step,
                    &divergence,
                    Some(name.clone()),
                    None,
                );
                println!("{}", r.text);
            }
        }
    }
    Ok(ok)
}

pub fn run(args: ReplayArgs) -> anyhow::Result<bool> {
    if is_trace_file(&args.file) {
        return run_trace(args);
    }
    let case = load_case(&args.file)?;
    let backends = select_backends_with(&args.backend, &args.external)?;
    let mut ok = true;
    for r in replay_case(&case, &args.file.display().to_string(), &backends) {
        match (&r.outcome, &r.report) {
            (Outcome::Pass(c), _) => println!(
                "{}: pass (max abs {:.2e}, max rel {:.2e})",
                r.backend, c.max_abs_err, c.max_rel_err
            ),
            (Outcome::Unsupported(why), _) => println!("{}: unsupported ({why})", r.backend),
            (Outcome::Diverged(_), Some(rep)) => {
                ok = false;
                println!("{}", rep.text);
            }
            (Outcome::Diverged(d), None) => {
                ok = false;
                println!("{}: {} ({})", r.backend, d.kind, d.message);
            }
        }
    }
    Ok(ok)
}
