//! The `cluster` command: the machine's limits, then for each concurrency
//! level a fresh 3-node cluster of each system driven by the closed loop,
//! then the tables, the ratios, the results JSON and the chart.

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
    /// Which members the clients talk to; every system is measured under
    /// each.
    pub placements: Vec<Placement>,
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

    /// Whether the system is measured under `placement`: the HTTP stub is
    /// one server, so only "the leader".
    pub fn takes(self, placement: Placement) -> bool {
        self != System::HttpStub || placement == Placement::Leader
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

/// Which members of a 3-member cluster the clients send their writes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Every client on the leader (found before the load starts).
    #[default]
    Leader,
    /// Client *i* on the (*i* mod 2)-th follower: every write forwarded.
    Followers,
    /// Client *i* on member *i* mod 3, leader or not, as clients that do
    /// not know the leader would balance.
    Spread,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Leader => "leader",
            Placement::Followers => "followers",
            Placement::Spread => "spread",
        }
    }

    /// The index (into `members`) of the member client `client` talks to,
    /// given the leader's index.
    pub fn member_for(self, client: usize, leader: usize, members: usize) -> usize {
        match self {
            Placement::Leader => leader,
            Placement::Followers => {
                let k = client % (members - 1);
                if k >= leader {
                    k + 1
                } else {
                    k
                }
            }
            Placement::Spread => client % members,
        }
    }

    /// Each of `clients` clients with the member it uses and whether that
    /// is the leader ("leader") or not ("followers"), for the split by
    /// target.
    fn labelled<T: Clone>(self, clients: usize, leader: usize, members: &[T]) -> Vec<(T, String)> {
        (0..clients)
            .map(|i| {
                let member = self.member_for(i, leader, members.len());
                let label = if member == leader { "leader" } else { "followers" };
                (members[member].clone(), label.to_string())
            })
            .collect()
    }
}

