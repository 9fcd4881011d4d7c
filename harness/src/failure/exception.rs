//! A crash is its exception. A backend that fails answers with whatever it printed: a Python
//! traceback (whose first line is the same for every exception), a C++ error with its
//! backtrace, a one-line message. What tells one crash from another is what was raised: a
//! traceback's last exception and its message, without the frames above it or the C++
//! backtrace below it, and with the numbers, addresses and paths that differ from one case
//! to the next taken out.

/// The exception of a failure's message: what its report leads with and its class keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exception {
    /// The exception as raised, its lines joined by ` / ` (at most [`SUMMARY_CHARS`]).
    pub summary: String,
    /// [`Exception::summary`] normalised: digits, hex addresses and file paths each made `#`.
    pub key: String,
    /// Whether the message held more than the exception (frames, a backtrace) that the
    /// report keeps below it.
    pub has_traceback: bool,
}

/// Longest summary a report's headline or a class carries.
pub const SUMMARY_CHARS: usize = 300;

/// Lines of an exception's message kept (a long one is cut after these).
const EXCEPTION_LINES: usize = 6;

impl Exception {
    pub fn of(message: &str) -> Exception {
        let lines: Vec<&str> = message.lines().collect();
        let block = exception_block(&lines);
        let mut summary = block.join(" / ");
        if summary.chars().count() > SUMMARY_CHARS {
            summary = summary.chars().take(SUMMARY_CHARS - 1).collect::<String>() + "…";
        }
        Exception {
            key: normalised(&summary),
            has_traceback: block.len() < lines.iter().filter(|l| !l.trim().is_empty()).count(),
            summary,
        }
    }
}

/// The lines that say what was raised: after a Python traceback's last frame, the exception
/// line and its message (up to a C++ backtrace, at most [`EXCEPTION_LINES`]); in any other
/// message, its first line.
fn exception_block<'a>(lines: &[&'a str]) -> Vec<&'a str> {
    let last_frame = lines
        .iter()
        .rposition(|l| l.trim_start().starts_with("File \"") && l.starts_with(' '));
    let Some(frame) = last_frame else {
        return lines
            .iter()
            .find(|l| !l.trim().is_empty())
            .map(|l| vec![l.trim()])
            .unwrap_or_default();
    };
    // A frame's source line and its `^^^` markers are indented; the exception is not.
    let start = lines[frame + 1..]
        .iter()
        .position(|l| !l.starts_with(' ') && !l.trim().is_empty())
        .map(|i| frame + 1 + i);
    let Some(start) = start else {
        return vec![lines[frame].trim()];
    };
    lines[start..]
        .iter()
        .take_while(|l| !is_backtrace(l))
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .take(EXCEPTION_LINES)
        .collect()
}

/// Where a C++ exception's backtrace starts (torch's `Exception raised from …`, `frame #0`).
fn is_backtrace(line: &str) -> bool {
    let l = line.trim_start();
    l.starts_with("Exception raised from ") || l.starts_with("frame #")
}

/// `text` with each run of digits, each hex address (`0x7ffd…`) and each file path made `#`:
/// "index -1 is out of bounds for dimension 0 with size 40" in one case and "… size 96" in
/// another are one exception.
pub fn normalised(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut prev: Option<char> = None;
    while let Some(c) = chars.next() {
        let starts_word = prev.is_none_or(|p| p.is_whitespace() || "('\"[=:,".contains(p));
        if c == '0' && chars.peek() == Some(&'x') {
            chars.next();
            while chars.peek().is_some_and(|d| d.is_ascii_hexdigit()) {
                chars.next();
            }
            push_hash(&mut out);
        } else if c == '/' && starts_word {
            // A path runs to the next space, quote or bracket (its line number, after a
            // colon, is a number and goes with it).
            while chars
                .peek()
                .is_some_and(|d| !d.is_whitespace() && !"'\")],".contains(*d))
            {
                chars.next();
            }
            push_hash(&mut out);
        } else if c.is_ascii_digit() {
            push_hash(&mut out);
        } else {
            out.push(c);
        }
        prev = Some(c);
    }
    out
}

