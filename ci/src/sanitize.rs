//! Markdown the pull request's own code wrote (its `reply.md`), made safe to post under the
//! bot's name: no live @user or @org/team mention, no HTML but the collapsed-section tags, no
//! link, image, autolink or cross-reference, no math, diagram, map or 3D model, no hidden or
//! bidi characters, and a size cap both on what is read and on what is posted.
//!
//! Fenced code blocks without an info string are where GitHub renders nothing, so their content
//! is kept as it is; to make sure GitHub sees the same blocks as this code does, every block is
//! written back with a fresh fence at the start of the line, longer than any run of backticks
//! inside it, and no info string: a `mermaid`, `math`, `geojson`, `topojson` or `stl` block
//! would be rendered as a diagram, formula, map or model (a fake banner, a fake table), and
//! syntax highlighting is not worth that. Outside the fences every line is escaped, and every
//! `$` becomes a full-width `＄`, so no `$…$`, `$$…$$` or `` $`…`$ `` math is rendered.

use std::io::Read;
use std::path::Path;

/// Bytes of the file read at most: the rest is never read.
pub const MAX_READ: u64 = 48 * 1024;
/// Characters of sanitised markdown posted at most (GitHub takes 65536 per comment, and the
/// bot adds its header).
pub const MAX_POST: usize = 60_000;

/// The only HTML kept: the collapsed sections the bot's own reply uses, without attributes.
const KEPT_TAGS: [&str; 4] = ["<details>", "</details>", "<summary>", "</summary>"];
/// Entities kept as they are (the reply's table cells use them); any other `&` is escaped, so
/// no entity can spell an `@` or a `<`.
const KEPT_ENTITIES: [&str; 4] = ["&lt;", "&gt;", "&amp;", "&quot;"];
/// What goes between the characters of an autolink or reference so GitHub sees none.
const BREAK: char = '\u{200b}';

/// Read at most [`MAX_READ`] bytes of `path` (a bigger file is cut, and said to be); invalid
/// UTF-8 becomes U+FFFD. Returns the text and whether it was cut.
pub fn read_capped(path: &Path) -> std::io::Result<(String, bool)> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_READ + 1)
        .read_to_end(&mut bytes)?;
    Ok(capped(&bytes))
}

/// The first [`MAX_READ`] bytes of `bytes` as text (invalid UTF-8 becomes U+FFFD), and whether
/// there was more.
pub fn capped(bytes: &[u8]) -> (String, bool) {
    let cut = bytes.len() as u64 > MAX_READ;
    let kept = &bytes[..bytes.len().min(MAX_READ as usize)];
    (String::from_utf8_lossy(kept).into_owned(), cut)
}

/// Characters that show as nothing, or as blank space that is not a space: Unicode's
/// Default_Ignorable_Code_Point set (zero-width characters and joiners, the bidi marks,
/// embeddings, overrides and isolates including the Arabic letter mark U+061C, the byte-order
/// mark, the soft hyphen, variation selectors such as U+FE0F, the tag characters
/// U+E0000..=U+E0FFF) and the fillers that render blank (the Hangul fillers U+115F, U+1160,
/// U+3164, U+FFA0; the Braille blank U+2800).
pub fn invisible(c: char) -> bool {
    matches!(c,
        '\u{ad}' | '\u{34f}' | '\u{61c}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
        | '\u{180b}'..='\u{180f}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}' | '\u{2800}' | '\u{3164}' | '\u{fe00}'..='\u{fe0f}' | '\u{feff}'
        | '\u{ffa0}' | '\u{fff0}'..='\u{fff8}' | '\u{1bca0}'..='\u{1bca3}'
        | '\u{1d173}'..='\u{1d17a}' | '\u{e0000}'..='\u{e0fff}')
}

/// Characters dropped everywhere: controls (but tab) and the [`invisible`] ones, which can
/// hide or reorder text.
pub(crate) fn dropped(c: char) -> bool {
    (c.is_control() && c != '\t') || invisible(c)
}

