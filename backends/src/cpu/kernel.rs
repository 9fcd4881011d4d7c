//! One work item: a tile of query rows (the query heads of one kv head, for a few tokens)
//! against a range of keys, with an online softmax over KV tiles.
//!
//! Per KV tile: scores for every row (`qk`, block by block through the block table), then
//! soft-cap, ALiBi and the visibility mask, then per row the running max/sum update (output
//! rescaled only when the max grows), then the weighted values (`pv`). Accumulation is f32
//! throughout (bf16 scores may come from exact bf16 products via `qk_bf16`). Tile width and
//! prefetching follow [`KvSource`].
//! The item leaves unnormalised rows with their max and sum; [`finalize_task`] merges the
//! splits of a task (log-sum-exp), adds the sink and writes the rounded output.

use super::elem::KvElem;
use super::layout::Geometry;
use super::mask::{visible_keys, KeySpans};
use super::partial::Partial;
use super::rounding::{bf16_bits, round_to};
use super::scheduler::Task;
use super::simd::{Ops, PvArgs, QkArgs, QkBf16Args};
use attn_reference::{AttentionConfig, DType};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Keys per KV tile per query row of the task, at least a minimum and at most
/// [`MAX_TILE_KEYS`]. Prefill (many rows) is fastest with large tiles, which amortise the
/// softmax bookkeeping. Decode (few rows) reading K/V from DRAM is fastest with small ones,
/// whose values are still in L1 when `pv` reads them (1 thread, large_decode: 10.5 ms with
/// 32 keys, 12.0 with 128); decode on K/V that sits in the last-level cache prefers 128
/// (single_decode 0.115 → 0.103 ms, medium_decode 0.43 → 0.40).
const TILE_KEYS_PER_ROW: usize = 8;
const NARROW_MIN_TILE_KEYS: usize = 32;
const WIDE_MIN_TILE_KEYS: usize = 128;
const MAX_TILE_KEYS: usize = 512;
/// Key counts where a task's tiling changes (for the strategy's threshold lengths).
pub const TILE_THRESHOLDS: [usize; 4] = [
    TILE_KEYS_PER_ROW,
    NARROW_MIN_TILE_KEYS,
    WIDE_MIN_TILE_KEYS,
    MAX_TILE_KEYS,
];

/// How far ahead of the block being read the next one is prefetched when K/V streams from
/// memory: a few tens of KiB in flight per thread hide DRAM latency; much more only evicts
/// what is still needed.
const PREFETCH_BYTES: usize = 32 * 1024;

/// Tasks with at least this many rows use the bf16 pair-dot score kernel where it exists;
/// so do all tasks whose step fits in the last-level cache. Decode tasks (a handful of rows)
/// streaming K/V from memory keep the f32 kernel: with scores computed in half the time,
/// their prefetches for the blocks 32 KiB ahead were issued in a burst, and large_decode at
/// one thread went from 11.1 to 12.7 ms.
const PAIR_MIN_ROWS: usize = 12;

/// Where a step's K/V is expected to be read from, which sets the decode tile width and the
/// software prefetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSource {
    /// Already in cache, as when a benchmark calls the same step again (only when forced by
    /// `KvTiles::Resident`): wide tiles, no software prefetch.
    Warm,
    /// Small enough for the last-level cache, but not necessarily in it: in a model the other
    /// layers pass through the cache between two calls for one layer. Wide tiles, the next
    /// block prefetched. Measured at 2 threads, bf16 single_decode (4 MB): 0.051 ms warm and
    /// 0.13 cold (cache evicted before each call), against 0.045 and 0.23 with no prefetch;
    /// vLLM's CPU_ATTN takes 0.060 and 0.30.
    Cache,
    /// Larger than the last-level cache: narrow decode tiles, blocks 32 KiB ahead prefetched.
    Memory,
}

impl KvSource {
    pub fn for_size(kv_bytes: usize, last_level_cache: usize) -> KvSource {
        if kv_bytes <= last_level_cache {
            KvSource::Cache
        } else {
            KvSource::Memory
        }
    }

    fn wide_tiles(self) -> bool {
        self != KvSource::Memory
    }

    /// How many blocks ahead to prefetch (0: none), for blocks of `chunk_bytes` per kv head.
    fn prefetch_blocks(self, chunk_bytes: usize) -> usize {
        match self {
            KvSource::Warm => 0,
            KvSource::Cache => 1,
            KvSource::Memory => (PREFETCH_BYTES / chunk_bytes.max(1)).clamp(1, 8),
        }
    }
}

