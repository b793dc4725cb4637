//! The `state` command: what a large log costs on a 3-node cluster of real
//! `kraft run` processes. It loads N records through `POST /v1/append`,
//! then measures memory and disk with them in the log, a snapshot on each
//! node, the compaction that follows, a fresh observer joining (through the
//! log before compaction, through FetchSnapshot after), and a crashed
//! follower restarting on its data directory. Every step is printed as it
//! finishes; a summary and a results JSON come at the end.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::harness::Machine;
use crate::http::HttpConn;
use crate::kraft_cluster::{self, KraftCluster, QuorumView};
use crate::load;
use crate::procs::{self, Memory};

/// How often a node's `GET /v1/quorum` is polled while waiting for it.
const POLL: Duration = Duration::from_millis(20);
/// The observer that joins after compaction (through FetchSnapshot).
const SNAPSHOT_OBSERVER: usize = 4;
/// The observer that joins before any snapshot exists (through the log).
const LOG_OBSERVER: usize = 5;
/// How often the load step prints its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

pub struct StateOptions {
    pub records: u64,
    pub value_bytes: usize,
    pub batch: usize,
    pub clients: usize,
    /// Also time an observer joining through the log alone, before the
    /// snapshots.
    pub log_join: bool,
    pub cleaner_interval_ms: u64,
    /// Longest wait for any one thing (replication, a snapshot, compaction,
    /// a join, a restart).
    pub wait: Duration,
    pub kraft_bin: Option<PathBuf>,
    pub repo_root: PathBuf,
    pub out: PathBuf,
    pub data_root: PathBuf,
}

/// Appended to every node's config. No automatic snapshots (only the
/// `POST /v1/snapshot` of step 3), so the log holds all N records until
/// then, and nothing is compacted during the load or the first join. Once a
/// snapshot exists, the cleaner's next pass deletes the log below it:
/// `retention_bytes` and `retention_ms` take their minimum, 1 (0 is refused
/// by the config loader), so the part below the snapshot is always over the
/// limit.
fn extra_config(cleaner_interval_ms: u64) -> String {
    format!(
        r#"
# kraft-bench state: snapshots only on POST /v1/snapshot; the log below a
# snapshot is deleted at the cleaner's next pass.
[log]
retention_bytes = 1
retention_ms = 1
cleaner_interval_ms = {cleaner_interval_ms}

[snapshot]
max_bytes_between = {never_bytes}
max_interval_ms = {never_ms}
"#,
        never_bytes = 1u64 << 60,
        never_ms = kraft::config::MAX_MS,
    )
}

/// The records of batch `index`: `index * batch ..` up to `records`, or
/// None past the end. Clients take batch indexes from one counter, so every
/// record is sent exactly once whatever the interleaving.
fn batch_range(index: u64, records: u64, batch: usize) -> Option<Range<u64>> {
    let start = index.checked_mul(batch as u64)?;
    (start < records).then(|| start..(start + batch as u64).min(records))
}

/// The answer of `POST /v1/append`.
#[derive(Deserialize)]
struct Appended {
    last_offset: u64,
}

/// The answer of `POST /v1/snapshot`.
#[derive(Clone, Debug, Deserialize, Serialize)]
struct SnapshotInfo {
    end_offset: u64,
    epoch: u64,
    size_bytes: u64,
    created: bool,
}

#[derive(Serialize)]
struct LoadFigures {
    records: u64,
    value_bytes: usize,
    batch: usize,
    clients: usize,
    requests: u64,
    secs: f64,
    records_per_sec: f64,
    /// Value bytes per second (10^6).
    mb_per_sec: f64,
    /// The highest `last_offset` acknowledged.
    last_offset: u64,
    leader: usize,
    /// From the last acknowledgement until all three nodes reported a high
    /// watermark past `last_offset`.
    all_replicated_secs: f64,
}

