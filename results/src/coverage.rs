//! The coverage report's place in the model: per backend, how many cases it actually ran in
//! each bucket of each dimension (dtype, head-size class, …), declined cases excluded.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Cases run, by backend, then dimension, then bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoverageReport {
    pub backends: BTreeMap<String, BTreeMap<String, BTreeMap<String, usize>>>,
}

impl CoverageReport {
    /// Count one case that `backend` ran, in `bucket` of `dimension`.
    pub fn count(&mut self, backend: &str, dimension: &str, bucket: &str) {
        *self
            .backends
            .entry(backend.to_string())
            .or_default()
            .entry(dimension.to_string())
            .or_default()
            .entry(bucket.to_string())
            .or_default() += 1;
    }

    /// Add another shard's counts.
    pub fn merge(&mut self, other: &CoverageReport) {
        for (backend, dims) in &other.backends {
            for (dim, buckets) in dims {
                for (bucket, n) in buckets {
                    *self
                        .backends
                        .entry(backend.clone())
                        .or_default()
                        .entry(dim.clone())
                        .or_default()
                        .entry(bucket.clone())
                        .or_default() += n;
                }
            }
        }
    }
}
