//! Which keys a query sees: causal or bidirectional, with the sliding window in each
//! convention and local chunks. Shared by the scheduler (to size tasks) and the kernel (to
//! mask scores).

use attn_reference::{AttentionConfig, AttentionKind};
use std::ops::Range;

/// What bounds a query's keys besides its kind: the window, local chunks and their
/// look-back (chunks before the query's own it also sees).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyLimits {
    pub window: Option<usize>,
    pub chunk: Option<usize>,
    pub lookback: usize,
    /// A non-causal decoder request sees its whole sequence (a window both ways).
    pub non_causal: bool,
}

impl KeyLimits {
    pub fn of(cfg: &AttentionConfig) -> KeyLimits {
        KeyLimits {
            window: cfg.sliding_window,
            chunk: cfg.attention_chunk_size,
            lookback: cfg.chunk_lookback.unwrap_or(0),
            non_causal: false,
        }
    }

    /// The limits of a request that is `causal` or not.
    pub fn causal(self, causal: bool) -> KeyLimits {
        KeyLimits {
            non_causal: !causal,
            ..self
        }
    }
}

/// The keys the query at position `p` may see, as a half-open range. A decoder with local
/// chunks of `c` and a look-back of `k` sees nothing before `(p / c - k) * c`.
pub fn visible_keys(
    kind: AttentionKind,
    limits: KeyLimits,
    p: usize,
    seq_len: usize,
) -> Range<usize> {
    let KeyLimits {
        window,
        chunk,
        lookback,
        non_causal,
    } = limits;
    if kind == AttentionKind::EncoderDecoder {
        // Cross-attention: the whole encoder (validation rejects a window).
        return 0..seq_len;
    }
    let mut lo = window.map_or(0, |w| (p + 1).saturating_sub(w));
    if let (AttentionKind::Decoder, Some(c)) = (kind, chunk) {
        let c = c.max(1);
        lo = lo.max((p / c).saturating_sub(lookback) * c);
    }
    // Bidirectional (encoder-only, a non-causal decoder request): a window reaches both ways.
    let hi = match (kind, window) {
        (AttentionKind::EncoderDecoder, _) => seq_len,
        (AttentionKind::Decoder, _) if !non_causal => p + 1,
        (_, None) => seq_len,
        (_, Some(w)) => (p + w).min(seq_len),
    };
    lo..hi.max(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The old tuple form, for the table below.
    fn limits((window, chunk): (Option<usize>, Option<usize>)) -> KeyLimits {
        KeyLimits {
            window,
            chunk,
            ..KeyLimits::default()
        }
    }

    #[test]
    fn a_non_causal_request_sees_its_whole_sequence_and_a_window_both_ways() {
        use AttentionKind::Decoder;
        let open = |window, chunk| limits((window, chunk)).causal(false);
        assert_eq!(visible_keys(Decoder, open(None, None), 5, 10), 0..10);
        assert_eq!(visible_keys(Decoder, open(Some(2), None), 5, 10), 4..7);
        assert_eq!(visible_keys(Decoder, open(Some(3), None), 9, 10), 7..10);
        // Chunks bound it from below only: every later key passes p / c - k / c <= 0.
        assert_eq!(visible_keys(Decoder, open(None, Some(4)), 5, 10), 4..10);
    }

    #[test]
    fn look_back_reaches_whole_chunks_before_the_query_s_own() {
        let back = |lookback, window| KeyLimits {
            window,
            chunk: Some(4),
            lookback,
            non_causal: false,
        };
        use AttentionKind::Decoder;
        // Position 9 is in chunk 2 (keys 8..): one chunk back starts at 4, two at 0, three
        // are clipped to 0.
        assert_eq!(visible_keys(Decoder, back(1, None), 9, 12), 4..10);
        assert_eq!(visible_keys(Decoder, back(2, None), 9, 12), 0..10);
        assert_eq!(visible_keys(Decoder, back(3, None), 9, 12), 0..10);
        assert_eq!(visible_keys(Decoder, back(1, Some(3)), 9, 12), 7..10);
    }

    #[test]
    fn visibility_follows_both_window_conventions() {
        use AttentionKind::*;
        assert_eq!(visible_keys(Decoder, limits((None, None)), 5, 10), 0..6);
        assert_eq!(visible_keys(Decoder, limits((Some(1), None)), 5, 10), 5..6);
        assert_eq!(visible_keys(Decoder, limits((Some(3), None)), 5, 10), 3..6);
        assert_eq!(
            visible_keys(Decoder, limits((Some(100), None)), 5, 10),
            0..6
        );
        assert_eq!(
            visible_keys(EncoderOnly, limits((None, None)), 5, 10),
            0..10
        );
        assert_eq!(
            visible_keys(EncoderOnly, limits((Some(2), None)), 5, 10),
            4..7
        );
        assert_eq!(
            visible_keys(EncoderOnly, limits((Some(3), None)), 9, 10),
            7..10
        );
        assert_eq!(
            visible_keys(EncoderDecoder, limits((None, None)), 0, 10),
            0..10
        );
        assert_eq!(
            visible_keys(EncoderDecoder, limits((None, None)), 30, 10),
            0..10
        );
        // Local chunks of 4: position 5 starts its chunk at 4, position 8 at 8.
        assert_eq!(visible_keys(Decoder, limits((None, Some(4))), 5, 10), 4..6);
        assert_eq!(visible_keys(Decoder, limits((None, Some(4))), 8, 10), 8..9);
        assert_eq!(
            visible_keys(Decoder, limits((Some(2), Some(4))), 7, 10),
            6..8
        );
    }
}
