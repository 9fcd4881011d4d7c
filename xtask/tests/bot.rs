//! `cargo xtask bot`: a good comment runs the shards and prints the reply the bot would post;
//! a malformed one prints the usage reply, runs nothing and fails.

use std::path::Path;
use std::process::{Command, Output};

fn bot(comment: &str, out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bot", "--comment", comment, "--out"])
        .arg(out)
        .output()
        .expect("xtask runs")
}

#[test]
fn a_malformed_comment_prints_the_usage_reply_and_fails() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bot-malformed");
    let o = bot("bot:test BACKENDS=cpu CASES=lots", &out);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "{stdout}");
    assert!(stdout.contains("cannot run this request"), "{stdout}");
    assert!(stdout.contains("offending word: CASES=lots\n"), "{stdout}");
    assert!(stdout.contains("SHARDS=N"), "usage: {stdout}");
    assert!(!out.join("shards").exists(), "nothing ran");
}

#[test]
fn a_cpu_run_prints_the_reply_it_would_post() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bot-cpu");
    let o = bot("bot:test BACKENDS=cpu CASES=40 SHARDS=2", &out);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("### attn-diff: all passed"), "{stdout}");
    assert!(
        stdout.contains(
            "`bot:test BACKENDS=cpu CASES=40 TRACES=100 SEED=1 DEEP=0 SHARDS=2 MUTANTS=0`"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("| cpu | pass |"), "{stdout}");
    for i in 0..2 {
        assert!(out.join(format!("shards/shard-{i}/summary.json")).is_file());
    }
    assert!(out.join("report/status.json").is_file());
}
