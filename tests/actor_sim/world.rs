//! One seed of the actor-level simulator: whole kraft nodes — the
//! QuorumState (with the appends it forwards), LogAppender, FetchPurgatory
//! and MetadataListeners that `kraft::node::start` runs — started with
//! `kraft::node::start_custom` over [`Disk`]s and the in-memory [`Net`], all
//! on one thread with a paused tokio clock.
//!
//! Checked as it runs: every committed record a listener receives matches,
//! offset for offset, what every other node's listener received (log
//! matching and state-machine safety, including across restarts);
//! deliveries are contiguous and below the high watermark, which never
//! goes back within an incarnation; no epoch has two leaders (from the
//! listeners' leader changes and a `describe` of every node every few
//! steps); an acknowledged append is found at its offsets. At the end the
//! faults heal and every node must catch up with a new committed append
//! (liveness), and every acknowledged append must be there.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use kraft::config::{Config, NodeRole};
use kraft::messages::Record;
use kraft::node::{
    self, AppendError, Appended, Committed, CustomNode, LeaderChanged, Listener, LoadSnapshot, NodeHandle,
};
use kraft::raft::{Epoch, NodeId, Offset};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::disk::Disk;
use super::metadata;
use super::net::{Faults, Net};

/// Virtual time the faults are healed for before liveness fails.
const LIVENESS_MS: u64 = 30_000;
/// Most client appends in flight at once.
const MAX_CLIENT_IN_FLIGHT: usize = 16;

/// The fault mix and settings one seed draws.
#[derive(Clone, Debug)]
pub struct Params {
    pub voters: usize,
    pub observers: usize,
    pub faults: Faults,
    pub crash: f64,
    pub restart: f64,
    pub partition: f64,
    pub heal: f64,
    pub client: f64,
    /// Chance per step that a random node is asked for a snapshot.
    pub snapshot: f64,
    pub flush_delay_ms: u64,
    /// Node 1's disk flushes this slowly instead, when not 0: a leader
    /// whose own flush is slower than a follower's round trip shows
    /// whether it counts what it has not flushed.
    pub slow_flush_ms: u64,
    pub chaos_ms: u64,
    /// The nodes run the metadata image and the workload is a controller's
    /// (see [`super::metadata`]); else they run a raw log and clients
    /// append. Decided by the seed, not drawn, so that a log seed runs as it
    /// always did.
    pub metadata: bool,
}

impl Params {
    pub fn draw(rng: &mut SmallRng) -> Params {
        let voters = [1, 2, 3, 3, 3, 4, 5, 5][rng.gen_range(0..8)];
        let max_delay = [1, 2, 5, 10, 30][rng.gen_range(0..5)];
        Params {
            voters,
            observers: rng.gen_range(0..=1),
            faults: Faults {
                loss: [0.0, 0.01, 0.05, 0.15][rng.gen_range(0..4)],
                duplicate: [0.0, 0.02, 0.1][rng.gen_range(0..3)],
                delay_ms: (0, max_delay),
            },
            crash: [0.0, 0.002, 0.01][rng.gen_range(0..3)],
            restart: 0.02,
            partition: [0.0, 0.003, 0.01][rng.gen_range(0..3)],
            heal: 0.01,
            client: [0.1, 0.5, 0.9][rng.gen_range(0..3)],
            snapshot: [0.0, 0.002, 0.01][rng.gen_range(0..3)],
            flush_delay_ms: rng.gen_range(0..=4),
            slow_flush_ms: [0, 0, 15, 40][rng.gen_range(0..4)],
            chaos_ms: 10_000,
            metadata: false,
        }
    }
}

/// What one seed did, and the first rule it broke.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub hash: u64,
    pub steps: u64,
    pub virtual_ms: u64,
    pub max_epoch: Epoch,
    pub crashes: u64,
    pub acked: u64,
    pub append_errors: u64,
    pub committed: u64,
    pub snapshots: u64,
    /// Node starts whose log began above offset 0 (compacted or installed).
    pub compacted_starts: u64,
    /// Metadata seeds: controller operations acknowledged, and refused
    /// (by a rule or a fault), and images checked.
    pub ops_acked: u64,
    pub ops_refused: u64,
    pub images: u64,
    pub sent: u64,
    pub lost: u64,
    pub failure: Option<String>,
}

