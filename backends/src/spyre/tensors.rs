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

/// An index vector as a 1-D i64 tensor.
pub(crate) fn from_i64(data: &[i64]) -> Result<Tensor, TchError> {
    Tensor::f_from_slice(data)
}

/// Round `t` to `dtype` (the storage precision the output is promised in) and copy it out
/// as f32.
pub(crate) fn to_host_rounded(t: &Tensor, dtype: DType) -> Result<Vec<f32>, TchError> {
    let rounded = t
        .f_to_kind(kind_of(dtype))?
        .f_to_kind(Kind::Float)?
        .f_contiguous()?;
    let n = rounded.numel();
    let mut out = vec![0f32; n];
    rounded.f_copy_data(&mut out, n)?;
    Ok(out)
}

/// Run an in-place op for its effect: tch returns the mutated tensor again, which callers
/// holding the original have no use for.
pub(crate) fn in_place(r: Result<Tensor, TchError>) -> Result<(), TchError> {
    r.map(drop)
}
