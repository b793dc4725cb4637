//! sled backend (docs/ARCHITECTURE.md, "Formats on disk"): one sled database per node, in the `sled`
//! directory under the node's data dir, with three trees:
//!
//! - `meta`: the [`Identity`] (cluster id, node id, format version), written
//!   on first open and checked on every open, the high watermark hint, and
//!   the log start with its epoch (`log_start`, absent until compaction or a
//!   snapshot install first moves it: absent means offset 0, epoch 0);
//! - `election`: one key, the bincode [`ElectionState`];
//! - `log`: the batches, in offset order (one sled write per batch, never
//!   per record). A batch whose encoding fits in [`MAX_LOG_VALUE_BYTES`] is
//!   one value: key = big-endian base offset, value = the encoded [`Batch`].
//!   A larger one is cut into chunks (see `chunked_batch`): under its base
//!   offset a head value, which says how many chunks follow and the length
//!   of the whole encoding and holds its first bytes, then the rest under
//!   keys of the base offset followed by the chunk index (1, 2, …, 4 bytes
//!   big-endian), which sort right after the head and before the next batch.
//!   A head starts with `CHUNKED_HEAD_MAGIC`, whose first byte is 0xff; a
//!   whole batch starts with its base offset, never negative, so with a byte
//!   below 0x80: that is how a reader tells them apart, and why data dirs
//!   written before chunking (every batch one value, however large) read as
//!   they always did.
//!
//! # Memory
//!
//! sled keeps in memory every page its cache has not evicted, and its cache
//! evicts less than its capacity says. It is an LRU split 256 ways, each
//! shard keeping at least its last page, so a page much larger than
//! `cache_capacity / 256` is in practice never evicted: with a 16 MiB cache,
//! 120 MiB written as values of 6,000 bytes left 49 MiB resident, of 32,000
//! bytes 130 MiB, of 100,000 bytes (a batch of 1,000 records of 100 B) 137
//! MiB, and sled's default 1 GiB cache keeps everything (135 MiB for any
//! value size). Hence the 16 MiB cache (`SLED_CACHE_BYTES`) and values of
//! at most [`MAX_LOG_VALUE_BYTES`].
//!
//! And a shard queues the accesses to its pages and looks for pages to
//! evict only once a block of them is queued (64 in sled 0.34.7), so a scan,
//! which accesses each page once, evicts nothing: a scan of a log of 1M
//! records of 100 B left all of it resident (113 MiB), in chunks or not.
//! Reads therefore find batches by point lookups (one access per value), and
//! every scan (the one at open, those of what a truncation, compaction or
//! reset removes) looks each value up again by its key: 56 MiB after the
//! open and a full read. With blocks of 8 (vendor/sled change 6, see
//! vendor/sled/KRAFT.md), fewer pages wait unaccounted in the queues: 20
//! MiB after the same open and read. Large removals go in steps (see
//! `remove_in_steps`) and collect sled's garbage after each (see
//! `collect_garbage`) for a like reason.
//!
//! # Durability
//!
//! sled 0.34.7's `Db::flush` ends in `sync_file_range`, which pushes pages to
//! the device but does not flush the device cache nor the file's metadata:
//! it is not a durability point. Every durability point here is therefore
//! `Db::flush` followed by `fdatasync` of sled's data file (`<sled dir>/db`,
//! the one file sled 0.34 writes its log-structured store into), through a
//! `File` this store keeps open on it.
//!
//! sled also writes any value or B-tree page larger than a quarter of its
//! 512 KiB segment to a file of its own under `blobs/`, with a plain `write`
//! and no sync; the data file then only holds a pointer to it. That happened
//! to a batch above ~128 KiB, and to a leaf page holding a few batches of
//! tens of KiB (measured: 60 KB batches produce a blob every other flush),
//! before batches were chunked; data dirs of that time still hold blobs.
//! So a durability point also syncs every blob file it has not synced yet,
//! and the `blobs` directory when one was created. See `BlobSyncs`: it lists
//! the directory only when sled wrote a blob since its last listing.
//!
//! # Recovery
//!
//! At open the whole log is scanned: each batch must be complete (a chunked
//! one has exactly the chunks its head announces, of the announced total
//! length), decode, pass its CRC ([`Batch::verify`], over the reassembled
//! bytes) and sit under its own base offset, and the batches must be
//! contiguous with epochs that never go back. The epoch cache and the end
//! offset are rebuilt from the scan. Damaged values at the very end (a torn
//! tail: nothing valid after them, such as a chunked batch only some of
//! whose chunks reached the disk) are deleted and logged; anything else is
//! a hard [`StorageError::Corrupt`], as is a tail truncation that would cut
//! below the high watermark hint, or a log that ends below it.
//!
//! The log starts at the persisted log start. `delete_before` writes the
//! new start before it removes the batches below it, so a crash in between
//! leaves batches wholly below the start: they are removed (and logged) at
//! open. A log whose first batch starts above the persisted start has lost
//! batches, and one whose first batch straddles it was never written by this
//! store: both are a hard [`StorageError::Corrupt`], and the open removes
//! nothing. An empty log starts at the persisted start. `reset` marks the
//! start it writes as pending until every old batch is gone, and an open that
//! finds the mark removes every batch: old batches at or above the new start
//! would otherwise pass for a log.
//!
//! A compaction or a reset that fails part way (an error, not a crash)
//! leaves sled holding part of the change and the store's view of the log
//! none of it, so it *poisons* the store: every later call, its readers'
//! too, fails with [`StorageError::Poisoned`], and the next open recovers as
//! from a crash at that point.
//!
//! That covers damage to our values. Damage inside sled's own data file is
//! different: sled's recovery silently keeps only what precedes the first
//! damaged record of its log (measured: random byte flips bring back a
//! shorter log, sometimes an empty one): the log, the hint and the election
//! state all go back together, to a state that is consistent and old. Two
//! files outside sled catch that. The identity file ([`IDENTITY_FILE`])
//! catches the empty case. The checkpoint file ([`CHECKPOINT_FILE`], like
//! Kafka's `replication-offset-checkpoint`) holds the newest epoch and
//! high watermark hint this store made durable in sled, written after them
//! (at every election state, and at a flush that carries a new hint: at
//! most about once a second). An open whose sled state is behind it refuses
//! to start, since the node would otherwise serve a log without records it
//! had committed, or vote a second time in an epoch.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use super::memory::{below_start_epoch, check_reset};
use super::{
    check_append, check_election_transition, EpochCache, Identity, LogStore, ReadBudget, Result, StorageError,
    CHECKPOINT_FORMAT_VERSION, FORMAT_VERSION, MAX_STORED_BATCH_BYTES, OLDEST_FORMAT_VERSION,
};
use crate::messages::codec::{decode_bounded, encode};
use crate::messages::Batch;
use crate::raft::{ElectionState, Epoch, NodeId, Offset};

/// Directory under the node's data dir that holds the sled database, so that
/// sled's own files (`conf`, `db`, `blobs/`, `snap.*`) never mix with the
/// snapshot files that live in the data dir.
pub const SLED_SUBDIR: &str = "sled";
/// The file sled 0.34 writes its whole log-structured store into.
const DATA_FILE: &str = "db";
/// The identity file in the data dir, outside sled (like Kafka's
/// `meta.properties`). Written once, after sled's own identity record is
/// durable; its only job is to notice a sled database that lost its
/// contents (see [`SledStore::open`]).
pub const IDENTITY_FILE: &str = "meta.properties";
/// The checkpoint file in the data dir, outside sled: see the module docs.
pub const CHECKPOINT_FILE: &str = "quorum.checkpoint";
/// Where sled 0.34 puts values and pages too large for a segment.
const BLOB_DIR: &str = "blobs";
/// sled's own configuration file, written once when the database is created.
const CONF_FILE: &str = "conf";

const META_TREE: &str = "meta";
const ELECTION_TREE: &str = "election";
const LOG_TREE: &str = "log";
const IDENTITY_KEY: &[u8] = b"identity";
const HW_HINT_KEY: &[u8] = b"high_watermark_hint";
const LOG_START_KEY: &[u8] = b"log_start";
const ELECTION_KEY: &[u8] = b"state";
/// Decode limit for the small values of the meta and election trees.
const SMALL_VALUE_LIMIT: u64 = 64 * 1024;

/// sled's page cache. sled 0.34.7 splits its LRU 256 ways (64 KiB a shard
/// here), and a shard always keeps its last page, so values must stay small
/// for the cache to bound anything (see [`MAX_LOG_VALUE_BYTES`]). Measured,
/// 120 MiB inserted as sled values: with this cache, values of 6,000 bytes
/// left 49 MiB resident, 16,000 bytes 79 MiB, 32,000 bytes 130 MiB, 100,000
/// bytes 137 MiB; with sled's default cache of 1 GiB, 135 MiB for any size.
const SLED_CACHE_BYTES: u64 = 16 << 20;

/// Largest value this store writes to the `log` tree. A batch whose encoding
/// is larger is stored in chunks (see `chunked_batch`), because sled keeps
/// pages of large values in memory for good (see the module docs).
///
/// Measured (`sled_memory_of_one_million_100_byte_records` in the storage
/// suite): RSS of 1M records of 100 B appended in batches of 1,000 (~112 KB
/// encoded), each flushed, and of another process that opens that log and
/// reads all of it:
///
/// | values of at most  | after the appends | after open and read |
/// |--------------------|-------------------|---------------------|
/// | any size (whole)   | 131 MiB           | 113 MiB             |
/// | 8 KiB              | 60 MiB            | 108 MiB             |
/// | 4 KiB              | 30 MiB            | 56 MiB              |
/// | 2 KiB              | 24 MiB            | 40 MiB              |
///
/// The 1,000 appends themselves took 0.3 s whole, 0.6–1 s at 4 KiB and 1.5
/// s at 2 KiB, next to 1–4 s of flushes: 4 KiB is well under the 100 MiB a
/// node may use, for a small cost.
pub const MAX_LOG_VALUE_BYTES: usize = 4096;

/// First bytes of the head value of a chunked batch (see the module docs):
/// the 0xff that no whole batch starts with, then "kc1".
const CHUNKED_HEAD_MAGIC: [u8; 4] = [0xff, b'k', b'c', b'1'];
/// Length of a chunked batch's head before its first bytes of the batch:
/// the magic, the number of chunks that follow (u32) and the length of the
/// whole encoded batch (u64), both big-endian.
const CHUNKED_HEAD_BYTES: usize = 16;
/// Most chunks a batch can need after its head; a head announcing more is
/// damaged, and a scan never gathers more under one base offset.
const MAX_CHUNKS_PER_BATCH: usize = MAX_STORED_BATCH_BYTES / MAX_LOG_VALUE_BYTES + 1;

/// The value under [`LOG_START_KEY`]: where the log starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct LogStart {
    /// First offset of the log.
    offset: Offset,
    /// Epoch of the record just below `offset`.
    epoch: Epoch,
    /// Set while `reset` removes the old log: every batch an open finds
    /// under this mark is left over from before the reset.
    reset_pending: bool,
}

/// The production [`LogStore`].
///
/// Writes go through `&mut self` on one thread (the log appender's storage
/// thread); other threads read through a [`SledReader`].
pub struct SledStore {
    /// The data dir given to `open`, for error messages.
    dir: PathBuf,
    /// `<dir>/sled`, the directory sled opened.
    sled_dir: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    election_tree: sled::Tree,
    log: sled::Tree,
    /// Read-only handle on `<sled_dir>/db`, kept open for `fdatasync`.
    /// Invariant: the same inode sled writes its store into.
    data_file: File,
    blobs: BlobSyncs,
    /// Cache of the durable election state (loaded at open, replaced only
    /// after a write of it became durable).
    election: ElectionState,
    /// First offset of the log, as persisted under [`LOG_START_KEY`].
    /// Invariant: `start_offset <= end_offset`; the same value as
    /// `reader_start`.
    start_offset: Offset,
    /// Epoch of the record just below the log start, as persisted.
    /// Invariant: no batch of the log has a lower epoch.
    start_epoch: Epoch,
    /// `start_offset`, shared with every [`SledReader`]; changed only under
    /// `truncation_lock`.
    reader_start: Arc<AtomicI64>,
    /// Offset after the last batch. Invariant: the `log` tree holds exactly
    /// the contiguous batches covering `[start_offset, end_offset)`.
    end_offset: Offset,
    epochs: EpochCache,
    /// Largest high watermark reported with [`SledStore::set_high_watermark_hint`].
    /// Invariant: `high_watermark_hint <= end_offset`, never decreases.
    high_watermark_hint: Offset,
    /// The hint as last written to `meta`, to skip rewriting an unchanged one.
    persisted_hw_hint: Offset,
    /// What [`CHECKPOINT_FILE`] holds now (as this store last wrote or read it).
    checkpoint: Option<Checkpoint>,
    /// Number of `fdatasync`s of `data_file`: one per durability point.
    fsync_count: u64,
    /// Held for writing while a truncation, a compaction or a reset removes
    /// batches, and for reading by every [`SledReader`] read (see there).
    truncation_lock: Arc<RwLock<()>>,
    /// Why this store is unusable, once a compaction or a reset failed part
    /// way (see [`SledStore::poison`]); shared with every [`SledReader`].
    /// Never cleared: a reopen makes a new store.
    poisoned: Arc<OnceLock<String>>,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("dir", &self.dir)
            .field("start_offset", &self.start_offset)
            .field("start_epoch", &self.start_epoch)
            .field("end_offset", &self.end_offset)
            .field("epochs", &self.epochs)
            .field("high_watermark_hint", &self.high_watermark_hint)
            .field("fsync_count", &self.fsync_count)
            .field("poisoned", &self.poisoned.get())
            .finish_non_exhaustive()
    }
}

