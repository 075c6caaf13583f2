//! Address-ordered index of free blocks that answers "lowest address with at least `n` bytes".
//!
//! First fit needs the free block with the lowest offset among those large enough. A `BTreeMap`
//! keyed by offset cannot answer that without walking it, so this is a treap keyed by offset in
//! which every node also stores the largest free size in its subtree. The search descends left
//! whenever the left subtree holds a large enough block, so it visits one root-to-leaf path:
//! O(log n) expected.
//!
//! The owner names each free block by its handle (its index in the owner's block list), and the
//! tree finds a handle's node directly, so changing or removing a block never searches by offset:
//! nodes link to their parent, and a change recomputes the subtree maxima upwards only until one
//! of them stays the same (those above it cannot change then). Most changes (a split's remainder
//! shrinking, a freed block growing into its neighbour) stop after a node or two.

/// Marks an absent node (child, parent, or a handle with no node).
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    /// Start of the free block (the key).
    offset: u64,
    /// Size of the free block.
    size: u64,
    /// Largest `size` in the subtree rooted here; kept current by `pull`.
    max: u64,
    /// The owner's handle for the block.
    block: u32,
    /// Heap priority: parents have at least their children's priority.
    priority: u32,
    left: u32,
    right: u32,
    parent: u32,
}

/// A treap of free blocks keyed by offset, augmented with subtree maximum sizes, addressed by
/// the owner's block handles.
///
/// Equality compares the blocks held, not the tree's shape, which depends on history.
#[derive(Debug, Clone)]
pub(crate) struct FreeTree {
    /// Node storage; `vacant` lists slots that can be reused.
    nodes: Vec<Node>,
    vacant: Vec<u32>,
    root: u32,
    /// The node of each handle in the tree (indexed by handle; `NIL` or stale for others).
    node_of: Vec<u32>,
    /// splitmix64 state for priorities (deterministic, so pools are reproducible).
    seed: u64,
}

