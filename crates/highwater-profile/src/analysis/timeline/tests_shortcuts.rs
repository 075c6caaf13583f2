//! The collector's shortcuts against the general way: a short-lived block's alloc and free in
//! one call (`Timeline::apply_alloc_then_free`), and a realloc whose halves are adjacent
//! applied as its second half alone. The same stream applied both ways gives the same profile.

use proptest::prelude::*;

use super::*;
use crate::analysis::{Event, EventKind, SpanSeq};
use crate::model::{SpanLabel, Step};

/// One step of a random stream, for one of three threads.
#[derive(Debug, Clone)]
enum Op {
    /// An allocation at one of a few addresses (so addresses get reused and repaired).
    Alloc {
        slot: u8,
        size: u64,
        category: u8,
    },
    /// A plain allocation freed at once: what the collector hands to the shortcut.
    ShortLived {
        slot: u8,
        size: u64,
        category: u8,
        late_free: bool,
    },
    /// A realloc in two halves; `between`: another thread allocates between them.
    Resize {
        from: u8,
        to: u8,
        size: u64,
        between: Option<u8>,
    },
    Free {
        slot: u8,
    },
    /// A realloc's first half whose second the stream lost (a dropping capture): its block
    /// waits at the thread's pending key until the thread's next realloc settles it.
    Lost {
        from: u8,
    },
    Realloc {
        from: u8,
        to: u8,
        size: u64,
    },
    SetCategory {
        slot: u8,
        category: u8,
    },
    Enter {
        label: u8,
    },
    Exit,
}

fn step() -> impl Strategy<Value = Op> {
    // Sizes up to 1 MiB with small ones common, so that peaks move both ways.
    let size = prop_oneof![1u64..256, 256u64..(1 << 20)];
    prop_oneof![
        4 => (0u8..12, size.clone(), 0u8..5).prop_map(|(slot, size, category)| Op::Alloc { slot, size, category }),
        6 => (0u8..12, size.clone(), 0u8..5, prop::bool::weighted(0.1))
            .prop_map(|(slot, size, category, late_free)| Op::ShortLived { slot, size, category, late_free }),
        4 => (0u8..12).prop_map(|slot| Op::Free { slot }),
        1 => (0u8..12).prop_map(|from| Op::Lost { from }),
        1 => (0u8..12, 0u8..12, size.clone()).prop_map(|(from, to, size)| Op::Realloc { from, to, size }),
        3 => (0u8..12, 0u8..12, size, prop::option::weighted(0.3, 0u8..12))
            .prop_map(|(from, to, size, between)| Op::Resize { from, to, size, between }),
        1 => (0u8..12, 0u8..5).prop_map(|(slot, category)| Op::SetCategory { slot, category }),
        1 => (0u8..4).prop_map(|label| Op::Enter { label }),
        1 => Just(Op::Exit),
    ]
}

fn category(index: u8) -> Category {
    Category::from_index(index % Category::COUNT as u8)
}