/// A fence opening (or closing) line: up to three spaces, then three or more backticks or
/// tildes. Returns the fence character and length and the rest of the line.
fn fence(line: &str) -> Option<(char, usize, &str)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let c = rest.chars().next().filter(|c| matches!(c, '`' | '~'))?;
    let n = rest.chars().take_while(|&x| x == c).count();
    (n >= 3).then_some((c, n, &rest[n..]))
}

fn longest_backticks(lines: &[String]) -> usize {
    let mut best = 0;
    for l in lines {
        let mut run = 0;
        for c in l.chars() {
            run = if c == '`' { run + 1 } else { 0 };
            best = best.max(run);
        }
    }
    best
}

/// A fenced block written back: after a blank line (which ends any HTML block, list, quote or
/// table a kept tag or a text line began, so the fence is seen as one), with a backtick fence
/// longer than any run inside, and no info string (the block's own is dropped: it could ask
/// GitHub to render the block as math, a diagram, a map or a model).
fn emit_block(out: &mut String, lines: &[String]) {
    let fence = "`".repeat(longest_backticks(lines).max(2) + 1);
    out.push('\n');
    out.push_str(&fence);
    out.push('\n');
    for l in lines {
        out.push_str(l);
        out.push('\n');
    }
    out.push_str(&fence);
    out.push('\n');
}