fn push_hash(out: &mut String) {
    if !out.ends_with('#') {
        out.push('#');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traceback(exception: &str) -> String {
        format!(
            "external:p3 failed: Traceback (most recent call last):\n  File \"/opt/x/adapter.py\", line 697, in serve\n    out, seconds = run_case(adapter, meta)\n                   ^^^^^^^^^^^^^^^^^^^^^^^\n  File \"/opt/x/spyre_attn.py\", line 41, in forward\n    cache.index_copy_(0, slots, k)\n{exception}\n"
        )
    }

    #[test]
    fn a_python_crash_is_its_last_line_not_the_traceback_header() {
        let a = Exception::of(&traceback(
            "IndexError: index_copy_(): index -1 is out of bounds for dimension 0 with size 40",
        ));
        let b = Exception::of(&traceback(
            "RuntimeError: The size of tensor a (192) must match the size of tensor b (64) at non-singleton dimension 3",
        ));
        assert_eq!(
            a.summary,
            "IndexError: index_copy_(): index -1 is out of bounds for dimension 0 with size 40"
        );
        assert!(a.has_traceback);
        assert_ne!(a.key, b.key);
        assert!(
            b.key.starts_with("RuntimeError: The size of tensor a (#)"),
            "{}",
            b.key
        );
        // The same exception with other numbers is one.
        let c = Exception::of(&traceback(
            "IndexError: index_copy_(): index -1 is out of bounds for dimension 0 with size 96",
        ));
        assert_eq!(a.key, c.key);
    }

    #[test]
    fn a_multi_line_exception_keeps_its_lines_and_drops_a_cpp_backtrace() {
        let e = Exception::of(&traceback(
            "RuntimeError: Exception from src/inference/src/cpp/infer_request.cpp:223:\nException from src/plugins/intel_cpu/src/node.cpp:792:\n[CPU] expect kvcache type bf16, current: f32, f32\n\nException raised from check at /pytorch/c10/x.cpp:12 (most recent call first):\nframe #0: c10::Error::Error() + 0x7ffd3a",
        ));
        assert!(
            e.summary
                .ends_with("expect kvcache type bf16, current: f32, f32"),
            "{}",
            e.summary
        );
        assert!(!e.summary.contains("frame #"), "{}", e.summary);
        let other = Exception::of(&traceback(
            "RuntimeError: Exception from src/inference/src/cpp/infer_request.cpp:223:\nException from src/plugins/intel_cpu/src/node.cpp:792:\n[CPU] head size 13 is not supported",
        ));
        assert_ne!(e.key, other.key);
    }

    #[test]
    fn a_chained_exception_is_the_last_one() {
        let message = format!(
            "{}\nDuring handling of the above exception, another exception occurred:\n\n{}",
            traceback("KeyError: 'slot'").trim_end(),
            traceback("ValueError: no slot for token 7").replace("external:p3 failed: ", "")
        );
        assert_eq!(
            Exception::of(&message).summary,
            "ValueError: no slot for token 7"
        );
    }

    #[test]
    fn a_one_line_error_is_itself_with_numbers_addresses_and_paths_out() {
        let e =
            Exception::of("cpu failed: segfault at 0x7ffd3a20 in /tmp/build-8812/libk.so:88\nmore");
        assert_eq!(
            e.summary,
            "cpu failed: segfault at 0x7ffd3a20 in /tmp/build-8812/libk.so:88"
        );
        assert_eq!(e.key, "cpu failed: segfault at # in #");
        assert_eq!(normalised("a batch of 3 and 15"), "a batch of # and #");
        // A slash inside a word is not a path.
        assert_eq!(normalised("q/k ratio 4"), "q/k ratio #");
    }
}
