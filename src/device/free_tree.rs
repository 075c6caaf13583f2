//! Address-ordered index of free blocks that answers "lowest address with at least `n` bytes".
//!
//! First fit needs the free block with the lowest offset among those large enough. A `BTreeMap`
//! keyed by offset cannot answer that without walking it, so this is a treap keyed by offset in
//! which every node also stores the largest free size in its subtree. The search descends left
//! whenever the left subtree holds a large enough block, so it visits one root-to-leaf path:
//! O(log n) expected, like insertion and removal.

/// Marks an absent child.
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    /// Start of the free block (the key).
    offset: u64,
    /// Size of the free block.
    size: u64,
    /// The owner's handle for the block (its index in the owner's block list).
    block: u32,
    /// Largest `size` in the subtree rooted here; kept current by `pull`.
    max: u64,
    /// Heap priority: parents have higher priority than children.
    priority: u64,
    left: u32,
    right: u32,
}

/// A treap of free blocks keyed by offset, augmented with subtree maximum sizes.
///
/// Equality compares the blocks held, not the tree's shape, which depends on history.
#[derive(Debug, Clone)]
pub(crate) struct FreeTree {
    /// Node storage; `vacant` lists slots that can be reused.
    nodes: Vec<Node>,
    vacant: Vec<u32>,
    root: u32,
    /// splitmix64 state for priorities (deterministic, so pools are reproducible).
    seed: u64,
    /// Scratch for [`FreeTree::update`]'s search path, kept so updates do not allocate.
    path: Vec<u32>,
}

impl FreeTree {
    pub(crate) fn new() -> Self {
        Self {
            nodes: Vec::new(),
            vacant: Vec::new(),
            root: NIL,
            seed: 0x9e37_79b9_7f4a_7c15,
            path: Vec::new(),
        }
    }

    /// The lowest-offset free block holding at least `size` bytes, as `(offset, size, block)`.
    pub(crate) fn first_fit(&self, size: u64) -> Option<(u64, u64, u32)> {
        let mut t = self.root;
        if t == NIL || self.nodes[t as usize].max < size {
            return None;
        }
        loop {
            let node = &self.nodes[t as usize];
            if node.left != NIL && self.nodes[node.left as usize].max >= size {
                t = node.left;
            } else if node.size >= size {
                return Some((node.offset, node.size, node.block));
            } else {
                // The subtree's max is >= size and neither the left side nor this node has it.
                t = node.right;
                if t == NIL {
                    return None;
                }
            }
        }
    }

    /// Size of the largest block, 0 when empty.
    pub(crate) fn max_size(&self) -> u64 {
        if self.root == NIL {
            0
        } else {
            self.nodes[self.root as usize].max
        }
    }

    /// Adds a free block with its owner's handle; `offset` must not be present.
    pub(crate) fn insert(&mut self, offset: u64, size: u64, block: u32) {
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let priority = mix(self.seed);
        let node = Node {
            offset,
            size,
            block,
            max: size,
            priority,
            left: NIL,
            right: NIL,
        };
        let index = match self.vacant.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.root = self.insert_at(self.root, index);
    }

    /// Inserts node `n` under `t` by key, rotating it up while its priority beats its parent's;
    /// returns the subtree's new root.
    fn insert_at(&mut self, t: u32, n: u32) -> u32 {
        if t == NIL {
            return n;
        }
        if self.nodes[n as usize].offset < self.nodes[t as usize].offset {
            let l = self.insert_at(self.nodes[t as usize].left, n);
            self.nodes[t as usize].left = l;
            if self.nodes[l as usize].priority > self.nodes[t as usize].priority {
                // Rotate right: `l` takes `t`'s place and `t` becomes its right child.
                self.nodes[t as usize].left = self.nodes[l as usize].right;
                self.pull(t);
                self.nodes[l as usize].right = t;
                self.pull(l);
                return l;
            }
        } else {
            let r = self.insert_at(self.nodes[t as usize].right, n);
            self.nodes[t as usize].right = r;
            if self.nodes[r as usize].priority > self.nodes[t as usize].priority {
                // Rotate left: `r` takes `t`'s place and `t` becomes its left child.
                self.nodes[t as usize].right = self.nodes[r as usize].left;
                self.pull(t);
                self.nodes[r as usize].left = t;
                self.pull(r);
                return r;
            }
        }
        self.pull(t);
        t
    }

    /// Removes the free block at `offset`; returns whether it was present.
    pub(crate) fn remove(&mut self, offset: u64) -> bool {
        let (root, found) = self.remove_at(self.root, offset);
        self.root = root;
        found
    }

    /// Removes `key` from the subtree at `t`; returns the subtree's new root and whether the key
    /// was there.
    fn remove_at(&mut self, t: u32, key: u64) -> (u32, bool) {
        if t == NIL {
            return (NIL, false);
        }
        let node = &self.nodes[t as usize];
        if key < node.offset {
            let (l, found) = self.remove_at(node.left, key);
            self.nodes[t as usize].left = l;
            if found {
                self.pull(t);
            }
            (t, found)
        } else if key > node.offset {
            let (r, found) = self.remove_at(node.right, key);
            self.nodes[t as usize].right = r;
            if found {
                self.pull(t);
            }
            (t, found)
        } else {
            let (l, r) = (node.left, node.right);
            self.vacant.push(t);
            (self.merge(l, r), true)
        }
    }