impl SledStore {
    /// Opens (creating on first use) the store of node `node_id` of cluster
    /// `cluster_id` under the data dir `dir`.
    ///
    /// Refuses, with [`StorageError::IdentityMismatch`], a directory written
    /// by another cluster or node or by another format version; recovers the
    /// log as described in the module docs.
    ///
    /// sled's own recovery keeps only the part of its log before the first
    /// damaged record it finds, so a damaged data file can come back as an
    /// empty database. Starting such a node empty would let it vote twice in
    /// an epoch and forget committed records; the identity file outside sled
    /// turns that case into a hard [`StorageError::Corrupt`] error.
    pub fn open(dir: &Path, cluster_id: &str, node_id: NodeId) -> Result<SledStore> {
        if cluster_id.trim() != cluster_id || cluster_id.chars().any(char::is_control) {
            return Err(StorageError::Invalid(format!(
                "cluster id {cluster_id:?} has surrounding spaces or control characters"
            )));
        }
        let sled_dir = dir.join(SLED_SUBDIR);
        let db = open_sled(&sled_dir)?;
        let meta = open_tree(&db, META_TREE)?;
        let election_tree = open_tree(&db, ELECTION_TREE)?;
        let log = open_tree(&db, LOG_TREE)?;
        let data_file = File::open(sled_dir.join(DATA_FILE))?;
        sync_created_files(&sled_dir)?;

        let expected = Identity {
            cluster_id: cluster_id.to_string(),
            node_id,
            format_version: FORMAT_VERSION,
        };
        let identity_file = read_identity_file(dir)?;
        if let Some(found) = &identity_file {
            if !readable_as(found, &expected) {
                return Err(identity_mismatch(dir, found, &expected));
            }
        }
        let (fresh, meta_upgrade) = check_identity(dir, &meta, &election_tree, &log, &expected)?;
        if fresh && identity_file.is_some() {
            return Err(StorageError::Damaged(format!(
                "the sled database in {} is empty, but {} says this data dir was in use: \
                 sled lost its contents (damaged or deleted files?). Refusing to start as an \
                 empty node; delete {IDENTITY_FILE} only to reformat this node on purpose",
                dir.join(SLED_SUBDIR).display(),
                dir.join(IDENTITY_FILE).display()
            )));
        }
        let election = load_election_state(dir, &election_tree)?;
        let sled_hw_hint = load_hw_hint(dir, &meta)?;
        let log_start = load_log_start(dir, &meta)?;
        let recovered = recover_log(&log, &log_start, sled_hw_hint)?;
        // A new data dir, or one reformatted on purpose (its identity file
        // deleted), starts a new history: an old checkpoint there is void.
        let checkpoint = if fresh && identity_file.is_none() {
            None
        } else {
            read_checkpoint_file(dir)?
        };
        let checkpoint_written = identity_file
            .as_ref()
            .is_some_and(|found| found.format_version >= CHECKPOINT_FORMAT_VERSION);
        if checkpoint.is_none() && checkpoint_written {
            // Without it nothing tells a sled database that went back from
            // a sound one: refuse rather than vote or serve from it.
            return Err(damaged_file(
                &dir.join(CHECKPOINT_FILE),
                &format!(
                    "is missing, but {} says this data dir was in use with one; restore it, \
                     or delete {IDENTITY_FILE} only to reformat this node on purpose",
                    dir.join(IDENTITY_FILE).display()
                ),
            ));
        }
        if let Some(checkpoint) = &checkpoint {
            check_against_checkpoint(dir, checkpoint, &election, recovered.end_offset)?;
        }
        // Passed the check: the log ends at or above the checkpoint's hint.
        let high_watermark_hint = sled_hw_hint.max(checkpoint.map_or(0, |c| c.high_watermark));

        let mut store = SledStore {
            dir: dir.to_path_buf(),
            blobs: BlobSyncs::new(sled_dir.join(BLOB_DIR)),
            sled_dir,
            db,
            meta,
            election_tree,
            log,
            data_file,
            election,
            start_offset: recovered.start_offset,
            start_epoch: log_start.epoch,
            reader_start: Arc::new(AtomicI64::new(recovered.start_offset)),
            end_offset: recovered.end_offset,
            epochs: recovered.epochs,
            high_watermark_hint,
            persisted_hw_hint: sled_hw_hint,
            checkpoint,
            fsync_count: 0,
            truncation_lock: Arc::new(RwLock::new(())),
            poisoned: Arc::new(OnceLock::new()),
        };
        if !recovered.stale.is_empty() {
            let reason = if log_start.reset_pending {
                "removing the old log left by a reset that a crash interrupted"
            } else {
                "removing batches below the persisted log start, left by a compaction that a crash interrupted"
            };
            tracing::warn!(
                dir = %store.dir.display(),
                log_start = log_start.offset,
                removed_values = recovered.stale.len(),
                "{reason}"
            );
            remove_in_steps(&store.log, recovered.stale)?;
        }
        if log_start.reset_pending {
            // Only once the old log is gone (sled recovers a prefix of its
            // writes): from here on, batches are appended to the new log.
            store.write_log_start(&LogStart {
                reset_pending: false,
                ..log_start
            })?;
        }
        if let Some(tail) = &recovered.damaged_tail {
            tracing::warn!(
                dir = %store.dir.display(),
                offset = tail.offset,
                reason = %tail.reason,
                removed_values = tail.keys.len(),
                "truncating the damaged tail of the log at open"
            );
            let mut removal = sled::Batch::default();
            for key in &tail.keys {
                removal.remove(key.clone());
            }
            store.log.apply_batch(removal).map_err(sled_error)?;
        }
        if fresh || meta_upgrade {
            if meta_upgrade {
                tracing::info!(dir = %dir.display(), to = FORMAT_VERSION, "upgrading the data directory's format version");
            }
            store.meta.insert(IDENTITY_KEY, encode(&expected)).map_err(sled_error)?;
        }
        // Always one durability point at open: besides the writes above, what
        // an earlier process wrote without one (sled's background flusher
        // writes pages without syncing them) must be durable before this node
        // reports its log end to anyone, since it treats its recovered log as
        // durable.
        store.make_durable()?;
        if store.high_watermark_hint != store.persisted_hw_hint {
            // The checkpoint's hint was ahead of sled's: sled holds it again
            // before anything else is written.
            store.flush()?;
        }
        store.write_checkpoint()?;
        // Only now that sled's identity and the checkpoint are durable: a
        // crash before this line leaves a directory without the file (or
        // with an older version), which the next open completes, never a
        // file beside an empty database or a format 3 file without a
        // checkpoint.
        if identity_file.is_none_or(|found| found.format_version != FORMAT_VERSION) {
            write_identity_file(dir, &expected)?;
        }
        Ok(store)
    }

    /// A handle for reading the log from other threads (HTTP `GET /v1/log`,
    /// listeners). It sees every write of this store at once.
    pub fn reader(&self) -> SledReader {
        SledReader {
            log: self.log.clone(),
            start: Arc::clone(&self.reader_start),
            truncation_lock: Arc::clone(&self.truncation_lock),
            poisoned: Arc::clone(&self.poisoned),
        }
    }

    /// Records that offsets below `hw` are committed. Persisted at the next
    /// `flush`; at open, a log that would end below the persisted hint is a
    /// hard [`StorageError::Corrupt`] error, and `truncate` below it is
    /// refused. The hint never decreases, and is capped at the log end (a
    /// follower's high watermark never exceeds its own log).
    pub fn set_high_watermark_hint(&mut self, hw: Offset) {
        let capped = hw.min(self.end_offset);
        self.high_watermark_hint = self.high_watermark_hint.max(capped);
    }

    pub fn high_watermark_hint(&self) -> Offset {
        self.high_watermark_hint
    }

    /// How many `fdatasync`s of sled's data file this store has issued: one
    /// per `flush`, per `write_election_state`, plus those at open.
    pub fn fsync_count(&self) -> u64 {
        self.fsync_count
    }

    /// How many blob files (see the module docs) this store has synced.
    pub fn blob_sync_count(&self) -> u64 {
        self.blobs.sync_count
    }

    /// How many times this store listed sled's blob directory: at its first
    /// durability point, and after sled wrote a blob (see `BlobSyncs`).
    pub fn blob_listings(&self) -> u64 {
        self.blobs.listings
    }

    /// The file this store `fdatasync`s: sled's data file, opened read-only.
    /// Exposed so tests can check it is the file sled writes.
    pub fn data_file(&self) -> &File {
        &self.data_file
    }

    /// The directory sled opened (`<data dir>/sled`).
    pub fn sled_dir(&self) -> &Path {
        &self.sled_dir
    }

    /// One durability point: everything sled accepted so far reaches stable
    /// storage.
    ///
    /// A failure poisons the store: after a failed fsync the kernel may have
    /// dropped the dirty pages it could not write, so a later fsync that
    /// succeeds says nothing about them (PostgreSQL's "fsyncgate"). Only a
    /// reopen, which reads back what is really on disk, may go on.
    fn make_durable(&mut self) -> Result<()> {
        let synced = self.sync_everything();
        if let Err(e) = &synced {
            self.poison(format!(
                "a durability point failed ({e}); what was written before it may not be on disk"
            ));
        }
        synced
    }

    fn sync_everything(&mut self) -> Result<()> {
        #[cfg(test)]
        tests::maybe_fail_durability_point()?;
        self.db.flush().map_err(sled_error)?;
        self.blobs.sync_new(self.db.blobs_written())?;
        self.data_file.sync_data()?;
        self.fsync_count += 1;
        Ok(())
    }

    /// Brings [`CHECKPOINT_FILE`] up to what sled holds durably, if that
    /// moved: the epoch of the election state and the persisted hint. Only
    /// ever called after the durability point that made them durable, so
    /// the file never runs ahead of sled.
    fn write_checkpoint(&mut self) -> Result<()> {
        let current = Checkpoint {
            epoch: self.election.epoch,
            voted_for: self.election.voted_for,
            high_watermark: self.persisted_hw_hint,
        };
        if self.checkpoint == Some(current) {
            return Ok(());
        }
        write_checkpoint_file(&self.dir, &current)?;
        self.checkpoint = Some(current);
        Ok(())
    }

    fn write_log_start(&self, log_start: &LogStart) -> Result<()> {
        self.meta.insert(LOG_START_KEY, encode(log_start)).map_err(sled_error)?;
        Ok(())
    }

    /// Removes the `log` values under `keys` and moves the log start, with
    /// readers excluded (see [`SledReader`]). A failure poisons the store
    /// before readers are let in again: some steps may have removed their
    /// batches, and the log start readers see is the old one.
    fn remove_front(&mut self, keys: Vec<sled::IVec>, start_offset: Offset) -> Result<()> {
        let _no_readers = self.truncation_lock.write().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = remove_in_steps(&self.log, keys) {
            self.poison(format!(
                "removing batches to start the log at {start_offset} failed part way ({e})"
            ));
            return Err(e);
        }
        self.start_offset = start_offset;
        self.reader_start.store(start_offset, Ordering::Release);
        Ok(())
    }

    /// Refuses the call when the store is poisoned.
    fn check_usable(&self) -> Result<()> {
        check_usable(&self.poisoned)
    }

