//! The messages of protocol versions 1 and 2 (documented in `docs/external-backends.md`):
//! each is a safetensors payload whose metadata key `message` names it.
//!
//! - `hello` (attn-diff → adapter): metadata `protocol`, `version` (1, what every adapter
//!   understands) and `versions` (`1,2`: what this attn-diff speaks).
//! - `hello` (adapter → attn-diff): metadata `protocol`, `version` (1, or 2 when it speaks
//!   sessions), `name`, `capabilities` (JSON, see [`Capabilities`]), optionally `description`.
//! - `step` (attn-diff → adapter, version 2): one step of a session: metadata `session` (and
//!   `fresh` = 1 when the session starts: drop any earlier session, make a new cache), the
//!   writes since the session's last step, then the step. The adapter keeps the session's
//!   cache for its next step; replies as to `case`.
//! - `case` (attn-diff → adapter): one whole case; the adapter builds its cache, applies the
//!   writes in order, runs the step, and answers with exactly one of
//! - `output` (tensor `output [num_tokens, num_heads, head_size_v]`, F32, F64, F16 or BF16;
//!   `head_size_v` is `head_size` but in an MLA case, whose writes carry `value [n, 1, 0]`;
//!   metadata `kernel_seconds`, optional), `unsupported` (metadata `reason`) or `error`
//!   (metadata `error`); every reply repeats the request's `case_id`.

use super::Capabilities;
use super::ExternalCache;
use crate::StepInputs;
use attn_reference::AttentionConfig;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::{BTreeMap, HashMap};
use thiserror::Error;

pub const PROTOCOL: &str = "attn-diff-external";
pub const PROTOCOL_VERSION: u32 = 1;
/// The version with sessions (a cache kept across `step` messages).
pub const SESSION_VERSION: u32 = 2;

/// What was wrong with a message the adapter sent.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ProtocolError {
    #[error("{what} is not a safetensors payload: {message}")]
    NotSafetensors { what: &'static str, message: String },
    #[error("{what} has no metadata `{key}`")]
    MissingMetadata {
        what: &'static str,
        key: &'static str,
    },
    #[error("{what} has metadata `{key}` = {value:?}: {message}")]
    BadMetadata {
        what: &'static str,
        key: &'static str,
        value: String,
        message: String,
    },
    #[error("reply is a `{0}` message; expected `output`, `unsupported` or `error`")]
    UnknownMessage(String),
    #[error("reply answers case {got}, but case {expected} was sent")]
    WrongCase { expected: u64, got: String },
    #[error("`output` reply has no tensor `output`")]
    MissingOutput,
    #[error("tensor `output` has dtype {0}; expected F32, F64, F16 or BF16")]
    OutputDtype(String),
    #[error("tensor `output` has shape {actual:?}; expected {expected:?} ([num_tokens, num_heads, head_size_v])")]
    OutputShape {
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
}

/// The adapter's half of the handshake.
#[derive(Clone, Debug, PartialEq)]
pub struct Hello {
    /// The version the adapter speaks: [`PROTOCOL_VERSION`] or [`SESSION_VERSION`].
    pub version: u32,
    pub name: String,
    pub description: Option<String>,
    pub capabilities: Capabilities,
    /// Environment variables that change what the adapter runs (a plugin's path, a vLLM
    /// setting), as the adapter saw them: replay files record them.
    pub environment: BTreeMap<String, String>,
    /// The class the adapter's capabilities come from, when its own class declares none
    /// but overrides how it computes (a subclass of a shipped reference, say).
    pub inherited_capabilities: Option<String>,
    /// The capability `batch_invariant`: a request's rows do not depend on the rest of the
    /// call (every relation of [`attn_reference::relation::Relation`] holds, bit for bit).
    pub batch_invariant: bool,
}

/// The adapter's answer to one case.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Output {
        values: Vec<f32>,
        kernel_seconds: Option<f64>,
    },
    Unsupported(String),
    Error(String),
}

fn serialize(
    tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
    meta: HashMap<String, String>,
) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                TensorView::new(*d, s.clone(), b).expect("shape matches data by construction"),
            )
        })
        .collect();
    safetensors::serialize(views, &Some(meta)).expect("serializing in-memory tensors cannot fail")
}

