//! The one loop of a check. Every subject (a property case, an upstream case, a trace) is
//! built and judged by the oracle once, run through each backend sent it, and recorded.
//!
//! With `jobs` > 1, worker threads build and run subjects ahead of the recorder (the calling
//! thread); the members of one subject may run on different workers, so a large one does not
//! hold the run to one core. How far workers run ahead is bounded by a count and by the bytes
//! waiting subjects hold. The recorder takes results strictly in subject order: the tallies,
//! the give-up and stop decisions, the failures and their shrinking happen exactly as in a
//! run with one job, so the summary does not depend on `jobs`. A backend's result on a subject the recorder
//! reaches after giving up on that backend, or after the run stopped, is dropped unrecorded.

use crate::pipeline::check::control::RunControl;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One subject of the loop: which of its kind, and the backends it is sent to.
#[derive(Clone, Debug)]
pub struct Item {
    /// The property case, trace or upstream case index.
    pub index: usize,
    /// The backends it goes to, in order, each with the cohort it draws in.
    pub members: Vec<Member>,
}

/// A backend a subject goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Index into the check's backends.
    pub backend: usize,
    /// The cohort (space) it draws in (0 for upstream cases, which every backend shares).
    pub cohort: usize,
}

/// A subject as the workers leave it: built, judged by the oracle, run on its members.
pub struct Ran<P, V> {
    /// `None` when no member was left to run it on.
    pub prepared: Option<P>,
    /// The time the subject took to build and judge by the oracle.
    pub oracle: Duration,
    /// Per member (same order as `Item::members`): its verdict and the wall time it took;
    /// `None` when the member was not run (given up on while the subject waited).
    pub verdicts: Vec<Option<(V, Duration)>>,
}

impl<P, V> Ran<P, V> {
    /// A subject none of whose `members` was left to run it on.
    fn skipped(members: usize) -> Self {
        Ran {
            prepared: None,
            oracle: Duration::ZERO,
            verdicts: (0..members).map(|_| None).collect(),
        }
    }
}

/// What the loop asks of a kind of subject.
pub trait Subjects: Sync {
    /// Shared by the workers that run its members.
    type Prepared: Send + Sync;
    type Verdict: Send;
    /// Build the subject of `item` for each cohort among its members and compute what the
    /// oracle expects (on a worker).
    fn prepare(&self, item: &Item) -> Self::Prepared;
    /// Run `member` on the subject and judge it (on a worker).
    fn evaluate(&self, p: &Self::Prepared, member: Member) -> Self::Verdict;
    /// Roughly the bytes a prepared subject holds, which bounds how far workers run ahead.
    fn held_bytes(&self, p: &Self::Prepared) -> usize;
}

/// How many bytes of prepared subjects may wait for the recorder: workers open no further
/// subject past it (the recorder's next one always opens). A large subject takes seconds to
/// build on one core; meanwhile the other workers run ahead on small ones.
const AHEAD_BYTES: usize = 1 << 30;

/// Records one subject, in order, with the run's control (it may note outcomes there).
pub type Record<'r, S> = dyn FnMut(&Item, Ran<<S as Subjects>::Prepared, <S as Subjects>::Verdict>, &mut RunControl)
    + 'r;

