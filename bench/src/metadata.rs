//! The `metadata` command: what the metadata layer costs and how fast it
//! goes.
//!
//! 1. **The image, in this process**: the records of T topics of P
//!    partitions (3 replicas each) are replayed as a node does (decoded,
//!    replayed in deliveries of 1,000 records, each delivery's delta
//!    applied): records per second, and the resident memory the image
//!    holds (per partition). Then the image is written as a snapshot file
//!    the way a node writes one: bytes per partition and the time it took.
//! 2. **Topic creations** on 3 real `kraft run` processes in combined mode
//!    (each a controller and a broker): closed-loop clients on the active
//!    controller create topics of 1 partition, then of 100, all with
//!    replication factor 3: creations per second and latency.
//! 3. **Fencing**: a 4th process, a broker only, leads a topic's
//!    partitions; after its `kill -9` (its last heartbeat), how long until
//!    every partition has another leader (the session timeout, then the
//!    controller's turn).
//! 4. **Failover**: with the image the creations built, `kill -9` of the
//!    active controller, and how long until a survivor's controller takes
//!    a write (a topic creation answered 200).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use kraft::messages::Record;
use kraft::metadata::image::{MetadataDelta, MetadataImage};
use kraft::metadata::records::{MetadataRecord, PartitionRecord, TopicRecord};
use kraft::storage::SnapshotWriter;
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::harness::Machine;
use crate::http::HttpConn;
use crate::kraft_cluster::{self, KraftCluster};
use crate::load::{self, Window};
use crate::procs;

/// How often the cluster is polled while waiting for it.
const POLL: Duration = Duration::from_millis(20);
/// The broker that is killed to measure fencing.
const BROKER: usize = 4;

pub struct MetadataOptions {
    pub topics: u64,
    pub partitions_per_topic: u64,
    pub concurrency: usize,
    pub window: Window,
    pub session_timeout_ms: u64,
    pub kraft_bin: Option<PathBuf>,
    pub repo_root: PathBuf,
    pub out: PathBuf,
    pub data_root: PathBuf,
}

#[derive(Serialize)]
struct ImageFigures {
    topics: u64,
    partitions: u64,
    records: u64,
    replay_secs: f64,
    replay_records_per_sec: f64,
    rss_mib: f64,
    rss_bytes_per_partition: f64,
    snapshot_bytes: u64,
    snapshot_bytes_per_partition: f64,
    snapshot_write_secs: f64,
}

#[derive(Serialize)]
struct Creations {
    partitions_per_topic: u64,
    result: load::LoadResult,
}

#[derive(Serialize)]
struct Report {
    machine: Machine,
    kraft_commit: String,
    image: ImageFigures,
    creations: Vec<Creations>,
    fencing_secs: Option<f64>,
    session_timeout_ms: u64,
    failover_partitions: u64,
    failover_secs: Option<f64>,
}

pub async fn run(options: MetadataOptions) -> Result<()> {
    let image = image_figures(options.topics, options.partitions_per_topic, &options.data_root)?;
    println!(
        "image of {} topics, {} partitions: replay {:.0} records/s ({:.2} s), RSS {:.1} MiB ({:.0} B/partition), \
         snapshot {:.1} MiB ({:.0} B/partition, written in {:.2} s)",
        image.topics,
        image.partitions,
        image.replay_records_per_sec,
        image.replay_secs,
        image.rss_mib,
        image.rss_bytes_per_partition,
        image.snapshot_bytes as f64 / (1 << 20) as f64,
        image.snapshot_bytes_per_partition,
        image.snapshot_write_secs
    );

    let bin = kraft_cluster::locate_or_build(options.kraft_bin.as_deref(), &options.repo_root)?;
    let extra = format!(
        "\n[broker]\nheartbeat_interval_ms = {}\nsession_timeout_ms = {}\n",
        (options.session_timeout_ms / 4).max(1),
        options.session_timeout_ms
    );
    let mut cluster = KraftCluster::start_metadata(&bin, &options.data_root, &extra)?;
    let leader = wait_for_brokers(&cluster, &[1, 2, 3]).await?;
    let mut creations = Vec::new();
    for partitions in [1, 100] {
        let clients = (0..options.concurrency)
            .map(|id| CreateClient::new(cluster.http[leader - 1], id, partitions))
            .collect();
        let result = load::run(clients, options.window, &cluster.pids()).await;
        println!(
            "topic creations of {partitions} partition(s), {} clients: {:.0}/s, p50 {:.1} ms, p99 {:.1} ms, {} errors",
            options.concurrency, result.ops_per_sec, result.latency_ms.p50, result.latency_ms.p99, result.errors
        );
        creations.push(Creations {
            partitions_per_topic: partitions,
            result,
        });
        cluster.check_running()?;
    }

    let fencing = measure_fencing(&mut cluster, leader).await;
    if let Err(e) = &fencing {
        eprintln!("fencing not measured: {e:#}");
    }
    let failover_partitions = partition_count(cluster.http[leader - 1]).await.unwrap_or(0);
    let failover = measure_failover(&mut cluster, leader).await;
    if let Err(e) = &failover {
        eprintln!("failover not measured: {e:#}");
    }
    let report = Report {
        machine: Machine::here(&options.data_root),
        kraft_commit: git_commit(&options.repo_root),
        image,
        creations,
        fencing_secs: fencing.ok(),
        session_timeout_ms: options.session_timeout_ms,
        failover_partitions,
        failover_secs: failover.ok(),
    };
    if let Some(secs) = report.fencing_secs {
        println!(
            "fencing: {secs:.2} s from a broker's kill -9 to new leaders for its partitions (session timeout {} ms)",
            options.session_timeout_ms
        );
    }
    if let Some(secs) = report.failover_secs {
        println!(
            "failover: {secs:.2} s from the active controller's kill -9 to a write taken, with {failover_partitions} partitions"
        );
    }
    std::fs::create_dir_all(&options.out)?;
    let path = options.out.join(format!("metadata-{}.json", procs::since_epoch().as_secs()));
    procs::write_json(&path, &report)?;
    println!("results: {}", path.display());
    Ok(())
}

