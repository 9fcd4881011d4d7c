//! Backends that live in another process: an adapter (a Python script around a user's
//! kernel, vLLM's own CPU kernel, ...) speaking the framed protocol documented in
//! `docs/external-backends.md`.
//!
//! attn-diff starts the adapter once and keeps it (with `processes` > 1, a pool of them, each
//! cache pinned to one process for its life). `new_cache` and `write_kv` only record
//! what to write; `forward` sends the whole case (every write in order, then the step) as one
//! request and waits for one reply (version 1), or, to an adapter speaking version 2, one
//! `step` of the cache's session with the writes since its last step: the adapter keeps the
//! session's cache, so a trace runs on one cache as it does in-process. A timeout kills the adapter (it is restarted for the next
//! case) and is a [`BackendError::Timeout`]; a dead adapter is a [`BackendError::Crashed`]
//! ending with its stderr; a malformed reply is a [`BackendError::Protocol`] naming what was
//! wrong.

mod frame;
pub mod live;
mod process;
mod protocol;
mod spec;
mod stderr_tail;

pub use attn_reference::Feature;
/// What an adapter declares it can run, sent once in its handshake: a [`Space`](attn_reference::Space)
/// (every key left out means no restriction); anything it does not capture the adapter
/// declines per case with an `unsupported` reply.
pub type Capabilities = attn_reference::Space;
pub use protocol::{Hello, ProtocolError, PROTOCOL, PROTOCOL_VERSION};
pub use spec::{AdapterSpec, DEFAULT_STARTUP_TIMEOUT, DEFAULT_TIMEOUT};

use crate::{
    cache_as, cache_as_mut, Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs,
    Unsupported,
};
use attn_reference::AttentionConfig;
use attn_reference::Dimension;
use process::{AdapterProcess, ExchangeError};
use protocol::Reply;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use thiserror::Error;

/// How long an adapter that closed its stdout gets to exit, so its exit status is known.
const EXIT_AFTER_EOF: Duration = Duration::from_secs(2);

/// Why an adapter could not be started.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum StartError {
    #[error("adapter `{name}`: {message}")]
    Spawn { name: String, message: String },
    #[error("adapter `{name}` failed its handshake: {message}")]
    Handshake { name: String, message: String },
}

/// K/V rows recorded by `write_kv`, sent to the adapter with the step.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedWrite {
    pub key: Vec<f32>,
    pub value: Vec<f32>,
    pub slot_mapping: Vec<i64>,
}

/// An external backend's "cache": the real one lives in the adapter, built from these.
#[derive(Debug)]
pub struct ExternalCache {
    pub num_blocks: usize,
    pub writes: Vec<RecordedWrite>,
    /// The session this cache is (protocol version 2), unique per backend.
    pub session: u64,
    /// (adapter start it was sent to, writes sent): a restarted adapter lost the session, so
    /// its next step resends every write.
    sent: Mutex<(u64, usize)>,
    /// The process every step of this cache goes to: a session lives in one process.
    slot: usize,
    /// Counts this cache among its process's users while it lives.
    _user: SlotUser,
}

/// One live cache pinned to a process; a new cache goes to the process with fewest.
#[derive(Debug)]
struct SlotUser(Arc<AtomicUsize>);