/// Everything an item reads, shared by all threads of a call.
pub struct Problem<'a, T> {
    pub cfg: &'a AttentionConfig,
    pub geometry: Geometry,
    /// Per kv head, what the query is multiplied by: the softmax scale, the head's FP8 K
    /// scale and the element's read scale.
    pub scales: &'a [f32],
    /// An FP8 cache's per-token scales (`Geometry::token_scales_start`), if it has them.
    pub token_scales: Option<&'a [f32]>,
    pub group: usize,
    pub cache: &'a [T],
    pub query: &'a [f32],
    pub seq_lens: &'a [usize],
    /// Per sequence, whether it is causal (None: all are).
    pub causal: Option<&'a [bool]>,
    /// Per sequence, PrefixLM ranges and R-SWA prefixes (None: none).
    pub prefix_lm: Option<&'a attn_reference::PrefixLm>,
    pub rswa: Option<&'a attn_reference::Rswa>,
    pub block_table: &'a [Vec<u32>],
    pub ops: &'a Ops<T>,
    /// Chooses the decode tile width and whether the next blocks are prefetched.
    pub kv_source: KvSource,
}

impl<'a, T> Problem<'a, T> {
    fn request(&self, seq: usize) -> attn_reference::RequestMask<'a> {
        attn_reference::request_mask(self.causal, self.prefix_lm, self.rswa, seq)
    }
}

/// Per-thread buffers, grown on demand and reused across items and calls.
#[derive(Debug, Default)]
pub struct Scratch {
    q: Vec<f32>,
    s: Vec<f32>,
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    vis: Vec<KeySpans>,
    /// Query rows as bf16 pairs, for `qk_bf16`.
    q2: Vec<u32>,
    /// The tile's per-token K and V scales (FP8 caches with [`attn_reference::KvScales::Token`]).
    ks: Vec<f32>,
    vs: Vec<f32>,
}

fn grow<T: Clone>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() < len {
        v.resize(len, fill);
    }
}

/// Tile width for a task of `rows` rows, `wide` when the step's K/V fits in the
/// last-level cache: whole blocks when they fit.
pub fn tile_keys(block_size: usize, rows: usize, wide: bool) -> usize {
    let min = if wide {
        WIDE_MIN_TILE_KEYS
    } else {
        NARROW_MIN_TILE_KEYS
    };
    let target = (rows * TILE_KEYS_PER_ROW).clamp(min, MAX_TILE_KEYS);
    if block_size <= target {
        target / block_size * block_size
    } else {
        target
    }
}

