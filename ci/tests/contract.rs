//! The summary JSON between `attn-diff` and the bot: both use `attn-results`' types, so the
//! contract left to test is the document itself: a real run's JSON reads back to the same
//! summary, a document of another `schema_version` is refused by name, and an unknown field is
//! an error rather than something a merge silently drops.

use attn_ci::summary::CheckSummary;
use attn_results::to_json;

fn from_json(text: &str) -> Result<CheckSummary, attn_results::ReadError> {
    attn_results::from_json(text)
}
use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::{CheckOptions, Shard};
use attn_harness::render::check::render_json;

#[test]
fn a_real_summary_round_trips() {
    let dir = std::env::temp_dir().join(format!("attn-ci-contract-{}", std::process::id()));
    let cpu = attn_backends::backend_by_name("cpu").expect("cpu");
    let run = run_check(CheckOptions {
        seed: 3,
        shard: Shard { index: 1, count: 2 },
        upstream: attn_harness::pipeline::upstream::small_suite()
            .into_iter()
            .take(2)
            .collect(),
        recorded: Vec::new(),
        ..CheckOptions::new(vec![cpu], 8, dir.clone())
    });
    let json = render_json(&run.summary);
    let ours = from_json(&json).expect("attn-ci reads attn-diff's JSON");
    assert_eq!(ours.backends.len(), 1);
    let original: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    assert_eq!(original["schema_version"], attn_results::SCHEMA_VERSION);
    let again: serde_json::Value = serde_json::from_str(&to_json(&ours)).expect("valid JSON");
    assert_eq!(again, original);
}

fn document(schema_version: u32, extra: &str) -> String {
    format!(
        r#"{{"schema_version":{schema_version},"seed":1,"cases":1,"shard":{{"index":0,"count":1}},
        "deep":false,"oracle_seconds":0.0,"backends":[],"upstream":[]{extra}}}"#
    )
}

#[test]
fn another_schema_version_is_refused_by_name() {
    assert!(from_json(&document(attn_results::SCHEMA_VERSION, "")).is_ok());
    let e = from_json(&document(1, "")).expect_err("an old document");
    assert!(e.to_string().contains("schema_version 1"), "{e}");
}

#[test]
fn an_unknown_field_is_an_error_not_dropped() {
    let json = document(attn_results::SCHEMA_VERSION, r#","new_field":1"#);
    let e = from_json(&json).expect_err("unknown field");
    assert!(e.to_string().contains("new_field"), "{e}");
}
