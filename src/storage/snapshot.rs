//! Snapshot files (KIP-630): the state of the log up to an offset, in one
//! file of the data directory, written once and never modified.
//!
//! # Names
//!
//! A snapshot is named by its [`SnapshotId`] (exclusive end offset, epoch):
//! `<end offset, 20 digits>-<epoch, 10 digits>.checkpoint`, Kafka's layout,
//! e.g. `00000000000000001000-0000000003.checkpoint`. It is written as
//! `<name>.part`, fsynced, renamed to `<name>` and the directory fsynced, so
//! a `.checkpoint` file is always complete; a `.part` file is never read
//! (and [`remove_partial`] deletes the leftovers of a crash at startup).
//!
//! # Format (version 1)
//!
//! All integers big-endian.
//!
//! ```text
//! prefix   8  magic "KRAFTSNP"
//!          4  format version (u32) = 1
//!          8  snapshot end offset (i64)   } the id; must match the file name
//!          4  snapshot epoch (i32)        }
//! frames   repeated: 4  length N (u32, 1..=MAX_STORED_BATCH_BYTES)
//!                    N  one `Batch` in the project codec (bincode, fixint, big-endian)
//!          first frame: header batch = one Record::SnapshotHeader
//!          then the data batches, in the order written
//!          last frame: footer batch = one Record::SnapshotFooter
//! trailer  8  length of the whole file in bytes, trailer included (u64)
//!          4  CRC32C of every byte before this field (prefix, frames, length)
//!          4  end magic "KSNE"
//! ```
//!
//! Every batch also carries its own CRC32C ([`Batch::verify`]), so damage
//! is located at the batch it hit; the whole-file CRC covers every byte,
//! including those no batch CRC does (prefix, frame lengths, trailer
//! length), and the trailer
//! length catches truncation and extension. A CRC32C detects every error
//! burst of up to 32 bits, so any single damaged byte is always detected.
//!
//! Control batches (header, footer) have base offset 0 and the snapshot's
//! epoch; the header and footer records have `version` [`SNAPSHOT_RECORD_VERSION`].
//!
//! Data batches carry the base offset and epoch the writer passed to
//! [`SnapshotWriter::append`]: the offset of the first log record the batch
//! stands for when the state machine knows it (then the snapshot's records
//! keep their original offsets), or any offset the state machine picks. The
//! format only requires `0 <= base_offset < end_offset`, base offsets that
//! never decrease from one data batch to the next, and `0 <= epoch <=` the
//! snapshot epoch; it does not require a batch's last offset to be below the
//! end offset (a snapshot may hold more records than the log prefix it
//! replaces). Data batches never contain a snapshot header or footer.
//!
//! # Validation
//!
//! [`SnapshotReader::open`] (and [`SnapshotInstaller::finish`]) read the
//! whole file before anything is served: magic, version, trailer, every
//! frame and batch CRC, every batch's records, the header-first and
//! footer-last structure, the rules above, the whole-file CRC, and that the
//! id in the file is the one in its name. Any failure is a
//! [`SnapshotError::Corrupt`] naming the file and what is wrong (with the
//! byte position where there is one). No input makes the reader panic, and
//! memory use is bounded by one frame ([`MAX_FRAME_BYTES`]) and its records.
//! The same pass samples a seek index (a data batch at most every
//! [`SEEK_INDEX_INTERVAL_BYTES`] of file), so that a reader can start near
//! any offset ([`SnapshotReader::seek`]) without another pass.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::MAX_STORED_BATCH_BYTES;
use crate::messages::codec::{decode_bounded, encode};
use crate::messages::{Batch, Record, SnapshotId, MAX_BATCH_BYTES};
use crate::raft::{Epoch, Offset};

/// First bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"KRAFTSNP";
/// Last bytes of every complete snapshot file.
pub const END_MAGIC: [u8; 4] = *b"KSNE";
/// The format this module writes and the only one it reads.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;
/// `version` of the SnapshotHeader and SnapshotFooter records written (and
/// the only one read), Kafka's current version of both.
pub const SNAPSHOT_RECORD_VERSION: u16 = 0;
/// Suffix of a complete snapshot.
pub const SNAPSHOT_SUFFIX: &str = ".checkpoint";
/// Suffix of a snapshot being written or received.
pub const PARTIAL_SUFFIX: &str = ".checkpoint.part";
/// Largest chunk [`SnapshotReader::read_chunk`] returns (8 MiB, Kafka's).
pub const MAX_CHUNK_BYTES: usize = MAX_BATCH_BYTES;
/// Bytes before the first frame: magic, version, id.
pub const PREFIX_BYTES: u64 = 24;
/// Bytes after the last frame: length, CRC, end magic.
pub const TRAILER_BYTES: u64 = 16;
/// Largest frame (one encoded batch), the same limit the log applies.
pub const MAX_FRAME_BYTES: usize = MAX_STORED_BATCH_BYTES;

/// Most bytes of file between two entries of a reader's seek index
/// ([`SnapshotReader::seek`]): a seek reads at most about this much before
/// the batch it looks for, and the index of a 1 GiB file has 16 Ki entries.
pub const SEEK_INDEX_INTERVAL_BYTES: u64 = 64 * 1024;

/// Length prefix of a frame.
const FRAME_HEADER_BYTES: u64 = 4;
/// Read buffer for validation and iteration.
const READ_BUFFER_BYTES: usize = 1 << 20;
/// Write buffer of a [`SnapshotWriter`].
const WRITE_BUFFER_BYTES: usize = 1 << 20;
/// A [`SnapshotWriter`] hands every this many bytes to the disk as it goes
/// (see [`Writeback`]).
const WRITEBACK_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// An I/O operation on a snapshot file or the directory failed.
    #[error("snapshot {file}: cannot {op}: {source}")]
    Io {
        /// Path of the file or directory.
        file: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// The file is damaged, truncated, or not a valid snapshot: it is never
    /// loaded nor served as valid.
    #[error("snapshot {file}: {reason}")]
    Corrupt {
        /// Name of the file (the `.part` name for a received snapshot).
        file: String,
        reason: String,
    },
    /// The caller broke this module's contract (bad id, out-of-range
    /// offset, chunk out of order...). Nothing was written.
    #[error("snapshot {file}: {reason}")]
    Invalid { file: String, reason: String },
}

impl SnapshotError {
    /// True when the bytes of a file (or of a transfer) were found damaged
    /// or invalid.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, SnapshotError::Corrupt { .. })
    }
}

pub type Result<T> = std::result::Result<T, SnapshotError>;

/// A complete snapshot on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub id: SnapshotId,
    pub size_bytes: u64,
    /// The `.checkpoint` file.
    pub path: PathBuf,
}

// ---------------------------------------------------------------------------
// Names and directory helpers
// ---------------------------------------------------------------------------

/// `<end offset, 20 digits>-<epoch, 10 digits>.checkpoint`.
pub fn file_name(id: SnapshotId) -> String {
    format!("{:020}-{:010}{SNAPSHOT_SUFFIX}", id.end_offset, id.epoch)
}

/// The id of a `.checkpoint` file name, `None` for any other name
/// (including `.part` files and ids with the wrong number of digits).
pub fn parse_name(name: &str) -> Option<SnapshotId> {
    let stem = name.strip_suffix(SNAPSHOT_SUFFIX)?;
    let (offset, epoch) = stem.split_once('-')?;
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(offset, 20) || !digits(epoch, 10) {
        return None;
    }
    Some(SnapshotId {
        end_offset: offset.parse().ok()?,
        epoch: epoch.parse().ok()?,
    })
}

