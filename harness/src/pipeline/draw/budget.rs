//! What a draw may cost and how it is made to fit: the tiers' cost ceilings, fitting a
//! recipe under one ([`fit_cost`], [`fit_mla_cost`]) and inside a backend's space ([`fit_space`]).

use crate::pipeline::recipe::{cost, mla_cost, CaseRecipe, LatentRecipe};
use attn_reference::{mla, AttentionConfig, AttentionKind, Feature, Space};

/// Sequences of an MLA decode batch: past 64, as latent attention serves decode batches of
/// hundreds (the "large batch" class, which 1 to 4 sequences never reach).
pub const MLA_BATCH_SEQS: std::ops::RangeInclusive<usize> = 65..=160;

/// The oracle's work ceiling of an MLA case (multiply-adds over K and V): 128 heads over
/// about 700 keys of DeepSeek-V3's 576/512.
pub const MLA_COST: usize = 100_000_000;

/// The small tier's cost ceiling: the default run stays within its time budget.
pub const SMALL_COST: usize = 20_000_000;
/// The long tier's: long contexts with few heads and small head sizes.
pub const LONG_COST: usize = 200_000_000;

/// Make `r` fit `budget` ([`cost`]) deterministically: fewer heads first, then a smaller head
/// size, then shorter queries, then shorter contexts, so the lengths (what the tier is
/// about) go last. Head sizes stay among those `space` allows.
pub fn fit_cost(mut r: CaseRecipe, budget: usize, space: &Space) -> CaseRecipe {
    let allowed = space.head_size_values();
    let head_at_most = |target: usize| head_at_most(allowed.as_deref(), target);
    while cost(&r) > budget {
        if r.group > 1 {
            r.group = 1;
        } else if r.num_kv_heads > 1 {
            r.num_kv_heads = 1;
        } else if r.head_size > head_at_most(64) {
            r.head_size = head_at_most(64);
        } else if let Some(q) = r.seqs.iter_mut().filter(|s| s.1 > 8).max_by_key(|s| s.1) {
            q.1 = (q.1 / 2).max(8);
        } else if r.head_size > head_at_most(8) {
            r.head_size = head_at_most(8);
        } else if let Some(s) = r.seqs.iter_mut().filter(|s| s.0 > 0).max_by_key(|s| s.0) {
            s.0 /= 2;
        } else {
            break;
        }
    }
    r
}

/// The largest of the `allowed` head sizes at most `target` (the smallest allowed one if none
/// is); `target` itself when every size is allowed.
fn head_at_most(allowed: Option<&[usize]>, target: usize) -> usize {
    match allowed {
        None => target,
        Some(a) => a
            .iter()
            .rev()
            .find(|&&d| d <= target)
            .or(a.first())
            .copied()
            .unwrap_or(target),
    }
}

/// `r` moved inside `space` ([`Space::fit_config`], [`Space::fit_lengths`]), then within
/// `budget`: what every strategy and every shrink candidate goes through, so a case drawn or
/// shrunk for a backend is one it declares it runs. On the full space only the cache ceiling
/// ([`fit_cache`]) applies, so a space that leaves out a feature draws what the full one
/// draws wherever that feature was not drawn.
pub fn fit_space(mut r: CaseRecipe, space: &Space, budget: usize) -> CaseRecipe {
    if space.is_full() {
        return fit_cache(r, space);
    }
    let mut c = r.config();
    space.fit_config(&mut c);
    crate::pipeline::draw::budget::fit_latent(&mut r, &c);
    r.dtype = c.dtype;
    r.head_size = c.head_size;
    r.block_size = c.block_size;
    r.group = c.group_size();
    r.take_features_of(&c);
    // The fitted kind may give a feature no meaning (a window in cross-attention).
    let mut r = r.without_kind_mismatches();
    space.fit_lengths(r.kind, &mut r.seqs, &mut r.padding_tokens);
    // Padded requests count among the step's requests.
    if !space.allows_feature(Feature::PaddedRequests) {
        r.padded_requests = 0;
    }
    if !space.allows_feature(Feature::NonCausal) {
        r.non_causal = None;
    }
    if !space.allows_feature(Feature::PrefixLm) {
        r.prefix_lm = None;
    }
    if !space.allows_feature(Feature::Rswa) {
        r.rswa = None;
    }
    if let Some(m) = space.max_seqs {
        r.padded_requests = r.padded_requests.min(m.saturating_sub(r.seqs.len()));
    }
    // A shared prefix lengthens the contexts of its group: not past the longest allowed.
    if let Some(m) = space.max_seq_len {
        if r.lens().0.iter().any(|&l| l > m) {
            r.share = None;
        }
    }
    let r = if r.mla.is_some() {
        // MLA recipes have their own cost model (K's and V's widths; heads kept longest).
        fit_mla_cost(r, MLA_COST)
    } else {
        fit_cost(r, budget, space)
    };
    fit_cache(r, space)
}

