//! The `soak` command: does a node's disk use stay bounded under a steady
//! write load with snapshots and retention on? A 3-node cluster of real
//! `kraft run` processes with small `[snapshot]` and `[log]` limits takes
//! batches of records over `POST /v1/append` at a steady rate for
//! `--minutes`, then rests for `--settle-secs`. Every `--sample-secs` it
//! samples each node: its data directory (apparent and allocated), the
//! part of it that is sled's and the part that is snapshot files, its RSS,
//! and its log start and high watermark. One line is printed per sample, a
//! table per minute at the end, and every sample goes into a results JSON.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use serde::Serialize;
use tokio::task::JoinSet;

use crate::harness::Machine;
use crate::http::HttpConn;
use crate::kraft_cluster::{self, KraftCluster, QuorumView};
use crate::load;
use crate::procs::{self, Memory};
use crate::state::{fmt_secs, mib, or_diagnose, table, thousands};

/// The voters' node ids.
const VOTERS: [usize; 3] = [1, 2, 3];
/// How long a client waits after a failed append before the next one.
const ERROR_BACKOFF: Duration = Duration::from_millis(200);
/// Longest wait for one `GET /v1/quorum` of a sample.
const VIEW_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for the load clients' last answers once the load stops.
const CLIENT_STOP_WAIT: Duration = Duration::from_secs(30);
/// Rows of the summary table at most (samples are thinned to fit).
const SUMMARY_ROWS: usize = 25;

pub struct SoakOptions {
    /// How long the load runs.
    pub duration: Duration,
    /// How long the cluster is sampled after the load stopped.
    pub settle: Duration,
    pub sample_every: Duration,
    pub value_bytes: usize,
    /// Records per `POST /v1/append`.
    pub batch: usize,
    pub clients: usize,
    /// Records per second all clients together send at most; 0: as fast
    /// as the cluster commits.
    pub records_per_sec: u64,
    pub limits: Limits,
    /// The load stops early once the data filesystem has less free.
    pub min_free_bytes: u64,
    pub kraft_bin: Option<PathBuf>,
    pub repo_root: PathBuf,
    pub out: PathBuf,
    pub data_root: PathBuf,
}

/// The nodes' `[snapshot]` and `[log]` keys.
#[derive(Clone, Copy, Serialize)]
pub struct Limits {
    pub snapshot_max_bytes_between: u64,
    pub snapshot_max_interval_ms: u64,
    pub retention_bytes: u64,
    pub retention_ms: u64,
    pub cleaner_interval_ms: u64,
}

/// Appended to every node's config.
fn extra_config(limits: &Limits) -> String {
    format!(
        r#"
# kraft-bench soak: small snapshot and retention limits.
[log]
retention_bytes = {}
retention_ms = {}
cleaner_interval_ms = {}

[snapshot]
max_bytes_between = {}
max_interval_ms = {}
"#,
        limits.retention_bytes,
        limits.retention_ms,
        limits.cleaner_interval_ms,
        limits.snapshot_max_bytes_between,
        limits.snapshot_max_interval_ms,
    )
}

/// One node at one moment.
#[derive(Clone, Serialize)]
struct NodeSample {
    node: usize,
    dir_apparent_bytes: u64,
    dir_allocated_bytes: u64,
    /// The `sled` directory (the log and the election state).
    sled_apparent_bytes: u64,
    sled_allocated_bytes: u64,
    /// `.checkpoint` files and the `.checkpoint.part` being written.
    snapshot_bytes: u64,
    snapshot_files: usize,
    partial_snapshot_files: usize,
    memory: Memory,
    /// None when the node did not answer in time.
    view: Option<QuorumView>,
}

/// Every node at one moment, with the load so far.
#[derive(Serialize)]
struct Tick {
    secs: f64,
    /// True once the load has stopped (the settle period).
    settling: bool,
    records_acked: u64,
    /// `records_acked` times the value size.
    value_bytes_acked: u64,
    append_errors: u64,
    fs_free_bytes: u64,
    nodes: Vec<NodeSample>,
}

