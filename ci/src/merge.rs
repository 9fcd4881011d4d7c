//! N shard summaries of one run merged into the summary of the whole run.
//!
//! Shard I of N runs the property cases whose index is I mod N, so their counts add up. The
//! upstream cases are not sharded: every shard runs all of them, and their outcomes are in
//! every shard's counts. The merge keeps one copy: it counts each shard's property cases
//! (its counts less its upstream rows' outcomes) and the first shard's upstream rows once.
//! Times add up (machine time, upstream included); worst errors take the maximum; failures
//! are kept once per (backend, origin), in shard order.

use crate::summary::{BackendSummary, CheckSummary, Shard, UpstreamRow, UpstreamStatus};
use attn_results::DivergenceKind;
use std::collections::BTreeMap;
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
    #[error("shard {index}: {backend}'s counts are smaller than its upstream rows account for")]
    Inconsistent { index: usize, backend: String },
}

fn take(n: &mut usize, index: usize, backend: &str) -> Result<(), MergeError> {
    *n = n.checked_sub(1).ok_or_else(|| MergeError::Inconsistent {
        index,
        backend: backend.to_string(),
    })?;
    Ok(())
}

fn take_kind(
    map: &mut BTreeMap<DivergenceKind, usize>,
    kind: DivergenceKind,
    index: usize,
    backend: &str,
) -> Result<(), MergeError> {
    let n = map.get_mut(&kind).ok_or_else(|| MergeError::Inconsistent {
        index,
        backend: backend.to_string(),
    })?;
    take(n, index, backend)?;
    if *n == 0 {
        map.remove(&kind);
    }
    Ok(())
}

/// Take one declined case out of its group. The group's distinct values stay (another
/// property case may have had the same value; a value set is a description, not a count).
fn take_unsupported(
    b: &mut BackendSummary,
    reason: &attn_results::check::UnsupportedGroup,
    index: usize,
) -> Result<(), MergeError> {
    let name = b.backend.clone();
    let pos = b
        .unsupported
        .iter()
        .position(|g| g.feature == reason.feature && g.detail == reason.detail)
        .ok_or_else(|| MergeError::Inconsistent {
            index,
            backend: name.clone(),
        })?;
    take(&mut b.unsupported[pos].cases, index, &name)?;
    if b.unsupported[pos].cases == 0 {
        b.unsupported.remove(pos);
    }
    Ok(())
}

/// A shard's backend summary less the outcomes of its upstream rows: its property cases.
fn property_part(
    b: &BackendSummary,
    upstream: &[UpstreamRow],
    index: usize,
) -> Result<BackendSummary, MergeError> {
    let mut p = b.clone();
    let name = b.backend.as_str();
    for row in upstream.iter().filter(|r| r.backend == b.backend) {
        if matches!(row.status, UpstreamStatus::NotDeclared { .. }) {
            // Never sent to the backend: nothing of it is in the counts.
            continue;
        }
        take(&mut p.cases_run, index, name)?;
        match &row.status {
            UpstreamStatus::Pass => take(&mut p.passed, index, name)?,
            UpstreamStatus::Unsupported { reason } => {
                let group = attn_results::check::UnsupportedGroup {
                    feature: reason.feature,
                    detail: reason.detail.clone(),
                    cases: 1,
                    values: Default::default(),
                };
                take_unsupported(&mut p, &group, index)?
            }
            UpstreamStatus::Diverged { kind } => {
                take(&mut p.failed, index, name)?;
                take_kind(&mut p.divergences, *kind, index, name)?;
            }
            UpstreamStatus::NotDeclared { .. } => {}
        }
    }
    Ok(p)
}

