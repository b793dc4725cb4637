//! The client protocol: a node started in-process with its client listener
//! (`kraft::api::client_server_here`), driven by `kraft::client::Client` and
//! by hand-made frames on a raw socket.
//!
//! Waits poll with a bound and never assert on timings.

mod ports;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kraft::api::{client_server_here, ApiSecurity, ClientLimits, LocalServer, Tokens};
use kraft::client::{Client, ClientError, Error, Producer, ProducerOptions};
use kraft::config::Config;
use kraft::messages::client::{
    decode_body, encode_frame_into, peek_header, ClientFrame, ClientRequest, ClientResponse, CLIENT_PROTOCOL_VERSION,
};
use kraft::messages::Record;
use kraft::node::{self, Appended, NodeHandle};
use serde_bytes::ByteBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longest any condition is waited for.
const WAIT: Duration = Duration::from_secs(20);

/// A single voter on a free port with short timeouts; with `absent_peer`,
/// a second voter that never runs, so that no leader can be elected.
fn config(dir: &std::path::Path, absent_peer: bool) -> Config {
    let mut config = Config::default();
    config.node.state_machine = kraft::config::StateMachineKind::Log;
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
        Served::start_with(absent_peer, limits, |_| {}).await
    }

    async fn start_with(absent_peer: bool, limits: ClientLimits, change: impl FnOnce(&mut Config)) -> Served {
        Served::start_with_tokens(absent_peer, limits, change, None).await
    }

    async fn start_with_tokens(
        absent_peer: bool,
        limits: ClientLimits,
        change: impl FnOnce(&mut Config),
        tokens: Option<Arc<Tokens>>,
    ) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path(), absent_peer);
        change(&mut config);
        let node = node::start(config).await.expect("node starts");
        let (server, addr) = client_server_here(
            node.clone(),
            "127.0.0.1:0".parse().unwrap(),
            limits,
            ApiSecurity { tokens, tls: None },
        )
        .expect("client listener binds");
        Served {
            node,
            server,
            addr,
            _dir: dir,
        }
    }

    /// A single-node quorum that has elected itself.
    async fn leader(limits: ClientLimits) -> Served {
        Served::leader_with(limits, |_| {}).await
    }

    async fn leader_with(limits: ClientLimits, change: impl FnOnce(&mut Config)) -> Served {
        Served::leader_with_tokens(limits, change, None).await
    }

    async fn leader_with_tokens(
        limits: ClientLimits,
        change: impl FnOnce(&mut Config),
        tokens: Option<Arc<Tokens>>,
    ) -> Served {
        let served = Served::start_with_tokens(false, limits, change, tokens).await;
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
    read_body(stream).await
}

/// Reads one request, as a stand-in node: its correlation id and body;
/// `None` at the end of the stream.
async fn read_request(stream: &mut TcpStream) -> Option<(u64, ClientRequest)> {
    read_body(stream).await
}

/// Writes an answer, as a stand-in node.
async fn answer(stream: &mut TcpStream, correlation_id: u64, body: ClientResponse) {
    let mut out = Vec::new();
    let frame = ClientFrame {
        version: CLIENT_PROTOCOL_VERSION,
        correlation_id,
        body,
    };
    encode_frame_into(&frame, &mut out).unwrap();
    stream.write_all(&out).await.unwrap();
}

fn appended_at(offset: i64) -> ClientResponse {
    ClientResponse::Appended(Appended {
        base_offset: offset,
        last_offset: offset,
        epoch: 1,
    })
}

