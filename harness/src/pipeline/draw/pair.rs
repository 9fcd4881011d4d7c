//! Where invariance pairs draw from: how many a run makes, which case of the stream each
//! starts from, and the choices its relation makes.

use attn_reference::InputRng;

/// One invariance pair per this many property cases: a tenth of the budget's calls twice
/// over (a pair runs its case and the case's other form).
pub const CASES_PER_PAIR: u32 = 10;

/// Pairs draw their cases from their own stream of the seed, apart from the property cases.
pub const PAIR_STREAM: u64 = 0x1A7A_7170_5EED;

/// The pairs a run of `cases` property cases makes by default: one per [`CASES_PER_PAIR`]
/// (at least one when it runs any).
pub fn default_pairs(cases: u32) -> u32 {
    cases.div_ceil(CASES_PER_PAIR)
}

/// Pair `index`'s case index in the case stream: spread like the property cases', so pairs
/// meet every tier.
pub fn case_index(index: usize) -> usize {
    index * CASES_PER_PAIR as usize + 7
}

/// The choices a pair's relation makes (which request, where to split, where blocks go).
pub fn pick_of(seed: u64, index: usize) -> u64 {
    InputRng::new(seed ^ PAIR_STREAM ^ (index as u64).wrapping_mul(0x9E37_79B9)).below(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_any_cases_makes_a_pair_per_ten_and_pairs_start_apart() {
        assert_eq!(default_pairs(0), 0);
        assert_eq!(default_pairs(1), 1);
        assert_eq!(default_pairs(100), 10);
        assert_eq!(default_pairs(101), 11);
        assert_ne!(case_index(0), case_index(1));
        assert_ne!(pick_of(1, 0), pick_of(1, 1));
        assert_ne!(pick_of(1, 0), pick_of(2, 0));
    }
}
