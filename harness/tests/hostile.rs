//! Hostile inputs: malformed and adversarial files fed to every entry point that reads input
//! (`replay` of JSON and safetensors cases, `export --case`, golden fixture loading). Each must
//! give exit 2 and a message naming the problem; none may panic, allocate gigabytes, or leave
//! a half-written file behind.

use attn_harness::export::case_to_safetensors;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn attn_diff(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args(args)
        .output()
        .expect("attn-diff runs")
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attn-diff-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn base_json() -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/regressions/padding_rows_and_partial_blocks.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn edited(f: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v = base_json();
    f(&mut v);
    v.to_string().into_bytes()
}

fn base_tensor_file() -> Vec<u8> {
    let case = attn_reference::Case::from_json(&base_json().to_string()).unwrap();
    case_to_safetensors(&case, None)
}

/// Expect exit 2 with `needle` in stderr, no panic; returns stderr.
fn expect_rejected(name: &str, args: &[&str], needle: &str) -> String {
    let o = attn_diff(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{name}: exit {:?}, stderr: {err}",
        o.status.code()
    );
    assert!(
        err.contains(needle),
        "{name}: expected `{needle}` in: {err}"
    );
    assert!(!err.contains("panicked"), "{name}: panicked: {err}");
    err
}

/// The catalogue: (name, file name, bytes, expected message fragment).
fn catalogue() -> Vec<(&'static str, &'static str, Vec<u8>, &'static str)> {
    let text = base_json().to_string();
    let mut tensors = base_tensor_file();
    let truncated_tensors = tensors[..tensors.len() / 3].to_vec();
    let mut huge_header = u64::MAX.to_le_bytes().to_vec();
    huge_header.extend_from_slice(b"{}");
    // A NaN inside a tensor file (JSON cannot carry one): patch the first query value.
    let nan_file = {
        let case = attn_reference::Case::from_json(&text).unwrap();
        let mut bytes = case_to_safetensors(&case, None);
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
        let start = header["query"]["data_offsets"][0].as_u64().unwrap() as usize + 8 + header_len;
        bytes[start..start + 2].copy_from_slice(&half::bf16::NAN.to_le_bytes());
        bytes
    };
    tensors.truncate(tensors.len());
    vec![
        (
            "truncated JSON",
            "truncated.json",
            text.as_bytes()[..text.len() / 2].to_vec(),
            "malformed case JSON",
        ),
        (
            "empty file",
            "empty.json",
            Vec::new(),
            "malformed case JSON",
        ),
        (
            "binary garbage",
            "garbage.json",
            vec![0xff, 0x00, 0x13, 0x37, 0x80],
            "did not contain valid UTF-8",
        ),
        (
            "deeply nested",
            "nested.json",
            "[".repeat(100_000).into_bytes(),
            "malformed case JSON",
        ),
        (
            "wrong type",
            "wrong_type.json",
            edited(|v| v["config"]["num_heads"] = "six".into()),
            "invalid type: string",
        ),
        (
            "negative length",
            "negative.json",
            edited(|v| v["batch"]["seq_lens"][0] = (-7).into()),
            "invalid value",
        ),
        (
            "missing field",
            "missing.json",
            edited(|v| {
                v["config"].as_object_mut().unwrap().remove("head_size");
            }),
            "missing field `head_size`",
        ),
        (
            "unknown field",
            "unknown.json",
            edited(|v| v["layout"]["extra"] = 1.into()),
            "unknown field `extra`",
        ),
        (
            "huge sequence length",
            "huge_len.json",
            edited(|v| v["batch"]["seq_lens"][0] = (1u64 << 60).into()),
            "tensors.context_key",
        ),
        (
            "block past the cache",
            "past_cache.json",
            edited(|v| v["layout"]["block_table"][1][0] = 4096.into()),
            "past the cache",
        ),
        (
            "duplicate slot",
            "dup_slot.json",
            edited(|v| v["layout"]["slot_mapping"][3] = v["layout"]["slot_mapping"][2].clone()),
            "layout.slot_mapping[3]",
        ),
        (
            "heads not a multiple",
            "heads.json",
            edited(|v| v["config"]["num_kv_heads"] = 4.into()),
            "not a multiple",
        ),
        (
            "head size 0",
            "head0.json",
            edited(|v| v["config"]["head_size"] = 0.into()),
            "config.head_size",
        ),
        (
            "window 0",
            "window0.json",
            edited(|v| v["config"]["sliding_window"] = 0.into()),
            "config.sliding_window",
        ),
        (
            "infinite value",
            "inf.json",
            edited(|v| v["tensors"]["value"][0] = serde_json::json!(1e39)),
            "non-finite",
        ),
        (
            "value not representable",
            "repr.json",
            edited(|v| v["tensors"]["query"][0] = serde_json::json!(0.1)),
            "not representable in bf16",
        ),
        (
            "sizes overflow when multiplied",
            "overflow.json",
            edited(|v| {
                v["config"]["num_heads"] = 4096.into();
                v["config"]["num_kv_heads"] = 1.into();
                v["config"]["head_size"] = 65536.into();
                v["batch"]["query_lens"][0] = (1u64 << 40).into();
                v["batch"]["seq_lens"][0] = (1u64 << 40).into();
            }),
            "tensors.query",
        ),
        (
            "cache too large",
            "cache.json",
            edited(|v| v["layout"]["num_blocks"] = (1u64 << 40).into()),
            "layout.num_blocks is too large",
        ),
        (
            "padding token with a slot",
            "pad_slot.json",
            edited(|v| {
                let n = v["layout"]["slot_mapping"].as_array().unwrap().len();
                v["layout"]["slot_mapping"][n - 1] = 5.into();
            }),
            "padding tokens must have slot -1",
        ),
        (
            "null block holding tokens",
            "null_block.json",
            edited(|v| v["layout"]["block_table"][0][0] = 0.into()),
            "null block",
        ),
        (
            "ragged table",
            "ragged.json",
            edited(|v| {
                v["layout"]["block_table"][2]
                    .as_array_mut()
                    .unwrap()
                    .push(0.into())
            }),
            "rows of different widths",
        ),
        (
            "alibi of the wrong length",
            "alibi.json",
            edited(|v| v["config"]["alibi_slopes"] = serde_json::json!([0.5])),
            "config.alibi_slopes",
        ),
        (
            "tensor file: truncated",
            "truncated.safetensors",
            truncated_tensors,
            "not a safetensors file",
        ),
        (
            "tensor file: huge header",
            "header.safetensors",
            huge_header,
            "not a safetensors file",
        ),
        (
            "tensor file: NaN in a tensor",
            "nan.safetensors",
            nan_file,
            "non-finite value NaN",
        ),
        (
            "tensor file: JSON inside",
            "json.safetensors",
            text.as_bytes().to_vec(),
            "not a safetensors file",
        ),
    ]
}

#[test]
fn every_hostile_file_is_rejected_by_replay() {
    let dir = scratch();
    let cases = catalogue();
    assert!(cases.len() >= 25);
    for (name, file, bytes, needle) in cases {
        let path = dir.join(file);
        std::fs::write(&path, &bytes).unwrap();
        expect_rejected(name, &["replay", path.to_str().unwrap()], needle);
    }
}

#[test]
fn export_of_a_hostile_case_writes_nothing() {
    let dir = scratch();
    for (name, file, bytes, needle) in catalogue().into_iter().filter(|c| c.1.ends_with(".json")) {
        let path = dir.join(file);
        std::fs::write(&path, &bytes).unwrap();
        let out = dir.join(format!("{file}.out.safetensors"));
        expect_rejected(
            name,
            &[
                "export",
                "--case",
                path.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
            needle,
        );
        assert!(
            !out.exists(),
            "{name}: export left {} behind",
            out.display()
        );
    }
    assert_no_temp_files(&dir);
}

#[test]
fn a_directory_or_missing_path_is_rejected_everywhere() {
    let dir = scratch();
    let d = dir.to_str().unwrap();
    expect_rejected("replay of a directory", &["replay", d], "is a directory");
    expect_rejected(
        "replay of a directory named .safetensors",
        &["replay", &format!("{d}/")],
        "is a directory",
    );
    expect_rejected(
        "replay of a missing file",
        &["replay", "/nonexistent/case.json"],
        "cannot read",
    );
    expect_rejected(
        "export of a missing file",
        &[
            "export",
            "--case",
            "/nonexistent/case.json",
            "--out",
            "/tmp/never.safetensors",
        ],
        "cannot read",
    );
    // Exporting over a directory fails cleanly and leaves no temporary file.
    let target = dir.join("is_a_dir.safetensors");
    std::fs::create_dir_all(&target).unwrap();
    expect_rejected(
        "export onto a directory",
        &[
            "export",
            "--spec",
            "small_decode",
            "--out",
            target.to_str().unwrap(),
        ],
        "cannot write",
    );
    assert_no_temp_files(&dir);
}

#[test]
fn hostile_fixture_files_are_errors_not_panics() {
    use attn_reference::golden::GoldenFixture;
    let dir = scratch();
    let good =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden/small_decode.json");
    let text = std::fs::read_to_string(&good).unwrap();
    for (name, content) in [
        ("truncated", text[..text.len() / 2].to_string()),
        ("empty", String::new()),
        (
            "wrong type",
            text.replacen("\"seed\":", "\"seed\": \"x\", \"ignored\":", 1),
        ),
        ("not JSON", "\u{0}\u{1}".to_string()),
    ] {
        let p = dir.join(format!("fixture-{}.json", name.replace(' ', "_")));
        std::fs::write(&p, content).unwrap();
        let e = GoldenFixture::load(&p).expect_err(name);
        assert!(
            e.contains("malformed fixture") && e.contains(p.to_str().unwrap()),
            "{name}: {e}"
        );
    }
    assert!(GoldenFixture::load(&dir)
        .unwrap_err()
        .contains("cannot read fixture"));
}

fn assert_no_temp_files(dir: &Path) {
    let leftovers: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary files left behind: {leftovers:?}"
    );
}
