//! One failure lifecycle for every kind of subject. A kind says what its failure is (where
//! it happened, its signature, its files as found, how it shrinks and is reported) through
//! [`Failing`]; [`enter`] does the rest the same way for all of them: place the failure in
//! its backend's class book, count it into an existing class, or open a new class: write its
//! files as found, announce and bound the shrink, shrink and report it once, and enter the
//! shrunk signature so two patterns of one bug end in one class.

use crate::artifacts::Artifact;
use crate::failure::class::Signature;
use crate::pipeline::check::classes::{count_in, Member as ClassMember, Placed};
use crate::pipeline::check::control::RunControl;
use crate::pipeline::check::slow_shrink::{bounded, TimeoutShrink};
use crate::pipeline::check::subject::{class_budget, RunState};
use crate::pipeline::check::{CheckOptions, Event};
use crate::pipeline::runner::Divergence;
use crate::pipeline::shrink::ShrinkBudget;
use attn_backends::Backend;
use attn_results::FailureRecord;

/// How one shrink is bounded: its budget, and a timeout's bounds in time.
pub type Bounds = (ShrinkBudget, Option<TimeoutShrink>);

/// A failure's report as its kind built it.
pub struct Reported {
    pub record: FailureRecord,
    pub artifact: Artifact,
    /// The smallest form's signature and the shrink's work, when that form still failed
    /// with the symptom found (none: reported as found).
    pub shrunk: Option<(Signature, u64)>,
}

/// What a kind of subject says about one of its failures.
pub trait Failing {
    /// Where it failed, as its class counts it.
    fn member(&self) -> ClassMember;
    /// How it diverged, as found.
    fn divergence(&self) -> &Divergence;
    /// Its signature as found: the key of its class.
    fn signature(&self) -> Signature;
    /// Its files as found, before any shrinking.
    fn as_found(&self, backend: &dyn Backend) -> Artifact;
    /// Shrink it within `bounds`, keeping its symptom, and report its smallest form.
    fn shrink_and_report(&self, backend: &dyn Backend, bounds: Bounds) -> Reported;
}

/// Enter `failure` of `opts.backends[member]` in the run: counted into its class when one
/// holds its signature; otherwise a new class, written as found (when the run writes files
/// as they are found, so an interrupt loses nothing), shrunk within the backend's remaining
/// class budget and reported, unless its shrunk form joins an existing class.
pub fn enter(
    opts: &CheckOptions,
    run: &mut RunState<'_>,
    control: &mut RunControl,
    member: usize,
    failure: &impl Failing,
) {
    let backend = opts.backends[member].as_ref();
    let found = failure.signature();
    let at = failure.member();
    if let Placed::Existing(i) = run.classes[member].place(&found) {
        count_in(&mut run.summaries[member].failures[i], &found, at);
        return;
    }
    control.note_class();
    if opts.write_as_found {
        crate::artifacts::write_all(&[failure.as_found(backend)]);
    }
    (run.tell)(Event::Shrinking {
        backend: backend.name(),
    });
    let t0 = std::time::Instant::now();
    let book = &mut run.classes[member];
    let bounds = bounded(
        class_budget(opts.shrink, book.shrink_work),
        failure.divergence().kind,
        backend,
    );
    let Reported {
        mut record,
        artifact,
        shrunk,
    } = failure.shrink_and_report(backend, bounds);
    book.shrink_work += shrunk.as_ref().map_or(0, |s| s.1);
    let summary = &mut run.summaries[member];
    summary.wall_seconds += t0.elapsed().as_secs_f64();
    let shrunk_signature = shrunk.map(|s| s.0);
    let named = shrunk_signature.clone().unwrap_or_else(|| found.clone());
    match book.enter(found.clone(), shrunk_signature, summary.failures.len()) {
        Some(i) => count_in(&mut summary.failures[i], &found, at),
        None => {
            count_in(&mut record, &named, at);
            summary.failures.push(record);
            run.artifacts.push(artifact);
        }
    }
}
