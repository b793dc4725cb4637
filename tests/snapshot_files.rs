//! Snapshot files (issue 3): format, atomic creation, validation, chunked
//! transfer and directory helpers, through the public API only.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use kraft::messages::{Batch, Record, SnapshotId};
use kraft::storage::snapshot::{
    self, file_name, parse_name, MAX_CHUNK_BYTES, MIN_FILE_BYTES, PARTIAL_SUFFIX, SNAPSHOT_SUFFIX,
};
use kraft::storage::{SnapshotError, SnapshotInstaller, SnapshotMeta, SnapshotReader, SnapshotWriter};
use proptest::prelude::*;

fn id(end_offset: i64, epoch: i32) -> SnapshotId {
    SnapshotId { end_offset, epoch }
}

/// Data record `i`: its index and some filler, `len` bytes in all.
fn record(i: u64, len: usize) -> Record {
    let mut bytes = i.to_be_bytes().to_vec();
    bytes.resize(len.max(8), (i % 251) as u8);
    Record::Data(bytes)
}

/// Writes records `0..n` at their own offsets in batches of `per_batch`,
/// into snapshot (n, epoch); returns the metadata and the records.
fn write_snapshot(dir: &Path, n: u64, epoch: i32, per_batch: usize, record_len: usize) -> (SnapshotMeta, Vec<Record>) {
    let records: Vec<Record> = (0..n).map(|i| record(i, record_len)).collect();
    let mut writer = SnapshotWriter::create(dir, id(n as i64, epoch), 1_700_000_000_000 + n as i64).unwrap();
    for (k, chunk) in records.chunks(per_batch).enumerate() {
        let base = (k * per_batch) as i64;
        // Epochs grow along the log, up to the snapshot's.
        let batch_epoch = (epoch * base as i32 / n.max(1) as i32).max(1).min(epoch);
        writer.append(base, batch_epoch, chunk).unwrap();
    }
    let meta = writer.freeze().unwrap();
    (meta, records)
}

fn read_all(reader: &SnapshotReader) -> Vec<Record> {
    reader.records().collect::<Result<Vec<_>, _>>().unwrap()
}

/// Names of the entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn flip(path: &Path, at: usize, mask: u8) {
    let mut bytes = fs::read(path).unwrap();
    bytes[at] ^= mask;
    fs::write(path, bytes).unwrap();
}

fn expect_corrupt(result: Result<SnapshotReader, SnapshotError>, what: &str) -> String {
    match result {
        Err(e @ SnapshotError::Corrupt { .. }) => e.to_string(),
        Err(other) => panic!("{what}: expected Corrupt, got {other}"),
        Ok(reader) => panic!("{what}: a modified file opened as {:?}", reader.id()),
    }
}

#[test]
fn round_trip_of_1_1000_and_100000_records() {
    for (n, per_batch) in [(1u64, 1usize), (1_000, 100), (100_000, 1_000)] {
        let dir = tempfile::tempdir().unwrap();
        let (meta, records) = write_snapshot(dir.path(), n, 4, per_batch, 40);
        assert_eq!(meta.id, id(n as i64, 4));
        assert_eq!(meta.path, dir.path().join(file_name(meta.id)));
        assert_eq!(meta.size_bytes, fs::metadata(&meta.path).unwrap().len());

        let reader = SnapshotReader::open(&meta.path).unwrap();
        assert_eq!(reader.id(), meta.id);
        assert_eq!(reader.size_bytes(), meta.size_bytes);
        assert_eq!(reader.last_contained_timestamp_ms(), 1_700_000_000_000 + n as i64);
        assert_eq!(reader.record_count(), n);
        assert_eq!(reader.batch_count(), n.div_ceil(per_batch as u64));
        assert_eq!(reader.meta(), meta);
        assert_eq!(read_all(&reader), records, "{n} records");

        // Batches keep the offsets and epochs they were written with.
        let mut expected_base = 0;
        for batch in reader.batches() {
            let batch = batch.unwrap();
            assert!(batch.verify());
            assert_eq!(batch.base_offset, expected_base);
            assert!((1..=4).contains(&batch.epoch));
            expected_base = batch.next_offset();
        }
        assert_eq!(expected_base, n as i64);
        // Two iterations at once do not disturb each other.
        let mut a = reader.records();
        let mut b = reader.records();
        assert_eq!(a.next().unwrap().unwrap(), records[0]);
        assert_eq!(b.next().unwrap().unwrap(), records[0]);
        assert_eq!(a.count() as u64, n - 1);
    }
}

