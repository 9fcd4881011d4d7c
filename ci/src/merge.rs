//! N shard summaries of one run merged into the summary of the whole run.
//!
//! Shard I of N runs the property cases, the traces and the upstream cases whose index is
//! I mod N, so every count is a sum: tallies, declined groups, divergence kinds and coverage
//! add; upstream rows are concatenated; times add up (machine time); worst errors take the
//! maximum; failures are kept once per (backend, origin), in shard order.

use crate::summary::{BackendSummary, CheckSummary, Shard, UpstreamRow};
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum MergeError {
    #[error("no shard summaries to merge")]
    NoShards,
    #[error("shard {index}/{count} does not belong to a run of {expected} shard(s)")]
    ForeignShard {
        index: usize,
        count: usize,
        expected: usize,
    },
    #[error("shard {index} appears twice")]
    DuplicateShard { index: usize },
    #[error("shard {index} of {count} is missing")]
    MissingShard { index: usize, count: usize },
    #[error("shard {index} has {field} {found}, shard 0 has {expected}")]
    Disagree {
        index: usize,
        field: &'static str,
        found: String,
        expected: String,
    },
}

fn earliest(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn add(into: &mut BackendSummary, part: &BackendSummary) {
    into.property += part.property;
    into.upstream += part.upstream;
    into.traces += part.traces;
    into.pairs += part.pairs;
    into.trace_steps += part.trace_steps;
    for g in &part.unsupported {
        into.add_group(g.clone());
    }
    for (k, n) in &part.divergences {
        *into.divergences.entry(*k).or_default() += n;
    }
    into.worst_abs_err = into.worst_abs_err.max(part.worst_abs_err);
    into.worst_rel_err = into.worst_rel_err.max(part.worst_rel_err);
    into.backend_seconds += part.backend_seconds;
    into.wall_seconds += part.wall_seconds;
    into.shared_block_cases += part.shared_block_cases;
    for f in &part.figures {
        match into.figures.iter_mut().find(|g| g.dtype == f.dtype) {
            Some(g) => g.merge(f),
            None => into.figures.push(f.clone()),
        }
    }
    into.figures.sort_by_key(|f| f.dtype.name());
    // Indices into the whole run: the smallest is the first.
    into.first_failing_case = earliest(into.first_failing_case, part.first_failing_case);
    into.first_failing_trace = earliest(into.first_failing_trace, part.first_failing_trace);
    into.first_failing_pair = earliest(into.first_failing_pair, part.first_failing_pair);
    for (relation, tally) in &part.invariance {
        into.invariance.entry(*relation).or_default().merge(tally);
    }
    for f in &part.failures {
        if !into.failures.iter().any(|g| g.origin == f.origin) {
            into.failures.push(f.clone());
        }
    }
}

fn check_agree(
    index: usize,
    field: &'static str,
    found: impl ToString,
    expected: impl ToString,
) -> Result<(), MergeError> {
    let (found, expected) = (found.to_string(), expected.to_string());
    if found == expected {
        Ok(())
    } else {
        Err(MergeError::Disagree {
            index,
            field,
            found,
            expected,
        })
    }
}

/// Merge the summaries of every shard of one run (in any order) into the whole run's.
pub fn merge(mut shards: Vec<CheckSummary>) -> Result<CheckSummary, MergeError> {
    let count = shards.first().ok_or(MergeError::NoShards)?.shard.count;
    for s in &shards {
        if s.shard.count != count || s.shard.index >= count {
            return Err(MergeError::ForeignShard {
                index: s.shard.index,
                count: s.shard.count,
                expected: count,
            });
        }
    }
    shards.sort_by_key(|s| s.shard.index);
    for (i, s) in shards.iter().enumerate() {
        if s.shard.index < i {
            return Err(MergeError::DuplicateShard {
                index: s.shard.index,
            });
        }
        if s.shard.index > i {
            return Err(MergeError::MissingShard { index: i, count });
        }
    }
    if shards.len() < count {
        return Err(MergeError::MissingShard {
            index: shards.len(),
            count,
        });
    }

    // Upstream rows in the whole run's order: case j (its rows, one per backend sent or not
    // declared, consecutive) is shard j mod N's.
    let same_case = |a: &UpstreamRow, b: &UpstreamRow| {
        (&a.test, &a.spec, a.heads) == (&b.test, &b.spec, b.heads)
    };
    let mut row_chunks: Vec<std::vec::IntoIter<Vec<UpstreamRow>>> = shards
        .iter()
        .map(|s| {
            s.upstream
                .chunk_by(same_case)
                .map(<[UpstreamRow]>::to_vec)
                .collect::<Vec<_>>()
                .into_iter()
        })
        .collect();
    let mut rows = Vec::new();
    'cases: loop {
        for chunks in row_chunks.iter_mut() {
            match chunks.next() {
                Some(c) => rows.extend(c),
                None => break 'cases,
            }
        }
    }
    for chunks in row_chunks {
        rows.extend(chunks.flatten());
    }

    let mut shards = shards.into_iter();
    let Some(mut whole) = shards.next() else {
        return Err(MergeError::NoShards);
    };
    let names: Vec<String> = whole
        .backends
        .iter()
        .map(|b| b.backend.name.clone())
        .collect();
    for s in shards {
        let i = s.shard.index;
        check_agree(i, "seed", s.seed, whole.seed)?;
        check_agree(i, "cases", s.cases, whole.cases)?;
        check_agree(i, "deep", s.deep, whole.deep)?;
        check_agree(i, "long", s.long, whole.long)?;
        check_agree(i, "traces", s.traces, whole.traces)?;
        check_agree(i, "pairs", s.pairs, whole.pairs)?;
        check_agree(i, "judge", s.judge.flag_value(), whole.judge.flag_value())?;
        let theirs: Vec<String> = s.backends.iter().map(|b| b.backend.name.clone()).collect();
        check_agree(i, "backends", theirs.join(","), names.join(","))?;
        check_agree(
            i,
            "--only",
            format!("{:?}", s.only),
            format!("{:?}", whole.only),
        )?;
        whole.oracle_seconds += s.oracle_seconds;
        if let (Some(into), Some(theirs)) = (whole.coverage.as_mut(), s.coverage.as_ref()) {
            into.merge(theirs);
        }
        for (into, b) in whole.backends.iter_mut().zip(&s.backends) {
            add(into, b);
        }
    }
    whole.upstream = rows;
    whole.shard = Shard { index: 0, count: 1 };
    Ok(whole)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::UpstreamStatus;
    use attn_reference::{Dimension, Unsupported};
    use attn_results::{DivergenceKind, Tally};

    fn no_fp8() -> UpstreamStatus {
        UpstreamStatus::Unsupported {
            reason: Unsupported::new(Dimension::Dtype, "fp8"),
        }
    }

    fn up() -> Vec<UpstreamStatus> {
        vec![
            UpstreamStatus::Pass,
            no_fp8(),
            UpstreamStatus::Diverged {
                kind: DivergenceKind::NonFinite,
            },
            // Outside the backend's space: never sent, in no count.
            UpstreamStatus::NotDeclared {
                reason: Unsupported::new(Dimension::Dtype, "other than f16").value("bf16"),
            },
        ]
    }

    /// Shard `index` of `count`: `passed` property cases, and its share of the upstream rows
    /// `upstream` (row j belongs to shard j mod count, as `check` shards them).
    fn shard(
        index: usize,
        count: usize,
        passed: usize,
        upstream: &[UpstreamStatus],
    ) -> CheckSummary {
        let rows: Vec<UpstreamRow> = upstream
            .iter()
            .enumerate()
            .filter(|(j, _)| j % count == index)
            .map(|(j, status)| UpstreamRow {
                backend: "cpu".into(),
                test: "causal".into(),
                spec: format!("spec{j}"),
                heads: (8, 2),
                status: status.clone(),
                max_abs_err: f64::NAN,
                max_rel_err: f64::NAN,
            })
            .collect();
        let mut b = BackendSummary::new(attn_results::BackendId::builtin("cpu"));
        b.property = Tally {
            sent: passed,
            passed,
            ..Tally::default()
        };
        b.backend_seconds = 1.0;
        b.wall_seconds = 1.0;
        for r in &rows {
            let t = &mut b.upstream;
            match &r.status {
                UpstreamStatus::Pass => t.passed += 1,
                UpstreamStatus::Unsupported { reason } => {
                    t.declined += 1;
                    b.add_unsupported(reason, 1);
                }
                UpstreamStatus::Diverged { kind } => {
                    t.failed += 1;
                    *b.divergences.entry(*kind).or_default() += 1;
                }
                UpstreamStatus::NotDeclared { .. } => continue,
            }
            b.upstream.sent += 1;
        }
        CheckSummary {
            schema_version: attn_results::SCHEMA_VERSION,
            seed: 1,
            cases: 10,
            shard: Shard { index, count },
            deep: false,
            long: false,
            traces: 0,
            pairs: 0,
            oracle_seconds: 0.5,
            backends: vec![b],
            upstream: rows,
            coverage: None,
            only: None,
            requested_specs: Vec::new(),
            stopped: None,
            min_run: 1,
            judge: Default::default(),
        }
    }

    #[test]
    fn a_merge_of_shards_is_their_sum() {
        let m = merge(vec![shard(1, 2, 4, &up()), shard(0, 2, 5, &up())]).unwrap();
        let whole = shard(0, 1, 9, &up());
        let (b, w) = (&m.backends[0], &whole.backends[0]);
        assert_eq!(b.property, w.property);
        assert_eq!(b.upstream, w.upstream);
        assert_eq!(b.upstream.sent, 3, "the not-declared row is in no count");
        assert_eq!((b.total().passed, b.failed()), (9 + 1, 1));
        assert_eq!(b.unsupported, w.unsupported);
        assert_eq!(b.divergences, w.divergences);
        assert_eq!(m.upstream.len(), 4);
        assert_eq!(m.shard, Shard { index: 0, count: 1 });
        assert_eq!(b.wall_seconds, 2.0);
    }

    #[test]
    fn property_declines_of_shards_add_up_by_reason() {
        let mut a = shard(0, 2, 1, &[]);
        let mut b = shard(1, 2, 1, &[]);
        let size = |d| Unsupported::new(Dimension::HeadSize, "not a multiple of 64").value(d);
        a.backends[0].add_unsupported(&size(80), 2);
        b.backends[0].add_unsupported(&size(96), 3);
        let m = merge(vec![a, b]).unwrap();
        let g = &m.backends[0].unsupported;
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!(g[0].cases, 5);
        assert_eq!(g[0].to_string(), "head size not a multiple of 64 (2 sizes)");
    }

    #[test]
    fn the_first_failure_is_the_smallest_index_of_any_shard() {
        let mut a = shard(0, 2, 1, &[]);
        let mut b = shard(1, 2, 1, &[]);
        a.backends[0].first_failing_case = Some(8);
        b.backends[0].first_failing_case = Some(3);
        b.backends[0].first_failing_trace = Some(5);
        let m = merge(vec![a, b]).unwrap();
        assert_eq!(m.backends[0].first_failing_case, Some(3));
        assert_eq!(m.backends[0].first_failing_trace, Some(5));
    }

    #[test]
    fn the_shard_set_must_be_whole() {
        assert_eq!(merge(vec![]), Err(MergeError::NoShards));
        assert_eq!(
            merge(vec![shard(0, 3, 1, &[]), shard(2, 3, 1, &[])]),
            Err(MergeError::MissingShard { index: 1, count: 3 })
        );
        assert_eq!(
            merge(vec![shard(0, 2, 1, &[])]),
            Err(MergeError::MissingShard { index: 1, count: 2 })
        );
        assert_eq!(
            merge(vec![shard(0, 2, 1, &[]), shard(0, 2, 1, &[])]),
            Err(MergeError::DuplicateShard { index: 0 })
        );
        assert!(matches!(
            merge(vec![shard(0, 2, 1, &[]), shard(1, 3, 1, &[])]),
            Err(MergeError::ForeignShard { .. })
        ));
    }

    #[test]
    fn shards_of_different_runs_do_not_merge() {
        let mut other = shard(1, 2, 1, &[]);
        other.seed = 2;
        assert!(matches!(
            merge(vec![shard(0, 2, 1, &[]), other]),
            Err(MergeError::Disagree { field: "seed", .. })
        ));
        let mut aimed = shard(1, 2, 1, &[]);
        aimed.only = Some(attn_reference::Space::parse_only("max_seqs=1").unwrap());
        assert!(matches!(
            merge(vec![shard(0, 2, 1, &[]), aimed]),
            Err(MergeError::Disagree {
                field: "--only",
                ..
            })
        ));
    }
}
