//! An artifact as the posting workflow reads it: the zip file itself, downloaded without being
//! extracted (`actions/download-artifact` with `skip-decompress`), then read here, in memory,
//! and never written out as files. The pull request's code can upload or replace any artifact
//! of its run, so every zip is hostile until checked: whatever the archive says, no entry can
//! name a place to write to, because nothing is written, and an entry is refused (with the
//! whole artifact) unless
//!
//! - its name is safe: relative, `/`-separated, with no empty, `.` or `..` component, no `\`,
//!   `:`, control or invisible character, no leading `/` (the path traversal that extractors
//!   such as unzip-stream 0.3.1 only half-strip);
//! - its name is one the caller expects, at most once;
//! - it is a plain file (no directory, no symbolic link), stored or deflated, not encrypted,
//!   within the size cap, and its content matches the sizes and CRC-32 the archive records.
//!
//! The archive itself must be one plain file in an otherwise empty folder, within a size cap,
//! with one central directory that ends the file (no ZIP64, no multi-disk archive, no data
//! after the end record), and each local header must agree with its central directory entry.

use std::io::Read;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Entries one artifact may hold.
pub const MAX_ENTRIES: usize = 16;
/// Length of an entry name shown in an error.
const MAX_SHOWN: usize = 80;

const EOCD_SIG: u32 = 0x0605_4b50;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
const EOCD_LEN: usize = 22;
const CENTRAL_LEN: usize = 46;
const LOCAL_LEN: usize = 30;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ArtifactError {
    #[error("cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{dir} holds {found} entries; the download must be exactly one file")]
    NotOneFile { dir: PathBuf, found: usize },
    #[error("{0} is not a plain file")]
    NotAFile(PathBuf),
    #[error("the artifact is bigger than {max} bytes")]
    TooBig { max: u64 },
    #[error("not a zip archive the bot reads: {0}")]
    NotAZip(&'static str),
    #[error("entry `{0}` has an unsafe name (absolute, `..`, `.`, `\\`, `:`, an empty component, or a hidden character)")]
    UnsafeName(String),
    #[error("entry `{0}` is not one of the files the bot expects")]
    Unexpected(String),
    #[error("entry `{0}` is in the archive twice")]
    Duplicate(String),
    #[error("entry `{name}`: {what}")]
    Bad { name: String, what: &'static str },
    #[error("more than {MAX_ENTRIES} entries")]
    TooManyEntries,
}

/// The files read from an artifact: expected names only, each at most once.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Files(Vec<(String, Vec<u8>)>);

impl Files {
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d.as_slice())
    }

    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _)| n.as_str()).collect()
    }
}

/// A name as an error shows it: printable ASCII kept, anything else spelled `\u{..}`, cut.
fn shown(name: &[u8]) -> String {
    let text = String::from_utf8_lossy(name);
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == MAX_SHOWN {
            out.push_str("...");
            break;
        }
        if c.is_ascii_graphic() || c == ' ' {
            out.push(c);
        } else {
            out.extend(c.escape_unicode());
        }
    }
    out
}

