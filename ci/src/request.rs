//! The `bot:test` comment grammar: a pull-request comment becomes a typed [`BotRequest`] or a
//! [`ParseError`] that names the offending word.
//!
//! ```text
//! bot:test [KEY=VALUE]...
//! ```
//!
//! The comment must start with `bot:test` itself (no leading whitespace: the workflow's
//! `startsWith` filter is the same test, see [`is_bot_command`]). Only its first line is read,
//! and every line end GitHub or a renderer might honour ends it (see [`LINE_ENDS`]); words are
//! separated by spaces and tabs only, so any other whitespace stays inside a word and makes it
//! invalid. Keys are upper-case and may appear once. See [`USAGE`] for the keys and ranges.

use crate::catalog;
use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// The word a comment must start with.
pub const COMMAND: &str = "bot:test";

/// Property cases per request: at least one, at most this many.
pub const MAX_CASES: u32 = 100_000;
/// Property cases when the comment names none (as `attn-diff check`).
pub const DEFAULT_CASES: u32 = 500;
/// Shards (runners) per request: at least one, at most this many.
pub const MAX_SHARDS: u32 = 8;
/// Serving traces per request: at most this many (0 turns them off).
pub const MAX_TRACES: u32 = 20_000;
/// Traces when the comment names none (as `attn-diff check`).
pub const DEFAULT_TRACES: u32 = 100;

fn default_traces() -> u32 {
    DEFAULT_TRACES
}

/// Property cases one shard may run, and with `DEEP=1` (bigger batches, slower cases): a
/// request over these needs more shards. Sized so a shard ends well inside the shard job's
/// timeout (`attn-diff-sharded.yml`; docs/bot.md gives the worst case per comment).
pub const MAX_CASES_PER_SHARD: u32 = 25_000;
pub const MAX_DEEP_CASES_PER_SHARD: u32 = 12_500;
/// Serving traces one shard may run (a trace is many scheduled steps over one cache), and
/// with `DEEP=1`: `TRACES=20000` needs all 8 shards.
pub const MAX_TRACES_PER_SHARD: u32 = 2_500;
pub const MAX_DEEP_TRACES_PER_SHARD: u32 = 1_250;
/// Upstream specs times shards: every shard runs every spec named (the cases are split, the
/// specs are not), so this bounds the runner time specs add to a request.
pub const MAX_SPEC_RUNS: u32 = 32;
/// Length of a `SHA=` value: a full commit id. An abbreviation is refused: it names whatever
/// commit of that prefix the author pushes, not one commit.
pub const SHA_LEN: usize = 40;
/// Upstream specs one request may name.
pub const MAX_SPECS: usize = 16;
/// Backends one request may name.
pub const MAX_BACKENDS: usize = 16;
/// The `attn-diff check --only KEY=VALUES` keys an `ONLY=` filter may name: the keys of a
/// case space, declared once.
pub const ONLY_KEYS: [&str; 14] = attn_reference::Space::KEYS;
/// Longest `ONLY=` value list (the values of one key).
pub const MAX_ONLY_VALUES: usize = 64;
/// Longest word echoed back in a reply (longer ones are cut).
const MAX_ECHO: usize = 64;

/// The usage text every rejected comment gets.
pub const USAGE: &str = "\
bot:test [KEY=VALUE]...

  BACKENDS=a,b,...  backends to run (default: every registered backend)
                    known: cpu, spyre-native, spyre-sdpa, spyre-device; mutant:<name> with MUTANTS=1
  CASES=N           property cases, 1..=100000 (default 500)
  TRACES=N          serving traces (one cache across many steps), 0..=20000 (default 100)
  SPECS=a,b,...     upstream specs to run besides the small suite (at most 16)
  SEED=N            case seed, 0..=18446744073709551615 (default 1)
  DEEP=0|1          bigger batches and longer sequences (default 0)
  SHARDS=N          runners to split the cases over, 1..=8 and at most CASES (default 1)
  MUTANTS=0|1       build the deliberately wrong backends too; every mutant must diverge (default 0)
  ONLY=k=v;k=v      restrict the cases (attn-diff check --only k=v for each): keys dtypes,
                    head_sizes, head_size_multiple_of, block_sizes, block_size_multiple_of,
                    kinds, features, max_seqs, max_query_len, max_seq_len, max_tokens,
                    max_group, kv_cache_dtypes, kv_layouts; values
                    a-z 0-9 _ separated by commas; each key once (e.g. ONLY=dtypes=f16;head_sizes=64,128)
  SHA=hex           the commit to test: the pull request's head, all 40 hex digits (default: the
                    head when the comment was made); refused if the head is no longer that commit
  cases per shard (CASES/SHARDS, rounded up): at most 25000, or 12500 with DEEP=1

example: bot:test BACKENDS=cpu,spyre-sdpa CASES=20000 SPECS=large_decode,mixed_medium SEED=7 DEEP=1 SHARDS=4";

/// What a `bot:test` comment asks for, every field checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BotRequest {
    /// Backend names; empty means every registered backend.
    pub backends: Vec<String>,
    pub cases: u32,
    /// Serving traces, split over the shards like the cases.
    #[serde(default = "default_traces")]
    pub traces: u32,
    pub specs: Vec<String>,
    pub seed: u64,
    pub deep: bool,
    pub shards: u32,
    pub mutants: bool,
    /// `ONLY=`: filters passed to every shard's `attn-diff check` as `--only KEY=VALUES`, in
    /// the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub only: Vec<OnlyFilter>,
    /// `SHA=`: the commit the maintainer reviewed (a full commit id, lower-case hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha: Option<String>,
}

