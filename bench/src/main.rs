//! kraft-bench: the benchmark harness for kraft (see bench/README.md).
//!
//! - `cluster`: a closed-loop load of C clients against a 3-node kraft
//!   cluster of real processes on 127.0.0.1 (and with `--peers` the same
//!   against etcd and ZooKeeper), with the machine's own limits measured in
//!   the same run; prints the tables and writes a results JSON and an SVG
//!   chart.
//! - `embedded`: a 3-node kraft cluster inside this process, appends
//!   through `NodeHandle::append` with many in flight.
//! - `state`: what a large log costs on a 3-node cluster of real processes:
//!   memory and disk with N records, snapshot, compaction, a fresh observer
//!   joining, a crashed follower restarting.
//! - `soak`: whether disk use stays bounded under a steady write load with
//!   snapshots and retention on (3 real processes, sampled every few
//!   seconds).
//! - `ab`: two kraft builds in alternated pairs, kraft only, with each
//!   pair's candidate/baseline ratios and their medians.
//! - `limits`: only the machine's limits (fdatasync, loopback round trip).
//! - `plot`: redraws the chart of a `cluster` results JSON.
//! - `http-stub` (hidden): the HTTP ceiling's server, started by `cluster
//!   --http-ceiling`.

mod ab;
mod disk;
mod embedded;
mod etcd;
mod harness;
mod http;
mod http_stub;
mod kraft_cluster;
mod load;
mod metadata;
mod plot;
mod procs;
mod soak;
mod state;
mod zookeeper;

use std::future::Future;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kraft-bench",
    about = "Benchmarks for kraft: clusters on 127.0.0.1, the embedded API, the machine's limits"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Closed-loop load on a 3-node kraft cluster of real processes (and on etcd and ZooKeeper with --peers).
    Cluster(ClusterArgs),
    /// Two kraft builds in alternated pairs (A B, B A, ...), kraft only: each pair's candidate/baseline ratios and their medians.
    Ab(AbArgs),
    /// A 3-node kraft cluster in this process, appends through NodeHandle::append with many in flight.
    Embedded(EmbeddedArgs),
    /// What a large log costs: memory, disk, snapshot, compaction, a fresh observer joining, a restart (3 real processes).
    State(StateArgs),
    /// Disk use under a steady write load with small snapshot and retention limits, sampled over minutes (3 real processes).
    Soak(SoakArgs),
    /// The metadata layer: image replay, memory and snapshot size in this process; topic creations, a broker's fencing and a controller's failover on 3 real processes.
    Metadata(MetadataArgs),
    /// Only the machine's limits: fdatasync'd appends and the loopback TCP round trip.
    Limits(CommonArgs),
    /// Redraws the chart of a results JSON written by `cluster` (next to it, .svg).
    Plot {
        /// A cluster-<time>.json file.
        results: PathBuf,
    },
    /// The HTTP ceiling's stub server (started by `cluster --http-ceiling`): answers POST /v1/append at once.
    #[command(hide = true)]
    HttpStub {
        #[arg(long)]
        listen: std::net::SocketAddr,
    },
}

#[derive(Args)]
struct CommonArgs {
    /// Where the data directories (and the disk probe's file) go; fresh temp directories are made inside.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    data_root: PathBuf,
    /// Results directory (JSON, SVG).
    #[arg(long, default_value_os_t = default_out())]
    out: PathBuf,
    /// Seconds each disk and loopback probe runs.
    #[arg(long, default_value_t = 2.0)]
    probe_secs: f64,
    /// Leave the clusters' data directories and server logs in place (their paths are printed).
    #[arg(long)]
    keep_data: bool,
}

