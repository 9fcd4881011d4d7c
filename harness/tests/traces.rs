//! The cache-across-steps contract (backend.rs): every built-in backend keeps K/V written in
//! one step for the next, reads reused blocks as their new owner wrote them, and agrees with
//! the oracle of every step; a backend that forgets earlier steps passes single cases and is
//! caught by traces (the contract's test can fail).

use attn_backends::cpu::CpuBackend;
use attn_backends::{
    cache_as, cache_as_mut, Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs,
    Unsupported,
};
use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::CheckOptions;
use attn_harness::pipeline::draw::trace::{trace_recipe_with, TraceShapes};
use attn_harness::pipeline::runner::trace::{evaluate_trace, trace_for, JudgedTrace, TraceOutcome};
use attn_harness::pipeline::runner::{evaluate, Outcome};
use attn_reference::trace::generate;
use attn_reference::{reference_output, AttentionConfig};
use attn_results::compare::Tolerance;

#[test]
fn every_built_in_backend_keeps_its_cache_across_a_traces_steps() {
    // The default traces, then (for a backend that declines most shapes, as `spyre-device`
    // does all but fp16 with head sizes in 64s) traces aimed at common head sizes.
    let aimed = TraceShapes {
        head_sizes: vec![64, 128],
        ..TraceShapes::default()
    };
    let traces = (0..25)
        .map(|i| (i, TraceShapes::default()))
        .chain((0..400).map(|i| (i, aimed.clone())));
    for backend in attn_backends::all_backends() {
        let mut passed = 0;
        for (index, shapes) in traces.clone() {
            if passed >= 25 {
                break;
            }
            let t = JudgedTrace::new(generate(&trace_recipe_with(3, index, &shapes)));
            match evaluate_trace(backend.as_ref(), &t).0 {
                TraceOutcome::Pass { .. } => passed += 1,
                TraceOutcome::Unsupported(_) => {}
                TraceOutcome::Diverged { step, divergence } => panic!(
                    "{} diverged on trace {index} ({shapes:?}) step {step}: {}",
                    backend.name(),
                    divergence.message
                ),
            }
        }
        assert!(passed >= 5, "{} ran only {passed} traces", backend.name());
    }
}

/// A backend that forgets every write made before its last forward: each step's forward
/// sees only that step's writes (as if a fresh cache were made per call).
struct Forgetful {
    inner: CpuBackend,
}

struct ForgetfulCache {
    config: AttentionConfig,
    num_blocks: usize,
    writes: Vec<(Vec<f32>, Vec<f32>, Vec<i64>)>,
    forwarded: std::sync::atomic::AtomicBool,
}

impl Backend for Forgetful {
    fn name(&self) -> &str {
        "forgetful"
    }
    fn supports(&self, c: &AttentionConfig) -> Result<(), Unsupported> {
        self.inner.supports(c)
    }
    fn cache_layout(&self) -> CacheLayout {
        self.inner.cache_layout()
    }
    fn new_cache(&self, c: &AttentionConfig, num_blocks: usize) -> Result<KvCache, BackendError> {
        Ok(Box::new(ForgetfulCache {
            config: c.clone(),
            num_blocks,
            writes: Vec::new(),
            forwarded: Default::default(),
        }))
    }
    fn write_kv(
        &self,
        _: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        let c = cache_as_mut::<ForgetfulCache>("forgetful", cache)?;
        if c.forwarded
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            c.writes.clear();
        }
        c.writes
            .push((kv.key.to_vec(), kv.value.to_vec(), kv.slot_mapping.to_vec()));
        Ok(())
    }
    fn forward(
        &self,
        _: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        let c = cache_as::<ForgetfulCache>("forgetful", cache)?;
        c.forwarded
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let mut fresh = self.inner.new_cache(&c.config, c.num_blocks)?;
        for (k, v, s) in &c.writes {
            self.inner.write_kv(
                &c.config,
                &mut fresh,
                &KvWrite {
                    key: k,
                    value: v,
                    slot_mapping: s,
                },
            )?;
        }
        self.inner.forward(&c.config, &fresh, step)
    }
}