/// Run one split of `task` over `keys`; its unnormalised result stays in `sc`
/// ([`Scratch::partial`]) until the next item.
pub fn run_item<T: KvElem>(pb: &Problem<'_, T>, task: &Task, keys: Range<usize>, sc: &mut Scratch) {
    let g = pb.geometry;
    // K's width for scores, V's for values and output (they differ in MLA).
    let (d, dv, bs, group, rows) = (
        g.head_size,
        g.head_size_v,
        g.block_size,
        pb.group,
        task.rows,
    );
    let hq = pb.cfg.num_heads;
    let lds = tile_keys(bs, rows, pb.kv_source.wide_tiles());
    let seq_len = pb.seq_lens[task.seq];
    grow(&mut sc.q, rows * d, 0.0);
    grow(&mut sc.s, rows * lds, 0.0);
    grow(&mut sc.o, rows * dv, 0.0);
    grow(&mut sc.m, rows, 0.0);
    grow(&mut sc.l, rows, 0.0);
    grow(&mut sc.vis, rows, KeySpans::default());

    // The bf16 pair-dot kernel reads the query as bf16 pairs (scaled afterwards), the other
    // kernels as f32 rows pre-scaled so scores come out of `qk` final (before soft-cap).
    let qk_bf16 = pb
        .ops
        .qk_bf16
        .filter(|_| rows >= PAIR_MIN_ROWS || pb.kv_source != KvSource::Memory);
    let dp = d.div_ceil(2);
    if qk_bf16.is_some() {
        grow(&mut sc.q2, rows * dp, 0);
    }
    for r in 0..rows {
        let (t, h) = (r / group, task.kv_head * group + r % group);
        let src = &pb.query[((task.token0 + t) * hq + h) * d..][..d];
        if qk_bf16.is_some() {
            pack_bf16_pairs(src, &mut sc.q2[r * dp..(r + 1) * dp]);
        } else {
            let scale = pb.scales[task.kv_head];
            (pb.ops.normalize)(src, scale, DType::F32, &mut sc.q[r * d..(r + 1) * d]);
        }
        sc.vis[r] = visible_keys(
            pb.cfg.kind,
            super::mask::KeyLimits::of(pb.cfg).request(pb.request(task.seq)),
            task.pos0 + t,
            seq_len,
        );
    }
    sc.o[..rows * dv].fill(0.0);
    sc.m[..rows].fill(f32::NEG_INFINITY);
    sc.l[..rows].fill(0.0);

    let table = &pb.block_table[task.seq];
    let chunk = |key: usize| -> (&[T], usize, usize) {
        let (block, off) = (key / bs, key % bs);
        let start = g.chunk_start(table[block] as usize, task.kv_head);
        (&pb.cache[start..start + g.chunk_len()], off, bs - off)
    };

    let ahead = pb
        .kv_source
        .prefetch_blocks(g.chunk_len() * std::mem::size_of::<T>());

    let mut a = keys.start;
    while a < keys.end {
        // Tiles end on block boundaries where possible, so each block is one kernel call.
        let aligned = (a + lds) / bs * bs;
        let b = if aligned > a { aligned } else { a + lds }.min(keys.end);
        let width = b - a;

        let mut key = a;
        while key < b {
            let (kv, j0, left) = chunk(key);
            let n = left.min(b - key);
            // The block `ahead` blocks on streams in while this one is computed on; block
            // tables scatter blocks where no hardware prefetcher follows.
            let far = key + n + ahead.saturating_sub(1) * bs;
            let next: &[T] = if ahead > 0 && far < keys.end {
                chunk(far).0
            } else {
                &[]
            };
            match (qk_bf16, T::as_bf16(kv)) {
                (Some(qk_bf16), Some(kv)) => qk_bf16(QkBf16Args {
                    q2: &sc.q2,
                    rows,
                    d,
                    kt: &kv[..bs * d],
                    bs,
                    j0,
                    n,
                    s: &mut sc.s,
                    lds,
                    c0: key - a,
                    scale: pb.scales[task.kv_head],
                    prefetch: T::as_bf16(next).unwrap_or_default(),
                }),
                _ => (pb.ops.qk)(QkArgs {
                    q: &sc.q,
                    rows,
                    d,
                    kt: &kv[..bs * d],
                    prefetch: next,
                    bs,
                    j0,
                    n,
                    s: &mut sc.s,
                    lds,
                    c0: key - a,
                }),
            }
            key += n;
        }
        if let Some(all) = pb.token_scales {
            gather_token_scales(pb, task, all, a..b, sc);
        }

        for r in 0..rows {
            let s = &mut sc.s[r * lds..r * lds + width];
            if pb.token_scales.is_some() {
                // Each key's score carries its own K scale.
                s.iter_mut()
                    .zip(&sc.ks[..width])
                    .for_each(|(x, &k)| *x *= k);
            }
            if let Some(cap) = pb.cfg.logits_soft_cap {
                for x in s.iter_mut() {
                    *x = cap * (*x / cap).tanh();
                }
            }
            let p = (task.pos0 + r / group) as f32;
            if let Some(slopes) = &pb.cfg.alibi_slopes {
                let slope = slopes[task.kv_head * group + r % group];
                for (j, x) in s.iter_mut().enumerate() {
                    *x += slope * ((a + j) as f32 - p);
                }
            }
            let vis = &sc.vis[r];
            let clip = |k: &Range<usize>| (k.start.clamp(a, b) - a, k.end.clamp(a, b) - a);
            let (lo, hi) = clip(&vis.first);
            s[..lo].fill(f32::NEG_INFINITY);
            if vis.second.is_empty() {
                s[hi.max(lo)..].fill(f32::NEG_INFINITY);
            } else {
                // Two spans (R-SWA, a PrefixLM range): the gap between them is masked too.
                let (lo2, hi2) = clip(&vis.second);
                s[hi.max(lo)..lo2].fill(f32::NEG_INFINITY);
                s[hi2.max(lo2)..].fill(f32::NEG_INFINITY);
            }

            let m_old = sc.m[r];
            let m_new = m_old.max((pb.ops.max)(s));
            if m_new == f32::NEG_INFINITY {
                // Nothing visible yet: zero weights keep the row's output at 0.
                s.fill(0.0);
                continue;
            }
            let sum = (pb.ops.exp_sum)(s, m_new);
            if pb.token_scales.is_some() {
                // The sum is of the weights; each value row is read with its own V scale.
                s.iter_mut()
                    .zip(&sc.vs[..width])
                    .for_each(|(p, &v)| *p *= v);
            }
            if m_old != m_new {
                // Before the first visible key the row's output and sum are still zero.
                if m_old != f32::NEG_INFINITY {
                    let alpha = (m_old - m_new).exp();
                    sc.l[r] *= alpha;
                    (pb.ops.scale)(&mut sc.o[r * dv..(r + 1) * dv], alpha);
                }
                sc.m[r] = m_new;
            }
            sc.l[r] += sum;
        }

        let mut key = a;
        while key < b {
            let (kv, j0, left) = chunk(key);
            let n = left.min(b - key);
            (pb.ops.pv)(PvArgs {
                p: &sc.s,
                lds,
                c0: key - a,
                rows,
                n,
                v: &kv[bs * d..],
                j0,
                d: dv,
                o: &mut sc.o,
            });
            key += n;
        }
        a = b;
    }
}

