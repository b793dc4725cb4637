//! The Follower role (Kafka's `FollowerState`): a node that knows the
//! leader of its epoch and replicates the leader's log by fetching it,
//! or the leader's snapshot when its log is below the leader's log start
//! (KIP-630). Observers replicate as followers too.
//!
//! Enters it: a node restarting with a known leader of its persisted epoch
//! that is not itself; any node that learns the leader of a higher epoch
//! from its BeginQuorumEpoch or from a response; an Unattached, Prospective
//! or Candidate node that gets the BeginQuorumEpoch of its epoch's leader,
//! or a response naming it (a Prospective only if it knew no leader of this
//! epoch; this is how an observer finds the leader); a Prospective whose
//! pre-vote failed, back to the leader it left in this epoch.
//!
//! Leaves it: when no fetch succeeded within the fetch timeout, for
//! Prospective (a voter) or Unattached (an observer); for Unattached or
//! Follower on a higher epoch. The leader's EndQuorumEpoch shortens the
//! fetch timeout (see `resigned.rs`).
//!
//! The rules it carries (KIP-595): a follower fetches only once its log is
//! durable, since its fetch offset acknowledges it; it truncates to where
//! its log last agrees with the leader's (the diverging epoch) and never
//! below what it knows committed; it adopts the leader's high watermark,
//! capped by its own log end. While its leader is live it refuses
//! pre-votes (KIP-996, see `vote.rs`).

use crate::messages::{
    BeginQuorumEpochRequest, ErrorCode, FetchResponse, FetchSnapshotRequest, FetchSnapshotResponse,
    QuorumEpochResponse, RaftRequest, RaftResponse, SnapshotId, MAX_BATCH_BYTES,
};

use super::node::{Action, RaftNode, RequestKind, Role};
use super::{ElectionState, Epoch, LogView, NodeId};

/// `on_snapshot_installed` (or `on_snapshot_install_failed`) for an install
/// the engine is not waiting for: it changed nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no install of snapshot {id:?} was pending (role {role})")]
pub struct UnexpectedInstall {
    pub id: SnapshotId,
    pub role: &'static str,
}

#[derive(Debug)]
pub(super) struct FollowerState {
    pub(super) leader_id: NodeId,
    /// Without a successful fetch by then the leader is presumed gone.
    pub(super) fetch_deadline_ms: u64,
    pub(super) last_fetch_success_ms: Option<u64>,
    /// Set by EndQuorumEpoch: the leader announced it is stepping down.
    pub(super) leader_resigned: bool,
    pub(super) next_fetch_ms: u64,
    /// Set while the leader's snapshot is being fetched instead of the log.
    pub(super) snapshot: Option<SnapshotFetch>,
    /// Installs of the leader's snapshot that failed in a row: each doubles
    /// the wait before the transfer starts again.
    pub(super) failed_installs: u32,
}

impl FollowerState {
    /// A fetch (or snapshot chunk) from the leader succeeded at `now`: the
    /// leader is alive for another fetch timeout.
    fn on_fetch_success(&mut self, now: u64, fetch_timeout_ms: u64) {
        self.last_fetch_success_ms = Some(now);
        self.fetch_deadline_ms = now + fetch_timeout_ms;
    }
}

/// A snapshot transfer from the leader (KIP-630).
#[derive(Debug)]
pub(super) struct SnapshotFetch {
    pub(super) id: SnapshotId,
    /// Bytes received so far (the position of the next FetchSnapshot).
    pub(super) position: u64,
    /// The size the first chunk gave; every later one must give the same.
    pub(super) size: Option<u64>,
    /// `InstallSnapshot` was emitted; waiting for the shell's report.
    pub(super) installing: bool,
}