/// One `ONLY=` item: a key of [`ONLY_KEYS`] and its comma-separated values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnlyFilter {
    pub key: String,
    pub values: String,
}

impl OnlyFilter {
    /// As `attn-diff check --only` takes it.
    pub fn arg(&self) -> String {
        format!("{}={}", self.key, self.values)
    }
}

impl Default for BotRequest {
    fn default() -> Self {
        BotRequest {
            backends: Vec::new(),
            cases: DEFAULT_CASES,
            traces: DEFAULT_TRACES,
            specs: Vec::new(),
            seed: 1,
            deep: false,
            shards: 1,
            mutants: false,
            only: Vec::new(),
            sha: None,
        }
    }
}

/// The keys of the grammar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    Backends,
    Cases,
    Traces,
    Specs,
    Seed,
    Deep,
    Shards,
    Mutants,
    Only,
    Sha,
}

impl Key {
    pub const ALL: [Key; 10] = [
        Key::Backends,
        Key::Cases,
        Key::Traces,
        Key::Specs,
        Key::Seed,
        Key::Deep,
        Key::Shards,
        Key::Mutants,
        Key::Only,
        Key::Sha,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Key::Backends => "BACKENDS",
            Key::Cases => "CASES",
            Key::Traces => "TRACES",
            Key::Specs => "SPECS",
            Key::Seed => "SEED",
            Key::Deep => "DEEP",
            Key::Shards => "SHARDS",
            Key::Mutants => "MUTANTS",
            Key::Only => "ONLY",
            Key::Sha => "SHA",
        }
    }

    fn from_name(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a comment was rejected; every variant carries the word to point at.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ParseError {
    #[error("the comment does not start with `{COMMAND}` (in lower case, as a word of its own)")]
    NotACommand { word: String },
    #[error("`{word}` is not KEY=VALUE")]
    NotKeyValue { word: String },
    #[error(
        "unknown key `{key}` (keys: BACKENDS, CASES, TRACES, SPECS, SEED, DEEP, SHARDS, MUTANTS, ONLY, SHA)"
    )]
    UnknownKey { key: String, word: String },
    #[error("{key} is given twice")]
    DuplicateKey { key: Key, word: String },
    #[error("{key} has an empty value")]
    EmptyValue { key: Key, word: String },
    #[error("{key}=`{value}` is not a whole number")]
    NotANumber {
        key: Key,
        value: String,
        word: String,
    },
    #[error("{key}={value} is out of range {min}..={max}")]
    OutOfRange {
        key: Key,
        value: String,
        min: u64,
        max: u64,
        word: String,
    },
    #[error("{key}=`{value}` must be 0 or 1")]
    NotAFlag {
        key: Key,
        value: String,
        word: String,
    },
    #[error("{key} names `{name}` twice")]
    DuplicateName {
        key: Key,
        name: String,
        word: String,
    },
    #[error("{key} names {count} entries; at most {max}")]
    TooMany {
        key: Key,
        count: usize,
        max: usize,
        word: String,
    },
    #[error("unknown backend `{name}` (known: {})", catalog::BACKENDS.join(", "))]
    UnknownBackend { name: String, word: String },
    #[error("`{name}` is a mutant: add MUTANTS=1 to build the mutants")]
    MutantWithoutFlag { name: String, word: String },
    #[error("`{name}` is not a valid mutant name (letters, digits, `-` and `_`)")]
    BadMutantName { name: String, word: String },
    #[error("unknown spec `{name}` (known: {})", attn_reference::specs::spec_names().join(", "))]
    UnknownSpec { name: String, word: String },
    #[error("SHA=`{value}` is not a full commit id ({SHA_LEN} lower-case hex digits)")]
    BadSha { value: String, word: String },
    #[error("ONLY: `{item}` is not KEY=VALUES (keys: {}; values: a-z, 0-9 and _, separated by commas)", ONLY_KEYS.join(", "))]
    BadOnly { item: String, word: String },
    #[error("ONLY names `{key}` twice")]
    DuplicateOnly { key: String, word: String },
    #[error(
        "{per_shard} cases per shard (CASES={cases} over SHARDS={shards}); at most {max}{deep}: \
         raise SHARDS or lower CASES",
        deep = if *deep { " with DEEP=1" } else { "" }
    )]
    ShardTooBig {
        cases: u32,
        shards: u32,
        per_shard: u32,
        max: u32,
        deep: bool,
        word: String,
    },
    #[error(
        "{per_shard} traces per shard (TRACES={traces} over SHARDS={shards}); at most {max}{deep}: \
         raise SHARDS or lower TRACES",
        deep = if *deep { " with DEEP=1" } else { "" }
    )]
    TracesPerShard {
        traces: u32,
        shards: u32,
        per_shard: u32,
        max: u32,
        deep: bool,
        word: String,
    },
    #[error(
        "{specs} spec(s) on each of SHARDS={shards} is {} spec runs (every shard runs every \
         spec); at most {MAX_SPEC_RUNS}: name fewer specs or lower SHARDS",
        specs * shards
    )]
    TooManySpecRuns {
        specs: u32,
        shards: u32,
        word: String,
    },
    #[error("SHARDS={shards} is more than CASES={cases}")]
    ShardsExceedCases {
        shards: u32,
        cases: u32,
        word: String,
    },
}