/// The per-token K and V scales of `keys` (one tile) of `task`'s kv head into `sc.ks` and
/// `sc.vs`, walking the block table.
fn gather_token_scales<T>(
    pb: &Problem<'_, T>,
    task: &Task,
    all: &[f32],
    keys: Range<usize>,
    sc: &mut Scratch,
) {
    let (g, bs) = (pb.geometry, pb.geometry.block_size);
    let table = &pb.block_table[task.seq];
    let width = keys.len();
    grow(&mut sc.ks, width, 0.0);
    grow(&mut sc.vs, width, 0.0);
    for (j, key) in keys.enumerate() {
        let at = g.token_scales_start(table[key / bs] as usize, task.kv_head) + key % bs;
        sc.ks[j] = all[at];
        sc.vs[j] = all[at + bs];
    }
}

impl Scratch {
    /// The result of the last `run_item` on a task of `rows` rows.
    pub fn partial(&self, rows: usize, d: usize) -> Partial<'_> {
        Partial {
            o: &self.o[..rows * d],
            m: &self.m[..rows],
            l: &self.l[..rows],
        }
    }
}

/// `pairs[p] = bf16(x[2p]) | bf16(x[2p + 1]) << 16`, rounded to nearest even (inputs are
/// finite: validation rejects NaN); an odd tail pairs with zero. Branch-free so it vectorises.
fn pack_bf16_pairs(x: &[f32], pairs: &mut [u32]) {
    let (even, tail) = x.split_at(x.len() / 2 * 2);
    for (pair, two) in pairs.iter_mut().zip(even.chunks_exact(2)) {
        *pair = bf16_bits(two[0]) | bf16_bits(two[1]) << 16;
    }
    if let (Some(&last), Some(pair)) = (tail.first(), pairs.get_mut(even.len() / 2)) {
        *pair = bf16_bits(last);
    }
}

/// The output of a call (`[num_tokens, num_heads, head_size_v]`), written row by row from many
/// threads, each row once: every (token, head) row of a sequence belongs to exactly one task
/// of the schedule, and rows of tokens past the last sequence are zeroed by the caller. The
/// memory starts uninitialised, so no thread pulls another's freshly zeroed lines into its
/// cache just to overwrite them.
pub struct OutputRows {
    /// A `Vec<MaybeUninit<f32>>` taken apart, so threads can write through the pointer with
    /// no reference to the buffer alive.
    ptr: *mut MaybeUninit<f32>,
    len: usize,
    cap: usize,
    d: usize,
    written: AtomicUsize,
}

impl OutputRows {
    /// `None` when `rows * d` values cannot be allocated (never an abort).
    pub fn new(rows: usize, d: usize) -> Option<Self> {
        let len = rows.checked_mul(d)?;
        let mut data = Vec::<MaybeUninit<f32>>::new();
        data.try_reserve_exact(len).ok()?;
        let mut data = ManuallyDrop::new(data);
        Some(OutputRows {
            ptr: data.as_mut_ptr(),
            len,
            cap: data.capacity(),
            d,
            written: AtomicUsize::new(0),
        })
    }

