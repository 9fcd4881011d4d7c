//! A run you can trust: a run that tested nothing is not green, an interrupt loses nothing
//! and leaves no adapter behind, the run controls a pytest user expects, counts that add up,
//! and JUnit output CI systems read.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{adapter_python_with, repo};

fn attn_diff(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .current_dir(repo())
        .args(args)
        .output()
        .expect("attn-diff runs")
}

fn python() -> String {
    adapter_python_with("numpy, safetensors")
}

/// `--external` for a misbehaving test adapter in `mode`, findable by `marker`.
fn misbehaving(name: &str, mode: &str, marker: &str) -> String {
    let script = repo().join("harness/tests/adapters/misbehaving.py");
    format!("{name}={} {} {mode} {marker}", python(), script.display())
}

fn alive(marker: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        if cmdline.contains(marker) && !zombie {
            out.push(cmdline);
        }
    }
    out
}

#[test]
fn an_adapter_that_declines_everything_is_not_green() {
    let script = std::env::temp_dir().join("attn-diff-declines-all.py");
    std::fs::write(
        &script,
        "import sys\nsys.path.insert(0, sys.argv[1])\n\
         from attn_diff_adapter import Adapter, Unsupported, serve\n\
         class D(Adapter):\n    name = 'declines-all'\n\
         \x20   def check(self, c): raise Unsupported('nothing today')\n\
         \x20   def new_cache(self, c, n): raise Unsupported('nothing today')\n\
         \x20   def write_kv(self, *a): pass\n\
         \x20   def forward(self, *a): raise Unsupported('nothing today')\n\
         serve(D())\n",
    )
    .unwrap();
    let adapters = repo().join("adapters/python");
    let flag = format!("d={} {} {}", python(), script.display(), adapters.display());
    let o = attn_diff(&[
        "check",
        "--backend",
        "external:d",
        "--external",
        &flag,
        "--cases",
        "12",
        "--traces",
        "2",
        "-q",
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("NOT TESTED: external:d: ran none of its 12 property cases"),
        "{text}"
    );
    assert!(text.contains(": NOT TESTED"), "{text}");
    // --min-run asks more of a backend that did run.
    let o = attn_diff(&[
        "check",
        "--backend",
        "cpu",
        "--cases",
        "5",
        "--traces",
        "0",
        "--pairs",
        "0",
        "--no-upstream",
        "--min-run",
        "6",
        "-q",
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("fewer than --min-run 6"), "{text}");
    let o = attn_diff(&[
        "check",
        "--backend",
        "cpu",
        "--cases",
        "5",
        "--traces",
        "0",
        "--no-upstream",
        "--min-run",
        "5",
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn sigint_while_shrinking_keeps_the_failure_and_leaves_no_adapter() {
    let marker = format!("attn-diff-sigint-{}", std::process::id());
    let out = std::env::temp_dir().join(&marker);
    let _ = std::fs::remove_dir_all(&out);
    let flag = misbehaving("stuck", "wrong-then-hang", &marker);
    let child = Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .current_dir(repo())
        .args([
            "check",
            "--backend",
            "external:stuck",
            "--external",
            &flag,
            "--cases",
            "20",
            "--traces",
            "0",
            "--no-upstream",
            "-q",
            "--out",
        ])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("attn-diff starts");
    // The first case diverges; its replay file is written before shrinking, which hangs.
    let replay = out.join("external_stuck-seed1-case0.json");
    let until = Instant::now() + Duration::from_secs(120);
    while !replay.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(replay.exists(), "no replay file before shrinking");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !alive(&marker).is_empty(),
        "the adapter should be hanging now"
    );
    // SAFETY: a plain signal to our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let started = Instant::now();
    let o = child.wait_with_output().expect("attn-diff ends");
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(130),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    assert!(text.contains("STOPPED: interrupted"), "{text}");
    assert!(
        text.contains("stuck diverged"),
        "the failure is reported: {text}"
    );
    let case = attn_reference::Case::load(&replay).expect("a valid replay file");
    assert_eq!(case.recorded.expect("recorded").backend, "external:stuck");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        alive(&marker),
        Vec::<String>::new(),
        "an adapter outlived the run"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// An adapter that answers its first call and hangs on its second, in every process it is
/// restarted as: each timeout's shrink alternates answers and hangs. Its check ends within
/// six timeouts (120 s at `--external-timeout 20`), given up on, with its summary, and the
/// report states how the timeout's shrink was bounded.
#[test]
fn an_adapter_hanging_on_every_second_call_is_given_up_on_in_bounded_time() {
    let timeout = 5.0;
    let marker = format!("attn-diff-every-second-{}", std::process::id());
    let out = std::env::temp_dir().join(&marker);
    let flag = misbehaving("halfhang", "hang-every-second", &marker);
    let started = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .current_dir(repo())
        .args([
            "check",
            "--backend",
            "external:halfhang",
            "--external",
            &flag,
        ])
        .args(["--cases", "8", "--traces", "2", "--format", "json", "-q"])
        .args(["--external-timeout", &timeout.to_string(), "--out"])
        .arg(&out)
        .output()
        .expect("attn-diff runs");
    let took = started.elapsed().as_secs_f64();
    let s: attn_results::CheckSummary = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "no summary ({e}); stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert_eq!(o.status.code(), Some(1));
    assert!(took < 6.0 * timeout, "took {took:.1} s");
    let b = &s.backends[0];
    let why = b.gave_up.as_deref().expect("given up on");
    assert!(why.contains("3 of") && why.contains("timed out"), "{why}");
    let shrink = b.failures[0].shrink.as_ref().expect("shrink info");
    let limits = shrink.limits.expect("a timeout's shrink states its bounds");
    assert_eq!(limits.in_all_seconds, timeout);
    assert!(limits.per_try_seconds < timeout, "{limits:?}");
    // The last try starts at most one try's limit before the shrink's end, and a hung
    // adapter's restart (its start-up, which no try's limit covers; seconds for a Python
    // adapter on a loaded 2-core machine) comes on top: bounded, far below the 16 tries of
    // an unbounded shrink.
    assert!(
        shrink.seconds <= limits.in_all_seconds + 2.0 * limits.per_try_seconds,
        "{shrink:?}"
    );
    assert!(
        b.failures[0]
            .text
            .contains("a timeout's shrink: each try limited to"),
        "{}",
        b.failures[0].text
    );
    assert_eq!(
        alive(&marker),
        Vec::<String>::new(),
        "an adapter outlived it"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// Whether process `pid` has a handler for SIGTERM installed (`SigCgt` in /proc).
fn catches_sigterm(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}

/// A small deterministic generator (xorshift), seeded per run so a failure names its seed.
struct Draws(u64);

impl Draws {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// How one stress run was stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Sigint,
    Sigterm,
    /// What `timeout` does: the process, then its group, microseconds apart.
    SigtermTwice,
}

/// One check of the every-second-hanging adapter signalled `delay_ms` after its handler is
/// installed: whether the signal landed (the run was still going), with what went wrong.
fn signalled_run(n: usize, delay_ms: u64, stop: Stop) -> Result<bool, String> {
    let marker = format!("attn-diff-stress-{}-{n}", std::process::id());
    let out = std::env::temp_dir().join(&marker);
    let flag = misbehaving("halfhang", "hang-every-second", &marker);
    let json = !n.is_multiple_of(3);
    let child = Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .current_dir(repo())
        .args([
            "check",
            "--backend",
            "external:halfhang",
            "--external",
            &flag,
        ])
        .args([
            "--cases",
            "12",
            "--traces",
            "2",
            "--external-timeout",
            "1",
            "-q",
        ])
        .args(["--format", if json { "json" } else { "text" }, "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("attn-diff starts");
    let pid = child.id();
    let until = Instant::now() + Duration::from_secs(20);
    while !catches_sigterm(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(delay_ms));
    let signal = |sig| {
        // SAFETY: a plain signal to our own child (not yet reaped, so its pid is its own).
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    };
    match stop {
        Stop::Sigint => signal(libc::SIGINT),
        Stop::Sigterm => signal(libc::SIGTERM),
        Stop::SigtermTwice => {
            signal(libc::SIGTERM);
            signal(libc::SIGTERM);
        }
    }
    let signalled = Instant::now();
    let o = child.wait_with_output().expect("attn-diff ends");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let what = format!(
        "run {n} ({stop:?} after {delay_ms} ms): status {:?}\nstdout: {stdout}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&out);
    if signalled.elapsed() > Duration::from_secs(15) {
        return Err(format!("took {:?} to stop: {what}", signalled.elapsed()));
    }
    let landed = o.status.code() == Some(130);
    if !landed && o.status.code() != Some(1) {
        return Err(format!("neither interrupted nor finished: {what}"));
    }
    let stopped = if json {
        let s: attn_results::CheckSummary = serde_json::from_slice(&o.stdout)
            .map_err(|e| format!("no parsable summary ({e}): {what}"))?;
        s.stopped.is_some_and(|w| w.starts_with("interrupted"))
    } else {
        if !stdout.contains("attn-diff check: ") {
            return Err(format!("no summary: {what}"));
        }
        stdout.contains("STOPPED: interrupted")
    };
    if stopped != landed {
        return Err(format!("the summary and the status disagree: {what}"));
    }
    std::thread::sleep(Duration::from_millis(100));
    let left = alive(&marker);
    if !left.is_empty() {
        return Err(format!("adapters outlived the run: {left:?}; {what}"));
    }
    Ok(landed)
}

/// Signals at random moments of a run (its first handshake, cases, timeouts, the shrink of a
/// timeout, restarts): every run ends with a parsable summary saying whether it was
/// interrupted, and leaves no adapter. At least 50 signals land on a running check.
#[test]
fn a_signal_at_any_moment_leaves_a_summary() {
    const LANDED: usize = 50;
    const MOST_RUNS: usize = 90;
    const AT_ONCE: usize = 3;
    let seed = std::env::var("ATTN_DIFF_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    let mut draws = Draws(seed);
    let plan: Vec<(u64, Stop)> = (0..MOST_RUNS)
        .map(|_| {
            let delay = draws.below(3000);
            let stop = [Stop::Sigint, Stop::Sigterm, Stop::SigtermTwice][draws.below(3) as usize];
            (delay, stop)
        })
        .collect();
    let landed = std::sync::atomic::AtomicUsize::new(0);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let errors = std::sync::Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..AT_ONCE {
            scope.spawn(|| loop {
                if landed.load(std::sync::atomic::Ordering::SeqCst) >= LANDED {
                    return;
                }
                let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(&(delay, stop)) = plan.get(n) else {
                    return;
                };
                match signalled_run(n, delay, stop) {
                    Ok(true) => {
                        landed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Ok(false) => {}
                    Err(e) => errors.lock().unwrap().push(e),
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap();
    let runs = next
        .load(std::sync::atomic::Ordering::SeqCst)
        .min(MOST_RUNS);
    let landed = landed.into_inner();
    eprintln!(
        "signal stress (ATTN_DIFF_STRESS_SEED={seed}): {landed} of {runs} runs interrupted in \
         {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert!(errors.is_empty(), "seed {seed}: {}", errors.join("\n\n"));
    assert!(
        landed >= LANDED,
        "seed {seed}: only {landed} signals landed"
    );
}

#[test]
fn a_copied_replay_line_reproduces_an_external_failure() {
    let out = std::env::temp_dir().join(format!("attn-diff-replay-line-{}", std::process::id()));
    let flag = misbehaving("offby1", "window-off-by-one", "replay-line");
    let o = attn_diff(&[
        "check",
        "--backend",
        "external:offby1",
        "--external",
        &flag,
        "--cases",
        "150",
        "--traces",
        "0",
        "--no-upstream",
        "-q",
        "--out",
        out.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{text}");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("replay:  "))
        .expect("a replay line");
    // As a person pastes it into a shell.
    let words = shlex::split(line).expect("a shell line");
    assert_eq!(words[0], "attn-diff");
    let o = attn_diff(&words[1..].iter().map(String::as_str).collect::<Vec<_>>());
    let again = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{again}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(again.contains("offby1 diverged (mismatch)"), "{again}");
    // Every report prints the tolerance it applied.
    assert!(
        text.contains("tol:     |actual - expected| <= atol"),
        "{text}"
    );
    // Without --external, replay names the command instead of running one from the file.
    let file = &words[2];
    let o = attn_diff(&["replay", file]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--external") && err.contains("starts no command"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn an_adapter_failing_the_same_way_is_given_up_on() {
    let flag = misbehaving("crashy", "crash-on-batches", "give-up");
    let o = attn_diff(&[
        "check",
        "--backend",
        "external:crashy",
        "--external",
        &flag,
        "--cases",
        "60",
        "--traces",
        "0",
        "--no-upstream",
        "--no-shrink",
        "--give-up-after",
        "3",
        "--format",
        "json",
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let s: attn_results::CheckSummary = serde_json::from_slice(&o.stdout).unwrap();
    let b = &s.backends[0];
    let why = b.gave_up.as_deref().expect("given up");
    assert!(
        why.contains("3 identical failures") && why.contains("crashed"),
        "{why}"
    );
    assert!(b.property.sent < 60, "{:?}", b.property);
    assert_eq!(b.failed(), 3, "{:?}", b.divergences);
    // Not shrunk, and said so nowhere as if it were.
    assert!(b.failures[0].shrink.as_ref().is_none_or(|s| s.steps == 0));
}

#[test]
fn stop_at_the_first_failure_and_rerun_one_case_by_its_index() {
    let flag = misbehaving("offby1", "window-off-by-one", "exitfirst");
    let o = attn_diff(&[
        "check",
        "--backend",
        "external:offby1",
        "--external",
        &flag,
        "--cases",
        "200",
        "--traces",
        "5",
        "-x",
        "--no-shrink",
        "--format",
        "json",
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let s: attn_results::CheckSummary = serde_json::from_slice(&o.stdout).unwrap();
    let b = &s.backends[0];
    let first = b.first_failing_case.expect("a failing case");
    assert_eq!(b.property.sent, first + 1, "stopped right after it");
    assert_eq!((b.traces.sent, b.upstream.sent), (0, 0));
    assert!(s.stopped.as_deref().unwrap().contains("--max-failures"));
    // That one case again, alone.
    let index = first.to_string();
    let o = attn_diff(&[
        "check",
        "--backend",
        "external:offby1",
        "--external",
        &flag,
        "--case-index",
        &index,
        "--no-shrink",
        "--format",
        "json",
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let s: attn_results::CheckSummary = serde_json::from_slice(&o.stdout).unwrap();
    let b = &s.backends[0];
    assert_eq!((b.property.sent, b.property.failed), (1, 1));
    assert_eq!(b.first_failing_case, Some(first));
}

#[test]
fn the_summary_columns_add_up_and_name_the_trace_index() {
    let o = attn_diff(&[
        "check",
        "--backend",
        "cpu",
        "--cases",
        "30",
        "--traces",
        "4",
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    let header = text.lines().find(|l| l.starts_with("backend")).unwrap();
    let row = text.lines().find(|l| l.starts_with("cpu ")).unwrap();
    let cols: Vec<&str> = header.split_whitespace().collect();
    let vals: Vec<&str> = row.split_whitespace().collect();
    let get = |name: &str| -> usize {
        vals[cols.iter().position(|c| *c == name).unwrap()]
            .parse()
            .unwrap()
    };
    assert_eq!(
        get("property") + get("upstream") + get("traces") + get("pairs"),
        get("passed") + get("failed") + get("declined"),
        "{text}"
    );
    assert!(get("pairs") >= 1, "{text}");
    assert_eq!(get("property"), 30);
    assert_eq!(get("traces"), 4);
}

fn junit_is_well_formed(xml: &str) {
    // The structure CI tools read (the JUnit schema of Jenkins, GitLab, GitHub actions):
    // testsuites > testsuite[name tests failures errors skipped time] > properties >
    // property[name value], and testcase[classname name time] > failure[message type] |
    // skipped | system-out; every tag closed.
    assert!(
        xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites "),
        "{xml}"
    );
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml.split_once("?>").unwrap().1;
    while let Some(start) = rest.find('<') {
        let end = rest[start..].find('>').expect("a closed tag") + start;
        let tag = &rest[start + 1..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name), "{xml}");
            continue;
        }
        let name = tag.split_whitespace().next().unwrap().trim_end_matches('/');
        let parent = stack.last().map(String::as_str);
        let (allowed_parent, required): (Option<&str>, &[&str]) = match name {
            "testsuites" => (None, &["tests", "failures", "errors", "time"]),
            "testsuite" => (
                Some("testsuites"),
                &["name", "tests", "failures", "errors", "skipped", "time"],
            ),
            "testcase" => (Some("testsuite"), &["classname", "name", "time"]),
            "failure" => (Some("testcase"), &["message", "type"]),
            "skipped" | "system-out" => (Some("testcase"), &[]),
            // A suite's properties (the judging policy and error figures).
            "properties" => (Some("testsuite"), &[]),
            "property" => (Some("properties"), &["name", "value"]),
            other => panic!("unexpected element {other}: {xml}"),
        };
        assert_eq!(parent, allowed_parent, "{name} in {parent:?}");
        for a in required {
            assert!(tag.contains(&format!(" {a}=\"")), "{name} lacks {a}: {tag}");
        }
        if !tag.ends_with('/') {
            stack.push(name.to_string());
        }
    }
    assert!(stack.is_empty(), "unclosed {stack:?}");
    // No raw markup from reports leaks into the document.
    assert!(!xml.contains("<<") && !xml.contains("& "), "{xml}");
}

#[test]
fn junit_output_is_what_ci_tools_read() {
    let o = attn_diff(&[
        "check",
        "--backend",
        "cpu",
        "--cases",
        "10",
        "--traces",
        "2",
        "--format",
        "junit",
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let xml = String::from_utf8(o.stdout).unwrap();
    junit_is_well_formed(&xml);
    assert!(xml.contains("tests=\"3\" failures=\"0\""), "{xml}");
    // A failing run: the failure carries the shrunk report, escaped.
    let flag = misbehaving("offby1", "window-off-by-one", "junit");
    let out = std::env::temp_dir().join("attn-diff-junit");
    let o = attn_diff(&[
        "check",
        "--backend",
        "external:offby1",
        "--external",
        &flag,
        "--cases",
        "150",
        "--traces",
        "0",
        "--format",
        "junit",
        "-q",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let xml = String::from_utf8(o.stdout).unwrap();
    junit_is_well_formed(&xml);
    assert!(
        xml.contains("<failure message=\"") && xml.contains(" diverged\" type=\"mismatch"),
        "{xml}"
    );
    assert!(xml.contains("diverged (mismatch)"), "{xml}");
    let _ = Path::new(&out);
}

#[test]
fn an_unwritable_out_folder_is_refused_before_the_run() {
    let file = std::env::temp_dir().join(format!("attn-diff-out-is-a-file-{}", std::process::id()));
    std::fs::write(&file, "not a folder").unwrap();
    let o = attn_diff(&[
        "check",
        "--backend",
        "cpu",
        "--cases",
        "1",
        "--out",
        file.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--out") && err.contains("cannot"), "{err}");
    assert!(o.stdout.is_empty(), "nothing ran");
    let _ = std::fs::remove_file(&file);
}

#[test]
fn a_case_no_output_could_fail_is_not_passed() {
    let path = repo().join("fixtures/regressions/padding_rows_and_partial_blocks.json");
    let mut case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    case["config"]["dtype"] = "f32".into();
    case["tensors"]["query"][0] = 3e38.into();
    let file =
        std::env::temp_dir().join(format!("attn-diff-huge-query-{}.json", std::process::id()));
    std::fs::write(&file, case.to_string()).unwrap();
    let o = attn_diff(&["replay", file.to_str().unwrap(), "--backend", "cpu"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("not judged") && text.contains("not tested"),
        "{text}"
    );
    // A case that can be judged prints the tolerance it applied.
    case["tensors"]["query"][0] = 1.0.into();
    std::fs::write(&file, case.to_string()).unwrap();
    let o = attn_diff(&["replay", file.to_str().unwrap(), "--backend", "cpu"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains("tolerance atol"), "{text}");
    let _ = std::fs::remove_file(&file);
}
