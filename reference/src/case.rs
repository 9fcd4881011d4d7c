//! One attention step of a batch, complete: config, batch shape, paged layout and tensors.
//! A replay file is a serialized `Case`.

use crate::{AttentionConfig, CaseError};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub config: AttentionConfig,
    pub batch: Batch,
    pub layout: PagedLayout,
    pub tensors: Tensors,
    /// What unwritten cache slots and padding query rows hold when the case runs (absent:
    /// large finite stale values); the oracle reads neither ([`crate::Poison`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poison: Option<crate::Poison>,
    /// Where a replay file came from (absent in cases that are not replay files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<crate::Recorded>,
}

/// The batch's shape: per sequence its total length (context + new tokens) and its number of
/// new (query) tokens, plus trailing padding tokens that belong to no sequence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    pub seq_lens: Vec<usize>,
    pub query_lens: Vec<usize>,
    /// Tokens after the last sequence's queries (as CUDA-graph padding produces): slot -1,
    /// outputs ignored, and they must never disturb real rows.
    #[serde(default)]
    pub num_padding_tokens: usize,
    /// Per sequence, whether it is causal (vLLM 0.33's `causal` tensor); absent: every one
    /// is. A non-causal decoder request sees every key of its sequence, and a window around
    /// it reaches both ways (DFlash, diffusion-style decoding). Left out of JSON when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causal: Option<Vec<bool>>,
    /// PrefixLM's bidirectional ranges (vLLM 0.33's `mm_req_doc_ranges`): image or document
    /// tokens of a request that see each other both ways. Left out of JSON when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_lm: Option<PrefixLm>,
    /// R-SWA (vLLM 0.33's `rswa_prefix_lens` and `rswa_window`): a request's prefix stays
    /// visible to every later token, later keys only within a window. Left out of JSON when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rswa: Option<Rswa>,
}

/// PrefixLM ranges of a batch. A decoder query at `p` inside a range `[start, end]` of its
/// request (ends inclusive, as upstream's `extract_embeds_range` gives them) also sees every
/// key of that range: `(causal ∧ window) ∨ in-range`, upstream's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixLm {
    /// Per sequence, its ranges `[start, end]` of positions, sorted and disjoint; one may
    /// reach past `seq_len` (vLLM passes an image's whole range while chunked prefill is
    /// inside it), its keys stopping at the last computed one.
    pub ranges: Vec<Vec<(usize, usize)>>,
    /// Gemma 4's `MM_PREFIX_CLAMP_SW`: a range's keys are seen only within the sliding
    /// window (`p - k < w`; inert without a window). Left out of JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clamp_to_window: bool,
}

impl PrefixLm {
    /// Ranges from spans in thousandths of a length `len` (so shrinking a length keeps them
    /// valid): `[start, end]` each, sorted by start; a span that lands on or before the
    /// previous one's end is dropped.
    pub fn ranges_at(spans: &[(u16, u16)], len: usize) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        if len == 0 {
            return out;
        }
        let at = |m: u16| (len * m as usize / 1000).min(len - 1);
        for &(a, b) in spans {
            let (a, b) = (at(a), at(b.max(a)));
            if out.last().is_none_or(|&(_, end)| a > end) {
                out.push((a, b));
            }
        }
        out
    }
}

/// vLLM 0.33's per-request masks apart from a batch's lengths: one entry per sequence, as
/// [`Batch`] holds them (a trace keeps them per logical sequence, a golden fixture records
/// them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequenceMasks {
    /// Per sequence, whether it is causal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causal: Option<Vec<bool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_lm: Option<PrefixLm>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rswa: Option<Rswa>,
}

/// R-SWA of a batch: a decoder query at `p` of a request with prefix length `P` sees, of
/// the keys its causality gives it, those with `k < P` or `p - k < window`. It replaces the
/// sliding window (validation refuses both).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rswa {
    /// The model's `rswa_window`, at least 1.
    pub window: usize,
    /// Per sequence, its prefix length (past `seq_len` while chunked prefill is inside the
    /// prompt, as vLLM passes the prompt's length: every key is then in it).
    pub prefix_lens: Vec<usize>,
}

/// What bounds the keys of one request besides the config: its causality, its PrefixLM
/// ranges and its R-SWA prefix. Cases, steps and kernels all read a request's mask through
/// this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestMask<'a> {
    pub causal: bool,
    /// Its PrefixLM ranges (empty: none).
    pub ranges: &'a [(usize, usize)],
    /// The ranges' keys only within the sliding window (Gemma 4).
    pub clamp_to_window: bool,
    /// R-SWA's `(window, prefix length)`.
    pub rswa: Option<(usize, usize)>,
}

