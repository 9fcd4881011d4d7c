//! Small conversions between the case model and libtorch: dtype kinds, host slices to
//! tensors and back, and the one-time thread setting.

use attn_reference::DType;
use std::cell::Cell;
use std::sync::Once;
use tch::{Device, Kind, TchError, Tensor};

/// Every spyre tensor lives on the CPU: the backend models an accelerator's op graph, and
/// libtorch's CPU kernels are what runs it here.
pub(crate) const CPU: Device = Device::Cpu;

/// Intra-op threads: the machines this harness targets have two cores, and the comparison
/// with other CPU backends is made at equal thread counts.
const TORCH_THREADS: i32 = 2;

pub(crate) fn init_threads() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| tch::set_num_threads(TORCH_THREADS));
    // In a check each call keeps to its caller (`crate::threads`). libtorch's OpenMP thread
    // count belongs to the calling thread, so every thread that calls in sets its own.
    if crate::threads::caller_only() {
        thread_local!(static ALONE: Cell<bool> = const { Cell::new(false) });
        ALONE.with(|alone| {
            if !alone.get() {
                tch::set_num_threads(1);
                alone.set(true);
            }
        });
    }
}

/// Use `n` intra-op threads from now on (a benchmark's `--threads`).
pub fn set_threads(n: usize) {
    init_threads();
    tch::set_num_threads(n.max(1) as i32);
}

pub(crate) fn kind_of(dtype: DType) -> Kind {
    match dtype {
        DType::F32 => Kind::Float,
        DType::Bf16 => Kind::BFloat16,
        DType::F16 => Kind::Half,
    }
}

/// An f32 host slice as a tensor of `shape`.
pub(crate) fn from_f32(data: &[f32], shape: &[i64]) -> Result<Tensor, TchError> {
    Tensor::f_from_slice(data)?.f_view(shape)
}

/// An f32 host slice as a tensor of `shape`, without a copy: the tensor aliases `data`.
///
/// # Safety
/// Nothing may write through the tensor or a view of it, and all of them must be dropped
/// before `data` is.
pub(crate) unsafe fn borrow_f32(data: &[f32], shape: &[i64]) -> Result<Tensor, TchError> {
    if shape.iter().product::<i64>() != data.len() as i64 {
        return Err(TchError::Shape(format!(
            "{} values cannot be viewed as {shape:?}",
            data.len()
        )));
    }
    // SAFETY: `data` is valid, initialized f32 for its whole length (checked against the
    // shape); the caller keeps it alive and unwritten for the tensor's life.
    unsafe { Tensor::f_from_blob(data.as_ptr().cast(), shape, &[], Kind::Float, CPU) }
}

/// An index vector as a 1-D i64 tensor.
pub(crate) fn from_i64(data: &[i64]) -> Result<Tensor, TchError> {
    Tensor::f_from_slice(data)
}

/// Copy `t` out as f32, rounded to `dtype` (the storage precision the output is promised
/// in) on the host, to nearest even as libtorch's cast: no rounded copy beside the output.
pub(crate) fn to_host_rounded(t: &Tensor, dtype: DType) -> Result<Vec<f32>, TchError> {
    // No copy for a contiguous f32 tensor.
    let t = t.f_to_kind(Kind::Float)?.f_contiguous()?;
    let n = t.numel();
    let mut out = vec![0f32; n];
    t.f_copy_data(&mut out, n)?;
    for x in &mut out {
        *x = dtype.round(*x);
    }
    Ok(out)
}

/// Run an in-place op for its effect: tch returns the mutated tensor again, which callers
/// holding the original have no use for.
pub(crate) fn in_place(r: Result<Tensor, TchError>) -> Result<(), TchError> {
    r.map(drop)
}
