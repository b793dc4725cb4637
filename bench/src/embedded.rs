//! The `embedded` command: a 3-node kraft cluster inside this process (one
//! actix System, `kraft::node::start`), appends through
//! `NodeHandle::append` on the leader with many appends in flight, against
//! the disk's grouped-fsync bandwidth measured in the same run.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use kraft::config::Config;
use kraft::node::{self, NodeHandle};
use kraft::raft::NodeId;
use serde::Serialize;

use crate::disk::{self, SyncedAppends};
use crate::harness::Machine;
use crate::load::{self, LoadResult, Window};
use crate::procs;

const LEADER_WAIT: Duration = Duration::from_secs(30);

pub struct EmbeddedOptions {
    pub window: Window,
    pub in_flight: usize,
    pub records_per_append: usize,
    pub record_sizes: Vec<usize>,
    pub shared_arbiter: bool,
    pub out: PathBuf,
    pub data_root: PathBuf,
    pub probe: Duration,
}

#[derive(Serialize)]
struct SizeResult {
    record_bytes: usize,
    /// Committed data bytes per second, in MB (10^6 bytes).
    mb_per_sec: f64,
    /// Appends (each of `records_per_append` records) and their latencies.
    load: LoadResult,
}

#[derive(Serialize)]
struct Report<'a> {
    kind: &'static str,
    started_unix: u64,
    machine: Machine,
    in_flight: usize,
    records_per_append: usize,
    arbiters: &'static str,
    warmup_secs: f64,
    duration_secs: f64,
    disk_grouped_1k: &'a [SyncedAppends],
    results: &'a [SizeResult],
    /// kraft's MB/s with 1 KiB records over the disk's grouped-fsync MB/s.
    kraft_over_disk_1k: Vec<DiskRatio>,
}

#[derive(Serialize)]
struct DiskRatio {
    mode: disk::FileMode,
    ratio: f64,
}

/// A 3-node cluster in this process. Each node runs on its own arbiter (its
/// own thread, as three machines would) unless `shared` puts them all on
/// the caller's.
struct EmbeddedCluster {
    nodes: Vec<NodeHandle>,
    arbiters: Vec<actix_rt::Arbiter>,
    _dir: tempfile::TempDir,
}

