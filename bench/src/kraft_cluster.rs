//! A 3-node kraft cluster of real `kraft run` processes on 127.0.0.1, and
//! the HTTP client that appends to its leader.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// A running 3-node cluster. Dropping it stops the processes, then removes
/// the data directories (field order matters).
pub struct KraftCluster {
    processes: ProcessGuard,
    pub http: Vec<SocketAddr>,
    _dir: tempfile::TempDir,
}

#[derive(Deserialize)]
struct QuorumView {
    role: String,
    leader_id: Option<u64>,
    leader_epoch: u64,
}

impl KraftCluster {
    /// Writes three configs (fresh cluster id, fresh data directories under
    /// `data_root`, free ports) and starts `kraft run --config FILE` for each.
    pub fn start(bin: &Path, data_root: &Path) -> Result<KraftCluster> {
        let dir = procs::data_dir(data_root, "kraft-bench-kraft-")?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let cluster_id = format!("bench-{}-{nanos:x}", std::process::id());
        let ports = procs::free_ports(6)?;
        let (raft, http) = ports.split_at(3);
        let voters = raft
            .iter()
            .enumerate()
            .map(|(i, port)| format!("\"{}@127.0.0.1:{port}\"", i + 1))
            .collect::<Vec<_>>()
            .join(", ");
        let mut processes = ProcessGuard::default();
        for i in 0..3 {
            let id = i + 1;
            let config = dir.path().join(format!("node{id}.toml"));
            let data_dir = dir.path().join(format!("node-{id}"));
            std::fs::write(
                &config,
                node_config(id, &data_dir, &cluster_id, raft[i], http[i], &voters),
            )
            .with_context(|| format!("cannot write {}", config.display()))?;
            let mut command = Command::new(bin);
            command.arg("run").arg("--config").arg(&config);
            if std::env::var_os("RUST_LOG").is_none() {
                command.env("RUST_LOG", "info");
            }
            processes.spawn(
                &format!("kraft node {id}"),
                command,
                &dir.path().join(format!("node{id}.log")),
            )?;
        }
        Ok(KraftCluster {
            processes,
            http: http
                .iter()
                .map(|port| SocketAddr::from(([127, 0, 0, 1], *port)))
                .collect(),
            _dir: dir,
        })
    }

    pub fn pids(&self) -> Vec<u32> {
        self.processes.pids()
    }

    /// Waits until one node is leader and all three name it in the same
    /// epoch; returns its HTTP address.
    pub async fn wait_for_leader(&mut self) -> Result<SocketAddr> {
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
                        return Ok(self.http[(id - 1) as usize]);
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

async fn quorum_view(addr: SocketAddr) -> Result<QuorumView, String> {
    let (status, body) = HttpConn::new(addr).get("/v1/quorum").await?;
    if !status.is_success() {
        return Err(format!("GET /v1/quorum on {addr}: {status}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("GET /v1/quorum on {addr}: {e}"))
}

/// A node's TOML config, shaped like examples/node1.toml (the keys left out
/// keep their defaults, which are the examples' values).
fn node_config(id: usize, data_dir: &Path, cluster_id: &str, raft: u16, http: u16, voters: &str) -> String {
    format!(
        r#"# Written by kraft-bench for one benchmark run.
[node]
id = {id}
roles = ["controller"]
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