impl RequestMask<'_> {
    /// A causal request with no ranges and no R-SWA.
    pub const CAUSAL: RequestMask<'static> = RequestMask {
        causal: true,
        ranges: &[],
        clamp_to_window: false,
        rswa: None,
    };

    /// The range holding position `p`, if any.
    pub fn range_of(&self, p: usize) -> Option<(usize, usize)> {
        self.ranges.iter().copied().find(|&(a, b)| a <= p && p <= b)
    }
}

/// The mask of sequence `seq` under per-request causal flags, PrefixLM ranges and R-SWA,
/// each optional (a sequence past the data: causal, no range, prefix 0).
pub fn request_mask<'a>(
    causal: Option<&[bool]>,
    prefix_lm: Option<&'a PrefixLm>,
    rswa: Option<&Rswa>,
    seq: usize,
) -> RequestMask<'a> {
    RequestMask {
        causal: is_causal(causal, seq),
        ranges: prefix_lm
            .and_then(|p| p.ranges.get(seq))
            .map_or(&[], Vec::as_slice),
        clamp_to_window: prefix_lm.is_some_and(|p| p.clamp_to_window),
        rswa: rswa.map(|r| (r.window, r.prefix_lens.get(seq).copied().unwrap_or(0))),
    }
}

/// Whether sequence `seq` is causal under per-request flags `causal` (None, or a sequence
/// past the flags: causal). Cases, steps and kernels all read the flags through this.
pub fn is_causal(causal: Option<&[bool]>, seq: usize) -> bool {
    causal.is_none_or(|c| c.get(seq).copied().unwrap_or(true))
}

impl Batch {
    /// Requests of these lengths, with no padding tokens, every request causal and no
    /// masks.
    pub fn plain(seq_lens: Vec<usize>, query_lens: Vec<usize>) -> Batch {
        Batch {
            seq_lens,
            query_lens,
            num_padding_tokens: 0,
            causal: None,
            prefix_lm: None,
            rswa: None,
        }
    }

    /// The query lengths of the requests with a token in the step (padded requests, of query
    /// length 0, left out).
    pub fn scheduled_query_lens(&self) -> impl Iterator<Item = usize> + '_ {
        self.query_lens.iter().copied().filter(|&q| q > 0)
    }

    /// Its per-request masks.
    pub fn masks(&self) -> SequenceMasks {
        SequenceMasks {
            causal: self.causal.clone(),
            prefix_lm: self.prefix_lm.clone(),
            rswa: self.rswa.clone(),
        }
    }

    /// Replace its per-request masks with `m`.
    pub fn set_masks(&mut self, m: SequenceMasks) {
        (self.causal, self.prefix_lm, self.rswa) = (m.causal, m.prefix_lm, m.rswa);
    }

    /// Whether sequence `seq` is causal.
    pub fn is_causal(&self, seq: usize) -> bool {
        is_causal(self.causal.as_deref(), seq)
    }

    /// Whether a real request (one with new tokens) is non-causal.
    pub fn has_non_causal(&self) -> bool {
        (0..self.seq_lens.len()).any(|s| !self.is_causal(s) && self.query_lens[s] > 0)
    }

    /// Whether a real request has a PrefixLM range.
    pub fn has_prefix_lm(&self) -> bool {
        self.prefix_lm.as_ref().is_some_and(|p| {
            p.ranges
                .iter()
                .zip(&self.query_lens)
                .any(|(r, &q)| !r.is_empty() && q > 0)
        })
    }

    /// The per-request masks in words (empty when there are none), for a case's summary.
    pub fn masks_summary(&self) -> String {
        let mut out = String::new();
        if let Some(c) = self.causal.as_ref().filter(|c| c.contains(&false)) {
            out += &format!(", causal {c:?}");
        }
        if let Some(p) = &self.prefix_lm {
            out += &format!(
                ", PrefixLM ranges {:?}{}",
                p.ranges,
                if p.clamp_to_window {
                    " clamped to the window"
                } else {
                    ""
                }
            );
        }
        if let Some(r) = &self.rswa {
            out += &format!(
                ", R-SWA window {} prefix_lens {:?}",
                r.window, r.prefix_lens
            );
        }
        out
    }

    /// The mask of sequence `seq` besides the config.
    pub fn request_mask(&self, seq: usize) -> RequestMask<'_> {
        request_mask(
            self.causal.as_deref(),
            self.prefix_lm.as_ref(),
            self.rswa.as_ref(),
            seq,
        )
    }
}

