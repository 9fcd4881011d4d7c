//! What the bot posts: the markdown reply to a request (per-backend table, each minimal
//! failing case in a collapsed section naming its replay artifact), the usage reply to a
//! comment it cannot parse, and the commit status.
//!
//! Nothing of the comment's own text is echoed but the offending word (and the value in the
//! error message), both inside a fenced block longer than any run of backticks they hold, so
//! no value can close it and become live markdown; a request is shown in its canonical form.

use crate::request::{BotRequest, ParseError, USAGE};
use crate::summary::{BackendSummary, CheckSummary, FailureRecord};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// The commit status context the bot sets.
pub const STATUS_CONTEXT: &str = "attn-diff/bot";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Success,
    Failure,
    Error,
}

/// A commit status as the posting workflow sets it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub state: State,
    pub description: String,
    pub context: String,
}

impl Status {
    fn new(state: State, description: String) -> Status {
        // GitHub cuts a status description at 140 characters.
        let description: String = description.chars().take(140).collect();
        Status {
            state,
            description,
            context: STATUS_CONTEXT.to_string(),
        }
    }
}

/// Where the reply points for files: the artifact holding the replay files, and the run.
#[derive(Clone, Debug, Default)]
pub struct ReplyContext {
    pub replay_artifact: String,
    pub run_url: Option<String>,
}

/// A backend's verdict: a real backend passes by agreeing with the oracle, a mutant by
/// diverging from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Diverged,
    /// No case or trace reached the backend (all declined): it was not tested.
    RanNothing,
    Caught,
    Survived,
}

impl Verdict {
    pub fn of(b: &BackendSummary) -> Verdict {
        match (b.backend.is_mutant(), b.failed() > 0) {
            (false, false) if b.reached() == 0 => Verdict::RanNothing,
            (false, false) => Verdict::Pass,
            (false, true) => Verdict::Diverged,
            (true, true) => Verdict::Caught,
            (true, false) => Verdict::Survived,
        }
    }

    pub fn ok(self) -> bool {
        matches!(self, Verdict::Pass | Verdict::Caught)
    }

    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Diverged => "**DIVERGED**",
            Verdict::RanNothing => "**RAN NOTHING** (every case declined)",
            Verdict::Caught => "caught (mutant)",
            Verdict::Survived => "**SURVIVED** (mutant)",
        }
    }
}

/// Code span holding `s` whatever backticks it contains.
fn code(s: &str) -> String {
    let longest = longest_run(s, '`');
    let ticks = "`".repeat(longest + 1);
    let pad = if s.starts_with('`') || s.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{ticks}{pad}{s}{pad}{ticks}")
}

fn longest_run(s: &str, c: char) -> usize {
    let (mut best, mut run) = (0, 0);
    for x in s.chars() {
        run = if x == c { run + 1 } else { 0 };
        best = best.max(run);
    }
    best
}

/// A fenced block holding `s` whatever fences it contains.
fn fenced(s: &str, lang: &str) -> String {
    let fence = "`".repeat(longest_run(s, '`').max(2) + 1);
    let nl = if s.ends_with('\n') { "" } else { "\n" };
    format!("{fence}{lang}\n{s}{nl}{fence}\n")
}

/// Text for a table cell or a summary line: no pipes, no newlines, no HTML.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
        .replace(['\n', '\r'], " ")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn err(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.2e}")
    }
}

/// The file name of a replay path (its folder is the shard's, not the artifact's).
fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

fn failure_section(f: &FailureRecord, ctx: &ReplyContext) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<details><summary>{}: {} on {} ({} seq, {} tokens, {} heads, head size {})</summary>\n",
        cell(&f.backend),
        cell(&f.kind.to_string()),
        cell(&f.origin.to_string()),
        f.size.sequences,
        f.size.tokens,
        f.size.heads,
        f.size.head_size
    );
    out.push_str(&fenced(&f.text, "text"));
    match &f.replay {
        Some(path) => {
            let name = file_name(path);
            let _ = writeln!(
                out,
                "\nreplay file {} in artifact {}: `attn-diff replay {} --backend {}`",
                code(name),
                code(&ctx.replay_artifact),
                name,
                f.backend
            );
        }
        None => out.push_str("\n(no replay file was written)\n"),
    }
    out.push_str("</details>\n");
    out
}

