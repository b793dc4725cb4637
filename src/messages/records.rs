//! Records and record batches: the unit the metadata log stores and replicates.
//!
//! A batch carries its records already encoded (`payload`), so the leader can
//! serve a Fetch straight from storage without decoding or re-encoding a
//! record, and the CRC32C covers exactly the bytes that travel and rest.

use serde::{Deserialize, Serialize};

use super::codec::{decode_borrowed, decode_bounded, CodecError};
use crate::types::{Epoch, NodeId, Offset, MAX_LOG_OFFSET};

/// Largest batch, and largest fetch response, in bytes (Kafka's 8 MiB).
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// Longest encoding of a batch ([`Batch::encoded_len`]) that
/// [`Batch::verify`] accepts and every store keeps: twice the batch cap,
/// plus the fixed header. A leader never builds one near it; a batch from a
/// peer beyond it is refused before anything is written.
pub const MAX_ENCODED_BATCH_BYTES: usize = 2 * MAX_BATCH_BYTES + 64;

/// Bytes [`Batch::size_bytes`] counts besides the payload.
const BATCH_SIZE_HEADER_BYTES: usize = 24;

/// Bytes of a [`Batch`]'s encoding besides its payload (bincode fixint, see
/// [`super::codec`]): base offset 8, epoch 4, record count 4, CRC 4, and
/// the payload's length 8.
const BATCH_ENCODING_OVERHEAD_BYTES: usize = 28;

/// One entry of the log or of a snapshot. Control records (LeaderChange,
/// SnapshotHeader, SnapshotFooter) always sit in a batch of their own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// An opaque data record (the raw records of `POST /v1/append`).
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    /// First batch of every leader epoch (KIP-595): who leads and who voted.
    LeaderChange {
        leader_id: NodeId,
        voters: Vec<NodeId>,
        granting_voters: Vec<NodeId>,
    },
    /// Appended by an idle leader every `metadata.max_idle_interval_ms` so
    /// followers and listeners see a moving high watermark.
    NoOp,
    // New variants go at the end: bincode encodes the variant index, so the
    // order above is part of the log and snapshot formats.
    // It is also sent as is to clients (the client protocol's `Read`): a
    // new variant that can appear in the log needs the client protocol's
    // version raised.
    /// The only record of a snapshot's first batch (KIP-630): the version of
    /// this record's layout and the timestamp of the last log record the
    /// snapshot contains. Never appended to the log.
    SnapshotHeader {
        version: u16,
        last_contained_timestamp_ms: i64,
    },
    /// The only record of a snapshot's last batch (KIP-630). Never appended
    /// to the log.
    SnapshotFooter { version: u16 },
}

/// A [`Record`]'s encoding, the same variants in the same order, with a
/// data record's bytes borrowed: what [`Batch::check_log_records`]
/// decodes.
#[derive(Deserialize)]
#[allow(dead_code)]
enum RecordShape<'a> {
    Data(&'a [u8]),
    LeaderChange {
        leader_id: NodeId,
        voters: Vec<NodeId>,
        granting_voters: Vec<NodeId>,
    },
    NoOp,
    SnapshotHeader {
        version: u16,
        last_contained_timestamp_ms: i64,
    },
    SnapshotFooter {
        version: u16,
    },
}

impl Record {
    /// The `kind` the HTTP API reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Data(_) => "data",
            Record::LeaderChange { .. } => "leader_change",
            Record::NoOp => "noop",
            Record::SnapshotHeader { .. } => "snapshot_header",
            Record::SnapshotFooter { .. } => "snapshot_footer",
        }
    }

    pub fn is_control(&self) -> bool {
        matches!(
            self,
            Record::LeaderChange { .. } | Record::SnapshotHeader { .. } | Record::SnapshotFooter { .. }
        )
    }

    /// [`Record::encoded_len`] of a data record of `len` bytes.
    pub fn data_encoded_len(len: usize) -> usize {
        len + 12
    }

    /// Bytes this record adds to a batch, used by the accumulator's size cap.
    pub fn encoded_len(&self) -> usize {
        match self {
            Record::Data(bytes) => Self::data_encoded_len(bytes.len()),
            Record::LeaderChange {
                voters,
                granting_voters,
                ..
            } => 16 + 4 * (voters.len() + granting_voters.len()),
            Record::NoOp => 4,
            // Variant index + version + timestamp; variant index + version.
            Record::SnapshotHeader { .. } => 14,
            Record::SnapshotFooter { .. } => 6,
        }
    }
}