/// A fresh actix System over a current-thread runtime whose clock is
/// paused: time moves only when every task waits, straight to the next
/// timer.
pub fn paused_system() -> actix_rt::SystemRunner {
    actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime")
    })
}

/// Runs one seed on a [`paused_system`].
pub fn run_seed(seed: u64) -> (Params, Report) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut params = Params::draw(&mut rng);
    params.metadata = seed % 3 == 2;
    let world_params = params.clone();
    let report = paused_system().block_on(async move { World::new(seed, world_params, rng).run().await });
    (params, report)
}

// ---------------------------------------------------------------------
// The checker
// ---------------------------------------------------------------------

pub(crate) struct Checker {
    origin: Instant,
    /// Committed records, as the first listener to see each offset saw it.
    pub(super) committed: Vec<(Epoch, Record)>,
    leaders: BTreeMap<Epoch, NodeId>,
    acked: Vec<(Appended, Vec<u8>)>,
    append_errors: u64,
    /// Snapshots written on request.
    snapshots: u64,
    failure: Option<String>,
    hash: u64,
    /// A metadata seed: listeners load snapshots of the image.
    metadata: bool,
}

impl Checker {
    pub(super) fn fail(&mut self, what: String) {
        if self.failure.is_none() {
            let at = self.origin.elapsed().as_millis();
            self.failure = Some(format!("t={at}ms: {what}"));
        }
    }