/// One node's memory and data directory at one moment.
#[derive(Clone, Serialize)]
struct NodeSample {
    node: usize,
    memory: Memory,
    dir_apparent_bytes: u64,
    dir_allocated_bytes: u64,
}

#[derive(Serialize)]
struct SnapshotFigures {
    node: usize,
    /// `POST /v1/snapshot` as the client saw it.
    secs: f64,
    answer: SnapshotInfo,
}

#[derive(Serialize)]
struct CompactionFigures {
    node: usize,
    /// From this node's snapshot answer until its `log_start_offset` > 0.
    wait_secs: f64,
    log_start_offset: u64,
}

/// A node started and timed until it caught up (a join or a restart).
#[derive(Serialize)]
struct CatchUp {
    node: usize,
    /// `log`, `snapshot` (an observer joining) or `restart`.
    how: &'static str,
    /// The leader's high watermark just before the spawn: the target.
    target_high_watermark: u64,
    /// From the spawn until `GET /v1/quorum` answered.
    http_secs: f64,
    /// From the spawn until its high watermark reached the target.
    caught_up_secs: f64,
    /// Its log start once caught up: above 0 only through a snapshot (its
    /// own, or one fetched with FetchSnapshot).
    log_start_offset: u64,
    /// "installed the leader's snapshot" lines in its server log.
    snapshot_installs: usize,
    sample: NodeSample,
}

#[derive(Serialize)]
struct Restart {
    /// SIGKILL until the process was reaped.
    kill_secs: f64,
    catch_up: CatchUp,
}

#[derive(Serialize)]
struct Settings {
    records: u64,
    value_bytes: usize,
    batch: usize,
    clients: usize,
    log_join: bool,
    cleaner_interval_ms: u64,
    extra_config: String,
    kraft_bin: String,
}

#[derive(Serialize)]
struct Report {
    kind: &'static str,
    started_unix: u64,
    machine: Machine,
    settings: Settings,
    load: LoadFigures,
    loaded: Vec<NodeSample>,
    log_join: Option<CatchUp>,
    snapshots: Vec<SnapshotFigures>,
    after_snapshot: Vec<NodeSample>,
    compaction: Vec<CompactionFigures>,
    compacted: Vec<NodeSample>,
    snapshot_join: CatchUp,
    restart: Restart,
    end: Vec<NodeSample>,
}

pub async fn run(options: StateOptions) -> Result<()> {
    anyhow::ensure!(options.records > 0, "--records must be above 0");
    anyhow::ensure!(options.batch > 0, "--batch must be above 0");
    anyhow::ensure!(options.clients > 0, "--clients must be above 0");
    let machine = Machine::here(&options.data_root);
    println!(
        "kraft-bench state: {} cores, kernel {}, data on {}",
        machine.nproc, machine.kernel, machine.data_filesystem
    );
    let bin = kraft_cluster::locate_or_build(options.kraft_bin.as_deref(), &options.repo_root)?;
    std::fs::create_dir_all(&options.out)
        .with_context(|| format!("cannot create the results directory {}", options.out.display()))?;
    let started_unix = procs::since_epoch().as_secs();
    let extra = extra_config(options.cleaner_interval_ms);
    let mut cluster = KraftCluster::start_with(&bin, &options.data_root, &extra)?;
    println!(
        "cluster files (configs, data, server logs): {}",
        cluster.dir().display()
    );
    let settings = Settings {
        records: options.records,
        value_bytes: options.value_bytes,
        batch: options.batch,
        clients: options.clients,
        log_join: options.log_join,
        cleaner_interval_ms: options.cleaner_interval_ms,
        extra_config: extra,
        kraft_bin: bin.display().to_string(),
    };
    let outcome = steps(&mut cluster, &options, machine, settings, started_unix).await;
    let report = or_diagnose("state: a step failed", &cluster, outcome).await?;
    print_summary(&report);
    let json_path = options.out.join(format!("state-{started_unix}.json"));
    procs::write_results(&json_path, &report)?;
    Ok(())
}

