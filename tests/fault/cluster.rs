//! Real `kraft` processes whose raft traffic goes through a [`Proxy`] per
//! directed link, so that the harness can kill, pause and partition them.
//! Every process is killed, and every proxy stopped, when the cluster is
//! dropped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::proxy::Proxy;
use crate::node_process::{run_args, spawn_logged, Log};
use crate::ports;

/// Longest the harness waits for a cluster to recover.
pub const RECOVERY: Duration = Duration::from_secs(60);

pub fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

pub struct Node {
    pub id: i32,
    pub http_port: u16,
    raft_port: u16,
    data_dir: PathBuf,
    /// This node's view of the voters: itself as it listens, every other
    /// voter through the proxy of the link to it.
    voters: String,
    sets: Vec<String>,
    child: Option<Child>,
    pub paused: bool,
    log: Log,
}

impl Node {
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn start(&mut self) {
        assert!(self.child.is_none(), "node {} already running", self.id);
        let mut command = Command::new(env!("CARGO_BIN_EXE_kraft"));
        run_args(
            &mut command,
            self.id,
            &self.data_dir,
            self.raft_port,
            self.http_port,
            &self.voters,
        )
        .args(["--set", "quorum.request_timeout_ms=1000"]);
        for set in &self.sets {
            command.args(["--set", set]);
        }
        let child = spawn_logged(&mut command, &self.log);
        self.child = Some(child);
        self.paused = false;
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    fn signal(&mut self, signal: libc::c_int) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on the pid of our own child, not yet reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }

    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.paused = self.child.is_some();
    }

    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.paused = false;
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.http_port, path)
    }

    pub fn get(&self, client: &reqwest::blocking::Client, path: &str) -> Option<Value> {
        if !self.running() || self.paused {
            return None;
        }
        let response = client.get(self.url(path)).send().ok()?;
        response.status().is_success().then_some(())?;
        response.json().ok()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log.lock().unwrap();
        let from = log.len().saturating_sub(lines);
        log[from..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    /// (from, to) → the proxy `from` dials `to` through.
    links: BTreeMap<(i32, i32), Proxy>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// `size` voters (ids 1..=size), each started with `--set` for every
    /// one of `sets`.
    pub fn start(size: i32, sets: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let raft_ports: BTreeMap<i32, u16> = (1..=size).map(|id| (id, ports::free_port())).collect();
        let mut links = BTreeMap::new();
        for from in 1..=size {
            for to in 1..=size {
                if from != to {
                    let target = SocketAddr::from(([127, 0, 0, 1], raft_ports[&to]));
                    links.insert((from, to), Proxy::start(target));
                }
            }
        }
        let mut nodes = Vec::new();
        for id in 1..=size {
            let voters: Vec<String> = (1..=size)
                .map(|to| {
                    let addr = match links.get(&(id, to)) {
                        Some(proxy) => proxy.addr(),
                        None => SocketAddr::from(([127, 0, 0, 1], raft_ports[&id])),
                    };
                    format!("\"{to}@{addr}\"")
                })
                .collect();
            let mut node = Node {
                id,
                http_port: ports::free_port(),
                raft_port: raft_ports[&id],
                data_dir: dir.path().join(format!("node-{id}")),
                voters: format!("[{}]", voters.join(",")),
                sets: sets.iter().map(|s| s.to_string()).collect(),
                child: None,
                paused: false,
                log: Default::default(),
            };
            node.start();
            nodes.push(node);
        }
        Cluster {
            nodes,
            links,
            _dir: dir,
        }
    }

    pub fn node(&mut self, id: i32) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.id == id).unwrap()
    }

    pub fn ids(&self) -> Vec<i32> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// Cuts (or heals) the link `from` → `to`.
    pub fn set_cut(&self, from: i32, to: i32, cut: bool) {
        self.links[&(from, to)].set_cut(cut);
    }

    /// Cuts every link between the two sides, both ways.
    pub fn partition(&self, side: &[i32]) {
        for ((from, to), proxy) in &self.links {
            if side.contains(from) != side.contains(to) {
                proxy.set_cut(true);
            }
        }
    }

    pub fn heal(&self) {
        for proxy in self.links.values() {
            proxy.set_cut(false);
        }
    }

    /// Every node running and not paused, every link healed.
    pub fn restore(&mut self) {
        self.heal();
        for node in &mut self.nodes {
            if node.paused {
                node.resume();
            }
            if !node.running() {
                node.start();
            }
        }
    }

    /// The leader that the running nodes reachable over HTTP name, with its
    /// epoch, if the leader itself says so.
    pub fn leader(&self, client: &reqwest::blocking::Client) -> Option<(i32, i64)> {
        let mut best: Option<(i32, i64)> = None;
        for node in &self.nodes {
            let Some(q) = node.get(client, "/v1/quorum") else {
                continue;
            };
            if q["role"] == "leader" {
                let epoch = q["leader_epoch"].as_i64().unwrap_or(-1);
                if best.is_none_or(|(_, e)| epoch > e) {
                    best = Some((node.id, epoch));
                }
            }
        }
        best
    }

    /// Waits (bounded) for a leader; None after [`RECOVERY`].
    pub fn wait_for_leader(&self, client: &reqwest::blocking::Client) -> Option<(i32, i64)> {
        let deadline = Instant::now() + RECOVERY;
        while Instant::now() < deadline {
            if let Some(leader) = self.leader(client) {
                return Some(leader);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// The last lines of every node's log, for a failure message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node {} ---\n{}", n.id, n.log_tail(40)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