fn meta(pairs: &[(&str, String)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

pub fn hello_request() -> Vec<u8> {
    serialize(
        Vec::new(),
        meta(&[
            ("message", "hello".into()),
            ("protocol", PROTOCOL.into()),
            ("version", PROTOCOL_VERSION.to_string()),
            ("versions", format!("{PROTOCOL_VERSION},{SESSION_VERSION}")),
        ]),
    )
}

fn read_meta(bytes: &[u8], what: &'static str) -> Result<HashMap<String, String>, ProtocolError> {
    let (_, m) = SafeTensors::read_metadata(bytes).map_err(|e| ProtocolError::NotSafetensors {
        what,
        message: e.to_string(),
    })?;
    Ok(m.metadata().clone().unwrap_or_default())
}

fn get<'a>(
    m: &'a HashMap<String, String>,
    what: &'static str,
    key: &'static str,
) -> Result<&'a str, ProtocolError> {
    m.get(key)
        .map(String::as_str)
        .ok_or(ProtocolError::MissingMetadata { what, key })
}

/// A name a shell can assign (`NAME=value command`): replay lines print it so.
fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub fn parse_hello(bytes: &[u8]) -> Result<Hello, ProtocolError> {
    const WHAT: &str = "handshake reply";
    let m = read_meta(bytes, WHAT)?;
    let bad = |key: &'static str, value: &str, message: String| ProtocolError::BadMetadata {
        what: WHAT,
        key,
        value: value.to_string(),
        message,
    };
    let message = get(&m, WHAT, "message")?;
    if message != "hello" {
        return Err(bad("message", message, "expected `hello`".into()));
    }
    let protocol = get(&m, WHAT, "protocol")?;
    if protocol != PROTOCOL {
        return Err(bad("protocol", protocol, format!("expected `{PROTOCOL}`")));
    }
    let version_text = get(&m, WHAT, "version")?;
    let version = match version_text.parse::<u32>() {
        Ok(v @ (PROTOCOL_VERSION | SESSION_VERSION)) => v,
        _ => {
            return Err(bad(
                "version",
                version_text,
                format!("this attn-diff speaks version {PROTOCOL_VERSION} or {SESSION_VERSION}"),
            ))
        }
    };
    let name = get(&m, WHAT, "name")?.to_string();
    let caps_text = m.get("capabilities").map(String::as_str).unwrap_or("{}");
    let mut caps: serde_json::Value = serde_json::from_str(caps_text)
        .map_err(|e| bad("capabilities", caps_text, e.to_string()))?;
    // `batch_invariant` is a claim about the backend, not a part of its space.
    let batch_invariant = match caps
        .as_object_mut()
        .and_then(|o| o.remove("batch_invariant"))
    {
        None => false,
        Some(serde_json::Value::Bool(b)) => b,
        Some(other) => {
            return Err(bad(
                "capabilities.batch_invariant",
                &other.to_string(),
                "expected true or false".into(),
            ))
        }
    };
    let capabilities: Capabilities =
        serde_json::from_value(caps).map_err(|e| bad("capabilities", caps_text, e.to_string()))?;
    let environment = match m.get("environment") {
        None => BTreeMap::new(),
        Some(text) => serde_json::from_str::<BTreeMap<String, String>>(text).map_err(|e| {
            bad(
                "environment",
                text,
                format!("expected a JSON object of variable names to string values: {e}"),
            )
        })?,
    };
    if let Some(name) = environment.keys().find(|n| !is_variable_name(n)) {
        return Err(bad(
            "environment",
            name,
            "not an environment variable name (letters, digits and `_`, not starting with a digit)"
                .into(),
        ));
    }
    Ok(Hello {
        version,
        name,
        description: m.get("description").cloned(),
        capabilities,
        environment,
        inherited_capabilities: m
            .get("inherited_capabilities")
            .filter(|c| !c.trim().is_empty())
            .cloned(),
        batch_invariant,
    })
}

use attn_reference::bytes::{encode_i32 as i32_bytes, encode_i64 as i64_bytes};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    attn_reference::bytes::encode_values(attn_reference::DType::F32, v)
}

/// One whole case: the cache's writes in order, then the step.
pub fn case_request(
    case_id: u64,
    config: &AttentionConfig,
    cache: &ExternalCache,
    step: &StepInputs<'_>,
) -> Vec<u8> {
    request(
        case_id,
        config,
        cache.num_blocks,
        &cache.writes,
        step,
        &[("message", "case".into())],
    )
}

