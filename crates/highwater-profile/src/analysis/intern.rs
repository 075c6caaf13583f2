//! String and shape tables: events carry small ids, the profile shows names.
//!
//! Interning happens off the hot path (when the collector first meets a name); `apply` only
//! copies ids. Ids that were never handed out (garbage events) resolve to a visible placeholder
//! instead of panicking.

use rustc_hash::FxHashMap;

use super::event::{DeviceId, NameId, ShapeId};

/// The name of the host heap device, always [`DeviceId::CPU`].
pub(crate) const CPU_NAME: &str = "cpu";

/// Interned names, device names and shapes of one [`Timeline`](super::Timeline).
#[derive(Debug)]
pub(crate) struct Interner {
    names: Vec<String>,
    name_ids: FxHashMap<String, NameId>,
    devices: Vec<String>,
    device_ids: FxHashMap<String, DeviceId>,
    shapes: Vec<Vec<u64>>,
    shape_ids: FxHashMap<Vec<u64>, ShapeId>,
}

impl Interner {
    /// A table that already knows `cpu` as device 0.
    pub(crate) fn new() -> Interner {
        let mut interner = Interner {
            names: Vec::new(),
            name_ids: FxHashMap::default(),
            devices: Vec::new(),
            device_ids: FxHashMap::default(),
            shapes: Vec::new(),
            shape_ids: FxHashMap::default(),
        };
        let cpu = interner.device(CPU_NAME);
        debug_assert_eq!(cpu, DeviceId::CPU);
        interner
    }

    pub(crate) fn name(&mut self, name: &str) -> NameId {
        if let Some(&id) = self.name_ids.get(name) {
            return id;
        }
        // More than u32::MAX distinct names cannot happen in practice; saturate rather than wrap.
        let id = NameId(u32::try_from(self.names.len()).unwrap_or(u32::MAX));
        self.names.push(name.to_owned());
        self.name_ids.insert(name.to_owned(), id);
        id
    }

    pub(crate) fn device(&mut self, name: &str) -> DeviceId {
        if let Some(&id) = self.device_ids.get(name) {
            return id;
        }
        let id = DeviceId(u16::try_from(self.devices.len()).unwrap_or(u16::MAX));
        self.devices.push(name.to_owned());
        self.device_ids.insert(name.to_owned(), id);
        id
    }

    pub(crate) fn shape(&mut self, dims: &[u64]) -> ShapeId {
        if let Some(&id) = self.shape_ids.get(dims) {
            return id;
        }
        let id = ShapeId(u32::try_from(self.shapes.len()).unwrap_or(u32::MAX));
        self.shapes.push(dims.to_vec());
        self.shape_ids.insert(dims.to_vec(), id);
        id
    }

    /// The string behind `id`, or `name#N` for an id this table never handed out.
    pub(crate) fn name_str(&self, id: NameId) -> String {
        match self.names.get(id.0 as usize) {
            Some(name) => name.clone(),
            None => format!("name#{}", id.0),
        }
    }

    /// The device name behind `id`, or `device#N` for an id this table never handed out.
    pub(crate) fn device_str(&self, id: DeviceId) -> String {
        match self.devices.get(usize::from(id.0)) {
            Some(name) => name.clone(),
            None => format!("device#{}", id.0),
        }
    }

    /// The dims behind `id`; `None` for an id this table never handed out.
    pub(crate) fn shape_dims(&self, id: ShapeId) -> Option<Vec<u64>> {
        self.shapes.get(id.0 as usize).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_input_gives_same_id_and_cpu_is_device_zero() {
        let mut table = Interner::new();
        assert_eq!(table.device("cpu"), DeviceId::CPU);
        let cuda = table.device("cuda:0");
        assert_ne!(cuda, DeviceId::CPU);
        assert_eq!(table.device("cuda:0"), cuda);
        let a = table.name("forward");
        assert_eq!(table.name("forward"), a);
        assert_ne!(table.name("backward"), a);
        let s = table.shape(&[2, 3]);
        assert_eq!(table.shape(&[2, 3]), s);
        assert_ne!(table.shape(&[3, 2]), s);
        assert_eq!(table.shape_dims(s), Some(vec![2, 3]));
    }

    #[test]
    fn unknown_ids_resolve_to_placeholders() {
        let table = Interner::new();
        assert_eq!(table.name_str(NameId(7)), "name#7");
        assert_eq!(table.device_str(DeviceId(9)), "device#9");
        assert_eq!(table.shape_dims(ShapeId(1)), None);
    }
}
