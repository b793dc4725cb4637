//! Each simulated node's disk: `kraft::storage::MemoryStore`, whose
//! `crash()` loses every write not yet flushed.

use kraft::messages::Batch;

pub type Store = kraft::storage::MemoryStore;

/// The batches that survive a crash, in order (borrowed, not cloned).
pub fn durable_batches(store: &Store) -> impl Iterator<Item = &Batch> + '_ {
    store.durable_iter()
}