async fn read_body<B: serde::de::DeserializeOwned>(stream: &mut TcpStream) -> Option<(u64, B)> {
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
    Some((header.correlation_id, decode_body(&body).expect("the frame decodes")))
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

#[actix_rt::test]
async fn a_producer_commits_the_appends_of_many_tasks_over_one_connection() {
    let served = Served::leader(default_limits()).await;
    for options in [
        ProducerOptions::default(),
        // Every append alone: more than a connection may have in flight,
        // the rest wait their turn.
        ProducerOptions {
            max_batch_bytes: 0,
            ..ProducerOptions::default()
        },
    ] {
        let producer = Producer::connect_with(served.addr, options).await.unwrap();
        let outcomes = outcomes_of(spawn_appends(&producer, 300)).await;
        let page = served.node.read_committed(0, 10_000).await.unwrap();
        let values: BTreeMap<i64, String> = page
            .records
            .into_iter()
            .filter_map(|r| Some((r.offset, r.value?)))
            .collect();
        // Each task's record is where its answer says.
        for (task, outcome) in outcomes.into_iter().enumerate() {
            let appended = outcome.expect("every append commits");
            assert_eq!(appended.base_offset, appended.last_offset);
            assert_eq!(values[&appended.base_offset], format!("r{task}"), "{options:?}");
        }
    }
    assert_eq!(served.data_values().await.len(), 600);
    served.stop().await;
}

/// A producer that sends every append alone (one frame each), connected
/// to a stand-in node, and that node's end of the connection.
async fn stand_in_node() -> (Producer, TcpListener, TcpStream) {
    let alone = ProducerOptions {
        max_batch_bytes: 0,
        ..ProducerOptions::default()
    };
    stand_in_node_with(alone).await
}

async fn stand_in_node_with(options: ProducerOptions) -> (Producer, TcpListener, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let producer = Producer::connect_with(listener.local_addr().unwrap(), options)
        .await
        .unwrap();
    let (node, _) = listener.accept().await.unwrap();
    (producer, listener, node)
}

/// Reads frames as a stand-in node until the records of `appends` appends
/// of [`spawn_appends`] came: each frame's correlation id and the tasks
/// whose records it carries, in order.
async fn read_batches(node: &mut TcpStream, appends: usize) -> Vec<(u64, Vec<usize>)> {
    let mut batches = Vec::new();
    let mut seen = 0;
    while seen < appends {
        let (id, request) = read_request(node).await.expect("a request");
        let ClientRequest::Append { records } = request else {
            panic!("not an append: {request:?}");
        };
        let tasks: Vec<usize> = records
            .iter()
            .map(|r| {
                String::from_utf8(r.to_vec()).unwrap()[1..]
                    .parse()
                    .expect("a record r<index>")
            })
            .collect();
        seen += tasks.len();
        batches.push((id, tasks));
    }
    batches
}

fn appended_range(base_offset: i64, records: usize) -> ClientResponse {
    ClientResponse::Appended(Appended {
        base_offset,
        last_offset: base_offset + records as i64 - 1,
        epoch: 1,
    })
}

/// Answers `batches` in order, each as appended at the offsets after the
/// one before, the first at `first`; returns the offset after the last.
async fn answer_appended(node: &mut TcpStream, batches: &[(u64, Vec<usize>)], first: i64) -> i64 {
    let mut next_offset = first;
    for (id, tasks) in batches {
        answer(node, *id, appended_range(next_offset, tasks.len())).await;
        next_offset += tasks.len() as i64;
    }
    next_offset
}

fn spawn_appends(producer: &Producer, n: usize) -> Vec<tokio::task::JoinHandle<Result<Appended, Error>>> {
    (0..n)
        .map(|i| {
            let producer = producer.clone();
            tokio::spawn(async move { producer.append(vec![format!("r{i}").into_bytes()]).await })
        })
        .collect()
}

async fn outcomes_of(appends: Vec<tokio::task::JoinHandle<Result<Appended, Error>>>) -> Vec<Result<Appended, Error>> {
    let mut outcomes = Vec::new();
    for append in appends {
        outcomes.push(
            tokio::time::timeout(WAIT, append)
                .await
                .expect("an outcome within WAIT")
                .unwrap(),
        );
    }
    outcomes
}

/// One append, which must come on a new connection to the stand-in
/// node and commit at `offset`.
async fn append_on_a_new_connection(producer: &Producer, listener: &TcpListener, offset: i64) {
    let next = spawn_appends(producer, 1);
    let (mut node, _) = tokio::time::timeout(WAIT, listener.accept()).await.unwrap().unwrap();
    let (id, _) = read_request(&mut node).await.expect("a request on the new connection");
    answer(&mut node, id, appended_at(offset)).await;
    assert_eq!(outcomes_of(next).await[0].as_ref().unwrap().base_offset, offset);
}

/// Reads `n` appends of [`spawn_appends`] as a stand-in node: the
/// correlation id of each and the index of the task that made it (from its
/// record, `r<index>`).
async fn read_appends(node: &mut TcpStream, n: usize) -> Vec<(u64, usize)> {
    let mut appends = Vec::new();
    for _ in 0..n {
        let (id, request) = read_request(node).await.expect("a request");
        let ClientRequest::Append { records } = request else {
            panic!("not an append: {request:?}");
        };
        let record = String::from_utf8(records[0].to_vec()).unwrap();
        appends.push((id, record[1..].parse().expect("a record r<index>")));
    }
    appends
}

#[actix_rt::test]
async fn a_producer_sends_appends_without_waiting_for_the_answers_of_those_before() {
    let (producer, _listener, mut node) = stand_in_node().await;
    let appends = spawn_appends(&producer, 8);
    // All eight arrive before any is answered: a producer that waited for
    // each answer would send only the first.
    let sent = read_appends(&mut node, 8).await;
    assert!(
        sent.windows(2).all(|w| w[0].0 < w[1].0),
        "correlation ids rise: {sent:?}"
    );
    // Each answered with its task's index as offset: each task must get
    // its own answer.
    for &(id, task) in &sent {
        answer(&mut node, id, appended_at(task as i64)).await;
    }
    for (task, outcome) in outcomes_of(appends).await.into_iter().enumerate() {
        assert_eq!(outcome.unwrap().base_offset, task as i64);
    }
}

#[actix_rt::test]
async fn when_its_connection_fails_a_producer_fails_the_unanswered_appends_and_reconnects_for_the_next() {
    let (producer, listener, mut node) = stand_in_node().await;
    let appends = spawn_appends(&producer, 3);
    let sent = read_appends(&mut node, 3).await;
    answer(&mut node, sent[0].0, appended_at(0)).await;
    drop(node);
    let outcomes = outcomes_of(appends).await;
    assert!(outcomes[sent[0].1].is_ok(), "{outcomes:?}");
    // Sent whole and not answered: the outcome is unknown.
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| matches!(o, Err(Error::NoAnswer { .. })))
            .count(),
        2,
        "{outcomes:?}"
    );

    append_on_a_new_connection(&producer, &listener, 1).await;
}

