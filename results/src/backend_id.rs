//! Who a backend is, typed: its name (what a user types after `--backend`, the key of a
//! summary), the role it plays in a run, and for benchmark rows the KV cache it was given.
//! Nothing reads a role or a variant back out of a name.

#[cfg(test)]
use attn_reference::Fp8Format;
use attn_reference::KvCacheDtype;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a backend is there for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendRole {
    /// A backend attn-diff ships (`cpu`, the Spyre backends).
    #[default]
    Builtin,
    /// A backend in another process, driven through an adapter.
    External,
    /// A deliberately wrong backend (cargo feature `mutants`): it passes by diverging.
    Mutant,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendId {
    pub name: String,
    pub role: BackendRole,
    /// The KV cache a benchmark row ran with when it is not the inputs' dtype (FP8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<KvCacheDtype>,
}

impl BackendId {
    pub fn new(name: &str, role: BackendRole) -> BackendId {
        BackendId {
            name: name.to_string(),
            role,
            kv_cache_dtype: None,
        }
    }

    /// A backend attn-diff ships.
    pub fn builtin(name: &str) -> BackendId {
        BackendId::new(name, BackendRole::Builtin)
    }

    /// The same backend run with a KV cache of `kv`.
    pub fn with_kv_cache(mut self, kv: KvCacheDtype) -> BackendId {
        self.kv_cache_dtype = Some(kv);
        self
    }

    pub fn is_mutant(&self) -> bool {
        self.role == BackendRole::Mutant
    }
}

/// For people only: "cpu", "cpu [fp8_e4m3]".
impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        match self.kv_cache_dtype {
            Some(kv) => write!(f, " [{kv}]"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_and_variant_are_fields_not_parts_of_the_name() {
        let id = BackendId::new("cpu", BackendRole::Builtin)
            .with_kv_cache(KvCacheDtype::Fp8(Fp8Format::E4m3));
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(
            json,
            r#"{"name":"cpu","role":"builtin","kv_cache_dtype":"fp8_e4m3"}"#
        );
        assert_eq!(serde_json::from_str::<BackendId>(&json).unwrap(), id);
        assert_eq!(id.to_string(), "cpu [fp8_e4m3]");
        // A mutant is one by its role, whatever it is called.
        assert!(BackendId::new("window-off-by-one", BackendRole::Mutant).is_mutant());
        assert!(!BackendId::new("mutant:x", BackendRole::External).is_mutant());
    }
}