impl Drop for SlotUser {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct State {
    process: Option<AdapterProcess>,
    next_case: u64,
    /// The session the process holds (an adapter keeps one: a step of another starts fresh).
    session: Option<u64>,
    starts: u64,
}

/// One adapter process of the pool.
struct Slot {
    state: Mutex<State>,
    users: Arc<AtomicUsize>,
}

impl Slot {
    fn new(process: Option<AdapterProcess>) -> Slot {
        Slot {
            state: Mutex::new(State {
                starts: process.is_some() as u64,
                process,
                next_case: 0,
                session: None,
            }),
            users: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct ExternalBackend {
    spec: AdapterSpec,
    name: String,
    hello: Hello,
    /// `spec.processes` processes (at least one); the first started with the handshake.
    slots: Vec<Slot>,
    next_session: AtomicU64,
    last_kernel: Mutex<Option<Duration>>,
    /// The longest exchange that came back with an output, in nanoseconds (0: none yet).
    slowest_answer_ns: AtomicU64,
}

fn with_stderr(message: String, tail: &str) -> String {
    if tail.is_empty() {
        format!("{message}; it wrote nothing to stderr")
    } else {
        format!("{message}; the end of its stderr:\n{tail}")
    }
}

/// Start the adapter and run the handshake.
fn start(spec: &AdapterSpec) -> Result<(AdapterProcess, Hello), StartError> {
    let mut p = AdapterProcess::spawn(spec).map_err(|message| StartError::Spawn {
        name: spec.name.clone(),
        message,
    })?;
    let fail = |p: &mut AdapterProcess, what: String| {
        let status = p.finish(EXIT_AFTER_EOF);
        StartError::Handshake {
            name: spec.name.clone(),
            message: with_stderr(format!("{what} ({status})"), &p.stderr_tail()),
        }
    };
    match p.exchange(protocol::hello_request(), spec.startup_timeout) {
        Ok(bytes) => match protocol::parse_hello(&bytes) {
            Ok(h) => Ok((p, h)),
            Err(e) => Err(fail(&mut p, e.to_string())),
        },
        Err(ExchangeError::Timeout) => {
            p.kill();
            Err(StartError::Handshake {
                name: spec.name.clone(),
                message: with_stderr(
                    format!(
                        "no handshake reply within {:.1} s",
                        spec.startup_timeout.as_secs_f64()
                    ),
                    &p.stderr_tail(),
                ),
            })
        }
        Err(ExchangeError::Ended(how)) => Err(fail(&mut p, format!("it {how}"))),
        Err(ExchangeError::Malformed(what)) => Err(fail(&mut p, what)),
    }
}

impl ExternalBackend {
    /// Start the adapter and run the handshake; the process is kept for every case.
    pub fn start(spec: AdapterSpec) -> Result<ExternalBackend, StartError> {
        let (process, hello) = start(&spec)?;
        let slots = std::iter::once(Slot::new(Some(process)))
            .chain((1..spec.processes.max(1)).map(|_| Slot::new(None)))
            .collect();
        Ok(ExternalBackend {
            name: spec.backend_name(),
            spec,
            hello,
            slots,
            next_session: AtomicU64::new(0),
            last_kernel: Mutex::new(None),
            slowest_answer_ns: AtomicU64::new(0),
        })
    }

    /// What the adapter said in its (first) handshake.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    pub fn spec(&self) -> &AdapterSpec {
        &self.spec
    }

    /// The kernel time the adapter reported for the last case it ran (for `bench`).
    pub fn last_kernel_time(&self) -> Option<Duration> {
        *self.last_kernel.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many times adapter processes were started (1 + restarts + the pool's others).
    pub fn starts(&self) -> u64 {
        self.slots.iter().map(|s| s.state().starts).sum()
    }

    /// The first adapter process's id, when it is running.
    pub fn process_id(&self) -> Option<u32> {
        self.slots[0]
            .state()
            .process
            .as_ref()
            .map(AdapterProcess::id)
    }

    /// How many adapter processes have been started and are running.
    pub fn processes_running(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.state().process.is_some())
            .count()
    }

    fn crashed(&self, message: String) -> BackendError {
        BackendError::Crashed {
            backend: self.name.clone(),
            message,
        }
    }

    fn protocol(&self, message: String) -> BackendError {
        BackendError::Protocol {
            backend: self.name.clone(),
            message,
        }
    }

    /// Send one case and read its reply; every failure leaves no process behind.
    fn run_remote(
        &self,
        config: &AttentionConfig,
        cache: &ExternalCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        *self.last_kernel.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let mut st = self.slots[cache.slot].state();
        if st.process.is_none() {
            let (p, _) = start(&self.spec).map_err(|e| {
                let what = if st.starts == 0 { "start" } else { "restart" };
                self.crashed(format!("could not {what} the adapter: {e}"))
            })?;
            st.process = Some(p);
            st.starts += 1;
        }
        let id = st.next_case;
        st.next_case += 1;
        let sessions = self.hello.version >= protocol::SESSION_VERSION;
        let mut sent = cache.sent.lock().unwrap_or_else(|p| p.into_inner());
        let request = if sessions {
            // A restarted process lost the session, and one that ran another session since
            // dropped it: resend every write.
            let fresh = sent.1 == 0 || sent.0 != st.starts || st.session != Some(cache.session);
            st.session = Some(cache.session);
            protocol::step_request(id, config, cache, (sent.1, fresh), step)
        } else {
            protocol::case_request(id, config, cache, step)
        };
        // Until a reply arrives, the adapter may or may not hold these writes: resend all.
        *sent = (0, 0);
        let Some(mut p) = st.process.take() else {
            return Err(self.crashed("the adapter is not running".into()));
        };
        // A shrink of a timeout tries its candidates under a tighter limit.
        let timeout = crate::call_limit::narrowed(self.spec.timeout);
        let asked = std::time::Instant::now();
        let bytes = match p.exchange(request, timeout) {
            Ok(b) => b,
            Err(ExchangeError::Timeout) => {
                p.kill();
                return Err(BackendError::Timeout {
                    backend: self.name.clone(),
                    seconds: timeout.as_secs_f64(),
                });
            }
            Err(ExchangeError::Ended(how)) => {
                let status = p.finish(EXIT_AFTER_EOF);
                return Err(self.crashed(with_stderr(
                    format!("the adapter {how} during case {id} ({status})"),
                    &p.stderr_tail(),
                )));
            }
            Err(ExchangeError::Malformed(what)) => {
                p.kill();
                return Err(self.protocol(what));
            }
        };
        let shape = [step.num_tokens, config.num_heads, config.head_size_v()];
        match protocol::parse_reply(&bytes, id, shape) {
            Err(e) => {
                // The stream may be out of step: start afresh for the next case.
                p.kill();
                Err(self.protocol(e.to_string()))
            }
            Ok(reply) => {
                st.process = Some(p);
                match reply {
                    Reply::Output {
                        values,
                        kernel_seconds,
                    } => {
                        *self.last_kernel.lock().unwrap_or_else(|p| p.into_inner()) =
                            kernel_seconds.map(Duration::from_secs_f64);
                        let took = u64::try_from(asked.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        self.slowest_answer_ns.fetch_max(took, Ordering::Relaxed);
                        *sent = (st.starts, cache.writes.len());
                        Ok(values)
                    }
                    Reply::Unsupported(reason) => {
                        Err(Unsupported::new(Dimension::Other, reason).into())
                    }
                    Reply::Error(message) => Err(BackendError::Failed {
                        backend: self.name.clone(),
                        message,
                    }),
                }
            }
        }
    }
}

impl Backend for ExternalBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn role(&self) -> attn_results::BackendRole {
        attn_results::BackendRole::External
    }

    /// Everything the capabilities say is checked as the declared space (see `space`).
    fn supports(&self, _: &AttentionConfig) -> Result<(), Unsupported> {
        Ok(())
    }

    fn space(&self) -> attn_reference::Space {
        self.hello.capabilities.clone()
    }

    fn environment(&self) -> std::collections::BTreeMap<String, String> {
        self.hello.environment.clone()
    }

    fn invariant_under(&self) -> Vec<attn_reference::relation::Relation> {
        if self.hello.batch_invariant {
            attn_reference::relation::Relation::ALL.to_vec()
        } else {
            Vec::new()
        }
    }

    /// An adapter whose class computes its own way but inherited its capabilities: the
    /// features of a failing case that it was declared to run are the first suspects.
    fn failure_caveat(&self, config: &AttentionConfig) -> Option<String> {
        let from = self.hello.inherited_capabilities.as_ref()?;
        let used: Vec<&str> = attn_reference::Feature::ALL
            .into_iter()
            .filter(|f| f.used_by(config))
            .map(attn_reference::Feature::label)
            .collect();
        let features = if used.is_empty() {
            String::new()
        } else {
            format!(" (this case uses {})", used.join(", "))
        };
        Some(format!(
            "the adapter's class declares no capabilities of its own: it inherits those of \
             {from}, so it is sent every feature {from} runs{features}; if its own forward \
             does not implement them, declare `capabilities` on the class"
        ))
    }

    /// Version 2 keeps a session's cache in the adapter across `step` messages. Version 1
    /// sends each forward with every write since the cache was made: the adapter rebuilds
    /// its cache per call, so a trace would test the replay, not its cache across steps.
    fn runs_traces(&self) -> Result<(), Unsupported> {
        if self.hello.version >= protocol::SESSION_VERSION {
            return Ok(());
        }
        Err(Unsupported::new(
            Dimension::Trace,
            "protocol version 1 has no sessions: the adapter's cache is rebuilt for every call",
        ))
    }

    /// The established features, plus the later ones the adapter lists in its capabilities
    /// (an adapter that lists none is not assumed to have, say, an FP8 cache), and
    /// cross-attention when its `kinds` name `encoder_decoder`.
    fn optional_features(&self) -> Vec<attn_reference::Feature> {
        use attn_reference::{AttentionKind, Feature};
        let caps = &self.hello.capabilities;
        let mut f = Feature::ESTABLISHED.to_vec();
        if let Some(listed) = &caps.features {
            f.extend(
                listed
                    .iter()
                    .filter(|x| !f.contains(x))
                    .copied()
                    .collect::<Vec<_>>(),
            );
        }
        if caps
            .kinds
            .as_ref()
            .is_some_and(|k| k.contains(&AttentionKind::EncoderDecoder))
        {
            f.push(Feature::CrossAttention);
        }
        // An FP8 format among the KV-cache dtypes declares the FP8 cache too.
        if caps
            .kv_cache_dtypes
            .as_ref()
            .is_some_and(|k| k.iter().any(|d| *d != attn_reference::KvCacheDtype::Auto))
            && !f.contains(&Feature::Fp8KvCache)
        {
            f.push(Feature::Fp8KvCache);
        }
        f
    }

    fn cache_layout(&self) -> CacheLayout {
        CacheLayout {
            shape: "adapter-defined",
            description: "lives in the adapter process, built there from the case's writes",
        }
    }

    fn new_cache(&self, _: &AttentionConfig, num_blocks: usize) -> Result<KvCache, BackendError> {
        let session = self.next_session.fetch_add(1, Ordering::Relaxed) + 1;
        // The process with the fewest live caches: concurrent cases each get their own.
        let slot = (0..self.slots.len())
            .min_by_key(|&i| self.slots[i].users.load(Ordering::Relaxed))
            .unwrap_or(0);
        let users = Arc::clone(&self.slots[slot].users);
        users.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(ExternalCache {
            num_blocks,
            session,
            sent: Mutex::new((0, 0)),
            writes: Vec::new(),
            slot,
            _user: SlotUser(users),
        }))
    }

    fn write_kv(
        &self,
        config: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        let cache = cache_as_mut::<ExternalCache>(&self.name, cache)?;
        let row = config.num_kv_heads * config.head_size;
        let n = kv.slot_mapping.len();
        // An MLA write carries no V (it is the key's prefix).
        if kv.key.len() != n * row || kv.value.len() != n * config.value_row() {
            return Err(BackendError::InvalidInput {
                backend: self.name.clone(),
                message: format!(
                    "write of {n} slots carries {} key and {} value values, expected {} and {}",
                    kv.key.len(),
                    kv.value.len(),
                    n * row,
                    n * config.value_row()
                ),
            });
        }
        // Copies sized from the case: a machine that cannot hold them fails the write with an
        // error, never an abort.
        fn copy<T: Copy>(from: &[T]) -> Option<Vec<T>> {
            let mut v = Vec::new();
            v.try_reserve_exact(from.len()).ok()?;
            v.extend_from_slice(from);
            Some(v)
        }
        let recorded = (|| {
            Some(RecordedWrite {
                key: copy(kv.key)?,
                value: copy(kv.value)?,
                slot_mapping: copy(kv.slot_mapping)?,
            })
        })()
        .ok_or_else(|| BackendError::Failed {
            backend: self.name.clone(),
            message: format!("cannot allocate a copy of a write of {n} slots"),
        })?;
        cache
            .writes
            .try_reserve(1)
            .map_err(|_| BackendError::Failed {
                backend: self.name.clone(),
                message: "cannot allocate the list of writes".into(),
            })?;
        cache.writes.push(recorded);
        Ok(())
    }

    fn forward(
        &self,
        config: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        let cache = cache_as::<ExternalCache>(&self.name, cache)?;
        self.run_remote(config, cache, step)
    }

    fn call_timeout(&self) -> Option<Duration> {
        Some(self.spec.timeout)
    }

    fn slowest_answer(&self) -> Option<Duration> {
        match self.slowest_answer_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// The adapter's own `kernel_seconds` for its last case.
    fn reported_kernel_time(&self) -> Option<Duration> {
        self.last_kernel_time()
    }
}
