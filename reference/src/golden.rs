//! Golden fixtures: the oracle's output on every upstream spec at the (32, 8, 128) bf16
//! config, kept in `fixtures/golden/` so a change to the oracle (or to the input generator)
//! shows up as a failing test and a reviewable diff.
//!
//! Small outputs are stored in full; large ones as a digest that still catches a change of
//! one element: the sum, the L2 norm and a deterministic sample of 256 elements.

use crate::{
    build_spec_case, reference_output, specs, AttentionConfig, AttentionKind, BatchSpec, DType,
};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

pub const GOLDEN_SEED: u64 = 0x5eed;
pub const GOLDEN_HEADS: (usize, usize) = (32, 8);
pub const GOLDEN_DTYPE: DType = DType::Bf16;
/// Outputs up to this many elements are stored in full.
pub const FULL_OUTPUT_LIMIT: usize = 65_536;
pub const SAMPLE_COUNT: usize = 256;
/// How close the oracle must stay to its fixtures.
pub const GOLDEN_RTOL: f64 = 1e-12;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldenFixture {
    pub spec: String,
    pub seed: u64,
    pub config: AttentionConfig,
    pub seq_lens: Vec<usize>,
    pub query_lens: Vec<usize>,
    pub output_len: usize,
    pub digest: Digest,
    /// The whole output, for small specs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Vec<f64>>,
    /// vLLM 0.33's per-request masks of the batch, where it has any
    /// ([`crate::golden_masks`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masks: Option<crate::SequenceMasks>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Digest {
    pub sum: f64,
    pub l2: f64,
    /// (index, value) pairs at deterministic, spread-out positions.
    pub samples: Vec<(usize, f64)>,
}

impl Digest {
    pub fn of(values: &[f64]) -> Digest {
        let sum = values.iter().sum();
        let l2 = values.iter().map(|x| x * x).sum::<f64>().sqrt();
        Digest {
            sum,
            l2,
            samples: sample_indices(values.len())
                .into_iter()
                .map(|i| (i, values[i]))
                .collect(),
        }
    }
}

/// `SAMPLE_COUNT` distinct indices spread over `0..n` by a fixed multiplicative hash.
fn sample_indices(n: usize) -> Vec<usize> {
    if n <= SAMPLE_COUNT {
        return (0..n).collect();
    }
    let mut idx: Vec<usize> = (0..SAMPLE_COUNT as u64)
        .map(|i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) % n as u64) as usize)
        .collect();
    idx.sort_unstable();
    idx.dedup();
    idx
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= GOLDEN_RTOL * a.abs().max(b.abs()) + 1e-300
}

/// The golden config for a spec.
pub fn golden_config(spec: &BatchSpec) -> AttentionConfig {
    let mut c = AttentionConfig::new(
        GOLDEN_HEADS.0,
        GOLDEN_HEADS.1,
        specs::UPSTREAM_HEAD_SIZE,
        specs::UPSTREAM_BLOCK_SIZE,
        GOLDEN_DTYPE,
    );
    c.kind = spec.kind;
    c
}

/// Compute the fixture for a spec from scratch.
pub fn compute_fixture(spec: &BatchSpec) -> GoldenFixture {
    let config = golden_config(spec);
    let case = build_spec_case(spec, config.clone(), GOLDEN_SEED);
    let out = reference_output(&case);
    GoldenFixture {
        spec: spec.name.to_string(),
        seed: GOLDEN_SEED,
        config,
        seq_lens: spec.seq_lens.clone(),
        query_lens: spec.query_lens.clone(),
        output_len: out.len(),
        digest: Digest::of(&out),
        // Cross-attention specs (attn-diff's own, no upstream output to compare with) keep a
        // digest only, so the fixtures stay under 5 MB.
        output: (out.len() <= FULL_OUTPUT_LIMIT && spec.kind != AttentionKind::EncoderDecoder)
            .then_some(out),
        masks: None,
    }
}

