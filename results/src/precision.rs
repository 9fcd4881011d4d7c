//! Precision triples: a half dtype, a positional feature and a length past which that dtype
//! no longer holds every position. f16 holds every integer only up to 2,048 (its step is 2
//! past it, 4 past 4,096, 8 past 8,192), bf16 only up to 256, so a backend that builds ALiBi
//! positions, window bounds, chunk starts, look-back edges, PrefixLM ranges or an R-SWA edge
//! in the model's dtype is wrong only inside one such triple. Coverage counts them (the
//! `precision` dimension) and the harness's precision tier draws each one.

use attn_reference::{DType, Feature};
use std::sync::OnceLock;

/// The dtypes whose positions round: f16 and bf16.
pub const PRECISION_DTYPES: [DType; 2] = [DType::F16, DType::Bf16];
/// The features a position enters.
pub const POSITIONAL_FEATURES: [Feature; 6] = [
    Feature::Alibi,
    Feature::SlidingWindow,
    Feature::ChunkedLocalAttention,
    Feature::ChunkLookback,
    Feature::PrefixLm,
    Feature::Rswa,
];
/// The lengths a case's longest sequence passes: bf16's exact range, then f16's and the
/// next two steps of its spacing.
pub const PRECISION_LENGTHS: [usize; 4] = [256, 2048, 4096, 8192];
/// Every triple: dtype × feature × length.
pub const TRIPLES: usize =
    PRECISION_DTYPES.len() * POSITIONAL_FEATURES.len() * PRECISION_LENGTHS.len();

/// Triple `n` (modulo [`TRIPLES`]): lengths turn fastest, then features, then dtypes.
pub fn triple(n: usize) -> (DType, Feature, usize) {
    let t = n % TRIPLES;
    let (lengths, features) = (PRECISION_LENGTHS.len(), POSITIONAL_FEATURES.len());
    (
        PRECISION_DTYPES[t / (lengths * features)],
        POSITIONAL_FEATURES[t / lengths % features],
        PRECISION_LENGTHS[t % lengths],
    )
}

/// The greatest of [`PRECISION_LENGTHS`] that a longest sequence of `longest` passes.
pub fn length_class(longest: usize) -> Option<usize> {
    PRECISION_LENGTHS
        .iter()
        .rev()
        .find(|&&l| longest > l)
        .copied()
}

/// Every triple's bucket (e.g. `f16 · ALiBi · past 2048`), in [`triple`] order.
pub fn buckets() -> &'static [&'static str] {
    static LABELS: OnceLock<Vec<&'static str>> = OnceLock::new();
    LABELS.get_or_init(|| {
        (0..TRIPLES)
            .map(|n| {
                let (d, f, l) = triple(n);
                &*format!("{} · {} · past {l}", d.name(), f.label()).leak()
            })
            .collect()
    })
}

/// The bucket of triple (`dtype`, `feature`, `length`); None outside the triples.
pub fn bucket(dtype: DType, feature: Feature, length: usize) -> Option<&'static str> {
    (0..TRIPLES)
        .position(|n| triple(n) == (dtype, feature, length))
        .map(|n| buckets()[n])
}
