//! The sanitiser's output read by an independent CommonMark parser (pulldown-cmark, with the
//! GFM extensions it has: tables, footnotes, task lists, strikethrough, alerts, math): whatever
//! the pull request's code prints, the parsed events hold no link, image, footnote, math, alert
//! or raw HTML but the four collapsed-section tags, and no text that GFM's autolink extension
//! or GitHub's own references would turn live (pulldown-cmark does not autolink bare URLs, so
//! the text is checked for what would trigger one).

use attn_ci::sanitize::{sanitize, wrap};
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

const KEPT_TAGS: [&str; 4] = ["<details>", "</details>", "<summary>", "</summary>"];

/// What in `md` would be live on GitHub, as the parser finds it (empty when nothing is).
fn live(md: &str) -> Vec<String> {
    let mut found = Vec::new();
    let text_is_live = |t: &str| -> Option<&'static str> {
        let lower = t.to_ascii_lowercase();
        // GFM's extended autolinks (www., http://, https://, ftp://, e-mail, mailto:, xmpp:),
        // GitHub's mentions and cross-references.
        for (pat, what) in [
            ("www.", "a www autolink"),
            ("://", "a URL autolink"),
            ("@", "a mention or e-mail autolink"),
        ] {
            if lower.contains(pat) {
                return Some(what);
            }
        }
        let b = lower.as_bytes();
        for scheme in ["mailto:", "xmpp:"] {
            let mut from = 0;
            while let Some(i) = lower[from..].find(scheme) {
                let at = from + i + scheme.len();
                if b.get(at).is_some_and(u8::is_ascii_alphanumeric) {
                    return Some("a mailto or xmpp autolink");
                }
                from = at;
            }
        }
        for i in 0..b.len().saturating_sub(1) {
            if b[i] == b'#' && b[i + 1].is_ascii_digit() {
                return Some("a #N reference");
            }
            if i >= 2 && &b[i - 2..=i] == b"gh-" && b[i + 1].is_ascii_digit() {
                return Some("a GH-N reference");
            }
        }
        None
    };
    // Text in a code block is shown as it is: nothing in it is live.
    let mut in_code_block = false;
    // The text of one element as GitHub's post-processing may see it: an end tag that closes
    // nothing is dropped by HTML parsers (and a container can close a kept element before its
    // own end tag comes), joining the text around it into one text node. So the kept tags are
    // taken out and the text on both sides read as one (`#</summary>1234` is `#1234`).
    let mut joined = String::new();
    let check_joined = |joined: &mut String, found: &mut Vec<String>| {
        if let Some(what) = text_is_live(joined) {
            found.push(format!("{what} once kept tags vanish, in {joined:?}"));
        }
        joined.clear();
    };
    for event in Parser::new_ext(md, Options::all()) {
        match &event {
            Event::Text(t) if !in_code_block => joined.push_str(t),
            Event::Html(h) | Event::InlineHtml(h) => {
                let mut rest = h.to_string();
                for tag in KEPT_TAGS {
                    rest = rest.replace(tag, "");
                }
                joined.push_str(&rest);
            }
            Event::SoftBreak | Event::HardBreak => joined.push('\n'),
            _ => check_joined(&mut joined, &mut found),
        }
        match &event {
            Event::Start(Tag::CodeBlock(_)) => in_code_block = true,
            Event::End(TagEnd::CodeBlock) => in_code_block = false,
            Event::Start(Tag::Link { .. } | Tag::Image { .. } | Tag::FootnoteDefinition(_))
            | Event::FootnoteReference(_)
            | Event::InlineMath(_)
            | Event::DisplayMath(_)
            | Event::Start(Tag::BlockQuote(Some(_))) => found.push(format!("{event:?}")),
            Event::Html(h) | Event::InlineHtml(h) => {
                let mut rest = h.to_string();
                for tag in KEPT_TAGS {
                    rest = rest.replace(tag, "");
                }
                if rest.contains('<') {
                    found.push(format!("raw HTML {h:?}"));
                }
                if let Some(what) = text_is_live(&rest) {
                    found.push(format!("{what} in HTML {h:?}"));
                }
            }
            Event::Text(t) if !in_code_block => {
                if let Some(what) = text_is_live(t) {
                    found.push(format!("{what} in {t:?}"));
                }
            }
            _ => {}
        }
    }
    check_joined(&mut joined, &mut found);
    found
}