    /// Folds an event into the trace hash (FNV-1a over the virtual time and
    /// the event).
    pub(super) fn trace(&mut self, event: &str) {
        let at = self.origin.elapsed().as_millis() as u64;
        for byte in at.to_le_bytes().iter().chain(event.as_bytes()) {
            self.hash ^= u64::from(*byte);
            self.hash = self.hash.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn on_committed(&mut self, node: NodeId, offset: Offset, epoch: Epoch, record: &Record) {
        let index = offset as usize;
        if self.committed.get(index).is_some_and(|(seen_epoch, _)| *seen_epoch < 0) {
            // Below a snapshot no listener read through (metadata seeds):
            // the first to deliver the offset fills it in.
            self.committed[index] = (epoch, record.clone());
        } else if index < self.committed.len() {
            let (seen_epoch, seen) = &self.committed[index];
            if *seen_epoch != epoch || seen != record {
                let what = format!(
                    "node {node} committed {record:?} (epoch {epoch}) at offset {offset}, another node committed {seen:?} (epoch {seen_epoch})"
                );
                self.fail(what);
            }
        } else if index == self.committed.len() {
            self.committed.push((epoch, record.clone()));
            self.trace(&format!("commit {offset} {epoch}"));
        } else if self.metadata {
            // A listener that loaded a snapshot starts at its end; what came
            // before is unknown until some node delivers it.
            self.committed.resize(index, (-1, Record::NoOp));
            self.committed.push((epoch, record.clone()));
        } else {
            self.fail(format!(
                "node {node} committed offset {offset} past the known end {}",
                self.committed.len()
            ));
        }
    }

    fn on_leader(&mut self, seen_by: NodeId, epoch: Epoch, leader: NodeId) {
        match self.leaders.get(&epoch) {
            Some(known) if *known != leader => {
                let what = format!("two leaders in epoch {epoch}: {known} and {leader} (seen by node {seen_by})");
                self.fail(what);
            }
            Some(_) => {}
            None => {
                self.leaders.insert(epoch, leader);
                self.trace(&format!("leader {epoch} {leader}"));
            }
        }
    }

    fn on_acked(&mut self, appended: Appended, value: Vec<u8>) {
        if appended.last_offset != appended.base_offset {
            self.fail(format!("one record acknowledged as {appended:?}"));
        }
        self.check_acked(&appended, &value);
        self.trace(&format!("ack {}", appended.base_offset));
        self.acked.push((appended, value));
    }

    /// An acknowledged record, once some node has delivered its offset,
    /// must be the one delivered there.
    fn check_acked(&mut self, appended: &Appended, value: &[u8]) {
        let expected = Record::Data(value.to_vec());
        if let Some((epoch, record)) = self.committed.get(appended.base_offset as usize) {
            if *record != expected || *epoch != appended.epoch {
                let what = format!(
                    "acknowledged {appended:?} but offset {} holds {record:?} (epoch {epoch})",
                    appended.base_offset
                );
                self.fail(what);
            }
        }
    }
}

/// A listener of one node incarnation.
struct Recorder {
    node: NodeId,
    /// The next offset this listener expects (shared with the world, which
    /// reads it as the node's progress).
    next: Rc<Cell<Offset>>,
    high_watermark: Offset,
    checker: Rc<RefCell<Checker>>,
}

impl Actor for Recorder {
    type Context = Context<Self>;
}

impl Handler<Committed> for Recorder {
    type Result = ();

    fn handle(&mut self, msg: Committed, _ctx: &mut Context<Self>) {
        let mut checker = self.checker.borrow_mut();
        if msg.high_watermark < self.high_watermark {
            let what = format!(
                "node {}: high watermark went back from {} to {}",
                self.node, self.high_watermark, msg.high_watermark
            );
            checker.fail(what);
        }
        self.high_watermark = msg.high_watermark;
        for committed in &msg.records {
            if committed.offset != self.next.get() {
                let what = format!(
                    "node {} delivered offset {}, expected {}",
                    self.node,
                    committed.offset,
                    self.next.get()
                );
                checker.fail(what);
            }
            if committed.offset >= msg.high_watermark {
                let what = format!(
                    "node {} delivered offset {} at high watermark {}",
                    self.node, committed.offset, msg.high_watermark
                );
                checker.fail(what);
            }
            checker.on_committed(self.node, committed.offset, committed.epoch, &committed.record);
            self.next.set(committed.offset + 1);
        }
    }
}

impl Handler<LoadSnapshot> for Recorder {
    type Result = ();

    /// A metadata seed's listener: the image up to the snapshot's end
    /// replaces the records before it.
    fn handle(&mut self, msg: LoadSnapshot, _ctx: &mut Context<Self>) {
        self.next.set(self.next.get().max(msg.id.end_offset));
    }
}

impl Handler<LeaderChanged> for Recorder {
    type Result = ();

    fn handle(&mut self, msg: LeaderChanged, _ctx: &mut Context<Self>) {
        if let Some(leader) = msg.leader_id {
            self.checker.borrow_mut().on_leader(self.node, msg.epoch, leader);
        }
    }
}

// ---------------------------------------------------------------------
// The world
// ---------------------------------------------------------------------

struct Up {
    handle: NodeHandle,
    progress: Rc<Cell<Offset>>,
}

struct SimNode {
    id: NodeId,
    config: Config,
    disk: Disk,
    incarnation: u64,
    up: Option<Up>,
}

struct World {
    seed: u64,
    params: Params,
    rng: SmallRng,
    net: Net,
    nodes: Vec<SimNode>,
    checker: Rc<RefCell<Checker>>,
    client_in_flight: Rc<Cell<usize>>,
    next_value: u64,
    crashes: u64,
    compacted_starts: u64,
    steps: u64,
    /// The controller workload of a metadata seed.
    workload: metadata::Shared,
}

pub fn node_config(id: NodeId, voters: &BTreeMap<NodeId, String>, observer: bool, metadata: bool) -> Config {
    let mut config = Config::default();
    config.node.state_machine = match metadata {
        true => kraft::config::StateMachineKind::Metadata,
        false => kraft::config::StateMachineKind::Log,
    };
    config.broker.heartbeat_interval_ms = 50;
    config.broker.session_timeout_ms = 400;
    config.node.roles = vec![kraft::config::NodeRole::Controller];
    config.node.id = id;
    config.node.cluster_id = "actor-sim".to_string();
    if observer {
        config.node.roles = vec![NodeRole::Broker];
    }
    config.quorum.voters = voters.clone();
    config.quorum.election_timeout_ms = 150;
    config.quorum.fetch_timeout_ms = 300;
    config.quorum.request_timeout_ms = 200;
    config.quorum.retry_backoff_ms = 10;
    config.quorum.election_backoff_max_ms = 150;
    config.metadata.max_idle_interval_ms = 100;
    // Snapshots on demand (random steps) and now and then on their own; the
    // cleaner compacts as soon as it can, so lagging nodes must fetch them.
    config.snapshot.max_bytes_between = 64 * 1024;
    config.log.retention_bytes = 1;
    config.log.cleaner_interval_ms = 200;
    config
}

impl World {
    fn new(seed: u64, params: Params, mut rng: SmallRng) -> World {
        let metadata = params.metadata;
        let voters: BTreeMap<NodeId, String> = (1..=params.voters as NodeId)
            .map(|id| (id, format!("127.0.0.1:{}", 9000 + id)))
            .collect();
        let observers = (0..params.observers as NodeId).map(|i| 100 + i);
        let nodes: Vec<SimNode> = voters
            .keys()
            .map(|id| (*id, false))
            .chain(observers.map(|id| (id, true)))
            .map(|(id, observer)| SimNode {
                id,
                config: node_config(id, &voters, observer, params.metadata),
                disk: Disk::new(),
                incarnation: 0,
                up: None,
            })
            .collect();
        let net_rng = SmallRng::seed_from_u64(rng.gen());
        let request_timeout = Duration::from_millis(node_config(1, &voters, false, false).quorum.request_timeout_ms);
        let net = Net::new(net_rng, request_timeout);
        for node in &nodes {
            net.watch_disk(node.id, node.disk.clone());
        }
        World {
            seed,
            params,
            rng,
            net,
            nodes,
            checker: Rc::new(RefCell::new(Checker {
                origin: Instant::now(),
                committed: Vec::new(),
                leaders: BTreeMap::new(),
                acked: Vec::new(),
                append_errors: 0,
                snapshots: 0,
                failure: None,
                hash: 0xcbf2_9ce4_8422_2325,
                metadata,
            })),
            workload: Rc::default(),
            client_in_flight: Rc::new(Cell::new(0)),
            next_value: 0,
            crashes: 0,
            compacted_starts: 0,
            steps: 0,
        }
    }

    fn failed(&self) -> bool {
        self.checker.borrow().failure.is_some()
    }

    async fn start_node(&mut self, index: usize) {
        let seed = self.rng.gen();
        let node = &mut self.nodes[index];
        node.incarnation += 1;
        let custom = CustomNode {
            config: node.config.clone(),
            store: Box::new(node.disk.open()),
            snapshot_dir: Some(node.disk.snapshot_dir()),
            flush_delay: Duration::from_millis(match self.params.slow_flush_ms {
                slow if slow > 0 && node.id == 1 => slow,
                _ => self.params.flush_delay_ms,
            }),
            connect: Box::new(self.net.connector(node.id, node.incarnation)),
            seed,
        };
        let (handle, inbound) = node::start_custom(custom).expect("an in-memory node starts");
        self.net.attach(node.id, node.incarnation, inbound);
        let progress = Rc::new(Cell::new(0));
        let recorder = Recorder {
            node: node.id,
            next: progress.clone(),
            high_watermark: 0,
            checker: self.checker.clone(),
        }
        .start();
        let metadata = self.params.metadata;
        let listener = Listener {
            committed: recorder.clone().recipient(),
            leader_changed: Some(recorder.clone().recipient()),
            load_snapshot: metadata.then(|| recorder.recipient()),
        };
        if metadata {
            let images = metadata::ImageRecorder {
                node: node.id,
                last: None,
                workload: self.workload.clone(),
                checker: self.checker.clone(),
            }
            .start();
            handle
                .subscribe_metadata(images.recipient())
                .expect("a metadata node takes subscribers");
        }
        handle
            .register_listener(listener)
            .await
            .expect("a new node takes a listener");
        if handle.describe().await.is_ok_and(|s| s.log_start_offset > 0) {
            self.compacted_starts += 1;
        }
        self.checker
            .borrow_mut()
            .trace(&format!("start {} {}", node.id, node.incarnation));
        node.up = Some(Up { handle, progress });
    }

    /// Power loss: the node's unflushed writes are gone, nothing it sends
    /// arrives, nothing reaches it. The dead incarnation's actors are then
    /// told to shut down; until they have, nothing they do has an effect
    /// (every call through their disk handle fails, the network drops what
    /// they send).
    fn crash_node(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        let Some(up) = node.up.take() else { return };
        self.net.detach(node.id);
        node.disk.crash();
        self.crashes += 1;
        self.checker.borrow_mut().trace(&format!("crash {}", node.id));
        actix_rt::spawn(async move { up.handle.shutdown().await });
    }

    fn pick(&mut self, up: bool) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].up.is_some() == up)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        Some(candidates[self.rng.gen_range(0..candidates.len())])
    }

    /// A client append of one record on a random running node; now and
    /// then several appends handed over together (`append_each`), which a
    /// follower forwards to the leader in one request and the leader
    /// answers group by group.
    fn client_append(&mut self) {
        if self.client_in_flight.get() >= MAX_CLIENT_IN_FLIGHT {
            return;
        }
        let Some(index) = self.pick(true) else { return };
        let handle = self.nodes[index].up.as_ref().unwrap().handle.clone();
        let count = if self.rng.gen_range(0..4) == 0 {
            self.rng.gen_range(2..=4)
        } else {
            1
        };
        let mut answers = Vec::new();
        let mut groups = Vec::new();
        for _ in 0..count {
            self.next_value += 1;
            let value = format!("seed {} value {}", self.seed, self.next_value).into_bytes();
            let (reply, answer) = tokio::sync::oneshot::channel();
            groups.push((vec![value.clone()], reply));
            answers.push((value, answer));
        }
        handle.append_each(groups);
        for (value, answer) in answers {
            let checker = self.checker.clone();
            let in_flight = self.client_in_flight.clone();
            in_flight.set(in_flight.get() + 1);
            actix_rt::spawn(async move {
                let result = answer
                    .await
                    .unwrap_or_else(|_| Err(AppendError::OutcomeUnknown("dropped".into())));
                in_flight.set(in_flight.get() - 1);
                let mut checker = checker.borrow_mut();
                match result {
                    Ok(appended) => checker.on_acked(appended, value),
                    Err(AppendError::Rejected(why)) => checker.fail(format!("a valid append was rejected: {why}")),
                    Err(_) => checker.append_errors += 1,
                }
            });
        }
    }

    /// Kafka's snapshot invariants, on every node's disk after every step:
    /// a log that starts above 0 has a snapshot, the earliest snapshot
    /// never ends below the log start, and ends exactly there once the log
    /// start has moved. The last one holds on a running node; a crashed
    /// node's disk may hold what a crash between the cleaner's two steps
    /// leaves (the older snapshots deleted, the log not yet compacted to the
    /// newer), which its next start finishes. (The other one, "a leader
    /// never loads a snapshot", is checked by the engine's
    /// `on_snapshot_installed`, which refuses an install it is not waiting
    /// for; the shell then stops the node.)
    fn check_snapshot_files(&mut self) {
        for node in &self.nodes {
            let start = node.disk.start_offset();
            let ids = kraft::storage::snapshot::list(&node.disk.snapshot_dir()).unwrap_or_default();
            let earliest = ids.first().map(|id| id.end_offset);
            let running = node.up.is_some();
            let broken = match earliest {
                None => start > 0,
                Some(end) => end < start || (running && start > 0 && end != start),
            };
            if broken {
                let what = format!("node {}: log starts at {start}, snapshots end at {ids:?}", node.id);
                self.checker.borrow_mut().fail(what);
            }
        }
    }

    /// Committed means durable on a majority of voters: what any node has
    /// delivered to its listeners must survive a crash of every node now.
    fn check_committed_is_durable(&mut self) {
        let delivered = self
            .nodes
            .iter()
            .filter_map(|node| node.up.as_ref())
            .map(|up| up.progress.get())
            .max()
            .unwrap_or(0);
        let voters = self.params.voters as NodeId;
        let mut ends: Vec<Offset> = self
            .nodes
            .iter()
            .filter(|node| node.id <= voters)
            .map(|node| node.disk.durable_end())
            .collect();
        ends.sort_unstable_by(|a, b| b.cmp(a));
        let durable = ends[ends.len() / 2];
        if delivered > durable {
            let what = format!(
                "offsets below {delivered} were delivered as committed, but a majority of voters' disks hold only \
                 those below {durable} durably (durable ends {ends:?})"
            );
            self.checker.borrow_mut().fail(what);
        }
    }

    /// Every live node's view: a leader names itself, a follower its
    /// leader; both go to the one-leader-per-epoch check.
    async fn poll_roles(&mut self) {
        for node in &self.nodes {
            let Some(up) = &node.up else { continue };
            let Ok(status) = up.handle.describe().await else {
                continue;
            };
            if let Some(leader) = status.leader_id {
                self.checker
                    .borrow_mut()
                    .on_leader(node.id, status.leader_epoch, leader);
            }
        }
    }

    async fn step(&mut self) {
        self.steps += 1;
        let pause = self.rng.gen_range(1..=10);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if self.rng.gen_bool(self.params.client) {
            match self.params.metadata {
                true => {
                    if let Some(index) = self.pick(true) {
                        let handle = self.nodes[index].up.as_ref().unwrap().handle.clone();
                        metadata::operate(handle, &mut self.rng, &self.workload, &self.checker);
                    }
                }
                false => self.client_append(),
            }
        }
        if self.rng.gen_bool(self.params.crash) {
            if let Some(index) = self.pick(true) {
                self.crash_node(index);
            }
        }
        if self.rng.gen_bool(self.params.restart) {
            if let Some(index) = self.pick(false) {
                self.start_node(index).await;
            }
        }
        if self.rng.gen_bool(self.params.partition) {
            let a = self.nodes[self.rng.gen_range(0..self.nodes.len())].id;
            let b = self.nodes[self.rng.gen_range(0..self.nodes.len())].id;
            if self.rng.gen_bool(0.5) {
                self.net.cut(a, b);
            } else {
                for node in &self.nodes {
                    self.net.cut(a, node.id);
                    self.net.cut(node.id, a);
                }
            }
            self.checker.borrow_mut().trace(&format!("cut {a} {b}"));
        }
        if self.rng.gen_bool(self.params.heal) {
            self.net.heal();
        }
        if self.rng.gen_bool(self.params.snapshot) {
            if let Some(index) = self.pick(true) {
                let handle = self.nodes[index].up.as_ref().unwrap().handle.clone();
                let checker = self.checker.clone();
                actix_rt::spawn(async move {
                    if let Ok(info) = handle.create_snapshot().await {
                        checker.borrow_mut().snapshots += u64::from(info.created);
                    }
                });
            }
        }
        if self.steps.is_multiple_of(4) {
            self.poll_roles().await;
        }
        self.check_snapshot_files();
        self.check_committed_is_durable();
        for what in self.net.take_violations() {
            self.checker.borrow_mut().fail(what);
        }
    }

    async fn run(mut self) -> Report {
        for index in 0..self.nodes.len() {
            self.start_node(index).await;
        }
        self.net.set_faults(self.params.faults);
        let origin = Instant::now();
        let chaos_end = origin + Duration::from_millis(self.params.chaos_ms);
        while Instant::now() < chaos_end && !self.failed() {
            self.step().await;
        }
        if !self.failed() {
            self.heal_and_check_liveness().await;
        }
        if !self.failed() {
            self.check_acknowledged();
        }
        if !self.failed() && self.params.metadata {
            self.check_images();
        }
        self.report(origin)
    }

    /// Heals everything, restarts the crashed nodes, then a leader must
    /// commit a new append and every node must deliver up to it.
    async fn heal_and_check_liveness(&mut self) {
        self.net.heal();
        self.net.set_faults(Faults::NONE);
        for index in 0..self.nodes.len() {
            if self.nodes[index].up.is_none() {
                self.start_node(index).await;
            }
        }
        let deadline = Instant::now() + Duration::from_millis(LIVENESS_MS);
        let mut target: Option<Offset> = None;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.poll_roles().await;
            if self.failed() {
                return;
            }
            if target.is_none() {
                target = self.probe_append().await;
            }
            if let Some(end) = target {
                if self
                    .nodes
                    .iter()
                    .all(|n| n.up.as_ref().is_some_and(|up| up.progress.get() >= end))
                {
                    return;
                }
            }
        }
        let mut progress = Vec::new();
        for node in &self.nodes {
            let Some(up) = &node.up else { continue };
            let status = up.handle.describe().await.ok();
            let view = status.map(|s| {
                format!(
                    "{} epoch {} leader {:?} hw {} end {}",
                    s.role, s.leader_epoch, s.leader_id, s.high_watermark, s.log_end_offset
                )
            });
            progress.push(format!("node {} delivered {} ({view:?})", node.id, up.progress.get()));
        }
        let what = format!(
            "no liveness {LIVENESS_MS} ms after healing: probe committed up to {target:?}, delivered per node {progress:?}"
        );
        self.checker.borrow_mut().fail(what);
    }

    /// Appends through the leader, if one is known; the end offset it
    /// committed.
    async fn probe_append(&mut self) -> Option<Offset> {
        for node in &self.nodes {
            let up = node.up.as_ref()?;
            let status = up.handle.describe().await.ok()?;
            if status.role == "leader" && self.params.metadata {
                self.next_value += 1;
                let offset = metadata::probe(&up.handle, self.next_value).await?;
                return Some(offset + 1);
            }
            if status.role == "leader" {
                let appended = up.handle.append(vec![b"liveness probe".to_vec()]).await.ok()?;
                self.checker.borrow_mut().on_acked(appended, b"liveness probe".to_vec());
                return Some(appended.last_offset + 1);
            }
        }
        None
    }

    /// Every node replayed all it delivered (a record that did not replay
    /// would have stopped its image), and holds every acknowledged topic.
    fn check_images(&mut self) {
        for node in &self.nodes {
            let Some(up) = &node.up else { continue };
            let image = up.handle.metadata_image().expect("a metadata node");
            let mut checker = self.checker.borrow_mut();
            if image.offset + 1 < up.progress.get() {
                let what = format!(
                    "node {}: its image stopped at offset {} but it delivered up to {}",
                    node.id,
                    image.offset,
                    up.progress.get()
                );
                checker.fail(what);
            }
            metadata::check_final(node.id, &image, &self.workload.borrow(), &mut checker);
        }
    }

    fn check_acknowledged(&mut self) {
        let mut checker = self.checker.borrow_mut();
        let acked = std::mem::take(&mut checker.acked);
        for (appended, value) in &acked {
            if appended.base_offset as usize >= checker.committed.len() {
                let what = format!(
                    "acknowledged {appended:?} is missing: every node delivered only {} records",
                    checker.committed.len()
                );
                checker.fail(what);
            }
            checker.check_acked(appended, value);
        }
        checker.acked = acked;
    }

    fn report(&self, origin: Instant) -> Report {
        let checker = self.checker.borrow();
        let (sent, lost) = self.net.counts();
        Report {
            hash: checker.hash,
            steps: self.steps,
            virtual_ms: origin.elapsed().as_millis() as u64,
            max_epoch: checker.leaders.keys().next_back().copied().unwrap_or(0),
            crashes: self.crashes,
            acked: checker.acked.len() as u64,
            append_errors: checker.append_errors,
            committed: checker.committed.len() as u64,
            snapshots: checker.snapshots,
            compacted_starts: self.compacted_starts,
            ops_acked: self.workload.borrow().ops_acked,
            ops_refused: self.workload.borrow().ops_refused,
            images: self.workload.borrow().images,
            sent,
            lost,
            failure: checker.failure.clone(),
        }
    }
}
