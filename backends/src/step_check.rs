//! What every backend checks of a step before it reads memory: one set of rules, so two
//! backends never disagree on which steps are valid. The rules follow vLLM's metadata: the
//! block table may have more rows than sequences (a persistent batch sized for the most
//! requests) and entries past a sequence's last block are never read, whatever they hold.

use crate::StepInputs;
use attn_reference::{AttentionConfig, AttentionKind};

impl StepInputs<'_> {
    /// `Err` naming the first field that does not fit `config` and a cache of `num_blocks`.
    pub fn validate(&self, config: &AttentionConfig, num_blocks: usize) -> Result<(), String> {
        let (hq, d, bs) = (config.num_heads, config.head_size, config.block_size);
        let seqs = self.seq_lens.len();
        let qsl = self.query_start_loc;
        if hq
            .checked_mul(d)
            .and_then(|row| row.checked_mul(self.num_tokens))
            != Some(self.query.len())
        {
            return Err(format!(
                "query holds {} values, expected {} x {hq} x {d}",
                self.query.len(),
                self.num_tokens
            ));
        }
        if qsl.len() != seqs + 1
            || qsl[0] != 0
            || qsl.windows(2).any(|w| w[0] > w[1])
            || qsl[seqs] > self.num_tokens
        {
            return Err(format!(
                "query_start_loc {qsl:?} is not a prefix sum of {seqs} query lengths within {} tokens",
                self.num_tokens
            ));
        }
        if let Some(causal) = self.causal.filter(|c| c.len() != seqs) {
            return Err(format!(
                "causal has {} flags for {seqs} sequences",
                causal.len()
            ));
        }
        if let Some(p) = self.prefix_lm.filter(|p| p.ranges.len() != seqs) {
            return Err(format!(
                "prefix_lm has range lists for {} sequences, not {seqs}",
                p.ranges.len()
            ));
        }
        if let Some(r) = self.rswa.filter(|r| r.prefix_lens.len() != seqs) {
            return Err(format!(
                "rswa has {} prefix lengths for {seqs} sequences",
                r.prefix_lens.len()
            ));
        }
        if self.block_table.len() < seqs {
            return Err(format!(
                "block_table has {} rows for {seqs} sequences",
                self.block_table.len()
            ));
        }
        for (s, &seq_len) in self.seq_lens.iter().enumerate() {
            let q = qsl[s + 1] - qsl[s];
            if q > seq_len && config.kind != AttentionKind::EncoderDecoder {
                return Err(format!(
                    "sequence {s}: {q} query tokens but seq_len {seq_len}"
                ));
            }
            let row = &self.block_table[s];
            let need = seq_len.div_ceil(bs);
            if row.len() < need {
                return Err(format!(
                    "sequence {s}: seq_len {seq_len} needs {need} blocks, block table row has {}",
                    row.len()
                ));
            }
            if let Some((i, &b)) = row[..need]
                .iter()
                .enumerate()
                .find(|(_, &b)| b as usize >= num_blocks)
            {
                return Err(format!(
                    "sequence {s}: block_table[{s}][{i}] = {b} is outside the cache's {num_blocks} blocks"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::DType;

    fn step<'a>(
        q: &'a [f32],
        qsl: &'a [usize],
        lens: &'a [usize],
        t: &'a [Vec<u32>],
    ) -> StepInputs<'a> {
        StepInputs {
            query: q,
            query_start_loc: qsl,
            seq_lens: lens,
            block_table: t,
            num_tokens: qsl.last().copied().unwrap_or(0),
            causal: None,
            prefix_lm: None,
            rswa: None,
        }
    }

    #[test]
    fn each_rule_names_its_field() {
        let c = AttentionConfig::new(2, 1, 4, 2, DType::F32);
        let q = vec![0.0; 3 * 2 * 4];
        let ok = vec![vec![1, 2], vec![3]];
        assert_eq!(step(&q, &[0, 2, 3], &[3, 1], &ok).validate(&c, 4), Ok(()));
        // More rows than sequences, and a stale id past the last needed block: both valid.
        let wide = vec![vec![1, 2, 99], vec![3], vec![1]];
        assert_eq!(step(&q, &[0, 2, 3], &[3, 1], &wide).validate(&c, 4), Ok(()));
        type Bad<'a> = (&'a [usize], &'a [usize], Vec<Vec<u32>>, &'a str);
        let cases: [Bad; 5] = [
            (
                &[0, 2, 3],
                &[3, 1],
                vec![vec![1, 2]],
                "block_table has 1 rows",
            ),
            (&[0, 3, 2], &[3, 1], ok.clone(), "query_start_loc"),
            (
                &[0, 2, 3],
                &[1, 1],
                ok.clone(),
                "2 query tokens but seq_len 1",
            ),
            (&[0, 2, 3], &[5, 1], ok.clone(), "needs 3 blocks"),
            (
                &[0, 2, 3],
                &[3, 1],
                vec![vec![1, 4], vec![3]],
                "block_table[0][1] = 4",
            ),
        ];
        for (qsl, lens, table, says) in cases {
            let q = vec![0.0; 3 * 2 * 4];
            let mut s = step(&q, qsl, lens, &table);
            s.num_tokens = 3;
            let e = s.validate(&c, 4).expect_err(says);
            assert!(e.contains(says), "{e}");
        }
        let short = vec![0.0; 5];
        let e = step(&short, &[0, 2, 3], &[3, 1], &ok)
            .validate(&c, 4)
            .unwrap_err();
        assert!(e.starts_with("query holds 5 values"), "{e}");
    }
}
