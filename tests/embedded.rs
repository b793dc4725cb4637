//! Embedding: whole nodes (actors, storage thread, raft listener) started
//! with `kraft::node::start` inside one actix System, talking over loopback.
//!
//! Waits poll with a bound (at most [`WAIT`]) and never assert on timings.

mod ports;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use kraft::config::Config;
use kraft::messages::Record;
use kraft::node::{
    self, AppendError, Appended, Committed, CommittedRecord, LeaderChanged, Listener, NodeHandle, QuorumStatus,
};
use kraft::raft::{Epoch, NodeId, Offset};

/// Longest any condition is waited for.
const WAIT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(25);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Free loopback ports, each handed out once in this process.
fn free_ports(n: usize) -> Vec<u16> {
    (0..n).map(|_| ports::free_port()).collect()
}

/// A controller of a quorum whose voter `i + 1` listens on `ports[i]`, with
/// short timeouts.
fn controller_config(id: NodeId, ports: &[u16], data_dir: &Path) -> Config {
    let mut config = Config::default();
    config.node.state_machine = kraft::config::StateMachineKind::Log;
    config.node.roles = vec![kraft::config::NodeRole::Controller];
    let voters: BTreeMap<NodeId, String> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| (i as NodeId + 1, format!("127.0.0.1:{port}")))
        .collect();
    config.node.id = id;
    config.node.cluster_id = "embedded-test".to_string();
    config.node.data_dir = data_dir.to_path_buf();
    config.listeners.raft = voters[&id].parse::<SocketAddr>().unwrap();
    config.listeners.http = "127.0.0.1:0".parse().unwrap();
    config.quorum.voters = voters;
    config.quorum.election_timeout_ms = 300;
    config.quorum.fetch_timeout_ms = 600;
    config.quorum.request_timeout_ms = 1000;
    config.quorum.retry_backoff_ms = 20;
    config.quorum.election_backoff_max_ms = 300;
    config.metadata.max_idle_interval_ms = 200;
    config
}

/// Polls `probe` until it yields a value, for at most [`WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The index of the node every running node agrees is the leader, with its
/// epoch and status.
async fn agreed_leader(nodes: &[Option<NodeHandle>], newer_than: Epoch) -> (usize, Epoch) {
    eventually("a leader all running nodes agree on", || async {
        let mut statuses: Vec<(usize, QuorumStatus)> = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            if let Some(node) = node {
                statuses.push((i, node.describe().await.ok()?));
            }
        }
        let (leader, status) = statuses.iter().find(|(_, s)| s.role == "leader")?;
        let epoch = status.leader_epoch;
        let agreed = statuses
            .iter()
            .all(|(_, s)| s.leader_epoch == epoch && s.leader_id == Some(status.node_id));
        (agreed && epoch > newer_than).then_some((*leader, epoch))
    })
    .await
}

// ---------------------------------------------------------------------
// A listener that records what it is given
// ---------------------------------------------------------------------

/// A leader change and the last record offset delivered before it.
type Announcement = (LeaderChanged, Option<Offset>);

#[derive(Clone, Default)]
struct Seen {
    committed: Arc<Mutex<Vec<CommittedRecord>>>,
    /// Each leader change with the last record offset delivered before it.
    leaders: Arc<Mutex<Vec<Announcement>>>,
    /// High watermarks in delivery order.
    high_watermarks: Arc<Mutex<Vec<Offset>>>,
}

impl Seen {
    fn records(&self) -> Vec<CommittedRecord> {
        self.committed.lock().unwrap().clone()
    }

    fn leaders(&self) -> Vec<LeaderChanged> {
        self.leaders.lock().unwrap().iter().map(|(c, _)| c.clone()).collect()
    }

    /// The last record offset delivered before `change` was, if it was.
    fn announced_after(&self, change: &LeaderChanged) -> Option<Option<Offset>> {
        self.leaders
            .lock()
            .unwrap()
            .iter()
            .find(|(c, _)| c == change)
            .map(|(_, at)| *at)
    }
}

struct Collector(Seen);

impl Actor for Collector {
    type Context = Context<Self>;
}

impl Handler<Committed> for Collector {
    type Result = ();

    fn handle(&mut self, msg: Committed, _ctx: &mut Self::Context) {
        assert!(
            msg.records.iter().all(|r| r.offset < msg.high_watermark),
            "only committed records are delivered: {msg:?}"
        );
        self.0.high_watermarks.lock().unwrap().push(msg.high_watermark);
        self.0.committed.lock().unwrap().extend(msg.records);
    }
}

impl Handler<LeaderChanged> for Collector {
    type Result = ();

    fn handle(&mut self, msg: LeaderChanged, _ctx: &mut Self::Context) {
        let last = self.0.committed.lock().unwrap().last().map(|r| r.offset);
        self.0.leaders.lock().unwrap().push((msg, last));
    }
}

async fn register_collector(node: &NodeHandle) -> Seen {
    let seen = Seen::default();
    let collector = Collector(seen.clone()).start();
    node.register_listener(Listener {
        committed: collector.clone().recipient(),
        leader_changed: Some(collector.recipient()),
        load_snapshot: None,
    })
    .await
    .expect("listener registered");
    seen
}

/// Waits until `seen` has every record up to `last` (inclusive).
async fn seen_through(seen: &Seen, last: Offset) -> Vec<CommittedRecord> {
    eventually(&format!("a listener to receive offset {last}"), || async {
        let records = seen.records();
        records.last().filter(|r| r.offset >= last).map(|_| records.clone())
    })
    .await
}

/// Every committed record from offset 0 through `last`, page by page, once
/// `node` knows they are committed.
async fn read_through(node: &NodeHandle, last: Offset) -> Vec<kraft::node::LogEntry> {
    eventually(
        &format!("node {} to know offset {last} is committed", node.node_id()),
        || async { (node.describe().await.ok()?.high_watermark > last).then_some(()) },
    )
    .await;
    let mut records: Vec<kraft::node::LogEntry> = Vec::new();
    while records.last().is_none_or(|r| r.offset < last) {
        let from = records.last().map_or(0, |r| r.offset + 1);
        let page = node.read_committed(from, 1000).await.expect("a committed read");
        assert_eq!(
            page.records.first().map(|r| r.offset),
            Some(from),
            "pages are contiguous"
        );
        records.extend(page.records);
    }
    records.truncate(last as usize + 1);
    records
}

