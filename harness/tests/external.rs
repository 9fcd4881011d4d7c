//! External backends through a real process boundary: the numpy reference adapter passes,
//! a planted bug is shrunk to a minimal case, and crashes, hangs and malformed replies are
//! divergences of their own kinds that leave no process behind.
//!
//! Needs `python3` with `numpy` and `safetensors`: `cargo xtask setup` provisions them in a
//! virtual environment linked as `.python-env`, which these tests use when it is there.

use attn_backends::external::{AdapterSpec, ExternalBackend};
use attn_backends::Backend;
use attn_harness::external::adapter_python;
use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::CheckOptions;
use attn_harness::pipeline::runner::{evaluate, DivergenceKind, Outcome};
use attn_harness::pipeline::shrink::ShrinkBudget;
use attn_reference::{build_case, reference_output, AttentionConfig, BuildOptions, Case, DType};
use attn_results::compare::Tolerance;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Tests here run one at a time, so "no adapter process is left" means this test's.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let ok = Command::new(python())
        .args(["-c", "import numpy, safetensors"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "these tests need python3 with numpy and safetensors: `cargo xtask setup` provisions them"
    );
    guard
}

/// The Python the adapters were set up for.
fn python() -> String {
    adapter_python(&repo())
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn misbehaving(mode: &str, marker: &str) -> AdapterSpec {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/adapters/misbehaving.py");
    AdapterSpec::new(
        mode,
        vec![
            python(),
            script.display().to_string(),
            mode.into(),
            marker.into(),
        ],
    )
}

/// Property cases only: these tests count cases (traces through adapters have their own).
fn options(backend: Arc<dyn Backend>, cases: u32, out: &str, shrink: ShrinkBudget) -> CheckOptions {
    CheckOptions {
        shrink,
        traces: 0,
        ..CheckOptions::new(vec![backend], cases, std::env::temp_dir().join(out))
    }
}

fn small_case(seqs: usize) -> Case {
    let config = AttentionConfig::new(4, 2, 8, 4, DType::F32);
    let seq_lens: Vec<usize> = (0..seqs).map(|s| 5 + 3 * s).collect();
    let query_lens: Vec<usize> = (0..seqs).map(|s| 1 + s).collect();
    build_case(&seq_lens, &query_lens, config, 7, &BuildOptions::default())
}

fn run(backend: &dyn Backend, case: &Case) -> Outcome {
    let e = reference_output(case);
    evaluate(backend, case, &e, Tolerance::for_case(case)).0
}

fn kind(o: &Outcome) -> Option<DivergenceKind> {
    match o {
        Outcome::Diverged(d) => Some(d.kind),
        _ => None,
    }
}

fn message(o: &Outcome) -> String {
    match o {
        Outcome::Diverged(d) => d.message.clone(),
        other => format!("{other:?}"),
    }
}

/// Processes whose command line contains `marker`, and zombie children of this process.
fn leftovers(marker: &str) -> (Vec<String>, Vec<u32>) {
    let me = std::process::id();
    let mut alive = Vec::new();
    let mut zombies = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return (alive, zombies);
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            alive.push(format!("{pid}: {cmdline}"));
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // "pid (comm) STATE PPID ...": the fields after the last ')'.
        let rest: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(vec![], |(_, r)| r.split_whitespace().collect());
        if rest.first() == Some(&"Z") && rest.get(1) == Some(&me.to_string().as_str()) {
            zombies.push(pid);
        }
    }
    (alive, zombies)
}