/// Cases run per coverage bucket, per backend, with the empty buckets named first.
fn coverage_section(report: &attn_results::CoverageReport, s: &CheckSummary) -> String {
    let names: Vec<String> = s.backends.iter().map(|b| b.backend.name.clone()).collect();
    let mut out = String::from("\n<details><summary>Coverage: cases run per bucket</summary>\n\n");
    for l in attn_results::coverage::summary_lines(report, &names) {
        let _ = writeln!(out, "- {}", cell(&l));
    }
    for l in attn_results::coverage::pair_lines(report, &names) {
        let _ = writeln!(out, "- pairs: {}", cell(&l));
    }
    let _ = write!(out, "\n| dimension | bucket |");
    for n in &names {
        let _ = write!(out, " {} |", cell(n));
    }
    let _ = writeln!(out, "\n|---|---|{}", "---|".repeat(names.len()));
    for row in attn_results::coverage::rows(report, &names) {
        let cells: Vec<String> = row.iter().map(|c| cell(c)).collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out.push_str("\n</details>\n");
    out
}

/// Whether the run as a whole is good: every real backend agreed, every mutant was caught.
pub fn all_ok(s: &CheckSummary) -> bool {
    s.backends.iter().all(|b| Verdict::of(b).ok())
}

/// The reply to a request that ran.
pub fn render_reply(req: &BotRequest, s: &CheckSummary, ctx: &ReplyContext) -> String {
    let mut out = String::new();
    let verdict = if all_ok(s) {
        "all passed"
    } else if s.any_divergence() {
        "DIVERGENCE"
    } else {
        "NOTHING TESTED"
    };
    let _ = writeln!(out, "### attn-diff: {verdict}\n");
    let _ = writeln!(out, "{}\n", code(&req.canonical()));
    let upstream_cases = s.upstream.len() / s.backends.len().max(1);
    let _ = writeln!(
        out,
        "{} property case(s){} over {} shard(s), seed {}, and {} upstream case(s) per backend.\n",
        s.cases,
        if s.deep { " (deep)" } else { "" },
        req.shards,
        s.seed,
        upstream_cases
    );
    out.push_str("| backend | verdict | property | upstream | traces | passed | failed | declined | worst abs | worst rel | time |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for b in &s.backends {
        let t = b.total();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1}s |",
            cell(&b.backend.name),
            Verdict::of(b).label(),
            b.property.sent,
            b.upstream.sent,
            b.traces.sent,
            t.passed,
            cell(&b.failed_by_kind()),
            t.declined,
            err(b.worst_abs_err),
            err(b.worst_rel_err),
            b.wall_seconds
        );
    }
    let reasons: Vec<String> = s
        .backends
        .iter()
        .flat_map(|b| {
            b.unsupported.iter().map(move |g| {
                format!(
                    "- {}: {} unsupported: {}",
                    cell(&b.backend.name),
                    g.cases,
                    cell(&g.to_string())
                )
            })
        })
        .collect();
    if !reasons.is_empty() {
        let _ = write!(
            out,
            "\n<details><summary>Unsupported cases by feature</summary>\n\n{}\n</details>\n",
            reasons.join("\n")
        );
    }
    if let Some(report) = &s.coverage {
        out.push_str(&coverage_section(report, s));
    }
    if !s.upstream.is_empty() {
        out.push_str("\n<details><summary>Upstream suite</summary>\n\n");
        out.push_str("| backend | test | spec | heads | max abs | max rel | status |\n|---|---|---|---|---|---|---|\n");
        for u in &s.upstream {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {}/{} | {} | {} | {} |",
                cell(&u.backend),
                cell(&u.test),
                cell(&u.spec),
                u.heads.0,
                u.heads.1,
                err(u.max_abs_err),
                err(u.max_rel_err),
                cell(&u.status.to_string())
            );
        }
        out.push_str("\n</details>\n");
    }
    let failures: Vec<&FailureRecord> = s.backends.iter().flat_map(|b| &b.failures).collect();
    if !failures.is_empty() {
        let _ = writeln!(out, "\n#### Minimal failing cases\n");
        for f in failures {
            out.push_str(&failure_section(f, ctx));
        }
    }
    if let Some(url) = &ctx.run_url {
        let _ = writeln!(out, "\n[workflow run]({url})");
    }
    out
}

/// The commit status of a request that ran.
pub fn status_of(s: &CheckSummary) -> Status {
    let bad: Vec<String> = s
        .backends
        .iter()
        .filter(|b| !Verdict::of(b).ok())
        .map(|b| b.backend.name.clone())
        .collect();
    let cases: usize = s.backends.iter().map(|b| b.reached()).sum();
    if bad.is_empty() {
        Status::new(
            State::Success,
            format!(
                "{} backend(s), {cases} case runs: all passed",
                s.backends.len()
            ),
        )
    } else {
        let what = if s.any_divergence() {
            "diverged"
        } else {
            "ran nothing"
        };
        Status::new(State::Failure, format!("{what}: {}", bad.join(", ")))
    }
}