/// Whether a file named `name`, in a directory that holds snapshots, is
/// meant to be one: it ends in `.checkpoint` and is not the store's own
/// checkpoint file, which shares the data directory (and the suffix, as
/// Kafka's `quorum-state` neighbours its snapshots).
fn looks_like_a_snapshot(name: &str) -> bool {
    name.ends_with(SNAPSHOT_SUFFIX) && name != super::sled_store::CHECKPOINT_FILE
}

/// Path of the snapshot `id` in `dir`.
pub fn path_of(dir: &Path, id: SnapshotId) -> PathBuf {
    dir.join(file_name(id))
}

/// Ids of the `.checkpoint` files in `dir`, ascending (by end offset, then
/// epoch). `.part` files and unrelated files are ignored; a `.checkpoint`
/// whose name is malformed is ignored with a warning. Nothing is validated.
pub fn list(dir: &Path) -> Result<Vec<SnapshotId>> {
    let entries = fs::read_dir(dir).map_err(|e| io_error(dir, "list the directory", e))?;
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error(dir, "list the directory", e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if !looks_like_a_snapshot(name) {
            continue;
        }
        match parse_name(name) {
            Some(id) => {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    tracing::warn!(dir = %dir.display(), name, "ignoring a directory named like a snapshot");
                    continue;
                }
                ids.push(id);
            }
            None => tracing::warn!(
                dir = %dir.display(),
                name,
                "ignoring a .checkpoint file whose name is not <20-digit offset>-<10-digit epoch>.checkpoint"
            ),
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Snapshots passed over because they did not validate, newest first, with
/// the reason (the error's message).
pub type Skipped = Vec<(SnapshotId, String)>;

/// What [`scan`] found: the newest snapshot that validates, and the newer
/// ones that did not, newest first, with the reason.
#[derive(Debug)]
pub struct SnapshotScan {
    pub newest: Option<SnapshotReader>,
    pub skipped: Skipped,
}

/// Opens the snapshots of `dir` from the newest down and stops at the first
/// one that validates. Every one passed over (damaged, or unreadable: any
/// error of [`SnapshotReader::open`]) is logged and listed in `skipped`,
/// also when none validates; nothing is deleted. Only listing the directory
/// can fail the whole scan.
pub fn scan(dir: &Path) -> Result<SnapshotScan> {
    let mut skipped = Vec::new();
    for id in list(dir)?.into_iter().rev() {
        match SnapshotReader::open(&path_of(dir, id)) {
            Ok(reader) => {
                return Ok(SnapshotScan {
                    newest: Some(reader),
                    skipped,
                })
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "skipping a snapshot that does not validate");
                skipped.push((id, e.to_string()));
            }
        }
    }
    Ok(SnapshotScan { newest: None, skipped })
}

/// The newest snapshot of `dir` that validates, with the newer damaged ones
/// skipped (newest first, with the reason). `None` when no snapshot
/// validates: the damaged ones are then only logged; use [`scan`] to get
/// them too. A caller falling back to the log must check that the log
/// starts at 0, since a damaged snapshot may have stood for its prefix.
/// Never deletes anything.
pub fn newest_valid(dir: &Path) -> Result<Option<(SnapshotReader, Skipped)>> {
    let scan = scan(dir)?;
    Ok(scan.newest.map(|reader| (reader, scan.skipped)))
}

/// Deletes every `.checkpoint.part` file in `dir` (what a crash left while
/// writing or receiving a snapshot) and returns how many. Call at startup,
/// before any writer or installer exists.
pub fn remove_partial(dir: &Path) -> Result<usize> {
    let entries = fs::read_dir(dir).map_err(|e| io_error(dir, "list the directory", e))?;
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(|e| io_error(dir, "list the directory", e))?;
        let name = entry.file_name();
        if !name.to_str().is_some_and(|n| n.ends_with(PARTIAL_SUFFIX)) {
            continue;
        }
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            continue;
        }
        let path = entry.path();
        match fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(file = %path.display(), "removed a partial snapshot");
                removed += 1;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(&path, "remove the partial snapshot", e)),
        }
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    Ok(removed)
}

/// Deletes the snapshot `id` from `dir` (durably: the directory is fsynced).
/// Returns false when there was no such file. A reader already open on it
/// keeps working.
pub fn delete(dir: &Path, id: SnapshotId) -> Result<bool> {
    let path = path_of(dir, id);
    match fs::remove_file(&path) {
        Ok(()) => {
            sync_dir(dir)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error(&path, "delete", e)),
    }
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

/// Writes a new snapshot: [`create`](Self::create), any number of
/// [`append`](Self::append), then [`freeze`](Self::freeze). Until frozen
/// only `<name>.part` exists; dropping an unfrozen writer removes it.
#[derive(Debug)]
pub struct SnapshotWriter {
    dir: PathBuf,
    id: SnapshotId,
    part_path: PathBuf,
    /// `None` once freeze took it.
    out: Option<BufWriter<File>>,
    /// CRC32C of every byte written so far.
    crc: u32,
    /// Bytes written so far.
    written: u64,
    /// Base offset of the last data batch.
    last_base_offset: Option<Offset>,
    batch_count: u64,
    record_count: u64,
    /// A write failed: the file is in an unknown state and cannot be frozen.
    failed: bool,
    /// The `.part` file was renamed: nothing to clean up on drop.
    renamed: bool,
    writeback: Writeback,
}

/// Writes a large file back to the disk while it is written, at the disk's
/// pace, instead of leaving it all to the final `fdatasync` (RocksDB's
/// `bytes_per_sync` does the same).
///
/// A snapshot is tens of MiB written at memory speed. Left in the page
/// cache, it went to the disk in one burst at `freeze` (or whenever the
/// kernel's background writeback started), and every commit's `fdatasync`
/// meanwhile, on any node sharing the disk, queued behind it: snapshots
/// took kraft's p999 at 64 and 256 clients from 5-15 ms to 12-25 ms
/// (BENCHMARKS.md). Every [`WRITEBACK_BYTES`] that reach the file, the
/// writer starts their writeback (`sync_file_range(WRITE)`, which does not
/// wait) and waits for the chunk before them, so at most about two chunks
/// are on their way to the disk at any time and the writer goes no faster
/// than the disk. This is not a durability point: `freeze` still ends in
/// `fdatasync`.
#[derive(Debug, Default)]
struct Writeback {
    /// Writeback was started for `[0, started)`.
    started: u64,
    /// `[0, waited)` was written back and waited for.
    waited: u64,
}

impl Writeback {
    /// With `in_file` bytes handed to the file so far: the range whose
    /// writeback to start and the range to wait for, once a whole
    /// [`WRITEBACK_BYTES`] has reached the file since the last step.
    fn next(&mut self, in_file: u64) -> Option<(std::ops::Range<u64>, std::ops::Range<u64>)> {
        if in_file < self.started + WRITEBACK_BYTES {
            return None;
        }
        let start = self.started..in_file;
        let wait = self.waited..self.started;
        self.waited = self.started;
        self.started = in_file;
        Some((start, wait))
    }

    /// Starts the writeback of `start` and waits for that of `wait`. An
    /// error is the file's: `sync_file_range` that waits consumes a
    /// writeback error that a later `fdatasync` would then not report.
    #[cfg(target_os = "linux")]
    fn run(file: &File, start: std::ops::Range<u64>, wait: std::ops::Range<u64>) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let range = |fd, r: std::ops::Range<u64>, flags| {
            if r.is_empty() {
                return Ok(());
            }
            let (Ok(offset), Ok(len)) = (i64::try_from(r.start), i64::try_from(r.end - r.start)) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("snapshot file range {r:?} is beyond what sync_file_range takes"),
                ));
            };
            // SAFETY: a plain system call on an open descriptor; it reads
            // or writes no memory of ours.
            match unsafe { libc::sync_file_range(fd, offset, len, flags) } {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            }
        };
        let fd = file.as_raw_fd();
        range(fd, start, libc::SYNC_FILE_RANGE_WRITE)?;
        range(
            fd,
            wait,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        )
    }

    #[cfg(not(target_os = "linux"))]
    fn run(_file: &File, _start: std::ops::Range<u64>, _wait: std::ops::Range<u64>) -> io::Result<()> {
        Ok(())
    }
}

