//! A real engine's recorded attention calls: the folder `attn-diff record` (the Python
//! package's engine recorder) writes, read and checked here. Each call file holds one
//! forward of one layer as an attn-diff [`Case`] (its real values) and the output the
//! engine's own backend returned; each `engine-PID.json` says what one engine process
//! recorded and what it left out, and why.

pub mod engine;

use attn_reference::Case;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The schema a call file states.
pub const CALL_SCHEMA: &str = "attn-diff-engine-call/1";

/// The engine's side of a call.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineInfo {
    /// The attention impl's class, e.g. `CPUAttentionBackendImpl`.
    pub backend: String,
    pub vllm: String,
    pub pid: u64,
}

/// One recorded call, as its file holds it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallFile {
    schema: String,
    layer: String,
    call: usize,
    engine: EngineInfo,
    case: Case,
    output: Vec<f32>,
}

/// One recorded call: a case with real values and what the engine computed for it.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineCall {
    /// The file's name inside the recording's `calls/`.
    pub file: String,
    /// The layer as vLLM names it (`model.layers.0.self_attn.attn`).
    pub layer: String,
    /// The call's index among that layer's calls in its process.
    pub call: usize,
    pub engine: EngineInfo,
    pub case: Case,
    /// `[real tokens, num_heads, head_size_v]`, as the engine's backend returned it.
    pub output: Vec<f32>,
}

/// What one engine process recorded: its `engine-PID.json`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct EngineManifest {
    pub pid: u64,
    pub vllm: String,
    #[serde(default)]
    pub backends: Vec<String>,
    #[serde(default)]
    pub model: BTreeMap<String, serde_json::Value>,
    pub recorded: usize,
    /// Calls not written, by reason.
    #[serde(default)]
    pub left_out: BTreeMap<String, usize>,
}

/// A recording folder, read whole.
#[derive(Clone, Debug)]
pub struct Recording {
    pub dir: PathBuf,
    pub engines: Vec<EngineManifest>,
    /// In file-name order: process, layer, call.
    pub calls: Vec<EngineCall>,
}

impl Recording {
    /// Calls the engines left out, by reason, every process together.
    pub fn left_out(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for e in &self.engines {
            for (why, n) in &e.left_out {
                *out.entry(why.clone()).or_insert(0) += n;
            }
        }
        out
    }
}

/// Why a recording could not be read: each names the file (and the field) at fault.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("recording {dir}: cannot read it: {message}")]
    Io { dir: String, message: String },
    #[error("recording {dir}: no engine-PID.json: not a folder `attn-diff record` wrote")]
    NoEngine { dir: String },
    #[error("recording {dir}: the engine recorded no calls{why}")]
    Empty { dir: String, why: String },
    #[error("recording {file}: {message}")]
    Malformed { file: String, message: String },
}

/// Read the recording in `dir`: every engine manifest and every call file, each call's case
/// validated and its output's length checked against the case. A folder with no calls is an
/// error that says what the engines left out.
pub fn load(dir: &Path) -> Result<Recording, RecordingError> {
    let name = dir.display().to_string();
    let io = |e: std::io::Error| RecordingError::Io {
        dir: name.clone(),
        message: e.to_string(),
    };
    let mut engines = Vec::new();
    for entry in sorted_entries(dir).map_err(io)? {
        let file = entry
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if file.starts_with("engine-") && file.ends_with(".json") {
            let text = std::fs::read_to_string(&entry).map_err(io)?;
            let m: EngineManifest = attn_reference::json::parse(&text).map_err(|(l, c, m)| {
                RecordingError::Malformed {
                    file: entry.display().to_string(),
                    message: format!("line {l}, column {c}: {m}"),
                }
            })?;
            engines.push(m);
        }
    }
    if engines.is_empty() {
        return Err(RecordingError::NoEngine { dir: name });
    }
    let calls_dir = dir.join("calls");
    let mut calls = Vec::new();
    if calls_dir.is_dir() {
        for path in sorted_entries(&calls_dir).map_err(io)? {
            if path.extension().is_some_and(|e| e == "json") {
                calls.push(read_call(&path)?);
            }
        }
    }
    let recording = Recording {
        dir: dir.to_path_buf(),
        engines,
        calls,
    };
    if recording.calls.is_empty() {
        let left = recording.left_out();
        let why = if left.is_empty() {
            " (nothing left out either: did the engine run a forward with the recorder loaded?)"
                .to_string()
        } else {
            let reasons: Vec<String> = left.iter().map(|(w, n)| format!("{n} × {w}")).collect();
            format!("; left out: {}", reasons.join("; "))
        };
        return Err(RecordingError::Empty { dir: name, why });
    }
    Ok(recording)
}

/// `dir`'s entries, sorted by name (so a recording reads the same on every file system).
fn sorted_entries(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    out.sort();
    Ok(out)
}

/// One call file, parsed and checked.
pub fn read_call(path: &Path) -> Result<EngineCall, RecordingError> {
    let file = path.display().to_string();
    let malformed = |message: String| RecordingError::Malformed {
        file: file.clone(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| malformed(e.to_string()))?;
    let c: CallFile = attn_reference::json::parse(&text)
        .map_err(|(l, col, m)| malformed(format!("line {l}, column {col}: {m}")))?;
    if c.schema != CALL_SCHEMA {
        return Err(malformed(format!(
            "schema: {:?}, expected {CALL_SCHEMA:?}",
            c.schema
        )));
    }
    c.case
        .validate()
        .map_err(|e| malformed(format!("case: {e}")))?;
    let cfg = &c.case.config;
    let want = c.case.num_real_tokens() * cfg.num_heads * cfg.head_size_v();
    if c.output.len() != want {
        return Err(malformed(format!(
            "output: {} values, expected {want} ({} real tokens × {} heads × {})",
            c.output.len(),
            c.case.num_real_tokens(),
            cfg.num_heads,
            cfg.head_size_v()
        )));
    }
    Ok(EngineCall {
        file: path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string(),
        layer: c.layer,
        call: c.call,
        engine: c.engine,
        case: c.case,
        output: c.output,
    })
}
