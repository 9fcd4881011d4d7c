//! The files a run leaves for people: replay files (the failing case as JSON) and error heat
//! maps. The pipeline only decides where they go and keeps what they need; they are written
//! here, afterwards, each atomically.

use crate::compare::{Comparison, Tolerance};
use attn_reference::Case;
use std::path::PathBuf;

/// One failure's files, pending.
#[derive(Clone, Debug, Default)]
pub struct Artifact {
    pub replay: Option<(PathBuf, Case)>,
    /// A diverging trace's replay file.
    pub trace: Option<(PathBuf, attn_reference::Trace)>,
    pub heatmap: Option<HeatMap>,
}

/// An error heat map (tokens × heads) to draw.
#[derive(Clone, Debug)]
pub struct HeatMap {
    pub path: PathBuf,
    pub title: String,
    pub errors: Vec<f64>,
    pub tokens: usize,
    pub heads: usize,
    /// The absolute tolerance, where the colour scale turns.
    pub allowance: f64,
}

impl HeatMap {
    pub fn of(path: PathBuf, backend: &str, case: &Case, c: &Comparison) -> HeatMap {
        HeatMap {
            path,
            title: format!("{backend}: abs error by token and head"),
            errors: c.err_map.clone(),
            tokens: case.num_real_tokens(),
            heads: case.config.num_heads,
            allowance: Tolerance::for_case(case).atol,
        }
    }
}

/// Write every pending file; what cannot be written is named on stderr (the run's verdict
/// stands without it).
pub fn write_all(artifacts: &[Artifact]) {
    for a in artifacts {
        if let Some((path, trace)) = &a.trace {
            let written = serde_json::to_string(trace)
                .map_err(|e| e.to_string())
                .and_then(|json| {
                    attn_reference::golden::write_atomic(path, json.as_bytes())
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = written {
                eprintln!("warning: cannot write trace file {}: {e}", path.display());
            }
        }
        if let Some((path, case)) = &a.replay {
            let written = serde_json::to_string(case)
                .map_err(|e| e.to_string())
                .and_then(|json| {
                    attn_reference::golden::write_atomic(path, json.as_bytes())
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = written {
                eprintln!("warning: cannot write replay file {}: {e}", path.display());
            }
        }
        if let Some(h) = &a.heatmap {
            let drawn = crate::render::plot::heat_map(
                &h.path,
                &h.title,
                &h.errors,
                h.tokens,
                h.heads,
                h.allowance,
            );
            if let Err(e) = drawn {
                eprintln!("warning: cannot draw heat map {}: {e}", h.path.display());
            }
        }
    }
}
