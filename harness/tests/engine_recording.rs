//! A real engine's recorded attention calls (fixtures/engine: vLLM's CPU engine serving a
//! tiny random-weight Llama under chunked prefill, recorded by `attn-diff record`): the
//! engine's own outputs and every built-in backend judged on them, failures shrunk with
//! their real values, and malformed recordings refused by file and field.

mod support;

use attn_backends::Backend;
use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::CheckOptions;
use attn_harness::pipeline::recording::engine::EngineOutputs;
use attn_harness::pipeline::recording::{load, Recording, RecordingError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use support::{Naive, Plant};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/engine/llama-gqa-chunked-prefill")
}

fn recording() -> Recording {
    load(&fixture()).expect("the checked-in recording reads")
}

/// A check of `recording`'s calls on `backends` and the engine's own outputs.
fn check(recording: &Recording, mut backends: Vec<Arc<dyn Backend>>, out: &str) -> CheckOptions {
    for e in EngineOutputs::of(&recording.calls) {
        backends.push(Arc::new(e));
    }
    CheckOptions {
        traces: 0,
        pairs: 0,
        recorded: recording.calls.clone(),
        ..CheckOptions::new(backends, 0, std::env::temp_dir().join(out))
    }
}

#[test]
fn the_fixture_holds_what_the_engine_really_ran() {
    let r = recording();
    assert!(r.calls.len() >= 4, "{} calls", r.calls.len());
    assert_eq!(r.engines[0].backends, ["CPUAttentionBackendImpl"]);
    // Chunked prefill: some call has a sequence with context and several new tokens, some
    // batch mixes sequences, and GQA groups of two.
    let cases: Vec<_> = r.calls.iter().map(|c| &c.case).collect();
    assert!(cases
        .iter()
        .any(|c| (0..c.num_seqs()).any(|s| c.context_len(s) > 0 && c.batch.query_lens[s] > 1)));
    assert!(cases.iter().any(|c| c.num_seqs() > 1));
    assert!(cases
        .iter()
        .all(|c| c.config.num_heads == 2 * c.config.num_kv_heads));
}

#[test]
fn the_engine_and_every_builtin_backend_are_judged_on_every_recorded_call() {
    let r = recording();
    let builtin = attn_backends::all_backends();
    let run = run_check(check(&r, builtin.clone(), "attn-diff-engine-all"));
    for (i, b) in run.summary.backends.iter().enumerate() {
        println!(
            "{}: {} recorded calls, {} passed, {} failed, {} declined",
            b.backend.name,
            b.recorded.sent,
            b.recorded.passed,
            b.recorded.failed,
            b.recorded.declined
        );
        for f in &b.failures {
            println!("{}", f.text);
        }
        assert_eq!(b.recorded.sent, r.calls.len(), "{}", b.backend.name);
        // Declined: only the calls outside what the backend declares (spyre-device runs
        // f16 alone; the recording is bf16).
        let outside = builtin.get(i).map_or(0, |backend| {
            let space = attn_backends::declared_space(backend.as_ref());
            r.calls
                .iter()
                .filter(|c| space.admits(&c.case).is_err())
                .count()
        });
        assert_eq!(
            b.recorded.declined, outside,
            "{}: {:?}",
            b.backend.name, b.unsupported
        );
        assert_eq!(b.failed(), 0, "{}", b.backend.name);
    }
    let reached_all = |name: &str| {
        let b = run
            .summary
            .backends
            .iter()
            .find(|b| b.backend.name == name)
            .unwrap();
        assert_eq!(b.recorded.passed, r.calls.len(), "{name}");
    };
    reached_all("cpu");
    reached_all("engine:CPUAttentionBackendImpl");
    #[cfg(feature = "spyre")]
    {
        reached_all("spyre-native");
        reached_all("spyre-sdpa");
    }
}

#[test]
fn an_engine_output_off_by_a_row_is_a_failure_reported_as_found() {
    let mut r = recording();
    // Call 0's output with its first token's first head zeroed: what a backend that skips a
    // row writes.
    let victim = r
        .calls
        .iter()
        .position(|c| c.output.iter().take(8).any(|&v| v.abs() > 1e-2))
        .unwrap();
    let d = r.calls[victim].case.config.head_size_v();
    r.calls[victim].output[..d].fill(0.0);
    let run = run_check(check(&r, Vec::new(), "attn-diff-engine-planted"));
    let engine = &run.summary.backends[0];
    assert_eq!(engine.recorded.failed, 1, "{engine:#?}");
    let f = &engine.failures[0];
    println!("{}", f.text);
    assert!(f.text.contains(&r.calls[victim].file), "{}", f.text);
    // The engine never ran a smaller form: nothing smaller was accepted.
    assert_eq!(f.shrink.as_ref().map_or(0, |s| s.accepted), 0);
}

