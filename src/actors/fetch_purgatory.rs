//! FetchPurgatory: pending append completions (docs/ARCHITECTURE.md,
//! "Actors and threads" and "Protocol rules").
//!
//! Parked long-poll *fetches* are decided inside the pure engine (it answers
//! them with `RespondFetch` when data or the high watermark arrives, or when
//! their wait expires), so what this actor holds is the other kind of waiter:
//! a caller whose proposal was accepted by the leader and who must be told
//! when it commits. A completion resolves with [`Appended`] once the high
//! watermark passes its `last_offset` (the HW is the first uncommitted
//! offset, so `last_offset < hw`) while this node still leads the proposal's
//! epoch, and fails with [`AppendError::OutcomeUnknown`] as soon as a role
//! change shows that leadership of that epoch is gone: the records may still
//! commit under the next leader, so the caller is never told "failed".
//!
//! The QuorumState actor feeds it, in order, the role changes, the high
//! watermark and the registrations (all on one arbiter, in FIFO order). The
//! decisions are made robust to a registration that arrives before the role
//! change naming its epoch anyway: such an entry simply waits.
//!
//! It also measures commit latency (registration → completion).

use std::collections::VecDeque;
use tokio::time::Instant;

use actix::prelude::*;
use tracing::debug;

use crate::raft::commit::{proposal_outcome, ProposalOutcome};
use crate::raft::{Epoch, Offset, Proposed, RoleInfo};
use crate::types::{AppendError, Appended};

/// Most completions pending at once; registrations past it are refused.
pub const MAX_PENDING_APPENDS: usize = crate::raft::admission::MAX_AWAITING_COMMIT;

/// What to do with the outcome of an append. Boxed so that a local caller
/// (a oneshot for `NodeHandle::append`) and a forwarded request (an
/// `AppendResponse` to a peer) share one queue.
pub type Completion = Box<dyn FnOnce(Result<Appended, AppendError>) + Send>;

/// Wait for `proposed` to commit, then call `complete`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Register {
    pub proposed: Proposed,
    pub complete: Completion,
}

/// The leader's high watermark moved forward (also sent on followers; it
/// only completes entries of an epoch this node leads).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct HighWatermarkAdvanced(pub Offset);

/// This node's role, epoch or leader changed.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct RoleUpdate(pub RoleInfo);

/// Fails everything pending with `OutcomeUnknown` and stops the actor (node
/// shutdown).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct StopPurgatory {
    pub reason: String,
}

/// Commit-latency figures since start.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "CommitStats")]
pub struct GetCommitStats;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommitStats {
    pub commits_total: u64,
    pub commit_latency_avg_ms: f64,
    pub commit_latency_max_ms: f64,
    /// Completions waiting right now.
    pub pending: usize,
}

impl<A, M> actix::dev::MessageResponse<A, M> for CommitStats
where
    A: Actor,
    M: Message<Result = CommitStats>,
{
    fn handle(self, _ctx: &mut A::Context, tx: Option<actix::dev::OneshotSender<M::Result>>) {
        if let Some(tx) = tx {
            let _ = tx.send(self);
        }
    }
}

struct Pending {
    proposed: Proposed,
    complete: Completion,
    registered_at: Instant,
}

/// The pure bookkeeping, testable without actix.
pub struct PendingAppends {
    /// The latest role seen.
    role: Option<RoleInfo>,
    /// The latest high watermark seen (never decreases).
    high_watermark: Offset,
    /// Ascending by `last_offset`: proposals are appended in order.
    pending: VecDeque<Pending>,
    commits_total: u64,
    latency_sum_ms: f64,
    latency_max_ms: f64,
}

impl Default for PendingAppends {
    fn default() -> Self {
        Self::new()
    }
}

impl PendingAppends {
    pub fn new() -> Self {
        PendingAppends {
            role: None,
            high_watermark: 0,
            pending: VecDeque::new(),
            commits_total: 0,
            latency_sum_ms: 0.0,
            latency_max_ms: 0.0,
        }
    }

    pub fn register(&mut self, proposed: Proposed, complete: Completion) {
        assert!(
            proposed.base_offset <= proposed.last_offset,
            "empty proposal {proposed:?}"
        );
        if self.pending.len() >= MAX_PENDING_APPENDS {
            // The records were proposed already: they may still commit.
            complete(Err(AppendError::OutcomeUnknown(format!(
                "{MAX_PENDING_APPENDS} appends are already waiting to commit"
            ))));
            return;
        }
        if proposal_outcome(&proposed, self.high_watermark, self.role.as_ref()) == ProposalOutcome::Unknown {
            complete(Err(lost_error(proposed.epoch)));
            return;
        }
        let entry = Pending {
            proposed,
            complete,
            registered_at: Instant::now(),
        };
        // Keep the queue ascending even if registrations of one epoch were to
        // arrive out of order (they do not: QuorumState registers in order).
        let at = self
            .pending
            .partition_point(|p| p.proposed.last_offset <= proposed.last_offset);
        self.pending.insert(at, entry);
        self.maybe_complete();
    }