fn data(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

/// Three voters on fresh ports and data directories. The directories are
/// deleted when the returned `TempDir`s drop: keep them until the nodes
/// have shut down.
async fn start_cluster() -> (Vec<tempfile::TempDir>, Vec<Option<NodeHandle>>) {
    let ports = free_ports(3);
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let config = controller_config(i as NodeId + 1, &ports, dir.path());
        nodes.push(Some(node::start(config).await.expect("node starts")));
    }
    (dirs, nodes)
}

async fn shutdown_all(nodes: &mut [Option<NodeHandle>]) {
    for node in nodes.iter_mut() {
        if let Some(node) = node.take() {
            node.shutdown().await;
        }
    }
}

// ---------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------

#[actix_rt::test]
async fn three_nodes_elect_a_leader_and_commit_appends_from_any_node_to_every_listener() {
    init_tracing();
    let (_dirs, mut nodes) = start_cluster().await;
    let mut seen = Vec::new();
    for node in nodes.iter().flatten() {
        seen.push(register_collector(node).await);
    }

    let (leader, epoch) = agreed_leader(&nodes, 0).await;
    let leader_id = leader as NodeId + 1;
    let follower = (leader + 1) % 3;

    let on_leader = nodes[leader]
        .as_ref()
        .unwrap()
        .append(vec![data("a"), data("b")])
        .await
        .expect("append on the leader");
    assert_eq!(on_leader.last_offset, on_leader.base_offset + 1);
    let forwarded = nodes[follower]
        .as_ref()
        .unwrap()
        .append(vec![data("c")])
        .await
        .expect("append forwarded by a follower");
    assert!(
        forwarded.base_offset > on_leader.last_offset,
        "{forwarded:?} after {on_leader:?}"
    );
    let on_other = nodes[(leader + 2) % 3]
        .as_ref()
        .unwrap()
        .append(vec![data("d")])
        .await
        .expect("append forwarded");

    // Every listener receives the same committed sequence, LeaderChange
    // included, and the appends at the offsets they were acknowledged at.
    let last = on_other.last_offset;
    let sequences: Vec<Vec<CommittedRecord>> = {
        let mut all = Vec::new();
        for s in &seen {
            let records = seen_through(s, last).await;
            all.push(records.into_iter().filter(|r| r.offset <= last).collect::<Vec<_>>());
        }
        all
    };
    for (i, sequence) in sequences.iter().enumerate() {
        assert_eq!(sequence, &sequences[0], "listener on node {} disagrees", i + 1);
        let offsets: Vec<Offset> = sequence.iter().map(|r| r.offset).collect();
        assert_eq!(
            offsets,
            (0..=last).collect::<Vec<_>>(),
            "offsets are contiguous from the log start"
        );
    }
    let sequence = &sequences[0];
    assert!(
        sequence.iter().any(
            |r| matches!(r.record, Record::LeaderChange { leader_id: l, .. } if l == leader_id) && r.epoch == epoch
        ),
        "the LeaderChange record of epoch {epoch} is delivered"
    );
    let value_at = |offset: Offset| sequence.iter().find(|r| r.offset == offset).map(|r| r.record.clone());
    assert_eq!(value_at(on_leader.base_offset), Some(Record::Data(data("a"))));
    assert_eq!(value_at(on_leader.last_offset), Some(Record::Data(data("b"))));
    assert_eq!(value_at(forwarded.base_offset), Some(Record::Data(data("c"))));
    assert_eq!(value_at(on_other.base_offset), Some(Record::Data(data("d"))));

    for s in &seen {
        let hws = s.high_watermarks.lock().unwrap().clone();
        assert!(
            hws.windows(2).all(|w| w[0] <= w[1]),
            "high watermarks never go back: {hws:?}"
        );
    }

    // Every listener is told who leads, the leader's own once it has seen
    // the LeaderChange record.
    for (i, s) in seen.iter().enumerate() {
        eventually(&format!("node {} to announce leader {leader_id}", i + 1), || async {
            s.leaders()
                .iter()
                .any(|c| c.epoch == epoch && c.leader_id == Some(leader_id))
                .then_some(())
        })
        .await;
    }
    let leader_change_offset = sequence
        .iter()
        .find(|r| r.epoch == epoch && matches!(r.record, Record::LeaderChange { .. }))
        .map(|r| r.offset)
        .unwrap();
    assert!(leader_change_offset < on_leader.base_offset);

    // read_committed serves the same records on every node.
    for (i, node) in nodes.iter().flatten().enumerate() {
        let page = eventually("the high watermark to cover the appends", || async {
            let page = node.read_committed(0, 1000).await.ok()?;
            (page.high_watermark > last).then_some(page)
        })
        .await;
        let values: Vec<Option<String>> = page
            .records
            .iter()
            .filter(|e| e.kind == "data")
            .map(|e| e.value.clone())
            .collect();
        let expected: Vec<Option<String>> = ["a", "b", "c", "d"].iter().map(|v| Some(v.to_string())).collect();
        assert_eq!(values, expected, "node {}", i + 1);
        assert!(
            page.records.windows(2).all(|w| w[1].offset == w[0].offset + 1),
            "contiguous offsets"
        );
        assert!(page.records.iter().all(|e| e.offset < page.high_watermark));
    }

    // Concurrent appends, half of them forwarded, all commit at distinct
    // offsets.
    let burst = (0..60).map(|i| {
        let node = nodes[[leader, follower][i % 2]].clone().unwrap();
        async move { node.append(vec![data(&format!("burst-{i}"))]).await }
    });
    let mut offsets: Vec<Offset> = futures::future::join_all(burst)
        .await
        .into_iter()
        .map(|r| r.expect("a concurrent append commits").base_offset)
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(offsets.len(), 60);
    assert!(offsets[0] > last);

    // Describe on the leader lists every voter.
    let status = nodes[leader].as_ref().unwrap().describe().await.unwrap();
    assert_eq!(status.voters.len(), 3);
    let metrics = nodes[leader].as_ref().unwrap().metrics().await.unwrap();
    assert!(metrics.commits_total >= 60, "{metrics:?}");
    assert_eq!(metrics.current_leader, leader_id);

    shutdown_all(&mut nodes).await;
}