/// Events of the steps, each on the thread it names, with the span stacks they open; a short
/// -lived block is an `Alloc` and its `Free` next to each other (the free stamped just before
/// the allocation when `late_free`: a straggler the shortcut must leave to the general way).
fn stream(steps: &[(u8, Op)], timeline: &mut Timeline) -> Vec<Event> {
    let names = [
        timeline.intern_name("forward"),
        timeline.intern_name("backward"),
        timeline.intern_name("step"),
        timeline.intern_name("load"),
    ];
    let addr = |slot: u8| 0x1000 + u64::from(slot) * 0x40;
    let heap = DeviceId::CPU;
    let mut stacks: [Vec<SpanSeq>; 3] = Default::default();
    let mut next_id: SpanSeq = 1;
    let mut ts = 0;
    let mut events = Vec::new();
    for (thread, step) in steps {
        let thread = u32::from(*thread % 3);
        let stack = &mut stacks[thread as usize];
        let span = stack.last().copied().unwrap_or(0);
        ts += 10;
        let event = |ts_ns: u64, kind: EventKind| Event {
            ts_ns,
            thread,
            span,
            kind,
        };
        match *step {
            Op::Alloc {
                slot,
                size,
                category: c,
            } => events.push(event(
                ts,
                EventKind::Alloc {
                    device: heap,
                    addr: addr(slot),
                    size,
                    category: category(c),
                },
            )),
            Op::ShortLived {
                slot,
                size,
                category: c,
                late_free,
            } => {
                events.push(event(
                    ts,
                    EventKind::Alloc {
                        device: heap,
                        addr: addr(slot),
                        size,
                        category: category(c),
                    },
                ));
                let freed = if late_free { ts - 5 } else { ts + 5 };
                events.push(event(
                    freed,
                    EventKind::Free {
                        device: heap,
                        addr: addr(slot),
                        size,
                    },
                ));
            }
            Op::Free { slot } => events.push(event(
                ts,
                EventKind::Free {
                    device: heap,
                    addr: addr(slot),
                    size: 1,
                },
            )),
            Op::Lost { from } => events.push(event(
                ts,
                EventKind::ReallocRelease {
                    old_addr: addr(from),
                    old_size: 1,
                },
            )),
            Op::Realloc { from, to, size } => events.push(event(
                ts,
                EventKind::Realloc {
                    old_addr: addr(from),
                    old_size: 1,
                    new_addr: addr(to),
                    new_size: size,
                    category: Category::Other,
                    released_ns: None,
                },
            )),
            Op::Resize {
                from,
                to,
                size,
                between,
            } => {
                events.push(event(
                    ts,
                    EventKind::ReallocRelease {
                        old_addr: addr(from),
                        old_size: 1,
                    },
                ));
                if let Some(slot) = between {
                    // Another thread allocates meanwhile, perhaps at the address given up.
                    events.push(Event {
                        ts_ns: ts + 1,
                        thread: (thread + 1) % 3,
                        span: 0,
                        kind: EventKind::Alloc {
                            device: heap,
                            addr: addr(slot),
                            size: 64,
                            category: Category::Other,
                        },
                    });
                }
                events.push(event(
                    ts + 2,
                    EventKind::Realloc {
                        old_addr: addr(from),
                        old_size: 1,
                        new_addr: addr(to),
                        new_size: size,
                        category: Category::Other,
                        released_ns: Some(ts),
                    },
                ));
            }
            Op::SetCategory { slot, category: c } => events.push(event(
                ts,
                EventKind::SetCategory {
                    device: heap,
                    addr: addr(slot),
                    category: category(c),
                },
            )),
            Op::Enter { label } => {
                let label = match label {
                    0 => SpanLabel::Step(Step::Forward),
                    1 => SpanLabel::Step(Step::Backward),
                    2 => SpanLabel::Category(Category::Parameter),
                    _ => SpanLabel::Plain,
                };
                let id = next_id;
                next_id += 1;
                let name = names[id as usize % names.len()];
                events.push(event(ts, EventKind::SpanEnter { id, name, label }));
                stack.push(id);
            }
            Op::Exit => {
                if let Some(id) = stack.pop() {
                    events.push(Event {
                        span: id,
                        ..event(ts, EventKind::SpanExit { id })
                    });
                }
            }
        }
    }
    events
}

fn at(event: &Event) -> At {
    At {
        ts: event.ts_ns,
        thread: event.thread,
        span: event.span,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever the stream, a plain alloc and the free of its block right after it give the
    /// same profile through the shortcut as through `apply` one by one, and so does a realloc
    /// whose first half is directly followed by its second, applied without the first (a
    /// release left pending by a lost realloc of the thread still ends there).
    #[test]
    fn the_shortcuts_give_the_profile_of_the_general_way(
        steps in prop::collection::vec((0u8..3, step()), 1..200),
        top in 0usize..4,
    ) {
        let config = TimelineConfig { top_allocations: top, max_points_per_device: 16, ..TimelineConfig::default() };
        let mut general = Timeline::new(config.clone());
        let mut shortcut = Timeline::new(config);
        let events = stream(&steps, &mut general);
        stream(&steps, &mut shortcut);
        for event in &events {
            general.apply(event);
        }
        let mut rest = events.iter().peekable();
        while let Some(event) = rest.next() {
            if let EventKind::Alloc { device: DeviceId::CPU, addr, size, category } = event.kind {
                if let Some(free) = rest.next_if(|next| {
                    matches!(next.kind, EventKind::Free { device: DeviceId::CPU, addr: freed, .. } if freed == addr)
                }) {
                    shortcut.apply_alloc_then_free(at(event), at(free), addr, size, category);
                    continue;
                }
            }
            if let EventKind::ReallocRelease { old_addr, .. } = event.kind {
                let second_half = |next: &&Event| {
                    next.thread == event.thread
                        && matches!(next.kind, EventKind::Realloc { old_addr: from, released_ns: Some(released), .. }
                            if from == old_addr && released == event.ts_ns)
                };
                if rest.peek().is_some_and(second_half) {
                    shortcut.release_adjacent(event.thread, event.ts_ns);
                    continue;
                }
            }
            shortcut.apply(event);
        }
        let end = events.iter().map(|e| e.ts_ns).max().unwrap_or(0) + 10;
        let general = serde_json::to_value(general.profile(end)).unwrap();
        let shortcut = serde_json::to_value(shortcut.profile(end)).unwrap();
        prop_assert_eq!(general, shortcut);
    }
}
