//! TLS with the real binary: `kraft certs` writes a development CA and
//! node certificates, three nodes run with mutual TLS between them, TLS and
//! bearer tokens on the HTTP API and the client listener. A peer whose
//! certificate is not from the cluster's CA, or that speaks plain TCP, is
//! refused at the handshake and the refusal is logged. Every process is
//! killed when its guard drops.

mod node_process;
mod ports;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kraft::messages::client::{
    decode_body, encode_frame_into, ClientFrame, ClientRequest, ClientResponse, Scope, CLIENT_PROTOCOL_VERSION,
};
use node_process::{run_args, spawn_logged, Log};
use rustls::pki_types::ServerName;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);
const ADMIN: &str = "admin-0123456789abcdef";
const READER: &str = "read-0123456789abcdef";

fn kraft() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kraft"))
}

/// `kraft certs` into `dir` for `nodes`.
fn certs(dir: &Path, nodes: &str) {
    let out = kraft()
        .args(["certs", "--out"])
        .arg(dir)
        .args(["--nodes", nodes])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

struct Node {
    http: u16,
    raft: u16,
    client: u16,
    child: Child,
    log: Log,
}

impl Node {
    fn start(id: usize, dir: &Path, certs: &Path, raft_ports: &[u16]) -> Node {
        let voters = raft_ports
            .iter()
            .enumerate()
            .map(|(i, port)| format!("\"{}@127.0.0.1:{port}\"", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let (http, client, raft) = (ports::free_port(), ports::free_port(), raft_ports[id - 1]);
        let tokens = dir.join("tokens");
        let data_dir = dir.join(format!("node-{id}"));
        let mut command = kraft();
        run_args(&mut command, id, &data_dir, raft, http, &format!("[{voters}]"))
            .args(["--set", &format!("listeners.client=127.0.0.1:{client}")])
            .args(["--set", &format!("security.tokens_file={}", tokens.display())])
            .args([
                "--set",
                &format!("security.tls_ca_file={}", certs.join("ca.pem").display()),
            ])
            .args([
                "--set",
                &format!(
                    "security.tls_cert_file={}",
                    certs.join(format!("node-{id}.pem")).display()
                ),
            ])
            .args([
                "--set",
                &format!(
                    "security.tls_key_file={}",
                    certs.join(format!("node-{id}.key")).display()
                ),
            ]);
        let log = Log::default();
        let child = spawn_logged(&mut command, &log);
        Node {
            http,
            raft,
            client,
            child,
            log,
        }
    }

    fn log_line(&self, matches: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Some(line) = self.log.lock().unwrap().iter().find(|l| matches(l)) {
                return Some(line.clone());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap();
        log.iter().rev().take(20).rev().cloned().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TLS client connection to 127.0.0.1:`port` that trusts `ca`, with
/// `client_cert` (a `node-<id>` name in `client_cert.0`) if given.
fn tls_stream(
    ca: &Path,
    port: u16,
    client_cert: Option<(&Path, &str)>,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let roots = kraft::tls::read_roots(ca).unwrap();
    #[allow(deprecated)] // ring, as the node uses (src/tls.rs)
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client_cert {
        None => builder.with_no_client_auth(),
        Some((dir, name)) => {
            let certs = rustls_pemfile::certs(&mut &std::fs::read(dir.join(format!("{name}.pem"))).unwrap()[..])
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls_pemfile::private_key(&mut &std::fs::read(dir.join(format!("{name}.key"))).unwrap()[..])
                .unwrap()
                .unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
    };
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let mut stream = rustls::StreamOwned::new(rustls::ClientConnection::new(Arc::new(config), name).unwrap(), tcp);
    // Drive the handshake to its end (a refusal shows here).
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(stream)
}

/// An HTTPS request; the status and the JSON body.
fn https(ca: &Path, port: u16, method: &str, path: &str, token: &str, body: &str) -> std::io::Result<(u16, Value)> {
    let mut stream = tls_stream(ca, port, None)?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&buffer[..n]),
            // The server may close without close_notify once it answered.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
    }
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

fn leader_of(nodes: &[Node], ca: &Path) -> usize {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        let leaders: Vec<usize> = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| {
                https(ca, n.http, "GET", "/v1/quorum", READER, "").is_ok_and(|(_, q)| q["role"] == "leader")
            })
            .map(|(i, _)| i)
            .collect();
        if let [leader] = leaders[..] {
            return leader;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs: Vec<String> = nodes.iter().map(Node::log_tail).collect();
    panic!("no leader over mutual TLS:\n{}", logs.join("\n---\n"));
}

fn client_call(stream: &mut impl ReadWrite, correlation_id: u64, body: ClientRequest) -> ClientResponse {
    let mut frame = Vec::new();
    let request = ClientFrame {
        version: CLIENT_PROTOCOL_VERSION,
        correlation_id,
        body,
    };
    encode_frame_into(&request, &mut frame).unwrap();
    stream.write_all(&frame).unwrap();
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).unwrap();
    let mut answer = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut answer).unwrap();
    decode_body(&answer).unwrap()
}

/// A raft frame: a pre-vote from node 2 in a far epoch, as a peer sends.
fn pre_vote() -> Vec<u8> {
    use kraft::messages::{Body, Envelope, RaftRequest, VoteRequest};
    let envelope = Envelope {
        version: kraft::messages::codec::WIRE_VERSION,
        source_id: 2,
        correlation_id: 1,
        cluster_id: "kraft-local".to_string(),
        body: Body::Request(RaftRequest::Vote(VoteRequest {
            epoch: 1_000,
            candidate_id: 2,
            last_epoch: 0,
            last_epoch_end_offset: 0,
            pre_vote: true,
        })),
    };
    let mut frame = Vec::new();
    kraft::messages::codec::encode_frame_into(&envelope, &mut frame).unwrap();
    frame
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

#[test]
fn a_tls_cluster_with_tokens_runs_and_refuses_a_peer_without_the_clusters_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs_dir = dir.path().join("certs");
    certs(&certs_dir, "1,2,3");
    let ca = certs_dir.join("ca.pem");
    std::fs::write(dir.path().join("tokens"), format!("admin {ADMIN}\nread {READER}\n")).unwrap();
    let raft_ports: Vec<u16> = (0..3).map(|_| ports::free_port()).collect();
    let nodes: Vec<Node> = (1..=3)
        .map(|id| Node::start(id, dir.path(), &certs_dir, &raft_ports))
        .collect();

    // The quorum forms over mutual TLS; a write sent to a follower is
    // forwarded to the active controller over it.
    let leader = leader_of(&nodes, &ca);
    let follower = &nodes[(leader + 1) % 3];
    let topic = r#"{"name": "secure", "partitions": 2, "replication_factor": 1}"#;
    // The nodes register themselves as brokers once a controller is active.
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = https(&ca, follower.http, "POST", "/v1/topics", ADMIN, topic).unwrap();
        if status == 200 {
            break;
        }
        assert!(
            body["error"] == "INVALID_REPLICATION_FACTOR" && Instant::now() < deadline,
            "{status} {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = https(&ca, follower.http, "POST", "/v1/topics", READER, topic).unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("CLUSTER_AUTHORIZATION_FAILED"))
    );

    // `kraft snapshot` speaks TLS with the node's CA and its admin token.
    let out = kraft()
        .arg("snapshot")
        .arg("--config")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"))
        .args(["--set", &format!("listeners.http=127.0.0.1:{}", follower.http)])
        .args([
            "--set",
            &format!("security.tokens_file={}", dir.path().join("tokens").display()),
        ])
        .args(["--set", &format!("security.tls_ca_file={}", ca.display())])
        .args([
            "--set",
            &format!("security.tls_cert_file={}", certs_dir.join("node-1.pem").display()),
        ])
        .args([
            "--set",
            &format!("security.tls_key_file={}", certs_dir.join("node-1.key").display()),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let snapshot: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(snapshot["end_offset"].as_i64().unwrap() > 0, "{snapshot}");

    // Plain HTTP on the HTTPS port gets no answer.
    let mut plain = TcpStream::connect(("127.0.0.1", follower.http)).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !String::from_utf8_lossy(&answer).contains("200 OK"),
        "plain HTTP was served"
    );

    // The client listener over TLS, with a token.
    let mut client = tls_stream(&ca, follower.client, None).unwrap();
    assert_eq!(
        client_call(&mut client, 1, ClientRequest::Quorum),
        ClientResponse::Error(kraft::messages::client::ClientError::Unauthenticated(
            "this node requires a token: send Authenticate first (security.tokens_file)".to_string()
        ))
    );
    assert_eq!(
        client_call(
            &mut client,
            2,
            ClientRequest::Authenticate {
                token: READER.to_string()
            }
        ),
        ClientResponse::Authenticated(Scope::Read)
    );
    assert!(matches!(
        client_call(&mut client, 3, ClientRequest::Quorum),
        ClientResponse::Quorum(_)
    ));
    // kraft::client over TLS: Client and Producer.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use kraft::client::{Client, ConnectOptions, Error, Producer, ProducerOptions};
        let addr = ("127.0.0.1", follower.client);
        let options = ConnectOptions::default().with_tls(&ca, "127.0.0.1").unwrap();
        let mut reader = Client::connect_with_options(addr, options.clone().with_token(READER))
            .await
            .unwrap();
        assert!(!reader.quorum().await.unwrap().role.is_empty());
        reader.read(0, 5).await.unwrap();
        let plain = Client::connect_with_options(addr, ConnectOptions::default().with_token(READER)).await;
        assert!(plain.is_err(), "plaintext was served on the TLS client listener");
        let producer = Producer::connect_with_options(addr, ProducerOptions::default(), options.with_token(ADMIN))
            .await
            .unwrap();
        // A metadata node takes no raw append: the refusal crossed TLS.
        match producer.append(vec![b"raw".to_vec()]).await {
            Err(Error::Node(refusal)) => assert_eq!(refusal.code(), "UNSUPPORTED"),
            other => panic!("{other:?}"),
        }
    });

    // A peer with a certificate from another CA: its handshake with a
    // node's raft listener fails, and the node logs the refusal.
    let rogue_dir = dir.path().join("rogue");
    certs(&rogue_dir, "1");
    let target = &nodes[leader];
    // TLS 1.3: the client's certificate is judged after the client's side
    // of the handshake is done, so the refusal shows as no answer to a
    // well-formed pre-vote (one the node answers over a good connection).
    let answered = |client_cert: Option<(&Path, &str)>| {
        tls_stream(&ca, target.raft, client_cert)
            .and_then(|mut stream| {
                stream.write_all(&pre_vote())?;
                let mut len = [0u8; 4];
                stream.read_exact(&mut len)
            })
            .is_ok()
    };
    assert!(
        answered(Some((&certs_dir, "node-2"))),
        "a member's pre-vote is answered"
    );
    assert!(
        !answered(Some((&rogue_dir, "node-1"))),
        "a foreign certificate was taken"
    );
    assert!(!answered(None), "a peer without a certificate was taken");
    let mut tcp = TcpStream::connect(("127.0.0.1", target.raft)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = tcp.write_all(&[0, 0, 0, 5, 1, 2, 3, 4, 5]);
    let mut sink = Vec::new();
    let _ = tcp.read_to_end(&mut sink);
    // At most a TLS alert (record type 21), never a raft answer.
    assert!(
        sink.is_empty() || sink[0] == 21,
        "plain TCP got an answer from the raft listener: {sink:?}"
    );
    let line = target
        .log_line(|l| l.contains("raft connection refused: TLS handshake failed"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{}", target.log_tail()));
    assert!(line.contains("127.0.0.1"), "the log names the peer: {line}");

    assert!(answered(Some((&certs_dir, "node-3"))), "and members still are");
    let (status, body) = https(&ca, nodes[leader].http, "GET", "/v1/topics/secure", READER, "").unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["partitions"].as_array().map(Vec::len), Some(2));
}

#[test]
fn bad_tls_files_stop_the_node_at_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let certs_dir = dir.path().join("certs");
    certs(&certs_dir, "1");
    let run = |sets: &[String]| {
        let mut command = kraft();
        command
            .arg("run")
            .arg("--config")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"));
        for set in sets {
            command.args(["--set", set]);
        }
        let out = command.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let file = |name: &str| -> PathBuf { certs_dir.join(name) };
    let sets = |ca: PathBuf, cert: PathBuf, key: PathBuf| {
        vec![
            format!("security.tls_ca_file={}", ca.display()),
            format!("security.tls_cert_file={}", cert.display()),
            format!("security.tls_key_file={}", key.display()),
            format!("node.data_dir={}", dir.path().join("data").display()),
        ]
    };
    let (code, stderr) = run(&sets(file("ca.pem"), file("node-7.pem"), file("node-1.key")));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("node-7.pem"), "{stderr}");
    let (code, stderr) = run(&sets(file("node-1.key"), file("node-1.pem"), file("node-1.key")));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("node-1.key"), "{stderr}");
    // Only some of the three keys.
    let (code, stderr) = run(&[format!("security.tls_ca_file={}", file("ca.pem").display())]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("security.tls_cert_file"), "{stderr}");
}
