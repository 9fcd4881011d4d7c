//! A tighter limit on each call to a backend, for the calls one thread makes inside a scope:
//! the shrink of a timeout tries its candidates under a limit scaled to what answered calls
//! took, not the backend's whole timeout. Backends that enforce a timeout (adapters) take
//! the lesser of theirs and this one.

use std::cell::Cell;
use std::time::Duration;

thread_local! {
    static LIMIT: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// Run `f` with every backend call this thread makes limited to `limit` (or less, where the
/// backend's own timeout is less).
pub fn within<R>(limit: Duration, f: impl FnOnce() -> R) -> R {
    /// Restores the outer scope's limit, even when `f` unwinds.
    struct Restore(Option<Duration>);
    impl Drop for Restore {
        fn drop(&mut self) {
            LIMIT.with(|l| l.set(self.0));
        }
    }
    let outer = LIMIT.with(|l| l.replace(Some(limit)));
    let _restore = Restore(outer);
    f()
}

/// `timeout`, narrowed by the limit of the scope this thread is in.
pub fn narrowed(timeout: Duration) -> Duration {
    LIMIT.with(|l| l.get()).map_or(timeout, |l| l.min(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_narrows_and_then_restores() {
        let t = Duration::from_secs(20);
        assert_eq!(narrowed(t), t);
        within(Duration::from_secs(2), || {
            assert_eq!(narrowed(t), Duration::from_secs(2));
            assert_eq!(narrowed(Duration::from_secs(1)), Duration::from_secs(1));
            within(Duration::from_secs(5), || {
                assert_eq!(narrowed(t), Duration::from_secs(5))
            });
            assert_eq!(narrowed(t), Duration::from_secs(2));
        });
        assert_eq!(narrowed(t), t);
    }
}
