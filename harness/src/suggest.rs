//! "Did you mean …?" for names given on the command line: backends, adapters, specs.

/// Edit distance (insertions, deletions, substitutions) between `a` and `b`.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The known name closest to `name`: one that is `name` with the `external:` prefix, or one
/// that starts with it (or it with one), else the nearest within a third of its length.
pub fn closest<'a>(name: &str, known: &'a [String]) -> Option<&'a str> {
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    let lower = name.to_lowercase();
    let external = attn_results::BackendRef::external(&lower).to_string();
    if let Some(k) = known.iter().find(|k| k.to_lowercase() == external) {
        return Some(k);
    }
    if let Some(k) = known.iter().find(|k| k.to_lowercase() == lower) {
        return Some(k);
    }
    let prefixed = known
        .iter()
        .filter(|k| {
            let k = k.to_lowercase();
            k.len() > 1 && lower.len() > 1 && (k.starts_with(&lower) || lower.starts_with(&k))
        })
        .min_by_key(|k| k.len().abs_diff(name.len()));
    if let Some(k) = prefixed {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (distance(&lower, &k.to_lowercase()), k))
        .filter(|&(d, _)| d <= (name.chars().count() / 3).max(1))
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k.as_str())
}

/// `; did you mean `X`?`, or nothing when no known name is close.
pub fn did_you_mean(name: &str, known: &[String]) -> String {
    closest(name, known).map_or(String::new(), |k| format!("; did you mean `{k}`?"))
}

/// The error for an unknown spec: the known ones, and the closest.
pub fn unknown_spec(name: &str) -> String {
    let known: Vec<String> = attn_reference::specs::spec_names()
        .iter()
        .map(|s| s.to_string())
        .collect();
    format!(
        "unknown spec `{name}`{}; known specs: {}",
        did_you_mean(name, &known),
        known.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn distances() {
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("same", "same"), 0);
    }

    #[test]
    fn adapters_prefixes_and_typos_are_found() {
        let known = names(&["cpu", "spyre-native", "spyre-sdpa", "external:numpy-ref"]);
        assert_eq!(closest("numpy-ref", &known), Some("external:numpy-ref"));
        assert!(closest("spyre", &known).is_some_and(|k| k.starts_with("spyre-")));
        assert_eq!(closest("spyre-natve", &known), Some("spyre-native"));
        assert_eq!(closest("CPU", &known), Some("cpu"));
        assert_eq!(closest("xyz", &known), None);
        assert_eq!(did_you_mean("gpu", &known), "; did you mean `cpu`?");
        assert_eq!(did_you_mean("", &known), "");
    }

    #[test]
    fn specs_are_suggested() {
        let e = unknown_spec("small_decod");
        assert!(e.contains("did you mean `small_decode`?"), "{e}");
        let e = unknown_spec("large");
        assert!(e.contains("did you mean `large_"), "{e}");
        assert!(!unknown_spec("qqqqqqqqqq").contains("did you mean"));
    }
}