/// Markup that is live in the input, placed in the contexts markdown has (a paragraph, a table
/// cell, a heading, a quote, a list item, a collapsed section, after a backslash).
const LIVE: &[&str] = &[
    "[Approved](//evil.example)",
    "\\[Approved](//evil.example)",
    "\\\\[Approved](//evil.example)",
    "\\\\\\[Approved](http:evil.example)",
    "[x](http:evil.example)",
    "\\[x](http:evil.example)",
    "[x](javascript:alert(1))",
    "![img](https://evil.example/x.png)",
    "\\![img](//evil.example/x.png)",
    "!\\[img](//evil.example/x.png)",
    "[ref]\n\n[ref]: //evil.example",
    "\\[ref]: http:evil.example\n\n\\[ref]",
    "<http:evil.example>",
    "\\<http:evil.example>",
    "<https://evil.example>",
    "<mailto:a@evil.example>",
    "<a@evil.example>",
    "http://evil.example",
    "HTTPS://evil.example/x",
    "ftp://evil.example",
    "www.evil.example",
    "WWW.evil.example",
    "(www.evil.example)",
    "*www.evil.example*",
    "mailto:a@evil.example",
    "xmpp:a@evil.example",
    "a@evil.example",
    "@alice @org/team",
    "\\@alice",
    "fixes #12, org/repo#3, GH-4",
    "\\#12",
    // A kept tag between the `#` or `GH-` and the number: should it vanish (an end tag that
    // closes nothing does), the reference is whole again.
    "#</summary>1234",
    "GH-</details>99",
    "owner/repo#</summary>7",
    "see #<details></summary>8 and gh</details>-9",
    "G</summary>H-10, Gh-</SUMMARY>11",
    "<details><summary>x</summary>#</summary></details>12\n</details>",
    "<img src=x onerror=alert(1)>",
    "\\<img src=x>",
    "<a href=\"//evil.example\">x</a>",
    "&lt;a href=x&gt;",
    "&#60;img src=x&#62;",
    "&#x3c;img&#x3e; &#64;alice &commat;bob",
    "<details><summary>[x](//evil.example)</summary>\n\n[y](//evil.example)\n</details>",
    "<details>\n<img src=x>\n\n[z](//evil.example)",
    "[^1]\n\n[^1]: [x](//evil.example)",
    "> [!NOTE]\n> all passed",
    "$x$ and $$y$$ and $`z`$",
    "`code` \\`[x](//evil.example)`",
    "\\`\\[x](//evil.example)\\`",
    "[x](<//evil.example>)",
    "[x][]\n\n[x]: //evil.example",
];

fn contexts(piece: &str) -> Vec<String> {
    let one_line = piece.replace('\n', " ");
    vec![
        piece.to_string(),
        format!("| a | b |\n|---|---|\n| {one_line} | x |\n| y \\| {one_line} | z |"),
        format!("### {one_line}"),
        format!("{one_line}\n==="),
        format!("> {one_line}"),
        format!("- {one_line}\n- [ ] {one_line}"),
        format!("1. {one_line}"),
        format!("<details>\n<summary>{one_line}</summary>\n\n{piece}\n</details>"),
        format!("<details>\n{piece}"),
        format!("\\{piece}"),
        format!("\\\\{piece}"),
        format!("text\\\n{piece}"),
        format!("```\nin a block\n```\n{piece}"),
    ]
}

#[test]
fn live_markup_from_the_pull_request_comes_out_inert() {
    let mut failures = Vec::new();
    for piece in LIVE {
        for md in contexts(piece) {
            let out = sanitize(&md);
            let found = live(&out);
            if !found.is_empty() {
                failures.push(format!("{md:?}\n  -> {out:?}\n  live: {found:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_parser_in_this_test_finds_the_live_markup() {
    // Each piece is live before sanitising (else the test above would prove nothing), and
    // plain text is not.
    for piece in LIVE {
        if piece.contains("&lt;") || piece.contains("&#") || piece.starts_with("> [!NOTE]") {
            // Entities render as characters, not tags; the alert is checked below.
            continue;
        }
        // Escaped in the input already (an odd run of backslashes before its first character,
        // or before every `[`): inert as it is.
        let odd_before =
            |i: usize| (piece[..i].len() - piece[..i].trim_end_matches('\\').len()) % 2 == 1;
        let lead = piece.trim_start_matches('\\');
        let leading_escaped = odd_before(piece.len() - lead.len());
        let brackets_escaped = piece.contains('[')
            && !piece.contains('<')
            && piece.match_indices('[').all(|(i, _)| odd_before(i));
        if leading_escaped || brackets_escaped {
            continue;
        }
        let found = live(piece);
        assert!(!found.is_empty(), "not live before sanitising: {piece:?}");
    }
    assert!(!live("> [!NOTE]\n> all passed").is_empty());
    assert!(live("all passed: 3 backends, 500 cases").is_empty());
}

/// A small deterministic generator (xorshift), so the random pieces are the same every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_mixes_of_markup_characters_come_out_inert() {
    // Tokens that build links, images, HTML, autolinks and escapes; mixed at random, in every
    // order and context the lists above do not think of.
    let tokens = [
        "\\",
        "\\\\",
        "[",
        "]",
        "(",
        ")",
        "<",
        ">",
        "!",
        "&",
        "#",
        "@",
        ":",
        "//",
        "http",
        "www",
        ".",
        "x",
        " ",
        "\n",
        "\n\n",
        "|",
        "`",
        "```",
        "*",
        "_",
        "$",
        "^",
        "-",
        ";",
        "lt",
        "#60",
        "details",
        "<details>",
        "</summary>",
        "javascript",
        "mailto",
        "evil.example",
        "\t",
        "~",
        "=",
        "\"",
        "'",
        "1",
        "GH-",
        "GH",
        "G",
        "H",
        "</details>",
        "<summary>",
        "</SUMMARY>",
        "&amp;",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut failures = Vec::new();
    for _ in 0..20_000 {
        let n = 1 + (rng.next() % 24) as usize;
        let md: String = (0..n)
            .map(|_| tokens[(rng.next() % tokens.len() as u64) as usize])
            .collect();
        let out = sanitize(&md);
        let found = live(&out);
        if !found.is_empty() && failures.len() < 10 {
            failures.push(format!("{md:?}\n  -> {out:?}\n  live: {found:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_posted_comment_links_only_its_own_run() {
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let url = "https://github.com/o/r/actions/runs/1";
    let body = wrap(
        "\\[Approved](//evil.example) http:evil.example\n",
        false,
        sha,
        url,
    );
    let links: Vec<String> = Parser::new_ext(&body, Options::all())
        .filter_map(|e| match e {
            Event::Start(Tag::Link { dest_url, .. }) => Some(dest_url.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(links, [url]);
    assert!(body.contains("unsanitised"), "{body}");
}
