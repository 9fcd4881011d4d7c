//! A case as a safetensors file, so any other tool (a Python backend, a notebook) can check
//! itself against exactly the case attn-diff ran, and the way cases cross a process boundary.
//!
//! Tensors (format version 1):
//! - `query [T, Hq, D]`, `key [T, Hkv, D]`, `value [T, Hkv, D]` in the case dtype;
//! - `context_key.{s}` / `context_value.{s}` `[context_len_s, Hkv, D]` per sequence (absent
//!   when the context is empty), in the case dtype;
//! - an MLA case (`config.mla`) has no V of its own: `value` and `context_value.{s}` are
//!   `[.., 1, 0]`, and `expected` is `[T_real, Hq, head_size_v]`;
//! - `block_table [B, max_blocks] i32`, `slot_mapping [T] i64`, `seq_lens [B] i32`,
//!   `query_lens [B] i32`, `query_start_loc [B + 1] i32`;
//! - `expected [T_real, Hq, D] f64`: the oracle's output (when exported with it).
//!
//! Metadata: `attn_diff_format` = "1", `config` (JSON of the attention config),
//! `num_blocks`, `num_padding_tokens`.

use attn_reference::{AttentionConfig, Batch, Case, DType, PagedLayout, Tensors};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;

pub const FORMAT_VERSION: &str = "1";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TensorFileError {
    #[error("not a safetensors file: {0}")]
    Format(String),
    #[error("metadata `{0}` is missing")]
    MissingMetadata(&'static str),
    #[error("metadata `{key}` is invalid: {message}")]
    BadMetadata { key: &'static str, message: String },
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("tensor `{name}` has dtype {actual}, expected {expected}")]
    WrongDtype {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    WrongShape {
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("the case in the file is invalid: {0}")]
    InvalidCase(#[from] attn_reference::CaseError),
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::Bf16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
    }
}

use attn_reference::bytes::{
    decode_f64, decode_i32, decode_i64, decode_values, encode_f64, encode_i32, encode_i64,
    encode_values,
};

struct Owned {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Serialize a (valid) case, and optionally the oracle's output, to safetensors bytes.
pub fn case_to_safetensors(case: &Case, expected: Option<&[f64]>) -> Vec<u8> {
    let c = &case.config;
    let (t, hq, hkv, d) = (case.num_tokens(), c.num_heads, c.num_kv_heads, c.head_size);
    // Width of a stored V row: 0 in an MLA case (V is the key's prefix).
    let dv_stored = c.value_row() / hkv.max(1);
    let b = case.num_seqs();
    let mut owned = vec![
        Owned {
            name: "query".into(),
            dtype: st_dtype(c.dtype),
            shape: vec![t, hq, d],
            data: encode_values(c.dtype, &case.tensors.query),
        },
        Owned {
            name: "key".into(),
            dtype: st_dtype(c.dtype),
            shape: vec![t, hkv, d],
            data: encode_values(c.dtype, &case.tensors.key),
        },
        Owned {
            name: "value".into(),
            dtype: st_dtype(c.dtype),
            shape: vec![t, hkv, dv_stored],
            data: encode_values(c.dtype, &case.tensors.value),
        },
        Owned {
            name: "block_table".into(),
            dtype: Dtype::I32,
            shape: vec![b, case.max_blocks_per_seq()],
            data: encode_i32(
                case.layout
                    .block_table
                    .iter()
                    .flatten()
                    .map(|&x| x as usize),
            ),
        },
        Owned {
            name: "slot_mapping".into(),
            dtype: Dtype::I64,
            shape: vec![t],
            data: encode_i64(&case.layout.slot_mapping),
        },
        Owned {
            name: "seq_lens".into(),
            dtype: Dtype::I32,
            shape: vec![b],
            data: encode_i32(case.batch.seq_lens.iter().copied()),
        },
        Owned {
            name: "query_lens".into(),
            dtype: Dtype::I32,
            shape: vec![b],
            data: encode_i32(case.batch.query_lens.iter().copied()),
        },
        Owned {
            name: "query_start_loc".into(),
            dtype: Dtype::I32,
            shape: vec![b + 1],
            data: encode_i32(case.query_start_loc()),
        },
    ];
    for s in 0..b {
        let ctx = case.context_len(s);
        if ctx == 0 {
            continue;
        }
        for (name, v, width) in [
            ("context_key", &case.tensors.context_key[s], d),
            ("context_value", &case.tensors.context_value[s], dv_stored),
        ] {
            owned.push(Owned {
                name: format!("{name}.{s}"),
                dtype: st_dtype(c.dtype),
                shape: vec![ctx, hkv, width],
                data: encode_values(c.dtype, v),
            });
        }
    }
    if let Some(e) = expected {
        owned.push(Owned {
            name: "expected".into(),
            dtype: Dtype::F64,
            shape: vec![case.num_real_tokens(), hq, c.head_size_v()],
            data: encode_f64(e),
        });
    }
    let metadata: HashMap<String, String> = [
        ("attn_diff_format".to_string(), FORMAT_VERSION.to_string()),
        (
            "config".to_string(),
            serde_json::to_string(&case.config).expect("config serializes"),
        ),
        ("num_blocks".to_string(), case.layout.num_blocks.to_string()),
        (
            "num_padding_tokens".to_string(),
            case.batch.num_padding_tokens.to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|o| {
            (
                o.name.clone(),
                TensorView::new(o.dtype, o.shape.clone(), &o.data)
                    .expect("shape matches data by construction"),
            )
        })
        .collect();
    safetensors::serialize(views, &Some(metadata))
        .expect("serializing in-memory tensors cannot fail")
}

fn tensor<'a>(
    st: &'a SafeTensors<'a>,
    name: &str,
    dtype: Dtype,
    shape: &[usize],
) -> Result<safetensors::tensor::TensorView<'a>, TensorFileError> {
    let t = st
        .tensor(name)
        .map_err(|_| TensorFileError::MissingTensor(name.to_string()))?;
    if t.dtype() != dtype {
        return Err(TensorFileError::WrongDtype {
            name: name.into(),
            expected: format!("{dtype:?}"),
            actual: format!("{:?}", t.dtype()),
        });
    }
    if t.shape() != shape {
        return Err(TensorFileError::WrongShape {
            name: name.into(),
            expected: shape.to_vec(),
            actual: t.shape().to_vec(),
        });
    }
    Ok(t)
}

fn i32s(st: &SafeTensors<'_>, name: &str, shape: &[usize]) -> Result<Vec<i64>, TensorFileError> {
    let t = tensor(st, name, Dtype::I32, shape)?;
    Ok(decode_i32(t.data()))
}

fn nonneg(name: &str, v: Vec<i64>) -> Result<Vec<usize>, TensorFileError> {
    v.into_iter()
        .map(|x| {
            usize::try_from(x).map_err(|_| TensorFileError::BadMetadata {
                key: "tensor values",
                message: format!("`{name}` holds negative value {x}"),
            })
        })
        .collect()
}

/// Read a case written by [`case_to_safetensors`] (the `expected` tensor, if any, is returned
/// too). Every inconsistency is a typed error; the case is validated.
pub fn case_from_safetensors(bytes: &[u8]) -> Result<(Case, Option<Vec<f64>>), TensorFileError> {
    let (_, meta) =
        SafeTensors::read_metadata(bytes).map_err(|e| TensorFileError::Format(e.to_string()))?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| TensorFileError::Format(e.to_string()))?;
    let md = meta.metadata().clone().unwrap_or_default();
    let get = |k: &'static str| md.get(k).ok_or(TensorFileError::MissingMetadata(k));
    let version = get("attn_diff_format")?;
    if version != FORMAT_VERSION {
        return Err(TensorFileError::BadMetadata {
            key: "attn_diff_format",
            message: format!("version {version}, this attn-diff reads {FORMAT_VERSION}"),
        });
    }
    let config: AttentionConfig =
        serde_json::from_str(get("config")?).map_err(|e| TensorFileError::BadMetadata {
            key: "config",
            message: e.to_string(),
        })?;
    let parse = |k: &'static str| -> Result<usize, TensorFileError> {
        get(k)?
            .parse()
            .map_err(|e: std::num::ParseIntError| TensorFileError::BadMetadata {
                key: k,
                message: e.to_string(),
            })
    };
    let num_blocks = parse("num_blocks")?;
    let num_padding_tokens = parse("num_padding_tokens")?;

    let b = st
        .tensor("seq_lens")
        .map_err(|_| TensorFileError::MissingTensor("seq_lens".into()))?
        .shape()
        .first()
        .copied()
        .unwrap_or(0);
    let seq_lens = nonneg("seq_lens", i32s(&st, "seq_lens", &[b])?)?;
    let query_lens = nonneg("query_lens", i32s(&st, "query_lens", &[b])?)?;
    let t = query_lens
        .iter()
        .try_fold(num_padding_tokens, |a, &q| a.checked_add(q))
        .ok_or(TensorFileError::BadMetadata {
            key: "num_padding_tokens",
            message: "token count overflows".into(),
        })?;
    let (hq, hkv, d) = (config.num_heads, config.num_kv_heads, config.head_size);
    let dv_stored = config.value_row() / hkv.max(1);
    let dt = st_dtype(config.dtype);
    let values = |name: &str, shape: &[usize]| -> Result<Vec<f32>, TensorFileError> {
        Ok(decode_values(
            config.dtype,
            tensor(&st, name, dt, shape)?.data(),
        ))
    };
    let query = values("query", &[t, hq, d])?;
    let key = values("key", &[t, hkv, d])?;
    let value = values("value", &[t, hkv, dv_stored])?;
    let mut context_key = Vec::with_capacity(b);
    let mut context_value = Vec::with_capacity(b);
    for s in 0..b {
        let ctx = seq_lens[s].saturating_sub(query_lens[s]);
        if ctx == 0 {
            context_key.push(Vec::new());
            context_value.push(Vec::new());
        } else {
            context_key.push(values(&format!("context_key.{s}"), &[ctx, hkv, d])?);
            context_value.push(values(
                &format!("context_value.{s}"),
                &[ctx, hkv, dv_stored],
            )?);
        }
    }
    let bt = st
        .tensor("block_table")
        .map_err(|_| TensorFileError::MissingTensor("block_table".into()))?;
    let width = bt.shape().get(1).copied().unwrap_or(0);
    let table = nonneg("block_table", i32s(&st, "block_table", &[b, width])?)?;
    let block_table: Vec<Vec<u32>> = if width == 0 {
        vec![Vec::new(); b]
    } else {
        table
            .chunks(width)
            .map(|r| r.iter().map(|&x| x as u32).collect())
            .collect()
    };
    let slots = tensor(&st, "slot_mapping", Dtype::I64, &[t])?;
    let slot_mapping: Vec<i64> = decode_i64(slots.data());
    let case = Case {
        config,
        batch: Batch {
            num_padding_tokens,
            ..Batch::plain(seq_lens, query_lens)
        },
        layout: PagedLayout {
            num_blocks,
            block_table,
            slot_mapping,
        },
        tensors: Tensors {
            query,
            key,
            value,
            context_key,
            context_value,
        },
        poison: None,
        recorded: None,
    };
    case.validate()?;
    let expected = match st.tensor("expected") {
        Ok(_) => {
            let e = tensor(
                &st,
                "expected",
                Dtype::F64,
                &[case.num_real_tokens(), hq, d],
            )?;
            Some(decode_f64(e.data()))
        }
        Err(_) => None,
    };
    Ok((case, expected))
}
