//! The engine: one node's protocol state machine.
//!
//! This file holds what every role shares: the inputs (requests and
//! responses dispatched by kind, timers, proposals, storage reports), the
//! [`Action`]s, the outstanding requests, the epoch rules any message can
//! trigger, and the one gatekeeper of role changes, `RaftNode::transition`.
//! Each role keeps its state and its handlers in its own file, as in
//! Kafka's `raft/`: `unattached.rs`, `prospective.rs`, `candidate.rs` (the
//! last two share `election_round.rs`), `leader.rs` (with `leader_fetch.rs`
//! for the leader's side of replication), `follower.rs`, `resigned.rs`; a
//! Vote request, which every role answers, is handled in `vote.rs`.

use std::collections::BTreeMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::messages::{
    Batch, DescribeQuorumResponse, ErrorCode, FetchRequest, FetchResponse, FetchSnapshotResponse, RaftRequest,
    RaftResponse, Record, SnapshotId,
};

use super::accumulator::BatchAccumulator;
use super::admission::Backlog;
use super::candidate::CandidateState;
use super::election_round::ElectionRound;
use super::follower::FollowerState;
use super::leader::LeaderState;
use super::leader_fetch::ParkedFetch;
use super::resigned::ResignedState;
use super::unattached::UnattachedState;
use super::{ElectionState, Epoch, LogView, NodeId, Offset};

pub use super::follower::UnexpectedInstall;
pub use super::leader::{ProposeError, Proposed};

/// Where a client's append goes from this node ([`RaftNode::route_append`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppendRoute {
    /// This node leads: propose it here.
    Propose,
    /// Forward it to this leader.
    Forward(NodeId),
    /// Refused here; nothing was written anywhere.
    Refuse(ProposeError),
}
pub use super::leader_fetch::{ReadRange, FETCH_READ_MAX_BYTES, MAX_OBSERVERS, SNAPSHOT_CHUNK_MAX_BYTES};

/// Protocol settings (the `quorum.*` keys, already validated).
#[derive(Clone, Debug)]
pub struct RaftConfig {
    pub node_id: NodeId,
    /// Voter ids with their raft endpoints (`host:port`).
    pub voters: BTreeMap<NodeId, String>,
    /// This node's raft endpoint, sent in BeginQuorumEpoch.
    pub local_endpoint: String,
    pub election_timeout_ms: u64,
    pub fetch_timeout_ms: u64,
    pub retry_backoff_ms: u64,
    pub request_timeout_ms: u64,
    pub election_backoff_max_ms: u64,
    pub append_linger_ms: u64,
    pub max_batch_bytes: usize,
    pub max_idle_interval_ms: u64,
    /// Longest a follower asks the leader to park its fetch (Kafka: 500 ms).
    pub fetch_max_wait_ms: u64,
    /// Longest a leader with nothing uncommitted keeps a caught-up replica's
    /// fetch parked after the high watermark moved past what the replica was
    /// told, in case records come to send with the news (5 ms). Kafka
    /// (KIP-1166) answers such a fetch at once, as a leader with writes in
    /// flight here does, and as 0 does always; under a trickle of writes
    /// that costs every follower a second round trip per commit, which
    /// carries nothing but the news.
    pub high_watermark_linger_ms: u64,
    /// Largest fetch response a follower asks for (8 MiB).
    pub fetch_max_bytes: u32,
    /// The leader forgets an observer after this long without a fetch (300 s).
    pub observer_session_ms: u64,
}

impl RaftConfig {
    /// Defaults (docs/ARCHITECTURE.md, 'Protocol rules') for a node in the
    /// given voter set.
    pub fn new(node_id: NodeId, voters: BTreeMap<NodeId, String>, local_endpoint: String) -> Self {
        RaftConfig {
            node_id,
            voters,
            local_endpoint,
            election_timeout_ms: 1000,
            fetch_timeout_ms: 2000,
            retry_backoff_ms: 20,
            request_timeout_ms: 2000,
            election_backoff_max_ms: 1000,
            append_linger_ms: 0,
            max_batch_bytes: crate::messages::MAX_BATCH_BYTES,
            max_idle_interval_ms: 500,
            fetch_max_wait_ms: 500,
            high_watermark_linger_ms: 5,
            fetch_max_bytes: crate::messages::MAX_BATCH_BYTES as u32,
            observer_session_ms: 300_000,
        }
    }

    pub fn is_voter(&self) -> bool {
        self.voters.contains_key(&self.node_id)
    }

    pub fn majority(&self) -> usize {
        self.voters.len() / 2 + 1
    }
}

/// The role names of the HTTP API and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RoleKind {
    Unattached,
    Prospective,
    Candidate,
    Leader,
    Follower,
    Resigned,
}

impl RoleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RoleKind::Unattached => "unattached",
            RoleKind::Prospective => "prospective",
            RoleKind::Candidate => "candidate",
            RoleKind::Leader => "leader",
            RoleKind::Follower => "follower",
            RoleKind::Resigned => "resigned",
        }
    }

    /// Kafka's `current-state` metric value.
    pub fn metric_code(self) -> i32 {
        match self {
            RoleKind::Unattached => 0,
            RoleKind::Prospective => 1,
            RoleKind::Candidate => 2,
            RoleKind::Leader => 3,
            RoleKind::Follower => 4,
            RoleKind::Resigned => 5,
        }
    }
}

