//! Golden batches of vLLM 0.33's per-request masks at real model layouts: Gemma 3's image
//! spans (256 tokens each) under its local window and on a global layer, split by chunked
//! prefill (one reaching past the chunk, as vLLM passes it); Gemma 4's window clamp; a DFlash-style non-causal draft block; R-SWA; chunk
//! look-back. Their fixtures pin the oracle's masks the way `golden` pins vLLM's specs.

use crate::golden::{GoldenFixture, GOLDEN_DTYPE, GOLDEN_SEED};
use crate::{AttentionConfig, Case, PrefixLm, Rswa, SequenceMasks};

/// One golden batch with masks.
#[derive(Clone, Copy, Debug)]
pub struct MaskGolden {
    pub name: &'static str,
    /// (query heads, kv heads, head size) of the model's layer.
    pub layout: (usize, usize, usize),
    pub block_size: usize,
    pub window: Option<usize>,
    /// Local chunks and how many chunks before its own a query sees.
    pub chunk: Option<(usize, usize)>,
    pub seq_lens: &'static [usize],
    pub query_lens: &'static [usize],
    /// Per sequence, causal or not (None: all causal).
    pub causal: Option<&'static [bool]>,
    /// Per sequence, its PrefixLM ranges (ends inclusive); empty: none.
    pub ranges: &'static [&'static [(usize, usize)]],
    /// Gemma 4's clamp of the ranges to the window.
    pub clamp: bool,
    /// R-SWA: the window and each sequence's prefix length.
    pub rswa: Option<(usize, &'static [usize])>,
}

const GEMMA3_4B: (usize, usize, usize) = (8, 4, 256);
const GEMMA3_27B: (usize, usize, usize) = (32, 16, 128);
const LLAMA3_8B: (usize, usize, usize) = (32, 8, 128);
const LLAMA4_SCOUT: (usize, usize, usize) = (40, 8, 128);

const PLAIN: MaskGolden = MaskGolden {
    name: "",
    layout: LLAMA3_8B,
    block_size: 16,
    window: None,
    chunk: None,
    seq_lens: &[],
    query_lens: &[],
    causal: None,
    ranges: &[],
    clamp: false,
    rswa: None,
};

pub const MASK_GOLDENS: [MaskGolden; 7] = [
    // Gemma 3 4B's local layer (window 1024): a prompt with three images, the second split
    // between the cached context and this chunk of 300, the third begun in this chunk and
    // passed whole though chunked prefill stops at 1,300 keys (as vLLM passes it), beside a
    // text prompt.
    MaskGolden {
        name: "masks_gemma3_4b_local_images_chunked",
        layout: GEMMA3_4B,
        window: Some(1024),
        seq_lens: &[1300, 90],
        query_lens: &[300, 90],
        ranges: &[&[(40, 295), (900, 1155), (1200, 1455)], &[]],
        ..PLAIN
    },
    // Gemma 3 27B's global layer: a whole prompt of one image, and a single-token range.
    MaskGolden {
        name: "masks_gemma3_27b_global_image_prefill",
        layout: GEMMA3_27B,
        seq_lens: &[400, 40],
        query_lens: &[400, 40],
        ranges: &[&[(100, 355)], &[(7, 7)]],
        ..PLAIN
    },
    // Gemma 4's clamp: image keys only within a window of 128, shorter than the span.
    MaskGolden {
        name: "masks_gemma4_clamped_window",
        layout: GEMMA3_4B,
        window: Some(128),
        seq_lens: &[600],
        query_lens: &[600],
        ranges: &[&[(50, 305)]],
        clamp: true,
        ..PLAIN
    },
    // DFlash-style drafting: blocks of 16 drafted tokens that see each other both ways,
    // beside an ordinary causal decode.
    MaskGolden {
        name: "masks_dflash_non_causal_draft",
        layout: LLAMA3_8B,
        seq_lens: &[1040, 527, 300],
        query_lens: &[16, 16, 1],
        causal: Some(&[false, false, true]),
        ..PLAIN
    },
    // A non-causal request under a window of 64: two-sided, |p - k| < 64.
    MaskGolden {
        name: "masks_non_causal_windowed",
        layout: GEMMA3_4B,
        window: Some(64),
        seq_lens: &[300, 200],
        query_lens: &[100, 200],
        causal: Some(&[false, true]),
        ..PLAIN
    },
    // R-SWA: a 200-token system prompt stays visible, later keys within 256.
    MaskGolden {
        name: "masks_rswa_prefix_and_window",
        layout: LLAMA3_8B,
        seq_lens: &[1500, 700],
        query_lens: &[8, 64],
        rswa: Some((256, &[200, 0])),
        ..PLAIN
    },
    // Llama 4's local chunks (here 512) with a look-back of one chunk.
    MaskGolden {
        name: "masks_llama4_chunks_lookback_1",
        layout: LLAMA4_SCOUT,
        chunk: Some((512, 1)),
        seq_lens: &[1500, 700],
        query_lens: &[4, 64],
        ..PLAIN
    },
];

impl MaskGolden {
    pub fn config(&self) -> AttentionConfig {
        let (q, kv, d) = self.layout;
        let mut c = AttentionConfig::new(q, kv, d, self.block_size, GOLDEN_DTYPE);
        c.sliding_window = self.window;
        c.attention_chunk_size = self.chunk.map(|(c, _)| c);
        c.chunk_lookback = self.chunk.map(|(_, k)| k).filter(|&k| k > 0);
        c
    }

    /// The batch's masks.
    pub fn masks(&self) -> SequenceMasks {
        SequenceMasks {
            causal: self.causal.map(<[bool]>::to_vec),
            prefix_lm: (!self.ranges.is_empty()).then(|| PrefixLm {
                ranges: self.ranges.iter().map(|r| r.to_vec()).collect(),
                clamp_to_window: self.clamp,
            }),
            rswa: self.rswa.map(|(window, prefix)| Rswa {
                window,
                prefix_lens: prefix.to_vec(),
            }),
        }
    }

    /// The case the fixture is of (valid: the golden test checks it).
    pub fn case(&self) -> Case {
        let mut case = crate::build_case(
            self.seq_lens,
            self.query_lens,
            self.config(),
            GOLDEN_SEED,
            &crate::BuildOptions::default(),
        );
        case.batch.set_masks(self.masks());
        case
    }

    /// The fixture, computed from scratch (a digest: the outputs are large).
    pub fn compute(&self) -> GoldenFixture {
        GoldenFixture::digest_of(self.name, &self.case())
    }
}
