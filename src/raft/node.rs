//! The engine: one node's protocol state machine.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::messages::{
    Batch, BeginQuorumEpochRequest, DescribeQuorumResponse, DivergingEpoch, EndQuorumEpochRequest, ErrorCode,
    FetchRequest, FetchResponse, FetchSnapshotRequest, FetchSnapshotResponse, QuorumEpochResponse, RaftRequest,
    RaftResponse, Record, SnapshotId, VoteRequest, VoteResponse, MAX_BATCH_BYTES,
};

use super::accumulator::BatchAccumulator;
use super::leader::LeaderState;
use super::vote::{grant_pre_vote, grant_vote, is_log_up_to_date, VoterView};
use super::{ElectionState, Epoch, LogView, NodeId, Offset};

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
    /// Defaults of DESIGN.md §6 for a node in the given voter set.
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

/// Most bytes of batches the leader reads for one Fetch answer, whatever
/// the fetcher asks for (its first batch is always sent whole, so a batch
/// of up to [`MAX_BATCH_BYTES`] still goes through).
///
/// An answer is held in memory twice before it leaves (the batches read,
/// then the frame they are encoded into), and a replica catching up asks
/// for [`MAX_BATCH_BYTES`] each time. A leader serving the whole log of 1M
/// records of 100 B to a fresh observer in answers of 8 MiB peaked at
/// 98-136 MiB of RSS (`bench state`, 10 runs), most of all near the log
/// end, where an answer is first copied out of the tail cache; in answers
/// of 1 MiB at 75-85 MiB, the join taking 0.94-1.22 s instead of 0.90-0.92
/// s. Kafka serves fetches from the page cache (sendfile), not the heap. A
/// fetcher gets the rest in its next fetches.
pub const FETCH_READ_MAX_BYTES: usize = 1 << 20;

/// Most bytes of a snapshot the leader sends in one FetchSnapshot answer,
/// whatever the fetcher asks for (Kafka's followers ask for 8 MiB, and so
/// do kraft's). A chunk is held in memory on both sides, as read and as the
/// frame it is encoded into, like a Fetch answer (see
/// [`FETCH_READ_MAX_BYTES`]). A fresh observer fetching a 107 MiB snapshot
/// peaked at 36-115 MiB of RSS in chunks of 8 MiB and at 17-19 MiB in
/// chunks of 1 MiB, and caught up in 0.8-1.2 s instead of 1.5-2.0 s
/// (`bench state`, three alternated pairs).
pub const SNAPSHOT_CHUNK_MAX_BYTES: usize = 1 << 20;

/// The log range a Fetch response must carry; the shell reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRange {
    pub from: Offset,
    /// Exclusive; never past what the leader had appended when it decided.
    pub until: Offset,
    pub max_bytes: usize,
}

/// Where an accepted proposal will land. It completes when the high
/// watermark passes `last_offset` while `epoch` is still this node's leader
/// epoch, and fails when leadership of `epoch` is lost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proposed {
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub epoch: Epoch,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    #[error("not the leader (leader: {leader_id:?}, epoch {epoch})")]
    NotLeader { leader_id: Option<NodeId>, epoch: Epoch },
    #[error("batch of {bytes} bytes exceeds the limit of {limit} bytes")]
    TooLarge { bytes: usize, limit: usize },
    #[error("a proposal needs at least one record")]
    Empty,
    /// The records would take the log past [`super::MAX_LOG_OFFSET`].
    #[error(
        "the log is full: the next record would be at offset {next_offset}, and no record goes past offset {}",
        super::MAX_LOG_OFFSET
    )]
    LogFull { next_offset: Offset },
}

