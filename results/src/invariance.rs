//! Invariance verdicts as data: how one relation's transformed runs compare with the
//! original bit for bit ([`Drift`]), and a backend's tally per relation.

use serde::{Deserialize, Serialize};

/// How far apart two f32 values are in units in the last place: the distance of their bit
/// patterns on the ordered line of floats (0 for equal bits; -0 and +0 are 1 apart, and
/// so are any two NaNs of different bits).
pub fn ulps(a: f32, b: f32) -> u64 {
    let ordered = |x: f32| {
        let bits = x.to_bits() as i64;
        if bits & 0x8000_0000 != 0 {
            0x8000_0000 - bits - 1
        } else {
            bits
        }
    };
    (ordered(a) - ordered(b)).unsigned_abs()
}

/// The rows of one relation's runs set beside the original's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Drift {
    /// Rows compared.
    pub rows: usize,
    /// Rows with any bit changed.
    pub moved: usize,
    /// The largest change of one value, in ulps of the output's dtype at the largest
    /// magnitude of its head's row (a value near 0 that moves a little is a small move, not
    /// millions of ulps of its own magnitude); non-finite or all-zero rows count raw ulps.
    pub max_ulps: u64,
    /// The first moved row: (original row, head, the original's value, the other run's).
    pub first: Option<(usize, usize, f32, f32)>,
}

impl Drift {
    /// Compare `base`'s rows (`width` values each, `head_width` per head) with `runs`' as
    /// `pairs` (original row, run, row there) pair them; ulps are counted in a dtype of
    /// `mantissa` bits (23: f32, 10: f16, 7: bf16) carried as f32, at the scale of each
    /// head's row ([`Drift::max_ulps`]).
    pub fn of(
        base: &[f32],
        runs: &[Vec<f32>],
        pairs: &[(usize, usize, usize)],
        (width, head_width): (usize, usize),
        mantissa: u32,
    ) -> Drift {
        let shift = 23u32.saturating_sub(mantissa);
        let mut d = Drift {
            rows: pairs.len(),
            ..Drift::default()
        };
        for &(a, run, b) in pairs {
            let x = &base[a * width..(a + 1) * width];
            let y = &runs[run][b * width..(b + 1) * width];
            let mut moved = false;
            for (i, (&p, &q)) in x.iter().zip(y).enumerate() {
                if p.to_bits() != q.to_bits() {
                    let h = i / head_width.max(1) * head_width.max(1);
                    let head = &x[h..(h + head_width.max(1)).min(x.len())];
                    let u = match ulp_at(head, mantissa) {
                        Some(step) if p.is_finite() && q.is_finite() => {
                            ((p as f64 - q as f64).abs() / step).ceil() as u64
                        }
                        _ => ulps(p, q).div_ceil(1 << shift),
                    };
                    if !moved && d.first.is_none() {
                        d.first = Some((a, i / head_width.max(1), p, q));
                    }
                    moved = true;
                    d.max_ulps = d.max_ulps.max(u);
                }
            }
            d.moved += moved as usize;
        }
        d
    }

    pub fn held(&self) -> bool {
        self.moved == 0
    }
}

/// One ulp of a dtype of `mantissa` bits at the largest magnitude of `values`; `None` when
/// that is 0, subnormal or not finite.
fn ulp_at(values: &[f32], mantissa: u32) -> Option<f64> {
    let top = values.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
    if !top.is_normal() {
        return None;
    }
    let exponent = ((top.to_bits() >> 23) & 0xff) as i32 - 127;
    Some(2f64.powi(exponent - mantissa as i32))
}

/// One relation on one backend over a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelationTally {
    /// Whether the backend declares it (a moved bit is then a failure).
    pub declared: bool,
    /// Pairs run (the original and its transformed form both answered).
    pub tried: usize,
    /// Pairs whose compared rows kept every bit.
    pub held: usize,
    /// Rows compared, and rows with a bit changed, over every pair.
    pub rows: usize,
    pub rows_moved: usize,
    /// The largest change of one value, in ulps.
    pub max_ulps: u64,
    /// Pairs not judged: the backend declined or failed one of the runs (the property
    /// cases judge those failures).
    #[serde(default)]
    pub not_judged: usize,
}

