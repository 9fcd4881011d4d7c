//! Aim: cases, traces and shrinking follow the space a backend declares (and `--only`
//! narrows), a narrow backend gets its whole budget, and the summary says what reached it.

use attn_backends::{backend_by_name, declared_space, Backend};
use attn_harness::pipeline::check::drive::map_ordered;
use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::subject::case_tree;
use attn_harness::pipeline::check::{cohorts, CheckOptions};
use attn_harness::pipeline::draw::budget::fit_space;
use attn_harness::pipeline::draw::budget_of;
use attn_harness::pipeline::draw::tier::StrategyLimits;
use attn_harness::pipeline::draw::trace::{fit_trace, trace_recipe_in, TraceShapes};
use attn_harness::pipeline::recipe::CaseRecipe;
use attn_harness::pipeline::shrink::case::shrink_fully;
use attn_harness::pipeline::shrink::ShrinkBudget;
use attn_harness::render::check::{render_text, Detail};
use attn_reference::trace::generate;
use attn_reference::Dimension;
use attn_reference::{Case, Space, Unsupported};
use proptest::strategy::ValueTree;
use support::{adapter_python_with, repo};

mod support;
use std::process::Command;
use std::sync::Arc;

fn space(json: &str) -> Space {
    serde_json::from_str(json).expect("a valid space")
}

