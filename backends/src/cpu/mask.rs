//! Which keys a query sees: causal or bidirectional, with the sliding window in each
//! convention and local chunks. Shared by the scheduler (to size tasks) and the kernel (to
//! mask scores).

use attn_reference::AttentionKind;
use std::ops::Range;

/// The keys the query at position `p` may see, as a half-open range. A decoder with local
/// chunks of `c` sees nothing before its chunk's start `p - p % c`.
pub fn visible_keys(
    kind: AttentionKind,
    (window, chunk): (Option<usize>, Option<usize>),
    p: usize,
    seq_len: usize,
) -> Range<usize> {
    if kind == AttentionKind::EncoderDecoder {
        // Cross-attention: the whole encoder (validation rejects a window).
        return 0..seq_len;
    }
    let mut lo = window.map_or(0, |w| (p + 1).saturating_sub(w));
    if let (AttentionKind::Decoder, Some(c)) = (kind, chunk) {
        lo = lo.max(p - p % c.max(1));
    }
    let hi = match (kind, window) {
        (AttentionKind::EncoderDecoder, _) => seq_len,
        (AttentionKind::Decoder, _) => p + 1,
        (AttentionKind::EncoderOnly, None) => seq_len,
        (AttentionKind::EncoderOnly, Some(w)) => (p + w).min(seq_len),
    };
    lo..hi.max(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_follows_both_window_conventions() {
        use AttentionKind::*;
        assert_eq!(visible_keys(Decoder, (None, None), 5, 10), 0..6);
        assert_eq!(visible_keys(Decoder, (Some(1), None), 5, 10), 5..6);
        assert_eq!(visible_keys(Decoder, (Some(3), None), 5, 10), 3..6);
        assert_eq!(visible_keys(Decoder, (Some(100), None), 5, 10), 0..6);
        assert_eq!(visible_keys(EncoderOnly, (None, None), 5, 10), 0..10);
        assert_eq!(visible_keys(EncoderOnly, (Some(2), None), 5, 10), 4..7);
        assert_eq!(visible_keys(EncoderOnly, (Some(3), None), 9, 10), 7..10);
        assert_eq!(visible_keys(EncoderDecoder, (None, None), 0, 10), 0..10);
        assert_eq!(visible_keys(EncoderDecoder, (None, None), 30, 10), 0..10);
        // Local chunks of 4: position 5 starts its chunk at 4, position 8 at 8.
        assert_eq!(visible_keys(Decoder, (None, Some(4)), 5, 10), 4..6);
        assert_eq!(visible_keys(Decoder, (None, Some(4)), 8, 10), 8..9);
        assert_eq!(visible_keys(Decoder, (Some(2), Some(4)), 7, 10), 6..8);
    }
}