impl SnapshotWriter {
    /// Creates `<dir>/<file_name(id)>.part` and writes the prefix and the
    /// header batch. Fails if that `.part` file exists already (another
    /// writer or installer of the same id, or a crash leftover that
    /// [`remove_partial`] clears). A `.checkpoint` of the same id, if any, is
    /// replaced atomically at [`freeze`](Self::freeze).
    pub fn create(dir: &Path, id: SnapshotId, last_contained_timestamp_ms: i64) -> Result<SnapshotWriter> {
        check_id(id)?;
        let part_path = dir.join(format!("{}.part", file_name(id)));
        let file = create_part(&part_path)?;
        let mut writer = SnapshotWriter {
            dir: dir.to_path_buf(),
            id,
            part_path,
            out: Some(BufWriter::with_capacity(WRITE_BUFFER_BYTES, file)),
            crc: 0,
            written: 0,
            last_base_offset: None,
            batch_count: 0,
            record_count: 0,
            failed: false,
            renamed: false,
            writeback: Writeback::default(),
        };
        // On an error the writer is dropped, which removes the file.
        writer.write(&prefix(id))?;
        let header = Record::SnapshotHeader {
            version: SNAPSHOT_RECORD_VERSION,
            last_contained_timestamp_ms,
        };
        writer.write_frame(&encode(&Batch::new(0, id.epoch, &[header])))?;
        Ok(writer)
    }

    pub fn id(&self) -> SnapshotId {
        self.id
    }

    /// The `.part` file being written.
    pub fn part_path(&self) -> &Path {
        &self.part_path
    }

    /// Bytes written so far (the frozen file adds the footer and trailer).
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Data batches appended so far.
    pub fn batch_count(&self) -> u64 {
        self.batch_count
    }

    /// Data records appended so far.
    pub fn record_count(&self) -> u64 {
        self.record_count
    }

    /// Appends `records` as one batch at `base_offset` in `epoch`.
    ///
    /// Refused (with [`SnapshotError::Invalid`], nothing written) unless:
    /// `records` is not empty and holds no SnapshotHeader/SnapshotFooter;
    /// `0 <= base_offset < id.end_offset` and not below the previous batch's
    /// base offset; `0 <= epoch <= id.epoch`; the encoded batch is at most
    /// [`MAX_FRAME_BYTES`]. After an I/O error the writer refuses
    /// everything; drop it.
    pub fn append(&mut self, base_offset: Offset, epoch: Epoch, records: &[Record]) -> Result<()> {
        self.check_records(base_offset, epoch, records)?;
        self.write_batch(&Batch::new(base_offset, epoch, records), records.len())
    }

    /// Appends a batch as it is (a log batch copied into a snapshot): the
    /// same rules as [`Self::append`], checked on its records, without
    /// encoding them again. A batch whose CRC does not match, or whose
    /// records do not decode, is refused.
    pub fn append_batch(&mut self, batch: &Batch) -> Result<()> {
        if !batch.verify() {
            return Err(self.invalid(format!(
                "append refused: the batch at {} fails its CRC",
                batch.base_offset
            )));
        }
        let records = batch
            .records()
            .map_err(|e| self.invalid(format!("append refused: batch at {}: {e}", batch.base_offset)))?;
        self.check_records(batch.base_offset, batch.epoch, &records)?;
        self.write_batch(batch, records.len())
    }

    fn check_records(&self, base_offset: Offset, epoch: Epoch, records: &[Record]) -> Result<()> {
        self.check_usable()?;
        if let Err(reason) = check_data_batch(self.id, self.last_base_offset, base_offset, epoch, records.len()) {
            return Err(self.invalid(format!("append refused: {reason}")));
        }
        if let Some(i) = records
            .iter()
            .position(|r| matches!(r, Record::SnapshotHeader { .. } | Record::SnapshotFooter { .. }))
        {
            return Err(self.invalid(format!(
                "append refused: record {i} is a {}, which only the writer itself places",
                records[i].kind()
            )));
        }
        Ok(())
    }

    fn write_batch(&mut self, batch: &Batch, record_count: usize) -> Result<()> {
        let frame = encode(batch);
        if frame.len() > MAX_FRAME_BYTES {
            return Err(self.invalid(format!(
                "append refused: a batch of {record_count} records encodes to {} bytes, above the limit of {MAX_FRAME_BYTES}",
                frame.len()
            )));
        }
        self.write_frame(&frame)?;
        self.last_base_offset = Some(batch.base_offset);
        self.batch_count += 1;
        self.record_count += record_count as u64;
        Ok(())
    }

    /// Writes the footer and trailer, `fdatasync`s the file, renames it to
    /// `<name>` (atomically replacing a snapshot of the same id) and fsyncs
    /// the directory. On any error the `.part` file is removed.
    pub fn freeze(mut self) -> Result<SnapshotMeta> {
        self.check_usable()?;
        let footer = Record::SnapshotFooter {
            version: SNAPSHOT_RECORD_VERSION,
        };
        self.write_frame(&encode(&Batch::new(0, self.id.epoch, &[footer])))?;
        let size_bytes = self.written + TRAILER_BYTES;
        self.write(&size_bytes.to_be_bytes())?;
        let crc = self.crc;
        self.write(&crc.to_be_bytes())?;
        self.write(&END_MAGIC)?;
        let out = self.out.take().expect("checked by check_usable");
        let file = out
            .into_inner()
            .map_err(|e| io_error(&self.part_path, "write", e.into_error()))?;
        file.sync_data()
            .map_err(|e| io_error(&self.part_path, "fdatasync", e))?;
        drop(file);
        let path = path_of(&self.dir, self.id);
        fs::rename(&self.part_path, &path).map_err(|e| io_error(&self.part_path, "rename into place", e))?;
        self.renamed = true;
        sync_dir(&self.dir)?;
        Ok(SnapshotMeta {
            id: self.id,
            size_bytes,
            path,
        })
    }

    fn check_usable(&self) -> Result<()> {
        if self.failed || self.out.is_none() {
            return Err(self.invalid("an earlier write failed; this snapshot cannot be completed".to_string()));
        }
        Ok(())
    }