#[actix_rt::test]
async fn a_gracefully_stopped_leader_is_replaced_and_committed_records_stay_readable() {
    init_tracing();
    let (_dirs, mut nodes) = start_cluster().await;

    let (leader, epoch) = agreed_leader(&nodes, 0).await;
    let mut acknowledged: Vec<(Appended, String)> = Vec::new();
    for i in 0..5 {
        let value = format!("before-{i}");
        let appended = nodes[leader]
            .as_ref()
            .unwrap()
            .append(vec![data(&value)])
            .await
            .expect("append");
        acknowledged.push((appended, value));
    }

    let old = nodes[leader].take().unwrap();
    old.shutdown().await;
    assert!(old.is_stopped());
    old.shutdown().await; // idempotent
    assert!(matches!(
        old.append(vec![data("late")]).await,
        Err(AppendError::Unavailable(_))
    ));
    assert!(old.describe().await.is_err());

    let (new_leader, new_epoch) = agreed_leader(&nodes, epoch).await;
    assert_ne!(new_leader, leader);
    assert!(new_epoch > epoch);

    // Every acknowledged append is still there, on both survivors.
    let last = acknowledged.last().unwrap().0.last_offset;
    for node in nodes.iter().flatten() {
        let page = eventually("the survivors' high watermark to cover the old appends", || async {
            let page = node.read_committed(0, 1000).await.ok()?;
            (page.high_watermark > last).then_some(page)
        })
        .await;
        for (appended, value) in &acknowledged {
            let entry = page
                .records
                .iter()
                .find(|e| e.offset == appended.base_offset)
                .expect("acknowledged offset kept");
            assert_eq!(entry.value.as_deref(), Some(value.as_str()));
            assert_eq!(entry.epoch, appended.epoch);
        }
    }

    // The new leader takes writes, also through the other survivor.
    let other = (0..3).find(|i| *i != leader && *i != new_leader).unwrap();
    let after = nodes[other]
        .as_ref()
        .unwrap()
        .append(vec![data("after")])
        .await
        .expect("append after fail-over");
    assert_eq!(after.epoch, new_epoch);
    assert!(after.base_offset > last);

    shutdown_all(&mut nodes).await;
}

#[actix_rt::test]
async fn a_single_node_quorum_elects_itself_and_keeps_its_log_across_a_restart() {
    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();

    let node = node::start(controller_config(1, &ports, dir.path()))
        .await
        .expect("node starts");
    assert_eq!(node.node_id(), 1);
    assert_eq!(node.raft_addr().port(), ports[0]);
    let (_, first_epoch) = agreed_leader(&[Some(node.clone())], 0).await;
    let first = node.append(vec![data("one"), data("two")]).await.expect("append");
    assert_eq!(first.epoch, first_epoch);
    assert!(matches!(node.append(Vec::new()).await, Err(AppendError::Rejected(_))));
    node.shutdown().await;

    // Same data dir, new process state.
    let node = node::start(controller_config(1, &ports, dir.path()))
        .await
        .expect("node restarts");
    let seen = register_collector(&node).await;
    let (_, second_epoch) = agreed_leader(&[Some(node.clone())], first_epoch).await;
    assert!(second_epoch > first_epoch);
    let page = eventually("the restarted node's high watermark to cover the old log", || async {
        let page = node.read_committed(first.base_offset, 10).await.ok()?;
        (page.high_watermark > first.last_offset).then_some(page)
    })
    .await;
    let values: Vec<_> = page.records.iter().take(2).map(|e| e.value.clone()).collect();
    assert_eq!(values, vec![Some("one".to_string()), Some("two".to_string())]);

    let second = node.append(vec![data("three")]).await.expect("append after restart");
    assert!(second.base_offset > first.last_offset);
    assert_eq!(second.epoch, second_epoch);

    // A listener registered after the restart gets the whole log, old
    // records first, and is told of the leadership once it reached the
    // LeaderChange record of the current epoch.
    let records = seen_through(&seen, second.last_offset).await;
    let data_values: Vec<Record> = records
        .iter()
        .filter(|r| matches!(r.record, Record::Data(_)))
        .map(|r| r.record.clone())
        .collect();
    assert_eq!(
        data_values,
        vec![
            Record::Data(data("one")),
            Record::Data(data("two")),
            Record::Data(data("three"))
        ]
    );
    let leadership = LeaderChanged {
        epoch: second_epoch,
        leader_id: Some(1),
    };
    let announced_after = eventually("the listener to be told of the leadership", || async {
        seen.announced_after(&leadership)
    })
    .await;
    let leader_change_offset = records
        .iter()
        .find(|r| r.epoch == second_epoch && matches!(r.record, Record::LeaderChange { .. }))
        .map(|r| r.offset)
        .expect("the LeaderChange record of the new epoch is delivered");
    assert!(
        announced_after >= Some(leader_change_offset),
        "leadership announced after offset {announced_after:?}, before the epoch start {leader_change_offset}"
    );
    let leaders = seen.leaders();
    assert!(
        leaders.windows(2).all(|w| w[0] != w[1]),
        "no leader change is announced twice in a row: {leaders:?}"
    );
    assert!(
        leaders
            .iter()
            .all(|c| c.leader_id != Some(1) || c.epoch == second_epoch),
        "no stale leadership is announced: {leaders:?}"
    );

    node.shutdown().await;
}

#[actix_rt::test]
async fn a_data_dir_of_another_node_is_refused() {
    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(controller_config(1, &ports, dir.path()))
        .await
        .expect("node starts");
    node.shutdown().await;

    let mut other = controller_config(1, &ports, dir.path());
    other.node.cluster_id = "another-cluster".to_string();
    match node::start(other).await {
        Err(node::StartError::Storage(_)) => {}
        Err(e) => panic!("expected a storage identity error, got {e}"),
        Ok(_) => panic!("a data dir of another cluster must be refused"),
    }
}

/// A config built in code is held at start to the rules `Config::load`
/// holds a file to: among them a request timeout of 0 (a panic in the
/// request manager), 9 ms (idle followers fetching in a busy loop), an
/// election timeout that overflows the clock, and a controller missing from
/// the voters.
#[actix_rt::test]
async fn a_built_config_that_breaks_a_rule_of_the_file_is_refused_at_start() {
    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();
    type BreakRule = fn(&mut Config);
    let breaks: [(&str, BreakRule); 5] = [
        ("quorum.request_timeout_ms", |c| c.quorum.request_timeout_ms = 0),
        ("quorum.request_timeout_ms", |c| c.quorum.request_timeout_ms = 9),
        ("quorum.election_timeout_ms", |c| {
            c.quorum.election_timeout_ms = u64::MAX
        }),
        ("quorum.voters", |c| c.node.id = 7),
        ("broker.session_timeout_ms", |c| {
            c.broker.session_timeout_ms = c.broker.heartbeat_interval_ms
        }),
    ];
    for (key, mut_config) in breaks {
        let mut config = controller_config(1, &ports, dir.path());
        mut_config(&mut config);
        match node::start(config).await {
            Err(node::StartError::Config(e)) => assert_eq!(e.key(), Some(key), "{e}"),
            Err(e) => panic!("expected {key} refused, got {e}"),
            Ok(_) => panic!("a config that breaks {key} must be refused"),
        }
    }
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "a refused config must not touch the data dir"
    );
}