#[test]
fn numpy_reference_passes_check_through_the_binary() {
    let _g = serial();
    let out = std::env::temp_dir().join("attn-diff-external-numpy");
    let o = Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args([
            "check",
            "--backend",
            "external:numpy-ref",
            "--cases",
            "150",
            "--config",
        ])
        .arg(repo().join("attn-diff.toml"))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("attn-diff runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("external:numpy-ref"), "{stdout}");
    assert!(stdout.contains("all passed"), "{stdout}");
}

/// `bench` runs an adapter beside a built-in backend in one run, checks its output against
/// the oracle and times it by the kernel time it reports.
#[test]
fn bench_runs_an_adapter_beside_a_builtin_backend() {
    let _g = serial();
    let o = Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args([
            "bench",
            "--backend",
            "cpu,external:numpy-ref",
            "--spec",
            "small_decode",
            "--heads",
            "4,2",
            "--head-size",
            "16",
            "--reps",
            "2",
            "--threads",
            "1",
            "--format",
            "json",
            "-q",
            "--config",
        ])
        .arg(repo().join("attn-diff.toml"))
        .output()
        .expect("attn-diff runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    let summary: attn_results::BenchSummary =
        attn_results::from_json(&stdout).expect("a bench document");
    let row = |name: &str| {
        summary
            .rows
            .iter()
            .find(|r| r.backend.name == name)
            .unwrap_or_else(|| panic!("no row for {name}: {stdout}"))
    };
    let external = row("external:numpy-ref");
    assert_eq!(external.status, attn_results::BenchStatus::Ok, "{stdout}");
    assert!(external.median_ms.is_finite() && external.median_ms > 0.0);
    assert!(external.peak_extra_mib.is_nan(), "another process's memory");
    assert_eq!(row("cpu").status, attn_results::BenchStatus::Ok);
}

#[test]
fn a_planted_window_bug_is_shrunk_through_the_process_boundary() {
    let _g = serial();
    let backend = ExternalBackend::start(misbehaving("window-off-by-one", "planted-marker"))
        .expect("adapter starts");
    let s = run_check(options(
        Arc::new(backend),
        300,
        "attn-diff-external-planted",
        ShrinkBudget::default(),
    ));
    let b = &s.summary.backends[0];
    assert_eq!(
        b.backend,
        attn_results::BackendId::new(
            "external:window-off-by-one",
            attn_results::BackendRole::External
        )
    );
    assert!(
        b.failed() > 0,
        "planted bug survived {} cases",
        b.property.sent
    );
    let f = &b.failures[0];
    println!("{}", f.text);
    assert_eq!(f.kind, DivergenceKind::Mismatch, "{}", f.text);
    assert!(f.shrink.is_some(), "{}", f.text);
    assert_eq!(f.size.sequences, 1, "{}", f.text);
    assert!(f.size.max_seq_len <= 3, "{}", f.text);
    assert_eq!(f.size.kv_heads, 1, "{}", f.text);
    assert!(f.size.head_size <= 2, "{}", f.text);
    assert!(f.text.contains("window="), "{}", f.text);
    assert!(
        f.text.contains("--backend external:window-off-by-one"),
        "{}",
        f.text
    );
}

#[test]
fn a_crashing_adapter_is_restarted_and_the_run_continues() {
    let _g = serial();
    let backend = Arc::new(
        ExternalBackend::start(misbehaving("crash-on-batches", "crash-marker"))
            .expect("adapter starts"),
    );
    let shrink = ShrinkBudget {
        max_steps: 40,
        ..ShrinkBudget::default()
    };
    let s = run_check(CheckOptions {
        // Every crash is sent on: this is about restarts, not giving up.
        give_up_after: usize::MAX,
        ..options(backend.clone(), 40, "attn-diff-external-crash", shrink)
    });
    let b = &s.summary.backends[0];
    assert_eq!(b.property.sent, 40, "every case ran");
    let crashed = b.divergences.get(&DivergenceKind::Crashed).copied();
    assert!(crashed.unwrap_or(0) > 0, "{:?}", b.divergences);
    assert!(
        b.property.passed > 0,
        "single-sequence cases still pass after restarts"
    );
    // The rest are declined: the adapter has neither cross-attention nor an FP8 cache.
    let t = b.property;
    assert_eq!(t.passed + t.failed + t.declined, 40, "{b:?}");
    assert_eq!(t.declined, b.unsupported_cases(), "{b:?}");
    let f = &b.failures[0];
    println!("{}", f.text);
    assert_eq!(f.kind, DivergenceKind::Crashed);
    assert!(f.message.contains("exit status 3"), "{}", f.message);
    assert!(
        f.message.contains("planted crash on a batch of"),
        "the report ends with the adapter's stderr: {}",
        f.message
    );
    assert!(backend.starts() > 1);
}

#[test]
fn a_hanging_adapter_times_out_and_is_restarted() {
    let _g = serial();
    let mut spec = misbehaving("hang-on-batches", "hang-marker");
    spec.timeout = Duration::from_secs(1);
    let backend = ExternalBackend::start(spec).expect("adapter starts");
    assert!(matches!(run(&backend, &small_case(1)), Outcome::Pass(_)));
    let first = backend.process_id().expect("running");
    let o = run(&backend, &small_case(2));
    assert_eq!(kind(&o), Some(DivergenceKind::Timeout), "{}", message(&o));
    assert!(
        message(&o).contains("timed out after 1.0 s"),
        "{}",
        message(&o)
    );
    assert_eq!(backend.process_id(), None, "the hung adapter was killed");
    assert!(
        !PathBuf::from(format!("/proc/{first}")).exists(),
        "and reaped"
    );
    assert!(matches!(run(&backend, &small_case(1)), Outcome::Pass(_)));
    assert_eq!(backend.starts(), 2);
}

#[test]
fn malformed_replies_are_protocol_errors_naming_the_problem() {
    let _g = serial();
    // Each adapter misbehaves on batches only: the error names the problem, and the same
    // adapter still passes a one-sequence case afterwards.
    for (mode, marker, problem) in [
        (
            "wrong-shape-on-batches",
            "shape-marker",
            "tensor `output` has shape [2, 4, 8]; expected [3, 4, 8]",
        ),
        (
            "print-on-batches",
            "print-marker",
            "stdout carried text \"result: \"",
        ),
    ] {
        let backend = ExternalBackend::start(misbehaving(mode, marker)).expect("adapter starts");
        let o = run(&backend, &small_case(2));
        assert_eq!(
            kind(&o),
            Some(DivergenceKind::ProtocolError),
            "{}",
            message(&o)
        );
        assert!(message(&o).contains(problem), "{}", message(&o));
        assert!(matches!(run(&backend, &small_case(1)), Outcome::Pass(_)));
    }
}

#[test]
fn an_error_in_the_adapter_is_an_error_and_unsupported_is_counted() {
    let _g = serial();
    // A config the adapter's capabilities rule out never reaches it.
    let mut spec = misbehaving("crash-on-batches", "caps-marker");
    spec.command = vec![
        python(),
        "-c".into(),
        concat!(
            "import sys; sys.path.insert(0, sys.argv[1]);",
            "from attn_diff_adapter import *\n",
            "class A(Adapter):\n",
            "  capabilities = {'head_sizes': [8]}\n",
            "  def check(self, c):\n",
            "    if c.num_kv_heads == 2: raise Unsupported('two kv heads')\n",
            "  def new_cache(self, c, n): raise RuntimeError('planted failure')\n",
            "serve(A())\n"
        )
        .into(),
        repo().join("adapters/python").display().to_string(),
    ];
    let backend = ExternalBackend::start(spec).expect("adapter starts");
    let mut case = small_case(1);
    let o = run(&backend, &case);
    assert!(
        matches!(&o, Outcome::Unsupported(r) if r.to_string() == "two kv heads"),
        "{o:?}"
    );
    case.config.head_size = 4;
    let o = run(&backend, &case);
    assert!(
        matches!(&o, Outcome::Unsupported(r) if r.to_string().starts_with("head size 4")),
        "{o:?}"
    );
    let case = build_case(
        &[3],
        &[1],
        AttentionConfig::new(3, 3, 8, 4, DType::F32),
        1,
        &BuildOptions::default(),
    );
    let o = run(&backend, &case);
    assert_eq!(kind(&o), Some(DivergenceKind::Error), "{}", message(&o));
    assert!(message(&o).contains("planted failure"), "{}", message(&o));
    assert_eq!(backend.starts(), 1, "an error reply keeps the adapter");
}

#[test]
fn no_adapter_process_outlives_its_backend() {
    let _g = serial();
    let marker = format!("zombie-marker-{}", std::process::id());
    let mut spec = misbehaving("hang-on-batches", &marker);
    // Through a shell that waits for python: the adapter is a grandchild of attn-diff.
    let inner = spec.command.join(" ");
    spec.command = vec!["sh".into(), "-c".into(), format!("{inner}; echo done >&2")];
    spec.timeout = Duration::from_millis(800);
    let backend = ExternalBackend::start(spec).expect("adapter starts");
    assert!(matches!(run(&backend, &small_case(1)), Outcome::Pass(_)));
    let o = run(&backend, &small_case(2));
    assert_eq!(kind(&o), Some(DivergenceKind::Timeout), "{}", message(&o));
    let (alive, zombies) = leftovers(&marker);
    assert!(alive.is_empty(), "a timed-out adapter left {alive:?}");
    assert!(zombies.is_empty(), "zombies: {zombies:?}");
    assert!(matches!(run(&backend, &small_case(1)), Outcome::Pass(_)));
    assert!(!leftovers(&marker).0.is_empty(), "restarted");
    drop(backend);
    let (alive, zombies) = leftovers(&marker);
    assert!(alive.is_empty(), "a dropped backend left {alive:?}");
    assert!(zombies.is_empty(), "zombies: {zombies:?}");
}

/// The interpreter with vLLM's CPU kernel: `ATTN_DIFF_VLLM_PYTHON`, else `python3`.
fn vllm_python() -> String {
    std::env::var("ATTN_DIFF_VLLM_PYTHON").unwrap_or_else(|_| "python3".into())
}

#[test]
fn vllm_cpu_attn_agrees_when_vllm_is_installed() {
    let _g = serial();
    let python = vllm_python();
    let adapter = repo().join("adapters/python/vllm_cpu_attn.py");
    let present = Command::new(&python)
        .arg(&adapter)
        .arg("--probe")
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        eprintln!(
            "SKIPPED vllm_cpu_attn_agrees_when_vllm_is_installed: `{python} \
             adapters/python/vllm_cpu_attn.py --probe` cannot load vLLM's CPU kernel (set \
             ATTN_DIFF_VLLM_PYTHON; see docs/external-backends.md); nothing was checked"
        );
        return;
    }
    let external = format!("vllm={python} '{}'", adapter.display());
    let attn_diff = |args: &[&str], features: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_attn-diff"));
        cmd.args(args)
            .args(["--backend", "external:vllm", "--external", &external]);
        if let Some(f) = features {
            cmd.env("ATTN_DIFF_VLLM_FEATURES", f);
        }
        cmd.output().expect("attn-diff runs")
    };
    // Soft-cap and poisoned memory aside (docs/findings.md: large capped logits become NaN;
    // NaN or Inf past a sequence's end reaches the output), CPU_ATTN agrees.
    let out = std::env::temp_dir().join("attn-diff-external-vllm");
    let o = attn_diff(
        &[
            "check",
            "--cases",
            "3000",
            "--seed",
            "3",
            "--no-poison",
            "--out",
            &out.display().to_string(),
        ],
        Some("sliding_window,alibi,sinks"),
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    println!("{stdout}");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The soft-cap divergence is still there: when this fails, vLLM fixed it; update
    // docs/findings.md and drop the restriction above.
    for file in [
        "vllm-cpu-attn-softcap-nan.json",
        // The value rows past a sequence's end (finding 7): when this passes, vLLM fixed it;
        // update docs/findings.md and drop --no-poison above.
        "vllm-cpu-attn-poison-value-tail-nan.json",
    ] {
        let case = repo().join("docs/findings").join(file);
        let o = attn_diff(&["replay", &case.display().to_string()], None);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(1), "{file}: {stdout}");
        assert!(
            stdout.contains("non-finite") || stdout.contains("NaN"),
            "{file}: {stdout}"
        );
    }
}

