//! Server processes the harness starts: a guard that stops them on drop,
//! free loopback ports, CPU time and memory from `/proc`, directory sizes,
//! and where a directory lives.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

/// How long a stopped server gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// One started server: its name, process and log file.
struct Server {
    name: String,
    child: Child,
    log: PathBuf,
}

/// The servers of one cluster. Dropping the guard stops them all: SIGTERM to
/// every one at once, then SIGKILL to those still running after
/// [`STOP_GRACE`]. Drop runs on a normal return, on `?`, on a panic (unwind)
/// and when the benchmark future is dropped on Ctrl-C.
#[derive(Default)]
pub struct ProcessGuard {
    servers: Vec<Server>,
}

impl ProcessGuard {
    /// Starts `command` with stdout and stderr appended to `log`, in a process
    /// group of its own (a terminal's Ctrl-C reaches the harness, which then
    /// stops the servers in order) and with SIGKILL as its parent-death
    /// signal, so that even a harness killed with SIGKILL leaves no server
    /// behind. The parent-death signal fires when the *thread* that spawned
    /// the child exits: call this from the main thread (the `block_on`
    /// future), never from a blocking-pool thread.
    pub fn spawn(&mut self, name: &str, mut command: Command, log: &Path) -> Result<u32> {
        let out = File::create(log).with_context(|| format!("cannot create log file {}", log.display()))?;
        let err = out.try_clone()?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let program = command.get_program().to_string_lossy().into_owned();
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {name} ({program})"))?;
        let pid = child.id();
        self.servers.push(Server {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        });
        Ok(pid)
    }

    /// The process ids, in start order.
    pub fn pids(&self) -> Vec<u32> {
        self.servers.iter().map(|s| s.child.id()).collect()
    }

    /// Fails, naming the server and quoting the end of its log, if any server
    /// has exited.
    pub fn check_running(&mut self) -> Result<()> {
        for server in &mut self.servers {
            if let Some(status) = server.child.try_wait()? {
                bail!(
                    "{} exited early ({status}); end of {}:\n{}",
                    server.name,
                    server.log.display(),
                    log_tail(&server.log, 30)
                );
            }
        }
        Ok(())
    }