/// Steps 1 to 6, in order, each printed as it finishes.
async fn steps(
    cluster: &mut KraftCluster,
    o: &StateOptions,
    machine: Machine,
    settings: Settings,
    started_unix: u64,
) -> Result<Report> {
    let voters = [1, 2, 3];

    // 1. Load.
    let leader = cluster.wait_for_leader_id().await?;
    println!(
        "\n== 1. load: {} records of {} B, {} per POST /v1/append, {} connections, to node {leader} (leader)",
        thousands(o.records),
        o.value_bytes,
        o.batch,
        o.clients
    );
    let mut load = load_records(cluster.http_of(leader)?, o).await?;
    load.leader = leader;
    let acked = Instant::now();
    for id in voters {
        let target = load.last_offset + 1;
        wait_for(
            cluster,
            id,
            acked,
            o.wait,
            &format!("high watermark ≥ {target}"),
            |v| v.high_watermark >= target,
        )
        .await?;
    }
    load.all_replicated_secs = acked.elapsed().as_secs_f64();
    println!(
        "   {} records in {} requests: {}, {} records/s ({:.1} MB/s of values); last offset {}; all 3 nodes at high watermark {} after {} more",
        thousands(o.records),
        thousands(load.requests),
        fmt_secs(load.secs),
        thousands(load.records_per_sec as u64),
        load.mb_per_sec,
        thousands(load.last_offset),
        thousands(load.last_offset + 1),
        fmt_secs(load.all_replicated_secs)
    );

    // 2. Memory and disk with N records in the log.
    println!(
        "\n== 2. memory and disk with {} records in the log",
        thousands(o.records)
    );
    let loaded = samples(cluster, &voters)?;
    print_samples(&loaded);

    // 5a (optional). A fresh observer joins through the log alone.
    let log_join = if o.log_join {
        println!("\n== 5a. a fresh observer (node {LOG_OBSERVER}) joins before any snapshot: through the log");
        let join = join(cluster, LOG_OBSERVER, "log", o.wait).await?;
        print_catch_up(&join);
        cluster.stop_node(LOG_OBSERVER, libc::SIGTERM)?;
        Some(join)
    } else {
        None
    };

    // 3. A snapshot on each node, one after the other. Each node is
    // sampled as soon as its snapshot is answered: its cleaner starts
    // deleting the log below it at its next pass (within
    // --cleaner-interval-ms), which step 4 times.
    println!("\n== 3. POST /v1/snapshot on each node (each sampled right after its answer)");
    let mut snapshots = Vec::new();
    let mut answered = Vec::new();
    let mut after_snapshot = Vec::new();
    for id in voters {
        let (secs, answer) = snapshot(cluster.http_of(id)?, o.wait).await?;
        answered.push(Instant::now());
        after_snapshot.push(sample(cluster, id)?);
        println!(
            "   node {id}: {} (end offset {}, epoch {}, {} bytes = {:.1} MiB, created {})",
            fmt_secs(secs),
            thousands(answer.end_offset),
            answer.epoch,
            thousands(answer.size_bytes),
            mib(answer.size_bytes),
            answer.created
        );
        print_samples(&after_snapshot[after_snapshot.len() - 1..]);
        snapshots.push(SnapshotFigures { node: id, secs, answer });
    }

    // 4. Compaction.
    println!(
        "\n== 4. compaction (cleaner every {} ms, retention 1 byte / 1 ms)",
        o.cleaner_interval_ms
    );
    let leader = cluster.wait_for_leader_id().await?;
    let mut order = vec![leader];
    order.extend(voters.iter().filter(|&&id| id != leader));
    let mut compaction = Vec::new();
    for id in order {
        let waited = wait_for(cluster, id, answered[id - 1], o.wait, "log_start_offset > 0", |v| {
            v.log_start_offset > 0
        })
        .await?;
        println!(
            "   node {id}{}: log start {} after {} (from its snapshot's answer)",
            if id == leader { " (leader)" } else { "" },
            thousands(waited.view.log_start_offset),
            fmt_secs(waited.done)
        );
        compaction.push(CompactionFigures {
            node: id,
            wait_secs: waited.done,
            log_start_offset: waited.view.log_start_offset,
        });
    }
    let compacted = samples(cluster, &voters)?;
    print_samples(&compacted);

    // 5. A fresh observer joins through FetchSnapshot.
    println!("\n== 5. a fresh observer (node {SNAPSHOT_OBSERVER}) joins after compaction: through FetchSnapshot");
    let snapshot_join = join(cluster, SNAPSHOT_OBSERVER, "snapshot", o.wait).await?;
    print_catch_up(&snapshot_join);
    if snapshot_join.log_start_offset == 0 {
        println!("   NOTE: its log starts at 0, so it did not go through FetchSnapshot");
    }
    cluster.stop_node(SNAPSHOT_OBSERVER, libc::SIGTERM)?;

    // 6. A follower crashes and restarts.
    let leader = cluster.wait_for_leader_id().await?;
    let follower = *voters.iter().find(|&&id| id != leader).expect("3 voters");
    println!("\n== 6. SIGKILL follower node {follower}, restart it on the same data directory");
    let restart = restart(cluster, follower, leader, o.wait).await?;
    println!("   SIGKILL to exit: {}", fmt_secs(restart.kill_secs));
    print_catch_up(&restart.catch_up);

    let end = samples(cluster, &voters)?;
    println!("\n== the voters at the end");
    print_samples(&end);

    Ok(Report {
        kind: "state",
        started_unix,
        machine,
        settings,
        load,
        loaded,
        log_join,
        snapshots,
        after_snapshot,
        compaction,
        compacted,
        snapshot_join,
        restart,
        end,
    })
}

