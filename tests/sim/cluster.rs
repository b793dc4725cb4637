//! The simulated cluster: nodes, disks, network, faults and clients on one
//! virtual clock, driven by a priority queue of events ordered by
//! (time, sequence number). Every random choice comes from `self.rng`.
//!
//! The shell contract this carries out for each node is the one of
//! `kraft::raft` (module docs): the engine's actions are executed in order;
//! `PersistElection` is durable at once; `AppendBatch`/`Truncate` are
//! readable at once and durable at the next flush completion; `Flush`
//! completes after a random disk delay and is reported with `on_flushed`;
//! `Send`/`Respond`/`RespondFetch` go through the faulty network.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use kraft::messages::{Batch, RaftRequest, RaftResponse, Record};
use kraft::raft::{
    Action, ElectionState, Epoch, LogView, NodeId, Offset, ProposeError, Proposed, RaftConfig, RaftNode, RoleInfo,
    RoleKind,
};
use kraft::storage::LogStore;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::invariants::{
    first_difference, violation, Check, Invariants, Outcome, Proposal, Violation, ENGINE_CONTRACT, LIVENESS,
    STORAGE_CONTRACT,
};
use super::log_mirror::{Entry, LogMirror};
use super::params::{gap, SimParams};
use super::store::{durable_batches, Store};
use super::trace::{describe_action, describe_request, describe_response, Trace};

/// One simulated node: its disk survives crashes, its engine does not.
pub struct SimNode {
    pub id: NodeId,
    pub is_voter: bool,
    pub config: RaftConfig,
    pub store: Store,
    pub engine: Option<RaftNode>,
    pub up: bool,
    /// Bumped at every crash: voids flush completions, timers and responses
    /// meant for an earlier life.
    pub incarnation: u64,
    /// The harness's copy of the log (current and durable).
    pub log: LogMirror,
    /// The role as the engine last announced it.
    pub role: RoleInfo,
    /// The high watermark as the engine last announced it (this life).
    pub hw: Offset,
    /// The store's high watermark hint: the high watermark the engine had
    /// announced when a flush last completed. A real store persists the
    /// hint with the flush, together with the log it describes, so a crash
    /// keeps both or neither. Handed to the engine at each start.
    pub hw_hint: Offset,
    /// The last election state written to the store.
    pub persisted: ElectionState,
    /// When this node's deadline tick is scheduled.
    deadline_at: Option<u64>,
    /// (time, ticks at that time): a guard against a deadline that never
    /// moves past `now`.
    ticks_at: (u64, u32),
    /// Scenario override of the disk latency (ms).
    pub disk_delay_ms: Option<u64>,
}

#[derive(Clone, Debug)]
enum MessageKind {
    Request {
        correlation_id: u64,
        sender_incarnation: u64,
        request: RaftRequest,
    },
    Response {
        correlation_id: u64,
        receiver_incarnation: u64,
        response: RaftResponse,
    },
}

#[derive(Clone, Debug)]
struct Message {
    from: NodeId,
    to: NodeId,
    kind: MessageKind,
}

#[derive(Debug)]
enum Event {
    Deliver(Message),
    FlushDone {
        node: NodeId,
        incarnation: u64,
    },
    RequestFailed {
        node: NodeId,
        incarnation: u64,
        to: NodeId,
        correlation_id: u64,
    },
    DeadlineTick {
        node: NodeId,
        incarnation: u64,
    },
    RandomTick {
        node: NodeId,
    },
    Restart {
        node: NodeId,
    },
    CrashTimer,
    PartitionTimer,
    Heal {
        generation: u64,
    },
    ResignTimer,
    ProposeTimer,
}

struct Queued {
    time: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    /// Reversed: `BinaryHeap` is a max-heap and we want the earliest first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// A request delivered to `receiver`, awaiting its answer.
struct PendingRequest {
    receiver: NodeId,
    sender: NodeId,
    sender_incarnation: u64,
    correlation_id: u64,
}

/// Counts for the summaries.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub events: u64,
    pub virtual_ms: u64,
    pub elections: u64,
    pub max_epoch: Epoch,
    pub committed_offsets: u64,
    pub committed_records: u64,
    pub proposals: u64,
    pub acknowledged: u64,
    pub unknown_outcome: u64,
    pub not_leader: u64,
    pub leader_refused: u64,
    pub too_large: u64,
    /// Refused by the engine's admission bounds (disk or quorum behind).
    pub behind: u64,
    pub crashes: u64,
    pub mid_action_crashes: u64,
    pub restarts: u64,
    pub partitions: u64,
    pub resigns: u64,
    pub messages: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub dropped: u64,
    pub failures_reported: u64,
    pub flushes: u64,
    pub appends: u64,
    pub truncated_batches: u64,
    pub truncations_of_committed: u64,
    pub settle_ms: u64,
    /// Seeds with observers on slow disks.
    pub slow_observer_disks: u64,
    /// Seeds whose nodes started a few epochs below the largest ...
    pub near_max_epoch: u64,
    /// ... and those that ran out of elections (every voter at the
    /// largest epoch, no leader) and ended with no leader.
    pub elections_exhausted: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.events += o.events;
        self.virtual_ms += o.virtual_ms;
        self.elections += o.elections;
        self.max_epoch = self.max_epoch.max(o.max_epoch);
        self.committed_offsets += o.committed_offsets;
        self.committed_records += o.committed_records;
        self.proposals += o.proposals;
        self.acknowledged += o.acknowledged;
        self.unknown_outcome += o.unknown_outcome;
        self.not_leader += o.not_leader;
        self.leader_refused += o.leader_refused;
        self.too_large += o.too_large;
        self.behind += o.behind;
        self.crashes += o.crashes;
        self.mid_action_crashes += o.mid_action_crashes;
        self.restarts += o.restarts;
        self.partitions += o.partitions;
        self.resigns += o.resigns;
        self.messages += o.messages;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.dropped += o.dropped;
        self.failures_reported += o.failures_reported;
        self.flushes += o.flushes;
        self.appends += o.appends;
        self.truncated_batches += o.truncated_batches;
        self.truncations_of_committed += o.truncations_of_committed;
        self.settle_ms = self.settle_ms.max(o.settle_ms);
        self.slow_observer_disks += o.slow_observer_disks;
        self.near_max_epoch += o.near_max_epoch;
        self.elections_exhausted += o.elections_exhausted;
    }

    pub fn summary(&self) -> String {
        format!(
            "events={} virtual={}s elections={} max_epoch={} committed_offsets={} committed_records={} \
             proposals={} acked={} unknown={} not_leader={} leader_refused={} too_large={} behind={} crashes={} \
             (mid-action {}) restarts={} partitions={} resigns={} messages={} lost={} dup={} dropped={} \
             failures_reported={} flushes={} appends={} truncated_batches={} truncations_of_committed={} \
             settle_max={}ms slow_observer_disks={} near_max_epoch={} (elections exhausted {})",
            self.events,
            self.virtual_ms / 1000,
            self.elections,
            self.max_epoch,
            self.committed_offsets,
            self.committed_records,
            self.proposals,
            self.acknowledged,
            self.unknown_outcome,
            self.not_leader,
            self.leader_refused,
            self.too_large,
            self.behind,
            self.crashes,
            self.mid_action_crashes,
            self.restarts,
            self.partitions,
            self.resigns,
            self.messages,
            self.lost,
            self.duplicated,
            self.dropped,
            self.failures_reported,
            self.flushes,
            self.appends,
            self.truncated_batches,
            self.truncations_of_committed,
            self.settle_ms,
            self.slow_observer_disks,
            self.near_max_epoch,
            self.elections_exhausted,
        )
    }
}