/// The reply to a comment the bot cannot parse. The message and the word hold the comment's
/// own text, so they go in a fenced block, where mentions, links and HTML are inert.
pub fn render_usage_reply(e: &ParseError) -> String {
    format!(
        "### attn-diff: cannot run this request\n\nNothing was run. The problem, and the word of \
         the comment it is about:\n\n{}\nUsage:\n\n{}",
        fenced(
            &format!("{e}\noffending word: {}", e.offending_word()),
            "text"
        ),
        fenced(USAGE, "text")
    )
}

/// The reply to a request whose commit could not be bound to the comment (the head moved, or
/// `SHA=` is not the head): nothing ran.
pub fn render_unbound_reply(e: &crate::binding::BindError) -> String {
    format!(
        "### attn-diff: not run\n\nNothing was run: the commit to test could not be bound to \
         this comment.\n\n{}",
        fenced(&e.to_string(), "text")
    )
}

/// The reply when the run itself broke (a shard produced no summary, the merge failed).
pub fn render_error_reply(req: &BotRequest, what: &str, ctx: &ReplyContext) -> String {
    let mut out = format!(
        "### attn-diff: the run failed\n\n{}\n\n{}",
        code(&req.canonical()),
        fenced(what, "text")
    );
    if let Some(url) = &ctx.run_url {
        let _ = writeln!(out, "\n[workflow run]({url})");
    }
    out
}

/// The commit status of a run that broke.
pub fn error_status(what: &str) -> Status {
    Status::new(
        State::Error,
        what.lines().next().unwrap_or(what).to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;

    #[test]
    fn code_spans_survive_backticks() {
        assert_eq!(code("a"), "`a`");
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("`x"), "`` `x ``");
        assert_eq!(fenced("```\nx", "text"), "````text\n```\nx\n````\n");
    }

    /// The reply with every fenced block removed, found as CommonMark does: an opening fence
    /// of N backticks is closed only by a line of at least N backticks.
    fn outside_fences(md: &str) -> String {
        let mut out = String::new();
        let mut open: Option<usize> = None;
        for line in md.lines() {
            let ticks = line.chars().take_while(|&c| c == '`').count();
            match open {
                None if ticks >= 3 => open = Some(ticks),
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
                Some(n) if ticks >= n && line.trim_end().len() == ticks => open = None,
                Some(_) => {}
            }
        }
        out
    }

    #[test]
    fn usage_reply_keeps_echoed_values_inside_the_fence() {
        for comment in [
            "bot:test CASES=a`@team`b",
            "bot:test SEED=```@org/team```",
            "bot:test FOO=``````\u{20}@you",
            "bot:test BACKENDS=<img>,[x](http://e.com)",
        ] {
            let r = render_usage_reply(&parse(comment).unwrap_err());
            let outside = outside_fences(&r);
            for live in ["@", "<img", "](", "team"] {
                assert!(
                    !outside.contains(live),
                    "{comment}: {live} outside the fence:\n{r}"
                );
            }
            // The values are shown, inside.
            assert!(r.contains("offending word: "), "{r}");
        }
    }

    #[test]
    fn usage_reply_names_the_word_and_runs_nothing() {
        let e = parse("bot:test CASES=0").unwrap_err();
        let r = render_usage_reply(&e);
        assert!(r.contains("offending word: CASES=0\n"), "{r}");
        assert!(r.contains("CASES=0 is out of range 1..=100000"));
        assert!(r.contains("Nothing was run"));
        assert!(r.contains("BACKENDS=a,b,..."));
    }

    #[test]
    fn cells_cannot_break_the_table_or_inject_html() {
        assert_eq!(cell("a|b\n<img>"), "a\\|b &lt;img&gt;");
    }

    #[test]
    fn statuses_are_short() {
        let s = error_status(&"x".repeat(500));
        assert_eq!(s.description.len(), 140);
        assert_eq!(s.context, "attn-diff/bot");
        assert_eq!(
            serde_json::to_string(&State::Failure).unwrap(),
            "\"failure\""
        );
    }

    #[test]
    fn a_mutant_is_known_by_its_role_not_its_name() {
        use attn_results::{BackendId, BackendRole, Tally};
        let with = |id: BackendId, failed: usize| {
            let mut b = BackendSummary::new(id);
            b.property = Tally {
                sent: 3,
                passed: 3 - failed,
                failed,
                declined: 0,
            };
            b
        };
        let mutant = BackendId::new("window-off-by-one", BackendRole::Mutant);
        assert_eq!(Verdict::of(&with(mutant.clone(), 1)), Verdict::Caught);
        assert_eq!(Verdict::of(&with(mutant, 0)), Verdict::Survived);
        // A backend that happens to be called `mutant:…` is judged as a real one.
        let named = BackendId::new("mutant:x", BackendRole::External);
        assert_eq!(Verdict::of(&with(named.clone(), 1)), Verdict::Diverged);
        assert_eq!(Verdict::of(&with(named, 0)), Verdict::Pass);
    }
}
