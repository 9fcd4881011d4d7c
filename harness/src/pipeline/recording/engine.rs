//! The engine's own answers as a backend: `engine:CLASS` returns, for each recorded call,
//! the output the engine's backend computed for it, so the check judges what production
//! computed the way it judges any backend (one class per cause, replay files). It has no
//! answer for a case the engine never ran (a shrunk form): that case is declined, so its
//! failures are reported as found.

use crate::pipeline::recording::EngineCall;
use attn_backends::{Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs};
use attn_reference::{AttentionConfig, Dimension, Feature, Unsupported};
use attn_results::BackendRole;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// The recorded outputs of one engine backend class.
pub struct EngineOutputs {
    name: String,
    /// By the inputs a forward sees ([`key_of`]): the output, real tokens only.
    outputs: HashMap<u64, Vec<f32>>,
}

impl EngineOutputs {
    /// One backend per engine backend class among `calls`, in order of first appearance.
    pub fn of(calls: &[EngineCall]) -> Vec<EngineOutputs> {
        let mut out: Vec<EngineOutputs> = Vec::new();
        for c in calls {
            let name = format!("engine:{}", c.engine.backend);
            let i = match out.iter().position(|e| e.name == name) {
                Some(i) => i,
                None => {
                    out.push(EngineOutputs {
                        name,
                        outputs: HashMap::new(),
                    });
                    out.len() - 1
                }
            };
            let case = &c.case;
            let key = key_of(
                &case.tensors.query,
                &case.batch.seq_lens,
                &case.layout.block_table,
                case.num_tokens(),
            );
            out[i].outputs.insert(key, c.output.clone());
        }
        out
    }
}

/// What identifies a call among a recording's: its queries' bits, lengths and block table.
fn key_of(query: &[f32], seq_lens: &[usize], table: &[Vec<u32>], tokens: usize) -> u64 {
    let mut h = DefaultHasher::new();
    for q in query {
        q.to_bits().hash(&mut h);
    }
    seq_lens.hash(&mut h);
    table.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl Backend for EngineOutputs {
    fn name(&self) -> &str {
        &self.name
    }

    fn role(&self) -> BackendRole {
        BackendRole::External
    }

    fn supports(&self, _: &AttentionConfig) -> Result<(), Unsupported> {
        Ok(())
    }

    /// Whatever the engine ran, it ran: nothing is declined for a feature.
    fn optional_features(&self) -> Vec<Feature> {
        Feature::ALL.to_vec()
    }

    fn cache_layout(&self) -> CacheLayout {
        CacheLayout {
            shape: "none: the engine's outputs as recorded",
            description: "the output the engine's own backend returned for each recorded call",
        }
    }

    fn new_cache(&self, _: &AttentionConfig, _: usize) -> Result<KvCache, BackendError> {
        Ok(Box::new(()))
    }

    fn write_kv(
        &self,
        _: &AttentionConfig,
        _: &mut KvCache,
        _: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        Ok(())
    }

    fn failure_caveat(&self, _: &AttentionConfig) -> Option<String> {
        Some(
            "the engine's own output, as recorded: the engine is not run again, so the replay \
             file replays the call on another backend (`--backend cpu`)"
                .into(),
        )
    }

    fn forward(
        &self,
        config: &AttentionConfig,
        _: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        let key = key_of(step.query, step.seq_lens, step.block_table, step.num_tokens);
        let Some(out) = self.outputs.get(&key) else {
            return Err(Unsupported::new(
                Dimension::Other,
                "the engine never ran this case (a shrunk form of a recorded call)",
            )
            .into());
        };
        // Padding rows: the engine wrote none; they may hold anything finite.
        let mut full = out.clone();
        full.resize(
            step.num_tokens * config.num_heads * config.head_size_v(),
            0.0,
        );
        Ok(full)
    }
}