#[derive(Args)]
struct ClusterArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Also benchmark a 3-member etcd cluster and a 3-server ZooKeeper ensemble (scripts/install-bench-peers.sh).
    #[arg(long)]
    peers: bool,
    /// Which members the clients write to, each measured for every system: leader (all on the leader), followers (client i on follower i mod 2: every write forwarded), spread (client i on member i mod 3).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "leader")]
    placement: Vec<harness::Placement>,
    /// Also drive a stub actix-web server (one worker) that answers POST /v1/append at once: the most kraft's HTTP API could give here.
    #[arg(long)]
    http_ceiling: bool,
    /// Also drive kraft through its client protocol (listeners.client, kraft::client) instead of HTTP, as the system "kraft native".
    #[arg(long)]
    native: bool,
    /// Also drive kraft with every client sharing one pipelined connection (kraft::client::Producer), as the system "kraft producer".
    #[arg(long)]
    producer: bool,
    /// Measured seconds per point.
    #[arg(long, default_value_t = 15.0)]
    duration_secs: f64,
    /// Warm-up seconds per point (not measured).
    #[arg(long, default_value_t = 3.0)]
    warmup_secs: f64,
    /// Concurrency levels: closed-loop clients, each with its own connection.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    concurrency: Vec<usize>,
    /// Repetitions of every point (the summary and chart use the median run).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// A kraft release binary; by default `cargo build --release --locked --bin kraft` runs in the repository.
    #[arg(long)]
    kraft_bin: Option<PathBuf>,
    /// Bytes of each written value.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Threads of the load generator's runtime.
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
}

/// Where `state` and `soak` keep their cluster and results, and which
/// kraft they run.
#[derive(Args)]
struct ProcessClusterArgs {
    /// Where the cluster's data directories go; a fresh temp directory is made inside.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    data_root: PathBuf,
    /// Results directory (JSON).
    #[arg(long, default_value_os_t = default_out())]
    out: PathBuf,
    /// Leave the data directories and server logs in place (their path is printed).
    #[arg(long)]
    keep_data: bool,
    /// A kraft release binary; by default `cargo build --release --locked --bin kraft` runs in the repository.
    #[arg(long)]
    kraft_bin: Option<PathBuf>,
}

#[derive(Args)]
struct StateArgs {
    #[command(flatten)]
    cluster: ProcessClusterArgs,
    /// Records loaded into the log before anything is measured.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Records per POST /v1/append.
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Concurrent connections loading the records (each sends its next batch once the previous one committed).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Skip the observer that joins through the log alone, before any snapshot exists.
    #[arg(long)]
    no_log_join: bool,
    /// The nodes' log.cleaner_interval_ms: how soon after a snapshot the log below it is deleted.
    #[arg(long, default_value_t = 200)]
    cleaner_interval_ms: u64,
    /// Longest wait, in seconds, for any one step (replication, a snapshot, compaction, a join, a restart).
    #[arg(long, default_value_t = 600.0)]
    wait_secs: f64,
}

#[derive(Args)]
struct MetadataArgs {
    #[command(flatten)]
    cluster: ProcessClusterArgs,
    /// Topics in the image built in this process.
    #[arg(long, default_value_t = 100_000)]
    topics: u64,
    /// Partitions of each of those topics.
    #[arg(long, default_value_t = 10)]
    partitions_per_topic: u64,
    /// Closed-loop clients creating topics.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    #[arg(long, default_value_t = 2)]
    warmup_secs: u64,
    /// The brokers' broker.session_timeout_ms (the heartbeat interval is a quarter of it).
    #[arg(long, default_value_t = 3000)]
    session_timeout_ms: u64,
}

