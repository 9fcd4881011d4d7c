//! One backend's failure classes during a run: which signatures (as found) lead to which
//! reported failure, so each distinct bug is shrunk once and every case in it is counted.

use crate::failure::class::Signature;
use attn_results::{FailureClass, FailureRecord};

/// Shrink work one backend's classes may spend in all, in per-shrink budgets: past it, a new
/// class is reported as found (a backend with many bugs still ends in bounded time).
pub const CLASS_SHRINKS: u64 = 4;

#[derive(Default)]
pub struct ClassBook {
    entries: Vec<Entry>,
    /// Shrink work spent on this backend's classes so far.
    pub shrink_work: u64,
}

struct Entry {
    /// The signatures, as found, of failures that fell in this class.
    found: Vec<Signature>,
    /// The shrunk representative's signature (none when it was not shrunk).
    shrunk: Option<Signature>,
    /// Index into the backend's `failures`.
    failure: usize,
}

impl Entry {
    /// What a new failure is compared with: the shrunk signature, or for a precision class
    /// that was not shrunk the signature it was found with (its rung is its identity).
    fn representative(&self) -> Option<&Signature> {
        self.shrunk
            .as_ref()
            .or(self.found.first().filter(|f| f.arithmetic.is_some()))
    }
}

/// Where a failure goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Placed {
    /// Into the class reported as `failures[i]`.
    Existing(usize),
    /// A new class.
    New,
}

impl ClassBook {
    /// The class a failure with signature `found` belongs to.
    pub fn place(&self, found: &Signature) -> Placed {
        self.entries
            .iter()
            .find(|e| e.found.contains(found))
            .map_or(Placed::New, |e| Placed::Existing(e.failure))
    }

    /// Classes so far.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The class of a failure found as `found` whose shrunk case has `shrunk`: an existing
    /// class whose representative shrank to the same signature (two patterns of one bug), or
    /// `None` once the new class is entered as `failures[failure]`.
    ///
    /// A precision failure's rung names its cause whatever its size, so one that was not
    /// shrunk (the backend's shrink budget spent) still joins its rung's class: a backend
    /// with many causes otherwise reported one rung twice, once shrunk and once as found.
    pub fn enter(
        &mut self,
        found: Signature,
        shrunk: Option<Signature>,
        failure: usize,
    ) -> Option<usize> {
        let key = shrunk
            .as_ref()
            .or(Some(&found).filter(|f| f.arithmetic.is_some()));
        if let Some(e) = key.and_then(|s| {
            self.entries
                .iter_mut()
                .find(|e| e.representative().is_some_and(|t| t.same_bug(s)))
        }) {
            e.found.push(found);
            return Some(e.failure);
        }
        self.entries.push(Entry {
            found: vec![found],
            shrunk,
            failure,
        });
        None
    }
}

/// Where a property case, a trace, an invariance pair or an upstream case failed.
#[derive(Clone, Debug)]
pub enum Member {
    Case(usize),
    Trace(usize),
    /// An invariance pair.
    Pair(usize),
    /// An upstream case: its index in the run's suite and its label.
    Upstream(usize, String),
    /// A recorded engine call: its index in the recording.
    Recorded(usize),
}

/// Count `member` into `record`'s class (made when absent, named by `signature`).
pub fn count_in(record: &mut FailureRecord, signature: &Signature, member: Member) {
    let class = record.class.get_or_insert_with(|| FailureClass {
        signature: signature.to_string(),
        ..FailureClass::default()
    });
    match member {
        Member::Case(i) => class.cases.push(i),
        Member::Trace(i) => class.traces.push(i),
        Member::Pair(i) => class.pairs.push(i),
        Member::Upstream(i, label) => {
            // The first is the reported case; the rest are named beside it.
            if !class.upstream.is_empty() {
                record.also.push(label);
            }
            class.upstream.push(i);
        }
        Member::Recorded(i) => class.recorded.push(i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::class::{Severity, Symptom};
    use attn_results::DivergenceKind;

    fn sig(kind: DivergenceKind, message: Option<&str>, features: Option<&[&str]>) -> Signature {
        Signature {
            symptom: Symptom {
                kind,
                severity: Severity::NoOutput,
                message: message.map(str::to_string),
            },
            pattern: None,
            logits: None,
            features: features.map(|f| f.iter().map(|s| s.to_string()).collect()),
            arithmetic: None,
        }
    }

    #[test]
    fn classes_that_shrink_alike_merge() {
        let mut book = ClassBook::default();
        let a = sig(DivergenceKind::Error, Some("a"), None);
        let b = sig(DivergenceKind::Error, Some("b"), None);
        let c = sig(DivergenceKind::Timeout, None, None);
        assert_eq!(book.place(&a), Placed::New);
        let shrunk = sig(DivergenceKind::Error, Some("a"), Some(&["decoder"]));
        assert_eq!(book.enter(a.clone(), Some(shrunk.clone()), 0), None);
        assert_eq!(book.place(&a), Placed::Existing(0));
        // Found otherwise, shrunk to the same: one class.
        assert_eq!(book.enter(b.clone(), Some(shrunk), 1), Some(0));
        assert_eq!(book.place(&b), Placed::Existing(0));
        assert_eq!(book.place(&c), Placed::New);
        assert_eq!(book.enter(c.clone(), None, 1), None);
        assert_eq!(book.place(&c), Placed::Existing(1));
        assert_eq!(book.len(), 2);
    }

    #[test]
    fn a_precision_failure_not_shrunk_joins_its_rungs_class() {
        use attn_reference::ladder::Rung;
        let precision = |severity, features: Option<&[&str]>, rung| Signature {
            symptom: Symptom {
                kind: DivergenceKind::Mismatch,
                severity,
                message: None,
            },
            arithmetic: Some(rung),
            ..sig(DivergenceKind::Mismatch, None, features)
        };
        let mut book = ClassBook::default();
        let far = precision(Severity::FarBeyond, None, Rung::ScoresInDtype);
        let shrunk = precision(Severity::FarBeyond, Some(&["decoder"]), Rung::ScoresInDtype);
        assert_eq!(book.enter(far, Some(shrunk), 0), None);
        // Found within 10x the tolerance, after the shrink budget was spent: the same rung.
        let near = precision(Severity::Beyond, None, Rung::ScoresInDtype);
        assert_eq!(book.place(&near), Placed::New);
        assert_eq!(book.enter(near.clone(), None, 1), Some(0));
        assert_eq!(book.place(&near), Placed::Existing(0));
        // A rung of the same cause (more of the computation in the dtype) joins it too.
        let every_op = precision(Severity::FarBeyond, None, Rung::AllInDtype);
        assert_eq!(book.enter(every_op, None, 1), Some(0));
        // Positions in the dtype are another cause, shrunk or not.
        let other = precision(Severity::Beyond, None, Rung::PositionsInDtype);
        assert_eq!(book.enter(other.clone(), None, 1), None);
        let again = precision(Severity::FarBeyond, None, Rung::PositionsInDtype);
        assert_eq!(book.enter(again, None, 2), Some(1));
        // A failure with no rung, not shrunk, still starts a class of its own.
        let plain = sig(DivergenceKind::Mismatch, None, None);
        assert_eq!(book.enter(plain, None, 2), None);
        assert_eq!(book.len(), 3);
    }
}
