//! A 3-member etcd cluster (Debian's `etcd-server` binary, default fsync
//! settings) on 127.0.0.1, and the client that writes to its leader.
//!
//! The leader is found with the maintenance Status call: every member
//! reports the leader's member id and its own; the client endpoint of the
//! member whose id is the leader's gets all the writes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use etcd_client::{Client, ConnectOptions};

use crate::load;
use crate::procs::{self, ProcessGuard};

const LEADER_WAIT: Duration = Duration::from_secs(30);

/// The `etcd` binary on PATH.
pub fn locate() -> Result<PathBuf> {
    procs::which("etcd").ok_or_else(|| anyhow!("etcd not installed: run scripts/install-bench-peers.sh"))
}

/// A running 3-member cluster; dropping it stops the members, then removes
/// the data directories.
pub struct EtcdCluster {
    processes: ProcessGuard,
    /// Client URLs, member 1 to 3.
    pub endpoints: Vec<String>,
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    pub fn start(bin: &Path, data_root: &Path) -> Result<EtcdCluster> {
        let dir = procs::data_dir(data_root, "kraft-bench-etcd-")?;
        let ports = procs::free_ports(6)?;
        let (client, peer) = ports.split_at(3);
        let nanos = procs::since_epoch().as_nanos();
        let token = format!("bench-{}-{nanos:x}", std::process::id());
        let initial_cluster = (0..3)
            .map(|i| format!("m{}=http://127.0.0.1:{}", i + 1, peer[i]))
            .collect::<Vec<_>>()
            .join(",");
        let mut processes = ProcessGuard::default();
        for i in 0..3 {
            let name = format!("m{}", i + 1);
            let client_url = format!("http://127.0.0.1:{}", client[i]);
            let peer_url = format!("http://127.0.0.1:{}", peer[i]);
            let mut command = Command::new(bin);
            command
                .arg("--name")
                .arg(&name)
                .arg("--data-dir")
                .arg(dir.path().join(&name))
                .args([
                    "--listen-client-urls",
                    &client_url,
                    "--advertise-client-urls",
                    &client_url,
                ])
                .args([
                    "--listen-peer-urls",
                    &peer_url,
                    "--initial-advertise-peer-urls",
                    &peer_url,
                ])
                .args(["--initial-cluster", &initial_cluster, "--initial-cluster-token", &token])
                .args([
                    "--initial-cluster-state",
                    "new",
                    "--logger",
                    "zap",
                    "--log-outputs",
                    "stderr",
                ]);
            processes.spawn(
                &format!("etcd {name}"),
                command,
                &dir.path().join(format!("{name}.log")),
            )?;
        }
        Ok(EtcdCluster {
            processes,
            endpoints: client.iter().map(|port| format!("http://127.0.0.1:{port}")).collect(),
            _dir: dir,
        })
    }

    pub fn pids(&self) -> Vec<u32> {
        self.processes.pids()
    }

    /// Waits until all three members report the same leader; returns the
    /// leader's client URL.
    pub async fn wait_for_leader(&mut self) -> Result<String> {
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        let mut last = String::from("no answer yet");
        loop {
            self.processes.check_running()?;
            let mut views = Vec::new();
            for endpoint in &self.endpoints {
                match status(endpoint).await {
                    Ok(view) => views.push(view),
                    Err(e) => last = format!("{endpoint}: {e}"),
                }
            }
            if views.len() == 3 {
                let leader = views[0].leader;
                if leader != 0 && views.iter().all(|v| v.leader == leader) {
                    if let Some(i) = views.iter().position(|v| v.member_id == leader) {
                        return Ok(self.endpoints[i].clone());
                    }
                }
                last = format!(
                    "leaders reported: {:?}",
                    views.iter().map(|v| v.leader).collect::<Vec<_>>()
                );
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "etcd: no agreed leader after {LEADER_WAIT:?} ({last})\n{}",
                    self.processes.log_tails(10)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

struct MemberView {
    member_id: u64,
    leader: u64,
}

async fn status(endpoint: &str) -> Result<MemberView> {
    let mut client = connect(endpoint).await?;
    let status = client.status().await?;
    let member_id = status
        .header()
        .map(|h| h.member_id())
        .context("status without a header")?;
    Ok(MemberView {
        member_id,
        leader: status.leader(),
    })
}

async fn connect(endpoint: &str) -> Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(load::REQUEST_TIMEOUT);
    Ok(Client::connect([endpoint], Some(options)).await?)
}

/// One closed-loop client: its own etcd client (one gRPC channel, one
/// HTTP/2 connection) to the leader, a `put` of a new key per request.
pub struct PutClient {
    client: Client,
    id: usize,
    seq: u64,
    value_bytes: usize,
}

impl PutClient {
    pub async fn connect(leader: &str, id: usize, value_bytes: usize) -> Result<PutClient> {
        let mut client = connect(leader)
            .await
            .with_context(|| format!("etcd client {id}: connect {leader}"))?;
        // Open the connection now, not inside the measured window.
        client
            .status()
            .await
            .with_context(|| format!("etcd client {id}: first call to {leader}"))?;
        Ok(PutClient {
            client,
            id,
            seq: 0,
            value_bytes,
        })
    }
}

impl load::Client for PutClient {
    async fn request(&mut self) -> Result<u64, String> {
        self.seq += 1;
        let key = format!("bench/c{:05}/{:012}", self.id, self.seq);
        let value = load::payload(self.id, self.seq, self.value_bytes);
        self.client
            .put(key, value, None)
            .await
            .map(|_| 1)
            .map_err(|e| format!("etcd put: {e}"))
    }
}
