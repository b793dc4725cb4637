//! Peers that send nonsense. Every message below decodes (the transport
//! refuses what does not), but its fields take any value: epochs and
//! offsets far in the past or future, negative, at the integer limits;
//! senders that are not voters or claim to be this node; answers to
//! requests never sent, sent to someone else, or of another kind; batches
//! that are damaged, misplaced or of impossible epochs. Kafka's KRaft
//! answers such input with an error code or ignores it; so must the
//! engine, whatever state it is in: no panic (a panic here would take the
//! node's actor down from the network), and none of its own rules broken
//! on the way.
//!
//! Raft trusts its voters, so a peer that lies *as a voter* (grants votes
//! it never persisted, claims leadership of an epoch it did not win) can
//! mislead the node; what it must never do is make the node contradict
//! itself: vote twice in one epoch, move its epoch or high watermark back,
//! or write a batch that does not continue its own log.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::messages::*;

const ME: NodeId = 1;
const OBSERVER: NodeId = 100;

/// The node's state the inputs start from.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// Voter 1 of {1,2,3}, empty log, never elected.
    FreshVoter,
    /// Voter 1 of {1,2,3} following 2 in epoch 3 over a log of three epochs.
    Follower,
    /// The same follower, told by its leader to fetch a snapshot.
    FetchingSnapshot,
    /// Voter 1 restarted as the leader of epoch 3 (it resigns).
    RestartedLeader,
    /// The only voter: leader at once, over a log compacted into a snapshot.
    SoleVoterWithSnapshot,
    /// Observer 100 of {1,2,3}.
    Observer,
    /// Voter 1 of {1,2,3} whose log (a snapshot installed from a leader
    /// that made it up) ends next to the largest offset.
    NearTheLargestOffset,
}

fn voters(ids: &[NodeId]) -> BTreeMap<NodeId, String> {
    ids.iter().map(|id| (*id, format!("127.0.0.1:{}", 9000 + id))).collect()
}

impl Start {
    /// The log end the node starts from (before it appends anything).
    fn end_offset(self) -> Offset {
        match self {
            Start::FreshVoter | Start::Observer => 0,
            Start::Follower | Start::FetchingSnapshot | Start::RestartedLeader => 30,
            Start::SoleVoterWithSnapshot => 150,
            Start::NearTheLargestOffset => MAX_LOG_OFFSET - 2,
        }
    }

    fn node(self, seed: u64) -> RaftNode {
        let three = voters(&[1, 2, 3]);
        match self {
            Start::FreshVoter => RaftNode::new(
                RaftConfig::new(ME, three, "127.0.0.1:9001".into()),
                ElectionState::default(),
                LogView::empty(),
                0,
                seed,
            ),
            Start::Follower | Start::FetchingSnapshot | Start::RestartedLeader => {
                let leader = if matches!(self, Start::RestartedLeader) { ME } else { 2 };
                let election = ElectionState {
                    epoch: 3,
                    voted_for: Some(leader),
                    leader_id: Some(leader),
                };
                let log = LogView::new(0, 0, 30, vec![(1, 0), (2, 10), (3, 20)]);
                RaftNode::new(
                    RaftConfig::new(ME, three, "127.0.0.1:9001".into()),
                    election,
                    log,
                    0,
                    seed,
                )
            }
            Start::SoleVoterWithSnapshot => {
                let election = ElectionState {
                    epoch: 3,
                    voted_for: Some(ME),
                    leader_id: Some(ME),
                };
                let log = LogView::new(100, 2, 150, vec![(3, 120)]);
                let mut node = RaftNode::new(
                    RaftConfig::new(ME, voters(&[ME]), "127.0.0.1:9001".into()),
                    election,
                    log,
                    0,
                    seed,
                );
                node.on_snapshot_created(
                    0,
                    SnapshotId {
                        end_offset: 100,
                        epoch: 2,
                    },
                );
                node
            }
            Start::NearTheLargestOffset => RaftNode::new(
                RaftConfig::new(ME, three, "127.0.0.1:9001".into()),
                ElectionState::unattached(3),
                LogView::new(MAX_LOG_OFFSET - 2, 3, MAX_LOG_OFFSET - 2, Vec::new()),
                0,
                seed,
            ),
            Start::Observer => RaftNode::new(
                RaftConfig::new(OBSERVER, three, "127.0.0.1:9100".into()),
                ElectionState::default(),
                LogView::empty(),
                0,
                seed,
            ),
        }
    }
}

