//! The raw codec's tests: every record decodes to what was encoded.

use proptest::prelude::*;

use super::*;
use crate::model::Step;

/// Encodes `decoded` with the constructor the hook uses for its kind.
fn encode(decoded: &Decoded) -> Vec<RawEvent> {
    let (ticks, span) = (decoded.ticks, decoded.span);
    match decoded.record {
        Record::Alloc {
            addr,
            size,
            category,
        } => vec![RawEvent::alloc(ticks, span, category, addr, size)],
        Record::Free { addr, size } => vec![RawEvent::free(ticks, span, addr, size)],
        Record::Realloc {
            released,
            old_addr,
            old_size,
            new_addr,
            new_size,
            category,
        } => RawEvent::realloc(
            released,
            ticks,
            span,
            category,
            (old_addr, old_size),
            (new_addr, new_size),
        )
        .to_vec(),
        Record::SpanEnter { name, id, label } => {
            vec![RawEvent::span_enter(ticks, span, name, id, label)]
        }
        Record::SpanExit => vec![RawEvent::span_exit(ticks, span)],
        Record::OpBegin { name } => vec![RawEvent::op_begin(ticks, span, name)],
        Record::OpEnd => vec![RawEvent::op_end(ticks, span)],
        Record::DeviceAlloc {
            device,
            tensor,
            bytes,
            category,
        } => {
            vec![RawEvent::device_alloc(
                ticks, span, device, category, tensor, bytes,
            )]
        }
        Record::DeviceFree {
            device,
            tensor,
            bytes,
        } => vec![RawEvent::device_free(ticks, span, device, tensor, bytes)],
        Record::SetCategory {
            device,
            key,
            category,
        } => vec![RawEvent::set_category(ticks, span, device, key, category)],
        Record::Annotate {
            device,
            key,
            op,
            shape,
            dtype,
        } => RawEvent::annotation(ticks, span, device, key, op, shape, dtype).to_vec(),
        Record::PoolState { device, pool } => {
            RawEvent::pool_state(ticks, span, device, pool).to_vec()
        }
        Record::Oom {
            device,
            source,
            requested,
            largest_free,
        } => vec![RawEvent::oom(
            ticks,
            span,
            device,
            source,
            requested,
            largest_free,
        )],
        Record::DeviceMemory { kind, device, a, b } => {
            vec![RawEvent::device_memory(kind, ticks, span, device, a, b)]
        }
    }
}

const NAMES: [&str; 4] = ["", "forward", "époque ✓", "a name with spaces"];

fn category() -> impl Strategy<Value = Category> {
    (0u8..Category::COUNT as u8).prop_map(Category::from_index)
}

fn label() -> impl Strategy<Value = SpanLabel> {
    prop_oneof![
        Just(SpanLabel::Plain),
        Just(SpanLabel::Step(Step::Forward)),
        Just(SpanLabel::Step(Step::Backward)),
        Just(SpanLabel::Step(Step::Optimizer)),
        category().prop_map(SpanLabel::Category),
    ]
}

