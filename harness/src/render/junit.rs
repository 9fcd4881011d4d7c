//! A check's summary as JUnit XML, the test-result format CI systems read: one test suite
//! per backend, one test case per part of the run (property cases, upstream suite, traces).
//! A part with divergences has one failing test case per failure class, each carrying its
//! shrunk report; a part that sent
//! cases but reached none, or a backend short of `--min-run`, is a `<failure>` too (nothing
//! tested is not a pass); a part that sent nothing is `<skipped>`.

use attn_results::check::Shortfall;
use attn_results::{BackendSummary, CheckSummary, FailureRecord, RunPart};
use std::fmt::Write;

/// Text as XML 1.0 character data or an attribute value: the five special characters
/// escaped, characters XML 1.0 cannot carry (most C0 controls) dropped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {}
            c => out.push(c),
        }
    }
    out
}

/// A suite's `<properties>`: the policy that judged, and backend `b`'s error figures per
/// dtype (NMSE, the largest error in ulps, the geometric mean and largest multiple of eager
/// attention's error in that dtype).
fn properties(s: &CheckSummary, b: &BackendSummary) -> String {
    let mut props = vec![("judge".to_string(), s.judge.flag_value())];
    for f in &b.figures {
        let d = f.dtype.name();
        if let Some(n) = f.nmse() {
            props.push((format!("{d}.nmse"), format!("{n:.3e}")));
        }
        props.push((format!("{d}.max_ulps"), format!("{:.2}", f.max_ulps)));
        if let Some(m) = f.eager_ratio_mean() {
            props.push((format!("{d}.error_vs_eager_mean"), format!("{m:.3}")));
            props.push((
                format!("{d}.error_vs_eager_max"),
                format!("{:.3}", f.eager_ratio_max),
            ));
        }
    }
    let mut out = String::from("    <properties>\n");
    for (name, value) in props {
        let _ = writeln!(
            out,
            "      <property name=\"{}\" value=\"{}\"/>",
            escape(&name),
            escape(&value)
        );
    }
    out.push_str("    </properties>\n");
    out
}

/// The test cases of `part` on backend `b`: one failing test per failure class, or one test
/// for the part; with how many there are, failed and were skipped.
fn test_cases(b: &BackendSummary, part: RunPart) -> (String, usize, usize, usize) {
    let t = b.tally(part);
    let name = escape(part.label());
    let class = escape(&b.backend.name);
    let own: Vec<&FailureRecord> = b
        .failures
        .iter()
        .filter(|f| f.origin.part() == Some(part))
        .collect();
    if t.failed > 0 && !own.is_empty() {
        let mut out = String::new();
        for (i, f) in own.iter().enumerate() {
            let (signature, count) = f.class.as_ref().map_or((f.kind.to_string(), 1), |c| {
                (c.signature.clone(), c.count())
            });
            let _ = write!(
                out,
                "    <testcase classname=\"{class}\" name=\"{name}: failure {} ({})\" time=\"0\">\n      <failure message=\"{}\" type=\"{}\">{}</failure>\n    </testcase>\n",
                i + 1,
                escape(&signature),
                escape(&format!("{count} failure(s) in this class; in all {} of {} diverged", t.failed, t.sent)),
                escape(&f.kind.to_string()),
                escape(&f.text)
            );
        }
        return (out, own.len(), own.len(), 0);
    }
    let mut out = format!("    <testcase classname=\"{class}\" name=\"{name}\" time=\"0\">\n");
    let (failed, skipped) = if t.failed > 0 {
        let kinds: Vec<String> = b.divergences.keys().map(|k| k.to_string()).collect();
        let _ = writeln!(
            out,
            "      <failure message=\"{}\" type=\"{}\"/>",
            escape(&format!("{} of {} diverged", t.failed, t.sent)),
            escape(&kinds.join(","))
        );
        (true, false)
    } else if t.sent > 0 && t.reached() == 0 {
        let _ = writeln!(
            out,
            "      <failure message=\"{}\" type=\"not tested\"/>",
            escape(&format!(
                "all {} declined: nothing reached the backend",
                t.sent
            ))
        );
        (true, false)
    } else if t.sent == 0 {
        out.push_str("      <skipped message=\"none sent\"/>\n");
        (false, true)
    } else {
        (false, false)
    };
    let _ = write!(
        out,
        "      <system-out>{}</system-out>\n    </testcase>\n",
        escape(&t.describe())
    );
    (out, 1, usize::from(failed), usize::from(skipped))
}

/// The summary as a JUnit XML document; `shortfalls` (from [`CheckSummary::shortfalls`])
/// become a failing test case of the backend they name.
pub fn render(s: &CheckSummary, shortfalls: &[Shortfall]) -> String {
    let mut suites = String::new();
    let (mut tests, mut failures, mut skipped) = (0, 0, 0);
    for b in &s.backends {
        let mut cases = String::new();
        let (mut n, mut f, mut k) = (0, 0, 0);
        for part in RunPart::ALL {
            // Recorded calls are a part only of a run given a recording.
            if part == RunPart::Recorded && b.recorded.is_empty() {
                continue;
            }
            let (text, tests, failed, skip) = test_cases(b, part);
            cases.push_str(&text);
            n += tests;
            f += failed;
            k += skip;
        }
        let own: Vec<&str> = shortfalls
            .iter()
            .filter(|l| l.backend == b.backend.name)
            .map(|l| l.message.as_str())
            .collect();
        if !own.is_empty() {
            let _ = write!(
                cases,
                "    <testcase classname=\"{}\" name=\"enough cases reached it\" time=\"0\">\n      <failure message=\"{}\" type=\"not tested\"/>\n    </testcase>\n",
                escape(&b.backend.name),
                escape(&own.join("; "))
            );
            n += 1;
            f += 1;
        }
        let _ = write!(
            suites,
            "  <testsuite name=\"{}\" tests=\"{n}\" failures=\"{f}\" errors=\"0\" skipped=\"{k}\" time=\"{:.3}\">\n{}{cases}  </testsuite>\n",
            escape(&b.backend.name),
            b.wall_seconds,
            properties(s, b)
        );
        tests += n;
        failures += f;
        skipped += k;
    }
    let time: f64 = s.backends.iter().map(|b| b.wall_seconds).sum();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"attn-diff check (seed {})\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{time:.3}\">\n{suites}</testsuites>",
        s.seed
    )
}
