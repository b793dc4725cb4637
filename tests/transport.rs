//! The raft transport over real sockets on 127.0.0.1: the inbound listener
//! (`serve`) and the outbound `RequestManager`, against each other and
//! against a raw TCP client that misbehaves.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use actix::prelude::*;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout, Instant};

use kraft::actors::request_manager::RequestManager;
use kraft::actors::transport::{serve_with, ConnectionLimits, RaftServer, MAX_LOG_ANSWERS_PER_CONNECTION};
use kraft::messages::actor::{InboundRequest, RequestOutcome, SendRequest, TransportError};
use kraft::messages::codec::{self, Body, Envelope, WIRE_VERSION};
use kraft::messages::records::Batch;
use kraft::messages::rpc::*;
use kraft::raft::NodeId;

const CLUSTER: &str = "test-cluster";
const SERVER_ID: NodeId = 1;
const CLIENT_ID: NodeId = 2;
const MAX_FRAME_BYTES: u64 = 1024 * 1024;
/// Upper bound on any single wait in these tests.
const PATIENCE: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// No panics anywhere (a panic in a spawned task would not fail the test by
// itself): every test installs this hook once and checks the count at its end.

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

fn assert_no_panics() {
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a task panicked");
}

// ---------------------------------------------------------------------------
// A handler standing in for the QuorumState actor.

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Answer every request at once.
    Answer,
    /// Hold Fetch requests until `ReleaseHeld`; answer the rest at once.
    HoldFetches,
    /// Hold every request (keeping the reply sender alive) until
    /// `ReleaseHeld`, if it comes.
    HoldAll,
    /// Answer every Fetch at once with 1 MiB of log (a peer far behind).
    AnswerLargeFetches,
}

struct TestHandler {
    mode: Mode,
    held: Vec<(RaftRequest, oneshot::Sender<RaftResponse>)>,
    received: Arc<AtomicUsize>,
}

impl Actor for TestHandler {
    type Context = Context<Self>;
}

impl Handler<InboundRequest> for TestHandler {
    type Result = ();

    fn handle(&mut self, msg: InboundRequest, _ctx: &mut Self::Context) {
        assert_eq!(msg.from, CLIENT_ID, "the envelope's source id reaches the handler");
        self.received.fetch_add(1, Ordering::SeqCst);
        let hold = match self.mode {
            Mode::Answer | Mode::AnswerLargeFetches => false,
            Mode::HoldFetches => matches!(msg.request, RaftRequest::Fetch(_)),
            Mode::HoldAll => true,
        };
        if hold {
            self.held.push((msg.request, msg.reply));
        } else if self.mode == Mode::AnswerLargeFetches && matches!(msg.request, RaftRequest::Fetch(_)) {
            let mut response = answer(&msg.request);
            if let RaftResponse::Fetch(fetch) = &mut response {
                fetch.batches.push(Batch {
                    base_offset: 0,
                    epoch: 1,
                    record_count: 1,
                    crc: 0,
                    payload: vec![7; (1 << 20) - 1024],
                });
            }
            let _ = msg.reply.send(response);
        } else {
            let _ = msg.reply.send(answer(&msg.request));
        }
    }
}

/// Answers every held request, in arrival order.
#[derive(Message)]
#[rtype(result = "()")]
struct ReleaseHeld;

impl Handler<ReleaseHeld> for TestHandler {
    type Result = ();

    fn handle(&mut self, _msg: ReleaseHeld, _ctx: &mut Self::Context) {
        for (request, reply) in self.held.drain(..) {
            let _ = reply.send(answer(&request));
        }
    }
}

/// A response that echoes something of its request, so tests can tell
/// which request a response belongs to.
fn answer(request: &RaftRequest) -> RaftResponse {
    match request {
        RaftRequest::Vote(vote) => RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: vote.epoch,
            leader_id: None,
            vote_granted: true,
            pre_vote: vote.pre_vote,
        }),
        RaftRequest::Fetch(fetch) => RaftResponse::Fetch(FetchResponse {
            error: ErrorCode::None,
            epoch: fetch.current_epoch,
            leader_id: Some(SERVER_ID),
            high_watermark: fetch.fetch_offset,
            log_start_offset: 0,
            diverging_epoch: None,
            snapshot_id: None,
            batches: Vec::new(),
        }),
        RaftRequest::BeginQuorumEpoch(begin) => RaftResponse::BeginQuorumEpoch(QuorumEpochResponse {
            error: ErrorCode::None,
            epoch: begin.epoch,
            leader_id: Some(begin.leader_id),
        }),
        _ => RaftResponse::Error(ErrorCode::InvalidRequest),
    }
}

fn vote(epoch: i32) -> RaftRequest {
    RaftRequest::Vote(VoteRequest {
        epoch,
        candidate_id: CLIENT_ID,
        last_epoch: 0,
        last_epoch_end_offset: 0,
        pre_vote: false,
    })
}