/// KIP-630 end to end: a follower stopped while the others write, snapshot
/// and compact their logs past its log end comes back, is sent the
/// leader's snapshot (FetchSnapshot), installs it and catches up; every
/// record stays readable everywhere, below the log start from the
/// snapshot, and a listener on the restarted node gets them all, in order.
#[actix_rt::test]
async fn a_follower_behind_the_log_start_catches_up_through_the_leaders_snapshot() {
    init_tracing();
    let ports = free_ports(3);
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let config_of = |i: usize| {
        let mut config = controller_config(i as NodeId + 1, &ports, dirs[i].path());
        // Snapshots only on demand; the cleaner compacts at once.
        config.snapshot.max_bytes_between = u64::MAX;
        config.log.retention_bytes = 1;
        config.log.cleaner_interval_ms = 50;
        config
    };
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(Some(node::start(config_of(i)).await.expect("node starts")));
    }
    let (leader, _) = agreed_leader(&nodes, 0).await;
    let follower = (leader + 1) % 3;
    for i in 0..10 {
        nodes[leader]
            .as_ref()
            .unwrap()
            .append(vec![data(&format!("before {i}"))])
            .await
            .unwrap();
    }
    nodes[follower].take().unwrap().shutdown().await;
    for i in 0..30 {
        nodes[leader]
            .as_ref()
            .unwrap()
            .append(vec![data(&format!("while away {i}"))])
            .await
            .unwrap();
    }
    let leader_node = nodes[leader].clone().unwrap();
    let snapshot = leader_node.create_snapshot().await.expect("snapshot written");
    assert!(snapshot.created && snapshot.end_offset >= 40, "{snapshot:?}");
    let again = leader_node.create_snapshot().await.unwrap();
    assert_eq!(
        (again.end_offset, again.created),
        (snapshot.end_offset, false),
        "nothing newer"
    );
    eventually("the leader to compact its log", || async {
        let status = leader_node.describe().await.ok()?;
        (status.log_start_offset == snapshot.end_offset).then_some(())
    })
    .await;

    let restarted = node::start(config_of(follower)).await.expect("the follower restarts");
    nodes[follower] = Some(restarted.clone());
    let seen = register_collector(&restarted).await;
    let last = leader_node
        .append(vec![data("after the snapshot")])
        .await
        .unwrap()
        .last_offset;
    eventually("the follower to install the snapshot and catch up", || async {
        let status = restarted.describe().await.ok()?;
        (status.log_start_offset == snapshot.end_offset && status.high_watermark > last).then_some(())
    })
    .await;
    let expected = read_through(&leader_node, last).await;
    assert_eq!(
        expected.len(),
        last as usize + 1,
        "the leader reads below its log start too"
    );
    assert_eq!(read_through(&restarted, last).await, expected);
    let delivered = seen_through(&seen, last).await;
    let offsets: Vec<Offset> = delivered.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..=last).collect::<Vec<_>>(), "every record once, in order");
    let values: Vec<String> = delivered
        .iter()
        .filter_map(|r| match &r.record {
            Record::Data(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        })
        .collect();
    assert_eq!(values.len(), 41);
    assert_eq!(values[0], "before 0");
    assert_eq!(values[40], "after the snapshot");
    shutdown_all(&mut nodes).await;
}

/// Flips one byte in the middle of a snapshot file.
fn damage_snapshot(dir: &Path, end_offset: Offset, epoch: Epoch) {
    let path = kraft::storage::snapshot::path_of(dir, kraft::messages::SnapshotId { end_offset, epoch });
    let mut bytes = std::fs::read(&path).expect("the snapshot file");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&path, bytes).unwrap();
}

/// A single voter with snapshots on demand only and, with `compact`, a
/// cleaner that compacts at once (otherwise never).
fn single_node_config(ports: &[u16], dir: &Path, compact: bool) -> Config {
    let mut config = controller_config(1, ports, dir);
    config.snapshot.max_bytes_between = u64::MAX;
    config.log.cleaner_interval_ms = 50;
    config.log.retention_bytes = if compact { 1 } else { u64::MAX };
    config.log.retention_ms = kraft::config::MAX_MS; // ten years: never, here
    config
}

/// Restart with a damaged newest snapshot: an older valid one (or the log
/// itself) still holds everything, so the node starts on it, loudly, and
/// every record stays readable; the damaged file is kept for inspection.
#[actix_rt::test]
async fn a_damaged_newest_snapshot_falls_back_to_an_older_one() {
    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(single_node_config(&ports, dir.path(), false))
        .await
        .unwrap();
    agreed_leader(&[Some(node.clone())], 0).await;
    node.append(vec![data("one")]).await.unwrap();
    let older = node.create_snapshot().await.unwrap();
    let last = node.append(vec![data("two")]).await.unwrap().last_offset;
    let newest = node.create_snapshot().await.unwrap();
    assert!(newest.end_offset > older.end_offset);
    node.shutdown().await;

    damage_snapshot(dir.path(), newest.end_offset, newest.epoch);
    let node = node::start(single_node_config(&ports, dir.path(), false))
        .await
        .expect("starts on the older snapshot and the log");
    agreed_leader(&[Some(node.clone())], 0).await;
    let records = read_through(&node, last).await;
    let values: Vec<_> = records.iter().filter_map(|r| r.value.clone()).collect();
    assert_eq!(values, vec!["one", "two"]);
    let kept = kraft::storage::snapshot::list(dir.path()).unwrap();
    assert!(
        kept.iter().any(|id| id.end_offset == newest.end_offset),
        "the damaged file is kept: {kept:?}"
    );
    node.shutdown().await;
}

