//! `check --jobs N`: workers run subjects ahead of the recorder, which takes them in order,
//! so a check's summary (counts, failures, shrunk cases, give-ups, coverage) is the same for
//! every N, timings aside. Adapters run as a pool of processes, each cache pinned to one.

mod support;

use attn_backends::external::{AdapterSpec, ExternalBackend};
#[cfg(feature = "mutants")]
use attn_backends::mutants::mutant;
use attn_backends::registry::backend_by_name;
use attn_backends::Backend;
use attn_harness::external::adapter_python;
use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::CheckOptions;
use attn_harness::pipeline::upstream::small_suite;
use attn_harness::render::check::render_json;
use std::path::PathBuf;
use std::sync::Arc;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A summary as JSON with what depends on the machine's speed taken out: timings, and the
/// durations failure texts quote ("shrunk in 0.3 s").
fn without_timings(json: &str) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.retain(|k, _| !k.ends_with("seconds"));
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            serde_json::Value::String(s) => {
                // A number followed by the unit "s" is a duration: both words go.
                let words: Vec<&str> = s.split(' ').collect();
                let is_unit = |w: &str| w == "s" || w.starts_with("s,") || w.starts_with("s)");
                let mut out = Vec::with_capacity(words.len());
                let mut i = 0;
                while i < words.len() {
                    if words[i].parse::<f64>().is_ok()
                        && words.get(i + 1).is_some_and(|w| is_unit(w))
                    {
                        out.push("<time>");
                        i += 2;
                    } else {
                        out.push(words[i]);
                        i += 1;
                    }
                }
                *s = out.join(" ");
            }
            _ => {}
        }
    }
    let mut v: serde_json::Value = serde_json::from_str(json).expect("a summary is JSON");
    strip(&mut v);
    v
}

/// Where two summaries first differ, for a readable failure.
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, path: &str) -> Option<String> {
    use serde_json::Value::{Array, Object};
    match (a, b) {
        (Object(x), Object(y)) => {
            x.keys()
                .chain(y.keys())
                .find_map(|k| match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => first_difference(p, q, &format!("{path}/{k}")),
                    _ => Some(format!("{path}/{k}: only in one")),
                })
        }
        (Array(x), Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, &format!("{path}[{i}]"))),
        _ => (a != b).then(|| format!("{path}: {a} vs {b}")),
    }
}

#[cfg(feature = "mutants")]
fn check(backends: Vec<Arc<dyn Backend>>, jobs: usize, out: &str) -> serde_json::Value {
    let run = run_check(CheckOptions {
        traces: 8,
        upstream: small_suite(),
        recorded: Vec::new(),
        jobs,
        ..CheckOptions::new(backends, 60, std::env::temp_dir().join(out))
    });
    without_timings(&render_json(&run.summary))
}