    /// Moves the block at `offset` to `new_offset` with `new_size` and handle `block`, in place;
    /// returns whether it was present. No other block may lie between `offset` and
    /// `new_offset`, so the tree's order is unchanged and only the maxima along the path are
    /// recomputed.
    pub(crate) fn update(
        &mut self,
        offset: u64,
        new_offset: u64,
        new_size: u64,
        block: u32,
    ) -> bool {
        // Iterative: the descent is one search path, and the maxima on it are recomputed from
        // the node up only until one does not change (those above it cannot change then).
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let mut t = self.root;
        while t != NIL {
            path.push(t);
            let node = &self.nodes[t as usize];
            t = match offset.cmp(&node.offset) {
                std::cmp::Ordering::Less => node.left,
                std::cmp::Ordering::Greater => node.right,
                std::cmp::Ordering::Equal => break,
            };
        }
        let found = t != NIL;
        if found {
            let node = &mut self.nodes[t as usize];
            (node.offset, node.size, node.block) = (new_offset, new_size, block);
            for &n in path.iter().rev() {
                let before = self.nodes[n as usize].max;
                self.pull(n);
                if self.nodes[n as usize].max == before {
                    break;
                }
            }
        }
        self.path = path;
        found
    }

    /// In-order `(offset, size)` pairs.
    pub(crate) fn entries(&self) -> Vec<(u64, u64)> {
        self.entries_with_blocks()
            .into_iter()
            .map(|(offset, size, _)| (offset, size))
            .collect()
    }

    /// In-order `(offset, size, block)` triples.
    pub(crate) fn entries_with_blocks(&self) -> Vec<(u64, u64, u32)> {
        let mut out = Vec::new();
        let mut stack = Vec::new();
        let mut t = self.root;
        while t != NIL || !stack.is_empty() {
            while t != NIL {
                stack.push(t);
                t = self.nodes[t as usize].left;
            }
            if let Some(n) = stack.pop() {
                let node = &self.nodes[n as usize];
                out.push((node.offset, node.size, node.block));
                t = node.right;
            }
        }
        out
    }

    fn pull(&mut self, t: u32) {
        let node = &self.nodes[t as usize];
        let mut max = node.size;
        if node.left != NIL {
            max = max.max(self.nodes[node.left as usize].max);
        }
        if node.right != NIL {
            max = max.max(self.nodes[node.right as usize].max);
        }
        self.nodes[t as usize].max = max;
    }

    /// Joins two treaps where every offset in `a` is below every offset in `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].priority > self.nodes[b as usize].priority {
            let r = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = r;
            self.pull(a);
            a
        } else {
            let l = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = l;
            self.pull(b);
            b
        }
    }
}

impl PartialEq for FreeTree {
    fn eq(&self, other: &Self) -> bool {
        self.entries() == other.entries()
    }
}

impl Eq for FreeTree {}

/// splitmix64 finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_finds_lowest_address_large_enough() {
        let mut t = FreeTree::new();
        for (off, size) in [(0, 100), (1000, 500), (2000, 300), (3000, 800), (4000, 500)] {
            t.insert(off, size, off as u32);
        }
        assert_eq!(t.first_fit(50).map(|b| b.0), Some(0));
        assert_eq!(t.first_fit(200).map(|b| b.0), Some(1000));
        assert_eq!(t.first_fit(600).map(|b| b.0), Some(3000));
        assert_eq!(t.first_fit(801), None);
        assert_eq!(t.first_fit(600), Some((3000, 800, 3000)));
        assert!(t.remove(1000));
        assert!(!t.remove(1000));
        assert_eq!(t.first_fit(200).map(|b| b.0), Some(2000));
        assert_eq!(t.first_fit(400).map(|b| b.0), Some(3000));
        assert_eq!(
            t.entries(),
            vec![(0, 100), (2000, 300), (3000, 800), (4000, 500)]
        );
    }

    #[test]
    fn first_fit_matches_linear_scan_on_many_blocks() {
        let mut t = FreeTree::new();
        let mut model = std::collections::BTreeMap::new();
        let mut x = 7u64;
        for i in 0..2000u64 {
            x = mix(x.wrapping_add(i));
            let off = (x % 10_000) * 16;
            if let std::collections::btree_map::Entry::Vacant(e) = model.entry(off) {
                let size = 1 + (x >> 20) % 1000;
                e.insert(size);
                t.insert(off, size, i as u32);
            } else if x.is_multiple_of(3) {
                model.remove(&off);
                assert!(t.remove(off));
            } else {
                let size = 1 + (x >> 24) % 1000;
                model.insert(off, size);
                assert!(t.update(off, off, size, 0));
            }
            let want = 1 + (x >> 40) % 1000;
            let expect = model
                .iter()
                .find(|(_, &s)| s >= want)
                .map(|(&o, &s)| (o, s));
            assert_eq!(t.first_fit(want).map(|(o, s, _)| (o, s)), expect);
            assert_eq!(t.max_size(), model.values().copied().max().unwrap_or(0));
        }
    }
}
