//! A 3-node kraft cluster of real `kraft run` processes on 127.0.0.1 (plus
//! observers, stops and restarts for the `state` command), and the HTTP
//! client that appends to its leader.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde::Deserialize;

use crate::http::HttpConn;
use crate::load;
use crate::procs::{self, ProcessGuard};

/// Longest wait for the three nodes to agree on a leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);

/// The kraft release binary: `--kraft-bin` if given, else built with
/// `cargo build --release --locked --bin kraft` in the repository root.
pub fn locate_or_build(kraft_bin: Option<&Path>, repo_root: &Path) -> Result<PathBuf> {
    if let Some(bin) = kraft_bin {
        if !bin.is_file() {
            bail!("--kraft-bin {}: no such file", bin.display());
        }
        return Ok(bin.to_path_buf());
    }
    eprintln!(
        "building kraft: cargo build --release --locked --bin kraft (in {})",
        repo_root.display()
    );
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--release", "--locked", "--bin", "kraft"])
        .current_dir(repo_root)
        .status()
        .context("cannot run cargo to build kraft")?;
    if !status.success() {
        bail!("building kraft failed ({status}); fix the build or pass --kraft-bin PATH to a kraft release binary");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root.join("target"));
    let bin = target.join("release").join("kraft");
    if !bin.is_file() {
        bail!("cargo built kraft but {} is missing", bin.display());
    }
    Ok(bin)
}

/// A running 3-node cluster, plus any observers added later. Dropping it
/// stops the processes, then removes the data directories (field order
/// matters).
pub struct KraftCluster {
    processes: ProcessGuard,
    /// The voters' HTTP addresses: node id `i + 1` at index `i`.
    pub http: Vec<SocketAddr>,
    /// The voters' client listeners (`listeners.client`), as `http`; empty
    /// unless started with [`KraftCluster::start_native`].
    pub client: Vec<SocketAddr>,
    /// Every node started, voters first.
    nodes: Vec<Node>,
    bin: PathBuf,
    cluster_id: String,
    /// The `quorum.voters` list, as TOML array items.
    voters: String,
    /// Appended to every node's config (e.g. `[log]` and `[snapshot]` keys).
    extra_toml: String,
    /// The nodes keep the metadata image (the voters in combined mode)
    /// instead of a raw log.
    metadata: bool,
    dir: tempfile::TempDir,
}

/// One node of the cluster: where it listens and keeps its files, and the
/// process now running it (None while stopped).
struct Node {
    id: usize,
    pid: Option<u32>,
    http: SocketAddr,
    config: PathBuf,
    data_dir: PathBuf,
    /// The log file of the latest start.
    log: PathBuf,
    /// Times started; every start writes a log file of its own, so that a
    /// restart does not overwrite what the crashed process wrote.
    starts: usize,
}

/// A node's `GET /v1/quorum` answer (the fields the harness reads).
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
pub struct QuorumView {
    pub role: String,
    pub leader_id: Option<u64>,
    pub leader_epoch: u64,
    #[serde(default)]
    pub high_watermark: u64,
    #[serde(default)]
    pub log_start_offset: u64,
    #[serde(default)]
    pub log_end_offset: u64,
}

impl KraftCluster {
    /// Writes three configs (fresh cluster id, fresh data directories under
    /// `data_root`, free ports) and starts `kraft run --config FILE` for each.
    pub fn start(bin: &Path, data_root: &Path) -> Result<KraftCluster> {
        KraftCluster::start_with(bin, data_root, "")
    }

    /// [`KraftCluster::start`] with `extra_toml` appended to every node's
    /// config, observers added later included. It may only add tables the
    /// generated config does not have (`[log]`, `[snapshot]`, `[metadata]`).
    pub fn start_with(bin: &Path, data_root: &Path, extra_toml: &str) -> Result<KraftCluster> {
        KraftCluster::launch(bin, data_root, extra_toml, false, false)
    }

