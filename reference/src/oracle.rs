//! The trusted reference: attention in f64 over each sequence's contiguous (unpaged) K/V.
//!
//! Obviously correct rather than fast: it never reads the paged cache, the block table or the
//! slot mapping, and it shares no code with any backend. Semantics (upstream-facts): the new
//! query token `j` of a sequence sits at position `p = context_len + j`; a decoder query sees
//! keys `0..=p` (window `w`: `[p - w + 1, p]`; local chunks of `c`: from `p - p % c`), an
//! encoder-only query every key (window `w`: `|p - k| < w`), a cross-attention query every
//! key of the encoder; logits are `scale * q·k`, then soft-capped, then ALiBi
//! `slope_h * (k - p)`;
//! a sink joins the softmax denominator only; query head `h` reads kv head `h / (Hq / Hkv)`.
//! vLLM 0.33's per-request masks: a non-causal request sees its whole sequence (a window both
//! ways); R-SWA keeps keys below a request's prefix (`k < P ∨ p - k < w`); a query inside a
//! PrefixLM range `[a, b]` also sees all of it (`(causal ∧ window) ∨ in-range`).
//! With an FP8 KV cache every key and value is what the cache gives back, `fp8(x / scale) *
//! scale` ([`crate::fp8`]): the oracle checks a kernel's attention on the stored values; the
//! quantizer itself is checked against the reference one on its own.
//! MLA ([`crate::Mla`]): keys are the whole latent entry (`head_size` dims), values its first
//! `head_size_v` dims, read from the same (read-back) entry; the output has `head_size_v`
//! dims per head.

use crate::{AttentionConfig, AttentionKind, Case, RequestMask};
use rayon::prelude::*;

/// Run the oracle on `n` threads from now on (each output row is summed on one thread, so the
/// result does not depend on `n`). Takes effect only before the oracle's first use; later calls
/// change nothing.
pub fn use_threads(n: usize) {
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n.max(1))
        .build_global();
}

/// What decides which keys a query sees: the attention kind's rule, narrowed by the
/// config's window and local chunk, and the request's own mask (causality, PrefixLM ranges,
/// R-SWA). Every reader of a mask (the oracle, the logit statistics, the mutants) goes
/// through [`Visibility::keys`], so a new way of hiding keys is added here once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Visibility<'a> {
    pub kind: AttentionKind,
    pub window: Option<usize>,
    pub chunk: Option<usize>,
    /// Chunks before the query's own that it also sees (0: its own chunk only).
    pub lookback: usize,
    /// The request's causality, PrefixLM ranges and R-SWA prefix.
    pub request: RequestMask<'a>,
}

/// The keys one query sees: up to three disjoint half-open spans of positions, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    spans: [(usize, usize); 3],
    len: usize,
}

impl Keys {
    /// The keys of `spans` (half-open; empty ones dropped, overlapping ones merged).
    pub fn of(spans: &[(usize, usize)]) -> Keys {
        let mut sorted: Vec<(usize, usize)> =
            spans.iter().copied().filter(|&(a, b)| a < b).collect();
        sorted.sort_unstable();
        let mut out = Keys {
            spans: [(0, 0); 3],
            len: 0,
        };
        for (a, b) in sorted {
            match out.len.checked_sub(1).map(|i| &mut out.spans[i]) {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => {
                    assert!(out.len < 3, "a query's keys form at most three spans");
                    out.spans[out.len] = (a, b);
                    out.len += 1;
                }
            }
        }
        out
    }

    /// The spans, half-open and in order.
    pub fn spans(&self) -> &[(usize, usize)] {
        &self.spans[..self.len]
    }

    /// Every visible key, in order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.spans().iter().flat_map(|&(a, b)| a..b)
    }

    pub fn count(&self) -> usize {
        self.spans().iter().map(|&(a, b)| b - a).sum()
    }

    pub fn contains(&self, k: usize) -> bool {
        self.spans().iter().any(|&(a, b)| a <= k && k < b)
    }

    /// The first and last visible key (`None`: no key).
    pub fn bounds(&self) -> Option<(usize, usize)> {
        let s = self.spans();
        Some((s.first()?.0, s.last()?.1 - 1))
    }
}

