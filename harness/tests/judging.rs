//! What a run says about how it judged: the policy (`--judge`) in every format and in every
//! report and replay line, and the error figures (NMSE, ulps, the multiple of eager
//! attention's error) beside the verdict in text, JSON, markdown and JUnit.

use std::path::PathBuf;
use std::process::{Command, Output};

fn attn_diff(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args(args)
        .output()
        .expect("attn-diff runs")
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("attn-diff-judging-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn check(backend: &str, judge: &str, format: &str, dir: &std::path::Path) -> Output {
    attn_diff(&[
        "check",
        "--backend",
        backend,
        "--cases",
        "40",
        "--traces",
        "2",
        "--judge",
        judge,
        "--format",
        format,
        "--out",
        dir.to_str().unwrap(),
        "-q",
    ])
}

#[test]
fn every_format_says_which_policy_judged_and_gives_the_figures() {
    let dir = out_dir("formats");
    let o = check("cpu", "tolerance", "json", &dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["judge"]["policy"], "tolerance");
    let figures = s["backends"][0]["figures"].as_array().expect("figures");
    let dtypes: Vec<&str> = figures
        .iter()
        .map(|f| f["dtype"].as_str().unwrap())
        .collect();
    assert!(
        dtypes.contains(&"bf16") && dtypes.contains(&"f16"),
        "{dtypes:?}"
    );
    for f in figures {
        let nmse = f["sum_sq_err"].as_f64().unwrap() / f["sum_sq_exact"].as_f64().unwrap();
        // A correct kernel: far below the error a wrong one makes (1e-2 and up).
        assert!(nmse < 1e-5, "{f}");
        assert!(f["outputs"].as_u64().unwrap() > 0, "{f}");
        if f["dtype"] != "f32" {
            // `cpu` accumulates in f32: more accurate than eager attention in the dtype.
            let mean = (f["eager_log_ratio_sum"].as_f64().unwrap()
                / f["eager_outputs"].as_f64().unwrap())
            .exp();
            assert!(mean < 1.0, "{f}");
        }
    }
    let text =
        String::from_utf8_lossy(&check("cpu", "tolerance", "text", &dir).stdout).into_owned();
    assert!(
        text.contains("judged by attn-diff's tolerance per dtype"),
        "{text}"
    );
    assert!(text.contains("cpu: bf16: NMSE"), "{text}");
    let md =
        String::from_utf8_lossy(&check("cpu", "tolerance", "markdown", &dir).stdout).into_owned();
    assert!(md.contains("judged by") && md.contains("NMSE"), "{md}");
    let junit = String::from_utf8_lossy(&check("cpu", "ladder", "junit", &dir).stdout).into_owned();
    assert!(
        junit.contains("<property name=\"judge\" value=\"ladder:2:every-op\"/>"),
        "{junit}"
    );
    assert!(junit.contains("<property name=\"bf16.nmse\""), "{junit}");
    assert!(
        junit.contains("<property name=\"bf16.error_vs_eager_mean\""),
        "{junit}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_policy_exits_2_naming_what_is_wrong() {
    for (bad, says) in [
        ("exact", "expected `tolerance`"),
        ("ladder:0.5", "not a number >= 1"),
        ("ladder:2:nope", "no rung `nope`"),
    ] {
        let o = attn_diff(&["check", "--backend", "cpu", "--judge", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{bad}: {err}");
    }
}

/// The ladder's verdict: a kernel with q.k in bf16 passes `--judge ladder` (eager attention
/// in bf16 rounds its scores too) but fails when held to twice the f32 computation's error;
/// the report and its replay line say the ladder judged, and the replay file keeps the
/// policy so a replay without it is warned.
#[cfg(feature = "mutants")]
#[test]
fn a_ladder_verdict_is_reported_and_replayed_as_such() {
    let dir = out_dir("ladder");
    let o = check("mutant:scores-in-dtype", "ladder:2:f32", "json", &dir);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["judge"]["policy"], "ladder");
    assert_eq!(s["judge"]["rung"], "f32");
    let failures = s["backends"][0]["failures"].as_array().unwrap();
    // The upstream suite keeps vLLM's tolerance and says so; property cases the ladder's.
    for f in failures
        .iter()
        .filter(|f| f["origin"]["kind"] == "upstream")
    {
        assert!(f["judge"].is_null(), "{f}");
        assert!(
            f["text"].as_str().unwrap().contains("by vLLM's tolerance"),
            "{f}"
        );
    }
    let f = failures
        .iter()
        .find(|f| f["origin"]["kind"] == "property")
        .expect("a property case diverged");
    assert_eq!(f["judge"]["policy"], "ladder", "{f}");
    let text = f["text"].as_str().unwrap();
    assert!(text.contains("by the precision ladder"), "{text}");
    assert!(text.contains("--judge ladder:2:f32"), "{text}");
    let replay = f["replay"].as_str().unwrap();
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(replay).unwrap()).unwrap();
    assert_eq!(file["recorded"]["judge"]["policy"], "ladder");
    let again = attn_diff(&["replay", replay, "--judge", "ladder:2:f32"]);
    assert_eq!(
        again.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
    let plain = attn_diff(&["replay", replay]);
    let warned = String::from_utf8_lossy(&plain.stderr);
    assert!(warned.contains("add --judge ladder:2:f32"), "{warned}");
    // The same kernel is no worse than eager attention in bf16: the default ladder passes
    // its property cases.
    let eager = check("mutant:scores-in-dtype", "ladder", "json", &dir);
    let s: serde_json::Value = serde_json::from_slice(&eager.stdout).unwrap();
    assert_eq!(
        s["backends"][0]["property"]["failed"], 0,
        "{}",
        s["backends"][0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