#[test]
fn an_empty_snapshot_and_control_and_mixed_records_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let meta = SnapshotWriter::create(dir.path(), id(0, 0), -1)
        .unwrap()
        .freeze()
        .unwrap();
    assert_eq!(meta.size_bytes, MIN_FILE_BYTES);
    let reader = SnapshotReader::open(&meta.path).unwrap();
    assert_eq!((reader.id(), reader.last_contained_timestamp_ms()), (id(0, 0), -1));
    assert_eq!(reader.records().count(), 0);

    let mixed = vec![
        Record::LeaderChange {
            leader_id: 2,
            voters: vec![1, 2, 3],
            granting_voters: vec![2, 3],
        },
        Record::NoOp,
        Record::Data(Vec::new()),
        Record::Data(vec![0xff; 1000]),
    ];
    let mut writer = SnapshotWriter::create(dir.path(), id(10, 2), 0).unwrap();
    // Several batches may share a base offset (a state machine that cannot
    // name original offsets), as long as base offsets never go back.
    writer.append(0, 1, &mixed[..1]).unwrap();
    writer.append(5, 2, &mixed[1..]).unwrap();
    writer.append(5, 2, &mixed).unwrap();
    assert_eq!((writer.batch_count(), writer.record_count()), (3, 8));
    let reader = SnapshotReader::open(&writer.freeze().unwrap().path).unwrap();
    let expected: Vec<Record> = mixed.iter().chain(&mixed).cloned().collect();
    assert_eq!(read_all(&reader), expected);
}

#[test]
fn file_names_have_20_and_10_digits() {
    assert_eq!(file_name(id(1000, 3)), "00000000000000001000-0000000003.checkpoint");
    assert_eq!(file_name(id(0, 0)), "00000000000000000000-0000000000.checkpoint");
    assert_eq!(
        parse_name("00000000000000001000-0000000003.checkpoint"),
        Some(id(1000, 3))
    );
    assert_eq!(parse_name("00000000000000001000-0000000003.checkpoint.part"), None);
    assert_eq!(parse_name("1000-3.checkpoint"), None);
    assert_eq!(parse_name("meta.properties"), None);

    let dir = tempfile::tempdir().unwrap();
    let (meta, _) = write_snapshot(dir.path(), 1000, 3, 100, 10);
    assert_eq!(entries(dir.path()), vec!["00000000000000001000-0000000003.checkpoint"]);
    assert!(meta.path.to_string_lossy().ends_with(SNAPSHOT_SUFFIX));
}

#[test]
fn nothing_is_a_checkpoint_until_freeze_and_a_dropped_writer_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sid = id(100, 1);
    let part = format!("{}{}", "00000000000000000100-0000000001", PARTIAL_SUFFIX);

    let mut writer = SnapshotWriter::create(dir.path(), sid, 0).unwrap();
    writer.append(0, 1, &[record(0, 10), record(1, 10)]).unwrap();
    assert_eq!(writer.part_path(), dir.path().join(&part));
    assert_eq!(entries(dir.path()), vec![part.clone()]);
    assert!(
        snapshot::list(dir.path()).unwrap().is_empty(),
        "a .part is not a snapshot"
    );
    assert!(snapshot::newest_valid(dir.path()).unwrap().is_none());
    // A second writer (or installer) of the same id is refused.
    assert!(SnapshotWriter::create(dir.path(), sid, 0).is_err());
    assert!(SnapshotInstaller::create(dir.path(), sid, 1 << 20).is_err());
    drop(writer);
    assert!(entries(dir.path()).is_empty(), "the dropped writer's .part is gone");

    let mut writer = SnapshotWriter::create(dir.path(), sid, 0).unwrap();
    writer.append(0, 1, &[record(0, 10)]).unwrap();
    let meta = writer.freeze().unwrap();
    assert_eq!(entries(dir.path()), vec![file_name(sid)]);
    assert_eq!(snapshot::list(dir.path()).unwrap(), vec![sid]);
    assert_eq!(meta.path, dir.path().join(file_name(sid)));

    // Freezing a snapshot of the same id again replaces it atomically.
    let mut writer = SnapshotWriter::create(dir.path(), sid, 9).unwrap();
    writer.append(0, 1, &[record(7, 10)]).unwrap();
    writer.freeze().unwrap();
    let reader = SnapshotReader::open(&meta.path).unwrap();
    assert_eq!(read_all(&reader), vec![record(7, 10)]);
    assert_eq!(entries(dir.path()), vec![file_name(sid)]);
}