#[derive(Serialize)]
struct Settings {
    minutes: f64,
    settle_secs: f64,
    sample_secs: f64,
    value_bytes: usize,
    batch: usize,
    clients: usize,
    records_per_sec: u64,
    limits: Limits,
    min_free_bytes: u64,
    extra_config: String,
    kraft_bin: String,
}

#[derive(Serialize)]
struct Report {
    kind: &'static str,
    started_unix: u64,
    machine: Machine,
    settings: Settings,
    /// Why the load stopped before `--minutes`, if it did.
    stopped_early: Option<String>,
    load_secs: f64,
    records_acked: u64,
    append_errors: u64,
    ticks: Vec<Tick>,
}

pub async fn run(options: SoakOptions) -> Result<()> {
    anyhow::ensure!(options.batch > 0, "--batch must be above 0");
    anyhow::ensure!(options.clients > 0, "--clients must be above 0");
    anyhow::ensure!(!options.sample_every.is_zero(), "--sample-secs must be above 0");
    let machine = Machine::here(&options.data_root);
    let free = procs::free_bytes(&options.data_root)?;
    println!(
        "kraft-bench soak: {} cores, kernel {}, data on {}, {:.1} GiB free",
        machine.nproc,
        machine.kernel,
        machine.data_filesystem,
        gib(free)
    );
    anyhow::ensure!(
        free > options.min_free_bytes,
        "only {:.1} GiB free under {}, below --min-free-gib {:.1}",
        gib(free),
        options.data_root.display(),
        gib(options.min_free_bytes)
    );
    let bin = kraft_cluster::locate_or_build(options.kraft_bin.as_deref(), &options.repo_root)?;
    std::fs::create_dir_all(&options.out)
        .with_context(|| format!("cannot create the results directory {}", options.out.display()))?;
    let started_unix = procs::since_epoch().as_secs();
    let extra = extra_config(&options.limits);
    let mut cluster = KraftCluster::start_with(&bin, &options.data_root, &extra)?;
    println!(
        "cluster files (configs, data, server logs): {}",
        cluster.dir().display()
    );
    let settings = Settings {
        minutes: options.duration.as_secs_f64() / 60.0,
        settle_secs: options.settle.as_secs_f64(),
        sample_secs: options.sample_every.as_secs_f64(),
        value_bytes: options.value_bytes,
        batch: options.batch,
        clients: options.clients,
        records_per_sec: options.records_per_sec,
        limits: options.limits,
        min_free_bytes: options.min_free_bytes,
        extra_config: extra,
        kraft_bin: bin.display().to_string(),
    };
    let outcome = soak(&mut cluster, &options, machine, settings, started_unix).await;
    let report = or_diagnose("soak: failed", &cluster, outcome).await?;
    print_summary(&report);
    let json_path = options.out.join(format!("soak-{started_unix}.json"));
    procs::write_results(&json_path, &report)?;
    Ok(())
}

/// What the load clients share.
#[derive(Default)]
struct LoadState {
    stop: AtomicBool,
    records_acked: AtomicU64,
    errors: AtomicU64,
}

