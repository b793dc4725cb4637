//! The `cluster` command: the machine's limits, then for each concurrency
//! level a fresh 3-node cluster of each system driven by the closed loop,
//! then the tables, the ratios, the results JSON and the chart.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::disk::{self, MachineLimits};
use crate::etcd::{self, EtcdCluster, PutClient};
use crate::http_stub::StubServer;
use crate::kraft_cluster::{self, AppendClient, KraftCluster, NativeAppendClient, ProducerAppendClient};
use crate::load::{self, LoadResult, Window};
use crate::plot;
use crate::procs;
use crate::zookeeper::{self, SetDataClient, ZkEnsemble};

/// The fdatasync probe before each point runs this long at most.
const POINT_PROBE: Duration = Duration::from_millis(500);

pub struct ClusterOptions {
    pub peers: bool,
    /// Also drive kraft through its client protocol (`listeners.client`).
    pub native: bool,
    /// Also drive kraft through one pipelined connection for all clients.
    pub producer: bool,
    pub http_ceiling: bool,
    pub window: Window,
    pub concurrency: Vec<usize>,
    pub runs: usize,
    pub kraft_bin: Option<PathBuf>,
    pub repo_root: PathBuf,
    pub out: PathBuf,
    pub data_root: PathBuf,
    pub value_bytes: usize,
    pub probe: Duration,
    pub client_threads: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum System {
    #[serde(rename = "kraft")]
    Kraft,
    /// kraft through its client protocol instead of HTTP.
    #[serde(rename = "kraft native")]
    KraftNative,
    /// kraft through its client protocol, every client sharing one
    /// pipelined connection (`kraft::client::Producer`).
    #[serde(rename = "kraft producer")]
    KraftProducer,
    #[serde(rename = "etcd")]
    Etcd,
    #[serde(rename = "ZooKeeper")]
    ZooKeeper,
    /// Not a quorum: the HTTP ceiling (see http_stub).
    #[serde(rename = "HTTP stub")]
    HttpStub,
}

impl System {
    pub fn is_kraft(self) -> bool {
        matches!(self, System::Kraft | System::KraftNative | System::KraftProducer)
    }

    pub fn name(self) -> &'static str {
        match self {
            System::Kraft => "kraft",
            System::KraftNative => "kraft native",
            System::KraftProducer => "kraft producer",
            System::Etcd => "etcd",
            System::ZooKeeper => "ZooKeeper",
            System::HttpStub => "HTTP stub",
        }
    }
}

/// What the systems are started from.
pub struct Installed {
    pub kraft: PathBuf,
    pub etcd: Option<PathBuf>,
    pub zookeeper: Option<zookeeper::Installation>,
}

/// One measured point.
#[derive(Serialize, Deserialize)]
pub struct PointRecord {
    pub system: System,
    pub concurrency: usize,
    pub run: usize,
    /// Where the writes went.
    pub leader: Option<String>,
    /// fdatasync p50 of one-at-a-time 100-byte writes to a preallocated
    /// file with the CPUs busy, probed just before the cluster started (this
    /// disk's latency changes over time).
    pub fdatasync_p50_ms_before: Option<f64>,
    pub result: Option<LoadResult>,
    pub error: Option<String>,
}

#[derive(Serialize)]
struct Report<'a> {
    kind: &'static str,
    started_unix: u64,
    machine: Machine,
    settings: Settings<'a>,
    limits: &'a MachineLimits,
    kraft_c1_p50_over_floor: Option<f64>,
    points: &'a [PointRecord],
    ratios: Vec<Ratio>,
}

#[derive(Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub kernel: String,
    pub data_filesystem: String,
}

impl Machine {
    pub fn here(data_root: &Path) -> Machine {
        Machine {
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            data_filesystem: crate::procs::filesystem_of(data_root),
        }
    }
}

#[derive(Serialize)]
struct Settings<'a> {
    systems: Vec<&'static str>,
    concurrency: &'a [usize],
    runs: usize,
    warmup_secs: f64,
    duration_secs: f64,
    value_bytes: usize,
    client_threads: usize,
    cluster_per_point: &'static str,
    kraft_bin: String,
}

/// kraft over a peer at one concurrency level (medians over the runs).
#[derive(Serialize)]
struct Ratio {
    /// kraft (over HTTP) or kraft native.
    kraft: System,
    peer: System,
    concurrency: usize,
    ops_per_sec: Option<f64>,
    p99: Option<f64>,
}