#[actix_rt::test]
async fn after_a_refusal_as_too_large_a_producer_sends_what_followed_again_on_a_new_connection() {
    let (producer, listener, mut node) = stand_in_node().await;
    let appends = spawn_appends(&producer, 3);
    let sent = read_appends(&mut node, 3).await;
    // A node that refuses a frame as too large takes nothing sent after
    // it and closes the connection; this one leaves that to the producer.
    let refusal = ClientError::PayloadTooLarge("too large".to_owned());
    answer(&mut node, sent[0].0, ClientResponse::Error(refusal.clone())).await;
    assert!(
        read_request(&mut node).await.is_none(),
        "the producer closed the connection"
    );
    let (mut node, _) = tokio::time::timeout(WAIT, listener.accept()).await.unwrap().unwrap();
    let again = read_appends(&mut node, 2).await;
    let tasks: Vec<usize> = again.iter().map(|(_, task)| *task).collect();
    assert_eq!(tasks, [sent[1].1, sent[2].1], "the two that followed, in order");
    for (offset, (id, _)) in again.iter().enumerate() {
        answer(&mut node, *id, appended_at(offset as i64)).await;
    }
    let outcomes = outcomes_of(appends).await;
    assert!(
        matches!(&outcomes[sent[0].1], Err(Error::Node(e)) if *e == refusal),
        "{outcomes:?}"
    );
    assert!(
        outcomes[sent[1].1].is_ok() && outcomes[sent[2].1].is_ok(),
        "{outcomes:?}"
    );
}