/// vLLM's CPU_MLA decode kernel (`mla_decode_kvcache`) through `vllm_cpu_mla.py`, when
/// `ATTN_DIFF_VLLM_PYTHON` has vLLM: every MLA case it declares (576/512, block 16, decode,
/// three dtypes) agrees with the oracle, the adapter declares MLA alone (so it is never sent
/// an ordinary case), and the unaligned f32 query still crashes the op (docs/findings.md,
/// finding 8).
#[test]
fn vllm_cpu_mla_agrees_when_vllm_is_installed() {
    let _g = serial();
    let python = vllm_python();
    let adapter = repo().join("adapters/python/vllm_cpu_mla.py");
    let present = Command::new(&python)
        .arg(&adapter)
        .arg("--probe")
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        eprintln!(
            "SKIPPED vllm_cpu_mla_agrees_when_vllm_is_installed: `{python} \
             adapters/python/vllm_cpu_mla.py --probe` cannot load vLLM's CPU kernel (set \
             ATTN_DIFF_VLLM_PYTHON; see docs/external-backends.md); nothing was checked"
        );
        return;
    }
    let external = format!("vllm-mla={python} '{}'", adapter.display());
    let out = std::env::temp_dir().join("attn-diff-external-vllm-mla");
    let o = Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args(["check", "--cases", "150", "--traces", "0", "--out"])
        .arg(&out)
        .args(["--backend", "external:vllm-mla", "--external", &external])
        .output()
        .expect("attn-diff runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Every case drawn for it is an MLA case it runs: none declined, none outside.
    assert!(stdout.contains("150 of 150 case(s)"), "{stdout}");
    let o = Command::new(&python)
        .arg(repo().join("docs/findings/vllm_cpu_mla_unaligned_query.py"))
        .output()
        .expect("python runs");
    assert_ne!(
        o.status.code(),
        Some(0),
        "the unaligned f32 query no longer crashes mla_decode_kvcache: vLLM fixed it; update \
         docs/findings.md (finding 8)"
    );
}