/// Run `items` through `subjects` and hand each to `record` in order (`record` may shrink,
/// report and note outcomes in `control`). Stops between items when `control.should_stop()`.
pub fn drive<S: Subjects>(
    jobs: usize,
    subjects: &S,
    items: &[Item],
    control: &mut RunControl,
    record: &mut Record<'_, S>,
) {
    if jobs <= 1 {
        for item in items {
            if control.should_stop() {
                break;
            }
            let gave_up = |m: usize| control.gave_up(m).is_some();
            let ran = run_item(subjects, item, &gave_up);
            // An item an interrupt cut short (its adapter killed mid-call) says nothing of
            // the backend: dropped, as the workers' results are once the run stops.
            if control.should_stop() {
                break;
            }
            record(item, ran, control);
        }
        return;
    }

    // Hints for the workers, set by the recorder: results they would produce for these are
    // dropped anyway. A backend given up on in an earlier part of the run starts marked, so
    // no worker sends it this part's first items (each a timeout on a hanging adapter).
    let gave_up: Vec<AtomicBool> = (0..backend_count(items))
        .map(|m| AtomicBool::new(control.gave_up(m).is_some()))
        .collect();
    let stop = AtomicBool::new(false);
    let next = AtomicUsize::new(0);
    // Subjects built and judged whose members are still being run: a worker with nothing
    // else to do takes a member of the oldest, so one large subject does not keep the others
    // waiting on a single core.
    let open: OpenList<S::Prepared, S::Verdict> = Mutex::new(Vec::new());
    // Items recorded so far: workers open at most `ahead` items past it, and none while the
    // subjects waiting for the recorder hold more than `AHEAD_BYTES`.
    let recorded = (Mutex::new(0usize), Condvar::new());
    let ahead = 32 * jobs;
    // Bytes the prepared subjects not yet recorded hold; each result carries its own share.
    let held_total = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<Finished<S::Prepared, S::Verdict>>();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (gave_up, stop, next, recorded, open) = (&gave_up, &stop, &next, &recorded, &open);
            let held_total = &held_total;
            scope.spawn(move || loop {
                if stop.load(Ordering::Relaxed) || crate::interrupt::interrupted() {
                    break;
                }
                let skip = |m: usize| gave_up[m].load(Ordering::Relaxed);
                if let Some((subject, i)) = claim_member(open) {
                    let member = items[subject.index].members[i];
                    let verdict = (!skip(member.backend)).then(|| {
                        let t0 = Instant::now();
                        (subjects.evaluate(&subject.prepared, member), t0.elapsed())
                    });
                    lock(&subject.verdicts)[i] = verdict;
                    if subject.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                        let ran = close(open, subject);
                        if tx.send(ran).is_err() {
                            break;
                        }
                    }
                    continue;
                }
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= items.len() {
                    break;
                }
                {
                    let (done, wake) = recorded;
                    let mut done = lock(done);
                    let full = |done: usize| {
                        k >= done + ahead
                            || (k > done && held_total.load(Ordering::Acquire) > AHEAD_BYTES)
                    };
                    while full(*done) && !stop.load(Ordering::Relaxed) {
                        done = wake.wait(done).unwrap_or_else(|p| p.into_inner());
                    }
                }
                if stop.load(Ordering::Relaxed) || crate::interrupt::interrupted() {
                    break;
                }
                let item = &items[k];
                let members = item.members.len();
                let Some((prepared, oracle, _)) = prepare_live(subjects, item, &skip) else {
                    if tx.send((k, Ran::skipped(members), 0)).is_err() {
                        break;
                    }
                    continue;
                };
                let held = subjects.held_bytes(&prepared);
                held_total.fetch_add(held, Ordering::AcqRel);
                let subject = Arc::new(Open {
                    index: k,
                    prepared,
                    oracle,
                    held,
                    members,
                    claimed: AtomicUsize::new(0),
                    left: AtomicUsize::new(members),
                    verdicts: Mutex::new((0..members).map(|_| None).collect()),
                });
                lock(open).push(subject);
            });
        }
        drop(tx);

        let mut waiting = BTreeMap::new();
        let mut k = 0;
        'recording: while k < items.len() {
            // Items finish out of order: keep them until their turn.
            while !waiting.contains_key(&k) {
                match rx.recv() {
                    Ok((j, ran, held)) => {
                        waiting.insert(j, (ran, held));
                    }
                    // Every worker ended (stopped, or one panicked: the scope re-raises it).
                    // Workers end on an interrupt before the recorder sees it: note it here,
                    // or the summary would not say the run was cut short.
                    Err(_) => {
                        control.should_stop();
                        break 'recording;
                    }
                }
            }
            if control.should_stop() {
                break;
            }
            let (mut ran, held) = waiting.remove(&k).expect("waited for");
            let item = &items[k];
            // Run ahead of a give-up the recorder has since made: as if never sent.
            for (m, verdict) in item.members.iter().zip(ran.verdicts.iter_mut()) {
                if control.gave_up(m.backend).is_some() {
                    *verdict = None;
                }
            }
            record(item, ran, control);
            for m in &item.members {
                if control.gave_up(m.backend).is_some() {
                    gave_up[m.backend].store(true, Ordering::Relaxed);
                }
            }
            held_total.fetch_sub(held, Ordering::AcqRel);
            k += 1;
            let (done, wake) = &recorded;
            *lock(done) = k;
            wake.notify_all();
        }
        stop.store(true, Ordering::Relaxed);
        recorded.1.notify_all();
        // Results still arriving are dropped with the receiver.
        drop(rx);
    });
}

/// A subject built and judged, its members run by whichever workers take them.
struct Open<P, V> {
    /// The item's position in the run.
    index: usize,
    prepared: P,
    oracle: Duration,
    /// What `prepared` holds ([`Subjects::held_bytes`]).
    held: usize,
    /// The item's members (`verdicts` has one slot each).
    members: usize,
    /// Members handed out so far.
    claimed: AtomicUsize,
    /// Members not yet run (or skipped).
    left: AtomicUsize,
    verdicts: Mutex<Vec<Option<(V, Duration)>>>,
}

/// The subjects whose members are still being run.
type OpenList<P, V> = Mutex<Vec<Arc<Open<P, V>>>>;

/// A subject whose members have all run, for the recorder: its index, what it ran and the
/// bytes it holds until recorded.
type Finished<P, V> = (usize, Ran<P, V>, usize);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A member of the oldest open subject that no worker has taken yet.
fn claim_member<P, V>(open: &OpenList<P, V>) -> Option<(Arc<Open<P, V>>, usize)> {
    let open = lock(open);
    open.iter()
        .filter(|s| s.claimed.load(Ordering::Relaxed) < s.members)
        .min_by_key(|s| s.index)
        .and_then(|s| {
            let i = s.claimed.fetch_add(1, Ordering::Relaxed);
            (i < s.members).then(|| (s.clone(), i))
        })
}