/// A batch of records written by the leader of `epoch`, occupying offsets
/// `base_offset ..= base_offset + record_count - 1`.
///
/// Invariant: `record_count >= 1`, and `crc` is the CRC32C of
/// (base_offset, epoch, record_count, payload) — checked on every read from
/// disk and on every batch a follower receives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub base_offset: Offset,
    pub epoch: Epoch,
    pub record_count: u32,
    pub crc: u32,
    /// bincode of `Vec<Record>`.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

impl Batch {
    /// Whether the batch holds a data record, told without decoding it: a
    /// batch of several records does (an idle leader's NoOp and a
    /// LeaderChange are appended alone), one record is told by its variant
    /// index, the four bytes after the list's length (fixint, big-endian).
    pub fn holds_data(&self) -> bool {
        const DATA_VARIANT: [u8; 4] = [0, 0, 0, 0];
        self.record_count > 1 || self.payload.get(8..12) == Some(&DATA_VARIANT[..])
    }

    /// Encodes `records` (at least one) into a batch.
    pub fn new(base_offset: Offset, epoch: Epoch, records: &[Record]) -> Batch {
        assert!(!records.is_empty(), "a batch holds at least one record");
        let payload = super::codec::encode(&records);
        Batch::sealed(base_offset, epoch, records.len() as u32, payload)
    }

    /// A batch of `payload` as given, with the CRC computed over it: what a
    /// peer could send. Only [`Batch::new`] makes batches that decode.
    pub fn sealed(base_offset: Offset, epoch: Epoch, record_count: u32, payload: Vec<u8>) -> Batch {
        let crc = Self::checksum(base_offset, epoch, record_count, &payload);
        Batch {
            base_offset,
            epoch,
            record_count,
            crc,
            payload,
        }
    }

    /// Whether the batch holds what a log may hold, checked without copying
    /// a record: its records decode, as many as its header says, and none
    /// is a snapshot's own (SnapshotHeader, SnapshotFooter). A follower checks
    /// this before it writes a fetched batch: one that passes its CRC but
    /// does not decode would otherwise be committed and fail every later
    /// read.
    pub fn check_log_records(&self) -> Result<(), CodecError> {
        let records: Vec<RecordShape<'_>> = decode_borrowed(&self.payload, self.payload.len() as u64)?;
        let invalid = |what: String| {
            Err(CodecError::Invalid(format!(
                "batch at offset {}: {what}",
                self.base_offset
            )))
        };
        if records.len() != self.record_count as usize {
            return invalid(format!(
                "says {} records but holds {}",
                self.record_count,
                records.len()
            ));
        }
        for record in &records {
            if let RecordShape::SnapshotHeader { .. } | RecordShape::SnapshotFooter { .. } = record {
                return invalid("a snapshot's own record is not a log record".to_string());
            }
        }
        Ok(())
    }

    fn checksum(base_offset: Offset, epoch: Epoch, record_count: u32, payload: &[u8]) -> u32 {
        let mut header = [0u8; 16];
        header[..8].copy_from_slice(&base_offset.to_be_bytes());
        header[8..12].copy_from_slice(&epoch.to_be_bytes());
        header[12..].copy_from_slice(&record_count.to_be_bytes());
        crc32c::crc32c_append(crc32c::crc32c(&header), payload)
    }

    /// True when the stored CRC matches the contents, the batch's offsets
    /// are ones a log can hold (it ends at most at [`MAX_LOG_OFFSET`]) and
    /// its encoding is one a store keeps ([`MAX_ENCODED_BATCH_BYTES`]).
    pub fn verify(&self) -> bool {
        self.record_count >= 1
            && self.base_offset >= 0
            && self.base_offset <= MAX_LOG_OFFSET - self.record_count as Offset
            && self.encoded_len() <= MAX_ENCODED_BATCH_BYTES
            && self.crc == Self::checksum(self.base_offset, self.epoch, self.record_count, &self.payload)
    }

    /// Last offset in this batch (inclusive).
    pub fn last_offset(&self) -> Offset {
        self.base_offset + self.record_count as Offset - 1
    }

    /// The offset after this batch.
    pub fn next_offset(&self) -> Offset {
        self.base_offset + self.record_count as Offset
    }

    /// The size read and fetch budgets (`max_bytes`) count for this batch:
    /// its payload and a 24-byte header. Its encoding is 4 bytes longer
    /// ([`Batch::encoded_len`]); a limit on what is stored or sent must use
    /// that one.
    pub fn size_bytes(&self) -> usize {
        self.payload.len() + BATCH_SIZE_HEADER_BYTES
    }

