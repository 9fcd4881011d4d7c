//! A small block manager in the manner of vLLM's: a free queue in eviction order (freed
//! blocks go to the back and keep their contents and their prefix key until they are handed
//! out again), reference counts for blocks shared by prefix-cache hits, and a map from the
//! content of full blocks to the block holding it.

use std::collections::{HashMap, VecDeque};

/// What a full block holds, as the prefix cache identifies it: logical block `index` of a
/// shared prefix group, or of one sequence's own tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrefixKey {
    Shared { group: usize, index: usize },
    Own { seq: usize, index: usize },
}

impl PrefixKey {
    fn index(&self) -> usize {
        match *self {
            PrefixKey::Shared { index, .. } | PrefixKey::Own { index, .. } => index,
        }
    }

    fn same_prefix(&self, other: &PrefixKey) -> bool {
        match (self, other) {
            (PrefixKey::Shared { group: a, .. }, PrefixKey::Shared { group: b, .. }) => a == b,
            (PrefixKey::Own { seq: a, .. }, PrefixKey::Own { seq: b, .. }) => a == b,
            _ => false,
        }
    }
}

pub struct BlockManager {
    /// Free blocks, the next to hand out at the front.
    free: VecDeque<u32>,
    ref_count: Vec<u32>,
    cached: HashMap<PrefixKey, u32>,
    key_of: Vec<Option<PrefixKey>>,
}

impl BlockManager {
    /// Blocks `1..num_blocks` free (block 0 is the null block, never handed out).
    pub fn new(num_blocks: usize) -> BlockManager {
        BlockManager {
            free: (1..num_blocks as u32).collect(),
            ref_count: vec![0; num_blocks],
            cached: HashMap::new(),
            key_of: vec![None; num_blocks],
        }
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// The next free block, its old prefix key forgotten (its contents are left as they are).
    /// A prefix is cached only as a whole: the blocks after an evicted one leave the prefix
    /// cache too (vLLM still reaches them by their chained hash; a case's shared blocks must
    /// be a common prefix of its tables).
    pub fn allocate(&mut self) -> Option<u32> {
        let b = self.free.pop_front()?;
        if let Some(key) = self.key_of[b as usize].take() {
            let later: Vec<PrefixKey> = self
                .cached
                .keys()
                .copied()
                .filter(|k| key.same_prefix(k) && k.index() >= key.index())
                .collect();
            for k in later {
                if let Some(block) = self.cached.remove(&k) {
                    self.key_of[block as usize] = None;
                }
            }
        }
        self.ref_count[b as usize] = 1;
        Some(b)
    }

    /// A prefix-cache hit: the block holding `key`, now held once more (taken off the free
    /// queue if nobody held it).
    pub fn lookup(&mut self, key: PrefixKey) -> Option<u32> {
        let b = *self.cached.get(&key)?;
        if self.ref_count[b as usize] == 0 {
            self.free.retain(|&f| f != b);
        }
        self.ref_count[b as usize] += 1;
        Some(b)
    }

    /// The block holding `key`, if it is cached.
    pub fn cached(&self, key: PrefixKey) -> Option<u32> {
        self.cached.get(&key).copied()
    }

    /// `block` is full and holds `key`'s tokens: later sequences may hit it.
    pub fn register(&mut self, block: u32, key: PrefixKey) {
        if self.key_of[block as usize].is_none() && !self.cached.contains_key(&key) {
            self.cached.insert(key, block);
            self.key_of[block as usize] = Some(key);
        }
    }

    /// One holder lets go of `block`; true when it became free.
    pub fn release(&mut self, block: u32) -> bool {
        let rc = &mut self.ref_count[block as usize];
        *rc -= 1;
        if *rc == 0 {
            self.free.push_back(block);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_blocks_are_reused_last_and_keep_their_prefix_until_then() {
        let mut m = BlockManager::new(4);
        let (a, b) = (m.allocate().unwrap(), m.allocate().unwrap());
        assert_eq!((a, b), (1, 2));
        let key = PrefixKey::Own { seq: 0, index: 0 };
        m.register(a, key);
        assert!(m.release(a));
        // Still cached while free: a hit takes it back off the free queue.
        assert_eq!(m.lookup(key), Some(a));
        assert_eq!(m.num_free(), 1);
        assert!(m.release(a));
        assert_eq!(m.allocate(), Some(3));
        // Handed out again: the prefix is forgotten.
        assert_eq!(m.allocate(), Some(a));
        assert_eq!(m.lookup(key), None);
        assert_eq!(m.allocate(), None);
    }

    #[test]
    fn a_shared_block_is_free_only_when_its_last_holder_lets_go() {
        let mut m = BlockManager::new(2);
        let a = m.allocate().unwrap();
        let key = PrefixKey::Shared { group: 0, index: 0 };
        m.register(a, key);
        assert_eq!(m.lookup(key), Some(a));
        assert!(!m.release(a));
        assert!(m.release(a));
        assert_eq!(m.num_free(), 1);
    }
}