/// Who this node is right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleInfo {
    pub role: RoleKind,
    pub epoch: Epoch,
    pub leader_id: Option<NodeId>,
    pub voted_for: Option<NodeId>,
    /// False for an observer (a `broker` node).
    pub is_voter: bool,
}

/// What the engine asks its shell to do. See the module docs of
/// [`crate::raft`] for the ordering contract.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Make this election state durable before carrying out anything after it.
    PersistElection(ElectionState),
    /// Append at the log end; readable at once, durable after a later Flush.
    AppendBatch(Batch),
    /// Remove every batch at or above this offset (a batch boundary).
    Truncate { end_offset: Offset },
    /// Make all earlier log writes durable, then report `on_flushed`.
    Flush,
    /// Send a request to a voter; the answer comes back through
    /// `handle_response` (or `handle_request_failed`) with this id. The
    /// engine gives up on it after `timeout_ms`; the transport must time it
    /// out then too (one clock for one request), not on a timer of its own.
    Send {
        to: NodeId,
        correlation_id: u64,
        request: RaftRequest,
        timeout_ms: u64,
    },
    /// Answer the request the shell delivered with `request_id`.
    Respond {
        to: NodeId,
        request_id: u64,
        response: RaftResponse,
    },
    /// Answer a Fetch: fill `response.batches` from `read` (when set), then send.
    RespondFetch {
        to: NodeId,
        request_id: u64,
        response: FetchResponse,
        read: Option<ReadRange>,
    },
    /// Answer a FetchSnapshot: fill `response.size` and `response.bytes`
    /// (at most `max_bytes` from `response.position`) from the local
    /// snapshot `response.snapshot_id`, or answer SnapshotNotFound /
    /// PositionOutOfRange when it cannot.
    RespondFetchSnapshot {
        to: NodeId,
        request_id: u64,
        response: FetchSnapshotResponse,
        max_bytes: usize,
    },
    /// Write a chunk of the snapshot being fetched from the leader at
    /// `position` (the first chunk starts a new partial file; chunks come in
    /// order). Not durable, not visible until `InstallSnapshot`.
    WriteSnapshotChunk {
        snapshot_id: SnapshotId,
        size: u64,
        position: u64,
        bytes: Vec<u8>,
    },
    /// Every chunk is written: validate the snapshot, make it durable and
    /// visible, replace the whole log by an empty log starting at its end
    /// offset, and reload the listeners from it. Like `PersistElection`,
    /// nothing after it is carried out, and no other input reaches the
    /// engine, until it is done and reported with `on_snapshot_installed`
    /// (or `on_snapshot_install_failed`).
    InstallSnapshot(SnapshotId),
    /// The high watermark moved forward to this offset.
    HighWatermark(Offset),
    /// Role, epoch or leader changed.
    RoleChanged(RoleInfo),
}

/// An outstanding request this node sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RequestKind {
    PreVote,
    Vote,
    BeginQuorumEpoch,
    EndQuorumEpoch,
    Fetch,
    FetchSnapshot,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Inflight {
    pub(super) to: NodeId,
    pub(super) kind: RequestKind,
    /// `RaftNode::generation` when sent: a response that arrives after a
    /// role change only counts for its epoch information.
    pub(super) generation: u64,
    pub(super) deadline_ms: u64,
}

/// The role and its per-role state. Change it only through
/// [`RaftNode::transition`].
#[derive(Debug)]
pub(super) enum Role {
    Unattached(UnattachedState),
    Prospective(ElectionRound),
    Candidate(CandidateState),
    Leader(Box<LeaderState>),
    Follower(FollowerState),
    Resigned(ResignedState),
}

impl Role {
    pub(super) fn kind(&self) -> RoleKind {
        match self {
            Role::Unattached(_) => RoleKind::Unattached,
            Role::Prospective(_) => RoleKind::Prospective,
            Role::Candidate(_) => RoleKind::Candidate,
            Role::Leader(_) => RoleKind::Leader,
            Role::Follower(_) => RoleKind::Follower,
            Role::Resigned(_) => RoleKind::Resigned,
        }
    }
}

/// Kafka's base for election backoff (`RETRY_BACKOFF_BASE_MS`).
pub(super) const ELECTION_BACKOFF_BASE_MS: u64 = 100;

