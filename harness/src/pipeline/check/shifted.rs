//! A property case that shifts its logits is judged twice: as drawn, and as its unshifted
//! twin (the same batch, cache and values with the shift left out), each by its own
//! tolerance.
//!
//! A shift of every q·k into the ten thousands is what finds kernels that start the online
//! max at a finite sentinel, hold q·k in f16 or share one row's max across a tile. But it
//! widens the case's tolerance by the f32 rounding of such logits (a fifth of max|v| at the
//! largest shifts), and a sink under a shift is swamped (a positive one) or takes every
//! weight (a negative one, every output then near 0). The shifted case alone could pass a
//! backend whose error the same case without the shift shows at once; with its twin, a
//! shift only ever adds what it finds. It costs one more call for the cases that shift.

use crate::pipeline::recipe::CaseRecipe;
use crate::pipeline::runner::{evaluate_measured, Outcome};
use attn_backends::Backend;
use attn_reference::ladder::EagerSample;
use attn_reference::{reference_output, Case, Judge};
use attn_results::compare::Tolerance;
use std::time::Duration;

/// A case with the oracle's answer and the tolerance the run's policy judges it by.
pub struct Judged {
    pub case: Case,
    pub expected: Vec<f64>,
    pub tol: Tolerance,
    /// Eager attention in the case's dtype on a sample of rows, for the run's error figures
    /// (none while shrinking: only the run's own cases are counted).
    pub eager: Option<EagerSample>,
}

/// The multiply-adds of eager attention spent on one case's figures: a sample of rows of a
/// large case, every row of a small one (a few milliseconds).
const EAGER_WORK: usize = 1 << 20;

impl Judged {
    pub fn of(case: Case, judge: &Judge) -> Judged {
        let expected = reference_output(&case);
        let tol = judge.tolerance(&case, &expected);
        Judged {
            case,
            expected,
            tol,
            eager: None,
        }
    }

    /// With the eager sample the run's figures measure against.
    fn measured(mut self) -> Judged {
        self.eager = EagerSample::of(&self.case, &self.expected, EAGER_WORK);
        self
    }
}

/// Which case of a [`Pair`] an outcome is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Drawn,
    /// The drawn case without its logit shift.
    Twin,
}

/// A recipe's case as drawn and, when it shifts its logits, its unshifted twin.
pub struct Pair {
    pub drawn: Judged,
    pub twin: Option<Judged>,
}

impl Pair {
    /// A case of the run: its figures measured against eager attention's.
    pub fn measured(recipe: &CaseRecipe, judge: &Judge) -> Pair {
        let Pair { drawn, twin } = Pair::of(recipe, judge);
        Pair {
            drawn: drawn.measured(),
            twin,
        }
    }

    pub fn of(recipe: &CaseRecipe, judge: &Judge) -> Pair {
        let twin = recipe.logits.is_some().then(|| {
            let unshifted = CaseRecipe {
                logits: None,
                ..recipe.clone()
            };
            Judged::of(unshifted.build(), judge)
        });
        Pair {
            drawn: Judged::of(recipe.build(), judge),
            twin,
        }
    }

    pub fn get(&self, which: Which) -> &Judged {
        match (which, &self.twin) {
            (Which::Twin, Some(t)) => t,
            _ => &self.drawn,
        }
    }

    /// Run `backend` on the drawn case and, unless that diverged, on the twin: the first
    /// divergence, else the drawn case's outcome, with the time of both calls.
    pub fn evaluate(&self, backend: &dyn Backend) -> (Outcome, Duration, Which) {
        let run =
            |j: &Judged| evaluate_measured(backend, &j.case, &j.expected, j.tol, j.eager.as_ref());
        let (drawn, time) = run(&self.drawn);
        match &self.twin {
            Some(twin) if !drawn.is_divergence() => {
                let (outcome, more) = run(twin);
                if outcome.is_divergence() {
                    (outcome, time + more, Which::Twin)
                } else {
                    (drawn, time + more, Which::Drawn)
                }
            }
            _ => (drawn, time, Which::Drawn),
        }
    }
}

#[cfg(all(test, feature = "mutants"))]
mod tests {
    use super::*;
    use crate::pipeline::recipe::{LogitShift, Values};
    use crate::pipeline::runner::evaluate;
    use attn_reference::DType;

    /// A decode over a window or with sinks, its logits shifted by `dot`.
    fn shifted(dot: f32, window: Option<usize>, sinks: bool) -> CaseRecipe {
        CaseRecipe {
            num_kv_heads: 2,
            group: 2,
            head_size: 16,
            block_size: 4,
            dtype: DType::Bf16,
            seqs: vec![(40, 1), (50, 1)],
            window,
            sinks,
            values: Values::Normal { seed: 3, std: 1.0 },
            logits: Some(LogitShift {
                dot,
                alternate: false,
                scattered: false,
            }),
            ..CaseRecipe::plain()
        }
    }

    #[test]
    fn a_shift_no_longer_hides_what_the_unshifted_case_shows() {
        let judge = Judge::Tolerance;
        for (mutant, recipe) in [
            // A window one key wider moves a short decode's output by a tenth of max|v|:
            // inside the tolerance a shift of 1e6 widens.
            ("window-off-by-one", shifted(1e6, Some(24), false)),
            // Under a positive shift the sink's weight is 0: a sink added to the numerator
            // changes nothing there, and everything in the same case without the shift.
            ("sink-in-numerator", shifted(3e4, None, true)),
        ] {
            let backend = attn_backends::mutants::mutant(mutant).expect("a mutant");
            let pair = Pair::of(&recipe, &judge);
            let drawn = &pair.drawn;
            let (alone, _) = evaluate(backend.as_ref(), &drawn.case, &drawn.expected, drawn.tol);
            assert!(
                !alone.is_divergence(),
                "{mutant}: the shifted case alone passes (what used to hide it): {alone:?} {:?}",
                drawn.tol
            );
            let (outcome, _, which) = pair.evaluate(backend.as_ref());
            assert!(outcome.is_divergence(), "{mutant}: {outcome:?}");
            assert_eq!(which, Which::Twin, "{mutant}");
            // A correct backend passes both.
            let cpu = attn_backends::cpu::CpuBackend::auto();
            let (ok, _, _) = pair.evaluate(&cpu);
            assert!(matches!(ok, Outcome::Pass(_)), "{mutant}: cpu {ok:?}");
        }
    }
}