    /// Makes this store and its readers refuse every later call: a change
    /// made in several sled writes (a compaction, a reset) failed part way,
    /// so sled holds part of it and this store's view (log start and end,
    /// epochs) none. Going on would serve reads from that stale view, and
    /// appends after a half-done reset would be removed by the next open,
    /// which completes the reset. The next open finds the new log start
    /// durable (it is written before any removal) and recovers from it.
    fn poison(&self, reason: String) {
        if self.poisoned.set(reason).is_ok() {
            tracing::error!(
                dir = %self.dir.display(),
                reason = %self.poisoned.get().map_or("", String::as_str),
                "the log store is unusable until reopened"
            );
        }
    }

    /// Runs `steps`, the writes of a change made in several sled writes,
    /// and poisons the store if one of them fails (see [`SledStore::poison`]).
    fn all_or_poison(&mut self, what: &str, steps: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let result = steps(self);
        if let Err(e) = &result {
            self.poison(format!("{what} failed part way ({e})"));
        }
        result
    }

    /// Debug-build check of the invariants written on the fields.
    fn check_invariants(&self) {
        debug_assert!(self.start_offset <= self.end_offset, "log start past its end");
        debug_assert_eq!(
            self.start_offset,
            self.reader_start.load(Ordering::Acquire),
            "readers see another log start"
        );
        debug_assert!(
            self.epoch_cache()
                .first()
                .is_none_or(|&(epoch, offset)| epoch >= self.start_epoch && offset == self.start_offset),
            "epoch cache does not begin at the log start"
        );
        debug_assert!(
            self.high_watermark_hint <= self.end_offset,
            "high watermark hint past the log end"
        );
    }
}

impl LogStore for SledStore {
    fn election_state(&self) -> Result<ElectionState> {
        self.check_usable()?;
        Ok(self.election.clone())
    }

    fn write_election_state(&mut self, state: &ElectionState) -> Result<()> {
        self.check_usable()?;
        check_election_transition(&self.election, state)?;
        self.election_tree
            .insert(ELECTION_KEY, encode(state))
            .map_err(sled_error)?;
        self.make_durable()?;
        self.election = state.clone();
        self.write_checkpoint()
    }

    fn append(&mut self, batch: &Batch) -> Result<()> {
        self.check_usable()?;
        check_append(self.end_offset, self.epochs.last_epoch(), batch)?;
        if self.epochs.last_epoch().is_none() && batch.epoch < self.start_epoch {
            return Err(below_start_epoch(batch, self.start_epoch));
        }
        let encoded = encode(batch);
        if encoded.len() <= MAX_LOG_VALUE_BYTES {
            self.log
                .insert(offset_key(batch.base_offset), encoded)
                .map_err(sled_error)?;
        } else {
            // One sled batch: sled recovers it whole or not at all, and
            // readers (whose every step takes sled's read lock, which
            // `apply_batch` holds for writing) see all of it or none.
            self.log
                .apply_batch(chunked_batch(batch.base_offset, &encoded))
                .map_err(sled_error)?;
        }
        self.epochs.on_append(batch.epoch, batch.base_offset);
        self.end_offset = batch.next_offset();
        Ok(())
    }

    fn truncate(&mut self, end_offset: Offset) -> Result<()> {
        self.check_usable()?;
        if end_offset < self.start_offset {
            return Err(StorageError::Invalid(format!(
                "truncation to {end_offset}, below the log start {}",
                self.start_offset
            )));
        }
        if end_offset >= self.end_offset {
            return Ok(());
        }
        if end_offset < self.high_watermark_hint {
            return Err(StorageError::Invalid(format!(
                "truncation to {end_offset}, below the high watermark hint {}: committed offsets would be lost",
                self.high_watermark_hint
            )));
        }
        // The log is contiguous from its start and `end_offset` lies inside
        // it, so some batch starts at or below `end_offset`.
        let holder = self
            .log
            .range(..=offset_key(end_offset))
            .next_back()
            .transpose()
            .map_err(sled_error)?;
        let holder_base = match holder {
            Some((key, _)) => key_base(&key).ok_or_else(|| corrupt(end_offset, "log key is not an offset"))?,
            None => return Err(corrupt(end_offset, "no batch holds an offset inside the log")),
        };
        if holder_base != end_offset {
            return Err(StorageError::Invalid(format!(
                "truncation to {end_offset}, inside the batch that starts at {holder_base}"
            )));
        }
        // From the head of the batch at `end_offset` on: its chunks, and
        // every later batch with all of its chunks.
        let mut removal = sled::Batch::default();
        for entry in touch_each(&self.log, self.log.range(offset_key(end_offset)..)) {
            let (key, _) = entry.map_err(sled_error)?;
            removal.remove(key);
        }
        {
            let _no_readers = self.truncation_lock.write().unwrap_or_else(|e| e.into_inner());
            self.log.apply_batch(removal).map_err(sled_error)?;
        }
        self.epochs.truncate(end_offset);
        self.end_offset = end_offset;
        self.check_invariants();
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.check_usable()?;
        let hint = self.high_watermark_hint;
        if hint != self.persisted_hw_hint {
            self.meta.insert(HW_HINT_KEY, encode(&hint)).map_err(sled_error)?;
        }
        self.make_durable()?;
        self.persisted_hw_hint = hint;
        self.write_checkpoint()
    }

    fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> Result<Vec<Batch>> {
        self.check_usable()?;
        read_log(&self.log, self.start_offset, from, until, max_bytes)
    }

    /// Writes the new log start, then removes the batches below it, then
    /// flushes: a crash in between leaves batches below the start, which the
    /// next open removes, and a failure in between poisons the store.
    fn delete_before(&mut self, offset: Offset) -> Result<()> {
        self.check_usable()?;
        if offset > self.end_offset {
            return Err(StorageError::Invalid(format!(
                "compaction below {offset}, past the log end {}",
                self.end_offset
            )));
        }
        if offset <= self.start_offset {
            // Nothing lies wholly below it. (Keys of negative offsets would
            // also sort after every key: the range below must not see them.)
            return self.flush();
        }
        // Every batch starting at or below `offset` goes, but the one that
        // holds `offset` when it lies inside the log (the last of them, as
        // the log is contiguous). The range holds the chunks of the batches
        // starting below `offset`, and the head alone of one starting at it.
        let mut removed = Vec::new();
        for entry in touch_each(&self.log, self.log.range(..=offset_key(offset))) {
            let (key, _) = entry.map_err(sled_error)?;
            removed.push(key);
        }
        let new_start = if offset < self.end_offset {
            let holder = removed
                .last()
                .ok_or_else(|| corrupt(offset, "no batch holds an offset inside the log"))?;
            let holder = key_base(holder).ok_or_else(|| corrupt(offset, "log key is not an offset"))?;
            removed.retain(|key| key_base(key) != Some(holder));
            holder
        } else {
            offset
        };
        if let Some(last) = removed.last() {
            let last_base = key_base(last).ok_or_else(|| corrupt(offset, "log key is not an offset"))?;
            let start_epoch = self
                .epochs
                .epoch_at(last_base)
                .ok_or_else(|| corrupt(last_base, "the epoch cache has no epoch for a batch of the log"))?;
            self.all_or_poison(&format!("compaction below {offset}"), |store| {
                store.write_log_start(&LogStart {
                    offset: new_start,
                    epoch: start_epoch,
                    reset_pending: false,
                })?;
                // Durable before the removals, which take several sled
                // batches: a crash between them then finds the new start on
                // record.
                store.make_durable()?;
                store.remove_front(removed, new_start)?;
                store.start_epoch = start_epoch;
                store.epochs.truncate_front(new_start, store.end_offset);
                store.check_invariants();
                Ok(())
            })?;
        }
        self.flush()
    }

    /// Writes the new log start marked pending, removes every batch, clears
    /// the mark, then flushes. Refused below the high watermark hint, like a
    /// truncation: committed offsets would be lost. A failure after the
    /// first write poisons the store; the next open completes the reset.
    fn reset(&mut self, start_offset: Offset, start_epoch: Epoch) -> Result<()> {
        self.check_usable()?;
        check_reset(start_offset, start_epoch)?;
        if start_offset < self.high_watermark_hint {
            return Err(StorageError::Invalid(format!(
                "reset of the log to start at {start_offset}, below the high watermark hint {}: \
                 committed offsets would be lost",
                self.high_watermark_hint
            )));
        }
        let log_start = LogStart {
            offset: start_offset,
            epoch: start_epoch,
            reset_pending: true,
        };
        self.all_or_poison(&format!("reset of the log to start at {start_offset}"), |store| {
            store.write_log_start(&log_start)?;
            // Durable before the removals (several sled batches): a crash
            // between them finds the reset on record and finishes it at open.
            store.make_durable()?;
            let mut removed = Vec::new();
            for entry in touch_each(&store.log, store.log.iter()) {
                let (key, _) = entry.map_err(sled_error)?;
                removed.push(key);
            }
            store.remove_front(removed, start_offset)?;
            store.write_log_start(&LogStart {
                reset_pending: false,
                ..log_start
            })?;
            store.start_epoch = start_epoch;
            store.end_offset = start_offset;
            store.epochs.clear();
            store.check_invariants();
            store.flush()
        })
    }

    fn start_offset(&self) -> Offset {
        self.start_offset
    }

    fn start_epoch(&self) -> Epoch {
        self.start_epoch
    }

    fn end_offset(&self) -> Offset {
        self.end_offset
    }

    fn epoch_cache(&self) -> Vec<(Epoch, Offset)> {
        self.epochs.to_vec()
    }
}

/// A read-only handle on the log of a [`SledStore`], for other threads.
///
/// sled has no snapshots and a range scan is not atomic, so a scan racing a
/// truncation could return batches from before it followed by batches
/// appended after it: a log that never existed. Reads therefore share a
/// lock with truncations, compactions and resets (never with appends, which
/// only add at the end); those are rare (a follower meeting a diverging
/// epoch, a snapshot), so the storage thread almost never waits on it.
#[derive(Clone, Debug)]
pub struct SledReader {
    log: sled::Tree,
    /// The store's log start (see `SledStore::reader_start`).
    start: Arc<AtomicI64>,
    truncation_lock: Arc<RwLock<()>>,
    /// The store's poison (see `SledStore::poison`).
    poisoned: Arc<OnceLock<String>>,
}

impl SledReader {
    /// Same rules as [`LogStore::read`]; a damaged batch is an error, never
    /// returned. Fails with [`StorageError::Poisoned`] once the store is.
    pub fn read(&self, from: Offset, until: Offset, max_bytes: usize) -> Result<Vec<Batch>> {
        // The lock guards no data, so a poisoned one is as good as any.
        let _no_truncation = self.truncation_lock.read().unwrap_or_else(|e| e.into_inner());
        // Under the lock: a store poisons itself before it lets readers in.
        check_usable(&self.poisoned)?;
        read_log(&self.log, self.start.load(Ordering::Acquire), from, until, max_bytes)
    }
}

/// Fsyncs new blob files of sled (see the module docs) at each durability
/// point.
///
/// sled may create a blob while we list the directory (a page consolidation
/// on a reader thread), so a blob seen for the first time may still be being
/// written. Its write completes before its pointer is stable, so before the
/// next `Db::flush` returns; hence every blob is synced at the first two
/// durability points that see it. Blobs are never modified after that.
///
/// Listing the directory at every durability point cost the storage thread
/// a sixth of its CPU at 64 clients (an `opendir`, a 32 KiB buffer, a
/// `getdents64`). The vendored sled counts the blobs it has written
/// (`Db::blobs_written`, counted once each write is over), so the directory
/// is listed only when that count moved since the count read before the
/// last listing: a blob written since then, or one that listing may have
/// seen half-written, always moves it.
#[derive(Debug)]
struct BlobSyncs {
    dir: PathBuf,
    /// Blob file name → how many durability points synced it (1 or 2).
    /// Names sled deleted are dropped at the next listing.
    synced: HashMap<OsString, u8>,
    /// sled's blob count read just before the last complete listing;
    /// `None` until one was made.
    listed_at: Option<u64>,
    sync_count: u64,
    listings: u64,
}

impl BlobSyncs {
    fn new(dir: PathBuf) -> Self {
        BlobSyncs {
            dir,
            synced: HashMap::new(),
            listed_at: None,
            sync_count: 0,
            listings: 0,
        }
    }