/// An epoch: near the node's own (so that it matters), the one its log
/// holds at the message's offset (so that a fetch position is valid), or
/// anything.
#[derive(Clone, Copy, Debug)]
enum EpochPick {
    Near(i32),
    AtOffset,
    Abs(Epoch),
}

/// The leader an answer names: the one the node knows, or anyone.
#[derive(Clone, Copy, Debug)]
enum LeaderPick {
    Known,
    Id(Option<NodeId>),
}

/// An offset: near the node's log end, near its start, or anything.
#[derive(Clone, Copy, Debug)]
enum OffsetPick {
    NearEnd(i64),
    NearStart(i64),
    Abs(Offset),
}

/// The values one message draws its fields from, resolved against the
/// node's state when the message is built.
#[derive(Clone, Debug)]
struct Fields {
    epoch: EpochPick,
    other_epoch: EpochPick,
    node: NodeId,
    leader: LeaderPick,
    offset: OffsetPick,
    other_offset: OffsetPick,
    flag: bool,
    other_flag: bool,
    error: ErrorCode,
    small: u64,
    large: u64,
    nodes: Vec<NodeId>,
    /// (epoch, records, damage) per batch of a fetch answer; damage 1
    /// breaks the CRC, 2 leaves a gap before the batch.
    batches: Vec<(EpochPick, u8, u8)>,
    variant: u8,
}

#[derive(Clone, Debug)]
enum Input {
    /// A request from a peer.
    Request(Fields),
    /// An answer to the node's `pick`-th outstanding request: of the kind
    /// asked for when `matching`, else of any kind; from someone else than
    /// the one asked when `misdirected`.
    Answer {
        pick: usize,
        matching: bool,
        misdirected: bool,
        fields: Fields,
    },
    /// An answer to a request the node never sent.
    Stray { correlation_id: u64, fields: Fields },
    /// The `pick`-th outstanding request failed.
    Failed(usize),
    /// Time passes.
    Tick(u64),
    /// The pending flush completes.
    Flushed,
    /// A client appends this many records.
    Propose(u8),
}

fn epoch_pick() -> impl Strategy<Value = EpochPick> {
    prop_oneof![
        4 => Just(EpochPick::Near(0)),
        3 => (-2i32..=3).prop_map(EpochPick::Near),
        2 => Just(EpochPick::AtOffset),
        1 => prop_oneof![
            Just(0),
            Just(-1),
            Just(i32::MAX),
            Just(i32::MAX - 1),
            Just(i32::MIN),
            any::<i32>()
        ]
        .prop_map(EpochPick::Abs),
    ]
}

fn offset_pick() -> impl Strategy<Value = OffsetPick> {
    prop_oneof![
        4 => (-12i64..=12).prop_map(OffsetPick::NearEnd),
        1 => (-3i64..=3).prop_map(OffsetPick::NearStart),
        1 => prop_oneof![Just(0), Just(-1), Just(i64::MAX), Just(i64::MIN), any::<i64>()].prop_map(OffsetPick::Abs),
    ]
}

fn node_id() -> impl Strategy<Value = NodeId> {
    prop_oneof![
        6 => prop_oneof![Just(1), Just(2), Just(3)],
        1 => Just(OBSERVER),
        1 => prop_oneof![Just(0), Just(-1), Just(i32::MAX), any::<i32>()],
    ]
}