async fn soak(
    cluster: &mut KraftCluster,
    o: &SoakOptions,
    machine: Machine,
    settings: Settings,
    started_unix: u64,
) -> Result<Report> {
    let leader = cluster.wait_for_leader_id().await?;
    let rate = match o.records_per_sec {
        0 => "as fast as it commits".to_string(),
        n => format!("at most {} records/s", thousands(n)),
    };
    println!(
        "\nload: {} min of {} B records, {} per POST /v1/append, {} connections to node {leader} (leader), {rate}; then {} at rest",
        settings.minutes,
        o.value_bytes,
        o.batch,
        o.clients,
        fmt_secs(o.settle.as_secs_f64())
    );
    println!(
        "per node: dir = data directory (apparent MiB), sled = its sled/ part, snap = snapshot files (MiB/count), rss MiB, log = log start..high watermark\n"
    );
    let state = Arc::new(LoadState::default());
    let mut clients = start_clients(cluster.http_of(leader)?, o, &state);
    let started = Instant::now();
    let mut ticks = Vec::new();
    let mut stopped_early = None;
    let mut load_secs = None;
    let mut interval = tokio::time::interval(o.sample_every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        cluster.check_running()?;
        let elapsed = started.elapsed();
        let settling = load_secs.is_some();
        let tick = sample_all(cluster, &state, elapsed, settling, o).await?;
        print_tick(&tick);
        let free = tick.fs_free_bytes;
        ticks.push(tick);
        if load_secs.is_none() {
            let low_disk = free < o.min_free_bytes;
            if low_disk {
                let why = format!(
                    "{:.1} GiB free, below --min-free-gib {:.1}",
                    gib(free),
                    gib(o.min_free_bytes)
                );
                println!("   stopping the load early: {why}");
                stopped_early = Some(why);
            }
            if low_disk || elapsed >= o.duration {
                state.stop.store(true, Ordering::Relaxed);
                let joined_all = async {
                    while let Some(joined) = clients.join_next().await {
                        joined.context("a load client panicked")?;
                    }
                    anyhow::Ok(())
                };
                match tokio::time::timeout(CLIENT_STOP_WAIT, joined_all).await {
                    Ok(outcome) => outcome?,
                    Err(_) => {
                        println!(
                            "   a load client was still waiting for an answer after {CLIENT_STOP_WAIT:?}: aborted"
                        );
                        clients.abort_all();
                    }
                }
                load_secs = Some(started.elapsed().as_secs_f64());
                println!("   load stopped; sampling at rest");
            }
        } else if elapsed.as_secs_f64() >= load_secs.unwrap_or(0.0) + o.settle.as_secs_f64() {
            break;
        }
    }
    Ok(Report {
        kind: "soak",
        started_unix,
        machine,
        settings,
        stopped_early,
        load_secs: load_secs.unwrap_or(0.0),
        records_acked: state.records_acked.load(Ordering::Relaxed),
        append_errors: state.errors.load(Ordering::Relaxed),
        ticks,
    })
}

/// `--clients` connections to the leader, each sending its next batch once
/// the previous one committed, paced so that together they send at most
/// `--records-per-sec`. A failed append is counted and retried with new
/// records after [`ERROR_BACKOFF`]: the soak is about disk use, and a node
/// that is briefly unavailable (an election) must not end it.
fn start_clients(leader: SocketAddr, o: &SoakOptions, state: &Arc<LoadState>) -> JoinSet<()> {
    let mut clients = JoinSet::new();
    // Each client's gap between two sends, so that all together keep the rate.
    let gap = match o.records_per_sec {
        0 => None,
        rate => Some(Duration::from_secs_f64((o.batch * o.clients) as f64 / rate as f64)),
    };
    for client in 0..o.clients {
        let state = state.clone();
        let (batch, value_bytes) = (o.batch, o.value_bytes);
        clients.spawn(async move {
            let mut conn = HttpConn::new(leader);
            let mut pace = gap.map(|gap| {
                let mut pace = tokio::time::interval(gap);
                pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                pace
            });
            let mut seq = 0u64;
            while !state.stop.load(Ordering::Relaxed) {
                if let Some(pace) = pace.as_mut() {
                    pace.tick().await;
                }
                let values: Vec<String> = (0..batch)
                    .map(|_| {
                        seq += 1;
                        load::payload(client, seq, value_bytes)
                    })
                    .collect();
                let body = serde_json::to_vec(&serde_json::json!({ "records": values })).expect("json");
                match conn.post("/v1/append", Bytes::from(body)).await {
                    Ok((status, _)) if status.is_success() => {
                        state.records_acked.fetch_add(batch as u64, Ordering::Relaxed);
                    }
                    _ => {
                        state.errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(ERROR_BACKOFF).await;
                    }
                }
            }
        });
    }
    clients
}