#[actix_rt::test]
async fn a_batch_refused_as_too_large_is_sent_again_one_append_at_a_time() {
    let (producer, listener, mut node) = stand_in_node_with(ProducerOptions::default()).await;
    let appends = spawn_appends(&producer, 4);
    let batches = read_batches(&mut node, 4).await;
    let (id, tasks) = &batches[0];
    assert!(tasks.len() > 1, "{batches:?}");
    let refusal = ClientError::PayloadTooLarge("a node with a small log.max_batch_bytes".to_owned());
    answer(&mut node, *id, ClientResponse::Error(refusal)).await;
    // The node closes the connection after refusing a frame as too large:
    // everything comes again on a new one, each append alone.
    let (mut node, _) = tokio::time::timeout(WAIT, listener.accept()).await.unwrap().unwrap();
    let again = read_batches(&mut node, 4).await;
    assert_eq!(again.len(), 4, "one frame each: {again:?}");
    let mut expected = BTreeMap::new();
    for (offset, (id, tasks)) in again.iter().enumerate() {
        answer(&mut node, *id, appended_at(offset as i64)).await;
        expected.insert(tasks[0], offset as i64);
    }
    for (task, outcome) in outcomes_of(appends).await.into_iter().enumerate() {
        assert_eq!(outcome.unwrap().base_offset, expected[&task]);
    }
}

#[actix_rt::test]
async fn a_batch_rejected_is_sent_again_one_append_at_a_time_and_later_batches_are_smaller() {
    let (producer, _listener, mut node) = stand_in_node_with(ProducerOptions::default()).await;
    let appends = spawn_appends(&producer, 4);
    let batches = read_batches(&mut node, 4).await;
    assert!(batches[0].1.len() > 1, "{batches:?}");
    let rejected = ClientError::Rejected("more than a batch holds".to_owned());
    for (id, _) in &batches {
        answer(&mut node, *id, ClientResponse::Error(rejected.clone())).await;
    }
    // Alone, on the same connection: the first is rejected again, the
    // others taken.
    let again = read_batches(&mut node, 4).await;
    assert_eq!(again.len(), 4, "one frame each: {again:?}");
    answer(&mut node, again[0].0, ClientResponse::Error(rejected.clone())).await;
    for (offset, (id, _)) in again.iter().enumerate().skip(1) {
        answer(&mut node, *id, appended_at(offset as i64)).await;
    }
    let outcomes = outcomes_of(appends).await;
    assert!(
        matches!(&outcomes[again[0].1[0]], Err(Error::Node(e)) if *e == rejected),
        "{outcomes:?}"
    );
    assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 3, "{outcomes:?}");
    // Batches now stay below half the rejected one's size.
    let (first_bytes, first_records) = (batches[0].1.len() * 14, batches[0].1.len());
    let later = spawn_appends(&producer, 8);
    let batches = read_batches(&mut node, 8).await;
    assert!(
        batches
            .iter()
            .all(|(_, tasks)| tasks.len() * 14 <= first_bytes / 2 + 14),
        "{batches:?} after a refused batch of {first_records}"
    );
    answer_appended(&mut node, &batches, 10).await;
    assert!(outcomes_of(later).await.iter().all(Result::is_ok));
}

#[actix_rt::test]
async fn an_answer_for_another_request_fails_a_producers_appends_as_a_protocol_error() {
    let (producer, _listener, mut node) = stand_in_node().await;
    let appends = spawn_appends(&producer, 2);
    read_appends(&mut node, 2).await;
    answer(&mut node, 999, appended_at(0)).await;
    let outcomes = outcomes_of(appends).await;
    assert!(
        outcomes.iter().all(|o| matches!(o, Err(Error::Protocol { .. }))),
        "{outcomes:?}"
    );
}