#[derive(Args)]
struct SoakArgs {
    #[command(flatten)]
    cluster: ProcessClusterArgs,
    /// Minutes of load.
    #[arg(long, default_value_t = 15.0)]
    minutes: f64,
    /// Seconds the cluster is still sampled after the load stopped.
    #[arg(long, default_value_t = 30.0)]
    settle_secs: f64,
    /// Seconds between two samples.
    #[arg(long, default_value_t = 5.0)]
    sample_secs: f64,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Records per POST /v1/append.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Connections appending (each sends its next batch once the previous one committed).
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Records per second all connections together send at most (0: as fast as the cluster commits).
    #[arg(long, default_value_t = 5_000)]
    records_per_sec: u64,
    /// The nodes' snapshot.max_bytes_between.
    #[arg(long, default_value_t = 4 << 20)]
    snapshot_max_bytes_between: u64,
    /// The nodes' snapshot.max_interval_ms.
    #[arg(long, default_value_t = 60_000)]
    snapshot_max_interval_ms: u64,
    /// The nodes' log.retention_bytes.
    #[arg(long, default_value_t = 1 << 20)]
    retention_bytes: u64,
    /// The nodes' log.retention_ms.
    #[arg(long, default_value_t = 60_000)]
    retention_ms: u64,
    /// The nodes' log.cleaner_interval_ms.
    #[arg(long, default_value_t = 2_000)]
    cleaner_interval_ms: u64,
    /// Stop the load early once the data filesystem has less than this many GiB free.
    #[arg(long, default_value_t = 5.0)]
    min_free_gib: f64,
}

#[derive(Args)]
struct AbArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// The kraft release binary that is the baseline (A).
    #[arg(long)]
    baseline: PathBuf,
    /// The kraft release binary measured against it (B); the same binary twice shows the machine's own noise.
    #[arg(long)]
    candidate: PathBuf,
    /// Pairs of runs; each runs every concurrency level once per build.
    #[arg(long, default_value_t = 5)]
    pairs: usize,
    /// Drive both builds through the client protocol (listeners.client) instead of HTTP; both must serve it.
    #[arg(long)]
    native: bool,
    /// Which members the clients write to (leader, followers or spread; see `cluster --help`).
    #[arg(long, value_enum, default_value = "leader")]
    placement: harness::Placement,
    /// Measured seconds per point.
    #[arg(long, default_value_t = 6.0)]
    duration_secs: f64,
    /// Warm-up seconds per point (not measured).
    #[arg(long, default_value_t = 2.0)]
    warmup_secs: f64,
    /// Concurrency levels: closed-loop clients, each with its own connection.
    #[arg(long, value_delimiter = ',', default_value = "1,64,256")]
    concurrency: Vec<usize>,
    /// Bytes of each written value.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Threads of the load generator's runtime.
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
}

#[derive(Args)]
struct EmbeddedArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Measured seconds per record size.
    #[arg(long, default_value_t = 10.0)]
    duration_secs: f64,
    /// Warm-up seconds per record size.
    #[arg(long, default_value_t = 2.0)]
    warmup_secs: f64,
    /// Appends in flight on the leader.
    #[arg(long, default_value_t = 1024)]
    in_flight: usize,
    /// Records in each append.
    #[arg(long, default_value_t = 1)]
    records_per_append: usize,
    /// Record sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "100,1024")]
    record_bytes: Vec<usize>,
    /// Run all three nodes and the load on one arbiter (one thread) instead of one arbiter per node.
    #[arg(long)]
    shared_arbiter: bool,
}

fn default_out() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results")
}

fn secs(value: f64, what: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| anyhow::anyhow!("--{what} {value}: not a duration in seconds"))
}

