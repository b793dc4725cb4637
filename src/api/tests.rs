//! The HTTP layer against a fake node: status codes and bodies for every
//! outcome, including the ones a single-node quorum cannot produce on
//! demand (NOT_LEADER, OUTCOME_UNKNOWN).

use std::sync::{Arc, Mutex};

use actix_web::http::StatusCode;
use actix_web::test::{call_service, init_service, read_body, TestRequest};
use actix_web::App;
use serde_json::Value;

use super::*;

/// Answers appends with `append_result` and records the arguments of every
/// call it gets.
#[derive(Clone)]
struct FakeNode {
    append_result: Result<Appended, AppendError>,
    appended: Arc<Mutex<Vec<Vec<Vec<u8>>>>>,
    reads: Arc<Mutex<Vec<(Offset, usize)>>>,
}

impl FakeNode {
    fn answering(append_result: Result<Appended, AppendError>) -> Self {
        FakeNode {
            append_result,
            appended: Arc::default(),
            reads: Arc::default(),
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
        self.append_result.clone()
    }
    async fn describe(&self) -> Result<QuorumStatus, NodeError> {
        Ok(status())
    }
    async fn read_committed(&self, from: Offset, max: usize) -> Result<LogPage, NodeError> {
        self.reads.lock().unwrap().push((from, max));
        Ok(LogPage {
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
    let (status, value) = send_json(&node, TestRequest::get().uri("/v1/append")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(value["error"], "METHOD_NOT_ALLOWED");
    let (status, value) = send_json(&node, TestRequest::delete().uri("/v1/quorum")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(value["error"], "METHOD_NOT_ALLOWED");
    assert!(node.appended.lock().unwrap().is_empty());
}

/// The real server on an ephemeral port: a body over the cap is answered
/// 413 in JSON even though the client is still sending it.
#[actix_rt::test]
async fn served_oversize_bodies_are_413_over_the_wire() {
    let node = FakeNode::committed();
    let (server, addr) = serve(node.clone(), "127.0.0.1:0".parse().unwrap(), 1 << 20, 1).unwrap();
    assert_ne!(addr.port(), 0);
    let server_handle = server.handle();
    actix_rt::spawn(server);
    let results = tokio::task::spawn_blocking(move || {
        let client = reqwest::blocking::Client::builder()
            .timeout(std::time::Duration::from_secs(20))
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
    })
    .await
    .unwrap();
    server_handle.stop(true).await;
    for (status, body) in &results[..3] {
        assert_eq!(*status, 413, "{body}");
        assert_eq!(body["error"], "PAYLOAD_TOO_LARGE");
    }
    assert_eq!(results[3].0, 200);
    assert_eq!(node.appended.lock().unwrap().len(), 1);
}