/// Whether `s` ends with `suffix`, ASCII case ignored.
fn ends_with_ci(s: &str, suffix: &str) -> bool {
    s.len() >= suffix.len()
        && s.is_char_boundary(s.len() - suffix.len())
        && s[s.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

/// Whether `s` starts with `prefix`, ASCII case ignored.
fn starts_with_ci(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len()
        && s.is_char_boundary(prefix.len())
        && s[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// `s` past the kept tags and entities at its start, in any ASCII case: the text that follows
/// them. A tag can vanish from the rendered HTML (an end tag that closes nothing is dropped by
/// HTML parsers; a table cell, list item or heading closes a collapsed section before its own
/// end tag comes), joining the text on both sides into one text node, where GitHub finds
/// references: so what makes a reference or a link is looked for past them, not in the next
/// raw character. (An entity does not vanish, but it is skipped too: a break too many is
/// harmless.)
fn past_markup(mut s: &str) -> &str {
    while let Some(m) = KEPT_TAGS
        .iter()
        .chain(KEPT_ENTITIES.iter())
        .find(|m| starts_with_ci(s, m))
    {
        s = &s[m.len()..];
    }
    s
}

/// A kept element: which tag opened it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Element {
    Details,
    Summary,
}

impl Element {
    fn end(self) -> &'static str {
        match self {
            Element::Details => KEPT_TAGS[1],
            Element::Summary => KEPT_TAGS[3],
        }
    }

    /// The element `tag` opens or closes, and whether it closes it.
    fn of(tag: &str) -> (Element, bool) {
        match tag {
            "<details>" => (Element::Details, false),
            "</details>" => (Element::Details, true),
            "<summary>" => (Element::Summary, false),
            _ => (Element::Summary, true),
        }
    }
}

/// The collapsed sections open in the output so far, innermost last. A kept tag is written
/// only where it cannot vanish from the rendered HTML: on a line that starts with one (an HTML
/// block at the top level, which no list item, quote, heading or table cell holds and closes),
/// a start tag, or an end tag that closes the innermost open element. Anything else (an end
/// tag that closes nothing, a tag inside a paragraph, a heading, a list or a table) is escaped
/// and shown as text. What is still open at the end is closed, so nothing the bot writes after
/// the output is folded into a section the output opened.
#[derive(Debug, Default)]
struct Open(Vec<Element>);

impl Open {
    /// Whether `tag`, met at this point of a line that may hold kept tags, is written; the
    /// open elements follow it.
    fn keep(&mut self, tag: &str) -> bool {
        match Element::of(tag) {
            (e, false) => {
                self.0.push(e);
                true
            }
            (e, true) if self.0.last() == Some(&e) => {
                self.0.pop();
                true
            }
            (_, true) => false,
        }
    }

    /// End tags for whatever is still open, innermost first, on a line of their own after a
    /// blank one (empty when nothing is open).
    fn close_all(&mut self) -> String {
        if self.0.is_empty() {
            return String::new();
        }
        let mut s = String::from("\n");
        while let Some(e) = self.0.pop() {
            s.push_str(e.end());
        }
        s.push('\n');
        s
    }
}

/// A line's output, and its text as an HTML parser would leave it should every kept tag in it
/// vanish: the checks for references and links look back in that.
#[derive(Default)]
struct Escaped {
    out: String,
    text: String,
}

impl Escaped {
    fn push(&mut self, c: char) {
        self.out.push(c);
        self.text.push(c);
    }

    fn push_str(&mut self, s: &str) {
        self.out.push_str(s);
        self.text.push_str(s);
    }

    fn push_tag(&mut self, tag: &str) {
        self.out.push_str(tag);
    }
}

/// One line outside the fences, escaped; `open` is what the lines before left open.
fn escape_line(line: &str, open: &mut Open) -> String {
    let mut e = Escaped::default();
    // Kept tags only on a line that starts with one: an HTML block at the top level.
    let tags_here = KEPT_TAGS.iter().any(|t| line.starts_with(t));
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        let len = c.len_utf8();
        let after = &rest[len..];
        // What follows `c` once kept tags and entities are out of the way.
        let next = past_markup(after);
        match c {
            // Mentions, team mentions and e-mail autolinks: a full-width at sign is never one.
            '@' => e.push('＠'),
            '<' => match KEPT_TAGS.iter().find(|t| rest.starts_with(*t)) {
                Some(tag) if tags_here && open.keep(tag) => {
                    e.push_tag(tag);
                    rest = &rest[tag.len()..];
                    continue;
                }
                _ => e.push_str("&lt;"),
            },
            '&' => match KEPT_ENTITIES.iter().find(|k| rest.starts_with(*k)) {
                Some(k) => {
                    e.push_str(k);
                    rest = &rest[k.len()..];
                    continue;
                }
                None => e.push_str("&amp;"),
            },
            // A backslash of the output would escape the one put before a `[` below, and
            // `\\[` is a literal backslash, then a live `[`: every backslash is escaped, but
            // the table cell's `\\|` (a pipe that is not a cell border), which links nothing.
            '\\' if after.starts_with('|') => {
                e.push_str("\\|");
                rest = &after[1..];
                continue;
            }
            '\\' => e.push_str("\\\\"),
            // Links, images, reference definitions and footnotes all need a `[`.
            '[' => e.push_str("\\["),
            // Inline and display math (`$…$`, `$$…$$`, `` $`…`$ ``) all need a `$`.
            '$' => e.push('＄'),
            // Bare URLs: `scheme://` and `www.` are what GitHub autolinks. A scheme without
            // `//` (`http:x`, `javascript:x`, `mailto:x`) is a link only inside `<…>` or a
            // link's `(…)`, which the escapes above rule out; it is broken too, so no other
            // renderer's autolinker finds one either.
            ':' if next.starts_with("//")
                || (e.text.ends_with(|p: char| p.is_ascii_alphabetic())
                    && next.starts_with(|n: char| !n.is_whitespace())) =>
            {
                e.push(':');
                e.push(BREAK);
            }
            '.' if ends_with_ci(&e.text, "www") => {
                e.push(BREAK);
                e.push('.');
            }
            // Cross-references (#12, GH-12, owner/repo#12, in any case) notify the referenced
            // issue; the number is looked for past any kept tag (which could vanish) and the
            // `GH` before the `-` in the text without them.
            '#' | '-' if next.starts_with(|d: char| d.is_ascii_digit()) => {
                e.push(c);
                if c == '#' || ends_with_ci(&e.text, "GH-") {
                    e.push(BREAK);
                }
            }
            c if dropped(c) => {}
            c => e.push(c),
        }
        rest = after;
    }
    e.out
}

/// An open fenced block: its fence, lines, and their size so far.
struct Block {
    c: char,
    n: usize,
    lines: Vec<String>,
    chars: usize,
    longest: usize,
}

impl Block {
    /// Characters it takes once written (blank line, two fences, newlines).
    fn size(&self) -> usize {
        self.chars + 2 * (self.longest.max(2) + 1) + 4
    }
}

/// Sanitised `md`, at most [`MAX_POST`] characters and a closing note (cut at a line, an
/// open block closed).
pub fn sanitize(md: &str) -> String {
    let mut out = String::new();
    let mut chars = 0usize;
    let mut block: Option<Block> = None;
    let mut open = Open::default();
    let mut cut = false;
    for line in md.lines() {
        // Within a block only controls and hidden characters go (a lone `\r`, a line end to
        // CommonMark, among them); the text is kept.
        let kept: String = line.chars().filter(|&c| !dropped(c)).collect();
        let piece = match &mut block {
            Some(b) => {
                let closes = fence(&kept).is_some_and(|(fc, fnum, rest)| {
                    fc == b.c && fnum >= b.n && rest.trim().is_empty()
                });
                if !closes {
                    let len = kept.chars().count() + 1;
                    let longest = b
                        .longest
                        .max(longest_backticks(std::slice::from_ref(&kept)));
                    if chars + b.size() + len + (longest - b.longest) * 2 > MAX_POST {
                        cut = true;
                        break;
                    }
                    b.chars += len;
                    b.longest = longest;
                    b.lines.push(kept);
                    continue;
                }
                let mut s = String::new();
                emit_block(&mut s, &b.lines);
                block = None;
                s
            }
            None => match fence(&kept) {
                Some((c, n, info)) if !(c == '`' && info.contains('`')) => {
                    block = Some(Block {
                        c,
                        n,
                        lines: Vec::new(),
                        chars: 0,
                        longest: 0,
                    });
                    continue;
                }
                _ => {
                    let mut s = escape_line(&kept, &mut open);
                    s.push('\n');
                    s
                }
            },
        };
        let len = piece.chars().count();
        if chars + len > MAX_POST {
            cut = true;
            break;
        }
        chars += len;
        out.push_str(&piece);
    }
    // A block still open at the end (or at the cut) is closed; its size was kept in budget.
    if let Some(b) = block {
        emit_block(&mut out, &b.lines);
    }
    out.push_str(&open.close_all());
    if cut {
        out.push_str("\n(cut: the rest is in the workflow run, unsanitised)\n");
    }
    out
}

/// The comment posted for a run: a header saying whose output this is, at which commit, and
/// the sanitised output. `run_url` and `commit` come from GitHub, not from the output.
pub fn wrap(output: &str, was_cut: bool, commit: &str, run_url: &str) -> String {
    let mut body = format!(
        "> [!NOTE]\n> The output of this pull request's own code at commit {commit}, run by \
         the bot in [this workflow run]({run_url}). Mentions, links, images and HTML in it are \
         disabled here; the run's step summary shows it unsanitised, as that code wrote it.\n\n"
    );
    body.push_str(&sanitize(output));
    if was_cut {
        body.push_str(
            "\n(the output was longer than the bot reads: the workflow run has it, unsanitised)\n",
        );
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What GitHub would see outside fenced blocks (as CommonMark finds fences).
    fn outside_fences(md: &str) -> String {
        let mut out = String::new();
        let mut open: Option<(char, usize)> = None;
        for line in md.lines() {
            match (open, fence(line)) {
                (None, Some((c, n, _))) => open = Some((c, n)),
                (None, None) => {
                    out.push_str(line);
                    out.push('\n');
                }
                (Some((c, n)), Some((fc, fnum, rest)))
                    if fc == c && fnum >= n && rest.trim().is_empty() =>
                {
                    open = None
                }
                (Some(_), _) => {}
            }
        }
        out
    }

    #[test]
    fn mentions_and_team_mentions_are_inert() {
        let s = sanitize("ping @alice and @org/team, mail a@b.com\n");
        assert!(!s.contains('@'), "{s}");
        assert!(s.contains("＠alice") && s.contains("＠org/team"), "{s}");
    }

    #[test]
    fn html_is_escaped_but_collapsed_sections() {
        let s = sanitize("<details><summary>x <img src=x onerror=y></summary>\n<a href=\"h\">a</a>\n</details>\n<DETAILS open>\n");
        assert!(s.starts_with("<details><summary>x &lt;img"), "{s}");
        assert!(s.contains("&lt;a href") && s.contains("&lt;/a>"), "{s}");
        assert!(s.contains("&lt;DETAILS open>"), "{s}");
        assert!(
            !s.replace(KEPT_TAGS[0], "")
                .replace(KEPT_TAGS[1], "")
                .replace(KEPT_TAGS[2], "")
                .replace(KEPT_TAGS[3], "")
                .contains('<'),
            "{s}"
        );
        // An entity cannot spell a mention or a tag.
        let s = sanitize("&#64;alice &#x3c;img&gt; &lt;ok&gt;\n");
        assert!(
            s.starts_with("&amp;#\u{200b}64;alice &amp;#x3c;img&gt; &lt;ok&gt;"),
            "{s}"
        );
    }

    #[test]
    fn references_are_broken_past_kept_tags_in_any_case() {
        // An end tag that closes nothing is dropped by HTML parsers, joining `#` and `1234`
        // into one text node: the break goes after the `#` (or `GH-`), whatever tags follow.
        for (input, want) in [
            ("#</summary>1234", "#\u{200b}&lt;/summary>1234\n"),
            ("GH-</details>99", "GH-\u{200b}&lt;/details>99\n"),
            (
                "owner/repo#</summary>7",
                "owner/repo#\u{200b}&lt;/summary>7\n",
            ),
            ("gh-</SUMMARY>5", "gh-\u{200b}&lt;/SUMMARY>5\n"),
            ("x #&amp;</details>6", "x #\u{200b}&amp;&lt;/details>6\n"),
        ] {
            assert_eq!(sanitize(input), want, "{input}");
        }
        // On a line of kept tags, where they are written as they are: the same.
        let s = sanitize("<details><summary>#</summary><summary>8</summary></details>\n");
        assert_eq!(
            s,
            "<details><summary>#\u{200b}</summary><summary>8</summary></details>\n"
        );
        // `GH` split by a tag, the `-` after one, a tag between two tags and the number.
        let s = sanitize("<details>G</details>H-9 <details>gh</details>-10\n");
        assert!(
            s.contains("H-\u{200b}9") && s.contains("-\u{200b}10"),
            "{s}"
        );
        let s = sanitize("<summary>#</summary></SUMMARY><details>11\n");
        assert!(s.starts_with("<summary>#\u{200b}</summary>"), "{s}");
        // A URL split the same way.
        let s = sanitize("<details>http:</details>//x <details>www</details>.y\n");
        assert!(s.contains("http:\u{200b}</details>//x"), "{s}");
        assert!(s.contains("www</details>\u{200b}.y"), "{s}");
        // Headings and plain numbers are left alone.
        assert_eq!(sanitize("### 3 of 4 passed\n"), "### 3 of 4 passed\n");
    }

    #[test]
    fn kept_tags_are_written_only_where_they_cannot_vanish() {
        // An end tag that closes nothing, or not the innermost open element: escaped.
        let s = sanitize("</summary>a\n<details></summary></details>\n</details>\n");
        assert_eq!(
            s,
            "&lt;/summary>a\n<details>&lt;/summary></details>\n&lt;/details>\n"
        );
        // Inside a paragraph, a heading, a list, a quote or a table (whose end closes the
        // section first): escaped; on a line that starts with one, balanced, across lines.
        for line in [
            "text <details>",
            "### <summary>x",
            "- <details>",
            "> <details>",
            "| <details> |",
        ] {
            let s = sanitize(&format!("{line}\n"));
            assert!(!s.contains("<details>") && !s.contains("<summary>"), "{s}");
        }
        let s = sanitize("<details><summary>t</summary>\n\n| a |\n|---|\n| b |\n</details>\n");
        assert_eq!(
            s,
            "<details><summary>t</summary>\n\n| a |\n|---|\n| b |\n</details>\n"
        );
        // What the output leaves open is closed before anything the bot adds after it.
        let s = sanitize("<details><summary>x\n");
        assert_eq!(s, "<details><summary>x\n\n</summary></details>\n");
        let b = wrap("<details>\nhidden\n", true, &"0".repeat(40), "u");
        assert!(
            b.ends_with("hidden\n\n</details>\n\n(the output was longer than the bot reads: the workflow run has it, unsanitised)\n"),
            "{b}"
        );
    }

    #[test]
    fn links_images_and_autolinks_are_inert() {
        let s = sanitize(
            "[click](https://evil.example) ![img](https://evil.example/x.png)\n[ref]: https://e.example\nsee www.evil.example or http://x.example <https://y.example>\nfixes #12 and org/repo#3, GH-4\n",
        );
        for live in ["https://", "http://", "www.", "<https", "#12", "#3", "GH-4"] {
            assert!(!s.contains(live), "{live} in {s}");
        }
        // Every `[` (links, images, reference definitions) is escaped.
        assert_eq!(s.matches('[').count(), 3);
        assert_eq!(s.matches("\\[").count(), 3, "{s}");
        assert!(s.contains("\\[click](https:\u{200b}//evil.example)"), "{s}");
    }

    #[test]
    fn fenced_blocks_are_kept_and_cannot_be_escaped() {
        // Kept as they are, in a fresh fence.
        let s = sanitize("before\n```text\n<b>@x</b> [l](u)\n```\nafter @y\n");
        assert_eq!(s, "before\n\n```\n<b>@x</b> [l](u)\n```\nafter ＠y\n");
        // A block holding a longer fence gets a longer fence: the inner line cannot close it.
        let s = sanitize("````\n```\n@inside\n````\n@outside\n");
        assert_eq!(s, "\n````\n```\n@inside\n````\n＠outside\n");
        // A longer fence closes a shorter one (CommonMark): what follows is text.
        let s = sanitize("```\n`````\n@after\n");
        assert!(s.starts_with("\n```\n```\n＠after\n"), "{s}");
        // An indented or tilde fence is normalised; an unclosed one is closed.
        let s = sanitize("  ~~~~ rust {.x}\n@a\n~~~~~\n```\n@b");
        assert!(!outside_fences(&s).contains('@'), "{s}");
        assert!(s.starts_with("\n```\n@a\n```\n"), "{s}");
        // A backtick "fence" with backticks in its info string is not one (CommonMark): text.
        let s = sanitize("``` a`b\n@c\n");
        assert!(!s.contains('@'), "{s}");
    }

    #[test]
    fn no_block_is_rendered_as_math_a_diagram_a_map_or_a_model() {
        // GitHub renders these info strings; a fake "all passed" banner in a diagram, say.
        for info in [
            "mermaid",
            "math",
            "geojson",
            "topojson",
            "stl",
            " mermaid {init: x}",
            "MERMAID",
        ] {
            for fence in ["```", "~~~", "````"] {
                let s = sanitize(&format!("{fence}{info}\ngraph TD; A-->B\n{fence}\n"));
                assert_eq!(s, "\n```\ngraph TD; A-->B\n```\n", "{fence}{info}");
            }
        }
        // An unclosed one too.
        assert_eq!(sanitize("```math\nx^2"), "\n```\nx^2\n```\n");
    }

    #[test]
    fn math_outside_blocks_is_inert() {
        let s = sanitize("all $\\color{green}passed$ and $$\\text{ok}$$ and $`x`$\n");
        assert!(!s.contains('$'), "{s}");
        assert_eq!(
            s,
            "all ＄\\\\color{green}passed＄ and ＄＄\\\\text{ok}＄＄ and ＄`x`＄\n"
        );
        // In a block, a dollar is plain code and stays.
        assert_eq!(sanitize("```\n$x$\n```\n"), "\n```\n$x$\n```\n");
    }

    #[test]
    fn a_kept_tag_cannot_swallow_a_block() {
        // `<details>` starts an HTML block, which runs to the next blank line and would take
        // a fence after it as raw HTML: the block is written after a blank line.
        let s = sanitize("<details>\n```\n<img src=x>@team\n```\n</details>\n");
        assert!(
            s.starts_with("<details>\n\n```\n<img src=x>@team\n```\n"),
            "{s}"
        );
    }

    #[test]
    fn hidden_characters_are_dropped() {
        let s = sanitize("a\u{202e}b\u{200b}c\u{0}d\u{1b}[31m\u{feff}e\n```\nf\u{2066}g\n```\n");
        assert_eq!(s, "abcd\\[31me\n\n```\nfg\n```\n");
        // The Arabic letter mark, the Hangul filler, the tag characters (which can spell
        // hidden text), variation selectors: gone, in and out of blocks.
        let hidden = [
            '\u{61c}',
            '\u{3164}',
            '\u{e0000}',
            '\u{e0041}',
            '\u{e007f}',
            '\u{fe0f}',
            '\u{fe00}',
            '\u{115f}',
            '\u{1160}',
            '\u{ffa0}',
            '\u{180e}',
            '\u{34f}',
            '\u{2800}',
            '\u{e0100}',
        ];
        for c in hidden {
            let s = sanitize(&format!("a{c}b\n```\nc{c}d\n```\n"));
            assert_eq!(s, "ab\n\n```\ncd\n```\n", "{c:?}");
        }
        // Visible text is kept: letters, CJK, emoji, the full-width at sign.
        let s = sanitize("ok 日本 ✅ ＠\n");
        assert_eq!(s, "ok 日本 ✅ ＠\n");
    }

    #[test]
    fn output_is_capped_and_blocks_closed() {
        let long = format!("```\n{}", "@x\n".repeat(40_000));
        let s = sanitize(&long);
        assert!(s.chars().count() <= MAX_POST + 100, "{}", s.len());
        assert!(
            s.ends_with("```\n\n(cut: the rest is in the workflow run, unsanitised)\n"),
            "{}",
            &s[s.len() - 80..]
        );
        assert!(!outside_fences(&s).contains('@'));
        // Escaping grows text (`<` is four bytes out): the cap is on what is posted.
        let s = sanitize(&format!("{}\n", "<".repeat(14_000)).repeat(3));
        assert_eq!(s.matches("&lt;").count(), 14_000, "one line of three fits");
        assert!(s.ends_with("(cut: the rest is in the workflow run, unsanitised)\n"));
    }

    #[test]
    fn reads_are_capped() {
        let dir = std::env::temp_dir().join(format!("attn-ci-sanitize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.md");
        std::fs::write(&big, "a".repeat(MAX_READ as usize + 10)).unwrap();
        let (text, cut) = read_capped(&big).unwrap();
        assert_eq!((text.len() as u64, cut), (MAX_READ, true));
        let small = dir.join("small.md");
        std::fs::write(&small, "hi\n").unwrap();
        assert_eq!(read_capped(&small).unwrap(), ("hi\n".to_string(), false));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_header_names_the_commit_and_the_run() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let b = wrap(
            "### attn-diff: all passed\n@x\n",
            false,
            sha,
            "https://github.com/o/r/actions/runs/1",
        );
        assert!(b.starts_with("> [!NOTE]\n> The output of this pull request's own code at commit 0123456789abcdef0123456789abcdef01234567,"), "{b}");
        assert!(b.contains("](https://github.com/o/r/actions/runs/1)"));
        assert!(b.contains("### attn-diff: all passed\n＠x\n"), "{b}");
        assert!(wrap("x", true, sha, "u").contains("longer than the bot reads"));
        // The run's pages show the output as the pull request's code wrote it: said so.
        assert!(b.contains("step summary shows it unsanitised"), "{b}");
    }
}