impl Visibility<'static> {
    /// The config's rule for a causal request with no ranges and no R-SWA.
    pub fn of(c: &AttentionConfig) -> Self {
        Visibility {
            kind: c.kind,
            window: c.sliding_window,
            chunk: c.attention_chunk_size,
            lookback: c.chunk_lookback.unwrap_or(0),
            request: RequestMask::CAUSAL,
        }
    }
}

impl<'a> Visibility<'a> {
    /// The visibility of sequence `seq` of `case` (its own mask).
    pub fn of_seq(case: &'a Case, seq: usize) -> Self {
        Visibility {
            request: case.batch.request_mask(seq),
            ..Visibility::of(&case.config)
        }
    }

    /// The visible keys of the query at position `p` in a sequence of `seq_len`.
    pub fn keys(self, p: usize, seq_len: usize) -> Keys {
        let (lo, hi) = self.base(p, seq_len);
        if self.kind != AttentionKind::Decoder {
            return Keys::of(&[(lo, hi + 1)]);
        }
        let r = self.request;
        // R-SWA (upstream: mask &= k < prefix ∨ p - k < w): the prefix, and the window.
        let mut spans = match r.rswa {
            Some((w, prefix)) => vec![
                (lo, (hi + 1).min(prefix)),
                (lo.max((p + 1).saturating_sub(w)), hi + 1),
            ],
            None => vec![(lo, hi + 1)],
        };
        // PrefixLM (upstream: (causal ∧ window) ∨ in-range): the query's whole range,
        // within the window when the ranges are clamped to it (Gemma 4).
        if let Some((a, b)) = r.range_of(p) {
            let a = match (r.clamp_to_window, self.window) {
                (true, Some(w)) => a.max((p + 1).saturating_sub(w)),
                _ => a,
            };
            // A range may reach past the step's keys (an image chunked prefill has not
            // finished): none past the last computed one.
            spans.push((a, (b + 1).min(seq_len)));
        }
        Keys::of(&spans)
    }

