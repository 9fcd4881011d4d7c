//! A small scalar MLA decode kernel with one bug switched on: one latent entry per slot
//! (vLLM's `kv_c_and_k_pe_cache` layout, `[slots, head_size]`), every query head attending
//! over it, keys the whole entry and values its first `head_size_v` dims, walked in tiles of
//! `head_size` keys as a vec decode kernel walks them. Each bug is a one-line change found
//! by its [`MlaBug`] variant. It runs MLA cases only (`kv_layouts: [mla]`), so its whole
//! budget goes to them.

use crate::{
    cache_as, cache_as_mut, Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs,
    Unsupported,
};
use attn_reference::mla::KvLayout;
use attn_reference::{AttentionConfig, Feature, Fp8KvCache, Space};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaBug {
    /// The correct kernel (the control).
    None,
    /// V kept as rows of its own (`head_size_v` wide) but read with K's row stride.
    VRowsByDk,
    /// Keys walked in tiles of `head_size` rows, the V pointer stepped `head_size_v` rows
    /// per tile: past the first tile values lag behind their keys (ikawrakow/ik_llama.cpp#2031).
    VTileByDv,
    /// V read from the entry's last `head_size_v` dims: past the latent into the rotary part.
    VIntoRope,
    /// The default `head_size^-0.5` (576^-0.5) instead of the model's scale.
    DefaultScale,
    /// Fewer than 16 heads per rank padded to 16 by repeating each head, the output taken
    /// back as the first `num_heads` padded rows rather than every `16 / num_heads`-th.
    HeadPaddingUnpadded,
}

/// Heads a padded decode kernel runs at least (AITER's MLA decode needs 16).
const PADDED_HEADS: usize = 16;

pub struct MlaMutant {
    name: String,
    bug: MlaBug,
}

impl MlaMutant {
    pub fn new(name: &str, bug: MlaBug) -> Self {
        MlaMutant {
            name: name.to_string(),
            bug,
        }
    }
}

/// The latent entry per slot as the kernel reads it back (in an FP8 cache, `fp8(x / s) * s`),
/// and V apart as rows of `head_size_v` (what a kernel that splits the latent at write time
/// keeps; read only by the bug that strides it wrongly).
struct LatentCache {
    latent: Vec<f32>,
    v_rows: Vec<f32>,
}

fn read_back(fp8: Option<&Fp8KvCache>, x: f32) -> f32 {
    match fp8 {
        Some(f) => (f.dtype.decode(f.dtype.quantize(x, f.k_scale)) * f.k_scale as f64) as f32,
        None => x,
    }
}

impl Backend for MlaMutant {
    fn name(&self) -> &str {
        &self.name
    }

    fn role(&self) -> attn_results::BackendRole {
        attn_results::BackendRole::Mutant
    }

    fn supports(&self, _: &AttentionConfig) -> Result<(), Unsupported> {
        Ok(())
    }

    fn optional_features(&self) -> Vec<Feature> {
        vec![Feature::Mla, Feature::Fp8KvCache]
    }

    fn space(&self) -> Space {
        Space {
            kv_layouts: Some(vec![KvLayout::Mla]),
            ..Space::default()
        }
    }

    fn cache_layout(&self) -> CacheLayout {
        CacheLayout {
            shape: "[num_blocks * block_size, head_size] latent entries",
            description: "one latent entry per slot, V its prefix (vLLM's MLA cache)",
        }
    }

    fn new_cache(&self, c: &AttentionConfig, num_blocks: usize) -> Result<KvCache, BackendError> {
        let slots = num_blocks * c.block_size;
        Ok(Box::new(LatentCache {
            latent: vec![0.0; slots * c.head_size],
            v_rows: vec![0.0; slots * c.head_size_v()],
        }))
    }

    fn write_kv(
        &self,
        c: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        let cache = cache_as_mut::<LatentCache>(&self.name, cache)?;
        let (d, dv) = (c.head_size, c.head_size_v());
        let slots = cache.latent.len() / d.max(1);
        for (t, &slot) in kv.slot_mapping.iter().enumerate() {
            let Ok(s) = usize::try_from(slot) else {
                continue;
            };
            if s >= slots {
                return Err(BackendError::InvalidInput {
                    backend: self.name.clone(),
                    message: format!("slot {slot} past the cache ({slots} slots)"),
                });
            }
            for i in 0..d {
                let x = read_back(c.kv_cache.as_ref(), kv.key[t * d + i]);
                cache.latent[s * d + i] = x;
                if i < dv {
                    cache.v_rows[s * dv + i] = x;
                }
            }
        }
        Ok(())
    }

    fn forward(
        &self,
        c: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        let cache = cache_as::<LatentCache>(&self.name, cache)?;
        let (hq, d, dv, bs) = (c.num_heads, c.head_size, c.head_size_v(), c.block_size);
        let scale = match self.bug {
            MlaBug::DefaultScale => 1.0 / (d as f32).sqrt(),
            _ => c.effective_scale() as f32,
        };
        let mut out = vec![0.0f32; step.num_tokens * hq * dv];
        for s in 0..step.seq_lens.len() {
            let (q0, q1) = (step.query_start_loc[s], step.query_start_loc[s + 1]);
            let seq_len = step.seq_lens[s];
            let slot = |k: usize| step.block_table[s][k / bs] as usize * bs + k % bs;
            for t in q0..q1 {
                // Causal: the query at position p sees keys 0..=p.
                let p = seq_len - (q1 - q0) + (t - q0);
                for h in 0..hq {
                    let q = &step.query[(t * hq + h) * d..][..d];
                    let logits: Vec<f32> = (0..=p)
                        .map(|k| {
                            let key = &cache.latent[slot(k) * d..][..d];
                            scale * q.iter().zip(key).map(|(a, b)| a * b).sum::<f32>()
                        })
                        .collect();
                    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut denom = 0.0f32;
                    let mut acc = vec![0.0f32; dv];
                    for (k, &l) in logits.iter().enumerate() {
                        let w = (l - m).exp();
                        denom += w;
                        for (a, v) in acc.iter_mut().zip(self.value(cache, c, &slot, k)) {
                            *a += w * v;
                        }
                    }
                    let row = &mut out[(t * hq + h) * dv..][..dv];
                    for (o, a) in row.iter_mut().zip(&acc) {
                        *o = c.dtype.round(a / denom);
                    }
                }
            }
        }
        if self.bug == MlaBug::HeadPaddingUnpadded {
            unpad_wrongly(&mut out, hq, dv);
        }
        Ok(out)
    }
}

