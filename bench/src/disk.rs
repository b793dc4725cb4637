//! The machine's own limits, measured in the same run as the benchmarks:
//! records written with `fdatasync` to a file on the data directories'
//! filesystem, and the loopback TCP round trip.
//!
//! Each probe runs in one of two conditions. On this kind of virtual machine
//! an `fdatasync` that waits on an idle machine takes a whole timer tick
//! (about 4 ms) longer than one that waits while the CPUs are busy: the I/O
//! completion waits for the halted vCPU. A server under load keeps its CPUs
//! busy, so the *busy* condition (a SCHED_IDLE spinning thread on every
//! core, which yields to any real work) measures the device as the servers
//! see it; the *idle* condition is reported beside it.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::load::{new_histogram, Latency};

/// Where the synced records go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum FileMode {
    /// Appended to a new file that grows: every fdatasync also commits the
    /// new file size (an ext4 journal commit).
    #[serde(rename = "growing file")]
    Growing,
    /// Written over a file whose blocks were written and synced beforehand
    /// (wrapping at its end): fdatasync flushes only the data, as for a log
    /// that preallocates its segments.
    #[serde(rename = "preallocated file")]
    Preallocated,
}

impl FileMode {
    pub fn name(self) -> &'static str {
        match self {
            FileMode::Growing => "growing file",
            FileMode::Preallocated => "preallocated file",
        }
    }
}

pub const MODES: [FileMode; 2] = [FileMode::Growing, FileMode::Preallocated];

/// What the CPUs do while a probe runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Cpus {
    /// Nothing else runs.
    #[serde(rename = "idle")]
    Idle,
    /// A SCHED_IDLE thread spins on every core.
    #[serde(rename = "busy")]
    Busy,
}

impl Cpus {
    pub fn name(self) -> &'static str {
        match self {
            Cpus::Idle => "CPUs idle",
            Cpus::Busy => "CPUs busy",
        }
    }
}