impl GoldenFixture {
    /// Compare a freshly computed fixture against this stored one; describes the first
    /// difference.
    pub fn check(&self, fresh: &GoldenFixture) -> Result<(), String> {
        if self.spec != fresh.spec
            || self.seed != fresh.seed
            || self.config != fresh.config
            || self.masks != fresh.masks
        {
            return Err(format!(
                "fixture {} describes a different case (spec, seed, config or masks changed)",
                self.spec
            ));
        }
        if self.seq_lens != fresh.seq_lens
            || self.query_lens != fresh.query_lens
            || self.output_len != fresh.output_len
        {
            return Err(format!("fixture {}: batch shape changed", self.spec));
        }
        if let (Some(a), Some(b)) = (&self.output, &fresh.output) {
            if let Some(i) = (0..a.len()).find(|&i| !close(a[i], b[i])) {
                return Err(format!(
                    "fixture {}: output[{i}] is {} but the oracle now gives {}",
                    self.spec, a[i], b[i]
                ));
            }
        } else if self.output.is_some() != fresh.output.is_some() {
            return Err(format!(
                "fixture {}: stored output presence changed",
                self.spec
            ));
        }
        let (a, b) = (&self.digest, &fresh.digest);
        if !close(a.sum, b.sum) {
            return Err(format!(
                "fixture {}: output sum {} but the oracle now gives {}",
                self.spec, a.sum, b.sum
            ));
        }
        if !close(a.l2, b.l2) {
            return Err(format!(
                "fixture {}: output L2 norm {} but the oracle now gives {}",
                self.spec, a.l2, b.l2
            ));
        }
        if a.samples.len() != b.samples.len() {
            return Err(format!("fixture {}: sample count changed", self.spec));
        }
        for (&(i, x), &(j, y)) in a.samples.iter().zip(&b.samples) {
            if i != j || !close(x, y) {
                return Err(format!("fixture {}: sample output[{i}] = {x} but the oracle now gives output[{j}] = {y}", self.spec));
            }
        }
        Ok(())
    }

    /// Load a fixture file with a message naming the file on any problem.
    pub fn load(path: &Path) -> Result<GoldenFixture, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read fixture {}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| format!("malformed fixture {}: {e}", path.display()))
    }
}

pub fn fixture_path(dir: &Path, spec: &str) -> std::path::PathBuf {
    dir.join(format!("{spec}.json"))
}

/// Whether this run may rewrite goldens: `UPDATE_GOLDEN=1` and not under CI.
pub fn update_requested() -> bool {
    std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") && std::env::var_os("CI").is_none()
}

/// Write `bytes` to `path` atomically: a temporary file in the same directory, synced, then
/// renamed over the target, so a reader never sees half a file and an interrupted write
/// leaves the old one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Compute and write every fixture into `dir`.
pub fn write_all_fixtures(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut written = Vec::new();
    let fixtures = specs::all_specs()
        .iter()
        .map(compute_fixture)
        .collect::<Vec<_>>()
        .into_iter()
        .chain(MLA_GOLDENS.iter().map(MlaGolden::compute))
        .chain(
            crate::golden_masks::MASK_GOLDENS
                .iter()
                .map(crate::golden_masks::MaskGolden::compute),
        );
    for fx in fixtures {
        let json = serde_json::to_string_pretty(&fx).expect("fixture serializes");
        write_atomic(&fixture_path(dir, &fx.spec), json.as_bytes())?;
        written.push(fx.spec);
    }
    Ok(written)
}

/// A golden MLA batch at DeepSeek-V3's shapes: 576-wide latent entries, V their first 512,
/// scale 192^-0.5, 128 query heads split by a tensor-parallel size.
#[derive(Clone, Copy, Debug)]
pub struct MlaGolden {
    pub name: &'static str,
    /// Query heads on one rank: 128 / tensor-parallel size.
    pub num_heads: usize,
    pub block_size: usize,
    pub seq_lens: &'static [usize],
    pub query_lens: &'static [usize],
    /// An FP8 (E4M3) latent cache with this one scale for K and V.
    pub fp8_scale: Option<f32>,
}