#[test]
fn the_writer_refuses_batches_that_break_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = SnapshotWriter::create(dir.path(), id(100, 5), 0).unwrap();
    writer.append(10, 3, &[Record::NoOp]).unwrap();
    let refused = |writer: &mut SnapshotWriter, base: i64, epoch: i32, records: &[Record]| {
        let size = writer.bytes_written();
        let err = writer.append(base, epoch, records).unwrap_err();
        assert!(matches!(err, SnapshotError::Invalid { .. }), "{err}");
        assert_eq!(writer.bytes_written(), size, "nothing written for {err}");
        err.to_string()
    };
    let message = refused(&mut writer, 100, 5, &[Record::NoOp]);
    assert!(message.contains("base offset 100 is outside [0, 100)"), "{message}");
    assert!(
        message.contains("00000000000000000100-0000000005.checkpoint.part"),
        "{message}"
    );
    refused(&mut writer, -1, 5, &[Record::NoOp]);
    refused(&mut writer, 9, 5, &[Record::NoOp]);
    refused(&mut writer, 20, 6, &[Record::NoOp]);
    refused(&mut writer, 20, -1, &[Record::NoOp]);
    refused(&mut writer, 20, 5, &[]);
    refused(&mut writer, 20, 5, &[Record::SnapshotFooter { version: 0 }]);
    refused(
        &mut writer,
        20,
        5,
        &[
            Record::NoOp,
            Record::SnapshotHeader {
                version: 0,
                last_contained_timestamp_ms: 0,
            },
        ],
    );
    // A batch above the frame limit (16 MiB + 64).
    refused(&mut writer, 20, 5, &[Record::Data(vec![0; 17 << 20])]);
    writer.append(10, 5, &[Record::NoOp]).unwrap();
    let reader = SnapshotReader::open(&writer.freeze().unwrap().path).unwrap();
    assert_eq!(read_all(&reader), vec![Record::NoOp, Record::NoOp]);

    assert!(SnapshotWriter::create(dir.path(), id(-1, 0), 0).is_err());
    assert!(SnapshotWriter::create(dir.path(), id(0, -1), 0).is_err());
    assert!(SnapshotWriter::create(&dir.path().join("missing"), id(1, 1), 0).is_err());
}

#[test]
fn a_batch_appended_as_it_is_follows_the_same_rules_and_must_match_its_crc() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = SnapshotWriter::create(dir.path(), id(100, 5), 0).unwrap();
    let kept = Batch::new(10, 3, &[record(10, 3), record(11, 3)]);
    writer.append_batch(&kept).unwrap();
    let refused = |writer: &mut SnapshotWriter, batch: &Batch| {
        let size = writer.bytes_written();
        let err = writer.append_batch(batch).unwrap_err();
        assert!(matches!(err, SnapshotError::Invalid { .. }), "{err}");
        assert_eq!(writer.bytes_written(), size, "nothing written for {err}");
        err.to_string()
    };
    refused(&mut writer, &Batch::new(100, 5, &[Record::NoOp]));
    refused(&mut writer, &Batch::new(9, 5, &[Record::NoOp]));
    refused(&mut writer, &Batch::new(20, 6, &[Record::NoOp]));
    refused(
        &mut writer,
        &Batch::new(20, 5, &[Record::SnapshotFooter { version: 0 }]),
    );
    let mut damaged = Batch::new(20, 5, &[record(20, 5)]);
    damaged.payload[3] ^= 1;
    let message = refused(&mut writer, &damaged);
    assert!(message.contains("fails its CRC"), "{message}");
    // A CRC that matches, over a count the records do not have.
    let mut miscounted = Batch::new(20, 5, &[Record::NoOp]);
    miscounted.record_count = 2;
    let mut header = Vec::new();
    header.extend_from_slice(&20i64.to_be_bytes());
    header.extend_from_slice(&5i32.to_be_bytes());
    header.extend_from_slice(&2u32.to_be_bytes());
    miscounted.crc = crc32c::crc32c_append(crc32c::crc32c(&header), &miscounted.payload);
    assert!(miscounted.verify());
    let message = refused(&mut writer, &miscounted);
    assert!(message.contains("holds 1"), "{message}");
    let meta = writer.freeze().unwrap();
    let reader = SnapshotReader::open(&meta.path).unwrap();
    assert_eq!(read_all(&reader), vec![record(10, 3), record(11, 3)]);
    assert_eq!(reader.batches().next().unwrap().unwrap(), kept, "the batch as it was");
}

