//! Entry points for the fuzz targets (`fuzz/`, a crate of its own built
//! with `cargo fuzz`) and for the test that replays their corpora on every
//! run (`tests/fuzz_corpus.rs`). Each takes arbitrary bytes, runs one
//! decoder that faces the outside on them, and must return whatever the
//! bytes: no panic, no hang, no allocation beyond the bytes' own bounds.
//! Where a decoder accepts, what it decoded must encode and decode to
//! itself.

use crate::messages::client::{self, ClientRequest, ClientResponse};
use crate::messages::codec;
use crate::metadata::records::MetadataRecord;

/// The largest frame the fuzz targets let the raft decoder take (the
/// transport's own bound is larger; a frame's bytes are all here anyway).
const MAX_FRAME_BYTES: u64 = 1 << 20;

/// A raft listener frame (after its length prefix).
pub fn raft_frame(data: &[u8]) {
    if let Ok(envelope) = codec::decode_frame(data, MAX_FRAME_BYTES) {
        let again = codec::encode(&envelope);
        let decoded = codec::decode_frame(&again, u64::MAX).expect("an encoded envelope decodes");
        assert_eq!(decoded, envelope, "a frame decodes to what it encodes");
        if let crate::messages::Body::Response(crate::messages::RaftResponse::Fetch(fetch)) = &envelope.body {
            for batch in &fetch.batches {
                // What a follower runs on every fetched batch.
                let _ = batch.verify() && batch.check_log_records().is_ok();
            }
        }
    }
}

/// A client protocol frame (after its length prefix), as a request the
/// listener reads and as an answer a client reads.
pub fn client_frame(data: &[u8]) {
    let _ = client::peek_header(data);
    if let Ok(request) = client::decode_body::<ClientRequest>(data) {
        let frame = client::ClientFrame {
            version: client::CLIENT_PROTOCOL_VERSION,
            correlation_id: 0,
            body: request.clone(),
        };
        let mut out = Vec::new();
        client::encode_frame_into(&frame, &mut out).expect("a decoded request encodes");
        let again = client::decode_body::<ClientRequest>(&out[4..]).expect("an encoded request decodes");
        assert_eq!(again, request, "a request decodes to what it encodes");
    }
    let _ = client::decode_body::<ClientResponse>(data);
}

/// A snapshot file: validated as a node validates one at start or after a
/// transfer, then read whole if it passes.
pub fn snapshot_file(data: &[u8]) {
    let Ok(dir) = tempfile::tempdir() else { return };
    let id = crate::messages::SnapshotId {
        end_offset: 10,
        epoch: 1,
    };
    let path = crate::storage::snapshot::path_of(dir.path(), id);
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(reader) = crate::storage::snapshot::SnapshotReader::open(&path) {
        for record in reader.records() {
            if record.is_err() {
                break;
            }
        }
        let _ = reader.read_chunk(0, 1 << 16);
    }
}

/// A value of sled's `log` tree, as a store reads it back.
pub fn sled_value(data: &[u8]) {
    let key = 7i64.to_be_bytes();
    let _ = crate::storage::sled_store::decode_log_value(&key, data);
}

/// A metadata record's framing and body, as replay decodes it.
pub fn metadata_record(data: &[u8]) {
    if let Ok(record) = MetadataRecord::decode(data) {
        let again = MetadataRecord::decode(&record.encode()).expect("an encoded record decodes");
        assert_eq!(again, record, "a record decodes to what it encodes");
    }
}

/// The JSON bodies of the HTTP API's writes.
pub fn http_bodies(data: &[u8]) {
    crate::api::fuzz_bodies(data);
}

/// A config file, and the same text as a tokens file
/// (`security.tokens_file`).
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::config::Config::from_toml_str(text, &[]);
        if let Ok(tokens) = crate::api::Tokens::parse(text) {
            let _ = tokens.scope_of(data);
        }
    }
}

/// A target's name and entry point.
pub type Target = (&'static str, fn(&[u8]));

/// Every target by name, as `fuzz/fuzz_targets/` names them.
pub const TARGETS: [Target; 7] = [
    ("raft_frame", raft_frame),
    ("client_frame", client_frame),
    ("snapshot_file", snapshot_file),
    ("sled_value", sled_value),
    ("metadata_record", metadata_record),
    ("http_bodies", http_bodies),
    ("config", config),
];
