//! Scratch tensors one call reuses across its groups and chunks.
//!
//! A freshly allocated multi-megabyte tensor is mapped page by page on first touch: on
//! large_decode the page faults of gathering into new tensors cost more than the copies
//! themselves. Gathering into the same buffers instead keeps them mapped and, when a chunk
//! is small, in cache for the matmuls that read it next.

use super::tensors::CPU;
use super::Budgets;
use tch::{Kind, TchError, Tensor};

/// One reusable buffer: grows to the largest request, never shrinks within a call.
#[derive(Default)]
pub(crate) struct Scratch {
    flat: Option<Tensor>,
}

impl Scratch {
    /// A tensor of `shape` and `kind` over this buffer's storage; its contents are
    /// unspecified. Views handed out earlier alias it, so a caller uses one at a time.
    pub fn get(&mut self, shape: &[i64], kind: Kind) -> Result<Tensor, TchError> {
        let n: i64 = shape.iter().product();
        let fits = self
            .flat
            .as_ref()
            .is_some_and(|t| t.kind() == kind && t.numel() as i64 >= n);
        if !fits {
            // Drop the old buffer first so the two never coexist.
            self.flat = None;
            self.flat = Some(Tensor::f_empty([n], (kind, CPU))?);
        }
        let flat = self
            .flat
            .as_ref()
            .ok_or_else(|| TchError::Shape("scratch buffer missing".into()))?;
        flat.f_narrow(0, 0, n)?.f_view(shape)
    }
}

/// The buffers of one call, and the bytes one chunk of them may take: gathered pages as
/// stored, and the same pages head-major.
#[derive(Default)]
pub(crate) struct Workspace {
    /// What one native chunk or SDPA key chunk may take (already scaled to the cache).
    pub budgets: Budgets,
    /// Token-major pages gathered from the cache, `[pages, block_size * Hkv * D]`.
    pub k_pages: Scratch,
    pub v_pages: Scratch,
    /// The gathered pages transposed to `[b, Hkv, len, D]`, contiguous for `bmm`.
    pub k_heads: Scratch,
    pub v_heads: Scratch,
}

impl Workspace {
    pub fn new(budgets: Budgets) -> Self {
        Workspace {
            budgets,
            ..Workspace::default()
        }
    }
}