#[test]
fn every_truncation_and_every_flipped_byte_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _) = write_snapshot(dir.path(), 30, 2, 7, 20);
    let original = fs::read(&meta.path).unwrap();
    let name = file_name(meta.id);

    for len in 0..original.len() {
        fs::write(&meta.path, &original[..len]).unwrap();
        let message = expect_corrupt(SnapshotReader::open(&meta.path), &format!("truncated to {len}"));
        assert!(message.starts_with(&format!("snapshot {name}: ")), "{message}");
    }
    let mut extended = original.clone();
    extended.push(0);
    fs::write(&meta.path, &extended).unwrap();
    expect_corrupt(SnapshotReader::open(&meta.path), "one byte appended");

    for at in 0..original.len() {
        for mask in [0x01, 0x80, 0xff] {
            let mut bytes = original.clone();
            bytes[at] ^= mask;
            fs::write(&meta.path, &bytes).unwrap();
            expect_corrupt(SnapshotReader::open(&meta.path), &format!("byte {at} ^ {mask:#x}"));
        }
    }
    fs::write(&meta.path, &original).unwrap();
    SnapshotReader::open(&meta.path).unwrap();
}

#[test]
fn damage_messages_name_the_file_and_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _) = write_snapshot(dir.path(), 1000, 3, 100, 40);
    let name = "00000000000000001000-0000000003.checkpoint";
    let original = fs::read(&meta.path).unwrap();

    // A byte inside the payload of a data batch: that batch's CRC.
    flip(&meta.path, 4096, 0x10);
    let message = expect_corrupt(SnapshotReader::open(&meta.path), "payload flip");
    assert!(
        message.starts_with(&format!("snapshot {name}: checksum mismatch in the batch at byte ")),
        "{message}"
    );

    // The id in the prefix: the whole-file CRC.
    fs::write(&meta.path, &original).unwrap();
    flip(&meta.path, 19, 0x01);
    let message = expect_corrupt(SnapshotReader::open(&meta.path), "id flip");
    assert!(message.contains("checksum mismatch over the whole file"), "{message}");

    // Truncation: the trailer is gone.
    fs::write(&meta.path, &original[..original.len() - 100]).unwrap();
    let message = expect_corrupt(SnapshotReader::open(&meta.path), "truncation");
    assert!(message.contains("truncated"), "{message}");

    // A valid file under another snapshot's name.
    fs::write(&meta.path, &original).unwrap();
    let renamed = dir.path().join(file_name(id(1000, 4)));
    fs::copy(&meta.path, &renamed).unwrap();
    let message = expect_corrupt(SnapshotReader::open(&renamed), "renamed");
    assert!(
        message.contains("its name says (end offset 1000, epoch 4)"),
        "{message}"
    );

    // Not a snapshot name at all.
    let other = dir.path().join("snapshot.bin");
    fs::copy(&meta.path, &other).unwrap();
    assert!(matches!(
        SnapshotReader::open(&other),
        Err(SnapshotError::Invalid { .. })
    ));
    assert!(matches!(
        SnapshotReader::open(&dir.path().join(file_name(id(5, 5)))),
        Err(SnapshotError::Io { .. })
    ));
}