/// One node's Raft state machine.
pub struct RaftNode {
    pub(super) config: RaftConfig,
    pub(super) rng: SmallRng,
    pub(super) now_ms: u64,
    /// The election state as last persisted (or queued to be persisted ahead
    /// of every later action). Its epoch never decreases.
    pub(super) election: ElectionState,
    pub(super) role: Role,
    pub(super) log: LogView,
    /// Kafka's high watermark: the first offset not known to be committed.
    /// Never decreases on any node.
    pub(super) high_watermark: Offset,
    /// Everything below it was committed before this node last started,
    /// as its store recorded (see [`RaftNode::restore_committed`]). The
    /// high watermark starts at the log start and is learnt from the
    /// leader, as in KRaft; this keeps a leader from having the node cut
    /// or replace what it already knows committed in the meantime.
    pub(super) committed_before_start: Offset,
    /// Log end to which the flush in flight (at most one) makes the log
    /// durable; lowered by a truncation issued after it.
    pub(super) flush_target: Option<Offset>,
    pub(super) accumulator: BatchAccumulator,
    /// What waits for the disk and for the quorum (admission bounds).
    pub(super) backlog: Backlog,
    pub(super) parked: Vec<ParkedFetch>,
    pub(super) inflight: BTreeMap<u64, Inflight>,
    pub(super) next_correlation_id: u64,
    /// Bumped on every role change.
    pub(super) generation: u64,
    /// Failed candidacies since this node last saw a leader (exponential
    /// election backoff survives the pre-vote between two candidacies).
    pub(super) election_retries: u32,
    /// The newest local snapshot: what a leader sends replicas that fell
    /// below its log start.
    pub(super) latest_snapshot: Option<SnapshotId>,
    pub(super) actions: Vec<Action>,
}

impl RaftNode {
    /// Starts a node from its recovered state (the restart rules of
    /// docs/ARCHITECTURE.md, 'Protocol rules'): leader of its persisted
    /// epoch → Resigned; candidate → Candidate (asks again for votes in the
    /// same epoch); known leader → Follower; otherwise Unattached (with its
    /// vote, if any). A single-voter quorum elects itself at once. `seed`
    /// feeds election jitter and backoff.
    pub fn new(config: RaftConfig, election: ElectionState, log: LogView, now_ms: u64, seed: u64) -> Self {
        let high_watermark = log.start_offset();
        // The log holds an epoch the election state never reached: the
        // state was lost or the directory mixed up. Start Unattached in the
        // log's epoch, with no vote (as Kafka's QuorumState does): any vote
        // this node might have cast in the epochs between is unknown, so it
        // casts none in them.
        let reconciled = (election.epoch < log.last_epoch()).then(|| {
            tracing::warn!(
                election_epoch = election.epoch,
                log_epoch = log.last_epoch(),
                "the election state is of an older epoch than the log; starting unattached in the log's epoch"
            );
            ElectionState::unattached(log.last_epoch())
        });
        let election = reconciled.clone().unwrap_or(election);
        let mut node = RaftNode {
            config,
            rng: SmallRng::seed_from_u64(seed),
            now_ms,
            election: election.clone(),
            role: Role::Unattached(UnattachedState {
                election_deadline_ms: now_ms,
                next_discovery_ms: now_ms,
            }),
            log,
            high_watermark,
            committed_before_start: high_watermark,
            flush_target: None,
            accumulator: BatchAccumulator::default(),
            backlog: Backlog::default(),
            parked: Vec::new(),
            inflight: BTreeMap::new(),
            next_correlation_id: 1,
            generation: 0,
            election_retries: 1,
            latest_snapshot: None,
            actions: Vec::new(),
        };
        let me = node.config.node_id;
        let is_voter = node.config.is_voter();
        node.role = if is_voter && election.leader_id == Some(me) {
            let mut resigned = node.new_resigned(Vec::new());
            resigned.campaign_at_once = node.is_only_voter();
            Role::Resigned(resigned)
        } else if is_voter && election.voted_for == Some(me) && election.leader_id.is_none() {
            Role::Candidate(CandidateState {
                round: node.new_round(),
                retries: 1,
                backoff_until_ms: None,
            })
        } else if let Some(leader) = election.leader_id.filter(|l| *l != me) {
            Role::Follower(node.new_follower(leader))
        } else {
            Role::Unattached(node.new_unattached())
        };
        if let Some(state) = reconciled {
            // Durable before anything else this node does.
            node.actions.push(Action::PersistElection(state));
        }
        node.emit_role_changed();
        if high_watermark > 0 {
            // Everything below the log start is committed (it is in a
            // snapshot): the shell's listeners start from offset 0 and must
            // learn it even if nothing more is ever committed.
            node.actions.push(Action::HighWatermark(high_watermark));
        }
        node.poll();
        node
    }

    /// Drains the actions produced so far, in order.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// Advances timers to `now_ms`.
    pub fn tick(&mut self, now_ms: u64) {
        self.advance_clock(now_ms);
        self.poll();
    }

    /// A request from peer `from`; answer with `request_id`.
    pub fn handle_request(&mut self, now_ms: u64, from: NodeId, request_id: u64, request: RaftRequest) {
        self.advance_clock(now_ms);
        match request {
            RaftRequest::Vote(req) => self.handle_vote_request(from, request_id, req),
            RaftRequest::BeginQuorumEpoch(req) => self.handle_begin_quorum_epoch(from, request_id, req),
            RaftRequest::EndQuorumEpoch(req) => self.handle_end_quorum_epoch(from, request_id, req),
            RaftRequest::Fetch(req) if req.replica_id == from => self.handle_fetch_request(request_id, req),
            RaftRequest::Fetch(_) => {
                let response = self.fetch_error(ErrorCode::InvalidRequest);
                self.actions.push(Action::RespondFetch {
                    to: from,
                    request_id,
                    response,
                    read: None,
                });
            }
            RaftRequest::DescribeQuorum => {
                let response = RaftResponse::DescribeQuorum(self.describe(self.now_ms));
                self.respond(from, request_id, response);
            }
            RaftRequest::FetchSnapshot(req) => self.handle_fetch_snapshot_request(from, request_id, req),
            // Appends and read indexes are answered by the shell, never by
            // the protocol.
            RaftRequest::Append(_)
            | RaftRequest::AppendMany(_)
            | RaftRequest::Controller(_)
            | RaftRequest::ReadIndex => {
                self.respond(from, request_id, RaftResponse::Error(ErrorCode::InvalidRequest));
            }
        }
        self.poll();
    }