    /// `blobs_written` is sled's `Db::blobs_written`, read after the flush.
    fn sync_new(&mut self, blobs_written: u64) -> io::Result<()> {
        if self.listed_at == Some(blobs_written) {
            return Ok(());
        }
        self.listings += 1;
        let mut listed = HashMap::with_capacity(self.synced.len());
        let mut created = false;
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let times = self.synced.get(&name).copied().unwrap_or(0);
            if times < 2 {
                match File::open(entry.path()) {
                    Ok(file) => file.sync_data()?,
                    // sled removed it meanwhile: nothing to make durable.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                self.sync_count += 1;
                created |= times == 0;
            }
            listed.insert(name, (times + 1).min(2));
        }
        if created {
            File::open(&self.dir)?.sync_all()?;
        }
        self.synced = listed;
        self.listed_at = Some(blobs_written);
        Ok(())
    }
}

/// What the open-time scan found in the `log` tree.
struct RecoveredLog {
    start_offset: Offset,
    end_offset: Offset,
    epochs: EpochCache,
    damaged_tail: Option<DamagedTail>,
    /// Keys of values left over by a compaction or a reset that a crash
    /// interrupted: batches wholly below the log start, or every value under
    /// a pending reset. To be removed.
    stale: Vec<sled::IVec>,
}

/// Damaged values at the end of the log, with nothing valid after them.
struct DamagedTail {
    /// Where the valid log ends and is cut: the offset of the first damaged
    /// value (the reason names its key, which may itself be damaged).
    offset: Offset,
    reason: String,
    keys: Vec<sled::IVec>,
}

/// Scans the whole log (see the module docs) without changing it.
fn recover_log(log: &sled::Tree, log_start: &LogStart, high_watermark_hint: Offset) -> Result<RecoveredLog> {
    let start_offset = log_start.offset;
    let mut end_offset = start_offset;
    let mut epochs = EpochCache::default();
    let mut damaged_tail: Option<DamagedTail> = None;
    let mut stale = Vec::new();

    for stored in StoredBatches::new(touch_each(log, log.iter())) {
        let stored = stored?;
        if log_start.reset_pending {
            // Everything is left over from before the reset, valid or not.
            stale.extend(stored.keys());
            continue;
        }
        if let Some(tail) = damaged_tail.as_mut() {
            // Past the first damage everything must be damaged too; a valid
            // batch there means the damage is not a torn tail, and dropping
            // it would silently lose data.
            if let Ok(batch) = stored.decode() {
                return Err(corrupt(
                    tail.offset,
                    &format!(
                        "{}, and a valid batch follows at offset {}",
                        tail.reason, batch.base_offset
                    ),
                ));
            }
            tail.keys.extend(stored.keys());
            continue;
        }
        match stored.decode() {
            Ok(batch) if batch.next_offset() <= start_offset => {
                // Wholly below the start: a compaction wrote the start and
                // crashed before it removed this batch. (Keys sort by
                // offset, so no batch of the log precedes it.)
                stale.extend(stored.keys());
            }
            Ok(batch) => {
                let first = epochs.last_epoch().is_none();
                if batch.base_offset != end_offset {
                    let reason = if !first {
                        format!(
                            "the log jumps from offset {end_offset} to a batch at {}",
                            batch.base_offset
                        )
                    } else if batch.base_offset > start_offset {
                        format!(
                            "the log starts at {start_offset} (its persisted start), but its first batch is at {}: \
                             batches are missing",
                            batch.base_offset
                        )
                    } else {
                        format!(
                            "the batch [{}, {}) straddles the persisted log start {start_offset}",
                            batch.base_offset,
                            batch.next_offset()
                        )
                    };
                    return Err(corrupt(end_offset, &reason));
                }
                let last = epochs.last_epoch().unwrap_or(log_start.epoch);
                if batch.epoch < last {
                    let before = if first {
                        format!("the log start, in epoch {last}")
                    } else {
                        format!("a batch of epoch {last}")
                    };
                    return Err(corrupt(
                        batch.base_offset,
                        &format!("batch of epoch {} follows {before}", batch.epoch),
                    ));
                }
                epochs.on_append(batch.epoch, batch.base_offset);
                end_offset = batch.next_offset();
            }
            Err(reason) => {
                // Where the valid log ends, which is where it will be cut.
                let offset = end_offset;
                damaged_tail = Some(DamagedTail {
                    offset,
                    reason,
                    keys: stored.keys().collect(),
                });
            }
        }
    }

    if end_offset < high_watermark_hint {
        return Err(match &damaged_tail {
            Some(tail) => corrupt(
                tail.offset,
                &format!(
                    "{}; truncating there would lose committed offsets below the high watermark hint {high_watermark_hint}",
                    tail.reason
                ),
            ),
            None => corrupt(
                end_offset,
                &format!("the log ends at {end_offset}, below the high watermark hint {high_watermark_hint}: committed batches are missing"),
            ),
        });
    }
    Ok(RecoveredLog {
        start_offset,
        end_offset,
        epochs,
        damaged_tail,
        stale,
    })
}

/// The shared read path of [`SledStore`] and [`SledReader`].
fn read_log(
    log: &sled::Tree,
    start_offset: Offset,
    from: Offset,
    until: Offset,
    max_bytes: usize,
) -> Result<Vec<Batch>> {
    if from < start_offset {
        return Err(below_start(from, start_offset));
    }
    if from >= until {
        return Ok(Vec::new());
    }
    // The batch holding `from` is the last one whose base offset is <= from:
    // the one of the last key up to `from`'s, which may be one of its chunks.
    let first_base = match log.range(..=offset_key(from)).next_back() {
        Some(entry) => {
            let (key, _) = entry.map_err(sled_error)?;
            key_base(&key).ok_or_else(|| corrupt(-1, &format!("log key of {} bytes is not an offset", key.len())))?
        }
        None => {
            return match log.first().map_err(sled_error)? {
                Some((key, _)) => Err(below_start(from, key_base(&key).unwrap_or(0))),
                None => Ok(Vec::new()),
            }
        }
    };

    // Batches are contiguous, so each one is found by a point lookup at the
    // end of the one before: not a scan, which would keep every page it
    // reads in memory (see the module docs).
    let mut budget = ReadBudget::new(max_bytes);
    let mut base = first_base;
    let mut batches = Vec::new();
    while base < until {
        let Some(value) = log.get(offset_key(base)).map_err(sled_error)? else {
            if batches.is_empty() {
                // The last key at or below `from` named this batch, so its
                // head is gone: damage, not the log end.
                return Err(corrupt(base, "a chunk of this batch has no head value"));
            }
            // The log end.
            break;
        };
        // Whether the batch is returned depends only on where it ends and
        // how large it is, which its first bytes say: a read at the log end
        // (a follower or listener waiting there) or past its budget takes
        // none of its chunks.
        let Some(peeked) = PeekedBatch::peek(base, &value) else {
            // A batch that decodes always peeks: decoding says what is wrong.
            let reason = with_chunks(log, base, value)?
                .decode()
                .err()
                .unwrap_or_else(|| "its first bytes are not those of a batch".to_string());
            return Err(corrupt(base, &reason));
        };
        if batches.is_empty() && peeked.next_offset <= from {
            // `from` is at or past the log end.
            return Ok(Vec::new());
        }
        if !budget.try_take(peeked.size_bytes) {
            break;
        }
        // Decoded and checked whole: what was peeked only decides what is
        // read, and is what the batch says once it passes its CRC.
        let batch = with_chunks(log, base, value)?.decode_for_read()?;
        base = batch.next_offset();
        batches.push(batch);
    }
    Ok(batches)
}

/// Where a stored batch ends and how large it is ([`Batch::size_bytes`]),
/// from the value under its base offset alone: a whole batch, or a chunked
/// batch's head (which says how long the whole encoding is, and starts with
/// its first bytes). Nothing is checked, so it only decides what a read
/// takes; a batch returned is read whole and checked.
struct PeekedBatch {
    next_offset: Offset,
    size_bytes: usize,
}

impl PeekedBatch {
    /// `None` when `value` does not even begin like a batch under `base`.
    fn peek(base: Offset, value: &[u8]) -> Option<PeekedBatch> {
        let (encoding, encoded_bytes) = if value.starts_with(&CHUNKED_HEAD_MAGIC) {
            let head = ChunkedHead::parse(value)?;
            (&value[CHUNKED_HEAD_BYTES..], usize::try_from(head.total_bytes).ok()?)
        } else {
            (value, value.len())
        };
        let (base_offset, record_count) = Batch::peek_offsets(encoding)?;
        if base_offset != base || record_count == 0 {
            return None;
        }
        Some(PeekedBatch {
            next_offset: base.checked_add(Offset::from(record_count))?,
            size_bytes: Batch::size_bytes_of_encoding(encoded_bytes)?,
        })
    }
}

/// The values of the batch stored under `base`, whose value there is
/// `value`: when that is a chunked batch's head, with the chunks it
/// announces (up to the first missing one), found by point lookups.
fn with_chunks(log: &sled::Tree, base: Offset, value: sled::IVec) -> Result<StoredBatch> {
    let key = offset_key(base);
    let chunks = match ChunkedHead::parse(&value) {
        Some(head) if value.starts_with(&CHUNKED_HEAD_MAGIC) => (head.chunks as usize).min(MAX_CHUNKS_PER_BATCH),
        _ => 0,
    };
    let mut values = Vec::with_capacity(1 + chunks);
    values.push((sled::IVec::from(&key[..]), value));
    for index in (1..).take(chunks) {
        let key = chunk_key(base, index);
        #[cfg(test)]
        tests::count_chunk_read();
        match log.get(key).map_err(sled_error)? {
            Some(chunk) => values.push((sled::IVec::from(&key[..]), chunk)),
            // `decode` names what is missing.
            None => break,
        }
    }
    Ok(StoredBatch { values })
}

/// How many values [`remove_in_steps`] removes per sled batch (more when one
/// stored batch has more).
const REMOVED_VALUES_PER_STEP: usize = 256;

/// Removes the `log` values under `keys` (in key order), which lie below
/// the log start or under a pending reset, in several sled batches, each of
/// whole stored batches: the values under one base offset go together.
///
/// One sled batch for all would hold sled's epoch guard for the whole
/// removal, and sled frees nothing it replaces or evicts meanwhile: as one
/// sled batch, compacting 900,000 records of 100 B in 4 KiB chunks took RSS
/// from 56 MiB to 479 MiB; in steps, RSS does not move. Removing the front
/// in steps is safe: a crash between two leaves whole batches below the log
/// start, or under the reset mark, and the next open removes them.
fn remove_in_steps(log: &sled::Tree, keys: Vec<sled::IVec>) -> Result<()> {
    let mut step = sled::Batch::default();
    let mut in_step = 0;
    let mut last_base = None;
    for key in keys {
        let base = key_base(&key);
        if in_step >= REMOVED_VALUES_PER_STEP && (base.is_none() || base != last_base) {
            apply_removal_step(log, std::mem::take(&mut step))?;
            in_step = 0;
        }
        step.remove(key);
        in_step += 1;
        last_base = base;
    }
    apply_removal_step(log, step)
}

/// One step of [`remove_in_steps`]. Tests can make it fail (see
/// `tests::fail_removal_step_after`): sled offers no way to.
fn apply_removal_step(log: &sled::Tree, step: sled::Batch) -> Result<()> {
    #[cfg(test)]
    tests::maybe_fail_removal_step()?;
    log.apply_batch(step).map_err(sled_error)?;
    collect_garbage();
    Ok(())
}

/// Frees what sled has retired and no thread can still read: the node
/// versions a removal step replaced, with the values they hold. sled defers
/// those frees to crossbeam-epoch's collector, which frees at most 8 bags of
/// 64 deferred frees at every 128th pin of a thread. A removal step pins
/// once for hundreds of removals, so the garbage of a large compaction
/// outgrew the collection: compacting 90% of 1M records of 100 B took the
/// process from 20 to 36-43 MiB, and with this after each step to 26-32.
/// Each `flush` moves this thread's garbage to the global queue and collects
/// what is old enough (sled and kraft share crossbeam-epoch 0.9's default
/// collector).
fn collect_garbage() {
    for _ in 0..GARBAGE_COLLECTIONS_PER_STEP {
        crossbeam_epoch::pin().flush();
    }
}

/// See [`collect_garbage`]: each collection frees up to 8 bags, and a step
/// of 256 removals leaves a few bags.
const GARBAGE_COLLECTIONS_PER_STEP: usize = 8;

