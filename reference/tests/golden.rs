//! The oracle against the golden fixtures in `fixtures/golden/`, to 1e-12 relative.
//! `UPDATE_GOLDEN=1 cargo test -p attn-reference --test golden` (or `cargo xtask fixtures`)
//! rewrites them, never under CI.

use attn_reference::golden::{
    compute_fixture, fixture_path, update_requested, write_atomic, Digest, GoldenFixture,
    MLA_GOLDENS,
};
use attn_reference::specs::all_specs;
use std::path::PathBuf;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden")
}

/// Each fresh fixture against the stored one of its name (rewritten instead under
/// `UPDATE_GOLDEN=1`): the differences, one line each.
fn differences(fresh: impl IntoIterator<Item = GoldenFixture>) -> String {
    let dir = golden_dir();
    let update = update_requested();
    let mut failures = Vec::new();
    for fresh in fresh {
        let path = fixture_path(&dir, &fresh.spec);
        if update {
            let json = serde_json::to_string_pretty(&fresh).unwrap();
            write_atomic(&path, json.as_bytes()).unwrap();
            continue;
        }
        match GoldenFixture::load(&path) {
            Ok(stored) => {
                if let Err(e) = stored.check(&fresh) {
                    failures.push(e);
                }
            }
            Err(e) => failures.push(format!("{e} (regenerate with `cargo xtask fixtures`)")),
        }
    }
    failures.join("\n")
}

#[test]
fn oracle_matches_golden_fixtures() {
    let failures = differences(all_specs().iter().map(compute_fixture));
    assert!(
        failures.is_empty(),
        "golden fixtures disagree with the oracle:\n{failures}"
    );
}

#[test]
fn mla_oracle_matches_golden_fixtures() {
    let failures = differences(MLA_GOLDENS.iter().map(|golden| {
        let fresh = golden.compute();
        assert_eq!(
            fresh.output_len,
            golden.query_lens.iter().sum::<usize>() * golden.num_heads * 512
        );
        fresh
    }));
    assert!(
        failures.is_empty(),
        "MLA golden fixtures disagree with the oracle:\n{failures}"
    );
}

/// vLLM 0.33's masks at real model layouts: each case is valid, each mask changes the
/// output (so the fixture pins it), and the oracle matches the fixtures.
#[test]
fn mask_oracle_matches_golden_fixtures() {
    use attn_reference::golden_masks::MASK_GOLDENS;
    let failures = differences(MASK_GOLDENS.iter().map(|golden| {
        let case = golden.case();
        assert_eq!(case.validate(), Ok(()), "{}", golden.name);
        let fresh = golden.compute();
        let mut plain = case.clone();
        plain.batch.set_masks(Default::default());
        plain.config.chunk_lookback = None;
        assert!(
            Digest::of(&attn_reference::reference_output(&plain)) != fresh.digest,
            "{}: the masks change nothing",
            golden.name
        );
        fresh
    }));
    assert!(
        failures.is_empty(),
        "mask golden fixtures disagree with the oracle:\n{failures}"
    );
}

#[test]
fn a_one_element_change_is_caught_by_the_digest() {
    let spec = attn_reference::spec_by_name("large_decode").unwrap();
    let stored =
        GoldenFixture::load(&fixture_path(&golden_dir(), spec.name)).expect("fixture present");
    assert!(stored.output.is_none(), "large specs are stored as digests");
    // Recompute, change one element far from any sample, and re-digest.
    let config = attn_reference::golden::golden_config(&spec);
    let case = attn_reference::build_spec_case(&spec, config, stored.seed);
    let mut out = attn_reference::reference_output(&case);
    let sampled: std::collections::HashSet<usize> =
        stored.digest.samples.iter().map(|s| s.0).collect();
    let i = (0..out.len()).find(|i| !sampled.contains(i)).unwrap();
    out[i] += 1e-6;
    let mut changed = stored.clone();
    changed.digest = attn_reference::golden::Digest::of(&out);
    assert!(stored.check(&changed).is_err());
}

#[test]
fn fixtures_stay_small() {
    let total: u64 = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(total < 5 << 20, "fixtures take {total} bytes, over 5 MB");
}