/// vllm-spyre's SpyreAttentionPaged, when `ATTN_DIFF_VLLM_SPYRE_FILE` names its
/// `spyre_paged_attn.py` and `ATTN_DIFF_VLLM_PYTHON` an interpreter with vLLM and torch
/// (docs/findings-vllm-spyre.md): the glue agrees with the oracle (`--reference`), and each
/// documented finding still reproduces from its replay file.
#[test]
fn vllm_spyre_findings_reproduce_when_installed() {
    let _g = serial();
    let python = vllm_python();
    let adapter = repo().join("adapters/python/vllm_spyre_paged.py");
    let upstream = std::env::var("ATTN_DIFF_VLLM_SPYRE_FILE").unwrap_or_default();
    let present = !upstream.is_empty()
        && Command::new(&python)
            .arg(&adapter)
            .args(["--file", &upstream, "--probe"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !present {
        eprintln!(
            "SKIPPED vllm_spyre_findings_reproduce_when_installed: set ATTN_DIFF_VLLM_SPYRE_FILE \
             to upstream's spyre_paged_attn.py and ATTN_DIFF_VLLM_PYTHON to an interpreter \
             with vLLM (docs/findings-vllm-spyre.md); nothing was checked"
        );
        return;
    }
    let attn_diff = |flags: &str, args: &[&str]| {
        let external = format!(
            "spyre={python} '{}' --file '{upstream}' {flags}",
            adapter.display()
        );
        Command::new(env!("CARGO_BIN_EXE_attn-diff"))
            .args(args)
            .args(["--backend", "external:spyre", "--external", &external])
            .output()
            .expect("attn-diff runs")
    };
    let out = std::env::temp_dir().join("attn-diff-external-spyre");
    let o = attn_diff(
        "--construct keywords --padding none --reference",
        &[
            "check",
            "--cases",
            "300",
            "--out",
            &out.display().to_string(),
        ],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "the glue diverges:\n{stdout}");
    // When one of these passes, upstream fixed it: update the findings document.
    for (flags, file) in [
        (
            "--construct keywords --mode sdpa",
            "vllm-spyre-padding-crash.json",
        ),
        (
            "--construct keywords --mode sdpa",
            "vllm-spyre-padding-overwrites-last-slot.json",
        ),
        (
            "--construct keywords --padding none",
            "vllm-spyre-native-f32-in-bf16.json",
        ),
        (
            "--construct keywords --padding none",
            "vllm-spyre-native-bf16-logits.json",
        ),
    ] {
        let case = repo().join("docs/findings").join(file);
        let o = attn_diff(flags, &["replay", &case.display().to_string()]);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{file} no longer diverges:\n{stdout}"
        );
    }
    let o = attn_diff("", &["check", "--cases", "50"]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("Sliding window not supported yet"),
        "vLLM's positional construction no longer fails (finding 1):\n{stdout}"
    );
}

fn numpy_adapter(sessions: bool) -> ExternalBackend {
    let script = repo().join("adapters/python/numpy_reference.py");
    let spec = if sessions {
        AdapterSpec::new("numpy-ref", vec![python(), script.display().to_string()])
    } else {
        // The same adapter answering protocol version 1.
        AdapterSpec::new(
            "numpy-ref-v1",
            vec![
                python(),
                "-c".into(),
                concat!(
                    "import runpy, sys; sys.argv = [sys.argv[1]];",
                    "sys.path.insert(0, __import__('os').path.dirname(sys.argv[0]));",
                    "import attn_diff_adapter; attn_diff_adapter.Adapter.sessions = False;",
                    "runpy.run_path(sys.argv[0], run_name='__main__')"
                )
                .into(),
                script.display().to_string(),
            ],
        )
    };
    ExternalBackend::start(spec).expect("adapter starts")
}

#[test]
fn a_version_2_adapter_keeps_its_cache_across_a_traces_steps() {
    use attn_harness::pipeline::runner::trace::{evaluate_trace, trace_for, TraceOutcome};
    let _g = serial();
    let backend = numpy_adapter(true);
    assert_eq!(backend.hello().version, 2);
    for index in 0..8 {
        match evaluate_trace(&backend, &trace_for(5, index)).0 {
            TraceOutcome::Pass { .. } | TraceOutcome::Unsupported(_) => {}
            TraceOutcome::Diverged { step, divergence } => {
                panic!("trace {index} step {step}: {}", divergence.message)
            }
        }
    }
    // Single cases are one-step sessions.
    assert!(matches!(run(&backend, &small_case(3)), Outcome::Pass(_)));
}

#[test]
fn a_version_1_adapter_runs_cases_and_declines_traces() {
    use attn_harness::pipeline::runner::trace::{evaluate_trace, trace_for, TraceOutcome};
    let _g = serial();
    let backend = numpy_adapter(false);
    assert_eq!(backend.hello().version, 1);
    assert!(matches!(run(&backend, &small_case(2)), Outcome::Pass(_)));
    match evaluate_trace(&backend, &trace_for(5, 0)).0 {
        TraceOutcome::Unsupported(u) => {
            assert_eq!(u.feature, attn_reference::Dimension::Trace, "{u}")
        }
        other => panic!("expected unsupported, got {other:?}"),
    }
}

/// vllm-spyre's spyre_attn.py at c6fd7f97 (the copy in fixtures/upstream/vllm-spyre/) on the
/// adapter's CPU stand-in for the Spyre device: upstream's space is declared (float16, head
/// sizes multiple of 64, one sequence per step), the glue agrees with the oracle, and the
/// divergences of docs/findings-vllm-spyre.md are still there.
#[test]
fn vllm_spyre_attn_findings_reproduce_when_installed() {
    let _g = serial();
    let python = vllm_python();
    let adapter = repo().join("adapters/python/vllm_spyre_paged.py");
    let upstream = repo().join("fixtures/upstream/vllm-spyre/spyre_attn.py");
    let probe = match Command::new(&python)
        .arg(&adapter)
        .arg("--file")
        .arg(&upstream)
        .arg("--probe")
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => {
            eprintln!(
                "SKIPPED vllm_spyre_attn_findings_reproduce_when_installed: set \
                 ATTN_DIFF_VLLM_PYTHON to an interpreter with vLLM (docs/findings-vllm-spyre.md); \
                 nothing was checked"
            );
            return;
        }
    };
    assert!(
        probe.contains(
            "{'dtypes': ['f16'], 'head_size_multiple_of': 64, 'kinds': ['decoder'], \
             'features': [], 'max_seqs': 1}"
        ),
        "upstream's declared space changed:\n{probe}"
    );
    let attn_diff = |flags: &str, args: &[&str]| {
        let external = format!(
            "spyre={python} '{}' --file '{}' {flags}",
            adapter.display(),
            upstream.display()
        );
        Command::new(env!("CARGO_BIN_EXE_attn-diff"))
            .args(args)
            .args(["--backend", "external:spyre", "--external", &external])
            .output()
            .expect("attn-diff runs")
    };
    let out = std::env::temp_dir().join("attn-diff-external-spyre-attn");
    let o = attn_diff(
        "--padding none --reference",
        &[
            "check",
            "--cases",
            "100",
            "--traces",
            "20",
            "--out",
            &out.display().to_string(),
        ],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "the glue diverges:\n{stdout}");
    assert!(
        stdout.contains("max_seqs=1"),
        "one sequence per step not declared:\n{stdout}"
    );
    assert!(
        !stdout.contains("AssertionError"),
        "a case reached upstream's assert:\n{stdout}"
    );
    let replays = repo().join("fixtures/upstream/vllm-spyre/replays");
    // When one of these passes, upstream fixed it: update the findings document.
    for (flags, file, code) in [
        ("--padding none", "spyre-attn-f16-scores.json", 1),
        ("", "spyre-attn-padding-crash.json", 1),
        ("", "spyre-attn-padding-overwrites-last-slot.json", 1),
        ("--padding none", "spyre-attn-masked-overflow.json", 1),
        // The SDPA path keeps its scores in float32: it passes both.
        (
            "--padding none --mode sdpa --construct keywords",
            "spyre-attn-f16-scores.json",
            0,
        ),
        (
            "--padding none --mode sdpa --construct keywords",
            "spyre-attn-masked-overflow.json",
            0,
        ),
    ] {
        let case = replays.join(file);
        let o = attn_diff(flags, &["replay", &case.display().to_string()]);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(code), "{file} [{flags}]:\n{stdout}");
    }
}

