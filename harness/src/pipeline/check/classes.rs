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
    pub fn enter(
        &mut self,
        found: Signature,
        shrunk: Option<Signature>,
        failure: usize,
    ) -> Option<usize> {
        if let Some(e) = shrunk.as_ref().and_then(|s| {
            self.entries
                .iter_mut()
                .find(|e| e.shrunk.as_ref().is_some_and(|t| t.same_bug(s)))
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
}