    pub fn on_high_watermark(&mut self, hw: Offset) {
        self.high_watermark = self.high_watermark.max(hw);
        self.maybe_complete();
    }

    pub fn on_role(&mut self, role: RoleInfo) {
        self.role = Some(role);
        // Fail every entry whose epoch is no longer led. Entries of a later
        // epoch (not yet announced) stay.
        let mut kept = VecDeque::with_capacity(self.pending.len());
        for entry in self.pending.drain(..) {
            let epoch = entry.proposed.epoch;
            if proposal_outcome(&entry.proposed, self.high_watermark, self.role.as_ref()) == ProposalOutcome::Unknown {
                (entry.complete)(Err(lost_error(epoch)));
            } else {
                kept.push_back(entry);
            }
        }
        self.pending = kept;
        self.maybe_complete();
    }

    /// Fails everything (node shutdown): the records may still commit.
    pub fn fail_all(&mut self, reason: &str) {
        for entry in self.pending.drain(..) {
            (entry.complete)(Err(AppendError::OutcomeUnknown(reason.to_string())));
        }
    }

    fn maybe_complete(&mut self) {
        while let Some(front) = self.pending.front() {
            let proposed = front.proposed;
            if proposal_outcome(&proposed, self.high_watermark, self.role.as_ref()) != ProposalOutcome::Committed {
                break;
            }
            let entry = self.pending.pop_front().expect("front exists");
            let latency_ms = entry.registered_at.elapsed().as_secs_f64() * 1000.0;
            self.commits_total += 1;
            self.latency_sum_ms += latency_ms;
            self.latency_max_ms = self.latency_max_ms.max(latency_ms);
            (entry.complete)(Ok(Appended {
                base_offset: proposed.base_offset,
                last_offset: proposed.last_offset,
                epoch: proposed.epoch,
            }));
        }
    }

    pub fn stats(&self) -> CommitStats {
        CommitStats {
            commits_total: self.commits_total,
            commit_latency_avg_ms: if self.commits_total == 0 {
                0.0
            } else {
                self.latency_sum_ms / self.commits_total as f64
            },
            commit_latency_max_ms: self.latency_max_ms,
            pending: self.pending.len(),
        }
    }
}

fn lost_error(epoch: Epoch) -> AppendError {
    AppendError::OutcomeUnknown(format!(
        "leadership of epoch {epoch} was lost before the records committed"
    ))
}

/// The actor shell around [`PendingAppends`].
#[derive(Default)]
pub struct FetchPurgatory {
    appends: PendingAppends,
}

impl FetchPurgatory {
    pub fn new() -> Self {
        FetchPurgatory {
            appends: PendingAppends::new(),
        }
    }
}

impl Actor for FetchPurgatory {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.appends.fail_all("the node stopped");
    }
}

impl Handler<Register> for FetchPurgatory {
    type Result = ();

    fn handle(&mut self, msg: Register, _ctx: &mut Self::Context) {
        self.appends.register(msg.proposed, msg.complete);
    }
}

impl Handler<HighWatermarkAdvanced> for FetchPurgatory {
    type Result = ();

    fn handle(&mut self, msg: HighWatermarkAdvanced, _ctx: &mut Self::Context) {
        self.appends.on_high_watermark(msg.0);
    }
}

impl Handler<RoleUpdate> for FetchPurgatory {
    type Result = ();

    fn handle(&mut self, msg: RoleUpdate, _ctx: &mut Self::Context) {
        self.appends.on_role(msg.0);
    }
}

impl Handler<StopPurgatory> for FetchPurgatory {
    type Result = ();

    fn handle(&mut self, msg: StopPurgatory, ctx: &mut Self::Context) {
        debug!(pending = self.appends.pending.len(), "fetch purgatory stopping");
        self.appends.fail_all(&msg.reason);
        ctx.stop();
    }
}

impl Handler<GetCommitStats> for FetchPurgatory {
    type Result = CommitStats;