pub async fn run(options: ClusterOptions) -> Result<()> {
    let machine = Machine::here(&options.data_root);
    println!(
        "kraft-bench cluster: {} cores, kernel {}, data on {}",
        machine.nproc, machine.kernel, machine.data_filesystem
    );
    let installed = Installed {
        kraft: kraft_cluster::locate_or_build(options.kraft_bin.as_deref(), &options.repo_root)?,
        etcd: options.peers.then(etcd::locate).transpose()?,
        zookeeper: options.peers.then(zookeeper::locate).transpose()?,
    };
    let mut systems = vec![System::Kraft];
    if options.native {
        systems.push(System::KraftNative);
    }
    if options.producer {
        systems.push(System::KraftProducer);
    }
    if options.peers {
        systems.extend([System::Etcd, System::ZooKeeper]);
    }
    if options.http_ceiling {
        systems.push(System::HttpStub);
    }
    std::fs::create_dir_all(&options.out)
        .with_context(|| format!("cannot create the results directory {}", options.out.display()))?;
    let started_unix = procs::since_epoch().as_secs();

    let data_root = options.data_root.clone();
    let probe = options.probe;
    let value_bytes = options.value_bytes;
    let limits = tokio::task::spawn_blocking(move || disk::measure(&data_root, value_bytes, probe))
        .await
        .context("the disk probe task failed")??;
    limits.print(&options.data_root);
    println!();
    println!(
        "== closed loop: {} (a fresh 3-node cluster per system and concurrency level), {}-byte values, warm-up {:?}, measured {:?}, {} run(s), {} client thread(s)",
        systems.iter().map(|s| s.name()).collect::<Vec<_>>().join(", "),
        options.value_bytes,
        options.window.warmup,
        options.window.measure,
        options.runs,
        options.client_threads,
    );
    print_header();

    let mut points = Vec::new();
    for run in 1..=options.runs {
        for &concurrency in &options.concurrency {
            for &system in &systems {
                let point = measure_point(system, concurrency, run, &installed, &options).await;
                print_point(&point);
                points.push(point);
            }
        }
    }

    println!();
    println!("== summary (median over runs)");
    print_header();
    for &system in &systems {
        for &concurrency in &options.concurrency {
            if let Some(point) = median(&points, system, concurrency) {
                print_row(
                    system,
                    concurrency,
                    point.result.as_ref().expect("median has a result"),
                    point.fdatasync_p50_ms_before,
                );
            }
        }
    }
    let over_floor = median(&points, System::Kraft, 1).map(|p| result_of(p).latency_ms.p50 / limits.c1_floor_ms);
    for &kraft in systems.iter().filter(|s| s.is_kraft()) {
        let Some(point) = median(&points, kraft, 1) else {
            continue;
        };
        let name = kraft.name();
        let p50 = result_of(point).latency_ms.p50;
        println!(
            "\n{name} C=1 p50 {p50:.3} ms = {:.2} x the physical floor ({:.3} ms, from the probe at the start)",
            p50 / limits.c1_floor_ms,
            limits.c1_floor_ms
        );
        println!(
            "{name} C=1 p50 {p50:.3} ms = {:.2} x the floor with sled's flush ({:.3} ms, same probe)",
            p50 / limits.c1_sled_floor_ms,
            limits.c1_sled_floor_ms
        );
        if let Some(fsync) = point.fdatasync_p50_ms_before {
            let floor = 2.0 * fsync + 2.0 * limits.rtt_p50_ms;
            println!(
                "{name} C=1 p50 {p50:.3} ms = {:.2} x the floor from the fdatasync probe just before that point (2 x {fsync:.3} + 2 x {:.3} = {floor:.3} ms)",
                p50 / floor,
                limits.rtt_p50_ms
            );
        }
    }
    let ratios = ratios(&points, &systems, &options.concurrency);
    print_ratios(&ratios);

    let stem = format!("cluster-{started_unix}");
    let json_path = options.out.join(format!("{stem}.json"));
    let svg_path = options.out.join(format!("{stem}.svg"));
    let report = Report {
        kind: "cluster",
        started_unix,
        machine,
        settings: Settings {
            systems: systems.iter().map(|s| s.name()).collect(),
            concurrency: &options.concurrency,
            runs: options.runs,
            warmup_secs: options.window.warmup.as_secs_f64(),
            duration_secs: options.window.measure.as_secs_f64(),
            value_bytes: options.value_bytes,
            client_threads: options.client_threads,
            cluster_per_point: "a fresh cluster per system, concurrency level and run",
            kraft_bin: installed.kraft.display().to_string(),
        },
        limits: &limits,
        kraft_c1_p50_over_floor: over_floor,
        points: &points,
        ratios,
    };
    procs::write_json(&json_path, &report)?;
    let title = chart_title(options.value_bytes, report.machine.nproc);
    let series = chart_series(&points, &systems, &options.concurrency);
    match plot::latency_vs_throughput(&svg_path, &title, &series) {
        Ok(()) => println!("\nresults: {}\nchart:   {}", json_path.display(), svg_path.display()),
        Err(e) => println!("\nresults: {}\nchart not written: {e:#}", json_path.display()),
    }
    Ok(())
}