fn record(ticks: u64) -> impl Strategy<Value = Record> {
    let id = || proptest::option::of(0u32..u32::MAX);
    prop_oneof![
        (any::<u64>(), any::<u64>(), category()).prop_map(|(addr, size, category)| {
            Record::Alloc {
                addr,
                size,
                category,
            }
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(addr, size)| Record::Free { addr, size }),
        (0..=ticks, any::<[u64; 4]>(), category()).prop_map(|(released, w, category)| {
            Record::Realloc {
                released,
                old_addr: w[0],
                old_size: w[1],
                new_addr: w[2],
                new_size: w[3],
                category,
            }
        }),
        (0..NAMES.len(), any::<u32>(), label()).prop_map(|(name, id, label)| {
            Record::SpanEnter {
                name: NAMES[name],
                id,
                label,
            }
        }),
        Just(Record::SpanExit),
        any::<u32>().prop_map(|name| Record::OpBegin { name }),
        Just(Record::OpEnd),
        (any::<u16>(), any::<u64>(), any::<u64>(), category()).prop_map(
            |(device, tensor, bytes, category)| Record::DeviceAlloc {
                device,
                tensor,
                bytes,
                category
            }
        ),
        (any::<u16>(), any::<u64>(), any::<u64>()).prop_map(|(device, tensor, bytes)| {
            Record::DeviceFree {
                device,
                tensor,
                bytes,
            }
        }),
        (any::<u16>(), any::<u64>(), category()).prop_map(|(device, key, category)| {
            Record::SetCategory {
                device,
                key,
                category,
            }
        }),
        (any::<u16>(), any::<u64>(), any::<u32>(), id(), id()).prop_map(
            |(device, key, op, shape, dtype)| Record::Annotate {
                device,
                key,
                op,
                shape,
                dtype
            }
        ),
        (any::<u16>(), any::<[u64; 3]>(), any::<u64>()).prop_map(|(device, w, bits)| {
            Record::PoolState {
                device,
                pool: PoolReport {
                    capacity: w[0],
                    reserved: w[1],
                    largest_free: w[2],
                    // Any finite value: NaN would not compare equal to itself.
                    fragmentation: (bits % 1_000_000) as f64 / 1_000_000.0,
                },
            }
        }),
        (
            any::<u16>(),
            0u8..3,
            any::<u64>(),
            proptest::option::of(0..u64::MAX)
        )
            .prop_map(|(device, source, requested, largest_free)| Record::Oom {
                device,
                source: OomSource::from_byte(source),
                requested,
                largest_free,
            }),
        (any::<u16>(), 0usize..5, any::<u64>(), any::<u64>()).prop_map(|(device, kind, a, b)| {
            Record::DeviceMemory {
                kind: [
                    DeviceMemoryKind::Reserved,
                    DeviceMemoryKind::Memory,
                    DeviceMemoryKind::Map,
                    DeviceMemoryKind::Unmap,
                    DeviceMemoryKind::Release,
                ][kind],
                device,
                a,
                b,
            }
        }),
    ]
}

fn decoded() -> impl Strategy<Value = Decoded> {
    (1u64..u64::MAX, any::<u32>()).prop_flat_map(|(ticks, span)| {
        record(ticks).prop_map(move |record| Decoded {
            sampled: false,
            ticks,
            span,
            record,
        })
    })
}

proptest! {
    /// Whatever the hook encodes, the collector decodes to the same record, in order, with
    /// the halves of four-word records joined even when a drain splits them.
    #[test]
    fn every_record_decodes_to_what_was_encoded(records in proptest::collection::vec(decoded(), 1..64)) {
        let mut decoder = Decoder::default();
        let mut out = Vec::new();
        for record in &records {
            let raws = encode(record);
            prop_assert_eq!(RawKind::from_byte(raws[0].kind).is_some_and(RawKind::is_head), raws.len() == 2);
            for raw in raws {
                out.extend(decoder.decode(raw));
            }
        }
        prop_assert_eq!(out.len(), records.len());
        for (got, want) in out.iter().zip(&records) {
            prop_assert_eq!(got.record.kind(), want.record.kind());
            prop_assert_eq!(got, want);
        }
    }
}

/// Decodes a sampled alloc built as a unit of `N` events.
fn sampled_alloc<const N: usize>(pcs: &[u64], walk: StackWalk) -> (Vec<u64>, StackWalk, Decoded) {
    let alloc = RawEvent::alloc(9, 2, Category::Gradient, 0x1000, 64);
    let mut decoder = Decoder::default();
    let mut out = Vec::new();
    // A plain record before and after: stacks never leak into neighbours.
    out.extend(decoder.decode(RawEvent::free(1, 0, 8, 8)));
    assert_eq!(decoder.stack().0, &[] as &[u64]);
    for raw in RawEvent::sampled::<N, 1>(pcs, walk, [alloc]) {
        out.extend(decoder.decode(raw));
    }
    let (stack, cut) = decoder.stack();
    let got = (stack.to_vec(), cut, out[1]);
    out.extend(decoder.decode(RawEvent::free(10, 0, 8, 8)));
    assert!(!out[2].sampled);
    assert_eq!(decoder.stack().0, &[] as &[u64]);
    got
}

proptest! {
    /// A sampled allocation's stack comes back whole, in order, with the allocation
    /// itself, in every unit size the hook uses; a stack longer than the unit is cut and
    /// says so.
    #[test]
    fn a_sampled_stack_decodes_to_what_was_walked(
        pcs in proptest::collection::vec(1u64.., 0..=64),
        truncated in any::<bool>(),
        by_tables in any::<bool>(),
    ) {
        let unwinder = if by_tables { Unwinder::EhFrame } else { Unwinder::FramePointers };
        let walk = StackWalk { truncated, unwinder };
        for (parts, (stack, got, decoded)) in [
            (1, sampled_alloc::<2>(&pcs, walk)),
            (4, sampled_alloc::<5>(&pcs, walk)),
            (8, sampled_alloc::<9>(&pcs, walk)),
            (16, sampled_alloc::<17>(&pcs, walk)),
            (32, sampled_alloc::<33>(&pcs, walk)),
        ] {
            let kept = pcs.len().min(2 * parts);
            prop_assert_eq!(&stack[..], &pcs[..kept]);
            prop_assert_eq!(got.truncated, truncated || kept < pcs.len());
            prop_assert_eq!(got.unwinder, unwinder);
            prop_assert!(decoded.sampled);
            prop_assert_eq!(decoded.ticks, 9);
            prop_assert_eq!(decoded.span, 2);
            prop_assert_eq!(decoded.record, Record::Alloc { addr: 0x1000, size: 64, category: Category::Gradient });
        }
    }
}

#[test]
fn a_sampled_realloc_keeps_both_halves_and_its_stack() {
    let halves = RawEvent::realloc(3, 4, 1, Category::Optimizer, (10, 20), (30, 40));
    let kinds = RawEvent::sampled_kinds::<6, 2>([RawKind::ReallocFrom, RawKind::ReallocTo]);
    assert_eq!(kinds[..4], [RawKind::StackPcs; 4]);
    assert_eq!(kinds[4..], [RawKind::ReallocFrom, RawKind::ReallocTo]);
    let mut decoder = Decoder::default();
    let walk = StackWalk {
        truncated: false,
        unwinder: Unwinder::EhFrame,
    };
    let decoded: Vec<Decoded> = RawEvent::sampled::<6, 2>(&[7, 8, 9], walk, halves)
        .into_iter()
        .filter_map(|raw| decoder.decode(raw))
        .collect();
    assert_eq!(decoded.len(), 1);
    assert!(decoded[0].sampled);
    assert_eq!(
        decoded[0].record,
        Record::Realloc {
            released: 3,
            old_addr: 10,
            old_size: 20,
            new_addr: 30,
            new_size: 40,
            category: Category::Optimizer
        }
    );
    assert_eq!(decoder.stack(), (&[7, 8, 9][..], walk));
    // The next plain record leaves no stack, and no unwinder, behind it.
    decoder.decode(RawEvent::free(11, 0, 8, 8));
    assert_eq!(decoder.stack(), (&[][..], StackWalk::default()));
}

#[test]
fn a_span_name_is_the_same_static_str() {
    let name: &'static str = "step ✓";
    let raw = RawEvent::span_enter(7, 3, name, 9, SpanLabel::Plain);
    let Some(Decoded {
        record: Record::SpanEnter { name: got, id, .. },
        span,
        ..
    }) = Decoder::default().decode(raw)
    else {
        panic!("a span entry decodes to one");
    };
    assert_eq!((got, got.as_ptr(), id, span), (name, name.as_ptr(), 9, 3));
}

#[test]
fn a_second_half_without_its_first_decodes_with_zero_words() {
    let [_, tail] = RawEvent::realloc(1, 2, 0, Category::Other, (10, 20), (30, 40));
    let decoded = Decoder::default().decode(tail).map(|d| d.record);
    assert_eq!(
        decoded,
        Some(Record::Realloc {
            released: 0,
            old_addr: 0,
            old_size: 0,
            new_addr: 30,
            new_size: 40,
            category: Category::Other
        })
    );
}