    /// The response to our `Send` with `correlation_id`.
    pub fn handle_response(&mut self, now_ms: u64, from: NodeId, correlation_id: u64, response: RaftResponse) {
        self.advance_clock(now_ms);
        let Some(sent) = self.inflight.get(&correlation_id).copied().filter(|s| s.to == from) else {
            // Timed out already, or a duplicate: only its epoch may teach us.
            self.observe_response_epoch(&response);
            self.poll();
            return;
        };
        self.inflight.remove(&correlation_id);
        let current = sent.generation == self.generation;
        match response {
            RaftResponse::Vote(resp) => self.handle_vote_response(from, sent, current, resp),
            RaftResponse::BeginQuorumEpoch(resp) => {
                self.maybe_follow_response_epoch(resp.epoch, resp.leader_id);
            }
            RaftResponse::EndQuorumEpoch(resp) => self.handle_end_quorum_epoch_response(from, current, resp),
            RaftResponse::Fetch(resp) => self.handle_fetch_response(from, current, resp),
            RaftResponse::FetchSnapshot(resp) if sent.kind == RequestKind::FetchSnapshot => {
                self.handle_fetch_snapshot_response(from, current, resp)
            }
            RaftResponse::Error(_)
            | RaftResponse::DescribeQuorum(_)
            | RaftResponse::FetchSnapshot(_)
            | RaftResponse::Append(_)
            | RaftResponse::AppendMany(_)
            | RaftResponse::Controller(_)
            | RaftResponse::ReadIndex(_) => {
                self.note_request_failed(sent);
            }
        }
        self.poll();
    }

    /// Our `Send` with `correlation_id` failed (connection lost, timeout).
    pub fn handle_request_failed(&mut self, now_ms: u64, _to: NodeId, correlation_id: u64) {
        self.advance_clock(now_ms);
        if let Some(sent) = self.inflight.remove(&correlation_id) {
            self.note_request_failed(sent);
        }
        self.poll();
    }

    /// Where a client's append of data records (their bytes) goes from
    /// this node: proposed here when it leads (the proposal then applies
    /// every rule of [`Self::propose`]), forwarded to the leader it knows
    /// otherwise, or refused, nothing written, by the same rules the leader
    /// would apply. The size rule matters before forwarding: a request of
    /// many short records can outgrow the leader's frame limit, and the
    /// leader would close the connection on every append forwarded over it.
    pub fn route_append(&self, records: &[Vec<u8>]) -> AppendRoute {
        if matches!(self.role, Role::Leader(_)) {
            return AppendRoute::Propose;
        }
        if let Err(e) = self.admit() {
            return AppendRoute::Refuse(e);
        }
        if records.is_empty() {
            return AppendRoute::Refuse(ProposeError::Empty);
        }
        let Some(leader_id) = self.leader_id().filter(|id| *id != self.config.node_id) else {
            return AppendRoute::Refuse(ProposeError::NotLeader {
                leader_id: None,
                epoch: self.election.epoch,
            });
        };
        let bytes: usize = records.iter().map(|r| Record::data_encoded_len(r.len())).sum();
        let limit = self.config.max_batch_bytes;
        if bytes > limit {
            return AppendRoute::Refuse(ProposeError::TooLarge { bytes, limit });
        }
        AppendRoute::Forward(leader_id)
    }

    /// Whether this node takes in an append now, whatever its role
    /// (`raft::admission`): refused while its disk or its quorum is behind.
    pub fn admit(&self) -> Result<(), ProposeError> {
        self.backlog.admit(self.accumulator.bytes())
    }

    /// Offers records to the leader's batch accumulator. They get their
    /// offsets now and are written with whatever else is waiting.
    pub fn propose(&mut self, now_ms: u64, records: Vec<Record>) -> Result<Proposed, ProposeError> {
        self.advance_clock(now_ms);
        let proposed = self.accumulate(records);
        self.poll();
        proposed
    }

    /// Several proposals at once, each with its own outcome, as if proposed
    /// one after another, except that all of them are in the accumulator
    /// before it next drains: with linger 0 they go into one batch (unless
    /// it fills up) even when the leader is idle, where one `propose` at a
    /// time would send the first alone and hold the rest for its flush.
    pub fn propose_many(
        &mut self,
        now_ms: u64,
        proposals: impl IntoIterator<Item = Vec<Record>>,
    ) -> Vec<Result<Proposed, ProposeError>> {
        self.advance_clock(now_ms);
        let outcomes = proposals.into_iter().map(|records| self.accumulate(records)).collect();
        self.poll();
        outcomes
    }

