//! Applying merged events: each raw record decoded into the [`Timeline`]'s events (plain heap
//! events straight to its fast paths), the allocation log and the call-site samples.

use super::merger::{stats_of, Merger};
use crate::alloc_log::AllocLogWriter;
use crate::analysis::{At, DeviceId, Event, EventKind, NameId, Realloc, ShapeId};
use crate::capture::clock::Calibration;
use crate::capture::names;
use crate::capture::raw::{
    Decoded, DeviceMemoryKind, Plain, RawEvent, RawKind, ReallocRelease, Record, PHYSICAL_KEY,
};

impl Merger {
    /// The timeline's id for the interner's name `id`.
    pub(super) fn name(&mut self, id: u32) -> NameId {
        if let Some(name) = self.interned_names.get(&id) {
            return *name;
        }
        let text = names::name_of(id).unwrap_or_else(|| format!("(name {id})"));
        let name = self.timeline.intern_name(&text);
        self.interned_names.insert(id, name);
        name
    }

    /// The timeline's id for the interner's shape `id`.
    pub(super) fn shape(&mut self, id: u32) -> ShapeId {
        if let Some(shape) = self.interned_shapes.get(&id) {
            return *shape;
        }
        let dims = names::shape_of(id).unwrap_or_default();
        let shape = self.timeline.intern_shape(&dims);
        self.interned_shapes.insert(id, shape);
        shape
    }

    /// The timeline's id for the interner's device `id`.
    pub(super) fn device(&mut self, id: u16) -> DeviceId {
        if id == names::CPU {
            return DeviceId::CPU;
        }
        if let Some(device) = self.interned_devices.get(&id) {
            return *device;
        }
        let text = names::device_of(id).unwrap_or_else(|| format!("device:{id}"));
        let device = self.timeline.intern_device(&text);
        self.interned_devices.insert(id, device);
        let slot = usize::from(device.0);
        if self.device_names.len() <= slot {
            self.device_names.resize(slot + 1, String::new());
        }
        self.device_names[slot] = text;
        device
    }

    /// Interns a span name; names are looked up by the `&'static str`'s address and length,
    /// so each distinct name is hashed as text once.
    pub(super) fn intern_static_name(&mut self, name: &'static str) -> NameId {
        let key = (name.as_ptr() as usize, name.len());
        if let Some(id) = self.names.get(&key) {
            return *id;
        }
        let id = self.timeline.intern_name(name);
        self.names.insert(key, id);
        id
    }

    /// Applies one raw event of ring `index`: a realloc's first half gives its old address up
    /// at once, and the record the event completes, if any, is applied.
    pub(super) fn apply(&mut self, index: usize, raw: RawEvent) {
        if let Some(release) = raw.realloc_release() {
            self.release(index, release);
        }
        self.apply_record(index, raw);
    }