/// Spinning threads at the lowest scheduling class (SCHED_IDLE: they run
/// only when nothing else wants the core), one per core, until dropped.
struct Spinners {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Spinners {
    fn start(cpus: Cpus) -> Spinners {
        let stop = Arc::new(AtomicBool::new(false));
        let count = match cpus {
            Cpus::Idle => 0,
            Cpus::Busy => std::thread::available_parallelism().map_or(1, usize::from),
        };
        let threads = (0..count)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let param = libc::sched_param { sched_priority: 0 };
                    // SAFETY: sets this thread's own policy; no pointers kept.
                    unsafe {
                        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
                    }
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Spinners { stop, threads }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Size of the preallocated file (written with zeros and synced first).
const PREALLOCATED_BYTES: u64 = 8 * 1024 * 1024;

/// Records of `record_bytes` bytes, one `fdatasync` per `records_per_sync`.
#[derive(Clone, Debug, Serialize)]
pub struct SyncedAppends {
    pub mode: FileMode,
    pub cpus: Cpus,
    pub record_bytes: usize,
    pub records_per_sync: usize,
    pub records_per_sec: f64,
    pub syncs_per_sec: f64,
    /// Bytes of records per second, in MB (10^6 bytes).
    pub mb_per_sec: f64,
    /// Latency of one write + fdatasync of a group.
    pub sync_latency_ms: Latency,
}

/// Writes and syncs for `duration` to a fresh file in `dir`, then removes it.
pub fn synced_appends(
    dir: &Path,
    record_bytes: usize,
    records_per_sync: usize,
    mode: FileMode,
    cpus: Cpus,
    duration: Duration,
) -> Result<SyncedAppends> {
    let file_dir = tempfile::Builder::new()
        .prefix("kraft-bench-disk-")
        .tempdir_in(dir)
        .with_context(|| format!("cannot create a scratch directory under {}", dir.display()))?;
    let path = file_dir.path().join("appends");
    let mut file = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    let group = vec![b'r'; record_bytes * records_per_sync];
    let group_len = group.len() as u64;
    if mode == FileMode::Preallocated {
        let zeros = vec![0u8; 1024 * 1024];
        for _ in 0..PREALLOCATED_BYTES / zeros.len() as u64 {
            file.write_all(&zeros)?;
        }
        file.sync_all().with_context(|| format!("fsync {}", path.display()))?;
    }
    let spinners = Spinners::start(cpus);
    let mut histogram = new_histogram();
    let mut syncs = 0u64;
    let mut offset = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration {
        let t = Instant::now();
        match mode {
            FileMode::Growing => file.write_all(&group)?,
            FileMode::Preallocated => {
                if offset + group_len > PREALLOCATED_BYTES {
                    offset = 0;
                }
                file.write_all_at(&group, offset)?;
                offset += group_len;
            }
        }
        file.sync_data()
            .with_context(|| format!("fdatasync {}", path.display()))?;
        histogram.saturating_record(t.elapsed().as_micros().max(1) as u64);
        syncs += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    drop(spinners);
    let records = syncs * records_per_sync as u64;
    Ok(SyncedAppends {
        mode,
        cpus,
        record_bytes,
        records_per_sync,
        records_per_sec: records as f64 / secs,
        syncs_per_sec: syncs as f64 / secs,
        mb_per_sec: (records * record_bytes as u64) as f64 / secs / 1e6,
        sync_latency_ms: Latency::from_histogram(&histogram),
    })
}

/// kraft's own durability point with nothing else around it: one batch of
/// one `record_bytes` record appended to a fresh [`kraft::storage::SledStore`]
/// in `dir`, then `flush` (sled's pwrite and `sync_file_range`, then
/// kraft's `fdatasync`), one at a time for `duration`. The gap between this
/// and a bare fdatasync is what sled costs each commit on the leader and on
/// the follower.
pub fn sled_appends(dir: &Path, record_bytes: usize, cpus: Cpus, duration: Duration) -> Result<SyncedAppends> {
    use kraft::messages::{Batch, Record};
    use kraft::storage::{LogStore, SledStore};
    let store_dir = tempfile::Builder::new()
        .prefix("kraft-bench-sled-")
        .tempdir_in(dir)
        .with_context(|| format!("cannot create a scratch directory under {}", dir.display()))?;
    let mut store = SledStore::open(store_dir.path(), "bench", 1).context("cannot open a sled store")?;
    let record = vec![Record::Data(vec![b'r'; record_bytes])];
    let spinners = Spinners::start(cpus);
    let mut histogram = new_histogram();
    let mut appends = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration {
        let t = Instant::now();
        let batch = Batch::new(store.end_offset(), 1, &record);
        store.append(&batch).context("sled append")?;
        store.flush().context("sled flush")?;
        histogram.saturating_record(t.elapsed().as_micros().max(1) as u64);
        appends += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    drop(spinners);
    Ok(SyncedAppends {
        mode: FileMode::Growing,
        cpus,
        record_bytes,
        records_per_sync: 1,
        records_per_sec: appends as f64 / secs,
        syncs_per_sec: appends as f64 / secs,
        mb_per_sec: (appends * record_bytes as u64) as f64 / secs / 1e6,
        sync_latency_ms: Latency::from_histogram(&histogram),
    })
}

/// Round trips of a `bytes`-byte message over a loopback TCP connection
/// (TCP_NODELAY, an echo thread on the other end).
#[derive(Clone, Debug, Serialize)]
pub struct LoopbackRtt {
    pub cpus: Cpus,
    pub message_bytes: usize,
    pub round_trips: u64,
    pub latency_ms: Latency,
}

pub fn loopback_rtt(bytes: usize, cpus: Cpus, duration: Duration) -> Result<LoopbackRtt> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0 for the round-trip probe")?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut buf = vec![0u8; bytes];
        loop {
            match stream.read_exact(&mut buf) {
                Ok(()) => stream.write_all(&buf)?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let message = vec![b'p'; bytes];
    let mut answer = vec![0u8; bytes];
    let spinners = Spinners::start(cpus);
    let mut histogram = new_histogram();
    let mut round_trips = 0;
    let start = Instant::now();
    while start.elapsed() < duration {
        let t = Instant::now();
        stream.write_all(&message)?;
        stream.read_exact(&mut answer)?;
        histogram.saturating_record(t.elapsed().as_micros().max(1) as u64);
        round_trips += 1;
    }
    drop(spinners);
    drop(stream);
    echo.join().expect("echo thread")?;
    Ok(LoopbackRtt {
        cpus,
        message_bytes: bytes,
        round_trips,
        latency_ms: Latency::from_histogram(&histogram),
    })
}

/// The probes of one CPU condition.
#[derive(Clone, Debug, Serialize)]
pub struct Probes {
    pub cpus: Cpus,
    /// One record per fdatasync: growing file, preallocated file.
    pub single: Vec<SyncedAppends>,
    /// 64 records per fdatasync: growing file, preallocated file.
    pub grouped: Vec<SyncedAppends>,
    /// One record per append + flush through kraft's sled store.
    pub sled: SyncedAppends,
    pub rtt: LoopbackRtt,
}

impl Probes {
    /// The lower of the two one-record fdatasync p50s.
    pub fn fdatasync_p50_ms(&self) -> f64 {
        self.single
            .iter()
            .map(|s| s.sync_latency_ms.p50)
            .fold(f64::INFINITY, f64::min)
    }
}

/// Everything the `cluster` command measures about the machine.
#[derive(Clone, Debug, Serialize)]
pub struct MachineLimits {
    pub filesystem: String,
    pub idle: Probes,
    pub busy: Probes,
    /// The floor's fdatasync: the busy condition's lower p50.
    pub fdatasync_p50_ms: f64,
    pub rtt_p50_ms: f64,
    /// 2 × fdatasync p50 (leader + follower) + 2 × loopback RTT p50, busy
    /// condition.
    pub c1_floor_ms: f64,
    /// The same with sled's flush (append + flush p50) in place of the bare
    /// fdatasync: the floor while the log lives in sled.
    pub c1_sled_floor_ms: f64,
}

fn probes(dir: &Path, record_bytes: usize, cpus: Cpus, duration: Duration) -> Result<Probes> {
    let run = |per_sync: usize| {
        MODES
            .iter()
            .map(|&mode| synced_appends(dir, record_bytes, per_sync, mode, cpus, duration))
            .collect::<Result<Vec<_>>>()
    };
    Ok(Probes {
        cpus,
        single: run(1)?,
        grouped: run(64)?,
        sled: sled_appends(dir, record_bytes, cpus, duration)?,
        rtt: loopback_rtt(record_bytes, cpus, duration)?,
    })
}

pub fn measure(dir: &Path, record_bytes: usize, duration: Duration) -> Result<MachineLimits> {
    let idle = probes(dir, record_bytes, Cpus::Idle, duration)?;
    let busy = probes(dir, record_bytes, Cpus::Busy, duration)?;
    let fdatasync_p50_ms = busy.fdatasync_p50_ms();
    let rtt_p50_ms = busy.rtt.latency_ms.p50;
    let c1_sled_floor_ms = 2.0 * busy.sled.sync_latency_ms.p50 + 2.0 * rtt_p50_ms;
    Ok(MachineLimits {
        filesystem: crate::procs::filesystem_of(dir),
        idle,
        busy,
        fdatasync_p50_ms,
        rtt_p50_ms,
        c1_floor_ms: 2.0 * fdatasync_p50_ms + 2.0 * rtt_p50_ms,
        c1_sled_floor_ms,
    })
}

impl MachineLimits {
    pub fn print(&self, dir: &Path) {
        println!(
            "== the machine's own limits (data root {}, {})",
            dir.display(),
            self.filesystem
        );
        for probes in [&self.idle, &self.busy] {
            let cpus = probes.cpus.name();
            for s in &probes.single {
                println!(
                    "{cpus}: {}-byte records, one fdatasync each ({:<17}): {:>8.0} records/s   fdatasync p50 {:.3} ms  p99 {:.3} ms",
                    s.record_bytes,
                    s.mode.name(),
                    s.records_per_sec,
                    s.sync_latency_ms.p50,
                    s.sync_latency_ms.p99
                );
            }
            for g in &probes.grouped {
                println!(
                    "{cpus}: {}-byte records, one fdatasync per {} ({:<17}): {:>8.0} records/s   ({:.0} fdatasyncs/s, p50 {:.3} ms)",
                    g.record_bytes,
                    g.records_per_sync,
                    g.mode.name(),
                    g.records_per_sec,
                    g.syncs_per_sec,
                    g.sync_latency_ms.p50
                );
            }
            let sled = &probes.sled;
            println!(
                "{cpus}: {}-byte records through kraft's sled store, append + flush each: {:>8.0} records/s   p50 {:.3} ms  p99 {:.3} ms",
                sled.record_bytes, sled.records_per_sec, sled.sync_latency_ms.p50, sled.sync_latency_ms.p99
            );
            let rtt = &probes.rtt;
            println!(
                "{cpus}: loopback TCP round trip ({} B ping-pong, TCP_NODELAY): p50 {:.3} ms  p99 {:.3} ms  ({} round trips)",
                rtt.message_bytes, rtt.latency_ms.p50, rtt.latency_ms.p99, rtt.round_trips
            );
        }
        println!(
            "physical floor for a C=1 commit (CPUs busy): 2 x {:.3} ms (fdatasync p50, leader + follower) + 2 x {:.3} ms (RTT p50) = {:.3} ms",
            self.fdatasync_p50_ms, self.rtt_p50_ms, self.c1_floor_ms
        );
        let idle_floor = 2.0 * self.idle.fdatasync_p50_ms() + 2.0 * self.idle.rtt.latency_ms.p50;
        println!("  (the same with the CPUs idle: {idle_floor:.3} ms)");
        println!(
            "the same floor with sled's flush in place of the bare fdatasync (CPUs busy): 2 x {:.3} ms + 2 x {:.3} ms = {:.3} ms",
            self.busy.sled.sync_latency_ms.p50, self.rtt_p50_ms, self.c1_sled_floor_ms
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_appends_write_and_count() {
        let dir = tempfile::tempdir().unwrap();
        for mode in MODES {
            for cpus in [Cpus::Idle, Cpus::Busy] {
                let result = synced_appends(dir.path(), 100, 4, mode, cpus, Duration::from_millis(50)).unwrap();
                assert!(result.syncs_per_sec > 0.0);
                assert_eq!(result.records_per_sync, 4);
                assert!((result.records_per_sec - 4.0 * result.syncs_per_sec).abs() < 1e-6 * result.records_per_sec);
                assert_eq!(
                    std::fs::read_dir(dir.path()).unwrap().count(),
                    0,
                    "scratch file removed"
                );
            }
        }
    }

    #[test]
    fn sled_appends_write_and_count() {
        let dir = tempfile::tempdir().unwrap();
        let result = sled_appends(dir.path(), 100, Cpus::Idle, Duration::from_millis(100)).unwrap();
        assert!(result.records_per_sec > 0.0);
        assert!(result.sync_latency_ms.p50 > 0.0);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "scratch store removed"
        );
    }

    #[test]
    fn loopback_round_trips_complete() {
        let result = loopback_rtt(100, Cpus::Busy, Duration::from_millis(50)).unwrap();
        assert!(result.round_trips > 0);
        assert!(result.latency_ms.p50 > 0.0);
    }
}