    /// The end of every server's log, for error messages.
    pub fn log_tails(&self, lines: usize) -> String {
        self.servers
            .iter()
            .map(|s| format!("--- {} ({})\n{}", s.name, s.log.display(), log_tail(&s.log, lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops one server: `signal` (SIGTERM for a clean stop, SIGKILL for a
    /// crash), then SIGKILL if it is still running after [`STOP_GRACE`].
    /// Returns how long it took to exit and whether SIGKILL was needed. The
    /// server is forgotten (a later restart is a new [`ProcessGuard::spawn`]).
    pub fn stop(&mut self, pid: u32, signal: libc::c_int) -> Result<(Duration, bool)> {
        let index = self
            .servers
            .iter()
            .position(|s| s.child.id() == pid)
            .with_context(|| format!("no server with pid {pid}"))?;
        let mut server = self.servers.remove(index);
        let sent = Instant::now();
        if let Ok(None) = server.child.try_wait() {
            // SAFETY: plain kill(2) on a child we own and have not reaped.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
        loop {
            match server.child.try_wait() {
                Ok(Some(_)) => return Ok((sent.elapsed(), false)),
                Err(e) => {
                    let _ = server.child.kill();
                    bail!("waiting for {} to exit: {e}", server.name)
                }
                Ok(None) if sent.elapsed() >= STOP_GRACE => {
                    eprintln!(
                        "  {} still running {STOP_GRACE:?} after signal {signal}: SIGKILL",
                        server.name
                    );
                    let _ = server.child.kill();
                    let _ = server.child.wait();
                    return Ok((sent.elapsed(), true));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// (name, log file) of every server, in start order.
    pub fn logs(&self) -> Vec<(String, PathBuf)> {
        self.servers.iter().map(|s| (s.name.clone(), s.log.clone())).collect()
    }

    /// Stops every server (see the type's documentation).
    pub fn stop_all(&mut self) {
        for server in &mut self.servers {
            if let Ok(None) = server.child.try_wait() {
                // SAFETY: plain kill(2) on a child we own and have not reaped.
                unsafe {
                    libc::kill(server.child.id() as libc::pid_t, libc::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + STOP_GRACE;
        for server in &mut self.servers {
            loop {
                match server.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        eprintln!("  {} still running {STOP_GRACE:?} after SIGTERM: SIGKILL", server.name);
                        let _ = server.child.kill();
                        let _ = server.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        self.servers.clear();
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// The last `lines` lines of a log file (at most its last 64 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return "(no log)".to_string();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut text = String::new();
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_ok() {
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `n` distinct free ports on 127.0.0.1: all bound to port 0 at once, read,
/// then released for the servers to bind.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()
        .context("cannot bind a free port on 127.0.0.1")?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<_>>>()?)
}

/// Seconds of CPU (user + system) a process has used, all its threads.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("read /proc/{pid}/stat"))?;
    cpu_seconds_from_stat(&stat).with_context(|| format!("parse /proc/{pid}/stat"))
}

/// Seconds of CPU this process (the load generator) has used.
pub fn self_cpu_seconds() -> Result<f64> {
    cpu_seconds(std::process::id())
}

fn cpu_seconds_from_stat(stat: &str) -> Result<f64> {
    // The command name (field 2) is in parentheses and may hold spaces; the
    // fields after the last ')' start at field 3 (state). utime and stime are
    // fields 14 and 15.
    let after = &stat[stat.rfind(')').context("no ')' in stat")? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    Ok((utime + stime) as f64 / ticks)
}

/// A process's resident memory from `/proc/PID/status`, in KiB: `VmRSS`
/// (now) and `VmHWM` (the peak since it started).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Memory {
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

impl Memory {
    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    pub fn hwm_mib(&self) -> f64 {
        self.hwm_kib as f64 / 1024.0
    }
}

pub fn memory(pid: u32) -> Result<Memory> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("read /proc/{pid}/status"))?;
    memory_from_status(&status).with_context(|| format!("parse /proc/{pid}/status"))
}

fn memory_from_status(status: &str) -> Result<Memory> {
    let field = |name: &str| -> Result<u64> {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .with_context(|| format!("no {name}"))?;
        let kib = line.trim().trim_end_matches("kB").trim();
        kib.parse().with_context(|| format!("{name} {kib:?}"))
    };
    Ok(Memory {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

/// The bytes under a directory, every file counted once: (apparent size,
/// allocated on disk as `du` counts it). A file that vanishes meanwhile
/// counts 0.
pub fn dir_usage(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut apparent = 0;
    let mut allocated = 0;
    let mut pending = vec![path.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                apparent += meta.len();
                allocated += meta.blocks() * 512;
            }
        }
    }
    (apparent, allocated)
}

/// Bytes free for an unprivileged user on the filesystem holding `path`
/// (`statvfs`: available blocks times the fragment size).
pub fn free_bytes(path: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("{}: a path with a NUL byte", path.display()))?;
    // SAFETY: statvfs writes only into the zeroed struct we pass; c_path is
    // a valid NUL-terminated string for the duration of the call.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("statvfs {}", path.display()));
    }
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// Total CPU seconds of a set of processes (a process that is gone counts 0).
pub fn total_cpu_seconds(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|&pid| cpu_seconds(pid).ok()).sum()
}

/// The mount a path lives on: (device, filesystem type, mount point), from
/// `/proc/self/mounts` (the longest mount point that is a prefix of it).
pub fn filesystem_of(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return "unknown".to_string();
    };
    mounts
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let (device, point, fstype) = (parts.next()?, parts.next()?, parts.next()?);
            path.starts_with(point)
                .then(|| (point.len(), format!("{fstype} on {device} ({point})")))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, text)| text)
        .unwrap_or_else(|| "unknown".to_string())
}

/// Set by `--keep-data`: data directories (and the servers' logs in them)
/// are left in place instead of removed.
static KEEP_DATA: AtomicBool = AtomicBool::new(false);

pub fn keep_data(keep: bool) {
    KEEP_DATA.store(keep, Ordering::Relaxed);
}

/// A fresh directory under `root` for one cluster's data and logs, removed
/// on drop unless `--keep-data` was given.
pub fn data_dir(root: &Path, prefix: &str) -> Result<tempfile::TempDir> {
    let mut dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(root)
        .with_context(|| format!("cannot create a data directory under {}", root.display()))?;
    if KEEP_DATA.load(Ordering::Relaxed) {
        dir.disable_cleanup(true);
        eprintln!("  keeping {}", dir.path().display());
    }
    Ok(dir)
}

/// Looks a program up on PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Time since the Unix epoch (zero for a clock set before it): names
/// results files and makes cluster ids unique.
pub fn since_epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// Writes `report` to `path` as pretty JSON.
pub fn write_json(path: &Path, report: &impl serde::Serialize) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(report)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// [`write_json`], then tells where the results went.
pub fn write_results(path: &Path, report: &impl serde::Serialize) -> Result<()> {
    write_json(path, report)?;
    println!("\nresults: {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_spaces_and_parentheses() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 1 2 3";
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        assert_eq!(cpu_seconds_from_stat(stat).unwrap(), 300.0 / ticks);
    }

    #[test]
    fn memory_fields_of_a_status_file() {
        let status = "Name:\tkraft\nVmPeak:\t  900 kB\nVmHWM:\t   81234 kB\nVmRSS:\t   70001 kB\nThreads:\t9\n";
        let m = memory_from_status(status).unwrap();
        assert_eq!((m.rss_kib, m.hwm_kib), (70001, 81234));
        assert!(memory(std::process::id()).unwrap().rss_kib > 0);
    }

    #[test]
    fn dir_usage_counts_nested_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/x"), [0u8; 1000]).unwrap();
        std::fs::write(dir.path().join("y"), [0u8; 24]).unwrap();
        assert_eq!(dir_usage(dir.path()).0, 1024);
    }

    #[test]
    fn the_temp_dir_has_free_space() {
        assert!(free_bytes(&std::env::temp_dir()).unwrap() > 0);
        assert!(free_bytes(Path::new("/no/such/dir")).is_err());
    }

    #[test]
    fn this_process_has_a_cpu_time() {
        assert!(self_cpu_seconds().unwrap() >= 0.0);
    }
}
