//! A divergence as a person would write it up: the minimal case on one screen, where it
//! diverges, a diff of expected and actual rows around the mismatches, a hint from the
//! error's pattern, and the replay file that reproduces it.

use crate::compare::{Comparison, Mismatch};
use crate::hint::hint;
use crate::runner::{Divergence, DivergenceKind};
use crate::shrink::Shrunk;
use attn_reference::Case;
use serde::Serialize;
use std::fmt::Write;
use std::path::Path;

#[derive(Clone, Debug, Serialize)]
pub struct ShrinkInfo {
    pub steps: usize,
    pub accepted: usize,
    pub seconds: f64,
}

/// The size of a (minimal) case, as the mutants table shows it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CaseSize {
    pub sequences: usize,
    pub tokens: usize,
    pub max_seq_len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
}

impl CaseSize {
    pub fn of(case: &Case) -> CaseSize {
        CaseSize {
            sequences: case.num_seqs(),
            tokens: case.num_tokens(),
            max_seq_len: case.batch.seq_lens.iter().copied().max().unwrap_or(0),
            heads: case.config.num_heads,
            kv_heads: case.config.num_kv_heads,
            head_size: case.config.head_size,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct FailureReport {
    pub backend: String,
    /// Which case of the run failed first (before shrinking).
    pub origin: String,
    pub kind: DivergenceKind,
    pub message: String,
    pub size: CaseSize,
    pub replay: Option<String>,
    pub shrink: Option<ShrinkInfo>,
    pub first: Option<Mismatch>,
    pub worst: Option<Mismatch>,
    pub hint: Option<String>,
    /// Path of the error heat map, when one was drawn.
    pub heatmap: Option<String>,
    /// The report as printed.
    pub text: String,
    #[serde(skip)]
    pub case: Case,
}

/// Write a replay file (the case as JSON) atomically under `dir`; the path, or None (with a
/// warning on stderr) when it cannot be written.
pub fn write_replay(dir: &Path, file: &str, case: &Case) -> Option<String> {
    let path = dir.join(file);
    let json = serde_json::to_string(case).ok()?;
    match attn_reference::golden::write_atomic(&path, json.as_bytes()) {
        Ok(()) => Some(path.display().to_string()),
        Err(e) => {
            eprintln!("warning: cannot write replay file {}: {e}", path.display());
            None
        }
    }
}

/// Draw the error heat map (tokens × heads) of a comparison at `path`; the path when drawn.
fn draw_heatmap(path: &Path, backend: &str, case: &Case, c: &Comparison) -> Option<String> {
    let allowance = crate::compare::Tolerance::for_case(case).atol;
    let title = format!("{backend}: abs error by token and head");
    match crate::plot::heat_map(
        path,
        &title,
        &c.err_map,
        case.num_real_tokens(),
        case.config.num_heads,
        allowance,
    ) {
        Ok(()) => Some(path.display().to_string()),
        Err(e) => {
            eprintln!("warning: cannot draw heat map {}: {e}", path.display());
            None
        }
    }
}

impl FailureReport {
    /// The report of a divergence. With `heatmap`, the error heat map is drawn there first
    /// (divergences without values, such as panics, have none).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backend: &str,
        origin: &str,
        case: &Case,
        expected: &[f64],
        d: &Divergence,
        replay: Option<String>,
        shrunk: Option<&Shrunk>,
        heatmap: Option<&Path>,
    ) -> Self {
        let comparison = d.comparison.as_ref();
        let mut r = FailureReport {
            backend: backend.to_string(),
            origin: origin.to_string(),
            kind: d.kind,
            message: d.message.clone(),
            size: CaseSize::of(case),
            replay,
            shrink: shrunk.map(|s| ShrinkInfo {
                steps: s.steps,
                accepted: s.accepted,
                seconds: s.elapsed.as_secs_f64(),
            }),
            first: comparison.and_then(|c| c.first.clone()),
            worst: comparison.and_then(|c| c.worst.clone()),
            hint: comparison.and_then(|c| hint(case, c)),
            heatmap: heatmap
                .zip(comparison)
                .and_then(|(p, c)| draw_heatmap(p, backend, case, c)),
            text: String::new(),
            case: case.clone(),
        };
        r.text = r.render(expected, d);
        r
    }

    fn render(&self, expected: &[f64], d: &Divergence) -> String {
        let case = &self.case;
        let mut s = String::new();
        let shrunk = match &self.shrink {
            Some(sh) => format!(", shrunk in {:.1} s ({} steps)", sh.seconds, sh.steps),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "── {} diverged ({}) on {}{} ──",
            self.backend, self.kind, self.origin, shrunk
        );
        let _ = writeln!(s, "case:    {}", case.shape_summary());
        if let Some(slopes) = &case.config.alibi_slopes {
            let _ = writeln!(s, "alibi:   {slopes:?}");
        }
        if let Some(sinks) = &case.config.sinks {
            let _ = writeln!(s, "sinks:   {sinks:?}");
        }
        let _ = writeln!(
            s,
            "layout:  num_blocks {}, block_table {}, slot_mapping {}",
            case.layout.num_blocks,
            abbreviate(&case.layout.block_table, 8),
            abbreviate_flat(&case.layout.slot_mapping, 16)
        );
        let _ = writeln!(s, "what:    {}", self.message);
        let name = |m: &Mismatch| {
            let (seq, pos) = locate(case, m.token);
            format!(
                "token {} (seq {seq}, position {pos}) head {} (kv head {}) dim {}: expected {:.6}, actual {:.6} (abs {:.3e}, rel {:.3e})",
                m.token,
                m.head,
                case.config.kv_head_of(m.head),
                m.dim,
                m.expected,
                m.actual,
                m.abs_err,
                m.rel_err
            )
        };
        if let Some(m) = &self.first {
            let _ = writeln!(s, "first:   {}", name(m));
        }
        if let Some(m) = &self.worst {
            let _ = writeln!(s, "worst:   {}", name(m));
        }
        if let Some(h) = &self.hint {
            let _ = writeln!(s, "hint:    {h}");
        }
        if let (Some(c), Some(out)) = (&d.comparison, &d.output) {
            let diff = row_diff(case, expected, out, c);
            if !diff.is_empty() {
                let _ = writeln!(
                    s,
                    "diff (- expected, + actual; rows token/head with mismatches):"
                );
                s.push_str(&diff);
            }
        }
        match &self.replay {
            Some(p) => {
                let _ = writeln!(
                    s,
                    "replay:  attn-diff replay {p} --backend {}",
                    self.backend
                );
            }
            None => {
                let _ = writeln!(s, "replay:  (no replay file written)");
            }
        }
        if let Some(p) = &self.heatmap {
            let _ = writeln!(s, "heatmap: {p}");
        }
        s
    }
}

/// (sequence, absolute position) of real token `t`.
pub fn locate(case: &Case, t: usize) -> (usize, usize) {
    let starts = case.query_start_loc();
    let s = (0..case.num_seqs())
        .find(|&s| t < starts[s + 1])
        .unwrap_or(0);
    (s, case.context_len(s) + t - starts[s])
}

fn abbreviate(rows: &[Vec<u32>], max: usize) -> String {
    let shown: Vec<String> = rows
        .iter()
        .take(max)
        .map(|r| format!("[{}]", abbreviate_vec(r, 12).join(", ")))
        .collect();
    let more = if rows.len() > max {
        format!(", … {} more rows", rows.len() - max)
    } else {
        String::new()
    };
    format!("[{}{more}]", shown.join(", "))
}

fn abbreviate_vec(v: &[u32], max: usize) -> Vec<String> {
    let mut out: Vec<String> = v.iter().take(max).map(|x| x.to_string()).collect();
    if v.len() > max {
        out.push(format!("… +{}", v.len() - max));
    }
    out
}

fn abbreviate_flat(v: &[i64], max: usize) -> String {
    let mut out: Vec<String> = v.iter().take(max).map(|x| x.to_string()).collect();
    if v.len() > max {
        out.push(format!("… +{}", v.len() - max));
    }
    format!("[{}]", out.join(", "))
}

/// Rows (token, head) of expected and actual output around mismatches, as a unified diff of
/// fixed-precision text. At most 8 rows; long rows show the 8 dims around the first mismatch.
fn row_diff(case: &Case, expected: &[f64], actual: &[f32], c: &Comparison) -> String {
    let (hq, d) = (case.config.num_heads, case.config.head_size);
    let rows: Vec<usize> = (0..expected.len() / d.max(1))
        .filter(|&r| c.failed[r * d..(r + 1) * d].iter().any(|&f| f))
        .take(8)
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut exp_text = String::new();
    let mut act_text = String::new();
    for &r in &rows {
        let first_bad = (0..d).find(|&i| c.failed[r * d + i]).unwrap_or(0);
        let lo = first_bad.saturating_sub(2).min(d.saturating_sub(8));
        let hi = (lo + 8).min(d);
        let label = format!("t{:<3} h{:<2} [{lo}..{hi}]", r / hq, r % hq);
        let fmt_row = |vals: &mut dyn Iterator<Item = f64>| {
            vals.map(|v| format!("{v:>10.5}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            exp_text,
            "{label} {}",
            fmt_row(&mut expected[r * d + lo..r * d + hi].iter().copied())
        );
        let _ = writeln!(
            act_text,
            "{label} {}",
            fmt_row(&mut actual[r * d + lo..r * d + hi].iter().map(|&x| x as f64))
        );
    }
    let diff = similar::TextDiff::from_lines(&exp_text, &act_text);
    let mut out = String::new();
    for change in diff.iter_all_changes() {
        let sign = match change.tag() {
            similar::ChangeTag::Delete => "-",
            similar::ChangeTag::Insert => "+",
            similar::ChangeTag::Equal => " ",
        };
        let _ = write!(out, "  {sign} {}", change);
    }
    out
}
