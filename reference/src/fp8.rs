//! FP8 KV caches as vLLM keeps them: K and V stored as `fp8(x / scale)` with one per-tensor
//! `k_scale` and `v_scale`, read back as `fp8 * scale`.
//!
//! The two formats are vLLM's `fp8_e4m3` (OCP E4M3FN: bias 7, no infinity, NaN only at
//! `S.1111.111`, largest finite 448) and `fp8_e5m2` (bias 15, IEEE-like with infinities,
//! largest finite 57344). Writes round to nearest even and saturate to the largest finite
//! value, as vLLM's conversions do (`__NV_SATFINITE`); NaN stays NaN.
//!
//! This is the reference quantizer: it decodes every one of the 256 codes by the format's
//! definition and picks the nearest finite code by search, sharing nothing with the bit
//! manipulation a kernel uses, so a kernel's quantizer can be checked against it.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// The storage format of an FP8 KV cache (vLLM's `kv_cache_dtype` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Fp8Format {
    /// E4M3FN: 4 exponent bits (bias 7), 3 mantissa bits, saturating at ±448.
    #[serde(rename = "fp8_e4m3")]
    E4m3,
    /// E5M2: 5 exponent bits (bias 15), 2 mantissa bits, saturating at ±57344.
    #[serde(rename = "fp8_e5m2")]
    E5m2,
}

