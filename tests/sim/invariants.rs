//! The safety properties of docs/ARCHITECTURE.md, "Protocol rules", one checker per property, checked
//! after every step of the simulation (and, where a property is about a
//! moment inside a step, at the action that creates that moment).
//!
//! Every checker is incremental: it keeps just enough state to check what a
//! step changed, so that checking after every step stays cheap.
//!
//! 1. [`ElectionSafety`]: at most one leader per epoch, ever.
//! 2. [`LogMatching`]: two current logs that hold the same (base, epoch)
//!    batch are identical up to and including it.
//! 3. [`LeaderCompleteness`]: every committed batch (of an epoch up to the
//!    leader's) is in the log of every leader.
//! 4. [`CommittedPrefix`]: a global committed log, grown from every node's
//!    log below its high watermark; no node disagrees with it below its HW.
//! 5. [`Monotonicity`]: persisted epochs never decrease (and a vote is never
//!    changed within an epoch); high watermarks only move forward; no HW
//!    exceeds what a majority of voters durably holds.
//! 6. [`Durability`]: every acknowledged record is committed at its offset
//!    and, at the end, in every node's log; committed data records are ones
//!    a client proposed, each at most once.
//!
//! Plus [`DurableTransitions`] (persist, then switch, then reply),
//! [`DurableFetchOffsets`] (a Fetch acknowledges, and a Vote claims, only
//! what is on disk) and engine-contract checks made by the cluster itself.

use std::collections::{BTreeMap, HashMap};

use kraft::messages::{RaftRequest, RaftResponse, Record};
use kraft::raft::commit::{leadership_lost, proposal_outcome, ProposalOutcome};
use kraft::raft::{ElectionState, Epoch, NodeId, Offset, Proposed, RoleInfo, RoleKind};

use super::cluster::SimNode;
use super::log_mirror::Entry;

/// A broken property: which rule, and what happened.
#[derive(Clone, Debug)]
pub struct Violation {
    pub rule: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] {}", self.rule, self.detail)
    }
}

pub type Check = Result<(), Violation>;

pub fn violation(rule: &'static str, detail: impl Into<String>) -> Violation {
    Violation {
        rule,
        detail: detail.into(),
    }
}

fn fail(rule: &'static str, detail: impl Into<String>) -> Check {
    Err(violation(rule, detail))
}

pub const ELECTION_SAFETY: &str = "1 election safety";
pub const LOG_MATCHING: &str = "2 log matching";
pub const LEADER_COMPLETENESS: &str = "3 leader completeness";
pub const COMMITTED_PREFIX: &str = "4 committed-prefix agreement";
pub const MONOTONICITY: &str = "5 monotonicity";
pub const DURABILITY: &str = "6 durability";
pub const DURABLE_TRANSITIONS: &str = "persist, then switch, then reply";
pub const DURABLE_FETCH_OFFSET: &str = "a fetch offset is durable";
pub const DURABLE_VOTE_CLAIM: &str = "a vote claims only the durable log";
pub const ENGINE_CONTRACT: &str = "engine contract";
pub const STORAGE_CONTRACT: &str = "storage contract";
pub const LIVENESS: &str = "liveness";

fn node(nodes: &[SimNode], id: NodeId) -> &SimNode {
    &nodes[(id - 1) as usize]
}

// ---------------------------------------------------------------------------
// 1. Election safety

/// Remembers every (epoch, leader) ever seen. Also: observers never leave
/// Unattached/Follower, a candidate voted for itself, and a follower follows
/// the node that was elected in its epoch.
#[derive(Default)]
pub struct ElectionSafety {
    pub leaders: BTreeMap<Epoch, NodeId>,
}

impl ElectionSafety {
    /// A node that durably records itself as leader of an epoch has become
    /// its leader (persist, then switch), even if it crashes before the
    /// switch is announced.
    pub fn on_persist(&mut self, node_id: NodeId, state: &ElectionState) -> Check {
        if state.leader_id != Some(node_id) {
            return Ok(());
        }
        match self.leaders.get(&state.epoch) {
            Some(&other) if other != node_id => fail(
                ELECTION_SAFETY,
                format!(
                    "node {node_id} persisted itself leader of epoch {} already led by node {other}",
                    state.epoch
                ),
            ),
            _ => {
                self.leaders.insert(state.epoch, node_id);
                Ok(())
            }
        }
    }

