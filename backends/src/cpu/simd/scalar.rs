//! The portable path: plain loops, also the specification the vector paths must match.

use super::{Ops, PvArgs, QkArgs, SimdLevel};
use crate::cpu::elem::KvElem;

pub fn ops<T: KvElem>() -> Ops<T> {
    Ops {
        level: SimdLevel::Scalar,
        qk: qk::<T>,
        pv: pv::<T>,
        max,
        exp_sum,
        scale,
        normalize: super::normalize_scalar,
        qk_bf16: None,
    }
}

fn qk<T: KvElem>(a: QkArgs<'_, T>) {
    a.check();
    super::prefetch(a.prefetch);
    for r in 0..a.rows {
        let q = &a.q[r * a.d..(r + 1) * a.d];
        let s = &mut a.s[r * a.lds + a.c0..r * a.lds + a.c0 + a.n];
        for (j, out) in s.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for (i, &qi) in q.iter().enumerate() {
                acc += qi * a.kt[i * a.bs + a.j0 + j].read();
            }
            *out = acc;
        }
    }
}

fn pv<T: KvElem>(a: PvArgs<'_, T>) {
    a.check();
    for r in 0..a.rows {
        let o = &mut a.o[r * a.d..(r + 1) * a.d];
        for j in 0..a.n {
            let w = a.p[r * a.lds + a.c0 + j];
            if w == 0.0 {
                continue;
            }
            let v = &a.v[(a.j0 + j) * a.d..(a.j0 + j + 1) * a.d];
            for (acc, &x) in o.iter_mut().zip(v) {
                *acc += w * x.read();
            }
        }
    }
}

pub fn max(x: &[f32]) -> f32 {
    x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

pub fn exp_sum(x: &mut [f32], m: f32) -> f32 {
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    sum
}

pub fn scale(x: &mut [f32], a: f32) {
    for v in x.iter_mut() {
        *v *= a;
    }
}