#[actix_rt::test]
async fn an_append_not_written_whole_when_the_connection_fails_is_not_sent() {
    let (producer, _listener, node) = stand_in_node().await;
    // Far more than the two sockets' buffers hold, to a node that reads
    // nothing and closes.
    let large = producer.clone();
    let append = tokio::spawn(async move { large.append(vec![vec![b'x'; 64 << 20]]).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(node);
    let outcome = outcomes_of(vec![append]).await.remove(0);
    assert!(matches!(outcome, Err(Error::NotSent { .. })), "{outcome:?}");
}

#[actix_rt::test]
async fn a_producer_whose_idle_connection_the_node_closed_opens_a_new_one() {
    let limits = ClientLimits {
        idle_timeout: Duration::from_millis(200),
        ..default_limits()
    };
    let served = Served::leader(limits).await;
    let producer = Producer::connect(served.addr).await.unwrap();
    producer.append(vec![b"before".to_vec()]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    producer.append(vec![b"after".to_vec()]).await.unwrap();
    assert_eq!(served.data_values().await, ["before", "after"]);
    served.stop().await;
}

#[actix_rt::test]
async fn when_the_node_cannot_be_reached_a_producers_queued_appends_fail_as_not_sent() {
    let (producer, listener, node) = stand_in_node().await;
    drop(listener);
    drop(node);
    // Let the producer see the close (an append sent meanwhile would end
    // NoAnswer: written whole before the close was seen).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let outcomes = outcomes_of(spawn_appends(&producer, 5)).await;
    assert!(
        outcomes.iter().all(|o| matches!(o, Err(Error::NotSent { .. }))),
        "{outcomes:?}"
    );
}

#[actix_rt::test]
async fn a_producer_takes_a_node_that_does_not_answer_in_time_for_unreachable_and_reconnects() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let options = ProducerOptions {
        answer_timeout: Duration::from_millis(300),
        ..ProducerOptions::default()
    };
    let producer = Producer::connect_with(listener.local_addr().unwrap(), options)
        .await
        .unwrap();
    let (mut silent, _) = listener.accept().await.unwrap();
    let appends = spawn_appends(&producer, 2);
    read_batches(&mut silent, 2).await;
    let outcomes = outcomes_of(appends).await;
    assert!(
        outcomes.iter().all(|o| matches!(o, Err(Error::NoAnswer { .. }))),
        "{outcomes:?}"
    );
    assert!(
        read_request(&mut silent).await.is_none(),
        "the producer closed the connection"
    );

    append_on_a_new_connection(&producer, &listener, 7).await;
}

#[actix_rt::test]
async fn a_producer_closes_its_connection_once_every_handle_is_dropped() {
    let (producer, _listener, mut node) = stand_in_node().await;
    drop(producer);
    assert!(read_request(&mut node).await.is_none());
}

#[actix_rt::test]
async fn appends_waiting_together_go_out_as_one_batch_and_each_caller_gets_its_own_offsets() {
    let (producer, _listener, mut node) = stand_in_node_with(ProducerOptions::default()).await;
    let appends = spawn_appends(&producer, 20);
    let batches = read_batches(&mut node, 20).await;
    assert!(batches.len() < 20, "appends made at once are batched: {batches:?}");
    answer_appended(&mut node, &batches, 100).await;
    // The batches' records took consecutive offsets, each task's its own.
    let expected: BTreeMap<usize, i64> = batches
        .iter()
        .flat_map(|(_, tasks)| tasks.iter().copied())
        .zip(100..)
        .collect();
    for (task, outcome) in outcomes_of(appends).await.into_iter().enumerate() {
        let appended = outcome.unwrap();
        assert_eq!(
            (appended.base_offset, appended.last_offset),
            (expected[&task], expected[&task])
        );
    }
}

#[actix_rt::test]
async fn a_batch_holds_at_most_max_batch_bytes() {
    // r0..r9: 2 bytes each, 14 as a batch stores them: three fit in 42.
    let options = ProducerOptions {
        max_batch_bytes: 42,
        ..ProducerOptions::default()
    };
    let (producer, _listener, mut node) = stand_in_node_with(options).await;
    let appends = spawn_appends(&producer, 10);
    let batches = read_batches(&mut node, 10).await;
    assert!(batches.iter().all(|(_, tasks)| tasks.len() <= 3), "{batches:?}");
    assert!(batches.iter().any(|(_, tasks)| tasks.len() == 3), "{batches:?}");
    answer_appended(&mut node, &batches, 0).await;
    assert!(outcomes_of(appends).await.iter().all(Result::is_ok));
}

#[actix_rt::test]
async fn an_answer_for_another_number_of_records_than_a_batch_holds_is_a_protocol_error() {
    let (producer, _listener, mut node) = stand_in_node_with(ProducerOptions::default()).await;
    let appends = spawn_appends(&producer, 2);
    for (id, tasks) in read_batches(&mut node, 2).await {
        answer(&mut node, id, appended_range(0, tasks.len() + 1)).await;
    }
    let outcomes = outcomes_of(appends).await;
    assert!(
        outcomes.iter().all(|o| matches!(o, Err(Error::Protocol { .. }))),
        "{outcomes:?}"
    );
}

#[actix_rt::test]
async fn a_producer_finds_its_way_to_a_node_whose_batches_are_smaller_than_its_own() {
    // 2 KiB batches, 6 KiB frames: the producer's first batches of 100
    // appends of 100 bytes are refused, as too large or Rejected, and
    // sent again alone; later ones are smaller.
    let limits = ClientLimits::for_batch_bytes(2048);
    let served = Served::leader_with(limits, |config| config.log.max_batch_bytes = 2048).await;
    let producer = Producer::connect(served.addr).await.unwrap();
    for round in 0..3 {
        let appends: Vec<_> = (0..100)
            .map(|i| {
                let producer = producer.clone();
                tokio::spawn(async move { producer.append(vec![format!("{round}-{i:0>96}").into_bytes()]).await })
            })
            .collect();
        for outcome in outcomes_of(appends).await {
            outcome.expect("every append commits");
        }
    }
    assert_eq!(served.data_values().await.len(), 300);
    served.stop().await;
}

#[actix_rt::test]
async fn batches_rejected_in_answers_read_apart_are_sent_again_in_the_order_they_were_made() {
    // Two records a batch, to have several batches.
    let options = ProducerOptions {
        max_batch_bytes: 28,
        ..ProducerOptions::default()
    };
    let (producer, _listener, mut node) = stand_in_node_with(options).await;
    let appends = spawn_appends(&producer, 20);
    let batches = read_batches(&mut node, 20).await;
    let several: Vec<usize> = (0..batches.len()).filter(|&i| batches[i].1.len() > 1).collect();
    assert!(several.len() >= 2, "{batches:?}");
    let (x, y) = (several[0], several[1]);
    // Long refusals, so that the producer reads them in separate turns.
    let rejected = ClientResponse::Error(ClientError::Rejected("z".repeat(40_000)));
    let mut out = Vec::new();
    let mut next_offset = 0;
    for (i, (id, tasks)) in batches.iter().enumerate().take(y + 1) {
        let body = if i == x || i == y {
            rejected.clone()
        } else {
            next_offset += tasks.len() as i64;
            appended_range(next_offset - tasks.len() as i64, tasks.len())
        };
        let frame = ClientFrame {
            version: CLIENT_PROTOCOL_VERSION,
            correlation_id: *id,
            body,
        };
        encode_frame_into(&frame, &mut out).unwrap();
    }
    node.write_all(&out).await.unwrap();
    let expected: Vec<usize> = batches[x].1.iter().chain(&batches[y].1).copied().collect();
    let again: Vec<usize> = read_batches(&mut node, expected.len())
        .await
        .into_iter()
        .flat_map(|(_, tasks)| tasks)
        .collect();
    assert_eq!(again, expected, "sent again in the order they were made");
    drop(appends);
}

#[actix_rt::test]
async fn a_batch_whose_outcome_is_unknown_is_not_sent_again() {
    let (producer, _listener, mut node) = stand_in_node_with(ProducerOptions::default()).await;
    let appends = spawn_appends(&producer, 4);
    let batches = read_batches(&mut node, 4).await;
    assert!(batches[0].1.len() > 1, "{batches:?}");
    let unknown = ClientError::OutcomeUnknown("leadership lost".to_owned());
    for (id, _) in &batches {
        answer(&mut node, *id, ClientResponse::Error(unknown.clone())).await;
    }
    let outcomes = outcomes_of(appends).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Err(Error::Node(e)) if *e == unknown)),
        "{outcomes:?}"
    );
    drop(producer);
    assert!(read_request(&mut node).await.is_none(), "nothing sent again");
}