#[test]
fn newest_valid_falls_back_past_damaged_snapshots_and_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (old, old_records) = write_snapshot(dir.path(), 100, 1, 10, 10);
    let (middle, _) = write_snapshot(dir.path(), 200, 2, 10, 10);
    let (newest, _) = write_snapshot(dir.path(), 300, 2, 10, 10);
    let (reader, skipped) = snapshot::newest_valid(dir.path()).unwrap().unwrap();
    assert_eq!(reader.id(), newest.id);
    assert!(skipped.is_empty());
    drop(reader);

    flip(&newest.path, 1000, 0x04);
    let len = fs::metadata(&middle.path).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&middle.path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let (reader, skipped) = snapshot::newest_valid(dir.path()).unwrap().unwrap();
    assert_eq!(reader.id(), old.id);
    assert_eq!(read_all(&reader), old_records);
    let skipped_ids: Vec<SnapshotId> = skipped.iter().map(|(id, _)| *id).collect();
    assert_eq!(skipped_ids, vec![newest.id, middle.id], "newest first");
    assert!(skipped[0].1.contains("checksum mismatch"), "{}", skipped[0].1);
    assert!(skipped[1].1.contains("truncated"), "{}", skipped[1].1);
    assert_eq!(
        snapshot::list(dir.path()).unwrap(),
        vec![old.id, middle.id, newest.id],
        "nothing deleted"
    );

    // No valid snapshot at all: None, and scan still says why.
    flip(&old.path, 500, 0x01);
    assert!(snapshot::newest_valid(dir.path()).unwrap().is_none());
    let scan = snapshot::scan(dir.path()).unwrap();
    assert!(scan.newest.is_none());
    assert_eq!(scan.skipped.len(), 3);
    assert_eq!(snapshot::list(dir.path()).unwrap().len(), 3);
}

#[test]
fn list_is_sorted_and_ignores_partial_unrelated_and_malformed_files() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [
        id(500, 3),
        id(20, 1),
        id(500, 2),
        id(1_000_000_000_000, 7),
        id(0, 0),
        id(20, 2),
    ];
    for sid in ids {
        SnapshotWriter::create(dir.path(), sid, 0).unwrap().freeze().unwrap();
    }
    let _in_progress = SnapshotWriter::create(dir.path(), id(9000, 9), 0).unwrap();
    for junk in [
        "meta.properties",
        "00000000000000000600-0000000003.checkpoint.deleted",
        "600-3.checkpoint",
        "0000000000000000060x-0000000003.checkpoint",
        "00000000000000000700-0000000003.checkpoint.part",
    ] {
        fs::write(dir.path().join(junk), b"x").unwrap();
    }
    fs::create_dir(dir.path().join("sled")).unwrap();
    let mut expected = ids.to_vec();
    expected.sort();
    assert_eq!(snapshot::list(dir.path()).unwrap(), expected);
    assert_eq!(
        expected,
        vec![
            id(0, 0),
            id(20, 1),
            id(20, 2),
            id(500, 2),
            id(500, 3),
            id(1_000_000_000_000, 7)
        ]
    );
    assert!(snapshot::list(&dir.path().join("missing")).is_err());
}

#[test]
fn remove_partial_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _) = write_snapshot(dir.path(), 10, 1, 5, 10);
    let writer = SnapshotWriter::create(dir.path(), id(20, 1), 0).unwrap();
    // What a crash leaves: the writer's file outlives the process.
    std::mem::forget(writer);
    fs::write(
        dir.path().join("00000000000000000030-0000000001.checkpoint.part"),
        b"junk",
    )
    .unwrap();
    fs::write(dir.path().join("unrelated.part"), b"keep").unwrap();
    assert_eq!(snapshot::remove_partial(dir.path()).unwrap(), 2);
    assert_eq!(
        entries(dir.path()),
        vec![file_name(meta.id), "unrelated.part".to_string()]
    );
    assert_eq!(snapshot::remove_partial(dir.path()).unwrap(), 0);

    let reader = SnapshotReader::open(&meta.path).unwrap();
    assert!(snapshot::delete(dir.path(), meta.id).unwrap());
    assert!(!snapshot::delete(dir.path(), meta.id).unwrap(), "already gone");
    assert!(snapshot::list(dir.path()).unwrap().is_empty());
    // An open reader keeps serving a deleted snapshot.
    assert_eq!(reader.records().count(), 10);
    assert_eq!(reader.read_chunk(0, 100).unwrap().len(), 100);
}

