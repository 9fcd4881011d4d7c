//! Framing on the adapter's pipes: every message is an 8-byte little-endian unsigned length
//! followed by that many bytes (a safetensors payload).

use std::io::{self, Read, Write};

/// The largest frame either side accepts. Anything larger is almost certainly text written to
/// stdout by mistake (a stray `print`), read as a length.
pub const MAX_FRAME_BYTES: u64 = 1 << 32;

/// What reading one frame found.
#[derive(Debug)]
pub enum FrameRead {
    Frame(Vec<u8>),
    /// The stream ended cleanly between frames.
    Eof,
    /// The stream ended inside a frame.
    Truncated {
        expected: u64,
        got: u64,
    },
    /// The length prefix is beyond [`MAX_FRAME_BYTES`]; `head` holds its 8 bytes.
    TooLarge {
        len: u64,
        head: [u8; 8],
    },
    Io(io::Error),
}

pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    w.write_all(&(payload.len() as u64).to_le_bytes())?;
    w.write_all(payload)?;
    w.flush()
}

/// Read until `buf` is full or the stream ends; the number of bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

pub fn read_frame(r: &mut impl Read) -> FrameRead {
    let mut head = [0u8; 8];
    match read_full(r, &mut head) {
        Ok(0) => return FrameRead::Eof,
        Ok(8) => {}
        Ok(n) => {
            return FrameRead::Truncated {
                expected: 8,
                got: n as u64,
            }
        }
        Err(e) => return FrameRead::Io(e),
    }
    let len = u64::from_le_bytes(head);
    if len > MAX_FRAME_BYTES {
        return FrameRead::TooLarge { len, head };
    }
    let mut payload = vec![0u8; len as usize];
    match read_full(r, &mut payload) {
        Ok(n) if n as u64 == len => FrameRead::Frame(payload),
        Ok(n) => FrameRead::Truncated {
            expected: len,
            got: n as u64,
        },
        Err(e) => FrameRead::Io(e),
    }
}

/// The 8 bytes of a bad length prefix as a reader would want to see them.
pub fn describe_head(head: &[u8; 8]) -> String {
    if head
        .iter()
        .all(|b| b.is_ascii_graphic() || *b == b' ' || *b == b'\n' || *b == b'\t')
    {
        format!("text {:?}", String::from_utf8_lossy(head))
    } else {
        format!("bytes {head:02x?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"abc").unwrap();
        write_frame(&mut buf, b"").unwrap();
        let mut r = &buf[..];
        assert!(matches!(read_frame(&mut r), FrameRead::Frame(f) if f == b"abc"));
        assert!(matches!(read_frame(&mut r), FrameRead::Frame(f) if f.is_empty()));
        assert!(matches!(read_frame(&mut r), FrameRead::Eof));
    }

    #[test]
    fn text_on_stdout_is_too_large_and_described_as_text() {
        let mut r = &b"hello world\n"[..];
        match read_frame(&mut r) {
            FrameRead::TooLarge { head, .. } => {
                assert_eq!(describe_head(&head), "text \"hello wo\"")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_cut_frame_is_truncated() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"abcdef").unwrap();
        buf.truncate(11);
        let mut r = &buf[..];
        assert!(matches!(
            read_frame(&mut r),
            FrameRead::Truncated {
                expected: 6,
                got: 3
            }
        ));
    }
}