#[actix_rt::test]
async fn a_rejected_batch_no_larger_than_one_taken_leaves_the_batches_as_they_were() {
    let (producer, _listener, mut node) = stand_in_node_with(ProducerOptions::default()).await;
    let taken = spawn_appends(&producer, 4);
    let batches = read_batches(&mut node, 4).await;
    let next_offset = answer_appended(&mut node, &batches, 0).await;
    assert!(outcomes_of(taken).await.iter().all(Result::is_ok));
    // As large as one taken: not refused for its size (a full log).
    let rejected = spawn_appends(&producer, 4);
    let batches = read_batches(&mut node, 4).await;
    assert_eq!(batches.len(), 1, "{batches:?}");
    let full = ClientError::Rejected("the log is full".to_owned());
    answer(&mut node, batches[0].0, ClientResponse::Error(full.clone())).await;
    for (id, _) in read_batches(&mut node, 4).await {
        answer(&mut node, id, ClientResponse::Error(full.clone())).await;
    }
    assert!(outcomes_of(rejected).await.iter().all(|o| o.is_err()));
    let later = spawn_appends(&producer, 8);
    let batches = read_batches(&mut node, 8).await;
    assert_eq!(batches.len(), 1, "batches as large as before: {batches:?}");
    answer(&mut node, batches[0].0, appended_range(next_offset, 8)).await;
    assert!(outcomes_of(later).await.iter().all(Result::is_ok));
}

