//! Handing out a call's work items to its threads.
//!
//! Items are dealt ahead of time, largest first to the least-loaded thread, so every thread
//! owns a list of about equal cost, and a repeated call (the next decode step of the same
//! batch) gives each thread the same items: the output rows, partials and scratch it writes
//! stay in its own core's cache instead of moving between cores on every call, which on a
//! call of tens of microseconds costs as much as the arithmetic. A thread that finishes its
//! list (or a helper that wakes late, or never) is covered by stealing: an owner takes its
//! list from the front, others take from the back.

use std::sync::atomic::{AtomicU64, Ordering};

/// Deal `costs` to `threads` lists: most expensive first, each to the least-loaded list
/// (ties to the lower index). Each list keeps the order items were dealt in.
pub fn deal(costs: &[u64], threads: usize) -> Vec<Vec<usize>> {
    let threads = threads.max(1);
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(costs[i]));
    let mut lists = vec![Vec::new(); threads];
    let mut load = vec![0u64; threads];
    for i in order {
        let t = (0..threads).min_by_key(|&t| (load[t], t)).unwrap_or(0);
        load[t] += costs[i];
        lists[t].push(i);
    }
    lists
}

/// One list's unclaimed range, `front << 32 | back`, alone on its cache line.
#[repr(align(64))]
struct Range(AtomicU64);

/// The claim state of dealt lists for one call.
pub struct Claims<'a> {
    lists: &'a [Vec<usize>],
    ranges: Vec<Range>,
}

impl<'a> Claims<'a> {
    pub fn new(lists: &'a [Vec<usize>]) -> Self {
        let ranges = lists
            .iter()
            .map(|l| Range(AtomicU64::new(l.len() as u64)))
            .collect();
        Claims { lists, ranges }
    }

    /// The next item for `thread`: from the front of its own list, else from the back of
    /// another's. `None` once every item has been claimed.
    pub fn next(&self, thread: usize) -> Option<usize> {
        let n = self.lists.len();
        if thread < n {
            if let Some(i) = self.take(thread, true) {
                return Some(i);
            }
        }
        (1..=n)
            .map(|k| (thread + k) % n)
            .find_map(|victim| self.take(victim, false))
    }

    fn take(&self, list: usize, front: bool) -> Option<usize> {
        let range = &self.ranges[list].0;
        let mut cur = range.load(Ordering::Relaxed);
        loop {
            let (lo, hi) = (cur >> 32, cur & u32::MAX as u64);
            if lo >= hi {
                return None;
            }
            let (next, pos) = if front {
                (cur + (1 << 32), lo)
            } else {
                (cur - 1, hi - 1)
            };
            match range.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(self.lists[list][pos as usize]),
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn dealing_balances_cost_and_keeps_every_item() {
        let costs = [90, 10, 40, 40, 20, 5, 5];
        let lists = deal(&costs, 2);
        let mut all: Vec<usize> = lists.concat();
        all.sort();
        assert_eq!(all, (0..costs.len()).collect::<Vec<_>>());
        let loads: Vec<u64> = lists
            .iter()
            .map(|l| l.iter().map(|&i| costs[i]).sum())
            .collect();
        assert_eq!(loads, vec![105, 105]);
        assert_eq!(deal(&costs, 2), lists, "the same step deals the same way");
        assert_eq!(deal(&[], 3), vec![Vec::<usize>::new(); 3]);
    }

    #[test]
    fn every_item_is_claimed_once_whoever_runs() {
        let costs: Vec<u64> = (0..101).map(|i| (i * 37 % 11) as u64).collect();
        let lists = deal(&costs, 4);
        // Only one thread: it steals every other list.
        let claims = Claims::new(&lists);
        let mut got: Vec<usize> = std::iter::from_fn(|| claims.next(0)).collect();
        got.sort();
        assert_eq!(got, (0..101).collect::<Vec<_>>());
        // Four threads racing, plus one index past the lists (a caller with no list).
        let claims = Claims::new(&lists);
        let seen = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..5 {
                let (claims, seen) = (&claims, &seen);
                s.spawn(move || {
                    while let Some(i) = claims.next(t) {
                        seen.lock().unwrap().push(i);
                    }
                });
            }
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, (0..101).collect::<Vec<_>>());
    }

    #[test]
    fn owners_take_their_own_list_in_order() {
        let lists = vec![vec![3, 1], vec![0, 2]];
        let claims = Claims::new(&lists);
        assert_eq!(claims.next(1), Some(0));
        assert_eq!(claims.next(1), Some(2));
        assert_eq!(
            claims.next(1),
            Some(1),
            "then steals from the back of list 0"
        );
        assert_eq!(claims.next(0), Some(3));
        assert_eq!(claims.next(0), None);
    }
}