impl FreeTree {
    pub(crate) fn new() -> Self {
        Self {
            nodes: Vec::new(),
            vacant: Vec::new(),
            root: NIL,
            node_of: Vec::new(),
            seed: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// The lowest-offset free block holding at least `size` bytes: its handle.
    pub(crate) fn first_fit(&self, size: u64) -> Option<u32> {
        let mut t = self.root;
        if t == NIL || self.nodes[t as usize].max < size {
            return None;
        }
        loop {
            let node = &self.nodes[t as usize];
            if node.left != NIL && self.nodes[node.left as usize].max >= size {
                t = node.left;
            } else if node.size >= size {
                return Some(node.block);
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

    /// Adds the free block `block` at `offset`; neither the handle nor the offset may be present.
    pub(crate) fn insert(&mut self, offset: u64, size: u64, block: u32) {
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let node = Node {
            offset,
            size,
            max: size,
            block,
            priority: (mix(self.seed) >> 32) as u32,
            left: NIL,
            right: NIL,
            parent: NIL,
        };
        let n = match self.vacant.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.set_node_of(block, n);
        if self.root == NIL {
            self.root = n;
            return;
        }
        // Down to a leaf by key; every node passed gets the new block in its subtree.
        let mut t = self.root;
        loop {
            let at = &mut self.nodes[t as usize];
            at.max = at.max.max(size);
            let child = if offset < at.offset {
                &mut at.left
            } else {
                &mut at.right
            };
            if *child == NIL {
                *child = n;
                break;
            }
            t = *child;
        }
        self.nodes[n as usize].parent = t;
        // Up while the new node outranks its parent; each rotation keeps both maxima current.
        while let Some(p) = self.parent(n) {
            if self.nodes[n as usize].priority <= self.nodes[p as usize].priority {
                break;
            }
            self.rotate_up(n);
        }
    }

    /// Removes the free block `block`; returns whether it was present.
    pub(crate) fn remove(&mut self, block: u32) -> bool {
        let Some(n) = self.node(block) else {
            return false;
        };
        // Down until it has at most one child, lifting the higher-priority child each time.
        loop {
            let node = &self.nodes[n as usize];
            let (l, r) = (node.left, node.right);
            if l == NIL || r == NIL {
                break;
            }
            let lift = if self.nodes[l as usize].priority > self.nodes[r as usize].priority {
                l
            } else {
                r
            };
            self.rotate_up(lift);
        }
        let node = &self.nodes[n as usize];
        // `min` picks the one child there is (NIL is u32::MAX), or NIL for a leaf.
        let (parent, child) = (node.parent, node.left.min(node.right));
        if child != NIL {
            self.nodes[child as usize].parent = parent;
        }
        self.replace_child(parent, n, child);
        self.node_of[block as usize] = NIL;
        self.vacant.push(n);
        self.pull_up(parent);
        true
    }

    /// Gives the free block `block` a new offset, size and handle, in place; returns whether it
    /// was present. No other block may lie between the old and the new offset, so the tree's
    /// order is unchanged and only the maxima above the node are recomputed.
    pub(crate) fn update(
        &mut self,
        block: u32,
        new_offset: u64,
        new_size: u64,
        new_block: u32,
    ) -> bool {
        let Some(n) = self.node(block) else {
            return false;
        };
        let node = &mut self.nodes[n as usize];
        (node.offset, node.size, node.block) = (new_offset, new_size, new_block);
        if new_block != block {
            self.node_of[block as usize] = NIL;
            self.set_node_of(new_block, n);
        }
        self.pull_up(n);
        true
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

    /// Checks links, key order, heap order, maxima and handles; for tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        /// Checks the subtree at `t` with keys in `[lo, hi)`; returns its node count.
        fn walk(tree: &FreeTree, t: u32, parent: u32, lo: u64, hi: u64) -> usize {
            if t == NIL {
                return 0;
            }
            let node = &tree.nodes[t as usize];
            assert_eq!(node.parent, parent, "parent link of node {t}");
            assert!(
                lo <= node.offset && node.offset < hi,
                "key order at {}",
                node.offset
            );
            assert_eq!(tree.node(node.block), Some(t), "handle {}", node.block);
            let mut max = node.size;
            for child in [node.left, node.right] {
                if child != NIL {
                    let c = &tree.nodes[child as usize];
                    assert!(c.priority <= node.priority, "heap order at {}", node.offset);
                    max = max.max(c.max);
                }
            }
            assert_eq!(node.max, max, "subtree max at {}", node.offset);
            1 + walk(tree, node.left, t, lo, node.offset)
                + walk(tree, node.right, t, node.offset + 1, hi)
        }
        let count = walk(self, self.root, NIL, 0, u64::MAX);
        assert_eq!(count + self.vacant.len(), self.nodes.len());
        let handles = self.node_of.iter().filter(|&&n| n != NIL).count();
        assert_eq!(handles, count, "every handle with a node is in the tree");
    }

    /// The node of handle `block`, if it is in the tree.
    fn node(&self, block: u32) -> Option<u32> {
        self.node_of
            .get(block as usize)
            .copied()
            .filter(|&n| n != NIL)
    }

    fn set_node_of(&mut self, block: u32, n: u32) {
        let i = block as usize;
        if i >= self.node_of.len() {
            self.node_of.resize(i + 1, NIL);
        }
        self.node_of[i] = n;
    }

    fn parent(&self, n: u32) -> Option<u32> {
        let p = self.nodes[n as usize].parent;
        (p != NIL).then_some(p)
    }

    /// Makes `new` the child of `parent` that `old` was (the root when `parent` is `NIL`).
    fn replace_child(&mut self, parent: u32, old: u32, new: u32) {
        if parent == NIL {
            self.root = new;
        } else if self.nodes[parent as usize].left == old {
            self.nodes[parent as usize].left = new;
        } else {
            self.nodes[parent as usize].right = new;
        }
    }

    /// Rotates `n` above its parent, keeping key order; recomputes both nodes' maxima (the
    /// pair's subtree holds the same blocks, so nothing above changes).
    fn rotate_up(&mut self, n: u32) {
        let p = self.nodes[n as usize].parent;
        let g = self.nodes[p as usize].parent;
        if self.nodes[p as usize].left == n {
            let moved = self.nodes[n as usize].right;
            self.nodes[p as usize].left = moved;
            if moved != NIL {
                self.nodes[moved as usize].parent = p;
            }
            self.nodes[n as usize].right = p;
        } else {
            let moved = self.nodes[n as usize].left;
            self.nodes[p as usize].right = moved;
            if moved != NIL {
                self.nodes[moved as usize].parent = p;
            }
            self.nodes[n as usize].left = p;
        }
        self.nodes[p as usize].parent = n;
        self.nodes[n as usize].parent = g;
        self.replace_child(g, p, n);
        self.pull(p);
        self.pull(n);
    }

    /// Recomputes maxima from `t` towards the root until one is unchanged.
    fn pull_up(&mut self, mut t: u32) {
        while t != NIL {
            let before = self.nodes[t as usize].max;
            self.pull(t);
            let node = &self.nodes[t as usize];
            if node.max == before {
                break;
            }
            t = node.parent;
        }
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

    /// First fit's answer as `(offset, size)`, looked up through the handle, which the tests
    /// below make equal to the offset divided by 16.
    fn fit(t: &FreeTree, size: u64) -> Option<(u64, u64)> {
        let block = t.first_fit(size)?;
        t.entries_with_blocks()
            .into_iter()
            .find(|e| e.2 == block)
            .map(|(o, s, _)| (o, s))
    }

    #[test]
    fn first_fit_finds_lowest_address_large_enough() {
        let mut t = FreeTree::new();
        for (off, size) in [(0, 100), (1000, 500), (2000, 300), (3000, 800), (4000, 500)] {
            t.insert(off, size, (off / 16) as u32);
        }
        t.check();
        assert_eq!(fit(&t, 50).map(|b| b.0), Some(0));
        assert_eq!(fit(&t, 200).map(|b| b.0), Some(1000));
        assert_eq!(fit(&t, 600).map(|b| b.0), Some(3000));
        assert_eq!(t.first_fit(801), None);
        assert_eq!(t.first_fit(600), Some(3000 / 16));
        assert!(t.remove(1000 / 16));
        assert!(!t.remove(1000 / 16));
        t.check();
        assert_eq!(fit(&t, 200).map(|b| b.0), Some(2000));
        assert_eq!(fit(&t, 400).map(|b| b.0), Some(3000));
        assert_eq!(
            t.entries(),
            vec![(0, 100), (2000, 300), (3000, 800), (4000, 500)]
        );
    }

    #[test]
    fn update_moves_a_block_to_a_new_handle_and_keeps_the_maxima() {
        let mut t = FreeTree::new();
        for (off, size) in [(0, 100), (1000, 500), (2000, 300)] {
            t.insert(off, size, (off / 16) as u32);
        }
        // The 500-byte block shrinks from its low end and takes handle 7: the largest is 300.
        assert!(t.update(1000 / 16, 1200, 300, 7));
        t.check();
        assert_eq!(t.max_size(), 300);
        assert_eq!(t.first_fit(250), Some(7));
        assert!(!t.update(1000 / 16, 1200, 300, 8), "the old handle is gone");
        assert!(t.remove(7));
        assert_eq!(t.entries(), vec![(0, 100), (2000, 300)]);
        t.check();
    }

    #[test]
    fn first_fit_matches_linear_scan_on_many_blocks() {
        let mut t = FreeTree::new();
        let mut model = std::collections::BTreeMap::new();
        let mut x = 7u64;
        for i in 0..2000u64 {
            x = mix(x.wrapping_add(i));
            let off = (x % 10_000) * 16;
            let block = (off / 16) as u32;
            if let std::collections::btree_map::Entry::Vacant(e) = model.entry(off) {
                let size = 1 + (x >> 20) % 1000;
                e.insert(size);
                t.insert(off, size, block);
            } else if x.is_multiple_of(3) {
                model.remove(&off);
                assert!(t.remove(block));
            } else {
                let size = 1 + (x >> 24) % 1000;
                model.insert(off, size);
                assert!(t.update(block, off, size, block));
            }
            if i % 64 == 0 {
                t.check();
            }
            let want = 1 + (x >> 40) % 1000;
            let expect = model
                .iter()
                .find(|(_, &s)| s >= want)
                .map(|(&o, &s)| (o, s));
            assert_eq!(fit(&t, want), expect);
            assert_eq!(t.max_size(), model.values().copied().max().unwrap_or(0));
        }
        t.check();
    }
}
