//! The files a run leaves for people: replay files (the failing case as JSON) and error heat
//! maps. The pipeline only decides where they go and keeps what they need; they are written
//! here, afterwards, each atomically.

use attn_reference::Case;
use attn_results::compare::Comparison;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// In each folder attn-diff writes failures into, the files it wrote, one a line as
/// `RUN<TAB>NAME` (RUN: one run's id), so a later `check` prunes only files attn-diff wrote
/// ([`prune_failures`]).
pub const REGISTRY: &str = ".attn-diff-files";

/// This process's run id: the time of its first write and its process id.
fn run_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{nanos}-{}", std::process::id())
    })
}

/// Add `path` to its folder's registry as written by this run.
fn register(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(REGISTRY))
        .and_then(|mut f| writeln!(f, "{}\t{name}", run_id()));
    if let Err(e) = appended {
        eprintln!(
            "warning: cannot record {} in {}: {e}",
            path.display(),
            dir.join(REGISTRY).display()
        );
    }
}

/// Names attn-diff gives property-case, trace and invariance failures (`…-seed1-case0.json`,
/// `.png`, `…-seed1-trace3.json`, `…-seed1-pair2.json`): files of runs from before the registry are recognised by them.
fn named_like_a_failure(name: &str) -> bool {
    let Some(stem) = name
        .strip_suffix(".json")
        .or_else(|| name.strip_suffix(".png"))
    else {
        return false;
    };
    fn digits_after<'a>(s: &'a str, tag: &str) -> Option<&'a str> {
        s.rsplit_once(tag)
            .filter(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .map(|(head, _)| head)
    }
    digits_after(stem, "-case")
        .or_else(|| digits_after(stem, "-trace"))
        .or_else(|| digits_after(stem, "-pair"))
        .and_then(|head| digits_after(head, "-seed"))
        .is_some()
}

/// Delete the failure files of every run but the last one that wrote into `dir`: files
/// attn-diff wrote there (listed in its [`REGISTRY`], or named as it names failures), never
/// anything else. Run at the start of a `check` writing there, so the folder holds the last
/// run's files (and then this run's), instead of growing with every run. Without a registry
/// nothing is deleted: which run was last is not known.
pub fn prune_failures(dir: &Path) {
    let registry = dir.join(REGISTRY);
    let Ok(text) = std::fs::read_to_string(&registry) else {
        return;
    };
    let entries: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(_, name)| !name.is_empty() && !name.contains(['/', '\\']) && *name != REGISTRY)
        .collect();
    let Some(&(last, _)) = entries.last() else {
        return;
    };
    let keep: std::collections::HashSet<&str> = entries
        .iter()
        .filter(|(run, _)| *run == last)
        .map(|&(_, name)| name)
        .collect();
    let listed = entries.iter().map(|&(_, name)| name.to_string());
    let recognised = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| named_like_a_failure(name));
    let doomed: std::collections::BTreeSet<String> = listed
        .chain(recognised)
        .filter(|name| !keep.contains(name.as_str()))
        .collect();
    for name in &doomed {
        let path = dir.join(name);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            if let Err(e) = std::fs::remove_file(&path) {
                eprintln!(
                    "warning: cannot remove old failure file {}: {e}",
                    path.display()
                );
            }
        }
    }
    let kept: String = entries
        .iter()
        .filter(|(run, _)| *run == last)
        .map(|(run, name)| format!("{run}\t{name}\n"))
        .collect();
    if let Err(e) = attn_reference::golden::write_atomic(&registry, kept.as_bytes()) {
        eprintln!("warning: cannot rewrite {}: {e}", registry.display());
    }
}

/// One failure's files, pending.
#[derive(Clone, Debug, Default)]
pub struct Artifact {
    pub replay: Option<(PathBuf, Case)>,
    /// A diverging trace's replay file.
    pub trace: Option<(PathBuf, attn_reference::Trace)>,
    pub heatmap: Option<HeatMap>,
    /// The other forms of an invariance failure's case (its batch reordered, split, moved),
    /// beside its replay file.
    pub also: Vec<(PathBuf, Case)>,
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
    /// Token indices where each sequence starts (`query_start_loc`).
    pub boundaries: Vec<usize>,
}

impl HeatMap {
    pub fn of(path: PathBuf, backend: &str, case: &Case, c: &Comparison) -> HeatMap {
        HeatMap {
            path,
            title: format!("{backend}: abs error by token and head"),
            errors: c.err_map.clone(),
            tokens: case.num_real_tokens(),
            heads: case.config.num_heads,
            allowance: c.tolerance.atol,
            boundaries: case.query_start_loc(),
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
            match written {
                Ok(()) => register(path),
                Err(e) => eprintln!("warning: cannot write trace file {}: {e}", path.display()),
            }
        }
        for (path, case) in a.replay.iter().chain(&a.also) {
            let written = serde_json::to_string(case)
                .map_err(|e| e.to_string())
                .and_then(|json| {
                    attn_reference::golden::write_atomic(path, json.as_bytes())
                        .map_err(|e| e.to_string())
                });
            match written {
                Ok(()) => register(path),
                Err(e) => eprintln!("warning: cannot write replay file {}: {e}", path.display()),
            }
        }
        if let Some(h) = &a.heatmap {
            let drawn = crate::render::plot::heat_map(
                &h.path,
                &h.title,
                crate::render::plot::ErrorGrid {
                    errors: &h.errors,
                    tokens: h.tokens,
                    heads: h.heads,
                },
                h.allowance,
                &h.boundaries,
            );
            match drawn {
                Ok(()) => register(&h.path),
                Err(e) => eprintln!("warning: cannot draw heat map {}: {e}", h.path.display()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_names_are_recognised() {
        assert!(named_like_a_failure("cpu-seed1-case0.json"));
        assert!(named_like_a_failure(
            "external_numpy-ref-seed12-case340.png"
        ));
        assert!(named_like_a_failure("mutant_x-seed1-trace3.json"));
        assert!(named_like_a_failure("cpu-seed4-pair12.json"));
        assert!(!named_like_a_failure("notes.json"));
        assert!(!named_like_a_failure("cpu-seed1-case0.txt"));
        assert!(!named_like_a_failure("cpu-seedX-case0.json"));
        assert!(!named_like_a_failure("cpu-seed1-case.json"));
    }
}