impl ParseError {
    /// The word of the comment the error is about.
    pub fn offending_word(&self) -> &str {
        match self {
            ParseError::NotACommand { word }
            | ParseError::NotKeyValue { word }
            | ParseError::UnknownKey { word, .. }
            | ParseError::DuplicateKey { word, .. }
            | ParseError::EmptyValue { word, .. }
            | ParseError::NotANumber { word, .. }
            | ParseError::OutOfRange { word, .. }
            | ParseError::NotAFlag { word, .. }
            | ParseError::DuplicateName { word, .. }
            | ParseError::TooMany { word, .. }
            | ParseError::UnknownBackend { word, .. }
            | ParseError::MutantWithoutFlag { word, .. }
            | ParseError::BadMutantName { word, .. }
            | ParseError::UnknownSpec { word, .. }
            | ParseError::BadSha { word, .. }
            | ParseError::BadOnly { word, .. }
            | ParseError::DuplicateOnly { word, .. }
            | ParseError::ShardTooBig { word, .. }
            | ParseError::TracesPerShard { word, .. }
            | ParseError::TooManySpecRuns { word, .. }
            | ParseError::ShardsExceedCases { word, .. } => word,
        }
    }
}

/// A word cut to a length fit to echo back, with every invisible or control character
/// (zero-width, bidi override, odd whitespace) written as `\u{..}` so the reader sees it.
fn echo(word: &str) -> String {
    let mut out = String::new();
    for (i, c) in word.chars().enumerate() {
        if i == MAX_ECHO {
            out.push('…');
            break;
        }
        if is_hidden(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// Characters that do not show as themselves: controls, whitespace other than a space, and
/// the invisible ones (zero-width, joiners, bidi controls, byte-order mark, soft hyphen,
/// variation selectors, tag characters, blank fillers: [`crate::sanitize::invisible`]).
fn is_hidden(c: char) -> bool {
    c.is_control() || (c.is_whitespace() && c != ' ') || crate::sanitize::invisible(c)
}

/// What ends the first line: `\n` and `\r`, and the other line ends of Unicode (vertical tab,
/// form feed, NEL, line and paragraph separators), so that no "second line" a renderer shows
/// can still set a key.
pub const LINE_ENDS: [char; 7] = [
    '\n', '\r', '\u{0b}', '\u{0c}', '\u{85}', '\u{2028}', '\u{2029}',
];

/// Whether `comment` is addressed to the bot: it starts with `bot:test` in any case, as the bot
/// workflow's `startsWith(github.event.comment.body, 'bot:test')` tests it (GitHub's
/// `startsWith` ignores case, comparing each character's upper case: `BOT:TEST`, and even
/// `bot:teſt` with a long s, get through). Every comment the workflow lets through is
/// answered: one that is not exactly `bot:test` then gets the usage reply from [`parse`]
/// rather than silence. Anything else is not for the bot and gets no reply.
pub fn is_bot_command(comment: &str) -> bool {
    let upper = |c: char| {
        let mut u = c.to_uppercase();
        match (u.next(), u.next()) {
            (Some(one), None) => one,
            _ => c,
        }
    };
    let mut chars = comment.chars();
    COMMAND
        .chars()
        .all(|want| chars.next().is_some_and(|c| upper(c) == upper(want)))
}

fn first_line(comment: &str) -> &str {
    comment.split(LINE_ENDS).next().unwrap_or("")
}

/// The first line's words: separated by spaces and tabs only.
fn words(line: &str) -> impl Iterator<Item = &str> {
    line.split([' ', '\t']).filter(|w| !w.is_empty())
}

/// Parse a comment into a request.
pub fn parse(comment: &str) -> Result<BotRequest, ParseError> {
    if !is_bot_command(comment) {
        return Err(ParseError::NotACommand {
            word: echo(words(first_line(comment)).next().unwrap_or("")),
        });
    }
    let mut words = words(first_line(comment));
    match words.next() {
        Some(COMMAND) => {}
        other => {
            return Err(ParseError::NotACommand {
                word: echo(other.unwrap_or("")),
            })
        }
    }
    let mut req = BotRequest::default();
    let mut seen: Vec<Key> = Vec::new();
    let mut shards_word = String::new();
    let mut cases_word = String::new();
    let mut traces_word = String::new();
    let mut specs_word = String::new();
    let mut mutant_words: Vec<(String, String)> = Vec::new();
    for word in words {
        let shown = echo(word);
        let (k, value) = word
            .split_once('=')
            .ok_or_else(|| ParseError::NotKeyValue {
                word: shown.clone(),
            })?;
        let key = Key::from_name(k).ok_or_else(|| ParseError::UnknownKey {
            key: echo(k),
            word: shown.clone(),
        })?;
        if seen.contains(&key) {
            return Err(ParseError::DuplicateKey { key, word: shown });
        }
        seen.push(key);
        if value.is_empty() {
            return Err(ParseError::EmptyValue { key, word: shown });
        }
        match key {
            Key::Cases => {
                req.cases = number(key, value, 1, MAX_CASES as u64, &shown)? as u32;
                cases_word = shown;
            }
            Key::Traces => {
                req.traces = number(key, value, 0, MAX_TRACES as u64, &shown)? as u32;
                traces_word = shown;
            }
            Key::Sha => {
                let ok = value.len() == SHA_LEN
                    && value
                        .bytes()
                        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
                if !ok {
                    return Err(ParseError::BadSha {
                        value: echo(value),
                        word: shown,
                    });
                }
                req.sha = Some(value.to_string());
            }
            Key::Only => req.only = only(value, &shown)?,
            Key::Seed => req.seed = number(key, value, 0, u64::MAX, &shown)?,
            Key::Shards => {
                req.shards = number(key, value, 1, MAX_SHARDS as u64, &shown)? as u32;
                shards_word = shown;
            }
            Key::Deep => req.deep = flag(key, value, &shown)?,
            Key::Mutants => req.mutants = flag(key, value, &shown)?,
            Key::Specs => {
                let names = list(key, value, MAX_SPECS, &shown)?;
                let known = attn_reference::specs::spec_names();
                if let Some(bad) = names.iter().find(|n| !known.contains(&n.as_str())) {
                    return Err(ParseError::UnknownSpec {
                        name: echo(bad),
                        word: shown,
                    });
                }
                req.specs = names;
                specs_word = shown;
            }
            Key::Backends => {
                let names = list(key, value, MAX_BACKENDS, &shown)?;
                for name in &names {
                    let backend = attn_results::BackendRef::parse(name);
                    if let Some(mutant) = backend.mutant_name() {
                        if !catalog::is_valid_mutant_name(mutant) {
                            return Err(ParseError::BadMutantName {
                                name: echo(name),
                                word: shown,
                            });
                        }
                        mutant_words.push((name.clone(), shown.clone()));
                    } else if !catalog::BACKENDS.contains(&name.as_str()) {
                        return Err(ParseError::UnknownBackend {
                            name: echo(name),
                            word: shown,
                        });
                    }
                }
                req.backends = names;
            }
        }
    }
    // Checks across keys, once every key is known.
    if !req.mutants {
        if let Some((name, word)) = mutant_words.into_iter().next() {
            return Err(ParseError::MutantWithoutFlag {
                name: echo(&name),
                word,
            });
        }
    }
    if req.shards > req.cases {
        return Err(ParseError::ShardsExceedCases {
            shards: req.shards,
            cases: req.cases,
            word: shards_word,
        });
    }
    let per_shard = req.cases.div_ceil(req.shards);
    let max = if req.deep {
        MAX_DEEP_CASES_PER_SHARD
    } else {
        MAX_CASES_PER_SHARD
    };
    if per_shard > max {
        return Err(ParseError::ShardTooBig {
            cases: req.cases,
            shards: req.shards,
            per_shard,
            max,
            deep: req.deep,
            // The word to change: CASES if given, else SHARDS (or the command when both are
            // defaults, which cannot exceed the cap).
            word: [cases_word, shards_word]
                .into_iter()
                .find(|w| !w.is_empty())
                .unwrap_or_else(|| COMMAND.to_string()),
        });
    }
    let per_shard = req.traces.div_ceil(req.shards);
    let max = if req.deep {
        MAX_DEEP_TRACES_PER_SHARD
    } else {
        MAX_TRACES_PER_SHARD
    };
    if per_shard > max {
        return Err(ParseError::TracesPerShard {
            traces: req.traces,
            shards: req.shards,
            per_shard,
            max,
            deep: req.deep,
            word: [traces_word, shards_word.clone()]
                .into_iter()
                .find(|w| !w.is_empty())
                .unwrap_or_else(|| COMMAND.to_string()),
        });
    }
    let specs = req.specs.len() as u32;
    if specs * req.shards > MAX_SPEC_RUNS {
        return Err(ParseError::TooManySpecRuns {
            specs,
            shards: req.shards,
            word: specs_word,
        });
    }
    Ok(req)
}

fn number(key: Key, value: &str, min: u64, max: u64, word: &str) -> Result<u64, ParseError> {
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::NotANumber {
            key,
            value: echo(value),
            word: word.to_string(),
        });
    }
    let out_of_range = || ParseError::OutOfRange {
        key,
        value: echo(value),
        min,
        max,
        word: word.to_string(),
    };
    // All digits: the only parse failure left is overflow.
    let n: u64 = value.parse().map_err(|_| out_of_range())?;
    if n < min || n > max {
        return Err(out_of_range());
    }
    Ok(n)
}

fn flag(key: Key, value: &str, word: &str) -> Result<bool, ParseError> {
    match value {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(ParseError::NotAFlag {
            key,
            value: echo(value),
            word: word.to_string(),
        }),
    }
}

fn list(key: Key, value: &str, max: usize, word: &str) -> Result<Vec<String>, ParseError> {
    let names: Vec<String> = value.split(',').map(str::to_string).collect();
    if names.iter().any(String::is_empty) {
        return Err(ParseError::EmptyValue {
            key,
            word: word.to_string(),
        });
    }
    if names.len() > max {
        return Err(ParseError::TooMany {
            key,
            count: names.len(),
            max,
            word: word.to_string(),
        });
    }
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            return Err(ParseError::DuplicateName {
                key,
                name: echo(n),
                word: word.to_string(),
            });
        }
    }
    Ok(names)
}