#[test]
fn seek_lands_close_below_any_offset_without_reading_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // 40,000 records of 100 bytes in batches of 7: about 4 MiB.
    let n = 40_000;
    let (meta, records) = write_snapshot(dir.path(), n, 3, 7, 100);
    let reader = SnapshotReader::open(&meta.path).unwrap();
    for from in [0, 1, 6, 7, 8, 12_345, 20_000, 39_999, 39_998, 3, 25_000] {
        let (cursor, base) = reader.seek(from);
        assert!(
            base < from || cursor == reader.batches().cursor(),
            "{from}: base {base}"
        );
        let mut batches = reader.batches_from(cursor);
        let holder = loop {
            let at = batches.cursor();
            let batch = batches.next().expect("a batch holds it").unwrap();
            if batch.next_offset() > from {
                break (at, batch);
            }
        };
        let (at, batch) = holder;
        assert!(batch.base_offset <= from, "{from}: {batch:?}");
        assert_eq!(
            batch.records().unwrap()[(from - batch.base_offset) as usize],
            records[from as usize]
        );
        // A frame here is under 1 KiB: the scan is short, whatever `from`.
        let scanned = at.position() - cursor.position();
        assert!(
            scanned <= snapshot::SEEK_INDEX_INTERVAL_BYTES + 1024,
            "{from}: scanned {scanned} bytes"
        );
    }
    // Past the last record: a cursor from which nothing holds it.
    let (cursor, _) = reader.seek(n as i64 + 5);
    assert!(reader
        .batches_from(cursor)
        .all(|b| b.unwrap().next_offset() <= n as i64 + 5));
}

#[test]
fn read_chunk_serves_the_file_in_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _) = write_snapshot(dir.path(), 1000, 2, 50, 30);
    let reader = SnapshotReader::open(&meta.path).unwrap();
    let original = fs::read(&meta.path).unwrap();
    for max in [1, 7, 4096, usize::MAX] {
        let mut got = Vec::new();
        loop {
            let chunk = reader.read_chunk(got.len() as u64, max).unwrap();
            if chunk.is_empty() {
                break;
            }
            assert!(chunk.len() <= max.min(MAX_CHUNK_BYTES));
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, original, "max {max}");
    }
    assert!(reader.read_chunk(meta.size_bytes, 10).unwrap().is_empty());
    assert!(matches!(
        reader.read_chunk(meta.size_bytes + 1, 10),
        Err(SnapshotError::Invalid { .. })
    ));
}

/// Sends `bytes[from..]` to `installer` in chunks of `chunk`.
fn send(installer: &mut SnapshotInstaller, bytes: &[u8], from: usize, chunk: usize) {
    let mut pos = from;
    while pos < bytes.len() {
        let end = (pos + chunk).min(bytes.len());
        installer.write_chunk(pos as u64, &bytes[pos..end]).unwrap();
        pos = end;
        assert_eq!(installer.position(), pos as u64);
    }
}

#[test]
fn an_installer_rebuilds_a_snapshot_from_small_chunks() {
    let leader = tempfile::tempdir().unwrap();
    let follower = tempfile::tempdir().unwrap();
    let (meta, records) = write_snapshot(leader.path(), 500, 3, 20, 25);
    let served = SnapshotReader::open(&meta.path).unwrap();

    let mut installer = SnapshotInstaller::create(follower.path(), meta.id, served.size_bytes()).unwrap();
    assert_eq!((installer.id(), installer.total_size()), (meta.id, meta.size_bytes));
    while !installer.is_complete() {
        let chunk = served.read_chunk(installer.position(), 333).unwrap();
        installer.write_chunk(installer.position(), &chunk).unwrap();
    }
    assert!(
        snapshot::list(follower.path()).unwrap().is_empty(),
        "not installed before finish"
    );
    let installed = installer.finish().unwrap();
    assert_eq!(installed.id, meta.id);
    assert_eq!(installed.size_bytes, meta.size_bytes);
    assert_eq!(entries(follower.path()), vec![file_name(meta.id)]);
    assert_eq!(fs::read(&installed.path).unwrap(), fs::read(&meta.path).unwrap());
    let reader = SnapshotReader::open(&installed.path).unwrap();
    assert_eq!(read_all(&reader), records);
}

