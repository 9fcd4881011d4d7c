//! vLLM 0.33's per-request masks (causal flags, PrefixLM ranges, R-SWA) checked against a
//! config, for a case's batch and for a trace's whole sequences alike: each error names the
//! field where the file holds it (`batch.…` in a case, `masks.…` in a trace).

use crate::validate::{expect_len, nonzero};
use crate::{AttentionConfig, AttentionKind, Batch, CaseError, Feature};

/// Where the masks sit in the file being checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskField {
    /// A case's `batch`: one entry per sequence of the step.
    Batch,
    /// A trace's `masks`: one entry per logical sequence, over its whole length.
    Masks,
}

impl MaskField {
    fn name(self) -> &'static str {
        match self {
            MaskField::Batch => "batch",
            MaskField::Masks => "masks",
        }
    }

    fn rswa_window(self) -> &'static str {
        match self {
            MaskField::Batch => "batch.rswa.window",
            MaskField::Masks => "masks.rswa.window",
        }
    }
}

/// Check the masks of `b` (its `seq_lens` bound the ranges and prefixes) under `c`.
pub fn validate_masks(c: &AttentionConfig, b: &Batch, at: MaskField) -> Result<(), CaseError> {
    let n = b.seq_lens.len();
    let field = |rest: &str| format!("{}.{rest}", at.name());
    if let Some(causal) = &b.causal {
        expect_len(field("causal"), Some(n), causal.len())?;
        if c.kind != AttentionKind::Decoder {
            if let Some(s) = causal.iter().position(|&x| !x) {
                return Err(CaseError::InvalidParam {
                    field: field(&format!("causal[{s}]")),
                    reason: format!(
                        "a non-causal request in an {} case: only decoder requests have a causality to turn off",
                        c.kind
                    ),
                });
            }
        }
    }
    validate_prefix_lm(b, at)?;
    validate_rswa(c, b, at)?;
    if let Some(f) = Feature::of_batch(b)
        .find(|f| !f.allows_kind(c.kind) || (c.mla.is_some() && Feature::NOT_WITH_MLA.contains(f)))
    {
        return Err(CaseError::InvalidParam {
            field: match at {
                MaskField::Batch => f.field().into(),
                MaskField::Masks => f.field().replacen("batch", "masks", 1),
            },
            reason: if c.mla.is_some() {
                "no MLA model or backend has it (config.mla is set)".into()
            } else {
                format!("{} is causal decoder attention, got {}", f.label(), c.kind)
            },
        });
    }
    Ok(())
}

/// Positions the protocol carries (int32, as vLLM's metadata holds them).
const MAX_POSITION: usize = i32::MAX as usize;

/// PrefixLM ranges: one list per sequence, each `[start, end]` sorted and disjoint (upstream:
/// "a request's ranges must not overlap"). A range may reach past the step's `seq_len`, as
/// vLLM passes an image's range while chunked prefill has not computed all of it ("absolute
/// prompt positions [that] may extend past the tokens scheduled so far"): its keys stop at
/// the last computed one.
fn validate_prefix_lm(b: &Batch, at: MaskField) -> Result<(), CaseError> {
    let Some(p) = &b.prefix_lm else { return Ok(()) };
    expect_len(
        format!("{}.prefix_lm.ranges", at.name()),
        Some(b.seq_lens.len()),
        p.ranges.len(),
    )?;
    for (s, ranges) in p.ranges.iter().enumerate() {
        let mut prev: Option<(usize, usize)> = None;
        for (i, &(start, end)) in ranges.iter().enumerate() {
            let reason = if start > end {
                Some(format!(
                    "start {start} after end {end} (ends are inclusive)"
                ))
            } else if end > MAX_POSITION {
                Some(format!(
                    "ends at position {end}, past the int32 positions vLLM's metadata holds"
                ))
            } else if let Some((ps, pe)) = prev.filter(|&(_, pe)| start <= pe) {
                Some(format!(
                    "[{start}, {end}] overlaps or precedes [{ps}, {pe}]: a request's ranges are sorted and must not overlap"
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(CaseError::InvalidParam {
                    field: format!("{}.prefix_lm.ranges[{s}][{i}]", at.name()),
                    reason,
                });
            }
            prev = Some((start, end));
        }
    }
    Ok(())
}

/// R-SWA: a window of at least 1, a prefix per sequence, and neither a sliding window nor
/// PrefixLM ranges beside it: upstream's kernels disagree on both mixes. A prefix may pass
/// the step's `seq_len` (vLLM passes the prompt's length while chunked prefill is still in
/// it: every computed key is then in the prefix).
fn validate_rswa(c: &AttentionConfig, b: &Batch, at: MaskField) -> Result<(), CaseError> {
    let Some(r) = &b.rswa else { return Ok(()) };
    nonzero(r.window, at.rswa_window())?;
    let name = at.name();
    expect_len(
        format!("{name}.rswa.prefix_lens"),
        Some(b.seq_lens.len()),
        r.prefix_lens.len(),
    )?;
    let invalid = |field: String, reason: String| Err(CaseError::InvalidParam { field, reason });
    if let Some((s, &p)) = r
        .prefix_lens
        .iter()
        .enumerate()
        .find(|&(_, &p)| p > MAX_POSITION)
    {
        return invalid(
            format!("{name}.rswa.prefix_lens[{s}]"),
            format!("{p} is past the int32 positions vLLM's metadata holds"),
        );
    }
    if c.sliding_window.is_some() {
        return invalid(
            format!("{name}.rswa"),
            "R-SWA replaces config.sliding_window: vLLM's Triton kernel drops the sliding window under R-SWA and FlexAttention applies both, so a case with both has no one answer".into(),
        );
    }
    if b.prefix_lm.is_some() {
        return invalid(
            format!("{name}.rswa"),
            format!("R-SWA beside {name}.prefix_lm: vLLM's Triton kernel ORs the ranges in after R-SWA and FlexAttention ANDs R-SWA after them, so a case with both has no one answer"),
        );
    }
    Ok(())
}
