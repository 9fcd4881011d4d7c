//! The summary JSON is the contract between `attn-diff` and the bot: a real run's JSON reads
//! into attn-ci's types and writes back to the same JSON, field for field. A field added to,
//! renamed in or removed from the harness's summary fails here.

use attn_ci::summary::CheckSummary;
use attn_harness::check::{run_check, CheckOptions, Shard};
use attn_harness::shrink::ShrinkBudget;
use attn_harness::summary::render_json;

#[test]
fn a_real_summary_round_trips() {
    let dir = std::env::temp_dir().join(format!("attn-ci-contract-{}", std::process::id()));
    let summary = run_check(CheckOptions {
        backends: vec![attn_backends::backend_by_name("cpu").expect("cpu")],
        cases: 8,
        seed: 3,
        shard: Shard { index: 1, count: 2 },
        deep: false,
        upstream: attn_harness::upstream::small_suite()
            .into_iter()
            .take(2)
            .collect(),
        out_dir: dir.clone(),
        shrink: ShrinkBudget::default(),
        on_case: None,
    });
    let json = render_json(&summary);
    let ours = CheckSummary::from_json(&json).expect("attn-ci reads attn-diff's JSON");
    let original: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let again: serde_json::Value = serde_json::from_str(&ours.to_json()).expect("valid JSON");
    assert_eq!(again, original);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_field_is_an_error_not_dropped() {
    let json = r#"{"seed":1,"cases":1,"shard":{"index":0,"count":1},"deep":false,
        "oracle_seconds":0.0,"backends":[],"upstream":[],"new_field":1}"#;
    let e = CheckSummary::from_json(json).expect_err("unknown field");
    assert!(e.to_string().contains("new_field"), "{e}");
}
