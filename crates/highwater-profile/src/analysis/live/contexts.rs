//! Contexts: what the blocks of one span instance, op and category share (device, thread,
//! owner, span node, op, category), stored once and referred to by id, counted so that those
//! no block or peak row uses any more are swept and their ids reused.

use rustc_hash::FxHashMap;

use super::super::event::DeviceId;
use super::{Origin, NONE};
use crate::model::Category;

/// What blocks share: everything about a live block but its address, size and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Context {
    pub(super) device: DeviceId,
    pub(super) category: Category,
    pub(super) thread: u32,
    pub(super) owner: u32,
    pub(super) origin: Origin,
}

/// Threads whose last context is remembered.
const RECENT: usize = 8;

/// Interned contexts with reference counts (live blocks and side rows that use each).
#[derive(Debug, Default)]
pub(super) struct Contexts {
    pub(super) table: Vec<(Context, u32)>,
    pub(super) ids: FxHashMap<Context, u32>,
    /// Ids of swept contexts, for reuse.
    pub(super) free: Vec<u32>,
    /// Contexts with a non-zero count.
    pub(super) in_use: usize,
    /// The last context interned per thread (by thread number modulo [`RECENT`]): a thread's
    /// consecutive blocks mostly share one, while threads interleave.
    pub(super) recent: [Option<(Context, u32)>; RECENT],
}

impl Contexts {
    /// The id of `context`, with one more reference.
    #[inline]
    pub(super) fn acquire(&mut self, context: Context) -> u32 {
        let slot = context.thread as usize % RECENT;
        let id = match self.recent[slot] {
            Some((recent, id)) if recent == context => id,
            _ => {
                let id = self.intern(context);
                self.recent[slot] = Some((context, id));
                id
            }
        };
        self.retain(id);
        id
    }

    /// Out of line: the recent contexts answer most acquisitions, which then stay small
    /// enough to inline.
    #[inline(never)]
    pub(super) fn intern(&mut self, context: Context) -> u32 {
        if let Some(&id) = self.ids.get(&context) {
            return id;
        }
        // Sweep unused contexts once they outnumber the used ones (amortised O(1)): counts
        // that reach zero are not removed at once, since a context often comes right back.
        if self.free.is_empty() && self.table.len() >= 2 * self.in_use + 1024 {
            self.sweep();
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.table[id as usize] = (context, 0);
                id
            }
            None => {
                self.table.push((context, 0));
                u32::try_from(self.table.len() - 1).unwrap_or(NONE)
            }
        };
        self.ids.insert(context, id);
        id
    }

    pub(super) fn sweep(&mut self) {
        let Contexts {
            table, ids, free, ..
        } = self;
        ids.retain(|_, id| {
            let unused = table[*id as usize].1 == 0;
            if unused {
                free.push(*id);
            }
            !unused
        });
        self.recent = [None; RECENT];
    }

    #[inline]
    pub(super) fn retain(&mut self, id: u32) {
        let count = &mut self.table[id as usize].1;
        *count += 1;
        if *count == 1 {
            self.in_use += 1;
        }
    }

    #[inline]
    pub(super) fn release(&mut self, id: u32) {
        let count = &mut self.table[id as usize].1;
        *count -= 1;
        if *count == 0 {
            self.in_use -= 1;
        }
    }

    #[inline]
    pub(super) fn get(&self, id: u32) -> Context {
        self.table[id as usize].0
    }

    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.table.capacity() * std::mem::size_of::<(Context, u32)>()
            + self.ids.capacity() * (std::mem::size_of::<(Context, u32)>() + 1)
            + self.free.capacity() * 4
    }
}