/// `on_snapshot_installed` (or `on_snapshot_install_failed`) for an install
/// the engine is not waiting for: it changed nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no install of snapshot {id:?} was pending (role {role})")]
pub struct UnexpectedInstall {
    pub id: SnapshotId,
    pub role: &'static str,
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
    /// `handle_response` (or `handle_request_failed`) with this id.
    Send {
        to: NodeId,
        correlation_id: u64,
        request: RaftRequest,
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
enum RequestKind {
    PreVote,
    Vote,
    BeginQuorumEpoch,
    EndQuorumEpoch,
    Fetch,
    FetchSnapshot,
}

#[derive(Clone, Copy, Debug)]
struct Inflight {
    to: NodeId,
    kind: RequestKind,
    /// `RaftNode::generation` when sent: a response that arrives after a
    /// role change only counts for its epoch information.
    generation: u64,
    deadline_ms: u64,
}

/// A Fetch the leader holds until data arrives, the high watermark moves,
/// or `deadline_ms` passes (Kafka's fetch purgatory).
#[derive(Clone, Debug)]
struct ParkedFetch {
    replica: NodeId,
    request_id: u64,
    fetch_offset: Offset,
    max_bytes: u32,
    deadline_ms: u64,
}

#[derive(Debug)]
struct UnattachedState {
    election_deadline_ms: u64,
    /// Observers look for the leader by fetching from a random voter.
    next_discovery_ms: u64,
}

#[derive(Debug)]
struct ElectionRound {
    granted: BTreeSet<NodeId>,
    rejected: BTreeSet<NodeId>,
    /// Per voter: earliest time to (re-)send our request.
    retry_at_ms: BTreeMap<NodeId, u64>,
    election_deadline_ms: u64,
}

#[derive(Debug)]
struct CandidateState {
    round: ElectionRound,
    /// Consecutive failed candidacies (for the exponential backoff).
    retries: u32,
    /// Set once the election timed out or was lost: the next candidacy
    /// starts at this time.
    backoff_until_ms: Option<u64>,
}

#[derive(Debug)]
struct FollowerState {
    leader_id: NodeId,
    /// Without a successful fetch by then the leader is presumed gone.
    fetch_deadline_ms: u64,
    last_fetch_success_ms: Option<u64>,
    /// Set by EndQuorumEpoch: the leader announced it is stepping down.
    leader_resigned: bool,
    next_fetch_ms: u64,
    /// Set while the leader's snapshot is being fetched instead of the log.
    snapshot: Option<SnapshotFetch>,
    /// Installs of the leader's snapshot that failed in a row: each doubles
    /// the wait before the transfer starts again.
    failed_installs: u32,
}

/// A snapshot transfer from the leader (KIP-630).
#[derive(Debug)]
struct SnapshotFetch {
    id: SnapshotId,
    /// Bytes received so far (the position of the next FetchSnapshot).
    position: u64,
    /// The size the first chunk gave; every later one must give the same.
    size: Option<u64>,
    /// `InstallSnapshot` was emitted; waiting for the shell's report.
    installing: bool,
}

#[derive(Debug)]
struct ResignedState {
    election_deadline_ms: u64,
    preferred_successors: Vec<NodeId>,
    /// Voters that acknowledged our EndQuorumEpoch.
    acked: BTreeSet<NodeId>,
    retry_at_ms: BTreeMap<NodeId, u64>,
    /// A single voter restarting as former leader campaigns at once; one that
    /// resigned to shut down must not.
    campaign_at_once: bool,
}

/// The role and its per-role state. Change it only through
/// [`RaftNode::transition`].
#[derive(Debug)]
enum Role {
    Unattached(UnattachedState),
    Prospective(ElectionRound),
    Candidate(CandidateState),
    Leader(Box<LeaderState>),
    Follower(FollowerState),
    Resigned(ResignedState),
}

impl Role {
    fn kind(&self) -> RoleKind {
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

/// Most observers a leader tracks at once.
pub const MAX_OBSERVERS: usize = 1024;

/// Kafka's base for election backoff (`RETRY_BACKOFF_BASE_MS`).
const ELECTION_BACKOFF_BASE_MS: u64 = 100;

/// One node's Raft state machine.
pub struct RaftNode {
    config: RaftConfig,
    rng: SmallRng,
    now_ms: u64,
    /// The election state as last persisted (or queued to be persisted ahead
    /// of every later action). Its epoch never decreases.
    election: ElectionState,
    role: Role,
    pub(super) log: LogView,
    /// Kafka's high watermark: the first offset not known to be committed.
    /// Never decreases on any node.
    high_watermark: Offset,
    /// Everything below it was committed before this node last started,
    /// as its store recorded (see [`RaftNode::restore_committed`]). The
    /// high watermark starts at the log start and is learnt from the
    /// leader, as in KRaft; this keeps a leader from having the node cut
    /// or replace what it already knows committed in the meantime.
    committed_before_start: Offset,
    /// Log end to which the flush in flight (at most one) makes the log
    /// durable; lowered by a truncation issued after it.
    flush_target: Option<Offset>,
    accumulator: BatchAccumulator,
    parked: Vec<ParkedFetch>,
    inflight: BTreeMap<u64, Inflight>,
    next_correlation_id: u64,
    /// Bumped on every role change.
    generation: u64,
    /// Failed candidacies since this node last saw a leader (exponential
    /// election backoff survives the pre-vote between two candidacies).
    election_retries: u32,
    /// The newest local snapshot: what a leader sends replicas that fell
    /// below its log start.
    latest_snapshot: Option<SnapshotId>,
    actions: Vec<Action>,
}

impl RaftNode {
    /// Starts a node from its recovered state (DESIGN.md §2 restart rules):
    /// leader of its persisted epoch → Resigned; candidate → Candidate
    /// (asks again for votes in the same epoch); known leader → Follower;
    /// otherwise Unattached (with its vote, if any). A single-voter quorum
    /// elects itself at once. `seed` feeds election jitter and backoff.
    pub fn new(config: RaftConfig, election: ElectionState, log: LogView, now_ms: u64, seed: u64) -> Self {
        let high_watermark = log.start_offset();
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
            // Append is answered by the shell, never by the protocol.
            RaftRequest::Append(_) => {
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
            RaftResponse::EndQuorumEpoch(resp) => {
                if !self.maybe_follow_response_epoch(resp.epoch, resp.leader_id) && current {
                    if let Role::Resigned(state) = &mut self.role {
                        if resp.error == ErrorCode::None {
                            state.acked.insert(from);
                        }
                    }
                }
            }
            RaftResponse::Fetch(resp) => self.handle_fetch_response(from, current, resp),
            RaftResponse::FetchSnapshot(resp) if sent.kind == RequestKind::FetchSnapshot => {
                self.handle_fetch_snapshot_response(from, current, resp)
            }
            RaftResponse::Error(_)
            | RaftResponse::DescribeQuorum(_)
            | RaftResponse::FetchSnapshot(_)
            | RaftResponse::Append(_) => {
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

    /// Gives `records` their offsets in the accumulator (draining it first
    /// if they would overflow it).
    fn accumulate(&mut self, records: Vec<Record>) -> Result<Proposed, ProposeError> {
        let epoch = self.election.epoch;
        if !matches!(self.role, Role::Leader(_)) {
            let leader_id = self.leader_id().filter(|id| *id != self.config.node_id);
            return Err(ProposeError::NotLeader { leader_id, epoch });
        }
        if records.is_empty() {
            return Err(ProposeError::Empty);
        }
        let bytes: usize = records.iter().map(Record::encoded_len).sum();
        if bytes > self.config.max_batch_bytes {
            return Err(ProposeError::TooLarge {
                bytes,
                limit: self.config.max_batch_bytes,
            });
        }
        if self.accumulator.would_overflow(bytes, self.config.max_batch_bytes) {
            self.drain_accumulator();
        }
        let base_offset = self.accumulator.next_offset(self.log.end_offset());
        if base_offset > super::MAX_LOG_OFFSET - records.len() as Offset {
            return Err(ProposeError::LogFull {
                next_offset: base_offset,
            });
        }
        let last_offset = base_offset + records.len() as Offset - 1;
        self.accumulator.add(records, bytes, self.now_ms);
        Ok(Proposed {
            base_offset,
            last_offset,
            epoch,
        })
    }

    /// Storage reports that the flush we asked for completed; `durable_end`
    /// is the store's end offset after it.
    pub fn on_flushed(&mut self, now_ms: u64, durable_end: Offset) {
        self.advance_clock(now_ms);
        if let Some(target) = self.flush_target.take() {
            self.log.on_flushed(target.min(durable_end));
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
        let now = self.now_ms;
        self.check_install_pending(id)?;
        self.log = LogView::new(id.end_offset, id.epoch, id.end_offset, Vec::new());
        self.flush_target = None;
        self.latest_snapshot = Some(id);
        if let Role::Follower(f) = &mut self.role {
            f.snapshot = None;
            f.failed_installs = 0;
            f.next_fetch_ms = now;
            f.fetch_deadline_ms = f.fetch_deadline_ms.max(now + self.config.fetch_timeout_ms);
        }
        if id.end_offset > self.high_watermark {
            self.high_watermark = id.end_offset;
            self.actions.push(Action::HighWatermark(id.end_offset));
        }
        self.poll();
        Ok(())
    }

    /// Ok when this node is a Follower whose transfer of `id` is installing.
    fn check_install_pending(&self, id: SnapshotId) -> Result<(), UnexpectedInstall> {
        match &self.role {
            Role::Follower(FollowerState {
                snapshot:
                    Some(SnapshotFetch {
                        id: fetching,
                        installing: true,
                        ..
                    }),
                ..
            }) if *fetching == id => Ok(()),
            role => {
                let unexpected = UnexpectedInstall {
                    id,
                    role: role.kind().as_str(),
                };
                tracing::error!("{unexpected}; the report is ignored");
                Err(unexpected)
            }
        }
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
        let (below, above): (Vec<ParkedFetch>, Vec<ParkedFetch>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.fetch_offset < start_offset);
        self.parked = above;
        for parked in below {
            let mut response = self.fetch_error(ErrorCode::None);
            response.snapshot_id = Some(self.snapshot_at_log_start());
            self.actions.push(Action::RespondFetch {
                to: parked.replica,
                request_id: parked.request_id,
                response,
                read: None,
            });
        }
        self.poll();
    }

    /// `InstallSnapshot(id)` failed (a damaged transfer): nothing changed;
    /// the transfer starts over. Like `on_snapshot_installed`, call it
    /// before `tick`: the fetch timeout runs again from now.
    pub fn on_snapshot_install_failed(&mut self, now_ms: u64, id: SnapshotId) -> Result<(), UnexpectedInstall> {
        self.advance_clock(now_ms);
        let now = self.now_ms;
        self.check_install_pending(id)?;
        if let Role::Follower(f) = &mut self.role {
            f.failed_installs = f.failed_installs.saturating_add(1);
            // A snapshot that fails to install again and again (damaged at
            // the leader, or this disk full) must not be fetched whole every
            // retry backoff: the wait doubles, up to half the fetch timeout
            // (a longer one would let the fetch timeout expire).
            let doublings = (f.failed_installs - 1).min(16);
            let wait =
                (self.config.retry_backoff_ms.max(1) << doublings).min((self.config.fetch_timeout_ms / 2).max(1));
            tracing::warn!(
                ?id,
                failed_in_a_row = f.failed_installs,
                wait_ms = wait,
                "installing the fetched snapshot failed; fetching it again"
            );
            f.snapshot = None;
            f.next_fetch_ms = now + wait;
            f.fetch_deadline_ms = f.fetch_deadline_ms.max(now + self.config.fetch_timeout_ms);
        }
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
            Role::Unattached(s) => {
                if self.config.is_voter() {
                    s.election_deadline_ms
                } else if self.has_inflight(RequestKind::Fetch) || self.log.has_unflushed() {
                    u64::MAX
                } else {
                    s.next_discovery_ms
                }
            }
            Role::Prospective(round) => round.election_deadline_ms.min(Self::min_retry(round)),
            Role::Candidate(c) => match c.backoff_until_ms {
                Some(t) => t,
                None => c.round.election_deadline_ms.min(Self::min_retry(&c.round)),
            },
            // Only deadlines that `poll` acts on count, or a shell would spin.
            Role::Leader(l) => {
                let mut t = u64::MAX;
                if self.config.majority() > 1 {
                    t = t.min(l.check_quorum_deadline_ms);
                }
                if self.accumulator.is_empty() {
                    t = t.min(l.last_append_ms + self.config.max_idle_interval_ms);
                } else if self.config.append_linger_ms > 0 {
                    let linger = self.accumulator.linger_deadline_ms(self.config.append_linger_ms);
                    t = t.min(linger.unwrap_or(u64::MAX));
                }
                if !l.voters.is_empty() {
                    t = t.min(l.begin_quorum_resend_ms);
                }
                t
            }
            Role::Follower(f) => {
                let blocked = self.has_inflight(RequestKind::Fetch) || self.log.has_unflushed();
                if blocked {
                    f.fetch_deadline_ms
                } else {
                    f.fetch_deadline_ms.min(f.next_fetch_ms)
                }
            }
            Role::Resigned(r) => {
                let pending = r
                    .retry_at_ms
                    .iter()
                    .filter(|(id, _)| !r.acked.contains(id))
                    .map(|(_, t)| *t)
                    .min();
                r.election_deadline_ms.min(pending.unwrap_or(u64::MAX))
            }
        };
        next.min(role_deadline).max(self.now_ms)
    }

    // ----------------------------------------------------------------
    // Transitions
    // ----------------------------------------------------------------

    /// The one gatekeeper for role changes. Legal transitions (Kafka's
    /// QuorumState, DESIGN.md §2):
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
    fn transition(&mut self, next: Role, persist: Option<ElectionState>) {
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

    /// Leaving the leader role: parked fetches are answered with the new
    /// state, and records not yet written are dropped (their proposals fail
    /// through the RoleChanged action).
    fn abandon_leadership(&mut self) {
        self.accumulator.drain();
        for parked in std::mem::take(&mut self.parked) {
            let response = self.fetch_error(ErrorCode::NotLeaderOrFollower);
            self.actions.push(Action::RespondFetch {
                to: parked.replica,
                request_id: parked.request_id,
                response,
                read: None,
            });
        }
    }

    /// A higher epoch seen anywhere moves us into it first: as Follower when
    /// its leader is named (and is not us), else Unattached.
    fn become_unattached_or_follower(&mut self, epoch: Epoch, leader_id: Option<NodeId>) {
        match leader_id.filter(|l| *l != self.config.node_id) {
            Some(leader) => self.become_follower(epoch, leader),
            None => {
                let persist = ElectionState::unattached(epoch);
                let role = Role::Unattached(self.new_unattached());
                self.transition(role, Some(persist));
            }
        }
    }

    fn become_follower(&mut self, epoch: Epoch, leader: NodeId) {
        assert_ne!(leader, self.config.node_id, "cannot follow itself");
        let voted_for = if epoch == self.election.epoch {
            self.election.voted_for
        } else {
            None
        };
        let persist = ElectionState {
            epoch,
            voted_for,
            leader_id: Some(leader),
        };
        self.election_retries = 1;
        let role = Role::Follower(self.new_follower(leader));
        self.transition(role, Some(persist));
    }

    fn become_prospective(&mut self) {
        if self.election.epoch == Epoch::MAX {
            self.give_up_elections();
            return;
        }
        let round = self.new_round();
        self.transition(Role::Prospective(round), None);
        self.maybe_win_pre_vote();
    }

    fn become_candidate(&mut self, retries: u32) {
        let Some(epoch) = self.election.epoch.checked_add(1) else {
            return self.give_up_elections();
        };
        let me = self.config.node_id;
        let persist = ElectionState {
            epoch,
            voted_for: Some(me),
            leader_id: None,
        };
        let round = self.new_round();
        self.transition(
            Role::Candidate(CandidateState {
                round,
                retries,
                backoff_until_ms: None,
            }),
            Some(persist),
        );
        self.maybe_win_election();
    }

    fn become_leader(&mut self) {
        let me = self.config.node_id;
        let epoch = self.election.epoch;
        let granting = match &self.role {
            Role::Candidate(c) => c.round.granted.clone(),
            _ => unreachable!("only a candidate becomes leader"),
        };
        let epoch_start = self.log.end_offset();
        let check_quorum_ms = self.check_quorum_ms();
        let leader = LeaderState::new(
            epoch,
            me,
            self.config.voters.keys().copied(),
            granting.clone(),
            epoch_start,
            self.now_ms,
            check_quorum_ms,
        );
        let persist = ElectionState {
            epoch,
            voted_for: Some(me),
            leader_id: Some(me),
        };
        self.election_retries = 1;
        self.transition(Role::Leader(Box::new(leader)), Some(persist));
        // The first batch of every epoch is its LeaderChange record.
        let record = Record::LeaderChange {
            leader_id: me,
            voters: self.config.voters.keys().copied().collect(),
            granting_voters: granting.into_iter().collect(),
        };
        self.append_as_leader(vec![record]);
    }

    /// No epoch follows [`Epoch::MAX`], so no election can start: the node
    /// waits Unattached, without an election deadline, and still follows a
    /// leader of this epoch. Only a damaged election state or a peer that
    /// sent that epoch gets a node here (a new epoch per election would
    /// take decades); it is reported, never a panic or a wrapped epoch.
    fn give_up_elections(&mut self) {
        if matches!(&self.role, Role::Unattached(s) if s.election_deadline_ms == u64::MAX) {
            return;
        }
        tracing::error!(
            epoch = self.election.epoch,
            "the epoch is at its largest value: this node can start no election (a damaged election state, \
             or a peer sent that epoch); it follows a leader of this epoch if one appears"
        );
        let mut state = self.new_unattached();
        state.election_deadline_ms = u64::MAX;
        self.transition(Role::Unattached(state), None);
    }

    fn new_unattached(&mut self) -> UnattachedState {
        let deadline = self.now_ms + self.random_election_timeout();
        UnattachedState {
            election_deadline_ms: deadline,
            next_discovery_ms: self.now_ms,
        }
    }

    fn new_round(&mut self) -> ElectionRound {
        let me = self.config.node_id;
        ElectionRound {
            granted: BTreeSet::from([me]),
            rejected: BTreeSet::new(),
            retry_at_ms: self.other_voters_due_now(),
            election_deadline_ms: self.now_ms + self.random_election_timeout(),
        }
    }

    /// Every other voter, each due for a request now.
    fn other_voters_due_now(&self) -> BTreeMap<NodeId, u64> {
        let me = self.config.node_id;
        self.config
            .voters
            .keys()
            .filter(|id| **id != me)
            .map(|id| (*id, self.now_ms))
            .collect()
    }

    fn new_follower(&mut self, leader_id: NodeId) -> FollowerState {
        FollowerState {
            leader_id,
            fetch_deadline_ms: self.now_ms + self.config.fetch_timeout_ms,
            last_fetch_success_ms: None,
            leader_resigned: false,
            next_fetch_ms: self.now_ms,
            snapshot: None,
            failed_installs: 0,
        }
    }

    fn new_resigned(&mut self, preferred_successors: Vec<NodeId>) -> ResignedState {
        ResignedState {
            election_deadline_ms: self.now_ms + self.random_election_timeout(),
            preferred_successors,
            acked: BTreeSet::new(),
            retry_at_ms: self.other_voters_due_now(),
            campaign_at_once: false,
        }
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

    fn poll_unattached(&mut self) {
        let now = self.now_ms;
        let Role::Unattached(state) = &self.role else { return };
        if self.config.is_voter() {
            // A single voter needs nobody: it campaigns at once.
            if now >= state.election_deadline_ms || self.is_only_voter() {
                self.become_prospective();
            }
        } else if now >= state.next_discovery_ms && !self.has_inflight(RequestKind::Fetch) && !self.log.has_unflushed()
        {
            // Its fetch offset is its log end: only once that is durable,
            // as for a follower.
            // An observer knows the voters but not the leader: ask one.
            let voters: Vec<NodeId> = self.config.voters.keys().copied().collect();
            let to = voters[self.rng.gen_range(0..voters.len())];
            if let Role::Unattached(state) = &mut self.role {
                state.next_discovery_ms = now + self.config.retry_backoff_ms.max(1);
            }
            self.send_fetch(to);
        }
    }

    fn poll_prospective(&mut self) {
        let now = self.now_ms;
        let Role::Prospective(round) = &self.role else { return };
        let lost = round.rejected.len() >= self.config.majority();
        if now >= round.election_deadline_ms || lost {
            self.prospective_lost();
            return;
        }
        let Some(epoch) = self.election.epoch.checked_add(1) else {
            return self.give_up_elections();
        };
        let request = self.vote_request(epoch, true);
        self.send_election_requests(request, RequestKind::PreVote);
    }

    /// A pre-vote that failed (timed out, or a majority refused) goes back
    /// to following the leader this node left, if it had one in this epoch
    /// (it may be alive after all: a refusal says somebody still hears it),
    /// else to Unattached (Kafka's `prospectiveTransitionAfterElectionLoss`).
    fn prospective_lost(&mut self) {
        let me = self.config.node_id;
        match self.election.leader_id.filter(|l| *l != me) {
            Some(leader) => self.become_follower(self.election.epoch, leader),
            None => {
                let role = Role::Unattached(self.new_unattached());
                self.transition(role, None);
            }
        }
    }

    fn poll_candidate(&mut self) {
        let now = self.now_ms;
        let Role::Candidate(c) = &self.role else { return };
        if let Some(until) = c.backoff_until_ms {
            if now >= until {
                // Campaign again only through a pre-vote (KIP-996): a
                // candidate whose log is behind must not keep bumping the
                // epoch, which resets every other voter's election timer.
                self.election_retries = c.retries + 1;
                self.become_prospective();
            }
            return;
        }
        let lost = c.round.rejected.len() >= self.config.majority();
        if now >= c.round.election_deadline_ms || lost {
            let backoff = self.election_backoff_ms(c.retries);
            if let Role::Candidate(c) = &mut self.role {
                c.backoff_until_ms = Some(now + backoff);
            }
            return;
        }
        let request = self.vote_request(self.election.epoch, false);
        self.send_election_requests(request, RequestKind::Vote);
    }

    fn poll_leader(&mut self) {
        let now = self.now_ms;
        let majority = self.config.majority();
        let fetch_timeout = self.config.fetch_timeout_ms;
        let Role::Leader(leader) = &mut self.role else { return };
        if majority > 1 && now >= leader.check_quorum_deadline_ms {
            // Check-quorum: no majority fetched within 1.5 × fetch timeout.
            tracing::warn!(epoch = self.election.epoch, "check-quorum failed: resigning");
            let successors = leader.preferred_successors();
            let resigned = self.new_resigned(successors);
            self.transition(Role::Resigned(resigned), None);
            self.poll_resigned();
            return;
        }
        leader.expire_observers(now, self.config.observer_session_ms);
        if now >= leader.begin_quorum_resend_ms {
            let interval = (fetch_timeout / 2).max(1);
            leader.begin_quorum_resend_ms = now + interval;
            let targets = leader.voters_not_fetching(now, interval);
            let request = RaftRequest::BeginQuorumEpoch(BeginQuorumEpochRequest {
                epoch: self.election.epoch,
                leader_id: self.config.node_id,
                leader_endpoint: self.config.local_endpoint.clone(),
            });
            for to in targets {
                if !self.has_inflight_to(to, RequestKind::BeginQuorumEpoch) {
                    self.send(to, RequestKind::BeginQuorumEpoch, request.clone());
                }
            }
        }
        self.maybe_drain_accumulator();
        let Role::Leader(leader) = &self.role else { return };
        if self.accumulator.is_empty() && now >= leader.last_append_ms + self.config.max_idle_interval_ms {
            self.append_as_leader(vec![Record::NoOp]);
        }
    }

    fn poll_follower(&mut self) {
        let now = self.now_ms;
        let Role::Follower(f) = &self.role else { return };
        if now >= f.fetch_deadline_ms {
            if self.config.is_voter() {
                self.become_prospective();
            } else {
                let role = Role::Unattached(self.new_unattached());
                self.transition(role, None);
            }
            return;
        }
        if let Some(snapshot) = &f.snapshot {
            let due = now >= f.next_fetch_ms && !snapshot.installing;
            if due && !self.has_inflight(RequestKind::FetchSnapshot) {
                let request = RaftRequest::FetchSnapshot(FetchSnapshotRequest {
                    replica_id: self.config.node_id,
                    current_epoch: self.election.epoch,
                    snapshot_id: snapshot.id,
                    position: snapshot.position,
                    max_bytes: MAX_BATCH_BYTES as u32,
                });
                let to = f.leader_id;
                self.send(to, RequestKind::FetchSnapshot, request);
            }
            return;
        }
        // A voter acknowledges by fetching: only once its log is durable.
        // An observer waits too, though its fetch offset counts for
        // nothing: else it fetches as fast as the leader answers while its
        // disk falls behind, and what it has fetched but not yet written
        // piles up in memory (a fresh observer reading a log of 1M records
        // grew to 168 MiB). So each node holds at most one fetch answer
        // that is not on disk.
        let durable = !self.log.has_unflushed();
        if now >= f.next_fetch_ms && durable && !self.has_inflight(RequestKind::Fetch) {
            let to = f.leader_id;
            self.send_fetch(to);
        }
    }

    fn poll_resigned(&mut self) {
        let now = self.now_ms;
        let Role::Resigned(r) = &self.role else { return };
        if now >= r.election_deadline_ms || r.campaign_at_once {
            self.become_prospective();
            return;
        }
        let due: Vec<NodeId> = r
            .retry_at_ms
            .iter()
            .filter(|(id, t)| !r.acked.contains(id) && now >= **t)
            .map(|(id, _)| *id)
            .collect();
        let request = RaftRequest::EndQuorumEpoch(EndQuorumEpochRequest {
            epoch: self.election.epoch,
            leader_id: self.config.node_id,
            preferred_successors: r.preferred_successors.clone(),
        });
        let retry = self.config.retry_backoff_ms.max(1);
        for to in due {
            if !self.has_inflight_to(to, RequestKind::EndQuorumEpoch) {
                self.send(to, RequestKind::EndQuorumEpoch, request.clone());
            }
            if let Role::Resigned(r) = &mut self.role {
                r.retry_at_ms.insert(to, now + retry);
            }
        }
    }

    fn send_election_requests(&mut self, request: RaftRequest, kind: RequestKind) {
        let now = self.now_ms;
        let round = match &self.role {
            Role::Prospective(round) => round,
            Role::Candidate(c) => &c.round,
            _ => return,
        };
        let due: Vec<NodeId> = round
            .retry_at_ms
            .iter()
            .filter(|(id, t)| !round.granted.contains(id) && !round.rejected.contains(id) && now >= **t)
            .map(|(id, _)| *id)
            .collect();
        for to in due {
            if self.has_inflight_to(to, kind) {
                continue;
            }
            self.send(to, kind, request.clone());
            // Re-ask a silent voter only after the request timed out.
            let retry = now + self.config.request_timeout_ms;
            match &mut self.role {
                Role::Prospective(round) => round.retry_at_ms.insert(to, retry),
                Role::Candidate(c) => c.round.retry_at_ms.insert(to, retry),
                _ => None,
            };
        }
    }

    fn vote_request(&self, epoch: Epoch, pre_vote: bool) -> RaftRequest {
        // Only the durable log is claimed to other nodes.
        let end = self.log.flushed_end();
        RaftRequest::Vote(VoteRequest {
            epoch,
            candidate_id: self.config.node_id,
            last_epoch: self.log.epoch_before(end),
            last_epoch_end_offset: end,
            pre_vote,
        })
    }

    fn send_fetch(&mut self, to: NodeId) {
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

    fn send(&mut self, to: NodeId, kind: RequestKind, request: RaftRequest) {
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
        });
    }

    fn has_inflight(&self, kind: RequestKind) -> bool {
        self.inflight
            .values()
            .any(|s| s.kind == kind && s.generation == self.generation)
    }

    fn has_inflight_to(&self, to: NodeId, kind: RequestKind) -> bool {
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

    fn respond(&mut self, to: NodeId, request_id: u64, response: RaftResponse) {
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
        if let Some(target) = &mut self.flush_target {
            *target = (*target).min(end_offset);
        }
        self.actions.push(Action::Truncate { end_offset });
    }

    fn random_election_timeout(&mut self) -> u64 {
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

    fn check_quorum_ms(&self) -> u64 {
        self.config.fetch_timeout_ms * 3 / 2
    }

    fn min_retry(round: &ElectionRound) -> u64 {
        round
            .retry_at_ms
            .iter()
            .filter(|(id, _)| !round.granted.contains(id) && !round.rejected.contains(id))
            .map(|(_, t)| *t)
            .min()
            .unwrap_or(u64::MAX)
    }

    fn is_only_voter(&self) -> bool {
        self.config.voters.len() == 1 && self.config.is_voter()
    }

    fn leader_id(&self) -> Option<NodeId> {
        match &self.role {
            Role::Leader(_) => Some(self.config.node_id),
            Role::Follower(f) => Some(f.leader_id),
            _ => None,
        }
    }

    // ----------------------------------------------------------------
    // Elections
    // ----------------------------------------------------------------

    fn voter_view(&self) -> VoterView {
        let now = self.now_ms;
        let fetch_timeout = self.config.fetch_timeout_ms;
        let leader_is_live = match &self.role {
            Role::Follower(f) => {
                !f.leader_resigned
                    && f.last_fetch_success_ms
                        .map(|t| now < t + fetch_timeout)
                        .unwrap_or(false)
            }
            _ => false,
        };
        let leader_id = match &self.role {
            Role::Follower(f) => Some(f.leader_id),
            Role::Leader(_) | Role::Resigned(_) => Some(self.config.node_id),
            // Prospective and Unattached keep what was persisted of this epoch.
            Role::Prospective(_) | Role::Unattached(_) => self.election.leader_id,
            Role::Candidate(_) => None,
        };
        VoterView {
            voted_for: self.election.voted_for,
            leader_id,
            leader_is_live,
            is_or_was_leader: matches!(self.role, Role::Leader(_) | Role::Resigned(_)),
        }
    }

    fn handle_vote_request(&mut self, from: NodeId, request_id: u64, req: VoteRequest) {
        let refuse = |node: &Self, error: ErrorCode| {
            RaftResponse::Vote(VoteResponse {
                error,
                epoch: node.election.epoch,
                leader_id: node.leader_id(),
                vote_granted: false,
                pre_vote: req.pre_vote,
            })
        };
        if !self.config.is_voter() || !self.config.voters.contains_key(&req.candidate_id) || from != req.candidate_id {
            let response = refuse(self, ErrorCode::InconsistentVoterSet);
            self.respond(from, request_id, response);
            return;
        }
        if req.epoch < self.election.epoch {
            let response = refuse(self, ErrorCode::FencedLeaderEpoch);
            self.respond(from, request_id, response);
            return;
        }
        let log_ok = is_log_up_to_date(
            req.last_epoch,
            req.last_epoch_end_offset,
            self.log.last_epoch(),
            self.log.end_offset(),
        );
        if req.pre_vote {
            // A pre-vote changes nothing, not even our epoch.
            let granted = grant_pre_vote(self.voter_view(), log_ok);
            let response = RaftResponse::Vote(VoteResponse {
                error: ErrorCode::None,
                epoch: self.election.epoch,
                leader_id: self.leader_id(),
                vote_granted: granted,
                pre_vote: true,
            });
            self.respond(from, request_id, response);
            return;
        }
        if req.epoch > self.election.epoch {
            self.become_unattached_or_follower(req.epoch, None);
        }
        let granted = grant_vote(self.voter_view(), req.candidate_id, log_ok);
        if granted {
            // Persist the vote, then switch, then reply.
            let persist = ElectionState {
                epoch: self.election.epoch,
                voted_for: Some(req.candidate_id),
                leader_id: None,
            };
            let mut unattached = self.new_unattached();
            if let Role::Unattached(current) = &self.role {
                // Granting the same vote again keeps the timer.
                if self.election.voted_for == Some(req.candidate_id) {
                    unattached.election_deadline_ms = current.election_deadline_ms;
                }
            }
            self.transition(Role::Unattached(unattached), Some(persist));
        }
        let response = RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: self.election.epoch,
            leader_id: self.leader_id(),
            vote_granted: granted,
            pre_vote: false,
        });
        self.respond(from, request_id, response);
    }

    fn handle_vote_response(&mut self, from: NodeId, sent: Inflight, current: bool, resp: VoteResponse) {
        if self.maybe_follow_response_epoch(resp.epoch, resp.leader_id) {
            return;
        }
        if !current {
            return;
        }
        match (&mut self.role, sent.kind) {
            (Role::Prospective(round), RequestKind::PreVote) => {
                if resp.vote_granted {
                    round.granted.insert(from);
                } else {
                    round.rejected.insert(from);
                }
                self.maybe_win_pre_vote();
            }
            (Role::Candidate(c), RequestKind::Vote) if resp.epoch == self.election.epoch => {
                if resp.vote_granted {
                    c.round.granted.insert(from);
                } else {
                    c.round.rejected.insert(from);
                }
                self.maybe_win_election();
            }
            _ => {}
        }
    }

    fn maybe_win_pre_vote(&mut self) {
        if let Role::Prospective(round) = &self.role {
            if round.granted.len() >= self.config.majority() {
                self.become_candidate(self.election_retries.max(1));
            }
        }
    }

    fn maybe_win_election(&mut self) {
        if let Role::Candidate(c) = &self.role {
            if c.backoff_until_ms.is_none() && c.round.granted.len() >= self.config.majority() {
                self.become_leader();
            }
        }
    }

    fn handle_begin_quorum_epoch(&mut self, from: NodeId, request_id: u64, req: BeginQuorumEpochRequest) {
        let error = if !self.config.is_voter() || !self.config.voters.contains_key(&req.leader_id) {
            ErrorCode::InconsistentVoterSet
        } else if req.epoch < self.election.epoch {
            ErrorCode::FencedLeaderEpoch
        } else if req.leader_id == self.config.node_id || req.leader_id != from {
            ErrorCode::InvalidRequest
        } else {
            match &self.role {
                _ if req.epoch > self.election.epoch => {
                    self.become_follower(req.epoch, req.leader_id);
                    ErrorCode::None
                }
                Role::Follower(f) if f.leader_id == req.leader_id => ErrorCode::None,
                Role::Leader(_) | Role::Resigned(_) | Role::Follower(_) => {
                    // Two leaders in one epoch would break election safety.
                    tracing::error!(
                        epoch = req.epoch,
                        leader = req.leader_id,
                        "BeginQuorumEpoch conflicts with the known leader"
                    );
                    ErrorCode::InvalidRequest
                }
                Role::Unattached(_) | Role::Prospective(_) | Role::Candidate(_) => {
                    self.become_follower(req.epoch, req.leader_id);
                    ErrorCode::None
                }
            }
        };
        let response = RaftResponse::BeginQuorumEpoch(QuorumEpochResponse {
            error,
            epoch: self.election.epoch,
            leader_id: self.leader_id(),
        });
        self.respond(from, request_id, response);
    }

    fn handle_end_quorum_epoch(&mut self, from: NodeId, request_id: u64, req: EndQuorumEpochRequest) {
        let mut error = ErrorCode::None;
        // As for BeginQuorumEpoch: only the voter that leads (or led) may
        // resign, and it says so itself.
        if !self.config.is_voter() || !self.config.voters.contains_key(&req.leader_id) {
            error = ErrorCode::InconsistentVoterSet;
        } else if req.epoch < self.election.epoch {
            error = ErrorCode::FencedLeaderEpoch;
        } else if req.leader_id == self.config.node_id || req.leader_id != from {
            error = ErrorCode::InvalidRequest;
        } else {
            // Shorten our wait by our rank among the preferred successors, so
            // the best-replicated voter campaigns first (KIP-595).
            let backoff = self.end_quorum_backoff_ms(&req.preferred_successors);
            if req.epoch > self.election.epoch {
                self.become_unattached_or_follower(req.epoch, None);
            }
            let now = self.now_ms;
            match &mut self.role {
                Role::Follower(f) if f.leader_id == req.leader_id => {
                    f.leader_resigned = true;
                    f.fetch_deadline_ms = f.fetch_deadline_ms.min(now + backoff);
                }
                Role::Unattached(u) => {
                    u.election_deadline_ms = u.election_deadline_ms.min(now + backoff);
                }
                _ => {}
            }
        }
        let response = RaftResponse::EndQuorumEpoch(QuorumEpochResponse {
            error,
            epoch: self.election.epoch,
            leader_id: self.leader_id(),
        });
        self.respond(from, request_id, response);
    }

    fn end_quorum_backoff_ms(&self, successors: &[NodeId]) -> u64 {
        match successors.iter().position(|id| *id == self.config.node_id) {
            Some(0) => 0,
            Some(rank) => {
                let shift = (rank as u32 - 1).min(20);
                (ELECTION_BACKOFF_BASE_MS << shift).min(self.config.election_backoff_max_ms)
            }
            None => self.config.election_backoff_max_ms,
        }
    }

    /// Every response names the responder's epoch and leader. A higher epoch
    /// moves us into it; a leader named for our own epoch is followed if we
    /// know none. Returns true when we changed role.
    fn maybe_follow_response_epoch(&mut self, epoch: Epoch, leader_id: Option<NodeId>) -> bool {
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
    // Fetch: the leader side
    // ----------------------------------------------------------------

    fn fetch_error(&self, error: ErrorCode) -> FetchResponse {
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

    fn handle_fetch_request(&mut self, request_id: u64, req: FetchRequest) {
        let replica = req.replica_id;
        let reply_error = |node: &mut Self, error: ErrorCode| {
            let response = node.fetch_error(error);
            node.actions.push(Action::RespondFetch {
                to: replica,
                request_id,
                response,
                read: None,
            });
        };
        if !matches!(self.role, Role::Leader(_)) {
            return reply_error(self, ErrorCode::NotLeaderOrFollower);
        }
        if req.current_epoch < self.election.epoch {
            return reply_error(self, ErrorCode::FencedLeaderEpoch);
        }
        if req.current_epoch > self.election.epoch {
            return reply_error(self, ErrorCode::UnknownLeaderEpoch);
        }
        if replica == self.config.node_id || req.fetch_offset < 0 {
            return reply_error(self, ErrorCode::InvalidRequest);
        }
        // KIP-630: a replica below our log start, or one that would have to
        // truncate to (or below) it to agree with us, gets our snapshot.
        let start = self.log.start_offset();
        let diverging = self.validate_fetch_position(req.fetch_offset, req.last_fetched_epoch);
        let needs_snapshot =
            req.fetch_offset < start || (start > 0 && diverging.is_some_and(|d| d.end_offset <= start));
        if needs_snapshot || diverging.is_some() {
            let mut response = self.fetch_error(ErrorCode::None);
            if needs_snapshot {
                response.snapshot_id = Some(self.snapshot_at_log_start());
            } else {
                response.diverging_epoch = diverging;
            }
            self.actions.push(Action::RespondFetch {
                to: replica,
                request_id,
                response,
                read: None,
            });
            return;
        }
        // Observers are whoever fetches; bound how many a leader tracks (and
        // parks fetches for) so that unknown peers cannot grow it for ever.
        if let Role::Leader(leader) = &self.role {
            let known = leader.voters.contains_key(&replica) || leader.observers.contains_key(&replica);
            if !known && leader.observers.len() >= MAX_OBSERVERS {
                return reply_error(self, ErrorCode::BrokerNotAvailable);
            }
        }
        // A valid position: it is the replica's log end (durable for voters).
        self.drain_for_fetch(req.fetch_offset);
        let now = self.now_ms;
        let end = self.log.end_offset();
        let check_quorum_ms = self.check_quorum_ms();
        let majority = self.config.majority();
        let Role::Leader(leader) = &mut self.role else {
            unreachable!()
        };
        let is_voter = leader.record_fetch(replica, req.fetch_offset, end, now, check_quorum_ms, majority);
        let told = leader.replica(replica).map_or(0, |r| r.high_watermark_sent);
        let hw_before = self.high_watermark;
        if is_voter {
            self.maybe_advance_leader_high_watermark();
        }
        // A replica may have only one parked fetch; an older one is answered.
        if let Some(i) = self.parked.iter().position(|p| p.replica == replica) {
            let old = self.parked.remove(i);
            self.complete_parked(old);
        }
        let mut parked = ParkedFetch {
            replica,
            request_id,
            fetch_offset: req.fetch_offset,
            max_bytes: req.max_bytes,
            deadline_ms: now + req.max_wait_ms.min(self.config.fetch_max_wait_ms),
        };
        // Behind on the high watermark: its own fetch moved it, or another
        // replica's did since it was last told.
        let behind = self.high_watermark != hw_before || told < self.high_watermark;
        let linger = self.high_watermark_linger_ms();
        if req.fetch_offset < end || req.max_wait_ms == 0 || (behind && linger == 0) {
            self.complete_parked(parked);
        } else {
            if behind {
                parked.deadline_ms = parked.deadline_ms.min(now + linger);
            }
            self.parked.push(parked);
        }
    }

    /// The snapshot a replica below the log start must fetch: the newest
    /// local one (the log start only moves up to a snapshot's end).
    fn snapshot_at_log_start(&self) -> SnapshotId {
        let start = self.log.start_offset();
        match self.latest_snapshot {
            Some(id) if id.end_offset >= start => id,
            _ => SnapshotId {
                end_offset: start,
                epoch: self.log.epoch_before(start),
            },
        }
    }

    fn handle_fetch_snapshot_request(&mut self, from: NodeId, request_id: u64, req: FetchSnapshotRequest) {
        let now = self.now_ms;
        let error = if !matches!(self.role, Role::Leader(_)) {
            ErrorCode::NotLeaderOrFollower
        } else if req.current_epoch < self.election.epoch {
            ErrorCode::FencedLeaderEpoch
        } else if req.current_epoch > self.election.epoch {
            ErrorCode::UnknownLeaderEpoch
        } else if req.replica_id != from || from == self.config.node_id {
            ErrorCode::InvalidRequest
        } else if self.latest_snapshot != Some(req.snapshot_id) {
            ErrorCode::SnapshotNotFound
        } else {
            ErrorCode::None
        };
        let response = FetchSnapshotResponse {
            error,
            epoch: self.election.epoch,
            leader_id: self.leader_id(),
            snapshot_id: req.snapshot_id,
            size: 0,
            position: req.position,
            bytes: Vec::new(),
        };
        if error != ErrorCode::None {
            self.respond(from, request_id, RaftResponse::FetchSnapshot(response));
            return;
        }
        // A voter fetching a snapshot is alive for check-quorum, as in Kafka.
        let check_quorum_ms = self.check_quorum_ms();
        let majority = self.config.majority();
        if let Role::Leader(leader) = &mut self.role {
            leader.record_alive(from, now, check_quorum_ms, majority);
        }
        self.actions.push(Action::RespondFetchSnapshot {
            to: from,
            request_id,
            response,
            max_bytes: (req.max_bytes as usize).min(SNAPSHOT_CHUNK_MAX_BYTES),
        });
    }

    fn handle_fetch_snapshot_response(&mut self, from: NodeId, current: bool, resp: FetchSnapshotResponse) {
        if self.maybe_follow_response_epoch(resp.epoch, resp.leader_id) || !current {
            return;
        }
        let now = self.now_ms;
        let retry = now + self.config.retry_backoff_ms.max(1);
        let Role::Follower(f) = &mut self.role else { return };
        if f.leader_id != from || resp.epoch != self.election.epoch {
            return;
        }
        let Some(snapshot) = &mut f.snapshot else { return };
        if snapshot.installing || resp.snapshot_id != snapshot.id {
            return;
        }
        match resp.error {
            ErrorCode::None => {}
            // The leader moved on to a newer snapshot (or lost this one):
            // fetch the log again, which names the snapshot to get now.
            ErrorCode::SnapshotNotFound | ErrorCode::PositionOutOfRange => {
                tracing::info!(leader = from, id = ?snapshot.id, error = ?resp.error, "snapshot fetch restarts");
                f.snapshot = None;
                f.next_fetch_ms = retry;
                return;
            }
            _ => {
                f.next_fetch_ms = retry;
                return;
            }
        }
        let end = resp.position.checked_add(resp.bytes.len() as u64);
        // A snapshot id names one file, so its size never changes: a chunk
        // that says otherwise cannot continue the bytes written so far.
        let valid = resp.position == snapshot.position
            && snapshot.size.is_none_or(|size| size == resp.size)
            && end.is_some_and(|end| end <= resp.size)
            && (!resp.bytes.is_empty() || resp.position == resp.size);
        if !valid {
            tracing::error!(
                leader = from,
                position = resp.position,
                len = resp.bytes.len(),
                size = resp.size,
                expected = snapshot.position,
                "invalid snapshot chunk; the transfer starts over"
            );
            f.snapshot = None;
            f.next_fetch_ms = retry;
            return;
        }
        f.last_fetch_success_ms = Some(now);
        f.fetch_deadline_ms = now + self.config.fetch_timeout_ms;
        f.next_fetch_ms = now;
        snapshot.position += resp.bytes.len() as u64;
        snapshot.size = Some(resp.size);
        let id = snapshot.id;
        let done = snapshot.position == resp.size;
        snapshot.installing = done;
        self.actions.push(Action::WriteSnapshotChunk {
            snapshot_id: id,
            size: resp.size,
            position: resp.position,
            bytes: resp.bytes,
        });
        if done {
            self.actions.push(Action::InstallSnapshot(id));
        }
    }

    /// Kafka's `validateOffsetAndEpoch`: None when (offset, epoch) is a
    /// prefix of our log, else where the replica must truncate to.
    fn validate_fetch_position(&self, fetch_offset: Offset, last_fetched_epoch: Epoch) -> Option<DivergingEpoch> {
        if fetch_offset == self.log.start_offset() && last_fetched_epoch == self.log.epoch_before(fetch_offset) {
            return None;
        }
        match self.log.end_offset_for_epoch(last_fetched_epoch) {
            Some((epoch, end_offset)) if epoch == last_fetched_epoch && fetch_offset <= end_offset => None,
            Some((epoch, end_offset)) => Some(DivergingEpoch {
                epoch,
                end_offset: end_offset.min(fetch_offset),
            }),
            None => Some(DivergingEpoch {
                epoch: self.log.epoch_before(self.log.start_offset()),
                end_offset: self.log.start_offset(),
            }),
        }
    }

    /// Answers a parked fetch with whatever it can have now.
    fn complete_parked(&mut self, parked: ParkedFetch) {
        let end = self.log.end_offset();
        let high_watermark = self.high_watermark;
        if let Role::Leader(leader) = &mut self.role {
            if let Some(replica) = leader.replica_mut(parked.replica) {
                replica.high_watermark_sent = high_watermark;
            }
        }
        let response = self.fetch_error(ErrorCode::None);
        let read = (parked.fetch_offset < end).then_some(ReadRange {
            from: parked.fetch_offset,
            until: end,
            max_bytes: (parked.max_bytes as usize).min(FETCH_READ_MAX_BYTES),
        });
        self.actions.push(Action::RespondFetch {
            to: parked.replica,
            request_id: parked.request_id,
            response,
            read,
        });
    }

    /// Completes parked fetches whose data arrived or whose wait ran out.
    fn poll_parked(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        let now = self.now_ms;
        let end = self.log.end_offset();
        let (ready, waiting): (Vec<ParkedFetch>, Vec<ParkedFetch>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.fetch_offset < end || now >= p.deadline_ms);
        self.parked = waiting;
        for parked in ready {
            self.complete_parked(parked);
        }
    }

    /// How long a fetch behind on the high watermark may stay parked now:
    /// `high_watermark_linger_ms` while this leader holds nothing
    /// uncommitted (its whole log is below the high watermark and nothing
    /// waits to be appended; its own flush may still run, the followers'
    /// made the majority), so that only a new write can come next; 0
    /// while writes are in flight, as Kafka does. Those writes keep
    /// followers fetching anyway, and holding a fetch back then made them
    /// take smaller batches sooner (`ab` at 256 clients, BENCHMARKS.md).
    fn high_watermark_linger_ms(&self) -> u64 {
        if self.log.end_offset() == self.high_watermark && self.accumulator.is_empty() {
            self.config.high_watermark_linger_ms
        } else {
            0
        }
    }

    /// Answers at once the parked fetches of replicas not yet told the
    /// current high watermark.
    fn complete_parked_behind_on_high_watermark(&mut self) {
        let Role::Leader(leader) = &self.role else { return };
        let hw = self.high_watermark;
        let (behind, rest): (Vec<ParkedFetch>, Vec<ParkedFetch>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| leader.replica(p.replica).is_none_or(|r| r.high_watermark_sent < hw));
        self.parked = rest;
        for parked in behind {
            self.complete_parked(parked);
        }
    }

    /// The high watermark moved: every parked fetch is answered within
    /// `high_watermark_linger_ms`, sooner if records come.
    fn tell_parked_of_high_watermark(&mut self) {
        let linger = self.high_watermark_linger_ms();
        if linger == 0 {
            for parked in std::mem::take(&mut self.parked) {
                self.complete_parked(parked);
            }
            return;
        }
        let deadline = self.now_ms + linger;
        for parked in &mut self.parked {
            parked.deadline_ms = parked.deadline_ms.min(deadline);
        }
    }

    fn maybe_advance_leader_high_watermark(&mut self) {
        let Role::Leader(leader) = &self.role else { return };
        let Some(hw) = leader.compute_high_watermark(self.log.flushed_end(), self.config.majority()) else {
            return;
        };
        // The leader's HW never moves backwards.
        if hw > self.high_watermark {
            self.high_watermark = hw;
            self.actions.push(Action::HighWatermark(hw));
            self.tell_parked_of_high_watermark();
        }
    }

    // ----------------------------------------------------------------
    // Fetch: the follower side
    // ----------------------------------------------------------------

    fn handle_fetch_response(&mut self, from: NodeId, current: bool, resp: FetchResponse) {
        if self.maybe_follow_response_epoch(resp.epoch, resp.leader_id) {
            return;
        }
        if !current {
            return;
        }
        let now = self.now_ms;
        let retry = now + self.config.retry_backoff_ms.max(1);
        let committed = self.committed_floor();
        let Role::Follower(f) = &mut self.role else { return };
        if f.leader_id != from || resp.epoch != self.election.epoch {
            return;
        }
        if resp.error != ErrorCode::None {
            f.next_fetch_ms = retry;
            return;
        }
        if let Some(diverging) = resp.diverging_epoch {
            // Truncate to where our log last agrees with the leader's.
            // Kafka's truncateToEndOffset: where our log last agrees with
            // the leader's. When we hold the leader's diverging epoch, its
            // batches are the same chain in both logs, so the leader's end
            // offset for it is a batch boundary in ours. When we do not, the
            // leader's offset may fall inside one of our batches (of another
            // epoch): cut only what lies above our own older epoch instead,
            // and the next Fetch, naming that older epoch, narrows it down.
            // Never cutting below what may agree keeps committed records
            // durable on every voter that holds them.
            let target = match self.log.end_offset_for_epoch(diverging.epoch) {
                Some((epoch, ours)) if epoch == diverging.epoch => ours.min(diverging.end_offset),
                Some((_, ours)) => ours,
                None => self.log.start_offset(),
            }
            .max(self.log.start_offset());
            if target < committed {
                // Committed records are in every later leader's log; a leader
                // asking us to drop them is broken. Refuse rather than lose them.
                tracing::error!(
                    target,
                    hw = self.high_watermark,
                    committed,
                    leader = from,
                    "refusing to truncate below the high watermark"
                );
                f.next_fetch_ms = retry;
                return;
            }
            f.last_fetch_success_ms = Some(now);
            f.fetch_deadline_ms = now + self.config.fetch_timeout_ms;
            self.truncate_log(target);
            return;
        }
        if let Some(id) = resp.snapshot_id {
            // A leader's snapshot is of its epoch or an earlier one, and
            // holds every committed record: one of a later epoch would start
            // our log at an epoch no leader has yet, one ending below our
            // high watermark would lose committed records.
            if id.epoch > resp.epoch
                || id.epoch < 0
                || id.end_offset < committed
                || id.end_offset > super::MAX_LOG_OFFSET
            {
                tracing::error!(
                    leader = from,
                    ?id,
                    epoch = resp.epoch,
                    hw = self.high_watermark,
                    committed,
                    "refusing a snapshot that cannot be the leader's"
                );
                f.next_fetch_ms = retry;
                return;
            }
            // Our log is below the leader's log start: fetch its snapshot
            // (resumable by position), install it, then fetch the log again.
            f.last_fetch_success_ms = Some(now);
            f.fetch_deadline_ms = now + self.config.fetch_timeout_ms;
            f.next_fetch_ms = now;
            tracing::info!(leader = from, ?id, "fetching the leader's snapshot");
            f.snapshot = Some(SnapshotFetch {
                id,
                position: 0,
                size: None,
                installing: false,
            });
            return;
        }
        // Validate the whole response before writing any of it.
        let mut expected = self.log.end_offset();
        let mut last_epoch = self.log.last_epoch();
        for batch in &resp.batches {
            let valid = batch.verify()
                && batch.base_offset == expected
                && batch.epoch >= last_epoch
                && batch.epoch <= resp.epoch;
            if !valid {
                tracing::error!(
                    leader = from,
                    offset = batch.base_offset,
                    "invalid batch in fetch response; dropped"
                );
                f.next_fetch_ms = retry;
                return;
            }
            expected = batch.next_offset();
            last_epoch = batch.epoch;
        }
        f.last_fetch_success_ms = Some(now);
        f.fetch_deadline_ms = now + self.config.fetch_timeout_ms;
        for batch in resp.batches {
            self.log.append(batch.base_offset, batch.next_offset(), batch.epoch);
            self.actions.push(Action::AppendBatch(batch));
        }
        // A follower adopts the leader's HW, capped by its own log end.
        let hw = resp.high_watermark.min(self.log.end_offset());
        if hw > self.high_watermark {
            self.high_watermark = hw;
            self.actions.push(Action::HighWatermark(hw));
        }
    }

    // ----------------------------------------------------------------
    // Appends on the leader
    // ----------------------------------------------------------------

    /// With linger 0 the accumulator drains whenever no flush is in flight,
    /// and what arrives during a flush goes into the next batch (group
    /// commit), unless a replica is waiting for it: a parked fetch, or one
    /// that arrives at the log end, takes what is there at once (see
    /// [`Self::drain_for_fetch`]). With a linger it drains when the oldest
    /// record has waited that long. A full accumulator always drains.
    fn maybe_drain_accumulator(&mut self) {
        if self.accumulator.is_empty() {
            return;
        }
        let linger = self.config.append_linger_ms;
        let due = if linger == 0 {
            self.flush_target.is_none() || !self.parked.is_empty()
        } else {
            self.accumulator
                .linger_deadline_ms(linger)
                .map(|t| self.now_ms >= t)
                .unwrap_or(false)
        };
        if due || self.accumulator.bytes() >= self.config.max_batch_bytes {
            self.drain_accumulator();
        }
    }

    /// With linger 0, a fetch at the log end takes the records waiting for
    /// the leader's flush at once: the follower writes and flushes them
    /// while the leader's flush runs, instead of after it (the commit still
    /// needs the leader's flush or the other follower's).
    fn drain_for_fetch(&mut self, fetch_offset: Offset) {
        if self.config.append_linger_ms == 0 && fetch_offset >= self.log.end_offset() {
            self.drain_accumulator();
        }
    }

    fn drain_accumulator(&mut self) {
        let records = self.accumulator.drain();
        if !records.is_empty() {
            self.append_as_leader(records);
        }
    }

    fn append_as_leader(&mut self, records: Vec<Record>) {
        let epoch = self.election.epoch;
        let now = self.now_ms;
        let Role::Leader(leader) = &mut self.role else {
            unreachable!("only a leader appends")
        };
        leader.last_append_ms = now;
        let end = self.log.end_offset();
        if end > super::MAX_LOG_OFFSET - records.len() as Offset {
            // Only a snapshot id a leader made up can bring a log here;
            // proposals are refused before, so these are our own records.
            tracing::error!(end, "the log is full; the leader appends nothing more");
            return;
        }
        let batch = Batch::new(end, epoch, &records);
        self.log.append(batch.base_offset, batch.next_offset(), epoch);
        self.actions.push(Action::AppendBatch(batch));
        // Followers may read the batch before our own flush completes.
        self.poll_parked();
    }
}