impl EmbeddedCluster {
    async fn start(data_root: &Path, shared: bool) -> Result<EmbeddedCluster> {
        let dir = procs::data_dir(data_root, "kraft-bench-embedded-")?;
        let ports = procs::free_ports(3)?;
        let voters: BTreeMap<NodeId, String> = ports
            .iter()
            .enumerate()
            .map(|(i, port)| (i as NodeId + 1, format!("127.0.0.1:{port}")))
            .collect();
        let nanos = procs::since_epoch().as_nanos();
        let cluster_id = format!("bench-embedded-{nanos:x}");
        let mut nodes = Vec::new();
        let mut arbiters = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let mut config = Config::default();
            config.node.state_machine = kraft::config::StateMachineKind::Log;
            config.node.roles = vec![kraft::config::NodeRole::Controller];
            config.node.id = i as NodeId + 1;
            config.node.cluster_id = cluster_id.clone();
            config.node.data_dir = dir.path().join(format!("node-{}", i + 1));
            config.listeners.raft = SocketAddr::from(([127, 0, 0, 1], *port));
            config.listeners.http = SocketAddr::from(([127, 0, 0, 1], 0));
            config.quorum.voters = voters.clone();
            let started = if shared {
                node::start(config).await.map_err(|e| anyhow!("{e}"))
            } else {
                let arbiter = actix_rt::Arbiter::new();
                let (tx, rx) = tokio::sync::oneshot::channel();
                // node::start's future is not Send: the closure is, and it
                // spawns the start on the arbiter's own thread.
                let spawned = arbiter.spawn_fn(move || {
                    actix_rt::spawn(async move {
                        let _ = tx.send(node::start(config).await.map_err(|e| e.to_string()));
                    });
                });
                arbiters.push(arbiter);
                if !spawned {
                    bail!("cannot start an arbiter for node {}", i + 1);
                }
                rx.await
                    .map_err(|_| anyhow!("node {} start task vanished", i + 1))?
                    .map_err(|e| anyhow!(e))
            };
            nodes.push(started.with_context(|| format!("embedded node {} cannot start", i + 1))?);
        }
        Ok(EmbeddedCluster {
            nodes,
            arbiters,
            _dir: dir,
        })
    }

    /// The node all three agree leads.
    async fn leader(&self) -> Result<NodeHandle> {
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        loop {
            let mut statuses = Vec::new();
            for node in &self.nodes {
                if let Ok(status) = node.describe().await {
                    statuses.push(status);
                }
            }
            if statuses.len() == self.nodes.len() {
                if let Some(leader) = statuses.iter().find(|s| s.role == "leader") {
                    let agreed = statuses
                        .iter()
                        .all(|s| s.leader_id == Some(leader.node_id) && s.leader_epoch == leader.leader_epoch);
                    if agreed {
                        let index = statuses.iter().position(|s| s.node_id == leader.node_id).unwrap_or(0);
                        return Ok(self.nodes[index].clone());
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("embedded cluster: no agreed leader after {LEADER_WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn shutdown(self) {
        for node in &self.nodes {
            node.shutdown().await;
        }
        for arbiter in self.arbiters {
            arbiter.stop();
            let _ = arbiter.join();
        }
    }
}

/// One in-flight append loop on the leader.
struct AppendLoop {
    node: NodeHandle,
    records: Vec<Vec<u8>>,
}

impl load::Client for AppendLoop {
    async fn request(&mut self) -> Result<u64, String> {
        let n = self.records.len() as u64;
        self.node
            .append(self.records.clone())
            .await
            .map(|_| n)
            .map_err(|e| e.to_string())
    }
}

pub async fn run(options: EmbeddedOptions) -> Result<()> {
    let machine = Machine::here(&options.data_root);
    println!(
        "kraft-bench embedded: {} cores, kernel {}, data on {}",
        machine.nproc, machine.kernel, machine.data_filesystem
    );
    std::fs::create_dir_all(&options.out)
        .with_context(|| format!("cannot create the results directory {}", options.out.display()))?;
    let started_unix = procs::since_epoch().as_secs();

    let data_root = options.data_root.clone();
    let probe = options.probe;
    let disk = tokio::task::spawn_blocking(move || {
        let mut probes = Vec::new();
        for cpus in [disk::Cpus::Idle, disk::Cpus::Busy] {
            for mode in disk::MODES {
                probes.push(disk::synced_appends(&data_root, 1024, 64, mode, cpus, probe)?);
            }
        }
        Ok::<_, anyhow::Error>(probes)
    })
    .await
    .context("the disk probe task failed")??;
    for d in &disk {
        println!(
            "disk ({}): 1 KiB records, one fdatasync per 64 ({}): {:.1} MB/s ({:.0} records/s, fdatasync p50 {:.3} ms)",
            d.cpus.name(),
            d.mode.name(),
            d.mb_per_sec,
            d.records_per_sec,
            d.sync_latency_ms.p50
        );
    }
    let arbiters = if options.shared_arbiter {
        "all three nodes and the load on one arbiter (one thread)"
    } else {
        "each node on its own arbiter; the load on the System arbiter"
    };
    println!(
        "== 3 nodes in one actix System ({arbiters}); NodeHandle::append on the leader, {} appends in flight, {} record(s) per append, warm-up {:?}, measured {:?}; a fresh cluster per record size",
        options.in_flight, options.records_per_append, options.window.warmup, options.window.measure
    );
    println!(
        "{:>12} {:>12} {:>9} {:>11} {:>9} {:>9} {:>7} {:>12}",
        "record bytes", "records/s", "MB/s", "appends/s", "p50 ms", "p99 ms", "errors", "process CPU"
    );

    let mut results = Vec::new();
    for &size in &options.record_sizes {
        let cluster = EmbeddedCluster::start(&options.data_root, options.shared_arbiter).await?;
        let leader = match cluster.leader().await {
            Ok(leader) => leader,
            Err(e) => {
                cluster.shutdown().await;
                return Err(e);
            }
        };
        let clients: Vec<AppendLoop> = (0..options.in_flight)
            .map(|i| AppendLoop {
                node: leader.clone(),
                records: (0..options.records_per_append)
                    .map(|j| load::payload(i, j as u64, size).into_bytes())
                    .collect(),
            })
            .collect();
        let result = load::run(clients, options.window, &[]).await;
        cluster.shutdown().await;
        let mb_per_sec = result.records_per_sec * size as f64 / 1e6;
        println!(
            "{:>12} {:>12.0} {:>9.2} {:>11.0} {:>9.3} {:>9.3} {:>7} {:>12}",
            size,
            result.records_per_sec,
            mb_per_sec,
            result.ops_per_sec,
            result.latency_ms.p50,
            result.latency_ms.p99,
            result.errors,
            format!("{:.2} cores", result.client_cpu_cores)
        );
        for (message, count) in &result.error_samples {
            println!("{:>14} error x{count}: {message}", "");
        }
        results.push(SizeResult {
            record_bytes: size,
            mb_per_sec,
            load: result,
        });
    }
    let kraft_1k = results.iter().find(|r| r.record_bytes == 1024).map(|r| r.mb_per_sec);
    // Compared with the busy-CPU probes: the servers keep the CPUs busy.
    let busy: Vec<&SyncedAppends> = disk.iter().filter(|d| d.cpus == disk::Cpus::Busy).collect();
    let kraft_over_disk_1k: Vec<DiskRatio> = busy
        .iter()
        .filter(|d| d.mb_per_sec > 0.0)
        .filter_map(|d| {
            kraft_1k.map(|k| DiskRatio {
                mode: d.mode,
                ratio: k / d.mb_per_sec,
            })
        })
        .collect();
    for (r, d) in kraft_over_disk_1k.iter().zip(&busy) {
        println!(
            "kraft 1 KiB records / disk grouped fdatasync (1 KiB x 64, {}, CPUs busy): {:.2} MB/s / {:.2} MB/s = {:.3}",
            d.mode.name(),
            kraft_1k.unwrap_or(0.0),
            d.mb_per_sec,
            r.ratio
        );
    }

    let path = options.out.join(format!("embedded-{started_unix}.json"));
    let report = Report {
        kind: "embedded",
        started_unix,
        machine,
        in_flight: options.in_flight,
        records_per_append: options.records_per_append,
        arbiters,
        warmup_secs: options.window.warmup.as_secs_f64(),
        duration_secs: options.window.measure.as_secs_f64(),
        disk_grouped_1k: &disk,
        results: &results,
        kraft_over_disk_1k,
    };
    procs::write_results(&path, &report)?;
    Ok(())
}
