//! Running a backend and judging its answer against the oracle: one case here, a trace's steps
//! on one cache in [`trace`].

pub mod trace;

use attn_backends::{run_case, Backend, BackendError, CaseRun, Unsupported};
use attn_reference::ladder::EagerSample;
use attn_reference::Case;
use attn_results::compare::{compare, Comparison, Tolerance};
use attn_results::CaseFigures;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;
use std::time::Duration;

pub use attn_results::compare::Divergence;
pub use attn_results::DivergenceKind;

#[derive(Clone, Debug)]
pub enum Outcome {
    Pass(Comparison),
    Diverged(Divergence),
    Unsupported(Unsupported),
}

impl Outcome {
    pub fn is_divergence(&self) -> bool {
        matches!(self, Outcome::Diverged(_))
    }
}

thread_local! {
    static PANIC_MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
    static CAPTURING: RefCell<bool> = const { RefCell::new(false) };
}

/// A panic hook that records the message of panics raised inside [`evaluate`] instead of
/// printing them (shrinking may trigger hundreds), and behaves as before elsewhere.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CAPTURING.with(|c| *c.borrow()) {
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic with a non-string payload".into());
                let loc = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                PANIC_MESSAGE.with(|m| *m.borrow_mut() = Some(format!("{msg}{loc}")));
            } else {
                previous(info);
            }
        }));
    });
}

/// Run `f`, turning a panic into its message (recorded by the panic hook, not printed).
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_panic_hook();
    CAPTURING.with(|c| *c.borrow_mut() = true);
    let result = catch_unwind(AssertUnwindSafe(f));
    CAPTURING.with(|c| *c.borrow_mut() = false);
    result.map_err(|_| {
        PANIC_MESSAGE
            .with(|m| m.borrow_mut().take())
            .unwrap_or_else(|| "panicked".into())
    })
}

/// Run `backend` on a valid `case` and judge it against `expected` (the oracle's output).
pub fn evaluate(
    backend: &dyn Backend,
    case: &Case,
    expected: &[f64],
    tol: Tolerance,
) -> (Outcome, Duration) {
    evaluate_measured(backend, case, expected, tol, None)
}

/// [`evaluate`], with the output's error also measured against eager attention's on
/// `eager`'s rows (the figures of [`attn_results::figures`]).
pub fn evaluate_measured(
    backend: &dyn Backend,
    case: &Case,
    expected: &[f64],
    tol: Tolerance,
    eager: Option<&EagerSample>,
) -> (Outcome, Duration) {
    // A case no output could fail is not run: a pass would say nothing.
    if let Some(v) = tol.vacuous_for(case) {
        return (
            Outcome::Unsupported(
                Unsupported::new(
                    attn_reference::Dimension::Other,
                    "not judged: the tolerance, widened by logits near f32's limit, is as large \
                     as any output can be, so no divergence could show",
                )
                .value(format!("atol {:.2e}, max |v| {v:.2e}", tol.atol)),
            ),
            Duration::ZERO,
        );
    }
    judge_measured(
        catch_panic(|| run_case(backend, case)),
        case,
        expected,
        tol,
        eager,
    )
}

/// Judge what a backend did with `case` (a panic's message, its error, or its output).
pub fn judge(
    result: Result<Result<CaseRun, BackendError>, String>,
    case: &Case,
    expected: &[f64],
    tol: Tolerance,
) -> (Outcome, Duration) {
    judge_measured(result, case, expected, tol, None)
}

/// [`judge`], measuring the output's error against eager attention's on `eager`'s rows.
fn judge_measured(
    result: Result<Result<CaseRun, BackendError>, String>,
    case: &Case,
    expected: &[f64],
    tol: Tolerance,
    eager: Option<&EagerSample>,
) -> (Outcome, Duration) {
    match output_of(result) {
        Err(NoOutput::Declined(u)) => (Outcome::Unsupported(u), Duration::ZERO),
        Err(NoOutput::Failed(kind, message)) => (
            Outcome::Diverged(Divergence {
                kind,
                message,
                comparison: None,
                output: None,
            }),
            Duration::ZERO,
        ),
        Ok(run) => {
            let mut c = compare(
                &run.output,
                expected,
                case.config.num_heads,
                case.config.head_size_v(),
                tol,
            );
            c.figures = CaseFigures::of(case, &run.output, expected, eager);
            if c.passed() {
                (Outcome::Pass(c), run.forward_time)
            } else {
                let kind = if c.non_finite {
                    DivergenceKind::NonFinite
                } else {
                    DivergenceKind::Mismatch
                };
                let message = match &c.worst {
                    Some(m) => format!(
                        "{} of {} values beyond tolerance; worst at token {} head {} dim {}: expected {:.6}, got {:.6}",
                        c.mismatch_count,
                        expected.len(),
                        m.token,
                        m.head,
                        m.dim,
                        m.expected,
                        m.actual
                    ),
                    None => "diverged".into(),
                };
                (
                    Outcome::Diverged(Divergence {
                        kind,
                        message,
                        comparison: Some(c),
                        output: Some(run.output),
                    }),
                    run.forward_time,
                )
            }
        }
    }
}

/// Why a backend's call gave no output.
pub enum NoOutput {
    Declined(Unsupported),
    /// Its panic or its error: the divergence's kind and message.
    Failed(DivergenceKind, String),
}

/// What a backend did with a case (a panic's message, its error, or its run): its run, or
/// why there is no output.
pub fn output_of(
    result: Result<Result<CaseRun, BackendError>, String>,
) -> Result<CaseRun, NoOutput> {
    match result {
        Err(msg) => Err(NoOutput::Failed(DivergenceKind::Panic, msg)),
        Ok(Err(BackendError::Unsupported(u))) => Err(NoOutput::Declined(u)),
        Ok(Err(e)) => Err(NoOutput::Failed(error_kind(&e), e.to_string())),
        Ok(Ok(run)) => Ok(run),
    }
}

fn error_kind(e: &BackendError) -> DivergenceKind {
    match e {
        BackendError::Timeout { .. } => DivergenceKind::Timeout,
        BackendError::Crashed { .. } => DivergenceKind::Crashed,
        BackendError::Protocol { .. } => DivergenceKind::ProtocolError,
        _ => DivergenceKind::Error,
    }
}