/// Step 1: `--clients` connections append every record once, each taking
/// the next batch from a shared counter as soon as its previous request
/// was answered (at commit). A failed request fails the step: the figures
/// are only meaningful with every record in the log.
async fn load_records(leader: SocketAddr, o: &StateOptions) -> Result<LoadFigures> {
    let next_batch = Arc::new(AtomicU64::new(0));
    let loaded = Arc::new(AtomicU64::new(0));
    let mut clients = JoinSet::new();
    let started = Instant::now();
    for client in 0..o.clients {
        let (next_batch, loaded) = (next_batch.clone(), loaded.clone());
        let (records, batch, value_bytes) = (o.records, o.batch, o.value_bytes);
        clients.spawn(async move {
            let mut conn = HttpConn::new(leader);
            let (mut last_offset, mut requests) = (0u64, 0u64);
            loop {
                let index = next_batch.fetch_add(1, Ordering::Relaxed);
                let Some(range) = batch_range(index, records, batch) else {
                    return Ok::<_, anyhow::Error>((last_offset, requests));
                };
                let len = range.end - range.start;
                let values: Vec<String> = range.map(|seq| load::payload(client, seq, value_bytes)).collect();
                let body = serde_json::to_vec(&serde_json::json!({ "records": values }))?;
                let (status, answer) = conn
                    .post("/v1/append", Bytes::from(body))
                    .await
                    .map_err(|e| anyhow::anyhow!("POST /v1/append (batch {index}): {e}"))?;
                if !status.is_success() {
                    bail!(
                        "POST /v1/append (batch {index}): HTTP {}: {}",
                        status.as_u16(),
                        String::from_utf8_lossy(&answer[..answer.len().min(300)])
                    );
                }
                let appended: Appended = serde_json::from_slice(&answer)
                    .with_context(|| format!("POST /v1/append answer {}", String::from_utf8_lossy(&answer)))?;
                last_offset = last_offset.max(appended.last_offset);
                requests += 1;
                loaded.fetch_add(len, Ordering::Relaxed);
            }
        });
    }
    let (mut last_offset, mut requests) = (0, 0);
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    loop {
        tokio::select! {
            joined = clients.join_next() => match joined {
                None => break,
                Some(joined) => {
                    let (last, n) = joined.context("a load client panicked")??;
                    last_offset = last_offset.max(last);
                    requests += n;
                }
            },
            _ = progress.tick() => {
                let done = loaded.load(Ordering::Relaxed);
                println!(
                    "   ... {} records after {} ({} records/s)",
                    thousands(done),
                    fmt_secs(started.elapsed().as_secs_f64()),
                    thousands((done as f64 / started.elapsed().as_secs_f64()) as u64)
                );
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(LoadFigures {
        records: o.records,
        value_bytes: o.value_bytes,
        batch: o.batch,
        clients: o.clients,
        requests,
        secs,
        records_per_sec: o.records as f64 / secs,
        mb_per_sec: (o.records * o.value_bytes as u64) as f64 / secs / 1e6,
        last_offset,
        leader: 0,
        all_replicated_secs: 0.0,
    })
}

/// The memory of each node's process and the size of its data directory.
fn samples(cluster: &KraftCluster, ids: &[usize]) -> Result<Vec<NodeSample>> {
    ids.iter().map(|&id| sample(cluster, id)).collect()
}

fn sample(cluster: &KraftCluster, id: usize) -> Result<NodeSample> {
    let pid = cluster.pid(id).with_context(|| format!("node {id} is not running"))?;
    let (apparent, allocated) = procs::dir_usage(&cluster.data_dir(id)?);
    Ok(NodeSample {
        node: id,
        memory: procs::memory(pid)?,
        dir_apparent_bytes: apparent,
        dir_allocated_bytes: allocated,
    })
}

fn print_samples(samples: &[NodeSample]) {
    for s in samples {
        println!(
            "   node {}: RSS {:.1} MiB (peak {:.1} MiB); data dir {:.1} MiB apparent, {:.1} MiB allocated",
            s.node,
            s.memory.rss_mib(),
            s.memory.hwm_mib(),
            mib(s.dir_apparent_bytes),
            mib(s.dir_allocated_bytes)
        );
    }
}

/// Step 3 on one node: `POST /v1/snapshot`, timed as the client sees it.
async fn snapshot(addr: SocketAddr, wait: Duration) -> Result<(f64, SnapshotInfo)> {
    let started = Instant::now();
    let (status, answer) = tokio::time::timeout(wait, HttpConn::new(addr).post("/v1/snapshot", Bytes::new()))
        .await
        .with_context(|| format!("POST /v1/snapshot on {addr}: no answer in {wait:?}"))?
        .map_err(|e| anyhow::anyhow!("POST /v1/snapshot on {addr}: {e}"))?;
    let secs = started.elapsed().as_secs_f64();
    if !status.is_success() {
        bail!(
            "POST /v1/snapshot on {addr}: HTTP {}: {}",
            status.as_u16(),
            String::from_utf8_lossy(&answer)
        );
    }
    let info = serde_json::from_slice(&answer)
        .with_context(|| format!("POST /v1/snapshot answer {}", String::from_utf8_lossy(&answer)))?;
    Ok((secs, info))
}

/// What [`wait_for`] saw: seconds from `since` until the node first
/// answered and until the condition held, and the view that satisfied it.
struct Waited {
    http: f64,
    done: f64,
    view: QuorumView,
}

/// Polls node `id`'s `GET /v1/quorum` every [`POLL`] (one keep-alive
/// connection, re-opened while the node is not listening yet) until
/// `done(view)`; fails after `timeout`, or as soon as a server has exited.
async fn wait_for(
    cluster: &mut KraftCluster,
    id: usize,
    since: Instant,
    timeout: Duration,
    what: &str,
    done: impl Fn(&QuorumView) -> bool,
) -> Result<Waited> {
    let addr = cluster.http_of(id)?;
    let mut conn = HttpConn::new(addr);
    let mut http = None;
    loop {
        cluster.check_running()?;
        let last = match conn.get("/v1/quorum").await {
            Ok((status, body)) if status.is_success() => {
                let elapsed = since.elapsed().as_secs_f64();
                http.get_or_insert(elapsed);
                let view: QuorumView = serde_json::from_slice(&body)
                    .with_context(|| format!("GET /v1/quorum on node {id}: {}", String::from_utf8_lossy(&body)))?;
                if done(&view) {
                    return Ok(Waited {
                        http: http.unwrap_or(elapsed),
                        done: elapsed,
                        view,
                    });
                }
                String::from_utf8_lossy(&body).into_owned()
            }
            Ok((status, body)) => format!("HTTP {status}: {}", String::from_utf8_lossy(&body)),
            Err(e) => e,
        };
        if since.elapsed() >= timeout {
            bail!(
                "node {id}: no {what} after {timeout:?}; last GET /v1/quorum: {last}\n{}",
                cluster.log_tails(20)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Step 5: starts observer `id` (fresh data directory) and times it until
/// its high watermark reaches the leader's high watermark at the spawn.
async fn join(cluster: &mut KraftCluster, id: usize, how: &'static str, wait: Duration) -> Result<CatchUp> {
    let leader = cluster.wait_for_leader_id().await?;
    let target = leader_high_watermark(cluster, leader).await?;
    let spawned = Instant::now();
    cluster.add_observer(id)?;
    catch_up(cluster, id, how, target, spawned, wait).await
}

/// Step 6: SIGKILL follower `id`, start it again on its data directory,
/// and time it until its high watermark reaches the leader's at the spawn.
async fn restart(cluster: &mut KraftCluster, id: usize, leader: usize, wait: Duration) -> Result<Restart> {
    let kill_secs = cluster.stop_node(id, libc::SIGKILL)?.as_secs_f64();
    let target = leader_high_watermark(cluster, leader).await?;
    let spawned = Instant::now();
    cluster.restart_node(id)?;
    let catch_up = catch_up(cluster, id, "restart", target, spawned, wait).await?;
    Ok(Restart { kill_secs, catch_up })
}

async fn leader_high_watermark(cluster: &KraftCluster, leader: usize) -> Result<u64> {
    let view = kraft_cluster::quorum_view(cluster.http_of(leader)?)
        .await
        .map_err(anyhow::Error::msg)?;
    if view.role != "leader" {
        bail!("node {leader} is no longer the leader: {view:?}");
    }
    Ok(view.high_watermark)
}

/// Waits for node `id` (started at `spawned`) to reach `target`, then
/// samples it.
async fn catch_up(
    cluster: &mut KraftCluster,
    id: usize,
    how: &'static str,
    target: u64,
    spawned: Instant,
    wait: Duration,
) -> Result<CatchUp> {
    let waited = wait_for(
        cluster,
        id,
        spawned,
        wait,
        &format!("high watermark ≥ {target}"),
        |v| v.high_watermark >= target,
    )
    .await?;
    let log = std::fs::read_to_string(cluster.log_of(id)?).unwrap_or_default();
    Ok(CatchUp {
        node: id,
        how,
        target_high_watermark: target,
        http_secs: waited.http,
        caught_up_secs: waited.done,
        log_start_offset: waited.view.log_start_offset,
        snapshot_installs: log.matches("installed the leader's snapshot").count(),
        sample: sample(cluster, id)?,
    })
}

fn print_catch_up(c: &CatchUp) {
    println!(
        "   node {}: HTTP answered after {}, high watermark ≥ {} (the leader's at the spawn) after {}; log start {}, snapshots installed {}",
        c.node,
        fmt_secs(c.http_secs),
        thousands(c.target_high_watermark),
        fmt_secs(c.caught_up_secs),
        thousands(c.log_start_offset),
        c.snapshot_installs
    );
    print_samples(std::slice::from_ref(&c.sample));
}

/// `outcome`, and when it failed, what the running nodes say, on stderr
/// (`what` names the command and where it failed).
pub(crate) async fn or_diagnose<T>(what: &str, cluster: &KraftCluster, outcome: Result<T>) -> Result<T> {
    if outcome.is_err() {
        eprintln!("\nkraft-bench {what}; what the running nodes say:");
        eprintln!("{}", diagnose(cluster).await);
        eprintln!("(rerun with --keep-data to keep the data directories and server logs)");
    }
    outcome
}

/// For a failed step: every running node's raw `GET /v1/quorum` and the
/// end of every server log.
pub(crate) async fn diagnose(cluster: &KraftCluster) -> String {
    let mut text = String::new();
    for (id, addr) in cluster.running() {
        let answer = match tokio::time::timeout(Duration::from_secs(5), HttpConn::new(addr).get("/v1/quorum")).await {
            Ok(Ok((status, body))) => format!("{status} {}", String::from_utf8_lossy(&body)),
            Ok(Err(e)) => e,
            Err(_) => "no answer in 5 s".to_string(),
        };
        text.push_str(&format!("GET /v1/quorum on node {id} ({addr}): {answer}\n"));
    }
    for (name, log) in cluster.logs() {
        text.push_str(&format!("{name}: {}\n", log.display()));
    }
    text.push_str(&cluster.log_tails(40));
    text
}

fn print_summary(r: &Report) {
    println!(
        "\n== summary: {} records of {} B; {} per request, {} connections; cleaner every {} ms",
        thousands(r.load.records),
        r.load.value_bytes,
        r.load.batch,
        r.load.clients,
        r.settings.cleaner_interval_ms
    );
    println!(
        "load: {}, {} records/s ({:.1} MB/s of values), to node {}; all 3 at the high watermark {} later\n",
        fmt_secs(r.load.secs),
        thousands(r.load.records_per_sec as u64),
        r.load.mb_per_sec,
        r.load.leader,
        fmt_secs(r.load.all_replicated_secs)
    );
    let mut header = vec!["voter".to_string()];
    header.extend(r.loaded.iter().map(|s| {
        if s.node == r.load.leader {
            format!("node {} (leader)", s.node)
        } else {
            format!("node {}", s.node)
        }
    }));
    let per_node = |label: &str, cell: &dyn Fn(usize) -> String| {
        let mut row = vec![label.to_string()];
        row.extend((0..r.loaded.len()).map(cell));
        row
    };
    let rss = |s: &NodeSample| format!("{:.1} / {:.1}", s.memory.rss_mib(), s.memory.hwm_mib());
    let dir = |s: &NodeSample| format!("{:.1} / {:.1}", mib(s.dir_apparent_bytes), mib(s.dir_allocated_bytes));
    let compaction = |node: usize| {
        r.compaction
            .iter()
            .find(|c| c.node == node)
            .map_or("-".to_string(), |c| fmt_secs(c.wait_secs))
    };
    let rows = vec![
        per_node("RSS / peak MiB, records in the log", &|i| rss(&r.loaded[i])),
        per_node("data dir MiB (apparent / allocated)", &|i| dir(&r.loaded[i])),
        per_node("POST /v1/snapshot", &|i| fmt_secs(r.snapshots[i].secs)),
        per_node("snapshot MiB", &|i| {
            format!("{:.1}", mib(r.snapshots[i].answer.size_bytes))
        }),
        per_node("RSS / peak MiB after the snapshot", &|i| rss(&r.after_snapshot[i])),
        per_node("compaction wait", &|i| compaction(r.loaded[i].node)),
        per_node("data dir MiB after compaction", &|i| dir(&r.compacted[i])),
        per_node("RSS / peak MiB at the end", &|i| rss(&r.end[i])),
        per_node("data dir MiB at the end", &|i| dir(&r.end[i])),
    ];
    print!("{}", table(&header, &rows));
    println!();
    let header: Vec<String> = [
        "catching up",
        "HTTP up",
        "caught up",
        "target HW",
        "log start",
        "RSS / peak MiB",
        "data dir MiB",
    ]
    .map(String::from)
    .to_vec();
    let row = |label: String, c: &CatchUp| {
        vec![
            label,
            fmt_secs(c.http_secs),
            fmt_secs(c.caught_up_secs),
            thousands(c.target_high_watermark),
            thousands(c.log_start_offset),
            rss(&c.sample),
            dir(&c.sample),
        ]
    };
    let mut rows = Vec::new();
    if let Some(c) = &r.log_join {
        rows.push(row(format!("observer {} joins via the log", c.node), c));
    }
    let c = &r.snapshot_join;
    rows.push(row(format!("observer {} joins via FetchSnapshot", c.node), c));
    let c = &r.restart.catch_up;
    rows.push(row(format!("node {} restarts after SIGKILL", c.node), c));
    print!("{}", table(&header, &rows));
}

/// Left-aligned columns, two spaces apart, a rule under the header.
pub(crate) fn table(header: &[String], rows: &[Vec<String>]) -> String {
    let columns = header.len();
    let width = |i: usize| {
        std::iter::once(header)
            .chain(rows.iter().map(|r| r.as_slice()))
            .filter_map(|r| r.get(i))
            .map(|cell| cell.chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..columns).map(width).collect();
    let line = |cells: &[String]| {
        let text = cells
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        format!("{}\n", text.trim_end())
    };
    let mut out = line(header);
    out.push_str(&line(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>()));
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

pub(crate) fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Seconds, as milliseconds below 1 s.
pub(crate) fn fmt_secs(secs: f64) -> String {
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1000.0)
    } else {
        format!("{secs:.2} s")
    }
}

/// 1234567 → "1,234,567".
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A node config as the cluster writes it.
    fn node_config_with_extra(dir: &Path, cleaner_interval_ms: u64) -> String {
        let mut text = kraft_cluster::node_config(
            4,
            "broker",
            &dir.join("node-4"),
            "bench-test",
            19093,
            18080,
            "\"1@127.0.0.1:19090\", \"2@127.0.0.1:19091\", \"3@127.0.0.1:19092\"",
        );
        text.push_str(&extra_config(cleaner_interval_ms));
        text
    }

    #[test]
    fn batches_cover_every_record_once() {
        let ranges: Vec<_> = (0..).map_while(|i| batch_range(i, 2500, 1000)).collect();
        assert_eq!(ranges, vec![0..1000, 1000..2000, 2000..2500]);
        assert_eq!(batch_range(0, 1, 1000), Some(0..1));
        assert_eq!(batch_range(1, 1000, 1000), None);
        assert_eq!(batch_range(u64::MAX, 10, 2), None);
    }

    #[test]
    fn the_extra_config_is_accepted_by_kraft() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node4.toml");
        std::fs::write(&path, node_config_with_extra(dir.path(), 200)).unwrap();
        let config = kraft::config::Config::load(&path, &[]).expect("kraft accepts the state config");
        assert_eq!(config.node.id, 4);
        assert_eq!(config.quorum.voters.len(), 3);
        assert_eq!(config.log.retention_bytes, 1);
        assert_eq!(config.log.retention_ms, 1);
        assert_eq!(config.log.cleaner_interval_ms, 200);
        assert_eq!(config.snapshot.max_bytes_between, 1 << 60);
        assert_eq!(config.snapshot.max_interval_ms, kraft::config::MAX_MS);
    }

    #[test]
    fn numbers_and_durations_print_plainly() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(fmt_secs(0.0123), "12 ms");
        assert_eq!(fmt_secs(2.5), "2.50 s");
    }

    #[test]
    fn table_columns_line_up() {
        let header = vec!["a".to_string(), "bbb".to_string()];
        let rows = vec![vec!["long cell".to_string(), "x".to_string()]];
        assert_eq!(table(&header, &rows), "a          bbb\n---------  ---\nlong cell  x\n");
    }
}
