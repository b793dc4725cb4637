//! Replays the fuzz targets' committed corpora (`fuzz/corpus/<target>/`,
//! minimized with `cargo fuzz cmin`) through the same entry points the
//! fuzzers call (`kraft::fuzzing`): every input that once found something,
//! and the inputs that cover the decoders, run on every `cargo test`. A
//! panic here is a decoder that a peer, a client, a file or a config can
//! crash. `docs/FUZZING.md` says how to fuzz and what was found.
//!
//! `cargo test --test fuzz_corpus -- --ignored` writes the seed inputs
//! (`seed-*` files) the corpora started from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kraft::messages::client::{encode_frame_into, ClientFrame, ClientRequest, CLIENT_PROTOCOL_VERSION};
use kraft::messages::codec::{encode, encode_frame_into as encode_raft_frame};
use kraft::messages::{
    Batch, Body, Envelope, ErrorCode, FetchRequest, FetchResponse, RaftRequest, RaftResponse, Record, SnapshotId,
    VoteRequest,
};
use kraft::metadata::records::{FeatureLevelRecord, MetadataRecord, TopicRecord};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target)
}

#[test]
fn every_committed_fuzz_input_is_decoded_without_a_panic() {
    let mut counts = BTreeMap::new();
    for (target, run) in kraft::fuzzing::TARGETS {
        let dir = corpus_dir(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut count = 0;
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{target} panicked on {}", path.display());
            count += 1;
        }
        assert!(count > 0, "{target} has no corpus in {}", dir.display());
        counts.insert(target, count);
    }
    println!("replayed: {counts:?}");
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = corpus_dir(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
}

/// A frame's bytes after its 4-byte length prefix.
fn raft_frame(body: Body) -> Vec<u8> {
    let envelope = Envelope {
        version: 1,
        source_id: 2,
        correlation_id: 9,
        cluster_id: "fuzz".to_string(),
        body,
    };
    let mut out = Vec::new();
    encode_raft_frame(&envelope, &mut out).unwrap();
    out.split_off(4)
}

#[test]
#[ignore]
fn write_seed_corpora() {
    // Raft frames.
    let vote = RaftRequest::Vote(VoteRequest {
        epoch: 3,
        candidate_id: 2,
        last_epoch: 2,
        last_epoch_end_offset: 40,
        pre_vote: true,
    });
    write("raft_frame", "vote", &raft_frame(Body::Request(vote)));
    let fetch = RaftRequest::Fetch(FetchRequest {
        replica_id: 2,
        current_epoch: 3,
        fetch_offset: 10,
        last_fetched_epoch: 2,
        max_wait_ms: 500,
        max_bytes: 1 << 20,
    });
    write("raft_frame", "fetch", &raft_frame(Body::Request(fetch)));
    let batch = Batch::new(10, 3, &[Record::Data(b"hello".to_vec()), Record::NoOp]);
    let answer = RaftResponse::Fetch(FetchResponse {
        error: ErrorCode::None,
        epoch: 3,
        leader_id: Some(1),
        high_watermark: 11,
        log_start_offset: 0,
        diverging_epoch: None,
        snapshot_id: None,
        batches: vec![batch.clone()],
    });
    write("raft_frame", "fetch-answer", &raft_frame(Body::Response(answer)));
    write(
        "raft_frame",
        "read-index",
        &raft_frame(Body::Request(RaftRequest::ReadIndex)),
    );

    // Client frames.
    for (name, request) in [
        (
            "append",
            ClientRequest::Append {
                records: vec![serde_bytes::ByteBuf::from(b"a".to_vec())],
            },
        ),
        ("read", ClientRequest::Read { from: 0, max: 10 }),
        ("quorum", ClientRequest::Quorum),
        ("read-linearizable", ClientRequest::ReadLinearizable { from: 3, max: 1 }),
        (
            "operate",
            ClientRequest::Operate(kraft::node::Operation::DeleteTopic {
                name: "orders".to_string(),
            }),
        ),
    ] {
        let mut out = Vec::new();
        let frame = ClientFrame {
            version: CLIENT_PROTOCOL_VERSION,
            correlation_id: 5,
            body: request,
        };
        encode_frame_into(&frame, &mut out).unwrap();
        write("client_frame", name, &out[4..]);
    }

    // A snapshot file of the id the target names its file with.
    let dir = tempfile::tempdir().unwrap();
    let id = SnapshotId {
        end_offset: 10,
        epoch: 1,
    };
    let mut writer = kraft::storage::snapshot::SnapshotWriter::create(dir.path(), id, 0).unwrap();
    for base in (0..10).step_by(5) {
        let records: Vec<Record> = (base..base + 5)
            .map(|o| Record::Data(format!("r{o}").into_bytes()))
            .collect();
        writer.append(base, 1, &records).unwrap();
    }
    writer.freeze().unwrap();
    let file = std::fs::read(kraft::storage::snapshot::path_of(dir.path(), id)).unwrap();
    write("snapshot_file", "ten-records", &file);

    // A sled log value.
    write(
        "sled_value",
        "batch",
        &encode(&Batch::new(7, 1, &[Record::Data(b"x".to_vec())])),
    );

    // Metadata records.
    let feature = MetadataRecord::FeatureLevel(FeatureLevelRecord {
        name: "metadata.version".to_string(),
        feature_level: 1,
    });
    write("metadata_record", "feature-level", &feature.encode());
    let topic = MetadataRecord::Topic(TopicRecord {
        name: "orders".to_string(),
        topic_id: uuid::Uuid::from_u128(7),
    });
    write("metadata_record", "topic", &topic.encode());

    // HTTP bodies.
    for (name, body) in [
        ("append", r#"{"records": ["a", "b"]}"#),
        (
            "topic",
            r#"{"name": "orders", "partitions": 3, "replication_factor": 1, "configs": {"retention.ms": "1000"}}"#,
        ),
        ("assignments", r#"{"name": "orders", "assignments": [[1, 2], [2, 3]]}"#),
        (
            "register",
            r#"{"id": 1, "incarnation_id": "6f1c1d2e-0000-4000-8000-000000000001", "listeners": [{"name": "PLAINTEXT", "host": "h", "port": 9092}], "rack": "r1"}"#,
        ),
        (
            "heartbeat",
            r#"{"epoch": 5, "metadata_offset": 9, "want_fence": false, "want_shutdown": false}"#,
        ),
        (
            "configs",
            r#"{"set": {"cleanup.policy": "compact"}, "delete": ["retention.ms"]}"#,
        ),
        (
            "alter",
            r#"{"broker_id": 1, "broker_epoch": 5, "topics": [{"topic_id": "6f1c1d2e-0000-4000-8000-000000000001", "partitions": [{"partition": 0, "leader_epoch": 0, "partition_epoch": 0, "new_isr": [1]}]}]}"#,
        ),
        ("features", r#"{"metadata.version": 1}"#),
    ] {
        write("http_bodies", name, body.as_bytes());
    }

    // Config files.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    write(
        "config",
        "config.toml",
        &std::fs::read(root.join("config.toml")).unwrap(),
    );
    for example in ["node1.toml", "broker4.toml"] {
        write(
            "config",
            example,
            &std::fs::read(root.join("examples").join(example)).unwrap(),
        );
    }
    write(
        "config",
        "tokens",
        b"# tokens\nadmin admin-0123456789abcdef\nread read-0123456789abcdef\n",
    );
}
