//! "A built-in backend passes" means at every seed, not at the one CI happens to run: every
//! trace the check draws is a valid trace at seeds 1..=64, and every built-in backend passes
//! a cheap check at seeds 1..=32 (the nightly `seeds` workflow runs the full budget, 300
//! cases and 100 traces, at seeds 1..=64; docs/usage.md says what each covers).

use attn_harness::pipeline::draw::production::is_production;
use attn_harness::pipeline::draw::trace::{trace_recipe_in, TraceShapes, DEFAULT_TRACES};
use attn_reference::trace::generate;
use attn_reference::Space;
use attn_results::CheckSummary;
use std::process::Command;

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

/// `attn-diff check --seed S` as a user runs it, over every built-in backend at once.
#[test]
fn every_built_in_backend_passes_a_cheap_check_at_every_seed() {
    let out_dir = std::env::temp_dir().join(format!("attn-diff-seeds-{}", std::process::id()));
    let mut traces_reached = std::collections::BTreeMap::<String, usize>::new();
    let mut failed = Vec::new();
    for seed in 1..=CHECK_SEEDS {
        let o = Command::new(env!("CARGO_BIN_EXE_attn-diff"))
            .args(["check", "-q", "--no-upstream", "--format", "json", "--seed"])
            .arg(seed.to_string())
            .args(["--cases", &CHECK_CASES.to_string()])
            .args(["--traces", &CHECK_TRACES.to_string()])
            .arg("--out")
            .arg(&out_dir)
            .output()
            .expect("attn-diff runs");
        let summary: CheckSummary = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", String::from_utf8_lossy(&o.stderr)));
        assert_eq!(
            summary.backends.len(),
            attn_backends::backend_names().len(),
            "seed {seed}: not every built-in backend ran"
        );
        for b in &summary.backends {
            let name = &b.backend.name;
            // A run that reached nothing is not a pass.
            assert!(
                b.property.reached() > 0,
                "seed {seed}: no case reached {name}"
            );
            *traces_reached.entry(name.clone()).or_default() += b.traces.reached();
            if let Some(f) = b.failures.first() {
                failed.push(format!("seed {seed}, {name}:\n{}", f.text));
            }
        }
        if o.status.code() != Some(0) && failed.is_empty() {
            failed.push(format!("seed {seed}: exit {:?}", o.status.code()));
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    for (name, reached) in traces_reached {
        assert!(
            reached >= CHECK_SEEDS as usize,
            "{name}: {reached} traces reached"
        );
    }
}

/// A narrow space turns a cheap draw into a huge cache: a batch of thousands of one-block
/// decodes is little work, but with 256-token blocks and head size 512 each holds 256 slots
/// of 1,024 elements (a pair's drawn case of 8,882 such decodes asked tens of GiB, and the
/// run was killed for memory). Every property case and every pair's case of the default
/// budget keeps its blocks under the ceiling, in such spaces and in the whole one.
#[test]
fn every_drawn_case_fits_its_cache_under_the_ceiling_in_narrow_spaces_too() {
    use attn_harness::pipeline::check::subject::case_tree;
    use attn_harness::pipeline::draw::budget::{cache_elements, CACHE_ELEMENTS};
    use attn_harness::pipeline::draw::pair::{case_index, PAIR_STREAM};
    use attn_harness::pipeline::draw::tier::StrategyLimits;
    use attn_reference::{AttentionKind, DType};
    use proptest::strategy::ValueTree;

    let spyre_like = Space {
        dtypes: Some(vec![DType::F16]),
        head_size_multiple_of: Some(64),
        block_size_multiple_of: Some(64),
        kinds: Some(vec![AttentionKind::Decoder]),
        ..Space::default()
    };
    let wide_pages = Space {
        head_sizes: Some(vec![256, 512]),
        block_sizes: Some(vec![256]),
        ..Space::default()
    };
    let limits = StrategyLimits::DEFAULT;
    for (name, space) in [
        ("whole", Space::default()),
        ("spyre-like", spyre_like),
        ("wide pages", wide_pages),
    ] {
        let mut largest = 0;
        for seed in 1..=3u64 {
            let property = (0..500).map(|i| (seed, i));
            let pairs = (0..100).map(|i| (seed ^ PAIR_STREAM, case_index(i)));
            for (stream, index) in property.chain(pairs) {
                let r = case_tree(stream, index, limits, &space).current();
                if r.cache_blocks.is_some() {
                    continue; // A huge cache is what it is for: backends allocate it lazily.
                }
                let n = cache_elements(&r);
                largest = largest.max(n);
                assert!(
                    n <= CACHE_ELEMENTS,
                    "{name} space, stream {stream:#x}, index {index}: {n} K/V elements in \
                     {} sequences of block size {} and head size {}",
                    r.seqs.len(),
                    r.block_size,
                    r.head_size
                );
            }
        }
        eprintln!("{name} space: the largest drawn cache holds {largest} K/V elements");
    }
}