/// The most K/V elements a fitted case's sequences may hold in whole blocks (512 MiB as f32,
/// K and V together). A draw's cost counts attention's work, not its cache: a batch of
/// thousands of one-block decodes is cheap work, but a space of 256-token blocks and head
/// size 512 turns each into 256 slots of 1,024 elements, tens of GiB for the backend (and
/// twice that for an invariance pair's other placement).
pub const CACHE_ELEMENTS: usize = 1 << 27;

/// K/V elements of the blocks `r`'s sequences fill: whole blocks, every kv head, K's and V's
/// widths, a shared prefix's blocks once. (A huge cache's unused blocks are not counted:
/// backends allocate those lazily or decline them.)
pub fn cache_elements(r: &CaseRecipe) -> usize {
    let bs = r.block_size.max(1);
    let blocks: usize = r.lens().0.iter().map(|l| l.div_ceil(bs)).sum();
    let shared = r.sharing().map_or(0, |g| (g.seqs.len() - 1) * g.blocks);
    let (kv_heads, dv) = match r.mla {
        Some(m) => (1, m.head_size_v(r.head_size)),
        None => (r.num_kv_heads, r.head_size),
    };
    blocks.saturating_sub(shared) * bs * kv_heads * (r.head_size + dv)
}

/// `r` with its sequences' blocks under [`CACHE_ELEMENTS`], deterministically: the head size
/// down to the largest allowed at most 64 and the kv heads halved first (what a space's large
/// sizes blew up; a GQA case keeps several kv heads as long as it can), then half the
/// sequences at a time (the batch stays a batch as long as it can), contexts halved last.
pub fn fit_cache(mut r: CaseRecipe, space: &Space) -> CaseRecipe {
    let smaller_head = head_at_most(space.head_size_values().as_deref(), 64);
    while cache_elements(&r) > CACHE_ELEMENTS {
        if r.mla.is_none() && r.head_size > smaller_head {
            r.head_size = smaller_head;
        } else if r.mla.is_none() && r.num_kv_heads > 1 {
            r.num_kv_heads /= 2;
        } else if r.seqs.len() > 1 {
            r.seqs
                .truncate(r.seqs.len().div_ceil(2).min(r.seqs.len() - 1));
        } else if let Some(s) = r.seqs.iter_mut().find(|s| s.0 > 0) {
            s.0 /= 2;
        } else {
            break;
        }
    }
    r
}

/// `r` under `budget`, keeping what MLA cases are for as long as it can: chunks shortened
/// first, then later sequences dropped, then the heads halved, contexts halved last (so a
/// 128-head decode past 576 keys survives). A decode batch keeps its sequences: its heads
/// are halved first, down to one.
pub fn fit_mla_cost(mut r: CaseRecipe, budget: usize) -> CaseRecipe {
    let batch = r.seqs.len() >= *MLA_BATCH_SEQS.start();
    while mla_cost(&r) > budget {
        if let Some(q) = r.seqs.iter_mut().filter(|s| s.1 > 8).max_by_key(|s| s.1) {
            q.1 = (q.1 / 2).max(8);
        } else if batch && r.group > 1 {
            r.group /= 2;
        } else if r.seqs.len() > 1 {
            r.seqs.pop();
        } else if r.group > 16 {
            r.group /= 2;
        } else if let Some(s) = r.seqs.iter_mut().find(|s| s.0 > 0) {
            s.0 /= 2;
        } else {
            break;
        }
    }
    r
}

