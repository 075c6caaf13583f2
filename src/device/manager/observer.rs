//! Who hears about pool changes: the user's observer, and the sink a recording session
//! installs so the pools' states reach its profile.
//!
//! The manager does not know about sessions: a session that records installs a sink
//! ([`set_pool_sink`]) and removes it when it ends; the manager reports every snapshot to
//! whatever sink is installed.

use std::sync::Arc;

use parking_lot::RwLock;

use super::Device;
use super::{PoolManager, PoolSnapshot};
use crate::device::DeviceIndex;
use crate::device::Shortfall;

/// A callback told about every touched device after each successful reserve or release.
pub type PoolObserver = dyn Fn(&PoolSnapshot) + Send + Sync;

/// Where snapshots go besides the observer: a function the recording session installs.
pub(crate) type PoolSink = fn(&PoolSnapshot);

static SINK: RwLock<Option<PoolSink>> = RwLock::new(None);

/// Where refused admissions go: a function the recording session installs. It is told each
/// refusal's shortfalls after the pools are unlocked, and may wait (boundedly) for a checkpoint.
pub(crate) type RefusalSink = fn(&[Shortfall]);

static REFUSAL_SINK: RwLock<Option<RefusalSink>> = RwLock::new(None);

/// Installs `sink` to hear of every refused admission of every manager, replacing any other.
pub(crate) fn set_refusal_sink(sink: RefusalSink) {
    *REFUSAL_SINK.write() = Some(sink);
}

/// Tells the refusal sink, if one is installed, that an admission failed with `shortfalls`.
/// Call it with the pools unlocked.
pub(super) fn report_refusal(shortfalls: &[Shortfall]) {
    let sink = *REFUSAL_SINK.read();
    if let Some(sink) = sink {
        sink(shortfalls);
    }
}

/// Installs `sink` to receive every pool snapshot of every manager, replacing any other.
pub(crate) fn set_pool_sink(sink: PoolSink) {
    *SINK.write() = Some(sink);
}

/// Removes the sink and the refusal sink (the session stopped recording).
pub(crate) fn clear_pool_sink() {
    *SINK.write() = None;
    *REFUSAL_SINK.write() = None;
}

impl PoolManager {
    /// Calls `observer` after every successful reserve or release, once per touched device,
    /// with its snapshot taken inside the call. Replaces any previous observer.
    ///
    /// The observer runs after the pools are unlocked, on the calling thread; it may call back
    /// into the manager. Concurrent calls may report in a different order than they happened.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use highwater::device::{DeviceIndex, DeviceKind, PoolManager, Strategy};
    /// let pools = PoolManager::builder().kind(DeviceKind::TpuV3).devices(1).strategy(Strategy::BestFit).build();
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let sink = Arc::clone(&seen);
    /// pools.set_observer(Box::new(move |s| sink.lock().unwrap().push((s.name.clone(), s.reserved_bytes))));
    /// let r = pools.reserve(&[(DeviceIndex(0), 1 << 20)])?;
    /// pools.release(r)?;
    /// assert_eq!(*seen.lock().unwrap(), [("tpu:0".to_string(), 1 << 20), ("tpu:0".to_string(), 0)]);
    /// # Ok::<(), highwater::device::PoolError>(())
    /// ```
    pub fn set_observer(&self, observer: Box<PoolObserver>) {
        *self.observer.write() = Some(Arc::from(observer));
    }

    /// Removes the observer.
    pub fn clear_observer(&self) {
        *self.observer.write() = None;
    }

    /// Snapshots of the touched pools, taken under their locks, if an observer or a sink is
    /// set.
    pub(super) fn observe<'a>(
        &self,
        touched: impl Iterator<Item = (DeviceIndex, &'a Device)>,
    ) -> Option<(Option<Arc<PoolObserver>>, Vec<PoolSnapshot>)> {
        let observer = self.observer.read().clone();
        if observer.is_none() && SINK.read().is_none() {
            return None;
        }
        Some((
            observer,
            touched.map(|(d, pool)| self.snapshot_of(d, pool)).collect(),
        ))
    }
}

/// Hands each snapshot to the sink, if one is installed, and to the observer; the pools are
/// unlocked by now.
pub(super) fn report(observed: Option<(Option<Arc<PoolObserver>>, Vec<PoolSnapshot>)>) {
    let Some((observer, snapshots)) = observed else {
        return;
    };
    let sink = *SINK.read();
    for s in &snapshots {
        if let Some(sink) = sink {
            sink(s);
        }
        if let Some(observer) = &observer {
            observer(s);
        }
    }
}