    fn rows(&self) -> usize {
        self.len / self.d.max(1)
    }

    /// # Safety
    /// No other thread may write row `i` while this runs (each row belongs to one task).
    unsafe fn write_row(&self, i: usize, values: &[f32]) {
        let d = self.d;
        assert!(values.len() == d && i < self.rows(), "output row {i}");
        // SAFETY: in bounds (asserted, within the allocation's capacity); this row is
        // written by this call alone (the contract).
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.ptr.add(i * d).cast(), d) };
    }

    /// Count `rows` rows as written (once per task: a shared counter per row would bounce
    /// its cache line between the threads).
    fn count_written(&self, rows: usize) {
        self.written.fetch_add(rows, Ordering::Relaxed);
    }

    /// Zero rows `from..` (tokens that belong to no sequence) before the threads start.
    pub fn zero_from(&mut self, from: usize) {
        let (from, rows) = (from.min(self.rows()), self.rows());
        // SAFETY: rows `from..rows` lie inside the allocation; `&mut self` excludes writers.
        unsafe { std::ptr::write_bytes(self.ptr.add(from * self.d), 0, (rows - from) * self.d) };
        *self.written.get_mut() += rows - from;
    }

    /// The finished output; panics (never returns uninitialised values) when some row was
    /// not written, which would be a scheduler bug.
    pub fn finish(self) -> Vec<f32> {
        let me = ManuallyDrop::new(self);
        let all = me.written.load(Ordering::Relaxed) == me.rows();
        // SAFETY: (ptr, len, cap) came from a Vec<MaybeUninit<f32>> that nothing else owns;
        // with every row written once (counted) all `len` values are initialised f32, which
        // has MaybeUninit<f32>'s size and alignment.
        let (ptr, len, cap) = (me.ptr, me.len, me.cap);
        if !all {
            drop(unsafe { Vec::from_raw_parts(ptr, 0, cap) });
            panic!("an output row was not written: scheduler bug");
        }
        unsafe { Vec::from_raw_parts(ptr.cast::<f32>(), len, cap) }
    }
}

impl Drop for OutputRows {
    fn drop(&mut self) {
        // SAFETY: as in `finish`; no value is read, only the allocation returned.
        drop(unsafe { Vec::from_raw_parts(self.ptr, 0, self.cap) });
    }
}

// SAFETY: threads share `OutputRows` only through `write_row`, whose contract gives each row
// to one thread; the counter is atomic.
unsafe impl Sync for OutputRows {}

