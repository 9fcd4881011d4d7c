//! The last bytes an adapter wrote to stderr, kept in a bounded ring so a chatty adapter
//! cannot grow attn-diff's memory, and reported when it crashes.

use std::collections::VecDeque;

/// Bytes of stderr kept.
pub const STDERR_TAIL_BYTES: usize = 16 * 1024;
/// Lines of the tail shown in a report.
pub const REPORTED_LINES: usize = 40;

#[derive(Debug, Default)]
pub struct StderrTail {
    buf: VecDeque<u8>,
    dropped: u64,
}

impl StderrTail {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend(bytes);
        let over = self.buf.len().saturating_sub(STDERR_TAIL_BYTES);
        if over > 0 {
            self.buf.drain(..over);
            self.dropped += over as u64;
        }
    }

    /// The last [`REPORTED_LINES`] lines, or "" when the adapter wrote nothing.
    pub fn tail(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        let lines: Vec<&str> = text.trim_end().lines().collect();
        let skip = lines.len().saturating_sub(REPORTED_LINES);
        let mut out = String::new();
        if skip > 0 || self.dropped > 0 {
            out.push_str("[...]\n");
        }
        out.push_str(&lines[skip..].join("\n"));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_lines_only() {
        let mut t = StderrTail::default();
        assert_eq!(t.tail(), "");
        for i in 0..5000 {
            t.push(format!("line {i}\n").as_bytes());
        }
        let tail = t.tail();
        assert!(tail.starts_with("[...]\n"));
        assert!(tail.ends_with("line 4999"));
        assert_eq!(tail.lines().count(), REPORTED_LINES + 1);
    }
}