/// `scan`, a scan of the `log` tree, with each entry looked up again by its
/// key, only so that sled counts one access of its page per value: a plain
/// scan counts one per page, too few for sled's cache to ever evict a page
/// (see the module docs), and would leave all it read in memory.
///
/// Every [`TOUCHES_BETWEEN_MEMORY_TRIMS`] values it also returns freed memory
/// to the system: the pages it evicts from sled's cache may have been
/// allocated by another thread (the snapshot thread), whose arena would
/// keep them (a compaction of 1M records raised a node's peak RSS by ~40
/// MiB).
fn touch_each(log: &sled::Tree, scan: sled::Iter) -> impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>> + '_ {
    let mut touched = 0u64;
    scan.map(move |entry| {
        let (key, value) = entry?;
        log.get(&key)?;
        touched += 1;
        if touched.is_multiple_of(TOUCHES_BETWEEN_MEMORY_TRIMS) {
            super::return_free_memory();
        }
        Ok((key, value))
    })
}

/// See [`touch_each`].
const TOUCHES_BETWEEN_MEMORY_TRIMS: u64 = 2048;

/// The `log` values of one batch, as a scan finds them: a whole batch, or a
/// chunked batch's head and chunks; or, in a damaged log, values sharing a
/// base offset that make no batch. Never empty.
struct StoredBatch {
    values: Vec<(sled::IVec, sled::IVec)>,
}

impl StoredBatch {
    fn keys(&self) -> impl Iterator<Item = sled::IVec> + '_ {
        self.values.iter().map(|(key, _)| key.clone())
    }

    /// Reassembles, decodes and checks the batch; the error says what is
    /// wrong with it.
    fn decode(&self) -> std::result::Result<Batch, String> {
        let (key, value) = &self.values[0];
        let chunks = &self.values[1..];
        if key.len() != 8 {
            // A chunk without its head (or a key that is not an offset at
            // all, which `decode_batch` names).
            return match (key_base(key), chunk_index(key)) {
                (Some(base), Some(index)) => Err(format!(
                    "chunk {index} of the batch under offset {base} has no head value"
                )),
                _ => decode_batch(key, value),
            };
        }
        if !value.starts_with(&CHUNKED_HEAD_MAGIC) {
            // Stored whole: the format of every batch up to
            // MAX_LOG_VALUE_BYTES, and of every batch before chunking.
            if let Some((chunk, _)) = chunks.first() {
                return Err(format!(
                    "batch under offset {} is stored whole, yet {} chunk values follow it (the first is chunk {})",
                    key_base(key).unwrap_or(-1),
                    chunks.len(),
                    chunk_index(chunk).unwrap_or(0)
                ));
            }
            return decode_batch(key, value);
        }
        let base = key_base(key).unwrap_or(-1);
        let Some(head) = ChunkedHead::parse(value) else {
            return Err(format!(
                "chunked batch under offset {base} has a head of {} bytes, too short",
                value.len()
            ));
        };
        if head.chunks as usize > MAX_CHUNKS_PER_BATCH || head.total_bytes > MAX_STORED_BATCH_BYTES as u64 {
            return Err(format!(
                "chunked batch under offset {base} announces {} chunks and {} bytes, more than any batch",
                head.chunks, head.total_bytes
            ));
        }
        for (expected, (chunk, _)) in (1..).zip(chunks) {
            if chunk_index(chunk) != Some(expected) {
                return Err(format!(
                    "chunked batch under offset {base} lacks its chunk {expected} of {}",
                    head.chunks
                ));
            }
        }
        if chunks.len() != head.chunks as usize {
            return Err(format!(
                "chunked batch under offset {base} has {} chunk values, but its head announces {}",
                chunks.len(),
                head.chunks
            ));
        }
        let first = &value[CHUNKED_HEAD_BYTES..];
        let found_bytes = first.len() + chunks.iter().map(|(_, chunk)| chunk.len()).sum::<usize>();
        if found_bytes as u64 != head.total_bytes {
            return Err(format!(
                "chunked batch under offset {base} holds {found_bytes} bytes, but its head announces {}",
                head.total_bytes
            ));
        }
        let mut encoded = Vec::with_capacity(found_bytes);
        encoded.extend_from_slice(first);
        for (_, chunk) in chunks {
            encoded.extend_from_slice(chunk);
        }
        decode_batch(key, &encoded)
    }

    fn decode_for_read(&self) -> Result<Batch> {
        self.decode()
            .map_err(|reason| corrupt(key_base(&self.values[0].0).unwrap_or(-1), &reason))
    }
}

/// Groups the entries of a scan of the `log` tree into [`StoredBatch`]es:
/// each key with the chunk keys of the same base offset that follow it (at
/// most [`MAX_CHUNKS_PER_BATCH`]).
struct StoredBatches<I: Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>> {
    entries: std::iter::Peekable<I>,
}

impl<I: Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>> StoredBatches<I> {
    fn new(entries: I) -> Self {
        StoredBatches {
            entries: entries.peekable(),
        }
    }
}

impl<I: Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>> Iterator for StoredBatches<I> {
    type Item = Result<StoredBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let first = match self.entries.next()? {
            Ok(entry) => entry,
            Err(e) => return Some(Err(sled_error(e))),
        };
        let base = key_base(&first.0);
        let mut values = vec![first];
        while values.len() <= MAX_CHUNKS_PER_BATCH {
            let same_batch = |entry: &sled::Result<(sled::IVec, sled::IVec)>| match entry {
                Ok((key, _)) => key.len() == 12 && base.is_some() && key_base(key) == base,
                Err(_) => false,
            };
            match self.entries.next_if(same_batch) {
                Some(Ok(chunk)) => values.push(chunk),
                _ => break,
            }
        }
        Some(Ok(StoredBatch { values }))
    }
}

/// The header of a chunked batch's head value (see [`CHUNKED_HEAD_BYTES`]).
struct ChunkedHead {
    /// How many chunk values follow the head.
    chunks: u32,
    /// Length of the whole encoded batch: the head's bytes after the header
    /// plus every chunk.
    total_bytes: u64,
}

impl ChunkedHead {
    /// `None` when `value` is too short to hold the header.
    fn parse(value: &[u8]) -> Option<ChunkedHead> {
        let header = value.get(..CHUNKED_HEAD_BYTES)?;
        Some(ChunkedHead {
            chunks: u32::from_be_bytes(header[4..8].try_into().ok()?),
            total_bytes: u64::from_be_bytes(header[8..16].try_into().ok()?),
        })
    }
}

/// The `log` values of a batch whose encoding is above
/// [`MAX_LOG_VALUE_BYTES`], as one sled batch: under its base offset a head
/// ([`CHUNKED_HEAD_MAGIC`], the number of chunks that follow, the length of
/// `encoded`, then as many of its first bytes as fit), then the rest in
/// chunks of `MAX_LOG_VALUE_BYTES` under [`chunk_key`] 1, 2, ….
fn chunked_batch(base_offset: Offset, encoded: &[u8]) -> sled::Batch {
    assert!(
        encoded.len() > MAX_LOG_VALUE_BYTES,
        "a batch of {} bytes fits in one value",
        encoded.len()
    );
    let (first, rest) = encoded.split_at(MAX_LOG_VALUE_BYTES - CHUNKED_HEAD_BYTES);
    let chunks = rest.chunks(MAX_LOG_VALUE_BYTES);
    let count = u32::try_from(chunks.len()).expect("at most MAX_CHUNKS_PER_BATCH chunks");
    let mut head = Vec::with_capacity(MAX_LOG_VALUE_BYTES);
    head.extend_from_slice(&CHUNKED_HEAD_MAGIC);
    head.extend_from_slice(&count.to_be_bytes());
    head.extend_from_slice(&(encoded.len() as u64).to_be_bytes());
    head.extend_from_slice(first);
    let mut writes = sled::Batch::default();
    writes.insert(&offset_key(base_offset)[..], head);
    for (index, chunk) in (1..).zip(chunks) {
        writes.insert(&chunk_key(base_offset, index)[..], chunk);
    }
    writes
}

/// [`decode_batch`], for the fuzz targets (`crate::fuzzing`).
pub(crate) fn decode_log_value(key: &[u8], value: &[u8]) -> std::result::Result<Batch, String> {
    decode_batch(key, value)
}

/// Decodes and checks one log value; the error says what is wrong with it.
fn decode_batch(key: &[u8], value: &[u8]) -> std::result::Result<Batch, String> {
    let key_offset = key_offset(key).ok_or_else(|| format!("log key of {} bytes is not an offset", key.len()))?;
    let batch: Batch = decode_bounded(value, MAX_STORED_BATCH_BYTES as u64)
        .map_err(|e| format!("value under offset {key_offset} does not decode: {e}"))?;
    if !batch.verify() {
        // A CRC is no proof against crafted bytes: `verify` also refuses a
        // batch whose `next_offset` would overflow.
        return Err(format!(
            "batch under offset {key_offset} fails its CRC check or runs past the largest offset"
        ));
    }
    if batch.base_offset != key_offset {
        return Err(format!(
            "batch with base offset {} is stored under offset {key_offset}",
            batch.base_offset
        ));
    }
    Ok(batch)
}

/// The `log` tree key of a batch: its base offset, big-endian, so that key
/// order is offset order (offsets are never negative).
fn offset_key(offset: Offset) -> [u8; 8] {
    offset.to_be_bytes()
}

fn key_offset(key: &[u8]) -> Option<Offset> {
    let bytes: [u8; 8] = key.try_into().ok()?;
    Some(Offset::from_be_bytes(bytes))
}

/// The `log` tree key of chunk `index` (from 1) of a chunked batch: its
/// base offset then `index`, big-endian, so that the chunks sort after the
/// head of their batch and before the next batch.
fn chunk_key(base_offset: Offset, index: u32) -> [u8; 12] {
    let mut key = [0; 12];
    key[..8].copy_from_slice(&offset_key(base_offset));
    key[8..].copy_from_slice(&index.to_be_bytes());
    key
}

/// The base offset of the batch a `log` key belongs to: the key's offset
/// for a whole batch or a head, the first 8 bytes of a chunk key.
fn key_base(key: &[u8]) -> Option<Offset> {
    match key.len() {
        8 | 12 => key_offset(&key[..8]),
        _ => None,
    }
}

/// The index of a chunk key; `None` for any other key.
fn chunk_index(key: &[u8]) -> Option<u32> {
    let bytes: [u8; 4] = key.get(8..)?.try_into().ok()?;
    Some(u32::from_be_bytes(bytes))
}