/// The same c6fd7f97 file through the one route for every Spyre generation,
/// `vllm_backend.py --selection platform`: the same declared space, and its findings reproduce.
#[test]
fn vllm_spyre_attn_findings_reproduce_through_vllm_backend() {
    let _g = serial();
    let python = vllm_python();
    let adapter = repo().join("adapters/python/vllm_backend.py");
    let upstream = repo().join("fixtures/upstream/vllm-spyre/spyre_attn.py");
    let route = format!(
        "{python} '{}' --file '{}' --selection platform",
        adapter.display(),
        upstream.display()
    );
    let Some(probe) = probe_route(&route) else {
        eprintln!(
            "SKIPPED vllm_spyre_attn_findings_reproduce_through_vllm_backend: set \
             ATTN_DIFF_VLLM_PYTHON to an interpreter with vLLM (docs/findings-vllm-spyre.md); \
             nothing was checked"
        );
        return;
    };
    assert!(
        probe.contains(
            r#"{"dtypes": ["f16"], "head_size_multiple_of": 64, "kinds": ["decoder"], "kv_cache_dtypes": ["auto"], "features": [], "max_seqs": 1}"#
        ),
        "upstream's declared space through vllm_backend.py changed:\n{probe}"
    );
    let replays = repo().join("fixtures/upstream/vllm-spyre/replays");
    for (flags, file) in [
        ("--padding none", "spyre-attn-f16-scores.json"),
        ("", "spyre-attn-padding-crash.json"),
        ("", "spyre-attn-padding-overwrites-last-slot.json"),
        ("--padding none", "spyre-attn-masked-overflow.json"),
    ] {
        let o = replay_route(&route, flags, &replays.join(file));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(1), "{file} [{flags}]:\n{stdout}");
    }
}

