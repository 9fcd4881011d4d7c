//! A diverging trace written up: where in the trace it diverged (the step, each sequence's
//! phase and table), the step's report as for a case, and the history of the blocks the
//! diverging sequence reads (who wrote them, when they were freed and reused).

use super::report::{failure_record, FailureContext};
use attn_reference::trace::block_history;
use attn_reference::{Case, Trace};
use attn_results::compare::Divergence;
use attn_results::{FailureRecord, Origin, ShrinkInfo};
use std::fmt::Write;

/// A trace's step that diverged: the trace, the step, the step as a case, and what the
/// oracle expects of it.
pub struct DivergedStep<'a> {
    pub trace: &'a Trace,
    pub step: usize,
    pub case: &'a Case,
    pub expected: &'a [f64],
}

/// The report of `backend` diverging at step `at.step` of `at.trace`.
pub fn trace_failure_record(
    backend: &str,
    origin: &Origin,
    at: DivergedStep<'_>,
    d: &Divergence,
    files: FailureContext,
    shrink: Option<ShrinkInfo>,
) -> FailureRecord {
    let (case, step) = (at.case, at.step);
    let mut r = failure_record(backend, origin, case, at.expected, d, files, shrink);
    let mut s = String::new();
    let _ = writeln!(s, "{}", super::report::headline(&r));
    let t = at.trace;
    let _ = writeln!(s, "trace:   {}", t.shape_summary());
    let st = &t.steps[step];
    for (row, q) in st.seqs.iter().enumerate() {
        let _ = writeln!(
            s,
            "  row {row}: seq {} {}, {} cached + {} new, blocks {:?}",
            q.seq, q.phase, q.context_len, q.query_len, q.block_table
        );
    }
    // The whole step report, without its own headline.
    s.push_str(&super::report::body(&r, case, at.expected, d));
    // The blocks involved: those the diverging sequence reads, and those its batch row held
    // the step before (where a stale per-row or per-sequence pointer leads).
    let row = r
        .worst
        .as_ref()
        .or(r.first.as_ref())
        .map_or(0, |m| case.locate_token(m.token).0);
    if let Some(q) = st.seqs.get(row) {
        let mut blocks = q.block_table.clone();
        if let Some(prev) = step.checked_sub(1).and_then(|p| t.steps[p].seqs.get(row)) {
            blocks.extend(
                prev.block_table
                    .iter()
                    .filter(|b| !q.block_table.contains(b)),
            );
        }
        let events = block_history(t, &blocks, step);
        let _ = writeln!(
            s,
            "history of blocks {blocks:?} (seq {} reads {:?} at step {step}; row {row} the step before):",
            q.seq, q.block_table
        );
        for e in events.iter().rev().take(24).rev() {
            let _ = writeln!(s, "  {e}");
        }
    }
    r.text = s;
    r
}
