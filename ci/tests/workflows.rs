//! Checks on the repository's own workflows (`.github/workflows`, `.github/actions`): what the
//! threat model in docs/bot.md relies on, read from the YAML itself so a later edit cannot
//! quietly undo it. A test of its own: nothing here is part of `attn-bot`.
//!
//! The YAML is read by a small parser of the subset the workflows use (block mappings and
//! sequences, plain and quoted scalars, `|` and `>` block scalars, one-line flow sequences
//! and `{}`); anything else is an error, so a construct it does not know fails the tests
//! instead of being misread.

use std::path::{Path, PathBuf};

/// A YAML node.
#[derive(Clone, Debug, PartialEq)]
pub enum Yaml {
    Str(String),
    Seq(Vec<Yaml>),
    Map(Vec<(String, Yaml)>),
}

impl Yaml {
    pub fn get(&self, key: &str) -> Option<&Yaml> {
        match self {
            Yaml::Map(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn str(&self) -> Option<&str> {
        match self {
            Yaml::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn entries(&self) -> &[(String, Yaml)] {
        match self {
            Yaml::Map(m) => m,
            _ => &[],
        }
    }

    pub fn items(&self) -> &[Yaml] {
        match self {
            Yaml::Seq(s) => s,
            _ => &[],
        }
    }
}

struct Line<'a> {
    indent: usize,
    text: &'a str,
    number: usize,
}

struct Parser<'a> {
    raw: Vec<&'a str>,
    /// Lines with content (not blank, not comment-only), in order.
    lines: Vec<Line<'a>>,
    at: usize,
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// `text` without a trailing ` # comment`. Quotes matter only around a whole quoted scalar
/// (an apostrophe inside a plain scalar is just a character).
fn strip_comment(text: &str) -> &str {
    let trimmed = text.trim_start();
    let mut from = 0;
    if let Some(q) = trimmed.chars().next().filter(|c| matches!(c, '"' | '\'')) {
        // Past the closing quote ('' inside single quotes is an escaped quote).
        let bytes = trimmed.as_bytes();
        let mut i = 1;
        while i < bytes.len() {
            if bytes[i] == q as u8 {
                if q == '\'' && bytes.get(i + 1) == Some(&b'\'') {
                    i += 2;
                    continue;
                }
                break;
            }
            i += 1;
        }
        from = (i + 1).min(trimmed.len());
    }
    let bytes = trimmed.as_bytes();
    for i in from..bytes.len() {
        if bytes[i] == b'#' && (i == 0 || bytes[i - 1] == b' ') {
            return trimmed[..i].trim_end();
        }
    }
    trimmed.trim_end()
}

/// Where a `key:` ends in `text`, if it is a mapping entry: a plain or quoted key followed by
/// `:` and a space or the end.
fn key_end(text: &str) -> Option<usize> {
    let key_len = if let Some(q) = text.chars().next().filter(|c| matches!(c, '"' | '\'')) {
        text[1..].find(q)? + 2
    } else {
        text.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
            .unwrap_or(text.len())
    };
    if key_len == 0 {
        return None;
    }
    let rest = &text[key_len..];
    (rest == ":" || rest.starts_with(": ")).then_some(key_len)
}

fn unquote(s: &str) -> Result<String, String> {
    let s = s.trim();
    if let Some(inner) = s.strip_prefix('"') {
        let inner = inner
            .strip_suffix('"')
            .ok_or_else(|| format!("unclosed quote: {s}"))?;
        if inner.contains('\\') {
            return Err(format!("escapes in double quotes are not read: {s}"));
        }
        Ok(inner.to_string())
    } else if let Some(inner) = s.strip_prefix('\'') {
        let inner = inner
            .strip_suffix('\'')
            .ok_or_else(|| format!("unclosed quote: {s}"))?;
        Ok(inner.replace("''", "'"))
    } else {
        Ok(s.to_string())
    }
}

fn scalar(text: &str) -> Result<Yaml, String> {
    let text = text.trim();
    if text == "{}" {
        return Ok(Yaml::Map(Vec::new()));
    }
    if let Some(inner) = text.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| format!("unclosed flow sequence: {text}"))?;
        if inner.contains(['[', '{']) {
            return Err(format!("nested flow collections are not read: {text}"));
        }
        return inner
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| unquote(s).map(Yaml::Str))
            .collect::<Result<_, _>>()
            .map(Yaml::Seq);
    }
    if text.starts_with(['{', '&', '*', '!', '%', '@', '`']) {
        return Err(format!("not read: {text}"));
    }
    unquote(text).map(Yaml::Str)
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Result<Self, String> {
        if text.contains('\t') {
            return Err("tabs are not read".into());
        }
        let raw: Vec<&str> = text.lines().collect();
        let lines = raw
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                let t = l.trim();
                !t.is_empty() && !t.starts_with('#')
            })
            .map(|(i, l)| Line {
                indent: indent_of(l),
                text: l.trim(),
                number: i,
            })
            .collect();
        Ok(Parser { raw, lines, at: 0 })
    }

    fn peek(&self) -> Option<&Line<'a>> {
        self.lines.get(self.at)
    }

    fn error<T>(&self, what: &str) -> Result<T, String> {
        let n = self.peek().map_or(self.raw.len(), |l| l.number + 1);
        Err(format!("line {n}: {what}"))
    }

    fn document(mut self) -> Result<Yaml, String> {
        let doc = self.block(0)?;
        if self.peek().is_some() {
            return self.error("unexpected indentation");
        }
        Ok(doc)
    }

    /// A block node at exactly `indent`.
    fn block(&mut self, indent: usize) -> Result<Yaml, String> {
        match self.peek() {
            Some(l) if l.indent == indent && (l.text == "-" || l.text.starts_with("- ")) => {
                self.sequence(indent)
            }
            Some(l) if l.indent == indent && key_end(l.text).is_some() => {
                let text = l.text;
                self.mapping(indent, text)
            }
            _ => self.error("expected a mapping or a sequence"),
        }
    }

    /// The value after `key:` on a line at `indent` whose text after the colon is `rest`.
    fn value(&mut self, indent: usize, rest: &str) -> Result<Yaml, String> {
        let rest = strip_comment(rest);
        if rest.starts_with(['|', '>']) {
            return self.block_scalar(indent, rest);
        }
        if !rest.is_empty() {
            let v = scalar(rest)?;
            if self.peek().is_some_and(|l| l.indent > indent) {
                return self.error("multi-line plain scalars are not read");
            }
            return Ok(v);
        }
        match self.peek() {
            Some(l) if l.indent > indent => {
                let i = l.indent;
                self.block(i)
            }
            // A sequence may sit at its key's own indentation.
            Some(l) if l.indent == indent && (l.text == "-" || l.text.starts_with("- ")) => {
                self.sequence(indent)
            }
            _ => Ok(Yaml::Str(String::new())),
        }
    }

    fn block_scalar(&mut self, indent: usize, header: &str) -> Result<Yaml, String> {
        let folded = header.starts_with('>');
        if !matches!(&header[1..], "" | "-") {
            return self.error("block scalar headers other than | |- > >- are not read");
        }
        // The raw lines after the header line, while blank or more indented.
        let start = self.lines[self.at - 1].number + 1;
        let mut body: Vec<&str> = Vec::new();
        let mut end = start;
        for (i, l) in self.raw.iter().enumerate().skip(start) {
            if l.trim().is_empty() || indent_of(l) > indent {
                body.push(l);
                end = i + 1;
            } else {
                break;
            }
        }
        while body.last().is_some_and(|l| l.trim().is_empty()) {
            body.pop();
        }
        let strip = body
            .iter()
            .filter(|l| !l.trim().is_empty())
            .map(|l| indent_of(l))
            .min()
            .unwrap_or(0);
        let lines: Vec<&str> = body
            .iter()
            .map(|l| if l.len() >= strip { &l[strip..] } else { "" })
            .collect();
        let text = if folded {
            lines.join(" ")
        } else {
            lines.join("\n")
        };
        while self.peek().is_some_and(|l| l.number < end) {
            self.at += 1;
        }
        Ok(Yaml::Str(text))
    }

    fn mapping(&mut self, indent: usize, first: &'a str) -> Result<Yaml, String> {
        let mut map: Vec<(String, Yaml)> = Vec::new();
        let mut text = first;
        loop {
            let Some(k) = key_end(text) else {
                return self.error("expected `key:`");
            };
            let key = unquote(&text[..k])?;
            if map.iter().any(|(m, _)| *m == key) {
                return self.error(&format!("duplicate key `{key}`"));
            }
            self.at += 1;
            let v = self.value(indent, &text[k + 1..])?;
            map.push((key, v));
            match self.peek() {
                Some(l) if l.indent == indent && !(l.text == "-" || l.text.starts_with("- ")) => {
                    text = l.text;
                }
                Some(l) if l.indent > indent => return self.error("unexpected indentation"),
                _ => return Ok(Yaml::Map(map)),
            }
        }
    }

    fn sequence(&mut self, indent: usize) -> Result<Yaml, String> {
        let mut items = Vec::new();
        while let Some(l) = self.peek() {
            if l.indent != indent || !(l.text == "-" || l.text.starts_with("- ")) {
                break;
            }
            let content = l.text[1..].trim_start();
            let inner = indent + (l.text.len() - content.len());
            if content.is_empty() {
                self.at += 1;
                match self.peek() {
                    Some(n) if n.indent > indent => {
                        let i = n.indent;
                        items.push(self.block(i)?);
                    }
                    _ => items.push(Yaml::Str(String::new())),
                }
            } else if key_end(content).is_some() {
                // `- key: value` opens a mapping at the content's column.
                items.push(self.mapping(inner, content)?);
            } else {
                self.at += 1;
                items.push(scalar(strip_comment(content))?);
                if self.peek().is_some_and(|n| n.indent > indent) {
                    return self.error("multi-line plain scalars are not read");
                }
            }
        }
        Ok(Yaml::Seq(items))
    }
}