/// Part 1: replay, memory and snapshot of an image built in this process.
fn image_figures(topics: u64, per_topic: u64, data_root: &Path) -> Result<ImageFigures> {
    let mut records = Vec::with_capacity((topics * (per_topic + 1)) as usize);
    for t in 0..topics {
        let topic_id = Uuid::from_u128(u128::from(t) + 1);
        records.push(
            MetadataRecord::Topic(TopicRecord {
                name: format!("topic-{t:06}"),
                topic_id,
            })
            .encode(),
        );
        for p in 0..per_topic {
            let leader = ((t + p) % 3) as i32 + 1;
            let replicas = vec![leader, leader % 3 + 1, (leader + 1) % 3 + 1];
            records.push(
                MetadataRecord::Partition(PartitionRecord {
                    partition_id: p as i32,
                    topic_id,
                    isr: replicas.clone(),
                    replicas,
                    removing_replicas: Vec::new(),
                    adding_replicas: Vec::new(),
                    leader,
                    leader_epoch: 0,
                    partition_epoch: 0,
                })
                .encode(),
            );
        }
    }
    let count = records.len() as u64;
    trim();
    let before = procs::memory(std::process::id())?;
    let started = Instant::now();
    let mut image = MetadataImage::empty();
    for (chunk_index, chunk) in records.chunks(1000).enumerate() {
        let mut delta = MetadataDelta::new(&image);
        for (i, bytes) in chunk.iter().enumerate() {
            let offset = (chunk_index * 1000 + i) as i64;
            delta.replay_bytes(offset, 1, bytes).context("replay")?;
        }
        image = delta.apply().0;
    }
    let replay_secs = started.elapsed().as_secs_f64();
    drop(records);
    trim();
    let after = procs::memory(std::process::id())?;
    let partitions = topics * per_topic;
    let rss_bytes = after.rss_kib.saturating_sub(before.rss_kib) * 1024;

    let dir = procs::data_dir(data_root, "kraft-bench-metadata-")?;
    let id = kraft::messages::SnapshotId {
        end_offset: image.offset + 1,
        epoch: 1,
    };
    let started = Instant::now();
    let mut writer = SnapshotWriter::create(dir.path(), id, 0)?;
    let mut batch = Vec::with_capacity(1024);
    for record in image.records() {
        batch.push(Record::Data(record.encode()));
        if batch.len() == 1024 {
            writer.append(0, 1, &batch)?;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        writer.append(0, 1, &batch)?;
    }
    let meta = writer.freeze()?;
    let snapshot_write_secs = started.elapsed().as_secs_f64();
    Ok(ImageFigures {
        topics,
        partitions,
        records: count,
        replay_secs,
        replay_records_per_sec: count as f64 / replay_secs,
        rss_mib: rss_bytes as f64 / (1 << 20) as f64,
        rss_bytes_per_partition: rss_bytes as f64 / partitions.max(1) as f64,
        snapshot_bytes: meta.size_bytes,
        snapshot_bytes_per_partition: meta.size_bytes as f64 / partitions.max(1) as f64,
        snapshot_write_secs,
    })
}

/// The repository's commit, for the report.
fn git_commit(repo: &Path) -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(repo)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Hands freed memory back, so that resident memory counts what is held.
fn trim() {
    // SAFETY: malloc_trim only releases free memory of glibc's arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

async fn get_json(addr: SocketAddr, path: &str) -> Option<Value> {
    let mut conn = HttpConn::new(addr);
    let (status, body) = conn.get(path).await.ok()?;
    if !status.is_success() {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

/// Waits until the brokers `ids` are registered and unfenced; the node id
/// of the active controller.
async fn wait_for_brokers(cluster: &KraftCluster, ids: &[i64]) -> Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(quorum) = get_json(cluster.http[0], "/v1/quorum").await {
            if let (Some(leader), Some(brokers)) = (quorum["leader_id"].as_u64(), get_json(cluster.http[0], "/v1/brokers").await) {
                let unfenced: Vec<i64> = brokers["brokers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|b| b["fenced"] == false)
                    .filter_map(|b| b["id"].as_i64())
                    .collect();
                if ids.iter().all(|id| unfenced.contains(id)) {
                    return Ok(leader as usize);
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
    bail!("the brokers {ids:?} were not all unfenced within 60 s:\n{}", cluster.log_tails(20))
}

async fn partition_count(addr: SocketAddr) -> Option<u64> {
    let topics = get_json(addr, "/v1/topics").await?;
    Some(
        topics["topics"]
            .as_array()?
            .iter()
            .filter_map(|t| t["partitions"].as_u64())
            .sum(),
    )
}

/// Part 3: a broker-only process leads a topic; how long after its
/// `kill -9` every partition has another leader.
async fn measure_fencing(cluster: &mut KraftCluster, leader: usize) -> Result<f64> {
    cluster.add_observer(BROKER)?;
    wait_for_brokers(cluster, &[BROKER as i64]).await?;
    let assignments: Vec<Vec<usize>> = (0..10).map(|i| vec![BROKER, i % 3 + 1]).collect();
    let body = serde_json::json!({"name": "fencing", "assignments": assignments});
    let mut conn = HttpConn::new(cluster.http[leader - 1]);
    let (status, answer) = conn
        .post("/v1/topics", Bytes::from(serde_json::to_vec(&body)?))
        .await
        .map_err(anyhow::Error::msg)?;
    if !status.is_success() {
        bail!("creating the fencing topic: {status} {}", String::from_utf8_lossy(&answer));
    }
    let killed = Instant::now();
    cluster.stop_node(BROKER, libc::SIGKILL)?;
    let deadline = killed + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Some(topic) = get_json(cluster.http[leader - 1], "/v1/topics/fencing").await {
            let moved = topic["partitions"]
                .as_array()
                .is_some_and(|ps| ps.iter().all(|p| p["leader"].as_i64() != Some(BROKER as i64)));
            if moved {
                return Ok(killed.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(POLL).await;
    }
    bail!("the killed broker's partitions kept their leader for 120 s")
}

/// Part 4: `kill -9` of the active controller; how long until a survivor
/// takes a topic creation.
async fn measure_failover(cluster: &mut KraftCluster, leader: usize) -> Result<f64> {
    let survivors: Vec<SocketAddr> = (1..=3).filter(|id| *id != leader).map(|id| cluster.http[id - 1]).collect();
    let killed = Instant::now();
    cluster.stop_node(leader, libc::SIGKILL)?;
    let deadline = killed + Duration::from_secs(120);
    let mut attempt = 0;
    while Instant::now() < deadline {
        for addr in &survivors {
            attempt += 1;
            let body = serde_json::json!({"name": format!("failover-{attempt}"), "partitions": 1, "replication_factor": 2});
            let mut conn = HttpConn::new(*addr);
            if let Ok((status, _)) = conn.post("/v1/topics", Bytes::from(serde_json::to_vec(&body)?)).await {
                if status.is_success() {
                    return Ok(killed.elapsed().as_secs_f64());
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
    bail!("no survivor took a write within 120 s")
}

/// One closed-loop client creating topics of `partitions` partitions on
/// its own connection.
struct CreateClient {
    conn: HttpConn,
    id: usize,
    seq: u64,
    partitions: u64,
}

impl CreateClient {
    fn new(addr: SocketAddr, id: usize, partitions: u64) -> CreateClient {
        CreateClient {
            conn: HttpConn::new(addr),
            id,
            seq: 0,
            partitions,
        }
    }
}

impl load::Client for CreateClient {
    async fn request(&mut self) -> Result<u64, String> {
        self.seq += 1;
        let body = serde_json::json!({
            "name": format!("c{}-{}-{}", self.partitions, self.id, self.seq),
            "partitions": self.partitions,
            "replication_factor": 3,
        });
        let body = Bytes::from(serde_json::to_vec(&body).expect("json"));
        let (status, answer) = self.conn.post("/v1/topics", body).await?;
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
