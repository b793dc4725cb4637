//! Process-level tests: real `kraft` processes on 127.0.0.1 (ephemeral
//! ports), `kill -9`, restarts, and the check that no acknowledged append is
//! ever lost. Every process a test starts is killed when its guard drops.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// One `kraft` process; killed with SIGKILL when dropped.
struct Node {
    id: i32,
    http_port: u16,
    raft_port: u16,
    data_dir: PathBuf,
    voters: String,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Node {
    fn new(id: i32, data_dir: PathBuf, raft_port: u16, voters: String) -> Node {
        Node {
            id,
            http_port: free_port(),
            raft_port,
            data_dir,
            voters,
            child: None,
            log: Default::default(),
        }
    }

    fn start(&mut self) {
        assert!(self.child.is_none(), "node {} already running", self.id);
        let mut child = Command::new(env!("CARGO_BIN_EXE_kraft"))
            .arg("run")
            .arg("--config")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"))
            .args(["--set", &format!("node.id={}", self.id)])
            .args(["--set", &format!("node.data_dir={}", self.data_dir.display())])
            .args(["--set", &format!("listeners.raft=127.0.0.1:{}", self.raft_port)])
            .args(["--set", &format!("listeners.http=127.0.0.1:{}", self.http_port)])
            .args(["--set", &format!("quorum.voters={}", self.voters)])
            .args(["--set", "quorum.election_timeout_ms=300"])
            .args(["--set", "quorum.fetch_timeout_ms=600"])
            .args(["--set", "quorum.request_timeout_ms=600"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kraft");
        // Keep the node's log for failure messages.
        let stderr = child.stderr.take().unwrap();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                log.lock().unwrap().push(line);
            }
        });
        self.child = Some(child);
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.http_port, path)
    }

    fn quorum(&self) -> Option<Value> {
        http().get(self.url("/v1/quorum")).send().ok()?.json().ok()
    }

    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap();
        log.iter().rev().take(30).rev().cloned().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

struct Cluster {
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start(size: i32) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let raft_ports: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let voters = format!(
            "[{}]",
            raft_ports
                .iter()
                .enumerate()
                .map(|(i, p)| format!("\"{}@127.0.0.1:{}\"", i + 1, p))
                .collect::<Vec<_>>()
                .join(",")
        );
        let mut nodes: Vec<Node> = (0..size)
            .map(|i| {
                Node::new(
                    i + 1,
                    dir.path().join(format!("node-{}", i + 1)),
                    raft_ports[i as usize],
                    voters.clone(),
                )
            })
            .collect();
        for node in &mut nodes {
            node.start();
        }
        Cluster { nodes, _dir: dir }
    }

    fn node(&mut self, id: i32) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.id == id).unwrap()
    }

    /// Waits until the running nodes agree on one leader newer than `after_epoch`.
    fn wait_for_leader(&self, after_epoch: i64) -> (i32, i64) {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            let views: Vec<Value> = self
                .nodes
                .iter()
                .filter(|n| n.child.is_some())
                .filter_map(|n| n.quorum())
                .collect();
            let leaders: Vec<(i32, i64)> = views
                .iter()
                .filter(|q| q["role"] == "leader")
                .map(|q| {
                    (
                        q["node_id"].as_i64().unwrap() as i32,
                        q["leader_epoch"].as_i64().unwrap(),
                    )
                })
                .collect();
            if let [(id, epoch)] = leaders[..] {
                let running = self.nodes.iter().filter(|n| n.child.is_some()).count();
                let agree = views
                    .iter()
                    .filter(|q| q["leader_id"] == json!(id) && q["leader_epoch"] == json!(epoch))
                    .count();
                if epoch > after_epoch && views.len() == running && agree == running {
                    return (id, epoch);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.fail("no leader elected");
    }

    fn fail(&self, what: &str) -> ! {
        let logs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("--- node {} ---\n{}", n.id, n.log_tail()))
            .collect();
        panic!("{what}\n{}", logs.join("\n"));
    }
}

/// Appends one record through `node`; Some((offset, value)) when acknowledged.
fn append(client: &reqwest::blocking::Client, node_http: u16, value: &str) -> Option<i64> {
    let response = client
        .post(format!("http://127.0.0.1:{node_http}/v1/append"))
        .json(&json!({ "records": [value] }))
        .send()
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let body: Value = response.json().ok()?;
    body["base_offset"].as_i64()
}

/// offset → (kind, value) of committed records.
type CommittedLog = BTreeMap<i64, (String, Option<String>)>;

/// The high watermark and committed log of a node.
fn read_log(node: &Node) -> (i64, CommittedLog) {
    let client = http();
    let mut from = 0;
    let mut out = BTreeMap::new();
    let mut hw = 0;
    loop {
        let page: Value = client
            .get(node.url(&format!("/v1/log?from={from}&max=1000")))
            .send()
            .unwrap()
            .json()
            .unwrap();
        hw = page["high_watermark"].as_i64().unwrap_or(hw);
        let records = page["records"].as_array().unwrap().clone();
        if records.is_empty() {
            break;
        }
        for r in records {
            let offset = r["offset"].as_i64().unwrap();
            out.insert(
                offset,
                (
                    r["kind"].as_str().unwrap().to_string(),
                    r["value"].as_str().map(String::from),
                ),
            );
            from = offset + 1;
        }
    }
    (hw, out)
}

