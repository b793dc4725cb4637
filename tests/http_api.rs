//! HTTP API v1 against a real single-node quorum started in-process
//! (`node::start` on a temporary data directory, raft and HTTP on ephemeral
//! ports). Requests go through `reqwest`'s blocking client on the blocking
//! pool so that the node's actors keep running on this test's System.

mod ports;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use kraft::api::{http_server_here, ApiSecurity, LocalHttpServer, Tokens};
use kraft::config::Config;
use kraft::node::{self, NodeHandle};

/// Every wait in these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(20);

/// A node and its HTTP server, served on the node's thread as the binary
/// does by default; [`TestNode::stop`] takes both down.
struct TestNode {
    handle: NodeHandle,
    server: LocalHttpServer,
    base_url: String,
    _data_dir: tempfile::TempDir,
}

impl TestNode {
    async fn start() -> TestNode {
        TestNode::start_with_tokens(None).await
    }

    async fn start_with_tokens(tokens: Option<Arc<Tokens>>) -> TestNode {
        let data_dir = tempfile::tempdir().expect("tempdir");
        let config = single_node_config(data_dir.path());
        let handle = node::start(config).await.expect("node starts");
        let (server, addr) = http_server_here(
            handle.clone(),
            "127.0.0.1:0".parse().unwrap(),
            kraft::messages::MAX_BATCH_BYTES,
            ApiSecurity {
                tokens: tokens.clone(),
                tls: None,
            },
        )
        .expect("http binds");
        assert_ne!(addr.port(), 0, "the bound address is returned, not the requested one");
        let node = TestNode {
            handle,
            server,
            base_url: format!("http://{addr}"),
            _data_dir: data_dir,
        };
        node.wait_for_leadership().await;
        node
    }

    async fn wait_for_leadership(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            let status = self.handle.describe().await.expect("a running node");
            if status.role == "leader" {
                return;
            }
            assert!(Instant::now() < deadline, "no leader within {WAIT:?}: {status:?}");
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn get(&self, path: &str) -> Reply {
        send(reqwest::Method::GET, format!("{}{path}", self.base_url), None).await
    }

    async fn post(&self, path: &str, body: impl Into<Vec<u8>>) -> Reply {
        send(
            reqwest::Method::POST,
            format!("{}{path}", self.base_url),
            Some(body.into()),
        )
        .await
    }

    async fn stop(self) {
        self.handle.shutdown().await;
        self.server.stop().await;
    }
}

fn single_node_config(data_dir: &Path) -> Config {
    // The voter entry must name the raft listener, so pick a free port
    // rather than asking for port 0.
    let raft = ports::free_addr();
    let mut config = Config::default();
    config.node.state_machine = kraft::config::StateMachineKind::Log;
    config.node.id = 1;
    config.node.data_dir = data_dir.join("node-1");
    config.listeners.raft = raft;
    config.listeners.http = "127.0.0.1:0".parse().unwrap();
    config.quorum.voters = BTreeMap::from([(1, raft.to_string())]);
    config.quorum.election_timeout_ms = 200;
    config.quorum.fetch_timeout_ms = 400;
    config.quorum.request_timeout_ms = 400;
    config.quorum.election_backoff_max_ms = 200;
    config
}

/// A response, read in full.
struct Reply {
    status: u16,
    content_type: String,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; fails the test if it is not JSON.
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("status {}: body is not JSON ({e}): {}", self.status, self.text()))
    }

    /// Asserts an error answer: `status`, a JSON body, the `error` code.
    fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{}", self.text());
        assert!(
            self.content_type.starts_with("application/json"),
            "content type {:?}",
            self.content_type
        );
        assert_eq!(self.json()["error"], code, "{}", self.text());
    }
}

async fn send(method: reqwest::Method, url: String, body: Option<Vec<u8>>) -> Reply {
    tokio::task::spawn_blocking(move || {
        let client = reqwest::blocking::Client::builder()
            .timeout(WAIT)
            .build()
            .expect("http client");
        let mut request = client.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body);
        }
        let response = request.send().unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = response
            .bytes()
            .unwrap_or_else(|e| panic!("{method} {url}: reading the body: {e}"))
            .to_vec();
        Reply {
            status,
            content_type,
            body,
        }
    })
    .await
    .expect("request thread")
}

/// Reads the committed log from its start; asserts the page is well formed
/// (offsets contiguous from the log start, all below the high watermark,
/// known kinds) and returns it.
async fn read_log(node: &TestNode) -> Value {
    let reply = node.get("/v1/log?max=10000").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let page = reply.json();
    let high_watermark = page["high_watermark"].as_i64().expect("high_watermark");
    let log_start_offset = page["log_start_offset"].as_i64().expect("log_start_offset");
    let records = page["records"].as_array().expect("records");
    for (expected_offset, record) in (log_start_offset..).zip(records) {
        assert_eq!(record["offset"], expected_offset, "offsets are contiguous: {page}");
        assert!(expected_offset < high_watermark, "only committed records: {page}");
        let kind = record["kind"].as_str().expect("kind");
        assert!(["data", "leader_change", "noop"].contains(&kind), "kind {kind}");
        if kind != "data" {
            assert!(record["value"].is_null(), "control records carry no value: {record}");
        }
    }
    page
}