    /// Three voters in metadata mode, each also a broker (combined mode);
    /// observers added later are brokers.
    pub fn start_metadata(bin: &Path, data_root: &Path, extra_toml: &str) -> Result<KraftCluster> {
        KraftCluster::launch(bin, data_root, extra_toml, false, true)
    }

    /// [`KraftCluster::start`] with every voter serving the client protocol
    /// too (`listeners.client`, on a free port; see `client`).
    pub fn start_native(bin: &Path, data_root: &Path) -> Result<KraftCluster> {
        KraftCluster::launch(bin, data_root, "", true, false)
    }

    fn launch(bin: &Path, data_root: &Path, extra_toml: &str, native: bool, metadata: bool) -> Result<KraftCluster> {
        let dir = procs::data_dir(data_root, "kraft-bench-kraft-")?;
        let nanos = procs::since_epoch().as_nanos();
        let cluster_id = format!("bench-{}-{nanos:x}", std::process::id());
        let ports = procs::free_ports(if native { 9 } else { 6 })?;
        let (raft, rest) = ports.split_at(3);
        let (http, client) = rest.split_at(3);
        let voters = raft
            .iter()
            .enumerate()
            .map(|(i, port)| format!("\"{}@127.0.0.1:{port}\"", i + 1))
            .collect::<Vec<_>>()
            .join(", ");
        let mut cluster = KraftCluster {
            processes: ProcessGuard::default(),
            http: http
                .iter()
                .map(|port| SocketAddr::from(([127, 0, 0, 1], *port)))
                .collect(),
            client: client
                .iter()
                .map(|port| SocketAddr::from(([127, 0, 0, 1], *port)))
                .collect(),
            nodes: Vec::new(),
            bin: bin.to_path_buf(),
            cluster_id,
            voters,
            extra_toml: extra_toml.to_string(),
            metadata,
            dir,
        };
        for i in 0..3 {
            cluster.add_node(i + 1, "controller", raft[i], http[i])?;
        }
        Ok(cluster)
    }

    /// Starts an observer (`roles = ["broker"]`): node `id`, which must not
    /// be a voter, with a fresh empty data directory, free ports, and the
    /// same cluster id and voters. Returns its HTTP address.
    pub fn add_observer(&mut self, id: usize) -> Result<SocketAddr> {
        if self.nodes.iter().any(|n| n.id == id) {
            bail!("node {id} already exists");
        }
        let ports = procs::free_ports(2)?;
        self.add_node(id, "broker", ports[0], ports[1])?;
        Ok(SocketAddr::from(([127, 0, 0, 1], ports[1])))
    }

    /// Writes node `id`'s config and starts it.
    fn add_node(&mut self, id: usize, role: &str, raft: u16, http: u16) -> Result<()> {
        let config = self.dir.path().join(format!("node{id}.toml"));
        let data_dir = self.dir.path().join(format!("node-{id}"));
        let mut text = node_config(id, role, &data_dir, &self.cluster_id, raft, http, &self.voters);
        if self.metadata {
            text = text.replace("state_machine = \"log\"", "state_machine = \"metadata\"");
            text = text.replace("roles = [\"controller\"]", "roles = [\"broker\", \"controller\"]");
        }
        if let Some(client) = self.client.get(id - 1) {
            let http_line = format!("http = \"127.0.0.1:{http}\"\n");
            text = text.replace(&http_line, &format!("{http_line}client = \"{client}\"\n"));
        }
        text.push_str(&self.extra_toml);
        std::fs::write(&config, text).with_context(|| format!("cannot write {}", config.display()))?;
        self.nodes.push(Node {
            id,
            pid: None,
            http: SocketAddr::from(([127, 0, 0, 1], http)),
            config,
            data_dir,
            log: PathBuf::new(),
            starts: 0,
        });
        self.spawn_node(id)
    }