#[actix_rt::test]
async fn an_answer_after_a_refusal_as_too_large_fails_the_rest_as_a_protocol_error_and_sends_nothing_again() {
    let (producer, _listener, mut node) = stand_in_node().await;
    let appends = spawn_appends(&producer, 3);
    let sent = read_appends(&mut node, 3).await;
    // A node that misbehaves: it answers a frame sent after the refused one.
    let mut out = Vec::new();
    for (id, body) in [
        (
            sent[0].0,
            ClientResponse::Error(ClientError::PayloadTooLarge("too large".to_owned())),
        ),
        (sent[1].0, appended_at(0)),
    ] {
        let frame = ClientFrame {
            version: CLIENT_PROTOCOL_VERSION,
            correlation_id: id,
            body,
        };
        encode_frame_into(&frame, &mut out).unwrap();
    }
    node.write_all(&out).await.unwrap();
    let outcomes = outcomes_of(appends).await;
    assert!(
        matches!(&outcomes[sent[0].1], Err(Error::Node(ClientError::PayloadTooLarge(_)))),
        "{outcomes:?}"
    );
    for (_, task) in &sent[1..] {
        assert!(matches!(&outcomes[*task], Err(Error::Protocol { .. })), "{outcomes:?}");
    }
}

#[actix_rt::test]
async fn controller_operations_run_over_the_client_protocol_with_kafkas_error_names() {
    use kraft::config::{NodeRole, StateMachineKind};
    use kraft::metadata::controller::{BrokerRegistrationRequest, NewTopic, TopicLayout};
    use kraft::node::Operation;

    let served = Served::leader_with(default_limits(), |config| {
        config.node.state_machine = StateMachineKind::Metadata;
        config.node.roles = vec![NodeRole::Controller];
    })
    .await;
    let mut client = Client::connect(served.addr).await.unwrap();
    let registration = Operation::RegisterBroker(BrokerRegistrationRequest {
        broker_id: 1,
        incarnation_id: uuid::Uuid::new_v4(),
        listeners: Vec::new(),
        rack: None,
        features: Vec::new(),
    });
    // The controller is active once replay reached its epoch's start.
    let deadline = tokio::time::Instant::now() + WAIT;
    let registered = loop {
        match client.operate(registration.clone()).await {
            Ok(answer) => break answer,
            Err(Error::Node(ClientError::Controller(err))) if err.code() == "NOT_CONTROLLER" => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no active controller after {WAIT:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("registration refused: {other}"),
        }
    };
    let epoch = registered
        .broker_epoch
        .expect("a registration answers its broker epoch");
    let beat = client
        .operate(Operation::BrokerHeartbeat {
            broker_id: 1,
            broker_epoch: epoch,
            metadata_offset: registered.offset,
            want_fence: false,
            want_shutdown: false,
        })
        .await
        .unwrap();
    let beat = beat.heartbeat.expect("a heartbeat answers one");
    assert!(beat.is_caught_up && !beat.is_fenced, "{beat:?}");

    let topic = Operation::CreateTopic(NewTopic {
        name: "over-the-wire".to_string(),
        layout: TopicLayout::Counts {
            partitions: 2,
            replication_factor: 1,
        },
        configs: BTreeMap::new(),
    });
    let created = client.operate(topic.clone()).await.unwrap();
    assert!(created.offset > registered.offset);
    let image = served.node.metadata_image().unwrap();
    assert!(
        image.offset >= created.offset,
        "answered once this node's image shows it"
    );
    assert_eq!(image.topic("over-the-wire").unwrap().partitions.len(), 2);

    match client.operate(topic).await {
        Err(Error::Node(err @ ClientError::Controller(_))) => assert_eq!(err.code(), "TOPIC_ALREADY_EXISTS"),
        other => panic!("expected TOPIC_ALREADY_EXISTS, got {other:?}"),
    }
    // The controller's own operation is not taken from clients.
    let fence = Operation::FenceExpired {
        broker_id: 1,
        broker_epoch: epoch,
    };
    match client.operate(fence).await {
        Err(Error::Node(ClientError::BadRequest(message))) => assert!(message.contains("FenceExpired"), "{message}"),
        other => panic!("expected BAD_REQUEST, got {other:?}"),
    }
    assert!(!served.node.metadata_image().unwrap().brokers.get(&1).unwrap().fenced);
    served.stop().await;
}

#[actix_rt::test]
async fn a_node_in_log_mode_refuses_controller_operations() {
    let served = Served::leader(default_limits()).await;
    let mut client = Client::connect(served.addr).await.unwrap();
    let operation = kraft::node::Operation::DeleteTopic {
        name: "none".to_string(),
    };
    match client.operate(operation).await {
        Err(Error::Node(ClientError::Controller(err))) => {
            assert!(err.to_string().contains("keeps no metadata"), "{err}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    served.stop().await;
}

const ADMIN_TOKEN: &str = "admin-0123456789abcdef";
const READ_TOKEN: &str = "read-0123456789abcdef";

fn refused_as(result: Result<impl std::fmt::Debug, Error>, code: &str) {
    match result {
        Err(Error::Node(refusal)) => assert_eq!(refusal.code(), code, "{refusal}"),
        other => panic!("expected {code}, got {other:?}"),
    }
}

/// With a tokens file: a connection that has not authenticated gets
/// UNAUTHENTICATED for every request, an unknown token is refused, a read
/// token reads and gets CLUSTER_AUTHORIZATION_FAILED on writes, an admin
/// token (through Client and Producer) writes; nothing refused is written.
#[actix_rt::test]
async fn with_tokens_a_connection_authenticates_and_a_write_needs_an_admin_token() {
    let tokens = Tokens::parse(&format!("admin {ADMIN_TOKEN}\nread {READ_TOKEN}\n")).unwrap();
    let served = Served::leader_with_tokens(default_limits(), |_| {}, Some(Arc::new(tokens))).await;

    let mut anonymous = Client::connect(served.addr).await.unwrap();
    refused_as(anonymous.quorum().await, "UNAUTHENTICATED");
    refused_as(anonymous.append(vec![b"anonymous".to_vec()]).await, "UNAUTHENTICATED");
    refused_as(anonymous.read(0, 10).await, "UNAUTHENTICATED");
    refused_as(
        Client::connect_with_token(served.addr, "nobody-0123456789abcdef")
            .await
            .map(|_| ()),
        "UNAUTHENTICATED",
    );

    let mut reader = Client::connect_with_token(served.addr, READ_TOKEN).await.unwrap();
    assert_eq!(reader.quorum().await.unwrap().role, "leader");
    reader.read(0, 10).await.unwrap();
    refused_as(
        reader.append(vec![b"read".to_vec()]).await,
        "CLUSTER_AUTHORIZATION_FAILED",
    );

    let mut admin = Client::connect_with_token(served.addr, ADMIN_TOKEN).await.unwrap();
    admin.append(vec![b"admin".to_vec()]).await.unwrap();
    let producer = Producer::connect_with_token(served.addr, ProducerOptions::default(), ADMIN_TOKEN)
        .await
        .unwrap();
    producer.append(vec![b"producer".to_vec()]).await.unwrap();
    let read_producer = Producer::connect_with_token(served.addr, ProducerOptions::default(), READ_TOKEN)
        .await
        .unwrap();
    refused_as(
        read_producer.append(vec![b"read producer".to_vec()]).await,
        "CLUSTER_AUTHORIZATION_FAILED",
    );
    assert_eq!(served.data_values().await, ["admin", "producer"]);
    served.stop().await;
}
