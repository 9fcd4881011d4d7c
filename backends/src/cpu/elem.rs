//! The element types a cache can hold, so kernels are written once and monomorphised per dtype.

use half::{bf16, f16};

/// How a SIMD kernel widens a stored element to `f32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemKind {
    F32,
    Bf16,
    F16,
    /// E4M3FN codes: sign-extended, shifted into f16 bits, widened: the value over 256
    /// ([`KvElem::READ_SCALE`], `fp8`).
    Fp8E4m3,
    /// E5M2 codes: the top byte of an f16.
    Fp8E5m2,
}

pub trait KvElem: Copy + Send + Sync + 'static {
    const KIND: ElemKind;
    /// The element's value over what the kernels read ([`KvElem::read`]): an E4M3 code is
    /// read as its f16 bits' value, 2^-8 of its own, and the ×256 that would restore it joins
    /// the query's and the values' scales instead (one multiplication per row, not per
    /// element; exact, a power of two). 1 for every other element.
    const READ_SCALE: f32 = 1.0;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    /// What the kernels read: `to_f32() / READ_SCALE`.
    #[inline(always)]
    fn read(self) -> f32 {
        self.to_f32()
    }
    /// The slice as bf16, for kernels that only exist for bf16.
    fn as_bf16(data: &[Self]) -> Option<&[bf16]> {
        let _ = data;
        None
    }
}

impl KvElem for f32 {
    const KIND: ElemKind = ElemKind::F32;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for bf16 {
    const KIND: ElemKind = ElemKind::Bf16;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn as_bf16(data: &[Self]) -> Option<&[bf16]> {
        Some(data)
    }
}

impl KvElem for f16 {
    const KIND: ElemKind = ElemKind::F16;
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}
