//! GitHub's timestamps (`2024-05-01T12:34:56Z`, RFC 3339) as seconds since the Unix epoch, to
//! compare a comment's time with a push's or a job's. No calendar crate: the bot's crate stays
//! light, and GitHub writes one format.

use thiserror::Error;

#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("`{0}` is not an RFC 3339 time (YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM))")]
pub struct TimeError(pub String);

/// Seconds since 1970-01-01T00:00:00Z (fractions of a second dropped).
pub fn parse_time(s: &str) -> Result<i64, TimeError> {
    let bad = || TimeError(s.chars().take(40).collect());
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return Err(bad());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, TimeError> {
        let part = s.get(r).ok_or_else(bad)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse().map_err(|_| bad())
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=days_in_month(y, mo)).contains(&d) {
        return Err(bad());
    }
    if h > 23 || mi > 59 || sec > 60 {
        return Err(bad());
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let r = rest.as_bytes();
            if r.len() != 6 || !matches!(r[0], b'+' | b'-') || r[3] != b':' {
                return Err(bad());
            }
            let oh: i64 = rest[1..3].parse().map_err(|_| bad())?;
            let om: i64 = rest[4..6].parse().map_err(|_| bad())?;
            if oh > 23 || om > 59 {
                return Err(bad());
            }
            let o = oh * 3600 + om * 60;
            if r[0] == b'+' {
                o
            } else {
                -o
            }
        }
    };
    Ok(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian; H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_time("2000-03-01T00:00:00Z"), Ok(951_868_800));
        assert_eq!(parse_time("2024-02-29T23:59:59Z"), Ok(1_709_251_199));
        // The same instant in other spellings.
        assert_eq!(parse_time("2024-03-01T01:00:00+01:00"), Ok(1_709_251_200));
        assert_eq!(
            parse_time("2024-02-29T23:00:00.999-01:00"),
            Ok(1_709_251_200)
        );
    }

    #[test]
    fn malformed_times_are_errors() {
        for s in [
            "",
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-01-01 00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+1:00",
            "+024-01-01T00:00:00Z",
        ] {
            assert!(parse_time(s).is_err(), "{s}");
        }
    }
}