/// A failed run: the broken rule and when.
#[derive(Clone, Debug)]
pub struct Failure {
    pub violation: Violation,
    pub time_ms: u64,
    pub events: u64,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{}] at t={}ms after {} events: {}",
            self.violation.rule, self.time_ms, self.events, self.violation.detail
        )
    }
}

pub struct Sim {
    pub seed: u64,
    /// The settings in force; `settle` heals the faults in them.
    pub params: SimParams,
    /// The seed's settings as drawn, for its summary line.
    pub params_summary: String,
    rng: SmallRng,
    pub now: u64,
    queue: BinaryHeap<Queued>,
    seq: u64,
    pub nodes: Vec<SimNode>,
    pub inv: Invariants,
    pub trace: Trace,
    pub stats: Stats,
    /// Directed links that drop every message: (from, to).
    blocked: BTreeSet<(NodeId, NodeId)>,
    partition_generation: u64,
    pending_requests: BTreeMap<u64, PendingRequest>,
    next_request_id: u64,
    /// Random faults (crashes, partitions, resigns) are on.
    chaos: bool,
    /// Random client proposals are on.
    proposing: bool,
}

/// Index of node `id` in `Sim::nodes` (ids start at 1).
pub fn ix(id: NodeId) -> usize {
    (id - 1) as usize
}

fn storage(node: NodeId, what: &str, e: kraft::storage::StorageError) -> Violation {
    violation(STORAGE_CONTRACT, format!("node {node}: {what} failed: {e}"))
}