fn leader_pick() -> impl Strategy<Value = LeaderPick> {
    prop_oneof![
        3 => Just(LeaderPick::Known),
        1 => proptest::option::of(node_id()).prop_map(LeaderPick::Id),
    ]
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    prop_oneof![
        8 => Just(ErrorCode::None),
        1 => prop_oneof![
            Just(ErrorCode::FencedLeaderEpoch),
            Just(ErrorCode::UnknownLeaderEpoch),
            Just(ErrorCode::NotLeaderOrFollower),
            Just(ErrorCode::InconsistentClusterId),
            Just(ErrorCode::InconsistentVoterSet),
            Just(ErrorCode::InvalidRequest),
            Just(ErrorCode::BrokerNotAvailable),
            Just(ErrorCode::SnapshotNotFound),
            Just(ErrorCode::PositionOutOfRange),
            Just(ErrorCode::KafkaStorageError),
        ],
    ]
}

fn fields() -> impl Strategy<Value = Fields> {
    (
        (epoch_pick(), epoch_pick(), node_id(), leader_pick()),
        (offset_pick(), offset_pick(), any::<bool>(), any::<bool>(), error_code()),
        (
            prop_oneof![0u64..3000, any::<u64>()],
            prop_oneof![0u64..5000, Just(u64::MAX), any::<u64>()],
            proptest::collection::vec(node_id(), 0..4),
            proptest::collection::vec(
                (
                    epoch_pick(),
                    1u8..4,
                    prop_oneof![8 => Just(0u8), 1 => Just(1), 1 => Just(2)],
                ),
                0..4,
            ),
            any::<u8>(),
        ),
    )
        .prop_map(
            |(
                (epoch, other_epoch, node, leader),
                (offset, other_offset, flag, other_flag, error),
                (small, large, nodes, batches, variant),
            )| Fields {
                epoch,
                other_epoch,
                node,
                leader,
                offset,
                other_offset,
                flag,
                other_flag,
                error,
                small,
                large,
                nodes,
                batches,
                variant,
            },
        )
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        6 => fields().prop_map(Input::Request),
        6 => (any::<usize>(), proptest::bool::weighted(0.8), proptest::bool::weighted(0.1), fields()).prop_map(
            |(pick, matching, misdirected, fields)| Input::Answer { pick, matching, misdirected, fields }
        ),
        1 => (any::<u64>(), fields()).prop_map(|(correlation_id, fields)| Input::Stray { correlation_id, fields }),
        1 => any::<usize>().prop_map(Input::Failed),
        3 => prop_oneof![0u64..50, 0u64..3000, Just(100_000)].prop_map(Input::Tick),
        3 => Just(Input::Flushed),
        2 => (1u8..5).prop_map(Input::Propose),
    ]
}

/// Runs one engine, carrying out its actions the way the shell would, and
/// checks after every step what it must never do.
struct Harness {
    node: RaftNode,
    now: u64,
    next_request_id: u64,
    /// The node's requests not yet answered: (to, correlation id, request).
    outstanding: Vec<(NodeId, u64, RaftRequest)>,
    /// The log end as the node's storage sees it (the actions applied).
    end_offset: Offset,
    /// The log end a pending Flush covers.
    flush_pending: Option<Offset>,
    /// The snapshot being fetched: its id, size and the bytes written.
    chunks: Option<(SnapshotId, u64, u64)>,
    /// Records a proposal was accepted for and not yet seen written, by
    /// the offset it was promised: the leader's epoch then, and the record.
    proposed: BTreeMap<Offset, (Epoch, Record)>,
    next_proposal: u64,
    /// Every vote the node persisted, by epoch.
    votes: BTreeMap<Epoch, NodeId>,
    epoch: Epoch,
    high_watermark: Offset,
}