    /// A linearizable read's barrier, on a leader (None elsewhere): the
    /// offset the next record this leader writes takes. Once the high
    /// watermark passes it, a majority followed this leader, in its epoch,
    /// after this call, so everything committed before the call lies below
    /// the high watermark then (etcd's ReadIndex, confirmed through the
    /// log: followers fetch, leaders do not send heartbeats). When nothing
    /// waits to be written, a NoOp is written now to pass it; reads that
    /// come while records wait share their commit.
    pub fn read_barrier(&mut self, now_ms: u64) -> Option<Offset> {
        self.advance_clock(now_ms);
        if !matches!(self.role, Role::Leader(_)) {
            return None;
        }
        let barrier = self.log.end_offset();
        if self.accumulator.is_empty() {
            // Alone in its batch, as control records are.
            self.append_as_leader(vec![Record::NoOp]);
        }
        self.poll();
        Some(barrier)
    }

    /// Storage reports that the flush we asked for completed; `durable_end`
    /// is the store's end offset after it.
    pub fn on_flushed(&mut self, now_ms: u64, durable_end: Offset) {
        self.advance_clock(now_ms);
        if let Some(target) = self.flush_target.take() {
            // A truncation issued after the flush was asked for lowered the
            // target: the flush cannot vouch for what it removed and
            // rewrote, whatever the store's end now says.
            let durable = target.min(durable_end);
            self.log.on_flushed(durable);
            self.backlog.on_flushed(durable);
        }
        if let Role::Leader(_) = self.role {
            self.maybe_advance_leader_high_watermark();
        }
        self.poll();
    }

    /// The newest local snapshot.
    pub fn latest_snapshot(&self) -> Option<SnapshotId> {
        self.latest_snapshot
    }

    /// Everything below `offset` was committed before this node started
    /// (its store's high watermark hint, at most the log end). A leader's
    /// divergence that would cut below it, or a snapshot that ends below
    /// it, is refused as one below the high watermark is: a correct leader
    /// never asks for either, and the store would refuse the cut or the
    /// reset anyway, stopping the node (after a snapshot, for good: the
    /// installed file would not match its log at the next start).
    pub fn restore_committed(&mut self, offset: Offset) {
        let offset = offset.min(self.log.end_offset());
        self.committed_before_start = self.committed_before_start.max(offset);
    }

    /// The first offset this node may not give up: its high watermark, or
    /// what its store knew committed before it started, if higher.
    pub fn committed_floor(&self) -> Offset {
        self.high_watermark.max(self.committed_before_start)
    }

    /// At start, before any input: the newest valid snapshot on disk, which
    /// the log continues (the shell resets a log that does not). It holds
    /// committed state, so the high watermark is at least its end.
    pub fn restore_snapshot(&mut self, id: SnapshotId) {
        debug_assert!(id.end_offset >= self.log.start_offset() && id.end_offset <= self.log.end_offset());
        debug_assert!(
            id.end_offset == 0 || self.log.epoch_before(id.end_offset) == id.epoch,
            "the log holds the last offset of snapshot {id:?} in epoch {}",
            self.log.epoch_before(id.end_offset)
        );
        self.latest_snapshot = Some(id);
        let committed = id.end_offset.min(self.log.end_offset());
        if committed > self.high_watermark {
            self.high_watermark = committed;
            self.actions.push(Action::HighWatermark(committed));
        }
    }

    /// A snapshot of committed state was written locally. Snapshots only ever grow newer; one past the high watermark
    /// would hold uncommitted state and is ignored.
    pub fn on_snapshot_created(&mut self, now_ms: u64, id: SnapshotId) {
        self.advance_clock(now_ms);
        if id.end_offset > self.high_watermark.max(self.log.start_offset()) {
            tracing::error!(
                ?id,
                hw = self.high_watermark,
                "a snapshot past the high watermark is ignored"
            );
            return;
        }
        if self
            .latest_snapshot
            .is_none_or(|latest| id.end_offset > latest.end_offset)
        {
            self.latest_snapshot = Some(id);
        }
    }

    /// The shell carried out `InstallSnapshot(id)`: the log is now empty and
    /// starts at `id.end_offset`. Call it before `tick`: the fetch timeout
    /// runs again from now, since the time the install took was this
    /// node's own disk, not the leader's silence (the leader answered the
    /// last chunk before the install started).
    ///
    /// Only a Follower whose transfer of `id` is installing loads it (a
    /// leader never loads a snapshot). Any other call (a stale or stray
    /// report) is logged as an error and changes nothing; the shell, whose
    /// store did replace its log, must not carry on with the engine's view.
    pub fn on_snapshot_installed(&mut self, now_ms: u64, id: SnapshotId) -> Result<(), UnexpectedInstall> {
        self.advance_clock(now_ms);
        self.check_install_pending(id)?;
        self.load_installed_snapshot(id);
        self.poll();
        Ok(())
    }

    /// Everything below `start_offset` (a batch boundary at or below the
    /// high watermark and the flushed end) is being compacted into a
    /// snapshot: the log starts there now. Call it before the store deletes
    /// anything, so that no read below the new start is asked for after.
    /// Parked fetches below it are answered with the snapshot.
    pub fn on_log_start_advanced(&mut self, now_ms: u64, start_offset: Offset, start_epoch: Epoch) {
        self.advance_clock(now_ms);
        if start_offset <= self.log.start_offset() {
            return;
        }
        self.log.advance_start(start_offset, start_epoch);
        self.answer_parked_below_log_start(start_offset);
        self.poll();
    }