fn chart_title(value_bytes: usize, nproc: usize) -> String {
    format!("3-node clusters on 127.0.0.1, {value_bytes}-byte writes, closed loop ({nproc} cores)")
}

/// Per system, the median run of each concurrency level.
fn chart_series(points: &[PointRecord], systems: &[System], levels: &[usize]) -> Vec<plot::Series> {
    systems
        .iter()
        .map(|&system| plot::Series {
            system: system.name().to_string(),
            points: levels
                .iter()
                .filter_map(|&c| {
                    median_result(points, system, c).map(|r| plot::Point {
                        concurrency: c,
                        ops_per_sec: r.ops_per_sec,
                        p50_ms: r.latency_ms.p50,
                        p99_ms: r.latency_ms.p99,
                    })
                })
                .collect(),
        })
        .collect()
}

/// The `plot` command: the chart of a results JSON written by `cluster`,
/// next to it (same name, `.svg`).
pub fn replot(json_path: &Path) -> Result<PathBuf> {
    #[derive(Deserialize)]
    struct Saved {
        machine: SavedMachine,
        settings: SavedSettings,
        points: Vec<PointRecord>,
    }
    #[derive(Deserialize)]
    struct SavedMachine {
        nproc: usize,
    }
    #[derive(Deserialize)]
    struct SavedSettings {
        concurrency: Vec<usize>,
        value_bytes: usize,
    }
    let text = std::fs::read_to_string(json_path).with_context(|| format!("cannot read {}", json_path.display()))?;
    let saved: Saved = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a cluster results file", json_path.display()))?;
    let mut systems: Vec<System> = Vec::new();
    for point in &saved.points {
        if !systems.contains(&point.system) {
            systems.push(point.system);
        }
    }
    let svg_path = json_path.with_extension("svg");
    let series = chart_series(&saved.points, &systems, &saved.settings.concurrency);
    plot::latency_vs_throughput(
        &svg_path,
        &chart_title(saved.settings.value_bytes, saved.machine.nproc),
        &series,
    )?;
    Ok(svg_path)
}