    /// Decodes one raw event of ring `index` and applies the record it completes.
    pub(super) fn apply_record(&mut self, index: usize, raw: RawEvent) {
        let cursor = &mut self.cursors[index];
        // Plain heap events, most of any stream, go straight to the timeline: no record or
        // `Event` is built unless a log or a sample needs one.
        if self.log.is_none() {
            if let Some(plain) = cursor.decoder.decode_plain(&raw) {
                let Some(thread) = cursor.thread else {
                    return;
                };
                let ts = self.calibration.to_ns(raw.ticks()).unwrap_or(0);
                self.newest_ns = self.newest_ns.max(ts);
                let stats = stats_of(&mut self.threads, thread);
                let at = At {
                    ts,
                    thread,
                    span: raw.span(),
                };
                return match plain {
                    Plain::Alloc {
                        addr,
                        size,
                        category,
                    } => {
                        stats.allocs += 1;
                        self.timeline
                            .apply_alloc(at, DeviceId::CPU, addr, size, category)
                    }
                    Plain::Free { addr } => {
                        stats.frees += 1;
                        self.timeline.apply_free(at, DeviceId::CPU, addr)
                    }
                    Plain::Realloc {
                        released,
                        old_addr,
                        new_addr,
                        new_size,
                        category,
                    } => {
                        stats.reallocs += 1;
                        // As for the event: a first half from before the session counts as
                        // its start, and it is never later than the second.
                        let released = self.calibration.to_ns(released).unwrap_or(0).min(ts);
                        let realloc = Realloc {
                            old_addr,
                            new_addr,
                            new_size,
                            category,
                            released,
                        };
                        self.timeline.apply_realloc(at, realloc)
                    }
                };
            }
        }
        let Some(Decoded {
            sampled,
            ticks,
            span,
            record,
        }) = cursor.decoder.decode(raw)
        else {
            return;
        };
        let Some(thread) = cursor.thread else {
            return;
        };
        let ts_ns = self.calibration.to_ns(ticks).unwrap_or(0);
        let stats = stats_of(&mut self.threads, thread);
        match record.kind() {
            RawKind::Alloc => stats.allocs += 1,
            RawKind::Free => stats.frees += 1,
            RawKind::ReallocTo => stats.reallocs += 1,
            RawKind::SpanEnter | RawKind::SpanExit => stats.span_events += 1,
            _ => stats.other_events += 1,
        }
        self.newest_ns = self.newest_ns.max(ts_ns);
        let kind = match record {
            Record::Alloc {
                addr,
                size,
                category,
            } => EventKind::Alloc {
                device: DeviceId::CPU,
                addr,
                size,
                category,
            },
            Record::Free { addr, size } => EventKind::Free {
                device: DeviceId::CPU,
                addr,
                size,
            },
            Record::Realloc {
                released,
                old_addr,
                old_size,
                new_addr,
                new_size,
                category,
            } => EventKind::Realloc {
                old_addr,
                old_size,
                new_addr,
                new_size,
                category,
                // A reading of the old half from before the clock's origin counts as the
                // session's start.
                released_ns: Some(self.calibration.to_ns(released).unwrap_or(0)),
            },
            Record::SpanEnter { name, id, label } => EventKind::SpanEnter {
                id,
                name: self.intern_static_name(name),
                label,
            },
            Record::SpanExit => EventKind::SpanExit { id: span },
            Record::OpBegin { name } => EventKind::OpBegin {
                name: self.name(name),
                output: 0,
                shape: None,
                dtype: None,
            },
            Record::OpEnd => EventKind::OpEnd,
            Record::DeviceAlloc {
                device,
                tensor,
                bytes,
                category,
            } => EventKind::Alloc {
                device: self.device(device),
                addr: tensor,
                size: bytes,
                category,
            },
            Record::DeviceFree {
                device,
                tensor,
                bytes,
            } => EventKind::Free {
                device: self.device(device),
                addr: tensor,
                size: bytes,
            },
            Record::SetCategory {
                device,
                key,
                category,
            } => EventKind::SetCategory {
                device: self.device(device),
                addr: key,
                category,
            },
            Record::Annotate {
                device,
                key,
                op,
                shape,
                dtype,
            } => EventKind::Annotate {
                device: self.device(device),
                addr: key,
                op: self.name(op),
                shape: shape.map(|id| self.shape(id)),
                dtype: dtype.map(|id| self.name(id)),
            },
            Record::PoolState { device, pool } => EventKind::PoolState {
                device: self.device(device),
                capacity: pool.capacity,
                reserved: pool.reserved,
                largest_free: pool.largest_free,
                fragmentation: pool.fragmentation,
            },
            Record::Oom {
                device,
                source,
                requested,
                largest_free,
            } => EventKind::Oom {
                device: self.device(device),
                source,
                requested,
                largest_free,
            },
            Record::DeviceMemory { kind, device, a, b } => {
                let device = self.device(device);
                return self.apply_device_memory(ts_ns, thread, span, kind, device, (a, b));
            }
        };
        let event = Event {
            ts_ns,
            thread,
            span,
            kind,
        };
        self.apply_event(&event);
        if sampled {
            self.apply_sample(index, &event);
        }
    }

    /// Applies `event` to the timeline and the allocation log.
    pub(super) fn apply_event(&mut self, event: &Event) {
        self.timeline.apply(event);
        if let Some(log) = self.log.as_mut() {
            log_event(log, &self.device_names, event);
        }
    }

    /// Applies a device event with two plain words: a driver's pool figure, the device's
    /// memory before recording, or a step of a virtual-memory mapping, whose ledger says
    /// which physical allocations (keyed by handle, see [`PHYSICAL_KEY`]) it frees.
    pub(super) fn apply_device_memory(
        &mut self,
        ts_ns: u64,
        thread: u32,
        span: u32,
        kind: DeviceMemoryKind,
        device: DeviceId,
        (a, b): (u64, u64),
    ) {
        let event = |kind| Event {
            ts_ns,
            thread,
            span,
            kind,
        };
        let freed = |handle: u64| {
            event(EventKind::Free {
                device,
                addr: handle | PHYSICAL_KEY,
                size: 0,
            })
        };
        let ledger = self.vmm.entry(device).or_default();
        let events = match kind {
            DeviceMemoryKind::Reserved => vec![event(EventKind::Reserved { device, bytes: a })],
            DeviceMemoryKind::Memory => vec![event(EventKind::DeviceMemory {
                device,
                in_use: a,
                total: b,
            })],
            DeviceMemoryKind::Map => {
                ledger.map(a, b);
                Vec::new()
            }
            DeviceMemoryKind::Unmap => {
                let mut ended = Vec::new();
                ledger.unmap(a, b, |handle| ended.push(freed(handle)));
                ended
            }
            DeviceMemoryKind::Release => {
                if ledger.release(a) {
                    vec![freed(a)]
                } else {
                    Vec::new()
                }
            }
        };
        for event in &events {
            self.apply_event(event);
        }
    }

