//! The harness catches planted bugs, shrinks them to small cases and reports them readably.

mod support;

use attn_backends::Backend;
use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::{CheckOptions, Shard};
use attn_harness::pipeline::runner::DivergenceKind;
use std::sync::Arc;
use std::time::Instant;
use support::{Naive, Plant};

fn options(backends: Vec<Arc<dyn Backend>>, cases: u32, out: &str) -> CheckOptions {
    CheckOptions::new(backends, cases, std::env::temp_dir().join(out))
}

#[test]
fn a_correct_backend_passes() {
    let s = run_check(options(
        vec![Arc::new(Naive::correct())],
        200,
        "attn-diff-correct",
    ));
    let b = &s.summary.backends[0];
    assert_eq!(b.failed(), 0, "{:#?}", b.failures.first().map(|f| &f.text));
    // The naive kernel has neither cross-attention nor an FP8 cache: those cases are
    // declined, every other one passes.
    use attn_reference::Feature;
    assert!(
        b.unsupported.iter().all(|g| matches!(
            g.feature.feature(),
            Some(Feature::CrossAttention | Feature::Fp8KvCache)
        )),
        "{:?}",
        b.unsupported
    );
    assert_eq!(b.property.passed + b.property.declined, 200);
    assert_eq!(b.property.declined, b.unsupported_cases());
    assert!(b.property.passed > 100, "{}", b.property.passed);
}

#[test]
fn window_off_by_one_is_caught_and_shrunk_small() {
    let start = Instant::now();
    let bad = Naive::with(
        "naive-window-off-by-one",
        Plant {
            window_off_by_one: true,
            ..Plant::default()
        },
    );
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join("attn-diff-window"));
    let s = run_check(options(vec![Arc::new(bad)], 500, "attn-diff-window"));
    // The pipeline only names the files; they exist once the artifacts are written.
    let pending = s.artifacts[0]
        .replay
        .clone()
        .expect("a replay file is pending");
    assert!(!pending.0.exists(), "the pipeline wrote {:?}", pending.0);
    s.write_artifacts();
    let b = &s.summary.backends[0];
    assert!(
        b.failed() > 0,
        "planted window off-by-one survived {} cases",
        b.property.sent
    );
    let f = &b.failures[0];
    println!("{}", f.text);
    assert_eq!(f.kind, DivergenceKind::Mismatch);
    assert_eq!(f.size.sequences, 1, "{}", f.text);
    assert!(f.size.max_seq_len <= 3, "{}", f.text);
    assert_eq!(f.size.kv_heads, 1, "{}", f.text);
    assert!(f.size.head_size <= 2, "{}", f.text);
    assert!(f.text.contains("window"), "{}", f.text);
    let heatmap = f.heatmap.as_ref().expect("heat map drawn");
    assert!(
        std::path::Path::new(heatmap).is_file() && f.text.contains(heatmap.as_str()),
        "{}",
        f.text
    );
    let replay = f.replay.as_ref().expect("replay written");
    let case = attn_reference::Case::load(std::path::Path::new(replay)).expect("replay file loads");
    assert_eq!(case, pending.1);
    assert_eq!(std::path::Path::new(replay), pending.0);
    let secs = start.elapsed().as_secs_f64();
    println!("found and shrunk in {secs:.1} s");
}

#[test]
fn gqa_modulo_mapping_is_caught_with_a_head_hint() {
    let bad = Naive::with(
        "naive-gqa",
        Plant {
            gqa_modulo: true,
            ..Plant::default()
        },
    );
    let s = run_check(options(vec![Arc::new(bad)], 500, "attn-diff-gqa"));
    let f = &s.summary.backends[0].failures[0];
    assert!(
        f.hint.as_deref().unwrap_or("").contains("head"),
        "{}",
        f.text
    );
    assert!(
        f.size.heads > f.size.kv_heads && f.size.kv_heads > 1,
        "{}",
        f.text
    );
}

#[test]
fn a_panicking_backend_is_a_divergence_of_its_own_kind() {
    let bad = Naive::with(
        "naive-panics",
        Plant {
            panic_on_batches: true,
            ..Plant::default()
        },
    );
    let s = run_check(options(
        vec![Arc::new(Naive::correct()), Arc::new(bad)],
        100,
        "attn-diff-panic",
    ));
    assert_eq!(s.summary.backends[0].failed(), 0);
    let b = &s.summary.backends[1];
    assert!(
        b.divergences
            .get(&DivergenceKind::Panic)
            .copied()
            .unwrap_or(0)
            > 0
    );
    assert!(
        b.failures[0].message.contains("planted panic"),
        "{}",
        b.failures[0].message
    );
    assert_eq!(b.failures[0].size.sequences, 2);
}

#[test]
fn shards_together_run_exactly_the_cases_of_one_run() {
    let whole = run_check(options(
        vec![Arc::new(Naive::correct())],
        60,
        "attn-diff-shard",
    ));
    let mut sum = 0;
    let mut shared = 0;
    for i in 0..3 {
        let mut o = options(vec![Arc::new(Naive::correct())], 60, "attn-diff-shard");
        o.shard = Shard { index: i, count: 3 };
        let s = run_check(o);
        sum += s.summary.backends[0].property.sent;
        shared += s.summary.backends[0].shared_block_cases;
    }
    assert_eq!(sum, whole.summary.backends[0].property.sent);
    assert_eq!(shared, whole.summary.backends[0].shared_block_cases);
}

#[test]
fn reading_a_poisoned_block_tail_is_caught() {
    let bad = Naive::with(
        "naive-whole-block-tail",
        Plant {
            whole_block_tail: true,
            ..Plant::default()
        },
    );
    let s = run_check(options(vec![Arc::new(bad)], 200, "attn-diff-block-tail"));
    let b = &s.summary.backends[0];
    assert!(b.failed() > 0, "survived {} cases", b.property.sent);
    let f = &b.failures[0];
    println!("{}", f.text);
    assert_eq!(
        f.kind,
        attn_harness::pipeline::runner::DivergenceKind::NonFinite
    );
    // The shrunk case keeps what makes it fail: poisoned memory past a sequence's end.
    assert!(f.text.contains("poison"), "{}", f.text);
    assert!(f.size.sequences <= 2, "{:?}", f.size);
}
