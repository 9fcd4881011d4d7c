//! The safetensors form of a case: lossless round trip, typed errors for foreign files.

use attn_harness::export::{case_from_safetensors, case_to_safetensors, TensorFileError};
use attn_reference::{build_case, AttentionConfig, BuildOptions, DType};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;

fn sample(dtype: DType) -> attn_reference::Case {
    let c = AttentionConfig::new(6, 2, 5, 3, dtype);
    build_case(
        &[7, 4, 1],
        &[2, 4, 1],
        c,
        9,
        &BuildOptions {
            padding_tokens: 2,
            spare_blocks: 2,
            ..Default::default()
        },
    )
}

#[test]
fn round_trips_every_dtype_with_the_oracle_output() {
    for dt in DType::ALL {
        let case = sample(dt);
        let expected = attn_reference::reference_output(&case);
        let bytes = case_to_safetensors(&case, Some(&expected));
        let (back, e) = case_from_safetensors(&bytes).unwrap();
        assert_eq!(back, case);
        assert_eq!(e.unwrap(), expected);
    }
}

/// Rewrite one tensor of an exported file.
fn with_tensor(
    bytes: &[u8],
    name: &str,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
) -> Vec<u8> {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(bytes).unwrap();
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    for o in owned.iter_mut() {
        if o.0 == name {
            *o = (name.to_string(), dtype, shape.clone(), data.clone());
        }
    }
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let md: Option<HashMap<String, String>> = meta.metadata().clone();
    safetensors::serialize(views, &md).unwrap()
}

#[test]
fn wrong_dtype_shape_or_missing_pieces_are_named() {
    let case = sample(DType::Bf16);
    let bytes = case_to_safetensors(&case, None);
    let n = case.num_tokens() * 6 * 5;
    let bad = with_tensor(
        &bytes,
        "query",
        Dtype::F32,
        vec![case.num_tokens(), 6, 5],
        vec![0u8; n * 4],
    );
    assert!(
        matches!(case_from_safetensors(&bad), Err(TensorFileError::WrongDtype { ref name, .. }) if name == "query")
    );
    let bad = with_tensor(&bytes, "key", Dtype::BF16, vec![1, 2, 5], vec![0u8; 20]);
    assert!(
        matches!(case_from_safetensors(&bad), Err(TensorFileError::WrongShape { ref name, .. }) if name == "key")
    );
    let bad = with_tensor(
        &bytes,
        "seq_lens",
        Dtype::I32,
        vec![3],
        [-1i32, 4, 1].iter().flat_map(|x| x.to_le_bytes()).collect(),
    );
    assert!(case_from_safetensors(&bad).is_err());
    assert!(matches!(
        case_from_safetensors(b"not a tensor file"),
        Err(TensorFileError::Format(_))
    ));
    assert!(matches!(
        case_from_safetensors(&bytes[..bytes.len() / 2]),
        Err(TensorFileError::Format(_))
    ));
}

#[test]
fn a_slot_collision_inside_a_tensor_file_is_a_case_error() {
    let case = sample(DType::F32);
    let bytes = case_to_safetensors(&case, None);
    let mut slots = case.layout.slot_mapping.clone();
    slots[1] = slots[0];
    let bad = with_tensor(
        &bytes,
        "slot_mapping",
        Dtype::I64,
        vec![slots.len()],
        slots.iter().flat_map(|x| x.to_le_bytes()).collect(),
    );
    assert!(matches!(
        case_from_safetensors(&bad),
        Err(TensorFileError::InvalidCase(_))
    ));
}
