//! Mutants that compute every row correctly (within the oracle's tolerance) but whose bits
//! depend on what else the step holds, or on when it runs, while they declare that they do
//! not: only invariance pairs can kill them. Each is the real `cpu` kernel run with its decode
//! split along the keys or not (the split's log-sum-exp merge rounds differently from one
//! pass), chosen from the batch as a split heuristic would, or from the call's turn.

use crate::cpu::{CpuBackend, CpuSettings, SplitKv};
use crate::{Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs, Unsupported};
use attn_reference::relation::Relation;
use attn_reference::AttentionConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variance {
    /// A decode splits along its keys only when its request is alone in the step: the split
    /// count is chosen from the batch size (declares the batch relation).
    SplitWhenAlone,
    /// The requests at odd positions of the step split their decodes, the others do not: work
    /// handed out by batch position (declares the order relation, not the batch one).
    SplitByPosition,
    /// Whether a decode splits alternates with each call its thread makes: the same call run
    /// twice rounds two ways, as a split-K merge by atomic adds does when the order in which
    /// workers arrive changes (declares the repetition relation only).
    SplitEveryOtherCall,
}

thread_local! {
    /// Calls this thread made to a [`Variance::SplitEveryOtherCall`] mutant: per thread, so
    /// that two calls in a row (a pair's two forms, a shrink's tries) always alternate,
    /// whatever the other workers of the run do.
    static CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

pub struct VariantMutant {
    name: String,
    variance: Variance,
    /// `cpu` with every decode of two keys or more split, and with none split.
    split: CpuBackend,
    whole: CpuBackend,
}

impl VariantMutant {
    pub fn new(name: &str, variance: Variance) -> Self {
        let with = |split_kv| {
            CpuBackend::new(CpuSettings {
                split_kv,
                ..CpuSettings::default()
            })
            .expect("auto settings build on every host")
        };
        VariantMutant {
            name: attn_results::BackendRef::mutant(name).to_string(),
            variance,
            split: with(SplitKv::Always),
            whole: with(SplitKv::Never),
        }
    }
}

impl Backend for VariantMutant {
    fn name(&self) -> &str {
        &self.name
    }

    fn role(&self) -> attn_results::BackendRole {
        attn_results::BackendRole::Mutant
    }

    fn invariant_under(&self) -> Vec<Relation> {
        match self.variance {
            Variance::SplitWhenAlone => vec![
                Relation::Batch,
                Relation::Order,
                Relation::Placement,
                Relation::Repetition,
            ],
            Variance::SplitByPosition => {
                vec![Relation::Order, Relation::Placement, Relation::Repetition]
            }
            // Any pair's two forms are two calls, so it can hold to no other relation.
            Variance::SplitEveryOtherCall => vec![Relation::Repetition],
        }
    }

    fn supports(&self, config: &AttentionConfig) -> Result<(), Unsupported> {
        self.whole.supports(config)
    }

    fn space(&self) -> attn_reference::Space {
        self.whole.space()
    }

    fn optional_features(&self) -> Vec<attn_reference::Feature> {
        self.whole.optional_features()
    }

    fn cache_layout(&self) -> CacheLayout {
        self.whole.cache_layout()
    }

    fn new_cache(
        &self,
        config: &AttentionConfig,
        num_blocks: usize,
    ) -> Result<KvCache, BackendError> {
        self.whole.new_cache(config, num_blocks)
    }

    fn write_kv(
        &self,
        config: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        self.whole.write_kv(config, cache, kv)
    }

    fn forward(
        &self,
        config: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        match self.variance {
            Variance::SplitWhenAlone if step.seq_lens.len() == 1 => {
                self.split.forward(config, cache, step)
            }
            Variance::SplitWhenAlone => self.whole.forward(config, cache, step),
            Variance::SplitByPosition => {
                let mut out = self.whole.forward(config, cache, step)?;
                let split = self.split.forward(config, cache, step)?;
                let width = out.len() / step.num_tokens.max(1);
                for seq in (1..step.seq_lens.len()).step_by(2) {
                    let rows =
                        step.query_start_loc[seq] * width..step.query_start_loc[seq + 1] * width;
                    out[rows.clone()].copy_from_slice(&split[rows]);
                }
                Ok(out)
            }
            Variance::SplitEveryOtherCall => {
                let call = CALLS.with(|c| c.replace(c.get() + 1));
                if call % 2 == 1 {
                    self.split.forward(config, cache, step)
                } else {
                    self.whole.forward(config, cache, step)
                }
            }
        }
    }
}
