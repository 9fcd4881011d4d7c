//! Shrinking a failing recipe to a minimal one: the greedy shrinker and its budget here,
//! property cases in [`case`], traces in [`trace`]. Builds on `recipe` only.

pub mod case;
pub mod trace;

use crate::pipeline::recipe::CaseRecipe;
use std::time::{Duration, Instant};

/// How far a shrink may go. Its default limits are in steps and in work, never in time, so
/// a failure shrinks to the same case on any machine, under any load and at any `--jobs`; a
/// time limit is only there when a person asks for one (`--shrink-time`).
#[derive(Clone, Copy, Debug)]
pub struct ShrinkBudget {
    pub max_steps: usize,
    /// Work the candidates tried may add up to, in [`Weigh`] units.
    pub max_work: u64,
    pub max_time: Option<Duration>,
    /// No try starts after this (a shrink whose every try may cost a timeout is bounded
    /// in time, across all its passes).
    pub until: Option<Instant>,
}

impl ShrinkBudget {
    /// No shrinking (`--no-shrink`): a failure is reported as found.
    pub const NONE: ShrinkBudget = ShrinkBudget {
        max_steps: 0,
        max_work: 0,
        max_time: None,
        until: None,
    };

    /// Work each pass of a shrink may spend by default: 15-20 s of the heaviest candidates
    /// (two prefills of 5,000 tokens, about 1.5 s a try) on a 2-core EPYC, far more than most
    /// shrinks need (they end when nothing smaller fails).
    pub const DEFAULT_WORK: u64 = 1_000_000_000;

    /// Whether a shrink begun at `start` that has tried `steps` candidates of `work` in all
    /// may try one more of `next` work: within every limit and not interrupted.
    pub fn allows(&self, steps: usize, work: u64, next: u64, start: Instant) -> bool {
        steps < self.max_steps
            && work.saturating_add(next) <= self.max_work
            && self.max_time.is_none_or(|t| start.elapsed() < t)
            && self.until.is_none_or(|u| Instant::now() < u)
            && !crate::interrupt::interrupted()
    }
}

impl Default for ShrinkBudget {
    fn default() -> Self {
        ShrinkBudget {
            max_steps: 4000,
            max_work: Self::DEFAULT_WORK,
            max_time: None,
            until: None,
        }
    }
}

/// What trying one shrink candidate costs, in machine-independent units (about a
/// multiply-add of the oracle, or one element written): what a shrink's budget counts.
pub trait Weigh {
    fn work(&self) -> u64;
}

/// A try's fixed cost beyond its arithmetic: building the case, the calls, the comparison.
pub const TRY_WORK: u64 = 100_000;

/// What each sequence of a batch adds beyond its arithmetic (its block table, its share of
/// the scheduling, checking and comparing): a batch of a thousand one-token decodes takes
/// about a second a try.
pub const SEQ_WORK: u64 = 100_000;

/// The end of a shrink, of a property case's recipe or a trace's.
#[derive(Clone, Debug)]
pub struct Shrunk<R = CaseRecipe> {
    pub recipe: R,
    /// Ended on the budget or an interrupt rather than because nothing smaller failed.
    pub exhausted: bool,
    /// Shrink steps that still failed.
    pub accepted: usize,
    pub steps: usize,
    /// [`Weigh`] units of the candidates tried.
    pub work: u64,
    pub elapsed: Duration,
}

impl<R> Shrunk<R> {
    /// What a report says of this shrink.
    pub fn info(&self) -> attn_results::ShrinkInfo {
        attn_results::ShrinkInfo {
            steps: self.steps,
            accepted: self.accepted,
            seconds: self.elapsed.as_secs_f64(),
            exhausted: self.exhausted,
            limits: None,
        }
    }
}

/// Where a greedy pass goes on after a candidate still failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterAccept {
    /// Back to the most drastic candidate of the new recipe, never returning to a recipe
    /// accepted before (lateral moves cannot cycle).
    FromTheTop,
    /// The same kind of candidate again on the new recipe, then on down the list; another
    /// sweep while the last one made progress (cheaper when each try is a whole trace).
    SameCandidate,
}

