//! The client protocol: a node started in-process with its client listener
//! (`kraft::api::client_server_here`), driven by `kraft::client::Client` and
//! by hand-made frames on a raw socket.
//!
//! Waits poll with a bound and never assert on timings.

mod ports;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use kraft::api::{client_server_here, ClientLimits, LocalServer};
use kraft::client::{Client, ClientError, Error};
use kraft::config::Config;
use kraft::messages::client::{
    decode_body, encode_frame_into, peek_header, ClientFrame, ClientRequest, ClientResponse, CLIENT_PROTOCOL_VERSION,
};
use kraft::messages::Record;
use kraft::node::{self, NodeHandle};
use serde_bytes::ByteBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest any condition is waited for.
const WAIT: Duration = Duration::from_secs(20);

/// A single voter on a free port with short timeouts; with `absent_peer`,
/// a second voter that never runs, so that no leader can be elected.
fn config(dir: &std::path::Path, absent_peer: bool) -> Config {
    let mut config = Config::default();
    let raft = ports::free_port();
    let mut voters = BTreeMap::from([(1, format!("127.0.0.1:{raft}"))]);
    if absent_peer {
        voters.insert(2, format!("127.0.0.1:{}", ports::free_port()));
    }
    config.node.cluster_id = "client-test".to_string();
    config.node.data_dir = dir.to_path_buf();
    config.listeners.raft = format!("127.0.0.1:{raft}").parse().unwrap();
    config.listeners.http = "127.0.0.1:0".parse().unwrap();
    config.quorum.voters = voters;
    config.quorum.election_timeout_ms = 200;
    config.quorum.fetch_timeout_ms = 400;
    config.quorum.election_backoff_max_ms = 200;
    config
}