/// How long an open waits for the database's file lock. A `sled::Db`
/// dropped in this process releases the lock only when sled's background
/// flusher notices (within its 500 ms period), so an immediate reopen — a
/// restart inside one process, or a retry after a refused open — must wait
/// for it; a live node holding the lock keeps it, and the open fails.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// Opens the database. sled can panic on some damaged files; that is turned
/// into an error, since nothing read from disk may take the node down
/// without saying what was wrong.
fn open_sled(sled_dir: &Path) -> Result<sled::Db> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        let config = sled::Config::new().path(sled_dir).cache_capacity(SLED_CACHE_BYTES);
        match catch_unwind(AssertUnwindSafe(|| config.open())) {
            Ok(Ok(db)) => return Ok(db),
            // sled reports a held lock as an `Other` error with this text.
            Ok(Err(sled::Error::Io(io))) if io.to_string().contains("could not acquire lock") => {
                if Instant::now() >= deadline {
                    return Err(StorageError::Io(std::io::Error::new(
                        io.kind(),
                        format!(
                            "the database in {} is locked: is another node using this data directory? ({io})",
                            sled_dir.display()
                        ),
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(Err(sled::Error::Io(io))) => return Err(StorageError::Io(io)),
            Ok(Err(sled::Error::Corruption { .. })) => {
                // sled's own message names no file ("Read corrupted data at
                // file offset None"): its settings (`conf`) or its log (`db`).
                return Err(StorageError::Damaged(format!(
                    "sled cannot read its settings file {CONF_FILE} or its data file {DATA_FILE} in {} \
                     (sled's log lines above name the part)",
                    sled_dir.display()
                )));
            }
            Ok(Err(other)) => {
                return Err(StorageError::Sled(format!(
                    "cannot open the sled database in {}: {other}",
                    sled_dir.display()
                )))
            }
            Err(_) => {
                return Err(StorageError::Sled(format!(
                    "sled panicked while opening the database in {} (damaged files?)",
                    sled_dir.display()
                )))
            }
        }
    }
}

fn open_tree(db: &sled::Db, name: &str) -> Result<sled::Tree> {
    db.open_tree(name).map_err(sled_error)
}

/// Makes durable what sled created without syncing: its `conf` file, the
/// directory entries of `db`, `conf` and `blobs`, and of the directories
/// above. Done once per open; cheap when nothing changed.
fn sync_created_files(sled_dir: &Path) -> Result<()> {
    File::open(sled_dir.join(CONF_FILE))?.sync_all()?;
    File::open(sled_dir.join(BLOB_DIR))?.sync_all()?;
    File::open(sled_dir)?.sync_all()?;
    // The data dir itself may have been created by sled too; its parent may
    // not be ours to open, so that one is best effort.
    if let Some(data_dir) = sled_dir.parent() {
        File::open(data_dir)?.sync_all()?;
        if let Some(parent) = data_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            if let Ok(dir) = File::open(parent) {
                let _ = dir.sync_all();
            }
        }
    }
    Ok(())
}

/// Checks the identity record; returns (the store is new, the record is of
/// an older format version): either way the identity must be written.
fn check_identity(
    dir: &Path,
    meta: &sled::Tree,
    election_tree: &sled::Tree,
    log: &sled::Tree,
    expected: &Identity,
) -> Result<(bool, bool)> {
    let Some(bytes) = meta.get(IDENTITY_KEY).map_err(sled_error)? else {
        let has_data = !log.is_empty() || !election_tree.is_empty();
        if has_data {
            return Err(damaged_value(
                dir,
                META_TREE,
                "holds no identity record, but the log or election state is not empty",
            ));
        }
        return Ok((true, false));
    };
    let found: Identity = decode_bounded(&bytes, SMALL_VALUE_LIMIT)
        .map_err(|e| damaged_value(dir, META_TREE, &format!("identity record does not decode: {e}")))?;
    if !readable_as(&found, expected) {
        return Err(identity_mismatch(dir, &found, expected));
    }
    Ok((false, found.format_version != expected.format_version))
}

/// Same cluster and node, and a format version this build reads.
fn readable_as(found: &Identity, expected: &Identity) -> bool {
    found.cluster_id == expected.cluster_id
        && found.node_id == expected.node_id
        && (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&found.format_version)
}

fn identity_mismatch(dir: &Path, found: &Identity, expected: &Identity) -> StorageError {
    StorageError::IdentityMismatch {
        dir: dir.display().to_string(),
        found: describe_identity(found),
        expected: describe_identity(expected),
    }
}

/// Reads [`IDENTITY_FILE`]: `key=value` lines (`cluster.id`, `node.id`,
/// `format.version`), `#` comments. `None` when the file does not exist.
fn read_identity_file(dir: &Path) -> Result<Option<Identity>> {
    let path = dir.join(IDENTITY_FILE);
    let Some(properties) = read_properties(&path, "an identity file")? else {
        return Ok(None);
    };
    let (mut cluster_id, mut node_id, mut format_version) = (None, None, None);
    for (key, value) in properties {
        match key.as_str() {
            "cluster.id" => cluster_id = Some(value),
            "node.id" => node_id = Some(parse_property(&path, &key, &value)?),
            "format.version" => format_version = Some(parse_property(&path, &key, &value)?),
            _ => {}
        }
    }
    match (cluster_id, node_id, format_version) {
        (Some(cluster_id), Some(node_id), Some(format_version)) => Ok(Some(Identity {
            cluster_id,
            node_id,
            format_version,
        })),
        _ => Err(damaged_file(&path, "lacks one of cluster.id, node.id, format.version")),
    }
}

/// The `key=value` lines of a small file, trimmed, without blank lines and
/// `#` comments. `None` when the file does not exist.
fn read_properties(path: &Path, what: &str) -> Result<Option<Vec<(String, String)>>> {
    let text = match fs::read(path) {
        Ok(bytes) if bytes.len() > SMALL_VALUE_LIMIT as usize => {
            return Err(damaged_file(path, &format!("is too large to be {what}")))
        }
        Ok(bytes) => String::from_utf8(bytes).map_err(|_| damaged_file(path, "is not UTF-8"))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut properties = Vec::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let Some((key, value)) = line.split_once('=') else {
            return Err(damaged_file(
                path,
                &format!("has a line that is not key=value: {line:?}"),
            ));
        };
        properties.push((key.trim().to_string(), value.trim().to_string()));
    }
    Ok(Some(properties))
}

fn parse_property<T: std::str::FromStr>(path: &Path, key: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|_| damaged_file(path, &format!("has a bad number for {key}: {value:?}")))
}

/// What [`CHECKPOINT_FILE`] records: see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Checkpoint {
    epoch: Epoch,
    voted_for: Option<NodeId>,
    high_watermark: Offset,
}

/// Reads [`CHECKPOINT_FILE`]: `epoch`, `voted.for` (empty for none) and
/// `high.watermark` lines. `None` when the file does not exist (a data dir
/// from before it, or one never flushed).
fn read_checkpoint_file(dir: &Path) -> Result<Option<Checkpoint>> {
    let path = dir.join(CHECKPOINT_FILE);
    let Some(properties) = read_properties(&path, "a checkpoint file")? else {
        return Ok(None);
    };
    let (mut epoch, mut voted_for, mut high_watermark) = (None, None, None);
    for (key, value) in properties {
        match key.as_str() {
            "epoch" => epoch = Some(parse_property::<Epoch>(&path, &key, &value)?),
            "voted.for" if value.is_empty() => voted_for = Some(None),
            "voted.for" => voted_for = Some(Some(parse_property::<NodeId>(&path, &key, &value)?)),
            "high.watermark" => high_watermark = Some(parse_property::<Offset>(&path, &key, &value)?),
            _ => {}
        }
    }
    match (epoch, voted_for, high_watermark) {
        (Some(epoch), Some(voted_for), Some(high_watermark)) if epoch >= 0 && high_watermark >= 0 => {
            Ok(Some(Checkpoint {
                epoch,
                voted_for,
                high_watermark,
            }))
        }
        (Some(_), Some(_), Some(_)) => Err(damaged_file(&path, "has a negative epoch or high watermark")),
        _ => Err(damaged_file(&path, "lacks one of epoch, voted.for, high.watermark")),
    }
}

/// Writes [`CHECKPOINT_FILE`]: temporary file, fdatasync, rename. Without
/// a sync of the directory a crash may bring back the file before, which is
/// behind sled too and so as good a check.
fn write_checkpoint_file(dir: &Path, checkpoint: &Checkpoint) -> Result<()> {
    let voted_for = checkpoint.voted_for.map(|id| id.to_string()).unwrap_or_default();
    let text = format!(
        "# What this node made durable in sled/, checked at every start: sled must not be behind it.\n\
         epoch={}\nvoted.for={voted_for}\nhigh.watermark={}\n",
        checkpoint.epoch, checkpoint.high_watermark
    );
    replace_file(dir, CHECKPOINT_FILE, &text)
}

/// sled came back behind the checkpoint: it lost writes it had made durable.
fn check_against_checkpoint(
    dir: &Path,
    checkpoint: &Checkpoint,
    election: &ElectionState,
    log_end: Offset,
) -> Result<()> {
    let lost = if election.epoch < checkpoint.epoch {
        Some(format!(
            "its election state is of epoch {}, but this node had reached epoch {}: it could vote twice in one epoch",
            election.epoch, checkpoint.epoch
        ))
    } else if election.epoch == checkpoint.epoch
        && checkpoint.voted_for.is_some()
        && election.voted_for != checkpoint.voted_for
    {
        // A vote is never withdrawn within its epoch, so a vote the
        // checkpoint holds and sled does not (or another one) was lost:
        // this node could vote again in the epoch.
        let voter = |vote: Option<NodeId>| vote.map_or("nobody".to_string(), |id| format!("node {id}"));
        Some(format!(
            "its election state votes for {} in epoch {}, but this node had voted for {}: it could vote twice in one epoch",
            voter(election.voted_for),
            election.epoch,
            voter(checkpoint.voted_for)
        ))
    } else if log_end < checkpoint.high_watermark {
        Some(format!(
            "its log ends at offset {log_end}, but offsets below {} were committed and durable here: \
             it would serve a log without records it had committed",
            checkpoint.high_watermark
        ))
    } else {
        None
    };
    match lost {
        None => Ok(()),
        Some(what) => Err(StorageError::Damaged(format!(
            "the sled database in {} is behind {}: {what}. sled lost writes it had made durable \
             (a damaged file?). Refusing to start; if the node has peers, delete the data directory {} \
             to rebuild it from them",
            dir.join(SLED_SUBDIR).display(),
            dir.join(CHECKPOINT_FILE).display(),
            dir.display()
        ))),
    }
}