#[test]
fn a_backend_that_forgets_earlier_steps_passes_cases_and_fails_traces() {
    let forgetful = Forgetful {
        inner: CpuBackend::auto(),
    };
    // Single cases: the context is written in the same call as the step, so nothing is lost.
    let t = trace_for(1, 0);
    for case in &t.steps {
        let (o, _) = evaluate(
            &forgetful,
            case,
            &reference_output(case),
            Tolerance::for_case(case),
        );
        assert!(matches!(o, Outcome::Pass(_)), "{o:?}");
    }
    let diverged = (0..10).any(|i| {
        matches!(
            evaluate_trace(&forgetful, &trace_for(1, i)).0,
            TraceOutcome::Diverged { .. }
        )
    });
    assert!(
        diverged,
        "no trace caught a backend that forgets earlier steps"
    );
}

#[test]
fn check_runs_traces_by_default_and_counts_them() {
    let run = run_check(CheckOptions::new(
        vec![attn_backends::backend_by_name("cpu").expect("cpu")],
        0,
        std::env::temp_dir().join("attn-diff-traces-check"),
    ));
    let s = &run.summary;
    let b = &s.backends[0];
    assert_eq!(
        s.traces,
        attn_harness::pipeline::draw::trace::DEFAULT_TRACES
    );
    assert_eq!(b.traces.sent, s.traces as usize);
    assert_eq!(
        b.traces.failed,
        0,
        "{:?}",
        b.failures.first().map(|f| &f.text)
    );
    assert!(b.trace_steps > b.traces.sent * 5, "{} steps", b.trace_steps);
}

#[test]
fn replay_runs_a_trace_file_and_rejects_a_broken_one_by_field() {
    let dir = std::env::temp_dir().join("attn-diff-trace-replay");
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("trace.json");
    std::fs::write(
        &good,
        serde_json::to_string(&trace_for(1, 2).trace).unwrap(),
    )
    .unwrap();
    let replay = |file: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_attn-diff"))
            .args(["replay", &file.display().to_string(), "--backend", "cpu"])
            .output()
            .expect("attn-diff runs")
    };
    let o = replay(&good);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("cpu: pass"), "{stdout}");
    let mut broken = trace_for(1, 2).trace;
    broken.steps[0].seqs[0].block_table.push(1);
    let bad = dir.join("broken.json");
    std::fs::write(&bad, serde_json::to_string(&broken).unwrap()).unwrap();
    let o = replay(&bad);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("steps[0].seqs[0].block_table"), "{stderr}");
}

/// An MLA model's trace (16 query heads over one latent entry of 576) shrinks its heads and
/// both widths (the latent and its rotary tail, together), not only its sequences: a report
/// of 16 heads of 576 hides which dims are wrong.
#[cfg(feature = "mutants")]
#[test]
fn an_mla_trace_shrinks_its_heads_and_widths() {
    use attn_harness::failure::class::Symptom;
    use attn_harness::pipeline::check::trace::diverges;
    use attn_harness::pipeline::draw::production::{production_recipe, MLA_AT};
    use attn_harness::pipeline::shrink::trace::shrink_trace;

    let backend = attn_backends::mutants::mutant("mla-default-scale").expect("mutant");
    let recipe = production_recipe(1, MLA_AT);
    let (heads, width) = (recipe.config.num_heads, recipe.config.head_size);
    assert!(recipe.config.mla.is_some() && heads >= 16 && width == 576);
    let t = JudgedTrace::new(generate(&recipe));
    let TraceOutcome::Diverged { step, divergence } = evaluate_trace(backend.as_ref(), &t).0 else {
        panic!("the mutant passes its MLA trace");
    };
    let symptom = Symptom::of(&divergence);
    let budget = CheckOptions::new(vec![], 0, std::env::temp_dir()).shrink;
    let shrunk = shrink_trace(recipe, step, budget, &|r| r, |r| {
        diverges(backend.as_ref(), r, &symptom)
    });
    let c = &shrunk.recipe.config;
    let m = c.mla.expect("still MLA");
    assert_eq!(c.num_heads, 1, "{c:?}");
    assert!(
        m.head_size_v < 512 && c.head_size - m.head_size_v < 64,
        "{c:?}"
    );
}