/// A system under one placement, as the tables name it: the system's name,
/// and the placement unless it is the leader.
pub fn label(system: System, placement: Placement) -> String {
    match placement {
        Placement::Leader => system.name().to_string(),
        other => format!("{} {}", system.name(), other.name()),
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
    /// Which members the clients used (files from before placements: the
    /// leader).
    #[serde(default)]
    pub placement: Placement,
    pub concurrency: usize,
    pub run: usize,
    /// Where the writes went: the leader, and the members the clients used.
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
    placement_ratios: Vec<PlacementRatio>,
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
    placements: Vec<&'static str>,
    concurrency: &'a [usize],
    runs: usize,
    warmup_secs: f64,
    duration_secs: f64,
    value_bytes: usize,
    client_threads: usize,
    cluster_per_point: &'static str,
    kraft_bin: String,
}

/// kraft over a peer at one concurrency level and placement (medians over
/// the runs).
#[derive(Serialize)]
struct Ratio {
    /// kraft (over HTTP) or kraft native.
    kraft: System,
    peer: System,
    placement: Placement,
    concurrency: usize,
    ops_per_sec: Option<f64>,
    p99: Option<f64>,
}

/// A system under a placement over the same system with every client on
/// the leader, at one concurrency level (medians over the runs).
#[derive(Serialize)]
struct PlacementRatio {
    system: System,
    placement: Placement,
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
            for &placement in &options.placements {
                for &system in systems.iter().filter(|s| s.takes(placement)) {
                    let point = measure_point(system, placement, concurrency, run, &installed, &options).await;
                    print_point(&point);
                    points.push(point);
                }
            }
        }
    }

    println!();
    println!("== summary (median over runs)");
    print_header();
    for &placement in &options.placements {
        for &system in systems.iter().filter(|s| s.takes(placement)) {
            for &concurrency in &options.concurrency {
                if let Some(point) = median(&points, system, placement, concurrency) {
                    print_row(
                        &label(system, placement),
                        concurrency,
                        point.result.as_ref().expect("median has a result"),
                        point.fdatasync_p50_ms_before,
                    );
                }
            }
        }
    }
    let leader = Placement::Leader;
    let over_floor =
        median(&points, System::Kraft, leader, 1).map(|p| result_of(p).latency_ms.p50 / limits.c1_floor_ms);
    for &kraft in systems.iter().filter(|s| s.is_kraft()) {
        let Some(point) = median(&points, kraft, leader, 1) else {
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
    let ratios = ratios(&points, &systems, &options.placements, &options.concurrency);
    print_ratios(&ratios);
    let placement_ratios = placement_ratios(&points, &systems, &options.placements, &options.concurrency);
    print_placement_ratios(&placement_ratios);

    let stem = format!("cluster-{started_unix}");
    let json_path = options.out.join(format!("{stem}.json"));
    let svg_path = options.out.join(format!("{stem}.svg"));
    let report = Report {
        kind: "cluster",
        started_unix,
        machine,
        settings: Settings {
            systems: systems.iter().map(|s| s.name()).collect(),
            placements: options.placements.iter().map(|p| p.name()).collect(),
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
        placement_ratios,
    };
    procs::write_json(&json_path, &report)?;
    let title = chart_title(options.value_bytes, report.machine.nproc);
    let series = chart_series(&points, &systems, &options.placements, &options.concurrency);
    match plot::latency_vs_throughput(&svg_path, &title, &series) {
        Ok(()) => println!("\nresults: {}\nchart:   {}", json_path.display(), svg_path.display()),
        Err(e) => println!("\nresults: {}\nchart not written: {e:#}", json_path.display()),
    }
    Ok(())
}

fn chart_title(value_bytes: usize, nproc: usize) -> String {
    format!("3-node clusters on 127.0.0.1, {value_bytes}-byte writes, closed loop ({nproc} cores)")
}

/// Per system and placement, the median run of each concurrency level.
fn chart_series(
    points: &[PointRecord],
    systems: &[System],
    placements: &[Placement],
    levels: &[usize],
) -> Vec<plot::Series> {
    placements
        .iter()
        .flat_map(|&placement| {
            systems
                .iter()
                .filter(move |s| s.takes(placement))
                .map(move |&system| (system, placement))
        })
        .map(|(system, placement)| plot::Series {
            system: label(system, placement),
            points: levels
                .iter()
                .filter_map(|&c| {
                    median_result(points, system, placement, c).map(|r| plot::Point {
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
    let (mut systems, mut placements): (Vec<System>, Vec<Placement>) = (Vec::new(), Vec::new());
    for point in &saved.points {
        if !systems.contains(&point.system) {
            systems.push(point.system);
        }
        if !placements.contains(&point.placement) {
            placements.push(point.placement);
        }
    }
    let svg_path = json_path.with_extension("svg");
    let series = chart_series(&saved.points, &systems, &placements, &saved.settings.concurrency);
    plot::latency_vs_throughput(
        &svg_path,
        &chart_title(saved.settings.value_bytes, saved.machine.nproc),
        &series,
    )?;
    Ok(svg_path)
}

/// Starts a fresh cluster of `system`, finds its leader, runs the closed
/// loop with `concurrency` clients placed on its members by `placement`,
/// stops the cluster.
pub async fn measure_point(
    system: System,
    placement: Placement,
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
                let id = cluster.wait_for_leader_id().await?;
                leader = Some(format!(
                    "http://{} (GET /v1/quorum: role leader, agreed by all 3){}",
                    cluster.http[id - 1],
                    placed(placement, concurrency, id - 1, &cluster.http)
                ));
                let clients = placement
                    .labelled(concurrency, id - 1, &cluster.http)
                    .into_iter()
                    .enumerate()
                    .map(|(i, (addr, label))| (AppendClient::new(addr, i, values), label))
                    .collect();
                Ok(load::run_labelled(clients, window, &cluster.pids()).await)
            }
            System::KraftNative => {
                let mut cluster = KraftCluster::start_native(&installed.kraft, root)?;
                let id = cluster.wait_for_leader_id().await?;
                leader = Some(format!(
                    "{} (the leader's client listener){}",
                    cluster.client[id - 1],
                    placed(placement, concurrency, id - 1, &cluster.client)
                ));
                let clients = placement
                    .labelled(concurrency, id - 1, &cluster.client)
                    .into_iter()
                    .enumerate()
                    .map(|(i, (addr, label))| (NativeAppendClient::new(addr, i, values), label))
                    .collect();
                Ok(load::run_labelled(clients, window, &cluster.pids()).await)
            }
            System::KraftProducer => {
                let mut cluster = KraftCluster::start_native(&installed.kraft, root)?;
                let id = cluster.wait_for_leader_id().await?;
                leader = Some(format!(
                    "{} (the leader's client listener, one connection per member used for every client on it){}",
                    cluster.client[id - 1],
                    placed(placement, concurrency, id - 1, &cluster.client)
                ));
                // One producer per member the placement uses.
                let mut producers = Vec::new();
                for (i, &addr) in cluster.client.iter().enumerate() {
                    let used = (0..concurrency).any(|c| placement.member_for(c, id - 1, cluster.client.len()) == i);
                    producers.push(if used {
                        Some(
                            kraft::client::Producer::connect(addr)
                                .await
                                .with_context(|| format!("cannot connect a producer to {addr}"))?,
                        )
                    } else {
                        None
                    });
                }
                let clients = (0..concurrency)
                    .map(|i| {
                        let member = placement.member_for(i, id - 1, producers.len());
                        let producer = producers[member].clone().expect("connected above");
                        let label = if member == id - 1 { "leader" } else { "followers" };
                        (ProducerAppendClient::new(producer, i, values), label.to_string())
                    })
                    .collect();
                Ok(load::run_labelled(clients, window, &cluster.pids()).await)
            }
            System::Etcd => {
                let bin = installed.etcd.as_ref().context("etcd not located")?;
                let mut cluster = EtcdCluster::start(bin, root)?;
                let endpoint = cluster.wait_for_leader().await?;
                let index = cluster
                    .endpoints
                    .iter()
                    .position(|e| *e == endpoint)
                    .context("etcd's leader is not one of its endpoints")?;
                leader = Some(format!(
                    "{endpoint} (maintenance Status: leader member id){}",
                    placed(placement, concurrency, index, &cluster.endpoints)
                ));
                let mut clients = Vec::with_capacity(concurrency);
                for (i, (endpoint, label)) in placement
                    .labelled(concurrency, index, &cluster.endpoints)
                    .into_iter()
                    .enumerate()
                {
                    clients.push((PutClient::connect(&endpoint, i, values).await?, label));
                }
                Ok(load::run_labelled(clients, window, &cluster.pids()).await)
            }
            System::ZooKeeper => {
                let installation = installed.zookeeper.as_ref().context("ZooKeeper not located")?;
                let mut ensemble = ZkEnsemble::start(installation, root)?;
                let addr = ensemble.wait_for_leader().await?;
                let index = ensemble
                    .clients
                    .iter()
                    .position(|a| *a == addr)
                    .context("ZooKeeper's leader is not one of its servers")?;
                leader = Some(format!(
                    "{addr} (srvr: Mode leader){}",
                    placed(placement, concurrency, index, &ensemble.clients)
                ));
                zookeeper::create_znodes(addr, concurrency, values).await?;
                let mut clients = Vec::with_capacity(concurrency);
                for (i, (addr, label)) in placement
                    .labelled(concurrency, index, &ensemble.clients)
                    .into_iter()
                    .enumerate()
                {
                    clients.push((SetDataClient::connect(addr, i, values).await?, label));
                }
                Ok(load::run_labelled(clients, window, &ensemble.pids()).await)
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
        placement,
        concurrency,
        run,
        leader,
        fdatasync_p50_ms_before,
        result,
        error,
    }
}

/// For a placement other than the leader, which members the clients used.
fn placed<T: std::fmt::Display>(placement: Placement, clients: usize, leader: usize, members: &[T]) -> String {
    if placement == Placement::Leader {
        return String::new();
    }
    let used: Vec<String> = (0..members.len())
        .filter(|&m| (0..clients).any(|c| placement.member_for(c, leader, members.len()) == m))
        .map(|m| members[m].to_string())
        .collect();
    format!("; clients ({}) on {}", placement.name(), used.join(", "))
}

pub fn print_header() {
    println!(
        "{:<24} {:>4} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>11} {:>11} {:>10}",
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

fn print_row(label: &str, concurrency: usize, r: &LoadResult, fsync_ms: Option<f64>) {
    println!(
        "{:<24} {:>4} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>9.1} {:>7} {:>11} {:>11} {:>10}",
        label,
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
            let label = label(point.system, point.placement);
            print_row(&label, point.concurrency, r, point.fdatasync_p50_ms_before);
            for (message, count) in &r.error_samples {
                println!("{:>17} error x{count}: {message}", "");
            }
            for t in &r.by_target {
                println!(
                    "{:>17} clients on the {}: {} of them, {:.0} ops/s, p50 {:.3} ms, p99 {:.3} ms",
                    "", t.target, t.clients, t.ops_per_sec, t.latency_ms.p50, t.latency_ms.p99
                );
            }
        }
        (None, Some(e)) => println!(
            "{:<24} {:>4}  FAILED: {e}",
            label(point.system, point.placement),
            point.concurrency
        ),
        (None, None) => {}
    }
}

/// The run with the median ops/s among the successful runs of one point.
fn median(points: &[PointRecord], system: System, placement: Placement, concurrency: usize) -> Option<&PointRecord> {
    let mut runs: Vec<&PointRecord> = points
        .iter()
        .filter(|p| {
            p.system == system && p.placement == placement && p.concurrency == concurrency && p.result.is_some()
        })
        .collect();
    runs.sort_by(|a, b| result_of(a).ops_per_sec.total_cmp(&result_of(b).ops_per_sec));
    runs.get(runs.len().saturating_sub(1) / 2).copied()
}

fn median_result(
    points: &[PointRecord],
    system: System,
    placement: Placement,
    concurrency: usize,
) -> Option<&LoadResult> {
    median(points, system, placement, concurrency).map(result_of)
}

/// `a` over `b` in `f`, when both were measured and `b`'s is above 0.
fn ratio_of(a: Option<&LoadResult>, b: Option<&LoadResult>, f: fn(&LoadResult) -> f64) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if f(b) > 0.0 => Some(f(a) / f(b)),
        _ => None,
    }
}

fn result_of(point: &PointRecord) -> &LoadResult {
    point.result.as_ref().expect("filtered on results")
}

/// Under each placement: kraft against every peer, kraft native against
/// every other system (kraft over HTTP included), and kraft producer
/// against every other system (both other krafts included).
fn ratios(points: &[PointRecord], systems: &[System], placements: &[Placement], levels: &[usize]) -> Vec<Ratio> {
    let mut ratios = Vec::new();
    let pairs = systems.iter().filter(|s| s.is_kraft()).flat_map(|&kraft| {
        systems
            .iter()
            .filter(move |&&peer| peer != kraft && !(peer.is_kraft() && kraft_rank(peer) > kraft_rank(kraft)))
            .map(move |&peer| (kraft, peer))
    });
    for (kraft_system, peer) in pairs {
        for &placement in placements.iter().filter(|&&p| peer.takes(p)) {
            for &c in levels {
                let kraft = median_result(points, kraft_system, placement, c);
                let other = median_result(points, peer, placement, c);
                ratios.push(Ratio {
                    kraft: kraft_system,
                    peer,
                    placement,
                    concurrency: c,
                    ops_per_sec: ratio_of(kraft, other, |r| r.ops_per_sec),
                    p99: ratio_of(kraft, other, |r| r.latency_ms.p99),
                });
            }
        }
    }
    ratios
}

/// Every system under every placement but the leader, over itself with
/// all clients on the leader.
fn placement_ratios(
    points: &[PointRecord],
    systems: &[System],
    placements: &[Placement],
    levels: &[usize],
) -> Vec<PlacementRatio> {
    let mut ratios = Vec::new();
    for &system in systems {
        for &placement in placements
            .iter()
            .filter(|&&p| p != Placement::Leader && system.takes(p))
        {
            for &c in levels {
                let placed = median_result(points, system, placement, c);
                let leader = median_result(points, system, Placement::Leader, c);
                if leader.is_none() {
                    continue;
                }
                ratios.push(PlacementRatio {
                    system,
                    placement,
                    concurrency: c,
                    ops_per_sec: ratio_of(placed, leader, |r| r.ops_per_sec),
                    p99: ratio_of(placed, leader, |r| r.latency_ms.p99),
                });
            }
        }
    }
    ratios
}

fn print_placement_ratios(ratios: &[PlacementRatio]) {
    if ratios.is_empty() {
        return;
    }
    println!("\n== placement / leader-only, same system (ops/s: 1 = as fast as with every client on the leader; p99: 1 = as low)");
    println!("{:<34} {:>5} {:>12} {:>12}", "", "C", "ops/s ratio", "p99 ratio");
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for r in ratios {
        println!(
            "{:<34} {:>5} {:>12} {:>12}",
            format!("{}/{}", label(r.system, r.placement), r.system.name()),
            r.concurrency,
            show(r.ops_per_sec),
            show(r.p99)
        );
    }
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
    println!("{:<44} {:>5} {:>12} {:>12}", "", "C", "ops/s ratio", "p99 ratio");
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for r in ratios {
        println!(
            "{:<44} {:>5} {:>12} {:>12}",
            format!("{}/{}", label(r.kraft, r.placement), label(r.peer, r.placement)),
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
            placement: Placement::Leader,
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
                by_target: Vec::new(),
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
        let found: Vec<_> = ratios(&points, &systems, &[Placement::Leader], &[8])
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

    #[test]
    fn placements_put_each_client_on_the_members_they_name() {
        let members = ["n1", "n2", "n3"];
        let on = |placement: Placement, leader: usize| -> Vec<&str> {
            placement.labelled(6, leader, &members).into_iter().map(|(m, _)| m).collect()
        };
        assert_eq!(on(Placement::Leader, 1), ["n2"; 6]);
        assert_eq!(on(Placement::Followers, 1), ["n1", "n3", "n1", "n3", "n1", "n3"]);
        assert_eq!(on(Placement::Followers, 0), ["n2", "n3", "n2", "n3", "n2", "n3"]);
        assert_eq!(on(Placement::Followers, 2), ["n1", "n2", "n1", "n2", "n1", "n2"]);
        assert_eq!(on(Placement::Spread, 2), ["n1", "n2", "n3", "n1", "n2", "n3"]);
        let labels: Vec<String> = Placement::Spread
            .labelled(3, 2, &members)
            .into_iter()
            .map(|(_, label)| label)
            .collect();
        assert_eq!(labels, ["followers", "followers", "leader"]);
    }

    #[test]
    fn each_placement_is_compared_with_the_same_system_on_the_leader() {
        let mut points = vec![point(System::Kraft, 100.0), point(System::Etcd, 50.0)];
        for (system, ops) in [(System::Kraft, 90.0), (System::Etcd, 30.0)] {
            let mut spread = point(system, ops);
            spread.placement = Placement::Spread;
            points.push(spread);
        }
        let systems = [System::Kraft, System::Etcd];
        let placements = [Placement::Leader, Placement::Spread];
        let found: Vec<_> = placement_ratios(&points, &systems, &placements, &[8])
            .iter()
            .map(|r| (r.system.name(), r.placement.name(), r.ops_per_sec.unwrap()))
            .collect();
        assert_eq!(found, [("kraft", "spread", 0.9), ("etcd", "spread", 0.6)]);
        let spread: Vec<_> = ratios(&points, &systems, &placements, &[8])
            .iter()
            .filter(|r| r.placement == Placement::Spread)
            .map(|r| r.ops_per_sec.unwrap())
            .collect();
        assert_eq!(spread, [3.0]);
    }
}