async fn sample_all(
    cluster: &KraftCluster,
    state: &LoadState,
    elapsed: Duration,
    settling: bool,
    o: &SoakOptions,
) -> Result<Tick> {
    let mut nodes = Vec::new();
    for id in VOTERS {
        nodes.push(sample(cluster, id).await?);
    }
    let records_acked = state.records_acked.load(Ordering::Relaxed);
    Ok(Tick {
        secs: elapsed.as_secs_f64(),
        settling,
        records_acked,
        value_bytes_acked: records_acked * o.value_bytes as u64,
        append_errors: state.errors.load(Ordering::Relaxed),
        fs_free_bytes: procs::free_bytes(&o.data_root)?,
        nodes,
    })
}

async fn sample(cluster: &KraftCluster, id: usize) -> Result<NodeSample> {
    let pid = cluster.pid(id).with_context(|| format!("node {id} is not running"))?;
    let view = tokio::time::timeout(VIEW_TIMEOUT, kraft_cluster::quorum_view(cluster.http_of(id)?))
        .await
        .ok()
        .and_then(Result::ok);
    let data_dir = cluster.data_dir(id)?;
    let (dir_apparent, dir_allocated) = procs::dir_usage(&data_dir);
    let (sled_apparent, sled_allocated) = procs::dir_usage(&data_dir.join(kraft::storage::sled_store::SLED_SUBDIR));
    let snapshots = snapshot_files(&data_dir);
    Ok(NodeSample {
        node: id,
        dir_apparent_bytes: dir_apparent,
        dir_allocated_bytes: dir_allocated,
        sled_apparent_bytes: sled_apparent,
        sled_allocated_bytes: sled_allocated,
        snapshot_bytes: snapshots.bytes,
        snapshot_files: snapshots.complete,
        partial_snapshot_files: snapshots.partial,
        memory: procs::memory(pid)?,
        view,
    })
}

/// The snapshot files directly in a data directory.
#[derive(Debug, Default, PartialEq)]
struct SnapshotFiles {
    /// Apparent bytes of all of them, partial ones included.
    bytes: u64,
    complete: usize,
    partial: usize,
}

fn snapshot_files(data_dir: &Path) -> SnapshotFiles {
    use kraft::storage::snapshot::{PARTIAL_SUFFIX, SNAPSHOT_SUFFIX};
    let mut files = SnapshotFiles::default();
    let Ok(entries) = std::fs::read_dir(data_dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let partial = name.ends_with(PARTIAL_SUFFIX);
        if !partial && !name.ends_with(SNAPSHOT_SUFFIX) {
            continue;
        }
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        files.bytes += meta.len();
        if partial {
            files.partial += 1;
        } else {
            files.complete += 1;
        }
    }
    files
}

fn print_tick(t: &Tick) {
    let mut line = format!(
        "{:>6.0} s{} {:>11} rec ({:>7.1} MiB), {} err |",
        t.secs,
        if t.settling { "*" } else { " " },
        thousands(t.records_acked),
        mib(t.value_bytes_acked),
        t.append_errors
    );
    for n in &t.nodes {
        line.push_str(&format!(
            " n{} dir {:.0} sled {:.0} snap {:.0}/{} rss {:.0} log {}|",
            n.node,
            mib(n.dir_apparent_bytes),
            mib(n.sled_apparent_bytes),
            mib(n.snapshot_bytes),
            n.snapshot_files,
            n.memory.rss_mib(),
            n.view.as_ref().map_or("-".to_string(), |v| format!(
                "{}..{}",
                short(v.log_start_offset),
                short(v.high_watermark)
            )),
        ));
    }
    println!("{line}");
}

