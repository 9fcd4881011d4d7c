//! How to start an adapter: its command, environment, working directory and time limits.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Default time an adapter gets for one case.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default time an adapter gets to start and answer the handshake (importing PyTorch is slow).
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Clone, Debug, PartialEq)]
pub struct AdapterSpec {
    /// The adapter's name; the backend is registered as `external:<name>`.
    pub name: String,
    /// Program and arguments (no shell).
    pub command: Vec<String>,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// Working directory (default: attn-diff's own).
    pub cwd: Option<PathBuf>,
    /// Time allowed for one case; past it the adapter is killed and restarted.
    pub timeout: Duration,
    /// Time allowed to start and answer the handshake.
    pub startup_timeout: Duration,
    /// Adapter processes run side by side, each with its own sessions (a check's `--jobs`);
    /// the first is started at once, the others when first needed.
    pub processes: usize,
    /// The most processes the adapter's declaration allows (`max_processes` in
    /// `attn-diff.toml`: each process holds its own copy of a heavy kernel); None: no limit.
    pub max_processes: Option<usize>,
}

impl AdapterSpec {
    pub fn new(name: impl Into<String>, command: Vec<String>) -> Self {
        AdapterSpec {
            name: name.into(),
            command,
            env: BTreeMap::new(),
            cwd: None,
            timeout: DEFAULT_TIMEOUT,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            processes: 1,
            max_processes: None,
        }
    }

    /// The backend name the harness knows the adapter by.
    pub fn backend_name(&self) -> String {
        attn_results::BackendRef::external(&self.name).to_string()
    }
}
