//! A `kraft run` process a test starts: the arguments every test node
//! shares, and its stderr kept for the test to search and to show when it
//! fails.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The newest lines a process wrote to stderr.
pub type Log = Arc<Mutex<Vec<String>>>;

/// Past this many lines the older half of a [`Log`] is dropped, so that a
/// long fault run's nodes do not grow it without bound.
const KEPT_LINES: usize = 20_000;

/// Adds `run` to `command` (the `kraft` binary, or a launcher that runs
/// it): the repository's `config.toml` as node `id` with `data_dir`, its
/// raft and HTTP listeners on 127.0.0.1, `voters` (a TOML list), and
/// election and fetch timeouts short enough for tests.
pub fn run_args<'a>(
    command: &'a mut Command,
    id: impl std::fmt::Display,
    data_dir: &Path,
    raft_port: u16,
    http_port: u16,
    voters: &str,
) -> &'a mut Command {
    command
        .arg("run")
        .arg("--config")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"))
        .args(["--set", &format!("node.id={id}")])
        .args(["--set", &format!("node.data_dir={}", data_dir.display())])
        .args(["--set", &format!("listeners.raft=127.0.0.1:{raft_port}")])
        .args(["--set", &format!("listeners.http=127.0.0.1:{http_port}")])
        .args(["--set", &format!("quorum.voters={voters}")])
        .args(["--set", "quorum.election_timeout_ms=300"])
        .args(["--set", "quorum.fetch_timeout_ms=600"])
}

/// Starts `command` at log level info, its stdout discarded and its stderr
/// copied line by line into `log` by a thread of its own (which also keeps
/// the pipe from filling).
pub fn spawn_logged(command: &mut Command, log: &Log) -> Child {
    let mut child = command
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kraft");
    let stderr = child.stderr.take().expect("stderr is piped");
    let log = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.push(line);
            if log.len() > KEPT_LINES {
                log.drain(..KEPT_LINES / 2);
            }
        }
    });
    child
}