impl Harness {
    fn new(start: Start, seed: u64) -> Self {
        let node = start.node(seed);
        let mut harness = Harness {
            end_offset: start.end_offset(),
            epoch: node.election_state().epoch,
            high_watermark: node.high_watermark(),
            node,
            now: 0,
            next_request_id: 1,
            outstanding: Vec::new(),
            flush_pending: None,
            chunks: None,
            proposed: BTreeMap::new(),
            next_proposal: 0,
            votes: BTreeMap::new(),
        };
        harness.carry_out();
        if let Start::FetchingSnapshot = start {
            let (_, correlation_id, _) = harness.outstanding.pop().expect("a follower fetches at once");
            let response = RaftResponse::Fetch(FetchResponse {
                error: ErrorCode::None,
                epoch: 3,
                leader_id: Some(2),
                high_watermark: 45,
                log_start_offset: 40,
                diverging_epoch: None,
                snapshot_id: Some(SnapshotId {
                    end_offset: 40,
                    epoch: 3,
                }),
                batches: Vec::new(),
            });
            harness.node.handle_response(0, 2, correlation_id, response);
            harness.carry_out();
            assert!(
                matches!(harness.outstanding.last(), Some((2, _, RaftRequest::FetchSnapshot(_)))),
                "the follower fetches the snapshot: {:?}",
                harness.outstanding
            );
        }
        harness
    }

    /// `offset` is the message's own, for [`EpochPick::AtOffset`].
    fn epoch(&self, pick: EpochPick, offset: Offset) -> Epoch {
        let log = self.node.log();
        match pick {
            EpochPick::Near(delta) => self.node.election_state().epoch.saturating_add(delta),
            EpochPick::AtOffset if (log.start_offset()..=log.end_offset()).contains(&offset) => {
                log.epoch_before(offset)
            }
            EpochPick::AtOffset => 0,
            EpochPick::Abs(epoch) => epoch,
        }
    }

    fn leader(&self, pick: LeaderPick) -> Option<NodeId> {
        match pick {
            LeaderPick::Known => self.node.role().leader_id,
            LeaderPick::Id(id) => id,
        }
    }

    fn offset(&self, pick: OffsetPick) -> Offset {
        match pick {
            OffsetPick::NearEnd(delta) => self.node.log().end_offset().saturating_add(delta),
            OffsetPick::NearStart(delta) => self.node.log().start_offset().saturating_add(delta),
            OffsetPick::Abs(offset) => offset,
        }
    }

    fn request(&self, f: &Fields) -> RaftRequest {
        let offset = self.offset(f.offset);
        let epoch = self.epoch(f.epoch, offset);
        let other_epoch = self.epoch(f.other_epoch, offset);
        match f.variant % 7 {
            0 => RaftRequest::Vote(VoteRequest {
                epoch,
                candidate_id: f.node,
                last_epoch: other_epoch,
                last_epoch_end_offset: offset,
                pre_vote: f.flag,
            }),
            1 => RaftRequest::BeginQuorumEpoch(BeginQuorumEpochRequest {
                epoch,
                leader_id: f.node,
                leader_endpoint: "127.0.0.1:1".into(),
            }),
            2 => RaftRequest::EndQuorumEpoch(EndQuorumEpochRequest {
                epoch,
                leader_id: f.node,
                preferred_successors: f.nodes.clone(),
            }),
            3 | 4 => RaftRequest::Fetch(FetchRequest {
                replica_id: f.node,
                current_epoch: epoch,
                fetch_offset: offset,
                last_fetched_epoch: other_epoch,
                max_wait_ms: f.small,
                max_bytes: f.large as u32,
            }),
            5 => RaftRequest::FetchSnapshot(FetchSnapshotRequest {
                replica_id: f.node,
                current_epoch: epoch,
                snapshot_id: self.snapshot_id(f),
                position: f.large,
                max_bytes: f.small as u32,
            }),
            _ if f.flag && f.other_flag && f.variant.is_multiple_of(2) => RaftRequest::ReadIndex,
            _ if f.flag && f.other_flag => RaftRequest::Controller(vec![1u8; 5]),
            _ if f.flag => RaftRequest::DescribeQuorum,
            _ if f.other_flag => RaftRequest::AppendMany(AppendManyRequest {
                groups: vec![AppendRequest {
                    records: vec![serde_bytes::ByteBuf::from(vec![7u8; 3])],
                }],
            }),
            _ => RaftRequest::Append(AppendRequest {
                records: vec![serde_bytes::ByteBuf::from(vec![7u8; 3])],
            }),
        }
    }