/// One step of session `session`: the writes not sent yet (all of them when `fresh`), then
/// the step.
pub fn step_request(
    case_id: u64,
    config: &AttentionConfig,
    cache: &ExternalCache,
    (from, fresh): (usize, bool),
    step: &StepInputs<'_>,
) -> Vec<u8> {
    let from = if fresh { 0 } else { from };
    request(
        case_id,
        config,
        cache.num_blocks,
        &cache.writes[from..],
        step,
        &[
            ("message", "step".into()),
            ("version", SESSION_VERSION.to_string()),
            ("session", cache.session.to_string()),
            ("fresh", u8::from(fresh).to_string()),
        ],
    )
}

fn request(
    case_id: u64,
    config: &AttentionConfig,
    num_blocks: usize,
    writes: &[super::RecordedWrite],
    step: &StepInputs<'_>,
    extra: &[(&str, String)],
) -> Vec<u8> {
    let (hq, hkv, d) = (config.num_heads, config.num_kv_heads, config.head_size);
    let b = step.seq_lens.len();
    let width = step.block_table.first().map_or(0, Vec::len);
    let mut tensors = Vec::new();
    for (i, w) in writes.iter().enumerate() {
        let n = w.slot_mapping.len();
        tensors.push((
            format!("write.{i}.key"),
            Dtype::F32,
            vec![n, hkv, d],
            f32_bytes(&w.key),
        ));
        tensors.push((
            format!("write.{i}.value"),
            Dtype::F32,
            // `[n, 1, 0]` in an MLA case: V is the first head_size_v dims of each key.
            vec![n, hkv, config.value_row() / hkv.max(1)],
            f32_bytes(&w.value),
        ));
        tensors.push((
            format!("write.{i}.slot_mapping"),
            Dtype::I64,
            vec![n],
            i64_bytes(&w.slot_mapping),
        ));
    }
    let query_lens = step.query_start_loc.windows(2).map(|w| w[1] - w[0]);
    tensors.push((
        "query".into(),
        Dtype::F32,
        vec![step.num_tokens, hq, d],
        f32_bytes(step.query),
    ));
    tensors.push((
        "query_start_loc".into(),
        Dtype::I32,
        vec![b + 1],
        i32_bytes(step.query_start_loc.iter().copied()),
    ));
    tensors.push((
        "query_lens".into(),
        Dtype::I32,
        vec![b],
        i32_bytes(query_lens),
    ));
    tensors.push((
        "seq_lens".into(),
        Dtype::I32,
        vec![b],
        i32_bytes(step.seq_lens.iter().copied()),
    ));
    // Sent only when a request is non-causal (only to adapters that list `non_causal`).
    if let Some(causal) = step.causal {
        tensors.push((
            "causal".into(),
            Dtype::I32,
            vec![b],
            i32_bytes(causal.iter().map(|&c| usize::from(c))),
        ));
    }
    // PrefixLM ranges as rows (seq, start, end), ends inclusive, and whether they are
    // clamped to the window; R-SWA's prefix lengths and window. Each sent only when the
    // step has it (only to adapters that list `prefix_lm` or `rswa`).
    if let Some(p) = step.prefix_lm {
        let rows: Vec<usize> = p
            .ranges
            .iter()
            .enumerate()
            .flat_map(|(s, r)| r.iter().flat_map(move |&(a, e)| [s, a, e]))
            .collect();
        tensors.push((
            "prefix_lm_ranges".into(),
            Dtype::I32,
            vec![rows.len() / 3, 3],
            i32_bytes(rows),
        ));
        tensors.push((
            "prefix_lm_clamp".into(),
            Dtype::I32,
            vec![1],
            i32_bytes([usize::from(p.clamp_to_window)]),
        ));
    }
    if let Some(r) = step.rswa {
        tensors.push((
            "rswa_prefix_lens".into(),
            Dtype::I32,
            vec![b],
            i32_bytes(r.prefix_lens.iter().copied()),
        ));
        tensors.push((
            "rswa_window".into(),
            Dtype::I32,
            vec![1],
            i32_bytes([r.window]),
        ));
    }
    tensors.push((
        "block_table".into(),
        Dtype::I32,
        vec![b, width],
        i32_bytes(step.block_table.iter().flatten().map(|&x| x as usize)),
    ));
    let mut m = meta(&[
        ("version", PROTOCOL_VERSION.to_string()),
        ("case_id", case_id.to_string()),
        (
            "config",
            serde_json::to_string(config).expect("config serializes"),
        ),
        ("num_blocks", num_blocks.to_string()),
        ("num_tokens", step.num_tokens.to_string()),
        ("num_writes", writes.len().to_string()),
    ]);
    m.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    serialize(tensors, m)
}

