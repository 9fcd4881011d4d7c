//! "A built-in backend passes" means at every seed, not at the one CI happens to run: every
//! trace the check draws is a valid trace at seeds 1..=64, and every built-in backend passes
//! a cheap check at seeds 1..=32 (the nightly `seeds` workflow runs the full budget, 300
//! cases and 100 traces, at seeds 1..=64; docs/usage.md says what each covers).

use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::CheckOptions;
use attn_harness::pipeline::draw::production::is_production;
use attn_harness::pipeline::draw::trace::{trace_recipe_in, TraceShapes, DEFAULT_TRACES};
use attn_reference::trace::generate;
use attn_reference::Space;

/// Seeds every drawn trace is checked to be valid at.
const DRAW_SEEDS: u64 = 64;
/// Seeds whose traces are generated and validated whole (values and all: the slow part).
const TRACE_SEEDS: u64 = 4;
/// Seeds every built-in backend is checked at, and the check's budget at each.
const CHECK_SEEDS: u64 = 32;
const CHECK_CASES: u32 = 12;
/// Enough traces that each seed reaches a production trace and an MLA model's one.
const CHECK_TRACES: u32 = 20;

/// A drawn trace the oracle cannot stand behind (an MLA cache with two scales, a block past
/// the cache) would be judged as if it were right, and blame the backend for the draw's
/// fault: every drawn trace of the default budget validates, its config at every seed and
/// the whole trace (every step, the cache's replay) at the first [`TRACE_SEEDS`].
#[test]
fn every_drawn_trace_is_valid_at_every_seed() {
    let shapes = TraceShapes::default();
    let space = Space::default();
    let mut production = 0;
    for seed in 1..=DRAW_SEEDS {
        for index in 0..DEFAULT_TRACES as usize {
            let recipe = trace_recipe_in(seed, index, &shapes, &space);
            let checked = if seed <= TRACE_SEEDS {
                generate(&recipe).validate().map_err(|e| e.to_string())
            } else {
                recipe.config.validate().map_err(|e| e.to_string())
            };
            if let Err(e) = checked {
                panic!("seed {seed}, trace {index} is not a valid trace: {e}\n{recipe:?}");
            }
            production += usize::from(is_production(index));
        }
    }
    assert!(production >= 2 * DRAW_SEEDS as usize, "{production}");
}

#[test]
fn every_built_in_backend_passes_a_cheap_check_at_every_seed() {
    let backends = attn_backends::all_backends();
    let mut traces_reached = vec![0; backends.len()];
    let mut failed = Vec::new();
    for seed in 1..=CHECK_SEEDS {
        let mut opts = CheckOptions::new(
            backends.clone(),
            CHECK_CASES,
            std::env::temp_dir().join(format!("attn-diff-seeds-{}-{seed}", std::process::id())),
        );
        opts.seed = seed;
        opts.traces = CHECK_TRACES;
        // The upstream suite is the same at every seed: `check_runs_upstream…` runs it.
        opts.upstream.clear();
        let run = run_check(opts);
        for (i, b) in run.summary.backends.iter().enumerate() {
            let name = &b.backend.name;
            // A run that reached nothing is not a pass.
            assert!(b.property.reached() > 0, "seed {seed}: no case reached {name}");
            traces_reached[i] += b.traces.reached();
            if let Some(f) = b.failures.first() {
                failed.push(format!("seed {seed}, {name}:\n{}", f.text));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    for (b, reached) in backends.iter().zip(traces_reached) {
        assert!(reached >= CHECK_SEEDS as usize, "{}: {reached} traces reached", b.name());
    }
}
