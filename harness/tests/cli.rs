//! The binary's contract: exit codes and messages for bad input, never a panic.

use std::path::PathBuf;
use std::process::{Command, Output};

fn attn_diff(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args(args)
        .output()
        .expect("attn-diff runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn valid_case() -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/regressions/padding_rows_and_partial_blocks.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attn-diff-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A replay file with one edit must exit 2 naming `needle`, without panicking.
fn rejects(name: &str, edit: impl FnOnce(&mut serde_json::Value), needle: &str) {
    let mut v = valid_case();
    edit(&mut v);
    let p = temp_file(&format!("{name}.json"), &v.to_string());
    let o = attn_diff(&["replay", p.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{name}: {err}");
    assert!(
        err.contains(needle),
        "{name}: expected `{needle}` in: {err}"
    );
    assert!(!err.contains("panicked"), "{name}: {err}");
}

#[test]
fn bad_replay_files_exit_2_naming_the_field() {
    rejects(
        "query_len_zero",
        |v| v["batch"]["query_lens"][0] = 0.into(),
        "batch.query_lens[0] is 0",
    );
    rejects(
        "query_len_past_seq",
        |v| v["batch"]["query_lens"][1] = 9.into(),
        "batch.query_lens[1]",
    );
    rejects(
        "heads_not_multiple",
        |v| v["config"]["num_kv_heads"] = 4.into(),
        "config.num_heads (6) is not a multiple of config.num_kv_heads (4)",
    );
    rejects(
        "head_size_zero",
        |v| v["config"]["head_size"] = 0.into(),
        "config.head_size",
    );
    rejects(
        "block_past_cache",
        |v| v["layout"]["block_table"][0][0] = 999.into(),
        "layout.block_table[0][0] = 999",
    );
    rejects(
        "row_too_short",
        |v| v["layout"]["block_table"] = serde_json::json!([[1], [2], [3]]),
        "layout.block_table[0] has 1 blocks",
    );
    rejects(
        "duplicate_slot",
        |v| v["layout"]["slot_mapping"][1] = v["layout"]["slot_mapping"][0].clone(),
        "layout.slot_mapping[1]",
    );
    rejects(
        "slot_disagrees",
        |v| v["layout"]["slot_mapping"][0] = 1.into(),
        "layout.slot_mapping[0] = 1",
    );
    rejects(
        "window_zero",
        |v| v["config"]["sliding_window"] = 0.into(),
        "config.sliding_window",
    );
    rejects(
        "tensor_too_short",
        |v| v["tensors"]["query"].as_array_mut().unwrap().truncate(3),
        "tensors.query has 3 entries",
    );
    rejects(
        "negative_length",
        |v| v["batch"]["seq_lens"][0] = (-3).into(),
        "invalid value: integer `-3`",
    );
    rejects(
        "wrong_type",
        |v| v["config"]["dtype"] = "int8".into(),
        "unknown variant `int8`",
    );
    rejects(
        "nan_as_null",
        |v| v["tensors"]["key"][0] = serde_json::Value::Null,
        "invalid type: null",
    );
    rejects(
        "unknown_field",
        |v| v["batch"]["extra"] = 1.into(),
        "unknown field `extra`",
    );
    rejects(
        "huge_cache",
        |v| v["layout"]["num_blocks"] = u64::MAX.into(),
        "layout.num_blocks is too large",
    );
}

#[test]
fn unreadable_and_truncated_inputs_exit_2() {
    let dir = std::env::temp_dir();
    let o = attn_diff(&["replay", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("is a directory"), "{}", stderr(&o));

    let o = attn_diff(&["replay", "/nonexistent/replay.json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read"), "{}", stderr(&o));

    let text = valid_case().to_string();
    let p = temp_file("truncated.json", &text[..text.len() / 2]);
    let o = attn_diff(&["replay", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("malformed case JSON at line 1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn unknown_names_and_bad_flags_exit_2() {
    let o = attn_diff(&["check", "--backend", "no-such-backend", "--cases", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown backend `no-such-backend`"),
        "{}",
        stderr(&o)
    );

    let o = attn_diff(&["check", "--spec", "tiny_decode", "--cases", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown spec `tiny_decode`"),
        "{}",
        stderr(&o)
    );

    let o = attn_diff(&["check", "--shard", "3/2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("0 <= I < N"), "{}", stderr(&o));
}

#[test]
fn list_names_specs() {
    let o = attn_diff(&["list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for s in attn_reference::specs::spec_names() {
        assert!(out.contains(s), "{s} missing from list");
    }
}

/// The case of the issue: it passed validation, and `cpu` then tried to allocate a 633 TB
/// cache and aborted (exit 134). Replay refuses it as a usage error naming the field.
#[test]
fn a_replay_file_whose_cache_no_machine_holds_exits_2_naming_num_blocks() {
    let config = attn_reference::AttentionConfig::new(8, 8, 576, 256, attn_reference::DType::F32);
    let mut case = attn_reference::build_case(
        &[1],
        &[1],
        config,
        1,
        &attn_reference::BuildOptions::default(),
    );
    case.layout.num_blocks = 67_108_864;
    let p = temp_file("cache_633tb.json", &serde_json::to_string(&case).unwrap());
    for backend in ["cpu", "spyre-native"] {
        let o = attn_diff(&["replay", p.to_str().unwrap(), "--backend", backend]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{backend}: {err}");
        assert!(
            err.contains("layout.num_blocks is too large") && err.contains("64.0 GiB"),
            "{err}"
        );
    }
}

/// Run attn-diff with a stdout whose reading end is already closed: every write gets EPIPE.
fn with_closed_stdout(args: &[&str]) -> Output {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just made and are owned here alone.
    let (read, write) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    drop(read);
    Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args(args)
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("attn-diff runs")
}

/// `attn-diff list | head -1`: a reader that stops reading ends the program quietly, exit 0,
/// for every command that prints (it used to panic with exit 101).
#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/regressions/padding_rows_and_partial_blocks.json");
    let fixture = fixture.to_str().unwrap();
    let runs: [&[&str]; 6] = [
        &["list"],
        &["list", "--format", "json"],
        &["--help"],
        &["replay", fixture, "--backend", "cpu"],
        &[
            "check",
            "--backend",
            "cpu",
            "--cases",
            "2",
            "--traces",
            "1",
            "-q",
        ],
        &[
            "bench",
            "--backend",
            "cpu",
            "--spec",
            "small_decode",
            "--reps",
            "1",
            "-q",
        ],
    ];
    for args in runs {
        let o = with_closed_stdout(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Names that are almost right get a suggestion: an adapter's name without `external:`, a
/// typo in a backend or spec.
#[test]
fn near_misses_are_suggested() {
    let config = repo().join("attn-diff.toml");
    let config = config.to_str().unwrap();
    let o = attn_diff(&[
        "check",
        "--backend",
        "numpy-ref",
        "--config",
        config,
        "--cases",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("did you mean `external:numpy-ref`?"),
        "{}",
        stderr(&o)
    );
    let o = attn_diff(&["replay", "x.json", "--backend", "cpuu"]);
    assert!(stderr(&o).contains("cannot read"), "{}", stderr(&o));
    let o = attn_diff(&["check", "--backend", "cpuu", "--cases", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("did you mean `cpu`?"), "{}", stderr(&o));
    let o = attn_diff(&[
        "check",
        "--backend",
        "cpu",
        "--spec",
        "small_decod",
        "--cases",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("did you mean `small_decode`?"),
        "{}",
        stderr(&o)
    );
    let o = attn_diff(&["bench", "--backend", "cpu", "--spec", "large_decod"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("did you mean `large_decode`?"),
        "{}",
        stderr(&o)
    );
}

/// A build without the mutants says how to get them, instead of "unrecognized subcommand".
#[cfg(not(feature = "mutants"))]
#[test]
fn mutants_without_the_feature_say_how_to_build_them() {
    let o = attn_diff(&["mutants", "--cases", "3"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--features mutants"), "{}", stderr(&o));
}

/// `--config FILE` that is not there is an error even when no adapter is named (check used
/// to ignore it).
#[test]
fn a_missing_config_file_is_an_error() {
    for args in [
        &["check", "--backend", "cpu", "--cases", "1", "--traces", "0"][..],
        &[
            "bench",
            "--backend",
            "cpu",
            "--spec",
            "small_decode",
            "--reps",
            "1",
        ],
        &["list"],
    ] {
        let mut args = args.to_vec();
        args.extend(["--config", "/nonexistent/attn-diff.toml"]);
        let o = attn_diff(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("cannot read /nonexistent/attn-diff.toml"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}

/// `list` fits a 100-column terminal (it was about 390 wide).
#[test]
fn list_fits_100_columns() {
    let config = repo().join("attn-diff.toml");
    let o = attn_diff(&["list", "--config", config.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for line in out.lines() {
        assert!(
            line.chars().count() <= 100,
            "{} wide: {line}",
            line.chars().count()
        );
    }
    for needle in ["cpu", "external:numpy-ref", "large_decode", "[2048×32]"] {
        assert!(out.contains(needle), "{needle} missing from\n{out}");
    }
}

/// A JSON mistake names the field path, not only a line and column.
#[test]
fn json_errors_name_the_field_path() {
    rejects(
        "head_size_string",
        |v| v["config"]["head_size"] = "x".into(),
        "config.head_size: invalid type: string \"x\"",
    );
    rejects(
        "slot_as_float",
        |v| v["layout"]["slot_mapping"][2] = 1.5.into(),
        "layout.slot_mapping[2]: invalid type: floating point",
    );
}

fn trace_file() -> PathBuf {
    let trace = attn_reference::trace::generate(&attn_reference::TraceRecipe {
        config: attn_reference::AttentionConfig::new(2, 1, 4, 2, attn_reference::DType::F32),
        prompts: vec![5, 3],
        outputs: vec![2, 1],
        sharing: 0,
        shared_prefix: 0,
        chunk: 3,
        token_budget: 6,
        max_running: 2,
        cache_blocks: 6,
        max_steps: 8,
        seed: 2,
        poison: None,
        masks: None,
    });
    temp_file("a_trace.json", &serde_json::to_string(&trace).unwrap())
}

/// `export --case` of a trace file says what the file is (it said "unknown field").
#[test]
fn export_of_a_trace_file_says_it_is_a_trace() {
    let trace = trace_file();
    let out = trace.with_extension("safetensors");
    let o = attn_diff(&[
        "export",
        "--case",
        trace.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is a trace file"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("unknown field"), "{}", stderr(&o));
}

/// `--backend cpu,cpu` runs cpu once, in the order given.
#[test]
fn a_backend_named_twice_runs_once() {
    let fixture = repo().join("fixtures/regressions/padding_rows_and_partial_blocks.json");
    let o = attn_diff(&[
        "replay",
        fixture.to_str().unwrap(),
        "--backend",
        "cpu,spyre-native,cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<&str> = out.lines().filter(|l| l.contains(": pass")).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows[0].starts_with("cpu:") && rows[1].starts_with("spyre-native:"),
        "{out}"
    );
}

/// A check prunes the failure files of runs before the last one that wrote into its folder:
/// only files attn-diff wrote (listed in the folder's registry, or named as it names
/// failures), never a file of the user's.
#[test]
fn check_prunes_failure_files_of_older_runs() {
    let dir = std::env::temp_dir().join(format!("attn-diff-prune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let files = [
        "older-upstream.json",
        "cpu-seed1-case4.json",
        "cpu-seed1-case4.png",
        "last-upstream.json",
        "cpu-seed2-case0.json",
        "notes.json",
    ];
    for f in files {
        std::fs::write(dir.join(f), "{}").unwrap();
    }
    std::fs::write(
        dir.join(attn_harness::artifacts::REGISTRY),
        "1-10\tolder-upstream.json\n2-20\tlast-upstream.json\n2-20\tcpu-seed2-case0.json\n",
    )
    .unwrap();
    let o = attn_diff(&[
        "check",
        "--backend",
        "cpu",
        "--cases",
        "1",
        "--traces",
        "0",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let left: std::collections::BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let want: std::collections::BTreeSet<String> = [
        "last-upstream.json",
        "cpu-seed2-case0.json",
        "notes.json",
        attn_harness::artifacts::REGISTRY,
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(left, want);
    std::fs::remove_dir_all(&dir).unwrap();
}