    /// Starts `kraft run --config FILE` for node `id` (not running now), with
    /// its output in `node{id}.log` (`node{id}-{n}.log` for the n-th start).
    fn spawn_node(&mut self, id: usize) -> Result<()> {
        let index = self.index_of(id)?;
        let node = &mut self.nodes[index];
        if node.pid.is_some() {
            bail!("node {id} is running");
        }
        node.starts += 1;
        let log = match node.starts {
            1 => self.dir.path().join(format!("node{id}.log")),
            n => self.dir.path().join(format!("node{id}-{n}.log")),
        };
        let mut command = Command::new(&self.bin);
        command.arg("run").arg("--config").arg(&node.config);
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        node.pid = Some(self.processes.spawn(&format!("kraft node {id}"), command, &log)?);
        node.log = log;
        Ok(())
    }

    /// Stops node `id` with `signal` (SIGKILL: a crash); see
    /// [`ProcessGuard::stop`]. Returns how long it took to exit.
    pub fn stop_node(&mut self, id: usize, signal: libc::c_int) -> Result<Duration> {
        let index = self.index_of(id)?;
        let pid = self.nodes[index]
            .pid
            .take()
            .with_context(|| format!("node {id} is not running"))?;
        Ok(self.processes.stop(pid, signal)?.0)
    }

    /// Starts node `id` again on its config and data directory.
    pub fn restart_node(&mut self, id: usize) -> Result<()> {
        self.spawn_node(id)
    }