/// 1234567 → "1.23M", 12345 → "12k".
fn short(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{}k", n / 1_000),
        _ => format!("{:.2}M", n as f64 / 1e6),
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Samples thinned to at most [`SUMMARY_ROWS`], the first and the last
/// kept, then the table: per node the data directory, its sled and
/// snapshot parts, and RSS.
fn print_summary(r: &Report) {
    println!(
        "\n== summary: {} records of {} B acked in {} ({} append errors){}",
        thousands(r.records_acked),
        r.settings.value_bytes,
        fmt_secs(r.load_secs),
        r.append_errors,
        r.stopped_early
            .as_ref()
            .map_or(String::new(), |why| format!("; stopped early: {why}"))
    );
    let mut header = vec!["time".to_string(), "records acked".to_string()];
    for id in VOTERS {
        header.push(format!("n{id} dir (sled + snap) MiB"));
        header.push(format!("n{id} RSS"));
    }
    header.push("n1 log start..HW".to_string());
    let rows: Vec<Vec<String>> = thin(&r.ticks, SUMMARY_ROWS)
        .into_iter()
        .map(|t| {
            let mut row = vec![
                format!("{:.0} s{}", t.secs, if t.settling { "*" } else { "" }),
                thousands(t.records_acked),
            ];
            for n in &t.nodes {
                row.push(format!(
                    "{:.1} ({:.1} + {:.1})",
                    mib(n.dir_apparent_bytes),
                    mib(n.sled_apparent_bytes),
                    mib(n.snapshot_bytes)
                ));
                row.push(format!("{:.1}", n.memory.rss_mib()));
            }
            row.push(t.nodes[0].view.as_ref().map_or("-".to_string(), |v| {
                format!("{}..{}", thousands(v.log_start_offset), thousands(v.high_watermark))
            }));
            row
        })
        .collect();
    print!("{}", table(&header, &rows));
    println!("(* = after the load stopped; dir is apparent size, allocated is in the JSON)");
}

/// At most `n` (≥ 2) of `items`, evenly spread, the first and last kept.
fn thin<T>(items: &[T], n: usize) -> Vec<&T> {
    if items.len() <= n {
        return items.iter().collect();
    }
    let step = (items.len() - 1) as f64 / (n - 1) as f64;
    (0..n)
        .map(|i| &items[((i as f64 * step).round() as usize).min(items.len() - 1)])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extra_config_is_accepted_by_kraft() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            snapshot_max_bytes_between: 4 << 20,
            snapshot_max_interval_ms: 60_000,
            retention_bytes: 1 << 20,
            retention_ms: 60_000,
            cleaner_interval_ms: 2_000,
        };
        let mut text = kraft_cluster::node_config(
            1,
            "controller",
            &dir.path().join("node-1"),
            "bench-test",
            19093,
            18080,
            "\"1@127.0.0.1:19093\"",
        );
        text.push_str(&extra_config(&limits));
        let path = dir.path().join("node1.toml");
        std::fs::write(&path, text).unwrap();
        let config = kraft::config::Config::load(&path, &[]).expect("kraft accepts the soak config");
        assert_eq!(config.snapshot.max_bytes_between, 4 << 20);
        assert_eq!(config.snapshot.max_interval_ms, 60_000);
        assert_eq!(config.log.retention_bytes, 1 << 20);
        assert_eq!(config.log.retention_ms, 60_000);
        assert_eq!(config.log.cleaner_interval_ms, 2_000);
    }

    #[test]
    fn snapshot_files_are_told_from_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("00000000000000001000-0000000003.checkpoint"),
            [0u8; 100],
        )
        .unwrap();
        std::fs::write(
            dir.path().join("00000000000000002000-0000000003.checkpoint.part"),
            [0u8; 10],
        )
        .unwrap();
        std::fs::write(dir.path().join("meta.properties"), [0u8; 1000]).unwrap();
        std::fs::create_dir(dir.path().join("sled")).unwrap();
        assert_eq!(
            snapshot_files(dir.path()),
            SnapshotFiles {
                bytes: 110,
                complete: 1,
                partial: 1
            }
        );
    }

    #[test]
    fn thinning_keeps_the_ends_and_the_count() {
        let items: Vec<usize> = (0..100).collect();
        let kept: Vec<usize> = thin(&items, 5).into_iter().copied().collect();
        assert_eq!(kept, vec![0, 25, 50, 74, 99]);
        assert_eq!(thin(&items[..3], 5).len(), 3);
    }

    #[test]
    fn counts_print_short() {
        assert_eq!(short(999), "999");
        assert_eq!(short(12_345), "12k");
        assert_eq!(short(1_234_567), "1.23M");
    }
}