    fn snapshot_id(&self, f: &Fields) -> SnapshotId {
        match (f.other_flag, self.node.latest_snapshot()) {
            (true, Some(latest)) => latest,
            _ => {
                let end_offset = self.offset(f.other_offset);
                SnapshotId {
                    end_offset,
                    epoch: self.epoch(f.other_epoch, end_offset),
                }
            }
        }
    }

    /// A response of the kind `variant` names, to `request` if there is one.
    fn response(&self, variant: u8, f: &Fields, request: Option<&RaftRequest>) -> RaftResponse {
        let epoch = self.epoch(f.epoch, self.node.log().end_offset());
        let leader_id = self.leader(f.leader);
        match variant % 11 {
            0 => RaftResponse::Vote(VoteResponse {
                error: f.error,
                epoch,
                leader_id,
                vote_granted: f.flag,
                pre_vote: f.other_flag,
            }),
            1 => RaftResponse::BeginQuorumEpoch(QuorumEpochResponse {
                error: f.error,
                epoch,
                leader_id,
            }),
            2 => RaftResponse::EndQuorumEpoch(QuorumEpochResponse {
                error: f.error,
                epoch,
                leader_id,
            }),
            3 => RaftResponse::Fetch(self.fetch_response(f)),
            4 => {
                // Mostly the chunk asked for, of a snapshot of up to three
                // chunks; sometimes anything.
                let (snapshot_id, position) = match request {
                    Some(RaftRequest::FetchSnapshot(asked)) if f.flag => (asked.snapshot_id, asked.position),
                    _ => (self.snapshot_id(f), f.large),
                };
                let len = 1 + f.small % 400;
                let size = match f.variant % 4 {
                    0 => f.large,
                    _ => position.saturating_add(len * (f.variant as u64 % 3)),
                };
                RaftResponse::FetchSnapshot(FetchSnapshotResponse {
                    error: f.error,
                    epoch,
                    leader_id,
                    snapshot_id,
                    size,
                    position,
                    bytes: vec![5u8; len.min(size.saturating_sub(position)).max(f.other_flag as u64) as usize],
                })
            }
            5 => RaftResponse::DescribeQuorum(self.node.describe(self.now)),
            6 => RaftResponse::Append(AppendResponse::NotLeader { leader_id }),
            7 => RaftResponse::AppendMany(vec![AppendResponse::NotLeader { leader_id }]),
            8 => RaftResponse::Controller(vec![0u8; f.small as usize % 7]),
            9 => RaftResponse::ReadIndex(crate::messages::ReadIndexResponse::Index(f.large as Offset)),
            _ => RaftResponse::Error(f.error),
        }
    }

    fn fetch_response(&self, f: &Fields) -> FetchResponse {
        let end = self.node.log().end_offset();
        let epoch = self.epoch(f.epoch, end);
        // One answer in four carries either a divergence or a snapshot, as a
        // leader's does; the rest carry batches from the log end on.
        let (diverging_epoch, snapshot_id) = match f.variant % 8 {
            0 => (
                Some(DivergingEpoch {
                    epoch: self.epoch(f.other_epoch, self.offset(f.other_offset)),
                    end_offset: self.offset(f.other_offset),
                }),
                None,
            ),
            1 => (None, Some(self.snapshot_id(f))),
            _ => (None, None),
        };
        let mut batches = Vec::new();
        let mut base_offset = end;
        for (pick, records, damage) in &f.batches {
            if *damage == 2 {
                base_offset = base_offset.saturating_add(1);
            }
            let records: Vec<Record> = (0..*records).map(|i| Record::Data(vec![i; 8])).collect();
            let mut batch = Batch::new(base_offset, self.epoch(*pick, base_offset), &records);
            if *damage == 1 {
                batch.crc ^= 1;
            }
            // A log that ends near the largest offset (a snapshot can put
            // it there) gets a batch whose offsets run past it, and no more.
            let next = base_offset.checked_add(records.len() as Offset);
            batches.push(batch);
            match next {
                Some(next) => base_offset = next,
                None => break,
            }
        }
        FetchResponse {
            error: f.error,
            epoch,
            leader_id: self.leader(f.leader),
            high_watermark: self.offset(f.offset),
            log_start_offset: 0,
            diverging_epoch,
            snapshot_id,
            batches,
        }
    }