fn window(warmup: f64, measure: f64) -> anyhow::Result<load::Window> {
    let window = load::Window {
        warmup: secs(warmup, "warmup-secs")?,
        measure: secs(measure, "duration-secs")?,
    };
    anyhow::ensure!(!window.measure.is_zero(), "--duration-secs must be above 0");
    Ok(window)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let keep_data = match &cli.command {
        Command::Cluster(args) => args.common.keep_data,
        Command::Embedded(args) => args.common.keep_data,
        Command::Ab(args) => args.common.keep_data,
        Command::State(args) => args.cluster.keep_data,
        Command::Soak(args) => args.cluster.keep_data,
        Command::Metadata(args) => args.cluster.keep_data,
        Command::Limits(args) => args.keep_data,
        Command::Plot { .. } | Command::HttpStub { .. } => false,
    };
    procs::keep_data(keep_data);
    let outcome = match cli.command {
        Command::Cluster(args) => cluster(args),
        Command::Embedded(args) => embedded(args),
        Command::Ab(args) => ab(args),
        Command::State(args) => state(args),
        Command::Soak(args) => soak(args),
        Command::Metadata(args) => metadata(args),
        Command::Limits(args) => limits(args),
        Command::Plot { results } => harness::replot(&results).map(|svg| println!("chart: {}", svg.display())),
        Command::HttpStub { listen } => http_stub::serve(listen),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kraft-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn cluster(args: ClusterArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.runs > 0, "--runs must be above 0");
    let placements = args.placement;
    anyhow::ensure!(
        !placements.iter().enumerate().any(|(i, p)| placements[..i].contains(p)),
        "--placement lists a placement twice"
    );
    let options = harness::ClusterOptions {
        peers: args.peers,
        placements,
        native: args.native,
        producer: args.producer,
        http_ceiling: args.http_ceiling,
        runs: args.runs,
        kraft_bin: args.kraft_bin,
        ..kraft_only(
            args.common,
            args.concurrency,
            (args.warmup_secs, args.duration_secs),
            args.value_bytes,
            args.client_threads,
        )?
    };
    let threads = options.client_threads;
    until_interrupted(threads, harness::run(options))
}

fn ab(args: AbArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.pairs > 0, "--pairs must be above 0");
    let options = ab::AbOptions {
        cluster: harness::ClusterOptions {
            native: args.native,
            placements: vec![args.placement],
            ..kraft_only(
                args.common,
                args.concurrency,
                (args.warmup_secs, args.duration_secs),
                args.value_bytes,
                args.client_threads,
            )?
        },
        baseline: args.baseline,
        candidate: args.candidate,
        pairs: args.pairs,
    };
    let threads = options.cluster.client_threads;
    until_interrupted(threads, ab::run(options))
}

/// The closed-loop settings shared by `cluster` and `ab`, for one run of
/// kraft alone with the kraft built in the repository.
fn kraft_only(
    common: CommonArgs,
    concurrency: Vec<usize>,
    (warmup_secs, duration_secs): (f64, f64),
    value_bytes: usize,
    client_threads: usize,
) -> anyhow::Result<harness::ClusterOptions> {
    anyhow::ensure!(
        !concurrency.is_empty() && concurrency.iter().all(|c| *c > 0),
        "--concurrency needs levels above 0"
    );
    let mut levels = concurrency.clone();
    levels.sort_unstable();
    levels.dedup();
    anyhow::ensure!(levels.len() == concurrency.len(), "--concurrency lists a level twice");
    Ok(harness::ClusterOptions {
        peers: false,
        placements: vec![harness::Placement::Leader],
        native: false,
        producer: false,
        http_ceiling: false,
        window: window(warmup_secs, duration_secs)?,
        concurrency,
        runs: 1,
        kraft_bin: None,
        repo_root: repo_root(),
        out: common.out,
        data_root: common.data_root,
        value_bytes,
        probe: secs(common.probe_secs, "probe-secs")?,
        client_threads: client_threads.max(1),
    })
}

/// Runs `benchmark` on a runtime of `threads` workers until it ends or
/// Ctrl-C. The servers are started from this (main) thread inside
/// block_on; see ProcessGuard::spawn. On Ctrl-C the benchmark future is
/// dropped, and with it every cluster guard, which stops the servers.
fn until_interrupted(threads: usize, benchmark: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        tokio::select! {
            outcome = benchmark => outcome,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("kraft-bench: interrupted; stopping the servers");
                Err(anyhow::anyhow!("interrupted"))
            }
        }
    })
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ has a parent")
        .to_path_buf()
}

