//! A backend as a person names it after `--backend`: one attn-diff ships (`cpu`), an adapter
//! (`external:NAME`, declared in attn-diff.toml or with `--external`) or a deliberately wrong
//! backend (`mutant:NAME`). Parsed once where a name comes in, written back by `Display`: the
//! two prefixes are spelled here and nowhere else.

use crate::BackendRole;
use std::fmt;
use std::str::FromStr;

/// A backend's name, its kind read once from its prefix.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendRef {
    Builtin(String),
    /// An adapter, by the name it is declared under.
    External(String),
    /// A mutant, by its catalogue name.
    Mutant(String),
}

const EXTERNAL: &str = "external:";
const MUTANT: &str = "mutant:";

impl BackendRef {
    /// `text` (surrounding whitespace ignored) by its prefix.
    pub fn parse(text: &str) -> BackendRef {
        let text = text.trim();
        if let Some(name) = text.strip_prefix(EXTERNAL) {
            BackendRef::External(name.to_string())
        } else if let Some(name) = text.strip_prefix(MUTANT) {
            BackendRef::Mutant(name.to_string())
        } else {
            BackendRef::Builtin(text.to_string())
        }
    }

    pub fn external(name: &str) -> BackendRef {
        BackendRef::External(name.to_string())
    }

    pub fn mutant(name: &str) -> BackendRef {
        BackendRef::Mutant(name.to_string())
    }

    /// The name without its prefix: a built-in backend's, an adapter's, a mutant's.
    pub fn name(&self) -> &str {
        match self {
            BackendRef::Builtin(n) | BackendRef::External(n) | BackendRef::Mutant(n) => n,
        }
    }

    /// The adapter's name, if it is one.
    pub fn adapter(&self) -> Option<&str> {
        match self {
            BackendRef::External(n) => Some(n),
            _ => None,
        }
    }

    /// The mutant's name, if it is one.
    pub fn mutant_name(&self) -> Option<&str> {
        match self {
            BackendRef::Mutant(n) => Some(n),
            _ => None,
        }
    }

    pub fn role(&self) -> BackendRole {
        match self {
            BackendRef::Builtin(_) => BackendRole::Builtin,
            BackendRef::External(_) => BackendRole::External,
            BackendRef::Mutant(_) => BackendRole::Mutant,
        }
    }
}

/// The name as typed after `--backend`: `cpu`, `external:numpy-ref`, `mutant:scale-forgotten`.
impl fmt::Display for BackendRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendRef::Builtin(n) => f.write_str(n),
            BackendRef::External(n) => write!(f, "{EXTERNAL}{n}"),
            BackendRef::Mutant(n) => write!(f, "{MUTANT}{n}"),
        }
    }
}

impl FromStr for BackendRef {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<BackendRef, Self::Err> {
        Ok(BackendRef::parse(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_reads_back_as_it_was_typed() {
        for (text, role, name) in [
            ("cpu", BackendRole::Builtin, "cpu"),
            (" external:numpy-ref ", BackendRole::External, "numpy-ref"),
            (
                "mutant:scale-forgotten",
                BackendRole::Mutant,
                "scale-forgotten",
            ),
        ] {
            let r = BackendRef::parse(text);
            assert_eq!((r.role(), r.name()), (role, name));
            assert_eq!(r.to_string(), text.trim());
        }
        assert_eq!(BackendRef::parse("external:x").adapter(), Some("x"));
        assert_eq!(BackendRef::parse("cpu").adapter(), None);
        assert_eq!(BackendRef::parse("mutant:y").mutant_name(), Some("y"));
    }
}