    /// Applies a plain alloc of ring `index` and the free of the same block that follows it in
    /// the merged order ([`RawEvent::is_freed_by`]) with one call into the timeline.
    pub(super) fn apply_pair(&mut self, index: usize, alloc: RawEvent, free: RawEvent) {
        let cursor = &mut self.cursors[index];
        let block = cursor.decoder.decode_short_lived(&alloc, &free);
        let Some(thread) = cursor.thread else {
            return;
        };
        let stats = stats_of(&mut self.threads, thread);
        stats.allocs += 1;
        stats.frees += 1;
        let at = |(ticks, span), calibration: &Calibration| At {
            ts: calibration.to_ns(ticks).unwrap_or(0),
            thread,
            span,
        };
        let (made, ended) = (
            at(block.made, &self.calibration),
            at(block.ended, &self.calibration),
        );
        self.newest_ns = self.newest_ns.max(made.ts).max(ended.ts);
        self.timeline
            .apply_alloc_then_free(made, ended, block.addr, block.size, block.category);
    }

    /// The first half `first` of a realloc of ring `index` whose second half is applied
    /// right after it: no release of its own, only what a lost realloc left pending ends.
    #[inline]
    pub(super) fn release_adjacent(&mut self, index: usize, first: &RawEvent) {
        // Nearly always nothing is pending: then the stamp is not even converted.
        if !self.timeline.has_pending_reallocs() {
            return;
        }
        let (Some(thread), Some(release)) = (self.cursors[index].thread, first.realloc_release())
        else {
            return;
        };
        let ts = self.calibration.to_ns(release.ticks).unwrap_or(0);
        self.timeline.release_adjacent(thread, ts);
    }

    /// Applies the first half of a realloc of ring `index` as it is merged: the old address
    /// is given up now, though the realloc completes only with its second half.
    pub(super) fn release(&mut self, index: usize, release: ReallocRelease) {
        let Some(thread) = self.cursors[index].thread else {
            return;
        };
        let event = Event {
            ts_ns: self.calibration.to_ns(release.ticks).unwrap_or(0),
            thread,
            span: release.span,
            kind: EventKind::ReallocRelease {
                old_addr: release.old_addr,
                old_size: release.old_size,
            },
        };
        self.timeline.apply(&event);
        if let Some(log) = self.log.as_mut() {
            log_event(log, &self.device_names, &event);
        }
    }

    /// Applies the call-site sample of the allocation `event` just applied: its stack is in
    /// ring `index`'s decoder.
    pub(super) fn apply_sample(&mut self, index: usize, event: &Event) {
        let (addr, size, category) = match event.kind {
            EventKind::Alloc {
                addr,
                size,
                category,
                ..
            } => (addr, size, category),
            EventKind::Realloc {
                new_addr,
                new_size,
                category,
                ..
            } => (new_addr, new_size, category),
            _ => return,
        };
        let (pcs, walk) = self.cursors[index].decoder.stack();
        let stack = self.timeline.intern_stack(pcs, walk);
        self.timeline.apply(&Event {
            kind: EventKind::Sampled {
                addr,
                size,
                category,
                stack,
            },
            ..*event
        });
    }
}

/// Appends an applied event's allocation, free or change of category to the allocation log.
fn log_event(log: &mut AllocLogWriter, device_names: &[String], event: &Event) {
    let name = |device: DeviceId| {
        move || {
            device_names
                .get(usize::from(device.0))
                .cloned()
                .unwrap_or_else(|| format!("device:{}", device.0))
        }
    };
    let ts = event.ts_ns;
    match event.kind {
        EventKind::Alloc {
            device,
            addr,
            size,
            category,
        } => log.record(device.0, name(device), true, Some(category), ts, addr, size),
        EventKind::Free { device, addr, size } => {
            log.record(device.0, name(device), false, None, ts, addr, size)
        }
        EventKind::SetCategory {
            device,
            addr,
            category,
        } => log.set_category(device.0, name(device), category, ts, addr),
        // A realloc's old block is logged freed at its release, where the analysis gave its
        // address up; the realloc itself adds the new block.
        EventKind::ReallocRelease { old_addr, old_size } => {
            let cpu = DeviceId::CPU;
            log.record(cpu.0, name(cpu), false, None, ts, old_addr, old_size);
        }
        EventKind::Realloc {
            new_addr,
            new_size,
            category,
            ..
        } => {
            let cpu = DeviceId::CPU;
            log.record(
                cpu.0,
                name(cpu),
                true,
                Some(category),
                ts,
                new_addr,
                new_size,
            );
        }
        _ => {}
    }
}