impl RaftNode {
    pub(super) fn new_follower(&mut self, leader_id: NodeId) -> FollowerState {
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

    pub(super) fn become_follower(&mut self, epoch: Epoch, leader: NodeId) {
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

    /// Earliest time at which a Follower has something to do.
    pub(super) fn follower_deadline_ms(&self, f: &FollowerState) -> u64 {
        if !self.may_fetch() {
            f.fetch_deadline_ms
        } else {
            f.fetch_deadline_ms.min(f.next_fetch_ms)
        }
    }

    pub(super) fn poll_follower(&mut self) {
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
        if now >= f.next_fetch_ms && self.may_fetch() {
            let to = f.leader_id;
            self.send_fetch(to);
        }
    }

    /// The leader of `req.epoch` announces itself: a node without a leader
    /// of that epoch follows it.
    pub(super) fn handle_begin_quorum_epoch(&mut self, from: NodeId, request_id: u64, req: BeginQuorumEpochRequest) {
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
                // Kafka's hasConsistentLeader: a leader this node recorded
                // in the epoch (as a follower that then timed out) is the
                // only one it may follow in it.
                Role::Unattached(_) | Role::Prospective(_)
                    if self.election.leader_id.is_some_and(|known| known != req.leader_id) =>
                {
                    tracing::error!(
                        epoch = req.epoch,
                        leader = req.leader_id,
                        known = ?self.election.leader_id,
                        "BeginQuorumEpoch conflicts with the leader recorded for this epoch"
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

    pub(super) fn handle_fetch_response(&mut self, from: NodeId, current: bool, resp: FetchResponse) {
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
            f.on_fetch_success(now, self.config.fetch_timeout_ms);
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
            f.on_fetch_success(now, self.config.fetch_timeout_ms);
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
            // What the log holds must decode when read: checked before it
            // is written, so that it can never be committed.
            let records = if valid { batch.check_log_records() } else { Ok(()) };
            if !valid || records.is_err() {
                tracing::error!(
                    leader = from,
                    offset = batch.base_offset,
                    reason = records.err().map(|e| e.to_string()),
                    "invalid batch in fetch response; dropped"
                );
                f.next_fetch_ms = retry;
                return;
            }
            expected = batch.next_offset();
            last_epoch = batch.epoch;
        }
        f.on_fetch_success(now, self.config.fetch_timeout_ms);
        for batch in resp.batches {
            self.log.append(batch.base_offset, batch.next_offset(), batch.epoch);
            self.backlog.on_append(batch.next_offset(), batch.size_bytes());
            self.actions.push(Action::AppendBatch(batch));
        }
        // A follower adopts the leader's HW, capped by its own log end.
        let hw = resp.high_watermark.min(self.log.end_offset());
        if hw > self.high_watermark {
            self.high_watermark = hw;
            self.actions.push(Action::HighWatermark(hw));
        }
    }

    pub(super) fn handle_fetch_snapshot_response(&mut self, from: NodeId, current: bool, resp: FetchSnapshotResponse) {
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
        // `on_fetch_success`, by field: `snapshot` still borrows `f`.
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

    /// Ok when this node is a Follower whose transfer of `id` is installing.
    pub(super) fn check_install_pending(&self, id: SnapshotId) -> Result<(), UnexpectedInstall> {
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

    /// The pending install of `id` is done (`on_snapshot_installed`): the
    /// log is now empty and starts at its end offset, and the follower
    /// fetches the log again, its fetch timeout running from now.
    pub(super) fn load_installed_snapshot(&mut self, id: SnapshotId) {
        let now = self.now_ms;
        self.log = LogView::new(id.end_offset, id.epoch, id.end_offset, Vec::new());
        self.flush_target = None;
        self.backlog.on_log_replaced();
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
    }

    /// The pending install of `id` failed (`on_snapshot_install_failed`):
    /// the transfer starts over after a wait that doubles with every
    /// failure in a row.
    pub(super) fn restart_snapshot_fetch(&mut self, id: SnapshotId) {
        let now = self.now_ms;
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
    }
}
