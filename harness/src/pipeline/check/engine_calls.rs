//! A real engine's recorded calls as subjects (`check --recording`): each call is a fixed
//! case with real values, judged by the oracle once and sent to every backend, the engine's
//! own answers (`engine:CLASS`) among them. A failure goes through the one lifecycle
//! ([`lifecycle`]) and shrinks by dropping sequences, padding and a sequence's later new
//! tokens, never by redrawing values: the smallest form keeps the rows the engine really
//! computed with.

use crate::artifacts::Artifact;
use crate::failure::class::{Signature, Symptom};
use crate::pipeline::check::classes::Member as ClassMember;
use crate::pipeline::check::control::RunControl;
use crate::pipeline::check::drive::{Item, Member, Ran, Subjects};
use crate::pipeline::check::lifecycle::{self, Bounds, Failing, Reported};
use crate::pipeline::check::shifted::Judged;
use crate::pipeline::check::slow_shrink::{run_within, stated};
use crate::pipeline::check::subject::items_for_every_backend;
use crate::pipeline::check::subject::{record_outcome, report, sanitize, Diverged, RunState};
use crate::pipeline::check::{CheckOptions, Event};
use crate::pipeline::recording::EngineCall;
use crate::pipeline::runner::{evaluate, Divergence, Outcome};
use crate::pipeline::shrink::{greedy, AfterAccept, Weigh, SEQ_WORK, TRY_WORK};
use attn_backends::Backend;
use attn_reference::relation::{first_tokens, keep_sequences, without_padding};
use attn_reference::{Case, Space, Unsupported};
use attn_results::{Origin, RunPart, ShrinkInfo};
use std::sync::Arc;
use std::time::Duration;

/// What the workers need to judge recorded calls.
pub struct EngineCalls<'a> {
    pub calls: &'a [EngineCall],
    pub backends: &'a [Arc<dyn Backend>],
    /// Each backend's space when narrower than the full one: a call outside is not sent.
    pub spaces: Vec<Option<Space>>,
    pub judge: attn_reference::Judge,
}

/// A recorded call judged by the oracle.
pub struct JudgedCall {
    judged: Judged,
    buckets: Vec<(&'static str, &'static str)>,
}

impl Subjects for EngineCalls<'_> {
    type Prepared = JudgedCall;
    /// The outcome, or why the call is outside the backend's space (not sent).
    type Verdict = Result<(Outcome, Duration), Unsupported>;

    fn prepare(&self, item: &Item) -> JudgedCall {
        let case = self.calls[item.index].case.clone();
        JudgedCall {
            buckets: crate::pipeline::coverage::buckets(&case),
            judged: Judged::of(case, &self.judge),
        }
    }

    fn held_bytes(&self, c: &JudgedCall) -> usize {
        c.judged.case.held_bytes() + 8 * c.judged.expected.len()
    }

    fn evaluate(&self, c: &JudgedCall, m: Member) -> Self::Verdict {
        if let Some(space) = &self.spaces[m.backend] {
            space.admits(&c.judged.case)?;
        }
        let j = &c.judged;
        Ok(evaluate(
            self.backends[m.backend].as_ref(),
            &j.case,
            &j.expected,
            j.tol,
        ))
    }
}

/// The loop items: every call of this shard, sent to every backend.
pub fn items(opts: &CheckOptions) -> Vec<Item> {
    let indices = (0..opts.recorded.len()).filter(|&i| opts.shard.owns(i));
    items_for_every_backend(indices, opts.backends.len())
}

/// Record call `item` in order: tallies, coverage, failures.
pub fn record(
    opts: &CheckOptions,
    run: &mut RunState<'_>,
    item: &Item,
    ran: Ran<JudgedCall, Result<(Outcome, Duration), Unsupported>>,
    control: &mut RunControl,
) {
    run.oracle_time += ran.oracle;
    let call = &opts.recorded[item.index];
    if let Some(c) = &ran.prepared {
        for (m, verdict) in item.members.iter().zip(ran.verdicts) {
            let Some((verdict, wall)) = verdict else {
                continue;
            };
            let member = m.backend;
            let summary = &mut run.summaries[member];
            let (outcome, time) = match verdict {
                // Outside the space it is checked in: declined, with what put it outside.
                Err(outside) => (Outcome::Unsupported(outside), Duration::ZERO),
                Ok(v) => v,
            };
            record_outcome(summary, RunPart::Recorded, &outcome, time);
            summary.wall_seconds += wall.as_secs_f64();
            control.note(member, &outcome);
            if !matches!(outcome, Outcome::Unsupported(_)) {
                let name = opts.backends[member].name();
                crate::pipeline::coverage::count(&mut run.coverage, name, &c.buckets);
            }
            if let Outcome::Diverged(d) = &outcome {
                let failing = CallFailure {
                    opts,
                    index: item.index,
                    call,
                    judged: &c.judged,
                    divergence: d,
                };
                lifecycle::enter(opts, run, control, member, &failing);
            }
        }
    }
    (run.tell)(Event::RecordedCall);
}