impl Sim {
    /// A run whose fault mix is drawn from its seed.
    pub fn random(seed: u64, chaos_events: u64, trace: Trace) -> Result<Sim, Failure> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let params = SimParams::random(&mut rng, chaos_events).late_options(seed);
        Sim::build(seed, rng, params, trace)
    }

    /// A run with the given settings (scenario tests); the seed still
    /// drives delays and the engines' own randomness.
    pub fn with_params(seed: u64, params: SimParams, trace: Trace) -> Result<Sim, Failure> {
        let rng = SmallRng::seed_from_u64(seed);
        Sim::build(seed, rng, params, trace)
    }

    fn build(seed: u64, rng: SmallRng, params: SimParams, trace: Trace) -> Result<Sim, Failure> {
        let nodes = params
            .node_ids()
            .into_iter()
            .map(|id| {
                let config = params.raft_config(id);
                SimNode {
                    id,
                    is_voter: config.is_voter(),
                    role: RoleInfo {
                        role: RoleKind::Unattached,
                        epoch: 0,
                        leader_id: None,
                        voted_for: None,
                        is_voter: config.is_voter(),
                    },
                    config,
                    store: Store::new(),
                    engine: None,
                    up: false,
                    incarnation: 0,
                    log: LogMirror::new(),
                    hw: 0,
                    hw_hint: 0,
                    persisted: ElectionState::default(),
                    deadline_at: None,
                    ticks_at: (0, 0),
                    disk_delay_ms: None,
                }
            })
            .collect();
        let chaos = params.crash_every_ms > 0 || params.partition_every_ms > 0 || params.resign_every_ms > 0;
        let stats = Stats {
            slow_observer_disks: u64::from(params.slow_observer_disk_max_ms > 0),
            near_max_epoch: u64::from(params.start_epoch != 0),
            ..Stats::default()
        };
        let proposing = params.propose_every_ms > 0;
        let max_pad = params.max_record_pad_bytes;
        let params_summary = params.summary();
        let mut sim = Sim {
            seed,
            params,
            params_summary,
            rng,
            now: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            nodes,
            inv: Invariants::new(max_pad),
            trace,
            stats,
            blocked: BTreeSet::new(),
            partition_generation: 0,
            pending_requests: BTreeMap::new(),
            next_request_id: 1,
            chaos,
            proposing,
        };
        let ids: Vec<NodeId> = sim.nodes.iter().map(|n| n.id).collect();
        if sim.params.start_epoch != 0 {
            let state = ElectionState::unattached(sim.params.start_epoch);
            for &id in &ids {
                let written = sim.nodes[ix(id)]
                    .store
                    .write_election_state(&state)
                    .map_err(|e| storage(id, "write_election_state", e));
                written
                    .and_then(|()| sim.inv.monotonic.on_persist(id, &state))
                    .map_err(|v| sim.failure(v))?;
            }
        }
        for &id in &ids {
            sim.start_node(id).map_err(|v| sim.failure(v))?;
            let first = sim.rng.gen_range(1..=sim.params.tick_every_max_ms);
            sim.push(first, Event::RandomTick { node: id });
        }
        let p = sim.params.clone();
        if p.crash_every_ms > 0 {
            let t = gap(&mut sim.rng, p.crash_every_ms);
            sim.push(t, Event::CrashTimer);
        }
        if p.partition_every_ms > 0 {
            let t = gap(&mut sim.rng, p.partition_every_ms);
            sim.push(t, Event::PartitionTimer);
        }
        if p.resign_every_ms > 0 {
            let t = gap(&mut sim.rng, p.resign_every_ms);
            sim.push(t, Event::ResignTimer);
        }
        if p.propose_every_ms > 0 {
            let t = gap(&mut sim.rng, p.propose_every_ms);
            sim.push(t, Event::ProposeTimer);
        }
        Ok(sim)
    }

    pub fn node(&self, id: NodeId) -> &SimNode {
        &self.nodes[(id - 1) as usize]
    }

    fn node_mut(&mut self, id: NodeId) -> &mut SimNode {
        &mut self.nodes[(id - 1) as usize]
    }

    fn failure(&self, violation: Violation) -> Failure {
        Failure {
            violation,
            time_ms: self.now,
            events: self.stats.events,
        }
    }

    fn push(&mut self, delay_ms: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Queued {
            time: self.now + delay_ms,
            seq: self.seq,
            event,
        });
    }

    fn line(&mut self, node: NodeId, text: impl FnOnce() -> String) {
        if self.trace.wants_lines() {
            let line = format!("{:>8} n{node} {}", self.now, text());
            self.trace.line(line);
        }
    }

    // -----------------------------------------------------------------------
    // Driving

    /// Pops and carries out one event, then checks every invariant.
    /// Returns false when the queue is empty.
    pub fn step(&mut self) -> Result<bool, Failure> {
        loop {
            let Some(q) = self.queue.pop() else {
                return Ok(false);
            };
            if let Event::DeadlineTick { node, incarnation } = q.event {
                let n = self.node(node);
                // Superseded by an earlier deadline, or meant for an earlier life.
                if !n.up || n.incarnation != incarnation || n.deadline_at != Some(q.time) {
                    continue;
                }
            }
            debug_assert!(q.time >= self.now, "time went backwards");
            self.now = q.time;
            self.stats.events += 1;
            self.hash_event(&q.event);
            self.dispatch(q.event).map_err(|v| self.failure(v))?;
            self.inv.after_step(&self.nodes).map_err(|v| self.failure(v))?;
            return Ok(true);
        }
    }

    /// Runs until virtual time `now + ms` (events at exactly that time run).
    pub fn run_for(&mut self, ms: u64) -> Result<(), Failure> {
        let end = self.now + ms;
        while self.queue.peek().is_some_and(|q| q.time <= end) {
            self.step()?;
        }
        self.now = end;
        Ok(())
    }

    /// Runs until `done` holds (checked after every step) or `max_ms` pass.
    /// Returns whether `done` held.
    pub fn run_until(&mut self, max_ms: u64, mut done: impl FnMut(&Sim) -> bool) -> Result<bool, Failure> {
        let end = self.now + max_ms;
        loop {
            if done(self) {
                return Ok(true);
            }
            if self.queue.peek().is_none_or(|q| q.time > end) {
                self.now = end;
                return Ok(done(self));
            }
            self.step()?;
        }
    }

    /// The whole randomized run: the chaotic phase, then convergence.
    pub fn run(&mut self) -> Result<(), Failure> {
        while self.stats.events < self.params.chaos_events {
            if !self.step()? {
                break;
            }
        }
        self.settle()
    }

    /// End of a run: heal every fault, restart crashed nodes, stop the
    /// clients, and require a leader that every node follows and has caught
    /// up with; then the final durability check. Fails when the cluster
    /// makes no progress for `settle_stall_ms` or takes over `settle_max_ms`
    /// (except in a `start_epoch` seed that has run out of elections).
    pub fn settle(&mut self) -> Result<(), Failure> {
        let start = self.now;
        self.chaos = false;
        self.proposing = false;
        self.params.loss = 0.0;
        self.params.dup = 0.0;
        self.params.crash_mid_actions = 0.0;
        self.params.slow_observer_disk_max_ms = 0;
        self.blocked.clear();
        self.partition_generation += 1;
        for n in &mut self.nodes {
            n.disk_delay_ms = None;
        }
        let down: Vec<NodeId> = self.nodes.iter().filter(|n| !n.up).map(|n| n.id).collect();
        for id in down {
            self.restart(id).map_err(|v| self.failure(v))?;
        }
        let committed_at_start = self.inv.committed.end;
        // (leader, epoch, offset every node's HW must reach)
        let mut target: Option<(NodeId, Epoch, Offset)> = None;
        let (mut best_progress, mut progress_at) = (self.settle_progress(), self.now);
        loop {
            if let Some(leader) = self.agreed_leader() {
                let l = self.node(leader);
                let epoch = l.role.epoch;
                match target {
                    Some((id, e, _)) if id == leader && e == epoch => {}
                    _ => target = Some((leader, epoch, l.log.end().max(committed_at_start))),
                }
                // Records acknowledged during the settling count too.
                let goal = target.unwrap().2.max(self.inv.durability.acknowledged_end);
                if self.nodes.iter().all(|n| n.hw >= goal) {
                    break;
                }
            }
            let progress = self.settle_progress();
            if progress > best_progress {
                (best_progress, progress_at) = (progress, self.now);
            }
            let stalled = self.now > progress_at + self.params.settle_stall_ms;
            if stalled && self.params.start_epoch != 0 && self.elections_exhausted() {
                // Liveness ends at the largest epoch: nobody can campaign
                // any more, so no leader may ever come and lagging nodes
                // stay behind. Only for the seeds that start near it; the
                // acknowledged records must still be on a majority.
                self.line(0, || {
                    "elections exhausted at the largest epoch: no leader expected".to_string()
                });
                self.stats.elections_exhausted = 1;
                self.stats.settle_ms = self.now - start;
                self.inv
                    .durability
                    .final_check_majority(&self.nodes)
                    .map_err(|v| self.failure(v))?;
                self.finish_stats();
                return Ok(());
            }
            if stalled || self.now > start + self.params.settle_max_ms {
                return Err(self.failure(violation(
                    LIVENESS,
                    format!(
                        "no convergence {} ms after healing ({}; target {target:?}, committed at start \
                         {committed_at_start}, acknowledged up to {}): {}",
                        self.now - start,
                        if stalled {
                            format!("no progress for {} ms", self.params.settle_stall_ms)
                        } else {
                            format!("still progressing after {} ms", self.params.settle_max_ms)
                        },
                        self.inv.durability.acknowledged_end,
                        self.describe_nodes()
                    ),
                )));
            }
            if !self.step()? {
                return Err(self.failure(violation(LIVENESS, "event queue ran dry")));
            }
        }
        self.stats.settle_ms = self.now - start;
        // Identical committed logs: each node's log below the goal is the
        // committed log (checked incrementally); say it once more directly.
        let goal = target.unwrap().2.max(self.inv.durability.acknowledged_end);
        let reference = &self.inv.committed;
        for n in &self.nodes {
            let mut offset = 0;
            while offset < goal {
                let c = reference.find(offset).expect("goal is committed");
                match n.log.find_base(c.base) {
                    Some(e) if e.same_batch(c) => offset = c.next,
                    other => {
                        return Err(self.failure(violation(
                            LIVENESS,
                            format!(
                                "node {} has {:?} where the committed log has {}",
                                n.id,
                                other.map(Entry::describe),
                                c.describe()
                            ),
                        )))
                    }
                }
            }
        }
        self.inv
            .durability
            .final_check(&self.nodes)
            .map_err(|v| self.failure(v))?;
        self.finish_stats();
        Ok(())
    }

    /// A measure that grows while the cluster converges: the nodes' high
    /// watermarks plus, for each follower whose log is a prefix of the
    /// leader's, its log end. Truncate-and-refetch loops and an idle
    /// leader's own NoOps do not raise its best value.
    fn settle_progress(&self) -> i64 {
        let hws: i64 = self.nodes.iter().map(|n| n.hw).sum();
        let Some(leader) = self.leader() else {
            return hws;
        };
        let l = &self.node(leader).log;
        let matched: i64 = self
            .nodes
            .iter()
            .filter(|n| n.id != leader)
            .filter_map(|n| n.log.entries().last())
            .filter(|last| l.find_base(last.base).is_some_and(|e| e.same_batch(last)))
            .map(|last| last.next)
            .sum();
        hws + matched
    }

    /// No election can ever succeed again: every voter has persisted the
    /// largest epoch (a campaign needs a higher one) and none leads it.
    fn elections_exhausted(&self) -> bool {
        let voters = self.nodes.iter().filter(|n| n.is_voter);
        voters.clone().all(|n| n.persisted.epoch == Epoch::MAX)
            && voters.clone().all(|n| n.role.role != RoleKind::Leader)
    }

    /// The node every up node agrees leads: it is Leader, every other node
    /// is up and its Follower in the same epoch.
    pub fn agreed_leader(&self) -> Option<NodeId> {
        let leader = self.leader()?;
        let epoch = self.node(leader).role.epoch;
        self.nodes
            .iter()
            .all(|n| {
                n.up && (n.id == leader
                    || (n.role.role == RoleKind::Follower && n.role.epoch == epoch && n.role.leader_id == Some(leader)))
            })
            .then_some(leader)
    }

    /// The up node that is leader of the highest epoch, if any.
    pub fn leader(&self) -> Option<NodeId> {
        self.nodes
            .iter()
            .filter(|n| n.up && n.role.role == RoleKind::Leader)
            .max_by_key(|n| n.role.epoch)
            .map(|n| n.id)
    }

    pub fn finish_stats(&mut self) {
        self.stats.virtual_ms = self.now;
        self.stats.elections = self.inv.election.leaders.len() as u64;
        self.stats.max_epoch = self.nodes.iter().map(|n| n.persisted.epoch).max().unwrap_or(0);
        self.stats.committed_offsets = self.inv.committed.end as u64;
        self.stats.committed_records = self.inv.durability.committed_data_records;
        self.stats.acknowledged = self.inv.durability.acknowledged;
        self.stats.unknown_outcome = self.inv.durability.unknown;
        self.stats.truncations_of_committed = self.inv.committed.truncations_of_committed;
    }

    pub fn describe_nodes(&self) -> String {
        let mut s = String::new();
        for n in &self.nodes {
            s.push_str(&format!(
                "\n  node {}{}: {} {} epoch {} leader {:?} voted {:?} hw {} log end {} (durable {}) last epoch {} persisted {:?}",
                n.id,
                if n.is_voter { "" } else { " (observer)" },
                if n.up { "up" } else { "DOWN" },
                n.role.role.as_str(),
                n.role.epoch,
                n.role.leader_id,
                n.role.voted_for,
                n.hw,
                n.log.end(),
                n.log.durable_end(),
                n.log.last_epoch(),
                n.persisted,
            ));
        }
        s.push_str(&format!("\n  blocked links: {:?}", self.blocked));
        s
    }

    // -----------------------------------------------------------------------
    // Events

    fn hash_event(&mut self, event: &Event) {
        let now = self.now;
        let t = &mut self.trace;
        t.u64(now);
        match event {
            Event::Deliver(m) => {
                t.tag(1);
                t.i64(m.from as i64);
                t.i64(m.to as i64);
                match &m.kind {
                    MessageKind::Request {
                        correlation_id,
                        request,
                        ..
                    } => {
                        t.u64(*correlation_id);
                        t.request(request);
                    }
                    MessageKind::Response {
                        correlation_id,
                        response,
                        ..
                    } => {
                        t.u64(*correlation_id);
                        t.response(response);
                    }
                }
            }
            Event::FlushDone { node, incarnation } => {
                t.tag(2);
                t.i64(*node as i64);
                t.u64(*incarnation);
            }
            Event::RequestFailed {
                node,
                to,
                correlation_id,
                ..
            } => {
                t.tag(3);
                t.i64(*node as i64);
                t.i64(*to as i64);
                t.u64(*correlation_id);
            }
            Event::DeadlineTick { node, .. } => {
                t.tag(4);
                t.i64(*node as i64);
            }
            Event::RandomTick { node } => {
                t.tag(5);
                t.i64(*node as i64);
            }
            Event::Restart { node } => {
                t.tag(6);
                t.i64(*node as i64);
            }
            Event::CrashTimer => t.tag(7),
            Event::PartitionTimer => t.tag(8),
            Event::Heal { generation } => {
                t.tag(9);
                t.u64(*generation);
            }
            Event::ResignTimer => t.tag(10),
            Event::ProposeTimer => t.tag(11),
        }
    }

    fn dispatch(&mut self, event: Event) -> Check {
        match event {
            Event::Deliver(m) => self.deliver(m),
            Event::FlushDone { node, incarnation } => {
                let n = self.node(node);
                if !n.up || n.incarnation != incarnation {
                    return Ok(()); // the crash took this flush with it
                }
                let n = self.node_mut(node);
                n.store.flush().map_err(|e| storage(node, "flush", e))?;
                n.log.flush();
                n.hw_hint = n.hw_hint.max(n.hw);
                let end = n.store.end_offset();
                if end != n.log.end() {
                    return Err(violation(
                        STORAGE_CONTRACT,
                        format!(
                            "node {node}: store ends at {end}, the actions carried out end at {}",
                            n.log.end()
                        ),
                    ));
                }
                self.line(node, || format!("flushed to {end}"));
                self.with_engine(node, |e, now| e.on_flushed(now, end))
            }
            Event::RequestFailed {
                node,
                incarnation,
                to,
                correlation_id,
            } => {
                let n = self.node(node);
                if !n.up || n.incarnation != incarnation {
                    return Ok(());
                }
                self.stats.failures_reported += 1;
                self.line(node, || format!("request #{correlation_id} to {to} failed"));
                self.with_engine(node, |e, now| e.handle_request_failed(now, to, correlation_id))
            }
            Event::DeadlineTick { node, .. } => {
                self.node_mut(node).deadline_at = None;
                let now = self.now;
                let n = self.node_mut(node);
                if n.ticks_at.0 == now {
                    n.ticks_at.1 += 1;
                    if n.ticks_at.1 > 100 {
                        return Err(violation(
                            ENGINE_CONTRACT,
                            format!("node {node}: next_deadline_ms stays at {now} after 100 ticks at that time"),
                        ));
                    }
                } else {
                    n.ticks_at = (now, 1);
                }
                self.with_engine(node, |e, now| e.tick(now))
            }
            Event::RandomTick { node } => {
                let next = self.rng.gen_range(1..=self.params.tick_every_max_ms);
                self.push(next, Event::RandomTick { node });
                if self.node(node).up {
                    self.with_engine(node, |e, now| e.tick(now))?;
                }
                Ok(())
            }
            Event::Restart { node } => {
                if !self.node(node).up {
                    self.restart(node)?;
                }
                Ok(())
            }
            Event::CrashTimer => {
                if !self.chaos {
                    return Ok(());
                }
                let t = gap(&mut self.rng, self.params.crash_every_ms);
                self.push(t, Event::CrashTimer);
                let up: Vec<NodeId> = self.nodes.iter().filter(|n| n.up).map(|n| n.id).collect();
                if up.is_empty() {
                    return Ok(());
                }
                // A third of the crashes aim at the leader.
                let victim = match self.leader() {
                    Some(l) if self.rng.gen_bool(1.0 / 3.0) => l,
                    _ => up[self.rng.gen_range(0..up.len())],
                };
                self.crash(victim)?;
                self.schedule_restart(victim);
                Ok(())
            }
            Event::PartitionTimer => {
                if !self.chaos {
                    return Ok(());
                }
                let t = gap(&mut self.rng, self.params.partition_every_ms);
                self.push(t, Event::PartitionTimer);
                self.random_partition();
                let len = self.rng.gen_range(1..=self.params.partition_len_max_ms.max(1));
                let generation = self.partition_generation;
                self.push(len, Event::Heal { generation });
                Ok(())
            }
            Event::Heal { generation } => {
                if generation == self.partition_generation {
                    self.heal();
                }
                Ok(())
            }
            Event::ResignTimer => {
                if !self.chaos {
                    return Ok(());
                }
                let t = gap(&mut self.rng, self.params.resign_every_ms);
                self.push(t, Event::ResignTimer);
                if let Some(leader) = self.leader() {
                    self.resign(leader)?;
                }
                Ok(())
            }
            Event::ProposeTimer => {
                if !self.proposing {
                    return Ok(());
                }
                let t = gap(&mut self.rng, self.params.propose_every_ms);
                self.push(t, Event::ProposeTimer);
                self.random_proposal()
            }
        }
    }

    fn deliver(&mut self, m: Message) -> Check {
        let to = self.node(m.to);
        if !to.up || self.blocked.contains(&(m.from, m.to)) {
            self.stats.dropped += 1;
            self.maybe_report_failure(&m);
            return Ok(());
        }
        match m.kind {
            MessageKind::Request {
                correlation_id,
                sender_incarnation,
                request,
            } => {
                let request_id = self.next_request_id;
                self.next_request_id += 1;
                self.pending_requests.insert(
                    request_id,
                    PendingRequest {
                        receiver: m.to,
                        sender: m.from,
                        sender_incarnation,
                        correlation_id,
                    },
                );
                self.line(m.to, || {
                    format!("<- n{} r{request_id} {}", m.from, describe_request(&request))
                });
                let from = m.from;
                self.with_engine(m.to, |e, now| e.handle_request(now, from, request_id, request))
            }
            MessageKind::Response {
                correlation_id,
                receiver_incarnation,
                response,
            } => {
                if to.incarnation != receiver_incarnation {
                    // The connection this answer belonged to died with the crash.
                    self.stats.dropped += 1;
                    return Ok(());
                }
                self.line(m.to, || {
                    format!("<- n{} #{correlation_id} {}", m.from, describe_response(&response))
                });
                let from = m.from;
                self.with_engine(m.to, |e, now| e.handle_response(now, from, correlation_id, response))
            }
        }
    }

    /// Sometimes the shell notices a lost request (a broken connection) and
    /// says so; otherwise the engine's own request timeout must.
    fn maybe_report_failure(&mut self, m: &Message) {
        if self.params.fail_notify <= 0.0 || !self.rng.gen_bool(self.params.fail_notify) {
            return;
        }
        let (node, incarnation, to, correlation_id) = match &m.kind {
            MessageKind::Request {
                correlation_id,
                sender_incarnation,
                ..
            } => (m.from, *sender_incarnation, m.to, *correlation_id),
            MessageKind::Response {
                correlation_id,
                receiver_incarnation,
                ..
            } => (m.to, *receiver_incarnation, m.from, *correlation_id),
        };
        let delay = self.rng.gen_range(1..=2 * self.params.delay_max_ms + 10);
        self.push(
            delay,
            Event::RequestFailed {
                node,
                incarnation,
                to,
                correlation_id,
            },
        );
    }

    fn transmit(&mut self, m: Message) {
        self.stats.messages += 1;
        if self.params.loss > 0.0 && self.rng.gen_bool(self.params.loss) {
            self.stats.lost += 1;
            self.maybe_report_failure(&m);
            return;
        }
        let copies = if self.params.dup > 0.0 && self.rng.gen_bool(self.params.dup) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = self.rng.gen_range(self.params.delay_min_ms..=self.params.delay_max_ms);
            self.push(delay, Event::Deliver(m.clone()));
        }
    }

    // -----------------------------------------------------------------------
    // Engine calls and their actions

    /// Calls the engine of `id`, carries out the actions it produced, and
    /// checks the engine's accessors against what its actions announced.
    fn with_engine<R>(&mut self, id: NodeId, call: impl FnOnce(&mut RaftNode, u64) -> R) -> Result<R, Violation> {
        let now = self.now;
        let n = self.node_mut(id);
        let engine = n.engine.as_mut().expect("engine of an up node");
        let result = call(engine, now);
        let actions = engine.take_actions();
        self.apply_actions(id, actions)?;
        if self.node(id).up {
            self.check_accessors(id)?;
            self.reschedule_deadline(id);
        }
        Ok(result)
    }

    fn apply_actions(&mut self, id: NodeId, actions: Vec<Action>) -> Check {
        let crash_at = if self.chaos
            && self.params.crash_mid_actions > 0.0
            && actions.len() > 1
            && self.rng.gen_bool(self.params.crash_mid_actions)
        {
            Some(self.rng.gen_range(1..actions.len()))
        } else {
            None
        };
        for (i, action) in actions.into_iter().enumerate() {
            if crash_at == Some(i) {
                self.line(id, || format!("crash after {i} actions of this step"));
                self.stats.mid_action_crashes += 1;
                self.crash(id)?;
                self.schedule_restart(id);
                return Ok(());
            }
            self.trace.action(id, &action);
            self.line(id, || describe_action(&action));
            self.apply(id, action)?;
        }
        Ok(())
    }

    fn apply(&mut self, id: NodeId, action: Action) -> Check {
        match action {
            Action::PersistElection(state) => {
                let n = self.node_mut(id);
                n.store
                    .write_election_state(&state)
                    .map_err(|e| storage(id, "write_election_state", e))?;
                self.inv.monotonic.on_persist(id, &state)?;
                self.inv.election.on_persist(id, &state)?;
                self.node_mut(id).persisted = state;
            }
            Action::AppendBatch(batch) => {
                let n = self.node_mut(id);
                if !batch.verify() {
                    return Err(violation(
                        ENGINE_CONTRACT,
                        format!("node {id} appended a batch with a bad CRC: {batch:?}"),
                    ));
                }
                if batch.base_offset != n.log.end() {
                    return Err(violation(
                        ENGINE_CONTRACT,
                        format!(
                            "node {id} appended at {} but its log ends at {}",
                            batch.base_offset,
                            n.log.end()
                        ),
                    ));
                }
                n.store.append(&batch).map_err(|e| storage(id, "append", e))?;
                let entry = n.log.append(batch).clone();
                self.stats.appends += 1;
                if let Err(mut v) = self.inv.matching.on_add(id, &entry) {
                    v.detail.push_str(&self.matching_diagnostics(id, &entry));
                    return Err(v);
                }
            }
            Action::Truncate { end_offset } => {
                let n = &self.nodes[ix(id)];
                if !n.log.is_boundary(end_offset) {
                    return Err(violation(
                        ENGINE_CONTRACT,
                        format!(
                            "node {id} truncated to {end_offset}, inside a batch: {:?}",
                            n.log.find(end_offset)
                        ),
                    ));
                }
                self.inv.committed.on_truncate(n, end_offset)?;
                let n = self.node_mut(id);
                n.store.truncate(end_offset).map_err(|e| storage(id, "truncate", e))?;
                let removed = n.log.truncate(end_offset);
                self.stats.truncated_batches += removed.len() as u64;
                self.inv.completeness.on_truncate(id, end_offset, &removed)?;
                self.inv.matching.on_remove(&removed);
                self.inv.committed.on_truncated(&removed);
            }
            Action::Flush => {
                self.stats.flushes += 1;
                let n = self.node(id);
                let max = match self.params.slow_observer_disk_max_ms {
                    slow if slow > 0 && !n.is_voter => slow,
                    _ => self.params.disk_delay_max_ms,
                };
                let delay = match n.disk_delay_ms {
                    Some(ms) => ms,
                    None => self.rng.gen_range(self.params.disk_delay_min_ms..=max),
                };
                let incarnation = self.node(id).incarnation;
                self.push(delay, Event::FlushDone { node: id, incarnation });
            }
            Action::Send {
                to,
                correlation_id,
                request,
                ..
            } => {
                if to == id || to < 1 || to as usize > self.nodes.len() {
                    return Err(violation(
                        ENGINE_CONTRACT,
                        format!("node {id} sent {request:?} to unknown node {to}"),
                    ));
                }
                self.check_request_epoch(id, to, &request)?;
                self.inv.fetch_offsets.on_send(self.node(id), to, &request)?;
                let sender_incarnation = self.node(id).incarnation;
                self.transmit(Message {
                    from: id,
                    to,
                    kind: MessageKind::Request {
                        correlation_id,
                        sender_incarnation,
                        request,
                    },
                });
            }
            Action::Respond {
                to,
                request_id,
                response,
            } => {
                self.inv.transitions.on_respond(self.node(id), to, &response)?;
                self.respond(id, to, request_id, response)?;
            }
            Action::RespondFetch {
                to,
                request_id,
                mut response,
                read,
            } => {
                if let Some(range) = read {
                    let n = self.node(id);
                    if range.until > n.log.end() || range.from > range.until {
                        return Err(violation(
                            ENGINE_CONTRACT,
                            format!(
                                "node {id} answers a fetch with {range:?} but its log ends at {}",
                                n.log.end()
                            ),
                        ));
                    }
                    response.batches = n
                        .store
                        .read(range.from, range.until, range.max_bytes)
                        .map_err(|e| storage(id, "read", e))?;
                    if range.from < range.until && response.batches.is_empty() {
                        return Err(violation(
                            STORAGE_CONTRACT,
                            format!("node {id}: read of {range:?} returned nothing"),
                        ));
                    }
                }
                self.respond(id, to, request_id, RaftResponse::Fetch(response))?;
            }
            // No node of this simulation has a snapshot, so no leader may
            // redirect a fetch to one.
            action @ (Action::RespondFetchSnapshot { .. }
            | Action::WriteSnapshotChunk { .. }
            | Action::InstallSnapshot(_)) => {
                return Err(violation(
                    ENGINE_CONTRACT,
                    format!("node {id} acts on a snapshot where none exists: {action:?}"),
                ));
            }
            Action::HighWatermark(hw) => {
                self.inv.monotonic.on_hw(&self.nodes[ix(id)], hw)?;
                self.node_mut(id).hw = hw;
                self.inv.on_hw(&self.nodes[ix(id)])?;
            }
            Action::RoleChanged(info) => {
                self.node_mut(id).role = info;
                self.inv.on_role(&self.nodes[ix(id)])?;
            }
        }
        Ok(())
    }

    /// A request names the sender's epoch, which its last `PersistElection`
    /// recorded (the engine persists every change of its election state
    /// before acting in it); a pre-vote names the epoch after it. Computed
    /// wide, so that an epoch that wrapped past `Epoch::MAX` shows.
    fn check_request_epoch(&self, id: NodeId, to: NodeId, request: &RaftRequest) -> Check {
        let current = i64::from(self.node(id).persisted.epoch);
        let (named, expected) = match request {
            RaftRequest::Vote(r) if r.pre_vote => (r.epoch, current + 1),
            RaftRequest::Vote(r) => (r.epoch, current),
            RaftRequest::BeginQuorumEpoch(r) => (r.epoch, current),
            RaftRequest::EndQuorumEpoch(r) => (r.epoch, current),
            RaftRequest::Fetch(r) => (r.current_epoch, current),
            RaftRequest::FetchSnapshot(r) => (r.current_epoch, current),
            RaftRequest::DescribeQuorum
            | RaftRequest::Append(_)
            | RaftRequest::AppendMany(_)
            | RaftRequest::Controller(_)
            | RaftRequest::ReadIndex => return Ok(()),
        };
        if i64::from(named) != expected {
            return Err(violation(
                ENGINE_CONTRACT,
                format!(
                    "node {id} (persisted epoch {current}) sent node {to} a request naming epoch {named}, not \
                     {expected}: {request:?}"
                ),
            ));
        }
        Ok(())
    }

    fn matching_diagnostics(&self, id: NodeId, entry: &Entry) -> String {
        let mut s = String::new();
        for other in &self.nodes {
            if other.id != id && other.log.find_base(entry.base).is_some_and(|e| e.epoch == entry.epoch) {
                s.push_str(&format!(
                    "; first difference: {}",
                    first_difference(self.node(id), other)
                ));
            }
        }
        s
    }

    fn respond(&mut self, id: NodeId, to: NodeId, request_id: u64, response: RaftResponse) -> Check {
        let Some(p) = self.pending_requests.remove(&request_id) else {
            return Err(violation(
                ENGINE_CONTRACT,
                format!("node {id} answered request r{request_id}, which is unknown or already answered: {response:?}"),
            ));
        };
        if p.receiver != id || p.sender != to {
            return Err(violation(
                ENGINE_CONTRACT,
                format!(
                    "node {id} answered r{request_id} to {to}, but it came from {} to {}",
                    p.sender, p.receiver
                ),
            ));
        }
        self.transmit(Message {
            from: id,
            to,
            kind: MessageKind::Response {
                correlation_id: p.correlation_id,
                receiver_incarnation: p.sender_incarnation,
                response,
            },
        });
        Ok(())
    }

    /// The engine's accessors agree with what its actions announced.
    fn check_accessors(&mut self, id: NodeId) -> Check {
        let n = self.node(id);
        let engine = n.engine.as_ref().unwrap();
        let role = engine.role();
        if (role.role, role.epoch, role.leader_id) != (n.role.role, n.role.epoch, n.role.leader_id) {
            return Err(violation(
                ENGINE_CONTRACT,
                format!(
                    "node {id}: role() is {role:?} but the last RoleChanged said {:?}",
                    n.role
                ),
            ));
        }
        let hw = engine.high_watermark();
        if hw != n.hw {
            return Err(violation(
                ENGINE_CONTRACT,
                format!(
                    "node {id}: high_watermark() is {hw} but the last HighWatermark said {}",
                    n.hw
                ),
            ));
        }
        let end = engine.log().end_offset();
        if end != n.log.end() {
            return Err(violation(
                ENGINE_CONTRACT,
                format!(
                    "node {id}: log().end_offset() is {end} but its actions leave the log at {}",
                    n.log.end()
                ),
            ));
        }
        Ok(())
    }

    fn reschedule_deadline(&mut self, id: NodeId) {
        let now = self.now;
        let n = self.node(id);
        let deadline = n.engine.as_ref().unwrap().next_deadline_ms().max(now);
        if deadline - now > 3_600_000 {
            return; // nothing due
        }
        if n.deadline_at.is_some_and(|at| at <= deadline) {
            return; // an earlier tick is already due; it reschedules
        }
        let incarnation = n.incarnation;
        self.node_mut(id).deadline_at = Some(deadline);
        self.push(deadline - now, Event::DeadlineTick { node: id, incarnation });
    }

    // -----------------------------------------------------------------------
    // Node lifecycle

    /// Starts (or restarts) the engine of `id` from its store.
    fn start_node(&mut self, id: NodeId) -> Check {
        let seed: u64 = self.rng.gen();
        let now = self.now;
        let n = self.node_mut(id);
        let election = n.store.election_state().map_err(|e| storage(id, "election_state", e))?;
        let view = LogView::new(
            n.store.start_offset(),
            n.store.start_epoch(),
            n.store.end_offset(),
            n.store.epoch_cache(),
        );
        let mut engine = RaftNode::new(n.config.clone(), election.clone(), view, now, seed);
        // Committed, and below the durable log end (the engine caps it).
        engine.restore_committed(n.hw_hint);
        let actions = engine.take_actions();
        let initial = engine.role();
        n.engine = Some(engine);
        n.up = true;
        n.hw = 0;
        n.deadline_at = None;
        n.persisted = election.clone();
        // Until a RoleChanged says otherwise: what the engine started as.
        n.role = initial.clone();
        let announced_role = actions.iter().any(|a| matches!(a, Action::RoleChanged(_)));
        if !announced_role {
            self.inv.on_role(&self.nodes[ix(id)])?;
        } else {
            self.node_mut(id).role = RoleInfo {
                role: RoleKind::Unattached,
                epoch: election.epoch,
                leader_id: None,
                voted_for: None,
                is_voter: self.node(id).is_voter,
            };
        }
        self.line(id, || format!("start as {initial:?} from {election:?}"));
        self.apply_actions(id, actions)?;
        if !self.node(id).up {
            return Ok(()); // crashed while starting
        }
        let engine_hw = self.node(id).engine.as_ref().unwrap().high_watermark();
        if engine_hw > self.node(id).hw {
            self.node_mut(id).hw = engine_hw;
            self.inv.on_hw(&self.nodes[ix(id)])?;
        }
        self.check_accessors(id)?;
        self.reschedule_deadline(id);
        Ok(())
    }

    pub fn crash(&mut self, id: NodeId) -> Check {
        if !self.node(id).up {
            return Ok(());
        }
        self.stats.crashes += 1;
        self.line(id, || "CRASH".to_string());
        let n = self.node_mut(id);
        n.engine = None;
        n.up = false;
        n.incarnation += 1;
        n.deadline_at = None;
        n.hw = 0;
        n.store.crash();
        let (removed, restored) = n.log.crash();
        self.inv.matching.on_remove(&removed);
        for e in &restored {
            self.inv.matching.on_add(id, e)?;
        }
        self.check_store_matches_mirror(id)?;
        self.inv.committed.on_crash(id);
        self.inv.completeness.on_crash(id);
        self.inv.durability.on_leadership_lost(&self.nodes[ix(id)]);
        self.pending_requests.retain(|_, p| p.receiver != id);
        Ok(())
    }

    /// After a crash the store holds exactly the durable log the actions
    /// produced.
    fn check_store_matches_mirror(&self, id: NodeId) -> Check {
        let n = self.node(id);
        let durable: Vec<&Batch> = durable_batches(&n.store).collect();
        let mirror: Vec<&Entry> = n.log.entries().iter().collect();
        let same = durable.len() == mirror.len()
            && durable
                .iter()
                .zip(&mirror)
                .all(|(b, e)| b.base_offset == e.base && b.epoch == e.epoch && b.crc == e.crc);
        if !same || n.store.end_offset() != n.log.end() {
            return Err(violation(
                STORAGE_CONTRACT,
                format!(
                    "node {id} after a crash: store holds {:?} (end {}), expected {:?}",
                    durable.iter().map(|b| (b.base_offset, b.epoch)).collect::<Vec<_>>(),
                    n.store.end_offset(),
                    mirror.iter().map(|e| (e.base, e.epoch)).collect::<Vec<_>>()
                ),
            ));
        }
        let mut cache: Vec<(Epoch, Offset)> = Vec::new();
        for e in &mirror {
            if cache.last().map(|c| c.0) != Some(e.epoch) {
                cache.push((e.epoch, e.base));
            }
        }
        if n.store.epoch_cache() != cache {
            return Err(violation(
                STORAGE_CONTRACT,
                format!(
                    "node {id} after a crash: epoch cache {:?}, expected {cache:?}",
                    n.store.epoch_cache()
                ),
            ));
        }
        Ok(())
    }

    fn schedule_restart(&mut self, id: NodeId) {
        let delay = self.rng.gen_range(0..=self.params.restart_delay_max_ms);
        self.push(delay, Event::Restart { node: id });
    }

    pub fn restart(&mut self, id: NodeId) -> Check {
        if self.node(id).up {
            return Ok(());
        }
        self.stats.restarts += 1;
        self.start_node(id)
    }

    pub fn resign(&mut self, id: NodeId) -> Check {
        if !self.node(id).up {
            return Ok(());
        }
        self.stats.resigns += 1;
        self.line(id, || "RESIGN".to_string());
        self.with_engine(id, |e, now| e.resign(now))
    }

    // -----------------------------------------------------------------------
    // Partitions

    pub fn heal(&mut self) {
        if !self.blocked.is_empty() {
            self.line(0, || "HEAL".to_string());
        }
        self.blocked.clear();
        self.partition_generation += 1;
    }

    /// Blocks the directed link `from → to`.
    pub fn block(&mut self, from: NodeId, to: NodeId) {
        self.blocked.insert((from, to));
    }

    /// Cuts `id` off from every other node, both ways.
    pub fn isolate(&mut self, id: NodeId) {
        for other in 1..=self.nodes.len() as NodeId {
            if other != id {
                self.block(id, other);
                self.block(other, id);
            }
        }
    }

    /// Cuts every link between the two groups, both ways.
    pub fn split(&mut self, a: &[NodeId], b: &[NodeId]) {
        for &x in a {
            for &y in b {
                self.block(x, y);
                self.block(y, x);
            }
        }
    }

    fn random_partition(&mut self) {
        self.blocked.clear();
        self.partition_generation += 1;
        self.stats.partitions += 1;
        let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        let pick = |rng: &mut SmallRng| ids[rng.gen_range(0..ids.len())];
        match self.rng.gen_range(0..5) {
            0 => {
                let x = pick(&mut self.rng);
                self.isolate(x);
            }
            1 => {
                let x = self.leader().unwrap_or_else(|| pick(&mut self.rng));
                self.isolate(x);
            }
            2 => {
                let (a, b): (Vec<NodeId>, Vec<NodeId>) = ids.iter().partition(|_| self.rng.gen_bool(0.5));
                self.split(&a, &b);
            }
            3 => {
                // One-way: x can send but not receive, or the reverse.
                let x = pick(&mut self.rng);
                let outbound = self.rng.gen_bool(0.5);
                for &y in ids.iter().filter(|&&y| y != x) {
                    if outbound {
                        self.block(x, y);
                    } else {
                        self.block(y, x);
                    }
                }
            }
            _ => {
                let x = pick(&mut self.rng);
                let y = pick(&mut self.rng);
                if x != y {
                    self.block(x, y);
                    if self.rng.gen_bool(0.5) {
                        self.block(y, x);
                    }
                }
            }
        }
        let blocked = format!("{:?}", self.blocked);
        self.line(0, || format!("PARTITION {blocked}"));
    }

    // -----------------------------------------------------------------------
    // Clients

    fn random_proposal(&mut self) -> Check {
        let up: Vec<NodeId> = self.nodes.iter().filter(|n| n.up).map(|n| n.id).collect();
        if up.is_empty() {
            return Ok(());
        }
        let leaders: Vec<NodeId> = up
            .iter()
            .copied()
            .filter(|&id| self.node(id).role.role == RoleKind::Leader)
            .collect();
        let target = if leaders.is_empty() || self.rng.gen_bool(self.params.propose_to_non_leader) {
            up[self.rng.gen_range(0..up.len())]
        } else {
            leaders[self.rng.gen_range(0..leaders.len())]
        };
        let count = self.rng.gen_range(1..=self.params.max_records_per_proposal);
        if count > 1 && self.rng.gen_bool(0.25) {
            // The same records as several clients' appends handed over
            // together (the HTTP funnel): `propose_many`. The offered load
            // stays what the parameters were tuned for.
            let groups = self.rng.gen_range(2..=count.min(4));
            let counts: Vec<usize> = (0..groups)
                .map(|i| count / groups + usize::from(i < count % groups))
                .collect();
            return self.propose_many(target, &counts).map(|_| ());
        }
        self.propose(target, count).map(|_| ())
    }

    /// A client proposes `count` fresh data records to node `id`. Checks
    /// that only a leader accepts, and tracks the proposal until it is
    /// acknowledged or its outcome becomes unknown.
    pub fn propose(&mut self, id: NodeId, count: usize) -> Result<Result<Proposed, ProposeError>, Violation> {
        let mut outcomes = self.propose_with(id, &[count], |e, now, mut groups| {
            vec![e.propose(now, groups.pop().expect("one group"))]
        })?;
        Ok(outcomes.pop().expect("one outcome"))
    }

    /// Several clients propose at once, `counts[i]` fresh records each, in
    /// one `propose_many` call; each proposal is checked and tracked as in
    /// [`Cluster::propose`].
    pub fn propose_many(
        &mut self,
        id: NodeId,
        counts: &[usize],
    ) -> Result<Vec<Result<Proposed, ProposeError>>, Violation> {
        self.propose_with(id, counts, |e, now, groups| e.propose_many(now, groups))
    }

    fn propose_with(
        &mut self,
        id: NodeId,
        counts: &[usize],
        call: impl FnOnce(&mut RaftNode, u64, Vec<Vec<Record>>) -> Vec<Result<Proposed, ProposeError>>,
    ) -> Result<Vec<Result<Proposed, ProposeError>>, Violation> {
        let n = self.node(id);
        if !n.up {
            let refused = ProposeError::NotLeader {
                leader_id: None,
                epoch: n.role.epoch,
            };
            return Ok(vec![Err(refused); counts.len()]);
        }
        let was_leader = n.role.role == RoleKind::Leader;
        let leader_epoch = n.role.epoch;
        let incarnation = n.incarnation;
        let mut firsts = Vec::with_capacity(counts.len());
        let mut groups = Vec::with_capacity(counts.len());
        for &count in counts {
            let (first_record, records) = self.inv.durability.new_records(count);
            self.line(id, || {
                format!("propose records {first_record}..{}", first_record + count as u64)
            });
            firsts.push(first_record);
            groups.push(records);
        }
        let results = self.with_engine(id, |e, now| call(e, now, groups))?;
        for ((result, &first_record), &count) in results.iter().zip(&firsts).zip(counts) {
            self.line(id, || format!("propose -> {result:?}"));
            self.track_proposal(id, was_leader, leader_epoch, incarnation, first_record, count, result)?;
        }
        Ok(results)
    }

    #[allow(clippy::too_many_arguments)]
    fn track_proposal(
        &mut self,
        id: NodeId,
        was_leader: bool,
        leader_epoch: Epoch,
        incarnation: u64,
        first_record: u64,
        count: usize,
        result: &Result<Proposed, ProposeError>,
    ) -> Result<(), Violation> {
        match result {
            Ok(p) => {
                self.stats.proposals += 1;
                if !was_leader || p.epoch != leader_epoch {
                    return Err(violation(
                        ENGINE_CONTRACT,
                        format!(
                            "node {id} ({:?} in epoch {leader_epoch}) accepted a proposal: {p:?}",
                            self.node(id).role.role
                        ),
                    ));
                }
                self.inv.durability.on_proposed(Proposal {
                    node: id,
                    incarnation,
                    epoch: p.epoch,
                    base: p.base_offset,
                    last: p.last_offset,
                    first_record,
                    records: count as u64,
                    outcome: Outcome::Pending,
                })?;
                // Leadership may already be gone (a crash inside the step).
                self.inv.durability.on_leadership_lost(&self.nodes[ix(id)]);
            }
            Err(e) => {
                self.inv.durability.on_rejected(first_record, count);
                match e {
                    ProposeError::NotLeader { .. } if was_leader => self.stats.leader_refused += 1,
                    ProposeError::NotLeader { .. } => self.stats.not_leader += 1,
                    ProposeError::TooLarge { .. } => self.stats.too_large += 1,
                    ProposeError::DiskBehind { .. } | ProposeError::CommitBehind { .. } => self.stats.behind += 1,
                    ProposeError::LogFull { next_offset } => {
                        return Err(violation(
                            ENGINE_CONTRACT,
                            format!("node {id} called its log full at {next_offset}"),
                        ))
                    }
                    ProposeError::Empty => {
                        return Err(violation(
                            ENGINE_CONTRACT,
                            format!("node {id} called {count} records empty"),
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// The outcome of the `index`-th accepted proposal.
    pub fn outcome(&self, index: usize) -> Outcome {
        self.inv.durability.proposals[index].outcome
    }

    pub fn set_disk_delay(&mut self, id: NodeId, ms: Option<u64>) {
        self.node_mut(id).disk_delay_ms = ms;
    }

    pub fn fail(&self, v: Violation) -> Failure {
        self.failure(v)
    }
}