struct Served {
    node: NodeHandle,
    server: LocalServer,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start(absent_peer: bool, limits: ClientLimits) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let node = node::start(config(dir.path(), absent_peer)).await.expect("node starts");
        let (server, addr) =
            client_server_here(node.clone(), "127.0.0.1:0".parse().unwrap(), limits).expect("client listener binds");
        Served {
            node,
            server,
            addr,
            _dir: dir,
        }
    }

    /// A single-node quorum that has elected itself.
    async fn leader(limits: ClientLimits) -> Served {
        let served = Served::start(false, limits).await;
        let deadline = tokio::time::Instant::now() + WAIT;
        while served.node.describe().await.unwrap().role != "leader" {
            assert!(tokio::time::Instant::now() < deadline, "no leader after {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        served
    }

    async fn stop(self) {
        self.server.stop().await;
        self.node.shutdown().await;
    }

    /// The data records committed so far, as text.
    async fn data_values(&self) -> Vec<String> {
        let page = self.node.read_committed(0, 10_000).await.unwrap();
        page.records
            .into_iter()
            .filter(|r| r.kind == "data")
            .filter_map(|r| r.value)
            .collect()
    }
}

fn default_limits() -> ClientLimits {
    ClientLimits::for_batch_bytes(kraft::messages::MAX_BATCH_BYTES)
}

fn frame(correlation_id: u64, body: &ClientRequest) -> Vec<u8> {
    let mut out = Vec::new();
    let frame = ClientFrame {
        version: CLIENT_PROTOCOL_VERSION,
        correlation_id,
        body: body.clone(),
    };
    encode_frame_into(&frame, &mut out).unwrap();
    out
}

fn append(values: &[&str]) -> ClientRequest {
    ClientRequest::Append {
        records: values.iter().map(|v| ByteBuf::from(v.as_bytes().to_vec())).collect(),
    }
}

/// Reads one answer: its correlation id and body; `None` at a clean end of
/// the stream.
async fn read_answer(stream: &mut TcpStream) -> Option<(u64, ClientResponse)> {
    let mut prefix = [0u8; 4];
    let read = tokio::time::timeout(WAIT, stream.read_exact(&mut prefix))
        .await
        .expect("an answer or the end of the stream within WAIT");
    if read.is_err() {
        return None;
    }
    let mut body = vec![0; u32::from_be_bytes(prefix) as usize];
    stream.read_exact(&mut body).await.expect("a whole answer");
    let header = peek_header(&body).expect("a header");
    assert_eq!(header.version, CLIENT_PROTOCOL_VERSION);
    Some((header.correlation_id, decode_body(&body).expect("an answer decodes")))
}

fn bad_request(answer: &ClientResponse) -> &str {
    match answer {
        ClientResponse::Error(ClientError::BadRequest(message)) => message,
        other => panic!("expected BadRequest, got {other:?}"),
    }
}

#[actix_rt::test]
async fn a_client_appends_records_that_commit_in_order_and_reads_the_quorum() {
    let served = Served::leader(default_limits()).await;
    let mut client = Client::connect(served.addr).await.unwrap();
    let first = client.append(vec![b"a".to_vec(), b"b".to_vec()]).await.unwrap();
    assert_eq!(first.last_offset, first.base_offset + 1);
    let second = client.append(vec![b"c".to_vec()]).await.unwrap();
    assert_eq!(second.base_offset, first.last_offset + 1);
    let status = client.quorum().await.unwrap();
    assert_eq!((status.node_id, status.role.as_str()), (1, "leader"));
    assert!(
        status.high_watermark > second.last_offset,
        "answered only once committed"
    );
    assert_eq!(served.data_values().await, ["a", "b", "c"]);
    served.stop().await;
}

#[actix_rt::test]
async fn a_client_reads_back_the_bytes_it_appended_with_the_control_records_between() {
    let served = Served::leader(default_limits()).await;
    let mut client = Client::connect(served.addr).await.unwrap();
    let binary = vec![0xff, 0x00, 0xfe, b'\n'];
    let appended = client.append(vec![binary.clone(), b"text".to_vec()]).await.unwrap();

    let page = client.read(0, 10_000).await.unwrap();
    assert_eq!(page.log_start_offset, 0);
    assert!(page.high_watermark > appended.last_offset);
    let offsets: Vec<i64> = page.records.iter().map(|r| r.offset).collect();
    assert_eq!(
        offsets,
        (0..page.high_watermark).collect::<Vec<_>>(),
        "contiguous from 0 to the high watermark"
    );
    assert!(
        matches!(page.records[0].record, Record::LeaderChange { leader_id: 1, .. }),
        "{:?}",
        page.records[0]
    );
    let data: Vec<&Record> = page
        .records
        .iter()
        .map(|r| &r.record)
        .filter(|r| matches!(r, Record::Data(_)))
        .collect();
    assert_eq!(data, [&Record::Data(binary.clone()), &Record::Data(b"text".to_vec())]);

    // From an offset, bounded by max; past the high watermark, nothing.
    let one = client.read(appended.base_offset, 1).await.unwrap();
    assert_eq!(one.records.len(), 1);
    assert_eq!(
        (one.records[0].offset, &one.records[0].record, one.records[0].epoch),
        (appended.base_offset, &Record::Data(binary), appended.epoch)
    );
    let past = client.read(page.high_watermark + 100, 10).await.unwrap();
    assert!(past.records.is_empty());
    // A negative offset is refused; the connection stays.
    match client.read(-1, 10).await {
        Err(Error::Node(ClientError::BadRequest(message))) => assert!(message.contains("from"), "{message}"),
        other => panic!("expected BadRequest, got {other:?}"),
    }
    assert_eq!(client.read(0, 0).await.unwrap().records, []);
    served.stop().await;
}

#[actix_rt::test]
async fn pipelined_requests_are_answered_in_order_and_bad_frames_do_not_close_the_connection() {
    let served = Served::leader(default_limits()).await;
    let mut stream = TcpStream::connect(served.addr).await.unwrap();
    let mut bytes = frame(1, &append(&["one"]));
    // Another protocol version.
    let mut other_version = frame(2, &append(&["never"]));
    other_version[4..6].copy_from_slice(&(CLIENT_PROTOCOL_VERSION + 1).to_be_bytes());
    bytes.extend(other_version);
    // A body that does not decode: a request variant that does not exist.
    let mut garbled = frame(3, &ClientRequest::Quorum);
    let variant_at = garbled.len() - 4;
    garbled[variant_at..].copy_from_slice(&99u32.to_be_bytes());
    bytes.extend(garbled);
    // No records.
    bytes.extend(frame(4, &ClientRequest::Append { records: Vec::new() }));
    // Shorter than a header.
    bytes.extend([0, 0, 0, 3, 0, 1, 0]);
    bytes.extend(frame(6, &append(&["two"])));
    stream.write_all(&bytes).await.unwrap();

    let (id, answer) = read_answer(&mut stream).await.unwrap();
    assert!(
        matches!((id, &answer), (1, ClientResponse::Appended(_))),
        "{id} {answer:?}"
    );
    let (id, answer) = read_answer(&mut stream).await.unwrap();
    assert_eq!(id, 2);
    assert!(bad_request(&answer).contains("version"), "{answer:?}");
    let (id, answer) = read_answer(&mut stream).await.unwrap();
    assert_eq!(id, 3);
    assert!(bad_request(&answer).contains("does not decode"), "{answer:?}");
    let (id, answer) = read_answer(&mut stream).await.unwrap();
    assert_eq!(id, 4);
    assert!(bad_request(&answer).contains("at least one record"), "{answer:?}");
    let (id, answer) = read_answer(&mut stream).await.unwrap();
    assert_eq!(id, 0, "a frame without a header is answered with id 0");
    assert!(bad_request(&answer).contains("header"), "{answer:?}");
    let (id, answer) = read_answer(&mut stream).await.unwrap();
    assert!(
        matches!((id, &answer), (6, ClientResponse::Appended(_))),
        "{id} {answer:?}"
    );
    assert_eq!(served.data_values().await, ["one", "two"]);
    served.stop().await;
}

#[actix_rt::test]
async fn a_frame_over_the_limit_is_refused_with_its_id_and_the_connection_closes_after_earlier_answers() {
    let limits = ClientLimits {
        max_frame_bytes: 1024,
        ..default_limits()
    };
    let served = Served::leader(limits).await;
    let mut stream = TcpStream::connect(served.addr).await.unwrap();
    let mut bytes = frame(1, &append(&["small"]));
    let big = "x".repeat(2000);
    bytes.extend(frame(2, &append(&[big.as_str()])));
    stream.write_all(&bytes).await.unwrap();
    let (id, answer) = read_answer(&mut stream).await.unwrap();
    assert!(
        matches!((id, &answer), (1, ClientResponse::Appended(_))),
        "{id} {answer:?}"
    );
    let (id, answer) = read_answer(&mut stream).await.unwrap();
    assert_eq!(id, 2);
    match answer {
        ClientResponse::Error(ClientError::PayloadTooLarge(message)) => {
            assert!(message.contains("1024"), "{message}")
        }
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    assert!(read_answer(&mut stream).await.is_none(), "the connection is closed");
    assert_eq!(served.data_values().await, ["small"]);

    // The length prefix alone first: the refusal waits for the header, to
    // carry the id the client waits for.
    let mut stream = TcpStream::connect(served.addr).await.unwrap();
    let late = frame(7, &append(&[big.as_str()]));
    stream.write_all(&late[..4]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream.write_all(&late[4..]).await.unwrap();
    let (id, answer) = read_answer(&mut stream).await.unwrap();
    assert!(
        matches!(
            (id, &answer),
            (7, ClientResponse::Error(ClientError::PayloadTooLarge(_)))
        ),
        "{id} {answer:?}"
    );

    // Through the client: the refusal, and the next request on a new
    // connection.
    let mut client = Client::connect(served.addr).await.unwrap();
    let refused = client.append(vec![vec![b'y'; 2000]]).await;
    assert!(
        matches!(refused, Err(Error::Node(ClientError::PayloadTooLarge(_)))),
        "{refused:?}"
    );
    client.append(vec![b"after".to_vec()]).await.unwrap();
    assert_eq!(served.data_values().await, ["small", "after"]);

    // A frame far larger than the socket's buffers: the client is still
    // writing it when the refusal goes out, and gets the refusal, not a
    // reset connection.
    let refused = client.append(vec![vec![b'z'; 16 << 20]]).await;
    assert!(
        matches!(refused, Err(Error::Node(ClientError::PayloadTooLarge(_)))),
        "{refused:?}"
    );
    assert_eq!(served.data_values().await, ["small", "after"]);
    served.stop().await;
}

#[actix_rt::test]
async fn without_a_leader_an_append_is_refused_not_leader_and_nothing_is_written() {
    let served = Served::start(true, default_limits()).await;
    let mut client = Client::connect(served.addr).await.unwrap();
    match client.append(vec![b"lost".to_vec()]).await {
        Err(Error::Node(ClientError::NotLeader { leader_id: None, .. })) => {}
        other => panic!("expected NotLeader without a leader, got {other:?}"),
    }
    // The connection stays usable.
    let status = client.quorum().await.unwrap();
    assert_ne!(status.role, "leader");
    assert!(served.data_values().await.is_empty());
    served.stop().await;
}

#[actix_rt::test]
async fn an_idle_connection_is_closed_and_the_client_opens_a_new_one() {
    let limits = ClientLimits {
        idle_timeout: Duration::from_millis(200),
        ..default_limits()
    };
    let served = Served::leader(limits).await;
    let mut stream = TcpStream::connect(served.addr).await.unwrap();
    assert!(read_answer(&mut stream).await.is_none(), "closed once idle");

    let mut client = Client::connect(served.addr).await.unwrap();
    client.append(vec![b"before".to_vec()]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The node closed the connection while it was idle: the client sees
    // that before it writes, and sends on a new connection (not into the
    // closed one, which would leave the outcome unknown).
    client.append(vec![b"after".to_vec()]).await.unwrap();
    assert_eq!(served.data_values().await, ["before", "after"]);
    served.stop().await;
}