/// Where the KV of every token lives in the paged cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PagedLayout {
    pub num_blocks: usize,
    /// `[num_seqs][max_blocks_per_seq]`, logical block -> physical block; rows are padded
    /// with the null block 0.
    pub block_table: Vec<Vec<u32>>,
    /// `[num_tokens]`, the slot each new token's K/V is written to; -1 for padding tokens.
    pub slot_mapping: Vec<i64>,
}

/// Tensors as `f32` values exactly representable in the case's dtype, row-major.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tensors {
    /// `[num_tokens, num_heads, head_size]`
    pub query: Vec<f32>,
    /// `[num_tokens, num_kv_heads, head_size]`: K of the new tokens.
    pub key: Vec<f32>,
    /// `[num_tokens, num_kv_heads, head_size]`: V of the new tokens.
    pub value: Vec<f32>,
    /// Per sequence `[context_len, num_kv_heads, head_size]`: K already in the cache.
    pub context_key: Vec<Vec<f32>>,
    /// Per sequence `[context_len, num_kv_heads, head_size]`: V already in the cache.
    pub context_value: Vec<Vec<f32>>,
}

impl Case {
    pub fn num_seqs(&self) -> usize {
        self.batch.seq_lens.len()
    }

    /// Tokens that belong to a sequence.
    pub fn num_real_tokens(&self) -> usize {
        self.batch.query_lens.iter().sum()
    }

    /// All tokens of the step, padding included.
    pub fn num_tokens(&self) -> usize {
        self.num_real_tokens() + self.batch.num_padding_tokens
    }

    /// The bytes its inputs hold in memory (queries, new and cached K/V, as f32).
    pub fn held_bytes(&self) -> usize {
        let t = &self.tensors;
        let context: usize = t
            .context_key
            .iter()
            .chain(&t.context_value)
            .map(Vec::len)
            .sum();
        4 * (t.query.len() + t.key.len() + t.value.len() + context)
    }

    /// Bytes of K and V one attention call must read: every key position of every
    /// sequence, once per kv head, at the cache's element size.
    pub fn kv_bytes(&self) -> usize {
        let c = &self.config;
        let keys: usize = self.batch.seq_lens.iter().sum();
        // An MLA entry is K and V at once.
        let k_and_v = if c.mla.is_some() { 1 } else { 2 };
        keys * c.num_kv_heads * c.head_size * k_and_v * c.kv_element_bytes()
    }

    /// (sequence, absolute position) of real token `t` (its row in the flat query).
    pub fn locate_token(&self, t: usize) -> (usize, usize) {
        let starts = self.query_start_loc();
        let s = (0..self.num_seqs())
            .find(|&s| t < starts[s + 1])
            .unwrap_or(0);
        (s, self.context_len(s) + t - starts[s])
    }

    /// Keys already in the cache before the step: all of them in cross-attention (the
    /// encoder's K/V, written on the request's first step), else those before the new tokens.
    pub fn context_len(&self, seq: usize) -> usize {
        match self.config.kind {
            crate::AttentionKind::EncoderDecoder => self.batch.seq_lens[seq],
            _ => self.batch.seq_lens[seq] - self.batch.query_lens[seq],
        }
    }

    /// Exclusive prefix sum of query lengths, `[num_seqs + 1]`.
    pub fn query_start_loc(&self) -> Vec<usize> {
        let mut loc = Vec::with_capacity(self.num_seqs() + 1);
        let mut acc = 0;
        loc.push(0);
        for &q in &self.batch.query_lens {
            acc += q;
            loc.push(acc);
        }
        loc
    }

    /// Width of the (padded) block table rows.
    pub fn max_blocks_per_seq(&self) -> usize {
        self.layout.block_table.first().map_or(0, Vec::len)
    }

    /// The slot of absolute position `pos` of sequence `seq` according to the block table.
    pub fn slot_of(&self, seq: usize, pos: usize) -> i64 {
        let bs = self.config.block_size;
        self.layout.block_table[seq][pos / bs] as i64 * bs as i64 + (pos % bs) as i64
    }

    /// Slots of every context token, in sequence order: what a cache builder writes before the
    /// step. Context tokens are the positions `0..context_len` of each sequence.
    pub fn context_slot_mapping(&self) -> Vec<i64> {
        let mut slots = Vec::new();
        for s in 0..self.num_seqs() {
            for p in 0..self.context_len(s) {
                slots.push(self.slot_of(s, p));
            }
        }
        slots
    }