impl Fp8Format {
    pub const ALL: [Fp8Format; 2] = [Fp8Format::E4m3, Fp8Format::E5m2];

    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4m3 => "fp8_e4m3",
            Fp8Format::E5m2 => "fp8_e5m2",
        }
    }

    fn bits(self) -> (u32, i32) {
        match self {
            Fp8Format::E4m3 => (3, 7),
            Fp8Format::E5m2 => (2, 15),
        }
    }

    /// The value of `code` by the format's definition: `NaN` for the NaN codes, `±inf` for
    /// E5M2's infinities.
    pub fn decode(self, code: u8) -> f64 {
        let (mbits, bias) = self.bits();
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp = ((code & 0x7f) >> mbits) as i32;
        let mant = (code & ((1 << mbits) - 1)) as i32;
        let max_exp = (1 << (7 - mbits)) - 1;
        match self {
            Fp8Format::E4m3 if exp == max_exp && mant == (1 << mbits) - 1 => return f64::NAN,
            Fp8Format::E5m2 if exp == max_exp && mant != 0 => return f64::NAN,
            Fp8Format::E5m2 if exp == max_exp => return sign * f64::INFINITY,
            _ => {}
        }
        let frac = mant as f64 / (1 << mbits) as f64;
        let magnitude = if exp == 0 {
            frac * 2f64.powi(1 - bias)
        } else {
            (1.0 + frac) * 2f64.powi(exp - bias)
        };
        sign * magnitude
    }

    /// Largest finite value (448 or 57344).
    pub fn max_finite(self) -> f64 {
        match self {
            Fp8Format::E4m3 => 448.0,
            Fp8Format::E5m2 => 57344.0,
        }
    }

    /// The non-negative finite codes with their values, in increasing order (decoded once).
    #[cfg(test)]
    fn finite_codes(self) -> &'static [(u8, f64)] {
        static TABLES: OnceLock<[Vec<(u8, f64)>; 2]> = OnceLock::new();
        let tables = TABLES.get_or_init(|| {
            Fp8Format::ALL.map(|f| {
                (0u8..0x80)
                    .map(|c| (c, f.decode(c)))
                    .take_while(|(_, v)| v.is_finite())
                    .collect()
            })
        });
        match self {
            Fp8Format::E4m3 => &tables[0],
            Fp8Format::E5m2 => &tables[1],
        }
    }

    /// The code a NaN is stored as.
    pub fn nan_code(self) -> u8 {
        0x7f
    }

    /// `x` rounded to the nearest finite code (ties to the even code), saturating beyond the
    /// largest finite value; NaN gives [`Fp8Format::nan_code`].
    ///
    /// The non-negative codes are contiguous in value: inside a binade of exponent `e` (or
    /// among the subnormals) they step by one quantum `2^(max(e, 1 - bias) - mbits)`, and the
    /// code after a binade's last is the next binade's first. So the code is the binade's
    /// first code plus `a / quantum` rounded to the nearest integer, ties to even (an even
    /// count is an even code): exact, as dividing by a power of two is.
    pub fn encode(self, x: f64) -> u8 {
        if x.is_nan() {
            return self.nan_code();
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = x.abs().min(self.max_finite());
        let (mbits, bias) = self.bits();
        let min_exp = 1 - bias;
        let e = if a == 0.0 {
            min_exp
        } else {
            (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(min_exp)
        };
        // 2^(e - mbits) built from its bits (e - mbits >= -17: a normal f64).
        let quantum = f64::from_bits(((e - mbits as i32 + 1023) as u64) << 52);
        let steps = (a / quantum).round_ties_even() as i32;
        // Subnormals (e = min_exp) start at code 0, the binade of e at (e + bias - 1) << mbits
        // counted from its implicit leading one.
        let base = if e == min_exp && steps < (1 << mbits) {
            0
        } else {
            ((e + bias) << mbits) - (1 << mbits)
        };
        sign | (base + steps) as u8
    }

    /// [`Fp8Format::encode`] by search over the decoded codes: the definition the fast path
    /// is tested against.
    #[cfg(test)]
    fn encode_by_search(self, x: f64) -> u8 {
        if x.is_nan() {
            return self.nan_code();
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = x.abs().min(self.max_finite());
        // The non-negative finite codes 0x00.. are increasing in value: find the last one
        // not above `a`, then compare with its successor.
        let finite = self.finite_codes();
        let below = finite.partition_point(|&(_, v)| v <= a) - 1;
        let (lo_code, lo) = finite[below];
        let code = match finite.get(below + 1) {
            Some(&(hi_code, hi)) => {
                let (down, up) = (a - lo, hi - a);
                if up < down || (up == down && lo_code & 1 == 1) {
                    hi_code
                } else {
                    lo_code
                }
            }
            None => lo_code,
        };
        sign | code
    }

    /// The stored code of `x` in a cache with `scale`: `fp8(x / scale)`, the division in
    /// f32 as kernels do it.
    pub fn quantize(self, x: f32, scale: f32) -> u8 {
        self.encode((x / scale) as f64)
    }

    /// What a kernel reads for `code`: `fp8 * scale`, exactly (in f64).
    pub fn dequantize(self, code: u8, scale: f32) -> f64 {
        self.decoded()[code as usize] * scale as f64
    }

    /// Every code's value (decoded once).
    fn decoded(self) -> &'static [f64; 256] {
        static TABLES: OnceLock<[[f64; 256]; 2]> = OnceLock::new();
        let tables = TABLES
            .get_or_init(|| Fp8Format::ALL.map(|f| std::array::from_fn(|c| f.decode(c as u8))));
        match self {
            Fp8Format::E4m3 => &tables[0],
            Fp8Format::E5m2 => &tables[1],
        }
    }

    /// `x` as it comes back out of the cache: quantized, then dequantized.
    pub fn round_trip(self, x: f32, scale: f32) -> f64 {
        self.dequantize(self.quantize(x, scale), scale)
    }
}

impl fmt::Display for Fp8Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fp8Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "fp8_e4m3" | "fp8" | "e4m3" | "e4m3fn" => Ok(Fp8Format::E4m3),
            "fp8_e5m2" | "e5m2" => Ok(Fp8Format::E5m2),
            other => Err(format!(
                "unknown KV-cache dtype `{other}` (expected fp8_e4m3 or fp8_e5m2)"
            )),
        }
    }
}