    fn write_frame(&mut self, frame: &[u8]) -> Result<()> {
        let len = u32::try_from(frame.len()).expect("frames are checked against MAX_FRAME_BYTES");
        self.write(&len.to_be_bytes())?;
        self.write(frame)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let out = self.out.as_mut().expect("checked by callers");
        if let Err(e) = out.write_all(bytes) {
            self.failed = true;
            return Err(io_error(&self.part_path, "write", e));
        }
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.written += bytes.len() as u64;
        let in_file = self.written - out.buffer().len() as u64;
        if let Some((start, wait)) = self.writeback.next(in_file) {
            if let Err(e) = Writeback::run(out.get_ref(), start, wait) {
                self.failed = true;
                return Err(io_error(&self.part_path, "write back", e));
            }
        }
        Ok(())
    }

    /// Bytes whose writeback this writer started before `freeze` (every
    /// MiB is handed to the disk as it is written).
    pub fn writeback_started(&self) -> u64 {
        self.writeback.started
    }

    fn invalid(&self, reason: String) -> SnapshotError {
        SnapshotError::Invalid {
            file: display_name(&self.part_path),
            reason,
        }
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        if self.renamed {
            return;
        }
        if let Some(out) = self.out.take() {
            // Discard the buffer: the file is about to go.
            let _ = out.into_parts();
        }
        remove_abandoned(&self.part_path);
    }
}

// ---------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------

/// A snapshot file that validated completely at [`open`](Self::open).
///
/// Reads use positioned I/O on the file opened then, so several iterators
/// and [`read_chunk`](Self::read_chunk) may run at once, and a reader keeps
/// working after its file is deleted.
#[derive(Debug)]
pub struct SnapshotReader {
    path: PathBuf,
    file: File,
    layout: Layout,
}

impl SnapshotReader {
    /// Opens and validates the whole file (see the module documentation);
    /// its name must be a snapshot name whose id matches the content.
    pub fn open(path: &Path) -> Result<SnapshotReader> {
        let name = display_name(path);
        let Some(id) = path.file_name().and_then(|n| n.to_str()).and_then(parse_name) else {
            return Err(SnapshotError::Invalid {
                file: name,
                reason: "is not a snapshot file name (<20-digit offset>-<10-digit epoch>.checkpoint)".to_string(),
            });
        };
        let file = File::open(path).map_err(|e| io_error(path, "open", e))?;
        let layout = validate(&file, path, id)?;
        Ok(SnapshotReader {
            path: path.to_path_buf(),
            file,
            layout,
        })
    }

    pub fn id(&self) -> SnapshotId {
        self.layout.id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The timestamp the header record carries.
    pub fn last_contained_timestamp_ms(&self) -> i64 {
        self.layout.last_contained_timestamp_ms
    }

    /// Size of the whole file (what a FetchSnapshot response calls `size`).
    pub fn size_bytes(&self) -> u64 {
        self.layout.size_bytes
    }

    /// Number of data batches (header and footer not counted).
    pub fn batch_count(&self) -> u64 {
        self.layout.batch_count
    }

    /// Number of data records (header and footer not counted).
    pub fn record_count(&self) -> u64 {
        self.layout.record_count
    }

    pub fn meta(&self) -> SnapshotMeta {
        SnapshotMeta {
            id: self.id(),
            size_bytes: self.size_bytes(),
            path: self.path.clone(),
        }
    }

    /// The data batches, in file order (without the header and footer
    /// batches). Each batch's CRC is checked again as it is read, so a file
    /// damaged after `open` yields an error, never a wrong batch; the
    /// iterator ends after the first error.
    pub fn batches(&self) -> Batches<'_> {
        self.batches_from(BatchCursor {
            pos: self.layout.data_start,
            remaining: self.layout.batch_count,
        })
    }

    /// The data batches from where an earlier iterator over this reader
    /// stood ([`Batches::cursor`]), for reads that resume sequentially.
    pub fn batches_from(&self, cursor: BatchCursor) -> Batches<'_> {
        let pos = cursor.pos.clamp(self.layout.data_start, self.layout.data_end);
        Batches {
            name: display_name(&self.path),
            input: BufReader::with_capacity(
                READ_BUFFER_BYTES,
                PositionedReader {
                    file: &self.file,
                    pos,
                    end: self.layout.data_end,
                },
            ),
            pos,
            end: self.layout.data_end,
            remaining: if pos == cursor.pos { cursor.remaining } else { 0 },
            frame: Vec::new(),
        }
    }

    /// The data records of every data batch, in order.
    pub fn records(&self) -> Records<'_> {
        Records {
            batches: self.batches(),
            current: Vec::new().into_iter(),
            failed: false,
        }
    }

    /// Where to start reading the data batches to find `offset`, without
    /// reading the file: the cursor at a batch whose base offset is below
    /// `offset` (or at the first data batch), with that base offset. From
    /// there, the batch holding `offset` (if any) is reached after at most
    /// about [`SEEK_INDEX_INTERVAL_BYTES`] of file, plus a batch. The index
    /// it uses was sampled while `open` validated the file.
    pub fn seek(&self, offset: Offset) -> (BatchCursor, Offset) {
        let index = &self.layout.seek_index;
        // The last sample strictly below `offset`: batches may share a base
        // offset, and the first of those must not be skipped.
        let at = index.partition_point(|s| s.base_offset < offset).saturating_sub(1);
        match index.get(at) {
            Some(sample) => (
                BatchCursor {
                    pos: sample.pos,
                    remaining: self.layout.batch_count - sample.ordinal,
                },
                sample.base_offset,
            ),
            None => (self.batches().cursor(), 0),
        }
    }

    /// Up to `max_bytes` (at most [`MAX_CHUNK_BYTES`]) of the file from
    /// `position`, for a FetchSnapshot response; empty at the end. A
    /// position past the end is refused.
    pub fn read_chunk(&self, position: u64, max_bytes: usize) -> Result<Vec<u8>> {
        let size = self.layout.size_bytes;
        if position > size {
            return Err(SnapshotError::Invalid {
                file: display_name(&self.path),
                reason: format!("read at byte {position}, past the end of the snapshot ({size} bytes)"),
            });
        }
        let len = (size - position).min(max_bytes.min(MAX_CHUNK_BYTES) as u64) as usize;
        let mut bytes = vec![0; len];
        self.file
            .read_exact_at(&mut bytes, position)
            .map_err(|e| io_error(&self.path, "read", e))?;
        Ok(bytes)
    }
}

/// Where a [`Batches`] iterator stands: resume there with
/// [`SnapshotReader::batches_from`] on the same reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchCursor {
    pos: u64,
    remaining: u64,
}

/// Iterator over the data batches of a [`SnapshotReader`].
pub struct Batches<'a> {
    name: String,
    input: BufReader<PositionedReader<'a>>,
    /// File position of the next frame.
    pos: u64,
    /// File position of the footer frame.
    end: u64,
    remaining: u64,
    frame: Vec<u8>,
}

impl fmt::Debug for Batches<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batches")
            .field("file", &self.name)
            .field("pos", &self.pos)
            .field("remaining", &self.remaining)
            .finish()
    }
}

impl BatchCursor {
    /// The file position of the batch it stands at.
    pub fn position(&self) -> u64 {
        self.pos
    }
}