/// Starts a fresh cluster of `system`, finds its leader, runs the closed
/// loop with `concurrency` clients, stops the cluster.
pub async fn measure_point(
    system: System,
    concurrency: usize,
    run: usize,
    installed: &Installed,
    options: &ClusterOptions,
) -> PointRecord {
    let mut leader = None;
    let root = options.data_root.clone();
    let probe = options.probe.min(POINT_PROBE);
    let fdatasync_p50_ms_before = tokio::task::spawn_blocking(move || {
        disk::synced_appends(&root, 100, 1, disk::FileMode::Preallocated, disk::Cpus::Busy, probe)
    })
    .await
    .ok()
    .and_then(|r| r.ok())
    .map(|r| r.sync_latency_ms.p50);
    let outcome = async {
        let window = options.window;
        let values = options.value_bytes;
        let root = &options.data_root;
        match system {
            System::Kraft => {
                let mut cluster = KraftCluster::start(&installed.kraft, root)?;
                let addr: SocketAddr = cluster.wait_for_leader().await?;
                leader = Some(format!("http://{addr} (GET /v1/quorum: role leader, agreed by all 3)"));
                let clients = (0..concurrency).map(|i| AppendClient::new(addr, i, values)).collect();
                Ok(load::run(clients, window, &cluster.pids()).await)
            }
            System::KraftNative => {
                let mut cluster = KraftCluster::start_native(&installed.kraft, root)?;
                let addr: SocketAddr = cluster.wait_for_native_leader().await?;
                leader = Some(format!("{addr} (the leader's client listener)"));
                let clients = (0..concurrency)
                    .map(|i| NativeAppendClient::new(addr, i, values))
                    .collect();
                Ok(load::run(clients, window, &cluster.pids()).await)
            }
            System::KraftProducer => {
                let mut cluster = KraftCluster::start_native(&installed.kraft, root)?;
                let addr: SocketAddr = cluster.wait_for_native_leader().await?;
                leader = Some(format!(
                    "{addr} (the leader's client listener, one connection for every client)"
                ));
                let producer = kraft::client::Producer::connect(addr)
                    .await
                    .with_context(|| format!("cannot connect a producer to {addr}"))?;
                let clients = (0..concurrency)
                    .map(|i| ProducerAppendClient::new(producer.clone(), i, values))
                    .collect();
                Ok(load::run(clients, window, &cluster.pids()).await)
            }
            System::Etcd => {
                let bin = installed.etcd.as_ref().context("etcd not located")?;
                let mut cluster = EtcdCluster::start(bin, root)?;
                let endpoint = cluster.wait_for_leader().await?;
                leader = Some(format!("{endpoint} (maintenance Status: leader member id)"));
                let mut clients = Vec::with_capacity(concurrency);
                for i in 0..concurrency {
                    clients.push(PutClient::connect(&endpoint, i, values).await?);
                }
                Ok(load::run(clients, window, &cluster.pids()).await)
            }
            System::ZooKeeper => {
                let installation = installed.zookeeper.as_ref().context("ZooKeeper not located")?;
                let mut ensemble = ZkEnsemble::start(installation, root)?;
                let addr = ensemble.wait_for_leader().await?;
                leader = Some(format!("{addr} (srvr: Mode leader)"));
                zookeeper::create_znodes(addr, concurrency, values).await?;
                let mut clients = Vec::with_capacity(concurrency);
                for i in 0..concurrency {
                    clients.push(SetDataClient::connect(addr, i, values).await?);
                }
                Ok(load::run(clients, window, &ensemble.pids()).await)
            }
            System::HttpStub => {
                let mut stub = StubServer::start(root)?;
                let addr = stub.wait_ready().await?;
                leader = Some(format!("http://{addr} (a stub that answers at once, one worker)"));
                let clients = (0..concurrency).map(|i| AppendClient::new(addr, i, values)).collect();
                Ok(load::run(clients, window, &stub.pids()).await)
            }
        }
    }
    .await;
    let (result, error) = match outcome {
        Ok(result) => (Some(result), None),
        Err(e) => {
            let e: anyhow::Error = e;
            (None, Some(format!("{e:#}")))
        }
    };
    PointRecord {
        system,
        concurrency,
        run,
        leader,
        fdatasync_p50_ms_before,
        result,
        error,
    }
}

pub fn print_header() {
    println!(
        "{:<14} {:>4} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>11} {:>11} {:>10}",
        "system",
        "C",
        "ops/s",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "max ms",
        "errors",
        "server CPU",
        "client CPU",
        "fsync p50"
    );
}

fn print_row(system: System, concurrency: usize, r: &LoadResult, fsync_ms: Option<f64>) {
    println!(
        "{:<14} {:>4} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>9.1} {:>7} {:>11} {:>11} {:>10}",
        system.name(),
        concurrency,
        r.ops_per_sec,
        r.latency_ms.p50,
        r.latency_ms.p99,
        r.latency_ms.p999,
        r.latency_ms.max,
        r.errors,
        format!("{:.2} cores", r.server_cpu_cores),
        format!("{:.2} cores", r.client_cpu_cores),
        fsync_ms.map_or("-".to_string(), |ms| format!("{ms:.3} ms")),
    );
}

pub fn print_point(point: &PointRecord) {
    match (&point.result, &point.error) {
        (Some(r), _) => {
            print_row(point.system, point.concurrency, r, point.fdatasync_p50_ms_before);
            for (message, count) in &r.error_samples {
                println!("{:>17} error x{count}: {message}", "");
            }
        }
        (None, Some(e)) => println!("{:<14} {:>4}  FAILED: {e}", point.system.name(), point.concurrency),
        (None, None) => {}
    }
}

/// The run with the median ops/s among the successful runs of one point.
fn median(points: &[PointRecord], system: System, concurrency: usize) -> Option<&PointRecord> {
    let mut runs: Vec<&PointRecord> = points
        .iter()
        .filter(|p| p.system == system && p.concurrency == concurrency && p.result.is_some())
        .collect();
    runs.sort_by(|a, b| result_of(a).ops_per_sec.total_cmp(&result_of(b).ops_per_sec));
    runs.get(runs.len().saturating_sub(1) / 2).copied()
}