    /// The [`Batch::size_bytes`] of the batch whose encoding is
    /// `encoded_len` bytes long; `None` when no batch's is that short.
    pub fn size_bytes_of_encoding(encoded_len: usize) -> Option<usize> {
        let payload_bytes = encoded_len.checked_sub(BATCH_ENCODING_OVERHEAD_BYTES)?;
        Some(payload_bytes + BATCH_SIZE_HEADER_BYTES)
    }

    /// The base offset and record count an encoded batch begins with (the
    /// fields come in declaration order, fixint big-endian), read without
    /// decoding, let alone checking, the rest; `None` when `encoding` is too
    /// short to hold them.
    pub fn peek_offsets(encoding: &[u8]) -> Option<(Offset, u32)> {
        let base_offset = Offset::from_be_bytes(encoding.get(..8)?.try_into().ok()?);
        // The epoch (4 bytes) lies between.
        let record_count = u32::from_be_bytes(encoding.get(12..16)?.try_into().ok()?);
        Some((base_offset, record_count))
    }

    /// Length of this batch's encoding ([`super::codec::encode`]): what a
    /// store writes and must decode again.
    pub fn encoded_len(&self) -> usize {
        self.payload.len() + BATCH_ENCODING_OVERHEAD_BYTES
    }

    /// Decodes the records; fails (never panics) on damaged bytes or a count
    /// that does not match the header. Whatever a store accepted decodes
    /// again: the only bound is the payload itself (a length inside it that
    /// points past its end fails before anything is allocated).
    pub fn records(&self) -> Result<Vec<Record>, CodecError> {
        let records: Vec<Record> = decode_bounded(&self.payload, self.payload.len() as u64)?;
        if records.len() != self.record_count as usize {
            return Err(CodecError::Invalid(format!(
                "batch at offset {} says {} records but holds {}",
                self.base_offset,
                self.record_count,
                records.len()
            )));
        }
        Ok(records)
    }
}

/// One committed record as `GET /v1/log` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LogEntry {
    pub offset: Offset,
    pub epoch: Epoch,
    /// data, leader_change, noop
    pub kind: String,
    /// The text of a data record (lossy UTF-8); None for control records.
    pub value: Option<String>,
}

/// The body of `GET /v1/log`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LogPage {
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    pub records: Vec<LogEntry>,
}

/// A committed record: delivered to a listener, and read with
/// `NodeHandle::read_records`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedRecord {
    pub offset: Offset,
    pub epoch: Epoch,
    pub record: Record,
}

/// Committed records as the log holds them: what [`LogPage`] shows as
/// text, with a data record's bytes as they were appended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordPage {
    pub high_watermark: Offset,
    pub log_start_offset: Offset,
    /// From the offset asked for, contiguous, control records included.
    /// Below the log start they come from the newest snapshot, and the
    /// page ends at the log start.
    pub records: Vec<CommittedRecord>,
}

