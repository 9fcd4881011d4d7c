//! `attn-diff replay FILE`: one saved case through backends again.

use super::setup::{is_trace_file, load_case, select_backends_with};
use crate::cli::ReplayArgs;
use crate::failure::trace::trace_failure_record;
use crate::pipeline::check::invariance::{judge_pair, moved_words, Claim, PairVerdict};
use crate::pipeline::replay::replay_case;
use crate::pipeline::runner::trace::{evaluate_trace, JudgedTrace, TraceOutcome};
use crate::pipeline::runner::Outcome;
use attn_backends::Backend;
use attn_reference::relation::{transform, PairOf};
use attn_reference::{Case, Recorded, Trace};
use std::sync::Arc;

/// The backends to replay on: those named, else the one the file records (an adapter
/// declared with `--external` only when the flag is given again: a file never starts a
/// command), else every registered backend. Prints what the file records.
fn backends_for(
    args: &ReplayArgs,
    recorded: Option<&Recorded>,
) -> anyhow::Result<Vec<Arc<dyn Backend>>> {
    let file = args.file.display().to_string();
    if let Some(r) = recorded {
        println!(
            "recorded: {} diverged ({}) on {} (tolerance atol {:.2e}, rtol {:.2e}){}",
            r.origin,
            r.outcome,
            r.backend,
            r.atol,
            r.rtol,
            r.only
                .as_ref()
                .map_or(String::new(), |o| format!(", aimed with --only {o}"))
        );
        for line in environment_differences(&r.environment, |k| std::env::var(k).ok()) {
            eprintln!("warning: {line}");
        }
        if let Some(j) = r.judge.filter(|j| *j != args.judge) {
            eprintln!(
                "warning: the failing run was judged by {j}; this replay by {}: add --judge {} to judge as it did",
                args.judge,
                j.flag_value()
            );
        }
    }
    match recorded {
        Some(r) if args.backend.is_empty() => {
            let declared = args.external.spec(&crate::external::adapter_of(&r.backend));
            // Recorded with an `--external` flag: an adapter this run does not declare.
            if let (Some(flag), Err(_)) = (&r.external, &declared) {
                let quote = |s: &str| {
                    shlex::try_quote(s).map_or_else(|_| s.to_string(), |q| q.into_owned())
                };
                return Err(super::setup::usage(format!(
                    "{file} was recorded on {}, an adapter declared with --external; replay \
                     starts no command a file names: run\n  attn-diff replay {} --backend {} \
                     --external {}",
                    r.backend,
                    quote(&file),
                    quote(&r.backend),
                    quote(flag)
                )));
            }
            select_backends_with(
                &[attn_results::BackendRef::parse(&r.backend)],
                &args.external,
            )
        }
        _ => select_backends_with(&args.backend, &args.external),
    }
}

/// Where this environment (`current`) differs from the one the failing run's backend
/// declared: an adapter started here inherits it, and may run something else.
fn environment_differences(
    recorded: &std::collections::BTreeMap<String, String>,
    current: impl Fn(&str) -> Option<String>,
) -> Vec<String> {
    recorded
        .iter()
        .filter_map(|(k, v)| match current(k) {
            Some(here) if here == *v => None,
            Some(here) => Some(format!(
                "the failing run had {k}={v:?}, here {k}={here:?}: the adapter may run something else"
            )),
            None => Some(format!(
                "the failing run had {k}={v:?}, here {k} is unset: set it to replay what failed"
            )),
        })
        .collect()
}

/// A trace file through every backend, one cache across its steps.
fn run_trace(args: ReplayArgs) -> anyhow::Result<bool> {
    let name = args.file.display().to_string();
    let trace = Trace::load(&args.file).map_err(|e| super::setup::usage(format!("{name}: {e}")))?;
    let backends = backends_for(&args, trace.recorded.as_ref())?;
    let judged = JudgedTrace::judged_by(trace, &args.judge);
    let mut ok = true;
    // A replay no backend ran tested nothing: not a pass.
    let mut declined = 0;
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
            TraceOutcome::Unsupported(why) => {
                declined += 1;
                println!("{}: unsupported ({why})", b.name())
            }
            TraceOutcome::Diverged { step, divergence } => {
                ok = false;
                let origin = attn_results::Origin::Replay {
                    file: name.clone(),
                    step: Some((step, judged.steps.len())),
                };
                let r = trace_failure_record(
                    b.name(),
                    &origin,
                    judged.diverged_at(step),
                    &divergence,
                    crate::failure::report::FailureContext {
                        replay: Some(name.clone()),
                        judge: (args.judge != attn_reference::Judge::Tolerance)
                            .then_some(args.judge),
                        ..crate::failure::report::FailureContext::of_backend(
                            b.as_ref(),
                            &[],
                            &judged.steps[step].config,
                        )
                    },
                    None,
                );
                println!("{}", r.text);
            }
        }
    }
    if declined == backends.len() {
        println!("not tested: no backend ran the case");
        return Ok(false);
    }
    Ok(ok)
}