fn decode_output(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    use attn_reference::bytes::{decode_f64_as_f32, decode_values};
    use attn_reference::DType;
    Some(match dtype {
        Dtype::F32 => decode_values(DType::F32, bytes),
        Dtype::F64 => decode_f64_as_f32(bytes),
        Dtype::F16 => decode_values(DType::F16, bytes),
        Dtype::BF16 => decode_values(DType::Bf16, bytes),
        _ => return None,
    })
}

/// Parse the reply to case `case_id`, whose output must be `shape`.
pub fn parse_reply(bytes: &[u8], case_id: u64, shape: [usize; 3]) -> Result<Reply, ProtocolError> {
    const WHAT: &str = "reply";
    let m = read_meta(bytes, WHAT)?;
    let got = get(&m, WHAT, "case_id")?;
    if got != case_id.to_string() {
        return Err(ProtocolError::WrongCase {
            expected: case_id,
            got: got.to_string(),
        });
    }
    match get(&m, WHAT, "message")? {
        "unsupported" => Ok(Reply::Unsupported(get(&m, WHAT, "reason")?.to_string())),
        "error" => Ok(Reply::Error(get(&m, WHAT, "error")?.to_string())),
        "output" => {
            let kernel_seconds = match m.get("kernel_seconds") {
                None => None,
                Some(v) => Some(
                    v.parse::<f64>()
                        .ok()
                        .filter(|s| s.is_finite() && *s >= 0.0)
                        .ok_or_else(|| ProtocolError::BadMetadata {
                            what: WHAT,
                            key: "kernel_seconds",
                            value: v.clone(),
                            message: "not a non-negative number of seconds".into(),
                        })?,
                ),
            };
            let st =
                SafeTensors::deserialize(bytes).map_err(|e| ProtocolError::NotSafetensors {
                    what: WHAT,
                    message: e.to_string(),
                })?;
            let t = st
                .tensor("output")
                .map_err(|_| ProtocolError::MissingOutput)?;
            if t.shape() != shape {
                return Err(ProtocolError::OutputShape {
                    expected: shape.to_vec(),
                    actual: t.shape().to_vec(),
                });
            }
            let values = decode_output(t.dtype(), t.data())
                .ok_or_else(|| ProtocolError::OutputDtype(format!("{:?}", t.dtype())))?;
            Ok(Reply::Output {
                values,
                kernel_seconds,
            })
        }
        other => Err(ProtocolError::UnknownMessage(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(pairs: &[(&str, &str)], output: Option<(Dtype, Vec<usize>, Vec<u8>)>) -> Vec<u8> {
        let m = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let t = output
            .map(|(d, s, b)| vec![("output".to_string(), d, s, b)])
            .unwrap_or_default();
        serialize(t, m)
    }

    #[test]
    fn an_output_reply_parses() {
        let r = reply(
            &[
                ("message", "output"),
                ("case_id", "3"),
                ("kernel_seconds", "0.5"),
            ],
            Some((Dtype::F32, vec![1, 1, 2], f32_bytes(&[1.0, 2.0]))),
        );
        assert_eq!(
            parse_reply(&r, 3, [1, 1, 2]),
            Ok(Reply::Output {
                values: vec![1.0, 2.0],
                kernel_seconds: Some(0.5)
            })
        );
    }

    #[test]
    fn malformed_replies_name_what_is_wrong() {
        let out = Some((Dtype::F32, vec![1, 1, 2], f32_bytes(&[1.0, 2.0])));
        let r = reply(&[("message", "output"), ("case_id", "2")], out.clone());
        assert!(parse_reply(&r, 3, [1, 1, 2])
            .unwrap_err()
            .to_string()
            .contains("case 2"));
        let r = reply(&[("message", "output"), ("case_id", "3")], out.clone());
        let e = parse_reply(&r, 3, [1, 2, 2]).unwrap_err().to_string();
        assert!(e.contains("shape [1, 1, 2]"), "{e}");
        let r = reply(&[("message", "output"), ("case_id", "3")], None);
        assert_eq!(
            parse_reply(&r, 3, [1, 1, 2]),
            Err(ProtocolError::MissingOutput)
        );
        let r = reply(&[("message", "bye"), ("case_id", "3")], None);
        assert!(parse_reply(&r, 3, [1, 1, 2])
            .unwrap_err()
            .to_string()
            .contains("`bye`"));
        let r = reply(
            &[
                ("message", "output"),
                ("case_id", "3"),
                ("kernel_seconds", "soon"),
            ],
            out,
        );
        assert!(parse_reply(&r, 3, [1, 1, 2])
            .unwrap_err()
            .to_string()
            .contains("kernel_seconds"));
        assert!(matches!(
            parse_reply(b"garbage", 3, [1, 1, 2]),
            Err(ProtocolError::NotSafetensors { .. })
        ));
    }

    #[test]
    fn the_handshake_checks_protocol_and_version() {
        let h = reply(
            &[
                ("message", "hello"),
                ("protocol", PROTOCOL),
                ("version", "1"),
                ("name", "x"),
                ("capabilities", r#"{"head_sizes": [64]}"#),
            ],
            None,
        );
        assert_eq!(
            parse_hello(&h).unwrap().capabilities.head_sizes,
            Some(vec![64])
        );
        let h = reply(
            &[
                ("message", "hello"),
                ("protocol", PROTOCOL),
                ("version", "7"),
                ("name", "x"),
            ],
            None,
        );
        assert!(parse_hello(&h)
            .unwrap_err()
            .to_string()
            .contains("version 1"));
    }

    #[test]
    fn the_handshake_may_name_environment_and_inherited_capabilities() {
        let hello = |extra: &[(&str, &str)]| {
            let mut m = vec![
                ("message", "hello"),
                ("protocol", PROTOCOL),
                ("version", "2"),
                ("name", "x"),
            ];
            m.extend_from_slice(extra);
            parse_hello(&reply(&m, None))
        };
        let h = hello(&[]).unwrap();
        assert!(h.environment.is_empty() && h.inherited_capabilities.is_none());
        let h = hello(&[
            ("environment", r#"{"PLUGIN_FILE": "/src/attn.py"}"#),
            ("inherited_capabilities", "numpy_reference.NumpyReference"),
        ])
        .unwrap();
        assert_eq!(h.environment["PLUGIN_FILE"], "/src/attn.py");
        assert_eq!(
            h.inherited_capabilities.as_deref(),
            Some("numpy_reference.NumpyReference")
        );
        for text in [r#"{"N": 3}"#, r#"{"A B": "x"}"#, r#"{"1X": "x"}"#, "[]"] {
            let bad = hello(&[("environment", text)]).unwrap_err();
            assert!(
                matches!(
                    bad,
                    ProtocolError::BadMetadata {
                        key: "environment",
                        ..
                    }
                ),
                "{text}: {bad}"
            );
        }
    }

    #[test]
    fn a_handshake_may_declare_batch_invariance_and_nothing_else_reads_as_it() {
        let hello = |caps: &str| {
            parse_hello(&reply(
                &[
                    ("message", "hello"),
                    ("protocol", PROTOCOL),
                    ("version", "2"),
                    ("name", "x"),
                    ("capabilities", caps),
                ],
                None,
            ))
        };
        assert!(!hello("{}").unwrap().batch_invariant);
        assert!(
            hello(r#"{"batch_invariant": true}"#)
                .unwrap()
                .batch_invariant
        );
        assert!(
            !hello(r#"{"batch_invariant": false}"#)
                .unwrap()
                .batch_invariant
        );
        for text in [r#"{"batch_invariant": "yes"}"#, r#"{"batch_invariant": 1}"#] {
            let bad = hello(text).unwrap_err().to_string();
            assert!(
                bad.contains("capabilities.batch_invariant"),
                "{text}: {bad}"
            );
        }
    }
}