fn median_result(points: &[PointRecord], system: System, concurrency: usize) -> Option<&LoadResult> {
    median(points, system, concurrency).map(result_of)
}

fn result_of(point: &PointRecord) -> &LoadResult {
    point.result.as_ref().expect("filtered on results")
}

/// kraft against every peer, kraft native against every other system
/// (kraft over HTTP included), and kraft producer against every other
/// system (both other krafts included).
fn ratios(points: &[PointRecord], systems: &[System], levels: &[usize]) -> Vec<Ratio> {
    let mut ratios = Vec::new();
    let pairs = systems.iter().filter(|s| s.is_kraft()).flat_map(|&kraft| {
        systems
            .iter()
            .filter(move |&&peer| peer != kraft && !(peer.is_kraft() && kraft_rank(peer) > kraft_rank(kraft)))
            .map(move |&peer| (kraft, peer))
    });
    for (kraft_system, peer) in pairs {
        for &c in levels {
            let kraft = median_result(points, kraft_system, c);
            let other = median_result(points, peer, c);
            let ratio = |f: fn(&LoadResult) -> f64| match (kraft, other) {
                (Some(k), Some(o)) if f(o) > 0.0 => Some(f(k) / f(o)),
                _ => None,
            };
            ratios.push(Ratio {
                kraft: kraft_system,
                peer,
                concurrency: c,
                ops_per_sec: ratio(|r| r.ops_per_sec),
                p99: ratio(|r| r.latency_ms.p99),
            });
        }
    }
    ratios
}

/// The order in which the krafts are compared with one another: each with
/// those before it.
fn kraft_rank(system: System) -> usize {
    match system {
        System::Kraft => 0,
        System::KraftNative => 1,
        System::KraftProducer => 2,
        _ => usize::MAX,
    }
}

fn print_ratios(ratios: &[Ratio]) {
    if ratios.is_empty() {
        return;
    }
    println!("\n== kraft / peer, point by point (ops/s: above 1 = kraft faster; p99: below 1 = kraft lower)");
    println!("{:<28} {:>5} {:>12} {:>12}", "", "C", "ops/s ratio", "p99 ratio");
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for r in ratios {
        println!(
            "{:<28} {:>5} {:>12} {:>12}",
            format!("{}/{}", r.kraft.name(), r.peer.name()),
            r.concurrency,
            show(r.ops_per_sec),
            show(r.p99)
        );
    }
    if ratios.iter().any(|r| r.kraft == System::KraftProducer) {
        println!("(kraft producer: all C clients share one pipelined connection, not one connection each as the comparison with the peers asks)");
    }
    if ratios.iter().any(|r| r.peer == System::HttpStub) {
        println!("(kraft/HTTP stub: the share of the HTTP ceiling kraft reaches; the stub answers at once, no quorum, no disk)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(system: System, ops_per_sec: f64) -> PointRecord {
        PointRecord {
            system,
            concurrency: 8,
            run: 1,
            leader: None,
            fdatasync_p50_ms_before: None,
            result: Some(LoadResult {
                concurrency: 8,
                window_secs: 1.0,
                ops: ops_per_sec as u64,
                records: ops_per_sec as u64,
                errors: 0,
                ops_per_sec,
                records_per_sec: ops_per_sec,
                latency_ms: load::Latency::default(),
                server_cpu_cores: 0.0,
                client_cpu_cores: 0.0,
                error_samples: Default::default(),
            }),
            error: None,
        }
    }

    #[test]
    fn each_kraft_is_compared_with_the_peers_and_with_the_krafts_before_it() {
        let systems = [System::Kraft, System::KraftNative, System::KraftProducer, System::Etcd];
        let points: Vec<_> = systems
            .iter()
            .zip([100.0, 200.0, 400.0, 50.0])
            .map(|(&system, ops)| point(system, ops))
            .collect();
        let found: Vec<_> = ratios(&points, &systems, &[8])
            .iter()
            .map(|r| (r.kraft.name(), r.peer.name(), r.ops_per_sec.unwrap()))
            .collect();
        assert_eq!(
            found,
            [
                ("kraft", "etcd", 2.0),
                ("kraft native", "kraft", 2.0),
                ("kraft native", "etcd", 4.0),
                ("kraft producer", "kraft", 4.0),
                ("kraft producer", "kraft native", 2.0),
                ("kraft producer", "etcd", 8.0),
            ]
        );
    }
}