/// Writes [`IDENTITY_FILE`] atomically: temporary file, fsync, rename,
/// fsync of the directory.
fn write_identity_file(dir: &Path, identity: &Identity) -> Result<()> {
    let text = format!(
        "# Identity of this kraft data directory, checked at every start.\n\
         cluster.id={}\nnode.id={}\nformat.version={}\n",
        identity.cluster_id, identity.node_id, identity.format_version
    );
    replace_file(dir, IDENTITY_FILE, &text)?;
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Replaces `dir/name` by a file holding `text`: written to `name.tmp`,
/// fdatasync'd, renamed over it. Durable only once the caller syncs `dir`.
fn replace_file(dir: &Path, name: &str, text: &str) -> Result<()> {
    let temporary = dir.join(format!("{name}.tmp"));
    let mut file = File::create(&temporary)?;
    io::Write::write_all(&mut file, text.as_bytes())?;
    file.sync_data()?;
    fs::rename(&temporary, dir.join(name))?;
    Ok(())
}

fn damaged_file(path: &Path, what: &str) -> StorageError {
    StorageError::Damaged(format!("{}: {what}", path.display()))
}

fn describe_identity(identity: &Identity) -> String {
    format!(
        "cluster id {:?}, node id {} (format version {})",
        identity.cluster_id, identity.node_id, identity.format_version
    )
}

fn load_election_state(dir: &Path, election_tree: &sled::Tree) -> Result<ElectionState> {
    match election_tree.get(ELECTION_KEY).map_err(sled_error)? {
        None => Ok(ElectionState::default()),
        Some(bytes) => decode_bounded(&bytes, SMALL_VALUE_LIMIT)
            .map_err(|e| damaged_value(dir, ELECTION_TREE, &format!("election state does not decode: {e}"))),
    }
}

fn load_hw_hint(dir: &Path, meta: &sled::Tree) -> Result<Offset> {
    match meta.get(HW_HINT_KEY).map_err(sled_error)? {
        None => Ok(0),
        Some(bytes) => {
            let hint: Offset = decode_bounded(&bytes, SMALL_VALUE_LIMIT)
                .map_err(|e| damaged_value(dir, META_TREE, &format!("high watermark hint does not decode: {e}")))?;
            if hint < 0 {
                return Err(damaged_value(
                    dir,
                    META_TREE,
                    &format!("high watermark hint {hint} is negative"),
                ));
            }
            Ok(hint)
        }
    }
}

fn load_log_start(dir: &Path, meta: &sled::Tree) -> Result<LogStart> {
    match meta.get(LOG_START_KEY).map_err(sled_error)? {
        // A data dir from before compaction: its log starts at 0.
        None => Ok(LogStart::default()),
        Some(bytes) => {
            let log_start: LogStart = decode_bounded(&bytes, SMALL_VALUE_LIMIT)
                .map_err(|e| damaged_value(dir, META_TREE, &format!("log start does not decode: {e}")))?;
            if log_start.offset < 0 || log_start.epoch < 0 {
                return Err(damaged_value(
                    dir,
                    META_TREE,
                    &format!("log start {log_start:?} is negative"),
                ));
            }
            Ok(log_start)
        }
    }
}

/// A damaged value outside the log. The log's own damage has
/// [`StorageError::Corrupt`]; these have no offset to name.
fn damaged_value(dir: &Path, tree: &str, what: &str) -> StorageError {
    StorageError::Damaged(format!("{}: tree `{tree}` {what}", dir.display()))
}

fn check_usable(poisoned: &OnceLock<String>) -> Result<()> {
    match poisoned.get() {
        Some(reason) => Err(StorageError::Poisoned(reason.clone())),
        None => Ok(()),
    }
}

fn corrupt(offset: Offset, reason: &str) -> StorageError {
    StorageError::Corrupt {
        offset,
        reason: reason.to_string(),
    }
}

fn below_start(from: Offset, start_offset: Offset) -> StorageError {
    StorageError::Invalid(format!("read from {from}, below the log start {start_offset}"))
}

fn sled_error(e: sled::Error) -> StorageError {
    match e {
        sled::Error::Io(io) => StorageError::Io(io),
        other => StorageError::Sled(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Record;
    use std::cell::Cell;

    thread_local! {
        /// How many more steps of `remove_in_steps` succeed before one
        /// fails; `None`: none fails. Per thread, so per test.
        static REMOVAL_STEPS_BEFORE_FAILURE: Cell<Option<usize>> = const { Cell::new(None) };
    }

    thread_local! {
        /// Chunk values the read path has looked up on this thread.
        static CHUNK_READS: Cell<u64> = const { Cell::new(0) };
    }

    pub(super) fn count_chunk_read() {
        CHUNK_READS.with(|reads| reads.set(reads.get() + 1));
    }

    /// How many chunk values `read` takes from sled on this thread.
    fn chunk_reads(read: impl FnOnce()) -> u64 {
        let before = CHUNK_READS.with(Cell::get);
        read();
        CHUNK_READS.with(Cell::get) - before
    }

    /// Makes the step of `remove_in_steps` after the next `steps` fail (once).
    fn fail_removal_step_after(steps: usize) {
        REMOVAL_STEPS_BEFORE_FAILURE.with(|left| left.set(Some(steps)));
    }

    thread_local! {
        /// Set: the next durability point on this thread fails.
        static FAIL_DURABILITY_POINT: Cell<bool> = const { Cell::new(false) };
    }

    pub(super) fn maybe_fail_durability_point() -> Result<()> {
        match FAIL_DURABILITY_POINT.with(|fail| fail.replace(false)) {
            true => Err(StorageError::Io(io::Error::other("injected failure of an fsync"))),
            false => Ok(()),
        }
    }

    #[test]
    fn a_failed_durability_point_poisons_the_store_until_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SledStore::open(dir.path(), "c", 1).unwrap();
        let first = batch(0, 1);
        store.append(&first).unwrap();
        store.flush().unwrap();
        store.append(&batch(1, 1)).unwrap();
        FAIL_DURABILITY_POINT.with(|fail| fail.set(true));
        let error = store.flush().expect_err("injected");
        assert!(error.to_string().contains("injected"), "{error}");
        // A retry would succeed at the device and prove nothing about the
        // pages the failed one lost: refused.
        let retry = store.flush().expect_err("poisoned");
        assert!(matches!(retry, StorageError::Poisoned(_)), "{retry}");
        assert!(matches!(store.append(&batch(2, 1)), Err(StorageError::Poisoned(_))));
        drop(store);
        let store = SledStore::open(dir.path(), "c", 1).unwrap();
        assert_eq!(
            store.read(0, 1, usize::MAX).unwrap(),
            vec![first],
            "what was durable is there"
        );
    }

    pub(super) fn maybe_fail_removal_step() -> Result<()> {
        REMOVAL_STEPS_BEFORE_FAILURE.with(|left| match left.get() {
            None => Ok(()),
            Some(0) => {
                left.set(None);
                Err(StorageError::Io(io::Error::other("injected failure of a removal step")))
            }
            Some(steps) => {
                left.set(Some(steps - 1));
                Ok(())
            }
        })
    }

    fn batch(base: Offset, records: usize) -> Batch {
        Batch::new(base, 1, &vec![Record::NoOp; records])
    }

    #[test]
    fn a_damaged_batch_is_never_served() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SledStore::open(dir.path(), "c", 1).unwrap();
        for base in [0, 2, 4] {
            store.append(&batch(base, 2)).unwrap();
        }
        let mut value = store.log.get(offset_key(2)).unwrap().unwrap().to_vec();
        *value.last_mut().unwrap() ^= 1;
        store.log.insert(offset_key(2), value).unwrap();

        let reader = store.reader();
        for result in [
            store.read(0, 6, usize::MAX),
            store.read(3, 4, 0),
            reader.read(0, 100, usize::MAX),
        ] {
            match result {
                Err(StorageError::Corrupt { offset: 2, reason }) => {
                    assert!(reason.contains("CRC"), "{reason}")
                }
                other => panic!("expected Corrupt at 2, got {other:?}"),
            }
        }
        assert_eq!(
            store.read(0, 2, usize::MAX).unwrap(),
            vec![batch(0, 2)],
            "reads below it still work"
        );
        assert_eq!(
            reader.read(4, 6, usize::MAX).unwrap(),
            vec![batch(4, 2)],
            "reads above it still work"
        );
    }

    /// A batch of `records` records of a sled value each: chunked.
    fn large_batch(base: Offset, records: usize) -> Batch {
        Batch::new(base, 1, &vec![Record::Data(vec![7; MAX_LOG_VALUE_BYTES]); records])
    }

    #[test]
    fn a_damaged_chunk_is_never_served() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SledStore::open(dir.path(), "c", 1).unwrap();
        for base in [0, 2, 4] {
            store.append(&large_batch(base, 2)).unwrap();
        }
        let mut value = store.log.get(chunk_key(2, 1)).unwrap().unwrap().to_vec();
        value[100] ^= 1;
        store.log.insert(chunk_key(2, 1), value).unwrap();

        let reader = store.reader();
        for result in [
            store.read(0, 6, usize::MAX),
            store.read(3, 4, 0),
            reader.read(2, 100, usize::MAX),
        ] {
            match result {
                Err(StorageError::Corrupt { offset: 2, reason }) => {
                    assert!(reason.contains("CRC"), "{reason}")
                }
                other => panic!("expected Corrupt at 2, got {other:?}"),
            }
        }
        assert_eq!(store.read(0, 2, usize::MAX).unwrap(), vec![large_batch(0, 2)]);
        assert_eq!(reader.read(5, 6, usize::MAX).unwrap(), vec![large_batch(4, 2)]);
    }

    #[test]
    fn chunked_batch_cuts_into_values_of_at_most_max_log_value_bytes() {
        for size in [
            MAX_LOG_VALUE_BYTES + 1,
            3 * MAX_LOG_VALUE_BYTES - CHUNKED_HEAD_BYTES,
            100_000,
        ] {
            let encoded: Vec<u8> = (0..size).map(|i| i as u8).collect();
            let writes = chunked_batch(5, &encoded);
            // sled::Batch does not show its writes: apply it to a tree.
            let db = sled::Config::new().temporary(true).open().unwrap();
            db.apply_batch(writes).unwrap();
            let values: Vec<(sled::IVec, sled::IVec)> = db.iter().map(|entry| entry.unwrap()).collect();
            assert!(
                values.iter().all(|(_, value)| value.len() <= MAX_LOG_VALUE_BYTES),
                "{size}"
            );
            assert_eq!(
                values.len(),
                (size + CHUNKED_HEAD_BYTES).div_ceil(MAX_LOG_VALUE_BYTES),
                "{size}"
            );
            let head = ChunkedHead::parse(&values[0].1).unwrap();
            assert_eq!(
                (head.chunks as usize, head.total_bytes),
                (values.len() - 1, size as u64)
            );
            let mut joined = values[0].1[CHUNKED_HEAD_BYTES..].to_vec();
            for (index, (key, value)) in (1..).zip(&values[1..]) {
                assert_eq!(key.as_ref(), chunk_key(5, index));
                joined.extend_from_slice(value);
            }
            assert_eq!(joined, encoded, "{size}");
        }
    }

    /// The values of `batch` as the store writes them, from a tree.
    fn stored_values(batch: &Batch) -> Vec<(sled::IVec, sled::IVec)> {
        let db = sled::Config::new().temporary(true).open().unwrap();
        db.apply_batch(chunked_batch(batch.base_offset, &encode(batch)))
            .unwrap();
        db.iter().map(|entry| entry.unwrap()).collect()
    }

    #[test]
    fn a_chunked_batch_reassembles_only_when_complete() {
        let batch = large_batch(3, 3);
        let values = stored_values(&batch);
        assert_eq!(values.len(), 4);
        let decode = |values: Vec<(sled::IVec, sled::IVec)>| StoredBatch { values }.decode();
        assert_eq!(decode(values.clone()), Ok(batch.clone()));

        let cases: Vec<(&str, Vec<(sled::IVec, sled::IVec)>)> = vec![
            ("has 2 chunk values, but its head announces 3", values[..3].to_vec()),
            (
                "lacks its chunk 2 of 3",
                vec![values[0].clone(), values[1].clone(), values[3].clone()],
            ),
            (
                "chunk 1 of the batch under offset 3 has no head value",
                values[1..].to_vec(),
            ),
            ("too short", vec![(values[0].0.clone(), values[0].1.subslice(0, 10))]),
            ("holds", {
                let mut short = values.clone();
                short[3].1 = short[3].1.subslice(0, 1);
                short
            }),
            ("more than any batch", {
                let mut head = values[0].1.to_vec();
                head[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
                vec![(values[0].0.clone(), head.into())]
            }),
            ("stored whole, yet 1 chunk values follow", {
                let whole = Batch::new(3, 1, &[Record::NoOp]);
                vec![(values[0].0.clone(), encode(&whole).into()), values[1].clone()]
            }),
        ];
        for (expected, values) in cases {
            match decode(values) {
                Err(reason) => assert!(reason.contains(expected), "{expected:?} not in {reason:?}"),
                Ok(batch) => panic!("{expected}: decoded {batch:?}"),
            }
        }
    }

    #[test]
    fn a_crafted_batch_whose_offsets_overflow_is_damage_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        drop(SledStore::open(dir.path(), "c", 1).unwrap());
        {
            // `open_sled` waits for the dropped store's lock, which sled
            // releases only when its background flusher lets go.
            let db = open_sled(&dir.path().join(SLED_SUBDIR)).unwrap();
            let crafted = Batch::new(Offset::MAX - 1, 1, &vec![Record::NoOp; 5]);
            assert!(
                !crafted.verify(),
                "a valid CRC over an impossible range still fails verify"
            );
            let log = db.open_tree(LOG_TREE).unwrap();
            log.insert(offset_key(crafted.base_offset), encode(&crafted)).unwrap();
            db.flush().unwrap();
        }
        let store = SledStore::open(dir.path(), "c", 1).unwrap();
        assert_eq!((store.start_offset(), store.end_offset()), (0, 0));
        assert!(store.log.is_empty(), "the damaged value was removed");
    }

    /// sled's segment size (its default; kraft does not change it).
    const SLED_SEGMENT_BYTES: u64 = 512 * 1024;

    /// `records` batches of 4 records of 1000 bytes, from offset `base`,
    /// appended and flushed every 50.
    fn append_kilobyte_batches(store: &mut SledStore, base: Offset, records: usize) -> Vec<Batch> {
        let written: Vec<Batch> = (0..records)
            .map(|i| {
                let value = vec![(i % 251) as u8; 1000];
                Batch::new(base + 4 * i as Offset, 1, &vec![Record::Data(value); 4])
            })
            .collect();
        for (i, b) in written.iter().enumerate() {
            store.append(b).unwrap();
            if i % 50 == 49 {
                store.flush().unwrap();
            }
        }
        store.flush().unwrap();
        written
    }

    #[test]
    fn the_data_file_is_written_with_zeros_ahead_of_the_log_and_reopens_past_them() {
        let dir = tempfile::tempdir().unwrap();
        let data_file = dir.path().join(SLED_SUBDIR).join(DATA_FILE);
        let mut store = SledStore::open(dir.path(), "c", 1).unwrap();
        // ~3.5 MB of records: several segments.
        let mut written = append_kilobyte_batches(&mut store, 0, 800);
        drop(store);

        // vendor/sled (KRAFT.md, change 4): new segments land in blocks
        // written with zeros beforehand, so the file ends in whole segments
        // of zeros rather than at the last byte sled wrote. The last fill
        // runs on a thread of its own and sled lets go of the file after
        // `drop` returns, so this waits for the fill to be seen (bounded).
        let ends_in_a_zero_segment = || {
            let bytes = std::fs::read(&data_file).unwrap();
            let len = bytes.len() as u64;
            len >= SLED_SEGMENT_BYTES
                && len.is_multiple_of(SLED_SEGMENT_BYTES)
                && bytes[(len - SLED_SEGMENT_BYTES) as usize..].iter().all(|b| *b == 0)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !ends_in_a_zero_segment() {
            assert!(
                std::time::Instant::now() < deadline,
                "the file ends in a whole segment of zeros ahead of the log"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }

        // sled reads the zeros as the end of its log, twice over.
        for round in 0..2 {
            let mut store = SledStore::open(dir.path(), "c", 1).unwrap();
            let end = store.end_offset();
            assert_eq!(end, 4 * written.len() as Offset, "round {round}");
            assert_eq!(store.read(0, end, usize::MAX).unwrap(), written, "round {round}");
            written.extend(append_kilobyte_batches(&mut store, end, 200));
        }
        let store = SledStore::open(dir.path(), "c", 1).unwrap();
        assert_eq!(store.read(0, store.end_offset(), usize::MAX).unwrap(), written);
    }

    #[test]
    fn the_blob_directory_is_listed_only_after_sled_wrote_a_blob() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SledStore::open(dir.path(), "c", 1).unwrap();
        let listed_at_open = store.blob_listings();
        assert!(listed_at_open >= 1, "the open's durability point lists the directory");
        // Batches are chunked below sled's blob size: no blob, no listing.
        append_kilobyte_batches(&mut store, 0, 200);
        assert_eq!(store.blob_listings(), listed_at_open);
        assert_eq!(store.blob_sync_count(), 0);

        // A value above a quarter of sled's segment goes to a blob file.
        let blobs_before = store.db.blobs_written();
        let scratch = store.db.open_tree("scratch").unwrap();
        scratch.insert(b"large", vec![7u8; 300 * 1024]).unwrap();
        store.flush().unwrap();
        assert!(store.db.blobs_written() > blobs_before, "sled wrote a blob");
        assert_eq!(store.blob_listings(), listed_at_open + 1);
        assert!(store.blob_sync_count() >= 1, "the blob was synced");

        // Nothing new since that listing: none at the next flush either.
        append_kilobyte_batches(&mut store, 800, 10);
        assert_eq!(store.blob_listings(), listed_at_open + 1);
        drop(scratch);
    }

    #[test]
    fn a_reset_interrupted_by_a_crash_is_completed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = SledStore::open(dir.path(), "c", 1).unwrap();
            for base in [0, 2, 4] {
                store.append(&batch(base, 2)).unwrap();
            }
            // As if reset(3, 4) had written its log start and crashed before
            // it removed a batch: the batch across 3 and the one above it
            // would otherwise pass for a log.
            store
                .write_log_start(&LogStart {
                    offset: 3,
                    epoch: 4,
                    reset_pending: true,
                })
                .unwrap();
            store.flush().unwrap();
        }
        let store = SledStore::open(dir.path(), "c", 1).unwrap();
        assert_eq!(
            (store.start_offset(), store.start_epoch(), store.end_offset()),
            (3, 4, 3)
        );
        assert!(store.epoch_cache().is_empty());
        assert!(store.log.is_empty(), "every old batch was removed");
        assert_eq!(
            load_log_start(dir.path(), &store.meta).unwrap(),
            LogStart {
                offset: 3,
                epoch: 4,
                reset_pending: false
            },
            "the mark is cleared"
        );
    }

    #[test]
    fn reset_leaves_no_pending_mark() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SledStore::open(dir.path(), "c", 1).unwrap();
        store.append(&batch(0, 2)).unwrap();
        store.reset(7, 2).unwrap();
        assert_eq!(
            load_log_start(dir.path(), &store.meta).unwrap(),
            LogStart {
                offset: 7,
                epoch: 2,
                reset_pending: false
            }
        );
        store.append(&Batch::new(7, 2, &[Record::NoOp])).unwrap();
        store.flush().unwrap();
        drop(store);
        let store = SledStore::open(dir.path(), "c", 1).unwrap();
        assert_eq!((store.start_offset(), store.end_offset()), (7, 8));
    }

    /// A log of chunked and whole batches, compacted below 5: from there
    /// batches of 3, 1, 2, 1, 3 records of a value each (stored in 2 to 4
    /// values), each followed by a whole batch of one record, then one of 2
    /// records, `[5, 22)`; and the same log in a `MemoryStore`.
    fn mixed_log(dir: &Path) -> (SledStore, crate::storage::MemoryStore) {
        let mut sled = SledStore::open(dir, "c", 1).unwrap();
        let mut memory = crate::storage::MemoryStore::new();
        let mut batches = vec![batch(0, 5)];
        for records in [3, 1, 2, 1, 3] {
            let base = batches.last().unwrap().next_offset();
            batches.push(large_batch(base, records));
            batches.push(batch(base + records as Offset, 1));
        }
        batches.push(large_batch(batches.last().unwrap().next_offset(), 2));
        for store in [&mut sled as &mut dyn LogStore, &mut memory] {
            for b in &batches {
                store.append(b).unwrap();
            }
            store.flush().unwrap();
            store.delete_before(5).unwrap();
        }
        (sled, memory)
    }

    #[test]
    fn reads_answer_as_the_memory_store_does() {
        let dir = tempfile::tempdir().unwrap();
        let (sled, memory) = mixed_log(dir.path());
        let reader = sled.reader();
        let end = memory.end_offset();
        let one = MAX_LOG_VALUE_BYTES + 100;
        for from in 0..end + 3 {
            for until in [from, from + 1, from + 4, end, end + 10] {
                for max_bytes in [0, one, 3 * one, 7 * one, usize::MAX] {
                    let expected = memory.read(from, until, max_bytes).map_err(|e| e.to_string());
                    for (who, read) in [
                        ("store", sled.read(from, until, max_bytes)),
                        ("reader", reader.read(from, until, max_bytes)),
                    ] {
                        assert_eq!(
                            read.map_err(|e| e.to_string()),
                            expected,
                            "{who}: read({from}, {until}, {max_bytes})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_read_takes_chunks_only_of_the_batches_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = mixed_log(dir.path());
        let reader = store.reader();
        let end = store.end_offset();
        let last = store.read(end - 1, end, usize::MAX).unwrap().remove(0);
        assert_eq!(last.record_count, 2, "the log ends with a chunked batch");
        for from in [end, end + 1, end + 100] {
            let reads = chunk_reads(|| assert_eq!(reader.read(from, from + 10, usize::MAX).unwrap(), vec![]));
            assert_eq!(reads, 0, "a read from {from}, at or past the log end {end}");
            let reads = chunk_reads(|| assert_eq!(store.read(from, from + 10, usize::MAX).unwrap(), vec![]));
            assert_eq!(reads, 0, "a store read from {from}");
        }
        // A read that returns the last batch takes its two chunks.
        let reads = chunk_reads(|| assert_eq!(reader.read(end - 1, end, 0).unwrap(), vec![last.clone()]));
        assert_eq!(reads, 2, "the counter counts");
        // The budget takes the batches at 5 (3 records, a head and 3 chunks)
        // and 8 (whole): the chunked one at 9 is not read.
        let first_two = store.read(5, end, usize::MAX).unwrap()[..2].to_vec();
        let budget = first_two.iter().map(Batch::size_bytes).sum();
        let reads = chunk_reads(|| assert_eq!(reader.read(5, end, budget).unwrap(), first_two));
        assert_eq!(reads, 3, "the chunks of the batch at 5 only");
    }

    /// Asserts that `result` is the refusal of a poisoned store.
    #[track_caller]
    fn assert_poisoned<T: std::fmt::Debug>(what: &str, result: Result<T>) {
        match result {
            Err(e @ StorageError::Poisoned(_)) => {
                let message = e.to_string();
                assert!(
                    message.contains("injected failure") && message.contains("reopen"),
                    "{what}: {message}"
                );
            }
            Err(e) => panic!("{what} on a poisoned store: {e}"),
            Ok(value) => panic!("{what} on a poisoned store succeeded: {value:?}"),
        }
    }

    /// Every operation of `store` and of its `reader` that can fail does.
    fn assert_store_poisoned(store: &mut SledStore, reader: &SledReader) {
        let (start, end) = (store.start_offset(), store.end_offset());
        assert_poisoned("read", store.read(start, end, usize::MAX));
        assert_poisoned("a reader's read", reader.read(start, end, usize::MAX));
        assert_poisoned("election_state", store.election_state());
        let vote = ElectionState {
            epoch: 5,
            voted_for: Some(1),
            leader_id: None,
        };
        assert_poisoned("write_election_state", store.write_election_state(&vote));
        assert_poisoned("append", store.append(&Batch::new(end, 5, &[Record::NoOp])));
        assert_poisoned("truncate", store.truncate(end));
        assert_poisoned("flush", store.flush());
        assert_poisoned("delete_before", store.delete_before(end));
        assert_poisoned("reset", store.reset(end + 100, 5));
    }

    /// A store holding 150 chunked batches of one record (two values each,
    /// so removing them all takes two steps), flushed; and the batches.
    fn store_of_150_chunked_batches(dir: &Path) -> (SledStore, Vec<Batch>) {
        let mut store = SledStore::open(dir, "c", 1).unwrap();
        let written: Vec<Batch> = (0..150).map(|base| large_batch(base, 1)).collect();
        for b in &written {
            store.append(b).unwrap();
        }
        store.flush().unwrap();
        assert_eq!(store.log.len(), 300, "a head and a chunk per batch");
        (store, written)
    }

    #[test]
    fn a_compaction_whose_removal_fails_part_way_poisons_the_store_until_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, written) = store_of_150_chunked_batches(dir.path());
        let reader = store.reader();
        // The 140 batches below 140 take two steps (256 values, then 24):
        // the first removes the batches below 128, the second fails.
        fail_removal_step_after(1);
        let error = store.delete_before(140).expect_err("the second step fails");
        assert!(error.to_string().contains("injected"), "{error}");
        assert_eq!(
            key_base(&store.log.first().unwrap().unwrap().0),
            Some(128),
            "the first step was applied"
        );
        assert_store_poisoned(&mut store, &reader);
        drop((store, reader));

        // The new log start was durable before the removals began: the open
        // removes what the failed step left below it.
        let store = SledStore::open(dir.path(), "c", 1).unwrap();
        assert_eq!(
            (store.start_offset(), store.start_epoch(), store.end_offset()),
            (140, 1, 150)
        );
        assert_eq!(store.epoch_cache(), vec![(1, 140)]);
        assert_eq!(store.read(140, 150, usize::MAX).unwrap(), written[140..]);
        assert_eq!(store.log.len(), 20, "no value below the log start is left");
    }

    #[test]
    fn a_reset_whose_removal_fails_part_way_poisons_the_store_until_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = store_of_150_chunked_batches(dir.path());
        let reader = store.reader();
        // 300 values: 256 go in the first step, the second fails.
        fail_removal_step_after(1);
        let error = store.reset(1000, 2).expect_err("the second step fails");
        assert!(error.to_string().contains("injected"), "{error}");
        assert_eq!(store.log.len(), 44, "the first step was applied");
        assert_store_poisoned(&mut store, &reader);
        drop((store, reader));

        // The pending reset was durable before the removals began: the open
        // completes it.
        let store = SledStore::open(dir.path(), "c", 1).unwrap();
        assert_eq!(
            (store.start_offset(), store.start_epoch(), store.end_offset()),
            (1000, 2, 1000)
        );
        assert!(store.epoch_cache().is_empty());
        assert!(store.log.is_empty(), "every old batch is gone");
        assert!(!load_log_start(dir.path(), &store.meta).unwrap().reset_pending);
    }

    /// sled's recovery keeps a prefix of its own log when its data file is
    /// damaged; whatever it keeps, opening never panics and never serves
    /// anything but a prefix of what was written.
    #[test]
    fn random_damage_to_the_data_file_never_panics_nor_serves_garbage() {
        let written: Vec<Batch> = (0..50).map(|base| batch(base, 1)).collect();
        for seed in 0u64..24 {
            let dir = tempfile::tempdir().unwrap();
            {
                let mut store = SledStore::open(dir.path(), "c", 1).unwrap();
                for b in &written {
                    store.append(b).unwrap();
                }
                store.flush().unwrap();
            }
            let path = dir.path().join(SLED_SUBDIR).join(DATA_FILE);
            let mut bytes = fs::read(&path).unwrap();
            let mut x = seed;
            for _ in 0..=(seed % 4) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let i = (x >> 33) as usize % bytes.len();
                bytes[i] ^= 0xff;
            }
            fs::write(&path, bytes).unwrap();
            let opened = SledStore::open(dir.path(), "c", 1);
            if let Ok(store) = opened {
                let end = store.end_offset();
                assert_eq!(
                    store.read(0, end, usize::MAX).unwrap(),
                    written[..end as usize].to_vec(),
                    "seed {seed}"
                );
            }
        }
    }
}
