//! Which tier a property case's index draws from, and the limits of every draw.

/// Size limits of generated cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrategyLimits {
    pub max_seqs: usize,
    pub max_context: usize,
    pub max_query: usize,
    /// One case in this many is of the long tier (long contexts, large decode batches, huge
    /// caches; see [`Tier`]).
    pub long_every: usize,
    /// The longest context of the long tier.
    pub max_long_context: usize,
}

impl StrategyLimits {
    /// Small cases where off-by-ones are visible, and one in 25 from the long tier: every run
    /// of 500 holds contexts past 16k and 4k, a 256-sequence decode batch and a huge cache.
    pub const DEFAULT: StrategyLimits = StrategyLimits {
        max_seqs: 8,
        max_context: 80,
        max_query: 24,
        long_every: 25,
        max_long_context: 40_000,
    };
    /// `--deep`: bigger batches and longer sequences.
    pub const DEEP: StrategyLimits = StrategyLimits {
        max_seqs: 32,
        max_context: 1200,
        max_query: 80,
        ..StrategyLimits::DEFAULT
    };

    /// `--long`: the long tier for one case in four, contexts up to 128k.
    pub fn long(self) -> StrategyLimits {
        StrategyLimits {
            long_every: 4,
            max_long_context: 131_072,
            ..self
        }
    }
}

/// Which part of the case space a property case comes from, by its index (so every run of
/// a seed holds the same mix, and shards split it evenly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Small cases, lengths and sizes aimed at thresholds ([`super::small::recipe`]).
    Small,
    /// One or two sequences with contexts from 4k up, few heads ([`super::long::long_context`]).
    LongContext,
    /// Decode batches of 16 to 256 sequences ([`super::long::decode_batch`]).
    DecodeBatch,
    /// A few short sequences whose blocks sit at the top of a cache whose element offsets
    /// pass 2^31 ([`super::long::huge_cache`]).
    HugeCache,
    /// A prefill chunk of 8,193 to 32,768 tokens ([`super::extremes::big_step`]).
    BigStep,
    /// Decode batches of 512 to 2,048 sequences ([`super::extremes::big_batch`]).
    BigBatch,
    /// A half dtype with a positional feature just past where its positions round
    /// ([`super::precision`]).
    Precision,
}

impl Tier {
    pub fn of(index: usize, limits: StrategyLimits) -> Tier {
        let every = limits.long_every.max(1);
        if index % every != every / 2 {
            if crate::pipeline::draw::precision::is_precision(index) {
                return Tier::Precision;
            }
            return Tier::Small;
        }
        match (index / every) % 8 {
            0 | 2 | 6 => Tier::LongContext,
            1 => Tier::DecodeBatch,
            3 => Tier::HugeCache,
            4 | 7 => Tier::BigStep,
            _ => Tier::BigBatch,
        }
    }
}