fn data_values(page: &Value) -> Vec<String> {
    page["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| r["kind"] == "data")
        .map(|r| r["value"].as_str().expect("data value").to_owned())
        .collect()
}

#[actix_rt::test]
async fn committed_appends_read_back_in_order_with_control_records() {
    let node = TestNode::start().await;
    let epoch = node.get("/v1/quorum").await.json()["leader_epoch"].clone();

    let first = node.post("/v1/append", r#"{"records": ["alpha", "beta"]}"#).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    let base = first["base_offset"].as_i64().expect("base_offset");
    assert_eq!(first["last_offset"].as_i64(), Some(base + 1), "{first}");
    assert_eq!(first["epoch"], epoch);

    let second = node.post("/v1/append", json!({"records": ["gamma"]}).to_string()).await;
    assert_eq!(second.status, 200, "{}", second.text());
    let second = second.json();
    assert!(second["base_offset"].as_i64().unwrap() > base + 1, "{second}");
    assert_eq!(second["last_offset"], second["base_offset"]);

    let page = read_log(&node).await;
    let records = page["records"].as_array().unwrap();
    assert!(page["high_watermark"].as_i64().unwrap() > second["last_offset"].as_i64().unwrap());
    assert_eq!(
        records[0]["kind"], "leader_change",
        "the epoch starts with LeaderChange: {page}"
    );
    assert_eq!(data_values(&page), ["alpha", "beta", "gamma"]);
    for (offset, value) in [(base, "alpha"), (base + 1, "beta")] {
        let record = records
            .iter()
            .find(|r| r["offset"] == offset)
            .expect("appended offset is in the log");
        assert_eq!(record["kind"], "data");
        assert_eq!(record["value"], value);
        assert_eq!(record["epoch"], epoch);
    }

    // A page from an offset, of a given size.
    let reply = node.get(&format!("/v1/log?from={base}&max=2")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let page = reply.json();
    let offsets: Vec<i64> = page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["offset"].as_i64().unwrap())
        .collect();
    assert_eq!(offsets, [base, base + 1]);
    assert_eq!(data_values(&page), ["alpha", "beta"]);
    node.stop().await;
}

#[actix_rt::test]
async fn quorum_healthz_and_metrics_describe_the_leader() {
    let node = TestNode::start().await;
    let appended = node.post("/v1/append", r#"{"records": ["m"]}"#).await;
    assert_eq!(appended.status, 200, "{}", appended.text());

    let quorum = node.get("/v1/quorum").await.json();
    assert_eq!(quorum["node_id"], 1);
    assert_eq!(quorum["leader_id"], 1);
    assert!(quorum["leader_epoch"].as_i64().unwrap() >= 1, "{quorum}");
    assert!(quorum["voters"].as_array().is_some_and(|v| v.len() == 1), "{quorum}");

    let health = node.get("/healthz").await;
    assert_eq!(health.status, 200, "{}", health.text());
    assert_eq!(health.json()["status"], "ok");
    assert_eq!(health.json()["role"], "leader");

    let metrics = node.get("/metrics").await;
    assert_eq!(metrics.status, 200, "{}", metrics.text());
    assert!(
        metrics.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        metrics.content_type
    );
    let text = metrics.text();
    for name in [
        "kraft_raft_current_state",
        "kraft_raft_current_leader",
        "kraft_raft_current_epoch",
        "kraft_raft_high_watermark",
        "kraft_raft_log_end_offset",
        "kraft_raft_commit_latency_avg_ms",
        "kraft_raft_commit_latency_max_ms",
        "kraft_raft_commits_total",
        "kraft_raft_append_records_total",
        "kraft_raft_fetch_records_total",
        "kraft_raft_election_latency_avg_ms",
        "kraft_raft_election_latency_max_ms",
        "kraft_raft_elections_total",
    ] {
        assert!(text.contains(&format!("# HELP {name} ")), "no HELP for {name}:\n{text}");
        assert!(text.contains(&format!("# TYPE {name} ")), "no TYPE for {name}:\n{text}");
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{name} "))),
            "no sample of {name}:\n{text}"
        );
    }
    // current-state 3 is leader, Kafka's numbering.
    assert!(text.lines().any(|l| l == "kraft_raft_current_state 3"), "{text}");
    assert!(text.lines().any(|l| l == "kraft_raft_current_leader 1"), "{text}");
    node.stop().await;
}

#[actix_rt::test]
async fn bad_requests_get_json_errors_and_write_nothing() {
    let node = TestNode::start().await;
    for body in [
        "{not json",
        r#"{"records": []}"#,
        r#"{"records": [1, 2]}"#,
        r#"{"records": "text"}"#,
        r#"["a"]"#,
    ] {
        node.post("/v1/append", body).await.assert_error(400, "BAD_REQUEST");
    }
    // 8 MiB of record text plus the JSON around it: over the batch cap.
    let oversize = json!({ "records": ["x".repeat(8 << 20)] }).to_string();
    node.post("/v1/append", oversize)
        .await
        .assert_error(413, "PAYLOAD_TOO_LARGE");
    for query in ["from=abc", "from=-1", "max=0", "max=many"] {
        node.get(&format!("/v1/log?{query}"))
            .await
            .assert_error(400, "BAD_REQUEST");
    }
    node.get("/v1/nothing").await.assert_error(404, "NOT_FOUND");

    let page = read_log(&node).await;
    assert!(data_values(&page).is_empty(), "a refused request wrote records: {page}");
    // The node still takes good appends afterwards.
    let reply = node.post("/v1/append", r#"{"records": ["ok"]}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    node.stop().await;
}

/// An append sent to a node that has stopped (a graceful shutdown stops
/// the node before the HTTP server, and a failed node stops on its own)
/// was never taken: it is UNAVAILABLE, which a client may retry elsewhere,
/// not OUTCOME_UNKNOWN, which tells it the records may have been written.
#[actix_rt::test]
async fn an_append_to_a_stopped_node_is_unavailable_not_of_unknown_outcome() {
    let node = TestNode::start().await;
    node.handle.shutdown().await;
    node.post("/v1/append", r#"{"records": ["never taken"]}"#)
        .await
        .assert_error(503, "UNAVAILABLE");
    node.get("/v1/quorum").await.assert_error(503, "UNAVAILABLE");
    node.stop().await;
}

const ADMIN_TOKEN: &str = "admin-0123456789abcdef";
const READ_TOKEN: &str = "read-0123456789abcdef";

/// A request with `token` as its bearer token: the status, the body's
/// `error` code (if any) and the `WWW-Authenticate` header.
async fn send_as(method: reqwest::Method, url: String, token: Option<&'static str>) -> (u16, String, Option<String>) {
    tokio::task::spawn_blocking(move || {
        let client = reqwest::blocking::Client::builder().timeout(WAIT).build().unwrap();
        let mut request = client.request(method.clone(), &url);
        if method == reqwest::Method::POST {
            request = request.body(r#"{"records": ["secret"]}"#);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = response.status().as_u16();
        let challenge = response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        let body: Value = response.json().unwrap_or(Value::Null);
        (status, body["error"].as_str().unwrap_or_default().to_owned(), challenge)
    })
    .await
    .unwrap()
}

/// With a tokens file: no token or an unknown one is 401 with a Bearer
/// challenge, a read token reads and gets 403 on a write, an admin token
/// writes, and `/healthz` is open.
#[actix_rt::test]
async fn with_tokens_a_request_needs_a_token_and_a_write_needs_an_admin_one() {
    let tokens = Tokens::parse(&format!("admin {ADMIN_TOKEN}\nread {READ_TOKEN}\n")).unwrap();
    let node = TestNode::start_with_tokens(Some(Arc::new(tokens))).await;
    let url = |path: &str| format!("{}{path}", node.base_url);
    use reqwest::Method;
    for token in [None, Some("nobody-0123456789abcdef"), Some("Basic xyz")] {
        let (status, error, challenge) = send_as(Method::GET, url("/v1/log"), token).await;
        assert_eq!((status, error.as_str()), (401, "UNAUTHENTICATED"), "{token:?}");
        assert_eq!(challenge.as_deref(), Some("Bearer"));
        let (status, error, _) = send_as(Method::POST, url("/v1/append"), token).await;
        assert_eq!((status, error.as_str()), (401, "UNAUTHENTICATED"), "{token:?}");
    }
    let (status, _, _) = send_as(Method::GET, url("/healthz"), None).await;
    assert_eq!(status, 200, "a probe needs no token");
    let (status, _, _) = send_as(Method::GET, url("/v1/log"), Some(READ_TOKEN)).await;
    assert_eq!(status, 200);
    let (status, _, _) = send_as(Method::GET, url("/v1/quorum"), Some(READ_TOKEN)).await;
    assert_eq!(status, 200);
    for path in ["/v1/append", "/v1/snapshot"] {
        let (status, error, _) = send_as(Method::POST, url(path), Some(READ_TOKEN)).await;
        assert_eq!(
            (status, error.as_str()),
            (403, "CLUSTER_AUTHORIZATION_FAILED"),
            "{path}"
        );
    }
    let (status, error, _) = send_as(Method::POST, url("/v1/append"), Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{error}");
    // Only the admin's append is in the log.
    let page = node.handle.read_records(0, 100).await.unwrap();
    let appended = page
        .records
        .iter()
        .filter(|r| r.record == kraft::messages::Record::Data(b"secret".to_vec()))
        .count();
    assert_eq!(appended, 1);
    node.stop().await;
}