impl From<RecordPage> for LogPage {
    fn from(page: RecordPage) -> LogPage {
        LogPage {
            high_watermark: page.high_watermark,
            log_start_offset: page.log_start_offset,
            records: page
                .records
                .into_iter()
                .map(|committed| LogEntry {
                    offset: committed.offset,
                    epoch: committed.epoch,
                    kind: committed.record.kind().to_string(),
                    value: match &committed.record {
                        Record::Data(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
                        _ => None,
                    },
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trips_and_detects_damage() {
        let records = vec![Record::Data(b"a".to_vec()), Record::NoOp];
        let mut batch = Batch::new(7, 3, &records);
        assert!(batch.verify());
        assert_eq!(batch.last_offset(), 8);
        assert_eq!(batch.records().unwrap(), records);
        batch.payload[0] ^= 1;
        assert!(!batch.verify());
        let mut batch = Batch::new(7, 3, &records);
        batch.epoch = 4;
        assert!(!batch.verify(), "the header is covered by the CRC");
    }

    #[test]
    fn a_log_batch_is_checked_without_copying_its_records() {
        let leader_change = Record::LeaderChange {
            leader_id: 1,
            voters: vec![1, 2, 3],
            granting_voters: vec![1, 2],
        };
        for records in [
            vec![
                Record::Data(b"a".to_vec()),
                Record::Data(Vec::new()),
                Record::Data(vec![9; 300]),
            ],
            vec![leader_change],
            vec![Record::NoOp],
        ] {
            let checked = Batch::new(7, 3, &records).check_log_records();
            assert!(checked.is_ok(), "{records:?}: {checked:?}");
        }
        let refused = |batch: Batch, what: &str| match batch.check_log_records() {
            Err(e) => assert!(e.to_string().contains(what), "{what}: {e}"),
            Ok(()) => panic!("{what}: passed"),
        };
        refused(Batch::sealed(7, 3, 1, vec![0xff; 12]), "");
        let two = codec_encode(&vec![Record::Data(b"a".to_vec()), Record::Data(b"b".to_vec())]);
        refused(Batch::sealed(7, 3, 3, two), "says 3 records but holds 2");
        refused(
            Batch::new(7, 3, &[Record::SnapshotFooter { version: 0 }]),
            "a snapshot's own record",
        );
    }

    fn codec_encode(records: &Vec<Record>) -> Vec<u8> {
        crate::messages::codec::encode(records)
    }

    #[test]
    fn a_batch_larger_than_twice_the_batch_cap_still_decodes() {
        // The store accepts encodings up to 2 × MAX_BATCH_BYTES + 64 bytes,
        // so a payload just under that must decode too.
        let records = vec![
            Record::Data(vec![7; MAX_BATCH_BYTES]),
            Record::Data(vec![8; MAX_BATCH_BYTES]),
        ];
        let batch = Batch::new(0, 1, &records);
        assert!(batch.payload.len() > 2 * MAX_BATCH_BYTES);
        assert_eq!(batch.records().unwrap(), records);
        let mut lying = batch.clone();
        lying.payload.truncate(lying.payload.len() - 1);
        assert!(lying.records().is_err(), "a payload cut short fails");
    }

    #[test]
    fn encoded_len_size_and_offsets_agree_with_the_encoding() {
        use crate::messages::codec::encode;
        for records in [
            vec![Record::NoOp],
            vec![Record::Data(vec![1; 5000]), Record::NoOp],
            vec![Record::Data(Vec::new()); 3],
        ] {
            let batch = Batch::new(i64::MAX - 10, i32::MAX, &records);
            let encoded = encode(&batch);
            assert_eq!(batch.encoded_len(), encoded.len(), "{records:?}");
            assert_eq!(Batch::size_bytes_of_encoding(encoded.len()), Some(batch.size_bytes()));
            assert_eq!(
                Batch::peek_offsets(&encoded[..16]),
                Some((batch.base_offset, batch.record_count))
            );
        }
        assert_eq!(Batch::peek_offsets(&[0; 15]), None);
        assert_eq!(Batch::size_bytes_of_encoding(27), None);
    }

    #[test]
    fn holds_data_tells_data_batches_from_lone_control_records_and_noops() {
        let leader_change = Record::LeaderChange {
            leader_id: 1,
            voters: vec![1, 2, 3],
            granting_voters: vec![1, 2],
        };
        let cases = [
            (vec![Record::Data(b"x".to_vec())], true),
            (vec![Record::Data(Vec::new())], true),
            (vec![Record::NoOp], false),
            (vec![leader_change], false),
            (vec![Record::NoOp, Record::Data(b"x".to_vec())], true),
        ];
        for (records, data) in cases {
            assert_eq!(Batch::new(0, 1, &records).holds_data(), data, "{records:?}");
        }
    }

    #[test]
    fn snapshot_control_records_keep_the_older_variant_indexes() {
        use crate::messages::codec::encode;
        // The variant index is the first four bytes (fixint, big-endian).
        assert_eq!(encode(&Record::NoOp), vec![0, 0, 0, 2]);
        let header = Record::SnapshotHeader {
            version: 0,
            last_contained_timestamp_ms: 7,
        };
        let footer = Record::SnapshotFooter { version: 0 };
        assert_eq!(encode(&header)[..4], [0, 0, 0, 3]);
        assert_eq!(encode(&footer)[..4], [0, 0, 0, 4]);
        for record in [header, footer] {
            assert!(record.is_control());
            assert_eq!(encode(&record).len(), record.encoded_len());
        }
        assert_eq!(
            Record::SnapshotHeader {
                version: 0,
                last_contained_timestamp_ms: 0
            }
            .kind(),
            "snapshot_header"
        );
        assert_eq!(Record::SnapshotFooter { version: 0 }.kind(), "snapshot_footer");
    }

    #[test]
    fn damaged_payload_decodes_to_an_error() {
        let mut batch = Batch::new(0, 1, &[Record::Data(vec![1, 2, 3])]);
        batch.payload = vec![0xff; 5];
        assert!(batch.records().is_err());
    }
}