impl MlaMutant {
    /// V of key `k` as this kernel reads it.
    fn value<'a>(
        &self,
        cache: &'a LatentCache,
        c: &AttentionConfig,
        slot: &dyn Fn(usize) -> usize,
        k: usize,
    ) -> &'a [f32] {
        let (d, dv) = (c.head_size, c.head_size_v());
        // Element offsets that would leave the buffer stay inside it (in C they read
        // whatever lies there): the divergence is a wrong value rather than a crash.
        let inside = |at: usize, buf: &[f32]| at % (buf.len() - dv + 1);
        match self.bug {
            MlaBug::VRowsByDk => {
                let at = inside(slot(k) * d, &cache.v_rows);
                &cache.v_rows[at..][..dv]
            }
            MlaBug::VTileByDv => {
                // Tile `k / d` of keys; its V pointer has advanced `dv` rows per tile.
                let lagged = k - (k / d) * (d - dv);
                &cache.latent[slot(lagged) * d..][..dv]
            }
            MlaBug::VIntoRope => &cache.latent[slot(k) * d + (d - dv)..][..dv],
            _ => &cache.latent[slot(k) * d..][..dv],
        }
    }
}

/// Heads padded to [`PADDED_HEADS`] by repeating each `r = 16 / num_heads` times (for head
/// counts dividing 16), then the first `num_heads` padded rows taken as the output: head `h`
/// gets padded row `h`, which is head `h / r`.
fn unpad_wrongly(out: &mut [f32], hq: usize, dv: usize) {
    if hq >= PADDED_HEADS || !PADDED_HEADS.is_multiple_of(hq) {
        return;
    }
    let r = PADDED_HEADS / hq;
    for token in out.chunks_mut(hq * dv) {
        let original = token.to_vec();
        for h in 0..hq {
            let from = h / r;
            token[h * dv..(h + 1) * dv].copy_from_slice(&original[from * dv..(from + 1) * dv]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_case;
    use attn_reference::{build_case, reference_output, BuildOptions, DType, Mla};

    fn mla_case(
        hq: usize,
        dk: usize,
        dv: usize,
        seq_lens: &[usize],
        q: &[usize],
    ) -> attn_reference::Case {
        let mut c = AttentionConfig::new(hq, 1, dk, 4, DType::F32);
        c.mla = Some(Mla { head_size_v: dv });
        c.scale = Some(0.3);
        let opts = BuildOptions {
            padding_tokens: 1,
            ..Default::default()
        };
        build_case(seq_lens, q, c, 3, &opts)
    }

    fn max_err(bug: MlaBug, case: &attn_reference::Case) -> f64 {
        let out = run_case(&MlaMutant::new("m", bug), case).unwrap().output;
        let exp = reference_output(case);
        out.iter()
            .zip(&exp)
            .map(|(a, e)| (*a as f64 - e).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn the_control_kernel_is_correct() {
        for (hq, dk, dv) in [(4, 9, 6), (16, 576, 512), (3, 5, 5)] {
            let case = mla_case(hq, dk, dv, &[700, 3, 20], &[1, 2, 5]);
            assert!(max_err(MlaBug::None, &case) < 1e-4);
        }
    }

    #[test]
    fn each_bug_shows_where_it_should_and_only_there() {
        let long = mla_case(4, 9, 6, &[40], &[1]);
        let short = mla_case(4, 9, 6, &[9], &[1]);
        // The V tile stride only lags past the first tile of `head_size` keys.
        assert!(max_err(MlaBug::VTileByDv, &long) > 1e-2);
        assert!(max_err(MlaBug::VTileByDv, &short) < 1e-4);
        assert!(max_err(MlaBug::VRowsByDk, &short) > 1e-2);
        assert!(max_err(MlaBug::VIntoRope, &short) > 1e-2);
        assert!(max_err(MlaBug::DefaultScale, &short) > 1e-2);
        // V as wide as K: reading past the latent is reading the latent.
        assert!(max_err(MlaBug::VIntoRope, &mla_case(2, 6, 6, &[9], &[1])) < 1e-4);
        // Head padding: wrong for 2, 4, 8 heads; 16 and counts that do not divide 16 pass.
        assert!(max_err(MlaBug::HeadPaddingUnpadded, &mla_case(4, 9, 6, &[9], &[1])) > 1e-2);
        assert!(max_err(MlaBug::HeadPaddingUnpadded, &mla_case(16, 9, 6, &[9], &[1])) < 1e-4);
        assert!(max_err(MlaBug::HeadPaddingUnpadded, &mla_case(3, 9, 6, &[9], &[1])) < 1e-4);
    }
}