/// `ONLY=` items: `key=values` separated by `;`, each key of [`ONLY_KEYS`] at most once,
/// values of `a-z`, `0-9` and `_` separated by single commas.
fn only(value: &str, word: &str) -> Result<Vec<OnlyFilter>, ParseError> {
    let mut filters: Vec<OnlyFilter> = Vec::new();
    for item in value.split(';') {
        let bad = || ParseError::BadOnly {
            item: echo(item),
            word: word.to_string(),
        };
        let (key, values) = item.split_once('=').ok_or_else(bad)?;
        let value_ok = |v: &str| {
            !v.is_empty()
                && v.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        let list: Vec<&str> = values.split(',').collect();
        if !ONLY_KEYS.contains(&key)
            || list.len() > MAX_ONLY_VALUES
            || !list.iter().all(|v| value_ok(v))
            // What `attn-diff check --only` would refuse is refused here, before any run.
            || attn_reference::Space::parse_only(item).is_err()
        {
            return Err(bad());
        }
        if filters.iter().any(|f| f.key == key) {
            return Err(ParseError::DuplicateOnly {
                key: key.to_string(),
                word: word.to_string(),
            });
        }
        filters.push(OnlyFilter {
            key: key.to_string(),
            values: values.to_string(),
        });
    }
    Ok(filters)
}

impl BotRequest {
    /// The request written back as a canonical comment (every key, fixed order): what the
    /// replies echo instead of the comment's own text.
    pub fn canonical(&self) -> String {
        let mut s = String::from(COMMAND);
        if !self.backends.is_empty() {
            s.push_str(&format!(" BACKENDS={}", self.backends.join(",")));
        }
        s.push_str(&format!(" CASES={} TRACES={}", self.cases, self.traces));
        if !self.specs.is_empty() {
            s.push_str(&format!(" SPECS={}", self.specs.join(",")));
        }
        s.push_str(&format!(
            " SEED={} DEEP={} SHARDS={} MUTANTS={}",
            self.seed, self.deep as u8, self.shards, self.mutants as u8
        ));
        if !self.only.is_empty() {
            let items: Vec<String> = self.only.iter().map(OnlyFilter::arg).collect();
            s.push_str(&format!(" ONLY={}", items.join(";")));
        }
        if let Some(sha) = &self.sha {
            s.push_str(&format!(" SHA={sha}"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(comment: &str) -> ParseError {
        parse(comment).expect_err(comment)
    }

    #[test]
    fn the_issue_example_parses() {
        let r = parse("bot:test BACKENDS=cpu,spyre-sdpa CASES=20000 SPECS=large_decode,mixed_medium SEED=7 DEEP=1 SHARDS=4 MUTANTS=1").unwrap();
        assert_eq!(
            r,
            BotRequest {
                backends: vec!["cpu".into(), "spyre-sdpa".into()],
                cases: 20000,
                traces: DEFAULT_TRACES,
                specs: vec!["large_decode".into(), "mixed_medium".into()],
                seed: 7,
                deep: true,
                shards: 4,
                mutants: true,
                only: Vec::new(),
                sha: None,
            }
        );
    }

    #[test]
    fn bare_command_takes_the_defaults() {
        assert_eq!(parse("bot:test").unwrap(), BotRequest::default());
        assert_eq!(parse("bot:test  \t \r\n").unwrap(), BotRequest::default());
    }

    #[test]
    fn leading_whitespace_is_not_a_command_as_in_the_workflow_filter() {
        // The workflow runs only for bodies that start with `bot:test`; the parser agrees.
        for c in [
            " bot:test",
            "\nbot:test",
            "\u{feff}bot:test",
            "\tbot:test CASES=1",
        ] {
            assert!(!is_bot_command(c), "{c:?}");
            assert!(matches!(err(c), ParseError::NotACommand { .. }), "{c:?}");
        }
        // Whatever starts with the command reaches the parser and gets an answer.
        assert!(is_bot_command("bot:testing"));
        assert_eq!(err("bot:testing").offending_word(), "bot:testing");
    }

    #[test]
    fn every_line_end_ends_the_first_line() {
        for end in LINE_ENDS {
            let c = format!("bot:test CASES=10{end}SHARDS=8 DEEP=1 MUTANTS=1");
            let r = parse(&c).unwrap_or_else(|e| panic!("{end:?}: {e}"));
            assert_eq!(
                (r.cases, r.shards, r.deep, r.mutants),
                (10, 1, false, false),
                "{end:?}"
            );
        }
        // CRLF and a lone CR too.
        assert_eq!(parse("bot:test SEED=3\r\nSEED=4").unwrap().seed, 3);
        assert!(!parse("bot:test SEED=3\rDEEP=1").unwrap().deep);
    }

    #[test]
    fn other_whitespace_does_not_separate_words() {
        // A no-break space, an em space or a zero-width space inside the line glue two words
        // into one invalid word: never a silently accepted key.
        for sep in ['\u{a0}', '\u{2003}', '\u{200b}', '\u{3000}'] {
            let c = format!("bot:test CASES=10{sep}SHARDS=8");
            let e = err(&c);
            assert!(
                matches!(
                    e,
                    ParseError::NotANumber {
                        key: Key::Cases,
                        ..
                    }
                ),
                "{sep:?}: {e:?}"
            );
            // The hidden character is spelled out in the echoed word.
            let shown = format!("{}", sep.escape_unicode());
            assert!(
                e.offending_word().contains(&shown),
                "{sep:?}: {}",
                e.offending_word()
            );
        }
    }

    #[test]
    fn sha_is_hex_of_a_commit_length() {
        let full = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            parse(&format!("bot:test SHA={full}"))
                .unwrap()
                .sha
                .as_deref(),
            Some(full)
        );
        for bad in [
            // Abbreviations, however long: a prefix names whatever commit the author pushes.
            "abcdef0",
            &full[..39],
            "abcdef",
            "ABCDEF0",
            &full.to_uppercase(),
            "abcdefg",
            &format!("{full}0"),
            "abc def0",
        ] {
            let c = format!("bot:test SHA={bad}");
            assert!(
                matches!(
                    err(&c),
                    ParseError::BadSha { .. } | ParseError::NotKeyValue { .. }
                ),
                "{bad}"
            );
        }
        let e = err("bot:test SHA=abcdef0");
        assert_eq!(
            e.to_string(),
            "SHA=`abcdef0` is not a full commit id (40 lower-case hex digits)"
        );
        let r = parse(&format!("bot:test SHA={full} CASES=7")).unwrap();
        assert_eq!(parse(&r.canonical()).unwrap(), r);
        assert!(r.canonical().ends_with(&format!(" SHA={full}")));
    }

    #[test]
    fn the_workflow_filter_and_the_parser_agree_on_case() {
        // GitHub's startsWith ignores case: every comment it lets through is answered (the
        // usage reply), none is dropped in silence.
        for c in ["BOT:TEST", "Bot:Test CASES=5", "bot:TEST", "bot:te\u{17f}t"] {
            assert!(is_bot_command(c), "{c:?}");
            let e = err(c);
            assert!(matches!(e, ParseError::NotACommand { .. }), "{c:?}: {e:?}");
            assert_eq!(e.offending_word(), c.split(' ').next().unwrap());
        }
        for c in ["bot:tes", "bot test", "b\u{f6}t:test", "\u{ff42}ot:test"] {
            assert!(!is_bot_command(c), "{c:?}");
        }
    }

    #[test]
    fn only_filters_are_strict_and_reach_the_request() {
        let r =
            parse("bot:test ONLY=dtypes=f16;head_sizes=64,128;max_seqs=1;head_size_multiple_of=64")
                .unwrap();
        let args: Vec<String> = r.only.iter().map(OnlyFilter::arg).collect();
        assert_eq!(
            args,
            [
                "dtypes=f16",
                "head_sizes=64,128",
                "max_seqs=1",
                "head_size_multiple_of=64"
            ]
        );
        assert_eq!(parse(&r.canonical()).unwrap(), r);
        assert!(r
            .canonical()
            .contains(" ONLY=dtypes=f16;head_sizes=64,128;max_seqs=1;head_size_multiple_of=64"));
        // Every key of a case space, with a value `check --only` takes.
        for key in ONLY_KEYS {
            let value = match key {
                "dtypes" => "f16,bf16",
                "kinds" => "decoder",
                "features" => "sliding_window,alibi",
                "kv_cache_dtypes" => "auto,fp8_e4m3",
                "kv_layouts" => "mha,mla",
                k if k.starts_with("max_") || k.ends_with("_multiple_of") => "16",
                _ => "64,128",
            };
            let r = parse(&format!("bot:test ONLY={key}={value}")).unwrap();
            assert_eq!(r.only[0].arg(), format!("{key}={value}"));
        }
        // Well-formed words `check --only` would refuse are refused before any run.
        for bad in ["dtypes=f64", "max_seqs=0", "max_seqs=1,2", "kinds=a_1"] {
            assert!(parse(&format!("bot:test ONLY={bad}")).is_err(), "{bad}");
        }
        for bad in [
            "ONLY=dtypes",
            "ONLY=dtypes=",
            "ONLY=dtypes=F16",
            "ONLY=dtypes=f16,",
            "ONLY=dtypes=,f16",
            "ONLY=dtypes=f16,,bf16",
            "ONLY=dtypes=f-16",
            "ONLY=dtypes=f16;",
            "ONLY=;dtypes=f16",
            "ONLY=heads=8",
            "ONLY=DTYPES=f16",
            "ONLY=dtypes=f16=bf16",
            "ONLY=dtypes=f16;--backend=x",
            "ONLY=dtypes=$(id)",
            "ONLY=dtypes=f16\u{200b}",
        ] {
            let c = format!("bot:test {bad}");
            let e = err(&c);
            assert!(matches!(e, ParseError::BadOnly { .. }), "{bad}: {e:?}");
            assert_eq!(e.offending_word(), echo(bad), "{bad}");
        }
        let e = err("bot:test ONLY=dtypes=f16;kinds=decoder;dtypes=bf16");
        assert!(
            matches!(e, ParseError::DuplicateOnly { ref key, .. } if key == "dtypes"),
            "{e:?}"
        );
        // Once per comment, like every key.
        assert!(matches!(
            err("bot:test ONLY=dtypes=f16 ONLY=kinds=decode"),
            ParseError::DuplicateKey { key: Key::Only, .. }
        ));
        let many = format!("bot:test ONLY=head_sizes={}", vec!["8"; 65].join(","));
        assert!(matches!(err(&many), ParseError::BadOnly { .. }));
        // The message lists what is allowed.
        assert!(err("bot:test ONLY=x=1")
            .to_string()
            .contains("kv_cache_dtypes"));
    }

    #[test]
    fn invisible_characters_are_spelled_out_in_echoes() {
        for c in [
            '\u{61c}',
            '\u{3164}',
            '\u{e0000}',
            '\u{e0041}',
            '\u{e007f}',
            '\u{fe0f}',
            '\u{115f}',
            '\u{ffa0}',
            '\u{2800}',
            '\u{180e}',
        ] {
            let e = err(&format!("bot:test CASES=1{c}"));
            let shown = format!("{}", c.escape_unicode());
            assert!(e.offending_word().contains(&shown), "{c:?}: {e:?}");
            assert!(!e.offending_word().contains(c), "{c:?}");
        }
    }

    #[test]
    fn a_shard_has_a_case_cap() {
        // At the cap: accepted (the nightly run's request is exactly at the deep cap).
        assert!(parse("bot:test CASES=100000 DEEP=1 SHARDS=8").is_ok());
        assert!(parse("bot:test CASES=25000").is_ok());
        assert!(parse("bot:test CASES=50000 SHARDS=2").is_ok());
        // One case over, rounding up: 25001 over 1 shard, 12501 deep, 50001 over 2.
        let e = err("bot:test CASES=25001");
        assert!(
            matches!(
                e,
                ParseError::ShardTooBig {
                    per_shard: 25001,
                    max: 25_000,
                    deep: false,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.offending_word(), "CASES=25001");
        let e = err("bot:test DEEP=1 CASES=12501");
        assert!(
            matches!(
                e,
                ParseError::ShardTooBig {
                    max: 12_500,
                    deep: true,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = err("bot:test SHARDS=2 CASES=50001");
        assert!(
            matches!(
                e,
                ParseError::ShardTooBig {
                    per_shard: 25001,
                    ..
                }
            ),
            "{e:?}"
        );
        // The issue's example: one deep shard of 100000 cases.
        let e = err("bot:test CASES=100000 DEEP=1 SHARDS=1");
        assert_eq!(
            e.to_string(),
            "100000 cases per shard (CASES=100000 over SHARDS=1); at most 12500 with DEEP=1: \
             raise SHARDS or lower CASES"
        );
    }

    #[test]
    fn a_shard_has_a_trace_cap_and_specs_a_cap_over_the_shards() {
        assert!(parse("bot:test TRACES=2500").is_ok());
        assert!(parse("bot:test TRACES=20000 SHARDS=8 CASES=8").is_ok());
        assert!(parse("bot:test TRACES=10000 DEEP=1 SHARDS=8 CASES=8").is_ok());
        let e = err("bot:test TRACES=2501");
        assert!(
            matches!(
                e,
                ParseError::TracesPerShard {
                    per_shard: 2501,
                    max: 2500,
                    deep: false,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.offending_word(), "TRACES=2501");
        let e = err("bot:test TRACES=10001 DEEP=1 SHARDS=8 CASES=8");
        assert!(
            matches!(
                e,
                ParseError::TracesPerShard {
                    per_shard: 1251,
                    max: 1250,
                    deep: true,
                    ..
                }
            ),
            "{e:?}"
        );
        // Every shard runs every spec: k specs on 32/k shards is the cap, one more is over.
        let names = attn_reference::specs::spec_names();
        let k = names.len().min(MAX_SPECS) as u32;
        let specs = names[..k as usize].join(",");
        let most = (MAX_SPEC_RUNS / k).min(MAX_SHARDS);
        assert!(parse(&format!("bot:test SPECS={specs} SHARDS={most}")).is_ok());
        if most < MAX_SHARDS {
            let e = err(&format!("bot:test SPECS={specs} SHARDS={}", most + 1));
            assert!(
                matches!(e, ParseError::TooManySpecRuns { specs, .. } if specs == k),
                "{e:?}"
            );
            assert!(e.offending_word().starts_with("SPECS="), "{e:?}");
        }
        // The nightly run's request is within every cap.
        assert!(parse("bot:test CASES=100000 DEEP=1 SHARDS=8 SEED=1").is_ok());
    }

    #[test]
    fn traces_are_a_number_of_their_own() {
        assert_eq!(parse("bot:test").unwrap().traces, DEFAULT_TRACES);
        let r = parse("bot:test TRACES=0 CASES=5").unwrap();
        assert_eq!((r.traces, r.cases), (0, 5));
        assert_eq!(parse(&r.canonical()).unwrap(), r);
        assert!(matches!(
            parse("bot:test TRACES=20001"),
            Err(ParseError::OutOfRange { .. })
        ));
    }

    #[test]
    fn only_the_first_line_is_read() {
        let r = parse("bot:test CASES=10\nthis line explains why CASES=oops").unwrap();
        assert_eq!(r.cases, 10);
    }

    #[test]
    fn canonical_form_parses_back_to_the_same_request() {
        let r =
            parse("bot:test SHARDS=2 SEED=0 BACKENDS=cpu MUTANTS=1 SPECS=small_decode").unwrap();
        assert_eq!(parse(&r.canonical()).unwrap(), r);
        assert_eq!(
            parse(&BotRequest::default().canonical()).unwrap(),
            BotRequest::default()
        );
    }

    #[test]
    fn ranges_have_inclusive_ends() {
        assert_eq!(parse("bot:test CASES=1").unwrap().cases, 1);
        assert_eq!(parse("bot:test CASES=100000 SHARDS=8").unwrap().shards, 8);
        assert_eq!(
            parse("bot:test SEED=18446744073709551615").unwrap().seed,
            u64::MAX
        );
    }

    #[test]
    fn mutants_are_accepted_by_syntax_with_the_flag() {
        let r = parse("bot:test MUTANTS=1 BACKENDS=cpu,mutant:window-off-by-one").unwrap();
        assert_eq!(r.backends[1], "mutant:window-off-by-one");
    }

    #[test]
    fn not_a_command() {
        let e = err("please bot:test");
        assert!(matches!(e, ParseError::NotACommand { .. }));
        assert_eq!(e.offending_word(), "please");
        assert_eq!(err("bot:testing").offending_word(), "bot:testing");
        assert!(!is_bot_command("please bot:test"));
        assert!(is_bot_command("bot:test CASES=x"));
    }

    #[test]
    fn bad_words_name_themselves() {
        let cases: &[(&str, &str)] = &[
            ("bot:test CASES", "CASES"),
            ("bot:test cases=10", "cases=10"),
            ("bot:test BACKEND=cpu", "BACKEND=cpu"),
            ("bot:test CASES=10 CASES=20", "CASES=20"),
            ("bot:test CASES=", "CASES="),
            ("bot:test CASES=1e4", "CASES=1e4"),
            ("bot:test CASES=-5", "CASES=-5"),
            ("bot:test CASES=0", "CASES=0"),
            ("bot:test CASES=100001", "CASES=100001"),
            (
                "bot:test SEED=18446744073709551616",
                "SEED=18446744073709551616",
            ),
            ("bot:test SHARDS=9", "SHARDS=9"),
            ("bot:test DEEP=yes", "DEEP=yes"),
            ("bot:test MUTANTS=2", "MUTANTS=2"),
            (
                "bot:test BACKENDS=cpu,,spyre-sdpa",
                "BACKENDS=cpu,,spyre-sdpa",
            ),
            ("bot:test BACKENDS=cpu,cpu", "BACKENDS=cpu,cpu"),
            ("bot:test BACKENDS=cuda", "BACKENDS=cuda"),
            ("bot:test BACKENDS=mutant:x", "BACKENDS=mutant:x"),
            (
                "bot:test MUTANTS=1 BACKENDS=mutant:a;rm",
                "BACKENDS=mutant:a;rm",
            ),
            ("bot:test SPECS=huge_decode", "SPECS=huge_decode"),
            ("bot:test CASES=3 SHARDS=4", "SHARDS=4"),
            ("bot:test CASES=10 $(reboot)", "$(reboot)"),
            ("bot:test ONLY=dtypes=f16 ONLY=x=1", "ONLY=x=1"),
        ];
        for (comment, word) in cases {
            assert_eq!(err(comment).offending_word(), *word, "{comment}");
        }
    }

    #[test]
    fn errors_are_typed() {
        assert!(matches!(
            err("bot:test CASES=0"),
            ParseError::OutOfRange {
                key: Key::Cases,
                min: 1,
                max: 100_000,
                ..
            }
        ));
        assert!(matches!(
            err("bot:test SEED=abc"),
            ParseError::NotANumber { key: Key::Seed, .. }
        ));
        assert!(matches!(
            err("bot:test BACKENDS=cuda"),
            ParseError::UnknownBackend { ref name, .. } if name == "cuda"
        ));
        assert!(matches!(
            err("bot:test SPECS=nope"),
            ParseError::UnknownSpec { ref name, .. } if name == "nope"
        ));
        assert!(matches!(
            err("bot:test FOO=1"),
            ParseError::UnknownKey { ref key, .. } if key == "FOO"
        ));
        assert!(matches!(
            err("bot:test BACKENDS=mutant:x"),
            ParseError::MutantWithoutFlag { .. }
        ));
        let many = format!("bot:test SPECS={}", vec!["small_decode"; 17].join(","));
        assert!(matches!(err(&many), ParseError::TooMany { count: 17, .. }));
    }

    #[test]
    fn long_words_are_cut_in_errors() {
        let long = format!("bot:test X{}=1", "A".repeat(500));
        let e = err(&long);
        assert_eq!(e.offending_word().chars().count(), MAX_ECHO + 1);
        assert!(e.offending_word().ends_with('…'));
        assert!(e.to_string().len() < 300);
    }

    #[test]
    fn messages_say_what_is_wrong() {
        assert_eq!(
            err("bot:test CASES=0").to_string(),
            "CASES=0 is out of range 1..=100000"
        );
        assert!(err("bot:test BACKENDS=cuda")
            .to_string()
            .contains("known: cpu, spyre-native, spyre-sdpa, spyre-device"));
    }
}
