//! Which keys a query sees: causal or bidirectional, with the sliding window in each
//! convention, local chunks, and a request's own mask (non-causal, R-SWA's prefix, PrefixLM
//! ranges). Shared by the scheduler (to size tasks) and the kernel (to mask scores).

use attn_reference::{AttentionConfig, AttentionKind, RequestMask};
use std::ops::Range;

/// What bounds a query's keys besides its kind: the window, local chunks and their
/// look-back (chunks before the query's own it also sees), and the request's mask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyLimits<'a> {
    pub window: Option<usize>,
    pub chunk: Option<usize>,
    pub lookback: usize,
    /// A non-causal decoder request sees its whole sequence (a window both ways).
    pub non_causal: bool,
    /// The request's PrefixLM ranges `[start, end]` (ends inclusive), sorted.
    pub ranges: &'a [(usize, usize)],
    /// The ranges' keys only within the window (Gemma 4).
    pub clamp_ranges: bool,
    /// R-SWA's `(window, prefix length)`.
    pub rswa: Option<(usize, usize)>,
}

impl<'a> KeyLimits<'a> {
    pub fn of(cfg: &AttentionConfig) -> KeyLimits<'static> {
        KeyLimits {
            window: cfg.sliding_window,
            chunk: cfg.attention_chunk_size,
            lookback: cfg.chunk_lookback.unwrap_or(0),
            ..KeyLimits::default()
        }
    }

    /// The limits of a request that is `causal` or not.
    #[cfg(test)]
    pub fn causal(self, causal: bool) -> KeyLimits<'a> {
        KeyLimits {
            non_causal: !causal,
            ..self
        }
    }

    /// The limits of a request with mask `m`.
    pub fn request<'b>(self, m: RequestMask<'b>) -> KeyLimits<'b> {
        KeyLimits {
            window: self.window,
            chunk: self.chunk,
            lookback: self.lookback,
            non_causal: !m.causal,
            ranges: m.ranges,
            clamp_ranges: m.clamp_to_window,
            rswa: m.rswa,
        }
    }
}

/// A query's visible keys: one half-open span, or two with a gap between them (R-SWA's
/// prefix and window; a PrefixLM range apart from the causal keys). `second` is empty when
/// there is one; otherwise it starts past `first`'s end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySpans {
    pub first: Range<usize>,
    pub second: Range<usize>,
}

impl KeySpans {
    fn one(r: Range<usize>) -> KeySpans {
        KeySpans {
            first: r,
            second: 0..0,
        }
    }

    /// Two spans in any order, either possibly empty, merged when they touch.
    fn two(a: Range<usize>, b: Range<usize>) -> KeySpans {
        let (a, b) = if a.start <= b.start { (a, b) } else { (b, a) };
        if a.is_empty() {
            KeySpans::one(b)
        } else if b.is_empty() {
            KeySpans::one(a)
        } else if b.start <= a.end {
            KeySpans::one(a.start..a.end.max(b.end))
        } else {
            KeySpans {
                first: a,
                second: b,
            }
        }
    }

    /// The smallest range holding every visible key.
    pub fn hull(&self) -> Range<usize> {
        if self.second.is_empty() {
            self.first.clone()
        } else {
            self.first.start..self.second.end
        }
    }
}