/// Restart after compaction with the only snapshot holding the compacted
/// records damaged: starting would silently lose them, so the node refuses
/// and says why, and removes nothing.
#[actix_rt::test]
async fn a_damaged_snapshot_below_the_log_start_refuses_to_start() {
    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(single_node_config(&ports, dir.path(), true)).await.unwrap();
    agreed_leader(&[Some(node.clone())], 0).await;
    node.append(vec![data("compacted away")]).await.unwrap();
    let snapshot = node.create_snapshot().await.unwrap();
    eventually("the log to be compacted", || async {
        let status = node.describe().await.ok()?;
        (status.log_start_offset == snapshot.end_offset).then_some(())
    })
    .await;
    node.shutdown().await;

    damage_snapshot(dir.path(), snapshot.end_offset, snapshot.epoch);
    let before = std::fs::read(kraft::storage::snapshot::path_of(
        dir.path(),
        kraft::messages::SnapshotId {
            end_offset: snapshot.end_offset,
            epoch: snapshot.epoch,
        },
    ))
    .unwrap();
    match node::start(single_node_config(&ports, dir.path(), true)).await {
        Ok(_) => panic!("started without the records below its log start"),
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains("damaged data directory")
                    && message.contains("no valid snapshot holds the records below it"),
                "{message}"
            );
        }
    }
    let after = std::fs::read(kraft::storage::snapshot::path_of(
        dir.path(),
        kraft::messages::SnapshotId {
            end_offset: snapshot.end_offset,
            epoch: snapshot.epoch,
        },
    ))
    .unwrap();
    assert_eq!(before, after, "nothing was removed or rewritten");
}

/// `snapshot.max_bytes_between`: a node writes a snapshot by itself once
/// that many bytes were appended since the last one, and the cleaner then
/// compacts below it.
#[actix_rt::test]
async fn a_snapshot_is_written_after_max_bytes_between_and_the_log_compacted() {
    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();
    let mut config = single_node_config(&ports, dir.path(), true);
    config.snapshot.max_bytes_between = 4096;
    let node = node::start(config).await.unwrap();
    agreed_leader(&[Some(node.clone())], 0).await;
    assert!(kraft::storage::snapshot::list(dir.path()).unwrap().is_empty());
    let mut last = 0;
    for i in 0..10 {
        last = node
            .append(vec![vec![b'x'; 1024], data(&format!("{i}"))])
            .await
            .unwrap()
            .last_offset;
    }
    // The storage thread deletes the older snapshot files, then the log
    // below the newest: once it has, the earliest snapshot ends at the log
    // start.
    eventually("a snapshot and a compacted log", || async {
        let start = node.describe().await.ok()?.log_start_offset;
        let snapshots = kraft::storage::snapshot::list(dir.path()).ok()?;
        (start > 0 && snapshots.first().map(|s| s.end_offset) == Some(start)).then_some(())
    })
    .await;
    let records = read_through(&node, last).await;
    assert_eq!(records.iter().filter(|r| r.kind == "data").count(), 20);
    node.shutdown().await;
}

/// The cleaner deletes the older snapshot files before it compacts the log
/// to the newest one. A crash in between leaves a log that starts below
/// its earliest snapshot (the records in between are in both); the next
/// start finishes the compaction, so the log starts where its earliest
/// snapshot ends again, and every record stays readable.
#[actix_rt::test]
async fn a_compaction_cut_by_a_crash_is_finished_at_the_next_start() {
    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(single_node_config(&ports, dir.path(), true)).await.unwrap();
    agreed_leader(&[Some(node.clone())], 0).await;
    node.append(vec![data("one")]).await.unwrap();
    let first = node.create_snapshot().await.unwrap();
    eventually("the log to be compacted", || async {
        let status = node.describe().await.ok()?;
        (status.log_start_offset == first.end_offset).then_some(())
    })
    .await;
    node.shutdown().await;

    // Without compaction, a second snapshot; then the first file goes, as
    // the cleaner's first step would, and no compaction follows.
    let node = node::start(single_node_config(&ports, dir.path(), false))
        .await
        .unwrap();
    agreed_leader(&[Some(node.clone())], 0).await;
    let last = node.append(vec![data("two")]).await.unwrap().last_offset;
    let second = node.create_snapshot().await.unwrap();
    assert!(second.end_offset > first.end_offset);
    node.shutdown().await;
    kraft::storage::snapshot::delete(
        dir.path(),
        kraft::messages::SnapshotId {
            end_offset: first.end_offset,
            epoch: first.epoch,
        },
    )
    .unwrap();

    let node = node::start(single_node_config(&ports, dir.path(), false))
        .await
        .unwrap();
    let status = node.describe().await.unwrap();
    assert_eq!(status.log_start_offset, second.end_offset, "{status:?}");
    let snapshots = kraft::storage::snapshot::list(dir.path()).unwrap();
    assert_eq!(snapshots.first().map(|s| s.end_offset), Some(second.end_offset));
    agreed_leader(&[Some(node.clone())], 0).await;
    let records = read_through(&node, last).await;
    let values: Vec<_> = records.iter().filter_map(|r| r.value.clone()).collect();
    assert_eq!(values, vec!["one", "two"]);
    node.shutdown().await;
}

/// `snapshot.max_interval_ms` writes a snapshot only when data records
/// came since the newest one: an idle leader's NoOps alone never do, since
/// every snapshot here rewrites the whole history.
#[actix_rt::test]
async fn an_idle_node_writes_no_snapshot_by_time() {
    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();
    let mut config = single_node_config(&ports, dir.path(), false);
    config.snapshot.max_interval_ms = 200;
    config.metadata.max_idle_interval_ms = 20;
    let node = node::start(config).await.unwrap();
    agreed_leader(&[Some(node.clone())], 0).await;
    let snapshots = || kraft::storage::snapshot::list(dir.path()).unwrap();
    let one = node.append(vec![data("one")]).await.unwrap().last_offset;
    eventually("a snapshot holding the data", || async {
        snapshots().iter().any(|s| s.end_offset > one).then_some(())
    })
    .await;
    let before = snapshots();
    let idle_from = node.describe().await.unwrap().high_watermark;
    // Idle for several intervals: NoOps commit, no snapshot comes.
    eventually("NoOps to commit", || async {
        let hw = node.describe().await.ok()?.high_watermark;
        (hw > idle_from + 30).then_some(())
    })
    .await;
    assert_eq!(snapshots(), before, "no snapshot while idle");
    // New data: the next interval writes one.
    let two = node.append(vec![data("two")]).await.unwrap().last_offset;
    eventually("a snapshot holding the new data", || async {
        snapshots().iter().any(|s| s.end_offset > two).then_some(())
    })
    .await;
    node.shutdown().await;
}

/// The values of the data records among `records`.
fn data_values(records: &[CommittedRecord]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match &r.record {
            Record::Data(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        })
        .collect()
}