    fn handle(&mut self, _msg: GetCommitStats, _ctx: &mut Self::Context) -> CommitStats {
        self.appends.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::RoleKind;
    use std::sync::{Arc, Mutex};

    type Outcomes = Arc<Mutex<Vec<(u32, Result<Appended, AppendError>)>>>;

    fn completion(outcomes: &Outcomes, tag: u32) -> Completion {
        let outcomes = outcomes.clone();
        Box::new(move |r| outcomes.lock().unwrap().push((tag, r)))
    }

    fn role(role: RoleKind, epoch: Epoch) -> RoleInfo {
        RoleInfo {
            role,
            epoch,
            leader_id: Some(1),
            voted_for: None,
            is_voter: true,
        }
    }

    fn proposed(base: Offset, last: Offset, epoch: Epoch) -> Proposed {
        Proposed {
            base_offset: base,
            last_offset: last,
            epoch,
        }
    }

    #[test]
    fn completes_once_the_high_watermark_passes_the_last_offset() {
        let outcomes = Outcomes::default();
        let mut p = PendingAppends::new();
        p.on_role(role(RoleKind::Leader, 3));
        p.register(proposed(5, 7, 3), completion(&outcomes, 1));
        p.register(proposed(8, 8, 3), completion(&outcomes, 2));
        p.on_high_watermark(7);
        assert!(
            outcomes.lock().unwrap().is_empty(),
            "offset 7 is not committed while hw == 7"
        );
        p.on_high_watermark(8);
        assert_eq!(outcomes.lock().unwrap().len(), 1);
        assert_eq!(
            outcomes.lock().unwrap()[0].1,
            Ok(Appended {
                base_offset: 5,
                last_offset: 7,
                epoch: 3
            })
        );
        p.on_high_watermark(100);
        assert_eq!(outcomes.lock().unwrap().len(), 2);
        assert_eq!(p.stats().commits_total, 2);
    }

    #[test]
    fn losing_leadership_of_the_epoch_fails_with_outcome_unknown() {
        let outcomes = Outcomes::default();
        let mut p = PendingAppends::new();
        p.on_role(role(RoleKind::Leader, 3));
        p.register(proposed(5, 7, 3), completion(&outcomes, 1));
        p.on_role(role(RoleKind::Resigned, 3));
        let got = outcomes.lock().unwrap().clone();
        assert!(matches!(got[0].1, Err(AppendError::OutcomeUnknown(_))));
        // A later high watermark must not complete it a second time.
        p.on_high_watermark(100);
        assert_eq!(outcomes.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_registration_for_a_lost_epoch_fails_at_once() {
        let outcomes = Outcomes::default();
        let mut p = PendingAppends::new();
        p.on_role(role(RoleKind::Follower, 4));
        p.register(proposed(5, 7, 3), completion(&outcomes, 1));
        assert!(matches!(
            outcomes.lock().unwrap()[0].1,
            Err(AppendError::OutcomeUnknown(_))
        ));
    }

    #[test]
    fn a_registration_ahead_of_its_role_change_waits() {
        let outcomes = Outcomes::default();
        let mut p = PendingAppends::new();
        p.on_role(role(RoleKind::Candidate, 2));
        p.register(proposed(5, 5, 3), completion(&outcomes, 1));
        p.on_high_watermark(10);
        assert!(outcomes.lock().unwrap().is_empty(), "not leader of epoch 3 yet");
        p.on_role(role(RoleKind::Leader, 3));
        assert_eq!(outcomes.lock().unwrap().len(), 1);
        assert!(outcomes.lock().unwrap()[0].1.is_ok());
    }

    #[test]
    fn a_registration_past_the_bound_fails_as_outcome_unknown() {
        // Registered means proposed: refusing it now cannot unwrite it.
        let outcomes = Outcomes::default();
        let mut p = PendingAppends::new();
        p.on_role(role(RoleKind::Leader, 1));
        for offset in 0..MAX_PENDING_APPENDS as Offset {
            p.register(proposed(offset, offset, 1), Box::new(|_| {}));
        }
        let past = MAX_PENDING_APPENDS as Offset;
        p.register(proposed(past, past, 1), completion(&outcomes, 1));
        assert!(matches!(
            outcomes.lock().unwrap()[0].1,
            Err(AppendError::OutcomeUnknown(_))
        ));
    }

    #[test]
    fn fail_all_reports_outcome_unknown() {
        let outcomes = Outcomes::default();
        let mut p = PendingAppends::new();
        p.on_role(role(RoleKind::Leader, 1));
        p.register(proposed(0, 0, 1), completion(&outcomes, 1));
        p.fail_all("stopping");
        assert_eq!(
            outcomes.lock().unwrap()[0].1,
            Err(AppendError::OutcomeUnknown("stopping".into()))
        );
    }
}
