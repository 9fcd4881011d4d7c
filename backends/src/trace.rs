//! Driving a backend through a trace: one cache for every step, as an engine keeps it. The
//! cache starts with stale data in every slot (what earlier requests left); each step writes
//! its new tokens' K/V through the slot mapping and runs forward. Nothing is cleared between
//! steps, so freed blocks reach the next sequence with their old contents.

use crate::run::{stale_fill, CaseRun};
use crate::{Backend, BackendError, KvCache, KvWrite};
use attn_reference::{Case, Trace};
use std::time::Instant;

/// A backend's cache across the steps of one trace.
pub struct TraceSession<'a> {
    backend: &'a dyn Backend,
    cache: KvCache,
}

impl<'a> TraceSession<'a> {
    /// A fresh cache for `trace` (which must be valid), stale data in every slot; `Err` when
    /// the backend declines the config or cannot run traces at all.
    pub fn start(backend: &'a dyn Backend, trace: &Trace) -> Result<Self, BackendError> {
        crate::declines(backend, &trace.config)?;
        backend.runs_traces()?;
        let mut cache = backend.new_cache(&trace.config, trace.num_blocks)?;
        let bs = trace.config.block_size as i64;
        let slots: Vec<i64> = (0..trace.num_blocks as i64 * bs).collect();
        stale_fill(backend, &trace.config, &mut cache, &slots, trace.poison)?;
        Ok(TraceSession { backend, cache })
    }

    /// Run one step, given as its case (`Trace::step_case`): only its new tokens are written;
    /// the context is whatever earlier steps left in the cache.
    pub fn step(&mut self, step: &Case) -> Result<CaseRun, BackendError> {
        crate::declines_case(self.backend, step)?;
        let config = &step.config;
        let t = &step.tensors;
        self.backend.write_kv(
            config,
            &mut self.cache,
            &KvWrite {
                key: &t.key,
                value: &t.value,
                slot_mapping: &step.layout.slot_mapping,
            },
        )?;
        let qsl = step.query_start_loc();
        let inputs = crate::step_inputs(step, &qsl);
        let start = Instant::now();
        let output = self.backend.forward(config, &self.cache, &inputs)?;
        let forward_time = start.elapsed();
        crate::run::check_output_len(self.backend, step, &output)?;
        Ok(CaseRun {
            output,
            forward_time,
        })
    }
}
