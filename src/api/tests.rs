//! The HTTP layer against a fake node: status codes and bodies for every
//! outcome, including the ones a single-node quorum cannot produce on
//! demand (NOT_LEADER, OUTCOME_UNKNOWN).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::test::{call_service, init_service, read_body, TestRequest};
use actix_web::App;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::*;

/// Answers appends with `append_result` and records the arguments of every
/// call it gets.
#[derive(Clone)]
struct FakeNode {
    append_result: Result<Appended, AppendError>,
    appended: Arc<Mutex<Vec<Vec<Vec<u8>>>>>,
    reads: Arc<Mutex<Vec<(Offset, usize)>>>,
    /// When set, an append answers only once this is notified.
    gate: Option<Arc<Notify>>,
}

impl FakeNode {
    fn answering(append_result: Result<Appended, AppendError>) -> Self {
        FakeNode {
            append_result,
            appended: Arc::default(),
            reads: Arc::default(),
            gate: None,
        }
    }

    fn committed() -> Self {
        Self::answering(Ok(Appended {
            base_offset: 7,
            last_offset: 8,
            epoch: 2,
        }))
    }
}

fn status() -> QuorumStatus {
    QuorumStatus {
        cluster_id: "test".to_owned(),
        node_id: 1,
        role: "leader".to_owned(),
        leader_id: Some(1),
        leader_epoch: 2,
        high_watermark: 9,
        log_start_offset: 5,
        log_end_offset: 9,
        voters: vec![],
        observers: vec![],
    }
}

impl NodeApi for FakeNode {
    async fn append(&self, records: Vec<Vec<u8>>) -> Result<Appended, AppendError> {
        self.appended.lock().unwrap().push(records);
        if let Some(gate) = &self.gate {
            gate.notified().await;
        }
        self.append_result.clone()
    }
    async fn describe(&self) -> Result<QuorumStatus, NodeError> {
        Ok(status())
    }
    async fn read_records(&self, from: Offset, max: usize) -> Result<RecordPage, NodeError> {
        self.reads.lock().unwrap().push((from, max));
        Ok(RecordPage {
            high_watermark: 9,
            log_start_offset: 5,
            records: vec![],
        })
    }
    async fn metrics(&self) -> Result<MetricsSnapshot, NodeError> {
        Ok(MetricsSnapshot {
            current_state: 3,
            current_leader: 1,
            ..MetricsSnapshot::default()
        })
    }
    async fn create_snapshot(&self) -> Result<SnapshotInfo, NodeError> {
        Ok(SnapshotInfo {
            end_offset: 9,
            epoch: 2,
            size_bytes: 140,
            created: true,
        })
    }
}

/// Sends `req` to an app around `node` (body cap `limit`) and returns the
/// status, the content type and the body.
async fn send(node: &FakeNode, limit: usize, req: TestRequest) -> (StatusCode, String, Vec<u8>) {
    let node = node.clone();
    let app = init_service(App::new().configure(move |cfg| routes(cfg, node, limit))).await;
    let resp = call_service(&app, req.to_request()).await;
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    (status, content_type, read_body(resp).await.to_vec())
}

/// Like [`send`] but parses the body as JSON (asserting that it is).
async fn send_json(node: &FakeNode, req: TestRequest) -> (StatusCode, Value) {
    let (status, content_type, body) = send(node, 1024, req).await;
    assert_eq!(content_type, "application/json", "status {status}");
    let value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"));
    (status, value)
}

fn post_append(body: &str) -> TestRequest {
    TestRequest::post()
        .uri("/v1/append")
        .insert_header(("content-type", "application/json"))
        .set_payload(body.to_owned())
}

