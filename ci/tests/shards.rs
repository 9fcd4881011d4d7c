//! N shard summaries merged equal one unsharded run: the same counts per backend (cases,
//! passes, failures by kind, unsupported cases by reason, shared-block cases) and the same
//! upstream rows. Runs the real harness loop on the CPU backend and on a faulty wrapper of
//! it that declines some configs and corrupts multi-sequence batches, so every count moves.

use attn_backends::{
    Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs, Unsupported,
};
use attn_ci::merge::merge;
use attn_ci::reply::{render_reply, status_of, ReplyContext, State};
use attn_ci::summary::CheckSummary;
use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::{CheckOptions, Shard};
use attn_harness::pipeline::shrink::ShrinkBudget;
use attn_harness::render::check::render_json;
use attn_reference::AttentionConfig;
use std::sync::Arc;

/// The CPU backend, but it declines odd head sizes and adds 1 to the first output value of
/// every batch with more than one sequence.
struct Faulty(Arc<dyn Backend>);

impl Backend for Faulty {
    fn name(&self) -> &str {
        "faulty"
    }
    fn supports(&self, config: &AttentionConfig) -> Result<(), Unsupported> {
        if config.head_size % 2 == 1 {
            return Err(Unsupported::new(attn_reference::Dimension::HeadSize, "odd")
                .value(config.head_size));
        }
        self.0.supports(config)
    }
    fn cache_layout(&self) -> CacheLayout {
        self.0.cache_layout()
    }
    fn new_cache(
        &self,
        config: &AttentionConfig,
        num_blocks: usize,
    ) -> Result<KvCache, BackendError> {
        self.0.new_cache(config, num_blocks)
    }
    fn write_kv(
        &self,
        config: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        self.0.write_kv(config, cache, kv)
    }
    fn forward(
        &self,
        config: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        let mut out = self.0.forward(config, cache, step)?;
        if step.seq_lens.len() > 1 {
            if let Some(x) = out.first_mut() {
                *x += 1.0;
            }
        }
        Ok(out)
    }
}

fn run(shard: Shard, out: &std::path::Path) -> CheckSummary {
    let cpu = attn_backends::backend_by_name("cpu").expect("cpu is registered");
    let faulty: Arc<dyn Backend> = Arc::new(Faulty(cpu.clone()));
    let run = run_check(CheckOptions {
        seed: 11,
        shard,
        upstream: attn_harness::pipeline::upstream::small_suite()
            .into_iter()
            .filter(|c| c.spec == "small_decode")
            .collect(),
        recorded: Vec::new(),
        shrink: ShrinkBudget {
            max_steps: 200,
            ..ShrinkBudget::default()
        },
        ..CheckOptions::new(vec![cpu, faulty], 60, out.to_path_buf())
    });
    // Through the JSON, as the workflow passes it between jobs.
    attn_results::from_json::<CheckSummary>(&render_json(&run.summary))
        .expect("the bot reads the harness's JSON")
}

fn counts(s: &CheckSummary) -> Vec<String> {
    s.backends
        .iter()
        .map(|b| {
            format!(
                "{}: property {:?} upstream {:?} traces {:?} steps {} {:?} unsupported {:?} shared {} first {:?}/{:?}",
                b.backend,
                b.property,
                b.upstream,
                b.traces,
                b.trace_steps,
                b.divergences,
                b.unsupported,
                b.shared_block_cases,
                b.first_failing_case,
                b.first_failing_trace,
            )
        })
        .collect()
}

#[test]
fn three_shards_merged_equal_one_run() {
    let dir = std::env::temp_dir().join(format!("attn-ci-shards-{}", std::process::id()));
    let whole = run(Shard::ALL, &dir.join("whole"));
    let shards: Vec<CheckSummary> = (0..3)
        .rev() // any order
        .map(|i| {
            run(
                Shard { index: i, count: 3 },
                &dir.join(format!("shard-{i}")),
            )
        })
        .collect();
    let merged = merge(shards).expect("shards of one run merge");

    assert_eq!(counts(&merged), counts(&whole));
    assert_eq!(merged.upstream, whole.upstream);
    // Coverage adds up too: every case, upstream ones included, counted once.
    assert_eq!(merged.coverage, whole.coverage);
    assert_eq!(merged.shard, attn_ci::summary::Shard { index: 0, count: 1 });
    assert_eq!((merged.seed, merged.cases), (whole.seed, whole.cases));
    // The run exercised what the merge must get right.
    let faulty = &whole.backends[1];
    assert!(
        faulty.failed() > 0 && !faulty.unsupported.is_empty(),
        "{:?}",
        counts(&whole)
    );
    assert!(
        !whole.upstream.is_empty(),
        "upstream rows, which shards split like property cases"
    );
    // Each shard's first failure is kept once; the upstream failures are not repeated.
    let origins: Vec<&attn_results::Origin> = merged.backends[1]
        .failures
        .iter()
        .map(|f| &f.origin)
        .collect();
    let unique: std::collections::HashSet<_> = origins.iter().collect();
    assert_eq!(origins.len(), unique.len());
    assert!(merged.backends[1].failures.len() >= whole.backends[1].failures.len());

    // The reply: the table, and each minimal failing case collapsed with its replay file.
    let req = attn_ci::request::parse("bot:test BACKENDS=cpu CASES=60 SEED=11 SHARDS=3").unwrap();
    let ctx = ReplyContext {
        replay_artifact: "attn-diff-replays".into(),
        run_url: None,
    };
    let reply = render_reply(&req, &merged, &ctx);
    assert!(reply.starts_with("### attn-diff: DIVERGENCE"), "{reply}");
    assert!(reply.contains("| cpu | pass | "), "{reply}");
    assert!(reply.contains("| faulty | **DIVERGED** | "), "{reply}");
    assert!(
        reply.contains("<details><summary>faulty: mismatch on property case"),
        "{reply}"
    );
    assert!(
        reply.contains("in artifact `attn-diff-replays`: `attn-diff replay faulty-seed11-case"),
        "{reply}"
    );
    assert_eq!(status_of(&merged).state, State::Failure);
    let _ = std::fs::remove_dir_all(&dir);
}
