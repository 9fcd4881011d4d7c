//! What an adapter declares it can run, sent once in its handshake. The harness answers
//! `supports` from it without a round trip; anything it does not capture, the adapter can
//! still decline per case with an `unsupported` reply.

use crate::Unsupported;
use attn_reference::{AttentionConfig, AttentionKind, DType, Feature};
use serde::{Deserialize, Serialize};

/// Each field left out (or `null`) means "no restriction".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    #[serde(default)]
    pub dtypes: Option<Vec<DType>>,
    #[serde(default)]
    pub head_sizes: Option<Vec<usize>>,
    #[serde(default)]
    pub block_sizes: Option<Vec<usize>>,
    #[serde(default)]
    pub block_size_multiple_of: Option<usize>,
    #[serde(default)]
    pub kinds: Option<Vec<AttentionKind>>,
    /// The optional features implemented (names of [`Feature::OPTIONAL`]); a config using any
    /// other one is unsupported. Encoder-only and cross-attention are declared by `kinds`
    /// instead.
    #[serde(default)]
    pub features: Option<Vec<Feature>>,
}

fn list<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Capabilities {
    pub fn check(&self, c: &AttentionConfig) -> Result<(), Unsupported> {
        if let Some(d) = &self.dtypes {
            if !d.contains(&c.dtype) {
                return Err(
                    Unsupported::new(Feature::Dtype, format!("other than {}", list(d)))
                        .value(c.dtype),
                );
            }
        }
        if let Some(h) = &self.head_sizes {
            if !h.contains(&c.head_size) {
                return Err(
                    Unsupported::new(Feature::HeadSize, format!("other than {}", list(h)))
                        .value(c.head_size),
                );
            }
        }
        if let Some(b) = &self.block_sizes {
            if !b.contains(&c.block_size) {
                return Err(Unsupported::new(
                    Feature::BlockSize,
                    format!("other than {}", list(b)),
                )
                .value(c.block_size));
            }
        }
        if let Some(m) = self.block_size_multiple_of {
            if m > 0 && !c.block_size.is_multiple_of(m) {
                return Err(
                    Unsupported::new(Feature::BlockSize, format!("not a multiple of {m}"))
                        .value(c.block_size),
                );
            }
        }
        if let Some(k) = &self.kinds {
            if !k.contains(&c.kind) {
                let feature = match c.kind {
                    AttentionKind::EncoderDecoder => Feature::CrossAttention,
                    _ => Feature::EncoderOnly,
                };
                return Err(Unsupported::new(feature, ""));
            }
        }
        if let Some(f) = &self.features {
            if let Some(missing) = Feature::OPTIONAL
                .into_iter()
                .filter(|x| ![Feature::EncoderOnly, Feature::CrossAttention].contains(x))
                .find(|x| x.used_by(c) && !f.contains(x))
            {
                return Err(Unsupported::new(missing, ""));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restrictions_name_what_is_missing() {
        let caps: Capabilities = serde_json::from_str(
            r#"{"dtypes": ["bf16", "f32"], "head_sizes": [64, 128], "block_size_multiple_of": 16,
                "kinds": ["decoder"], "features": ["sliding_window"]}"#,
        )
        .unwrap();
        let ok = AttentionConfig::new(4, 2, 64, 32, DType::Bf16);
        assert_eq!(caps.check(&ok), Ok(()));
        let f16 = AttentionConfig {
            dtype: DType::F16,
            ..ok.clone()
        };
        assert_eq!(
            caps.check(&f16).unwrap_err().to_string(),
            "dtype f16: other than bf16, f32"
        );
        let hs = AttentionConfig {
            head_size: 3,
            ..ok.clone()
        };
        assert_eq!(
            caps.check(&hs).unwrap_err().to_string(),
            "head size 3: other than 64, 128"
        );
        let bs = AttentionConfig {
            block_size: 3,
            ..ok.clone()
        };
        assert_eq!(
            caps.check(&bs).unwrap_err().reason(),
            "block size not a multiple of 16"
        );
        let cap = AttentionConfig {
            logits_soft_cap: Some(5.0),
            ..ok
        };
        assert_eq!(
            caps.check(&cap).unwrap_err(),
            Unsupported::new(Feature::LogitsSoftCap, "")
        );
        assert_eq!(Capabilities::default().check(&cap), Ok(()));
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(serde_json::from_str::<Capabilities>(r#"{"head_size": [1]}"#).is_err());
    }
}