#[actix_rt::test]
async fn append_answers_the_committed_offsets() {
    let node = FakeNode::committed();
    let (status, body) = send_json(&node, post_append(r#"{"records": ["a", "bc"]}"#)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        serde_json::json!({"base_offset": 7, "last_offset": 8, "epoch": 2})
    );
    assert_eq!(
        *node.appended.lock().unwrap(),
        vec![vec![b"a".to_vec(), b"bc".to_vec()]]
    );
}

#[actix_rt::test]
async fn append_accepts_a_body_sent_as_a_form() {
    // What `curl -d '{...}'` sends.
    let node = FakeNode::committed();
    let req = TestRequest::post()
        .uri("/v1/append")
        .insert_header(("content-type", "application/x-www-form-urlencoded"))
        .set_payload(r#"{"records": ["x"]}"#);
    let (status, _) = send_json(&node, req).await;
    assert_eq!(status, StatusCode::OK);
}

#[actix_rt::test]
async fn malformed_bodies_are_bad_requests_and_write_nothing() {
    let node = FakeNode::committed();
    for body in [
        "",
        "{",
        "not json",
        r#"{"records": []}"#,
        r#"{"records": "a"}"#,
        r#"{"records": [1, 2]}"#,
        r#"{"records": [null]}"#,
        r#"{"record": ["a"]}"#,
        r#"{"records": ["a"], "extra": 1}"#,
        r#"["a"]"#,
        "null",
    ] {
        let (status, value) = send_json(&node, post_append(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "body {body:?}");
        assert_eq!(value["error"], "BAD_REQUEST", "body {body:?}");
        assert!(
            value["message"].as_str().is_some_and(|m| !m.is_empty()),
            "body {body:?}"
        );
    }
    assert!(node.appended.lock().unwrap().is_empty());
}

#[actix_rt::test]
async fn oversize_bodies_are_413() {
    let node = FakeNode::committed();
    let big = format!(r#"{{"records": ["{}"]}}"#, "x".repeat(2000));
    let (status, value) = send_json(&node, post_append(&big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(value["error"], "PAYLOAD_TOO_LARGE");
    assert!(node.appended.lock().unwrap().is_empty());
}

/// A body under the body limit whose records would still take more than
/// the largest batch in the log (12 bytes each beyond their text) is refused
/// while it is read, like the node refuses such a batch, and nothing is
/// appended.
#[actix_rt::test]
async fn records_over_a_batch_in_the_log_are_refused_while_the_body_is_read() {
    let node = FakeNode::committed();
    let most = MAX_BATCH_BYTES / Record::data_encoded_len(0);
    let body = |records: usize| format!("{{\"records\": [{}\"\"]}}", "\"\",".repeat(records - 1));
    let (status, _, answer) = send(&node, 16 << 20, post_append(&body(most + 1))).await;
    let value: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{value}");
    assert_eq!(value["error"], "REJECTED", "{value}");
    assert!(node.appended.lock().unwrap().is_empty());

    let (status, _, _) = send(&node, 16 << 20, post_append(&body(most))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(node.appended.lock().unwrap()[0].len(), most);
}

#[actix_rt::test]
async fn append_errors_map_to_their_status() {
    let cases = [
        (
            AppendError::NotLeader {
                leader_id: None,
                leader_endpoint: None,
            },
            StatusCode::SERVICE_UNAVAILABLE,
            "NOT_LEADER",
        ),
        (
            AppendError::NotLeader {
                leader_id: Some(3),
                leader_endpoint: Some("127.0.0.1:9".to_owned()),
            },
            StatusCode::SERVICE_UNAVAILABLE,
            "NOT_LEADER",
        ),
        (
            AppendError::OutcomeUnknown("leader lost".to_owned()),
            StatusCode::INTERNAL_SERVER_ERROR,
            "OUTCOME_UNKNOWN",
        ),
        (
            AppendError::Rejected("too big".to_owned()),
            StatusCode::BAD_REQUEST,
            "REJECTED",
        ),
        (
            AppendError::Unavailable("stopping".to_owned()),
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
        ),
    ];
    for (err, expected_status, code) in cases {
        let node = FakeNode::answering(Err(err.clone()));
        let (status, value) = send_json(&node, post_append(r#"{"records": ["a"]}"#)).await;
        assert_eq!(status, expected_status, "{err:?}");
        assert_eq!(value["error"], code, "{err:?}");
        // Handed over exactly once: an unknown outcome is never retried.
        assert_eq!(node.appended.lock().unwrap().len(), 1, "{err:?}");
        if let AppendError::NotLeader { leader_id, .. } = err {
            // Present even when unknown, as null.
            assert_eq!(value.get("leader_id"), Some(&serde_json::json!(leader_id)));
        }
    }
}

#[actix_rt::test]
async fn log_defaults_to_the_log_start_and_caps_max() {
    let node = FakeNode::committed();
    for (uri, expected) in [
        ("/v1/log", (5, LOG_PAGE_DEFAULT)),
        ("/v1/log?from=7", (7, LOG_PAGE_DEFAULT)),
        ("/v1/log?from=0&max=3", (0, 3)),
        ("/v1/log?max=1000000", (5, LOG_PAGE_MAX)),
        ("/v1/log?max=99999999999999999999", (5, LOG_PAGE_MAX)),
        ("/v1/log?from=6&unknown=1", (6, LOG_PAGE_DEFAULT)),
    ] {
        node.reads.lock().unwrap().clear();
        let (status, value) = send_json(&node, TestRequest::get().uri(uri)).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        assert_eq!(value["high_watermark"], 9, "{uri}");
        assert_eq!(*node.reads.lock().unwrap(), vec![expected], "{uri}");
    }
}

#[actix_rt::test]
async fn bad_log_parameters_are_bad_requests() {
    let node = FakeNode::committed();
    for uri in [
        "/v1/log?from=abc",
        "/v1/log?from=-1",
        "/v1/log?from=",
        "/v1/log?from=1.5",
        "/v1/log?from=99999999999999999999",
        "/v1/log?max=0",
        "/v1/log?max=-3",
        "/v1/log?max=ten",
    ] {
        let (status, value) = send_json(&node, TestRequest::get().uri(uri)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(value["error"], "BAD_REQUEST", "{uri}");
        let message = value["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("from:") || message.starts_with("max:"),
            "{uri}: {message}"
        );
    }
    assert!(node.reads.lock().unwrap().is_empty());
}

#[actix_rt::test]
async fn quorum_and_healthz_describe_the_node() {
    let node = FakeNode::committed();
    let (status, value) = send_json(&node, TestRequest::get().uri("/v1/quorum")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(value["role"], "leader");
    assert_eq!(value["log_start_offset"], 5);
    let (status, value) = send_json(&node, TestRequest::get().uri("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(value["status"], "ok");
    assert_eq!(value["role"], "leader");
}

#[actix_rt::test]
async fn metrics_are_prometheus_text() {
    let node = FakeNode::committed();
    let (status, content_type, body) = send(&node, 1024, TestRequest::get().uri("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, metrics::CONTENT_TYPE);
    let text = String::from_utf8(body).unwrap();
    assert!(text.contains("\nkraft_raft_current_state 3\n"), "{text}");
}

#[actix_rt::test]
async fn unknown_routes_and_methods_answer_json() {
    let node = FakeNode::committed();
    let (status, value) = send_json(&node, TestRequest::get().uri("/v2/nothing")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(value["error"], "NOT_FOUND");
    // 405 names the one method the route takes (RFC 9110, 15.5.6); HEAD
    // is not served either.
    let routed = node.clone();
    let app = init_service(App::new().configure(move |cfg| routes(cfg, routed, 1024))).await;
    for (request, allowed) in [
        (TestRequest::get().uri("/v1/append"), "POST"),
        (TestRequest::delete().uri("/v1/quorum"), "GET"),
        (TestRequest::post().uri("/v1/log"), "GET"),
        (TestRequest::get().uri("/v1/snapshot"), "POST"),
        (TestRequest::put().uri("/healthz"), "GET"),
        (TestRequest::post().uri("/metrics"), "GET"),
        (TestRequest::default().method(Method::HEAD).uri("/v1/quorum"), "GET"),
    ] {
        let response = call_service(&app, request.to_request()).await;
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers().get(header::ALLOW).unwrap(), allowed);
        assert_eq!(
            response.headers().get(header::CONTENT_TYPE).unwrap(),
            "application/json"
        );
        let value: Value = serde_json::from_slice(&read_body(response).await).unwrap();
        assert_eq!(value["error"], "METHOD_NOT_ALLOWED");
    }
    assert!(node.appended.lock().unwrap().is_empty());
}

/// Over the wire to `addr` (blocking): three bodies over a 1 MiB cap, two
/// with a Content-Length and one streamed, then one small append. Returns
/// each status and JSON body.
fn oversize_then_small(addr: SocketAddr) -> Vec<(u16, Value)> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let url = format!("http://{addr}/v1/append");
    let big = format!(r#"{{"records": ["{}"]}}"#, "x".repeat(9 << 20));
    let mut results = Vec::new();
    for i in 0..3 {
        let body = if i == 1 {
            // No Content-Length: the limit trips while streaming.
            reqwest::blocking::Body::new(std::io::Cursor::new(big.clone().into_bytes()))
        } else {
            reqwest::blocking::Body::from(big.clone())
        };
        let resp = client.post(&url).body(body).send().unwrap();
        let status = resp.status().as_u16();
        let body: Value = resp.json().unwrap();
        results.push((status, body));
    }
    let ok = client.post(&url).body(r#"{"records": ["a"]}"#).send().unwrap();
    results.push((ok.status().as_u16(), ok.json().unwrap()));
    results
}

/// The oversize bodies were answered 413 in JSON even though the client was
/// still sending them, and only the small append reached the node.
fn assert_only_the_small_append_passed(results: &[(u16, Value)], node: &FakeNode) {
    for (status, body) in &results[..3] {
        assert_eq!(*status, 413, "{body}");
        assert_eq!(body["error"], "PAYLOAD_TOO_LARGE");
    }
    assert_eq!(results[3].0, 200, "{}", results[3].1);
    assert_eq!(node.appended.lock().unwrap().len(), 1);
}

/// The server with a worker thread, on an ephemeral port.
#[actix_rt::test]
async fn served_oversize_bodies_are_413_over_the_wire() {
    let node = FakeNode::committed();
    let (server, addr) = serve(
        node.clone(),
        "127.0.0.1:0".parse().unwrap(),
        1 << 20,
        1,
        ApiSecurity::default(),
    )
    .unwrap();
    assert_ne!(addr.port(), 0);
    let server_handle = server.handle();
    actix_rt::spawn(server);
    let results = tokio::task::spawn_blocking(move || oversize_then_small(addr))
        .await
        .unwrap();
    server_handle.stop(true).await;
    assert_only_the_small_append_passed(&results, &node);
}

/// The server on this thread answers the same way.
#[actix_rt::test]
async fn served_here_oversize_bodies_are_413_over_the_wire() {
    let node = FakeNode::committed();
    let (server, addr) = local::serve_here(
        node.clone(),
        "127.0.0.1:0".parse().unwrap(),
        1 << 20,
        local::KEEP_ALIVE,
        64,
        ApiSecurity::default(),
    )
    .unwrap();
    assert_ne!(addr.port(), 0);
    let results = tokio::task::spawn_blocking(move || oversize_then_small(addr))
        .await
        .unwrap();
    server.stop().await;
    assert_only_the_small_append_passed(&results, &node);
}

/// Reads one HTTP/1.1 response with a Content-Length body from `stream`;
/// returns its head and body.
async fn read_response(stream: &mut TcpStream) -> (String, String) {
    let mut buf = Vec::new();
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .expect("a content-length");
            if buf.len() >= end + 4 + length {
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).to_string();
                return (head, body);
            }
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.unwrap();
        assert_ne!(n, 0, "connection closed mid-response after {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Stopping the server on this thread closes its listener and its idle
/// keep-alive connections at once, but a request in flight still gets its
/// answer before its connection closes and the stop completes.
#[actix_rt::test]
async fn stopping_the_server_here_answers_requests_in_flight_and_closes_idle_connections() {
    let gate = Arc::new(Notify::new());
    let node = FakeNode {
        gate: Some(gate.clone()),
        ..FakeNode::committed()
    };
    // Longer than the stop's drain: idle connections close only because
    // the server stops.
    let keep_alive = Duration::from_secs(600);
    let (server, addr) = local::serve_here(
        node.clone(),
        "127.0.0.1:0".parse().unwrap(),
        1024,
        keep_alive,
        64,
        ApiSecurity::default(),
    )
    .unwrap();

    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: kraft\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = read_response(&mut idle).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let mut busy = TcpStream::connect(addr).await.unwrap();
    let body = r#"{"records": ["a"]}"#;
    let request = format!(
        "POST /v1/append HTTP/1.1\r\nHost: kraft\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    busy.write_all(request.as_bytes()).await.unwrap();
    // The append is with the node once the node has seen it.
    while node.appended.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let stopping = actix_rt::spawn(server.stop());
    // The idle connection is closed without waiting for the append.
    let mut rest = Vec::new();
    idle.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "the idle connection got {rest:?}");
    assert!(TcpStream::connect(addr).await.is_err(), "the listener is still open");
    assert!(
        !stopping.is_finished(),
        "the stop did not wait for the request in flight"
    );

    gate.notify_one();
    let (head, body) = read_response(&mut busy).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["base_offset"], 7);
    let mut rest = Vec::new();
    busy.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "after the answer: {rest:?}");
    stopping.await.unwrap();
}

/// With `max_connections` open, the server on this thread accepts no more:
/// a further client waits in the listen backlog, unanswered, and is served
/// as soon as one of the open connections closes.
#[actix_rt::test]
async fn the_server_here_serves_at_most_max_connections_at_once() {
    let node = FakeNode::committed();
    let keep_alive = Duration::from_secs(600);
    let (server, addr) = local::serve_here(
        node.clone(),
        "127.0.0.1:0".parse().unwrap(),
        1024,
        keep_alive,
        2,
        ApiSecurity::default(),
    )
    .unwrap();
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: kraft\r\n\r\n";

    let mut open = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(healthz).await.unwrap();
        let (head, _) = read_response(&mut stream).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        open.push(stream);
    }
    // The kernel completes the handshake, but the server does not take it.
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(healthz).await.unwrap();
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(300), third.read(&mut byte)).await;
    assert!(early.is_err(), "a third connection was served: {early:?}");

    drop(open.pop());
    let (head, _) = tokio::time::timeout(Duration::from_secs(5), read_response(&mut third))
        .await
        .expect("served once a place freed");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    server.stop().await;
}

#[test]
fn the_connection_bound_leaves_half_the_file_limit_to_the_rest_of_the_node() {
    assert_eq!(local::connection_bound(1024), 512);
    assert_eq!(local::connection_bound(20_000), 10_000);
    assert_eq!(local::connection_bound(100), 64, "never fewer than 64");
    assert_eq!(local::connection_bound(1 << 20), 25_600, "never more than actix-web's");
    assert_eq!(local::connection_bound(usize::MAX), 25_600, "RLIM_INFINITY");
}