/// An FP8 KV cache: its format, vLLM's per-tensor scales (one for all of K, one for all of V,
/// across every layer position, head and block), and how fine the scales are
/// ([`KvScales`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fp8KvCache {
    pub dtype: Fp8Format,
    pub k_scale: f32,
    pub v_scale: f32,
    /// An FP8 query: before the kernel the query is quantized to E4M3 with this per-tensor
    /// scale (`fp8(q / q_scale)`, saturating), and the kernel reads it back as
    /// `fp8 * q_scale`. vLLM's layer does this (`query_quant`, `_q_scale`) only with an FP8
    /// cache and only for backends that take an FP8 query, whatever the cache's format.
    /// Left out of JSON when `None`, so older cases read and write the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q_scale: Option<f32>,
    /// Scales finer than the tensor: per kv head, or per token and kv head. Left out of JSON
    /// when per tensor, so older cases read and write the same.
    #[serde(default, skip_serializing_if = "KvScales::is_tensor")]
    pub scales: KvScales,
}

/// How fine an FP8 cache's scales are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "granularity", rename_all = "snake_case", deny_unknown_fields)]
pub enum KvScales {
    /// `k_scale` and `v_scale` for every element.
    #[default]
    Tensor,
    /// One scale per kv head for K and one for V (vLLM's `use_per_head_quant_scales`, flash
    /// attention 3's per-head descale); `k_scale` and `v_scale` stay 1.
    Head { k: Vec<f32>, v: Vec<f32> },
    /// One scale per token and kv head, computed when the row is written (vLLM's
    /// `fp8_per_token_head` cache, `triton_reshape_and_cache_flash_per_token_head_quant`):
    /// [`KvScales::token_scale`] of the row's largest magnitude. E4M3 only; `k_scale` and
    /// `v_scale` stay 1.
    Token,
}

impl KvScales {
    /// The smallest per-token scale vLLM's writer stores (a zero row's).
    pub const TOKEN_SCALE_FLOOR: f32 = 1e-6;

    pub fn is_tensor(&self) -> bool {
        *self == KvScales::Tensor
    }

    /// A name for reports and coverage: "tensor", "head" or "token".
    pub fn name(&self) -> &'static str {
        match self {
            KvScales::Tensor => "tensor",
            KvScales::Head { .. } => "head",
            KvScales::Token => "token",
        }
    }

    /// The scale of one written (token, kv head) row, as vLLM's writer computes it in f32:
    /// `max(max|x| / fmt_max, 1e-6)`; its elements are then stored as `fp8(x * (1 / s))`
    /// ([`Fp8KvCache::scaled_for_write`]).
    pub fn token_scale(format: Fp8Format, row: &[f32]) -> f32 {
        let absmax = row.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
        (absmax / format.max_finite() as f32).max(Self::TOKEN_SCALE_FLOOR)
    }

    /// These scales for a cache of `kv_heads` heads: per-head scales cut or repeated to that
    /// many (shrinking and fitting change head counts; a scale list drawn for more heads
    /// keeps its first ones).
    pub fn fitted_to_heads(&self, kv_heads: usize) -> KvScales {
        match self {
            KvScales::Head { k, v } if !k.is_empty() && !v.is_empty() => KvScales::Head {
                k: (0..kv_heads).map(|h| k[h % k.len()]).collect(),
                v: (0..kv_heads).map(|h| v[h % v.len()]).collect(),
            },
            other => other.clone(),
        }
    }
}

impl Fp8KvCache {
    pub fn new(dtype: Fp8Format, k_scale: f32, v_scale: f32) -> Self {
        Fp8KvCache {
            dtype,
            k_scale,
            v_scale,
            q_scale: None,
            scales: KvScales::Tensor,
        }
    }

    /// The format an FP8 query is quantized to: vLLM's `QuantFP8` uses the platform's FP8
    /// type, E4M3, whatever the cache's format.
    pub const QUERY_FORMAT: Fp8Format = Fp8Format::E4m3;

    /// Query values as the kernel reads them: quantized with `q_scale` and read back, or
    /// unchanged without an FP8 query.
    pub fn read_back_q(&self, q: &[f32]) -> Vec<f64> {
        match self.q_scale {
            Some(s) => q
                .iter()
                .map(|&x| Self::QUERY_FORMAT.round_trip(x, s))
                .collect(),
            None => q.iter().map(|&x| x as f64).collect(),
        }
    }