/// Log matching at restart (KIP-630 install, Raft §5.3): a follower that
/// crashed after the leader's snapshot was renamed into place but before
/// the reset of its log was durable comes back with its old log. Where that
/// log holds the snapshot's last offset in another epoch it is a different
/// history, never committed: the log restarts at the snapshot's end and
/// only the snapshot's records are reported as committed.
#[actix_rt::test]
async fn a_log_that_disagrees_with_the_newest_snapshot_at_its_end_restarts_at_the_snapshot() {
    use kraft::storage::{LogStore, SledStore, SnapshotWriter};
    init_tracing();
    let ports = free_ports(3);
    let dir = tempfile::tempdir().unwrap();
    // Node 1 follows an unreachable node 2: nothing new ever commits.
    let config = controller_config(1, &ports, dir.path());
    {
        let mut store = SledStore::open(dir.path(), &config.node.cluster_id, 1).unwrap();
        for i in 0..10 {
            let batch = kraft::messages::Batch::new(i, 1, &[Record::Data(data(&format!("old {i}")))]);
            store.append(&batch).unwrap();
        }
        store
            .write_election_state(&kraft::raft::ElectionState {
                epoch: 2,
                voted_for: None,
                leader_id: Some(2),
            })
            .unwrap();
        store.flush().unwrap();
    }
    // The leader's snapshot: the records agree up to offset 1 (epoch 1),
    // then epoch 2 wrote others at 2..4.
    let id = kraft::messages::SnapshotId {
        end_offset: 5,
        epoch: 2,
    };
    let mut writer = SnapshotWriter::create(dir.path(), id, 0).unwrap();
    writer
        .append(0, 1, &[Record::Data(data("old 0")), Record::Data(data("old 1"))])
        .unwrap();
    let new: Vec<Record> = (2..5).map(|i| Record::Data(data(&format!("new {i}")))).collect();
    writer.append(2, 2, &new).unwrap();
    writer.freeze().unwrap();

    let node = node::start(config).await.expect("the node starts");
    let seen = register_collector(&node).await;
    let expected = vec!["old 0", "old 1", "new 2", "new 3", "new 4"];
    let page = node.read_committed(0, 100).await.unwrap();
    let values: Vec<_> = page.records.iter().filter_map(|r| r.value.clone()).collect();
    assert_eq!(values, expected, "only the snapshot's records are committed");
    assert_eq!(data_values(&seen_through(&seen, 4).await), expected);
    let status = node.describe().await.unwrap();
    assert_eq!(
        (status.log_start_offset, status.log_end_offset, status.high_watermark),
        (5, 5, 5),
        "the log restarts at the snapshot's end: {status:?}"
    );
    node.shutdown().await;
}

/// A failed read only delays the listener that asked for it: here the
/// snapshot below the log start is damaged when a listener first reads
/// through it. The listener retries with a backoff and, once the file is
/// whole again, gets every record, in order; the node stays healthy.
#[actix_rt::test]
async fn a_listener_whose_read_failed_retries_and_catches_up() {
    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(single_node_config(&ports, dir.path(), true)).await.unwrap();
    agreed_leader(&[Some(node.clone())], 0).await;
    for i in 0..5 {
        node.append(vec![data(&format!("before {i}"))]).await.unwrap();
    }
    let snapshot = node.create_snapshot().await.unwrap();
    eventually("the log to be compacted", || async {
        let status = node.describe().await.ok()?;
        (status.log_start_offset == snapshot.end_offset).then_some(())
    })
    .await;
    let path = kraft::storage::snapshot::path_of(
        dir.path(),
        kraft::messages::SnapshotId {
            end_offset: snapshot.end_offset,
            epoch: snapshot.epoch,
        },
    );
    let whole = std::fs::read(&path).unwrap();
    damage_snapshot(dir.path(), snapshot.end_offset, snapshot.epoch);
    let seen = register_collector(&node).await;
    // Give the listener's first read the time to fail.
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&path, &whole).unwrap();
    let last = node.append(vec![data("after")]).await.unwrap().last_offset;
    let delivered = seen_through(&seen, last).await;
    let offsets: Vec<Offset> = delivered.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (0..=last).collect::<Vec<_>>(), "every record once, in order");
    assert_eq!(data_values(&delivered).len(), 6);
    assert!(!node.is_stopped());
    node.shutdown().await;
}

