//! The `kraft` binary: configuration errors, start-up, graceful shutdown on
//! SIGTERM, and a restart after `kill -9` that keeps every acknowledged
//! append. Every process started here is killed by its [`Kraft`] guard.

mod ports;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Every wait in these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(20);

fn kraft() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kraft"));
    command
        .env("RUST_LOG", "info")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null());
    command
}

/// Runs `kraft` with `args` to completion (bounded) and returns its exit
/// code and stderr.
fn run_to_exit(args: &[&str]) -> (Option<i32>, String) {
    let mut child = kraft()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kraft");
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let mut guard = Kraft {
        child,
        stderr: Arc::default(),
        http: None,
    };
    let status = guard.wait_exit(WAIT);
    // Killed (if still running) before reading to the end of its stderr.
    drop(guard);
    let stderr = reader.join().unwrap();
    (status.and_then(|s| s.code()), stderr)
}

/// Asserts a configuration error: exit code 2, no panic, and `needles` in
/// the message.
fn assert_config_error(args: &[&str], needles: &[&str]) {
    let (code, stderr) = run_to_exit(args);
    assert_eq!(code, Some(2), "args {args:?}; stderr:\n{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "stderr does not name {needle:?} (args {args:?}):\n{stderr}"
        );
    }
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("kraft.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

#[test]
fn a_config_file_with_a_syntax_error_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "[node\nid = 1\n");
    let path = path.to_str().unwrap();
    assert_config_error(&["run", "--config", path], &[path]);
}

#[test]
fn a_bad_value_in_the_config_file_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "[node]\nid = \"abc\"\n");
    assert_config_error(&["--config", path.to_str().unwrap()], &["node.id", "abc"]);
    let path = write_config(dir.path(), "[quorum]\nelection_timeout_ms = \"soon\"\n");
    assert_config_error(
        &["--config", path.to_str().unwrap()],
        &["quorum.election_timeout_ms", "soon"],
    );
}

#[test]
fn an_unknown_key_in_the_config_file_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "[node]\nid = 1\nidd = 2\n");
    assert_config_error(&["--config", path.to_str().unwrap()], &["[node]", "idd"]);
}

#[test]
fn a_missing_config_file_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.toml");
    let path = path.to_str().unwrap();
    assert_config_error(&["run", "--config", path], &[path]);
}

#[test]
fn a_bad_override_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "");
    let path = path.to_str().unwrap();
    assert_config_error(&["run", "--config", path, "--set", "node.id=abc"], &["node.id", "abc"]);
    assert_config_error(
        &["--config", path, "--set", "listeners.http=nowhere"],
        &["listeners.http", "nowhere"],
    );
    assert_config_error(&["--config", path, "--set", "node.no_such_key=1"], &["no_such_key"]);
    // Not KEY=VALUE at all: a usage error, also 2.
    assert_config_error(&["--config", path, "--set", "node.id"], &["KEY=VALUE"]);
}

#[test]
fn a_bad_or_missing_tokens_file_exits_2_naming_it_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "");
    let path = path.to_str().unwrap();
    let tokens = dir.path().join("tokens");
    let tokens_set = format!("security.tokens_file={}", tokens.display());
    let tokens_path = tokens.to_str().unwrap();
    assert_config_error(&["--config", path, "--set", &tokens_set], &[tokens_path]);
    std::fs::write(&tokens, "admin 0123456789abcdef0\nwrite 0123456789abcdef1\n").unwrap();
    assert_config_error(
        &["--config", path, "--set", &tokens_set],
        &[tokens_path, "line 2", "unknown scope"],
    );
    assert_config_error(&["--config", path, "--set", "security.token_file=x"], &["token_file"]);
}

/// A running `kraft`; dropping it kills the process.
struct Kraft {
    child: Child,
    /// Everything the process wrote to stderr so far.
    stderr: Arc<Mutex<String>>,
    http: Option<SocketAddr>,
}