/// Merge the splits of `task` (log-sum-exp), add the sink, normalise, round to the dtype and
/// write the task's rows of `output`; `row` is a scratch row. Rows that see nothing (and have
/// no sink) come out as zeros, never NaN.
///
/// # Safety
/// Called at most once per task of one schedule, so the task's rows (which no other task of
/// the schedule has) are written by this call alone.
pub unsafe fn finalize_task<T: KvElem>(
    cfg: &AttentionConfig,
    task: &Task,
    parts: &[Partial<'_>],
    output: &OutputRows,
    row: &mut Vec<f32>,
    ops: &Ops<T>,
) {
    let d = cfg.head_size_v();
    let group = cfg.num_heads / cfg.num_kv_heads;
    // Values of an FP8 cache were summed unscaled (their kv head's scale, or per tensor), and
    // as read (`KvElem::READ_SCALE`): both join the normalisation.
    let v_scale = cfg
        .kv_cache
        .as_ref()
        .map_or(1.0, |c| c.head_scales(task.kv_head).1)
        * T::READ_SCALE;
    grow(row, d, 0.0);
    let dst = &mut row[..d];
    for r in 0..task.rows {
        let h = task.kv_head * group + r % group;
        let token = task.token0 + r / group;
        let sink = cfg.sinks.as_ref().map(|s| s[h]);
        let m = parts
            .iter()
            .map(|p| p.m[r])
            .chain(sink)
            .fold(f32::NEG_INFINITY, f32::max);
        // Weight of each split relative to the common max; splits that saw nothing weigh 0.
        let weight = |p: &Partial<'_>| {
            if p.m[r] == f32::NEG_INFINITY {
                0.0
            } else {
                (p.m[r] - m).exp()
            }
        };
        let denom = parts.iter().map(|p| weight(p) * p.l[r]).sum::<f32>()
            + sink.map_or(0.0, |s| (s - m).exp());
        if m == f32::NEG_INFINITY || denom.is_nan() || denom <= 0.0 {
            dst.fill(0.0);
        } else if let [only] = parts {
            let f = weight(only) / denom * v_scale;
            (ops.normalize)(&only.o[r * d..][..d], f, cfg.dtype, dst);
        } else {
            for (i, part) in parts.iter().enumerate() {
                let f = weight(part) / denom * v_scale;
                let o = &part.o[r * d..][..d];
                if i == 0 {
                    dst.iter_mut().zip(o).for_each(|(y, &x)| *y = x * f);
                } else {
                    dst.iter_mut().zip(o).for_each(|(y, &x)| *y += x * f);
                }
            }
            round_to(cfg.dtype, dst);
        }
        // SAFETY: row (token, h) belongs to this task alone (the function's contract).
        unsafe { output.write_row(token * cfg.num_heads + h, dst) };
    }
    output.count_written(task.rows);
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn output_rows_come_back_in_place_and_a_missing_row_is_refused() {
        let d = 3;
        let mut out = OutputRows::new(4, d).unwrap();
        out.zero_from(3);
        // SAFETY: one thread, each row written once.
        unsafe {
            out.write_row(1, &[4.0, 5.0, 6.0]);
            out.write_row(0, &[1.0, 2.0, 3.0]);
            out.write_row(2, &[7.0, 8.0, 9.0]);
        }
        out.count_written(3);
        let expect: Vec<f32> = (1..=9).map(|x| x as f32).chain([0.0; 3]).collect();
        assert_eq!(out.finish(), expect);

        let mut partial = OutputRows::new(2, d).unwrap();
        partial.zero_from(2);
        // SAFETY: as above.
        unsafe { partial.write_row(0, &[1.0, 2.0, 3.0]) };
        partial.count_written(1);
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| partial.finish()));
        assert!(refused.is_err(), "a row never written must not be returned");
    }

    #[test]
    fn query_pairs_round_like_bf16() {
        let xs: Vec<f32> = (0..999).map(|i| ((i as f32) * 0.731).sin() * 3.7).collect();
        let mut pairs = vec![u32::MAX; 500];
        pack_bf16_pairs(&xs, &mut pairs);
        for (i, &x) in xs.iter().enumerate() {
            let half = (pairs[i / 2] >> (16 * (i % 2))) & 0xffff;
            assert_eq!(half as u16, bf16::from_f32(x).to_bits(), "{x}");
        }
        assert_eq!(pairs[499] >> 16, 0, "odd tail pairs with zero");
    }

    #[test]
    fn kv_source_by_size() {
        let llc = 32 << 20;
        assert_eq!(KvSource::for_size(32 << 20, llc), KvSource::Cache);
        assert_eq!(KvSource::for_size((32 << 20) + 1, llc), KvSource::Memory);
        // No cache reported: everything streams.
        assert_eq!(KvSource::for_size(1, 0), KvSource::Memory);
        assert!(KvSource::Warm.wide_tiles() && KvSource::Cache.wide_tiles());
        assert!(!KvSource::Memory.wide_tiles());
        assert_eq!(KvSource::Warm.prefetch_blocks(16 << 10), 0);
        assert_eq!(KvSource::Cache.prefetch_blocks(16 << 10), 1);
        assert_eq!(KvSource::Memory.prefetch_blocks(16 << 10), 2);
        assert_eq!(KvSource::Memory.prefetch_blocks(64 << 10), 1);
        assert_eq!(KvSource::Memory.prefetch_blocks(1 << 10), 8);
    }

    #[test]
    fn tiles_are_whole_blocks() {
        assert_eq!(tile_keys(16, 4, false), 32);
        assert_eq!(tile_keys(16, 4, true), 128);
        assert_eq!(tile_keys(32, 64, false), 512);
        assert_eq!(tile_keys(32, 64, true), 512);
        assert_eq!(tile_keys(3, 32, false), 255);
        assert_eq!(tile_keys(1, 1, false), 32);
        assert_eq!(tile_keys(1000, 64, false), 512);
        assert_eq!(tile_keys(48, 4, false), 32);
        assert_eq!(tile_keys(48, 4, true), 96);
    }
}