fn fetch(offset: i64) -> RaftRequest {
    RaftRequest::Fetch(FetchRequest {
        replica_id: CLIENT_ID,
        current_epoch: 1,
        fetch_offset: offset,
        last_fetched_epoch: 0,
        max_wait_ms: 500,
        max_bytes: 1024,
    })
}

fn granted_vote(epoch: i32) -> RaftResponse {
    answer(&vote(epoch))
}

struct TestServer {
    server: RaftServer,
    handler: Addr<TestHandler>,
    received: Arc<AtomicUsize>,
}

impl TestServer {
    fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Waits until the handler has received `count` requests in all.
    async fn wait_received(&self, count: usize) {
        let deadline = Instant::now() + PATIENCE;
        while self.received.load(Ordering::SeqCst) < count {
            assert!(
                Instant::now() < deadline,
                "the handler did not receive {count} requests"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn start_server(mode: Mode) -> TestServer {
    start_server_at("127.0.0.1:0".parse().unwrap(), mode).await.unwrap()
}

async fn start_server_as(local_id: NodeId, mode: Mode) -> TestServer {
    start_server_with("127.0.0.1:0".parse().unwrap(), local_id, mode)
        .await
        .unwrap()
}

async fn start_server_at(addr: SocketAddr, mode: Mode) -> std::io::Result<TestServer> {
    start_server_with(addr, SERVER_ID, mode).await
}

async fn start_server_with(addr: SocketAddr, local_id: NodeId, mode: Mode) -> std::io::Result<TestServer> {
    start_server_limited(addr, local_id, mode, ConnectionLimits::default()).await
}

/// A server on an ephemeral port with `limits` instead of the defaults.
async fn start_server_with_limits(mode: Mode, limits: ConnectionLimits) -> TestServer {
    start_server_limited("127.0.0.1:0".parse().unwrap(), SERVER_ID, mode, limits)
        .await
        .unwrap()
}

async fn start_server_limited(
    addr: SocketAddr,
    local_id: NodeId,
    mode: Mode,
    limits: ConnectionLimits,
) -> std::io::Result<TestServer> {
    let received = Arc::new(AtomicUsize::new(0));
    let handler = TestHandler {
        mode,
        held: Vec::new(),
        received: received.clone(),
    }
    .start();
    // `serve` is `serve_with` and the default limits.
    let server = serve_with(
        addr,
        CLUSTER.to_string(),
        local_id,
        MAX_FRAME_BYTES,
        handler.clone().recipient(),
        limits,
        None,
    )
    .await?;
    Ok(TestServer {
        server,
        handler,
        received,
    })
}

// ---------------------------------------------------------------------------
// The outcome side: an actor that forwards every RequestOutcome to the test.

struct Collector(mpsc::UnboundedSender<RequestOutcome>);

impl Actor for Collector {
    type Context = Context<Self>;
}

impl Handler<RequestOutcome> for Collector {
    type Result = ();

    fn handle(&mut self, msg: RequestOutcome, _ctx: &mut Self::Context) {
        let _ = self.0.send(msg);
    }
}

struct Client {
    manager: Addr<RequestManager>,
    outcomes: mpsc::UnboundedReceiver<RequestOutcome>,
    /// Each request's own timeout, unless sent with another.
    request_timeout_ms: u64,
}

impl Client {
    fn start(cluster_id: &str, voters: &[(NodeId, SocketAddr)], request_timeout_ms: u64) -> Client {
        let (tx, outcomes) = mpsc::unbounded_channel();
        let collector = Collector(tx).start();
        let voters: BTreeMap<NodeId, String> = voters.iter().map(|(id, addr)| (*id, addr.to_string())).collect();
        let manager = RequestManager::new(
            CLIENT_ID,
            cluster_id.to_string(),
            voters,
            request_timeout_ms,
            MAX_FRAME_BYTES,
            collector.recipient(),
            None,
        )
        .start();
        Client {
            manager,
            outcomes,
            request_timeout_ms,
        }
    }

    async fn send(&self, to: NodeId, correlation_id: u64, request: RaftRequest) {
        self.send_within(to, correlation_id, request, self.request_timeout_ms)
            .await
    }

    async fn send_within(&self, to: NodeId, correlation_id: u64, request: RaftRequest, timeout_ms: u64) {
        self.manager
            .send(SendRequest {
                to,
                correlation_id,
                request,
                timeout_ms,
            })
            .await
            .unwrap();
    }

    async fn next(&mut self) -> RequestOutcome {
        timeout(PATIENCE, self.outcomes.recv())
            .await
            .expect("an outcome within the patience")
            .expect("the collector is alive")
    }

    /// Asserts no further outcome arrives for a while (exactly-once).
    async fn assert_quiet(&mut self, wait: Duration) {
        if let Ok(Some(extra)) = timeout(wait, self.outcomes.recv()).await {
            panic!("unexpected extra outcome: {extra:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// A raw TCP client, to send what a well-behaved peer never would.

fn frame(cluster_id: &str, correlation_id: u64, body: Body) -> Vec<u8> {
    codec::encode_frame(&Envelope {
        version: WIRE_VERSION,
        source_id: CLIENT_ID,
        correlation_id,
        cluster_id: cluster_id.to_string(),
        body,
    })
}

async fn connect(addr: SocketAddr) -> TcpStream {
    timeout(PATIENCE, TcpStream::connect(addr)).await.unwrap().unwrap()
}

async fn read_envelope(stream: &mut TcpStream) -> Envelope {
    let mut prefix = [0u8; 4];
    timeout(PATIENCE, stream.read_exact(&mut prefix))
        .await
        .expect("a response in time")
        .unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(prefix) as usize];
    timeout(PATIENCE, stream.read_exact(&mut body)).await.unwrap().unwrap();
    codec::decode_frame(&body, MAX_FRAME_BYTES).unwrap()
}

/// Sends a good request on `stream` and checks its answer.
async fn assert_serves(stream: &mut TcpStream, correlation_id: u64) {
    stream
        .write_all(&frame(CLUSTER, correlation_id, Body::Request(vote(5))))
        .await
        .unwrap();
    let envelope = read_envelope(stream).await;
    assert_eq!(envelope.correlation_id, correlation_id);
    assert_eq!(envelope.source_id, SERVER_ID);
    assert_eq!(envelope.cluster_id, CLUSTER);
    assert_eq!(envelope.body, Body::Response(granted_vote(5)));
}

/// Asserts the server closes `stream` (EOF or reset) without answering.
async fn assert_closed_by_server(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match timeout(PATIENCE, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("expected the connection closed, got {n} bytes"),
        Err(_) => panic!("the server did not close the connection"),
    }
}

// ---------------------------------------------------------------------------
// Through serve + RequestManager.

#[actix_rt::test]
async fn round_trip_through_serve_and_request_manager() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    let mut client = Client::start(CLUSTER, &[(SERVER_ID, server.addr())], 2000);

    client.send(SERVER_ID, 7, vote(3)).await;
    let outcome = client.next().await;
    assert_eq!(outcome.from, SERVER_ID);
    assert_eq!(outcome.correlation_id, 7);
    assert_eq!(outcome.result, Ok(granted_vote(3)));

    // The connection is reused for the next requests.
    for correlation_id in 8..20 {
        client
            .send(SERVER_ID, correlation_id, fetch(correlation_id as i64))
            .await;
        let outcome = client.next().await;
        assert_eq!(outcome.correlation_id, correlation_id);
        assert_eq!(outcome.result, Ok(answer(&fetch(correlation_id as i64))));
    }
    assert_eq!(server.received.load(Ordering::SeqCst), 13);
    client.assert_quiet(Duration::from_millis(100)).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn many_requests_in_flight_on_one_connection_each_get_one_outcome() {
    count_panics();
    // Votes: a connection holds at most MAX_LOG_ANSWERS_PER_CONNECTION
    // fetches (a_peer_that_never_reads_its_fetch_answers_gets_few_of_them_made).
    let server = start_server(Mode::HoldAll).await;
    let mut client = Client::start(CLUSTER, &[(SERVER_ID, server.addr())], 5000);

    let count = 200u64;
    for correlation_id in 0..count {
        client
            .send(SERVER_ID, correlation_id, vote(correlation_id as i32))
            .await;
    }
    server.wait_received(count as usize).await;
    server.handler.send(ReleaseHeld).await.unwrap();
    let mut seen = BTreeSet::new();
    for _ in 0..count {
        let outcome = client.next().await;
        assert_eq!(outcome.result, Ok(granted_vote(outcome.correlation_id as i32)));
        assert!(
            seen.insert(outcome.correlation_id),
            "two outcomes for {}",
            outcome.correlation_id
        );
    }
    client.assert_quiet(Duration::from_millis(100)).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn a_parked_fetch_does_not_block_a_later_vote() {
    count_panics();
    let server = start_server(Mode::HoldFetches).await;
    let mut client = Client::start(CLUSTER, &[(SERVER_ID, server.addr())], 5000);

    client.send(SERVER_ID, 1, fetch(10)).await;
    client.send(SERVER_ID, 2, vote(4)).await;
    let first = client.next().await;
    assert_eq!(
        first.correlation_id, 2,
        "the vote is answered while the fetch is parked"
    );
    assert_eq!(first.result, Ok(granted_vote(4)));

    server.handler.send(ReleaseHeld).await.unwrap();
    let second = client.next().await;
    assert_eq!(second.correlation_id, 1);
    assert_eq!(second.result, Ok(answer(&fetch(10))));
    assert_no_panics();
}

/// Connects with a 4 KiB receive buffer (the answers soon fill the
/// sockets) and sends `count` fetches, reading nothing.
async fn send_fetches_with_a_small_receive_buffer(addr: SocketAddr, count: u64) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = timeout(PATIENCE, socket.connect(addr)).await.unwrap().unwrap();
    for correlation_id in 0..count {
        stream
            .write_all(&frame(CLUSTER, correlation_id, Body::Request(fetch(0))))
            .await
            .unwrap();
    }
    stream
}

/// How many requests reached the handler, once that count has stayed put
/// for half a second (or PATIENCE has passed).
async fn requests_once_they_stop_arriving(server: &TestServer) -> usize {
    let deadline = Instant::now() + PATIENCE;
    let mut seen = server.received.load(Ordering::SeqCst);
    let mut unchanged_polls = 0;
    while unchanged_polls < 25 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = server.received.load(Ordering::SeqCst);
        unchanged_polls = if now == seen { unchanged_polls + 1 } else { 0 };
        seen = now;
    }
    seen
}

/// A peer that sends fetches and never reads the answers: the listener
/// holds at most MAX_LOG_ANSWERS_PER_CONNECTION answers of 1 MiB (and the
/// sockets' buffers a few more), not one per request in flight.
#[actix_rt::test]
async fn a_peer_that_never_reads_its_fetch_answers_gets_few_of_them_made() {
    count_panics();
    let server = start_server(Mode::AnswerLargeFetches).await;
    let sent = 200;
    let mut stream = send_fetches_with_a_small_receive_buffer(server.addr(), sent).await;

    // The reader stops once the answers made fill the sockets and the
    // bound; wait until the count stays put.
    let seen = requests_once_they_stop_arriving(&server).await;
    // The sockets hold a few answers between them: the client's receive
    // buffer is 4 KiB, and the server's send buffer grows up to the
    // kernel's `tcp_wmem` maximum (4 MiB by default).
    let socket_buffered = tcp_send_buffer_max_bytes() / ((1 << 20) - 1024) + 2;
    assert!(
        seen <= MAX_LOG_ANSWERS_PER_CONNECTION + socket_buffered,
        "{seen} of {sent} fetches were answered while the peer read nothing"
    );
    assert!(seen >= 1, "the first fetch reaches the handler");

    // Reading again lets the rest through, in full.
    let mut answered = 0;
    while answered < sent {
        let envelope = read_envelope(&mut stream).await;
        assert!(matches!(envelope.body, Body::Response(RaftResponse::Fetch(_))));
        answered += 1;
    }
    assert_eq!(server.received.load(Ordering::SeqCst), sent as usize);
    assert_no_panics();
}

/// The answers made and not yet written, across the listener, stay within
/// a budget: past it, the connection whose peer has taken nothing for
/// longest is closed, and a peer that comes later and reads its answers
/// gets them all.
#[actix_rt::test]
async fn answers_left_unread_past_the_listeners_budget_close_the_connection_that_waited_longest() {
    count_panics();
    // One answer of 1 MiB fits, two do not.
    let limits = ConnectionLimits {
        unwritten_answer_bytes: 3 << 19,
        ..ConnectionLimits::default()
    };
    let server = start_server_with_limits(Mode::AnswerLargeFetches, limits).await;
    let sent = 20;
    let mut first = send_fetches_with_a_small_receive_buffer(server.addr(), sent).await;
    // The first peer reads nothing: once its answers fill the sockets, one
    // waits to be written, and the handler gets no more of its fetches.
    let seen = requests_once_they_stop_arriving(&server).await;
    assert!(seen < sent as usize, "the first peer's answers did not stall");

    // It alone holds more than the budget, but closing it would make room
    // for nothing: it stays until a second peer's answers need the room.
    let mut second = send_fetches_with_a_small_receive_buffer(server.addr(), sent).await;
    // Once the second peer's answers are made too (and it reads nothing
    // yet), the first, which has taken nothing for longer, is closed.
    let both = requests_once_they_stop_arriving(&server).await;
    assert!(both > seen, "the second peer's fetches reach the handler");
    read_until_closed(&mut first).await;
    let mut answered = 0;
    while answered < sent {
        let envelope = read_envelope(&mut second).await;
        assert!(matches!(envelope.body, Body::Response(RaftResponse::Fetch(_))));
        answered += 1;
    }
    assert_no_panics();
}

/// Reads from `stream` until the server closes it (or resets it), and
/// returns the whole responses read before that; panics if it stays open.
async fn read_until_closed(stream: &mut TcpStream) -> usize {
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        match timeout(PATIENCE, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => bytes.extend_from_slice(&chunk[..n]),
            Err(_) => panic!("the server kept the connection open"),
        }
    }
    let mut responses = 0;
    let mut rest = &bytes[..];
    while rest.len() >= 4 {
        let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        if rest.len() < 4 + len {
            break;
        }
        rest = &rest[4 + len..];
        responses += 1;
    }
    responses
}

#[actix_rt::test]
async fn a_full_listener_makes_room_by_closing_the_least_recently_used_connection() {
    count_panics();
    let limits = ConnectionLimits {
        max_connections: 3,
        ..ConnectionLimits::default()
    };
    let server = start_server_with_limits(Mode::Answer, limits).await;
    // The replica's connection is the oldest, and the only one in use.
    let mut replica = connect(server.addr()).await;
    let mut holders = Vec::new();
    let mut correlation_id = 0;
    for _ in 0..6 {
        // A connection that is used once, then only holds a place, as a
        // flood of them would. Its answer shows the listener took it.
        let mut holder = connect(server.addr()).await;
        correlation_id += 1;
        assert_serves(&mut holder, correlation_id).await;
        holders.push(holder);
        correlation_id += 1;
        assert_serves(&mut replica, correlation_id).await;
    }
    // Each holder from the third on took the place of the holder used
    // least recently; the replica, in use all along, kept its own.
    for holder in &mut holders[..4] {
        assert_closed_by_server(holder).await;
    }
    for holder in &mut holders[4..] {
        correlation_id += 1;
        assert_serves(holder, correlation_id).await;
    }
    correlation_id += 1;
    assert_serves(&mut replica, correlation_id).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn a_full_listener_keeps_connections_that_await_answers_and_refuses_a_new_one() {
    count_panics();
    let limits = ConnectionLimits {
        max_connections: 2,
        ..ConnectionLimits::default()
    };
    let server = start_server_with_limits(Mode::HoldFetches, limits).await;
    // Two replicas whose fetches are parked: the least recently used of
    // them sent its fetch first, but both await an answer.
    let mut replicas = Vec::new();
    for correlation_id in 1..=2 {
        let mut replica = connect(server.addr()).await;
        replica
            .write_all(&frame(CLUSTER, correlation_id, Body::Request(fetch(0))))
            .await
            .unwrap();
        server.wait_received(correlation_id as usize).await;
        replicas.push(replica);
    }
    let mut newcomer = connect(server.addr()).await;
    assert_closed_by_server(&mut newcomer).await;
    // The parked fetches are answered on the connections they came on.
    server.handler.send(ReleaseHeld).await.unwrap();
    for (replica, correlation_id) in replicas.iter_mut().zip(1..) {
        assert_eq!(read_envelope(replica).await.correlation_id, correlation_id);
    }
    // Now nothing is awaited: a new connection takes a place.
    let mut newcomer = connect(server.addr()).await;
    assert_serves(&mut newcomer, 3).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn a_connection_with_no_frame_within_the_idle_timeout_is_closed() {
    count_panics();
    let limits = ConnectionLimits {
        idle: Duration::from_secs(1),
        ..ConnectionLimits::default()
    };
    let server = start_server_with_limits(Mode::Answer, limits).await;
    let mut idle = connect(server.addr()).await;
    let mut busy = connect(server.addr()).await;
    // A request every 100 ms keeps a connection open past the idle timeout.
    for correlation_id in 0..15 {
        busy.write_all(&frame(CLUSTER, correlation_id, Body::Request(vote(1))))
            .await
            .unwrap();
        assert_eq!(read_envelope(&mut busy).await.correlation_id, correlation_id);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The one that sent nothing is closed.
    assert_eq!(read_until_closed(&mut idle).await, 0);
    // So is one that stopped half-way through a frame.
    let mut trickling = connect(server.addr()).await;
    let request = frame(CLUSTER, 1, Body::Request(vote(1)));
    trickling.write_all(&request[..6]).await.unwrap();
    assert_eq!(read_until_closed(&mut trickling).await, 0);
    assert_no_panics();
}

#[actix_rt::test]
async fn a_peer_that_reads_no_answer_within_the_write_timeout_is_disconnected() {
    count_panics();
    let limits = ConnectionLimits {
        write: Duration::from_millis(300),
        ..ConnectionLimits::default()
    };
    let server = start_server_with_limits(Mode::AnswerLargeFetches, limits).await;
    let sent = 20;
    let mut stream = send_fetches_with_a_small_receive_buffer(server.addr(), sent).await;
    // Reading nothing for longer than the write timeout: the connection is
    // closed with the answers made so far, and no others are made.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let answered = read_until_closed(&mut stream).await;
    assert!(answered < sent as usize, "all {answered} answers were written");
    assert!(server.received.load(Ordering::SeqCst) < sent as usize);
    assert_no_panics();
}

/// The largest send buffer the kernel grows a TCP socket to (the third
/// field of `/proc/sys/net/ipv4/tcp_wmem`), or 16 MiB when it cannot say.
fn tcp_send_buffer_max_bytes() -> usize {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|text| text.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(16 << 20)
}

#[actix_rt::test]
async fn out_of_order_answers_on_one_raw_connection() {
    count_panics();
    let server = start_server(Mode::HoldFetches).await;
    let mut stream = connect(server.addr()).await;

    let mut both = frame(CLUSTER, 100, Body::Request(fetch(3)));
    both.extend(frame(CLUSTER, 101, Body::Request(vote(9))));
    stream.write_all(&both).await.unwrap();

    let first = read_envelope(&mut stream).await;
    assert_eq!(first.correlation_id, 101);
    assert_eq!(first.body, Body::Response(granted_vote(9)));
    server.handler.send(ReleaseHeld).await.unwrap();
    let second = read_envelope(&mut stream).await;
    assert_eq!(second.correlation_id, 100);
    assert_eq!(second.body, Body::Response(answer(&fetch(3))));
    assert_no_panics();
}

#[actix_rt::test]
async fn a_request_the_handler_never_answers_times_out() {
    count_panics();
    let server = start_server(Mode::HoldAll).await;
    let mut client = Client::start(CLUSTER, &[(SERVER_ID, server.addr())], 300);

    let started = Instant::now();
    client.send(SERVER_ID, 5, vote(1)).await;
    let outcome = client.next().await;
    assert_eq!(outcome.correlation_id, 5);
    assert_eq!(outcome.result, Err(TransportError::Timeout(SERVER_ID)));
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(290), "timed out early: {elapsed:?}");
    assert!(elapsed < Duration::from_millis(2000), "timed out late: {elapsed:?}");
    client.assert_quiet(Duration::from_millis(200)).await;
    assert_no_panics();
}

/// Each request times out on its own deadline (the engine's, for the
/// protocol's requests), not on one timer shared by the connection: sent
/// second with a shorter timeout, a request times out first.
#[actix_rt::test]
async fn each_request_times_out_after_its_own_timeout() {
    count_panics();
    let server = start_server(Mode::HoldAll).await;
    let mut client = Client::start(CLUSTER, &[(SERVER_ID, server.addr())], 60_000);

    client.send_within(SERVER_ID, 5, vote(1), 1_500).await;
    client.send_within(SERVER_ID, 6, vote(1), 300).await;
    let first = client.next().await;
    assert_eq!(
        (first.correlation_id, first.result),
        (6, Err(TransportError::Timeout(SERVER_ID)))
    );
    let second = client.next().await;
    assert_eq!(second.correlation_id, 5, "the longer timeout runs on");
    assert!(matches!(
        second.result,
        Err(TransportError::Timeout(SERVER_ID) | TransportError::Disconnected(SERVER_ID, _))
    ));
    assert_no_panics();
}

#[actix_rt::test]
async fn a_connection_whose_peer_stopped_reading_is_closed_once_a_request_times_out_unwritten() {
    count_panics();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = Client::start(CLUSTER, &[(SERVER_ID, listener.local_addr().unwrap())], 1000);

    client.send(SERVER_ID, 1, vote(1)).await;
    let (mut peer, _) = timeout(PATIENCE, listener.accept()).await.unwrap().unwrap();
    assert_eq!(read_envelope(&mut peer).await.correlation_id, 1);
    // The peer reads nothing more. Four forwarded appends of 8 MiB each are
    // far more than the sockets buffer: the client's writer blocks.
    for correlation_id in 2..=5 {
        let records = vec![serde_bytes::ByteBuf::from(vec![7u8; 8 << 20])];
        client
            .send(
                SERVER_ID,
                correlation_id,
                RaftRequest::Append(AppendRequest { records }),
            )
            .await;
    }
    // The peer still answers the first request after they were sent, so the
    // connection is not silent: only the unwritten requests tell.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = codec::encode_frame(&Envelope {
        version: WIRE_VERSION,
        source_id: SERVER_ID,
        correlation_id: 1,
        cluster_id: CLUSTER.to_string(),
        body: Body::Response(granted_vote(1)),
    });
    peer.write_all(&answer).await.unwrap();
    let answered = client.next().await;
    assert_eq!((answered.correlation_id, answered.result), (1, Ok(granted_vote(1))));
    let mut failed = Vec::new();
    for _ in 2..=5 {
        let outcome = client.next().await;
        assert!(
            matches!(
                outcome.result,
                Err(TransportError::Timeout(SERVER_ID) | TransportError::Disconnected(SERVER_ID, _))
            ),
            "{outcome:?}"
        );
        failed.push(outcome.correlation_id);
    }
    failed.sort_unstable();
    assert_eq!(failed, [2, 3, 4, 5]);

    // The stuck connection is gone: the next request opens a new one, and
    // the frames behind the stuck one never reach the peer.
    client.send(SERVER_ID, 6, vote(2)).await;
    let (mut second, _) = timeout(PATIENCE, listener.accept())
        .await
        .expect("the next request opens a new connection")
        .unwrap();
    assert_eq!(read_envelope(&mut second).await.correlation_id, 6);
    let mut drained = 0usize;
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        match timeout(PATIENCE, peer.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => drained += n,
            Err(_) => panic!("the stuck connection was not closed"),
        }
    }
    assert!(
        drained < 4 * (8 << 20),
        "all four appends reached the peer ({drained} bytes)"
    );
    client.assert_quiet(Duration::from_millis(100)).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn connecting_to_a_closed_port_fails_with_connect() {
    count_panics();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let mut client = Client::start(CLUSTER, &[(3, closed)], 2000);

    client.send(3, 11, vote(1)).await;
    let outcome = client.next().await;
    assert_eq!(outcome.from, 3);
    assert_eq!(outcome.correlation_id, 11);
    assert!(
        matches!(outcome.result, Err(TransportError::Connect(3, _))),
        "{:?}",
        outcome.result
    );

    // The next request tries again, and fails the same way.
    client.send(3, 12, vote(1)).await;
    let outcome = client.next().await;
    assert_eq!(outcome.correlation_id, 12);
    assert!(
        matches!(outcome.result, Err(TransportError::Connect(3, _))),
        "{:?}",
        outcome.result
    );
    client.assert_quiet(Duration::from_millis(100)).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn a_node_outside_the_voter_set_is_unknown() {
    count_panics();
    let mut client = Client::start(CLUSTER, &[], 2000);
    client.send(9, 1, vote(1)).await;
    let outcome = client.next().await;
    assert_eq!(outcome.from, 9);
    assert_eq!(outcome.correlation_id, 1);
    assert_eq!(outcome.result, Err(TransportError::UnknownNode(9)));
    assert_no_panics();
}

#[actix_rt::test]
async fn losing_the_connection_fails_requests_in_flight_and_the_next_request_reconnects() {
    count_panics();
    let server = start_server(Mode::HoldAll).await;
    let addr = server.addr();
    let mut client = Client::start(CLUSTER, &[(SERVER_ID, addr)], 5000);

    client.send(SERVER_ID, 1, vote(1)).await;
    client.send(SERVER_ID, 2, fetch(0)).await;
    server.wait_received(2).await;
    server.server.shutdown();
    let mut failed = BTreeSet::new();
    for _ in 0..2 {
        let outcome = client.next().await;
        assert!(
            matches!(outcome.result, Err(TransportError::Disconnected(SERVER_ID, _))),
            "{:?}",
            outcome.result
        );
        failed.insert(outcome.correlation_id);
    }
    assert_eq!(failed, BTreeSet::from([1, 2]));
    drop(server);

    // A new server on the same address; the next request reconnects.
    let mut restarted = None;
    for _ in 0..100 {
        match start_server_at(addr, Mode::Answer).await {
            Ok(server) => {
                restarted = Some(server);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let _restarted = restarted.expect("the address can be bound again");
    client.send(SERVER_ID, 3, vote(2)).await;
    let outcome = client.next().await;
    assert_eq!(outcome.correlation_id, 3);
    assert_eq!(outcome.result, Ok(granted_vote(2)));
    client.assert_quiet(Duration::from_millis(100)).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn a_different_node_at_the_voter_endpoint_is_refused() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    // We believe node 4 listens where node 1 does.
    let mut client = Client::start(CLUSTER, &[(4, server.addr())], 2000);
    client.send(4, 1, vote(1)).await;
    let outcome = client.next().await;
    assert!(
        matches!(outcome.result, Err(TransportError::Disconnected(4, _))),
        "{:?}",
        outcome.result
    );
    assert_no_panics();
}

#[actix_rt::test]
async fn a_request_manager_of_another_cluster_gets_inconsistent_cluster_id() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    let mut client = Client::start("another-cluster", &[(SERVER_ID, server.addr())], 2000);
    client.send(SERVER_ID, 1, vote(1)).await;
    let outcome = client.next().await;
    assert_eq!(
        outcome.result,
        Ok(RaftResponse::Error(ErrorCode::InconsistentClusterId))
    );
    assert_eq!(server.received.load(Ordering::SeqCst), 0, "the handler never sees it");
    assert_no_panics();
}

// ---------------------------------------------------------------------------
// Raw peers that misbehave: each bad connection is closed, the server
// keeps serving the others.

#[actix_rt::test]
async fn wrong_cluster_id_is_answered_and_the_connection_stays_open() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    let mut stream = connect(server.addr()).await;

    stream
        .write_all(&frame("other-cluster", 42, Body::Request(vote(1))))
        .await
        .unwrap();
    let envelope = read_envelope(&mut stream).await;
    assert_eq!(envelope.correlation_id, 42);
    assert_eq!(
        envelope.body,
        Body::Response(RaftResponse::Error(ErrorCode::InconsistentClusterId))
    );
    assert_eq!(server.received.load(Ordering::SeqCst), 0);

    assert_serves(&mut stream, 43).await;
    assert_no_panics();
}

/// Opens a bystander connection, sends `bad` on another one, and checks the
/// bad one is closed while the bystander and new connections are served.
async fn assert_bad_input_closes_only_its_connection(server: &TestServer, bad: &[u8], half_close: bool) {
    let mut bystander = connect(server.addr()).await;
    assert_serves(&mut bystander, 1).await;

    let mut offender = connect(server.addr()).await;
    offender.write_all(bad).await.unwrap();
    if half_close {
        offender.shutdown().await.unwrap();
    }
    assert_closed_by_server(&mut offender).await;

    assert_serves(&mut bystander, 2).await;
    let mut newcomer = connect(server.addr()).await;
    assert_serves(&mut newcomer, 3).await;
}

#[actix_rt::test]
async fn random_garbage_closes_only_that_connection() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    for seed in 0..20u64 {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let len = rng.gen_range(4..4096);
        let garbage: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        // Half-close so that a prefix claiming more bytes than were sent ends
        // as a truncated frame instead of a wait for the rest.
        assert_bad_input_closes_only_its_connection(&server, &garbage, true).await;
    }
    assert_no_panics();
}

#[actix_rt::test]
async fn a_well_framed_undecodable_body_closes_only_that_connection() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    for seed in 0..20u64 {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let len = rng.gen_range(0..512u32);
        let mut bad = len.to_be_bytes().to_vec();
        bad.extend((0..len).map(|_| rng.gen::<u8>()));
        // No half-close: the server must close on its own.
        assert_bad_input_closes_only_its_connection(&server, &bad, false).await;
    }
    assert_no_panics();
}

#[actix_rt::test]
async fn a_length_prefix_above_max_frame_bytes_closes_only_that_connection() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    for len in [MAX_FRAME_BYTES + 1, u32::MAX as u64] {
        let mut bad = (len as u32).to_be_bytes().to_vec();
        bad.extend_from_slice(&[0u8; 16]);
        // No half-close: the prefix alone must be refused.
        assert_bad_input_closes_only_its_connection(&server, &bad, false).await;
    }
    assert_no_panics();
}

#[actix_rt::test]
async fn a_truncated_frame_closes_only_that_connection() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    let good = frame(CLUSTER, 9, Body::Request(vote(1)));
    // Cut inside the body, and inside the length prefix.
    assert_bad_input_closes_only_its_connection(&server, &good[..good.len() - 3], true).await;
    assert_bad_input_closes_only_its_connection(&server, &good[..2], true).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn a_response_sent_to_the_listener_closes_only_that_connection() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    let bad = frame(CLUSTER, 1, Body::Response(granted_vote(1)));
    assert_bad_input_closes_only_its_connection(&server, &bad, false).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn a_bad_frame_after_good_ones_closes_the_connection() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    let mut stream = connect(server.addr()).await;
    assert_serves(&mut stream, 1).await;
    stream.write_all(&[0, 0, 0, 3, 1, 2, 3]).await.unwrap();
    assert_closed_by_server(&mut stream).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn shutdown_stops_accepting_and_closes_connections() {
    count_panics();
    let server = start_server(Mode::Answer).await;
    let addr = server.addr();
    let mut open = connect(addr).await;
    assert_serves(&mut open, 1).await;

    server.server.shutdown();
    assert_closed_by_server(&mut open).await;
    // Give the accept loop a poll to drop the listener, then check nobody is served.
    tokio::time::sleep(Duration::from_millis(50)).await;
    if let Ok(Ok(mut late)) = timeout(PATIENCE, TcpStream::connect(addr)).await {
        let _ = late.write_all(&frame(CLUSTER, 2, Body::Request(vote(1)))).await;
        assert_closed_by_server(&mut late).await;
    }
    assert_no_panics();
}

#[actix_rt::test]
async fn a_peer_that_half_closes_still_gets_its_answers() {
    count_panics();
    let server = start_server(Mode::HoldFetches).await;
    let mut stream = connect(server.addr()).await;
    let mut both = frame(CLUSTER, 1, Body::Request(fetch(1)));
    both.extend(frame(CLUSTER, 2, Body::Request(vote(1))));
    stream.write_all(&both).await.unwrap();
    stream.shutdown().await.unwrap();

    assert_eq!(read_envelope(&mut stream).await.correlation_id, 2);
    server.handler.send(ReleaseHeld).await.unwrap();
    assert_eq!(read_envelope(&mut stream).await.correlation_id, 1);
    assert_closed_by_server(&mut stream).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn a_correlation_id_already_in_flight_is_refused_and_the_first_request_kept() {
    count_panics();
    let server = start_server(Mode::HoldFetches).await;
    let mut client = Client::start(CLUSTER, &[(SERVER_ID, server.addr())], 5000);

    client.send(SERVER_ID, 1, fetch(5)).await;
    client.send(SERVER_ID, 1, vote(1)).await;
    let refused = client.next().await;
    assert_eq!(refused.correlation_id, 1);
    assert!(
        matches!(refused.result, Err(TransportError::Disconnected(SERVER_ID, _))),
        "{:?}",
        refused.result
    );

    server.wait_received(1).await;
    server.handler.send(ReleaseHeld).await.unwrap();
    let answered = client.next().await;
    assert_eq!(answered.correlation_id, 1);
    assert_eq!(answered.result, Ok(answer(&fetch(5))));
    client.assert_quiet(Duration::from_millis(100)).await;
    assert_no_panics();
}

#[actix_rt::test]
async fn each_destination_gets_its_own_connection() {
    count_panics();
    let answering = start_server_as(3, Mode::Answer).await;
    let silent = start_server_as(4, Mode::HoldAll).await;
    let mut client = Client::start(CLUSTER, &[(3, answering.addr()), (4, silent.addr())], 300);

    client.send(4, 1, vote(1)).await;
    client.send(3, 2, vote(2)).await;
    // The silent node does not hold up the other node's answer.
    let first = client.next().await;
    assert_eq!((first.from, first.correlation_id), (3, 2));
    assert_eq!(first.result, Ok(granted_vote(2)));
    let second = client.next().await;
    assert_eq!((second.from, second.correlation_id), (4, 1));
    assert_eq!(second.result, Err(TransportError::Timeout(4)));
    client.assert_quiet(Duration::from_millis(100)).await;
    assert_no_panics();
}