impl Drop for Kraft {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Kraft {
    /// Starts `kraft run` on `config` with `overrides` and waits for the line
    /// announcing its listeners.
    fn start(config: &Path, overrides: &[String]) -> Kraft {
        let mut command = kraft();
        command.arg("run").arg("--config").arg(config);
        for pair in overrides {
            command.arg("--set").arg(pair);
        }
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kraft");
        let stderr_pipe = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let (lines_tx, lines_rx) = mpsc::channel();
        {
            // Keeps draining stderr for the life of the process, so that
            // logging never blocks on a full pipe.
            let stderr = Arc::clone(&stderr);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr_pipe).lines() {
                    let Ok(line) = line else { break };
                    stderr.lock().unwrap().push_str(&line);
                    stderr.lock().unwrap().push('\n');
                    let _ = lines_tx.send(line);
                }
            });
        }
        let mut kraft = Kraft {
            child,
            stderr,
            http: None,
        };
        let deadline = Instant::now() + WAIT;
        while kraft.http.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines_rx.recv_timeout(left) {
                Ok(line) => kraft.http = parse_listening_line(&line),
                Err(_) => panic!(
                    "kraft did not announce its listeners within {WAIT:?}:\n{}",
                    kraft.stderr()
                ),
            }
        }
        kraft
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http.expect("http address"))
    }

    fn wait_for_leadership(&self) {
        let client = client();
        let deadline = Instant::now() + WAIT;
        loop {
            let role = client
                .get(self.url("/v1/quorum"))
                .send()
                .ok()
                .and_then(|r| r.json::<Value>().ok())
                .map(|quorum| quorum["role"].clone());
            if role == Some(json!("leader")) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {WAIT:?} (role {role:?}):\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn append(&self, record: &str) -> Value {
        let response = client()
            .post(self.url("/v1/append"))
            .json(&json!({ "records": [record] }))
            .send()
            .unwrap_or_else(|e| panic!("append: {e}\n{}", self.stderr()));
        assert_eq!(response.status().as_u16(), 200);
        response.json().expect("append answer")
    }

    /// The values of the committed data records.
    fn committed_values(&self) -> Vec<String> {
        let page: Value = client()
            .get(self.url("/v1/log?max=10000"))
            .send()
            .and_then(|r| r.json())
            .unwrap_or_else(|e| panic!("read log: {e}\n{}", self.stderr()));
        page["records"]
            .as_array()
            .expect("records")
            .iter()
            .filter(|r| r["kind"] == "data")
            .map(|r| r["value"].as_str().expect("value").to_owned())
            .collect()
    }

    /// Waits until the committed data records are exactly `expected`. A new
    /// leader's high watermark trails its log until it commits in its own
    /// epoch, so a read right after the election may still see fewer.
    fn wait_for_committed(&self, expected: &[&str]) {
        let deadline = Instant::now() + WAIT;
        loop {
            let values = self.committed_values();
            if values == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "committed data {values:?}, expected {expected:?}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: kill(2) with a pid of our own child has no memory effects.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// Waits up to `limit` for the process to exit.
    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `kraft node N: raft on ADDR, http on ADDR` → the http address.
fn parse_listening_line(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find("kraft node ")?..];
    let (_, http) = rest.split_once(", http on ")?;
    http.trim().parse().ok()
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(WAIT)
        .build()
        .expect("http client")
}

/// A single voter with node id `id` on `raft`, data in `data_dir`; the
/// listeners and voters come from `--set` so those overrides are exercised.
fn single_node(dir: &Path, id: i32, raft: SocketAddr) -> (PathBuf, Vec<String>) {
    let data_dir = dir.join("data");
    let config = write_config(
        dir,
        &format!(
            "[node]\nid = {id}\ndata_dir = {data_dir:?}\ncluster_id = \"kraft-cli-test\"\nstate_machine = \"log\"\n\n\
             [quorum]\nelection_timeout_ms = 200\nfetch_timeout_ms = 400\nrequest_timeout_ms = 400\n"
        ),
    );
    let overrides = vec![
        "listeners.http=127.0.0.1:0".to_owned(),
        format!("listeners.raft={raft}"),
        format!("quorum.voters=[\"{id}@{raft}\"]"),
    ];
    (config, overrides)
}

#[test]
fn sigterm_shuts_down_cleanly_and_appends_survive_restarts_and_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (config, overrides) = single_node(dir.path(), 1, ports::free_addr());

    let mut first = Kraft::start(&config, &overrides);
    first.wait_for_leadership();
    first.append("before-sigterm");
    first.signal(libc::SIGTERM);
    let status = first.wait_exit(WAIT);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit after SIGTERM:\n{}",
        first.stderr()
    );
    drop(first);

    let mut second = Kraft::start(&config, &overrides);
    second.wait_for_leadership();
    second.wait_for_committed(&["before-sigterm"]);
    second.append("before-kill");
    second.signal(libc::SIGKILL);
    assert!(second.wait_exit(WAIT).is_some(), "SIGKILL did not end the process");
    drop(second);

    let third = Kraft::start(&config, &overrides);
    third.wait_for_leadership();
    third.wait_for_committed(&["before-sigterm", "before-kill"]);
}

#[test]
fn a_data_dir_of_another_node_refuses_to_start_with_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let raft = ports::free_addr();
    let (config, overrides) = single_node(dir.path(), 1, raft);
    let first = Kraft::start(&config, &overrides);
    first.wait_for_leadership();
    drop(first);

    // Same data directory, another node id.
    let (config, overrides) = single_node(dir.path(), 2, raft);
    let mut args = vec![
        "run".to_owned(),
        "--config".to_owned(),
        config.to_str().unwrap().to_owned(),
    ];
    for pair in overrides {
        args.push("--set".to_owned());
        args.push(pair);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stderr) = run_to_exit(&args);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot start"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Threads of `pid` that actix runs (HTTP workers and the node's arbiters).
fn actix_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the process is running")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.starts_with("actix-rt|system"))
        .count()
}