/// After `space.fit_config` turned `fitted` (the config of `r`) into or out of MLA, carry
/// that back into the recipe: its latent, its single kv head, and (MLA off) the model's
/// scale as an ordinary custom scale.
pub fn fit_latent(r: &mut CaseRecipe, fitted: &AttentionConfig) {
    match (r.mla, fitted.mla) {
        (Some(m), None) => {
            r.mla = None;
            r.scale = Some(m.scale);
        }
        (_, Some(m)) => {
            r.mla = Some(LatentRecipe {
                rope: fitted.head_size - m.head_size_v,
                scale: fitted
                    .scale
                    .unwrap_or(mla::model_scale(mla::DEEPSEEK_V3_QK_HEAD_DIM)),
            });
            r.num_kv_heads = fitted.num_kv_heads;
            r.head_size = fitted.head_size;
            r.kind = fitted.kind;
            r.window = None;
            r.soft_cap = None;
            r.alibi = false;
            r.sinks = false;
            r.kv_cache = fitted.kv_cache.clone();
        }
        (None, None) => {}
    }
}

/// The big steps' cost ceiling ([`windowed_cost`]): their chunks are long, their windows
/// keep each query's keys few, so the default run stays within its time budget.
pub const BIG_STEP_COST: usize = 20_000_000;

/// The big batches' cost ceiling ([`cost`]): a decode batch draws about as many K/V values as
/// it costs, and thousands of sequences draw them slowly.
pub const BIG_BATCH_COST: usize = 20_000_000;

/// [`cost`] counting only the keys a window lets a query see (a decoder query at most `w`, a
/// non-causal or encoder-only one at most `2w`, an R-SWA one its window and its prefix), plus
/// each PrefixLM range's square (its queries see all of it): still an upper bound of the
/// oracle's work.
pub fn windowed_cost(r: &CaseRecipe) -> usize {
    let (seq_lens, query_lens) = r.lens();
    let batch = r.batch_shape();
    let pairs: usize = seq_lens
        .iter()
        .zip(&query_lens)
        .enumerate()
        .map(|(s, (&l, &q))| {
            let mask = batch.request_mask(s);
            let causal = mask.causal;
            let seen = match (r.kind, r.window, mask.rswa) {
                (AttentionKind::Decoder, _, Some((w, prefix))) if causal => l.min(w + prefix),
                (AttentionKind::Decoder, Some(w), None) if causal => l.min(w),
                (AttentionKind::Decoder | AttentionKind::EncoderOnly, Some(w), None) => {
                    l.min(2 * w)
                }
                _ => l,
            };
            let ranges: usize = mask
                .ranges
                .iter()
                .map(|&(a, b)| (b - a + 1) * (b - a + 1).min(q))
                .sum();
            seen * q + ranges
        })
        .sum();
    pairs * r.num_heads() * r.head_size
}

/// `r` cut to `budget` keeping its longest query past 8,192 tokens: the window first, then
/// heads and head size, then the contexts, then the query (never to 8,192 or below).
pub fn fit_big_step(mut r: CaseRecipe, budget: usize) -> CaseRecipe {
    while windowed_cost(&r) > budget {
        if r.window.is_some_and(|w| w > 64) {
            r.window = r.window.map(|w| w / 2);
        } else if let Some(rswa) = r.rswa.as_mut().filter(|x| x.window > 64) {
            rswa.window /= 2;
        } else if r.num_kv_heads * r.group > 1 {
            (r.num_kv_heads, r.group) = (1, 1);
        } else if r.head_size > 1 {
            r.head_size /= 2;
        } else if let Some(s) = r.seqs.iter_mut().filter(|s| s.0 > 0).max_by_key(|s| s.0) {
            s.0 /= 2;
        } else if let Some(q) = r
            .seqs
            .iter_mut()
            .filter(|s| s.1 > 8_193)
            .max_by_key(|s| s.1)
        {
            q.1 = (q.1 * 3 / 4).max(8_193);
        } else if r.window.is_none() && r.rswa.is_none() && r.kind != AttentionKind::EncoderDecoder
        {
            r.window = Some(64);
        } else {
            break;
        }
    }
    r
}