    pub fn on_role(&mut self, n: &SimNode, info: &RoleInfo) -> Check {
        if !n.is_voter && !matches!(info.role, RoleKind::Unattached | RoleKind::Follower) {
            return fail(ELECTION_SAFETY, format!("observer {} became {:?}", n.id, info));
        }
        match info.role {
            RoleKind::Leader => {
                if info.leader_id != Some(n.id) {
                    return fail(
                        ENGINE_CONTRACT,
                        format!("node {} is leader but names leader {:?}", n.id, info.leader_id),
                    );
                }
                if let Some(&other) = self.leaders.get(&info.epoch) {
                    if other != n.id {
                        return fail(
                            ELECTION_SAFETY,
                            format!(
                                "node {} became leader of epoch {} already led by node {other}",
                                n.id, info.epoch
                            ),
                        );
                    }
                }
                self.leaders.insert(info.epoch, n.id);
            }
            RoleKind::Follower => {
                let Some(leader) = info.leader_id else {
                    return fail(
                        ENGINE_CONTRACT,
                        format!("node {} is a follower with no leader: {info:?}", n.id),
                    );
                };
                if self.leaders.get(&info.epoch) != Some(&leader) {
                    return fail(
                        ELECTION_SAFETY,
                        format!(
                            "node {} follows node {leader} in epoch {}, but the elected leader of that epoch is {:?}",
                            n.id,
                            info.epoch,
                            self.leaders.get(&info.epoch)
                        ),
                    );
                }
            }
            RoleKind::Candidate if info.voted_for != Some(n.id) => {
                return fail(
                    ELECTION_SAFETY,
                    format!("candidate {} has not voted for itself: {info:?}", n.id),
                );
            }
            _ => {}
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// 2. Log matching

/// For every (base, epoch) batch held in some node's *current* log: the
/// chain hash of the log up to it, and how many nodes hold it.
#[derive(Default)]
pub struct LogMatching {
    held: HashMap<(Offset, Epoch), (u64, u32, NodeId)>,
}

impl LogMatching {
    pub fn on_add(&mut self, node_id: NodeId, entry: &Entry) -> Check {
        let slot = self
            .held
            .entry((entry.base, entry.epoch))
            .or_insert((entry.chain, 0, node_id));
        if slot.1 > 0 && slot.0 != entry.chain {
            return fail(
                LOG_MATCHING,
                format!(
                    "node {node_id} holds batch {} whose log up to there differs from node {}'s copy",
                    entry.describe(),
                    slot.2
                ),
            );
        }
        if slot.1 == 0 {
            *slot = (entry.chain, 0, node_id);
        }
        slot.1 += 1;
        Ok(())
    }

    pub fn on_remove(&mut self, entries: &[Entry]) {
        for e in entries {
            let key = (e.base, e.epoch);
            let slot = self.held.get_mut(&key).expect("removed batch was held");
            slot.1 -= 1;
            if slot.1 == 0 {
                self.held.remove(&key);
            }
        }
    }
}

/// Where two logs first differ (for a failure report).
pub fn first_difference(a: &SimNode, b: &SimNode) -> String {
    for (x, y) in a.log.entries().iter().zip(b.log.entries()) {
        if !x.same_batch(y) {
            return format!("node {}: {} vs node {}: {}", a.id, x.describe(), b.id, y.describe());
        }
    }
    format!(
        "node {} ends at {}, node {} at {}",
        a.id,
        a.log.end(),
        b.id,
        b.log.end()
    )
}

// ---------------------------------------------------------------------------
// 3. Leader completeness

/// For each node that is currently leader: its epoch and how much of the
/// committed log has been verified to be in its log.
#[derive(Default)]
pub struct LeaderCompleteness {
    leaders: BTreeMap<NodeId, (Epoch, Offset)>,
}

impl LeaderCompleteness {
    pub fn on_role(&mut self, n: &SimNode, info: &RoleInfo, committed: &CommittedPrefix) -> Check {
        if info.role == RoleKind::Leader {
            self.leaders.insert(n.id, (info.epoch, 0));
            self.verify(n, committed)
        } else {
            self.leaders.remove(&n.id);
            Ok(())
        }
    }

    pub fn on_truncate(&mut self, node_id: NodeId, end_offset: Offset, removed: &[Entry]) -> Check {
        if !removed.is_empty() {
            if let Some((epoch, _)) = self.leaders.get(&node_id) {
                return fail(
                    LEADER_COMPLETENESS,
                    format!("node {node_id}, leader of epoch {epoch}, truncated its own log to {end_offset}"),
                );
            }
        }
        Ok(())
    }

    pub fn on_crash(&mut self, node_id: NodeId) {
        self.leaders.remove(&node_id);
    }

    pub fn after_step(&mut self, nodes: &[SimNode], committed: &CommittedPrefix) -> Check {
        let ids: Vec<NodeId> = self.leaders.keys().copied().collect();
        for id in ids {
            self.verify(node(nodes, id), committed)?;
        }
        Ok(())
    }

    fn verify(&mut self, n: &SimNode, committed: &CommittedPrefix) -> Check {
        let (epoch, upto) = self.leaders.get_mut(&n.id).expect("a leader");
        while *upto < committed.end {
            let i = committed.log.partition_point(|c| c.next <= *upto);
            let c = &committed.log[i];
            if committed.commit_epochs[i] > *epoch {
                // Committed in a later epoch: this leader is stale and need
                // not hold it.
                *upto = c.next.min(committed.end);
                continue;
            }
            match n.log.find_base(c.base) {
                Some(e) if e.same_batch(c) => *upto = c.next.min(committed.end),
                other => {
                    return fail(
                        LEADER_COMPLETENESS,
                        format!(
                            "node {}, leader of epoch {epoch}, lacks batch {} committed in epoch {}: it holds {:?}",
                            n.id,
                            c.describe(),
                            committed.commit_epochs[i],
                            other.map(|e| e.describe())
                        ),
                    )
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// 4. Committed-prefix agreement

/// The global committed log: contiguous batches from offset 0, committed up
/// to `end` (which may fall inside the last batch).
#[derive(Default)]
pub struct CommittedPrefix {
    pub log: Vec<Entry>,
    /// For each batch of `log`: the epoch in which it became committed (the
    /// epoch of the node whose high watermark first covered it).
    pub commit_epochs: Vec<Epoch>,
    pub end: Offset,
    /// Per node: offsets below this were checked against the committed log
    /// (and the node's log has not changed below it since).
    agreed: BTreeMap<NodeId, Offset>,
    /// Followers that truncated committed batches (while their own HW was
    /// below them). Not a listed invariant, but worth knowing.
    pub truncations_of_committed: u64,
}

impl CommittedPrefix {
    pub fn find(&self, offset: Offset) -> Option<&Entry> {
        let i = self.log.partition_point(|e| e.next <= offset);
        self.log.get(i).filter(|e| e.base <= offset)
    }

    pub fn last(&self) -> Option<&Entry> {
        if self.end == 0 {
            None
        } else {
            self.find(self.end - 1)
        }
    }

    /// Node `n` has high watermark `hw`: everything in its log below it is
    /// committed. Returns the batches newly added to the committed log.
    pub fn on_hw(&mut self, n: &SimNode, hw: Offset) -> Result<Vec<Entry>, Violation> {
        let agreed = self.agreed.entry(n.id).or_insert(0);
        let mut added = Vec::new();
        let mut offset = *agreed;
        while offset < hw {
            let Some(e) = n.log.find(offset) else {
                return Err(violation(
                    COMMITTED_PREFIX,
                    format!("node {} has high watermark {hw} past its log end {}", n.id, n.log.end()),
                ));
            };
            let i = self.log.partition_point(|c| c.next <= offset);
            match self.log.get(i) {
                Some(c) if c.base <= offset => {
                    if !c.same_batch(e) {
                        return Err(violation(
                            COMMITTED_PREFIX,
                            format!(
                                "node {} (hw {hw}) holds {} where the committed log has {}",
                                n.id,
                                e.describe(),
                                c.describe()
                            ),
                        ));
                    }
                }
                _ => {
                    let expected_base = self.log.last().map(|c| c.next).unwrap_or(0);
                    if e.base != expected_base {
                        return Err(violation(
                            COMMITTED_PREFIX,
                            format!(
                                "node {} commits {} but the committed log ends at {expected_base}",
                                n.id,
                                e.describe()
                            ),
                        ));
                    }
                    self.log.push(e.clone());
                    self.commit_epochs.push(n.role.epoch);
                    added.push(e.clone());
                }
            }
            offset = e.next;
        }
        *agreed = (*agreed).max(hw);
        self.end = self.end.max(hw);
        Ok(added)
    }

    pub fn on_truncate(&mut self, n: &SimNode, end_offset: Offset) -> Check {
        if end_offset < n.hw {
            return fail(
                COMMITTED_PREFIX,
                format!(
                    "node {} truncated to {end_offset}, below its high watermark {}",
                    n.id, n.hw
                ),
            );
        }
        let agreed = self.agreed.entry(n.id).or_insert(0);
        *agreed = (*agreed).min(end_offset);
        Ok(())
    }

    /// Counts truncations that removed committed batches (allowed above the
    /// node's own HW, but a sign of a needlessly deep truncation).
    pub fn on_truncated(&mut self, removed: &[Entry]) {
        if removed
            .first()
            .is_some_and(|e| e.base < self.end && self.find(e.base).is_some_and(|c| c.same_batch(e)))
        {
            self.truncations_of_committed += 1;
        }
    }

    /// A crash replaces the node's log with its durable one: check it again
    /// from the start.
    pub fn on_crash(&mut self, node_id: NodeId) {
        self.agreed.insert(node_id, 0);
    }
}

// ---------------------------------------------------------------------------
// 5. Monotonicity

#[derive(Default)]
pub struct Monotonicity {
    persisted: BTreeMap<NodeId, ElectionState>,
}

impl Monotonicity {
    pub fn on_persist(&mut self, node_id: NodeId, state: &ElectionState) -> Check {
        if let Some(prev) = self.persisted.get(&node_id) {
            if state.epoch < prev.epoch {
                return fail(
                    MONOTONICITY,
                    format!("node {node_id} persisted epoch {} after {}", state.epoch, prev.epoch),
                );
            }
            if state.epoch == prev.epoch {
                if prev.voted_for.is_some() && state.voted_for != prev.voted_for {
                    return fail(
                        MONOTONICITY,
                        format!(
                            "node {node_id} changed its vote in epoch {}: {prev:?} then {state:?}",
                            state.epoch
                        ),
                    );
                }
                if prev.leader_id.is_some() && state.leader_id != prev.leader_id {
                    return fail(
                        MONOTONICITY,
                        format!(
                            "node {node_id} changed the leader of epoch {}: {prev:?} then {state:?}",
                            state.epoch
                        ),
                    );
                }
            }
        }
        self.persisted.insert(node_id, state.clone());
        Ok(())
    }

    /// A `HighWatermark` action: the HW moves forward (the action's contract;
    /// for a leader, docs/ARCHITECTURE.md's "never decreases").
    pub fn on_hw(&mut self, n: &SimNode, new_hw: Offset) -> Check {
        if new_hw <= n.hw {
            let rule = if n.role.role == RoleKind::Leader {
                MONOTONICITY
            } else {
                ENGINE_CONTRACT
            };
            return fail(
                rule,
                format!(
                    "node {} ({:?}) moved its high watermark from {} to {new_hw}",
                    n.id, n.role.role, n.hw
                ),
            );
        }
        Ok(())
    }

    /// No HW exceeds what a majority of voters durably hold: the committed
    /// batch holding `end − 1` must be in the durable log of a majority.
    pub fn after_step(&mut self, nodes: &[SimNode], committed: &CommittedPrefix) -> Check {
        let Some(last) = committed.last() else {
            return Ok(());
        };
        let mut voters = 0;
        let mut holding = 0;
        for n in nodes.iter().filter(|n| n.is_voter) {
            voters += 1;
            holding += n.log.durably_holds(last) as usize;
        }
        if holding < voters / 2 + 1 {
            let who: Vec<NodeId> = nodes
                .iter()
                .filter(|n| n.is_voter)
                .filter(|n| n.log.durably_holds(last))
                .map(|n| n.id)
                .collect();
            let hws: Vec<(NodeId, Offset)> = nodes.iter().map(|n| (n.id, n.hw)).collect();
            return fail(
                MONOTONICITY,
                format!(
                    "high watermark {} (hws {hws:?}) but committed batch {} is durable only on voters {who:?} of {}",
                    committed.end,
                    last.describe(),
                    voters
                ),
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Persist, then switch, then reply

/// A voter's Candidate, Leader, Follower and Resigned states and a granted
/// vote are durable before the switch (or the reply) happens.
#[derive(Default)]
pub struct DurableTransitions;

impl DurableTransitions {
    pub fn on_role(&self, n: &SimNode, info: &RoleInfo) -> Check {
        if !n.is_voter {
            return Ok(());
        }
        let p = &n.persisted;
        let ok = match info.role {
            RoleKind::Candidate => p.epoch == info.epoch && p.voted_for == Some(n.id),
            RoleKind::Leader | RoleKind::Resigned => p.epoch == info.epoch && p.leader_id == Some(n.id),
            RoleKind::Follower => p.epoch == info.epoch && p.leader_id == info.leader_id,
            RoleKind::Unattached => {
                info.voted_for.is_none() || (p.epoch == info.epoch && p.voted_for == info.voted_for)
            }
            RoleKind::Prospective => true,
        };
        if ok {
            Ok(())
        } else {
            fail(
                DURABLE_TRANSITIONS,
                format!("node {} switched to {info:?} with persisted state {p:?}", n.id),
            )
        }
    }

    pub fn on_respond(&self, n: &SimNode, to: NodeId, response: &RaftResponse) -> Check {
        if let RaftResponse::Vote(v) = response {
            if v.vote_granted && !v.pre_vote {
                let p = &n.persisted;
                if p.epoch != v.epoch || p.voted_for != Some(to) {
                    return fail(
                        DURABLE_TRANSITIONS,
                        format!(
                            "node {} granted its vote in epoch {} to {to} with persisted state {p:?}",
                            n.id, v.epoch
                        ),
                    );
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// A fetch offset is durable

/// Every Fetch a node sends (as follower, or as an observer looking for the
/// leader) names a position of its *durable* log: `fetch_offset` is at most
/// the end of the prefix of its current log that is on disk (as the
/// harness's model of that disk knows it: a crash at the moment of sending
/// would leave every batch below `fetch_offset` in place), and
/// `last_fetched_epoch` is the epoch of the batch just below it. The leader
/// takes the fetch offset as "this replica holds everything below it
/// durably" (a voter's counts toward the high watermark), so an offset past
/// the disk is an acknowledgement a crash can take back (docs/ARCHITECTURE.md, "Protocol rules":
/// "Voters fsync an appended batch before their next Fetch, which is their
/// acknowledgement"; the engine holds observers to it too).
///
/// A Vote (pre-vote or not) is held to the same: `last_epoch_end_offset`
/// is at most the end of the durable prefix and `last_epoch` the epoch of
/// the batch below it. The claim decides whether voters grant, and a crash
/// takes back what was not flushed.
///
/// FetchSnapshot is not checked: its `position` is a read cursor into the
/// leader's snapshot file, which the leader uses only to pick the next
/// chunk (it records the fetcher alive, not its progress), so it
/// acknowledges nothing. (This simulation has no snapshots either.)
#[derive(Default)]
pub struct DurableFetchOffsets;

impl DurableFetchOffsets {
    pub fn on_send(&self, n: &SimNode, to: NodeId, request: &RaftRequest) -> Check {
        if let RaftRequest::Vote(v) = request {
            return Self::vote_claim(n, to, v.last_epoch, v.last_epoch_end_offset);
        }
        let RaftRequest::Fetch(f) = request else {
            return Ok(());
        };
        let durable_end = n.log.durable_prefix_end();
        if f.fetch_offset > durable_end {
            return fail(
                DURABLE_FETCH_OFFSET,
                format!(
                    "node {} ({} {:?} in epoch {}) sent node {to} a Fetch at offset {} but only [0, {durable_end}) \
                     of its log is durable (log end {})",
                    n.id,
                    if n.is_voter { "voter" } else { "observer" },
                    n.role.role,
                    n.role.epoch,
                    f.fetch_offset,
                    n.log.end()
                ),
            );
        }
        let epoch_below = match f.fetch_offset {
            0 => Some(0),
            offset => n.log.find(offset - 1).map(|e| e.epoch),
        };
        if epoch_below != Some(f.last_fetched_epoch) {
            return fail(
                DURABLE_FETCH_OFFSET,
                format!(
                    "node {} sent node {to} a Fetch at offset {} with last fetched epoch {}, but the batch below \
                     that offset is of epoch {epoch_below:?}",
                    n.id, f.fetch_offset, f.last_fetched_epoch
                ),
            );
        }
        Ok(())
    }

    fn vote_claim(n: &SimNode, to: NodeId, last_epoch: Epoch, end: Offset) -> Check {
        let durable_end = n.log.durable_prefix_end();
        let epoch_below = match end {
            0 => Some(0),
            offset => n.log.find(offset - 1).map(|e| e.epoch),
        };
        if end > durable_end || epoch_below != Some(last_epoch) {
            return fail(
                DURABLE_VOTE_CLAIM,
                format!(
                    "node {} ({:?} in epoch {}) asked node {to} for a vote claiming a log of epoch {last_epoch} \
                     ending at {end}, but only [0, {durable_end}) of its log is durable (log end {}) and the \
                     batch below {end} is of epoch {epoch_below:?}",
                    n.id,
                    n.role.role,
                    n.role.epoch,
                    n.log.end()
                ),
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// 6. Durability

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pending,
    Acknowledged,
    /// Leadership was lost (or the leader crashed) first.
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// Handed to `propose`, which accepted it.
    Proposed,
    /// `propose` refused it: it must never be committed.
    Rejected,
    Committed(Offset),
}

#[derive(Clone, Debug)]
pub struct Proposal {
    pub node: NodeId,
    pub incarnation: u64,
    pub epoch: Epoch,
    pub base: Offset,
    pub last: Offset,
    pub first_record: u64,
    pub records: u64,
    pub outcome: Outcome,
}

impl Proposal {
    /// As the engine returned it.
    pub fn proposed(&self) -> Proposed {
        Proposed {
            base_offset: self.base,
            last_offset: self.last,
            epoch: self.epoch,
        }
    }
}

/// Client records are `Record::Data(payload(id))`: the record id (8 bytes)
/// followed by a pad derived from the id, so any committed data record can
/// be traced back to the proposal that carried it.
pub struct Durability {
    max_pad: usize,
    pub proposals: Vec<Proposal>,
    /// Indexes into `proposals` of the pending ones.
    pending: Vec<usize>,
    /// What became of every record id the client made.
    records: Vec<RecordState>,
    pub acknowledged: u64,
    /// One past the last acknowledged offset.
    pub acknowledged_end: Offset,
    pub unknown: u64,
    pub committed_data_records: u64,
}

impl Durability {
    pub fn new(max_pad: usize) -> Self {
        Durability {
            max_pad,
            proposals: Vec::new(),
            pending: Vec::new(),
            records: Vec::new(),
            acknowledged: 0,
            acknowledged_end: 0,
            unknown: 0,
            committed_data_records: 0,
        }
    }

    /// The payload of record `id`.
    pub fn payload(&self, id: u64) -> Vec<u8> {
        let pad = (id.wrapping_mul(0x9e37_79b9) % (self.max_pad as u64 + 1)) as usize;
        let mut bytes = id.to_le_bytes().to_vec();
        bytes.extend(std::iter::repeat_n(id as u8, pad));
        bytes
    }

    /// Allocates `count` record ids and returns the records.
    pub fn new_records(&mut self, count: usize) -> (u64, Vec<Record>) {
        let first = self.records.len() as u64;
        let records = (first..first + count as u64)
            .map(|id| Record::Data(self.payload(id)))
            .collect();
        self.records.extend(std::iter::repeat_n(RecordState::Proposed, count));
        (first, records)
    }

    /// `propose` refused these records.
    pub fn on_rejected(&mut self, first: u64, count: usize) {
        for id in first..first + count as u64 {
            self.records[id as usize] = RecordState::Rejected;
        }
    }

    pub fn on_proposed(&mut self, proposal: Proposal) -> Check {
        if proposal.last - proposal.base + 1 != proposal.records as Offset {
            return fail(
                ENGINE_CONTRACT,
                format!("proposal of {} records placed at {proposal:?}", proposal.records),
            );
        }
        self.pending.push(self.proposals.len());
        self.proposals.push(proposal);
        Ok(())
    }

    /// A newly committed batch: its data records must be client records,
    /// each committed once.
    pub fn on_committed(&mut self, entry: &Entry, leaders: &BTreeMap<Epoch, NodeId>) -> Check {
        let records = entry.batch.records().map_err(|e| {
            violation(
                COMMITTED_PREFIX,
                format!("committed batch {} does not decode: {e}", entry.describe()),
            )
        })?;
        if !leaders.contains_key(&entry.epoch) {
            return fail(
                ELECTION_SAFETY,
                format!("committed batch {} of an epoch nobody led", entry.describe()),
            );
        }
        for (i, record) in records.iter().enumerate() {
            let offset = entry.base + i as Offset;
            match record {
                Record::Data(bytes) => {
                    let id = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
                    let known = id.filter(|id| (*id as usize) < self.records.len());
                    let Some(id) = known.filter(|id| *bytes == self.payload(*id)) else {
                        return fail(
                            DURABILITY,
                            format!("committed record at {offset} was never proposed: {bytes:?}"),
                        );
                    };
                    match self.records[id as usize] {
                        RecordState::Proposed => self.records[id as usize] = RecordState::Committed(offset),
                        RecordState::Rejected => {
                            return fail(
                                DURABILITY,
                                format!("record {id}, refused by propose, committed at {offset}"),
                            )
                        }
                        RecordState::Committed(prev) => {
                            return fail(
                                DURABILITY,
                                format!("record {id} committed twice, at {prev} and {offset}"),
                            )
                        }
                    }
                    self.committed_data_records += 1;
                }
                Record::LeaderChange { leader_id, .. } => {
                    if leaders.get(&entry.epoch) != Some(leader_id) {
                        return fail(
                            ELECTION_SAFETY,
                            format!(
                                "LeaderChange at {offset} names leader {leader_id} for epoch {} led by {:?}",
                                entry.epoch,
                                leaders.get(&entry.epoch)
                            ),
                        );
                    }
                }
                Record::NoOp => {}
                Record::SnapshotHeader { .. } | Record::SnapshotFooter { .. } => {
                    return fail(
                        DURABILITY,
                        format!("snapshot control record {record:?} in the log at {offset}"),
                    );
                }
            }
        }
        Ok(())
    }

    /// A `HighWatermark` action on `n`: its pending proposals are answered
    /// by the engine's rule ([`proposal_outcome`]: the HW passed their last
    /// offset while `n` still leads their epoch), and an acknowledged one
    /// must then be committed at its offsets.
    pub fn on_hw(&mut self, n: &SimNode, hw: Offset) -> Check {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.proposals[self.pending[i]];
            if p.node == n.id
                && p.incarnation == n.incarnation
                && proposal_outcome(&p.proposed(), hw, Some(&n.role)) == ProposalOutcome::Committed
            {
                p.outcome = Outcome::Acknowledged;
                let p = p.clone();
                self.pending.swap_remove(i);
                self.acknowledged += 1;
                self.acknowledged_end = self.acknowledged_end.max(p.last + 1);
                for k in 0..p.records {
                    let at = self.records[(p.first_record + k) as usize];
                    if at != RecordState::Committed(p.base + k as Offset) {
                        return fail(
                            DURABILITY,
                            format!(
                                "acknowledged record {} (proposal {p:?}) is committed at {at:?}",
                                p.first_record + k
                            ),
                        );
                    }
                }
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Leadership of a proposal's epoch is gone (role change or crash): its
    /// outcome is unknown.
    pub fn on_leadership_lost(&mut self, n: &SimNode) {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.proposals[self.pending[i]];
            let lost = p.incarnation != n.incarnation || !n.up || leadership_lost(Some(&n.role), p.epoch);
            if p.node == n.id && lost {
                p.outcome = Outcome::Unknown;
                self.pending.swap_remove(i);
                self.unknown += 1;
            } else {
                i += 1;
            }
        }
    }

    /// At the end: every acknowledged record is in every node's log.
    pub fn final_check(&self, nodes: &[SimNode]) -> Check {
        for p in self.proposals.iter().filter(|p| p.outcome == Outcome::Acknowledged) {
            for n in nodes {
                if let Some(missing) = self.first_missing(n, p) {
                    return fail(DURABILITY, missing);
                }
            }
        }
        Ok(())
    }

    /// At the end of a run in which no leader can be elected any more (the
    /// largest epoch was reached), so that lagging nodes never catch up:
    /// every acknowledged record is still in the log of a majority of
    /// voters.
    pub fn final_check_majority(&self, nodes: &[SimNode]) -> Check {
        let voters: Vec<&SimNode> = nodes.iter().filter(|n| n.is_voter).collect();
        for p in self.proposals.iter().filter(|p| p.outcome == Outcome::Acknowledged) {
            let missing: Vec<String> = voters.iter().filter_map(|n| self.first_missing(n, p)).collect();
            if voters.len() - missing.len() < voters.len() / 2 + 1 {
                return fail(
                    DURABILITY,
                    format!(
                        "an acknowledged record is on no majority of the {} voters: {}",
                        voters.len(),
                        missing.join("; ")
                    ),
                );
            }
        }
        Ok(())
    }

    /// The first record of acknowledged proposal `p` that `n`'s log lacks.
    fn first_missing(&self, n: &SimNode, p: &Proposal) -> Option<String> {
        for k in 0..p.records {
            let offset = p.base + k as Offset;
            let want = self.payload(p.first_record + k);
            let found = n.log.find(offset).and_then(|e| {
                e.batch
                    .records()
                    .ok()
                    .and_then(|r| r.get((offset - e.base) as usize).cloned())
            });
            if found != Some(Record::Data(want)) {
                return Some(format!(
                    "node {} lost acknowledged record {} at {offset}: has {found:?}",
                    n.id,
                    p.first_record + k
                ));
            }
        }
        None
    }
}

// ---------------------------------------------------------------------------

/// All checkers, fed by the cluster as it carries out events and actions.
pub struct Invariants {
    pub election: ElectionSafety,
    pub matching: LogMatching,
    pub completeness: LeaderCompleteness,
    pub committed: CommittedPrefix,
    pub monotonic: Monotonicity,
    pub transitions: DurableTransitions,
    pub fetch_offsets: DurableFetchOffsets,
    pub durability: Durability,
}

impl Invariants {
    pub fn new(max_pad: usize) -> Self {
        Invariants {
            election: ElectionSafety::default(),
            matching: LogMatching::default(),
            completeness: LeaderCompleteness::default(),
            committed: CommittedPrefix::default(),
            monotonic: Monotonicity::default(),
            transitions: DurableTransitions,
            fetch_offsets: DurableFetchOffsets,
            durability: Durability::new(max_pad),
        }
    }

    /// `n.hw` already holds the new value.
    pub fn on_hw(&mut self, n: &SimNode) -> Check {
        let added = self.committed.on_hw(n, n.hw)?;
        for e in &added {
            self.durability.on_committed(e, &self.election.leaders)?;
        }
        self.durability.on_hw(n, n.hw)
    }

    /// `n.role` already holds the new value.
    pub fn on_role(&mut self, n: &SimNode) -> Check {
        self.election.on_role(n, &n.role)?;
        self.transitions.on_role(n, &n.role)?;
        self.completeness.on_role(n, &n.role, &self.committed)?;
        self.durability.on_leadership_lost(n);
        Ok(())
    }

    pub fn after_step(&mut self, nodes: &[SimNode]) -> Check {
        self.completeness.after_step(nodes, &self.committed)?;
        self.monotonic.after_step(nodes, &self.committed)
    }
}
