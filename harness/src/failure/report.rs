//! A divergence as a person would write it up: the minimal case on one screen, where it
//! diverges, a diff of expected and actual rows around the mismatches, a hint from the
//! error's pattern, and the replay file that reproduces it.

use super::arithmetic::Arithmetic;
use super::exception::Exception;
use super::hint::hint;
use attn_backends::Backend;
use attn_reference::{AttentionConfig, Case};
use attn_results::compare::{Comparison, Divergence};
use attn_results::{CaseSize, FailureClass, FailureRecord, Mismatch, Origin, ShrinkInfo};
use std::collections::BTreeMap;
use std::fmt::Write;

/// What a report needs besides its case and divergence: where its files go (written
/// afterwards, see [`crate::artifacts`], so the report names them without doing I/O) and
/// what the backend adds (its replay line's flag and environment, a caveat).
#[derive(Clone, Debug, Default)]
pub struct FailureContext {
    pub replay: Option<String>,
    /// Only drawn for divergences that have values to draw.
    pub heatmap: Option<String>,
    /// The `--external` flag of an adapter given on the command line, for the replay line.
    pub external: Option<String>,
    /// The environment variables the backend declared, for the replay line.
    pub environment: BTreeMap<String, String>,
    pub caveat: Option<String>,
    /// The verdict policy, when not the default (`--judge ladder`).
    pub judge: Option<attn_reference::Judge>,
}

impl FailureContext {
    /// The backend's part of a report on `config`: its `--external` flag among `flags`, its
    /// declared environment and its caveat.
    pub fn of_backend(backend: &dyn Backend, flags: &[String], config: &AttentionConfig) -> Self {
        FailureContext {
            external: crate::external::flag_for(backend.name(), flags),
            environment: backend.environment(),
            caveat: backend.failure_caveat(config),
            ..FailureContext::default()
        }
    }
}

/// The command that replays `r`, ready to paste: the environment its backend declared, its
/// file, its backend, and the `--external` flag of an adapter given on the command line.
pub fn replay_command(r: &FailureRecord) -> Option<String> {
    let p = r.replay.as_ref()?;
    let quote = |s: &str| shlex::try_quote(s).map_or_else(|_| s.to_string(), |q| q.into_owned());
    let mut cmd: String = r
        .environment
        .iter()
        .map(|(k, v)| format!("{k}={} ", quote(v)))
        .collect();
    cmd.push_str(&format!(
        "attn-diff replay {} --backend {}",
        quote(p),
        quote(&r.backend)
    ));
    if let Some(flag) = &r.external {
        cmd.push_str(&format!(" --external {}", quote(flag)));
    }
    if let Some(j) = &r.judge {
        cmd.push_str(&format!(" --judge {}", j.flag_value()));
    }
    Some(cmd)
}

/// The report of a divergence of `backend` on `case` (its oracle output `expected`).
pub fn failure_record(
    backend: &str,
    origin: &Origin,
    case: &Case,
    expected: &[f64],
    d: &Divergence,
    files: FailureContext,
    shrink: Option<ShrinkInfo>,
) -> FailureRecord {
    let comparison = d.comparison.as_ref();
    let mut r = FailureRecord {
        backend: backend.to_string(),
        origin: origin.clone(),
        kind: d.kind,
        message: d.message.clone(),
        size: CaseSize::of(case),
        replay: files.replay,
        shrink,
        first: comparison.and_then(|c| c.first.clone()),
        worst: comparison.and_then(|c| c.worst.clone()),
        // A rung of the precision ladder that explains the rows names the cause; otherwise
        // the pattern of where the errors are.
        hint: match (comparison, d.output.as_deref()) {
            (Some(c), Some(out)) if d.kind == attn_results::DivergenceKind::Mismatch => {
                Arithmetic::explain(case, out)
                    .map(|a| a.hint())
                    .or_else(|| hint(case, c))
            }
            (c, _) => c.and_then(|c| hint(case, c)),
        },
        heatmap: files.heatmap.filter(|_| comparison.is_some()),
        tolerance: comparison.map(|c| c.tolerance),
        // vLLM's suite is judged by vLLM's tolerance whatever the run's policy.
        judge: files
            .judge
            .filter(|_| !matches!(origin, Origin::Upstream { .. })),
        hint_unshrunk: None,
        also: Vec::new(),
        external: files.external,
        environment: files.environment,
        caveat: files.caveat,
        class: None,
        text: String::new(),
    };
    r.text = render(&r, case, expected, d);
    r
}

/// The first line of a failure report: who diverged, how, on what, and the shrinking.
pub(crate) fn headline(r: &FailureRecord) -> String {
    let shrunk = match &r.shrink {
        Some(sh) if sh.exhausted && sh.steps == 0 => ", not shrunk".to_string(),
        Some(sh) if sh.exhausted => format!(
            ", shrink stopped by its budget after {:.1} s ({} steps): may not be minimal",
            sh.seconds, sh.steps
        ),
        Some(sh) => format!(", shrunk in {:.1} s ({} steps)", sh.seconds, sh.steps),
        None => String::new(),
    };
    // A timeout's shrink says how it was bounded: its tries could each hang.
    let shrunk = match r.shrink.as_ref().and_then(|sh| sh.limits) {
        Some(l) => format!(
            "{shrunk}; a timeout's shrink: each try limited to {:.1} s, {:.0} s in all",
            l.per_try_seconds, l.in_all_seconds
        ),
        None => shrunk,
    };
    format!(
        "── {} diverged ({}) on {}{} ──",
        r.backend, r.kind, r.origin, shrunk
    )
}