/// Decode, speculative and chunked queries; contexts just around 576 keys (where a V stride
/// of 512 instead of 576 drifts a whole entry) and past it; block sizes 1, 16 and 64; every
/// tensor-parallel split of 128 heads down to 8.
pub const MLA_GOLDENS: [MlaGolden; 8] = [
    MlaGolden {
        name: "mla_v3_tp1_block16_decode",
        num_heads: 128,
        block_size: 16,
        seq_lens: &[1, 577, 1100],
        query_lens: &[1, 1, 1],
        fp8_scale: None,
    },
    MlaGolden {
        name: "mla_v3_tp1_block1_decode",
        num_heads: 128,
        block_size: 1,
        seq_lens: &[5, 600],
        query_lens: &[1, 1],
        fp8_scale: None,
    },
    MlaGolden {
        name: "mla_v3_tp1_block64_speculative",
        num_heads: 128,
        block_size: 64,
        seq_lens: &[700, 130],
        query_lens: &[4, 2],
        fp8_scale: None,
    },
    MlaGolden {
        name: "mla_v3_tp2_block16_chunked",
        num_heads: 64,
        block_size: 16,
        seq_lens: &[900, 33],
        query_lens: &[24, 33],
        fp8_scale: None,
    },
    MlaGolden {
        name: "mla_v3_tp4_block64_decode",
        num_heads: 32,
        block_size: 64,
        seq_lens: &[2000, 63, 64, 65],
        query_lens: &[1, 1, 1, 1],
        fp8_scale: None,
    },
    MlaGolden {
        name: "mla_v3_tp8_block16_decode",
        num_heads: 16,
        block_size: 16,
        seq_lens: &[575, 576, 577],
        query_lens: &[1, 1, 1],
        fp8_scale: None,
    },
    MlaGolden {
        name: "mla_v3_tp16_block1_speculative",
        num_heads: 8,
        block_size: 1,
        seq_lens: &[40, 600],
        query_lens: &[3, 8],
        fp8_scale: None,
    },
    MlaGolden {
        name: "mla_v3_tp8_block16_fp8",
        num_heads: 16,
        block_size: 16,
        seq_lens: &[300, 700],
        query_lens: &[1, 2],
        fp8_scale: Some(0.0625),
    },
];

impl MlaGolden {
    /// The config: DeepSeek-V3's latent at bf16 ([`GOLDEN_DTYPE`]).
    pub fn config(&self) -> AttentionConfig {
        let mut c = AttentionConfig::deepseek_v3_mla(self.num_heads, self.block_size, GOLDEN_DTYPE);
        c.kv_cache = self
            .fp8_scale
            .map(|s| crate::Fp8KvCache::new(crate::Fp8Format::E4m3, s, s));
        c
    }

    /// The case the fixture is of.
    pub fn case(&self) -> crate::Case {
        crate::build_case(
            self.seq_lens,
            self.query_lens,
            self.config(),
            GOLDEN_SEED,
            &crate::BuildOptions::default(),
        )
    }

    /// The fixture, computed from scratch (always a digest: outputs are large).
    pub fn compute(&self) -> GoldenFixture {
        GoldenFixture::digest_of(self.name, &self.case())
    }
}

impl GoldenFixture {
    /// The fixture named `name` of `case` (built at [`GOLDEN_SEED`]) as a digest of the
    /// oracle's output, with the case's masks.
    pub fn digest_of(name: &str, case: &crate::Case) -> GoldenFixture {
        let out = reference_output(case);
        let b = &case.batch;
        let masks = b.masks();
        GoldenFixture {
            spec: name.to_string(),
            seed: GOLDEN_SEED,
            config: case.config.clone(),
            seq_lens: b.seq_lens.clone(),
            query_lens: b.query_lens.clone(),
            output_len: out.len(),
            digest: Digest::of(&out),
            output: None,
            masks: (masks != crate::SequenceMasks::default()).then_some(masks),
        }
    }
}