/// The one greedy shrinker: try `candidates` of the best recipe so far, most drastic first;
/// `still_fails` says whether one still fails, giving the recipe to keep (which may be
/// trimmed further, e.g. to the step it now diverges at). Ends when no candidate fails, or
/// on the budget.
pub fn greedy<R: Clone + PartialEq + Weigh>(
    start_from: R,
    budget: ShrinkBudget,
    after: AfterAccept,
    candidates: &dyn Fn(&R) -> Vec<R>,
    mut still_fails: impl FnMut(&R) -> Option<R>,
) -> Shrunk<R> {
    let start = Instant::now();
    let mut best = start_from;
    let (mut steps, mut accepted, mut work) = (0, 0, 0);
    let mut visited = vec![best.clone()];
    let (mut i, mut progress) = (0, false);
    let mut cs = candidates(&best);
    let exhausted = loop {
        if i >= cs.len() {
            if after == AfterAccept::SameCandidate && progress {
                (i, progress) = (0, false);
                continue;
            }
            break false;
        }
        let c = &cs[i];
        if after == AfterAccept::FromTheTop && visited.contains(c) {
            i += 1;
            continue;
        }
        let next = c.work();
        if !budget.allows(steps, work, next, start) {
            break true;
        }
        steps += 1;
        work += next;
        match still_fails(c) {
            Some(kept) => {
                if after == AfterAccept::FromTheTop {
                    visited.push(c.clone());
                    i = 0;
                }
                best = kept;
                cs = candidates(&best);
                accepted += 1;
                progress = true;
            }
            None => i += 1,
        }
    };
    Shrunk {
        recipe: best,
        exhausted,
        accepted,
        steps,
        work,
        elapsed: start.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Weigh for u32 {
        fn work(&self) -> u64 {
            1
        }
    }

    fn halve_or_step(x: &u32) -> Vec<u32> {
        [x / 2, x.saturating_sub(1)]
            .into_iter()
            .filter(|c| c != x)
            .collect()
    }

    #[test]
    fn both_orders_reach_the_smallest_failing_value() {
        for after in [AfterAccept::FromTheTop, AfterAccept::SameCandidate] {
            let s = greedy(100, ShrinkBudget::default(), after, &halve_or_step, |&x| {
                (x >= 37).then_some(x)
            });
            assert_eq!((s.recipe, s.exhausted), (37, false), "{after:?}");
            assert!(s.accepted >= 3 && s.steps > s.accepted, "{after:?} {s:?}");
        }
    }

    #[test]
    fn the_budget_ends_a_shrink_and_says_so() {
        // Every candidate still fails: only the budget ends the shrink.
        let all_fail = |budget| {
            greedy(
                1000,
                budget,
                AfterAccept::FromTheTop,
                &halve_or_step,
                |&x| Some(x),
            )
        };
        let s = all_fail(ShrinkBudget {
            max_steps: 3,
            ..ShrinkBudget::default()
        });
        assert_eq!((s.recipe, s.steps, s.exhausted), (125, 3, true));
        // Work ends it the same way, whatever the machine.
        let s = all_fail(ShrinkBudget {
            max_work: 2,
            ..ShrinkBudget::default()
        });
        assert_eq!((s.recipe, s.steps, s.work, s.exhausted), (250, 2, 2, true));
    }

    #[test]
    fn a_shrink_ends_the_same_however_slow_its_tries_are() {
        // The default budget has no time limit: a slow machine (or a loaded one, or one of
        // many jobs) gets the same shrunk recipe as a fast one.
        let budget = ShrinkBudget {
            max_work: 5,
            ..ShrinkBudget::default()
        };
        let run = |delay: u64| {
            greedy(
                1000,
                budget,
                AfterAccept::FromTheTop,
                &halve_or_step,
                |&x| {
                    std::thread::sleep(Duration::from_millis(delay));
                    (x >= 3).then_some(x)
                },
            )
        };
        let (fast, slow) = (run(0), run(30));
        assert_eq!(
            (fast.recipe, fast.steps, fast.exhausted),
            (slow.recipe, slow.steps, slow.exhausted)
        );
        assert_eq!((fast.recipe, fast.work, fast.exhausted), (31, 5, true));
    }

    #[test]
    fn a_lateral_move_never_cycles_back() {
        // Every candidate "still fails" and the only one is a lateral move: from the top, a
        // recipe once accepted is not tried again, so the shrink ends.
        let s = greedy(
            4,
            ShrinkBudget::default(),
            AfterAccept::FromTheTop,
            &|x: &u32| vec![x ^ 1],
            |&x| Some(x),
        );
        assert_eq!((s.recipe, s.steps, s.exhausted), (5, 1, false));
    }

    #[test]
    fn the_kept_recipe_is_what_the_judge_returns() {
        // A trace is cut to the step it now diverges at: the judge's recipe is kept, not the
        // candidate.
        let s = greedy(
            64,
            ShrinkBudget::default(),
            AfterAccept::SameCandidate,
            &halve_or_step,
            |&x| (x >= 10).then_some(x - x % 10),
        );
        assert_eq!(s.recipe, 10);
    }
}