    fn index_of(&self, id: usize) -> Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .with_context(|| format!("no node {id}"))
    }

    /// Node `id`'s process id while it runs.
    pub fn pid(&self, id: usize) -> Option<u32> {
        self.index_of(id).ok().and_then(|i| self.nodes[i].pid)
    }

    /// Node `id`'s HTTP address.
    pub fn http_of(&self, id: usize) -> Result<SocketAddr> {
        Ok(self.nodes[self.index_of(id)?].http)
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: usize) -> Result<PathBuf> {
        Ok(self.nodes[self.index_of(id)?].data_dir.clone())
    }

    /// Node `id`'s log file (of its latest start).
    pub fn log_of(&self, id: usize) -> Result<PathBuf> {
        Ok(self.nodes[self.index_of(id)?].log.clone())
    }

    /// (id, HTTP address) of every node running now.
    pub fn running(&self) -> Vec<(usize, SocketAddr)> {
        self.nodes
            .iter()
            .filter(|n| n.pid.is_some())
            .map(|n| (n.id, n.http))
            .collect()
    }

    /// Where the configs, data directories and server logs are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.processes.pids()
    }

    /// Fails, quoting the end of its log, if a started server has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.processes.check_running()
    }

    /// (name, log file) of every running server.
    pub fn logs(&self) -> Vec<(String, PathBuf)> {
        self.processes.logs()
    }

    /// The end of every running server's log, for error messages.
    pub fn log_tails(&self, lines: usize) -> String {
        self.processes.log_tails(lines)
    }

    /// Waits until one node is leader and all three name it in the same
    /// epoch; returns its node id.
    pub async fn wait_for_leader_id(&mut self) -> Result<usize> {
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        let mut last = String::from("no answer yet");
        loop {
            self.processes.check_running()?;
            let mut views = Vec::new();
            for addr in &self.http {
                match quorum_view(*addr).await {
                    Ok(view) => views.push(view),
                    Err(e) => last = e,
                }
            }
            if views.len() == 3 {
                if let Some(leader) = views.iter().find(|v| v.role == "leader") {
                    let agreed = views
                        .iter()
                        .all(|v| v.leader_id == leader.leader_id && v.leader_epoch == leader.leader_epoch);
                    if let (true, Some(id)) = (agreed, leader.leader_id) {
                        return Ok(id as usize);
                    }
                }
                last = views
                    .iter()
                    .map(|v| format!("{}/{:?}@{}", v.role, v.leader_id, v.leader_epoch))
                    .collect::<Vec<_>>()
                    .join(", ");
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "kraft: no agreed leader after {LEADER_WAIT:?} (last: {last})\n{}",
                    self.processes.log_tails(10)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One `GET /v1/quorum` on a fresh connection.
pub async fn quorum_view(addr: SocketAddr) -> Result<QuorumView, String> {
    let (status, body) = HttpConn::new(addr).get("/v1/quorum").await?;
    if !status.is_success() {
        return Err(format!("GET /v1/quorum on {addr}: {status}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("GET /v1/quorum on {addr}: {e}"))
}

/// A node's TOML config, shaped like examples/node1.toml (the keys left out
/// keep their defaults, which are the examples' values). `role` is
/// `controller` (a voter) or `broker` (an observer).
pub fn node_config(
    id: usize,
    role: &str,
    data_dir: &Path,
    cluster_id: &str,
    raft: u16,
    http: u16,
    voters: &str,
) -> String {
    format!(
        r#"# Written by kraft-bench for one benchmark run.
[node]
id = {id}
roles = ["{role}"]
state_machine = "log"
data_dir = "{data_dir}"
cluster_id = "{cluster_id}"

[listeners]
raft = "127.0.0.1:{raft}"
http = "127.0.0.1:{http}"

[quorum]
voters = [{voters}]
"#,
        data_dir = data_dir.display(),
    )
}

/// One closed-loop client: its own keep-alive connection to the leader,
/// `POST /v1/append` of one record per request.
pub struct AppendClient {
    conn: HttpConn,
    id: usize,
    seq: u64,
    value_bytes: usize,
}

impl AppendClient {
    pub fn new(leader: SocketAddr, id: usize, value_bytes: usize) -> AppendClient {
        AppendClient {
            conn: HttpConn::new(leader),
            id,
            seq: 0,
            value_bytes,
        }
    }
}

impl load::Client for AppendClient {
    async fn request(&mut self) -> Result<u64, String> {
        self.seq += 1;
        let value = load::payload(self.id, self.seq, self.value_bytes);
        let body = serde_json::to_vec(&serde_json::json!({ "records": [value] })).expect("json");
        let (status, answer) = self.conn.post("/v1/append", Bytes::from(body)).await?;
        if status.is_success() {
            Ok(1)
        } else {
            Err(format!(
                "HTTP {}: {}",
                status.as_u16(),
                String::from_utf8_lossy(&answer[..answer.len().min(200)])
            ))
        }
    }
}

/// One closed-loop client of the client protocol: its own connection to the
/// leader's client listener, one record per append.
pub struct NativeAppendClient {
    addr: SocketAddr,
    client: Option<kraft::client::Client>,
    id: usize,
    seq: u64,
    value_bytes: usize,
}

impl NativeAppendClient {
    pub fn new(leader: SocketAddr, id: usize, value_bytes: usize) -> NativeAppendClient {
        NativeAppendClient {
            addr: leader,
            client: None,
            id,
            seq: 0,
            value_bytes,
        }
    }
}

impl load::Client for NativeAppendClient {
    async fn request(&mut self) -> Result<u64, String> {
        self.seq += 1;
        let value = load::payload(self.id, self.seq, self.value_bytes);
        if self.client.is_none() {
            let client = kraft::client::Client::connect(self.addr)
                .await
                .map_err(|e| e.to_string())?;
            self.client = Some(client);
        }
        let client = self.client.as_mut().expect("just connected");
        client
            .append(vec![value.into_bytes()])
            .await
            .map(|_| 1)
            .map_err(|e| e.to_string())
    }
}

/// One closed-loop client of a [`kraft::client::Producer`] shared by every
/// client: one record per append, all over the producer's one connection.
pub struct ProducerAppendClient {
    producer: kraft::client::Producer,
    id: usize,
    seq: u64,
    value_bytes: usize,
}

impl ProducerAppendClient {
    pub fn new(producer: kraft::client::Producer, id: usize, value_bytes: usize) -> ProducerAppendClient {
        ProducerAppendClient {
            producer,
            id,
            seq: 0,
            value_bytes,
        }
    }
}

impl load::Client for ProducerAppendClient {
    async fn request(&mut self) -> Result<u64, String> {
        self.seq += 1;
        let value = load::payload(self.id, self.seq, self.value_bytes);
        self.producer
            .append(vec![value.into_bytes()])
            .await
            .map(|_| 1)
            .map_err(|e| e.to_string())
    }
}