/// One space per key (so each is seen to bind alone), and the narrow one of a backend in
/// development with every batch limit besides.
fn spaces() -> Vec<(&'static str, Space)> {
    vec![
        ("dtypes", space(r#"{"dtypes": ["bf16"]}"#)),
        ("head_sizes", space(r#"{"head_sizes": [80, 128]}"#)),
        (
            "head_size_multiple_of",
            space(r#"{"head_size_multiple_of": 64}"#),
        ),
        ("block_sizes", space(r#"{"block_sizes": [16]}"#)),
        (
            "block_size_multiple_of",
            space(r#"{"block_size_multiple_of": 16}"#),
        ),
        ("kinds", space(r#"{"kinds": ["encoder_only"]}"#)),
        ("features", space(r#"{"features": ["alibi"]}"#)),
        ("max_seqs", space(r#"{"max_seqs": 1}"#)),
        ("max_query_len", space(r#"{"max_query_len": 1}"#)),
        ("max_seq_len", space(r#"{"max_seq_len": 40}"#)),
        ("max_tokens", space(r#"{"max_tokens": 6}"#)),
        ("max_group", space(r#"{"max_group": 2}"#)),
        (
            "kv_cache_dtypes",
            space(r#"{"kv_cache_dtypes": ["fp8_e5m2"]}"#),
        ),
        ("kv_layouts", space(r#"{"kv_layouts": ["mla"]}"#)),
        (
            "narrow",
            space(
                r#"{"dtypes": ["f16"], "head_size_multiple_of": 64, "max_seqs": 1,
                    "kinds": ["decoder"], "features": [], "max_query_len": 16,
                    "max_seq_len": 2048, "max_tokens": 16, "block_sizes": [16, 64]}"#,
            ),
        ),
    ]
}

const LIMITS: StrategyLimits = StrategyLimits {
    long_every: 5,
    ..StrategyLimits::DEFAULT
};

#[test]
fn every_drawn_case_and_trace_is_inside_its_space_and_each_key_binds() {
    let full = Space::default();
    for (key, s) in spaces() {
        assert_eq!(s.emptiness(), None, "{key}");
        let mut bound = false;
        for index in 0..60 {
            let case = case_tree(3, index, LIMITS, &s).current().build();
            assert_eq!(case.validate(), Ok(()), "{key}: case {index}");
            assert_eq!(s.admits(&case), Ok(()), "{key}: case {index}");
            // The key restricts something: a draw of the full space would break it.
            let free = case_tree(3, index, LIMITS, &full).current().build();
            bound |= s.admits(&free).is_err();
        }
        assert!(
            bound,
            "{key}: no draw of the full space breaks it; the test proves nothing"
        );
        for index in 0..12 {
            let trace = generate(&trace_recipe_in(3, index, &TraceShapes::default(), &s));
            assert_eq!(trace.validate(), Ok(()), "{key}: trace {index}");
            if !attn_harness::pipeline::draw::trace::draws_traces(&s) {
                continue; // `check` draws no trace for it
            }
            for step in 0..trace.steps.len() {
                let case = trace.step_case(step);
                assert_eq!(s.admits(&case), Ok(()), "{key}: trace {index} step {step}");
            }
        }
    }
}

#[test]
fn the_full_space_draws_what_it_always_drew() {
    let full = Space::default();
    for index in 0..40 {
        let r = case_tree(1, index, LIMITS, &full).current();
        assert_eq!(fit_space(r.clone(), &full, budget_of(index, LIMITS)), r);
    }
    let t = trace_recipe_in(1, 0, &TraceShapes::default(), &full);
    assert_eq!(fit_trace(t.clone(), &full), t);
}

#[test]
fn shrinking_never_leaves_the_space() {
    // One full shrink per space, the spaces spread over the cores: alone, this test was the
    // last of its binary for minutes on one core.
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let problems = map_ordered(jobs, &spaces(), &|(key, s)| shrink_stays_inside(key, s));
    let problems: Vec<String> = problems.into_iter().flatten().collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Shrink a drawn case of `s` as far as the shrinker goes (every candidate "fails"): what is
/// wrong, if anything.
fn shrink_stays_inside(key: &str, s: &Space) -> Option<String> {
    let index = 2;
    let mut tree = case_tree(5, index, LIMITS, s);
    let budget = budget_of(index, LIMITS);
    let fit = |r: CaseRecipe| fit_space(r, s, budget);
    let mut outside = 0;
    let budget_steps = ShrinkBudget {
        max_steps: 4000,
        max_work: u64::MAX,
        max_time: None,
        until: None,
    };
    let shrunk = shrink_fully(&mut tree, budget_steps, &fit, |r| {
        outside += usize::from(s.admits(&r.build()).is_err());
        true
    });
    let minimal = shrunk.recipe.build();
    if outside > 0 {
        Some(format!(
            "{key}: {outside} shrink candidate(s) left the space"
        ))
    } else if shrunk.exhausted {
        // Everything failing, the greedy loop must still end on its own (no cycle).
        Some(format!("{key}: the shrink ran out of budget"))
    } else if let Err(e) = s.admits(&minimal) {
        Some(format!("{key}: the smallest case is outside: {e:?}"))
    } else if shrunk.accepted == 0 {
        Some(format!("{key}: nothing shrank"))
    } else {
        None
    }
}

/// `cpu` declining every head size that is not a multiple of 8 without declaring it: what a
/// backend whose space is incomplete looks like.
fn picky() -> support::CpuWith {
    support::CpuWith {
        refuses: |config| {
            if !config.head_size.is_multiple_of(8) {
                return Err(Unsupported::new(Dimension::HeadSize, "not a multiple of 8")
                    .value(config.head_size));
            }
            Ok(())
        },
        ..support::CpuWith::new("picky")
    }
}

#[test]
fn the_summary_says_what_reached_each_backend_and_warns_on_declines() {
    let cpu = backend_by_name("cpu").unwrap();
    let picky: Arc<dyn Backend> = Arc::new(picky());
    let out = std::env::temp_dir().join("attn-diff-aim-summary");
    let run = run_check(CheckOptions {
        traces: 4,
        ..CheckOptions::new(vec![cpu, picky], 60, out)
    });
    let s = &run.summary;
    let (cpu, picky) = (&s.backends[0], &s.backends[1]);
    assert_eq!(cpu.reached(), cpu.drawn());
    assert!(picky.unsupported_cases() > 6, "{:?}", picky.unsupported);
    assert_eq!(picky.reached() + picky.unsupported_cases(), picky.drawn());
    assert!(picky.declined_too_often() && !cpu.declined_too_often());
    let text = render_text(s, Detail::Summary);
    assert!(
        text.contains(&format!(
            "aim: picky draws from everything: {} of {}",
            picky.reached(),
            picky.drawn()
        )),
        "{text}"
    );
    assert!(
        text.contains("warning: picky declined more than a tenth"),
        "{text}"
    );
    assert!(!text.contains("warning: cpu"), "{text}");
    assert!(
        text.contains("picky: ") && text.contains("head size not a multiple of 8"),
        "{text}"
    );
}

#[test]
fn spyre_device_runs_nearly_all_of_its_budget_in_its_own_cohort() {
    let cpu = backend_by_name("cpu").unwrap();
    let device = backend_by_name("spyre-device").unwrap();
    let declared = declared_space(device.as_ref());
    assert!(!declared.is_full() && declared.dtypes.is_some());
    let backends = vec![cpu.clone(), device.clone()];
    assert_eq!(cohorts(&backends, &Space::default()).len(), 2);
    let out = std::env::temp_dir().join("attn-diff-aim-device");
    let run = run_check(CheckOptions {
        traces: 6,
        ..CheckOptions::new(backends, 100, out)
    });
    let d = &run.summary.backends[1];
    assert_eq!(d.property.sent, 100, "a full budget, not a sliver");
    assert!(
        d.reached() * 10 >= d.drawn() * 9,
        "spyre-device reached {} of {}: {:?}",
        d.reached(),
        d.drawn(),
        d.unsupported
    );
    assert!(!run.summary.any_divergence());
    // Its coverage marks what it does not declare.
    let cov = run.summary.coverage.as_ref().unwrap();
    assert!(cov.is_not_declared("spyre-device", "dtype", "f32"));
    assert!(!cov.is_not_declared("cpu", "dtype", "f32"));
    assert!(cov
        .uncovered("spyre-device")
        .iter()
        .all(|(dim, _)| *dim != "dtype" && *dim != "head size"));
}

fn attn_diff(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .current_dir(repo())
        .args(args)
        .output()
        .expect("attn-diff runs")
}

#[test]
fn only_narrows_every_backend_and_is_recorded() {
    let o = attn_diff(&[
        "check",
        "-q",
        "--backend",
        "cpu",
        "--cases",
        "40",
        "--traces",
        "4",
        "--only",
        "dtypes=f16",
        "--only",
        "head_sizes=64,128",
        "--only",
        "max_seqs=1",
        "--format",
        "json",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s: attn_results::CheckSummary = serde_json::from_slice(&o.stdout).unwrap();
    let only = s.only.as_ref().expect("--only recorded");
    assert_eq!(only.to_string(), "dtypes=f16 head_sizes=64,128 max_seqs=1");
    assert_eq!(s.backends[0].space.as_ref(), Some(only));
    let cov = &s.coverage.as_ref().unwrap().backends["cpu"];
    assert_eq!(cov["dtype"].get("f16"), Some(&40));
    assert!(!cov["dtype"].contains_key("f32"));
    assert_eq!(cov["sequences"].get("1"), Some(&40));
    assert!(
        cov["head size"].keys().all(|b| b.starts_with("64k")),
        "{cov:?}"
    );
    // A key that does not exist, and a space left empty, are usage errors.
    let o = attn_diff(&["check", "--backend", "cpu", "--only", "max_seq=1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown key `max_seq`"));
    let o = attn_diff(&[
        "check",
        "--backend",
        "spyre-device",
        "--only",
        "dtypes=f32",
        "--cases",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("spyre-device would run nothing") && err.contains("dtypes"),
        "{err}"
    );
}

#[test]
fn a_narrow_adapter_gets_its_whole_budget() {
    let python = adapter_python_with("numpy, safetensors");
    let script = repo().join("harness/tests/adapters/narrow.py");
    let adapters = repo().join("adapters/python");
    let external = format!(
        "narrow={python} {} {}",
        script.display(),
        adapters.display()
    );
    let o = attn_diff(&[
        "check",
        "-q",
        "--backend",
        "external:narrow",
        "--external",
        &external,
        "--cases",
        "300",
        "--traces",
        "20",
        "--format",
        "json",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s: attn_results::CheckSummary = serde_json::from_slice(&o.stdout).unwrap();
    let b = &s.backends[0];
    assert_eq!(b.property.sent, 300);
    assert!(
        b.reached() * 100 >= b.drawn() * 95,
        "{} of {} reached it: {:?}",
        b.reached(),
        b.drawn(),
        b.unsupported
    );
    assert!(b.trace_steps > 0);
    // Several head sizes, block sizes and context lengths inside that space.
    let cov = &s.coverage.as_ref().unwrap().backends["external:narrow"];
    assert!(cov["head size"].len() >= 2, "{cov:?}");
    assert!(cov["block size"].len() >= 3, "{cov:?}");
    assert!(cov["longest sequence"].len() >= 3, "{cov:?}");
}

/// A case inside the space is left alone by fitting, so replays of it are unchanged.
#[test]
fn fitting_is_idempotent() {
    for (key, s) in spaces() {
        for index in 0..30 {
            let r = case_tree(9, index, LIMITS, &s).current();
            let again = fit_space(r.clone(), &s, budget_of(index, LIMITS));
            assert_eq!(again, r, "{key}: case {index}");
            let c: Case = r.build();
            assert_eq!(s.admits(&c), Ok(()));
        }
    }
}