impl Batches<'_> {
    /// Where the next batch starts.
    pub fn cursor(&self) -> BatchCursor {
        BatchCursor {
            pos: self.pos,
            remaining: self.remaining,
        }
    }

    fn read_next(&mut self) -> Result<Batch> {
        let at = self.pos;
        let changed = |what: String| SnapshotError::Corrupt {
            file: self.name.clone(),
            reason: format!("{what} (the file changed after it was validated)"),
        };
        let io = |e: io::Error| SnapshotError::Io {
            file: self.name.clone(),
            op: "read",
            source: e,
        };
        let mut len = [0u8; 4];
        self.input.read_exact(&mut len).map_err(io)?;
        let len = u32::from_be_bytes(len) as u64;
        if len > MAX_FRAME_BYTES as u64 || len > self.end.saturating_sub(at + FRAME_HEADER_BYTES) {
            return Err(changed(format!("frame at byte {at} claims {len} bytes")));
        }
        self.frame.resize(len as usize, 0);
        self.input.read_exact(&mut self.frame).map_err(io)?;
        let batch: Batch = decode_bounded(&self.frame, MAX_FRAME_BYTES as u64)
            .map_err(|e| changed(format!("batch at byte {at} does not decode: {e}")))?;
        if !batch.verify() {
            return Err(changed(format!("checksum mismatch in the batch at byte {at}")));
        }
        self.pos = at + FRAME_HEADER_BYTES + len;
        Ok(batch)
    }
}

impl Iterator for Batches<'_> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.remaining == 0 {
            return None;
        }
        let next = self.read_next();
        self.remaining = if next.is_ok() { self.remaining - 1 } else { 0 };
        Some(next)
    }
}

/// Iterator over the data records of a [`SnapshotReader`].
#[derive(Debug)]
pub struct Records<'a> {
    batches: Batches<'a>,
    current: std::vec::IntoIter<Record>,
    failed: bool,
}