/// spyre-inference's `spyre_attn.py` (torch-spyre/spyre-inference at 4744aed), when
/// `ATTN_DIFF_SPYRE_INFERENCE_FILE` names it and `ATTN_DIFF_VLLM_PYTHON` an interpreter with
/// vLLM (docs/findings-spyre-inference.md): its declared space, at least 90% of a check's
/// cases and traces reach it, and each finding still reproduces from its replay file.
#[test]
fn spyre_inference_findings_reproduce_when_installed() {
    let _g = serial();
    let python = vllm_python();
    let adapter = repo().join("adapters/python/vllm_backend.py");
    let upstream = std::env::var("ATTN_DIFF_SPYRE_INFERENCE_FILE").unwrap_or_default();
    let route = format!(
        "{python} '{}' --file '{upstream}' --selection platform",
        adapter.display()
    );
    let probe = if upstream.is_empty() {
        None
    } else {
        probe_route(&route)
    };
    let Some(probe) = probe else {
        eprintln!(
            "SKIPPED spyre_inference_findings_reproduce_when_installed: set \
             ATTN_DIFF_SPYRE_INFERENCE_FILE to spyre-inference's spyre_attn.py and \
             ATTN_DIFF_VLLM_PYTHON to an interpreter with vLLM \
             (docs/findings-spyre-inference.md); nothing was checked"
        );
        return;
    };
    assert!(
        probe.contains(
            r#"{"dtypes": ["f16"], "head_size_multiple_of": 64, "block_size_multiple_of": 64, "kinds": ["decoder"], "kv_cache_dtypes": ["auto"], "features": ["sliding_window", "logits_soft_cap", "alibi"]}"#
        ),
        "upstream's declared space changed:\n{probe}"
    );
    let out = std::env::temp_dir().join("attn-diff-external-spyre-inference");
    let o = Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args(["check", "--cases", "24", "--traces", "6", "--no-shrink"])
        .args(["--out", &out.display().to_string()])
        .args([
            "--backend",
            "external:si",
            "--external",
            &format!("si={route}"),
        ])
        .output()
        .expect("attn-diff runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let (reached, drawn) = aim_counts(&stdout).unwrap_or_else(|| panic!("no aim line:\n{stdout}"));
    assert!(
        reached * 10 >= drawn * 9,
        "only {reached} of {drawn} cases and traces reached it:\n{stdout}"
    );
    let replays = repo().join("fixtures/upstream/spyre-inference/replays");
    // When one of these passes, upstream fixed it: update the findings document.
    for (flags, file) in [
        ("", "spyre-inference-unwritten-slot-nan.json"),
        ("", "spyre-inference-padding-slot-crash.json"),
        ("--padding none", "spyre-inference-f16-scores.json"),
        ("--padding none", "spyre-inference-qk-overflow.json"),
        ("--padding none", "spyre-inference-block-192-mask.json"),
    ] {
        let o = replay_route(&route, flags, &replays.join(file));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(1), "{file} [{flags}]:\n{stdout}");
    }
    // Its encoder backend, beside it: the platform routes encoder layers to it.
    let encoder = std::path::Path::new(&upstream).with_file_name("spyre_encoder_attn.py");
    let encoder_route = format!(
        "{python} '{}' --file '{}' --selection platform --kinds encoder_only",
        adapter.display(),
        encoder.display()
    );
    // spyre-inference-encoder-padding-crash.json is not replayed here: it reads uninitialized
    // indices, so it crashes on some runs only (finding 7).
    let (flags, file) = (
        "--padding none",
        "spyre-inference-encoder-alibi-ignored.json",
    );
    let o = replay_route(&encoder_route, flags, &replays.join(file));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{file} [{flags}]:\n{stdout}");
}

/// What `route --probe` prints, or None when it does not run here.
fn probe_route(route: &str) -> Option<String> {
    let words = shlex::split(route)?;
    let o = Command::new(&words[0])
        .args(&words[1..])
        .arg("--probe")
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

fn replay_route(route: &str, flags: &str, case: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args(["replay", &case.display().to_string()])
        .args([
            "--backend",
            "external:s",
            "--external",
            &format!("s={route} {flags}"),
        ])
        .output()
        .expect("attn-diff runs")
}

/// (reached, drawn) from a check's `aim:` line: "…: N of M case(s) and trace(s) reached it".
fn aim_counts(stdout: &str) -> Option<(u64, u64)> {
    let line = stdout.lines().find(|l| l.starts_with("aim:"))?;
    let tail = &line[line.rfind(": ")? + 2..];
    let mut words = tail.split_whitespace();
    let reached = words.next()?.parse().ok()?;
    (words.next()? == "of").then_some(())?;
    let drawn = words.next()?.parse().ok()?;
    Some((reached, drawn))
}