    /// This cache for `kv_heads` heads ([`KvScales::fitted_to_heads`]).
    pub fn fitted_to_heads(&self, kv_heads: usize) -> Fp8KvCache {
        Fp8KvCache {
            scales: self.scales.fitted_to_heads(kv_heads),
            ..self.clone()
        }
    }

    /// `x` divided by its row's scale `s` for the write, in f32 as vLLM's writers do it:
    /// `x / s` per tensor and per head (`reshape_and_cache`), `x * (1 / s)` per token (the
    /// per-token-head writer). The two differ by one FP8 code in about one row in fifty.
    pub fn scaled_for_write(&self, x: f32, s: f32) -> f32 {
        match self.scales {
            KvScales::Token => x * (1.0 / s),
            KvScales::Tensor | KvScales::Head { .. } => x / s,
        }
    }

    /// K's and V's scale for every element of kv head `kv_head`: per tensor or per head. Per
    /// token (each row brings its own scale) these are the per-tensor ones, 1.
    pub fn head_scales(&self, kv_head: usize) -> (f32, f32) {
        match &self.scales {
            KvScales::Head { k, v } => (k[kv_head], v[kv_head]),
            KvScales::Tensor | KvScales::Token => (self.k_scale, self.v_scale),
        }
    }

    /// The scale one written row of kv head `kv_head` (`row`, its values) of K or V gets:
    /// the tensor's, the head's, or the row's own (per token). What every writer of this
    /// project divides by and every reader multiplies by.
    pub fn row_scale(&self, part: KvPart, kv_head: usize, row: &[f32]) -> f32 {
        match (&self.scales, part) {
            (KvScales::Token, _) => KvScales::token_scale(self.dtype, row),
            (_, KvPart::K) => self.head_scales(kv_head).0,
            (_, KvPart::V) => self.head_scales(kv_head).1,
        }
    }

    /// Rows `[tokens, kv_heads, width]` of K or V as a kernel reads them back.
    fn read_back(&self, which: KvPart, x: &[f32], kv_heads: usize, width: usize) -> Vec<f64> {
        if width == 0 {
            return Vec::new();
        }
        x.chunks(width)
            .enumerate()
            .flat_map(|(row, values)| {
                let s = self.row_scale(which, row % kv_heads.max(1), values);
                values.iter().map(move |&e| {
                    let code = self.dtype.encode(self.scaled_for_write(e, s) as f64);
                    self.dtype.dequantize(code, s)
                })
            })
            .collect()
    }

    /// K rows `[tokens, kv_heads, head_size]` as a kernel reads them back from the cache.
    pub fn read_back_k(&self, k: &[f32], kv_heads: usize, head_size: usize) -> Vec<f64> {
        self.read_back(KvPart::K, k, kv_heads, head_size)
    }

    /// V rows `[tokens, kv_heads, head_size_v]` as a kernel reads them back from the cache.
    pub fn read_back_v(&self, v: &[f32], kv_heads: usize, head_size_v: usize) -> Vec<f64> {
        self.read_back(KvPart::V, v, kv_heads, head_size_v)
    }
}

/// K or V: which half of a cache a row is written to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPart {
    K,
    V,
}