impl Iterator for Records<'_> {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        loop {
            if let Some(record) = self.current.next() {
                return Some(Ok(record));
            }
            if self.failed {
                return None;
            }
            let batch = match self.batches.next()? {
                Ok(batch) => batch,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            };
            match batch.records() {
                Ok(records) => self.current = records.into_iter(),
                Err(e) => {
                    self.failed = true;
                    return Some(Err(SnapshotError::Corrupt {
                        file: self.batches.name.clone(),
                        reason: format!(
                            "records of the batch at offset {} do not decode: {e} (the file changed after it was \
                             validated)",
                            batch.base_offset
                        ),
                    }));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Installer
// ---------------------------------------------------------------------------

/// Receives a snapshot in chunks (FetchSnapshot) into `<name>.part` and
/// installs it only once the complete file validates. Dropping an
/// unfinished installer removes the `.part` file.
#[derive(Debug)]
pub struct SnapshotInstaller {
    dir: PathBuf,
    id: SnapshotId,
    part_path: PathBuf,
    file: File,
    total_size: u64,
    /// Bytes received so far: `[0, position)` is written.
    position: u64,
    renamed: bool,
}

impl SnapshotInstaller {
    /// Starts receiving snapshot `id` of `total_size` bytes (the `size` of
    /// the FetchSnapshot responses). Fails if `<name>.part` exists already
    /// (see [`SnapshotWriter::create`]).
    pub fn create(dir: &Path, id: SnapshotId, total_size: u64) -> Result<SnapshotInstaller> {
        check_id(id)?;
        let part_path = dir.join(format!("{}.part", file_name(id)));
        if total_size < MIN_FILE_BYTES {
            return Err(SnapshotError::Invalid {
                file: display_name(&part_path),
                reason: format!("a snapshot of {total_size} bytes cannot be valid (at least {MIN_FILE_BYTES})"),
            });
        }
        let file = create_part(&part_path)?;
        Ok(SnapshotInstaller {
            dir: dir.to_path_buf(),
            id,
            part_path,
            file,
            total_size,
            position: 0,
            renamed: false,
        })
    }

    pub fn id(&self) -> SnapshotId {
        self.id
    }

    pub fn total_size(&self) -> u64 {
        self.total_size
    }

    /// Bytes received so far: the position to ask for next.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// True once every byte has been received.
    pub fn is_complete(&self) -> bool {
        self.position == self.total_size
    }

    /// Writes the chunk of the snapshot that starts at `position`.
    ///
    /// Chunks must come in order: `position` may not be past
    /// [`position()`](Self::position) (a gap is [`SnapshotError::Invalid`]).
    /// Bytes at positions already received (a re-sent or overlapping chunk)
    /// must equal what was received ([`SnapshotError::Corrupt`] otherwise:
    /// the transfer is inconsistent, start it again) and are not written
    /// again; the rest is appended. A chunk running past `total_size` is
    /// refused.
    pub fn write_chunk(&mut self, position: u64, bytes: &[u8]) -> Result<()> {
        let end = position.checked_add(bytes.len() as u64);
        if end.is_none_or(|end| end > self.total_size) {
            return Err(self.invalid(format!(
                "chunk of {} bytes at byte {position} runs past the snapshot size of {} bytes",
                bytes.len(),
                self.total_size
            )));
        }
        if position > self.position {
            return Err(self.invalid(format!(
                "chunk at byte {position} leaves a gap: only {} bytes have been received",
                self.position
            )));
        }
        let overlap = (self.position - position).min(bytes.len() as u64) as usize;
        if overlap > 0 {
            let mut existing = vec![0; overlap];
            self.file
                .read_exact_at(&mut existing, position)
                .map_err(|e| io_error(&self.part_path, "read back", e))?;
            if let Some(i) = existing.iter().zip(bytes).position(|(a, b)| a != b) {
                return Err(SnapshotError::Corrupt {
                    file: display_name(&self.part_path),
                    reason: format!(
                        "chunk at byte {position} differs from the bytes already received at byte {}",
                        position + i as u64
                    ),
                });
            }
        }
        let new = &bytes[overlap..];
        if !new.is_empty() {
            self.file
                .write_all_at(new, self.position)
                .map_err(|e| io_error(&self.part_path, "write", e))?;
            self.position += new.len() as u64;
        }
        Ok(())
    }

    /// Checks the complete file exactly as [`SnapshotReader::open`] does
    /// (and that it is snapshot `id`), `fdatasync`s it, renames it to
    /// `<name>` (atomically replacing one of the same id) and fsyncs the
    /// directory. On any error the `.part` file is removed and nothing is
    /// installed.
    pub fn finish(mut self) -> Result<SnapshotMeta> {
        if self.position != self.total_size {
            return Err(self.invalid(format!(
                "incomplete: {} of {} bytes received",
                self.position, self.total_size
            )));
        }
        self.file
            .sync_data()
            .map_err(|e| io_error(&self.part_path, "fdatasync", e))?;
        let layout = validate(&self.file, &self.part_path, self.id)?;
        let path = path_of(&self.dir, self.id);
        fs::rename(&self.part_path, &path).map_err(|e| io_error(&self.part_path, "rename into place", e))?;
        self.renamed = true;
        sync_dir(&self.dir)?;
        Ok(SnapshotMeta {
            id: self.id,
            size_bytes: layout.size_bytes,
            path,
        })
    }

    fn invalid(&self, reason: String) -> SnapshotError {
        SnapshotError::Invalid {
            file: display_name(&self.part_path),
            reason,
        }
    }
}

impl Drop for SnapshotInstaller {
    fn drop(&mut self) {
        if !self.renamed {
            remove_abandoned(&self.part_path);
        }
    }
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

/// Size of a snapshot without data batches, the smallest valid file:
/// prefix, header and footer frames, trailer.
pub const MIN_FILE_BYTES: u64 = PREFIX_BYTES
    + 2 * (FRAME_HEADER_BYTES + CONTROL_BATCH_BYTES)
    + HEADER_RECORD_BYTES
    + FOOTER_RECORD_BYTES
    + TRAILER_BYTES;
/// An encoded control batch without its record: base offset, epoch, count,
/// CRC, payload length (8 + 4 + 4 + 4 + 8), and the payload's vector length
/// (8).
const CONTROL_BATCH_BYTES: u64 = 28 + 8;
/// Encoded SnapshotHeader and SnapshotFooter records.
const HEADER_RECORD_BYTES: u64 = 14;
const FOOTER_RECORD_BYTES: u64 = 6;

/// What validation learned about a file.
#[derive(Clone, Debug)]
struct Layout {
    id: SnapshotId,
    last_contained_timestamp_ms: i64,
    /// Position of the first data frame (right after the header frame).
    data_start: u64,
    /// Position of the footer frame.
    data_end: u64,
    batch_count: u64,
    record_count: u64,
    size_bytes: u64,
    /// Data batches sampled at most every [`SEEK_INDEX_INTERVAL_BYTES`] of
    /// file, the first one always; ascending in position.
    seek_index: Vec<SeekSample>,
}

/// A data batch in a [`Layout`]'s seek index.
#[derive(Clone, Copy, Debug)]
struct SeekSample {
    base_offset: Offset,
    /// File position of its frame.
    pos: u64,
    /// Data batches before it.
    ordinal: u64,
}

/// Reads and checks the whole file; `expected` is the id its name says.
fn validate(file: &File, path: &Path, expected: SnapshotId) -> Result<Layout> {
    let name = display_name(path);
    let corrupt = |reason: String| SnapshotError::Corrupt {
        file: name.clone(),
        reason,
    };
    let io = |op: &'static str| move |e: io::Error| io_error(path, op, e);

    let size = file.metadata().map_err(io("stat"))?.len();
    if size < MIN_FILE_BYTES {
        return Err(corrupt(format!(
            "only {size} bytes, shorter than the smallest snapshot ({MIN_FILE_BYTES} bytes): truncated?"
        )));
    }
    let mut prefix = [0u8; PREFIX_BYTES as usize];
    file.read_exact_at(&mut prefix, 0).map_err(io("read"))?;
    if prefix[..8] != MAGIC {
        return Err(corrupt("bad magic: not a kraft snapshot file".to_string()));
    }
    let version = u32::from_be_bytes(prefix[8..12].try_into().expect("4 bytes"));
    if version != SNAPSHOT_FORMAT_VERSION {
        return Err(corrupt(format!(
            "format version {version}, but this build reads only version {SNAPSHOT_FORMAT_VERSION}"
        )));
    }
    let id = SnapshotId {
        end_offset: i64::from_be_bytes(prefix[12..20].try_into().expect("8 bytes")),
        epoch: i32::from_be_bytes(prefix[20..24].try_into().expect("4 bytes")),
    };
    let mut trailer = [0u8; TRAILER_BYTES as usize];
    file.read_exact_at(&mut trailer, size - TRAILER_BYTES)
        .map_err(io("read"))?;
    if trailer[12..] != END_MAGIC {
        return Err(corrupt(format!(
            "no trailer at the end of its {size} bytes: truncated or damaged"
        )));
    }
    let stored_size = u64::from_be_bytes(trailer[..8].try_into().expect("8 bytes"));
    if stored_size != size {
        return Err(corrupt(format!(
            "length mismatch: the trailer says {stored_size} bytes, the file has {size}: truncated or extended"
        )));
    }
    let stored_crc = u32::from_be_bytes(trailer[8..12].try_into().expect("4 bytes"));

    // One pass over the frames, computing the whole-file CRC on the way.
    // Damage that stops the parse is reported at once; a rule the parsed
    // content breaks is reported only if the whole-file CRC matches (else
    // the CRC mismatch is the better explanation).
    let frames_end = size - TRAILER_BYTES;
    let mut crc = crc32c::crc32c(&prefix);
    let mut input = BufReader::with_capacity(
        READ_BUFFER_BYTES,
        PositionedReader {
            file,
            pos: PREFIX_BYTES,
            end: frames_end,
        },
    );
    let mut check = ContentCheck::new(id);
    let mut frame = Vec::new();
    let mut pos = PREFIX_BYTES;
    let mut index = 0u64;
    let mut seek_index = Vec::new();
    while pos < frames_end {
        let left = frames_end - pos;
        if left < FRAME_HEADER_BYTES {
            return Err(corrupt(format!(
                "{left} stray bytes at byte {pos}, too few for a frame: damaged"
            )));
        }
        let mut len = [0u8; 4];
        input.read_exact(&mut len).map_err(io("read"))?;
        crc = crc32c::crc32c_append(crc, &len);
        let len = u64::from(u32::from_be_bytes(len));
        if len == 0 || len > MAX_FRAME_BYTES as u64 || len > left - FRAME_HEADER_BYTES {
            return Err(corrupt(format!(
                "frame at byte {pos} claims {len} bytes, but {} are left before the trailer (limit {MAX_FRAME_BYTES}): \
                 damaged",
                left - FRAME_HEADER_BYTES
            )));
        }
        frame.resize(len as usize, 0);
        input.read_exact(&mut frame).map_err(io("read"))?;
        crc = crc32c::crc32c_append(crc, &frame);
        let batch: Batch = decode_bounded(&frame, MAX_FRAME_BYTES as u64)
            .map_err(|e| corrupt(format!("batch at byte {pos} does not decode: {e}")))?;
        if !batch.verify() {
            return Err(corrupt(format!("checksum mismatch in the batch at byte {pos}")));
        }
        let next = pos + FRAME_HEADER_BYTES + len;
        check.batch(index, pos, next, next == frames_end, &batch);
        let data_batch = index > 0 && next != frames_end;
        if data_batch
            && seek_index
                .last()
                .is_none_or(|s: &SeekSample| pos - s.pos >= SEEK_INDEX_INTERVAL_BYTES)
        {
            seek_index.push(SeekSample {
                base_offset: batch.base_offset,
                pos,
                ordinal: index - 1,
            });
        }
        pos = next;
        index += 1;
    }
    crc = crc32c::crc32c_append(crc, &trailer[..8]);
    if crc != stored_crc {
        return Err(corrupt(format!(
            "checksum mismatch over the whole file (stored {stored_crc:08x}, computed {crc:08x})"
        )));
    }
    if let Some(reason) = check.violation {
        return Err(corrupt(reason));
    }
    if id != expected {
        return Err(corrupt(format!(
            "holds snapshot (end offset {}, epoch {}) but its name says (end offset {}, epoch {})",
            id.end_offset, id.epoch, expected.end_offset, expected.epoch
        )));
    }
    let (Some(last_contained_timestamp_ms), Some(data_start), Some(data_end)) =
        (check.timestamp, check.data_start, check.footer_at)
    else {
        // ContentCheck records a violation whenever one of these is missing.
        return Err(corrupt("lacks a header or a footer batch".to_string()));
    };
    Ok(Layout {
        id,
        last_contained_timestamp_ms,
        data_start,
        data_end,
        batch_count: check.batch_count,
        record_count: check.record_count,
        size_bytes: size,
        seek_index,
    })
}

/// The rules the content of a snapshot follows (see the module docs),
/// checked batch by batch. Keeps the first violation.
struct ContentCheck {
    id: SnapshotId,
    violation: Option<String>,
    timestamp: Option<i64>,
    data_start: Option<u64>,
    footer_at: Option<u64>,
    last_base_offset: Option<Offset>,
    batch_count: u64,
    record_count: u64,
}

impl ContentCheck {
    fn new(id: SnapshotId) -> Self {
        let violation = check_id(id).err().map(|_| {
            format!(
                "holds an impossible id (end offset {}, epoch {})",
                id.end_offset, id.epoch
            )
        });
        ContentCheck {
            id,
            violation,
            timestamp: None,
            data_start: None,
            footer_at: None,
            last_base_offset: None,
            batch_count: 0,
            record_count: 0,
        }
    }

    /// Batch number `index`, at file position `pos`, followed by `next`.
    fn batch(&mut self, index: u64, pos: u64, next: u64, last: bool, batch: &Batch) {
        if self.violation.is_some() {
            return;
        }
        if let Err(reason) = self.check(index, pos, next, last, batch) {
            self.violation = Some(reason);
        }
    }

    fn check(&mut self, index: u64, pos: u64, next: u64, last: bool, batch: &Batch) -> std::result::Result<(), String> {
        let records = batch
            .records()
            .map_err(|e| format!("records of the batch at byte {pos} do not decode: {e}"))?;
        let control_batch = |what: &str| -> std::result::Result<(), String> {
            if batch.base_offset != 0 || batch.epoch != self.id.epoch || records.len() != 1 {
                return Err(format!(
                    "the {what} batch at byte {pos} has base offset {}, epoch {} and {} records; expected 0, {} and 1",
                    batch.base_offset,
                    batch.epoch,
                    records.len(),
                    self.id.epoch
                ));
            }
            Ok(())
        };
        if index == 0 {
            control_batch("header")?;
            match records[0] {
                Record::SnapshotHeader {
                    version: SNAPSHOT_RECORD_VERSION,
                    last_contained_timestamp_ms,
                } => self.timestamp = Some(last_contained_timestamp_ms),
                Record::SnapshotHeader { version, .. } => {
                    return Err(format!(
                        "snapshot header version {version}, but this build reads only version {SNAPSHOT_RECORD_VERSION}"
                    ))
                }
                ref other => {
                    return Err(format!(
                        "the first batch holds a {} record, not a snapshot header",
                        other.kind()
                    ))
                }
            }
            if last {
                return Err("ends after its header batch: no footer batch".to_string());
            }
            self.data_start = Some(next);
            return Ok(());
        }
        if last {
            control_batch("footer")?;
            match records[0] {
                Record::SnapshotFooter {
                    version: SNAPSHOT_RECORD_VERSION,
                } => {}
                Record::SnapshotFooter { version } => {
                    return Err(format!(
                        "snapshot footer version {version}, but this build reads only version {SNAPSHOT_RECORD_VERSION}"
                    ))
                }
                ref other => {
                    return Err(format!(
                        "the last batch holds a {} record, not a snapshot footer: truncated?",
                        other.kind()
                    ))
                }
            }
            self.footer_at = Some(pos);
            return Ok(());
        }
        check_data_batch(
            self.id,
            self.last_base_offset,
            batch.base_offset,
            batch.epoch,
            records.len(),
        )
        .map_err(|reason| format!("the batch at byte {pos}: {reason}"))?;
        if let Some(record) = records
            .iter()
            .find(|r| matches!(r, Record::SnapshotHeader { .. } | Record::SnapshotFooter { .. }))
        {
            return Err(format!(
                "the batch at byte {pos} holds a {} record inside the snapshot",
                record.kind()
            ));
        }
        self.last_base_offset = Some(batch.base_offset);
        self.batch_count += 1;
        self.record_count += records.len() as u64;
        Ok(())
    }
}

/// The rules of a data batch shared by the writer and the reader.
fn check_data_batch(
    id: SnapshotId,
    last_base_offset: Option<Offset>,
    base_offset: Offset,
    epoch: Epoch,
    record_count: usize,
) -> std::result::Result<(), String> {
    if record_count == 0 {
        return Err("a batch holds at least one record".to_string());
    }
    let Ok(count) = u32::try_from(record_count) else {
        return Err(format!("{record_count} records do not fit in one batch"));
    };
    if base_offset < 0 || base_offset >= id.end_offset {
        return Err(format!(
            "base offset {base_offset} is outside [0, {}), the offsets below the snapshot's end",
            id.end_offset
        ));
    }
    if let Some(last) = last_base_offset.filter(|last| base_offset < *last) {
        return Err(format!(
            "base offset {base_offset} is below the previous batch's {last}"
        ));
    }
    if epoch < 0 || epoch > id.epoch {
        return Err(format!(
            "epoch {epoch} is outside [0, {}], the snapshot's epoch",
            id.epoch
        ));
    }
    if base_offset.checked_add(Offset::from(count)).is_none() {
        return Err(format!(
            "{count} records at base offset {base_offset} run past the largest offset"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A `Read` over `[pos, end)` of a file through positioned reads, so that
/// readers of one file never share a cursor.
struct PositionedReader<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for PositionedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end.saturating_sub(self.pos);
        let len = (buf.len() as u64).min(left) as usize;
        if len == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..len], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

fn prefix(id: SnapshotId) -> [u8; PREFIX_BYTES as usize] {
    let mut prefix = [0u8; PREFIX_BYTES as usize];
    prefix[..8].copy_from_slice(&MAGIC);
    prefix[8..12].copy_from_slice(&SNAPSHOT_FORMAT_VERSION.to_be_bytes());
    prefix[12..20].copy_from_slice(&id.end_offset.to_be_bytes());
    prefix[20..24].copy_from_slice(&id.epoch.to_be_bytes());
    prefix
}

fn check_id(id: SnapshotId) -> Result<()> {
    if id.end_offset < 0 || id.end_offset > crate::raft::MAX_LOG_OFFSET || id.epoch < 0 {
        return Err(SnapshotError::Invalid {
            file: format!("(end offset {}, epoch {})", id.end_offset, id.epoch),
            reason: format!(
                "a snapshot id has an end offset in [0, {}] and a non-negative epoch",
                crate::raft::MAX_LOG_OFFSET
            ),
        });
    }
    Ok(())
}

fn create_part(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                SnapshotError::Invalid {
                    file: display_name(path),
                    reason: "exists already: another writer or installer of this snapshot is at work, or a crash \
                             left it (remove_partial clears those at startup)"
                        .to_string(),
                }
            } else {
                io_error(path, "create", e)
            }
        })
}

/// Removes the `.part` file of an abandoned writer or installer.
fn remove_abandoned(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => tracing::debug!(file = %path.display(), "removed an unfinished snapshot"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(file = %path.display(), error = %e, "cannot remove an unfinished snapshot"),
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, "fsync the directory", e))
}

fn io_error(path: &Path, op: &'static str, source: io::Error) -> SnapshotError {
    SnapshotError::Io {
        file: path.display().to_string(),
        op,
        source,
    }
}

/// The file name of `path`, for error messages.
fn display_name(path: &Path) -> String {
    match path.file_name() {
        Some(name) => name.to_string_lossy().into_owned(),
        None => path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(end_offset: Offset, epoch: Epoch) -> SnapshotId {
        SnapshotId { end_offset, epoch }
    }

    #[test]
    fn names_round_trip_and_reject_near_misses() {
        let sid = id(1000, 3);
        assert_eq!(file_name(sid), "00000000000000001000-0000000003.checkpoint");
        assert_eq!(parse_name(&file_name(sid)), Some(sid));
        let max = id(i64::MAX, i32::MAX);
        assert_eq!(parse_name(&file_name(max)), Some(max));
        for bad in [
            "00000000000000001000-0000000003.checkpoint.part",
            "0000000000000001000-0000000003.checkpoint",
            "00000000000000001000-000000003.checkpoint",
            "00000000000000001000_0000000003.checkpoint",
            "+0000000000000001000-0000000003.checkpoint",
            "99999999999999999999-0000000003.checkpoint",
            "00000000000000001000-9999999999.checkpoint",
            "00000000000000001000-0000000003.checkpoin",
            ".checkpoint",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_stores_checkpoint_file_is_not_taken_for_a_malformed_snapshot() {
        // `list` warns about a `.checkpoint` file whose name does not parse;
        // the store's own `quorum.checkpoint` in the same directory is not
        // one, so a fresh node starts without that warning.
        assert!(!looks_like_a_snapshot(crate::storage::sled_store::CHECKPOINT_FILE));
        assert!(looks_like_a_snapshot("00000000000000001000-0000000003.checkpoint"));
        assert!(looks_like_a_snapshot("quorum2.checkpoint"), "other names still warn");
        assert!(!looks_like_a_snapshot(
            "00000000000000001000-0000000003.checkpoint.part"
        ));
    }

    #[test]
    fn the_smallest_snapshot_is_min_file_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let meta = SnapshotWriter::create(dir.path(), id(0, 0), 0)
            .unwrap()
            .freeze()
            .unwrap();
        assert_eq!(meta.size_bytes, MIN_FILE_BYTES);
        let reader = SnapshotReader::open(&meta.path).unwrap();
        assert_eq!((reader.batch_count(), reader.record_count()), (0, 0));
        assert_eq!(reader.records().count(), 0);
    }

    #[test]
    fn a_well_formed_file_breaking_a_content_rule_is_refused() {
        // A file with valid CRCs everywhere whose data batch lies past the
        // end offset: only a buggy or hostile writer makes one.
        let dir = tempfile::tempdir().unwrap();
        let sid = id(10, 2);
        let path = write_well_formed(dir.path(), sid, &[Batch::new(10, 2, &[Record::NoOp])]);
        let err = SnapshotReader::open(&path).unwrap_err();
        assert!(err.is_corrupt(), "{err}");
        assert!(err.to_string().contains("base offset 10 is outside [0, 10)"), "{err}");
    }

    /// Writes a snapshot file of `sid` with valid CRCs everywhere: the
    /// header, `data`, the footer.
    fn write_well_formed(dir: &Path, sid: SnapshotId, data: &[Batch]) -> PathBuf {
        let mut bytes = prefix(sid).to_vec();
        let header = Batch::new(
            0,
            2,
            &[Record::SnapshotHeader {
                version: 0,
                last_contained_timestamp_ms: 5,
            }],
        );
        let footer = Batch::new(0, 2, &[Record::SnapshotFooter { version: 0 }]);
        for batch in std::iter::once(&header).chain(data).chain([&footer]) {
            let frame = encode(batch);
            bytes.extend_from_slice(&(frame.len() as u32).to_be_bytes());
            bytes.extend_from_slice(&frame);
        }
        bytes.extend_from_slice(&(bytes.len() as u64 + TRAILER_BYTES).to_be_bytes());
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_be_bytes());
        bytes.extend_from_slice(&END_MAGIC);
        let path = path_of(dir, sid);
        fs::write(&path, &bytes).unwrap();
        path
    }

    /// No log reaches past MAX_LOG_OFFSET, so no snapshot of one ends past
    /// it: such an id is refused when a snapshot is written or installed,
    /// and a file named so (hand-made, with valid CRCs) is refused at open.
    #[test]
    fn a_snapshot_ending_past_the_largest_log_offset_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let past = id(crate::raft::MAX_LOG_OFFSET + 1, 2);
        assert!(SnapshotWriter::create(dir.path(), past, 0).is_err());
        assert!(SnapshotInstaller::create(dir.path(), past, MIN_FILE_BYTES).is_err());
        let path = write_well_formed(dir.path(), past, &[]);
        let err = SnapshotReader::open(&path).unwrap_err();
        assert!(err.to_string().contains("impossible id"), "{err}");
        let at = id(crate::raft::MAX_LOG_OFFSET, 2);
        let path = write_well_formed(dir.path(), at, &[]);
        SnapshotReader::open(&path).expect("the largest end offset is fine");
    }

    #[test]
    fn writeback_starts_each_chunk_and_waits_for_the_one_before() {
        let mib = WRITEBACK_BYTES;
        let mut writeback = Writeback::default();
        assert_eq!(writeback.next(mib - 1), None);
        assert_eq!(writeback.next(mib), Some((0..mib, 0..0)));
        assert_eq!(writeback.next(mib + mib / 2), None);
        // A BufWriter hands over more than a chunk at once: all of it goes.
        assert_eq!(writeback.next(3 * mib + 5), Some((mib..3 * mib + 5, 0..mib)));
        assert_eq!(
            writeback.next(4 * mib + 5),
            Some((3 * mib + 5..4 * mib + 5, mib..3 * mib + 5))
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_writeback_range_beyond_what_the_kernel_takes_is_an_error_not_a_skip() {
        let file = tempfile::tempfile().unwrap();
        let beyond = 1u64 << 63;
        Writeback::run(&file, 0..0, 0..0).unwrap();
        assert!(Writeback::run(&file, beyond..beyond + 1, 0..0).is_err());
        assert!(Writeback::run(&file, 0..0, beyond..beyond + 1).is_err());
    }

    #[test]
    fn a_large_snapshot_is_written_back_while_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let end = 6_000;
        let mut writer = SnapshotWriter::create(dir.path(), id(end, 1), 0).unwrap();
        let value = vec![b'v'; 1000];
        let mut appended = Vec::new();
        for base in (0..end).step_by(6) {
            let records = vec![Record::Data(value.clone()); 6];
            writer.append(base, 1, &records).unwrap();
            appended.extend(records);
        }
        // ~6 MB written: all but the last chunk or two was handed to the
        // disk before `freeze`.
        assert!(writer.bytes_written() > 5 * WRITEBACK_BYTES);
        assert!(
            writer.writeback_started() >= writer.bytes_written() - 2 * WRITEBACK_BYTES,
            "writeback started for {} of {} bytes",
            writer.writeback_started(),
            writer.bytes_written()
        );
        let meta = writer.freeze().unwrap();
        let reader = SnapshotReader::open(&meta.path).unwrap();
        let read: Vec<Record> = reader.records().map(|r| r.unwrap()).collect();
        assert_eq!(read, appended);
    }
}