impl RelationTally {
    pub fn add(&mut self, d: &Drift) {
        self.tried += 1;
        self.held += d.held() as usize;
        self.rows += d.rows;
        self.rows_moved += d.moved;
        self.max_ulps = self.max_ulps.max(d.max_ulps);
    }

    /// `other`'s pairs (a shard of the same run) added to these.
    pub fn merge(&mut self, other: &RelationTally) {
        self.declared |= other.declared;
        self.tried += other.tried;
        self.held += other.held;
        self.rows += other.rows;
        self.rows_moved += other.rows_moved;
        self.max_ulps = self.max_ulps.max(other.max_ulps);
        self.not_judged += other.not_judged;
    }

    /// "held 12 of 12" or "moved 3 of 12 pairs (40 of 900 rows, up to 2 ulps)".
    pub fn words(&self) -> String {
        if self.tried == 0 {
            return format!("not tried ({} not judged)", self.not_judged);
        }
        let mut s = if self.held == self.tried {
            format!("held {} of {}", self.held, self.tried)
        } else {
            format!(
                "moved in {} of {} pairs ({} of {} rows, up to {} ulps)",
                self.tried - self.held,
                self.tried,
                self.rows_moved,
                self.rows,
                self.max_ulps
            )
        };
        if self.not_judged > 0 {
            s.push_str(&format!(", {} not judged", self.not_judged));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulps_count_the_floats_between() {
        assert_eq!(ulps(1.0, 1.0), 0);
        assert_eq!(ulps(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        assert_eq!(ulps(0.0, -0.0), 1);
        assert_eq!(ulps(-1.0, f32::from_bits((-1.0f32).to_bits() + 2)), 2);
        assert_eq!(ulps(f32::from_bits(1), -f32::from_bits(1)), 3);
    }

    #[test]
    fn drift_finds_the_first_moved_row_and_head() {
        let base = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let mut other = base.clone();
        other[6] = f32::from_bits(7.0f32.to_bits() + 1);
        // Rows of 4 values, 2 per head; the original's rows 0 and 1 at rows 1 and 0.
        let d = Drift::of(
            &base,
            &[other[4..].iter().chain(&other[..4]).copied().collect()],
            &[(0, 0, 1), (1, 0, 0)],
            (4, 2),
            23,
        );
        assert_eq!((d.rows, d.moved, d.max_ulps), (2, 1, 1));
        assert_eq!(d.first.map(|f| (f.0, f.1)), Some((1, 1)));
        let mut t = RelationTally::default();
        t.add(&d);
        t.add(&Drift::of(
            &base,
            std::slice::from_ref(&base),
            &[(0, 0, 0)],
            (4, 2),
            23,
        ));
        // One bf16 ulp is 2^16 f32 ulps.
        let bf = |x: f32| f32::from_bits(x.to_bits() + (1 << 16));
        let d = Drift::of(&[1.0], &[vec![bf(1.0)]], &[(0, 0, 0)], (1, 1), 7);
        assert_eq!(d.max_ulps, 1);
        // A value near 0 beside a 1.0 in its head moves by the head's ulps, not its own:
        // 1e-8 to 2e-8 is a fraction of one f32 ulp at 1.0 (thousands of its own).
        let d = Drift::of(&[1.0, 1e-8], &[vec![1.0, 2e-8]], &[(0, 0, 0)], (2, 2), 23);
        assert_eq!((d.moved, d.max_ulps), (1, 1));
        assert!(ulps(1e-8, 2e-8) > 1000);
        // In another head, the same move counts at that head's scale.
        let d = Drift::of(&[1.0, 1e-8], &[vec![1.0, 2e-8]], &[(0, 0, 0)], (2, 1), 23);
        assert!(d.max_ulps > 1000);
        assert_eq!(
            t.words(),
            "moved in 1 of 2 pairs (1 of 3 rows, up to 1 ulps)"
        );
    }
}