fn state(args: StateArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.cleaner_interval_ms > 0, "--cleaner-interval-ms must be above 0");
    let options = state::StateOptions {
        records: args.records,
        value_bytes: args.value_bytes,
        batch: args.batch,
        clients: args.clients,
        log_join: !args.no_log_join,
        cleaner_interval_ms: args.cleaner_interval_ms,
        wait: secs(args.wait_secs, "wait-secs")?,
        kraft_bin: args.cluster.kraft_bin,
        repo_root: repo_root(),
        out: args.cluster.out,
        data_root: args.cluster.data_root,
    };
    until_interrupted(2, state::run(options))
}

fn metadata(args: MetadataArgs) -> anyhow::Result<()> {
    let options = metadata::MetadataOptions {
        topics: args.topics,
        partitions_per_topic: args.partitions_per_topic,
        concurrency: args.concurrency,
        window: load::Window {
            warmup: Duration::from_secs(args.warmup_secs),
            measure: Duration::from_secs(args.duration_secs),
        },
        session_timeout_ms: args.session_timeout_ms,
        kraft_bin: args.cluster.kraft_bin,
        repo_root: repo_root(),
        out: args.cluster.out,
        data_root: args.cluster.data_root,
    };
    until_interrupted(2, metadata::run(options))
}

fn soak(args: SoakArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.cleaner_interval_ms > 0, "--cleaner-interval-ms must be above 0");
    anyhow::ensure!(
        args.min_free_gib.is_finite() && args.min_free_gib >= 0.0,
        "--min-free-gib must be a number of GiB, 0 or more"
    );
    let options = soak::SoakOptions {
        duration: secs(args.minutes * 60.0, "minutes")?,
        settle: secs(args.settle_secs, "settle-secs")?,
        sample_every: secs(args.sample_secs, "sample-secs")?,
        value_bytes: args.value_bytes,
        batch: args.batch,
        clients: args.clients,
        records_per_sec: args.records_per_sec,
        limits: soak::Limits {
            snapshot_max_bytes_between: args.snapshot_max_bytes_between,
            snapshot_max_interval_ms: args.snapshot_max_interval_ms,
            retention_bytes: args.retention_bytes,
            retention_ms: args.retention_ms,
            cleaner_interval_ms: args.cleaner_interval_ms,
        },
        min_free_bytes: (args.min_free_gib * (1u64 << 30) as f64) as u64,
        kraft_bin: args.cluster.kraft_bin,
        repo_root: repo_root(),
        out: args.cluster.out,
        data_root: args.cluster.data_root,
    };
    until_interrupted(2, soak::run(options))
}

fn embedded(args: EmbeddedArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.in_flight > 0, "--in-flight must be above 0");
    anyhow::ensure!(args.records_per_append > 0, "--records-per-append must be above 0");
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    let options = embedded::EmbeddedOptions {
        window: window(args.warmup_secs, args.duration_secs)?,
        in_flight: args.in_flight,
        records_per_append: args.records_per_append,
        record_sizes: args.record_bytes,
        shared_arbiter: args.shared_arbiter,
        out: args.common.out,
        data_root: args.common.data_root,
        probe: secs(args.common.probe_secs, "probe-secs")?,
    };
    actix_rt::System::new().block_on(async {
        tokio::select! {
            outcome = embedded::run(options) => outcome,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    })
}

fn limits(args: CommonArgs) -> anyhow::Result<()> {
    let limits = disk::measure(&args.data_root, 100, secs(args.probe_secs, "probe-secs")?)?;
    limits.print(&args.data_root);
    for (cpus, mode) in [disk::Cpus::Idle, disk::Cpus::Busy]
        .into_iter()
        .flat_map(|cpus| disk::MODES.map(|mode| (cpus, mode)))
    {
        let grouped_1k = disk::synced_appends(
            &args.data_root,
            1024,
            64,
            mode,
            cpus,
            secs(args.probe_secs, "probe-secs")?,
        )?;
        println!(
            "{}: 1024-byte records, one fdatasync per 64 ({:<17}): {:.1} MB/s ({:.0} records/s)",
            cpus.name(),
            mode.name(),
            grouped_1k.mb_per_sec,
            grouped_1k.records_per_sec
        );
    }
    Ok(())
}