#[test]
fn a_wrong_head_mapping_shrinks_to_one_sequence_with_its_real_values() {
    // The calls that batch several sequences: a shrink has something to drop.
    let mut r = recording();
    r.calls.retain(|c| c.case.num_seqs() > 1);
    assert!(!r.calls.is_empty());
    let bad = Naive::with(
        "naive-gqa-modulo",
        Plant {
            gqa_modulo: true,
            ..Plant::default()
        },
    );
    let run = run_check(check(&r, vec![Arc::new(bad)], "attn-diff-engine-gqa"));
    let b = &run.summary.backends[0];
    assert!(b.recorded.failed > 0, "{b:#?}");
    assert_eq!(
        b.failures.len(),
        1,
        "one cause, one class: {:#?}",
        b.failures
    );
    let f = &b.failures[0];
    println!("{}", f.text);
    assert_eq!(f.size.sequences, 1, "{}", f.text);
    assert!(
        f.shrink.as_ref().is_some_and(|s| s.accepted > 0),
        "{}",
        f.text
    );
    // The shrunk case's queries are rows the engine really computed with.
    let replay = f.replay.as_ref().expect("a replay file");
    run.write_artifacts();
    let shrunk = attn_reference::Case::from_json(&std::fs::read_to_string(replay).unwrap())
        .expect("the replay file is a case");
    // Its context too: the K/V the engine's blocks held.
    let context = &shrunk.tensors.context_key[0];
    assert!(!context.is_empty());
    assert!(r.calls.iter().any(|c| c
        .case
        .tensors
        .context_key
        .iter()
        .any(|k| k.starts_with(context))));
    let width = shrunk.config.num_heads * shrunk.config.head_size;
    let row = &shrunk.tensors.query[..width];
    assert!(
        r.calls
            .iter()
            .any(|c| c.case.tensors.query.chunks(width).any(|q| q == row)),
        "the shrunk case's first query row is none of the recording's"
    );
}

#[test]
fn malformed_recordings_are_refused_by_file_and_field() {
    let dir = std::env::temp_dir().join(format!("attn-diff-bad-recording-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("calls")).unwrap();
    // No engine manifest: not a recording.
    let e = load(&dir).unwrap_err();
    assert!(matches!(e, RecordingError::NoEngine { .. }), "{e}");
    // An engine that recorded nothing says what it left out.
    std::fs::write(
        dir.join("engine-7.json"),
        r#"{"schema": "attn-diff-engine/1", "pid": 7, "vllm": "0.32.0", "recorded": 0,
            "left_out": {"KV-cache dtype fp8 (recorded: the model's dtype)": 12}}"#,
    )
    .unwrap();
    let e = load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("recorded no calls") && e.contains("12 × KV-cache dtype fp8"),
        "{e}"
    );
    // A call whose case names a block past its cache.
    let good = std::fs::read_dir(fixture().join("calls"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .min()
        .unwrap();
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&good).unwrap()).unwrap();
    doc["case"]["layout"]["block_table"][0][0] = serde_json::json!(100000);
    std::fs::write(dir.join("calls/bad-block.json"), doc.to_string()).unwrap();
    let e = load(&dir).unwrap_err().to_string();
    assert!(e.contains("bad-block.json") && e.contains("block"), "{e}");
    // An output of the wrong length.
    std::fs::remove_file(dir.join("calls/bad-block.json")).unwrap();
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&good).unwrap()).unwrap();
    doc["output"].as_array_mut().unwrap().pop();
    std::fs::write(dir.join("calls/short.json"), doc.to_string()).unwrap();
    let e = load(&dir).unwrap_err().to_string();
    assert!(e.contains("short.json") && e.contains("output:"), "{e}");
    // A field of the wrong type, named by its path.
    doc["case"]["config"]["head_size"] = serde_json::json!("x");
    std::fs::write(dir.join("calls/short.json"), doc.to_string()).unwrap();
    let e = load(&dir).unwrap_err().to_string();
    assert!(e.contains("case.config.head_size"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_recording_on_the_command_line_judges_every_call_and_nothing_else() {
    let out = std::env::temp_dir().join(format!("attn-diff-engine-cli-{}", std::process::id()));
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args([
            "check",
            "--backend",
            "cpu",
            "--format",
            "json",
            "-q",
            "--recording",
        ])
        .arg(fixture())
        .arg("--out")
        .arg(&out)
        .output()
        .expect("attn-diff runs");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s: attn_results::CheckSummary = serde_json::from_slice(&o.stdout).unwrap();
    let calls = recording().calls.len();
    let names: Vec<&str> = s.backends.iter().map(|b| b.backend.name.as_str()).collect();
    assert_eq!(names, ["cpu", "engine:CPUAttentionBackendImpl"]);
    for b in &s.backends {
        assert_eq!(
            (b.recorded.sent, b.recorded.passed),
            (calls, calls),
            "{}",
            b.backend.name
        );
        // A recording replaces drawn cases.
        assert_eq!(
            b.property.sent + b.traces.sent + b.pairs.sent + b.upstream.sent,
            0
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_command_that_records_nothing_fails_and_says_so() {
    let out = std::env::temp_dir().join(format!("attn-diff-record-none-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // A command that runs no engine: the recorder never loads.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args(["record", "--out"])
        .arg(&out)
        .args(["--", "true"])
        .output()
        .expect("attn-diff runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no engine-PID.json"), "{stderr}");
    let _ = std::fs::remove_dir_all(&out);
}