impl fmt::Display for Fp8KvCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kv_cache={} (k_scale {}, v_scale {})",
            self.dtype, self.k_scale, self.v_scale
        )?;
        match &self.scales {
            KvScales::Tensor => {}
            KvScales::Head { k, v } => write!(f, ", per kv head (k {k:?}, v {v:?})")?,
            KvScales::Token => write!(f, ", per token and kv head")?,
        }
        match self.q_scale {
            Some(s) => write!(f, ", fp8 query (q_scale {s})"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Fp8Format::{E4m3, E5m2};

    #[test]
    fn encode_agrees_with_the_search_over_codes() {
        let mut rng = crate::InputRng::new(7);
        for f in Fp8Format::ALL {
            // Every code's value, the midpoints between neighbours (ties), just off them.
            let mut xs: Vec<f64> = (0u8..=255).map(|c| f.decode(c)).collect();
            for c in 0u8..0x7e {
                let (a, b) = (f.decode(c), f.decode(c + 1));
                let mid = (a + b) / 2.0;
                xs.extend([mid, mid * (1.0 + 1e-12), mid * (1.0 - 1e-12), -mid]);
            }
            xs.extend((0..200_000).map(|i| rng.normal() * 10f64.powi(i % 12 - 6)));
            xs.extend([0.0, -0.0, 1e-300, 1e300, f64::INFINITY, f64::NEG_INFINITY]);
            for x in xs {
                assert_eq!(f.encode(x), f.encode_by_search(x), "{f} {x:e}");
            }
        }
    }

    #[test]
    fn known_bit_patterns_decode() {
        assert_eq!(E4m3.decode(0x38), 1.0);
        assert_eq!(E4m3.decode(0x7e), 448.0);
        assert_eq!(E4m3.decode(0xfe), -448.0);
        assert_eq!(E4m3.decode(0x01), 2f64.powi(-9));
        assert_eq!(E4m3.decode(0x08), 2f64.powi(-6));
        assert_eq!(E4m3.decode(0x78), 256.0);
        assert!(E4m3.decode(0x7f).is_nan() && E4m3.decode(0xff).is_nan());
        assert_eq!(E5m2.decode(0x3c), 1.0);
        assert_eq!(E5m2.decode(0x7b), 57344.0);
        assert_eq!(E5m2.decode(0x01), 2f64.powi(-16));
        assert_eq!(E5m2.decode(0x7c), f64::INFINITY);
        assert_eq!(E5m2.decode(0xfc), f64::NEG_INFINITY);
        assert!(E5m2.decode(0x7d).is_nan() && E5m2.decode(0x7f).is_nan());
        // Every E5M2 code is the top byte of the f16 with the same value.
        for c in 0..=255u8 {
            let h = half::f16::from_bits((c as u16) << 8).to_f64();
            let v = E5m2.decode(c);
            assert!(v == h || (v.is_nan() && h.is_nan()), "{c:#x}");
        }
    }

    #[test]
    fn encoding_rounds_to_nearest_even_and_saturates() {
        // Exact values and their neighbours.
        assert_eq!(E4m3.encode(1.0), 0x38);
        assert_eq!(E4m3.encode(-2.0), 0xc0);
        assert_eq!(
            E4m3.encode(1.0625),
            0x38,
            "a tie between 1 and 1.125 goes to 1 (even)"
        );
        assert_eq!(
            E4m3.encode(1.1875),
            0x3a,
            "a tie between 1.125 and 1.25 goes to 1.25"
        );
        assert_eq!(E4m3.encode(1.07), 0x39);
        // Subnormals: 2^-10 is a tie between 0 and 2^-9, which goes to 0.
        assert_eq!(E4m3.encode(2f64.powi(-10)), 0x00);
        assert_eq!(E4m3.encode(3.0 * 2f64.powi(-10)), 0x02);
        assert_eq!(E4m3.encode(-1e-30), 0x80, "the sign of zero is kept");
        // Saturation, not NaN: 464 is halfway to the (nonexistent) 480.
        assert_eq!(E4m3.encode(448.0), 0x7e);
        assert_eq!(E4m3.encode(464.0), 0x7e);
        assert_eq!(E4m3.encode(1e6), 0x7e);
        assert_eq!(E4m3.encode(f64::NEG_INFINITY), 0xfe);
        assert_eq!(E4m3.encode(f64::NAN), 0x7f);
        assert_eq!(E5m2.encode(57344.0), 0x7b);
        assert_eq!(E5m2.encode(61440.0), 0x7b);
        assert_eq!(E5m2.encode(f64::INFINITY), 0x7b);
        assert_eq!(E5m2.encode(1.125), 0x3c, "tie between 1 and 1.25 goes to 1");
        assert_eq!(
            E5m2.encode(1.375),
            0x3e,
            "tie between 1.25 and 1.5 goes to 1.5"
        );
        assert!(E5m2.decode(E5m2.encode(f64::NAN)).is_nan());
    }

    #[test]
    fn every_finite_code_encodes_to_itself() {
        for f in Fp8Format::ALL {
            for c in 0..=255u8 {
                let v = f.decode(c);
                if v.is_finite() {
                    assert_eq!(f.encode(v), c, "{f} {c:#x} = {v}");
                }
            }
        }
    }

    #[test]
    fn scales_divide_on_write_and_multiply_on_read() {
        let c = Fp8KvCache::new(E4m3, 0.5, 4.0);
        // 3 / 0.5 = 6, stored exactly, read as 6 * 0.5.
        assert_eq!(c.read_back_k(&[3.0], 1, 1), vec![3.0]);
        // 1000 / 0.5 = 2000 saturates to 448: read as 224.
        assert_eq!(c.read_back_k(&[1000.0], 1, 1), vec![224.0]);
        assert_eq!(
            c.read_back_v(&[1000.0], 1, 1),
            vec![1024.0],
            "250 rounds to 256"
        );
        assert_eq!(E5m2.round_trip(3.0, 1.0), 3.0);
    }

    #[test]
    fn head_scales_apply_to_their_own_kv_head() {
        let c = Fp8KvCache {
            scales: KvScales::Head {
                k: vec![0.5, 4.0],
                v: vec![1.0, 0.25],
            },
            ..Fp8KvCache::new(E4m3, 1.0, 1.0)
        };
        // Two tokens x two kv heads x head size 1: head 0 saturates at 448 * 0.5, head 1
        // stores 896 / 4 = 224 exactly; 3 / 4 = 0.75 is exact too.
        let k = [1000.0, 896.0, 3.0, 3.0];
        assert_eq!(c.read_back_k(&k, 2, 1), vec![224.0, 896.0, 3.0, 3.0]);
        assert_eq!(c.read_back_v(&k, 2, 1), vec![448.0, 112.0, 3.0, 3.0]);
        // Fitting to other head counts cycles the first scales.
        let KvScales::Head { k, .. } = c.scales.fitted_to_heads(3) else {
            panic!("per head")
        };
        assert_eq!(k, vec![0.5, 4.0, 0.5]);
    }

    #[test]
    fn token_scales_follow_each_rows_largest_magnitude() {
        let c = Fp8KvCache {
            scales: KvScales::Token,
            ..Fp8KvCache::new(E4m3, 1.0, 1.0)
        };
        // Each row's largest value maps to 448 and comes back exactly; a zero row gets the
        // floor scale and stays zero.
        let rows = [896.0, -1.0, 0.0, 0.0, 1e-3, 5e-4];
        let back = c.read_back_k(&rows, 1, 2);
        assert_eq!(back[0], 896.0);
        assert_eq!(&back[2..4], &[0.0, 0.0]);
        assert_eq!(KvScales::token_scale(E4m3, &[0.0, 0.0]), 1e-6);
        let s = KvScales::token_scale(E4m3, &[1e-3, 5e-4]);
        assert_eq!(s, 1e-3f32 / 448.0);
        assert_eq!(back[4], E4m3.round_trip(1e-3, s));
        // -1 in a row scaled by 2: 1/2 is exact in E4M3.
        assert_eq!(back[1], -1.0);
    }

    #[test]
    fn names_parse_and_serialize_as_vllm_spells_them() {
        for f in Fp8Format::ALL {
            assert_eq!(f.name().parse::<Fp8Format>(), Ok(f));
            assert_eq!(
                serde_json::to_string(&f).unwrap(),
                format!("\"{}\"", f.name())
            );
        }
        assert!("int8".parse::<Fp8Format>().unwrap_err().contains("int8"));
    }
}
