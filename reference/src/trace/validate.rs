//! `Trace::validate`: shapes first (so every later index is in range), then each step as a
//! case, then a replay of the cache: every position a step reads must hold that sequence's
//! token, as the earlier steps' writes left it. A skipped block (the null block where a
//! window or chunk left a block behind) holds nobody's tokens; the step's case accepts it
//! only where no query reads it. A valid trace is one where a correct backend
//! and the oracle of each step agree.

use super::{Trace, TraceError};
use crate::validate::MAX_BLOCKS;
use std::collections::{HashMap, HashSet};

/// Most steps a trace may have.
pub const MAX_TRACE_STEPS: usize = 1 << 16;

impl Trace {
    /// Check that the trace is internally consistent. Never panics, whatever was deserialized.
    pub fn validate(&self) -> Result<(), TraceError> {
        self.config
            .validate()
            .map_err(|error| TraceError::Case { step: None, error })?;
        self.validate_shapes()?;
        // The masks over each sequence's whole length: a step sees them cut to its own.
        if self.masks.is_some() {
            use crate::validate_masks::{validate_masks, MaskField};
            validate_masks(&self.config, &self.whole_batch(), MaskField::Masks)
                .map_err(|error| TraceError::Case { step: None, error })?;
        }
        self.validate_steps()
    }

    fn validate_shapes(&self) -> Result<(), TraceError> {
        let c = &self.config;
        if self.num_blocks == 0 {
            return Err(TraceError::Zero {
                field: "num_blocks".into(),
            });
        }
        limit("num_blocks", self.num_blocks, MAX_BLOCKS)?;
        crate::validate::validate_cache_size(c, self.num_blocks, "num_blocks")
            .map_err(|error| TraceError::Case { step: None, error })?;
        limit("steps", self.steps.len(), MAX_TRACE_STEPS)?;
        let qrow = c.num_heads * c.head_size;
        let kvrow = c.num_kv_heads * c.head_size;
        for (i, s) in self.sequences.iter().enumerate() {
            let rows = |field: &str, v: &[f32], row: usize| {
                if v.len().is_multiple_of(row) {
                    Ok(v.len() / row)
                } else {
                    Err(TraceError::RaggedRows {
                        field: format!("sequences[{i}].{field}"),
                        actual: v.len(),
                        row,
                    })
                }
            };
            let q = rows("query", &s.query, qrow)?;
            let k = rows("key", &s.key, kvrow)?;
            // An MLA entry has no V of its own (V is the key row's prefix): no value rows.
            let v = match c.value_row() {
                0 if s.value.is_empty() => k,
                0 => {
                    return Err(TraceError::Case {
                        step: None,
                        error: crate::CaseError::InvalidParam {
                            field: format!("sequences[{i}].value"),
                            reason: "an MLA sequence carries no value rows (V is the prefix of \
                                     each key row)"
                                .into(),
                        },
                    })
                }
                row => rows("value", &s.value, row)?,
            };
            if q != k || k != v {
                return Err(TraceError::SequenceLengths {
                    seq: i,
                    query: q,
                    kv: k.min(v),
                });
            }
        }
        for (si, st) in self.steps.iter().enumerate() {
            let mut seen = HashSet::new();
            for (row, s) in st.seqs.iter().enumerate() {
                let len = self.seq_tokens(s.seq).ok_or(TraceError::UnknownSequence {
                    field: format!("steps[{si}].seqs[{row}].seq"),
                    seq: s.seq,
                    num_seqs: self.sequences.len(),
                })?;
                if !seen.insert(s.seq) {
                    return Err(TraceError::ScheduledTwice {
                        step: si,
                        seq: s.seq,
                    });
                }
                let end = s.context_len.saturating_add(s.query_len);
                if end > len {
                    return Err(TraceError::PastSequence {
                        step: si,
                        row,
                        seq: s.seq,
                        end,
                        len,
                    });
                }
                let expected = end.div_ceil(c.block_size);
                if s.block_table.len() != expected {
                    return Err(TraceError::TableLength {
                        step: si,
                        row,
                        expected,
                        actual: s.block_table.len(),
                        seq_len: end,
                    });
                }
            }
            for f in &st.freed {
                if f.seq >= self.sequences.len() {
                    return Err(TraceError::UnknownSequence {
                        field: format!("steps[{si}].freed.seq"),
                        seq: f.seq,
                        num_seqs: self.sequences.len(),
                    });
                }
                if let Some(&block) = f
                    .blocks
                    .iter()
                    .find(|&&b| b == 0 || b as usize >= self.num_blocks)
                {
                    return Err(TraceError::FreedBlock { step: si, block });
                }
            }
            for &(seq, _) in &st.prefix_hits {
                if seq >= self.sequences.len() {
                    return Err(TraceError::UnknownSequence {
                        field: format!("steps[{si}].prefix_hits.seq"),
                        seq,
                        num_seqs: self.sequences.len(),
                    });
                }
            }
        }
        Ok(())
    }

    fn seq_tokens(&self, seq: usize) -> Option<usize> {
        let c = &self.config;
        self.sequences
            .get(seq)
            .map(|s| s.key.len() / (c.num_kv_heads * c.head_size))
    }

    /// Each step as a case, then the cache replayed: `holder[slot]` is the (sequence,
    /// position) whose K/V the slot holds.
    fn validate_steps(&self) -> Result<(), TraceError> {
        let bs = self.config.block_size;
        let kvrow = self.config.num_kv_heads * self.config.head_size;
        let vrow = self.config.value_row();
        let mut holder: HashMap<i64, (usize, usize)> = HashMap::new();
        for (si, st) in self.steps.iter().enumerate() {
            self.step_case(si)
                .validate()
                .map_err(|error| TraceError::Case {
                    step: Some(si),
                    error,
                })?;
            for s in &st.seqs {
                for p in s.context_len..s.seq_len() {
                    holder.insert(super::slot(&s.block_table, bs, p), (s.seq, p));
                }
            }
            for (row, s) in st.seqs.iter().enumerate() {
                let mine = &self.sequences[s.seq];
                for p in 0..s.seq_len() {
                    if s.block_table[p / bs] == 0 {
                        continue; // skipped: the step's case validation found it unread
                    }
                    let slot = super::slot(&s.block_table, bs, p);
                    let same = |&(o, q): &(usize, usize)| {
                        let theirs = &self.sequences[o];
                        q == p
                            && (o == s.seq
                                || (theirs.key[q * kvrow..(q + 1) * kvrow]
                                    == mine.key[p * kvrow..(p + 1) * kvrow]
                                    && theirs.value[q * vrow..(q + 1) * vrow]
                                        == mine.value[p * vrow..(p + 1) * vrow]))
                    };
                    let held = holder.get(&slot);
                    if !held.is_some_and(same) {
                        return Err(TraceError::StaleContext {
                            step: si,
                            row,
                            seq: s.seq,
                            pos: p,
                            slot,
                            holder: match held {
                                Some((o, q)) => format!("sequence {o} position {q}"),
                                None => "nothing written yet".into(),
                            },
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

fn limit(field: &str, size: usize, limit: usize) -> Result<(), TraceError> {
    if size > limit {
        Err(TraceError::TooLarge {
            field: field.into(),
            size,
            limit,
        })
    } else {
        Ok(())
    }
}