    fn step(&mut self, input: &Input) {
        match input {
            Input::Request(f) => {
                let request = self.request(f);
                let id = self.next_request_id;
                self.next_request_id += 1;
                self.node.handle_request(self.now, f.node, id, request);
            }
            Input::Answer {
                pick,
                matching,
                misdirected,
                fields,
            } => {
                if self.outstanding.is_empty() {
                    return;
                }
                let (to, correlation_id, request) = self.outstanding.remove(pick % self.outstanding.len());
                let variant = match (matching, &request) {
                    (false, _) => fields.variant,
                    (true, RaftRequest::Vote(_)) => 0,
                    (true, RaftRequest::BeginQuorumEpoch(_)) => 1,
                    (true, RaftRequest::EndQuorumEpoch(_)) => 2,
                    (true, RaftRequest::Fetch(_)) => 3,
                    (true, RaftRequest::FetchSnapshot(_)) => 4,
                    (true, RaftRequest::DescribeQuorum) => 5,
                    (true, RaftRequest::Append(_)) => 6,
                    (true, RaftRequest::AppendMany(_)) => 7,
                    (true, RaftRequest::Controller(_)) => 8,
                    (true, RaftRequest::ReadIndex) => 9,
                };
                let response = self.response(variant, fields, Some(&request));
                let from = if *misdirected { fields.node } else { to };
                self.node.handle_response(self.now, from, correlation_id, response);
            }
            Input::Stray { correlation_id, fields } => {
                let response = self.response(fields.variant, fields, None);
                self.node
                    .handle_response(self.now, fields.node, *correlation_id, response);
            }
            Input::Failed(pick) => {
                if self.outstanding.is_empty() {
                    return;
                }
                let (to, correlation_id, _) = self.outstanding.remove(pick % self.outstanding.len());
                self.node.handle_request_failed(self.now, to, correlation_id);
            }
            Input::Tick(ms) => {
                self.now += ms;
                self.node.tick(self.now);
            }
            Input::Flushed => {
                if let Some(end) = self.flush_pending.take() {
                    self.node.on_flushed(self.now, end);
                }
            }
            Input::Propose(n) => {
                let records: Vec<Record> = (0..*n)
                    .map(|_| {
                        self.next_proposal += 1;
                        Record::Data(format!("proposal {}", self.next_proposal).into_bytes())
                    })
                    .collect();
                if let Ok(proposed) = self.node.propose(self.now, records.clone()) {
                    for (offset, record) in (proposed.base_offset..).zip(records) {
                        self.proposed.insert(offset, (proposed.epoch, record));
                    }
                }
            }
        }
        self.carry_out();
    }

    /// Applies the node's actions as its shell would, checking each.
    fn carry_out(&mut self) {
        loop {
            let actions = self.node.take_actions();
            if actions.is_empty() {
                break;
            }
            for action in actions {
                self.apply(action);
            }
        }
        let epoch = self.node.election_state().epoch;
        assert!(epoch >= self.epoch, "epoch went back from {} to {epoch}", self.epoch);
        self.epoch = epoch;
        let hw = self.node.high_watermark();
        assert!(
            hw >= self.high_watermark,
            "high watermark went back from {} to {hw}",
            self.high_watermark
        );
        self.high_watermark = hw;
        assert_eq!(
            self.node.log().end_offset(),
            self.end_offset,
            "the node's log view left its storage"
        );
    }