#[test]
fn listeners_http_workers_sets_the_number_of_http_threads() {
    let mut threads = Vec::new();
    for workers in [0, 1, 3] {
        let dir = tempfile::tempdir().unwrap();
        let (config, mut overrides) = single_node(dir.path(), 1, ports::free_addr());
        overrides.push(format!("listeners.http_workers={workers}"));
        let node = Kraft::start(&config, &overrides);
        node.wait_for_leadership();
        node.append(&format!("served by {workers} worker threads"));
        threads.push(actix_threads(node.child.id()));
    }
    // 0 serves the API on the node's own thread: no worker thread at all.
    assert_eq!(
        threads,
        [threads[0], threads[0] + 1, threads[0] + 3],
        "actix threads with 0, 1 and 3 HTTP workers"
    );
}

impl Kraft {
    /// The address in the `client protocol on ADDR` line, once it is out.
    fn client_addr(&self) -> SocketAddr {
        let deadline = Instant::now() + WAIT;
        loop {
            let stderr = self.stderr();
            let announced = stderr
                .lines()
                .find_map(|line| line.split_once("client protocol on ")?.1.trim().parse().ok());
            if let Some(addr) = announced {
                return addr;
            }
            assert!(
                Instant::now() < deadline,
                "no client listener announced within {WAIT:?}:\n{stderr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Appends `records` through the client protocol at `addr`.
fn append_by_client(addr: SocketAddr, records: &[&str]) -> kraft::node::Appended {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut client = kraft::client::Client::connect(addr).await.expect("connect");
        let records = records.iter().map(|r| r.as_bytes().to_vec()).collect();
        client.append(records).await.expect("append")
    })
}

#[test]
fn listeners_client_serves_the_client_protocol_and_its_appends_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (config, mut overrides) = single_node(dir.path(), 1, ports::free_addr());
    let without = Kraft::start(&config, &overrides);
    without.wait_for_leadership();
    assert!(
        !without.stderr().contains("client protocol on"),
        "served only when configured:\n{}",
        without.stderr()
    );
    drop(without);

    overrides.push("listeners.client=127.0.0.1:0".to_owned());
    let mut first = Kraft::start(&config, &overrides);
    first.wait_for_leadership();
    let appended = append_by_client(first.client_addr(), &["by-client-1", "by-client-2"]);
    assert_eq!(appended.last_offset, appended.base_offset + 1);
    first.signal(libc::SIGKILL);
    assert!(first.wait_exit(WAIT).is_some(), "SIGKILL did not end the process");
    drop(first);

    let second = Kraft::start(&config, &overrides);
    second.wait_for_leadership();
    second.wait_for_committed(&["by-client-1", "by-client-2"]);
    append_by_client(second.client_addr(), &["after-restart"]);
    second.wait_for_committed(&["by-client-1", "by-client-2", "after-restart"]);
}

#[test]
fn a_client_listener_that_cannot_bind_exits_1_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    let (config, overrides) = single_node(dir.path(), 1, ports::free_addr());
    let mut args = vec![
        "run".to_owned(),
        "--config".to_owned(),
        config.to_str().unwrap().to_owned(),
    ];
    for pair in overrides.into_iter().chain([format!("listeners.client={taken_addr}")]) {
        args.push("--set".to_owned());
        args.push(pair);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stderr) = run_to_exit(&args);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot bind the client listener"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