#[test]
fn an_installer_takes_8_mib_chunks_of_a_large_snapshot_and_resumes_from_its_position() {
    let leader = tempfile::tempdir().unwrap();
    let follower = tempfile::tempdir().unwrap();
    // ~22 MB: three chunks of at most 8 MiB.
    let (meta, records) = write_snapshot(leader.path(), 200_000, 5, 2_000, 100);
    assert!(
        meta.size_bytes > 2 * MAX_CHUNK_BYTES as u64,
        "{} bytes",
        meta.size_bytes
    );
    let served = SnapshotReader::open(&meta.path).unwrap();
    let original = fs::read(&meta.path).unwrap();

    let mut installer = SnapshotInstaller::create(follower.path(), meta.id, meta.size_bytes).unwrap();
    let first = served.read_chunk(0, usize::MAX).unwrap();
    assert_eq!(first.len(), MAX_CHUNK_BYTES, "a chunk is at most 8 MiB");
    installer.write_chunk(0, &first).unwrap();
    assert_eq!(installer.position(), MAX_CHUNK_BYTES as u64);

    // The response was lost and the request sent again: the same chunk
    // again is ignored, and so is any already-received part of it.
    installer.write_chunk(0, &first).unwrap();
    installer.write_chunk(100, &first[100..200]).unwrap();
    assert_eq!(installer.position(), MAX_CHUNK_BYTES as u64);
    // A chunk that overlaps what was received and goes further is taken.
    let overlap_from = MAX_CHUNK_BYTES - 1000;
    installer
        .write_chunk(overlap_from as u64, &original[overlap_from..MAX_CHUNK_BYTES + 5000])
        .unwrap();
    assert_eq!(installer.position(), MAX_CHUNK_BYTES as u64 + 5000);

    // A chunk past the position leaves a gap: refused, nothing changes.
    let gap_at = installer.position() + 1;
    let err = installer
        .write_chunk(gap_at, &original[gap_at as usize..gap_at as usize + 10])
        .unwrap_err();
    assert!(matches!(err, SnapshotError::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("gap"), "{err}");
    // A re-sent chunk that differs is an inconsistent transfer.
    let mut different = original[..10].to_vec();
    different[9] ^= 1;
    let err = installer.write_chunk(0, &different).unwrap_err();
    assert!(err.is_corrupt(), "{err}");
    assert!(err.to_string().contains("at byte 9"), "{err}");
    // A chunk past the announced size is refused.
    assert!(installer.write_chunk(meta.size_bytes - 1, &[0, 0]).is_err());
    assert_eq!(installer.position(), MAX_CHUNK_BYTES as u64 + 5000);

    // Resume from position() with 8 MiB requests.
    let mut requests = 0;
    while !installer.is_complete() {
        let chunk = served.read_chunk(installer.position(), MAX_CHUNK_BYTES).unwrap();
        assert!(chunk.len() <= MAX_CHUNK_BYTES);
        installer.write_chunk(installer.position(), &chunk).unwrap();
        requests += 1;
    }
    assert!(requests >= 2);
    let installed = installer.finish().unwrap();
    assert_eq!(fs::read(&installed.path).unwrap(), original);
    let reader = SnapshotReader::open(&installed.path).unwrap();
    assert_eq!(reader.record_count(), 200_000);
    assert_eq!(read_all(&reader), records);
}

#[test]
fn a_damaged_transfer_never_becomes_a_checkpoint() {
    let leader = tempfile::tempdir().unwrap();
    let (meta, _) = write_snapshot(leader.path(), 300, 2, 10, 30);
    let original = fs::read(&meta.path).unwrap();

    // One byte of one chunk damaged in transit.
    for at in [0, 30, original.len() / 2, original.len() - 5] {
        let follower = tempfile::tempdir().unwrap();
        let mut damaged = original.clone();
        damaged[at] ^= 0x20;
        let mut installer = SnapshotInstaller::create(follower.path(), meta.id, original.len() as u64).unwrap();
        send(&mut installer, &damaged, 0, 1024);
        let err = installer.finish().unwrap_err();
        assert!(err.is_corrupt(), "byte {at}: {err}");
        assert!(
            entries(follower.path()).is_empty(),
            "byte {at}: nothing installed, .part removed"
        );
    }

    // The bytes of another snapshot id.
    let follower = tempfile::tempdir().unwrap();
    let mut installer = SnapshotInstaller::create(follower.path(), id(301, 2), original.len() as u64).unwrap();
    send(&mut installer, &original, 0, 4096);
    let err = installer.finish().unwrap_err();
    assert!(err.to_string().contains("its name says"), "{err}");
    assert!(entries(follower.path()).is_empty());

    // An incomplete transfer.
    let mut installer = SnapshotInstaller::create(follower.path(), meta.id, original.len() as u64).unwrap();
    send(&mut installer, &original[..original.len() - 1], 0, 4096);
    let err = installer.finish().unwrap_err();
    assert!(err.to_string().contains("incomplete"), "{err}");
    assert!(entries(follower.path()).is_empty());

    // An abandoned transfer leaves nothing behind.
    let mut installer = SnapshotInstaller::create(follower.path(), meta.id, original.len() as u64).unwrap();
    installer.write_chunk(0, &original[..100]).unwrap();
    assert_eq!(entries(follower.path()).len(), 1);
    drop(installer);
    assert!(entries(follower.path()).is_empty());

    assert!(SnapshotInstaller::create(follower.path(), meta.id, MIN_FILE_BYTES - 1).is_err());
}

/// A small valid snapshot, written once: (file name, bytes).
fn sample() -> &'static (String, Vec<u8>) {
    static SAMPLE: OnceLock<(String, Vec<u8>)> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let (meta, _) = write_snapshot(dir.path(), 40, 3, 6, 12);
        (file_name(meta.id), fs::read(&meta.path).unwrap())
    })
}