/// Whether an entry name is a safe relative path: `/`-separated components, none empty, `.` or
/// `..`; no `\` (a separator elsewhere), no `:` (a drive or a stream), no control or invisible
/// character, UTF-8.
pub fn safe_name(name: &[u8]) -> bool {
    let Ok(name) = std::str::from_utf8(name) else {
        return false;
    };
    !name.is_empty()
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
        && !name
            .chars()
            .any(|c| matches!(c, '\\' | ':') || c.is_control() || crate::sanitize::invisible(c))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|s| u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// The one file a download folder holds, read whole (at most `max` bytes).
pub fn read_download(dir: &Path, max: u64) -> Result<Vec<u8>, ArtifactError> {
    let read_err = |path: &Path, e: std::io::Error| ArtifactError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| read_err(dir, e))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(|e| read_err(dir, e))?;
    let [path] = &entries[..] else {
        return Err(ArtifactError::NotOneFile {
            dir: dir.to_path_buf(),
            found: entries.len(),
        });
    };
    // Not followed: a link is not a download.
    let meta = std::fs::symlink_metadata(path).map_err(|e| read_err(path, e))?;
    if !meta.file_type().is_file() {
        return Err(ArtifactError::NotAFile(path.clone()));
    }
    if meta.len() > max {
        return Err(ArtifactError::TooBig { max });
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(|e| read_err(path, e))?;
    if bytes.len() as u64 > max {
        return Err(ArtifactError::TooBig { max });
    }
    Ok(bytes)
}

/// The end of central directory record: where the central directory is and how many entries
/// it has. The record must end the file (an archive comment is allowed).
fn end_record(zip: &[u8]) -> Result<(usize, usize, usize), ArtifactError> {
    let not_zip = ArtifactError::NotAZip;
    if zip.len() < EOCD_LEN {
        return Err(not_zip("too short"));
    }
    let lowest = zip.len().saturating_sub(EOCD_LEN + usize::from(u16::MAX));
    let at = (lowest..=zip.len() - EOCD_LEN)
        .rev()
        .find(|&i| {
            u32_at(zip, i) == Some(EOCD_SIG)
                && u16_at(zip, i + 20).map(usize::from) == Some(zip.len() - i - EOCD_LEN)
        })
        .ok_or(not_zip("no end of central directory record"))?;
    if at >= 20 && u32_at(zip, at - 20) == Some(ZIP64_LOCATOR_SIG) {
        return Err(not_zip("ZIP64 archives are not read"));
    }
    let field16 = |o| u16_at(zip, at + o).map(usize::from).unwrap_or(usize::MAX);
    let field32 = |o| {
        u32_at(zip, at + o)
            .map(|v| v as usize)
            .unwrap_or(usize::MAX)
    };
    let (disk, cd_disk, on_disk, total) = (field16(4), field16(6), field16(8), field16(10));
    let (cd_size, cd_offset) = (field32(12), field32(16));
    if disk != 0 || cd_disk != 0 || on_disk != total {
        return Err(not_zip("multi-disk archives are not read"));
    }
    if total == 0xffff || cd_size == 0xffff_ffff || cd_offset == 0xffff_ffff {
        return Err(not_zip("ZIP64 archives are not read"));
    }
    // The central directory ends where the end record starts: nothing hidden between them.
    if cd_offset.checked_add(cd_size) != Some(at) {
        return Err(not_zip(
            "the central directory is not where the end record says",
        ));
    }
    Ok((cd_offset, cd_size, total))
}

/// The expected files of a zip archive, each checked (see the module's documentation).
pub fn unzip(zip: &[u8], expected: &[&str], max_file: u64) -> Result<Files, ArtifactError> {
    let (cd_offset, cd_size, total) = end_record(zip)?;
    if total > MAX_ENTRIES {
        return Err(ArtifactError::TooManyEntries);
    }
    let cd_end = cd_offset + cd_size;
    let mut files = Files::default();
    let mut pos = cd_offset;
    for _ in 0..total {
        let truncated = ArtifactError::NotAZip("a central directory entry is cut short");
        if pos + CENTRAL_LEN > cd_end || u32_at(zip, pos) != Some(CENTRAL_SIG) {
            return Err(truncated);
        }
        let h16 = |o: usize| u16_at(zip, pos + o).unwrap_or(0);
        let h32 = |o: usize| u32_at(zip, pos + o).unwrap_or(0);
        let made_by_unix = h16(4) >> 8 == 3;
        let (flags, method, crc) = (h16(8), h16(10), h32(16));
        let (packed, size) = (u64::from(h32(20)), u64::from(h32(24)));
        let (name_len, extra_len, comment_len) = (
            usize::from(h16(28)),
            usize::from(h16(30)),
            usize::from(h16(32)),
        );
        let (external, local) = (h32(38), h32(42) as usize);
        let name_end = pos + CENTRAL_LEN + name_len;
        let next = name_end + extra_len + comment_len;
        if next > cd_end {
            return Err(truncated);
        }
        let raw_name = &zip[pos + CENTRAL_LEN..name_end];
        pos = next;

        // The name first: a traversal attempt is refused as such, whatever else is wrong.
        if !safe_name(raw_name) {
            return Err(ArtifactError::UnsafeName(shown(raw_name)));
        }
        let name = String::from_utf8_lossy(raw_name).into_owned();
        if !expected.contains(&name.as_str()) {
            return Err(ArtifactError::Unexpected(shown(raw_name)));
        }
        if files.get(&name).is_some() {
            return Err(ArtifactError::Duplicate(name));
        }
        let bad = |what| ArtifactError::Bad {
            name: name.clone(),
            what,
        };
        // A symbolic link (Unix mode S_IFLNK) or a directory is not a file.
        let mode = external >> 16;
        if (made_by_unix && mode & 0o170_000 == 0o120_000) || external & 0x10 != 0 {
            return Err(bad("not a plain file"));
        }
        if flags & 0x41 != 0 {
            return Err(bad("encrypted"));
        }
        if size > max_file {
            return Err(bad("bigger than the bot reads"));
        }
        if method == 0 && packed != size {
            return Err(bad("stored, but its sizes differ"));
        }

        // The local header must agree: same name, data inside the archive before the
        // central directory.
        if local + LOCAL_LEN > cd_offset || u32_at(zip, local) != Some(LOCAL_SIG) {
            return Err(bad("no local header where the central directory says"));
        }
        let local_name_len = usize::from(u16_at(zip, local + 26).unwrap_or(0));
        let local_extra_len = usize::from(u16_at(zip, local + 28).unwrap_or(0));
        let local_name = zip.get(local + LOCAL_LEN..local + LOCAL_LEN + local_name_len);
        if local_name != Some(raw_name) {
            return Err(bad("the local header names another file"));
        }
        let start = local + LOCAL_LEN + local_name_len + local_extra_len;
        let end = usize::try_from(packed)
            .ok()
            .and_then(|p| start.checked_add(p))
            .filter(|&e| e <= cd_offset)
            .ok_or_else(|| bad("its data runs past the archive"))?;
        let data = &zip[start..end];
        let content = match method {
            0 => data.to_vec(),
            8 => miniz_oxide::inflate::decompress_to_vec_with_limit(data, max_file as usize)
                .map_err(|_| bad("not valid deflate data, or bigger than the bot reads"))?,
            _ => return Err(bad("compressed with a method other than deflate")),
        };
        if content.len() as u64 != size {
            return Err(bad("its size is not the one the archive records"));
        }
        if crc32fast::hash(&content) != crc {
            return Err(bad("its CRC-32 is not the one the archive records"));
        }
        files.0.push((name, content));
    }
    if pos != cd_end {
        return Err(ArtifactError::NotAZip(
            "the central directory holds more than its entries",
        ));
    }
    Ok(files)
}

/// The download folder `dir`'s one zip, read and checked: [`read_download`] then [`unzip`].
pub fn read_artifact(
    dir: &Path,
    max_zip: u64,
    expected: &[&str],
    max_file: u64,
) -> Result<Files, ArtifactError> {
    unzip(&read_download(dir, max_zip)?, expected, max_file)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An entry of a test archive: name, content, and how to store it.
    pub(crate) struct Entry<'a> {
        pub name: &'a [u8],
        pub data: &'a [u8],
        pub deflate: bool,
        pub unix_mode: Option<u32>,
    }

    impl<'a> Entry<'a> {
        pub fn file(name: &'a str, data: &'a [u8]) -> Self {
            Entry {
                name: name.as_bytes(),
                data,
                deflate: true,
                unix_mode: None,
            }
        }
    }

    /// A zip archive as upload-artifact writes one (deflate, a central directory at the end).
    pub(crate) fn zip(entries: &[Entry]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut central = Vec::new();
        for e in entries {
            let packed = if e.deflate {
                miniz_oxide::deflate::compress_to_vec(e.data, 6)
            } else {
                e.data.to_vec()
            };
            let method: u16 = if e.deflate { 8 } else { 0 };
            let crc = crc32fast::hash(e.data);
            let offset = out.len() as u32;
            out.extend(LOCAL_SIG.to_le_bytes());
            out.extend(20u16.to_le_bytes());
            out.extend(0u16.to_le_bytes()); // flags
            out.extend(method.to_le_bytes());
            out.extend([0u8; 4]); // time, date
            out.extend(crc.to_le_bytes());
            out.extend((packed.len() as u32).to_le_bytes());
            out.extend((e.data.len() as u32).to_le_bytes());
            out.extend((e.name.len() as u16).to_le_bytes());
            out.extend(0u16.to_le_bytes());
            out.extend(e.name);
            out.extend(&packed);

            let made_by: u16 = if e.unix_mode.is_some() {
                0x031e
            } else {
                0x0014
            };
            central.extend(CENTRAL_SIG.to_le_bytes());
            central.extend(made_by.to_le_bytes());
            central.extend(20u16.to_le_bytes());
            central.extend(0u16.to_le_bytes());
            central.extend(method.to_le_bytes());
            central.extend([0u8; 4]);
            central.extend(crc.to_le_bytes());
            central.extend((packed.len() as u32).to_le_bytes());
            central.extend((e.data.len() as u32).to_le_bytes());
            central.extend((e.name.len() as u16).to_le_bytes());
            central.extend([0u8; 8]); // extra, comment, disk, internal attributes
            central.extend((e.unix_mode.unwrap_or(0) << 16).to_le_bytes());
            central.extend(offset.to_le_bytes());
            central.extend(e.name);
        }
        let cd_offset = out.len() as u32;
        out.extend(&central);
        out.extend(EOCD_SIG.to_le_bytes());
        out.extend([0u8; 4]);
        out.extend((entries.len() as u16).to_le_bytes());
        out.extend((entries.len() as u16).to_le_bytes());
        out.extend((central.len() as u32).to_le_bytes());
        out.extend(cd_offset.to_le_bytes());
        out.extend(0u16.to_le_bytes());
        out
    }

    const EXPECTED: [&str; 2] = ["reply.md", "status.json"];

    fn read(entries: &[Entry]) -> Result<Files, ArtifactError> {
        unzip(&zip(entries), &EXPECTED, 1024)
    }

    #[test]
    fn expected_files_are_read_in_memory() {
        let f = read(&[
            Entry::file("reply.md", b"### hi\n"),
            Entry {
                deflate: false,
                ..Entry::file("status.json", b"{}")
            },
        ])
        .unwrap();
        assert_eq!(f.get("reply.md"), Some(&b"### hi\n"[..]));
        assert_eq!(f.get("status.json"), Some(&b"{}"[..]));
        assert_eq!(f.names(), ["reply.md", "status.json"]);
        // Fewer than expected is fine: the caller decides what a missing file means.
        assert_eq!(read(&[]).unwrap(), Files::default());
    }

    #[test]
    fn traversal_and_absolute_names_are_refused() {
        for name in [
            "x/../../target/debug/attn-bot",
            "x/../../bot-request/request.json",
            "../reply.md",
            "../../reply.md",
            "./reply.md",
            "a/./reply.md",
            "..",
            "/reply.md",
            "/etc/passwd",
            "//reply.md",
            "\\reply.md",
            "..\\..\\reply.md",
            "x\\..\\reply.md",
            "C:/reply.md",
            "C:reply.md",
            "a//reply.md",
            "reply.md/",
            "",
            "reply.md\0.txt",
            "reply\u{202e}dm.md",
            "reply\u{e0041}.md",
        ] {
            let e = read(&[Entry::file(name, b"x")]).unwrap_err();
            assert!(matches!(e, ArtifactError::UnsafeName(_)), "{name:?}: {e:?}");
        }
        // Even behind an expected entry.
        let e = read(&[
            Entry::file("reply.md", b"ok"),
            Entry::file("x/../../.cargo/bin/cargo", b"#!/bin/sh"),
        ])
        .unwrap_err();
        assert!(matches!(e, ArtifactError::UnsafeName(_)), "{e:?}");
        // Not UTF-8.
        let e = read(&[Entry {
            name: b"reply\xff.md",
            ..Entry::file("", b"x")
        }])
        .unwrap_err();
        assert!(matches!(e, ArtifactError::UnsafeName(_)), "{e:?}");
    }

    #[test]
    fn error_messages_show_names_inert() {
        let e = read(&[Entry::file("../\u{202e}@team `x`\n", b"x")]).unwrap_err();
        let text = e.to_string();
        assert!(!text.contains('\u{202e}') && !text.contains('\n'), "{text}");
        assert!(text.contains("\\u{202e}"), "{text}");
    }

    #[test]
    fn only_expected_plain_files_once() {
        let e = read(&[Entry::file("summary.json", b"{}")]).unwrap_err();
        assert_eq!(e, ArtifactError::Unexpected("summary.json".into()));
        let e = read(&[Entry::file("sub/reply.md", b"x")]).unwrap_err();
        assert!(matches!(e, ArtifactError::Unexpected(_)), "{e:?}");
        let e = read(&[Entry::file("reply.md", b"a"), Entry::file("reply.md", b"b")]).unwrap_err();
        assert_eq!(e, ArtifactError::Duplicate("reply.md".into()));
        // A symbolic link, whatever it points at.
        let e = read(&[Entry {
            unix_mode: Some(0o120_777),
            ..Entry::file("reply.md", b"/etc/shadow")
        }])
        .unwrap_err();
        assert!(
            matches!(
                e,
                ArtifactError::Bad {
                    what: "not a plain file",
                    ..
                }
            ),
            "{e:?}"
        );
        let many: Vec<Entry> = (0..=MAX_ENTRIES)
            .map(|_| Entry::file("reply.md", b""))
            .collect();
        assert_eq!(read(&many).unwrap_err(), ArtifactError::TooManyEntries);
    }

    #[test]
    fn sizes_and_checksums_must_hold() {
        // Bigger than the cap once inflated (a zip bomb is cut at the cap).
        let big = vec![b'a'; 4096];
        let e = read(&[Entry::file("reply.md", &big)]).unwrap_err();
        assert!(matches!(e, ArtifactError::Bad { .. }), "{e:?}");
        // A flipped byte of content: the CRC-32 no longer matches.
        let mut z = zip(&[Entry {
            deflate: false,
            ..Entry::file("reply.md", b"hello")
        }]);
        let at = z.windows(5).position(|w| w == b"hello").unwrap();
        z[at] = b'j';
        let e = unzip(&z, &EXPECTED, 1024).unwrap_err();
        assert!(
            matches!(e, ArtifactError::Bad { what, .. } if what.contains("CRC")),
            "{e:?}"
        );
        // Encrypted.
        let mut z = zip(&[Entry::file("reply.md", b"x")]);
        let cd = z
            .windows(4)
            .rposition(|w| w == CENTRAL_SIG.to_le_bytes())
            .unwrap();
        z[cd + 8] |= 1;
        let e = unzip(&z, &EXPECTED, 1024).unwrap_err();
        assert!(
            matches!(
                e,
                ArtifactError::Bad {
                    what: "encrypted",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn the_archive_must_be_one_plain_zip() {
        assert!(matches!(
            unzip(b"not a zip at all, just text", &EXPECTED, 1024),
            Err(ArtifactError::NotAZip(_))
        ));
        // Data after the end record, or a central directory elsewhere than it says.
        let mut z = zip(&[Entry::file("reply.md", b"x")]);
        z.extend(b"trailing");
        assert!(matches!(
            unzip(&z, &EXPECTED, 1024),
            Err(ArtifactError::NotAZip(_))
        ));
        let mut z = zip(&[Entry::file("reply.md", b"x")]);
        let n = z.len();
        z[n - 6] ^= 1; // the central directory's offset
        assert!(matches!(
            unzip(&z, &EXPECTED, 1024),
            Err(ArtifactError::NotAZip(_))
        ));
        // The local header naming another file than the central directory.
        let mut z = zip(&[Entry::file("reply.md", b"x")]);
        z[LOCAL_LEN] = b'R';
        let e = unzip(&z, &EXPECTED, 1024).unwrap_err();
        assert!(matches!(e, ArtifactError::Bad { .. }), "{e:?}");
    }

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("attn-ci-artifact-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_download_is_one_file_in_its_folder() {
        let d = temp("one");
        std::fs::write(
            d.join("bot-result.zip"),
            zip(&[Entry::file("reply.md", b"hi")]),
        )
        .unwrap();
        let f = read_artifact(&d, 1 << 20, &EXPECTED, 1024).unwrap();
        assert_eq!(f.get("reply.md"), Some(&b"hi"[..]));
        // Too big.
        assert_eq!(
            read_artifact(&d, 10, &EXPECTED, 1024),
            Err(ArtifactError::TooBig { max: 10 })
        );
        // Two files.
        std::fs::write(d.join("other"), b"x").unwrap();
        assert!(matches!(
            read_download(&d, 1 << 20),
            Err(ArtifactError::NotOneFile { found: 2, .. })
        ));
        let _ = std::fs::remove_dir_all(&d);
        // Empty, or missing.
        let d = temp("empty");
        assert!(matches!(
            read_download(&d, 1 << 20),
            Err(ArtifactError::NotOneFile { found: 0, .. })
        ));
        let _ = std::fs::remove_dir_all(&d);
        assert!(matches!(
            read_download(&d, 1 << 20),
            Err(ArtifactError::Read { .. })
        ));
        // A link or a folder is not the download.
        let d = temp("link");
        std::os::unix::fs::symlink("/etc/hostname", d.join("a.zip")).unwrap();
        assert!(matches!(
            read_download(&d, 1 << 20),
            Err(ArtifactError::NotAFile(_))
        ));
        let _ = std::fs::remove_dir_all(&d);
        let d = temp("dir");
        std::fs::create_dir(d.join("a.zip")).unwrap();
        assert!(matches!(
            read_download(&d, 1 << 20),
            Err(ArtifactError::NotAFile(_))
        ));
        let _ = std::fs::remove_dir_all(&d);
    }
}
