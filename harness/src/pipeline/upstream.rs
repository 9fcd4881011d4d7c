//! vLLM's backend correctness test as attn-diff runs it: the causal test over every spec but
//! mixed_large, the sliding-window test (w = 2047) over its six specs, each at the three
//! tensor-parallel head configs of Llama-3-8B (head size 128), bf16, block size 16, with
//! upstream's tolerance (atol = rtol = 1e-2).

use attn_reference::specs::{
    self, spec_by_name, CAUSAL_TEST_SPECS, SLIDING_WINDOW_TEST_SPECS, TP_HEAD_CONFIGS,
};
use attn_reference::{build_spec_case, AttentionConfig, AttentionKind, Case, DType};
use serde::Serialize;

/// Seed of the upstream suite's inputs.
pub const UPSTREAM_SEED: u64 = attn_reference::golden::GOLDEN_SEED;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamTest {
    Causal,
    SlidingWindow,
    /// The encoder-only specs (non-causal).
    Encoder,
    /// The cross-attention specs (attn-diff's own, at their model's heads).
    Cross,
}

impl UpstreamTest {
    pub fn name(&self) -> &'static str {
        match self {
            UpstreamTest::Causal => "causal",
            UpstreamTest::SlidingWindow => "sliding_window",
            UpstreamTest::Encoder => "encoder",
            UpstreamTest::Cross => "cross",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UpstreamCase {
    pub test: UpstreamTest,
    pub spec: &'static str,
    pub heads: (usize, usize),
}

impl UpstreamCase {
    /// This case's row of a summary for `backend`: its status and worst (abs, rel) errors.
    pub fn row(
        &self,
        backend: &str,
        status: attn_results::UpstreamStatus,
        abs: f64,
        rel: f64,
    ) -> attn_results::UpstreamRow {
        attn_results::UpstreamRow {
            backend: backend.to_string(),
            test: self.test.name().to_string(),
            spec: self.spec.to_string(),
            heads: self.heads,
            status,
            max_abs_err: abs,
            max_rel_err: rel,
        }
    }

    /// This case as the origin of a failure.
    pub fn origin(&self) -> attn_results::Origin {
        attn_results::Origin::Upstream {
            test: self.test.name().to_string(),
            spec: self.spec.to_string(),
            heads: self.heads,
        }
    }

    pub fn label(&self) -> String {
        format!(
            "upstream {} {} heads {}/{}",
            self.test.name(),
            self.spec,
            self.heads.0,
            self.heads.1
        )
    }

    pub fn config(&self) -> AttentionConfig {
        let head_size = match self.test {
            UpstreamTest::Cross => specs::cross_heads(self.spec).2,
            _ => specs::UPSTREAM_HEAD_SIZE,
        };
        let mut c = AttentionConfig::new(
            self.heads.0,
            self.heads.1,
            head_size,
            specs::UPSTREAM_BLOCK_SIZE,
            DType::Bf16,
        );
        if self.test == UpstreamTest::SlidingWindow {
            c.sliding_window = Some(specs::UPSTREAM_SLIDING_WINDOW);
        }
        c
    }

    pub fn build(&self) -> Case {
        let spec = spec_by_name(self.spec).expect("upstream cases name known specs");
        build_spec_case(&spec, self.config(), UPSTREAM_SEED)
    }
}

/// A cross-attention spec at its model's heads.
fn at_model_heads(spec: &'static str) -> UpstreamCase {
    let (q, kv, _) = specs::cross_heads(spec);
    UpstreamCase {
        test: UpstreamTest::Cross,
        spec,
        heads: (q, kv),
    }
}

fn at_every_tp(test: UpstreamTest, spec: &'static str) -> impl Iterator<Item = UpstreamCase> {
    TP_HEAD_CONFIGS
        .iter()
        .map(move |&heads| UpstreamCase { test, spec, heads })
}

/// The whole upstream suite: causal, sliding-window and encoder tests at every TP config.
pub fn full_suite() -> Vec<UpstreamCase> {
    let mut v: Vec<UpstreamCase> = Vec::new();
    for &s in CAUSAL_TEST_SPECS {
        v.extend(at_every_tp(UpstreamTest::Causal, s));
    }
    for &s in SLIDING_WINDOW_TEST_SPECS {
        v.extend(at_every_tp(UpstreamTest::SlidingWindow, s));
    }
    for spec in specs::all_specs()
        .into_iter()
        .filter(|s| s.kind == AttentionKind::EncoderOnly)
    {
        v.extend(at_every_tp(UpstreamTest::Encoder, spec.name));
    }
    v.extend(
        specs::all_specs()
            .into_iter()
            .filter(|s| s.kind == AttentionKind::EncoderDecoder)
            .map(|s| at_model_heads(s.name)),
    );
    v
}

/// The upstream cases of the named specs: every test that runs the spec, at every TP config.
pub fn cases_for_specs(names: &[String]) -> Result<Vec<UpstreamCase>, String> {
    let mut v = Vec::new();
    for name in names {
        let spec = spec_by_name(name).ok_or_else(|| crate::suggest::unknown_spec(name))?;
        let n = spec.name;
        if spec.kind == AttentionKind::EncoderDecoder {
            v.push(at_model_heads(n));
            continue;
        }
        if spec.kind == AttentionKind::EncoderOnly {
            v.extend(at_every_tp(UpstreamTest::Encoder, n));
            continue;
        }
        // mixed_large is not in the causal test upstream, but a named request runs it causally.
        v.extend(at_every_tp(UpstreamTest::Causal, n));
        if SLIDING_WINDOW_TEST_SPECS.contains(&n) {
            v.extend(at_every_tp(UpstreamTest::SlidingWindow, n));
        }
    }
    Ok(v)
}

/// The cheap part of the suite that `check` runs by default: the small specs.
pub fn small_suite() -> Vec<UpstreamCase> {
    let small = [
        "small_decode",
        "small_prefill",
        "mixed_small",
        "small_encoder_prefill",
        "bart_cross_prefill",
    ];
    full_suite()
        .into_iter()
        .filter(|c| small.contains(&c.spec))
        .collect()
}