/// A recorded call that diverged on one backend.
struct CallFailure<'a> {
    opts: &'a CheckOptions,
    index: usize,
    call: &'a EngineCall,
    judged: &'a Judged,
    divergence: &'a Divergence,
}

impl CallFailure<'_> {
    fn origin(&self) -> Origin {
        Origin::Recorded {
            file: self.call.file.clone(),
            layer: self.call.layer.clone(),
            call: self.call.call,
        }
    }

    fn reported(
        &self,
        backend: &dyn Backend,
        judged: &Judged,
        d: &Divergence,
        shrunk: Option<ShrinkInfo>,
    ) -> (attn_results::FailureRecord, Artifact) {
        let stem = format!(
            "{}-{}",
            sanitize(backend.name()),
            self.call.file.trim_end_matches(".json")
        );
        let origin = self.origin();
        let diverged = Diverged {
            backend: backend.name(),
            origin: &origin,
            case: &judged.case,
            expected: &judged.expected,
            divergence: d,
            tolerance: judged.tol,
        };
        report(self.opts, &diverged, &stem, shrunk)
    }
}

/// The smaller forms of `case` a shrink tries, largest step first: each sequence alone,
/// each sequence dropped, the padding dropped, a sequence's later new tokens cut (half, then
/// all but one). Values are kept, never redrawn.
fn smaller(case: &Case) -> Vec<Case> {
    let n = case.num_seqs();
    let mut out = Vec::new();
    if n > 1 {
        out.extend((0..n).filter_map(|s| keep_sequences(case, &[s])));
        out.extend((0..n).filter_map(|drop| {
            let rest: Vec<usize> = (0..n).filter(|&s| s != drop).collect();
            keep_sequences(case, &rest)
        }));
    }
    if case.batch.num_padding_tokens > 0 {
        out.extend(without_padding(case));
    }
    for s in 0..n {
        let q = case.batch.query_lens[s];
        out.extend(first_tokens(case, s, q / 2));
        if q / 2 > 1 {
            out.extend(first_tokens(case, s, q - 1));
        }
    }
    out
}

/// What trying a recorded call's form costs, in the shrinker's units: the oracle's
/// multiply-adds, the elements written, each sequence's own cost.
impl Weigh for Case {
    fn work(&self) -> u64 {
        let c = &self.config;
        let per_key = (c.num_heads * (c.head_size + c.head_size_v())) as u64;
        let attention: u64 = (0..self.num_seqs())
            .map(|s| self.batch.query_lens[s] as u64 * self.batch.seq_lens[s] as u64 * per_key)
            .sum();
        attention + (self.held_bytes() / 4) as u64 + self.num_seqs() as u64 * SEQ_WORK + TRY_WORK
    }
}

impl Failing for CallFailure<'_> {
    fn member(&self) -> ClassMember {
        ClassMember::Recorded(self.index)
    }

    fn divergence(&self) -> &Divergence {
        self.divergence
    }

    fn signature(&self) -> Signature {
        Signature::of(&self.judged.case, self.divergence)
    }

    fn as_found(&self, backend: &dyn Backend) -> Artifact {
        self.reported(backend, self.judged, self.divergence, None).1
    }

    /// The one greedy shrinker over [`smaller`] forms, keeping the symptom, under a timeout's
    /// per-try limit when the failure is one.
    fn shrink_and_report(&self, backend: &dyn Backend, (budget, timeout): Bounds) -> Reported {
        let symptom = Symptom::of(self.divergence);
        // The judged form and divergence of the last try that still failed.
        let mut last: Option<(Judged, Divergence)> = None;
        let still_fails = |c: &Case| {
            let j = Judged::of(c.clone(), &self.opts.judge);
            match evaluate(backend, &j.case, &j.expected, j.tol).0 {
                Outcome::Diverged(d) if Symptom::of(&d) == symptom => {
                    last = Some((j, d));
                    Some(c.clone())
                }
                _ => None,
            }
        };
        let start = self.judged.case.clone();
        let shrink = || {
            greedy(
                start,
                budget,
                AfterAccept::FromTheTop,
                &smaller,
                still_fails,
            )
        };
        let shrunk = run_within(timeout.as_ref(), shrink);
        let info = stated(timeout.as_ref(), shrunk.info());
        let (judged, d) = match &last {
            Some((j, d)) => (j, d),
            None => (self.judged, self.divergence),
        };
        let (record, artifact) = self.reported(backend, judged, d, Some(info));
        Reported {
            record,
            artifact,
            shrunk: Some((Signature::shrunk(&judged.case, d), shrunk.work)),
        }
    }
}