#[cfg(feature = "mutants")]
#[test]
fn a_checks_summary_does_not_depend_on_jobs() {
    let backends = || -> Vec<Arc<dyn Backend>> {
        vec![
            backend_by_name("cpu").expect("cpu is registered"),
            // Killed by a property case and shrunk; by a trace and shrunk; narrow space.
            mutant("window-off-by-one").expect("known"),
            mutant("trace-stale-row-table").expect("known"),
            mutant("fp8-scale-not-applied").expect("known"),
        ]
    };
    let one = check(backends(), 1, "attn-diff-jobs");
    let failures = one["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .filter(|b| !b["failures"].as_array().expect("failures").is_empty())
        .count();
    assert!(
        failures >= 2,
        "the run must shrink failures to compare: {one:#}"
    );
    for jobs in [2, 5] {
        let many = check(backends(), jobs, "attn-diff-jobs");
        if let Some(d) = first_difference(&one, &many, "") {
            panic!("--jobs {jobs} changed the summary at {d}");
        }
    }
}

/// `cpu` failing every batch of more than one sequence with the same error.
fn fails_on_batches() -> support::CpuWith {
    support::CpuWith {
        before_forward: |step| {
            if step.seq_lens.len() > 1 {
                return Err(attn_backends::BackendError::Failed {
                    backend: "fails-on-batches".into(),
                    message: "batches are not implemented".into(),
                });
            }
            Ok(())
        },
        ..support::CpuWith::new("fails-on-batches")
    }
}

/// A backend given up on stops getting cases at the same point whatever the jobs: the
/// cases the workers ran for it ahead of the give-up are dropped, not counted.
#[test]
fn a_give_up_is_the_same_whatever_the_jobs() {
    let run = |jobs| {
        let run = run_check(CheckOptions {
            traces: 0,
            give_up_after: 3,
            jobs,
            ..CheckOptions::new(
                vec![Arc::new(fails_on_batches()) as Arc<dyn Backend>],
                120,
                std::env::temp_dir().join("attn-diff-jobs-give-up"),
            )
        });
        let b = &run.summary.backends[0];
        assert!(b.gave_up.is_some(), "given up");
        assert_eq!(b.failed(), 3, "{:?}", b.divergences);
        without_timings(&render_json(&run.summary))
    };
    let one = run(1);
    for jobs in [2, 4] {
        if let Some(d) = first_difference(&one, &run(jobs), "") {
            panic!("--jobs {jobs} changed the summary at {d}");
        }
    }
}

#[cfg(feature = "mutants")]
#[test]
fn stops_are_the_same_whatever_the_jobs() {
    let backends = || -> Vec<Arc<dyn Backend>> {
        vec![
            backend_by_name("cpu").expect("cpu is registered"),
            mutant("gqa-modulo").expect("known"),
            mutant("padding-row-nan").expect("known"),
        ]
    };
    let stopped = |jobs| {
        let run = run_check(CheckOptions {
            traces: 4,
            max_failures: Some(2),
            give_up_after: 1,
            jobs,
            ..CheckOptions::new(
                backends(),
                80,
                std::env::temp_dir().join("attn-diff-jobs-x"),
            )
        });
        assert!(
            run.summary.stopped.is_some(),
            "two mutants fail: the run stops"
        );
        without_timings(&render_json(&run.summary))
    };
    if let Some(d) = first_difference(&stopped(1), &stopped(4), "") {
        panic!("--jobs 4 changed the summary at {d}");
    }
}

/// With `processes` > 1 an adapter is a pool: concurrent cases go to different processes,
/// and every step of a trace to the process that holds its session.
#[test]
fn an_adapter_runs_as_a_pool_of_processes_with_the_same_summary() {
    let python = adapter_python(&repo());
    let script = repo().join("adapters/python/numpy_reference.py");
    let ok = std::process::Command::new(&python)
        .args(["-c", "import numpy, safetensors"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "needs the provisioned Python (`cargo xtask setup`)");
    let adapter = |processes| {
        let spec = AdapterSpec {
            processes,
            ..AdapterSpec::new(
                "numpy-ref",
                vec![python.clone(), script.display().to_string()],
            )
        };
        Arc::new(ExternalBackend::start(spec).expect("adapter starts"))
    };
    let pooled = adapter(2);
    let summary = |backend: Arc<ExternalBackend>, jobs| {
        let run = run_check(CheckOptions {
            traces: 6,
            jobs,
            ..CheckOptions::new(
                vec![backend as Arc<dyn Backend>],
                24,
                std::env::temp_dir().join("attn-diff-jobs-adapter"),
            )
        });
        let b = &run.summary.backends[0];
        assert_eq!(b.failed(), 0, "{:?}", b.failures);
        assert!(b.traces.passed > 0, "traces ran through the pool");
        without_timings(&render_json(&run.summary))
    };
    let many = summary(Arc::clone(&pooled), 2);
    assert_eq!(pooled.processes_running(), 2, "both processes were used");
    if let Some(d) = first_difference(&many, &summary(adapter(1), 1), "") {
        panic!("a pool of two processes changed the summary at {d}");
    }
}
