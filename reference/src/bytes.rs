//! Tensor values as little-endian bytes, the one codec for every file and wire format that
//! carries them (`attn-diff export` and the external-backend protocol).

use crate::DType;

/// `values` stored in `dtype` (rounded to it), little-endian.
pub fn encode_values(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::Bf16 => values
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
    }
}

/// Values stored in `dtype`, widened to f32 (a trailing partial element is ignored; callers
/// check lengths against shapes first).
pub fn decode_values(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    }
}

/// f64 values, little-endian, narrowed to f32.
pub fn decode_f64_as_f32(bytes: &[u8]) -> Vec<f32> {
    decode_f64(bytes).into_iter().map(|x| x as f32).collect()
}

pub fn encode_f64(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn decode_f64(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Indices as int32 (the formats' index type for lengths, tables and offsets).
pub fn encode_i32(values: impl IntoIterator<Item = usize>) -> Vec<u8> {
    values
        .into_iter()
        .flat_map(|x| (x as i32).to_le_bytes())
        .collect()
}

pub fn decode_i32(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
        .collect()
}

pub fn encode_i64(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn decode_i64(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_in_every_dtype() {
        let v = [0.0f32, 1.5, -2.25, 1e-3, 65504.0];
        for dt in DType::ALL {
            let back = decode_values(dt, &encode_values(dt, &v));
            let rounded: Vec<f32> = v.iter().map(|&x| dt.round(x)).collect();
            assert_eq!(back, rounded, "{dt}");
            assert_eq!(
                encode_values(dt, &v).len(),
                v.len() * dt.size_bytes(),
                "{dt}"
            );
        }
        assert_eq!(
            decode_i32(&encode_i32([0, 7, 1 << 20])),
            vec![0, 7, 1 << 20]
        );
        assert_eq!(decode_i64(&encode_i64(&[-1, 5])), vec![-1, 5]);
        assert_eq!(decode_f64(&encode_f64(&[0.25, -3.0])), vec![0.25, -3.0]);
    }
}