/// Parse the YAML subset the workflows use.
pub fn parse(text: &str) -> Result<Yaml, String> {
    Parser::new(text)?.document()
}

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The release of actions/download-artifact every workflow pins: v8.0.1 bundles
    /// unzip-stream 0.3.4, which turns every `..` component into `.` (0.3.1, in v4.3.0 to
    /// v6.0.0, stripped only a leading `../`).
    const DOWNLOAD_ARTIFACT: &str =
        "actions/download-artifact@3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c";
    struct File {
        path: String,
        raw: String,
        yaml: Yaml,
    }

    fn read(rel: &str) -> File {
        let raw = std::fs::read_to_string(root().join(rel)).unwrap();
        let yaml = parse(&raw).unwrap_or_else(|e| panic!("{rel}: {e}"));
        File {
            path: rel.to_string(),
            raw,
            yaml,
        }
    }

    fn workflows() -> Vec<File> {
        let mut names: Vec<String> = std::fs::read_dir(root().join(".github/workflows"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yml") || n.ends_with(".yaml"))
            .collect();
        names.sort();
        assert!(names.len() >= 5, "{names:?}");
        names
            .iter()
            .map(|n| read(&format!(".github/workflows/{n}")))
            .collect()
    }

    /// `${{ inputs.NAME }}` in every string of `y`, replaced by its value in `inputs`.
    fn substitute(y: &Yaml, inputs: &[(String, String)]) -> Yaml {
        match y {
            Yaml::Str(s) => {
                let mut s = s.clone();
                for (name, value) in inputs {
                    s = s.replace(&format!("${{{{ inputs.{name} }}}}"), value);
                }
                Yaml::Str(s)
            }
            Yaml::Seq(items) => Yaml::Seq(items.iter().map(|i| substitute(i, inputs)).collect()),
            Yaml::Map(m) => Yaml::Map(
                m.iter()
                    .map(|(k, v)| (k.clone(), substitute(v, inputs)))
                    .collect(),
            ),
        }
    }

    /// A step as it runs: a local composite action's steps stand in for the step using it,
    /// with its inputs (the step's `with`, else the action's defaults) filled in.
    fn expand(step: &Yaml) -> Vec<Yaml> {
        match step.get("uses").and_then(Yaml::str) {
            Some(local) if local.starts_with("./") => {
                let action = read(&format!("{}/action.yml", &local[2..]));
                let inputs: Vec<(String, String)> = action
                    .yaml
                    .get("inputs")
                    .map(Yaml::entries)
                    .unwrap_or_default()
                    .iter()
                    .map(|(name, spec)| {
                        let given = with(step, name)
                            .or_else(|| spec.get("default").and_then(Yaml::str))
                            .unwrap_or_default();
                        (name.clone(), given.to_string())
                    })
                    .collect();
                let steps = action
                    .yaml
                    .get("runs")
                    .and_then(|r| r.get("steps"))
                    .unwrap_or_else(|| panic!("{local}: no steps"));
                steps
                    .items()
                    .iter()
                    .flat_map(expand)
                    .map(|s| substitute(&s, &inputs))
                    .collect()
            }
            _ => vec![step.clone()],
        }
    }

    /// The events a workflow runs on: the keys of its `on:` (or its one event, or its list).
    fn triggers(f: &File) -> Vec<String> {
        match f.yaml.get("on") {
            Some(Yaml::Str(s)) => vec![s.clone()],
            Some(Yaml::Seq(items)) => items
                .iter()
                .filter_map(Yaml::str)
                .map(String::from)
                .collect(),
            Some(Yaml::Map(m)) => m.iter().map(|(k, _)| k.clone()).collect(),
            None => panic!("{}: no `on:`", f.path),
        }
    }

    struct Job {
        file: String,
        id: String,
        /// Its steps, local actions expanded.
        steps: Vec<Yaml>,
    }

    /// Every job of every workflow.
    fn jobs() -> Vec<Job> {
        let mut out = Vec::new();
        for f in workflows() {
            for (id, job) in f.yaml.get("jobs").unwrap().entries() {
                let steps = job
                    .get("steps")
                    .map(|s| s.items().iter().flat_map(expand).collect())
                    .unwrap_or_default();
                out.push(Job {
                    file: f.path.clone(),
                    id: id.clone(),
                    steps,
                });
            }
        }
        out
    }

    fn uses(step: &Yaml) -> &str {
        step.get("uses").and_then(Yaml::str).unwrap_or("")
    }

    fn with<'a>(step: &'a Yaml, key: &str) -> Option<&'a str> {
        step.get("with")
            .and_then(|w| w.get(key))
            .and_then(Yaml::str)
    }

    /// An action's name without its revision.
    fn action_name(step: &Yaml) -> &str {
        uses(step).split('@').next().unwrap_or("")
    }

    /// A step's `if:`, without `${{ }}` around it.
    fn condition(step: &Yaml) -> String {
        let c = step.get("if").and_then(Yaml::str).unwrap_or("").trim();
        c.strip_prefix("${{")
            .and_then(|c| c.strip_suffix("}}"))
            .unwrap_or(c)
            .trim()
            .to_string()
    }

    /// Whether a condition holds only in runs for `event`: `github.event_name == 'EVENT'`,
    /// alone or and-ed with more, and no `||` anywhere that could widen it.
    fn only_on(condition: &str, event: &str) -> bool {
        let want = format!("github.event_name == '{event}'");
        !condition.contains("||") && condition.split("&&").any(|c| c.trim() == want)
    }

    #[test]
    fn the_parser_reads_what_the_workflows_use() {
        let y = parse(
            "a: 1 # note\nb:\n  - x\n  - k: v\n    l: 'q''s'\nc: [1, \"2\"]\nd: {}\ne: |\n  one\n\n  two\nf: >-\n  x\n  y\ng:\n- s\n",
        )
        .unwrap();
        assert_eq!(y.get("a"), Some(&Yaml::Str("1".into())));
        assert_eq!(
            y.get("b").unwrap().items()[1].get("l").unwrap().str(),
            Some("q's")
        );
        assert_eq!(
            y.get("c"),
            Some(&Yaml::Seq(vec![
                Yaml::Str("1".into()),
                Yaml::Str("2".into())
            ]))
        );
        assert_eq!(y.get("d"), Some(&Yaml::Map(vec![])));
        assert_eq!(y.get("e").unwrap().str(), Some("one\n\ntwo"));
        assert_eq!(y.get("f").unwrap().str(), Some("x y"));
        assert_eq!(y.get("g").unwrap().items().len(), 1);
        // What it does not know is an error, not a guess.
        for bad in [
            "a: &x 1\n",
            "a: b\n  c\n",
            "a: 1\na: 2\n",
            "a:\n\tb: 1\n",
            "a: [[1]]\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        for f in workflows() {
            assert!(f.yaml.get("jobs").is_some(), "{}", f.path);
        }
    }

    #[test]
    fn the_parser_reads_conditions_and_triggers() {
        assert!(only_on(
            "github.event_name == 'pull_request'",
            "pull_request"
        ));
        assert!(only_on(
            "github.event_name == 'push' && matrix.partition == 1",
            "push"
        ));
        for widened in [
            "",
            "always()",
            "github.event_name != 'pull_request'",
            "github.event_name == 'pull_request' || always()",
            "github.event_name == 'pull_request_target'",
            "!(github.event_name == 'pull_request')",
            "github.event_name == 'push'",
        ] {
            assert!(!only_on(widened, "pull_request"), "{widened}");
        }
        let step = parse("if: ${{ github.event_name == 'push' }}\nuses: a/b@c\n").unwrap();
        assert_eq!(condition(&step), "github.event_name == 'push'");
        assert_eq!(action_name(&step), "a/b");
        let ci = read(".github/workflows/ci.yml");
        assert_eq!(triggers(&ci), ["push", "pull_request"]);
        // The set-up action's steps stand in for the step using it.
        let clippy = jobs()
            .into_iter()
            .find(|j| j.file.ends_with("/ci.yml") && j.id == "clippy")
            .unwrap();
        assert!(
            clippy
                .steps
                .iter()
                .any(|s| s.get("run").and_then(Yaml::str) == Some("cargo xtask setup")),
            "{:?}",
            clippy.steps
        );
        let step = parse("uses: ./.github/actions/setup\nwith:\n  x: '1'\n").unwrap();
        assert!(expand(&step).len() > 1);
        let inputs = [("name".to_string(), "v".to_string())];
        assert_eq!(
            substitute(&Yaml::Str("a-${{ inputs.name }}".into()), &inputs),
            Yaml::Str("a-v".into())
        );
    }

    #[test]
    fn no_job_restores_or_saves_a_cache() {
        // Pull-request code run by the bot (an `issue_comment` run, in the default branch's
        // cache scope) can write any key there with the run's cache token, a key a later push
        // would compute among them (the next Cargo.lock's hash): that push's save then fails
        // and every run restoring the key extracts the entry with `tar -P`, anywhere. So no job
        // restores a cache, trusted or not, and none saves one: no `actions/cache` of any kind,
        // no action's own `cache:` input, in any workflow or local action.
        let mut files = workflows();
        files.push(read(".github/actions/setup/action.yml"));
        for f in &files {
            for line in f.raw.lines() {
                let t = strip_comment(line).trim_start_matches("- ");
                assert!(!t.contains("actions/cache"), "{}: {line}", f.path);
                assert!(!t.starts_with("cache"), "{}: {line}", f.path);
            }
        }
        let mut steps = 0;
        for job in jobs() {
            for s in &job.steps {
                steps += 1;
                assert!(!action_name(s).contains("cache"), "{} {}", job.file, job.id);
                let inputs = s.get("with").map(Yaml::entries).unwrap_or_default();
                assert!(
                    inputs.iter().all(|(k, _)| !k.contains("cache")),
                    "{} {}: {s:?}",
                    job.file,
                    job.id
                );
            }
        }
        assert!(steps >= 40, "{steps}");
    }

    #[test]
    fn no_workflow_has_a_concurrency_group() {
        // Concurrency groups are shared by every workflow of the repository, and a fork's own
        // `pull_request` workflow can name any group with `cancel-in-progress: true`: the
        // poster's `bot-post-<run id>` (ids are public), another pull request's bot run, or
        // main's push CI. No workflow or job here joins one, so none can be cancelled so.
        for f in workflows() {
            assert!(f.yaml.get("concurrency").is_none(), "{}", f.path);
            for (id, job) in f.yaml.get("jobs").unwrap().entries() {
                assert!(job.get("concurrency").is_none(), "{} {id}", f.path);
            }
            for line in f.raw.lines() {
                let code = strip_comment(line);
                assert!(!code.contains("cancel-in-progress"), "{}: {line}", f.path);
                assert!(!code.contains("concurrency:"), "{}: {line}", f.path);
            }
        }
    }

    #[test]
    fn no_run_script_interpolates_an_expression() {
        // `${{ }}` in a `run:` script is pasted into the script before the shell reads it: a
        // value with a quote or `$(...)` in it (a branch name, a comment, an output of
        // pull-request code) would run as code. Values reach scripts through `env:`.
        let mut scripts = 0;
        for job in jobs() {
            for s in &job.steps {
                assert_ne!(
                    action_name(s),
                    "actions/github-script",
                    "{} {}",
                    job.file,
                    job.id
                );
                if let Some(run) = s.get("run").and_then(Yaml::str) {
                    scripts += 1;
                    assert!(!run.contains("${{"), "{} {}: {run}", job.file, job.id);
                }
            }
        }
        assert!(scripts >= 20, "{scripts}");
    }

    #[test]
    fn actions_are_pinned_and_download_artifact_extracts_safely() {
        let mut files = workflows();
        files.push(read(".github/actions/setup/action.yml"));
        let mut downloads = 0;
        for f in &files {
            for line in f.raw.lines() {
                let t = line.trim().trim_start_matches("- ");
                let Some(action) = t.strip_prefix("uses: ") else {
                    continue;
                };
                let action = strip_comment(action);
                if action.starts_with("./") {
                    continue;
                }
                let (name, rev) = action.split_once('@').unwrap_or((action, ""));
                assert!(
                    rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{}: {action} is not pinned to a commit",
                    f.path
                );
                assert!(
                    line.contains(" # "),
                    "{}: {action} has no version comment",
                    f.path
                );
                if name == "actions/download-artifact" {
                    downloads += 1;
                    assert_eq!(action, DOWNLOAD_ARTIFACT, "{}", f.path);
                    assert!(line.ends_with("# v8.0.1"), "{line}");
                }
            }
        }
        assert!(downloads >= 5, "{downloads}");
    }

    #[test]
    fn the_poster_downloads_zips_last_into_its_own_folders_and_runs_its_own_binary() {
        let post = read(".github/workflows/bot-post.yml");
        let steps = post
            .yaml
            .get("jobs")
            .unwrap()
            .get("post")
            .unwrap()
            .get("steps")
            .unwrap();
        let steps = steps.items();
        let build = steps
            .iter()
            .position(|s| {
                s.get("run")
                    .and_then(Yaml::str)
                    .is_some_and(|r| r.contains("cargo build"))
            })
            .expect("the poster builds attn-bot");
        let run = steps[build].get("run").unwrap().str().unwrap();
        assert!(
            run.contains("--locked") && run.contains("--target-dir \"$RUNNER_TEMP/"),
            "{run}"
        );
        let downloads: Vec<usize> = steps
            .iter()
            .enumerate()
            .filter(|(_, s)| uses(s).starts_with("actions/download-artifact@"))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(downloads.len(), 2);
        assert!(
            downloads.iter().all(|&i| i > build),
            "built before any download"
        );
        for &i in &downloads {
            let s = &steps[i];
            assert_eq!(with(s, "skip-decompress"), Some("true"), "{s:?}");
            assert_eq!(with(s, "digest-mismatch"), Some("error"), "{s:?}");
            let path = with(s, "path").unwrap();
            assert!(
                path.starts_with("${{ runner.temp }}/bot-download/"),
                "{path}"
            );
        }
        // The result (pull-request data) is downloaded last.
        let last = *downloads.last().unwrap();
        assert_eq!(
            with(&steps[last], "artifact-ids"),
            Some("${{ steps.select.outputs.result-id }}")
        );
        assert!(
            steps[last + 1..]
                .iter()
                .all(|s| !uses(s).starts_with("actions/")),
            "nothing but attn-bot and gh after it"
        );
        // attn-bot runs from $RUNNER_TEMP, checked against its sha256, never from target/.
        for s in steps {
            let Some(run) = s.get("run").and_then(Yaml::str) else {
                continue;
            };
            assert!(!run.contains("target/debug"), "{run}");
            if run.contains("\"$bot\"") {
                assert!(run.contains("sha256sum --check"), "{run}");
            }
            assert!(
                !run.contains("bot-result/") && !run.contains("bot-request/"),
                "{run}"
            );
        }
    }

    /// Each cargo command in a script: its logical lines (continuations joined), from each
    /// `cargo` that starts a command to the end of that command.
    fn cargo_commands(script: &str) -> Vec<String> {
        let joined = script.replace("\\\n", " ");
        let mut out = Vec::new();
        for line in joined.lines() {
            let line = line.trim();
            for (at, _) in line.match_indices("cargo ") {
                let before = line[..at].trim_end();
                let starts = before.is_empty()
                    || ["&&", "||", ";", "|", "$(", "!", "then", "do"]
                        .iter()
                        .any(|p| before.ends_with(p));
                if starts {
                    let rest = &line[at..];
                    let end = ["&&", "||", ";", "|"]
                        .iter()
                        .filter_map(|p| rest.find(p))
                        .min()
                        .unwrap_or(rest.len());
                    out.push(rest[..end].trim().to_string());
                }
            }
        }
        out
    }

    #[test]
    fn every_cargo_invocation_is_locked() {
        assert_eq!(
            cargo_commands("code=0\ncargo run --locked \\\n  -p x || code=$?\ncargo xtask lint"),
            ["cargo run --locked    -p x", "cargo xtask lint"]
        );
        // The alias runs xtask with the locked dependencies; that check covers the whole
        // workspace's Cargo.lock, which the commands xtask runs in the same checkout use.
        let config = std::fs::read_to_string(root().join(".cargo/config.toml")).unwrap();
        let alias = config
            .lines()
            .find(|l| l.starts_with("xtask = "))
            .expect("the xtask alias");
        assert!(alias.contains("run --locked "), "{alias}");
        let lint = std::fs::read_to_string(root().join("xtask/src/lint.rs")).unwrap();
        assert!(
            lint.contains("\"clippy\",\n                \"--locked\","),
            "xtask's clippy is locked"
        );
        let mut commands = 0;
        for job in jobs() {
            for s in &job.steps {
                let Some(run) = s.get("run").and_then(Yaml::str) else {
                    continue;
                };
                for c in cargo_commands(run) {
                    commands += 1;
                    let sub = c.split_whitespace().nth(1).unwrap_or("");
                    // `cargo fmt` resolves nothing and takes no --locked.
                    let ok = matches!(sub, "xtask" | "fmt") || c.contains(" --locked");
                    assert!(ok, "{} {}: {c}", job.file, job.id);
                }
            }
        }
        assert!(commands >= 10, "{commands}");
    }

    #[test]
    fn the_comment_is_not_in_the_environment_and_the_head_is_read_first() {
        for f in workflows() {
            for line in f.raw.lines() {
                let t = line.trim();
                // In the environment, a comment over 128 KiB stops the step from starting.
                if t.contains("github.event.comment.body") {
                    assert!(
                        t.trim_start_matches("- ").starts_with("startsWith("),
                        "{}: {t}",
                        f.path
                    );
                }
            }
        }
        let bot = read(".github/workflows/bot.yml");
        let plan = bot.yaml.get("jobs").unwrap().get("plan").unwrap();
        let filter = plan.get("if").unwrap().str().unwrap();
        assert!(
            filter.contains("startsWith(github.event.comment.body, 'bot:test')"),
            "{filter}"
        );
        let steps = plan.get("steps").unwrap().items();
        // The head is read before anything is installed.
        assert_eq!(steps[0].get("id").and_then(Yaml::str), Some("head"));
        let parse = steps
            .iter()
            .find(|s| s.get("id").and_then(Yaml::str) == Some("plan"))
            .unwrap();
        let run = parse.get("run").unwrap().str().unwrap();
        assert!(run.contains("--event \"$GITHUB_EVENT_PATH\""), "{run}");
        // Without SHA=, the head is bound only when its branch is in this repository or an
        // allow-listed owner's: the plan is told where the branch is, by the pulls API read
        // first, not who opened the pull request.
        assert!(
            run.contains("--repo \"$REPO\" --head-repo \"$HEAD_REPO\""),
            "{run}"
        );
        assert!(!run.contains("--pr-author"), "{run}");
        let env = |k: &str| parse.get("env").and_then(|e| e.get(k)).and_then(Yaml::str);
        assert_eq!(env("REPO"), Some("${{ github.repository }}"));
        assert_eq!(
            env("HEAD_REPO"),
            Some("${{ steps.head.outputs.head-repo }}")
        );
        let head = steps[0].get("run").unwrap().str().unwrap();
        assert!(head.contains(".head.repo.full_name // \"-\""), "{head}");
        assert!(head.contains("echo \"head-repo=$head_repo\""), "{head}");
        assert!(!bot.raw.contains("issue.user.login"));
    }

    /// The logins of `contains(fromJSON('[...]'), WHO)` in a condition, lower-cased and
    /// sorted; `None` when the condition has no such test.
    fn listed_logins(condition: &str, who: &str) -> Option<Vec<String>> {
        let end = format!("]'), {who})");
        let stop = condition.find(&end)?;
        let start = condition[..stop].rfind("contains(fromJSON('[")? + "contains(fromJSON('".len();
        let list: Vec<String> = serde_json::from_str(&condition[start..=stop]).ok()?;
        let mut list: Vec<String> = list.iter().map(|l| l.to_ascii_lowercase()).collect();
        list.sort();
        Some(list)
    }

    #[test]
    fn the_allow_list_is_checked_before_anything_builds() {
        // An owner, member or collaborator off the allow-list (a read-only collaborator, any
        // organisation member) must not start a plan build, a poster build and a refusal per
        // comment: the jobs' own conditions hold the allow-list's logins, so GitHub skips them.
        assert_eq!(
            listed_logins(
                "a && contains(fromJSON('[\"Bob\", \"al\"]'), x.login)",
                "x.login"
            ),
            Some(vec!["al".to_string(), "bob".to_string()])
        );
        assert_eq!(listed_logins("contains(fromJSON('[]'), y)", "x"), None);
        let text = std::fs::read_to_string(root().join(".github/bot-allowlist.txt")).unwrap();
        let list = attn_ci::allowlist::AllowList::parse(&text).unwrap();
        let mut want = list.logins().to_vec();
        want.sort();
        for (file, job, who) in [
            ("bot.yml", "plan", "github.event.comment.user.login"),
            (
                "bot-post.yml",
                "post",
                "github.event.workflow_run.actor.login",
            ),
        ] {
            let f = read(&format!(".github/workflows/{file}"));
            let job = f.yaml.get("jobs").unwrap().get(job).unwrap();
            let condition = job.get("if").and_then(Yaml::str).unwrap();
            assert!(!condition.contains("||"), "{file}: {condition}");
            assert_eq!(
                listed_logins(condition, who).as_ref(),
                Some(&want),
                "{file}: the job's condition must list exactly .github/bot-allowlist.txt's logins: {condition}"
            );
            assert!(
                condition
                    .split("&&")
                    .any(|c| c.trim().starts_with("contains(fromJSON('[")
                        && c.trim().ends_with(&format!("'), {who})"))),
                "{file}: and-ed, not inside another test: {condition}"
            );
        }
    }

    #[test]
    fn a_bot_run_cannot_fail_the_default_branchs_checks() {
        // An `issue_comment` run belongs to the default branch's latest commit: its jobs are
        // check runs there. Unless the caller allows it (nightly, on its own commit), no step
        // of the sharded run can fail its job, the pull request's code runs under step
        // timeouts below its job's, and its output's workflow commands are not processed.
        let f = read(".github/workflows/attn-diff-sharded.yml");
        let input = f
            .yaml
            .get("on")
            .and_then(|o| o.get("workflow_call"))
            .and_then(|w| w.get("inputs"))
            .and_then(|i| i.get("may-fail"))
            .expect("a may-fail input");
        assert_eq!(input.get("type").and_then(Yaml::str), Some("boolean"));
        assert_eq!(input.get("default").and_then(Yaml::str), Some("false"));
        let mut runs_pr_code = 0;
        for (id, job) in f.yaml.get("jobs").unwrap().entries() {
            let job_minutes: u32 = job
                .get("timeout-minutes")
                .and_then(Yaml::str)
                .unwrap()
                .parse()
                .unwrap();
            let mut step_minutes = 0;
            for s in job.get("steps").unwrap().items() {
                let may_fail_only = condition(s) == "inputs.may-fail";
                let continues = s.get("continue-on-error").and_then(Yaml::str)
                    == Some("${{ !inputs.may-fail }}");
                assert!(
                    may_fail_only || continues,
                    "{id}: a step that can fail a bot run's job: {s:?}"
                );
                if let Some(run) = s.get("run").and_then(Yaml::str) {
                    if run.contains("cargo ") {
                        runs_pr_code += 1;
                        assert!(
                            run.starts_with("echo \"::stop-commands::$(openssl rand -hex 16)\"\n"),
                            "{id}: {run}"
                        );
                        assert!(
                            !run.lines().skip(1).any(|l| l.contains("echo \"::")),
                            "{id}: commands resumed? {run}"
                        );
                        let minutes: u32 = s
                            .get("timeout-minutes")
                            .and_then(Yaml::str)
                            .unwrap_or_else(|| panic!("{id}: no step timeout: {run}"))
                            .parse()
                            .unwrap();
                        step_minutes += minutes;
                    }
                }
            }
            assert!(
                step_minutes + 10 <= job_minutes,
                "{id}: {step_minutes} of {job_minutes}"
            );
        }
        assert_eq!(runs_pr_code, 3);
        // The bot's call leaves `may-fail` at its default; the nightly run sets it.
        let with_of = |file: &str| {
            let f = read(file);
            f.yaml
                .get("jobs")
                .unwrap()
                .get("run")
                .unwrap()
                .get("with")
                .cloned()
                .unwrap()
        };
        assert_eq!(with_of(".github/workflows/bot.yml").get("may-fail"), None);
        assert_eq!(
            with_of(".github/workflows/nightly.yml")
                .get("may-fail")
                .and_then(Yaml::str),
            Some("true")
        );
    }

    #[test]
    fn trusted_jobs_use_a_pinned_toolchain_and_lint_tools_are_checked() {
        // The jobs whose output is trusted (the bot's plan and poster, the nightly plan) build
        // with one fixed toolchain, not whatever `stable` is on the day.
        let mut pins = Vec::new();
        for (file, job) in [
            ("bot.yml", "plan"),
            ("bot-post.yml", "post"),
            ("nightly.yml", "plan"),
        ] {
            let f = read(&format!(".github/workflows/{file}"));
            let steps = f.yaml.get("jobs").unwrap().get(job).unwrap().get("steps");
            let toolchains: Vec<&str> = steps
                .unwrap()
                .items()
                .iter()
                .filter(|s| action_name(s) == "dtolnay/rust-toolchain")
                .map(|s| with(s, "toolchain").unwrap_or(""))
                .collect();
            assert_eq!(toolchains.len(), 1, "{file} {job}");
            let t = toolchains[0];
            let parts: Vec<&str> = t.split('.').collect();
            assert!(
                parts.len() == 3
                    && parts
                        .iter()
                        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())),
                "{file} {job}: toolchain `{t}` is not a pinned release"
            );
            pins.push(t.to_string());
        }
        pins.dedup();
        assert_eq!(pins.len(), 1, "one pinned toolchain: {pins:?}");
        // CI's actionlint is the release binary, checked by sha256 before it is put on PATH.
        let ci = read(".github/workflows/ci.yml");
        let steps = ci.yaml.get("jobs").unwrap().get("actionlint").unwrap();
        let steps = steps.get("steps").unwrap().items();
        let fetch = steps
            .iter()
            .position(|s| {
                s.get("run")
                    .and_then(Yaml::str)
                    .is_some_and(|r| r.contains("actionlint.tar.gz"))
            })
            .expect("the actionlint download");
        let run = steps[fetch].get("run").and_then(Yaml::str).unwrap();
        let check = run.find("sha256sum --check").expect("checked");
        assert!(check < run.find("tar -xzf").unwrap(), "{run}");
        assert!(check < run.find("GITHUB_PATH").unwrap(), "{run}");
        let sha = steps[fetch]
            .get("env")
            .and_then(|e| e.get("SHA256"))
            .and_then(Yaml::str)
            .unwrap();
        assert!(sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()));
        let lint = steps
            .iter()
            .position(|s| s.get("run").and_then(Yaml::str) == Some("cargo xtask lint actionlint"))
            .unwrap();
        assert!(fetch < lint);
    }

    #[test]
    fn a_failed_download_is_answered_not_met_with_silence() {
        // The pull request's code can upload a `bot-result` whose digest or size is not what
        // GitHub recorded; download-artifact then fails. The job goes on, and attn-bot is told
        // how each download ended, so it answers with its fixed refusal.
        let post = read(".github/workflows/bot-post.yml");
        let steps = post.yaml.get("jobs").unwrap().get("post").unwrap();
        let steps = steps.get("steps").unwrap().items();
        let by_id = |id: &str| {
            steps
                .iter()
                .find(|s| s.get("id").and_then(Yaml::str) == Some(id))
                .unwrap_or_else(|| panic!("no step {id}"))
        };
        for (id, env, arg) in [
            ("request", "REQUEST_DOWNLOAD", "--request-download"),
            ("result", "RESULT_DOWNLOAD", "--result-download"),
        ] {
            let s = by_id(id);
            assert!(uses(s).starts_with("actions/download-artifact@"), "{id}");
            assert_eq!(
                s.get("continue-on-error").and_then(Yaml::str),
                Some("true"),
                "{id}"
            );
            let p = by_id("post");
            assert_eq!(
                p.get("env").and_then(|e| e.get(env)).and_then(Yaml::str),
                Some(format!("${{{{ steps.{id}.outcome }}}}").as_str()),
                "{id}"
            );
            let run = p.get("run").and_then(Yaml::str).unwrap();
            assert!(run.contains(&format!("{arg} \"${env}\"")), "{run}");
        }
        // The answering step itself runs whenever the job gets to it, and nothing between the
        // downloads and it can fail on what they wrote.
        assert!(by_id("post").get("if").is_none());
        let downloads = steps
            .iter()
            .filter(|s| uses(s).starts_with("actions/download-artifact@"))
            .count();
        assert_eq!(downloads, 2);
        // attn-bot takes the outcomes (it refuses a command line without them).
        let args: Vec<String> = [
            "post",
            "--title",
            "t",
            "--jobs",
            "j",
            "--artifacts",
            "a",
            "--comment",
            "c",
            "--commits",
            "c",
            "--allowlist",
            "l",
            "--actor",
            "x",
            "--run-created-at",
            "t",
            "--run-url",
            "u",
            "--conclusion",
            "success",
            "--out",
            "o",
            "--request-download",
            "failure",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert!(attn_ci::cli::parse_args(&args, None).is_err());
        let mut all = args.clone();
        all.extend(["--result-download".to_string(), "failure".to_string()]);
        assert!(attn_ci::cli::parse_args(&all, None).is_ok());
    }

    #[test]
    fn the_poster_reads_the_pull_request_and_comment_from_the_runs_title() {
        let bot = read(".github/workflows/bot.yml");
        let title = bot.yaml.get("run-name").and_then(Yaml::str).unwrap();
        let rendered = title
            .replace("${{ github.event.comment.id }}", "77")
            .replace("${{ github.event.issue.number }}", "5");
        assert_eq!(rendered, attn_ci::answer::run_title(5, 77));
        let post = read(".github/workflows/bot-post.yml");
        let job = post.yaml.get("jobs").unwrap().get("post").unwrap();
        // Only a run of the comment workflow: `issue_comment` runs use the default branch's
        // workflows, so its title is bot.yml's; a fork's own `pull_request` workflow named
        // `bot` could title its run anything.
        let only = job.get("if").and_then(Yaml::str).unwrap();
        assert!(
            only.starts_with("github.event.workflow_run.event == 'issue_comment' &&")
                && !only.contains("||"),
            "{only}"
        );
        let steps = job.get("steps").unwrap().items();
        let step = |id: &str| {
            steps
                .iter()
                .find(|s| s.get("id").and_then(Yaml::str) == Some(id))
                .unwrap_or_else(|| panic!("no step {id}"))
        };
        for id in ["select", "post"] {
            let s = step(id);
            assert_eq!(
                s.get("env")
                    .and_then(|e| e.get("TITLE"))
                    .and_then(Yaml::str),
                Some("${{ github.event.workflow_run.display_title }}"),
                "{id}"
            );
            assert!(
                s.get("run")
                    .unwrap()
                    .str()
                    .unwrap()
                    .contains("--title \"$TITLE\""),
                "{id}"
            );
        }
        let run = step("post").get("run").unwrap().str().unwrap();
        for arg in [
            "--commits ",
            "--allowlist .github/bot-allowlist.txt",
            "--jobs ",
        ] {
            assert!(run.contains(arg), "{arg}: {run}");
        }
        // The comment fetched is the one the title names, never one an artifact names.
        let fetch = steps
            .iter()
            .find(|s| {
                s.get("run")
                    .and_then(Yaml::str)
                    .is_some_and(|r| r.contains("issues/comments/"))
            })
            .unwrap();
        assert_eq!(
            fetch
                .get("env")
                .and_then(|e| e.get("COMMENT_ID"))
                .and_then(Yaml::str),
            Some("${{ steps.select.outputs.comment-id }}")
        );
        assert!(!post.raw.contains("post-request"));
        // A request artifact that is not there to trust is not downloaded; `post` answers.
        let request = steps
            .iter()
            .find(|s| with(s, "artifact-ids") == Some("${{ steps.select.outputs.request-id }}"))
            .unwrap();
        assert_eq!(
            request.get("if").and_then(Yaml::str),
            Some("steps.select.outputs.request-id != ''")
        );
    }
}