/// An invariance pair's file: the case and its other form (rebuilt from the relation and
/// choices it records) on every backend, their rows compared bit for bit. Moved bits fail a
/// backend that declares the relation; on one that does not they are measured drift.
fn run_pair(args: &ReplayArgs, case: &Case, pair: PairOf) -> anyhow::Result<bool> {
    let relation = pair.relation;
    let other = transform(case, relation, pair.pick).ok_or_else(|| {
        super::setup::usage(format!(
            "{}: recorded.pair.relation `{relation}` does not apply to this case",
            args.file.display()
        ))
    })?;
    let backends = backends_for(args, case.recorded.as_ref())?;
    println!("pair: {}", relation.change());
    let (mut ok, mut judged) = (true, 0);
    for b in &backends {
        let name = b.name();
        match judge_pair(b.as_ref(), case, &other) {
            PairVerdict::Judged { drift, .. } => {
                judged += 1;
                if drift.held() {
                    println!("{name}: held ({} compared rows, bit for bit)", drift.rows);
                } else if let Some(claim) = Claim::of(b.as_ref(), relation, pair.held_to) {
                    ok = false;
                    println!(
                        "{name}: variant: {}, under the {relation} relation, {}",
                        moved_words(&drift),
                        claim.words()
                    );
                } else {
                    println!(
                        "{name}: {} ({name} does not declare the {relation} relation: measured \
                         drift, not a failure)",
                        moved_words(&drift)
                    );
                }
            }
            PairVerdict::NotJudged(_, Some((kind, message))) => {
                println!("{name}: not judged: a form failed ({kind}: {message})")
            }
            PairVerdict::NotJudged(_, None) | PairVerdict::NotApplicable => {
                println!("{name}: not judged (it declined a form)")
            }
        }
    }
    if judged == 0 {
        println!("not tested: no backend ran both forms");
        return Ok(false);
    }
    Ok(ok)
}

pub fn run(args: ReplayArgs) -> anyhow::Result<bool> {
    if is_trace_file(&args.file) {
        return run_trace(args);
    }
    let case = load_case(&args.file)?;
    if let Some(pair) = case.recorded.as_ref().and_then(|r| r.pair) {
        return run_pair(&args, &case, pair);
    }
    let backends = backends_for(&args, case.recorded.as_ref())?;
    let mut ok = true;
    // A replay no backend ran tested nothing: not a pass.
    let mut declined = 0;
    for r in replay_case(
        &case,
        &args.file.display().to_string(),
        &backends,
        args.judge,
    ) {
        match (&r.outcome, &r.report) {
            (Outcome::Pass(c), _) => println!(
                "{}: pass (max abs {:.2e}, max rel {:.2e}; tolerance atol {:.2e}, rtol {:.1e})",
                r.backend, c.max_abs_err, c.max_rel_err, c.tolerance.atol, c.tolerance.rtol
            ),
            (Outcome::Unsupported(why), _) => {
                declined += 1;
                println!("{}: unsupported ({why})", r.backend)
            }
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
    if declined == backends.len() {
        println!("not tested: no backend ran the case");
        return Ok(false);
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::environment_differences;

    #[test]
    fn a_recorded_environment_that_differs_is_named() {
        let recorded = [("A", "1"), ("B", "2"), ("C", "3")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        let here = |k: &str| match k {
            "A" => Some("1".to_string()),
            "B" => Some("9".to_string()),
            _ => None,
        };
        let lines = environment_differences(&recorded, here);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("B=\"9\""), "{}", lines[0]);
        assert!(lines[1].contains("C is unset"), "{}", lines[1]);
    }
}