/// Writes `bytes` under the sample's name in a new directory and opens it.
fn open_bytes(bytes: &[u8]) -> (tempfile::TempDir, PathBuf, Result<SnapshotReader, SnapshotError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(&sample().0);
    fs::write(&path, bytes).unwrap();
    let opened = SnapshotReader::open(&path);
    (dir, path, opened)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_open(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let (_dir, _, opened) = open_bytes(&bytes);
        prop_assert!(opened.is_err());
    }

    #[test]
    fn random_bytes_after_a_valid_prefix_never_open(cut in 0usize..400, tail in prop::collection::vec(any::<u8>(), 0..512)) {
        let (_, original) = sample();
        let mut bytes = original[..cut.min(original.len())].to_vec();
        bytes.extend_from_slice(&tail);
        let (_dir, _, opened) = open_bytes(&bytes);
        prop_assert!(opened.is_err() || bytes == *original);
    }

    #[test]
    fn truncations_never_open(len in 0usize..100_000) {
        let (_, original) = sample();
        let len = len % original.len();
        let (_dir, _, opened) = open_bytes(&original[..len]);
        let corrupt = matches!(opened, Err(SnapshotError::Corrupt { .. }));
        prop_assert!(corrupt);
    }

    #[test]
    fn flipped_bytes_never_open_nor_install(at in 0usize..100_000, mask in 1u8..=255) {
        let (name, original) = sample();
        let at = at % original.len();
        let mut bytes = original.clone();
        bytes[at] ^= mask;
        let (dir, path, opened) = open_bytes(&bytes);
        prop_assert!(matches!(opened, Err(SnapshotError::Corrupt { .. })), "byte {} ^ {:#x}", at, mask);
        fs::remove_file(&path).unwrap();

        let id = parse_name(name).unwrap();
        let mut installer = SnapshotInstaller::create(dir.path(), id, bytes.len() as u64).unwrap();
        for (i, chunk) in bytes.chunks(97).enumerate() {
            installer.write_chunk((i * 97) as u64, chunk).unwrap();
        }
        prop_assert!(installer.finish().is_err());
        prop_assert!(entries(dir.path()).is_empty());
    }
}

/// `cargo test --release --test snapshot_files -- --ignored --nocapture`
#[test]
#[ignore]
fn timing_of_one_million_100_byte_records() {
    const N: u64 = 1_000_000;
    const PER_BATCH: usize = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Record> = (0..N).map(|i| record(i, 100)).collect();

    let started = Instant::now();
    let mut writer = SnapshotWriter::create(dir.path(), id(N as i64, 1), 0).unwrap();
    for (k, chunk) in records.chunks(PER_BATCH).enumerate() {
        writer.append((k * PER_BATCH) as i64, 1, chunk).unwrap();
    }
    let meta = writer.freeze().unwrap();
    let write_ms = started.elapsed().as_secs_f64() * 1e3;

    let started = Instant::now();
    let reader = SnapshotReader::open(&meta.path).unwrap();
    let open_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut count = 0u64;
    for record in reader.records() {
        if let Record::Data(bytes) = record.unwrap() {
            count += bytes.len() as u64 / 100;
        }
    }
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    assert_eq!(count, N);
    println!(
        "1,000,000 records of 100 bytes in batches of {PER_BATCH}: {} bytes ({:.1} MiB), write + fsync + rename \
         {write_ms:.0} ms, load {load_ms:.0} ms (of which open/validate {open_ms:.0} ms)",
        meta.size_bytes,
        meta.size_bytes as f64 / (1 << 20) as f64
    );
}
