//! The backends a comment may name. attn-ci does not link the backends (the bot's parse step
//! runs without libtorch), so their names are listed here; a test checks the list against
//! the registry (`tests/catalog.rs`). Spec names come from `attn_reference` itself.

/// Every backend `attn-diff` registers in a default build, in registry order.
pub const BACKENDS: &[&str] = &["cpu", "spyre-native", "spyre-sdpa", "spyre-device"];

/// Whether `name` (after `mutant:`) can be a mutant's name. Which mutants exist is known only
/// to a build with the `mutants` feature: `attn-diff` itself rejects an unknown one (exit 2),
/// and the reply says so.
pub fn is_valid_mutant_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutant_names() {
        assert!(is_valid_mutant_name("window-off-by-one"));
        assert!(is_valid_mutant_name("gqa_mod"));
        assert!(!is_valid_mutant_name(""));
        assert!(!is_valid_mutant_name("a b"));
        assert!(!is_valid_mutant_name("a;b"));
        assert!(!is_valid_mutant_name(&"a".repeat(65)));
    }
}