fn wait_until(what: &str, cluster: &Cluster, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.fail(what);
}

#[test]
fn three_nodes_survive_kill9_of_the_leader_without_losing_an_acknowledged_append() {
    let mut cluster = Cluster::start(3);
    let (leader, epoch) = cluster.wait_for_leader(0);
    let client = http();

    // Appends through every node; followers forward to the leader.
    let mut acked: BTreeMap<i64, String> = BTreeMap::new();
    for i in 0..30 {
        let via = &cluster.nodes[i % 3];
        let value = format!("before-{i}");
        match append(&client, via.http_port, &value) {
            Some(offset) => {
                acked.insert(offset, value);
            }
            None => cluster.fail(&format!("append {i} via node {} failed with a healthy cluster", via.id)),
        }
    }

    // Writers keep appending while the leader is killed.
    let stop = Arc::new(AtomicBool::new(false));
    let racing: Arc<Mutex<BTreeMap<i64, String>>> = Default::default();
    let followers: Vec<u16> = cluster
        .nodes
        .iter()
        .filter(|n| n.id != leader)
        .map(|n| n.http_port)
        .collect();
    let leader_http = cluster.node(leader).http_port;
    let writers: Vec<_> = [leader_http, followers[0], followers[1]]
        .into_iter()
        .enumerate()
        .map(|(w, port)| {
            let stop = stop.clone();
            let racing = racing.clone();
            std::thread::spawn(move || {
                let client = http();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) && i < 2000 {
                    let value = format!("racing-{w}-{i}");
                    if let Some(offset) = append(&client, port, &value) {
                        racing.lock().unwrap().insert(offset, value);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    cluster.node(leader).kill9();
    let (new_leader, new_epoch) = cluster.wait_for_leader(epoch);
    assert_ne!(new_leader, leader);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let raced = racing.lock().unwrap().len();
    assert!(
        raced > 0,
        "no append was acknowledged while the leader was being killed"
    );
    acked.extend(racing.lock().unwrap().clone());

    for i in 0..10 {
        let value = format!("after-{i}");
        let via = cluster
            .nodes
            .iter()
            .find(|n| n.child.is_some() && n.id != new_leader)
            .unwrap();
        if let Some(offset) = append(&client, via.http_port, &value) {
            acked.insert(offset, value);
        } else {
            cluster.fail("append after failover failed");
        }
    }

    // The killed node comes back and catches up.
    cluster.node(leader).start();
    let target_hw = cluster.node(new_leader).quorum().unwrap()["high_watermark"]
        .as_i64()
        .unwrap();
    wait_until("restarted node did not catch up", &cluster, || {
        cluster
            .nodes
            .iter()
            .all(|n| n.quorum().and_then(|q| q["high_watermark"].as_i64()).unwrap_or(-1) >= target_hw)
    });
    let _ = new_epoch;

    // Every acknowledged append is committed on every node, at its offset.
    let logs: Vec<(i64, CommittedLog)> = cluster.nodes.iter().map(read_log).collect();
    for (node, (hw, log)) in cluster.nodes.iter().zip(&logs) {
        assert!(*hw >= target_hw);
        for (offset, value) in &acked {
            match log.get(offset) {
                Some((kind, Some(v))) if kind == "data" && v == value => {}
                other => cluster.fail(&format!(
                    "node {}: acknowledged {value:?} at {offset} but log has {other:?}",
                    node.id
                )),
            }
        }
        // Offsets are contiguous from 0.
        assert_eq!(
            log.keys().copied().collect::<Vec<_>>(),
            (0..log.len() as i64).collect::<Vec<_>>()
        );
    }
    eprintln!(
        "{} acknowledged appends ({raced} racing the kill) found on all 3 nodes",
        acked.len()
    );
    // Committed prefixes agree.
    let shortest = logs.iter().map(|(_, l)| l.len()).min().unwrap() as i64;
    for offset in 0..shortest {
        let first = &logs[0].1[&offset];
        assert!(
            logs.iter().all(|(_, l)| &l[&offset] == first),
            "nodes disagree at {offset}"
        );
    }
}

#[test]
fn a_single_node_restarts_after_kill9_with_its_data() {
    let mut cluster = Cluster::start(1);
    let (_, epoch) = cluster.wait_for_leader(0);
    let client = http();
    let port = cluster.nodes[0].http_port;
    let mut acked = BTreeMap::new();
    for i in 0..20 {
        let value = format!("v{i}");
        let offset = append(&client, port, &value).unwrap_or_else(|| cluster.fail("append failed"));
        acked.insert(offset, value);
    }
    cluster.nodes[0].kill9();
    cluster.nodes[0].start();
    let (_, new_epoch) = cluster.wait_for_leader(epoch);
    assert!(
        new_epoch > epoch,
        "a restarted single voter elects itself in a new epoch"
    );
    let last = *acked.keys().last().unwrap();
    wait_until("restarted node did not recommit its log", &cluster, || {
        read_log(&cluster.nodes[0]).0 > last
    });
    let (_, log) = read_log(&cluster.nodes[0]);
    for (offset, value) in &acked {
        assert_eq!(
            log.get(offset),
            Some(&("data".to_string(), Some(value.clone()))),
            "offset {offset}"
        );
    }
}
