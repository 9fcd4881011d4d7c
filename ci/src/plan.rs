//! A request as the commands that run it: which cargo features `attn-diff` is built with, and
//! the `attn-diff check` arguments of each shard. The workflow and `cargo xtask bot` both take
//! their commands from here, so they run the same thing.

use crate::request::BotRequest;
use std::path::Path;

/// The file name of a shard's JSON summary inside its output folder.
pub const SUMMARY_FILE: &str = "summary.json";
/// The folder, inside a shard's output folder, where replay files go.
pub const REPLAY_DIR: &str = "replays";

/// Cargo arguments that build and run `attn-diff` for `req` (the default features, plus
/// `mutants` when asked), with the locked dependencies, up to the `--` before its own
/// arguments.
pub fn cargo_run_args(req: &BotRequest) -> Vec<String> {
    let mut args: Vec<String> = [
        "run",
        "--locked",
        "--quiet",
        "--package",
        "attn-harness",
        "--bin",
        "attn-diff",
    ]
    .map(String::from)
    .to_vec();
    if req.mutants {
        args.extend(["--features".into(), "mutants".into()]);
    }
    args.push("--".into());
    args
}

/// `attn-diff` arguments of shard `index` (0-based) of `req`, writing replay files under
/// `out/replays`. Every shard has the same seed: shard I of N runs the case indices ≡ I mod N.
pub fn check_args(req: &BotRequest, index: u32, out: &Path) -> Vec<String> {
    let mut args: Vec<String> = vec!["check".into()];
    if !req.backends.is_empty() {
        args.extend(["--backend".into(), req.backends.join(",")]);
    }
    args.extend([
        "--cases".into(),
        req.cases.to_string(),
        "--traces".into(),
        req.traces.to_string(),
        "--seed".into(),
        req.seed.to_string(),
        "--shard".into(),
        format!("{index}/{}", req.shards),
    ]);
    for spec in &req.specs {
        args.extend(["--spec".into(), spec.clone()]);
    }
    if req.deep {
        args.push("--deep".into());
    }
    for only in &req.only {
        args.extend(["--only".into(), only.arg()]);
    }
    args.extend([
        "--format".into(),
        "json".into(),
        "--out".into(),
        out.join(REPLAY_DIR).display().to_string(),
    ]);
    args
}

/// The shard indices as a JSON array, for a workflow's job matrix.
pub fn matrix_json(req: &BotRequest) -> String {
    let v: Vec<u32> = (0..req.shards).collect();
    serde_json::to_string(&v).unwrap_or_else(|_| "[0]".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;

    #[test]
    fn shard_arguments() {
        let r = parse("bot:test BACKENDS=cpu,spyre-sdpa CASES=20000 SPECS=large_decode,mixed_medium SEED=7 DEEP=1 SHARDS=4 MUTANTS=1").unwrap();
        let args = check_args(&r, 2, Path::new("out/shard-2"));
        assert_eq!(
            args.join(" "),
            "check --backend cpu,spyre-sdpa --cases 20000 --traces 100 --seed 7 --shard 2/4 \
             --spec large_decode --spec mixed_medium --deep --format json --out out/shard-2/replays"
        );
        assert_eq!(
            cargo_run_args(&r).join(" "),
            "run --locked --quiet --package attn-harness --bin attn-diff --features mutants --"
        );
        assert_eq!(matrix_json(&r), "[0,1,2,3]");
    }

    #[test]
    fn defaults_leave_backends_to_attn_diff() {
        let r = parse("bot:test").unwrap();
        let args = check_args(&r, 0, Path::new("o"));
        assert_eq!(
            args.join(" "),
            "check --cases 500 --traces 100 --seed 1 --shard 0/1 --format json --out o/replays"
        );
        assert_eq!(
            cargo_run_args(&r).join(" "),
            "run --locked --quiet --package attn-harness --bin attn-diff --"
        );
        assert_eq!(matrix_json(&r), "[0]");
    }

    #[test]
    fn only_filters_reach_every_shard() {
        let r = parse("bot:test SHARDS=2 ONLY=dtypes=f16;head_sizes=64,128;max_seqs=1").unwrap();
        for i in 0..2 {
            let args = check_args(&r, i, Path::new("o"));
            assert_eq!(
                args.join(" "),
                format!(
                    "check --cases 500 --traces 100 --seed 1 --shard {i}/2 --only dtypes=f16 \
                     --only head_sizes=64,128 --only max_seqs=1 --format json --out o/replays"
                )
            );
        }
    }
}