    /// Context K and V of all sequences concatenated in sequence order, matching
    /// [`Case::context_slot_mapping`].
    pub fn context_kv_flat(&self) -> (Vec<f32>, Vec<f32>) {
        (
            self.tensors.context_key.concat(),
            self.tensors.context_value.concat(),
        )
    }

    /// Contiguous (unpaged) K and V of sequence `seq`: its context followed by its new
    /// tokens, `[seq_len, num_kv_heads, head_size]` K and `[seq_len, num_kv_heads,
    /// head_size_v]` V (cross-attention: the encoder's K/V alone; the step's own rows are
    /// not in the cross cache; MLA: V is the prefix of each key row).
    pub fn contiguous_kv(&self, seq: usize) -> (Vec<f32>, Vec<f32>) {
        let row = self.config.num_kv_heads * self.config.head_size;
        let v_row = self.config.value_row();
        let start = self.query_start_loc()[seq];
        let q = self.batch.query_lens[seq];
        let mut k = self.tensors.context_key[seq].clone();
        let mut v = self.tensors.context_value[seq].clone();
        if self.config.kind != crate::AttentionKind::EncoderDecoder {
            k.extend_from_slice(&self.tensors.key[start * row..(start + q) * row]);
            v.extend_from_slice(&self.tensors.value[start * v_row..(start + q) * v_row]);
        }
        if let Some(m) = self.config.mla {
            v = crate::mla::values_of_keys(&k, self.config.head_size, m.head_size_v);
        }
        (k, v)
    }

    /// Every K and V value the step's cache holds for live tokens (context and new rows, V
    /// derived from K in an MLA case), in no particular order: what tolerances bound.
    pub fn all_kv(&self) -> (Vec<f32>, Vec<f32>) {
        let t = &self.tensors;
        let k: Vec<f32> = t
            .key
            .iter()
            .chain(t.context_key.iter().flatten())
            .copied()
            .collect();
        let v = match self.config.mla {
            Some(m) => crate::mla::values_of_keys(&k, self.config.head_size, m.head_size_v),
            None => t
                .value
                .iter()
                .chain(t.context_value.iter().flatten())
                .copied()
                .collect(),
        };
        (k, v)
    }

    /// Parse and validate a case from JSON; every problem is a typed error.
    pub fn from_json(text: &str) -> Result<Case, CaseError> {
        let case: Case =
            crate::json::parse(text).map_err(|(line, column, message)| CaseError::Parse {
                line,
                column,
                message,
            })?;
        case.validate()?;
        Ok(case)
    }

    /// Read, parse and validate a case file.
    pub fn load(path: &std::path::Path) -> Result<Case, CaseError> {
        let meta = std::fs::metadata(path).map_err(|e| CaseError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        if meta.is_dir() {
            return Err(CaseError::Io {
                path: path.display().to_string(),
                message: "is a directory, expected a JSON case file".into(),
            });
        }
        if meta.len() > crate::validate::MAX_CASE_FILE_BYTES {
            return Err(CaseError::TooLarge {
                field: "file".into(),
                size: meta.len(),
                limit: crate::validate::MAX_CASE_FILE_BYTES,
            });
        }
        let text = std::fs::read_to_string(path).map_err(|e| CaseError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Case::from_json(&text)
    }

    /// One-line summary of the case's shape.
    pub fn shape_summary(&self) -> String {
        format!(
            "{} seq(s), seq_lens {:?}, query_lens {:?}{}, {}{}{}",
            self.num_seqs(),
            self.batch.seq_lens,
            self.batch.query_lens,
            if self.batch.num_padding_tokens > 0 {
                format!(" + {} padding token(s)", self.batch.num_padding_tokens)
            } else {
                String::new()
            },
            self.config,
            self.batch.masks_summary(),
            self.poison.map_or(String::new(), |p| format!(
                ", poison {p} in unwritten slots and padding rows"
            ))
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::{build_spec_case, spec_by_name, AttentionConfig, DType};

    /// large_decode (32 sequences of 2048 keys, 8 kv heads of 128) in bf16: 268 MB of K/V.
    #[test]
    fn kv_bytes_count_every_key_once_per_kv_head() {
        let spec = spec_by_name("large_decode").expect("upstream spec");
        let case = build_spec_case(&spec, AttentionConfig::new(32, 8, 128, 32, DType::Bf16), 0);
        assert_eq!(case.kv_bytes(), 32 * 2048 * 8 * 128 * 2 * 2);
        let f32_case = build_spec_case(&spec, AttentionConfig::new(32, 8, 128, 32, DType::F32), 0);
        assert_eq!(f32_case.kv_bytes(), 2 * case.kv_bytes());
    }
}