    /// The config's and the causality's key range `lo..=hi` (before R-SWA and ranges).
    fn base(self, p: usize, seq_len: usize) -> (usize, usize) {
        match self.kind {
            AttentionKind::Decoder => {
                let lo = self.window.map_or(0, |w| (p + 1).saturating_sub(w));
                // Validation keeps local chunks to decoders. Upstream's rule: key k is
                // seen when p / c - k / c <= lookback (every later key passes it).
                let chunk_start = self.chunk.map_or(0, |c| {
                    let c = c.max(1);
                    (p / c).saturating_sub(self.lookback) * c
                });
                // A non-causal request sees the whole sequence, a window both ways
                // (vLLM 0.33: |p - k| < w).
                let hi = match (self.request.causal, self.window) {
                    (true, _) => p,
                    (false, None) => seq_len - 1,
                    (false, Some(w)) => (p + w - 1).min(seq_len - 1),
                };
                (lo.max(chunk_start), hi)
            }
            // The whole encoder, whatever the decoder position (validation rejects a window).
            AttentionKind::EncoderDecoder => (0, seq_len - 1),
            AttentionKind::EncoderOnly => match self.window {
                None => (0, seq_len - 1),
                Some(w) => ((p + 1).saturating_sub(w), (p + w - 1).min(seq_len - 1)),
            },
        }
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    // Four partial sums: the same math, and fast enough for the upstream specs in tests.
    let mut s = [0.0f64; 4];
    let mut chunks_a = a.chunks_exact(4);
    let mut chunks_b = b.chunks_exact(4);
    for (x, y) in (&mut chunks_a).zip(&mut chunks_b) {
        for i in 0..4 {
            s[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0;
    for (x, y) in chunks_a.remainder().iter().zip(chunks_b.remainder()) {
        tail += x * y;
    }
    (s[0] + s[1]) + (s[2] + s[3]) + tail
}

/// The expected output `[num_real_tokens, num_heads, head_size_v]` in f64 (`head_size_v` is
/// `head_size` but in MLA). Padding tokens have no expected output. The case must be valid.
pub fn reference_output(case: &Case) -> Vec<f64> {
    let c = &case.config;
    let (hq, hkv, d, dv) = (c.num_heads, c.num_kv_heads, c.head_size, c.head_size_v());
    let scale = c.effective_scale();
    let group = hq / hkv;
    let starts = case.query_start_loc();
    let mut out = vec![0.0f64; case.num_real_tokens() * hq * dv];

    for s in 0..case.num_seqs() {
        let visible = Visibility::of_seq(case, s);
        let seq_len = case.batch.seq_lens[s];
        let ctx = case.context_len(s);
        let (k, v) = kv_as_read(case, s);
        // (token, head) rows spread over the threads, a decode step's heads too; rows are
        // grouped so each task has some 10^5 multiply-adds (small cases run on one thread).
        let rows = &mut out[starts[s] * hq * dv..starts[s + 1] * hq * dv];
        let per_row = seq_len * (d + dv);
        let min_rows = (100_000 / per_row.max(1)).max(1);
        rows.par_chunks_mut(dv)
            .with_min_len(min_rows)
            .enumerate()
            .for_each(|(r, o)| {
                let (j, h) = (r / hq, r % hq);
                let token = starts[s] + j;
                let p = ctx + j;
                let keys = visible.keys(p, seq_len);
                let kvh = h / group;
                let q = query_as_read(case, token, h);
                let logits: Vec<f64> = keys
                    .iter()
                    .map(|key| {
                        let krow = &k[(key * hkv + kvh) * d..(key * hkv + kvh + 1) * d];
                        let mut l = scale * dot(&q, krow);
                        if let Some(cap) = c.logits_soft_cap {
                            let cap = cap as f64;
                            l = cap * (l / cap).tanh();
                        }
                        if let Some(slopes) = &c.alibi_slopes {
                            l += slopes[h] as f64 * (key as f64 - p as f64);
                        }
                        l
                    })
                    .collect();
                let sink = c.sinks.as_ref().map(|s| s[h] as f64);
                let m = logits
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let mut denom = sink.map_or(0.0, |s| (s - m).exp());
                o.fill(0.0);
                for (i, key) in keys.iter().enumerate() {
                    let w = (logits[i] - m).exp();
                    denom += w;
                    let vrow = &v[(key * hkv + kvh) * dv..(key * hkv + kvh + 1) * dv];
                    for (acc, &x) in o.iter_mut().zip(vrow) {
                        *acc += w * x;
                    }
                }
                for acc in o.iter_mut() {
                    *acc /= denom;
                }
            });
    }
    out
}

/// Sequence `seq`'s keys and values `[seq_len, num_kv_heads, ·]` as a kernel reads them: what
/// an FP8 cache gives back, and under MLA the values as the latent entry's prefix.
pub fn kv_as_read(case: &Case, seq: usize) -> (Vec<f64>, Vec<f64>) {
    let c = &case.config;
    let (k32, v32) = case.contiguous_kv(seq);
    match (&c.kv_cache, c.mla) {
        // One latent entry: V is the prefix of the key as the cache gives it back.
        (Some(cache), Some(m)) => {
            let k = cache.read_back_k(&k32, c.num_kv_heads, c.head_size);
            let v = k
                .chunks_exact(c.head_size)
                .flat_map(|row| &row[..m.head_size_v])
                .copied()
                .collect();
            (k, v)
        }
        (Some(cache), None) => (
            cache.read_back_k(&k32, c.num_kv_heads, c.head_size),
            cache.read_back_v(&v32, c.num_kv_heads, c.head_size_v()),
        ),
        (None, _) => (
            k32.iter().map(|&x| x as f64).collect(),
            v32.iter().map(|&x| x as f64).collect(),
        ),
    }
}

/// Query head `h` of token `token` as a kernel reads it (an FP8 query read back).
pub fn query_as_read(case: &Case, token: usize, h: usize) -> Vec<f64> {
    let c = &case.config;
    let (hq, d) = (c.num_heads, c.head_size);
    let row = &case.tensors.query[(token * hq + h) * d..(token * hq + h + 1) * d];
    match &c.kv_cache {
        Some(cache) => cache.read_back_q(row),
        None => row.iter().map(|&x| x as f64).collect(),
    }
}