    /// Lets the node finish what it has: flushes complete, no time passes.
    /// A leader still in the epoch of its proposals has then written them.
    fn settle(&mut self) {
        for _ in 0..4 {
            self.step(&Input::Flushed);
            self.step(&Input::Tick(0));
        }
        assert!(
            self.proposed.is_empty(),
            "accepted proposals never written: {:?}",
            self.proposed.keys().collect::<Vec<_>>()
        );
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::PersistElection(state) => {
                assert!(state.epoch >= self.epoch, "persisted epoch {} went back", state.epoch);
                if let Some(candidate) = state.voted_for {
                    let earlier = *self.votes.entry(state.epoch).or_insert(candidate);
                    assert_eq!(earlier, candidate, "two votes in epoch {}", state.epoch);
                }
            }
            Action::AppendBatch(batch) => {
                assert!(batch.verify(), "wrote a damaged batch at {}", batch.base_offset);
                // A leader writes an accepted proposal at the offset it
                // promised, in the epoch it promised it in.
                if let Ok(records) = batch.records() {
                    for (offset, record) in (batch.base_offset..).zip(records) {
                        if let Some((epoch, promised)) = self.proposed.remove(&offset) {
                            assert_eq!((batch.epoch, &record), (epoch, &promised), "offset {offset}");
                        }
                    }
                }
                assert_eq!(
                    batch.base_offset, self.end_offset,
                    "a batch that does not continue the log"
                );
                self.end_offset = batch.next_offset();
            }
            Action::Truncate { end_offset } => {
                assert!(
                    end_offset >= self.high_watermark,
                    "truncated to {end_offset}, below the high watermark {}",
                    self.high_watermark
                );
                assert!(end_offset <= self.end_offset, "a truncation above the log end");
                self.end_offset = end_offset;
            }
            Action::Flush => {
                self.flush_pending = Some(self.end_offset);
            }
            Action::Send {
                to,
                correlation_id,
                request,
                ..
            } => self.outstanding.push((to, correlation_id, request)),
            Action::HighWatermark(hw) => {
                assert!(
                    hw <= self.end_offset.max(self.node.log().start_offset()),
                    "high watermark {hw} past the log"
                );
            }
            Action::WriteSnapshotChunk {
                snapshot_id,
                size,
                position,
                bytes,
            } => {
                // The first chunk starts a new file; the others continue it.
                let written = match self.chunks {
                    Some((id, file_size, written)) if position > 0 => {
                        assert_eq!((id, file_size), (snapshot_id, size), "a chunk of another snapshot");
                        written
                    }
                    _ => 0,
                };
                assert_eq!(position, written, "a snapshot chunk out of order");
                let end = position + bytes.len() as u64;
                assert!(end <= size, "a snapshot chunk past the snapshot's size");
                self.chunks = Some((snapshot_id, size, end));
            }
            Action::InstallSnapshot(id) => {
                assert!(
                    matches!(self.chunks, Some((fetched, size, written)) if fetched == id && written == size),
                    "installs {id:?} after fetching {:?}",
                    self.chunks
                );
                assert!(
                    id.end_offset >= self.high_watermark,
                    "a snapshot below the high watermark"
                );
                self.chunks = None;
                // The shell replaces the log by the snapshot's end.
                self.end_offset = id.end_offset;
                self.flush_pending = None;
                let _ = self.node.on_snapshot_installed(self.now, id);
            }
            Action::RoleChanged(role) => {
                // A leader that lost its epoch may lose what it had not
                // written (the shell answers those appends with an unknown
                // outcome).
                self.proposed
                    .retain(|_, (promised, _)| role.role == RoleKind::Leader && *promised == role.epoch);
            }
            Action::Respond { .. } | Action::RespondFetch { .. } | Action::RespondFetchSnapshot { .. } => {}
        }
    }
}

fn start() -> impl Strategy<Value = Start> {
    prop_oneof![
        Just(Start::FreshVoter),
        Just(Start::Follower),
        Just(Start::FetchingSnapshot),
        Just(Start::RestartedLeader),
        Just(Start::SoleVoterWithSnapshot),
        Just(Start::Observer),
        Just(Start::NearTheLargestOffset),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn nonsense_from_peers_never_panics_nor_breaks_the_nodes_own_rules(
        start in start(),
        seed in any::<u64>(),
        inputs in proptest::collection::vec(input(), 1..120),
    ) {
        let mut harness = Harness::new(start, seed);
        for input in &inputs {
            harness.step(input);
        }
        harness.settle();
    }
}
