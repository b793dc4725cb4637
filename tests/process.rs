//! Process-level tests: real `kraft` processes on 127.0.0.1 (ephemeral
//! ports), `kill -9`, restarts, and the check that no acknowledged append is
//! ever lost. Every process a test starts is killed when its guard drops.

mod node_process;
mod ports;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kraft::messages::codec::{decode_bounded, encode};
use kraft::messages::{Batch, Record};
use node_process::{run_args, spawn_logged, Log};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

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
    /// More command-line arguments (e.g. `--set node.roles=["broker"]`).
    extra_args: Vec<String>,
    /// A command (and its arguments) that runs `kraft` in its stead, e.g.
    /// under strace; the process started must be `kraft` itself.
    launcher: Vec<String>,
    child: Option<Child>,
    log: Log,
}

impl Node {
    fn new(id: i32, data_dir: PathBuf, raft_port: u16, voters: String) -> Node {
        Node {
            id,
            http_port: ports::free_port(),
            raft_port,
            data_dir,
            voters,
            extra_args: Vec::new(),
            launcher: Vec::new(),
            child: None,
            log: Default::default(),
        }
    }

    fn start(&mut self) {
        assert!(self.child.is_none(), "node {} already running", self.id);
        let kraft = env!("CARGO_BIN_EXE_kraft");
        let mut command = match self.launcher.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(kraft);
                command
            }
            None => Command::new(kraft),
        };
        run_args(
            &mut command,
            self.id,
            &self.data_dir,
            self.raft_port,
            self.http_port,
            &self.voters,
        )
        // These tests append raw records.
        .args(["--set", "node.state_machine=log"])
        .args(["--set", "quorum.request_timeout_ms=600"])
        .args(&self.extra_args);
        let child = spawn_logged(&mut command, &self.log);
        self.child = Some(child);
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits (bounded) for the process to exit on its own; None if it is still running.
    fn wait_exit(&mut self) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            let child = self.child.as_mut().expect("node not running");
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Asks the process to shut down gracefully (SIGTERM) and waits for it.
    fn sigterm(&mut self) -> Option<std::process::ExitStatus> {
        let pid = self.child.as_ref().expect("node not running").id();
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) }, 0);
        self.wait_exit()
    }

    /// Waits (bounded) until a captured stderr line satisfies `matches`, and returns it.
    fn wait_log_line(&self, matches: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Some(line) = self.log.lock().unwrap().iter().find(|l| matches(l)) {
                return Some(line.clone());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
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
        Cluster::start_with(size, &[])
    }

    /// `size` voters, each started with `--set` for every one of `sets`.
    fn start_with(size: i32, sets: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let raft_ports: Vec<u16> = (0..size).map(|_| ports::free_port()).collect();
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
            node.extra_args = sets
                .iter()
                .flat_map(|set| ["--set".to_string(), set.to_string()])
                .collect();
            node.start();
        }
        Cluster { nodes, _dir: dir }
    }

    fn node(&mut self, id: i32) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.id == id).unwrap()
    }

    fn node_ref(&self, id: i32) -> &Node {
        self.nodes.iter().find(|n| n.id == id).unwrap()
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

/// Asserts that every acknowledged append (offset → value) is in `log`
/// at its offset; `what` names the log in the failure.
fn assert_log_holds(log: &CommittedLog, acked: &BTreeMap<i64, String>, what: &str) {
    for (offset, value) in acked {
        assert_eq!(
            log.get(offset),
            Some(&("data".to_string(), Some(value.clone()))),
            "{what} at {offset}"
        );
    }
}

/// The committed log of a restarted single node, once its high watermark
/// passed the last acknowledged append.
fn recommitted_log(cluster: &Cluster, acked: &BTreeMap<i64, String>) -> CommittedLog {
    let last = *acked.keys().last().unwrap();
    wait_until("the restarted node recommits its log", cluster, || {
        read_log(&cluster.nodes[0]).0 > last
    });
    read_log(&cluster.nodes[0]).1
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
    let log = recommitted_log(&cluster, &acked);
    assert_log_holds(&log, &acked, "acknowledged append");
}

// ---------------------------------------------------------------------
// Observers
// ---------------------------------------------------------------------

/// `POST /v1/append` of one record; the HTTP status and the JSON body (or the raw text).
fn append_raw(client: &reqwest::blocking::Client, node_http: u16, value: &str) -> (u16, String) {
    match client
        .post(format!("http://127.0.0.1:{node_http}/v1/append"))
        .json(&json!({ "records": [value] }))
        .send()
    {
        Ok(response) => (response.status().as_u16(), response.text().unwrap_or_default()),
        Err(e) => (0, format!("request failed: {e}")),
    }
}

/// The ids in one of the replica lists (`voters`, `observers`) of a `/v1/quorum` answer.
fn replica_ids(quorum: &Value, list: &str) -> Vec<i64> {
    let mut ids: Vec<i64> = quorum[list]
        .as_array()
        .map(|l| l.iter().filter_map(|r| r["id"].as_i64()).collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

/// Waits until `observer`'s committed log reaches `target_hw` and agrees with `leader`'s.
fn wait_for_observer_to_converge(cluster: &Cluster, observer: i32, leader: i32, target_hw: i64) {
    let node = |id: i32| cluster.nodes.iter().find(|n| n.id == id).unwrap();
    wait_until(
        "the observer did not reach the leader's high watermark",
        cluster,
        || {
            node(observer)
                .quorum()
                .and_then(|q| q["high_watermark"].as_i64())
                .unwrap_or(-1)
                >= target_hw
        },
    );
    let (observer_hw, observer_log) = read_log(node(observer));
    let (leader_hw, leader_log) = read_log(node(leader));
    assert!(observer_hw >= target_hw && leader_hw >= target_hw);
    // Both logs are committed prefixes of one log: equal where both have a record.
    let common = observer_log.len().min(leader_log.len()) as i64;
    assert!(common >= target_hw, "only {common} committed records to compare");
    for offset in 0..common {
        if observer_log.get(&offset) != leader_log.get(&offset) {
            cluster.fail(&format!(
                "observer and leader disagree at {offset}: {:?} vs {:?}",
                observer_log.get(&offset),
                leader_log.get(&offset)
            ));
        }
    }
    assert_eq!(
        observer_log.keys().copied().collect::<Vec<_>>(),
        (0..observer_log.len() as i64).collect::<Vec<_>>(),
        "the observer's committed log is contiguous from 0"
    );
}

#[test]
fn an_observer_replicates_but_never_votes() {
    let mut cluster = Cluster::start(3);
    let (_, epoch) = cluster.wait_for_leader(0);
    let client = http();

    // Node 4: a broker, not in quorum.voters, so an observer.
    let voters = cluster.nodes[0].voters.clone();
    let mut observer = Node::new(4, cluster._dir.path().join("node-4"), ports::free_port(), voters);
    observer.extra_args = vec!["--set".into(), r#"node.roles=["broker"]"#.into()];
    observer.start();
    cluster.nodes.push(observer);

    // Every running node, the observer included, agrees on one leader.
    let (leader, epoch) = cluster.wait_for_leader(epoch - 1);
    let q = cluster.node_ref(4).quorum().unwrap();
    assert_eq!(q["role"], "observer", "{q}");
    assert_eq!(q["leader_id"], json!(leader), "{q}");
    wait_until("the leader does not list node 4 as an observer", &cluster, || {
        cluster
            .node_ref(leader)
            .quorum()
            .is_some_and(|q| replica_ids(&q, "observers") == vec![4])
    });
    let leader_view = cluster.node_ref(leader).quorum().unwrap();
    assert_eq!(replica_ids(&leader_view, "voters"), vec![1, 2, 3], "{leader_view}");

    // Appends through the voters, then through the observer: a broker's
    // append is forwarded to the leader like a follower's, and answered at commit.
    let mut acked: BTreeMap<i64, String> = BTreeMap::new();
    for i in 0..15 {
        let via = &cluster.nodes[i % 3];
        let value = format!("voter-{i}");
        match append(&client, via.http_port, &value) {
            Some(offset) => acked.insert(offset, value),
            None => cluster.fail(&format!("append {i} via node {} failed", via.id)),
        };
    }
    let observer_http = cluster.node_ref(4).http_port;
    for i in 0..5 {
        let value = format!("via-observer-{i}");
        let (status, body) = append_raw(&client, observer_http, &value);
        if status != 200 {
            cluster.fail(&format!("append via the observer answered {status}: {body}"));
        }
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert!(answer["epoch"].as_i64().unwrap() >= epoch, "{answer}");
        acked.insert(answer["base_offset"].as_i64().unwrap(), value);
    }
    let target_hw = acked.keys().last().unwrap() + 1;
    wait_for_observer_to_converge(&cluster, 4, leader, target_hw);
    let (_, observer_log) = read_log(cluster.node_ref(4));
    assert_log_holds(&observer_log, &acked, "observer");
    // Still an observer, never a voter, after all that traffic.
    let q = cluster.node_ref(4).quorum().unwrap();
    assert_eq!(q["role"], "observer", "{q}");

    // kill -9 of the observer: commits go on (it is not part of any majority).
    cluster.node(4).kill9();
    for i in 0..10 {
        let via = &cluster.nodes[i % 3];
        let value = format!("observer-dead-{i}");
        match append(&client, via.http_port, &value) {
            Some(offset) => acked.insert(offset, value),
            None => cluster.fail(&format!("append {i} via node {} failed with the observer dead", via.id)),
        };
    }

    // Restarted on its data, it catches up, including what it missed.
    cluster.node(4).start();
    let (leader, _) = cluster.wait_for_leader(epoch - 1);
    let target_hw = acked.keys().last().unwrap() + 1;
    wait_for_observer_to_converge(&cluster, 4, leader, target_hw);
    let (_, observer_log) = read_log(cluster.node_ref(4));
    assert_log_holds(&observer_log, &acked, "restarted observer");

    // Never votes: with two of the three voters dead, the last voter and the
    // observer are no majority, so no leader can be elected. Any leader would
    // mean the observer granted a vote.
    let survivor = (1..=3)
        .find(|id| *id != leader && cluster.node_ref(*id).quorum().is_some_and(|q| q["role"] != "leader"))
        .unwrap_or_else(|| cluster.fail("no voter but the leader is a follower"));
    for id in 1..=3 {
        if id != survivor {
            cluster.node(id).kill9();
        }
    }
    let window = Instant::now() + Duration::from_secs(4);
    while Instant::now() < window {
        for id in [survivor, 4] {
            if let Some(q) = cluster.node_ref(id).quorum() {
                if q["role"] == "leader" {
                    cluster.fail(&format!("node {id} became leader with one voter and one observer: {q}"));
                }
                if id == 4 && q["role"] != "observer" {
                    cluster.fail(&format!("node 4 left the observer role: {q}"));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------
// Damaged and foreign data directories
// ---------------------------------------------------------------------

/// A single voter that committed rounds of appends (one batch each) and
/// was then killed with -9. A round `(count, idle_noops)` appends `count`
/// records, then waits until at least `idle_noops` idle NoOp records are
/// committed after them. Returns the cluster (its node stopped), the
/// acknowledged appends and the epoch they were written in.
fn single_node_killed_after_appends(rounds: &[(usize, usize)]) -> (Cluster, BTreeMap<i64, String>, i64) {
    let mut cluster = Cluster::start(1);
    let (_, epoch) = cluster.wait_for_leader(0);
    let client = http();
    let port = cluster.nodes[0].http_port;
    let mut acked = BTreeMap::new();
    for &(count, idle_noops) in rounds {
        for _ in 0..count {
            let value = format!("v{}", acked.len());
            let offset = append(&client, port, &value).unwrap_or_else(|| cluster.fail("append failed"));
            acked.insert(offset, value);
        }
        let last = *acked.keys().last().unwrap();
        if idle_noops > 0 {
            // The leader passes its high watermark to the store at most once a
            // second, and the store persists it with the next flush: enough
            // idle NoOps (every 500 ms) put the persisted hint past every append.
            wait_until("the idle leader appended no NoOps", &cluster, || {
                let (_, log) = read_log(&cluster.nodes[0]);
                log.range(last + 1..).filter(|(_, (kind, _))| kind == "noop").count() >= idle_noops
            });
        }
    }
    cluster.nodes[0].kill9();
    (cluster, acked, epoch)
}

/// The sled database of a stopped node, opened by the test.
fn open_sled(node: &Node) -> sled::Db {
    assert!(node.child.is_none(), "node {} is running", node.id);
    sled::open(node.data_dir.join(kraft::storage::sled_store::SLED_SUBDIR)).unwrap()
}

/// The high watermark hint the store persisted (0 if none).
fn persisted_hw_hint(db: &sled::Db) -> i64 {
    match db.open_tree("meta").unwrap().get(b"high_watermark_hint").unwrap() {
        Some(bytes) => decode_bounded::<i64>(&bytes, 64).unwrap(),
        None => 0,
    }
}

/// Every (key, value) of the `log` tree, in key (= offset) order.
fn log_values(db: &sled::Db) -> Vec<(sled::IVec, sled::IVec)> {
    db.open_tree("log").unwrap().iter().map(Result::unwrap).collect()
}

/// The batches of an undamaged `log` tree.
fn log_batches(db: &sled::Db) -> Vec<Batch> {
    log_values(db)
        .iter()
        .map(|(_, value)| {
            let batch: Batch = decode_bounded(value, 1 << 25).unwrap();
            assert!(batch.verify());
            batch
        })
        .collect()
}

/// offset → (kind, value) of the records of `batches`, as `GET /v1/log` shows them.
fn records_of(batches: &[Batch]) -> CommittedLog {
    let mut out = BTreeMap::new();
    for batch in batches {
        for (i, record) in batch.records().unwrap().into_iter().enumerate() {
            let value = match &record {
                Record::Data(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
                _ => None,
            };
            out.insert(batch.base_offset + i as i64, (record.kind().to_string(), value));
        }
    }
    out
}

/// What a torn write leaves of `value`: its first half, then zeros.
fn torn(value: &[u8]) -> Vec<u8> {
    let mut torn = value.to_vec();
    let half = torn.len() / 2;
    torn[half..].fill(0);
    torn
}

/// Overwrites (or inserts) log values, then flushes and closes the database.
fn damage(db: sled::Db, values: Vec<(Vec<u8>, Vec<u8>)>) {
    let log = db.open_tree("log").unwrap();
    for (key, value) in values {
        log.insert(key, value).unwrap();
    }
    db.flush().unwrap();
    drop(log);
    drop(db);
}

/// The record at `offset` of `node`'s committed log, with its epoch.
fn record_at(node: &Node, offset: i64) -> Value {
    let page: Value = http()
        .get(node.url(&format!("/v1/log?from={offset}&max=1")))
        .send()
        .unwrap()
        .json()
        .unwrap();
    page["records"][0].clone()
}

/// Restarts a node whose log tail was damaged above `cut` and checks that it
/// starts, warns about the truncation at `cut`, serves exactly `kept` below
/// it, and writes its new epoch from `cut` on.
fn restart_and_check_truncation(cluster: &mut Cluster, epoch: i64, cut: i64, kept: &CommittedLog) {
    cluster.nodes[0].log.lock().unwrap().clear();
    cluster.nodes[0].start();
    let (_, new_epoch) = cluster.wait_for_leader(epoch);
    let warning = cluster.nodes[0]
        .wait_log_line(|l| l.contains("truncating the damaged tail of the log at open"))
        .unwrap_or_else(|| cluster.fail("no warning about the truncated tail"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains(&format!("offset={cut}")), "{warning}");
    wait_until("the restarted node did not commit past the cut", cluster, || {
        read_log(&cluster.nodes[0]).0 > cut
    });
    let (_, log) = read_log(&cluster.nodes[0]);
    let below: CommittedLog = log.range(..cut).map(|(k, v)| (*k, v.clone())).collect();
    assert_eq!(&below, kept, "the log below the cut is exactly what was on disk");
    // The damaged bytes are never served: the cut is where the new epoch starts.
    let first_new = record_at(&cluster.nodes[0], cut);
    assert_eq!(first_new["offset"], json!(cut), "{first_new}");
    assert_eq!(first_new["kind"], "leader_change", "{first_new}");
    assert_eq!(first_new["epoch"], json!(new_epoch), "{first_new}");
}

/// The last batch of the log is always at or above the persisted high
/// watermark hint: the leader passes the hint to the store at most once a
/// second, only for offsets already flushed, and the store persists it with
/// the *next* flush, which only happens after an append. So damage to the
/// last value is taken for a torn tail and cut at open, with a warning, even
/// though that batch was acknowledged (here: the last append, `v19`, whose
/// loss is the documented cost of damage above the hint on a single node).
/// Everything before it survives, byte for byte, including the appends above
/// the hint that were not damaged.
#[test]
fn a_torn_log_tail_is_truncated_at_restart_and_nothing_committed_is_lost() {
    // The first ten appends are below the persisted hint, the last ten above it.
    let (mut cluster, acked, epoch) = single_node_killed_after_appends(&[(10, 6), (10, 0)]);
    let db = open_sled(&cluster.nodes[0]);
    let hint = persisted_hw_hint(&db);
    let batches = log_batches(&db);
    let last = batches.last().unwrap().clone();
    let tenth = *acked.keys().nth(9).unwrap();
    assert!(
        hint > tenth,
        "the persisted hint {hint} does not cover the append at {tenth}"
    );
    assert!(
        hint <= last.base_offset,
        "the persisted hint {hint} covers the last batch at {}",
        last.base_offset
    );
    let kept = records_of(&batches[..batches.len() - 1]);
    let (last_key, last_value) = log_values(&db).pop().unwrap();
    eprintln!(
        "damaging the last batch at {} ({:?}); persisted hint {hint}",
        last.base_offset,
        last.records().unwrap()
    );
    damage(db, vec![(last_key.to_vec(), torn(&last_value))]);

    restart_and_check_truncation(&mut cluster, epoch, last.base_offset, &kept);
    let (_, log) = read_log(&cluster.nodes[0]);
    for (offset, value) in acked.range(..last.base_offset) {
        assert_eq!(
            log.get(offset),
            Some(&("data".to_string(), Some(value.clone()))),
            "acknowledged append at {offset}"
        );
    }
}

/// A torn write of a batch that was never acknowledged: a value past the end
/// of the log. It is cut at open and every acknowledged append survives.
#[test]
fn a_torn_batch_past_the_log_end_is_truncated_and_every_acknowledged_append_survives() {
    let (mut cluster, acked, epoch) = single_node_killed_after_appends(&[(20, 0)]);
    let db = open_sled(&cluster.nodes[0]);
    let batches = log_batches(&db);
    let end = batches.last().unwrap().next_offset();
    let kept = records_of(&batches);
    let never_written = Batch::new(end, epoch as i32, &[Record::Data(b"never acknowledged".to_vec())]);
    damage(db, vec![(end.to_be_bytes().to_vec(), torn(&encode(&never_written)))]);

    restart_and_check_truncation(&mut cluster, epoch, end, &kept);
    let (_, log) = read_log(&cluster.nodes[0]);
    assert_log_holds(&log, &acked, "acknowledged append");
}

/// Damage that a torn tail cannot explain refuses to start, and removes nothing:
/// a damaged batch with valid batches after it, and a damaged tail that
/// reaches below the persisted high watermark hint.
#[test]
fn damage_below_the_high_watermark_hint_refuses_to_start_and_removes_nothing() {
    let (mut cluster, acked, _) = single_node_killed_after_appends(&[(20, 6)]);
    let db = open_sled(&cluster.nodes[0]);
    let hint = persisted_hw_hint(&db);
    let values = log_values(&db);
    let batches = log_batches(&db);
    let first_data = *acked.keys().next().unwrap();
    let last_data = *acked.keys().last().unwrap();
    assert!(
        hint > last_data,
        "the persisted hint {hint} does not cover the last append at {last_data}"
    );
    let victim = batches.iter().position(|b| b.base_offset == first_data).unwrap();
    drop(db);

    let refuse = |cluster: &mut Cluster, expected: &[&str]| {
        cluster.nodes[0].log.lock().unwrap().clear();
        cluster.nodes[0].start();
        let status = cluster.nodes[0]
            .wait_exit()
            .unwrap_or_else(|| cluster.fail("a node with a damaged log did not exit"));
        assert_eq!(status.code(), Some(1), "{}", cluster.nodes[0].log_tail());
        let line = cluster.nodes[0]
            .wait_log_line(|l| l.contains("cannot start"))
            .unwrap_or_else(|| cluster.fail("no start error"));
        assert!(
            line.contains(&format!("corrupt log batch at offset {first_data}")),
            "{line}"
        );
        for what in expected {
            assert!(line.contains(what), "{what:?} not in {line}");
        }
    };

    // One damaged batch with valid ones after it.
    let db = open_sled(&cluster.nodes[0]);
    let (key, value) = &values[victim];
    damage(db, vec![(key.to_vec(), torn(value))]);
    refuse(&mut cluster, &["a valid batch follows"]);

    // Everything from there to the end damaged: a "tail", but committed.
    let db = open_sled(&cluster.nodes[0]);
    let rest = values[victim..].iter().map(|(k, v)| (k.to_vec(), torn(v))).collect();
    damage(db, rest);
    refuse(&mut cluster, &["below the high watermark hint"]);

    // Nothing was removed: every key is still there, and the undamaged
    // batches below the damage are intact.
    let db = open_sled(&cluster.nodes[0]);
    let after = log_values(&db);
    assert_eq!(
        after.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        values.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>()
    );
    assert_eq!(&after[..victim], &values[..victim]);
    assert_eq!(persisted_hw_hint(&db), hint);
}

#[test]
fn a_data_dir_from_another_cluster_is_refused() {
    let mut cluster = Cluster::start(1);
    cluster.wait_for_leader(0);
    let status = cluster.nodes[0]
        .sigterm()
        .unwrap_or_else(|| cluster.fail("SIGTERM did not stop the node"));
    assert!(status.success(), "graceful shutdown exits 0: {status:?}");

    cluster.nodes[0].log.lock().unwrap().clear();
    cluster.nodes[0].extra_args = vec!["--set".into(), "node.cluster_id=other".into()];
    cluster.nodes[0].start();
    let status = cluster.nodes[0]
        .wait_exit()
        .unwrap_or_else(|| cluster.fail("a node on another cluster's data dir did not exit"));
    assert_eq!(status.code(), Some(1), "{}", cluster.nodes[0].log_tail());
    let line = cluster.nodes[0]
        .wait_log_line(|l| l.contains("cannot start"))
        .unwrap_or_else(|| cluster.fail("no start error"));
    assert!(line.contains("\"kraft-local\""), "{line}");
    assert!(line.contains("\"other\""), "{line}");

    // The directory still belongs to the first cluster: it starts again with it.
    cluster.nodes[0].extra_args.clear();
    cluster.nodes[0].start();
    cluster.wait_for_leader(0);
}

/// Issue 3's process test: a follower killed with `kill -9` while the others
/// write, snapshot (`kraft snapshot`, the CLI) and compact their logs past
/// its log end is restarted and catches up through FetchSnapshot; every
/// record is still readable on it from offset 0.
#[test]
fn a_node_restarted_behind_the_log_start_catches_up_through_a_snapshot() {
    restart_behind_the_log_start(false);
}

/// The same on a full disk: the follower cannot receive the snapshot, says
/// so and fetches it again; once space returns it installs it and catches
/// up, with the same log as the leader.
#[test]
fn a_snapshot_install_on_a_full_disk_is_retried_until_space_returns() {
    if !Tmpfs::can_mount() {
        return;
    }
    restart_behind_the_log_start(true);
}

/// A follower stopped while the leader moves its log start past the
/// follower's log end, then started again (with `full_disk`, on a tmpfs
/// filled to within 1 MiB, less than the snapshot).
fn restart_behind_the_log_start(full_disk: bool) {
    let tmpfs: Vec<Tmpfs> = if full_disk {
        (0..3).map(|_| Tmpfs::mount("64m")).collect()
    } else {
        Vec::new()
    };
    let mut cluster = Cluster::start(3);
    for (i, node) in cluster.nodes.iter_mut().enumerate() {
        // Restarted below: compaction as soon as the cleaner runs.
        node.extra_args = vec![
            "--set".into(),
            "log.retention_bytes=1".into(),
            "--set".into(),
            "log.cleaner_interval_ms=100".into(),
        ];
        node.kill9();
        if let Some(tmpfs) = tmpfs.get(i) {
            node.data_dir = tmpfs.dir.path().join(format!("node-{}", node.id));
        }
        node.start();
    }
    let (leader, _) = cluster.wait_for_leader(0);
    let follower = leader % 3 + 1;
    let client = http();
    let leader_http = cluster.node_ref(leader).http_port;
    for i in 0..20 {
        append(&client, leader_http, &format!("before {i}")).expect("acknowledged");
    }
    cluster.node(follower).kill9();
    for i in 0..200 {
        append(&client, leader_http, &format!("while down {i}")).expect("acknowledged");
    }
    if full_disk {
        // 4 MB of records: a snapshot larger than the space left below.
        let value = "y".repeat(1000);
        for i in 0..40 {
            let records: Vec<String> = (0..100).map(|j| format!("{i}-{j}-{value}")).collect();
            let response = client
                .post(format!("http://127.0.0.1:{leader_http}/v1/append"))
                .json(&json!({ "records": records }))
                .send()
                .unwrap();
            assert!(response.status().is_success(), "{:?}", response.text());
        }
    }
    let output = Command::new(env!("CARGO_BIN_EXE_kraft"))
        .arg("snapshot")
        .args(["--set", &format!("listeners.http=127.0.0.1:{leader_http}")])
        .args([
            "--config",
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("config.toml")
                .to_str()
                .unwrap(),
        ])
        .output()
        .expect("run kraft snapshot");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let snapshot: Value = serde_json::from_slice(&output.stdout).expect("the snapshot as JSON");
    let end = snapshot["end_offset"].as_i64().unwrap();
    assert!(end >= 220 && snapshot["created"] == json!(true), "{snapshot}");
    wait_until("the leader to compact its log", &cluster, || {
        cluster
            .node_ref(leader)
            .quorum()
            .is_some_and(|q| q["log_start_offset"] == json!(end))
    });
    let last = append(&client, leader_http, "after the snapshot").expect("acknowledged");

    let filler = tmpfs.get(follower as usize - 1).map(|tmpfs| {
        let filler = tmpfs.fill();
        let file = std::fs::OpenOptions::new().write(true).open(&filler).unwrap();
        let size = file.metadata().unwrap().len();
        file.set_len(size.saturating_sub(1 << 20)).unwrap();
        filler
    });
    cluster.node(follower).start();
    if let Some(filler) = filler {
        let refused = cluster
            .node_ref(follower)
            .wait_log_line(|l| l.contains("No space left on device"))
            .unwrap_or_else(|| cluster.fail("the follower never ran out of space"));
        println!("{refused}");
        assert!(
            exit_status(cluster.node(follower)).is_none(),
            "a snapshot that does not fit stops nothing"
        );
        std::thread::sleep(Duration::from_millis(500));
        std::fs::remove_file(filler).unwrap();
    }
    wait_until("the follower to install the snapshot and catch up", &cluster, || {
        cluster
            .node_ref(follower)
            .quorum()
            .is_some_and(|q| q["log_start_offset"] == json!(end) && q["high_watermark"].as_i64().unwrap_or(0) > last)
    });
    let (_, on_leader) = read_log(cluster.node_ref(leader));
    let (_, on_follower) = read_log(cluster.node_ref(follower));
    let through_last = |log: CommittedLog| log.into_iter().filter(|(o, _)| *o <= last).collect::<CommittedLog>();
    let on_follower = through_last(on_follower);
    assert_eq!(on_follower.len() as i64, last + 1, "every offset from 0 is readable");
    assert_eq!(on_follower, through_last(on_leader));
    assert!(cluster
        .node_ref(follower)
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("installed the leader's snapshot")));
}

/// How the process exited (None while it runs), without waiting.
fn exit_status(node: &mut Node) -> Option<std::process::ExitStatus> {
    let child = node.child.as_mut().expect("node started");
    child.try_wait().unwrap()
}

/// sled writes its `conf` file once, at a node's very first start. A node
/// killed during that write must start again: sled wrote the settings and
/// then their CRC into `conf` itself, and a process killed between the two
/// writes left a file every later start refused as corrupted (seen once in
/// `a_node_restarted_behind_the_log_start_catches_up_through_a_snapshot`,
/// whose nodes are killed right after their first start). strace kills the
/// process at exactly the n-th write to the file.
#[test]
fn a_node_killed_while_sled_writes_its_conf_file_starts_again() {
    require_strace();
    for (file, nth_write) in [("conf", 1), ("conf", 2), ("conf.tmp", 1), ("conf.tmp", 2)] {
        let dir = tempfile::tempdir().unwrap();
        // strace matches a file that does not exist yet by its path as
        // given: no symbolic link on the way, or nothing is ever killed.
        let root = dir.path().canonicalize().unwrap();
        let raft_port = ports::free_port();
        let voters = format!("[\"1@127.0.0.1:{raft_port}\"]");
        let mut node = Node::new(1, root.join("node-1"), raft_port, voters);
        let target = node.data_dir.join("sled").join(file);
        // -D: strace traces from a process of its own, so the child here
        // is kraft itself and kill9 stops it.
        node.launcher = [
            "strace",
            "-D",
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-P",
            target.to_str().unwrap(),
            "-e",
            "trace=write",
            "-e",
            &format!("inject=write:signal=KILL:when={nth_write}"),
        ]
        .map(String::from)
        .to_vec();
        node.start();
        // Killed at that write, or started if sled never writes the file so
        // (`conf` itself is only ever renamed into place now).
        let deadline = Instant::now() + WAIT;
        let exit = loop {
            let exit = exit_status(&mut node);
            if exit.is_some() || node.log.lock().unwrap().iter().any(|l| l.contains("node started")) {
                break exit;
            }
            assert!(Instant::now() < deadline, "{}", node.log_tail());
            std::thread::sleep(Duration::from_millis(20));
        };
        if file == "conf.tmp" {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                exit.and_then(|status| status.signal()),
                Some(libc::SIGKILL),
                "strace did not kill the node at write {nth_write} to sled/{file}:\n{}",
                node.log_tail()
            );
        }
        node.kill9();

        // Only what the restarted process says counts.
        node.log.lock().unwrap().clear();
        node.launcher.clear();
        node.start();
        let started = node.wait_log_line(|l| l.contains("node started") || l.contains("cannot start"));
        assert!(
            started.as_deref().is_some_and(|l| l.contains("node started")),
            "killed at write {nth_write} to sled/{file} during its first start, the node does not start again:\n{}",
            node.log_tail()
        );
        node.kill9();
    }
}

/// Whether strace is there; the tests that need it fail without it.
fn require_strace() {
    let strace = Command::new("strace").arg("-V").output();
    assert!(
        strace.is_ok_and(|out| out.status.success()),
        "this test needs strace (Debian: apt-get install strace; .ci/run installs it)"
    );
}

/// Waits (bounded) until every thread of process `pid` is traced by
/// `strace`.
fn wait_until_traced(pid: u32, strace: &mut Child) {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = strace.try_wait().unwrap() {
            panic!(
                "strace -p {pid} exited ({status}): attaching to a process that is not its \
                 child needs root or kernel.yama.ptrace_scope=0"
            );
        }
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let untraced = tasks.filter_map(Result::ok).any(|task| {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            status
                .lines()
                .any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) == Some("0"))
        });
        if !untraced {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "strace did not attach to every thread of {pid}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A durability point whose fdatasync fails (EIO: the kernel may have
/// dropped the dirty pages it could not write, so a later fsync proves
/// nothing) must acknowledge nothing and stop the node, which restarts
/// with every append it acknowledged before. strace, attached to the
/// running node, makes every fdatasync fail from then on.
#[test]
fn a_failed_fdatasync_acknowledges_nothing_and_stops_the_node() {
    require_strace();
    let mut cluster = Cluster::start(1);
    // No NoOp of an idle leader: the append below is what the failing
    // durability point is for.
    cluster.nodes[0].extra_args = ["--set", "metadata.max_idle_interval_ms=3600000"]
        .map(String::from)
        .to_vec();
    cluster.nodes[0].kill9();
    cluster.nodes[0].start();
    let (_, epoch) = cluster.wait_for_leader(0);
    let client = http();
    let port = cluster.nodes[0].http_port;
    let mut acked = BTreeMap::new();
    for i in 0..10 {
        let value = format!("v{i}");
        let offset = append(&client, port, &value).unwrap_or_else(|| cluster.fail("append failed"));
        acked.insert(offset, value);
    }

    let pid = cluster.nodes[0].child.as_ref().unwrap().id();
    let mut strace = Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null", "-p", &pid.to_string()])
        .args(["-e", "trace=fdatasync", "-e", "inject=fdatasync:error=EIO"])
        .spawn()
        .expect("start strace");
    wait_until_traced(pid, &mut strace);
    let (status, body) = append_raw(&client, port, "never acknowledged");
    let exit = cluster.nodes[0].wait_exit();
    let _ = strace.kill();
    let _ = strace.wait();
    assert_ne!(
        status, 200,
        "an append whose durability point failed was acknowledged: {body}"
    );
    assert!(
        exit.is_some_and(|status| !status.success()),
        "the node goes on after a failed fdatasync ({exit:?}):\n{}",
        cluster.nodes[0].log_tail()
    );
    assert!(
        cluster.nodes[0]
            .wait_log_line(|l| l.contains("Fatal") && l.contains("flush"))
            .is_some(),
        "{}",
        cluster.nodes[0].log_tail()
    );

    cluster.nodes[0].start();
    cluster.wait_for_leader(epoch);
    let log = recommitted_log(&cluster, &acked);
    assert_log_holds(&log, &acked, "acknowledged append");
}

/// A tmpfs of `size` mounted on a new directory, unmounted when dropped:
/// a disk that really fills up. Mounting needs root (CI runs as root);
/// without it the tests that need one say so and skip.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn can_mount() -> bool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("skipped: this test mounts a small tmpfs, which needs root");
        }
        root
    }

    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "kraft-test"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs, which needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    /// Fills what is left of the file system with one file; returns it.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.dir.path().join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5a; 64 * 1024];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        // Also what a smaller write could still take.
        while file.write(&[0x5a; 512]).is_ok_and(|n| n > 0) {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

fn post_snapshot(client: &reqwest::blocking::Client, node: &Node) -> (u16, String) {
    match client.post(node.url("/v1/snapshot")).send() {
        Ok(response) => (response.status().as_u16(), response.text().unwrap_or_default()),
        Err(e) => (0, format!("request failed: {e}")),
    }
}

/// A full disk (a tmpfs filled by another file): a snapshot cannot be
/// written and the node says so and goes on; an append cannot be made
/// durable, so it is not acknowledged and the node stops loudly. Once
/// space returns the node starts again with every append it acknowledged,
/// takes new ones and writes its snapshot.
#[test]
fn a_full_disk_acknowledges_nothing_more_loses_nothing_and_recovers_once_space_returns() {
    if !Tmpfs::can_mount() {
        return;
    }
    let tmpfs = Tmpfs::mount("64m");
    let mut cluster = Cluster::start(1);
    cluster.nodes[0].kill9();
    cluster.nodes[0].data_dir = tmpfs.dir.path().join("node-1");
    cluster.nodes[0].extra_args = ["--set", "metadata.max_idle_interval_ms=3600000"]
        .map(String::from)
        .to_vec();
    cluster.nodes[0].start();
    let (_, epoch) = cluster.wait_for_leader(0);
    let client = http();
    let port = cluster.nodes[0].http_port;
    let mut acked = BTreeMap::new();
    let value = "x".repeat(1000);
    for i in 0..300 {
        let value = format!("{i}-{value}");
        let offset = append(&client, port, &value).unwrap_or_else(|| cluster.fail("append failed"));
        acked.insert(offset, value);
    }

    let filler = tmpfs.fill();
    let (status, body) = post_snapshot(&client, &cluster.nodes[0]);
    assert_ne!(status, 200, "a snapshot on a full disk: {body}");
    assert!(body.contains("No space left on device"), "{status} {body}");
    assert!(
        cluster.nodes[0].child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "a failed snapshot stops nothing:\n{}",
        cluster.nodes[0].log_tail()
    );
    assert_log_holds(&read_log(&cluster.nodes[0]).1, &acked, "read on a full disk");

    // What still fits in space sled's file already holds is durable and
    // acknowledged; the first append that needs more is refused.
    let mut refused = None;
    for i in 0..20_000 {
        let value = format!("full-{i}-{value}");
        match append_raw(&client, port, &value) {
            (200, body) => {
                let answer: Value = serde_json::from_str(&body).unwrap();
                acked.insert(answer["base_offset"].as_i64().unwrap(), value);
            }
            (status, body) => {
                refused = Some((status, body, value));
                break;
            }
        }
    }
    let (status, body, refused) = refused.unwrap_or_else(|| cluster.fail("20,000 appends of 1 KB fit on a full disk"));
    assert!(status == 500 || status == 503 || status == 0, "{status} {body}");
    println!(
        "{} appends acknowledged, the last {} on the full disk; then {status} {body}",
        acked.len(),
        acked.len() - 300
    );
    let exit = cluster.nodes[0].wait_exit();
    assert!(
        exit.is_some_and(|status| !status.success()),
        "the node goes on after a failed write ({exit:?}):\n{}",
        cluster.nodes[0].log_tail()
    );
    assert!(
        cluster.nodes[0]
            .wait_log_line(|l| l.contains("FATAL") && l.contains("No space left on device"))
            .inspect(|line| println!("{line}"))
            .is_some(),
        "{}",
        cluster.nodes[0].log_tail()
    );

    std::fs::remove_file(filler).unwrap();
    cluster.nodes[0].start();
    cluster.wait_for_leader(epoch);
    let log = recommitted_log(&cluster, &acked);
    assert_log_holds(&log, &acked, "acknowledged append");
    let unacknowledged: Vec<_> = log
        .iter()
        .filter(|(offset, (kind, _))| kind == "data" && !acked.contains_key(offset))
        .map(|(_, (_, value))| value.clone().unwrap_or_default())
        .collect();
    assert!(
        unacknowledged.is_empty() || unacknowledged == [refused],
        "only the refused append may be there besides the acknowledged ones: {} others",
        unacknowledged.len()
    );
    for i in 0..10 {
        let value = format!("after-{i}");
        let offset = append(&client, port, &value).unwrap_or_else(|| cluster.fail("append after recovery"));
        acked.insert(offset, value);
    }
    let (status, body) = post_snapshot(&client, &cluster.nodes[0]);
    assert_eq!(status, 200, "{body}");
    assert_log_holds(&read_log(&cluster.nodes[0]).1, &acked, "acknowledged append");
    cluster.nodes[0].kill9();
}

// ---------------------------------------------------------------------
// The metadata layer on real processes
// ---------------------------------------------------------------------

/// What every node of a metadata cluster is started with.
const METADATA_SETS: [&str; 4] = [
    "node.state_machine=metadata",
    "broker.heartbeat_interval_ms=300",
    "broker.session_timeout_ms=2000",
    "metadata.max_idle_interval_ms=200",
];

fn get_json(node: &Node, path: &str) -> Option<Value> {
    http().get(node.url(path)).send().ok()?.json().ok()
}

/// `POST` (or `method`) a JSON body; (status, body).
fn send_json(node: &Node, method: reqwest::Method, path: &str, body: Value) -> Option<(u16, Value)> {
    let response = http().request(method, node.url(path)).json(&body).send().ok()?;
    let status = response.status().as_u16();
    Some((status, response.json().ok()?))
}

/// The brokers of `node`'s image, by id: (fenced, in_controlled_shutdown).
fn brokers_of(node: &Node) -> BTreeMap<i64, (bool, bool)> {
    let Some(brokers) = get_json(node, "/v1/brokers") else {
        return BTreeMap::new();
    };
    brokers["brokers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            let flag = |key: &str| b[key].as_bool().unwrap_or(false);
            (
                b["id"].as_i64().unwrap(),
                (flag("fenced"), flag("in_controlled_shutdown")),
            )
        })
        .collect()
}

/// The partitions of `topic` as `node` shows them: (leader, isr).
fn partitions_of(node: &Node, topic: &str) -> Vec<(i64, Vec<i64>)> {
    let Some(topic) = get_json(node, &format!("/v1/topics/{topic}")) else {
        return Vec::new();
    };
    topic["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let isr = p["isr"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_i64().unwrap())
                .collect();
            (p["leader"].as_i64().unwrap(), isr)
        })
        .collect()
}

/// A node's image without the offset and epoch it reflects (NoOps move
/// those on every node at its own pace).
fn image_content(node: &Node) -> Option<Value> {
    let mut image = get_json(node, "/v1/image")?;
    let object = image.as_object_mut()?;
    object.remove("offset");
    object.remove("epoch");
    // Each topic shows the offset of the image it was read from too.
    for topic in object.get_mut("topics")?.as_array_mut()? {
        topic.as_object_mut()?.remove("offset");
    }
    Some(image)
}

#[test]
fn three_controllers_and_three_brokers_fence_fail_over_and_agree_on_the_image() {
    let mut sets = METADATA_SETS.to_vec();
    sets.push(r#"node.roles=["controller"]"#);
    let mut cluster = Cluster::start_with(3, &sets);
    let (_, epoch) = cluster.wait_for_leader(0);
    let voters = cluster.nodes[0].voters.clone();
    for (id, rack) in [(4, "a"), (5, "b"), (6, "c")] {
        let mut broker = Node::new(
            id,
            cluster._dir.path().join(format!("node-{id}")),
            ports::free_port(),
            voters.clone(),
        );
        broker.extra_args = METADATA_SETS
            .iter()
            .map(|s| s.to_string())
            .chain([
                r#"node.roles=["broker"]"#.to_string(),
                format!("broker.rack=rack-{rack}"),
            ])
            .flat_map(|set| ["--set".to_string(), set])
            .collect();
        broker.start();
        cluster.nodes.push(broker);
    }
    wait_until("the three brokers registered and unfenced", &cluster, || {
        let brokers = brokers_of(cluster.node_ref(1));
        [4, 5, 6].iter().all(|id| brokers.get(id) == Some(&(false, false)))
    });

    // A topic created through a broker is placed across all three.
    let created = send_json(
        cluster.node_ref(5),
        reqwest::Method::POST,
        "/v1/topics",
        json!({"name": "orders", "partitions": 6, "replication_factor": 3}),
    );
    let (status, topic) = created.unwrap_or_else(|| cluster.fail("no answer to the topic creation"));
    assert_eq!(status, 200, "{topic}");
    for partition in topic["partitions"].as_array().unwrap() {
        let mut replicas: Vec<i64> = partition["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_i64().unwrap())
            .collect();
        replicas.sort();
        assert_eq!(replicas, vec![4, 5, 6], "{topic}");
    }

    // kill -9 of a broker: fenced within its session, out of every ISR,
    // leading nothing.
    cluster.node(4).kill9();
    wait_until("broker 4 fenced and its partitions moved", &cluster, || {
        let fenced = brokers_of(cluster.node_ref(1)).get(&4).is_some_and(|b| b.0);
        let partitions = partitions_of(cluster.node_ref(1), "orders");
        fenced && partitions.len() == 6 && partitions.iter().all(|(leader, isr)| *leader != 4 && !isr.contains(&4))
    });

    // kill -9 of the active controller: the next one fences and creates.
    let (leader, epoch) = cluster.wait_for_leader(epoch - 1);
    cluster.node(leader).kill9();
    let (_, _) = cluster.wait_for_leader(epoch);
    wait_until("a topic created through the new active controller", &cluster, || {
        send_json(
            cluster.node_ref(6),
            reqwest::Method::POST,
            "/v1/topics",
            json!({"name": "payments", "partitions": 3, "replication_factor": 2}),
        )
        .is_some_and(|(status, _)| status == 200 || status == 409)
    });
    let brokers = brokers_of(cluster.node_ref(6));
    assert_eq!(
        brokers.get(&5),
        Some(&(false, false)),
        "the new controller kept broker 5's session"
    );
    assert!(brokers.get(&4).is_some_and(|b| b.0), "broker 4 stays fenced");

    // SIGTERM of a broker: a controlled shutdown, then exit 0.
    let status = cluster
        .node(5)
        .sigterm()
        .unwrap_or_else(|| cluster.fail("broker 5 did not stop"));
    assert!(status.success(), "broker 5 exited with {status}");
    let survivor = cluster
        .nodes
        .iter()
        .find(|n| n.child.is_some() && n.id <= 3)
        .unwrap()
        .id;
    wait_until("broker 5 in controlled shutdown, leading nothing", &cluster, || {
        let shutting = brokers_of(cluster.node_ref(survivor)).get(&5).is_some_and(|b| b.1);
        shutting
            && partitions_of(cluster.node_ref(survivor), "orders")
                .iter()
                .all(|(leader, _)| *leader != 5)
    });

    // Every running node holds the same image.
    wait_until("every running node's image to agree", &cluster, || {
        let images: Vec<Option<Value>> = cluster
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(image_content)
            .collect();
        images[0].is_some() && images.iter().all(|i| *i == images[0])
    });
}