fn add(into: &mut BackendSummary, part: BackendSummary) {
    into.cases_run += part.cases_run;
    into.passed += part.passed;
    into.failed += part.failed;
    for g in part.unsupported {
        into.add_group(g);
    }
    for (k, n) in part.divergences {
        *into.divergences.entry(k).or_default() += n;
    }
    into.worst_abs_err = into.worst_abs_err.max(part.worst_abs_err);
    into.worst_rel_err = into.worst_rel_err.max(part.worst_rel_err);
    into.backend_seconds += part.backend_seconds;
    into.wall_seconds += part.wall_seconds;
    into.shared_block_cases += part.shared_block_cases;
    into.traces_run += part.traces_run;
    into.trace_steps += part.trace_steps;
    into.traces_failed += part.traces_failed;
    into.first_trace_divergence_at = match (
        into.first_trace_divergence_at,
        part.first_trace_divergence_at,
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    // Per-shard counts are not comparable; keep the earliest any shard saw.
    into.first_divergence_at = match (into.first_divergence_at, part.first_divergence_at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    for f in part.failures {
        if !into.failures.iter().any(|g| g.origin == f.origin) {
            into.failures.push(f);
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

fn upstream_keys(s: &CheckSummary) -> String {
    s.upstream
        .iter()
        .map(|r| {
            format!(
                "{}:{}:{}:{}/{}",
                r.backend, r.test, r.spec, r.heads.0, r.heads.1
            )
        })
        .collect::<Vec<_>>()
        .join(",")
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

    let mut shards = shards.into_iter();
    let Some(mut whole) = shards.next() else {
        return Err(MergeError::NoShards);
    };
    let names: Vec<String> = whole.backends.iter().map(|b| b.backend.clone()).collect();
    let up_keys = upstream_keys(&whole);
    for s in shards {
        let i = s.shard.index;
        check_agree(i, "seed", s.seed, whole.seed)?;
        check_agree(i, "cases", s.cases, whole.cases)?;
        check_agree(i, "deep", s.deep, whole.deep)?;
        check_agree(i, "long", s.long, whole.long)?;
        check_agree(i, "traces", s.traces, whole.traces)?;
        let theirs: Vec<String> = s.backends.iter().map(|b| b.backend.clone()).collect();
        check_agree(i, "backends", theirs.join(","), names.join(","))?;
        check_agree(i, "upstream cases", upstream_keys(&s), &up_keys)?;
        whole.oracle_seconds += s.oracle_seconds;
        if let (Some(into), Some(theirs)) = (whole.coverage.as_mut(), s.coverage.as_ref()) {
            into.merge(theirs);
        }
        for (into, b) in whole.backends.iter_mut().zip(&s.backends) {
            add(into, property_part(b, &s.upstream, i)?);
        }
    }
    whole.shard = Shard { index: 0, count: 1 };
    Ok(whole)
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::{Feature, Unsupported};

    fn no_fp8() -> UpstreamStatus {
        UpstreamStatus::Unsupported {
            reason: Unsupported::new(Feature::Dtype, "fp8"),
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
                reason: Unsupported::new(Feature::Dtype, "other than f16").value("bf16"),
            },
        ]
    }

    fn shard(
        index: usize,
        count: usize,
        passed: usize,
        upstream: &[UpstreamStatus],
    ) -> CheckSummary {
        let rows: Vec<UpstreamRow> = upstream
            .iter()
            .enumerate()
            .map(|(i, status)| UpstreamRow {
                backend: "cpu".into(),
                test: "causal".into(),
                spec: format!("spec{i}"),
                heads: (8, 2),
                status: status.clone(),
                max_abs_err: f64::NAN,
                max_rel_err: f64::NAN,
            })
            .collect();
        let mut b = BackendSummary::new("cpu");
        b.cases_run = passed;
        b.passed = passed;
        b.backend_seconds = 1.0;
        b.wall_seconds = 1.0;
        for r in &rows {
            match &r.status {
                UpstreamStatus::Pass => b.passed += 1,
                UpstreamStatus::Unsupported { reason } => b.add_unsupported(reason, 1),
                UpstreamStatus::Diverged { kind } => {
                    b.failed += 1;
                    *b.divergences.entry(*kind).or_default() += 1;
                }
                UpstreamStatus::NotDeclared { .. } => continue,
            }
            b.cases_run += 1;
        }
        CheckSummary {
            schema_version: attn_results::SCHEMA_VERSION,
            seed: 1,
            cases: 10,
            shard: Shard { index, count },
            deep: false,
            long: false,
            traces: 0,
            oracle_seconds: 0.5,
            backends: vec![b],
            upstream: rows,
            coverage: None,
            only: None,
        }
    }

    #[test]
    fn upstream_outcomes_are_counted_once() {
        let m = merge(vec![shard(1, 2, 4, &up()), shard(0, 2, 5, &up())]).unwrap();
        let b = &m.backends[0];
        assert_eq!((b.cases_run, b.passed, b.failed), (9 + 3, 9 + 1, 1));
        assert_eq!(b.unsupported.len(), 1);
        assert_eq!(b.unsupported[0].cases, 1);
        assert_eq!(b.unsupported[0].feature, Feature::Dtype);
        assert_eq!(b.divergences.get(&DivergenceKind::NonFinite), Some(&1));
        assert_eq!(m.upstream.len(), 4);
        assert_eq!(m.shard, Shard { index: 0, count: 1 });
        assert_eq!(b.wall_seconds, 2.0);
    }

    #[test]
    fn property_declines_of_shards_add_up_by_reason() {
        let mut a = shard(0, 2, 1, &[]);
        let mut b = shard(1, 2, 1, &[]);
        let size = |d| Unsupported::new(Feature::HeadSize, "not a multiple of 64").value(d);
        a.backends[0].add_unsupported(&size(80), 2);
        b.backends[0].add_unsupported(&size(96), 3);
        let m = merge(vec![a, b]).unwrap();
        let g = &m.backends[0].unsupported;
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!(g[0].cases, 5);
        assert_eq!(g[0].to_string(), "head size not a multiple of 64 (2 sizes)");
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
        assert!(matches!(
            merge(vec![shard(0, 2, 1, &up()), shard(1, 2, 1, &up()[..2])]),
            Err(MergeError::Disagree {
                field: "upstream cases",
                ..
            })
        ));
    }

    #[test]
    fn counts_smaller_than_the_upstream_rows_are_inconsistent() {
        let mut s = shard(1, 2, 0, &up());
        s.backends[0].passed = 0;
        assert!(matches!(
            merge(vec![shard(0, 2, 0, &up()), s.clone()]),
            Err(MergeError::Inconsistent { index: 1, .. })
        ));
        let mut s = shard(1, 2, 0, &up());
        s.backends[0].unsupported.clear();
        assert!(matches!(
            merge(vec![shard(0, 2, 0, &up()), s]),
            Err(MergeError::Inconsistent { index: 1, .. })
        ));
    }
}