    /// `InstallSnapshot(id)` failed (a damaged transfer): nothing changed;
    /// the transfer starts over. Like `on_snapshot_installed`, call it
    /// before `tick`: the fetch timeout runs again from now.
    pub fn on_snapshot_install_failed(&mut self, now_ms: u64, id: SnapshotId) -> Result<(), UnexpectedInstall> {
        self.advance_clock(now_ms);
        self.check_install_pending(id)?;
        self.restart_snapshot_fetch(id);
        self.poll();
        Ok(())
    }

    /// Graceful shutdown: a leader resigns and sends EndQuorumEpoch to the
    /// voters with its preferred successors.
    pub fn resign(&mut self, now_ms: u64) {
        self.advance_clock(now_ms);
        if let Role::Leader(leader) = &self.role {
            let successors = leader.preferred_successors();
            let resigned = self.new_resigned(successors);
            self.transition(Role::Resigned(resigned), None);
        }
        self.poll();
    }

    pub fn role(&self) -> RoleInfo {
        RoleInfo {
            role: self.role.kind(),
            epoch: self.election.epoch,
            leader_id: self.leader_id(),
            voted_for: self.election.voted_for,
            is_voter: self.config.is_voter(),
        }
    }

    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }

    pub fn log(&self) -> &LogView {
        &self.log
    }

    pub fn election_state(&self) -> &ElectionState {
        &self.election
    }

    pub fn config(&self) -> &RaftConfig {
        &self.config
    }

    /// The leader's view of every replica (DescribeQuorum); others report
    /// `NotLeaderOrFollower` and empty replica lists.
    pub fn describe(&self, now_ms: u64) -> DescribeQuorumResponse {
        match &self.role {
            Role::Leader(leader) => {
                let (voters, observers) = leader.describe(now_ms, self.log.end_offset());
                DescribeQuorumResponse {
                    error: ErrorCode::None,
                    leader_id: Some(self.config.node_id),
                    leader_epoch: self.election.epoch,
                    high_watermark: self.high_watermark,
                    voters,
                    observers,
                }
            }
            _ => DescribeQuorumResponse {
                error: ErrorCode::NotLeaderOrFollower,
                leader_id: self.leader_id(),
                leader_epoch: self.election.epoch,
                high_watermark: self.high_watermark,
                voters: Vec::new(),
                observers: Vec::new(),
            },
        }
    }

    /// Earliest time at which `tick` has something to do.
    pub fn next_deadline_ms(&self) -> u64 {
        let mut next = u64::MAX;
        for sent in self.inflight.values() {
            next = next.min(sent.deadline_ms);
        }
        for parked in &self.parked {
            next = next.min(parked.deadline_ms);
        }
        let role_deadline = match &self.role {
            Role::Unattached(s) => self.unattached_deadline_ms(s),
            Role::Prospective(round) => self.prospective_deadline_ms(round),
            Role::Candidate(c) => self.candidate_deadline_ms(c),
            Role::Leader(l) => self.leader_deadline_ms(l),
            Role::Follower(f) => self.follower_deadline_ms(f),
            Role::Resigned(r) => self.resigned_deadline_ms(r),
        };
        next.min(role_deadline).max(self.now_ms)
    }

    // ----------------------------------------------------------------
    // Transitions
    // ----------------------------------------------------------------

    /// The one gatekeeper for role changes. Legal transitions (Kafka's
    /// QuorumState; docs/ARCHITECTURE.md, 'Protocol rules'):
    ///
    /// - Unattached → Unattached (higher epoch, or a vote granted), Prospective, Follower
    /// - Prospective → Candidate, Unattached, Follower
    /// - Candidate → Prospective (after a lost election and its backoff),
    ///   Leader, Unattached, Follower
    /// - Leader → Resigned, Unattached, Follower (the last two for a higher epoch)
    /// - Follower → Prospective, Unattached, Follower (higher epoch)
    /// - Resigned → Prospective, Unattached, Follower
    ///
    /// Observers are only ever Unattached or Follower. `persist` is the new
    /// election state; it is queued (and so made durable) before anything
    /// done in the new role.
    pub(super) fn transition(&mut self, next: Role, persist: Option<ElectionState>) {
        use RoleKind::*;
        let from = self.role.kind();
        let to = next.kind();
        // A table reads better than one long `matches!`.
        #[allow(clippy::match_like_matches_macro)]
        let legal = match (from, to) {
            (_, Unattached) | (_, Follower) => true,
            (Unattached, Prospective) | (Follower, Prospective) | (Resigned, Prospective) => true,
            (Prospective, Candidate) => true,
            (Candidate, Leader) | (Candidate, Prospective) => true,
            (Leader, Resigned) => true,
            _ => false,
        };
        assert!(
            legal,
            "illegal transition {from:?} -> {to:?} in epoch {}",
            self.election.epoch
        );
        assert!(
            self.config.is_voter() || matches!(to, Unattached | Follower),
            "observer {} cannot become {to:?}",
            self.config.node_id
        );
        if from == Leader {
            // Fetches held within the high watermark linger still owe their
            // replicas the news; told as this epoch's leader, before it goes.
            self.complete_parked_behind_on_high_watermark();
        }
        if let Some(state) = persist {
            assert!(
                state.epoch >= self.election.epoch,
                "epoch would go back from {} to {}",
                self.election.epoch,
                state.epoch
            );
            if state != self.election {
                self.election = state.clone();
                self.actions.push(Action::PersistElection(state));
            }
        }
        self.role = next;
        self.generation += 1;
        if from == Leader {
            // After the switch, so the answers name the new epoch's leader
            // (or none), never this node.
            self.abandon_leadership();
        }
        self.emit_role_changed();
    }

    fn emit_role_changed(&mut self) {
        let info = self.role();
        self.actions.push(Action::RoleChanged(info));
    }

    /// A higher epoch seen anywhere moves us into it first: as Follower when
    /// its leader is named (and is not us), else Unattached.
    pub(super) fn become_unattached_or_follower(&mut self, epoch: Epoch, leader_id: Option<NodeId>) {
        match leader_id.filter(|l| *l != self.config.node_id) {
            Some(leader) => self.become_follower(epoch, leader),
            None => {
                let persist = ElectionState::unattached(epoch);
                let role = Role::Unattached(self.new_unattached());
                self.transition(role, Some(persist));
            }
        }
    }

    /// Every other voter, each due for a request now.
    pub(super) fn other_voters_due_now(&self) -> BTreeMap<NodeId, u64> {
        let me = self.config.node_id;
        self.config
            .voters
            .keys()
            .filter(|id| **id != me)
            .map(|id| (*id, self.now_ms))
            .collect()
    }

    // ----------------------------------------------------------------
    // Timers and sending
    // ----------------------------------------------------------------

    fn advance_clock(&mut self, now_ms: u64) {
        // Time never runs backwards inside the engine.
        self.now_ms = self.now_ms.max(now_ms);
    }

    /// Runs every timer that is due and sends what the current role needs.
    /// Called at the end of every input.
    fn poll(&mut self) {
        let now = self.now_ms;
        let expired: Vec<u64> = self
            .inflight
            .iter()
            .filter(|(_, s)| s.deadline_ms <= now)
            .map(|(c, _)| *c)
            .collect();
        for correlation_id in expired {
            let sent = self.inflight.remove(&correlation_id).expect("listed");
            self.note_request_failed(sent);
        }
        // A role change inside one pass lets the new role act at once
        // (Unattached → Prospective → Candidate → Leader for a single voter);
        // each pass that changes role is progress, so a few passes suffice.
        for _ in 0..8 {
            let generation = self.generation;
            self.poll_parked();
            match self.role.kind() {
                RoleKind::Unattached => self.poll_unattached(),
                RoleKind::Prospective => self.poll_prospective(),
                RoleKind::Candidate => self.poll_candidate(),
                RoleKind::Leader => self.poll_leader(),
                RoleKind::Follower => self.poll_follower(),
                RoleKind::Resigned => self.poll_resigned(),
            }
            if generation == self.generation {
                break;
            }
        }
        self.maybe_flush();
    }

    pub(super) fn send_fetch(&mut self, to: NodeId) {
        let fetch_offset = self.log.end_offset();
        let request = RaftRequest::Fetch(FetchRequest {
            replica_id: self.config.node_id,
            current_epoch: self.election.epoch,
            fetch_offset,
            last_fetched_epoch: self.log.epoch_before(fetch_offset),
            max_wait_ms: self.config.fetch_max_wait_ms,
            max_bytes: self.config.fetch_max_bytes,
        });
        self.send(to, RequestKind::Fetch, request);
    }

    pub(super) fn send(&mut self, to: NodeId, kind: RequestKind, request: RaftRequest) {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id += 1;
        // A parked fetch may legitimately take max_wait before its answer.
        let mut timeout = self.config.request_timeout_ms;
        if kind == RequestKind::Fetch {
            timeout = timeout.max(self.config.fetch_max_wait_ms + self.config.request_timeout_ms / 2);
        }
        self.inflight.insert(
            correlation_id,
            Inflight {
                to,
                kind,
                generation: self.generation,
                deadline_ms: self.now_ms + timeout,
            },
        );
        self.actions.push(Action::Send {
            to,
            correlation_id,
            request,
            timeout_ms: timeout,
        });
    }

    /// Whether a follower or an observer may send its next Fetch now: none
    /// in flight, and its log durable. A voter acknowledges by fetching, so
    /// only once what it holds is on disk. An observer waits too, though its
    /// fetch offset counts for nothing: else it fetches as fast as the leader
    /// answers while its disk falls behind, and what it has fetched but not
    /// yet written piles up in memory (a fresh observer reading a log of 1M
    /// records grew to 168 MiB). So each node holds at most one fetch answer
    /// that is not on disk.
    pub(super) fn may_fetch(&self) -> bool {
        !self.has_inflight(RequestKind::Fetch) && !self.log.has_unflushed()
    }

    pub(super) fn has_inflight(&self, kind: RequestKind) -> bool {
        self.inflight
            .values()
            .any(|s| s.kind == kind && s.generation == self.generation)
    }

    pub(super) fn has_inflight_to(&self, to: NodeId, kind: RequestKind) -> bool {
        self.inflight
            .values()
            .any(|s| s.to == to && s.kind == kind && s.generation == self.generation)
    }

    fn note_request_failed(&mut self, sent: Inflight) {
        if sent.generation != self.generation {
            return;
        }
        let retry = self.now_ms + self.config.retry_backoff_ms.max(1);
        match &mut self.role {
            Role::Follower(f) if matches!(sent.kind, RequestKind::Fetch | RequestKind::FetchSnapshot) => {
                f.next_fetch_ms = retry
            }
            Role::Prospective(round) => {
                round.retry_at_ms.insert(sent.to, retry);
            }
            Role::Candidate(c) => {
                c.round.retry_at_ms.insert(sent.to, retry);
            }
            Role::Resigned(r) => {
                r.retry_at_ms.insert(sent.to, retry);
            }
            _ => {}
        }
    }

    pub(super) fn respond(&mut self, to: NodeId, request_id: u64, response: RaftResponse) {
        self.actions.push(Action::Respond {
            to,
            request_id,
            response,
        });
    }

    fn maybe_flush(&mut self) {
        if self.flush_target.is_none() && self.log.has_unflushed() {
            self.flush_target = Some(self.log.end_offset());
            self.actions.push(Action::Flush);
        }
    }

    pub(super) fn truncate_log(&mut self, end_offset: Offset) {
        self.log.truncate(end_offset);
        self.backlog.on_truncate(end_offset);
        if let Some(target) = &mut self.flush_target {
            *target = (*target).min(end_offset);
        }
        self.actions.push(Action::Truncate { end_offset });
    }

    pub(super) fn random_election_timeout(&mut self) -> u64 {
        let t = self.config.election_timeout_ms.max(1);
        t + self.rng.gen_range(0..=t)
    }

    /// Kafka's binary exponential election backoff: base × rand(1..2^n),
    /// capped by `election_backoff_max_ms`.
    pub(super) fn election_backoff_ms(&mut self, retries: u32) -> u64 {
        let exponent = retries.saturating_sub(1).min(20);
        let factor = self.rng.gen_range(1..=(1u64 << exponent));
        (ELECTION_BACKOFF_BASE_MS * factor).min(self.config.election_backoff_max_ms)
    }

    pub(super) fn check_quorum_ms(&self) -> u64 {
        self.config.fetch_timeout_ms * 3 / 2
    }

    pub(super) fn is_only_voter(&self) -> bool {
        self.config.voters.len() == 1 && self.config.is_voter()
    }

    pub(super) fn leader_id(&self) -> Option<NodeId> {
        match &self.role {
            Role::Leader(_) => Some(self.config.node_id),
            Role::Follower(f) => Some(f.leader_id),
            _ => None,
        }
    }

    // ----------------------------------------------------------------
    // Elections
    // ----------------------------------------------------------------

    /// Every response names the responder's epoch and leader. A higher epoch
    /// moves us into it; a leader named for our own epoch is followed if we
    /// know none. Returns true when we changed role.
    pub(super) fn maybe_follow_response_epoch(&mut self, epoch: Epoch, leader_id: Option<NodeId>) -> bool {
        let me = self.config.node_id;
        let leader_id = leader_id.filter(|l| *l != me && self.config.voters.contains_key(l));
        if epoch > self.election.epoch {
            self.become_unattached_or_follower(epoch, leader_id);
            return true;
        }
        if epoch == self.election.epoch {
            if let Some(leader) = leader_id {
                // A Prospective that left a leader of this epoch does not go
                // back because a peer still names it: that peer may not have
                // noticed the leader is gone (its refusal brings us back).
                let follow = match self.role {
                    Role::Unattached(_) | Role::Candidate(_) => true,
                    Role::Prospective(_) => self.election.leader_id.is_none(),
                    _ => false,
                };
                if follow {
                    self.become_follower(epoch, leader);
                    return true;
                }
            }
        }
        false
    }

    fn observe_response_epoch(&mut self, response: &RaftResponse) {
        let (epoch, leader) = match response {
            RaftResponse::Vote(r) => (r.epoch, r.leader_id),
            RaftResponse::BeginQuorumEpoch(r) | RaftResponse::EndQuorumEpoch(r) => (r.epoch, r.leader_id),
            RaftResponse::Fetch(r) => (r.epoch, r.leader_id),
            RaftResponse::FetchSnapshot(r) => (r.epoch, r.leader_id),
            _ => return,
        };
        self.maybe_follow_response_epoch(epoch, leader);
    }

    // ----------------------------------------------------------------
    // Fetch answers
    // ----------------------------------------------------------------

    /// A Fetch answer without records, as any role gives it (an error, or
    /// the leader's answer before the diverging epoch or snapshot is set).
    pub(super) fn fetch_error(&self, error: ErrorCode) -> FetchResponse {
        FetchResponse {
            error,
            epoch: self.election.epoch,
            leader_id: self.leader_id(),
            high_watermark: self.high_watermark,
            log_start_offset: self.log.start_offset(),
            diverging_epoch: None,
            snapshot_id: None,
            batches: Vec::new(),
        }
    }
}