/// The keys the query at position `p` may see. A decoder with local chunks of `c` and a
/// look-back of `k` sees nothing before `(p / c - k) * c`.
pub fn visible_keys(
    kind: AttentionKind,
    limits: KeyLimits<'_>,
    p: usize,
    seq_len: usize,
) -> KeySpans {
    let KeyLimits {
        window,
        chunk,
        lookback,
        non_causal,
        ..
    } = limits;
    if kind == AttentionKind::EncoderDecoder {
        // Cross-attention: the whole encoder (validation rejects a window).
        return KeySpans::one(0..seq_len);
    }
    let mut lo = window.map_or(0, |w| (p + 1).saturating_sub(w));
    if let (AttentionKind::Decoder, Some(c)) = (kind, chunk) {
        let c = c.max(1);
        lo = lo.max((p / c).saturating_sub(lookback) * c);
    }
    // Bidirectional (encoder-only, a non-causal decoder request): a window reaches both ways.
    let hi = match (kind, window) {
        (AttentionKind::Decoder, _) if !non_causal => p + 1,
        (_, None) => seq_len,
        (_, Some(w)) => (p + w).min(seq_len),
    };
    let base = lo..hi.max(lo);
    if kind != AttentionKind::Decoder {
        return KeySpans::one(base);
    }
    // R-SWA keeps, of those, the keys below the prefix and the keys within its window
    // (validation refuses it beside a sliding window or PrefixLM ranges).
    if let Some((w, prefix)) = limits.rswa {
        let near = (p + 1).saturating_sub(w).max(base.start);
        return KeySpans::two(base.start..prefix.min(base.end), near..base.end);
    }
    // A query inside a PrefixLM range also sees the whole range (Gemma 4: within the window).
    match limits.ranges.iter().find(|&&(a, b)| a <= p && p <= b) {
        Some(&(a, b)) => {
            let a = match (limits.clamp_ranges, window) {
                (true, Some(w)) => a.max((p + 1).saturating_sub(w)),
                _ => a,
            };
            // A range may reach past the step's keys (vLLM passes an image's whole range
            // while chunked prefill is inside it): none past the last computed one.
            KeySpans::two(base, a..(b + 1).min(seq_len))
        }
        None => KeySpans::one(base),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of a query whose keys are one span.
    fn one(kind: AttentionKind, limits: KeyLimits<'_>, p: usize, seq_len: usize) -> Range<usize> {
        let spans = visible_keys(kind, limits, p, seq_len);
        assert!(spans.second.is_empty(), "{spans:?}");
        spans.first
    }

    #[test]
    fn r_swa_keeps_the_prefix_and_a_range_adds_itself() {
        use AttentionKind::Decoder;
        let two = |a, b| KeySpans {
            first: a,
            second: b,
        };
        let rswa = |w, prefix| KeyLimits {
            rswa: Some((w, prefix)),
            ..KeyLimits::default()
        };
        // Prefix 3, window 2: position 9 sees 0..3 and 8..10; at 4 the two spans touch.
        assert_eq!(visible_keys(Decoder, rswa(2, 3), 9, 12), two(0..3, 8..10));
        assert_eq!(visible_keys(Decoder, rswa(2, 3), 4, 12), two(0..5, 0..0));
        assert_eq!(visible_keys(Decoder, rswa(2, 0), 9, 12), two(8..10, 0..0));
        // Non-causal under R-SWA: the prefix and every key from p - w + 1 on.
        assert_eq!(
            visible_keys(Decoder, rswa(2, 3).causal(false), 6, 12),
            two(0..3, 5..12)
        );
        let ranges = [(2, 4), (7, 7), (9, 11)];
        let mm = |window, clamp| KeyLimits {
            window,
            ranges: &ranges,
            clamp_ranges: clamp,
            ..KeyLimits::default()
        };
        // In [2, 4] position 3 sees 0..5; the one-token range adds nothing; in [9, 11]
        // position 9 sees 0..12.
        assert_eq!(one(Decoder, mm(None, false), 3, 12), 0..5);
        assert_eq!(one(Decoder, mm(None, false), 7, 12), 0..8);
        assert_eq!(one(Decoder, mm(None, false), 9, 12), 0..12);
        assert_eq!(one(Decoder, mm(None, false), 5, 12), 0..6);
        // A window of 2: position 9 sees 8..10 and its range up to 11; clamped to the
        // window, the range adds only 10 and 11.
        assert_eq!(one(Decoder, mm(Some(2), false), 9, 12), 8..12);
        assert_eq!(
            visible_keys(Decoder, mm(Some(1), false), 10, 12),
            two(9..12, 0..0)
        );
        // Position 4 with a window of 1 sees 4, and its range [2, 4] from 2 unless clamped.
        assert_eq!(one(Decoder, mm(Some(1), false), 4, 12), 2..5);
        assert_eq!(one(Decoder, mm(Some(1), true), 4, 12), 4..5);
        // With local chunks of 4 position 9 sees 8..10; its range [9, 11] adds 10 and 11,
        // and a range that starts before the chunk reaches back past the chunk's start.
        let chunked = KeyLimits {
            chunk: Some(4),
            ranges: &[(6, 9)],
            ..KeyLimits::default()
        };
        assert_eq!(one(Decoder, chunked, 9, 12), 6..10);
        let chunked = KeyLimits {
            chunk: Some(8),
            ranges: &[(1, 2)],
            ..KeyLimits::default()
        };
        assert_eq!(visible_keys(Decoder, chunked, 9, 12), two(8..10, 0..0));
        // A range past the step's 10 keys (chunked prefill inside an image): up to key 9.
        assert_eq!(one(Decoder, mm(None, false), 9, 10), 0..10);
        assert_eq!(one(Decoder, mm(Some(1), false), 9, 10), 9..10);
    }

    /// The old tuple form, for the table below.
    fn limits((window, chunk): (Option<usize>, Option<usize>)) -> KeyLimits<'static> {
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
        assert_eq!(one(Decoder, open(None, None), 5, 10), 0..10);
        assert_eq!(one(Decoder, open(Some(2), None), 5, 10), 4..7);
        assert_eq!(one(Decoder, open(Some(3), None), 9, 10), 7..10);
        // Chunks bound it from below only: every later key passes p / c - k / c <= 0.
        assert_eq!(one(Decoder, open(None, Some(4)), 5, 10), 4..10);
    }

    #[test]
    fn look_back_reaches_whole_chunks_before_the_query_s_own() {
        let back = |lookback, window| KeyLimits {
            window,
            chunk: Some(4),
            lookback,
            ..KeyLimits::default()
        };
        use AttentionKind::Decoder;
        // Position 9 is in chunk 2 (keys 8..): one chunk back starts at 4, two at 0, three
        // are clipped to 0.
        assert_eq!(one(Decoder, back(1, None), 9, 12), 4..10);
        assert_eq!(one(Decoder, back(2, None), 9, 12), 0..10);
        assert_eq!(one(Decoder, back(3, None), 9, 12), 0..10);
        assert_eq!(one(Decoder, back(1, Some(3)), 9, 12), 7..10);
    }

    #[test]
    fn visibility_follows_both_window_conventions() {
        use AttentionKind::*;
        assert_eq!(one(Decoder, limits((None, None)), 5, 10), 0..6);
        assert_eq!(one(Decoder, limits((Some(1), None)), 5, 10), 5..6);
        assert_eq!(one(Decoder, limits((Some(3), None)), 5, 10), 3..6);
        assert_eq!(one(Decoder, limits((Some(100), None)), 5, 10), 0..6);
        assert_eq!(one(EncoderOnly, limits((None, None)), 5, 10), 0..10);
        assert_eq!(one(EncoderOnly, limits((Some(2), None)), 5, 10), 4..7);
        assert_eq!(one(EncoderOnly, limits((Some(3), None)), 9, 10), 7..10);
        assert_eq!(one(EncoderDecoder, limits((None, None)), 0, 10), 0..10);
        assert_eq!(one(EncoderDecoder, limits((None, None)), 30, 10), 0..10);
        // Local chunks of 4: position 5 starts its chunk at 4, position 8 at 8.
        assert_eq!(one(Decoder, limits((None, Some(4))), 5, 10), 4..6);
        assert_eq!(one(Decoder, limits((None, Some(4))), 8, 10), 8..9);
        assert_eq!(one(Decoder, limits((Some(2), Some(4))), 7, 10), 6..8);
    }
}