/// What diverged: a mismatch's message, or an error's exception first (what was raised,
/// [`Exception`]) with the message it came in (a traceback, a backtrace) kept below.
fn write_what(s: &mut String, r: &FailureRecord) {
    let exception = Exception::of(&r.message);
    if r.tolerance.is_some() || !exception.has_traceback {
        let _ = writeln!(s, "what:    {}", r.message);
        return;
    }
    let _ = writeln!(s, "what:    {}", exception.summary);
    let _ = writeln!(s, "raised:");
    for line in r.message.lines() {
        let _ = writeln!(s, "  | {line}");
    }
}

/// The verdict policy that chose a report's tolerance, in words.
fn policy(r: &FailureRecord) -> String {
    match (&r.origin, &r.judge) {
        (Origin::Upstream { .. }, _) => "vLLM's tolerance, as its backend test".to_string(),
        (_, Some(j)) => j.describe(),
        (_, None) => attn_reference::Judge::Tolerance.describe(),
    }
}

/// `r`'s text as its report prints it; a kind of subject that sets a field of `r` after
/// [`failure_record`] built it (a hint only it can give) renders it again with this.
pub fn render(r: &FailureRecord, case: &Case, expected: &[f64], d: &Divergence) -> String {
    format!("{}\n{}", headline(r), body(r, case, expected, d))
}

/// A failure report below its headline: the case, what diverged, the diff, the files.
pub(crate) fn body(r: &FailureRecord, case: &Case, expected: &[f64], d: &Divergence) -> String {
    let mut s = String::new();
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
    write_what(&mut s, r);
    if let Some(t) = &r.tolerance {
        let _ = writeln!(
            s,
            "tol:     |actual - expected| <= atol {:.3e} or <= rtol {:.1e} × |value| (by {})",
            t.atol,
            t.rtol,
            policy(r)
        );
    }

    let name = |m: &Mismatch| {
        let (seq, pos) = case.locate_token(m.token);
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
    if let Some(m) = &r.first {
        let _ = writeln!(s, "first:   {}", name(m));
    }
    if let Some(m) = &r.worst {
        let _ = writeln!(s, "worst:   {}", name(m));
    }
    if let Some(h) = &r.hint {
        let _ = writeln!(s, "hint:    {h}");
    }
    if let Some(c) = &r.caveat {
        let _ = writeln!(s, "note:    {c}");
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
    match replay_command(r) {
        Some(cmd) => {
            let _ = writeln!(s, "replay:  {cmd}");
        }
        None => {
            let _ = writeln!(s, "replay:  (no replay file written)");
        }
    }
    if let Some(p) = &r.heatmap {
        let _ = writeln!(s, "heatmap: {p}");
    }
    s
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
    let (hq, d) = (case.config.num_heads, case.config.head_size_v());
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
/// The lines a failure's text ends with once the run is over, rendered from its typed
/// fields: the hint of the case as found when shrinking changed it, its class, and the
/// upstream cases that failed the same way.
pub fn finish_text(r: &mut FailureRecord) {
    if let Some(h) = &r.hint_unshrunk {
        let _ = writeln!(r.text, "hint before shrinking: {h}");
    }
    if let Some(line) = r.class.as_ref().map(class_line) {
        r.text.push_str(&line);
    }
    if !r.also.is_empty() {
        let _ = writeln!(
            r.text,
            "also:    the same failure on {} more upstream case(s): {}",
            r.also.len(),
            r.also.join("; ")
        );
    }
}

/// A class's line in its failure's report: how many fell in it, and which.
pub fn class_line(class: &FailureClass) -> String {
    let list = |what: &str, v: &[usize]| {
        let shown: Vec<String> = v.iter().take(20).map(|i| i.to_string()).collect();
        let more = if v.len() > 20 {
            format!(", … ({} in all)", v.len())
        } else {
            String::new()
        };
        format!("{what} {}{more}", shown.join(", "))
    };
    let mut parts = Vec::new();
    if !class.cases.is_empty() {
        parts.push(list("property case(s)", &class.cases));
    }
    if !class.traces.is_empty() {
        parts.push(list("trace(s)", &class.traces));
    }
    if !class.pairs.is_empty() {
        parts.push(list("invariance pair(s)", &class.pairs));
    }
    if !class.upstream.is_empty() {
        parts.push(format!("{} upstream case(s)", class.upstream.len()));
    }
    if !class.recorded.is_empty() {
        parts.push(list("recorded call(s)", &class.recorded));
    }
    format!(
        "class:   {} failure(s) in this class ({}): {}\n",
        class.count(),
        class.signature,
        parts.join("; ")
    )
}
