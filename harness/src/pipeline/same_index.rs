//! What one property or trace index drew for each cohort, so the oracle runs once per
//! distinct draw: cohorts whose spaces differ only where they draw different cases (a
//! backend with MLA beside one without: the same case at nine indices in ten) share the
//! case and its oracle output wherever they drew the same recipe.

/// The values made for the distinct keys of one index, in the order first drawn.
pub struct SameIndex<K, V> {
    seen: Vec<(K, V)>,
}

impl<K: PartialEq, V> SameIndex<K, V> {
    pub fn new() -> Self {
        SameIndex { seen: Vec::new() }
    }

    /// The value made for `key`: made now by `make` when no earlier cohort drew it.
    pub fn get_or_make(&mut self, key: K, make: impl FnOnce(&K) -> V) -> &V {
        let at = match self.seen.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                let value = make(&key);
                self.seen.push((key, value));
                self.seen.len() - 1
            }
        };
        &self.seen[at].1
    }
}

impl<K: PartialEq, V> Default for SameIndex<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_distinct_key_is_made_once() {
        let mut made = 0;
        let mut s = SameIndex::new();
        for key in [1, 2, 1, 1, 2, 3] {
            let v = *s.get_or_make(key, |k| {
                made += 1;
                k * 10
            });
            assert_eq!(v, key * 10);
        }
        assert_eq!(made, 3);
    }
}