/// `append_each` (the HTTP workers' path): each append's outcome arrives on
/// its own. With both followers stopped nothing can commit, yet the
/// refused appends in the same hand-over are answered at once, not held
/// until the accepted one's outcome is known.
#[actix_rt::test]
async fn appends_handed_over_together_are_answered_each_on_its_own() {
    init_tracing();
    let (_dirs, mut nodes) = start_cluster().await;
    let (leader, _) = agreed_leader(&nodes, 0).await;
    let both = nodes[leader]
        .as_ref()
        .unwrap()
        .append(vec![data("committed")])
        .await
        .expect("append with all three up");
    for (i, node) in nodes.iter_mut().enumerate() {
        if i != leader {
            node.take().unwrap().shutdown().await;
        }
    }
    let handle = nodes[leader].as_ref().unwrap();
    let (accepted_tx, accepted) = tokio::sync::oneshot::channel();
    let (empty_tx, empty) = tokio::sync::oneshot::channel();
    let (again_tx, again) = tokio::sync::oneshot::channel();
    handle.append_each(vec![
        (vec![data("never commits")], accepted_tx),
        (vec![], empty_tx),
        (vec![], again_tx),
    ]);
    let refused = tokio::time::timeout(Duration::from_millis(200), async { (empty.await, again.await) })
        .await
        .expect("the refused appends are answered at once");
    assert!(
        matches!(refused.0, Ok(Err(AppendError::Rejected(_)))),
        "{:?}",
        refused.0
    );
    assert!(
        matches!(refused.1, Ok(Err(AppendError::Rejected(_)))),
        "{:?}",
        refused.1
    );
    // The accepted one cannot commit without a follower: when the leader
    // resigns (check-quorum), its outcome is unknown, never a success.
    match accepted.await {
        Ok(Err(AppendError::OutcomeUnknown(_))) => {}
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    assert!(both.last_offset < handle.describe().await.unwrap().high_watermark);
    shutdown_all(&mut nodes).await;
}

/// `append_each` on an idle leader: the whole hand-over is one batch, one
/// write and one flush, not a first append alone followed by the rest a
/// flush later.
#[actix_rt::test]
async fn appends_handed_over_together_are_written_as_one_batch() {
    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();
    let mut config = single_node_config(&ports, dir.path(), false);
    // No idle NoOp batch may land in between.
    config.metadata.max_idle_interval_ms = 600_000;
    let node = node::start(config).await.expect("node starts");
    agreed_leader(&[Some(node.clone())], 0).await;
    node.append(vec![data("first")]).await.expect("append");
    let before = node.metrics().await.unwrap().storage.appended_batches_total;
    let (replies, answers): (Vec<_>, Vec<_>) = (0..10).map(|_| tokio::sync::oneshot::channel()).unzip();
    node.append_each(
        replies
            .into_iter()
            .enumerate()
            .map(|(i, reply)| (vec![data(&format!("r{i}")), data("x")], reply))
            .collect(),
    );
    let mut next = None;
    for answer in answers {
        let appended = answer.await.unwrap().expect("committed");
        if let Some(base) = next {
            assert_eq!(appended.base_offset, base, "in hand-over order");
        }
        next = Some(appended.last_offset + 1);
    }
    let after = node.metrics().await.unwrap().storage.appended_batches_total;
    assert_eq!(after - before, 1, "ten appends handed over together, one batch");
    node.shutdown().await;
}

/// An append too large for one batch is refused as such wherever it is
/// sent. `POST /v1/append` with many short records (`""` is 3 bytes of
/// JSON, 12 of a batch, 8 of a forwarded frame) passes the body cap; the
/// leader refuses the batch, but forwarded from a follower the frame is
/// above the leader's `max_frame_bytes`: the leader closes the connection,
/// and the client (and every other append forwarded on that connection)
/// heard "outcome unknown" for records that were never written.
#[actix_rt::test]
async fn an_append_too_large_for_a_batch_is_rejected_on_a_follower_as_on_the_leader() {
    init_tracing();
    let (_dirs, mut nodes) = start_cluster().await;
    // 17.6 MB as a forwarded frame (above the default 16 MiB), 26.4 MB as
    // a batch (above 8 MiB).
    let records = vec![Vec::new(); 2_200_000];
    // The nodes share this test's thread, and copying and sizing 2.2M
    // records holds it long enough in a debug build that a follower can
    // time out its fetch and lose the leader ("not leader, leader
    // unknown"): ask again once all agree on a leader.
    for role in ["leader", "follower"] {
        let mut answer = None;
        for _ in 0..10 {
            let (leader, _) = agreed_leader(&nodes, 0).await;
            let target = if role == "leader" { leader } else { (leader + 1) % 3 };
            match nodes[target].as_ref().unwrap().append(records.clone()).await {
                Err(AppendError::NotLeader { leader_id: None, .. }) => continue,
                other => {
                    answer = Some(other);
                    break;
                }
            }
        }
        let answer = answer.unwrap_or_else(|| panic!("the {role} never knew the leader"));
        assert!(
            matches!(answer, Err(AppendError::Rejected(_))),
            "on the {role}: {answer:?}"
        );
    }
    shutdown_all(&mut nodes).await;
}

#[actix_rt::test]
async fn a_client_of_a_follower_has_its_append_forwarded_and_reads_it_back_there() {
    let (_dirs, mut nodes) = start_cluster().await;
    let (leader, _) = agreed_leader(&nodes, 0).await;
    let follower = (leader + 1) % 3;
    let limits = kraft::api::ClientLimits::for_batch_bytes(kraft::messages::MAX_BATCH_BYTES);
    let (server, addr) = kraft::api::client_server_here(
        nodes[follower].clone().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        limits,
        kraft::api::ApiSecurity::default(),
    )
    .expect("the client listener binds");
    let mut client = kraft::client::Client::connect(addr).await.unwrap();
    let appended = client
        .append(vec![vec![0xff, 0x01]])
        .await
        .expect("forwarded to the leader");
    // The follower's high watermark may trail the leader's a moment.
    let deadline = tokio::time::Instant::now() + WAIT;
    let record = loop {
        let page = client.read(appended.base_offset, 1).await.expect("the follower reads");
        if let Some(record) = page.records.into_iter().next() {
            break record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the follower never served the record"
        );
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(
        (record.offset, record.record),
        (appended.base_offset, Record::Data(vec![0xff, 0x01]))
    );
    server.stop().await;
    shutdown_all(&mut nodes).await;
}

/// A follower forwards the appends of one hand-over to the leader together:
/// one request, which the leader proposes at once (the groups in order,
/// consecutive offsets); each client still gets its own outcome, and one
/// the follower refuses itself (empty) is not sent.
#[actix_rt::test]
async fn a_followers_hand_over_is_forwarded_as_one_request_and_each_append_answered_on_its_own() {
    init_tracing();
    let (_dirs, mut nodes) = start_cluster().await;
    let (leader, _) = agreed_leader(&nodes, 0).await;
    let follower = nodes[(leader + 1) % 3].clone().unwrap();
    let leader = nodes[leader].clone().unwrap();
    let before = leader.metrics().await.unwrap();
    let (replies, answers): (Vec<_>, Vec<_>) = (0..11).map(|_| tokio::sync::oneshot::channel()).unzip();
    follower.append_each(
        replies
            .into_iter()
            .enumerate()
            .map(|(i, reply)| match i {
                5 => (vec![], reply),
                _ => (vec![data(&format!("r{i}")), data("x")], reply),
            })
            .collect(),
    );
    let mut next = None;
    for (i, answer) in answers.into_iter().enumerate() {
        let outcome = answer.await.unwrap();
        if i == 5 {
            assert!(matches!(outcome, Err(AppendError::Rejected(_))), "{outcome:?}");
            continue;
        }
        let appended = outcome.expect("committed");
        assert_eq!(appended.last_offset, appended.base_offset + 1);
        if let Some(base) = next {
            assert_eq!(
                appended.base_offset, base,
                "append {i}: in hand-over order, nothing between"
            );
        }
        next = Some(appended.last_offset + 1);
    }
    let after = leader.metrics().await.unwrap();
    assert_eq!(
        (
            after.forwarded_requests_total - before.forwarded_requests_total,
            after.forwarded_appends_total - before.forwarded_appends_total
        ),
        (1, 10),
        "ten appends forwarded in one request"
    );
    drop((leader, follower));
    shutdown_all(&mut nodes).await;
}

/// The outcomes a request manager reports, for a test to read.
struct Outcomes(tokio::sync::mpsc::UnboundedSender<kraft::messages::actor::RequestOutcome>);

impl Actor for Outcomes {
    type Context = Context<Self>;
}

impl Handler<kraft::messages::actor::RequestOutcome> for Outcomes {
    type Result = ();

    fn handle(&mut self, msg: kraft::messages::actor::RequestOutcome, _ctx: &mut Self::Context) {
        let _ = self.0.send(msg);
    }
}

/// The leader answers forwarded appends in either form: `AppendMany` with
/// one answer per group, in order (an empty group refused on its own,
/// nothing written for it), and the one-group `Append` an older follower
/// sends.
#[actix_rt::test]
async fn the_leader_answers_each_forwarded_group_and_the_older_single_append() {
    use kraft::actors::request_manager::RequestManager;
    use kraft::messages::actor::SendRequest;
    use kraft::messages::{AppendManyRequest, AppendRequest, AppendResponse, RaftRequest, RaftResponse};
    use serde_bytes::ByteBuf;

    init_tracing();
    let ports = free_ports(1);
    let dir = tempfile::tempdir().unwrap();
    let mut config = single_node_config(&ports, dir.path(), false);
    // No idle NoOp batch may land while the log's end is compared.
    config.metadata.max_idle_interval_ms = 600_000;
    let cluster_id = config.node.cluster_id.clone();
    let node = node::start(config).await.expect("node starts");
    agreed_leader(&[Some(node.clone())], 0).await;
    let (tx, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let voters: BTreeMap<NodeId, String> = [(1, format!("127.0.0.1:{}", ports[0]))].into();
    let manager = RequestManager::new(
        7,
        cluster_id,
        voters,
        10_000,
        16 << 20,
        Outcomes(tx).start().recipient(),
        None,
    )
    .start();
    let group = |records: &[&str]| AppendRequest {
        records: records.iter().map(|r| ByteBuf::from(data(r))).collect(),
    };
    let ask = |correlation_id: u64, request: RaftRequest| {
        let manager = manager.clone();
        async move {
            let to = 1;
            let timeout_ms = 10_000;
            manager
                .send(SendRequest {
                    to,
                    correlation_id,
                    request,
                    timeout_ms,
                })
                .await
                .unwrap();
        }
    };
    ask(
        1,
        RaftRequest::AppendMany(AppendManyRequest {
            groups: vec![group(&["a", "b"]), group(&[]), group(&["c"])],
        }),
    )
    .await;
    let answer = tokio::time::timeout(WAIT, outcomes.recv()).await.unwrap().unwrap();
    let Ok(RaftResponse::AppendMany(answers)) = answer.result else {
        panic!("{answer:?}")
    };
    match answers.as_slice() {
        [AppendResponse::Committed {
            base_offset: a,
            last_offset: b,
            ..
        }, AppendResponse::Rejected { .. }, AppendResponse::Committed {
            base_offset: c,
            last_offset: d,
            ..
        }] => assert_eq!(
            (*b, *c, *d),
            (a + 1, a + 2, a + 2),
            "in order, nothing for the empty group"
        ),
        other => panic!("{other:?}"),
    }
    // No groups: answered at once, with no answers.
    ask(4, RaftRequest::AppendMany(AppendManyRequest { groups: vec![] })).await;
    let answer = tokio::time::timeout(WAIT, outcomes.recv()).await.unwrap().unwrap();
    assert!(
        matches!(&answer.result, Ok(RaftResponse::AppendMany(a)) if a.is_empty()),
        "{answer:?}"
    );
    // More groups than any hand-over holds: refused whole, nothing written.
    let too_many = vec![group(&["x"]); kraft::messages::MAX_APPEND_GROUPS + 1];
    let end_before = node.describe().await.unwrap().log_end_offset;
    ask(3, RaftRequest::AppendMany(AppendManyRequest { groups: too_many })).await;
    let answer = tokio::time::timeout(WAIT, outcomes.recv()).await.unwrap().unwrap();
    assert!(
        matches!(
            answer.result,
            Ok(RaftResponse::Error(kraft::messages::ErrorCode::InvalidRequest))
        ),
        "{answer:?}"
    );
    assert_eq!(node.describe().await.unwrap().log_end_offset, end_before);
    ask(2, RaftRequest::Append(group(&["e", "f"]))).await;
    let answer = tokio::time::timeout(WAIT, outcomes.recv()).await.unwrap().unwrap();
    match answer.result {
        Ok(RaftResponse::Append(AppendResponse::Committed {
            base_offset,
            last_offset,
            ..
        })) => assert_eq!(last_offset, base_offset + 1),
        other => panic!("{other:?}"),
    }
    node.shutdown().await;
}

/// A linearizable read on a follower (`read_barrier`, then a read of its
/// own log) sees every append acknowledged before it, though a follower
/// learns the high watermark only on its next fetch; a node with no
/// leader refuses it.
#[actix_rt::test]
async fn a_linearizable_read_on_a_follower_sees_every_acknowledged_append() {
    init_tracing();
    let (_dirs, mut nodes) = start_cluster().await;
    let (leader, _) = agreed_leader(&nodes, 0).await;
    let follower = nodes[(leader + 1) % 3].clone().unwrap();
    let leader_node = nodes[leader].clone().unwrap();
    for i in 0..30 {
        let appended = leader_node.append(vec![data(&format!("r{i}"))]).await.unwrap();
        let index = follower.read_barrier().await.expect("a read index through the leader");
        assert!(
            index > appended.last_offset,
            "read index {index} below the acknowledged {appended:?}"
        );
        let committed_here = follower.describe().await.unwrap().high_watermark;
        assert!(
            committed_here >= index,
            "the follower's high watermark {committed_here} below the read index {index}"
        );
        let page = follower.read_committed(appended.base_offset, 1).await.unwrap();
        assert_eq!(
            page.records.first().and_then(|r| r.value.clone()),
            Some(format!("r{i}")),
            "the follower's read after the barrier"
        );
        // And on the leader itself.
        assert!(leader_node.read_barrier().await.unwrap() > appended.last_offset);
    }
    // Two of three voters down: no leader, no read index.
    let last = nodes[leader].take().unwrap();
    let other = nodes[(leader + 2) % 3].take().unwrap();
    last.shutdown().await;
    other.shutdown().await;
    let refused = eventually("the lone follower to refuse a read index", || async {
        follower.read_barrier().await.err()
    })
    .await;
    assert!(
        matches!(refused, AppendError::NotLeader { .. } | AppendError::Unavailable(_)),
        "{refused:?}"
    );
    follower.shutdown().await;
    shutdown_all(&mut nodes).await;
}