/// The last member of `subject` has run: take it off the open list, as the recorder takes it.
fn close<P, V>(open: &OpenList<P, V>, subject: Arc<Open<P, V>>) -> Finished<P, V> {
    lock(open).retain(|s| !Arc::ptr_eq(s, &subject));
    // Every other worker that held it had a member of it to run and has finished it; it lets
    // go of the subject right after.
    let mut subject = subject;
    let subject = loop {
        match Arc::try_unwrap(subject) {
            Ok(s) => break s,
            Err(shared) => {
                subject = shared;
                std::thread::yield_now();
            }
        }
    };
    let verdicts = subject
        .verdicts
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    (
        subject.index,
        Ran {
            prepared: Some(subject.prepared),
            oracle: subject.oracle,
            verdicts,
        },
        subject.held,
    )
}

/// The number of backends the items name (one past the highest index).
fn backend_count(items: &[Item]) -> usize {
    items
        .iter()
        .flat_map(|i| i.members.iter())
        .map(|m| m.backend + 1)
        .max()
        .unwrap_or(0)
}

/// Build `item` for the members not skipped, then run each of them.
fn run_item<S: Subjects>(
    subjects: &S,
    item: &Item,
    skip: &dyn Fn(usize) -> bool,
) -> Ran<S::Prepared, S::Verdict> {
    let Some((prepared, oracle, live)) = prepare_live(subjects, item, skip) else {
        return Ran::skipped(item.members.len());
    };
    let verdicts = item
        .members
        .iter()
        .map(|&m| {
            live.contains(&m).then(|| {
                let t0 = Instant::now();
                let v = subjects.evaluate(&prepared, m);
                (v, t0.elapsed())
            })
        })
        .collect();
    Ran {
        prepared: Some(prepared),
        oracle,
        verdicts,
    }
}

/// Build and judge `item` for its members not skipped (`None` when none is left): the
/// prepared subject, the time that took, and those members.
fn prepare_live<S: Subjects>(
    subjects: &S,
    item: &Item,
    skip: &dyn Fn(usize) -> bool,
) -> Option<(S::Prepared, Duration, Vec<Member>)> {
    let live: Vec<Member> = item
        .members
        .iter()
        .copied()
        .filter(|m| !skip(m.backend))
        .collect();
    if live.is_empty() {
        return None;
    }
    let t0 = Instant::now();
    let prepared = subjects.prepare(&Item {
        index: item.index,
        members: live.clone(),
    });
    Some((prepared, t0.elapsed(), live))
}

/// What one index drew for each cohort among a subject's members, each distinct draw made
/// once: cohorts whose spaces draw the same subject at an index share its build and oracle.
pub struct PerCohort<T> {
    distinct: Vec<T>,
    of_cohort: Vec<Option<usize>>,
}

impl<T> PerCohort<T> {
    /// What `cohort` drew (one of the item's members' cohorts).
    pub fn of(&self, cohort: usize) -> &T {
        &self.distinct[self.of_cohort[cohort].expect("drawn for every member's cohort")]
    }

    /// Each distinct draw once.
    pub fn distinct(&self) -> impl Iterator<Item = &T> {
        self.distinct.iter()
    }

    /// Each distinct draw made into what the subject needs (built, judged by the oracle).
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> PerCohort<U> {
        PerCohort {
            distinct: self.distinct.into_iter().map(f).collect(),
            of_cohort: self.of_cohort,
        }
    }
}

/// `make(cohort)` for the cohorts of `members`, equal draws kept once.
pub fn per_cohort<T: PartialEq>(
    members: &[Member],
    cohorts: usize,
    make: impl Fn(usize) -> T,
) -> PerCohort<T> {
    let mut distinct: Vec<T> = Vec::new();
    let mut of_cohort = vec![None; cohorts];
    for m in members {
        if of_cohort[m.cohort].is_some() {
            continue;
        }
        let v = make(m.cohort);
        let at = match distinct.iter().position(|d| *d == v) {
            Some(at) => at,
            None => {
                distinct.push(v);
                distinct.len() - 1
            }
        };
        of_cohort[m.cohort] = Some(at);
    }
    PerCohort {
        distinct,
        of_cohort,
    }
}

/// `f` of every item on `jobs` threads, the results in item order (for work with no order
/// of its own, such as one check per mutant).
pub fn map_ordered<T: Sync, R: Send>(
    jobs: usize,
    items: &[T],
    f: &(dyn Fn(&T) -> R + Sync),
) -> Vec<R> {
    if jobs <= 1 || items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(items.len()) {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(k) else { break };
                let r = f(item);
                *results[k].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("every item ran")
        })
        .collect()
}
